/*
 * test_pool.c - small pool scenarios with exact block ids, ref counts and
 * orders: free order, prefix sharing, cached-chain reuse, eviction order,
 * fork + copy-on-write, swap out and in, the watermark, truncate, drop.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "internal.h"
#include "pool_util.h"

/* ---- frames: free list order -------------------------------------------- */

Test(pool_frames, blocks_come_in_ascending_order_first)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a;
	int32_t t[12];

	fill_tokens(t, 12, 100);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 10, NULL), BKV_OK);
	expect_table(p, a, (int32_t[]){0, 1, 2}, 3);
	expect_counts(p, 5, 3, 0);
	bkv_pool_destroy(p);
}

Test(pool_frames, freed_blocks_are_reused_first_lifo)
{
	bkv_pool *p = make_pool_ex(4, 8, 0, 0, 0);
	uint32_t a, b, c;
	int32_t t[12];

	fill_tokens(t, 12, 100);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, NULL), BKV_OK);
	expect_table(p, b, (int32_t[]){2, 3}, 2);
	/* close releases last to first: 1 then 0 pushed, so 0 is on top */
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, t, 12, NULL), BKV_OK);
	expect_table(p, c, (int32_t[]){0, 1, 4}, 3);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_frames, demand_paging_takes_blocks_as_tokens_arrive)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, i;
	int32_t t[1] = {7};

	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	expect_counts(p, 8, 0, 0);
	for (i = 1; i <= 9; i++) {
		cr_assert_eq(bkv_seq_append(p, a, t, 1, NULL), BKV_OK);
		cr_assert_eq(pool_stats(p).nr_used, (i + 3) / 4);
		cr_assert_eq(pool_stats(p).tokens, i);
		cr_assert_eq(pool_stats(p).waste_slots, ((i + 3) / 4) * 4 - i);
	}
	expect_table(p, a, (int32_t[]){0, 1, 2}, 3);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_frames, every_block_is_usable_and_the_next_append_is_refused_whole)
{
	bkv_pool *p = make_pool(4, 4, 0, 0);
	uint32_t a, b;
	int32_t t[16];
	bkv_pool_stats before;
	uint32_t hit = 77;

	fill_tokens(t, 16, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 10, NULL), BKV_OK); /* [0,1,2] */
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	before = pool_stats(p);
	cr_assert_eq(bkv_seq_append(p, b, t + 10, 5, &hit), BKV_ENOSPC);
	cr_assert_eq(hit, 77); /* untouched on failure */
	/* 2 tokens fit a's last block, the third needs the last free block,
	 * which b then takes first */
	cr_assert_eq(bkv_seq_append(p, b, t + 10, 4, NULL), BKV_OK);
	before = pool_stats(p);
	cr_assert_eq(bkv_seq_append(p, a, t, 3, NULL), BKV_ENOSPC);
	expect_same_stats(&before, p);
	expect_len(p, a, 10);
	expect_table(p, a, (int32_t[]){0, 1, 2}, 3);
	cr_assert_eq(bkv_seq_append(p, a, t, 2, NULL), BKV_OK);
	expect_counts(p, 0, 4, 0);
	cr_assert_eq(pool_stats(p).waste_slots, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_frames, a_sequence_longer_than_the_pool_is_e2big)
{
	bkv_pool *p = make_pool(4, 4, 0, 0);
	uint32_t a;
	int32_t t[17];

	fill_tokens(t, 17, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 17, NULL), BKV_E2BIG);
	cr_assert_eq(bkv_seq_append(p, a, t, 16, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 1, NULL), BKV_E2BIG);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* ---- the prefix cache ---------------------------------------------------- */

