/*
 * kv.h - the KV layer: block frames, the free list, reference counts, the
 * prefix cache (hash index, LRU, KV event ring) and the step transaction's
 * queue of blocks waiting to be indexed.
 *
 * The lowest layer with state (docs/design.md, "The layers"). It knows
 * blocks only: it never sees a sequence, a block table or a request. The
 * pool layer above (pool/pool.h) embeds one struct bkv__kv and reaches it
 * through these functions; nothing here calls up, except the transaction
 * commit's duplicate hook (bkv__kv.dedupe), which the pool installs at
 * create, the way SQLite's page cache asks its pager through xStress.
 *
 * Owners: kv/frames.c (create/destroy, the slow release paths, the copy-
 * source release, reset), kv/cache.c (chained hashes, index, LRU, events,
 * the transaction queue), kv/chunks.c (frames shared with a STATE group in
 * chunks: their counts, free lists, lending), kv/check.c (the block
 * invariants), kv/value.c (eviction policies). The fast frame operations
 * are inline below: every append and release of the pool layer runs them.
 */
#ifndef BKV_KV_H
#define BKV_KV_H

#include "base/base.h"

/* bkv__block.flags */
#define BKV__BLOCK_INDEXED 0x1u     /* in the hash index (content immutable) */
#define BKV__BLOCK_PEND_DEV 0x2u    /* src or dst of a pending device copy */
#define BKV__BLOCK_PEND_SWAPIN 0x4u /* dst of a pending swap-in copy */
#define BKV__BLOCK_TXN 0x8u         /* filled inside a transaction: waits in
				       txn_pending to be indexed at commit */
#define BKV__BLOCK_COPY_SRC 0x10u   /* source of a pending device copy: pinned
				       even at ref 0 until the copy clears */
#define BKV__BLOCK_COPY_CHAIN 0x20u /* an indexed COPY_SRC block whose last
				       table reference went: it holds one ref
				       on each of its ancestors until the copy
				       clears, so every pinned indexed block
				       keeps a pinned parent */
#define BKV__BLOCK_HASHED 0x40u     /* only inside a transaction's commit
				       (kv/cache.c txn_end): hash holds the
				       block's chain hash, computed ahead
				       so the index slots could be
				       prefetched */
#define BKV__BLOCK_CHUNKED 0x80u    /* a frame of a pool whose frames are
				       shared with a STATE group (kv/chunks.c):
				       its releases take the slow path, which
				       keeps the chunk counts */

/* One device block frame's metadata (40 bytes). A block is in exactly one
 * state: pinned (ref > 0, in >= 1 table), cached (ref 0, indexed, on the LRU)
 * or free (ref 0, not indexed, on the free list). */
typedef struct bkv__block {
	uint64_t hash;  /* chained content hash; meaningful while INDEXED */
	uint64_t key;   /* caller key of the sequence that indexed it; while
			   INDEXED */
	int32_t next;   /* free list: next free block (-1 = none); -1 off
			   the free list */
	int32_t prev;   /* cached: its slot in the LRU (bkv__kv.lru); queued
			   in a transaction (TXN): its queue position; else
			   -1 */
	int32_t parent; /* the block before it in the table of the sequence
			   that took it (-1: it was logical block 0) */
	uint32_t ref;   /* table references over device-resident sequences */
	uint32_t kids;  /* indexed blocks whose parent is this one */
	unsigned int fill : 24; /* tokens written, 0..block_tokens; a full
				   block has fill == block_tokens */
	unsigned int flags : 8; /* BKV__BLOCK_* */
} bkv__block;

#define BLOCK_IS_PINNED(b) ((b)->ref > 0 || ((b)->flags & BKV__BLOCK_COPY_SRC) != 0)
#define BLOCK_IS_INDEXED(b) (((b)->flags & BKV__BLOCK_INDEXED) != 0)
#define BLOCK_IS_CACHED(b) (!BLOCK_IS_PINNED(b) && BLOCK_IS_INDEXED(b))
#define BLOCK_IS_FREE(b) (!BLOCK_IS_PINNED(b) && !BLOCK_IS_INDEXED(b))

/* The LRU holds cached block ids in release order (oldest first) in
 * chunks of BKV__LRU_SLOTS slots, one cache line each, on a doubly linked
 * list of chunks (kv/cache.c draws it). A block taken back from the cache
 * leaves -1 in its slot; a chunk's used slots are [lo, hi), its first and
 * last holding blocks. */
#define BKV__LRU_SLOTS 16u
#define BKV__LRU_SHIFT 4u
#define BKV__LRU_NONE 0xffu /* the sentinel chunk's live */

typedef struct bkv__lru_chunk {
	int32_t next; /* next more recent chunk (-1: the newest); while free:
			 the next free chunk */
	int32_t prev; /* next older chunk (-1: the oldest) */
	uint8_t lo;   /* first slot in use; its slot holds a block */
	uint8_t hi;   /* one past the last slot in use (its slot holds a
			 block); lo < hi <= BKV__LRU_SLOTS on the list, 0
			 while free */
	uint8_t live; /* slots in [lo, hi) holding a block, >= 1 on the list;
			 two neighbours on the list hold more than
			 BKV__LRU_SLOTS together unless the newer one is the
			 newest chunk */
	uint8_t pad;  /* zero */
} bkv__lru_chunk;

/* One hash-index slot (8 bytes): the block and its hash folded to 32 bits,
 * whose low bits are the slot a probe for it starts at. A probe compares
 * the tag before it reads the block record, and removal finds each entry's
 * home from the tag, so neither touches the block array for an entry that
 * is not the one sought. */
typedef struct bkv__islot {
	int32_t b;    /* block id, -1 empty */
	uint32_t tag; /* bkv__index_tag(hash of block b); while b >= 0 */
} bkv__islot;

/* The commit found a queued block b's content indexed already as block d
 * (the step computed KV the cache holds). The owner answers 1 when it put d
 * in b's place in the table that filled it, with *next the block after it
 * in that table (-1: none); the KV layer then pins d, frees b and gives next
 * the parent d. 0: nothing changed (the table no longer holds b there).
 * owner is the note bkv__block_filled recorded for b. */
typedef int (*bkv__kv_dedupe_fn)(void *arg, uint64_t owner, int32_t b, int32_t d, int32_t *next);

/* An eviction just took cached block b out of the index (its hash, key,
 * parent and tokens are still as they were, its parent still indexed): the
 * owner may keep a copy of it elsewhere (the host cache, pool/hcache.c)
 * before the taker rewrites it. */
