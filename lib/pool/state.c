/*
 * state.c - a recurrent-state group (Mamba, linear attention): one state
 * per sequence branch, written out of place, and checkpoints in the prefix
 * cache.
 *
 * A STATE group's layers keep a fixed-size state per sequence instead of
 * per-token K/V. Its memory is an arena of state units carved from the
 * device frames at create: unit u is the st_frames consecutive frames from
 * st_first + u * st_frames (above the attention frames, kv.nb), so a state
 * kernel addresses a unit by its first frame as if it were one contiguous
 * state tensor (bkv_pool_config.state_units of them). With state_share the
 * units and the attention blocks share every frame instead: unit u is
 * chunk u of the KV layer's aligned chunks (kv/chunks.c, st_first 0), lent
 * when the group needs a unit and given back when it holds more than its
 * floor (state_units) and one goes free; "sharing frames with attention"
 * below decides between a chunk and a checkpoint, and an append's room
 * counts both sides together.
 *
 * Out of place. A call reads each row's state from its live unit (or from
 * zero at position 0) and writes the new state into the row's scratch
 * unit, never in place: a failed call leaves the live state intact, so a
 * rolled-back step loses nothing, and a live unit can be shared read-only -
 * by forks (no copy), and with the prefix cache. When the step commits,
 * scratch becomes live (bkv__state_txn_end); outside a transaction each
 * append is its own step and commits at once.
 *
 * Checkpoints. With an interval I (the group's span, a multiple of
 * block_tokens), a live state whose length is a multiple of I becomes a
 * checkpoint when its step commits: the unit is indexed under the chain
 * hash of the group-0 block ending there (xor a salt), at no copy. A later
 * sequence with that prefix reads the checkpoint as its live state. The
 * scheduler ends prefill chunks at multiples of I so that the states there
 * exist. A hit of h tokens therefore needs h to be a checkpointed multiple
 * of I (bkv__state_fit shortens hits to one). An unreferenced checkpoint is
 * on the units' LRU and is evicted when a scratch unit is needed.
 *
 * Speculation: a speculated row writes a state after each of its tokens to
 * units of its own (pool/state_spec.c); a truncate to an accepted length
 * makes the one there live.
 *
 * Overlapped scheduling (pool/overlap.c): a step planned while one is in
 * flight promotes that step's scratch (the shift, bkv__state_advance) and
 * writes a second unit; the state the step in flight started from stays in
 * st_undo until that step commits alone (bkv__state_commit_to), so a
 * rollback truncates back through both. Meanwhile no hit replaces a state
 * an outstanding step's rollback needs (bkv__state_hit_ok).
 *
 * Swap moves a live state to st_frames host blocks and back; export names
 * the live unit's first frame and import lists its frames as transfers
 * (pool/image.c).
 */
#include "pool/pool.h"

#include <string.h>

#define ST_INDEXED BKV__ST_INDEXED
#define ST_SCRATCH BKV__ST_SCRATCH

/* ---- create / destroy ------------------------------------------------------- */

/* Frames a STATE group holds at all times: the fixed arena, or with
 * state_share the floor's units (0 without a STATE group). */
uint64_t bkv__state_floor_frames(const bkv_pool_config *c)
{
	uint32_t units = c->state_units || c->state_share ? c->state_units : 2 * c->max_seqs;
	uint32_t k;

	if (c->n_groups < 2 || c->groups[c->n_groups - 1].kind != BKV_GROUP_STATE)
		return 0;
	k = bkv_kv_state_frames(c->groups, c->n_groups, c->block_tokens);
	/* sharing: one chunk past the floor at least */
	return (uint64_t)units * k + (c->state_share ? k : 0);
}

/* Frames the arena takes from device_blocks (0 without a STATE group, and
 * with state_share: the KV layer has every frame). */
uint64_t bkv__state_arena(const bkv_pool_config *c)
{
	return c->state_share ? 0 : bkv__state_floor_frames(c);
}

static void unit_push_free(bkv_pool *pool, int32_t u);
static int32_t ckpt_evict(bkv_pool *pool);

/* Sharing: every frame is chunked and the floor's units are lent now. */
static int share_init(bkv_pool *pool)
{
	pool->st_share = 1;
	pool->st_floor = pool->cfg.state_units;
	pool->st_first = 0;
	if (bkv__ck_init(&pool->kv, &pool->alloc, pool->st_frames, pool->st_floor) != BKV_OK)
		return BKV_ENOMEM;
	pool->st_units = pool->kv.ck_n;
	pool->st_held = pool->st_floor;
	return BKV_OK;
}

