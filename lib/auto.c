/*
 * auto.c - the decisions the cost model makes: when to admit (admission
 * group 0), the token budget of chunked prefill (budget 0), a batch cap, how
 * a split host's prefill rows are packed into calls by length, and whether a
 * victim is swapped or recomputed (preempt AUTO). The derivations are in
 * docs/cost-model.md, section "Decisions from the cost model".
 *
 * Every decision prices hypothetical host calls with the scheduler's cost
 * model (the host's, or the default this file creates: a calibrated model
 * over seed 000's polynomial, so it starts from seed 000's costs and learns
 * the host's from every call). What the scheduler has observed enters as
 * running aggregates kept here, never as a scan of the waiting requests:
 *
 *   rate r     slots freed per step: decayed sums of (slots freed, steps)
 *   prompts    decayed mean and second moment of admitted prompt lengths
 *   lambda     arrivals per us: decayed gaps between admitted enqueue times
 *   calendar   lanes due to free a slot at each of the next AUTO_RING steps
 *              if they run to max_new (filled at admission, O(1) a lane)
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
#include "internal.h"

#include <math.h>
#include <string.h>

#define AUTO_DECAY 0.97          /* per step, for the slot-free rate */
#define AUTO_OCC_DECAY 0.999     /* per step, for the occupancy time */
#define AUTO_GAP_DECAY 0.999     /* per admission, for the arrival rate */
#define AUTO_PROMPT_DECAY 0.99   /* per admission, for the prompt moments */
#define AUTO_REFRESH_STEPS 8u    /* steps between recomputations of k* */
#define AUTO_LINK_BYTES_PER_US 25000.0 /* host link default: 25 GB/s */
#define AUTO_KNEE 1.002          /* batch cap: cost per token within 0.2% */
#define AUTO_PRICED_ROWS 64u     /* rows of one step's prefill call that
				    admission prices one by one (O(rows^2)
				    per step; the rest join unpriced) */
#define AUTO_DEFAULT_PROMPT 64.0 /* prompt tokens assumed before any is seen */
#define AUTO_CTX_EXTRA 64.0      /* generated tokens added to a row's context
				    when pricing decode rows */
#define AUTO_PACK_GAIN 1e-6      /* least relative saving of a prefill
				    call split off (rounding is no gain) */
#define AUTO_PACK_CUTS 32u       /* most inner call boundaries the prefill
				    partition considers (O(cuts^2) prices) */
#define AUTO_CLOCK_US 1.0        /* the clock's resolution (now_us and the
				    monotonic clock count microseconds): the
				    least positive price of a call */
#define AUTO_RING 256u           /* steps ahead the completion calendar
				    covers (a power of two) */

struct bkv__auto {
	int admit;               /* admit_group was 0: k* decides */
	int budget;              /* token_budget was 0 (chunked): decided per
				    step */
	uint32_t tpot_us;        /* cfg.tpot_target_us; 0 none */
	bkv_cost_poly poly;      /* the default model's base (when owned) */
	bkv_cost_calib *calib;   /* the default model, owned; NULL when the
				    host gave one */
	bkv_chunk_shape *chunks; /* [chunk_cap] scratch for priced shapes */
	uint32_t chunk_cap;      /* = max_running + 1 */
	uint64_t fit_step;       /* step whose decode context fit_ctx holds */
	uint64_t fit_ctx;        /* summed context of that step's decode rows */
	/* observations */
	double freed_sum;        /* decayed slots freed */
	double step_sum;         /* decayed steps (same decay): r = sum / sum */
	double used_sum;         /* slowly decayed (AUTO_OCC_DECAY) slots_used
				    at step begin ... */
	double freed_slow;       /* ... and slots freed: Little's law gives
				    the steps a request holds a slot */
	double gap_w, gap_sum;   /* decayed count and sum of the gaps (us)
				    between consecutive admitted requests'
				    enqueue times: the arrival rate */
	uint64_t last_enq;       /* enq_us of the last admitted request */
	int have_enq;            /* last_enq is valid */
	uint32_t used_after;     /* slots_used after the last admission */
	int have_used;           /* used_after is valid */
	double p_w, p_sum, p_sq; /* decayed count, sum, sum of squares of
				    admitted prompt lengths */
	/* cached decisions */
	uint32_t k_star;         /* admission group the cost model chose */
	uint32_t cap;            /* batch cap (running slots) */
	uint32_t k_lat;          /* latency-regime group; 0: use k_star */
	double w99;              /* predicted p99 wait (us) of the latency
				    group; 0 none */
	/* completion calendar: lanes that free a slot at the start of step
	 * t if they run to max_new, at ends[t % AUTO_RING], for t in
	 * (step_no, step_no + AUTO_RING) */
	uint32_t ends[AUTO_RING];
	uint32_t ends_n;         /* sum of ends[] */
	uint64_t k_step;         /* step_no when k_star was computed; 0 never */
	/* the admission under way (one step) */
	uint64_t adm_step;       /* step_no of the group being built */
	uint32_t adm_n;          /* rows priced into chunks[] this step */
	double adm_price;        /* predicted prefill price of the group;
				    < 0 when not priced since it last grew */
	/* packing a split host's prefill rows into calls (bkv__auto_pack);
	 * every array has pack_cap entries (+ 1 where said), taken at create */
	uint32_t pack_cap;       /* = the scheduler's row_cap */
	bkv__row *pack_rows;     /* the step's prefill rows sorted by (length,
				    start): calls are contiguous runs of it */
	uint32_t *pack_order;    /* pack_rows[i] is the caller's rows[
				    pack_order[i]] */
	uint32_t *pack_end;      /* end (exclusive) in pack_rows of call g */
	uint32_t *pack_cut;      /* [+ 1] candidate call boundaries, 0 .. n */
	uint32_t *pack_from;     /* [+ 1] DP: the boundary the cheapest
				    partition ending at cut j starts its last
				    call at */
	double *pack_best;       /* [+ 1] DP: the price of that partition */
};

