/*
 * host.c - bkv-sim's virtual host: the real scheduler on a virtual clock.
 *
 * The host implements bkv_host_ops with no kernels at all. Each compute
 * callback turns its bkv_batch back into the bkv_step_shape a cost model
 * prices (decode rows and their context, one chunk per prefill row with its
 * length and start offset), advances the virtual clock by the model's time,
 * and writes a made-up token for every row that samples. now_us() returns
 * the virtual clock, so the scheduler measures exactly the modelled time and
 * its observe() sees it. A request is sent as a client sends it, with a cap
 * on its generated tokens (max_tokens, default SIM_MAX_TOKENS) and a stop
 * token, which the host samples when the request reaches its trace's output
 * length (so the scheduler learns the length only when the request ends);
 * with oracle set, max_new_tokens is the trace length instead (no stop).
 *
 * The driver submits each trace request once the clock reaches its arrival,
 * calls bkv_step() while anything is pending, and when a step has nothing to
 * do (everything waits for arrivals) jumps the clock to the next arrival.
 *
 *   arrivals ──submit──▶ bkv_sched ──bkv_step──▶ prefill/decode/forward
 *                           ▲                         │ now += model(shape)
 *                           └──── now_us() ◀──────────┘
 *
 * Static batching on a padded kernel keeps finished rows as padding: the
 * host prices a decode call at the rows of the group its last prefill
 * started (the same rule the scheduler uses for bkv_step_shape.padded_rows).
 *
 * sim_run goes in named steps: run_alloc (timelines), open_pool,
 * open_sched, drive (submit_arrivals, step_checked, account_step per step)
 * and collect (the results), then run_close.
 *
 * With an external KV tier (--ext-tier, ext.c) the driver also completes,
 * before each step, the tier's transfers the clock has reached, and an idle
 * step waits for the next arrival or the next completion, whichever comes
 * first.
 *
 * Host overhead and overlap (--host-overhead-us, --overlap [N]; the last
 * part of this file): the host spends host_overhead_us of its own CPU time on
 * every step. Synchronously that time comes before each step's device time.
 * The overlapped contract drives bkv_step_launch / bkv_step_complete at depth
 * N: the device (a second timeline, dev_free) runs a launched step from the
 * later of its launch and the end of the step before, while the host
 * prepares and launches the next, up to N steps ahead of the device;
 * completing a step waits for its device end. The virtual device samples a
 * launched step's tokens at once, so it resolves each placeholder
 * BKV_TOKEN_PENDING_AT(back, i) from the outstanding step launched back
 * launches before (their next_tokens stay valid until they complete) and
 * checks that it names that step's sampled row of the same sequence, one
 * position back; a placeholder that does not fails the launch.
 */
#include "sim.h"
#include "shape.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Outstanding steps of the overlapped contract at most: N + 1. */
#define OV_SLOTS (BKV_OVERLAP_MAX_DEPTH + 1)

/* One request's timeline, in virtual microseconds. */
typedef struct vreq {
	double first_us;  /* first token; < 0 before it */
	double last_us;   /* when on_token last delivered one */
	double finish_us; /* end; < 0 before it */
	uint32_t n_tok;   /* tokens delivered by on_token */
	uint8_t failed;   /* ended by abort or error */
} vreq;

typedef struct vhost {
	const sim_config *cfg;  /* the run's settings */
	const trace *t;         /* the trace */
	sim_result *res;        /* accumulators */
	bkv_sched *sched;       /* the scheduler driven */
	double now;             /* virtual clock, us */
	vreq *req;              /* [t->n] timelines */
	uint32_t n_done;        /* requests ended */
	uint32_t group;         /* rows of the last static group */
	bkv_chunk_shape *chunks; /* scratch for a call's chunks */
	uint32_t chunk_cap;     /* entries of chunks */
	uint32_t next_token;    /* made-up token counter */
	double call_us;         /* host time of the current step */
	uint64_t noise_rng;     /* the clock noise's generator state */
	float *gaps;            /* [n_gaps] time between consecutive tokens
				   of a request, us */
	size_t n_gaps;          /* entries used */
	size_t gap_cap;         /* entries allocated; 0 after a failed grow
				   (gaps are then no longer recorded) */
	int gap_oom;            /* a grow failed: tbt_p99 is not reported */
	double spec_blocks;     /* sum over decode calls of the blocks drafts
				   held past the rows' tokens, per row */
	double spec_reserve;    /* ... had spec_k slots been reserved per row */
	uint64_t spec_calls;    /* decode calls those sums cover */
	/* the overlapped contract (--overlap N); arrays [0, n_q) hold the
	 * outstanding steps, oldest first, n_q <= N + 1 */
	int launching;          /* the call is a launch: priced on the
				   device's timeline, the host clock stays */
	double dev_free;        /* when the device finishes what it has */
	double dev_end[OV_SLOTS]; /* device end of each outstanding step */
	uint64_t q[OV_SLOTS];   /* outstanding tickets */
	uint32_t n_q;           /* outstanding steps */
	bkv_batch ov_b[OV_SLOTS]; /* each one's batch, the struct copied at
				   launch (its arrays stay valid until the
				   step completes) */
	const int32_t *ov_next[OV_SLOTS]; /* its next_tokens, written at
				   launch */
	char ov_err[192];       /* why a placeholder failed a launch ("") */
	sim_adapters *ad;       /* --adapters: each request's adapter, the
				   calls' counts (adapters.c); NULL without */
	sim_mm *mm;             /* --mm-images: each request's images, the
				   host's encoder cache and time (mm.c);
				   NULL without */
	sim_ext *ext;           /* --ext-tier: the external KV store (ext.c);
				   NULL without */
} vhost;

/* ---- the DistServe latency model ----------------------------------------- */

/* DistServe's simulator (simdistserve, commit 33c3d3b): time_estimator.py's
 * fit for vLLM / OPT-13B / A100-80GB, TP 1, in ms, plus the per-iteration
 * overhead its worker adds (2 ms + 1e-4 ms per context token of the batch).
 * decode_context counts each row's context including its new token, which
 * is their "token_generated_list" (current_context_len + 1). */
double sim_distserve_step_us(const bkv_step_shape *s)
{
	double sum_l = 0.0, sum_l2 = 0.0, ctx = 0.0, t = 0.0;
	for (uint32_t i = 0; i < s->n_chunks; i++) {
		double l = s->chunks[i].len;
		sum_l += l;
		sum_l2 += l * l;
		ctx += s->chunks[i].start + l;
	}
	if (s->n_chunks)
		t += 23.627 + 0.15055 * sum_l + 8.6535e-6 * sum_l2;
	if (s->decode_rows) {
		double b = s->decode_rows, tok = (double)s->decode_context;
		if (b < 95)
			t += 19.5625 + 4.941e-4 * tok + 0.05061 * b;
		else
			t += 16.8386 + 4.390e-4 * tok + 0.14000 * b;
		ctx += tok - b;
	}
	if (s->n_chunks || s->decode_rows)
		t += 2.0 + 1e-4 * ctx;
	return t * 1000.0;
}

static double distserve_cb(void *ctx, const bkv_step_shape *s)
{
	(void)ctx;
	return sim_distserve_step_us(s);
}

bkv_cost_model sim_distserve_model(void)
{
	bkv_cost_model m = {distserve_cb, NULL, NULL};
	return m;
}

/* ---- pricing ------------------------------------------------------------- */

