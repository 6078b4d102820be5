/*
 * sizing.c - how many bytes a model's KV cache takes: per token for a plain
 * transformer, per frame, per state unit and per sequence for a hybrid.
 *
 * A plain transformer (seed 001): one token's KV is 2 (K and V) x layers x
 * kv_heads x head_dim x dtype_bytes. With kv_heads equal to the query heads
 * this is MHA; fewer is GQA; one is MQA.
 *
 * A hybrid model's layers fall into groups (bkv_kv_group): full attention,
 * a sliding window of W tokens, chunked local attention of C tokens, or a
 * recurrent state of a fixed size. Every attention group pages its KV in
 * blocks of the pool's block_tokens; one frame (device block) holds one
 * group's block, so a frame is as large as the largest group page and a
 * smaller page leaves the rest of its frame unused:
 *
 *     group page  = block_tokens x layers x bytes        (attention group)
 *     frame       = max over attention groups of their page
 *     state unit  = layers x bytes, in ceil(unit / frame) frames
 *
 *     gpt-oss-20b, block_tokens 16: both groups 12 layers x 2,048 bytes
 *     +------------------------------+
 *     | 16 tokens x 12 layers x 2 KiB|  one frame, 393,216 bytes, either group
 *     +------------------------------+
 *
 * What a sequence holds follows from which positions a token reads: the
 * token at position p of a FULL group reads 0..p, of a WINDOW group
 * p - W + 1..p, of a CHUNKED group floor(p / C) x C..p. A sequence of T
 * tokens computing the token at T holds, per attention group, the blocks
 * covering what that token reads, its own block included
 * (bkv_kv_group_blocks_held). docs/design.md ("KV groups: sizing") works
 * the gpt-oss-20b figures through.
 *
 * Everything here is pure arithmetic on the caller's structs, checked for
 * overflow of uint64_t; bad input gives 0 (no call here can fail any other
 * way).
 */
#include "base/base.h"

#include <stdio.h>

/* ---- checked arithmetic --------------------------------------------------- */

static int mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	if (b != 0 && a > UINT64_MAX / b)
		return 0;
	*out = a * b;
	return 1;
}

static int add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	if (a > UINT64_MAX - b)
		return 0;
	*out = a + b;
	return 1;
}

static int is_pow2(uint32_t x)
{
	return x != 0 && (x & (x - 1)) == 0;
}

static uint32_t clamp_i32(uint64_t v)
{
	return v > INT32_MAX ? (uint32_t)INT32_MAX : (uint32_t)v;
}

/* ---- plain transformers (seed 001) ---------------------------------------- */

uint64_t bkv_kv_bytes_per_token(const bkv_model_shape *shape)
{
	uint64_t v = 2;

	if (!shape || !shape->layers || !shape->kv_heads || !shape->head_dim ||
	    !shape->dtype_bytes)
		return 0;
	if (!mul_u64(v, shape->layers, &v) || !mul_u64(v, shape->kv_heads, &v) ||
	    !mul_u64(v, shape->head_dim, &v) || !mul_u64(v, shape->dtype_bytes, &v))
		return 0;
	return v;
}

uint32_t bkv_blocks_for_bytes(uint64_t budget, const bkv_model_shape *shape,
			      uint32_t block_tokens)
{
	uint64_t per_token = bkv_kv_bytes_per_token(shape);
	uint64_t per_block;

	if (!per_token || !block_tokens || !mul_u64(per_token, block_tokens, &per_block))
		return 0;
	return clamp_i32(budget / per_block);
}

/* ---- KV groups ------------------------------------------------------------- */

static const char *const kind_names[] = {"FULL", "WINDOW", "CHUNKED", "STATE"};

/* The rule group g breaks, as the tail of a message after the group's name
 * ("span = 0: a WINDOW group needs a span in 1..2147483647"), written into
 * buf (cap bytes; NULL, 0 to only ask): 1, or 0 when g keeps them all. */
