/*
 * prefix.c - the prefix cache: chained block hashes, the hash index, the LRU.
 *
 * The prefix cache is the pool's page cache. A block enters it when it becomes
 * full, if its parent (the block before it in the sequence that wrote it) is
 * already in it (or it is a sequence's first block) and no other block with
 * the same hash is: so the indexed blocks form a forest in which every block's
 * parent is indexed and alive, and a hash names at most one block. The hash is
 * chained: H(seed, parent's hash, caller key, the block's tokens), so equal
 * hashes mean equal whole prefixes with high probability - and a lookup never
 * relies on that: a hit also requires the candidate's parent id, its key and
 * every one of its tokens to equal the request's (bkv__cache_lookup), so a
 * collision can only cost a miss.
 *
 *   hash index (open addressing, linear probing, capacity >= 2 x blocks)
 *   +----+----+----+----+----+----+----+----+
 *   | -1 | 17 | 4  | -1 | -1 | 9  | -1 | 2  |   slot = hash & mask; entries
 *   +----+----+----+----+----+----+----+----+   are block ids, -1 empty
 *
 *   LRU of cached blocks (ref 0, indexed), linked through bkv__block.next/prev
 *   head (oldest, evicted first)  B3 <-> B2 <-> A4 <-> ... <-> tail (newest)
 *
 * Blocks reach the LRU tail when their last user releases them; a hit takes a
 * block off the LRU in O(1). Sequences release their blocks last to first, so
 * of blocks released together the deepest reaches the LRU first and is
 * evicted first; a cached block's parent is therefore always pinned or more
 * recent on the LRU, so eviction never strands an indexed child (the LRU head
 * has no indexed children; bkv_pool_check verifies this).
 *
 * The hash is a wyhash-style multiply-fold (128-bit product, xor of halves)
 * over 16-byte words, written here; it is not a cryptographic hash, and need
 * not be, since hits are verified.
 */
#include "internal.h"

#include <string.h>

/* ---- the chained block hash ---------------------------------------------- */

#define P0 0xa0761d6478bd642full
#define P1 0xe7037ed1a0b428dbull
#define P2 0x8ebc6af09c88c6e3ull
#define P3 0x589965cc75374cc3ull

#if defined(__SIZEOF_INT128__)
__extension__ typedef unsigned __int128 u128;
static inline uint64_t mum(uint64_t a, uint64_t b)
{
	u128 r = (u128)a * b;
	return (uint64_t)r ^ (uint64_t)(r >> 64);
}
#else
static inline uint64_t mum(uint64_t a, uint64_t b)
{
	uint64_t ha = a >> 32, la = (uint32_t)a, hb = b >> 32, lb = (uint32_t)b;
	uint64_t rh = ha * hb, rm0 = ha * lb, rm1 = hb * la, rl = la * lb;
	uint64_t t = rl + (rm0 << 32), c = t < rl;
	uint64_t lo = t + (rm1 << 32);
	uint64_t hi;

	c += lo < t;
	hi = rh + (rm0 >> 32) + (rm1 >> 32) + c;
	return lo ^ hi;
}
#endif

static inline uint64_t rd64(const unsigned char *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof v);
	return v;
}

/* Two independent lanes over 32-byte steps (the multiplies overlap), folded
 * together at the end. */
static inline uint64_t block_hash(uint64_t seed, uint64_t parent_hash, uint64_t key,
				  const int32_t *tokens, uint32_t n)
{
	const unsigned char *p = (const unsigned char *)tokens;
	size_t bytes = (size_t)n * sizeof(int32_t);
	uint64_t h = mum(seed ^ P0, parent_hash ^ P1);
	uint64_t g = mum(key ^ P2, (uint64_t)bytes ^ P3);

	while (bytes >= 32) {
		h = mum(rd64(p) ^ P1, rd64(p + 8) ^ h);
		g = mum(rd64(p + 16) ^ P2, rd64(p + 24) ^ g);
		p += 32;
		bytes -= 32;
	}
	h ^= g;
	if (bytes >= 16) {
		h = mum(rd64(p) ^ P1, rd64(p + 8) ^ h);
		p += 16;
		bytes -= 16;
	}
	if (bytes >= 8) {
		h = mum(rd64(p) ^ P2, h ^ P3);
		p += 8;
		bytes -= 8;
	}
	if (bytes) {
		uint32_t v;

		memcpy(&v, p, sizeof v);
		h = mum((uint64_t)v ^ P1, h ^ P0);
	}
	return mum(h ^ P0, g ^ P3 ^ P1);
}