/* ---- the noisy clock (--noise) ------------------------------------------- */

/* splitmix64 */
static uint64_t noise_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static double noise_unit(uint64_t *s)
{
	return ((double)(noise_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

/* The factor on one call's time: lognormal(0, sigma) (Box-Muller), times
 * stall_x with probability stall_p, over its mean exp(sigma^2 / 2) * (1 +
 * stall_p * (stall_x - 1)): the noisy host does the same work per second
 * on average as the exact one, only spread. 1 on an exact clock. */
static double noise_factor(const sim_config *cfg, uint64_t *rng)
{
	if (!(cfg->noise_sigma > 0.0) && !(cfg->noise_stall_p > 0.0))
		return 1.0;
	double u = noise_unit(rng), v = noise_unit(rng);
	double z = sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
	double f = exp(cfg->noise_sigma * z);
	if (noise_unit(rng) < cfg->noise_stall_p)
		f *= cfg->noise_stall_x;
	double mean = exp(cfg->noise_sigma * cfg->noise_sigma / 2.0) *
		      (1.0 + cfg->noise_stall_p * (cfg->noise_stall_x - 1.0));
	return f / mean;
}

static double price(const sim_config *cfg, const bkv_step_shape *s)
{
	switch (cfg->cost_kind) {
	case SIM_COST_ROOFLINE:
		return bkv_cost_roofline_step_us(&cfg->roofline, s);
	case SIM_COST_DISTSERVE:
		return sim_distserve_step_us(s);
	case SIM_COST_POLY:
	default:
		return bkv_cost_poly_step_us(&cfg->poly, s);
	}
}

double sim_price_us(const sim_config *cfg, const bkv_step_shape *s)
{
	return price(cfg, s);
}

/* The tokens a request generates: its trace length (+ 1 for seed 000's
 * convention), cut at the cap unless the lengths are an oracle. */
static uint32_t gen_tokens(const sim_config *cfg, const trace_req *r)
{
	uint32_t n = r->output_len + (cfg->gen == SIM_GEN_STEPS ? 1u : 0u);

	if (!cfg->oracle && cfg->max_tokens && n > cfg->max_tokens)
		n = cfg->max_tokens;
	return n;
}

/* The max_new_tokens a request is sent with: the oracle, or the cap, cut
 * (as vLLM cuts max_tokens at max_model_len) to what the pool's dev_tokens
 * can hold beside the prompt, and never below the trace length. */
static uint32_t max_new_tokens(const sim_config *cfg, const trace_req *r, uint64_t dev_tokens)
{
	uint32_t n = gen_tokens(cfg, r), cap = cfg->max_tokens;

	if (cfg->oracle || !cap)
		return n;
	if (dev_tokens < (uint64_t)r->prompt_len + cap)
		cap = dev_tokens > r->prompt_len ? (uint32_t)(dev_tokens - r->prompt_len) : 0;
	return cap > n ? cap : n;
}

/* ---- speculative decoding ------------------------------------------------ */

/* A request's acceptance rate: the workload's, or drawn per request. */
static double spec_rate(const sim_config *cfg, uint64_t idx)
{
	double a = cfg->spec_accept;
	if (cfg->spec_spread > 0.0) {
		uint64_t x = (idx + 1) * 0x9e3779b97f4a7c15ull;
		x ^= x >> 29;
		x *= 0xbf58476d1ce4e5b9ull;
		x ^= x >> 32;
		a += cfg->spec_spread * (2.0 * (double)(x >> 11) / 9007199254740992.0 - 1.0);
	}
	return a < 0.0 ? 0.0 : a > 0.99 ? 0.99 : a;
}

/* The draw that decides whether the draft of request idx at position pos is
 * accepted: a function of the two only, so runs with different k see the
 * same luck at the same tokens (common random numbers: the comparisons of
 * docs/benchmarks.md are not a max over noise). */
static double spec_uniform(uint64_t idx, int32_t pos)
{
	uint64_t x = (idx + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)(uint32_t)pos << 20) ^
		     0x2545f4914f6cdd1dull;
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return (double)(x >> 11) / 9007199254740992.0;
}

/* The host's drafts: placeholders; whether one is accepted is drawn at
 * verification (spec_verify). */
static int cb_draft(void *host, uint64_t req, uint32_t branch, const int32_t *ctx, uint32_t n_ctx,
		    int32_t *out, uint32_t k, void *user)
{
	(void)host, (void)req, (void)branch, (void)ctx, (void)n_ctx, (void)user;
	for (uint32_t j = 0; j < k; j++)
		out[j] = 7;
	return (int)k;
}

static int32_t sim_token(vhost *h, const trace_req *q, int32_t pos);

/* A speculated row: accept each draft with the request's rate until one is
 * rejected (or the request reaches its trace length, which is a stop), then
 * the bonus token; the host reports the run in n_accepted. */
static void spec_verify(vhost *h, const bkv_batch *b, uint32_t r)
{
	const uint64_t idx = (uintptr_t)b->row_user[r] - 1;
	const trace_req *q = &h->t->reqs[idx];
	const uint32_t k = b->row_drafts[r];
	const int32_t q0 = b->qo_indptr[r];
	const double a = spec_rate(h->cfg, idx);
	uint32_t m = 0;

	while (m < k) {
		int32_t t = sim_token(h, q, b->positions[q0 + (int32_t)m]);
		if (t == SIM_STOP_TOKEN || spec_uniform(idx, b->positions[q0 + (int32_t)m + 1]) >= a)
			break;
		b->spec_tokens[q0 + (int32_t)m] = b->token_ids[q0 + (int32_t)m + 1];
		m++;
	}
	b->spec_tokens[q0 + (int32_t)m] = sim_token(h, q, b->positions[q0 + (int32_t)m]);
	b->n_accepted[r] = (int32_t)m;
}

/* Engine overhead (--call-overhead-us, --row-overhead-us, --prefill-scale):
 * what an engine spends beyond the forward a cost model prices. A real
 * engine's iteration also schedules, samples, detokenises and hands each
 * sequence's token to its client (vLLM v0's Python loop and API server), and
 * a fit of the forward alone misses that. The call's price t (of which
 * t_prefill is prefill work) becomes
 *
 *   prefill_scale x t_prefill + (t - t_prefill) + call_overhead_us
 *                             + row_overhead_us x rows
 *
 * and the overhead counts with the call's kind (a prefill call's as prefill
 * time, other calls' as decode time). The scheduler's own cost model does
 * not see it. examples/sim/fidelity_calib.py measures the three numbers
 * for DistServe's vLLM runs on runs held out from those it judges. */
static void engine_overhead(const sim_config *cfg, uint32_t rows, bkv_call_kind kind, double *t,
			    double *t_prefill)
{
	double scale = cfg->prefill_scale > 0.0 ? cfg->prefill_scale : 1.0;
	double over = cfg->call_overhead_us + cfg->row_overhead_us * rows;

	*t += (scale - 1.0) * *t_prefill;
	*t_prefill *= scale;
	*t += over;
	if (kind == BKV_CALL_PREFILL)
		*t_prefill += over;
}

/* A launch's placeholder v, at token t of row r, must name the sampled
 * row (without drafts) of the same sequence, one position back, in the
 * outstanding step launched BKV_TOKEN_PENDING_BACK(v) launches before.
 * Returns 0, or -1 with the reason in h->ov_err. */
static int check_placeholder(vhost *h, const bkv_batch *b, uint32_t r, int32_t t, int32_t v)
{
	const uint32_t back = BKV_TOKEN_PENDING_BACK(v), row = BKV_TOKEN_PENDING_ROW(v);
	const char *why = NULL;
	if (back < 1 || back > h->n_q || back > h->cfg->overlap) {
		why = "names no outstanding step within the depth";
	} else {
		const bkv_batch *e = &h->ov_b[h->n_q - back];
		if (row >= e->n_rows || !e->row_sample[row] || (e->row_drafts && e->row_drafts[row]))
			why = "names no sampled row without drafts";
		else if (e->row_req[row] != b->row_req[r] || e->row_branch[row] != b->row_branch[r] ||
			 e->positions[e->qo_indptr[row + 1] - 1] + 1 != b->positions[t])
			why = "names another sequence's token or position";
		else if (h->ov_next[h->n_q - back][row] < 0)
			why = "names a token the device did not sample";
	}
	if (!why) {
		h->res->overlap_placeholders++;
		h->res->overlap_far_placeholders += back > 1;
		return 0;
	}
	if (!h->ov_err[0])
		snprintf(h->ov_err, sizeof(h->ov_err),
			 "request %llu branch %u position %d: placeholder (back %u, row %u) %s",
			 (unsigned long long)b->row_req[r], (unsigned)b->row_branch[r],
			 (int)b->positions[t], (unsigned)back, (unsigned)row, why);
	return -1;
}

/* Overlapped: check every placeholder of the batch being launched. */
static int check_placeholders(vhost *h, const bkv_batch *b)
{
	int rc = 0;
	for (uint32_t r = 0; r < b->n_rows; r++)
		for (int32_t t = b->qo_indptr[r]; t < b->qo_indptr[r + 1]; t++)
			if (BKV_TOKEN_IS_PENDING(b->token_ids[t]) &&
			    check_placeholder(h, b, r, t, b->token_ids[t]))
				rc = -1;
	return rc;
}

static int host_call(vhost *h, bkv_call_kind kind, const bkv_batch *b, int32_t *next)
{
	if (h->launching && check_placeholders(h, b))
		return -1;
	uint32_t n_chunks = b->n_rows - b->n_decode_rows;
	sim_adapters_call(h->ad, b, h->launching && h->dev_free > h->now ? h->dev_free : h->now);
	if (n_chunks > h->chunk_cap) {
		uint32_t cap = n_chunks * 2;
		bkv_chunk_shape *c = realloc(h->chunks, cap * sizeof(*c));
		if (!c)
			return -1;
		h->chunks = c;
		h->chunk_cap = cap;
	}
	bkv_step_shape s;
	uint64_t gctx[BKV_MAX_GROUPS] = {0}; /* each KV group's decode context */
	memset(&s, 0, sizeof(s));
	s.kind = kind;
	s.decode_rows = b->n_decode_rows;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
		if (r < b->n_decode_rows) {
			s.decode_context += (uint64_t)b->positions[q1 - 1] + 1;
			sim_shape_add_row(h->cfg, (uint64_t)b->positions[q1 - 1] + 1, gctx);
		} else {
			bkv_chunk_shape *c = &h->chunks[r - b->n_decode_rows];
			c->len = (uint32_t)(q1 - q0);
			c->start = (uint32_t)b->positions[q0];
		}
	}
	s.n_chunks = n_chunks;
	s.chunks = n_chunks ? h->chunks : NULL;
	s.padded_rows = s.decode_rows;
	if (b->row_drafts && s.decode_rows) { /* speculated rows' drafts */
		const uint32_t bt = b->block_tokens, kk = h->cfg->spec_k;
		double held = 0.0, reserve = 0.0;
		for (uint32_t r = 0; r < b->n_decode_rows; r++) {
			/* the row's committed length is its first position + 1;
			 * blocks past it that the drafts hold, and that reserving
			 * kk slots would hold */
			const uint64_t len = (uint64_t)b->positions[b->qo_indptr[r]] + 1;
			const uint64_t nb = (len + bt - 1) / bt;
			s.decode_drafts += b->row_drafts[r];
			held += (double)((len + b->row_drafts[r] + bt - 1) / bt - nb);
			reserve += (double)((len + kk + bt - 1) / bt - nb);
		}
		h->spec_blocks += held / b->n_decode_rows;
		h->spec_reserve += reserve / b->n_decode_rows;
		h->spec_calls++;
	}
	s.n_groups = h->cfg->n_groups;
	s.group_decode_context = s.n_groups ? gctx : NULL;
	if (h->cfg->policy == BKV_POLICY_STATIC) {
		if (kind == BKV_CALL_PREFILL)
			h->group = n_chunks;
		else if (h->group > s.padded_rows && s.decode_rows)
			s.padded_rows = h->group;
	}

	double t = price(h->cfg, &s);
	double t_prefill = 0.0;
	/* the copies run over the host link before the call computes: priced
	 * when the model knows the KV size (roofline) */
	double link = 0.0;
	if (h->cfg->cost_kind == SIM_COST_ROOFLINE && (b->n_swap_out || b->n_swap_in)) {
		double per = b->block_tokens * h->cfg->roofline.kv_bytes_per_token /
			     (h->cfg->host_link_gbps * 1e3);
		double out = b->n_swap_out * per, in = b->n_swap_in * per;
		h->res->link_us += out + in;
		/* --copy-overlap: a copy engine per direction beside the
		 * kernels, so the call takes the longest of the three */
		if (!h->cfg->copy_overlap)
			link = out + in;
		else if (out > t || in > t)
			link = (out > in ? out : in) - t;
	}
	if (kind == BKV_CALL_PREFILL) {
		t_prefill = t;
	} else if (kind == BKV_CALL_MIXED && n_chunks) {
		if (s.decode_rows) {
			bkv_step_shape d = s;
			d.n_chunks = 0;
			d.chunks = NULL;
			t_prefill = t - price(h->cfg, &d);
		} else {
			t_prefill = t;
		}
	}
	engine_overhead(h->cfg, b->n_rows, kind, &t, &t_prefill);
	const double enc_us = sim_mm_call(h->mm, b); /* the encoder runs first */
	t += enc_us;
	t_prefill += enc_us;
	sim_result *res = h->res;
	t += link;
	double nf = noise_factor(h->cfg, &h->noise_rng); /* what the clock says */
	t *= nf;
	t_prefill *= nf;
	res->prefill_us += t_prefill;
	res->decode_us += t - t_prefill;
	if (n_chunks)
		res->prefill_calls++;
	if (s.decode_rows)
		res->decode_steps++;
	if (h->cfg->cost_kind == SIM_COST_ROOFLINE) {
		double f, by;
		bkv_cost_roofline_work(&h->cfg->roofline, &s, &f, &by);
		res->flops += f;
		res->bytes += by;
	}
	double done; /* when the call's tokens exist */
	if (h->launching) { /* overlapped: on the device's timeline */
		done = (h->now > h->dev_free ? h->now : h->dev_free) + t;
		h->dev_free = done;
		h->dev_end[h->n_q] = done;
		h->ov_b[h->n_q] = *b;
		h->ov_next[h->n_q] = next;
		res->device_busy_us += t;
	} else {
		h->now += t;
		done = h->now;
	}
	h->call_us += t;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		if (!b->row_sample[r])
			continue;
		if (b->row_drafts && b->row_drafts[r])
			spec_verify(h, b, r);
		else
			next[r] = sim_token(h, &h->t->reqs[(uintptr_t)b->row_user[r] - 1],
					    b->positions[b->qo_indptr[r + 1] - 1]);
		/* A token exists when the call that computed it returns (a
		 * serving host streams it then), even if the scheduler reports
		 * it at the end of the step, after a split host's decode call. */
		vreq *v = &h->req[(uintptr_t)b->row_user[r] - 1];
		if (v->first_us < 0.0)
			v->first_us = done;
	}
	return 0;
}

