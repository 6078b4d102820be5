/*
 * plan.c - planning a step: forks for n > 1, decode rows, prefill
 * continuations, admissions, and making room.
 *
 * Every row's tokens are appended to its sequence while it is planned
 * (demand paging), so "make room" happens here: on ENOSPC the pool has
 * already reclaimed cached blocks, and the scheduler preempts a victim
 * (recompute or swap: the decision layer chooses) and retries. Decode rows
 * are one pass (plan_decode): rollback record, one-token append through the
 * pool's inline appender, row and the row's batch entries together
 * (sched/batch.h). Prompts take their prefix-cache hits before their chunk is
 * sized (lane_hits), so a chunked prompt's hits are not lost to the budget.
 *
 * Lanes: a request with n > 1 samples prefills its prompt but the last token
 * once (lane 0, no sample), then forks n lanes; each lane's first row computes
 * the last prompt token and samples, so every branch samples its own first
 * token from its own row. A lane's state is (kv_len, n_gen, decoding): KV of
 * tok[0, kv_len) is cached; the known tokens are tok[0, prompt_len + n_gen);
 * a decoding lane has exactly one known token without KV.
 */
#include "sched/batch.h"
#include "decide/decide.h"

#include <string.h>

/* ---- planning ------------------------------------------------------------ */

static void touch(bkv_sched *s, bkv__lane *l)
{
	if (l->touch_step == s->plan.step_no)
		return;
	l->touch_step = s->plan.step_no;
	l->pre_len = l->kv_len;
	s->plan.touched[s->plan.n_touched++] = l;
}

/* Undo a lane's appends of this step (before preempting it). */
static void lane_undo(bkv_sched *s, bkv__lane *l)
{
	if (l->seq == BKV__SEQ_NONE || l->touch_step != s->plan.step_no || l->kv_len == l->pre_len)
		return;
	bkv_seq_truncate(s->pool, l->seq, l->pre_len);
	l->kv_len = l->pre_len;
}

static int device_copies_pending(const bkv_sched *s)
{
	return bkv_pool_pending_copies(s->pool, BKV_COPY_DEVICE, NULL) != 0;
}

/* Preempt a running request: swap its one live lane to the host tier, or free
 * its blocks (full ones stay in the prefix cache) and recompute later. It goes
 * to the front of its priority class and is not readmitted in this step. */
static void preempt(bkv_sched *s, bkv__req *r, uint64_t now, bkv_step_info *si)
{
	int swap = s->plan.n_swap_pend < s->cfg.max_running && !device_copies_pending(s) &&
		   !(s->cn && bkv__cn_busy_req(s, r)) && s->pol.want_swap(s, r);
	uint32_t i;

	BKV_ASSERT(r->state == BKV__REQ_RUNNING);
	if (s->cn)
		bkv__cn_preempted(s, r);
	for (i = 0; i < r->n; i++)
		lane_undo(s, &r->lane[i]);
	if (swap) {
		for (i = 0; i < r->n; i++) {
			bkv__lane *l = &r->lane[i];

			if (l->done || l->seq == BKV__SEQ_NONE)
				continue;
			if (bkv_seq_swap_out(s->pool, l->seq) != BKV_OK)
				swap = 0;
			else
				bkv__slot_release(s, l); /* its table is host ids now */
		}
	}
	if (!swap)
		bkv__req_close_lanes(s, r);
	bkv__req_requeue(s, r, swap, now);
	r->swap_unsent = (uint8_t)swap;
	if (swap)
		s->plan.swap_pend[s->plan.n_swap_pend++] = r;
	si->preempted++;
}

void bkv__req_requeue(bkv_sched *s, bkv__req *r, int swapped, uint64_t now)
{
	s->rs.slots_used -= r->n_live;
	if (s->ad)
		bkv__adapter_drop(s, r);
	bkv__enc_drop(s, r);
	s->rs.run_dirty = 1;
	r->state = swapped ? BKV__REQ_SWAPPED : BKV__REQ_WAITING;
	r->swap_unsent = 0;
	r->order = --s->q.front;
	r->enq_us = now;
	r->preempt_step = s->plan.step_no;
	bkv__queue_push(s, r);
	ATOMIC_ADD(&s->in.nr_queued, 1);
	s->stats.preemptions++;
	s->stats.swaps += (uint64_t)(swapped != 0);
}

