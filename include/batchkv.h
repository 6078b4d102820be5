/*
 * batchkv.h - the public interface of libbatchkv.
 *
 * libbatchkv decides, for an LLM inference runtime (the "host"), which tokens run
 * in each iteration and where every sequence's KV cache lives. The host keeps its
 * kernels and its KV tensors; the library hands it plain-data batches of block
 * indices and token ids, once per call to bkv_step().
 *
 * OBJECT MODEL
 *
 *   bkv_pool      the block-paged KV allocator (the "virtual memory"). It owns
 *                 block *indices* only: device_blocks frames of block_tokens token
 *                 slots each, an optional host tier for swap, per-sequence block
 *                 tables (page tables), copy-on-write sharing and a prefix cache
 *                 (page cache) of full blocks. Usable on its own.
 *   sequence      one address space in a pool, named by a uint32_t id. Its block
 *                 table maps logical block i to a physical block id (int32_t),
 *                 exactly the array a paged-attention kernel reads.
 *   bkv_sched     the scheduler. It owns requests, runs one transaction per
 *                 bkv_step(): admit, plan, make room, build the batch, call the
 *                 host, commit. It uses a pool it does not own.
 *   request       a prompt plus generation limits, named by a uint64_t id that
 *                 bkv_submit() returns. Each request ends exactly once, through
 *                 the host's on_finish callback.
 *   cost model    a pair of callbacks that predict and learn what a step costs;
 *                 every scheduling decision consults it.
 *
 * OWNERSHIP. Handles are created by *_create() and released by *_destroy(),
 * which accept NULL. Input arrays (prompts, configs) are copied; the library
 * never keeps a caller's pointer except the opaque user pointers it hands back.
 * Arrays the library returns (block tables, batches, copy lists) stay owned by
 * the library and are valid until the next call that changes the handle.
 *
 * THREADS. A pool and a scheduler belong to one thread at a time (the "stepping
 * thread"). The only exceptions are bkv_submit() and bkv_abort(), which may be
 * called from any thread while another thread runs bkv_step(). Distinct handles
 * are independent. An allocator given to a scheduler must be thread-safe if
 * bkv_submit() is called from several threads (the libc default is).
 *
 * ERRORS. Every fallible call returns a bkv_status: BKV_OK (0) or a negative
 * code; bkv_strerror() names it, and after a refused config or request
 * bkv_last_error() names the field and the rule it broke. When a call fails,
 * nothing it was given is kept, no state it was about to change has changed,
 * and no callback it registered runs. Misuse (BKV_EINVAL, BKV_ENOENT, BKV_ESTATE) is kept apart from running
 * out of blocks (BKV_ENOSPC), which is a normal event that triggers reclaim or
 * preemption.
 *
 * Comments here say what each thing is and what a caller must know. Why the
 * defaults are what they are, derivations and measurements: docs/api-notes.md
 * (which points on to docs/design.md and docs/cost-model.md).
 *
 * This header compiles as C11 and as C++.
 */
#ifndef BATCHKV_H
#define BATCHKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(BKV_BUILDING_DLL)
#define BKV_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define BKV_API __attribute__((visibility("default")))
#else
#define BKV_API
#endif

/* ------------------------------------------------------------------------ */
/* Version and status                                                        */
/* ------------------------------------------------------------------------ */

#define BKV_VERSION_MAJOR 0
#define BKV_VERSION_MINOR 1
#define BKV_VERSION_PATCH 0
#define BKV_VERSION_STRING "0.1.0"

/*
 * Every status code, listed once: X(NAME, value, message). The enum and
 * bkv_strerror() are both generated from this list so they cannot drift.
 */
#define BKV_STATUS_MAP(X)                                                      \
	X(OK, 0, "success")                                                    \
	X(EINVAL, -1, "invalid argument")                                      \
	X(ENOMEM, -2, "out of memory")                                         \
	X(ENOSPC, -3, "no free KV blocks")                                     \
	X(E2BIG, -4, "request can never fit in the pool")                      \
	X(EAGAIN, -5, "resource limit reached, try again later")               \
	X(ENOENT, -6, "no such sequence or request")                           \
	X(EHOST, -7, "a host callback failed")                                 \
	X(ESTATE, -8, "call not allowed in the current state")

typedef enum bkv_status {
#define BKV__STATUS_ENUM(name, value, msg) BKV_##name = value,
	BKV_STATUS_MAP(BKV__STATUS_ENUM)
#undef BKV__STATUS_ENUM
} bkv_status;

/**
 * Name a status code.
 * @param status  a bkv_status value (or any int).
 * @return a static, NUL-terminated English message; "unknown error" for a value
 *         that is not a bkv_status. Never NULL.
 * Thread rules: any thread.
 */
BKV_API const char *bkv_strerror(int status);

/**
 * Say which argument the calling thread's last refused call refused, and why.
 * These calls check their arguments and clear the message when they start:
 * bkv_pool_create, bkv_sched_create, bkv_submit, bkv_cost_calib_create,
 * bkv_cost_roofline_init, bkv_vllm_encoder_create and bkv_sched_kv_release.
 * When one of them refuses an argument (BKV_EINVAL, bkv_submit's BKV_E2BIG,
 * bkv_sched_kv_release's BKV_ESTATE) it leaves a
 * message naming the struct, the field and the rule, for example
 * "bkv_pool_config.block_tokens = 24: must be a power of two in 1..65536"
 * or "bkv_sched_config.overlap = 1 needs bkv_host_ops.launch". After any
 * other outcome of those calls (success included) the message is empty;
 * every other call leaves it as it was. Read it right after the call that
 * failed, on the same thread.
 * @return the calling thread's message, NUL-terminated, at most 255 bytes;
 *         "" when there is none. Never NULL. Valid until the thread's next
 *         call of one of the calls above.
 * Thread rules: any thread; each thread has its own message.
 */
BKV_API const char *bkv_last_error(void);

/**
 * The library's version.
 * @return the static string BKV_VERSION_STRING the library was built with.
 * Thread rules: any thread.
 */
BKV_API const char *bkv_version(void);

/* ------------------------------------------------------------------------ */
/* Memory hook                                                               */
/* ------------------------------------------------------------------------ */

/*
 * A per-handle allocator (Lua's lua_Alloc idea: the library passes the old
 * size back, so the allocator needs no size header). Pass NULL wherever an
 * allocator is taken to use libc malloc/realloc/free.
 *   alloc(ud, size)                  returns NULL on failure.
 *   realloc(ud, p, old_size, size)   returns NULL on failure, p left intact.
 *   free(ud, p, size)                p may be NULL.
 * The library never calls the hook with size 0.
 */
typedef struct bkv_allocator {
	void *(*alloc)(void *ud, size_t size);
	void *(*realloc)(void *ud, void *p, size_t old_size, size_t size);
	void (*free)(void *ud, void *p, size_t size);
	void *ud; /* handed back to every call; never read by the library */
} bkv_allocator;

/* ------------------------------------------------------------------------ */
/* KV sizing                                                                 */
/* ------------------------------------------------------------------------ */

/* The shape of a model's KV cache. kv_heads == query heads is MHA, 1 is MQA,
 * anything between is GQA. */
typedef struct bkv_model_shape {
	uint32_t layers;      /* transformer layers */
	uint32_t kv_heads;    /* key/value heads per layer */
	uint32_t head_dim;    /* dimensions per head */
	uint32_t dtype_bytes; /* bytes per stored value (2 for fp16/bf16) */
} bkv_model_shape;

/**
 * Bytes of KV one token occupies: 2 (K and V) x layers x kv_heads x head_dim x
 * dtype_bytes.
 * @param shape  the model; NULL or any zero field gives 0.
 * @return bytes per token, or 0 on bad input (and on overflow of uint64_t).
 * Thread rules: any thread.
 */
BKV_API uint64_t bkv_kv_bytes_per_token(const bkv_model_shape *shape);

/**
 * How many whole blocks of block_tokens tokens fit in a byte budget.
 * @param budget        bytes available for KV.
 * @param shape         the model.
 * @param block_tokens  tokens per block (> 0).
 * @return the block count, clamped to INT32_MAX (block ids are int32_t); 0 on
 *         bad input.
 * Thread rules: any thread.
 */
BKV_API uint32_t bkv_blocks_for_bytes(uint64_t budget, const bkv_model_shape *shape,
				      uint32_t block_tokens);

/* ---- KV groups (hybrid models) ---------------------------------------------
 * A hybrid model's layers fall into groups of one kind each. A pool is
 * configured with its groups (bkv_pool_config.groups); every attention group
 * uses the pool's block_tokens, so a prefix hit aligns at a block for every
 * group. One device block (a frame) holds block_tokens tokens of every layer
 * of one attention group: its size is the largest group page, block_tokens x
 * layers x bytes, and a group with a smaller page leaves the rest of the frame
 * unused (docs/design.md, "KV groups", gives the arithmetic). A recurrent
 * state group keeps one state unit per sequence branch (plus cached
 * checkpoints); a unit is bkv_kv_state_frames() consecutive frames of a state
 * arena carved from the same device memory at create. */
typedef enum bkv_group_kind {
	BKV_GROUP_FULL = 0,    /* full attention: every token's KV is read */
	BKV_GROUP_WINDOW = 1,  /* sliding window: position p reads positions
				  p - span + 1 .. p */
	BKV_GROUP_CHUNKED = 2, /* chunked local attention: position p reads its
				  own chunk, positions floor(p / span) x span
				  .. p */
	BKV_GROUP_STATE = 3    /* recurrent state (Mamba, linear attention): a
				  fixed number of bytes per sequence */
} bkv_group_kind;

/* Most groups a pool may have. */
#define BKV_MAX_GROUPS 8

/* One group of layers. */
typedef struct bkv_kv_group {
	uint32_t kind;     /* a bkv_group_kind */
	uint32_t layers;   /* layers in the group, >= 1 */
	uint32_t span;     /* WINDOW: the window W in tokens; CHUNKED: the chunk
			      C in tokens (both 1..INT32_MAX); STATE: tokens
			      between state checkpoints, a multiple of
			      block_tokens (0: no checkpoints, so no prefix
			      hits for a pool with this group); FULL: 0 */
	uint32_t reserved; /* zero */
	uint64_t bytes;    /* FULL, WINDOW, CHUNKED: KV bytes per token per
			      layer (2 x kv_heads x head_dim x dtype_bytes);
			      STATE: state bytes per sequence per layer */
} bkv_kv_group;

/*
 * The sizing functions below share these rules. A group is valid when its
 * layers and bytes are >= 1, reserved is 0, kind is a bkv_group_kind, and
 * span is as its field says (FULL 0; WINDOW, CHUNKED 1..INT32_MAX; STATE a
 * multiple of block_tokens): the rules bkv_pool_create checks its groups
 * by. A group list is valid when it has 1..BKV_MAX_GROUPS valid
 * groups, at most one of them STATE. block_tokens must be a power of two
 * (bkv_kv_seq_bytes also takes 0, for a token-exact figure). Anything else is
 * bad input and gives 0; so does a result that overflows uint64_t. Worked
 * example (gpt-oss-20b): docs/design.md, "KV groups: sizing".
 */

/**
 * Bytes of one group's page: for an attention group, block_tokens x layers x
 * bytes (one block of it); for a STATE group, layers x bytes (one unit).
 * @param g             the group.
 * @param block_tokens  the pool's tokens per block, a power of two.
 * @return the bytes, or 0 on bad input (NULL g, an invalid group, block_tokens
 *         not a power of two, overflow).
 * Thread rules: any thread.
 */
BKV_API uint64_t bkv_kv_group_page_bytes(const bkv_kv_group *g, uint32_t block_tokens);

/**
 * Bytes of one device block (frame) of a pool with these groups: the largest
 * attention page; for a model with only a STATE group, its unit.
 * @param groups        [n] the groups.
 * @param n             1..BKV_MAX_GROUPS.
 * @param block_tokens  a power of two.
 * @return the bytes, or 0 on bad input (NULL groups, n 0 or above
 *         BKV_MAX_GROUPS, an invalid group, more than one STATE group).
 * Thread rules: any thread.
 */
BKV_API uint64_t bkv_kv_frame_bytes(const bkv_kv_group *groups, uint32_t n,
				    uint32_t block_tokens);

/**
 * Frames one state unit takes: ceil(STATE page / frame bytes) (1 for a model
 * with only a STATE group).
 * @param groups        [n] the groups.
 * @param n             1..BKV_MAX_GROUPS.
 * @param block_tokens  a power of two.
 * @return the frames; 0 when there is no STATE group, or on bad input (as
 *         bkv_kv_frame_bytes).
 * Thread rules: any thread.
 */
BKV_API uint32_t bkv_kv_state_frames(const bkv_kv_group *groups, uint32_t n,
				     uint32_t block_tokens);

/**
 * Blocks a sequence of `tokens` tokens holds in group g while the next token
 * (position `tokens`) is computed, the block that token goes into included:
 * the blocks covering the positions that token reads. FULL
 * floor(tokens / block_tokens) + 1; WINDOW the blocks covering
 * max(0, tokens + 1 - span) .. tokens; CHUNKED those covering
 * floor(tokens / span) x span .. tokens; STATE 0 (its memory is a state
 * unit, bkv_kv_state_frames). The pool holds exactly this many (tests and
 * docs/benchmarks.md check it).
 * @param g             the group.
 * @param block_tokens  a power of two.
 * @param tokens        tokens already in the sequence, < UINT64_MAX.
 * @return the count (>= 1 for an attention group); 0 for STATE or on bad
 *         input.
 * Thread rules: any thread.
 */
BKV_API uint64_t bkv_kv_group_blocks_held(const bkv_kv_group *g, uint32_t block_tokens,
					  uint64_t tokens);

/**
 * Bytes a sequence of `tokens` tokens holds, summed over the groups. With
 * block_tokens 0, token-exact, the KV the last token (position tokens - 1)
 * read, its own included: FULL tokens x layers x bytes, WINDOW
 * min(tokens, span) x layers x bytes, CHUNKED the tokens of the last token's
 * chunk (tokens - floor((tokens - 1) / span) x span) x layers x bytes, STATE
 * layers x bytes. With block_tokens a power of two, what a pool holds
 * instead: bkv_kv_group_blocks_held x frame bytes per attention group, plus
 * bkv_kv_state_frames x frame bytes for the state unit.
 * @param groups        [n] the groups.
 * @param n             1..BKV_MAX_GROUPS.
 * @param block_tokens  0 (token-exact) or a power of two.
 * @param tokens        tokens in the sequence, < UINT64_MAX.
 * @return the bytes (0 for 0 tokens token-exact without a STATE group); 0 on
 *         bad input (as bkv_kv_frame_bytes) or overflow.
 * Thread rules: any thread.
 */
BKV_API uint64_t bkv_kv_seq_bytes(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens,
				  uint64_t tokens);

/**
 * How many frames of a pool with these groups fit in a byte budget:
 * floor(budget / bkv_kv_frame_bytes). For one FULL group of layers x bytes
 * this is bkv_blocks_for_bytes of the same model.
 * @param budget        bytes available for KV (frames and state units both).
 * @param groups        [n] the groups.
 * @param n             1..BKV_MAX_GROUPS.
 * @param block_tokens  a power of two.
 * @return the count, clamped to INT32_MAX; 0 on bad input (as
 *         bkv_kv_frame_bytes).
 * Thread rules: any thread.
 */
BKV_API uint32_t bkv_frames_for_bytes(uint64_t budget, const bkv_kv_group *groups, uint32_t n,
				      uint32_t block_tokens);

/* ------------------------------------------------------------------------ */
/* The block pool                                                            */
/* ------------------------------------------------------------------------ */

typedef struct bkv_pool bkv_pool;

/* Most device token slots a pool may have: device_blocks x block_tokens <=
 * 2^31, because every slot_mapping entry (block * block_tokens + offset, see
 * bkv_batch) is an int32_t. bkv_pool_create refuses a larger geometry with
 * BKV_EINVAL. */
#define BKV_MAX_TOKEN_SLOTS 0x80000000u

typedef struct bkv_pool_config {
	uint32_t size;             /* sizeof(bkv_pool_config); set by init (ABI) */
	uint32_t block_tokens;     /* token slots per block; a power of two in
				      1..65536. Default 16. */
	uint32_t device_blocks;    /* blocks on the device tier, 1..2^30, and
				      device_blocks x block_tokens <=
				      BKV_MAX_TOKEN_SLOTS (2^31); every one
				      usable. No default: 0 is refused. */
	uint32_t host_blocks;      /* blocks on the host (swap) tier, 0..2^30;
				      0 = no swap. Default 0. Not bound by
				      BKV_MAX_TOKEN_SLOTS: host blocks are
				      named by id in copy lists, never by
				      slot. */
	uint32_t max_seqs;         /* most sequences open at once, 1..2^20.
				      Default 1024. */
	uint32_t watermark_blocks; /* free blocks kept for running sequences to
				      grow; governs admission only
				      (bkv_pool_can_admit). Default 0. */
	int prefix_cache;          /* nonzero: index full blocks by content and
				      reuse them. Default 1. */
	uint64_t hash_seed;        /* seeds the chained block hash. Default 0. */
	uint32_t event_capacity;   /* KV events the ring holds between drains
				      (bkv_pool_drain_events), 0..2^24; taken at
				      create. 0 = no events. Default 0. */
	uint32_t pin_permille;     /* most device blocks prefix pins may hold
				      together (bkv_pool_pin_prefix), per
				      mille of device_blocks, 0..1000.
				      Default 0: no pins. */
	uint32_t host_cache;       /* 1: the host tier also keeps prefix-cache
				      blocks the device evicts, and a later
				      prefix hit reloads them with swap-in
				      copies instead of recomputing (docs/
				      design.md, "The host cache"; with KV
				      groups a hit reloads every group's
				      blocks, and with a STATE group ends
				      at a device checkpoint). Needs
				      host_blocks > 0 and prefix_cache
				      (else BKV_EINVAL). Swapped
				      sequences take precedence: the host
				      cache gives up its blocks to them.
				      Default 0. */
	uint32_t reserved;         /* zero; room for a later field */
	uint32_t n_groups;         /* entries in groups, 0..BKV_MAX_GROUPS; 0 =
				      one full-attention group (the pool of
				      a plain transformer). Default 0. */
	uint32_t state_units;      /* with a STATE group: state units in the
				      state arena (live states of open
				      sequences plus cached checkpoints;
				      overlapped scheduling at depth D holds
				      up to D + 2 a running sequence);
				      0 = 2 x max_seqs. Ignored without one.
				      Default 0. */
	const bkv_kv_group *groups; /* [n_groups], copied at create; NULL when
				      n_groups is 0. At most one STATE group. */
	uint32_t state_share;      /* with a STATE group, nonzero: its units
				      and the attention blocks share every
				      device frame. A unit is then an aligned
				      chunk of bkv_kv_state_frames frames,
				      lent to the group when it needs one and
				      given back when it no longer does;
				      state_units is the floor it keeps
				      (0 = none), and device_blocks counts
				      every frame. 0: the fixed arena above.
				      Ignored without a STATE group. Default
				      0. */
	uint32_t state_pad;        /* zero */
} bkv_pool_config;

