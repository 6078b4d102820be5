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

uint32_t bkv__ovl_cur(const bkv_sched *s)
{
	return s->ovl->cur;
}

/* ---- the buffer sets ------------------------------------------------------ */

static int bufs_smaller(const bkv__bufs *a, const bkv__bufs *b)
{
	return a->tok_cap < b->tok_cap || a->kv_cap < b->kv_cap;
}

/* Lock held (drain): each prepared set replaces a smaller set that no step
 * in flight uses: s->call (this step fills it), and with nothing
 * outstanding the others too. A spare that finds none while steps are
 * outstanding stays prepared (the next launch then declines to overlap);
 * with none outstanding it is not needed. */
uint32_t bkv__ovl_spares(bkv_sched *s, bkv__bufs *old)
{
	bkv__ovl *o = s->ovl;
	uint32_t i, j, n_old = 0;

	for (i = 0; i < o->cap; i++) {
		bkv__bufs *sp = &s->in.spare[i], *dst = NULL;

		if (!sp->tok_cap)
			continue;
		if (bufs_smaller(&s->call.arr.bufs, sp))
			dst = &s->call.arr.bufs;
		for (j = 0; !dst && !o->n_out && j < o->depth; j++)
			if (bufs_smaller(&o->alt[j].arr.bufs, sp))
				dst = &o->alt[j].arr.bufs;
		if (!dst && o->n_out)
			continue; /* a set in flight may want it */
		if (dst) {
			old[n_old++] = *dst;
			*dst = *sp;
		} else {
			old[n_old++] = *sp; /* every set is as large */
		}
		memset(sp, 0, sizeof(*sp));
	}
	return n_old;
}

void bkv__ovl_name(bkv_sched *s, bkv_batch *b)
{
	const bkv__ovl *o = s->ovl;
	const uint32_t here = (o->head + o->n_out) % o->cap; /* its ticket's slot */
	int32_t *tok = s->call.arr.bufs.token_ids, add[OVL_MAX];
	const int32_t *qo = b->qo_indptr;
	uint32_t i, k;

	/* OVL_PH(k, i) + add[k] = BKV_TOKEN_PENDING_AT(back, i): both are
	 * -2 - (high << 18 | i), with high k inside, back - 1 outside */
	for (k = 0; k < o->cap; k++)
		add[k] = (int32_t)((k - ((here + o->cap - k) % o->cap - 1)) << 18);
	for (i = 0; i < b->n_decode_rows; i++) {
		const int32_t t = tok[qo[i]];

		if (OVL_IS_PH(t)) /* (bkv_sched_check: each names a ticket) */
			tok[qo[i]] = t + add[(uint32_t)(-2 - (int64_t)t) >> 18];
	}
}

/* A launched batch's groups array, kept with its buffer set (the call's own
 * is refilled by the next step's fill while this one is in flight). */
const bkv_batch_group *bkv__ovl_groups(bkv_sched *s, const bkv_batch *b)
{
	bkv_batch_group *g = s->ovl->grp[s->ovl->cur];

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
		/* appended by an uncommitted step: at a completion, the length
		 * before the oldest outstanding step that did (com_len); while
		 * planning, this plan may have too: drop (nothing gets
		 * indexed) */
		if (s->plan.open_from)
			drop = 1;
		else
			keep = l->com_len;
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

/* A lane's last ovl_n known tokens are placeholders of provisional
 * outstanding tickets, oldest first. */
static int placeholders_ok(const bkv__ovl *o, const bkv__lane *l)
{
	uint32_t k, at = 0, pos = LANE_KNOWN(l) - l->ovl_n;

	for (k = 0; k < l->ovl_n; k++) {
		const int32_t t = l->tok[pos + k];
		uint32_t slot, age;

		if (!OVL_IS_PH(t))
			return 0;
		slot = (uint32_t)(-2 - (int64_t)t) >> 18;
		age = (slot + o->cap - o->head) % o->cap; /* 0: the oldest */
		if (age >= o->n_out || !o->t[slot].provisional || (k && age <= at))
			return 0;
		at = age;
	}
	return 1;
}

/* 35: the deferred list: each entry's lane has given up its sequence, which
 *     the pool still holds open; its count; nothing deferred while no step
 *     is outstanding.
 * 36: the tickets: at most depth + 1, numbers increasing and past the last
 *     completed step, the provisional ones first (all but the newest may
 *     be), each on its own buffer set; fenced iff outstanding.
 * 37: held requests have ended; a lane counts a placeholder only while a
 *     provisional ticket is outstanding, and waits for its drafts only
 *     while a ticket is. */
int bkv__ovl_check(const bkv_sched *s, uint32_t *n_def)
{
	const bkv__ovl *o = s->ovl;
	const bkv__lane *l;
	const bkv__req *r;
	uint32_t n = 0, k, i, j, sets = 0;
	uint64_t last = 0;
	int prov = 0, unprov = 0;

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
	if (o->n_out > o->cap || s->plan.fenced != (o->n_out > 0))
		return 36;
	for (k = 0; k < o->n_out; k++) {
		const bkv__ticket *t = &o->t[(o->head + k) % o->cap];

		if (t->id <= last || t->id <= o->committed || (t->provisional && unprov) ||
		    t->set >= o->cap || (sets >> t->set & 1))
			return 36;
		last = t->id;
		sets |= 1u << t->set;
		prov |= t->provisional;
		unprov |= !t->provisional;
	}
	for (r = o->hold_head; r; r = r->next)
		if (r->state != BKV__REQ_DONE)
			return 37;
	for (i = 0; i < s->rs.nr_run; i++) {
		r = s->rs.run[i];
		for (j = 0; j < r->n; j++) {
			const bkv__lane *x = &r->lane[j];

			if (x->ovl_pend == 3 ? !o->n_out || x->ovl_n
					     : (x->ovl_pend != 0) != (x->ovl_n != 0) ||
						       (x->ovl_n && !prov) || x->ovl_n > o->depth ||
						       !placeholders_ok(o, x))
				return 37; /* (3: drafts wait for any ticket) */
		}
	}
	return 0;
}
