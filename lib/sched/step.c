/*
 * step.c - bkv_step as one transaction: plan, call the host, commit or roll
 * back; and the progress rule.
 *
 * One bkv_step:
 *
 *   drain    inbox -> queue (decide/queue.c); aborts end at once (ABORT)
 *   plan     forks for n > 1, decode rows, prefill continuations, admissions;
 *            every row's tokens are appended to its sequence now (demand
 *            paging), so "make room" happens here: on ENOSPC the pool has
 *            already reclaimed cached blocks, and the scheduler preempts a
 *            victim (recompute or swap) and retries. Decode rows are one
 *            pass (plan_decode): rollback record, one-token append, row and
 *            the row's batch entries together
 *   call     mixed host: one forward (decode rows, then chunks); split host:
 *            prefill call (with admission auto maybe several, packed by
 *            length: decide/pack.c), then a decode call over every decoding row
 *            plus rows whose prompt finished in a prefill call. With
 *            prefill_first a split host's step admits waiting requests
 *            first: one that admits a prompt to prefill plans and calls
 *            nothing else (the fresh rows decode in a later step); one
 *            that admits none plans decode rows, then swaps in a swapped
 *            queue head
 *   commit   record tokens, on_token, finish (length, stop, error), close
 *            finished sequences into the prefix cache, clear copy lists
 *   or
 *   rollback truncate every touched sequence to its length before the step;
 *            nothing reaches a request; BKV_EHOST
 *
 * The pool's transaction hooks keep blocks filled during the step out of the
 * prefix-cache index until commit, so no request can hit KV that has not been
 * computed, and a rolled-back step leaves no uncomputed block in the cache.
 *
 */
#include "sched/batch.h"
#include "decide/decide.h"

#include <string.h>

/* ---- calls --------------------------------------------------------------- */

/* The model's price of a call with its swap copies: the host link's time
 * for them added, or overlapped (bkv_sched_config.copy_overlap: the longer
 * of compute and one direction's copies). */
static double call_price(const bkv_sched *s, const bkv_step_shape *sh, const bkv_batch *b)
{
	double t = s->cfg.cost.step_us(s->cfg.cost.ctx, sh), out, in;

	if (!b->n_swap_out && !b->n_swap_in)
		return t;
	out = bkv__link_us(s, b->n_swap_out);
	in = bkv__link_us(s, b->n_swap_in);
	if (!s->cfg.copy_overlap)
		return t + out + in;
	return BKV_MAX(t, BKV_MAX(out, in));
}

static int call_host(bkv_sched *s, bkv_call_kind kind, bkv__row *rows, uint32_t n,
		     uint32_t n_decode, bkv_step_info *si)
{
	int (*fn)(void *, const bkv_batch *, int32_t *);
	bkv_batch b;
	bkv_step_shape sh;
	uint64_t t0, t1;
	double us;
	uint32_t i, first;
	int rc;

	fn = kind == BKV_CALL_MIXED ? (s->plan.launching ? s->ops.launch : s->ops.forward)
	     : kind == BKV_CALL_PREFILL ? s->ops.prefill : s->ops.decode;
	memset(&b, 0, sizeof(b));
	first = rows == s->plan.dec ? s->plan.fill_rows : 0;
	if (s->call.persistent) {
		bkv__rows_call_begin(s); /* the slots released since the last call */
		if (first)
			bkv__rows_dirty(s, rows); /* the fused pass's rows */
	}
	bkv__batch_fill(s, kind, rows, n, n_decode, first, &b, &sh);
	if (s->spec) /* speculative decoding's arrays (sched/spec.c) */
		bkv__spec_batch(s, &b, &sh, rows, n);
#if BKV_DEBUG_LEVEL >= 1
	if (!s->bad_write && (first ? s->plan.fill_tok : 0) < b.n_tokens)
		s->bad_write = bkv__writes_shared(s, b.slot_mapping, first ? s->plan.fill_tok : 0,
						  b.n_tokens);
#endif
	if (n_decode)
		s->plan.dec_ctx_row = (double)sh.decode_context / (double)n_decode;
	if (s->cfg.cost.step_us)
		si->predicted_us += call_price(s, &sh, &b);
	if (s->plan.launching) { /* valid until the step completes */
		b.groups = bkv__ovl_groups(s, &b);
		if (s->plan.fenced) /* the placeholders, as the host names them */
			bkv__ovl_name(s, &b);
	}
	t0 = bkv__clock_us(s);
	rc = fn(s->host, &b, s->call.arr.next_tokens);
	t1 = bkv__clock_us(s);
	us = t1 >= t0 ? (double)(t1 - t0) : 0.0;
	si->measured_us += us;
	if (rc < 0)
		return BKV_EHOST;
	if (s->cfg.cost.observe && !s->plan.launching) /* a launch returns
								 before the step ran */
		s->cfg.cost.observe(s->cfg.cost.ctx, &sh, us);
	if (kind == BKV_CALL_PREFILL) /* the decode call reuses next_tokens */
		for (i = 0; i < n; i++)
			rows[i].out = s->call.arr.next_tokens[i];
	si->decode_tokens += n_decode;
	for (i = n_decode; i < n; i++)
		si->prefill_tokens += rows[i].end - rows[i].start;
	si->rows += n;
	if (kind == BKV_CALL_DECODE)
		si->decode_calls++;
	else if (n > n_decode)
		si->prefill_calls++;
	if (s->call.has_state && !s->plan.fenced) /* the step's next call reads
						      these states (with a step in
						      flight: the next launch's
						      shift, sched/overlap.c) */
		for (i = 0; i < n; i++)
			bkv__pool_state_advance(s->pool, rows[i].lane->seq, rows[i].end);
	return BKV_OK;
}