/* Append n tokens of a lane's history. A row that samples appends its last
 * token on its own and without a prefix lookup (bkv__seq_append_private):
 * the host must compute it to sample, so it is written, and the library
 * never gives a write a slot in a shared or cached block - with
 * block_tokens 1 that token alone is a whole block the cache may hold.
 * All-or-nothing. */
static int lane_append(bkv_sched *s, bkv__lane *l, uint32_t n, int sample, uint32_t *hit)
{
	uint32_t h1 = 0;
	int rc;

	if (!sample)
		return bkv_seq_append(s->pool, l->seq, l->tok + l->kv_len, n, hit);
	if (n > 1) {
		rc = bkv_seq_append(s->pool, l->seq, l->tok + l->kv_len, n - 1, &h1);
		if (rc != BKV_OK)
			return rc;
	}
	rc = bkv__seq_append_private(s->pool, l->seq, l->tok + l->kv_len + n - 1, 1);
	if (rc != BKV_OK) {
		if (n > 1)
			bkv_seq_truncate(s->pool, l->seq, l->kv_len);
		return rc;
	}
	*hit = h1;
	return BKV_OK;
}

/* A prefilling lane takes every prefix hit up to target first (but never
 * the last token of a row that will sample), before its chunk is sized:
 * hits compute nothing, so the step's token budget does not bound them,
 * and a lane whose last chunk ended inside a block takes the cached block
 * holding it once another request has computed it. The lane must be
 * touched (its rollback length recorded) already. Returns the hit tokens
 * (kv_len has moved past them). */
static uint32_t lane_hits(bkv_sched *s, bkv__lane *l, uint32_t target)
{
	uint32_t n = target - l->kv_len;
	int h;

	if (target == LANE_KNOWN(l))
		n--; /* the row's last token samples: computed */
	if (n == 0)
		return 0;
	h = bkv__seq_take_hits(s->pool, l->seq, l->tok + l->kv_len, n);
	l->kv_len += (uint32_t)h;
	return (uint32_t)h;
}

/* Append n tokens of a lane's history, preempting victims while the pool is
 * short. Returns BKV_OK, or an error when the lane got no room (its request
 * may itself have been preempted). A request that must preempt itself while
 * it runs alone had every block there is and still found no room (a
 * hybrid's groups need more than submit's group-0 check counts, its
 * branches more than the prompt, or pins hold the rest): readmitted, it
 * would do the same again forever, so it ends with BKV_FINISH_ERROR
 * (bkv_sched_stats.unadmittable). This holds for a forked request as for a
 * one-branch one: its branches grow together, and a readmission recomputes
 * them to the same point. */
static int append_room(bkv_sched *s, bkv__lane *l, uint32_t n, int sample, uint32_t *hit,
		       uint64_t now, bkv_step_info *si)
{
	for (;;) {
		int rc, alone;
		bkv__req *v;

		touch(s, l);
		rc = lane_append(s, l, n, sample, hit);
		if (rc == BKV_OK) {
			l->kv_len += n;
			return BKV_OK;
		}
		if (rc != BKV_ENOSPC)
			return rc;
		if (s->plan.open_from) { /* overlap: a step is in flight; a
					    step with none in flight preempts */
			s->plan.need_sync = 1;
			return BKV_ENOSPC;
		}
		v = s->pol.victim(s);
		if (!v)
			return BKV_ENOSPC;
		/* (a connector's transfers in flight hold sequences that come
		 * back when they complete: not alone then) */
		alone = v == l->req && s->rs.nr_run == 1 && !bkv__blocks_coming(s);
		preempt(s, v, now, si);
		if (alone) { /* the pool to itself and still no room: never */
			s->stats.unadmittable++;
			bkv__finish_req(s, v, BKV_FINISH_ERROR, si);
		}
		if (v == l->req)
			return BKV_ENOSPC;
	}
}

