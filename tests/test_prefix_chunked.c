/*
 * test_prefix_chunked.c - prefix hits under chunked prefill (issue 23).
 *
 * Every full block a step computes is indexed at that step's commit, whatever
 * chunk computed it, so a request that shares a prefix with a running one
 * hits it: the hits are taken ahead of each chunk (the token budget bounds
 * computed tokens, not hits), a lane whose chunk ended inside a block takes
 * the cached block once another request has computed it, and a duplicate
 * block is swapped for the cached copy at commit.
 *
 * The host here keeps one KV cell per device slot (enc(token, position)) and
 * checks every context position of every row before writing the new ones, so
 * a hit on a block whose KV is not written yet, or on other content, fails.
 * bkv_sched_check runs after every step (invariant 32: a running lane's full
 * blocks are in the prefix cache).
 */
#include "internal.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define PC_MAX_REQ 64
#define PC_TOKEN 5 /* every sampled token */

typedef struct pc_host {
	bkv_sched *s;
	bkv_pool *pool;
	uint32_t bt;
	uint64_t *kv;                 /* [device_blocks * bt] */
	const int32_t *prompt[PC_MAX_REQ + 1];
	uint32_t prompt_len[PC_MAX_REQ + 1];
	uint32_t finished[PC_MAX_REQ + 1];
	uint32_t errors;
	uint64_t now;
} pc_host;

static uint64_t pc_enc(int32_t t, uint32_t pos)
{
	return ((uint64_t)(uint32_t)t << 32) | (pos + 1);
}

static int32_t pc_tok(const pc_host *h, uint64_t id, uint32_t pos)
{
	return pos < h->prompt_len[id] ? h->prompt[id][pos] : PC_TOKEN;
}

static int pc_forward(void *hp, const bkv_batch *b, int32_t *next)
{
	pc_host *h = hp;
	uint32_t r, q, i, bt = b->block_tokens;

	for (r = 0; r < b->n_rows; r++) {
		uint64_t id = b->row_req[r];
		const int32_t *tab = b->kv_indices + b->kv_indptr[r];
		uint32_t t0 = (uint32_t)b->qo_indptr[r], t1 = (uint32_t)b->qo_indptr[r + 1];
		uint32_t start = (uint32_t)b->positions[t0];

		for (q = 0; q < start; q++)
			if (h->kv[(size_t)tab[q / bt] * bt + q % bt] != pc_enc(pc_tok(h, id, q), q)) {
				h->errors++;
				break;
			}
		for (i = t0; i < t1; i++)
			h->kv[b->slot_mapping[i]] = pc_enc(b->token_ids[i], (uint32_t)b->positions[i]);
		if (b->row_sample[r])
			next[r] = PC_TOKEN;
	}
	h->now += 1000;
	return 0;
}

static void pc_finish(void *hp, uint64_t id, bkv_finish_reason why, void *user)
{
	pc_host *h = hp;

	if (id <= PC_MAX_REQ)
		h->finished[id]++;
}

static uint64_t pc_now(void *hp)
{
	return ((pc_host *)hp)->now;
}

static pc_host *pc_create(uint32_t bt, uint32_t blocks, int chunked, uint32_t budget,
			  uint32_t max_running)
{
	pc_host *h = calloc(1, sizeof(*h));
	bkv_pool_config pc;
	bkv_sched_config c;
	bkv_host_ops o;

	cr_assert(h);
	h->bt = bt;
	h->kv = calloc((size_t)blocks * bt, sizeof(uint64_t));
	bkv_pool_config_init(&pc);
	pc.block_tokens = bt;
	pc.device_blocks = blocks;
	pc.max_seqs = 256;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &h->pool), BKV_OK);
	bkv_sched_config_init(&c);
	c.chunked_prefill = chunked;
	c.token_budget = budget;
	c.max_running = max_running;
	memset(&o, 0, sizeof(o));
	o.forward = pc_forward;
	o.on_finish = pc_finish;
	o.now_us = pc_now;
	cr_assert_eq(bkv_sched_create(&c, h->pool, &o, h, NULL, &h->s), BKV_OK);
	return h;
}

static void pc_destroy(pc_host *h)
{
	bkv_sched_destroy(h->s);
	bkv_pool_destroy(h->pool);
	free(h->kv);
	free(h);
}

static uint64_t pc_submit(pc_host *h, const int32_t *prompt, uint32_t len, uint32_t max_new)
{
	bkv_request q;
	uint64_t id;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = len;
	q.max_new_tokens = max_new;
	cr_assert_eq(bkv_submit(h->s, &q, &id), BKV_OK);
	cr_assert(id <= PC_MAX_REQ);
	h->prompt[id] = prompt;
	h->prompt_len[id] = len;
	return id;
}

/* One step; returns its hit tokens. */
static uint32_t pc_step(pc_host *h)
{
	bkv_step_info si;

	cr_assert_eq(bkv_step(h->s, &si), BKV_OK);
	cr_assert_eq(bkv_sched_check(h->s), 0, "check %d", bkv_sched_check(h->s));
	cr_assert_eq(h->errors, 0, "a row read KV that was not its own");
	return si.hit_tokens;
}

/* The table: A has a 2,048-token prompt and 4 new tokens; B is A's
 * prompt plus 16 tokens, submitted after `w` steps (w = 0: after A ended). */