Test(pool_prefix, three_full_blocks_are_shared_then_the_tail_diverges)
{
	bkv_pool *p = make_pool(4, 16, 0, 0);
	uint32_t a, b, hit = 99;
	int32_t t[14], u[14];

	fill_tokens(t, 14, 500);
	memcpy(u, t, sizeof u);
	u[12] = -5; /* same 3 full blocks, different tail */
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 14, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	expect_table(p, a, (int32_t[]){0, 1, 2, 3}, 4);
	cr_assert_eq(pool_stats(p).nr_indexed, 3);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, u, 14, &hit), BKV_OK);
	cr_assert_eq(hit, 12);
	expect_table(p, b, (int32_t[]){0, 1, 2, 4}, 4);
	expect_refs(p, (uint32_t[]){2, 2, 2, 1, 1, 0}, 6);
	cr_assert_eq(pool_stats(p).hit_tokens, 12);
	cr_assert_eq(pool_stats(p).miss_tokens, 16);
	cr_assert_eq(pool_stats(p).nr_used, 5);
	cr_assert_eq(pool_stats(p).tokens, 12 + 2 + 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_prefix, lookup_stops_at_the_first_miss)
{
	bkv_pool *p = make_pool(4, 16, 0, 0);
	uint32_t a, b, hit;
	int32_t t[12], u[12];

	fill_tokens(t, 12, 1);
	memcpy(u, t, sizeof u);
	u[5] = 77; /* block 1 differs; block 2 equal but its parent differs */
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 12, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, u, 12, &hit), BKV_OK);
	cr_assert_eq(hit, 4);
	expect_table(p, b, (int32_t[]){0, 3, 4}, 3);
	/* b's blocks 3 and 4 are indexed too (their chain differs from a's) */
	cr_assert_eq(pool_stats(p).nr_indexed, 5);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_prefix, hits_need_the_same_key)
{
	bkv_pool *p = make_pool(4, 16, 0, 0);
	uint32_t a, b, c, hit;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open_keyed(p, 42, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	cr_assert_eq(bkv_seq_open_keyed(p, 42, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8);
	expect_table(p, c, (int32_t[]){0, 1}, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_prefix, a_hash_match_with_other_tokens_or_key_is_a_miss)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, c, hit;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	/* What a collision looks like: the index names block 1 under the hash
	 * of t[4..8) but block 1 holds other tokens. */
	bkv__tok(&p->kv, 1)[2] ^= 0x40;
	cr_assert_eq(bkv_pool_check(p), 10); /* CHECK_HASH */
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 4);
	expect_table(p, b, (int32_t[]){0, 2}, 2);
	bkv__tok(&p->kv, 1)[2] ^= 0x40;
	cr_assert_eq(bkv_seq_close(p, b), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	/* Same hash and tokens, another key recorded on the block: a miss. */
	p->kv.blk[0].key = 99;
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	p->kv.blk[0].key = 0;
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_prefix, a_block_filled_by_several_appends_is_cached)
{
	bkv_pool *p = make_pool(4, 16, 0, 0);
	uint32_t a, b, hit, i;
	int32_t t[8];

	fill_tokens(t, 8, 3);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	for (i = 0; i < 8; i++)
		cr_assert_eq(bkv_seq_append(p, a, t + i, 1, NULL), BKV_OK);
	cr_assert_eq(pool_stats(p).nr_indexed, 2);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8);
	bkv_pool_destroy(p);
}

Test(pool_prefix, a_freed_cached_chain_is_reused)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, hit;
	int32_t t[13];

	fill_tokens(t, 13, 9);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 12, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	expect_counts(p, 5, 0, 3);
	expect_lru(p, (int32_t[]){2, 1, 0}, 3);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 13, &hit), BKV_OK);
	cr_assert_eq(hit, 12);
	expect_table(p, b, (int32_t[]){0, 1, 2, 3}, 4);
	expect_counts(p, 4, 4, 0);
	cr_assert_eq(pool_stats(p).evictions, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_prefix, eviction_takes_the_oldest_and_deepest_first)
{
	bkv_pool *p = make_pool(4, 4, 0, 0);
	uint32_t a, b, c, d, hit;
	int32_t ta[8], tb[8], tc[8];

	fill_tokens(ta, 8, 100);
	fill_tokens(tb, 8, 200);
	fill_tokens(tc, 8, 300);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, ta, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, tb, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, b), BKV_OK);
	expect_lru(p, (int32_t[]){1, 0, 3, 2}, 4);
	expect_counts(p, 0, 0, 4);
	cr_assert_eq(bkv_pool_available(p), 4);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, tc, 4, NULL), BKV_OK);
	expect_table(p, c, (int32_t[]){1}, 1);
	cr_assert_eq(bkv_seq_append(p, c, tc + 4, 4, NULL), BKV_OK);
	expect_table(p, c, (int32_t[]){1, 0}, 2);
	cr_assert_eq(pool_stats(p).evictions, 2);
	/* b's chain survived whole */
	cr_assert_eq(bkv_seq_open(p, &d), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, d, tb, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8);
	expect_table(p, d, (int32_t[]){2, 3}, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_prefix, unhashed_blocks_are_reused_before_cached_ones)
{
	bkv_pool *p = make_pool(4, 4, 0, 0);
	uint32_t a, b;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 6, NULL), BKV_OK); /* [0 full, 1 partial] */
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	expect_counts(p, 3, 0, 1);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t + 4, 4, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t + 4, 4, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t + 4, 4, NULL), BKV_OK);
	expect_table(p, b, (int32_t[]){1, 2, 3}, 3);
	cr_assert_eq(pool_stats(p).evictions, 0);
	cr_assert_eq(pool_stats(p).nr_cached, 1);
	cr_assert_eq(bkv_seq_append(p, b, t + 4, 4, NULL), BKV_OK);
	expect_table(p, b, (int32_t[]){1, 2, 3, 0}, 4);
	cr_assert_eq(pool_stats(p).evictions, 1);
	bkv_pool_destroy(p);
}