/* Live counters of a pool. free + used + cached = device_blocks always. */
typedef struct bkv_pool_stats {
	uint32_t size;            /* sizeof(bkv_pool_stats) the caller expects */
	uint32_t block_tokens;    /* tokens per block */
	uint32_t device_blocks;   /* total device blocks */
	uint32_t host_blocks;     /* total host blocks */
	uint32_t nr_free;         /* device blocks on the free list (no content) */
	uint32_t nr_used;         /* device blocks referenced by a sequence or
				     read by a pending device copy (a
				     copy-on-write source stays until its
				     copy is cleared) */
	uint32_t nr_cached;       /* device blocks unreferenced but kept in the
				     prefix cache (reclaimable, on the LRU) */
	uint32_t nr_indexed;      /* device blocks in the hash index (used or
				     cached) */
	uint32_t host_free;       /* host blocks free */
	uint32_t host_used;       /* host blocks not free: holding a swapped
				     sequence, read by a pending swap-in
				     copy, or held by the host cache
				     (host_blocks - host_free) */
	uint32_t nr_seqs;         /* open sequences */
	uint32_t nr_swapped;      /* open sequences currently on the host tier */
	uint64_t tokens;          /* tokens held in used device blocks (each
				     block's fill counted once) */
	uint64_t waste_slots;     /* nr_used * block_tokens - tokens: internal
				     fragmentation */
	uint64_t hit_tokens;      /* prompt tokens served from the prefix cache */
	uint64_t miss_tokens;     /* appended tokens that were not hits */
	uint64_t evictions;       /* cached blocks reclaimed */
	uint64_t cow_copies;      /* copy-on-write block copies recorded */
	uint64_t swap_out_blocks; /* blocks copied device -> host */
	uint64_t swap_in_blocks;  /* blocks copied host -> device */
	uint64_t events;          /* KV events emitted (drained, pending or
				     dropped) */
	uint64_t events_dropped;  /* of which dropped because the ring was
				     full */
	uint64_t dup_blocks;      /* full blocks computed twice in one
				     scheduler step (two requests, same
				     content): the commit keeps the cached
				     copy and frees the other */
	uint32_t state_units;     /* a STATE group's units (0 without one);
				     with state_share, those it holds now
				     (its frames are then not in
				     device_blocks, which counts the
				     frames attention holds now) */
	uint32_t state_free;      /* of which free */
	uint32_t state_checkpoints; /* of which checkpoints in the prefix
				     cache (referenced by a sequence or not) */
	uint32_t state_frames;    /* frames per unit */
	uint64_t state_hits;      /* prefix hits that read a checkpoint */
	uint64_t state_evictions; /* checkpoints evicted for other states */
	uint32_t host_cached;     /* host cache (cfg.host_cache): host blocks
				     holding an evicted block's KV, findable
				     by a prefix hit */
	uint32_t host_demoting;   /* host blocks whose swap-out copy from an
				     evicted device block is pending */
	uint64_t host_demoted;    /* evicted device blocks copied to the host
				     cache (swap-out copies recorded) */
	uint64_t host_kept;       /* evicted device blocks the host cache
				     held already (no copy) */
	uint64_t host_skipped;    /* evicted device blocks not kept: cheaper
				     to recompute, unsafe to copy yet, or no
				     host block to spare */
	uint64_t host_hit_blocks; /* prefix-hit blocks reloaded from the host
				     cache (swap-in copies recorded) */
	uint64_t host_evictions;  /* host cache blocks dropped for room */
	uint32_t n_groups;        /* KV groups with frames (bkv_pool_config's
				     groups but a STATE one; 1 without
				     groups): the entries of group_used and
				     group_cached that count */
	uint32_t group_used[8];   /* (BKV_MAX_GROUPS) used device blocks (frames)
				     by group, in bkv_pool_config.groups'
				     order; they sum to nr_used. Groups share
				     one free list and one prefix cache, so
				     no group can run out while another has
				     frames free */
	uint32_t group_cached[8]; /* (BKV_MAX_GROUPS) cached ones by group; they
				     sum to nr_cached */
} bkv_pool_stats;

/* A block copy the host must perform: block src to block dst. For swaps, the
 * side of each id is given by the list it is in (see bkv_copy_kind). */
typedef struct bkv_copy {
	int32_t src; /* source block id */
	int32_t dst; /* destination block id */
} bkv_copy;

typedef enum bkv_copy_kind {
	BKV_COPY_DEVICE = 0,   /* device -> device (copy-on-write) */
	BKV_COPY_SWAP_OUT = 1, /* device -> host */
	BKV_COPY_SWAP_IN = 2   /* host -> device */
} bkv_copy_kind;

/* What bkv_seq_info reports. */
typedef struct bkv_seq_info {
	uint32_t len;      /* tokens in the sequence */
	uint32_t n_blocks; /* entries in its block table */
	int swapped;       /* nonzero while its blocks are on the host tier */
	uint64_t key;      /* its prefix-cache key */
} bkv_seq_info;

/**
 * Fill a pool config with defaults (see each field).
 * @param cfg  the config to fill; NULL is ignored.
 * Thread rules: any thread.
 */
BKV_API void bkv_pool_config_init(bkv_pool_config *cfg);

/**
 * Create a pool. Its memory is taken here: taking and releasing blocks never
 * allocates. Later only a sequence's block table and a copy list can grow
 * (hence BKV_ENOMEM from append, fork, swap and import); a warm pool
 * allocates nothing.
 * @param cfg    validated and copied.
 * @param alloc  allocator for every pool structure; NULL = libc. Copied.
 * @param out    receives the pool; untouched on failure.
 * @return BKV_OK; BKV_EINVAL (NULL cfg/out, cfg->size too small, a field out of
 *         range, more than BKV_MAX_TOKEN_SLOTS device token slots); BKV_ENOMEM.
 * Thread rules: any thread; the pool then belongs to one thread at a time.
 */
BKV_API int bkv_pool_create(const bkv_pool_config *cfg, const bkv_allocator *alloc,
			    bkv_pool **out);

/**
 * Destroy a pool and everything in it. NULL is ignored.
 * @param pool   the pool.
 * Thread rules: the pool's thread, with no scheduler still using it.
 */
BKV_API void bkv_pool_destroy(bkv_pool *pool);

/**
 * Open an empty sequence (no blocks are taken until tokens arrive).
 * @param pool  the pool.
 * @param seq   receives the sequence id, never 0. Ids of closed sequences are
 *              not reused for a long time (a generation count is part of the
 *              id; free slots are reused oldest first).
 * @return BKV_OK; BKV_EINVAL (NULL); BKV_EAGAIN (max_seqs open).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_open(bkv_pool *pool, uint32_t *seq);

/**
 * Open an empty sequence whose blocks are cached under a caller key (a LoRA id,
 * a tenant salt): blocks only hit blocks with the same key. Key 0 is the
 * bkv_seq_open() default.
 * @param pool   the pool.
 * @param key    prefix-cache key of all its blocks; 0 = none.
 * @param seq    receives the sequence id, as bkv_seq_open().
 * @return as bkv_seq_open().
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_open_keyed(bkv_pool *pool, uint64_t key, uint32_t *seq);

/**
 * Append tokens to a sequence, taking blocks only as needed (demand paging).
 *
 * Prefix cache: while the sequence's end is block-aligned and its last block is
 * in the prefix cache (or the sequence is empty), each whole block of the input
 * is looked up by its chained hash and verified token by token; a verified hit
 * shares the cached block and its tokens need no KV computation. Lookup stops at
 * the first miss. Blocks that become full are entered into the cache.
 *
 * Copy-on-write: writing into a block that is shared (or cached) gives the
 * sequence a fresh block and records a BKV_COPY_DEVICE copy.
 *
 * All-or-nothing: on any error the sequence and the pool are unchanged.
 *
 * @param pool       the pool.
 * @param seq        the sequence id.
 * @param tokens     n token ids; copied. May be NULL only when n == 0.
 * @param n          token count; 0 is a no-op.
 * @param hit_tokens receives how many leading tokens were prefix-cache hits
 *                   (a multiple of block_tokens); may be NULL.
 * @return BKV_OK; BKV_EINVAL; BKV_ENOENT (unknown or closed seq); BKV_ESTATE
 *         (sequence swapped out); BKV_ENOSPC (not enough free or reclaimable
 *         device blocks); BKV_E2BIG (the sequence would exceed device_blocks
 *         blocks or 2^31 - 1 tokens); BKV_ENOMEM (its block table or the copy
 *         list could not grow).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_append(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n,
			   uint32_t *hit_tokens);

/**
 * Blocks an append of n tokens to seq would take from the free list or cache
 * (new blocks plus a copy-on-write block), ignoring possible prefix hits.
 * @param pool   the pool.
 * @param seq    the sequence id.
 * @param n      tokens the append would add.
 * @return the count (>= 0), or a negative bkv_status (EINVAL, ENOENT, ESTATE).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int64_t bkv_seq_blocks_needed(const bkv_pool *pool, uint32_t seq, uint32_t n);

/**
 * Shorten a sequence to new_len tokens, releasing blocks past it (used to roll
 * back a step, or for speculative decoding). Releasing follows close's rule.
 * @param pool   the pool.
 * @param seq    the sequence id.
 * @param new_len the length to keep, <= the sequence's length.
 * @return BKV_OK; BKV_EINVAL (new_len > len); BKV_ENOENT; BKV_ESTATE (swapped;
 *         or, in a pool with KV groups, new_len would need a block a window
 *         or chunk released, or a recurrent state the pool did not keep).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_truncate(bkv_pool *pool, uint32_t seq, uint32_t new_len);

/**
 * Fork: a new sequence sharing every block of parent (ref counts up). The first
 * write by either into a shared, partially filled block copies it; full shared
 * blocks are never copied.
 * @param pool   the pool.
 * @param parent the sequence to fork (device-resident).
 * @param child  receives the new id.
 * @return BKV_OK; BKV_EINVAL; BKV_ENOENT; BKV_ESTATE (parent swapped out;
 *         or, with a STATE group, inside a step transaction that appended
 *         to parent: its new state is not committed yet);
 *         BKV_EAGAIN (max_seqs open); BKV_ENOMEM.
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_fork(bkv_pool *pool, uint32_t parent, uint32_t *child);

/**
 * Close a finished sequence. Its full blocks that are in the prefix cache stay
 * there when their last user leaves (on the LRU, reclaimed lazily); the rest
 * return to the free list. Closing a swapped-out sequence frees its host blocks.
 * @param pool   the pool.
 * @param seq    the sequence id.
 * @return BKV_OK; BKV_EINVAL; BKV_ENOENT.
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_close(bkv_pool *pool, uint32_t seq);

/**
 * Drop an aborted sequence: like close, but every block whose last user it was
 * returns to the free list and leaves the prefix cache - except a block that
 * is the parent of other cached blocks, which stays cached (their chain runs
 * through it).
 * @param pool   the pool.
 * @param seq    the sequence id.
 * @return BKV_OK; BKV_EINVAL; BKV_ENOENT.
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_drop(bkv_pool *pool, uint32_t seq);

/**
 * A sequence's block table: physical block id of each logical block, in order.
 * Device ids normally; host ids while swapped out.
 * @param pool      the pool.
 * @param seq       the sequence id.
 * @param n_blocks  receives the entry count; may be NULL.
 * @return the table (owned by the pool, valid until the sequence next changes),
 *         or NULL for an unknown sequence (then *n_blocks = 0).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API const int32_t *bkv_seq_blocks(const bkv_pool *pool, uint32_t seq, uint32_t *n_blocks);

/**
 * The block table of one KV group of a sequence (group 0's is
 * bkv_seq_blocks). It has the same length as group 0's; entries a
 * sliding-window or chunked group released (blocks no later token reads)
 * are -1.
 * @param pool      the pool.
 * @param seq       the sequence id.
 * @param group     the group's index in bkv_pool_config.groups (0 for a
 *                  pool without groups).
 * @param n_blocks  receives the entry count; may be NULL.
 * @return the table (owned by the pool, valid until the sequence next
 *         changes), or NULL for an unknown sequence or group (then
 *         *n_blocks = 0).
 * Thread rules: as bkv_seq_blocks.
 */
BKV_API const int32_t *bkv_seq_group_blocks(const bkv_pool *pool, uint32_t seq, uint32_t group,
					    uint32_t *n_blocks);

/**
 * A sequence's recurrent-state units (a pool whose last group is STATE):
 * the unit its next computation reads its state from and the unit it
 * writes the new state to, each as its first frame (a unit is
 * bkv_kv_state_frames() consecutive frames). After an append, in is the
 * state before the appended tokens (-1: the zero state, nothing computed
 * yet) and out is where the state after them goes; the next append (or a
 * fork or swap-out) makes out the sequence's state. The scheduler hands
 * the same pair to the host in bkv_batch_group.state_in / state_out.
 * @param pool  the pool.
 * @param seq   the sequence id.
 * @param in    receives the first frame read, or -1.
 * @param out   receives the first frame written, or -1 (nothing appended
 *              since the state was last committed).
 * @return BKV_OK; BKV_EINVAL (NULL argument, or no STATE group); BKV_ENOENT
 *         (unknown sequence).
 * Thread rules: as bkv_seq_blocks.
 */
BKV_API int bkv_seq_state_frames(const bkv_pool *pool, uint32_t seq, int32_t *in, int32_t *out);

/**
 * Describe a sequence.
 * @param pool   the pool.
 * @param seq    the sequence id.
 * @param info   receives the description; untouched on error.
 * @return BKV_OK; BKV_EINVAL; BKV_ENOENT.
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_info_get(const bkv_pool *pool, uint32_t seq, bkv_seq_info *info);

/**
 * Move a sequence's blocks to the host tier: each device block gets a host
 * block and a BKV_COPY_SWAP_OUT copy; the device blocks are released by close's
 * rule (full cached blocks stay cached, so swap-in may find them again).
 * All-or-nothing.
 * @param pool   the pool.
 * @param seq    the sequence id.
 * @return BKV_OK; BKV_EINVAL; BKV_ENOENT; BKV_ESTATE (already swapped, no
 *         host tier, or one of its blocks is the source or destination of a
 *         pending device copy or the destination of a pending swap-in copy:
 *         clear those first); BKV_ENOSPC (not enough free host blocks);
 *         BKV_ENOMEM (the copy list could not grow).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_swap_out(bkv_pool *pool, uint32_t seq);

/**
 * Bring a swapped sequence back: full blocks still in the prefix cache are
 * shared again; the others get device blocks and BKV_COPY_SWAP_IN copies. Host
 * blocks whose block was found in the cache are freed at once; the others when
 * the swap-in copies are cleared (the host reads them until then).
 * All-or-nothing.
 * @param pool   the pool.
 * @param seq    the sequence id.
 * @return BKV_OK; BKV_EINVAL; BKV_ENOENT; BKV_ESTATE (not swapped, or device
 *         copies are pending: clear them first); BKV_ENOSPC (not enough
 *         device blocks); BKV_ENOMEM (the copy list could not grow).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_seq_swap_in(bkv_pool *pool, uint32_t seq);

/**
 * Pending block copies of one kind, in the order the host must perform them.
 * The host performs the kinds in the order SWAP_OUT, SWAP_IN, DEVICE (as
 * bkv_batch lists them). The pool keeps that order valid: swap-out and swap-in
 * refuse (BKV_ESTATE) the cases where it would read a block before a pending
 * copy writes it.
 * This call only reads: bkv_pool_clear_copies removes the copies once the host
 * has performed them.
 * @param pool   the pool.
 * @param kind   a bkv_copy_kind.
 * @param out    receives the array (owned by the pool; valid until cleared or
 *               the pool next changes); may be NULL.
 * @return the number of pending copies (0 for a NULL pool or bad kind).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API uint32_t bkv_pool_pending_copies(const bkv_pool *pool, bkv_copy_kind kind,
					 const bkv_copy **out);

/**
 * Forget pending copies of one kind, once the host has performed them.
 * Clearing swap-in copies also releases the host blocks they read from;
 * clearing device copies releases copy-on-write sources that no sequence
 * references any more (until then they cannot be reclaimed, so copies may be
 * performed again after a failed step). NULL pool or a bad kind is ignored.
 * @param pool   the pool.
 * @param kind   a bkv_copy_kind.
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API void bkv_pool_clear_copies(bkv_pool *pool, bkv_copy_kind kind);

/**
 * Device blocks that can be had now without preempting: free plus reclaimable
 * cached blocks.
 * @param pool   the pool.
 * @return the count; 0 for a NULL pool.
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API uint32_t bkv_pool_available(const bkv_pool *pool);

/**
 * Can a new sequence of n_tokens be admitted above the watermark? True when
 * free + reclaimable - blocks(n_tokens) >= watermark_blocks. Prefix hits are
 * not assumed (conservative).
 * @param pool   the pool.
 * @param n_tokens the new sequence's token count.
 * @return 1 yes, 0 no (and 0 for a NULL pool).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_pool_can_admit(const bkv_pool *pool, uint32_t n_tokens);

/**
 * Pin a prefix (a system prompt): the leading full blocks of tokens that the
 * prefix cache holds under key (what a request with that cache key would
 * hit) stay cached, out of eviction's reach, until bkv_pool_unpin. Pins of
 * one pool together hold at most pin_permille / 1000 of its device blocks
 * (a block two pins share counts twice). A pin takes one of the pool's
 * max_seqs sequence slots; its id names it only to bkv_pool_unpin: every
 * call that takes a sequence id answers a pin's id as an unknown sequence
 * (BKV_ENOENT, or NULL) and changes nothing, and bkv_pool_unpin answers a
 * sequence's id BKV_ENOENT. Against max_seqs a pin counts as an open
 * sequence: a scheduler admits a request only when its branches fit beside
 * the pins, and a pin never takes a slot that a running request's fork
 * still needs (BKV_EAGAIN until it forked or ended); a request whose
 * branches can fit only once pins are released waits for them, and ends
 * as unadmittable (BKV_FINISH_ERROR) if nothing else runs. Nothing is
 * computed: blocks
 * not cached yet are not pinned (pin again once a request has computed
 * them).
 * @param pool   the pool.
 * @param key    the cache key (tenant salt, LoRA id) the prefix is cached
 *               under; 0 = none.
 * @param tokens [n] the prefix's token ids.
 * @param n      tokens in the prefix (its last partial block is ignored).
 * @param pin    out: the pin's id.
 * @param pinned out (nullable): tokens pinned, a multiple of block_tokens.
 * @return BKV_OK; BKV_EINVAL (NULL pool, tokens or pin, n 0);
 *         BKV_ENOENT (no full block of it is cached); BKV_ENOSPC (the
 *         pins would hold more than pin_permille of the device blocks);
 *         BKV_EAGAIN (no free sequence slot, or only slots kept for
 *         running requests' forks); BKV_ENOMEM; BKV_ESTATE (no
 *         prefix cache, a pool with KV groups, or inside a scheduler's
 *         step). On error nothing changed.
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_pool_pin_prefix(bkv_pool *pool, uint64_t key, const int32_t *tokens, uint32_t n,
				uint32_t *pin, uint32_t *pinned);

/**
 * End a pin: its blocks go back to the prefix cache (most recently used),
 * evictable again.
 * @param pool   the pool.
 * @param pin    an id bkv_pool_pin_prefix returned.
 * @return BKV_OK; BKV_EINVAL (NULL pool); BKV_ENOENT (not a live pin).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_pool_unpin(bkv_pool *pool, uint32_t pin);

/**
 * Empty the prefix cache: every cached (unreferenced) block goes to the free
 * list and every indexed block leaves the index (blocks in use stay with their
 * sequences); so do a STATE group's checkpoints, and the host cache. A device-resident sequence that holds a full block stays out of
 * the cache from then on: the blocks it fills later are not cached either
 * (each block's hash chains from the blocks before it), until it is swapped
 * out (swap-in caches its full blocks again) or truncated below one block.
 * Between a scheduler's steps this is allowed with requests running (their
 * tokens are unchanged).
 * @param pool   the pool.
 * @return BKV_OK; BKV_EINVAL (NULL pool).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_pool_reset_cache(bkv_pool *pool);

/**
 * Read the pool's counters into the caller's struct.
 * @param pool   the pool.
 * @param stats  filled up to min(stats->size, sizeof(bkv_pool_stats)); set
 *               stats->size first (0 is taken as sizeof(bkv_pool_stats)).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API void bkv_pool_stats_get(const bkv_pool *pool, bkv_pool_stats *stats);

/*
 * Inspecting a pool: what its memory holds and what one block holds. For
 * capacity planning and debugging; neither call is on the hot path of a step
 * and neither changes the pool.
 */

