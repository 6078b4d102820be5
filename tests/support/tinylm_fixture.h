/*
 * tinylm_fixture.h - the fixture of the tinylm suites that serve one
 * workload in many modes: the small model, a workload and its reference
 * outputs (each request run alone), made once per test. The jobs a workload
 * has come from TINYLM_TEST_JOBS when set, else from the suite (fewer under
 * AddressSanitizer, which runs the model about ten times slower).
 */
#ifndef BKV_TINYLM_FIXTURE_H
#define BKV_TINYLM_FIXTURE_H

#include <criterion/criterion.h>

#include <stdlib.h>

#include "../../examples/tinylm/tinylm.h"

/* Jobs: TINYLM_TEST_JOBS, else plain (asan under AddressSanitizer). */
static inline uint32_t tlm_fixture_jobs(uint32_t plain, uint32_t asan)
{
	const char *e = getenv("TINYLM_TEST_JOBS");

	if (e && atoi(e) > 0)
		return (uint32_t)atoi(e);
#if defined(__SANITIZE_ADDRESS__)
	(void)plain;
	return asan;
#else
	(void)asan;
	return plain;
#endif
}

/* The small model, and the workload wc describes with its references. */
static inline void tlm_fixture_setup(tlm_model **m, tlm_workload *w, const tlm_workload_config *wc)
{
	tlm_config c;

	tlm_config_small(&c);
	*m = tlm_model_create(&c);
	cr_assert_not_null(*m);
	cr_assert_eq(tlm_workload_create(w, wc, (*m)->cfg.vocab), 0);
	cr_assert_eq(tlm_workload_reference(w, *m), 0);
}

static inline void tlm_fixture_teardown(tlm_model *m, tlm_workload *w)
{
	tlm_workload_destroy(w);
	tlm_model_destroy(m);
}

#endif /* BKV_TINYLM_FIXTURE_H */