Test(pool_prefix, reset_cache_frees_cached_blocks_and_empties_the_index)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, hit;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 4, NULL), BKV_OK); /* hit on 0 */
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);               /* 1 cached */
	expect_counts(p, 6, 1, 1);
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	expect_counts(p, 7, 1, 0);
	cr_assert_eq(pool_stats(p).nr_indexed, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	/* block 1 went back on top of the free list */
	cr_assert_eq(bkv_seq_close(p, b), BKV_OK);
	expect_counts(p, 8, 0, 0);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	expect_table(p, a, (int32_t[]){0, 1}, 2);
	cr_assert_eq(bkv_pool_reset_cache(NULL), BKV_EINVAL);
	bkv_pool_destroy(p);
}

Test(pool_prefix, disabled_cache_indexes_nothing)
{
	bkv_pool_config c;
	bkv_pool *p;
	uint32_t a, b, hit;
	int32_t t[8];

	bkv_pool_config_init(&c);
	c.block_tokens = 4;
	c.device_blocks = 8;
	c.prefix_cache = 0;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	expect_counts(p, 6, 2, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_prefix, drop_uncaches_its_own_blocks)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, hit;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_drop(p, a), BKV_OK);
	expect_counts(p, 8, 0, 0);
	cr_assert_eq(pool_stats(p).nr_indexed, 0);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	expect_table(p, b, (int32_t[]){0, 1}, 2);
	bkv_pool_destroy(p);
}

Test(pool_prefix, drop_keeps_a_parent_whose_cached_children_need_it)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, c, hit;
	int32_t t[8], u[8];

	fill_tokens(t, 8, 1);
	memcpy(u, t, sizeof u);
	u[4] = 99;
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK); /* [0, 1] */
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);              /* LRU 1, 0 */
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, u, 8, &hit), BKV_OK); /* [0, 2] */
	cr_assert_eq(hit, 4);
	cr_assert_eq(bkv_seq_drop(p, b), BKV_OK);
	/* 2 is b's own: freed; 0 is the parent of cached 1: stays cached */
	expect_lru(p, (int32_t[]){1, 0}, 2);
	expect_counts(p, 6, 0, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8);
	bkv_pool_destroy(p);
}

/* ---- fork and copy-on-write ---------------------------------------------- */

