/*
 * req.c - a request's life after admission ends here: the id map (id ->
 * request, open addressing, under the inbox lock), ending a request (its
 * sequences closed into the prefix cache or dropped, on_finish exactly
 * once), ending one lane, compacting the running set, freeing the requests
 * a step ended.
 */
#include "sched/sched.h"
#include "decide/decide.h"

#include <string.h>

/* ---- the id map (lock held) ---------------------------------------------- */

static uint32_t id_hash(uint64_t id)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdull;
	id ^= id >> 33;
	return (uint32_t)id;
}

bkv__slot *bkv__map_find(const bkv_sched *s, uint64_t id)
{
	uint32_t mask = s->in.map_cap - 1, i = id_hash(id) & mask;

	while (s->in.map[i].id != 0) {
		if (s->in.map[i].id == id)
			return &s->in.map[i];
		i = (i + 1) & mask;
	}
	return NULL;
}

void bkv__map_put(bkv__slot *map, uint32_t cap, uint64_t id, bkv__req *r)
{
	uint32_t mask = cap - 1, i = id_hash(id) & mask;

	while (map[i].id != 0)
		i = (i + 1) & mask;
	map[i].id = id;
	map[i].req = r;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
void bkv__map_erase(bkv_sched *s, uint64_t id)
{
	uint32_t mask = s->in.map_cap - 1, i, j;
	bkv__slot *e = bkv__map_find(s, id);

	if (!e)
		return;
	i = (uint32_t)(e - s->in.map);
	s->in.map[i].id = 0;
	s->in.map_count--;
	for (j = (i + 1) & mask; s->in.map[j].id != 0; j = (j + 1) & mask) {
		uint32_t home = id_hash(s->in.map[j].id) & mask;

		/* move j into the hole i unless its home lies in (i, j] */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			s->in.map[i] = s->in.map[j];
			s->in.map[j].id = 0;
			i = j;
		}
	}
}

int bkv__map_reserve(bkv_sched *s)
{
	uint32_t cap = s->in.map_cap * 2, i;
	bkv__slot *m;

	if ((s->in.map_count + 1) * 2 <= s->in.map_cap)
		return BKV_OK;
	m = bkv__calloc(&s->alloc, cap, sizeof(*m));
	if (!m)
		return BKV_ENOMEM;
	for (i = 0; i < s->in.map_cap; i++)
		if (s->in.map[i].id)
			bkv__map_put(m, cap, s->in.map[i].id, s->in.map[i].req);
	bkv__free(&s->alloc, s->in.map, (size_t)s->in.map_cap * sizeof(*m));
	s->in.map = m;
	s->in.map_cap = cap;
	return BKV_OK;
}

void bkv__req_free(bkv_sched *s, bkv__req *r)
{
	if (r->cn_buf)
		bkv__cn_req_free(s, r);
	bkv__free(&s->alloc, r, r->alloc_size);
}

/* Before a lane's sequence is released into the cache: its request's
 * retention ranges onto its full blocks (pool/retain.c). */
static void lane_retain(bkv_sched *s, const bkv__lane *l)
{
	const bkv__req *r = l->req;

	if (r->n_ret && l->seq != BKV__SEQ_NONE)
		bkv__pool_seq_retain(s->pool, l->seq, r->ret, r->n_ret, bkv__clock_us(s));
}

/* Release a request's sequences without callbacks (destroy). */
void bkv__req_drop_seqs(bkv_sched *s, bkv__req *r)
{
	uint32_t i;

	for (i = 0; i < r->n; i++) {
		if (r->lane[i].seq != BKV__SEQ_NONE)
			bkv_seq_drop(s->pool, r->lane[i].seq);
		bkv__slot_release(s, &r->lane[i]);
		r->lane[i].seq = BKV__SEQ_NONE;
	}
}

void bkv__seq_end(bkv_sched *s, uint32_t seq, int drop, uint32_t keep)
{
	if (!s->cn || !bkv__cn_defer_end(s, seq, drop, keep))
		bkv__pool_seq_end(s->pool, seq, drop, keep);
}

/* Close every lane's sequence (full blocks stay in the prefix cache): the
 * request will recompute from its tokens. */
void bkv__req_close_lanes(bkv_sched *s, bkv__req *r)
{
	uint32_t i;

	if (s->cn)
		bkv__cn_disown(s, r);
	for (i = 0; i < r->n; i++) {
		bkv__lane *l = &r->lane[i];

		lane_retain(s, l);
		if (l->seq != BKV__SEQ_NONE && s->cn)
			bkv__cn_save_lane(s, l);
		if (l->seq != BKV__SEQ_NONE)
			bkv__seq_end(s, l->seq, 0, UINT32_MAX);
		bkv__slot_release(s, l);
		l->seq = BKV__SEQ_NONE;
		l->kv_len = 0;
		l->decoding = 0;
	}
}


