/*
 * test_pool_alloc.c - the pool's memory behaviour and its input checking.
 *
 * pool_alloc: a counting allocator (Lua's ltests idea). First, a scenario that
 * makes every kind of allocation the pool does (create, block-table growth,
 * fork, copy-list growth) is run once to count them; then it is rerun once per
 * allocation N with allocation N failing: the failing call must return
 * BKV_ENOMEM, change nothing (stats compared, checker clean) and, after
 * destroy, no byte may be left allocated. A warm steady-state workload must
 * make no allocation at all.
 *
 * pool_input: bad arguments each get their documented code and change nothing.
 */
#include <criterion/criterion.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool_util.h"

/* ---- a counting, failing allocator --------------------------------------- */

typedef struct counter {
	uint64_t calls;   /* alloc + realloc calls */
	uint64_t fail_at; /* 1-based call to fail; 0 = never */
	int failed;       /* the failing call happened */
	int64_t bytes;    /* live bytes, by the sizes the pool passes back */
	int64_t blocks;   /* live allocations */
} counter;

static void *c_alloc(void *ud, size_t size)
{
	counter *c = ud;
	void *p;

	cr_assert_gt(size, 0);
	if (++c->calls == c->fail_at) {
		c->failed = 1;
		return NULL;
	}
	p = malloc(size);
	if (p) {
		c->bytes += (int64_t)size;
		c->blocks++;
	}
	return p;
}

static void *c_realloc(void *ud, void *p, size_t old_size, size_t size)
{
	counter *c = ud;
	void *q;

	cr_assert_gt(size, 0);
	cr_assert_gt(old_size, 0);
	if (++c->calls == c->fail_at) {
		c->failed = 1;
		return NULL;
	}
	q = realloc(p, size);
	if (q)
		c->bytes += (int64_t)size - (int64_t)old_size;
	return q;
}

static void c_free(void *ud, void *p, size_t size)
{
	counter *c = ud;

	if (!p)
		return;
	cr_assert_gt(size, 0);
	c->bytes -= (int64_t)size;
	c->blocks--;
	free(p);
}

static bkv_allocator counting(counter *c)
{
	bkv_allocator a = {c_alloc, c_realloc, c_free, c};

	return a;
}

/* ---- the failing-allocation scenario ------------------------------------- */

/* Run one call; on BKV_ENOMEM require that the allocator failed during it and
 * that nothing changed, then stop the scenario. */