int bkv__state_init(bkv_pool *pool)
{
	const bkv_pool_config *c = &pool->cfg;
	const bkv_allocator *a = &pool->alloc;
	uint32_t i, cap = 4;

	if (!bkv__state_floor_frames(c))
		return BKV_OK;
	pool->st_group = c->n_groups - 1;
	pool->st_units = c->state_units ? c->state_units : 2 * c->max_seqs;
	pool->st_frames = bkv_kv_state_frames(c->groups, c->n_groups, c->block_tokens);
	pool->st_first = pool->kv.nb;
	pool->st_held = pool->st_units;
	if (c->state_share && share_init(pool) != BKV_OK)
		return BKV_ENOMEM;
	pool->st_interval = c->groups[pool->st_group].span;
	pool->st_salt = 0xd6e8feb86659fd93ull;
	while (cap < 2 * pool->st_units)
		cap *= 2;
	pool->st_map_mask = cap - 1;
	pool->st_ref = bkv__calloc(a, pool->st_units, sizeof(uint32_t));
	pool->st_xfer = bkv__calloc(a, pool->st_units, sizeof(uint32_t));
	pool->st_flags = bkv__calloc(a, pool->st_units, 1);
	pool->st_hash = bkv__calloc(a, pool->st_units, sizeof(uint64_t));
	pool->st_next = bkv__malloc(a, pool->st_units * sizeof(int32_t));
	pool->st_prev = bkv__malloc(a, pool->st_units * sizeof(int32_t));
	pool->st_map = bkv__malloc(a, (size_t)cap * sizeof(int32_t));
	pool->st_live = bkv__malloc(a, c->max_seqs * sizeof(int32_t));
	pool->st_scratch = bkv__malloc(a, c->max_seqs * sizeof(int32_t));
	pool->st_len = bkv__calloc(a, c->max_seqs, sizeof(uint32_t));
	pool->st_undo = bkv__malloc(a, c->max_seqs * sizeof(int32_t));
	pool->st_undo_len = bkv__calloc(a, c->max_seqs, sizeof(uint32_t));
	pool->st_pend = bkv__malloc(a, c->max_seqs * sizeof(int32_t));
	pool->st_pend_len = bkv__calloc(a, c->max_seqs, sizeof(uint32_t));
	pool->st_host = bkv__malloc(a, (size_t)c->max_seqs * pool->st_frames * sizeof(int32_t));
	pool->st_spec = bkv__malloc(a, c->max_seqs * sizeof(int32_t));
	pool->st_spec_base = bkv__calloc(a, c->max_seqs, sizeof(uint32_t));
	if (!pool->st_spec || !pool->st_spec_base || !pool->st_xfer ||
	    !pool->st_ref || !pool->st_flags || !pool->st_hash || !pool->st_next || !pool->st_prev ||
	    !pool->st_map || !pool->st_live || !pool->st_scratch || !pool->st_len || !pool->st_host ||
	    !pool->st_undo || !pool->st_undo_len || !pool->st_pend || !pool->st_pend_len ||
	    bkv__state_mid_init(pool) != BKV_OK)
		return BKV_ENOMEM;
	for (i = 0; i < pool->st_units; i++) {
		pool->st_next[i] = i + 1 < pool->st_units ? (int32_t)(i + 1) : -1;
		pool->st_prev[i] = -1;
	}
	pool->st_free_head = 0;
	pool->st_nr_free = pool->st_units;
	if (pool->st_share) { /* the floor: the top chunks, lent at create */
		for (i = 0; i < pool->st_units; i++)
			pool->st_next[i] = -1;
		pool->st_free_head = -1;
		pool->st_nr_free = 0;
		for (i = pool->st_units - pool->st_floor; i < pool->st_units; i++)
			unit_push_free(pool, (int32_t)i);
	}
	pool->st_lru_head = pool->st_lru_tail = -1;
	for (i = 0; i <= pool->st_map_mask; i++)
		pool->st_map[i] = -1;
	for (i = 0; i < c->max_seqs; i++) {
		pool->st_live[i] = pool->st_scratch[i] = pool->st_pend[i] = pool->st_spec[i] = -1;
		pool->st_undo[i] = BKV__ST_NO_UNDO;
	}
	return BKV_OK;
}

void bkv__state_bytes(const bkv_pool *pool, uint64_t *slot, uint64_t *units)
{
	*slot = *units = 0;
	if (!pool->st_units)
		return;
	/* st_live, st_scratch, st_len, st_undo, st_undo_len, st_pend,
	 * st_pend_len, st_spec, st_spec_base, and st_host's st_frames host
	 * blocks */
	*slot = 9 * sizeof(int32_t) + (uint64_t)pool->st_frames * sizeof(int32_t) +
		bkv__state_mid_slot_bytes();
	/* st_ref, st_xfer, st_flags, st_hash, st_next, st_prev; st_map */
	*units = (uint64_t)pool->st_units * (2 * sizeof(uint32_t) + 1 + sizeof(uint64_t) +
					     2 * sizeof(int32_t)) +
		 ((uint64_t)pool->st_map_mask + 1) * sizeof(int32_t);
}