/* ---- pricing ------------------------------------------------------------- */

/* The model's price of a call; 0 when it has no answer (no model, or a
 * price that is not positive). Calls are timed with a microsecond clock,
 * so a positive price below one tick (AUTO_CLOCK_US) is raised to it: a
 * model fitted to calls the clock timed at 0 or 1 us (a host faster than
 * the clock, issue 13) knows only that they take less than a tick, and the
 * shape its fit gives below that is noise. */
static double price(const bkv_sched *s, const bkv_step_shape *sh)
{
	double t;

	if (!s->cfg.cost.step_us)
		return 0.0;
	t = s->cfg.cost.step_us(s->cfg.cost.ctx, sh);
	if (!isfinite(t) || t <= 0.0)
		return 0.0;
	return t < AUTO_CLOCK_US ? AUTO_CLOCK_US : t;
}

static void prompt_stats(const bkv__auto *a, double *mean, double *sd)
{
	double m, v;

	if (a->p_w <= 0.0) {
		*mean = AUTO_DEFAULT_PROMPT;
		*sd = 0.0;
		return;
	}
	m = a->p_sum / a->p_w;
	v = a->p_sq / a->p_w - m * m;
	*mean = m;
	*sd = v > 0.0 ? sqrt(v) : 0.0;
}

/* A decode (or decode-only mixed) call of n rows with typical context. */
static double price_decode(const bkv_sched *s, uint32_t n, double mean)
{
	bkv_step_shape sh;

	memset(&sh, 0, sizeof(sh));
	sh.kind = s->split ? BKV_CALL_DECODE : BKV_CALL_MIXED;
	sh.decode_rows = n;
	sh.padded_rows = n;
	sh.decode_context = (uint64_t)((double)n * (mean + AUTO_CTX_EXTRA));
	return n ? price(s, &sh) : 0.0;
}

/* Expected longest of k prompts, the distribution taken as uniform with the
 * observed mean and standard deviation (narrowed to keep the mean when its
 * low end would fall below one token). */
static double expected_max(double mean, double sd, uint32_t k)
{
	double lo = mean - sqrt(3.0) * sd, hi = mean + sqrt(3.0) * sd;

	if (lo < 1.0) { /* clamped: keep the mean, so k = 1 gives the mean */
		lo = 1.0;
		hi = 2.0 * mean - lo;
	}
	if (hi < lo)
		hi = lo;
	return lo + (hi - lo) * (double)k / (double)(k + 1);
}

/* The prefill part of admitting k typical prompts: a split host's prefill
 * call, or what the chunks add to a mixed host's call over d decode rows. */
static double price_group(const bkv_sched *s, uint32_t k, double mean, double sd, uint32_t d)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	double lmax = expected_max(mean, sd, k), rest, base = 0.0;
	uint32_t i;

	if (k > a->chunk_cap)
		k = a->chunk_cap;
	rest = k > 1 ? ((double)k * mean - lmax) / (double)(k - 1) : mean;
	if (rest < 1.0)
		rest = 1.0;
	for (i = 0; i < k; i++) {
		a->chunks[i].len = (uint32_t)llround(i == 0 ? lmax : rest);
		a->chunks[i].start = 0;
	}
	memset(&sh, 0, sizeof(sh));
	sh.kind = s->split ? BKV_CALL_PREFILL : BKV_CALL_MIXED;
	if (!s->split && d) {
		sh.decode_rows = d;
		sh.padded_rows = d;
		sh.decode_context = (uint64_t)((double)d * (mean + AUTO_CTX_EXTRA));
		base = price(s, &sh);
	}
	sh.n_chunks = k;
	sh.chunks = a->chunks;
	return price(s, &sh) - base;
}

/* ---- create / destroy ---------------------------------------------------- */

