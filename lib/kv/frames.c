/*
 * frames.c - block frames: their creation, the free list, reference counts
 * and the release rules' slow paths.
 *
 * The pool manages block *indices* only: device_blocks frames of
 * block_tokens token slots, numbered 0..N-1, whose KV the host keeps in its
 * own tensors. Every frame is in exactly one state:
 *
 *            take (pop free head)            last release, not indexed
 *   FREE ---------------------------> PINNED -------------------------> FREE
 *    ^                                 |  ^                        (push head)
 *    | reset_cache          last release,|  | prefix hit
 *    |                          indexed  v  | (unlink from LRU, O(1))
 *    +------------------------------ CACHED (on the LRU; evicted from its
 *                                     head when the free list is empty)
 *
 * Metadata is struct-of-blocks (bkv__block, 40 bytes, kv/kv.h) plus a token
 * store tok[N * block_tokens] holding each block's token ids: a block that
 * fills across several appends is hashed from it, and a prefix hit is
 * verified against it token by token (the store is written through once at
 * create, so no page of it is first touched - faulted in - inside a step).
 * The free list is singly linked through bkv__block.next; its initial pop
 * order is 0, 1, ..., N-1 and freed blocks are pushed on its head (LIFO, so a
 * hot block is reused first). Allocation (bkv__block_take, kv/kv.h) pops the
 * free list and, only when it is empty, evicts the oldest cached block:
 * unhashed blocks are always reused before cached ones. Both are O(1) and
 * never allocate memory.
 *
 * Release rules. A block whose last reference goes is put on the LRU tail if
 * it is indexed, else on the free list head. drop (abort) is the same except
 * that an indexed block with no indexed children leaves the index and is
 * freed (one with indexed children must stay: its children's chain runs
 * through it). The common cases are inline (bkv__block_put); this file has
 * the rest.
 *
 * A copy-on-write source is flagged COPY_SRC until the host clears the
 * device copies. If its last table reference goes meanwhile it stays pinned
 * (counted in nr_used, on no list) and is released only at the clear
 * (bkv__block_copy_cleared): a source can never be reclaimed and rewritten
 * while a copy from it is outstanding. An indexed source whose last table
 * reference goes also takes one reference on each of its ancestors
 * (COPY_CHAIN): every pinned indexed block must keep a pinned parent, or the
 * parent could be evicted from under it. The clear releases the source, then
 * its ancestors, child first; a block released late like this moves its
 * cached ancestors up the LRU behind it (bkv__lru_lift), so the LRU keeps
 * every cached parent more recent than its children.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE */
#endif
#include "kv/kv.h"

#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* The metadata size docs/benchmarks.md reports. */
_Static_assert(sizeof(bkv__block) == 40, "bkv__block grew");

static uint32_t log2u(uint32_t v)
{
	uint32_t s = 0;

	while ((1u << s) < v)
		s++;
	return s;
}

/* Ask for transparent huge pages under a large array (Linux, where the
 * system's setting is "madvise"): a lookup in a pool of millions of blocks
 * lands on a random 4 KiB page of the index, the block records and the
 * token store, and with small pages each of those loads first misses the
 * TLB and walks the page table. Only the 2 MiB-aligned interior is advised
 * (the allocation is the caller's); a refusal changes nothing. Called
 * before the array is first written. */
static void advise_huge(void *p, size_t bytes)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
	const uintptr_t huge = (uintptr_t)2 << 20;
	uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + bytes) & ~(huge - 1);

	if (p && hi > lo)
		(void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
	(void)p;
	(void)bytes;
#endif
}

/* p rounded up to BKV__TOK_ALIGN (its allocation has that much slack). */
static int32_t *align_up(void *p)
{
	uintptr_t u = ((uintptr_t)p + BKV__TOK_ALIGN - 1) & ~(uintptr_t)(BKV__TOK_ALIGN - 1);

	return (int32_t *)((char *)p + (u - (uintptr_t)p));
}

