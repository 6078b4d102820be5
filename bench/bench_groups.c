/*
 * bench_groups.c - what KV groups buy and cost (issue 16).
 *
 *   bench_groups memory      sequences of 32,768 tokens that fit a fixed
 *                            memory for gpt-oss-20b's shape, hybrid (12
 *                            full + 12 windowed layers) against all 24
 *                            layers full, and the blocks each group holds
 *                            against the analytic minimum
 *                            (bkv_kv_group_blocks_held)
 *   bench_groups step G R S  S steady decode steps of R running rows with a
 *                            no-op host, in a pool of G groups (1: one full
 *                            group, 2: full + window 128, 3: + a recurrent
 *                            state); for callgrind's instruction counts
 *   bench_groups pool G N    N one-token appends (decode) spread over 64
 *                            sequences in a pool of G groups, then N / 16
 *                            whole-block prefix hits; for callgrind
 *
 * Memory: an 80 GiB budget, block 16; every sequence is appended in chunks of
 * 512 tokens and then one decode token, as the scheduler would. No step
 * transaction is needed: outside one, each append first releases what the
 * window no longer reads.
 */
#include <batchkv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const bkv_kv_group g_hybrid[3] = {
	{BKV_GROUP_FULL, 12, 0, 0, 2048},
	{BKV_GROUP_WINDOW, 12, 128, 0, 2048},
	{BKV_GROUP_STATE, 1, 512, 0, 393216},
};
static const bkv_kv_group g_state[2] = {
	{BKV_GROUP_FULL, 12, 0, 0, 2048},
	{BKV_GROUP_STATE, 1, 512, 0, 393216},
};
static const bkv_kv_group g_full24[1] = {{BKV_GROUP_FULL, 24, 0, 0, 2048}};
static const bkv_kv_group g_full12[1] = {{BKV_GROUP_FULL, 12, 0, 0, 2048}};

static bkv_pool *make_pool(const bkv_kv_group *g, uint32_t ng, uint32_t frames,
			   uint32_t max_seqs)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = 16;
	c.device_blocks = frames;
	c.max_seqs = max_seqs;
	c.n_groups = ng;
	c.groups = g;
	if (g[ng - 1].kind == BKV_GROUP_STATE)
		c.state_units = 4 * max_seqs;
	if (bkv_pool_create(&c, NULL, &p) != BKV_OK) {
		fprintf(stderr, "bench_groups: pool refused\n");
		exit(1);
	}
	return p;
}

/* Fill p with 32,768-token sequences until one does not fit. Returns how
 * many did; *held gets each group's held blocks of the last one that did. */
static uint32_t fill(bkv_pool *p, uint32_t ng, uint64_t held[2])
{
	static int32_t tok[512];
	uint32_t n, s, i, g, nb, last = 0;

	for (n = 0;; n++) {
		int rc = BKV_OK;

		for (i = 0; i < 512; i++)
			tok[i] = (int32_t)((i * 7 + n * 100003) & 0x7fffffff);
		if (bkv_seq_open(p, &s) != BKV_OK)
			break;
		for (i = 0; i < 64 && rc == BKV_OK; i++)
			rc = bkv_seq_append(p, s, tok, 512, NULL);
		if (rc == BKV_OK)
			rc = bkv_seq_append(p, s, tok, 1, NULL);
		if (rc != BKV_OK)
			break;
		last = s;
	}
	for (g = 0; g < ng && g < 2; g++) {
		const int32_t *t = bkv_seq_group_blocks(p, last, g, &nb);

		held[g] = 0;
		for (i = 0; i < nb; i++)
			held[g] += t[i] >= 0;
	}
	return n;
}

static int memory(void)
{
	const uint64_t budget = 80ull << 30;
	const uint32_t f_full = bkv_frames_for_bytes(budget, g_full24, 1, 16);
	const uint32_t f_hyb = bkv_frames_for_bytes(budget, g_hybrid, 2, 16);
	bkv_pool *pf = make_pool(g_full24, 1, f_full, 1024), *ph = make_pool(g_hybrid, 2, f_hyb, 1024);
	uint64_t hf[2] = {0, 0}, hh[2] = {0, 0};
	uint32_t nf = fill(pf, 1, hf), nh = fill(ph, 2, hh);

	printf("budget 80 GiB, block 16, sequences of 32,768 + 1 tokens\n");
	printf("%-10s %9s %12s %10s %10s %10s\n", "pool", "frames", "frame_bytes", "sequences",
	       "full_held", "window_held");
	printf("%-10s %9u %12llu %10u %10llu %10s\n", "all-full", f_full,
	       (unsigned long long)bkv_kv_frame_bytes(g_full24, 1, 16), nf,
	       (unsigned long long)hf[0], "-");
	printf("%-10s %9u %12llu %10u %10llu %10llu\n", "hybrid", f_hyb,
	       (unsigned long long)bkv_kv_frame_bytes(g_hybrid, 2, 16), nh,
	       (unsigned long long)hh[0], (unsigned long long)hh[1]);
	printf("hybrid / all-full sequences: %.3f\n", nf ? (double)nh / nf : 0.0);
	printf("analytic held at 32,768 tokens (the token at 32,768 computed): full %llu, "
	       "window %llu\n",
	       (unsigned long long)bkv_kv_group_blocks_held(&g_hybrid[0], 16, 32768),
	       (unsigned long long)bkv_kv_group_blocks_held(&g_hybrid[1], 16, 32768));
	bkv_pool_destroy(pf);
	bkv_pool_destroy(ph);
	return 0;
}

