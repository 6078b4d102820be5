/*
 * pin.c - prefix pins: a system prompt kept in the prefix cache until its
 * owner lets it go (bkv_pool_pin_prefix, bkv_pool_unpin).
 *
 * A pin is a sequence of the pool that holds the prefix's cached blocks and
 * nothing else: it took them as prefix hits (bkv__seq_take_hits), so each
 * holds one more reference and is off the LRU, out of any eviction
 * policy's reach, while every request with the same cache key still hits
 * and shares them. Nothing is allocated or computed; the blocks a pin takes
 * are exactly the ones a lookup finds, counted first by a lookup that
 * changes nothing, so a refused pin (past the pool's pin share, no slot)
 * leaves the cache's order as it was. Unpinning closes the holder: its
 * blocks go back to the LRU's tail by close's rule. A pin's id names no
 * sequence: bkv__seq_get, through which every sequence call finds its
 * sequence, refuses the holder, and only unpin finds it (bkv__slot_get).
 *
 * Slots: a pin takes a free slot, never one of those a scheduler keeps
 * for its admitted requests' forks (seq_reserved, which the scheduler sets
 * each step). Admission counts the slots pins hold, as any open sequence,
 * so a request admitted before or after a pin can always fork; one whose
 * branches need the slots pins hold waits (and, with nothing else
 * running, ends as unadmittable by the progress rule).
 *
 * The share bound is over the holders' table entries (pool->pin_blocks): a
 * block two pins hold counts twice, which can only refuse early. The
 * cache key is part of every block's hash, so a pin under one tenant's
 * salt never holds, or shields, another's blocks. Pools with KV groups are
 * refused for now (a hit there is every group's block: the share would
 * have to count each).
 *
 * Checker: the holders are open sequences (their tables are checked as
 * any), their count is nr_pins and their entries pin_blocks (pool/check.c);
 * bkv_sched_check counts them among the pool's sequences.
 */
#include "pool/pool.h"

int bkv_pool_pin_prefix(bkv_pool *pool, uint64_t key, const int32_t *tokens, uint32_t n,
			uint32_t *pin, uint32_t *pinned)
{
	bkv__kv *kv;
	bkv__seq *s;
	uint32_t max, hits, relinked, id;
	uint64_t share;
	int h;

	if (!pool || !tokens || !pin || n == 0)
		return BKV_EINVAL;
	kv = &pool->kv;
	if (!kv->index || pool->grouped || kv->txn_active)
		return BKV_ESTATE;
	max = BKV_MIN(n >> kv->bt_shift, kv->nb);
	hits = max ? bkv__cache_lookup_run(kv, BKV__HASH_ROOT, -1, key, tokens, max,
					   (int32_t *)pool->scratch, &relinked)
		   : 0;
	if (hits == 0)
		return BKV_ENOENT;
	share = (uint64_t)kv->nb * pool->cfg.pin_permille / 1000u;
	if (pool->pin_blocks + hits > share)
		return BKV_ENOSPC;
	s = bkv__slot_peek(pool);
	if (!s || pool->nr_seqs + pool->seq_reserved >= pool->cfg.max_seqs)
		return BKV_EAGAIN; /* no slot, or only slots kept for forks */
	if (bkv__table_reserve(pool, s, hits))
		return BKV_ENOMEM;
	bkv__slot_open(pool, s, key);
	id = bkv__seq_id(pool, s);
	h = bkv__seq_take_hits(pool, id, tokens, hits << kv->bt_shift);
	BKV_ASSERT(h == (int)(hits << kv->bt_shift) && s->n_blocks == hits);
	(void)h;
	s->pin = 1;
	pool->nr_pins++;
	pool->pin_blocks += s->n_blocks;
	*pin = id;
	if (pinned)
		*pinned = s->len;
	return BKV_OK;
}

int bkv_pool_unpin(bkv_pool *pool, uint32_t pin)
{
	bkv__seq *s;

	if (!pool)
		return BKV_EINVAL;
	s = bkv__slot_get(pool, pin);
	if (!s || !s->pin)
		return BKV_ENOENT;
	s->pin = 0;
	pool->nr_pins--;
	pool->pin_blocks -= s->n_blocks;
	return bkv_seq_close(pool, pin);
}