/* The token sampled after position pos of request q: a made-up one, or at
 * its trace length a stop (the token sampled after position p is the
 * request's (p + 2 - prompt)-th). */
static int32_t sim_token(vhost *h, const trace_req *q, int32_t pos)
{
	int32_t t = (int32_t)(100 + h->next_token++ % 30000);
	if (!h->cfg->oracle && h->cfg->max_tokens) {
		int64_t g = (int64_t)pos + 2 - (int64_t)q->prompt_len;
		if (g >= (int64_t)gen_tokens(h->cfg, q))
			t = SIM_STOP_TOKEN;
	}
	return t;
}

static int cb_forward(void *host, const bkv_batch *b, int32_t *next)
{
	return host_call(host, BKV_CALL_MIXED, b, next);
}

static int cb_prefill(void *host, const bkv_batch *b, int32_t *next)
{
	return host_call(host, BKV_CALL_PREFILL, b, next);
}

static int cb_decode(void *host, const bkv_batch *b, int32_t *next)
{
	return host_call(host, BKV_CALL_DECODE, b, next);
}

static void cb_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	(void)req, (void)branch, (void)token;
	vhost *h = host;
	vreq *v = &h->req[(uintptr_t)user - 1];
	if (v->n_tok > 0 && !h->gap_oom) {
		if (h->n_gaps == h->gap_cap) {
			size_t cap = h->gap_cap ? h->gap_cap * 2 : 4096;
			float *g = realloc(h->gaps, cap * sizeof(*g));
			if (!g) {
				h->gap_oom = 1;
				goto out;
			}
			h->gaps = g;
			h->gap_cap = cap;
		}
		h->gaps[h->n_gaps++] = (float)(h->now - v->last_us);
	}