typedef void (*bkv__kv_demote_fn)(void *arg, int32_t b);

/* Value classes of the value policy (kv/value.c): half-octaves of a
 * block's expected saving over a fresh depth-0 block's. */
#define BKV__VAL_CLASSES 16u

/* The value policy's record of one device block (kv/value.c; bkv__kv.val,
 * 28 bytes a block, only while the policy is on). */
typedef struct bkv__val {
	uint32_t depth; /* logical position in its chain (0: the first
			   block), set when it is indexed */
	uint32_t freq;  /* hits taken from the cache, 1/256 units, halved
			   every 2^val_shift clock ticks since stamp */
	uint32_t stamp; /* val_clock at its indexing or last hit; with the
			   segmented LRU, val_pclock at its last push */
	int32_t prev;   /* cached: the next older block of its class list
			   (-1: its head); else -1 */
	int32_t next;   /* cached: the next more recent one (-1: the tail) */
	uint8_t cls;    /* cached: its class list, < BKV__VAL_CLASSES;
			   off the lists, with the segmented LRU: the
			   class it left, or BKV__SEG_HIT after a hit */
	uint8_t on;     /* 1 while on a class list */
	uint8_t rprio;  /* retention (bkv__kv.val_ret): a request's
			   retention priority + 1 given to it while indexed,
			   0 = none (BKV_RETENTION_PRIORITY_DEFAULT) */
	uint8_t cold;   /* 1: cached cold (bkv__block_put_cold), class 0,
			   evicted before any block that is not; else 0 */
	float h;        /* cached, by value: val_gd at its push + its v */
} bkv__val;

/* bkv__kv.val_ret: how retention priorities place a cached block. */
#define BKV__RET_OFF 0u   /* no priorities (every block the default) */
#define BKV__RET_BANDS 1u /* LRU by band: the class is the priority's band */
#define BKV__RET_VALUE 2u /* by value: priority / default times the value */

typedef struct bkv__kv {
	uint32_t bt;           /* block_tokens, a power of two */
	uint32_t bt_shift;     /* log2(bt) */
	uint32_t nb;           /* device blocks */
	bkv__block *blk;       /* [nb] device block metadata */
	int32_t *tok;          /* [nb * bt] each block's token ids (block
				  f's through bkv__tok), 64-byte aligned
				  inside tok_mem */
	void *tok_mem;         /* the token store's allocation:
				  bkv__kv_tok_bytes(nb, bt) bytes */
	int32_t free_head;     /* free list head (LIFO), -1 empty */
	uint32_t nr_free;      /* blocks on the free list */
	int32_t *lru;          /* [lru_chunks * BKV__LRU_SLOTS] the LRU's
				  slots: a cached block's id, or -1; NULL
				  without prefix cache */
	bkv__lru_chunk *lru_ch; /* [lru_chunks], after the slots in lru_mem;
				  lru_ch[-1] is a sentinel for "no chunk"
				  (live BKV__LRU_NONE, so no neighbour test
				  needs a test for -1 first) */
	void *lru_mem;         /* the allocation of both: bkv__kv_lru_bytes;
				  the slots 64-byte aligned in it */
	uint32_t lru_chunks;   /* chunks allocated: bkv__lru_chunks_for(nb),
				  more than the list can hold at once */
	int32_t lru_free;      /* free chunks (linked through next), -1 */
	int32_t lru_first;     /* the oldest chunk on the list, -1 empty */
	int32_t lru_last;      /* the newest chunk, -1 empty */
	int32_t lru_head;      /* slot of the oldest cached block (evicted
				  first), -1: the LRU is empty */
	int32_t lru_tail;      /* slot of the most recently released cached
				  block, -1 */
	uint32_t nr_cached;    /* blocks on the LRU */
	uint32_t nr_used;      /* pinned blocks; free + used + cached == nb */
	uint32_t nr_indexed;   /* blocks in the hash index */
	bkv__islot *index;      /* [index_mask + 1] open addressing, linear
				  probing from tag & index_mask; NULL without
				  prefix cache */
	uint32_t index_mask;   /* capacity - 1; capacity >= 2 * nb, pow2 */
	int index_cold;        /* the index and block records exceed what a
				  core's caches hold (BKV__KV_COLD_BYTES):
				  lookups prefetch ahead */
	uint64_t hash_seed;    /* the pool's hash_seed */
	uint64_t tokens;       /* sum of fill over pinned blocks */
	uint64_t evictions;    /* cached blocks evicted for reuse */
	int txn_active;        /* inside bkv__kv_txn_begin/end */
	int32_t *txn_pending;  /* [nb] blocks filled during the transaction, in
				  fill order (a parent before its children) */
	uint32_t txn_n;        /* entries in txn_pending; <= nb because an
				  entry is added only when a block fills and
				  a block fills once per take */
	uint64_t *txn_owner;   /* [nb] parallel to txn_pending: the owner's
				  note of where the queued block sits
				  (UINT64_MAX: unknown), for dedupe */
	bkv__kv_dedupe_fn dedupe; /* the owner's duplicate hook (or NULL) */
	void *dedupe_arg;      /* its argument (the pool) */
	bkv__kv_demote_fn demote; /* the owner's eviction hook (or NULL: an
				  evicted block's content is dropped) */
	void *demote_arg;      /* its argument (the pool) */
	uint64_t dedup_blocks; /* blocks commit swapped for the indexed copy
				  of their content */
	bkv_kv_event *ev;      /* [ev_cap] KV event ring; NULL when events are
				  off (kv/cache.c writes, bkv__kv_events
				  drains) */
	uint32_t ev_cap;       /* the pool's event_capacity */
	uint32_t ev_head;      /* ring index of the oldest pending event */
	uint32_t ev_n;         /* pending events, <= ev_cap */
	uint64_t ev_seq;       /* events emitted (the last event's seq) */
	uint64_t ev_dropped;   /* events dropped on a full ring */
	/* eviction by value (kv/value.c); val NULL: LRU (the default) */
	bkv__val *val;         /* [nb] per-block records, or NULL */
	double val_p0;         /* recompute price of a block at depth 0 */
	double val_p1;         /* price added per block of depth */
	double val_r1;         /* val_p1 / val_p0 */
	double val_gd;         /* by value: GreedyDual's clock, victims' max h */
	uint32_t val_clock;    /* ticks on every hit taken from the cache and
				  every eviction (wraps; only differences
				  are read) */
	uint32_t val_shift;    /* log2 of the hit count's half-life in ticks
				  (an eighth of the pool's blocks, >= 16) */
	uint32_t val_users;    /* bkv__kv_value_on calls not yet undone */
	uint32_t val_lanes;    /* of them, the lane keeping rule's
				  (bkv__kv_lanes_on): cold blocks then
				  have class 0 to themselves, and
				  without prices (bkv__val_unpriced) the
				  rest are in class 1 in LRU order */
	int32_t val_head[BKV__VAL_CLASSES]; /* each class list's oldest
				  cached block (evicted first), -1 */
	int32_t val_tail[BKV__VAL_CLASSES]; /* and its most recent, -1 */
	uint32_t val_mask;     /* bit c: class list c is not empty */
	uint32_t val_rr;       /* the class whose head the next eviction
				  re-prices (aging: round robin) */
	uint64_t val_moves;    /* class heads moved up (a cached child) or
				  down (decayed) by evictions */
	uint32_t val_ret;      /* BKV__RET_*: retention priorities in force
				  (kv/value.c); needs val */
	uint64_t *val_exp;     /* [nb] with val_ret: the clock (us) after
				  which a block's rprio counts as the
				  default; UINT64_MAX = never (also rprio 0) */
	uint64_t val_now;      /* the owner's clock, us, as last told
				  (bkv__kv_retain_now) */
	uint32_t val_seg;      /* segmented LRU (kv/value.c) on-calls left */
	uint32_t val_prot_n;   /* cached blocks on the protected list */
	uint32_t val_prot_max; /* its room, blocks, in [0, nb - nb / 8] */
	uint32_t val_rel_n;    /* blocks the close under way releases; 0 none */
	uint32_t val_rel_dec;  /* its BACK blocks' list, set at the first; 0 */
	uint32_t val_pclock;   /* ticks on every push to the lists (wraps):
				  a cached block's stamp is its push's */
	uint64_t *val_ghost;   /* [val_ghost_mask + 1] evictions by hash:
				  hash >> 32 << 32 | push stamp; 0 none */
	uint32_t val_ghost_mask; /* slots - 1 (a power of two >= nb) */
	uint64_t val_promoted; /* blocks protected for a hit */
	uint64_t val_demoted;  /* protected heads moved to probation */
	/* KV groups (bkv__kv_groups_on; grp NULL: one group, no counts) */
	uint8_t *grp;          /* [nb] each frame's taker's group */
	uint8_t take_group;    /* the next take's group (pool/lanes.c) */
	uint32_t grp_used[BKV_MAX_GROUPS];   /* used frames by group */
	uint32_t grp_cached[BKV_MAX_GROUPS]; /* cached frames by group */
	/* frames shared with a STATE group in chunks (kv/chunks.c); ck_k 0:
	   off, and none of these is used */
	uint32_t ck_k;         /* frames per chunk (one state unit's) */
	uint32_t ck_n;         /* whole chunks, nb / ck_k; "chunk" ck_n is
				  the frames past the last whole one, which
				  are attention's always */
	uint32_t *ck_pin;      /* [ck_n] an attention chunk's pinned frames */
	uint32_t *ck_nfree;    /* [ck_n + 1] its free frames */
	int32_t *ck_free;      /* [ck_n + 1] its free frames' list (LIFO,
				  linked through bkv__block.next), -1 */
	uint8_t *ck_lent;      /* [ck_n] 1: the chunk is a state unit */
	uint8_t *ck_on;        /* [ck_n + 1] the lists it is on:
				  BKV__CK_ON_* */
	int32_t *ck_next;      /* [ck_n] idle list: next chunk (-1 none) */
	int32_t *ck_prev;      /* [ck_n] idle list: previous chunk (-1: the
				  head) */
	int32_t *ck_anext;     /* [ck_n + 1] its allocation list: next */
	int32_t *ck_aprev;     /* [ck_n + 1] and previous (-1: the head) */
	int32_t ck_idle;       /* the idle list's head: attention chunks with
				  no pinned frame (every frame free or
				  cached), most recently idle first; -1 */
	uint32_t nr_idle;      /* chunks on the idle list */
	int32_t ck_part;       /* allocation list of the chunks with pinned
				  and free frames (and the tail's), popped
				  first so that whole chunks stay idle; -1 */
	int32_t ck_empty;      /* allocation list of the idle chunks with
				  free frames, popped when ck_part is
				  empty; -1 */
	uint32_t nr_lent;      /* frames in chunks lent to the state group;
				  free + used + cached + lent == nb */
	int hit_slow;          /* val or ck_k: a hit calls bkv__block_hit_slow
				  (one test on the plain hit path for both) */
	uint64_t ck_lends;     /* chunks lent to the state group */
	uint64_t ck_returns;   /* chunks it gave back */
} bkv__kv;

