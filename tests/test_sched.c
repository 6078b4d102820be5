/*
 * test_sched.c - the scheduler: exact schedules of each policy, host kinds,
 * chunked prefill, preemption, finish reasons, failure rollback, bad input.
 *
 * Every run goes through the fake host of tests/support (fakehost_sched.h), which checks each
 * batch against its model of the KV memory, and bkv_sched_check runs after
 * every step (fh_run).
 */
#include "fakehost_sched.h"
#include "internal.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Seed 000's generation lengths: 64 with probability 0.4, else 1..39. */
static uint32_t seed000_gen(uint64_t *rng)
{
	*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
	if ((*rng >> 33) % 100 < 40)
		return 64;
	*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
	return 1 + (uint32_t)((*rng >> 33) % 39);
}

static void all_finished_once(fake_host *f, uint64_t first, uint64_t last)
{
	uint64_t id;

	for (id = first; id <= last; id++)
		cr_assert_eq(f->finish_count[id], 1, "request %llu finished %u times",
			     (unsigned long long)id, f->finish_count[id]);
}

static void pool_drained(fake_host *f)
{
	bkv_pool_stats ps = {.size = sizeof(ps)};

	bkv_pool_stats_get(f->pool, &ps);
	cr_assert_eq(ps.nr_used, 0, "blocks still used: %u", ps.nr_used);
	cr_assert_eq(ps.nr_seqs, 0);
	cr_assert_eq(ps.nr_free + ps.nr_cached, ps.device_blocks);
	cr_assert_eq(ps.host_free, ps.host_blocks);
}

/* ---- policies ------------------------------------------------------------ */

Test(sched, static_makes_8_prefill_calls_of_32_rows_for_256_requests)
{
	fh_opts o;
	fake_host *f;
	uint64_t rng = 7, i;
	uint32_t gen[257], g, k, expect_decode = 0, n_pre = 0, n_dec = 0, c;
	int32_t *prompts[257];

	fh_opts_init(&o);
	o.split = 1;
	o.device_blocks = 1024;
	o.cfg.policy = BKV_POLICY_STATIC;
	o.cfg.max_running = 32;
	f = fh_create(&o);
	for (i = 1; i <= 256; i++) {
		uint32_t len = 8 + (uint32_t)(i * 7919 % 57);

		gen[i] = seed000_gen(&rng);
		prompts[i] = fh_prompt(len, i);
		cr_assert_eq(fh_submit(f, prompts[i], len, gen[i]), i);
	}
	for (g = 0; g < 8; g++) {
		uint32_t max_g = 0;

		for (k = 1; k <= 32; k++)
			max_g = BKV_MAX(max_g, gen[g * 32 + k]);
		expect_decode += max_g - 1;
	}
	fh_run(f, 100000);
	for (c = 0; c < f->n_calls; c++) {
		if (f->calls[c].kind == BKV_CALL_PREFILL) {
			n_pre++;
			cr_expect_eq(f->calls[c].n_rows, 32, "prefill call %u has %u rows", c,
				     f->calls[c].n_rows);
		} else {
			cr_assert_eq(f->calls[c].kind, BKV_CALL_DECODE);
			n_dec++;
			cr_expect_eq(f->calls[c].padded_rows, 32, "static pads to the group");
		}
	}
	cr_expect_eq(n_pre, 8);
	cr_expect_eq(n_dec, expect_decode);
	cr_expect_eq(f->n_forward, 0);
	all_finished_once(f, 1, 256);
	for (i = 1; i <= 256; i++) {
		cr_expect_eq(f->n_out[i][0], gen[i]);
		cr_expect_eq(f->reason[i], BKV_FINISH_LENGTH);
		free(prompts[i]);
	}
	pool_drained(f);
	fh_destroy(f);
}

/* Continuous policy: check every step's admissions against the rule. */
static void check_group_rule(uint32_t k, uint32_t max_running, uint32_t n_req)
{
	fh_opts o;
	fake_host *f;
	uint32_t i, running = 0, waiting, steps = 0, admissions = 0;
	int32_t *p = fh_prompt(12, 3);
	uint64_t rng = 11;

	fh_opts_init(&o);
	o.cfg.max_running = max_running;
	o.cfg.admit_group = k;
	o.cfg.max_wait_us = UINT64_MAX;
	f = fh_create(&o);
	for (i = 0; i < n_req; i++) {
		rng = rng * 6364136223846793005ull + 1;
		fh_submit(f, p, 12, 1 + (uint32_t)((rng >> 33) % 20));
	}
	waiting = n_req;
	while (bkv_sched_pending(f->s)) {
		bkv_step_info si;
		uint32_t free_slots = max_running - running;
		int expect = waiting && (free_slots >= k || waiting <= free_slots);

		cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0);
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
		if (expect)
			cr_assert_eq(si.admitted, BKV_MIN(free_slots, waiting),
				     "step %u: %u free, %u waiting, admitted %u", steps,
				     free_slots, waiting, si.admitted);
		else
			cr_assert_eq(si.admitted, 0, "step %u: %u free < k=%u, admitted %u",
				     steps, free_slots, k, si.admitted);
		admissions += si.admitted > 0;
		running = si.running;
		waiting = si.waiting;
		steps++;
	}
	cr_assert(admissions > 1);
	all_finished_once(f, 1, n_req);
	fh_destroy(f);
	free(p);
}

Test(sched, k1_refills_a_freed_slot_in_the_next_step)
{
	check_group_rule(1, 4, 40);
}

Test(sched, k8_waits_until_8_slots_are_free)
{
	check_group_rule(8, 16, 80);
}

