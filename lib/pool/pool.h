/*
 * pool.h - the pool layer: sequences (address spaces) and their block
 * tables, copy-on-write, the host (swap) tier, pending copy lists, export
 * and import, stats and the pool checker, over the KV layer (kv/kv.h).
 *
 * struct bkv_pool embeds the KV layer's state (kv, its first field) and
 * owns the rest. Owners: pool/pool.c (create/destroy, copies, admission
 * checks, stats, events, transactions), pool/seq.c (open, fork, close,
 * append, truncate, prefix hits), pool/swap.c (the host tier), pool/image.c
 * (export/import), pool/check.c (bkv_pool_check). The scheduler appends a
 * decode row's token through the inline appender below and never writes a
 * pool field itself.
 */
#ifndef BKV_POOL_H
#define BKV_POOL_H

#include "kv/kv.h"

/* bkv__seq.state */
#define BKV__SEQ_FREE 0    /* slot unused; its table buffer is kept */
#define BKV__SEQ_OPEN 1    /* table holds device block ids */
#define BKV__SEQ_SWAPPED 2 /* table holds host block ids */

/* A sequence slot (an address space). Slots are preallocated (max_seqs). */
typedef struct bkv__seq {
	int32_t *table;    /* [cap] block ids, [0, n_blocks) in use; kept across
			      slot reuse, grown geometrically, freed at destroy */
	uint32_t cap;      /* entries allocated in table; a multiple of 4, so
			      that bkv__fill_decode may copy whole groups of
			      four entries */
	uint32_t n_blocks; /* entries in use == ceil(len / block_tokens) */
	uint32_t len;      /* tokens in the sequence, < 2^31 */
	uint32_t clean;    /* table entries [0, clean) are as the scheduler last
			      sent them to a persistent-layout host (0 for a
			      new sequence); a write below n_blocks lowers it
			      (copy-on-write, a cached block swapped in, a
			      truncate, swap, commit's duplicate swap) */
	uint16_t gen;      /* generation, 1..4095, the id's high 12 bits */
	uint8_t state;     /* BKV__SEQ_* */
	uint8_t pin;       /* 1: the holder of a prefix pin (pool/pin.c):
			      its table holds the pinned blocks; its id is
			      no sequence's (bkv__seq_get refuses it) */
	uint8_t uncached;  /* 1: open on the device with a full block when
			      bkv_pool_reset_cache emptied the index: none
			      of its blocks is indexed, and none it fills
			      will be (a block is indexed only under an
			      indexed parent) until a truncate leaves it no
			      full block; a fork inherits it, a swap-out
			      clears it (swap-in indexes the blocks again) */
	uint8_t noindex;   /* 1: a KV connector loads into its blocks: none it
			      fills is offered to the prefix cache until
			      bkv__seq_publish (pool/connect.c) */
	uint64_t key;      /* prefix-cache key for its whole life */
} bkv__seq;

/* One sequence slot's table in a lane (a KV group after the first; see
 * bkv__glane). Its logical length is the slot's n_blocks (lane 0's). A
 * window or chunked lane holds every entry from the first block its next
 * token reads (bkv__lane_first); below that, entries [0, lo) are -1
 * (released) and entries in [lo, first) may be -1 too: a prefix hit does
 * not take blocks the sequence will not read, and the blocks it held before
 * the hit stay until its next append's trim (a rolled-back step truncates
 * back to them). */
typedef struct bkv__lseq {
	int32_t *table; /* [cap] block ids (host ids while swapped), -1 below lo;
			   kept across slot reuse, freed at destroy */
	uint32_t cap;   /* entries allocated; a multiple of 4 */
	uint32_t lo;    /* entries [0, lo) are -1; lo <= the first block the
			   next token reads, <= the slot's n_blocks */
	uint32_t clean; /* as bkv__seq.clean, for this lane's table */
	uint32_t hit_end;    /* keep point: the block where the slot's last
				prefix lookup left lane 0's cached chain
				(0: none); see pool/lanes.c */
	uint32_t prompt_end; /* keep point: the block where its last
				multi-token append ended (0: none) */
	uint32_t pad;   /* zero */
} bkv__lseq;

/* A lane: the tables of one KV group after the first (group 0 is full
 * attention and lives in bkv_pool.seqs, the plain pool's tables). Its
 * blocks come from the same frames; a block of logical position i is the
 * child of lane 0's block i - 1 in the prefix cache (so it is hashed from
 * the same chain and dies before it), under the sequence's key xor the
 * lane's salt. docs/design.md, "KV groups". */
typedef struct bkv__glane {
	uint32_t kind;   /* BKV_GROUP_FULL, _WINDOW or _CHUNKED */
	uint32_t span;   /* the group's span (window W, chunk C), 0 for FULL */
	uint32_t group;  /* its index in cfg.groups */
	uint32_t pad;    /* zero */
	uint64_t salt;   /* xor-ed into the sequence key for its blocks */
	bkv__lseq *seqs; /* [max_seqs], parallel to bkv_pool.seqs */
} bkv__glane;

/* A pending copy list of one bkv_copy_kind. */
typedef struct bkv__copy_list {
	bkv_copy *v;  /* [cap]; [0, n) pending, in the order to perform */
	uint32_t n;   /* pending copies */
	uint32_t cap; /* allocated entries; grows, never shrinks */
} bkv__copy_list;

/* The host cache's probe runs (pool/hcache.c): BKV__HC_PROBE consecutive
 * evictions in every BKV__HC_PROBE x BKV__HC_PROBE_EVERY are demoted
 * whatever the prices say. */
#define BKV__HC_PROBE 4096u
#define BKV__HC_PROBE_EVERY 8u

/* bkv_pool.host_state[] */
#define BKV__HOST_FREE 0    /* on the host free list */
#define BKV__HOST_USED 1    /* in the table of a swapped sequence */
#define BKV__HOST_PENDING 2 /* source of a pending swap-in copy; freed when
			       the swap-in copies are cleared */
#define BKV__HOST_DEMOTING 3 /* host cache: destination of a pending
				swap-out copy of an evicted device block;
				cached when the copy clears (pool/hcache.c) */
#define BKV__HOST_CACHED 4  /* host cache: a block's KV, in the host index;
			       on the host LRU unless a pending swap-in
			       copy reads it (hc_reads) */