Test(pool_cow, fork_then_write_into_the_shared_partial_block_copies_it)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, n;
	int32_t t[8];
	const bkv_copy *cp;

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 6, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_fork(p, a, &b), BKV_OK);
	expect_table(p, b, (int32_t[]){0, 1}, 2);
	expect_refs(p, (uint32_t[]){2, 2, 0}, 3);
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_DEVICE, &cp), 0);
	cr_assert_eq(bkv_seq_append(p, b, t + 6, 1, NULL), BKV_OK);
	expect_table(p, b, (int32_t[]){0, 2}, 2);
	expect_table(p, a, (int32_t[]){0, 1}, 2);
	expect_refs(p, (uint32_t[]){2, 1, 1}, 3);
	n = bkv_pool_pending_copies(p, BKV_COPY_DEVICE, &cp);
	cr_assert_eq(n, 1);
	cr_assert_eq(cp[0].src, 1);
	cr_assert_eq(cp[0].dst, 2);
	cr_assert_eq(pool_stats(p).cow_copies, 1);
	/* a now owns 1 alone: writes in place */
	cr_assert_eq(bkv_seq_append(p, a, t + 6, 1, NULL), BKV_OK);
	expect_table(p, a, (int32_t[]){0, 1}, 2);
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_DEVICE, NULL), 1);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_DEVICE, NULL), 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_cow, full_shared_blocks_are_never_copied)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_fork(p, a, &b), BKV_OK);
	cr_assert_eq(bkv_seq_blocks_needed(p, b, 1), 1);
	cr_assert_eq(bkv_seq_append(p, b, t, 1, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 1, NULL), BKV_OK);
	expect_table(p, b, (int32_t[]){0, 1, 2}, 3);
	expect_table(p, a, (int32_t[]){0, 1, 3}, 3);
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_DEVICE, NULL), 0);
	cr_assert_eq(pool_stats(p).cow_copies, 0);
	bkv_pool_destroy(p);
}

Test(pool_cow, blocks_needed_counts_the_cow_block)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_blocks_needed(p, a, 0), 0);
	cr_assert_eq(bkv_seq_blocks_needed(p, a, 5), 2);
	cr_assert_eq(bkv_seq_append(p, a, t, 2, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_blocks_needed(p, a, 2), 0);
	cr_assert_eq(bkv_seq_blocks_needed(p, a, 3), 1);
	cr_assert_eq(bkv_seq_fork(p, a, &b), BKV_OK);
	cr_assert_eq(bkv_seq_blocks_needed(p, a, 2), 1);
	cr_assert_eq(bkv_seq_blocks_needed(p, a, 3), 2);
	cr_assert_eq(bkv_seq_blocks_needed(p, 12345, 3), BKV_ENOENT);
	cr_assert_eq(bkv_seq_blocks_needed(NULL, a, 3), BKV_EINVAL);
	bkv_pool_destroy(p);
}

Test(pool_cow, truncate_inside_a_cached_block_copies_on_the_next_write)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, hit;
	int32_t t[8], u[8];
	const bkv_copy *cp;

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK); /* [0, 1] indexed */
	cr_assert_eq(bkv_seq_truncate(p, a, 6), BKV_OK);
	expect_table(p, a, (int32_t[]){0, 1}, 2);
	cr_assert_eq(bkv_seq_append(p, a, (int32_t[]){-1}, 1, NULL), BKV_OK);
	expect_table(p, a, (int32_t[]){0, 2}, 2);
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_DEVICE, &cp), 1);
	cr_assert_eq(cp[0].src, 1);
	cr_assert_eq(cp[0].dst, 2);
	/* 1 kept its content and, as the source of a pending copy, stays
	 * pinned (on no list) until the copy is cleared; a second sequence
	 * still hits it */
	expect_counts(p, 5, 3, 0);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	memcpy(u, t, sizeof u);
	cr_assert_eq(bkv_seq_append(p, b, u, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8);
	expect_table(p, b, (int32_t[]){0, 1}, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	expect_counts(p, 5, 3, 0);
	cr_assert_eq(bkv_seq_close(p, b), BKV_OK); /* 1 now goes to the LRU */
	expect_counts(p, 5, 2, 1);
	bkv_pool_destroy(p);
}

Test(pool_cow, copy_source_stays_pinned_until_the_copy_is_cleared)
{
	bkv_pool *p = make_pool(4, 3, 0, 0);
	uint32_t a, b, c;
	int32_t t[4];

	fill_tokens(t, 4, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 2, NULL), BKV_OK); /* [0] */
	cr_assert_eq(bkv_seq_fork(p, a, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t + 2, 1, NULL), BKV_OK); /* b: [1], 0 -> 1 */
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK); /* 0's last table user */
	/* 0 is still read by the pending copy: not free, not reusable */
	expect_counts(p, 1, 2, 0);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, t, 4, NULL), BKV_OK); /* takes 2 */
	expect_table(p, c, (int32_t[]){2}, 1);
	cr_assert_eq(bkv_seq_append(p, c, t, 4, NULL), BKV_ENOSPC);
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	expect_counts(p, 1, 2, 0); /* 0 back on the free list */
	cr_assert_eq(bkv_seq_append(p, c, t, 4, NULL), BKV_OK);
	expect_table(p, c, (int32_t[]){2, 0}, 2);
	bkv_pool_destroy(p);
}

