/*
 * test_pack.c - length-aware packing of a split host's prefill rows: with
 * admission auto, the step's prefill rows go out as the cheapest set of
 * prefill calls the cost model finds (lib/decide/pack.c, bkv__auto_pack), each call
 * its own batch, then the decode call (lib/sched/step.c, run_prefill).
 *
 * The scheduler runs through the fake host of tests/support (fakehost_sched.h) (it checks
 * every batch against its model of the KV memory) with seed 000's padded
 * polynomial as the cost model, so every decision here is exact arithmetic.
 * The partition itself is checked against a brute force over every set
 * partition of small row sets.
 */
#include "fakehost_sched.h"
#include "internal.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bkv_cost_poly g_poly; /* the model of every fake host here */

/* A split host, 32 slots, admission auto, the padded (packed = 0) or ragged
 * (packed = 1) seed 000 polynomial as its cost model. */
static fake_host *pack_host(int ragged, uint32_t admit_group, bkv_policy policy)
{
	fh_opts o;

	fh_opts_init(&o);
	o.split = 1;
	o.device_blocks = 1024;
	o.cfg.max_running = 32;
	o.cfg.admit_group = admit_group;
	o.cfg.policy = policy;
	bkv_cost_poly_init(&g_poly);
	g_poly.packed = ragged;
	o.cfg.cost = bkv_cost_poly_model(&g_poly);
	return fh_create(&o);
}

/* Seed 000's price of one prefill call over n fresh prompts of lens[]. */
static double prefill_price(const uint32_t *lens, uint32_t n)
{
	bkv_chunk_shape c[64];
	bkv_step_shape sh;
	uint32_t i;

	cr_assert(n <= 64);
	for (i = 0; i < n; i++) {
		c[i].len = lens[i];
		c[i].start = 0;
	}
	memset(&sh, 0, sizeof(sh));
	sh.kind = BKV_CALL_PREFILL;
	sh.n_chunks = n;
	sh.chunks = c;
	return bkv_cost_poly_step_us(&g_poly, &sh);
}

/* Prompts 16, 2000, 16, 16 (ids 1..4, in that order); the long one ends
 * with its first token (the fake host keeps histories of 160 tokens). */
static int32_t *g_prompts[4];
static const uint32_t g_lens[4] = {16, 2000, 16, 16};
static const uint32_t g_new[4] = {4, 1, 4, 4};

static void submit_mix(fake_host *f, uint64_t first_id)
{
	uint32_t i;

	for (i = 0; i < 4; i++) {
		g_prompts[i] = fh_prompt(g_lens[i], 40 + i);
		cr_assert_eq(fh_submit(f, g_prompts[i], g_lens[i], g_new[i]), first_id + i);
	}
}

static void free_mix(void)
{
	uint32_t i;

	for (i = 0; i < 4; i++) {
		free(g_prompts[i]);
		g_prompts[i] = NULL;
	}
}

static void finished_once_with(fake_host *f, uint64_t first_id)
{
	uint32_t i;

	for (i = 0; i < 4; i++) {
		cr_assert_eq(f->finish_count[first_id + i], 1);
		cr_assert_eq(f->n_out[first_id + i][0], g_new[i]);
		cr_assert_eq(f->reason[first_id + i], BKV_FINISH_LENGTH);
	}
}

/* The calls of the mix's first step: the three short prompts in one prefill
 * call, the long one in a second, then the decode call over the short ones
 * (the long one ended in its prefill call). */
static void expect_mix_calls(const fake_host *f, uint32_t c0, uint64_t first_id)
{
	const fh_call *a = &f->calls[c0], *b = &f->calls[c0 + 1], *d = &f->calls[c0 + 2];
	uint32_t r, seen = 0;

	cr_assert_eq(a->kind, BKV_CALL_PREFILL);
	cr_assert_eq(a->n_rows, 3);
	cr_assert_eq(a->n_tokens, 48);
	for (r = 0; r < 3; r++) {
		cr_assert_eq(a->row_len[r], 16);
		cr_assert_eq(a->row_start[r], 0);
		cr_assert_eq(a->row_sample[r], 1);
		cr_assert(a->row_req[r] != first_id + 1, "the long prompt is not in the first call");
		seen |= 1u << (a->row_req[r] - first_id);
	}
	cr_assert_eq(seen, 0xdu, "rows of requests 1, 3 and 4 of the mix");
	cr_assert_eq(b->kind, BKV_CALL_PREFILL);
	cr_assert_eq(b->n_rows, 1);
	cr_assert_eq(b->n_tokens, 2000);
	cr_assert_eq(b->row_req[0], first_id + 1);
	cr_assert_eq(b->row_len[0], 2000);
	cr_assert_eq(d->kind, BKV_CALL_DECODE);
	cr_assert_eq(d->n_rows, 3);
	cr_assert_eq(d->n_decode, 3);
}

