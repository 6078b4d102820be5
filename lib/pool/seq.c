/*
 * seq.c - sequences: opening, forking, closing, appending (with prefix
 * hits and copy-on-write), truncating, and the scheduler's private appends.
 *
 * A sequence (address space) is a preallocated slot whose block table is an
 * int32_t array the host can hand to its kernels as is. Ids are slot | gen <<
 * 20 with a 12-bit generation (1..4095, so an id is never 0) and slots are
 * reused FIFO, so a closed id answers BKV_ENOENT for a long time. A slot keeps
 * its table buffer across reuse; it only grows (geometrically, through the
 * allocator hook), so after warm-up no call allocates.
 *
 * Every mutating call is all-or-nothing: it validates, computes what it needs
 * (blocks, including a copy-on-write block, minus verified prefix hits found
 * by a non-mutating pre-pass; table and copy-list capacity), fails if any is
 * missing, and only then changes state.
 *
 * Copy-on-write: writing into a block that is shared (ref > 1) or indexed
 * (cached content is immutable; a truncate can leave a sequence ending inside
 * one) takes a fresh block, copies the first `offset` tokens, records a
 * (src, dst) BKV_COPY_DEVICE copy and drops its table reference to src (src
 * itself stays pinned until the copy is cleared: kv/frames.c). A full block
 * is never copied: appending after it takes a new block.
 *
 * close, truncate and swap-out release a sequence's blocks last to first
 * (the release rules: kv/frames.c); drop (abort) releases with drop set.
 */
#include "pool/hc.h"

#include <string.h>

int bkv__table_reserve(bkv_pool *pool, bkv__seq *s, uint32_t n)
{
	if (n <= s->cap)
		return 0;
	return bkv__ids_grow(pool, &s->table, &s->cap, n, 0);
}

int bkv__copies_reserve(bkv_pool *pool, int kind, uint32_t extra)
{
	bkv__copy_list *l = &pool->copies[kind];
	uint64_t need = (uint64_t)l->n + extra, cap;
	bkv_copy *v;

	if (need <= l->cap)
		return 0;
	cap = l->cap ? l->cap : 16;
	while (cap < need)
		cap *= 2;
	if (cap > UINT32_MAX)
		return BKV_ENOMEM;
	v = bkv__realloc(&pool->alloc, l->v, (size_t)l->cap * sizeof(bkv_copy),
			 (size_t)cap * sizeof(bkv_copy));
	if (!v)
		return BKV_ENOMEM;
	l->v = v;
	l->cap = (uint32_t)cap;
	return 0;
}

static void slot_close(bkv_pool *pool, bkv__seq *s)
{
	uint32_t tail = pool->ring_head + (pool->cfg.max_seqs - pool->nr_seqs);

	if (tail >= pool->cfg.max_seqs)
		tail -= pool->cfg.max_seqs;
	pool->slot_ring[tail] = (uint32_t)(s - pool->seqs);
	pool->nr_seqs--;
	s->state = BKV__SEQ_FREE;
	s->len = 0;
	s->n_blocks = 0;
	s->gen = s->gen == BKV__SEQ_GEN_MAX ? 1 : (uint16_t)(s->gen + 1);
}

int bkv_seq_open_keyed(bkv_pool *pool, uint64_t key, uint32_t *seq)
{
	bkv__seq *s;

	if (!pool || !seq)
		return BKV_EINVAL;
	s = bkv__slot_peek(pool);
	if (!s)
		return BKV_EAGAIN;
	bkv__slot_open(pool, s, key);
	if (pool->grouped)
		bkv__lanes_open(pool, (uint32_t)(s - pool->seqs));
	*seq = bkv__seq_id(pool, s);
	return BKV_OK;
}

int bkv_seq_open(bkv_pool *pool, uint32_t *seq)
{
	return bkv_seq_open_keyed(pool, 0, seq);
}

int bkv_seq_fork(bkv_pool *pool, uint32_t parent, uint32_t *child)
{
	bkv__seq *s, *c;
	uint32_t i;

	if (!pool || !child)
		return BKV_EINVAL;
	s = bkv__seq_get(pool, parent);
	if (!s)
		return BKV_ENOENT;
	if (s->state == BKV__SEQ_SWAPPED)
		return BKV_ESTATE;
	c = bkv__slot_peek(pool);
	if (!c)
		return BKV_EAGAIN;
	if (bkv__table_reserve(pool, c, s->n_blocks) ||
	    (pool->grouped && bkv__lanes_reserve(pool, (uint32_t)(c - pool->seqs), s->n_blocks)))
		return BKV_ENOMEM;
	/* last: the settle changes the pool, and after it only a state a step
	 * has not committed refuses (a settle inside a step does nothing) */
	if (pool->st_units) {
		bkv__state_settle(pool, s);
		if (bkv__state_can_fork(pool, s))
			return BKV_ESTATE;
	}
	bkv__slot_open(pool, c, s->key);
	for (i = 0; i < s->n_blocks; i++) {
		c->table[i] = s->table[i];
		pool->kv.blk[s->table[i]].ref++;
	}
	c->n_blocks = s->n_blocks;
	c->len = s->len;
	c->uncached = s->uncached;
	if (pool->grouped)
		bkv__lanes_fork(pool, (uint32_t)(s - pool->seqs), (uint32_t)(c - pool->seqs),
				s->n_blocks);
	*child = bkv__seq_id(pool, c);
	return BKV_OK;
}

