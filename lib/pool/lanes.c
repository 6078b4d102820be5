/*
 * lanes.c - KV groups after the first: their tables, what a sliding window
 * or a chunked group releases, and their part of every sequence operation.
 *
 * A hybrid model's pool has one lane per KV group after the first (group 0
 * is full attention and is the plain pool's own table, pool/seq.c). Every
 * lane uses the pool's block_tokens, so logical block i of a sequence holds
 * the same positions in every lane and a lane's table has the same length
 * as lane 0's. Frames are shared: a lane takes its blocks from the one free
 * list and the one prefix cache, so memory moves between groups as they
 * need it.
 *
 * Sliding windows and chunks. Position p of a WINDOW lane reads positions
 * p - W + 1 .. p; of a CHUNKED lane, floor(p / C) * C .. p. A sequence of
 * len tokens therefore never reads again the blocks below first(len), the
 * block holding the first position its next token (at len) reads. They are
 * released lazily, at the start of the sequence's next append, swap-out or
 * fork (bkv__lanes_trim): a chunk's kernel still reads the blocks its own
 * first token needs, so they cannot go at the end of the append. Released
 * blocks follow the usual rules: full and indexed ones stay in the prefix
 * cache (a later hit may need them), the rest go to the free list. Their
 * table entries become -1; the lane keeps only lo, the first held entry.
 *
 * The prefix cache. Lane l's block i is indexed as a child of lane 0's
 * block i - 1 (its parent, for hashing and for the cache's child-before-
 * parent eviction order) under the sequence key xor the lane's salt, so its
 * chain hash is a function of the same prefix and a lookup finds it from
 * lane 0's chain. A hit of h blocks needs, in every lane, the blocks a
 * sequence of h blocks reads next: all of them for FULL, those from
 * first(h * block_tokens) for WINDOW and CHUNKED (bkv__lanes_fit_hits
 * shortens the hit until every lane has them). Salts are 64-bit constants
 * xor-ed into the caller's key; lookups also compare the parent block id
 * and every token, so a lane can only ever be served its own group's KV
 * unless a caller chose two keys that differ by exactly a salt.
 *
 * Keeping (docs/design.md, "KV groups: the pool and the step", keeping lane
 * blocks). A window or chunked lane's released block at position i serves
 * only hits that end at an e with first(e) <= i < e, while lane 0's
 * block serves every hit through it; cached alike, the lanes' released
 * blocks (one beside each of lane 0's) take half the cache and push out
 * lane 0's chains. So a block the window releases goes to the LRU cold
 * (kv/value.c: evicted before any block released otherwise) unless a hit
 * is expected to end where it serves, at one of the sequence's two keep
 * points: hit_end, where its last prefix lookup left lane 0's cached
 * chain (a prefix that another request has diverged at already), whose
 * hits need [first(hit_end), hit_end); and prompt_end, the end of its last
 * multi-token append (a prompt, which a later request may share up to
 * anywhere in its last window), whose hits ending anywhere in what its
 * last token reads, [first(prompt_end), prompt_end], need blocks from
 * first(first(prompt_end)). What a close, truncate or swap releases is the
 * sequence's end and is kept as before. O(1) a block; only a pool with a
 * prefix cache and a WINDOW or CHUNKED lane does it (bkv__kv_lanes_on),
 * with every eviction policy.
 */
#include "pool/pool.h"

#include <string.h>

/* ---- geometry --------------------------------------------------------------- */

uint32_t bkv__lane_first(const bkv_pool *pool, const bkv__glane *ln, uint64_t len)
{
	uint64_t p;

	switch (ln->kind) {
	case BKV_GROUP_WINDOW:
		p = len + 1 > ln->span ? len + 1 - ln->span : 0;
		break;
	case BKV_GROUP_CHUNKED:
		p = len / ln->span * ln->span;
		break;
	default:
		return 0;
	}
	return (uint32_t)(p >> pool->kv.bt_shift);
}

/* A salt per lane: splitmix64 of the lane number, never 0. */
static uint64_t lane_salt(uint32_t l)
{
	uint64_t z = 0x9e3779b97f4a7c15ull * (l + 1);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return z ? z : 1;
}

/* ---- create / destroy ------------------------------------------------------- */

