/*
 * overlap.c - overlapped scheduling: the two-phase step (bkv_step_launch,
 * bkv_step_complete), which plans step N+1 while the device runs step N -
 * or, at depth D (cfg.overlap), while it runs steps N - D + 1 .. N.
 *
 *   launch N      plan, fill the batch, ops.launch (returns at once)
 *   launch N+1    provisional commit of N: every sampling row's lane counts
 *                 a placeholder token BKV_TOKEN_PENDING(row) as generated
 *                 (a lane whose placeholder is its last token is
 *                 provisionally done: no more rows); then plan N+1 on top,
 *                 with the ordinary planner: its decode rows append the
 *                 placeholders; no preemption, swap-in or fork from
 *                 uncommitted KV (those wait for a launch with nothing in
 *                 flight: the next launch answers BKV_EAGAIN)
 *   complete N    the real tokens replace the placeholders (lane history and
 *                 the pool's token store, before any block holding them can
 *                 be hashed), the provisional commit is undone and N commits
 *                 as bkv_step would: on_token, ends, its share of the pool's
 *                 transaction queue indexed (pool/overlap.c)
 *   complete N+1  rows of requests that ended at N are discarded (counted as
 *                 waste), the rest commits
 *
 * Depth D: each launch provisionally commits the newest outstanding step
 * (the older ones were at the launches after them), so a lane counts one
 * placeholder per outstanding step it samples in, oldest first (ovl_n).
 * Inside the library a placeholder names its ticket's ring slot and row
 * (OVL_PH); the launch names it for the host by how many launches back its
 * step was (bkv__ovl_name). The oldest step's commit writes its tokens
 * where its placeholders were and commits them as bkv_step would, the
 * newer placeholders staying counted above them.
 *
 * D + 1 sets of batch buffers (s->call and the alt ring) take turns, so the
 * arrays of the steps in flight stay valid while the next is filled: a
 * launch plans into a set no outstanding step uses; a larger set prepared
 * by bkv_submit goes to a set not in flight. Nothing is allocated per
 * step.
 *
 * Memory: while a step is outstanding (s->plan.fenced), a sequence released
 * by an end or an abort is not closed: the lane moves it to the deferred
 * list (intrusive through the lanes), with the length whose KV is committed,
 * and requests that ended are held, not freed (tickets name their lanes).
 * Both are released once every step outstanding at the time has completed,
 * so no block an outstanding step reads or writes is reused before then.
 *
 * Failure: a failed completion or launch fails every outstanding step; the
 * host completes each, and the last completion rolls all of them back,
 * newest first, to the state before the oldest: lengths, the provisional
 * commit, the transaction (nothing of theirs indexed), and in the persistent
 * layout the clean marks of the lanes their deltas went to (each ticket's
 * sent list), so the next launch rewrites whatever their deltas wrote.
 *
 * Persistent layout: row_slot and the delta array alternate with the other
 * buffers; a slot released while a step is outstanding waits with the
 * deferred sequences (sched/rows.c's pending list, freed by release_after).
 *
 * KV groups: the groups' row arrays (and a STATE group's state units)
 * alternate too, and a step committed while a later one is outstanding
 * trims each window or chunked lane it appended to only up to the
 * sequence's committed length (trim_committed), so no block an outstanding
 * step reads, or their rollback needs, is released. A STATE group's state
 * is written out of place: a step planned on steps in flight reads the unit
 * the newest of them writes and writes another (state_shift); the state the
 * oldest started from and the ends of the others are kept until the
 * commits pass them (trim_committed commits the state at the committed
 * length, pool/state_mid.c), so a rollback finds whichever it needs.
 */
#include "sched/batch.h"
#include "decide/decide.h"
#include "pool/overlap.h"
#include "sched/overlap.h"

#include <string.h>


/* ---- create / destroy ---------------------------------------------------- */

static void set_free(bkv_sched *s, bkv__ovl_set *x)
{
	const bkv_allocator *a = &s->alloc;
	size_t rc = s->plan.row_cap;

	bkv__call_arrays_free(a, rc, &x->arr);
	bkv__free(a, x->row_slot, x->row_slot ? rc * sizeof(uint32_t) : 0);
	bkv__free(a, x->deltas,
		  x->deltas ? (rc + s->call.n_slots) * sizeof(bkv_table_delta) : 0);
	if (s->call.n_lanes)
		bkv__groups_rows_free(s, x->g_kv_indptr, x->g_kv_first);
	bkv__free(a, x->g_state, x->g_state ? 2 * rc * sizeof(int32_t) : 0);
	memset(x, 0, sizeof(*x));
}