Test(sched, max_wait_admits_a_partial_group)
{
	fh_opts o;
	fake_host *f;
	bkv_step_info si;
	int32_t *p = fh_prompt(8, 5);
	uint32_t i, step;

	fh_opts_init(&o);
	o.cfg.max_running = 8;
	o.cfg.admit_group = 8;
	o.cfg.max_wait_us = 5000;
	f = fh_create(&o);
	f->host.tick = 1000;
	for (i = 0; i < 4; i++)
		fh_submit(f, p, 8, 100);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK); /* t = 0: 8 free >= k */
	cr_assert_eq(si.admitted, 4);
	for (i = 0; i < 10; i++)
		fh_submit(f, p, 8, 3);
	/* drained at t = 1000; 4 free < k and 10 waiting do not fit */
	for (step = 2; step <= 6; step++) {
		cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
		cr_assert_eq(si.admitted, 0, "step %u at t=%llu", step,
			     (unsigned long long)f->host.now);
	}
	cr_assert_eq(f->host.now, 6000);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK); /* t = 6000: waited 5000 */
	cr_assert_eq(si.admitted, 4);
	fh_run(f, 10000);
	all_finished_once(f, 1, 14);
	fh_destroy(f);
	free(p);
}

Test(sched, max_wait_auto_is_documented_default)
{
	fh_opts o;
	fake_host *f;

	fh_opts_init(&o);
	f = fh_create(&o);
	cr_expect_eq(f->s->cfg.admit_group, 1);
	cr_expect_eq(f->s->cfg.max_wait_us, 100000);
	cr_expect_eq(f->s->cfg.token_budget, 512);
	cr_expect_eq(f->s->cfg.max_bypass_us, 0, "auto stays 0: derived at each admission");
	fh_destroy(f);
}

Test(sched, max_bypass_us_range_ends_are_accepted)
{
	const uint64_t ok[] = {0, 1, 1ull << 42, UINT64_MAX};
	fh_opts o;
	fake_host *f;

	cr_assert_eq(sizeof(bkv_sched_config),
		     offsetof(bkv_sched_config, connector) + sizeof(void *),
		     "the bound took two reserved slots, batch_layout and ttft_target_us "
		     "one each, speculative decoding three, overlap, evict, victim, "
		     "admit_reserve and retention one each; copy_overlap and "
		     "prefill_first, the adapters' cap and wait and the encoder's cache "
		     "and budget were appended");
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		fh_opts_init(&o);
		o.cfg.max_bypass_us = ok[i];
		f = fh_create(&o);
		cr_expect_eq(f->s->cfg.max_bypass_us, ok[i]);
		fh_destroy(f);
	}
}

Test(sched, chunked_prefill_resumes_at_the_right_position)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(50, 9);
	static const uint32_t starts[] = {0, 16, 32, 48}, lens[] = {16, 16, 16, 2};
	uint32_t c;

	fh_opts_init(&o);
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 16;
	f = fh_create(&o);
	fh_submit(f, p, 50, 3);
	fh_run(f, 100);
	cr_assert_eq(f->n_calls, 6);
	for (c = 0; c < 4; c++) {
		cr_expect_eq(f->calls[c].n_rows, 1);
		cr_expect_eq(f->calls[c].n_decode, 0);
		cr_expect_eq(f->calls[c].row_start[0], starts[c]);
		cr_expect_eq(f->calls[c].row_len[0], lens[c]);
		cr_expect_eq(f->calls[c].row_sample[0], c == 3);
	}
	for (c = 4; c < 6; c++) {
		cr_expect_eq(f->calls[c].n_decode, 1);
		cr_expect_eq(f->calls[c].row_start[0], 50 + (c - 4));
	}
	cr_expect_eq(f->n_out[1][0], 3);
	fh_destroy(f);
	free(p);
}

Test(sched, chunked_prefill_never_exceeds_the_token_budget)
{
	fh_opts o;
	fake_host *f;
	int32_t *p[20];
	uint32_t i, c, mixed_with_decode = 0;

	fh_opts_init(&o);
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 24;
	o.cfg.max_running = 6;
	f = fh_create(&o);
	for (i = 0; i < 20; i++) {
		p[i] = fh_prompt(10 + i * 7, 100 + i);
		fh_submit(f, p[i], 10 + i * 7, 5 + i % 9);
	}
	fh_run(f, 10000);
	for (c = 0; c < f->n_calls; c++) {
		cr_assert(f->calls[c].n_tokens <= 24, "call %u: %u tokens", c, f->calls[c].n_tokens);
		cr_assert_eq(f->calls[c].kind, BKV_CALL_MIXED);
		mixed_with_decode += f->calls[c].n_decode > 0 && f->calls[c].n_rows > f->calls[c].n_decode;
	}
	cr_expect(mixed_with_decode > 0, "chunks ride along with decode rows");
	cr_expect(f->max_call_tokens == 24);
	all_finished_once(f, 1, 20);
	for (i = 0; i < 20; i++) {
		cr_expect_eq(f->n_out[i + 1][0], 5 + i % 9);
		free(p[i]);
	}
	pool_drained(f);
	fh_destroy(f);
}

Test(sched, split_host_chunks_run_as_prefill_calls_under_the_budget)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(40, 4), *q = fh_prompt(40, 5);
	uint32_t c, pre = 0;

	fh_opts_init(&o);
	o.split = 1;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 16;
	f = fh_create(&o);
	/* two prompts (one shared prompt would be computed once: the second
	 * request hits what the first computed) */
	fh_submit(f, p, 40, 4);
	fh_submit(f, q, 40, 4);
	fh_run(f, 100);
	for (c = 0; c < f->n_calls; c++) {
		cr_assert(f->calls[c].n_tokens <= 16);
		if (f->calls[c].kind == BKV_CALL_PREFILL) {
			pre++;
			cr_assert_eq(f->calls[c].n_decode, 0);
		} else {
			cr_assert_eq(f->calls[c].n_decode, f->calls[c].n_rows);
		}
	}
	cr_expect(pre >= 5, "80 prompt tokens at 16 per step need >= 5 prefill calls");
	cr_expect_eq(f->n_forward, 0);
	all_finished_once(f, 1, 2);
	fh_destroy(f);
	free(p);
	free(q);
}

