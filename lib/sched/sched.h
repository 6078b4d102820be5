/*
 * sched.h - the scheduling layer: requests and their lanes, the inbox, the
 * running set, one step's plan, the host call's arrays, and the handle that
 * holds them as owned parts.
 *
 * Owners: sched/sched.c (configs, create/destroy, queries), sched/inbox.c
 * (batch buffers, bkv_submit/bkv_abort, draining the inbox), sched/req.c
 * (the id map, ending requests), sched/plan.c (planning: decode rows, forks,
 * prefill continuations, admissions, making room), sched/step.c (bkv_step:
 * the host calls, commit, rollback, the progress rule), sched/batch.c (the
 * bkv_batch layout, sched/batch.h), sched/check.c (bkv_sched_check). The
 * decisions (which request, how many tokens, which victim, swap or
 * recompute, how to pack) are asked of the decision layer (decide/decide.h)
 * through the policy table chosen at create.
 */
#ifndef BKV_SCHED_H
#define BKV_SCHED_H

#include "pool/pool.h"

#include <pthread.h>

/* Fixed values of the "auto" fields until the cost model decides them. */
#define AUTO_ADMIT_GROUP 1u
#define AUTO_MAX_WAIT_US 100000u
#define AUTO_TOKEN_BUDGET 512u
#define MAX_RUNNING_LIMIT (1u << 20)
#define MAX_QUEUE_LIMIT (1u << 24)
#define MAX_BUDGET_LIMIT (1u << 24)
#define MAX_BYPASS_LIMIT (1ull << 42) /* us, about 51 days; past it a value is
					 a unit mistake, not a bound */
#define TOK_CAP_LIMIT (1u << 24)
#define MAP_INIT_CAP 64u

#define LOCK(s) pthread_mutex_lock((pthread_mutex_t *)(s)->in.lock)
#define UNLOCK(s) pthread_mutex_unlock((pthread_mutex_t *)(s)->in.lock)
#define ATOMIC_ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_RELAXED)
#define ATOMIC_SUB(p, v) __atomic_sub_fetch((p), (v), __ATOMIC_RELAXED)
#define ATOMIC_LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)

#define LANE_KNOWN(l) ((l)->req->prompt_len + (l)->n_gen)
#define REQ_IS_RUNNING(r) ((r)->state == BKV__REQ_RUNNING)

/* ---- the scheduler's data ---------------------------------------------------
 * Everything below is touched by the stepping thread only, except the fields
 * marked "lock" (struct bkv_sched.in.lock) and "atomic". */

#define BKV__SEQ_NONE UINT32_MAX /* lane has no pool sequence */

/* Overlapped scheduling's batch buffer sets at most: one a step in flight
 * (BKV_OVERLAP_MAX_DEPTH) and the one planned (sched/overlap.h). */
#define BKV__OVL_SETS (BKV_OVERLAP_MAX_DEPTH + 1)

/* bkv__req.state: each request is in exactly one. */
#define BKV__REQ_INBOX 0   /* submitted, not drained yet */
#define BKV__REQ_WAITING 1 /* in the queue, holds no blocks */
#define BKV__REQ_RUNNING 2 /* holds slots and device blocks */
#define BKV__REQ_SWAPPED 3 /* in the queue, its blocks on the host tier */
#define BKV__REQ_DONE 4    /* ended; on_finish has run */

/* One branch of a request (n > 1 forks n of them): a pool sequence and the
 * token history it stands for. KV of tok[0, kv_len) is in seq; the tokens
 * known are tok[0, prompt_len + n_gen). */
typedef struct bkv__lane {
	struct bkv__req *req; /* owning request */
	int32_t *tok;         /* [prompt_len + max_new] prompt, then generated
				 tokens; inside the request's allocation */
	uint32_t seq;         /* pool sequence, BKV__SEQ_NONE when none */
	uint32_t n_gen;       /* generated tokens committed, <= max_new */
	uint32_t kv_len;      /* tokens in seq (its pool length) */
	uint32_t pre_len;     /* kv_len before this step's appends (rollback) */
	uint64_t touch_step;  /* step that last appended (pre_len is valid) */
	uint32_t branch;      /* index 0..n-1, row_branch */
	uint8_t done;         /* finished: no more rows, seq closed */
	uint8_t decoding;     /* prefill done: next row is a 1-token decode row */
	uint8_t reason;       /* bkv_finish_reason once done */
	uint8_t fresh;        /* persistent layout: its row slot is new to the
				 host (the next delta is OPENED, from 0) */
	uint8_t pre_fresh;    /* fresh before this step's first delta */
	uint32_t row_slot;    /* persistent layout: its row slot, or
				 BKV__SLOT_NONE (sched/rows.c) */
	uint32_t sent_len;    /* the table length the host was last sent;
				 UINT32_MAX after a rolled-back step */
	uint32_t pre_clean;   /* the sequence's clean mark before this step's
				 first delta (rollback) */
	uint64_t delta_step;  /* step of its last delta (pre_* are valid) */
	uint32_t spec_tab;    /* speculative decoding, n-gram drafts: the
				 lookup table it last used (sched/spec.c; its
				 owner says whether it is still this lane's) */
	uint8_t spec_miss;    /* its last row offered drafts got none (no
				 n-gram match, no host draft, or k 0): an
				 overlapped launch does not hold it back to
				 draft (bkv__spec_hold) */
	/* overlapped scheduling (sched/overlap.c) */
	uint8_t ovl_pend;     /* 1: n_gen counts placeholders (ovl_n) for
				 tokens outstanding steps sample (provisional
				 commits); 2: also provisionally done (the
				 newest is its last token: no more rows); 3:
				 an outstanding step carries its drafts, so
				 the tokens it delivers are unknown: no row
				 until that step completes (done and
				 decoding are set aside meanwhile) */
	uint8_t ovl_dec;      /* decoding before the first placeholder */
	uint8_t ovl_n;        /* placeholders n_gen counts, one per
				 outstanding step, oldest first; at most
				 the depth */
	uint8_t ovl_mode;     /* ovl_pend while a commit replaces the
				 oldest placeholder (sched/overlap.c) */
	uint32_t com_len;     /* while ovl_last is outstanding: the length
				 whose KV is committed (the oldest
				 outstanding step's pre_len) */
	uint64_t ovl_last;    /* newest outstanding step that appended to
				 it (0: none yet) */
	uint32_t def_seq;     /* a released sequence whose close waits for
				 the outstanding steps (BKV__SEQ_NONE: none) */
	uint32_t def_keep;    /* its committed length to truncate to before
				 the close; UINT32_MAX: drop it */
	struct bkv__lane *def_next; /* the deferred-release list's link */
	uint32_t cn_saved;    /* KV connector: logical blocks of seq handed to
				 save or known to the store (hits, loads) */
	uint64_t def_tag;     /* released once the step with this number has
				 completed (or none is outstanding) */
} bkv__lane;

