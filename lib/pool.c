/*
 * pool.c - the block pool: frames, the free list, ref counts, block tables,
 * copy-on-write, the host (swap) tier, stats and the invariant checker.
 *
 * The pool is the library's virtual memory. It manages block *indices* only:
 * device_blocks frames of block_tokens token slots, numbered 0..N-1, whose KV
 * the host keeps in its own tensors. Every frame is in exactly one state:
 *
 *            take (pop free head)            last release, not indexed
 *   FREE ---------------------------> PINNED -------------------------> FREE
 *    ^                                 |  ^                        (push head)
 *    | reset_cache          last release,|  | prefix hit
 *    |                          indexed  v  | (unlink from LRU, O(1))
 *    +------------------------------ CACHED (on the LRU; evicted from its
 *                                     head when the free list is empty)
 *
 * Metadata is struct-of-blocks (bkv__block, 40 bytes, see internal.h) plus a
 * token store tok[N * block_tokens] holding each block's token ids: a block
 * that fills across several appends is hashed from it, and a prefix hit is
 * verified against it token by token (the store is written through once at
 * create, so no page of it is first touched - faulted in - inside a step).
 * The free list is singly linked through
 * bkv__block.next; its initial pop order is 0, 1, ..., N-1 and freed blocks
 * are pushed on its head (LIFO, so a hot block is reused first). Allocation
 * pops the free list and, only when it is empty, evicts the oldest cached
 * block: unhashed blocks are always reused before cached ones. Both are O(1)
 * and never allocate memory.
 *
 * A sequence (address space) is a preallocated slot whose block table is an
 * int32_t array the host can hand to its kernels as is. Ids are slot | gen <<
 * 20 with a 12-bit generation (1..4095, so an id is never 0) and slots are
 * reused FIFO, so a closed id answers BKV_ENOENT for a long time. A slot keeps
 * its table buffer across reuse; it only grows (geometrically, through the
 * allocator hook), so after warm-up no call allocates.
 *
 * Every mutating call is all-or-nothing: it validates, computes what it needs
 * (blocks, including a copy-on-write block, minus verified prefix hits found
 * by a non-mutating pre-pass; table and copy-list capacity), fails if any is
 * missing, and only then changes state.
 *
 * Copy-on-write: writing into a block that is shared (ref > 1) or indexed
 * (cached content is immutable; a truncate can leave a sequence ending inside
 * one) takes a fresh block, copies the first `offset` tokens, records a
 * (src, dst) BKV_COPY_DEVICE copy and drops its table reference to src (src
 * itself stays pinned until the copy is cleared, below). A full block is
 * never copied: appending after it takes a new block.
 *
 * Release rules. close, truncate and swap-out release a sequence's blocks last
 * to first; a block whose last reference goes is put on the LRU tail if it is
 * indexed, else on the free list head. drop (abort) is the same except that an
 * indexed block with no indexed children leaves the index and is freed (one
 * with indexed children must stay: its children's chain runs through it).
 *
 * Host tier. Swap-out gives each table entry a free host block, copies the
 * tokens to the host token store, records device->host copies and releases
 * the device blocks by close's rule; the table then holds host ids. Swap-in
 * first re-finds leading full blocks in the prefix cache (shared again, no
 * copy), then takes device blocks for the rest with host->device copies. The
 * host blocks those copies read stay "pending" (not reusable) until the host
 * clears the swap-in copies.
 *
 * Copy lists are performed by the host in the order swap_out, swap_in,
 * device. That order is correct as long as, between two clears, no block
 * written or read by a pending copy is read by a later copy of an earlier
 * list; the pool enforces it: swap-out refuses (BKV_ESTATE) a sequence with a
 * block that is the source or destination of a pending device copy or the
 * destination of a pending swap-in copy, and swap-in refuses while device
 * copies are pending.
 *
 * A copy-on-write source is flagged COPY_SRC until the host clears the device
 * copies. If its last table reference goes meanwhile it stays pinned (counted
 * in nr_used, on no list) and is released only at the clear: a source can
 * never be reclaimed and rewritten while a copy from it is outstanding, so a
 * scheduler may re-send the same copies after a failed step (they are
 * idempotent). Copy-on-write decisions look at table references (ref) only.
 * An indexed source whose last table reference goes also takes one reference
 * on each of its ancestors (COPY_CHAIN): every pinned indexed block must keep
 * a pinned parent, or the parent could be evicted from under it. The clear
 * releases the source, then its ancestors, child first; a block released
 * late like this moves its cached ancestors up the LRU behind it, so the LRU
 * keeps every cached parent more recent than its children.
 *
 * Transactions (bkv__pool_txn_begin/commit/abort, for the scheduler): inside
 * one, a block that becomes full is not indexed at once but queued on
 * txn_pending (its queue position kept in its otherwise unused `prev` link);
 * commit indexes the queue in fill order, abort forgets it. No lookup can then
 * hit a block whose KV the current step has not computed yet. Commit first
 * hashes the queued blocks whose parents are indexed and prefetches their
 * index slots (the index is large and each insert lands on a cold line), so
 * the misses overlap instead of coming one insert at a time.
 *
 * KV events (for cluster routers): prefix.c writes a STORED or REMOVED event
 * into a preallocated ring wherever a block enters or leaves the index, and
 * reset_cache writes one CLEARED; bkv_pool_events drains it. Export copies a
 * sequence's table, tokens and chained hashes into caller arrays; import
 * opens a sequence and appends the tokens (prefix hits are shared), then
 * lists (source block, new block) transfers for every block not hit; a
 * failing append gives the opened slot back untouched (slot_unopen).
 *
 * bkv_pool_check's invariant numbers are the CHECK_* values below.
 */
#include "internal.h"

#include <string.h>

#define SEQ_SLOT_BITS BKV__SEQ_SLOT_BITS /* internal.h: the scheduler decodes
						ids too (bkv__append_fast) */
#define SEQ_SLOT_MASK BKV__SEQ_SLOT_MASK
#define SEQ_GEN_MAX 0xFFFu

/* The metadata size docs/benchmarks.md reports. */
_Static_assert(sizeof(bkv__block) == 40, "bkv__block grew");

/* bkv_pool_check's answers: the first violated invariant. */
enum {
	CHECK_OK = 0,
	CHECK_COUNTS = 1,      /* nr_free + nr_used + nr_cached != device_blocks */
	CHECK_FREE_LIST = 2,   /* free list: length != nr_free, a cycle, or a
				  member pinned or indexed */
	CHECK_LRU = 3,         /* LRU: length != nr_cached, broken prev links,
				  or a member pinned or not indexed */
	CHECK_STATES = 4,      /* per-block state counts != nr_used, nr_free,
				  nr_cached, nr_indexed */
	CHECK_FILL = 5,        /* fill > block_tokens, or an indexed block not
				  full */
	CHECK_INDEX = 6,       /* index entries != indexed blocks, or an indexed
				  block not findable by its hash */
	CHECK_PARENT = 7,      /* an indexed block's parent is not indexed, or
				  a pinned indexed block's parent is not
				  pinned */
	CHECK_LRU_ORDER = 8,   /* a cached block's parent is neither pinned nor
				  more recent on the LRU */
	CHECK_KIDS = 9,        /* kids != indexed blocks naming it as parent */
	CHECK_HASH = 10,       /* an indexed block's hash != its recomputed chain
				  hash (token store damaged) */
	CHECK_SEQS = 11,       /* a slot: n_blocks != ceil(len/bt), bad ids,
				  nr_seqs/nr_swapped/slot ring mismatch */
	CHECK_SEQ_FILL = 12,   /* a device-resident table's block has fewer
				  tokens than the sequence reads from it */
	CHECK_REFS = 13,       /* a ref count != table references + chain
				  references of COPY_CHAIN blocks */
	CHECK_TOKENS = 14,     /* tokens != sum of fill over pinned blocks */
	CHECK_HOST = 15,       /* host tier: free list, states, used blocks !=
				  swapped tables (each exactly once), pending !=
				  swap-in copy sources */
	CHECK_PENDING = 16,    /* a pending copy's block lacks its PEND flag */
	CHECK_TXN = 17,        /* a TXN (queued) block not pinned, not full,
				  indexed, or not at its queue slot (between
				  transactions only the swapped-in blocks an
				  abort carried over are queued) */
};

/* ---- helpers ------------------------------------------------------------- */

static uint32_t log2u(uint32_t v)
{
	uint32_t s = 0;

	while ((1u << s) < v)
		s++;
	return s;
}

static bkv__seq *seq_get(const bkv_pool *pool, uint32_t id)
{
	uint32_t slot = id & SEQ_SLOT_MASK;
	bkv__seq *s;

	if (slot >= pool->cfg.max_seqs)
		return NULL;
	s = &pool->seqs[slot];
	if (s->state == BKV__SEQ_FREE || s->gen != (id >> SEQ_SLOT_BITS))
		return NULL;
	return s;
}

/* A sequence that must be open on the device tier: BKV_OK and *out, or
 * BKV_ENOENT (unknown or closed id), BKV_ESTATE (swapped out). */
static int seq_resident(const bkv_pool *pool, uint32_t id, bkv__seq **out)
{
	bkv__seq *s = seq_get(pool, id);

	if (!s)
		return BKV_ENOENT;
	if (s->state == BKV__SEQ_SWAPPED)
		return BKV_ESTATE;
	*out = s;
	return BKV_OK;
}

static uint32_t seq_id(const bkv_pool *pool, const bkv__seq *s)
{
	return (uint32_t)(s - pool->seqs) | ((uint32_t)s->gen << SEQ_SLOT_BITS);
}

static uint32_t blocks_for(const bkv_pool *pool, uint64_t tokens)
{
	return (uint32_t)((tokens + pool->bt - 1) >> pool->bt_shift);
}

