/*
 * swap.c - the host (swap) tier: moving a sequence's blocks to host blocks
 * and back.
 *
 * Swap-out gives each table entry a free host block, copies the tokens to
 * the host token store, records device->host copies and releases the device
 * blocks by close's rule; the table then holds host ids. Swap-in first
 * re-finds leading full blocks in the prefix cache (shared again, no copy),
 * then takes device blocks for the rest with host->device copies. The host
 * blocks those copies read stay "pending" (not reusable) until the host
 * clears the swap-in copies (pool/pool.c).
 *
 * Copy lists are performed by the host in the order swap_out, swap_in,
 * device. That order is correct as long as, between two clears, no block
 * written or read by a pending copy is read by a later copy of an earlier
 * list; the pool enforces it: swap-out refuses (BKV_ESTATE) a sequence with a
 * block that is the source or destination of a pending device copy or the
 * destination of a pending swap-in copy, and swap-in refuses while device
 * copies are pending.
 */
#include "pool/pool.h"

#include <string.h>



int bkv_seq_swap_out(bkv_pool *pool, uint32_t seq)
{
	const uint32_t pend = BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN;
	bkv__copy_list *l;
	bkv__seq *s;
	uint32_t i, first, host_need;
	int trims;

	if (!pool)
		return BKV_EINVAL;
	s = bkv__seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	if (s->state == BKV__SEQ_SWAPPED || pool->nh == 0)
		return BKV_ESTATE;
	for (i = 0; i < s->n_blocks; i++)
		if (pool->kv.blk[s->table[i]].flags & pend)
			return BKV_ESTATE;
	host_need = s->n_blocks;
	/* A grouped sequence first settles its last append (its state) and,
	 * when that append's KV is computed, trims what no token reads again:
	 * counted here as if done, done only once nothing can refuse, so that
	 * a refused swap-out changes nothing. */
	trims = pool->grouped && !bkv__lanes_touched(pool, s);
	if (pool->grouped) {
		if (pool->st_units && bkv__state_swap_check(pool, s, &host_need))
			return BKV_ESTATE;
		if (bkv__lanes_swap_check(pool, s, trims, &host_need))
			return BKV_ESTATE;
	}
	if (host_need > bkv__pool_host_room(pool)) /* the host cache gives way */
		return BKV_ENOSPC;
	if (bkv__copies_reserve(pool, BKV_COPY_SWAP_OUT, host_need))
		return BKV_ENOMEM;
	if (pool->grouped) {
		if (pool->st_units)
			bkv__state_settle(pool, s);
		if (trims)
			bkv__lanes_trim(pool, s);
		bkv__lanes_swap_out(pool, s); /* and a STATE group's state */
	}

	l = &pool->copies[BKV_COPY_SWAP_OUT];
	first = l->n;
	for (i = 0; i < s->n_blocks; i++) {
		int32_t d = s->table[i], h = bkv__host_pop(pool);

		memcpy(pool->host_tok + (size_t)h * pool->kv.bt, bkv__tok(&pool->kv, d),
		       (size_t)bkv__block_len(pool, s->len, i) * sizeof(int32_t));
		bkv__copy_push(pool, BKV_COPY_SWAP_OUT, d, h);
	}
	for (i = s->n_blocks; i-- > 0;) {
		bkv__block_put(&pool->kv, s->table[i], 0);
		s->table[i] = l->v[first + i].dst;
	}
	pool->swap_out_blocks += s->n_blocks;
	s->state = BKV__SEQ_SWAPPED;
	s->clean = 0; /* host ids now, new device ids at swap-in */
	s->uncached = 0; /* swap-in indexes its full blocks */
	pool->nr_swapped++;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}


/* Room for a swap-in's need blocks (its hits relink relinked cached ones)
 * and, with a shared STATE group, its state's unit beside them. */
static int swap_in_fits(const bkv_pool *pool, const bkv__seq *s, uint64_t need, uint32_t relinked)
{
	uint64_t room = (uint64_t)pool->kv.nr_free + pool->kv.nr_cached - relinked;

	if (!pool->st_share)
		return need <= room;
	return bkv__state_share_fits(pool, (int64_t)room - (int64_t)need, relinked, 0,
				     pool->st_len[s - pool->seqs] != 0, 0);
}

