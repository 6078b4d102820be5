/*
 * chunks.c - frames shared with a recurrent-state group, in chunks.
 *
 * A STATE group's unit is st_frames consecutive frames, addressed by its
 * first (a state kernel reads it as one tensor). With sharing on
 * (bkv_pool_config.state_share), the frames are cut into aligned chunks of
 * k = st_frames frames: chunk c is frames [c * k, (c + 1) * k). A whole
 * chunk is either attention's (its frames are blocks: free, cached or
 * pinned) or lent to the state group as unit c. The frames past the last
 * whole chunk (the "tail", chunk ck_n) are attention's always.
 *
 * Counts, O(1) at every transition. Per attention chunk, the frames that
 * are pinned (ck_pin) and free (ck_nfree). bkv__block_pin calls
 * bkv__ck_pinned for a CHUNKED frame it takes from the cache (through
 * bkv__block_hit_slow, behind the test the value policy's hit had), and every
 * release of one runs the slow path (bkv__block_release, flagged CHUNKED),
 * which calls bkv__ck_unpinned. A chunk with no pinned frame is idle, on a
 * doubly linked list (most recently idle first): each of its frames is
 * free or cached, so it can be lent whatever the sequences hold.
 *
 * The free list is per chunk (a slab allocator's partial and empty slabs):
 * each chunk's free frames are a LIFO list, and the chunks with free frames
 * are on one of two lists, those with pinned frames too (and the tail) on
 * ck_part, the idle ones on ck_empty. bkv__block_take finds free_head -1
 * always in a chunked pool and calls bkv__ck_take, which pops ck_part's
 * first chunk, else ck_empty's, else evicts from the cache: a sequence's
 * blocks fill the chunks already in use before they open an idle one, so
 * idle chunks stay whole for the state group (without this, blocks spread
 * over every chunk and, with units of ~100 frames, none is ever idle).
 * Plain pools never set CHUNKED and keep their one free list; their fast
 * paths gain no instruction (the flag joins masks they test already).
 *
 * Lending a chunk evicts its cached frames and empties its free list. A
 * cached frame with indexed children cannot leave the index alone (its
 * children's chains run through it, and they are all cached: a pinned
 * indexed block has a pinned parent), so the lending first evicts from the
 * cache in its own order (oldest leaves first, or by value) until the
 * chunk's cached frames have none; the pick prefers, among the first few
 * idle chunks, one whose frames are all free (no cache lost), then one
 * whose cached frames are all leaves, so that this is rare.
 */
#include "kv/kv.h"

#include <string.h>

/* Idle chunks the pick looks at (a bound: the pick is O(k), not O(chunks)). */
#define CK_PICK_SCAN 8u

NOINLINE void bkv__ck_released(bkv__kv *kv, int32_t b)
{
	bkv__ck_unpinned(kv, b);
}

NOINLINE void bkv__ck_push(bkv__kv *kv, int32_t b)
{
	bkv__kv_free_push(kv, b);
}

int32_t bkv__ck_take(bkv__kv *kv)
{
	int32_t c = kv->ck_part >= 0 ? kv->ck_part : kv->ck_empty, b;

	if (c >= 0) {
		b = kv->ck_free[c];
		BKV_ASSERT(b >= 0 && kv->ck_nfree[c] > 0);
		kv->ck_free[c] = kv->blk[b].next;
		kv->ck_nfree[c]--;
		kv->nr_free--;
	} else {
		b = bkv__cache_evict(kv);
		BKV_ASSERT(b >= 0);
		c = (int32_t)bkv__ck_of(kv, b);
	}
	if ((uint32_t)c < kv->ck_n)
		kv->ck_pin[c]++;
	bkv__ck_fix(kv, (uint32_t)c);
	return b;
}