/* The frames a device close of s releases to the cache or the free list:
 * those it holds the last reference of, in every lane (the segmented LRU
 * protects a chain that comes back whole or not at all: kv/value.c). */
static uint32_t close_frames(const bkv_pool *pool, const bkv__seq *s)
{
	uint32_t i, n = 0;

	for (i = 0; i < s->n_blocks; i++)
		n += pool->kv.blk[s->table[i]].ref == 1;
	if (pool->grouped)
		n += bkv__lanes_last_refs(pool, (uint32_t)(s - pool->seqs), s->n_blocks);
	return n;
}

static int seq_end(bkv_pool *pool, uint32_t seq, int drop)
{
	bkv__seq *s;
	uint32_t i;

	if (!pool)
		return BKV_EINVAL;
	s = bkv__seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	if (s->state != BKV__SEQ_SWAPPED && pool->kv.val_seg)
		bkv__kv_close_begin(&pool->kv, close_frames(pool, s));
	if (pool->grouped)
		bkv__lanes_release(pool, (uint32_t)(s - pool->seqs), s->n_blocks,
				   s->state == BKV__SEQ_SWAPPED, drop);
	if (s->state == BKV__SEQ_SWAPPED) {
		for (i = s->n_blocks; i-- > 0;)
			bkv__host_push(pool, s->table[i]);
		pool->nr_swapped--;
	} else {
		for (i = s->n_blocks; i-- > 0;)
			bkv__block_put(&pool->kv, s->table[i], drop);
		bkv__kv_close_end(&pool->kv);
	}
	slot_close(pool, s);
	return BKV_OK;
}

int bkv_seq_close(bkv_pool *pool, uint32_t seq)
{
	return seq_end(pool, seq, 0);
}

int bkv_seq_drop(bkv_pool *pool, uint32_t seq)
{
	return seq_end(pool, seq, 1);
}

/* Does writing at the end of s need a copy-on-write block? */
static int needs_cow(const bkv_pool *pool, const bkv__seq *s)
{
	const bkv__block *k;

	if ((s->len & (pool->kv.bt - 1)) == 0)
		return 0;
	k = &pool->kv.blk[s->table[s->n_blocks - 1]];
	return k->ref > 1 || BLOCK_IS_INDEXED(k);
}

int64_t bkv_seq_blocks_needed(const bkv_pool *pool, uint32_t seq, uint32_t n)
{
	bkv__seq *s = NULL;
	int64_t need;
	int rc;

	if (!pool)
		return BKV_EINVAL;
	if ((rc = bkv__seq_resident(pool, seq, &s)) != BKV_OK)
		return rc;
	if (n == 0)
		return 0;
	/* len + n can pass 2^32 blocks (block_tokens 1 or 2): counted in 64
	 * bits, not through blocks_for's uint32_t */
	need = (int64_t)(((uint64_t)s->len + n + pool->kv.bt - 1) >> pool->kv.bt_shift) - s->n_blocks;
	/* every lane takes as many (its trim may give some back) */
	return need * (1 + (int64_t)pool->n_lanes) + needs_cow(pool, s) +
	       (pool->n_lanes ? bkv__lanes_cows(pool, s) : 0);
}

/* The one-token append of a decode step, when it is simple: the last block is
 * private and unindexed with nothing past the end (no copy-on-write, no stale
 * fill), or the sequence ends on a block boundary and needs one new block from
 * a table that has room (with block_tokens >= 2 a single token is never a
 * prefix hit). Returns 0 without touching anything when the general path must
 * decide (errors included). Same effects as the general path. */
static inline int append_one(bkv_pool *pool, bkv__seq *s, int32_t token)
{
	const uint32_t bt = pool->kv.bt, off = s->len & (bt - 1);
	int32_t b;
	bkv__block *k;

	if (bt < 2 || s->len >= INT32_MAX || pool->grouped)
		return 0;
	if (off) {
		b = s->table[s->n_blocks - 1];
		k = &pool->kv.blk[b];
		if (k->ref != 1 || k->fill != off || (k->flags & BKV__BLOCK_INDEXED))
			return 0;
	} else {
		if (s->n_blocks >= s->cap || s->n_blocks >= pool->kv.nb ||
		    pool->kv.nr_free + pool->kv.nr_cached == 0)
			return 0;
		b = bkv__block_take(&pool->kv, s->n_blocks ? s->table[s->n_blocks - 1] : -1);
		s->table[s->n_blocks++] = b;
		k = &pool->kv.blk[b];
	}
	bkv__tok(&pool->kv, b)[off] = token;
	k->fill = off + 1;
	pool->kv.tokens++;
	pool->miss_tokens++;
	s->len++;
	if (off + 1 == bt)
		bkv__seq_block_filled(pool, s, s->n_blocks - 1);
	return 1;
}

