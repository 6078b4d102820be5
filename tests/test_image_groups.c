/*
 * test_image_groups.c - export and import of a sequence between pools with
 * KV groups (full attention, a sliding window, a recurrent state).
 *
 * Each pool has a host model: one int per token slot of every frame. The
 * source's host "computes" token p of group g by writing kv_val(tok, p, g)
 * into the slot its group's table gives, and a state as state_val(tokens,
 * n) + j into the first slot of frame j of the unit it writes. After the
 * import the test performs the listed transfers (whole frames, source ->
 * destination) and reads the destination back through every group's table
 * and its state: every block a group holds reads the source's KV, every
 * block the group's next token reads is held, and the state is the
 * source's.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define BT 4u
#define NB 96u
#define W 12u
#define LEN 37u
#define MAXT (NB * 3)

/* full + window 12 + a state of 3 frames checkpointed every 8 tokens (a
 * frame is 4 x 2 x 256 = 2,048 bytes; the unit 5,000) */
static const bkv_kv_group groups3[3] = {
	{BKV_GROUP_FULL, 2, 0, 0, 256},
	{BKV_GROUP_WINDOW, 2, W, 0, 256},
	{BKV_GROUP_STATE, 1, 8, 0, 5000},
};

typedef struct side {
	bkv_pool *p;
	int32_t kv[NB * BT]; /* the host's device memory */
} side;

typedef struct image_buf {
	bkv_seq_image im;
	int32_t blocks[64];
	uint64_t hashes[64];
	int32_t tokens[256];
	int32_t group_blocks[64];
} image_buf;

/* 1: the pools' state units share the frames (state_share, floor 0) */
static int g_share;

static void side_init_nb(side *sd, const bkv_kv_group *g, uint32_t ng, uint32_t nb)
{
	bkv_pool_config c;

	cr_assert_leq(nb, NB);
	bkv_pool_config_init(&c);
	c.block_tokens = BT;
	c.device_blocks = nb;
	c.max_seqs = 8;
	c.n_groups = ng;
	c.groups = ng ? g : NULL;
	if (ng && g[ng - 1].kind == BKV_GROUP_STATE) {
		c.state_units = g_share ? 0 : 6;
		c.state_share = (uint32_t)g_share;
	}
	sd->p = NULL;
	cr_assert_eq(bkv_pool_create(&c, NULL, &sd->p), BKV_OK);
	memset(sd->kv, 0, sizeof sd->kv);
}

static void side_init(side *sd, const bkv_kv_group *g, uint32_t ng)
{
	side_init_nb(sd, g, ng, NB);
}

static void image_init(image_buf *b)
{
	memset(b, 0, sizeof *b);
	b->im.size = sizeof b->im;
	b->im.blocks = b->blocks;
	b->im.hashes = b->hashes;
	b->im.tokens = b->tokens;
	b->im.group_blocks = b->group_blocks;
	b->im.cap_blocks = 64;
	b->im.cap_tokens = 256;
}

static int32_t kv_val(const int32_t *tok, uint32_t p, uint32_t g)
{
	return tok[p] * 1000 + (int32_t)p * 8 + (int32_t)g + 1;
}

static int32_t state_val(const int32_t *tok, uint32_t n)
{
	uint32_t h = 7, i;

	for (i = 0; i < n; i++)
		h = h * 31 + (uint32_t)tok[i];
	return (int32_t)(h & 0x3fffffff) + 1;
}

static void fill_tokens(int32_t *t, uint32_t n, int32_t base)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		t[i] = base + (int32_t)i;
}

/* The host computes tokens [from, to) of seq (every attention group's held
 * blocks, and the state unit the append wrote). */
static void compute(side *sd, uint32_t seq, const int32_t *tok, uint32_t from, uint32_t to,
		    uint32_t st_frames)
{
	uint32_t g, p, n, j;
	int32_t in, out;

	for (g = 0; g < 2; g++) {
		const int32_t *t = bkv_seq_group_blocks(sd->p, seq, g, &n);

		cr_assert(t);
		for (p = from; p < to; p++)
			if (t[p / BT] >= 0)
				sd->kv[(uint32_t)t[p / BT] * BT + p % BT] = kv_val(tok, p, g);
	}
	cr_assert_eq(bkv_seq_state_frames(sd->p, seq, &in, &out), BKV_OK);
	cr_assert_geq(out, 0, "the append wrote a scratch state");
	for (j = 0; j < st_frames; j++)
		sd->kv[((uint32_t)out + j) * BT] = state_val(tok, to) + (int32_t)j;
}