out:
	v->last_us = h->now;
	v->n_tok++;
}

static void cb_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	(void)req;
	vhost *h = host;
	vreq *v = &h->req[(uintptr_t)user - 1];
	v->finish_us = h->now;
	v->failed = why == BKV_FINISH_ABORT || why == BKV_FINISH_ERROR;
	h->n_done++;
}

static uint64_t cb_now(void *host)
{
	const vhost *h = host;
	return (uint64_t)llround(h->now);
}

/* ---- the driver ---------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double sim_quantile(double *v, int n, double q)
{
	if (n <= 0)
		return 0.0;
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	double pos = q * (n - 1);
	int i = (int)floor(pos);
	if (i >= n - 1)
		return v[n - 1];
	return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

double sim_median(double *v, int n)
{
	return sim_quantile(v, n, 0.5);
}

/* The pool's sequences (bkv_pool_config.max_seqs). */
static uint32_t pool_max_seqs(const sim_config *cfg)
{
	return cfg->slots * 2 + 64;
}

/* Blocks enough for every slot to hold the trace's longest request (as it
 * runs: the cap does not size the machine), and a recurrent state's arena
 * on top (its units are carved from the device frames unless they share
 * them: --state-units, or the pool's default of 2 x max_seqs). */
static uint32_t default_blocks(const sim_config *cfg, const trace *t)
{
	uint64_t longest = 1;
	for (uint32_t i = 0; i < t->n; i++) {
		uint64_t need = (uint64_t)t->reqs[i].prompt_len + gen_tokens(cfg, &t->reqs[i]);
		if (need > longest)
			longest = need;
	}
	uint64_t per = (longest + cfg->block_tokens - 1) / cfg->block_tokens + 1;
	/* A hybrid (shape.c): the frames its groups hold. */
	uint64_t frame = cfg->n_groups ? bkv_kv_frame_bytes(cfg->groups, cfg->n_groups,
							    cfg->block_tokens) : 0;
	if (frame)
		per = bkv_kv_seq_bytes(cfg->groups, cfg->n_groups, cfg->block_tokens, longest) / frame;
	uint64_t n = per * (cfg->pool_slots ? cfg->pool_slots : cfg->slots) + 64;
	const uint32_t unit = cfg->n_groups ? bkv_kv_state_frames(cfg->groups, cfg->n_groups,
								    cfg->block_tokens) : 0;
	if (unit && !cfg->state_share)
		n += (uint64_t)unit * (cfg->state_units ? cfg->state_units : 2 * pool_max_seqs(cfg));
	return n > (1u << 30) ? (1u << 30) : (uint32_t)n;
}

/* The measured p90 TTFT and TPOT (TPOT of requests of more than one token)
 * of a trace that has them (DistServe's), into res; -1 without. With
 * targets (cfg->slo_ttft_ms > 0), also how many measured requests met
 * them (res->ref_slo_met). */
static void ref_p90(const sim_config *cfg, const trace *t, sim_result *res)
{
	double *a = malloc((size_t)(t->n ? t->n : 1) * sizeof(double));
	double *b = malloc((size_t)(t->n ? t->n : 1) * sizeof(double));
	int na = 0, nb = 0;
	res->ref_ttft_p90 = res->ref_tpot_p90 = -1.0;
	for (uint32_t i = 0; a && b && i < t->n; i++) {
		if (t->reqs[i].ref_ttft_ms < 0.0)
			continue;
		a[na++] = t->reqs[i].ref_ttft_ms;
		if (t->reqs[i].output_len > 1)
			b[nb++] = t->reqs[i].ref_tpot_ms;
		if (cfg->slo_ttft_ms > 0.0 && t->reqs[i].ref_ttft_ms <= cfg->slo_ttft_ms &&
		    (t->reqs[i].output_len <= 1 || t->reqs[i].ref_tpot_ms <= cfg->slo_tpot_ms))
			res->ref_slo_met++;
	}
	if (na)
		res->ref_ttft_p90 = sim_quantile(a, na, 0.9);
	if (nb)
		res->ref_tpot_p90 = sim_quantile(b, nb, 0.9);
	free(a);
	free(b);
}

