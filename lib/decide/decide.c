/*
 * decide.c - the decision layer's state: the policy table chosen at create, the
 * cost-model rules' shared observations, and the default cost model. The
 * rules themselves are in admit.c, budget.c, preempt.c and pack.c; this
 * prose derives them. The cost model decides when to admit (admission
 * group 0), the token budget of chunked prefill (budget 0), a batch cap, how
 * a split host's prefill rows are packed into calls by length, and whether a
 * victim is swapped or recomputed (preempt AUTO). The derivations are in
 * docs/cost-model.md, section "Decisions from the cost model".
 *
 * Every decision prices hypothetical host calls with the scheduler's cost
 * model (the host's, or the default this file creates: a calibrated model
 * over the default polynomial (fitted to seed 000's measurements), so it
 * starts from those costs and learns
 * the host's from every call). What the scheduler has observed enters as
 * running aggregates kept here, never as a scan of the waiting requests:
 *
 *   rate r     slots freed per step: decayed sums of (slots freed, steps)
 *   prompts    decayed mean and second moment of admitted prompt lengths
 *   lambda     arrivals per us: decayed gaps between admitted enqueue times
 *   calendar   lanes due to free a slot at each of the next AUTO_RING steps
 *              (filled at admission, O(AUTO_OUT_BUCKETS) a lane): at
 *              max_new when requests end there, else at a length drawn
 *              from those that ended by a stop token (expected_rem)
 *   outputs    decayed histogram of the tokens ended requests generated
 *
 * Admission (economic order quantity). A prefill call costs P(k) for k rows:
 * a fixed part (launches, the weight reads of a short pass) plus the rows'
 * work, padded to the longest on a split kernel. An idle slot costs h per
 * step: with a backlog the run takes (decode tokens + idle slot-steps) / N
 * steps, and each step pays the decode call's fixed part, so h = that fixed
 * part / N. Waiting until k slots are free, at r slots per step, idles
 * k^2 / (2r) slot-steps per group, so the cost per admitted row is
 *
 *     J(k) = P(k) / k + h * k / (2 r)
 *
 * and the scheduler admits once the free slots reach k* = argmin J. Below
 * saturation (the whole queue fits in the free slots) there is no group to
 * wait for: it admits at once unless congestion pricing (below) says the
 * next call is worth sharing.
 *
 *   free slots  0 ... k* ... N
 *   J(k)        \__/``````        fixed cost amortised  vs  slots idling
 *
 * k* is recomputed every AUTO_REFRESH_STEPS steps (or when the queue changes
 * regime) on a geometric ladder of k, each point a shape of k chunks: the
 * work per step is O(max_running) amortised, no allocation (the chunk scratch
 * array is taken at create). With arrivals over time (a latency regime) the
 * group is the one minimising a predicted p99 wait (latency_group).
 *
 * Congestion (defer_pays). Every step with requests waiting prices "admit
 * now" against "wait one step and share the next call": waiting costs the
 * head rows a step, and saves one call's fixed part for everyone the call
 * would delay - the queue behind and the arrivals that will find every
 * slot taken before the running rows end (blocked_ahead, from the
 * calendar and the arrival rate). Far from saturation nobody is delayed and
 * the head is admitted at once; near it one more call pushes the coming
 * congestion, so the step waits for company.
 */
#include "decide/decide.h"

#include <math.h>
#include <string.h>

/* ---- create / destroy ---------------------------------------------------- */