/* A prefill of len tokens in two appends (the second trims the window), as
 * the host computes it. Returns the sequence. */
static uint32_t prefill(side *sd, const int32_t *tok, uint32_t len, uint32_t st_frames)
{
	uint32_t s;

	cr_assert_eq(bkv_seq_open_keyed(sd->p, 5, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(sd->p, s, tok, len - 1, NULL), BKV_OK);
	compute(sd, s, tok, 0, len - 1, st_frames);
	cr_assert_eq(bkv_seq_append(sd->p, s, tok + len - 1, 1, NULL), BKV_OK);
	compute(sd, s, tok, len - 1, len, st_frames);
	return s;
}

/* The first block the window's next token reads, for len tokens. */
static uint32_t window_first(uint32_t len)
{
	return len + 1 > W ? (len + 1 - W) / BT : 0;
}

static void perform(const side *src, side *dst, const bkv_copy *x, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		cr_assert(x[i].src >= 0 && (uint32_t)x[i].src < NB);
		cr_assert(x[i].dst >= 0 && (uint32_t)x[i].dst < NB);
		memcpy(dst->kv + (uint32_t)x[i].dst * BT, src->kv + (uint32_t)x[i].src * BT,
		       BT * sizeof(int32_t));
	}
}

/* dst's seq reads tok's KV in every held block of both attention groups,
 * holds every block the next token reads, and its state is tok's. */
static void verify(const side *dst, uint32_t seq, const int32_t *tok, uint32_t len,
		   uint32_t st_frames)
{
	uint32_t g, i, p, n, first, j;
	int32_t in, out;

	for (g = 0; g < 2; g++) {
		const int32_t *t = bkv_seq_group_blocks(dst->p, seq, g, &n);

		cr_assert(t);
		cr_assert_eq(n, (len + BT - 1) / BT);
		first = g ? window_first(len) : 0;
		for (i = 0; i < n; i++) {
			if (i >= first)
				cr_assert_geq(t[i], 0, "group %u block %u is read: held", g, i);
			if (i < first)
				cr_assert_eq(t[i], -1, "group %u block %u released", g, i);
			for (p = i * BT; t[i] >= 0 && p < len && p < (i + 1) * BT; p++)
				cr_assert_eq(dst->kv[(uint32_t)t[i] * BT + p % BT], kv_val(tok, p, g),
					     "group %u token %u", g, p);
		}
	}
	cr_assert_eq(bkv_seq_state_frames(dst->p, seq, &in, &out), BKV_OK);
	cr_assert_geq(in, 0);
	if (st_frames) /* verifying an import, not a later append */
		cr_assert_eq(out, -1, "the imported state is live, no scratch left");
	for (j = 0; j < st_frames; j++)
		cr_assert_eq(dst->kv[((uint32_t)in + j) * BT], state_val(tok, len) + (int32_t)j,
			     "state frame %u", j);
}

