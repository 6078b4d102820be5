/*
 * batch.h - the bkv_batch layout: the one owner of how a step's rows become
 * the host's arrays (sched/batch.c fills them; the fused decode pass writes
 * its rows through the inline writers below while it plans them).
 */
#ifndef BKV_BATCH_H
#define BKV_BATCH_H

#include "sched/sched.h"

/* sched/batch.c: fill batch and shape from rows; returns the call's tokens. Rows
 * [0, first) are in the arrays already (first is s->plan.fill_rows for s->plan.dec,
 * else 0; see bkv__fill below). */
uint32_t bkv__batch_fill(bkv_sched *s, bkv_call_kind kind, bkv__row *rows, uint32_t n_rows,
			 uint32_t n_decode, uint32_t first, bkv_batch *batch, bkv_step_shape *shape);

/* sched/batch.c: drafts[i] more tokens in each of the rows the fused pass
 * wrote (s->plan.fill_rows of them): the arrays moved and rewritten for the
 * drafted rows and the rows after them, the fill_* counts updated. */
void bkv__batch_drafts(bkv_sched *s, const uint32_t *drafts);

#if BKV_DEBUG_LEVEL >= 1
/* sched/batch.c: whether slots[from, to) write a block another sequence or
 * the prefix cache holds (invariant 30). */
int bkv__writes_shared(const bkv_sched *s, const int32_t *slots, uint32_t from, uint32_t to);
#endif

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
	int32_t *tok_ids;   /* s->call.arr.bufs.token_ids */
	int32_t *pos;       /* s->call.arr.bufs.positions */
	int32_t *slots;     /* s->call.arr.bufs.slot_mapping */
	int32_t *kvi;       /* s->call.arr.bufs.kv_indices */
	int32_t *qo;        /* s->call.arr.qo_indptr */
	int32_t *kvp;       /* s->call.arr.kv_indptr */
	int32_t *lpl;       /* s->call.arr.last_page_len */
	int32_t *next;      /* s->call.arr.next_tokens */
	uint8_t *smp;       /* s->call.arr.row_sample */
	uint64_t *rid;      /* s->call.arr.row_req */
	uint32_t *rbr;      /* s->call.arr.row_branch */
	void **rus;         /* s->call.arr.row_user */
	uint32_t shift;     /* log2(block_tokens) */
	uint32_t kv_cap;    /* s->call.arr.bufs.kv_cap; k <= kv_cap (asserted once per
			       pass: k only grows) */
	uint32_t r;         /* rows (= tokens) written */
	uint32_t k;         /* kv_indices entries written */
	uint64_t ctx;       /* sum of the rows' context lengths (end) */
	/* the persistent layout (bkv__fill_persist) */
	uint32_t *rslot;    /* s->call.row_slot */
	const int32_t **rtab; /* s->call.row_tables */
	uint32_t *rtlen;    /* s->call.row_table_len */
	uint32_t *dirty;    /* s->call.dirty: rows whose table the host must be
			       sent (or whose lane has no slot yet) */
	uint32_t n_dirty;   /* entries in dirty */
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
	f->tok_ids = s->call.arr.bufs.token_ids;
	f->pos = s->call.arr.bufs.positions;
	f->slots = s->call.arr.bufs.slot_mapping;
	f->kvi = s->call.arr.bufs.kv_indices;
	f->qo = s->call.arr.qo_indptr;
	f->kvp = s->call.arr.kv_indptr;
	f->lpl = s->call.arr.last_page_len;
	f->next = s->call.arr.next_tokens;
	f->smp = s->call.arr.row_sample;
	f->rid = s->call.arr.row_req;
	f->rbr = s->call.arr.row_branch;
	f->rus = s->call.arr.row_user;
	f->shift = s->bt_shift;
	f->kv_cap = s->call.arr.bufs.kv_cap;
	f->r = f->k = 0;
	f->ctx = 0;
	f->qo[0] = 0;
	f->kvp[0] = 0;
	f->rslot = s->call.row_slot;
	f->rtab = s->call.row_tables;
	f->rtlen = s->call.row_table_len;
	f->dirty = s->call.dirty;
	f->n_dirty = 0;
}

/* bkv__fill_decode in the persistent layout: the row's tokens and its slot,
 * no table copy. A row whose lane has no slot yet, or whose table changed
 * since it was last sent (clean: the sequence's clean mark), goes on the
 * dirty list: the call sends its delta (sched/rows.c, bkv__rows_dirty). */
static inline void bkv__fill_persist(bkv__fill *f, const bkv__req *q, const bkv__lane *l,
				     int32_t token, uint32_t start, const int32_t *table,
				     uint32_t nb, uint32_t off, int32_t slot, uint32_t clean)
{
	const uint32_t r = f->r, rs = l->row_slot;

	f->smp[r] = 1;
	f->rid[r] = q->id;
	f->rbr[r] = l->branch;
	f->rus[r] = q->user;
	f->next[r] = BKV_TOKEN_FAIL;
	f->lpl[r] = (int32_t)off + 1;
	f->tok_ids[r] = token;
	f->pos[r] = (int32_t)start;
	f->slots[r] = slot;
	f->qo[r + 1] = (int32_t)(r + 1);
	f->ctx += start + 1;
	f->rslot[r] = rs;
	if (rs != BKV__SLOT_NONE && !l->fresh && clean >= nb && l->sent_len == nb) {
		f->rtab[rs] = table;
		f->rtlen[rs] = nb;
	} else {
		f->dirty[f->n_dirty++] = r;
	}
	f->r = r + 1;
}

#endif /* BKV_BATCH_H */
