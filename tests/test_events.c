/*
 * test_events.c - KV events (bkv_pool_drain_events), bkv_block_hashes, and
 * sequence export/import between two pools (bkv_seq_export/bkv_seq_import).
 *
 * Exact event sequences for hand-built cases, overflow counting, and a
 * property: a router that replays a pool's events knows exactly the hashes in
 * that pool's index after random workloads (appends, forks, truncates, closes,
 * drops, swaps, resets, step transactions).
 */
#include "internal.h"
#include "pool_util.h"
#include "pool_ops.h"

#include <stdlib.h>

static bkv_pool *make_ev_pool(uint32_t bt, uint32_t nb, uint32_t nh, uint32_t cap,
			      uint64_t seed)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = bt;
	c.device_blocks = nb;
	c.host_blocks = nh;
	c.max_seqs = 64;
	c.event_capacity = cap;
	c.hash_seed = seed;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

static void expect_stored(const bkv_kv_event *e, uint64_t seq, int32_t block, uint64_t hash,
			  int has_parent, uint64_t parent_hash, uint64_t key)
{
	cr_assert_eq(e->seq, seq, "seq %llu, want %llu", (unsigned long long)e->seq,
		     (unsigned long long)seq);
	cr_assert_eq(e->kind, BKV_EVENT_STORED, "event %llu kind %u", (unsigned long long)seq,
		     e->kind);
	cr_assert_eq(e->block, block, "event %llu block %d, want %d", (unsigned long long)seq,
		     e->block, block);
	cr_assert_eq(e->hash, hash);
	cr_assert_eq(e->has_parent, (uint32_t)has_parent);
	cr_assert_eq(e->parent_hash, parent_hash);
	cr_assert_eq(e->key, key);
	cr_assert_eq(e->token_count, 4);
}

static void expect_removed(const bkv_kv_event *e, uint64_t seq, int32_t block, uint64_t hash)
{
	cr_assert_eq(e->seq, seq);
	cr_assert_eq(e->kind, BKV_EVENT_REMOVED, "event %llu kind %u", (unsigned long long)seq,
		     e->kind);
	cr_assert_eq(e->block, block, "event %llu block %d, want %d", (unsigned long long)seq,
		     e->block, block);
	cr_assert_eq(e->hash, hash);
}

Test(events, stored_for_each_full_block_with_chained_hashes)
{
	bkv_pool *p = make_ev_pool(4, 8, 0, 64, 99);
	int32_t t[10];
	uint64_t h[2];
	bkv_kv_event ev[8];
	uint32_t s;

	fill_tokens(t, 10, 100);
	cr_assert_eq(bkv_block_hashes(99, 7, 4, t, 10, h), 2);
	cr_assert_eq(bkv_seq_open_keyed(p, 7, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 10, NULL), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 8), 2);
	expect_stored(&ev[0], 1, 0, h[0], 0, 0, 7);
	expect_stored(&ev[1], 2, 1, h[1], 1, h[0], 7);
	/* the partial block fills: its event comes now */
	cr_assert_eq(bkv_seq_append(p, s, t, 2, NULL), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 8), 1);
	cr_assert_eq(ev[0].seq, 3);
	cr_assert_eq(ev[0].block, 2);
	cr_assert_eq(ev[0].parent_hash, h[1]);
	/* nothing pending: drain gives 0 */
	cr_assert_eq(bkv_pool_drain_events(p, ev, 8), 0);
	bkv_pool_destroy(p);
}