int bkv__lanes_config_check(const bkv_pool_config *c)
{
	uint32_t i, n = c->n_groups;
	uint64_t need;
	int rc;

	if (n == 0)
		return BKV_OK;
	/* each group by the rules the sizing functions keep (base/sizing.c) */
	if ((rc = bkv__kv_groups_check(c->groups, n, c->block_tokens, "bkv_pool_config")) != BKV_OK)
		return rc;
	for (i = 0; i < n; i++) /* a STATE group: the last, not the only */
		if (c->groups[i].kind == BKV_GROUP_STATE && (i != n - 1 || i == 0))
			return bkv__fail(BKV_EINVAL, "bkv_kv_group[%u].kind = STATE: a STATE group "
					 "must be the last group, after a FULL group 0", i);
	/* group 0 is full attention (lane 0, the plain tables); the frame
	 * arithmetic must hold (base/sizing.c) */
	if (c->groups[0].kind != BKV_GROUP_FULL)
		return bkv__fail(BKV_EINVAL, "bkv_kv_group[0].kind = %u: group 0 must be FULL",
				 c->groups[0].kind);
	if (!bkv_kv_frame_bytes(c->groups, n, c->block_tokens))
		return bkv__fail(BKV_EINVAL, "bkv_pool_config.groups: a frame's bytes (block_tokens "
				 "x layers x bytes) overflow uint64_t");
	/* sharing: the floor and one more unit fit; else the arena leaves a frame */
	need = c->state_share ? bkv__state_floor_frames(c) : bkv__state_arena(c) + 1;
	if (need > c->device_blocks)
		return bkv__fail(BKV_EINVAL, "bkv_pool_config.state_units = %u (0: 2 x max_seqs): "
				 "the STATE group needs %llu device frames, device_blocks = %u", c->state_units,
				 (unsigned long long)need, c->device_blocks);
	return BKV_OK;
}

/* Does the pool keep its lanes' released blocks by the rule above: a
 * prefix cache and a lane that releases blocks (WINDOW or CHUNKED)? */
static int keeps_lanes(const bkv_pool *pool)
{
	uint32_t l;

	if (!pool->kv.index)
		return 0;
	for (l = 0; l < pool->n_lanes; l++)
		if (pool->lanes[l].kind != BKV_GROUP_FULL)
			return 1;
	return 0;
}

int bkv__lanes_init(bkv_pool *pool)
{
	const bkv_pool_config *c = &pool->cfg;
	uint32_t i, n = c->n_groups;

	if (n) {
		memcpy(pool->groups, c->groups, (size_t)n * sizeof *pool->groups);
		pool->cfg.groups = pool->groups;
	} else {
		pool->cfg.groups = NULL;
	}
	pool->n_lanes = n > 1 ? n - 1 : 0;
	if (n > 1 && pool->groups[n - 1].kind == BKV_GROUP_STATE)
		pool->n_lanes--; /* the STATE group is not a lane (pool/state.c) */
	for (i = 0; i < pool->n_lanes; i++) {
		bkv__glane *ln = &pool->lanes[i];

		ln->kind = pool->groups[i + 1].kind;
		ln->span = pool->groups[i + 1].span;
		ln->group = i + 1;
		ln->salt = lane_salt(i + 1);
		ln->seqs = bkv__calloc(&pool->alloc, c->max_seqs, sizeof *ln->seqs);
		if (!ln->seqs)
			return BKV_ENOMEM;
	}
	if (bkv__state_init(pool) != BKV_OK)
		return BKV_ENOMEM;
	if (keeps_lanes(pool) && bkv__kv_lanes_on(&pool->kv, &pool->alloc) != BKV_OK)
		return BKV_ENOMEM;
	pool->grouped = pool->n_lanes || pool->st_units;
	if (pool->n_lanes && bkv__kv_groups_on(&pool->kv, &pool->alloc) != BKV_OK)
		return BKV_ENOMEM;
	if (pool->grouped) {
		pool->lane_stamp = bkv__calloc(&pool->alloc, c->max_seqs, sizeof(uint32_t));
		pool->lane_touched = bkv__calloc(&pool->alloc, c->max_seqs, sizeof(uint32_t));
		if (!pool->lane_stamp || !pool->lane_touched)
			return BKV_ENOMEM;
	}
	return BKV_OK;
}

void bkv__lanes_bytes(const bkv_pool *pool, uint64_t *slot, uint64_t *entries)
{
	uint32_t i, j;

	*slot = pool->n_lanes * sizeof(bkv__lseq) +
		(pool->lane_stamp ? 2 * sizeof(uint32_t) : 0); /* lane_stamp, lane_touched */
	*entries = 0;
	for (i = 0; i < pool->n_lanes; i++)
		for (j = 0; pool->lanes[i].seqs && j < pool->cfg.max_seqs; j++)
			*entries += pool->lanes[i].seqs[j].cap;
}

void bkv__lanes_free(bkv_pool *pool)
{
	uint32_t i, j;

	bkv__kv_lanes_off(&pool->kv, &pool->alloc);
	for (i = 0; i < pool->n_lanes; i++) {
		bkv__lseq *ls = pool->lanes[i].seqs;

		if (!ls)
			continue;
		for (j = 0; j < pool->cfg.max_seqs; j++)
			bkv__free(&pool->alloc, ls[j].table, (size_t)ls[j].cap * sizeof(int32_t));
		bkv__free(&pool->alloc, ls, pool->cfg.max_seqs * sizeof *ls);
	}
	bkv__free(&pool->alloc, pool->lane_stamp, pool->cfg.max_seqs * sizeof(uint32_t));
	bkv__free(&pool->alloc, pool->lane_touched, pool->cfg.max_seqs * sizeof(uint32_t));
}

/* ---- tables ----------------------------------------------------------------- */

/* A lane table's new entries are -1 (nothing held). */
static int lseq_reserve(bkv_pool *pool, bkv__lseq *ls, uint32_t n)
{
	if (n <= ls->cap)
		return 0;
	return bkv__ids_grow(pool, &ls->table, &ls->cap, n, 1);
}