#define STEP(expr, want)                                                              \
	do {                                                                          \
		bkv_pool_stats before_ = pool_stats(p);                               \
		int r_ = (expr);                                                      \
		if (r_ == BKV_ENOMEM) {                                               \
			cr_assert(c->failed, "ENOMEM without a failed allocation");   \
			expect_same_stats(&before_, p);                               \
			goto out;                                                     \
		}                                                                     \
		cr_assert_eq(r_, (want), "%s returned %d", #expr, r_);                \
		cr_assert_not(c->failed, "%s hid a failed allocation", #expr);        \
		cr_assert_eq(bkv_pool_check(p), 0);                                   \
	} while (0)

/* Returns 1 when it ran to the end. */
static int scenario(counter *c)
{
	bkv_allocator a = counting(c);
	bkv_pool_config cfg;
	bkv_pool *p = NULL;
	uint32_t s, f, k, i;
	int32_t t[200];
	int done = 0, r;

	bkv_pool_config_init(&cfg);
	cfg.block_tokens = 2;
	cfg.device_blocks = 128;
	cfg.host_blocks = 16;
	cfg.max_seqs = 4;
	fill_tokens(t, 200, 1);
	r = bkv_pool_create(&cfg, &a, &p);
	if (r == BKV_ENOMEM) {
		cr_assert(c->failed);
		cr_assert_null(p);
		return 0;
	}
	cr_assert_eq(r, BKV_OK);
	STEP(bkv_seq_open(p, &s), BKV_OK);
	/* table growth 4 -> 8 -> 16 -> 32 -> 64 */
	for (i = 0; i < 10; i++)
		STEP(bkv_seq_append(p, s, t + 12 * i, 12, NULL), BKV_OK);
	STEP(bkv_seq_append(p, s, t, 1, NULL), BKV_OK); /* partial last block */
	/* 20 copy-on-write copies without a clear: the device list (16 at
	 * first) grows; each fork's table is allocated once per slot */
	for (i = 0; i < 20; i++) {
		STEP(bkv_seq_fork(p, s, &f), BKV_OK);
		STEP(bkv_seq_append(p, f, t, 1, NULL), BKV_OK);
		STEP(bkv_seq_close(p, f), BKV_OK);
	}
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	/* 18 swap-out copies without a clear: that list grows too */
	STEP(bkv_seq_open(p, &k), BKV_OK);
	STEP(bkv_seq_append(p, k, t + 100, 5, NULL), BKV_OK);
	for (i = 0; i < 6; i++) {
		STEP(bkv_seq_swap_out(p, k), BKV_OK);
		STEP(bkv_seq_swap_in(p, k), BKV_OK);
		bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	}
	STEP(bkv_seq_close(p, s), BKV_OK);
	STEP(bkv_seq_drop(p, k), BKV_OK);
	done = 1;
out:
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
	return done;
}

Test(pool_alloc, every_failed_allocation_is_enomem_with_nothing_changed_or_leaked)
{
	counter c0 = {0};
	uint64_t total, n;

	cr_assert_eq(scenario(&c0), 1);
	cr_assert_eq(c0.bytes, 0);
	cr_assert_eq(c0.blocks, 0);
	total = c0.calls;
	/* create's arrays + 5 table growths + one table per forked slot +
	 * copy-list growths: the scenario must reach beyond create */
	cr_assert_gt(total, 14, "only %llu allocations", (unsigned long long)total);
	for (n = 1; n <= total; n++) {
		counter c = {0};

		c.fail_at = n;
		cr_assert_eq(scenario(&c), 0, "failing allocation %llu went unnoticed",
			     (unsigned long long)n);
		cr_assert(c.failed);
		cr_assert_eq(c.bytes, 0, "allocation %llu failing leaked %lld bytes",
			     (unsigned long long)n, (long long)c.bytes);
		cr_assert_eq(c.blocks, 0);
	}
	cr_log_info("%llu allocation points each failed once", (unsigned long long)total);
}

/* One round of a serving-like workload: a prompt sharing a prefix, two
 * sampled branches decoding (copy-on-write on the first write), a swap out
 * and in, copies cleared as a host would, everything closed. */
static void round_trip(bkv_pool *p, uint32_t i)
{
	int32_t t[96];
	uint32_t s, b[2], j, k, hit;

	fill_tokens(t, 96, 1000);
	t[90] = (int32_t)i; /* a private tail */
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 95, &hit), BKV_OK);
	for (k = 0; k < 2; k++)
		cr_assert_eq(bkv_seq_fork(p, s, &b[k]), BKV_OK);
	for (j = 0; j < 40; j++)
		for (k = 0; k < 2; k++)
			cr_assert_eq(bkv_seq_append(p, b[k], (int32_t[]){(int32_t)j}, 1, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_truncate(p, b[0], 100), BKV_OK);
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	cr_assert_eq(bkv_seq_swap_out(p, b[1]), BKV_OK);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(bkv_seq_swap_in(p, b[1]), BKV_OK);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	cr_assert_eq(bkv_seq_close(p, b[0]), BKV_OK);
	cr_assert_eq((i & 1) ? bkv_seq_drop(p, b[1]) : bkv_seq_close(p, b[1]), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
}

Test(pool_alloc, a_warm_pool_allocates_nothing)
{
	counter c = {0};
	bkv_allocator a = counting(&c);
	bkv_pool_config cfg;
	bkv_pool *p;
	uint64_t warm;
	uint32_t i;

	bkv_pool_config_init(&cfg);
	cfg.block_tokens = 16;
	cfg.device_blocks = 64;
	cfg.host_blocks = 32;
	cfg.max_seqs = 8;
	cr_assert_eq(bkv_pool_create(&cfg, &a, &p), BKV_OK);
	for (i = 0; i < 20; i++)
		round_trip(p, i);
	warm = c.calls;
	for (i = 20; i < 2000; i++)
		round_trip(p, i);
	cr_assert_eq(c.calls, warm, "%llu allocations in steady state",
		     (unsigned long long)(c.calls - warm));
	cr_assert_gt(pool_stats(p).hit_tokens, 0);
	cr_assert_gt(pool_stats(p).cow_copies, 0);
	cr_assert_gt(pool_stats(p).evictions, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
	cr_assert_eq(c.bytes, 0);
	cr_assert_eq(c.blocks, 0);
}

/* ---- bad input ----------------------------------------------------------- */

Test(pool_input, create_refuses_bad_configs)
{
	bkv_pool_config c;
	bkv_pool *p = (bkv_pool *)(uintptr_t)0x1;
	struct {
		const char *what;
		size_t off;
		uint32_t value;
	} bad[] = {
		{"size 0", offsetof(bkv_pool_config, size), 0},
		{"size too small", offsetof(bkv_pool_config, size), sizeof c - 1},
		{"block_tokens 0", offsetof(bkv_pool_config, block_tokens), 0},
		{"block_tokens 3", offsetof(bkv_pool_config, block_tokens), 3},
		{"block_tokens 24", offsetof(bkv_pool_config, block_tokens), 24},
		{"block_tokens 2^17", offsetof(bkv_pool_config, block_tokens), 1u << 17},
		{"device_blocks 0", offsetof(bkv_pool_config, device_blocks), 0},
		{"device_blocks 2^30+1", offsetof(bkv_pool_config, device_blocks), (1u << 30) + 1},
		{"host_blocks 2^30+1", offsetof(bkv_pool_config, host_blocks), (1u << 30) + 1},
		{"max_seqs 0", offsetof(bkv_pool_config, max_seqs), 0},
		{"max_seqs 2^20+1", offsetof(bkv_pool_config, max_seqs), (1u << 20) + 1},
		{"watermark > blocks", offsetof(bkv_pool_config, watermark_blocks), 9},
		{"reserved", offsetof(bkv_pool_config, reserved), 1},
		{"host_cache 2", offsetof(bkv_pool_config, host_cache), 2},
		{"host_cache without a host tier", offsetof(bkv_pool_config, host_cache), 1},
		{"pin_permille 1001", offsetof(bkv_pool_config, pin_permille), 1001},
	};
	size_t i;

	for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		bkv_pool_config_init(&c);
		c.device_blocks = 8;
		memcpy((char *)&c + bad[i].off, &bad[i].value, sizeof(uint32_t));
		cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL, "%s", bad[i].what);
		cr_assert_eq(p, (bkv_pool *)(uintptr_t)0x1, "%s: out touched", bad[i].what);
	}
	bkv_pool_config_init(&c);
	c.device_blocks = 8;
	cr_assert_eq(bkv_pool_create(NULL, NULL, &p), BKV_EINVAL);
	cr_assert_eq(bkv_pool_create(&c, NULL, NULL), BKV_EINVAL);
	/* the extremes that are valid */
	c.block_tokens = 65536;
	c.device_blocks = 1;
	c.watermark_blocks = 1;
	c.max_seqs = 1;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	bkv_pool_destroy(p);
	bkv_pool_config_init(NULL);
	bkv_pool_destroy(NULL);
}

Test(pool_input, config_init_fills_the_documented_defaults)
{
	bkv_pool_config c;

	memset(&c, 0xab, sizeof c);
	bkv_pool_config_init(&c);
	cr_assert_eq(c.size, sizeof c);
	cr_assert_eq(c.block_tokens, 16);
	cr_assert_eq(c.device_blocks, 0);
	cr_assert_eq(c.host_blocks, 0);
	cr_assert_eq(c.max_seqs, 1024);
	cr_assert_eq(c.watermark_blocks, 0);
	cr_assert_eq(c.prefix_cache, 1);
	cr_assert_eq(c.hash_seed, 0);
	cr_assert_eq(c.event_capacity, 0);
	cr_assert_eq(c.pin_permille, 0);
	cr_assert_eq(c.host_cache, 0);
	cr_assert_eq(c.reserved, 0);
}

Test(pool_input, null_pool_is_einval_everywhere)
{
	uint32_t s = 1u << 20, n = 5;
	int32_t t[1] = {1};
	const bkv_copy *cp = (const bkv_copy *)t;
	bkv_seq_info info;
	bkv_pool_stats st;

	cr_assert_eq(bkv_seq_open(NULL, &s), BKV_EINVAL);
	cr_assert_eq(bkv_seq_open_keyed(NULL, 3, &s), BKV_EINVAL);
	cr_assert_eq(bkv_seq_append(NULL, s, t, 1, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_seq_blocks_needed(NULL, s, 1), BKV_EINVAL);
	cr_assert_eq(bkv_seq_truncate(NULL, s, 0), BKV_EINVAL);
	cr_assert_eq(bkv_seq_fork(NULL, s, &s), BKV_EINVAL);
	cr_assert_eq(bkv_seq_close(NULL, s), BKV_EINVAL);
	cr_assert_eq(bkv_seq_drop(NULL, s), BKV_EINVAL);
	cr_assert_null(bkv_seq_blocks(NULL, s, &n));
	cr_assert_eq(n, 0);
	cr_assert_eq(bkv_seq_info_get(NULL, s, &info), BKV_EINVAL);
	cr_assert_eq(bkv_seq_swap_out(NULL, s), BKV_EINVAL);
	cr_assert_eq(bkv_seq_swap_in(NULL, s), BKV_EINVAL);
	cr_assert_eq(bkv_pool_pending_copies(NULL, BKV_COPY_DEVICE, &cp), 0);
	cr_assert_null(cp);
	bkv_pool_clear_copies(NULL, BKV_COPY_DEVICE);
	cr_assert_eq(bkv_pool_available(NULL), 0);
	cr_assert_eq(bkv_pool_can_admit(NULL, 1), 0);
	cr_assert_eq(bkv_pool_reset_cache(NULL), BKV_EINVAL);
	cr_assert_eq(bkv_pool_check(NULL), BKV_EINVAL);
	memset(&st, 0xab, sizeof st);
	st.size = 0;
	bkv_pool_stats_get(NULL, &st);
	cr_assert_eq(st.size, sizeof st);
	cr_assert_eq(st.nr_free, 0);
	cr_assert_eq(st.swap_in_blocks, 0);
	bkv_pool_stats_get(NULL, NULL);
}

Test(pool_input, bad_arguments_change_nothing)
{
	bkv_pool *p = make_pool(4, 8, 4, 0);
	uint32_t a, closed, n = 9, hit = 7;
	int32_t t[8];
	const bkv_copy *cp = (const bkv_copy *)t;
	bkv_pool_stats before;
	bkv_seq_info info;
	uint32_t unknown[] = {0, 12345, 63, 64 | (1u << 20), 0xffffffffu, 0};
	size_t i;

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 6, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &closed), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, closed), BKV_OK);
	unknown[5] = closed;
	before = pool_stats(p);

	cr_assert_eq(bkv_seq_open(p, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_seq_open_keyed(p, 1, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_seq_fork(p, a, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_seq_info_get(p, a, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_seq_append(p, a, NULL, 1, &hit), BKV_EINVAL);
	cr_assert_eq(hit, 7);
	cr_assert_eq(bkv_seq_truncate(p, a, 7), BKV_EINVAL);
	/* appends past capacity, refused before a token is read */
	cr_assert_eq(bkv_seq_append(p, a, t, 27, NULL), BKV_E2BIG);
	cr_assert_eq(bkv_seq_append(p, a, t, 0x80000000u, NULL), BKV_E2BIG);
	cr_assert_eq(bkv_seq_append(p, a, t, UINT32_MAX, NULL), BKV_E2BIG);
	cr_assert_eq(bkv_pool_pending_copies(p, (bkv_copy_kind)3, &cp), 0);
	cr_assert_null(cp);
	bkv_pool_clear_copies(p, (bkv_copy_kind)7);
	for (i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
		uint32_t id = unknown[i], out = 77;

		cr_assert_eq(bkv_seq_append(p, id, t, 1, NULL), BKV_ENOENT, "id %#x", id);
		cr_assert_eq(bkv_seq_append(p, id, t, 0, NULL), BKV_ENOENT);
		cr_assert_eq(bkv_seq_blocks_needed(p, id, 1), BKV_ENOENT);
		cr_assert_eq(bkv_seq_truncate(p, id, 0), BKV_ENOENT);
		cr_assert_eq(bkv_seq_fork(p, id, &out), BKV_ENOENT);
		cr_assert_eq(out, 77);
		cr_assert_eq(bkv_seq_close(p, id), BKV_ENOENT);
		cr_assert_eq(bkv_seq_drop(p, id), BKV_ENOENT);
		cr_assert_eq(bkv_seq_info_get(p, id, &info), BKV_ENOENT);
		cr_assert_eq(bkv_seq_swap_out(p, id), BKV_ENOENT);
		cr_assert_eq(bkv_seq_swap_in(p, id), BKV_ENOENT);
		n = 9;
		cr_assert_null(bkv_seq_blocks(p, id, &n));
		cr_assert_eq(n, 0);
	}
	cr_assert_eq(bkv_seq_swap_in(p, a), BKV_ESTATE); /* not swapped */
	expect_same_stats(&before, p);
	expect_table(p, a, (int32_t[]){0, 1}, 2);
	expect_len(p, a, 6);
	/* a zero-token append is a no-op, even with NULL tokens */
	hit = 5;
	cr_assert_eq(bkv_seq_append(p, a, NULL, 0, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	expect_same_stats(&before, p);
	bkv_pool_destroy(p);
}

Test(pool_input, stats_fill_only_the_size_the_caller_knows)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	bkv_pool_stats st;
	uint32_t a;
	int32_t t[5] = {1, 2, 3, 4, 5};

	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 5, NULL), BKV_OK);
	memset(&st, 0xab, sizeof st);
	st.size = offsetof(bkv_pool_stats, nr_used);
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.size, offsetof(bkv_pool_stats, nr_used));
	cr_assert_eq(st.block_tokens, 4);
	cr_assert_eq(st.nr_free, 6);
	cr_assert_eq(st.nr_used, 0xabababab);
	memset(&st, 0xab, sizeof st);
	st.size = 0;
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.size, sizeof st);
	cr_assert_eq(st.nr_used, 2);
	cr_assert_eq(st.tokens, 5);
	cr_assert_eq(st.waste_slots, 3);
	cr_assert_eq(st.miss_tokens, 5);
	cr_assert_eq(st.nr_seqs, 1);
	bkv_pool_destroy(p);
}