Test(pack, split_auto_puts_short_and_long_prompts_in_two_prefill_calls)
{
	fake_host *f = pack_host(0, 0, BKV_POLICY_CONTINUOUS);
	const uint32_t shorts[3] = {16, 16, 16}, all[4] = {16, 16, 16, 2000}, longest = 2000;
	bkv_step_shape dec;
	bkv_step_info si;
	double single, packed;

	submit_mix(f, 1);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	cr_assert_eq(si.admitted, 4);
	cr_assert_eq(si.prefill_calls, 2);
	cr_assert_eq(si.decode_calls, 1);
	cr_assert_eq(si.prefill_tokens, 2048);
	cr_assert_eq(si.rows, 7);
	cr_assert_eq(f->n_calls, 3);
	expect_mix_calls(f, 0, 1);
	/* the step's prediction is the two prefill calls and the decode call,
	 * and the two calls are predicted cheaper than one padded call */
	packed = prefill_price(shorts, 3) + prefill_price(&longest, 1);
	single = prefill_price(all, 4);
	cr_assert_lt(packed, single);
	memset(&dec, 0, sizeof(dec));
	dec.kind = BKV_CALL_DECODE;
	dec.decode_rows = 3;
	dec.padded_rows = 3;
	dec.decode_context = 3 * 17;
	cr_assert_float_eq(si.predicted_us, packed + bkv_cost_poly_step_us(&g_poly, &dec), 1e-6);
	fh_run(f, 100);
	finished_once_with(f, 1);
	fh_destroy(f);
	free_mix();
}

Test(pack, rows_of_one_length_share_one_prefill_call)
{
	fake_host *f = pack_host(0, 0, BKV_POLICY_CONTINUOUS);
	int32_t *p[6];
	bkv_step_info si;
	uint32_t i;

	for (i = 0; i < 6; i++) {
		p[i] = fh_prompt(40, 70 + i);
		fh_submit(f, p[i], 40, 3);
	}
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
	cr_assert_eq(si.admitted, 6);
	cr_assert_eq(si.prefill_calls, 1);
	cr_assert_eq(f->calls[0].kind, BKV_CALL_PREFILL);
	cr_assert_eq(f->calls[0].n_rows, 6);
	fh_run(f, 100);
	cr_assert_eq(f->finished_total, 6);
	fh_destroy(f);
	for (i = 0; i < 6; i++)
		free(p[i]);
}

Test(pack, a_ragged_prefill_model_keeps_one_call)
{
	fake_host *f = pack_host(1, 0, BKV_POLICY_CONTINUOUS);
	bkv_step_info si;

	submit_mix(f, 1);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
	cr_assert_eq(si.prefill_calls, 1, "without padding a second call only adds its fixed part");
	cr_assert_eq(f->calls[0].n_rows, 4);
	fh_run(f, 100);
	finished_once_with(f, 1);
	fh_destroy(f);
	free_mix();
}

Test(pack, fixed_k_and_static_batching_keep_one_prefill_call)
{
	bkv_policy pol[2] = {BKV_POLICY_CONTINUOUS, BKV_POLICY_STATIC};
	uint32_t i;

	for (i = 0; i < 2; i++) {
		fake_host *f = pack_host(0, i == 0 ? 4 : 0, pol[i]);
		bkv_step_info si;

		submit_mix(f, 1);
		cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
		cr_assert_eq(si.admitted, 4);
		cr_assert_eq(si.prefill_calls, 1, "policy %u: the user's grouping stands", i);
		cr_assert_eq(f->calls[0].kind, BKV_CALL_PREFILL);
		cr_assert_eq(f->calls[0].n_rows, 4);
		fh_run(f, 100);
		finished_once_with(f, 1);
		fh_destroy(f);
		free_mix();
	}
}

