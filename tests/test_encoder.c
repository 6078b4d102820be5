/*
 * test_encoder.c - encoder inputs (bkv_request.inputs): a chunk runs only
 * once the inputs it reads are encoded, by its own call or an earlier one;
 * repeated images hit the encoder cache and the prefix cache keys KV by the
 * image; a step's encodings stay within encoder_budget; a full cache evicts
 * the least recently used input no one reads and tells the host; a failed
 * call's encodings run again; the refusals.
 */
#include <criterion/criterion.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fakehost_sched.h"

/* The host's encoder cache, as the hook keeps it. */
static uint64_t g_id[64];
static uint32_t g_len[64], g_n, g_bad, g_encodes, g_frees;
static uint32_t g_per_id[16];     /* encodes by cache id (< 16) */
static uint64_t g_last_free[8];   /* the last call's frees */
static uint32_t g_n_last_free;
static uint32_t g_cost, g_max_cost; /* the step's encoder work, and its most */
static const bkv_encoder_input *g_in[64]; /* by request id: its inputs */
static uint32_t g_n_in[64];

static int cached(uint64_t id)
{
	uint32_t i;

	for (i = 0; i < g_n; i++)
		if (g_id[i] == id)
			return 1;
	return 0;
}

/* Every call: drop the frees, run the encodes (each an input of its
 * request), then every row's span positions must read cached outputs. */
static void hook(fake_host *f, const bkv_batch *b)
{
	uint32_t i, j, r;

	(void)f;
	g_n_last_free = 0;
	for (i = 0; i < b->n_encoder_free; i++) {
		g_frees++;
		if (g_n_last_free < 8)
			g_last_free[g_n_last_free++] = b->encoder_free[i];
		for (j = 0; j < g_n; j++)
			if (g_id[j] == b->encoder_free[i]) {
				g_id[j] = g_id[--g_n];
				g_len[j] = g_len[g_n];
				break;
			}
	}
	for (i = 0; i < b->n_encode; i++) {
		const bkv_encode *w = &b->encode[i];
		const bkv_encoder_input *u = w->req < 64 && w->input < g_n_in[w->req]
						     ? &g_in[w->req][w->input]
						     : NULL;

		if (!u || u->cache_id != w->cache_id || u->token_len != w->len)
			g_bad++;
		g_encodes++;
		g_per_id[w->cache_id < 16 ? w->cache_id : 0]++;
		g_cost += u ? (u->cost ? u->cost : u->token_len) : 0;
		if (!cached(w->cache_id) && g_n < 64) {
			g_id[g_n] = w->cache_id;
			g_len[g_n++] = w->len;
		}
	}
	g_max_cost = g_cost > g_max_cost ? g_cost : g_max_cost;
	for (r = 0; r < b->n_rows; r++) {
		uint64_t id = b->row_req[r];
		uint32_t start = (uint32_t)b->positions[b->qo_indptr[r]];
		uint32_t end = start + (uint32_t)(b->qo_indptr[r + 1] - b->qo_indptr[r]);

		for (i = 0; id < 64 && i < g_n_in[id]; i++) {
			const bkv_encoder_input *u = &g_in[id][i];

			if (u->token_start < end && u->token_start + u->token_len > start &&
			    !cached(u->cache_id))
				g_bad++; /* read before it was encoded */
		}
	}
}

static void reset(void)
{
	g_n = g_bad = g_encodes = g_frees = g_n_last_free = g_cost = g_max_cost = 0;
	memset(g_per_id, 0, sizeof(g_per_id));
	memset(g_n_in, 0, sizeof(g_n_in));
}

static fake_host *make(uint32_t cache, uint32_t budget, int chunked, uint32_t token_budget)
{
	fh_opts o;
	fake_host *f;

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.cfg.encoder_cache = cache;
	o.cfg.encoder_budget = budget;
	o.cfg.chunked_prefill = chunked;
	o.cfg.token_budget = token_budget;
	f = fh_create(&o);
	f->batch_hook = hook;
	reset();
	return f;
}

/* A prompt of len tokens (seed) holding the inputs' ids at their spans, as
 * the library will: the host's record then checks every token it reads. */
static int32_t *mm_prompt(uint32_t len, uint64_t seed, const bkv_encoder_input *in, uint32_t n)
{
	int32_t *p = fh_prompt(len, seed);
	uint32_t i, j;

	for (i = 0; i < n; i++)
		for (j = 0; j < in[i].token_len; j++)
			p[in[i].token_start + j] = bkv_encoder_token(in[i].cache_id, j);
	return p;
}