void bkv__state_free(bkv_pool *pool)
{
	const bkv_allocator *a = &pool->alloc;
	const size_t u = pool->st_units, ms = pool->cfg.max_seqs;

	if (!u)
		return;
	bkv__free(a, pool->st_ref, u * sizeof(uint32_t));
	bkv__free(a, pool->st_xfer, u * sizeof(uint32_t));
	bkv__free(a, pool->st_flags, u);
	bkv__free(a, pool->st_hash, u * sizeof(uint64_t));
	bkv__free(a, pool->st_next, u * sizeof(int32_t));
	bkv__free(a, pool->st_prev, u * sizeof(int32_t));
	bkv__free(a, pool->st_map, ((size_t)pool->st_map_mask + 1) * sizeof(int32_t));
	bkv__free(a, pool->st_live, ms * sizeof(int32_t));
	bkv__free(a, pool->st_scratch, ms * sizeof(int32_t));
	bkv__free(a, pool->st_len, ms * sizeof(uint32_t));
	bkv__free(a, pool->st_undo, ms * sizeof(int32_t));
	bkv__free(a, pool->st_undo_len, ms * sizeof(uint32_t));
	bkv__free(a, pool->st_pend, ms * sizeof(int32_t));
	bkv__free(a, pool->st_pend_len, ms * sizeof(uint32_t));
	bkv__free(a, pool->st_host, ms * pool->st_frames * sizeof(int32_t));
	bkv__free(a, pool->st_spec, ms * sizeof(int32_t));
	bkv__free(a, pool->st_spec_base, ms * sizeof(uint32_t));
	bkv__state_mid_free(pool);
}

/* ---- units: free list, LRU of checkpoints, the checkpoint map ---------------- */

static void lru_unlink(bkv_pool *pool, int32_t u)
{
	int32_t p = pool->st_prev[u], n = pool->st_next[u];

	if (p >= 0)
		pool->st_next[p] = n;
	else
		pool->st_lru_head = n;
	if (n >= 0)
		pool->st_prev[n] = p;
	else
		pool->st_lru_tail = p;
	pool->st_prev[u] = pool->st_next[u] = -1;
	pool->st_nr_cached--;
}

static void lru_push(bkv_pool *pool, int32_t u)
{
	pool->st_prev[u] = pool->st_lru_tail;
	pool->st_next[u] = -1;
	if (pool->st_lru_tail >= 0)
		pool->st_next[pool->st_lru_tail] = u;
	else
		pool->st_lru_head = u;
	pool->st_lru_tail = u;
	pool->st_nr_cached++;
}

static int32_t map_find(const bkv_pool *pool, uint64_t h)
{
	uint32_t i = (uint32_t)(h ^ (h >> 32)) & pool->st_map_mask;
	int32_t u;

	while ((u = pool->st_map[i]) >= 0) {
		if (pool->st_hash[u] == h)
			return u;
		i = (i + 1) & pool->st_map_mask;
	}
	return -1;
}

static void map_insert(bkv_pool *pool, int32_t u, uint64_t h)
{
	uint32_t i = (uint32_t)(h ^ (h >> 32)) & pool->st_map_mask;

	while (pool->st_map[i] >= 0)
		i = (i + 1) & pool->st_map_mask;
	pool->st_map[i] = u;
	pool->st_hash[u] = h;
	pool->st_flags[u] |= ST_INDEXED;
	pool->st_nr_indexed++;
}

/* Remove unit u (indexed) from the map, shifting back the entries after it
 * that would no longer be found. */
static void map_remove(bkv_pool *pool, int32_t u)
{
	const uint32_t m = pool->st_map_mask;
	uint32_t i = (uint32_t)(pool->st_hash[u] ^ (pool->st_hash[u] >> 32)) & m, j, home;

	while (pool->st_map[i] != u)
		i = (i + 1) & m;
	pool->st_map[i] = -1;
	for (j = (i + 1) & m; pool->st_map[j] >= 0; j = (j + 1) & m) {
		uint64_t h = pool->st_hash[pool->st_map[j]];

		home = (uint32_t)(h ^ (h >> 32)) & m;
		/* move j's entry into the hole at i unless its home lies in (i, j] */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			pool->st_map[i] = pool->st_map[j];
			pool->st_map[j] = -1;
			i = j;
		}
	}
	pool->st_flags[u] &= (uint8_t)~ST_INDEXED;
	pool->st_nr_indexed--;
}

/* Units an append may take: free ones and unreferenced checkpoints. */
static uint32_t units_available(const bkv_pool *pool)
{
	return pool->st_nr_free + pool->st_nr_cached;
}

/* A unit for a scratch state: the free list, else the oldest unreferenced
 * checkpoint (one exists: units_available said so). */
static int32_t unit_take(bkv_pool *pool)
{
	int32_t u = pool->st_free_head;

	if (u >= 0) {
		pool->st_free_head = pool->st_next[u];
		pool->st_nr_free--;
	} else {
		u = ckpt_evict(pool);
	}
	pool->st_next[u] = pool->st_prev[u] = -1;
	pool->st_flags[u] = ST_SCRATCH;
	return u;
}

static void unit_push_free(bkv_pool *pool, int32_t u)
{
	pool->st_flags[u] = 0;
	pool->st_next[u] = pool->st_free_head;
	pool->st_prev[u] = -1;
	pool->st_free_head = u;
	pool->st_nr_free++;
}

/* Sharing: unit u (no reference, on no list) goes back to attention. */
static void unit_return(bkv_pool *pool, int32_t u)
{
	pool->st_flags[u] = 0;
	pool->st_ref[u] = 0;
	pool->st_next[u] = pool->st_prev[u] = -1;
	pool->st_held--;
	bkv__ck_return(&pool->kv, u);
}

/* Sharing: idle chunk c becomes a free unit. */
static void unit_gain(bkv_pool *pool, int32_t c)
{
	bkv__ck_lend(&pool->kv, c);
	pool->st_held++;
	pool->st_ref[c] = 0;
	unit_push_free(pool, c);
}

