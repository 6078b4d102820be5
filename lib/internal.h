/*
 * internal.h - what lib/ files share and nobody else sees.
 *
 * Grouped by the file that defines each piece. Cross-file internals are named
 * bkv__name (libuv's convention); file-static helpers carry no prefix. Tests
 * that need internals include this header and link the static library.
 */
#ifndef BKV_INTERNAL_H
#define BKV_INTERNAL_H


#include "pool/pool.h"

/* ---- sched.c, policy.c, batch.c: the scheduler ----------------------------
 * sched.c owns the handle, requests, the inbox, the id map, the step
 * transaction, commit, stats and the checker; policy.c owns the waiting queue
 * (a binary heap), admission, victim choice and the preempt mode; batch.c
 * fills the host's bkv_batch from planned rows. All three see struct bkv_sched.
 * Everything below is touched by the stepping thread only, except the fields
 * marked "lock" (struct bkv_sched.lock) and "atomic". */

#define BKV__SEQ_NONE UINT32_MAX /* lane has no pool sequence */

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
} bkv__lane;

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
	struct bkv__req *next; /* lock: inbox link; then the done list link */
	struct bkv__req *abort_next; /* lock: abort list link */
	size_t alloc_size;     /* bytes of this allocation */
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
	int32_t *token_ids;    /* [tok_cap] */
	int32_t *positions;    /* [tok_cap] */
	int32_t *slot_mapping; /* [tok_cap] */
	int32_t *kv_indices;   /* [kv_cap] */
} bkv__bufs;

/* Buckets of the step-duration histogram (metrics.c), +Inf included. */
#define BKV__STEP_BUCKETS 15

/* The inbox: what bkv_submit and bkv_abort share with the stepping thread
 * (sched/inbox.c). Fields marked "lock" under bkv_sched.in.lock, "atomic"
 * read without it. */
typedef struct bkv__inbox {
	void *lock;            /* pthread_mutex_t, allocated */
	bkv__req *inbox_head;  /* lock: FIFO of submitted requests */
	bkv__req *inbox_tail;  /* lock */
	bkv__req *abort_head;  /* lock: LIFO of requests to abort */
	bkv__slot *map;        /* lock: [map_cap] id -> request */
	uint32_t map_cap;      /* lock: power of two */
	uint32_t map_count;    /* lock: live entries, <= map_cap / 2 */
	bkv__bufs spare;       /* lock: prepared larger buffers (tok_cap 0:
				  none) */
	uint32_t want_tok;     /* lock: tok_cap of spare, else of bufs */
	uint32_t want_kv;      /* lock: kv_cap of spare, else of bufs */
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
	uint32_t stalls;       /* consecutive steps with nothing running, no
				  row, and an allowed admission that took
				  nothing (the progress rule, sched/step.c) */
} bkv__plan;

/* The host call's arrays: the memory behind bkv_batch (sched/batch.c owns
 * the layout). */
typedef struct bkv__call {
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
	uint32_t copies_sent[3]; /* copies of each kind already in a call of
				    this step */
} bkv__call;

/* What the scheduler measures of its own steps, for bkv_sched_stats_get and
 * the metrics exposition to read. */
typedef struct bkv__obs {
	uint64_t step_hist[BKV__STEP_BUCKETS]; /* steps (ok or rolled back)
				  whose duration fell in bucket i (not
				  cumulative; last = +Inf) */
	double step_sum_s;     /* sum of step durations, seconds */
} bkv__obs;

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
	const struct bkv__policy *pol; /* the decisions chosen at create
				  (decide/decide.h) */
	struct bkv__auto *autos; /* the cost-model decisions' state and the
				    default model; owned (decide/) */
	int bad_write;         /* a call wrote into a shared or cached block
				  (bkv_sched_check 30); sticky */
};

/* policy.c: the queue */
void bkv__queue_push(bkv_sched *s, bkv__req *r);
bkv__req *bkv__queue_pop(bkv_sched *s);
void bkv__queue_remove(bkv_sched *s, bkv__req *r);
int bkv__queue_less(const bkv__req *a, const bkv__req *b);
int bkv__queue_check(const bkv_sched *s);
/* The request admission serves next: heap[0], unless the oldest new request
 * of its class has waited past the bypass bound (then that one). Queue not
 * empty. */