#define BKV__SLOT_NONE UINT32_MAX /* lane holds no row slot */

/* One encoder input of a request (bkv_encoder_input, resolved). */
typedef struct bkv__enc_use {
	uint64_t id;           /* cache_id */
	uint32_t start;        /* token_start */
	uint32_t end;          /* token_start + token_len */
	uint32_t cost;         /* its encoder work (cost, or token_len) */
	uint32_t entry;        /* its encoder-cache entry while held */
	uint8_t held;          /* holds a reference on entry (running
				  requests only; sched/encoder.c) */
} bkv__enc_use;

typedef struct bkv__req {
	uint64_t id;           /* nonzero, from next_id */
	int64_t order;         /* queue key after priority: arrival order
				  (increasing), or a decreasing front counter
				  for requeued (preempted) requests */
	int32_t priority;      /* higher first */
	uint32_t prompt_len;   /* >= 1 */
	uint32_t max_new;      /* >= 1 */
	uint32_t n;            /* lanes, >= 1 */
	uint32_t n_live;       /* lanes not done; slots it holds while running */
	uint32_t n_stop;       /* entries in stop */
	int32_t *stop;         /* [n_stop], inside the allocation */
	uint64_t cache_key;    /* prefix-cache key for every lane's sequence */
	void *user;            /* request user pointer */
	uint8_t state;         /* BKV__REQ_* */
	uint8_t forked;        /* n > 1: lanes 1..n-1 exist (after prefill) */
	uint8_t swap_unsent;   /* swapped out, copies not yet sent to a host */
	uint8_t abort_state;   /* lock: 0 none, 1 on the abort list, 2 taken */
	uint8_t zombie;        /* lock: DONE while on the abort list; freed
				  when the list is drained */
	uint32_t heap_idx;     /* position in the queue heap while queued */
	uint32_t age_idx;      /* position in the age heap while queued with
				  order > 0 (a new request), else UINT32_MAX */
	uint32_t queued_with;  /* slots queued when it entered the queue as a
				  new request, itself and the requests
				  drained with it included (the auto bypass
				  bound) */
	uint64_t admit_us;     /* clock at its last admission */
	uint32_t run_idx;      /* position in run[] while running */
	uint64_t admit_seq;    /* admission counter; larger = more recent */
	uint64_t enq_us;       /* clock when it entered the queue */
	uint64_t preempt_step; /* step of its last preemption (0 = never) */
	uint32_t predicted_output; /* bkv_request hint: expected output
				      tokens, 0 = unknown (auto.c, queue order) */
	float spec_acc;        /* speculative decoding: decayed drafts
				  accepted (decide/spec.c) */
	float spec_trials;     /* decayed trials: drafts accepted plus
				  first rejections (a geometric fit) */
	struct bkv__req *next; /* lock: inbox link; then the done list link */
	struct bkv__req *abort_next; /* lock: abort list link */
	size_t alloc_size;     /* bytes of this allocation */
	uint64_t hold_tag;     /* overlap: ended, freed once the step with this
				  number has completed (sched/overlap.c) */
	bkv_retention_range *ret; /* [n_ret] the request's retention ranges,
				  inside the allocation (after lane[]);
				  NULL when none */
	uint32_t n_ret;        /* entries in ret */
	uint32_t adapter;      /* bkv_request.adapter; 0 = none */
	uint32_t ad_slot;      /* running with an adapter: its entry in
				  s->ad->tab (sched/adapters.c) */
	bkv__enc_use *enc;     /* [n_enc] its encoder inputs, inside the
				  allocation; NULL when none */
	uint32_t n_enc;        /* entries in enc */
	uint32_t enc_next;     /* enc[0, enc_next) are passed (their
				  references dropped) */
	uint8_t enc_pend;      /* on the encoder's release list */
	uint8_t cn_ask;        /* KV connector: 0 lookup not asked yet, 1
				  asked again each step (BKV_CONNECTOR_LATER;
				  on the connector's later list), 2 answered */
	uint8_t cn_loading;    /* lane 0's load is planned or in flight: no
				  rows until it completes */
	uint32_t cn_ext;       /* leading prompt blocks the store holds */
	uint32_t cn_rec;       /* its load's transfer record + 1; 0: none */
	struct bkv__cn_buf *cn_buf; /* its hashes and load entries (own
				  allocation, sched/connector.c); NULL
				  without a connector */
	struct bkv__req *cn_next; /* the later list's link */
	bkv__lane lane[];      /* [n] */
} bkv__req;

/* One planned row: lane computes tokens [start, end) (its KV length after
 * the append is end) and samples a token when sample is set. */
typedef struct bkv__row {
	bkv__lane *lane;
	uint32_t start;  /* first computed position */
	uint32_t end;    /* sequence length after the row */
	uint8_t sample;  /* the host writes a token for this row */
	int32_t out;     /* the sampled token, copied after a prefill call
			    (a split host's prefill rows; the last call's
			    rows are committed from next_tokens) */
} bkv__row;

/* The id -> request map (open addressing, linear probing, lock). */
typedef struct bkv__slot {
	uint64_t id;   /* 0 = empty */
	bkv__req *req;
} bkv__slot;

/* Token-sized and block-sized batch arrays; replaced as one set when a larger
 * request is submitted (bkv_submit prepares a spare set under the lock, the
 * step swaps it in at drain time, so bkv_step never allocates). */
typedef struct bkv__bufs {
	uint32_t tok_cap;      /* entries in each token array */
	uint32_t kv_cap;       /* entries in kv_indices */
	uint32_t ng;           /* KV groups: slot_mapping and kv_indices hold
				  one array per group, group g's at g x
				  tok_cap and g x (kv_cap + BKV__KV_SLACK) */
	int32_t *token_ids;    /* [tok_cap] */
	int32_t *positions;    /* [tok_cap] */
	int32_t *slot_mapping; /* [ng * tok_cap] */
	int32_t *kv_indices;   /* [ng * (kv_cap + BKV__KV_SLACK)] */
} bkv__bufs;

/* Buckets of the step-duration histogram (sched/step.c), +Inf included. */
#define BKV__STEP_BUCKETS 15

/* The inbox: what bkv_submit and bkv_abort share with the stepping thread
 * (sched/inbox.c). Fields marked "lock" under bkv_sched.in.lock, "atomic"
 * read without it. */
