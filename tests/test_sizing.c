/*
 * test_sizing.c - KV sizing of hybrid models (lib/base/sizing.c): group
 * pages, frames, state units, blocks held per sequence and the bytes a
 * sequence needs, with gpt-oss-20b's published shape as the worked example
 * (docs/design.md, "KV groups: sizing").
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "batchkv.h"

#include <stdint.h>

/* gpt-oss-20b: 24 layers alternating a 128-token window and full attention,
 * 8 KV heads x 64 dims, bf16: 2 x 8 x 64 x 2 = 2,048 bytes per token per
 * layer. */
#define OSS_BYTES 2048u
static const bkv_kv_group oss20b[2] = {
	{BKV_GROUP_FULL, 12, 0, 0, OSS_BYTES},
	{BKV_GROUP_WINDOW, 12, 128, 0, OSS_BYTES},
};
static const bkv_kv_group oss20b_all_full[1] = {
	{BKV_GROUP_FULL, 24, 0, 0, OSS_BYTES},
};

Test(sizing, gpt_oss_20b_full_layers_hold_805306368_bytes_at_32k)
{
	cr_expect_eq(bkv_kv_seq_bytes(&oss20b[0], 1, 0, 32768), 805306368u);
	/* Token-exact the 12 windowed layers keep 128 tokens: 3,145,728 bytes. */
	cr_expect_eq(bkv_kv_seq_bytes(&oss20b[1], 1, 0, 32768), 3145728u);
	cr_expect_eq(bkv_kv_seq_bytes(oss20b, 2, 0, 32768), 805306368u + 3145728u);
	/* All layers full: 1.5 GiB. */
	cr_expect_eq(bkv_kv_seq_bytes(oss20b_all_full, 1, 0, 32768), 1610612736u);
}

Test(sizing, gpt_oss_20b_window_group_holds_nine_blocks_at_block_16)
{
	/* The token at 32768 reads 32641..32768: blocks 2040..2048. */
	cr_expect_eq(bkv_kv_group_blocks_held(&oss20b[1], 16, 32768), 9u);
	cr_expect_eq(bkv_kv_group_blocks_held(&oss20b[0], 16, 32768), 2049u);
	cr_expect_eq(bkv_kv_frame_bytes(oss20b, 2, 16), 16u * 12u * OSS_BYTES);
	/* 9 blocks = 144 tokens x 12 layers x 2,048 bytes. */
	uint64_t window = bkv_kv_group_blocks_held(&oss20b[1], 16, 32768) *
			  bkv_kv_frame_bytes(oss20b, 2, 16);
	cr_expect_eq(window, 3538944u);
	cr_expect_eq(bkv_kv_seq_bytes(oss20b, 2, 16, 32768), (2049u + 9u) * 393216ull);
	cr_expect_eq(bkv_kv_seq_bytes(oss20b_all_full, 1, 16, 32768), 2049u * 786432ull);
}

Test(sizing, gpt_oss_20b_hybrid_fits_1_99x_the_sequences_of_all_full)
{
	const uint64_t budget = 80ull << 30; /* 80 GiB of KV */
	uint32_t hf = bkv_frames_for_bytes(budget, oss20b, 2, 16);
	uint32_t ff = bkv_frames_for_bytes(budget, oss20b_all_full, 1, 16);
	uint64_t per_h = bkv_kv_group_blocks_held(&oss20b[0], 16, 32768) +
			 bkv_kv_group_blocks_held(&oss20b[1], 16, 32768);
	uint64_t per_f = bkv_kv_group_blocks_held(&oss20b_all_full[0], 16, 32768);
	cr_expect_eq(hf, 218453u); /* 85,899,345,920 / 393,216 */
	cr_expect_eq(ff, 109226u); /* / 786,432 */
	uint64_t seqs_h = hf / per_h, seqs_f = ff / per_f;
	cr_expect_eq(seqs_h, 106u); /* 218,453 / 2,058 */
	cr_expect_eq(seqs_f, 53u);  /* 109,226 / 2,049 */
	/* The analytic ratio without the floors: 2 x 2049 / 2058. */
	double ratio = (double)hf / (double)per_h / ((double)ff / (double)per_f);
	cr_expect(ratio > 1.99 && ratio < 1.992, "ratio %f", ratio);
}

Test(sizing, one_full_group_frames_match_blocks_for_bytes)
{
	bkv_model_shape llama8b = {32, 8, 128, 2};
	bkv_kv_group g = {BKV_GROUP_FULL, 32, 0, 0, 2u * 8u * 128u * 2u};
	for (uint32_t bt = 1; bt <= 256; bt *= 2) {
		uint64_t budget = 70ull << 30;
		cr_expect_eq(bkv_frames_for_bytes(budget, &g, 1, bt),
			     bkv_blocks_for_bytes(budget, &llama8b, bt), "block_tokens %u", bt);
		cr_expect_eq(bkv_kv_frame_bytes(&g, 1, bt), bkv_kv_bytes_per_token(&llama8b) * bt);
	}
}