static int group_fault(const bkv_kv_group *g, uint32_t block_tokens, char *buf, size_t cap)
{
	if (!g->layers)
		return snprintf(buf, cap, "layers = 0: must be >= 1"), 1;
	if (!g->bytes)
		return snprintf(buf, cap, "bytes = 0: must be >= 1"), 1;
	if (g->reserved)
		return snprintf(buf, cap, "reserved = %u: must be 0", g->reserved), 1;
	switch (g->kind) {
	case BKV_GROUP_FULL:
		if (g->span == 0)
			return 0;
		return snprintf(buf, cap, "span = %u: a FULL group has no span (0)", g->span), 1;
	case BKV_GROUP_WINDOW:
	case BKV_GROUP_CHUNKED: /* positions are int32_t: a span fits one */
		if (g->span >= 1 && g->span <= INT32_MAX)
			return 0;
		return snprintf(buf, cap, "span = %u: a %s group needs a span in 1..2147483647",
				g->span, kind_names[g->kind]), 1;
	case BKV_GROUP_STATE:
		if (!block_tokens || g->span % block_tokens == 0)
			return 0;
		return snprintf(buf, cap,
				"span = %u: a STATE group's span must be a multiple of "
				"block_tokens (%u)", g->span, block_tokens), 1;
	default:
		return snprintf(buf, cap,
				"kind = %u: not a bkv_group_kind (FULL 0, WINDOW 1, "
				"CHUNKED 2, STATE 3)", g->kind), 1;
	}
}

int bkv__kv_group_ok(const bkv_kv_group *g, uint32_t block_tokens)
{
	if (!g || (block_tokens && !is_pow2(block_tokens)))
		return 0;
	return !group_fault(g, block_tokens, NULL, 0);
}

int bkv__kv_groups_check(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens,
			 const char *owner)
{
	char why[160];
	uint32_t states = 0;

#define GROUPS_FAIL(...) (owner ? bkv__fail(BKV_EINVAL, __VA_ARGS__) : BKV_EINVAL)
	if (n == 0 || n > BKV_MAX_GROUPS)
		return GROUPS_FAIL("%s.n_groups = %u: must be 1..%u", owner, n, BKV_MAX_GROUPS);
	if (!groups)
		return GROUPS_FAIL("%s.groups = NULL with n_groups = %u", owner, n);
	for (uint32_t i = 0; i < n; i++) {
		if (group_fault(&groups[i], block_tokens, owner ? why : NULL, owner ? sizeof why : 0))
			return GROUPS_FAIL("bkv_kv_group[%u].%s", i, why);
		states += groups[i].kind == BKV_GROUP_STATE;
		if (states > 1)
			return GROUPS_FAIL("bkv_kv_group[%u].kind = STATE: at most one STATE group", i);
	}
#undef GROUPS_FAIL
	return BKV_OK;
}

int bkv__kv_groups_ok(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens)
{
	if (block_tokens && !is_pow2(block_tokens))
		return 0;
	return bkv__kv_groups_check(groups, n, block_tokens, NULL) == BKV_OK;
}

uint64_t bkv_kv_group_page_bytes(const bkv_kv_group *g, uint32_t block_tokens)
{
	uint64_t v;

	if (!is_pow2(block_tokens) || !bkv__kv_group_ok(g, block_tokens))
		return 0;
	if (!mul_u64(g->layers, g->bytes, &v))
		return 0;
	if (g->kind != BKV_GROUP_STATE && !mul_u64(v, block_tokens, &v))
		return 0;
	return v;
}

uint64_t bkv_kv_frame_bytes(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens)
{
	uint64_t frame = 0, state = 0;

	if (!is_pow2(block_tokens) || !bkv__kv_groups_ok(groups, n, block_tokens))
		return 0;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t page = bkv_kv_group_page_bytes(&groups[i], block_tokens);
		if (!page)
			return 0;
		if (groups[i].kind == BKV_GROUP_STATE)
			state = page;
		else if (page > frame)
			frame = page;
	}
	return frame ? frame : state;
}

