/*
 * bench_pool.c - micro benchmarks of the block pool.
 *
 * Measures, through the public API:
 *   alloc_free   block allocate + free, amortized per block: append 64 blocks'
 *                worth of tokens to a sequence, truncate it to 0 (prefix cache
 *                off, so every block comes from and returns to the free list).
 *                Run at block_tokens 16 (each block also copies 16 tokens) and
 *                1 (metadata only).
 *   malloc_free  the same operation done with malloc/free: per block, malloc a
 *                block-sized buffer, copy the block's tokens in, keep it in a
 *                table; then free them all.
 *   prefix_hit   append of a 2,048-token prompt whose every block is in the
 *                prefix cache (open, append, close), per block: chained hash,
 *                index probe, token-by-token verification, ref count. Both
 *                with the cached blocks pinned by another sequence and with
 *                them only on the LRU (each hit unlinks, each close relinks).
 *   miss_evict   (with iterations only: for callgrind) a 2,048-token prompt
 *                never seen (open, append, close) in a 1,024-block pool whose
 *                cache is full, per block: an eviction, fill, hash, index
 *                and release to the cache; miss_evict_value the same with
 *                eviction by value (a scheduler holds the pool with
 *                bkv_sched_config.evict = BKV_EVICT_VALUE).
 *   miss_demote  (with iterations only) miss_evict with a full host cache
 *                (bkv_pool_config.host_cache) taking every evicted block;
 *   host_hit     (with iterations only) a full prefix hit from the host
 *                cache, per block a reload, evicting blocks the host holds
 *                already.
 *   state_OP, state_OP_shared (with iterations only) OP in a pool that
 *                also has a recurrent-state group of 4 frames a unit: a
 *                fixed arena of 64 units, or (_shared) units sharing the
 *                frames with the blocks (bkv_pool_config.state_share,
 *                floor 0); each append also takes a state unit.
 *   metadata     bytes of pool memory per block and per token slot, as the
 *                pool reports them (bkv_pool_memory_get).
 *   scale        (bench_pool scale [blocks...]) the pool size as a dimension:
 *                at 1e4, 1e5, 1e6 and 1e7 device blocks (or those given),
 *                the pool is filled with cached 2,048-token prompts (blocks
 *                of 16), appended one block at a time over 1,024 sequences
 *                in a random order so that a prompt's blocks lie scattered
 *                over the block array. Then, per block: a full hit on a
 *                random one of them (open, append, close: cold when the
 *                pool is large), and a miss with eviction (a prompt never
 *                seen, every block evicted from the LRU head, filled and
 *                indexed). Prompts differ in their first token only: the
 *                chained hash still sends every block to its own random
 *                index slot, while the caller's tokens stay in the cache
 *                as a request's would. Timed on the thread's CPU clock,
 *                the best of 15 runs of 1,000 prompts.
 *
 * Each timing is the best of 7 runs. Usage: bench_pool [op iters] - with
 * arguments, runs one op for exactly `iters` iterations and prints nothing but
 * a checksum (for callgrind instruction counts: run twice with different iters
 * and divide the difference).
 */
#include <batchkv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCKS 64
#define PROMPT 2048

/* The clock timings read: wall time, except in scale mode, which reads the
 * thread's CPU time (on a shared machine a run descheduled for a while
 * would otherwise count the other programs' time). */
