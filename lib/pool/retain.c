/*
 * retain.c - retention from the request: the priorities a request gives
 * token ranges of its prompt (bkv_request.retention), put on the full
 * blocks of its sequence when the scheduler releases it.
 *
 * The KV layer keeps the priority with each indexed block (kv/value.c, on
 * the eviction-by-value records) and orders its evictions by it: with LRU
 * by the priority's band (a class list per band, lowest band's head first,
 * LRU order within one), with eviction by value as a factor of the value.
 * This file turns that on for a pool (the decision layer asks, from
 * bkv_sched_config.retention, decide/evict.c), gives it the scheduler's
 * clock, and walks a sequence's table at release: block i covers tokens
 * [i x bt, (i + 1) x bt) and takes the highest priority of the ranges that
 * overlap it, with its range's expiry (release clock + duration_us). Only
 * full, indexed blocks of group 0's table are given one (with KV groups the
 * other groups' blocks stay at the default); a swapped sequence's table
 * holds host ids and is skipped. The cache key is part of every block's
 * hash, so one tenant's priorities never reach another's blocks.
 *
 * Cost: O(blocks x ranges) per release of a sequence with ranges, at most
 * BKV_RETENTION_MAX_RANGES ranges; nothing without them. No allocation but
 * at create (the expiry clocks, 8 bytes a device block).
 */
#include "pool/pool.h"

int bkv__pool_retain_on(bkv_pool *pool, uint32_t mode)
{
	int rc;

	if (!pool->kv.index)
		return BKV_OK; /* no prefix cache: nothing is ever kept */
	if (mode == BKV__RET_BANDS) {
		rc = bkv__kv_value_on(&pool->kv, &pool->alloc, 1.0, 0.0);
		if (rc != BKV_OK)
			return rc;
	}
	rc = bkv__kv_retain_on(&pool->kv, &pool->alloc, mode);
	if (rc != BKV_OK && mode == BKV__RET_BANDS)
		bkv__kv_value_off(&pool->kv, &pool->alloc);
	return rc;
}

void bkv__pool_retain_off(bkv_pool *pool, uint32_t mode)
{
	if (!pool->kv.index || !pool->kv.val_exp)
		return;
	bkv__kv_retain_off(&pool->kv, &pool->alloc);
	if (mode == BKV__RET_BANDS)
		bkv__kv_value_off(&pool->kv, &pool->alloc);
}

void bkv__pool_retain_now(bkv_pool *pool, uint64_t now_us)
{
	pool->kv.val_now = now_us;
}

/* The highest priority of the ranges overlapping [lo, hi), and its expiry;
 * 0 when none does. */
static uint32_t range_prio(const bkv_retention_range *r, uint32_t n, uint32_t lo, uint32_t hi,
			   uint64_t now, uint64_t *exp)
{
	uint32_t i, best = 0;

	for (i = 0; i < n; i++) {
		uint64_t e;

		if (r[i].token_start >= hi || r[i].token_end <= lo)
			continue;
		e = r[i].duration_us && r[i].duration_us < UINT64_MAX - now
			    ? now + r[i].duration_us
			    : UINT64_MAX;
		if (r[i].priority + 1u > best || (r[i].priority + 1u == best && e > *exp)) {
			best = r[i].priority + 1u;
			*exp = e;
		}
	}
	return best;
}

void bkv__pool_seq_retain(bkv_pool *pool, uint32_t seq, const bkv_retention_range *r, uint32_t n,
			  uint64_t now_us)
{
	bkv__seq *s = bkv__seq_get(pool, seq);
	uint32_t i, full;

	if (!s || !n || !pool->kv.val_ret || s->state != BKV__SEQ_OPEN)
		return;
	pool->kv.val_now = now_us;
	full = s->len >> pool->kv.bt_shift;
	for (i = 0; i < full && i < s->n_blocks; i++) {
		uint64_t exp = UINT64_MAX;
		uint32_t p = range_prio(r, n, i << pool->kv.bt_shift, (i + 1) << pool->kv.bt_shift,
					now_us, &exp);

		if (p && s->table[i] >= 0)
			bkv__kv_retain(&pool->kv, s->table[i], p - 1u, exp);
	}
}
