/*
 * cache.c - the prefix cache: chained block hashes, the hash index, the LRU,
 * the KV event ring and the step transaction's queue.
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
 *   | -1 | 17 | 4  | -1 | -1 | 9  | -1 | 2  |   block ids, -1 empty, each
 *   |    | t17| t4 |    |    | t9 |    | t2 |   with its tag (the hash
 *   +----+----+----+----+----+----+----+----+   folded to 32 bits);
 *                                               home slot = tag & mask
 *
 *   LRU of cached blocks (ref 0, indexed): their ids in release order, in
 *   chunks of 16 slots (one cache line) on a list of chunks
 *        oldest chunk                            newest chunk
 *   +--------------------------+      +--------------------------+
 *   | -1 B3 B2 -1 A4 ... B9 -1 | <--> | C1 C0 D7 -1 ...          | <-->
 *   +--------------------------+      +--------------------------+
 *      lo ^ (head: evicted first)        hi ^ (the next release goes here)
 *
 * Blocks reach the LRU tail when their last user releases them; a hit takes a
 * block off the LRU in O(1): its slot (bkv__block.prev) becomes -1, a chunk
 * left empty leaves the list, and two neighbouring chunks that fit in one
 * merge (at most 16 moves), so the list holds at most 2 x (blocks / 17) + 2
 * chunks. Eviction reads the head chunk's slots in order: the next victims'
 * ids are known without a load that waits for the previous one, which a
 * list linked through the block records cannot give (each hop there is a
 * cache miss in a large pool). Sequences release their blocks last to first, so
 * of blocks released together the deepest reaches the LRU first and is
 * evicted first; a cached block's parent is therefore always pinned or more
 * recent on the LRU, so eviction never strands an indexed child (the LRU head
 * has no indexed children; bkv_pool_check verifies this).
 *
 * The hash is a wyhash-style multiply-fold (128-bit product, xor of halves)
 * over 16-byte words, written here; it is not a cryptographic hash, and need
 * not be, since hits are verified.
 *
 * Transactions (bkv__kv_txn_begin/end, for the scheduler's step): inside
 * one, a block that becomes full is not indexed at once but queued on
 * txn_pending (its queue position kept in its otherwise unused `prev` link);
 * commit indexes the queue in fill order, abort forgets it. No lookup can
 * then hit a block whose KV the current step has not computed yet. Commit
 * first hashes the queued blocks whose parents are indexed and prefetches
 * their index slots (the index is large and each insert lands on a cold
 * line), so the misses overlap instead of coming one insert at a time.
 *
 * KV events (for cluster routers): a STORED or REMOVED event goes into a
 * preallocated ring wherever a block enters or leaves the index, a reset
 * writes one CLEARED; bkv_pool_drain_events drains it (bkv__kv_events).
 */
#include "kv/kv.h"

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

static inline uint32_t home(const bkv__kv *kv, uint64_t hash)
{
	return bkv__index_tag(hash) & kv->index_mask;
}

static inline int32_t index_find(const bkv__kv *kv, uint64_t hash)
{
	uint32_t mask = kv->index_mask, tag = bkv__index_tag(hash), i = tag & mask;

	for (;;) {
		const bkv__islot *e = &kv->index[i];

		if (e->b < 0 || (e->tag == tag && kv->blk[e->b].hash == hash))
			return e->b;
		i = (i + 1) & mask;
	}
}

int32_t bkv__index_find(const bkv__kv *kv, uint64_t hash)
{
	return index_find(kv, hash);
}

void bkv__index_insert(bkv__kv *kv, int32_t b)
{
	bkv__islot_insert(kv->index, kv->index_mask, b, bkv__index_tag(kv->blk[b].hash));
}

void bkv__index_remove(bkv__kv *kv, int32_t b)
{
	bkv__islot_remove(kv->index, kv->index_mask, b, bkv__index_tag(kv->blk[b].hash));
}

/* ---- the LRU ------------------------------------------------------------- */

#define SLOTS BKV__LRU_SLOTS
#define SHIFT BKV__LRU_SHIFT

static inline int32_t *chunk_slots(bkv__kv *kv, int32_t c)
{
	return kv->lru + ((size_t)c << SHIFT);
}