Test(pack, a_failure_in_the_second_prefill_call_rolls_back_the_whole_step)
{
	fake_host *f = pack_host(0, 0, BKV_POLICY_CONTINUOUS);
	bkv_sched_stats st = {.size = sizeof(st)};
	bkv_step_info si;
	uint32_t i;

	f->host.fail_at = 2;
	f->host.garbage = 1; /* the failing call writes wrong KV first */
	submit_mix(f, 1);
	cr_assert_eq(bkv_step(f->s, &si), BKV_EHOST);
	cr_assert_eq(f->n_calls, 2, "no decode call after a failed prefill call");
	cr_assert_eq(f->calls[0].n_rows, 3);
	cr_assert_eq(f->calls[1].n_rows, 1);
	cr_assert_eq(si.prefill_calls, 0);
	cr_assert_eq(si.prefill_tokens, 0);
	cr_assert_eq(si.rows, 0);
	for (i = 1; i <= 4; i++)
		cr_assert_eq(f->n_out[i][0], 0, "request %u got a token from a failed step", i);
	cr_assert_eq(f->finished_total, 0);
	cr_assert_eq(bkv_sched_pending(f->s), 4);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	bkv_sched_stats_get(f->s, &st);
	cr_assert_eq(st.failed_steps, 1);
	cr_assert_eq(st.steps, 0);
	cr_assert_eq(st.prefill_tokens, 0);
	/* the next step retries: the same two calls, then the decode call */
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	cr_assert_eq(si.prefill_calls, 2);
	cr_assert_eq(f->n_calls, 5);
	expect_mix_calls(f, 2, 1);
	fh_run(f, 100);
	finished_once_with(f, 1);
	fh_destroy(f);
	free_mix();
}

Test(pack, copies_go_out_with_the_first_prefill_call_of_the_step)
{
	fake_host *f = pack_host(0, 0, BKV_POLICY_CONTINUOUS);
	int32_t *fork_prompt = fh_prompt(20, 9);
	bkv_step_info si;

	/* request 1 forks two branches from a 20-token prompt: step 1
	 * prefills 19 tokens; in step 2 both branches write the shared
	 * partial block, so a copy-on-write copy is pending when the mix is
	 * admitted and packed */
	cr_assert_eq(fh_submit_ex(f, fork_prompt, 20, 3, 0, 2, 0), 1);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
	cr_assert_eq(f->n_calls, 1);
	submit_mix(f, 2);
	cr_assert_eq(bkv_step(f->s, &si), BKV_OK);
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	cr_assert_eq(si.prefill_calls, 2);
	cr_assert_eq(f->n_calls, 4);
	cr_assert_eq(f->calls[1].kind, BKV_CALL_PREFILL);
	cr_assert_eq(f->calls[1].n_copies, 1, "the copy goes with the step's first call");
	cr_assert_eq(f->calls[2].kind, BKV_CALL_PREFILL);
	cr_assert_eq(f->calls[2].n_copies, 0);
	cr_assert_eq(f->calls[3].kind, BKV_CALL_DECODE);
	cr_assert_eq(f->calls[3].n_copies, 0);
	cr_assert_eq(f->calls[3].n_rows, 5, "two branches and three short prompts");
	fh_run(f, 100);
	cr_assert_eq(f->finish_count[1], 1);
	cr_assert_eq(f->n_out[1][0], 3);
	cr_assert_eq(f->n_out[1][1], 3);
	finished_once_with(f, 2);
	fh_destroy(f);
	free_mix();
	free(fork_prompt);
}

/* ---- the partition ------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (uint32_t)(g_rng % n);
}

/* Price of the prefill calls given as a label per row (0 .. k-1). */
static double partition_price(const bkv__row *rows, uint32_t n, const uint32_t *label,
			      uint32_t k)
{
	bkv_chunk_shape c[32];
	bkv_step_shape sh;
	double t = 0.0;
	uint32_t g, i, m;

	memset(&sh, 0, sizeof(sh));
	sh.kind = BKV_CALL_PREFILL;
	for (g = 0; g < k; g++) {
		for (i = 0, m = 0; i < n; i++) {
			if (label[i] != g)
				continue;
			c[m].len = rows[i].end - rows[i].start;
			c[m++].start = rows[i].start;
		}
		sh.n_chunks = m;
		sh.chunks = c;
		t += bkv_cost_poly_step_us(&g_poly, &sh);
	}
	return t;
}

/* The cheapest of every set partition of n rows (restricted growth strings:
 * label[i] <= 1 + max(label[0..i-1])). */
static double brute_force_best(const bkv__row *rows, uint32_t n)
{
	uint32_t label[16] = {0}, top[16] = {0}, i, k;
	double best = INFINITY;

	for (;;) {
		double t;

		for (i = 1, k = 1; i < n; i++)
			k = BKV_MAX(k, label[i] + 1);
		t = partition_price(rows, n, label, k);
		if (t < best)
			best = t;
		/* next string: bump the last position that can grow */
		for (i = n; i-- > 1;) {
			top[i] = 0;
			for (k = 0; k < i; k++)
				top[i] = BKV_MAX(top[i], label[k] + 1);
			if (label[i] < top[i]) {
				label[i]++;
				for (k = i + 1; k < n; k++)
					label[k] = 0;
				break;
			}
		}
		if (i == 0 || i > n)
			return best;
	}
}

