/*
 * rows.c - row slots and block-table deltas: the persistent batch layout.
 *
 * In the flat layout every call copies each row's whole block table into
 * kv_indices, so a step costs O(total context). In the persistent layout
 * (bkv_sched_config.batch_layout) a lane keeps one row slot from the call
 * that first schedules it until its sequence ends or leaves the device, and
 * each call carries only what changed in the tables of its rows:
 *
 *   slot  0  [b7 b9 b3 .. b40]      host mirror, row slots x logical blocks
 *   slot  1  [b2 b5]  <- delta {slot 1, start 2, n 1, len 3}: append b8
 *   slot  2  (closed) <- delta {slot 2, CLOSED}
 *
 * What changed is the pool's business: each sequence carries a clean mark,
 * the first table entry that may differ from what the scheduler last sent
 * (bkv__seq.clean, lowered by every write below the table's end). A row's
 * delta is entries [clean, n_blocks) and the length, and sending it raises
 * the mark to n_blocks; a new slot (OPENED) sends its table from 0. Deltas
 * are absolute writes, so a call whose step is rolled back needs no undo on
 * the host: the rollback lowers every mark it raised back to where it was
 * (and forgets the lengths sent), and the next call's deltas cover it all
 * again. A host therefore applies every call's deltas, whatever the call
 * returns. Slots are released when a lane's sequence ends, is closed for
 * recompute, or swaps out, and announced as CLOSED in the next call; the
 * free slots are a stack, so a new row takes the most recently freed slot.
 *
 * Overlapped scheduling (sched/overlap.c): each launch's deltas are relative
 * to the previous launch's (the marks were raised when that one was filled),
 * so a host applies them in launch order. A slot released while a step is
 * outstanding may still be read by it: it waits on the pending list, tagged
 * with the newest step number, and becomes free when the steps up to that
 * one completed (bkv__rows_release_upto). Live lanes hold at most
 * max_running slots and the slots pending were held by lanes live since the
 * oldest outstanding step's plan began: up to depth + 1 plans' admissions
 * on top of the lanes live then, so (depth + 2) x max_running slots never
 * run out. A
 * rollback of the outstanding steps lowers each lane's mark to the lowest
 * it had before any of their sends (bkv__rows_unsend; the pool's
 * bkv__seq_dirty only lowers), so whether a host applied or discarded the
 * failed steps' deltas, the next launch's rewrite every entry they touched.
 *
 * Cost: O(rows + changed entries) per call. A decode row changes its table
 * once every block_tokens tokens (one entry), a prefill chunk once per block
 * it fills; copy-on-write, a cached block replacing a private one, commit's
 * duplicate swap, a truncate and a swap-in rewrite from the entry they touch.
 * Nothing here depends on the context length.
 */
#include "sched/batch.h"

#include <string.h>

int bkv__rows_alloc(bkv_sched *s)
{
	const bkv_allocator *a = &s->alloc;
	uint32_t m = s->cfg.max_running * (s->cfg.overlap ? s->cfg.overlap + 2 : 1), i;
	bkv__call *c = &s->call;

	if (s->cfg.batch_layout != BKV_BATCH_PERSISTENT)
		return BKV_OK;
	c->persistent = 1;
	c->n_slots = m;
	if (s->cfg.overlap) {
		c->slot_pend = bkv__calloc(a, m, sizeof(uint32_t));
		c->slot_pend_tag = bkv__calloc(a, m, sizeof(uint64_t));
		if (!c->slot_pend || !c->slot_pend_tag)
			return BKV_ENOMEM;
	}
	c->row_slot = bkv__calloc(a, s->plan.row_cap, sizeof(uint32_t));
	c->row_tables = bkv__calloc(a, m, sizeof(int32_t *));
	c->row_table_len = bkv__calloc(a, m, sizeof(uint32_t));
	c->slot_lane = bkv__calloc(a, m, sizeof(bkv__lane *));
	c->slot_free = bkv__calloc(a, m, sizeof(uint32_t));
	c->closed = bkv__calloc(a, m, sizeof(uint32_t));
	c->deltas = bkv__calloc(a, (size_t)s->plan.row_cap + m, sizeof(bkv_table_delta));
	c->sent = bkv__calloc(a, s->plan.row_cap, sizeof(bkv__lane *));
	c->dirty = bkv__calloc(a, s->plan.row_cap, sizeof(uint32_t));
	if (!c->row_slot || !c->row_tables || !c->row_table_len || !c->slot_lane ||
	    !c->slot_free || !c->closed || !c->deltas || !c->sent || !c->dirty)
		return BKV_ENOMEM;
	/* slot 0 on top: the first rows take 0, 1, 2, ... */
	for (i = 0; i < m; i++)
		c->slot_free[i] = m - 1 - i;
	c->n_slot_free = m;
	return BKV_OK;
}