/* Where a lane's prefill stops: the whole history, or the prompt but its
 * last token for a request that still has to fork. */
/* A prefill chunk of c tokens from start of a prompt of target tokens, in a
 * pool with KV groups: ended on a block boundary unless it ends the prompt
 * (the groups' prefix hits are whole blocks: pool/lanes.c), and at the last
 * multiple of a STATE group's checkpoint interval inside it, so that the
 * state there exists (pool/state.c); the rest runs in a later step. With
 * less than a block left (of the token budget, or of what the TPOT target
 * lets the step take: decide/budget.c) a chunk waits for the next step,
 * unless the budget is below two blocks (then it stays as it is) or it is
 * the step's first prefill chunk: that one gets the rest of its block, so
 * that a prefill always progresses, as the first chunk of a pool without
 * groups does (it then passes the budget or the target by less than a
 * block). */
static uint32_t chunk_cut(const bkv_sched *s, uint32_t start, uint32_t c, uint32_t target)
{
	const uint32_t iv = s->call.st_interval, end = start + c;
	uint32_t m;

	if (!s->call.n_lanes || c == 0)
		return c;
	if (end < target && (end & (s->bt - 1))) {
		if ((end & ~(s->bt - 1)) > start)
			c = (end & ~(s->bt - 1)) - start;
		else if (s->cfg.token_budget >= 2 * s->bt && s->plan.n_pre)
			return 0; /* less than a block left: the next step */
		else if (s->cfg.token_budget >= 2 * s->bt)
			c = BKV_MIN((end | (s->bt - 1)) + 1, target) - start;
	}
	if (!iv || (start + c) % iv == 0)
		return c;
	m = (start + c) / iv * iv;
	return m > start ? m - start : c;
}

static uint32_t lane_target(const bkv__lane *l)
{
	const bkv__req *r = l->req;

	if (r->n > 1 && !r->forked)
		return r->prompt_len - 1;
	return LANE_KNOWN(l);
}

/* Add the row for a lane that just appended [old, kv_len) with hit leading
 * cache hits. A sampling row always computes at least its last token.
 * Returns the tokens the row computes (charged to the step's budget). */
uint32_t bkv__add_row(bkv_sched *s, bkv__row *rows, uint32_t *n, bkv__lane *l, uint32_t old,
			uint32_t hit, int sample)
{
	bkv__row *row;
	uint32_t start = old + hit;

	s->plan.step_hits += hit;
	if (sample && start >= l->kv_len) /* not reached: a sampled token is
					      never a hit (lane_append, lane_hits);
					      kept, as dropping it costs the
					      fused decode pass 9 instructions a
					      row in GCC 12's code */
		start = l->kv_len - 1;
	if (start >= l->kv_len)
		return 0; /* all hits, nothing to compute */
	BKV_ASSERT(!sample || start < l->kv_len); /* a sampled token is written */
	row = &rows[(*n)++];
	row->lane = l;
	row->start = start;
	row->end = l->kv_len;
	row->sample = (uint8_t)sample;
	row->out = BKV_TOKEN_FAIL;
	return row->end - row->start;
}

static void charge(bkv_sched *s, uint32_t tokens)
{
	s->plan.budget_left -= BKV_MIN(s->plan.budget_left, tokens);
}

