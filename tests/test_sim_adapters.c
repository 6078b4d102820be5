/*
 * test_sim_adapters.c - bkv-sim's LoRA workload (--adapters, adapters.c):
 * requests drawn over more adapters than the scheduler's cap all finish,
 * no host call carries more adapters than the cap or a row's adapter that is
 * not its request's (split and mixed hosts, chunked prefill, preemption,
 * the overlapped contract, with bkv_sched_check after every step), the
 * draws follow the popularity law, and a cap of one makes requests wait
 * longer than no cap.
 */
#include "../examples/sim/sim.h"
#include "support/sim_check.h"

#include <criterion/criterion.h>
#include <string.h>

#define N_REQ 400u

static void make_trace(trace *t, uint64_t seed)
{
	const trace_dist prompt = {DIST_UNIFORM, 32, 512}, output = {DIST_UNIFORM, 8, 128};
	memset(t, 0, sizeof(*t));
	cr_assert_eq(trace_synthetic(t, N_REQ, ARRIVAL_POISSON, 20.0, &prompt, &output, seed),
		     TRACE_OK);
}

static sim_config lora_config(uint32_t adapters, uint32_t cap)
{
	sim_config c;
	sim_config_init(&c);
	c.adapters = adapters;
	c.max_adapters = cap;
	c.check = 1;
	return c;
}

/* Run c over t: every request finishes, no call breaks the cap. */
static void run_capped(const sim_config *c, const trace *t, sim_result *r, const char *what)
{
	sim_check_run(c, t, r, what);
	cr_assert_eq(r->adapter_cap, sim_adapters_cap(c));
	cr_assert_eq(r->adapter_bad_calls, 0, "%s: %llu calls broke the contract", what,
		     (unsigned long long)r->adapter_bad_calls);
	cr_assert_leq(r->adapters_call_max, r->adapter_cap, "%s", what);
	cr_assert_geq(r->adapters_call_max, r->adapter_cap < 2 ? r->adapter_cap : 2, "%s", what);
	if (c->max_adapters)
		cr_assert_gt(r->adapters, r->adapter_cap, "%s: the workload has more adapters", what);
	cr_assert_gt(r->adapters_call_mean, 0.0, "%s", what);
	cr_assert_gt(r->n_hot, r->n_cold, "%s: popular adapters have more requests", what);
	cr_assert_geq(r->wait_max_ms, r->wait_p99_ms);
}

Test(sim_adapters, every_request_finishes_and_no_call_exceeds_the_cap)
{
	trace t;
	sim_result r;
	make_trace(&t, 7);
	sim_config c = lora_config(12, 3);
	run_capped(&c, &t, &r, "split host, k=1");
	c.chunked = 1;
	c.mixed_host = 1;
	run_capped(&c, &t, &r, "chunked, mixed host");
	c.kv_blocks = 64; /* preemption by recompute in a small pool */
	run_capped(&c, &t, &r, "chunked, small pool");
	cr_assert_gt(r.preemptions, 0, "the pool was meant to force preemption");
	c.kv_blocks = 0;
	c.overlap = 1;
	run_capped(&c, &t, &r, "overlapped");
	cr_assert_gt(r.overlap_steps, 0);
	c = lora_config(12, 3);
	c.policy = BKV_POLICY_STATIC;
	run_capped(&c, &t, &r, "static");
	trace_free(&t);
}

Test(sim_adapters, a_cap_of_one_waits_longer_than_no_cap)
{
	trace t;
	sim_result one, all;
	make_trace(&t, 3);
	sim_config c = lora_config(16, 1);
	run_capped(&c, &t, &one, "cap 1");
	cr_assert_eq(one.adapters_call_max, 1);
	c.max_adapters = 0; /* every adapter */
	run_capped(&c, &t, &all, "no cap");
	cr_assert_eq(all.adapter_cap, 16);
	cr_assert_gt(all.adapters_call_max, 4);
	cr_assert_gt(one.wait_p99_ms, all.wait_p99_ms, "cap 1: p99 wait %.2f ms, no cap %.2f",
		     one.wait_p99_ms, all.wait_p99_ms);
	cr_assert_gt(one.makespan_us, all.makespan_us);
	trace_free(&t);
}

/* Rank k drawn with weight k^-s: with s = 1 over 8 adapters rank 1 is
 * about 8 times as frequent as rank 8; with s = 0 all are alike. The same
 * trace gets the same draws. */
Test(sim_adapters, draws_follow_the_popularity_law_and_are_deterministic)
{
	trace t = {0};
	uint32_t count[2][9] = {{0}};
	for (uint32_t i = 0; i < 8000; i++)
		cr_assert_eq(trace_push(&t, 0.0, 16, 1, NULL, 0), TRACE_OK);
	for (int u = 0; u < 2; u++) {
		sim_config c = lora_config(8, 0);
		sim_adapters *a, *b;
		c.adapter_zipf = u ? 0.0 : 1.0;
		cr_assert_eq(sim_adapters_open(&c, &t, &a), 0);
		cr_assert_eq(sim_adapters_open(&c, &t, &b), 0);
		for (uint32_t i = 0; i < t.n; i++) {
			const uint32_t x = sim_adapter_of(a, i);
			cr_assert(x >= 1 && x <= 8, "adapter %u", x);
			cr_assert_eq(x, sim_adapter_of(b, i));
			count[u][x]++;
		}
		sim_adapters_close(a);
		sim_adapters_close(b);
	}
	/* zipf: expected 2940 and 368 of 8000; uniform: 1000 each */
	cr_assert(count[0][1] > 2700 && count[0][1] < 3200, "rank 1: %u", count[0][1]);
	cr_assert(count[0][8] > 280 && count[0][8] < 460, "rank 8: %u", count[0][8]);
	for (int k = 1; k <= 8; k++)
		cr_assert(count[1][k] > 880 && count[1][k] < 1120, "uniform rank %d: %u", k,
			  count[1][k]);
	sim_config off = lora_config(0, 0);
	sim_adapters *none = (sim_adapters *)&off;
	cr_assert_eq(sim_adapters_open(&off, &t, &none), 0);
	cr_assert_null(none, "no adapters: nothing to draw");
	cr_assert_eq(sim_adapter_of(NULL, 0), 0);
	trace_free(&t);
}