void bkv__rows_free(bkv_sched *s)
{
	const bkv_allocator *a = &s->alloc;
	bkv__call *c = &s->call;
	size_t m = c->n_slots, rc = s->plan.row_cap;

	bkv__free(a, c->row_slot, c->row_slot ? rc * sizeof(uint32_t) : 0);
	bkv__free(a, (void *)c->row_tables, c->row_tables ? m * sizeof(int32_t *) : 0);
	bkv__free(a, c->row_table_len, c->row_table_len ? m * sizeof(uint32_t) : 0);
	bkv__free(a, c->slot_lane, c->slot_lane ? m * sizeof(bkv__lane *) : 0);
	bkv__free(a, c->slot_free, c->slot_free ? m * sizeof(uint32_t) : 0);
	bkv__free(a, c->closed, c->closed ? m * sizeof(uint32_t) : 0);
	bkv__free(a, c->deltas, c->deltas ? (rc + m) * sizeof(bkv_table_delta) : 0);
	bkv__free(a, c->sent, c->sent ? rc * sizeof(bkv__lane *) : 0);
	bkv__free(a, c->dirty, c->dirty ? rc * sizeof(uint32_t) : 0);
	bkv__free(a, c->slot_pend, c->slot_pend ? m * sizeof(uint32_t) : 0);
	bkv__free(a, c->slot_pend_tag, c->slot_pend_tag ? m * sizeof(uint64_t) : 0);
}

void bkv__slot_release_slow(bkv_sched *s, bkv__lane *l)
{
	bkv__call *c = &s->call;
	uint32_t slot = l->row_slot;

	BKV_ASSERT(c->persistent && slot < c->n_slots && c->slot_lane[slot] == l);
	BKV_ASSERT(c->n_slot_free + c->n_slot_pend < c->n_slots && c->n_closed < c->n_slots);
	c->slot_lane[slot] = NULL;
	c->row_tables[slot] = NULL;
	c->row_table_len[slot] = 0;
	if (s->plan.fenced) { /* an outstanding step may read it */
		c->slot_pend_tag[c->n_slot_pend] = s->plan.step_no;
		c->slot_pend[c->n_slot_pend++] = slot;
	} else {
		c->slot_free[c->n_slot_free++] = slot;
	}
	c->closed[c->n_closed++] = slot;
	l->row_slot = BKV__SLOT_NONE;
}

void bkv__rows_release_upto(bkv_sched *s, uint64_t done)
{
	bkv__call *c = &s->call;
	uint32_t i, k = 0;

	for (i = 0; i < c->n_slot_pend; i++) { /* in release order */
		if (c->slot_pend_tag[i] <= done) {
			c->slot_free[c->n_slot_free++] = c->slot_pend[i];
		} else {
			c->slot_pend_tag[k] = c->slot_pend_tag[i];
			c->slot_pend[k++] = c->slot_pend[i];
		}
	}
	c->n_slot_pend = k;
}

void bkv__rows_call_begin(bkv_sched *s)
{
	bkv__call *c = &s->call;
	uint32_t i;

	c->n_deltas = 0;
	c->n_delta_blocks = 0;
	for (i = 0; i < c->n_closed; i++) {
		bkv_table_delta *d = &c->deltas[c->n_deltas++];

		d->slot = c->closed[i];
		d->start = d->n = d->len = 0;
		d->flags = BKV_TABLE_CLOSED;
	}
	c->n_closed = 0;
}

/* Take a free slot for l (one exists: slots are held by the running
 * requests' live lanes only, at most max_running, or pending, with overlap
 * at most 2 x max_running more; see the opening comment). */
static uint32_t slot_take(bkv_sched *s, bkv__lane *l)
{
	bkv__call *c = &s->call;
	uint32_t slot;

	BKV_ASSERT(c->n_slot_free > 0);
	slot = c->slot_free[--c->n_slot_free];
	c->slot_lane[slot] = l;
	l->row_slot = slot;
	l->fresh = 1;
	l->sent_len = 0;
	return slot;
}

/* Send l's change: entries [clean, nb) (from 0 for a fresh slot) and the
 * length; remembers what the rollback of this step must undo. */