static uint64_t submit_mm(fake_host *f, const int32_t *prompt, uint32_t len, uint32_t max_new,
			  const bkv_encoder_input *in, uint32_t n)
{
	bkv_request q;
	uint64_t id;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = len;
	q.max_new_tokens = max_new;
	q.inputs = in;
	q.n_inputs = n;
	id = fh_submit_req(f, &q);
	cr_assert_lt(id, 64);
	g_in[id] = in;
	g_n_in[id] = n;
	return id;
}

static void finish(fake_host *f, uint32_t n)
{
	bkv_sched_stats st = {.size = sizeof(st)};

	fh_run(f, 2000);
	cr_assert_eq(g_bad, 0, "a row read an input that was not encoded, or a bad encode");
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	bkv_sched_stats_get(f->s, &st);
	cr_assert_eq(st.finished, n);
}

/* Chunks of 8 tokens: the chunk that reaches the image's span waits for
 * nothing (its call encodes it), and the image is encoded once. */
Test(encoder, a_chunk_reads_an_input_only_once_a_call_has_encoded_it)
{
	static const bkv_encoder_input in[2] = {{7, 10, 16, 0, 0}, {8, 30, 4, 0, 0}};
	fake_host *f = make(64, 0, 1, 8);
	int32_t *p = mm_prompt(40, 1, in, 2);

	submit_mm(f, p, 40, 4, in, 2);
	finish(f, 1);
	cr_assert_eq(g_encodes, 2, "each image once (%u)", g_encodes);
	fh_destroy(f);
	free(p);
}

/* One image under different texts: encoded once. The same text before
 * another image at the same place: the prefix cache hits up to the image,
 * never past it. */
Test(encoder, repeated_images_hit_and_the_prefix_cache_keys_kv_by_image)
{
	static const bkv_encoder_input a[1] = {{3, 8, 8, 0, 0}}, b[1] = {{4, 8, 8, 0, 0}};
	bkv_sched_stats st = {.size = sizeof(st)};
	fake_host *f = make(64, 0, 1, 64);
	int32_t *p[4];
	uint64_t hits;
	uint32_t i;

	for (i = 0; i < 3; i++) {
		p[i] = mm_prompt(24, 10 + i, a, 1);
		submit_mm(f, p[i], 24, 2, a, 1);
		fh_run(f, 200);
	}
	cr_assert_eq(g_per_id[3], 1, "image 3 encoded once for three requests");
	bkv_sched_stats_get(f->s, &st);
	hits = st.hit_tokens;
	cr_assert_eq(st.encoder_lookups, 3);
	cr_assert_eq(st.encoder_hits, 2, "the second and third request hit");
	cr_assert_eq(st.encoder_runs, 1);
	p[3] = mm_prompt(24, 12, b, 1); /* request 3's text, another image */
	submit_mm(f, p[3], 24, 2, b, 1);
	fh_run(f, 200);
	bkv_sched_stats_get(f->s, &st);
	cr_assert_eq(st.hit_tokens - hits, 8, "the text before the image hits (2 blocks), "
		     "its span does not (%llu)", (unsigned long long)(st.hit_tokens - hits));
	cr_assert_eq(g_per_id[4], 1);
	finish(f, 4);
	fh_destroy(f);
	for (i = 0; i < 4; i++)
		free(p[i]);
}

/* Eight requests with two images of cost 6 each, a budget of 10 a step:
 * no step encodes more than one, and all run. */
Test(encoder, a_step_encodes_within_its_budget)
{
	static bkv_encoder_input in[8][2];
	fake_host *f = make(256, 10, 1, 64);
	int32_t *p[8];
	uint32_t i, steps = 0;

	for (i = 0; i < 8; i++) {
		in[i][0] = (bkv_encoder_input){20 + 2 * i, 2, 5, 6, 0};
		in[i][1] = (bkv_encoder_input){21 + 2 * i, 12, 5, 6, 0};
		p[i] = mm_prompt(20, 30 + i, in[i], 2);
		submit_mm(f, p[i], 20, 3, in[i], 2);
	}
	while (bkv_sched_pending(f->s) && steps++ < 500) {
		g_cost = 0;
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
		cr_assert_leq(g_cost, 10, "a step encoded cost %u", g_cost);
		cr_assert_eq(bkv_sched_check(f->s), 0);
	}
	cr_assert_eq(g_max_cost, 6, "one image a step");
	cr_assert_eq(g_encodes, 16);
	finish(f, 8);
	fh_destroy(f);
	for (i = 0; i < 8; i++)
		free(p[i]);
}

/* A cache of 20 tokens, images of 8: after A and B, C evicts A (the least
 * recent) and the call says so; A again evicts B and is encoded again. */