/* Make room for n entries in s's table. 0 or BKV_ENOMEM (table unchanged). */
static int table_reserve(bkv_pool *pool, bkv__seq *s, uint32_t n)
{
	uint32_t cap;
	int32_t *t;

	if (n <= s->cap)
		return 0;
	cap = s->cap ? s->cap : 4;
	while (cap < n)
		cap = cap > UINT32_MAX / 2 ? n : cap * 2;
	if (cap > pool->nb && n <= pool->nb)
		cap = pool->nb;
	if (cap > UINT32_MAX - 3)
		return BKV_ENOMEM;
	cap = (cap + 3) & ~3u; /* a multiple of 4 (bkv__seq.cap) */
	t = bkv__realloc(&pool->alloc, s->table, (size_t)s->cap * sizeof(int32_t),
			 (size_t)cap * sizeof(int32_t));
	if (!t)
		return BKV_ENOMEM;
	s->table = t;
	s->cap = cap;
	return 0;
}

/* Make room for `extra` more copies of one kind. 0 or BKV_ENOMEM. */
static int copies_reserve(bkv_pool *pool, int kind, uint32_t extra)
{
	bkv__copy_list *l = &pool->copies[kind];
	uint64_t need = (uint64_t)l->n + extra, cap;
	bkv_copy *v;

	if (need <= l->cap)
		return 0;
	cap = l->cap ? l->cap : 16;
	while (cap < need)
		cap *= 2;
	if (cap > UINT32_MAX)
		return BKV_ENOMEM;
	v = bkv__realloc(&pool->alloc, l->v, (size_t)l->cap * sizeof(bkv_copy),
			 (size_t)cap * sizeof(bkv_copy));
	if (!v)
		return BKV_ENOMEM;
	l->v = v;
	l->cap = (uint32_t)cap;
	return 0;
}

static void copy_push(bkv_pool *pool, int kind, int32_t src, int32_t dst)
{
	bkv__copy_list *l = &pool->copies[kind];

	BKV_ASSERT(l->n < l->cap);
	l->v[l->n].src = src;
	l->v[l->n].dst = dst;
	l->n++;
}

/* ---- block frames -------------------------------------------------------- */

#if defined(__GNUC__) || defined(__clang__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define NOINLINE __attribute__((noinline))
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define LIKELY(x) (x)
#define NOINLINE
#define PREFETCH(p) ((void)(p))
#endif

/* The free list is empty: evict the oldest cached block. */
static NOINLINE int32_t take_evict(bkv_pool *pool)
{
	int32_t b = bkv__cache_evict(pool);

	BKV_ASSERT(b >= 0);
	return b;
}

/* Take a block for a sequence whose previous block is `parent` (-1: none):
 * pop the free list, or evict the oldest cached block. The caller has made
 * sure one exists. Returns it pinned (ref 1, fill 0). */
static inline int32_t block_take(bkv_pool *pool, int32_t parent)
{
	int32_t b = pool->free_head;
	bkv__block *k;

	if (LIKELY(b >= 0)) {
		k = &pool->blk[b];
		pool->free_head = k->next;
		pool->nr_free--;
	} else {
		b = take_evict(pool);
		k = &pool->blk[b];
	}
	BKV_ASSERT(k->ref == 0 && !BLOCK_IS_INDEXED(k) && k->kids == 0);
	k->ref = 1;
	k->fill = 0;
	k->parent = parent;
	k->next = k->prev = -1;
	pool->nr_used++;
	return b;
}

/* Add a reference to a block found by a prefix lookup. */
static inline void block_pin(bkv_pool *pool, int32_t b)
{
	bkv__block *k = &pool->blk[b];

	if (k->ref++ == 0 && !(k->flags & BKV__BLOCK_COPY_SRC)) {
		bkv__lru_unlink(pool, b);
		pool->nr_used++;
		pool->tokens += k->fill;
	}
}

static void block_release(bkv_pool *pool, int32_t b, int drop);

/* Keep every cached ancestor from `a` up more recent than its child on the
 * LRU. Releases run last to first, so a parent is normally still pinned and
 * this is not called; a late release (a copy-on-write source freed when its
 * copy is cleared, after its sequence closed) moves the cached ancestors up
 * behind it, so eviction still takes children first. */
static NOINLINE void lru_lift(bkv_pool *pool, int32_t a)
{
	for (; a >= 0 && BLOCK_IS_CACHED(&pool->blk[a]); a = pool->blk[a].parent) {
		bkv__lru_unlink(pool, a);
		bkv__lru_push(pool, a);
	}
}

/* The last table reference of a block that is indexed, a pending copy's
 * source or queued in a transaction went. */
static NOINLINE void block_put_slow(bkv_pool *pool, int32_t b, int drop)
{
	bkv__block *k = &pool->blk[b];

	k->flags &= ~BKV__BLOCK_TXN;
	if (k->flags & BKV__BLOCK_COPY_SRC) {
		/* Stays pinned until its pending copy is cleared. Indexed, it
		 * must keep its chain pinned too (its parent is still pinned:
		 * tables release last to first), or the parent could be
		 * evicted under it. */
		if (BLOCK_IS_INDEXED(k) && k->parent >= 0 && !(k->flags & BKV__BLOCK_COPY_CHAIN)) {
			int32_t a;

			k->flags |= BKV__BLOCK_COPY_CHAIN;
			for (a = k->parent; a >= 0; a = pool->blk[a].parent) {
				BKV_ASSERT(BLOCK_IS_PINNED(&pool->blk[a]));
				pool->blk[a].ref++;
			}
		}
		return;
	}
	block_release(pool, b, drop);
}

/* Drop a table reference. At zero: to the LRU tail if indexed (unless
 * dropping and it has no indexed children), else to the free list head. */
static inline void block_put(bkv_pool *pool, int32_t b, int drop)
{
	bkv__block *k = &pool->blk[b];

	BKV_ASSERT(k->ref > 0);
	if (--k->ref)
		return;
	if (LIKELY(!(k->flags & (BKV__BLOCK_INDEXED | BKV__BLOCK_COPY_SRC | BKV__BLOCK_TXN)))) {
		pool->nr_used--;
		pool->tokens -= k->fill;
		k->next = pool->free_head;
		pool->free_head = b;
		pool->nr_free++;
		return;
	}
	if (!drop && !(k->flags & (BKV__BLOCK_COPY_SRC | BKV__BLOCK_TXN))) {
		/* indexed: cached on the LRU tail */
		pool->nr_used--;
		pool->tokens -= k->fill;
		bkv__lru_push(pool, b);
		if (k->parent >= 0 && BLOCK_IS_CACHED(&pool->blk[k->parent]))
			lru_lift(pool, k->parent);
		return;
	}
	block_put_slow(pool, b, drop);
}

/* A block no longer pinned by anything: to the LRU tail if indexed (unless
 * dropping and it has no indexed children), else to the free list head. */
static void block_release(bkv_pool *pool, int32_t b, int drop)
{
	bkv__block *k = &pool->blk[b];

	pool->nr_used--;
	pool->tokens -= k->fill;
	if (BLOCK_IS_INDEXED(k)) {
		if (!drop || k->kids > 0) {
			bkv__lru_push(pool, b);
			lru_lift(pool, k->parent);
			return;
		}
		bkv__cache_forget(pool, b);
	}
	k->next = pool->free_head;
	pool->free_head = b;
	pool->nr_free++;
}

/* Block s->table[pos] just became full: offer it to the prefix cache. Inside
 * a transaction it is queued, and the queue entry remembers where it sits
 * (sequence slot, table position), so that commit can put the cached copy in
 * its place when the same content is indexed already (txn_dedupe). */
static inline void block_filled(bkv_pool *pool, const bkv__seq *s, uint32_t pos)
{
	int32_t b = s->table[pos];
	const bkv__block *k = &pool->blk[b];

	if (!pool->index)
		return;
	(void)bkv__cache_add(pool, b, s->key);
	if (pool->txn_active && (k->flags & BKV__BLOCK_TXN))
		pool->txn_owner[k->prev] = (uint64_t)(uint32_t)(s - pool->seqs) << 32 | pos;
}

static void host_push(bkv_pool *pool, int32_t h)
{
	pool->host_next[h] = pool->host_free_head;
	pool->host_free_head = h;
	pool->host_state[h] = BKV__HOST_FREE;
	pool->host_free++;
}

static int32_t host_pop(bkv_pool *pool)
{
	int32_t h = pool->host_free_head;

	BKV_ASSERT(h >= 0);
	pool->host_free_head = pool->host_next[h];
	pool->host_state[h] = BKV__HOST_USED;
	pool->host_free--;
	return h;
}

/* ---- create / destroy ---------------------------------------------------- */

void bkv_pool_config_init(bkv_pool_config *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof *cfg);
	cfg->size = sizeof *cfg;
	cfg->block_tokens = 16;
	cfg->device_blocks = 0;
	cfg->host_blocks = 0;
	cfg->max_seqs = 1024;
	cfg->watermark_blocks = 0;
	cfg->prefix_cache = 1;
	cfg->hash_seed = 0;
}

static int config_valid(const bkv_pool_config *c)
{
	uint32_t i;

	if (c->size < sizeof *c)
		return 0;
	if (c->block_tokens == 0 || c->block_tokens > 65536 ||
	    (c->block_tokens & (c->block_tokens - 1)) != 0)
		return 0;
	if (c->device_blocks == 0 || c->device_blocks > (1u << 30))
		return 0;
	/* slot_mapping holds block * block_tokens + offset as int32_t: every
	 * device slot, up to device_blocks * block_tokens - 1, must fit. */
	if ((uint64_t)c->device_blocks * c->block_tokens > BKV_MAX_TOKEN_SLOTS)
		return 0;
	if (c->host_blocks > (1u << 30))
		return 0;
	if (c->max_seqs == 0 || c->max_seqs > (1u << SEQ_SLOT_BITS))
		return 0;
	if (c->watermark_blocks > c->device_blocks)
		return 0;
	if (c->event_capacity > (1u << 24))
		return 0;
	for (i = 0; i < sizeof c->reserved / sizeof c->reserved[0]; i++)
		if (c->reserved[i])
			return 0;
	return 1;
}