/* ---- ending requests ----------------------------------------------------- */


static void swap_pend_forget(bkv_sched *s, const bkv__req *r)
{
	uint32_t i;

	for (i = 0; i < s->plan.n_swap_pend; i++) {
		if (s->plan.swap_pend[i] == r) {
			s->plan.swap_pend[i] = s->plan.swap_pend[--s->plan.n_swap_pend];
			return;
		}
	}
}

/* End a request: release its sequences (close keeps full blocks cached, drop
 * for aborts), leave its state, run on_finish once. */
void bkv__finish_req(bkv_sched *s, bkv__req *r, bkv_finish_reason why, bkv_step_info *si)
{
	uint32_t i;

	if (s->cn)
		bkv__cn_disown(s, r);
	for (i = 0; i < r->n; i++) {
		bkv__lane *l = &r->lane[i];

		if (l->seq != BKV__SEQ_NONE) {
			if (why != BKV_FINISH_ABORT)
				lane_retain(s, l);
			bkv__lane_release_seq(s, l, why == BKV_FINISH_ABORT);
			bkv__slot_release(s, l);
			l->seq = BKV__SEQ_NONE;
		}
		l->done = 1;
	}
	if (r->state == BKV__REQ_RUNNING) {
		s->rs.slots_used -= r->n_live;
		if (s->ad)
			bkv__adapter_drop(s, r);
		bkv__enc_drop(s, r);
		s->rs.run_dirty = 1;
		if (why == BKV_FINISH_LENGTH || why == BKV_FINISH_STOP)
			bkv__queue_ran(s, r); /* the auto bypass bound's S */
	} else if (r->state == BKV__REQ_WAITING || r->state == BKV__REQ_SWAPPED) {
		bkv__queue_remove(s, r);
		ATOMIC_SUB(&s->in.nr_queued, 1);
	}
	if (r->swap_unsent)
		swap_pend_forget(s, r);
	r->swap_unsent = 0;
	r->n_live = 0;
	r->state = BKV__REQ_DONE;
	r->next = s->plan.done_head;
	s->plan.done_head = r;
	ATOMIC_SUB(&s->in.nr_alive, 1);
	s->stats.finished++;
	if (why == BKV_FINISH_ABORT)
		s->stats.aborted++;
	si->finished++;
	if (s->outs)
		bkv__outs_finish(s, r->id, why);
	if (s->ops.on_finish)
		s->ops.on_finish(s->host, r->id, why, r->user);
}

/* A lane reached its end: close it (its slot frees now); the request ends
 * with the last lane, with that lane's reason. */
void bkv__lane_done(bkv_sched *s, bkv__lane *l, bkv_finish_reason why, bkv_step_info *si)
{
	bkv__req *r = l->req;

	l->done = 1;
	l->reason = (uint8_t)why;
	if (l->seq != BKV__SEQ_NONE) {
		lane_retain(s, l);
		bkv__lane_release_seq(s, l, 0);
	}
	bkv__slot_release(s, l);
	l->seq = BKV__SEQ_NONE;
	r->n_live--;
	s->rs.slots_used--;
	if (r->n_live == 0)
		bkv__finish_req(s, r, why, si);
}

/* Remove ended and preempted requests from run[], keeping admission order. */
void bkv__run_compact(bkv_sched *s)
{
	uint32_t i, j = 0, multi = 0;

	if (!s->rs.run_dirty)
		return;
	s->rs.run_dirty = 0;
	for (i = 0; i < s->rs.nr_run; i++) {
		bkv__req *r = s->rs.run[i];

		if (r->state != BKV__REQ_RUNNING)
			continue;
		r->run_idx = j;
		s->rs.run[j++] = r;
		multi += r->n > 1;
	}
	s->rs.nr_run = j;
	s->rs.nr_run_multi = multi;
	if (j == 0)
		s->rs.group_size = 0;
}

/* Forget requests ended in this step: out of the map (so bkv_abort answers
 * ENOENT), then freed - unless an abort is queued for it, in which case the
 * next drain frees it. */
void bkv__release_done(bkv_sched *s)
{
	bkv__req *r, *next, *free_list = NULL;

	if (!s->plan.done_head)
		return;
	LOCK(s);
	for (r = s->plan.done_head; r; r = next) {
		next = r->next;
		bkv__map_erase(s, r->id);
		if (r->abort_state == 1) {
			r->zombie = 1;
		} else {
			r->next = free_list;
			free_list = r;
		}
	}
	UNLOCK(s);
	s->plan.done_head = NULL;
	if (s->plan.fenced && free_list) { /* overlap: outstanding steps
					      may still name them */
		bkv__ovl_hold(s, free_list);
		return;
	}
	for (r = free_list; r; r = next) {
		next = r->next;
		bkv__req_free(s, r);
	}
}