/* The bytes a pool holds, by structure (bkv_pool_memory_get). Every byte
 * figure is what the pool took through its allocator for that structure;
 * total is their sum plus the handle itself. The fixed structures are taken at
 * bkv_pool_create; block_tables and copy_lists grow (geometrically, and never
 * shrink) while the pool runs. */
typedef struct bkv_pool_memory {
	uint32_t size;           /* sizeof(bkv_pool_memory) the caller expects */
	uint32_t block_bytes;    /* control record of one device block (state,
				    free/LRU links, parent, ref count, chain
				    hash, key) */
	uint32_t seq_slot_bytes; /* control record of one sequence slot plus its
				    entry in the ring of free slots (its block
				    table not included); with KV groups also
				    each lane's record of it and its state
				    bookkeeping */
	uint32_t index_slots;    /* hash index capacity: a power of two >=
				    2 x device_blocks; 0 without prefix cache */
	uint32_t index_used;     /* index slots holding a block (nr_indexed of
				    bkv_pool_stats); the load is index_used /
				    index_slots */
	uint32_t reserved;       /* zero */
	uint64_t blocks;         /* the device blocks' records: device_blocks
				    x block_bytes; plus, while they exist,
				    the eviction value records (28 B a block:
				    a sliding-window or chunked group's kept
				    blocks, BKV_EVICT_VALUE, retention) and
				    retention's clocks (8 B a block); with a
				    STATE group its units' records (25 B a
				    unit, and a map of 4-byte slots, two a
				    unit rounded up to a power of two) and,
				    with state_share, the frame chunks'
				    records (30 B a chunk); with a KV
				    connector that saves, its holds (4 B a
				    block) */
	uint64_t device_tokens;  /* the device token store: the token ids of
				    every block, 4 B per token slot, plus 64 B
				    that align it to a cache line (verifies
				    prefix hits, hashes blocks that fill over
				    several appends) */
	uint64_t index;          /* the prefix cache's hash index, 8 B per
				    slot, and its LRU (cached block ids in
				    chunks of 16, about 9 B per device block);
				    0 without prefix cache */
	uint64_t txn_queue;      /* a step transaction's queue of blocks that
				    filled inside it, 4 B per device block; 0
				    without prefix cache */
	uint64_t txn_owners;     /* where each queued block sits (sequence and
				    table position), 8 B per device block; 0
				    without prefix cache */
	uint64_t check_scratch;  /* bkv_pool_check's workspace, 4 B per block of
				    the larger tier or frame of the state
				    arena */
	uint64_t host;           /* the host tier: per host block a free-list
				    link (4 B), a state byte and its token ids
				    (4 B per token slot), and with a host
				    cache 37 B more, its index's 8-byte
				    slots and a byte per device block; 0
				    without one */
	uint64_t seq_slots;      /* max_seqs x seq_slot_bytes */
	uint64_t block_tables;   /* block table entries allocated over every
				    sequence slot and KV group, 4 B each (a
				    closed slot keeps its tables for the next
				    sequence) */
	uint64_t copy_lists;     /* pending-copy list entries allocated, 8 B
				    each, all three kinds */
	uint64_t event_ring;     /* the KV event ring: event_capacity x
				    sizeof(bkv_kv_event); 0 without events */
	uint64_t total;          /* every figure above plus the pool handle: the
				    bytes live in the pool's allocator */
} bkv_pool_memory;

/* The state of a device block (bkv_block_info.state); see bkv_pool_stats. */
typedef enum bkv_block_state {
	BKV_BLOCK_FREE = 0,   /* on the free list, no content */
	BKV_BLOCK_PINNED = 1, /* referenced by a sequence's table, or the source
				 of a pending device copy (counted in nr_used) */
	BKV_BLOCK_CACHED = 2  /* unreferenced, kept in the prefix cache (on the
				 LRU, reclaimable) */
} bkv_block_state;

/* One device block, as bkv_block_info_get reports it. */
typedef struct bkv_block_info {
	uint32_t size;         /* sizeof(bkv_block_info) the caller expects */
	bkv_block_state state; /* free, pinned or cached */
	uint32_t ref_count;    /* references from the block tables of
				  device-resident sequences */
	uint32_t fill;         /* tokens written, 0..block_tokens (full at
				  block_tokens); 0 for a free block */
	int indexed;           /* nonzero: in the prefix-cache index (full,
				  content immutable) */
	int copy_pending;      /* nonzero: source or destination of a pending
				  device copy, or destination of a pending
				  swap-in copy (bkv_pool_pending_copies) */
	uint32_t kids;         /* indexed blocks whose parent is this block */
	int32_t parent;        /* the block before it in the table of the
				  sequence that took it; -1 when it was
				  logical block 0, and for a free block */
	uint64_t key;          /* the prefix-cache key it is indexed under; 0
				  when not indexed */
	uint64_t hash;         /* its chained content hash (bkv_block_hashes
				  with the pool's hash_seed over its chain of
				  parents); 0 when not indexed */
	const int32_t *tokens; /* [fill] its token ids, owned by the pool and
				  valid until the pool next changes; NULL when
				  fill is 0 */
} bkv_block_info;

/**
 * Report the bytes a pool holds, by structure (see bkv_pool_memory): the
 * control data per device block and per sequence slot, the hash index and its
 * load, the token stores, the host tier, the grown block tables and copy
 * lists, the event ring. O(max_seqs).
 * @param pool   the pool.
 * @param mem    filled up to min(mem->size, sizeof(bkv_pool_memory)); set
 *               mem->size first (0 is taken as sizeof(bkv_pool_memory)).
 *               Untouched on error.
 * @return BKV_OK; BKV_EINVAL (NULL pool or mem).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_pool_memory_get(const bkv_pool *pool, bkv_pool_memory *mem);

/**
 * Describe one device block (see bkv_block_info): its state, ref count,
 * fill, whether it is indexed, its parent, key and chained hash, and its
 * tokens. Walking the parents of an indexed block reaches logical block 0 of
 * its chain through indexed blocks only (bkv_pool_check verifies it). O(1).
 * @param pool   the pool.
 * @param block  a device block id, 0..device_blocks - 1; with
 *               state_share, a frame id of the whole pool.
 * @param info   filled up to min(info->size, sizeof(bkv_block_info)); set
 *               info->size first (0 is taken as sizeof(bkv_block_info)).
 *               Untouched on error.
 * @return BKV_OK; BKV_EINVAL (NULL pool or info, block out of range, or
 *         with state_share a frame lent to the STATE group now: a state
 *         unit's, not a block).
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_block_info_get(const bkv_pool *pool, int32_t block, bkv_block_info *info);

/**
 * Walk every structure of the pool and verify every invariant (ref counts equal
 * table references, free + used + cached = total, no pinned block on the LRU,
 * the hash index matches the cached blocks, ...). O(all blocks): for tests,
 * fuzzers and debugging, not the hot path.
 * @param pool   the pool.
 * @return 0 when consistent; otherwise a positive number naming the violated
 *         invariant (1..17, listed in docs/api-notes.md); BKV_EINVAL for NULL.
 * Thread rules: the pool's thread (one at a time; not during a bkv_step
 * of a scheduler that uses the pool).
 */
BKV_API int bkv_pool_check(const bkv_pool *pool);

/* ------------------------------------------------------------------------ */
/* Cost model hooks                                                          */
/* ------------------------------------------------------------------------ */

/* One prefill chunk of a step: len prompt tokens starting at offset start. */
typedef struct bkv_chunk_shape {
	uint32_t len;   /* tokens computed in this chunk */
	uint32_t start; /* offset of its first token in the prompt (context
			   already in the KV cache) */
} bkv_chunk_shape;

typedef enum bkv_call_kind {
	BKV_CALL_MIXED = 0,   /* one forward with decode rows and prefill chunks */
	BKV_CALL_PREFILL = 1, /* a split host's prefill call */
	BKV_CALL_DECODE = 2   /* a split host's decode call */
} bkv_call_kind;

/* The shape of one host call, what a cost model prices. */
typedef struct bkv_step_shape {
	bkv_call_kind kind;             /* which callback runs */
	uint32_t decode_rows;           /* rows generating one token */
	uint64_t decode_context;        /* sum of those rows' context lengths */
	uint32_t n_chunks;              /* prefill chunks */
	const bkv_chunk_shape *chunks;  /* [n_chunks] */
	uint32_t padded_rows;           /* rows a padded kernel runs (static
					   batching keeps finished rows as
					   padding); >= decode_rows */
	uint32_t n_groups;              /* KV groups of the scheduler's pool
					   (0: one full-attention group, every
					   layer reads decode_context) */
	const uint64_t *group_decode_context; /* [n_groups] per group, the sum
					   over decode rows of the context
					   tokens its layers read: FULL the
					   context, WINDOW min(context, span),
					   CHUNKED the current chunk's tokens,
					   STATE 0; NULL when n_groups is 0 */
	uint32_t decode_drafts;         /* speculative decoding: draft tokens
					   the decode rows carry on top of their
					   one token each (a row verifying k
					   drafts computes 1 + k query tokens
					   over its context); 0 without
					   speculation (docs/design.md,
					   "Speculative decoding") */
} bkv_step_shape;

/* A cost model: both callbacks may be NULL (then the scheduler uses its
 * default). ctx is never read by the library. */
typedef struct bkv_cost_model {
	double (*step_us)(void *ctx, const bkv_step_shape *shape);
	void (*observe)(void *ctx, const bkv_step_shape *shape, double measured_us);
	void *ctx;
} bkv_cost_model;

/* ------------------------------------------------------------------------ */
/* Built-in cost models                                                      */
/* ------------------------------------------------------------------------ */

/*
 * Three models ship with the library (derivations in docs/cost-model.md). Each
 * is a plain config struct the caller owns plus a function that wraps it into a
 * bkv_cost_model whose ctx points at that struct: the struct must outlive every
 * scheduler using the model, and changing its fields changes the model.
 *
 *   polynomial  a measured fit for a host with split prefill and decode
 *               kernels: a fixed part per prefill call plus a quadratic in
 *               chunk length and offset; decode linear in rows and context.
 *               Its defaults are reference costs measured at batch 32
 *               (docs/cost-model.md).
 *   roofline    max(compute, memory) of a GPU/model pair from spec-sheet
 *               peaks; presets for common pairs.
 *   calibrated  starts from any model and fits its coefficients online, by
 *               least squares over every observe() the scheduler makes.
 *
 * Prediction functions never allocate and are safe to call from any thread as
 * long as no one changes the struct meanwhile; the calibrated model's observe
 * writes its state and belongs to the stepping thread.
 */

/* The polynomial model, in microseconds. With v(L, s) =
 * kappa * (b*L + c*(2*L*s + L*L)) the work of one prompt chunk of L tokens
 * starting at offset s:
 *   prefill call, n rows:  a + (n / rows_ref) * v(Lmax, Smax)       (padded)
 *                          a + (1 / rows_ref) * sum_i v(L_i, s_i)     (packed)
 *   decode call, n rows:   d0 + d1*n + d2*context
 *   mixed call:            d(n_decode) + (1 / rows_ref) * sum_i v(L_i, s_i);
 *                          with no decode rows: a + that sum.
 * Lmax and Smax are the longest chunk and the latest start (a padded kernel
 * pads both). n is max(chunks, padded_rows) for a prefill call and
 * max(decode_rows, padded_rows) for a decode call (static batching pays for
 * its padding). Default coefficients and how they were fitted:
 * docs/cost-model.md. */
typedef struct bkv_cost_poly {
	uint32_t size;   /* sizeof(bkv_cost_poly); set by init (ABI) */
	double a;        /* us: fixed part of every prefill call. Default 1677 */
	double b;        /* us per prompt token at rows_ref rows. Default 101.0 */
	double c;        /* us per token^2 (attention) at rows_ref rows.
			    Default 1.3607 */
	double kappa;    /* multiplier of b and c. Default 1.45 */
	double rows_ref; /* rows at which b and c hold (> 0). Default 32 */
	int packed;      /* 0: a prefill call pads its rows to the longest chunk
			    (split kernels); nonzero: ragged rows, each pays its
			    own length. Default 0. */
	double d0;       /* us: fixed part of a decode step. Default 1064 */
	double d1;       /* us per decode row. Default 24.1 (d(32) = 1835) */
	double d2;       /* us per token of decode context. Default 0 */
	uint32_t reserved[4]; /* zero; room for later fields */
} bkv_cost_poly;

/**
 * Fill a polynomial model with the default coefficients (see each field): the
 * reference costs the scheduler's default model starts from.
 * @param poly  the model to fill; NULL is ignored.
 * Thread rules: any thread.
 */
BKV_API void bkv_cost_poly_init(bkv_cost_poly *poly);

/**
 * Predict one host call with a polynomial model (what the wrapped step_us
 * calls).
 * @param poly   the model; NULL gives 0.
 * @param shape  the call; NULL gives 0.
 * @return microseconds, >= 0.
 * Thread rules: any thread; reads poly and shape only.
 */
BKV_API double bkv_cost_poly_step_us(const bkv_cost_poly *poly, const bkv_step_shape *shape);

/**
 * Wrap a polynomial model as a cost model: step_us prices a shape, observe is
 * NULL (the polynomial does not learn; wrap it in a calibrated model for that).
 * @param poly  kept as ctx (not copied): it must outlive the returned model.
 *              NULL gives a model with both callbacks NULL (the scheduler's
 *              default).
 * @return the model, by value.
 * Thread rules: any thread.
 */
BKV_API bkv_cost_model bkv_cost_poly_model(bkv_cost_poly *poly);

/* The roofline model: t = overhead + max(compute, memory) per call, with
 *   compute = (2 * active_params * tokens + attn_flops) / (peak_flops * flops_eff)
 *   memory  = (model_bytes + kv_bytes_per_token * kv_tokens) / (mem_bw * mem_eff)
 * where tokens = decode rows + prefill tokens, kv_tokens = tokens whose KV is
 * read or written (decode context + each chunk's start + len), and attn_flops =
 * attn_flops_per_pair * (query, key) pairs (0 ignores attention). Times in
 * microseconds, rates per second.
 * A hybrid model sets groups (n_groups > 0): its KV bytes and attention pairs
 * are then counted per group, a group's tokens times its layers x bytes,
 * instead of kv_bytes_per_token times all tokens: a decode row reads what
 * shape->group_decode_context gives each group (when the shape has the
 * model's n_groups; otherwise the bound the shape's sums give, FULL the
 * context, WINDOW and CHUNKED min(context, rows x span)); a prefill chunk's
 * query at position p reads keys from where its group starts reading (FULL
 * 0, WINDOW p - span + 1, CHUNKED floor(p / span) x span); a STATE group's
 * unit is read and written once per decode row and once per chunk.
 * attn_flops_per_pair then counts the attention layers only, shared among the
 * attention groups by their layers. One FULL group of all layers prices
 * exactly as n_groups 0. Derivation: docs/cost-model.md. */
typedef struct bkv_cost_roofline {
	uint32_t size;              /* sizeof(bkv_cost_roofline); set by init */
	const char *name;           /* preset name, or NULL; never freed */
	double peak_flops;          /* FLOP/s, dense, at the weights' dtype */
	double mem_bw;              /* device memory bandwidth, bytes/s */
	double model_bytes;         /* weight bytes read once per call */
	double active_params;       /* parameters each token multiplies (MoE:
				       the active ones) */
	double kv_bytes_per_token;  /* see bkv_kv_bytes_per_token() */
	double attn_flops_per_pair; /* FLOPs per (query, key) token pair:
				       4 * layers * heads * head_dim; 0 = ignore */
	double flops_eff;           /* achievable fraction of peak_flops, (0, 1].
				       Default 1. */
	double mem_eff;             /* achievable fraction of mem_bw, (0, 1].
				       Default 1. */
	double overhead_us;         /* fixed us per call (launches). Default 0 */
	uint32_t reserved[4];       /* zero; room for later fields */
	uint32_t n_groups;          /* KV groups of a hybrid model,
				       0..BKV_MAX_GROUPS; 0 = every layer full
				       attention at kv_bytes_per_token (then
				       the groups are not read). Default 0 */
	const bkv_kv_group *groups; /* [n_groups], not copied: must outlive
				       the model; valid as the sizing
				       functions' group lists (block_tokens
				       plays no part), else the model prices
				       0. NULL when n_groups is 0 */
} bkv_cost_roofline;

/* GPU/model pairs with spec-sheet figures; sources in docs/cost-model.md. */
typedef enum bkv_roofline_preset {
	BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16 = 0, /* 312 TFLOP/s, 2.039 TB/s */
	BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16 = 1,   /* 989 TFLOP/s, 3.35 TB/s */
	BKV_ROOFLINE_A100_80GB_OPT_13B_FP16 = 2,    /* 312 TFLOP/s, 2.039 TB/s */
	BKV_ROOFLINE_PRESET_COUNT = 3
} bkv_roofline_preset;