/* A unit nothing holds: free, or with sharing above the floor back to
 * attention. */
static void unit_free(bkv_pool *pool, int32_t u)
{
	if (pool->st_share && pool->st_held > pool->st_floor)
		unit_return(pool, u);
	else
		unit_push_free(pool, u);
}

/* The oldest unreferenced checkpoint leaves the map and the LRU (one
 * exists); returns it, on no list. */
static int32_t ckpt_evict(bkv_pool *pool)
{
	int32_t u = pool->st_lru_head;

	BKV_ASSERT(u >= 0);
	lru_unlink(pool, u);
	map_remove(pool, u);
	pool->st_evictions++;
	return u;
}

/* bkv_pool_reset_cache: every checkpoint leaves the map (a later sequence
 * must not start from a state the reset disowned); the unreferenced ones
 * are freed, a referenced one stays its holder's live state. O(units): not
 * on the step's path. */
void bkv__state_reset_cache(bkv_pool *pool)
{
	int32_t u;

	while (pool->st_lru_head >= 0)
		unit_free(pool, ckpt_evict(pool));
	for (u = 0; (uint32_t)u < pool->st_units; u++)
		if (pool->st_flags[u] & ST_INDEXED)
			map_remove(pool, u);
}

/* ---- sharing frames with attention (kv/chunks.c) ---------------------------- */

uint32_t bkv__state_spare(const bkv_pool *pool)
{
	if (!pool->st_share)
		return 0;
	return BKV_MIN(pool->st_nr_cached, pool->st_held - pool->st_floor) * pool->st_frames;
}

/* Mirrors bkv__state_share_prepare unit by unit: a chunk when attention
 * can spare its frames and one is idle (the hits may pin relinked of the
 * idle ones), else a checkpoint; then the checkpoints left above the floor
 * give attention what it lacks. */
int bkv__state_share_fits(const bkv_pool *pool, int64_t slack, uint32_t relinked, uint32_t taken,
			  uint32_t need_u, uint32_t frees)
{
	const int64_t k = pool->st_frames;
	const uint32_t own = pool->st_nr_free + frees;
	uint32_t su = need_u > own ? need_u - own : 0;
	uint32_t c = pool->st_nr_cached > taken ? pool->st_nr_cached - taken : 0;
	uint32_t idle = pool->kv.nr_idle > relinked ? pool->kv.nr_idle - relinked : 0;
	uint64_t above = pool->st_held - pool->st_floor, conv;

	for (; su; su--) {
		if (slack >= k && idle) {
			slack -= k;
			idle--;
			above++;
		} else if (c) {
			c--;
		} else {
			return 0;
		}
	}
	if (slack >= 0)
		return 1;
	conv = (uint64_t)((-slack + k - 1) / k);
	return conv <= c && conv <= above;
}

void bkv__state_share_prepare(bkv_pool *pool, uint32_t need_att, uint32_t need_u)
{
	bkv__kv *kv = &pool->kv;
	const int64_t k = pool->st_frames;

	while (pool->st_nr_free < need_u) {
		int64_t slack = (int64_t)kv->nr_free + kv->nr_cached - need_att;
		int32_t c = slack >= k ? bkv__ck_pick(kv, 1) : -1;

		if (c >= 0) {
			unit_gain(pool, c); /* free frames: no cache lost */
		} else if (pool->st_nr_cached) {
			unit_push_free(pool, ckpt_evict(pool));
		} else {
			c = bkv__ck_pick(kv, 0);
			BKV_ASSERT(c >= 0 && slack >= k);
			unit_gain(pool, c);
		}
	}
	while ((uint64_t)kv->nr_free + kv->nr_cached < need_att) {
		BKV_ASSERT(pool->st_nr_cached && pool->st_held > pool->st_floor);
		unit_return(pool, ckpt_evict(pool));
	}
}

/* A live reference to u went: at zero a checkpoint goes on the LRU, any
 * other unit to the free list. */
void bkv__state_unit_put(bkv_pool *pool, int32_t u)
{
	BKV_ASSERT(pool->st_ref[u] > 0);
	if (--pool->st_ref[u])
		return;
	if (pool->st_flags[u] & ST_INDEXED)
		lru_push(pool, u);
	else
		unit_free(pool, u);
}

void bkv__state_unit_get(bkv_pool *pool, int32_t u)
{
	if (pool->st_ref[u]++ == 0 && (pool->st_flags[u] & ST_INDEXED))
		lru_unlink(pool, u);
}

/* Units for speculation's per-token states (pool/state_spec.c). */
int32_t bkv__state_unit_take(bkv_pool *pool)
{
	return unit_take(pool);
}

void bkv__state_unit_gain(bkv_pool *pool, int32_t c)
{
	unit_gain(pool, c);
}

/* ---- sequences -------------------------------------------------------------- */

void bkv__state_open(bkv_pool *pool, uint32_t slot)
{
	pool->st_live[slot] = pool->st_scratch[slot] = -1;
	pool->st_len[slot] = 0;
	pool->st_undo[slot] = BKV__ST_NO_UNDO;
	pool->st_pend[slot] = pool->st_spec[slot] = -1;
}