Test(events, hits_and_close_emit_nothing_eviction_and_drop_emit_removed)
{
	bkv_pool *p = make_ev_pool(4, 4, 0, 64, 0);
	int32_t a[8], b[16];
	uint64_t ha[2], hb[4];
	bkv_kv_event ev[16];
	uint32_t s1, s2, s3, hit = 0;

	fill_tokens(a, 8, 1);
	fill_tokens(b, 16, 500);
	bkv_block_hashes(0, 0, 4, a, 8, ha);
	bkv_block_hashes(0, 0, 4, b, 16, hb);
	cr_assert_eq(bkv_seq_open(p, &s1), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s1, a, 8, NULL), BKV_OK); /* blocks 0, 1 */
	cr_assert_eq(bkv_seq_close(p, s1), BKV_OK);              /* cached */
	cr_assert_eq(bkv_seq_open(p, &s2), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s2, a, 8, &hit), BKV_OK); /* hits */
	cr_assert_eq(hit, 8);
	cr_assert_eq(bkv_seq_close(p, s2), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 16), 2); /* only the first stores */
	/* four new blocks: two free, then the LRU (deepest first: 1, then 0) */
	cr_assert_eq(bkv_seq_open(p, &s3), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s3, b, 16, NULL), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 16), 6);
	expect_stored(&ev[0], 3, 2, hb[0], 0, 0, 0);
	expect_stored(&ev[1], 4, 3, hb[1], 1, hb[0], 0);
	expect_removed(&ev[2], 5, 1, ha[1]);
	expect_stored(&ev[3], 6, 1, hb[2], 1, hb[1], 0);
	expect_removed(&ev[4], 7, 0, ha[0]);
	expect_stored(&ev[5], 8, 0, hb[3], 1, hb[2], 0);
	/* drop: the leaf leaves the index, then its parent (leaf now), ... */
	cr_assert_eq(bkv_seq_drop(p, s3), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 16), 4);
	expect_removed(&ev[0], 9, 0, hb[3]);
	expect_removed(&ev[1], 10, 1, hb[2]);
	expect_removed(&ev[2], 11, 3, hb[1]);
	expect_removed(&ev[3], 12, 2, hb[0]);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(events, reset_cache_emits_one_cleared)
{
	bkv_pool *p = make_ev_pool(4, 8, 0, 64, 0);
	int32_t t[12];
	bkv_kv_event ev[8];
	uint32_t s;

	fill_tokens(t, 12, 1);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 12, NULL), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 8), 3);
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 8), 1);
	cr_assert_eq(ev[0].kind, BKV_EVENT_CLEARED);
	cr_assert_eq(ev[0].seq, 4);
	cr_assert_eq(ev[0].block, -1);
	cr_assert_eq(ev[0].hash, 0);
	/* blocks still used leave the index silently with the reset: closing
	 * them later says nothing more */
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 8), 0);
	bkv_pool_destroy(p);
}

Test(events, overflow_is_counted_and_shows_as_a_gap)
{
	bkv_pool *p = make_ev_pool(4, 16, 0, 3, 0);
	int32_t t[40];
	bkv_kv_event ev[8];
	bkv_pool_stats st;
	uint32_t s;

	fill_tokens(t, 40, 1);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 20, NULL), BKV_OK); /* 5 events */
	st = pool_stats(p);
	cr_assert_eq(st.events, 5);
	cr_assert_eq(st.events_dropped, 2);
	/* a partial drain, then the rest: the ring kept the oldest three */
	cr_assert_eq(bkv_pool_drain_events(p, ev, 2), 2);
	cr_assert_eq(ev[0].seq, 1);
	cr_assert_eq(ev[1].seq, 2);
	cr_assert_eq(bkv_seq_append(p, s, t + 20, 12, NULL), BKV_OK); /* 3 more */
	cr_assert_eq(bkv_pool_drain_events(p, ev, 8), 3);
	cr_assert_eq(ev[0].seq, 3);
	cr_assert_eq(ev[1].seq, 6, "the gap shows where events were dropped");
	cr_assert_eq(ev[2].seq, 7);
	st = pool_stats(p);
	cr_assert_eq(st.events, 8);
	cr_assert_eq(st.events_dropped, 3);
	bkv_pool_destroy(p);
}

Test(events, off_by_default_and_capacity_validated)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;
	int32_t t[8];
	bkv_kv_event ev[4];
	uint32_t s;

	bkv_pool_config_init(&c);
	cr_assert_eq(c.event_capacity, 0);
	c.device_blocks = 8;
	c.block_tokens = 4;
	c.event_capacity = (1u << 24) + 1;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL);
	c.event_capacity = 0;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_pool_drain_events(p, ev, 4), 0);
	cr_assert_eq(pool_stats(p).events, 0);
	cr_assert_eq(bkv_pool_drain_events(NULL, ev, 4), 0);
	cr_assert_eq(bkv_block_hashes(0, 0, 0, t, 8, NULL), 0);
	cr_assert_eq(bkv_block_hashes(0, 0, 4, t, 3, NULL), 0);
	bkv_pool_destroy(p);
}