Test(pool_cow, a_copy_source_released_late_is_evicted_before_its_parent)
{
	bkv_pool *p = make_pool(4, 4, 0, 0);
	uint32_t a, b;
	int32_t t[13];

	fill_tokens(t, 13, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK); /* [0, 1] indexed */
	cr_assert_eq(bkv_seq_truncate(p, a, 6), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 1, NULL), BKV_OK); /* CoW 1 -> 2 */
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	/* 1 is pinned by the pending copy, and holds its parent 0 */
	expect_counts(p, 2, 2, 0);
	expect_refs(p, (uint32_t[]){1, 0, 0, 0}, 4);
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	expect_lru(p, (int32_t[]){1, 0}, 2); /* child older than parent */
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t + 1, 12, NULL), BKV_OK);
	expect_table(p, b, (int32_t[]){2, 3, 1}, 3);
	cr_assert_eq(pool_stats(p).evictions, 1);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_cow, a_pinned_copy_source_can_be_hit_but_is_not_available)
{
	bkv_pool *p = make_pool(4, 3, 0, 0);
	uint32_t a, b, hit = 0;
	int32_t t[9];

	fill_tokens(t, 9, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK); /* [0, 1] indexed */
	cr_assert_eq(bkv_seq_truncate(p, a, 6), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 1, NULL), BKV_OK); /* CoW 1 -> 2 */
	expect_counts(p, 0, 3, 0);
	cr_assert_eq(bkv_pool_available(p), 0);
	/* 1 is pinned only by its pending copy: a hit, but no block to spare */
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 9, &hit), BKV_ENOSPC);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8);
	expect_table(p, b, (int32_t[]){0, 1}, 2);
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	expect_refs(p, (uint32_t[]){2, 1, 1}, 3);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_cow, truncate_releases_blocks_past_the_new_end)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a;
	int32_t t[12];

	fill_tokens(t, 12, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 11, NULL), BKV_OK); /* [0,1,2] */
	cr_assert_eq(bkv_seq_truncate(p, a, 12), BKV_EINVAL);
	cr_assert_eq(bkv_seq_truncate(p, a, 5), BKV_OK);
	expect_table(p, a, (int32_t[]){0, 1}, 2);
	expect_len(p, a, 5);
	/* 2 (partial) freed; 1 (full, indexed) stays pinned by a */
	expect_counts(p, 6, 2, 0);
	cr_assert_eq(pool_stats(p).tokens, 8);
	cr_assert_eq(bkv_seq_truncate(p, a, 0), BKV_OK);
	expect_counts(p, 6, 0, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* ---- swap ---------------------------------------------------------------- */

Test(pool_swap, swap_out_then_in_with_cached_blocks_shared_again)
{
	bkv_pool *p = make_pool(4, 8, 8, 0);
	uint32_t a;
	int32_t t[10];
	const bkv_copy *cp;
	bkv_seq_info info;

	fill_tokens(t, 10, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 10, NULL), BKV_OK); /* [0,1,2] */
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_OK);
	expect_table(p, a, (int32_t[]){0, 1, 2}, 3); /* host ids */
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_SWAP_OUT, &cp), 3);
	cr_assert_eq(cp[0].src, 0);
	cr_assert_eq(cp[0].dst, 0);
	cr_assert_eq(cp[2].src, 2);
	cr_assert_eq(cp[2].dst, 2);
	cr_assert_eq(bkv_seq_info_get(p, a, &info), BKV_OK);
	cr_assert_eq(info.swapped, 1);
	cr_assert_eq(info.len, 10);
	expect_counts(p, 6, 0, 2); /* full blocks stay cached */
	cr_assert_eq(pool_stats(p).host_used, 3);
	cr_assert_eq(pool_stats(p).nr_swapped, 1);
	cr_assert_eq(bkv_seq_append(p, a, t, 1, NULL), BKV_ESTATE);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_ESTATE);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);

	cr_assert_eq(bkv_seq_swap_in(p, a), BKV_OK);
	expect_table(p, a, (int32_t[]){0, 1, 2}, 3); /* 0, 1 hits; 2 new */
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_SWAP_IN, &cp), 1);
	cr_assert_eq(cp[0].src, 2);
	cr_assert_eq(cp[0].dst, 2);
	cr_assert_eq(pool_stats(p).swap_out_blocks, 3);
	cr_assert_eq(pool_stats(p).swap_in_blocks, 1);
	cr_assert_eq(pool_stats(p).host_used, 1); /* host 2 pending */
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	cr_assert_eq(pool_stats(p).host_used, 0);
	cr_assert_eq(pool_stats(p).host_free, 8);
	cr_assert_eq(bkv_pool_check(p), 0);
	/* the tokens came back: the sequence goes on as before */
	cr_assert_eq(bkv_seq_append(p, a, t, 2, NULL), BKV_OK);
	cr_assert_eq(pool_stats(p).nr_indexed, 3);
	bkv_pool_destroy(p);
}

