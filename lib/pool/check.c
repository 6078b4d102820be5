/*
 * check.c - bkv_pool_check: the KV layer's block invariants (kv/check.c),
 * then the pool layer's: sequence slots and tables, reference counts
 * against tables, the host tier, the pending copies' flags. The numbering
 * is kv/kv.h's CHECK_* list.
 */
#include "pool/pool.h"

static int check_seqs(const bkv_pool *pool)
{
	uint32_t nb = pool->kv.nb, nh = pool->nh, ms = pool->cfg.max_seqs, i, j;
	uint32_t open = 0, swapped = 0, pins = 0, *sc = pool->scratch;
	uint64_t host_refs = 0, pin_blocks = 0;

	/* Slots and tables; device references counted into scratch. */
	memset(sc, 0, (size_t)nb * sizeof *sc);
	for (i = 0; i < ms; i++) {
		const bkv__seq *s = &pool->seqs[i];

		if (s->gen == 0 || s->gen > BKV__SEQ_GEN_MAX || s->state > BKV__SEQ_SWAPPED)
			return CHECK_SEQS;
		if (s->state == BKV__SEQ_FREE) {
			if (s->n_blocks || s->len)
				return CHECK_SEQS;
			continue;
		}
		if (s->uncached && (s->state != BKV__SEQ_OPEN || s->len < pool->kv.bt))
			return CHECK_SEQS;
		open++;
		if (s->pin) { /* a prefix pin's holder: device-resident */
			if (s->state != BKV__SEQ_OPEN)
				return CHECK_SEQS;
			pins++;
			pin_blocks += s->n_blocks;
		}
		if (s->n_blocks != bkv__blocks_for(pool, s->len) || s->n_blocks > s->cap ||
		    s->len > INT32_MAX)
			return CHECK_SEQS;
		if (s->state == BKV__SEQ_SWAPPED) {
			swapped++;
			host_refs += s->n_blocks;
			for (j = 0; j < s->n_blocks; j++)
				if (s->table[j] < 0 || (uint32_t)s->table[j] >= nh)
					return CHECK_SEQS;
			continue;
		}
		for (j = 0; j < s->n_blocks; j++) {
			int32_t b = s->table[j];

			if (b < 0 || (uint32_t)b >= nb)
				return CHECK_SEQS;
			sc[b]++;
			if (pool->kv.blk[b].fill < bkv__block_len(pool, s->len, j))
				return CHECK_SEQ_FILL;
		}
	}
	if (pins != pool->nr_pins || pin_blocks != pool->pin_blocks)
		return CHECK_SEQS;
	if (open != pool->nr_seqs || swapped != pool->nr_swapped)
		return CHECK_SEQS;
	if (pool->grouped) {
		int r = bkv__lanes_check(pool, sc, &host_refs, 0);

		if (r != CHECK_OK)
			return r;
		if (pool->st_units)
			bkv__state_check_host(pool, NULL, &host_refs);
	}
	for (i = 0; i < ms - open; i++) {
		uint32_t r = pool->ring_head + i;

		if (r >= ms)
			r -= ms;
		if (pool->slot_ring[r] >= ms || pool->seqs[pool->slot_ring[r]].state != BKV__SEQ_FREE)
			return CHECK_SEQS;
	}
	/* an indexed copy source whose tables left holds its ancestors */
	for (i = 0; i < nb; i++) {
		const bkv__block *k = &pool->kv.blk[i];
		int32_t a;

		if (!(k->flags & BKV__BLOCK_COPY_CHAIN))
			continue;
		if (!(k->flags & BKV__BLOCK_COPY_SRC))
			return CHECK_PENDING;
		for (j = 0, a = k->parent; a >= 0; a = pool->kv.blk[a].parent, j++) {
			if ((uint32_t)a >= nb || j >= nb)
				return CHECK_PARENT;
			sc[a]++;
		}
	}
	for (i = 0; i < nb; i++)
		if (sc[i] + (pool->xfer_ref ? pool->xfer_ref[i] : 0) != pool->kv.blk[i].ref)
			return CHECK_REFS;

	/* Host tier: scratch[h] = references from swapped tables. */
	if (nh) {
		uint32_t n, used = 0, pending = 0, reads = 0;
		const bkv__copy_list *l = &pool->copies[BKV_COPY_SWAP_IN];
		int32_t h;

		memset(sc, 0, (size_t)nh * sizeof *sc);
		for (i = 0; i < ms; i++) {
			const bkv__seq *s = &pool->seqs[i];

			if (s->state == BKV__SEQ_SWAPPED)
				for (j = 0; j < s->n_blocks; j++)
					sc[s->table[j]]++;
		}
		if (pool->grouped) {
			(void)bkv__lanes_check(pool, sc, &host_refs, 1);
			if (pool->st_units)
				bkv__state_check_host(pool, sc, NULL);
		}
		for (n = 0, h = pool->host_free_head; h >= 0; h = pool->host_next[h], n++)
			if ((uint32_t)h >= nh || n >= nh || pool->host_state[h] != BKV__HOST_FREE)
				return CHECK_HOST;
		if (n != pool->host_free)
			return CHECK_HOST;
		for (i = 0; i < l->n; i++) {
			h = l->v[i].src;
			if (h >= 0 && (uint32_t)h < nh && pool->host_state[h] == BKV__HOST_CACHED) {
				reads++; /* a host-cache reload (pool/hcache.c) */
				continue;
			}
			if (h < 0 || (uint32_t)h >= nh || pool->host_state[h] != BKV__HOST_PENDING ||
			    sc[h] != 0)
				return CHECK_HOST;
			sc[h] = UINT32_MAX; /* seen as a source once */
		}
		for (i = 0; i < nh; i++) {
			uint8_t st = pool->host_state[i];

			used += st == BKV__HOST_USED;
			pending += st == BKV__HOST_PENDING;
			if ((st == BKV__HOST_USED) != (sc[i] == 1) ||
			    (st == BKV__HOST_PENDING) != (sc[i] == UINT32_MAX) ||
			    (st > BKV__HOST_PENDING && (!pool->hc_on || st > BKV__HOST_CACHED)))
				return CHECK_HOST;
		}
		if (used != host_refs || pending != pool->host_pending ||
		    pending + reads != l->n ||
		    (uint64_t)pool->host_free + used + pending + pool->hc_cached + pool->hc_demoting != nh)
			return CHECK_HOST;
		if (bkv__hc_check(pool, sc) != CHECK_OK)
			return CHECK_HOST;
	} else if (host_refs || pool->host_free || pool->host_pending) {
		return CHECK_HOST;
	}
	return CHECK_OK;
}