typedef struct bkv__inbox {
	void *lock;            /* pthread_mutex_t, allocated */
	void *cv;              /* pthread_cond_t on the monotonic clock,
				  allocated: bkv_sched_wait's sleep
				  (sched/wait.c) */
	uint32_t waiters;      /* lock: threads in bkv_sched_wait */
	uint32_t wakes;        /* lock: bkv_sched_wake calls, counted */
	uint32_t wakes_seen;   /* lock: wakes when the last wait ended */
	bkv__req *inbox_head;  /* lock: FIFO of submitted requests */
	bkv__req *inbox_tail;  /* lock */
	bkv__req *abort_head;  /* lock: LIFO of requests to abort */
	bkv__slot *map;        /* lock: [map_cap] id -> request */
	uint32_t map_cap;      /* lock: power of two */
	uint32_t map_count;    /* lock: live entries, <= map_cap / 2 */
	bkv__bufs spare[BKV__OVL_SETS]; /* lock: prepared larger buffers
				  (tok_cap 0: none): [0], and with overlap
				  one for each other batch buffer set */
	uint32_t want_tok;     /* lock: tok_cap of spare, else of bufs */
	uint32_t want_kv;      /* lock: kv_cap of spare, else of bufs */
	uint32_t tok_limit;    /* most entries of a token array: TOK_CAP_LIMIT
				  (set at create; tests lower it to reach the
				  bound with small requests) */
	uint64_t next_id;      /* lock: last id handed out */
	uint64_t nr_queued;    /* atomic: inbox + waiting + swapped */
	uint64_t nr_alive;     /* atomic: requests not ended */
	uint64_t submitted;    /* atomic: accepted by bkv_submit */
} bkv__inbox;

/* The queue: waiting and swapped requests (sched/queue.c). */
typedef struct bkv__queue {
	bkv__req **heap;       /* [heap_cap] binary heap, best at 0 */
	uint32_t heap_n;       /* entries */
	uint32_t heap_cap;     /* max_queue + max_running */
	uint32_t queue_slots;  /* sum of n_live over the heap */
	uint32_t nr_waiting;   /* heap entries in WAITING */
	uint32_t nr_swapped;   /* heap entries in SWAPPED */
	int64_t arrival;       /* last arrival order handed out */
	int64_t front;         /* last front order handed out (decreasing) */
	bkv__req **age;        /* [heap_cap] the age heap: the queued requests
				  with order > 0 (new, never preempted), a
				  binary heap keyed by (priority descending,
				  order ascending); age[0] is the oldest new
				  request of the highest class holding one.
				  age_n <= heap_n */
	uint32_t age_n;        /* entries */
	double run_mean_us;    /* decayed mean of the time requests ran
				  (admission to a LENGTH/STOP end), for the
				  auto bypass bound; 0 = none ended yet */
} bkv__queue;

/* The running requests, in admission order (sched/req.c ends them). */
typedef struct bkv__running {
	bkv__req **run;        /* [max_running] */
	uint32_t nr_run;       /* entries */
	uint32_t slots_used;   /* sum of n_live over run[] <= max_running */
	uint32_t nr_run_multi; /* entries of run[] with n > 1 (plan_forks
				  skips its pass when 0) */
	uint32_t group_size;   /* static: rows of the current group, else 0 */
	int run_dirty;         /* a request left RUNNING since the last
				  compaction of run[] */
	uint64_t admit_seq;    /* last admission counter */
	uint64_t last_admit_us; /* clock at the last admission */
} bkv__running;

/* One step's plan (stepping thread only; sched/plan.c, sched/step.c). */
typedef struct bkv__plan {
	uint64_t step_us;      /* clock at the start of the current step */
	uint64_t step_no;      /* steps begun, 1-based */
	int in_step;           /* nonzero during bkv_step (nested -> ESTATE) */
	uint32_t row_cap;      /* 2 * max_running */
	bkv__row *pre;         /* [row_cap] prefill rows of this step */
	uint32_t n_pre;
	bkv__row *dec;         /* [row_cap] decode rows of this step */
	uint32_t n_dec;
	bkv__lane **touched;   /* [row_cap] lanes appended to this step, except
				  those of plan_decode's fast rows (rollback
				  reaches them through plan.dec) */
	uint32_t n_touched;
	bkv__req **swap_pend;  /* [max_running] swapped, copies unsent */
	uint32_t n_swap_pend;
	uint32_t fill_rows;    /* dec[0, fill_rows) are in the batch arrays
				  already (written while planning, bkv__fill);
				  0 once a preemption pruned rows or a
				  prefill call reused the arrays */
	uint32_t fill_tok;     /* their tokens (fill_rows, plus the drafts
				  bkv__batch_drafts laid in) */
	uint32_t fill_kv;      /* kv_indices entries of those rows */
	uint64_t fill_ctx;     /* their summed context lengths */
	double dec_ctx_row;    /* context per decode row in the last call
				  that had decode rows (0: none yet); the
				  auto budget prices decode rows with it */
	bkv__req *done_head;   /* requests ended this step (to free) */
	uint32_t budget_left;  /* tokens this step may still compute */
	uint32_t step_hits;    /* prompt tokens this step took from the prefix
				  cache */
	int admit_tried;       /* this step's admission was allowed (it may
				  still have taken nothing) */
	uint64_t open_from;    /* overlapped scheduling: the oldest outstanding
				  step while a later one is planned (its
				  lanes' KV is uncommitted: no fork from
				  them, no preemption), else 0 */
	int need_sync;         /* an overlapped plan left work for a step
				  with nothing in flight (a preemption, a
				  swap-in): the next launch declines */
	int launching;         /* the calls go to ops.launch (one mixed
				  call) */
	int fenced;            /* a step is outstanding: released sequences
				  wait (sched/overlap.c) */
	uint32_t stalls;       /* consecutive steps with nothing running, no
				  row, and an allowed admission that took
				  nothing (the progress rule, sched/step.c) */
} bkv__plan;

/* The host call's arrays: the memory behind bkv_batch (sched/batch.c owns
 * the layout). */
typedef struct bkv__call_arrays {
	bkv__bufs bufs;        /* token- and block-sized arrays */
	int32_t *qo_indptr;    /* [row_cap + 1] */
	int32_t *kv_indptr;    /* [row_cap + 1] */
	int32_t *last_page_len; /* [row_cap] */
	uint8_t *row_sample;   /* [row_cap] */
	uint64_t *row_req;     /* [row_cap] */
	uint32_t *row_branch;  /* [row_cap] */
	void **row_user;       /* [row_cap] */
	int32_t *next_tokens;  /* [row_cap] */
	bkv_chunk_shape *chunks; /* [row_cap] */
	uint32_t *row_adapter; /* [row_cap] */
	uint32_t *adapters;    /* [row_cap] the call's distinct adapters */
} bkv__call_arrays;