static int auto_create(bkv_sched *s, const bkv_sched_config *user)
{
	bkv__auto *a = bkv__calloc(&s->alloc, 1, sizeof(*a));

	if (!a)
		return BKV_ENOMEM;
	s->autos = a;
	a->admit = user->admit_group == 0 && user->policy == BKV_POLICY_CONTINUOUS;
	a->budget = user->token_budget == 0 && user->chunked_prefill;
	a->tpot_us = user->tpot_target_us;
	a->ttft_us = user->ttft_target_us;
	a->chunk_cap = s->cfg.max_running + 1;
	a->chunks = bkv__calloc(&s->alloc, a->chunk_cap, sizeof(bkv_chunk_shape));
	a->pack_cap = s->plan.row_cap;
	a->pack_rows = bkv__calloc(&s->alloc, a->pack_cap, sizeof(bkv__row));
	a->pack_order = bkv__calloc(&s->alloc, a->pack_cap, sizeof(uint32_t));
	a->pack_end = bkv__calloc(&s->alloc, a->pack_cap, sizeof(uint32_t));
	a->pack_cut = bkv__calloc(&s->alloc, (size_t)a->pack_cap + 1, sizeof(uint32_t));
	a->pack_from = bkv__calloc(&s->alloc, (size_t)a->pack_cap + 1, sizeof(uint32_t));
	a->pack_best = bkv__calloc(&s->alloc, (size_t)a->pack_cap + 1, sizeof(double));
	if (!a->chunks || !a->pack_rows || !a->pack_order || !a->pack_end || !a->pack_cut ||
	    !a->pack_from || !a->pack_best)
		return BKV_ENOMEM;
	a->k_star = 1;
	a->cap = s->cfg.max_running;
	a->cap_tpot = s->cfg.max_running;
	if (!user->cost.step_us && !user->cost.observe) {
		/* the built-in default: seed 000's polynomial, calibrated
		 * online against the host's measured calls */
		bkv_cost_model base;

		bkv_cost_poly_init(&a->poly);
		base = bkv_cost_poly_model(&a->poly);
		if (bkv_cost_calib_create(&base, &s->alloc, &a->calib) != BKV_OK)
			return BKV_ENOMEM;
		s->cfg.cost = bkv_cost_calib_model(a->calib);
	}
	return BKV_OK;
}

void bkv__decide_destroy(bkv_sched *s)
{
	bkv__auto *a = s->autos;

	if (!a)
		return;
	if (a->evict_on)
		s->pol.evict(s, 0);
	bkv__evict_host_cache(s, 0);
	bkv_cost_calib_destroy(a->calib);
	if (a->chunks)
		bkv__free(&s->alloc, a->chunks, (size_t)a->chunk_cap * sizeof(bkv_chunk_shape));
	bkv__free(&s->alloc, a->pack_rows, (size_t)a->pack_cap * sizeof(bkv__row));
	bkv__free(&s->alloc, a->pack_order, (size_t)a->pack_cap * sizeof(uint32_t));
	bkv__free(&s->alloc, a->pack_end, (size_t)a->pack_cap * sizeof(uint32_t));
	bkv__free(&s->alloc, a->pack_cut, ((size_t)a->pack_cap + 1) * sizeof(uint32_t));
	bkv__free(&s->alloc, a->pack_from, ((size_t)a->pack_cap + 1) * sizeof(uint32_t));
	bkv__free(&s->alloc, a->pack_best, ((size_t)a->pack_cap + 1) * sizeof(double));
	bkv__free(&s->alloc, a, sizeof(*a));
	s->autos = NULL;
}


int bkv__decide_config_check(const bkv_sched_config *cfg, uint32_t host_blocks)
{
	if (cfg->preempt == BKV_PREEMPT_SWAP && host_blocks == 0) /* SWAP needs a host tier */
		return bkv__fail(BKV_EINVAL, "bkv_sched_config.preempt = BKV_PREEMPT_SWAP needs a "
				 "pool with host_blocks > 0");
	return BKV_OK;
}

int bkv__decide_create(bkv_sched *s, const bkv_sched_config *user)
{
	int rc = auto_create(s, user);

	if (rc != BKV_OK)
		return rc;
	bkv__admit_choose(&s->pol, user);
	bkv__budget_choose(&s->pol, user);
	bkv__preempt_choose(&s->pol, user);
	bkv__pack_choose(&s->pol, user);
	bkv__evict_choose(&s->pol, user);
	rc = s->pol.evict(s, 1);
	s->autos->evict_on = rc == BKV_OK;
	if (rc == BKV_OK)
		bkv__evict_host_cache(s, 1);
	return rc;
}

/* ---- observations -------------------------------------------------------- */

void bkv__auto_step_begin(bkv_sched *s)
{
	bkv__auto *a = s->autos;
	uint32_t freed = 0;

	if (!a)
		return;
	if (a->have_used && a->used_after > s->rs.slots_used)
		freed = a->used_after - s->rs.slots_used;
	a->freed_sum = a->freed_sum * AUTO_DECAY + freed;
	a->step_sum = a->step_sum * AUTO_DECAY + 1.0;
	a->used_sum = a->used_sum * AUTO_OCC_DECAY + s->rs.slots_used;
	a->freed_slow = a->freed_slow * AUTO_OCC_DECAY + freed;
	/* the lanes due to free a slot by now have (or ended earlier, or
	 * fell behind: then they are running but off the calendar) */
	a->ends_n -= a->ends[s->plan.step_no % AUTO_RING];
	a->ends[s->plan.step_no % AUTO_RING] = 0;
}

