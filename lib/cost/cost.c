/*
 * cost.c - the built-in cost models: polynomial (seed 000), roofline (seed
 * 004) and calibrated (online least squares over any base model).
 *
 * A cost model prices one host call, described by a bkv_step_shape: how many
 * decode rows and how much context they read, and which prompt chunks are
 * computed (length L, starting at offset s of their prompt). The three models
 * here read nothing but that shape and their own plain config, so a host can
 * copy, tweak or replace any of them. Derivations: docs/cost-model.md.
 *
 * Polynomial. Seed 000 measured prefill at batch 32 as a + b*P + c*P^2 and a
 * decode step as d(n) = d0 + d1*n. A chunk of L tokens at offset s adds
 * b*L of weight work and c*(2*L*s + L^2) of attention work (the L^2 term of
 * a fresh prompt, plus the new tokens' attention over the s cached ones,
 * counted as pairs twice like the square). A split host's prefill kernel pads
 * its rows to the longest one; a mixed (ragged) forward does not, and pays
 * the fixed part once, inside d(n).
 *
 * Roofline. Seed 004: a call takes max(compute, memory), compute the matmul
 * FLOPs over peak FLOP/s, memory the weight bytes plus KV bytes over the
 * bandwidth. Presets fill it from spec sheets. A hybrid model's roofline
 * carries its KV groups and counts KV bytes and attention pairs per group: a
 * window or a chunk bounds the keys each query reads (closed forms below).
 *
 * Calibrated. One set of least-squares sums per call kind (prefill, decode,
 * mixed), over a fixed feature vector whose first entry is the base model's
 * own prediction:
 *
 *     x = [ base(shape), 1, rows, context, no_decode, sum L, sum Q,
 *           rows * Lmax, rows * (2*Lmax*Smax + Lmax^2) ]    Q = 2*L*s + L^2
 *     A += x x^T / p^2,  y += x t' / p^2  (both first scaled by the
 *                                         forgetting factor; t' the clipped
 *                                         measured time over the level)
 *
 * (relative least squares: timing noise is roughly proportional to the time;
 * p is the trusted prediction, so the fit estimates a shape's mean time).
 * The estimator is robust to a real clock: each measurement is clipped in
 * log space at 2.5 robust scales from its prediction (a stall counts as a
 * 2.5-sigma call), the coefficients are constrained to w >= 0 (Lawson-Hanson
 * active set with a ridge toward w0 = (1, 0, ...), i.e. the base, in
 * Jacobi-scaled coordinates), the fit is used only once trusted and while
 * its residuals are no wider than the base's, and a level factor with gain
 * 1/32 follows drift, and a slow tail factor (gain 1/2048) adds back the
 * mean time that clipping took off. A call timed under the clock's
 * resolution (4 us) only scales the base, whose shape it keeps.
 * Everything lives in fixed arrays inside the handle: observe() never
 * allocates. docs/cost-model.md ("Calibration") has the
 * numbers.
 */
#include "base/base.h"

#include <math.h>
#include <string.h>

/* ---- shape summaries ----------------------------------------------------- */

/* What every model reads from a shape's prefill chunks. */
typedef struct chunk_sums {
	double n;     /* chunks */
	double sum_l; /* sum of L: prompt tokens computed */
	double sum_q; /* sum of Q = 2*L*s + L^2: attention work */
	double max_l; /* longest chunk */
	double max_s; /* latest start */
	double sum_s; /* sum of start offsets (context read by prefill) */
	double pairs; /* causal (query, key) pairs: sum of L*s + L*(L+1)/2 */
} chunk_sums;

static void sum_chunks(const bkv_step_shape *shape, chunk_sums *cs)
{
	memset(cs, 0, sizeof(*cs));
	if (!shape->chunks)
		return;
	for (uint32_t i = 0; i < shape->n_chunks; i++) {
		double l = shape->chunks[i].len;
		double s = shape->chunks[i].start;
		double q = 2.0 * l * s + l * l;
		cs->n += 1.0;
		cs->sum_l += l;
		cs->sum_q += q;
		cs->sum_s += s;
		cs->pairs += l * s + l * (l + 1.0) / 2.0;
		if (l > cs->max_l)
			cs->max_l = l;
		if (s > cs->max_s)
			cs->max_s = s;
	}
}

/* Rows a call runs, padding included (static batching pays for it). */
static double call_rows(const bkv_step_shape *shape, const chunk_sums *cs)
{
	double rows = shape->kind == BKV_CALL_PREFILL ? cs->n : (double)shape->decode_rows;
	if ((double)shape->padded_rows > rows && shape->kind != BKV_CALL_MIXED)
		rows = shape->padded_rows;
	if (shape->kind != BKV_CALL_PREFILL) /* a draft costs what a row's token does */
		rows += (double)shape->decode_drafts;
	return rows;
}