static NOINLINE int append_any(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n,
				uint32_t *hit_tokens, int nohit);

int bkv_seq_append(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n,
		   uint32_t *hit_tokens)
{
	bkv__seq *s;

	if (LIKELY(pool && tokens && n == 1)) {
		s = bkv__seq_get(pool, seq);
		if (s && s->state == BKV__SEQ_OPEN && append_one(pool, s, tokens[0])) {
			if (hit_tokens)
				*hit_tokens = 0;
			BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
			return BKV_OK;
		}
	}
	return append_any(pool, seq, tokens, n, hit_tokens, 0);
}

int bkv__seq_append_private(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n)
{
	return append_any(pool, seq, tokens, n, NULL, 1);
}

void bkv__seq_reserve(bkv_pool *pool, uint32_t seq, uint32_t n_blocks)
{
	bkv__seq *s = bkv__seq_get(pool, seq);

	if (s && s->state == BKV__SEQ_OPEN &&
	    bkv__table_reserve(pool, s, BKV_MIN(n_blocks, pool->kv.nb)) == 0 && pool->grouped)
		(void)bkv__lanes_reserve(pool, (uint32_t)(s - pool->seqs),
					 BKV_MIN(n_blocks, pool->kv.nb));
}

/* bkv__append_fast's other cases (internal.h): a block boundary takes
 * append_one's boundary path, the rest the general one. */
int bkv__seq_append1_slow(bkv_pool *pool, uint32_t seq, int32_t token, uint32_t *hit,
			  const bkv__seq **out)
{
	bkv__seq *s = bkv__seq_get(pool, seq);
	int rc;

	if (s && s->state == BKV__SEQ_OPEN && append_one(pool, s, token)) {
		*hit = 0;
		*out = s;
		BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
		return BKV_OK;
	}
	/* a decode row writes its token: never a prefix hit (possible only
	 * with block_tokens 1), so its slot is in a private block */
	rc = append_any(pool, seq, &token, 1, hit, 1);
	if (rc == BKV_OK)
		*out = bkv__seq_get(pool, seq);
	return rc;
}

bkv__appended bkv__append_groups(bkv__appender *a, uint32_t seq, int32_t token)
{
	const uint32_t slot = seq & BKV__SEQ_SLOT_MASK;
	bkv__appended res = {NULL, 0, 0, 0, 0};
	bkv__seq *s;
	uint32_t off;

	if (!a->grouped || slot >= a->pool->cfg.max_seqs)
		return res;
	s = &a->seqs[slot];
	off = s->len & (a->bt - 1);
	if (s->state != BKV__SEQ_OPEN || s->gen != (seq >> BKV__SEQ_SLOT_BITS) ||
	    !bkv__lanes_append1(a->pool, s, token)) /* its checks, its counters */
		return res;
	res.table = s->table;
	res.nb = s->n_blocks;
	res.off = off;
	res.slot = (int32_t)(((size_t)s->table[s->n_blocks - 1] << a->shift) + off);
	res.clean = s->clean;
	return res;
}

/* The leading whole blocks of tokens[0, max * block_tokens) the cache holds
 * after the sequence's last block `parent` (-1: none; its chain hash ph),
 * written into s->table from n_blocks on (not visible until n_blocks moves;
 * the caller pins them) and counted; *relinked gets how many of them are on
 * the LRU. The table has room for max more entries. */
static uint32_t find_hits(const bkv_pool *pool, bkv__seq *s, int32_t parent, uint64_t ph,
			  const int32_t *tokens, uint32_t max, uint32_t *relinked)
{
	return bkv__cache_lookup_run(&pool->kv, ph, parent, s->key, tokens, max,
				     s->table + s->n_blocks, relinked);
}

/* find_hits after s's last block `last` (-1: none), indexed. */
static uint32_t hits_after(const bkv_pool *pool, bkv__seq *s, int32_t last, const int32_t *tokens,
			   uint32_t max, uint32_t *relinked)
{
	return find_hits(pool, s, last, last < 0 ? BKV__HASH_ROOT : pool->kv.blk[last].hash,
			 tokens, max, relinked);
}

/* Copy-on-write of s's last block (shared or indexed; off tokens of it are
 * s's): a fresh block with those tokens, a device copy recorded, the old
 * block's table reference dropped (it stays pinned as the copy's source).
 * Room for the block and the copy is reserved. Returns the new block. */
static int32_t cow_last(bkv_pool *pool, bkv__seq *s, uint32_t nb0, uint32_t off)
{
	int32_t nb = bkv__cow_block(pool, s->table[nb0 - 1], nb0 >= 2 ? s->table[nb0 - 2] : -1,
				    off);

	s->table[nb0 - 1] = nb;
	bkv__seq_dirty(s, nb0 - 1);
	return nb;
}

/* Write up to rem tokens into s's private last block b from offset off (a
 * truncate may have left stale tokens past it); offers the block to the
 * cache when it fills. Returns the tokens written. */