struct bkv_pool {
	bkv__kv kv;            /* the KV layer: frames, free list, prefix cache,
				  event ring, transaction queue (first: the
				  hot fields stay at the pool's start) */
	bkv_allocator alloc;   /* copied at create; every allocation */
	bkv_pool_config cfg;   /* copied at create, validated */
	uint32_t nh;           /* cfg.host_blocks */
	uint32_t *scratch;     /* [bkv__pool_scratch_len] bkv_pool_check's
				  workspace */
	int32_t *host_next;    /* [nh] host free list links */
	uint8_t *host_state;   /* [nh] BKV__HOST_* */
	int32_t *host_tok;     /* [nh * bt] token ids of swapped blocks */
	int32_t host_free_head; /* host free list head (LIFO), -1 empty */
	uint32_t host_free;    /* host blocks free */
	uint32_t host_pending; /* host blocks BKV__HOST_PENDING */
	/* the host cache (pool/hcache.c); hc_on 0 without one */
	int hc_on;             /* cfg.host_cache with a host tier and the
				  prefix cache */
	int hc_priced;         /* the scheduler gave prices: demote by them
				  (else every block) */
	double hc_p0, hc_p1;   /* recompute price of a block at depth d:
				  p0 + p1 x d, us */
	double hc_load;        /* a reload's cost to its step, us (the
				  link's time per block) */
	double hc_store;       /* a demotion's cost to its step, us: the
				  link's time, or 0 when the host overlaps
				  copies with its kernels */
	double hc_dem;         /* demotions, decayed (halved every nh) */
	double hc_rel;         /* of those, reloaded at least once: hc_rel /
				  hc_dem estimates a demotion's chance of
				  paying off */
	uint8_t *hc_reused;    /* [nh] 1 once a cached block was reloaded
				  since its demotion */
	uint64_t *hc_hash;     /* [nh] a cached or demoting block's chain hash */
	uint64_t *hc_key;      /* [nh] its caller key */
	uint64_t *hc_phash;    /* [nh] its parent's chain hash
				  (BKV__HASH_ROOT: a first block) */
	uint8_t *hc_src;       /* [device blocks] 1 while the block is the
				  source of a pending demotion's copy: not
				  demoted again until it clears */
	int32_t *hc_prev;      /* [nh] host LRU: the next older cached block,
				  -1 (also off the LRU) */
	int32_t *hc_next;      /* [nh] the next more recent one, -1 */
	uint32_t *hc_reads;    /* [nh] pending swap-in copies reading it */
	bkv__islot *hc_index;  /* [hc_mask + 1] hash -> cached host block */
	uint32_t hc_mask;      /* index capacity - 1 (>= 2 x nh, pow2) */
	int32_t hc_head;       /* oldest cached block on the LRU, -1 */
	int32_t hc_tail;       /* newest, -1 */
	uint32_t hc_lru;       /* blocks on the host LRU */
	uint32_t hc_cached;    /* blocks BKV__HOST_CACHED (indexed) */
	uint32_t hc_demoting;  /* blocks BKV__HOST_DEMOTING */
	uint64_t hc_demoted;   /* evicted device blocks copied to the host */
	uint64_t hc_kept;      /* evicted device blocks the host held already */
	uint64_t hc_skipped;   /* evicted device blocks not kept (shallower
				  than hc_min_depth, a pending copy, or no
				  host block to spare) */
	uint64_t hc_hits;      /* prefix-hit blocks reloaded from the host */
	uint64_t hc_evictions; /* host cache blocks dropped for room */
	bkv__seq *seqs;        /* [max_seqs] slots */
	uint32_t *slot_ring;   /* [max_seqs] FIFO of free slot indices */
	uint32_t ring_head;    /* index in slot_ring of the next slot to use */
	uint32_t nr_seqs;      /* open sequences; free slots = max - nr_seqs */
	uint32_t nr_pins;      /* of which prefix pins' holders (pool/pin.c) */
	uint32_t seq_reserved; /* free slots a scheduler keeps for the forks
				  its running requests will still make (set
				  each step, bkv__pool_reserve_seqs; 0 with
				  none); a pin leaves them free:
				  nr_seqs + seq_reserved <= max_seqs while
				  the scheduler's invariant 31 holds */
	uint64_t pin_blocks;   /* table entries of the pins' holders (a block
				  two pins hold counts twice) */
	uint32_t nr_swapped;   /* open sequences on the host tier */
	bkv__copy_list copies[3]; /* pending copies by bkv_copy_kind */
	bkv__copy_list so_held[BKV_OVERLAP_MAX_DEPTH]; /* overlapped
				     scheduling: the swap-out copies
				     (host-cache demotions) of the steps in
				     flight, each held apart when a later step
				     is planned, whose own go to
				     copies[SWAP_OUT]; a ring, oldest at
				     so_head, each cleared when its step
				     completes (pool/overlap.c) */
	uint32_t so_head;      /* the oldest held list */
	uint32_t so_n;         /* held lists */
	uint64_t hit_tokens;   /* counters reported by bkv_pool_stats_get */
	uint64_t miss_tokens;
	uint64_t cow_copies;
	uint64_t swap_out_blocks;
	uint64_t swap_in_blocks;
	uint32_t n_lanes;      /* KV groups after the first (0: one group) */
	bkv_kv_group groups[BKV_MAX_GROUPS]; /* cfg.groups copied (cfg.groups
				  points here); groups[0] is full attention */
	bkv__glane lanes[BKV_MAX_GROUPS - 1]; /* [n_lanes] groups 1.. */
	/* sequences appended inside the open step transaction, trimmed at its
	 * commit (pool/lanes.c); allocated only with lanes */
	uint32_t *lane_stamp;  /* [max_seqs] txn_serial of each slot's last
				  append inside a transaction */
	uint32_t *lane_touched; /* [max_seqs] slots appended in this one */
	uint32_t n_touched;    /* entries in lane_touched */
	uint32_t txn_serial;   /* transactions begun (never 0 inside one) */
	int grouped;           /* n_lanes or a STATE group: appends take the
				  groups' path (pool/lanes.c) */
	/* a recurrent-state group (pool/state.c); st_units 0 without one */
	uint32_t st_group;     /* its index in groups (the last) */
	uint32_t st_units;     /* units in the arena; with st_share the
				  chunks (kv.ck_n), each a unit or not */
	uint32_t st_frames;    /* frames per unit (bkv_kv_state_frames) */
	uint32_t st_first;     /* the arena's first frame (kv.nb); 0 with
				  st_share (unit u is chunk u) */
	int st_share;          /* bkv_pool_config.state_share: units are
				  chunks lent by the KV layer (kv/chunks.c) */
	uint32_t st_floor;     /* with st_share: units kept however idle
				  (state_units) */
	uint32_t st_held;      /* units the group holds: st_units, or with
				  st_share the chunks lent to it */
	uint32_t st_interval;  /* checkpoint interval in tokens (0: none) */
	int st_fenced;         /* overlap: bkv__state_hit_ok */
	uint32_t st_map_mask;  /* st_map capacity - 1 (a power of two) */
	uint64_t st_salt;      /* xor-ed into a checkpoint's chain hash */
	uint32_t *st_ref;      /* [st_units] live references (branches),
				  KV connector holds included */
	uint32_t *st_xfer;     /* [st_units] of which a KV connector's saves
				  in flight (pool/connect.c) */
	uint32_t *xfer_ref;    /* [kv.nb] references a KV connector's saves in
				  flight hold on further groups' blocks (a
				  window may release them meanwhile); NULL
				  until bkv__pool_xfer_on (pool/connect.c) */
	uint8_t *st_flags;     /* [st_units] checkpoint / scratch flags */
	uint64_t *st_hash;     /* [st_units] a checkpoint's key */
	int32_t *st_next;      /* [st_units] free list / LRU links */
	int32_t *st_prev;      /* [st_units] LRU links */
	int32_t *st_map;       /* [st_map_mask + 1] checkpoint key -> unit */
	int32_t st_free_head;  /* free units (LIFO), -1 empty */
	uint32_t st_nr_free;   /* units on the free list */
	int32_t st_lru_head;   /* oldest unreferenced checkpoint, -1 none */
	int32_t st_lru_tail;   /* newest */
	uint32_t st_nr_cached; /* unreferenced checkpoints */
	uint32_t st_nr_indexed; /* checkpoints (entries of st_map) */
	int32_t *st_live;      /* [max_seqs] each slot's live unit, -1 none */
	int32_t *st_scratch;   /* [max_seqs] its scratch unit, -1 none */
	uint32_t *st_len;      /* [max_seqs] tokens its live state covers */
	int32_t *st_undo;      /* [max_seqs] the live unit a hit replaced in
				  the open step (held, so that a rollback can
				  go back to it; -1 the zero state), or
				  BKV__ST_NO_UNDO */
	uint32_t *st_undo_len; /* [max_seqs] the tokens st_undo covers */
	int32_t *st_pend;      /* [max_seqs] a state at a multiple of the
				  interval that a later call of the same step
				  superseded, held to be indexed at commit, or
				  -1 */
	uint32_t *st_pend_len; /* [max_seqs] the tokens st_pend covers */
	int32_t *st_spec;      /* [max_seqs] a speculated row's per-token
				  states in the open step: the first unit of
				  a chain (st_next) covering st_spec_base,
				  st_spec_base + 1, ... up to the scratch's;
				  -1 none */
	uint32_t *st_spec_base; /* [max_seqs] the tokens st_spec's first unit
				  covers */
	int32_t *st_mid;       /* [max_seqs * BKV_OVERLAP_MAX_DEPTH] the
				  states outstanding steps ended at, between
				  st_undo and live, oldest first
				  (pool/state_mid.c) */
	uint32_t *st_mid_len;  /* [max_seqs * BKV_OVERLAP_MAX_DEPTH] the tokens
				  each covers */
	uint32_t *st_mid_n;    /* [max_seqs] entries */
	int32_t *st_host;      /* [max_seqs * st_frames] a swapped state's
				  host blocks */
	uint64_t st_ckpts;     /* checkpoints indexed */
	uint64_t st_ckpt_hits; /* prefix hits that read a checkpoint */
	uint64_t st_evictions; /* checkpoints evicted for scratch units */
};

