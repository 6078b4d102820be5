/*
 * admit.c - admission: whether a step admits from the queue, and whether
 * each request may join the group being admitted.
 *
 * Admission (continuous policy) with group k, free slots f, queue slots q:
 * admit when f >= k, or when q <= f (the queue cannot supply more: everything
 * waiting fits), or when the current group has been forming for max_wait_us
 * (measured from the later of the head's enqueue time and the last admission:
 * with a backlog every head has waited long since arrival, so measuring from
 * arrival would turn k into 1 as soon as a backlog forms). Static: admit only
 * when nothing runs, then fill max_running.
 *
 *
 * With admission group 0 the cost model decides instead (admit_auto; the
 * derivation, economic order quantity and congestion pricing, is in
 * decide.c's prose and docs/cost-model.md), and it caps the batch and keeps
 * a TPOT target while a group forms (admit_ok_continuous). A TTFT target
 * bounds how long a request is held for company (defer_pays) and lets a
 * request that has waited half of it past the batch cap's knee (cap_for).
 */
#include "decide/decide.h"

#include <math.h>
#include <string.h>

/* ---- the fixed rules -------------------------------------------------------- */

/* Static batching: a new batch only when nothing runs. */
static int admit_static(bkv_sched *s, uint64_t now, uint32_t free_slots)
{
	(void)now;
	(void)free_slots;
	return s->rs.nr_run == 0;
}

/* A fixed group k (admit_group): admit when k slots are free, when the
 * queue cannot supply more, or when the group has formed for max_wait_us. */
static int admit_fixed(bkv_sched *s, uint64_t now, uint32_t free_slots)
{
	const bkv__req *head;
	uint64_t since;

	if (free_slots >= s->cfg.admit_group)
		return 1;
	if (s->q.queue_slots <= free_slots)
		return 1; /* the queue cannot supply a bigger group */
	if (s->cfg.max_wait_us == UINT64_MAX)
		return 0;
	head = bkv__queue_head(s, now);
	since = BKV_MAX(head->enq_us, s->rs.last_admit_us);
	return now >= since && now - since >= s->cfg.max_wait_us;
}

/* Static batching takes whatever fits. */
static int admit_ok_any(bkv_sched *s, const bkv__req *r)
{
	(void)s;
	(void)r;
	return 1;
}

/* Static batching: the batch just admitted into an empty scheduler is the
 * group its decode calls are padded to. */
static void admit_end_static(bkv_sched *s, int was_empty)
{
	if (was_empty && s->rs.nr_run)
		s->rs.group_size = s->rs.slots_used;
}

static void admit_end_none(bkv_sched *s, int was_empty)
{
	(void)s;
	(void)was_empty;
}

static uint32_t padded_static(const bkv_sched *s, uint32_t n_decode)
{
	return n_decode && s->rs.group_size > n_decode ? s->rs.group_size : n_decode;
}

static uint32_t padded_none(const bkv_sched *s, uint32_t n_decode)
{
	(void)s;
	return n_decode;
}

int bkv__admit_allowed(const bkv_sched *s, uint64_t now)
{
	uint32_t free_slots = s->cfg.max_running - s->rs.slots_used;

	if (s->q.heap_n == 0 || free_slots == 0)
		return 0;
	return s->pol.admit((bkv_sched *)s, now, free_slots);
}

/* ---- the cost model's rule ------------------------------------------------ */

/* Batch cap: the fewest rows whose predicted cost per decode token is within
 * AUTO_KNEE of the best at max_running (past it more rows buy no throughput,
 * only latency and KV), and no more rows than a TPOT target allows. A row
 * count the model has no price for (0) is not the knee: a calibrated fit of
 * sub-tick noise can price small decode calls below zero (clamped), and a
 * free decode row would cap the batch at one row (issue 13). The TPOT
 * target's bound alone is kept in a->cap_tpot (max_running without one). */
