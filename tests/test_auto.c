/*
 * test_auto.c - the cost model decides (lib/decide/): the default model, the
 * swap-or-recompute choice, output-length hints, and one reduced run of each
 * benchmark target of docs/benchmarks.md ("Cost-model decisions") through
 * bkv-sim's virtual host, so a regression fails CI. Fewer seeds than the
 * benchmark; the thresholds are the issue's.
 */
#include "../examples/sim/sim.h"
#include "internal.h"

#include <criterion/criterion.h>

#include <math.h>
#include <string.h>
#include <unistd.h>

#define TRACES BKV_TRACES_DIR /* ../shared/data/traces/, from tests/meson.build */

static sim_config base_config(void)
{
	sim_config c;
	sim_config_init(&c);
	c.gen = SIM_GEN_STEPS;
	return c;
}

/* Seed 000's workload, seeds 0..n-1. */
static void seed000_traces(trace *t, int n)
{
	for (int i = 0; i < n; i++) {
		memset(&t[i], 0, sizeof(t[i]));
		cr_assert_eq(trace_seed000(&t[i], (uint64_t)i), TRACE_OK);
	}
}

/* Chunked prefill on a mixed host with admission and budget auto. */
static sim_config chunked_auto_config(void)
{
	sim_config c = base_config();
	c.k = 0;
	c.chunked = 1;
	c.mixed_host = 1;
	c.budget = 0;
	return c;
}