static int set_alloc(bkv_sched *s, bkv__ovl_set *x)
{
	const bkv_allocator *a = &s->alloc;
	size_t rc = s->plan.row_cap;

	if (s->call.persistent) {
		x->row_slot = bkv__calloc(a, rc, sizeof(uint32_t));
		x->deltas = bkv__calloc(a, rc + s->call.n_slots, sizeof(bkv_table_delta));
		if (!x->row_slot || !x->deltas)
			return BKV_ENOMEM;
	}
	if (s->call.n_lanes && bkv__groups_rows_alloc(s, &x->g_kv_indptr, &x->g_kv_first) != BKV_OK)
		return BKV_ENOMEM;
	if (s->call.has_state && !(x->g_state = bkv__calloc(a, 2 * rc, sizeof(int32_t))))
		return BKV_ENOMEM;
	return bkv__call_arrays_alloc(a, rc, s->call.arr.bufs.tok_cap, s->call.arr.bufs.kv_cap,
				      s->call.arr.bufs.ng, &x->arr);
}

int bkv__ovl_create(bkv_sched *s)
{
	bkv__ovl *o;
	uint32_t i;

	if (!s->cfg.overlap)
		return BKV_OK;
	o = bkv__calloc(&s->alloc, 1, sizeof(*o));
	if (!o)
		return BKV_ENOMEM;
	s->ovl = o;
	o->depth = s->cfg.overlap;
	o->cap = o->depth + 1;
	o->undo_cap = 3 * s->cfg.max_running + 2 * s->plan.row_cap; /* the
			touched list and the fused pass's rows (one plan's) */
	for (i = 0; i < o->cap; i++) {
		o->t[i].rows = bkv__calloc(&s->alloc, 2 * (size_t)s->plan.row_cap, sizeof(bkv__row));
		o->t[i].undo = bkv__calloc(&s->alloc, o->undo_cap, sizeof(bkv__ovl_undo));
		if (!o->t[i].rows || !o->t[i].undo)
			return BKV_ENOMEM;
		if (s->call.persistent &&
		    !(o->t[i].sent = bkv__calloc(&s->alloc, s->plan.row_cap, sizeof(bkv__ovl_sent))))
			return BKV_ENOMEM;
	}
	for (i = 0; i < o->depth; i++) {
		o->alt_id[i] = i + 1;
		if (set_alloc(s, &o->alt[i]) != BKV_OK)
			return BKV_ENOMEM;
	}
	return BKV_OK;
}

static void release_deferred(bkv_sched *s);
static void free_held(bkv_sched *s);
static void rollback_all(bkv_sched *s, uint64_t now, bkv_step_info *si);

void bkv__ovl_destroy(bkv_sched *s)
{
	bkv__ovl *o = s->ovl;
	bkv__lane *l;
	bkv_step_info si;
	uint32_t i;

	if (!o)
		return;
	for (l = o->def_head; l; l = l->def_next)
		l->def_keep = UINT32_MAX; /* drop: nothing is committed any more */
	if (o->n_out) { /* steps the host never completed: as if they failed,
			   so the pool's step transaction closes (aborted)
			   and nothing they computed is indexed */
		memset(&si, 0, sizeof(si));
		rollback_all(s, 0, &si);
	}
	release_deferred(s);
	free_held(s);
	for (i = 0; i < o->cap; i++) {
		bkv__free(&s->alloc, o->t[i].rows, 2 * (size_t)s->plan.row_cap * sizeof(bkv__row));
		bkv__free(&s->alloc, o->t[i].undo, (size_t)o->undo_cap * sizeof(bkv__ovl_undo));
		bkv__free(&s->alloc, o->t[i].sent,
			  o->t[i].sent ? s->plan.row_cap * sizeof(bkv__ovl_sent) : 0);
	}
	for (i = 0; i < o->depth; i++)
		set_free(s, &o->alt[i]);
	bkv__free(&s->alloc, o, sizeof(*o));
	s->ovl = NULL;
}