Test(image_groups, export_carries_every_group)
{
	static side src;
	image_buf ib;
	int32_t tok[LEN], in, out;
	uint32_t s, i, k = bkv_kv_state_frames(groups3, 3, BT);

	cr_assert_eq(k, 3);
	side_init(&src, groups3, 3);
	fill_tokens(tok, LEN, 100);
	s = prefill(&src, tok, LEN, k);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_OK);
	cr_assert_eq(ib.im.n_groups, 3);
	cr_assert_eq(ib.im.n_blocks, 10);
	cr_assert_eq(ib.im.state_frames, 3);
	cr_assert_neq(ib.im.group_layout, 0);
	/* the state the last append wrote (not settled: no later append) */
	cr_assert_eq(bkv_seq_state_frames(src.p, s, &in, &out), BKV_OK);
	cr_assert_eq(ib.im.state_frame, out);
	{
		const int32_t *t = bkv_seq_group_blocks(src.p, s, 1, NULL);

		for (i = 0; i < 10; i++)
			cr_assert_eq(ib.group_blocks[i], t[i], "window block %u", i);
		/* the second append trimmed below first(36) = 6 */
		for (i = 0; i < window_first(LEN - 1); i++)
			cr_assert_eq(ib.group_blocks[i], -1);
	}
	/* too small: only the room needed is set */
	ib.im.cap_blocks = 9;
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_E2BIG);
	cr_assert_eq(ib.im.n_blocks, 10);
	cr_assert_eq(ib.im.n_groups, 3);
	ib.im.cap_blocks = 64;
	ib.im.group_blocks = NULL;
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_EINVAL);
	cr_assert_eq(bkv_pool_check(src.p), 0);
	bkv_pool_destroy(src.p);
}

static void import_reads(void)
{
	static side src, dst;
	image_buf ib;
	bkv_copy x[64];
	int32_t tok[LEN];
	uint32_t s, d, nx = 0, k = 3;

	side_init(&src, groups3, 3);
	side_init(&dst, groups3, 3);
	fill_tokens(tok, LEN, 100);
	s = prefill(&src, tok, LEN, k);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_OK);
	cr_assert_eq(bkv_seq_import(dst.p, &ib.im, &d, x, &nx), BKV_OK);
	/* group 0: 10 blocks; window: blocks 6..9 (first(37) = 6); state: 3 */
	cr_assert_eq(nx, 10 + 4 + 3);
	perform(&src, &dst, x, nx);
	verify(&dst, d, tok, LEN, k);
	cr_assert_eq(bkv_pool_check(dst.p), 0);
	cr_assert_eq(bkv_pool_check(src.p), 0);
	/* the imported sequence goes on: its next token reads the state */
	{
		int32_t t2[LEN + 1], in, out;

		memcpy(t2, tok, sizeof tok);
		t2[LEN] = 9;
		cr_assert_eq(bkv_seq_append(dst.p, d, t2 + LEN, 1, NULL), BKV_OK);
		cr_assert_eq(bkv_seq_state_frames(dst.p, d, &in, &out), BKV_OK);
		cr_assert_eq(dst.kv[(uint32_t)in * BT], state_val(tok, LEN));
		compute(&dst, d, t2, LEN, LEN + 1, k);
		verify(&dst, d, t2, LEN + 1, 0);
	}
	cr_assert_eq(bkv_pool_check(dst.p), 0);
	bkv_pool_destroy(src.p);
	bkv_pool_destroy(dst.p);
}

Test(image_groups, import_reads_the_sources_kv_in_every_group)
{
	import_reads();
}

/* dst already holds the first 32 tokens (a finished sequence's blocks and
 * its checkpoint at 32 are cached): the import shares them. */
static void cache_prefix(side *dst, const int32_t *tok, uint32_t n)
{
	uint32_t p;

	p = prefill(dst, tok, n + 1, 3); /* the append of n + 1 settles n's state */
	cr_assert_eq(bkv_seq_close(dst->p, p), BKV_OK);
}

static void import_shares(void)
{
	static side src, dst;
	image_buf ib;
	bkv_copy x[64];
	int32_t tok[LEN], t33[33];
	uint32_t s, d, nx = 0;

	side_init(&src, groups3, 3);
	side_init(&dst, groups3, 3);
	fill_tokens(tok, LEN, 100);
	memcpy(t33, tok, sizeof t33);
	t33[32] = 5; /* differs from tok[32]: only 32 tokens are shared */
	cache_prefix(&dst, t33, 32);
	s = prefill(&src, tok, LEN, 3);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_OK);
	cr_assert_eq(bkv_seq_import(dst.p, &ib.im, &d, x, &nx), BKV_OK);
	/* hit 8 blocks: group 0 blocks 8, 9; window 8, 9; the state (37 > 32) */
	cr_assert_eq(nx, 2 + 2 + 3);
	perform(&src, &dst, x, nx);
	verify(&dst, d, tok, LEN, 3);
	cr_assert_eq(bkv_pool_check(dst.p), 0);
	bkv_pool_destroy(src.p);
	bkv_pool_destroy(dst.p);
}