/* Sequence ids: slot | gen << BKV__SEQ_SLOT_BITS with a 12-bit generation
 * (the scheduler decodes ids too, bkv__append_fast). */
#define BKV__SEQ_SLOT_BITS 20
#define BKV__SEQ_SLOT_MASK ((1u << BKV__SEQ_SLOT_BITS) - 1)
#define BKV__SEQ_GEN_MAX 0xFFFu

/* ---- pool/seq.c: helpers the pool layer's files share --------------------- */

/* The open slot an id names, pin holders included (pool/pin.c), or NULL. */
static inline bkv__seq *bkv__slot_get(const bkv_pool *pool, uint32_t id)
{
	uint32_t slot = id & BKV__SEQ_SLOT_MASK;
	bkv__seq *s;

	if (slot >= pool->cfg.max_seqs)
		return NULL;
	s = &pool->seqs[slot];
	if (s->state == BKV__SEQ_FREE || s->gen != (id >> BKV__SEQ_SLOT_BITS))
		return NULL;
	return s;
}

/* The sequence an id names, or NULL: a prefix pin's id names no sequence,
 * so every sequence call answers it as an unknown id (BKV_ENOENT) and
 * changes nothing; only bkv_pool_unpin takes it. */
static inline bkv__seq *bkv__seq_get(const bkv_pool *pool, uint32_t id)
{
	bkv__seq *s = bkv__slot_get(pool, id);

	return s && !s->pin ? s : NULL;
}

static inline uint32_t bkv__seq_id(const bkv_pool *pool, const bkv__seq *s)
{
	return (uint32_t)(s - pool->seqs) | ((uint32_t)s->gen << BKV__SEQ_SLOT_BITS);
}

static inline uint32_t bkv__blocks_for(const bkv_pool *pool, uint64_t tokens)
{
	return (uint32_t)((tokens + pool->kv.bt - 1) >> pool->kv.bt_shift);
}

/* Block s->table[pos] just became full: offer it to the prefix cache; the
 * transaction queue notes where it sits (sequence slot << 32 | table
 * position) for commit's duplicate swap (pool/pool.c pool_dedupe). */
static inline void bkv__seq_block_filled(bkv_pool *pool, const bkv__seq *s, uint32_t pos)
{
	int32_t b = s->table[pos];

	if (!pool->kv.index || s->noindex)
		return;
	(void)bkv__cache_add(&pool->kv, b, s->key);
	if (bkv__kv_txn_queued(&pool->kv, b))
		bkv__kv_txn_note(&pool->kv, b, (uint64_t)(uint32_t)(s - pool->seqs) << 32 | pos);
}

/* Tokens of logical block i of a sequence of len tokens. */
static inline uint32_t bkv__block_len(const bkv_pool *pool, uint32_t len, uint32_t i)
{
	uint32_t start = i * pool->kv.bt;

	return BKV_MIN(pool->kv.bt, len - start);
}

/* Forget the pending swap-in copies no call carried (their sequences went
 * before one did): their destinations leave the prefix cache (they hold
 * no KV), then the copies clear. */
void bkv__pool_forget_swap_ins(bkv_pool *pool);
/* End a sequence: dropped, or cut to keep (UINT32_MAX: as it is) and
 * closed (pool/connect.c). */
void bkv__pool_seq_end(bkv_pool *pool, uint32_t seq, int drop, uint32_t keep);
/* ---- KV connectors (pool/connect.c) ---- */
/* A load's append: n tokens into fresh blocks marked noindex, without
 * host-cache demotions of the blocks it evicts (BKV_OK or the append's
 * error, nothing changed). */