/* ---- the step ------------------------------------------------------------- */

static int noop_forward(void *h, const bkv_batch *b, int32_t *next)
{
	uint32_t r;

	(void)h;
	for (r = 0; r < b->n_rows; r++)
		if (b->row_sample[r])
			next[r] = 7 + (int32_t)r;
	return 0;
}

/* G: 1 one full group, 2 full + window 128, 3 + a recurrent state, 4 full
 * + a recurrent state (gpt-oss-20b-like layers, a state of Mamba's size). */
static const bkv_kv_group *shape(uint32_t ng, uint32_t *n)
{
	*n = ng == 4 ? 2 : ng;
	return ng == 1 ? g_full12 : ng == 4 ? g_state : g_hybrid;
}

static int step(uint32_t ng, uint32_t rows, uint32_t steps, uint32_t ctx, int persistent)
{
	uint32_t n_groups;
	const bkv_kv_group *g = shape(ng, &n_groups);
	bkv_pool *p = make_pool(g, n_groups, 200000, 4096);
	bkv_sched_config sc;
	bkv_host_ops ops = {0};
	bkv_sched *s = NULL;
	bkv_step_info si;
	int32_t *prompt = malloc(ctx * sizeof(int32_t));
	uint32_t i;

	if (!prompt)
		return 1;
	bkv_sched_config_init(&sc);
	sc.max_running = rows;
	sc.admit_group = rows;
	if (persistent)
		sc.batch_layout = BKV_BATCH_PERSISTENT;
	ops.forward = noop_forward;
	if (bkv_sched_create(&sc, p, &ops, NULL, NULL, &s) != BKV_OK)
		return 1;
	for (i = 0; i < rows; i++) {
		bkv_request q;

		for (uint32_t k = 0; k < ctx; k++)
			prompt[k] = (int32_t)(i * 131 + k + 1);
		bkv_request_init(&q);
		q.prompt = prompt;
		q.prompt_len = ctx;
		q.max_new_tokens = 100000;
		if (bkv_submit(s, &q, NULL) != BKV_OK)
			return 1;
	}
	free(prompt);
	for (i = 0; i < 300 + steps; i++) /* 300 warm-up steps, then measured */
		if (bkv_step(s, &si) != BKV_OK)
			return 1;
	printf("groups %u rows %u: %u steps\n", ng, rows, steps);
	bkv_sched_destroy(s);
	bkv_pool_destroy(p);
	return 0;
}

/* ---- the pool ------------------------------------------------------------- */

static int pool(uint32_t ng, uint32_t n)
{
	uint32_t n_groups;
	const bkv_kv_group *g = shape(ng, &n_groups);
	bkv_pool *p = make_pool(g, n_groups, 400000, 256);
	uint32_t seq[64], i, hit;
	int32_t tok[16];

	for (i = 0; i < 64; i++)
		bkv_seq_open(p, &seq[i]);
	for (i = 0; i < n; i++) {
		int32_t t = (int32_t)(i / 64);

		if (bkv_seq_append(p, seq[i % 64], &t, 1, NULL) != BKV_OK)
			return 1;
	}
	/* prefix hits: a fresh sequence re-reads sequence 0's blocks */
	for (i = 0; i < 16; i++)
		tok[i] = (int32_t)i;
	for (i = 0; i + 16 <= n / 64; i += 16) {
		uint32_t s2;

		bkv_seq_open(p, &s2);
		(void)bkv_seq_append(p, s2, tok, 16, &hit);
		bkv_seq_close(p, s2);
	}
	printf("groups %u: %u appends, check %d\n", ng, n, bkv_pool_check(p));
	bkv_pool_destroy(p);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "memory") == 0)
		return memory();
	if (argc >= 5 && strcmp(argv[1], "step") == 0)
		return step((uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]),
			    (uint32_t)atoi(argv[4]), argc >= 6 ? (uint32_t)atoi(argv[5]) : 64,
			    argc >= 7 && strcmp(argv[6], "persistent") == 0);
	if (argc >= 4 && strcmp(argv[1], "pool") == 0)
		return pool((uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]));
	fprintf(stderr, "usage: bench_groups memory | step G ROWS STEPS | pool G APPENDS\n");
	return 2;
}