/**
 * Fill a roofline model with a preset GPU/model pair (efficiencies 1, no
 * overhead, attention FLOPs counted, no KV groups).
 * @param rl      the model to fill.
 * @param preset  which pair.
 * @return BKV_OK; BKV_EINVAL (NULL rl or unknown preset; rl untouched).
 * Thread rules: any thread.
 */
BKV_API int bkv_cost_roofline_init(bkv_cost_roofline *rl, bkv_roofline_preset preset);

/**
 * The work a roofline model counts for one call: the FLOPs and the device
 * bytes moved, e.g. to report model FLOPs and bandwidth utilisation (MFU, MBU)
 * from measured times.
 * @param rl     the model; NULL, or invalid groups, give zeros.
 * @param shape  the call; NULL gives zeros.
 * @param flops      receives FLOPs; may be NULL.
 * @param bytes      receives bytes read or written; may be NULL.
 * Thread rules: any thread; reads rl and shape only.
 */
BKV_API void bkv_cost_roofline_work(const bkv_cost_roofline *rl, const bkv_step_shape *shape,
				    double *flops, double *bytes);

/**
 * Predict one host call with a roofline model.
 * @param rl     the model.
 * @param shape  the call to price.
 * @return microseconds, >= 0; 0 for a NULL argument, a model whose peaks
 *         are not positive, or one whose groups are not valid.
 * Thread rules: any thread; reads rl and shape only.
 */
BKV_API double bkv_cost_roofline_step_us(const bkv_cost_roofline *rl,
					 const bkv_step_shape *shape);

/**
 * Wrap a roofline model as a cost model (observe NULL).
 * @param rl  kept as ctx (not copied); NULL gives both callbacks NULL.
 * @return the model, by value.
 * Thread rules: any thread.
 */
BKV_API bkv_cost_model bkv_cost_roofline_model(bkv_cost_roofline *rl);

/* The calibrated model: an online least-squares fit, one per call kind
 * (prefill, decode, mixed), of
 *   t = w0 * base(shape) + w1 + w2*rows + w3*context + w4*no_decode
 *       + w5*sum L + w6*sum (2*L*s + L*L) + w7*rows*Lmax
 *       + w8*rows*(2*Lmax*Smax + Lmax*Lmax)
 * (rows as the polynomial counts them, padding included; no_decode is 1 for
 * a mixed call without decode rows; sums and maxima over the prefill chunks)
 * starting from w = (1, 0, ...), and can express the polynomial model
 * (padded or packed) exactly. The fit is robust: every coefficient stays
 * >= 0 (so is every prediction); each measurement is clipped, in log space,
 * at 2.5 robust scales of the residuals from the prediction it is judged
 * against (a 10x stall counts as a 2.5-sigma call); it predicts the base
 * model until it has BKV_COST_CALIB_MIN_OBS observations of a kind, and
 * afterwards whenever the base's residuals are narrower than the fit's.
 * A level factor on the fit follows the recent residuals (gain 1/32 per
 * observation), so the model follows a host that slows down or speeds up
 * within tens of calls; the fit's sums are weighed by a forgetting factor. observe() does no allocation. docs/cost-model.md
 * ("Calibration") explains the estimator. */
typedef struct bkv_cost_calib bkv_cost_calib;

/* Features of the calibrated fit, and how many observations of a kind it needs
 * before it trusts the fit over the base model. */
#define BKV_COST_CALIB_FEATURES 9
#define BKV_COST_CALIB_MIN_OBS 16

/**
 * Create a calibrated model over a base model.
 * @param base   copied (its ctx must outlive the calibrated model); NULL, or
 *               a NULL step_us, starts from a base that predicts 0 (the fit
 *               then learns from scratch). The base's observe is also called
 *               by the calibrated model's observe.
 * @param alloc  allocator; NULL = libc. Copied.
 * @param out    receives the model; untouched on failure.
 * @return BKV_OK; BKV_EINVAL (NULL out); BKV_ENOMEM.
 * Thread rules: any thread; the model then belongs to one thread at a time.
 */
BKV_API int bkv_cost_calib_create(const bkv_cost_model *base, const bkv_allocator *alloc,
				  bkv_cost_calib **out);

/**
 * Destroy a calibrated model. NULL is ignored.
 * @param calib  the calibrated model.
 * Thread rules: owner thread, with no scheduler still using it.
 */
BKV_API void bkv_cost_calib_destroy(bkv_cost_calib *calib);

/**
 * Set the forgetting factor: each observation's weight is multiplied by it
 * when the next arrives (1 = never forget; default 0.999, about the last
 * thousand calls of a kind).
 * @param calib  the calibrated model.
 * @param forget the factor, in [0.9, 1].
 * @return BKV_OK; BKV_EINVAL (NULL calib or forget outside [0.9, 1]).
 * Thread rules: owner thread.
 */
BKV_API int bkv_cost_calib_set_forget(bkv_cost_calib *calib, double forget);

/**
 * Predict one host call: the fit for the shape's kind once it is trusted
 * (BKV_COST_CALIB_MIN_OBS observations, at least half that effective weight
 * after forgetting) and its residuals are no wider than the base model's,
 * else the base model.
 * @param calib  the calibrated model.
 * @param shape  the call to price.
 * @return microseconds, >= 0; 0 for a NULL argument.
 * Thread rules: owner thread (or any, while no observe runs).
 */
BKV_API double bkv_cost_calib_step_us(bkv_cost_calib *calib, const bkv_step_shape *shape);

/**
 * Learn from one measured call: add it to the least-squares sums of its kind
 * and refit (a 9x9 solve). No allocation. Negative, NaN or infinite
 * measurements are ignored. A measurement under 4 us (the microsecond
 * clock's resolution) only scales the base: it keeps the base's shape.
 * @param calib        the calibrated model; NULL is ignored.
 * @param shape        the call that was measured; NULL is ignored.
 * @param measured_us  what the call took, in microseconds.
 * Thread rules: owner thread.
 */
BKV_API void bkv_cost_calib_observe(bkv_cost_calib *calib, const bkv_step_shape *shape,
				    double measured_us);

/**
 * Observations taken so far for one call kind (with forgetting, the weight
 * they still carry is less).
 * @param calib  the calibrated model.
 * @param kind   a bkv_call_kind.
 * @return the count; 0 for NULL or an unknown kind.
 * Thread rules: owner thread.
 */
BKV_API uint64_t bkv_cost_calib_observations(const bkv_cost_calib *calib, bkv_call_kind kind);

/**
 * Copy the fitted coefficients of one call kind, in the order of the formula
 * above, into the caller's array.
 * @param calib  the calibrated model.
 * @param kind   a bkv_call_kind.
 * @param w      receives BKV_COST_CALIB_FEATURES values.
 * @return BKV_OK; BKV_EINVAL (NULL argument or unknown kind).
 * Thread rules: owner thread.
 */
BKV_API int bkv_cost_calib_coefficients_get(const bkv_cost_calib *calib, bkv_call_kind kind,
					    double *w);

/* How much one call kind's fit knows (bkv_cost_calib_confidence_get). */
typedef struct bkv_cost_calib_confidence {
	size_t size;        /* sizeof(bkv_cost_calib_confidence), set by the
			       caller */
	double n_eff;       /* observations' weight after forgetting (<= the
			       count of bkv_cost_calib_observations) */
	double scale_fit;   /* robust sigma of ln(measured / fit's prediction),
			       judged before each refit; 0.5 before any */
	double scale_base;  /* the same for the base model; 0 without one */
	double level;       /* factor on the fit's prediction that follows drift
			       (1 until the fit is trusted) */
	int trusted;        /* 1: enough observations to use the fit */
	int uses_fit;       /* 1: predictions of this kind come from the fit
			       (trusted, residuals no wider than the base's) */
} bkv_cost_calib_confidence;

/**
 * Read how much one call kind's fit knows.
 * @param calib  the calibrated model.
 * @param kind   a bkv_call_kind.
 * @param out    filled; out->size must be set first.
 * @return BKV_OK; BKV_EINVAL (NULL argument, unknown kind, or out->size too
 *         small).
 * Thread rules: owner thread.
 */
BKV_API int bkv_cost_calib_confidence_get(const bkv_cost_calib *calib, bkv_call_kind kind,
					  bkv_cost_calib_confidence *out);

/**
 * Wrap a calibrated model as a cost model: both step_us and observe set, ctx =
 * calib (not owned; destroy the scheduler before the model).
 * @param calib  NULL gives both callbacks NULL.
 * @return the model, by value.
 * Thread rules: any thread.
 */
BKV_API bkv_cost_model bkv_cost_calib_model(bkv_cost_calib *calib);

/* ------------------------------------------------------------------------ */
/* The scheduler                                                             */
/* ------------------------------------------------------------------------ */

typedef struct bkv_sched bkv_sched;

/* The token a host writes for a row that failed: the request ends with
 * BKV_FINISH_ERROR. */
#define BKV_TOKEN_FAIL (-1)

/* Overlapped scheduling (bkv_step_launch): a token id in [-2 -
 * BKV_OVERLAP_MAX_DEPTH * BKV_TOKEN_PENDING_ROWS + 1, -2] in a batch's
 * token_ids is a placeholder. BKV_TOKEN_PENDING_AT(back, i) stands for the
 * token that the step launched `back` launches before this one (1 = the
 * previous launch, at most bkv_sched_config.overlap) samples for its row i
 * (its next_tokens[i]); the host substitutes it, on the device, before
 * computing. BKV_TOKEN_PENDING(i) is BKV_TOKEN_PENDING_AT(1, i), the only
 * kind at depth 1. Positions and slot_mapping of a placeholder's row are
 * exact. (Encoder inputs' ids lie below that range: bkv_encoder_token.) */
#define BKV_OVERLAP_MAX_DEPTH 8 /* bkv_sched_config.overlap at most */
#define BKV_TOKEN_PENDING_ROWS (1 << 18) /* rows a placeholder can name */
#define BKV_TOKEN_PENDING_AT(back, i) \
	(-2 - (int32_t)((((uint32_t)(back) - 1u) << 18) | (uint32_t)(i)))
#define BKV_TOKEN_PENDING(i) BKV_TOKEN_PENDING_AT(1, i)
#define BKV_TOKEN_IS_PENDING(t) \
	((t) <= -2 && (t) > -2 - BKV_OVERLAP_MAX_DEPTH * BKV_TOKEN_PENDING_ROWS)
#define BKV_TOKEN_PENDING_ROW(t) \
	((uint32_t)(-2 - (int64_t)(t)) & (BKV_TOKEN_PENDING_ROWS - 1))
#define BKV_TOKEN_PENDING_BACK(t) (((uint32_t)(-2 - (int64_t)(t)) >> 18) + 1)

/* How a batch describes the rows' block tables (bkv_sched_config.batch_layout). */
typedef enum bkv_batch_layout {
	BKV_BATCH_FLAT = 0,       /* every call carries each row's whole table in
				     kv_indptr/kv_indices (FlashInfer's paged
				     layout); the default */
	BKV_BATCH_PERSISTENT = 1  /* rows keep a row slot from step to step and
				     each call carries only the change to their
				     tables (table_deltas); kv_indptr and
				     kv_indices are not filled */
} bkv_batch_layout;

/* bkv_table_delta.flags */
#define BKV_TABLE_OPENED 0x1u /* the slot was (re)assigned: forget what the
				 mirror held for it before this delta */
#define BKV_TABLE_CLOSED 0x2u /* the slot was released: its row ended or was
				 preempted (len is 0) */

/* One change to a row slot's block table, in the persistent layout. The
 * host's copy of the slot's table becomes: entries [start, start + n) set to
 * the next n entries of bkv_batch.delta_blocks (the deltas' entries follow
 * each other in order), then its length set to len (entries from len on are
 * gone). Deltas are absolute writes, so applying a delta twice, or the
 * delta of a call whose step was rolled back and then the next call's, gives
 * the same table: after applying a call's deltas in order, a host's copy
 * holds, for every row of the call, exactly the table the pool holds. */
typedef struct bkv_table_delta {
	uint32_t slot;  /* row slot, < bkv_batch.n_row_slots */
	uint32_t start; /* first entry written */
	uint32_t n;     /* entries written (in delta_blocks) */
	uint32_t len;   /* the table's length after the delta */
	uint32_t flags; /* BKV_TABLE_* */
} bkv_table_delta;

/* One KV group's part of a call (bkv_batch.groups), for a pool with KV
 * groups (bkv_pool_config.groups). Every group computes the same tokens at
 * the same positions (token_ids, positions, qo_indptr, kv_last_page_len are
 * the batch's); what differs is where each group's K/V lives. groups[0] is
 * the batch's own arrays. */
typedef struct bkv_batch_group {
	uint32_t kind;                /* the group's bkv_group_kind */
	uint32_t span;                /* its span (window W, chunk C), 0 for
					 FULL */
	const int32_t *slot_mapping;  /* [n_tokens] where each new token's K/V
					 is written in this group */
	const int32_t *kv_indptr;     /* flat: [n_rows+1] row r's blocks in
					 this group are kv_indices[kv_indptr[r]
					 .. kv_indptr[r+1]); NULL when
					 persistent */
	const int32_t *kv_indices;    /* flat: each row's blocks from
					 kv_first_block[r] to its last block:
					 a window or chunked group lists only
					 the blocks its row's tokens read */
	const int32_t *kv_first_block; /* flat: [n_rows] the logical index of
					 each row's first entry (0 for FULL;
					 NULL: 0 for every row, as in a pool
					 without groups);
					 the entry at kv_indptr[r] holds
					 positions kv_first_block[r] x
					 block_tokens on */
	const int32_t *const *row_tables; /* persistent: [n_row_slots] this
					 group's table of each slot, valid for
					 the slots of this call's rows; entries
					 a window released are -1. Overlap:
					 valid only during the launch callback
					 (copy what you read) */
	const uint32_t *row_table_len; /* persistent: [n_row_slots] entries */
	const int32_t *state_in;      /* STATE: [n_rows] the first frame of the
					 state unit each row reads its initial
					 state from; -1: the zero state (the
					 row starts at position 0). NULL for
					 attention groups */
	const int32_t *state_out;     /* STATE: [n_rows] the first frame of the
					 unit each row writes its state after
					 its last token to (never a unit any
					 row of the call reads: states are
					 written out of place) */
	uint32_t state_frames;        /* STATE: consecutive frames per unit */
	const int32_t *state_out_spec; /* STATE with speculation: indexed like
					 token_ids over the decode rows, the
					 first frame of the unit the host writes
					 the state after each token to: a row
					 with k drafts (bkv_batch.row_drafts)
					 writes the state after its token j at
					 state_out_spec[qo_indptr[r] + j], j =
					 0..k (the last is state_out[r]); a row
					 without drafts has state_out[r] there.
					 The commit keeps the state after the
					 last delivered token. NULL when the
					 call has no draft, and for other
					 groups */
} bkv_batch_group;

/* What the host must do in one call. Plain data, owned by the scheduler, valid
 * during the callback. Rows [0, n_decode_rows) are decode rows (one token
 * each); rows [n_decode_rows, n_rows) are prefill chunks. The KV arrays follow
 * FlashInfer's paged layout; slot_mapping follows vLLM's (block * block_tokens
 * + offset). Before computing, the host performs the copy lists in this order:
 * swap_out, swap_in, copies. In the persistent layout the host first applies
 * table_deltas to its copy of the row slots' tables (docs/integration.md,
 * "The persistent layout"). */
/* An encoder input to run (bkv_batch.encode). */
typedef struct bkv_encode {
	uint64_t cache_id; /* cache its outputs under this id */
	uint64_t req;      /* a request giving it (its id); it may have no
			      row in this call */
	void *user;        /* that request's bkv_request.user */
	uint32_t input;    /* its index in that request's inputs */
	uint32_t len;      /* its token_len: the outputs' positions */
} bkv_encode;

typedef struct bkv_batch {
	bkv_call_kind kind;               /* which callback this is */
	uint32_t n_rows;                  /* sequences in the call */
	uint32_t n_decode_rows;           /* leading rows that are decode rows */
	uint32_t n_tokens;                /* ragged token count */
	uint32_t block_tokens;            /* tokens per KV block */
	const int32_t *token_ids;         /* [n_tokens] input tokens */
	const int32_t *positions;         /* [n_tokens] position of each token */
	const int32_t *qo_indptr;         /* [n_rows+1] row r's tokens are
					     [qo_indptr[r], qo_indptr[r+1]) */
	const int32_t *kv_indptr;         /* [n_rows+1] row r's blocks are
					     kv_indices[kv_indptr[r]..r+1) */
	const int32_t *kv_indices;        /* block ids, context + new tokens */
	const int32_t *kv_last_page_len;  /* [n_rows] tokens in each row's last
					     block, 1..block_tokens */
	const int32_t *slot_mapping;      /* [n_tokens] where each new token's K/V
					     is written */
	const uint8_t *row_sample;        /* [n_rows] 1: write a sampled token
					     for this row into next_tokens[r] */
	const uint64_t *row_req;          /* [n_rows] request id of each row */
	const uint32_t *row_branch;       /* [n_rows] sample index (0..n-1) */
	void *const *row_user;            /* [n_rows] request user pointers */
	uint32_t n_copies;                /* device->device copies */
	const bkv_copy *copies;
	uint32_t n_swap_out;              /* device->host copies */
	const bkv_copy *swap_out;
	uint32_t n_swap_in;               /* host->device copies */
	const bkv_copy *swap_in;
	bkv_batch_layout layout;          /* the scheduler's batch_layout */
	uint32_t n_row_slots;             /* persistent: row slots 0..n-1 exist
					     (max_running; (depth + 2) x
					     max_running with overlap, whose
					     released
					     slots wait for the steps that
					     read them); 0 when flat */
	const uint32_t *row_slot;         /* [n_rows] persistent: each row's row
					     slot; NULL when flat */
	const int32_t *const *row_tables; /* [n_row_slots] persistent: the
					     library's table of each slot, valid
					     for the slots of this call's rows
					     (others may be stale); NULL when
					     flat. Overlap: valid only during
					     the launch callback (copy what
					     you check) */
	const uint32_t *row_table_len;    /* [n_row_slots] entries of each
					     row_tables[slot], as row_tables */
	uint32_t n_table_deltas;          /* persistent: changes to apply */
	const bkv_table_delta *table_deltas; /* [n_table_deltas] in order */
	const int32_t *delta_blocks;      /* the entries the deltas write, in
					     delta order */
	uint32_t n_groups;                /* KV groups of the pool (1 without
					     groups) */
	const bkv_batch_group *groups;    /* [n_groups] each group's slots and
					     blocks; groups[0] repeats the
					     arrays above. The table deltas are
					     group 0's: in the persistent layout
					     a host reads the other groups'
					     tables from row_tables */
	/* Speculative decoding (bkv_sched_config.spec_max_k > 0; all NULL and
	 * 0 otherwise). A decode row r with row_drafts[r] = k > 0 carries 1 +
	 * k query tokens: token_ids[qo_indptr[r]] is its last accepted token,
	 * the k after it are drafts, each with its position and slot (the
	 * slots may cross a block boundary; kv_last_page_len and the tables
	 * cover all 1 + k). The host computes the row causally and writes, for
	 * j = 0..k, the token it samples after the row's token j at
	 * spec_tokens[qo_indptr[r] + j] (for j <= n_accepted only, when it
	 * sets n_accepted[r]). Then either it sets n_accepted[r] to the
	 * drafts it accepted (0..k; its own rule, e.g. rejection sampling),
	 * or leaves it at -1 and the library accepts greedily: draft j + 1 is
	 * accepted while spec_tokens[qo_indptr[r] + j] equals it. Either way
	 * an accepted draft must equal the token sampled before it (the KV
	 * was computed for the draft); the library stops the run at the first
	 * that does not. The request gets the accepted drafts and then the
	 * bonus token (spec_tokens[qo_indptr[r] + n_accepted]), in order, up
	 * to a stop token or max_new_tokens. next_tokens[r] of a row with
	 * drafts is not read. Rows with row_drafts[r] = 0 are decode rows as
	 * before (one token, next_tokens[r]). */
	uint32_t n_spec_rows;             /* rows with drafts in this call */
	const uint32_t *row_drafts;       /* [n_rows] drafts in each row (0 for
					     prefill rows and plain decode rows) */
	int32_t *spec_tokens;             /* writable, indexed like token_ids
					     over the decode rows: the tokens
					     sampled at each position of a row
					     with drafts */
	int32_t *n_accepted;              /* writable, [n_rows]: drafts the
					     host accepted, or -1 (the
					     default): greedy by the library */
	/* Adapters (bkv_sched_config.max_adapters > 0; NULL and 0 otherwise).
	 * A host applies adapter row_adapter[r] to row r's tokens (0: none)
	 * and has every entry of adapters loaded for the call. */
	const uint32_t *row_adapter;      /* [n_rows] bkv_request.adapter of
					     each row */
	uint32_t n_adapters;              /* distinct nonzero adapters of the
					     call's rows, <= max_adapters */
	const uint32_t *adapters;         /* [n_adapters] them, in the order
					     of their first row */
	/* Encoder inputs (bkv_sched_config.encoder_cache > 0; NULL and 0
	 * otherwise). Before its rows, the host drops the outputs of the
	 * cache ids in encoder_free (each id is said once: the host drops
	 * them whether or not the call succeeds; ids it does not hold are
	 * ignored), then runs the encoder on each input in encode and caches
	 * the outputs by cache id. A row reads the outputs of every input
	 * whose span it covers (its request's inputs; the token ids there are
	 * bkv_encoder_token's); they are cached by then, by this call or an
	 * earlier one. With overlap both lists stay valid until the step
	 * completes. */
	uint32_t n_encode;                /* inputs to encode now */
	const bkv_encode *encode;         /* [n_encode] */
	uint32_t n_encoder_free;          /* cache ids to drop first */
	const uint64_t *encoder_free;     /* [n_encoder_free] */
} bkv_batch;

