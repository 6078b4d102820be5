/*
 * evict.c - which cached block the pool gives up: the prefix cache's
 * eviction policy, chosen from bkv_sched_config.evict and put in force on
 * the scheduler's pool for the scheduler's life.
 *
 * LRU (the default) leaves the pool as it is: the least recently released
 * block goes first, deepest first (kv/cache.c). VALUE turns on the KV
 * layer's eviction by value (kv/value.c) with a block's recompute price
 * from the scheduler's cost model: the model's price of a prefill chunk of
 * AUTO_VAL_BLOCKS blocks starting at depth 0 and at depth AUTO_VAL_DEPTH
 * blocks, per block, as the line p0 + p1 x depth (attention over a deeper
 * prefix costs more; a model without that term gives p1 = 0). A model that
 * has no answer leaves p0 = 1 and p1 = 0: eviction by hit history alone.
 *
 * With bkv_sched_config.retention the requests' retention priorities order
 * it too (pool/retain.c): LRU becomes LRU within priority bands (the value
 * records on, every block at the same value, its class its band), VALUE
 * multiplies a block's value by priority / BKV_RETENTION_PRIORITY_DEFAULT.
 *
 * A pool with a host cache (bkv_pool_config.host_cache) is told from which
 * depth an evicted block is worth its copy to the host
 * (bkv__evict_host_cache).
 */
#include "decide/decide.h"

#include <string.h>

#define AUTO_VAL_BLOCKS 64u   /* blocks of the chunk priced per block */
#define AUTO_VAL_DEPTH 1024u  /* the second depth priced, in blocks */

/* The model's price of AUTO_VAL_BLOCKS blocks from depth d, per block. */
static double block_price(const bkv_sched *s, uint32_t d)
{
	bkv_step_shape sh;
	bkv_chunk_shape c;

	c.len = AUTO_VAL_BLOCKS * s->bt;
	c.start = d * s->bt;
	memset(&sh, 0, sizeof(sh));
	sh.kind = s->split ? BKV_CALL_PREFILL : BKV_CALL_MIXED;
	sh.n_chunks = 1;
	sh.chunks = &c;
	return bkv__price(s, &sh) / AUTO_VAL_BLOCKS;
}

/* LRU; with bkv_sched_config.retention, LRU within retention bands
 * (pool/retain.c). */
static int evict_lru(bkv_sched *s, int on)
{
	if (!s->cfg.retention)
		return BKV_OK;
	if (!on) {
		bkv__pool_retain_off(s->pool, BKV__RET_BANDS);
		return BKV_OK;
	}
	return bkv__pool_retain_on(s->pool, BKV__RET_BANDS);
}

static int value_on(bkv_sched *s)
{
	double p0 = block_price(s, 0), pd = block_price(s, AUTO_VAL_DEPTH);

	if (!(p0 > 0.0))
		return bkv__pool_value_on(s->pool, 1.0, 0.0);
	return bkv__pool_value_on(s->pool, p0, pd > p0 ? (pd - p0) / AUTO_VAL_DEPTH : 0.0);
}

/* By value; with retention, the priority a factor of the value. */
static int evict_value(bkv_sched *s, int on)
{
	int rc;

	if (!on) {
		if (s->cfg.retention)
			bkv__pool_retain_off(s->pool, BKV__RET_VALUE);
		bkv__pool_value_off(s->pool);
		return BKV_OK;
	}
	rc = value_on(s);
	if (rc != BKV_OK || !s->cfg.retention)
		return rc;
	rc = bkv__pool_retain_on(s->pool, BKV__RET_VALUE);
	if (rc != BKV_OK)
		bkv__pool_value_off(s->pool);
	return rc;
}

/* The host cache's rule (pool/hcache.c): demote an evicted block only
 * where reloading it (its KV over the host link) costs less than
 * recomputing it (block_price at its depth, the line p0 + p1 x depth):
 * from the least such depth on. Without a KV size or a cost model every
 * block is demoted (the link is assumed the cheaper: it is by tens of
 * times on GPUs). UINT32_MAX: no depth is worth it. */
static uint32_t host_cache_depth(const bkv_sched *s)
{
	double reload = bkv__link_us(s, 1), p0, pd, p1;

	if (!(reload > 0.0) || !s->cfg.cost.step_us)
		return 0;
	p0 = block_price(s, 0);
	pd = block_price(s, AUTO_VAL_DEPTH);
	if (!(p0 > 0.0) || reload < p0)
		return 0;
	p1 = pd > p0 ? (pd - p0) / AUTO_VAL_DEPTH : 0.0;
	if (!(p1 > 0.0) || (reload - p0) / p1 >= (double)(UINT32_MAX - 1))
		return UINT32_MAX;
	return (uint32_t)((reload - p0) / p1) + 1;
}

void bkv__evict_host_cache(bkv_sched *s, int on)
{
	if (bkv__pool_host_cache(s->pool))
		bkv__pool_host_cache_depth(s->pool, on ? host_cache_depth(s) : 0);
}

void bkv__evict_choose(bkv__policy *p, const bkv_sched_config *user)
{
	p->evict = user->evict == BKV_EVICT_VALUE ? evict_value : evict_lru;
}