static ALWAYS_INLINE uint32_t fill_last(bkv_pool *pool, bkv__seq *s, int32_t b, uint32_t off,
					const int32_t *tokens, uint32_t rem)
{
	const uint32_t bt = pool->kv.bt;
	bkv__block *k = &pool->kv.blk[b];
	uint32_t w;

	BKV_ASSERT(k->ref == 1 && !BLOCK_IS_INDEXED(k) && k->fill >= off);
	k->flags &= ~BKV__BLOCK_TXN; /* rewritten: queued again if it fills */
	pool->kv.tokens -= k->fill - off;
	w = BKV_MIN(bt - off, rem);
	memcpy(bkv__tok(&pool->kv, b) + off, tokens, (size_t)w * sizeof(int32_t));
	k->fill = off + w;
	pool->kv.tokens += w;
	if (off + w == bt)
		bkv__seq_block_filled(pool, s, s->n_blocks - 1);
	return w;
}

/* Hash the full block at tokens after a block whose chain hash is h, and
 * ask for its index slots (append_blocks_cold). */
static inline uint64_t hash_ahead(const bkv__kv *kv, uint64_t h, uint64_t key,
				  const int32_t *tokens)
{
	h = bkv__block_hash(kv->hash_seed, h, key, tokens, kv->bt);
	bkv__slot_prefetch(kv, h);
	return h;
}

/* append_blocks in a cold pool: the same takes, fills and cache adds in
 * the same order, with the memory they touch asked for ahead. Evictions
 * look BKV__EVICT_AHEAD victims ahead along the LRU (which only loses its
 * head during the run); outside a transaction, the full blocks are hashed
 * BKV__HASH_AHEAD ahead from the last block's chain hash (each block's
 * parent is the one before it, so while each is indexed the next one's
 * hash is the one computed here) and added with it. */
static NOINLINE void append_blocks_cold(bkv_pool *pool, bkv__seq *s, const int32_t *tokens,
					uint32_t rem)
{
	bkv__kv *kv = &pool->kv;
	const uint32_t bt = kv->bt, full = rem >> kv->bt_shift;
	int32_t *table = s->table, prev = s->n_blocks ? table[s->n_blocks - 1] : -1, b, v = -1;
	uint32_t nbk = s->n_blocks, i, nh = 0, d, takes = full + ((rem & (bt - 1)) != 0);
	uint64_t hs[BKV__HASH_AHEAD], h = BKV__HASH_ROOT;
	int hashed = !kv->txn_active && (prev < 0 || BLOCK_IS_INDEXED(&kv->blk[prev]));

	if (hashed && prev >= 0)
		h = kv->blk[prev].hash;
	if (takes > kv->nr_free)
		for (v = kv->lru_head, d = 0; v >= 0 && d < BKV__EVICT_AHEAD; d++)
			v = bkv__evict_ahead(kv, v);
	kv->tokens += rem;
	for (i = 0; i < takes; i++) {
		const int32_t *t = tokens + (size_t)i * bt;
		uint32_t w = BKV_MIN(bt, rem);

		for (; hashed && nh < full && nh < i + BKV__HASH_AHEAD; nh++)
			hs[nh % BKV__HASH_AHEAD] = h =
				hash_ahead(kv, h, s->key, tokens + (size_t)nh * bt);
		if (v >= 0 && kv->free_head < 0)
			v = bkv__evict_ahead(kv, v);
		b = bkv__block_take(kv, prev);
		memcpy(bkv__tok(kv, b), t, (size_t)w * sizeof(int32_t));
		kv->blk[b].fill = w;
		table[nbk++] = b;
		rem -= w;
		prev = b;
		if (w < bt)
			break;
		if (!hashed) {
			bkv__seq_block_filled(pool, s, nbk - 1);
			continue;
		}
		/* bkv__cache_add's checks hold: no transaction, the parent
		 * indexed; a duplicate leaves b unindexed, and the blocks
		 * after it are then not added (their parent is not indexed) */
		if (bkv__cache_add_hashed(kv, b, s->key, hs[i % BKV__HASH_AHEAD]) >= 0)
			hashed = 0;
	}
	s->n_blocks = nbk;
}

/* Append rem tokens to s in fresh blocks (room reserved), each full one
 * offered to the cache. */
static ALWAYS_INLINE void append_blocks(bkv_pool *pool, bkv__seq *s, const int32_t *tokens,
					uint32_t rem)
{
	const uint32_t bt = pool->kv.bt;
	int32_t *table = s->table, prev = s->n_blocks ? table[s->n_blocks - 1] : -1, b;
	uint32_t nbk = s->n_blocks, pos = 0;

	if (pool->kv.index_cold && rem >= 2 * bt) {
		append_blocks_cold(pool, s, tokens, rem);
		return;
	}
	pool->kv.tokens += rem;
	while (rem) {
		uint32_t w = BKV_MIN(bt, rem);
		int32_t *dst;

		b = bkv__block_take(&pool->kv, prev);
		dst = bkv__tok(&pool->kv, b);
		if (w == 1)
			dst[0] = tokens[pos];
		else
			memcpy(dst, tokens + pos, (size_t)w * sizeof(int32_t));
		pool->kv.blk[b].fill = w;
		table[nbk++] = b;
		pos += w;
		rem -= w;
		if (w == bt)
			bkv__seq_block_filled(pool, s, nbk - 1);
		prev = b;
	}
	s->n_blocks = nbk;
}