int bkv__ck_init(bkv__kv *kv, const bkv_allocator *a, uint32_t k, uint32_t lent)
{
	const uint32_t n = kv->nb / k;
	uint32_t i;

	kv->ck_k = k;
	kv->ck_n = n;
	kv->hit_slow = 1;
	kv->ck_idle = kv->ck_part = kv->ck_empty = -1;
	kv->ck_pin = bkv__calloc(a, n, sizeof(uint32_t));
	kv->ck_nfree = bkv__calloc(a, (size_t)n + 1, sizeof(uint32_t));
	kv->ck_free = bkv__malloc(a, ((size_t)n + 1) * sizeof(int32_t));
	kv->ck_lent = bkv__calloc(a, n, 1);
	kv->ck_on = bkv__calloc(a, (size_t)n + 1, 1);
	kv->ck_next = bkv__malloc(a, (size_t)n * sizeof(int32_t));
	kv->ck_prev = bkv__malloc(a, (size_t)n * sizeof(int32_t));
	kv->ck_anext = bkv__malloc(a, ((size_t)n + 1) * sizeof(int32_t));
	kv->ck_aprev = bkv__malloc(a, ((size_t)n + 1) * sizeof(int32_t));
	if (!kv->ck_pin || !kv->ck_nfree || !kv->ck_free || !kv->ck_lent || !kv->ck_on ||
	    !kv->ck_next || !kv->ck_prev || !kv->ck_anext || !kv->ck_aprev)
		return BKV_ENOMEM;
	for (i = 0; i <= n; i++) {
		kv->ck_free[i] = kv->ck_anext[i] = kv->ck_aprev[i] = -1;
		if (i < n)
			kv->ck_next[i] = kv->ck_prev[i] = -1;
	}
	/* every frame free (bkv__kv_init): onto its chunk's list, last
	 * first, so that frame 0 is popped first and chunk 0 heads ck_empty */
	kv->free_head = -1;
	kv->nr_free = 0;
	for (i = kv->nb; i-- > 0;) {
		kv->blk[i].flags |= BKV__BLOCK_CHUNKED;
		bkv__kv_free_push(kv, (int32_t)i);
	}
	for (i = 0; i < n; i++)
		bkv__ck_fix(kv, i); /* idle */
	for (i = 0; i < lent && i < n; i++)
		bkv__ck_lend(kv, (int32_t)(n - 1 - i));
	kv->ck_lends = 0; /* the initial units are not counted as lent */
	return BKV_OK;
}

size_t bkv__ck_bytes(const bkv__kv *kv)
{
	const size_t n = kv->ck_n;

	if (!kv->ck_k)
		return 0;
	/* pin, lent, next, prev: per chunk; nfree, free, on, anext, aprev:
	 * one more (the lists' heads) */
	return n * (sizeof(uint32_t) + 1 + 2 * sizeof(int32_t)) +
	       (n + 1) * (sizeof(uint32_t) + 3 * sizeof(int32_t) + 1);
}

void bkv__ck_free(bkv__kv *kv, const bkv_allocator *a)
{
	const size_t n = kv->ck_n;

	if (!kv->ck_k)
		return;
	bkv__free(a, kv->ck_pin, n * sizeof(uint32_t));
	bkv__free(a, kv->ck_nfree, (n + 1) * sizeof(uint32_t));
	bkv__free(a, kv->ck_free, (n + 1) * sizeof(int32_t));
	bkv__free(a, kv->ck_lent, n);
	bkv__free(a, kv->ck_on, n + 1);
	bkv__free(a, kv->ck_next, n * sizeof(int32_t));
	bkv__free(a, kv->ck_prev, n * sizeof(int32_t));
	bkv__free(a, kv->ck_anext, (n + 1) * sizeof(int32_t));
	bkv__free(a, kv->ck_aprev, (n + 1) * sizeof(int32_t));
	kv->ck_k = 0;
	kv->hit_slow = kv->val != NULL;
}

/* What lending idle chunk c costs: 0 all free, 1 cached leaves to evict,
 * 2 a cached frame with indexed children. */
static int lend_cost(const bkv__kv *kv, int32_t c)
{
	const uint32_t k = kv->ck_k, f0 = (uint32_t)c * k;
	int cost = 0;
	uint32_t j;

	if (kv->ck_nfree[c] == k)
		return 0;
	for (j = 0; j < k && cost < 2; j++) {
		const bkv__block *b = &kv->blk[f0 + j];

		if (BLOCK_IS_INDEXED(b))
			cost = b->kids ? 2 : 1;
	}
	return cost;
}

int32_t bkv__ck_pick(const bkv__kv *kv, int clean)
{
	int32_t c, best = -1;
	int best_cost = 3;
	uint32_t i;

	if (clean) { /* idle chunks with free frames are on ck_empty */
		for (c = kv->ck_empty, i = 0; c >= 0 && i < CK_PICK_SCAN; c = kv->ck_anext[c], i++)
			if (kv->ck_nfree[c] == kv->ck_k)
				return c;
		return -1;
	}
	for (c = kv->ck_idle, i = 0; c >= 0 && i < CK_PICK_SCAN; c = kv->ck_next[c], i++) {
		int cost = lend_cost(kv, c);

		if (cost < best_cost) {
			best = c;
			best_cost = cost;
		}
		if (cost == 0)
			break;
	}
	return best;
}

void bkv__ck_lend(bkv__kv *kv, int32_t c)
{
	const uint32_t k = kv->ck_k, f0 = (uint32_t)c * k;
	uint32_t j;

	BKV_ASSERT(!kv->ck_lent[c] && kv->ck_pin[c] == 0);
	/* in the cache's order until no cached frame of c is a parent: each
	 * eviction frees one leaf, and c's frames' descendants are cached */
	while (lend_cost(kv, c) == 2) {
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
		}
		b->fill = 0;
		b->parent = -1;
		b->next = b->prev = -1;
	}
	kv->nr_free -= kv->ck_nfree[c];
	kv->ck_nfree[c] = 0;
	kv->ck_free[c] = -1;
	kv->ck_lent[c] = 1;
	kv->nr_lent += k;
	kv->ck_lends++;
	bkv__ck_fix(kv, (uint32_t)c);
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
	bkv__ck_fix(kv, (uint32_t)c);
	kv->ck_returns++;
}