typedef struct bkv__call {
	bkv__call_arrays arr;  /* the row- and token-sized arrays of the call
				  (with overlap, one of two sets that
				  alternate: sched/overlap.c) */
	uint32_t copies_sent[3]; /* copies of each kind already in a call of
				    this step */
	/* the persistent layout (sched/rows.c); NULL arrays when flat */
	int persistent;        /* cfg.batch_layout == BKV_BATCH_PERSISTENT */
	uint32_t *row_slot;    /* [row_cap] each row's slot in this call */
	uint32_t n_slots;      /* row slots: max_running, (depth + 2) x max_running
				  with overlap (released slots wait for the
				  steps that read them, sched/rows.c) */
	const int32_t **row_tables; /* [n_slots] each slot's table */
	uint32_t *row_table_len; /* [n_slots] its entries */
	bkv__lane **slot_lane; /* [n_slots] the lane holding each slot */
	uint32_t *slot_free;   /* [n_slots] stack of free slots */
	uint32_t n_slot_free;
	uint32_t *slot_pend;   /* [n_slots] overlap: released while a step
				  was outstanding, not yet free; NULL without */
	uint64_t *slot_pend_tag; /* [n_slots] each one's release step: free
				  once the steps up to it completed */
	uint32_t n_slot_pend;
	uint32_t *closed;      /* [n_slots] slots released since the last
				  call (sent as CLOSED deltas) */
	uint32_t n_closed;
	bkv_table_delta *deltas; /* [row_cap + n_slots] this call's */
	uint32_t n_deltas;
	uint32_t n_delta_blocks; /* entries of bufs.kv_indices the deltas use */
	bkv__lane **sent;      /* [row_cap] lanes sent a delta this step */
	uint32_t n_sent;
	uint32_t *dirty;       /* [row_cap] fused-pass rows that need their
				  delta (or a slot) at the call */
	uint32_t n_dirty;      /* entries in dirty (of plan.dec[0, fill_rows)) */
	/* KV groups after the first (sched/groups.c); n_lanes 0 without */
	uint32_t n_lanes;      /* the pool's groups after the first (the
				  attention lanes and a STATE group) */
	uint32_t st_interval;  /* a STATE group's checkpoint interval: prefill
				  chunks end at its multiples (0: none) */
	int32_t *g_state;      /* [2 * row_cap] a STATE group's state_in and
				  state_out */
	int has_state;         /* the pool has a STATE group */
	bkv_batch_group groups[BKV_MAX_GROUPS]; /* this call's, [1 + n_lanes] */
	uint64_t gctx[BKV_MAX_GROUPS]; /* each group's decode context */
	int32_t *g_kv_indptr;  /* [n_lanes * (row_cap + 1)] (with overlap,
				  one of two sets that alternate) */
	int32_t *g_kv_first;   /* [(1 + n_lanes) * row_cap]; group 0's zeros
				  (with overlap, as g_kv_indptr) */
	const int32_t **g_row_tables; /* [n_lanes * slots] slots: max_running,
				  (depth + 2) x max_running with overlap */
	uint32_t *g_row_table_len; /* [n_lanes * slots] */
} bkv__call;

/* What the scheduler measures of its own steps, for bkv_sched_stats_get and
 * the metrics exposition to read. */
typedef struct bkv__obs {
	uint64_t step_hist[BKV__STEP_BUCKETS]; /* steps (ok or rolled back)
				  whose duration fell in bucket i (not
				  cumulative; last = +Inf) */
	double step_sum_s;     /* sum of step durations, seconds */
} bkv__obs;

/* The decisions, one function per question, chosen at create by the
 * decision layer (decide/decide.c and each concern's *_choose). The
 * scheduler asks through these and never tests cfg.policy or cfg.preempt
 * itself. */
typedef struct bkv__policy {
	/* decide/admit.c: may this step admit, given free_slots > 0 and a
	 * nonempty queue (static, fixed group, cost model) */
	int (*admit)(bkv_sched *s, uint64_t now, uint32_t free_slots);
	/* decide/admit.c: within an admitting step, may r join the group */
	int (*admit_ok)(bkv_sched *s, const bkv__req *r);
	/* decide/admit.c: the policy's own admit_ok when admit_ok is the
	 * memory reserve's wrapper (BKV_RESERVE_OUTPUT), else NULL */
	int (*admit_ok_base)(bkv_sched *s, const bkv__req *r);
	/* decide/admit.c: after a step's admissions (was_empty: nothing ran
	 * before them; static batching fixes its group here) */
	void (*admit_end)(bkv_sched *s, int was_empty);
	/* decide/admit.c: decode rows the host's call is padded to (static
	 * batching pads to its group) */
	uint32_t (*padded_rows)(const bkv_sched *s, uint32_t n_decode);
	/* decide/budget.c: the tokens this step may compute */
	uint32_t (*budget)(bkv_sched *s);
	/* decide/preempt.c: the request to preempt, or NULL */
	bkv__req *(*victim)(const bkv_sched *s);
	/* decide/preempt.c: swap (1) or recompute (0) this victim */
	int (*want_swap)(const bkv_sched *s, const bkv__req *r);
	/* decide/pack.c: partition a split host's n prefill rows into calls;
	 * returns the number of calls (1: one call over rows as given) */
	uint32_t (*pack)(bkv_sched *s, const bkv__row *rows, uint32_t n, bkv__row **sorted,
			 const uint32_t **order, const uint32_t **ends);
	/* decide/evict.c: put the pool's eviction policy in force (on 1, at
	 * create; BKV_OK or BKV_ENOMEM) or undo it (on 0, at destroy) */
	int (*evict)(bkv_sched *s, int on);
} bkv__policy;

struct bkv_sched {
	bkv_sched_config cfg;  /* copied, auto fields resolved */
	bkv_host_ops ops;      /* copied */
	void *host;            /* handed to callbacks */
	bkv_allocator alloc;   /* every allocation of the scheduler */
	bkv_pool *pool;        /* not owned */
	uint32_t bt;           /* pool block_tokens, a power of two */
	uint32_t bt_shift;     /* log2(bt) */
	uint32_t device_blocks; /* pool device blocks */
	uint32_t host_blocks;  /* pool host blocks (0: no swap) */
	int split;             /* 1: prefill + decode callbacks, 0: forward */
	bkv__inbox in;         /* shared with bkv_submit / bkv_abort */
	bkv__queue q;          /* waiting and swapped requests */
	bkv__running rs;       /* running requests */
	bkv__plan plan;        /* the current step's plan */
	bkv__call call;        /* the host call's arrays */
	bkv_sched_stats stats; /* cumulative; waiting/running/swapped filled on
				  read */
	bkv__obs obs;          /* step durations */
	bkv__policy pol;       /* the decisions chosen at create
				  (decide/decide.h) */
	struct bkv__auto *autos; /* the cost-model decisions' state and the
				    default model; owned (decide/) */
	int bad_write;         /* a call wrote into a shared or cached block
				  (bkv_sched_check 30); sticky */
	struct bkv__spec *spec; /* speculative decoding's state; NULL when
				   cfg.spec_max_k is 0 (sched/spec.c) */
	struct bkv__ovl *ovl;  /* overlapped scheduling's state
				  (sched/overlap.c); NULL when off */
	struct bkv__outs *outs; /* the per-step output arrays
				   (sched/outputs.c); NULL when off */
	struct bkv__enc *enc;  /* the encoder inputs' cache (sched/encoder.c);
				  NULL when cfg.encoder_cache is 0 */
	struct bkv__adapters *ad; /* the adapters held by running requests
				     (sched/adapters.c); NULL when
				     cfg.max_adapters is 0 */
	int kv_released;       /* bkv_sched_kv_release: the device KV is the
				  host's until bkv_sched_kv_resume; steps
				  only drain (sched/release.c) */
	struct bkv__cn *cn;    /* the KV connector's state
				  (sched/connector.c); NULL without one */
};

