/*
 * model.c - tinylm's weights and per-row kernels.
 *
 * Weights are drawn from splitmix64 seeded by cfg->seed, uniform with variance
 * 1/fan_in (so activations stay O(1) through the layers), norm gains near 1.
 * Everything is float32 in one allocation:
 *
 *   data: | embed [vocab][dim] | layer 0: attn_norm wq wk wv wo mlp_norm
 *         |   w_gate w_up w_down | layer 1 ... | final_norm | lm_head [dim][vocab]
 *
 * The kernels are deliberately "per row": a matmul sums each output over its
 * inputs in increasing order whatever the batch size (it blocks rows four at a
 * time for cache reuse, which changes no sum order), and attention takes its
 * K/V rows through an array of pointers, so a contiguous cache and a paged one
 * feed it the same numbers in the same order. No reduction is reassociated
 * (no -ffast-math), so batched and alone agree to the bit.
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t tlm_mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

void tlm_config_default(tlm_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->vocab = 512;
	cfg->dim = 256;
	cfg->layers = 4;
	cfg->n_heads = 8;
	cfg->n_kv_heads = 2;
	cfg->head_dim = 32;
	cfg->ffn = 688;
	cfg->max_pos = 2048;
	cfg->rope_theta = 10000.0f;
	cfg->seed = 0x7417A11Du;
}

void tlm_config_small(tlm_config *cfg)
{
	tlm_config_default(cfg);
	cfg->vocab = 256;
	cfg->dim = 64;
	cfg->layers = 2;
	cfg->n_heads = 4;
	cfg->n_kv_heads = 2;
	cfg->head_dim = 16;
	cfg->ffn = 176;
}

uint32_t tlm_n_groups(const tlm_config *c)
{
	return 1 + (c->window != 0) + (c->chunk != 0) + (c->recurrent != 0);
}

int tlm_layer_recurrent(const tlm_config *c, uint32_t l)
{
	return c->recurrent && l == c->layers - 1;
}

uint32_t tlm_layer_group(const tlm_config *c, uint32_t l)
{
	if (tlm_layer_recurrent(c, l))
		return tlm_n_groups(c) - 1;
	if (c->window && c->chunk)
		return l % 3;
	if (c->window || c->chunk)
		return l % 2;
	return 0;
}

uint32_t tlm_group_kind(const tlm_config *c, uint32_t g, uint32_t *span)
{
	*span = 0;
	if (g == 0)
		return 0; /* BKV_GROUP_FULL */
	if (c->recurrent && g == tlm_n_groups(c) - 1) {
		*span = c->recurrent;
		return 3; /* BKV_GROUP_STATE */
	}
	if (g == 1 && c->window) {
		*span = c->window;
		return 1; /* BKV_GROUP_WINDOW */
	}
	*span = c->chunk;
	return 2; /* BKV_GROUP_CHUNKED */
}

uint32_t tlm_attn_first(const tlm_config *c, uint32_t l, uint32_t p)
{
	uint32_t span, kind = tlm_group_kind(c, tlm_layer_group(c, l), &span);

	if (kind == 1)
		return p + 1 > span ? p + 1 - span : 0;
	if (kind == 2)
		return p / span * span;
	return 0;
}

/* Uniform in [-a, a) from the PRNG state. */
static float uniform(uint64_t *state, float a)
{
	*state = tlm_mix64(*state);
	double u = (double)(*state >> 11) * (1.0 / 9007199254740992.0); /* [0,1) */
	return (float)((2.0 * u - 1.0) * a);
}

static void fill(float *w, size_t n, uint64_t *state, float a, float bias)
{
	for (size_t i = 0; i < n; i++)
		w[i] = bias + uniform(state, a);
}

