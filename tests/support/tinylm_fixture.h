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
#include <string.h>

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

/* A run's configuration: 16 running, an explicit k = 1, 16-token blocks. */
static inline void tlm_fixture_config(tlm_run_config *rc, uint32_t device_blocks)
{
	memset(rc, 0, sizeof(*rc));
	bkv_sched_config_init(&rc->sched);
	rc->sched.max_running = 16;
	rc->sched.admit_group = 1; /* an explicit k (see test_tinylm.c) */
	rc->block_tokens = 16;
	rc->device_blocks = device_blocks;
}

/* What every served run must show: it ran (st 0), every request of w got
 * its reference's tokens and ended, bkv_sched_check and the host found
 * nothing. */
static inline void tlm_fixture_verify(const tlm_workload *w, const tlm_run_result *res, int st,
				      const char *what)
{
	char msg[512];
	uint32_t bad;

	cr_assert_eq(st, 0, "%s: run failed: %s (%d); host: %s; lib: %s", what,
		     st == TLM_STUCK ? "stuck" : bkv_strerror(st), st, res->host_error,
		     res->lib_error);
	bad = tlm_workload_verify(w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%s: %u of %u requests differ from the reference; first: %s", what,
		     bad, w->n_jobs, msg);
	cr_assert_eq(res->check, 0, "bkv_sched_check = %d", res->check);
	cr_assert_eq(res->host.violations, 0, "%s", res->host_error);
	cr_assert_eq(res->sched.finished, w->n_jobs);
}

#endif /* BKV_TINYLM_FIXTURE_H */
