/*
 * mm.c - bkv-sim's multimodal workload (--mm-images N): requests carry
 * images, encoder inputs whose outputs fill spans of their prompts
 * (bkv_request.inputs), and the virtual host runs an image encoder before a
 * call's rows read them, under the scheduler's encoder budget per step and
 * encoder cache capacity (bkv_sched_config.encoder_budget, encoder_cache).
 *
 * The workload. Request i carries 1..K images (K = --mm-per-request,
 * uniform), each of T = --mm-tokens prompt positions (LLaVA-1.5's 576 by
 * default), spread evenly over its prompt; a prompt too short for them all
 * carries as many as fit (none below T tokens). An image's popularity is
 * Zipf-like, as the adapters' (adapters.c): rank k (1 = most requested) is
 * drawn with weight k^-s (s = --mm-zipf, default 1; 0 is uniform), a
 * request's images distinct, its cache id a hash of the rank. Draws hash the
 * trace's salt with the request's index, so a seed's trace gets the same
 * images in every row of a report.
 *
 * The virtual host. Each call first drops the ids of bkv_batch.encoder_free
 * from its encoder cache, then runs the encoder on every entry of
 * bkv_batch.encode and holds its outputs. The encoder's time is an
 * assumption, not a measurement: --mm-encode-us per unit of cost (an
 * input's cost is its token count), run on the same device before the call
 * computes, so it adds to the call's time and counts as prefill time (a
 * vision tower of a few hundred million parameters runs a 576-token image in
 * a few milliseconds on one GPU: 10 us a token by default). The host checks
 * the contract as it goes: an encode must name the request's own input, a
 * row must read only images the cache holds, no step may encode more than
 * the budget and the cache never holds more than its capacity; breaks are
 * counted (mm_bad, 0 when the library is right).
 *
 * Reported: images submitted, encodes, the hit rate (1 - encodes / images:
 * an image needs no encoder run when its outputs are still cached, or when
 * the prefix cache already holds the KV of its span), encoder time, the
 * most cost in one step and the most tokens held.
 */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MM_REDRAWS 8 /* tries for an image the request does not carry yet */

struct sim_mm {
	uint32_t n_req;          /* requests of the trace */
	uint32_t *first;         /* [n_req + 1] request i's inputs are
				    in[first[i] .. first[i + 1]) */
	bkv_encoder_input *in;   /* every request's inputs */
	uint32_t *of_id;         /* [n_req + 1] request index of each
				    scheduler id (ids count from 1 in
				    submission order); UINT32_MAX unknown */
	uint32_t cache;          /* encoder_cache, tokens */
	uint32_t budget;         /* encoder_budget (0: none) */
	double us_per_cost;      /* encoder time per unit of cost */
	uint64_t *held_id;       /* [cap_held] the host cache's ids (0: free) */
	uint32_t *held_len;      /* [cap_held] their tokens */
	uint32_t cap_held;       /* entries */
	uint64_t held;           /* tokens held */
	uint64_t step_cost;      /* the current step's encoder cost */
	sim_result acc;          /* the mm_* counters as they grow */
};

static uint64_t mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

uint32_t sim_mm_cache(const sim_config *cfg)
{
	if (!cfg->mm_images)
		return 0;
	return cfg->encoder_cache ? cfg->encoder_cache
				  : 8u * cfg->mm_per_request * cfg->mm_tokens;
}