static void row_delta(bkv_sched *s, bkv__lane *l, const int32_t *table, uint32_t nb,
		      uint32_t clean)
{
	bkv__call *c = &s->call;
	bkv_table_delta *d = &c->deltas[c->n_deltas++];
	uint32_t start = l->fresh ? 0 : BKV_MIN(clean, nb);

	if (l->delta_step != s->plan.step_no) {
		BKV_ASSERT(c->n_sent < s->plan.row_cap);
		l->delta_step = s->plan.step_no;
		l->pre_clean = clean;
		l->pre_fresh = l->fresh;
		c->sent[c->n_sent++] = l;
	}
	BKV_ASSERT(c->n_delta_blocks + (nb - start) <= c->arr.bufs.kv_cap);
	d->slot = l->row_slot;
	d->start = start;
	d->n = nb - start;
	d->len = nb;
	d->flags = l->fresh ? BKV_TABLE_OPENED : 0;
	memcpy(c->arr.bufs.kv_indices + c->n_delta_blocks, table + start,
	       (size_t)(nb - start) * sizeof(int32_t));
	c->n_delta_blocks += nb - start;
	bkv__seq_sent(s->pool, l->seq);
	l->sent_len = nb;
	l->fresh = 0;
}

void bkv__row_persist(bkv_sched *s, uint32_t r, bkv__lane *l, const int32_t *table, uint32_t nb)
{
	bkv__call *c = &s->call;
	uint32_t slot = l->row_slot, clean = bkv__seq_clean(s->pool, l->seq);

	if (slot == BKV__SLOT_NONE)
		slot = slot_take(s, l);
	c->row_slot[r] = slot;
	c->row_tables[slot] = table;
	c->row_table_len[slot] = nb;
	if (l->fresh || clean < nb || l->sent_len != nb)
		row_delta(s, l, table, nb, clean);
}

void bkv__rows_dirty(bkv_sched *s, const bkv__row *rows)
{
	bkv__call *c = &s->call;
	uint32_t i;

	for (i = 0; i < c->n_dirty; i++) {
		uint32_t r = c->dirty[i], nb = 0;
		bkv__lane *l = rows[r].lane;
		const int32_t *table = bkv_seq_blocks(s->pool, l->seq, &nb);

		bkv__row_persist(s, r, l, table, nb);
	}
	c->n_dirty = 0;
}

void bkv__rows_unsend(bkv_sched *s, bkv__lane *l, uint32_t pre_clean, int pre_fresh)
{
	if (l->row_slot == BKV__SLOT_NONE || l->seq == BKV__SEQ_NONE)
		return; /* released since: its slot was announced CLOSED */
	bkv__seq_unsent(s->pool, l->seq, pre_clean);
	l->sent_len = UINT32_MAX;
	l->fresh |= (uint8_t)pre_fresh; /* fresh now: retaken since */
}

void bkv__rows_rollback(bkv_sched *s)
{
	bkv__call *c = &s->call;
	uint32_t i;

	for (i = 0; i < c->n_sent; i++)
		bkv__rows_unsend(s, c->sent[i], c->sent[i]->pre_clean, c->sent[i]->pre_fresh);
	c->n_sent = 0;
}

int bkv__rows_check(const bkv_sched *s)
{
	const bkv__call *c = &s->call;
	uint32_t m = c->n_slots, i, held = 0;

	if (!c->persistent)
		return 0;
	if (c->n_slot_free + c->n_slot_pend > m || c->n_closed > m)
		return 1;
	if (c->n_slot_pend && !s->plan.fenced && !s->plan.in_step)
		return 1; /* nothing pending with nothing outstanding */
	for (i = 0; i < c->n_slot_pend; i++)
		if (c->slot_pend[i] >= m || c->slot_lane[c->slot_pend[i]] ||
		    c->slot_pend_tag[i] > s->plan.step_no)
			return 1;
	for (i = 0; i < m; i++) {
		const bkv__lane *l = c->slot_lane[i];

		if (!l)
			continue;
		held++;
		/* a slot's lane holds it, runs, and has a device sequence (and
		 * is not done, unless provisionally: overlap's placeholder
		 * or drafts) */
		if (l->row_slot != i || l->seq == BKV__SEQ_NONE || (l->done && l->ovl_pend < 2) ||
		    l->req->state != BKV__REQ_RUNNING)
			return 1;
	}
	for (i = 0; i < c->n_slot_free; i++)
		if (c->slot_free[i] >= m || c->slot_lane[c->slot_free[i]])
			return 1;
	return held + c->n_slot_free + c->n_slot_pend == m ? 0 : 1;
}