static clockid_t bench_clock = CLOCK_MONOTONIC;
static int bench_runs = 7; /* timed runs per figure, the best one kept */

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(bench_clock, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die(const char *what, int r)
{
	fprintf(stderr, "bench_pool: %s: %s\n", what, bkv_strerror(r));
	exit(1);
}

/* The "state_" ops: the pool also has a recurrent-state group of 4 frames
 * a unit (a fixed arena of 64 units on top of the blocks, or with
 * bench_share the units sharing the frames, floor 0). */
static int bench_state, bench_share;
static const bkv_kv_group state_groups[2] = {
	{BKV_GROUP_FULL, 1, 0, 0, 256},
	{BKV_GROUP_STATE, 1, 0, 0, 4 * 256 * 16},
};

static bkv_pool *make(uint32_t bt, uint32_t nb, int prefix)
{
	bkv_pool_config c;
	bkv_pool *p;
	int r;

	bkv_pool_config_init(&c);
	c.block_tokens = bt;
	c.device_blocks = nb;
	c.prefix_cache = prefix;
	if (bench_state) {
		c.n_groups = 2;
		c.groups = state_groups;
		c.state_share = (uint32_t)bench_share;
		c.state_units = bench_share ? 0 : 64;
		c.device_blocks += bench_share ? 0 : 64 * bkv_kv_state_frames(state_groups, 2, bt);
	}
	r = bkv_pool_create(&c, NULL, &p);
	if (r)
		die("create", r);
	return p;
}

static int32_t toks[PROMPT];
static volatile uint64_t sink;

/* ---- the operations, each run for n iterations --------------------------- */

static void op_alloc_free(bkv_pool *p, uint32_t seq, uint32_t bt, uint64_t n)
{
	uint64_t i;
	int r;

	for (i = 0; i < n; i++) {
		r = bkv_seq_append(p, seq, toks, BLOCKS * bt, NULL);
		if (r)
			die("append", r);
		r = bkv_seq_truncate(p, seq, 0);
		if (r)
			die("truncate", r);
	}
}

static void op_malloc_free(uint32_t bt, uint64_t n)
{
	void *table[BLOCKS];
	uint64_t i;
	uint32_t j;

	for (i = 0; i < n; i++) {
		for (j = 0; j < BLOCKS; j++) {
			table[j] = malloc((size_t)bt * sizeof(int32_t));
			if (!table[j])
				die("malloc", BKV_ENOMEM);
			memcpy(table[j], toks + (size_t)j * bt, (size_t)bt * sizeof(int32_t));
		}
		sink += (uintptr_t)table[i % BLOCKS];
		for (j = 0; j < BLOCKS; j++)
			free(table[j]);
	}
}

static void op_prefix_hit(bkv_pool *p, uint64_t n)
{
	uint64_t i;
	uint32_t seq, hit;
	int r;

	for (i = 0; i < n; i++) {
		r = bkv_seq_open(p, &seq);
		if (r)
			die("open", r);
		r = bkv_seq_append(p, seq, toks, PROMPT, &hit);
		if (r || hit != PROMPT)
			die("append (full hit)", r ? r : BKV_EINVAL);
		sink += hit;
		r = bkv_seq_close(p, seq);
		if (r)
			die("close", r);
	}
}

/* A 2,048-token prompt never seen before (its first token is new), appended
 * and closed: once the cache is full, each of its blocks is evicted from the
 * cache, filled, indexed and cached again at the close. */
static void op_miss_evict(bkv_pool *p, uint64_t n)
{
	static int32_t first = 1 << 30;
	uint64_t i;
	uint32_t seq, hit;
	int r;

	for (i = 0; i < n; i++) {
		toks[0] = first++;
		r = bkv_seq_open(p, &seq);
		if (r)
			die("open", r);
		r = bkv_seq_append(p, seq, toks, PROMPT, &hit);
		if (r || hit != 0)
			die("append (miss)", r ? r : BKV_EINVAL);
		r = bkv_seq_close(p, seq);
		if (r)
			die("close", r);
	}
	toks[0] = 0;
}

static int no_forward(void *host, const bkv_batch *b, int32_t *next)
{
	(void)host;
	(void)b;
	(void)next;
	return 0;
}

/* A pool of 1,024 blocks whose cache is full of such prompts; with `value`
 * a scheduler (never stepped) holds it with bkv_sched_config.evict =
 * BKV_EVICT_VALUE (its default cost model prices the blocks), so the pool
 * evicts by value; *s gets it (NULL for LRU). */
static bkv_pool *evict_pool(int value, bkv_sched **s)
{
	bkv_pool *p = make(16, 1024, 1);
	bkv_host_ops ops;
	bkv_sched_config c;
	int r;

	*s = NULL;
	if (value) {
		memset(&ops, 0, sizeof(ops));
		ops.forward = no_forward;
		bkv_sched_config_init(&c);
		c.evict = BKV_EVICT_VALUE;
		r = bkv_sched_create(&c, p, &ops, NULL, NULL, s);
		if (r)
			die("sched create", r);
	}
	op_miss_evict(p, 16);
	return p;
}

/* ---- the host cache (pool/hcache.c) ---------------------------------------- */

/* A pool of nb device blocks with a host cache of nh host blocks (no
 * scheduler: every evicted block is demoted). */
static bkv_pool *hc_make(uint32_t nb, uint32_t nh)
{
	bkv_pool_config c;
	bkv_pool *p;
	int r;

	bkv_pool_config_init(&c);
	c.block_tokens = 16;
	c.device_blocks = nb;
	c.host_blocks = nh;
	c.host_cache = 1;
	r = bkv_pool_create(&c, NULL, &p);
	if (r)
		die("create (host cache)", r);
	return p;
}

/* The host performed the copies. */
static void hc_clear(bkv_pool *p)
{
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
}

/* miss_demote: op_miss_evict in a 1,024-block pool whose full host cache
 * (2,048 blocks) takes every evicted block, dropping its own oldest: per
 * block an eviction, a swap-out copy, a host index insert and a host LRU
 * drop, besides the miss's fill, hash and index. */
static void run_miss_demote(uint64_t n)
{
	bkv_pool *p = hc_make(1024, 2048);
	uint64_t i;

	for (i = 0; i < 32 + n; i++) {
		op_miss_evict(p, 1);
		hc_clear(p);
	}
	bkv_pool_destroy(p);
}

/* host_hit: two 2,048-token prompts in a pool with room for one (128
 * device blocks), taken in turn: each append is a full hit from the host
 * cache (a reload per block: a swap-in copy and a device block) whose
 * takes evict the other prompt, which the host holds already (no copy). */
static void run_host_hit(uint64_t n)
{
	bkv_pool *p = hc_make(128, 1024);
	uint32_t seq, hit;
	uint64_t i;
	int r;

	for (i = 0; i < 4 + n; i++) {
		toks[0] = (int32_t)(i & 1);
		if ((r = bkv_seq_open(p, &seq)) || (r = bkv_seq_append(p, seq, toks, PROMPT, &hit)))
			die("append (host hit)", r);
		if (i >= 4 && hit != PROMPT)
			die("append (host hit): not every block came from the host", BKV_EINVAL);
		sink += hit;
		if ((r = bkv_seq_close(p, seq)))
			die("close", r);
		hc_clear(p);
	}
	toks[0] = 0;
	bkv_pool_destroy(p);
}

/* ---- timing -------------------------------------------------------------- */

typedef void (*run_fn)(void *ctx, uint64_t n);

static double best_ns(run_fn fn, void *ctx, uint64_t n, double per)
{
	double best = 1e300;
	int k;

	fn(ctx, n / 10 + 1); /* warm up */
	for (k = 0; k < bench_runs; k++) {
		double t0 = now_ns(), t;

		fn(ctx, n);
		t = (now_ns() - t0) / ((double)n * per);
		if (t < best)
			best = t;
	}
	return best;
}

typedef struct ctx {
	bkv_pool *p;
	uint32_t seq;
	uint32_t bt;
} ctx;

static void run_alloc_free(void *c, uint64_t n)
{
	ctx *x = c;

	op_alloc_free(x->p, x->seq, x->bt, n);
}

static void run_malloc_free(void *c, uint64_t n)
{
	ctx *x = c;

	op_malloc_free(x->bt, n);
}

static void run_prefix_hit(void *c, uint64_t n)
{
	ctx *x = c;

	op_prefix_hit(x->p, n);
}

static ctx alloc_ctx(uint32_t bt)
{
	ctx x;
	int r;

	x.bt = bt;
	x.p = make(bt, 4 * BLOCKS, 0);
	r = bkv_seq_open(x.p, &x.seq);
	if (r)
		die("open", r);
	return x;
}

/* A pool holding the prompt's 128 blocks in the cache; `pinned`: a sequence
 * keeps them referenced, else they sit on the LRU between iterations. */
static ctx hit_ctx(int pinned)
{
	ctx x;
	uint32_t seq;
	int r;

	x.bt = 16;
	x.p = make(16, 1024, 1);
	r = bkv_seq_open(x.p, &seq);
	if (!r)
		r = bkv_seq_append(x.p, seq, toks, PROMPT, NULL);
	if (!r && !pinned)
		r = bkv_seq_close(x.p, seq);
	if (r)
		die("prefix setup", r);
	x.seq = seq;
	return x;
}

/* ---- pool size as a dimension -------------------------------------------- */

#define SCALE_GROUP 1024u  /* sequences filled together, one block at a time */
#define SCALE_PROMPTS 1000u /* prompts per timed run */
#define SCALE_RUNS 15       /* timed runs per figure (the best is kept) */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void) /* splitmix64 */
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

typedef struct scale {
	bkv_pool *p;
	uint32_t prompts; /* prompts 0 .. prompts-1 are cached */
	uint32_t next;    /* the next never-seen prompt */
} scale;

/* Prompt q: the common tokens with the first one replaced by q. */
static void prompt(uint32_t q)
{
	toks[0] = (int32_t)q;
}

/* A pool of nb blocks full of cached prompts, their blocks scattered. */
static scale scale_ctx(uint32_t nb)
{
	static uint32_t seqs[SCALE_GROUP], order[SCALE_GROUP];
	scale x;
	uint32_t base, g, r, j;
	int rc;

	x.p = make(16, nb, 1);
	x.prompts = nb / (PROMPT / 16);
	for (base = 0; base < x.prompts; base += g) {
		g = x.prompts - base < SCALE_GROUP ? x.prompts - base : SCALE_GROUP;
		for (j = 0; j < g; j++) {
			order[j] = j;
			if ((rc = bkv_seq_open(x.p, &seqs[j])))
				die("scale open", rc);
		}
		for (r = 0; r < PROMPT / 16; r++) {
			for (j = g; j > 1; j--) { /* Fisher-Yates */
				uint32_t i = (uint32_t)(rnd() % j), t = order[j - 1];

				order[j - 1] = order[i];
				order[i] = t;
			}
			for (j = 0; j < g; j++) {
				prompt(base + order[j]);
				rc = bkv_seq_append(x.p, seqs[order[j]], toks + r * 16, 16, NULL);
				if (rc)
					die("scale fill", rc);
			}
		}
		for (j = 0; j < g; j++)
			if ((rc = bkv_seq_close(x.p, seqs[j])))
				die("scale close", rc);
	}
	x.next = x.prompts;
	return x;
}

/* Open, append prompt q, close; the hit tokens. */
static uint32_t scale_once(bkv_pool *p, uint32_t q)
{
	uint32_t seq, hit;
	int r;

	prompt(q);
	r = bkv_seq_open(p, &seq);
	if (!r)
		r = bkv_seq_append(p, seq, toks, PROMPT, &hit);
	if (!r)
		r = bkv_seq_close(p, seq);
	if (r)
		die("scale append", r);
	return hit;
}

static void run_scale_hit(void *c, uint64_t n)
{
	scale *x = c;
	uint64_t i;

	for (i = 0; i < n; i++)
		if (scale_once(x->p, (uint32_t)(rnd() % x->prompts)) != PROMPT)
			die("scale hit", BKV_EINVAL);
}

static void run_scale_miss(void *c, uint64_t n)
{
	scale *x = c;
	uint64_t i;

	for (i = 0; i < n; i++)
		if (scale_once(x->p, x->next++) != 0)
			die("scale miss", BKV_EINVAL);
}

static void scale_row(uint32_t nb)
{
	scale x = scale_ctx(nb);
	double hit, miss;

	/* hits first: misses evict cached prompts */
	hit = best_ns(run_scale_hit, &x, SCALE_PROMPTS, PROMPT / 16);
	miss = best_ns(run_scale_miss, &x, SCALE_PROMPTS, PROMPT / 16);
	printf("| %u | %.1f | %.1f |\n", nb, hit, miss);
	fflush(stdout);
	bkv_pool_destroy(x.p);
}

/* Control bytes per block and per token slot, from the pool's own report
 * (bkv_pool_memory_get): the block record, its share of the hash index, the
 * checker's scratch and (with the prefix cache) the transaction queue, then
 * the same with the token store. */
static void metadata(uint32_t bt, uint32_t nb)
{
	bkv_pool *p = make(bt, nb, 1);
	bkv_pool_memory m = {.size = sizeof(m)};
	double per_block_ctl, tok, index, scratch, txn;
	char txs[32] = "";
	int r = bkv_pool_memory_get(p, &m);

	if (r)
		die("memory", r);
	tok = (double)m.device_tokens / nb;
	index = (double)m.index / nb;
	scratch = (double)m.check_scratch / nb;
	txn = (double)m.txn_queue / nb;
	if (m.txn_queue)
		snprintf(txs, sizeof txs, " + %.0f B txn queue", txn);
	per_block_ctl = m.block_bytes + index + scratch + txn;
	printf("metadata (block_tokens %u, %u blocks; bkv_pool_memory_get): %u B block record + "
	       "%.1f B index + %.0f B checker scratch%s = %.1f B/block control, %.2f B/token "
	       "slot; with the %.0f B token store: %.1f B/block, %.2f B/token slot\n",
	       bt, nb, m.block_bytes, index, scratch, txs, per_block_ctl,
	       per_block_ctl / bt, tok, per_block_ctl + tok, (per_block_ctl + tok) / bt);
	bkv_pool_destroy(p);
}

int main(int argc, char **argv)
{
	uint32_t i;

	for (i = 0; i < PROMPT; i++)
		toks[i] = (int32_t)(i * 2654435761u >> 8);

	if (argc >= 2 && !strcmp(argv[1], "scale")) {
		static const uint32_t sizes[] = {10000, 100000, 1000000, 10000000};
		int k;

		bench_clock = CLOCK_THREAD_CPUTIME_ID;
		bench_runs = SCALE_RUNS;
		printf("| device blocks | full hit, ns/block | miss with eviction, ns/block |\n"
		       "|---:|---:|---:|\n");
		if (argc == 2)
			for (k = 0; k < 4; k++)
				scale_row(sizes[k]);
		for (k = 2; k < argc; k++)
			scale_row((uint32_t)strtoul(argv[k], NULL, 10));
		return 0;
	}
	if (argc == 3) {
		uint64_t n = strtoull(argv[2], NULL, 10);
		ctx x;

		if (!strncmp(argv[1], "state_", 6)) { /* state_OP, state_OP_shared */
			size_t l = strlen(argv[1]);

			bench_state = 1;
			bench_share = l > 7 && !strcmp(argv[1] + l - 7, "_shared");
			argv[1] += 6;
			if (bench_share)
				argv[1][l - 13] = 0;
		}

		if (!strcmp(argv[1], "alloc_free")) {
			x = alloc_ctx(16);
			run_alloc_free(&x, n);
		} else if (!strcmp(argv[1], "alloc_free1")) {
			x = alloc_ctx(1);
			run_alloc_free(&x, n);
		} else if (!strcmp(argv[1], "malloc_free")) {
			x.bt = 16;
			run_malloc_free(&x, n);
		} else if (!strcmp(argv[1], "prefix_hit")) {
			x = hit_ctx(1);
			run_prefix_hit(&x, n);
		} else if (!strcmp(argv[1], "prefix_hit_lru")) {
			x = hit_ctx(0);
			run_prefix_hit(&x, n);
		} else if (!strcmp(argv[1], "miss_evict") || !strcmp(argv[1], "miss_evict_value")) {
			bkv_sched *s;
			bkv_pool *p = evict_pool(argv[1][10] != 0, &s);

			op_miss_evict(p, n);
			bkv_sched_destroy(s);
			bkv_pool_destroy(p);
		} else if (!strcmp(argv[1], "miss_demote")) {
			run_miss_demote(n);
		} else if (!strcmp(argv[1], "host_hit")) {
			run_host_hit(n);
		} else {
			fprintf(stderr, "usage: bench_pool [[state_]alloc_free[_shared]|alloc_free1|"
					"malloc_free|prefix_hit|prefix_hit_lru|miss_evict|miss_evict_value|"
					"miss_demote|host_hit iters]\n");
			return 2;
		}
		printf("%llu\n", (unsigned long long)sink);
		return 0;
	}

	{
		ctx a16 = alloc_ctx(16), a1 = alloc_ctx(1), hp = hit_ctx(1), hl = hit_ctx(0);
		double t16, t1, m16, m1, h, hlru;

		t16 = best_ns(run_alloc_free, &a16, 20000, BLOCKS);
		m16 = best_ns(run_malloc_free, &a16, 20000, BLOCKS);
		t1 = best_ns(run_alloc_free, &a1, 20000, BLOCKS);
		m1 = best_ns(run_malloc_free, &a1, 20000, BLOCKS);
		h = best_ns(run_prefix_hit, &hp, 2000, PROMPT / 16);
		hlru = best_ns(run_prefix_hit, &hl, 2000, PROMPT / 16);
		printf("block alloc+free, block_tokens 16: %.1f ns/block; malloc/free: %.1f "
		       "ns/block; pool/malloc = %.2f\n",
		       t16, m16, t16 / m16);
		printf("block alloc+free, block_tokens 1:  %.1f ns/block; malloc/free: %.1f "
		       "ns/block; pool/malloc = %.2f\n",
		       t1, m1, t1 / m1);
		printf("2,048-token prompt, full prefix hit (128 blocks of 16), pinned: %.1f "
		       "ns/block; pool/malloc(16) = %.2f\n",
		       h, h / m16);
		printf("2,048-token prompt, full prefix hit (128 blocks of 16), on LRU: %.1f "
		       "ns/block; pool/malloc(16) = %.2f\n",
		       hlru, hlru / m16);
		metadata(16, 1u << 16);
		metadata(16, 1000);
		metadata(1, 1u << 16);
		bkv_pool_destroy(a16.p);
		bkv_pool_destroy(a1.p);
		bkv_pool_destroy(hp.p);
		bkv_pool_destroy(hl.p);
	}
	return 0;
}
