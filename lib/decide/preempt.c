/*
 * preempt.c - preemption: which running request gives its blocks up when a
 * step runs out of room, and whether it is swapped to the host tier or
 * recomputed later.
 *
 * Victims: lowest priority first, then the most recently admitted, scanning
 * run[] (O(running), the scheduled work); or, with BKV_VICTIM_COST, the
 * lowest priority, then the least predicted loss per block freed and step
 * of output left, a request preempted in the last 64 steps only when no
 * other can go. Preempt mode: RECOMPUTE always
 * recomputes; SWAP and AUTO swap when the pool has a host tier with room for
 * the request's blocks and the request has one live lane (multi-lane requests
 * are recomputed, see docs/design.md); AUTO also asks the cost model
 * (bkv__auto_want_swap) and recomputes when that is predicted cheaper.
 *
 * AUTO's price comparison (bkv__auto_want_swap): moving the request's KV both ways
 * over the host link against recomputing its context as one prefill.
 */
#include "decide/decide.h"

#include <math.h>
#include <string.h>


/* Preempt AUTO with a known KV size: swap (1) when moving the victim's KV
 * out and back over the host link costs less than recomputing its prefill,
 * else recompute (0); -1 when the KV size is unknown (the caller's rule). */
int bkv__auto_want_swap(const bkv_sched *s, uint32_t kv_len)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	bkv_chunk_shape c;
	double link = s->cfg.host_link_bytes_per_us > 0.0 ? s->cfg.host_link_bytes_per_us
							   : AUTO_LINK_BYTES_PER_US;
	double swap_us, recompute_us;

	if (!a || s->cfg.preempt != BKV_PREEMPT_AUTO || s->cfg.kv_bytes_per_token == 0 ||
	    !s->cfg.cost.step_us)
		return -1;
	swap_us = 2.0 * (double)kv_len * (double)s->cfg.kv_bytes_per_token / link;
	c.len = kv_len;
	c.start = 0;
	memset(&sh, 0, sizeof(sh));
	sh.kind = s->split ? BKV_CALL_PREFILL : BKV_CALL_MIXED;
	sh.n_chunks = 1;
	sh.chunks = &c;
	recompute_us = bkv__price(s, &sh);
	return swap_us < recompute_us;
}



/* Lowest priority, then most recently admitted; skips requests preempted or
 * ended in this step. NULL when nothing can be preempted. */
static bkv__req *victim_default(const bkv_sched *s)
{
	bkv__req *best = NULL;
	uint32_t i;

	for (i = s->rs.nr_run; i-- > 0;) {
		bkv__req *r = s->rs.run[i];

		if (r->state != BKV__REQ_RUNNING)
			continue;
		if (!best || r->priority < best->priority ||
		    (r->priority == best->priority && r->admit_seq > best->admit_seq))
			best = r;
	}
	return best;
}

/* BKV_VICTIM_COST: what preempting r loses, per block it frees and per
 * step of output it still has to run. The loss is the cost model's price
 * of recomputing each live lane's KV as one prefill at depth 0 (or, where
 * r would be swapped - one lane, AUTO or SWAP, a host tier, a known KV
 * size - the link's time to move it out and back, when less). The blocks
 * are the ones it holds; the steps are max_new - generated of its
 * longest-running lane (1 at least): a request about to finish gives its
 * blocks back soon anyway. Lower goes first. */
static double victim_score(const bkv_sched *s, const bkv__req *r)
{
	bkv_step_shape sh;
	bkv_chunk_shape c;
	double loss = 0.0, link = s->cfg.host_link_bytes_per_us > 0.0
					  ? s->cfg.host_link_bytes_per_us
					  : AUTO_LINK_BYTES_PER_US;
	uint32_t i, left = 1;
	uint64_t blocks = 0;

	memset(&sh, 0, sizeof(sh));
	sh.kind = s->split ? BKV_CALL_PREFILL : BKV_CALL_MIXED;
	sh.n_chunks = 1;
	sh.chunks = &c;
	c.start = 0;
	for (i = 0; i < r->n; i++) {
		const bkv__lane *l = &r->lane[i];
		double re;

		if (l->done || l->seq == BKV__SEQ_NONE || l->kv_len == 0)
			continue;
		c.len = l->kv_len;
		re = bkv__price(s, &sh);
		if (r->n_live == 1 && s->host_blocks && s->cfg.kv_bytes_per_token &&
		    s->cfg.preempt != BKV_PREEMPT_RECOMPUTE) {
			double sw = 2.0 * (double)l->kv_len * (double)s->cfg.kv_bytes_per_token / link;

			if (sw < re)
				re = sw;
		}
		loss += re > 0.0 ? re : (double)l->kv_len; /* no model: tokens */
		blocks += (l->kv_len + s->bt - 1) >> s->bt_shift;
		if (r->max_new - l->n_gen > left)
			left = r->max_new - l->n_gen;
	}
	return loss / ((double)(blocks ? blocks : 1) * (double)left);
}