Test(encoder, a_full_cache_evicts_the_least_recent_unused_input_and_says_so)
{
	static const bkv_encoder_input im[4][1] = {
		{{1, 4, 8, 0, 0}}, {{2, 4, 8, 0, 0}}, {{5, 4, 8, 0, 0}}, {{1, 4, 8, 0, 0}}};
	fake_host *f = make(20, 0, 1, 64);
	int32_t *p[4];
	uint32_t i;

	for (i = 0; i < 4; i++) {
		p[i] = mm_prompt(16, 50 + i, im[i], 1);
		submit_mm(f, p[i], 16, 2, im[i], 1);
		fh_run(f, 200);
		if (i == 2)
			cr_assert(g_n_last_free == 0 || g_last_free[0] == 1, "A went first");
	}
	cr_assert_eq(g_per_id[1], 2, "A was evicted and encoded again");
	cr_assert_eq(g_per_id[2], 1);
	cr_assert_eq(g_frees, 2, "A's and then B's eviction were said");
	{
		bkv_sched_stats st = {.size = sizeof(st)};

		bkv_sched_stats_get(f->s, &st);
		cr_assert_eq(st.encoder_evictions, 2);
		cr_assert_eq(st.encoder_runs, g_encodes);
	}
	cr_assert(!cached(2) && cached(1) && cached(5));
	finish(f, 4);
	fh_destroy(f);
	for (i = 0; i < 4; i++)
		free(p[i]);
}

/* The call carrying the encode fails: the next one encodes it again. */
Test(encoder, a_failed_call_encodes_its_inputs_again)
{
	static const bkv_encoder_input in[1] = {{9, 0, 6, 0, 0}};
	fake_host *f = make(64, 0, 1, 64);
	int32_t *p = mm_prompt(12, 77, in, 1);

	f->host.fail_at = 1;
	submit_mm(f, p, 12, 3, in, 1);
	finish(f, 1);
	cr_assert_eq(f->host.failed_calls, 1);
	cr_assert_eq(g_per_id[9], 2, "encoded in the failed call and again");
	fh_destroy(f);
	free(p);
}

Test(encoder, bad_inputs_are_refused_and_change_nothing)
{
	static const int32_t prompt[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
	static const struct {
		bkv_encoder_input in[2];
		uint32_t n;
		int rc;
	} bad[] = {
		{{{0, 2, 4, 0, 0}}, 1, BKV_EINVAL},                   /* cache id 0 */
		{{{1, 2, 0, 0, 0}}, 1, BKV_EINVAL},                   /* no tokens */
		{{{1, 14, 4, 0, 0}}, 1, BKV_EINVAL},                  /* past the prompt */
		{{{1, 2, 4, 0, 0}, {2, 4, 4, 0, 0}}, 2, BKV_EINVAL},  /* overlapping */
		{{{1, 2, 4, 0, 1}}, 1, BKV_EINVAL},                   /* pad */
		{{{1, 0, 12, 0, 0}}, 1, BKV_E2BIG},                   /* > encoder_cache */
		{{{1, 0, 4, 9, 0}}, 1, BKV_E2BIG},                    /* > encoder_budget */
	};
	bkv_sched_stats st = {.size = sizeof(st)};
	fake_host *f = make(10, 8, 1, 64), *g = make(0, 0, 1, 64), *h = make(10, 0, 0, 64);
	static const bkv_encoder_input two[2] = {{1, 0, 6, 0, 0}, {2, 8, 6, 0, 0}};
	bkv_request q;
	uint64_t id;
	uint32_t i;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = 16;
	q.max_new_tokens = 2;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		q.inputs = bad[i].in;
		q.n_inputs = bad[i].n;
		cr_assert_eq(bkv_submit(f->s, &q, &id), bad[i].rc, "case %u: %s", i, bkv_last_error());
	}
	q.inputs = two;
	q.n_inputs = 2;
	cr_assert_eq(bkv_submit(g->s, &q, &id), BKV_EINVAL, "no encoder_cache");
	cr_assert_eq(bkv_submit(h->s, &q, &id), BKV_E2BIG, "whole prompts: 12 tokens of inputs, "
		     "cache 10");
	q.n_inputs = BKV_MAX_ENCODER_INPUTS + 1;
	cr_assert_eq(bkv_submit(f->s, &q, &id), BKV_EINVAL);
	q.inputs = NULL;
	q.n_inputs = 1;
	cr_assert_eq(bkv_submit(f->s, &q, &id), BKV_EINVAL);
	bkv_sched_stats_get(f->s, &st);
	cr_assert_eq(st.submitted, 0, "refusals change nothing");
	cr_assert_lt(bkv_encoder_token(1, 0), -(1 << 22) - 2);
	cr_assert(!BKV_TOKEN_IS_PENDING(bkv_encoder_token(5, 3)));
	cr_assert_neq(bkv_encoder_token(1, 0), bkv_encoder_token(2, 0));
	cr_assert_neq(bkv_encoder_token(1, 0), bkv_encoder_token(1, 1));
	fh_destroy(f);
	fh_destroy(g);
	fh_destroy(h);
}