/* Run c over every trace; row gets medians and speed-ups against base. */
static void run_row(const sim_config *c, trace *t, int n, const sim_result *base,
		    sim_result *runs, sim_row *row)
{
	for (int i = 0; i < n; i++) {
		char err[256] = "";
		memset(&runs[i], 0, sizeof(runs[i]));
		cr_assert_eq(sim_run(c, &t[i], &runs[i], err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(runs[i].errors, 0);
	}
	sim_rows_from_runs(row, runs, base ? base : runs, n);
}

/* Static baseline, fixed k in ks (the best by median speed-up, then lower
 * p99 TTFT), and auto. Returns auto's row and the best fixed k's. */
static void compare(sim_config c, trace *t, int n, const uint32_t *ks, int nk, sim_row *best,
		    sim_row *aut, uint32_t *best_k)
{
	sim_result *base = calloc((size_t)n, sizeof(*base));
	sim_result *runs = calloc((size_t)n, sizeof(*runs));
	sim_row row;
	cr_assert(base && runs);
	sim_config s = c;
	s.policy = BKV_POLICY_STATIC;
	s.mixed_host = 0;
	run_row(&s, t, n, NULL, base, &row);
	memset(best, 0, sizeof(*best));
	for (int i = 0; i < nk; i++) {
		c.k = ks[i];
		run_row(&c, t, n, base, runs, &row);
		if (i == 0 || row.speedup > best->speedup * 1.0005 ||
		    (fabs(row.speedup - best->speedup) <= best->speedup * 0.0005 &&
		     row.med.ttft_p99 < best->med.ttft_p99)) {
			*best = row;
			*best_k = ks[i];
		}
	}
	c.k = 0;
	run_row(&c, t, n, base, runs, aut);
	free(base);
	free(runs);
}

static void synth(trace *t, int n_seeds, uint32_t n, trace_arrival arr, double rate,
		  trace_dist p, trace_dist o)
{
	for (int i = 0; i < n_seeds; i++) {
		memset(&t[i], 0, sizeof(t[i]));
		cr_assert_eq(trace_synthetic(&t[i], n, arr, rate, &p, &o, (uint64_t)i), TRACE_OK);
	}
}

static void free_traces(trace *t, int n)
{
	for (int i = 0; i < n; i++)
		trace_free(&t[i]);
}

/* ---- the default model and the small decisions ---------------------------- */

static int fake_call(void *host, const bkv_batch *b, int32_t *next)
{
	(void)host;
	for (uint32_t r = 0; r < b->n_rows; r++)
		next[r] = 7;
	return 0;
}

static uint64_t first_token_req;
static void note_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	(void)host, (void)branch, (void)token, (void)user;
	if (!first_token_req)
		first_token_req = req;
}

static bkv_sched *make_sched(bkv_pool **pool, bkv_sched_config *sc, uint32_t host_blocks)
{
	bkv_pool_config pc;
	bkv_pool_config_init(&pc);
	pc.device_blocks = 256;
	pc.host_blocks = host_blocks;
	cr_assert_eq(bkv_pool_create(&pc, NULL, pool), BKV_OK);
	bkv_host_ops ops;
	memset(&ops, 0, sizeof(ops));
	ops.prefill = fake_call;
	ops.decode = fake_call;
	ops.on_token = note_token;
	bkv_sched *s = NULL;
	cr_assert_eq(bkv_sched_create(sc, *pool, &ops, NULL, NULL, &s), BKV_OK);
	return s;
}

Test(auto, null_cost_callbacks_get_the_calibrated_seed000_default)
{
	bkv_pool *pool;
	bkv_sched_config sc;
	bkv_sched_config_init(&sc);
	bkv_sched *s = make_sched(&pool, &sc, 0);
	cr_assert_not_null(s->cfg.cost.step_us, "a default model is installed");
	cr_assert_not_null(s->cfg.cost.observe, "and it learns");
	int32_t prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
	bkv_request r;
	bkv_request_init(&r);
	r.prompt = prompt;
	r.prompt_len = 10;
	r.max_new_tokens = 3;
	cr_assert_eq(bkv_submit(s, &r, NULL), BKV_OK);
	bkv_step_info info;
	cr_assert_eq(bkv_step(s, &info), BKV_OK);
	/* before 16 observations the calibrated model predicts its base:
	 * seed 000's prefill of one 10-token row (1728.93 us) plus d(1) */
	cr_expect_float_eq(info.predicted_us, 1728.931296875 + 1088.1, 1e-6);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

Test(auto, a_host_model_is_used_as_given)
{
	bkv_pool *pool;
	bkv_sched_config sc;
	bkv_cost_poly poly;
	bkv_cost_poly_init(&poly);
	bkv_sched_config_init(&sc);
	sc.cost = bkv_cost_poly_model(&poly);
	bkv_sched *s = make_sched(&pool, &sc, 0);
	cr_expect_eq(s->cfg.cost.ctx, (void *)&poly);
	cr_expect_null(s->cfg.cost.observe);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

/* Seed 000's prefill of 1,024 tokens costs about 2.3 s at rows_ref 32 /
 * 32 ... swap moves 2 x 1,024 x bytes over a 25 GB/s link: 1 KB per token is
 * 82 us (swap), 100 MB per token is 8.2 s (recompute). */
Test(auto, preempt_auto_swaps_only_when_moving_kv_is_cheaper_than_recompute)
{
	bkv_pool *pool;
	bkv_sched_config sc;
	bkv_sched_config_init(&sc);
	sc.kv_bytes_per_token = 1024;
	bkv_sched *s = make_sched(&pool, &sc, 64);
	cr_expect_eq(bkv__auto_want_swap(s, 1024), 1);
	s->cfg.kv_bytes_per_token = 100000000;
	cr_expect_eq(bkv__auto_want_swap(s, 1024), 0);
	s->cfg.kv_bytes_per_token = 0;
	cr_expect_eq(bkv__auto_want_swap(s, 1024), -1, "unknown KV size: no opinion");
	s->cfg.kv_bytes_per_token = 1024;
	s->cfg.host_link_bytes_per_us = 0.001; /* a very slow link */
	cr_expect_eq(bkv__auto_want_swap(s, 1024), 0);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

Test(auto, output_length_hints_admit_the_longest_first)
{
	bkv_pool *pool;
	bkv_sched_config sc;
	bkv_sched_config_init(&sc);
	sc.max_running = 1;
	bkv_sched *s = make_sched(&pool, &sc, 0);
	int32_t prompt[4] = {1, 2, 3, 4};
	uint64_t id[3];
	const uint32_t hint[3] = {3, 9, 5};
	for (int i = 0; i < 3; i++) {
		bkv_request r;
		bkv_request_init(&r);
		r.prompt = prompt;
		r.prompt_len = 4;
		r.max_new_tokens = 2;
		r.predicted_output = hint[i];
		cr_assert_eq(bkv_submit(s, &r, &id[i]), BKV_OK);
	}
	first_token_req = 0;
	cr_assert_eq(bkv_step(s, NULL), BKV_OK);
	cr_expect_eq(first_token_req, id[1], "hint 9 runs first");
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

/* A host whose calls cost less than the clock can see (issue 13, "Also
 * seen"): a no-op split host and a fake clock that advances by 0 or 1 us at
 * each read, at random (the real monotonic clock around a no-op call, tick
 * crossings included). The default calibrated model then learns from calls
 * timed at 0 or 1 us; its fit of such noise once priced a small decode call
 * at 0 (a negative fit, clamped), which set the batch cap to 1 row, and a cap
 * was never recomputed while the running set was at it: steps carried about
 * one row from then on. Every pattern of ticks must keep the steps full. */
static uint64_t tick_clock_us, tick_rng, tick_tokens;
static uint32_t tick_one_in; /* the clock advances 1 us at 1 read in this many */

static uint64_t tick_now(void *host)
{
	(void)host;
	tick_rng = tick_rng * 6364136223846793005ull + 1442695040888963407ull;
	if ((uint32_t)(tick_rng >> 33) % tick_one_in == 0)
		tick_clock_us++;
	return tick_clock_us;
}

static void tick_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	(void)host, (void)req, (void)branch, (void)token, (void)user;
	tick_tokens++;
}

Test(auto, auto_admission_keeps_batching_on_a_near_zero_cost_host, .timeout = 120)
{
	static const uint32_t one_in[] = {1, 2, 3, 5, 1000000};
	int32_t prompt[64];
	for (int i = 0; i < 64; i++)
		prompt[i] = i + 1;
	for (size_t v = 0; v < sizeof(one_in) / sizeof(one_in[0]); v++) {
		for (uint64_t seed = 1; seed <= 4; seed++) {
			bkv_pool_config pc;
			bkv_pool_config_init(&pc);
			pc.device_blocks = 4096;
			bkv_pool *pool;
			cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
			bkv_sched_config sc;
			bkv_sched_config_init(&sc); /* continuous, admit_group 0, default model */
			sc.max_running = 16;
			bkv_host_ops ops;
			memset(&ops, 0, sizeof(ops));
			ops.prefill = fake_call;
			ops.decode = fake_call;
			ops.on_token = tick_token;
			ops.now_us = tick_now;
			tick_clock_us = 1000;
			tick_tokens = 0;
			tick_rng = seed;
			tick_one_in = one_in[v];
			bkv_sched *s = NULL;
			cr_assert_eq(bkv_sched_create(&sc, pool, &ops, NULL, NULL, &s), BKV_OK);
			uint64_t lcg = seed, want = 0;
			for (uint32_t i = 0; i < 2000; i++) {
				bkv_request r;
				bkv_request_init(&r);
				lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
				r.prompt = prompt;
				r.prompt_len = 8 + (uint32_t)((lcg >> 33) % 57);     /* 8..64 */
				r.max_new_tokens = 16 + (uint32_t)((lcg >> 45) % 33); /* 16..48 */
				r.cache_key = i + 1;
				want += r.max_new_tokens;
				cr_assert_eq(bkv_submit(s, &r, NULL), BKV_OK);
			}
			uint64_t steps = 0, tokens = 0;
			bkv_step_info si;
			while (bkv_sched_pending(s) && steps < 200000) {
				cr_assert_eq(bkv_step(s, &si), BKV_OK);
				steps++;
				tokens += si.decode_tokens;
			}
			cr_assert_eq(bkv_sched_pending(s), 0, "every request ends");
			cr_expect_eq(tick_tokens, want, "nothing lost");
			/* a full running set decodes 16 rows a step; a few steps
			 * are lost to admission groups and the drain at the end */
			cr_expect_geq((double)tokens / (double)steps, 12.0,
				      "clock ticking at 1 read in %u, seed %llu: %.2f decode rows "
				      "per step over %llu steps",
				      one_in[v], (unsigned long long)seed,
				      (double)tokens / (double)steps, (unsigned long long)steps);
			bkv_sched_destroy(s);
			bkv_pool_destroy(pool);
		}
	}
}

/* ---- targets (reduced) ---------------------------------------------------- */

/* Known output lengths, longest first: seed 000 with chunked prefill and the
 * auto budget reaches about 1.73x seed 000's (FCFS) static. */
Test(auto, seed000_hints_with_chunked_auto_reach_1_70x_fcfs_static, .timeout = 120)
{
	enum { N = 9 };
	trace t[N];
	seed000_traces(t, N);
	sim_config c = base_config();
	sim_result *base = calloc(N, sizeof(*base)), *runs = calloc(N, sizeof(*runs));
	sim_row row;
	c.policy = BKV_POLICY_STATIC;
	run_row(&c, t, N, NULL, base, &row);
	c = chunked_auto_config();
	c.hints = 1;
	run_row(&c, t, N, base, runs, &row);
	cr_expect_geq(row.speedup, 1.70, "chunked auto with hints %.4f", row.speedup);
	c.hints = 0;
	run_row(&c, t, N, base, runs, &row);
	cr_expect_lt(row.speedup, 1.70, "without hints %.4f", row.speedup);
	free(base);
	free(runs);
	free_traces(t, N);
}

Test(auto, seed000_split_host_auto_within_1pct_of_the_best_fixed_k, .timeout = 120)
{
	enum { N = 9 };
	trace t[N];
	seed000_traces(t, N);
	const uint32_t ks[] = {1, 4, 6, 8, 12};
	sim_row best, aut;
	uint32_t bk;
	compare(base_config(), t, N, ks, 5, &best, &aut, &bk);
	cr_expect_geq(aut.speedup, 0.99 * best.speedup, "auto %.4f vs k=%u %.4f", aut.speedup,
		      bk, best.speedup);
	cr_expect_geq(aut.speedup, 1.35, "about 1.38x static");
	free_traces(t, N);
}

Test(auto, seed000_mixed_host_chunked_auto_budget_beats_1_60x_static, .timeout = 120)
{
	enum { N = 9 };
	trace t[N];
	seed000_traces(t, N);
	sim_config c = base_config();
	sim_result *base = calloc(N, sizeof(*base)), *runs = calloc(N, sizeof(*runs));
	sim_row row;
	c.policy = BKV_POLICY_STATIC;
	run_row(&c, t, N, NULL, base, &row);
	c = chunked_auto_config();
	run_row(&c, t, N, base, runs, &row);
	cr_expect_geq(row.speedup, 1.60, "chunked auto %.4f", row.speedup);
	free(base);
	free(runs);
	free_traces(t, N);
}

Test(auto, long_prompts_auto_within_1pct_of_the_best_fixed_k, .timeout = 120)
{
	enum { N = 3 };
	trace t[N];
	synth(t, N, 256, ARRIVAL_BURST, 0, (trace_dist){DIST_UNIFORM, 256, 2048},
	      (trace_dist){DIST_SEED000_GEN, 1, 64});
	const uint32_t ks[] = {1, 2, 4};
	sim_row best, aut;
	uint32_t bk;
	compare(base_config(), t, N, ks, 3, &best, &aut, &bk);
	cr_expect_geq(aut.speedup, 0.99 * best.speedup, "auto %.4f vs k=%u %.4f", aut.speedup,
		      bk, best.speedup);
	/* packing each step's prompts into prefill calls by length (measured
	 * 1.442x on these seeds; 1.062x when a long prompt was only deferred) */
	cr_expect_geq(aut.speedup, 1.3 * best.speedup, "packing: auto %.4f vs k=%u %.4f",
		      aut.speedup, bk, best.speedup);
	free_traces(t, N);
}

Test(auto, long_generations_auto_within_1pct_of_the_best_fixed_k, .timeout = 120)
{
	enum { N = 3 };
	trace t[N];
	synth(t, N, 256, ARRIVAL_BURST, 0, (trace_dist){DIST_UNIFORM, 8, 64},
	      (trace_dist){DIST_UNIFORM, 128, 512});
	sim_config c = base_config();
	c.gen = SIM_GEN_TOKENS;
	const uint32_t ks[] = {1, 2, 3, 4, 8};
	sim_row best, aut;
	uint32_t bk;
	compare(c, t, N, ks, 5, &best, &aut, &bk);
	cr_expect_geq(aut.speedup, 0.99 * best.speedup, "auto %.4f vs k=%u %.4f", aut.speedup,
		      bk, best.speedup);
	free_traces(t, N);
}

/* 70% of seed 000's best burst throughput (323.6 requests/s at k = 8): the
 * issue's target, a lower p99 TTFT than the best fixed k, on 6 seeds of 4,000
 * requests, sent with a 4,096-token cap and ended by a stop token (the
 * calendar learns the lengths; benchmarks.md, "No oracle"). With the oracle
 * lengths auto gave 18.47 vs k = 4's 19.93 ms here; the W99 group alone,
 * before the congestion pricing of lib/decide/admit.c, gave 20.56 and failed
 * this test. */
Test(auto, poisson_at_70pct_auto_matches_throughput_and_beats_best_k_p99_ttft, .timeout = 120)
{
	enum { N = 6 };
	trace t[N];
	synth(t, N, 4000, ARRIVAL_POISSON, 226.0, (trace_dist){DIST_UNIFORM, 8, 64},
	      (trace_dist){DIST_SEED000_GEN, 1, 64});
	const uint32_t ks[] = {1, 2, 3, 4, 8};
	sim_row best, aut;
	uint32_t bk;
	compare(base_config(), t, N, ks, 5, &best, &aut, &bk);
	cr_expect_geq(aut.speedup, 0.99 * best.speedup, "auto %.4f vs k=%u %.4f", aut.speedup,
		      bk, best.speedup);
	cr_expect_lt(aut.med.ttft_p99, best.med.ttft_p99, "auto p99 TTFT %.3f vs k=%u %.3f ms",
		     aut.med.ttft_p99, bk, best.med.ttft_p99);
	free_traces(t, N);
}

/* A test over a real trace skips, saying where the file was looked for,
 * in a checkout without the shared data folder beside it. */
static void need_trace(const char *path)
{
	if (access(path, R_OK) != 0)
		cr_skip_test("%s: not found (the traces are read from ../shared/data/traces "
			     "beside the checkout)",
			     path);
}

static void trace_target(trace_format fmt, const char *path, uint32_t limit, uint32_t slots,
			 uint32_t kv_blocks)
{
	trace t = {0};
	char err[256] = "";
	need_trace(path);
	cr_assert_eq(trace_load(fmt, path, NULL, &t, err, sizeof(err)), TRACE_OK, "%s", err);
	if (t.n > limit)
		t.n = limit;
	sim_config c = base_config();
	c.gen = SIM_GEN_TOKENS;
	c.cost_kind = SIM_COST_ROOFLINE;
	cr_assert_eq(bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16),
		     BKV_OK);
	c.slots = slots;
	c.kv_blocks = kv_blocks;
	const uint32_t ks[] = {1, 2, 4, 8};
	sim_row best, aut;
	uint32_t bk;
	compare(c, &t, 1, ks, 4, &best, &aut, &bk);
	cr_expect_geq(aut.speedup, 0.99 * best.speedup, "auto %.4f vs k=%u %.4f", aut.speedup,
		      bk, best.speedup);
	trace_free(&t);
}

Test(auto, azure_conversation_trace_auto_within_1pct_of_the_best_fixed_k, .timeout = 120)
{
	trace_target(TRACE_AZURE, TRACES "AzureLLMInferenceTrace_conv.csv", 1500, 128, 0);
}

Test(auto, mooncake_trace_auto_within_1pct_of_the_best_fixed_k, .timeout = 120)
{
	trace_target(TRACE_MOONCAKE, TRACES "mooncake_conversation_trace.jsonl", 400, 64, 200000);
}

/* With a 4 ms target (a 32-row decode call is 1.84 ms, one row's prefill
 * about 2.1 ms), p99 time between tokens stays under it, on a split host
 * (admission holds back rows) and with chunked prefill (the budget). */
Test(auto, tpot_target_keeps_p99_time_between_tokens_under_it, .timeout = 120)
{
	enum { N = 3 };
	trace t[N];
	seed000_traces(t, N);
	sim_config c = base_config();
	c.k = 0;
	c.tpot_us = 4000;
	sim_result runs[N];
	sim_row row;
	run_row(&c, t, N, NULL, runs, &row);
	cr_expect_leq(row.med.tbt_p99, 4.0, "split auto: %.3f ms", row.med.tbt_p99);
	c.chunked = 1;
	c.mixed_host = 1;
	c.budget = 0;
	c.tpot_us = 2500;
	run_row(&c, t, N, NULL, runs, &row);
	cr_expect_leq(row.med.tbt_p99, 2.5, "chunked auto: %.3f ms", row.med.tbt_p99);
	/* without the target, the same runs break it */
	c.tpot_us = 0;
	run_row(&c, t, N, NULL, runs, &row);
	cr_expect_gt(row.med.tbt_p99, 2.5);
	free_traces(t, N);
}

/* A TPOT target with chunked prefill on long prompts (a prefix of the
 * Mooncake trace, prompts up to ~100k tokens, H100 roofline): a chunk deep
 * inside a long prompt attends to its whole prefix, so the token budget alone
 * (priced as the tail of a typical long prompt) let steps run to twice the
 * target. Each chunk is now fitted at its offset: p99 time between tokens
 * stays under the target, with the auto budget and with a fixed one. */
Test(auto, tpot_target_holds_for_chunks_deep_in_long_prompts, .timeout = 120)
{
	trace t = {0};
	char err[256] = "";
	need_trace(TRACES "mooncake_conversation_trace.jsonl");
	cr_assert_eq(trace_load(TRACE_MOONCAKE, TRACES "mooncake_conversation_trace.jsonl", NULL, &t,
				err, sizeof(err)),
		     TRACE_OK, "%s", err);
	if (t.n > 600)
		t.n = 600;
	sim_config c = base_config();
	c.gen = SIM_GEN_TOKENS;
	c.cost_kind = SIM_COST_ROOFLINE;
	cr_assert_eq(bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16),
		     BKV_OK);
	c.slots = 64;
	c.kv_blocks = 200000;
	c.k = 0;
	c.chunked = 1;
	c.mixed_host = 1;
	c.budget = 0;
	c.tpot_us = 100000;
	sim_result r;
	sim_row row;
	run_row(&c, &t, 1, NULL, &r, &row);
	cr_expect_leq(row.med.tbt_p99, 100.0, "chunked auto: %.3f ms", row.med.tbt_p99);
	c.budget = 4096;
	run_row(&c, &t, 1, NULL, &r, &row);
	cr_expect_leq(row.med.tbt_p99, 100.0, "chunked 4096: %.3f ms", row.med.tbt_p99);
	trace_free(&t);
}

/* ---- issue 19 points 3 and 5 ---------------------------------------------- */

/* A prefill-heavy Poisson load (prompts 1,200..1,800, outputs 8..64, H100
 * roofline, 64 slots, mixed host) near the host's prefill capacity: the auto
 * budget's p99 TTFT is within 10% of the best fixed budget's, at a p99 TPOT
 * no worse than that budget's (1% for noise). The rule it replaced (the
 * cheapest prefill tokens) stopped where a step turns compute-bound and gave
 * 5,687 ms against 848 ms at a fixed 512 on this trace (admission k = 1;
 * benchmarks.md). */
Test(auto, auto_budget_ttft_within_10pct_of_the_best_fixed_budget_under_prefill_load,
     .timeout = 120)
{
	trace t = {0};
	trace_dist p = {DIST_UNIFORM, 1200, 1800}, o = {DIST_UNIFORM, 8, 64};
	cr_assert_eq(trace_synthetic(&t, 1000, ARRIVAL_POISSON, 40.0, &p, &o, 0), TRACE_OK);
	sim_config c = chunked_auto_config();
	c.gen = SIM_GEN_TOKENS;
	c.cost_kind = SIM_COST_ROOFLINE;
	cr_assert_eq(bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16),
		     BKV_OK);
	c.slots = 64;
	const uint32_t budgets[] = {256, 384, 512, 768, 1024, 2048};
	sim_result r;
	sim_row row, best = {0};
	uint32_t best_b = 0;
	for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
		c.budget = budgets[i];
		run_row(&c, &t, 1, NULL, &r, &row);
		if (!best_b || row.med.ttft_p99 < best.med.ttft_p99) {
			best = row;
			best_b = budgets[i];
		}
	}
	c.budget = 0;
	run_row(&c, &t, 1, NULL, &r, &row);
	cr_expect_leq(row.med.ttft_p99, 1.10 * best.med.ttft_p99, "auto %.1f vs b=%u %.1f ms",
		      row.med.ttft_p99, best_b, best.med.ttft_p99);
	cr_expect_leq(row.med.tpot_p99, 1.01 * best.med.tpot_p99,
		      "auto p99 TPOT %.3f vs b=%u %.3f ms", row.med.tpot_p99, best_b,
		      best.med.tpot_p99);
	trace_free(&t);
}