/* append_any's argument checks: BKV_OK and *out, 1 for an empty append
 * (done), or the error. */
static int append_args(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n,
		       uint32_t *hit_tokens, bkv__seq **out)
{
	int rc;

	if (!pool || (!tokens && n))
		return BKV_EINVAL;
	if ((rc = bkv__seq_resident(pool, seq, out)) != BKV_OK)
		return rc;
	if (n == 0 && hit_tokens)
		*hit_tokens = 0;
	if ((uint64_t)(*out)->len + n > INT32_MAX)
		return BKV_E2BIG;
	return n == 0;
}

/* The blocks an append may take: free and cached ones but those its hits
 * relink. A grouped sequence's touch first releases what its last append
 * left to release: counted here, done only if the append goes ahead, so
 * that a refused append changes nothing. */
static uint64_t append_room(const bkv_pool *pool, const bkv__seq *s, uint32_t relinked)
{
	return (uint64_t)pool->kv.nr_free + pool->kv.nr_cached - relinked +
	       (pool->grouped ? bkv__lanes_touch_frees(pool, s) : 0);
}

/* Room for an append's need blocks (its hits relink relinked cached ones),
 * and with a shared STATE group for the units it writes (writes, taken of
 * them cached checkpoints its hit pins) beside them. */
static int append_fits(const bkv_pool *pool, const bkv__seq *s, uint64_t need, uint32_t relinked,
		       uint32_t taken, uint32_t writes)
{
	uint64_t room = append_room(pool, s, relinked);
	uint32_t need_u, frees;

	if (!pool->st_share)
		return need <= room;
	bkv__lanes_state_ask(pool, s, writes, &need_u, &frees);
	return bkv__state_share_fits(pool, (int64_t)room - (int64_t)need, relinked, taken, need_u,
				     frees);
}

/* An append's commit begins: its hits (stashed past nb0: device hits,
 * then hh host hits) pinned or held in every group, before any take can
 * evict them; then, with a shared STATE group, units lent or given back
 * for the need blocks and the units it writes. */
static void pin_hits(bkv_pool *pool, const bkv__seq *s, uint32_t nb0, uint32_t hits,
		     uint32_t hh, uint64_t need, uint32_t writes)
{
	uint32_t i;

	for (i = 0; i < hits; i++)
		bkv__block_pin(&pool->kv, s->table[nb0 + i]);
	if (pool->grouped && hits + hh)
		bkv__lanes_pin_hits(pool, s, nb0, nb0 + hits + hh, hh != 0);
	for (i = 0; i < hh; i++)
		bkv__hc_hold(pool, s->table[nb0 + hits + i]);
	if (hh && pool->n_lanes)
		bkv__hc_hold_lanes(pool, s, nb0 + hits, nb0 + hits + hh);
	if (pool->st_share)
		bkv__state_share_prepare(pool, (uint32_t)need, writes ? bkv__state_need(pool, s) : 0);
}

/* Host-cache hits (pool/hcache.c) after the device hits of an append, the
 * sequence's table ending at entry at (which is indexed, or none): their
 * host ids stashed at s->table[at ..) (room reserved), counted. */
static uint32_t host_hits(const bkv_pool *pool, bkv__seq *s, uint32_t at, const int32_t *tokens,
			  uint32_t max)
{
	uint64_t ph = at ? pool->kv.blk[s->table[at - 1]].hash : BKV__HASH_ROOT;

	return bkv__hc_lookup_run(pool, ph, s->key, tokens, max, s->table + at);
}

/* append_any's pre-pass of a sequence that ends on an indexed block (or
 * is empty): its device hits among the next max whole blocks of tokens
 * (fitted to every KV group's needs; *seen gets group 0's before the
 * fitting), all stashed past the table's end. */
static uint32_t prepass_hits(const bkv_pool *pool, bkv__seq *s, const int32_t *tokens,
			     uint32_t max, uint32_t *relinked, uint32_t *units, uint32_t *seen)
{
	const uint32_t nb0 = s->n_blocks;
	const int32_t last = nb0 ? s->table[nb0 - 1] : -1;
	uint32_t hits = hits_after(pool, s, last, tokens, max, relinked);

	*seen = hits;
	if (pool->grouped && hits)
		return bkv__lanes_fit_hits(pool, s, nb0, hits, tokens, relinked, units);
	return hits;
}

/* The blocks an append takes (group 0's after its hits and hh host hits -
 * a reload takes one as a write does - copy-on-write, the lanes'), with
 * *lcow the lanes' copy-on-writes and *writes nonzero when it computes
 * tokens (a STATE group's scratch unit, beside units cached checkpoints
 * its hit pins). */
