/*
 * test_host_faults.c - the host-failure sweep: each host compute callback
 * fails at call N, for every N of a workload.
 *
 * A workload (18 requests: shared prefixes, two-sample requests, stop
 * tokens, one abort, a pool small enough to preempt) runs once without
 * failures through fakehost.h's self-checking host to learn its number of host
 * calls C. Then, for every N in 1..C, it runs again with call N failing; the
 * failing call first does harm - it performs the copy lists and writes wrong
 * KV into every slot it was given - then returns -1. Each run must show:
 *   - the step containing call N returns BKV_EHOST, delivers no token and
 *     ends no request (other than aborts drained at its start), and leaves
 *     bkv_sched_check clean (the step rolled back);
 *   - the next bkv_step returns BKV_OK (the retry succeeds);
 *   - stats: exactly one failed step;
 *   - the host never reads a wrong KV cell afterwards (fakehost's KV model);
 *   - every request ends exactly once, with the reason of the failure-free
 *     run, and every branch's tokens equal the failure-free run's token for
 *     token (which equal the sampler's closed form).
 * Configurations: mixed host (forward), split host (prefill + decode, so both
 * callbacks are failed), chunked prefill, static batching, and preemption by
 * recompute and by swap.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "fakehost.h"
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

/* ---- the same sweep with tinylm, a real transformer ----------------------
 * examples/tinylm serves the batches with real attention over the paged KV;
 * its tokens must equal the model's contiguous reference (computed request by
 * request without the library) after every failure, early (the call fails
 * before touching anything) or late (it performs the copies and writes K/V
 * into the batch's slots, then fails without sampling). */

#include "../examples/tinylm/model.h"
#include "../examples/tinylm/tinylm.h"

typedef struct tl_ctx {
	tlm_host *host;
	uint64_t calls;   /* compute calls so far */
	uint64_t fail_at; /* 1-based call to fail; 0 none */
	uint64_t failed;  /* calls that failed */
	int late;         /* the failing call first computes (writes KV) */
} tl_ctx;

static int tl_call(tl_ctx *c, int (*fn)(void *, const bkv_batch *, int32_t *), const bkv_batch *b,
		   int32_t *next)
{
	int rc;

	if (++c->calls == c->fail_at)
		tlm_host_fail_next(c->host, c->late);
	rc = fn(c->host, b, next);
	if (rc < 0)
		c->failed++;
	return rc;
}

static int tl_forward(void *p, const bkv_batch *b, int32_t *next)
{
	return tl_call(p, tlm_host_forward, b, next);
}

static int tl_prefill(void *p, const bkv_batch *b, int32_t *next)
{
	return tl_call(p, tlm_host_prefill, b, next);
}

static int tl_decode(void *p, const bkv_batch *b, int32_t *next)
{
	return tl_call(p, tlm_host_decode, b, next);
}

static void tl_token(void *p, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	tlm_job *jb = user;

	(void)p;
	jb->got_total++;
	if (branch >= jb->sampling.n_samples || jb->got_len[branch] >= jb->max_new ||
	    req != jb->req_id) {
		jb->bad_tokens++;
		return;
	}
	jb->got[(size_t)branch * jb->max_new + jb->got_len[branch]++] = token;
}

static void tl_finish(void *p, uint64_t req, bkv_finish_reason reason, void *user)
{
	tlm_job *jb = user;

	(void)p;
	if (req != jb->req_id)
		jb->bad_tokens++;
	jb->finished++;
	jb->reason = reason;
}