static void mid_truncate(bkv_pool *pool, uint32_t slot, uint32_t new_len);

static void pend_drop(bkv_pool *pool, uint32_t slot)
{
	if (pool->st_pend[slot] >= 0)
		bkv__state_unit_put(pool, pool->st_pend[slot]);
	pool->st_pend[slot] = -1;
}

/* Speculation (pool/state_spec.c): the chain's unit covering len tokens
 * of s (-1: none) and the link naming it (link may be NULL). */
static int32_t spec_find(const bkv_pool *pool, const bkv__seq *s, uint32_t len, int32_t **link)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	int32_t *l = &pool->st_spec[slot];
	uint32_t j;

	if (*l < 0 || len < pool->st_spec_base[slot] || len >= s->len)
		return -1;
	for (j = pool->st_spec_base[slot]; *l >= 0 && j < len; j++)
		l = &pool->st_next[*l];
	if (link)
		*link = l;
	return *l;
}

/* A speculated row's per-token states that were not kept go. */
static void spec_drop(bkv_pool *pool, uint32_t slot)
{
	int32_t u = pool->st_spec[slot];

	while (u >= 0) {
		const int32_t n = pool->st_next[u];

		pool->st_next[u] = -1;
		unit_free(pool, u);
		u = n;
	}
	pool->st_spec[slot] = -1;
}

/* The step that took a hit is over (committed, or its rollback is done):
 * the replaced state goes. */
static void undo_drop(bkv_pool *pool, uint32_t slot)
{
	if (pool->st_undo[slot] >= 0)
		bkv__state_unit_put(pool, pool->st_undo[slot]);
	pool->st_undo[slot] = BKV__ST_NO_UNDO;
}

void bkv__state_release(bkv_pool *pool, uint32_t slot, int swapped)
{
	uint32_t j;

	if (swapped && pool->st_len[slot])
		for (j = 0; j < pool->st_frames; j++)
			bkv__host_push(pool, pool->st_host[(size_t)slot * pool->st_frames + j]);
	if (pool->st_live[slot] >= 0)
		bkv__state_unit_put(pool, pool->st_live[slot]);
	if (pool->st_scratch[slot] >= 0)
		unit_free(pool, pool->st_scratch[slot]);
	undo_drop(pool, slot);
	pend_drop(pool, slot);
	spec_drop(pool, slot);
	if (pool->st_mid_n[slot])
		mid_truncate(pool, slot, 0);
	bkv__state_open(pool, slot);
}

/* A fork shares the parent's live state (read-only: calls write scratch
 * units). BKV_ESTATE while the parent has an append its step has not
 * committed (its state lags its tokens). */
void bkv__state_begin(bkv_pool *pool, const bkv__seq *s)
{
	bkv__state_commit(pool, s);
	undo_drop(pool, (uint32_t)(s - pool->seqs));
}

void bkv__state_settle(bkv_pool *pool, const bkv__seq *s)
{
	if (!pool->kv.txn_active) {
		bkv__state_commit(pool, s);
		undo_drop(pool, (uint32_t)(s - pool->seqs));
	}
}

int bkv__state_can_fork(const bkv_pool *pool, const bkv__seq *s)
{
	return pool->st_len[s - pool->seqs] == s->len ? BKV_OK : BKV_ESTATE;
}

void bkv__state_fork(bkv_pool *pool, uint32_t p, uint32_t c)
{
	bkv__state_open(pool, c);
	pool->st_live[c] = pool->st_live[p];
	pool->st_scratch[c] = -1;
	pool->st_len[c] = pool->st_len[p];
	if (pool->st_live[c] >= 0)
		bkv__state_unit_get(pool, pool->st_live[c]);
}

/* Units an append of new tokens to s needs: its scratch, unless it has one. */
uint32_t bkv__state_need(const bkv_pool *pool, const bkv__seq *s)
{
	return pool->st_scratch[s - pool->seqs] < 0;
}

/* What bkv__state_begin(s) would do to the room, without doing it: the
 * units it would make available (each last reference it drops; a cached
 * checkpoint is available too) and s's need after it. Mirrors
 * bkv__state_commit, promote and undo_drop. */
static uint32_t settle_frees(const bkv_pool *pool, const bkv__seq *s, uint32_t *need)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	const int txn = pool->kv.txn_active;
	int32_t scratch = pool->st_scratch[slot], undo = pool->st_undo[slot];
	int32_t pend = pool->st_pend[slot], put[3];
	uint32_t n = 0, i, j, frees = 0;

	if (s->state == BKV__SEQ_OPEN) {
		if (scratch >= 0 && pool->st_len[slot] != s->len) { /* promote */
			const int32_t old = pool->st_live[slot];
			const uint32_t old_len = pool->st_len[slot];

			if (txn && undo == BKV__ST_NO_UNDO)
				undo = old;
			else if (old >= 0 && txn && pool->st_fenced)
				; /* kept (bkv__state_mid_push) */
			else if (old >= 0 && txn && pool->st_interval && old_len &&
				 old_len % pool->st_interval == 0 && pend < 0)
				pend = old;
			else if (old >= 0)
				put[n++] = old;
			scratch = -1;
		}
		if (!txn && pend >= 0)
			put[n++] = pend;
	}
	if (undo >= 0)
		put[n++] = undo;
	*need = scratch < 0;
	for (i = 0; i < n; i++) { /* each unit once: freed if every reference goes */
		uint32_t times = 0, seen = 0;

		for (j = 0; j < n; j++) {
			times += put[j] == put[i];
			seen += j < i && put[j] == put[i];
		}
		frees += !seen && pool->st_ref[put[i]] <= times;
	}
	return frees;
}

