/*
 * overlap.h - overlapped scheduling's state (struct bkv__ovl): the second
 * batch buffer set, the outstanding steps (tickets), the deferred-release
 * list and the held requests. Owners: sched/overlap.c (the two-phase step,
 * releasing), sched/defer.c (what the rest of the scheduling layer calls
 * while a step is outstanding: deferring, holding, buffer spares, the
 * invariants).
 */
#ifndef BKV_SCHED_OVERLAP_H
#define BKV_SCHED_OVERLAP_H

#include "sched/sched.h"

typedef struct bkv__ovl bkv__ovl;

#define OVL_DEPTH 2 /* steps outstanding at most: one in flight, one planned */

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
	int host_done;             /* completed by the host (failed ones wait
				      for the last), or never launched */
	int provisional;           /* its tokens are provisionally committed
				      (a later step was planned on them) */
	int copies;                /* it carried copies: cleared at its commit */
	int held;                  /* its swap-out copies were held apart when
				      the next step was planned: its commit
				      clears the held list (pool/overlap.c) */
	uint32_t mark;             /* transaction queue entries that are its
				      own or older (set when a later step's
				      planning begins) */
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
	bkv__ovl_set alt;          /* the buffer set s->call does not hold */
	bkv__ticket t[OVL_DEPTH];  /* FIFO ring of outstanding steps */
	uint32_t head;             /* index of the oldest */
	uint32_t n_out;            /* outstanding (launched, not completed or
				      failed and not rolled back) */
	int failed;                /* an outstanding step failed: every one
				      rolls back at the last completion */
	uint64_t committed;        /* last step completed or rolled back */
	uint32_t undo_cap;         /* 3 * max_running + 2 * row_cap */
	bkv__lane *def_head;       /* deferred releases (lane.def_next) */
	uint32_t n_def;            /* entries */
	bkv_batch_group grp[2][BKV_MAX_GROUPS]; /* each buffer set's copy of
				      the batch's groups array (s->call.groups
				      is refilled by the next call) */
	const int32_t *set0;       /* next_tokens of buffer set 0: names the
				      set s->call holds */
	bkv__req *hold_head;       /* ended requests to free (req.next), each
				      after the step numbered its hold_tag
				      completes (or when none is outstanding) */
};

#endif /* BKV_SCHED_OVERLAP_H */