void bkv__plan_forks(bkv_sched *s)
{
	uint32_t i, j;

	if (s->rs.nr_run_multi == 0)
		return; /* no request in run[] has n > 1 */
	for (i = 0; i < s->rs.nr_run; i++) {
		bkv__req *r = s->rs.run[i];
		bkv__lane *l0 = &r->lane[0];
		int rc = BKV_OK;

		if (r->n == 1 || r->forked || l0->kv_len != r->prompt_len - 1)
			continue;
		if (s->plan.open_from && l0->touch_step >= s->plan.open_from)
			continue; /* overlap: its prefix's KV is not committed */
		for (j = 1; j < r->n && rc == BKV_OK; j++) {
			bkv__lane *l = &r->lane[j];

			if (l0->kv_len == 0)
				rc = bkv_seq_open_keyed(s->pool, r->cache_key, &l->seq);
			else
				rc = bkv_seq_fork(s->pool, l0->seq, &l->seq);
			if (rc != BKV_OK)
				l->seq = BKV__SEQ_NONE;
			else
				bkv__seq_reserve(s->pool, l->seq,
						 (r->prompt_len + r->max_new + s->bt - 1) >>
							 s->bt_shift);
		}
		if (rc != BKV_OK) { /* retry next step */
			for (j = 1; j < r->n; j++) {
				if (r->lane[j].seq != BKV__SEQ_NONE)
					bkv_seq_close(s->pool, r->lane[j].seq);
				bkv__slot_release(s, &r->lane[j]);
				r->lane[j].seq = BKV__SEQ_NONE;
			}
			continue;
		}
		r->forked = 1;
		for (j = 0; j < r->n; j++) {
			r->lane[j].kv_len = l0->kv_len;
			r->lane[j].decoding = 1;
		}
	}
}

/* Decode rows for every decoding lane, each written into the batch arrays as
 * it is planned (bkv__fill; s->plan.fill_rows says how many made it), until a
 * preemption - which may prune rows already written - stops the writing.
 *
 * The common case, a running single-lane request in decode whose append is
 * simple, is one pass with the step's counters in locals: touch (the
 * rollback record: pre_len and touch_step, but no touched-list entry -
 * rollback finds these lanes through their rows), append (bkv__append_fast,
 * or bkv__seq_append1_slow at a block boundary), the row, its batch entries;
 * its budget charge (one token a row) is made once at the end (saturating
 * subtractions add up to the same). Everything else takes append_room
 * (preemption on ENOSPC) and add_row, with the counters written back first.
 * A row is [old, old + 1) either way: the token is appended without a
 * prefix lookup, into a private block, and computed (with block_tokens 1 the
 * cache may hold it; it is still written, never shared).
 * Returns the lanes it saw that are still prefilling (zero lets the step
 * skip plan_continue's pass).
 * Kept whole: it is the step's hot loop, and every split of it measured
 * slower, 3 to 6 instructions a row at 1,024 rows (bench_step under
 * callgrind; docs/design.md, "The layers"). */
