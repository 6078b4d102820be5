/*
 * ref.c - the reference mode: one request alone, a plain contiguous KV cache.
 *
 * This is the answer key of the correctness test. It knows nothing of blocks,
 * batches or the scheduler: the prompt is computed in one pass, then tokens are
 * generated one at a time, each appending its K/V at the end of a flat array
 *
 *   k[layer][position][n_kv_heads * head_dim]     (v alike)
 *
 * For n > 1 samples the prompt's cache is computed once and copied for each
 * branch, which then samples with its own branch index (tlm_sample). It uses
 * the same kernels as the paged host, so any difference in generated tokens is
 * a difference in which K/V the paged host was shown, i.e. a scheduling or
 * block-table bug, never rounding. A request's adapter (tlm_adapter_layer,
 * tlm_adapter_logits) is applied here as the paged host applies a row's, and
 * its encoder inputs' spans embed the encoder's outputs computed from the
 * images (tlm_inputs_embed), where the paged host reads its encoder cache.
 */
#include "tinylm.h"

#include <stdlib.h>
#include <string.h>

/* Scratch of one reference run; everything sized for max_len tokens. */
typedef struct ref_ctx {
	const tlm_model *m;
	uint32_t adapter;   /* the request's adapter (0: the base model) */
	const tlm_inputs *in; /* its encoder inputs (NULL: none) */
	uint32_t max_len;   /* prompt_len + max_new */
	float *k, *v;       /* [layers][max_len][kv_width] contiguous caches */
	float *x, *q, *kn, *vn, *attn, *tmp, *hid; /* per-token activations */
	float *scores;      /* [max_len] */
	float *logits;      /* [vocab] */
	const float **krows, **vrows; /* [max_len] row pointers */
} ref_ctx;

static float *layer_k(ref_ctx *r, float *base, uint32_t l)
{
	return base + (size_t)l * r->max_len * tlm_kv_width(&r->m->cfg);
}

/* Run n tokens at positions start.. through the model over the caches k/v,
 * leaving the last token's hidden row in r->x + (n-1)*dim. */
static void run(ref_ctx *r, float *kc, float *vc, float *st, const int32_t *tokens, uint32_t n,
		uint32_t start)
{
	const tlm_model *m = r->m;
	const tlm_config *c = &m->cfg;
	const uint32_t kvw = tlm_kv_width(c), qw = tlm_q_width(c);
	int32_t *pos = malloc(n * sizeof(int32_t));
	for (uint32_t i = 0; i < n; i++)
		pos[i] = (int32_t)(start + i);
	tlm_embed(m, n, tokens, r->x);
	tlm_inputs_embed(m, r->in, start, n, r->x); /* spans: the encoder's rows */
	for (uint32_t l = 0; l < c->layers; l++) {
		float *K = layer_k(r, kc, l), *Vv = layer_k(r, vc, l);
		tlm_layer_qkv(m, l, n, r->x, pos, r->q, r->kn, r->vn, r->tmp);
		if (tlm_layer_recurrent(c, l)) { /* one state, token by token */
			for (uint32_t i = 0; i < n; i++)
				tlm_recurrent_step(m, st, r->q + (size_t)i * qw, r->kn + (size_t)i * kvw,
						   r->vn + (size_t)i * kvw, r->attn + (size_t)i * qw);
			tlm_layer_out(m, l, n, r->x, r->attn, r->tmp, r->hid);
			tlm_adapter_layer(m, r->adapter, l, n, r->x);
			continue;
		}
		memcpy(K + (size_t)start * kvw, r->kn, (size_t)n * kvw * sizeof(float));
		memcpy(Vv + (size_t)start * kvw, r->vn, (size_t)n * kvw * sizeof(float));
		for (uint32_t t = 0; t < start + n; t++) {
			r->krows[t] = K + (size_t)t * kvw;
			r->vrows[t] = Vv + (size_t)t * kvw;
		}
		for (uint32_t i = 0; i < n; i++) {
			/* a hybrid's windowed or chunked layer reads from lo on */
			const uint32_t lo = tlm_attn_first(c, l, start + i);
			tlm_attend(m, r->q + (size_t)i * qw, start + i + 1 - lo, r->krows + lo,
				   r->vrows + lo, r->attn + (size_t)i * qw, r->scores);
		}
		tlm_layer_out(m, l, n, r->x, r->attn, r->tmp, r->hid);
		tlm_adapter_layer(m, r->adapter, l, n, r->x);
	}
	free(pos);
}

static int32_t next_token(ref_ctx *r, uint32_t last_row, uint32_t n_samples, uint64_t seed,
			  uint32_t branch, uint32_t pos)
{
	tlm_logits(r->m, r->x + (size_t)last_row * r->m->cfg.dim, r->logits, r->tmp);
	tlm_adapter_logits(r->m, r->adapter, r->logits);
	return tlm_sample(r->logits, r->m->cfg.vocab, n_samples, seed, branch, pos);
}

