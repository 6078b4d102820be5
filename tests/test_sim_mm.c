/*
 * test_sim_mm.c - bkv-sim's multimodal workload (--mm-images, mm.c):
 * requests carrying 1..3 images of thirty (Zipf-like) all finish, the
 * virtual host never sees a row read an image it does not hold nor an encode
 * naming another input, no step encodes more than encoder_budget and the
 * host's encoder cache never holds more than encoder_cache (split and mixed
 * hosts, chunked prefill, preemption, the overlapped contract, static
 * batching, with bkv_sched_check after every step); repeated images are
 * encoded fewer times than they are submitted, a larger cache hits more, and
 * the encoder's time shows in the prefill time.
 */
#include "../examples/sim/sim.h"
#include "support/sim_check.h"

#include <criterion/criterion.h>
#include <string.h>

#define N_REQ 400u
#define TOKENS 64u /* per image */

static void make_trace(trace *t, uint64_t seed)
{
	const trace_dist prompt = {DIST_UNIFORM, 200, 800}, output = {DIST_UNIFORM, 8, 128};
	memset(t, 0, sizeof(*t));
	cr_assert_eq(trace_synthetic(t, N_REQ, ARRIVAL_POISSON, 20.0, &prompt, &output, seed),
		     TRACE_OK);
}

static sim_config mm_config(uint32_t cache, uint32_t budget)
{
	sim_config c;
	sim_config_init(&c);
	c.mm_images = 30;
	c.mm_per_request = 3;
	c.mm_tokens = TOKENS;
	c.encoder_cache = cache;
	c.encoder_budget = budget;
	c.check = 1;
	return c;
}

/* Run c over t: every request finishes, the encoder contract holds. */
static void run_mm(const sim_config *c, const trace *t, sim_result *r, const char *what)
{
	sim_check_run(c, t, r, what);
	cr_assert_eq(r->mm_cache, sim_mm_cache(c), "%s", what);
	cr_assert_eq(r->mm_bad, 0, "%s: %llu encoder contract breaks", what,
		     (unsigned long long)r->mm_bad);
	cr_assert_gt(r->mm_inputs, N_REQ, "%s: requests carry images", what);
	cr_assert_gt(r->mm_encodes, 0, "%s", what);
	cr_assert_lt(r->mm_encodes, r->mm_inputs, "%s: repeated images hit", what);
	cr_assert_leq(r->mm_held_max, r->mm_cache, "%s", what);
	if (c->encoder_budget)
		cr_assert_leq(r->mm_step_cost_max, c->encoder_budget, "%s", what);
	if (c->mm_encode_us > 0.0)
		cr_assert_gt(r->mm_encode_us, 0.0, "%s", what);
}

Test(sim_mm, every_request_finishes_within_budget_and_cache)
{
	trace t;
	sim_result r;
	make_trace(&t, 7);
	sim_config c = mm_config(4 * 3 * TOKENS, 3 * TOKENS);
	run_mm(&c, &t, &r, "split host, k=1");
	c.chunked = 1;
	c.mixed_host = 1;
	c.encoder_budget = TOKENS; /* one image a step */
	c.encoder_cache = 2 * TOKENS;
	run_mm(&c, &t, &r, "chunked, mixed host, one image a step, cache of two");
	c.kv_blocks = 96; /* preemption by recompute in a small pool */
	run_mm(&c, &t, &r, "chunked, small pool");
	cr_assert_gt(r.preemptions, 0, "the pool was meant to force preemption");
	c.kv_blocks = 0;
	c.overlap = 1;
	run_mm(&c, &t, &r, "overlapped");
	cr_assert_gt(r.overlap_steps, 0);
	c = mm_config(0, 0); /* the default cache, no budget */
	c.policy = BKV_POLICY_STATIC;
	run_mm(&c, &t, &r, "static");
	trace_free(&t);
}

Test(sim_mm, a_larger_cache_hits_more_and_encoding_costs_prefill_time)
{
	trace t;
	sim_result small, large, none;
	make_trace(&t, 11);
	sim_config c = mm_config(3 * TOKENS, 0);
	c.chunked = 1;
	c.mixed_host = 1;
	run_mm(&c, &t, &small, "cache of three images");
	c.encoder_cache = 30 * TOKENS; /* every image */
	run_mm(&c, &t, &large, "cache of every image");
	cr_assert_gt(large.mm_hit_rate, small.mm_hit_rate, "hit rate %.3f vs %.3f",
		     large.mm_hit_rate, small.mm_hit_rate);
	cr_assert_leq(large.mm_encodes, 30, "each image encoded once at most");
	c.mm_encode_us = 0.0;
	run_mm(&c, &t, &none, "free encoder");
	cr_assert_eq(none.mm_encode_us, 0.0);
	cr_assert_gt(large.prefill_us, none.prefill_us, "encoder time is prefill time");
	trace_free(&t);
}

/* The draws: within a request distinct, inside its prompt, in order; equal
 * ids of one length; the popular images drawn more. */
Test(sim_mm, draws_fit_prompts_and_follow_popularity)
{
	trace t;
	make_trace(&t, 3);
	sim_config c = mm_config(0, 0);
	sim_mm *m = NULL;
	cr_assert_eq(sim_mm_open(&c, &t, &m), 0);
	uint64_t ids[64] = {0};
	uint32_t uses[64] = {0}, n_ids = 0;
	for (uint32_t i = 0; i < t.n; i++) {
		uint32_t n;
		const bkv_encoder_input *in = sim_mm_inputs(m, i, &n);
		cr_assert(n >= 1 && n <= 3, "request %u: %u images", i, n);
		for (uint32_t k = 0; k < n; k++) {
			cr_assert_eq(in[k].token_len, TOKENS);
			cr_assert_leq(in[k].token_start + in[k].token_len, t.reqs[i].prompt_len);
			cr_assert(k == 0 || in[k].token_start >= in[k - 1].token_start + TOKENS);
			for (uint32_t j = 0; j < k; j++)
				cr_assert_neq(in[j].cache_id, in[k].cache_id);
			uint32_t x = 0;
			while (x < n_ids && ids[x] != in[k].cache_id)
				x++;
			cr_assert_lt(x, 64u);
			if (x == n_ids)
				ids[n_ids++] = in[k].cache_id;
			uses[x]++;
		}
	}
	cr_assert_leq(n_ids, 30u);
	uint32_t most = 0;
	for (uint32_t x = 0; x < n_ids; x++)
		most = uses[x] > most ? uses[x] : most;
	cr_assert_gt(most, 4 * (t.n * 2 / 30), "Zipf: the top image far above the mean");
	sim_mm_close(m);
	trace_free(&t);
}