/* Why a request ended. For a request with n > 1 samples: the reason of the
 * branch that ended last (ERROR and ABORT end every branch at once). */
typedef enum bkv_finish_reason {
	BKV_FINISH_LENGTH = 0, /* max_new_tokens generated */
	BKV_FINISH_STOP = 1,   /* a stop token was generated */
	BKV_FINISH_ABORT = 2,  /* bkv_abort() */
	BKV_FINISH_ERROR = 3   /* the host wrote BKV_TOKEN_FAIL for it, or it
				  can never be admitted, even into an
				  otherwise empty pool (counted in
				  bkv_sched_stats.unadmittable) */
} bkv_finish_reason;

/*
 * The host's kernels and notifications. Set either forward (mixed batches) or
 * both prefill and decode (split kernels); if all three are set, forward is
 * used. Compute callbacks return 0 on success or a negative value on failure
 * (the step is rolled back and bkv_step returns BKV_EHOST). The notification
 * callbacks may be NULL. A callback must not call bkv_step (BKV_ESTATE).
 */
typedef struct bkv_host_ops {
	int (*forward)(void *host, const bkv_batch *batch, int32_t *next_tokens);
	int (*prefill)(void *host, const bkv_batch *batch, int32_t *next_tokens);
	int (*decode)(void *host, const bkv_batch *batch, int32_t *next_tokens);
	void (*on_token)(void *host, uint64_t req, uint32_t branch, int32_t token,
			 void *req_user);
	void (*on_finish)(void *host, uint64_t req, bkv_finish_reason reason, void *req_user);
	uint64_t (*now_us)(void *host); /* optional clock; NULL = monotonic */
	/* optional, speculative decoding with spec_drafts BKV_SPEC_DRAFT_HOST:
	 * propose up to k draft tokens to follow branch `branch` of request
	 * `req`, whose known tokens (prompt, then generated) are ctx[0, n_ctx)
	 * (valid during the call); write them to out[0, k) and return how
	 * many (0..k; a negative value or 0: none this step). Called while the
	 * step plans, before the compute call that verifies them. */
	int (*draft)(void *host, uint64_t req, uint32_t branch, const int32_t *ctx,
		     uint32_t n_ctx, int32_t *out, uint32_t k, void *req_user);
	/* overlapped scheduling (bkv_sched_config.overlap): enqueue the
	 * mixed batch and return at once, without its tokens; the host writes
	 * the sampled tokens into next_tokens (the library's, valid until the
	 * step is completed) before it calls bkv_step_complete. Every array
	 * the batch points to stays valid until then; the bkv_batch struct
	 * itself only during the call (copy it), and in the persistent
	 * layout row_tables/row_table_len only during the call too.
	 * Placeholders (BKV_TOKEN_PENDING) in token_ids name rows of the step
	 * launched before. Persistent layout: apply each launch's table_deltas
	 * in launch order (they are relative to the previous launch's); a
	 * failed step's deltas may be kept or discarded (bkv_step_complete).
	 * 0 on success, negative on failure (the step fails: bkv_step_launch
	 * answers BKV_EHOST). NULL when overlap is off. */
	int (*launch)(void *host, const bkv_batch *batch, int32_t *next_tokens);
} bkv_host_ops;

typedef enum bkv_policy {
	BKV_POLICY_CONTINUOUS = 0, /* continuous batching with admission groups */
	BKV_POLICY_STATIC = 1      /* fill max_running, run the group to the end */
} bkv_policy;

typedef enum bkv_preempt_mode {
	BKV_PREEMPT_AUTO = 0,      /* swap when cheaper than recompute */
	BKV_PREEMPT_RECOMPUTE = 1, /* free blocks, recompute later */
	BKV_PREEMPT_SWAP = 2       /* move blocks to the host tier */
} bkv_preempt_mode;

/* Where speculative decoding's drafts come from (bkv_sched_config.spec_drafts). */
typedef enum bkv_spec_drafts {
	BKV_SPEC_DRAFT_NGRAM = 0, /* the library: n-gram prompt lookup over the
				     branch's own tokens (model-free) */
	BKV_SPEC_DRAFT_HOST = 1   /* the host's draft callback
				     (bkv_host_ops.draft; else EINVAL) */
} bkv_spec_drafts;

/* How speculative decoding picks k, the drafts of a row (spec_k_mode). */
typedef enum bkv_spec_k_mode {
	BKV_SPEC_K_AUTO = 0,  /* per row and step, 0..spec_max_k, by the cost
				 model and the request's measured acceptance */
	BKV_SPEC_K_FIXED = 1  /* spec_max_k for every row that has that many
				 drafts, memory and budget permitting */
} bkv_spec_k_mode;

/* Most drafts per row (bkv_sched_config.spec_max_k). */
#define BKV_SPEC_MAX_K 16u

/* Which cached block the pool's prefix cache evicts when it needs a frame
 * (bkv_sched_config.evict; docs/design.md, "Eviction by value"). */
typedef enum bkv_evict_policy {
	BKV_EVICT_LRU = 0,  /* the least recently released block, deepest
			       first */
	BKV_EVICT_VALUE = 1, /* GreedyDual: LRU in which a block's
			       expected saving (its recompute price at its
			       depth x its decayed hit count) buys it
			       time; with sliding-window or chunked
			       groups, LRU's order (docs/design.md,
			       "Eviction by value") */
	BKV_EVICT_SEGMENTED = 2 /* LRU in two segments: blocks hit since
			       they were cached (or kept while the cache
			       had room) are protected, prefixes used
			       once go first; holds up when sessions
			       that take turns outgrow the cache
			       (docs/design.md, "The segmented LRU");
			       bkv_sched_config_init's default */
} bkv_evict_policy;

/* Which running request preemption takes when the pool is short
 * (bkv_sched_config.victim; docs/design.md, "Victims by cost"). */
typedef enum bkv_victim_policy {
	BKV_VICTIM_RECENT = 0, /* lowest priority, then the most recently
				  admitted (the default) */
	BKV_VICTIM_COST = 1    /* lowest priority, then the least predicted
				  loss (recomputing or swapping what it holds)
				  per block freed and step of output it has
				  left; a request preempted within the last
				  64 steps only when no other can go */
} bkv_victim_policy;

/* What admission keeps room for (bkv_sched_config.admit_reserve;
 * docs/design.md, "Admission by expected memory"). */
typedef enum bkv_admit_reserve {
	BKV_RESERVE_PROMPT = 0, /* the new request's prompt above the
				   watermark (the default) */
	BKV_RESERVE_OUTPUT = 1  /* also every running request's prompt and
				   output as far as expected (its
				   predicted_output, else the mean length of
				   the requests that ended, at most
				   max_new_tokens): admitted work the pool
				   cannot hold to completion waits */
} bkv_admit_reserve;

/* ------------------------------------------------------------------------ */
/* KV connectors: external KV stores and other processes                     */
/* ------------------------------------------------------------------------ */

/* bkv_connector.lookup's answer when it cannot tell yet (a remote query in
 * flight): the request waits off the queue, passed by the others, and is
 * asked again at each later step. */
#define BKV_CONNECTOR_LATER (-2147483647 - 1)

/* One block of a load or a save: an attention group's block, or a STATE
 * group's unit (its frames consecutive). */
typedef struct bkv_kv_xfer_block {
	uint64_t hash;   /* the block's chained hash in its group: group 0's
			    is the hash bkv_block_hashes gives (and KV
			    events carry); a further group's and a state's
			    are salted, so one key names one group's block
			    (a state's: the block it ends, salted) */
	uint32_t index;  /* logical block: tokens [index x block_tokens,
			    (index + 1) x block_tokens) of the sequence; for
			    a state, the block it ends */
	uint32_t group;  /* KV group (0 in a plain pool) */
	int32_t block;   /* device block id in that group; a state's first
			    frame */
	uint32_t frames; /* 1 for an attention block; a state's
			    bkv_kv_state_frames */
} bkv_kv_xfer_block;

/*
 * A KV connector (docs/integration.md, "KV connectors"): an external store of
 * KV blocks keyed by chained hash. lookup is asked when a request enters the
 * queue; blocks it holds beyond the device cache are loaded into blocks the
 * library allocates (the request waits without rows, others run), then join
 * the prefix cache; failed blocks are recomputed from the first one on.
 * Computed full blocks go to save and stay held until it completes, also
 * past the request's end. Transfers complete by bkv_kv_xfer_done (any
 * thread, even inside the call); their blocks arrays stay valid until then.
 * Callbacks run on the stepping thread and must not call bkv_step.
 */
typedef struct bkv_connector {
	/* how many of the n leading full prompt blocks (hashes[0, n), group
	 * 0's chained hashes) the store holds, counted from the first: 0..n;
	 * BKV_CONNECTOR_LATER to be asked again later; any other negative
	 * value counts as 0 (bkv_sched_stats.kv_lookup_errors). n excludes the
	 * block holding the prompt's last token (always computed). Required */
	int (*lookup)(void *user, uint64_t req, const uint64_t *hashes, uint32_t n);
	/* start loading blocks[0, n) of request req into the device blocks
	 * named; 0 when started, negative when it could not start (every
	 * block is then recomputed). Required */
	int (*load)(void *user, uint64_t xfer, uint64_t req, const bkv_kv_xfer_block *blocks,
		    uint32_t n);
	/* start saving blocks[0, n) (computed, full, in the prefix cache) to
	 * the store; 0 when started, negative when not (they are released).
	 * NULL: the connector only loads */
	int (*save)(void *user, uint64_t xfer, const bkv_kv_xfer_block *blocks, uint32_t n);
	/* optional: request req was preempted (its KV on the device is being
	 * dropped or swapped; it will be recomputed or swapped in) */
	void (*preempted)(void *user, uint64_t req);
	void *user;           /* handed to every callback */
	uint32_t save_blocks; /* most blocks in one save call; 0 = 256 */
	uint32_t max_saves;   /* most save transfers outstanding; 0 = 64. When
				 reached, blocks wait (still held) for the
				 next */
	/* optional, for KV groups: does the store hold the block (or state)
	 * saved under hash? A load then ends where every group's blocks are
	 * held (a window's and a state exist only where a step ended). NULL:
	 * a group's missing block fails the load (recomputed) */
	int (*contains)(void *user, uint64_t hash);
} bkv_connector;

typedef struct bkv_sched_config {
	uint32_t size;             /* sizeof(bkv_sched_config); set by init */
	bkv_policy policy;         /* default BKV_POLICY_CONTINUOUS */
	uint32_t max_running;      /* most running rows (slots; a request with
				      n samples takes n). 1..2^20. Default 32. */
	uint32_t admit_group;      /* k: admit when >= k slots are free or
				      everything waiting fits. 0..max_running.
				      0 = auto (the default): the cost model
				      picks k, caps the running rows and packs
				      a split host's prefill calls; max_wait_us
				      is then unused (docs/api-notes.md). */
	uint64_t max_wait_us;      /* admit a partial group anyway once it has
				      been forming this long (from the later of
				      the queue head's arrival and the last
				      admission). 0 = auto (the default):
				      100000 (100 ms); UINT64_MAX = never. */
	int chunked_prefill;       /* nonzero: split prompts into chunks under
				      token_budget. Default 0. */
	uint32_t token_budget;     /* tokens per step when chunking: decode rows
				      (always run, one token each) first, then
				      prefill chunks in what is left. 0..2^24.
				      0 = auto (the default): chosen each step
				      by the cost model for the least predicted
				      time to first token, keeping
				      tpot_target_us when set
				      (docs/api-notes.md). */
	uint32_t max_queue;        /* most requests submitted and not running
				      (inbox + waiting + swapped); bkv_submit
				      answers BKV_EAGAIN at it. 1..2^24; costs
				      8 bytes each at create. Default 65536. */
	bkv_preempt_mode preempt;  /* how a victim gives up its blocks.
				      Default AUTO: swap when the host tier has
				      room and (with kv_bytes_per_token set)
				      moving the KV out and back is cheaper
				      than recomputing it, else recompute. SWAP
				      needs a host tier (else BKV_EINVAL) and
				      recomputes when the tier is full. */
	double host_link_bytes_per_us; /* device<->host bandwidth, bytes per
					  us, for preempt AUTO; >= 0.
					  0 = auto: 25000 (PCIe 4.0 x16) */
	uint64_t kv_bytes_per_token;   /* for swap costing
					  (bkv_kv_bytes_per_token);
					  0 = unknown (the default) */
	uint32_t tpot_target_us;   /* target time between tokens, us; 0 = none
				      (the default). Continuous policy: the
				      cost model holds admissions, the auto
				      token budget and the auto batch cap to
				      it where it can (docs/api-notes.md). */
	bkv_cost_model cost;       /* the cost model; copied, its ctx must
				      outlive the scheduler. Both callbacks
				      NULL (the default): a calibrated model
				      over the default polynomial
				      (bkv_cost_poly_init), owned by the
				      scheduler. */
	uint64_t max_bypass_us;    /* us: once the oldest waiting request of a
				      priority class has waited this long,
				      hinted requests (predicted_output) no
				      longer pass it. 1..2^42, UINT64_MAX = no
				      bound; 0 = auto (the default): about
				      twice its FCFS wait (docs/api-notes.md) */
	bkv_batch_layout batch_layout; /* BKV_BATCH_FLAT (the default) or
					  BKV_BATCH_PERSISTENT */
	uint32_t ttft_target_us;   /* target time to first token, us; 0 = none
				      (the default). Continuous policy, auto
				      admission: a request that has waited
				      half of it is no longer held back for
				      company, by the batch cap's knee, or (on
				      a split host) by tpot_target_us
				      (docs/api-notes.md). */
	uint32_t spec_max_k;       /* speculative decoding: most drafts a
				      decode row verifies, 0..BKV_SPEC_MAX_K;
				      0 = off (the default; every batch as
				      without it). Works with every KV
				      group; with a STATE (recurrent) group
				      the host writes the state after each
				      token of a row with drafts
				      (bkv_batch_group.state_out_spec;
				      docs/design.md, "Speculative
				      decoding") */
	bkv_spec_k_mode spec_k_mode; /* BKV_SPEC_K_AUTO (the default) or
				      BKV_SPEC_K_FIXED */
	bkv_spec_drafts spec_drafts; /* BKV_SPEC_DRAFT_NGRAM (the default) or
				      BKV_SPEC_DRAFT_HOST */
	uint32_t overlap;          /* overlapped scheduling's depth: 0 off;
				      N in 1..BKV_OVERLAP_MAX_DEPTH: up to
				      N steps stay in flight while the
				      next is planned (bkv_step_launch,
				      bkv_step_complete; docs/integration.md,
				      "Overlapped scheduling"): 1 for an
				      asynchronous scheduler, the pipeline
				      stages for pipeline parallelism.
				      Needs host ops.launch and not a
				      split host (prefill or decode
				      without forward; else EINVAL);
				      either batch_layout, every group
				      kind (a STATE group keeps N + 1
				      states a sequence: a launch reads
				      the unit the step before writes).
				      With spec_max_k > 0 a row with
				      drafts delays its lane's next row to
				      the launch after its completion
				      (bkv_sched_stats.overlap_spec_*).
				      Default 0. */
	bkv_evict_policy evict;    /* the pool's eviction policy while this
				      scheduler runs it; default
				      BKV_EVICT_SEGMENTED (28 bytes a device
				      block and 8 a ghost slot, no prices).
				      BKV_EVICT_VALUE prices blocks with
				      cost (taken at create) and allocates
				      28 bytes a device block;
				      BKV_EVICT_LRU allocates nothing */
	bkv_victim_policy victim;  /* preemption's victim; default
				      BKV_VICTIM_RECENT */
	bkv_admit_reserve admit_reserve; /* what admission keeps room
					    for; default
					    BKV_RESERVE_PROMPT */
	uint32_t retention;        /* nonzero: requests' retention ranges
				      (bkv_request.retention) order the
				      prefix cache's evictions: with
				      BKV_EVICT_LRU by priority band (then
				      LRU; allocates 32 bytes a device block),
				      with BKV_EVICT_VALUE as a factor of a
				      block's value (8 bytes a block). 0 (the
				      default): a request giving ranges gets
				      BKV_EINVAL (docs/design.md, "Retention
				      from the request"). Took the last
				      reserved slot; later fields are appended
				      under the size convention. */
	uint32_t copy_overlap;     /* 1: the host performs the swap copies
				      alongside its kernels (a copy engine,
				      layer by layer), so a call takes the
				      longer of its compute and its link
				      time; 0 (the default): before them, so
				      the two add. Prices the steps and the
				      host cache's copies (docs/design.md,
				      "The host cache"); nothing else. */
	uint32_t prefill_first;    /* 1: prefill-first steps on a split host
				      (ops.prefill and ops.decode), as vLLM
				      v0's scheduler runs its iterations: a
				      step admits waiting requests before it
				      plans decode rows, and one that admits
				      a prompt to prefill makes only that
				      prefill call (running rows, the fresh
				      ones too, decode in a later step); a
				      step that admits none plans decode
				      rows, then swaps in a swapped queue
				      head (its row decodes). Meant for whole prompts
				      (vLLM v0 does not chunk): with
				      chunked_prefill a continuing prompt's
				      next chunk waits for a step without
				      admissions. 0 (the default): a step
				      plans decode rows, then admissions,
				      and makes its prefill call and then a
				      decode call over every running row,
				      the fresh ones included. A mixed host
				      ignores it. Appended under the size
				      convention. */
	uint32_t max_adapters;     /* 0 (the default): no adapters (a request
				      with bkv_request.adapter != 0 gets
				      BKV_EINVAL). 1..BKV_MAX_ADAPTERS: at
				      most this many distinct nonzero
				      adapters among the running requests,
				      so in any call, chunks of prompts in
				      progress, swap-ins and every overlap
				      or speculative row included. A request
				      whose adapter finds no room is passed
				      by those behind it for at most
				      adapter_wait_us; then admission waits
				      for it (docs/integration.md,
				      "Adapters") */
	uint32_t pad0;             /* zero */
	uint64_t adapter_wait_us;  /* the bound on that passing: a request
				      waits at most this long plus the time
				      one held adapter's running requests
				      take to end. 0 = auto (the bypass
				      bound's estimate, max_bypass_us; 1 s
				      before any request ended) */
	uint32_t encoder_cache;    /* encoder inputs: the host's encoder cache
				      in tokens (the sum of token_len of the
				      inputs it holds); 0 (the default): no
				      encoder inputs (a request giving some
				      gets BKV_EINVAL). A chunk that reads an
				      input runs only once its outputs are
				      cached or computed in the same call
				      (bkv_batch.encode); inputs no running
				      request needs stay cached for hits
				      until room is needed (LRU,
				      bkv_batch.encoder_free) */
	uint32_t encoder_budget;   /* encoder work per step, in the unit of
				      bkv_encoder_input.cost; 0 = no bound */
	uint32_t pad1;             /* zero */
	const bkv_connector *connector; /* a KV connector, copied at create;
				      NULL (the default): none. Needs the
				      prefix cache (the pool's index) */
} bkv_sched_config;