/* One run of the workload; returns the compute calls it made. */
static uint64_t tl_run(tlm_workload *w, const tlm_model *m, int split, uint64_t fail_at,
		       int late)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_pool *pool = NULL;
	bkv_sched *s = NULL;
	tlm_host_stats hs;
	tl_ctx c;
	uint32_t i, steps = 0;
	char msg[256];
	int rc;

	memset(&c, 0, sizeof(c));
	c.fail_at = fail_at;
	c.late = late;
	tlm_workload_reset(w);
	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 32;
	pc.host_blocks = 16;
	pc.max_seqs = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	c.host = tlm_host_create(m, 4, 32, 16);
	cr_assert_not_null(c.host);
	memset(&ops, 0, sizeof(ops));
	if (split) {
		ops.prefill = tl_prefill;
		ops.decode = tl_decode;
	} else {
		ops.forward = tl_forward;
	}
	ops.on_token = tl_token;
	ops.on_finish = tl_finish;
	bkv_sched_config_init(&sc);
	sc.max_running = 6;
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, &c, NULL, &s), BKV_OK);
	for (i = 0; i < w->n_jobs; i++) {
		bkv_request rq;
		tlm_job *jb = &w->jobs[i];

		bkv_request_init(&rq);
		rq.prompt = jb->prompt;
		rq.prompt_len = jb->prompt_len;
		rq.max_new_tokens = jb->max_new;
		rq.stop_tokens = jb->stop >= 0 ? &jb->stop : NULL;
		rq.n_stop = jb->stop >= 0 ? 1 : 0;
		rq.n = jb->sampling.n_samples;
		rq.user = jb;
		cr_assert_eq(bkv_submit(s, &rq, &jb->req_id), BKV_OK);
	}
	while (bkv_sched_pending(s) && steps++ < 10000) {
		uint64_t before = c.calls;

		rc = bkv_step(s, NULL);
		cr_assert_eq(bkv_sched_check(s), 0);
		if (fail_at && before < fail_at && c.calls >= fail_at) {
			cr_assert_eq(rc, BKV_EHOST, "tinylm: step with failing call %llu returned %d",
				     (unsigned long long)fail_at, rc);
			rc = bkv_step(s, NULL);
			cr_assert_eq(rc, BKV_OK, "tinylm: the retry after call %llu returned %d",
				     (unsigned long long)fail_at, rc);
			cr_assert_eq(bkv_sched_check(s), 0);
		} else {
			cr_assert_eq(rc, BKV_OK, "tinylm: step returned %d", rc);
		}
	}
	cr_assert_eq(bkv_sched_pending(s), 0, "tinylm: stuck");
	cr_assert_eq(c.failed, fail_at && fail_at <= c.calls ? 1u : 0u);
	memset(&hs, 0, sizeof(hs));
	tlm_host_stats_get(c.host, &hs);
	cr_assert_eq(hs.violations, 0, "tinylm host: %s", tlm_host_last_error(c.host));
	for (i = 0; i < w->n_jobs; i++) {
		cr_assert_eq(w->jobs[i].finished, 1, "tinylm: job %u ended %d times", i,
			     w->jobs[i].finished);
		cr_assert_eq(w->jobs[i].bad_tokens, 0);
	}
	cr_assert_eq(tlm_workload_verify(w, msg, sizeof(msg)), 0,
		     "tinylm, call %llu fails: %s", (unsigned long long)fail_at, msg);
	if (!fail_at) {
		bkv_sched_stats st;

		memset(&st, 0, sizeof(st));
		st.size = sizeof(st);
		bkv_sched_stats_get(s, &st);
		cr_log_info("tinylm %s host: %llu preemptions in the failure-free run",
			    split ? "split" : "mixed", (unsigned long long)st.preemptions);
	}
	bkv_sched_destroy(s);
	cr_assert_eq(bkv_pool_check(pool), 0);
	bkv_pool_destroy(pool);
	tlm_host_destroy(c.host);
	return c.calls;
}

Test(host_faults, tinylm_failure_at_every_call_matches_the_reference, .timeout = 300)
{
	tlm_config cfg;
	tlm_model *m;
	tlm_workload w;
	tlm_workload_config wc;
	uint64_t calls, n;
	int split;

	tlm_config_small(&cfg);
	m = tlm_model_create(&cfg);
	cr_assert_not_null(m);
	tlm_workload_config_default(&wc);
	wc.n_jobs = 16;
	wc.system_len = 12;
	wc.user_max = 12;
	wc.new_max = 12;
#if defined(__SANITIZE_ADDRESS__)
	wc.n_jobs = 8; /* the sweep is quadratic; keep sanitizer builds fast */
	wc.new_max = 8;
#endif
	wc.pct_fork = 25;
	wc.pct_abort = 0;
	wc.seed = 7;
	cr_assert_eq(tlm_workload_create(&w, &wc, cfg.vocab), 0);
	cr_assert_eq(tlm_workload_reference(&w, m), 0);
	for (split = 0; split < 2; split++) {
		calls = tl_run(&w, m, split, 0, 0);
		cr_assert_gt(calls, 4);
		for (n = 1; n <= calls; n++) {
			tl_run(&w, m, split, n, 0); /* fails before touching anything */
			tl_run(&w, m, split, n, 1); /* writes K/V, then fails */
		}
		cr_log_info("tinylm %s host: %llu host calls, each failed once early and once "
			    "late; tokens equal the contiguous reference every time",
			    split ? "split" : "mixed", (unsigned long long)calls);
	}
	tlm_workload_destroy(&w);
	tlm_model_destroy(m);
}
