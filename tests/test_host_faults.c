/*
 * test_host_faults.c - the host-failure sweep: each host compute callback
 * fails at call N, for every N of a workload.
 *
 * A workload (18 requests: shared prefixes, two-sample requests, stop
 * tokens, one abort, a pool small enough to preempt) runs once without
 * failures through kvhost.h's self-checking host to learn its number of host
 * calls C. Then, for every N in 1..C, it runs again with call N failing; the
 * failing call first does harm - it performs the copy lists and writes wrong
 * KV into every slot it was given - then returns -1. Each run must show:
 *   - the step containing call N returns BKV_EHOST, delivers no token and
 *     ends no request (other than aborts drained at its start), and leaves
 *     bkv_sched_check clean (the step rolled back);
 *   - the next bkv_step returns BKV_OK (the retry succeeds);
 *   - stats: exactly one failed step;
 *   - the host never reads a wrong KV cell afterwards (kvhost's KV model);
 *   - every request ends exactly once, with the reason of the failure-free
 *     run, and every branch's tokens equal the failure-free run's token for
 *     token (which equal the sampler's closed form).
 * Configurations: mixed host (forward), split host (prefill + decode, so both
 * callbacks are failed), chunked prefill, static batching, and preemption by
 * recompute and by swap.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "fuzz/kvhost.h"
#include "internal.h"

#define HF_REQS 18u

typedef struct hf_cfg {
	const char *name;
	int split;
	int chunked;
	bkv_policy policy;
	bkv_preempt_mode preempt;
	uint32_t device_blocks;
} hf_cfg;

typedef struct hf_run {
	kh_req req[HF_REQS];
	int32_t prompt[HF_REQS][48];
	uint64_t calls;          /* host compute calls */
	uint64_t steps;          /* successful steps */
	uint64_t preemptions;
	uint64_t swaps;
	int failed_kind;         /* which callback failed (-1 none) */
} hf_run;

static void hf_workload(const hf_cfg *c, hf_run *x, uint64_t fail_at)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops = kh_ops(c->split);
	bkv_sched_stats st;
	bkv_pool *pool = NULL;
	bkv_sched *s = NULL;
	kh_host h;
	uint32_t i, j, steps = 0, failures = 0;
	int rc;

	memset(x, 0, sizeof(*x));
	x->failed_kind = -1;
	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = c->device_blocks;
	pc.host_blocks = 32;
	pc.max_seqs = 32;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&sc);
	sc.policy = c->policy;
	sc.max_running = 6;
	sc.chunked_prefill = c->chunked;
	sc.token_budget = c->chunked ? 16 : 0;
	sc.preempt = c->preempt;
	cr_assert_eq(kh_init(&h, 4, c->device_blocks, 32, 1), 0);
	h.fail_at = fail_at;
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, &h, NULL, &s), BKV_OK);
	for (i = 0; i < HF_REQS; i++) {
		kh_req *r = &x->req[i];
		uint32_t len = 3 + (i * 5) % 40;

		for (j = 0; j < len; j++)
			x->prompt[i][j] = (int32_t)(i % 3 == 0 ? 500 + j : 10000 * (i + 1) + j);
		cr_assert_eq(kh_req_init(r, 100 + i, x->prompt[i], len, 3 + i % 9, i % 6 == 1 ? 2 : 1),
			     0);
		if (i % 4 == 3) {
			r->stop_mod = 4;
			r->stop[0] = KH_STOP;
			r->n_stop = 1;
		}
	}
	for (i = 0; i < HF_REQS; i++)
		cr_assert_eq(kh_submit(s, &x->req[i], 0), BKV_OK);
	while (bkv_sched_pending(s) && steps < 4000) {
		uint64_t tokens = h.tokens_out, calls = h.calls;
		uint64_t ended = h.finished - h.by_reason[BKV_FINISH_ABORT];
		bkv_step_info si;

		rc = bkv_step(s, &si);
		steps++;
		cr_assert_eq(h.violations, 0, "%s, call %llu fails: host: %s", c->name,
			     (unsigned long long)fail_at, h.first);
		cr_assert_eq(bkv_sched_check(s), 0, "%s, call %llu fails: check %d", c->name,
			     (unsigned long long)fail_at, bkv_sched_check(s));
		if (fail_at && calls < fail_at && h.calls >= fail_at) {
			/* the failing call happened in this step */
			cr_assert_eq(rc, BKV_EHOST, "%s: step with failing call %llu returned %d",
				     c->name, (unsigned long long)fail_at, rc);
			cr_assert_eq(h.tokens_out, tokens, "%s: a failed step delivered tokens",
				     c->name);
			/* (aborts asked before it are drained and end at its
			 * start; nothing else may end) */
			cr_assert_eq(h.finished - h.by_reason[BKV_FINISH_ABORT], ended,
				     "%s: a failed step finished requests", c->name);
			x->failed_kind = h.last_fail_kind;
			failures++;
			/* the retry succeeds */
			rc = bkv_step(s, &si);
			steps++;
			cr_assert_eq(rc, BKV_OK, "%s: the step after the failure returned %d", c->name,
				     rc);
			cr_assert_eq(h.violations, 0, "%s, call %llu fails: host after retry: %s",
				     c->name, (unsigned long long)fail_at, h.first);
			cr_assert_eq(bkv_sched_check(s), 0);
		} else {
			cr_assert_eq(rc, BKV_OK, "%s: step returned %d", c->name, rc);
		}
		if (steps == 4)
			kh_abort(s, &x->req[5], x->req[5].id);
	}
	cr_assert_eq(bkv_sched_pending(s), 0, "%s: stuck", c->name);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(s, &st);
	cr_assert_eq(st.failed_steps, failures);
	cr_assert_eq(failures, fail_at && fail_at <= h.calls ? 1u : 0u);
	x->calls = h.calls - failures;
	x->steps = st.steps;
	x->preemptions = st.preemptions;
	x->swaps = st.swaps;
	for (i = 0; i < HF_REQS; i++)
		cr_assert_eq(x->req[i].finished, 1, "%s: req %u ended %u times", c->name, i,
			     x->req[i].finished);
	bkv_sched_destroy(s);
	cr_assert_eq(bkv_pool_check(pool), 0);
	bkv_pool_destroy(pool);
	kh_fini(&h);
}

