/*
 * bench_step.c - the CPU cost of bkv_step itself, with a no-op host.
 *
 * Each configuration admits `running` requests (64-token prompts, outputs long
 * enough that none finishes during the run), queues `waiting` more behind them,
 * and then times steady decode steps: every step appends one token to every
 * running sequence, fills the batch arrays (token ids, positions, slot mapping,
 * qo/kv indptr, kv_indices, last-page lengths) and calls a host that does
 * nothing. The table shows the cost against the running rows, the kv_indices
 * entries the batch carries (the block tables FlashInfer reads), the waiting
 * requests and the pool's size: it should follow the first two only.
 *
 * A churn configuration (short outputs, continuous refill from the queue)
 * prices steps that also admit, prefill and finish requests.
 *
 * Usage: bench_step [--quick]          the tables (--quick: 32 timed steps)
 *        bench_step R W X STEPS [CONTEXT flat|persistent]
 *                                       one decode configuration (for callgrind):
 *                                       prompts of CONTEXT tokens (default 64) in
 *                                       that batch layout (default flat)
 *        bench_step --context           flat against persistent, 64 .. 131,072
 *                                       tokens of context
 *        bench_step --churn R STEPS     one churn configuration
 *        bench_step --minimal R STEPS CONTEXT
 *                                       a minimal step writing the same flat
 *                                       batch (bench/step_lines.sh)
 */
#include <batchkv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct noop_host {
	uint64_t kv_entries; /* kv_indices entries seen (flat), or block ids the
				table deltas carried (persistent) */
	uint64_t calls;
} noop_host;

static int noop_forward(void *h, const bkv_batch *b, int32_t *next)
{
	noop_host *n = h;
	uint32_t r;

	n->calls++;
	if (b->layout == BKV_BATCH_PERSISTENT)
		for (r = 0; r < b->n_table_deltas; r++)
			n->kv_entries += b->table_deltas[r].n;
	else
		n->kv_entries += (uint64_t)b->kv_indptr[b->n_rows];
	for (r = 0; r < b->n_rows; r++)
		if (b->row_sample[r])
			next[r] = 7 + (int32_t)r; /* never a stop token */
	return 0;
}

/* BKV_BENCH_OVERLAP=D (1..8): run_decode drives the two-phase step at depth
 * D instead (bkv_step_launch of step N+1 with up to D steps in flight, then
 * bkv_step_complete of the oldest; the no-op host writes its tokens at
 * launch), so callgrind prices the overlapped contract's library work: the
 * inclusive counts of bkv_step_launch and bkv_step_complete per step
 * (docs/benchmarks.md, "Overlapped scheduling"). */
static uint32_t g_overlap;
static uint64_t g_q[BKV_OVERLAP_MAX_DEPTH + 1];
static uint32_t g_nq;

static void complete_oldest(bkv_sched *s)
{
	bkv_step_complete(s, g_q[0], 0, NULL);
	memmove(g_q, g_q + 1, --g_nq * sizeof(g_q[0]));
}

static void complete_all(bkv_sched *s)
{
	while (g_nq)
		complete_oldest(s);
}

static void one_step(bkv_sched *s, bkv_step_info *si)
{
	uint64_t t = 0;

	if (!g_overlap) {
		bkv_step(s, si);
		return;
	}
	if (bkv_step_launch(s, &t, si) == BKV_EAGAIN) {
		complete_all(s);
		return;
	}
	if (t)
		g_q[g_nq++] = t;
	if (g_nq == g_overlap + 1 || (!t && g_nq))
		complete_oldest(s);
}

/* BKV_BENCH_CLOCK=1: the scheduler's clock is a counter advancing 100 us a
 * reading (ops.now_us) instead of CLOCK_MONOTONIC, so that its decisions,
 * which read the clock (the calibrated cost model, the automatic ones), do
 * not vary between runs: callgrind's counts then repeat exactly
 * (bench/instr_counts.sh sets it). */
static uint64_t g_clock_us;