static int check_pending(const bkv_pool *pool)
{
	const bkv__copy_list *d = &pool->copies[BKV_COPY_DEVICE];
	const bkv__copy_list *si = &pool->copies[BKV_COPY_SWAP_IN];
	uint32_t i;

	for (i = 0; i < d->n; i++) {
		if (d->v[i].src < 0 || (uint32_t)d->v[i].src >= pool->kv.nb || d->v[i].dst < 0 ||
		    (uint32_t)d->v[i].dst >= pool->kv.nb ||
		    !(pool->kv.blk[d->v[i].src].flags & BKV__BLOCK_PEND_DEV) ||
		    !(pool->kv.blk[d->v[i].src].flags & BKV__BLOCK_COPY_SRC) ||
		    !(pool->kv.blk[d->v[i].dst].flags & BKV__BLOCK_PEND_DEV))
			return CHECK_PENDING;
	}
	for (i = 0; i < si->n; i++) {
		const uint32_t dst = (uint32_t)si->v[i].dst;

		if (si->v[i].dst >= 0 && dst >= pool->kv.nb && pool->st_units &&
		    dst < pool->st_first + pool->st_units * pool->st_frames)
			continue; /* a state unit's frame (pool/state.c) */
		if (si->v[i].dst < 0 || dst >= pool->kv.nb ||
		    !(pool->kv.blk[dst].flags & BKV__BLOCK_PEND_SWAPIN))
			return CHECK_PENDING;
	}
	return CHECK_OK;
}

int bkv_pool_check(const bkv_pool *pool)
{
	int r;

	if (!pool)
		return BKV_EINVAL;
	r = bkv__kv_check(&pool->kv, pool->scratch);
	if (r == CHECK_OK)
		r = check_seqs(pool);
	if (r == CHECK_OK)
		r = check_pending(pool);
	if (r == CHECK_OK)
		r = bkv__kv_check_txn(&pool->kv);
	if (r == CHECK_OK && pool->st_units)
		r = bkv__state_check(pool, pool->scratch);
	return r;
}