Test(sched, mixed_and_split_hosts_get_the_callbacks_they_registered)
{
	int split;

	for (split = 0; split < 2; split++) {
		fh_opts o;
		fake_host *f;
		int32_t *p = fh_prompt(20, 1);
		uint32_t steps;

		fh_opts_init(&o);
		o.split = split;
		f = fh_create(&o);
		fh_submit(f, p, 20, 5);
		fh_submit(f, p, 20, 2);
		steps = fh_run(f, 100);
		if (split) {
			cr_expect_eq(f->n_forward, 0);
			cr_expect_eq(f->n_prefill, 1);
			/* prefill samples token 1 and the same step's decode call
			 * gives token 2: 5 tokens in 4 steps, 4 decode calls */
			cr_expect_eq(f->n_decode, 4);
			cr_expect_eq(steps, 4);
			cr_expect_eq(f->calls[1].kind, BKV_CALL_DECODE);
			cr_expect_eq(f->calls[1].n_rows, 2, "both fresh rows decode in step 1");
		} else {
			cr_expect_eq(f->n_prefill + f->n_decode, 0);
			cr_expect_eq(f->n_forward, 5);
			cr_expect_eq(steps, 5);
		}
		cr_expect_eq(f->n_out[1][0], 5);
		cr_expect_eq(f->n_out[2][0], 2);
		all_finished_once(f, 1, 2);
		fh_destroy(f);
		free(p);
	}
}

/* prefill_first (vLLM v0's iterations): a split host's step that admits
 * makes only its prefill call, and the running rows, the fresh ones too,
 * decode in the next step that admits none; a mixed host ignores it. */
Test(sched, prefill_first_steps_make_only_their_prefill_call)
{
	int split;

	for (split = 0; split < 2; split++) {
		fh_opts o;
		fake_host *f;
		int32_t *p = fh_prompt(20, 1), *q = fh_prompt(24, 2);
		uint32_t c, steps;

		fh_opts_init(&o);
		o.split = split;
		o.cfg.prefill_first = 1;
		f = fh_create(&o);
		fh_submit(f, p, 20, 5);
		cr_assert_eq(fh_run(f, 2), 2);
		fh_submit(f, q, 24, 3); /* arrives while the first decodes */
		steps = 2 + fh_run(f, 100);
		if (split) {
			/* step 0 prefills A (token 1), step 1 decodes A (2),
			 * step 2 prefills B alone, then 3 decode calls: A's
			 * tokens 3..5, B's 2..3 */
			cr_expect_eq(f->n_forward, 0);
			cr_expect_eq(f->n_prefill, 2);
			cr_expect_eq(f->n_decode, 4);
			cr_expect_eq(steps, 6);
			cr_expect_eq(f->calls[0].kind, BKV_CALL_PREFILL);
			cr_expect_eq(f->calls[1].kind, BKV_CALL_DECODE);
			cr_expect_eq(f->calls[1].n_rows, 1);
			cr_expect_eq(f->calls[2].kind, BKV_CALL_PREFILL);
			cr_expect_eq(f->calls[2].n_rows, 1, "the prefill step runs nothing else");
			cr_expect_eq(f->calls[3].kind, BKV_CALL_DECODE);
			cr_expect_eq(f->calls[3].n_rows, 2, "the fresh row decodes a step later");
			for (c = 0; c < f->n_calls; c++)
				cr_expect(f->calls[c].kind != BKV_CALL_PREFILL ||
					  f->calls[c].n_decode == 0);
		} else {
			cr_expect_eq(f->n_prefill + f->n_decode, 0, "a mixed host ignores it");
			cr_expect_eq(f->n_forward, 5);
			cr_expect_eq(steps, 5);
		}
		cr_expect_eq(f->n_out[1][0], 5);
		cr_expect_eq(f->n_out[2][0], 3);
		all_finished_once(f, 1, 2);
		fh_destroy(f);
		free(p);
		free(q);
	}
}

Test(sched, priority_classes_run_first_and_fcfs_within_a_class)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(8, 2);
	uint64_t lo1, hi1, lo2, hi2;

	fh_opts_init(&o);
	o.cfg.max_running = 1;
	f = fh_create(&o);
	lo1 = fh_submit_ex(f, p, 8, 2, 0, 1, 0);
	hi1 = fh_submit_ex(f, p, 8, 2, 5, 1, 0);
	lo2 = fh_submit_ex(f, p, 8, 2, 0, 1, 0);
	hi2 = fh_submit_ex(f, p, 8, 2, 5, 1, 0);
	fh_run(f, 100);
	/* one slot, two steps per request: hi1, hi2, lo1, lo2 */
	cr_expect_eq(f->calls[0].row_req[0], hi1);
	cr_expect_eq(f->calls[2].row_req[0], hi2);
	cr_expect_eq(f->calls[4].row_req[0], lo1);
	cr_expect_eq(f->calls[6].row_req[0], lo2);
	fh_destroy(f);
	free(p);
}

/* ---- finishing ----------------------------------------------------------- */

Test(sched, finish_reasons_length_stop_error_abort)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(10, 8);
	uint64_t len_id, stop_id, err_id, ab_id;

	fh_opts_init(&o);
	f = fh_create(&o);
	len_id = fh_submit(f, p, 10, 4);
	stop_id = fh_submit_ex(f, p, 10, 50, 0, 1, 3);
	err_id = fh_submit(f, p, 10, 50);
	f->req[err_id].fail_after = 2;
	ab_id = fh_submit(f, p, 10, 50);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(bkv_abort(f->s, ab_id), BKV_OK);
	fh_run(f, 100);
	cr_expect_eq(f->reason[len_id], BKV_FINISH_LENGTH);
	cr_expect_eq(f->n_out[len_id][0], 4);
	cr_expect_eq(f->reason[stop_id], BKV_FINISH_STOP);
	cr_expect_eq(f->n_out[stop_id][0], 3);
	cr_expect_eq(f->out[stop_id][0][2], FH_STOP);
	cr_expect_eq(f->reason[err_id], BKV_FINISH_ERROR);
	cr_expect_eq(f->n_out[err_id][0], 1);
	cr_expect_eq(f->reason[ab_id], BKV_FINISH_ABORT);
	all_finished_once(f, 1, 4);
	pool_drained(f);
	fh_destroy(f);
	free(p);
}