uint32_t bkv__plan_decode(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	bkv_pool *const pool = s->pool;
	bkv__row *const dec = s->plan.dec;
	const uint64_t step = s->plan.step_no;
	const uint32_t n_dec0 = s->plan.n_dec;
	uint32_t i, j, prefilling = 0, n_dec = n_dec0, slow = 0;
	uint32_t hits = 0;
	const int flat = !s->call.persistent; /* else the rows' slots, not
						 their tables (fill_persist) */
	int writing = flat && !si->preempted; /* si->preempted in a local:
						 stores through the arrays
						 would reload it */
	int persist = !flat && !si->preempted;
	bkv__appender ap;
	bkv__fill f;

	bkv__append_begin(pool, &ap);
	bkv__fill_begin(s, &f);
	for (i = 0; i < s->rs.nr_run; i++) {
		bkv__req *r = s->rs.run[i];
		bkv__lane *l = &r->lane[0];

		/* a running single-lane request's lane is live and holds a
		 * sequence (bkv_sched_check 9, 10) */
		if (r->n == 1 && REQ_IS_RUNNING(r) && l->decoding) {
			const uint32_t old = l->kv_len;
			const int32_t token = l->tok[old];
			bkv__appended ad;
			bkv__row *row;

			BKV_ASSERT(!l->done && l->seq != BKV__SEQ_NONE &&
				   old + 1 == r->prompt_len + l->n_gen); /* LANE_KNOWN */
			ad = bkv__append_fast(&ap, l->seq, token);
			if (!ad.table && ap.grouped) /* KV groups */
				ad = bkv__append_groups(&ap, l->seq, token);
			if (!ad.table) { /* a block boundary or anything unusual */
				const bkv__seq *sq;
				uint32_t hit;

				bkv__append_flush(&ap);
				if (bkv__seq_append1_slow(pool, l->seq, token, &hit, &sq) !=
				    BKV_OK)
					goto general; /* ENOSPC or another answer: the
							 pool is unchanged; the general
							 path retries with preemption */
				hits += hit;
				ad.table = sq->table;
				ad.nb = sq->n_blocks;
				ad.clean = sq->clean;
				ad.off = bkv__fill_slot(&f, old, ad.table, ad.nb, &ad.slot);
			}
			row = &dec[n_dec++];
			/* touch() without the touched list: nothing appended to
			 * a lane before this pass, which sees each lane once;
			 * rollback finds the lane through this row */
			BKV_ASSERT(l->touch_step != step);
			l->touch_step = step;
			l->pre_len = old;
			l->kv_len = old + 1;
			row->lane = l;
			row->start = old;
			row->end = old + 1;
			row->sample = 1; /* row->out is read for prefill rows only */
			if (writing)
				bkv__fill_decode(&f, r, l, token, old, ad.table, ad.nb, ad.off,
						 ad.slot);
			else if (persist)
				bkv__fill_persist(&f, r, l, token, old, ad.table, ad.nb, ad.off,
						  ad.slot, ad.clean);
			continue;
		}
general:
		bkv__append_flush(&ap);
		s->plan.n_dec = n_dec;
		for (j = 0; j < r->n && REQ_IS_RUNNING(r); j++) {
			uint32_t old, hit = 0, nb = 0, off;
			const int32_t *table;
			int32_t slot;

			l = &r->lane[j];
			old = l->kv_len;
			if (l->done || l->seq == BKV__SEQ_NONE)
				continue;
			if (!l->decoding) {
				prefilling++;
				continue;
			}
			BKV_ASSERT(l->kv_len + 1 == LANE_KNOWN(l));
			if (r->n_enc && old < r->prompt_len && !bkv__enc_cut(s, l, 1))
				continue; /* a fork's first row reads an input that
					     is not encoded (sched/encoder.c) */
			if (append_room(s, l, 1, 1, &hit, now, si) != BKV_OK)
				continue;
			charge(s, bkv__add_row(s, s->plan.dec, &s->plan.n_dec, l, old, hit, 1));
			if (si->preempted)
				continue; /* rows may be pruned: stop writing */
			table = bkv_seq_blocks(pool, l->seq, &nb);
			off = bkv__fill_slot(&f, old, table, nb, &slot);
			if (flat)
				bkv__fill_decode(&f, r, l, l->tok[old], old, table, nb, off, slot);
			else
				bkv__fill_persist(&f, r, l, l->tok[old], old, table, nb, off, slot,
						  bkv__seq_clean(pool, l->seq));
		}
		slow += s->plan.n_dec - n_dec; /* the general path's rows */
		n_dec = s->plan.n_dec;
		writing = flat && !si->preempted;
		persist = !flat && !si->preempted;
	}
	bkv__append_flush(&ap);
	s->plan.n_dec = n_dec;
	s->plan.step_hits += hits;
	charge(s, n_dec - n_dec0 - slow); /* the fast rows */
	BKV_ASSERT(f.k <= f.kv_cap);
	BKV_ASSERT(si->preempted || f.r == n_dec);
	s->plan.fill_rows = si->preempted ? 0 : f.r;
	s->call.n_dirty = si->preempted ? 0 : f.n_dirty;
	s->plan.fill_tok = f.r;
	s->plan.fill_kv = f.k;
	s->plan.fill_ctx = f.ctx;
	return prefilling;
}