#define BKV_MAX_ADAPTERS 1024u /* most bkv_sched_config.max_adapters */

/* Retention priorities of bkv_retention_range (TensorRT-LLM's scale). */
#define BKV_RETENTION_PRIORITY_MAX 100u    /* highest priority */
#define BKV_RETENTION_PRIORITY_DEFAULT 35u /* a block no range covers, or
					      whose range's duration ran
					      out */
#define BKV_RETENTION_MAX_RANGES 16u       /* most ranges per request */

/* A token range of a request's prompt and how long the prefix cache should
 * keep its full blocks (bkv_request.retention). A full block takes the
 * highest priority among the ranges overlapping its tokens when its
 * sequence releases it. */
typedef struct bkv_retention_range {
	uint32_t token_start; /* first prompt token of the range */
	uint32_t token_end;   /* one past its last; token_start < token_end
				 <= prompt_len */
	uint32_t priority;    /* 0..BKV_RETENTION_PRIORITY_MAX; higher is
				 evicted later */
	uint32_t pad;         /* zero */
	uint64_t duration_us; /* after this long from the release (on the
				 scheduler's clock) the block counts as
				 BKV_RETENTION_PRIORITY_DEFAULT; 0 = no
				 expiry */
} bkv_retention_range;

/* One encoder input of a request (an image, an audio clip): its encoder's
 * outputs are the embeddings of prompt positions [token_start, token_start
 * + token_len). The library puts bkv_encoder_token(cache_id, i) at position
 * token_start + i of the token history (whatever the prompt held there), so
 * the prefix cache keys that KV by the input's content. */
typedef struct bkv_encoder_input {
	uint64_t cache_id;    /* the content's identity (a hash of the image),
				 nonzero: equal ids share encoder outputs and
				 KV (so they must have equal token_len) */
	uint32_t token_start; /* first prompt position it fills */
	uint32_t token_len;   /* positions it fills, >= 1; inside the prompt,
				 after the previous input's */
	uint32_t cost;        /* its encoder work in bkv_sched_config.
				 encoder_budget's unit; 0 = token_len */
	uint32_t pad;         /* zero */
} bkv_encoder_input;

#define BKV_MAX_ENCODER_INPUTS 64u /* most bkv_request.n_inputs */

/**
 * The token id the library puts at position i of an encoder input's span:
 * at most -2^23 (below BKV_TOKEN_FAIL and every BKV_TOKEN_PENDING), a
 * function of (cache_id, i) alone.
 * @return the id. Thread rules: any thread.
 */
BKV_API int32_t bkv_encoder_token(uint64_t cache_id, uint32_t i);

/* One request. Arrays are copied by bkv_submit. */
typedef struct bkv_request {
	uint32_t size;              /* sizeof(bkv_request); set by init */
	const int32_t *prompt;      /* [prompt_len] token ids */
	uint32_t prompt_len;        /* >= 1 */
	uint32_t max_new_tokens;    /* >= 1 */
	const int32_t *stop_tokens; /* [n_stop] ids that end generation; may be
				       NULL when n_stop is 0 */
	uint32_t n_stop;            /* entries in stop_tokens */
	int32_t priority;           /* higher runs first; FCFS within a class.
				       Default 0. */
	uint64_t cache_key;         /* prefix-cache key (LoRA id, tenant salt);
				       0 = none */
	uint32_t n;                 /* samples (forked branches), >= 1.
				       Default 1. */
	uint32_t predicted_output;  /* hint: expected output tokens; 0 =
				       unknown (the default). Hinted requests
				       are admitted longest first within their
				       priority class, ahead of unhinted ones,
				       within bkv_sched_config.max_bypass_us */
	void *user;                 /* handed back in callbacks and batches;
				       never read */
	const bkv_retention_range *retention; /* [n_retention] retention
				       ranges of the prompt, copied; needs
				       bkv_sched_config.retention. Ranges
				       may not overlap (else BKV_EINVAL).
				       Appended: a caller whose size ends
				       before it gives none */
	uint32_t n_retention;       /* entries in retention,
				       0..BKV_RETENTION_MAX_RANGES */
	uint32_t adapter;           /* the adapter (LoRA) its rows run with;
				       0 = none (the base model). Nonzero
				       needs bkv_sched_config.max_adapters;
				       its blocks are cached under
				       bkv_adapter_cache_key(cache_key,
				       adapter), so requests of different
				       adapters never share KV */
	uint32_t n_inputs;          /* entries in inputs,
				       0..BKV_MAX_ENCODER_INPUTS; nonzero needs
				       bkv_sched_config.encoder_cache */
	const bkv_encoder_input *inputs; /* [n_inputs] its encoder inputs,
				       copied; spans ordered, not overlapping */
} bkv_request;

/**
 * The prefix-cache key a request's blocks are cached under: cache_key when
 * adapter is 0, else a 64-bit mix of both that is never 0 (so an adapter's
 * KV never hits another adapter's, nor the base model's). Pass it to
 * bkv_seq_open_keyed or bkv_pool_pin_prefix to reach a request's blocks.
 * @return the key. Thread rules: any thread.
 */
BKV_API uint64_t bkv_adapter_cache_key(uint64_t cache_key, uint32_t adapter);

/* What one bkv_step did. */
typedef struct bkv_step_info {
	uint32_t rows;            /* rows sent to the host, all calls */
	uint32_t prefill_tokens;  /* prompt tokens computed */
	uint32_t decode_tokens;   /* decode tokens computed */
	uint32_t hit_tokens;      /* prompt tokens served by the prefix cache */
	uint32_t prefill_calls;   /* host calls carrying prefill (split or
				     mixed) */
	uint32_t decode_calls;    /* host decode calls (split hosts) */
	uint32_t admitted;        /* requests that started (or resumed) */
	uint32_t finished;        /* requests that ended (any reason) */
	uint32_t preempted;       /* requests preempted this step */
	uint32_t running;         /* running requests after the step */
	uint32_t waiting;         /* queued requests after the step (waiting
				     and swapped) */
	double predicted_us;      /* the cost model's price of the step's host
				     calls, us */
	double measured_us;       /* what they took on the scheduler's clock
				     (now_us, else monotonic), us */
} bkv_step_info;

/* Cumulative counters of a scheduler. */
typedef struct bkv_sched_stats {
	uint32_t size;             /* sizeof(bkv_sched_stats) the caller expects */
	uint32_t waiting;          /* requests queued, not started */
	uint32_t running;          /* requests holding slots */
	uint32_t swapped;          /* requests preempted to the host tier */
	uint64_t steps;            /* successful bkv_step calls */
	uint64_t failed_steps;     /* steps rolled back on a host failure */
	uint64_t submitted;        /* requests accepted */
	uint64_t finished;         /* requests ended, any reason */
	uint64_t aborted;          /* of which by bkv_abort */
	uint64_t prefill_tokens;   /* prompt tokens computed */
	uint64_t decode_tokens;    /* generated tokens delivered by decode
				      rows (a request's first token, sampled
				      by its prefill, is not one): accepted
				      speculative drafts included, tokens an
				      overlapped step computed and discarded
				      (overlap_wasted_tokens) or BKV_TOKEN_FAIL
				      not */
	uint64_t hit_tokens;       /* prompt tokens from the prefix cache */
	uint64_t preemptions;      /* preemptions, both modes */
	uint64_t swaps;            /* of which by swap */
	uint64_t prefill_calls;    /* host calls carrying prefill */
	uint64_t decode_calls;     /* host decode calls (split hosts) */
	double busy_us;            /* measured time in host calls, us */
	uint64_t unadmittable;     /* of finished: ended with BKV_FINISH_ERROR
				      because they could never be admitted,
				      even into an otherwise empty pool */
	uint64_t spec_rows;        /* decode rows that carried drafts */
	uint64_t spec_drafted;     /* draft tokens those rows verified */
	uint64_t spec_accepted;    /* of which accepted (the acceptance rate
				      is spec_accepted / spec_drafted) */
	uint64_t overlap_steps;    /* two-phase steps planned while another
				      was in flight (bkv_step_launch) */
	uint64_t overlap_syncs;    /* bkv_step_launch calls answered
				      BKV_EAGAIN (the in-flight step had to
				      complete first) */
	uint64_t overlap_wasted_tokens; /* tokens computed by two-phase steps
				      for requests that had ended before the
				      step completed (stop, error, abort in
				      the step before): discarded, never
				      delivered */
	uint64_t spec_skipped_rows; /* decode rows the choice gave drafts that
				      carried none: no room for their blocks
				      without preempting, or no budget left
				      (speculation is what pressure gives up
				      first) */
	uint64_t overlap_spec_waits; /* overlap with speculative decoding:
				      rows not planned by a launch because
				      the lane's row in a step in flight
				      carries drafts (how many tokens it
				      delivers is unknown until it
				      completes), or held back so that its
				      next row, on known tokens, drafts */
	uint64_t overlap_spec_undrafted; /* rows a launch planned on a step
				      in flight without drafts: their last
				      token is that step's placeholder, which
				      no draft may follow */
	uint64_t overlap_spec_idle; /* launches with steps in flight that
				      planned nothing while lanes waited as
				      in overlap_spec_waits (the host
				      completes the oldest, then launches) */
	uint64_t adapter_passes;   /* times admission set a request aside
				      because its adapter had no room
				      (bkv_sched_config.max_adapters) */
	uint64_t encoder_lookups;  /* encoder inputs a chunk met that its
				      request did not hold yet */
	uint64_t encoder_hits;     /* of which cached, or being encoded for
				      another request */
	uint64_t encoder_runs;     /* inputs sent to the host to encode
				      (bkv_batch.encode), again after a
				      failed call */
	uint64_t encoder_evictions; /* inputs evicted from the encoder cache
				      (bkv_batch.encoder_free) */
	/* KV connector (bkv_sched_config.connector) */
	uint32_t kv_waiting;       /* requests waiting for external KV: their
				      lookup answered BKV_CONNECTOR_LATER, or
				      their load is in flight */
	uint32_t kv_save_held;     /* device blocks held for saves in flight
				      or waiting to be handed to save */
	uint64_t kv_lookups;       /* lookup calls */
	uint64_t kv_lookup_errors; /* of which answered an error (taken as 0) */
	uint64_t kv_loads;         /* load transfers started */
	uint64_t kv_load_tokens;   /* prompt tokens loaded (not computed) */
	uint64_t kv_load_failed;   /* blocks whose load failed (recomputed,
				      with the blocks after them) */
	uint64_t kv_saved;         /* blocks saved */
	uint64_t kv_save_failed;   /* blocks whose save failed */
} bkv_sched_stats;

/**
 * Fill a scheduler config with defaults (see each field).
 * @param cfg    the config to fill; NULL is ignored.
 * Thread rules: any thread.
 */
BKV_API void bkv_sched_config_init(bkv_sched_config *cfg);

/**
 * Fill a request with defaults (n = 1, everything else 0).
 * @param req    the request to fill; NULL is ignored.
 * Thread rules: any thread.
 */
BKV_API void bkv_request_init(bkv_request *req);

/**
 * Create a scheduler over a pool (not owned; it must outlive the scheduler and
 * be used by no one else while the scheduler runs).
 * @param cfg    validated and copied.
 * @param pool   the KV pool.
 * @param ops    the host's callbacks; copied.
 * @param host   handed to every callback; never read.
 * @param alloc  allocator; NULL = libc. Copied. Must be thread-safe if
 *               bkv_submit is called from several threads.
 * @param out    receives the scheduler.
 * @return BKV_OK; BKV_EINVAL (NULL argument, a config field out of range, no
 *         forward and not both prefill and decode, overlap without launch
 *         or with a split host); BKV_ENOMEM.
 * Thread rules: any thread; the scheduler then belongs to one stepping thread
 * (bkv_submit and bkv_abort excepted).
 */
BKV_API int bkv_sched_create(const bkv_sched_config *cfg, bkv_pool *pool,
			     const bkv_host_ops *ops, void *host, const bkv_allocator *alloc,
			     bkv_sched **out);

/**
 * Destroy a scheduler. Requests still open end with no callback. NULL is
 * ignored. The pool stays; those requests' sequences are dropped from it
 * (bkv_seq_drop). Overlapped steps launched and not completed count as
 * failed: nothing they computed enters the prefix cache, and the pool is
 * left between steps, ready for another scheduler. KV connector transfers
 * still in flight are forgotten (their blocks go back to the pool): stop
 * the connector first, since bkv_kv_xfer_done on a destroyed scheduler is
 * undefined.
 * @param sched  the scheduler.
 * Thread rules: the stepping thread, with no bkv_step, bkv_submit, bkv_abort
 * or bkv_kv_xfer_done in flight.
 */
BKV_API void bkv_sched_destroy(bkv_sched *sched);

/**
 * Submit a request. It enters the waiting queue at the next bkv_step.
 * @param sched   the scheduler.
 * @param req     the request; it and its arrays are copied.
 * @param req_id  receives its id (never 0); may be NULL.
 * @return BKV_OK; BKV_EINVAL (NULL, empty prompt, max_new_tokens 0, n 0, bad
 *         retention ranges or ranges without bkv_sched_config.retention, ...);
 *         BKV_E2BIG (n x (prompt + max_new_tokens) can never fit the pool,
 *         prompt + max_new_tokens > INT32_MAX, n > max_running, n > the
 *         pool's max_seqs, or max_running such histories would need more
 *         than 2^29 block-table entries in one step);
 *         BKV_EAGAIN (queue full); BKV_ENOMEM.
 * Thread rules: any thread, concurrently with bkv_step.
 */
BKV_API int bkv_submit(bkv_sched *sched, const bkv_request *req, uint64_t *req_id);

/**
 * Abort a request: it ends with BKV_FINISH_ABORT at the next bkv_step.
 * A request ending in the bkv_step that runs concurrently with the abort (or
 * whose on_finish calls it) may still answer BKV_OK; it then keeps the reason
 * it ended with and on_finish does not run again.
 * @param sched  the scheduler.
 * @param req_id the id bkv_submit returned.
 * @return BKV_OK; BKV_EINVAL (NULL, id 0); BKV_ENOENT (unknown, already ended
 *         or already aborted).
 * Thread rules: any thread, concurrently with bkv_step, and from callbacks.
 */
BKV_API int bkv_abort(bkv_sched *sched, uint64_t req_id);

/**
 * Run one iteration: take in submissions and aborts, plan, make room, build
 * the batch, call the host, commit.
 *
 * Calls: a mixed host gets one forward (decode rows, then prefill chunks). A
 * split host gets a prefill call when there are chunks, then a decode call
 * over every decoding row plus the rows whose prompt finished in that prefill
 * call (it samples their first token). With admit_group 0 (auto) the chunks
 * may come as several prefill calls, rows grouped by length, when the cost
 * model prices that below one call. Copy lists come with the step's first
 * call.
 *
 * Speculative decoding (spec_max_k > 0): after every other row is planned,
 * decode rows may carry drafts (bkv_batch.row_drafts; from the host's draft
 * callback or the library's n-gram lookup), never at the cost of a
 * preemption; at commit each such row delivers its accepted drafts and the
 * bonus token and its sequence is cut back to them before any block it
 * filled is indexed (docs/integration.md, "Speculative decoding").
 *
 * On BKV_EHOST: no token reached any request, every sequence is back at its
 * length before the step, pending device and swap-in copies are sent again by
 * the next step, and victims swapped out in the failed step become recompute
 * preemptions. Preemptions and admissions of the failed step stand.
 * @param sched  the scheduler.
 * @param info   receives what the step did; may be NULL.
 * @return BKV_OK (including a step with nothing to do); BKV_EHOST (a compute
 *         callback failed; the step was rolled back, retry); BKV_ESTATE (called
 *         from a callback); BKV_EINVAL.
 * Thread rules: the stepping thread; bkv_submit and bkv_abort may run concurrently.
 */