/* Steps after its last preemption during which a request is taken again
 * only when nothing else can go (BKV_VICTIM_COST). */
#define VICTIM_PROTECT_STEPS 64u

static int victim_protected(const bkv_sched *s, const bkv__req *r)
{
	return r->preempt_step && s->plan.step_no - r->preempt_step < VICTIM_PROTECT_STEPS;
}

/* Lowest priority; among those, unprotected before protected, then the
 * lowest victim_score (ties: the most recently admitted). */
static bkv__req *victim_cost(const bkv_sched *s)
{
	bkv__req *best = NULL;
	double best_v = 0.0;
	int best_p = 0;
	uint32_t i;

	for (i = s->rs.nr_run; i-- > 0;) {
		bkv__req *r = s->rs.run[i];
		double v;
		int p;

		if (r->state != BKV__REQ_RUNNING)
			continue;
		if (best && r->priority > best->priority)
			continue;
		p = victim_protected(s, r);
		v = victim_score(s, r);
		if (!best || r->priority < best->priority || p < best_p ||
		    (p == best_p && (v < best_v || (v == best_v && r->admit_seq > best->admit_seq)))) {
			best = r;
			best_v = v;
			best_p = p;
		}
	}
	return best;
}

/* Swap (1) or recompute (0) this victim: swap when it has one live lane
 * with KV and the host tier has room for its blocks; with ask_cost (AUTO)
 * only when the cost model does not predict recomputing cheaper. */
static int swap_fits(const bkv_sched *s, const bkv__req *r, int ask_cost)
{
	const bkv__lane *l = NULL;
	uint32_t i, n_blocks = 0;

	if (s->host_blocks == 0)
		return 0;
	if (r->n_live != 1 || (r->n > 1 && !r->forked))
		return 0;
	for (i = 0; i < r->n; i++)
		if (!r->lane[i].done)
			l = &r->lane[i];
	if (!l || l->seq == BKV__SEQ_NONE || l->kv_len == 0)
		return 0;
	n_blocks = bkv__pool_swap_blocks(s->pool, l->seq); /* every group's */
	if (ask_cost && bkv__auto_want_swap(s, l->kv_len) == 0)
		return 0; /* recomputing is predicted cheaper */
	/* SWAP, and AUTO when swapping is cheaper or the KV size is unknown:
	 * swap when the host tier has room (the host cache gives way), else
	 * recompute. */
	return bkv__pool_host_room(s->pool) >= n_blocks;
}

int bkv__swap_fits(const bkv_sched *s, const bkv__req *r)
{
	return swap_fits(s, r, 0);
}

static int want_swap_room(const bkv_sched *s, const bkv__req *r)
{
	return swap_fits(s, r, 0);
}

static int want_swap_auto(const bkv_sched *s, const bkv__req *r)
{
	return swap_fits(s, r, 1);
}

static int want_swap_never(const bkv_sched *s, const bkv__req *r)
{
	(void)s;
	(void)r;
	return 0;
}

void bkv__preempt_choose(bkv__policy *p, const bkv_sched_config *user)
{
	p->victim = user->victim == BKV_VICTIM_COST ? victim_cost : victim_default;
	if (user->preempt == BKV_PREEMPT_RECOMPUTE)
		p->want_swap = want_swap_never;
	else
		p->want_swap = user->preempt == BKV_PREEMPT_SWAP ? want_swap_room : want_swap_auto;
}