typedef struct pc_case {
	int chunked;
	uint32_t budget, bt, w;
	uint32_t min_hits; /* B's hit tokens at least */
} pc_case;

static uint32_t run_case(const pc_case *k)
{
	static int32_t prompt[2064];
	pc_host *h = pc_create(k->bt, 4096 * 16 / k->bt, k->chunked, k->budget, 64);
	uint32_t i, hits = 0, steps = 0;
	int b_in = 0;

	for (i = 0; i < 2064; i++)
		prompt[i] = 100 + (int32_t)(i * 7919 % 30011);
	pc_submit(h, prompt, 2048, 4);
	while (bkv_sched_pending(h->s) || !b_in) {
		uint32_t got;

		cr_assert(steps++ < 1000);
		if (!b_in && ((k->w && steps == k->w + 1) || (!k->w && !bkv_sched_pending(h->s)))) {
			pc_submit(h, prompt, 2064, 4);
			b_in = 1;
		}
		got = pc_step(h);
		if (b_in)
			hits += got;
	}
	cr_assert_eq(h->finished[1], 1);
	cr_assert_eq(h->finished[2], 1);
	pc_destroy(h);
	return hits;
}

Test(prefix_chunked, a_request_sharing_a_running_prompt_hits_every_computed_block)
{
	/* A's prefill takes 2048 / budget steps; B after steps 1 (A mid-prefill
	 * or, continuous, decoding), after A's prefill (A decoding) and after
	 * A ended. Before the fix the chunked rows gave 496 while A ran. */
	static const pc_case cases[] = {
		{0, 0, 16, 1, 2048},   {1, 512, 16, 1, 2048}, {1, 512, 16, 5, 2048},
		{1, 512, 16, 6, 2048}, {1, 512, 16, 0, 2048}, {1, 8192, 16, 1, 2048},
		{1, 768, 16, 1, 1792}, {1, 768, 16, 3, 2048}, {1, 100, 16, 25, 2048},
		{1, 512, 32, 5, 2048}, {1, 512, 4, 5, 2048},  {1, 512, 1, 5, 2048},
		{1, 1000, 16, 1, 2000}, {1, 64, 8, 40, 2048},  {0, 0, 1, 2, 2048},
	};
	uint32_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint32_t hits = run_case(&cases[i]);

		cr_expect(hits >= cases[i].min_hits,
			  "chunked %d budget %u block %u B after step %u: %u hit tokens, want >= %u",
			  cases[i].chunked, cases[i].budget, cases[i].bt, cases[i].w, hits,
			  cases[i].min_hits);
		cr_expect(hits <= 2048, "more hits than A computed: %u", hits);
	}
}

/* Sixteen requests, one 1,024-token system prompt and their own 48-token
 * questions, all submitted at once under a 256-token budget: the system
 * prompt is computed once; every later request hits all of it. */
Test(prefix_chunked, concurrent_sharers_of_one_system_prompt_compute_it_once)
{
	static int32_t prompt[16][1072];
	bkv_sched_stats st = {.size = sizeof(st)};
	uint32_t bt, i, j;

	for (bt = 8; bt <= 32; bt *= 2) {
		pc_host *h = pc_create(bt, 8192 / bt * 16, 1, 256, 16);
		uint32_t steps = 0;

		for (i = 0; i < 16; i++) {
			for (j = 0; j < 1072; j++)
				prompt[i][j] = j < 1024 ? 100 + (int32_t)j : 5000 + (int32_t)(i * 64 + j);
			pc_submit(h, prompt[i], 1072, 8);
		}
		while (bkv_sched_pending(h->s)) {
			cr_assert(steps++ < 2000);
			pc_step(h);
		}
		bkv_sched_stats_get(h->s, &st);
		/* 16 x 1,072 prompt tokens; the shared 1,024 computed once (a
		 * request admitted while the first still computes the prompt
		 * computes at most what that step computes alongside) */
		cr_expect(st.hit_tokens >= 15 * 1024 - 256, "block %u: %llu hit tokens", bt,
			  (unsigned long long)st.hit_tokens);
		cr_expect_eq(st.prefill_tokens + st.hit_tokens, 16 * 1072);
		for (i = 1; i <= 16; i++)
			cr_assert_eq(h->finished[i], 1);
		pc_destroy(h);
	}
}

/* A request's own chunk ends inside a block; another request computes that
 * block meanwhile: the first one's next chunk takes the cached block (its
 * private partial one is freed) and goes on hitting. */
Test(prefix_chunked, a_chunk_ending_inside_a_block_takes_the_cached_block_later)
{
	static int32_t prompt[640];
	pc_host *h = pc_create(16, 1024, 1, 200, 8);
	uint32_t i, hits = 0, steps = 0;

	for (i = 0; i < 640; i++)
		prompt[i] = 300 + (int32_t)i;
	pc_submit(h, prompt, 640, 2); /* A: chunks of 200 */
	pc_step(h);
	pc_submit(h, prompt, 640, 2); /* B: behind A by one step */
	while (bkv_sched_pending(h->s)) {
		cr_assert(steps++ < 100);
		hits += pc_step(h);
	}
	/* A computes 0..640 in chunks of 200; B starts at A's committed 192
	 * (12 blocks) and then keeps taking what A committed the step before */
	cr_expect(hits >= 576, "%u hit tokens", hits);
	pc_destroy(h);
}