/* ---- the buffer sets ------------------------------------------------------ */

/* Exchange s->call's arrays with alt[k]'s. */
static void set_swap(bkv_sched *s, uint32_t k)
{
	bkv__ovl *o = s->ovl;
	bkv__ovl_set *x = &o->alt[k], t = *x;
	bkv__call *c = &s->call;
	uint32_t id = o->alt_id[k];

	x->arr = c->arr;
	x->row_slot = c->row_slot;
	x->deltas = c->deltas;
	x->g_kv_indptr = c->g_kv_indptr;
	x->g_kv_first = c->g_kv_first;
	x->g_state = c->g_state;
	c->arr = t.arr;
	c->row_slot = t.row_slot;
	c->deltas = t.deltas;
	c->g_kv_indptr = t.g_kv_indptr;
	c->g_kv_first = t.g_kv_first;
	c->g_state = t.g_state;
	o->alt_id[k] = o->cur;
	o->cur = id;
}

static int set_busy(const bkv__ovl *o, uint32_t set)
{
	uint32_t k;

	for (k = 0; k < o->n_out; k++)
		if (o->t[(o->head + k) % o->cap].set == set)
			return 1;
	return 0;
}

/* Before a launch plans: s->call holds a set no outstanding step uses
 * (there are depth + 1 sets and at most depth outstanding), and the
 * speculation arrays follow it. */
static void set_take(bkv_sched *s)
{
	bkv__ovl *o = s->ovl;
	uint32_t k;

	if (set_busy(o, o->cur)) {
		for (k = 0; k < o->depth && set_busy(o, o->alt_id[k]); k++)
			;
		BKV_ASSERT(k < o->depth);
		set_swap(s, k);
	}
	if (s->spec)
		bkv__spec_select(s, o->cur);
}

/* ---- deferred releases (sched/defer.c fills the lists) -------------------- */

/* Close (after truncating to the committed length) or drop the deferred
 * sequences whose tag is at most done (all: UINT64_MAX). */
static void release_deferred_upto(bkv_sched *s, uint64_t done)
{
	bkv__ovl *o = s->ovl;
	bkv__lane *l, *next, **link = &o->def_head;

	for (l = o->def_head; l; l = next) {
		next = l->def_next;
		if (l->def_tag > done) {
			link = &l->def_next;
			continue;
		}
		*link = next;
		o->n_def--;
		l->def_next = NULL;
		bkv__seq_end(s, l->def_seq, l->def_keep == UINT32_MAX, l->def_keep);
		l->def_seq = BKV__SEQ_NONE;
	}
}

static void release_deferred(bkv_sched *s)
{
	release_deferred_upto(s, UINT64_MAX);
}

static void free_held_upto(bkv_sched *s, uint64_t done)
{
	bkv__req *r, *next, **link = &s->ovl->hold_head;

	for (r = s->ovl->hold_head; r; r = next) {
		next = r->next;
		if (r->hold_tag > done) {
			link = &r->next;
			continue;
		}
		*link = next;
		bkv__req_free(s, r);
	}
}

static void free_held(bkv_sched *s)
{
	free_held_upto(s, UINT64_MAX);
}

/* After step `done` completed: release what no outstanding step can read
 * (everything once none is outstanding). Deferred sequences first: a held
 * request's lanes may be among them. */
static void release_after(bkv_sched *s, uint64_t done)
{
	bkv__ovl *o = s->ovl;

	if (!o->n_out)
		done = UINT64_MAX;
	if (o->def_head)
		release_deferred_upto(s, done);
	if (o->hold_head)
		free_held_upto(s, done);
	if (s->call.n_slot_pend)
		bkv__rows_release_upto(s, done);
}

/* ---- provisional commit --------------------------------------------------- */

/* A later step is planned on t's tokens: each sampling row's lane counts a
 * placeholder for its token (above those of older outstanding steps). */