/* ---- shared helpers --------------------------------------------------------- */

static inline int bkv__is_stop(const bkv__req *r, int32_t t)
{
	uint32_t i;

	for (i = 0; i < r->n_stop; i++)
		if (r->stop[i] == t)
			return 1;
	return 0;
}

static inline uint64_t bkv__clock_us(const bkv_sched *s)
{
	return s->ops.now_us ? s->ops.now_us(s->host) : bkv__monotonic_us();
}

/* The step-duration histogram's bucket bounds in us (sched/step.c); the last
 * bucket, +Inf, has none. */
extern const uint64_t bkv__step_bound_us[BKV__STEP_BUCKETS - 1];

/* ---- sched/outputs.c: what a step delivered, as arrays --------------------- */

/* The arrays (sized at bkv_sched_outputs_enable; see outputs.c). */
struct bkv__outs {
	uint64_t *tok_req;    /* [tok_cap] a delivered token's request */
	uint32_t *tok_branch; /* [tok_cap] its branch */
	int32_t *tok;         /* [tok_cap] the token */
	uint32_t n_tok;       /* tokens recorded */
	uint32_t tok_cap;     /* entries of the three arrays above */
	uint64_t *fin_req;    /* [fin_cap] an ended request */
	int32_t *fin_why;     /* [fin_cap] its bkv_finish_reason */
	uint32_t n_fin;       /* ends recorded */
	uint32_t fin_cap;     /* entries of the two arrays above */
	int stale;            /* a delivery point returned since the last
				 record: the next one starts afresh */
};

/* The first record after a delivery point returned empties the arrays. */
static inline void bkv__outs_fresh(struct bkv__outs *o)
{
	if (o->stale) {
		o->n_tok = o->n_fin = 0;
		o->stale = 0;
	}
}

/* Record a delivered token / an ended request (s->outs is on; inline: the
 * commit's per-token loop). The arrays have room for every one a delivery
 * point makes (outputs.c); the test keeps a broken bound from writing out
 * of them. */
static inline void bkv__outs_token(bkv_sched *s, uint64_t req, uint32_t branch, int32_t t)
{
	struct bkv__outs *o = s->outs;

	bkv__outs_fresh(o);
	BKV_ASSERT(o->n_tok < o->tok_cap);
	if (UNLIKELY(o->n_tok >= o->tok_cap))
		return;
	o->tok_req[o->n_tok] = req;
	o->tok_branch[o->n_tok] = branch;
	o->tok[o->n_tok++] = t;
}

static inline void bkv__outs_finish(bkv_sched *s, uint64_t req, bkv_finish_reason why)
{
	struct bkv__outs *o = s->outs;

	bkv__outs_fresh(o);
	BKV_ASSERT(o->n_fin < o->fin_cap);
	if (UNLIKELY(o->n_fin >= o->fin_cap))
		return;
	o->fin_req[o->n_fin] = req;
	o->fin_why[o->n_fin++] = (int32_t)why;
}

/* Mark the start and the end of a delivery point (bkv_step,
 * bkv_step_complete). */
void bkv__outs_begin(bkv_sched *s);
void bkv__outs_end(bkv_sched *s);
void bkv__outs_destroy(bkv_sched *s);

/* ---- sched/step.c: a step while the device KV is released (release.c) ----- */

/* A step (or launch) while released: the inbox drained, nothing planned. */
int bkv__released_step(bkv_sched *s, bkv_step_info *info);

/* ---- sched/wait.c: bkv_sched_wait ------------------------------------------ */

/* Set up and tear down the condition variable (create / destroy). */
int bkv__wait_init(bkv_sched *s);
void bkv__wait_destroy(bkv_sched *s);
/* A submission arrived (under the lock): wake the waiters. */
static inline void bkv__wait_signal(bkv_sched *s)
{
	if (s->in.waiters)
		pthread_cond_broadcast((pthread_cond_t *)s->in.cv);
}

/* ---- sched/step.c: the step's pieces, shared with sched/overlap.c ---------- */

/* Drain and plan one step (everything before the host calls). open_txn:
 * begin the pool's transaction (0 when an outstanding step's is open). */
void bkv__step_plan(bkv_sched *s, uint64_t now, bkv_step_info *si, int open_txn);
/* The step's host calls; *called is set when a callback ran. */
int bkv__step_run_calls(bkv_sched *s, bkv_step_info *si, int *called);
/* Clear the copy lists (every pending copy went out with the step). */
void bkv__step_clear_copies(bkv_sched *s);
/* Record a mixed call's sampled tokens outs[i] for rows[0, n). */
void bkv__step_commit_rows(bkv_sched *s, const bkv__row *rows, uint32_t n, const int32_t *outs,
			   bkv_step_info *si);
/* Add a committed step's counts to the stats. */
void bkv__step_stats(bkv_sched *s, const bkv_step_info *si);
/* A step with nothing else outstanding failed: roll it back. */
void bkv__step_rollback(bkv_sched *s, uint64_t now, bkv_step_info *si);
/* Swap-outs no call carried become recompute preemptions. */
void bkv__swaps_to_recompute(bkv_sched *s, uint64_t now);
/* After a step: compact run[], free ended requests, the info's counts, the
 * histogram. */
void bkv__step_end(bkv_sched *s, uint64_t now, bkv_step_info *si, bkv_step_info *info,
		   int observe);

/* ---- sched/overlap.c ------------------------------------------------------- */

/* Create overlapped scheduling's state (cfg.overlap; a no-op when off).
 * BKV_OK or BKV_ENOMEM. */
int bkv__ovl_create(bkv_sched *s);
void bkv__ovl_destroy(bkv_sched *s);
/* A lane's sequence is released (drop: an abort) while a step that may read
 * it is outstanding: the release waits for that step (deferred-free list). */