/* Split hosts: lanes whose prompt the prefill call finished join the decode
 * call with the token it sampled, unless that token ends them. No preemption
 * here: a lane the pool has no room for decodes in the next step. */
static void plan_after_prefill(bkv_sched *s)
{
	uint32_t i;

	for (i = 0; i < s->plan.n_pre; i++) {
		bkv__row *row = &s->plan.pre[i];
		bkv__lane *l = row->lane;
		bkv__req *r = l->req;
		uint32_t old = l->kv_len;
		int32_t t = row->out;

		if (!row->sample || t == BKV_TOKEN_FAIL || bkv__is_stop(r, t) ||
		    l->n_gen + 1 >= r->max_new)
			continue;
		l->tok[LANE_KNOWN(l)] = t; /* committed (n_gen++) only at commit */
		BKV_ASSERT(l->kv_len == LANE_KNOWN(l));
		if (bkv__seq_append_private(s->pool, l->seq, &l->tok[l->kv_len], 1) != BKV_OK)
			continue;
		l->kv_len++;
		bkv__add_row(s, s->plan.dec, &s->plan.n_dec, l, old, 0, 1);
	}
}

/* Split hosts: the step's prefill rows as one prefill call, or (auto.c's
 * packing) as several, one per run of similar lengths; the sampled tokens
 * go back to s->plan.pre's rows, in their order. Copies go out with the first. */
static int run_prefill(bkv_sched *s, bkv_step_info *si)
{
	bkv__row *rows;
	const uint32_t *order, *end;
	uint32_t g, i, b = 0, n_calls;
	int rc;

	n_calls = s->pol.pack(s, s->plan.pre, s->plan.n_pre, &rows, &order, &end);
	if (n_calls < 2)
		return call_host(s, BKV_CALL_PREFILL, s->plan.pre, s->plan.n_pre, 0, si);
	for (g = 0; g < n_calls; b = end[g++]) {
		rc = call_host(s, BKV_CALL_PREFILL, rows + b, end[g] - b, 0, si);
		if (rc != BKV_OK)
			return rc;
	}
	for (i = 0; i < s->plan.n_pre; i++)
		s->plan.pre[order[i]].out = rows[i].out;
	return BKV_OK;
}

