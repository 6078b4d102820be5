/*
 * test_kv_safety.c - what the outside adversarial run found (issue 13): a
 * write into a shared cached block, and forked requests that could never
 * fork; and a cache reset while requests run. Each test fails on the code
 * before the fix.
 *
 * The fake host (tests/support/fakehost_sched.h) verifies every context position of every
 * row against the request's tokens, so KV that another request overwrote is
 * caught on the next read; bkv_sched_check runs after every step (fh_run),
 * and with it invariant 30 (no call wrote into a shared or cached block).
 */
#include "fakehost_sched.h"
#include "pool_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void all_ended_once(fake_host *f, uint64_t first, uint64_t last)
{
	uint64_t id;

	for (id = first; id <= last; id++)
		cr_assert_eq(f->finish_count[id], 1, "request %llu ended %u times",
			     (unsigned long long)id, f->finish_count[id]);
}

/* block_tokens 1: a one-token prompt is one whole block. B's prompt is A's,
 * cached and read by A on every step; B must still compute (and write) its
 * token, and the call that does it fails after writing garbage into every
 * slot it was given. A's next step must read its own KV unharmed. */
static void shared_block_case(int split, int chunked)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(1, 77);
	bkv_step_info si;
	int i;

	fh_opts_init(&o);
	o.block_tokens = 1;
	o.device_blocks = 64;
	o.split = split;
	o.cfg.chunked_prefill = chunked;
	o.cfg.token_budget = chunked ? 4 : 0;
	o.cfg.admit_group = 1;
	f = fh_create(&o);
	fh_submit(f, p, 1, 12);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK); /* A's prompt: cached at commit */
	cr_assert_eq(bkv_sched_check(f->s), 0);
	fh_submit(f, p, 1, 12);                    /* B: a whole-prompt hit */
	f->host.garbage = 1;
	f->host.fail_next = 1;
	cr_assert_eq(bkv_step(f->s, &si), BKV_EHOST);
	cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
	f->host.garbage = 0;
	for (i = 0; i < 4; i++) { /* every other step fails too */
		f->host.garbage = 1;
		f->host.fail_next = i & 1;
		(void)bkv_step(f->s, NULL);
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	}
	f->host.fail_next = 0;
	fh_run(f, 1000);
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	all_ended_once(f, 1, 2);
	cr_assert_eq(f->n_out[1][0], 12);
	cr_assert_eq(f->n_out[2][0], 12);
	fh_destroy(f);
	free(p);
}

Test(kv_safety, recompute_never_writes_a_shared_block)
{
	shared_block_case(0, 0);
}

Test(kv_safety, recompute_never_writes_a_shared_block_split_host)
{
	shared_block_case(1, 0);
}

Test(kv_safety, recompute_never_writes_a_shared_block_chunked)
{
	shared_block_case(0, 1);
}

/* Many one-token-block sharers of one prompt, a host that fails one call in
 * five after writing garbage: nobody ever reads another's garbage. */
Test(kv_safety, whole_prompt_hits_with_failing_calls_keep_every_kv_cell)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(6, 5);
	uint32_t i, bt;

	for (bt = 1; bt <= 4; bt *= 2) {
		fh_opts_init(&o);
		o.block_tokens = bt;
		o.device_blocks = 256 / bt;
		o.cfg.max_running = 6;
		f = fh_create(&o);
		f->host.garbage = 1;
		f->host.fail_permille = 200;
		for (i = 0; i < 24; i++)
			fh_submit(f, p, 1 + i % 6, 3 + i % 5);
		fh_run(f, 5000);
		cr_assert_eq(bkv_sched_pending(f->s), 0);
		cr_assert_eq(f->host.violations, 0, "bt %u: %s", bt, f->host.first);
		for (i = 1; i <= 24; i++)
			cr_assert_eq(f->finish_count[i], 1);
		fh_destroy(f);
	}
	free(p);
}

/* Pool max_seqs 2 and two requests with n = 2: admitting both would leave
 * neither a sequence to fork into (a livelock the checker did not see).
 * Admission keeps the sequences a request's branches need. */
