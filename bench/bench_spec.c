/*
 * bench_spec.c - speculative decoding in bkv-sim (issue 17, points 5 and 6):
 * the speed-up of no speculation, of the best fixed k and of automatic k
 * over a grid of acceptance rates and running rows, and the KV blocks the
 * drafts hold per running row against reserving k slots for every row.
 *
 * Each grid point is one bkv-sim run (examples/sim: the real scheduler on a
 * virtual clock, every call priced by the roofline preset, the scheduler
 * given the same model): W x R requests (W = max(4, 128 / R) unless given) of P prompt and G output tokens
 * arrive together into R slots (R rows run for the whole run but its tail:
 * a queue refills every slot that frees), a mixed
 * host, drafts from the host (the simulator's, each accepted with the
 * acceptance rate a). Speed-up = generated tokens per virtual second over
 * the run without speculation. Fixed k runs k = 1..8; auto runs
 * BKV_SPEC_K_AUTO up to 8. Output: a markdown table (docs/benchmarks.md).
 *
 *   bench_spec [--preset N] [--prompt P] [--output G] [--waves W] [--spread S]
 *
 * The n-gram proposer's cost (point 2), for callgrind (bench/spec_instr.sh):
 *
 *   bench_spec --ngram R STEPS cyclic|random [K] [--ctx C] [--drafting D]
 *
 * runs R rows of 512-token prompts (C with --ctx) for STEPS decode steps
 * with library n-gram drafts of K (default 4, 0 = off), fixed k, a host
 * whose output is a cycle of 7 tokens (every lookup matches) or a hash of
 * the position (lookups miss); the script takes bkv__spec_plan's and
 * bkv_step's inclusive instructions per row from the difference of two step
 * counts. --drafting D: only D rows draft, spread evenly over the batch (a
 * cyclic output, the others a hash), their K drafts from the host's draft
 * callback (every other row is offered k and proposes none): the cost of a
 * step where a few rows draft (bench/spec_fill.sh).
 */
#include "sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double run_one(const sim_config *base, const trace *t, uint32_t rows, double a, uint32_t k,
		      int autok, sim_result *res)
{
	sim_config c = *base;
	char err[256];

	c.slots = rows;
	c.spec_k = k;
	c.spec_auto = autok;
	c.spec_accept = a;
	memset(res, 0, sizeof(*res));
	if (sim_run(&c, t, res, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_spec: %s\n", err);
		exit(1);
	}
	if (res->finished != t->n || res->errors) {
		fprintf(stderr, "bench_spec: %u of %u finished, %u errors\n", res->finished, t->n,
			res->errors);
		exit(1);
	}
	return res->tput_tok_s;
}

/* ---- the n-gram proposer's cost ------------------------------------------ */

static int cyclic;
static int host_drafts;   /* --drafting given: drafts from ng_draft */
static uint32_t drafting; /* of which rows (user &cyc_tag) draft */
static int cyc_tag;

static int32_t ng_next(int32_t t, int32_t pos, int cyc)
{
	if (cyc)
		return 100 + (t - 100 + 1) % 7;
	return 100 + (int32_t)(((uint32_t)pos * 2654435761u) >> 20) % 5000;
}

static int ng_forward(void *h, const bkv_batch *b, int32_t *next)
{
	(void)h;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
		int cyc = host_drafts ? b->row_user[r] == &cyc_tag : cyclic;
		if (!b->row_sample[r])
			continue;
		if (b->row_drafts && b->row_drafts[r])
			for (int32_t t = q0; t < q1; t++)
				b->spec_tokens[t] = ng_next(b->token_ids[t], b->positions[t], cyc);
		else
			next[r] = ng_next(b->token_ids[q1 - 1], b->positions[q1 - 1], cyc);
	}
	return 0;
}

/* --drafting: the cycle's next k tokens for a drafting row, none else */
static int ng_draft(void *h, uint64_t req, uint32_t branch, const int32_t *ctx, uint32_t n_ctx,
		    int32_t *out, uint32_t k, void *user)
{
	(void)h, (void)req, (void)branch;
	if (user != &cyc_tag)
		return 0;
	for (uint32_t j = 0; j < k; j++)
		out[j] = ng_next(j ? out[j - 1] : ctx[n_ctx - 1], 0, 1);
	return (int)k;
}

