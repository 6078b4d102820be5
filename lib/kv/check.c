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

/* One chunk of the LRU: its used range, count and slots; each block in it
 * cached, at the slot it records, numbered in *n (sc[b], 1-based). */
static int chunk_check(const bkv__kv *kv, int32_t c, uint32_t *sc, uint32_t *n)
{
	const bkv__lru_chunk *ch = &kv->lru_ch[c];
	const int32_t *sl = kv->lru + ((size_t)c << BKV__LRU_SHIFT);
	uint32_t i, live = 0;

	if (ch->lo >= ch->hi || ch->hi > BKV__LRU_SLOTS || ch->pad || sl[ch->lo] < 0 ||
	    sl[ch->hi - 1] < 0)
		return CHECK_LRU;
	for (i = 0; i < BKV__LRU_SLOTS; i++) {
		int32_t b = sl[i];

		if (b < 0)
			continue;
		if (i < ch->lo || i >= ch->hi || (uint32_t)b >= kv->nb || *n >= kv->nb ||
		    !BLOCK_IS_CACHED(&kv->blk[b]) ||
		    kv->blk[b].prev != (int32_t)(((uint32_t)c << BKV__LRU_SHIFT) + i))
			return CHECK_LRU;
		sc[b] = ++*n;
		live++;
	}
	return live == ch->live && live > 0 ? CHECK_OK : CHECK_LRU;
}

/* The LRU's chunk list, oldest first: links both ways, every chunk valid
 * (chunk_check), neighbours but the newest holding more than a chunk's
 * slots together, the ends' slots, and the free chunks (empty, all -1)
 * making up the rest. *n gets the blocks on it. */
static int lru_check(const bkv__kv *kv, uint32_t *sc, uint32_t *n)
{
	uint32_t chunks = 0, nfree = 0, i;
	int32_t c, prev = -1;
	int rc;

	*n = 0;
	if (!kv->lru)
		return kv->lru_first < 0 && kv->lru_head < 0 && kv->lru_tail < 0 ? CHECK_OK
										 : CHECK_LRU;
	if (kv->lru_ch[-1].live != BKV__LRU_NONE)
		return CHECK_LRU;
	for (c = kv->lru_first; c >= 0; prev = c, c = kv->lru_ch[c].next) {
		const bkv__lru_chunk *ch;

		if ((uint32_t)c >= kv->lru_chunks || ++chunks > kv->lru_chunks)
			return CHECK_LRU;
		ch = &kv->lru_ch[c];
		if (ch->prev != prev || (rc = chunk_check(kv, c, sc, n)) != CHECK_OK)
			return CHECK_LRU;
		if (prev >= 0 && ch->next >= 0 && kv->lru_ch[prev].live + ch->live <= BKV__LRU_SLOTS)
			return CHECK_LRU;
	}
	if (kv->lru_last != prev)
		return CHECK_LRU;
	if (prev < 0 ? kv->lru_head != -1 || kv->lru_tail != -1
		     : kv->lru_head != (int32_t)(((uint32_t)kv->lru_first << BKV__LRU_SHIFT) +
						 kv->lru_ch[kv->lru_first].lo) ||
			       kv->lru_tail != (int32_t)(((uint32_t)prev << BKV__LRU_SHIFT) +
							 kv->lru_ch[prev].hi - 1))
		return CHECK_LRU;
	for (c = kv->lru_free; c >= 0; c = kv->lru_ch[c].next) {
		const bkv__lru_chunk *ch;

		if ((uint32_t)c >= kv->lru_chunks || ++nfree > kv->lru_chunks)
			return CHECK_LRU;
		ch = &kv->lru_ch[c];
		if (ch->lo || ch->hi || ch->live || ch->prev != -1)
			return CHECK_LRU;
		for (i = 0; i < BKV__LRU_SLOTS; i++)
			if (kv->lru[((size_t)c << BKV__LRU_SHIFT) + i] != -1)
				return CHECK_LRU;
	}
	return chunks + nfree == kv->lru_chunks ? CHECK_OK : CHECK_LRU;
}

int bkv__kv_check(const bkv__kv *kv, uint32_t *scratch)
{
	uint32_t nb = kv->nb, bt = kv->bt, i, n, used = 0, freec = 0, cached = 0, idx = 0;
	uint32_t *sc = scratch, gu[BKV_MAX_GROUPS] = {0}, gc[BKV_MAX_GROUPS] = {0};
	uint64_t tokens = 0;
	int32_t b;
	int rc;

	if ((uint64_t)kv->nr_free + kv->nr_used + kv->nr_cached + kv->nr_lent != nb)
		return CHECK_COUNTS;
	for (n = 0, b = kv->free_head; b >= 0; b = kv->blk[b].next, n++) {
		if ((uint32_t)b >= nb || n >= nb || !BLOCK_IS_FREE(&kv->blk[b]))
			return CHECK_FREE_LIST;
	}
	if (n != kv->nr_free && !kv->ck_k) /* chunked: per chunk (kv/chunks.c) */
		return CHECK_FREE_LIST;
	/* LRU: scratch[b] = 1-based position from the head (older = smaller). */
	memset(sc, 0, (size_t)nb * sizeof *sc);
	if ((rc = lru_check(kv, sc, &n)) != CHECK_OK)
		return rc;
	if (n != kv->nr_cached)
		return CHECK_LRU;
	for (i = 0; i < nb; i++) {
		const bkv__block *k = &kv->blk[i];

		if (bkv__ck_is_lent(kv, i))
			continue; /* a state unit's frame (kv/chunks.c) */
		used += BLOCK_IS_PINNED(k);
		freec += BLOCK_IS_FREE(k);
		cached += BLOCK_IS_CACHED(k);
		idx += BLOCK_IS_INDEXED(k);
		if (BLOCK_IS_PINNED(k))
			tokens += k->fill;
		if (kv->grp) { /* each frame counted in its group */
			if (kv->grp[i] >= BKV_MAX_GROUPS)
				return CHECK_COUNTS;
			gu[kv->grp[i]] += BLOCK_IS_PINNED(k);
			gc[kv->grp[i]] += BLOCK_IS_CACHED(k);
		}
		if (k->fill > bt || (BLOCK_IS_INDEXED(k) && k->fill != bt))
			return CHECK_FILL;
	}
	if (used != kv->nr_used || freec != kv->nr_free || cached != kv->nr_cached ||
	    idx != kv->nr_indexed)
		return CHECK_STATES;
	if (tokens != kv->tokens)
		return CHECK_TOKENS;
	if (kv->grp && (memcmp(gu, kv->grp_used, sizeof gu) || memcmp(gc, kv->grp_cached, sizeof gc)))
		return CHECK_COUNTS;
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
					       bkv__tok(kv, i), bt))
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
	if ((rc = bkv__ck_check(kv)) != CHECK_OK)
		return rc;
	return bkv__val_check(kv);
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