static void finish_latencies(vhost *h, const trace *t, sim_result *res)
{
	double *ttft = malloc((size_t)(t->n ? t->n : 1) * sizeof(double));
	double *tpot = malloc((size_t)(t->n ? t->n : 1) * sizeof(double));
	int nt = 0, np = 0;
	double first_arrival = t->n ? t->reqs[0].arrival_us : 0.0, last_finish = 0.0;
	double sum_ttft = 0, sum_tpot = 0, ref_ttft = 0, ref_tpot = 0;
	int n_ref = 0, n_ref_tpot = 0;
	for (uint32_t i = 0; i < t->n; i++) {
		const vreq *v = &h->req[i];
		if (v->finish_us > last_finish)
			last_finish = v->finish_us;
		if (v->failed || v->first_us < 0.0)
			continue;
		if (h->cfg->slo_ttft_ms > 0.0) {
			double f = (v->first_us - t->reqs[i].arrival_us) / 1000.0;
			double p = v->n_tok > 1 ? (v->finish_us - v->first_us) / (v->n_tok - 1) / 1000.0
						: 0.0;
			if (v->finish_us >= 0.0 && f <= h->cfg->slo_ttft_ms &&
			    p <= h->cfg->slo_tpot_ms)
				res->slo_met++;
		}
		if (ttft && tpot) {
			ttft[nt] = (v->first_us - t->reqs[i].arrival_us) / 1000.0;
			sum_ttft += ttft[nt++];
			if (v->n_tok > 1) {
				tpot[np] = (v->finish_us - v->first_us) / (v->n_tok - 1) / 1000.0;
				sum_tpot += tpot[np++];
			}
		}
		if (t->reqs[i].ref_ttft_ms >= 0.0) {
			ref_ttft += t->reqs[i].ref_ttft_ms;
			n_ref++;
			if (t->reqs[i].output_len > 1) {
				ref_tpot += t->reqs[i].ref_tpot_ms;
				n_ref_tpot++;
			}
		}
	}
	res->makespan_us = last_finish - first_arrival;
	res->span_us = t->n ? t->reqs[t->n - 1].arrival_us - first_arrival : 0.0;
	res->ttft_mean = nt ? sum_ttft / nt : 0.0;
	res->tpot_mean = np ? sum_tpot / np : 0.0;
	if (ttft && tpot) {
		res->ttft_p90 = sim_quantile(ttft, nt, 0.9);
		res->tpot_p90 = sim_quantile(tpot, np, 0.9);
		res->ttft_p50 = sim_quantile(ttft, nt, 0.5);
		res->ttft_p99 = sim_quantile(ttft, nt, 0.99);
		res->tpot_p50 = sim_quantile(tpot, np, 0.5);
		res->tpot_p99 = sim_quantile(tpot, np, 0.99);
	}
	if (h->n_gaps && !h->gap_oom) {
		/* p99 by selection of the float gaps: sort a double copy */
		double *g = malloc(h->n_gaps * sizeof(double));
		if (g) {
			for (size_t i = 0; i < h->n_gaps; i++)
				g[i] = h->gaps[i];
			res->tbt_p99 = sim_quantile(g, (int)h->n_gaps, 0.99) / 1000.0;
			free(g);
		}
	}
	res->ref_ttft_mean = n_ref ? ref_ttft / n_ref : -1.0;
	res->ref_tpot_mean = n_ref_tpot ? ref_tpot / n_ref_tpot : -1.0;
	ref_p90(h->cfg, t, res);
	free(ttft);
	free(tpot);
}

void sim_config_init(sim_config *c)
{
	memset(c, 0, sizeof(*c));
	c->policy = BKV_POLICY_CONTINUOUS;
	c->k = 1;
	c->max_wait_us = UINT64_MAX;
	c->budget = 512;
	c->slots = 32;
	c->block_tokens = 16;
	c->prefix_cache = 1;
	c->host_link_gbps = 25;
	c->give_model = 1;
	c->noise_seed32 = 1;
	c->noise_stall_x = 10.0;
	c->cost_kind = SIM_COST_POLY;
	c->max_tokens = SIM_MAX_TOKENS;
	c->adapter_zipf = 1.0;
	c->mm_zipf = 1.0;
	c->mm_per_request = 1;
	c->mm_tokens = 576;
	c->mm_encode_us = 10.0;
	bkv_cost_poly_init(&c->poly);
}

/* ---- one run ------------------------------------------------------------- */

/* What one sim_run holds besides the virtual host's timelines: the pool
 * and scheduler it drives and the per-step sums that become its means. */
typedef struct run {
	vhost h;               /* the virtual host (h.sched is the scheduler) */
	bkv_pool_config pc;    /* the pool's settings */
	bkv_pool *pool;        /* the pool; NULL before it exists */
	bkv_cost_calib *calib; /* the calibrated model (cfg->calibrate), or NULL */
	int32_t *prompt;       /* [longest prompt] tokens of the request submitted */
	uint32_t next;         /* first trace request not yet submitted */
	double waste_sum;      /* sum over steps of waste slots / used slots */
	uint64_t waste_n;      /* steps in waste_sum (those with used blocks) */
	double err_sum;        /* sum of the calibrated model's relative errors */
	uint64_t err_n;        /* steps in err_sum */
	double line_s;         /* progress 2: wall time of the last line, s
				  (0: none yet) */
} run;

/* The monotonic wall clock, s. */
static double wall_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The timelines and the prompt scratch; the clock at the first arrival. */
static int run_alloc(run *r, const sim_config *cfg, const trace *t, sim_result *res, char *err,
		     size_t errlen)
{
	memset(r, 0, sizeof(*r));
	r->h.cfg = cfg;
	r->h.t = t;
	r->h.res = res;
	r->h.req = malloc((size_t)(t->n ? t->n : 1) * sizeof(vreq));
	uint32_t max_prompt = 1;
	for (uint32_t i = 0; i < t->n; i++)
		if (t->reqs[i].prompt_len > max_prompt)
			max_prompt = t->reqs[i].prompt_len;
	r->prompt = malloc((size_t)max_prompt * sizeof(int32_t));
	if (!r->h.req || !r->prompt || sim_adapters_open(cfg, t, &r->h.ad) ||
	    sim_mm_open(cfg, t, &r->h.mm)) {
		snprintf(err, errlen, "out of memory");
		return BKV_ENOMEM;
	}
	for (uint32_t i = 0; i < t->n; i++)
		r->h.req[i] = (vreq){-1.0, 0.0, -1.0, 0, 0};
	if (t->n)
		r->h.now = t->reqs[0].arrival_us;
	r->h.noise_rng = cfg->noise_seed32;
	return 0;
}

/* The pool: cfg's blocks, or enough for every slot to hold the trace's
 * longest request (at most SIM_MAX_DERIVED_BLOCKS). */
static int open_pool(run *r, const sim_config *cfg, const trace *t, char *err, size_t errlen)
{
	bkv_pool_config *pc = &r->pc;
	bkv_pool_config_init(pc);
	pc->block_tokens = cfg->block_tokens;
	pc->device_blocks = cfg->kv_blocks ? cfg->kv_blocks : default_blocks(cfg, t);
	pc->state_units = cfg->state_units;
	pc->state_share = (uint32_t)cfg->state_share;
	if (!cfg->kv_blocks && pc->device_blocks > SIM_MAX_DERIVED_BLOCKS) {
		snprintf(err, errlen,
			 "every slot holding the longest request needs %u blocks (more than %u): "
			 "give --kv-blocks or fewer --slots",
			 pc->device_blocks, SIM_MAX_DERIVED_BLOCKS);
		return BKV_E2BIG;
	}
	pc->host_blocks = cfg->host_blocks;
	pc->host_cache = (uint32_t)cfg->host_cache;
	pc->max_seqs = pool_max_seqs(cfg);
	pc->prefix_cache = cfg->prefix_cache;
	pc->n_groups = cfg->n_groups;
	pc->groups = cfg->n_groups ? cfg->groups : NULL;
	int rc = bkv_pool_create(pc, NULL, &r->pool);
	if (rc)
		snprintf(err, errlen, "bkv_pool_create: %s: %s", bkv_strerror(rc),
			 *bkv_last_error() ? bkv_last_error() : "(no detail)");
	return rc;
}

/* The scheduler's settings from cfg; the cost model it is given (a
 * calibrated one learning from scratch, or the host's own, or none). */