Test(kv_safety, forked_requests_never_livelock_on_the_pools_sequences)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(8, 3), *q = fh_prompt(8, 4);
	uint32_t steps, n;

	for (n = 2; n <= 3; n++) {
		fh_opts_init(&o);
		o.max_seqs = n;
		o.device_blocks = 64;
		f = fh_create(&o);
		fh_submit_ex(f, p, 8, 5, 0, n, 0);
		fh_submit_ex(f, q, 8, 5, 0, n, 0);
		fh_submit_ex(f, p, 3, 4, 0, 1, 0);
		steps = fh_run(f, 500);
		cr_assert_eq(bkv_sched_pending(f->s), 0, "n %u: livelock (%u steps)", n, steps);
		all_ended_once(f, 1, 3);
		cr_assert_eq(f->reason[1], BKV_FINISH_LENGTH);
		cr_assert_eq(f->reason[2], BKV_FINISH_LENGTH);
		fh_destroy(f);
	}
	free(p);
	free(q);
}

/* The same with preemption in the mix: a tiny pool, recompute and swap. */
Test(kv_safety, forks_small_pool_and_preemption_always_finish)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(12, 9);
	uint32_t i, mode;

	for (mode = 0; mode < 3; mode++) {
		fh_opts_init(&o);
		o.block_tokens = 4;
		o.max_seqs = 3;
		o.device_blocks = 12;
		o.host_blocks = 32;
		o.cfg.preempt = (bkv_preempt_mode)mode;
		o.cfg.max_running = 4;
		f = fh_create(&o);
		for (i = 0; i < 10; i++)
			fh_submit_ex(f, p, 4 + i % 8, 6, (int32_t)(i % 3), 1 + i % 2, 0);
		fh_run(f, 5000);
		cr_assert_eq(bkv_sched_pending(f->s), 0, "mode %u", mode);
		all_ended_once(f, 1, 10);
		for (i = 1; i <= 10; i++)
			cr_assert_eq(f->reason[i], BKV_FINISH_LENGTH, "mode %u req %u", mode, i);
		fh_destroy(f);
	}
	free(p);
}

/* The progress rule: C is swapped out (it holds a pool sequence and host
 * blocks), then B arrives with a higher priority and n = 2 while the pool's
 * two sequences are A's and C's. Once A ends nothing runs, and B, at the
 * head, cannot get its two sequences while C holds one: without the rule
 * every later step would admit nothing and run nothing. C is turned into a
 * recompute, B runs, then C. */
Test(kv_safety, a_swapped_request_holding_a_needed_sequence_is_recomputed)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(4, 21), *q = fh_prompt(4, 22), *r = fh_prompt(4, 23);
	bkv_sched_stats st = {.size = sizeof(st)};
	uint32_t steps = 0;
	uint64_t a, b = 0, c;

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.device_blocks = 6;
	o.host_blocks = 16;
	o.max_seqs = 2;
	o.cfg.preempt = BKV_PREEMPT_SWAP;
	o.cfg.max_running = 4;
	o.cfg.admit_group = 1;
	f = fh_create(&o);
	a = fh_submit(f, p, 4, 14);
	c = fh_submit(f, q, 4, 12);
	while (bkv_sched_pending(f->s) && steps < 400) {
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
		steps++;
		bkv_sched_stats_get(f->s, &st);
		if (!b && st.swaps)
			b = fh_submit_ex(f, r, 4, 3, 5, 2, 0);
	}
	cr_assert(b, "C was never swapped out: the scenario did not happen");
	cr_assert_eq(bkv_sched_pending(f->s), 0, "stuck after %u steps", steps);
	cr_assert_eq(f->finish_count[a], 1);
	cr_assert_eq(f->finish_count[b], 1);
	cr_assert_eq(f->finish_count[c], 1);
	cr_assert_eq(f->reason[b], BKV_FINISH_LENGTH);
	cr_assert_eq(f->reason[c], BKV_FINISH_LENGTH);
	cr_assert_eq(f->n_out[c][0], 12);
	bkv_sched_stats_get(f->s, &st);
	cr_assert_eq(st.unadmittable, 0);
	fh_destroy(f);
	free(p);
	free(q);
	free(r);
}

/* A request whose histories could need more block-table entries in one step
 * than the batch array can hold is refused, not accepted with a capped
 * array (the step would have written past it). */