tlm_model *tlm_model_create(const tlm_config *cfg)
{
	if (!cfg || !cfg->vocab || !cfg->dim || !cfg->layers || !cfg->n_heads ||
	    !cfg->n_kv_heads || cfg->n_heads % cfg->n_kv_heads || !cfg->head_dim ||
	    cfg->head_dim % 2 || !cfg->ffn || !cfg->max_pos)
		return NULL;
	tlm_model *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->cfg = *cfg;
	const size_t d = cfg->dim, qw = tlm_q_width(cfg), kvw = tlm_kv_width(cfg);
	const size_t f = cfg->ffn, V = cfg->vocab, half = cfg->head_dim / 2;
	const size_t per_layer = d + d * qw + 2 * d * kvw + qw * d + d + 2 * d * f + f * d;
	m->n_params = V * d + cfg->layers * per_layer + d + d * V;
	size_t total = m->n_params + 2 * (size_t)cfg->max_pos * half;
	m->data = malloc(total * sizeof(float));
	m->layer = calloc(cfg->layers, sizeof(tlm_layer));
	if (!m->data || !m->layer) {
		tlm_model_destroy(m);
		return NULL;
	}
	uint64_t st = cfg->seed;
	float *p = m->data;
	m->embed = p;
	fill(p, V * d, &st, 1.7320508f, 0.0f); /* unit variance */
	p += V * d;
	for (uint32_t l = 0; l < cfg->layers; l++) {
		tlm_layer *L = &m->layer[l];
		float a_d = 1.7320508f / sqrtf((float)d);
		L->attn_norm = p, fill(p, d, &st, 0.1f, 1.0f), p += d;
		L->wq = p, fill(p, d * qw, &st, a_d, 0.0f), p += d * qw;
		L->wk = p, fill(p, d * kvw, &st, a_d, 0.0f), p += d * kvw;
		L->wv = p, fill(p, d * kvw, &st, a_d, 0.0f), p += d * kvw;
		/* Output projections are scaled down so the residual stream does
		 * not grow with depth. */
		L->wo = p, fill(p, qw * d, &st, 0.5f * 1.7320508f / sqrtf((float)qw), 0.0f);
		p += qw * d;
		L->mlp_norm = p, fill(p, d, &st, 0.1f, 1.0f), p += d;
		L->w_gate = p, fill(p, d * f, &st, a_d, 0.0f), p += d * f;
		L->w_up = p, fill(p, d * f, &st, a_d, 0.0f), p += d * f;
		L->w_down = p, fill(p, f * d, &st, 0.5f * 1.7320508f / sqrtf((float)f), 0.0f);
		p += f * d;
	}
	m->final_norm = p, fill(p, d, &st, 0.1f, 1.0f), p += d;
	/* A hotter LM head gives peaked, input-dependent distributions. */
	m->lm_head = p, fill(p, d * V, &st, 4.0f * 1.7320508f / sqrtf((float)d), 0.0f);
	p += d * V;
	m->rope_cos = p;
	m->rope_sin = p + (size_t)cfg->max_pos * half;
	for (uint32_t pos = 0; pos < cfg->max_pos; pos++) {
		for (size_t i = 0; i < half; i++) {
			double freq = pow((double)cfg->rope_theta, -2.0 * (double)i / (double)cfg->head_dim);
			double ang = (double)pos * freq;
			m->rope_cos[pos * half + i] = (float)cos(ang);
			m->rope_sin[pos * half + i] = (float)sin(ang);
		}
	}
	return m;
}

void tlm_model_destroy(tlm_model *m)
{
	if (!m)
		return;
	free(m->data);
	free(m->layer);
	free(m);
}

/* GCC's -O2 does not vectorise the inner loop (its "very cheap" cost model);
 * -O3 does, over j only, which reorders no sum. Ask for it here so every
 * build (tests included) gets the 3x. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
void tlm_matmul(float *y, const float *x, const float *w, uint32_t n, uint32_t in, uint32_t out)
{
	uint32_t i = 0;
	/* Four rows share each streamed weight row; every y element is still a
	 * sum over k = 0, 1, ... in order. */
	for (; i + 4 <= n; i += 4) {
		float *y0 = y + (size_t)i * out, *y1 = y0 + out, *y2 = y1 + out, *y3 = y2 + out;
		const float *x0 = x + (size_t)i * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
		memset(y0, 0, 4 * (size_t)out * sizeof(float));
		for (uint32_t k = 0; k < in; k++) {
			const float *wk = w + (size_t)k * out;
			const float a0 = x0[k], a1 = x1[k], a2 = x2[k], a3 = x3[k];
			for (uint32_t j = 0; j < out; j++) {
				const float wj = wk[j];
				y0[j] += a0 * wj;
				y1[j] += a1 * wj;
				y2[j] += a2 * wj;
				y3[j] += a3 * wj;
			}
		}
	}
	for (; i < n; i++) {
		float *y0 = y + (size_t)i * out;
		const float *x0 = x + (size_t)i * in;
		memset(y0, 0, (size_t)out * sizeof(float));
		for (uint32_t k = 0; k < in; k++) {
			const float *wk = w + (size_t)k * out;
			const float a0 = x0[k];
			for (uint32_t j = 0; j < out; j++)
				y0[j] += a0 * wk[j];
		}
	}
}