/* What bkv__auto_pack answered, checked for shape; returns its price. */
static double checked_pack_price(bkv_sched *s, const bkv__row *rows, uint32_t n,
				 uint32_t *n_calls)
{
	bkv__row *sorted = NULL;
	const uint32_t *order = NULL, *ends = NULL;
	uint32_t label[32], g, i, b = 0;
	uint64_t seen = 0;

	*n_calls = bkv__auto_pack(s, rows, n, &sorted, &order, &ends);
	cr_assert(*n_calls >= 1 && *n_calls <= n);
	if (*n_calls == 1) {
		memset(label, 0, sizeof(label));
		return partition_price(rows, n, label, 1);
	}
	for (i = 0; i < n; i++) {
		cr_assert_lt(order[i], n);
		seen |= 1ull << order[i];
		cr_assert_eq(sorted[i].start, rows[order[i]].start);
		cr_assert_eq(sorted[i].end, rows[order[i]].end);
		if (i)
			cr_assert_geq(sorted[i].end - sorted[i].start,
				      sorted[i - 1].end - sorted[i - 1].start, "sorted by length");
	}
	cr_assert_eq(seen, (1ull << n) - 1, "order is a permutation");
	for (g = 0; g < *n_calls; b = ends[g++]) {
		cr_assert_gt(ends[g], b, "call %u is empty", g);
		for (i = b; i < ends[g]; i++)
			label[order[i]] = g;
	}
	cr_assert_eq(b, n);
	return partition_price(rows, n, label, *n_calls);
}

Test(pack, the_partition_is_the_cheapest_of_all_and_never_above_one_call)
{
	static const uint32_t menu[] = {8, 16, 16, 40, 64, 100, 256, 700, 1500, 2048};
	fake_host *f = pack_host(0, 0, BKV_POLICY_CONTINUOUS);
	uint32_t trial, multi = 0, single_calls = 0;

	for (trial = 0; trial < 300; trial++) {
		bkv__row rows[8];
		uint32_t n = 2 + rnd(7), i, n_calls, label[16] = {0};
		double packed, one, best;

		memset(rows, 0, sizeof(rows));
		for (i = 0; i < n; i++) {
			rows[i].start = 0;
			rows[i].end = trial % 3 == 0 ? 1 + rnd(2048)
						     : menu[rnd(sizeof(menu) / sizeof(menu[0]))];
		}
		packed = checked_pack_price(f->s, rows, n, &n_calls);
		one = partition_price(rows, n, label, 1);
		best = brute_force_best(rows, n);
		cr_assert_leq(packed, one * (1.0 + 1e-12), "trial %u: packed %.3f > one call %.3f",
			      trial, packed, one);
		/* the partition gives up savings under AUTO_PACK_GAIN (1e-6) */
		cr_assert_leq(packed, best * (1.0 + 1e-5),
			      "trial %u: packed %.3f, the best partition %.3f", trial, packed, best);
		multi += n_calls > 1;
		single_calls += n_calls == 1;
	}
	cr_assert_gt(multi, 50, "the trials split some row sets");
	cr_assert_gt(single_calls, 20, "and kept others whole");
	fh_destroy(f);
}

Test(pack, rows_with_cached_context_and_many_lengths_never_cost_more_than_one_call)
{
	fake_host *f = pack_host(0, 0, BKV_POLICY_CONTINUOUS);
	uint32_t trial, multi = 0;

	for (trial = 0; trial < 100; trial++) {
		bkv__row rows[32];
		uint32_t n = 2 + rnd(31), i, n_calls, label[32] = {0};
		double packed, one;

		memset(rows, 0, sizeof(rows));
		for (i = 0; i < n; i++) {
			rows[i].start = rnd(4) == 0 ? 16 * rnd(64) : 0;
			rows[i].end = rows[i].start + 1 + rnd(2048);
		}
		packed = checked_pack_price(f->s, rows, n, &n_calls);
		one = partition_price(rows, n, label, 1);
		cr_assert_leq(packed, one * (1.0 + 1e-12), "trial %u: packed %.3f > one call %.3f",
			      trial, packed, one);
		multi += n_calls > 1;
	}
	cr_assert_gt(multi, 50);
	fh_destroy(f);
}