static int ngram_bench(uint32_t rows, uint32_t steps, uint32_t k, uint32_t plen)
{
	bkv_pool_config pc;
	bkv_sched_config c;
	bkv_host_ops ops;
	bkv_pool *pool;
	bkv_sched *s;
	bkv_sched_stats st;
	int32_t *prompt = malloc(plen * sizeof(int32_t)), *cprompt = malloc(plen * sizeof(int32_t));
	uint32_t every = drafting ? rows / drafting : 0;

	if (!prompt || !cprompt)
		return 2;
	for (uint32_t i = 0; i < plen; i++) {
		cprompt[i] = 100 + (int32_t)(i % 7);
		prompt[i] = cyclic ? cprompt[i] : 100 + (int32_t)((i * 2654435761u) >> 20) % 5000;
	}
	bkv_pool_config_init(&pc);
	pc.block_tokens = 16;
	pc.device_blocks = rows * ((plen + 4096) / 16 + 2);
	pc.prefix_cache = 0;
	if (bkv_pool_create(&pc, NULL, &pool))
		return 2;
	bkv_sched_config_init(&c);
	c.max_running = rows;
	c.admit_group = 1;
	c.spec_max_k = k;
	c.spec_k_mode = BKV_SPEC_K_FIXED;
	if (host_drafts)
		c.spec_drafts = BKV_SPEC_DRAFT_HOST;
	memset(&ops, 0, sizeof(ops));
	ops.forward = ng_forward;
	ops.draft = ng_draft;
	if (bkv_sched_create(&c, pool, &ops, NULL, NULL, &s))
		return 2;
	for (uint32_t i = 0; i < rows; i++) {
		bkv_request q;
		bkv_request_init(&q);
		q.prompt = prompt;
		q.prompt_len = plen;
		if (every && i % every == every / 2 && i / every < drafting) {
			q.prompt = cprompt;
			q.user = &cyc_tag;
		}
		q.max_new_tokens = 4000;
		if (bkv_submit(s, &q, NULL))
			return 2;
	}
	for (uint32_t i = 0; i < steps + 1; i++)
		if (bkv_step(s, NULL))
			return 2;
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(s, &st);
	printf("rows %u steps %u k %u %s: spec rows %llu, drafts %llu, accepted %llu\n", rows, steps,
	       k, cyclic ? "cyclic" : "random", (unsigned long long)st.spec_rows,
	       (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
	free(prompt);
	free(cprompt);
	return 0;
}

int main(int argc, char **argv)
{
	static const double acc[4] = {0.3, 0.5, 0.7, 0.9};
	static const uint32_t rows[5] = {1, 8, 32, 128, 256};
	uint32_t preset = BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16, prompt = 512, output = 512, waves = 0;
	double spread = 0.0, worst = 1e9;
	sim_config base;
	int i;

	if (argc >= 5 && !strcmp(argv[1], "--ngram")) {
		uint32_t k = 4, plen = 512;

		cyclic = !strcmp(argv[4], "cyclic");
		for (i = 5; i < argc; i++) {
			if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
				plen = (uint32_t)atoi(argv[++i]);
			else if (!strcmp(argv[i], "--drafting") && i + 1 < argc)
				drafting = (uint32_t)atoi(argv[++i]), host_drafts = 1;
			else
				k = (uint32_t)atoi(argv[i]);
		}
		if (plen < 8 || (drafting && drafting > (uint32_t)atoi(argv[2])))
			return 2;
		return ngram_bench((uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]), k, plen);
	}
	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--preset"))
			preset = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--prompt"))
			prompt = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--output"))
			output = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--spread"))
			spread = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--waves"))
			waves = (uint32_t)atoi(argv[i + 1]);
	}
	sim_config_init(&base);
	base.cost_kind = SIM_COST_ROOFLINE;
	if (bkv_cost_roofline_init(&base.roofline, (bkv_roofline_preset)preset) != BKV_OK)
		return 2;
	base.oracle = 1;       /* max_new_tokens = the output length */
	base.mixed_host = 1;
	base.prefix_cache = 0; /* unique prompts */
	base.spec_spread = spread;
	printf("preset %u, prompt %u, output %u, waves %u (0: max(4, 128 / rows)), acceptance "
	       "spread %.2f\n\n", preset, prompt, output, waves, spread);
	printf("| a | rows | best fixed k | speed-up (best k) | auto k: speed-up | auto / best | "
	       "drafts accepted (auto) | blocks/row (auto) | blocks/row (reserve 8) |\n");
	printf("|---|---|---|---|---|---|---|---|---|\n");
	for (uint32_t ri = 0; ri < 5; ri++) {
		trace t;
		memset(&t, 0, sizeof(t));
		/* W x R requests, W = --waves or max(4, 128 / R) */
		uint32_t w = waves ? waves : rows[ri] < 32 ? 128 / rows[ri] : 4;
		for (uint32_t q = 0; q < w * rows[ri]; q++)
			if (trace_push(&t, 0.0, prompt, output, NULL, 0) != TRACE_OK)
				return 2;
		for (uint32_t ai = 0; ai < 4; ai++) {
			sim_result r0, rk, ra;
			double none = run_one(&base, &t, rows[ri], acc[ai], 0, 0, &r0), best = none,
			       au;
			uint32_t best_k = 0;
			for (uint32_t k = 1; k <= 8; k++) {
				double x = run_one(&base, &t, rows[ri], acc[ai], k, 0, &rk);
				if (x > best) {
					best = x;
					best_k = k;
				}
			}
			au = run_one(&base, &t, rows[ri], acc[ai], 8, 1, &ra);
			if (au / best < worst)
				worst = au / best;
			printf("| %.1f | %u | %u | %.3f | %.3f | %.4f | %.3f | %.3f | %.3f |\n", acc[ai],
			       rows[ri], best_k, best / none, au / none, au / best,
			       ra.spec_drafted ? (double)ra.spec_accepted / (double)ra.spec_drafted
					       : 0.0,
			       ra.spec_blocks_row, ra.spec_reserve_row);
			fflush(stdout);
		}
		trace_free(&t);
	}
	printf("\nworst auto / best fixed: %.4f\n", worst);
	return 0;
}
