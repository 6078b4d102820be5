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
 * The host is the shared fake host (tests/support/fakehost_sched.h): it
 * keeps a KV cell per device slot and checks every context position of every
 * row before writing the new ones, so a hit on a block whose KV is not
 * written yet, or on other content, fails. bkv_sched_check runs after every
 * step (invariant 32: a running lane's full blocks are in the prefix cache).
 */
#include "fakehost_sched.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define PC_MAX_REQ 64

/* A pool of `blocks` blocks of bt tokens (256 sequences), a scheduler with
 * the given chunking, budget and max_running and no cost model, and a clock
 * that moves 1 ms per host call. */
static fake_host *pc_create(uint32_t bt, uint32_t blocks, int chunked, uint32_t budget,
			    uint32_t max_running)
{
	fh_opts o;
	fake_host *h;

	fh_opts_init(&o);
	o.block_tokens = bt;
	o.device_blocks = blocks;
	o.max_seqs = 256;
	o.no_fake_cost = 1;
	o.cfg.chunked_prefill = chunked;
	o.cfg.token_budget = budget;
	o.cfg.max_running = max_running;
	h = fh_create(&o);
	h->host.tick = 1000;
	return h;
}

static uint64_t pc_submit(fake_host *h, const int32_t *prompt, uint32_t len, uint32_t max_new)
{
	bkv_request q;
	uint64_t id;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = len;
	q.max_new_tokens = max_new;
	q.user = fh_next_req(h, &q);
	cr_assert_eq(bkv_submit(h->s, &q, &id), BKV_OK);
	cr_assert(id <= PC_MAX_REQ);
	return id;
}

/* One step; returns its hit tokens. */
static uint32_t pc_step(fake_host *h)
{
	bkv_step_info si;

	cr_assert_eq(bkv_step(h->s, &si), BKV_OK);
	cr_assert_eq(bkv_sched_check(h->s), 0, "check %d", bkv_sched_check(h->s));
	cr_assert_eq(h->host.violations, 0, "a row read KV that was not its own (%s)", h->host.first);
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
	fake_host *h = pc_create(k->bt, 4096 * 16 / k->bt, k->chunked, k->budget, 64);
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
	cr_assert_eq(h->finish_count[1], 1);
	cr_assert_eq(h->finish_count[2], 1);
	fh_destroy(h);
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
		fake_host *h = pc_create(bt, 8192 / bt * 16, 1, 256, 16);
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
			cr_assert_eq(h->finish_count[i], 1);
		fh_destroy(h);
	}
}

/* A request's own chunk ends inside a block; another request computes that
 * block meanwhile: the first one's next chunk takes the cached block (its
 * private partial one is freed) and goes on hitting. */
Test(prefix_chunked, a_chunk_ending_inside_a_block_takes_the_cached_block_later)
{
	static int32_t prompt[640];
	fake_host *h = pc_create(16, 1024, 1, 200, 8);
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
	fh_destroy(h);
}