/* ---- polynomial (seed 000) ---------------------------------------------- */

void bkv_cost_poly_init(bkv_cost_poly *poly)
{
	if (!poly)
		return;
	memset(poly, 0, sizeof(*poly));
	poly->size = sizeof(*poly);
	poly->a = 1677.0;
	poly->b = 101.0;
	poly->c = 1.3607;
	poly->kappa = 1.45;
	poly->rows_ref = 32.0;
	poly->packed = 0;
	poly->d0 = 1064.0;
	poly->d1 = 24.1;
	poly->d2 = 0.0;
}

/* Q of a padded row: the longest chunk over the latest start. */
static double padded_q(const chunk_sums *cs)
{
	return 2.0 * cs->max_l * cs->max_s + cs->max_l * cs->max_l;
}

/* v of one chunk (or of sums, v being linear): kappa * (b*L + c*Q). */
static double poly_v(const bkv_cost_poly *p, double l, double q)
{
	return p->kappa * (p->b * l + p->c * q);
}

/* Prefill work of the chunks, before the fixed part. Packed rows pay their
 * own v(L, s). Padded rows all run the longest chunk over the longest cached
 * context: each pays v(Lmax) with Q = 2*Lmax*Smax + Lmax^2 (seed 000's
 * a + (n/32) v(Pmax) when nothing is cached). */
static double poly_prefill_work(const bkv_cost_poly *p, const bkv_step_shape *shape,
				const chunk_sums *cs, double rows, int packed)
{
	double ref = p->rows_ref > 0.0 ? p->rows_ref : 1.0;
	if (packed)
		return poly_v(p, cs->sum_l, cs->sum_q) / ref;
	return rows / ref * poly_v(p, cs->max_l, padded_q(cs));
}

double bkv_cost_poly_step_us(const bkv_cost_poly *poly, const bkv_step_shape *shape)
{
	if (!poly || !shape)
		return 0.0;
	if (!shape->chunks && shape->n_chunks) /* malformed: no chunk array */
		return 0.0;
	chunk_sums cs;
	sum_chunks(shape, &cs);
	double rows = call_rows(shape, &cs);
	double t = 0.0;
	switch (shape->kind) {
	case BKV_CALL_PREFILL:
		if (shape->n_chunks == 0)
			return 0.0;
		t = poly->a + poly_prefill_work(poly, shape, &cs, rows, poly->packed);
		break;
	case BKV_CALL_DECODE:
		if (rows == 0.0)
			return 0.0;
		t = poly->d0 + poly->d1 * rows + poly->d2 * (double)shape->decode_context;
		break;
	case BKV_CALL_MIXED:
	default:
		if (rows == 0.0 && shape->n_chunks == 0)
			return 0.0;
		/* Ragged rows: the prefill part is always packed. */
		t = poly_prefill_work(poly, shape, &cs, cs.n, 1);
		if (rows > 0.0)
			t += poly->d0 + poly->d1 * rows + poly->d2 * (double)shape->decode_context;
		else
			t += poly->a;
		break;
	}
	return t > 0.0 ? t : 0.0;
}

static double poly_step_cb(void *ctx, const bkv_step_shape *shape)
{
	return bkv_cost_poly_step_us((const bkv_cost_poly *)ctx, shape);
}

bkv_cost_model bkv_cost_poly_model(bkv_cost_poly *poly)
{
	bkv_cost_model m = {NULL, NULL, NULL};
	if (poly) {
		m.step_us = poly_step_cb;
		m.ctx = poly;
	}
	return m;
}

/* ---- roofline (seed 004) ------------------------------------------------ */

/* One preset: a GPU's spec-sheet peaks and a model's counted parameters.
 * docs/cost-model.md names the source of every figure. */
typedef struct roofline_preset {
	const char *name;           /* "gpu/model dtype" */
	double peak_flops;          /* dense tensor FLOP/s at the dtype */
	double mem_bw;              /* bytes/s */
	double params;              /* all parameters (weights read per call) */
	double active_params;       /* parameters in per-token matmuls */
	double kv_bytes_per_token;  /* 2 * layers * kv_heads * head_dim * 2 */
	double attn_flops_per_pair; /* 4 * layers * heads * head_dim */
	double dtype_bytes;         /* bytes per weight */
} roofline_preset;

