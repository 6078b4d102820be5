/*
 * connect.c - what a KV connector (sched/connector.c) needs of a sequence:
 * blocks that a load fills kept out of the prefix cache until the load
 * completes, then offered to it; and the transfer entries that name a
 * range of a sequence's blocks in every KV group.
 *
 * A loading sequence is marked noindex: none of the blocks it fills is
 * offered to the cache (bkv__seq_block_filled, the lanes' block_filled),
 * so no other request can hit KV that is not there yet. The chain rule
 * (a block is indexed only under an indexed parent) then keeps every later
 * block out too. Publishing clears the mark and offers the full blocks
 * from the first loaded one on, group 0's then each lane's, as a fill
 * would; inside a transaction they wait for its commit like any fill.
 *
 * Transfer entries name a block by its own chained hash in its group:
 * group 0's is the KV events' hash; a lane's (a further attention group)
 * is the hash of the same tokens under the lane's salted key, chained to
 * group 0's block before it - exactly the hash the lane's cache uses. A
 * STATE group's live unit is one entry (its frames consecutive) named by
 * the hash of the block it ends.
 */
#include "pool/pool.h"

void bkv__pool_seq_end(bkv_pool *pool, uint32_t seq, int drop, uint32_t keep)
{
	bkv_seq_info si;

	if (drop) {
		bkv_seq_drop(pool, seq);
		return;
	}
	if (keep != UINT32_MAX && bkv_seq_info_get(pool, seq, &si) == BKV_OK && si.len > keep)
		bkv_seq_truncate(pool, seq, keep);
	bkv_seq_close(pool, seq);
}

void bkv__seq_noindex(bkv_pool *pool, uint32_t seq, int on)
{
	bkv__seq *s = bkv__seq_get(pool, seq);

	if (s)
		s->noindex = (uint8_t)(on != 0);
}

int bkv__seq_append_load(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n)
{
	bkv__kv_demote_fn demote = pool->kv.demote;
	int rc;

	bkv__seq_noindex(pool, seq, 1);
	pool->kv.demote = NULL; /* no host-cache copy may read a block the
				   connector writes outside the host's calls */
	rc = bkv__seq_append_private(pool, seq, tokens, n);
	pool->kv.demote = demote;
	if (rc != BKV_OK)
		bkv__seq_noindex(pool, seq, 0);
	else if (pool->n_lanes) /* a window loads only what its next token reads */
		bkv__lanes_trim(pool, bkv__seq_get(pool, seq));
	return rc;
}

int bkv__xfer_copies_touch(const bkv_pool *pool, const bkv_kv_xfer_block *e, uint32_t n)
{
	uint32_t k, i, j;

	for (k = 0; k < 3; k++) {
		const bkv__copy_list *l = &pool->copies[k];

		for (i = 0; i < l->n; i++) {
			int32_t dev[2] = {k == BKV_COPY_SWAP_IN ? -1 : l->v[i].src,
					  k == BKV_COPY_SWAP_OUT ? -1 : l->v[i].dst};

			for (j = 0; j < n; j++)
				if ((dev[0] >= e[j].block && dev[0] < e[j].block + (int32_t)e[j].frames) ||
				    (dev[1] >= e[j].block && dev[1] < e[j].block + (int32_t)e[j].frames))
					return 1;
		}
	}
	return 0;
}

void bkv__seq_publish(bkv_pool *pool, uint32_t seq, uint32_t from)
{
	bkv__seq *s = bkv__seq_get(pool, seq);
	const uint32_t slot = s ? (uint32_t)(s - pool->seqs) : 0;
	uint32_t i, l, full;

	if (!s || s->state != BKV__SEQ_OPEN)
		return;
	s->noindex = 0;
	full = s->len >> pool->kv.bt_shift;
	for (i = from; i < full; i++) {
		const bkv__block *k = &pool->kv.blk[s->table[i]];

		if (!BLOCK_IS_INDEXED(k) && !bkv__kv_txn_queued(&pool->kv, s->table[i]))
			bkv__seq_block_filled(pool, s, i);
		for (l = 0; l < pool->n_lanes; l++) {
			const bkv__lseq *ls = &pool->lanes[l].seqs[slot];

			if (i < ls->lo || ls->table[i] < 0)
				continue;
			if (!BLOCK_IS_INDEXED(&pool->kv.blk[ls->table[i]]) &&
			    !bkv__kv_txn_queued(&pool->kv, ls->table[i]))
				bkv__lane_block_filled(pool, l, slot, i);
		}
	}
}

