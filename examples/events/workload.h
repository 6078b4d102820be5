/*
 * workload.h - the replica that the KV-event examples and tests publish: a
 * bkv_sched over a small pool with a host tier, driven by a fake host, fed
 * prompts that share prefixes, so that one run goes through prefix hits,
 * evictions, swap and recompute preemption, a dropped-event gap (the caller
 * skips drains) and a cache reset. The scheduler prices steps with a fixed
 * model, so a seed gives the same run on any machine.
 */
#ifndef BKV_EVENTS_WORKLOAD_H
#define BKV_EVENTS_WORKLOAD_H

#include <batchkv.h>

#include <stdint.h>

/* One simulated replica. */
typedef struct evw {
	bkv_pool *pool;       /* block_tokens 4, device 48, host 32 blocks */
	bkv_sched *sched;     /* over pool; the fake host samples tokens */
	uint64_t rng;         /* splitmix64 state */
	uint32_t step;        /* bkv_step calls so far */
	uint32_t submitted;   /* requests submitted so far */
	uint32_t n_requests;  /* requests the run submits in all */
	uint32_t reset_step;  /* step at which bkv_pool_reset_cache runs */
	uint32_t finished;    /* requests ended (on_finish) */
	bkv_cost_poly poly;   /* the scheduler's fixed cost model (seed 000's
				 polynomial), so decisions do not follow the
				 machine's speed */
} evw;

/* Create a replica: event ring of ring events, n requests, seed. 0 or a
 * negative bkv_status. */
int evw_create(evw *w, uint32_t ring, uint32_t n_requests, uint64_t seed);
void evw_destroy(evw *w);
/* Submit this step's arrivals and run one bkv_step (and the reset, at
 * reset_step). Returns 1 while work remains, 0 when done, < 0 on error. */
int evw_step(evw *w);
/* The lora name of a cache key (bkv_vllm_key_name_fn). */
const char *evw_key_name(void *ud, uint64_t key);
/* Truth: the vLLM digests (cfg's hash) of every block in the pool's index,
 * each from its whole token chain (walked through the blocks' parents
 * and hashed from the root with bkv_vllm_block_hashes, not incrementally;
 * one walk per leaf of the prefix tree). Writes at most cap digests into
 * out; returns how many blocks are indexed (UINT32_MAX if an indexed block
 * lies on no leaf's chain, which the pool's invariants exclude). */
uint32_t evw_truth(const evw *w, const bkv_vllm_config *cfg, uint8_t *out, uint32_t cap);
/* The same for any pool whose keys evw_key_name names; hash_seed is the
 * pool's bkv_pool_config.hash_seed (the native hash, BKV_VLLM_HASH_NATIVE,
 * depends on it). Reads the pool through bkv_block_info_get only. */
uint32_t evw_pool_truth(const bkv_pool *pool, uint64_t hash_seed, const bkv_vllm_config *cfg,
			uint8_t *out, uint32_t cap);

#endif