int bkv__lanes_reserve(bkv_pool *pool, uint32_t slot, uint32_t n)
{
	uint32_t l;

	for (l = 0; l < pool->n_lanes; l++)
		if (lseq_reserve(pool, &pool->lanes[l].seqs[slot], n))
			return BKV_ENOMEM;
	return BKV_OK;
}

void bkv__lanes_open(bkv_pool *pool, uint32_t slot)
{
	uint32_t l;

	if (pool->st_units)
		bkv__state_open(pool, slot);
	for (l = 0; l < pool->n_lanes; l++) {
		bkv__lseq *ls = &pool->lanes[l].seqs[slot];

		ls->lo = 0;
		ls->clean = 0;
		ls->hit_end = ls->prompt_end = 0;
	}
}

/* Child slot c shares every held block of parent slot p (tables reserved). */
void bkv__lanes_fork(bkv_pool *pool, uint32_t p, uint32_t c, uint32_t n_blocks)
{
	uint32_t l, i;

	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__lseq *ps = &pool->lanes[l].seqs[p];
		bkv__lseq *cs = &pool->lanes[l].seqs[c];

		for (i = 0; i < n_blocks; i++) {
			cs->table[i] = ps->table[i];
			if (ps->table[i] >= 0)
				pool->kv.blk[ps->table[i]].ref++;
		}
		cs->lo = ps->lo;
		cs->clean = 0;
		cs->hit_end = ps->hit_end;
		cs->prompt_end = ps->prompt_end;
	}
	if (pool->st_units)
		bkv__state_fork(pool, p, c);
}

/* The device blocks slot's lanes hold the last reference of among its
 * first n_blocks entries (a close releases them). */
uint32_t bkv__lanes_last_refs(const bkv_pool *pool, uint32_t slot, uint32_t n_blocks)
{
	uint32_t l, i, n = 0;

	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__lseq *ls = &pool->lanes[l].seqs[slot];

		for (i = ls->lo; i < n_blocks; i++)
			n += ls->table[i] >= 0 && pool->kv.blk[ls->table[i]].ref == 1;
	}
	return n;
}

/* Release every held entry of slot's lanes (close, drop): device blocks by
 * the release rules, host blocks to the host free list. Lanes go before
 * lane 0 so that the cache keeps a lane block older than its parent. */
void bkv__lanes_release(bkv_pool *pool, uint32_t slot, uint32_t n_blocks, int swapped, int drop)
{
	uint32_t l, i;

	if (pool->st_units)
		bkv__state_release(pool, slot, swapped);
	for (l = pool->n_lanes; l-- > 0;) {
		bkv__lseq *ls = &pool->lanes[l].seqs[slot];

		for (i = n_blocks; i-- > ls->lo;) {
			if (ls->table[i] < 0)
				continue;
			if (swapped)
				bkv__host_push(pool, ls->table[i]);
			else
				bkv__block_put(&pool->kv, ls->table[i], drop);
			ls->table[i] = -1;
		}
		for (i = 0; i < ls->lo && i < n_blocks; i++)
			ls->table[i] = -1;
		ls->lo = 0;
		ls->hit_end = ls->prompt_end = 0;
	}
}

/* The first block of lane ln a hit ending at block e reads (first(e)). */
static inline uint32_t first_at(const bkv_pool *pool, const bkv__glane *ln, uint32_t e)
{
	return bkv__lane_first(pool, ln, (uint64_t)e << pool->kv.bt_shift);
}

/* Release what s can no longer read in every window or chunked lane, cold
 * unless at a keep point (see the opening). Device-resident s only. */
void bkv__lanes_trim(bkv_pool *pool, const bkv__seq *s)
{
	bkv__lanes_trim_to(pool, s, s->len);
}

/* As bkv__lanes_trim, for a sequence of len tokens (len <= s->len: what an
 * overlapped step still outstanding reads stays, pool/overlap.c). */
void bkv__lanes_trim_to(bkv_pool *pool, const bkv__seq *s, uint32_t len)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l, i, first, h0, p0;

	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		bkv__lseq *ls = &ln->seqs[slot];

		if (ln->kind == BKV_GROUP_FULL)
			continue;
		first = BKV_MIN(bkv__lane_first(pool, ln, len), s->n_blocks);
		if (first <= ls->lo)
			continue;
		h0 = first_at(pool, ln, ls->hit_end);
		p0 = first_at(pool, ln, first_at(pool, ln, ls->prompt_end));
		for (i = ls->lo; i < first; i++) {
			if (ls->table[i] < 0)
				continue;
			if ((i >= h0 && i < ls->hit_end) || (i >= p0 && i < ls->prompt_end))
				bkv__block_put(&pool->kv, ls->table[i], 0);
			else
				bkv__block_put_cold(&pool->kv, ls->table[i]);
			ls->table[i] = -1;
			bkv__seq_dirty_lane(ls, i);
		}
		if (first > ls->lo)
			ls->lo = first;
	}
}