uint64_t bkv__block_hash(uint64_t seed, uint64_t parent_hash, uint64_t key,
			 const int32_t *tokens, uint32_t n)
{
	return block_hash(seed, parent_hash, key, tokens, n);
}

/* ---- the hash index ------------------------------------------------------ */

static inline uint32_t home(const bkv_pool *pool, uint64_t hash)
{
	return (uint32_t)(hash ^ (hash >> 32)) & pool->index_mask;
}

static inline int32_t index_find(const bkv_pool *pool, uint64_t hash)
{
	uint32_t mask = pool->index_mask, i = home(pool, hash);

	for (;;) {
		int32_t b = pool->index[i];

		if (b < 0 || pool->blk[b].hash == hash)
			return b;
		i = (i + 1) & mask;
	}
}

int32_t bkv__index_find(const bkv_pool *pool, uint64_t hash)
{
	return index_find(pool, hash);
}

void bkv__index_insert(bkv_pool *pool, int32_t b)
{
	uint32_t mask = pool->index_mask, i = home(pool, pool->blk[b].hash);

	while (pool->index[i] >= 0)
		i = (i + 1) & mask;
	pool->index[i] = b;
}

/* Remove b; backward-shift the entries after it so that no tombstones are
 * needed and every probe sequence stays unbroken. */
void bkv__index_remove(bkv_pool *pool, int32_t b)
{
	uint32_t mask = pool->index_mask, i = home(pool, pool->blk[b].hash), j;

	while (pool->index[i] != b) {
		BKV_ASSERT(pool->index[i] >= 0);
		i = (i + 1) & mask;
	}
	j = i;
	for (;;) {
		int32_t e;
		uint32_t k;

		j = (j + 1) & mask;
		e = pool->index[j];
		if (e < 0)
			break;
		k = home(pool, pool->blk[e].hash);
		/* e may move back to i unless its home lies in (i, j]. */
		if (((j - k) & mask) >= ((j - i) & mask)) {
			pool->index[i] = e;
			i = j;
		}
	}
	pool->index[i] = -1;
}

/* ---- the LRU ------------------------------------------------------------- */

void bkv__lru_push(bkv_pool *pool, int32_t b)
{
	bkv__block *k = &pool->blk[b];

	k->next = -1;
	k->prev = pool->lru_tail;
	if (pool->lru_tail >= 0)
		pool->blk[pool->lru_tail].next = b;
	else
		pool->lru_head = b;
	pool->lru_tail = b;
	pool->nr_cached++;
}

void bkv__lru_unlink(bkv_pool *pool, int32_t b)
{
	bkv__block *k = &pool->blk[b];

	if (k->prev >= 0)
		pool->blk[k->prev].next = k->next;
	else
		pool->lru_head = k->next;
	if (k->next >= 0)
		pool->blk[k->next].prev = k->prev;
	else
		pool->lru_tail = k->prev;
	k->next = k->prev = -1;
	pool->nr_cached--;
}

/* ---- KV events ----------------------------------------------------------- */

/* The ring is written here and drained by bkv_pool_events (pool.c). A full
 * ring drops the new event (the host keeps the ones it has not read) and
 * counts it; seq still advances, so the drained stream shows the gap. */
void bkv__event(bkv_pool *pool, bkv_kv_event_kind kind, int32_t b)
{
	uint32_t cap = pool->cfg.event_capacity, i;
	bkv_kv_event *e;

	if (!pool->ev)
		return;
	pool->ev_seq++;
	if (pool->ev_n == cap) {
		pool->ev_dropped++;
		return;
	}
	i = pool->ev_head + pool->ev_n;
	if (i >= cap)
		i -= cap;
	pool->ev_n++;
	e = &pool->ev[i];
	e->seq = pool->ev_seq;
	e->kind = (uint32_t)kind;
	e->block = b;
	e->hash = e->parent_hash = e->key = 0;
	e->token_count = 0;
	e->has_parent = 0;
	if (b >= 0) {
		const bkv__block *k = &pool->blk[b];

		e->hash = k->hash;
		if (kind == BKV_EVENT_STORED) {
			e->key = k->key;
			e->token_count = pool->bt;
			if (k->parent >= 0) {
				e->has_parent = 1;
				e->parent_hash = pool->blk[k->parent].hash;
			}
		}
	}
}