/* Rank (0-based) whose cumulative weight first exceeds u. */
static uint32_t rank_of(const double *cdf, uint32_t n, double u)
{
	uint32_t lo = 0, hi = n - 1;
	while (lo < hi) {
		const uint32_t mid = lo + (hi - lo) / 2;
		if (cdf[mid] > u)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* Request i's images: how many fit, which (distinct), where. */
static void draw(sim_mm *m, const sim_config *cfg, const trace *t, const double *cdf, uint32_t i)
{
	const uint32_t T = cfg->mm_tokens, len = t->reqs[i].prompt_len;
	uint64_t h = mix64(t->salt ^ mix64(((uint64_t)i << 8) ^ 0x1A6Eull));
	uint32_t n = 1 + (uint32_t)(h % cfg->mm_per_request);
	if ((uint64_t)n * T > len)
		n = len / T;
	const uint32_t gap = n ? (len - n * T) / (n + 1) : 0, base = m->first[i];
	for (uint32_t j = 0; j < n; j++) {
		uint64_t id = 0;
		for (int tries = 0; tries < MM_REDRAWS; tries++) {
			h = mix64(h + 0x51ull);
			const double u = (double)(h >> 11) * (1.0 / 9007199254740992.0) *
					 cdf[cfg->mm_images - 1];
			id = mix64(rank_of(cdf, cfg->mm_images, u) ^ 0x1A6E5EEDull) | 1u;
			uint32_t k = 0;
			while (k < j && m->in[base + k].cache_id != id)
				k++;
			if (k == j)
				break;
		}
		m->in[base + j] = (bkv_encoder_input){.cache_id = id,
						      .token_start = gap * (j + 1) + j * T,
						      .token_len = T};
	}
	m->first[i + 1] = base + n;
}

int sim_mm_open(const sim_config *cfg, const trace *t, sim_mm **out)
{
	*out = NULL;
	if (!cfg->mm_images)
		return 0;
	sim_mm *m = calloc(1, sizeof(*m));
	double *cdf = malloc((size_t)cfg->mm_images * sizeof(double)), acc = 0.0;
	if (!m || !cdf)
		goto fail;
	m->n_req = t->n;
	m->cache = sim_mm_cache(cfg);
	m->budget = cfg->encoder_budget;
	m->us_per_cost = cfg->mm_encode_us;
	m->first = calloc((size_t)t->n + 1, sizeof(uint32_t));
	m->of_id = malloc(((size_t)t->n + 1) * sizeof(uint32_t));
	m->in = malloc(((size_t)t->n * cfg->mm_per_request + 1) * sizeof(bkv_encoder_input));
	m->cap_held = m->cache / (cfg->mm_tokens ? cfg->mm_tokens : 1) + 1;
	m->held_id = calloc(m->cap_held, sizeof(uint64_t));
	m->held_len = calloc(m->cap_held, sizeof(uint32_t));
	if (!m->first || !m->of_id || !m->in || !m->held_id || !m->held_len)
		goto fail;
	for (uint32_t k = 0; k < cfg->mm_images; k++) {
		acc += pow((double)(k + 1), -cfg->mm_zipf);
		cdf[k] = acc;
	}
	for (uint32_t i = 0; i < t->n; i++)
		draw(m, cfg, t, cdf, i);
	memset(m->of_id, 0xff, ((size_t)t->n + 1) * sizeof(uint32_t));
	m->acc.mm_cache = m->cache;
	m->acc.mm_budget = m->budget;
	free(cdf);
	*out = m;
	return 0;
fail:
	free(cdf);
	sim_mm_close(m);
	return -1;
}

void sim_mm_close(sim_mm *m)
{
	if (!m)
		return;
	free(m->first), free(m->in), free(m->of_id), free(m->held_id), free(m->held_len);
	free(m);
}

const bkv_encoder_input *sim_mm_inputs(const sim_mm *m, uint32_t i, uint32_t *n)
{
	*n = m && i < m->n_req ? m->first[i + 1] - m->first[i] : 0;
	return *n ? m->in + m->first[i] : NULL;
}

void sim_mm_submitted(sim_mm *m, uint32_t i, uint64_t id)
{
	if (!m || i >= m->n_req)
		return;
	if (id <= m->n_req)
		m->of_id[id] = i;
	m->acc.mm_inputs += m->first[i + 1] - m->first[i];
}

void sim_mm_step_begin(sim_mm *m)
{
	if (m)
		m->step_cost = 0;
}

/* The host cache's slot of id, or -1. */
static int held_slot(const sim_mm *m, uint64_t id)
{
	for (uint32_t k = 0; k < m->cap_held; k++)
		if (m->held_id[k] == id)
			return (int)k;
	return -1;
}

/* Hold id's outputs (len tokens); a contract break when no room. */
static void hold(sim_mm *m, uint64_t id, uint32_t len)
{
	if (held_slot(m, id) >= 0)
		return; /* encoded again (a rolled-back step's): same outputs */
	const int k = held_slot(m, 0);
	if (k < 0 || m->held + len > m->cache) {
		m->acc.mm_bad++;
		return;
	}
	m->held_id[k] = id;
	m->held_len[k] = len;
	m->held += len;
	if (m->held > m->acc.mm_held_max)
		m->acc.mm_held_max = m->held;
}

/* Run one encode entry: its request's input, held, charged. */
static double encode(sim_mm *m, const bkv_encode *e)
{
	const uint32_t i = e->req <= m->n_req ? m->of_id[e->req] : UINT32_MAX;
	if (i >= m->n_req || e->input >= m->first[i + 1] - m->first[i]) {
		m->acc.mm_bad++;
		return 0.0;
	}
	const bkv_encoder_input *in = &m->in[m->first[i] + e->input];
	if (in->cache_id != e->cache_id || in->token_len != e->len)
		m->acc.mm_bad++;
	hold(m, in->cache_id, in->token_len);
	const uint32_t cost = in->cost ? in->cost : in->token_len;
	m->step_cost += cost;
	if (m->budget && m->step_cost > m->budget)
		m->acc.mm_bad++;
	if (m->step_cost > m->acc.mm_step_cost_max)
		m->acc.mm_step_cost_max = m->step_cost;
	m->acc.mm_encodes++;
	const double us = cost * m->us_per_cost;
	m->acc.mm_encode_us += us;
	return us;
}

double sim_mm_call(sim_mm *m, const bkv_batch *b)
{
	if (!m)
		return 0.0;
	for (uint32_t f = 0; f < b->n_encoder_free; f++) {
		const int k = held_slot(m, b->encoder_free[f]);
		if (k >= 0) {
			m->held -= m->held_len[k];
			m->held_id[k] = 0;
		}
	}
	double us = 0.0;
	for (uint32_t e = 0; e < b->n_encode; e++)
		us += encode(m, &b->encode[e]);
	for (uint32_t r = 0; r < b->n_rows; r++) { /* every span a row reads */
		const uint32_t i = (uint32_t)((uintptr_t)b->row_user[r] - 1);
		if (i >= m->n_req)
			continue;
		const uint32_t p0 = (uint32_t)b->positions[b->qo_indptr[r]];
		const uint32_t p1 = (uint32_t)b->positions[b->qo_indptr[r + 1] - 1];
		for (uint32_t k = m->first[i]; k < m->first[i + 1]; k++) {
			const bkv_encoder_input *in = &m->in[k];
			if (in->token_start <= p1 && in->token_start + in->token_len > p0 &&
			    held_slot(m, in->cache_id) < 0)
				m->acc.mm_bad++;
		}
	}
	return us;
}

void sim_mm_collect(const sim_mm *m, sim_result *res)
{
	if (!m)
		return;
	res->mm_cache = m->acc.mm_cache;
	res->mm_budget = m->acc.mm_budget;
	res->mm_inputs = m->acc.mm_inputs;
	res->mm_encodes = m->acc.mm_encodes;
	res->mm_hit_rate = m->acc.mm_inputs
				   ? 1.0 - (double)m->acc.mm_encodes / (double)m->acc.mm_inputs
				   : 0.0;
	res->mm_encode_us = m->acc.mm_encode_us;
	res->mm_step_cost_max = m->acc.mm_step_cost_max;
	res->mm_held_max = m->acc.mm_held_max;
	res->mm_bad = m->acc.mm_bad;
}
