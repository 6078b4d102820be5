/*
 * test_inspect.c - the pool's inspection calls: bkv_pool_memory_get reports
 * the bytes the pool's allocator holds, structure by structure, and
 * bkv_block_info_get reports each block as the pool's own records hold it
 * (read here through lib/internal.h). Bad input answers BKV_EINVAL and
 * touches neither the output nor the pool.
 */
#include "internal.h"
#include "pool_util.h"

#include <stdlib.h>

/* ---- a counting allocator ------------------------------------------------ */

static int64_t live; /* bytes, by the sizes the pool passes back */

static void *c_alloc(void *ud, size_t size)
{
	void *p = malloc(size);

	(void)ud;
	if (p)
		live += (int64_t)size;
	return p;
}

static void *c_realloc(void *ud, void *p, size_t old_size, size_t size)
{
	void *q = realloc(p, size);

	(void)ud;
	if (q)
		live += (int64_t)size - (int64_t)old_size;
	return q;
}

static void c_free(void *ud, void *p, size_t size)
{
	(void)ud;
	if (p)
		live -= (int64_t)size;
	free(p);
}

static bkv_pool *make_counted(uint32_t bt, uint32_t nb, uint32_t nh, int prefix, uint32_t events)
{
	bkv_allocator a = {c_alloc, c_realloc, c_free, NULL};
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = bt;
	c.device_blocks = nb;
	c.host_blocks = nh;
	c.max_seqs = 16;
	c.prefix_cache = prefix;
	c.event_capacity = events;
	cr_assert_eq(bkv_pool_create(&c, &a, &p), BKV_OK);
	return p;
}

static bkv_pool_memory memory(const bkv_pool *p)
{
	bkv_pool_memory m;

	memset(&m, 0, sizeof m);
	m.size = sizeof m;
	cr_assert_eq(bkv_pool_memory_get(p, &m), BKV_OK);
	return m;
}

static bkv_block_info block(const bkv_pool *p, int32_t b)
{
	bkv_block_info bi;

	memset(&bi, 0, sizeof bi);
	bi.size = sizeof bi;
	cr_assert_eq(bkv_block_info_get(p, b, &bi), BKV_OK, "block %d", b);
	return bi;
}

/* ---- bkv_pool_memory_get ------------------------------------------------- */

Test(inspect, memory_figures_are_the_pools_allocations)
{
	bkv_pool *p = make_counted(16, 1000, 24, 1, 64);
	bkv_pool_memory m = memory(p);
	uint64_t tables = 0, copies = 0;
	uint32_t i;

	for (i = 0; i < p->cfg.max_seqs; i++)
		tables += p->seqs[i].cap;
	for (i = 0; i < 3; i++)
		copies += p->copies[i].cap;
	cr_assert_eq(m.size, sizeof m);
	cr_assert_eq(m.block_bytes, sizeof(bkv__block));
	cr_assert_eq(m.seq_slot_bytes, sizeof(bkv__seq) + sizeof(uint32_t));
	cr_assert_eq(m.index_slots, 2048); /* the power of two >= 2 x 1000 */
	cr_assert_eq(m.index_slots, p->kv.index_mask + 1);
	cr_assert_eq(m.index_used, 0);
	cr_assert_eq(m.reserved, 0);
	cr_assert_eq(m.blocks, 1000 * sizeof(bkv__block));
	cr_assert_eq(m.device_tokens, 1000 * 16 * 4 + 64); /* + alignment slack */
	/* {block, tag} per slot; the LRU: 2 x (1000 / 17) + 3 chunks of 16
	 * slots (4 B) and a 12 B record, a sentinel record, alignment slack */
	cr_assert_eq(m.index, 2048 * 8 + 119 * (16 * 4 + 12) + 12 + 64);
	cr_assert_eq(m.txn_queue, 1000 * 4);
	cr_assert_eq(m.txn_owners, 1000 * 8);
	cr_assert_eq(m.check_scratch, 1000 * 4);
	cr_assert_eq(m.host, 24 * (4 + 1 + 16 * 4));
	cr_assert_eq(m.seq_slots, 16 * m.seq_slot_bytes);
	cr_assert_eq(m.block_tables, tables * 4);
	cr_assert_eq(m.copy_lists, copies * sizeof(bkv_copy));
	cr_assert_eq(m.event_ring, 64 * sizeof(bkv_kv_event));
	cr_assert_eq((int64_t)m.total, live, "total %llu, allocator holds %lld",
		     (unsigned long long)m.total, (long long)live);
	bkv_pool_destroy(p);
	cr_assert_eq(live, 0);
}

