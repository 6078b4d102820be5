/*
 * chunks.c - frames shared with a recurrent-state group, in chunks.
 *
 * A STATE group's unit is st_frames consecutive frames, addressed by its
 * first (a state kernel reads it as one tensor). With sharing on
 * (bkv_pool_config.state_share), the frames are cut into aligned chunks of
 * k = st_frames frames: chunk c is frames [c * k, (c + 1) * k). A chunk is
 * either attention's (its frames are blocks: free, cached or pinned) or
 * lent to the state group as unit c. Frames past the last whole chunk are
 * attention's always.
 *
 * The KV layer keeps, per attention chunk, the number of its frames that
 * are pinned (ck_pin), changed in O(1) at each pin and unpin transition:
 * bkv__block_take and bkv__block_pin (kv/kv.h) call bkv__ck_pinned for a
 * CHUNKED frame, and every release of one runs the slow path
 * (bkv__block_release), which calls bkv__ck_unpinned. A chunk with no
 * pinned frame is idle, on a doubly linked list (most recently idle first):
 * each of its frames is free or cached, so it can be lent whatever the
 * sequences hold. Plain pools never set CHUNKED, so their fast paths only
 * test one more flag bit (folded into the tests they already make).
 *
 * Lending a chunk evicts its cached frames and takes its free frames off
 * the free list. The free list of a chunked pool is doubly linked through
 * bkv__block.prev (unused while a block is free): a push (always on the
 * slow path here) links the old head back to the new one; the inline pop
 * leaves the new head's back link stale, so a removal tests "is it the
 * head" by identity, not by prev. A cached frame with indexed children
 * cannot leave the index alone (its children's chains run through it, and
 * they are all cached: a pinned indexed block has a pinned parent), so the
 * lending first evicts from the cache in its own order (oldest leaves
 * first, or by value) until the chunk's cached frames have none; the pick
 * prefers, among the first few idle chunks, one whose frames are all free,
 * then one whose cached frames are all leaves, so that this is rare.
 */
#include "kv/kv.h"

#include <string.h>

/* Idle chunks the pick looks at (a bound: the pick is O(k), not O(chunks)). */
#define CK_PICK_SCAN 8u



/* Take free frame f off the free list (a chunked pool's). */
static void free_unlink(bkv__kv *kv, int32_t f)
{
	bkv__block *k = &kv->blk[f];
	int32_t n = k->next;

	if (kv->free_head == f) {
		kv->free_head = n;
		if (n >= 0)
			kv->blk[n].prev = -1;
	} else {
		kv->blk[k->prev].next = n;
		if (n >= 0)
			kv->blk[n].prev = k->prev;
	}
	k->next = k->prev = -1;
	kv->nr_free--;
}


int bkv__ck_init(bkv__kv *kv, const bkv_allocator *a, uint32_t k, uint32_t lent)
{
	uint32_t n = kv->nb / k, i;

	kv->ck_k = k;
	kv->ck_n = n;
	kv->ck_idle = -1;
	kv->ck_pin = bkv__calloc(a, n, sizeof(uint32_t));
	kv->ck_lent = bkv__calloc(a, n, 1);
	kv->ck_next = bkv__malloc(a, (size_t)n * sizeof(int32_t));
	kv->ck_prev = bkv__malloc(a, (size_t)n * sizeof(int32_t));
	if (!kv->ck_pin || !kv->ck_lent || !kv->ck_next || !kv->ck_prev)
		return BKV_ENOMEM;
	/* the free list is 0, 1, ..., nb - 1 (bkv__kv_init): link it back */
	for (i = 0; i < kv->nb; i++) {
		kv->blk[i].flags |= BKV__BLOCK_CHUNKED;
		kv->blk[i].prev = i ? (int32_t)(i - 1) : -1;
	}
	for (i = n; i-- > 0;) /* chunk 0 ends up the idle list's head */
		bkv__ck_idle_push(kv, (int32_t)i);
	for (i = 0; i < lent && i < n; i++)
		bkv__ck_lend(kv, (int32_t)(n - 1 - i));
	kv->ck_lends = 0; /* the initial units are not counted as lent */
	return BKV_OK;
}

void bkv__ck_free(bkv__kv *kv, const bkv_allocator *a)
{
	const size_t n = kv->ck_n;

	if (!kv->ck_k)
		return;
	bkv__free(a, kv->ck_pin, n * sizeof(uint32_t));
	bkv__free(a, kv->ck_lent, n);
	bkv__free(a, kv->ck_next, n * sizeof(int32_t));
	bkv__free(a, kv->ck_prev, n * sizeof(int32_t));
	kv->ck_k = 0;
}

/* What lending idle chunk c costs: 0 all free, 1 cached leaves to evict,
 * 2 a cached frame with indexed children. */
static int lend_cost(const bkv__kv *kv, int32_t c)
{
	const uint32_t k = kv->ck_k, f0 = (uint32_t)c * k;
	int cost = 0;
	uint32_t j;

	for (j = 0; j < k; j++) {
		const bkv__block *b = &kv->blk[f0 + j];

		if (BLOCK_IS_INDEXED(b))
			cost = BKV_MAX(cost, b->kids ? 2 : 1);
	}
	return cost;
}