int bkv__seq_append_load(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n);
/* Does a pending copy read or write a device block the entries name? */
int bkv__xfer_copies_touch(const bkv_pool *pool, const bkv_kv_xfer_block *e, uint32_t n);
/* Block the prefix cache from the blocks seq fills (on 1) or not (0). */
void bkv__seq_noindex(bkv_pool *pool, uint32_t seq, int on);
/* A connector's load into seq completed: offer its full blocks from logical
 * block `from` on to the prefix cache, every group's. */
void bkv__seq_publish(bkv_pool *pool, uint32_t seq, uint32_t from);
/* Fill out[] with the transfer entries of logical blocks [from, to) of seq:
 * group 0's (hashes h0[i - from]), every further attention group's blocks
 * held there, and with a STATE group the live unit (ending block to - 1).
 * Returns the count (at most cap). */
uint32_t bkv__seq_xfer_ents(const bkv_pool *pool, uint32_t seq, uint32_t from, uint32_t to,
			    const uint64_t *h0, bkv_kv_xfer_block *out, uint32_t cap);
/* The same for a save, from block `from` up to *to, stopping at group 0's
 * first block not indexed (and, cap > 0, at cap / (groups + 1) blocks): *to
 * receives where it stopped; every group's indexed blocks there, under
 * their own hashes, and a STATE group's checkpoints ending there (held
 * until bkv__xfer_release). cap 0 only finds the stop. */
uint32_t bkv__seq_save_ents(bkv_pool *pool, uint32_t seq, uint32_t from, uint32_t *to,
			    bkv_kv_xfer_block *out, uint32_t cap);
/* A KV connector will save: its per-block holds (BKV_OK, BKV_ENOMEM). */
int bkv__pool_xfer_on(bkv_pool *pool);
/* A save completed: the blocks and state units its entries held go back. */
void bkv__xfer_release(bkv_pool *pool, const bkv_kv_xfer_block *e, uint32_t n);
/* The longest load of blocks [from, e) with e <= to for which has() says
 * the store holds every further group's blocks and the state at e (h0:
 * group 0's hashes from block 0); from when none. to itself without has
 * or without such groups. */
uint32_t bkv__xfer_fit(const bkv_pool *pool, uint64_t key, const int32_t *tokens, const uint64_t *h0,
		       uint32_t from, uint32_t to, int (*has)(void *, uint64_t), void *user);
/* Entries a transfer of nb logical blocks can take. */
uint32_t bkv__xfer_ents_max(const bkv_pool *pool, uint32_t nb);
/* May seq be cut back to len tokens (every group keeps what it reads)? */
int bkv__seq_can_cut(const bkv_pool *pool, uint32_t seq, uint32_t len);
/* Emit an external STORED event for a block saved under hash. */
void bkv__event_external(bkv_pool *pool, uint64_t hash);

/* Make room for n entries in s's table. 0 or BKV_ENOMEM (table unchanged). */
int bkv__table_reserve(bkv_pool *pool, bkv__seq *s, uint32_t n);
/* Grow a block-id table (*table, *cap entries) to room for n > *cap entries,
 * geometrically, a multiple of 4; none: the new entries read -1. 0 or
 * BKV_ENOMEM (unchanged). Every table of the pool grows through it. */
int bkv__ids_grow(bkv_pool *pool, int32_t **table, uint32_t *cap, uint32_t n, int none);
/* Copy-on-write of block b (shared or indexed; its first off tokens are the
 * writer's): a fresh block after parent with those tokens, a device copy
 * recorded, the writer's reference to b dropped (b stays pinned as the
 * copy's source). Room for the block and the copy is reserved. Returns the
 * new block; the caller puts it in its table. */
int32_t bkv__cow_block(bkv_pool *pool, int32_t b, int32_t parent, uint32_t off);
/* Swap-in of host block hb holding w tokens: a device block after parent
 * with its tokens and a pending host->device copy (room reserved). */
int32_t bkv__swap_in_block(bkv_pool *pool, int32_t hb, int32_t parent, uint32_t w);
/* Make room for `extra` more copies of one kind. 0 or BKV_ENOMEM. */
int bkv__copies_reserve(bkv_pool *pool, int kind, uint32_t extra);
/* Append a copy (room reserved). */
static inline void bkv__copy_push(bkv_pool *pool, int kind, int32_t src, int32_t dst)
{
	bkv__copy_list *l = &pool->copies[kind];

	BKV_ASSERT(l->n < l->cap);
	l->v[l->n].src = src;
	l->v[l->n].dst = dst;
	l->n++;
}
/* A sequence that must be open on the device tier: BKV_OK and *out, or
 * BKV_ENOENT (unknown or closed id), BKV_ESTATE (swapped out). */
static inline int bkv__seq_resident(const bkv_pool *pool, uint32_t id, bkv__seq **out)
{
	bkv__seq *s = bkv__seq_get(pool, id);

	if (!s)
		return BKV_ENOENT;
	if (s->state == BKV__SEQ_SWAPPED)
		return BKV_ESTATE;
	*out = s;
	return BKV_OK;
}

/* The next free slot (slots are reused FIFO), or NULL when all are open. */
static inline bkv__seq *bkv__slot_peek(bkv_pool *pool)
{
	if (pool->nr_seqs == pool->cfg.max_seqs)
		return NULL;
	return &pool->seqs[pool->slot_ring[pool->ring_head]];
}

/* Open the slot bkv__slot_peek answered, empty, under key. */
static inline void bkv__slot_open(bkv_pool *pool, bkv__seq *s, uint64_t key)
{
	BKV_ASSERT(s == &pool->seqs[pool->slot_ring[pool->ring_head]]);
	pool->ring_head = pool->ring_head + 1 == pool->cfg.max_seqs ? 0 : pool->ring_head + 1;
	pool->nr_seqs++;
	s->state = BKV__SEQ_OPEN;
	s->pin = 0;
	s->uncached = 0;
	s->noindex = 0;
	s->key = key;
	s->len = 0;
	s->n_blocks = 0;
	s->clean = 0;
}

/* Table entry pos of s changed (pos < n_blocks before the change). */
static inline void bkv__seq_dirty(bkv__seq *s, uint32_t pos)
{
	if (pos < s->clean)
		s->clean = pos;
}

/* Lane table entry pos changed. */
static inline void bkv__seq_dirty_lane(bkv__lseq *ls, uint32_t pos)
{
	if (pos < ls->clean)
		ls->clean = pos;
}

/* ---- pool/lanes.c: KV groups after the first -------------------------------- */

/* The first logical block a sequence of len tokens reads at its next token
 * in lane ln (0 for FULL). */
uint32_t bkv__lane_first(const bkv_pool *pool, const bkv__glane *ln, uint64_t len);
/* Are the config's groups valid (n_groups 0 included)? BKV_OK, or
 * BKV_EINVAL with the message naming the field (bkv_last_error). */