static uint64_t append_need(const bkv_pool *pool, const bkv__seq *s, uint32_t n, uint32_t hits,
			    uint32_t hh, uint32_t units, int cow, uint32_t *lcow, uint32_t *writes)
{
	const uint32_t nb0 = s->n_blocks, new_blocks = bkv__blocks_for(pool, (uint64_t)s->len + n);
	uint64_t need = (uint64_t)new_blocks - nb0 - hits + (uint64_t)cow;

	*writes = n > (hits + hh) * pool->kv.bt ? units + 1 : 0;
	*lcow = 0;
	if (pool->grouped) /* a state unit it cannot have counts as no room */
		need += bkv__lanes_need(pool, s, nb0 + hits, new_blocks, lcow, *writes);
	return need;
}

/* append_any's host-cache hits after its hits (of n tokens), which end
 * where group 0's cached chain ends: group 0's run, shortened with groups
 * until every group has its blocks (bkv__hc_fit_lanes), stashed; none
 * when what they pin beside the device hits would not fit. For the run
 * kept, *relinked and *units become the whole hit's (the pre-pass's). */
static uint32_t host_run(const bkv_pool *pool, bkv__seq *s, const int32_t *tokens, uint32_t n,
			 uint32_t hits, int cow, uint32_t *relinked, uint32_t *units)
{
	const uint32_t a = s->n_blocks + hits;
	const int32_t *t = tokens + (size_t)hits * pool->kv.bt;
	uint32_t hh = host_hits(pool, s, a, t, n / pool->kv.bt - hits), rel = *relinked, u = 0,
		 lcow, writes;
	uint64_t need;

	if (hh && pool->grouped)
		hh = bkv__hc_fit_lanes(pool, s, a, hh, t, &rel, &u);
	if (!hh)
		return 0;
	need = append_need(pool, s, n, hits, hh, u, cow, &lcow, &writes);
	if (!append_fits(pool, s, need, rel, u, writes))
		return 0;
	*relinked = rel;
	*units = u; /* a STATE group's checkpoint at the run's end */
	return hh;
}

/* Any append: validation, prefix hits (none with nohit: every token is
 * written, into private blocks), copy-on-write, whole blocks. */
