/*
 * defer.c - overlapped scheduling's leaf: what the rest of the scheduling
 * layer calls while a two-phase step is outstanding (sched/overlap.c owns the
 * steps). A lane's released sequence goes on the deferred list instead of
 * being closed, an ended request is held instead of freed, a larger batch
 * buffer set goes to a set no step in flight uses; and the invariants of all
 * of it (bkv_sched_check 35-37). Nothing here calls back into the other files
 * of the layer; sched/overlap.c releases the lists.
 */
#include "sched/overlap.h"

#include <string.h>

uint32_t bkv__ovl_outstanding(const bkv_sched *s)
{
	return s->ovl ? s->ovl->n_out : 0;
}

int bkv__ovl_uncommitted(const bkv_sched *s, const bkv__lane *l)
{
	return s->ovl && s->ovl->n_out && l->touch_step > s->ovl->committed;
}

/* ---- the two buffer sets -------------------------------------------------- */

static int bufs_smaller(const bkv__bufs *a, const bkv__bufs *b)
{
	return a->tok_cap < b->tok_cap || a->kv_cap < b->kv_cap;
}

static void old_push(bkv__bufs *old, bkv__bufs *old2, const bkv__bufs *b)
{
	if (!old->tok_cap)
		*old = *b;
	else
		*old2 = *b;
}

/* Lock held (drain): each prepared set replaces a smaller set that no step
 * in flight uses; s->call first (this step fills it). A spare that finds
 * none stays prepared (the next launch then declines to overlap). */
void bkv__ovl_spares(bkv_sched *s, bkv__bufs *old, bkv__bufs *old2)
{
	bkv__ovl *o = s->ovl;
	bkv__bufs *sp[2] = {&s->in.spare, &s->in.spare2};
	uint32_t i;

	for (i = 0; i < 2; i++) {
		if (!sp[i]->tok_cap)
			continue;
		if (bufs_smaller(&s->call.arr.bufs, sp[i])) {
			old_push(old, old2, &s->call.arr.bufs);
			s->call.arr.bufs = *sp[i];
		} else if (o->n_out) {
			continue; /* alt is in flight */
		} else if (bufs_smaller(&o->alt.arr.bufs, sp[i])) {
			old_push(old, old2, &o->alt.arr.bufs);
			o->alt.arr.bufs = *sp[i];
		} else {
			old_push(old, old2, sp[i]); /* both sets are as large */
		}
		memset(sp[i], 0, sizeof(*sp[i]));
	}
}

/* A launched batch's groups array, kept with its buffer set (the call's own
 * is refilled by the next step's fill while this one is in flight). */
const bkv_batch_group *bkv__ovl_groups(bkv_sched *s, const bkv_batch *b)
{
	bkv__ovl *o = s->ovl;
	bkv_batch_group *g = o->grp[s->call.arr.next_tokens == o->set0 ? 0 : 1];

	memcpy(g, b->groups, (size_t)b->n_groups * sizeof(*g));
	return g;
}

/* ---- deferred releases ---------------------------------------------------- */

/* The sequence waits with the length whose KV is committed: the lane's own
 * length, unless a step still outstanding appended to it. */
void bkv__ovl_defer(bkv_sched *s, bkv__lane *l, int drop)
{
	bkv__ovl *o = s->ovl;
	uint32_t keep = l->kv_len;

	if (!drop && l->touch_step > o->committed) {
		/* appended by an uncommitted step: at a completion that is the
		 * one still outstanding (its rollback length is pre_len); while
		 * planning, two may have: drop (nothing gets indexed) */
		if (s->plan.open_from)
			drop = 1;
		else
			keep = l->pre_len;
	}
	l->def_seq = l->seq;
	l->def_keep = drop ? UINT32_MAX : keep;
	l->def_tag = s->plan.step_no; /* every outstanding step, at most */
	l->def_next = o->def_head;
	o->def_head = l;
	o->n_def++;
}

/* Ended requests wait for the steps outstanding now (sched/overlap.c frees
 * them once those completed). */
int bkv__ovl_hold(bkv_sched *s, bkv__req *list)
{
	bkv__ovl *o = s->ovl;
	bkv__req *r = list;

	for (;;) {
		r->hold_tag = s->plan.step_no; /* every outstanding step, at most */
		if (!r->next)
			break;
		r = r->next;
	}
	r->next = o->hold_head;
	o->hold_head = list;
	return 1;
}

/* ---- invariants ------------------------------------------------------------ */

/* 35: the deferred list: each entry's lane has given up its sequence, which
 *     the pool still holds open; its count; nothing deferred while no step
 *     is outstanding.
 * 36: the tickets: at most OVL_DEPTH, numbers increasing and past the last
 *     completed step, only the oldest provisional; fenced iff outstanding.
 * 37: held requests have ended; a lane counts a placeholder only while a
 *     provisional ticket is outstanding, and waits for its drafts only
 *     while a ticket is. */
int bkv__ovl_check(const bkv_sched *s, uint32_t *n_def)
{
	const bkv__ovl *o = s->ovl;
	const bkv__lane *l;
	const bkv__req *r;
	uint32_t n = 0, k, i, j;
	uint64_t last = 0;
	int prov = 0;

	*n_def = 0;
	if (!o)
		return 0;
	for (l = o->def_head; l; l = l->def_next) {
		bkv_seq_info si;

		if (l->seq != BKV__SEQ_NONE || bkv_seq_info_get(s->pool, l->def_seq, &si) != BKV_OK ||
		    ++n > o->n_def)
			return 35;
	}
	if (n != o->n_def || (n && !o->n_out && !s->plan.in_step))
		return 35;
	*n_def = n;
	if (o->n_out > OVL_DEPTH || s->plan.fenced != (o->n_out > 0))
		return 36;
	for (k = 0; k < o->n_out; k++) {
		const bkv__ticket *t = &o->t[(o->head + k) % OVL_DEPTH];

		if (t->id <= last || t->id <= o->committed || (t->provisional && k > 0))
			return 36;
		last = t->id;
		prov |= t->provisional;
	}
	for (r = o->hold_head; r; r = r->next)
		if (r->state != BKV__REQ_DONE)
			return 37;
	for (i = 0; i < s->rs.nr_run; i++) {
		r = s->rs.run[i];
		for (j = 0; j < r->n; j++)
			if (r->lane[j].ovl_pend == 3 ? !o->n_out : r->lane[j].ovl_pend && !prov)
				return 37; /* (3: drafts wait for any ticket) */
	}
	return 0;
}