int bkv__lanes_config_check(const bkv_pool_config *c);
/* Copy the groups, set up the lanes' slots. BKV_OK or BKV_ENOMEM. */
int bkv__lanes_init(bkv_pool *pool);
void bkv__lanes_free(bkv_pool *pool);
/* What bkv__lanes_free frees: *slot the bytes per sequence slot (the lanes'
 * records and stamps), *entries the lane tables' entries (4 B each). */
void bkv__lanes_bytes(const bkv_pool *pool, uint64_t *slot, uint64_t *entries);
/* The device blocks slot's lanes hold the last reference of among its
 * first n_blocks entries (a close releases them). */
uint32_t bkv__lanes_last_refs(const bkv_pool *pool, uint32_t slot, uint32_t n_blocks);
/* Room for n entries in every lane table of slot. */
int bkv__lanes_reserve(bkv_pool *pool, uint32_t slot, uint32_t n);
void bkv__lanes_open(bkv_pool *pool, uint32_t slot);
void bkv__lanes_fork(bkv_pool *pool, uint32_t p, uint32_t c, uint32_t n_blocks);
void bkv__lanes_release(bkv_pool *pool, uint32_t slot, uint32_t n_blocks, int swapped, int drop);
void bkv__lanes_trim(bkv_pool *pool, const bkv__seq *s);
void bkv__lanes_trim_to(bkv_pool *pool, const bkv__seq *s, uint32_t len);
/* An append's trim: outside a transaction the sequence is trimmed now;
 * inside one it is noted, and trimmed at commit (the step's kernels read
 * what its first token needs, whatever later appends of the step add). */
void bkv__lanes_touch(bkv_pool *pool, const bkv__seq *s);
/* Was s appended inside the open transaction? */
int bkv__lanes_touched(const bkv_pool *pool, const bkv__seq *s);
/* The transaction ended: trim what it appended (commit) or forget it. */
void bkv__lanes_txn_end(bkv_pool *pool, int commit);
/* The blocks bkv__lanes_touch(s) would make available now (its trim's
 * last references), so that an append can refuse before it changes
 * anything. */
uint32_t bkv__lanes_touch_frees(const bkv_pool *pool, const bkv__seq *s);
/* An append's lane work: the blocks it needs once bkv__lanes_touch has run
 * (copy-on-write ones counted into *cows too; a state unit it cannot have
 * counts as no room), commit (the tokens after the hits written, the hits
 * pinned before by bkv__lanes_pin_hits; s->len not moved yet). An append
 * reserves the lanes' tables, decides, and only then touches. */
void bkv__lanes_state_ask(const bkv_pool *pool, const bkv__seq *s, uint32_t writes,
			  uint32_t *need_u, uint32_t *frees);
uint64_t bkv__lanes_need(const bkv_pool *pool, const bkv__seq *s, uint32_t nb_hit,
			 uint32_t new_blocks, uint32_t *cows, uint32_t writes);
void bkv__lanes_commit(bkv_pool *pool, const bkv__seq *s, uint32_t len0, uint32_t hits,
		       uint32_t seen, const int32_t *tokens, uint32_t n);
uint32_t bkv__lanes_cows(const bkv_pool *pool, const bkv__seq *s);
uint32_t bkv__lanes_fit_hits(const bkv_pool *pool, const bkv__seq *s, uint32_t nb0,
			     uint32_t hits, const int32_t *tokens, uint32_t *relinked, uint32_t *units);
void bkv__lanes_pin_hits(bkv_pool *pool, const bkv__seq *s, uint32_t nb0, uint32_t e, int host);
/* For the host cache's reloads (pool/hclanes.c): lane l's cached device
 * block i of a hit (lane 0's blocks through i - 1 in s->table, the
 * tokens block i's), or -1; lane l's block s's lane table holds at pos
 * became full, offered to the cache. */
int32_t bkv__lane_lookup(const bkv_pool *pool, uint32_t l, const bkv__seq *s, uint32_t i,
			 const int32_t *tokens);
void bkv__lane_block_filled(bkv_pool *pool, uint32_t l, uint32_t slot, uint32_t pos);
/* A prefix lookup for s found lane 0's cached chain up to block e (before
 * the lanes shortened the hit): a keep point of s's lanes (an append's
 * commit records its own: seen, lane 0's hits before the lanes shortened
 * them). */
void bkv__lanes_seen(bkv_pool *pool, const bkv__seq *s, uint32_t e);
int bkv__lanes_append1(bkv_pool *pool, bkv__seq *s, int32_t token);
int bkv__lanes_can_truncate(const bkv_pool *pool, const bkv__seq *s, uint32_t new_len);
void bkv__lanes_truncate(bkv_pool *pool, const bkv__seq *s, uint32_t nbk, uint32_t new_len);
int bkv__lanes_dedupe(bkv_pool *pool, uint64_t owner, int32_t b, int32_t d);
void bkv__lanes_reparent(bkv_pool *pool, uint32_t slot, uint32_t pos, int32_t b, int32_t d);
int bkv__lanes_swap_check(const bkv_pool *pool, const bkv__seq *s, int trims, uint32_t *host_need);
void bkv__lanes_swap_out(bkv_pool *pool, const bkv__seq *s);
uint64_t bkv__lanes_swap_in_need(const bkv_pool *pool, const bkv__seq *s);
void bkv__lanes_swap_in(bkv_pool *pool, const bkv__seq *s);
int bkv__lanes_check(const bkv_pool *pool, uint32_t *sc, uint64_t *host_refs, int host);

/* ---- pool/state.c: a recurrent-state group ------------------------------------ */

#define BKV__ST_NO_UNDO (-2)
#define BKV__ST_INDEXED 0x1u /* st_flags: a checkpoint (st_map, st_hash) */
#define BKV__ST_SCRATCH 0x2u /* st_flags: a sequence's scratch unit */
#define BKV__ST_SPEC 0x4u /* st_flags: a speculated row's per-token state
			     (st_spec; pool/state_spec.c) */
#define BKV__ST_SWAPIN 0x8u /* st_flags: the destination of a pending swap-in
			       copy (pool/swap.c) */
uint64_t bkv__state_arena(const bkv_pool_config *c);
int bkv__state_init(bkv_pool *pool);
void bkv__state_free(bkv_pool *pool);
/* What bkv__state_free frees: *slot the bytes per sequence slot, *units the
 * state units' records and their map. */
void bkv__state_bytes(const bkv_pool *pool, uint64_t *slot, uint64_t *units);
void bkv__state_open(bkv_pool *pool, uint32_t slot);
void bkv__state_release(bkv_pool *pool, uint32_t slot, int swapped);
/* A sequence's first append of a step (or one outside a step): what an
 * earlier append left pending is computed, commit it. */