void bkv__lanes_touch(bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);

	if (!pool->kv.txn_active) {
		if (pool->st_units)
			bkv__state_begin(pool, s); /* the last append's state */
		bkv__lanes_trim(pool, s);
		return;
	}
	if (pool->lane_stamp[slot] != pool->txn_serial) {
		/* an append before the step (nothing to promote or drop: none) */
		if (pool->st_units && (pool->st_scratch[slot] >= 0 || pool->st_undo[slot] != BKV__ST_NO_UNDO))
			bkv__state_begin(pool, s);
		pool->lane_stamp[slot] = pool->txn_serial;
		pool->lane_touched[pool->n_touched++] = slot;
	}
}

/* Will bkv__lanes_touch settle s's state (an append before this one left
 * it pending)? Outside a transaction always; inside, at s's first touch. */
static int touch_settles(const bkv_pool *pool, const bkv__seq *s)
{
	return !pool->kv.txn_active || pool->lane_stamp[s - pool->seqs] != pool->txn_serial;
}

uint32_t bkv__lanes_touch_frees(const bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l, i, first, n = 0;

	if (pool->kv.txn_active) /* a touch inside a step trims at its commit */
		return 0;
	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		const bkv__lseq *ls = &ln->seqs[slot];

		if (ln->kind == BKV_GROUP_FULL)
			continue;
		first = BKV_MIN(bkv__lane_first(pool, ln, s->len), s->n_blocks);
		for (i = ls->lo; i < first; i++) {
			const bkv__block *k;

			if (ls->table[i] < 0)
				continue;
			k = &pool->kv.blk[ls->table[i]];
			n += k->ref == 1 && !(k->flags & BKV__BLOCK_COPY_SRC);
		}
	}
	return n;
}

int bkv__lanes_touched(const bkv_pool *pool, const bkv__seq *s)
{
	return pool->kv.txn_active && pool->lane_stamp[s - pool->seqs] == pool->txn_serial;
}

void bkv__lanes_txn_end(bkv_pool *pool, int commit)
{
	uint32_t i;

	for (i = 0; commit && i < pool->n_touched; i++) {
		const bkv__seq *s = &pool->seqs[pool->lane_touched[i]];

		if (s->state != BKV__SEQ_OPEN)
			continue;
		bkv__lanes_trim(pool, s);
		if (pool->st_units)
			bkv__state_commit(pool, s);
	}
	pool->n_touched = 0;
	pool->txn_serial = pool->txn_serial + 1 ? pool->txn_serial + 1 : 1;
}

/* ---- appends ---------------------------------------------------------------- */

/* Lane block ls->table[pos] just became full: offer it to the cache, as a
 * child of lane 0's block pos - 1, noting its place for commit's dedupe. */
static void lane_block_filled(bkv_pool *pool, uint32_t l, uint32_t slot, uint32_t pos)
{
	const bkv__glane *ln = &pool->lanes[l];
	int32_t b = ln->seqs[slot].table[pos];

	if (!pool->kv.index || pool->seqs[slot].noindex)
		return;
	(void)bkv__cache_add(&pool->kv, b, pool->seqs[slot].key ^ ln->salt);
	if (bkv__kv_txn_queued(&pool->kv, b))
		bkv__kv_txn_note(&pool->kv, b,
				 (uint64_t)(l + 1) << 52 | (uint64_t)slot << 32 | pos);
}

/* Parent of logical block i in a lane: lane 0's block i - 1. */
static inline int32_t lane_parent(const bkv__seq *s, uint32_t i)
{
	return i ? s->table[i - 1] : -1;
}

/* Does writing at the end of s (len, n_blocks before the append) need a
 * copy-on-write block in lane l? */
static int lane_needs_cow(const bkv_pool *pool, uint32_t l, const bkv__seq *s)
{
	const bkv__lseq *ls = &pool->lanes[l].seqs[s - pool->seqs];
	const bkv__block *k;

	if ((s->len & (pool->kv.bt - 1)) == 0)
		return 0;
	k = &pool->kv.blk[ls->table[s->n_blocks - 1]];
	return k->ref > 1 || BLOCK_IS_INDEXED(k);
}

/* Blocks the lanes take for an append that grows s from its n_blocks (and
 * len) to new_blocks with the lanes' hits up to nb_hit already found:
 * fresh blocks from nb_hit on, plus copy-on-write blocks. */
uint64_t bkv__lanes_need(const bkv_pool *pool, const bkv__seq *s, uint32_t nb_hit,
			 uint32_t new_blocks, uint32_t *cows, uint32_t writes)
{
	uint32_t l;

	*cows = 0;
	if (pool->st_units && !pool->st_share && writes &&
	    !bkv__state_room(pool, s, writes - 1, touch_settles(pool, s)))
		return UINT32_MAX * (uint64_t)2; /* no state unit: no room */
	for (l = 0; l < pool->n_lanes; l++)
		*cows += (uint32_t)lane_needs_cow(pool, l, s);
	return (uint64_t)(new_blocks - nb_hit) * pool->n_lanes + *cows;
}

/* With st_share: the state units an append of s that writes (nonzero)
 * needs, and those its touch's settle frees. */