int bkv_seq_swap_in(bkv_pool *pool, uint32_t seq)
{
	uint32_t bt, i, n_full, hits = 0, relinked = 0;
	uint64_t ph = BKV__HASH_ROOT, h = 0, lanes;
	int32_t parent = -1;
	bkv__seq *s;

	if (!pool)
		return BKV_EINVAL;
	s = bkv__seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	if (s->state != BKV__SEQ_SWAPPED || pool->copies[BKV_COPY_DEVICE].n)
		return BKV_ESTATE;
	bt = pool->kv.bt;
	n_full = s->len >> pool->kv.bt_shift;

	/* Pre-pass: leading full blocks still in the prefix cache. */
	if (pool->kv.index) {
		while (hits < n_full) {
			int32_t c = bkv__cache_lookup(&pool->kv, ph, parent, s->key,
						      pool->host_tok + (size_t)s->table[hits] * bt,
						      &h);

			if (c < 0)
				break;
			relinked += BLOCK_IS_CACHED(&pool->kv.blk[c]);
			ph = h;
			parent = c;
			hits++;
		}
	}
	BKV_ASSERT(relinked <= pool->kv.nr_cached);
	lanes = pool->grouped ? bkv__lanes_swap_in_need(pool, s) : 0;
	if (!swap_in_fits(pool, s, (uint64_t)s->n_blocks - hits + lanes, relinked))
		return BKV_ENOSPC;
	if (bkv__copies_reserve(pool, BKV_COPY_SWAP_IN,
				(uint32_t)(s->n_blocks - hits + lanes) + pool->st_frames))
		return BKV_ENOMEM;

	/* Commit: the same walk again (nothing changed), then copies. */
	ph = BKV__HASH_ROOT;
	parent = -1;
	for (i = 0; i < hits; i++) {
		int32_t c = bkv__cache_lookup(&pool->kv, ph, parent, s->key,
					      pool->host_tok + (size_t)s->table[i] * bt, &h);

		BKV_ASSERT(c >= 0);
		bkv__block_pin(&pool->kv, c);
		bkv__host_push(pool, s->table[i]);
		s->table[i] = c;
		ph = h;
		parent = c;
	}
	if (pool->st_share)
		bkv__state_share_prepare(pool, (uint32_t)(s->n_blocks - hits + lanes),
					 pool->st_len[s - pool->seqs] != 0);
	for (i = hits; i < s->n_blocks; i++) {
		uint32_t w = bkv__block_len(pool, s->len, i);

		s->table[i] = bkv__swap_in_block(pool, s->table[i], i ? s->table[i - 1] : -1, w);
		if (w == bt)
			bkv__seq_block_filled(pool, s, i);
	}
	pool->swap_in_blocks += s->n_blocks - hits;
	if (pool->grouped)
		bkv__lanes_swap_in(pool, s); /* and a STATE group's state */
	s->state = BKV__SEQ_OPEN;
	s->clean = 0;
	pool->nr_swapped--;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

/* ---- a STATE group's live state ------------------------------------------- */

/* Swap-out of s: BKV_ESTATE while its state lags its tokens; adds the host
 * blocks a live state needs to *host_need. */
int bkv__state_swap_check(const bkv_pool *pool, const bkv__seq *s, uint32_t *host_need)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t len = pool->st_len[slot];

	/* after bkv__state_settle: outside a step an append's state is live */
	if (!pool->kv.txn_active && pool->st_scratch[slot] >= 0)
		len = s->len;
	if (len != s->len)
		return BKV_ESTATE;
	/* a state still being loaded: copying it out would read the unit
	 * before the swap-in writes it (swap-outs go first) */
	if (pool->st_live[slot] >= 0 && (pool->st_flags[pool->st_live[slot]] & BKV__ST_SWAPIN))
		return BKV_ESTATE;
	if (len)
		*host_need += pool->st_frames;
	return BKV_OK;
}

/* The host performed a swap-in copy into frame f: a state unit's load is
 * done (bkv_pool_clear_copies; frames that are no unit's are left alone). */
void bkv__state_swap_in_cleared(bkv_pool *pool, int32_t f)
{
	const uint32_t k = pool->st_frames;

	if (pool->st_units && (uint32_t)f >= pool->st_first &&
	    ((uint32_t)f - pool->st_first) / k < pool->st_units)
		pool->st_flags[((uint32_t)f - pool->st_first) / k] &= (uint8_t)~BKV__ST_SWAPIN;
}
