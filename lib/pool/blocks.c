/*
 * blocks.c - what the pool's files do to one block or one table alike:
 * growing a block-id table, a block's copy-on-write, a block's swap-in.
 *
 * Group 0's tables (pool/seq.c, pool/swap.c) and the other KV groups'
 * (pool/lanes.c) share these; they call nothing in the pool layer, so the
 * files that use them need not call each other.
 */
#include "pool/pool.h"

#include <string.h>

int bkv__ids_grow(bkv_pool *pool, int32_t **table, uint32_t *cap_io, uint32_t n, int none)
{
	uint32_t cap, i;
	int32_t *t;

	cap = *cap_io ? *cap_io : 4;
	while (cap < n)
		cap = cap > UINT32_MAX / 2 ? n : cap * 2;
	if (cap > pool->kv.nb && n <= pool->kv.nb)
		cap = pool->kv.nb;
	if (cap > UINT32_MAX - 3)
		return BKV_ENOMEM;
	cap = (cap + 3) & ~3u; /* a multiple of 4 (bkv__seq.cap) */
	t = bkv__realloc(&pool->alloc, *table, (size_t)*cap_io * sizeof(int32_t),
			 (size_t)cap * sizeof(int32_t));
	if (!t)
		return BKV_ENOMEM;
	for (i = *cap_io; none && i < cap; i++)
		t[i] = -1;
	*table = t;
	*cap_io = cap;
	return 0;
}

int32_t bkv__cow_block(bkv_pool *pool, int32_t b, int32_t parent, uint32_t off)
{
	int32_t nb = bkv__block_take(&pool->kv, parent);

	memcpy(bkv__tok(&pool->kv, nb), bkv__tok(&pool->kv, b), (size_t)off * sizeof(int32_t));
	pool->kv.blk[nb].fill = off;
	pool->kv.tokens += off;
	bkv__copy_push(pool, BKV_COPY_DEVICE, b, nb);
	pool->kv.blk[b].flags |= BKV__BLOCK_PEND_DEV | BKV__BLOCK_COPY_SRC;
	pool->kv.blk[nb].flags |= BKV__BLOCK_PEND_DEV;
	pool->cow_copies++;
	bkv__block_put(&pool->kv, b, 0);
	return nb;
}

int32_t bkv__swap_in_block(bkv_pool *pool, int32_t hb, int32_t parent, uint32_t w)
{
	const uint32_t bt = pool->kv.bt;
	int32_t d = bkv__block_take(&pool->kv, parent);

	memcpy(bkv__tok(&pool->kv, d), pool->host_tok + (size_t)hb * bt,
	       (size_t)w * sizeof(int32_t));
	pool->kv.blk[d].fill = w;
	pool->kv.blk[d].flags |= BKV__BLOCK_PEND_SWAPIN;
	pool->kv.tokens += w;
	bkv__copy_push(pool, BKV_COPY_SWAP_IN, hb, d);
	pool->host_state[hb] = BKV__HOST_PENDING;
	pool->host_pending++;
	return d;
}