void tlm_embed(const tlm_model *m, uint32_t n, const int32_t *tokens, float *x)
{
	const uint32_t d = m->cfg.dim;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t t = (uint32_t)tokens[i];
		if (t >= m->cfg.vocab)
			t = 0; /* the host validates ids; never index out of range */
		memcpy(x + (size_t)i * d, m->embed + (size_t)t * d, d * sizeof(float));
	}
}

static void rmsnorm(float *out, const float *x, const float *gain, uint32_t d)
{
	float ss = 0.0f;
	for (uint32_t i = 0; i < d; i++)
		ss += x[i] * x[i];
	const float scale = 1.0f / sqrtf(ss / (float)d + 1e-5f);
	for (uint32_t i = 0; i < d; i++)
		out[i] = x[i] * scale * gain[i];
}

/* Rotate consecutive pairs (2i, 2i+1) of each head by pos * freq_i. */
static void rope(const tlm_model *m, float *v, uint32_t heads, int32_t pos)
{
	const uint32_t hd = m->cfg.head_dim, half = hd / 2;
	uint32_t p = pos < 0 ? 0 : (uint32_t)pos;
	if (p >= m->cfg.max_pos)
		p = m->cfg.max_pos - 1; /* the host validates positions */
	const float *c = m->rope_cos + (size_t)p * half, *s = m->rope_sin + (size_t)p * half;
	for (uint32_t h = 0; h < heads; h++) {
		float *x = v + (size_t)h * hd;
		for (uint32_t i = 0; i < half; i++) {
			const float a = x[2 * i], b = x[2 * i + 1];
			x[2 * i] = a * c[i] - b * s[i];
			x[2 * i + 1] = a * s[i] + b * c[i];
		}
	}
}

void tlm_layer_qkv(const tlm_model *m, uint32_t l, uint32_t n, const float *x,
		   const int32_t *pos, float *q, float *k, float *v, float *tmp)
{
	const tlm_config *c = &m->cfg;
	const tlm_layer *L = &m->layer[l];
	const uint32_t d = c->dim, qw = tlm_q_width(c), kvw = tlm_kv_width(c);
	for (uint32_t i = 0; i < n; i++)
		rmsnorm(tmp + (size_t)i * d, x + (size_t)i * d, L->attn_norm, d);
	tlm_matmul(q, tmp, L->wq, n, d, qw);
	tlm_matmul(k, tmp, L->wk, n, d, kvw);
	tlm_matmul(v, tmp, L->wv, n, d, kvw);
	for (uint32_t i = 0; i < n; i++) {
		rope(m, q + (size_t)i * qw, c->n_heads, pos[i]);
		rope(m, k + (size_t)i * kvw, c->n_kv_heads, pos[i]);
	}
}

void tlm_recurrent_step(const tlm_model *m, float *state, const float *q, const float *k,
			const float *v, float *out)
{
	const tlm_config *c = &m->cfg;
	const uint32_t hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		float *S = state + (size_t)h * hd * hd;
		const float *kh = k + (size_t)h * hd, *vh = v + (size_t)h * hd;
		for (uint32_t i = 0; i < hd; i++)
			for (uint32_t j = 0; j < hd; j++)
				S[i * hd + j] = 0.875f * S[i * hd + j] + kh[i] * vh[j];
	}
	for (uint32_t h = 0; h < c->n_heads; h++) {
		const float *S = state + (size_t)(h / group) * hd * hd, *qh = q + (size_t)h * hd;
		float *oh = out + (size_t)h * hd;
		for (uint32_t j = 0; j < hd; j++) {
			float acc = 0.0f;
			for (uint32_t i = 0; i < hd; i++)
				acc += qh[i] * S[i * hd + j];
			oh[j] = acc / (float)hd;
		}
	}
}

void tlm_attend(const tlm_model *m, const float *q, uint32_t n_ctx, const float *const *krows,
		const float *const *vrows, float *out, float *scores)
{
	const tlm_config *c = &m->cfg;
	const uint32_t hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
	const float scale = 1.0f / sqrtf((float)hd);
	for (uint32_t h = 0; h < c->n_heads; h++) {
		const float *qh = q + (size_t)h * hd;
		const size_t koff = (size_t)(h / group) * hd;
		float mx = -INFINITY;
		for (uint32_t t = 0; t < n_ctx; t++) {
			const float *kt = krows[t] + koff;
			float s = 0.0f;
			for (uint32_t i = 0; i < hd; i++)
				s += qh[i] * kt[i];
			s *= scale;
			scores[t] = s;
			if (s > mx)
				mx = s;
		}
		float sum = 0.0f;
		for (uint32_t t = 0; t < n_ctx; t++) {
			scores[t] = expf(scores[t] - mx);
			sum += scores[t];
		}
		const float inv = 1.0f / sum;
		float *oh = out + (size_t)h * hd;
		memset(oh, 0, hd * sizeof(float));
		for (uint32_t t = 0; t < n_ctx; t++) {
			const float *vt = vrows[t] + koff;
			const float p = scores[t] * inv;
			for (uint32_t i = 0; i < hd; i++)
				oh[i] += p * vt[i];
		}
	}
}