Test(inspect, memory_total_follows_tables_that_grow)
{
	bkv_pool *p = make_counted(4, 256, 0, 1, 0);
	int32_t t[600];
	uint32_t s1, s2;
	bkv_pool_memory before = memory(p), after;

	fill_tokens(t, 600, 1);
	cr_assert_eq(bkv_seq_open(p, &s1), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s1, t, 600, NULL), BKV_OK); /* 150 blocks */
	cr_assert_eq(bkv_seq_open(p, &s2), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s2, t, 64, NULL), BKV_OK); /* 16 hits */
	after = memory(p);
	cr_assert_gt(after.block_tables, before.block_tables);
	cr_assert_geq(after.block_tables, (150 + 16) * 4);
	cr_assert_eq((int64_t)after.total, live);
	cr_assert_eq(after.total - before.total, after.block_tables - before.block_tables);
	cr_assert_eq(after.index_used, 150);
	cr_assert_eq(after.index_used, pool_stats(p).nr_indexed);
	cr_assert_eq(after.host, 0);
	cr_assert_eq(after.event_ring, 0);
	bkv_pool_destroy(p);
	cr_assert_eq(live, 0);
}

/* A counted pool with KV groups: full attention, a sliding window (its
 * released blocks kept by the value records) and a recurrent state; with
 * share its units are chunks of the attention frames (state_share). */
static bkv_pool *make_counted_groups(int share)
{
	static const bkv_kv_group g[3] = {
		{BKV_GROUP_FULL, 2, 0, 0, 256},
		{BKV_GROUP_WINDOW, 2, 12, 0, 256},
		{BKV_GROUP_STATE, 1, 8, 0, 8192},
	};
	bkv_allocator a = {c_alloc, c_realloc, c_free, NULL};
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = 4;
	c.device_blocks = 512;
	c.host_blocks = 64;
	c.max_seqs = 16;
	c.n_groups = 3;
	c.groups = g;
	c.state_share = (uint32_t)share;
	c.state_units = share ? 2 : 24;
	cr_assert_eq(bkv_pool_create(&c, &a, &p), BKV_OK);
	return p;
}

/* Every per-group structure is counted: the lanes' records and tables,
 * the state units' records, the value records, the shared frames' chunk
 * records and the check's workspace over the state arena. */
static void grouped_memory_is_exact(int share)
{
	bkv_pool *p = make_counted_groups(share);
	bkv_pool_memory m = memory(p);
	int32_t t[200];
	uint32_t s[3], i;

	cr_assert_eq((int64_t)m.total, live, "at create: total %llu, allocator holds %lld",
		     (unsigned long long)m.total, (long long)live);
	fill_tokens(t, 200, 1);
	bkv__pool_txn_begin(p);
	for (i = 0; i < 3; i++) {
		cr_assert_eq(bkv_seq_open(p, &s[i]), BKV_OK);
		cr_assert_eq(bkv_seq_append(p, s[i], t, 40 + 80 * i, NULL), BKV_OK);
	}
	bkv__pool_txn_commit(p);
	m = memory(p);
	cr_assert_eq((int64_t)m.total, live, "tables grown: total %llu, allocator holds %lld",
		     (unsigned long long)m.total, (long long)live);
	cr_assert_gt(m.block_tables, (40 + 120 + 200) / 4 * 4, "lane tables counted");
	bkv_pool_destroy(p);
	cr_assert_eq(live, 0);
}

Test(inspect, memory_with_kv_groups_is_the_pools_allocations)
{
	grouped_memory_is_exact(0);
}

Test(inspect, memory_with_shared_state_frames_is_the_pools_allocations)
{
	grouped_memory_is_exact(1);
}

Test(inspect, memory_without_prefix_cache_has_no_index_or_queue)
{
	bkv_pool *p = make_counted(16, 64, 0, 0, 0);
	bkv_pool_memory m = memory(p);

	cr_assert_eq(m.index_slots, 0);
	cr_assert_eq(m.index, 0);
	cr_assert_eq(m.txn_queue, 0);
	cr_assert_eq(m.txn_owners, 0);
	cr_assert_eq((int64_t)m.total, live);
	bkv_pool_destroy(p);
}

Test(inspect, memory_fills_only_the_size_the_caller_knows)
{
	bkv_pool *p = make_pool(16, 64, 0, 0);
	bkv_pool_memory m, full = memory(p);

	memset(&m, 0xab, sizeof m);
	m.size = 8; /* size and block_bytes */
	cr_assert_eq(bkv_pool_memory_get(p, &m), BKV_OK);
	cr_assert_eq(m.size, 8);
	cr_assert_eq(m.block_bytes, full.block_bytes);
	cr_assert_eq(m.seq_slot_bytes, 0xabababab);
	memset(&m, 0xab, sizeof m);
	m.size = 0; /* 0: the whole struct */
	cr_assert_eq(bkv_pool_memory_get(p, &m), BKV_OK);
	cr_assert_eq(memcmp(&m, &full, sizeof m), 0);
	bkv_pool_destroy(p);
}