/* The lists a chunk should be on (bkv__ck_fix's rule). */
static unsigned want_on(const bkv__kv *kv, uint32_t c)
{
	const int whole = c < kv->ck_n, lent = whole && kv->ck_lent[c];
	unsigned on = whole && !lent && kv->ck_pin[c] == 0 ? BKV__CK_ON_IDLE : 0;

	if (!lent && kv->ck_nfree[c])
		on |= !whole || kv->ck_pin[c] ? BKV__CK_ON_PART : BKV__CK_ON_EMPTY;
	return on;
}

/* One chunk: its pinned and free frames counted, its free list its own
 * free frames, a lent chunk's frames clean (ref 0, not indexed, on no
 * list; a pending copy's flag stays until the host clears it, as on a
 * free frame), and the lists it is on the ones its counts name. */
static int chunk_check(const bkv__kv *kv, uint32_t c, uint32_t *nfree)
{
	const uint32_t k = kv->ck_k, f0 = c * k, f1 = c < kv->ck_n ? f0 + k : kv->nb;
	const int lent = c < kv->ck_n && kv->ck_lent[c];
	uint32_t pins = 0, n = 0, j;
	int32_t b;

	for (j = f0; j < f1; j++) {
		const bkv__block *x = &kv->blk[j];

		if (lent && (x->ref || x->next != -1 || x->prev != -1 || x->kids ||
			     (x->flags & ~(BKV__BLOCK_CHUNKED | BKV__BLOCK_PEND_DEV |
					   BKV__BLOCK_PEND_SWAPIN))))
			return CHECK_CHUNKS;
		pins += BLOCK_IS_PINNED(x);
	}
	for (b = kv->ck_free[c]; b >= 0; b = kv->blk[b].next, n++)
		if (n >= k + kv->nb % k || (uint32_t)b < f0 || (uint32_t)b >= f1 ||
		    !BLOCK_IS_FREE(&kv->blk[b]))
			return CHECK_CHUNKS;
	if (n != kv->ck_nfree[c] || (c < kv->ck_n && !lent && pins != kv->ck_pin[c]) ||
	    (lent && (n || kv->ck_pin[c])) || kv->ck_on[c] != want_on(kv, c))
		return CHECK_CHUNKS;
	*nfree += n;
	return CHECK_OK;
}

/* A chunk list: its links, and every member has flag `on`. */
static uint32_t list_len(const bkv__kv *kv, int32_t head, const int32_t *next,
			 const int32_t *prev, unsigned on, int *bad)
{
	uint32_t n = 0;
	int32_t p = -1, c;

	for (c = head; c >= 0; p = c, c = next[c], n++)
		if (n > kv->ck_n || prev[c] != p || !(kv->ck_on[c] & on))
			*bad = 1;
		else if (*bad)
			break;
	return n;
}

int bkv__ck_check(const bkv__kv *kv)
{
	uint32_t i, nfree = 0, lent = 0, idle = 0, part = 0, empty = 0;
	int bad = 0;

	if (!kv->ck_k)
		return CHECK_OK;
	if (kv->free_head != -1)
		return CHECK_CHUNKS;
	for (i = 0; i < kv->nb; i++)
		if (!(kv->blk[i].flags & BKV__BLOCK_CHUNKED))
			return CHECK_CHUNKS;
	for (i = 0; i <= kv->ck_n; i++) {
		if (chunk_check(kv, i, &nfree) != CHECK_OK)
			return CHECK_CHUNKS;
		lent += i < kv->ck_n && kv->ck_lent[i];
		idle += (kv->ck_on[i] & BKV__CK_ON_IDLE) != 0;
		part += (kv->ck_on[i] & BKV__CK_ON_PART) != 0;
		empty += (kv->ck_on[i] & BKV__CK_ON_EMPTY) != 0;
	}
	if (nfree != kv->nr_free || lent * kv->ck_k != kv->nr_lent || idle != kv->nr_idle ||
	    list_len(kv, kv->ck_idle, kv->ck_next, kv->ck_prev, BKV__CK_ON_IDLE, &bad) != idle ||
	    list_len(kv, kv->ck_part, kv->ck_anext, kv->ck_aprev, BKV__CK_ON_PART, &bad) != part ||
	    list_len(kv, kv->ck_empty, kv->ck_anext, kv->ck_aprev, BKV__CK_ON_EMPTY, &bad) !=
		    empty ||
	    bad)
		return CHECK_CHUNKS;
	return CHECK_OK;
}