/* Index plus block-record bytes from which bkv__cache_lookup_run prefetches
 * ahead: below it, they stay in a core's caches and prefetching is only
 * instructions. */
#define BKV__KV_COLD_BYTES (4u << 20)

/* A hash's tag in the index: its halves xor-folded; tag & index_mask is
 * its home slot. */
static inline uint32_t bkv__index_tag(uint64_t hash)
{
	return (uint32_t)(hash ^ (hash >> 32));
}

/* Block f's token ids, block_tokens of them. */
static inline int32_t *bkv__tok(const bkv__kv *kv, size_t f)
{
	return kv->tok + (f << kv->bt_shift);
}

/* Entries of the hash index (0 without the prefix cache). */
static inline size_t bkv__index_cap(const bkv__kv *kv)
{
	return kv->index ? (size_t)kv->index_mask + 1 : 0;
}

/* Open-addressing slots shared by the device index (kv/cache.c) and the
 * host cache's (pool/hcache.c): insert id b with tag at the first empty
 * slot from its home, and remove it with a backward shift, so no probe
 * ever needs a tombstone. mask = capacity - 1. */
static inline void bkv__islot_insert(bkv__islot *ix, uint32_t mask, int32_t b, uint32_t tag)
{
	uint32_t i = tag & mask;

	while (ix[i].b >= 0)
		i = (i + 1) & mask;
	ix[i].b = b;
	ix[i].tag = tag;
}

static inline void bkv__islot_remove(bkv__islot *ix, uint32_t mask, int32_t b, uint32_t tag)
{
	uint32_t i = tag & mask, j;

	while (ix[i].b != b) {
		BKV_ASSERT(ix[i].b >= 0);
		i = (i + 1) & mask;
	}
	j = i;
	for (;;) {
		bkv__islot e;
		uint32_t k;

		j = (j + 1) & mask;
		e = ix[j];
		if (e.b < 0)
			break;
		k = e.tag & mask;
		/* e may move back to i unless its home lies in (i, j]. */
		if (((j - k) & mask) >= ((j - i) & mask)) {
			ix[i] = e;
			i = j;
		}
	}
	ix[i].b = -1;
}