Test(inspect, memory_bad_input_is_einval_and_touches_nothing)
{
	bkv_pool *p = make_pool(16, 64, 0, 0);
	bkv_pool_stats st = pool_stats(p);
	bkv_pool_memory m, pat;

	memset(&m, 0xab, sizeof m);
	m.size = sizeof m;
	pat = m;
	cr_assert_eq(bkv_pool_memory_get(NULL, &m), BKV_EINVAL);
	cr_assert_eq(memcmp(&m, &pat, sizeof m), 0);
	cr_assert_eq(bkv_pool_memory_get(p, NULL), BKV_EINVAL);
	expect_same_stats(&st, p);
	bkv_pool_destroy(p);
}

/* ---- bkv_block_info_get -------------------------------------------------- */

/* Every field of block b's report against the pool's record of it. */
static void expect_block_matches(const bkv_pool *p, int32_t b)
{
	const bkv__block *k = &p->kv.blk[b];
	bkv_block_info bi = block(p, b);
	int copy = (k->flags & (BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN |
				BKV__BLOCK_COPY_SRC)) != 0;

	cr_assert_eq(bi.size, sizeof bi);
	cr_assert_eq(bi.state, BLOCK_IS_PINNED(k)    ? BKV_BLOCK_PINNED
			       : BLOCK_IS_CACHED(k) ? BKV_BLOCK_CACHED
						    : BKV_BLOCK_FREE,
		     "block %d", b);
	cr_assert_eq(bi.ref_count, k->ref);
	cr_assert_eq(bi.indexed, BLOCK_IS_INDEXED(k) ? 1 : 0);
	cr_assert_eq(bi.copy_pending, copy);
	cr_assert_eq(bi.kids, k->kids);
	if (BLOCK_IS_FREE(k)) {
		cr_assert_eq(bi.fill, 0);
		cr_assert_eq(bi.parent, -1);
		cr_assert_null(bi.tokens);
	} else {
		cr_assert_eq(bi.fill, k->fill);
		cr_assert_eq(bi.parent, k->parent);
		if (k->fill)
			cr_assert_eq(bi.tokens, bkv__tok(&p->kv, b));
		else
			cr_assert_null(bi.tokens);
	}
	cr_assert_eq(bi.key, BLOCK_IS_INDEXED(k) ? k->key : 0);
	cr_assert_eq(bi.hash, BLOCK_IS_INDEXED(k) ? k->hash : 0);
}

static void expect_all_blocks_match(const bkv_pool *p)
{
	uint32_t b;

	for (b = 0; b < p->kv.nb; b++)
		expect_block_matches(p, (int32_t)b);
}

Test(inspect, block_info_reports_free_pinned_and_cached_blocks)
{
	bkv_pool *p = make_pool(4, 16, 0, 0);
	int32_t t[40];
	uint32_t a, c;
	bkv_block_info bi;
	const int32_t *tab;
	uint32_t n;

	fill_tokens(t, 40, 100);
	expect_all_blocks_match(p); /* all free */
	cr_assert_eq(block(p, 0).state, BKV_BLOCK_FREE);

	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 10, NULL), BKV_OK); /* 2 full + 2 tokens */
	tab = bkv_seq_blocks(p, a, &n);
	cr_assert_eq(n, 3);
	expect_all_blocks_match(p);
	bi = block(p, tab[1]);
	cr_assert_eq(bi.state, BKV_BLOCK_PINNED);
	cr_assert_eq(bi.ref_count, 1);
	cr_assert(bi.indexed);
	cr_assert_eq(bi.parent, tab[0]);
	cr_assert_eq(bi.fill, 4);
	cr_assert_eq(memcmp(bi.tokens, t + 4, 4 * sizeof(int32_t)), 0);
	bi = block(p, tab[2]);
	cr_assert_eq(bi.fill, 2);
	cr_assert_not(bi.indexed);
	cr_assert_eq(bi.key, 0);
	cr_assert_eq(bi.hash, 0);
	cr_assert_eq(block(p, tab[0]).kids, 1);

	cr_assert_eq(bkv_seq_fork(p, a, &c), BKV_OK); /* every block shared */
	cr_assert_eq(block(p, tab[0]).ref_count, 2);
	cr_assert_eq(bkv_seq_append(p, c, t + 10, 1, NULL), BKV_OK); /* CoW of the last */
	expect_all_blocks_match(p);
	cr_assert(block(p, tab[2]).copy_pending);
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	cr_assert_not(block(p, tab[2]).copy_pending);
	expect_all_blocks_match(p);

	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, c), BKV_OK);
	expect_all_blocks_match(p);
	bi = block(p, 0);
	cr_assert_eq(bi.state, BKV_BLOCK_CACHED); /* full and indexed: kept */
	cr_assert_eq(bi.ref_count, 0);
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	expect_all_blocks_match(p);
	cr_assert_eq(block(p, 0).state, BKV_BLOCK_FREE);
	bkv_pool_destroy(p);
}

