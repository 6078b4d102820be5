/*
 * model.h - tinylm: a small decoder-only transformer in plain C, served through
 * libbatchkv.
 *
 * The model is real (token embedding, RMSNorm, rotary positions, grouped-query
 * attention with fewer KV heads than query heads, a SwiGLU MLP, an untied LM
 * head) but its weights come from a fixed-seed PRNG, so nothing is downloaded
 * and every run computes the same numbers. Its pieces are split so that two
 * very different drivers share every floating-point operation:
 *
 *   ref.c    runs one request alone over a plain contiguous KV cache;
 *   paged.c  runs libbatchkv's batches over one preallocated tensor of blocks,
 *            reading K/V only through the batch's block tables.
 *
 * Both call tlm_layer_qkv / tlm_attend / tlm_layer_out / tlm_logits, whose
 * per-row arithmetic does not depend on how many rows are computed together
 * nor on where the K/V rows live (attention takes an array of row pointers).
 * That makes "batched == alone" an exact, bit-for-bit property, which the test
 * checks token for token.
 */
#ifndef TINYLM_MODEL_H
#define TINYLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* The shape of a model. n_heads must be a multiple of n_kv_heads (GQA group
 * size n_heads / n_kv_heads); head_dim must be even (RoPE pairs). */
typedef struct tlm_config {
	uint32_t vocab;      /* token ids are 0..vocab-1 */
	uint32_t dim;        /* residual stream width */
	uint32_t layers;     /* transformer blocks */
	uint32_t n_heads;    /* query heads per layer */
	uint32_t n_kv_heads; /* key/value heads per layer (< n_heads: GQA) */
	uint32_t head_dim;   /* dimensions per head */
	uint32_t ffn;        /* SwiGLU hidden width */
	uint32_t max_pos;    /* longest sequence (RoPE table size) */
	float rope_theta;    /* RoPE base, 10000 as in Llama */
	uint64_t seed;       /* PRNG seed of every weight */
	uint32_t window;     /* 0, or a hybrid's sliding window W: position p
				of a windowed layer attends to p - W + 1 .. p */
	uint32_t chunk;      /* 0, or a hybrid's chunk C: position p of a
				chunked layer attends to floor(p / C) * C .. p */
	uint32_t recurrent;  /* 0, or a hybrid's last layer is a linear-
				attention layer with a recurrent state
				(tlm_recurrent_step), checkpointed every this
				many tokens (a multiple of the block size) */
} tlm_config;

/* One transformer block's weights. Matrices are stored [in][out] (row k holds
 * the weights multiplying input k), the layout the matmul streams. */
typedef struct tlm_layer {
	float *attn_norm; /* [dim] RMSNorm gain before attention */
	float *wq;        /* [dim][n_heads*head_dim] */
	float *wk;        /* [dim][n_kv_heads*head_dim] */
	float *wv;        /* [dim][n_kv_heads*head_dim] */
	float *wo;        /* [n_heads*head_dim][dim] */
	float *mlp_norm;  /* [dim] RMSNorm gain before the MLP */
	float *w_gate;    /* [dim][ffn] SwiGLU gate (silu side) */
	float *w_up;      /* [dim][ffn] SwiGLU linear side */
	float *w_down;    /* [ffn][dim] */
} tlm_layer;

/* A model: one allocation of weights (data) plus views into it. */
typedef struct tlm_model {
	tlm_config cfg;      /* copied at creation */
	float *data;         /* owns every weight below; n_params floats */
	size_t n_params;     /* floats in data */
	float *embed;        /* [vocab][dim] token embedding */
	tlm_layer *layer;    /* [layers] */
	float *final_norm;   /* [dim] */
	float *lm_head;      /* [dim][vocab] */
	float *rope_cos;     /* [max_pos][head_dim/2] cos(pos * freq_i) */
	float *rope_sin;     /* [max_pos][head_dim/2] */
} tlm_model;

/* The demo's model: 512 vocab, 256 wide, 4 layers, 8 query heads over 2 KV
 * heads of 32, SwiGLU 688: about 3.2 M parameters. */
void tlm_config_default(tlm_config *cfg);
/* A much smaller model of the same architecture for sanitizer runs. */
void tlm_config_small(tlm_config *cfg);

/* A hybrid's layers (tlm_layer_group): with both a window and a chunk,
 * layer l is full attention when l % 3 == 0, windowed when 1, chunked when
 * 2; with one of them, even layers are full and odd ones windowed (or
 * chunked); with recurrent, the last layer is recurrent. Groups are
 * numbered as the pool's KV groups: 0 full, then windowed, then chunked,
 * then the recurrent state (those that exist). */