Test(sched, abort_ends_waiting_running_and_inbox_requests_exactly_once)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(10, 8);
	uint64_t a, b, c, d;
	bkv_sched_stats st = {.size = sizeof(st)};

	fh_opts_init(&o);
	o.cfg.max_running = 1;
	f = fh_create(&o);
	a = fh_submit(f, p, 10, 50);
	b = fh_submit(f, p, 10, 50);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK); /* a running, b waiting */
	c = fh_submit(f, p, 10, 50);                /* c in the inbox */
	cr_assert_eq(bkv_abort(f->s, a), BKV_OK);
	cr_assert_eq(bkv_abort(f->s, b), BKV_OK);
	cr_assert_eq(bkv_abort(f->s, c), BKV_OK);
	cr_expect_eq(bkv_abort(f->s, a), BKV_ENOENT, "double abort");
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_expect_eq(f->reason[a], BKV_FINISH_ABORT);
	cr_expect_eq(f->reason[b], BKV_FINISH_ABORT);
	cr_expect_eq(f->reason[c], BKV_FINISH_ABORT);
	cr_expect_eq(bkv_abort(f->s, a), BKV_ENOENT, "abort after the end");
	cr_expect_eq(bkv_sched_pending(f->s), 0);
	d = fh_submit(f, p, 10, 2);
	fh_run(f, 100);
	cr_expect_eq(f->reason[d], BKV_FINISH_LENGTH);
	cr_expect_eq(bkv_abort(f->s, d), BKV_ENOENT);
	all_finished_once(f, 1, 4);
	bkv_sched_stats_get(f->s, &st);
	cr_expect_eq(st.aborted, 3);
	cr_expect_eq(st.finished, 4);
	cr_expect_eq(st.submitted, 4);
	pool_drained(f);
	fh_destroy(f);
	free(p);
}

Test(sched, abort_from_inside_callbacks_ends_each_request_once)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(10, 8);
	uint64_t a, b;

	fh_opts_init(&o);
	f = fh_create(&o);
	a = fh_submit(f, p, 10, 20);
	b = fh_submit(f, p, 10, 1);
	/* a aborts itself from its first on_token: OK, it ends (ABORT) at the
	 * start of the next step; then an abort of b from a's on_finish finds
	 * b already ended in step 1 */
	f->abort_on_token = a;
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_expect_eq(f->abort_rc, BKV_OK);
	cr_expect_eq(f->finish_count[b], 1);
	cr_expect_eq(f->finish_count[a], 0);
	f->abort_on_finish = b;
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_expect_eq(f->finish_count[a], 1);
	cr_expect_eq(f->reason[a], BKV_FINISH_ABORT);
	cr_expect_eq(f->abort_rc, BKV_ENOENT, "b ended in the previous step");
	cr_expect_eq(f->n_out[a][0], 1);
	fh_run(f, 10);
	cr_expect_eq(f->finish_count[b], 1);
	cr_expect_eq(bkv_sched_pending(f->s), 0);
	pool_drained(f);
	fh_destroy(f);
	free(p);
}

Test(sched, abort_raced_by_the_end_of_a_request_is_not_a_second_end)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(10, 8);
	uint64_t a, b;

	fh_opts_init(&o);
	f = fh_create(&o);
	a = fh_submit(f, p, 10, 1); /* ends in step 1 */
	b = fh_submit(f, p, 10, 5);
	/* a's on_finish runs inside step 1, before a leaves the id map */
	f->abort_on_finish = a;
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_expect_eq(f->abort_rc, BKV_OK);
	cr_expect_eq(f->reason[a], BKV_FINISH_LENGTH);
	fh_run(f, 10);
	cr_expect_eq(f->finish_count[a], 1);
	cr_expect_eq(f->finish_count[b], 1);
	cr_expect_eq(bkv_sched_check(f->s), 0);
	pool_drained(f);
	fh_destroy(f);
	free(p);
}

Test(sched, finished_blocks_stay_in_the_prefix_cache)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(40, 8);
	bkv_step_info si;
	bkv_sched_stats st = {.size = sizeof(st)};

	fh_opts_init(&o);
	f = fh_create(&o);
	fh_submit(f, p, 40, 3);
	fh_run(f, 100);
	fh_submit(f, p, 40, 3);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
	/* 40 tokens, 16 per block: blocks 0 and 1 are full and cached */
	cr_expect_eq(si.hit_tokens, 32);
	cr_expect_eq(si.prefill_tokens, 8);
	fh_run(f, 100);
	bkv_sched_stats_get(f->s, &st);
	cr_expect_eq(st.hit_tokens, 32);
	cr_expect_eq(f->n_out[2][0], 3);
	fh_destroy(f);
	free(p);
}

Test(sched, n_samples_fork_branches_that_finish_as_one_request)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(10, 8);
	bkv_pool_stats ps = {.size = sizeof(ps)};
	uint64_t id;
	uint32_t b;

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.cfg.max_running = 4;
	f = fh_create(&o);
	id = fh_submit_ex(f, p, 10, 6, 0, 3, 0);
	fh_run(f, 100);
	for (b = 0; b < 3; b++)
		cr_expect_eq(f->n_out[id][b], 6, "branch %u", b);
	cr_expect_neq(f->out[id][0][0], f->out[id][1][0]);
	cr_expect_eq(f->finish_count[id], 1);
	bkv_pool_stats_get(f->pool, &ps);
	cr_expect(ps.cow_copies >= 2, "the shared partial block is copied on write");
	pool_drained(f);
	fh_destroy(f);
	free(p);
}

/* ---- failure ------------------------------------------------------------- */

