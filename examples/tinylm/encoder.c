/*
 * encoder.c - tinylm's encoder inputs (a multimodal stand-in). An image is a
 * 64-bit content value; its encoder turns it into tlm_image_tokens(image)
 * embedding rows, each drawn from a hash of the model's seed, the image, the
 * row and the element (tlm_encoder_output). A request's input puts those rows
 * at the prompt positions of its span instead of the token embeddings, so
 * everything after the span (in every layer) depends on the image.
 *
 * The reference (ref.c) computes a span's rows straight from the image. The
 * paged host (paged.c) keeps an encoder cache keyed by cache id: it drops
 * the ids of bkv_batch.encoder_free, runs the encoder on each entry of
 * bkv_batch.encode (reading the image of the request and input the entry
 * names, never deriving it from the cache id) and stores the rows under the
 * entry's cache id; a row embeds a span position from that cache only, and a
 * position whose input is not held is a contract violation. So a library
 * that skipped an encode, freed an id still read, or shared KV between two
 * images (equal span token ids for different content) shows up as a
 * violation or as tokens that differ from the reference.
 *
 * The workload (tlm_workload_inputs) gives each job 0..3 images from its own
 * random stream. A job with a system prompt puts its first image at a fixed
 * place inside it, drawn from three images of one length (0, 2, 4): requests
 * with the same system prompt and image share that prefix in the prefix
 * cache, requests with the same system prompt and another image must not
 * (their prompts differ in nothing but the image's content). Further images go into the
 * job's own suffix, drawn with a skew to low numbers so they repeat.
 */
#include "tinylm.h"

#include <stdlib.h>
#include <string.h>

#define SYS_IMAGE_AT 8u   /* span start of a system prompt's image */
#define SYS_IMAGES 3u     /* images drawn for that place */

/* One held input: its outputs. */
typedef struct enc_entry {
	uint64_t id;  /* cache id (0: a free entry) */
	uint32_t len; /* output rows */
	float *out;   /* [len][dim], owned */
} enc_entry;

struct tlm_enc_cache {
	enc_entry *e;    /* [cap] held inputs, found by a linear scan (a
			    handful of images) */
	uint32_t cap;    /* entries allocated */
	uint32_t dim;    /* floats per output row */
	uint64_t tokens; /* the sum of the held entries' len */
};

uint64_t tlm_image_cache_id(uint64_t image)
{
	/* mix64 is a bijection: distinct images, distinct ids (|1 keeps
	 * them nonzero and merges only ids differing in bit 0, which the
	 * test rules out for the images it uses) */
	return tlm_mix64(image ^ 0x1A6E0C0DEull) | 1u;
}

uint32_t tlm_image_tokens(uint64_t image)
{
	return image % 2u ? 10u : 6u;
}

void tlm_encoder_output(const tlm_model *m, uint64_t image, uint32_t i, float *out)
{
	const uint64_t row = tlm_mix64(m->cfg.seed ^ tlm_mix64(image * 0x9E37u + 0xE7C0u) ^
				       tlm_mix64(0xE7C0DE00ull + i));
	for (uint32_t j = 0; j < m->cfg.dim; j++) {
		const uint64_t h = tlm_mix64(row + j);
		const float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
		out[j] = (2.0f * u - 1.0f) * 1.7320508f; /* unit variance */
	}
}

int tlm_inputs_find(const tlm_inputs *in, uint32_t pos)
{
	for (uint32_t k = 0; in && k < in->n; k++)
		if (pos >= in->in[k].token_start && pos - in->in[k].token_start < in->in[k].token_len)
			return (int)k;
	return -1;
}

void tlm_inputs_embed(const tlm_model *m, const tlm_inputs *in, uint32_t start, uint32_t n,
		      float *x)
{
	for (uint32_t t = 0; in && t < n; t++) {
		const int k = tlm_inputs_find(in, start + t);
		if (k >= 0)
			tlm_encoder_output(m, in->image[k], start + t - in->in[k].token_start,
					   x + (size_t)t * m->cfg.dim);
	}
}

tlm_enc_cache *tlm_enc_cache_create(uint32_t dim)
{
	tlm_enc_cache *c = calloc(1, sizeof(*c));
	if (c)
		c->dim = dim;
	return c;
}