static int run_calls(bkv_sched *s, bkv_step_info *si, int *called)
{
	int rc;

	if (si->preempted) { /* rows of requests preempted after planning */
		bkv__rows_prune(s->plan.dec, &s->plan.n_dec);
		bkv__rows_prune(s->plan.pre, &s->plan.n_pre);
		s->plan.fill_rows = 0; /* the written rows may be among them */
		s->call.n_dirty = 0;
	}
	if (!s->split || s->plan.launching) { /* a launch is one mixed call */
		if (s->plan.n_dec + s->plan.n_pre == 0)
			return BKV_OK;
		memcpy(&s->plan.dec[s->plan.n_dec], s->plan.pre, (size_t)s->plan.n_pre * sizeof(bkv__row));
		*called = 1;
		rc = call_host(s, BKV_CALL_MIXED, s->plan.dec, s->plan.n_dec + s->plan.n_pre, s->plan.n_dec, si);
		s->plan.n_dec += s->plan.n_pre;
		s->plan.n_pre = 0;
		return rc;
	}
	if (s->plan.n_pre) {
		*called = 1;
		s->plan.fill_rows = 0; /* the prefill call reuses the batch arrays */
		s->call.n_dirty = 0;
		rc = run_prefill(s, si);
		if (rc != BKV_OK)
			return rc;
		if (!s->cfg.prefill_first) /* else they decode next step */
			plan_after_prefill(s);
	}
	if (s->plan.n_dec) {
		*called = 1;
		rc = call_host(s, BKV_CALL_DECODE, s->plan.dec, s->plan.n_dec, s->plan.n_dec, si);
		if (rc != BKV_OK)
			return rc;
	}
	return BKV_OK;
}

int bkv__step_run_calls(bkv_sched *s, bkv_step_info *si, int *called)
{
	int rc = run_calls(s, si, called);

	bkv__enc_step_end(s); /* encodings of rows no call carried */
	return rc;
}

/* ---- commit / rollback --------------------------------------------------- */

typedef void (*on_token_fn)(void *, uint64_t, uint32_t, int32_t, void *);

/* Record each sampling row's token: outs[i] (the last call's next_tokens)
 * or, with from_outs 0, rows[i].out (a split host's prefill rows), and tell
 * on_token (s->ops.on_token). A token of a lane that was decoding already
 * (a decode row's) counts in stats.decode_tokens: the delivered ones, not
 * the rows computed. from_outs and on_token are passed in so that commit's
 * calls, with constants, compile to loops without those tests. */
static ALWAYS_INLINE void commit_rows(bkv_sched *s, const bkv__row *rows, uint32_t n,
				      int from_outs, const int32_t *outs, on_token_fn on_token,
				      bkv_step_info *si)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		bkv__lane *l = rows[i].lane;
		bkv__req *r = l->req;
		int32_t t = from_outs ? outs[i] : rows[i].out;

		if (!rows[i].sample || !REQ_IS_RUNNING(r) || l->done)
			continue;
		if (t == BKV_TOKEN_FAIL) {
			bkv__finish_req(s, r, BKV_FINISH_ERROR, si);
			continue;
		}
		l->tok[LANE_KNOWN(l)] = t;
		l->n_gen++;
		s->stats.decode_tokens += l->decoding;
		l->decoding = 1;
		if (s->outs)
			bkv__outs_token(s, r->id, l->branch, t);
		if (on_token) {
			on_token(s->host, r->id, l->branch, t, r->user);
			if (!REQ_IS_RUNNING(r) || l->done)
				continue;
		}
		if (r->n_stop && bkv__is_stop(r, t))
			bkv__lane_done(s, l, BKV_FINISH_STOP, si);
		else if (l->n_gen >= r->max_new)
			bkv__lane_done(s, l, BKV_FINISH_LENGTH, si);
	}
}

void bkv__step_clear_copies(bkv_sched *s)
{
	uint32_t i;

	bkv_pool_clear_copies(s->pool, BKV_COPY_SWAP_OUT);
	bkv_pool_clear_copies(s->pool, BKV_COPY_SWAP_IN);
	bkv_pool_clear_copies(s->pool, BKV_COPY_DEVICE);
	for (i = 0; i < s->plan.n_swap_pend; i++)
		s->plan.swap_pend[i]->swap_unsent = 0;
	s->plan.n_swap_pend = 0;
}