/* A prefetch for writing (the line is about to be stored to). */
#if defined(__GNUC__) || defined(__clang__)
#define BKV__PREFETCH_W(p) __builtin_prefetch((p), 1)
#else
#define BKV__PREFETCH_W(p) ((void)(p))
#endif

/* Ask for both lines a 40-byte record can straddle (half of them do). */
static inline void bkv__block_prefetch(const bkv__kv *kv, int32_t b)
{
	const char *r = (const char *)&kv->blk[b];

	BKV__PREFETCH_W(r);
	BKV__PREFETCH_W(r + sizeof(bkv__block) - 1);
}

/* Ask for the index line where a probe for hash starts and, when the
 * probe may run past its end, the next one (a removal's backward shift
 * reads on to the next empty slot, an insert stops at it). */
static inline void bkv__slot_prefetch(const bkv__kv *kv, uint64_t hash)
{
	uint32_t i = bkv__index_tag(hash) & kv->index_mask;

	BKV__PREFETCH_W(&kv->index[i]);
	BKV__PREFETCH_W(&kv->index[(i + 4) & kv->index_mask]);
}

/* A run of takes in a cold pool (index_cold) looks ahead along the LRU:
 * an eviction this many evictions away has its lines asked for
 * (bkv__evict_ahead), and the blocks it fills this many blocks ahead are
 * hashed and their index slots asked for (pool/seq.c). */
#define BKV__EVICT_AHEAD 4u
#define BKV__HASH_AHEAD 16u

/* With KV groups, frame b's group's count in field moves by d. */
#define BKV__GRP_COUNT(kv, b, field, d)                                              \
	do {                                                                         \
		if ((kv)->grp)                                                       \
			(kv)->field[(kv)->grp[b]] += (uint32_t)(int32_t)(d);         \
	} while (0)

/* Do the value records order cached blocks without prices: their only
 * users the lane keeping rule (LRU within class 1) and retention bands
 * (the class the band)? Then a block released cold goes to class 0. */
static inline int bkv__val_unpriced(const bkv__kv *kv)
{
	return kv->val_users == kv->val_lanes + kv->val_seg + (kv->val_ret == BKV__RET_BANDS);
}

/* The segmented LRU's classes (kv/value.c): cold lane blocks, probation
 * (evicted first), protected; off the lists a hit earning protection (HIT),
 * a block extending such a chain (EXT), one back after its eviction (BACK). */
#define BKV__SEG_COLD 0u
#define BKV__SEG_PROB 1u
#define BKV__SEG_PROT 2u
#define BKV__SEG_HIT 0xffu
#define BKV__SEG_EXT 0xfeu
#define BKV__SEG_BACK 0xfdu

/* LRU chunks for nb blocks: the list never holds more than 2 * (nb / 17)
 * + 2 (every pair of neighbours but the newest holds 17 or more blocks),
 * and a push takes its new chunk before it is counted. */
static inline uint32_t bkv__lru_chunks_for(uint32_t nb)
{
	return 2 * (nb / 17) + 3;
}

/* The LRU slot after slot v, oldest to newest, that holds a block (-1: v
 * was the newest). A hint when v is stale: any v in the slot array gives
 * a slot in it or -1. */
static inline int32_t bkv__lru_next(const bkv__kv *kv, int32_t v)
{
	uint32_t c = (uint32_t)v >> BKV__LRU_SHIFT, i = ((uint32_t)v & (BKV__LRU_SLOTS - 1)) + 1;
	const int32_t *sl = kv->lru + ((size_t)c << BKV__LRU_SHIFT);
	int32_t n;

	for (; i < kv->lru_ch[c].hi; i++)
		if (sl[i] >= 0)
			return (int32_t)((c << BKV__LRU_SHIFT) + i);
	n = kv->lru_ch[c].next;
	return n < 0 ? -1 : (int32_t)(((uint32_t)n << BKV__LRU_SHIFT) + kv->lru_ch[n].lo);
}

/* The block about j slots after LRU slot v (at most one chunk on; -1
 * slots are not skipped), or -1. */
static inline int32_t bkv__lru_peek(const bkv__kv *kv, int32_t v, uint32_t j)
{
	uint32_t c = (uint32_t)v >> BKV__LRU_SHIFT;
	const bkv__lru_chunk *ch = &kv->lru_ch[c];
	int32_t n;

	j += (uint32_t)v & (BKV__LRU_SLOTS - 1);
	if (j < ch->hi)
		return kv->lru[(c << BKV__LRU_SHIFT) + j];
	if ((n = ch->next) >= 0 && (j += kv->lru_ch[n].lo - ch->hi) < BKV__LRU_SLOTS)
		return kv->lru[((uint32_t)n << BKV__LRU_SHIFT) + j];
	return -1;
}

/* The eviction look-ahead (bkv__evict_ahead), in three stages over the
 * LRU's slots: the caller walks BKV__EVICT_AHEAD victims ahead of its
 * evictions, and each call, for the victim in slot v,
 *   - asks for the record of the block 2 x BKV__EVICT_AHEAD slots on (its
 *     hash, parent and token ids are read two stages later);
 *   - reads the record of the block BKV__EVICT_AHEAD slots on (asked for
 *     BKV__EVICT_AHEAD calls ago) and asks for the lines its
 *     eviction will touch: its index lines (the removal), its parent's
 *     kids and its token ids (rewritten by the taker);
 *   - loads v's home index slot, whose line is on its way since
 *     BKV__EVICT_AHEAD calls (a prefetch may be dropped, a load is not,
 *     and the removal's first read is that slot).
 * The victims' ids lie in order in the LRU's slots, so none of these waits
 * for another; each stage is a hint: any v in the slot array is safe,
 * whatever the slots hold. Returns the slot after v (-1: none). */
static inline int32_t bkv__evict_ahead(const bkv__kv *kv, int32_t v)
{
	int32_t b = kv->lru[v], f = bkv__lru_peek(kv, v, 2 * BKV__EVICT_AHEAD);


	if (f >= 0)
		bkv__block_prefetch(kv, f);
	if ((f = bkv__lru_peek(kv, v, BKV__EVICT_AHEAD)) >= 0) {
		const bkv__block *k = &kv->blk[f];
		const int32_t *t = bkv__tok(kv, f);

		if (k->parent >= 0)
			BKV__PREFETCH_W(&kv->blk[k->parent].kids);
		bkv__slot_prefetch(kv, k->hash);
		BKV__PREFETCH_W(t);
		BKV__PREFETCH_W(t + kv->bt - 1);
	}
	if (b >= 0)
		(void)*(const volatile int32_t *)&kv->index[bkv__index_tag(kv->blk[b].hash) &
							    kv->index_mask].b;
	return bkv__lru_next(kv, v);
}