/* Does the store hold what every group needs of a load of blocks [from,
 * to) (h0[i]: group 0's chained hash of logical block i, from 0)? */
static int end_held(const bkv_pool *pool, uint64_t key, const int32_t *tokens, const uint64_t *h0,
		    uint32_t from, uint32_t to, int (*has)(void *, uint64_t), void *user)
{
	const uint32_t bt = pool->kv.bt;
	uint32_t l, i;

	if (pool->st_units && !has(user, h0[to - 1] ^ pool->st_salt))
		return 0;
	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];

		for (i = BKV_MAX(from, bkv__lane_first(pool, ln, (uint64_t)to * bt)); i < to; i++)
			if (!has(user, bkv__block_hash(pool->kv.hash_seed, i ? h0[i - 1] : BKV__HASH_ROOT,
						       key ^ ln->salt, tokens + (size_t)i * bt, bt)))
				return 0;
	}
	return 1;
}

uint32_t bkv__xfer_fit(const bkv_pool *pool, uint64_t key, const int32_t *tokens, const uint64_t *h0,
		       uint32_t from, uint32_t to, int (*has)(void *, uint64_t), void *user)
{
	const uint32_t step = pool->st_units && pool->st_interval
				      ? BKV_MAX(1u, pool->st_interval >> pool->kv.bt_shift)
				      : 1;

	if (!has || (!pool->n_lanes && !pool->st_units))
		return to;
	for (; to > from; to = to > step ? to - step : 0)
		if (end_held(pool, key, tokens, h0, from, to, has, user))
			return to;
	return from;
}

uint32_t bkv__xfer_ents_max(const bkv_pool *pool, uint32_t nb)
{
	return nb * (1 + pool->n_lanes) + (pool->st_units ? 1 : 0);
}

/* Group 0's chained hash of logical block i-1 (the parent of block i's
 * entries in every group), from the table's indexed blocks or h0. */
static uint64_t parent_hash(const bkv_pool *pool, const bkv__seq *s, uint32_t i, uint32_t from,
			    const uint64_t *h0)
{
	const bkv__block *k;

	if (i == 0)
		return BKV__HASH_ROOT;
	if (h0 && i > from)
		return h0[i - 1 - from];
	k = &pool->kv.blk[s->table[i - 1]];
	return BLOCK_IS_INDEXED(k) ? k->hash : bkv__cache_hash(&pool->kv, s->table[i - 1], s->key);
}

static void ent(bkv_kv_xfer_block *e, uint64_t h, uint32_t i, uint32_t g, int32_t b, uint32_t fr)
{
	e->hash = h;
	e->index = i;
	e->group = g;
	e->block = b;
	e->frames = fr;
}

uint32_t bkv__seq_xfer_ents(const bkv_pool *pool, uint32_t seq, uint32_t from, uint32_t to,
			    const uint64_t *h0, bkv_kv_xfer_block *out, uint32_t cap)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);
	const uint32_t bt = pool->kv.bt;
	uint32_t i, l, n = 0, slot;

	if (!s || to > s->n_blocks)
		return 0;
	slot = (uint32_t)(s - pool->seqs);
	for (i = from; i < to && n < cap; i++)
		ent(&out[n++], h0[i - from], i, 0, s->table[i], 1);
	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		const bkv__lseq *ls = &ln->seqs[slot];

		for (i = from; i < to && n < cap; i++) {
			uint64_t h;

			if (i < ls->lo || ls->table[i] < 0)
				continue;
			h = bkv__block_hash(pool->kv.hash_seed, parent_hash(pool, s, i, from, h0),
					    s->key ^ ln->salt, bkv__tok(&pool->kv, ls->table[i]), bt);
			ent(&out[n++], h, i, ln->group, ls->table[i], 1);
		}
	}
	if (pool->st_units && to > from && n < cap) {
		int32_t in, o;

		bkv__state_frames(pool, slot, &in, &o);
		if (in < 0 || pool->st_len[slot] != s->len)
			return 0; /* no state at the load's end to write into */
		ent(&out[n++], h0[to - 1 - from] ^ pool->st_salt, to - 1, pool->st_group, in,
		    pool->st_frames);
	}
	return n;
}

/* The checkpoint unit of s's state after logical block e - 1, held for a
 * save, as an entry; 0 when there is none. */