static size_t index_cap(const bkv_pool *pool)
{
	return pool->index ? (size_t)pool->index_mask + 1 : 0;
}

static void pool_free_all(bkv_pool *pool)
{
	const bkv_allocator *a = &pool->alloc;
	size_t nb = pool->nb, nh = pool->nh, bt = pool->bt;
	uint32_t i, ms = pool->cfg.max_seqs;

	if (pool->seqs)
		for (i = 0; i < ms; i++)
			bkv__free(a, pool->seqs[i].table,
				  (size_t)pool->seqs[i].cap * sizeof(int32_t));
	for (i = 0; i < 3; i++)
		bkv__free(a, pool->copies[i].v, (size_t)pool->copies[i].cap * sizeof(bkv_copy));
	bkv__free(a, pool->seqs, ms * sizeof(bkv__seq));
	bkv__free(a, pool->slot_ring, ms * sizeof(uint32_t));
	bkv__free(a, pool->host_tok, nh * bt * sizeof(int32_t));
	bkv__free(a, pool->host_state, nh);
	bkv__free(a, pool->host_next, nh * sizeof(int32_t));
	bkv__free(a, pool->index, index_cap(pool) * sizeof(int32_t));
	bkv__free(a, pool->txn_pending, pool->index ? nb * sizeof(int32_t) : 0);
	bkv__free(a, pool->txn_owner, pool->index ? nb * sizeof(uint64_t) : 0);
	bkv__free(a, pool->scratch, (nb > nh ? nb : nh) * sizeof(uint32_t));
	bkv__free(a, pool->ev, pool->ev ? pool->cfg.event_capacity * sizeof(bkv_kv_event) : 0);
	bkv__free(a, pool->tok, nb * bt * sizeof(int32_t));
	bkv__free(a, pool->blk, nb * sizeof(bkv__block));
	bkv__free(a, pool, sizeof *pool);
}

int bkv_pool_create(const bkv_pool_config *cfg, const bkv_allocator *alloc, bkv_pool **out)
{
	bkv_allocator a;
	bkv_pool *pool;
	size_t nb, nh, bt, icap = 0;
	uint32_t i, ms;

	if (!cfg || !out || !config_valid(cfg))
		return BKV_EINVAL;
	bkv__alloc_init(&a, alloc);
	pool = bkv__calloc(&a, 1, sizeof *pool);
	if (!pool)
		return BKV_ENOMEM;
	pool->alloc = a;
	pool->cfg = *cfg;
	pool->cfg.size = sizeof pool->cfg;
	pool->bt = cfg->block_tokens;
	pool->bt_shift = log2u(cfg->block_tokens);
	pool->nb = cfg->device_blocks;
	pool->nh = cfg->host_blocks;
	nb = pool->nb;
	nh = pool->nh;
	bt = pool->bt;
	ms = cfg->max_seqs;
	pool->free_head = pool->lru_head = pool->lru_tail = -1;
	pool->host_free_head = -1;

	/* Sizes cannot overflow size_t on 64-bit hosts (2^30 x 2^16 x 4); the
	 * checks keep 32-bit hosts honest. */
	if (nb > SIZE_MAX / bt / sizeof(bkv__block) || nh > SIZE_MAX / bt / sizeof(int32_t))
		goto nomem;
	if (cfg->prefix_cache) {
		icap = 2;
		while (icap < 2 * nb)
			icap *= 2;
	}
	pool->blk = bkv__malloc(&a, nb * sizeof(bkv__block));
	pool->tok = bkv__malloc(&a, nb * bt * sizeof(int32_t));
	pool->scratch = bkv__malloc(&a, (nb > nh ? nb : nh) * sizeof(uint32_t));
	if (!pool->blk || !pool->tok || !pool->scratch)
		goto nomem;
	if (icap) {
		pool->index = bkv__malloc(&a, icap * sizeof(int32_t));
		if (!pool->index)
			goto nomem;
		pool->index_mask = (uint32_t)(icap - 1);
		memset(pool->index, 0xff, icap * sizeof(int32_t));
		pool->txn_pending = bkv__malloc(&a, nb * sizeof(int32_t));
		pool->txn_owner = bkv__malloc(&a, nb * sizeof(uint64_t));
		if (!pool->txn_pending || !pool->txn_owner)
			goto nomem;
	}
	if (cfg->event_capacity) {
		pool->ev = bkv__malloc(&a, cfg->event_capacity * sizeof(bkv_kv_event));
		if (!pool->ev)
			goto nomem;
	}
	if (nh) {
		pool->host_next = bkv__malloc(&a, nh * sizeof(int32_t));
		pool->host_state = bkv__malloc(&a, nh);
		pool->host_tok = bkv__malloc(&a, nh * bt * sizeof(int32_t));
		if (!pool->host_next || !pool->host_state || !pool->host_tok)
			goto nomem;
	}
	pool->seqs = bkv__calloc(&a, ms, sizeof(bkv__seq));
	pool->slot_ring = bkv__malloc(&a, ms * sizeof(uint32_t));
	if (!pool->seqs || !pool->slot_ring)
		goto nomem;
	/* Copy lists start with room for one CoW per sequence and one swap copy
	 * per host block; they grow (off the steady state) if a caller lets
	 * more accumulate before clearing. */
	if (copies_reserve(pool, BKV_COPY_DEVICE, ms) ||
	    (nh && (copies_reserve(pool, BKV_COPY_SWAP_OUT, (uint32_t)nh) ||
		    copies_reserve(pool, BKV_COPY_SWAP_IN, (uint32_t)nh))))
		goto nomem;

	for (i = 0; i < nb; i++) {
		bkv__block *k = &pool->blk[i];

		memset(k, 0, sizeof *k);
		k->next = i + 1 < nb ? (int32_t)(i + 1) : -1;
		k->prev = -1;
		k->parent = -1;
	}
	/* Touch the token store now: every appended token is written into it,
	 * and left untouched its pages would be mapped on first write - a page
	 * fault inside bkv_seq_append (inside a scheduler step) for every 4 KiB
	 * of blocks the first time they are used. */
	memset(pool->tok, 0, nb * bt * sizeof(int32_t));
	pool->free_head = 0;
	pool->nr_free = (uint32_t)nb;
	for (i = 0; i < nh; i++) {
		pool->host_next[i] = i + 1 < nh ? (int32_t)(i + 1) : -1;
		pool->host_state[i] = BKV__HOST_FREE;
	}
	pool->host_free_head = nh ? 0 : -1;
	pool->host_free = (uint32_t)nh;
	for (i = 0; i < ms; i++) {
		pool->seqs[i].gen = 1;
		pool->slot_ring[i] = i;
	}
	*out = pool;
	return BKV_OK;
nomem:
	pool_free_all(pool);
	return BKV_ENOMEM;
}

void bkv_pool_destroy(bkv_pool *pool)
{
	if (pool)
		pool_free_all(pool);
}

/* ---- sequences ----------------------------------------------------------- */

static bkv__seq *slot_peek(bkv_pool *pool)
{
	if (pool->nr_seqs == pool->cfg.max_seqs)
		return NULL;
	return &pool->seqs[pool->slot_ring[pool->ring_head]];
}

static void slot_open(bkv_pool *pool, bkv__seq *s, uint64_t key)
{
	BKV_ASSERT(s == &pool->seqs[pool->slot_ring[pool->ring_head]]);
	pool->ring_head = pool->ring_head + 1 == pool->cfg.max_seqs ? 0 : pool->ring_head + 1;
	pool->nr_seqs++;
	s->state = BKV__SEQ_OPEN;
	s->key = key;
	s->len = 0;
	s->n_blocks = 0;
}

static void slot_close(bkv_pool *pool, bkv__seq *s)
{
	uint32_t tail = pool->ring_head + (pool->cfg.max_seqs - pool->nr_seqs);

	if (tail >= pool->cfg.max_seqs)
		tail -= pool->cfg.max_seqs;
	pool->slot_ring[tail] = (uint32_t)(s - pool->seqs);
	pool->nr_seqs--;
	s->state = BKV__SEQ_FREE;
	s->len = 0;
	s->n_blocks = 0;
	s->gen = s->gen == SEQ_GEN_MAX ? 1 : (uint16_t)(s->gen + 1);
}

int bkv_seq_open_keyed(bkv_pool *pool, uint64_t key, uint32_t *seq)
{
	bkv__seq *s;

	if (!pool || !seq)
		return BKV_EINVAL;
	s = slot_peek(pool);
	if (!s)
		return BKV_EAGAIN;
	slot_open(pool, s, key);
	*seq = seq_id(pool, s);
	return BKV_OK;
}

int bkv_seq_open(bkv_pool *pool, uint32_t *seq)
{
	return bkv_seq_open_keyed(pool, 0, seq);
}

int bkv_seq_fork(bkv_pool *pool, uint32_t parent, uint32_t *child)
{
	bkv__seq *s, *c;
	uint32_t i;

	if (!pool || !child)
		return BKV_EINVAL;
	s = seq_get(pool, parent);
	if (!s)
		return BKV_ENOENT;
	if (s->state == BKV__SEQ_SWAPPED)
		return BKV_ESTATE;
	c = slot_peek(pool);
	if (!c)
		return BKV_EAGAIN;
	if (table_reserve(pool, c, s->n_blocks))
		return BKV_ENOMEM;
	slot_open(pool, c, s->key);
	for (i = 0; i < s->n_blocks; i++) {
		c->table[i] = s->table[i];
		pool->blk[s->table[i]].ref++;
	}
	c->n_blocks = s->n_blocks;
	c->len = s->len;
	*child = seq_id(pool, c);
	return BKV_OK;
}

