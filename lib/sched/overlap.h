/*
 * overlap.h - overlapped scheduling's state (struct bkv__ovl): the batch
 * buffer sets of the steps in flight, the outstanding steps (tickets), the
 * deferred-release list and the held requests. Owners: sched/overlap.c (the two-phase step,
 * releasing), sched/defer.c (what the rest of the scheduling layer calls
 * while a step is outstanding: deferring, holding, buffer spares, the
 * invariants).
 */
#ifndef BKV_SCHED_OVERLAP_H
#define BKV_SCHED_OVERLAP_H

#include "sched/sched.h"

typedef struct bkv__ovl bkv__ovl;

/* Tickets at most: BKV_OVERLAP_MAX_DEPTH in flight and one planned. */
#define OVL_MAX BKV__OVL_SETS

/* A placeholder inside the library (a lane's history, the pool's token
 * store): row i of the ticket in ring slot k, k < OVL_MAX. The batch gets
 * BKV_TOKEN_PENDING_AT(back, i) instead (bkv__ovl_name). */
#define OVL_PH(k, i) (-2 - (int32_t)(((uint32_t)(k) << 18) | (uint32_t)(i)))
#define OVL_IS_PH(t) ((t) <= -2 && (t) > -2 - OVL_MAX * BKV_TOKEN_PENDING_ROWS)

/* One set of the host call's row- and token-sized arrays (s->call's). */
typedef struct bkv__ovl_set {
	bkv__call_arrays arr;      /* the row- and token-sized arrays */
	uint32_t *row_slot;        /* persistent: [row_cap] (NULL when flat) */
	bkv_table_delta *deltas;   /* persistent: [row_cap + n_slots] */
	int32_t *g_kv_indptr;      /* KV groups: as bkv__call's (NULL without) */
	int32_t *g_kv_first;       /* KV groups: as bkv__call's (NULL without) */
	int32_t *g_state;          /* a STATE group: as bkv__call's (NULL
				      without) */
} bkv__ovl_set;

/* A lane a step appended to, with its length before the step (rollback). */
typedef struct bkv__ovl_undo {
	bkv__lane *lane;           /* the lane (its request outlives the ticket) */
	uint32_t pre_len;          /* kv_len before the step */
	uint32_t post_len;         /* kv_len after the step's plan */
} bkv__ovl_undo;

/* A lane a step sent a table delta to, with what its first one found
 * (persistent layout: the rollback lowers the mark back, sched/rows.c). */
typedef struct bkv__ovl_sent {
	bkv__lane *lane;           /* the lane */
	uint32_t pre_clean;        /* its sequence's clean mark before */
	uint32_t pre_fresh;        /* its slot was fresh before */
} bkv__ovl_sent;

/* An outstanding step. */
typedef struct bkv__ticket {
	uint64_t id;               /* its step number (plan.step_no) */
	uint32_t set;              /* the batch buffer set its call uses */
	int host_done;             /* completed by the host (failed ones wait
				      for the last), or never launched */
	int provisional;           /* its tokens are provisionally committed
				      (a later step was planned on them) */
	int copies;                /* it carried copies: cleared at its commit */
	int held;                  /* its swap-out copies were held apart when
				      the next step was planned: its commit
				      clears the held list (pool/overlap.c) */
	uint32_t mark;             /* transaction queue entries that are its
				      own (counted when the next step's
				      planning begins; before that, 0) */
	bkv__row *rows;            /* [2 * row_cap] its call's rows, in
				      next_tokens order */
	uint32_t n_rows;
	bkv__ovl_undo *undo;       /* [undo_cap] lanes it appended to */
	uint32_t n_undo;
	int32_t *outs;             /* its next_tokens (in its buffer set) */
	bkv__ovl_sent *sent;       /* persistent: [row_cap] lanes its call sent
				      deltas to (NULL when flat) */
	uint32_t n_sent;
	bkv_step_info si;          /* what its plan did */
	bkv__spec_step spec;       /* speculative decoding: its drafts (their
				      lanes wait: ovl_pend 3); zero without */
} bkv__ticket;

struct bkv__ovl {
	uint32_t depth;            /* steps in flight at most (cfg.overlap) */
	uint32_t cap;              /* depth + 1: tickets and buffer sets */
	bkv__ovl_set alt[BKV_OVERLAP_MAX_DEPTH]; /* [depth] the sets s->call
				      does not hold, a ring: launches take
				      them in turn, so the set a launch
				      takes was last used depth + 1
				      launches before (completed by then) */
	uint32_t alt_id[BKV_OVERLAP_MAX_DEPTH]; /* each one's set number */
	uint32_t alt_next;         /* the set the next launch takes */
	uint32_t cur;              /* the set number s->call holds (0..depth):
				      names the speculation and encoder
				      arrays and grp that go with it */
	bkv__ticket t[OVL_MAX];    /* FIFO ring of outstanding steps ([cap]) */
	uint32_t head;             /* index of the oldest */
	uint32_t n_out;            /* outstanding (launched, not completed or
				      failed and not rolled back) */
	int failed;                /* an outstanding step failed: every one
				      rolls back at the last completion */
	uint64_t committed;        /* last step completed or rolled back */
	uint32_t undo_cap;         /* 3 * max_running + 2 * row_cap */
	bkv__lane *def_head;       /* deferred releases (lane.def_next) */
	uint32_t n_def;            /* entries */
	bkv_batch_group grp[OVL_MAX][BKV_MAX_GROUPS]; /* each buffer set's
				      copy of the batch's groups array
				      (s->call.groups is refilled by the
				      next call) */
	bkv__req *hold_head;       /* ended requests to free (req.next), each
				      after the step numbered its hold_tag
				      completes (or when none is outstanding) */
};

#endif /* BKV_SCHED_OVERLAP_H */