/* The list's ends changed: the oldest and newest blocks' slots. */
static inline void lru_ends(bkv__kv *kv)
{
	int32_t f = kv->lru_first, l = kv->lru_last;

	kv->lru_head = f < 0 ? -1 : (int32_t)(((uint32_t)f << SHIFT) + kv->lru_ch[f].lo);
	kv->lru_tail = l < 0 ? -1 : (int32_t)(((uint32_t)l << SHIFT) + kv->lru_ch[l].hi - 1);
}

/* Take chunk c off the list and onto the free chunks (its slots are all
 * -1 by then). */
static void chunk_drop(bkv__kv *kv, int32_t c)
{
	bkv__lru_chunk *ch = &kv->lru_ch[c];

	if (ch->prev >= 0)
		kv->lru_ch[ch->prev].next = ch->next;
	else
		kv->lru_first = ch->next;
	if (ch->next >= 0)
		kv->lru_ch[ch->next].prev = ch->prev;
	else
		kv->lru_last = ch->prev;
	ch->lo = ch->hi = ch->live = 0;
	ch->prev = -1;
	ch->next = kv->lru_free;
	kv->lru_free = c;
}

/* Merge chunk b into a, its older neighbour (together they hold at most
 * SLOTS blocks): a's blocks, then b's, in order. Appended after a's last
 * slot when they fit there, else a's are first moved to its front. Each
 * block that moves gets its new slot. */
static NOINLINE void chunk_merge(bkv__kv *kv, int32_t a, int32_t b)
{
	bkv__lru_chunk *ca = &kv->lru_ch[a], *cb = &kv->lru_ch[b];
	int32_t *sa = chunk_slots(kv, a), *sb = chunk_slots(kv, b);
	uint32_t w = ca->hi, i;

	BKV_ASSERT(ca->next == b && ca->live + cb->live <= SLOTS);
	if (ca->hi + cb->live > SLOTS) {
		for (w = 0, i = ca->lo; i < ca->hi; i++) {
			int32_t e = sa[i];

			if (e < 0)
				continue;
			if (w != i) {
				sa[i] = -1;
				sa[w] = e;
				kv->blk[e].prev = (int32_t)(((uint32_t)a << SHIFT) + w);
			}
			w++;
		}
		ca->lo = 0;
	}
	for (i = cb->lo; i < cb->hi; i++) {
		int32_t e = sb[i];

		if (e < 0)
			continue;
		sb[i] = -1;
		sa[w] = e;
		kv->blk[e].prev = (int32_t)(((uint32_t)a << SHIFT) + w++);
	}
	ca->hi = (uint8_t)w;
	ca->live = (uint8_t)(ca->live + cb->live);
	chunk_drop(kv, b);
}

/* The newest chunk is full, or there is none: merge it into its older
 * neighbour when they fit in one chunk; if it is still full (or there was
 * none), a new chunk from the free ones becomes the newest. Returns the
 * newest chunk, with room. */
static NOINLINE int32_t lru_grow(bkv__kv *kv)
{
	int32_t c = kv->lru_last, p, n;

	if (c >= 0 && (p = kv->lru_ch[c].prev) >= 0 &&
	    kv->lru_ch[p].live + kv->lru_ch[c].live <= SLOTS) {
		chunk_merge(kv, p, c);
		c = p;
		lru_ends(kv);
		if (kv->lru_ch[c].hi < SLOTS)
			return c;
	}
	n = kv->lru_free;
	BKV_ASSERT(n >= 0);
	kv->lru_free = kv->lru_ch[n].next;
	if (kv->lru_free >= 0) { /* the next grow's lines, 16 pushes ahead */
		BKV__PREFETCH_W(&kv->lru_ch[kv->lru_free]);
		BKV__PREFETCH_W(chunk_slots(kv, kv->lru_free));
	}
	kv->lru_ch[n].next = -1;
	kv->lru_ch[n].prev = c;
	if (c >= 0) {
		kv->lru_ch[c].next = n;
	} else {
		kv->lru_first = n;
		kv->lru_head = (int32_t)((uint32_t)n << SHIFT); /* the push's slot */
	}
	kv->lru_last = n;
	return n;
}