static uint32_t batch_cap(const bkv_sched *s, double mean)
{
	bkv__auto *a = s->autos;
	uint32_t n_max = s->cfg.max_running, lo = 1, hi = n_max, cap;
	double best = bkv__price_decode(s, n_max, mean) / n_max;

	a->cap_tpot = n_max;
	if (best <= 0.0)
		return n_max;
	while (lo < hi) { /* per-token cost falls with n: smallest n at knee */
		uint32_t mid = lo + (hi - lo) / 2;
		double d = bkv__price_decode(s, mid, mean);

		if (d > 0.0 && d / mid <= AUTO_KNEE * best)
			hi = mid;
		else
			lo = mid + 1;
	}
	cap = lo;
	if (a->tpot_us && bkv__price_decode(s, 1, mean) <= a->tpot_us) {
		lo = 1;
		hi = n_max;
		while (lo < hi) { /* largest n whose decode call keeps the target */
			uint32_t mid = hi - (hi - lo) / 2;

			if (bkv__price_decode(s, mid, mean) <= a->tpot_us)
				lo = mid;
			else
				hi = mid - 1;
		}
		a->cap_tpot = lo;
		cap = BKV_MIN(cap, lo);
	}
	return cap;
}

/* Has r waited half its TTFT target (when there is one)? Then the batch
 * cap's knee does not hold it back (past the knee more rows cost time
 * between tokens, which a TPOT target bounds, and waiting costs the
 * target): its cap is the TPOT target's alone (cap_tpot). */
static int ttft_due(const bkv_sched *s, const bkv__req *r, uint64_t now)
{
	const bkv__auto *a = s->autos;

	return a->ttft_us && now > r->enq_us && now - r->enq_us >= a->ttft_us / 2;
}