/* A TPOT target of 3 ms on seed 000's shape at Poisson 226/s holds a split
 * host's admissions while rows run (a prefill call plus the decode call
 * exceed it): p99 TTFT 236.6 ms on this seed. A TTFT target of 25 ms beside
 * it lets a request that has waited half of it join: p99 TTFT 23.1 ms, under
 * the target. */
Test(auto, ttft_target_admits_past_a_tpot_hold_on_a_split_host, .timeout = 120)
{
	trace t = {0};
	trace_dist p = {DIST_UNIFORM, 8, 64}, o = {DIST_SEED000_GEN, 1, 64};
	cr_assert_eq(trace_synthetic(&t, 1000, ARRIVAL_POISSON, 226.0, &p, &o, 0), TRACE_OK);
	sim_config c = base_config();
	c.k = 0;
	c.tpot_us = 3000;
	sim_result r;
	sim_row row;
	run_row(&c, &t, 1, NULL, &r, &row);
	cr_expect_gt(row.med.ttft_p99, 100.0, "TPOT target alone: %.1f ms", row.med.ttft_p99);
	c.ttft_us = 25000;
	run_row(&c, &t, 1, NULL, &r, &row);
	cr_expect_lt(row.med.ttft_p99, 25.0, "with the TTFT target: %.1f ms", row.med.ttft_p99);
	trace_free(&t);
}