static void run_clean_and_failing(int split)
{
	fh_opts o;
	fake_host *a, *b;
	int32_t *p[8];
	uint32_t i, fails = 0, steps = 0;

	fh_opts_init(&o);
	o.split = split;
	o.cfg.max_running = 4;
	a = fh_create(&o);
	b = fh_create(&o);
	b->host.garbage = 1;
	for (i = 0; i < 8; i++) {
		p[i] = fh_prompt(5 + 9 * i, i);
		fh_submit(a, p[i], 5 + 9 * i, 3 + i);
		fh_submit(b, p[i], 5 + 9 * i, 3 + i);
	}
	fh_run(a, 1000);
	while (bkv_sched_pending(b->s) && steps < 1000) {
		uint32_t tokens_before = 0, tokens_after = 0, k, finished = b->finished_total;
		int rc;

		for (k = 1; k <= 8; k++)
			tokens_before += b->n_out[k][0];
		b->host.fail_next = steps % 3 == 1;
		rc = bkv_step(b->s, NULL);
		for (k = 1; k <= 8; k++)
			tokens_after += b->n_out[k][0];
		if (steps % 3 == 1) {
			cr_assert_eq(rc, BKV_EHOST);
			cr_assert_eq(tokens_after, tokens_before, "a failed step emits nothing");
			cr_assert_eq(b->finished_total, finished);
			fails++;
		} else {
			cr_assert_eq(rc, BKV_OK);
		}
		cr_assert_eq(bkv_sched_check(b->s), 0);
		cr_assert_eq(b->host.violations, 0, "%s", b->host.first);
		steps++;
	}
	cr_assert(fails > 3);
	for (i = 1; i <= 8; i++) {
		cr_assert_eq(b->n_out[i][0], a->n_out[i][0]);
		cr_assert_eq(memcmp(a->out[i][0], b->out[i][0], a->n_out[i][0] * sizeof(int32_t)), 0);
	}
	all_finished_once(b, 1, 8);
	pool_drained(b);
	fh_destroy(a);
	fh_destroy(b);
	for (i = 0; i < 8; i++)
		free(p[i]);
}

Test(sched, failed_step_rolls_back_and_the_retry_gives_identical_tokens_mixed)
{
	run_clean_and_failing(0);
}

Test(sched, failed_step_rolls_back_and_the_retry_gives_identical_tokens_split)
{
	run_clean_and_failing(1);
}

Test(sched, step_from_inside_a_callback_is_refused)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(4, 1);

	fh_opts_init(&o);
	f = fh_create(&o);
	fh_submit(f, p, 4, 2);
	f->host.try_nested = 1;
	f->host.nested_rc = 12345;
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_expect_eq(f->host.nested_rc, BKV_ESTATE);
	f->host.try_nested = 0;
	fh_run(f, 10);
	fh_destroy(f);
	free(p);
}

/* ---- preemption ---------------------------------------------------------- */

static bkv__req *find_req(bkv_sched *s, uint64_t id)
{
	uint32_t i;

	for (i = 0; i < s->rs.nr_run; i++)
		if (s->rs.run[i]->id == id)
			return s->rs.run[i];
	for (i = 0; i < s->q.heap_n; i++)
		if (s->q.heap[i]->id == id)
			return s->q.heap[i];
	return NULL;
}

Test(sched, victim_is_lowest_priority_then_most_recently_admitted)
{
	fh_opts o;
	fake_host *f;
	int32_t *p[3] = {fh_prompt(4, 1), fh_prompt(4, 2), fh_prompt(4, 3)};
	uint64_t a, b, c;
	bkv_step_info si;
	bkv__req *rc_;

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.device_blocks = 4;
	o.cfg.preempt = BKV_PREEMPT_RECOMPUTE;
	f = fh_create(&o);
	/* three prompts: with one shared prompt the three full blocks would be
	 * one block after the first commit (duplicates are swapped for the
	 * cached copy) and nobody would need preempting */
	a = fh_submit_ex(f, p[0], 4, 8, 0, 1, 0);
	b = fh_submit_ex(f, p[1], 4, 8, 1, 1, 0);
	c = fh_submit_ex(f, p[2], 4, 8, 0, 1, 0);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK); /* prompts: 3 blocks (b, a, c) */
	cr_assert_eq(si.admitted, 3);
	cr_assert_eq(si.preempted, 0);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK); /* each needs a 2nd block: 1 free */
	cr_assert_eq(si.preempted, 1);
	rc_ = find_req(f->s, c);
	cr_assert(rc_ && rc_->state == BKV__REQ_WAITING, "c (priority 0, admitted last)");
	cr_assert_eq(find_req(f->s, a)->state, BKV__REQ_RUNNING);
	cr_assert_eq(find_req(f->s, b)->state, BKV__REQ_RUNNING);
	cr_assert_eq(si.rows, 2);
	fh_run(f, 1000);
	all_finished_once(f, 1, 3);
	cr_expect_eq(f->n_out[c][0], 8);
	pool_drained(f);
	fh_destroy(f);
	free(p[0]);
	free(p[1]);
	free(p[2]);
}

/* Run the same workload on a roomy pool and a tiny one; the tiny one must
 * preempt and still give every request exactly the same tokens. */
static void run_pressure(bkv_preempt_mode mode, uint32_t host_blocks, int split, int chunked,
			 uint32_t *preempts, uint32_t *swaps)
{
	fh_opts o;
	fake_host *big, *tiny;
	int32_t *p[24];
	uint32_t i, steps = 0;
	bkv_sched_stats st = {.size = sizeof(st)};

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.split = split;
	o.cfg.max_running = 8;
	o.cfg.chunked_prefill = chunked;
	o.cfg.token_budget = 32;
	o.cfg.preempt = mode;
	o.device_blocks = 1024;
	o.host_blocks = host_blocks;
	big = fh_create(&o);
	o.device_blocks = 40;
	tiny = fh_create(&o);
	for (i = 0; i < 24; i++) {
		uint32_t len = 3 + (i * 5) % 17, gen = 10 + (i * 7) % 25;

		p[i] = fh_prompt(len, 50 + i);
		fh_submit_ex(big, p[i], len, gen, (int32_t)(i % 3), 1, 0);
		fh_submit_ex(tiny, p[i], len, gen, (int32_t)(i % 3), 1, 0);
	}
	fh_run(big, 10000);
	while (bkv_sched_pending(tiny->s) && steps < 10000) {
		uint32_t k;

		cr_assert_eq(bkv_step(tiny->s, NULL), BKV_OK);
		cr_assert_eq(bkv_sched_check(tiny->s), 0, "check %d", bkv_sched_check(tiny->s));
		cr_assert_eq(tiny->host.violations, 0, "%s", tiny->host.first);
		/* no thrash: nothing preempted in this step runs again in it */
		for (k = 0; k < tiny->s->rs.nr_run; k++)
			cr_assert_neq(tiny->s->rs.run[k]->preempt_step, tiny->s->plan.step_no);
		steps++;
	}
	cr_assert_eq(bkv_sched_pending(tiny->s), 0);
	for (i = 1; i <= 24; i++) {
		cr_assert_eq(tiny->n_out[i][0], big->n_out[i][0], "request %u", i);
		cr_assert_eq(memcmp(tiny->out[i][0], big->out[i][0],
				    big->n_out[i][0] * sizeof(int32_t)), 0, "request %u tokens", i);
	}
	all_finished_once(tiny, 1, 24);
	pool_drained(tiny);
	bkv_sched_stats_get(tiny->s, &st);
	*preempts = (uint32_t)st.preemptions;
	*swaps = (uint32_t)st.swaps;
	fh_destroy(big);
	fh_destroy(tiny);
	for (i = 0; i < 24; i++)
		free(p[i]);
}