#define TLM_MAX_GROUPS 4
uint32_t tlm_layer_group(const tlm_config *c, uint32_t l);
/* The kind of group g (a bkv_group_kind value) and its span. */
uint32_t tlm_group_kind(const tlm_config *c, uint32_t g, uint32_t *span);
/* Groups of the model: 1 for a plain transformer. */
uint32_t tlm_n_groups(const tlm_config *c);
/* The first position a token at position p attends to in layer l. */
uint32_t tlm_attn_first(const tlm_config *c, uint32_t l, uint32_t p);
/* Is layer l the recurrent one? */
int tlm_layer_recurrent(const tlm_config *c, uint32_t l);
/* Floats of a recurrent layer's state: n_kv_heads x head_dim x head_dim. */
static inline uint32_t tlm_state_floats(const tlm_config *c)
{
	return c->n_kv_heads * c->head_dim * c->head_dim;
}
/* One token through a recurrent (linear-attention) layer: for each KV head
 * S = 0.875 S + k v^T (state[tlm_state_floats], updated in place), then
 * each query head reads out = q S / head_dim from its KV head's state. */
void tlm_recurrent_step(const tlm_model *m, float *state, const float *q, const float *k,
			const float *v, float *out);

/* Build a model from cfg (weights from cfg->seed). Returns NULL on bad config
 * or out of memory. */
tlm_model *tlm_model_create(const tlm_config *cfg);
void tlm_model_destroy(tlm_model *m);

/* Floats of K (or V) one token stores per layer: n_kv_heads * head_dim. */
static inline uint32_t tlm_kv_width(const tlm_config *c)
{
	return c->n_kv_heads * c->head_dim;
}
/* Floats of Q per token: n_heads * head_dim. */
static inline uint32_t tlm_q_width(const tlm_config *c)
{
	return c->n_heads * c->head_dim;
}

/* y[n][out] = x[n][in] . w[in][out]. Each y element is summed over k in
 * increasing order whatever n is, so a row's result never depends on the
 * batch it is computed in. */
void tlm_matmul(float *y, const float *x, const float *w, uint32_t n, uint32_t in, uint32_t out);

/* Token embedding of n tokens into x[n][dim]. */
void tlm_embed(const tlm_model *m, uint32_t n, const int32_t *tokens, float *x);

/* Layer l, first half: RMSNorm of x[n][dim], then q[n][q_width],
 * k[n][kv_width], v[n][kv_width], with RoPE applied to q and k at pos[i].
 * tmp: scratch of n*dim floats. */
void tlm_layer_qkv(const tlm_model *m, uint32_t l, uint32_t n, const float *x,
		   const int32_t *pos, float *q, float *k, float *v, float *tmp);

/* Attention of one query token (q: [q_width]) over n_ctx cached tokens, whose
 * K and V rows (each [kv_width], one per token position, in order) are given
 * by pointers; out: [q_width]. scores: scratch of n_ctx floats. Query head h
 * reads KV head h / (n_heads / n_kv_heads). */
void tlm_attend(const tlm_model *m, const float *q, uint32_t n_ctx, const float *const *krows,
		const float *const *vrows, float *out, float *scores);

/* Layer l, second half: x += attn[n][q_width] . wo, then
 * x += down(silu(gate(norm(x))) * up(norm(x))). tmp: n*dim floats,
 * hid: 2*n*ffn floats. */
void tlm_layer_out(const tlm_model *m, uint32_t l, uint32_t n, float *x, const float *attn,
		   float *tmp, float *hid);

/* Logits of one hidden row: final RMSNorm, then the LM head. tmp: dim floats. */
void tlm_logits(const tlm_model *m, const float *x, float *logits, float *tmp);

/*
 * Adapters (a LoRA stand-in). Adapter a (1, 2, ...) adds a fixed bias vector,
 * drawn from a hash of (cfg.seed, a, layer, element) uniform in
 * [-TLM_ADAPTER_RESID, TLM_ADAPTER_RESID], to the residual stream after each
 * layer (so later layers' K/V depend on it), and one uniform in
 * [-TLM_ADAPTER_LOGIT, TLM_ADAPTER_LOGIT] to each logit (so its sampled
 * tokens do). Adapter 0 is the base model: both add nothing. The biases are
 * added element by element, after tlm_layer_out and tlm_logits, so a row's
 * result still does not depend on its batch.
 */
#define TLM_ADAPTER_RESID 0.5f
#define TLM_ADAPTER_LOGIT 1.0f
/* Add adapter's bias of layer l to n hidden rows x[n][dim]. */
void tlm_adapter_layer(const tlm_model *m, uint32_t adapter, uint32_t l, uint32_t n, float *x);
/* Add adapter's bias to one row of logits[vocab]. */
void tlm_adapter_logits(const tlm_model *m, uint32_t adapter, float *logits);

/*
 * The sampling rule. n_samples == 1: greedy (argmax, lowest id on ties).
 * n_samples > 1: branch b samples from softmax(logits / 0.8) with a uniform
 * drawn from a hash of (seed, branch, pos), so branches differ but every run
 * draws the same token for the same (request, branch, position). seed names
 * the request (the caller's, stable across runs); pos is the position of the
 * token being generated.
 */
int32_t tlm_sample(const float *logits, uint32_t vocab, uint32_t n_samples, uint64_t seed,
		   uint32_t branch, uint32_t pos);

/* splitmix64: the PRNG behind weights, sampling and workloads. */
uint64_t tlm_mix64(uint64_t x);

#endif /* TINYLM_MODEL_H */