void bkv__step_commit_rows(bkv_sched *s, const bkv__row *rows, uint32_t n, const int32_t *outs,
			   bkv_step_info *si)
{
	if (s->ops.on_token)
		commit_rows(s, rows, n, 1, outs, s->ops.on_token, si);
	else
		commit_rows(s, rows, n, 1, outs, NULL, si);
}

static void commit(bkv_sched *s, int called, bkv_step_info *si)
{
	if (called) /* every pending copy went out in this step's first call */
		bkv__step_clear_copies(s);
	if (s->spec && s->spec->n_rows) /* keep the accepted drafts' KV only */
		bkv__spec_commit_cut(s);
	bkv__pool_txn_commit(s->pool);
	bkv__enc_commit(s, s->plan.step_no);
	if (s->split)
		commit_rows(s, s->plan.pre, s->plan.n_pre, 0, NULL, s->ops.on_token, si);
	if (s->ops.on_token)
		commit_rows(s, s->plan.dec, s->plan.n_dec, 1, s->call.arr.next_tokens, s->ops.on_token, si);
	else
		commit_rows(s, s->plan.dec, s->plan.n_dec, 1, s->call.arr.next_tokens, NULL, si);
	if (s->spec && s->spec->n_rows)
		bkv__spec_commit_deliver(s, si);
	if (s->cn) {
		bkv__cn_after_commit(s, s->plan.step_no);
		bkv__cn_save_rows(s, s->plan.pre, s->plan.n_pre);
		bkv__cn_save_rows(s, s->plan.dec, s->plan.n_dec);
	}
	bkv__step_stats(s, si);
}

void bkv__step_stats(bkv_sched *s, const bkv_step_info *si)
{
	s->stats.steps++;
	s->stats.prefill_tokens += si->prefill_tokens;
	s->stats.hit_tokens += si->hit_tokens; /* (decode_tokens: as delivered) */
	s->stats.prefill_calls += si->prefill_calls;
	s->stats.decode_calls += si->decode_calls;
	s->stats.busy_us += si->measured_us;
}

/* A swapped request recomputes instead: its sequences (and host blocks) go,
 * it waits where it was in the queue. */
static void swapped_to_recompute(bkv_sched *s, bkv__req *r, uint64_t now)
{
	BKV_ASSERT(r->state == BKV__REQ_SWAPPED);
	bkv__queue_remove(s, r);
	bkv__req_close_lanes(s, r);
	r->swap_unsent = 0;
	r->state = BKV__REQ_WAITING;
	r->enq_us = now;
	bkv__queue_push(s, r);
}

/* Swap-outs whose copies no host call carried yet become recompute
 * preemptions (their freed device blocks may hold other KV by the time a
 * call would carry them). */
void bkv__swaps_to_recompute(bkv_sched *s, uint64_t now)
{
	uint32_t i;

	for (i = 0; i < s->plan.n_swap_pend; i++)
		swapped_to_recompute(s, s->plan.swap_pend[i], now);
	s->plan.n_swap_pend = 0;
	bkv__hc_forget_demotions(s->pool); /* their copies were not made either */
	bkv_pool_clear_copies(s->pool, BKV_COPY_SWAP_OUT);
}

/* Put a lane touched this step back to its length before the step. */
static void lane_restore(bkv_sched *s, bkv__lane *l)
{
	BKV_ASSERT(l->touch_step == s->plan.step_no);
	if (!REQ_IS_RUNNING(l->req) || l->done || l->seq == BKV__SEQ_NONE)
		return;
	if (l->kv_len != l->pre_len)
		bkv_seq_truncate(s->pool, l->seq, l->pre_len);
	l->kv_len = l->pre_len;
}

/* A host call failed: truncate every sequence the step appended to, forget
 * uncommitted blocks, and turn swap-outs whose copies a host may not have made
 * (their freed device blocks may since hold other KV) into recompute
 * preemptions. Device and swap-in copies stay pending for the next call. */
