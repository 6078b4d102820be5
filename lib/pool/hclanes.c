/*
 * hclanes.c - host-cache hits in a pool with KV groups: group 0's host run
 * shortened until every group holds what a sequence ending there reads
 * (each group's blocks in the host index, or at the run's first block on
 * the device) and, with a STATE group, a device checkpoint ends it; then
 * the groups' host blocks held and reloaded beside group 0's. The host
 * cache itself is pool/hcache.c, the groups pool/lanes.c; this file sits
 * above both. docs/design.md, "The host cache" (KV groups).
 */
#include "pool/hc.h"

/* Lane l's block i of a host-cache hit run from lane 0's block a on (lane
 * 0's blocks [a, i) are host ids stashed in s->table): a device block id
 * (only at i == a, whose parent is on the device), a host id h encoded as
 * -2 - h, or -1. */
static int32_t lane_host(const bkv_pool *pool, uint32_t l, const bkv__seq *s, uint32_t a,
			 uint32_t i, const int32_t *tokens)
{
	uint64_t ph = BKV__HASH_ROOT;
	int32_t c;

	if (i == a && (c = bkv__lane_lookup(pool, l, s, i, tokens)) >= 0)
		return c;
	if (i > a)
		ph = pool->hc_hash[s->table[i - 1]];
	else if (i)
		ph = pool->kv.blk[s->table[i - 1]].hash;
	c = bkv__hc_lookup(pool, ph, s->key ^ pool->lanes[l].salt, tokens);
	return c >= 0 ? -2 - c : -1;
}

uint32_t bkv__hc_fit_lanes(const bkv_pool *pool, const bkv__seq *s, uint32_t a, uint32_t n,
			     const int32_t *tokens, uint32_t *relinked, uint32_t *units)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs), bt = pool->kv.bt;
	uint32_t e = a + n, l, i, changed = 1;

	*units = 0;
	while (changed && e > a) {
		changed = 0;
		/* a hit ends at a checkpoint: the device keeps them, under the
		 * chain hash of group 0's block before it */
		if (pool->st_units && (!pool->st_interval || !bkv__state_hit_ok(pool, s)))
			return 0;
		while (pool->st_units && e > a &&
		       (((uint64_t)e * bt) % pool->st_interval ||
			bkv__state_find(pool, pool->hc_hash[s->table[e - 1]]) < 0))
			e--;
		for (l = 0; l < pool->n_lanes && !changed && e > a; l++) {
			const bkv__glane *ln = &pool->lanes[l];
			uint32_t first = BKV_MAX(bkv__lane_first(pool, ln, (uint64_t)e * bt), a);

			for (i = e; i-- > first;) {
				int32_t c = lane_host(pool, l, s, a, i, tokens + (size_t)(i - a) * bt);

				if (c == -1) {
					e = i; /* a hit may end before block i */
					changed = 1;
					break;
				}
				ln->seqs[slot].table[i] = c;
			}
		}
	}
	if (e == a)
		return 0;
	/* e is final: count the stashed device blocks on the LRU */
	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		int32_t c;

		if (bkv__lane_first(pool, ln, (uint64_t)e * bt) <= a &&
		    (c = ln->seqs[slot].table[a]) >= 0)
			*relinked += BLOCK_IS_CACHED(&pool->kv.blk[c]);
	}
	if (pool->st_units)
		*units = pool->st_ref[bkv__state_find(pool, pool->hc_hash[s->table[e - 1]])] == 0;
	return e - a;
}

void bkv__hc_hold_lanes(bkv_pool *pool, const bkv__seq *s, uint32_t a, uint32_t e)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l, i;

	for (l = 0; l < pool->n_lanes; l++)
		for (i = a; i < e; i++)
			if (pool->lanes[l].seqs[slot].table[i] <= -2)
				bkv__hc_hold(pool, -2 - pool->lanes[l].seqs[slot].table[i]);
}

void bkv__hc_reload_lanes(bkv_pool *pool, const bkv__seq *s, uint32_t a, uint32_t e)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l, i;

	for (l = 0; l < pool->n_lanes; l++) {
		const bkv__glane *ln = &pool->lanes[l];
		int32_t *t = ln->seqs[slot].table;

		for (i = a; i < e; i++) {
			int32_t h = -2 - t[i], parent = i ? s->table[i - 1] : -1;

			if (t[i] > -2)
				continue;
			t[i] = bkv__hc_reload(pool, h, parent);
			/* indexed under the hash the host lookup verified, as
			 * lane 0's reloads */
			if (pool->kv.txn_active ||
			    (parent >= 0 && !BLOCK_IS_INDEXED(&pool->kv.blk[parent])))
				bkv__lane_block_filled(pool, l, slot, i);
			else
				(void)bkv__cache_add_hashed(&pool->kv, t[i], s->key ^ ln->salt,
							    pool->hc_hash[h]);
		}
	}
}