int32_t bkv__ck_pick(const bkv__kv *kv, int clean)
{
	int32_t c, best = -1;
	int best_cost = 3;
	uint32_t i;

	for (c = kv->ck_idle, i = 0; c >= 0 && i < CK_PICK_SCAN; c = kv->ck_next[c], i++) {
		int cost = lend_cost(kv, c);

		if (cost < best_cost) {
			best = c;
			best_cost = cost;
		}
		if (cost == 0)
			break;
	}
	return clean && best_cost ? -1 : best;
}

/* Does a cached frame of chunk c still have indexed children? */
static int has_parents(const bkv__kv *kv, int32_t c)
{
	return lend_cost(kv, c) == 2;
}

void bkv__ck_lend(bkv__kv *kv, int32_t c)
{
	const uint32_t k = kv->ck_k, f0 = (uint32_t)c * k;
	uint32_t j;

	BKV_ASSERT(!kv->ck_lent[c] && kv->ck_pin[c] == 0);
	/* in the cache's order until no cached frame of c is a parent: each
	 * eviction frees one leaf, and c's frames' descendants are cached */
	while (has_parents(kv, c)) {
		int32_t b = bkv__cache_evict(kv);

		BKV_ASSERT(b >= 0);
		bkv__kv_free_push(kv, b);
	}
	for (j = 0; j < k; j++) {
		const int32_t f = (int32_t)(f0 + j);
		bkv__block *b = &kv->blk[f];

		if (BLOCK_IS_INDEXED(b)) { /* a cached leaf */
			bkv__lru_unlink(kv, f);
			bkv__cache_forget(kv, f);
			kv->evictions++;
		} else {
			free_unlink(kv, f);
		}
		b->fill = 0;
		b->parent = -1;
		b->next = b->prev = -1;
	}
	bkv__ck_idle_unlink(kv, c);
	kv->ck_lent[c] = 1;
	kv->nr_lent += k;
	kv->ck_lends++;
}

void bkv__ck_return(bkv__kv *kv, int32_t c)
{
	const uint32_t k = kv->ck_k, f0 = (uint32_t)c * k;
	uint32_t j;

	BKV_ASSERT(kv->ck_lent[c] && kv->ck_pin[c] == 0);
	kv->ck_lent[c] = 0;
	kv->nr_lent -= k;
	/* pushed last to first: the chunk's first frame is popped first */
	for (j = k; j-- > 0;)
		bkv__kv_free_push(kv, (int32_t)(f0 + j));
	bkv__ck_idle_push(kv, c);
	kv->ck_returns++;
}

/* Per chunk: its pinned frames, its idle-list membership, a lent chunk's
 * frames clean (ref 0, not indexed, on no list; a pending copy's flag
 * stays until the host clears it, as on a free frame). */
static int chunks_check(const bkv__kv *kv)
{
	const uint32_t k = kv->ck_k;
	uint32_t c, j, lent = 0, idle = 0, n;
	int32_t i, p;

	for (c = 0; c < kv->ck_n; c++) {
		uint32_t pins = 0;

		for (j = 0; j < k; j++) {
			const bkv__block *b = &kv->blk[c * k + j];

			if (kv->ck_lent[c] &&
			    (b->ref || b->next != -1 || b->prev != -1 || b->kids ||
			     (b->flags & ~(BKV__BLOCK_CHUNKED | BKV__BLOCK_PEND_DEV |
					   BKV__BLOCK_PEND_SWAPIN))))
				return CHECK_CHUNKS;
			pins += BLOCK_IS_PINNED(b);
		}
		if (kv->ck_lent[c]) {
			if (kv->ck_pin[c] || kv->ck_prev[c] != -1 || kv->ck_next[c] != -1)
				return CHECK_CHUNKS;
			lent++;
			continue;
		}
		if (pins != kv->ck_pin[c])
			return CHECK_CHUNKS;
		idle += pins == 0;
	}
	if (lent * k != kv->nr_lent || idle != kv->nr_idle)
		return CHECK_CHUNKS;
	for (n = 0, p = -1, i = kv->ck_idle; i >= 0; p = i, i = kv->ck_next[i], n++)
		if (n >= kv->ck_n || kv->ck_lent[i] || kv->ck_pin[i] || kv->ck_prev[i] != p)
			return CHECK_CHUNKS;
	return n == kv->nr_idle ? CHECK_OK : CHECK_CHUNKS;
}

int bkv__ck_check(const bkv__kv *kv)
{
	uint32_t i, n;
	int32_t b, p;

	if (!kv->ck_k)
		return CHECK_OK;
	for (i = 0; i < kv->nb; i++)
		if (!(kv->blk[i].flags & BKV__BLOCK_CHUNKED))
			return CHECK_CHUNKS;
	/* the free list's back links (the head's may be stale) */
	for (n = 0, p = -1, b = kv->free_head; b >= 0; p = b, b = kv->blk[b].next, n++)
		if (n >= kv->nb || (p >= 0 && kv->blk[b].prev != p) ||
		    bkv__ck_is_lent(kv, (uint32_t)b))
			return CHECK_CHUNKS;
	return chunks_check(kv);
}