static const roofline_preset presets[BKV_ROOFLINE_PRESET_COUNT] = {
	/* A100 SXM4 80GB: 312 TFLOP/s fp16 dense, 2,039 GB/s HBM2e.
	 * Llama-2-13B: 40 layers, 40 heads x 128, d 5120, ffn 13824, vocab
	 * 32000: 13,015,864,320 parameters, of which the embedding gather
	 * (163,840,000) does no matmul. */
	[BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16] = {"a100-80gb/llama-2-13b fp16", 312e12,
						    2039e9, 13015864320.0, 12852019200.0,
						    819200.0, 819200.0, 2.0},
	/* H100 SXM5 80GB: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3.
	 * Llama-3-8B: 32 layers, 32 heads x 128, 8 KV heads, d 4096, ffn 14336,
	 * vocab 128256: 8,030,261,248 parameters, 525,336,576 in the gather. */
	[BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16] = {"h100-sxm/llama-3-8b bf16", 989e12, 3350e9,
						  8030261248.0, 7504920576.0, 131072.0,
						  524288.0, 2.0},
	/* A100 80GB and OPT-13B (DistServe's vLLM runs): 40 layers, 40 heads x
	 * 128, ffn 20480, vocab 50272, 2048 positions: 12,853,514,240
	 * parameters, 267,888,640 in the gathers (tied lm_head counted). */
	[BKV_ROOFLINE_A100_80GB_OPT_13B_FP16] = {"a100-80gb/opt-13b fp16", 312e12, 2039e9,
						 12853514240.0, 12843008000.0, 819200.0,
						 819200.0, 2.0},
};

int bkv_cost_roofline_init(bkv_cost_roofline *rl, bkv_roofline_preset preset)
{
	bkv__error_clear();
	if (!rl)
		return bkv__fail(BKV_EINVAL, "bkv_cost_roofline_init: rl is NULL");
	if ((int)preset < 0 || preset >= BKV_ROOFLINE_PRESET_COUNT)
		return bkv__fail(BKV_EINVAL, "bkv_cost_roofline_init: preset = %d: must be in 0..%d",
				 (int)preset, (int)BKV_ROOFLINE_PRESET_COUNT - 1);
	const roofline_preset *p = &presets[preset];
	memset(rl, 0, sizeof(*rl));
	rl->size = sizeof(*rl);
	rl->name = p->name;
	rl->peak_flops = p->peak_flops;
	rl->mem_bw = p->mem_bw;
	rl->model_bytes = p->params * p->dtype_bytes;
	rl->active_params = p->active_params;
	rl->kv_bytes_per_token = p->kv_bytes_per_token;
	rl->attn_flops_per_pair = p->attn_flops_per_pair;
	rl->flops_eff = 1.0;
	rl->mem_eff = 1.0;
	rl->overhead_us = 0.0;
	return BKV_OK;
}

/* ---- roofline over KV groups (hybrid models) ----------------------------
 * Per attention group, the keys a query at position q reads start at
 * first(q): FULL 0, WINDOW q - W + 1, CHUNKED floor(q / C) x C. The pairs of
 * queries 0..n-1 have closed forms, so a chunk of L queries from offset s
 * costs prefix(s + L) - prefix(s) pairs in O(1):
 *   FULL     n(n + 1)/2
 *   WINDOW   n(n + 1)/2 for n <= W, else W(W + 1)/2 + (n - W) W
 *   CHUNKED  k C(C + 1)/2 + r(r + 1)/2,  n = k C + r
 * and the cached keys it reads are those q = s reads below s: s, min(s, W -
 * 1), s mod C. */

/* Pairs of queries 0..n-1 in group g. */
static double group_pairs_prefix(const bkv_kv_group *g, double n)
{
	double w = (double)g->span;
	if (g->kind == BKV_GROUP_WINDOW && n > w)
		return w * (w + 1.0) / 2.0 + (n - w) * w;
	if (g->kind == BKV_GROUP_CHUNKED) {
		double k = floor(n / w), r = n - k * w;
		return k * w * (w + 1.0) / 2.0 + r * (r + 1.0) / 2.0;
	}
	return n * (n + 1.0) / 2.0;
}

/* Cached keys (below s) that the chunk starting at s reads in group g. */
static double group_cached_keys(const bkv_kv_group *g, uint32_t s)
{
	if (g->kind == BKV_GROUP_WINDOW)
		return (double)(s < g->span ? s : g->span - 1);
	if (g->kind == BKV_GROUP_CHUNKED)
		return (double)(s % g->span);
	return (double)s;
}

/* Keys group g reads for the shape's decode rows: the scheduler's figure
 * when the shape carries one per group, else the bound its sums give. */