/* ---- replay property ------------------------------------------------------ */

/* Events of each kind the replay test applied, over all rounds. */
static uint64_t applied[3];

/* The router: a set of hashes, rebuilt only from events. */
typedef struct router {
	uint64_t *h;
	uint32_t n, cap;
} router;

static int router_find(const router *r, uint64_t h)
{
	uint32_t i;

	for (i = 0; i < r->n; i++)
		if (r->h[i] == h)
			return (int)i;
	return -1;
}

static void router_apply(router *r, const bkv_kv_event *e)
{
	int i;

	if (e->kind < 3)
		applied[e->kind]++;
	switch (e->kind) {
	case BKV_EVENT_STORED:
		cr_assert_eq(router_find(r, e->hash), -1, "stored twice");
		cr_assert(!e->has_parent || router_find(r, e->parent_hash) >= 0,
			  "a block stored before its parent");
		cr_assert_lt(r->n, r->cap);
		r->h[r->n++] = e->hash;
		break;
	case BKV_EVENT_REMOVED:
		i = router_find(r, e->hash);
		cr_assert_geq(i, 0, "removed a hash never stored");
		r->h[i] = r->h[--r->n];
		break;
	case BKV_EVENT_CLEARED:
		r->n = 0;
		break;
	default:
		cr_assert_fail("bad kind %u", e->kind);
	}
}

static void expect_router_knows_index(const bkv_pool *p, const router *r)
{
	uint32_t i, n = 0;

	for (i = 0; i < p->kv.nb; i++) {
		if (!BLOCK_IS_INDEXED(&p->kv.blk[i]))
			continue;
		n++;
		cr_assert_geq(router_find(r, p->kv.blk[i].hash), 0, "indexed block %u unknown", i);
	}
	cr_assert_eq(n, r->n, "index %u hashes, router %u", n, r->n);
}

Test(events, router_replay_equals_index_after_random_workloads)
{
	uint32_t round;

	for (round = 0; round < 30; round++) {
		bkv_pool *p = make_ev_pool(4, 24, 16, 4096, round);
		router r = {calloc(64, sizeof(uint64_t)), 0, 64};
		bkv_kv_event ev[64];
		uint32_t seqs[8] = {0}, op, n, i;
		int txn = 0;

		srand(round + 1);
		for (op = 0; op < 400; op++) {
			static const uint64_t ev_keys[2] = {0, 1};

			if (pool_random_op(p, seqs, &txn, ev_keys, 2))
				continue;
			while ((n = bkv_pool_drain_events(p, ev, 64)) > 0)
				for (i = 0; i < n; i++)
					router_apply(&r, &ev[i]);
			expect_router_knows_index(p, &r);
			cr_assert_eq(bkv_pool_check(p), 0);
		}
		cr_assert_eq(pool_stats(p).events_dropped, 0);
		free(r.h);
		bkv_pool_destroy(p);
	}
	cr_assert_gt(applied[BKV_EVENT_STORED], 1000);
	cr_assert_gt(applied[BKV_EVENT_REMOVED], 500);
	cr_assert_gt(applied[BKV_EVENT_CLEARED], 10);
}

/* ---- export / import -------------------------------------------------------- */

typedef struct image_buf {
	bkv_seq_image im;
	int32_t blocks[32];
	uint64_t hashes[32];
	int32_t tokens[128];
} image_buf;

static void image_init(image_buf *b)
{
	memset(b, 0, sizeof *b);
	b->im.size = sizeof b->im;
	b->im.blocks = b->blocks;
	b->im.hashes = b->hashes;
	b->im.tokens = b->tokens;
	b->im.cap_blocks = 32;
	b->im.cap_tokens = 128;
}