/* From any indexed block, the parents lead to logical block 0 through indexed
 * blocks, and the chain's tokens hash (bkv_block_hashes, the pool's seed and
 * the block's key) to each block's reported hash. */
Test(inspect, block_info_parents_and_hashes_rebuild_the_chain)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;
	int32_t t[64], chain[16], tok[64];
	uint64_t h[16];
	uint32_t s, b, leaves = 0;

	bkv_pool_config_init(&c);
	c.block_tokens = 4;
	c.device_blocks = 32;
	c.hash_seed = 0x1234567;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	fill_tokens(t, 64, 7);
	cr_assert_eq(bkv_seq_open_keyed(p, 9, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 24, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	t[10] = -5; /* a second branch from logical block 2 on */
	cr_assert_eq(bkv_seq_open_keyed(p, 9, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 20, NULL), BKV_OK);
	expect_all_blocks_match(p);

	for (b = 0; b < 32; b++) {
		bkv_block_info bi = block(p, (int32_t)b);
		uint32_t d = 0, i;
		int32_t x = (int32_t)b;

		if (!bi.indexed || bi.kids)
			continue;
		leaves++;
		cr_assert_eq(bi.key, 9);
		while (x >= 0) {
			bkv_block_info ci = block(p, x);

			cr_assert(ci.indexed, "block %d on an indexed chain is not indexed", x);
			cr_assert_eq(ci.fill, 4);
			chain[d++] = x;
			x = ci.parent;
		}
		for (i = 0; i < d; i++)
			memcpy(tok + 4 * i, block(p, chain[d - 1 - i]).tokens, 4 * sizeof(int32_t));
		cr_assert_eq(bkv_block_hashes(c.hash_seed, 9, 4, tok, 4 * d, h), d);
		for (i = 0; i < d; i++)
			cr_assert_eq(block(p, chain[d - 1 - i]).hash, h[i]);
	}
	cr_assert_eq(leaves, 2); /* 6 blocks, and 2 + 3 branching after block 1 */
	bkv_pool_destroy(p);
}

Test(inspect, block_info_bad_input_is_einval_and_touches_nothing)
{
	bkv_pool *p = make_pool(4, 16, 0, 0);
	static const int32_t bad[] = {-1, 16, 17, INT32_MAX, INT32_MIN};
	int32_t t[8];
	uint32_t s, i;
	bkv_pool_stats st;
	bkv_block_info bi, pat;

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 6, NULL), BKV_OK);
	st = pool_stats(p);
	memset(&bi, 0xab, sizeof bi);
	bi.size = sizeof bi;
	pat = bi;
	for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		cr_assert_eq(bkv_block_info_get(p, bad[i], &bi), BKV_EINVAL, "block %d", bad[i]);
		cr_assert_eq(memcmp(&bi, &pat, sizeof bi), 0);
	}
	cr_assert_eq(bkv_block_info_get(NULL, 0, &bi), BKV_EINVAL);
	cr_assert_eq(memcmp(&bi, &pat, sizeof bi), 0);
	cr_assert_eq(bkv_block_info_get(p, 0, NULL), BKV_EINVAL);
	expect_same_stats(&st, p);
	expect_all_blocks_match(p);
	cr_assert_eq(block(p, 15).state, BKV_BLOCK_FREE); /* the last id is in range */
	bkv_pool_destroy(p);
}

Test(inspect, block_info_fills_only_the_size_the_caller_knows)
{
	bkv_pool *p = make_pool(4, 16, 0, 0);
	int32_t t[4];
	uint32_t s;
	bkv_block_info bi;

	fill_tokens(t, 4, 1);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 4, NULL), BKV_OK);
	memset(&bi, 0xab, sizeof bi);
	bi.size = 12; /* size, state, ref_count */
	cr_assert_eq(bkv_block_info_get(p, 0, &bi), BKV_OK);
	cr_assert_eq(bi.size, 12);
	cr_assert_eq(bi.state, BKV_BLOCK_PINNED);
	cr_assert_eq(bi.ref_count, 1);
	cr_assert_eq(bi.fill, 0xabababab);
	bi.size = 0; /* 0: the whole struct */
	cr_assert_eq(bkv_block_info_get(p, 0, &bi), BKV_OK);
	cr_assert_eq(bi.size, sizeof bi);
	cr_assert_eq(bi.fill, 4);
	bkv_pool_destroy(p);
}
