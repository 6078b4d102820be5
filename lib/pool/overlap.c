/*
 * overlap.c - the pool's part of overlapped scheduling (sched/overlap.c).
 *
 * With two steps outstanding - one in flight on the device, the next planned
 * on top of it - both steps' filled blocks wait in one transaction queue, in
 * fill order: the older step's first. When the older step completes, its
 * blocks (the queue's first `mark` entries) are indexed and the later step's
 * stay queued, moved to the queue's front, in a transaction that stays open
 * until that step completes in turn. A block filled by the later step can
 * never be a parent of one filled by the older step (a sequence fills its
 * blocks in order), so the older step's entries commit on their own. The
 * older step's share is counted (`mark`) after its stale entries are
 * squeezed out, when the later step's planning begins; while that step
 * plans, none of the older step's blocks is released (the scheduler defers
 * releases while a step is outstanding), so a squeeze the queue makes on its
 * own then removes only the later step's entries and the count stays
 * right.
 *
 * A decode row planned before the token it computes is sampled appends a
 * placeholder; the token store gets the real token when the older step
 * completes, before the block holding it can be hashed (at the later step's
 * commit), so a prefix hit never compares against a placeholder. In a pool
 * with KV groups every lane's block holding the position gets it too (each
 * lane's blocks carry their own tokens, pool/lanes.c).
 *
 * KV groups. The lanes' filled blocks wait in the same queue (noted with
 * their lane), so the older step's share commits as group 0's does. The
 * lanes' transaction bookkeeping (the sequences it touched, trimmed at a
 * whole commit, pool/lanes.c) stays open with the later step: a split
 * commit trims nothing itself. The scheduler trims each sequence the older
 * step appended to up to its committed length (bkv__pool_seq_trim_to): a
 * window or chunk then releases only blocks that no outstanding step reads
 * and that a rollback of the outstanding steps does not need back.
 */
#include "pool/overlap.h"

uint32_t bkv__pool_txn_queued(const bkv_pool *pool)
{
	return pool->kv.txn_n;
}

/* Move the queue's live entries of [from, n) to its front, in order (an
 * entry whose block was released since it was queued is dropped), and
 * make them the whole queue. Returns how many are left. */
static uint32_t squeeze(bkv__kv *kv, uint32_t from, uint32_t n)
{
	uint32_t i, j = 0;

	for (i = from; i < n; i++) {
		int32_t b = kv->txn_pending[i];
		bkv__block *k = &kv->blk[b];

		if (!(k->flags & BKV__BLOCK_TXN) || k->prev != (int32_t)i)
			continue; /* released since it was queued */
		kv->txn_pending[j] = b;
		kv->txn_owner[j] = kv->txn_owner[i];
		k->prev = (int32_t)j++;
	}
	kv->txn_n = j;
	return j;
}

uint32_t bkv__pool_txn_compact(bkv_pool *pool)
{
	return squeeze(&pool->kv, 0, pool->kv.txn_n);
}

uint32_t bkv__pool_txn_commit_upto(bkv_pool *pool, uint32_t mark)
{
	bkv__kv *kv = &pool->kv;
	uint32_t n = kv->txn_n, j;

	BKV_ASSERT(kv->txn_active && mark <= n && !pool->st_units);
	kv->txn_n = mark; /* the later step's entries are hidden from the commit */
	bkv__kv_txn_end(kv, 1);
	BKV_ASSERT(kv->txn_n == 0);
	j = squeeze(kv, mark, n);
	kv->txn_active = 1; /* bkv__kv_txn_begin, keeping the entries */
	return j;
}

uint32_t bkv__pool_copies_pending(const bkv_pool *pool)
{
	return pool->copies[0].n + pool->copies[1].n + pool->copies[2].n;
}

void bkv__pool_seq_set_token(bkv_pool *pool, uint32_t id, uint32_t pos, int32_t token)
{
	bkv__seq *s = bkv__seq_get(pool, id);
	int32_t b;
	uint32_t l;

	if (!s || s->state != BKV__SEQ_OPEN || pos >= s->len)
		return;
	b = s->table[pos >> pool->kv.bt_shift];
	BKV_ASSERT(!(pool->kv.blk[b].flags & BKV__BLOCK_INDEXED));
	bkv__tok(&pool->kv, b)[pos & (pool->kv.bt - 1)] = token;
	for (l = 0; l < pool->n_lanes; l++) { /* each lane's block holding pos */
		b = pool->lanes[l].seqs[s - pool->seqs].table[pos >> pool->kv.bt_shift];
		if (b < 0)
			continue;
		BKV_ASSERT(!(pool->kv.blk[b].flags & BKV__BLOCK_INDEXED));
		bkv__tok(&pool->kv, b)[pos & (pool->kv.bt - 1)] = token;
	}
}

void bkv__pool_seq_trim_to(bkv_pool *pool, uint32_t id, uint32_t len)
{
	const bkv__seq *s = bkv__seq_get(pool, id);

	if (s && s->state == BKV__SEQ_OPEN && pool->n_lanes)
		bkv__lanes_trim_to(pool, s, BKV_MIN(len, s->len));
}