void bkv__state_begin(bkv_pool *pool, const bkv__seq *s);
void bkv__state_settle(bkv_pool *pool, const bkv__seq *s);
int bkv__state_can_fork(const bkv_pool *pool, const bkv__seq *s);
void bkv__state_fork(bkv_pool *pool, uint32_t p, uint32_t c);
uint32_t bkv__state_need(const bkv_pool *pool, const bkv__seq *s);
/* Room for s's scratch unit beside `taken` others, after the settle that
 * bkv__state_begin would do first (settles nonzero) or as things are. */
int bkv__state_room(const bkv_pool *pool, const bkv__seq *s, uint32_t taken, int settles);
void bkv__state_write(bkv_pool *pool, const bkv__seq *s);
uint32_t bkv__state_fit(const bkv_pool *pool, const bkv__seq *s, uint32_t nb0, uint32_t e,
			uint32_t *units_relinked);
void bkv__state_take_hit(bkv_pool *pool, const bkv__seq *s, uint32_t e);
/* The checkpoint of the position whose group-0 block has chain hash hash,
 * or -1 (a checkpoint outlives its block's eviction: a host-cache hit may
 * end at one). _take_at: s's hit ends at block e there (its group-0 block
 * e - 1, of that hash, may still be on the host). */
int32_t bkv__state_find(const bkv_pool *pool, uint64_t hash);
void bkv__state_take_at(bkv_pool *pool, const bkv__seq *s, uint32_t e, uint64_t hash);
void bkv__state_commit(bkv_pool *pool, const bkv__seq *s);
/* A call of the open step computed s's tokens up to end: its scratch state
 * is the live one from now on (the next call of the step reads it); the
 * step's first state is kept for a rollback. */
void bkv__state_advance(bkv_pool *pool, const bkv__seq *s, uint32_t end);
/* Overlapped scheduling (pool/overlap.c; pool/state.c says what). */
int bkv__state_hit_ok(const bkv_pool *pool, const bkv__seq *s);
void bkv__state_commit_to(bkv_pool *pool, const bkv__seq *s, uint32_t len);
int bkv__state_can_truncate(const bkv_pool *pool, const bkv__seq *s, uint32_t new_len);
void bkv__state_truncate(bkv_pool *pool, const bkv__seq *s, uint32_t new_len);
/* (pool/swap.c) */
int bkv__state_swap_check(const bkv_pool *pool, const bkv__seq *s, uint32_t *host_need);
void bkv__state_swap_out(bkv_pool *pool, const bkv__seq *s);
int bkv__state_swap_in_room(const bkv_pool *pool, const bkv__seq *s);
/* With st_share: the state units an append or swap-in takes (need_u; frees
 * of them come back from its settle) and the attention blocks beside them
 * fit together, attention's own room less its blocks being slack (it may
 * be negative: frames of checkpoints given back), relinked the cached
 * blocks its hits pin and taken the cached checkpoints they pin. */
int bkv__state_share_fits(const bkv_pool *pool, int64_t slack, uint32_t relinked, uint32_t taken,
			  uint32_t need_u, uint32_t frees);
/* With st_share, before the blocks are taken (the hits pinned): make
 * need_u units free for the state group and need_att blocks available for
 * attention, as bkv__state_share_fits found they can be. */
void bkv__state_share_prepare(bkv_pool *pool, uint32_t need_att, uint32_t need_u);
/* What bkv__state_room counts for s: the units its append needs and the
 * frees of the settle bkv__state_begin would do first (settles nonzero). */
void bkv__state_ask(const bkv_pool *pool, const bkv__seq *s, int settles, uint32_t *need_u,
		    uint32_t *frees);
/* Frames attention may have back from unreferenced checkpoints above the
 * floor (0 without st_share). */
uint32_t bkv__state_spare(const bkv_pool *pool);
/* Units a STATE group of config c keeps at all times (fixed: the arena). */
uint64_t bkv__state_floor_frames(const bkv_pool_config *c);
void bkv__state_swap_in(bkv_pool *pool, const bkv__seq *s);
void bkv__state_reset_cache(bkv_pool *pool);
/* (pool/swap.c) */
void bkv__state_swap_in_cleared(bkv_pool *pool, int32_t f);
void bkv__state_frames(const bkv_pool *pool, uint32_t slot, int32_t *in, int32_t *out);
/* Speculation over a STATE group (pool/state_spec.c): the units a row's
 * per-token states may take now (with state_share first lending idle
 * chunks until k are free, keeping keep frames free); take k of them for
 * seq's last k tokens (its drafts); the first frames of the n - 1 units
 * after seq's tokens len - n + 1 .. len - 1, then the scratch's, into
 * f[0, n). */
uint32_t bkv__pool_state_spec_room(bkv_pool *pool, uint32_t k, uint64_t keep);
void bkv__pool_state_spec_take(bkv_pool *pool, uint32_t seq, uint32_t k);
void bkv__pool_state_spec_frames(const bkv_pool *pool, uint32_t seq, int32_t *f, uint32_t n);
/* pool/state.c's units, for pool/state_spec.c. */
int32_t bkv__state_unit_take(bkv_pool *pool);
/* A live reference to unit u comes (an indexed unit leaves the LRU) or
 * goes (at zero to the LRU or the free list). */
void bkv__state_unit_get(bkv_pool *pool, int32_t u);
void bkv__state_unit_put(bkv_pool *pool, int32_t u);
/* pool/state_mid.c: the states outstanding steps ended at (lists only). */
int bkv__state_mid_init(bkv_pool *pool);
void bkv__state_mid_free(bkv_pool *pool);
uint64_t bkv__state_mid_slot_bytes(void);
/* Keep unit u (its reference moves here), covering len tokens. */
void bkv__state_mid_push(bkv_pool *pool, uint32_t slot, int32_t u, uint32_t len);
/* Take the oldest kept state if it covers at most upto tokens (1), or 0. */
int bkv__state_mid_first(bkv_pool *pool, uint32_t slot, uint32_t upto, int32_t *u, uint32_t *len);
/* Take the newest kept state if it covers more than above tokens (1), or 0. */
int bkv__state_mid_last(bkv_pool *pool, uint32_t slot, uint32_t above, int32_t *u, uint32_t *len);
int bkv__state_mid_has(const bkv_pool *pool, uint32_t slot, uint32_t len);
/* The checker: count slot's kept states into sc; 1 when they are ordered
 * between st_undo and live. */