static uint32_t save_state(bkv_pool *pool, const bkv__seq *s, uint32_t e, bkv_kv_xfer_block *out)
{
	const bkv__block *k = &pool->kv.blk[s->table[e - 1]];
	int32_t u;

	if (!pool->st_interval || (e << pool->kv.bt_shift) % pool->st_interval ||
	    !BLOCK_IS_INDEXED(k) || (u = bkv__state_find(pool, k->hash)) < 0)
		return 0;
	pool->st_xfer[u]++;
	bkv__state_unit_get(pool, u);
	ent(out, k->hash ^ pool->st_salt, e - 1, pool->st_group,
	    (int32_t)(pool->st_first + (uint32_t)u * pool->st_frames), pool->st_frames);
	return 1;
}

int bkv__pool_xfer_on(bkv_pool *pool)
{
	if (!pool->xfer_ref)
		pool->xfer_ref = bkv__calloc(&pool->alloc, pool->kv.nb, sizeof(uint32_t));
	return pool->xfer_ref ? BKV_OK : BKV_ENOMEM;
}

void bkv__xfer_release(bkv_pool *pool, const bkv_kv_xfer_block *e, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		int32_t u;

		if (e[i].group != 0 && (!pool->st_units || e[i].group != pool->st_group)) {
			BKV_ASSERT(pool->xfer_ref[e[i].block] > 0);
			pool->xfer_ref[e[i].block]--;
			bkv__block_put(&pool->kv, e[i].block, 0);
			continue;
		}
		if (!pool->st_units || e[i].group != pool->st_group)
			continue;
		u = (int32_t)(((uint32_t)e[i].block - pool->st_first) / pool->st_frames);
		BKV_ASSERT(pool->st_xfer[u] > 0);
		pool->st_xfer[u]--;
		bkv__state_unit_put(pool, u);
	}
}

uint32_t bkv__seq_save_ents(bkv_pool *pool, uint32_t seq, uint32_t from, uint32_t *to,
			    bkv_kv_xfer_block *out, uint32_t cap)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);
	uint32_t i, l, n = 0, slot, end;

	if (!s || s->state != BKV__SEQ_OPEN) {
		*to = from;
		return 0;
	}
	end = BKV_MIN(*to, s->n_blocks);
	if (cap)
		end = BKV_MIN(end, from + BKV_MAX(1u, cap / (2 + pool->n_lanes)));
	for (i = from; i < end; i++)
		if (!BLOCK_IS_INDEXED(&pool->kv.blk[s->table[i]]))
			break;
	*to = end = i;
	slot = (uint32_t)(s - pool->seqs);
	for (i = from; i < end && n < cap; i++)
		ent(&out[n++], pool->kv.blk[s->table[i]].hash, i, 0, s->table[i], 1);
	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		const bkv__lseq *ls = &ln->seqs[slot];

		for (i = from; i < end && n < cap; i++) {
			int32_t b = i >= ls->lo ? ls->table[i] : -1;

			if (b < 0 || !BLOCK_IS_INDEXED(&pool->kv.blk[b])) {
				/* released at the commit's trim: cached if a
				 * later hit needs it (a prompt's end) */
				uint64_t h = bkv__block_hash(pool->kv.hash_seed,
							     i ? pool->kv.blk[s->table[i - 1]].hash
							       : BKV__HASH_ROOT,
							     s->key ^ ln->salt,
							     bkv__tok(&pool->kv, s->table[i]), pool->kv.bt);

				b = bkv__index_find(&pool->kv, h);
				if (b < 0)
					continue;
			}
			bkv__block_pin(&pool->kv, b); /* the lane may let it go */
			pool->xfer_ref[b]++;
			ent(&out[n++], pool->kv.blk[b].hash, i, ln->group, b, 1);
		}
	}
	for (i = from + 1; pool->st_units && i <= end && n < cap; i++)
		n += save_state(pool, s, i, &out[n]);
	return n;
}

int bkv__seq_can_cut(const bkv_pool *pool, uint32_t seq, uint32_t len)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);

	if (!s)
		return 0;
	if (pool->st_units && len > 0)
		return 0; /* the state at len is not kept */
	return bkv__lanes_can_truncate(pool, s, len);
}

void bkv__event_external(bkv_pool *pool, uint64_t hash)
{
	bkv__event_host(&pool->kv, BKV_EVENT_STORED, -1, hash, 0, 0, 0);
}
