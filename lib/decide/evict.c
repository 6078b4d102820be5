/*
 * evict.c - which cached block the pool gives up: the prefix cache's
 * eviction policy, chosen from bkv_sched_config.evict and put in force on
 * the scheduler's pool for the scheduler's life.
 *
 * LRU leaves the pool as it is: the least recently released
 * block goes first, deepest first (kv/cache.c). VALUE turns on the KV
 * layer's eviction by value (kv/value.c) with a block's recompute price
 * from the scheduler's cost model: the model's price of a prefill chunk of
 * AUTO_VAL_BLOCKS blocks starting at depth 0 and at depth AUTO_VAL_DEPTH
 * blocks, per block, as the line p0 + p1 x depth (attention over a deeper
 * prefix costs more; a model without that term gives p1 = 0). A model that
 * has no answer leaves p0 = 1 and p1 = 0: eviction by hit history alone.
 * The KV layer orders by GreedyDual (a price buys a block time) and, with
 * window or chunked groups, as LRU (kv/value.c).
 *
 * SEGMENTED (bkv_sched_config_init's default) turns on the KV layer's
 * segmented LRU (kv/value.c): probation and protected lists, no prices.
 *
 * With bkv_sched_config.retention the requests' retention priorities order
 * it too (pool/retain.c): LRU becomes LRU within priority bands (the value
 * records on, every block at the same value, its class its band), VALUE
 * multiplies a block's value by priority / BKV_RETENTION_PRIORITY_DEFAULT.
 *
 * A pool with a host cache (bkv_pool_config.host_cache) gets the same
 * prices and the link's, to weigh each evicted block's copy to the host
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

/* A block's recompute price as the line p0 + p1 x depth (blocks) from the
 * prices at depth 0 and AUTO_VAL_DEPTH (p1 0 when the deeper one is not
 * dearer). *p0 is 0 when the model has no answer. */
static void price_line(const bkv_sched *s, double *p0, double *p1)
{
	double pd;

	*p0 = block_price(s, 0);
	pd = block_price(s, AUTO_VAL_DEPTH);
	*p1 = pd > *p0 ? (pd - *p0) / AUTO_VAL_DEPTH : 0.0;
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
	double p0, p1;

	price_line(s, &p0, &p1);
	if (!(p0 > 0.0))
		return bkv__pool_value_on(s->pool, 1.0, 0.0);
	return bkv__pool_value_on(s->pool, p0, p1);
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

/* The host cache's prices (pool/hcache.c): a block's recompute price at
 * depth d as the line p0 + p1 x d (block_price, as eviction by value), a
 * reload's link time, and a demotion's (0 when the host overlaps copies
 * with its kernels: bkv_sched_config.copy_overlap). Without a KV size or a
 * cost model the pool gets none and demotes every evicted block (the link
 * is assumed the cheaper: on GPUs it is by several times). */
void bkv__evict_host_cache(bkv_sched *s, int on)
{
	double link = bkv__link_us(s, 1), p0, p1;

	if (!bkv__pool_host_cache(s->pool))
		return;
	if (!on || !(link > 0.0) || !s->cfg.cost.step_us) {
		bkv__pool_host_cache_prices(s->pool, 0, 0.0, 0.0, 0.0, 0.0);
		return;
	}
	price_line(s, &p0, &p1);
	bkv__pool_host_cache_prices(s->pool, p0 > 0.0, p0, p1, link,
				    s->cfg.copy_overlap ? 0.0 : link);
}

/* The segmented LRU (kv/value.c); with retention, LRU within bands. */
static int evict_segmented(bkv_sched *s, int on)
{
	if (s->cfg.retention)
		return evict_lru(s, on);
	if (!on) {
		bkv__pool_seg_off(s->pool);
		return BKV_OK;
	}
	return bkv__pool_seg_on(s->pool);
}

void bkv__evict_choose(bkv__policy *p, const bkv_sched_config *user)
{
	switch (user->evict) {
	case BKV_EVICT_VALUE:
		p->evict = evict_value;
		break;
	case BKV_EVICT_SEGMENTED:
		p->evict = evict_segmented;
		break;
	default:
		p->evict = evict_lru;
	}
}