void bkv__state_mid_count(const bkv_pool *pool, uint32_t slot, uint32_t *sc);
int bkv__state_mid_ordered(const bkv_pool *pool, uint32_t slot);
void bkv__state_unit_gain(bkv_pool *pool, int32_t c);
int bkv__state_check(const bkv_pool *pool, uint32_t *sc);
void bkv__state_check_host(const bkv_pool *pool, uint32_t *sc, uint64_t *host_refs);

/* The host tier's free list (LIFO). */
static inline void bkv__host_push(bkv_pool *pool, int32_t h)
{
	pool->host_next[h] = pool->host_free_head;
	pool->host_free_head = h;
	pool->host_state[h] = BKV__HOST_FREE;
	pool->host_free++;
}

/* ---- pool/hcache.c: the host cache ---------------------------------------- */

/* Allocate the host cache when cfg.host_cache asks for one (a host tier,
 * the prefix cache); sets hc_on. BKV_OK or BKV_ENOMEM. */
int bkv__hc_init(bkv_pool *pool);
void bkv__hc_free(bkv_pool *pool);
/* bkv__kv.demote: copy evicted block b to the host cache when worth it. */
void bkv__hc_demote(void *arg, int32_t b);
/* Drop the host cache's oldest unread block to the host free list (one is
 * on the LRU). */
void bkv__hc_evict(bkv_pool *pool);
/* The host performed swap-out copy src -> h: a demotion's h is cached. */
void bkv__hc_swap_out_cleared(bkv_pool *pool, int32_t src, int32_t h);
/* The host performed a swap-in copy from cached block h. */
void bkv__hc_swap_in_cleared(bkv_pool *pool, int32_t h);
/* A host call failed: pending demotions are forgotten (their host blocks
 * freed); call before the swap-out list is cleared. */
void bkv__hc_forget_demotions(bkv_pool *pool);
/* The same for the demotions of one copy list (overlap's held list). */
void bkv__hc_forget_list(bkv_pool *pool, const bkv__copy_list *l);
/* The cached host block indexed under hash, or -1 (and -1 without a host
 * cache; a demoting block is not indexed yet). */
int32_t bkv__hc_find(const bkv_pool *pool, uint64_t hash);
/* The host cache's hit path (lookups, holds, reloads): pool/hc.h. */
/* Every unread cached host block dropped (bkv_pool_reset_cache). */
void bkv__hc_reset(bkv_pool *pool);
/* The host cache's invariants: CHECK_OK or CHECK_HOST. sc: nh entries. */
int bkv__hc_check(const bkv_pool *pool, uint32_t *sc);

static inline int32_t bkv__host_pop(bkv_pool *pool)
{
	int32_t h;

	if (pool->host_free_head < 0)
		bkv__hc_evict(pool);
	h = pool->host_free_head;

	BKV_ASSERT(h >= 0);
	pool->host_free_head = pool->host_next[h];
	pool->host_state[h] = BKV__HOST_USED;
	pool->host_free--;
	return h;
}

/* ---- pool/seq.c: the scheduler's appends: pool/append.h ----------------- */

/* ---- read-only views for the layers above ---------------------------------
 * The scheduler reads the pool through these and the public calls; it
 * writes pool state only through the pool's functions. */

/* Is the prefix cache on? */
static inline uint64_t bkv__pool_hash_seed(const bkv_pool *pool)
{
	return pool->kv.hash_seed;
}

static inline int bkv__pool_prefix_on(const bkv_pool *pool)
{
	return pool->kv.index != NULL;
}

/* Block b's BKV__BLOCK_* flags (b a device block id). */
static inline unsigned bkv__pool_block_flags(const bkv_pool *pool, int32_t b)
{
	return pool->kv.blk[b].flags;
}

/* Block b's table references. */
static inline uint32_t bkv__pool_block_ref(const bkv_pool *pool, int32_t b)
{
	return pool->kv.blk[b].ref;
}

/* Open sequences, and the most there may be. */
static inline uint32_t bkv__pool_nr_seqs(const bkv_pool *pool)
{
	return pool->nr_seqs;
}

/* The free slots the pool's scheduler keeps for the forks its running
 * requests will still make; bkv_pool_pin_prefix leaves them free. */
static inline void bkv__pool_reserve_seqs(bkv_pool *pool, uint32_t n)
{
	pool->seq_reserved = n;
}

static inline uint32_t bkv__pool_seqs_reserved(const bkv_pool *pool)
{
	return pool->seq_reserved;
}

/* A sequence a cache reset left out of the prefix cache for good
 * (bkv__seq.uncached): its full blocks are not indexed, and need not be. */
static inline int bkv__pool_seq_uncached(const bkv_pool *pool, uint32_t seq)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);

	return s && s->uncached;
}

/* Prefix pins held (pool/pin.c): each is an open sequence of the pool. */
static inline uint32_t bkv__pool_nr_pins(const bkv_pool *pool)
{
	return pool->nr_pins;
}

/* The block ids attention may use: the device blocks less a fixed state
 * arena (with a shared STATE group, every frame: the stats' count is what
 * attention holds now). */
static inline uint32_t bkv__pool_blocks(const bkv_pool *pool)
{
	return pool->kv.nb;
}

/* The most frames attention may ever hold at once: bkv__pool_blocks, less
 * a shared STATE group's floor (its units are never attention's). */
static inline uint32_t bkv__pool_attn_blocks(const bkv_pool *pool)
{
	return pool->kv.nb - (pool->st_share ? pool->st_floor * pool->st_frames : 0);
}

static inline uint32_t bkv__pool_max_seqs(const bkv_pool *pool)
{
	return pool->cfg.max_seqs;
}

/* KV groups after the first, and group g's description. */
static inline uint32_t bkv__pool_n_lanes(const bkv_pool *pool)
{
	return pool->n_lanes;
}

/* A STATE group's units (0 without one). A branch may hold four at once
 * inside a step: the step's first state, a call's output, the next call's
 * scratch and a superseded checkpoint-aligned state (pool/state.c). */
static inline uint32_t bkv__pool_state_units(const bkv_pool *pool)
{
	return pool->st_units;
}

/* Groups of the pool (1 without groups); a STATE group is the last. */
static inline uint32_t bkv__pool_n_groups(const bkv_pool *pool)
{
	return pool->cfg.n_groups ? pool->cfg.n_groups : 1;
}

/* The checkpoint interval of a STATE group (0: none, or no such group). */
static inline uint32_t bkv__pool_state_interval(const bkv_pool *pool)
{
	return pool->st_units ? pool->st_interval : 0;
}

/* Host blocks a swap-out of seq takes: its table, every group's held
 * blocks and a STATE group's state (0 for an unknown sequence). */