BKV_API int bkv_step(bkv_sched *sched, bkv_step_info *info);

/**
 * Overlapped scheduling, first phase: take in submissions and aborts, plan
 * the next step and hand it to the host's launch callback, without waiting
 * for the tokens of the step still in flight (bkv_sched_config.overlap).
 *
 * With depth N (bkv_sched_config.overlap) at most N + 1 steps are
 * outstanding (launched, not completed): up to N in flight and the one this
 * call plans. A row whose input is a token a step in flight samples
 * carries BKV_TOKEN_PENDING_AT(back, i): row i of the step launched `back`
 * launches before; its position and slot are exact. A request whose rows
 * in flight reach max_new_tokens gets no row. Rows of requests that end
 * when an earlier step completes (stop, error, abort)
 * are computed and discarded (bkv_sched_stats.overlap_wasted_tokens).
 * Speculative decoding (spec_max_k > 0): a row planned on a placeholder
 * carries no drafts (no draft follows an unknown token), and a lane whose
 * row in flight carries drafts gets no row (how many tokens that row
 * delivers is known only at its completion); a lane whose drafts are worth
 * it may be held back a step so that its next row drafts. All three are
 * counted (bkv_sched_stats.overlap_spec_*); a launch left with nothing to
 * compute returns ticket 0, the host completes the oldest step and
 * launches again. The speculation arrays (row_drafts, spec_tokens,
 * n_accepted) alternate with the other buffers: write spec_tokens and
 * n_accepted before completing the step.
 * Blocks released while a step is outstanding are reused only after every
 * step outstanding then has completed, and so are row slots in the
 * persistent layout (a slot closed by this launch's deltas is opened for
 * another row only after the steps that read it completed). The persistent
 * layout's table deltas of a launch are relative to the previous launch's:
 * the host applies them in launch order.
 *
 * With a step in flight the library declines (BKV_EAGAIN, nothing done)
 * when the plan would need the results or ordering of steps in flight:
 * pending copies (copy-on-write, swap), a preemption or a swap-in an
 * overlapped plan could not make, new batch buffers.
 * Drain rules: the host completes the oldest step before launching when N
 * steps are in flight (else BKV_ESTATE), and after a launch that returned
 * ticket 0 while steps are in flight; it completes every outstanding step
 * after BKV_EAGAIN or BKV_EHOST, then launches again. With nothing in
 * flight a launch plans exactly as bkv_step would, so the results do not
 * depend on the depth: only which rows wait for a placeholder.
 * @param sched   the scheduler.
 * @param ticket  receives the launched step's ticket (its step number,
 *                nonzero), or 0 when the step had nothing to compute (nothing
 *                to complete).
 * @param info    receives what the plan did (rows, tokens, admissions);
 *                may be NULL.
 * @return BKV_OK; BKV_EAGAIN (complete the outstanding steps first);
 *         BKV_EHOST (the launch callback failed: with nothing else in
 *         flight the step is rolled back now, else with the steps in
 *         flight when the last of them completes); BKV_ESTATE (overlap
 *         off, N + 1 steps outstanding, a failed step not yet completed, or
 *         called from a callback); BKV_EINVAL (NULL sched or ticket).
 * Thread rules: the stepping thread; bkv_submit and bkv_abort may run
 * concurrently.
 */
BKV_API int bkv_step_launch(bkv_sched *sched, uint64_t *ticket, bkv_step_info *info);

/**
 * Overlapped scheduling, second phase: the host has the sampled tokens of the
 * oldest outstanding step in its next_tokens (or it failed). Commits it:
 * tokens reach on_token, requests end (on_finish once each), its blocks
 * enter the prefix cache; placeholders of the steps launched after it get
 * their tokens.
 *
 * Failure: status < 0 (or a failed launch) fails every outstanding step.
 * Each failed step must still be completed (in order; its tokens are not
 * read); the last completion rolls every one of them back: no token reached
 * any request, every sequence is back at its length before the oldest, and
 * the requests run again. Steps complete in launch order. In the persistent
 * layout the rollback voids the failed steps' table deltas: the host may
 * have applied them (at launch) or discard them (as if never launched, back
 * to its tables after the last completed step); either way the next launch's
 * deltas rewrite every entry and length they wrote, so after applying them
 * its tables equal the library's for every row of that launch.
 * @param sched   the scheduler.
 * @param ticket  the oldest outstanding ticket.
 * @param status  0: the step ran and next_tokens holds its tokens; negative:
 *                it failed. A positive status is not defined: BKV_EINVAL,
 *                and nothing changes (the step stays outstanding; complete
 *                it again with 0 or a negative status).
 * @param info    receives what the step did; may be NULL.
 * @return BKV_OK; BKV_EHOST (this or an earlier outstanding step failed;
 *         rolled back once the last of them is completed); BKV_EINVAL (NULL
 *         sched, ticket is not the oldest outstanding, or status > 0;
 *         nothing changed); BKV_ESTATE (overlap off, or called from a
 *         callback).
 * Thread rules: the stepping thread; bkv_submit and bkv_abort may run
 * concurrently.
 */
BKV_API int bkv_step_complete(bkv_sched *sched, uint64_t ticket, int status,
			      bkv_step_info *info);

/**
 * Requests not yet ended (inbox + waiting + running + swapped).
 * @param sched  the scheduler.
 * @return the count; 0 for a NULL scheduler.
 * Thread rules: any thread (a snapshot).
 */
BKV_API uint64_t bkv_sched_pending(bkv_sched *sched);

/**
 * What a step delivered, as arrays (bkv_sched_outputs_get): the tokens, in
 * the order on_token would see them, and the ended requests, in the order
 * of on_finish. The arrays belong to the scheduler: valid until the next
 * bkv_step, bkv_step_launch or bkv_step_complete call.
 */
typedef struct bkv_step_outputs {
	uint32_t size;                   /* sizeof(bkv_step_outputs); set by
					    the caller (0: the whole struct) */
	uint32_t n_tokens;               /* tokens delivered */
	const uint64_t *token_req;       /* [n_tokens] each token's request id */
	const uint32_t *token_branch;    /* [n_tokens] its branch (0 .. n - 1) */
	const int32_t *token_ids;        /* [n_tokens] the tokens */
	uint32_t n_finished;             /* requests ended */
	const uint64_t *finished_req;    /* [n_finished] each one's id */
	const int32_t *finished_reason;  /* [n_finished] its bkv_finish_reason */
} bkv_step_outputs;

/**
 * Record each step's outputs as arrays, for a host that reads them once per
 * step instead of taking on_token per token (a Python or Rust engine). Off
 * by default; the callbacks run either way. On, the arrays are sized for
 * every row a step may deliver and every request that may be alive
 * (max_running + max_queue), allocated here: recording never allocates.
 * @param sched  the scheduler.
 * @param on     1 to record (allocates once), 0 to stop (frees).
 * @return BKV_OK; BKV_EINVAL (NULL, on not 0 or 1); BKV_ESTATE inside a
 *         step; BKV_ENOMEM (nothing changed).
 * Thread rules: the stepping thread, between steps.
 */
BKV_API int bkv_sched_outputs_enable(bkv_sched *sched, int on);

/**
 * The outputs delivered since the previous bkv_step or bkv_step_complete
 * returned: the tokens and ends of the last bkv_step (or of the last
 * bkv_step_complete, with those of the launches between: requests a launch
 * ends, such as aborts, are read with the completion that follows).
 * @param sched  the scheduler (outputs enabled).
 * @param out    filled up to min(out->size, sizeof(bkv_step_outputs)).
 * @return BKV_OK; BKV_EINVAL (NULL); BKV_ESTATE (outputs not enabled).
 * Thread rules: the stepping thread, between steps.
 */
BKV_API int bkv_sched_outputs_get(const bkv_sched *sched, bkv_step_outputs *out);

/* What bkv_sched_kv_release does with the running requests. */
typedef enum bkv_kv_release_mode {
	BKV_RELEASE_REFUSE = 0,    /* BKV_ESTATE while any request runs */
	BKV_RELEASE_RECOMPUTE = 1, /* they give up their KV and recompute their
				      prompts and outputs after the resume */
	BKV_RELEASE_SWAP = 2       /* they are swapped out to the host tier
				      (recomputed where it has no room): the
				      pool's pending swap-out copies
				      (bkv_pool_pending_copies) must be made,
				      then cleared, before the device KV is
				      freed */
} bkv_kv_release_mode;

/**
 * Give the device KV memory back, for a while (weight updates, sleep, another
 * model): the running requests leave the device (mode), the prefix cache is
 * dropped (the host cache too), and until bkv_sched_kv_resume a step only
 * drains the inbox and ends aborted requests (requests may be submitted; they
 * wait). The host may then free its KV tensors; it allocates them again
 * before resuming (their contents are not read: nothing the library keeps
 * lives there).
 * @param sched  the scheduler: no step outstanding, no prefix pin held.
 * @param mode   what happens to the running requests (bkv_kv_release_mode).
 * @return BKV_OK; BKV_EINVAL (NULL, a bad mode); BKV_ESTATE (a step running
 *         or outstanding, pins held, released already, or requests running
 *         with BKV_RELEASE_REFUSE); bkv_last_error says which.
 * Thread rules: the stepping thread, between steps.
 */
BKV_API int bkv_sched_kv_release(bkv_sched *sched, bkv_kv_release_mode mode);

/**
 * Take the device KV memory again after bkv_sched_kv_release: steps plan
 * again (swapped requests come back through swap-in copies, the others
 * recompute).
 * @return BKV_OK; BKV_EINVAL (NULL); BKV_ESTATE (not released, or in a step).
 * Thread rules: the stepping thread, between steps.
 */
BKV_API int bkv_sched_kv_resume(bkv_sched *sched);

/**
 * Wait for work: block the calling thread until a request is pending
 * (bkv_sched_pending > 0), another thread calls bkv_sched_wake, or
 * timeout_us microseconds pass on the monotonic clock. With a KV connector,
 * a request whose only business is a load in flight does not count until
 * bkv_kv_xfer_done completes a transfer (nor do overlapped steps
 * outstanding let it sleep). An engine thread's loop: while (running) { if
 * (bkv_sched_wait(s, UINT64_MAX) == BKV_OK) bkv_step(s, NULL); } with
 * bkv_sched_wake to stop it. Returns at once when there is work already.
 * @param sched       the scheduler.
 * @param timeout_us  the longest wait; 0: a poll; UINT64_MAX: no limit.
 * @return BKV_OK when a request is pending; BKV_EAGAIN when the wait ended
 *         without one (timeout, or bkv_sched_wake); BKV_EINVAL (NULL);
 *         BKV_ESTATE from inside a step (a callback).
 * Thread rules: the stepping thread, between steps (as bkv_step).
 */
BKV_API int bkv_sched_wait(bkv_sched *sched, uint64_t timeout_us);

/**
 * End the wait of bkv_sched_wait now, or the next one if none is waiting
 * (it answers BKV_EAGAIN unless a request is pending): how another thread
 * stops an engine loop without a race.
 * @param sched  the scheduler.
 * @return BKV_OK; BKV_EINVAL (NULL).
 * Thread rules: any thread.
 */
BKV_API int bkv_sched_wake(bkv_sched *sched);

/**
 * Read the scheduler's cumulative counters into the caller's struct (size
 * convention as bkv_pool_stats_get).
 * @param sched  the scheduler.
 * @param stats  filled up to min(stats->size, sizeof(bkv_sched_stats)); set
 *               stats->size first (0: the whole struct). NULL is ignored.
 * Thread rules: the stepping thread (between steps).
 */
BKV_API void bkv_sched_stats_get(const bkv_sched *sched, bkv_sched_stats *stats);

/**
 * Verify the scheduler's invariants together with its pool's: the queue and
 * the running and swapped requests against their counts, every request in
 * exactly one state, slots <= max_running, each running request's sequences,
 * and no host call having written into a shared or cached block (that one is
 * checked at each call in builds with BKV_DEBUG_LEVEL >= 1).
 * O(requests + blocks): for tests, fuzzers and debugging, not the hot path.
 * @param sched  the scheduler.
 * @return 0 when consistent; a positive invariant number otherwise (1..37:
 *         the scheduler's; 1000 + n: the pool's invariant n; both listed in
 *         docs/api-notes.md); BKV_EINVAL for NULL.
 * Thread rules: the stepping thread (between steps).
 */
BKV_API int bkv_sched_check(const bkv_sched *sched);

/* ------------------------------------------------------------------------ */
/* Integration (KV events, export and import, metrics)                       */
/* ------------------------------------------------------------------------ */

/* What a KV event reports (docs/scaling.md shows a router replaying them). */
typedef enum bkv_kv_event_kind {
	BKV_EVENT_STORED = 0,  /* a full block entered the prefix-cache index */
	BKV_EVENT_REMOVED = 1, /* a block left the index (evicted or dropped) */
	BKV_EVENT_CLEARED = 2  /* bkv_pool_reset_cache: the index is empty */
} bkv_kv_event_kind;

/* Where the block of a KV event lives (bkv_kv_event.medium). */
typedef enum bkv_kv_medium {
	BKV_MEDIUM_DEVICE = 0, /* the device tier (block is a device block id) */
	BKV_MEDIUM_HOST = 1,   /* the host cache (bkv_pool_config.host_cache;
				  block is a host block id) */
	BKV_MEDIUM_EXTERNAL = 2 /* a KV connector's store: STORED once a save
				  completed (block -1); the store's own
				  evictions are not seen */
} bkv_kv_medium;

/* One KV event. Replaying a pool's events of one medium in order, starting
 * from an empty set, gives exactly the set of hashes that tier caches: the
 * device tier's prefix-cache index (BKV_MEDIUM_DEVICE), or the host cache's
 * blocks, including those whose copy to the host is still pending
 * (BKV_MEDIUM_HOST). A CLEARED event empties both. */
typedef struct bkv_kv_event {
	uint64_t seq;         /* event number, 1, 2, ... per pool; a gap
				 between two drained events is where dropped
				 events were */
	uint64_t hash;        /* STORED, REMOVED: the block's chained hash (as
				 bkv_block_hashes computes it); CLEARED: 0 */
	uint64_t parent_hash; /* STORED: the hash of the block before it; 0
				 when has_parent is 0 */
	uint64_t key;         /* STORED: the sequence's prefix-cache key */
	uint32_t kind;        /* a bkv_kv_event_kind */
	uint32_t token_count; /* STORED: tokens in the block (block_tokens) */
	int32_t block;        /* STORED, REMOVED: device block id (host block
				 id for BKV_MEDIUM_HOST); else -1 */
	uint32_t has_parent;  /* STORED: 1 unless the block is a sequence's
				 first */
	uint32_t medium;      /* STORED, REMOVED: a bkv_kv_medium; CLEARED:
				 0 */
	uint32_t reserved;    /* zero */
} bkv_kv_event;

/**
 * Drain KV events: copy the oldest pending events into out, oldest first, and
 * remove them from the ring. Events are written where blocks enter and leave
 * the prefix-cache index, into a ring of cfg.event_capacity entries taken at
 * create (no allocation later). When the ring is full a new event is dropped
 * and counted (bkv_pool_stats.events_dropped, and the gap in seq): a router
 * that sees a gap must forget what it knows of this pool.
 * @param pool  the pool; NULL gives 0.
 * @param out   receives up to max events; may be NULL only when max is 0.
 * @param max   most events to take.
 * @return the number of events written (0 when none are pending, events are
 *         off, or an argument is NULL).
 * Thread rules: the pool's thread (events come from the calls that change
 * the pool, so drain between them, e.g. after each bkv_step).
 */
BKV_API uint32_t bkv_pool_drain_events(bkv_pool *pool, bkv_kv_event *out, uint32_t max);

/**
 * Chained hashes of the full blocks of a token sequence, exactly the hashes a
 * pool with this seed and block size gives those blocks in its KV events. A
 * router hashes an incoming prompt with it and asks which replica's replayed
 * events hold the longest run of leading hashes.
 * @param hash_seed     the pool's cfg.hash_seed.
 * @param key           the prefix-cache key of the sequence (0: none).
 * @param block_tokens  the pool's cfg.block_tokens (> 0).
 * @param tokens        n token ids; may be NULL only when n < block_tokens.
 * @param n             token count.
 * @param hashes        receives n / block_tokens hashes; may be NULL only
 *                      when that is 0.
 * @return the number of hashes written (n / block_tokens); 0 on bad input.
 * Thread rules: any thread.
 */
BKV_API uint32_t bkv_block_hashes(uint64_t hash_seed, uint64_t key, uint32_t block_tokens,
				  const int32_t *tokens, uint32_t n, uint64_t *hashes);

/* A sequence exported from one pool for import into another (disaggregated
 * prefill/decode). The caller owns every array: it sets the pointers and
 * capacities, bkv_seq_export fills them, and the struct (after travelling as
 * plain data) is what bkv_seq_import reads. */
typedef struct bkv_seq_image {
	uint32_t size;         /* sizeof(bkv_seq_image); set by the caller */
	uint32_t block_tokens; /* the source pool's block_tokens */
	uint32_t len;          /* tokens in the sequence */
	uint32_t n_blocks;     /* blocks in its table, ceil(len/block_tokens) */
	uint64_t key;          /* the sequence's prefix-cache key */
	uint64_t hash_seed;    /* the source pool's hash_seed */
	int32_t *blocks;       /* [cap_blocks] source device block ids */
	uint64_t *hashes;      /* [cap_blocks] chained hash of each full block
				  (the last entry, if that block is partial,
				  is 0) */
	int32_t *tokens;       /* [cap_tokens] the sequence's token ids */
	uint32_t cap_blocks;   /* entries the caller gave blocks and hashes */
	uint32_t cap_tokens;   /* entries the caller gave tokens */
	/* KV groups (bkv_pool_config.groups). A plain pool's image has n_groups
	 * 0 or 1 and leaves the fields below unread. */
	uint32_t n_groups;     /* the source pool's n_groups (0 or 1: one full
				  group) */
	uint32_t state_frames; /* frames per state unit of the source's STATE
				  group (bkv_kv_state_frames), 0 without one */
	int32_t *group_blocks; /* [(n_groups - 1 - has_state) x cap_blocks],
				  caller-owned: attention group g >= 1's
				  source block for logical block i at
				  [(g - 1) x cap_blocks + i], -1 where the
				  group released it (a window, a chunk); NULL
				  when there is no such group */
	int32_t state_frame;   /* the first frame of the source's live state
				  unit (its state_frames frames are
				  consecutive), -1 without a STATE group */
	uint32_t reserved;     /* zero; not read */
	uint64_t group_layout; /* a checksum of the source's groups (each one's
				  kind, layers, span and bytes, in order),
				  0 for a plain pool: import refuses an image
				  whose groups are not its pool's */
} bkv_seq_image;