Test(export, a_prefill_moves_to_another_pool_with_transfers_and_events)
{
	bkv_pool *src = make_ev_pool(4, 16, 0, 0, 5), *dst = make_ev_pool(4, 16, 0, 64, 5);
	int32_t t[10];
	uint64_t h[2];
	image_buf ib;
	bkv_copy x[8];
	bkv_kv_event ev[8];
	uint32_t s, filler, d, nx = 99, i, n;
	const int32_t *stab, *dtab;

	fill_tokens(t, 10, 40);
	bkv_block_hashes(5, 3, 4, t, 10, h);
	/* take two blocks in dst first, so ids differ between the pools */
	cr_assert_eq(bkv_seq_open(dst, &filler), BKV_OK);
	cr_assert_eq(bkv_seq_append(dst, filler, t, 5, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_open_keyed(src, 3, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(src, s, t, 10, NULL), BKV_OK);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src, s, &ib.im), BKV_OK);
	cr_assert_eq(ib.im.len, 10);
	cr_assert_eq(ib.im.n_blocks, 3);
	cr_assert_eq(ib.im.block_tokens, 4);
	cr_assert_eq(ib.im.key, 3);
	cr_assert_eq(ib.im.hash_seed, 5);
	stab = bkv_seq_blocks(src, s, NULL);
	for (i = 0; i < 3; i++)
		cr_assert_eq(ib.blocks[i], stab[i]);
	cr_assert_eq(ib.hashes[0], h[0]);
	cr_assert_eq(ib.hashes[1], h[1]);
	cr_assert_eq(ib.hashes[2], 0);
	cr_assert_eq(memcmp(ib.tokens, t, sizeof t), 0);

	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, x, &nx), BKV_OK);
	cr_assert_eq(nx, 3);
	dtab = bkv_seq_blocks(dst, d, &n);
	cr_assert_eq(n, 3);
	for (i = 0; i < 3; i++) {
		cr_assert_eq(x[i].src, stab[i]);
		cr_assert_eq(x[i].dst, dtab[i]);
	}
	expect_len(dst, d, 10);
	cr_assert_eq(bkv_pool_drain_events(dst, ev, 8), 3); /* filler's block, then two */
	cr_assert_eq(ev[1].hash, h[0]);
	cr_assert_eq(ev[2].hash, h[1]);
	cr_assert_eq(ev[2].block, dtab[1]);
	cr_assert_eq(bkv_pool_check(dst), 0);
	cr_assert_eq(bkv_pool_check(src), 0);
	bkv_pool_destroy(src);
	bkv_pool_destroy(dst);
}

Test(export, import_reuses_prefix_hits_in_the_destination)
{
	bkv_pool *src = make_ev_pool(4, 16, 0, 0, 0), *dst = make_ev_pool(4, 16, 0, 0, 0);
	int32_t t[14];
	image_buf ib;
	bkv_copy x[8];
	uint32_t s, d1, d2, nx, n;
	const int32_t *tab1, *tab2, *stab;

	fill_tokens(t, 14, 7);
	cr_assert_eq(bkv_seq_open(dst, &d1), BKV_OK);
	cr_assert_eq(bkv_seq_append(dst, d1, t, 8, NULL), BKV_OK); /* 2 cached */
	cr_assert_eq(bkv_seq_open(src, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(src, s, t, 14, NULL), BKV_OK);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src, s, &ib.im), BKV_OK);
	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d2, x, &nx), BKV_OK);
	cr_assert_eq(nx, 2, "blocks 0 and 1 hit; 2 and 3 transfer");
	tab1 = bkv_seq_blocks(dst, d1, NULL);
	tab2 = bkv_seq_blocks(dst, d2, &n);
	stab = bkv_seq_blocks(src, s, NULL);
	cr_assert_eq(n, 4);
	cr_assert_eq(tab2[0], tab1[0]);
	cr_assert_eq(tab2[1], tab1[1]);
	cr_assert_eq(x[0].src, stab[2]);
	cr_assert_eq(x[0].dst, tab2[2]);
	cr_assert_eq(x[1].src, stab[3]);
	cr_assert_eq(x[1].dst, tab2[3]);
	cr_assert_eq(pool_stats(dst).hit_tokens, 8);
	cr_assert_eq(bkv_pool_check(dst), 0);
	bkv_pool_destroy(src);
	bkv_pool_destroy(dst);
}

