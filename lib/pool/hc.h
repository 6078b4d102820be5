/*
 * hc.h - the host cache's hit path, for the pool's append (pool/seq.c):
 * verified host lookups, holding hits off the host LRU, and reloads to the
 * device, for group 0 (pool/hcache.c) and for KV groups (pool/hclanes.c).
 * The rest of the host cache is declared in pool/pool.h.
 */
#ifndef BKV_POOL_HC_H
#define BKV_POOL_HC_H

#include "pool/pool.h"

/* Verified host hits after a block whose chain hash is ph: the leading
 * whole blocks of tokens[0, max * bt) the host cache holds, their host ids
 * into out; returns how many. None while a device copy is pending. */
uint32_t bkv__hc_lookup_run(const bkv_pool *pool, uint64_t ph, uint64_t key,
			    const int32_t *tokens, uint32_t max, int32_t *out);
/* One verified host hit: the cached block after a block of chain hash ph
 * with key and tokens' first block_tokens ids, or -1. */
int32_t bkv__hc_lookup(const bkv_pool *pool, uint64_t ph, uint64_t key, const int32_t *tokens);
/* Host hit h will be read: held off the LRU, so that no eviction the
 * reloads' takes cause can drop it (every hit of an append is held before
 * its first take). _hold_run: the n stashed at s->table[n_blocks ..). */
void bkv__hc_hold(bkv_pool *pool, int32_t h);
void bkv__hc_hold_run(bkv_pool *pool, const bkv__seq *s, uint32_t n);
/* A device block after parent with held host block h's tokens and a
 * pending host->device copy (room reserved), counted as a host hit. */
int32_t bkv__hc_reload(bkv_pool *pool, int32_t h, int32_t parent);
/* Reload the n held host hits stashed at s->table[n_blocks ..): each
 * becomes a device block with a host->device copy, in the table and
 * offered to the cache; n_blocks moves past them. Room for the blocks and
 * copies is reserved. */
void bkv__hc_reload_run(bkv_pool *pool, bkv__seq *s, uint32_t n);
/* pool/hclanes.c: host-cache hits with KV groups: lane 0's run of n host hits
 * stashed at s->table[a ..) (tokens from block a's first on) shortened
 * until every lane holds what a sequence ending there reads next - lane
 * blocks in the host cache, or at block a on the device - and, with a
 * STATE group, a device checkpoint ends it; the lane blocks stashed in
 * the lanes' tables (host ids as -2 - h). Adds to *relinked the device
 * ones on the LRU; *units 1 when the checkpoint is. Returns the run kept.
 * bkv__hc_hold_lanes holds the stashed host ids, before any take;
 * bkv__hc_reload_lanes, after lane 0's reloads, makes each a device
 * block with a swap-in copy, indexed. */
uint32_t bkv__hc_fit_lanes(const bkv_pool *pool, const bkv__seq *s, uint32_t a, uint32_t n,
			     const int32_t *tokens, uint32_t *relinked, uint32_t *units);
void bkv__hc_hold_lanes(bkv_pool *pool, const bkv__seq *s, uint32_t a, uint32_t e);
void bkv__hc_reload_lanes(bkv_pool *pool, const bkv__seq *s, uint32_t a, uint32_t e);
#endif /* BKV_POOL_HC_H */