/* --calib-csv: the step times a real engine measured, one call a line
 * (kind,decode_rows,decode_context,prefill_tokens,measured_us; a header line
 * and blank lines are skipped), observed by the calibrated model before the
 * run. A decode line is a decode call of its rows and context; a prefill
 * line one chunk of its tokens from the prompt's start. */
static int learn_csv(bkv_cost_calib *calib, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[256], kind[16];
	unsigned rows, prefill, n = 0, lineno = 0;
	unsigned long long ctx;
	double us;

	if (!f) {
		snprintf(err, errlen, "--calib-csv %s: cannot open it", path);
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		bkv_chunk_shape ch;
		bkv_step_shape sh;

		lineno++;
		if (line[0] == '\n' || !strncmp(line, "kind,", 5))
			continue;
		if (sscanf(line, "%15[^,],%u,%llu,%u,%lf", kind, &rows, &ctx, &prefill, &us) != 5 ||
		    (strcmp(kind, "decode") && strcmp(kind, "prefill")) || !(us >= 0.0)) {
			snprintf(err, errlen, "--calib-csv %s:%u: not kind,decode_rows,"
				 "decode_context,prefill_tokens,measured_us", path, lineno);
			fclose(f);
			return -1;
		}
		memset(&sh, 0, sizeof(sh));
		ch.start = 0;
		ch.len = prefill;
		sh.kind = kind[0] == 'd' ? BKV_CALL_DECODE : BKV_CALL_PREFILL;
		sh.decode_rows = sh.padded_rows = kind[0] == 'd' ? rows : 0;
		sh.decode_context = kind[0] == 'd' ? ctx : 0;
		sh.n_chunks = kind[0] == 'd' ? 0 : 1;
		sh.chunks = kind[0] == 'd' ? NULL : &ch;
		bkv_cost_calib_observe(calib, &sh, us);
		n++;
	}
	fclose(f);
	if (!n) {
		snprintf(err, errlen, "--calib-csv %s: no measured step", path);
		return -1;
	}
	return 0;
}

static int sched_config(run *r, const sim_config *cfg, const trace *t, bkv_sched_config *sc,
			char *err, size_t errlen)
{
	bkv_sched_config_init(sc);
	sc->policy = cfg->policy;
	sc->max_running = cfg->slots;
	sc->admit_group = cfg->k;
	sc->max_wait_us = cfg->max_wait_us;
	sc->chunked_prefill = cfg->chunked;
	sc->token_budget = cfg->budget;
	sc->max_queue = t->n > 65536 ? t->n : 65536;
	sc->tpot_target_us = cfg->tpot_us;
	sc->ttft_target_us = cfg->ttft_us;
	sc->evict = cfg->evict;
	sc->batch_layout = cfg->batch_layout;
	sc->host_link_bytes_per_us = cfg->host_link_gbps * 1e3;
	sc->copy_overlap = (uint32_t)cfg->copy_overlap;
	sc->prefill_first = (uint32_t)cfg->prefill_first;
	sc->victim = cfg->victim;
	sc->admit_reserve = cfg->admit_reserve;
	sc->max_bypass_us = cfg->max_bypass_us;
	sc->max_adapters = sim_adapters_cap(cfg);
	sc->adapter_wait_us = cfg->adapter_wait_us;
	sc->encoder_cache = sim_mm_cache(cfg);
	sc->encoder_budget = cfg->mm_images ? cfg->encoder_budget : 0;
	sc->spec_max_k = cfg->spec_k;
	sc->spec_k_mode = cfg->spec_auto ? BKV_SPEC_K_AUTO : BKV_SPEC_K_FIXED;
	sc->spec_drafts = BKV_SPEC_DRAFT_HOST;
	sc->preempt = cfg->preempt ? cfg->preempt
		    : cfg->host_blocks ? BKV_PREEMPT_AUTO : BKV_PREEMPT_RECOMPUTE;
	if (cfg->cost_kind == SIM_COST_ROOFLINE)
		sc->kv_bytes_per_token = (uint64_t)cfg->roofline.kv_bytes_per_token;
	bkv_cost_model given = {NULL, NULL, NULL};
	if (cfg->give_model) {
		if (cfg->cost_kind == SIM_COST_POLY)
			given = bkv_cost_poly_model((bkv_cost_poly *)&cfg->poly);
		else if (cfg->cost_kind == SIM_COST_ROOFLINE)
			given = bkv_cost_roofline_model((bkv_cost_roofline *)&cfg->roofline);
		else
			given = sim_distserve_model();
	}
	int noisy = (cfg->noise_sigma > 0.0 || cfg->noise_stall_p > 0.0) && !cfg->noise_exact;
	if (cfg->calibrate || cfg->calib_csv || (noisy && cfg->give_model)) {
		/* from scratch, or (a noisy clock, measured times) over the
		 * host's own model */
		int rc = bkv_cost_calib_create(cfg->calibrate ? NULL : &given, NULL, &r->calib);
		if (rc) {
			snprintf(err, errlen, "bkv_cost_calib_create: %s %s", bkv_strerror(rc),
				 bkv_last_error());
			return rc;
		}
		if (cfg->calib_csv && (rc = learn_csv(r->calib, cfg->calib_csv, err, errlen)))
			return rc;
		sc->cost = bkv_cost_calib_model(r->calib);
	} else if (cfg->give_model) {
		sc->cost = given;
	}
	return 0;
}

/* The scheduler over the pool, calling the virtual host: one forward() on
 * a mixed host, prefill() and decode() on a split one. */
static int open_sched(run *r, const sim_config *cfg, const trace *t, char *err, size_t errlen)
{
	bkv_sched_config sc;
	bkv_connector cn;
	int rc = sched_config(r, cfg, t, &sc, err, errlen);
	if (rc)
		return rc;
	if (sim_ext_open(cfg, t, r->pc.hash_seed, r->h.ad, &r->h.now, &r->h.ext)) {
		snprintf(err, errlen, "out of memory (--ext-tier)");
		return BKV_ENOMEM;
	}
	if (r->h.ext) {
		sim_ext_connector(r->h.ext, &cn);
		sc.connector = &cn;
	}
	if (cfg->overlap && !cfg->mixed_host) {
		snprintf(err, errlen, "--overlap needs a mixed host (a launch is one call)");
		return BKV_EINVAL;
	}
	bkv_host_ops ops;
	memset(&ops, 0, sizeof(ops));
	if (cfg->mixed_host) {
		ops.forward = cb_forward;
		if (cfg->overlap) {
			sc.overlap = cfg->overlap;
			ops.launch = cb_forward; /* priced on the device (launching) */
		}
	} else {
		ops.prefill = cb_prefill;
		ops.decode = cb_decode;
	}
	ops.on_token = cb_token;
	ops.on_finish = cb_finish;
	ops.now_us = cb_now;
	ops.draft = cb_draft;
	rc = bkv_sched_create(&sc, r->pool, &ops, &r->h, NULL, &r->h.sched);
	sim_ext_attach(r->h.ext, r->h.sched);
	if (rc)
		snprintf(err, errlen, "bkv_sched_create: %s: %s", bkv_strerror(rc),
			 *bkv_last_error() ? bkv_last_error() : "(no detail)");
	return rc;
}

static void run_close(run *r)
{
	bkv_sched_destroy(r->h.sched);
	bkv_cost_calib_destroy(r->calib);
	bkv_pool_destroy(r->pool);
	free(r->h.req);
	free(r->h.chunks);
	free(r->h.gaps);
	free(r->prompt);
	sim_adapters_close(r->h.ad);
	sim_mm_close(r->h.mm);
	sim_ext_close(r->h.ext);
}