int bkv__auto_create(bkv_sched *s, const bkv_sched_config *user)
{
	bkv__auto *a = bkv__calloc(&s->alloc, 1, sizeof(*a));

	if (!a)
		return BKV_ENOMEM;
	s->autos = a;
	a->admit = user->admit_group == 0 && user->policy == BKV_POLICY_CONTINUOUS;
	a->budget = user->token_budget == 0 && user->chunked_prefill;
	a->tpot_us = user->tpot_target_us;
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

void bkv__auto_destroy(bkv_sched *s)
{
	bkv__auto *a = s->autos;

	if (!a)
		return;
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

int bkv__auto_admit_on(const bkv_sched *s)
{
	return s->autos && s->autos->admit;
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
		uint32_t rem = r->max_new > l->n_gen ? r->max_new - l->n_gen : 1;
		uint32_t off = s->split ? (rem > 2 ? rem - 1 : 1) : rem;

		if (l->done || off >= AUTO_RING)
			continue; /* beyond the calendar: running, unscheduled */
		a->ends[(s->plan.step_no + off) % AUTO_RING]++;
		a->ends_n++;
	}
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

	if (!a)
		return;
	a->used_after = s->rs.slots_used;
	a->have_used = 1;
}

/* ---- admission ----------------------------------------------------------- */

/* Batch cap: the fewest rows whose predicted cost per decode token is within
 * AUTO_KNEE of the best at max_running (past it more rows buy no throughput,
 * only latency and KV), and no more rows than a TPOT target allows. A row
 * count the model has no price for (0) is not the knee: a calibrated fit of
 * sub-tick noise can price small decode calls below zero (clamped), and a
 * free decode row would cap the batch at one row (issue 13). */
static uint32_t batch_cap(const bkv_sched *s, double mean)
{
	const bkv__auto *a = s->autos;
	uint32_t n_max = s->cfg.max_running, lo = 1, hi = n_max, cap;
	double best = price_decode(s, n_max, mean) / n_max;

	if (best <= 0.0)
		return n_max;
	while (lo < hi) { /* per-token cost falls with n: smallest n at knee */
		uint32_t mid = lo + (hi - lo) / 2;
		double d = price_decode(s, mid, mean);

		if (d > 0.0 && d / mid <= AUTO_KNEE * best)
			hi = mid;
		else
			lo = mid + 1;
	}
	cap = lo;
	if (a->tpot_us && price_decode(s, 1, mean) <= a->tpot_us) {
		lo = 1;
		hi = cap;
		while (lo < hi) { /* largest n whose decode call keeps the target */
			uint32_t mid = hi - (hi - lo) / 2;

			if (price_decode(s, mid, mean) <= a->tpot_us)
				lo = mid;
			else
				hi = mid - 1;
		}
		cap = lo;
	}
	return cap;
}

/* Latency regime: the group that minimises a request's predicted p99 wait,
 * the running set seen as one server handing out slots. At saturation a
 * slot frees every D(n) T / n of time (T = steps a request holds a slot,
 * Little's law: mean occupancy / slots freed per step, slow averages), and
 * groups of k add P(k)/k per slot: S(k) = D(n) T / n + P(k) / k. Requests
 * arrive at lambda (from their enqueue times), so rho(k) = lambda S(k). An
 * M/D/1 queue's wait is about exponential with mean S / (2 (1 - rho)) given
 * that it waits (probability rho), so its p99 is that times ln(100 rho);
 * the last of a group waits k - 1 slots for it, then its prefill call:
 *
 *     W99(k) = S / (2 (1 - rho)) ln(100 rho) + (k - 1) S + P(k)
 *
 * k = 1 pays P(1) per slot and runs closest to rho = 1; a large k waits for
 * its group. 0 when no k keeps rho < 1 or no arrival gap was seen (a burst):
 * then k* decides. O(max_running) prices, at each refresh of k*. */
static uint32_t latency_group(bkv_sched *s, double mean, double sd, uint32_t n)
{
	bkv__auto *a = s->autos;
	double lambda, occ, slot, best = INFINITY;
	uint32_t k, best_k = 0;

	a->w99 = 0.0;
	if (a->gap_w <= 0.0 || a->gap_sum <= 0.0 || a->freed_slow <= 0.0)
		return 0;
	lambda = a->gap_w / a->gap_sum;            /* requests per us */
	occ = a->used_sum / a->freed_slow;         /* steps per request */
	slot = price_decode(s, n, mean) * occ / n; /* us per slot, decode */
	for (k = 1; k <= n; k = k < 4 ? k + 1 : k + (k + 3) / 4) {
		double p = price_group(s, k, mean, sd, s->split ? 0 : s->rs.slots_used);
		double sk = slot + p / k, rho = lambda * sk, w;

		if (rho >= 1.0)
			continue;
		w = (rho > 0.01 ? sk / (2.0 * (1.0 - rho)) * log(100.0 * rho) : 0.0) + (k - 1) * sk + p;
		if (w < best) {
			best = w;
			best_k = k;
		}
	}
	a->w99 = best_k ? best : 0.0;
	return best_k;
}

static void refresh(bkv_sched *s)
{
	bkv__auto *a = s->autos;
	double mean, sd, r, h, d_n, best = INFINITY;
	uint32_t n = s->cfg.max_running, k, best_k = 1;

	prompt_stats(a, &mean, &sd);
	a->k_step = s->plan.step_no;
	a->cap = batch_cap(s, mean);
	n = a->cap;
	/* h: the fixed part of a decode call, per slot */
	d_n = price_decode(s, n, mean);
	h = n > 1 ? (d_n - (double)n * (d_n - price_decode(s, n - 1, mean))) / n : d_n;
	if (h < 1e-3 * d_n / n)
		h = 1e-3 * d_n / n;
	r = a->step_sum > 0.0 ? a->freed_sum / a->step_sum : 0.0;
	if (r <= 0.0 || d_n <= 0.0) {
		a->k_star = 1;
		a->k_lat = 0;
		a->w99 = 0.0;
		return;
	}
	for (k = 1; k <= n; k = k < 4 ? k + 1 : k + (k + 3) / 4) {
		double p = price_group(s, k, mean, sd, s->rs.slots_used);
		double j = p / k + h * k / (2.0 * r);

		/* a TPOT target caps what one split prefill call may take
		 * (admission stops there): waiting for more slots than that
		 * only idles them */
		if (a->tpot_us && s->split && k > 1 && p + d_n > a->tpot_us)
			break;
		if (j < best) {
			best = j;
			best_k = k;
		}
	}
	a->k_star = best_k;
	a->k_lat = latency_group(s, mean, sd, n);
}

/* P(X >= x) for X Poisson with mean mu: the normal approximation with a
 * continuity correction (exact enough for a sum of small probabilities),
 * erfc by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7; one
 * exp instead of libm's erfc, which costs about twice as much). */
static double poisson_tail(double mu, double x)
{
	double z, t, e;

	if (x <= 0.0)
		return 1.0;
	if (mu <= 0.0)
		return 0.0;
	z = (x - 0.5 - mu) / sqrt(2.0 * mu);
	if (z > 6.0)
		return 0.0;
	t = 1.0 / (1.0 + 0.3275911 * fabs(z));
	e = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 +
								       t * 1.061405429)))) *
	    exp(-z * z);
	return z >= 0.0 ? 0.5 * e : 1.0 - 0.5 * e;
}