Test(sched, recompute_resumes_with_identical_tokens)
{
	uint32_t pre, sw;

	run_pressure(BKV_PREEMPT_RECOMPUTE, 0, 0, 0, &pre, &sw);
	cr_expect(pre > 0, "the tiny pool preempts");
	cr_expect_eq(sw, 0);
	run_pressure(BKV_PREEMPT_RECOMPUTE, 0, 1, 1, &pre, &sw);
	cr_expect(pre > 0);
}

Test(sched, swap_round_trips_through_the_host_tier)
{
	uint32_t pre, sw;

	run_pressure(BKV_PREEMPT_SWAP, 256, 0, 0, &pre, &sw);
	cr_expect(sw > 0, "swaps: %u of %u preemptions", sw, pre);
	run_pressure(BKV_PREEMPT_AUTO, 256, 1, 0, &pre, &sw);
	cr_expect(sw > 0);
	run_pressure(BKV_PREEMPT_AUTO, 4, 0, 1, &pre, &sw);
	cr_expect(pre > sw, "AUTO recomputes when the host tier is full");
}

Test(sched, admission_respects_the_watermark)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(16, 1);
	bkv_step_info si;
	bkv_pool_config pc;
	bkv_pool *pool;
	bkv_sched *s;
	bkv_host_ops ops = {.forward = fh_forward};
	bkv_sched_config sc;

	fh_opts_init(&o);
	f = fh_create(&o);
	/* a second pool with a watermark: 10 blocks, keep 4 free */
	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 10;
	pc.watermark_blocks = 4;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&sc);
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, f, NULL, &s), BKV_OK);
	bkv_sched_destroy(f->s);
	f->s = s;
	fh_submit(f, p, 16, 2); /* 4 blocks (+1 to sample): admitted, nothing ran */
	fh_submit(f, p, 8, 2);  /* 9 tokens = 3 blocks would leave 10-4-3 = 3 < 4 */
	cr_assert_eq(bkv_step(s, &si), BKV_OK);
	cr_expect_eq(si.admitted, 1);
	bkv_sched_destroy(s);
	f->s = NULL;
	bkv_pool_destroy(pool);
	fh_destroy(f);
	free(p);
}

/* ---- bad input ----------------------------------------------------------- */

static int dummy_fw(void *h, const bkv_batch *b, int32_t *n)
{
	(void)h;
	(void)b;
	(void)n;
	return 0;
}

Test(sched, create_refuses_bad_arguments_and_configs)
{
	bkv_pool_config pc;
	bkv_pool *pool;
	bkv_sched_config c;
	bkv_host_ops ops = {.forward = dummy_fw}, none = {0}, half = {.prefill = dummy_fw};
	bkv_sched *s = (bkv_sched *)0x1;

	bkv_pool_config_init(&pc);
	pc.device_blocks = 16;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&c);
	cr_expect_eq(bkv_sched_create(NULL, pool, &ops, NULL, NULL, &s), BKV_EINVAL);
	cr_expect_eq(bkv_sched_create(&c, NULL, &ops, NULL, NULL, &s), BKV_EINVAL);
	cr_expect_eq(bkv_sched_create(&c, pool, NULL, NULL, NULL, &s), BKV_EINVAL);
	cr_expect_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, NULL), BKV_EINVAL);
	cr_expect_eq(bkv_sched_create(&c, pool, &none, NULL, NULL, &s), BKV_EINVAL);
	cr_expect_eq(bkv_sched_create(&c, pool, &half, NULL, NULL, &s), BKV_EINVAL);
#define BAD(field, value)                                                      \
	do {                                                                   \
		bkv_sched_config_init(&c);                                     \
		c.field = value;                                               \
		cr_expect_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), \
			     BKV_EINVAL, #field " = " #value);                 \
	} while (0)
	BAD(size, 8);
	BAD(policy, (bkv_policy)7);
	BAD(max_running, 0);
	BAD(max_running, (1u << 20) + 1);
	BAD(admit_group, 33);
	BAD(max_queue, 0);
	BAD(token_budget, (1u << 24) + 1);
	BAD(preempt, (bkv_preempt_mode)9);
	BAD(preempt, BKV_PREEMPT_SWAP); /* the pool has no host tier */
	BAD(host_link_bytes_per_us, -1.0);
	BAD(max_bypass_us, (1ull << 42) + 1); /* past the range, not UINT64_MAX */
	BAD(max_bypass_us, UINT64_MAX - 1);
	BAD(spec_max_k, BKV_SPEC_MAX_K + 1);
	BAD(spec_k_mode, (bkv_spec_k_mode)2);
	BAD(spec_drafts, (bkv_spec_drafts)2);
	BAD(overlap, 1); /* overlap needs ops.launch */
	BAD(evict, (bkv_evict_policy)3);
	BAD(victim, (bkv_victim_policy)2);
	BAD(admit_reserve, (bkv_admit_reserve)2);
	BAD(batch_layout, (bkv_batch_layout)2);
	BAD(prefill_first, 2);