Test(pool_swap, swap_in_after_eviction_copies_every_block)
{
	bkv_pool *p = make_pool(4, 8, 8, 0);
	uint32_t a, hit, b;
	int32_t t[10];
	const bkv_copy *cp;

	fill_tokens(t, 10, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 10, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_OK);
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	/* free list now: 0 1 2 3 ...: reset pushed 1 then 0 on top of 2 */
	cr_assert_eq(bkv_seq_swap_in(p, a), BKV_OK);
	expect_table(p, a, (int32_t[]){0, 1, 2}, 3);
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_SWAP_IN, &cp), 3);
	cr_assert_eq(cp[1].src, 1);
	cr_assert_eq(cp[1].dst, 1);
	/* re-entered into the index from the host's tokens */
	cr_assert_eq(pool_stats(p).nr_indexed, 2);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_swap, swap_out_needs_a_host_block_per_entry)
{
	bkv_pool *p = make_pool(4, 8, 2, 0);
	uint32_t a;
	int32_t t[10];
	bkv_pool_stats before;

	fill_tokens(t, 10, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 10, NULL), BKV_OK);
	before = pool_stats(p);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_ENOSPC);
	expect_same_stats(&before, p);
	cr_assert_eq(bkv_pool_pending_copies(p, BKV_COPY_SWAP_OUT, NULL), 0);
	cr_assert_eq(bkv_seq_truncate(p, a, 8), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_swap, swap_in_is_all_or_nothing)
{
	bkv_pool *p = make_pool(4, 4, 4, 0);
	uint32_t a, b;
	int32_t t[16];
	bkv_pool_stats before;

	fill_tokens(t, 16, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 10, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t + 1, 12, NULL), BKV_OK); /* evicts */
	before = pool_stats(p);
	cr_assert_eq(bkv_seq_swap_in(p, a), BKV_ENOSPC);
	expect_same_stats(&before, p);
	cr_assert_eq(bkv_seq_close(p, b), BKV_OK);
	cr_assert_eq(bkv_seq_swap_in(p, a), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_swap, closing_a_swapped_sequence_frees_its_host_blocks)
{
	bkv_pool *p = make_pool(4, 8, 8, 0);
	uint32_t a;
	int32_t t[10];

	fill_tokens(t, 10, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 10, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	cr_assert_eq(pool_stats(p).host_free, 8);
	cr_assert_eq(pool_stats(p).nr_swapped, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pool_swap, no_host_tier_is_estate)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a;

	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_ESTATE);
	cr_assert_eq(bkv_seq_swap_in(p, a), BKV_ESTATE);
	bkv_pool_destroy(p);
}