static int seq_end(bkv_pool *pool, uint32_t seq, int drop)
{
	bkv__seq *s;
	uint32_t i;

	if (!pool)
		return BKV_EINVAL;
	s = seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	if (s->state == BKV__SEQ_SWAPPED) {
		for (i = s->n_blocks; i-- > 0;)
			host_push(pool, s->table[i]);
		pool->nr_swapped--;
	} else {
		for (i = s->n_blocks; i-- > 0;)
			block_put(pool, s->table[i], drop);
	}
	slot_close(pool, s);
	return BKV_OK;
}

int bkv_seq_close(bkv_pool *pool, uint32_t seq)
{
	return seq_end(pool, seq, 0);
}

int bkv_seq_drop(bkv_pool *pool, uint32_t seq)
{
	return seq_end(pool, seq, 1);
}

/* Does writing at the end of s need a copy-on-write block? */
static int needs_cow(const bkv_pool *pool, const bkv__seq *s)
{
	const bkv__block *k;

	if ((s->len & (pool->bt - 1)) == 0)
		return 0;
	k = &pool->blk[s->table[s->n_blocks - 1]];
	return k->ref > 1 || BLOCK_IS_INDEXED(k);
}

int64_t bkv_seq_blocks_needed(const bkv_pool *pool, uint32_t seq, uint32_t n)
{
	bkv__seq *s = NULL;
	int rc;

	if (!pool)
		return BKV_EINVAL;
	if ((rc = seq_resident(pool, seq, &s)) != BKV_OK)
		return rc;
	if (n == 0)
		return 0;
	/* len + n can pass 2^32 blocks (block_tokens 1 or 2): counted in 64
	 * bits, not through blocks_for's uint32_t */
	return (int64_t)(((uint64_t)s->len + n + pool->bt - 1) >> pool->bt_shift) - s->n_blocks +
	       needs_cow(pool, s);
}

/* The one-token append of a decode step, when it is simple: the last block is
 * private and unindexed with nothing past the end (no copy-on-write, no stale
 * fill), or the sequence ends on a block boundary and needs one new block from
 * a table that has room (with block_tokens >= 2 a single token is never a
 * prefix hit). Returns 0 without touching anything when the general path must
 * decide (errors included). Same effects as the general path. */
static inline int append_one(bkv_pool *pool, bkv__seq *s, int32_t token)
{
	const uint32_t bt = pool->bt, off = s->len & (bt - 1);
	int32_t b;
	bkv__block *k;

	if (bt < 2 || s->len >= INT32_MAX)
		return 0;
	if (off) {
		b = s->table[s->n_blocks - 1];
		k = &pool->blk[b];
		if (k->ref != 1 || k->fill != off || (k->flags & BKV__BLOCK_INDEXED))
			return 0;
	} else {
		if (s->n_blocks >= s->cap || s->n_blocks >= pool->nb ||
		    pool->nr_free + pool->nr_cached == 0)
			return 0;
		b = block_take(pool, s->n_blocks ? s->table[s->n_blocks - 1] : -1);
		s->table[s->n_blocks++] = b;
		k = &pool->blk[b];
	}
	pool->tok[((size_t)b << pool->bt_shift) + off] = token;
	k->fill = off + 1;
	pool->tokens++;
	pool->miss_tokens++;
	s->len++;
	if (off + 1 == bt)
		block_filled(pool, s, s->n_blocks - 1);
	return 1;
}

static NOINLINE int append_any(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n,
				uint32_t *hit_tokens, int nohit);

int bkv_seq_append(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n,
		   uint32_t *hit_tokens)
{
	bkv__seq *s;

	if (LIKELY(pool && tokens && n == 1)) {
		s = seq_get(pool, seq);
		if (s && s->state == BKV__SEQ_OPEN && append_one(pool, s, tokens[0])) {
			if (hit_tokens)
				*hit_tokens = 0;
			BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
			return BKV_OK;
		}
	}
	return append_any(pool, seq, tokens, n, hit_tokens, 0);
}

int bkv__seq_append_private(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n)
{
	return append_any(pool, seq, tokens, n, NULL, 1);
}

void bkv__seq_reserve(bkv_pool *pool, uint32_t seq, uint32_t n_blocks)
{
	bkv__seq *s = seq_get(pool, seq);

	if (s && s->state == BKV__SEQ_OPEN)
		(void)table_reserve(pool, s, BKV_MIN(n_blocks, pool->nb));
}

/* bkv__append_fast's other cases (internal.h): a block boundary takes
 * append_one's boundary path, the rest the general one. */
int bkv__seq_append1_slow(bkv_pool *pool, uint32_t seq, int32_t token, uint32_t *hit,
			  const bkv__seq **out)
{
	bkv__seq *s = seq_get(pool, seq);
	int rc;

	if (s && s->state == BKV__SEQ_OPEN && append_one(pool, s, token)) {
		*hit = 0;
		*out = s;
		BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
		return BKV_OK;
	}
	/* a decode row writes its token: never a prefix hit (possible only
	 * with block_tokens 1), so its slot is in a private block */
	rc = append_any(pool, seq, &token, 1, hit, 1);
	if (rc == BKV_OK)
		*out = seq_get(pool, seq);
	return rc;
}

/* The leading whole blocks of tokens[0, max * block_tokens) the cache holds
 * after the sequence's last block `parent` (-1: none; its chain hash ph),
 * written into s->table from n_blocks on (not visible until n_blocks moves;
 * the caller pins them) and counted; *relinked gets how many of them are on
 * the LRU. The table has room for max more entries. */
static uint32_t find_hits(const bkv_pool *pool, bkv__seq *s, int32_t parent, uint64_t ph,
			  const int32_t *tokens, uint32_t max, uint32_t *relinked)
{
	uint32_t hits = 0, nb0 = s->n_blocks;
	uint64_t h = 0;

	*relinked = 0;
	while (hits < max) {
		int32_t c = bkv__cache_lookup(pool, ph, parent, s->key,
					      tokens + (size_t)hits * pool->bt, &h);

		if (c < 0)
			break;
		*relinked += BLOCK_IS_CACHED(&pool->blk[c]);
		s->table[nb0 + hits] = c;
		ph = h;
		parent = c;
		hits++;
	}
	return hits;
}

/* Any append: validation, prefix hits (none with nohit: every token is
 * written, into private blocks), copy-on-write, whole blocks. */