static uint32_t cap_for(const bkv_sched *s, const bkv__req *r, uint64_t now)
{
	return ttft_due(s, r, now) ? s->autos->cap_tpot : s->autos->cap;
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
	slot = bkv__price_decode(s, n, mean) * occ / n; /* us per slot, decode */
	for (k = 1; k <= n; k = k < 4 ? k + 1 : k + (k + 3) / 4) {
		double p = bkv__price_group(s, k, mean, sd, s->split ? 0 : s->rs.slots_used);
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

	bkv__prompt_stats(a, &mean, &sd);
	a->k_step = s->plan.step_no;
	a->cap = batch_cap(s, mean);
	n = a->cap;
	/* h: the fixed part of a decode call, per slot */
	d_n = bkv__price_decode(s, n, mean);
	h = n > 1 ? (d_n - (double)n * (d_n - bkv__price_decode(s, n - 1, mean))) / n : d_n;
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
		double p = bkv__price_group(s, k, mean, sd, s->rs.slots_used);
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
 * model predicts (the hold must not make it a tail request), nor past half
 * a TTFT target. */
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
	/* nor past half a TTFT target (the other half is its prefill and
	 * the queue it may still meet) */
	if (a->ttft_us && now > enq && now - enq >= a->ttft_us / 2)
		return 0;
	lambda = a->gap_w / a->gap_sum; /* arrivals per us */
	bkv__prompt_stats(a, &mean, &sd);
	d = bkv__price_decode(s, s->rs.slots_used, mean);
	pm = bkv__price_group(s, m, mean, sd, dr);
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
		px = bkv__price_group(s, nx, mean, sd, dr);
		pmx = bkv__price_group(s, m + nx, mean, sd, dr);
	} else {
		/* a step ahead: the decode call, and a prefill call when
		 * something arrived during the last one (for blocked_ahead);
		 * waiting now makes this one a decode-only step */
		px = bkv__price_group(s, 1, mean, sd, dr);
		ts = d + (1.0 - exp(-lambda * d)) * px;
		x = lambda * d;               /* arrivals during this step */
		p_call = 1.0 - exp(-x);       /* at least one: a call saved */
		behind = 0.0;
		pmx = bkv__price_group(s, m + 1, mean, sd, dr);
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
static int admit_auto(bkv_sched *s, uint64_t now, uint32_t free_slots)
{
	bkv__auto *a = s->autos;
	uint32_t k;

	if (s->rs.nr_run > 0 && s->rs.slots_used >= a->cap &&
	    s->rs.slots_used >= cap_for(s, bkv__queue_head(s, now), now))
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
static int admit_ok_continuous(bkv_sched *s, const bkv__req *r)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	double mean, sd, p_old, p_new, d_n;

	if (!a)
		return 1;
	if (a->adm_step != s->plan.step_no) {
		a->adm_step = s->plan.step_no;
		a->adm_n = 0;
		a->adm_price = -1.0;
	}
	if (a->admit && s->rs.nr_run > 0 && s->rs.slots_used + r->n_live > a->cap &&
	    a->k_step != 0 && s->rs.slots_used + r->n_live > cap_for(s, r, s->plan.step_us))
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
		p_old = a->adm_price >= 0.0 ? a->adm_price : a->adm_n ? bkv__price(s, &sh) : 0.0;
		sh.n_chunks = a->adm_n + 1;
		p_new = bkv__price(s, &sh);
		bkv__prompt_stats(a, &mean, &sd);
		d_n = bkv__price_decode(s, s->rs.slots_used + r->n_live, mean);
		/* the running rows wait for this call: keep their time
		 * between tokens under the target when it can be kept, and
		 * r's TTFT target has room for the wait (past half of it
		 * r joins: its TTFT is then at stake, theirs one gap) */
		if (p_new + d_n > a->tpot_us &&
		    p_old + bkv__price_decode(s, s->rs.slots_used, mean) <= a->tpot_us &&
		    !ttft_due(s, r, s->plan.step_us)) {
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

/* ---- admission by expected memory (BKV_RESERVE_OUTPUT) ------------------- */

/* Output tokens assumed for a request before any has ended. */
#define RESERVE_DEFAULT_OUT 256.0

/* Blocks lane l of r is expected to hold when it completes: its prompt and
 * its output as far as expected (predicted_output, else the mean of the
 * ended lanes, at most max_new), and at least one block past what it has
 * generated. */
static uint64_t lane_need(const bkv_sched *s, const bkv__req *r, const bkv__lane *l)
{
	const bkv__auto *a = s->autos;
	double out = r->predicted_output          ? (double)r->predicted_output
		     : a && a->out_w > 0.0 ? a->out_sum / a->out_w
					    : RESERVE_DEFAULT_OUT;
	uint64_t tok;

	if (out > (double)r->max_new)
		out = r->max_new;
	tok = (uint64_t)r->prompt_len + (uint64_t)out;
	if (tok < (uint64_t)r->prompt_len + l->n_gen + s->bt)
		tok = (uint64_t)r->prompt_len + l->n_gen + s->bt;
	return (tok + s->bt - 1) >> s->bt_shift;
}

static uint64_t req_need(const bkv_sched *s, const bkv__req *r)
{
	uint64_t n = 0;
	uint32_t i;

	for (i = 0; i < r->n; i++)
		if (!r->lane[i].done)
			n += lane_need(s, r, &r->lane[i]);
	return n;
}

/* The policy's own rule, then room: the running requests' expected need
 * (summed once a step over run[], O(running)) plus this step's admissions
 * plus r's must fit in the device blocks. Nothing running: r goes (the
 * progress rule). Prefix hits are counted as if private: conservative. */
static int admit_ok_reserve(bkv_sched *s, const bkv__req *r)
{
	bkv__auto *a = s->autos;
	uint64_t need;
	uint32_t i, live = 0;

	if (!s->pol.admit_ok_base(s, r))
		return 0;
	if (!a)
		return 1;
	if (a->res_step != s->plan.step_no) {
		a->res_step = s->plan.step_no;
		a->res_need = 0;
		for (i = 0; i < s->rs.nr_run; i++) {
			const bkv__req *q = s->rs.run[i];

			if (q->state != BKV__REQ_RUNNING)
				continue;
			a->res_need += req_need(s, q);
			live++;
		}
		if (!live)
			a->res_need = 0;
	}
	need = req_need(s, r);
	if (a->res_need > 0 && a->res_need + need > bkv__pool_attn_blocks(s->pool))
		return 0;
	a->res_need += need;
	return 1;
}

static void admit_choose_base(bkv__policy *p, const bkv_sched_config *user);

void bkv__admit_choose(bkv__policy *p, const bkv_sched_config *user)
{
	admit_choose_base(p, user);
	p->admit_ok_base = NULL;
	if (user->admit_reserve == BKV_RESERVE_OUTPUT) {
		p->admit_ok_base = p->admit_ok;
		p->admit_ok = admit_ok_reserve;
	}
}

static void admit_choose_base(bkv__policy *p, const bkv_sched_config *user)
{
	if (user->policy == BKV_POLICY_STATIC) {
		p->admit = admit_static;
		p->admit_ok = admit_ok_any;
		p->admit_end = admit_end_static;
		p->padded_rows = padded_static;
		return;
	}
	p->admit = user->admit_group == 0 ? admit_auto : admit_fixed;
	p->admit_ok = admit_ok_continuous;
	p->admit_end = admit_end_none;
	p->padded_rows = padded_none;
}