/* Congestion ahead: the expected number of arrivals that will find every
 * slot taken before the rows running now (and q rows admitted now) have
 * ended. The calendar says how many slots free at each step if the lanes
 * run to max_new; arrivals come at lambda per us, ts us per step, and hold
 * a slot for about `hold` steps (taken as exponential), so after j steps
 * the arrivals still running are Poisson with mean m_j, m_j = m_{j-1}
 * e^(-1/hold) + lambda ts. An arrival in step j is blocked when they fill
 * the slots the running rows leave: P(Poisson(m_j) >= cap - R_j), R_j the
 * rows still running. Every such request waits for a slot that a running
 * row frees, so it waits longer by any time spent now. Stops once the sum
 * exceeds `enough` (the caller's break-even). O(steps until the running
 * rows end), at most AUTO_RING. */
static double blocked_ahead(const bkv_sched *s, uint32_t q, double lambda, double hold, double ts,
			    double enough)
{
	const bkv__auto *a = s->autos;
	double scale, R, m = 0.0, nq = 0.0, keep, m_max, far, per = lambda * ts;
	uint32_t j, left = a->ends_n;

	if (per <= 0.0)
		return 0.0;
	/* lanes that ended early (a stop token, an abort, preemption) leave
	 * their entries behind: scale the calendar to the rows running */
	scale = a->ends_n > s->rs.slots_used ? (double)s->rs.slots_used / a->ends_n : 1.0;
	R = (double)(s->rs.slots_used + q);
	keep = exp(-1.0 / (hold > 1.0 ? hold : 1.0));
	m_max = per / (1.0 - keep); /* m_j rises towards it */
	far = 6.0 * sqrt(2.0 * m_max) + m_max + 0.5;
	for (j = 1; j < AUTO_RING && left > 0 && nq <= enough; j++) {
		uint32_t e = a->ends[(s->plan.step_no + j) % AUTO_RING];

		left -= e;
		R -= scale * e;
		/* R only falls and m stays below m_max: once the tail is
		 * negligible (poisson_tail's 6 sigma) at m_max it stays so */
		if ((double)a->cap - R > far)
			break;
		nq += per * poisson_tail(m, ceil((double)a->cap - R));
		m = m * keep + per;
	}
	return nq;
}