/* The same load as poisson_at_70pct_... (which runs as every test does, with
 * a 4,096-token cap and a stop token at the trace length: the calendar then
 * learns the lengths from requests that ended) with --oracle-lengths: the
 * scheduler knows each length as max_new. Auto still beats the best fixed k,
 * and knowing the lengths is worth something: its p99 TTFT is below the
 * learned calendar's. */
Test(auto, poisson_at_70pct_oracle_lengths_beat_the_learned_calendar, .timeout = 120)
{
	enum { N = 6 };
	trace t[N];
	synth(t, N, 4000, ARRIVAL_POISSON, 226.0, (trace_dist){DIST_UNIFORM, 8, 64},
	      (trace_dist){DIST_SEED000_GEN, 1, 64});
	sim_config c = base_config();
	cr_assert_eq(c.oracle, 0, "the default sends a cap");
	cr_assert_eq(c.max_tokens, SIM_MAX_TOKENS);
	const uint32_t ks[] = {1, 2, 3, 4, 8};
	sim_row best, aut, learned;
	uint32_t bk;
	compare(c, t, N, ks, 5, &best, &learned, &bk);
	c.oracle = 1;
	compare(c, t, N, ks, 5, &best, &aut, &bk);
	cr_expect_lt(aut.med.ttft_p99, best.med.ttft_p99, "auto p99 TTFT %.3f vs k=%u %.3f ms",
		     aut.med.ttft_p99, bk, best.med.ttft_p99);
	cr_expect_lt(aut.med.ttft_p99, learned.med.ttft_p99, "oracle %.3f vs learned %.3f ms",
		     aut.med.ttft_p99, learned.med.ttft_p99);
	free_traces(t, N);
}