/* The state unit of a valid group list and its frame: 0 without a STATE
 * group. */
static uint64_t state_page(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens)
{
	for (uint32_t i = 0; i < n; i++)
		if (groups[i].kind == BKV_GROUP_STATE)
			return bkv_kv_group_page_bytes(&groups[i], block_tokens);
	return 0;
}

uint32_t bkv_kv_state_frames(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens)
{
	uint64_t frame = bkv_kv_frame_bytes(groups, n, block_tokens);
	uint64_t unit, frames;

	if (!frame)
		return 0;
	unit = state_page(groups, n, block_tokens);
	frames = unit / frame + (unit % frame != 0);
	return frames > UINT32_MAX ? 0 : (uint32_t)frames;
}

/* First position the token at position p reads in group g (0 for FULL). */
static uint64_t first_read(const bkv_kv_group *g, uint64_t p)
{
	switch (g->kind) {
	case BKV_GROUP_WINDOW:
		return p + 1 > g->span ? p + 1 - g->span : 0;
	case BKV_GROUP_CHUNKED:
		return p / g->span * g->span;
	default:
		return 0;
	}
}

uint64_t bkv_kv_group_blocks_held(const bkv_kv_group *g, uint32_t block_tokens,
				  uint64_t tokens)
{
	if (!is_pow2(block_tokens) || !bkv__kv_group_ok(g, block_tokens) ||
	    tokens == UINT64_MAX)
		return 0;
	if (g->kind == BKV_GROUP_STATE)
		return 0;
	return tokens / block_tokens - first_read(g, tokens) / block_tokens + 1;
}

/* Tokens of KV group g keeps, token-exact, for a sequence of `tokens`
 * tokens: what the last token (position tokens - 1) read, its own included. */
static uint64_t exact_tokens(const bkv_kv_group *g, uint64_t tokens)
{
	if (tokens == 0 || g->kind == BKV_GROUP_STATE)
		return 0;
	return tokens - first_read(g, tokens - 1);
}

/* One group's share of bkv_kv_seq_bytes; 0 on overflow (the groups are
 * valid and bytes != 0, so a real share of 0 only comes from 0 tokens). */
static int group_seq_bytes(const bkv_kv_group *g, uint32_t block_tokens, uint64_t frame,
			   uint32_t state_frames, uint64_t tokens, uint64_t *out)
{
	uint64_t v;

	if (block_tokens == 0) {
		if (!mul_u64(g->layers, g->bytes, &v))
			return 0;
		return mul_u64(v, g->kind == BKV_GROUP_STATE ? 1 : exact_tokens(g, tokens), out);
	}
	if (g->kind == BKV_GROUP_STATE)
		return mul_u64(state_frames, frame, out);
	return mul_u64(bkv_kv_group_blocks_held(g, block_tokens, tokens), frame, out);
}

uint64_t bkv_kv_seq_bytes(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens,
			  uint64_t tokens)
{
	uint64_t frame = 0, total = 0, part;
	uint32_t state_frames = 0;

	if (!bkv__kv_groups_ok(groups, n, block_tokens) || tokens == UINT64_MAX)
		return 0;
	if (block_tokens) {
		frame = bkv_kv_frame_bytes(groups, n, block_tokens);
		state_frames = bkv_kv_state_frames(groups, n, block_tokens);
		if (!frame)
			return 0;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (!group_seq_bytes(&groups[i], block_tokens, frame, state_frames, tokens,
				     &part) ||
		    !add_u64(total, part, &total))
			return 0;
	}
	return total;
}

uint32_t bkv_frames_for_bytes(uint64_t budget, const bkv_kv_group *groups, uint32_t n,
			      uint32_t block_tokens)
{
	uint64_t frame = bkv_kv_frame_bytes(groups, n, block_tokens);

	return frame ? clamp_i32(budget / frame) : 0;
}