/* Wait one step rather than admit now? Admitting now costs a prefill call
 * P(m) for the m rows at the head; waiting lets the next step's call take
 * them together with the rows that come free by then (x), saving the fixed
 * part of one call, Delta = P(m) + P(x) - P(m + x). Priced in requests x
 * time (the sum of TTFT):
 *
 *   cost of waiting = m (d(n) + P(m + x) - P(m))       the m rows wait a
 *                                                      decode-only step
 *   gain of waiting = Delta (x + behind + p_call blocked)  one call fewer
 *
 * behind: queued rows after them; blocked: the arrivals that will find
 * every slot taken before the running rows end (blocked_ahead), each of
 * which a call now delays by Delta. Below saturation x is an arrival
 * during the step (lambda d(n) of them; a call is saved, p_call, when at
 * least one comes); at saturation it is the slots the calendar says free
 * next step. A request is never held past w99, the p99 wait the latency
 * model predicts (the hold must not make it a tail request). */
static int defer_pays(bkv_sched *s, uint64_t now, uint32_t m, int saturated)
{
	bkv__auto *a = s->autos;
	double mean, sd, d, pm, px, pmx, delta, x, p_call, ts, cost, need, behind, lambda;
	uint64_t enq = s->q.heap[0]->enq_us;
	uint32_t dr = s->split ? 0 : s->rs.slots_used; /* mixed: the chunks' share */

	/* w99 > 0: a refresh saw congestion with arrival gaps (not a burst) */
	if (a->k_step == 0 || a->w99 <= 0.0 || m == 0 || a->gap_sum <= 0.0 ||
	    a->freed_slow <= 0.0)
		return 0;
	if (now > enq && (double)(now - enq) >= a->w99)
		return 0;
	lambda = a->gap_w / a->gap_sum; /* arrivals per us */
	prompt_stats(a, &mean, &sd);
	d = price_decode(s, s->rs.slots_used, mean);
	pm = price_group(s, m, mean, sd, dr);
	if (saturated) {
		uint32_t nx = a->ends[(s->plan.step_no + 1) % AUTO_RING];

		if (a->ends_n > s->rs.slots_used)
			nx = (uint32_t)((double)nx * s->rs.slots_used / a->ends_n);
		nx = BKV_MIN(nx, s->q.queue_slots - m);
		if (nx == 0)
			return 0; /* nothing to merge with next step */
		x = nx;
		p_call = 1.0;
		ts = d; /* this step, without a call */
		behind = (double)(s->q.queue_slots - m - nx);
		px = price_group(s, nx, mean, sd, dr);
		pmx = price_group(s, m + nx, mean, sd, dr);
	} else {
		/* a step ahead: the decode call, and a prefill call when
		 * something arrived during the last one (for blocked_ahead);
		 * waiting now makes this one a decode-only step */
		px = price_group(s, 1, mean, sd, dr);
		ts = d + (1.0 - exp(-lambda * d)) * px;
		x = lambda * d;               /* arrivals during this step */
		p_call = 1.0 - exp(-x);       /* at least one: a call saved */
		behind = 0.0;
		pmx = price_group(s, m + 1, mean, sd, dr);
	}
	delta = pm + px - pmx;
	if (delta <= 0.0)
		return 0;
	cost = (double)m * (d + (saturated ? 1.0 : x) * (pmx - pm));
	/* blocked arrivals needed to make waiting pay */
	need = (cost / delta - x - behind) / p_call;
	if (need < 0.0)
		return 1;
	return blocked_ahead(s, saturated ? 0 : m, lambda, a->used_sum / a->freed_slow, ts, need) >
	       need;
}

/* Continuous policy, admission group auto: may this step admit? */
int bkv__auto_admit(bkv_sched *s, uint64_t now, uint32_t free_slots)
{
	bkv__auto *a = s->autos;
	uint32_t k;

	if (s->rs.slots_used >= a->cap && s->rs.nr_run > 0)
		return 0;
	if (s->rs.nr_run == 0)
		return 1; /* nothing runs: nothing to wait for */
	if (s->q.queue_slots <= free_slots) /* below saturation: everything fits */
		return !defer_pays(s, now, s->q.queue_slots, 0);
	if (a->k_step == 0 || s->plan.step_no - a->k_step >= AUTO_REFRESH_STEPS)
		refresh(s);
	/* saturation: the group that minimises the predicted p99 wait when
	 * arrivals leave headroom (latency_group), else k*; once it is there,
	 * wait one step more when the calendar's frees make that pay */
	k = a->k_star;
	if (a->k_lat)
		k = a->k_lat;
	if (free_slots < BKV_MIN(k, a->cap))
		return 0;
	return !defer_pays(s, now, BKV_MIN(free_slots, s->q.queue_slots), 1);
}

/* Within an admitting step, may request r join the group? Checks the batch
 * cap and a TPOT target (a split host's prefill call plus the decode call
 * that follows it). With nothing running r always may (no starvation).
 * Long prompts are not held back here: a split host's prefill rows are
 * packed into calls by length (bkv__auto_pack), so a long prompt costs its
 * own call in this step rather than padding the others (which beats deferring
 * it to a call of its own next step). O(rows of this group) per call with a
 * target, for the first AUTO_PRICED_ROWS rows of a step; later rows join
 * unpriced. */