static uint32_t provision(bkv_sched *s, bkv__ticket *t)
{
	const uint32_t slot = (uint32_t)(t - s->ovl->t);
	uint32_t i, waits = 0;

	for (i = 0; i < t->spec.n_set && i < t->n_rows; i++) /* rows with drafts */
		waits += t->rows[i].lane->ovl_pend == 3 && REQ_IS_RUNNING(t->rows[i].lane->req);
	for (i = 0; i < t->n_rows; i++) {
		bkv__lane *l = t->rows[i].lane;
		bkv__req *r = l->req;

		if (!t->rows[i].sample || !REQ_IS_RUNNING(r) || l->done)
			continue;
		BKV_ASSERT(l->ovl_pend < 2 && l->kv_len == LANE_KNOWN(l));
		l->tok[LANE_KNOWN(l)] = OVL_PH(slot, i);
		l->n_gen++;
		if (!l->ovl_n++)
			l->ovl_dec = l->decoding;
		l->decoding = 1;
		l->ovl_pend = 1;
		if (l->n_gen >= r->max_new) { /* its last token: no more rows */
			l->ovl_pend = 2;
			l->done = 1;
			l->decoding = 0;
		} else if (s->spec && bkv__spec_hold(s, l)) {
			/* speculation: no row on the placeholder, so that its
			 * next row, on known tokens, drafts (counted) */
			l->ovl_pend = 2;
			l->done = 1;
			l->decoding = 0;
			waits++;
		}
	}
	t->provisional = 1;
	s->stats.overlap_spec_waits += waits;
	return waits;
}

/* Speculative decoding: a row with drafts delivers 1 to k + 1 tokens, known
 * only at its completion, so no later row of its lane can be planned before
 * (its position is unknown): from the launch until then the lane is set
 * aside as provisionally done (ovl_pend 3, no placeholder). */
static void spec_wait(bkv__ticket *t)
{
	uint32_t i;

	for (i = 0; i < t->spec.n_set && i < t->n_rows; i++) {
		bkv__lane *l = t->rows[i].lane;

		if (!t->spec.drafts[i] || !REQ_IS_RUNNING(l->req) || l->done)
			continue;
		BKV_ASSERT(!l->ovl_pend && l->decoding);
		l->ovl_dec = l->decoding;
		l->decoding = 0;
		l->done = 1;
		l->ovl_pend = 3;
	}
}

/* t completed or rolls back: its lanes with drafts are live again (unless
 * an abort ended them meanwhile). */
static void spec_unwait(bkv__ticket *t)
{
	uint32_t i;

	for (i = 0; i < t->spec.n_set && i < t->n_rows; i++) {
		bkv__lane *l = t->rows[i].lane;

		if (!t->spec.drafts[i] || l->ovl_pend != 3)
			continue;
		l->ovl_pend = 0;
		if (!REQ_IS_RUNNING(l->req))
			continue;
		l->done = 0;
		l->decoding = l->ovl_dec;
	}
}

/* A lane whose request ended meanwhile (an abort) forgets its
 * placeholders. */
static int ended_meanwhile(bkv__lane *l)
{
	if (REQ_IS_RUNNING(l->req))
		return 0;
	l->ovl_pend = 0;
	l->ovl_n = 0;
	return 1;
}

/* A rollback: undo t's provisional commit (each lane's placeholders go, in
 * any order; the last one gone restores the lane). */
static void unprovision(bkv__ticket *t)
{
	uint32_t i;

	for (i = 0; i < t->n_rows; i++) {
		bkv__lane *l = t->rows[i].lane;

		if (!t->rows[i].sample || !l->ovl_n || ended_meanwhile(l))
			continue;
		l->n_gen--;
		if (--l->ovl_n)
			continue;
		if (l->ovl_pend == 2)
			l->done = 0;
		l->decoding = l->ovl_dec;
		l->ovl_pend = 0;
	}
	t->provisional = 0;
}

/* t, the oldest, completes: each of its lanes' oldest placeholder gets its
 * token (history and, where a later row appended it, the pool's token
 * store), and the lane looks as if nothing were provisional, so that
 * commit_rows commits the token as bkv_step would; reprovision then counts
 * the newer placeholders again. */