/* Submit every request whose arrival the clock has reached. A request the
 * scheduler refuses (e.g. E2BIG: it never fits) ends there, failed. */
static void submit_arrivals(run *r, const sim_config *cfg, const trace *t)
{
	static const int32_t stop = SIM_STOP_TOKEN;
	vhost *h = &r->h;
	while (r->next < t->n && t->reqs[r->next].arrival_us <= h->now) {
		const trace_req *q = &t->reqs[r->next];
		bkv_request rq;
		bkv_request_init(&rq);
		trace_prompt_tokens(t, r->next, r->prompt);
		rq.prompt = r->prompt;
		rq.prompt_len = q->prompt_len;
		rq.max_new_tokens =
			max_new_tokens(cfg, q, (uint64_t)r->pc.device_blocks * r->pc.block_tokens);
		if (!cfg->oracle && cfg->max_tokens) {
			rq.stop_tokens = &stop;
			rq.n_stop = 1;
		}
		if (cfg->hints)
			rq.predicted_output = gen_tokens(cfg, q);
		rq.adapter = sim_adapter_of(h->ad, r->next);
		rq.inputs = sim_mm_inputs(h->mm, r->next, &rq.n_inputs);
		rq.user = (void *)(uintptr_t)(r->next + 1);
		uint64_t id = 0;
		if (bkv_submit(h->sched, &rq, &id) == BKV_OK) {
			sim_mm_submitted(h->mm, r->next, id);
		} else {
			h->req[r->next].failed = 1;
			h->req[r->next].finish_us = h->now;
			h->n_done++;
		}
		r->next++;
	}
}

/* One bkv_step, then the invariant check when cfg->check asks for it. */
static int step_checked(run *r, const sim_config *cfg, bkv_step_info *info, char *err,
			size_t errlen)
{
	const double now0 = r->h.now;
	r->h.call_us = 0.0;
	r->h.now += cfg->host_overhead_us; /* the host's own work for the step */
	sim_mm_step_begin(r->h.mm);
	int s = bkv_step(r->h.sched, info);
	if (s) {
		snprintf(err, errlen, "bkv_step: %s", bkv_strerror(s));
		return s;
	}
	if (info->rows == 0 && info->finished == 0 && info->admitted == 0)
		r->h.now = now0; /* nothing was done: no host work either */
	if (cfg->check && (s = bkv_sched_check(r->h.sched)) != 0) {
		snprintf(err, errlen, "bkv_sched_check: invariant %d broken", s);
		return -101;
	}
	return 0;
}

/* After a step that did work: count it, show progress, and add its
 * prediction error and the pool's waste to the sums. */
static void account_step(run *r, const sim_config *cfg, const trace *t, sim_result *res,
			 const bkv_step_info *info)
{
	res->steps++;
	if (cfg->progress == 1 && (res->steps & 0xffff) == 0) {
		fprintf(stderr, "\r  %-12s %u/%u requests done, virtual time %.0f s   ",
			res->label, r->h.n_done, t->n, r->h.now / 1e6);
		fflush(stderr);
	} else if (cfg->progress == 2 && (res->steps & 0xfff) == 0) {
		/* not a terminal: a whole line, at most every SIM_PROGRESS_S */
		double now = wall_now_s();
		if (r->line_s == 0.0)
			r->line_s = now;
		else if (now - r->line_s >= SIM_PROGRESS_S) {
			fprintf(stderr, "bkv-sim: %s: %u/%u requests done, virtual time %.0f s\n",
				res->label, r->h.n_done, t->n, r->h.now / 1e6);
			r->line_s = now;
		}
	}
	if ((r->calib ? res->steps > SIM_CALIB_WARMUP : cfg->give_model) &&
	    info->measured_us > 0.0) {
		double e = fabs(info->predicted_us - info->measured_us) / info->measured_us;
		if (r->calib) {
			r->err_sum += e;
			r->err_n++;
		} else if (e > res->pred_err) {
			res->pred_err = e;
		}
	}
	bkv_pool_stats ps;
	ps.size = sizeof(ps);
	bkv_pool_stats_get(r->pool, &ps);
	if (ps.nr_used) {
		r->waste_sum += (double)ps.waste_slots / ((double)ps.nr_used * r->pc.block_tokens);
		r->waste_n++;
	}
}

static int drive_overlap(run *r, const sim_config *cfg, const trace *t, sim_result *res,
			 char *err, size_t errlen);

/* When something next happens on its own: an arrival, or an external
 * tier's transfer completing (--ext-tier); INFINITY: neither. */
static double next_event(const run *r, const trace *t)
{
	const double a = r->next < t->n ? t->reqs[r->next].arrival_us : INFINITY;
	const double x = sim_ext_next_us(r->h.ext);
	return x < a ? x : a;
}

/* Submit and step until every request has ended. When nothing is pending
 * or a step finds nothing to do, the clock jumps to the next arrival (or
 * external transfer's completion, when sooner); with neither left it creeps
 * by 1 ms so a max_wait timer can expire, and 1,000 such idle steps in a
 * row are a stall (-100). */
static int drive(run *r, const sim_config *cfg, const trace *t, sim_result *res, char *err,
		 size_t errlen)
{
	vhost *h = &r->h;
	int idle = 0;
	if (cfg->overlap)
		return drive_overlap(r, cfg, t, res, err, errlen);
	while (h->n_done < t->n) {
		sim_ext_poll(h->ext, h->now);
		submit_arrivals(r, cfg, t);
		if (bkv_sched_pending(h->sched) == 0) {
			if (r->next < t->n) {
				h->now = next_event(r, t);
				continue;
			}
			break;
		}
		bkv_step_info info;
		int rc = step_checked(r, cfg, &info, err, errlen);
		if (rc)
			return rc;
		if (info.rows == 0 && info.finished == 0 && info.admitted == 0) {
			/* Nothing could run: wait for the next arrival or
			 * transfer. */
			if (next_event(r, t) < INFINITY) {
				h->now = fmax(h->now, next_event(r, t));
				idle = 0;
				continue;
			}
			if (++idle > 1000) {
				snprintf(err, errlen,
					 "the scheduler stalled: %llu requests pending, no arrivals left",
					 (unsigned long long)bkv_sched_pending(h->sched));
				return -100;
			}
			h->now += 1000.0; /* let a max_wait timer expire */
			continue;
		}
		idle = 0;
		account_step(r, cfg, t, res, &info);
	}
	return 0;
}

/* The run's results from the scheduler's and the pool's counters, the
 * timelines and the step sums. */