void bkv__state_ask(const bkv_pool *pool, const bkv__seq *s, int settles, uint32_t *need_u,
		    uint32_t *frees)
{
	*need_u = bkv__state_need(pool, s);
	*frees = settles ? settle_frees(pool, s, need_u) : 0;
}

int bkv__state_room(const bkv_pool *pool, const bkv__seq *s, uint32_t taken, int settles)
{
	uint32_t need = bkv__state_need(pool, s), frees = 0;

	if (taken + 1 <= units_available(pool))
		return 1; /* room for a scratch unit whatever the settle does: it
			     frees units, and needs at most that one */
	if (settles)
		frees = settle_frees(pool, s, &need);
	return need + taken <= units_available(pool) + frees;
}

/* The append writes new tokens: make sure s has a scratch unit (room was
 * checked). */
void bkv__state_write(bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);

	if (pool->st_scratch[slot] < 0)
		pool->st_scratch[slot] = unit_take(pool);
}

/* The longest hit end e' in (nb0, e] whose position is a checkpoint (the
 * stashed group-0 blocks name it), or nb0. *units_relinked counts a cached
 * checkpoint taken off the LRU. */
uint32_t bkv__state_fit(const bkv_pool *pool, const bkv__seq *s, uint32_t nb0, uint32_t e,
			uint32_t *units_relinked)
{
	const uint32_t shift = pool->kv.bt_shift;
	uint32_t i;

	*units_relinked = 0;
	if (!pool->st_interval || !pool->kv.index || !bkv__state_hit_ok(pool, s))
		return nb0;
	for (i = e; i > nb0; i--) { /* the checkpoint after block i - 1, if any */
		const bkv__block *k;
		int32_t u;

		if (((uint64_t)i << shift) % pool->st_interval)
			continue;
		k = &pool->kv.blk[s->table[i - 1]];
		u = BLOCK_IS_INDEXED(k) ? bkv__state_find(pool, k->hash) : -1;
		if (u >= 0) {
			*units_relinked = pool->st_ref[u] == 0;
			return i;
		}
	}
	return nb0;
}

/* s's hit ends at block e (group 0's table is final there): its live state
 * is the checkpoint at e * block_tokens (bkv__state_fit found it). */
void bkv__state_take_hit(bkv_pool *pool, const bkv__seq *s, uint32_t e)
{
	bkv__state_take_at(pool, s, e, pool->kv.blk[s->table[e - 1]].hash);
}

int32_t bkv__state_find(const bkv_pool *pool, uint64_t hash)
{
	return pool->st_interval ? map_find(pool, hash ^ pool->st_salt) : -1;
}

void bkv__state_take_at(bkv_pool *pool, const bkv__seq *s, uint32_t e, uint64_t hash)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	int32_t u = bkv__state_find(pool, hash);

	BKV_ASSERT(u >= 0);
	bkv__state_unit_get(pool, u);
	if (pool->kv.txn_active && pool->st_undo[slot] == BKV__ST_NO_UNDO) {
		/* keep the state replaced until the step is over */
		pool->st_undo[slot] = pool->st_live[slot];
		pool->st_undo_len[slot] = pool->st_len[slot];
	} else if (pool->st_live[slot] >= 0) {
		bkv__state_unit_put(pool, pool->st_live[slot]);
	}
	pool->st_live[slot] = u;
	pool->st_len[slot] = e << pool->kv.bt_shift;
	pool->st_ckpt_hits++;
}

/* Make s's scratch state its live state, now covering end tokens. Inside a
 * step the state the step started from is kept (st_undo) and a superseded
 * state at a multiple of the interval is held for commit (st_pend). */
static void promote(bkv_pool *pool, uint32_t slot, uint32_t end)
{
	const int32_t u = pool->st_scratch[slot], old = pool->st_live[slot];
	const uint32_t old_len = pool->st_len[slot];

	if (pool->kv.txn_active && pool->st_undo[slot] == BKV__ST_NO_UNDO) {
		pool->st_undo[slot] = old; /* its reference moves there */
		pool->st_undo_len[slot] = old_len;
	} else if (old >= 0 && pool->kv.txn_active && pool->st_fenced) {
		/* the end of an outstanding step a later one builds on: kept
		 * until the oldest commits past it (pool/state_mid.c) */
		bkv__state_mid_push(pool, slot, old, old_len);
	} else if (old >= 0) {
		if (pool->kv.txn_active && pool->st_interval && old_len &&
		    old_len % pool->st_interval == 0 && pool->st_pend[slot] < 0) {
			pool->st_pend[slot] = old;
			pool->st_pend_len[slot] = old_len;
		} else {
			bkv__state_unit_put(pool, old);
		}
	}
	pool->st_flags[u] = 0;
	pool->st_ref[u] = 1;
	pool->st_live[slot] = u;
	pool->st_scratch[slot] = -1;
	pool->st_len[slot] = end;
}