/* ---- the budget when the slots bind ---------------------------------------- */

static int fwd_call(void *host, const bkv_batch *b, int32_t *next)
{
	(void)host;
	for (uint32_t r = 0; r < b->n_rows; r++)
		next[r] = 7;
	return 0;
}

/* With every running slot taken, the queue behind them is admitted only as
 * slots free, whatever the step's budget: a larger chunk does not serve it
 * sooner. So the automatic budget of a full running set whose prompts are
 * all computed is the same with 200 requests queued as with none (it sizes
 * the prefill that free slots can take, here at most one prompt's worth),
 * where counting the queue's prompts as work to prefill made it several
 * times larger (the Azure trace on 64 slots at 27 requests/s: p50 TTFT
 * 2,709 ms against 243 at a fixed 512; docs/benchmarks.md). */
Test(auto, a_full_running_set_sizes_the_budget_by_free_slots_not_the_queue)
{
	bkv_pool *pool;
	bkv_pool_config pc;
	bkv_pool_config_init(&pc);
	pc.device_blocks = 16384;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_cost_roofline rl;
	cr_assert_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16), BKV_OK);
	bkv_sched_config sc;
	bkv_sched_config_init(&sc);
	sc.max_running = 64;
	sc.chunked_prefill = 1;
	sc.token_budget = 0;
	sc.cost = bkv_cost_roofline_model(&rl);
	bkv_host_ops ops;
	memset(&ops, 0, sizeof(ops));
	ops.forward = fwd_call;
	bkv_sched *s = NULL;
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, NULL, NULL, &s), BKV_OK);
	static int32_t prompt[264][1024]; /* distinct: no prefix hits */
	for (int i = 0; i < 264; i++)
		for (int j = 0; j < 1024; j++)
			prompt[i][j] = i * 1024 + j + 8;
	bkv_request r;
	bkv_request_init(&r);
	r.prompt_len = 1024;
	r.max_new_tokens = 4000;
	for (int i = 0; i < 64; i++) {
		r.prompt = prompt[i];
		cr_assert_eq(bkv_submit(s, &r, NULL), BKV_OK);
	}
	for (int i = 0; i < 400; i++) /* every prompt computed, every row decoding */
		cr_assert_eq(bkv_step(s, NULL), BKV_OK);
	cr_assert_eq(s->rs.slots_used, 64);
	cr_assert_eq(s->stats.prefill_tokens, 64 * 1024);
	uint32_t alone = s->pol.budget(s);
	for (int i = 64; i < 264; i++) {
		r.prompt = prompt[i];
		cr_assert_eq(bkv_submit(s, &r, NULL), BKV_OK);
	}
	cr_assert_eq(bkv_step(s, NULL), BKV_OK); /* drains them into the queue */
	cr_assert_eq(s->q.queue_slots, 200);
	cr_assert_eq(s->rs.slots_used, 64);
	uint32_t queued = s->pol.budget(s);
	cr_expect_gt(alone, 64, "some prefill tokens beside the 64 decode rows");
	cr_expect_leq(queued, alone, "budget %u with 200 queued against %u with none", queued,
		      alone);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