static float silu(float x)
{
	return x / (1.0f + expf(-x));
}

void tlm_layer_out(const tlm_model *m, uint32_t l, uint32_t n, float *x, const float *attn,
		   float *tmp, float *hid)
{
	const tlm_config *c = &m->cfg;
	const tlm_layer *L = &m->layer[l];
	const uint32_t d = c->dim, f = c->ffn;
	const size_t nd = (size_t)n * d;
	tlm_matmul(tmp, attn, L->wo, n, tlm_q_width(c), d);
	for (size_t i = 0; i < nd; i++)
		x[i] += tmp[i];
	for (uint32_t i = 0; i < n; i++)
		rmsnorm(tmp + (size_t)i * d, x + (size_t)i * d, L->mlp_norm, d);
	float *gate = hid, *up = hid + (size_t)n * f;
	tlm_matmul(gate, tmp, L->w_gate, n, d, f);
	tlm_matmul(up, tmp, L->w_up, n, d, f);
	for (size_t i = 0; i < (size_t)n * f; i++)
		gate[i] = silu(gate[i]) * up[i];
	tlm_matmul(tmp, gate, L->w_down, n, f, d);
	for (size_t i = 0; i < nd; i++)
		x[i] += tmp[i];
}

void tlm_logits(const tlm_model *m, const float *x, float *logits, float *tmp)
{
	rmsnorm(tmp, x, m->final_norm, m->cfg.dim);
	tlm_matmul(logits, tmp, m->lm_head, 1, m->cfg.dim, m->cfg.vocab);
}

/* Element i of adapter's bias number `which` (a layer, or UINT32_MAX for
 * the logits), uniform in [-scale, scale]. */
static float adapter_bias(const tlm_model *m, uint32_t adapter, uint32_t which, uint32_t i,
			  float scale)
{
	const uint64_t h = tlm_mix64(m->cfg.seed ^ tlm_mix64(((uint64_t)adapter << 32) | which) ^
				     tlm_mix64(0xADA7u + (uint64_t)i));
	const float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
	return (2.0f * u - 1.0f) * scale;
}

void tlm_adapter_layer(const tlm_model *m, uint32_t adapter, uint32_t l, uint32_t n, float *x)
{
	const uint32_t d = m->cfg.dim;
	if (!adapter)
		return;
	for (uint32_t i = 0; i < d; i++) {
		const float bias = adapter_bias(m, adapter, l, i, TLM_ADAPTER_RESID);
		for (uint32_t r = 0; r < n; r++)
			x[(size_t)r * d + i] += bias;
	}
}

void tlm_adapter_logits(const tlm_model *m, uint32_t adapter, float *logits)
{
	if (!adapter)
		return;
	for (uint32_t i = 0; i < m->cfg.vocab; i++)
		logits[i] += adapter_bias(m, adapter, UINT32_MAX, i, TLM_ADAPTER_LOGIT);
}

int32_t tlm_sample(const float *logits, uint32_t vocab, uint32_t n_samples, uint64_t seed,
		   uint32_t branch, uint32_t pos)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < vocab; i++)
		if (logits[i] > logits[best])
			best = i;
	if (n_samples <= 1)
		return (int32_t)best;
	/* Inverse-CDF sampling at temperature 0.8; sums in double, in id order. */
	const double inv_t = 1.0 / 0.8;
	const double mx = logits[best];
	double total = 0.0;
	for (uint32_t i = 0; i < vocab; i++)
		total += exp(((double)logits[i] - mx) * inv_t);
	uint64_t h = tlm_mix64(seed ^ tlm_mix64(((uint64_t)branch << 32) | pos));
	double u = (double)(h >> 11) * (1.0 / 9007199254740992.0) * total;
	double acc = 0.0;
	for (uint32_t i = 0; i < vocab; i++) {
		acc += exp(((double)logits[i] - mx) * inv_t);
		if (u < acc)
			return (int32_t)i;
	}
	return (int32_t)(vocab - 1);
}