static int unprovision_oldest(bkv_sched *s, bkv__ticket *t, const int32_t *outs)
{
	uint32_t i;
	int left = 0;

	for (i = 0; i < t->n_rows; i++) {
		bkv__lane *l = t->rows[i].lane;
		uint32_t pos;

		if (!t->rows[i].sample || !l->ovl_n || ended_meanwhile(l))
			continue;
		pos = LANE_KNOWN(l) - l->ovl_n;
		l->tok[pos] = outs[i];
		if (l->seq != BKV__SEQ_NONE && l->kv_len > pos)
			bkv__pool_seq_set_token(s->pool, l->seq, pos, outs[i]);
		l->n_gen -= l->ovl_n--;
		left |= l->ovl_n;
		l->ovl_mode = l->ovl_pend;
		if (l->ovl_pend == 2)
			l->done = 0;
		l->decoding = l->ovl_dec;
		l->ovl_pend = 0;
	}
	t->provisional = 0;
	return left;
}

/* After t's commit: the newer placeholders of its lanes count again, above
 * the token just committed; a lane that ended drops them (their rows are
 * waste). */
static void reprovision(bkv__ticket *t)
{
	uint32_t i;

	for (i = 0; i < t->n_rows; i++) {
		bkv__lane *l = t->rows[i].lane;

		if (!t->rows[i].sample || !l->ovl_n || l->ovl_pend)
			continue;
		if (!REQ_IS_RUNNING(l->req) || l->done) {
			l->ovl_n = 0;
			continue;
		}
		l->n_gen += l->ovl_n;
		l->ovl_dec = l->decoding; /* 1: the committed token was sampled */
		l->decoding = 1;
		l->ovl_pend = l->ovl_mode;
		if (l->ovl_pend == 2) {
			l->done = 1;
			l->decoding = 0;
		}
	}
}

/* A STATE group, a step planned while t is in flight: the state each of
 * t's sequences gets from t (its pending scratch unit) is the input of the
 * new step, which writes a second unit; the state t started from stays
 * for a rollback of both (pool/overlap.c). */
static void state_shift(bkv_sched *s, const bkv__ticket *t)
{
	uint32_t i;

	for (i = 0; i < t->n_undo; i++) {
		const bkv__lane *l = t->undo[i].lane;

		if (REQ_IS_RUNNING(l->req) && l->seq != BKV__SEQ_NONE)
			bkv__pool_seq_state_shift(s->pool, l->seq);
	}
}

/* ---- launch ---------------------------------------------------------------- */

/* May a step be planned while one is in flight? Not when the plan would need
 * that step's results or a known order of its copies. */
static int overlap_ok(bkv_sched *s)
{
	int spare;
	uint32_t i;

	if (s->plan.need_sync) {
		s->plan.need_sync = 0;
		return 0;
	}
	if (!bkv__pool_copies_holdable(s->pool) || s->plan.n_swap_pend)
		return 0; /* only host-cache demotions may be pending: held */
	LOCK(s);
	for (i = 0, spare = 0; i < s->ovl->cap; i++)
		spare |= s->in.spare[i].tok_cap != 0;
	UNLOCK(s);
	return !spare;
}

static bkv__ticket *oldest(bkv__ovl *o)
{
	return &o->t[o->head];
}

static bkv__ticket *newest(bkv__ovl *o)
{
	return &o->t[(o->head + o->n_out - 1) % o->cap];
}

/* The launch plans on top of the newest outstanding step: provisionally
 * commit it, count its share of the transaction queue, hold its host-cache
 * demotions apart (bkv__pool_copies_hold did) and, with a STATE group,
 * promote the states it writes. Returns the lanes set aside to draft. */
static uint32_t plan_on_top(bkv_sched *s)
{
	bkv__ovl *o = s->ovl;
	bkv__ticket *prev = newest(o);
	uint32_t k, older = 0, waits = 0;

	prev->held = prev->copies;
	if (!prev->provisional)
		waits = provision(s, prev);
	for (k = 0; k + 1 < o->n_out; k++)
		older += o->t[(o->head + k) % o->cap].mark;
	prev->mark = bkv__pool_txn_compact(s->pool) - older; /* its entries */
	if (s->call.has_state)
		state_shift(s, prev);
	return waits;
}

/* Record the planned step in the next ticket. The undo list names lanes,
 * and a lane outlives its sequence: a record is the rollback length of the
 * sequence the lane holds now, so a lane that holds none of a running
 * request (preempted, ended, or a failed admission in this planning) gets
 * none - there is nothing of the step to undo, and a later step may give
 * the lane a new sequence (a request preempted at N, with nothing in
 * flight, is readmitted at N + 1), which the stale length, applied by
 * rollback_all after N + 1's, would set longer than it is. */