/* ---- kv/frames.c ---------------------------------------------------------- */

/* The token store's alignment: a block of 16 tokens is one cache line. */
#define BKV__TOK_ALIGN 64u

/* Bytes of the token store's allocation (the ids and the slack that
 * aligns them). */
static inline size_t bkv__kv_tok_bytes(size_t nb, size_t bt)
{
	return nb * bt * sizeof(int32_t) + BKV__TOK_ALIGN;
}

/* Bytes of the LRU's allocation: its slots, chunk records (and the
 * sentinel) and the slack that aligns the slots (0 without prefix
 * cache). */
static inline size_t bkv__kv_lru_bytes(const bkv__kv *kv)
{
	return kv->lru ? (size_t)kv->lru_chunks * (BKV__LRU_SLOTS * sizeof(int32_t) +
						   sizeof(bkv__lru_chunk)) +
				 sizeof(bkv__lru_chunk) + BKV__TOK_ALIGN
		       : 0;
}

/* Allocate and initialise the frames (all free, popped 0, 1, ..., nb - 1),
 * the token store (written through now: no first-touch page fault inside a
 * step), and with prefix_cache the index and the transaction queue, with
 * event_capacity the event ring. BKV_OK or BKV_ENOMEM (then bkv__kv_free
 * releases what was allocated). */
int bkv__kv_init(bkv__kv *kv, const bkv_allocator *a, uint32_t block_tokens, uint32_t nb,
		 int prefix_cache, uint64_t hash_seed, uint32_t event_capacity);
void bkv__kv_free(bkv__kv *kv, const bkv_allocator *a);
/* The free list is empty: evict the oldest cached block (one exists). */
int32_t bkv__block_take_evict(bkv__kv *kv);
/* A block no longer pinned by anything: to the LRU tail if indexed (unless
 * dropping and it has no indexed children), else to the free list head. */
void bkv__block_release(bkv__kv *kv, int32_t b, int drop);
/* The last table reference of a block that is indexed, a pending copy's
 * source or queued in a transaction went. */
void bkv__block_put_slow(bkv__kv *kv, int32_t b, int drop);
/* Keep every cached ancestor from a up more recent than its child on the
 * LRU (a late release). */
void bkv__lru_lift(bkv__kv *kv, int32_t a);
/* The host cleared a device copy whose source is b: a COPY_SRC block is
 * unpinned (released when no table holds it), then its COPY_CHAIN
 * ancestors, child first. */
void bkv__block_copy_cleared(bkv__kv *kv, int32_t b);
/* Every cached block to the free list, the index emptied, one CLEARED
 * event. */
void bkv__kv_reset_cache(bkv__kv *kv);
/* Drain up to max pending events into out. */
uint32_t bkv__kv_events(bkv__kv *kv, bkv_kv_event *out, uint32_t max);

/* ---- kv/chunks.c ---------------------------------------------------------- */

/* Share the frames with a STATE group of k frames a unit: every frame is
 * flagged CHUNKED and the top `lent` whole chunks are lent to the group
 * now. Right after bkv__kv_init. BKV_OK or BKV_ENOMEM. */
int bkv__ck_init(bkv__kv *kv, const bkv_allocator *a, uint32_t k, uint32_t lent);
void bkv__ck_free(bkv__kv *kv, const bkv_allocator *a);
/* Bytes bkv__ck_init allocated (what bkv__ck_free frees); 0 when off. */
size_t bkv__ck_bytes(const bkv__kv *kv);
#define BKV__CK_ON_PART 1u  /* on ck_part */
#define BKV__CK_ON_EMPTY 2u /* on ck_empty */
#define BKV__CK_ON_IDLE 4u  /* on the idle list */

/* The chunk frame f lies in (ck_n: past the last whole one). */
static inline uint32_t bkv__ck_of(const bkv__kv *kv, int32_t f)
{
	uint32_t c = (uint32_t)f / kv->ck_k;

	return c < kv->ck_n ? c : kv->ck_n;
}

/* Put chunk c on the lists its counts name, O(1): idle when lendable
 * with no pinned frame; on ck_part when it has free frames and pinned ones
 * (or is the tail), on ck_empty when it has free frames and none pinned. */
static inline void bkv__ck_fix(bkv__kv *kv, uint32_t c)
{
	const int whole = c < kv->ck_n, lent = whole && kv->ck_lent[c];
	const unsigned idle = whole && !lent && kv->ck_pin[c] == 0 ? BKV__CK_ON_IDLE : 0;
	const unsigned alloc = lent || !kv->ck_nfree[c] ? 0
			       : !whole || kv->ck_pin[c] ? BKV__CK_ON_PART
							 : BKV__CK_ON_EMPTY;
	const int32_t ci = (int32_t)c;
	unsigned on = kv->ck_on[c];
	int32_t *head;

	if ((on & BKV__CK_ON_IDLE) != idle) {
		if (idle) {
			kv->ck_prev[c] = -1;
			kv->ck_next[c] = kv->ck_idle;
			if (kv->ck_idle >= 0)
				kv->ck_prev[kv->ck_idle] = ci;
			kv->ck_idle = ci;
			kv->nr_idle++;
		} else {
			if (kv->ck_prev[c] >= 0)
				kv->ck_next[kv->ck_prev[c]] = kv->ck_next[c];
			else
				kv->ck_idle = kv->ck_next[c];
			if (kv->ck_next[c] >= 0)
				kv->ck_prev[kv->ck_next[c]] = kv->ck_prev[c];
			kv->ck_prev[c] = kv->ck_next[c] = -1;
			kv->nr_idle--;
		}
	}
	if ((on & 3u) != alloc) {
		if (on & 3u) {
			head = (on & BKV__CK_ON_PART) ? &kv->ck_part : &kv->ck_empty;
			if (kv->ck_aprev[c] >= 0)
				kv->ck_anext[kv->ck_aprev[c]] = kv->ck_anext[c];
			else
				*head = kv->ck_anext[c];
			if (kv->ck_anext[c] >= 0)
				kv->ck_aprev[kv->ck_anext[c]] = kv->ck_aprev[c];
			kv->ck_aprev[c] = kv->ck_anext[c] = -1;
		}
		if (alloc) {
			head = alloc == BKV__CK_ON_PART ? &kv->ck_part : &kv->ck_empty;
			kv->ck_aprev[c] = -1;
			kv->ck_anext[c] = *head;
			if (*head >= 0)
				kv->ck_aprev[*head] = ci;
			*head = ci;
		}
	}
	kv->ck_on[c] = (uint8_t)(idle | alloc);
}

