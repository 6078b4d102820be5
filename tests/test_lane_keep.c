/*
 * test_lane_keep.c - the lane keeping rule (pool/lanes.c, "Keeping"): a
 * block a sliding window leaves behind goes to the prefix cache cold,
 * evicted before every other cached block, unless a hit is expected to end
 * where it serves - at the end of the sequence's last multi-token append
 * (a prompt) or where its last prefix lookup left group 0's cached chain.
 *
 * Each test builds a small full + window pool (block 4, window 8 tokens:
 * a hit ending at block e needs the window blocks first(e) = e - 2 and
 * e - 1), arranges the cache, then forces a known number of evictions
 * with one append of fresh tokens (a single append holds all of its own
 * window blocks: they are released at the next append) and reads what
 * survived through appends whose every token is a hit (they take no
 * block, so the probes evict nothing).
 */
#include <criterion/criterion.h>

#include <string.h>

#include "internal.h"

#define BT 4u

static const bkv_kv_group full_window[2] = {{BKV_GROUP_FULL, 1, 0, 0, 64},
					    {BKV_GROUP_WINDOW, 1, 8, 0, 64}};

static bkv_pool *make_pool(uint32_t nb, const bkv_kv_group *g, uint32_t ng, int cache)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = BT;
	c.device_blocks = nb;
	c.max_seqs = 16;
	c.prefix_cache = cache;
	c.n_groups = ng;
	c.groups = g;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

/* n tokens of family f: distinct across families. */
static void toks(int32_t *out, uint32_t n, int32_t f)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		out[i] = f * 1000 + (int32_t)i;
}

/* Cached blocks released cold. */
static uint32_t cold_blocks(const bkv_pool *p)
{
	uint32_t i, n = 0;

	for (i = 0; p->kv.val && i < p->kv.nb; i++)
		n += p->kv.val[i].cold;
	return n;
}

static uint32_t stat_free(const bkv_pool *p)
{
	bkv_pool_stats st;

	st.size = sizeof st;
	bkv_pool_stats_get(p, &st);
	return st.nr_free;
}

/* Open a sequence and append tok[0, n) in one call; returns its hit. */
static uint32_t open_append(bkv_pool *p, const int32_t *tok, uint32_t n, uint32_t *seq)
{
	uint32_t hit = 0;

	cr_assert_eq(bkv_seq_open(p, seq), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, *seq, tok, n, &hit), BKV_OK);
	return hit;
}

/* One token at a time, as decode appends (each append releases what the
 * window left behind before it). */
static void decode(bkv_pool *p, uint32_t seq, const int32_t *tok, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		cr_assert_eq(bkv_seq_append(p, seq, tok + i, 1, NULL), BKV_OK);
}

/* Take `evict` blocks from the cache: one append of fresh tokens that
 * needs the free blocks and `evict` more (two frames a block). */
static void force_evictions(bkv_pool *p, uint32_t evict, int32_t family)
{
	uint32_t need = stat_free(p) + evict, c;
	int32_t fresh[256];

	cr_assert_eq(need % 2, 0, "a block takes a frame in each group");
	cr_assert_leq(need / 2 * BT, 256);
	toks(fresh, need / 2 * BT, family);
	cr_assert_eq(open_append(p, fresh, need / 2 * BT, &c), 0);
	cr_assert_eq(stat_free(p), 0);
}