static NOINLINE int append_any(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n,
				uint32_t *hit_tokens, int nohit)
{
	uint32_t bt, off, nb0, new_len, new_blocks, hits = 0, relinked = 0, pos, rem, i;
	int32_t last, b;
	uint64_t need;
	bkv__seq *s = NULL;
	int cow, rc;

	if (!pool || (!tokens && n))
		return BKV_EINVAL;
	if ((rc = seq_resident(pool, seq, &s)) != BKV_OK)
		return rc;
	if (n == 0) {
		if (hit_tokens)
			*hit_tokens = 0;
		return BKV_OK;
	}
	if ((uint64_t)s->len + n > INT32_MAX)
		return BKV_E2BIG;
	bt = pool->bt;
	new_len = s->len + n;
	new_blocks = blocks_for(pool, new_len);
	if (new_blocks > pool->nb)
		return BKV_E2BIG;
	if (table_reserve(pool, s, new_blocks))
		return BKV_ENOMEM;

	off = s->len & (bt - 1);
	nb0 = s->n_blocks;
	last = nb0 ? s->table[nb0 - 1] : -1;
	cow = needs_cow(pool, s);

	/* Pre-pass: verified prefix hits, stashed past the table's end (not
	 * visible until n_blocks moves). */
	if (pool->index && !nohit && off == 0 &&
	    (last < 0 || BLOCK_IS_INDEXED(&pool->blk[last])))
		hits = find_hits(pool, s, last, last < 0 ? BKV__HASH_ROOT : pool->blk[last].hash,
				 tokens, n / bt, &relinked);
	BKV_ASSERT(relinked <= pool->nr_cached);
	need = (uint64_t)new_blocks - nb0 - hits + (uint64_t)cow;
	if (need > (uint64_t)pool->nr_free + pool->nr_cached - relinked)
		return BKV_ENOSPC;
	if (cow && copies_reserve(pool, BKV_COPY_DEVICE, 1))
		return BKV_ENOMEM;

	/* Commit. */
	for (i = 0; i < hits; i++)
		block_pin(pool, s->table[nb0 + i]);
	s->n_blocks = nb0 + hits;
	pos = hits * bt;
	rem = n - pos;
	if (rem && off) {
		bkv__block *k;
		uint32_t w;

		b = last;
		if (cow) {
			int32_t nb = block_take(pool, nb0 >= 2 ? s->table[nb0 - 2] : -1);

			memcpy(pool->tok + (size_t)nb * bt, pool->tok + (size_t)b * bt,
			       (size_t)off * sizeof(int32_t));
			pool->blk[nb].fill = off;
			pool->tokens += off;
			copy_push(pool, BKV_COPY_DEVICE, b, nb);
			pool->blk[b].flags |= BKV__BLOCK_PEND_DEV;
			pool->blk[nb].flags |= BKV__BLOCK_PEND_DEV;
			pool->cow_copies++;
			s->table[nb0 - 1] = nb;
			pool->blk[b].flags |= BKV__BLOCK_COPY_SRC;
			block_put(pool, b, 0);
			b = nb;
		}
		k = &pool->blk[b];
		BKV_ASSERT(k->ref == 1 && !BLOCK_IS_INDEXED(k) && k->fill >= off);
		k->flags &= ~BKV__BLOCK_TXN; /* rewritten: queued again if it fills */
		pool->tokens -= k->fill - off;
		w = BKV_MIN(bt - off, rem);
		memcpy(pool->tok + (size_t)b * bt + off, tokens + pos, (size_t)w * sizeof(int32_t));
		k->fill = off + w;
		pool->tokens += w;
		pos += w;
		rem -= w;
		if (off + w == bt)
			block_filled(pool, s, nb0 - 1);
	}
	if (rem) {
		int32_t *table = s->table, prev = s->n_blocks ? table[s->n_blocks - 1] : -1;
		uint32_t nbk = s->n_blocks;

		pool->tokens += rem;
		while (rem) {
			uint32_t w = BKV_MIN(bt, rem);
			int32_t *dst;

			b = block_take(pool, prev);
			dst = pool->tok + (size_t)b * bt;
			if (w == 1)
				dst[0] = tokens[pos];
			else
				memcpy(dst, tokens + pos, (size_t)w * sizeof(int32_t));
			pool->blk[b].fill = w;
			table[nbk++] = b;
			pos += w;
			rem -= w;
			if (w == bt)
				block_filled(pool, s, nbk - 1);
			prev = b;
		}
		s->n_blocks = nbk;
	}
	BKV_ASSERT(s->n_blocks == new_blocks);
	s->len = new_len;
	pool->hit_tokens += (uint64_t)hits * bt;
	pool->miss_tokens += n - (uint64_t)hits * bt;
	if (hit_tokens)
		*hit_tokens = hits * bt;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

int bkv__seq_take_hits(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n)
{
	uint32_t bt = pool->bt, off, nb0, hits = 0, got = 0, i, relinked;
	uint64_t ph = BKV__HASH_ROOT, h = 0;
	int32_t parent = -1, last;
	bkv__seq *s = NULL;

	if (!pool->index || seq_resident(pool, seq, &s) != BKV_OK || n == 0)
		return 0;
	if ((uint64_t)s->len + n > INT32_MAX)
		return 0;
	off = s->len & (bt - 1);
	nb0 = s->n_blocks;
	last = nb0 ? s->table[nb0 - 1] : -1;
	if (off) {
		/* The last block is partial: its own tokens and the next bt - off
		 * make a full block, which the cache may hold. Only a private
		 * block nothing else reads is swapped out. */
		bkv__block *k = &pool->blk[last];
		int32_t c, *t = pool->tok + (size_t)last * bt;

		if (n < bt - off || k->ref != 1 || BLOCK_IS_INDEXED(k) || k->fill != off ||
		    (k->flags & (BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN | BKV__BLOCK_TXN |
				 BKV__BLOCK_COPY_SRC)) ||
		    (k->parent >= 0 && !BLOCK_IS_INDEXED(&pool->blk[k->parent])))
			return 0;
		/* the private block's token ids past fill are scratch */
		memcpy(t + off, tokens, (size_t)(bt - off) * sizeof(int32_t));
		if (k->parent >= 0)
			ph = pool->blk[k->parent].hash;
		c = bkv__cache_lookup(pool, ph, k->parent, s->key, t, &h);
		if (c < 0)
			return 0;
		block_pin(pool, c);
		s->table[nb0 - 1] = c;
		block_put(pool, last, 1);
		got = bt - off;
		ph = h;
		parent = c;
	} else if (last >= 0) {
		if (!BLOCK_IS_INDEXED(&pool->blk[last]))
			return 0;
		ph = pool->blk[last].hash;
		parent = last;
	}
	/* then whole blocks, as append_any's pre-pass (pinned as found: there
	 * is nothing to undo, each is a complete hit) */
	if (table_reserve(pool, s, BKV_MIN(blocks_for(pool, (uint64_t)s->len + n), pool->nb)))
		return (int)got;
	hits = find_hits(pool, s, parent, ph, tokens + got,
			 BKV_MIN((n - got) / bt, s->cap - nb0), &relinked);
	for (i = 0; i < hits; i++)
		block_pin(pool, s->table[nb0 + i]);
	s->n_blocks = nb0 + hits;
	got += hits * bt;
	s->len += got;
	pool->hit_tokens += got;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return (int)got;
}

int bkv_seq_truncate(bkv_pool *pool, uint32_t seq, uint32_t new_len)
{
	bkv__seq *s = NULL;
	uint32_t nbk, i;
	int rc;

	if (!pool)
		return BKV_EINVAL;
	if ((rc = seq_resident(pool, seq, &s)) != BKV_OK)
		return rc;
	if (new_len > s->len)
		return BKV_EINVAL;
	nbk = blocks_for(pool, new_len);
	for (i = s->n_blocks; i-- > nbk;)
		block_put(pool, s->table[i], 0);
	s->n_blocks = nbk;
	if (nbk) {
		bkv__block *k = &pool->blk[s->table[nbk - 1]];
		uint32_t off = new_len - (nbk - 1) * pool->bt;

		/* A private, unindexed block forgets the tokens cut off. */
		if (k->ref == 1 && !BLOCK_IS_INDEXED(k) && k->fill > off) {
			pool->tokens -= k->fill - off;
			k->fill = off;
			k->flags &= ~BKV__BLOCK_TXN; /* no longer full: unqueued */
		}
	}
	s->len = new_len;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

const int32_t *bkv_seq_blocks(const bkv_pool *pool, uint32_t seq, uint32_t *n_blocks)
{
	const bkv__seq *s = pool ? seq_get(pool, seq) : NULL;

	if (n_blocks)
		*n_blocks = s ? s->n_blocks : 0;
	if (!s)
		return NULL;
	return s->table;
}

int bkv_seq_info_get(const bkv_pool *pool, uint32_t seq, bkv_seq_info *info)
{
	const bkv__seq *s;

	if (!pool || !info)
		return BKV_EINVAL;
	s = seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	info->len = s->len;
	info->n_blocks = s->n_blocks;
	info->swapped = s->state == BKV__SEQ_SWAPPED;
	info->key = s->key;
	return BKV_OK;
}

/* ---- swap ---------------------------------------------------------------- */

/* Tokens of logical block i of a sequence of len tokens. */
static uint32_t block_len(const bkv_pool *pool, uint32_t len, uint32_t i)
{
	uint32_t start = i * pool->bt;

	return BKV_MIN(pool->bt, len - start);
}

int bkv_seq_swap_out(bkv_pool *pool, uint32_t seq)
{
	const uint32_t pend = BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN;
	bkv__copy_list *l;
	bkv__seq *s;
	uint32_t i, first;

	if (!pool)
		return BKV_EINVAL;
	s = seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	if (s->state == BKV__SEQ_SWAPPED || pool->nh == 0)
		return BKV_ESTATE;
	for (i = 0; i < s->n_blocks; i++)
		if (pool->blk[s->table[i]].flags & pend)
			return BKV_ESTATE;
	if (s->n_blocks > pool->host_free)
		return BKV_ENOSPC;
	if (copies_reserve(pool, BKV_COPY_SWAP_OUT, s->n_blocks))
		return BKV_ENOMEM;

	l = &pool->copies[BKV_COPY_SWAP_OUT];
	first = l->n;
	for (i = 0; i < s->n_blocks; i++) {
		int32_t d = s->table[i], h = host_pop(pool);

		memcpy(pool->host_tok + (size_t)h * pool->bt, pool->tok + (size_t)d * pool->bt,
		       (size_t)block_len(pool, s->len, i) * sizeof(int32_t));
		copy_push(pool, BKV_COPY_SWAP_OUT, d, h);
	}
	for (i = s->n_blocks; i-- > 0;) {
		block_put(pool, s->table[i], 0);
		s->table[i] = l->v[first + i].dst;
	}
	pool->swap_out_blocks += s->n_blocks;
	s->state = BKV__SEQ_SWAPPED;
	pool->nr_swapped++;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

int bkv_seq_swap_in(bkv_pool *pool, uint32_t seq)
{
	uint32_t bt, i, n_full, hits = 0, relinked = 0;
	uint64_t ph = BKV__HASH_ROOT, h = 0;
	int32_t parent = -1;
	bkv__seq *s;

	if (!pool)
		return BKV_EINVAL;
	s = seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	if (s->state != BKV__SEQ_SWAPPED || pool->copies[BKV_COPY_DEVICE].n)
		return BKV_ESTATE;
	bt = pool->bt;
	n_full = s->len >> pool->bt_shift;

	/* Pre-pass: leading full blocks still in the prefix cache. */
	if (pool->index) {
		while (hits < n_full) {
			int32_t c = bkv__cache_lookup(pool, ph, parent, s->key,
						      pool->host_tok + (size_t)s->table[hits] * bt,
						      &h);

			if (c < 0)
				break;
			relinked += BLOCK_IS_CACHED(&pool->blk[c]);
			ph = h;
			parent = c;
			hits++;
		}
	}
	BKV_ASSERT(relinked <= pool->nr_cached);
	if ((uint64_t)s->n_blocks - hits > (uint64_t)pool->nr_free + pool->nr_cached - relinked)
		return BKV_ENOSPC;
	if (copies_reserve(pool, BKV_COPY_SWAP_IN, s->n_blocks - hits))
		return BKV_ENOMEM;

	/* Commit: the same walk again (nothing changed), then copies. */
	ph = BKV__HASH_ROOT;
	parent = -1;
	for (i = 0; i < hits; i++) {
		int32_t c = bkv__cache_lookup(pool, ph, parent, s->key,
					      pool->host_tok + (size_t)s->table[i] * bt, &h);

		BKV_ASSERT(c >= 0);
		block_pin(pool, c);
		host_push(pool, s->table[i]);
		s->table[i] = c;
		ph = h;
		parent = c;
	}
	for (i = hits; i < s->n_blocks; i++) {
		int32_t hb = s->table[i], d = block_take(pool, i ? s->table[i - 1] : -1);
		uint32_t w = block_len(pool, s->len, i);

		memcpy(pool->tok + (size_t)d * bt, pool->host_tok + (size_t)hb * bt,
		       (size_t)w * sizeof(int32_t));
		pool->blk[d].fill = w;
		pool->blk[d].flags |= BKV__BLOCK_PEND_SWAPIN;
		pool->tokens += w;
		copy_push(pool, BKV_COPY_SWAP_IN, hb, d);
		pool->host_state[hb] = BKV__HOST_PENDING;
		pool->host_pending++;
		s->table[i] = d;
		if (w == bt)
			block_filled(pool, s, i);
	}
	pool->swap_in_blocks += s->n_blocks - hits;
	s->state = BKV__SEQ_OPEN;
	pool->nr_swapped--;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

/* ---- copies, admission, reset, stats ------------------------------------- */

uint32_t bkv_pool_copies(const bkv_pool *pool, bkv_copy_kind kind, const bkv_copy **out)
{
	if (out)
		*out = NULL;
	if (!pool || (unsigned)kind > BKV_COPY_SWAP_IN)
		return 0;
	if (out)
		*out = pool->copies[kind].v;
	return pool->copies[kind].n;
}

void bkv_pool_clear_copies(bkv_pool *pool, bkv_copy_kind kind)
{
	bkv__copy_list *l;
	uint32_t i;

	if (!pool || (unsigned)kind > BKV_COPY_SWAP_IN)
		return;
	l = &pool->copies[kind];
	for (i = 0; i < l->n; i++) {
		if (kind == BKV_COPY_DEVICE) {
			pool->blk[l->v[i].src].flags &= ~BKV__BLOCK_PEND_DEV;
			pool->blk[l->v[i].dst].flags &= ~BKV__BLOCK_PEND_DEV;
			if (pool->blk[l->v[i].src].flags & BKV__BLOCK_COPY_SRC) {
				bkv__block *k = &pool->blk[l->v[i].src];
				int chain = (k->flags & BKV__BLOCK_COPY_CHAIN) != 0;
				int32_t a;

				k->flags &= ~(BKV__BLOCK_COPY_SRC | BKV__BLOCK_COPY_CHAIN);
				if (k->ref == 0)
					block_release(pool, l->v[i].src, 0);
				/* then its ancestors, child first (the LRU order) */
				for (a = chain ? k->parent : -1; a >= 0;) {
					int32_t up = pool->blk[a].parent;

					block_put(pool, a, 0);
					a = up;
				}
			}
		} else if (kind == BKV_COPY_SWAP_IN) {
			pool->blk[l->v[i].dst].flags &= ~BKV__BLOCK_PEND_SWAPIN;
			BKV_ASSERT(pool->host_state[l->v[i].src] == BKV__HOST_PENDING);
			pool->host_pending--;
			host_push(pool, l->v[i].src);
		}
	}
	l->n = 0;
}

uint32_t bkv_pool_available(const bkv_pool *pool)
{
	return pool ? pool->nr_free + pool->nr_cached : 0;
}

int bkv_pool_can_admit(const bkv_pool *pool, uint32_t n_tokens)
{
	uint64_t avail;

	if (!pool)
		return 0;
	avail = (uint64_t)pool->nr_free + pool->nr_cached;
	return avail >= (uint64_t)blocks_for(pool, n_tokens) + pool->cfg.watermark_blocks;
}

int bkv_pool_reset_cache(bkv_pool *pool)
{
	uint32_t i;

	if (!pool)
		return BKV_EINVAL;
	/* Oldest first onto the free head: the newest cached block is reused
	 * first afterwards. */
	while (pool->lru_head >= 0) {
		int32_t b = pool->lru_head;

		bkv__lru_unlink(pool, b);
		pool->blk[b].next = pool->free_head;
		pool->free_head = b;
		pool->nr_free++;
	}
	for (i = 0; i < pool->nb; i++) {
		pool->blk[i].flags &= ~BKV__BLOCK_INDEXED;
		pool->blk[i].kids = 0;
	}
	if (pool->index)
		memset(pool->index, 0xff, index_cap(pool) * sizeof(int32_t));
	pool->nr_indexed = 0;
	bkv__event(pool, BKV_EVENT_CLEARED, -1);
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

void bkv_pool_stats_get(const bkv_pool *pool, bkv_pool_stats *stats)
{
	bkv_pool_stats st;
	size_t n;

	if (!stats)
		return;
	n = stats->size ? BKV_MIN((size_t)stats->size, sizeof st) : sizeof st;
	memset(&st, 0, sizeof st);
	if (pool) {
		st.block_tokens = pool->bt;
		st.device_blocks = pool->nb;
		st.host_blocks = pool->nh;
		st.nr_free = pool->nr_free;
		st.nr_used = pool->nr_used;
		st.nr_cached = pool->nr_cached;
		st.nr_indexed = pool->nr_indexed;
		st.host_free = pool->host_free;
		st.host_used = pool->nh - pool->host_free;
		st.nr_seqs = pool->nr_seqs;
		st.nr_swapped = pool->nr_swapped;
		st.tokens = pool->tokens;
		st.waste_slots = (uint64_t)pool->nr_used * pool->bt - pool->tokens;
		st.hit_tokens = pool->hit_tokens;
		st.miss_tokens = pool->miss_tokens;
		st.evictions = pool->evictions;
		st.cow_copies = pool->cow_copies;
		st.swap_out_blocks = pool->swap_out_blocks;
		st.swap_in_blocks = pool->swap_in_blocks;
		st.events = pool->ev_seq;
		st.events_dropped = pool->ev_dropped;
		st.dup_blocks = pool->dedup_blocks;
	}
	st.size = (uint32_t)n;
	memcpy(stats, &st, n);
}

/* ---- KV events, export and import ----------------------------------------- */

uint32_t bkv_pool_events(bkv_pool *pool, bkv_kv_event *out, uint32_t max)
{
	uint32_t n, cap, first;

	if (!pool || !out || !pool->ev)
		return 0;
	cap = pool->cfg.event_capacity;
	n = BKV_MIN(max, pool->ev_n);
	first = BKV_MIN(n, cap - pool->ev_head); /* up to the ring's end */
	memcpy(out, pool->ev + pool->ev_head, first * sizeof *out);
	memcpy(out + first, pool->ev, (n - first) * sizeof *out);
	pool->ev_head += n;
	if (pool->ev_head >= cap)
		pool->ev_head -= cap;
	pool->ev_n -= n;
	return n;
}

int bkv_seq_export(const bkv_pool *pool, uint32_t seq, bkv_seq_image *exp)
{
	bkv__seq *s = NULL;
	uint32_t i, bt;
	uint64_t ph = BKV__HASH_ROOT;
	int rc;

	if (!pool || !exp || exp->size < sizeof *exp)
		return BKV_EINVAL;
	if ((rc = seq_resident(pool, seq, &s)) != BKV_OK)
		return rc;
	exp->len = s->len;
	exp->n_blocks = s->n_blocks;
	if (exp->cap_blocks < s->n_blocks || exp->cap_tokens < s->len)
		return BKV_E2BIG;
	if (s->n_blocks && (!exp->blocks || !exp->hashes || !exp->tokens))
		return BKV_EINVAL;
	bt = pool->bt;
	exp->block_tokens = bt;
	exp->key = s->key;
	exp->hash_seed = pool->cfg.hash_seed;
	for (i = 0; i < s->n_blocks; i++) {
		int32_t b = s->table[i];
		uint32_t n = block_len(pool, s->len, i);

		exp->blocks[i] = b;
		memcpy(exp->tokens + (size_t)i * bt, pool->tok + (size_t)b * bt,
		       n * sizeof(int32_t));
		if (n == bt) {
			ph = bkv__block_hash(pool->cfg.hash_seed, ph, s->key,
					     pool->tok + (size_t)b * bt, bt);
			exp->hashes[i] = ph;
		} else {
			exp->hashes[i] = 0;
		}
	}
	return BKV_OK;
}

/* Undo slot_open of a slot nothing was put in (import's failure path), so
 * that the slot ring, the generation and nr_seqs are as before. */
static void slot_unopen(bkv_pool *pool, bkv__seq *s)
{
	pool->ring_head = pool->ring_head ? pool->ring_head - 1 : pool->cfg.max_seqs - 1;
	BKV_ASSERT(&pool->seqs[pool->slot_ring[pool->ring_head]] == s);
	pool->nr_seqs--;
	s->state = BKV__SEQ_FREE;
}

/* Is an image fit to import? Every field is checked against the image's own
 * capacities and this pool's geometry before any array entry is read: the
 * image may come off a network, so its counts are not trusted. BKV_OK,
 * BKV_EINVAL (inconsistent or damaged) or BKV_E2BIG (larger than the pool). */
static int image_valid(const bkv_pool *pool, const bkv_seq_image *exp)
{
	uint32_t bt = pool->bt, i;
	uint64_t ph = BKV__HASH_ROOT;

	if (exp->size < sizeof *exp || exp->block_tokens != bt || exp->len == 0 ||
	    exp->n_blocks != blocks_for(pool, exp->len))
		return BKV_EINVAL;
	/* the counts must fit the arrays the image says it carries */
	if (exp->len > exp->cap_tokens || exp->n_blocks > exp->cap_blocks || !exp->tokens ||
	    !exp->blocks)
		return BKV_EINVAL;
	if (exp->n_blocks > pool->nb)
		return BKV_E2BIG;
	for (i = 0; i < exp->n_blocks; i++)
		if (exp->blocks[i] < 0)
			return BKV_EINVAL;
	if (exp->hash_seed != pool->cfg.hash_seed)
		return BKV_OK; /* another seed: the hashes cannot be checked */
	if (!exp->hashes)
		return BKV_EINVAL;
	for (i = 0; i < exp->n_blocks; i++) {
		if ((uint64_t)(i + 1) * bt > exp->len) { /* the partial last block */
			if (exp->hashes[i] != 0)
				return BKV_EINVAL;
			break;
		}
		ph = bkv__block_hash(pool->cfg.hash_seed, ph, exp->key,
				     exp->tokens + (size_t)i * bt, bt);
		if (exp->hashes[i] != ph)
			return BKV_EINVAL;
	}
	return BKV_OK;
}

int bkv_seq_import(bkv_pool *pool, const bkv_seq_image *exp, uint32_t *seq,
		   bkv_copy *transfers, uint32_t *n_transfers)
{
	uint32_t bt, i, hits = 0, id, nt = 0;
	bkv__seq *s;
	int rc;

	if (!pool || !exp || !seq || !transfers || !n_transfers)
		return BKV_EINVAL;
	if ((rc = image_valid(pool, exp)) != BKV_OK)
		return rc;
	bt = pool->bt;
	s = slot_peek(pool);
	if (!s)
		return BKV_EAGAIN;
	slot_open(pool, s, exp->key);
	id = seq_id(pool, s);
	rc = bkv_seq_append(pool, id, exp->tokens, exp->len, &hits);
	if (rc != BKV_OK) {
		slot_unopen(pool, s);
		return rc;
	}
	for (i = hits / bt; i < s->n_blocks; i++) {
		transfers[nt].src = exp->blocks[i];
		transfers[nt].dst = s->table[i];
		nt++;
	}
	*seq = id;
	*n_transfers = nt;
	return BKV_OK;
}

/* ---- the checker --------------------------------------------------------- */

static int check_blocks(const bkv_pool *pool)
{
	uint32_t nb = pool->nb, bt = pool->bt, i, n, used = 0, freec = 0, cached = 0, idx = 0;
	uint32_t *sc = pool->scratch;
	uint64_t tokens = 0;
	int32_t b, prev;

	if ((uint64_t)pool->nr_free + pool->nr_used + pool->nr_cached != nb)
		return CHECK_COUNTS;
	for (n = 0, b = pool->free_head; b >= 0; b = pool->blk[b].next, n++) {
		if ((uint32_t)b >= nb || n >= nb || !BLOCK_IS_FREE(&pool->blk[b]))
			return CHECK_FREE_LIST;
	}
	if (n != pool->nr_free)
		return CHECK_FREE_LIST;
	/* LRU: scratch[b] = 1-based position from the head (older = smaller). */
	memset(sc, 0, (size_t)nb * sizeof *sc);
	for (n = 0, prev = -1, b = pool->lru_head; b >= 0; prev = b, b = pool->blk[b].next) {
		if ((uint32_t)b >= nb || n >= nb || !BLOCK_IS_CACHED(&pool->blk[b]) ||
		    pool->blk[b].prev != prev)
			return CHECK_LRU;
		sc[b] = ++n;
	}
	if (n != pool->nr_cached || pool->lru_tail != prev)
		return CHECK_LRU;
	for (i = 0; i < nb; i++) {
		const bkv__block *k = &pool->blk[i];

		used += BLOCK_IS_PINNED(k);
		freec += BLOCK_IS_FREE(k);
		cached += BLOCK_IS_CACHED(k);
		idx += BLOCK_IS_INDEXED(k);
		if (BLOCK_IS_PINNED(k))
			tokens += k->fill;
		if (k->fill > bt || (BLOCK_IS_INDEXED(k) && k->fill != bt))
			return CHECK_FILL;
	}
	if (used != pool->nr_used || freec != pool->nr_free || cached != pool->nr_cached ||
	    idx != pool->nr_indexed)
		return CHECK_STATES;
	if (tokens != pool->tokens)
		return CHECK_TOKENS;
	/* The index holds exactly the indexed blocks, each findable. */
	if (pool->index) {
		size_t cap = index_cap(pool), j;

		for (n = 0, j = 0; j < cap; j++) {
			b = pool->index[j];
			if (b < 0)
				continue;
			if ((uint32_t)b >= nb || !BLOCK_IS_INDEXED(&pool->blk[b]))
				return CHECK_INDEX;
			n++;
		}
		if (n != pool->nr_indexed)
			return CHECK_INDEX;
	} else if (pool->nr_indexed) {
		return CHECK_INDEX;
	}
	for (i = 0; i < nb; i++) {
		const bkv__block *k = &pool->blk[i];
		const bkv__block *p;

		if (!BLOCK_IS_INDEXED(k))
			continue;
		if (bkv__index_find(pool, k->hash) != (int32_t)i)
			return CHECK_INDEX;
		p = k->parent >= 0 ? &pool->blk[k->parent] : NULL;
		if (k->parent >= (int32_t)nb || (p && !BLOCK_IS_INDEXED(p)) ||
		    (p && BLOCK_IS_PINNED(k) && !BLOCK_IS_PINNED(p)))
			return CHECK_PARENT;
		if (BLOCK_IS_CACHED(k) && p && !BLOCK_IS_PINNED(p) && sc[k->parent] <= sc[i])
			return CHECK_LRU_ORDER;
		if (k->hash != bkv__block_hash(pool->cfg.hash_seed,
					       p ? p->hash : BKV__HASH_ROOT, k->key,
					       pool->tok + (size_t)i * bt, bt))
			return CHECK_HASH;
	}
	/* kids: count indexed children per block. */
	memset(sc, 0, (size_t)nb * sizeof *sc);
	for (i = 0; i < nb; i++)
		if (BLOCK_IS_INDEXED(&pool->blk[i]) && pool->blk[i].parent >= 0)
			sc[pool->blk[i].parent]++;
	for (i = 0; i < nb; i++)
		if (sc[i] != pool->blk[i].kids)
			return CHECK_KIDS;
	return CHECK_OK;
}

static int check_seqs(const bkv_pool *pool)
{
	uint32_t nb = pool->nb, nh = pool->nh, ms = pool->cfg.max_seqs, i, j;
	uint32_t open = 0, swapped = 0, *sc = pool->scratch;
	uint64_t host_refs = 0;

	/* Slots and tables; device references counted into scratch. */
	memset(sc, 0, (size_t)nb * sizeof *sc);
	for (i = 0; i < ms; i++) {
		const bkv__seq *s = &pool->seqs[i];

		if (s->gen == 0 || s->gen > SEQ_GEN_MAX || s->state > BKV__SEQ_SWAPPED)
			return CHECK_SEQS;
		if (s->state == BKV__SEQ_FREE) {
			if (s->n_blocks || s->len)
				return CHECK_SEQS;
			continue;
		}
		open++;
		if (s->n_blocks != blocks_for(pool, s->len) || s->n_blocks > s->cap ||
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
			if (pool->blk[b].fill < block_len(pool, s->len, j))
				return CHECK_SEQ_FILL;
		}
	}
	if (open != pool->nr_seqs || swapped != pool->nr_swapped)
		return CHECK_SEQS;
	for (i = 0; i < ms - open; i++) {
		uint32_t r = pool->ring_head + i;

		if (r >= ms)
			r -= ms;
		if (pool->slot_ring[r] >= ms || pool->seqs[pool->slot_ring[r]].state != BKV__SEQ_FREE)
			return CHECK_SEQS;
	}
	/* an indexed copy source whose tables left holds its ancestors */
	for (i = 0; i < nb; i++) {
		const bkv__block *k = &pool->blk[i];
		int32_t a;

		if (!(k->flags & BKV__BLOCK_COPY_CHAIN))
			continue;
		if (!(k->flags & BKV__BLOCK_COPY_SRC))
			return CHECK_PENDING;
		for (j = 0, a = k->parent; a >= 0; a = pool->blk[a].parent, j++) {
			if ((uint32_t)a >= nb || j >= nb)
				return CHECK_PARENT;
			sc[a]++;
		}
	}
	for (i = 0; i < nb; i++)
		if (sc[i] != pool->blk[i].ref)
			return CHECK_REFS;

	/* Host tier: scratch[h] = references from swapped tables. */
	if (nh) {
		uint32_t n, used = 0, pending = 0;
		const bkv__copy_list *l = &pool->copies[BKV_COPY_SWAP_IN];
		int32_t h;

		memset(sc, 0, (size_t)nh * sizeof *sc);
		for (i = 0; i < ms; i++) {
			const bkv__seq *s = &pool->seqs[i];

			if (s->state == BKV__SEQ_SWAPPED)
				for (j = 0; j < s->n_blocks; j++)
					sc[s->table[j]]++;
		}
		for (n = 0, h = pool->host_free_head; h >= 0; h = pool->host_next[h], n++)
			if ((uint32_t)h >= nh || n >= nh || pool->host_state[h] != BKV__HOST_FREE)
				return CHECK_HOST;
		if (n != pool->host_free)
			return CHECK_HOST;
		for (i = 0; i < l->n; i++) {
			h = l->v[i].src;
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
			    (st == BKV__HOST_PENDING) != (sc[i] == UINT32_MAX))
				return CHECK_HOST;
		}
		if (used != host_refs || pending != pool->host_pending || pending != l->n ||
		    (uint64_t)pool->host_free + used + pending != nh)
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
		if (d->v[i].src < 0 || (uint32_t)d->v[i].src >= pool->nb || d->v[i].dst < 0 ||
		    (uint32_t)d->v[i].dst >= pool->nb ||
		    !(pool->blk[d->v[i].src].flags & BKV__BLOCK_PEND_DEV) ||
		    !(pool->blk[d->v[i].src].flags & BKV__BLOCK_COPY_SRC) ||
		    !(pool->blk[d->v[i].dst].flags & BKV__BLOCK_PEND_DEV))
			return CHECK_PENDING;
	}
	for (i = 0; i < si->n; i++)
		if (si->v[i].dst < 0 || (uint32_t)si->v[i].dst >= pool->nb ||
		    !(pool->blk[si->v[i].dst].flags & BKV__BLOCK_PEND_SWAPIN))
			return CHECK_PENDING;
	return CHECK_OK;
}

/* ---- step transactions (for the scheduler) -------------------------------- */

void bkv__pool_txn_begin(bkv_pool *pool)
{
	BKV_ASSERT(!pool->txn_active);
	pool->txn_active = 1; /* txn_n: entries an abort carried over */
}

/* Queue a block that just became full (called by bkv__cache_add inside a
 * transaction). Stale entries - blocks released since they were queued - are
 * squeezed out when the queue is full; live entries number at most nb. */
void bkv__pool_txn_defer(bkv_pool *pool, int32_t b)
{
	bkv__block *k = &pool->blk[b];
	uint32_t i, n = 0;

	if (k->flags & BKV__BLOCK_TXN)
		return;
	if (pool->txn_n == pool->nb) {
		for (i = 0; i < pool->txn_n; i++) {
			int32_t e = pool->txn_pending[i];
			bkv__block *q = &pool->blk[e];

			if ((q->flags & BKV__BLOCK_TXN) && q->prev == (int32_t)i) {
				q->prev = (int32_t)n;
				pool->txn_owner[n] = pool->txn_owner[i];
				pool->txn_pending[n++] = e;
			}
		}
		pool->txn_n = n;
	}
	BKV_ASSERT(pool->txn_n < pool->nb);
	k->flags |= BKV__BLOCK_TXN;
	k->prev = (int32_t)pool->txn_n;
	pool->txn_owner[pool->txn_n] = UINT64_MAX; /* block_filled sets it */
	pool->txn_pending[pool->txn_n++] = b;
}

/* A queued block that commit would index now, its parent indexed already
 * (a parent queued in the same transaction is indexed first). */
static int txn_ready(const bkv_pool *pool, const bkv__block *k, uint32_t i)
{
	return (k->flags & BKV__BLOCK_TXN) && k->prev == (int32_t)i && k->ref > 0 &&
	       k->fill == pool->bt && !BLOCK_IS_INDEXED(k) &&
	       (k->parent < 0 || BLOCK_IS_INDEXED(&pool->blk[k->parent]));
}

/* Before commit indexes its queue: hash every block whose parent is indexed
 * already and prefetch its index slot, then prefetch the block each of
 * those slots names (the probe compares its hash). The index is large and
 * each insert touches a random line of it, usually not in any cache: done
 * one by one, every insert waits for main memory, twice. */
static void txn_prefetch(bkv_pool *pool)
{
	uint32_t i;

	for (i = 0; i < pool->txn_n; i++) {
		bkv__block *k = &pool->blk[pool->txn_pending[i]];

		if (!txn_ready(pool, k, i))
			continue;
		k->hash = bkv__cache_hash(pool, pool->txn_pending[i], k->key);
		k->flags |= BKV__BLOCK_HASHED;
		PREFETCH(&pool->index[bkv__index_home(pool, k->hash)]);
	}
	for (i = 0; i < pool->txn_n; i++) {
		const bkv__block *k = &pool->blk[pool->txn_pending[i]];
		int32_t e;

		if (!(k->flags & BKV__BLOCK_HASHED))
			continue;
		e = pool->index[bkv__index_home(pool, k->hash)];
		if (e >= 0)
			PREFETCH(&pool->blk[e]);
	}
}

/* Commit found b's content indexed already, as block d (queue entry q): the
 * step computed KV that the cache holds. Put d in b's place in the table
 * that filled it and free b, so that the sequence's chain runs through
 * indexed blocks and the blocks it fills later can be indexed too (a chain
 * with a private duplicate in it stops there: a block is indexed only under
 * an indexed parent). d's KV is b's (same tokens under the same parent and
 * key), written by an earlier successful call or earlier in this commit's
 * call. Only a private block that nothing else reads (one reference, no
 * pending copy) in a table that still holds it at the recorded place. */
static void txn_dedupe(bkv_pool *pool, uint32_t q, int32_t b, int32_t d)
{
	bkv__block *k = &pool->blk[b];
	const bkv__block *c = &pool->blk[d];
	uint64_t own = pool->txn_owner[q];
	uint32_t slot = (uint32_t)(own >> 32), pos = (uint32_t)own;
	bkv__seq *s;

	if (own == UINT64_MAX || slot >= pool->cfg.max_seqs || k->ref != 1 ||
	    (k->flags & (BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN | BKV__BLOCK_COPY_SRC)))
		return;
	s = &pool->seqs[slot];
	if (s->state != BKV__SEQ_OPEN || pos >= s->n_blocks || s->table[pos] != b)
		return;
	if (c->parent != k->parent || c->key != s->key || c->fill != pool->bt ||
	    memcmp(pool->tok + (size_t)d * pool->bt, pool->tok + (size_t)b * pool->bt,
		   (size_t)pool->bt * sizeof(int32_t)) != 0)
		return; /* a hash collision: keep the private copy */
	block_pin(pool, d);
	s->table[pos] = d;
	if (pos + 1 < s->n_blocks && pool->blk[s->table[pos + 1]].parent == b)
		pool->blk[s->table[pos + 1]].parent = d;
	k->flags &= ~(BKV__BLOCK_TXN | BKV__BLOCK_HASHED);
	k->prev = -1;
	block_put(pool, b, 1);
	pool->dedup_blocks++;
}

static void txn_end(bkv_pool *pool, int commit)
{
	uint32_t i, left, carried;
	int progress;

	BKV_ASSERT(pool->txn_active);
	pool->txn_active = 0;
	if (commit && pool->index && pool->txn_n > 1)
		txn_prefetch(pool);
	/* Queue order is fill order, parents first, except after an abort
	 * carried blocks over (below): a carried block's children that filled
	 * in this transaction may come before it, and wait for another pass.
	 * An abort keeps the swapped-in blocks queued (their swap-in copies
	 * stay pending for the next call, which brings their KV; the next
	 * commit indexes them), compacted to the queue's front; it forgets
	 * the rest. */
	carried = 0;
	do {
		left = 0;
		progress = 0;
		for (i = 0; i < pool->txn_n; i++) {
			int32_t b = pool->txn_pending[i], d = -1;
			bkv__block *k = &pool->blk[b];

			if (!(k->flags & BKV__BLOCK_TXN) || k->prev != (int32_t)i)
				continue; /* released (and maybe retaken) since queued,
					     or done in an earlier pass */
			if (!commit && (k->flags & BKV__BLOCK_PEND_SWAPIN) && k->ref > 0 &&
			    k->fill == pool->bt && !BLOCK_IS_INDEXED(k)) {
				pool->txn_owner[carried] = pool->txn_owner[i];
				pool->txn_pending[carried] = b;
				k->prev = (int32_t)carried++;
				k->flags &= ~BKV__BLOCK_HASHED;
				continue;
			}
			if (commit && !(k->flags & BKV__BLOCK_HASHED) && k->parent >= 0 &&
			    (pool->blk[k->parent].flags & BKV__BLOCK_TXN)) {
				left++; /* its parent is queued later */
				continue;
			}
			progress = 1;
			if (k->flags & BKV__BLOCK_HASHED) /* ready before any
							     insert: still ready */
				d = bkv__cache_add_hashed(pool, b, k->key, k->hash);
			else if (commit && k->ref > 0 && k->fill == pool->bt && !BLOCK_IS_INDEXED(k))
				d = bkv__cache_add(pool, b, k->key);
			if (d >= 0) {
				txn_dedupe(pool, i, b, d);
				if (!(k->flags & BKV__BLOCK_TXN))
					continue; /* freed: d in its place */
			}
			k->flags &= ~(BKV__BLOCK_TXN | BKV__BLOCK_HASHED);
			k->prev = -1;
		}
	} while (left && progress);
	/* no pass ends without progress while blocks wait: a waiting block's
	 * parent is queued, and the queue's first waiting parent is ready */
	BKV_ASSERT(left == 0);
	pool->txn_n = carried;
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
}

void bkv__pool_txn_commit(bkv_pool *pool)
{
	txn_end(pool, 1);
}

void bkv__pool_txn_abort(bkv_pool *pool)
{
	txn_end(pool, 0);
}

static int check_txn(const bkv_pool *pool)
{
	uint32_t i;

	for (i = 0; i < pool->nb; i++) {
		const bkv__block *k = &pool->blk[i];
		int32_t q = k->prev;

		if (!(k->flags & BKV__BLOCK_TXN))
			continue;
		/* (between transactions: swapped-in blocks an abort carried
		 * over, their copies pending or cleared since) */
		if (k->ref == 0 || BLOCK_IS_INDEXED(k) ||
		    k->fill != pool->bt || q < 0 || (uint32_t)q >= pool->txn_n ||
		    pool->txn_pending[q] != (int32_t)i)
			return CHECK_TXN;
	}
	return CHECK_OK;
}

int bkv_pool_check(const bkv_pool *pool)
{
	int r;

	if (!pool)
		return BKV_EINVAL;
	r = check_blocks(pool);
	if (r == CHECK_OK)
		r = check_seqs(pool);
	if (r == CHECK_OK)
		r = check_pending(pool);
	if (r == CHECK_OK)
		r = check_txn(pool);
	return r;
}
