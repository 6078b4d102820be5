/*
 * budget.c - the token budget: how many tokens a step may compute, and how
 * long a prefill chunk may be.
 *
 * Without chunked prefill the budget is the batch arrays' capacity; with
 * it, the configured token_budget, or with token_budget 0 the cost model's
 * choice per step (auto_budget: the budget with the least predicted time to
 * first token of the last prompt waiting, among those whose predicted step
 * keeps the TPOT target when one is set; docs/cost-model.md, "Token budget
 * (chunked prefill)"). A chunk is what remains of the prompt, capped by the
 * budget left (bkv__chunk_len, decide.h), and on a mixed host with a TPOT
 * target shortened until the step's predicted time keeps it
 * (bkv__auto_chunk_fit).
 */
#include "decide/decide.h"

#include <math.h>
#include <string.h>


/* The price of a step that decodes sh's rows and prefills pb budget tokens,
 * laid out as chunks of prompts of pl tokens (a->chunks): each a prompt's
 * tail (mid 0: the deepest offset, the conservative shape for a TPOT
 * target), or (mid 1) at the average offset of a chunk of its length, half
 * way into the rest of the prompt (every prompt is computed whole however it
 * is chunked: the shape for a prefill rate). */
static double price_budget_at(bkv_sched *s, bkv_step_shape *sh, double pl, uint32_t pb, int mid)
{
	bkv__auto *a = s->autos;
	uint32_t left = pb, i = 0;
	uint32_t m = (uint32_t)(pl < 1.0 ? 1.0 : pl);

	while (left && i < a->chunk_cap) {
		uint32_t l = BKV_MIN(left, m);

		a->chunks[i].len = l;
		a->chunks[i].start = mid ? (m - l) / 2 : m - l;
		left -= l;
		i++;
	}
	sh->n_chunks = i;
	return bkv__price(s, sh);
}

static double price_budget(bkv_sched *s, bkv_step_shape *sh, double pl, uint32_t pb)
{
	return price_budget_at(s, sh, pl, pb, 0);
}

/* With a TPOT target: the largest budget (1..room) whose step keeps it, by
 * bisection; 0 when even one token does not. */
static uint32_t budget_for_tpot(bkv_sched *s, bkv_step_shape *sh, double pl, uint32_t room)
{
	const double target = s->autos->tpot_us;
	uint32_t lo = 1, hi = room;

	if (price_budget(s, sh, pl, 1) > target)
		return 0;
	while (lo < hi) {
		uint32_t mid = hi - (hi - lo) / 2;

		if (price_budget(s, sh, pl, mid) <= target)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* The prefill work waiting, tokens: what the admitted prompts have still to
 * compute (admitted prompt tokens less those computed or served by the
 * prefix cache) and the queue's requests that free slots can take, at per
 * tokens each (the caller passes the top of the observed prompt range: the
 * tail request is the one a p99 TTFT is about). The queue behind a full set
 * of slots waits for slots to free, which a larger chunk does not hasten
 * (its longer steps slow the decode rows that free them): counting it made
 * the budget grow with the queue once max_running bound. At least one
 * prompt, the next arrival's. O(1). */
static double backlog_tokens(const bkv_sched *s, double per)
{
	const bkv__auto *a = s->autos;
	double done = (double)s->stats.prefill_tokens + (double)s->stats.hit_tokens;
	double owed = a->adm_tokens > done ? a->adm_tokens - done : 0.0;
	uint32_t free_slots = s->cfg.max_running > s->rs.slots_used
				      ? s->cfg.max_running - s->rs.slots_used
				      : 0;
	double w = owed + (double)BKV_MIN(s->q.queue_slots, free_slots) * per;

	return w > per ? w : per;
}

/* The default objective: the budget that minimises the predicted time to
 * first token of the last prompt waiting, F(b) = max(W / b, 1) T(b) + T(b):
 * the backlog's W prefill tokens at b a step of T(b) us (one step when they
 * fit), then the step that samples its first token. Under load W is large
 * and the rate decides (a bigger budget, up to where the step turns
 * compute-bound and the rate flattens); with little waiting one prompt's
 * prefill and the step's own length decide (the budget where a decode call
 * stops taking prefill tokens for free). Budgets 16 * 2^(i/4) up to room
 * (and room), each priced; room is bounded by a TPOT target. Predictions
 * within AUTO_BUDGET_TIE of the least are a tie, taken at the smallest
 * budget (shorter steps: time between tokens). A TTFT target does not
 * change the choice: the least predicted TTFT is what serves it (a smaller
 * budget within half the target, tried, lowered goodput on every workload
 * of docs/benchmarks.md). O(4 log2 room) prices. */
static uint32_t budget_ttft(bkv_sched *s, bkv_step_shape *sh, double pl, uint32_t room,
			    double w)
{
	double best = INFINITY, f[AUTO_BUDGET_LADDER];
	uint32_t bs[AUTO_BUDGET_LADDER], n = 0, i;

	for (i = 0; n < AUTO_BUDGET_LADDER; i++) {
		double bf = 16.0 * pow(2.0, (double)i / 4.0);
		uint32_t b = bf < (double)room ? (uint32_t)bf : room;
		double t;

		t = price_budget_at(s, sh, pl, b, 1);
		if (t <= 0.0)
			return room; /* the model has no answer: the most */
		bs[n] = b;
		f[n] = (w > (double)b ? w / (double)b : 1.0) * t + t;
		if (f[n] < best)
			best = f[n];
		n++;
		if (b == room)
			break;
	}
	for (i = 0; i < n; i++) /* the smallest within AUTO_BUDGET_TIE */
		if (f[i] <= best * (1.0 + AUTO_BUDGET_TIE))
			return bs[i];
	return room;
}

static uint32_t auto_budget(bkv_sched *s, uint32_t fixed, uint32_t cap)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	double mean, sd, pl;
	uint32_t d = s->rs.slots_used, b, room;

	if (!a || !a->budget)
		return fixed;
	/* lanes still prefilling take budget only as chunks: the decode rows
	 * are those the last step left decoding */
	if (a->have_used && a->dec_next < d)
		d = a->dec_next;
	if (cap <= d + 1)
		return cap;
	bkv__prompt_stats(a, &mean, &sd);
	/* budget tokens priced as the tails of long prompts (the top of the
	 * observed range): attention grows with a chunk's offset, so this is
	 * the conservative shape for a latency target */
	pl = bkv__expected_max(mean, sd, UINT32_MAX - 1);
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
	room = cap - d;
	if (a->tpot_us && (b = budget_for_tpot(s, &sh, pl, room)) > 0)
		room = b; /* the target bounds the budget */
	return d + budget_ttft(s, &sh, pl, room, backlog_tokens(s, pl));
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
#define FITS(ln_) (a->chunks[n].len = (ln_), bkv__price(s, &sh) <= (double)a->tpot_us)
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

/* Without chunked prefill: the batch arrays' capacity (a prompt runs whole
 * unless it does not fit). */
static uint32_t budget_whole(bkv_sched *s)
{
	return s->call.arr.bufs.tok_cap;
}

static uint32_t budget_fixed(bkv_sched *s)
{
	return s->cfg.token_budget;
}

static uint32_t budget_auto(bkv_sched *s)
{
	return auto_budget(s, s->cfg.token_budget, s->call.arr.bufs.tok_cap);
}

void bkv__budget_choose(bkv__policy *p, const bkv_sched_config *user)
{
	if (!user->chunked_prefill)
		p->budget = budget_whole;
	else
		p->budget = user->token_budget == 0 ? budget_auto : budget_fixed;
}