/* Continue partially prefilled lanes in admission order. */
void bkv__plan_continue(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	uint32_t i, j;

	for (i = 0; i < s->rs.nr_run && s->plan.budget_left; i++) {
		bkv__req *r = s->rs.run[i];

		for (j = 0; j < r->n && REQ_IS_RUNNING(r) && s->plan.budget_left; j++) {
			bkv__lane *l = &r->lane[j];
			uint32_t old = l->kv_len, hit = 0, h0, target, c;
			int sample;

			if (l->done || l->decoding || l->seq == BKV__SEQ_NONE || r->cn_loading)
				continue;
			target = lane_target(l);
			if (l->kv_len >= target)
				continue;
			touch(s, l);
			h0 = lane_hits(s, l, target);
			if (s->cn && bkv__cn_load_plan(s, l, target)) {
				s->plan.step_hits += h0;
				continue; /* it waits for its load */
			}
			c = l->kv_len < target ? bkv__auto_chunk_fit(s, l->kv_len,
								     bkv__chunk_len(s, target - l->kv_len))
					       : 0;
			c = bkv__enc_cut(s, l, chunk_cut(s, l->kv_len, c, target));
			sample = l->kv_len + c == LANE_KNOWN(l) && (r->n == 1 || r->forked);
			if (c == 0 || append_room(s, l, c, sample, &hit, now, si) != BKV_OK) {
				if (REQ_IS_RUNNING(r))
					s->plan.step_hits += h0; /* taken, nothing computed */
				continue; /* (c 0: no room under the TPOT target) */
			}
			charge(s, bkv__add_row(s, s->plan.pre, &s->plan.n_pre, l, old, h0 + hit, sample));
		}
	}
}

/* A failed admission: every lane it opened closes again. */
static void admit_undo(bkv_sched *s, bkv__req *r)
{
	uint32_t j;

	bkv__enc_drop(s, r); /* the gate's references (encoder.c) */
	for (j = 0; j < r->n; j++) {
		bkv__lane *l = &r->lane[j];

		if (l->seq != BKV__SEQ_NONE && !l->done)
			bkv_seq_close(s->pool, l->seq);
		if (!l->done) {
			bkv__slot_release(s, l);
			l->seq = BKV__SEQ_NONE;
			l->kv_len = 0;
		}
	}
}

/* Admission of a waiting request: open its lanes and append their first
 * chunks. Never preempts; all-or-nothing for its first lane (on failure the
 * request stays at the head of the queue), while a later branch with no room
 * starts in a later step. */