static double group_decode_keys(const bkv_cost_roofline *rl, uint32_t i,
				const bkv_step_shape *shape)
{
	const bkv_kv_group *g = &rl->groups[i];
	double ctx = (double)shape->decode_context;
	if (shape->n_groups == rl->n_groups && shape->group_decode_context)
		return (double)shape->group_decode_context[i];
	if (g->kind == BKV_GROUP_WINDOW || g->kind == BKV_GROUP_CHUNKED) {
		double bound = (double)shape->decode_rows * (double)g->span;
		return ctx < bound ? ctx : bound;
	}
	return ctx;
}

/* Attention pairs and KV bytes of the shape over the model's groups; rows
 * are the decode rows the kernel runs. */
static void roofline_group_work(const bkv_cost_roofline *rl, const bkv_step_shape *shape,
				double rows, double *pairs_flops, double *kv_bytes)
{
	double attn_layers = 0.0, f = 0.0, by = 0.0;
	for (uint32_t i = 0; i < rl->n_groups; i++)
		if (rl->groups[i].kind != BKV_GROUP_STATE)
			attn_layers += (double)rl->groups[i].layers;
	for (uint32_t i = 0; i < rl->n_groups; i++) {
		const bkv_kv_group *g = &rl->groups[i];
		double unit = (double)g->layers * (double)g->bytes;
		if (g->kind == BKV_GROUP_STATE) {
			by += 2.0 * unit * (rows + (double)shape->n_chunks);
			continue;
		}
		/* Decode rows attend over their keys and their new token. */
		double keys = group_decode_keys(rl, i, shape);
		double pairs = keys + rows, tok = keys + rows;
		for (uint32_t c = 0; c < shape->n_chunks; c++) {
			double l = shape->chunks[c].len, s = shape->chunks[c].start;
			pairs += group_pairs_prefix(g, s + l) - group_pairs_prefix(g, s);
			tok += group_cached_keys(g, shape->chunks[c].start) + l;
		}
		f += rl->attn_flops_per_pair * ((double)g->layers / attn_layers) * pairs;
		by += unit * tok;
	}
	*pairs_flops = f;
	*kv_bytes = by;
}

void bkv_cost_roofline_work(const bkv_cost_roofline *rl, const bkv_step_shape *shape,
			    double *flops, double *bytes)
{
	double f = 0.0, by = 0.0;
	if (rl && rl->n_groups && !bkv__kv_groups_ok(rl->groups, rl->n_groups, 0))
		rl = NULL; /* invalid groups: zeros */
	if (rl && shape && (shape->chunks || !shape->n_chunks)) {
		chunk_sums cs;
		sum_chunks(shape, &cs);
		double rows = shape->kind == BKV_CALL_PREFILL ? 0.0 : (double)shape->decode_rows;
		if (shape->kind == BKV_CALL_DECODE && shape->padded_rows > shape->decode_rows)
			rows = shape->padded_rows;
		/* drafts: query tokens of the decode rows, each attending over
		 * its row's context (read once per row) */
		double drafts = shape->kind == BKV_CALL_PREFILL ? 0.0 : (double)shape->decode_drafts;
		double tokens = rows + drafts + cs.sum_l;
		double attn_f, kv_by;
		if (rl->n_groups) {
			roofline_group_work(rl, shape, rows, &attn_f, &kv_by);
		} else if (drafts > 0.0) {
			double per_row = shape->decode_rows ? (double)shape->decode_context /
								      (double)shape->decode_rows
							    : 0.0;
			double pairs = cs.pairs + (double)shape->decode_context + rows +
				       drafts * per_row;
			double kv_tokens = (double)shape->decode_context + rows + cs.sum_s + cs.sum_l;
			attn_f = rl->attn_flops_per_pair * pairs;
			kv_by = rl->kv_bytes_per_token * kv_tokens;
		} else {
			/* Decode rows attend over their context and their new token. */
			double pairs = cs.pairs + (double)shape->decode_context + rows;
			double kv_tokens = (double)shape->decode_context + rows + cs.sum_s + cs.sum_l;
			attn_f = rl->attn_flops_per_pair * pairs;
			kv_by = rl->kv_bytes_per_token * kv_tokens;
		}
		f = 2.0 * rl->active_params * tokens + attn_f;
		by = tokens > 0.0 ? rl->model_bytes + kv_by : 0.0;
	}
	if (flops)
		*flops = f;
	if (bytes)
		*bytes = by;
}