/* An allocator that refuses every call: a create that gets past validation
 * answers BKV_ENOMEM without touching gigabytes, one refused by validation
 * answers BKV_EINVAL and never calls it. */
static void *refuse_alloc(void *ud, size_t size)
{
	(void)size;
	++*(uint64_t *)ud;
	return NULL;
}

static void *refuse_realloc(void *ud, void *p, size_t old_size, size_t size)
{
	(void)p;
	(void)old_size;
	(void)size;
	++*(uint64_t *)ud;
	return NULL;
}

static void refuse_free(void *ud, void *p, size_t size)
{
	(void)ud;
	(void)size;
	cr_assert_null(p);
}

Test(pool_input, pool_create_refuses_more_than_2_31_token_slots)
{
	static const uint32_t bts[] = {2, 4, 16, 1024, 65536};
	uint64_t calls = 0;
	bkv_allocator a = {refuse_alloc, refuse_realloc, refuse_free, &calls};
	bkv_pool_config c;
	bkv_pool *p = (bkv_pool *)(uintptr_t)0x1;
	size_t i;

	cr_assert_eq(BKV_MAX_TOKEN_SLOTS, 1ull << 31);
	for (i = 0; i < sizeof bts / sizeof bts[0]; i++) {
		uint32_t most = (uint32_t)(BKV_MAX_TOKEN_SLOTS / bts[i]);

		bkv_pool_config_init(&c);
		c.block_tokens = bts[i];
		c.device_blocks = most > (1u << 30) ? (1u << 30) : most;
		calls = 0;
		/* the largest geometry passes validation (then memory runs out) */
		cr_assert_eq(bkv_pool_create(&c, &a, &p), BKV_ENOMEM, "bt %u", bts[i]);
		cr_assert_gt(calls, 0);
		if (most > (1u << 30))
			continue; /* bt 2: device_blocks' own bound comes first */
		/* one block more is 2^31 + bt slots: the last slot would not fit
		 * an int32_t slot_mapping entry */
		c.device_blocks = most + 1;
		calls = 0;
		cr_assert_eq(bkv_pool_create(&c, &a, &p), BKV_EINVAL, "bt %u", bts[i]);
		cr_assert_eq(calls, 0, "bt %u: refused after allocating", bts[i]);
		cr_assert_eq(p, (bkv_pool *)(uintptr_t)0x1);
	}
	/* the host tier is named by block id only: its geometry is not bound */
	bkv_pool_config_init(&c);
	c.block_tokens = 65536;
	c.device_blocks = 1;
	c.host_blocks = 1u << 20; /* 2^36 host token slots */
	calls = 0;
	cr_assert_eq(bkv_pool_create(&c, &a, &p), BKV_ENOMEM);
}

Test(pool_input, blocks_needed_counts_past_2_32_blocks)
{
	/* block_tokens 1: len + n passes 2^32 and must not wrap to a small or
	 * negative count (which would read as an error code) */
	bkv_pool *p = make_pool(1, 8, 0, 0);
	int32_t t[3] = {1, 2, 3};
	uint32_t a;

	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 3, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_blocks_needed(p, a, UINT32_MAX), (int64_t)UINT32_MAX);
	cr_assert_eq(bkv_seq_blocks_needed(p, a, UINT32_MAX - 2), (int64_t)UINT32_MAX - 2);
	bkv_pool_destroy(p);
	p = make_pool(2, 8, 0, 0);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 2, NULL), BKV_OK);
	/* ceil((2 + 2^32 - 1) / 2) = 2^31 + 1 blocks, minus the one held */
	cr_assert_eq(bkv_seq_blocks_needed(p, a, UINT32_MAX), (int64_t)1 << 31);
	bkv_pool_destroy(p);
}