void bkv__lanes_state_ask(const bkv_pool *pool, const bkv__seq *s, uint32_t writes,
			  uint32_t *need_u, uint32_t *frees)
{
	*need_u = *frees = 0;
	if (writes)
		bkv__state_ask(pool, s, touch_settles(pool, s), need_u, frees);
}

/* Look up lane l's block i of a hit (lane 0's blocks through i - 1 are in
 * s->table, the hit ones stashed past n_blocks). */
static int32_t lane_lookup(const bkv_pool *pool, uint32_t l, const bkv__seq *s, uint32_t i,
			   const int32_t *tokens)
{
	int32_t parent = lane_parent(s, i);
	uint64_t h;

	return bkv__cache_lookup(&pool->kv,
				 parent >= 0 ? pool->kv.blk[parent].hash : BKV__HASH_ROOT, parent,
				 s->key ^ pool->lanes[l].salt, tokens, &h);
}

/* Shorten a hit of lane 0's blocks [nb0, nb0 + hits) (stashed in s->table,
 * tokens the appended tokens from nb0's first position) until every lane
 * holds what a sequence ending there reads next; those lane blocks are
 * stashed in the lanes' tables (not pinned, not visible). Adds to
 * *relinked the lane blocks on the LRU. Returns the hit blocks kept. */
uint32_t bkv__lanes_fit_hits(const bkv_pool *pool, const bkv__seq *s, uint32_t nb0,
			     uint32_t hits, const int32_t *tokens, uint32_t *relinked, uint32_t *units)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs), bt = pool->kv.bt;
	uint32_t e = nb0 + hits, l, i, changed = 1;

	*units = 0;
	while (changed && e > nb0) {
		changed = 0;
		if (pool->st_units) { /* a hit ends at a checkpoint */
			uint32_t f = bkv__state_fit(pool, s, nb0, e, units);

			changed = f != e;
			e = f;
			if (e == nb0)
				break;
		}
		for (l = 0; l < pool->n_lanes && !changed; l++) {
			const bkv__glane *ln = &pool->lanes[l];
			uint32_t first = BKV_MAX(bkv__lane_first(pool, ln, (uint64_t)e * bt), nb0);

			for (i = e; i-- > first;) {
				int32_t c = lane_lookup(pool, l, s, i, tokens + (size_t)(i - nb0) * bt);

				if (c < 0) {
					e = i; /* a hit may end before block i */
					changed = 1;
					break;
				}
				ln->seqs[slot].table[i] = c;
			}
		}
	}
	/* e is final: count the stashed blocks on the LRU, group 0's again
	 * (its lookup counted every hit it found, past e too) */
	*relinked = 0;
	for (i = nb0; i < e; i++)
		*relinked += BLOCK_IS_CACHED(&pool->kv.blk[s->table[i]]);
	for (l = 0; l < pool->n_lanes && e > nb0; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		uint32_t first = BKV_MAX(bkv__lane_first(pool, ln, (uint64_t)e * bt), nb0);

		for (i = first; i < e; i++)
			*relinked += BLOCK_IS_CACHED(&pool->kv.blk[ln->seqs[slot].table[i]]);
	}
	return e - nb0;
}

int32_t bkv__lane_lookup(const bkv_pool *pool, uint32_t l, const bkv__seq *s, uint32_t i,
			 const int32_t *tokens)
{
	return lane_lookup(pool, l, s, i, tokens);
}

void bkv__lane_block_filled(bkv_pool *pool, uint32_t l, uint32_t slot, uint32_t pos)
{
	lane_block_filled(pool, l, slot, pos);
}

/* Pin the lanes' hit blocks for s, whose lane 0 now ends at block e after
 * the hits from nb0 (bkv__lanes_fit_hits stashed them); entries in [nb0, e)
 * below what a sequence ending at e reads are -1 (a gap: see bkv__lseq).
 * With host (the hit goes on in the host cache, bkv__hc_fit_lanes) the
 * host ids stashed are left for bkv__hc_reload_lanes, and the checkpoint
 * is found by the chain hash of lane 0's host block e - 1. */
void bkv__lanes_pin_hits(bkv_pool *pool, const bkv__seq *s, uint32_t nb0, uint32_t e, int host)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l, i;

	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		bkv__lseq *ls = &ln->seqs[slot];
		uint32_t first = bkv__lane_first(pool, ln, (uint64_t)e << pool->kv.bt_shift);

		for (i = nb0; i < e; i++) {
			if (i < first)
				ls->table[i] = -1;
			else if (ls->table[i] >= 0)
				bkv__block_pin(&pool->kv, ls->table[i]);
		}
		/* nothing held below nb0 is released here: a rolled-back step
		 * truncates back to nb0, whose next token reads them; the next
		 * append's trim releases them */
		if (ls->lo == nb0 && first > nb0)
			ls->lo = first;
	}
	if (pool->st_units && host)
		bkv__state_take_at(pool, s, e, pool->hc_hash[s->table[e - 1]]);
	else if (pool->st_units)
		bkv__state_take_hit(pool, s, e);
}

/* Write rem tokens into lane l of s: the last partial block first (copy-on-
 * write if shared or indexed), then fresh blocks. s is lane 0 after its own
 * append (n_blocks final); len0 is the length the tokens start at (after
 * any hits). Room for the blocks and copies is reserved. */