static inline void lru_put(bkv__kv *kv, int32_t b, int32_t c)
{
	bkv__lru_chunk *ch = &kv->lru_ch[c];
	int32_t s = (int32_t)(((uint32_t)c << SHIFT) + ch->hi);

	ch->hi++;
	ch->live++;
	kv->lru[s] = b;
	kv->blk[b].prev = s;
	kv->lru_tail = s;
	kv->nr_cached++;
	BKV__GRP_COUNT(kv, b, grp_cached, 1);
}

static NOINLINE void lru_push_grow(bkv__kv *kv, int32_t b)
{
	lru_put(kv, b, lru_grow(kv));
}

/* b to the newest end, in the newest chunk's next slot. */
static inline void lru_push_plain(bkv__kv *kv, int32_t b)
{
	int32_t c = kv->lru_last;

	if (c < 0 || kv->lru_ch[c].hi == SLOTS)
		lru_push_grow(kv, b);
	else
		lru_put(kv, b, c);
}

/* With eviction by value the block joins its class list too (kv/value.c);
 * out of line, so the plain push keeps its short prologue. */
static NOINLINE void lru_push_valued(bkv__kv *kv, int32_t b)
{
	lru_push_plain(kv, b);
	bkv__val_push(kv, b);
}

void bkv__lru_push(bkv__kv *kv, int32_t b)
{
	if (kv->val) {
		lru_push_valued(kv, b);
		return;
	}
	lru_push_plain(kv, b);
}

/* Chunk c emptied (live 0, all -1): it leaves the list. Its neighbours,
 * now adjacent, need no merge: c held one block before, so the older one
 * held SLOTS (the rule, kv/kv.h bkv__lru_chunk.live). Or c's count fell
 * and it fits in one chunk with a neighbour: they merge. One merge
 * restores the rule: each pair held more than SLOTS before the one block
 * went, so the merged chunk holds SLOTS. */
static NOINLINE void lru_shrink(bkv__kv *kv, int32_t c)
{
	bkv__lru_chunk *chs = kv->lru_ch, *ch = &chs[c];
	int32_t p = ch->prev, n = ch->next;

	if (ch->live == 0) {
		chunk_drop(kv, c);
		BKV_ASSERT(p < 0 || n < 0 || chs[p].live + chs[n].live > SLOTS);
	} else if (chs[p].live + ch->live <= SLOTS) {
		chunk_merge(kv, p, c);
	} else {
		chunk_merge(kv, c, n);
	}
	lru_ends(kv);
}

/* b leaves its slot (-1 stays there); its chunk's used range shrinks to
 * the blocks left; an emptied chunk leaves the list and neighbours that
 * fit in one chunk merge (lru_shrink). A cached block's next is -1
 * already (bkv__block_take set it). */
static inline void lru_unlink_plain(bkv__kv *kv, int32_t b)
{
	bkv__block *k = &kv->blk[b];
	bkv__lru_chunk *chs = kv->lru_ch, *ch;
	uint32_t s = (uint32_t)k->prev, i = s & (SLOTS - 1), c = s >> SHIFT, live;
	int32_t *sl = kv->lru + (s & ~(SLOTS - 1));

	BKV_ASSERT(kv->lru[s] == b);
	sl[i] = -1;
	k->prev = -1;
	kv->nr_cached--;
	BKV__GRP_COUNT(kv, b, grp_cached, -1);
	ch = &chs[c];
	live = ch->live - 1u;
	ch->live = (uint8_t)live;
	if (live) {
		if (i == ch->lo) {
			while (sl[++i] < 0)
				;
			ch->lo = (uint8_t)i;
			if ((int32_t)c == kv->lru_first)
				kv->lru_head = (int32_t)((s & ~(SLOTS - 1)) + i);
		} else if (i + 1 == ch->hi) {
			while (sl[--i] < 0)
				;
			ch->hi = (uint8_t)(i + 1);
			if ((int32_t)c == kv->lru_last)
				kv->lru_tail = (int32_t)((s & ~(SLOTS - 1)) + i);
		}
		/* (sentinel neighbours never fit: live BKV__LRU_NONE) */
		if (LIKELY((chs[ch->prev].live + live > SLOTS) & (chs[ch->next].live + live > SLOTS)))
			return;
	}
	lru_shrink(kv, (int32_t)c);
}