Test(kv_safety, submit_refuses_histories_past_the_block_table_array)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_pool *pool;
	bkv_sched *s;
	bkv_request q;
	int32_t tok = 1;
	uint64_t id;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 1;
	pc.device_blocks = 1u << 18;
	pc.prefix_cache = 0;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&sc);
	sc.max_running = 1u << 18;
	sc.max_queue = 4;
	memset(&ops, 0, sizeof(ops));
	ops.forward = fh_forward;
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, NULL, NULL, &s), BKV_OK);
	bkv_request_init(&q);
	q.prompt = &tok;
	q.prompt_len = 1;
	q.max_new_tokens = 3000; /* 2^18 rows x 3,001 blocks > 2^29 entries */
	cr_assert_eq(bkv_submit(s, &q, &id), BKV_E2BIG);
	q.max_new_tokens = 3; /* 2^18 x 4 blocks: well inside (and small to
				 allocate under AddressSanitizer) */
	cr_assert_eq(bkv_submit(s, &q, &id), BKV_OK);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

/* bkv_pool_reset_cache between steps, while requests run: prefilling in
 * chunks, forked after prefill, decoding, preempted (recompute or swap) in
 * a small pool. The blocks they hold leave the index and the blocks they
 * fill later stay out of it (their chain is gone), which bkv_sched_check's
 * invariant 32 must accept while it still holds every other running lane
 * to it; every request ends once with its true tokens, and a prompt
 * computed after the resets is cached again (a second run of it hits). */
static void reset_between_steps(int chunked, bkv_preempt_mode mode)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(64, 41);
	uint32_t i, steps = 0, hit;
	uint64_t last;
	bkv_pool_stats ps;
	bkv_sched_stats st;

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.device_blocks = 32;
	o.host_blocks = 64;
	o.cfg.max_running = 8;
	o.cfg.chunked_prefill = chunked;
	o.cfg.token_budget = 24;
	o.cfg.preempt = mode;
	f = fh_create(&o);
	for (i = 0; i < 12; i++) /* prompts share p's leading tokens */
		fh_submit_ex(f, p, 9 + (i * 5) % 50, 6 + i % 7, 0, 1 + i % 2, 0);
	while (bkv_sched_pending(f->s) > 0 && steps < 2000) {
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0, "check after step %u", steps);
		if (steps % 3 == 1) {
			cr_assert_eq(bkv_pool_reset_cache(f->pool), BKV_OK);
			cr_assert_eq(bkv_sched_check(f->s), 0, "check after the reset at step %u",
				     steps);
		}
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
		steps++;
	}
	cr_assert_eq(bkv_sched_pending(f->s), 0);
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	bkv_sched_stats_get(f->s, &st);
	cr_assert_gt(st.preemptions, 0, "the pool is small enough to preempt");
	all_ended_once(f, 1, 12);
	for (i = 1; i <= 12; i++)
		cr_assert(f->reason[i] == BKV_FINISH_LENGTH || f->reason[i] == BKV_FINISH_STOP,
			  "request %u: reason %d", i, f->reason[i]);
	/* after the resets the cache works as before */
	cr_assert_eq(bkv_pool_reset_cache(f->pool), BKV_OK);
	last = fh_submit(f, p, 40, 2);
	fh_run(f, 100);
	cr_assert_eq(f->finish_count[last], 1);
	ps = pool_stats(f->pool);
	hit = (uint32_t)ps.hit_tokens;
	last = fh_submit(f, p, 40, 2);
	fh_run(f, 100);
	cr_assert_eq(f->finish_count[last], 1);
	ps = pool_stats(f->pool);
	cr_expect_geq(ps.hit_tokens - hit, 36, "the prompt computed after the reset hits");
	cr_expect_eq(bkv_sched_check(f->s), 0);
	fh_destroy(f);
	free(p);
}

Test(kv_safety, a_cache_reset_between_steps_keeps_the_invariants_of_running_requests)
{
	bkv_preempt_mode m;

	for (m = BKV_PREEMPT_RECOMPUTE; m <= BKV_PREEMPT_SWAP; m++) {
		reset_between_steps(1, m);
		reset_between_steps(0, m);
	}
}