double bkv_cost_roofline_step_us(const bkv_cost_roofline *rl, const bkv_step_shape *shape)
{
	if (!rl || !shape || !(rl->peak_flops > 0.0) || !(rl->mem_bw > 0.0))
		return 0.0;
	double flops, bytes;
	bkv_cost_roofline_work(rl, shape, &flops, &bytes);
	if (flops == 0.0 && bytes == 0.0)
		return 0.0;
	double fe = rl->flops_eff > 0.0 ? rl->flops_eff : 1.0;
	double me = rl->mem_eff > 0.0 ? rl->mem_eff : 1.0;
	double compute = flops / (rl->peak_flops * fe) * 1e6;
	double memory = bytes / (rl->mem_bw * me) * 1e6;
	double t = rl->overhead_us + (compute > memory ? compute : memory);
	return t > 0.0 ? t : 0.0;
}

static double roofline_step_cb(void *ctx, const bkv_step_shape *shape)
{
	return bkv_cost_roofline_step_us((const bkv_cost_roofline *)ctx, shape);
}

bkv_cost_model bkv_cost_roofline_model(bkv_cost_roofline *rl)
{
	bkv_cost_model m = {NULL, NULL, NULL};
	if (rl) {
		m.step_us = roofline_step_cb;
		m.ctx = rl;
	}
	return m;
}

/* ---- calibrated ---------------------------------------------------------- */

#define NF BKV_COST_CALIB_FEATURES
#define CALIB_KINDS 3
#define CALIB_RIDGE 1e-6
#define CALIB_DEFAULT_FORGET 0.999
/* Robustness (docs/cost-model.md, "Calibration"): a measurement is clipped,
 * in log space, at CALIB_CLIP robust scales from the prediction it is judged
 * against; scales start wide and never fall below CALIB_SCALE_MIN. */
#define CALIB_CLIP 2.5
#define CALIB_SCALE0 0.5
#define CALIB_SCALE_MIN 0.04
#define CALIB_SCALE_RATE 0.05 /* per observation, of the scale's running mean */
/* sigma of a normal from the mean of |e| clipped at 2.5 sigma: 1/0.7833 */
#define CALIB_SCALE_GAIN 1.2767
/* Drift: a level factor exp(level) multiplies the fit; level follows the
 * clipped log residuals with gain CALIB_LEVEL_RATE per observation, and the
 * fit learns the measurements divided by it. */
#define CALIB_LEVEL_RATE 0.03125
/* The tail: what clipping took off, as a share of the clipped time, in a
 * slow running mean (gain CALIB_TAIL_RATE); predictions are multiplied by
 * 1 + tail, so the model prices a shape's mean time, stalls included,
 * while one stall moves it by its excess over 1/CALIB_TAIL_RATE calls. */
#define CALIB_TAIL_RATE (1.0 / 2048.0)
/* The clock's resolution: the scheduler times calls with a microsecond
 * clock, so a call timed under CALIB_RESOLVE_US (4 ticks) is known only to
 * 25% or worse, and one timed at 0 or 1 us only to be under a tick or two.
 * Such a measurement says how fast the host is, not how its cost grows with
 * the work: it informs the base feature alone (the fit scales the base,
 * whose shape, fixed cost included, it keeps), and it moves neither the
 * level, the tail nor the scales, which are kept in log space. */
#define CALIB_RESOLVE_US 4.0

/* The robust least-squares state of one call kind. Residuals are e =
 * ln(measured / predicted); "scale" is a robust estimate of their sigma. */
typedef struct calib_fit {
	double a[NF][NF]; /* sum of x x^T / p^2, forgotten geometrically */
	double y[NF];     /* sum of x * clipped measurement / p^2 */
	double w[NF];     /* current solution, every entry >= 0; starts at
			     w0 = (1, 0, ...) */
	uint64_t n_obs;   /* observations taken (not weighted) */
	double n_eff;     /* observations' total weight after forgetting
			     (<= n_obs) */
	double s_fit;     /* scale of the fit's residuals (before each refit) */
	double s_base;    /* scale of the base model's residuals */
	double level;     /* ln of the factor on the fit's prediction: the
			     running mean of its clipped residuals */
	double tail;      /* running mean of (measured - clipped) / clipped:
			     the mean time clipping leaves out (stalls) */
} calib_fit;

struct bkv_cost_calib {
	bkv_allocator alloc;          /* copied at create; frees this handle */
	bkv_cost_model base;          /* copied; base.ctx not owned */
	double forget;                /* in [0.9, 1]; weight decay per observe */
	calib_fit fit[CALIB_KINDS];   /* indexed by bkv_call_kind */
};