uint32_t bkv_block_hashes(uint64_t hash_seed, uint64_t key, uint32_t block_tokens,
			  const int32_t *tokens, uint32_t n, uint64_t *hashes)
{
	uint64_t ph = BKV__HASH_ROOT;
	uint32_t nb, i;

	if (block_tokens == 0)
		return 0;
	nb = n / block_tokens;
	if (nb && (!tokens || !hashes))
		return 0;
	for (i = 0; i < nb; i++) {
		ph = block_hash(hash_seed, ph, key, tokens + (size_t)i * block_tokens,
				block_tokens);
		hashes[i] = ph;
	}
	return nb;
}

/* ---- cache membership ---------------------------------------------------- */

int32_t bkv__cache_add(bkv_pool *pool, int32_t b, uint64_t key)
{
	bkv__block *k = &pool->blk[b];
	int32_t parent = k->parent;
	uint64_t h;

	BKV_ASSERT(k->fill == pool->bt && !BLOCK_IS_INDEXED(k));
	if (!pool->index)
		return -1;
	if (pool->txn_active) {
		k->key = key; /* read back at commit */
		bkv__pool_txn_defer(pool, b);
		return -1;
	}
	if (parent >= 0 && !BLOCK_IS_INDEXED(&pool->blk[parent]))
		return -1;
	h = block_hash(pool->cfg.hash_seed, parent >= 0 ? pool->blk[parent].hash : BKV__HASH_ROOT,
		       key, pool->tok + (size_t)b * pool->bt, pool->bt);
	return bkv__cache_add_hashed(pool, b, key, h);
}

uint64_t bkv__cache_hash(const bkv_pool *pool, int32_t b, uint64_t key)
{
	int32_t parent = pool->blk[b].parent;

	return block_hash(pool->cfg.hash_seed,
			  parent >= 0 ? pool->blk[parent].hash : BKV__HASH_ROOT, key,
			  pool->tok + (size_t)b * pool->bt, pool->bt);
}

uint32_t bkv__index_home(const bkv_pool *pool, uint64_t hash)
{
	return home(pool, hash);
}

int32_t bkv__cache_add_hashed(bkv_pool *pool, int32_t b, uint64_t key, uint64_t h)
{
	bkv__block *k = &pool->blk[b];
	int32_t parent = k->parent, d;

	BKV_ASSERT(!pool->txn_active && (parent < 0 || BLOCK_IS_INDEXED(&pool->blk[parent])));
	if ((d = index_find(pool, h)) >= 0)
		return d; /* same content already cached: this copy stays
			     private (a transaction's commit may swap it for d) */
	k->hash = h;
	k->key = key;
	k->flags |= BKV__BLOCK_INDEXED;
	bkv__index_insert(pool, b);
	pool->nr_indexed++;
	if (parent >= 0)
		pool->blk[parent].kids++;
	if (pool->ev)
		bkv__event(pool, BKV_EVENT_STORED, b);
	return -1;
}

void bkv__cache_forget(bkv_pool *pool, int32_t b)
{
	bkv__block *k = &pool->blk[b];

	BKV_ASSERT(BLOCK_IS_INDEXED(k) && k->kids == 0);
	if (pool->ev)
		bkv__event(pool, BKV_EVENT_REMOVED, b);
	bkv__index_remove(pool, b);
	k->flags &= ~BKV__BLOCK_INDEXED;
	pool->nr_indexed--;
	if (k->parent >= 0) {
		BKV_ASSERT(pool->blk[k->parent].kids > 0);
		pool->blk[k->parent].kids--;
	}
}

int32_t bkv__cache_evict(bkv_pool *pool)
{
	int32_t b = pool->lru_head;

	if (b < 0)
		return -1;
	bkv__lru_unlink(pool, b);
	bkv__cache_forget(pool, b);
	pool->evictions++;
	return b;
}

int32_t bkv__cache_lookup(const bkv_pool *pool, uint64_t parent_hash, int32_t parent,
			  uint64_t key, const int32_t *tokens, uint64_t *hash)
{
	uint32_t bt = pool->bt;
	uint64_t h = block_hash(pool->cfg.hash_seed, parent_hash, key, tokens, bt);
	int32_t c = index_find(pool, h);
	const bkv__block *k;

	if (c < 0)
		return -1;
	k = &pool->blk[c];
	if (k->parent != parent || k->key != key ||
	    memcmp(pool->tok + (size_t)c * bt, tokens, (size_t)bt * sizeof(int32_t)) != 0)
		return -1;
	*hash = h;
	return c;
}