/* Frame b (CHUNKED) was just pinned: a cached frame hit. */
static inline void bkv__ck_pinned(bkv__kv *kv, int32_t b)
{
	uint32_t c = bkv__ck_of(kv, b);

	if (c < kv->ck_n) {
		kv->ck_pin[c]++;
		bkv__ck_fix(kv, c);
	}
}

/* Frame b's last pin went (it is cached or free now). */
static inline void bkv__ck_unpinned(bkv__kv *kv, int32_t b)
{
	uint32_t c = bkv__ck_of(kv, b);

	if (c < kv->ck_n) {
		BKV_ASSERT(kv->ck_pin[c] > 0);
		kv->ck_pin[c]--;
		bkv__ck_fix(kv, c);
	}
}

/* Push b (ref 0, not indexed) on the free list head: a chunked pool's
 * frame on its chunk's list. */
static inline void bkv__kv_free_push(bkv__kv *kv, int32_t b)
{
	bkv__block *k = &kv->blk[b];

	k->prev = -1;
	kv->nr_free++;
	if (kv->ck_k) {
		uint32_t c = bkv__ck_of(kv, b);

		k->next = kv->ck_free[c];
		kv->ck_free[c] = b;
		if (kv->ck_nfree[c]++ == 0)
			bkv__ck_fix(kv, c);
		return;
	}
	k->next = kv->free_head;
	kv->free_head = b;
}

/* A chunked pool's take (bkv__block_take finds free_head -1 always): a
 * free frame of a partly pinned chunk, else of an idle one, else the
 * cache's victim; its chunk counts the pin. */
int32_t bkv__ck_take(bkv__kv *kv);
/* bkv__ck_unpinned and bkv__kv_free_push out of line, for the release
 * path (kv/frames.c), whose plain pools' code stays as small as before. */
void bkv__ck_released(bkv__kv *kv, int32_t b);
void bkv__ck_push(bkv__kv *kv, int32_t b);

/* An idle chunk to lend: with clean, one whose frames are all free (-1:
 * none among the first few idle ones); else the idle chunk whose lending
 * costs the fewest evictions among those (-1: no idle chunk). */
int32_t bkv__ck_pick(const bkv__kv *kv, int clean);
/* Lend idle chunk c to the state group: its cached frames are evicted
 * (after the older cached blocks that hold children of them, in the
 * cache's order), its free frames leave the free list. */
void bkv__ck_lend(bkv__kv *kv, int32_t c);
/* Chunk c comes back from the state group: its frames go free. */
void bkv__ck_return(bkv__kv *kv, int32_t c);
/* Is frame f in a chunk lent to the state group? */
static inline int bkv__ck_is_lent(const bkv__kv *kv, uint32_t f)
{
	return kv->ck_k && f / kv->ck_k < kv->ck_n && kv->ck_lent[f / kv->ck_k];
}
/* The chunk accounting's invariants (CHECK_CHUNKS); 0 when off. */
int bkv__ck_check(const bkv__kv *kv);

/* Take a block for a sequence whose previous block is `parent` (-1: none):
 * pop the free list, or evict the oldest cached block. The caller has made
 * sure one exists. Returns it pinned (ref 1, fill 0). */
static inline int32_t bkv__block_take(bkv__kv *kv, int32_t parent)
{
	int32_t b = kv->free_head;
	bkv__block *k;

	if (LIKELY(b >= 0)) {
		k = &kv->blk[b];
		kv->free_head = k->next;
		kv->nr_free--;
	} else {
		b = bkv__block_take_evict(kv);
		k = &kv->blk[b];
	}
	BKV_ASSERT(k->ref == 0 && !BLOCK_IS_INDEXED(k) && k->kids == 0);
	k->ref = 1;
	k->fill = 0;
	k->parent = parent;
	k->next = k->prev = -1;
	kv->nr_used++;
	if (kv->grp) {
		kv->grp[b] = kv->take_group;
		kv->grp_used[kv->take_group]++;
	}
	return b;
}

/* ---- kv/cache.c ----------------------------------------------------------- */

#define BKV__HASH_ROOT 0x9e3779b97f4a7c15ull /* parent hash of block 0 */
uint64_t bkv__block_hash(uint64_t seed, uint64_t parent_hash, uint64_t key,
			 const int32_t *tokens, uint32_t n);
int32_t bkv__index_find(const bkv__kv *kv, uint64_t hash);
void bkv__index_insert(bkv__kv *kv, int32_t b);
void bkv__index_remove(bkv__kv *kv, int32_t b);
void bkv__lru_push(bkv__kv *kv, int32_t b);
void bkv__lru_unlink(bkv__kv *kv, int32_t b);
/* Index b (full, not indexed) if its parent is indexed (or it is logical
 * block 0) and its hash is not indexed yet. Returns the block indexed under
 * that hash already when that is why b was not indexed, else -1 (indexed,
 * queued in a transaction, or its parent not indexed). */
int32_t bkv__cache_add(bkv__kv *kv, int32_t b, uint64_t key);
/* bkv__cache_add's second half: b's parent is indexed (or b is logical
 * block 0), no transaction is open, and h is b's chain hash
 * (bkv__cache_hash). The transaction commit hashes its queue and
 * prefetches the index slots before it indexes any of them. */
int32_t bkv__cache_add_hashed(bkv__kv *kv, int32_t b, uint64_t key, uint64_t h);
/* b's chain hash under key, from its parent's hash (the parent indexed) or
 * the root's, and its tokens. */
uint64_t bkv__cache_hash(const bkv__kv *kv, int32_t b, uint64_t key);
/* The index slot where a probe for hash starts. */
uint32_t bkv__index_home(const bkv__kv *kv, uint64_t hash);
/* Take b out of the index (it must be INDEXED); updates parent kids. */
void bkv__cache_forget(bkv__kv *kv, int32_t b);
/* Record a KV event (STORED for b, REMOVED for b, or CLEARED with b = -1):
 * into the ring, or counted as dropped when it is full. No-op when events
 * are off. */
void bkv__event(bkv__kv *kv, bkv_kv_event_kind kind, int32_t b);
/* The same for host block h of the host cache (medium BKV_MEDIUM_HOST):
 * STORED with its hash, parent hash (has_parent 0: none) and key, REMOVED
 * with its hash; h -1: a KV connector's store (BKV_MEDIUM_EXTERNAL). */