static void calib_features(const bkv_cost_calib *cal, const bkv_step_shape *shape, double *x)
{
	chunk_sums cs;
	sum_chunks(shape, &cs);
	double rows = call_rows(shape, &cs);
	double base = cal->base.step_us ? cal->base.step_us(cal->base.ctx, shape) : 0.0;
	if (!isfinite(base) || base < 0.0)
		base = 0.0;
	x[0] = base;
	x[1] = 1.0;
	x[2] = rows;
	x[3] = (double)shape->decode_context;
	x[4] = shape->kind == BKV_CALL_MIXED && shape->decode_rows == 0 ? 1.0 : 0.0;
	x[5] = cs.sum_l;
	x[6] = cs.sum_q;
	x[7] = rows * cs.max_l;
	x[8] = rows * padded_q(&cs);
}

/* Solve m[sub][sub] z = r[sub] (the n rows and columns listed in sub) by
 * Cholesky. Returns 0 when that block is numerically singular or the
 * answer not finite. */
static int chol_solve(double m[NF][NF], const double *r, const int *sub, int n, double *z)
{
	double l[NF][NF];
	for (int j = 0; j < n; j++) {
		double d = m[sub[j]][sub[j]];
		for (int p = 0; p < j; p++)
			d -= l[j][p] * l[j][p];
		if (!(d > 0.0))
			return 0;
		d = sqrt(d);
		l[j][j] = d;
		for (int i = j + 1; i < n; i++) {
			double s = m[sub[i]][sub[j]];
			for (int p = 0; p < j; p++)
				s -= l[i][p] * l[j][p];
			l[i][j] = s / d;
		}
	}
	for (int i = 0; i < n; i++) {
		double s = r[sub[i]];
		for (int p = 0; p < i; p++)
			s -= l[i][p] * z[p];
		z[i] = s / l[i][i];
	}
	for (int i = n - 1; i >= 0; i--) {
		double s = z[i];
		for (int p = i + 1; p < n; p++)
			s -= l[p][i] * z[p];
		z[i] = s / l[i][i];
		if (!isfinite(z[i]))
			return 0;
	}
	return 1;
}

/* Refit: minimise w'(A + r*D)w/2 - (y + r*D*w0)'w subject to w >= 0 over
 * the features seen so far (diag(A) > 0; unseen ones keep w0), in
 * Jacobi-scaled coordinates. Every feature is a non-negative amount of work,
 * so a negative price is noise fitted; the constraint keeps every
 * prediction >= 0 and monotone in the work. Lawson and Hanson's active set
 * on the normal equations: free the coordinate whose gradient most wants to
 * rise, solve the free set, and step back to the boundary while a free
 * entry would go negative (a few 9x9 Cholesky solves). A singular system
 * keeps the previous fit. */
static void calib_solve(calib_fit *f)
{
	double m[NF][NF], rhs[NF], sc[NF], w[NF] = {0}, z[NF];
	int idx[NF], k = 0;
	for (int j = 0; j < NF; j++) {
		if (f->a[j][j] > 0.0 && isfinite(f->a[j][j])) {
			sc[k] = sqrt(f->a[j][j]);
			idx[k++] = j;
		}
	}
	double rmax = 0.0;
	for (int i = 0; i < k; i++) {
		double w0 = idx[i] == 0 ? 1.0 : 0.0;
		for (int j = 0; j < k; j++)
			m[i][j] = f->a[idx[i]][idx[j]] / (sc[i] * sc[j]);
		m[i][i] += CALIB_RIDGE;
		rhs[i] = f->y[idx[i]] / sc[i] + CALIB_RIDGE * sc[i] * w0;
		if (fabs(rhs[i]) > rmax)
			rmax = fabs(rhs[i]);
	}
	const double tol = 1e-12 * (rmax > 0.0 ? rmax : 1.0);
	int free_set[NF], n_free = 0, is_free[NF] = {0};
	for (int outer = 0; outer < 4 * NF; outer++) {
		int best = -1;
		double gbest = tol;
		for (int i = 0; i < k; i++) {
			if (is_free[i])
				continue;
			double g = rhs[i];
			for (int j = 0; j < k; j++)
				g -= m[i][j] * w[j];
			if (g > gbest) {
				gbest = g;
				best = i;
			}
		}
		if (best < 0)
			break;
		is_free[best] = 1;
		free_set[n_free++] = best;
		for (int inner = 0; inner < NF; inner++) {
			if (!chol_solve(m, rhs, free_set, n_free, z))
				return;
			double alpha = 1.0;
			for (int i = 0; i < n_free; i++) {
				int c = free_set[i];
				if (z[i] <= 0.0 && w[c] - z[i] > 0.0 && w[c] / (w[c] - z[i]) < alpha)
					alpha = w[c] / (w[c] - z[i]);
			}
			for (int i = 0; i < n_free; i++)
				w[free_set[i]] += alpha * (z[i] - w[free_set[i]]);
			if (alpha >= 1.0)
				break;
			/* Entries that reached 0 leave the free set. */
			int n = 0;
			for (int i = 0; i < n_free; i++) {
				int c = free_set[i];
				if (w[c] > 0.0 && z[i] > 0.0) {
					free_set[n++] = c;
				} else if (w[c] > 1e-15 * (1.0 + fabs(w[c]))) {
					free_set[n++] = c;
				} else {
					w[c] = 0.0;
					is_free[c] = 0;
				}
			}
			n_free = n;
			if (n_free == 0)
				break;
		}
	}
	for (int i = 0; i < k; i++) {
		double v = w[i] > 0.0 ? w[i] / sc[i] : 0.0;
		if (!isfinite(v))
			return;
		z[i] = v;
	}
	for (int i = 0; i < k; i++)
		f->w[idx[i]] = z[i];
}