static void hf_fini(hf_run *x)
{
	uint32_t i;

	for (i = 0; i < HF_REQS; i++)
		kh_req_fini(&x->req[i]);
}

static void hf_sweep(const hf_cfg *c)
{
	static hf_run ref, x;
	uint64_t n;
	uint32_t i, kinds = 0;

	hf_workload(c, &ref, 0);
	cr_assert_gt(ref.calls, 10);
	for (n = 1; n <= ref.calls; n++) {
		hf_workload(c, &x, n);
		cr_assert_neq(x.failed_kind, -1, "%s: call %llu never failed", c->name,
			      (unsigned long long)n);
		kinds |= 1u << x.failed_kind;
		for (i = 0; i < HF_REQS; i++) {
			const kh_req *a = &ref.req[i], *b = &x.req[i];
			uint32_t br;

			/* the abort lands at the same step count; a failure
			 * adds a step, so the aborted request may have got
			 * fewer tokens: compare it as a prefix */
			if (a->reason == BKV_FINISH_ABORT || b->reason == BKV_FINISH_ABORT) {
				for (br = 0; br < a->n; br++) {
					uint32_t m = a->n_out[br] < b->n_out[br] ? a->n_out[br]
										 : b->n_out[br];

					cr_assert_eq(memcmp(a->hist + br * a->max_new,
							    b->hist + br * a->max_new,
							    m * sizeof(int32_t)),
						     0, "%s: aborted req %u: tokens differ", c->name, i);
				}
				continue;
			}
			cr_assert_eq(a->reason, b->reason, "%s, call %llu fails: req %u ended %d, not %d",
				     c->name, (unsigned long long)n, i, b->reason, a->reason);
			for (br = 0; br < a->n; br++) {
				cr_assert_eq(a->n_out[br], b->n_out[br],
					     "%s, call %llu fails: req %u branch %u got %u tokens, not %u",
					     c->name, (unsigned long long)n, i, br, b->n_out[br],
					     a->n_out[br]);
				cr_assert_eq(memcmp(a->hist + br * a->max_new, b->hist + br * a->max_new,
						    a->n_out[br] * sizeof(int32_t)),
					     0, "%s, call %llu fails: req %u branch %u tokens differ",
					     c->name, (unsigned long long)n, i, br);
			}
		}
		hf_fini(&x);
	}
	cr_log_info("%s: %llu host calls, each failed once; %llu preemptions (%llu swaps) in the "
		    "failure-free run",
		    c->name, (unsigned long long)ref.calls, (unsigned long long)ref.preemptions,
		    (unsigned long long)ref.swaps);
	if (c->split)
		cr_assert_eq(kinds, (1u << BKV_CALL_PREFILL) | (1u << BKV_CALL_DECODE),
			     "both split callbacks failed");
	else
		cr_assert_eq(kinds, 1u << BKV_CALL_MIXED);
	hf_fini(&ref);
}

Test(host_faults, forward_failure_at_every_call_rolls_back)
{
	hf_cfg c = {"mixed", 0, 0, BKV_POLICY_CONTINUOUS, BKV_PREEMPT_AUTO, 40};

	hf_sweep(&c);
}

Test(host_faults, prefill_and_decode_failures_at_every_call_roll_back)
{
	hf_cfg c = {"split", 1, 0, BKV_POLICY_CONTINUOUS, BKV_PREEMPT_AUTO, 40};

	hf_sweep(&c);
}

Test(host_faults, chunked_prefill_failure_at_every_call_rolls_back)
{
	hf_cfg c = {"chunked", 0, 1, BKV_POLICY_CONTINUOUS, BKV_PREEMPT_AUTO, 40};

	hf_sweep(&c);
}

Test(host_faults, static_batching_failure_at_every_call_rolls_back)
{
	hf_cfg c = {"static", 1, 0, BKV_POLICY_STATIC, BKV_PREEMPT_AUTO, 40};

	hf_sweep(&c);
}

Test(host_faults, failure_during_recompute_preemption_rolls_back)
{
	hf_cfg c = {"recompute", 0, 0, BKV_POLICY_CONTINUOUS, BKV_PREEMPT_RECOMPUTE, 26};
	static hf_run ref;

	hf_workload(&c, &ref, 0);
	cr_assert_gt(ref.preemptions, 0, "the small pool must preempt");
	hf_fini(&ref);
	hf_sweep(&c);
}

Test(host_faults, failure_during_swap_preemption_rolls_back)
{
	hf_cfg c = {"swap", 1, 0, BKV_POLICY_CONTINUOUS, BKV_PREEMPT_SWAP, 26};
	static hf_run ref;

	hf_workload(&c, &ref, 0);
	cr_assert_gt(ref.swaps, 0, "the small pool must swap");
	hf_fini(&ref);
	hf_sweep(&c);
}