void bkv__state_advance(bkv_pool *pool, const bkv__seq *s, uint32_t end)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);

	if (pool->st_scratch[slot] >= 0 && pool->st_len[slot] < end && end <= s->len)
		promote(pool, slot, end);
}

/* Index unit u, covering len tokens of s, as a checkpoint when len is a
 * multiple of the interval and the group-0 block ending there is indexed. */
static void checkpoint(bkv_pool *pool, const bkv__seq *s, int32_t u, uint32_t len)
{
	const bkv__block *k;
	uint64_t h;

	if (u < 0 || !pool->st_interval || !pool->kv.index || !len || len % pool->st_interval ||
	    (pool->st_flags[u] & ST_INDEXED))
		return;
	k = &pool->kv.blk[s->table[(len >> pool->kv.bt_shift) - 1]];
	if (!BLOCK_IS_INDEXED(k))
		return; /* the prefix is not in the cache (a duplicate, or later) */
	h = k->hash ^ pool->st_salt;
	if (map_find(pool, h) >= 0)
		return;
	map_insert(pool, u, h);
	pool->st_ckpts++;
}

/* Deeper overlap (pool/state_mid.c): the oldest step committed s's first
 * len tokens; the kept states up to len go (checkpoints where they may be),
 * the one at len becomes the base a rollback goes back to. */
static void mid_commit(bkv_pool *pool, const bkv__seq *s, uint32_t len)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t ul;
	int32_t u;

	while (bkv__state_mid_first(pool, slot, len, &u, &ul)) {
		checkpoint(pool, s, u, ul);
		if (ul < len) {
			bkv__state_unit_put(pool, u);
			continue;
		}
		if (pool->st_undo[slot] >= 0)
			bkv__state_unit_put(pool, pool->st_undo[slot]);
		pool->st_undo[slot] = u; /* its reference moves there */
		pool->st_undo_len[slot] = len;
	}
}

/* A truncate to new_len below the live state: the kept states past it go,
 * and one kept at new_len is live again. */
static void mid_truncate(bkv_pool *pool, uint32_t slot, uint32_t new_len)
{
	uint32_t ul;
	int32_t u;

	while (bkv__state_mid_last(pool, slot, new_len, &u, &ul))
		bkv__state_unit_put(pool, u);
	if (bkv__state_mid_last(pool, slot, new_len - 1, &u, &ul)) { /* at new_len */
		if (pool->st_live[slot] >= 0)
			bkv__state_unit_put(pool, pool->st_live[slot]);
		pool->st_live[slot] = u;
		pool->st_len[slot] = new_len;
	}
}

/* s's step committed: what it computed is live, and live states at a
 * multiple of the interval become checkpoints. An append outside a
 * transaction is committed lazily, by the next operation on the sequence
 * that needs its state (an append, a fork, a swap-out: bkv__state_begin,
 * bkv__state_settle), so that the host can read the units it must compute
 * with (bkv__state_frames) after the append. */
void bkv__state_commit(bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);

	if (s->state != BKV__SEQ_OPEN)
		return;
	if (pool->st_scratch[slot] >= 0 && pool->st_len[slot] != s->len)
		promote(pool, slot, s->len);
	if (pool->kv.txn_active)
		return;
	if (pool->st_mid_n[slot]) /* a whole commit passes every kept one */
		mid_commit(pool, s, pool->st_len[slot]);
	spec_drop(pool, slot); /* every draft accepted: the scratch's state */
	if (pool->st_pend[slot] >= 0) {
		checkpoint(pool, s, pool->st_pend[slot], pool->st_pend_len[slot]);
		pend_drop(pool, slot); /* cached on the LRU if indexed */
	}
	checkpoint(pool, s, pool->st_live[slot], pool->st_len[slot]);
	undo_drop(pool, slot); /* the step is over */
}

/* May a prefix hit replace s's state? Not while a step is planned on one in
 * flight (overlapped scheduling) and s keeps the state an outstanding step
 * started from: its live state is then one a rollback of the later step
 * needs back. */
int bkv__state_hit_ok(const bkv_pool *pool, const bkv__seq *s)
{
	return !pool->st_fenced || pool->st_undo[s - pool->seqs] == BKV__ST_NO_UNDO;
}

/* Overlapped scheduling: the older of two outstanding steps committed, and
 * s's first len tokens with it; the later step stays open. Its state at
 * len is live (a pending scratch of the older step's is promoted), the
 * state the older step started from is dropped (a rollback of the later
 * step goes back to len, the live one), and states at multiples of the
 * interval become checkpoints as at a whole commit. A scratch covering
 * more than len is the later step's and stays pending. */