/* The Azure conversation trace (first 2,000 requests, H100 roofline) on 64
 * slots at 27 requests/s: the slots bind and a queue forms behind them. The
 * auto budget's p50 TTFT is within 10% of a fixed 512's and its throughput
 * within 3% (sizing the budget by the queue gave 2,709 ms against 243 and 14%
 * less throughput; docs/benchmarks.md). */
Test(auto, slot_bound_azure_auto_budget_ttft_p50_within_10pct_of_a_fixed_512, .timeout = 120)
{
	trace t = {0};
	char err[256] = "";
	need_trace(TRACES "AzureLLMInferenceTrace_conv.csv");
	cr_assert_eq(trace_load(TRACE_AZURE, TRACES "AzureLLMInferenceTrace_conv.csv", NULL, &t,
				err, sizeof(err)),
		     TRACE_OK, "%s", err);
	if (t.n > 2000)
		t.n = 2000;
	double r0 = sim_trace_rate(&t), a0 = t.reqs[0].arrival_us;
	for (uint32_t j = 0; j < t.n; j++)
		t.reqs[j].arrival_us = a0 + (t.reqs[j].arrival_us - a0) * r0 / 27.0;
	sim_config c = chunked_auto_config();
	c.gen = SIM_GEN_TOKENS;
	c.cost_kind = SIM_COST_ROOFLINE;
	cr_assert_eq(bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16),
		     BKV_OK);
	c.slots = 64;
	sim_result rf, ra;
	sim_row row;
	c.budget = 512;
	run_row(&c, &t, 1, NULL, &rf, &row);
	c.budget = 0;
	run_row(&c, &t, 1, NULL, &ra, &row);
	cr_expect_leq(ra.ttft_p50, 1.10 * rf.ttft_p50, "auto %.1f vs b=512 %.1f ms", ra.ttft_p50,
		      rf.ttft_p50);
	cr_expect_geq(ra.tput_tok_s, 0.97 * rf.tput_tok_s, "auto %.1f vs b=512 %.1f tokens/s",
		      ra.tput_tok_s, rf.tput_tok_s);
	trace_free(&t);
}