#undef BAD
	cr_expect_eq(s, (bkv_sched *)0x1, "out untouched on failure");
	cr_expect_eq(bkv_pool_check(pool), 0);
	bkv_sched_destroy(NULL);
	bkv_pool_destroy(pool);
}

Test(sched, submit_abort_step_refuse_bad_input_and_change_nothing)
{
	fh_opts o;
	fake_host *f;
	int32_t p[4] = {1, 2, 3, 4};
	bkv_request q;
	bkv_sched_stats st = {.size = sizeof(st)};
	uint64_t id = 77;

	fh_opts_init(&o);
	o.device_blocks = 8; /* 128 tokens */
	o.cfg.max_running = 2;
	o.cfg.max_queue = 2;
	f = fh_create(&o);
#define SUBMIT_RC(expect, ...)                                                 \
	do {                                                                   \
		bkv_request_init(&q);                                          \
		q.prompt = p;                                                  \
		q.prompt_len = 4;                                              \
		q.max_new_tokens = 4;                                          \
		__VA_ARGS__;                                                   \
		cr_expect_eq(bkv_submit(f->s, &q, &id), expect, #__VA_ARGS__); \
	} while (0)
	cr_expect_eq(bkv_submit(NULL, &q, &id), BKV_EINVAL);
	cr_expect_eq(bkv_submit(f->s, NULL, &id), BKV_EINVAL);
	SUBMIT_RC(BKV_EINVAL, q.prompt_len = 0);
	SUBMIT_RC(BKV_EINVAL, q.prompt = NULL);
	SUBMIT_RC(BKV_EINVAL, q.max_new_tokens = 0);
	SUBMIT_RC(BKV_EINVAL, q.n = 0);
	SUBMIT_RC(BKV_EINVAL, q.n_stop = 2);
	SUBMIT_RC(BKV_EINVAL, q.size = 0);
	SUBMIT_RC(BKV_E2BIG, q.max_new_tokens = 125);
	SUBMIT_RC(BKV_E2BIG, q.n = 3);
	cr_expect_eq(id, 77, "req_id untouched on failure");
	cr_expect_eq(bkv_sched_pending(f->s), 0);
	bkv_sched_stats_get(f->s, &st);
	cr_expect_eq(st.submitted, 0);
	SUBMIT_RC(BKV_OK, q.max_new_tokens = 124);
	SUBMIT_RC(BKV_OK, (void)0);
	SUBMIT_RC(BKV_EAGAIN, (void)0);
	cr_expect_eq(bkv_sched_pending(f->s), 2);
#undef SUBMIT_RC
	cr_expect_eq(bkv_abort(NULL, 1), BKV_EINVAL);
	cr_expect_eq(bkv_abort(f->s, 0), BKV_EINVAL);
	cr_expect_eq(bkv_abort(f->s, 999), BKV_ENOENT);
	cr_expect_eq(bkv_step(NULL, NULL), BKV_EINVAL);
	cr_expect_eq(bkv_sched_check(NULL), BKV_EINVAL);
	cr_expect_eq(bkv_sched_pending(NULL), 0);
	bkv_sched_stats_get(NULL, &st);
	bkv_sched_config_init(NULL);
	bkv_request_init(NULL);
	cr_expect_eq(bkv_sched_check(f->s), 0);
	cr_expect_eq(f->finished_total, 0);
	fh_destroy(f);
}

Test(sched, empty_steps_are_ok_and_cheap)
{
	fh_opts o;
	fake_host *f;
	bkv_step_info si;

	fh_opts_init(&o);
	f = fh_create(&o);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
	cr_expect_eq(si.rows, 0);
	cr_expect_eq(f->n_calls, 0);
	cr_expect_eq(bkv_sched_check(f->s), 0);
	fh_destroy(f);
}

/* ---- output-length hints: the bypass bound -------------------------------- */

static uint64_t submit_hinted(fake_host *f, const int32_t *prompt, uint32_t len,
			      uint32_t max_new, int32_t prio, uint32_t hint)
{
	bkv_request q;
	uint64_t id = 0;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = len;
	q.max_new_tokens = max_new;
	q.priority = prio;
	q.predicted_output = hint;
	q.user = fh_next_req(f, &q);
	cr_assert_eq(bkv_submit(f->s, &q, &id), BKV_OK);
	cr_assert(id <= FH_MAX_REQ);
	f->req[id].prompt = prompt;
	f->req[id].prompt_len = len;
	return id;
}

/* An unhinted request submitted first, then a stream of longer-hinted ones
 * that keeps both slots busy and two requests always waiting. Returns the
 * start time (virtual us) of the step that admitted the unhinted one, or
 * UINT64_MAX if it was still waiting after `steps` steps. *passed: hinted
 * requests admitted in steps that began after bound_us (the unhinted one
 * still waiting). */
static uint64_t stream_past_unhinted(uint64_t max_bypass_us, uint32_t steps, uint64_t bound_us,
				     uint32_t *passed, double *auto_bound)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(8, 5);
	uint64_t u, t_admit = UINT64_MAX;
	uint32_t i;

	fh_opts_init(&o);
	o.cfg.max_running = 2;
	o.cfg.admit_group = 1;
	o.cfg.max_wait_us = UINT64_MAX;
	o.cfg.max_bypass_us = max_bypass_us;
	f = fh_create(&o);
	*passed = 0;
	u = submit_hinted(f, p, 8, 4, 0, 0);
	for (i = 0; i < 4; i++)
		submit_hinted(f, p, 8, 6, 0, 50);
	for (i = 0; i < steps && bkv_sched_pending(f->s); i++) {
		uint64_t t0 = f->host.now;
		bkv_step_info si;

		cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
		if (t_admit == UINT64_MAX && f->n_out[u][0] > 0) {
			t_admit = t0;
			if (auto_bound)
				*auto_bound = 2.0 * f->s->q.run_mean_us * (1.0 + 5.0 / 2.0);
		} else if (t_admit == UINT64_MAX && t0 > bound_us) {
			*passed += si.admitted;
		}
		/* the stream: keep two hinted requests waiting */
		while (si.waiting + (t_admit == UINT64_MAX ? 0 : 1) < 3 &&
		       f->s->in.next_id < FH_MAX_REQ - 1) {
			submit_hinted(f, p, 8, 6, 0, 50 + (uint32_t)(f->s->in.next_id % 7));
			si.waiting++;
		}
	}
	cr_assert_eq(f->finish_count[u], t_admit == UINT64_MAX ? 0u : 1u);
	fh_destroy(f);
	free(p);
	return t_admit;
}