static NOINLINE int append_any(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n,
				uint32_t *hit_tokens, int nohit)
{
	uint32_t bt, off, nb0, new_len, new_blocks, hits = 0, relinked = 0, pos, rem, i, lcow = 0,
		 units = 0, writes, hh = 0, seen = 0;
	int32_t last;
	uint64_t need;
	bkv__seq *s = NULL;
	int cow, rc, lookup;

	if ((rc = append_args(pool, seq, tokens, n, hit_tokens, &s)) != BKV_OK)
		return rc > 0 ? BKV_OK : rc;
	if (n == 1 && pool->grouped && bkv__lanes_append1(pool, s, tokens[0])) {
		if (hit_tokens) /* one token inside every group's last block */
			*hit_tokens = 0;
		return BKV_OK;
	}
	bt = pool->kv.bt;
	new_len = s->len + n;
	new_blocks = bkv__blocks_for(pool, new_len);
	if (new_blocks > pool->kv.nb)
		return BKV_E2BIG;
	if (bkv__table_reserve(pool, s, new_blocks) ||
	    (pool->grouped && bkv__lanes_reserve(pool, (uint32_t)(s - pool->seqs), new_blocks)))
		return BKV_ENOMEM;

	off = s->len & (bt - 1);
	nb0 = s->n_blocks;
	last = nb0 ? s->table[nb0 - 1] : -1;
	cow = needs_cow(pool, s);

	/* Pre-pass: verified prefix hits, stashed past the table's end (not
	 * visible until n_blocks moves), then the host cache's after them
	 * (when the device's were whole as found). */
	lookup = pool->kv.index && !nohit && off == 0 &&
		 (last < 0 || BLOCK_IS_INDEXED(&pool->kv.blk[last]));
	if (lookup)
		hits = prepass_hits(pool, s, tokens, n / bt, &relinked, &units, &seen);
	if (lookup && pool->hc_on && hits == seen && hits < n / bt)
		hh = host_run(pool, s, tokens, n, hits, cow, &relinked, &units);
	BKV_ASSERT(relinked <= pool->kv.nr_cached);
	need = append_need(pool, s, n, hits, hh, units, cow, &lcow, &writes);
	if (!append_fits(pool, s, need, relinked, units, writes))
		return BKV_ENOSPC;
	if (((cow || lcow) && bkv__copies_reserve(pool, BKV_COPY_DEVICE, (uint32_t)cow + lcow)) ||
	    (hh && bkv__copies_reserve(pool, BKV_COPY_SWAP_IN, hh * (pool->n_lanes + 1))))
		return BKV_ENOMEM;
	if (pool->grouped)
		bkv__lanes_touch(pool, s);

	/* Commit. */
	pin_hits(pool, s, nb0, hits, hh, need, writes);
	s->n_blocks = nb0 + hits;
	bkv__hc_reload_run(pool, s, hh); /* after the pins: no take evicts a hit */
	if (hh && pool->n_lanes)
		bkv__hc_reload_lanes(pool, s, nb0 + hits, nb0 + hits + hh);
	hits += hh;
	pos = hits * bt;
	rem = n - pos;
	if (rem && off) {
		uint32_t w = fill_last(pool, s, cow ? cow_last(pool, s, nb0, off) : last, off,
				       tokens + pos, rem);

		pos += w;
		rem -= w;
	}
	if (rem)
		append_blocks(pool, s, tokens + pos, rem);
	BKV_ASSERT(s->n_blocks == new_blocks);
	i = s->len;
	s->len = new_len;
	if (pool->grouped)
		bkv__lanes_commit(pool, s, i, hits, seen, tokens, n);
	pool->hit_tokens += (uint64_t)hits * bt;
	pool->miss_tokens += n - (uint64_t)hits * bt;
	if (hit_tokens)
		*hit_tokens = hits * bt;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

/* bkv__seq_take_hits in a pool with lanes: whole blocks after a sequence
 * that ends on a block boundary (a partial last block is not swapped for a
 * cached one: each lane would have to swap its own). */
static int take_hits_lanes(bkv_pool *pool, bkv__seq *s, const int32_t *tokens, uint32_t n)
{
	const uint32_t nb0 = s->n_blocks, bt = pool->kv.bt;
	uint32_t hits, i, relinked = 0, nbmax, units = 0;
	int32_t last = nb0 ? s->table[nb0 - 1] : -1;

	if ((s->len & (bt - 1)) || (last >= 0 && !BLOCK_IS_INDEXED(&pool->kv.blk[last])))
		return 0;
	nbmax = BKV_MIN(bkv__blocks_for(pool, (uint64_t)s->len + n), pool->kv.nb);
	if (bkv__table_reserve(pool, s, nbmax) ||
	    bkv__lanes_reserve(pool, (uint32_t)(s - pool->seqs), nbmax))
		return 0;
	bkv__lanes_touch(pool, s);
	hits = hits_after(pool, s, last, tokens, BKV_MIN(n / bt, s->cap - nb0), &relinked);
	if (hits && pool->n_lanes)
		bkv__lanes_seen(pool, s, nb0 + hits); /* before the lanes shorten them */
	if (hits)
		hits = bkv__lanes_fit_hits(pool, s, nb0, hits, tokens, &relinked, &units);
	if (!hits)
		return 0;
	for (i = 0; i < hits; i++)
		bkv__block_pin(&pool->kv, s->table[nb0 + i]);
	bkv__lanes_pin_hits(pool, s, nb0, nb0 + hits, 0);
	s->n_blocks = nb0 + hits;
	s->len += hits * bt;
	pool->hit_tokens += (uint64_t)hits * bt;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return (int)(hits * bt);
}

/* bkv__seq_take_hits's host-cache hits after the device ones (the table
 * ends on an indexed block or is empty; room for max entries): as many as
 * the free and cached device blocks and the copy list hold. */
static uint32_t take_host_hits(bkv_pool *pool, bkv__seq *s, const int32_t *tokens, uint32_t max)
{
	uint32_t hh = host_hits(pool, s, s->n_blocks, tokens, max);

	hh = (uint32_t)BKV_MIN((uint64_t)hh, (uint64_t)pool->kv.nr_free + pool->kv.nr_cached);
	if (hh && bkv__copies_reserve(pool, BKV_COPY_SWAP_IN, hh))
		return 0;
	bkv__hc_hold_run(pool, s, hh);
	bkv__hc_reload_run(pool, s, hh);
	return hh;
}

int bkv__seq_take_hits(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n)
{
	uint32_t bt = pool->kv.bt, off, nb0, hits = 0, got = 0, i, relinked;
	uint64_t ph = BKV__HASH_ROOT, h = 0;
	int32_t parent = -1, last;
	bkv__seq *s = NULL;

	if (!pool->kv.index || bkv__seq_resident(pool, seq, &s) != BKV_OK || n == 0)
		return 0;
	if ((uint64_t)s->len + n > INT32_MAX)
		return 0;
	off = s->len & (bt - 1);
	if (pool->grouped) /* whole blocks only (docs/design.md, "KV groups") */
		return take_hits_lanes(pool, s, tokens, n);
	nb0 = s->n_blocks;
	last = nb0 ? s->table[nb0 - 1] : -1;
	if (off) {
		/* The last block is partial: its own tokens and the next bt - off
		 * make a full block, which the cache may hold. Only a private
		 * block nothing else reads is swapped out. */
		bkv__block *k = &pool->kv.blk[last];
		int32_t c, *t = bkv__tok(&pool->kv, last);

		if (n < bt - off || k->ref != 1 || BLOCK_IS_INDEXED(k) || k->fill != off ||
		    (k->flags & (BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN | BKV__BLOCK_TXN |
				 BKV__BLOCK_COPY_SRC)) ||
		    (k->parent >= 0 && !BLOCK_IS_INDEXED(&pool->kv.blk[k->parent])))
			return 0;
		/* the private block's token ids past fill are scratch */
		memcpy(t + off, tokens, (size_t)(bt - off) * sizeof(int32_t));
		if (k->parent >= 0)
			ph = pool->kv.blk[k->parent].hash;
		c = bkv__cache_lookup(&pool->kv, ph, k->parent, s->key, t, &h);
		if (c < 0)
			return 0;
		bkv__block_pin(&pool->kv, c);
		s->table[nb0 - 1] = c;
		bkv__seq_dirty(s, nb0 - 1);
		bkv__block_put(&pool->kv, last, 1);
		got = bt - off;
		ph = h;
		parent = c;
	} else if (last >= 0) {
		if (!BLOCK_IS_INDEXED(&pool->kv.blk[last]))
			return 0;
		ph = pool->kv.blk[last].hash;
		parent = last;
	}
	/* then whole blocks, as append_any's pre-pass (pinned as found: there
	 * is nothing to undo, each is a complete hit) */
	if (bkv__table_reserve(pool, s, BKV_MIN(bkv__blocks_for(pool, (uint64_t)s->len + n), pool->kv.nb)))
		return (int)got;
	hits = find_hits(pool, s, parent, ph, tokens + got,
			 BKV_MIN((n - got) / bt, s->cap - nb0), &relinked);
	for (i = 0; i < hits; i++)
		bkv__block_pin(&pool->kv, s->table[nb0 + i]);
	s->n_blocks = nb0 + hits;
	if (pool->hc_on)
		hits += take_host_hits(pool, s, tokens + got + (size_t)hits * bt,
				       BKV_MIN((n - got) / bt, s->cap - nb0) - hits);
	got += hits * bt;
	s->len += got;
	pool->hit_tokens += got;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return (int)got;
}

int bkv_seq_truncate(bkv_pool *pool, uint32_t seq, uint32_t new_len)
{
	bkv__seq *s = NULL;
	uint32_t nbk, i;
	int rc;

	if (!pool)
		return BKV_EINVAL;
	if ((rc = bkv__seq_resident(pool, seq, &s)) != BKV_OK)
		return rc;
	if (new_len > s->len)
		return BKV_EINVAL;
	if (pool->grouped && (!bkv__lanes_can_truncate(pool, s, new_len) ||
			      (pool->st_units && !bkv__state_can_truncate(pool, s, new_len))))
		return BKV_ESTATE; /* a window would need KV it released, or a
				      state that was never kept */
	nbk = bkv__blocks_for(pool, new_len);
	if (pool->grouped) {
		bkv__lanes_truncate(pool, s, nbk, new_len);
		if (pool->st_units)
			bkv__state_truncate(pool, s, new_len);
	}
	for (i = s->n_blocks; i-- > nbk;)
		bkv__block_put(&pool->kv, s->table[i], 0);
	s->n_blocks = nbk;
	if (nbk < s->clean)
		s->clean = nbk;
	if (new_len < pool->kv.bt)
		s->uncached = 0; /* block 0 is indexed again once full */
	if (nbk) {
		bkv__block *k = &pool->kv.blk[s->table[nbk - 1]];
		uint32_t off = new_len - (nbk - 1) * pool->kv.bt;

		/* A private, unindexed block forgets the tokens cut off. */
		if (k->ref == 1 && !BLOCK_IS_INDEXED(k) && k->fill > off) {
			pool->kv.tokens -= k->fill - off;
			k->fill = off;
			k->flags &= ~BKV__BLOCK_TXN; /* no longer full: unqueued */
		}
	}
	s->len = new_len;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

const int32_t *bkv_seq_blocks(const bkv_pool *pool, uint32_t seq, uint32_t *n_blocks)
{
	const bkv__seq *s = pool ? bkv__seq_get(pool, seq) : NULL;

	if (n_blocks)
		*n_blocks = s ? s->n_blocks : 0;
	if (!s)
		return NULL;
	return s->table;
}

const int32_t *bkv_seq_group_blocks(const bkv_pool *pool, uint32_t seq, uint32_t group,
				    uint32_t *n_blocks)
{
	const bkv__seq *s = pool ? bkv__seq_get(pool, seq) : NULL;

	if (n_blocks)
		*n_blocks = 0;
	if (!s || group > pool->n_lanes)
		return NULL;
	if (n_blocks)
		*n_blocks = s->n_blocks;
	if (group == 0)
		return s->table;
	/* a lane's table may be unallocated while it has no entries */
	return s->n_blocks ? pool->lanes[group - 1].seqs[s - pool->seqs].table : s->table;
}

int bkv_seq_info_get(const bkv_pool *pool, uint32_t seq, bkv_seq_info *info)
{
	const bkv__seq *s;

	if (!pool || !info)
		return BKV_EINVAL;
	s = bkv__seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	info->len = s->len;
	info->n_blocks = s->n_blocks;
	info->swapped = s->state == BKV__SEQ_SWAPPED;
	info->key = s->key;
	return BKV_OK;
}