/**
 * Export a device-resident sequence (typically a finished prefill): its block
 * ids, chained block hashes and tokens, so another pool can import it and
 * the host can copy the KV of those blocks across. In a pool with KV groups
 * the image also carries every further attention group's blocks
 * (group_blocks, -1 where a window or chunk released one) and the first
 * frame of the live state unit of a STATE group. The sequence is not
 * changed; keep it open (its blocks and state pinned) until the host has
 * read their KV. A state appended outside a transaction and not yet
 * settled is exported as the unit the append wrote (bkv_seq_state_frames'
 * out), so the host must have computed it first; inside a transaction, a
 * state behind the sequence's tokens (an append the step has not committed)
 * cannot be exported.
 * @param pool  the source pool.
 * @param seq   an open, device-resident sequence.
 * @param exp   size, blocks, hashes, tokens, group_blocks and capacities set
 *              by the caller; receives block_tokens, len, n_blocks, key,
 *              hash_seed, n_groups, state_frames, state_frame,
 *              group_layout and the arrays' contents. On BKV_E2BIG only len,
 *              n_blocks, n_groups and state_frames are set (the room
 *              needed), so the caller can size the arrays first.
 * @return BKV_OK; BKV_EINVAL (NULL argument, exp->size too small, a NULL
 *         array the sequence needs: group_blocks too with attention groups
 *         after the first); BKV_ENOENT (unknown sequence); BKV_ESTATE
 *         (swapped out, or its state lags its tokens inside a transaction);
 *         BKV_E2BIG (cap_blocks < n_blocks or cap_tokens < len).
 * Thread rules: the pool's thread.
 */
BKV_API int bkv_seq_export(const bkv_pool *pool, uint32_t seq, bkv_seq_image *exp);

/**
 * Import an exported sequence into this pool as a new sequence with the
 * export's key: leading full blocks already in this pool's prefix cache are
 * shared (no transfer), the rest get fresh device blocks, and transfers lists
 * the KV copies the host must make, (source pool's block -> this pool's
 * block): group 0's in table order, then each further attention group's in
 * table order (only blocks the group holds after the import: a window's
 * blocks that no later token reads are released at once), then a STATE
 * group's state_frames frames in order, from the source's unit to the new
 * sequence's live unit (none when a prefix hit gave it a checkpoint
 * covering its whole length). Full imported blocks, and a state at a
 * checkpoint interval, enter this pool's prefix cache (and its KV events) at
 * once, so the host must finish the transfers before its next computation
 * that reads them - the rule of pool copy lists.
 *
 * The image is untrusted input (it may come off a network): every field is
 * checked before any array entry is read, and a refused image changes
 * nothing. The rule: size >= sizeof(bkv_seq_image); block_tokens equals this
 * pool's; 0 < len <= cap_tokens; n_blocks == ceil(len / block_tokens) <=
 * cap_blocks; tokens and blocks are non-NULL; n_blocks <= this pool's
 * device_blocks; every blocks[i] >= 0. Only the first len entries of tokens
 * and the first n_blocks of blocks and hashes are read, so cap_tokens and
 * cap_blocks must not claim more than the arrays hold. When both pools share
 * hash_seed, hashes must be non-NULL, every full block's hash must equal its
 * chained hash of the tokens (a damaged export is refused) and a partial last
 * block's entry must be 0; with another seed, hashes is not read (may be
 * NULL). key is any value. Groups: a plain pool takes images with n_groups
 * 0 or 1; a pool with groups takes only images whose n_groups and
 * group_layout equal its own (the same groups in the same order), with
 * group_blocks non-NULL when there are attention groups after the first,
 * each entry >= -1 and every block the group's next token reads held
 * (>= 0), and, with a STATE group, state_frames equal to this pool's and
 * 0 <= state_frame <= INT32_MAX - state_frames. All-or-nothing.
 * @param pool         the destination pool.
 * @param exp          as bkv_seq_export filled it (see the rule above).
 * @param seq          receives the new sequence id.
 * @param transfers    receives up to exp->n_blocks x (attention groups) +
 *                     exp->state_frames copies (exp->n_blocks in a plain
 *                     pool); caller-owned.
 * @param n_transfers  receives the number of copies written.
 * @return BKV_OK; BKV_EINVAL (NULL argument, or the image breaks the rule
 *         above: size too small, block_tokens differ, len 0, n_blocks !=
 *         ceil(len/block_tokens), len > cap_tokens, n_blocks > cap_blocks,
 *         a NULL array, a source block id < 0, a hash mismatch, or groups
 *         that differ from this pool's or miss a block or state);
 *         BKV_EAGAIN (max_seqs open); BKV_ENOSPC (not enough device blocks
 *         or state units); BKV_E2BIG (more than device_blocks blocks);
 *         BKV_ENOMEM (the block table could not grow).
 * Thread rules: the pool's thread.
 */
BKV_API int bkv_seq_import(bkv_pool *pool, const bkv_seq_image *exp, uint32_t *seq,
			   bkv_copy *transfers, uint32_t *n_transfers);

/**
 * Complete a KV connector transfer (bkv_connector.load or save): every block
 * it named is done except those listed in failed. Takes effect at the next
 * step: loaded blocks join the prefix cache and their request prefills on
 * from the first failed block (from its local hits when a KV group cannot
 * keep a shorter load), saved blocks are released to the cache.
 * @param sched     the scheduler.
 * @param xfer      the id the load or save call was given.
 * @param status    BKV_OK, or negative: the whole transfer failed.
 * @param failed    n_failed indices into the call's blocks array, any
 *                  order (read during the call); may be NULL when n_failed
 *                  is 0.
 * @param n_failed  entries in failed.
 * @return BKV_OK; BKV_EINVAL (NULL sched, failed NULL with n_failed > 0, an
 *         index past the transfer's blocks); BKV_ENOENT (no transfer in
 *         flight has that id: unknown, or already completed). Nothing
 *         changes on an error.
 * Thread rules: any thread (takes the scheduler's inbox lock).
 */
BKV_API int bkv_kv_xfer_done(bkv_sched *sched, uint64_t xfer, int status, const uint32_t *failed,
			     uint32_t n_failed);

/**
 * Write the scheduler's and its pool's metrics in the Prometheus text
 * exposition format (version 0.0.4): a HELP and a TYPE line per metric, then
 * its samples. Names and units follow Prometheus conventions: counters end in
 * _total, times are in seconds, ratios in 0..1 (_ratio); the step-time
 * histogram bkv_step_duration_seconds has fixed buckets 0.0005 s .. 10 s and
 * +Inf, updated by bkv_step without allocation. docs/design.md
 * ("Integration") lists every name.
 * @param sched  the scheduler; NULL writes nothing and returns 0.
 * @param buf    receives at most cap bytes, NUL-terminated when cap > 0
 *               (truncated text when cap is too small); may be NULL when cap
 *               is 0.
 * @param cap    bytes available in buf.
 * @return the length of the whole text (not counting the NUL), as snprintf:
 *         it was truncated when the return is >= cap.
 * Thread rules: the stepping thread (as bkv_sched_stats_get).
 */
BKV_API size_t bkv_sched_metrics_prometheus(const bkv_sched *sched, char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* KV events in the vLLM wire format                                         */
/* ------------------------------------------------------------------------ */

/*
 * Routers built for vLLM (llm-d's KV-cache manager, NVIDIA Dynamo's KV router,
 * the SGLang router) follow a replica through its KV events: a msgpack
 * KVEventBatch {ts, events, data_parallel_rank} of tagged BlockStored /
 * BlockRemoved / AllBlocksCleared structs, sent over ZeroMQ. A bkv_vllm_encoder
 * drains a pool's events (bkv_pool_drain_events) and writes exactly the bytes a vLLM
 * replica's msgspec encoder writes for the same blocks, with block hashes
 * computed the way vLLM computes them (hash_block_tokens) when asked, so such
 * a router can follow a libbatchkv engine unchanged. docs/scaling.md cites
 * the vLLM sources followed and lists which router versions decode it.
 *
 * An encoder drains the pool's event ring, so a pool's events go either to
 * bkv_pool_drain_events or to one encoder, not both. The encoder belongs to the
 * pool's thread and reads the pool (tokens, prefix-cache index) while it
 * drains, so call bkv_vllm_encoder_drain between pool calls. When the
 * pool's event ring dropped events (a gap in seq), the batch it writes is a
 * resynchronisation: AllBlocksCleared followed by a BlockStored for every
 * block in the index, parents first, then (with a host cache, in a layout
 * with a medium) one on the host medium for every host-cache block whose
 * parent is published, so a
 * subscriber's view is exact again (a host block whose parent is in
 * neither tier is left out: no lookup can reach it).
 */

/* How KVEventBatch and its events are laid out; the vLLM versions each
 * follows and the exact field lists: docs/scaling.md. */
typedef enum bkv_vllm_wire {
	BKV_VLLM_WIRE_MAP = 0,     /* current vLLM: each struct a map keyed by
				      field name, events tagged by a first
				      "type" entry, defaults omitted */
	BKV_VLLM_WIRE_ARRAY = 1,   /* array_like vLLM, what llm-d's and
				      Dynamo's routers decode: each struct an
				      array of its fields, an event's tag
				      first; no group fields */
	BKV_VLLM_WIRE_ARRAY_V0 = 2 /* the first array_like vLLM: no medium or
				      lora_name, no data_parallel_rank;
				      hashes always ints. Without a medium
				      the tiers cannot be told apart: only
				      device blocks are published (a host
				      cache's are left out) */
} bkv_vllm_wire;

/* Which block hash the events carry. */
typedef enum bkv_vllm_hash {
	BKV_VLLM_HASH_NATIVE = 0,      /* the pool's own 64-bit chained hash
					  (bkv_block_hashes), as an int */
	BKV_VLLM_HASH_SHA256_CBOR = 1, /* vLLM's "sha256_cbor": SHA-256 of the
					  canonical CBOR of (parent digest,
					  token tuple, extra keys) */
	BKV_VLLM_HASH_SHA256 = 2       /* vLLM's "sha256": SHA-256 of the
					  pickle (protocol 5) of the same tuple */
} bkv_vllm_hash;

/* Bytes in a vLLM block digest (SHA-256). */
#define BKV_VLLM_DIGEST_BYTES 32

/* Names a pool's prefix-cache key for vLLM: the LoRA adapter name that vLLM
 * puts in every block's extra keys (and in BlockStored.lora_name). Return
 * NULL for a key without a name: such a key (nonzero) is hashed as vLLM
 * hashes a request's cache_salt, its decimal digits (key 5: "5") in the
 * extra keys of a chain's first block, so blocks of distinct keys never
 * share a digest. Called on the pool's thread while encoding; the string
 * must stay valid until bkv_vllm_encoder_drain returns. */
typedef const char *(*bkv_vllm_key_name_fn)(void *ud, uint64_t key);

typedef struct bkv_vllm_config {
	uint32_t size;              /* sizeof(bkv_vllm_config); set by init */
	uint32_t wire;              /* a bkv_vllm_wire. Default MAP. */
	uint32_t hash;              /* a bkv_vllm_hash. Default SHA256_CBOR. */
	uint32_t int_hashes;        /* nonzero: a digest goes out as the int
				       of its last 8 bytes read big-endian
				       (vLLM's default,
				       VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1);
				       0: as the 32-byte digest. NATIVE and
				       ARRAY_V0 always send ints. Default 1. */
	const char *hash_seed;      /* the replicas' PYTHONHASHSEED: the first
				       block's parent is hash(hash_seed)
				       (vLLM's NONE_HASH). Copied at create;
				       at most 255 bytes. Default "0". */
	const char *medium;         /* MAP, ARRAY: BlockStored/BlockRemoved.medium
				       of device blocks; NULL sends nil.
				       Copied. Default "GPU". */
	int32_t data_parallel_rank; /* MAP, ARRAY: KVEventBatch.data_parallel_rank;
				       -1 omits it. Default -1. */
	int32_t group_idx;          /* MAP: the KV-cache group index of every
				       event; -1 omits it. Default -1. */
	const char *spec_kind;      /* MAP: BlockStored.kv_cache_spec_kind
				       (e.g. "full_attention"); NULL omits
				       it. Copied. Default NULL. */
	uint32_t sliding_window;    /* MAP: BlockStored.
				       kv_cache_spec_sliding_window in tokens;
				       0 omits it. Default 0. */
	uint32_t extra_keys;        /* MAP, nonzero: BlockStored.extra_keys,
				       one entry per block (nil, [lora
				       name], or for a chain's first block
				       under an unnamed key [its salt]).
				       Default 0 (omitted). */
	bkv_vllm_key_name_fn key_name; /* names keys (LoRA); NULL: no key has
				       a name. A nonzero key is sent as
				       lora_id either way. */
	void *key_name_ud;          /* handed to key_name; never read */
	const char *host_medium;    /* MAP, ARRAY: the medium of the host
				       cache's blocks (bkv_pool_config.
				       host_cache; vLLM's CPU offloading
				       says "CPU"); NULL sends nil. Copied.
				       Default "CPU". */
	uint32_t reserved[2];       /* zero; room for later fields */
} bkv_vllm_config;

typedef struct bkv_vllm_encoder bkv_vllm_encoder;

/**
 * Fill a vLLM encoder config with defaults (see each field).
 * @param cfg  the config to fill; NULL is ignored.
 * Thread rules: any thread.
 */
BKV_API void bkv_vllm_config_init(bkv_vllm_config *cfg);

/**
 * Create an encoder for one pool. It keeps each indexed block's published
 * hash and walk scratch (49 bytes per device block, taken here) and grows a
 * message buffer as needed.
 * @param cfg    validated and copied (strings too).
 * @param pool   the pool whose events it will drain; must have events on
 *               (bkv_pool_config.event_capacity > 0) and outlive the encoder.
 * @param alloc  allocator; NULL = libc. Copied.
 * @param out    receives the encoder; untouched on failure.
 * @return BKV_OK; BKV_EINVAL (NULL cfg/pool/out, cfg->size too small, a field
 *         out of range, a NULL or too long hash_seed, a pool without
 *         events); BKV_ENOMEM.
 * Thread rules: the pool's thread.
 */
BKV_API int bkv_vllm_encoder_create(const bkv_vllm_config *cfg, const bkv_pool *pool,
				    const bkv_allocator *alloc, bkv_vllm_encoder **out);

/**
 * Destroy an encoder. NULL is ignored.
 * @param enc  the encoder.
 * Thread rules: the pool's thread.
 */
BKV_API void bkv_vllm_encoder_destroy(bkv_vllm_encoder *enc);

/**
 * Drain every pending KV event of the pool (as bkv_pool_drain_events would) and
 * encode them as one vLLM KVEventBatch (msgpack), the payload of one ZeroMQ
 * message. Consecutive
 * stored blocks that chain (each the parent of the next, same key) share one
 * BlockStored, as vLLM's per-request stores do; each removed block is its
 * own BlockRemoved. A block stored and removed again between two calls is
 * left out (its tokens are gone); the stream still replays to the index.
 * @param enc  the encoder.
 * @param pool the encoder's pool.
 * @param ts   KVEventBatch.ts, seconds (vLLM sends time.time()).
 * @param msg  receives the payload, owned by the encoder and valid until its
 *             next call; NULL when there was nothing to send.
 * @param len  receives the payload's length in bytes (0: nothing to send).
 * @return the number of vLLM events in the batch (>= 0); BKV_EINVAL (NULL
 *         argument, another pool); BKV_ENOMEM (the buffer could not grow; the
 *         drained events are lost and the next call resynchronises).
 * Thread rules: the pool's thread, between calls that change the pool.
 */
BKV_API int bkv_vllm_encoder_drain(bkv_vllm_encoder *enc, bkv_pool *pool, double ts,
				   const uint8_t **msg, size_t *len);

/**
 * Resynchronisations written so far (ring overflows and buffer failures).
 * @param enc  the encoder; NULL gives 0.
 * @return the count.
 * Thread rules: the pool's thread.
 */
BKV_API uint64_t bkv_vllm_encoder_resyncs(const bkv_vllm_encoder *enc);

/**
 * vLLM's block digests of the full blocks of a token sequence: what a vLLM
 * replica with this hash function, PYTHONHASHSEED and block size computes
 * (and what bkv_vllm_encoder_drain publishes for a pool holding these tokens
 * under key 0 or a key named lora_name). A router hashes an incoming prompt
 * with it. bkv_vllm_block_hashes_salted(cfg, lora_name, NULL, ...).
 * @param cfg           hash (SHA256_CBOR or SHA256) and hash_seed are read.
 * @param lora_name     the extra key of every block (vLLM's LoRA name);
 *                      NULL for none.
 * @param block_tokens  tokens per block (> 0).
 * @param tokens        n token ids; may be NULL only when n < block_tokens.
 * @param n             token count.
 * @param digests       receives (n / block_tokens) x BKV_VLLM_DIGEST_BYTES
 *                      bytes; may be NULL only when that is 0.
 * @return the number of digests written (n / block_tokens); 0 on bad input
 *         (NULL cfg, a NATIVE hash, a NULL or too long hash_seed, a
 *         failed allocation for very large blocks).
 * Thread rules: any thread.
 */
BKV_API uint32_t bkv_vllm_block_hashes(const bkv_vllm_config *cfg, const char *lora_name,
				       uint32_t block_tokens, const int32_t *tokens, uint32_t n,
				       uint8_t *digests);

/**
 * bkv_vllm_block_hashes with vLLM's cache_salt: the salt joins the first
 * block's extra keys (after lora_name), so every digest of the chain
 * differs from an unsalted one. bkv_vllm_encoder_drain publishes a pool's
 * blocks under a nonzero key that key_name does not name with the key's
 * decimal digits as the salt (key 5: "5").
 * @param cfg           as bkv_vllm_block_hashes.
 * @param lora_name     as bkv_vllm_block_hashes.
 * @param cache_salt    the first block's salt; NULL for none (then this is
 *                      bkv_vllm_block_hashes).
 * @param block_tokens  as bkv_vllm_block_hashes.
 * @param tokens        as bkv_vllm_block_hashes.
 * @param n             as bkv_vllm_block_hashes.
 * @param digests       as bkv_vllm_block_hashes.
 * @return as bkv_vllm_block_hashes.
 * Thread rules: any thread.
 */
BKV_API uint32_t bkv_vllm_block_hashes_salted(const bkv_vllm_config *cfg, const char *lora_name,
					      const char *cache_salt, uint32_t block_tokens,
					      const int32_t *tokens, uint32_t n, uint8_t *digests);

/**
 * The int a digest is sent as when int_hashes is set: its last 8 bytes read
 * big-endian (vLLM's int.from_bytes(digest, "big") & (2^64 - 1)).
 * @param digest  BKV_VLLM_DIGEST_BYTES bytes; NULL gives 0.
 * @return the 64-bit value.
 * Thread rules: any thread.
 */
BKV_API uint64_t bkv_vllm_hash_int(const uint8_t *digest);

#ifdef __cplusplus
}
#endif

#endif /* BATCHKV_H */