void tlm_enc_cache_destroy(tlm_enc_cache *c)
{
	if (!c)
		return;
	for (uint32_t i = 0; i < c->cap; i++)
		free(c->e[i].out);
	free(c->e);
	free(c);
}

static enc_entry *find(const tlm_enc_cache *c, uint64_t id)
{
	for (uint32_t i = 0; c && id && i < c->cap; i++)
		if (c->e[i].id == id)
			return &c->e[i];
	return NULL;
}

uint32_t tlm_enc_cache_drop(tlm_enc_cache *c, uint64_t id)
{
	enc_entry *e = find(c, id);
	if (!e)
		return 0;
	const uint32_t len = e->len;
	free(e->out);
	memset(e, 0, sizeof(*e));
	c->tokens -= len;
	return len;
}

float *tlm_enc_cache_put(tlm_enc_cache *c, uint64_t id, uint32_t len, int *replaced)
{
	*replaced = tlm_enc_cache_drop(c, id) != 0;
	enc_entry *e = NULL;
	for (uint32_t i = 0; i < c->cap && !e; i++)
		if (!c->e[i].id)
			e = &c->e[i];
	if (!e) {
		const uint32_t cap = c->cap ? 2 * c->cap : 8;
		enc_entry *n = realloc(c->e, cap * sizeof(*n));
		if (!n)
			return NULL;
		memset(n + c->cap, 0, (cap - c->cap) * sizeof(*n));
		e = &n[c->cap];
		c->e = n;
		c->cap = cap;
	}
	e->out = malloc((size_t)len * c->dim * sizeof(float));
	if (!e->out)
		return NULL;
	e->id = id;
	e->len = len;
	c->tokens += len;
	return e->out;
}

const float *tlm_enc_cache_get(const tlm_enc_cache *c, uint64_t id, uint32_t *len)
{
	const enc_entry *e = find(c, id);
	if (!e)
		return NULL;
	*len = e->len;
	return e->out;
}

uint64_t tlm_enc_cache_tokens(const tlm_enc_cache *c)
{
	return c ? c->tokens : 0;
}

static uint32_t rnd(uint64_t *st, uint32_t lo, uint32_t hi)
{
	*st = tlm_mix64(*st);
	return lo + (uint32_t)(*st % (uint64_t)(hi - lo + 1));
}

/* Append image at [start, start + its tokens) to jb's inputs when it fits
 * the prompt; returns the span's end, or 0 when it did not fit. */
static uint32_t add_input(tlm_job *jb, uint64_t image, uint32_t start)
{
	const uint32_t len = tlm_image_tokens(image);
	if (jb->inputs.n == TLM_MAX_INPUTS || start + len > jb->prompt_len)
		return 0;
	tlm_inputs *in = &jb->inputs;
	in->in[in->n] = (bkv_encoder_input){.cache_id = tlm_image_cache_id(image),
					    .token_start = start, .token_len = len};
	in->image[in->n++] = image;
	jb->sampling.inputs = in;
	return start + len;
}

void tlm_workload_inputs(tlm_workload *w, const tlm_workload_config *wc)
{
	uint64_t st = tlm_mix64(wc->seed ^ 0x1A6E5EEDull); /* the images' own stream */
	for (uint32_t j = 0; wc->n_images && j < w->n_jobs; j++) {
		tlm_job *jb = &w->jobs[j];
		const uint32_t k = rnd(&st, 0, 3);
		const int sys = jb->prompt_len > wc->system_len;
		const uint32_t floor = sys ? wc->system_len : 0; /* the job's own part */
		uint32_t pos = 0;
		for (uint32_t i = 0; i < k; i++) {
			uint64_t image;
			uint32_t start;
			if (i == 0 && sys && SYS_IMAGE_AT + 10u <= wc->system_len) {
				/* even images: all of one length, so only their
				 * content tells them apart */
				image = 2u * rnd(&st, 0, (wc->n_images + 1) / 2 < SYS_IMAGES
								 ? (wc->n_images + 1) / 2 - 1
								 : SYS_IMAGES - 1);
				start = SYS_IMAGE_AT;
			} else {
				image = rnd(&st, 0, rnd(&st, 0, wc->n_images - 1)); /* skewed */
				start = (pos > floor ? pos : floor) + rnd(&st, 0, 6);
			}
			const uint32_t end = add_input(jb, image, start);
			if (!end)
				break;
			pos = end;
		}
	}
}
