/*
 * workload.c - a small replica under pressure, for the KV-event examples.
 *
 * The pool is deliberately tight (48 device blocks of 4 tokens, 32 host
 * blocks) for the 32 running slots the scheduler may fill, so cached blocks
 * are evicted, running requests are preempted (swapped while the host tier
 * has room, recomputed otherwise) and prefix hits are common: every prompt
 * starts with one of six shared "system prompts". A quarter of the requests
 * carry a LoRA key (7 or 9), named "adapter-7" and "adapter-9" for vLLM's
 * extra keys. The fake host samples a token from the last one, so two
 * sequences with equal histories continue alike.
 *
 * evw_truth is the test oracle: it reads every indexed block of the pool
 * through the public inspection call (bkv_block_info_get: indexed, parent,
 * key, tokens) and hashes each from its whole token chain.
 */
#include "workload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EVW_BT 4
#define EVW_PREFIXES 6

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t below(uint64_t *s, uint32_t n)
{
	return (uint32_t)(splitmix(s) % n);
}

static int forward(void *host, const bkv_batch *b, int32_t *next)
{
	uint32_t r;

	(void)host;
	for (r = 0; r < b->n_rows; r++)
		if (b->row_sample[r]) {
			uint32_t t = (uint32_t)b->token_ids[b->qo_indptr[r + 1] - 1];

			next[r] = (int32_t)((t * 2654435761u >> 8) % 1000u);
		}
	return 0;
}

static void on_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	(void)host, (void)req, (void)branch, (void)token, (void)user;
}

static void on_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	(void)req, (void)why, (void)user;
	((evw *)host)->finished++;
}

const char *evw_key_name(void *ud, uint64_t key)
{
	(void)ud;
	return key == 7 ? "adapter-7" : key == 9 ? "adapter-9" : NULL;
}

int evw_create(evw *w, uint32_t ring, uint32_t n_requests, uint64_t seed)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	int rc;

	memset(w, 0, sizeof *w);
	bkv_pool_config_init(&pc);
	pc.block_tokens = EVW_BT;
	pc.device_blocks = 48;
	pc.host_blocks = 8;
	pc.max_seqs = 64;
	pc.event_capacity = ring;
	bkv_sched_config_init(&sc);
	sc.max_running = 32;
	bkv_cost_poly_init(&w->poly);
	sc.cost = bkv_cost_poly_model(&w->poly);
	memset(&ops, 0, sizeof ops);
	ops.forward = forward;
	ops.on_token = on_token;
	ops.on_finish = on_finish;
	if ((rc = bkv_pool_create(&pc, NULL, &w->pool)) != BKV_OK)
		return rc;
	if ((rc = bkv_sched_create(&sc, w->pool, &ops, w, NULL, &w->sched)) != BKV_OK) {
		bkv_pool_destroy(w->pool);
		return rc;
	}
	w->rng = seed;
	w->n_requests = n_requests;
	w->reset_step = 60;
	return 0;
}

void evw_destroy(evw *w)
{
	bkv_sched_destroy(w->sched);
	bkv_pool_destroy(w->pool);
	memset(w, 0, sizeof *w);
}

static int submit_one(evw *w)
{
	int32_t prompt[64];
	uint32_t p = below(&w->rng, EVW_PREFIXES), plen = 4 + 4 * p, n, i;
	bkv_request rq;
	uint64_t ps = 1000 + p;

	for (i = 0; i < plen; i++) /* the shared prefix: a function of p */
		prompt[i] = (int32_t)(splitmix(&ps) % 1000u);
	n = plen + 2 + below(&w->rng, 19);
	for (; i < n; i++)
		prompt[i] = (int32_t)below(&w->rng, 1000);
	bkv_request_init(&rq);
	rq.prompt = prompt;
	rq.prompt_len = n;
	rq.max_new_tokens = 2 + below(&w->rng, 15);
	if (below(&w->rng, 4) == 0)
		rq.cache_key = below(&w->rng, 2) ? 7 : 9;
	return bkv_submit(w->sched, &rq, NULL);
}

int evw_step(evw *w)
{
	uint32_t k, arrivals = below(&w->rng, 4);
	int rc;

	for (k = 0; k < arrivals && w->submitted < w->n_requests; k++) {
		if ((rc = submit_one(w)) != BKV_OK)
			return rc;
		w->submitted++;
	}
	if ((rc = bkv_step(w->sched, NULL)) != BKV_OK)
		return rc;
	w->step++;
	if (w->step == w->reset_step && (rc = bkv_pool_reset_cache(w->pool)) != BKV_OK)
		return rc;
	return w->submitted < w->n_requests || bkv_sched_pending(w->sched) > 0;
}