bkv__req *bkv__queue_head(const bkv_sched *s, uint64_t now);
/* A request ran from admission to a LENGTH/STOP end: feed run_mean_us. */
void bkv__queue_ran(bkv_sched *s, const bkv__req *r);
/* policy.c: decisions */
int bkv__admit_allowed(const bkv_sched *s, uint64_t now);
bkv__req *bkv__pick_victim(const bkv_sched *s);
int bkv__want_swap(const bkv_sched *s, const bkv__req *r);
uint32_t bkv__chunk_len(const bkv_sched *s, uint32_t remaining);

/* batch.c: fill batch and shape from rows; returns the call's tokens. Rows
 * [0, first) are in the arrays already (first is s->plan.fill_rows for s->plan.dec,
 * else 0; see bkv__fill below). */
uint32_t bkv__batch_fill(bkv_sched *s, bkv_call_kind kind, bkv__row *rows, uint32_t n_rows,
			 uint32_t n_decode, uint32_t first, bkv_batch *batch, bkv_step_shape *shape);

/* Decode rows written into the batch arrays while the step plans them, so
 * that the planning pass, which has the request, lane and block table at
 * hand, also writes each row's batch entries instead of a second pass
 * loading them again. The arrays are copied into locals (a struct whose
 * address never escapes the planning function): stores through them may
 * not alias these fields, so nothing is reloaded per row. A decode row
 * computes one token, so rows written == tokens written. */
/* kv_indices entries allocated past bufs.kv_cap (bkv__fill_decode). */
#define BKV__KV_SLACK 3

typedef struct bkv__fill {
	int32_t *tok_ids;   /* s->call.bufs.token_ids */
	int32_t *pos;       /* s->call.bufs.positions */
	int32_t *slots;     /* s->call.bufs.slot_mapping */
	int32_t *kvi;       /* s->call.bufs.kv_indices */
	int32_t *qo;        /* s->call.qo_indptr */
	int32_t *kvp;       /* s->call.kv_indptr */
	int32_t *lpl;       /* s->call.last_page_len */
	int32_t *next;      /* s->call.next_tokens */
	uint8_t *smp;       /* s->call.row_sample */
	uint64_t *rid;      /* s->call.row_req */
	uint32_t *rbr;      /* s->call.row_branch */
	void **rus;         /* s->call.row_user */
	uint32_t shift;     /* log2(block_tokens) */
	uint32_t kv_cap;    /* s->call.bufs.kv_cap; k <= kv_cap (asserted once per
			       pass: k only grows) */
	uint32_t r;         /* rows (= tokens) written */
	uint32_t k;         /* kv_indices entries written */
	uint64_t ctx;       /* sum of the rows' context lengths (end) */
} bkv__fill;

/* Write decode row f->r: lane l of request q computes position start (its
 * token), its sequence's table is table[0, nb) after the append, and the
 * token went to offset off of block table[nb - 1], token-store index slot
 * (bkv__fill_slot computes both when the caller does not have them). */
static inline void bkv__fill_decode(bkv__fill *f, const bkv__req *q, const bkv__lane *l,
				    int32_t token, uint32_t start, const int32_t *table,
				    uint32_t nb, uint32_t off, int32_t slot)
{
	const uint32_t r = f->r, k = f->k;
	const int32_t *src, *const end = table + nb;
	int32_t *dst;

	f->smp[r] = 1;
	f->rid[r] = q->id;
	f->rbr[r] = l->branch;
	f->rus[r] = q->user;
	f->next[r] = BKV_TOKEN_FAIL;
	f->lpl[r] = (int32_t)off + 1;
	/* four ids per fixed-size copy (no call), rounding nb up: the table's
	 * capacity is a multiple of four (bkv__seq.cap) and kv_indices has
	 * BKV__KV_SLACK entries past kv_cap; the up to three entries written
	 * past the row's end are overwritten by the next row or lie past the
	 * batch's last kv_indptr */
	for (src = table, dst = f->kvi + k; src < end; src += 4, dst += 4)
		memcpy(dst, src, 4 * sizeof(int32_t));
	f->tok_ids[r] = token;
	f->pos[r] = (int32_t)start;
	f->slots[r] = slot;
	f->qo[r + 1] = (int32_t)(r + 1);
	f->kvp[r + 1] = (int32_t)(k + nb);
	f->ctx += start + 1;
	f->r = r + 1;
	f->k = k + nb;
}