int bkv__auto_admit_ok(bkv_sched *s, const bkv__req *r)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	double mean, sd, p_old, p_new, d_n;

	if (!a || s->cfg.policy == BKV_POLICY_STATIC)
		return 1;
	if (a->adm_step != s->plan.step_no) {
		a->adm_step = s->plan.step_no;
		a->adm_n = 0;
		a->adm_price = -1.0;
	}
	if (a->admit && s->rs.nr_run > 0 && s->rs.slots_used + r->n_live > a->cap &&
	    a->k_step != 0)
		return 0;
	if (!s->split || s->cfg.chunked_prefill || !a->tpot_us ||
	    a->adm_n >= AUTO_PRICED_ROWS || a->adm_n >= a->chunk_cap)
		return 1;
	a->chunks[a->adm_n].len = r->prompt_len;
	a->chunks[a->adm_n].start = 0;
	if (s->rs.nr_run > 0) {
		/* price this step's prefill call without and with r (the
		 * price without is kept from the last join) as one call: an
		 * upper bound of the packed calls */
		memset(&sh, 0, sizeof(sh));
		sh.kind = BKV_CALL_PREFILL;
		sh.chunks = a->chunks;
		sh.n_chunks = a->adm_n;
		p_old = a->adm_price >= 0.0 ? a->adm_price : a->adm_n ? price(s, &sh) : 0.0;
		sh.n_chunks = a->adm_n + 1;
		p_new = price(s, &sh);
		prompt_stats(a, &mean, &sd);
		d_n = price_decode(s, s->rs.slots_used + r->n_live, mean);
		/* the running rows wait for this call: keep their time
		 * between tokens under the target when it can be kept */
		if (p_new + d_n > a->tpot_us &&
		    p_old + price_decode(s, s->rs.slots_used, mean) <= a->tpot_us) {
			a->adm_price = p_old;
			return 0;
		}
		a->adm_price = p_new;
	} else {
		a->adm_price = -1.0; /* unknown until priced again */
	}
	a->adm_n++;
	return 1;
}

/* ---- packing prefill rows into calls ------------------------------------- */

/* Does row a sort before row b: the shorter chunk first, then the earlier
 * start, then the caller's order (a total order: the result is the same on
 * every run). */
static int pack_less(const bkv__row *rows, uint32_t a, uint32_t b)
{
	uint32_t la = rows[a].end - rows[a].start, lb = rows[b].end - rows[b].start;

	if (la != lb)
		return la < lb;
	if (rows[a].start != rows[b].start)
		return rows[a].start < rows[b].start;
	return a < b;
}

static void pack_sift(const bkv__row *rows, uint32_t *idx, uint32_t root, uint32_t n)
{
	for (;;) {
		uint32_t child = 2 * root + 1, t;

		if (child >= n)
			return;
		if (child + 1 < n && pack_less(rows, idx[child], idx[child + 1]))
			child++;
		if (!pack_less(rows, idx[root], idx[child]))
			return;
		t = idx[root];
		idx[root] = idx[child];
		idx[child] = t;
		root = child;
	}
}

/* Heapsort of the row indices idx[0, n) by pack_less: O(n log n), in place
 * (libc's qsort may allocate). */
static void pack_sort(const bkv__row *rows, uint32_t *idx, uint32_t n)
{
	uint32_t i, t;

	for (i = n / 2; i-- > 0;)
		pack_sift(rows, idx, i, n);
	for (i = n; i-- > 1;) {
		t = idx[0];
		idx[0] = idx[i];
		idx[i] = t;
		pack_sift(rows, idx, 0, i);
	}
}

/* Split host, admission auto: the step's n prefill rows as the cheapest set
 * of prefill calls. The rows are sorted by chunk length (then start), and
 * the calls are contiguous runs of that order: on a kernel that pads every
 * row to the longest, a call should hold rows of similar length, and
 * for chunks that start at 0 some optimal partition of a padded kernel's rows
 * is such runs (swap a long row of the call with the shorter maximum and a
 * short row of the other: neither maximum grows, no call changes size). Runs are priced with the scheduler's model as the prefill
 * call they would be (each run's chunks, no padding rows), and a dynamic
 * programme over the run boundaries finds the cheapest partition:
 *
 *     best[0] = 0,   best[j] = min_{i < j} best[i] + P(rows cut[i] .. cut[j])
 *
 * Boundaries are only where the (length, start) changes, so rows of one
 * shape always share a call, and at most AUTO_PACK_CUTS of them are kept
 * (evenly spread): O(AUTO_PACK_CUTS^2) prices, each O(rows of its run) in
 * the model. The single call is one of the candidates and ties keep the
 * fewer calls, so the partition's predicted price is never above one call's;
 * a model without padding (ragged prefill) prices one call cheapest (one
 * fixed part) and gets one. Returns the number of calls; with 2 or more,
 * *sorted (scratch taken at create), *order (sorted[i] is rows[order[i]])
 * and *ends (call g is sorted[ends[g-1] .. ends[g]), ends[-1] = 0) are set,
 * valid until the next call. 1 means one call over rows as given. */