static void lane_append(bkv_pool *pool, uint32_t l, const bkv__seq *s, uint32_t len0,
			const int32_t *tokens, uint32_t rem)
{
	const uint32_t bt = pool->kv.bt, slot = (uint32_t)(s - pool->seqs);
	bkv__lseq *ls = &pool->lanes[l].seqs[slot];
	uint32_t off = len0 & (bt - 1), i = len0 >> pool->kv.bt_shift, w;
	int32_t b;
	bkv__block *k;

	if (off) {
		b = ls->table[i];
		k = &pool->kv.blk[b];
		if (k->ref > 1 || BLOCK_IS_INDEXED(k)) {
			pool->kv.take_group = (uint8_t)pool->lanes[l].group;
			b = bkv__cow_block(pool, b, lane_parent(s, i), off);
			pool->kv.take_group = 0;
			ls->table[i] = b;
			bkv__seq_dirty_lane(ls, i);
		}
		k = &pool->kv.blk[b];
		k->flags &= ~BKV__BLOCK_TXN;
		pool->kv.tokens -= k->fill - off;
		w = BKV_MIN(bt - off, rem);
		memcpy(bkv__tok(&pool->kv, b) + off, tokens, (size_t)w * sizeof(int32_t));
		k->fill = off + w;
		pool->kv.tokens += w;
		if (off + w == bt)
			lane_block_filled(pool, l, slot, i);
		tokens += w;
		rem -= w;
		i++;
	}
	pool->kv.tokens += rem;
	for (; rem; i++) {
		w = BKV_MIN(bt, rem);
		pool->kv.take_group = (uint8_t)pool->lanes[l].group;
		b = bkv__block_take(&pool->kv, lane_parent(s, i));
		pool->kv.take_group = 0;
		memcpy(bkv__tok(&pool->kv, b), tokens, (size_t)w * sizeof(int32_t));
		pool->kv.blk[b].fill = w;
		ls->table[i] = b;
		if (w == bt)
			lane_block_filled(pool, l, slot, i);
		tokens += w;
		rem -= w;
	}
}

void bkv__lanes_commit(bkv_pool *pool, const bkv__seq *s, uint32_t len0, uint32_t hits,
		       uint32_t seen, const int32_t *tokens, uint32_t n)
{
	const uint32_t bt = pool->kv.bt;
	uint32_t l;

	/* the hits are pinned already (bkv__lanes_pin_hits) */
	if (pool->st_units && n > hits * bt)
		bkv__state_write(pool, s);
	if (seen) /* a keep point: where the lookup left lane 0's chain */
		bkv__lanes_seen(pool, s, (len0 >> pool->kv.bt_shift) + seen);
	for (l = 0; l < pool->n_lanes; l++) {
		lane_append(pool, l, s, len0 + hits * bt, tokens + (size_t)hits * bt,
			    n - hits * bt);
		if (n > 1) /* a keep point: a prompt ends (or a chunk of one) */
			pool->lanes[l].seqs[s - pool->seqs].prompt_end =
				(len0 + n) >> pool->kv.bt_shift;
	}
}

void bkv__lanes_seen(bkv_pool *pool, const bkv__seq *s, uint32_t e)
{
	uint32_t l;

	for (l = 0; l < pool->n_lanes; l++)
		pool->lanes[l].seqs[s - pool->seqs].hit_end = e;
}

/* A one-token append that lands inside the last block of every attention
 * group, the common decode case: each group's last block private,
 * unindexed, filled exactly to the token's offset and not filling up with
 * it; with a STATE group (its own units, not shared with attention) a
 * scratch unit for the state it writes. Returns 1 when done, with the
 * general path's effects; 0 (nothing changed) when the general path must
 * decide. */
int bkv__lanes_append1(bkv_pool *pool, bkv__seq *s, int32_t token)
{
	const uint32_t bt = pool->kv.bt, off = s->len & (bt - 1), slot = (uint32_t)(s - pool->seqs);
	const uint32_t last = s->n_blocks - 1;
	bkv__block *k;
	int32_t b;
	uint32_t l;

	if (off == 0 || off + 1 >= bt)
		return 0;
	b = s->table[last];
	k = &pool->kv.blk[b];
	if (k->ref != 1 || k->fill != off || BLOCK_IS_INDEXED(k))
		return 0;
	for (l = 0; l < pool->n_lanes; l++) {
		int32_t lb = pool->lanes[l].seqs[slot].table[last];
		const bkv__block *lk = &pool->kv.blk[lb < 0 ? 0 : lb];

		if (lb < 0 || lk->ref != 1 || lk->fill != off || BLOCK_IS_INDEXED(lk))
			return 0;
	}
	if (pool->st_units && (pool->st_share || !bkv__state_room(pool, s, 0, touch_settles(pool, s))))
		return 0; /* (sharing: the general path counts both sides) */
	if (pool->st_units) {
		bkv__lanes_touch(pool, s); /* settles the last append's state */
		bkv__state_write(pool, s);
	}
	for (l = 0; l < pool->n_lanes; l++) /* a window that moves past a block */
		if (bkv__lane_first(pool, &pool->lanes[l], (uint64_t)s->len + 1) >
		    pool->lanes[l].seqs[slot].lo) {
			bkv__lanes_touch(pool, s); /* trims it, now or at commit */
			break;
		}
	bkv__tok(&pool->kv, b)[off] = token;
	k->fill = off + 1;
	for (l = 0; l < pool->n_lanes; l++) {
		int32_t lb = pool->lanes[l].seqs[slot].table[last];

		bkv__tok(&pool->kv, lb)[off] = token;
		pool->kv.blk[lb].fill = off + 1;
	}
	pool->kv.tokens += 1 + pool->n_lanes;
	pool->miss_tokens++;
	s->len++;
	return 1;
}