/* With eviction by value the block leaves its class list too. */
static NOINLINE void lru_unlink_valued(bkv__kv *kv, int32_t b)
{
	bkv__val_unlink(kv, b);
	lru_unlink_plain(kv, b);
}

void bkv__lru_unlink(bkv__kv *kv, int32_t b)
{
	if (kv->val) {
		lru_unlink_valued(kv, b);
		return;
	}
	lru_unlink_plain(kv, b);
}

/* ---- KV events ----------------------------------------------------------- */

/* The ring is written here and drained by bkv__kv_events (kv/frames.c). A full
 * ring drops the new event (the host keeps the ones it has not read) and
 * counts it; seq still advances, so the drained stream shows the gap. */
/* The ring's next event, numbered and zeroed but for kind and block; NULL
 * when the ring is full (counted as dropped). */
static bkv_kv_event *event_slot(bkv__kv *kv, bkv_kv_event_kind kind, int32_t b)
{
	uint32_t i;
	bkv_kv_event *e;

	kv->ev_seq++;
	if (kv->ev_n == kv->ev_cap) {
		kv->ev_dropped++;
		return NULL;
	}
	i = kv->ev_head + kv->ev_n;
	if (i >= kv->ev_cap)
		i -= kv->ev_cap;
	kv->ev_n++;
	e = &kv->ev[i];
	memset(e, 0, sizeof *e);
	e->seq = kv->ev_seq;
	e->kind = (uint32_t)kind;
	e->block = b;
	return e;
}

void bkv__event(bkv__kv *kv, bkv_kv_event_kind kind, int32_t b)
{
	bkv_kv_event *e;

	if (!kv->ev || !(e = event_slot(kv, kind, b)) || b < 0)
		return;
	e->hash = kv->blk[b].hash;
	if (kind == BKV_EVENT_STORED) {
		const bkv__block *k = &kv->blk[b];

		e->key = k->key;
		e->token_count = kv->bt;
		if (k->parent >= 0) {
			e->has_parent = 1;
			e->parent_hash = kv->blk[k->parent].hash;
		}
	}
}