static inline uint32_t bkv__pool_swap_blocks(const bkv_pool *pool, uint32_t seq)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);
	uint32_t need;

	if (!s)
		return 0;
	need = s->n_blocks;
	if (pool->grouped && s->state == BKV__SEQ_OPEN) {
		(void)bkv__lanes_swap_check(pool, s, !bkv__lanes_touched(pool, s), &need);
		if (pool->st_units && pool->st_len[s - pool->seqs])
			need += pool->st_frames;
	}
	return need;
}

/* A successful call computed seq's tokens up to end (a STATE group). */
static inline void bkv__pool_state_advance(bkv_pool *pool, uint32_t seq, uint32_t end)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);

	if (s && pool->st_units && s->state == BKV__SEQ_OPEN)
		bkv__state_advance(pool, s, end);
}

/* The first frames of seq's state units: the one a call reads (-1: zero
 * state) and the one it writes. */
static inline void bkv__pool_state_frames(const bkv_pool *pool, uint32_t seq, int32_t *in,
					  int32_t *out)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);

	*in = *out = -1;
	if (s && pool->st_units)
		bkv__state_frames(pool, (uint32_t)(s - pool->seqs), in, out);
}

static inline const bkv_kv_group *bkv__pool_group(const bkv_pool *pool, uint32_t g)
{
	return &pool->groups[g];
}

/* Group g's (>= 1) table of open sequence seq, which the scheduler knows
 * is live (a running lane's), and its entries (bkv_seq_group_blocks
 * without the argument checks; the batch's per-group pass). */
static inline const int32_t *bkv__pool_group_table(const bkv_pool *pool, uint32_t seq, uint32_t g,
						   uint32_t *n_blocks)
{
	const uint32_t slot = seq & BKV__SEQ_SLOT_MASK;

	BKV_ASSERT(bkv__seq_get(pool, seq) && g >= 1 && g <= pool->n_lanes);
	*n_blocks = pool->seqs[slot].n_blocks;
	return *n_blocks ? pool->lanes[g - 1].seqs[slot].table : pool->seqs[slot].table;
}

/* The first logical block a sequence of len tokens reads in group g >= 1
 * at its next token. */
static inline uint32_t bkv__pool_group_first(const bkv_pool *pool, uint32_t g, uint64_t len)
{
	return bkv__lane_first(pool, &pool->lanes[g - 1], len);
}

/* seq's clean mark (0 for an unknown id). */
static inline uint32_t bkv__seq_clean(const bkv_pool *pool, uint32_t seq)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);

	return s ? s->clean : 0;
}

/* The scheduler sent seq's whole table (its persistent-layout delta): mark
 * it clean. */
static inline void bkv__seq_sent(bkv_pool *pool, uint32_t seq)
{
	bkv__seq *s = bkv__seq_get(pool, seq);

	if (s)
		s->clean = s->n_blocks;
}

/* What the scheduler sent of seq since entry from is void (its step was
 * rolled back): lower clean to it. */
static inline void bkv__seq_unsent(bkv_pool *pool, uint32_t seq, uint32_t from)
{
	bkv__seq *s = bkv__seq_get(pool, seq);

	if (s)
		bkv__seq_dirty(s, from);
}

/* ---- pool/pool.c: the check's workspace ------------------------------------ */

/* Entries of pool->scratch: a block of the larger tier, or a frame of the
 * state arena, each. */
static inline size_t bkv__pool_scratch_len(const bkv_pool *pool)
{
	return BKV_MAX(BKV_MAX((size_t)pool->kv.nb, (size_t)pool->nh),
		       (size_t)bkv__state_arena(&pool->cfg));
}

/* ---- pool/pool.c: step transactions (for the scheduler) -------------------
 * Between begin and commit, blocks that become full are not entered into
 * the prefix-cache index, so no lookup can hit KV that the current step has
 * not computed yet; commit indexes them (parents first), abort forgets them
 * (they stay private and are freed by the usual release rules). The
 * scheduler brackets every bkv_step with them. */
void bkv__pool_txn_begin(bkv_pool *pool);
void bkv__pool_txn_commit(bkv_pool *pool);
void bkv__pool_txn_abort(bkv_pool *pool);

/* ---- pool/pool.c: the eviction policy (for the decision layer) -------------
 * Eviction by value on, with p0 + p1 x depth as a block's recompute price
 * (kv/value.c), or one such call undone. BKV_OK or BKV_ENOMEM. The pool
 * evicts by LRU while no call is in force. */
int bkv__pool_value_on(bkv_pool *pool, double p0, double p1);
void bkv__pool_value_off(bkv_pool *pool);
/* The segmented LRU on (kv/value.c, bkv__kv_seg_on), or one such call
 * undone. BKV_OK or BKV_ENOMEM. */
int bkv__pool_seg_on(bkv_pool *pool);
void bkv__pool_seg_off(bkv_pool *pool);

/* ---- pool/retain.c: retention from the request (for the layers above) -----
 * Retention priorities on (mode BKV__RET_BANDS: with LRU, turns the value
 * records on too; BKV__RET_VALUE: over eviction by value, already on) or
 * off (the same mode). BKV_OK or BKV_ENOMEM. A no-op without prefix cache.
 * _now gives the KV layer the scheduler's clock (expiries are read against
 * it). _seq_retain gives seq's full indexed blocks the highest priority of
 * the n ranges overlapping each, before the scheduler releases it. */
int bkv__pool_retain_on(bkv_pool *pool, uint32_t mode);
void bkv__pool_retain_off(bkv_pool *pool, uint32_t mode);
void bkv__pool_retain_now(bkv_pool *pool, uint64_t now_us);
void bkv__pool_seq_retain(bkv_pool *pool, uint32_t seq, const bkv_retention_range *r, uint32_t n,
			  uint64_t now_us);

/* ---- pool/hcache.c: the host cache (for the decision layer) ---------------
 * Host blocks a swap-out may take now: free ones and the host cache's
 * unread ones (dropped for it). */
static inline uint32_t bkv__pool_host_room(const bkv_pool *pool)
{
	return pool->host_free + pool->hc_lru;
}

/* Does the pool keep evicted blocks in a host cache? */
static inline int bkv__pool_host_cache(const bkv_pool *pool)
{
	return pool->hc_on;
}

/* The scheduler's prices for the host cache's rule (pool/hcache.c): a
 * block's recompute price p0 + p1 x depth, and what a reload and a
 * demotion cost the steps that carry them, us; on 0 forgets them (every
 * evicted block is demoted). */
static inline void bkv__pool_host_cache_prices(bkv_pool *pool, int on, double p0, double p1,
					       double load, double store)
{
	pool->hc_priced = on;
	pool->hc_p0 = p0;
	pool->hc_p1 = p1;
	pool->hc_load = load;
	pool->hc_store = store;
}

/* ---- pool/check.c ---------------------------------------------------------- */
/* bkv_pool_check is public; nothing more. */

#include "pool/append.h"

#endif /* BKV_POOL_H */