/* The fit's own prediction for features x, its level factor included
 * (>= 0: every w and x is). */
static double calib_fit_us(const calib_fit *f, const double *x)
{
	double t = 0.0;
	for (int j = 0; j < NF; j++)
		t += f->w[j] * x[j];
	return t > 0.0 ? t * exp(f->level) : 0.0;
}

/* Whether the fit has enough weight behind it to be trusted at all. */
static int calib_confident(const calib_fit *f)
{
	return f->n_obs >= BKV_COST_CALIB_MIN_OBS && f->n_eff >= BKV_COST_CALIB_MIN_OBS / 2.0;
}

/* Whether a prediction uses the fit (else the base): confident, and either
 * there is no base or the fit's residuals are no wider than the base's. */
static int calib_uses_fit(const calib_fit *f, double base_us)
{
	return calib_confident(f) && (!(base_us > 0.0) || f->s_fit <= f->s_base);
}

/* Update a robust scale with a residual e (clipped at CALIB_CLIP scales). */
static void calib_scale_update(double *s, double e)
{
	double lim = CALIB_CLIP * *s, a = fabs(e);
	*s += CALIB_SCALE_RATE * (CALIB_SCALE_GAIN * (a < lim ? a : lim) - *s);
	if (*s < CALIB_SCALE_MIN)
		*s = CALIB_SCALE_MIN;
}

int bkv_cost_calib_create(const bkv_cost_model *base, const bkv_allocator *alloc,
			  bkv_cost_calib **out)
{
	bkv__error_clear();
	if (!out)
		return bkv__fail(BKV_EINVAL, "bkv_cost_calib_create: out is NULL");
	bkv_allocator a;
	bkv__alloc_init(&a, alloc);
	bkv_cost_calib *cal = bkv__calloc(&a, 1, sizeof(*cal));
	if (!cal)
		return BKV_ENOMEM;
	cal->alloc = a;
	if (base)
		cal->base = *base;
	cal->forget = CALIB_DEFAULT_FORGET;
	for (int k = 0; k < CALIB_KINDS; k++) {
		cal->fit[k].w[0] = 1.0;
		cal->fit[k].s_fit = CALIB_SCALE0;
		cal->fit[k].s_base = CALIB_SCALE0;
	}
	*out = cal;
	return BKV_OK;
}

void bkv_cost_calib_destroy(bkv_cost_calib *calib)
{
	if (!calib)
		return;
	bkv_allocator a = calib->alloc;
	bkv__free(&a, calib, sizeof(*calib));
}

int bkv_cost_calib_set_forget(bkv_cost_calib *calib, double forget)
{
	if (!calib || !(forget >= 0.9 && forget <= 1.0))
		return BKV_EINVAL;
	calib->forget = forget;
	return BKV_OK;
}

static int kind_ok(bkv_call_kind kind)
{
	return (int)kind >= 0 && (int)kind < CALIB_KINDS;
}

double bkv_cost_calib_step_us(bkv_cost_calib *calib, const bkv_step_shape *shape)
{
	if (!calib || !shape || !kind_ok(shape->kind) || (!shape->chunks && shape->n_chunks))
		return 0.0;
	double x[NF];
	calib_features(calib, shape, x);
	const calib_fit *f = &calib->fit[shape->kind];
	return calib_uses_fit(f, x[0]) ? calib_fit_us(f, x) * (1.0 + f->tail) : x[0];
}

/* ln(t / ref) clipped at CALIB_CLIP * scale. */
static double clipped_log_ratio(double t, double ref, double scale)
{
	double e = log(t / ref), lim = CALIB_CLIP * scale;
	return e > lim ? lim : e < -lim ? -lim : e;
}