/* One row of the blocks-held table: a group, a block size, a length, the
 * blocks the analytic formula gives. */
typedef struct held_case {
	uint32_t kind, span, block_tokens; /* the group's kind and span; the pool's block */
	uint64_t tokens;                   /* tokens already in the sequence */
	uint64_t held;                     /* expected blocks */
} held_case;

ParameterizedTestParameters(sizing, blocks_held_cover_what_the_next_token_reads)
{
	static held_case cases[] = {
		{BKV_GROUP_FULL, 0, 16, 0, 1},        {BKV_GROUP_FULL, 0, 16, 15, 1},
		{BKV_GROUP_FULL, 0, 16, 16, 2},       {BKV_GROUP_FULL, 0, 1, 7, 8},
		/* window 128: next token at p reads p-127..p */
		{BKV_GROUP_WINDOW, 128, 16, 0, 1},    {BKV_GROUP_WINDOW, 128, 16, 127, 8},
		{BKV_GROUP_WINDOW, 128, 16, 128, 9},  {BKV_GROUP_WINDOW, 128, 16, 143, 8},
		{BKV_GROUP_WINDOW, 128, 16, 144, 9},  {BKV_GROUP_WINDOW, 1, 16, 1000, 1},
		{BKV_GROUP_WINDOW, 17, 16, 31, 2},    {BKV_GROUP_WINDOW, 17, 16, 32, 2},
		{BKV_GROUP_WINDOW, 17, 16, 33, 2},
		/* chunk 64: p reads floor(p/64)*64..p */
		{BKV_GROUP_CHUNKED, 64, 16, 0, 1},    {BKV_GROUP_CHUNKED, 64, 16, 63, 4},
		{BKV_GROUP_CHUNKED, 64, 16, 64, 1},   {BKV_GROUP_CHUNKED, 64, 16, 100, 3},
		{BKV_GROUP_CHUNKED, 8192, 16, 8191, 512}, {BKV_GROUP_CHUNKED, 24, 16, 30, 1},
		{BKV_GROUP_CHUNKED, 24, 16, 40, 2},   {BKV_GROUP_CHUNKED, 24, 16, 50, 1},
		{BKV_GROUP_STATE, 0, 16, 500, 0},
	};
	return cr_make_param_array(held_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(held_case *c, sizing, blocks_held_cover_what_the_next_token_reads)
{
	bkv_kv_group g = {c->kind, 4, c->span, 0, 256};
	cr_expect_eq(bkv_kv_group_blocks_held(&g, c->block_tokens, c->tokens), c->held,
		     "kind %u span %u block %u tokens %llu", c->kind, c->span, c->block_tokens,
		     (unsigned long long)c->tokens);
}

/* The count the formula gives, by brute force: mark every block of a
 * position the next token reads. */
static uint64_t held_by_walk(const bkv_kv_group *g, uint32_t bt, uint64_t tokens)
{
	uint64_t lo = 0, blocks = 0, last = UINT64_MAX;
	if (g->kind == BKV_GROUP_WINDOW)
		lo = tokens + 1 > g->span ? tokens + 1 - g->span : 0;
	else if (g->kind == BKV_GROUP_CHUNKED)
		lo = tokens - tokens % g->span;
	for (uint64_t p = lo; p <= tokens; p++) {
		if (p / bt != last)
			blocks++;
		last = p / bt;
	}
	return blocks;
}

Test(sizing, blocks_held_equal_a_walk_over_positions)
{
	static const uint32_t spans[] = {1, 3, 16, 17, 100, 128};
	for (uint32_t k = BKV_GROUP_WINDOW; k <= BKV_GROUP_CHUNKED; k++)
		for (size_t si = 0; si < sizeof(spans) / sizeof(spans[0]); si++)
			for (uint32_t bt = 1; bt <= 32; bt *= 2)
				for (uint64_t t = 0; t < 300; t++) {
					bkv_kv_group g = {k, 2, spans[si], 0, 64};
					cr_assert_eq(bkv_kv_group_blocks_held(&g, bt, t),
						     held_by_walk(&g, bt, t),
						     "kind %u span %u bt %u t %llu", k, spans[si], bt,
						     (unsigned long long)t);
				}
}

Test(sizing, token_exact_chunked_counts_the_last_tokens_chunk)
{
	bkv_kv_group g = {BKV_GROUP_CHUNKED, 3, 8192, 0, 1000};
	cr_expect_eq(bkv_kv_seq_bytes(&g, 1, 0, 0), 0u);
	cr_expect_eq(bkv_kv_seq_bytes(&g, 1, 0, 1), 3000u);
	cr_expect_eq(bkv_kv_seq_bytes(&g, 1, 0, 8192), 8192u * 3000u);
	cr_expect_eq(bkv_kv_seq_bytes(&g, 1, 0, 8193), 3000u);
	cr_expect_eq(bkv_kv_seq_bytes(&g, 1, 0, 20000), (20000u - 16384u) * 3000u);
}

Test(sizing, state_unit_takes_whole_frames_beside_attention)
{
	/* 12 full layers of 2,048 B at block 16 (393,216 B frames) and 36
	 * state layers of 1,000,000 B: a 36,000,000 B unit in 92 frames. */
	bkv_kv_group g[2] = {
		{BKV_GROUP_FULL, 12, 0, 0, 2048},
		{BKV_GROUP_STATE, 36, 256, 0, 1000000},
	};
	cr_expect_eq(bkv_kv_group_page_bytes(&g[1], 16), 36000000u);
	cr_expect_eq(bkv_kv_frame_bytes(g, 2, 16), 393216u);
	cr_expect_eq(bkv_kv_state_frames(g, 2, 16), 92u); /* ceil(91.55) */
	cr_expect_eq(bkv_kv_group_blocks_held(&g[1], 16, 4096), 0u);
	cr_expect_eq(bkv_kv_seq_bytes(g, 2, 16, 4096), (257u + 92u) * 393216ull);
	cr_expect_eq(bkv_kv_seq_bytes(g, 2, 0, 4096), 4096u * 12u * 2048u + 36000000u);
	/* Without attention the frame is the unit itself. */
	cr_expect_eq(bkv_kv_frame_bytes(&g[1], 1, 16), 36000000u);
	cr_expect_eq(bkv_kv_state_frames(&g[1], 1, 16), 1u);
	/* No STATE group: no state frames. */
	cr_expect_eq(bkv_kv_state_frames(g, 1, 16), 0u);
}

Test(sizing, smaller_page_shares_the_largest_frame)
{
	bkv_kv_group g[2] = {
		{BKV_GROUP_FULL, 4, 0, 0, 4096},
		{BKV_GROUP_WINDOW, 20, 1024, 0, 2048},
	};
	cr_expect_eq(bkv_kv_group_page_bytes(&g[0], 32), 32u * 4u * 4096u);
	cr_expect_eq(bkv_kv_group_page_bytes(&g[1], 32), 32u * 20u * 2048u);
	cr_expect_eq(bkv_kv_frame_bytes(g, 2, 32), 32u * 20u * 2048u);
	cr_expect_eq(bkv_frames_for_bytes(1310720u * 10u + 5u, g, 2, 32), 10u);
}

Test(sizing, bad_groups_give_zero)
{
	const bkv_kv_group ok = {BKV_GROUP_WINDOW, 2, 64, 0, 128};
	bkv_kv_group bad[] = {
		{BKV_GROUP_WINDOW, 0, 64, 0, 128}, /* no layers */
		{BKV_GROUP_WINDOW, 2, 64, 0, 0},   /* no bytes */
		{BKV_GROUP_WINDOW, 2, 0, 0, 128},  /* no window */
		{BKV_GROUP_CHUNKED, 2, 0, 0, 128}, /* no chunk */
		{BKV_GROUP_FULL, 2, 64, 0, 128},   /* span on a full group */
		{BKV_GROUP_WINDOW, 2, 64, 1, 128}, /* reserved set */
		{7, 2, 64, 0, 128},                /* unknown kind */
		{BKV_GROUP_STATE, 2, 24, 0, 128},  /* checkpoints off the block */
		{BKV_GROUP_FULL, 2, 0, 0, UINT64_MAX}, /* page overflows */
	};
	cr_expect_eq(bkv_kv_group_page_bytes(&ok, 16), 16u * 2u * 128u);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_expect_eq(bkv_kv_group_page_bytes(&bad[i], 16), 0u, "case %zu", i);
		cr_expect_eq(bkv_kv_frame_bytes(&bad[i], 1, 16), 0u, "case %zu", i);
		cr_expect_eq(bkv_frames_for_bytes(1ull << 40, &bad[i], 1, 16), 0u, "case %zu", i);
		cr_expect_eq(bkv_kv_seq_bytes(&bad[i], 1, 16, 100), 0u, "case %zu", i);
		if (i < 8)
			cr_expect_eq(bkv_kv_group_blocks_held(&bad[i], 16, 100), 0u, "case %zu", i);
	}
	cr_expect_eq(bkv_kv_group_page_bytes(NULL, 16), 0u);
	cr_expect_eq(bkv_kv_group_page_bytes(&ok, 0), 0u);
	cr_expect_eq(bkv_kv_group_page_bytes(&ok, 24), 0u);
	cr_expect_eq(bkv_kv_group_blocks_held(&ok, 24, 100), 0u);
	cr_expect_eq(bkv_kv_group_blocks_held(&ok, 16, UINT64_MAX), 0u);
	cr_expect_eq(bkv_kv_frame_bytes(NULL, 1, 16), 0u);
	cr_expect_eq(bkv_kv_frame_bytes(&ok, 0, 16), 0u);
	cr_expect_eq(bkv_kv_seq_bytes(&ok, 1, 24, 100), 0u);
	cr_expect_eq(bkv_kv_seq_bytes(&ok, 1, 0, UINT64_MAX), 0u);
}

/* A window or chunk span of 2^31 tokens or more is refused by the sizing
 * functions (0) exactly as bkv_pool_create refuses it (BKV_EINVAL); 2^31 - 1
 * is accepted by both. */
Test(sizing, spans_the_pool_refuses_give_zero)
{
	static const uint32_t spans[3] = {INT32_MAX, (uint32_t)INT32_MAX + 1, UINT32_MAX};
	static const uint32_t kinds[2] = {BKV_GROUP_WINDOW, BKV_GROUP_CHUNKED};

	for (size_t k = 0; k < 2; k++)
		for (size_t i = 0; i < 3; i++) {
			bkv_kv_group g[2] = {{BKV_GROUP_FULL, 2, 0, 0, 128},
					     {kinds[k], 2, spans[i], 0, 128}};
			bkv_pool_config c;
			bkv_pool *p = NULL;
			int ok = i == 0, rc;

			cr_expect_eq(bkv_kv_group_page_bytes(&g[1], 16) != 0, ok, "kind %u span %u",
				     kinds[k], spans[i]);
			cr_expect_eq(bkv_kv_frame_bytes(g, 2, 16) != 0, ok);
			cr_expect_eq(bkv_frames_for_bytes(1ull << 40, g, 2, 16) != 0, ok);
			cr_expect_eq(bkv_kv_group_blocks_held(&g[1], 16, 100) != 0, ok);
			cr_expect_eq(bkv_kv_seq_bytes(g, 2, 16, 100) != 0, ok);
			cr_expect_eq(bkv_kv_seq_bytes(g, 2, 0, 100) != 0, ok);
			bkv_pool_config_init(&c);
			c.block_tokens = 16;
			c.device_blocks = 64;
			c.n_groups = 2;
			c.groups = g;
			rc = bkv_pool_create(&c, NULL, &p);
			cr_expect_eq(rc, ok ? BKV_OK : BKV_EINVAL, "kind %u span %u: %d", kinds[k],
				     spans[i], rc);
			bkv_pool_destroy(p);
		}
}

Test(sizing, group_lists_take_at_most_eight_groups_and_one_state)
{
	bkv_kv_group g[BKV_MAX_GROUPS + 1];
	for (int i = 0; i <= BKV_MAX_GROUPS; i++)
		g[i] = (bkv_kv_group){BKV_GROUP_FULL, 1, 0, 0, 64};
	cr_expect_eq(bkv_kv_frame_bytes(g, BKV_MAX_GROUPS, 16), 1024u);
	cr_expect_eq(bkv_kv_frame_bytes(g, BKV_MAX_GROUPS + 1, 16), 0u);
	g[0] = (bkv_kv_group){BKV_GROUP_STATE, 1, 0, 0, 64};
	cr_expect_eq(bkv_kv_state_frames(g, 2, 16), 1u);
	g[1] = g[0];
	cr_expect_eq(bkv_kv_frame_bytes(g, 2, 16), 0u);
	cr_expect_eq(bkv_kv_state_frames(g, 2, 16), 0u);
	cr_expect_eq(bkv_kv_seq_bytes(g, 2, 0, 10), 0u);
}

Test(sizing, seq_bytes_that_overflow_give_zero)
{
	bkv_kv_group g[2] = {
		{BKV_GROUP_FULL, 1, 0, 0, 1ull << 40},
		{BKV_GROUP_FULL, 1, 0, 0, 1ull << 40},
	};
	cr_expect_eq(bkv_kv_seq_bytes(g, 1, 0, 1u << 20), 1ull << 60);
	cr_expect_eq(bkv_kv_seq_bytes(g, 2, 0, 1u << 23), 0u); /* 2 x 2^63 */
	cr_expect_eq(bkv_kv_seq_bytes(g, 1, 0, 1u << 24), 0u);
}