void bkv__event_host(bkv__kv *kv, bkv_kv_event_kind kind, int32_t h, uint64_t hash,
		     uint64_t parent_hash, int has_parent, uint64_t key);
/* Evict the LRU head: it leaves the index and the LRU; returns it (ref 0,
 * in no list), or -1 when the LRU is empty. */
int32_t bkv__cache_evict(bkv__kv *kv);
/* Verified lookup: the indexed block holding tokens[0, bt) whose parent is
 * `parent` (-1: root) and key is `key`, or -1. *hash gets the chain hash. */
int32_t bkv__cache_lookup(const bkv__kv *kv, uint64_t parent_hash, int32_t parent,
			  uint64_t key, const int32_t *tokens, uint64_t *hash);
/* A run of verified lookups: the leading whole blocks of tokens[0, max *
 * block_tokens) the cache holds after block `parent` (-1: root; its chain
 * hash parent_hash), each found as bkv__cache_lookup finds it. Their ids go
 * to out[0, hits); returns hits; *relinked gets how many of them are on the
 * LRU. In a cold index (index_cold) it hashes blocks ahead and prefetches
 * their slots, blocks and tokens before verifying any. */
uint32_t bkv__cache_lookup_run(const bkv__kv *kv, uint64_t parent_hash, int32_t parent,
			       uint64_t key, const int32_t *tokens, uint32_t max, int32_t *out,
			       uint32_t *relinked);

/* Step transactions. Between begin and end, blocks that become full are not
 * entered into the prefix-cache index but queued, so no lookup can hit KV
 * that the current step has not computed yet; a commit indexes them (parents
 * first, calling the dedupe hook for content indexed already), an abort
 * forgets them except swapped-in blocks, which stay queued for the next
 * commit. */
void bkv__kv_txn_begin(bkv__kv *kv);
void bkv__kv_txn_end(bkv__kv *kv, int commit);
/* Queue a block that just became full (bkv__cache_add in a transaction). */
void bkv__kv_txn_defer(bkv__kv *kv, int32_t b);

/* ---- kv/value.c ----------------------------------------------------------- */

/* Eviction by value on (or one more user, taking the new prices): p0 + p1 x
 * depth is a block's recompute price; indexed blocks get their depths now.
 * BKV_OK or BKV_ENOMEM (nothing changed). */
int bkv__kv_value_on(bkv__kv *kv, const bkv_allocator *a, double p0, double p1);
/* Undo one bkv__kv_value_on; the last one frees the records (LRU again). */
void bkv__kv_value_off(bkv__kv *kv, const bkv_allocator *a);
/* The lane keeping rule on (pool/lanes.c): the value records on as one more
 * user, keeping another's prices; blocks released cold (bkv__block_put_cold)
 * are evicted first. BKV_OK or BKV_ENOMEM (nothing changed). */
int bkv__kv_lanes_on(bkv__kv *kv, const bkv_allocator *a);
/* Per-group frame counts on (pool/lanes.c, every frame free): 0, ENOMEM. */
int bkv__kv_groups_on(bkv__kv *kv, const bkv_allocator *a);
/* Undo bkv__kv_lanes_on (a no-op when it is not on). */
void bkv__kv_lanes_off(bkv__kv *kv, const bkv_allocator *a);
/* The segmented LRU on (BKV_EVICT_SEGMENTED): value records as one more
 * unpriced user, cached blocks placed again. BKV_OK or BKV_ENOMEM. */
int bkv__kv_seg_on(bkv__kv *kv, const bkv_allocator *a);
/* Undo bkv__kv_seg_on (a no-op when it is not on). */
void bkv__kv_seg_off(bkv__kv *kv, const bkv_allocator *a);
/* A sequence's close releasing n blocks (every lane's) begins; it ends. */
void bkv__kv_close_begin(bkv__kv *kv, uint32_t n);
void bkv__kv_close_end(bkv__kv *kv);
/* Retention priorities (needs the value records on): mode BKV__RET_BANDS or
 * BKV__RET_VALUE; allocates the expiry clocks. BKV_OK or BKV_ENOMEM. */
int bkv__kv_retain_on(bkv__kv *kv, const bkv_allocator *a, uint32_t mode);
/* Retention off (before bkv__kv_value_off); frees the expiry clocks. */
void bkv__kv_retain_off(bkv__kv *kv, const bkv_allocator *a);
/* Bytes of the value records and the expiry clocks now allocated. */
size_t bkv__kv_value_bytes(const bkv__kv *kv);
/* Indexed block b is given priority prio (0..BKV_RETENTION_PRIORITY_MAX)
 * until clock exp (UINT64_MAX: no expiry): kept when it has a higher one in
 * force, expiry extended on an equal one. A no-op with retention off. */
void bkv__kv_retain(bkv__kv *kv, int32_t b, uint32_t prio, uint64_t exp);
/* b was just indexed: its depth from its parent's, no hits yet. */
void bkv__val_indexed(bkv__kv *kv, int32_t b);
/* b was taken back from the cache (a hit): its decayed count grows. */
void bkv__val_hit(bkv__kv *kv, int32_t b);
/* A cached block was taken back (bkv__block_pin, with hit_slow): its value
 * record's hit (val) and a chunked frame's pin (kv/chunks.c). */
void bkv__block_hit_slow(bkv__kv *kv, int32_t b);
/* b joined the LRU (bkv__lru_push): to the tail of its value class. */
void bkv__val_push(bkv__kv *kv, int32_t b);
/* b left the LRU (bkv__lru_unlink): off its class list. */
void bkv__val_unlink(bkv__kv *kv, int32_t b);
/* Which block to evict by value (the LRU is not empty): the lowest class's
 * head without indexed children (one with them moves up a class; at most 2
 * x BKV__VAL_CLASSES moves, then the LRU head); bkv__cache_evict evicts it. */
int32_t bkv__val_pick(bkv__kv *kv);
/* Value records consistent (depths follow parents, every cached block on
 * the class list it records, once): 0 or CHECK_VALUE. */
int bkv__val_check(const bkv__kv *kv);

/* ---- frames, inline ------------------------------------------------------- */

/* Add a reference to a block found by a prefix lookup. */
static inline void bkv__block_pin(bkv__kv *kv, int32_t b)
{
	bkv__block *k = &kv->blk[b];

	if (k->ref++ == 0 && !(k->flags & BKV__BLOCK_COPY_SRC)) {
		bkv__lru_unlink(kv, b);
		kv->nr_used++;
		BKV__GRP_COUNT(kv, b, grp_used, 1);
		kv->tokens += k->fill;
		if (kv->hit_slow)
			bkv__block_hit_slow(kv, b);
	}
}