void bkv__step_rollback(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	uint32_t i;

	for (i = 0; i < s->plan.n_touched; i++)
		lane_restore(s, s->plan.touched[i]);
	/* plan_decode's fast rows touched their lanes without the touched list
	 * (every decode row's lane was touched; restoring twice is harmless) */
	for (i = 0; i < s->plan.n_dec; i++)
		lane_restore(s, s->plan.dec[i].lane);
	bkv__pool_txn_abort(s->pool);
	if (s->call.persistent)
		bkv__rows_rollback(s);
	if (s->spec)
		bkv__spec_rollback(s);
	bkv__enc_rollback(s);
	if (s->cn)
		bkv__cn_rollback(s);
	bkv__swaps_to_recompute(s, now);
	s->stats.failed_steps++;
	si->rows = si->prefill_tokens = si->decode_tokens = si->hit_tokens = 0;
	si->prefill_calls = si->decode_calls = 0;
}

/* Upper bounds of the histogram's buckets, in microseconds; the
 * last bucket (+Inf) has no bound here. */
const uint64_t bkv__step_bound_us[BKV__STEP_BUCKETS - 1] = {
	500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
	250000, 500000, 1000000, 2500000, 5000000, 10000000,
};

/* The step-duration histogram (bkv_sched_metrics_prometheus writes it): a
 * fixed search over the bucket bounds and one counter, no allocation. */
static void step_observe(bkv_sched *s, uint64_t us)
{
	uint32_t i = 0;

	if (us > INT64_MAX) /* a clock that went backwards */
		us = 0;
	while (i < BKV__STEP_BUCKETS - 1 && us > bkv__step_bound_us[i])
		i++;
	s->obs.step_hist[i]++;
	s->obs.step_sum_s += (double)us / 1e6;
}

/* ---- the step ------------------------------------------------------------ */

/* The progress rule. A step in which nothing runs, no row is planned and
 * admission was allowed but took nothing, twice in a row, would repeat
 * forever: nothing it depends on changes by itself. Break it: swap-outs no
 * call carried become recomputes (their copies need a call that never
 * comes), then a swapped request that holds a sequence a waiting one
 * needs; and a head that cannot be admitted into an otherwise empty pool
 * ends with BKV_FINISH_ERROR rather than wait forever (bkv_step returns
 * BKV_OK with the request ended: it is no longer pending). */
static void unstick(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	bkv__req *head = bkv__queue_head(s, now);
	uint32_t i;

	s->plan.stalls = 0;
	if (s->plan.n_swap_pend) {
		bkv__swaps_to_recompute(s, now);
		return;
	}
	if (head->state == BKV__REQ_SWAPPED) {
		swapped_to_recompute(s, head, now);
		return;
	}
	for (i = 0; i < s->q.heap_n; i++) { /* only when stuck: O(queue) */
		if (s->q.heap[i]->state == BKV__REQ_SWAPPED) {
			swapped_to_recompute(s, s->q.heap[i], now);
			return;
		}
	}
	s->stats.unadmittable++;
	bkv__finish_req(s, head, BKV_FINISH_ERROR, si);
}


/* With nothing running, no table references a block that a pending device
 * (copy-on-write) or swap-in copy would write: their sequences were
 * preempted or ended before any host call carried the copies. The copies are
 * moot; forget them, which releases the copy-on-write sources they pin and
 * the host blocks they read. Without this, a pool with no slack left could
 * never admit again: no host call comes to clear them. Swap-out copies are
 * kept: the swapped requests still need them. */
static void forget_moot_copies(bkv_sched *s)
{
	bkv_pool_clear_copies(s->pool, BKV_COPY_DEVICE);
	bkv__pool_forget_swap_ins(s->pool);
}