void bkv_cost_calib_observe(bkv_cost_calib *calib, const bkv_step_shape *shape,
			    double measured_us)
{
	if (!calib || !shape || !kind_ok(shape->kind) || (!shape->chunks && shape->n_chunks))
		return;
	if (!isfinite(measured_us) || measured_us < 0.0)
		return;
	if (calib->base.observe)
		calib->base.observe(calib->base.ctx, shape, measured_us);
	double x[NF];
	calib_features(calib, shape, x);
	calib_fit *f = &calib->fit[shape->kind];
	const double t = measured_us, base = x[0], pf = calib_fit_us(f, x);
	const int confident = calib_confident(f) && pf > 0.0;
	/* Judge the measurement against the fit once it is trusted, else the
	 * base: clip it at CALIB_CLIP robust scales (in log space) from that
	 * prediction, so a stall moves the fit as a CALIB_CLIP-sigma
	 * measurement does, not as its full size. */
	double tc = t;
	const int resolved = t >= CALIB_RESOLVE_US;
	if (resolved && confident) {
		tc = pf * exp(clipped_log_ratio(t, pf, f->s_fit));
		f->level += CALIB_LEVEL_RATE * log(tc / pf); /* drift */
		f->tail += CALIB_TAIL_RATE * ((t - tc) / tc - f->tail);
	} else if (resolved && base > 0.0) {
		tc = base * exp(clipped_log_ratio(t, base, f->s_base));
	}
	if (resolved) {
		if (pf > 0.0)
			calib_scale_update(&f->s_fit, log(t / pf));
		if (base > 0.0)
			calib_scale_update(&f->s_base, log(t / base));
	}
	/* Relative least squares: weight 1/p^2 with p the trusted prediction
	 * (the clipped measurement before there is one), so every call counts
	 * by its relative error and the fit estimates the mean time of a shape
	 * (weighing by the measurement itself would pull it below the mean). */
	double p = confident ? pf : tc, lam = calib->forget;
	double wt = 1.0 / (p > 1.0 ? p * p : 1.0);
	tc *= exp(-f->level); /* the fit learns the measurement without the level */
	if (!resolved && base > 0.0) /* under the clock's resolution: the */
		for (int j = 1; j < NF; j++) /* base's scale only */
			x[j] = 0.0;
	for (int i = 0; i < NF; i++) {
		for (int j = 0; j < NF; j++)
			f->a[i][j] = lam * f->a[i][j] + wt * x[i] * x[j];
		f->y[i] = lam * f->y[i] + wt * x[i] * tc;
	}
	f->n_obs++;
	f->n_eff = lam * f->n_eff + 1.0;
	calib_solve(f);
}

uint64_t bkv_cost_calib_observations(const bkv_cost_calib *calib, bkv_call_kind kind)
{
	if (!calib || !kind_ok(kind))
		return 0;
	return calib->fit[kind].n_obs;
}

int bkv_cost_calib_coefficients_get(const bkv_cost_calib *calib, bkv_call_kind kind, double *w)
{
	if (!calib || !w || !kind_ok(kind))
		return BKV_EINVAL;
	memcpy(w, calib->fit[kind].w, sizeof(calib->fit[kind].w));
	return BKV_OK;
}

int bkv_cost_calib_confidence_get(const bkv_cost_calib *calib, bkv_call_kind kind,
				  bkv_cost_calib_confidence *out)
{
	if (!calib || !out || !kind_ok(kind) || out->size < sizeof(*out))
		return BKV_EINVAL;
	const calib_fit *f = &calib->fit[kind];
	out->n_eff = f->n_eff;
	out->scale_fit = f->s_fit;
	out->scale_base = calib->base.step_us ? f->s_base : 0.0;
	out->level = exp(f->level);
	out->trusted = calib_confident(f);
	out->uses_fit = calib_uses_fit(f, calib->base.step_us ? 1.0 : 0.0);
	return BKV_OK;
}

static double calib_step_cb(void *ctx, const bkv_step_shape *shape)
{
	return bkv_cost_calib_step_us((bkv_cost_calib *)ctx, shape);
}

static void calib_observe_cb(void *ctx, const bkv_step_shape *shape, double measured_us)
{
	bkv_cost_calib_observe((bkv_cost_calib *)ctx, shape, measured_us);
}

bkv_cost_model bkv_cost_calib_model(bkv_cost_calib *calib)
{
	bkv_cost_model m = {NULL, NULL, NULL};
	if (calib) {
		m.step_us = calib_step_cb;
		m.observe = calib_observe_cb;
		m.ctx = calib;
	}
	return m;
}
