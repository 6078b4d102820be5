/*
 * test_segmented.c - the segmented LRU (BKV_EVICT_SEGMENTED, lib/kv/value.c):
 * a cycle of chains longer than the cache keeps hits where LRU keeps none; a
 * prefix used once goes before a reused one; every invariant (the forest,
 * the lists, the protected count) after each step of random operations, with
 * and without KV groups; turning it on and off over a warm cache; chains that
 * come back after their eviction protected whole or not at all, so that a
 * cycle with a window group keeps whole sessions; and no allocation from the
 * first eviction on.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool_util.h"

#define BT 4u

/* A chain of n blocks from token first, appended in one call and closed
 * (cached); returns the tokens it hit. */
static uint32_t use_chain(bkv_pool *p, int32_t first, uint32_t n)
{
	int32_t t[512];
	uint32_t s, hit = 0;

	cr_assert(n * BT <= 512);
	fill_tokens(t, n * BT, first);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n * BT, &hit), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	return hit;
}

static bkv_pool *seg_pool(uint32_t nb, int segmented)
{
	bkv_pool *p = make_pool(BT, nb, 0, 0);

	if (segmented)
		cr_assert_eq(bkv__pool_seg_on(p), BKV_OK);
	return p;
}

/* 6 sessions of 16 blocks in rotation through a pool of 64 (the cycle is
 * 1.5 times the cache), 12 rounds: the hit tokens of the last 6 rounds. */
static uint32_t cycle_hits(int segmented)
{
	bkv_pool *p = seg_pool(64, segmented);
	uint32_t r, s, late = 0;

	for (r = 0; r < 12; r++)
		for (s = 0; s < 6; s++) {
			uint32_t h = use_chain(p, (int32_t)(1000 * (s + 1)), 16);

			if (r >= 6)
				late += h;
		}
	bkv_pool_destroy(p);
	return late;
}

Test(segmented, a_cycle_longer_than_the_cache_keeps_hits_where_lru_keeps_none)
{
	/* 6 rounds x 6 sessions x 64 tokens = 2,304 tokens asked; the running
	 * session holds 16 of the 64 blocks, so at most 48 blocks (3
	 * sessions, 1,152 tokens) can be kept through a round: at least two
	 * sessions hit whole every round (768) */
	uint32_t lru = cycle_hits(0), seg = cycle_hits(1);

	cr_expect_eq(lru, 0, "LRU evicts each session just before its turn");
	cr_expect_geq(seg, 768, "segmented kept %u tokens", seg);
	cr_expect_leq(seg, 1152);
}

/* A: 8 blocks used three times; then a scan of one-off chains (48
 * blocks, more than the pool holds besides A). */
static uint32_t scan_then_reuse(int segmented)
{
	bkv_pool *p = seg_pool(48, segmented);
	uint32_t i, h;

	for (i = 0; i < 3; i++)
		use_chain(p, 1, 8);
	for (i = 0; i < 6; i++)
		cr_assert_eq(use_chain(p, (int32_t)(10000 + 1000 * i), 8), 0);
	h = use_chain(p, 1, 8);
	bkv_pool_destroy(p);
	return h;
}

Test(segmented, prefixes_used_once_go_before_a_reused_one)
{
	cr_expect_eq(scan_then_reuse(0), 0, "LRU lets the scan push A out");
	cr_expect_eq(scan_then_reuse(1), 32, "A's 8 blocks are protected");
}

/* Random opens, appends (often sharing one of a few prefixes), closes,
 * drops, forks and truncates; the whole pool checked after each one. */