static int admit_waiting(bkv_sched *s, bkv__req *r)
{
	uint32_t j, tokens = 0, n_rows = s->plan.n_pre, budget = s->plan.budget_left, hits = s->plan.step_hits;
	int rc = BKV_OK;

	for (j = 0; j < r->n; j++)
		if (!r->lane[j].done && (j == 0 || r->forked))
			tokens += lane_target(&r->lane[j]) + 1;
	/* the watermark keeps room for running lanes to grow; with nothing
	 * running it would only starve a request larger than the room above it */
	if (s->rs.nr_run > 0 && !bkv_pool_can_admit(s->pool, tokens))
		return BKV_ENOSPC;
	for (j = 0; j < r->n && rc == BKV_OK; j++) {
		bkv__lane *l = &r->lane[j];
		uint32_t target, c, hit = 0, h0;
		int sample;

		if (l->done || (j > 0 && !r->forked))
			continue;
		rc = bkv_seq_open_keyed(s->pool, r->cache_key, &l->seq);
		if (rc != BKV_OK) {
			bkv__slot_release(s, l);
			l->seq = BKV__SEQ_NONE;
			break;
		}
		/* the table for the whole history now: decode steps then
		 * never reallocate it */
		bkv__seq_reserve(s->pool, l->seq,
				 (r->prompt_len + r->max_new + s->bt - 1) >> s->bt_shift);
		l->kv_len = 0;
		l->decoding = 0;
		touch(s, l);
		target = lane_target(l);
		if (target == 0)
			continue; /* n > 1, one-token prompt: forks next step */
		h0 = lane_hits(s, l, target);
		l->cn_saved = l->kv_len >> s->bt_shift; /* hits: cached already */
		if (l->kv_len == target || (s->cn && bkv__cn_load_plan(s, l, target))) {
			s->plan.step_hits += h0; /* all hits (n > 1: forks next
						    step), or it waits for its
						    load */
			continue;
		}
		c = bkv__auto_chunk_fit(s, l->kv_len, bkv__chunk_len(s, target - l->kv_len));
		c = bkv__enc_cut(s, l, chunk_cut(s, l->kv_len, c, target));
		if (c == 0 && (j > 0 || (s->call.n_lanes && l->kv_len > 0))) {
			s->plan.step_hits += h0;
			continue; /* the budget went to earlier branches (or, with
				     KV groups, what is left is less than a block
				     after the hits): this one goes on in a later
				     step (plan_continue) */
		}
		if (c == 0) {
			rc = BKV_ENOSPC;
			break;
		}
		sample = l->kv_len + c == LANE_KNOWN(l) && (r->n == 1 || r->forked);
		rc = lane_append(s, l, c, sample, &hit);
		if (rc == BKV_ENOSPC && j > 0) {
			s->plan.step_hits += h0;
			rc = BKV_OK;
			continue; /* the room went to earlier branches: this one
				     goes on in a later step (plan_continue),
				     with their prefix cached by then */
		}
		if (rc != BKV_OK)
			break;
		l->kv_len += c;
		charge(s, bkv__add_row(s, s->plan.pre, &s->plan.n_pre, l, 0, h0 + hit, sample));
	}
	if (rc != BKV_OK) {
		admit_undo(s, r);
		s->plan.n_pre = n_rows;
		s->plan.budget_left = budget;
		s->plan.step_hits = hits;
	}
	return rc;
}

/* Admission of a swapped request (one live lane): swap it in, then give it
 * its row if the pool has room for it (no preemption). */
static int admit_swapped(bkv_sched *s, bkv__req *r)
{
	bkv__lane *l = NULL;
	uint32_t j, old, hit = 0, need;
	int rc;

	for (j = 0; j < r->n; j++)
		if (!r->lane[j].done)
			l = &r->lane[j];
	BKV_ASSERT(l && l->seq != BKV__SEQ_NONE);
	need = (l->kv_len + s->bt - 1) / s->bt + 1;
	if (bkv_pool_available(s->pool) < need)
		return BKV_ENOSPC;
	rc = bkv_seq_swap_in(s->pool, l->seq);
	if (rc != BKV_OK)
		return rc;
	old = l->kv_len;
	if (l->decoding) {
		if (r->n_enc && old < r->prompt_len && !bkv__enc_cut(s, l, 1))
			return BKV_OK; /* a fork's first row reads an input that is
					  not encoded: it decodes next step */
		touch(s, l);
		if (bkv__seq_append_private(s->pool, l->seq, l->tok + l->kv_len, 1) == BKV_OK) {
			l->kv_len++;
			charge(s, bkv__add_row(s, s->plan.dec, &s->plan.n_dec, l, old, 0, 1));
		}
	} else {
		uint32_t target = lane_target(l), c, h0;
		int sample;

		touch(s, l);
		h0 = l->kv_len < target ? lane_hits(s, l, target) : 0;
		c = chunk_cut(s, l->kv_len, bkv__chunk_len(s, target - l->kv_len), target);
		c = bkv__enc_cut(s, l, c);
		sample = l->kv_len + c == LANE_KNOWN(l) && (r->n == 1 || r->forked);
		if (c && lane_append(s, l, c, sample, &hit) == BKV_OK) {
			l->kv_len += c;
			charge(s, bkv__add_row(s, s->plan.pre, &s->plan.n_pre, l, old, h0 + hit, sample));
		} else {
			s->plan.step_hits += h0;
		}
	}
	return BKV_OK;
}

/* Pool sequences the running requests will still open: n - 1 for each that
 * has not forked yet. Admission keeps them free, so a fork never waits for
 * a sequence that only another waiting fork could give back. */