uint32_t evw_truth(const evw *w, const bkv_vllm_config *cfg, uint8_t *out, uint32_t cap)
{
	return evw_pool_truth(w->pool, 0, cfg, out, cap); /* evw_create keeps hash_seed 0 */
}

/* Block b's state; 0 when b is no block of the pool (the walk then fails). */
static int block_info(const bkv_pool *pool, int32_t b, bkv_block_info *bi)
{
	bi->size = sizeof *bi;
	return bkv_block_info_get(pool, b, bi) == BKV_OK;
}

uint32_t evw_pool_truth(const bkv_pool *pool, uint64_t hash_seed, const bkv_vllm_config *cfg,
			uint8_t *out, uint32_t cap)
{
	bkv_pool_stats st = {.size = sizeof st};
	bkv_block_info bi;
	uint32_t b, n = 0, bt, nb;
	int32_t *chain = NULL, *tok = NULL;
	uint8_t *dig = NULL, *seen = NULL;
	uint64_t *nat = NULL;

	bkv_pool_stats_get(pool, &st);
	bt = st.block_tokens;
	nb = st.device_blocks;
	chain = malloc(sizeof(int32_t) * nb);
	tok = malloc(sizeof(int32_t) * (size_t)nb * bt);
	dig = malloc((size_t)nb * BKV_VLLM_DIGEST_BYTES);
	nat = malloc(sizeof(uint64_t) * nb);
	seen = calloc(nb, 1);
	if (!chain || !tok || !dig || !nat || !seen)
		goto done;
	/* Every indexed block lies on the chain of an indexed block without
	 * indexed children (a leaf): hash each leaf's chain from the root and
	 * take every block on it once. */
	for (b = 0; b < nb; b++) {
		uint32_t d = 0, i;
		int32_t c = (int32_t)b;
		uint64_t key;

		if (!block_info(pool, c, &bi) || !bi.indexed || bi.kids)
			continue;
		key = bi.key;
		while (c >= 0) { /* the parents of an indexed block are indexed */
			if (d == nb || !block_info(pool, c, &bi) || !bi.indexed) {
				n = UINT32_MAX;
				goto done;
			}
			chain[d++] = c;
			c = bi.parent;
		}
		for (i = 0; i < d; i++) { /* root first */
			if (!block_info(pool, chain[d - 1 - i], &bi) || bi.fill != bt) {
				n = UINT32_MAX;
				goto done;
			}
			memcpy(tok + (size_t)i * bt, bi.tokens, bt * sizeof(int32_t));
		}
		if (cfg->hash == BKV_VLLM_HASH_NATIVE) {
			bkv_block_hashes(hash_seed, key, bt, tok, d * bt, nat);
			for (i = 0; i < d; i++) {
				memset(dig + (size_t)i * BKV_VLLM_DIGEST_BYTES, 0, 24);
				for (int j = 0; j < 8; j++)
					dig[(size_t)i * BKV_VLLM_DIGEST_BYTES + 24 + (size_t)j] =
						(uint8_t)(nat[i] >> (56 - 8 * j));
			}
		} else {
			const char *name = evw_key_name(NULL, key);
			char salt[24];

			/* the encoder's cache_salt for an unnamed key */
			snprintf(salt, sizeof salt, "%llu", (unsigned long long)key);
			bkv_vllm_block_hashes_salted(cfg, name, name || !key ? NULL : salt, bt, tok,
						     d * bt, dig);
		}
		for (i = 0; i < d; i++) {
			int32_t x = chain[d - 1 - i];

			if (seen[x])
				continue;
			seen[x] = 1;
			if (n < cap)
				memcpy(out + (size_t)n * BKV_VLLM_DIGEST_BYTES,
				       dig + (size_t)i * BKV_VLLM_DIGEST_BYTES, BKV_VLLM_DIGEST_BYTES);
			n++;
		}
	}
	for (b = 0; b < nb; b++) /* an indexed block off every leaf chain: miscounted */
		if (block_info(pool, (int32_t)b, &bi) && bi.indexed && !seen[b])
			n = UINT32_MAX;
done:
	free(chain);
	free(tok);
	free(dig);
	free(nat);
	free(seen);
	return n;
}