/* bkv__fill_decode's off and slot for position start of a table of nb
 * entries (start is in block table[nb - 1]). */
static inline uint32_t bkv__fill_slot(const bkv__fill *f, uint32_t start, const int32_t *table,
				      uint32_t nb, int32_t *slot)
{
	const uint32_t off = start & ((1u << f->shift) - 1);

	*slot = (table[nb - 1] << f->shift) + (int32_t)off;
	return off;
}

/* Start writing this step's decode rows at row 0 (bkv__fill). */
static inline void bkv__fill_begin(bkv_sched *s, bkv__fill *f)
{
	f->tok_ids = s->call.bufs.token_ids;
	f->pos = s->call.bufs.positions;
	f->slots = s->call.bufs.slot_mapping;
	f->kvi = s->call.bufs.kv_indices;
	f->qo = s->call.qo_indptr;
	f->kvp = s->call.kv_indptr;
	f->lpl = s->call.last_page_len;
	f->next = s->call.next_tokens;
	f->smp = s->call.row_sample;
	f->rid = s->call.row_req;
	f->rbr = s->call.row_branch;
	f->rus = s->call.row_user;
	f->shift = s->bt_shift;
	f->kv_cap = s->call.bufs.kv_cap;
	f->r = f->k = 0;
	f->ctx = 0;
	f->qo[0] = 0;
	f->kvp[0] = 0;
}

/* ---- auto.c: decisions from the cost model --------------------------------
 * Admission group 0 (economic order quantity over the observed slot-free
 * rate), token budget 0, the batch cap, packing prefill rows into calls,
 * swap-or-recompute for preempt AUTO, and the default cost model (a
 * calibrated model over seed 000's polynomial, owned here). State in struct
 * bkv__auto (auto.c), reached through bkv_sched.autos. No allocation after
 * create; no scan of the waiting requests. */
typedef struct bkv__auto bkv__auto;
/* At create, after cfg is copied (user: the caller's config, to see which
 * fields were 0). Installs the default cost model into s->cfg.cost. */
int bkv__auto_create(bkv_sched *s, const bkv_sched_config *user);
void bkv__auto_destroy(bkv_sched *s);
int bkv__auto_admit_on(const bkv_sched *s);
/* Once per step, before planning: observe the slots freed since the last
 * admission. */
void bkv__auto_step_begin(bkv_sched *s);
/* Continuous policy with admission group auto: may this step admit? */
int bkv__auto_admit(bkv_sched *s, uint64_t now, uint32_t free_slots);
/* Inside an admitting step: may r join (cap, TPOT target, padding)? */
int bkv__auto_admit_ok(bkv_sched *s, const bkv__req *r);
void bkv__auto_admitted(bkv_sched *s, const bkv__req *r);
void bkv__auto_after_admit(bkv_sched *s);
/* Split host, admission auto: partition the step's n prefill rows into the
 * cheapest prefill calls (sorted by length, contiguous runs). Returns the
 * number of calls; with >= 2, *sorted, *order and *ends describe them (see
 * auto.c). 1: one call over rows as given. */
uint32_t bkv__auto_pack(bkv_sched *s, const bkv__row *rows, uint32_t n, bkv__row **sorted,
			const uint32_t **order, const uint32_t **ends);
/* The step's token budget: fixed when not auto; cap bounds it. */
uint32_t bkv__auto_budget(bkv_sched *s, uint32_t fixed, uint32_t cap);
uint32_t bkv__auto_chunk_fit(bkv_sched *s, uint32_t start, uint32_t c);
/* Preempt AUTO: 1 swap, 0 recompute, -1 no opinion (KV size unknown). */
int bkv__auto_want_swap(const bkv_sched *s, uint32_t kv_len);
/* For tests: the admission group chosen, the batch cap, the slot-free rate
 * (slots per step). */
void bkv__auto_state(const bkv_sched *s, uint32_t *k_star, uint32_t *cap, double *rate);

/* ---- metrics.c: Prometheus exposition ------------------------------------
 * bkv_step reports each step's duration here (a fixed bucket search, no
 * allocation); bkv_sched_metrics_prometheus formats the counters. */
void bkv__step_observe(bkv_sched *s, uint64_t us);

#endif /* BKV_INTERNAL_H */