static int undo_live(const bkv__lane *l)
{
	return REQ_IS_RUNNING(l->req) && l->seq != BKV__SEQ_NONE;
}

/* One undo record: the lane's rollback length, and its committed length
 * when no older outstanding step appended to it (defer, trim_committed). */
static void undo_add(bkv__ticket *t, bkv__lane *l, uint64_t committed)
{
	bkv__ovl_undo *u = &t->undo[t->n_undo++];

	u->lane = l;
	u->pre_len = l->pre_len;
	u->post_len = l->kv_len;
	if (l->ovl_last <= committed)
		l->com_len = l->pre_len;
	l->ovl_last = t->id;
}

static bkv__ticket *ticket_push(bkv_sched *s, const bkv_step_info *si)
{
	bkv__ovl *o = s->ovl;
	bkv__ticket *t = &o->t[(o->head + o->n_out) % o->cap];
	uint32_t i;

	BKV_ASSERT(o->n_out < o->cap);
	o->n_out++;
	t->id = s->plan.step_no;
	t->set = o->cur;
	t->host_done = 0;
	t->provisional = 0;
	t->copies = bkv__pool_copies_pending(s->pool) != 0;
	t->held = 0;
	t->mark = 0;
	t->n_rows = s->plan.n_dec;
	memcpy(t->rows, s->plan.dec, (size_t)s->plan.n_dec * sizeof(bkv__row));
	t->n_undo = 0;
	for (i = 0; i < s->plan.n_touched; i++)
		if (undo_live(s->plan.touched[i]))
			undo_add(t, s->plan.touched[i], o->committed);
	for (i = 0; i < s->plan.n_dec; i++) /* the fused pass's lanes (a lane
						  the general path touched is
						  listed twice: harmless) */
		if (undo_live(s->plan.dec[i].lane))
			undo_add(t, s->plan.dec[i].lane, o->committed);
	BKV_ASSERT(t->n_undo <= o->undo_cap);
	t->outs = s->call.arr.next_tokens;
	t->si = *si;
	t->n_sent = 0;
	for (i = 0; t->sent && i < s->call.n_sent; i++) { /* persistent */
		bkv__lane *l = s->call.sent[i];

		t->sent[t->n_sent].lane = l;
		t->sent[t->n_sent].pre_clean = l->pre_clean;
		t->sent[t->n_sent++].pre_fresh = l->pre_fresh;
	}
	memset(&t->spec, 0, sizeof(t->spec));
	if (s->spec) {
		bkv__spec_take(s, &t->spec);
		spec_wait(t);
	}
	return t;
}

int bkv_step_launch(bkv_sched *s, uint64_t *ticket, bkv_step_info *info)
{
	bkv__ovl *o;
	bkv_step_info si;
	uint64_t now;
	int rc, called = 0;
	uint32_t n_out, waits = 0;

	if (!s || !ticket)
		return BKV_EINVAL;
	o = s->ovl;
	if (!o || s->plan.in_step || o->failed || o->n_out >= o->cap)
		return BKV_ESTATE;
	*ticket = 0;
	if (s->kv_released) { /* nothing is outstanding (release refused it) */
		BKV_ASSERT(!o->n_out);
		return bkv__released_step(s, info);
	}
	n_out = o->n_out;
	if (n_out && (!overlap_ok(s) || bkv__pool_copies_hold(s->pool) != BKV_OK)) {
		s->stats.overlap_syncs++;
		return BKV_EAGAIN;
	}
	if (!n_out)
		s->plan.need_sync = 0;
	s->plan.in_step = 1;
	memset(&si, 0, sizeof(si));
	now = bkv__clock_us(s);
	bkv__pool_state_fence(s->pool, n_out > 0);
	if (n_out)
		waits = plan_on_top(s);
	set_take(s); /* the sets of the steps in flight stay untouched */
	s->plan.open_from = n_out ? oldest(o)->id : 0;
	s->plan.fenced = n_out > 0;
	bkv__step_plan(s, now, &si, n_out == 0);
	s->plan.launching = 1;
	rc = bkv__step_run_calls(s, &si, &called);
	s->plan.launching = 0;
	bkv__pool_state_fence(s->pool, 0);
	s->plan.open_from = 0;
	if (!called) { /* nothing to compute */
		if (!n_out) { /* as bkv_step's empty step */
			bkv__pool_txn_commit(s->pool);
			if (s->cn)
				bkv__cn_after_commit(s, s->plan.step_no);
			bkv__step_stats(s, &si);
		} else if (waits) { /* lanes wait for their drafts' verdict */
			s->stats.overlap_spec_idle++;
		}
	} else if (rc != BKV_OK) {
		if (!n_out) {
			bkv__step_rollback(s, now, &si);
			o->committed = s->plan.step_no;
		} else { /* rolled back with the steps outstanding */
			bkv__ticket *t = ticket_push(s, &si);

			t->host_done = 1; /* never launched: nothing to complete */
			o->failed = 1;
		}
	} else {
		*ticket = ticket_push(s, &si)->id;
		if (n_out)
			s->stats.overlap_steps++;
	}
	s->plan.fenced = o->n_out > 0;
	/* before the step's ended requests are freed (with nothing outstanding
	 * they are freed at once): their lanes may be deferred */
	if (!o->n_out)
		release_after(s, s->plan.step_no);
	bkv__step_end(s, now, &si, info, 0);
	s->plan.in_step = 0;
	return rc;
}