uint32_t bkv__auto_pack(bkv_sched *s, const bkv__row *rows, uint32_t n, bkv__row **sorted,
			const uint32_t **order, const uint32_t **ends)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	uint32_t i, j, k = 0, g;

	if (!a || !a->admit || !s->split || n < 2 || n > a->pack_cap || n > a->chunk_cap ||
	    !s->cfg.cost.step_us)
		return 1;
	for (i = 0; i < n; i++)
		a->pack_order[i] = i;
	pack_sort(rows, a->pack_order, n);
	for (i = 0; i < n; i++) {
		const bkv__row *r = &rows[a->pack_order[i]];

		a->pack_rows[i] = *r;
		a->chunks[i].len = r->end - r->start;
		a->chunks[i].start = r->start;
		if (i == 0 || a->chunks[i].len != a->chunks[i - 1].len ||
		    a->chunks[i].start != a->chunks[i - 1].start)
			a->pack_cut[k++] = i;
	}
	a->pack_cut[k++] = n;
	if (k == 2)
		return 1; /* one shape: one call */
	if (k - 2 > AUTO_PACK_CUTS) { /* keep every stride-th inner boundary */
		uint32_t stride = (k - 2 + AUTO_PACK_CUTS - 1) / AUTO_PACK_CUTS, kept = 1;

		for (i = 1; i + 1 < k; i++)
			if (i % stride == 0)
				a->pack_cut[kept++] = a->pack_cut[i];
		a->pack_cut[kept++] = n;
		k = kept;
	}
	memset(&sh, 0, sizeof(sh));
	sh.kind = BKV_CALL_PREFILL;
	a->pack_best[0] = 0.0;
	for (j = 1; j < k; j++) {
		double best = INFINITY;
		uint32_t from = 0;

		for (i = 0; i < j; i++) {
			double t;

			sh.chunks = a->chunks + a->pack_cut[i];
			sh.n_chunks = a->pack_cut[j] - a->pack_cut[i];
			t = a->pack_best[i] + price(s, &sh);
			/* a later start must save AUTO_PACK_GAIN: ties (and
			 * rounding) keep the longer last call, fewer calls */
			if (t < best * (1.0 - AUTO_PACK_GAIN)) {
				best = t;
				from = i;
			}
		}
		a->pack_best[j] = best;
		a->pack_from[j] = from;
	}
	g = 0;
	for (j = k - 1; j > 0; j = a->pack_from[j])
		g++;
	if (g < 2)
		return 1;
	i = g;
	for (j = k - 1; j > 0; j = a->pack_from[j])
		a->pack_end[--i] = a->pack_cut[j];
	*sorted = a->pack_rows;
	*order = a->pack_order;
	*ends = a->pack_end;
	return g;
}

/* ---- token budget -------------------------------------------------------- */

/* Chunked prefill, budget auto: the tokens this step may compute, decode
 * rows included. With a TPOT target: the largest budget whose predicted
 * mixed call (the running rows plus prefill chunks of typical prompts) keeps
 * it; otherwise the budget whose prefill tokens are cheapest (see below).
 * Within [running + 1, cap]. O(log cap) prices. */
uint32_t bkv__auto_budget(bkv_sched *s, uint32_t fixed, uint32_t cap)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	double mean, sd, best = -1.0, t0, pl;
	uint32_t d = s->rs.slots_used, lo, hi, b, best_b;

	if (!a || !a->budget)
		return fixed;
	if (cap <= d + 1)
		return cap;
	prompt_stats(a, &mean, &sd);
	/* budget tokens priced as the tails of long prompts (the top of the
	 * observed range): attention grows with a chunk's offset, so this is
	 * the conservative shape for a latency target */
	pl = expected_max(mean, sd, UINT32_MAX - 1);
	/* a step prefills at most max_running prompts' worth: larger budgets
	 * are never used, and the priced shape has room for that many chunks */
	if ((double)cap > (double)d + (double)a->chunk_cap * (pl < 1.0 ? 1.0 : pl))
		cap = d + (uint32_t)((double)a->chunk_cap * (pl < 1.0 ? 1.0 : pl));
	if (cap <= d + 1)
		return cap;
	memset(&sh, 0, sizeof(sh));
	sh.kind = BKV_CALL_MIXED;
	sh.decode_rows = d;
	sh.padded_rows = d;
	/* the running rows' context as the last decode call saw it (long
	 * prompts stay longer in the running set than in the arrivals, so
	 * the prompt mean would underprice a long-context decode call) */
	sh.decode_context = (uint64_t)((double)d * (s->plan.dec_ctx_row > 0.0
						     ? s->plan.dec_ctx_row + 1.0
						     : mean + AUTO_CTX_EXTRA));
	sh.chunks = a->chunks;