Test(sched, unhinted_request_is_admitted_within_the_bypass_bound)
{
	uint32_t passed;
	uint64_t t;

	/* no bound: the stream passes it for as long as it lasts */
	t = stream_past_unhinted(UINT64_MAX, 400, 5000, &passed, NULL);
	cr_expect_eq(t, UINT64_MAX, "admitted at %llu us with no bound", (unsigned long long)t);
	/* 5 ms: admitted in the first step after it has waited 5 ms in which a
	 * slot is free (requests here run 6 steps of 100 us), before any
	 * hinted request that step; it entered the queue at 0 us */
	t = stream_past_unhinted(5000, 400, 5000, &passed, NULL);
	cr_expect(t > 5000 && t <= 5000 + 6 * 100, "admitted at %llu us", (unsigned long long)t);
	cr_expect_eq(passed, 0, "%u hinted requests passed it after the bound", passed);
}

Test(sched, auto_bypass_bound_admits_the_unhinted_request)
{
	uint32_t passed;
	double bound = 0;
	uint64_t t;

	/* auto: 2 * S * (1 + Q / max_running), Q = 5 slots queued at arrival;
	 * S is observed (about 600 us here: 6 steps of 100 us) */
	t = stream_past_unhinted(0, 400, UINT64_MAX, &passed, &bound);
	cr_assert_neq(t, UINT64_MAX, "never admitted under auto");
	cr_expect(bound > 0 && (double)t > bound * 0.9 && (double)t <= bound * 1.1 + 600,
		  "admitted at %llu us, auto bound %.0f us", (unsigned long long)t, bound);
}

/* With no hint anywhere the age heap agrees with the queue on the head: the
 * bound, however small, changes nothing (the sched tests pin FCFS). */
Test(sched, bypass_bound_never_acts_without_hints)
{
	uint64_t ids[2][40];
	uint32_t order[2][40], n[2] = {0, 0};

	for (int run = 0; run < 2; run++) {
		fh_opts o;
		fake_host *f;
		int32_t *p = fh_prompt(10, 9);

		fh_opts_init(&o);
		o.cfg.max_running = 3;
		o.cfg.max_bypass_us = run ? 1 : UINT64_MAX;
		f = fh_create(&o);
		for (uint32_t i = 0; i < 40; i++)
			ids[run][i] = fh_submit_ex(f, p, 10, 2 + i % 9, (int32_t)(i % 3), 1, 0);
		while (bkv_sched_pending(f->s)) {
			uint64_t before[41];

			for (uint32_t i = 0; i < 40; i++)
				before[i] = f->n_out[ids[run][i]][0];
			cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
			cr_assert_eq(bkv_sched_check(f->s), 0);
			for (uint32_t i = 0; i < 40; i++)
				if (before[i] == 0 && f->n_out[ids[run][i]][0] > 0)
					order[run][n[run]++] = i;
		}
		fh_destroy(f);
		free(p);
	}
	cr_assert_eq(n[0], 40);
	cr_assert_eq(n[1], 40);
	cr_assert_arr_eq(order[0], order[1], sizeof(order[0]));
}

/* Hints, priority classes, preemption (a small pool), swap and aborts of
 * waiting requests: the checker (age heap invariants 24-29 included) holds
 * after every step, and every request ends exactly once. */
Test(sched, age_heap_stays_consistent_under_preemption_priorities_and_aborts)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(40, 3);
	uint64_t rng = 99, last = 0;
	uint32_t step;

	fh_opts_init(&o);
	o.device_blocks = 16; /* 256 tokens: preemption */
	o.host_blocks = 16;
	o.cfg.max_running = 6;
	o.cfg.max_bypass_us = 2000;
	o.cfg.preempt = BKV_PREEMPT_SWAP;
	f = fh_create(&o);
	for (step = 0; step < 600; step++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		if (step < 300 && (rng >> 40) % 3 == 0 && f->s->in.next_id < FH_MAX_REQ - 1)
			last = submit_hinted(f, p, 8 + (uint32_t)(rng >> 50) % 32,
					     20 + (uint32_t)(rng >> 20) % 60, (int32_t)((rng >> 30) % 3),
					     (uint32_t)((rng >> 12) % 4) * 10);
		if ((rng >> 44) % 11 == 0 && last)
			(void)bkv_abort(f->s, 1 + (rng >> 8) % last);
		cr_assert(bkv_step(f->s, NULL) == BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d at step %u",
			     bkv_sched_check(f->s), step);
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	}
	fh_run(f, 100000);
	cr_assert(f->s->stats.preemptions > 0, "the workload must preempt");
	all_finished_once(f, 1, last);
	fh_destroy(f);
	free(p);
}

Test(sched, checker_catches_a_broken_age_heap)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(8, 1);
	bkv__req *a, *b;

	fh_opts_init(&o);
	o.cfg.max_running = 1;
	f = fh_create(&o);
	for (uint32_t i = 0; i < 4; i++)
		submit_hinted(f, p, 8, 3, 0, i * 10);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(f->s->q.age_n, 3);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	a = f->s->q.age[0];
	b = f->s->q.age[1];
	/* out of arrival order */
	f->s->q.age[0] = b;
	f->s->q.age[1] = a;
	a->age_idx = 1;
	b->age_idx = 0;
	cr_expect_eq(bkv_sched_check(f->s), 29);
	f->s->q.age[0] = a;
	f->s->q.age[1] = b;
	a->age_idx = 0;
	b->age_idx = 1;
	/* missing */
	f->s->q.age_n--;
	cr_expect_eq(bkv_sched_check(f->s), 24);
	f->s->q.age_n++;
	cr_assert_eq(bkv_sched_check(f->s), 0);
	fh_run(f, 1000);
	fh_destroy(f);
	free(p);
}