/* The LRU's slots (all -1) and chunks (all free, 0 popped first). */
static int lru_init(bkv__kv *kv, const bkv_allocator *a)
{
	uint32_t n = bkv__lru_chunks_for(kv->nb), c;
	size_t slots = (size_t)n * BKV__LRU_SLOTS;

	if (slots > INT32_MAX) /* slots are int32_t (never: nb <= 2^30) */
		return BKV_ENOMEM;
	kv->lru_chunks = n;
	kv->lru_mem = bkv__malloc(a, (size_t)n * (BKV__LRU_SLOTS * sizeof(int32_t) +
						  sizeof(bkv__lru_chunk)) +
					     sizeof(bkv__lru_chunk) + BKV__TOK_ALIGN);
	if (!kv->lru_mem)
		return BKV_ENOMEM;
	kv->lru = align_up(kv->lru_mem);
	kv->lru_ch = (bkv__lru_chunk *)(void *)(kv->lru + slots) + 1;
	advise_huge(kv->lru_mem, bkv__kv_lru_bytes(kv));
	memset(kv->lru, 0xff, slots * sizeof(int32_t));
	memset(kv->lru_ch - 1, 0, ((size_t)n + 1) * sizeof(bkv__lru_chunk));
	kv->lru_ch[-1].next = kv->lru_ch[-1].prev = -1;
	kv->lru_ch[-1].live = BKV__LRU_NONE;
	for (c = 0; c < n; c++) {
		kv->lru_ch[c].next = c + 1 < n ? (int32_t)(c + 1) : -1;
		kv->lru_ch[c].prev = -1;
	}
	kv->lru_free = 0;
	return BKV_OK;
}

int bkv__kv_init(bkv__kv *kv, const bkv_allocator *a, uint32_t block_tokens, uint32_t nblocks,
		 int prefix_cache, uint64_t hash_seed, uint32_t event_capacity)
{
	size_t nb = nblocks, bt = block_tokens, icap = 0, i;

	memset(kv, 0, sizeof *kv);
	kv->bt = block_tokens;
	kv->bt_shift = log2u(block_tokens);
	kv->nb = nblocks;
	kv->hash_seed = hash_seed;
	kv->ev_cap = event_capacity;
	kv->free_head = kv->lru_head = kv->lru_tail = -1;
	kv->lru_free = kv->lru_first = kv->lru_last = -1;
	/* Sizes cannot overflow size_t on 64-bit hosts (2^30 x 2^16 x 4); the
	 * check keeps 32-bit hosts honest. */
	if (nb > SIZE_MAX / bt / sizeof(bkv__block))
		return BKV_ENOMEM;
	if (prefix_cache) {
		icap = 2;
		while (icap < 2 * nb)
			icap *= 2;
	}
	kv->blk = bkv__malloc(a, nb * sizeof(bkv__block));
	kv->tok_mem = bkv__malloc(a, bkv__kv_tok_bytes(nb, bt));
	if (!kv->blk || !kv->tok_mem)
		return BKV_ENOMEM;
	kv->tok = align_up(kv->tok_mem);
	advise_huge(kv->blk, nb * sizeof(bkv__block));
	advise_huge(kv->tok_mem, bkv__kv_tok_bytes(nb, bt));
	if (icap) {
		kv->index = bkv__malloc(a, icap * sizeof(bkv__islot));
		if (!kv->index)
			return BKV_ENOMEM;
		kv->index_mask = (uint32_t)(icap - 1);
		if (lru_init(kv, a) != BKV_OK)
			return BKV_ENOMEM;
		advise_huge(kv->index, icap * sizeof(bkv__islot));
		memset(kv->index, 0xff, icap * sizeof(bkv__islot));
		kv->index_cold = icap * sizeof(bkv__islot) + nb * sizeof(bkv__block) > BKV__KV_COLD_BYTES;
		kv->txn_pending = bkv__malloc(a, nb * sizeof(int32_t));
		kv->txn_owner = bkv__malloc(a, nb * sizeof(uint64_t));
		if (!kv->txn_pending || !kv->txn_owner)
			return BKV_ENOMEM;
	}
	if (event_capacity) {
		kv->ev = bkv__malloc(a, event_capacity * sizeof(bkv_kv_event));
		if (!kv->ev)
			return BKV_ENOMEM;
	}
	for (i = 0; i < nb; i++) {
		bkv__block *k = &kv->blk[i];

		memset(k, 0, sizeof *k);
		k->next = i + 1 < nb ? (int32_t)(i + 1) : -1;
		k->prev = -1;
		k->parent = -1;
	}
	/* Touch the token store now: every appended token is written into it,
	 * and left untouched its pages would be mapped on first write - a page
	 * fault inside bkv_seq_append (inside a scheduler step) for every 4 KiB
	 * of blocks the first time they are used. */
	memset(kv->tok, 0, nb * bt * sizeof(int32_t));
	kv->free_head = 0;
	kv->nr_free = (uint32_t)nb;
	return BKV_OK;
}

