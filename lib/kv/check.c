/*
 * check.c - the KV layer's invariants: block counts and states, the free
 * list, the LRU and its order, fills, the hash index, parents and kids, the
 * chained hashes, the transaction queue.
 *
 * A flat list of checks in the order bkv_pool_check numbers them (the
 * CHECK_* values, kv/kv.h); the pool layer's checker (pool/check.c) runs
 * these first, then its own. Each walk is O(blocks); never called on the hot
 * path except under BKV_DEBUG_LEVEL 2.
 */
#include "kv/kv.h"

int bkv__kv_check(const bkv__kv *kv, uint32_t *scratch)
{
	uint32_t nb = kv->nb, bt = kv->bt, i, n, used = 0, freec = 0, cached = 0, idx = 0;
	uint32_t *sc = scratch;
	uint64_t tokens = 0;
	int32_t b, prev;

	if ((uint64_t)kv->nr_free + kv->nr_used + kv->nr_cached != nb)
		return CHECK_COUNTS;
	for (n = 0, b = kv->free_head; b >= 0; b = kv->blk[b].next, n++) {
		if ((uint32_t)b >= nb || n >= nb || !BLOCK_IS_FREE(&kv->blk[b]))
			return CHECK_FREE_LIST;
	}
	if (n != kv->nr_free)
		return CHECK_FREE_LIST;
	/* LRU: scratch[b] = 1-based position from the head (older = smaller). */
	memset(sc, 0, (size_t)nb * sizeof *sc);
	for (n = 0, prev = -1, b = kv->lru_head; b >= 0; prev = b, b = kv->blk[b].next) {
		if ((uint32_t)b >= nb || n >= nb || !BLOCK_IS_CACHED(&kv->blk[b]) ||
		    kv->blk[b].prev != prev)
			return CHECK_LRU;
		sc[b] = ++n;
	}
	if (n != kv->nr_cached || kv->lru_tail != prev)
		return CHECK_LRU;
	for (i = 0; i < nb; i++) {
		const bkv__block *k = &kv->blk[i];

		used += BLOCK_IS_PINNED(k);
		freec += BLOCK_IS_FREE(k);
		cached += BLOCK_IS_CACHED(k);
		idx += BLOCK_IS_INDEXED(k);
		if (BLOCK_IS_PINNED(k))
			tokens += k->fill;
		if (k->fill > bt || (BLOCK_IS_INDEXED(k) && k->fill != bt))
			return CHECK_FILL;
	}
	if (used != kv->nr_used || freec != kv->nr_free || cached != kv->nr_cached ||
	    idx != kv->nr_indexed)
		return CHECK_STATES;
	if (tokens != kv->tokens)
		return CHECK_TOKENS;
	/* The index holds exactly the indexed blocks, each findable. */
	if (kv->index) {
		size_t cap = bkv__index_cap(kv), j;

		for (n = 0, j = 0; j < cap; j++) {
			b = kv->index[j].b;
			if (b < 0)
				continue;
			if ((uint32_t)b >= nb || !BLOCK_IS_INDEXED(&kv->blk[b]) ||
			    kv->index[j].tag != bkv__index_tag(kv->blk[b].hash))
				return CHECK_INDEX;
			n++;
		}
		if (n != kv->nr_indexed)
			return CHECK_INDEX;
	} else if (kv->nr_indexed) {
		return CHECK_INDEX;
	}
	for (i = 0; i < nb; i++) {
		const bkv__block *k = &kv->blk[i];
		const bkv__block *p;

		if (!BLOCK_IS_INDEXED(k))
			continue;
		if (bkv__index_find(kv, k->hash) != (int32_t)i)
			return CHECK_INDEX;
		p = k->parent >= 0 ? &kv->blk[k->parent] : NULL;
		if (k->parent >= (int32_t)nb || (p && !BLOCK_IS_INDEXED(p)) ||
		    (p && BLOCK_IS_PINNED(k) && !BLOCK_IS_PINNED(p)))
			return CHECK_PARENT;
		if (BLOCK_IS_CACHED(k) && p && !BLOCK_IS_PINNED(p) && sc[k->parent] <= sc[i])
			return CHECK_LRU_ORDER;
		if (k->hash != bkv__block_hash(kv->hash_seed,
					       p ? p->hash : BKV__HASH_ROOT, k->key,
					       kv->tok + (size_t)i * bt, bt))
			return CHECK_HASH;
	}
	/* kids: count indexed children per block. */
	memset(sc, 0, (size_t)nb * sizeof *sc);
	for (i = 0; i < nb; i++)
		if (BLOCK_IS_INDEXED(&kv->blk[i]) && kv->blk[i].parent >= 0)
			sc[kv->blk[i].parent]++;
	for (i = 0; i < nb; i++)
		if (sc[i] != kv->blk[i].kids)
			return CHECK_KIDS;
	return CHECK_OK;
}

int bkv__kv_check_txn(const bkv__kv *kv)
{
	uint32_t i;

	for (i = 0; i < kv->nb; i++) {
		const bkv__block *k = &kv->blk[i];
		int32_t q = k->prev;

		if (!(k->flags & BKV__BLOCK_TXN))
			continue;
		/* (between transactions: swapped-in blocks an abort carried
		 * over, their copies pending or cleared since) */
		if (k->ref == 0 || BLOCK_IS_INDEXED(k) ||
		    k->fill != kv->bt || q < 0 || (uint32_t)q >= kv->txn_n ||
		    kv->txn_pending[q] != (int32_t)i)
			return CHECK_TXN;
	}
	return CHECK_OK;
}