/* ---- complete ---------------------------------------------------------------- */

/* Roll back every outstanding step (none is in flight any more), newest
 * first, to the state before the oldest. */
static void rollback_all(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	bkv__ovl *o = s->ovl;
	uint32_t k, i;

	for (k = 0; k < o->n_out; k++) {
		bkv__ticket *t = &o->t[(o->head + k) % o->cap];

		spec_unwait(t); /* before the truncation: its drafts go too */
		if (t->provisional)
			unprovision(t);
	}
	for (k = o->n_out; k-- > 0;) {
		bkv__ticket *t = &o->t[(o->head + k) % o->cap];

		for (i = t->n_undo; i-- > 0;) {
			bkv__lane *l = t->undo[i].lane;

			if (!REQ_IS_RUNNING(l->req) || l->done || l->seq == BKV__SEQ_NONE)
				continue;
			if (l->kv_len != t->undo[i].pre_len) {
				int rc = bkv_seq_truncate(s->pool, l->seq, t->undo[i].pre_len);

				BKV_ASSERT(rc == BKV_OK); /* the record is the lane's
							     sequence's (ticket_push) */
				(void)rc;
			}
			l->kv_len = t->undo[i].pre_len;
		}
		for (i = 0; i < t->n_sent; i++) /* persistent: its deltas are void */
			bkv__rows_unsend(s, t->sent[i].lane, t->sent[i].pre_clean,
					 (int)t->sent[i].pre_fresh);
		s->stats.failed_steps++;
		if (t->id > o->committed)
			o->committed = t->id;
	}
	/* the deferred sequences, which the truncates above skip, go back to
	 * their committed lengths (or go) before the abort, as every other
	 * sequence did: a STATE group's states must not outlive the step
	 * (pool/state.c) */
	release_deferred(s);
	bkv__pool_txn_abort(s->pool);
	if (s->cn)
		bkv__cn_rollback(s);
	bkv__enc_rollback(s);
	bkv__pool_copies_release_held(s->pool, 0); /* the failed steps' demotions */
	bkv__swaps_to_recompute(s, now);
	o->n_out = 0;
	o->head = 0;
	o->failed = 0;
	s->plan.fenced = 0;
	si->rows = si->prefill_tokens = si->decode_tokens = si->hit_tokens = 0;
	si->prefill_calls = si->decode_calls = 0;
}

/* KV groups, t (the oldest) committed while later steps are outstanding
 * (the pool's split commit trims nothing): each window or chunked lane of a
 * sequence t appended to releases what its committed length (com_len when
 * a later step appended to it too) no longer reads, so every block a later
 * step reads, or their rollback needs, stays; a STATE group's state at that
 * length becomes the committed one. */
static void trim_committed(bkv_sched *s, const bkv__ticket *t)
{
	uint32_t i;

	for (i = 0; i < t->n_undo; i++) {
		const bkv__lane *l = t->undo[i].lane;

		if (!REQ_IS_RUNNING(l->req) || l->seq == BKV__SEQ_NONE)
			continue;
		bkv__pool_seq_commit_to(s->pool, l->seq,
					l->ovl_last > t->id ? t->undo[i].post_len : l->kv_len);
	}
}