int bkv__kv_groups_on(bkv__kv *kv, const bkv_allocator *a)
{
	BKV_ASSERT(!kv->grp && kv->nr_used == 0);
	kv->grp = bkv__malloc(a, kv->nb);
	if (!kv->grp)
		return BKV_ENOMEM;
	memset(kv->grp, 0, kv->nb);
	return BKV_OK;
}

void bkv__kv_free(bkv__kv *kv, const bkv_allocator *a)
{
	size_t nb = kv->nb, bt = kv->bt;

	bkv__free(a, kv->index, bkv__index_cap(kv) * sizeof(bkv__islot));
	bkv__free(a, kv->txn_pending, kv->index ? nb * sizeof(int32_t) : 0);
	bkv__free(a, kv->txn_owner, kv->index ? nb * sizeof(uint64_t) : 0);
	bkv__free(a, kv->ev, kv->ev ? kv->ev_cap * sizeof(bkv_kv_event) : 0);
	bkv__free(a, kv->lru_mem, bkv__kv_lru_bytes(kv));
	bkv__free(a, kv->tok_mem, kv->tok_mem ? bkv__kv_tok_bytes(nb, bt) : 0);
	bkv__free(a, kv->blk, nb * sizeof(bkv__block));
	bkv__ck_free(kv, a);
	bkv__free(a, kv->grp, kv->grp ? nb : 0);
	/* the segmented LRU's ghosts, when its user outlived the pool */
	bkv__free(a, kv->val_ghost,
		  kv->val_ghost ? ((size_t)kv->val_ghost_mask + 1) * sizeof(uint64_t) : 0);
	kv->val_ghost = NULL;
	bkv__kv_retain_off(kv, a); /* a scheduler with retention outlived it */
	if (kv->val) { /* a scheduler that set the value policy outlived it */
		kv->val_users = 1;
		bkv__kv_value_off(kv, a);
	}
}

NOINLINE int32_t bkv__block_take_evict(bkv__kv *kv)
{
	int32_t b;

	if (kv->ck_k) /* frames shared with a STATE group (kv/chunks.c) */
		return bkv__ck_take(kv);
	b = bkv__cache_evict(kv);

	BKV_ASSERT(b >= 0);
	return b;
}

/* Releases run last to first, so a parent is normally still pinned and this
 * is not called; a late release (a copy-on-write source freed when its copy
 * is cleared, after its sequence closed) moves the cached ancestors up
 * behind it, so eviction still takes children first. */
NOINLINE void bkv__lru_lift(bkv__kv *kv, int32_t a)
{
	for (; a >= 0 && BLOCK_IS_CACHED(&kv->blk[a]); a = kv->blk[a].parent) {
		bkv__lru_unlink(kv, a);
		bkv__lru_push(kv, a);
	}
}

