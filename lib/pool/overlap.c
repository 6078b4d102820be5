/*
 * overlap.c - the pool's part of overlapped scheduling (sched/overlap.c).
 *
 * With steps outstanding - those in flight on the device, the next planned
 * on top of them - their filled blocks wait in one transaction queue, in
 * fill order: the oldest step's first. When the oldest step completes, its
 * blocks (the queue's first `mark` entries) are indexed and the later
 * steps' stay queued, moved to the queue's front, in a transaction that
 * stays open until they complete in turn. A block filled by the later step can
 * never be a parent of one filled by the older step (a sequence fills its
 * blocks in order), so the older step's entries commit on their own. The
 * older step's share is counted (`mark`) after its stale entries are
 * squeezed out, when the later step's planning begins; while that step
 * plans, none of the older step's blocks is released (the scheduler defers
 * releases while a step is outstanding), so a squeeze the queue makes on its
 * own then removes only the later step's entries and the count stays
 * right.
 *
 * Copies. A step's copy lists stay valid until it completes (the host reads
 * them then). A step in flight may carry host-cache demotions (swap-out
 * copies of blocks the cache evicted); a later step's planning evicts
 * more. So its swap-out list is held apart (so_held, a ring of one list a
 * step in flight: the arrays trade places, nothing is copied) and the later
 * step's demotions start a fresh list; a held list is cleared, its
 * demotions cached, when its step completes, or forgotten when it fails. The device performs the
 * step in flight's copies before the later step's kernels can write an
 * evicted block again (one stream, launch order). Other pending copies (a
 * copy-on-write, a swap-in, a swapped sequence's swap-out) still make the
 * later launch wait.
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

/* Move the queue's live entries of [from, n) to positions j on, in order
 * (an entry whose block was released since it was queued is dropped; the
 * j entries before them stay), and make that the whole queue. Returns its
 * length. */
static uint32_t squeeze(bkv__kv *kv, uint32_t j, uint32_t from, uint32_t n)
{
	uint32_t i;

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
	return squeeze(&pool->kv, 0, 0, pool->kv.txn_n);
}

uint32_t bkv__pool_txn_commit_upto(bkv_pool *pool, uint32_t mark)
{
	bkv__kv *kv = &pool->kv;
	uint32_t n = kv->txn_n, carried;

	BKV_ASSERT(kv->txn_active && mark <= n);
	kv->txn_n = mark; /* the later steps' entries are hidden from the commit */
	bkv__kv_txn_end(kv, 1);
	/* what the commit carried over stays in front of the later steps' */
	carried = kv->txn_n;
	squeeze(kv, carried, mark, n);
	kv->txn_active = 1; /* bkv__kv_txn_begin, keeping the entries */
	return carried;
}

uint32_t bkv__pool_copies_pending(const bkv_pool *pool)
{
	return pool->copies[0].n + pool->copies[1].n + pool->copies[2].n;
}

int bkv__pool_copies_holdable(const bkv_pool *pool)
{
	return !pool->copies[BKV_COPY_DEVICE].n && !pool->copies[BKV_COPY_SWAP_IN].n &&
	       pool->so_n < BKV_OVERLAP_MAX_DEPTH;
}

int bkv__pool_copies_hold(bkv_pool *pool)
{
	bkv__copy_list *l = &pool->copies[BKV_COPY_SWAP_OUT], t, *h;

	BKV_ASSERT(bkv__pool_copies_holdable(pool));
	if (!l->n)
		return BKV_OK;
	h = &pool->so_held[(pool->so_head + pool->so_n) % BKV_OVERLAP_MAX_DEPTH];
	if (h->cap < l->cap) { /* once a list: the lists keep their size */
		bkv_copy *v = bkv__realloc(&pool->alloc, h->v, (size_t)h->cap * sizeof(bkv_copy),
					   (size_t)l->cap * sizeof(bkv_copy));

		if (!v)
			return BKV_ENOMEM;
		h->v = v;
		h->cap = l->cap;
	}
	t = *h;
	*h = *l;
	*l = t;
	l->n = 0;
	pool->so_n++;
	return BKV_OK;
}

void bkv__pool_copies_release_held(bkv_pool *pool, int performed)
{
	uint32_t i;

	while (pool->so_n) {
		bkv__copy_list *l = &pool->so_held[pool->so_head];

		if (!performed)
			bkv__hc_forget_list(pool, l);
		else if (pool->hc_on)
			for (i = 0; i < l->n; i++)
				bkv__hc_swap_out_cleared(pool, l->v[i].src, l->v[i].dst);
		l->n = 0;
		pool->so_head = (pool->so_head + 1) % BKV_OVERLAP_MAX_DEPTH;
		pool->so_n--;
		if (performed)
			break; /* the oldest only */
	}
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

void bkv__pool_seq_commit_to(bkv_pool *pool, uint32_t id, uint32_t len)
{
	const bkv__seq *s = bkv__seq_get(pool, id);

	if (!s || s->state != BKV__SEQ_OPEN)
		return;
	if (pool->n_lanes)
		bkv__lanes_trim_to(pool, s, BKV_MIN(len, s->len));
	if (pool->st_units)
		bkv__state_commit_to(pool, s, len);
}

void bkv__pool_seq_state_shift(bkv_pool *pool, uint32_t id)
{
	const bkv__seq *s = bkv__seq_get(pool, id);

	if (s && pool->st_units && s->state == BKV__SEQ_OPEN)
		bkv__state_advance(pool, s, s->len);
}

void bkv__pool_state_fence(bkv_pool *pool, int on)
{
	pool->st_fenced = on && pool->st_units;
}