void bkv__ovl_defer(bkv_sched *s, bkv__lane *l, int drop);
static inline int bkv__ovl_fenced(const bkv_sched *s)
{
	return s->plan.fenced;
}
/* Release a lane's sequence now, or after the outstanding steps. */
/* ---- KV connector (sched/connector.c) ---- */
int bkv__cn_create(bkv_sched *s, const bkv_connector *c);
void bkv__cn_destroy(bkv_sched *s);
/* Submit: the request's hashes and entry buffer (BKV_OK, BKV_ENOMEM). */
int bkv__cn_req_init(bkv_sched *s, bkv__req *r);
void bkv__cn_req_free(bkv_sched *s, bkv__req *r);
/* Drain: a request entering the queue is asked; 1 when it waits off the
 * queue (later list). */
int bkv__cn_ask(bkv_sched *s, bkv__req *r);
/* Drain: the later list asked again, answered ones queued. */
void bkv__cn_drain(bkv_sched *s, uint64_t now);
/* Inside the step's transaction: completed transfers applied. */
void bkv__cn_complete(bkv_sched *s);
/* Planning: lane l (touched, after its local hits) loads what the store
 * holds beyond them; 1 when it does (no row this step). */
int bkv__cn_load_plan(bkv_sched *s, bkv__lane *l, uint32_t target);
/* After the commit of the steps up to upto: their planned loads go out. */
void bkv__cn_after_commit(bkv_sched *s, uint64_t upto);
/* After a commit: the rows' lanes' new full blocks go to save. */
void bkv__cn_save_rows(bkv_sched *s, const struct bkv__row *rows, uint32_t n);
/* No saves while on (the device KV is being released). */
void bkv__cn_quiet(bkv_sched *s, int on);
/* Request r was preempted (the connector's preempted callback). */
void bkv__cn_preempted(bkv_sched *s, const bkv__req *r);
/* A request lets go of its lanes (ends, preempted). */
void bkv__cn_disown(bkv_sched *s, bkv__req *r);
/* Requests on the later list (counted as not drained). */
uint32_t bkv__cn_n_later(const bkv_sched *s);
/* After a rollback: planned loads forgotten, publications redone. */
void bkv__cn_rollback(bkv_sched *s);
/* seq's end waits for the transfers that name it: 1 when it was parked
 * (bkv__seq_end goes on once they completed), 0 when none does. */
int bkv__cn_defer_end(bkv_sched *s, uint32_t seq, int drop, uint32_t keep);
/* The end of a lane's pool sequence (sched/req.c): dropped, or cut to keep
 * (UINT32_MAX: as it is) and closed; parked first while a KV connector's
 * transfers name it. */
void bkv__seq_end(bkv_sched *s, uint32_t seq, int drop, uint32_t keep);
/* Lane l's new full blocks go to save before its sequence ends. */
void bkv__cn_save_lane(bkv_sched *s, bkv__lane *l);
/* A transfer in flight names r's sequences (no swap-out). */
int bkv__cn_busy_req(const bkv_sched *s, const bkv__req *r);
/* Requests that only wait for a load in flight, 0 when completed transfers
 * wait to be applied (lock held; bkv_sched_wait). */
uint32_t bkv__cn_idle(const bkv_sched *s);
/* Requests whose load is planned or in flight. */
uint32_t bkv__cn_loads_planned(const bkv_sched *s);
/* Transfers in flight (0 without a connector). */
uint32_t bkv__cn_in_flight(const bkv_sched *s);
/* Blocks will come back without a step's planning: steps in flight complete
 * (overlap) or a KV connector's transfers do. The progress rules wait. */
static inline int bkv__blocks_coming(const bkv_sched *s)
{
	return s->plan.fenced || bkv__cn_in_flight(s);
}
/* Stats: requests waiting for external KV, blocks held by saves. */
void bkv__cn_stats(const bkv_sched *s, bkv_sched_stats *st);
/* Sequences parked until their transfers complete. */
uint32_t bkv__cn_parked(const bkv_sched *s);
/* Invariants (bkv_sched_check 40). */
int bkv__cn_check(const bkv_sched *s);

static inline void bkv__lane_release_seq(bkv_sched *s, bkv__lane *l, int drop)
{
	if (s->cn)
		bkv__cn_save_lane(s, l);
	if (bkv__ovl_fenced(s))
		bkv__ovl_defer(s, l, drop);
	else if (s->cn)
		bkv__seq_end(s, l->seq, drop, UINT32_MAX);
	else if (drop)
		bkv_seq_drop(s->pool, l->seq);
	else
		bkv_seq_close(s->pool, l->seq);
}
/* The requests a step ended (done list from done_head) wait for the
 * outstanding steps that may still name them; returns 1 when it took them. */
int bkv__ovl_hold(bkv_sched *s, bkv__req *list);
/* Drain, lock held: the prepared larger buffer sets go to the sets not in
 * flight; old[BKV__OVL_SETS] receives the sets to free after the lock, as
 * many as it returns. */
uint32_t bkv__ovl_spares(bkv_sched *s, bkv__bufs *old);
/* Its invariants (bkv_sched_check 34-36) and the lanes it holds
 * (deferred sequences, for invariant 23). */
int bkv__ovl_check(const bkv_sched *s, uint32_t *n_def);
/* A launch planned on steps in flight: its decode rows' placeholders name
 * the step by how many launches back it was (BKV_TOKEN_PENDING_AT). */
void bkv__ovl_name(bkv_sched *s, bkv_batch *b);
/* A launched batch's groups array, in storage of its buffer set. */
const bkv_batch_group *bkv__ovl_groups(bkv_sched *s, const bkv_batch *b);
/* Outstanding steps (0 when off). */
uint32_t bkv__ovl_outstanding(const bkv_sched *s);
/* The batch buffer set s->call holds (0..depth): the speculation and
 * encoder arrays that go with it. */
uint32_t bkv__ovl_cur(const bkv_sched *s);
/* Lane l was appended to by a step that is outstanding. */
int bkv__ovl_uncommitted(const bkv_sched *s, const bkv__lane *l);

/* ---- sched/groups.c --------------------------------------------------------- */

/* The per-group call arrays (n_lanes > 0). BKV_OK or BKV_ENOMEM. */
int bkv__groups_alloc(bkv_sched *s);
void bkv__groups_free(bkv_sched *s);
/* The flat layout's row-sized arrays of the groups (g_kv_indptr and
 * g_kv_first's sizes): overlap's second buffer set has its own. */
int bkv__groups_rows_alloc(bkv_sched *s, int32_t **kv_indptr, int32_t **kv_first);
void bkv__groups_rows_free(bkv_sched *s, int32_t *kv_indptr, int32_t *kv_first);
/* Fill the call's groups from its rows (after the group-0 arrays): each
 * group's slot mapping and, flat, the blocks each row reads, persistent,
 * the tables; the shape's per-group decode context. */
void bkv__batch_groups(bkv_sched *s, bkv_batch *b, const bkv__row *rows, uint32_t n_rows,
		       uint32_t n_decode, bkv_step_shape *shape);

/* ---- sched/inbox.c ---------------------------------------------------------- */