#define PRICE_B(pb, out)                                                       \
	do {                                                                   \
		uint32_t left_ = (pb), i_ = 0;                                 \
		uint32_t m_ = (uint32_t)(pl < 1.0 ? 1.0 : pl);                 \
		while (left_ && i_ < a->chunk_cap) {                           \
			uint32_t l_ = BKV_MIN(left_, m_);                      \
			a->chunks[i_].len = l_;                                \
			a->chunks[i_].start = m_ - l_; /* a prompt's tail */   \
			left_ -= l_;                                           \
			i_++;                                                  \
		}                                                              \
		sh.n_chunks = i_;                                              \
		(out) = price(s, &sh);                                         \
	} while (0)
	if (a->tpot_us) {
		double t1;

		PRICE_B(1, t1);
		if (t1 <= a->tpot_us) {
			lo = 1;
			hi = cap - d;
			while (lo < hi) {
				uint32_t mid = hi - (hi - lo) / 2;
				double t;

				PRICE_B(mid, t);
				if (t <= a->tpot_us)
					lo = mid;
				else
					hi = mid - 1;
			}
			return d + lo;
		}
	}
	/* the cheapest prefill tokens: least (added time + 1% of the decode
	 * call) per prefill token, the largest budget on ties. A decode call
	 * with slack (memory-bound) takes prefill tokens for free up to where
	 * it turns compute-bound: that knee is the choice. */
	PRICE_B(0, t0);
	best_b = cap - d;
	for (b = 16; ; b *= 2) {
		double t, per;

		if (b > cap - d)
			b = cap - d;
		PRICE_B(b, t);
		per = (t - t0 + 0.01 * t0) / (double)b;
		if (best < 0.0 || per <= best * 1.001) {
			if (best < 0.0 || per < best)
				best = per;
			best_b = b;
		}
		if (b == cap - d)
			break;
	}
#undef PRICE_B
	return d + best_b;
}

/* Chunked prefill with a TPOT target on a mixed host: the longest chunk, at
 * most c, that a lane at offset start may add to this step's forward while
 * the step's predicted time keeps the target. The budget priced its tokens
 * as the tails of typical long prompts; a chunk deep inside a longer prompt
 * attends to more context than that, which only its offset tells (Mooncake's
 * 100k-token prompts broke the target by 2x without this). The shape priced
 * is the step's as planned so far: its decode rows with their real context,
 * the chunks already planned, and this one. Returns c when no target applies
 * or when not even one token fits beside the decode rows alone (the target
 * is out of reach in this step; the prompt still progresses), 0 when the
 * chunks already planned leave no room (the lane waits a step). O(log c)
 * prices, each O(chunks planned); the decode context is summed once a step
 * (O(decode rows), the scheduled work). */
uint32_t bkv__auto_chunk_fit(bkv_sched *s, uint32_t start, uint32_t c)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	uint32_t i, n = s->plan.n_pre, lo, hi;

	if (!a || !a->tpot_us || s->split || !s->cfg.cost.step_us || c <= 1 ||
	    n + 1 > a->chunk_cap)
		return c;
	if (a->fit_step != s->plan.step_no) {
		/* the fused decode pass summed its rows' context already */
		uint64_t ctx = s->plan.fill_rows ? s->plan.fill_ctx : 0;

		BKV_ASSERT(s->plan.fill_rows <= s->plan.n_dec);
		for (i = s->plan.fill_rows; i < s->plan.n_dec; i++)
			ctx += s->plan.dec[i].end;
		a->fit_ctx = ctx;
		a->fit_step = s->plan.step_no;
	}
	for (i = 0; i < n; i++) {
		a->chunks[i].start = s->plan.pre[i].start;
		a->chunks[i].len = s->plan.pre[i].end - s->plan.pre[i].start;
	}
	memset(&sh, 0, sizeof(sh));
	sh.kind = BKV_CALL_MIXED;
	sh.decode_rows = s->plan.n_dec;
	sh.padded_rows = s->plan.n_dec;
	sh.decode_context = a->fit_ctx;
	sh.chunks = a->chunks;
	sh.n_chunks = n + 1;
	a->chunks[n].start = start;
#define FITS(ln_) (a->chunks[n].len = (ln_), price(s, &sh) <= (double)a->tpot_us)
	if (FITS(c))
		return c;
	if (!FITS(1))
		return n == 0 ? c : 0;
	lo = 1;
	hi = c - 1;
	while (lo < hi) {
		uint32_t mid = hi - (hi - lo) / 2;

		if (FITS(mid))
			lo = mid;
		else
			hi = mid - 1;
	}
#undef FITS
	return lo;
}

/* ---- preemption ---------------------------------------------------------- */

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
	recompute_us = price(s, &sh);
	return swap_us < recompute_us;
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