static void random_ops(bkv_pool *p, uint64_t seed, uint32_t steps)
{
	uint32_t open[16], n_open = 0, i;
	uint64_t x = seed;
	int32_t t[96];

	for (i = 0; i < steps; i++) {
		uint32_t op = (uint32_t)(test_rand(&x) % 8), k, s, hit;
		int rc;

		if (n_open == 0 || (op < 3 && n_open < 16)) {
			if (bkv_seq_open(p, &s) == BKV_OK)
				open[n_open++] = s;
			continue;
		}
		k = (uint32_t)(test_rand(&x) % n_open);
		s = open[k];
		switch (op) {
		case 3:
		case 4: { /* a prompt from one of 5 prefixes, or fresh tokens */
			uint32_t n = 1 + (uint32_t)(test_rand(&x) % 95);
			uint32_t pre = (uint32_t)(test_rand(&x) % 6);

			fill_tokens(t, n, pre < 5 ? (int32_t)(100000 * (pre + 1))
						  : (int32_t)(test_rand(&x) % 1000000));
			rc = bkv_seq_append(p, s, t, n, &hit);
			cr_assert(rc == BKV_OK || rc == BKV_ENOSPC || rc == BKV_E2BIG, "append: %d",
				  rc);
			break;
		}
		case 5:
			cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
			open[k] = open[--n_open];
			break;
		case 6:
			cr_assert_eq(bkv_seq_drop(p, s), BKV_OK);
			open[k] = open[--n_open];
			break;
		default: {
			uint32_t c;

			if (n_open < 16 && bkv_seq_fork(p, s, &c) == BKV_OK)
				open[n_open++] = c;
			break;
		}
		}
		cr_assert_eq(bkv_pool_check(p), 0, "step %u", i);
	}
	for (i = 0; i < n_open; i++)
		cr_assert_eq(bkv_seq_close(p, open[i]), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_gt(pool_stats(p).evictions, 0, "the cache was never full");
}

Test(segmented, random_operations_keep_every_invariant)
{
	uint64_t seed;

	for (seed = 1; seed <= 6; seed++) {
		bkv_pool *p = seg_pool(96, 1);

		random_ops(p, seed, 1500);
		bkv_pool_destroy(p);
	}
}

Test(segmented, random_operations_with_a_window_group_keep_every_invariant)
{
	static const bkv_kv_group g[2] = {
		{BKV_GROUP_FULL, 2, 0, 0, 256},
		{BKV_GROUP_WINDOW, 2, 12, 0, 256},
	};
	uint64_t seed;

	for (seed = 11; seed <= 14; seed++) {
		bkv_pool_config c;
		bkv_pool *p = NULL;

		bkv_pool_config_init(&c);
		c.block_tokens = BT;
		c.device_blocks = 160;
		c.max_seqs = 64;
		c.n_groups = 2;
		c.groups = g;
		cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
		cr_assert_eq(bkv__pool_seg_on(p), BKV_OK);
		random_ops(p, seed, 1500);
		bkv__pool_seg_off(p);
		cr_assert_eq(bkv_pool_check(p), 0);
		bkv_pool_destroy(p);
	}
}

Test(segmented, on_and_off_over_a_warm_cache_with_eviction_by_value)
{
	bkv_pool *p = seg_pool(64, 0);
	uint32_t i;

	for (i = 0; i < 6; i++)
		use_chain(p, (int32_t)(1000 * (i + 1)), 8);
	cr_assert_eq(bkv__pool_value_on(p, 1.0, 0.5), BKV_OK);
	cr_assert_eq(bkv__pool_seg_on(p), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	for (i = 0; i < 12; i++)
		use_chain(p, (int32_t)(1000 * (i % 9 + 1)), 8);
	bkv__pool_seg_off(p); /* by value again */
	cr_assert_eq(bkv_pool_check(p), 0);
	for (i = 0; i < 12; i++)
		use_chain(p, (int32_t)(1000 * (i % 9 + 1)), 8);
	bkv__pool_value_off(p);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* ---- chains that come back after their eviction --------------------------- */

static bkv_pool *window_pool(uint32_t nb)
{
	static const bkv_kv_group g[2] = {
		{BKV_GROUP_FULL, 2, 0, 0, 256},
		{BKV_GROUP_WINDOW, 2, 12, 0, 256},
	};
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = BT;
	c.device_blocks = nb;
	c.max_seqs = 16;
	c.n_groups = 2;
	c.groups = g;
	c.prefix_cache = 1;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	cr_assert_eq(bkv__pool_seg_on(p), BKV_OK);
	return p;
}

/* Counts of the sessions' closes: their hit tokens, and of the chains that
 * came back after an eviction, those protected whole and those left whole
 * on probation. */
typedef struct back_counts {
	uint32_t hit, whole, none;
} back_counts;

/* One turn of a session: its chain of n blocks from token first, closed;
 * the blocks it holds marked BACK (computed again after an eviction, or
 * extending such a chain) must land on one list, lane 0's and the
 * window's alike. */
static void back_turn(bkv_pool *p, int32_t first, uint32_t n, back_counts *bc)
{
	int32_t t[512], ids[2 * 128];
	uint32_t s, hit = 0, k = 0, i, l, prot = 0, prob = 0, back;
	const bkv__seq *q;

	fill_tokens(t, n * BT, first);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n * BT, &hit), BKV_OK);
	q = bkv__seq_get(p, s);
	for (i = 0; i < n; i++) { /* the blocks it holds marked BACK */
		if (p->kv.val[q->table[i]].cls == BKV__SEG_BACK)
			ids[k++] = q->table[i];
		for (l = 0; l < p->n_lanes; l++) {
			int32_t b = p->lanes[l].seqs[q - p->seqs].table[i];

			if (i >= p->lanes[l].seqs[q - p->seqs].lo && b >= 0 &&
			    p->kv.val[b].cls == BKV__SEG_BACK)
				ids[k++] = b;
		}
	}
	back = k > 0;
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bc->hit += hit;
	if (!back)
		return;
	for (i = 0; i < k; i++) {
		const bkv__val *v = &p->kv.val[ids[i]];

		if (!v->on || v->cls == BKV__SEG_COLD)
			continue;
		prot += v->cls == BKV__SEG_PROT;
		prob += v->cls == BKV__SEG_PROB;
	}
	cr_expect(prot == 0 || prob == 0, "a chain back after its eviction split: %u protected, "
		  "%u on probation", prot, prob);
	bc->whole += prot > 0;
	bc->none += prot == 0;
}

Test(segmented, a_chain_back_after_its_eviction_is_protected_whole_or_not_at_all)
{
	/* 6 sessions with a window group, each turn 1 block longer, through
	 * a pool that holds about half of them: the ones that come back
	 * join the protected list whole while it has room for them whole */
	bkv_pool *p = window_pool(96);
	back_counts bc = {0, 0, 0};
	uint32_t r, s;

	for (r = 0; r < 14; r++)
		for (s = 0; s < 6; s++)
			back_turn(p, (int32_t)(1000 * (s + 1)), 12 + r, &bc);
	cr_expect_gt(bc.whole, 0, "no chain that came back was protected");
	cr_expect_gt(bc.none, 0, "every chain that came back fit (the test needs some that do not)");
	bkv_pool_destroy(p);
}

Test(segmented, a_cycle_with_a_window_group_keeps_whole_sessions)
{
	/* a window hit needs the window's blocks at the hit's end: sessions
	 * kept whole hit, trimmed ones hit nothing; of the last 7 rounds'
	 * 42 turns, 13 hit (6 when chains that come back join the protected
	 * list block by block) */
	bkv_pool *p = window_pool(96);
	back_counts bc = {0, 0, 0}, late;
	uint32_t r, s, turns = 0;

	for (r = 0; r < 14; r++) {
		if (r == 7)
			late = bc;
		for (s = 0; s < 6; s++) {
			uint32_t h0 = bc.hit;

			back_turn(p, (int32_t)(1000 * (s + 1)), 12 + r, &bc);
			turns += r >= 7 && bc.hit > h0;
		}
	}
	cr_expect_geq(turns, 12, "%u of 42 late turns hit (%u tokens)", turns, bc.hit - late.hit);
	bkv_pool_destroy(p);
}

/* ---- no allocation on eviction -------------------------------------------- */

Test(segmented, evictions_allocate_nothing)
{
	test_alloc_count c = {0};
	bkv_allocator a = test_counting_allocator(&c);
	bkv_pool_config cfg;
	bkv_pool *p = NULL;
	bkv_pool_stats st;
	uint64_t warm;
	uint32_t r, s;

	bkv_pool_config_init(&cfg);
	cfg.block_tokens = BT;
	cfg.device_blocks = 64;
	cfg.max_seqs = 16;
	cfg.prefix_cache = 1;
	cr_assert_eq(bkv_pool_create(&cfg, &a, &p), BKV_OK);
	cr_assert_eq(bkv__pool_seg_on(p), BKV_OK);
	for (s = 0; s < 24; s++) /* every slot's table grows once */
		use_chain(p, (int32_t)(1000 * (s % 6 + 1)), 16);
	warm = c.calls;
	for (r = 0; r < 8; r++)
		for (s = 0; s < 6; s++)
			use_chain(p, (int32_t)(1000 * (s + 1)), 16);
	st = pool_stats(p);
	cr_assert_gt(st.evictions, 100, "the rotation evicts (%llu)",
		     (unsigned long long)st.evictions);
	cr_assert_eq(c.calls, warm, "%llu allocations", (unsigned long long)(c.calls - warm));
	bkv_pool_destroy(p);
}