/* The token- and block-sized batch arrays (one set; bkv__bufs). */
int bkv__bufs_alloc(const bkv_allocator *a, bkv__bufs *b, uint32_t tok_cap, uint32_t kv_cap,
		    uint32_t ng);
void bkv__bufs_free(const bkv_allocator *a, bkv__bufs *b);
/* One call's arrays for rc rows and the buffers for tok_cap tokens and
 * kv_cap block entries in ng groups. BKV_OK or BKV_ENOMEM (then free what
 * was taken with bkv__call_arrays_free, which takes a zeroed set too). */
int bkv__call_arrays_alloc(const bkv_allocator *a, size_t rc, uint32_t tok_cap, uint32_t kv_cap,
			   uint32_t ng, bkv__call_arrays *x);
void bkv__call_arrays_free(const bkv_allocator *a, size_t rc, bkv__call_arrays *x);
int bkv__bufs_need(const bkv_sched *s, uint64_t hist, uint32_t *tok, uint32_t *kv);
void bkv__drain(bkv_sched *s, uint64_t now, bkv_step_info *si);

/* ---- sched/req.c ------------------------------------------------------------ */

/* The id map (lock held). */
void bkv__finish_req(bkv_sched *s, bkv__req *r, bkv_finish_reason why, bkv_step_info *si);
void bkv__release_done(bkv_sched *s);
void bkv__req_close_lanes(bkv_sched *s, bkv__req *r);
/* A running request preempted (its lanes closed, or swapped out when
 * swapped): back to the queue at the front of its priority class, its
 * slots given back, counted (sched/plan.c). */
void bkv__req_requeue(bkv_sched *s, bkv__req *r, int swapped, uint64_t now);
void bkv__req_drop_seqs(bkv_sched *s, bkv__req *r);
void bkv__req_free(bkv_sched *s, bkv__req *r);
void bkv__run_compact(bkv_sched *s);
void bkv__lane_done(bkv_sched *s, bkv__lane *l, bkv_finish_reason why, bkv_step_info *si);
bkv__slot *bkv__map_find(const bkv_sched *s, uint64_t id);
void bkv__map_put(bkv__slot *map, uint32_t cap, uint64_t id, bkv__req *r);
void bkv__map_erase(bkv_sched *s, uint64_t id);
int bkv__map_reserve(bkv_sched *s);

/* ---- sched/rows.c: row slots of the persistent layout ---------------------- */

/* Allocate the persistent layout's arrays (cfg.batch_layout PERSISTENT; a
 * no-op when flat). BKV_OK or BKV_ENOMEM. */
int bkv__rows_alloc(bkv_sched *s);
void bkv__rows_free(bkv_sched *s);
/* Lane l's sequence ends or leaves the device (close, drop, swap-out): its
 * row slot, if any, is released and announced as CLOSED in the next call. */
void bkv__slot_release_slow(bkv_sched *s, bkv__lane *l);
static inline void bkv__slot_release(bkv_sched *s, bkv__lane *l)
{
	if (l->row_slot != BKV__SLOT_NONE)
		bkv__slot_release_slow(s, l);
}
/* A call begins: its deltas start with the slots released since the last. */
void bkv__rows_call_begin(bkv_sched *s);
/* Row r of the call: lane l, whose sequence's table is table[0, nb): its
 * slot (taken now if it has none), its table for the host, and the delta
 * the host needs. */
void bkv__row_persist(bkv_sched *s, uint32_t r, bkv__lane *l, const int32_t *table, uint32_t nb);
/* The fused decode pass's dirty rows of rows[] (plan.dec): their deltas. */
void bkv__rows_dirty(bkv_sched *s, const bkv__row *rows);
/* Invariant 33: every held slot's lane holds it, runs and has a device
 * sequence; pending slots are held by none, and only while a step is
 * outstanding; held + free + pending == n_slots. 0 or 1. */
int bkv__rows_check(const bkv_sched *s);
/* The step is rolled back: every delta it sent is void. */
void bkv__rows_rollback(bkv_sched *s);
/* Overlap's rollback: lane l's deltas since its clean mark was pre_clean
 * (and its slot was fresh if pre_fresh) are void. */
void bkv__rows_unsend(bkv_sched *s, bkv__lane *l, uint32_t pre_clean, int pre_fresh);
/* Overlap: the slots released while steps up to `done` were outstanding
 * become free (all with UINT64_MAX). */
void bkv__rows_release_upto(bkv_sched *s, uint64_t done);

/* ---- sched/spec.c: speculative decoding ------------------------------------ */

/* An n-gram lookup table of one lane (sched/spec.c). */
typedef struct bkv__ngram {
	uint64_t owner;        /* request id of the lane it indexes (0: none) */
	uint32_t branch;       /* and its branch */
	uint32_t upto;         /* n-grams ending before this position are in */
	uint64_t used_step;    /* step that last used it */
	uint32_t *pos;         /* [BKV__NGRAM_SLOTS] 1 + the position an
				  n-gram ended at, by hash; 0 empty */
} bkv__ngram;

#define BKV__NGRAM_SLOTS 2048u /* entries of a lane's table (a power of 2) */
#define BKV__NGRAM_MAX 3u      /* longest n-gram matched (then shorter) */

/* Speculative decoding's state, allocated at create when spec_max_k > 0. */
typedef struct bkv__spec {
	uint32_t max_k;        /* cfg.spec_max_k */
	uint32_t row_cap;      /* entries in the per-row arrays (plan.dec's) */
	uint32_t *drafts;      /* [row_cap] drafts of each plan.dec row this
				  step (the batch's row_drafts) */
	int32_t *tokens;       /* [row_cap * (1 + max_k)] the batch's
				  spec_tokens */
	int32_t *accepted;     /* [row_cap] the batch's n_accepted */
	int32_t *st_out;       /* [row_cap * (1 + max_k)] a STATE group's
				  state_out_spec; NULL without one */
	uint32_t n_rows;       /* plan.dec rows with drafts this step */
	uint32_t n_set;        /* entries of drafts[] valid this step */
	uint32_t n_tab;        /* n-gram tables (max_running; 0 for host
				  drafts) */
	bkv__ngram *tab;       /* [n_tab] */
	uint32_t *slots;       /* [n_tab * BKV__NGRAM_SLOTS] their entries */
	uint32_t tab_hand;     /* clock hand for taking a table */
	uint32_t *want;        /* [row_cap] each row's cap on k, then (at
				  commit) the tokens it delivers */
	double g_acc;          /* decide/spec.c: every request's accepted
				  drafts, decayed (the prior) */
	double g_trials;       /* and trials */
	/* the per-row arrays above are set `set` of n_sets, each [set * size]
	 * of these (overlapped scheduling: one set a batch buffer set, so a
	 * step in flight keeps its own; bkv__spec_select) */
	uint32_t n_sets;       /* 1, or depth + 1 with overlap */
	uint32_t *all_drafts;  /* [n_sets * row_cap] */
	uint32_t *all_want;    /* [n_sets * row_cap] */
	int32_t *all_accepted; /* [n_sets * row_cap] */
	int32_t *all_tokens;   /* [n_sets * row_cap * (1 + max_k)] */
	int32_t *all_st_out;   /* [n_sets * row_cap * (1 + max_k)] with a
				  STATE group, else NULL */
} bkv__spec;