Test(image_groups, import_shares_a_prefix_the_destination_has)
{
	import_shares();
}

static void import_at_checkpoint(void)
{
	static side src, dst;
	image_buf ib;
	bkv_copy x[64];
	int32_t tok[33];
	uint32_t s, d, nx = 99;

	side_init(&src, groups3, 3);
	side_init(&dst, groups3, 3);
	fill_tokens(tok, 33, 100);
	cache_prefix(&dst, tok, 32);
	s = prefill(&src, tok, 32, 3);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_OK);
	cr_assert_eq(bkv_seq_import(dst.p, &ib.im, &d, x, &nx), BKV_OK);
	cr_assert_eq(nx, 0, "all 8 blocks of both groups and the state at 32 are hits");
	verify(&dst, d, tok, 32, 3);
	cr_assert_eq(bkv_pool_check(dst.p), 0);
	bkv_pool_destroy(src.p);
	bkv_pool_destroy(dst.p);
}

Test(image_groups, a_checkpoint_covering_the_import_needs_no_state_transfer)
{
	import_at_checkpoint();
}

/* Import *im into dst: refused with rc, and dst unchanged. */
static void refused(side *dst, const bkv_seq_image *im, int rc)
{
	bkv_pool_stats a, b;
	bkv_copy x[64];
	uint32_t d = 77, nx = 77;

	memset(&a, 0, sizeof a); /* size 0: the whole struct; padding equal */
	memset(&b, 0, sizeof b);
	bkv_pool_stats_get(dst->p, &a);
	cr_assert_eq(bkv_seq_import(dst->p, im, &d, x, &nx), rc);
	bkv_pool_stats_get(dst->p, &b);
	cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "a refused import changes nothing");
	cr_assert_eq(d, 77);
	cr_assert_eq(nx, 77);
	cr_assert_eq(bkv_pool_check(dst->p), 0);
}

Test(image_groups, images_of_other_groups_are_refused)
{
	static const bkv_kv_group wider[3] = {
		{BKV_GROUP_FULL, 2, 0, 0, 256},
		{BKV_GROUP_WINDOW, 2, W + 4, 0, 256},
		{BKV_GROUP_STATE, 1, 8, 0, 5000},
	};
	static side src, dst, other, plain;
	image_buf ib, ob, pb;
	bkv_copy x[64];
	int32_t tok[LEN];
	uint32_t s, d, nx;

	side_init(&src, groups3, 3);
	side_init(&dst, groups3, 3);
	side_init(&other, wider, 3);
	side_init(&plain, NULL, 0);
	fill_tokens(tok, LEN, 100);
	s = prefill(&src, tok, LEN, 3);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_OK);

	ob = ib; /* the groups' counts or layout differ */
	ob.im.n_groups = 2;
	refused(&dst, &ob.im, BKV_EINVAL);
	ob = ib;
	ob.im.group_layout ^= 2;
	refused(&dst, &ob.im, BKV_EINVAL);
	refused(&other, &ib.im, BKV_EINVAL); /* another window */
	ob = ib;
	ob.im.state_frames = 2;
	refused(&dst, &ob.im, BKV_EINVAL);
	ob = ib;
	ob.im.state_frame = -1;
	refused(&dst, &ob.im, BKV_EINVAL);
	ob = ib;
	ob.im.group_blocks = NULL;
	refused(&dst, &ob.im, BKV_EINVAL);
	ob = ib; /* a block the window's next token reads is missing */
	ob.im.group_blocks = ob.group_blocks;
	ob.group_blocks[9] = -1;
	refused(&dst, &ob.im, BKV_EINVAL);
	ob.group_blocks[9] = -2;
	refused(&dst, &ob.im, BKV_EINVAL);
	refused(&plain, &ib.im, BKV_EINVAL); /* groups into a plain pool */

	/* a plain pool's image into a pool with groups */
	{
		uint32_t ps;

		cr_assert_eq(bkv_seq_open_keyed(plain.p, 5, &ps), BKV_OK);
		cr_assert_eq(bkv_seq_append(plain.p, ps, tok, LEN, NULL), BKV_OK);
		image_init(&pb);
		cr_assert_eq(bkv_seq_export(plain.p, ps, &pb.im), BKV_OK);
		cr_assert_eq(pb.im.n_groups, 0);
		cr_assert_eq(pb.im.group_layout, 0);
		cr_assert_eq(pb.im.state_frame, -1);
		cr_assert_eq(pb.im.state_frames, 0);
		refused(&dst, &pb.im, BKV_EINVAL);
		/* and into a plain pool as before: one transfer per block */
		cr_assert_eq(bkv_seq_import(plain.p, &pb.im, &d, x, &nx), BKV_OK);
		cr_assert_eq(nx, 1, "the 9 full blocks shared with the source, the partial one not");
	}
	/* the untouched image still imports */
	cr_assert_eq(bkv_seq_import(dst.p, &ib.im, &d, x, &nx), BKV_OK);
	cr_assert_eq(nx, 17);
	cr_assert_eq(bkv_pool_check(dst.p), 0);
	bkv_pool_destroy(src.p);
	bkv_pool_destroy(dst.p);
	bkv_pool_destroy(other.p);
	bkv_pool_destroy(plain.p);
}