Test(lane_keep, window_blocks_left_mid_prompt_go_before_older_cached_chains)
{
	bkv_pool *p = make_pool(64, full_window, 2, 1);
	int32_t x[24], a[56];
	uint32_t sx, sa, sd, se, sf;

	toks(x, 24, 1);
	toks(a, 56, 2);
	/* X: 6 blocks in each group, closed: cached (its end is kept) */
	cr_assert_eq(open_append(p, x, 24, &sx), 0);
	cr_assert_eq(bkv_seq_close(p, sx), BKV_OK);
	/* A: a prompt of 8 blocks, then 24 decode tokens: its window leaves
	 * blocks 0..11 behind. Those a hit ending anywhere in what the
	 * prompt's last token reads would need (4..7) are kept; 0..3 and
	 * 8..11 go cold. */
	cr_assert_eq(open_append(p, a, 32, &sa), 0);
	decode(p, sa, a + 32, 24);
	cr_expect_eq(cold_blocks(p), 8);
	cr_expect_eq(bkv_pool_check(p), 0);
	/* eight evictions take exactly the cold blocks, though X's blocks
	 * were released earlier (LRU alone would take six of X's window
	 * blocks and two of its full ones) */
	force_evictions(p, 8, 3);
	cr_expect_eq(cold_blocks(p), 0);
	cr_expect_eq(open_append(p, x, 24, &sd), 24, "X's chain survived whole");
	cr_expect_eq(open_append(p, a, 32, &se), 32, "a hit at A's prompt end");
	cr_expect_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_close(p, sd), BKV_OK); /* room for F's own blocks */
	cr_assert_eq(bkv_seq_close(p, se), BKV_OK);
	/* a hit ending past the prompt needed the cold blocks 10 and 11:
	 * it is shortened to the prompt's end */
	cr_expect_eq(open_append(p, a, 48, &sf), 32);
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(lane_keep, window_blocks_where_a_lookup_left_the_cached_chain_are_kept)
{
	bkv_pool *p = make_pool(63, full_window, 2, 1);
	int32_t x[24], a[60];
	uint32_t sx, sa, sp, sq;

	toks(x, 24, 1);
	memcpy(a, x, sizeof x); /* A shares X's 6 blocks, then diverges */
	toks(a + 24, 36, 2);
	cr_assert_eq(open_append(p, x, 24, &sx), 0);
	cr_assert_eq(bkv_seq_close(p, sx), BKV_OK);
	/* A's lookup left X's chain at block 6: a keep point (window blocks
	 * 4 and 5, X's, which the hit pinned); its prompt ends at 12 (keeps
	 * 8..11); decoding to 60 tokens leaves 4..12 behind: 6, 7 and 12 go
	 * cold */
	cr_assert_eq(open_append(p, a, 48, &sa), 24);
	decode(p, sa, a + 48, 12);
	cr_expect_eq(cold_blocks(p), 3);
	cr_expect_eq(bkv_pool_check(p), 0);
	/* seven evictions: the three cold blocks, then the oldest others (X's
	 * window blocks 3..0, released at its close); 4 and 5 stay, which
	 * LRU alone would have taken */
	force_evictions(p, 7, 3);
	cr_expect_eq(open_append(p, x, 24, &sp), 24, "a hit where A's lookup stopped");
	/* a hit ending at block 8 needed the cold 6 and 7: shortened to 6 */
	cr_expect_eq(open_append(p, a, 32, &sq), 24);
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(lane_keep, a_window_block_a_hit_reads_is_never_cold_while_pinned)
{
	bkv_pool *p = make_pool(64, full_window, 2, 1);
	int32_t a[56];
	uint32_t sa, sb, i, pinned_cold = 0;

	toks(a, 56, 2);
	cr_assert_eq(open_append(p, a, 32, &sa), 0);
	decode(p, sa, a + 32, 24);
	cr_assert_eq(cold_blocks(p), 8);
	cr_assert_eq(bkv_seq_close(p, sa), BKV_OK);
	/* B hits A's first 16 tokens, ending at block 4: its window blocks
	 * 2 and 3 were cold; the hit takes them off the LRU, no longer cold */
	cr_expect_eq(open_append(p, a, 16, &sb), 16);
	cr_expect_eq(cold_blocks(p), 6);
	for (i = 0; i < p->kv.nb; i++)
		pinned_cold += p->kv.val[i].cold && BLOCK_IS_PINNED(&p->kv.blk[i]);
	cr_expect_eq(pinned_cold, 0);
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(lane_keep, only_pools_whose_lanes_release_blocks_into_a_cache_keep_by_the_rule)
{
	static const bkv_kv_group full2[2] = {{BKV_GROUP_FULL, 1, 0, 0, 64},
					      {BKV_GROUP_FULL, 1, 0, 0, 64}};
	static const bkv_kv_group chunked[2] = {{BKV_GROUP_FULL, 1, 0, 0, 64},
						{BKV_GROUP_CHUNKED, 1, 8, 0, 64}};
	bkv_pool *p;

	p = make_pool(64, NULL, 0, 1); /* no groups: the plain pool */
	cr_expect_null(p->kv.val);
	bkv_pool_destroy(p);
	p = make_pool(64, full2, 2, 1); /* a FULL lane never releases */
	cr_expect_null(p->kv.val);
	bkv_pool_destroy(p);
	p = make_pool(64, full_window, 2, 0); /* no prefix cache */
	cr_expect_null(p->kv.val);
	bkv_pool_destroy(p);
	p = make_pool(64, chunked, 2, 1);
	cr_expect_not_null(p->kv.val);
	cr_expect_eq(p->kv.val_lanes, 1);
	bkv_pool_destroy(p);
}

Test(lane_keep, eviction_by_value_keeps_the_cold_blocks_below_every_value)
{
	/* the window's blocks no hit ends at would take half the cache in
	 * release order among the priced ones: cold, in class 0 alone */
	bkv_pool *p = make_pool(64, full_window, 2, 1);
	int32_t a[56];
	uint32_t sa, sb, i, cls_ok = 1;

	cr_assert_eq(bkv__pool_value_on(p, 1.0, 0.01), BKV_OK);
	toks(a, 56, 2);
	cr_assert_eq(open_append(p, a, 32, &sa), 0);
	decode(p, sa, a + 32, 24);
	cr_expect_eq(cold_blocks(p), 8, "priced, the window's blocks still go cold");
	for (i = 0; i < p->kv.nb; i++)
		if (p->kv.val[i].on)
			cls_ok &= (p->kv.val[i].cls == 0) == (p->kv.val[i].cold == 1);
	cr_expect(cls_ok, "class 0 holds the cold blocks alone");
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv__pool_value_off(p); /* the rule's LRU again for what follows */
	toks(a, 56, 4);
	cr_assert_eq(open_append(p, a, 32, &sb), 0);
	decode(p, sb, a + 32, 24);
	cr_expect_eq(cold_blocks(p), 16);
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* Chains of 6 families, some reused, their prompts decoded on, through a
 * 64-frame pool: the hit tokens of each open, in order. */
static void lane_traffic(int value, uint32_t *hits, uint32_t n)
{
	bkv_pool *p = make_pool(64, full_window, 2, 1);
	int32_t a[40];
	uint32_t i, s;

	if (value)
		cr_assert_eq(bkv__pool_value_on(p, 1.0, 0.5), BKV_OK);
	for (i = 0; i < n; i++) {
		int32_t f = (int32_t)((i * 7u + i / 3u) % 6u) + 1;

		toks(a, 40, f);
		hits[i] = open_append(p, a, 24 + 4 * (i % 3), &s);
		decode(p, s, a + 36, 4);
		cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
		cr_assert_eq(bkv_pool_check(p), 0);
	}
	if (value)
		bkv__pool_value_off(p);
	bkv_pool_destroy(p);
}

Test(lane_keep, eviction_by_value_with_a_window_orders_as_lru)
{
	/* a price per block would keep a chain's prefix once the window's
	 * blocks at its end are gone: with a window group, value's order is
	 * the lane keeping rule's LRU, hit for hit */
	uint32_t h[2][48], i, any = 0;

	lane_traffic(0, h[0], 48);
	lane_traffic(1, h[1], 48);
	for (i = 0; i < 48; i++) {
		cr_expect_eq(h[0][i], h[1][i], "open %u: LRU hit %u, value %u", i, h[0][i], h[1][i]);
		any += h[0][i];
	}
	cr_expect_gt(any, 0, "the traffic hits");
}

Test(lane_keep, retention_bands_keep_cold_blocks_below_every_band)
{
	bkv_pool *p = make_pool(64, full_window, 2, 1);
	int32_t a[56];
	uint32_t sa, i, cls_ok = 1;

	cr_assert_eq(bkv__pool_retain_on(p, BKV__RET_BANDS), BKV_OK);
	toks(a, 56, 2);
	cr_assert_eq(open_append(p, a, 32, &sa), 0);
	decode(p, sa, a + 32, 24);
	cr_expect_eq(cold_blocks(p), 8, "no prices: the rule still releases cold");
	for (i = 0; i < p->kv.nb; i++)
		if (p->kv.val[i].on)
			cls_ok &= (p->kv.val[i].cls == 0) == (p->kv.val[i].cold == 1);
	cr_expect(cls_ok, "class 0 holds the cold blocks alone");
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv__pool_retain_off(p, BKV__RET_BANDS);
	cr_expect_eq(p->kv.val_lanes, 1);
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(lane_keep, checker_catches_a_cold_block_off_class_zero)
{
	bkv_pool *p = make_pool(64, full_window, 2, 1);
	int32_t a[56];
	uint32_t sa, i;
	int32_t b = -1;

	toks(a, 56, 2);
	cr_assert_eq(open_append(p, a, 32, &sa), 0);
	decode(p, sa, a + 32, 24);
	cr_assert_eq(bkv_pool_check(p), 0);
	for (i = 0; i < p->kv.nb && b < 0; i++)
		if (BLOCK_IS_PINNED(&p->kv.blk[i]))
			b = (int32_t)i;
	cr_assert_geq(b, 0);
	p->kv.val[b].cold = 1; /* pinned: not on the LRU */
	cr_expect_eq(bkv_pool_check(p), CHECK_VALUE);
	p->kv.val[b].cold = 0;
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}