/* ---- truncate --------------------------------------------------------------- */

int bkv__lanes_can_truncate(const bkv_pool *pool, const bkv__seq *s, uint32_t new_len)
{
	const uint32_t nbk = bkv__blocks_for(pool, new_len);
	uint32_t l, i;

	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		const bkv__lseq *ls = &ln->seqs[s - pool->seqs];

		if (new_len == 0)
			continue;
		for (i = bkv__lane_first(pool, ln, new_len); i < nbk; i++)
			if (ls->table[i] < 0)
				return 0;
	}
	return 1;
}

/* Cut the lanes of s to nbk blocks and new_len tokens (can_truncate said
 * yes; s->n_blocks is the old count). */
void bkv__lanes_truncate(bkv_pool *pool, const bkv__seq *s, uint32_t nbk, uint32_t new_len)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l, i;

	for (l = pool->n_lanes; l-- > 0;) {
		bkv__lseq *ls = &pool->lanes[l].seqs[slot];

		for (i = s->n_blocks; i-- > BKV_MAX(nbk, ls->lo);) {
			if (ls->table[i] < 0)
				continue;
			bkv__block_put(&pool->kv, ls->table[i], 0);
			ls->table[i] = -1;
		}
		if (new_len == 0) {
			for (i = 0; i < ls->lo && i < s->n_blocks; i++)
				ls->table[i] = -1;
			ls->lo = 0;
		}
		if (ls->lo > nbk) /* a window of 1 at a block boundary */
			ls->lo = nbk;
		if (nbk < ls->clean)
			ls->clean = nbk;
		if (nbk && nbk > ls->lo && ls->table[nbk - 1] >= 0) {
			bkv__block *k = &pool->kv.blk[ls->table[nbk - 1]];
			uint32_t off = new_len - (nbk - 1) * pool->kv.bt;

			if (k->ref == 1 && !BLOCK_IS_INDEXED(k) && k->fill > off) {
				pool->kv.tokens -= k->fill - off;
				k->fill = off;
				k->flags &= ~BKV__BLOCK_TXN;
			}
		}
	}
}

/* ---- the commit's duplicate swap ------------------------------------------- */

int bkv__lanes_dedupe(bkv_pool *pool, uint64_t owner, int32_t b, int32_t d)
{
	uint32_t l = (uint32_t)(owner >> 52) - 1, slot = (uint32_t)(owner >> 32) & 0xFFFFFu,
		 pos = (uint32_t)owner;
	const bkv__seq *s;
	bkv__lseq *ls;

	if (l >= pool->n_lanes || slot >= pool->cfg.max_seqs)
		return 0;
	s = &pool->seqs[slot];
	ls = &pool->lanes[l].seqs[slot];
	if (s->state != BKV__SEQ_OPEN || pos >= s->n_blocks || pos < ls->lo ||
	    ls->table[pos] != b || (s->key ^ pool->lanes[l].salt) != pool->kv.blk[d].key)
		return 0;
	ls->table[pos] = d;
	bkv__seq_dirty_lane(ls, pos);
	return 1;
}

/* Lane 0's block b at pos of slot became d: lane blocks at pos + 1 that
 * named b as parent name d. */
void bkv__lanes_reparent(bkv_pool *pool, uint32_t slot, uint32_t pos, int32_t b, int32_t d)
{
	uint32_t l;

	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__lseq *ls = &pool->lanes[l].seqs[slot];

		if (pos + 1 < pool->seqs[slot].n_blocks && ls->table[pos + 1] >= 0 &&
		    pool->kv.blk[ls->table[pos + 1]].parent == b)
			pool->kv.blk[ls->table[pos + 1]].parent = d;
	}
}

uint32_t bkv__lanes_cows(const bkv_pool *pool, const bkv__seq *s)
{
	uint32_t l, n = 0;

	for (l = 0; l < pool->n_lanes; l++)
		n += (uint32_t)lane_needs_cow(pool, l, s);
	return n;
}

/* ---- the host tier ---------------------------------------------------------- */

/* Swap-out's checks for the lanes of device-resident s: BKV_ESTATE when a
 * held block is in a pending copy; adds the held blocks to *host_need. */