static COLD uint32_t fork_seqs_walk(const bkv_sched *s)
{
	uint32_t i, n = 0;

	for (i = 0; i < s->rs.nr_run; i++) {
		const bkv__req *r = s->rs.run[i];

		if (REQ_IS_RUNNING(r) && r->n > 1 && !r->forked)
			n += r->n - 1;
	}
	return n;
}

static inline uint32_t fork_seqs(const bkv_sched *s)
{
	return s->rs.nr_run_multi ? fork_seqs_walk(s) : 0;
}

int bkv__plan_admit(bkv_sched *s, uint64_t now, bkv_step_info *si, int waiting_only)
{
	int was_empty, at_swapped = 0;
	uint32_t forks;

	bkv__run_compact(s); /* preempted requests leave run[] before it grows */
	was_empty = s->rs.nr_run == 0;
	s->plan.admit_tried = 0;
	if (!bkv__admit_allowed(s, now))
		return 0;
	s->plan.admit_tried = 1;
	forks = fork_seqs(s);
	while (s->q.heap_n && s->plan.budget_left) {
		bkv__req *r = bkv__queue_head(s, now); /* heap[0] unless the
							   bypass bound acts */
		uint32_t free_slots = s->cfg.max_running - s->rs.slots_used;
		int rc;

		if (r->preempt_step == s->plan.step_no || r->swap_unsent)
			break; /* no thrash: not back in the step that preempted it */
		if (r->state == BKV__REQ_SWAPPED && waiting_only) {
			at_swapped = 1; /* its decode row waits for the second pass */
			break;
		}
		if (r->state == BKV__REQ_SWAPPED && s->plan.open_from) {
			s->plan.need_sync = 1; /* overlap: a swap-in waits for a
						  step with none in flight */
			break;
		}
		if (r->n_live > free_slots)
			break;
		if (s->ad && !bkv__adapter_fits(s, r)) {
			if (bkv__adapter_pass(s, r, now))
				continue; /* its adapter has no room: passed */
			break;    /* passed long enough: it is next */
		}
		if (!s->pol.admit_ok(s, r))
			break; /* auto.c: batch cap, TPOT target, padding */
		/* a new (or recomputing) request opens n_live sequences, now or
		 * when it forks; a swapped one holds its own */
		if (r->state == BKV__REQ_WAITING &&
		    (uint64_t)r->n_live + forks + bkv__pool_nr_seqs(s->pool) > bkv__pool_max_seqs(s->pool))
			break;
		rc = r->state == BKV__REQ_SWAPPED ? admit_swapped(s, r) : admit_waiting(s, r);
		if (rc != BKV_OK)
			break;
		bkv__queue_remove(s, r);
		ATOMIC_SUB(&s->in.nr_queued, 1);
		r->state = BKV__REQ_RUNNING;
		r->swap_unsent = 0;
		r->admit_seq = ++s->rs.admit_seq;
		r->admit_us = now;
		r->run_idx = s->rs.nr_run;
		s->rs.run[s->rs.nr_run++] = r;
		s->rs.nr_run_multi += r->n > 1;
		s->rs.slots_used += r->n_live;
		s->rs.last_admit_us = now;
		if (s->ad)
			bkv__adapter_hold(s, r);
		si->admitted++;
		if (r->n > 1 && !r->forked)
			forks += r->n - 1;
		bkv__auto_admitted(s, r);
	}
	bkv__adapters_unpass(s);
	s->pol.admit_end(s, was_empty);
	return at_swapped;
}

/* Drop rows whose request was preempted after they were planned. */
void bkv__rows_prune(bkv__row *rows, uint32_t *n)
{
	uint32_t i, j = 0;

	for (i = 0; i < *n; i++)
		if (REQ_IS_RUNNING(rows[i].lane->req))
			rows[j++] = rows[i];
	*n = j;
}

uint32_t bkv__fork_seqs_count(const bkv_sched *s)
{
	return fork_seqs(s);
}