Test(export, import_is_all_or_nothing)
{
	bkv_pool *src = make_ev_pool(4, 16, 0, 0, 0), *dst = make_ev_pool(4, 3, 0, 8, 0);
	bkv_pool *twin = make_ev_pool(4, 3, 0, 8, 0);
	int32_t t[16];
	image_buf ib;
	bkv_copy x[8];
	bkv_pool_stats before;
	bkv_kv_event ev[4];
	uint32_t s, d = 77, nx = 77, a, b;

	fill_tokens(t, 16, 1);
	cr_assert_eq(bkv_seq_open(src, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(src, s, t, 16, NULL), BKV_OK);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src, s, &ib.im), BKV_OK);
	cr_assert_eq(bkv_seq_open(dst, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(dst, a, t + 1, 1, NULL), BKV_OK);
	before = pool_stats(dst);
	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, x, &nx), BKV_E2BIG); /* 4 > 3 blocks */
	ib.im.len = 12;
	ib.im.n_blocks = 3;
	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, x, &nx), BKV_ENOSPC);
	cr_assert_eq(d, 77);
	cr_assert_eq(nx, 77);
	expect_same_stats(&before, dst);
	cr_assert_eq(bkv_pool_drain_events(dst, ev, 4), 0);
	cr_assert_eq(bkv_seq_close(dst, a), BKV_OK);
	/* the failures took no sequence id: dst and an untouched twin agree */
	cr_assert_eq(bkv_seq_open(twin, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(twin, b, t + 1, 1, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_close(twin, b), BKV_OK);
	cr_assert_eq(bkv_seq_open(dst, &a), BKV_OK);
	cr_assert_eq(bkv_seq_open(twin, &b), BKV_OK);
	cr_assert_eq(a, b);
	cr_assert_eq(bkv_seq_close(dst, a), BKV_OK);
	/* and it fits once the room is there */
	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, x, &nx), BKV_OK);
	cr_assert_eq(nx, 3);
	bkv_pool_destroy(src);
	bkv_pool_destroy(dst);
	bkv_pool_destroy(twin);
}

Test(export, bad_images_are_refused)
{
	bkv_pool *src = make_ev_pool(4, 16, 2, 0, 0), *dst = make_ev_pool(4, 16, 0, 0, 0);
	bkv_pool *other_bt = make_ev_pool(8, 16, 0, 0, 0), *one_seq;
	bkv_pool_config c;
	int32_t t[10];
	image_buf ib;
	bkv_copy x[8];
	uint32_t s, d, nx, full;

	fill_tokens(t, 10, 1);
	cr_assert_eq(bkv_seq_open(src, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(src, s, t, 10, NULL), BKV_OK);
	image_init(&ib);
	ib.im.cap_tokens = 9;
	cr_assert_eq(bkv_seq_export(src, s, &ib.im), BKV_E2BIG);
	cr_assert_eq(ib.im.len, 10, "the room needed is reported");
	cr_assert_eq(ib.im.n_blocks, 3);
	ib.im.cap_tokens = 128;
	cr_assert_eq(bkv_seq_export(src, 12345, &ib.im), BKV_ENOENT);
	cr_assert_eq(bkv_seq_export(NULL, s, &ib.im), BKV_EINVAL);
	ib.im.size = 4;
	cr_assert_eq(bkv_seq_export(src, s, &ib.im), BKV_EINVAL);
	ib.im.size = sizeof ib.im;
	cr_assert_eq(bkv_seq_export(src, s, &ib.im), BKV_OK);

	cr_assert_eq(bkv_seq_import(other_bt, &ib.im, &d, x, &nx), BKV_EINVAL);
	ib.tokens[5] ^= 1; /* damaged in transit: the hash check sees it */
	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, x, &nx), BKV_EINVAL);
	ib.tokens[5] ^= 1;
	ib.blocks[1] = -1;
	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, x, &nx), BKV_EINVAL);
	ib.blocks[1] = 1;
	ib.im.n_blocks = 2;
	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, x, &nx), BKV_EINVAL);
	ib.im.n_blocks = 3;
	cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, NULL, &nx), BKV_EINVAL);
	cr_assert_eq(pool_stats(dst).nr_seqs, 0);

	bkv_pool_config_init(&c);
	c.block_tokens = 4;
	c.device_blocks = 8;
	c.max_seqs = 1;
	cr_assert_eq(bkv_pool_create(&c, NULL, &one_seq), BKV_OK);
	cr_assert_eq(bkv_seq_open(one_seq, &full), BKV_OK);
	cr_assert_eq(bkv_seq_import(one_seq, &ib.im, &d, x, &nx), BKV_EAGAIN);

	cr_assert_eq(bkv_seq_swap_out(src, s), BKV_ENOSPC); /* 3 blocks, 2 host */
	bkv_pool_destroy(one_seq);
	bkv_pool_destroy(src);
	bkv_pool_destroy(dst);
	bkv_pool_destroy(other_bt);
}