Test(image_groups, a_state_behind_its_tokens_in_a_step_is_exported_after_the_commit)
{
	static side src;
	image_buf ib;
	int32_t tok[LEN];
	uint32_t s;

	side_init(&src, groups3, 3);
	fill_tokens(tok, LEN, 100);
	s = prefill(&src, tok, LEN, 3);
	bkv__pool_txn_begin(src.p);
	cr_assert_eq(bkv_seq_append(src.p, s, tok, 1, NULL), BKV_OK);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_ESTATE);
	bkv__pool_txn_commit(src.p); /* the step computed it: the state is live */
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_OK);
	cr_assert_eq(ib.im.len, LEN + 1);
	cr_assert_eq(bkv_pool_check(src.p), 0);
	bkv_pool_destroy(src.p);
}

Test(image_groups, an_import_inside_a_step_is_live_at_its_commit)
{
	static side src, dst;
	image_buf ib;
	bkv_copy x[64];
	int32_t tok[LEN];
	uint32_t s, d, nx = 0;

	side_init(&src, groups3, 3);
	side_init(&dst, groups3, 3);
	fill_tokens(tok, LEN, 100);
	s = prefill(&src, tok, LEN, 3);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_OK);
	bkv__pool_txn_begin(dst.p);
	cr_assert_eq(bkv_seq_import(dst.p, &ib.im, &d, x, &nx), BKV_OK);
	cr_assert_eq(nx, 10 + 4 + 3);
	bkv__pool_txn_commit(dst.p);
	perform(&src, &dst, x, nx);
	verify(&dst, d, tok, LEN, 3);
	cr_assert_eq(bkv_pool_check(dst.p), 0);
	bkv_pool_destroy(src.p);
	bkv_pool_destroy(dst.p);
}

Test(image_groups, an_import_without_room_for_every_group_changes_nothing)
{
	static side src, dst;
	image_buf ib;
	int32_t tok[LEN];
	uint32_t s;

	side_init(&src, groups3, 3);
	/* 6 state units of 3 frames leave 13 attention frames: group 0's 10
	 * blocks fit, not the window's as well */
	side_init_nb(&dst, groups3, 3, 6 * 3 + 13);
	fill_tokens(tok, LEN, 100);
	s = prefill(&src, tok, LEN, 3);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src.p, s, &ib.im), BKV_OK);
	refused(&dst, &ib.im, BKV_ENOSPC);
	bkv_pool_destroy(src.p);
	bkv_pool_destroy(dst.p);
}

/* The same imports into and from pools whose state units share the frames
 * with attention: the units are chunks wherever they lie, the transfers and
 * the checkpoint hit are the same. */
Test(image_groups, imports_between_pools_with_shared_state_units)
{
	g_share = 1;
	import_reads();
	import_shares();
	import_at_checkpoint();
}