/* Commit the oldest outstanding step t with its sampled tokens. */
static void commit_oldest(bkv_sched *s, bkv__ticket *t, bkv_step_info *si)
{
	bkv__ovl *o = s->ovl;
	int32_t *outs = t->outs; /* the library's array */
	uint64_t waste = 0;
	uint32_t i;
	int left = 0;

	for (i = 0; i < t->n_rows; i++) /* the host's own negative ids */
		if (outs[i] < BKV_TOKEN_FAIL)
			outs[i] = BKV_TOKEN_FAIL;
	o->head = (o->head + 1) % o->cap;
	o->n_out--;
	s->plan.fenced = o->n_out > 0;
	spec_unwait(t);
	if (t->provisional) /* later steps' placeholders too */
		left = unprovision_oldest(s, t, outs);
	for (i = 0; i < t->n_rows; i++) {
		bkv__lane *l = t->rows[i].lane;

		if (!REQ_IS_RUNNING(l->req) || l->done)
			waste += t->rows[i].end - t->rows[i].start;
		else if (l->ovl_last > t->id) /* a later step appended too: its
						 committed length is t's end */
			l->com_len = t->rows[i].end;
	}
	if (t->held) /* its copies were held apart: later steps' stay */
		bkv__pool_copies_release_held(s->pool, 1);
	else if (t->copies)
		bkv__step_clear_copies(s);
	if (t->spec.n_rows) /* keep the accepted drafts' KV only, before any
			       of its blocks is indexed (its lanes have no
			       row in a later step: nothing of it is cut) */
		bkv__spec_cut_step(s, &t->spec, t->rows, t->n_rows);
	if (o->n_out) {
		/* what the commit carries over is the next one's to commit */
		oldest(o)->mark += bkv__pool_txn_commit_upto(s->pool, t->mark);
		if (s->call.n_lanes)
			trim_committed(s, t);
	} else {
		bkv__pool_txn_commit(s->pool);
	}
	o->committed = t->id;
	bkv__enc_commit(s, t->id);
	bkv__step_commit_rows(s, t->rows, t->n_rows, outs, si);
	if (s->cn) {
		bkv__cn_after_commit(s, t->id);
		bkv__cn_save_rows(s, t->rows, t->n_rows);
	}
	if (left)
		reprovision(t);
	if (t->spec.n_rows)
		bkv__spec_deliver_step(s, &t->spec, t->rows, t->n_rows, si);
	bkv__step_stats(s, si);
	s->stats.overlap_wasted_tokens += waste;
}

int bkv_step_complete(bkv_sched *s, uint64_t ticket, int status, bkv_step_info *info)
{
	bkv__ovl *o;
	bkv__ticket *t = NULL;
	bkv_step_info si;
	uint64_t now;
	uint32_t k, waiting = 0;
	int rc = BKV_OK;

	if (!s)
		return BKV_EINVAL;
	o = s->ovl;
	if (!o || s->plan.in_step)
		return BKV_ESTATE;
	for (k = 0; k < o->n_out && !t; k++) /* the oldest the host still owes */
		if (!o->t[(o->head + k) % o->cap].host_done)
			t = &o->t[(o->head + k) % o->cap];
	if (!t || ticket != t->id || status > 0) /* 0 and negative are defined */
		return BKV_EINVAL;
	s->plan.in_step = 1;
	bkv__outs_begin(s);
	now = bkv__clock_us(s);
	si = t->si;
	si.finished = 0;
	if (status < 0)
		o->failed = 1;
	if (o->failed) {
		t->host_done = 1;
		for (k = 0; k < o->n_out; k++)
			waiting += !o->t[(o->head + k) % o->cap].host_done;
		if (!waiting)
			rollback_all(s, now, &si);
		rc = BKV_EHOST;
	} else {
		commit_oldest(s, t, &si);
	}
	/* before the step's ended requests are freed (with nothing outstanding
	 * they are freed at once): their lanes may be deferred */
	release_after(s, o->committed);
	bkv__step_end(s, now, &si, info, 1);
	bkv__outs_end(s);
	s->plan.in_step = 0;
	return rc;
}