/* Drain and plan: everything of a step before its host calls. */
void bkv__step_plan(bkv_sched *s, uint64_t now, bkv_step_info *si, int open_txn)
{
	s->plan.step_us = now;
	bkv__drain(s, now, si);
	if (s->rs.nr_run == 0)
		forget_moot_copies(s);

	s->plan.step_no++;
	s->plan.n_pre = s->plan.n_dec = s->plan.n_touched = s->plan.step_hits = s->plan.fill_rows = 0;
	memset(s->call.copies_sent, 0, sizeof(s->call.copies_sent));
	s->call.n_sent = 0;
	bkv__auto_step_begin(s);
	s->plan.budget_left = s->pol.budget(s);
	bkv__enc_step_begin(s);
	if (open_txn)
		bkv__pool_txn_begin(s->pool);
	if (s->cn) /* completed transfers, inside the transaction */
		bkv__cn_complete(s);
	bkv__plan_forks(s);
	if (s->cfg.prefill_first && s->split) {
		/* prefill-first (bkv_sched_config.prefill_first): waiting
		 * requests first; a step that admits one to prefill plans
		 * nothing else, one that admits none plans decode rows, and
		 * swaps in the queue's head when the first pass stopped at a
		 * swapped one (else a second pass finds what the first did:
		 * requests that decode planning preempts wait a step) */
		uint32_t n_pre = s->plan.n_pre;
		int at_swapped = bkv__plan_admit(s, now, si, 1);

		if (s->plan.n_pre == n_pre) {
			if (bkv__plan_decode(s, now, si))
				bkv__plan_continue(s, now, si);
			if (at_swapped)
				bkv__plan_admit(s, now, si, 0);
		}
	} else {
		if (bkv__plan_decode(s, now, si))
			bkv__plan_continue(s, now, si);
		bkv__plan_admit(s, now, si, 0);
	}
	bkv__auto_after_admit(s);
	if (s->spec) /* drafts last: they never preempt (sched/spec.c) */
		bkv__spec_plan(s, si);
	/* the forks still to come, kept from pins until the next step's plan
	 * (none is admitted or forks in between; an end only lowers it) */
	bkv__pool_reserve_seqs(s->pool, bkv__fork_seqs_count(s));
	/* a stall: nothing runs or is admitted, and nothing outstanding will
	 * give blocks back (overlap: the steps in flight release theirs when
	 * they complete) */
	if (s->plan.n_pre + s->plan.n_dec == 0 && s->rs.nr_run == 0 && s->q.heap_n && s->plan.admit_tried &&
	    !si->admitted && !bkv__blocks_coming(s)) {
		if (++s->plan.stalls >= 2)
			unstick(s, now, si);
	} else {
		s->plan.stalls = 0;
	}
	si->hit_tokens = s->plan.step_hits;
}

void bkv__step_end(bkv_sched *s, uint64_t now, bkv_step_info *si, bkv_step_info *info,
		   int observe)
{
	bkv__run_compact(s);
	bkv__release_done(s);

	si->running = s->rs.nr_run;
	si->waiting = s->q.heap_n;
	if (observe) /* a two-phase step's launch is not its duration */
		step_observe(s, bkv__clock_us(s) - now);
	if (info)
		*info = *si;
}

/* A step while the device KV is released (sched/release.c): the inbox
 * drained, aborts ended, nothing planned or computed. */
int bkv__released_step(bkv_sched *s, bkv_step_info *info)
{
	bkv_step_info si;
	uint64_t now = bkv__clock_us(s);

	s->plan.in_step = 1;
	bkv__outs_begin(s);
	memset(&si, 0, sizeof(si));
	bkv__drain(s, now, &si);
	bkv__step_end(s, now, &si, info, 0);
	bkv__outs_end(s);
	s->plan.in_step = 0;
	return BKV_OK;
}

int bkv_step(bkv_sched *s, bkv_step_info *info)
{
	bkv_step_info si;
	uint64_t now;
	int rc, called = 0;

	if (!s)
		return BKV_EINVAL;
	if (s->plan.in_step || s->plan.fenced || (s->ovl && !s->ops.forward && !s->split))
		return BKV_ESTATE; /* overlap: a two-phase step is outstanding,
				      or the host has only ops.launch */
	if (s->kv_released)
		return bkv__released_step(s, info);
	s->plan.in_step = 1;
	bkv__outs_begin(s);
	memset(&si, 0, sizeof(si));
	now = bkv__clock_us(s);
	bkv__step_plan(s, now, &si, 1);

	rc = bkv__step_run_calls(s, &si, &called);
	if (rc == BKV_OK)
		commit(s, called, &si);
	else
		bkv__step_rollback(s, now, &si);
	bkv__step_end(s, now, &si, info, 1);
	bkv__outs_end(s);
	s->plan.in_step = 0;
	return rc;
}