Test(pool_swap, copy_order_hazards_are_refused)
{
	bkv_pool *p = make_pool(4, 8, 8, 0);
	uint32_t a, b, c;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 6, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_fork(p, a, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 1, NULL), BKV_OK); /* CoW 1 -> 2 */
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_ESTATE);       /* 1 is a src */
	cr_assert_eq(bkv_seq_swap_out(p, b), BKV_ESTATE);       /* 2 is a dst */
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, t, 3, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, c), BKV_OK); /* untouched blocks */
	cr_assert_eq(bkv_seq_swap_in(p, c), BKV_ESTATE); /* device copies pending */
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	cr_assert_eq(bkv_seq_swap_in(p, c), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, c), BKV_ESTATE); /* swap-in pending */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	cr_assert_eq(bkv_seq_swap_out(p, c), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* ---- the watermark ------------------------------------------------------- */

Test(pool_watermark, admission_is_refused_below_the_watermark)
{
	bkv_pool *p = make_pool(4, 8, 0, 2);
	uint32_t a;
	int32_t t[32];

	fill_tokens(t, 32, 1);
	cr_assert_eq(bkv_pool_can_admit(p, 24), 1); /* 8 - 6 = 2 >= 2 */
	cr_assert_eq(bkv_pool_can_admit(p, 25), 0); /* 8 - 7 = 1 */
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 20, NULL), BKV_OK);
	cr_assert_eq(bkv_pool_can_admit(p, 4), 1);
	cr_assert_eq(bkv_pool_can_admit(p, 5), 0);
	cr_assert_eq(bkv_pool_can_admit(p, 0), 1);
	/* appends ignore the watermark */
	cr_assert_eq(bkv_seq_append(p, a, t, 12, NULL), BKV_OK);
	expect_counts(p, 0, 8, 0);
	cr_assert_eq(bkv_pool_can_admit(p, 0), 0);
	cr_assert_eq(bkv_pool_can_admit(NULL, 0), 0);
	bkv_pool_destroy(p);
}

Test(pool_watermark, cached_blocks_count_as_available)
{
	bkv_pool *p = make_pool(4, 4, 0, 1);
	uint32_t a;
	int32_t t[12];

	fill_tokens(t, 12, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 12, NULL), BKV_OK);
	cr_assert_eq(bkv_pool_can_admit(p, 1), 0);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	expect_counts(p, 1, 0, 3);
	cr_assert_eq(bkv_pool_available(p), 4);
	cr_assert_eq(bkv_pool_can_admit(p, 12), 1);
	cr_assert_eq(bkv_pool_can_admit(p, 13), 0);
	bkv_pool_destroy(p);
}

/* ---- sequences ----------------------------------------------------------- */

Test(pool_seqs, ids_carry_a_generation_and_closed_ids_are_unknown)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, c;
	bkv_seq_info info;

	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(a, 1u << 20);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(b, (1u << 20) | 1);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, a), BKV_ENOENT);
	cr_assert_eq(bkv_seq_info_get(p, a, &info), BKV_ENOENT);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(c, (1u << 20) | 2); /* FIFO: slot 0 waits its turn */
	bkv_pool_destroy(p);
}

Test(pool_seqs, max_seqs_open_is_eagain)
{
	bkv_pool_config cfg;
	bkv_pool *p;
	uint32_t a, b, c;

	bkv_pool_config_init(&cfg);
	cfg.device_blocks = 8;
	cfg.max_seqs = 2;
	cr_assert_eq(bkv_pool_create(&cfg, NULL, &p), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_EAGAIN);
	cr_assert_eq(bkv_seq_fork(p, a, &c), BKV_EAGAIN);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(c, (2u << 20) | 0);
	cr_assert_eq(pool_stats(p).nr_seqs, 2);
	bkv_pool_destroy(p);
}
