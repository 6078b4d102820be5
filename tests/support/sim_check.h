/*
 * sim_check.h - what every bkv-sim test asserts of a run: sim_run succeeds
 * over the trace, every request finishes and none ends in error. The suites
 * (test_sim*.c) add their own checks after it.
 */
#ifndef BKV_SIM_CHECK_H
#define BKV_SIM_CHECK_H

#include <criterion/criterion.h>

#include <string.h>

#include "../../examples/sim/sim.h"

/* Run c over t into r; what names the run in a failure. */
static inline void sim_check_run(const sim_config *c, const trace *t, sim_result *r,
				 const char *what)
{
	char err[256] = "";

	memset(r, 0, sizeof(*r));
	cr_assert_eq(sim_run(c, t, r, err, sizeof(err)), 0, "%s: %s", what, err);
	cr_assert_eq(r->finished, t->n, "%s", what);
	cr_assert_eq(r->errors, 0, "%s", what);
}

#endif /* BKV_SIM_CHECK_H */