NOINLINE void bkv__block_put_slow(bkv__kv *kv, int32_t b, int drop)
{
	bkv__block *k = &kv->blk[b];

	k->flags &= ~BKV__BLOCK_TXN;
	if (k->flags & BKV__BLOCK_COPY_SRC) {
		/* Stays pinned until its pending copy is cleared. Indexed, it
		 * must keep its chain pinned too (its parent is still pinned:
		 * tables release last to first), or the parent could be
		 * evicted under it. */
		if (BLOCK_IS_INDEXED(k) && k->parent >= 0 && !(k->flags & BKV__BLOCK_COPY_CHAIN)) {
			int32_t a;

			k->flags |= BKV__BLOCK_COPY_CHAIN;
			for (a = k->parent; a >= 0; a = kv->blk[a].parent) {
				BKV_ASSERT(BLOCK_IS_PINNED(&kv->blk[a]));
				kv->blk[a].ref++;
			}
		}
		return;
	}
	bkv__block_release(kv, b, drop);
}

void bkv__block_release(bkv__kv *kv, int32_t b, int drop)
{
	bkv__block *k = &kv->blk[b];

	kv->nr_used--;
	BKV__GRP_COUNT(kv, b, grp_used, -1);
	kv->tokens -= k->fill;
	if (UNLIKELY(kv->ck_k))
		bkv__ck_released(kv, b);
	if (BLOCK_IS_INDEXED(k)) {
		if (!drop || k->kids > 0) {
			bkv__lru_push(kv, b);
			if (k->parent >= 0 && BLOCK_IS_CACHED(&kv->blk[k->parent]))
				bkv__lru_lift(kv, k->parent); /* (a late release) */
			return;
		}
		bkv__cache_forget(kv, b);
	}
	if (UNLIKELY(kv->ck_k)) {
		bkv__ck_push(kv, b);
		return;
	}
	k->next = kv->free_head;
	kv->free_head = b;
	kv->nr_free++;
}

void bkv__block_copy_cleared(bkv__kv *kv, int32_t src)
{
	bkv__block *k = &kv->blk[src];
	int chain = (k->flags & BKV__BLOCK_COPY_CHAIN) != 0;
	int32_t a;

	k->flags &= ~(BKV__BLOCK_COPY_SRC | BKV__BLOCK_COPY_CHAIN);
	if (k->ref == 0)
		bkv__block_release(kv, src, 0);
	/* then its ancestors, child first (the LRU order) */
	for (a = chain ? k->parent : -1; a >= 0;) {
		int32_t up = kv->blk[a].parent;

		bkv__block_put(kv, a, 0);
		a = up;
	}
}

void bkv__kv_reset_cache(bkv__kv *kv)
{
	uint32_t i;

	/* Oldest first onto the free head: the newest cached block is reused
	 * first afterwards. */
	while (kv->lru_head >= 0) {
		int32_t b = kv->lru[kv->lru_head];

		bkv__lru_unlink(kv, b);
		bkv__kv_free_push(kv, b);
	}
	for (i = 0; i < kv->nb; i++) {
		kv->blk[i].flags &= ~BKV__BLOCK_INDEXED;
		kv->blk[i].kids = 0;
	}
	if (kv->index)
		memset(kv->index, 0xff, bkv__index_cap(kv) * sizeof(bkv__islot));
	kv->nr_indexed = 0;
	bkv__event(kv, BKV_EVENT_CLEARED, -1);
}

uint32_t bkv__kv_events(bkv__kv *kv, bkv_kv_event *out, uint32_t max)
{
	uint32_t n, cap, first;

	if (!kv->ev)
		return 0;
	cap = kv->ev_cap;
	n = BKV_MIN(max, kv->ev_n);
	first = BKV_MIN(n, cap - kv->ev_head); /* up to the ring's end */
	memcpy(out, kv->ev + kv->ev_head, first * sizeof *out);
	memcpy(out + first, kv->ev, (n - first) * sizeof *out);
	kv->ev_head += n;
	if (kv->ev_head >= cap)
		kv->ev_head -= cap;
	kv->ev_n -= n;
	return n;
}
