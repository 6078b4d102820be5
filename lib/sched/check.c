/*
 * check.c - bkv_sched_check: the scheduler's invariants, a flat numbered
 * list (the numbers are the answers), O(requests) per call; the queue's
 * heaps are checked by decide/queue.c (bkv__queue_check).
 */
#include "sched/batch.h"
#include "decide/decide.h"

#include <string.h>

static int lane_blocks_indexed(const bkv_sched *s, const bkv__lane *l)
{
	const bkv_pool *p = s->pool;
	uint32_t i, n, nb;
	const int32_t *t;

	if (!bkv__pool_prefix_on(p) || bkv__pool_seq_uncached(p, l->seq) || l->req->cn_loading)
		return 1; /* (a cache reset took its chain out for good; a
			     connector's load is not indexed until done) */
	t = bkv_seq_blocks(p, l->seq, &nb);
	n = BKV_MIN(l->kv_len >> s->bt_shift, nb);
	/* a swapped-in block whose copy a rolled-back call was to carry is
	 * indexed when the copy is cleared (its KV is not in yet) */
	for (i = 0; i < n; i++)
		if (!(bkv__pool_block_flags(p, t[i]) & (BKV__BLOCK_INDEXED | BKV__BLOCK_PEND_SWAPIN)))
			return 0;
	return 1;
}

int bkv_sched_check(const bkv_sched *s)
{
	uint32_t i, j, slots = 0, n_inbox = 0, n_seqs = 0, mapped = 0, n_def = 0;
	bkv_pool_stats ps;
	const bkv__req *r;
	int rc;

	if (!s)
		return BKV_EINVAL;
	rc = bkv__queue_check(s);
	if (rc)
		return rc;
	if (bkv__rows_check(s))
		return 33;
	rc = bkv__ovl_check(s, &n_def); /* 34-36 */
	if (rc)
		return rc;
	rc = bkv__cn_check(s); /* 40 */
	if (rc)
		return rc;
	for (i = 0; i < s->rs.nr_run; i++) {
		uint32_t live = 0;

		r = s->rs.run[i];
		if (r->state != BKV__REQ_RUNNING)
			return 6;
		if (r->run_idx != i)
			return 7;
		for (j = 0; j < r->n; j++) {
			const bkv__lane *l = &r->lane[j];
			bkv_seq_info si;

			if (l->done && l->ovl_pend < 2) { /* 2, 3: provisionally */
				if (l->seq != BKV__SEQ_NONE)
					return 9;
				continue;
			}
			live++;
			if (r->n > 1 && !r->forked && j > 0) {
				if (l->seq != BKV__SEQ_NONE)
					return 10;
				continue;
			}
			if (l->seq == BKV__SEQ_NONE)
				return 10;
			n_seqs++;
			if (bkv_seq_info_get(s->pool, l->seq, &si) != BKV_OK || si.swapped ||
			    si.len != l->kv_len)
				return 11;
			if (l->kv_len > LANE_KNOWN(l) + (l->ovl_pend == 3 ? BKV_SPEC_MAX_K : 0) ||
			    l->n_gen > r->max_new)
				return 12; /* (3: its drafts are outstanding) */
			if (l->decoding && l->kv_len + 1 != LANE_KNOWN(l) &&
			    !(l->kv_len == LANE_KNOWN(l) && bkv__ovl_uncommitted(s, l)))
				return 13; /* (an outstanding row's token is not
					      sampled yet) */
			if (!bkv__ovl_outstanding(s) && !lane_blocks_indexed(s, l))
				return 32; /* (outstanding steps' blocks wait) */
		}
		if (live != r->n_live)
			return 8;
		slots += r->n_live;
	}
	if (slots != s->rs.slots_used)
		return 14;
	if (s->rs.slots_used > s->cfg.max_running)
		return 15;
	if (s->bad_write)
		return 30;
	if ((uint64_t)bkv__pool_nr_seqs(s->pool) + bkv__fork_seqs_count(s) > bkv__pool_max_seqs(s->pool) ||
	    bkv__fork_seqs_count(s) > bkv__pool_seqs_reserved(s->pool))
		return 31; /* (the pool keeps the forks' slots from pins) */
	for (i = 0; i < s->q.heap_n; i++) {
		r = s->q.heap[i];
		for (j = 0; j < r->n; j++) {
			const bkv__lane *l = &r->lane[j];
			bkv_seq_info si;

			if (r->state == BKV__REQ_WAITING && l->seq != BKV__SEQ_NONE)
				return 16;
			if (r->state == BKV__REQ_SWAPPED && !l->done) {
				if (bkv_seq_info_get(s->pool, l->seq, &si) != BKV_OK || !si.swapped ||
				    si.len != l->kv_len)
					return 17;
				n_seqs++;
			}
		}
	}
	LOCK(s);
	for (r = s->in.inbox_head; r; r = r->next)
		n_inbox++;
	n_inbox += bkv__cn_n_later(s);
	for (i = 0; i < s->in.map_cap; i++) {
		if (!s->in.map[i].id)
			continue;
		mapped++;
		if (s->in.map[i].req->state == BKV__REQ_DONE || s->in.map[i].req->id != s->in.map[i].id)
			rc = 18;
	}
	if (!rc && mapped != s->in.map_count)
		rc = 19;
	if (!rc && mapped != n_inbox + s->q.heap_n + s->rs.nr_run)
		rc = 20;
	/* submit changes these under the lock; the stepping thread is us */
	if (!rc && ATOMIC_LOAD(&((bkv_sched *)s)->in.nr_alive) != mapped)
		rc = 21;
	if (!rc && ATOMIC_LOAD(&((bkv_sched *)s)->in.nr_queued) != n_inbox + s->q.heap_n)
		rc = 22;
	UNLOCK(s);
	if (rc)
		return rc;
	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(s->pool, &ps);
	if (ps.nr_seqs != n_seqs + n_def + bkv__pool_nr_pins(s->pool) + /* pins: pool/pin.c */
			      bkv__cn_parked(s)) /* parked: sched/connector.c */
		return 23;
	if (s->spec && bkv__spec_check(s))
		return 34; /* speculative decoding (sched/spec.c) */
	if (bkv__adapters_check(s))
		return 38; /* adapters (sched/adapters.c) */
	if (bkv__enc_check(s))
		return 39; /* encoder inputs (sched/encoder.c) */
	rc = bkv_pool_check(s->pool);
	return rc > 0 ? 1000 + rc : rc;
}