void bkv__state_commit_to(bkv_pool *pool, const bkv__seq *s, uint32_t len)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);

	if (s->state != BKV__SEQ_OPEN || len > s->len)
		return;
	if (pool->st_scratch[slot] >= 0 && pool->st_len[slot] < len)
		promote(pool, slot, len);
	if (pool->st_mid_n[slot]) /* deeper overlap: the kept ones */
		mid_commit(pool, s, len);
	if (pool->st_len[slot] != len)
		return; /* the live state is a later step's */
	if (pool->st_spec[slot] >= 0 && pool->st_spec_base[slot] <= len)
		spec_drop(pool, slot); /* the older step's drafts are settled */
	if (pool->st_pend[slot] >= 0) {
		checkpoint(pool, s, pool->st_pend[slot], pool->st_pend_len[slot]);
		pend_drop(pool, slot);
	}
	checkpoint(pool, s, pool->st_live[slot], len);
	undo_drop(pool, slot);
}

/* Truncate: the state exists only at its own length. */
int bkv__state_can_truncate(const bkv_pool *pool, const bkv__seq *s, uint32_t new_len)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);

	return new_len == 0 || new_len == s->len || new_len == pool->st_len[slot] ||
	       (pool->st_undo[slot] != BKV__ST_NO_UNDO && new_len == pool->st_undo_len[slot]) ||
	       bkv__state_mid_has(pool, slot, new_len) || spec_find(pool, s, new_len, NULL) >= 0;
}

void bkv__state_truncate(bkv_pool *pool, const bkv__seq *s, uint32_t new_len)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	int32_t *link, u = spec_find(pool, s, new_len, &link);

	if (u >= 0) { /* a speculated row's commit: the state after its last
		       * delivered token is live, not the one after its drafts */
		*link = pool->st_next[u];
		pool->st_next[u] = -1;
		if (pool->st_scratch[slot] >= 0)
			promote(pool, slot, s->len);
		bkv__state_unit_put(pool, pool->st_live[slot]);
		pool->st_flags[u] = 0;
		pool->st_ref[u] = 1;
		pool->st_live[slot] = u;
		pool->st_len[slot] = new_len;
	}

	if (pool->st_mid_n[slot] && new_len < pool->st_len[slot])
		mid_truncate(pool, slot, new_len); /* deeper overlap */
	if (pool->st_undo[slot] != BKV__ST_NO_UNDO && new_len == pool->st_undo_len[slot] &&
	    new_len != pool->st_len[slot]) {
		/* a rolled-back step: the state it started from is live again */
		if (pool->st_live[slot] >= 0)
			bkv__state_unit_put(pool, pool->st_live[slot]);
		pool->st_live[slot] = pool->st_undo[slot];
		pool->st_len[slot] = new_len;
		pool->st_undo[slot] = BKV__ST_NO_UNDO;
		pend_drop(pool, slot);
	}
	if (new_len == 0) {
		if (pool->st_live[slot] >= 0)
			bkv__state_unit_put(pool, pool->st_live[slot]);
		pool->st_live[slot] = -1;
		pool->st_len[slot] = 0;
		undo_drop(pool, slot);
	}
	if (new_len == pool->st_len[slot] && pool->st_scratch[slot] >= 0) {
		/* a rolled-back append: nothing pending */
		unit_free(pool, pool->st_scratch[slot]);
		pool->st_scratch[slot] = -1;
	}
	spec_drop(pool, slot); /* the row's speculation is settled */
}

/* ---- the host tier ---------------------------------------------------------- */

void bkv__state_swap_out(bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs), k = pool->st_frames;
	int32_t u = pool->st_live[slot];
	uint32_t j;

	if (pool->st_scratch[slot] >= 0)
		unit_free(pool, pool->st_scratch[slot]);
	pool->st_scratch[slot] = -1;
	spec_drop(pool, slot);
	if (u < 0)
		return;
	for (j = 0; j < k; j++) {
		int32_t h = bkv__host_pop(pool);

		bkv__copy_push(pool, BKV_COPY_SWAP_OUT, (int32_t)(pool->st_first + (uint32_t)u * k + j),
			       h);
		pool->st_host[(size_t)slot * k + j] = h;
	}
	pool->swap_out_blocks += k;
	bkv__state_unit_put(pool, u);
	pool->st_live[slot] = -1;
}

/* Swap-in needs a unit for a live state. */
int bkv__state_swap_in_room(const bkv_pool *pool, const bkv__seq *s)
{
	if (pool->st_share) /* counted with the blocks (bkv__state_share_fits) */
		return 1;
	return pool->st_len[s - pool->seqs] == 0 || units_available(pool) >= 1;
}

void bkv__state_swap_in(bkv_pool *pool, const bkv__seq *s)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs), k = pool->st_frames;
	int32_t u;
	uint32_t j;

	if (pool->st_len[slot] == 0)
		return;
	u = unit_take(pool);
	pool->st_flags[u] = BKV__ST_SWAPIN;
	pool->st_ref[u] = 1;
	pool->st_live[slot] = u;
	for (j = 0; j < k; j++) {
		int32_t h = pool->st_host[(size_t)slot * k + j];

		const int32_t f = (int32_t)(pool->st_first + (uint32_t)u * k + j);

		bkv__copy_push(pool, BKV_COPY_SWAP_IN, h, f);
		if (pool->st_share) /* a KV frame: flagged like a block's copy */
			pool->kv.blk[f].flags |= BKV__BLOCK_PEND_SWAPIN;
		pool->host_state[h] = BKV__HOST_PENDING;
		pool->host_pending++;
	}
	pool->swap_in_blocks += k;
}