static int is_stop(int32_t t, const int32_t *stop, uint32_t n_stop)
{
	for (uint32_t i = 0; i < n_stop; i++)
		if (stop[i] == t)
			return 1;
	return 0;
}

int tlm_ref_generate(const tlm_model *m, const int32_t *prompt, uint32_t prompt_len,
		     uint32_t max_new, const int32_t *stop, uint32_t n_stop, uint32_t n_samples,
		     uint64_t seed, int32_t *out, uint32_t *out_len)
{
	return tlm_ref_generate_adapter(m, 0, prompt, prompt_len, max_new, stop, n_stop,
					n_samples, seed, out, out_len);
}

int tlm_ref_generate_adapter(const tlm_model *m, uint32_t adapter, const int32_t *prompt,
			     uint32_t prompt_len, uint32_t max_new, const int32_t *stop,
			     uint32_t n_stop, uint32_t n_samples, uint64_t seed, int32_t *out,
			     uint32_t *out_len)
{
	return tlm_ref_generate_mm(m, adapter, NULL, prompt, prompt_len, max_new, stop, n_stop,
				   n_samples, seed, out, out_len);
}

int tlm_ref_generate_mm(const tlm_model *m, uint32_t adapter, const tlm_inputs *in,
			const int32_t *prompt, uint32_t prompt_len, uint32_t max_new,
			const int32_t *stop, uint32_t n_stop, uint32_t n_samples, uint64_t seed,
			int32_t *out, uint32_t *out_len)
{
	const tlm_config *c = &m->cfg;
	if (!prompt_len || !max_new || !n_samples || prompt_len + max_new > c->max_pos)
		return -1;
	ref_ctx r = {.m = m, .adapter = adapter, .in = in, .max_len = prompt_len + max_new};
	const size_t kvw = tlm_kv_width(c), qw = tlm_q_width(c), L = c->layers;
	const size_t cache = L * r.max_len * kvw, n = prompt_len;
	r.k = malloc(cache * sizeof(float));
	r.v = malloc(cache * sizeof(float));
	float *bk = malloc(cache * sizeof(float)), *bv = malloc(cache * sizeof(float));
	const size_t sf = tlm_state_floats(c);
	float *st = calloc(sf, sizeof(float)), *bst = malloc(sf * sizeof(float));
	r.x = malloc(n * c->dim * sizeof(float));
	r.q = malloc(n * qw * sizeof(float));
	r.kn = malloc(n * kvw * sizeof(float));
	r.vn = malloc(n * kvw * sizeof(float));
	r.attn = malloc(n * qw * sizeof(float));
	r.tmp = malloc(n * (c->dim > qw ? c->dim : qw) * sizeof(float));
	r.hid = malloc(2 * n * c->ffn * sizeof(float));
	r.scores = malloc(r.max_len * sizeof(float));
	r.logits = malloc(c->vocab * sizeof(float));
	r.krows = malloc(r.max_len * sizeof(float *));
	r.vrows = malloc(r.max_len * sizeof(float *));
	int rc = 0;
	if (!r.k || !r.v || !bk || !bv || !r.x || !r.q || !r.kn || !r.vn || !r.attn || !r.tmp ||
	    !r.hid || !r.scores || !r.logits || !r.krows || !r.vrows || !st || !bst) {
		rc = -1;
		goto out;
	}
	run(&r, r.k, r.v, st, prompt, prompt_len, 0);
	/* Every branch starts from the prompt's logits. */
	tlm_logits(m, r.x + (n - 1) * c->dim, r.logits, r.tmp);
	tlm_adapter_logits(m, adapter, r.logits);
	float *prompt_logits = malloc(c->vocab * sizeof(float));
	if (!prompt_logits) {
		rc = -1;
		goto out;
	}
	memcpy(prompt_logits, r.logits, c->vocab * sizeof(float));
	for (uint32_t b = 0; b < n_samples; b++) {
		int32_t *o = out + (size_t)b * max_new;
		/* Branch-private copy of the prompt's cache (layers are strided
		 * by max_len, so copy whole layers). */
		memcpy(bk, r.k, cache * sizeof(float));
		memcpy(bv, r.v, cache * sizeof(float));
		memcpy(bst, st, sf * sizeof(float));
		uint32_t len = 0;
		int32_t t = tlm_sample(prompt_logits, c->vocab, n_samples, seed, b, prompt_len);
		for (;;) {
			o[len++] = t;
			if (len == max_new || is_stop(t, stop, n_stop))
				break;
			uint32_t p = prompt_len + len - 1; /* position of t */
			run(&r, bk, bv, bst, &t, 1, p);
			t = next_token(&r, 0, n_samples, seed, b, p + 1);
		}
		out_len[b] = len;
	}
	free(prompt_logits);
out:
	free(r.k), free(r.v), free(bk), free(bv), free(r.x), free(r.q), free(r.kn), free(r.vn);
	free(r.attn), free(r.tmp), free(r.hid), free(r.scores), free(r.logits);
	free(r.krows), free(r.vrows), free(st), free(bst);
	return rc;
}