static void collect(run *r, const sim_config *cfg, const trace *t, sim_result *res)
{
	bkv_sched_stats ss;
	ss.size = sizeof(ss);
	bkv_sched_stats_get(r->h.sched, &ss);
	res->prefill_tokens = ss.prefill_tokens;
	res->decode_tokens = ss.decode_tokens;
	res->hit_tokens = ss.hit_tokens;
	res->preemptions = ss.preemptions;
	res->spec_drafted = ss.spec_drafted;
	res->spec_accepted = ss.spec_accepted;
	res->spec_rows = ss.spec_rows;
	if (r->h.spec_calls) {
		res->spec_blocks_row = r->h.spec_blocks / (double)r->h.spec_calls;
		res->spec_reserve_row = r->h.spec_reserve / (double)r->h.spec_calls;
	}
	res->overlap_steps = ss.overlap_steps;
	res->overlap_syncs = ss.overlap_syncs;
	res->overlap_wasted = ss.overlap_wasted_tokens;
	res->host_model = cfg->host_overhead_us || cfg->overlap;
	res->host_overhead_us = cfg->host_overhead_us;
	bkv_pool_stats ps;
	ps.size = sizeof(ps);
	bkv_pool_stats_get(r->pool, &ps);
	res->dup_tokens = ps.dup_blocks * r->pc.block_tokens;
	res->host_hit_tokens = ps.host_hit_blocks * r->pc.block_tokens;
	res->host_demoted = ps.host_demoted;
	if (ps.state_units && r->pc.n_groups) {
		uint64_t frame = bkv_kv_frame_bytes(r->pc.groups, r->pc.n_groups, r->pc.block_tokens);

		res->state_ckpt_bytes = (uint64_t)ps.state_checkpoints * ps.state_frames * frame;
		res->state_hits = ps.state_hits;
	}
	for (uint32_t i = 0; i < t->n; i++) {
		res->prompt_tokens += t->reqs[i].prompt_len;
		if (r->h.req[i].finish_us >= 0.0)
			res->finished++;
		if (r->h.req[i].failed)
			res->errors++;
		res->out_tokens += r->h.req[i].n_tok;
	}
	res->kv_waste = r->waste_n ? r->waste_sum / r->waste_n : 0.0;
	if (r->calib)
		res->pred_err = r->err_n ? r->err_sum / r->err_n : 0.0;
	finish_latencies(&r->h, t, res);
	sim_adapters_collect(r->h.ad, t, res);
	sim_mm_collect(r->h.mm, res);
	sim_ext_collect(r->h.ext, &ss, res);
	double busy = res->prefill_us + res->decode_us;
	res->tput_tok_s = res->makespan_us > 0 ? res->out_tokens / (res->makespan_us / 1e6) : 0;
	if (cfg->cost_kind == SIM_COST_ROOFLINE && busy > 0.0) {
		res->mfu = res->flops / (busy / 1e6 * cfg->roofline.peak_flops);
		res->mbu = res->bytes / (busy / 1e6 * cfg->roofline.mem_bw);
	}
}

int sim_run(const sim_config *cfg, const trace *t, sim_result *res, char *err, size_t errlen)
{
	struct timespec w0, w1;
	clock_gettime(CLOCK_MONOTONIC, &w0);
	char label[sizeof(res->label)];
	memcpy(label, res->label, sizeof(label));
	memset(res, 0, sizeof(*res));
	memcpy(res->label, label, sizeof(label));
	res->n_req = t->n;

	run r;
	int rc = run_alloc(&r, cfg, t, res, err, errlen);
	if (!rc)
		rc = open_pool(&r, cfg, t, err, errlen);
	if (!rc)
		rc = open_sched(&r, cfg, t, err, errlen);
	if (rc) {
		run_close(&r);
		return rc;
	}
	rc = drive(&r, cfg, t, res, err, errlen);
	collect(&r, cfg, t, res);
	run_close(&r);
	clock_gettime(CLOCK_MONOTONIC, &w1);
	res->wall_s = (double)(w1.tv_sec - w0.tv_sec) + (w1.tv_nsec - w0.tv_nsec) / 1e9;
	return rc;
}

/* ---- the overlapped contract (--overlap) --------------------------------- */

/* Wait (on the virtual clock) for the oldest outstanding step's device end,
 * then complete it. */
static int complete_oldest(run *r, const sim_config *cfg, const trace *t, sim_result *res,
			   char *err, size_t errlen)
{
	vhost *h = &r->h;
	bkv_step_info info;
	if (h->now < h->dev_end[0])
		h->now = h->dev_end[0];
	int rc = bkv_step_complete(h->sched, h->q[0], 0, &info);
	h->n_q--;
	memmove(h->q, h->q + 1, h->n_q * sizeof(h->q[0]));
	memmove(h->dev_end, h->dev_end + 1, h->n_q * sizeof(h->dev_end[0]));
	memmove(h->ov_b, h->ov_b + 1, h->n_q * sizeof(h->ov_b[0]));
	memmove(h->ov_next, h->ov_next + 1, h->n_q * sizeof(h->ov_next[0]));
	if (rc) {
		snprintf(err, errlen, "bkv_step_complete: %s", bkv_strerror(rc));
		return rc;
	}
	if (cfg->check && (rc = bkv_sched_check(h->sched)) != 0) {
		snprintf(err, errlen, "bkv_sched_check: invariant %d broken", rc);
		return -101;
	}
	account_step(r, cfg, t, res, &info);
	return 0;
}

/* drive() for the overlapped contract at depth N (cfg->overlap): the host
 * spends host_overhead_us preparing each step and launches it (the device
 * starts it once it is free); once N + 1 steps are outstanding it completes
 * the oldest, so the device computes up to N steps while the host prepares
 * the next. A declined launch (BKV_EAGAIN) completes what is outstanding
 * first: that step is not overlapped. */
static int drive_overlap(run *r, const sim_config *cfg, const trace *t, sim_result *res,
			 char *err, size_t errlen)
{
	vhost *h = &r->h;
	int idle = 0, rc;
	while (h->n_done < t->n) {
		sim_ext_poll(h->ext, h->now);
		submit_arrivals(r, cfg, t);
		if (bkv_sched_pending(h->sched) == 0 && h->n_q == 0) {
			if (r->next < t->n) {
				h->now = next_event(r, t);
				continue;
			}
			break;
		}
		const double now0 = h->now;
		uint64_t tk = 0;
		bkv_step_info info;
		h->now += cfg->host_overhead_us;
		h->launching = 1;
		sim_mm_step_begin(h->mm);
		rc = bkv_step_launch(h->sched, &tk, &info);
		h->launching = 0;
		if (rc == BKV_EAGAIN) {
			h->now = now0; /* nothing planned: the host did no work */
			while (h->n_q)
				if ((rc = complete_oldest(r, cfg, t, res, err, errlen)) != 0)
					return rc;
			continue;
		}
		if (rc) {
			snprintf(err, errlen, "bkv_step_launch: %s%s%s", bkv_strerror(rc),
				 h->ov_err[0] ? ": " : "", h->ov_err);
			return rc;
		}
		if (tk)
			h->q[h->n_q++] = tk;
		else if (info.finished == 0 && info.admitted == 0)
			h->now = now0;
		if (h->n_q == cfg->overlap + 1 || (!tk && h->n_q)) {
			if ((rc = complete_oldest(r, cfg, t, res, err, errlen)) != 0)
				return rc;
			idle = 0;
			continue;
		}
		if (tk || info.finished || info.admitted) {
			idle = 0;
			continue;
		}
		/* Nothing could run and nothing is in flight: wait for an
		 * arrival or a transfer. */
		if (next_event(r, t) < INFINITY) {
			h->now = fmax(h->now, next_event(r, t));
			idle = 0;
			continue;
		}
		if (++idle > 1000) {
			snprintf(err, errlen,
				 "the scheduler stalled: %llu requests pending, no arrivals left",
				 (unsigned long long)bkv_sched_pending(h->sched));
			return -100;
		}
		h->now += 1000.0; /* let a max_wait timer expire */
	}
	while (h->n_q)
		if ((rc = complete_oldest(r, cfg, t, res, err, errlen)) != 0)
			return rc;
	return 0;
}