void bkv__event_host(bkv__kv *kv, bkv_kv_event_kind kind, int32_t h, uint64_t hash,
		     uint64_t parent_hash, int has_parent, uint64_t key)
{
	bkv_kv_event *e;

	if (!kv->ev || !(e = event_slot(kv, kind, h)))
		return;
	e->medium = h >= 0 ? BKV_MEDIUM_HOST : BKV_MEDIUM_EXTERNAL;
	e->hash = hash;
	if (kind == BKV_EVENT_STORED) {
		e->key = key;
		e->token_count = kv->bt;
		e->has_parent = (uint32_t)(has_parent != 0);
		e->parent_hash = has_parent ? parent_hash : 0;
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

int32_t bkv__cache_add(bkv__kv *kv, int32_t b, uint64_t key)
{
	bkv__block *k = &kv->blk[b];
	int32_t parent = k->parent;
	uint64_t h;

	BKV_ASSERT(k->fill == kv->bt && !BLOCK_IS_INDEXED(k));
	if (!kv->index)
		return -1;
	if (kv->txn_active) {
		k->key = key; /* read back at commit */
		bkv__kv_txn_defer(kv, b);
		return -1;
	}
	if (parent >= 0 && !BLOCK_IS_INDEXED(&kv->blk[parent]))
		return -1;
	h = block_hash(kv->hash_seed, parent >= 0 ? kv->blk[parent].hash : BKV__HASH_ROOT,
		       key, bkv__tok(kv, b), kv->bt);
	return bkv__cache_add_hashed(kv, b, key, h);
}

uint64_t bkv__cache_hash(const bkv__kv *kv, int32_t b, uint64_t key)
{
	int32_t parent = kv->blk[b].parent;

	return block_hash(kv->hash_seed,
			  parent >= 0 ? kv->blk[parent].hash : BKV__HASH_ROOT, key,
			  bkv__tok(kv, b), kv->bt);
}

uint32_t bkv__index_home(const bkv__kv *kv, uint64_t hash)
{
	return home(kv, hash);
}

int32_t bkv__cache_add_hashed(bkv__kv *kv, int32_t b, uint64_t key, uint64_t h)
{
	bkv__block *k = &kv->blk[b];
	int32_t parent = k->parent, d;

	BKV_ASSERT(!kv->txn_active && (parent < 0 || BLOCK_IS_INDEXED(&kv->blk[parent])));
	if ((d = index_find(kv, h)) >= 0)
		return d; /* same content already cached: this copy stays
			     private (a transaction's commit may swap it for d) */
	k->hash = h;
	k->key = key;
	k->flags |= BKV__BLOCK_INDEXED;
	bkv__index_insert(kv, b);
	kv->nr_indexed++;
	if (parent >= 0)
		kv->blk[parent].kids++;
	if (kv->val)
		bkv__val_indexed(kv, b);
	if (kv->ev)
		bkv__event(kv, BKV_EVENT_STORED, b);
	return -1;
}

void bkv__cache_forget(bkv__kv *kv, int32_t b)
{
	bkv__block *k = &kv->blk[b];

	BKV_ASSERT(BLOCK_IS_INDEXED(k) && k->kids == 0);
	if (kv->ev)
		bkv__event(kv, BKV_EVENT_REMOVED, b);
	bkv__index_remove(kv, b);
	k->flags &= ~BKV__BLOCK_INDEXED;
	kv->nr_indexed--;
	if (k->parent >= 0) {
		BKV_ASSERT(kv->blk[k->parent].kids > 0);
		kv->blk[k->parent].kids--;
	}
}

/* Evictions come in runs (a prompt's worth of blocks off the LRU head) and
 * in a large pool every LRU member is on a cold line. The victims' ids lie
 * in order in the LRU's slots, so each eviction asks for the records of
 * the next two (the removal reads the hash, the taker writes the record).
 * A run of takes in a cold pool looks further ahead (bkv__evict_ahead). */
static inline void evict_prefetch(const bkv__kv *kv)
{
	int32_t h = kv->lru_head, n;

	if (h < 0)
		return;
	bkv__block_prefetch(kv, kv->lru[h]);
	if ((n = bkv__lru_next(kv, h)) >= 0)
		bkv__block_prefetch(kv, kv->lru[n]);
	/* the next chunk's record and slots, needed when this one is done */
	if ((n = kv->lru_ch[kv->lru_first].next) >= 0) {
		PREFETCH(&kv->lru_ch[n]);
		PREFETCH(kv->lru + ((size_t)n << SHIFT));
	}
}

int32_t bkv__cache_evict(bkv__kv *kv)
{
	int32_t b;

	if (kv->lru_head < 0)
		return -1;
	if (kv->val) { /* by value: kv/value.c chooses */
		b = bkv__val_pick(kv);
		bkv__lru_unlink(kv, b); /* off its class list too */
		bkv__cache_forget(kv, b);
		kv->evictions++;
		if (kv->demote)
			kv->demote(kv->demote_arg, b);
		return b;
	}
	b = kv->lru[kv->lru_head];
	bkv__lru_unlink(kv, b);
	evict_prefetch(kv);
	bkv__cache_forget(kv, b);
	kv->evictions++;
	if (kv->demote)
		kv->demote(kv->demote_arg, b);
	return b;
}

int32_t bkv__cache_lookup(const bkv__kv *kv, uint64_t parent_hash, int32_t parent,
			  uint64_t key, const int32_t *tokens, uint64_t *hash)
{
	uint32_t bt = kv->bt;
	uint64_t h = block_hash(kv->hash_seed, parent_hash, key, tokens, bt);
	int32_t c = index_find(kv, h);
	const bkv__block *k;

	if (c < 0)
		return -1;
	k = &kv->blk[c];
	if (k->parent != parent || k->key != key ||
	    memcmp(bkv__tok(kv, c), tokens, (size_t)bt * sizeof(int32_t)) != 0)
		return -1;
	*hash = h;
	return c;
}

/* A cold lookup run is a pipeline over the prompt's blocks: while block i
 * is verified, the index slot of block i + RUN_SLOT is read and the record
 * and token ids of the block it names are asked for, and block
 * i + RUN_HASH - 1 is hashed and its slot asked for. RUN_RING holds the
 * hashes in between. (Growing the distance from a few blocks, so that a
 * prompt that misses early hashes less for nothing, measured slower: each
 * block whose slot or record is asked for less than a memory latency
 * before it is read waits; a miss at block 0 costs RUN_HASH hashes, about
 * 1 ns a block of a 128-block prompt.) */
#define RUN_HASH 24u
#define RUN_SLOT 12u
#define RUN_RING 32u /* a power of two above RUN_HASH */

/* One verified hit of a run: c (or -1) holds tokens under parent and key. */
static inline int run_hit(const bkv__kv *kv, int32_t c, int32_t parent, uint64_t key,
			  const int32_t *tokens)
{
	const bkv__block *k = &kv->blk[c];

	return c >= 0 && k->parent == parent && k->key == key &&
	       memcmp(bkv__tok(kv, c), tokens, (size_t)kv->bt * sizeof(int32_t)) == 0;
}

/* Ask for the record and token ids of the block indexed under hash, if
 * any: the probe index_find will make, over lines asked for earlier. With
 * linear probing an entry is often past its home slot (of random entries,
 * 15% at 1e7 blocks, a third of the index taken; 24% at 1e6, nearly half
 * taken), and a run that looked only there waited for those blocks' lines
 * at their verification. */
static inline void run_prefetch(const bkv__kv *kv, uint64_t hash)
{
	uint32_t mask = kv->index_mask, tag = bkv__index_tag(hash), i = tag & mask;
	const bkv__islot *e;

	while ((e = &kv->index[i])->b >= 0) {
		if (e->tag == tag) {
			const int32_t *t = bkv__tok(kv, e->b);

			PREFETCH(&kv->blk[e->b]);
			PREFETCH((const char *)&kv->blk[e->b] + sizeof(bkv__block) - 1);
			PREFETCH(t);
			PREFETCH(t + kv->bt - 1);
			return;
		}
		i = (i + 1) & mask;
	}
}

uint32_t bkv__cache_lookup_run(const bkv__kv *kv, uint64_t ph, int32_t parent, uint64_t key,
			       const int32_t *tokens, uint32_t max, int32_t *out,
			       uint32_t *relinked)
{
	const uint32_t bt = kv->bt;
	uint64_t hs[RUN_RING], h = ph;
	uint32_t i, nh = 0, ns = 0;
	int32_t c;

	*relinked = 0;
	if (!kv->index_cold) {
		/* everything in the cache: one block at a time */
		for (i = 0; i < max; i++) {
			const int32_t *t = tokens + (size_t)i * bt;

			h = block_hash(kv->hash_seed, h, key, t, bt);
			c = index_find(kv, h);
			if (!run_hit(kv, c, parent, key, t))
				break;
			*relinked += BLOCK_IS_CACHED(&kv->blk[c]);
			out[i] = parent = c;
		}
		return i;
	}
	for (i = 0; i < max; i++) {
		const uint32_t to = BKV_MIN(max, i + RUN_HASH);
		const bkv__block *k;

		for (; nh < to; nh++) { /* hashed ahead, the slot's line on its way */
			h = block_hash(kv->hash_seed, h, key, tokens + (size_t)nh * bt, bt);
			hs[nh & (RUN_RING - 1)] = h;
			PREFETCH(&kv->index[home(kv, h)]);
		}
		for (; ns < nh && ns <= i + RUN_SLOT; ns++) /* the block a slot names */
			run_prefetch(kv, hs[ns & (RUN_RING - 1)]);
		/* verified in order, as bkv__cache_lookup */
		c = index_find(kv, hs[i & (RUN_RING - 1)]);
		if (!run_hit(kv, c, parent, key, tokens + (size_t)i * bt))
			break;
		k = &kv->blk[c];
		if (BLOCK_IS_CACHED(k)) { /* its pin unlinks it */
			(*relinked)++;
			PREFETCH(&kv->lru[k->prev]);
			PREFETCH(&kv->lru_ch[k->prev >> SHIFT]);
		}
		out[i] = parent = c;
	}
	return i;
}

/* ---- step transactions ------------------------------------------------------ */

void bkv__kv_txn_begin(bkv__kv *kv)
{
	BKV_ASSERT(!kv->txn_active);
	kv->txn_active = 1; /* txn_n: entries an abort carried over */
}

/* Queue a block that just became full (called by bkv__cache_add inside a
 * transaction). Stale entries - blocks released since they were queued - are
 * squeezed out when the queue is full; live entries number at most nb. */
void bkv__kv_txn_defer(bkv__kv *kv, int32_t b)
{
	bkv__block *k = &kv->blk[b];
	uint32_t i, n = 0;

	if (k->flags & BKV__BLOCK_TXN)
		return;
	if (kv->txn_n == kv->nb) {
		for (i = 0; i < kv->txn_n; i++) {
			int32_t e = kv->txn_pending[i];
			bkv__block *q = &kv->blk[e];

			if ((q->flags & BKV__BLOCK_TXN) && q->prev == (int32_t)i) {
				q->prev = (int32_t)n;
				kv->txn_owner[n] = kv->txn_owner[i];
				kv->txn_pending[n++] = e;
			}
		}
		kv->txn_n = n;
	}
	BKV_ASSERT(kv->txn_n < kv->nb);
	k->flags |= BKV__BLOCK_TXN;
	k->prev = (int32_t)kv->txn_n;
	kv->txn_owner[kv->txn_n] = UINT64_MAX; /* block_filled sets it */
	kv->txn_pending[kv->txn_n++] = b;
}

/* A queued block that commit would index now, its parent indexed already
 * (a parent queued in the same transaction is indexed first). */
static int txn_ready(const bkv__kv *kv, const bkv__block *k, uint32_t i)
{
	return (k->flags & BKV__BLOCK_TXN) && k->prev == (int32_t)i && k->ref > 0 &&
	       k->fill == kv->bt && !BLOCK_IS_INDEXED(k) &&
	       (k->parent < 0 || BLOCK_IS_INDEXED(&kv->blk[k->parent]));
}

/* Before commit indexes its queue: hash every block whose parent is indexed
 * already and prefetch its index slot, then prefetch the block each of
 * those slots names when the tag matches (the probe then compares its
 * hash). The index is large and
 * each insert touches a random line of it, usually not in any cache: done
 * one by one, every insert waits for main memory, twice. */
static void txn_prefetch(bkv__kv *kv)
{
	uint32_t i;

	for (i = 0; i < kv->txn_n; i++) {
		bkv__block *k = &kv->blk[kv->txn_pending[i]];

		if (!txn_ready(kv, k, i))
			continue;
		k->hash = bkv__cache_hash(kv, kv->txn_pending[i], k->key);
		k->flags |= BKV__BLOCK_HASHED;
		PREFETCH(&kv->index[bkv__index_home(kv, k->hash)]);
	}
	for (i = 0; i < kv->txn_n; i++) {
		const bkv__block *k = &kv->blk[kv->txn_pending[i]];
		const bkv__islot *e;

		if (!(k->flags & BKV__BLOCK_HASHED))
			continue;
		e = &kv->index[bkv__index_home(kv, k->hash)];
		if (e->b >= 0 && e->tag == bkv__index_tag(k->hash))
			PREFETCH(&kv->blk[e->b]);
	}
}

/* Commit found b's content indexed already, as block d (queue entry q): the
 * step computed KV that the cache holds. The owner puts d in b's place in
 * the table that filled it (bkv__kv.dedupe) and b is freed, so that the
 * sequence's chain runs through indexed blocks and the blocks it fills later
 * can be indexed too (a chain with a private duplicate in it stops there: a
 * block is indexed only under an indexed parent). d's KV is b's (same tokens
 * under the same parent and key), written by an earlier successful call or
 * earlier in this commit's call. Only a private block that nothing else
 * reads (one reference, no pending device copy) in a table that still holds
 * it at the recorded place (the owner checks that). A pending swap-in copy
 * into b does not hold it: b is freed with the copy still listed, as when a
 * sequence ends before a call carried its swap-in; the copy lands in b
 * before any later call computes into it, and b's holder reads d. (Merging
 * at once matters: a block left private until its copy clears could be
 * shared by a fork first, and a block two tables hold is never merged.) */
static void txn_dedupe(bkv__kv *kv, uint32_t q, int32_t b, int32_t d)
{
	bkv__block *k = &kv->blk[b];
	const bkv__block *c = &kv->blk[d];
	uint64_t own = kv->txn_owner[q];
	int32_t next = -1;

	if (own == UINT64_MAX || !kv->dedupe || k->ref != 1 ||
	    (k->flags & (BKV__BLOCK_PEND_DEV | BKV__BLOCK_COPY_SRC)))
		return;
	if (c->parent != k->parent || c->fill != kv->bt ||
	    memcmp(bkv__tok(kv, d), bkv__tok(kv, b),
		   (size_t)kv->bt * sizeof(int32_t)) != 0)
		return; /* a hash collision: keep the private copy */
	if (!kv->dedupe(kv->dedupe_arg, own, b, d, &next))
		return;
	bkv__block_pin(kv, d);
	if (next >= 0 && kv->blk[next].parent == b)
		kv->blk[next].parent = d;
	k->flags &= ~(BKV__BLOCK_TXN | BKV__BLOCK_HASHED);
	k->prev = -1;
	/* bkv__block_put's private case (one reference, none of its flags):
	 * to the free list head */
	k->ref = 0;
	kv->nr_used--;
	BKV__GRP_COUNT(kv, b, grp_used, -1);
	kv->tokens -= k->fill;
	if (kv->ck_k)
		bkv__ck_unpinned(kv, b);
	bkv__kv_free_push(kv, b);
	kv->dedup_blocks++;
}

/* A queue entry kept for the next commit: its index, encoded apart from
 * the queue positions that prev holds while an entry waits its turn. */
#define TXN_CARRY(i) (-2 - (int32_t)(i))

void bkv__kv_txn_end(bkv__kv *kv, int commit)
{
	uint32_t i, left, carried;
	int progress;

	BKV_ASSERT(kv->txn_active);
	kv->txn_active = 0;
	if (commit && kv->index && kv->txn_n > 1)
		txn_prefetch(kv);
	/* Queue order is fill order, parents first, except after an abort
	 * carried blocks over (below): a carried block's children that filled
	 * in this transaction may come before it, and wait for another pass.
	 * An abort keeps the swapped-in blocks queued (their swap-in copies
	 * stay pending for the next call, which brings their KV; the next
	 * commit indexes them), compacted to the queue's front in order; it
	 * forgets the rest. */
	do {
		left = 0;
		progress = 0;
		for (i = 0; i < kv->txn_n; i++) {
			int32_t b = kv->txn_pending[i], d = -1;
			bkv__block *k = &kv->blk[b];

			if (!(k->flags & BKV__BLOCK_TXN) || k->prev != (int32_t)i)
				continue; /* released (and maybe retaken) since queued,
					     done in an earlier pass, or carried */
			if (!commit && (k->flags & BKV__BLOCK_PEND_SWAPIN) && k->ref > 0 &&
			    k->fill == kv->bt && !BLOCK_IS_INDEXED(k)) {
				k->prev = TXN_CARRY(i);
				continue;
			}
			if (commit && !(k->flags & BKV__BLOCK_HASHED) && k->parent >= 0 &&
			    (kv->blk[k->parent].flags & BKV__BLOCK_TXN)) {
				left++; /* its parent is queued later, or carried */
				continue;
			}
			progress = 1;
			if (k->flags & BKV__BLOCK_HASHED) /* ready before any
							     insert: still ready */
				d = bkv__cache_add_hashed(kv, b, k->key, k->hash);
			else if (commit && k->ref > 0 && k->fill == kv->bt && !BLOCK_IS_INDEXED(k))
				d = bkv__cache_add(kv, b, k->key);
			if (d >= 0) {
				txn_dedupe(kv, i, b, d);
				if (!(k->flags & BKV__BLOCK_TXN))
					continue; /* freed: d in its place */
			}
			k->flags &= ~(BKV__BLOCK_TXN | BKV__BLOCK_HASHED);
			k->prev = -1;
		}
	} while (left && progress);
	carried = 0;
	for (i = 0; i < kv->txn_n; i++) {
		int32_t b = kv->txn_pending[i];
		bkv__block *k = &kv->blk[b];

		if (!(k->flags & BKV__BLOCK_TXN) ||
		    (k->prev != TXN_CARRY(i) && k->prev != (int32_t)i))
			continue;
		BKV_ASSERT(k->prev == TXN_CARRY(i)); /* a commit leaves none waiting */
		kv->txn_pending[carried] = b;
		kv->txn_owner[carried] = kv->txn_owner[i];
		k->prev = (int32_t)carried++;
		k->flags &= ~BKV__BLOCK_HASHED;
	}
	kv->txn_n = carried;
}