Test(export, swapped_sequences_are_not_exported)
{
	bkv_pool *src = make_ev_pool(4, 16, 4, 0, 0);
	int32_t t[6];
	image_buf ib;
	uint32_t s;

	fill_tokens(t, 6, 1);
	cr_assert_eq(bkv_seq_open(src, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(src, s, t, 6, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(src, s), BKV_OK);
	image_init(&ib);
	cr_assert_eq(bkv_seq_export(src, s, &ib.im), BKV_ESTATE);
	bkv_pool_destroy(src);
}

/* ---- damaged images (the image is untrusted input) ------------------------ */

/* A 10-token, 3-block export of src (block_tokens 4) in ib; dst is empty. The
 * arrays really hold 128 tokens and 32 blocks, so an import that ignores the
 * image's capacities reads valid memory and succeeds instead of refusing. */
static void export_ten(bkv_pool *src, image_buf *ib)
{
	int32_t t[10];
	uint32_t s;

	fill_tokens(t, 10, 1);
	cr_assert_eq(bkv_seq_open(src, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(src, s, t, 10, NULL), BKV_OK);
	image_init(ib);
	cr_assert_eq(bkv_seq_export(src, s, &ib->im), BKV_OK);
}

/* Import must fail with rc and change nothing in dst, nor write the outputs. */
static void expect_refused(bkv_pool *dst, const image_buf *ib, int rc)
{
	bkv_pool_stats before = pool_stats(dst);
	bkv_copy x[32];
	uint32_t d = 77, nx = 77;
	bkv_kv_event ev[4];

	cr_assert_eq(bkv_seq_import(dst, &ib->im, &d, x, &nx), rc);
	cr_assert_eq(d, 77);
	cr_assert_eq(nx, 77);
	expect_same_stats(&before, dst);
	cr_assert_eq(bkv_pool_drain_events(dst, ev, 4), 0);
}

Test(export, import_refuses_an_image_whose_len_exceeds_its_arrays)
{
	bkv_pool *src = make_ev_pool(4, 16, 0, 0, 0), *dst = make_ev_pool(4, 16, 0, 8, 0);
	image_buf ib;

	export_ten(src, &ib);
	ib.im.cap_tokens = 9; /* the tokens array claims 9 entries for 10 tokens */
	expect_refused(dst, &ib, BKV_EINVAL);
	ib.im.cap_tokens = 0;
	expect_refused(dst, &ib, BKV_EINVAL);
	ib.im.cap_tokens = 10; /* exactly enough */
	ib.im.cap_blocks = 3;
	{
		bkv_copy x[3];
		uint32_t d, nx;

		cr_assert_eq(bkv_seq_import(dst, &ib.im, &d, x, &nx), BKV_OK);
		cr_assert_eq(nx, 3);
		expect_len(dst, d, 10);
	}
	cr_assert_eq(bkv_pool_check(dst), 0);
	bkv_pool_destroy(src);
	bkv_pool_destroy(dst);
}

Test(export, import_refuses_n_blocks_past_capacity)
{
	bkv_pool *src = make_ev_pool(4, 16, 0, 0, 0), *dst = make_ev_pool(4, 16, 0, 8, 0);
	image_buf ib;

	export_ten(src, &ib);
	ib.im.cap_blocks = 2; /* blocks and hashes claim 2 entries for 3 blocks */
	expect_refused(dst, &ib, BKV_EINVAL);
	ib.im.cap_blocks = 0;
	expect_refused(dst, &ib, BKV_EINVAL);
	/* a len and n_blocks that agree with each other but not with the arrays */
	ib.im.cap_blocks = 32;
	ib.im.len = 129;
	ib.im.n_blocks = 33;
	expect_refused(dst, &ib, BKV_EINVAL);
	bkv_pool_destroy(src);
	bkv_pool_destroy(dst);
}

Test(export, import_refuses_an_image_larger_than_the_pool_before_reading_it)
{
	/* honest capacities, but 64 blocks for a 16-block pool: E2BIG, not a
	 * hash walk over 256 tokens (the hashes are garbage) */
	bkv_pool *dst = make_ev_pool(4, 16, 0, 8, 0);
	static int32_t tokens[256], blocks[64];
	static uint64_t hashes[64];
	image_buf ib;

	image_init(&ib);
	ib.im.block_tokens = 4;
	ib.im.len = 256;
	ib.im.n_blocks = 64;
	ib.im.tokens = tokens;
	ib.im.blocks = blocks;
	ib.im.hashes = hashes;
	ib.im.cap_tokens = 256;
	ib.im.cap_blocks = 64;
	memset(hashes, 0xa5, sizeof hashes);
	expect_refused(dst, &ib, BKV_E2BIG);
	bkv_pool_destroy(dst);
}

Test(export, import_refuses_a_nonzero_hash_for_a_partial_last_block)
{
	bkv_pool *src = make_ev_pool(4, 16, 0, 0, 0), *dst = make_ev_pool(4, 16, 0, 8, 0);
	image_buf ib;

	export_ten(src, &ib);
	cr_assert_eq(ib.hashes[2], 0);
	ib.hashes[2] = 1; /* block 2 holds 2 of 4 tokens: it has no hash */
	expect_refused(dst, &ib, BKV_EINVAL);
	/* another seed: hashes are not read at all, so NULL is accepted */
	{
		bkv_pool *other = make_ev_pool(4, 16, 0, 0, 9);
		bkv_copy x[3];
		uint32_t d, nx;

		ib.im.hashes = NULL;
		cr_assert_eq(bkv_seq_import(other, &ib.im, &d, x, &nx), BKV_OK);
		cr_assert_eq(nx, 3);
		cr_assert_eq(bkv_pool_check(other), 0);
		bkv_pool_destroy(other);
	}
	bkv_pool_destroy(src);
	bkv_pool_destroy(dst);
}

Test(export, import_refuses_null_arrays_and_a_short_size)
{
	bkv_pool *src = make_ev_pool(4, 16, 0, 0, 0), *dst = make_ev_pool(4, 16, 0, 8, 0);
	image_buf ib;

	export_ten(src, &ib);
	ib.im.size = sizeof ib.im - 1;
	expect_refused(dst, &ib, BKV_EINVAL);
	ib.im.size = sizeof ib.im;
	ib.im.tokens = NULL;
	expect_refused(dst, &ib, BKV_EINVAL);
	ib.im.tokens = ib.tokens;
	ib.im.blocks = NULL;
	expect_refused(dst, &ib, BKV_EINVAL);
	ib.im.blocks = ib.blocks;
	ib.im.hashes = NULL; /* same seed: the hashes are needed */
	expect_refused(dst, &ib, BKV_EINVAL);
	ib.im.hashes = ib.hashes;
	ib.im.len = 0;
	ib.im.n_blocks = 0;
	expect_refused(dst, &ib, BKV_EINVAL);
	ib.im.len = 10;
	ib.im.n_blocks = 3;
	ib.im.block_tokens = 0;
	expect_refused(dst, &ib, BKV_EINVAL);
	bkv_pool_destroy(src);
	bkv_pool_destroy(dst);
}