/* Drop a table reference. At zero: to the LRU tail if indexed (unless
 * dropping and it has no indexed children), else to the free list head. */
static inline void bkv__block_put(bkv__kv *kv, int32_t b, int drop)
{
	bkv__block *k = &kv->blk[b];

	BKV_ASSERT(k->ref > 0);
	if (--k->ref)
		return;
	if (LIKELY(!(k->flags & (BKV__BLOCK_INDEXED | BKV__BLOCK_COPY_SRC | BKV__BLOCK_TXN |
				 BKV__BLOCK_CHUNKED)))) {
		kv->nr_used--;
		BKV__GRP_COUNT(kv, b, grp_used, -1);
		kv->tokens -= k->fill;
		k->next = kv->free_head;
		kv->free_head = b;
		kv->nr_free++;
		return;
	}
	if (!drop && !(k->flags & (BKV__BLOCK_COPY_SRC | BKV__BLOCK_TXN | BKV__BLOCK_CHUNKED))) {
		/* indexed: cached on the LRU tail */
		kv->nr_used--;
		BKV__GRP_COUNT(kv, b, grp_used, -1);
		kv->tokens -= k->fill;
		bkv__lru_push(kv, b);
		if (k->parent >= 0 && BLOCK_IS_CACHED(&kv->blk[k->parent]))
			bkv__lru_lift(kv, k->parent);
		return;
	}
	bkv__block_put_slow(kv, b, drop);
}

/* bkv__block_put of a block worth little cached (a lane block its window
 * left behind where no hit is expected to end, pool/lanes.c). With the
 * lane keeping rule on, a last reference that sends b straight to the LRU
 * sends it cold: class 0, evicted before any block released otherwise.
 * Else exactly bkv__block_put(kv, b, 0). */
static inline void bkv__block_put_cold(bkv__kv *kv, int32_t b)
{
	const bkv__block *k = &kv->blk[b];

	if (kv->val_lanes && k->ref == 1 &&
	    (k->flags & (BKV__BLOCK_INDEXED | BKV__BLOCK_COPY_SRC | BKV__BLOCK_TXN)) ==
		    BKV__BLOCK_INDEXED)
		kv->val[b].cold = 1;
	bkv__block_put(kv, b, 0);
}

/* Is b waiting in the open transaction's queue? */
static inline int bkv__kv_txn_queued(const bkv__kv *kv, int32_t b)
{
	return kv->txn_active && (kv->blk[b].flags & BKV__BLOCK_TXN);
}

/* Record the owner's note for queued block b (handed back to the dedupe
 * hook at commit). */
static inline void bkv__kv_txn_note(bkv__kv *kv, int32_t b, uint64_t owner)
{
	kv->txn_owner[kv->blk[b].prev] = owner;
}

/* ---- kv/check.c ----------------------------------------------------------- */

/* bkv_pool_check's answers, the first violated invariant: one numbering
 * for both layers. kv/check.c checks 1-10, 14, 17 and (through
 * kv/value.c) 18 and (through kv/chunks.c) 19; pool/check.c 11-13, 15 and
 * 16 (and pool/state.c 19 for the units). */
enum {
	CHECK_OK = 0,
	CHECK_COUNTS = 1,      /* nr_free + nr_used + nr_cached != device_blocks */
	CHECK_FREE_LIST = 2,   /* free list: length != nr_free, a cycle, or a
				  member pinned or indexed */
	CHECK_LRU = 3,         /* LRU: length != nr_cached, a chunk's links,
				  range or count broken, neighbours that fit
				  in one chunk, or a member pinned, not
				  indexed or not at the slot it records */
	CHECK_STATES = 4,      /* per-block state counts != nr_used, nr_free,
				  nr_cached, nr_indexed */
	CHECK_FILL = 5,        /* fill > block_tokens, or an indexed block not
				  full */
	CHECK_INDEX = 6,       /* index entries != indexed blocks, a slot's tag
				  not its block's, or an indexed block not
				  findable by its hash */
	CHECK_PARENT = 7,      /* an indexed block's parent is not indexed, or
				  a pinned indexed block's parent is not
				  pinned */
	CHECK_LRU_ORDER = 8,   /* a cached block's parent is neither pinned nor
				  more recent on the LRU */
	CHECK_KIDS = 9,        /* kids != indexed blocks naming it as parent */
	CHECK_HASH = 10,       /* an indexed block's hash != its recomputed chain
				  hash (token store damaged) */
	CHECK_SEQS = 11,       /* a slot: n_blocks != ceil(len/bt), bad ids,
				  nr_seqs/nr_swapped/slot ring mismatch, an
				  uncached mark on a swapped sequence or one
				  with no full block */
	CHECK_SEQ_FILL = 12,   /* a device-resident table's block has fewer
				  tokens than the sequence reads from it */
	CHECK_REFS = 13,       /* a ref count != table references + chain
				  references of COPY_CHAIN blocks */
	CHECK_TOKENS = 14,     /* tokens != sum of fill over pinned blocks */
	CHECK_HOST = 15,       /* host tier: free list, states, used blocks !=
				  swapped tables (each exactly once), pending !=
				  swap-in copy sources */
	CHECK_PENDING = 16,    /* a pending copy's block lacks its PEND flag */
	CHECK_VALUE = 18,      /* eviction by value: an indexed block's depth
				  is not its parent's + 1 (0 without parent),
				  the class lists' links, masks or
				  membership != the cached blocks, or a
				  cold block not cached in class 0 under
				  the lane keeping rule */
	CHECK_CHUNKS = 19,     /* frames shared with a STATE group: a chunk's
				  pinned count, its idle-list membership or
				  its lent state wrong, nr_lent wrong, a lent
				  frame not clean, or the free list's back
				  links broken */
	CHECK_TXN = 17,        /* a TXN (queued) block not pinned, not full,
				  indexed, or not at its queue slot (between
				  transactions only the swapped-in blocks an
				  abort carried over are queued) */
};


/* The block invariants (bkv_pool_check's CHECK_COUNTS..CHECK_HASH and
 * CHECK_TXN numbers): 0 or the first violated one. scratch: nb entries. */
int bkv__kv_check(const bkv__kv *kv, uint32_t *scratch);
int bkv__kv_check_txn(const bkv__kv *kv);

#endif /* BKV_KV_H */