static uint64_t fixed_clock(void *host)
{
	(void)host;
	return g_clock_us += 100;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct result {
	double us_per_step;
	double kv_per_step;
	double tokens_per_step;   /* prefill + decode tokens computed */
	double finished_per_step; /* requests ended (and replaced) */
} result;

/* Steady decode: `running` long requests of prompt_len tokens, `waiting` more
 * queued, in one batch layout. */
static result run_decode(uint32_t running, uint32_t waiting, uint32_t block_scale,
			 uint32_t steps, uint32_t prompt_len, bkv_batch_layout layout)
{
	const uint32_t bt = 16, warm = 16;
	/* room for the steps a long prompt's prefill takes (the batch arrays
	 * hold at most 2^24 tokens a step) */
	uint32_t max_new = warm + steps + 8 + 64, i, blocks_per_req;
	int32_t *prompt = malloc(prompt_len * sizeof(int32_t));
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_pool *pool;
	bkv_sched *s;
	noop_host host = {0};
	bkv_request q;
	double t0, t1;
	result res;

	for (i = 0; i < prompt_len; i++)
		prompt[i] = 100 + (int32_t)i;
	blocks_per_req = (prompt_len + max_new + bt - 1) / bt;
	bkv_pool_config_init(&pc);
	pc.block_tokens = bt;
	pc.device_blocks = (running * blocks_per_req + 64) * block_scale;
	pc.max_seqs = running + 16;
	pc.prefix_cache = 1;
	if (bkv_pool_create(&pc, NULL, &pool) != BKV_OK)
		exit(1);
	bkv_sched_config_init(&sc);
	sc.max_running = running;
	sc.admit_group = 1; /* fixed policy: measure the mechanics, not a model */
	sc.max_wait_us = UINT64_MAX;
	sc.max_queue = running + waiting + 16;
	sc.batch_layout = layout;
	memset(&ops, 0, sizeof(ops));
	ops.forward = noop_forward;
	if (getenv("BKV_BENCH_CLOCK"))
		ops.now_us = fixed_clock;
	g_overlap = getenv("BKV_BENCH_OVERLAP") && layout == BKV_BATCH_FLAT
			    ? (uint32_t)atoi(getenv("BKV_BENCH_OVERLAP")) : 0;
	if (g_overlap > BKV_OVERLAP_MAX_DEPTH)
		g_overlap = BKV_OVERLAP_MAX_DEPTH;
	if (g_overlap) {
		sc.overlap = g_overlap;
		ops.launch = noop_forward;
	}
	if (bkv_sched_create(&sc, pool, &ops, &host, NULL, &s) != BKV_OK)
		exit(1);
	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = prompt_len;
	for (i = 0; i < running + waiting; i++) {
		prompt[0] = (int32_t)i; /* distinct prompts: no prefix sharing */
		q.max_new_tokens = i < running ? max_new : 16;
		if (bkv_submit(s, &q, NULL) != BKV_OK)
			exit(1);
	}
	for (i = 0; i < warm; i++) /* admission and prefill happen here */
		one_step(s, NULL);
	/* long prompts take several steps to prefill: run until every running
	 * row decodes (the step's computed tokens equal its rows) */
	for (;;) {
		bkv_step_info si;

		memset(&si, 0, sizeof(si));
		one_step(s, &si);
		if (si.prefill_tokens == 0 && si.decode_tokens == running)
			break;
	}
	host.kv_entries = 0;
	res.us_per_step = 1e30;
	/* the best of 8 batches: the machine is shared, interference only adds */
	for (i = 0; i < steps; i += steps / 8) {
		uint32_t j;

		t0 = now_s();
		for (j = 0; j < steps / 8; j++)
			one_step(s, NULL);
		t1 = now_s();
		if ((t1 - t0) * 1e6 / (steps / 8) < res.us_per_step)
			res.us_per_step = (t1 - t0) * 1e6 / (steps / 8);
	}
	res.kv_per_step = (double)host.kv_entries / steps;
	complete_all(s);
	if (bkv_sched_check(s) != 0 || bkv_sched_pending(s) != running + waiting) {
		fprintf(stderr, "bench_step: unexpected scheduler state\n");
		exit(1);
	}
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
	free(prompt);
	return res;
}

/* Churn: short requests refilled continuously from a deep queue. */
static result run_churn(uint32_t running, uint32_t steps)
{
	const uint32_t prompt_len = 64;
	uint32_t i, n_req = running * (steps / 3 + 16); /* never runs dry */
	int32_t *prompt = malloc(prompt_len * sizeof(int32_t));
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_pool *pool;
	bkv_sched *s;
	noop_host host = {0};
	bkv_request q;
	bkv_sched_stats st = {.size = sizeof(st)}, st0 = {.size = sizeof(st0)};
	double t0, t1;
	result res;

	for (i = 0; i < prompt_len; i++)
		prompt[i] = 100 + (int32_t)i;
	bkv_pool_config_init(&pc);
	pc.device_blocks = running * 16 + 64;
	pc.max_seqs = running * 2 + 16;
	if (bkv_pool_create(&pc, NULL, &pool) != BKV_OK)
		exit(1);
	bkv_sched_config_init(&sc);
	sc.max_running = running;
	sc.admit_group = 1;
	sc.max_wait_us = UINT64_MAX;
	sc.max_queue = n_req + 16;
	memset(&ops, 0, sizeof(ops));
	ops.forward = noop_forward;
	if (getenv("BKV_BENCH_CLOCK"))
		ops.now_us = fixed_clock;
	if (bkv_sched_create(&sc, pool, &ops, &host, NULL, &s) != BKV_OK)
		exit(1);
	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = prompt_len;
	for (i = 0; i < n_req; i++) {
		prompt[0] = (int32_t)i;
		q.max_new_tokens = 2 + i % 8;
		if (bkv_submit(s, &q, NULL) != BKV_OK)
			exit(1);
	}
	for (i = 0; i < 16; i++)
		bkv_step(s, NULL);
	bkv_sched_stats_get(s, &st0);
	host.kv_entries = 0;
	res.us_per_step = 1e30;
	for (i = 0; i < steps; i += steps / 8) { /* the best of 8 batches */
		uint32_t j;

		t0 = now_s();
		for (j = 0; j < steps / 8; j++)
			bkv_step(s, NULL);
		t1 = now_s();
		if ((t1 - t0) * 1e6 / (steps / 8) < res.us_per_step)
			res.us_per_step = (t1 - t0) * 1e6 / (steps / 8);
	}
	bkv_sched_stats_get(s, &st);
	if (st.finished < running || bkv_sched_pending(s) < 2 * (uint64_t)running) {
		fprintf(stderr, "bench_step: churn did not churn, or its queue ran dry\n");
		exit(1);
	}
	res.kv_per_step = (double)host.kv_entries / steps;
	res.tokens_per_step = (double)(st.prefill_tokens + st.decode_tokens - st0.prefill_tokens -
				       st0.decode_tokens) / steps;
	res.finished_per_step = (double)(st.finished - st0.finished) / steps;
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
	free(prompt);
	return res;
}

/* ---- a minimal step: the same flat batch, nothing else --------------------
 *
 * What any scheduler must do each decode step for R rows of a flat batch:
 * append the row's token (a new block from a free list at a boundary), and
 * write its batch entries (token, position, slot, qo/kv indptr, the block
 * table into kv_indices, last-page length, sample flag, request id). The
 * reference that bench/step_lines.sh compares bkv_step against, in
 * instructions and in cache misses per row (callgrind --cache-sim). */
typedef struct min_batch {
	int32_t *tok, *pos, *slot, *qo, *kvp, *kvi, *lpl;
	uint8_t *smp;
	uint64_t *rid;
} min_batch;

static void run_minimal(uint32_t rows, uint32_t steps, uint32_t ctx)
{
	const uint32_t bt = 16, cap = (ctx + steps + bt) / bt + 1;
	int32_t **table = malloc(rows * sizeof(int32_t *));
	uint32_t *len = malloc(rows * sizeof(uint32_t)), *nb = malloc(rows * sizeof(uint32_t));
	int32_t *last = malloc(rows * sizeof(int32_t)), next_free = 0;
	min_batch b;
	uint32_t r, i, st;
	uint64_t sink = 0;

	b.tok = malloc(rows * sizeof(int32_t));
	b.pos = malloc(rows * sizeof(int32_t));
	b.slot = malloc(rows * sizeof(int32_t));
	b.qo = malloc((rows + 1) * sizeof(int32_t));
	b.kvp = malloc((rows + 1) * sizeof(int32_t));
	b.kvi = malloc((size_t)rows * cap * sizeof(int32_t));
	b.lpl = malloc(rows * sizeof(int32_t));
	b.smp = malloc(rows);
	b.rid = malloc(rows * sizeof(uint64_t));
	for (r = 0; r < rows; r++) { /* a prompt of ctx tokens in place */
		table[r] = malloc(cap * sizeof(int32_t));
		len[r] = ctx;
		nb[r] = (ctx + bt - 1) / bt;
		for (i = 0; i < nb[r]; i++)
			table[r][i] = next_free++;
		last[r] = 100 + (int32_t)r;
	}
	for (st = 0; st < steps; st++) {
		uint32_t k = 0;

		b.qo[0] = b.kvp[0] = 0;
		for (r = 0; r < rows; r++) {
			uint32_t off = len[r] % bt;

			if (off == 0) /* a boundary: one more block */
				table[r][nb[r]++] = next_free++;
			b.tok[r] = last[r];
			b.pos[r] = (int32_t)len[r];
			b.slot[r] = table[r][nb[r] - 1] * (int32_t)bt + (int32_t)off;
			b.qo[r + 1] = (int32_t)r + 1;
			memcpy(&b.kvi[k], table[r], nb[r] * sizeof(int32_t));
			k += nb[r];
			b.kvp[r + 1] = (int32_t)k;
			b.lpl[r] = (int32_t)(off + 1);
			b.smp[r] = 1;
			b.rid[r] = r + 1;
			len[r]++;
		}
		sink += (uint64_t)b.kvp[rows];
		for (r = 0; r < rows; r++) /* the host's tokens */
			last[r] = 7 + (int32_t)r;
	}
	printf("minimal: %u rows, %u steps, %llu kv entries\n", rows, steps, (unsigned long long)sink);
	for (r = 0; r < rows; r++)
		free(table[r]);
	free(table); free(len); free(nb); free(last);
	free(b.tok); free(b.pos); free(b.slot); free(b.qo); free(b.kvp); free(b.kvi); free(b.lpl);
	free(b.smp); free(b.rid);
}

int main(int argc, char **argv)
{
	static const uint32_t runs[] = {32, 256, 1024};
	static const uint32_t waits[] = {0, 10000};
	uint32_t steps = 256, i, j, k;
	int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;

	if (argc == 5 && strcmp(argv[1], "--minimal") == 0) {
		run_minimal((uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]));
		return 0;
	}
	if (argc == 4 && strcmp(argv[1], "--churn") == 0) {
		result r = run_churn((uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]));

		printf("%.2f us/step, %.1f ended/step, %.0f tokens/step\n", r.us_per_step,
		       r.finished_per_step, r.tokens_per_step);
		return 0;
	}
	if (argc == 5 || argc == 7) {
		uint32_t ctx = argc == 7 ? (uint32_t)atoi(argv[5]) : 64;
		bkv_batch_layout lay = argc == 7 && strcmp(argv[6], "persistent") == 0
					       ? BKV_BATCH_PERSISTENT
					       : BKV_BATCH_FLAT;
		result r = run_decode((uint32_t)atoi(argv[1]), (uint32_t)atoi(argv[2]),
				      (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]), ctx, lay);

		printf("%.2f us/step, %.0f %s entries/step\n", r.us_per_step, r.kv_per_step,
		       lay == BKV_BATCH_PERSISTENT ? "delta" : "kv");
		return 0;
	}
	if (argc == 2 && strcmp(argv[1], "--context") == 0) {
		static const uint32_t ctxs[] = {64, 1024, 8192, 32768, 131072};
		static const uint32_t rows[] = {256, 1024};

		printf("bkv_step CPU cost against context length, no-op host, 64 timed steps "
		       "(us per step; entries: kv_indices (flat) or table-delta block ids "
		       "(persistent) per step)\n\n");
		printf("| running | context | flat: entries / step | flat: us / step | "
		       "persistent: entries / step | persistent: us / step |\n");
		printf("|---:|---:|---:|---:|---:|---:|\n");
		for (i = 0; i < 2; i++) {
			for (j = 0; j < sizeof ctxs / sizeof ctxs[0]; j++) {
				result f, p;

				if ((uint64_t)rows[i] * ctxs[j] > (1ull << 27))
					continue; /* 128 M context tokens at most */
				f = run_decode(rows[i], 0, 1, 64, ctxs[j], BKV_BATCH_FLAT);
				p = run_decode(rows[i], 0, 1, 64, ctxs[j], BKV_BATCH_PERSISTENT);
				printf("| %u | %u | %.0f | %.2f | %.1f | %.2f |\n", rows[i], ctxs[j],
				       f.kv_per_step, f.us_per_step, p.kv_per_step, p.us_per_step);
				fflush(stdout);
			}
		}
		return 0;
	}
	if (quick)
		steps = 32;
	printf("bkv_step CPU cost, no-op host, %u timed steps each (us per step)\n\n", steps);
	printf("| running | waiting | pool blocks x | kv_indices / step | us / step | ns / row |\n");
	printf("|---:|---:|---:|---:|---:|---:|\n");
	for (i = 0; i < 3; i++) {
		for (j = 0; j < 2; j++) {
			for (k = 1; k <= 8; k *= 8) {
				result r = run_decode(runs[i], waits[j], k, steps, 64,
						      BKV_BATCH_FLAT);

				printf("| %u | %u | %u | %.0f | %.2f | %.1f |\n", runs[i], waits[j], k,
				       r.kv_per_step, r.us_per_step,
				       r.us_per_step * 1000.0 / runs[i]);
			}
		}
	}
	printf("\nchurn (outputs of 2..9 tokens, refilled from the queue at once)\n\n");
	printf("| running | ended+admitted / step | tokens / step | kv_indices / step | us / step "
	       "| ns / token |\n|---:|---:|---:|---:|---:|---:|\n");
	for (i = 0; i < 3; i++) {
		result r = run_churn(runs[i], steps);

		printf("| %u | %.1f | %.0f | %.0f | %.2f | %.1f |\n", runs[i], r.finished_per_step,
		       r.tokens_per_step, r.kv_per_step, r.us_per_step,
		       r.us_per_step * 1000.0 / r.tokens_per_step);
	}
	return 0;
}