int bkv__lanes_swap_check(const bkv_pool *pool, const bkv__seq *s, int trims, uint32_t *host_need)
{
	const uint32_t pend = BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN;
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l, i, from;

	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		const bkv__lseq *ls = &ln->seqs[slot];

		from = ls->lo; /* after the trim: from what the next token reads */
		if (trims && ln->kind != BKV_GROUP_FULL)
			from = BKV_MAX(from, BKV_MIN(bkv__lane_first(pool, ln, s->len), s->n_blocks));
		for (i = from; i < s->n_blocks; i++) {
			if (ls->table[i] < 0)
				continue;
			if (pool->kv.blk[ls->table[i]].flags & pend)
				return BKV_ESTATE;
			(*host_need)++;
		}
	}
	return BKV_OK;
}

/* Copy every held lane block of s to a host block and release it (room in
 * the host tier and the copy list is reserved). */
void bkv__lanes_swap_out(bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs), bt = pool->kv.bt;
	uint32_t l, i;

	for (l = pool->n_lanes; l-- > 0;) {
		bkv__lseq *ls = &pool->lanes[l].seqs[slot];

		for (i = s->n_blocks; i-- > ls->lo;) {
			int32_t d = ls->table[i], h;

			if (d < 0)
				continue;
			h = bkv__host_pop(pool);
			pool->swap_out_blocks++;
			memcpy(pool->host_tok + (size_t)h * bt, bkv__tok(&pool->kv, d),
			       (size_t)bkv__block_len(pool, s->len, i) * sizeof(int32_t));
			bkv__copy_push(pool, BKV_COPY_SWAP_OUT, d, h);
			bkv__block_put(&pool->kv, d, 0);
			ls->table[i] = h;
		}
		ls->clean = 0;
	}
	if (pool->st_units)
		bkv__state_swap_out(pool, s);
}

/* Device blocks swap-in takes for the lanes of swapped s. */
uint64_t bkv__lanes_swap_in_need(const bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint64_t n = 0;
	uint32_t l;

	uint32_t i;

	if (pool->st_units && !bkv__state_swap_in_room(pool, s))
		return UINT32_MAX * (uint64_t)2; /* no state unit: no room */
	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__lseq *ls = &pool->lanes[l].seqs[slot];

		for (i = ls->lo; i < s->n_blocks; i++)
			n += ls->table[i] >= 0;
	}
	return n;
}

/* Bring the lanes of s back (lane 0 is back: its table holds device ids):
 * fresh device blocks with host->device copies (room reserved). */
void bkv__lanes_swap_in(bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs), bt = pool->kv.bt;
	uint32_t l, i;

	for (l = 0; l < pool->n_lanes; l++) {
		bkv__lseq *ls = &pool->lanes[l].seqs[slot];

		for (i = ls->lo; i < s->n_blocks; i++) {
			int32_t hb = ls->table[i], d;
			uint32_t w = bkv__block_len(pool, s->len, i);

			if (hb < 0)
				continue;
			pool->kv.take_group = (uint8_t)pool->lanes[l].group;
			d = bkv__swap_in_block(pool, hb, lane_parent(s, i), w);
			pool->kv.take_group = 0;
			pool->swap_in_blocks++;
			ls->table[i] = d;
			if (w == bt)
				lane_block_filled(pool, l, slot, i);
		}
		ls->clean = 0;
	}
	if (pool->st_units)
		bkv__state_swap_in(pool, s);
}

/* ---- the checker ------------------------------------------------------------ */

/* The lanes' tables (CHECK_SEQS, CHECK_SEQ_FILL). host 0: device references
 * counted into sc, host references into *host_refs; host 1: references to
 * host blocks counted into sc. */
int bkv__lanes_check(const bkv_pool *pool, uint32_t *sc, uint64_t *host_refs, int host)
{
	uint32_t l, i, j, first;

	for (i = 0; i < pool->cfg.max_seqs; i++) {
		const bkv__seq *s = &pool->seqs[i];

		for (l = 0; l < pool->n_lanes; l++) {
			const bkv__glane *ln = &pool->lanes[l];
			const bkv__lseq *ls = &ln->seqs[i];

			if (s->state == BKV__SEQ_FREE) {
				if (ls->lo || ls->hit_end || ls->prompt_end)
					return CHECK_SEQS;
				continue;
			}
			first = bkv__lane_first(pool, ln, s->len);
			if (ls->lo > s->n_blocks || s->n_blocks > ls->cap || ls->lo > first)
				return CHECK_SEQS;
			for (j = 0; j < ls->lo; j++)
				if (ls->table[j] != -1)
					return CHECK_SEQS;
			for (j = ls->lo; j < s->n_blocks; j++) {
				int32_t b = ls->table[j];

				if (b == -1 && j < first)
					continue; /* released, or a hit's gap */

				if (s->state == BKV__SEQ_SWAPPED) {
					if (b < 0 || (uint32_t)b >= pool->nh)
						return CHECK_SEQS;
					if (host)
						sc[b]++;
					else
						(*host_refs)++;
					continue;
				}
				if (host)
					continue;
				if (b < 0 || (uint32_t)b >= pool->kv.nb)
					return CHECK_SEQS;
				sc[b]++;
				if (pool->kv.blk[b].fill < bkv__block_len(pool, s->len, j))
					return CHECK_SEQ_FILL;
			}
		}
	}
	return CHECK_OK;
}