/* One step's drafts, as its commit reads them: the current step's (in
 * bkv__spec) or an outstanding two-phase step's (its ticket's). */
typedef struct bkv__spec_step {
	uint32_t *drafts;      /* the step's row_drafts */
	uint32_t *want;        /* its per-row scratch (the cut's count) */
	int32_t *accepted;     /* its n_accepted */
	int32_t *tokens;       /* its spec_tokens */
	const int32_t *qo;     /* its call's qo_indptr */
	uint32_t n_rows;       /* rows with drafts */
	uint32_t n_set;        /* entries of drafts[] valid */
} bkv__spec_step;

/* ---- sched/encoder.c: encoder inputs, their cache and budget ------------- */

int bkv__enc_alloc(bkv_sched *s);
void bkv__enc_free(bkv_sched *s);
/* Submit: BKV_OK, or BKV_EINVAL / BKV_E2BIG naming what is wrong. */
int bkv__enc_request_check(const bkv_sched *s, const bkv_request *q, uint32_t n);
/* Copy q's inputs into r->enc and their ids into the histories. */
void bkv__enc_copy(bkv__req *r, const bkv_request *q, uint32_t hist);
/* The chunk of c tokens from lane l's kv_len, shortened so that every input
 * it reads is cached or encoded in this step (which it schedules). */
uint32_t bkv__enc_cut(bkv_sched *s, bkv__lane *l, uint32_t c);
void bkv__enc_drop(bkv_sched *s, bkv__req *r);
void bkv__enc_step_begin(bkv_sched *s);
void bkv__enc_batch(struct bkv__enc *c, bkv_batch *b);
void bkv__enc_step_end(bkv_sched *s);
void bkv__enc_commit(bkv_sched *s, uint64_t step);
void bkv__enc_rollback(bkv_sched *s);
int bkv__enc_check(const bkv_sched *s);
/* The encoder's counters into st (encoder_runs, encoder_evictions). */
void bkv__enc_stats(const bkv_sched *s, bkv_sched_stats *st);

/* ---- sched/adapters.c: adapters per request, max_adapters per call ------- */

int bkv__adapters_alloc(bkv_sched *s);
void bkv__adapters_free(bkv_sched *s);
/* Admission meets r, whose adapter (nonzero) is not held and no entry is
 * free: 1 when r was set aside (passed; call bkv__adapters_unpass when
 * admission ends), 0 when admission must stop here. */
int bkv__adapter_pass(bkv_sched *s, bkv__req *r, uint64_t now);
void bkv__adapters_unpass(bkv_sched *s);
void bkv__adapter_hold(bkv_sched *s, bkv__req *r);
void bkv__adapter_drop(bkv_sched *s, bkv__req *r);
void bkv__adapters_batch(const bkv_sched *s, bkv_batch *b, const bkv__row *rows, uint32_t n_rows);
int bkv__adapters_check(const bkv_sched *s);

/* Can r join the adapters held now (adapter 0, held, or a free entry)? */
int bkv__adapter_fits(const bkv_sched *s, const bkv__req *r);

int bkv__spec_alloc(bkv_sched *s);
void bkv__spec_free(bkv_sched *s);
/* After planning: give decode rows drafts (never preempting: a row whose
 * drafts find no room goes without). */
void bkv__spec_plan(bkv_sched *s, bkv_step_info *si);
/* A call is built: point its batch at the drafts (rows == plan.dec) or at
 * none. */
void bkv__spec_batch(bkv_sched *s, bkv_batch *b, bkv_step_shape *sh, const bkv__row *rows,
		     uint32_t n);
/* Commit, before the pool's transaction commits: cut each row with drafts
 * to what was accepted. */
void bkv__spec_commit_cut(bkv_sched *s);
/* Commit, after it: deliver the accepted tokens. */
void bkv__spec_commit_deliver(bkv_sched *s, bkv_step_info *si);
/* Rollback: forget the step's drafts. */
void bkv__spec_rollback(bkv_sched *s);
/* Overlap, the provisional commit of the step in flight: 1 when lane l,
 * whose token there is a placeholder, should get no row in the launch
 * planned on it, so that its next row (planned on known tokens) drafts: its
 * last offer found drafts and k drafts at its acceptance a are expected to
 * yield more than the row given up (a + ... + a^k > 1). */
int bkv__spec_hold(const bkv_sched *s, const bkv__lane *l);
/* Overlap: exchange the per-row arrays with the other set (each launch,
 * with the batch buffer sets). */
void bkv__spec_select(bkv_sched *s, uint32_t set);
/* Overlap, a launch: the step's drafts move to *st (its ticket); the
 * current set is then empty. */
void bkv__spec_take(bkv_sched *s, bkv__spec_step *st);
/* Overlap, a completion: the cut and the delivery of an outstanding step's
 * drafts over its rows (as bkv__spec_commit_cut and _deliver). */
void bkv__spec_cut_step(bkv_sched *s, const bkv__spec_step *st, bkv__row *rows, uint32_t n);
void bkv__spec_deliver_step(bkv_sched *s, const bkv__spec_step *st, const bkv__row *rows,
			    uint32_t n, bkv_step_info *si);
/* Invariant 34, between steps: no drafts pending; every n-gram table of a
 * running lane indexes only known tokens; acceptance counts in range. 0 or
 * 1. */
int bkv__spec_check(const bkv_sched *s);

/* ---- sched/plan.c ----------------------------------------------------------- */

uint32_t bkv__add_row(bkv_sched *s, bkv__row *rows, uint32_t *n, bkv__lane *l, uint32_t old,
		      uint32_t hit, int sample);
/* waiting_only: stop at a swapped head (prefill_first's first pass, which
 * plans prefill rows only; a swap-in decodes) and return 1 when it did */
int bkv__plan_admit(bkv_sched *s, uint64_t now, bkv_step_info *si, int waiting_only);
void bkv__plan_continue(bkv_sched *s, uint64_t now, bkv_step_info *si);
uint32_t bkv__plan_decode(bkv_sched *s, uint64_t now, bkv_step_info *si);
void bkv__plan_forks(bkv_sched *s);
void bkv__rows_prune(bkv__row *rows, uint32_t *n);
/* Sequences the running requests' unforked branches will open (invariant
 * 31). */
uint32_t bkv__fork_seqs_count(const bkv_sched *s);

#endif /* BKV_SCHED_H */