/* The tokens lane l of r has still to generate, for the calendar: to
 * max_new when requests end there (a client that sends each request's
 * length), the hints path's predicted_output when given, else a draw from
 * the lengths that requests which ended by a stop token had: their decayed
 * histogram (a->out_hist) at the quantile of a golden-ratio walk (the lanes
 * spread like the lengths; O(AUTO_OUT_BUCKETS), no randomness). A length in
 * the histogram's open last bucket is beyond the calendar: max_new. At least
 * 1, at most max_new - n_gen. */
static uint32_t expected_rem(bkv__auto *a, const bkv__req *r, const bkv__lane *l)
{
	const double width = (double)(AUTO_RING / AUTO_OUT_BUCKETS);
	uint32_t cap = r->max_new > l->n_gen ? r->max_new - l->n_gen : 1, j;
	double len, tot = 0.0, want;

	if (r->predicted_output) {
		len = r->predicted_output;
	} else {
		if (a->out_w <= 0.0 || a->len_w >= 0.5 * a->out_w)
			return cap;
		a->cal_u += 0.6180339887498949;
		if (a->cal_u >= 1.0)
			a->cal_u -= 1.0;
		for (j = 0; j < AUTO_OUT_BUCKETS; j++)
			tot += a->out_hist[j];
		want = a->cal_u * tot;
		for (j = 0; j + 1 < AUTO_OUT_BUCKETS && want >= a->out_hist[j]; j++)
			want -= a->out_hist[j];
		if (j + 1 == AUTO_OUT_BUCKETS || a->out_hist[j] <= 0.0)
			return cap; /* beyond the calendar */
		len = ((double)j + want / a->out_hist[j]) * width;
	}
	if (len <= (double)l->n_gen + 1.0)
		return 1;
	len -= (double)l->n_gen;
	return len < (double)cap ? (uint32_t)len : cap;
}

void bkv__auto_admitted(bkv_sched *s, const bkv__req *r)
{
	bkv__auto *a = s->autos;
	double p = r->prompt_len;
	uint32_t i;

	if (!a)
		return;
	/* the calendar: a lane with rem tokens to go frees its slot rem - 1
	 * steps from now on a split host (the prefill call samples one token
	 * and the decode call of the same step the next), rem on a mixed one
	 * (chunked prompts that span steps end later than this) */
	for (i = 0; i < r->n; i++) {
		const bkv__lane *l = &r->lane[i];
		uint32_t rem = expected_rem(a, r, l);
		uint32_t off = s->split ? (rem > 2 ? rem - 1 : 1) : rem;

		if (l->done || off >= AUTO_RING)
			continue; /* beyond the calendar: running, unscheduled */
		a->ends[(s->plan.step_no + off) % AUTO_RING]++;
		a->ends_n++;
	}
	a->adm_tokens += (double)r->prompt_len + (r->n ? r->lane[0].n_gen : 0);
	a->p_w = a->p_w * AUTO_PROMPT_DECAY + 1.0;
	a->p_sum = a->p_sum * AUTO_PROMPT_DECAY + p;
	a->p_sq = a->p_sq * AUTO_PROMPT_DECAY + p * p;
	if (a->have_enq && r->enq_us >= a->last_enq) {
		a->gap_w = a->gap_w * AUTO_GAP_DECAY + 1.0;
		a->gap_sum = a->gap_sum * AUTO_GAP_DECAY + (double)(r->enq_us - a->last_enq);
	}
	if (!a->have_enq || r->enq_us >= a->last_enq)
		a->last_enq = r->enq_us;
	a->have_enq = 1;
}

void bkv__auto_after_admit(bkv_sched *s)
{
	bkv__auto *a = s->autos;
	uint32_t i;

	if (!a)
		return;
	a->used_after = s->rs.slots_used;
	a->have_used = 1;
	/* the lanes that decode next step: this step's decode rows and the
	 * prefill rows that sample (their prompt ends here) */
	a->dec_next = s->plan.n_dec;
	for (i = 0; i < s->plan.n_pre; i++)
		a->dec_next += s->plan.pre[i].sample;
}

/* For tests and bkv-sim: the current admission group and batch cap. */
void bkv__auto_state(const bkv_sched *s, uint32_t *k_star, uint32_t *cap, double *rate)
{
	const bkv__auto *a = s->autos;

	if (k_star)
		*k_star = a ? a->k_star : 0;
	if (cap)
		*cap = a ? a->cap : 0;
	if (rate)
		*rate = a && a->step_sum > 0.0 ? a->freed_sum / a->step_sum : 0.0;
}
