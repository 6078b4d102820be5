/*
 * state_mid.c - a recurrent-state group under overlapped scheduling deeper
 * than one step: the states outstanding steps ended at.
 *
 * Out of place (pool/state.c): each step of a sequence writes its state to
 * a fresh unit. With several steps outstanding - launched at depth D, the
 * newest planned on the ones in flight - a launch promotes the newest
 * step's scratch to live (bkv__state_advance) while the state the oldest
 * outstanding step started from is kept (st_undo). The states in between,
 * each the end of an outstanding step older than the newest, are kept here
 * too, oldest first, with the tokens each covers: the oldest step's commit
 * makes the one at its end the new base of a rollback (the old base goes),
 * and a rollback of later steps truncates back to one of them. A state a
 * commit passes is indexed as a checkpoint when it lies at a multiple of
 * the interval, as a superseded state at commit is (st_pend), then let go.
 *
 * At most BKV_OVERLAP_MAX_DEPTH - 1 states a sequence: one for each step in
 * flight but the newest. They are references like live and undo, counted by
 * the checker (pool/state_check.c). A fork and a swap never meet them: both
 * wait for a launch with nothing outstanding.
 */
#include "pool/pool.h"

/* Only the lists live here; pool/state.c moves the references (commit,
 * truncate, release). */

#define MID_MAX BKV_OVERLAP_MAX_DEPTH

int bkv__state_mid_init(bkv_pool *pool)
{
	const bkv_allocator *a = &pool->alloc;
	const size_t ms = pool->cfg.max_seqs;

	pool->st_mid = bkv__malloc(a, ms * MID_MAX * sizeof(int32_t));
	pool->st_mid_len = bkv__calloc(a, ms * MID_MAX, sizeof(uint32_t));
	pool->st_mid_n = bkv__calloc(a, ms, sizeof(uint32_t));
	return pool->st_mid && pool->st_mid_len && pool->st_mid_n ? BKV_OK : BKV_ENOMEM;
}

void bkv__state_mid_free(bkv_pool *pool)
{
	const bkv_allocator *a = &pool->alloc;
	const size_t ms = pool->cfg.max_seqs;

	bkv__free(a, pool->st_mid, ms * MID_MAX * sizeof(int32_t));
	bkv__free(a, pool->st_mid_len, ms * MID_MAX * sizeof(uint32_t));
	bkv__free(a, pool->st_mid_n, ms * sizeof(uint32_t));
}

uint64_t bkv__state_mid_slot_bytes(void)
{
	return MID_MAX * (sizeof(int32_t) + sizeof(uint32_t)) + sizeof(uint32_t);
}

void bkv__state_mid_push(bkv_pool *pool, uint32_t slot, int32_t u, uint32_t len)
{
	const uint32_t n = pool->st_mid_n[slot]++;

	BKV_ASSERT(n < MID_MAX && (!n || pool->st_mid_len[slot * MID_MAX + n - 1] < len));
	pool->st_mid[slot * MID_MAX + n] = u;
	pool->st_mid_len[slot * MID_MAX + n] = len;
}

int bkv__state_mid_first(bkv_pool *pool, uint32_t slot, uint32_t upto, int32_t *u, uint32_t *len)
{
	int32_t *m = &pool->st_mid[slot * MID_MAX];
	uint32_t *ml = &pool->st_mid_len[slot * MID_MAX], i, n = pool->st_mid_n[slot];

	if (!n || ml[0] > upto)
		return 0;
	*u = m[0];
	*len = ml[0];
	for (i = 1; i < n; i++) {
		m[i - 1] = m[i];
		ml[i - 1] = ml[i];
	}
	pool->st_mid_n[slot] = n - 1;
	return 1;
}

int bkv__state_mid_last(bkv_pool *pool, uint32_t slot, uint32_t above, int32_t *u, uint32_t *len)
{
	const uint32_t n = pool->st_mid_n[slot];

	if (!n || pool->st_mid_len[slot * MID_MAX + n - 1] <= above)
		return 0;
	*u = pool->st_mid[slot * MID_MAX + n - 1];
	*len = pool->st_mid_len[slot * MID_MAX + n - 1];
	pool->st_mid_n[slot] = n - 1;
	return 1;
}

int bkv__state_mid_has(const bkv_pool *pool, uint32_t slot, uint32_t len)
{
	uint32_t k;

	for (k = 0; k < pool->st_mid_n[slot]; k++)
		if (pool->st_mid_len[slot * MID_MAX + k] == len)
			return 1;
	return 0;
}

void bkv__state_mid_count(const bkv_pool *pool, uint32_t slot, uint32_t *sc)
{
	uint32_t k;

	for (k = 0; k < pool->st_mid_n[slot]; k++)
		sc[pool->st_mid[slot * MID_MAX + k]]++;
}

int bkv__state_mid_ordered(const bkv_pool *pool, uint32_t slot)
{
	const uint32_t *ml = &pool->st_mid_len[slot * MID_MAX];
	uint32_t k, n = pool->st_mid_n[slot];

	if (n > MID_MAX)
		return 0;
	for (k = 0; k < n; k++)
		if (pool->st_mid[slot * MID_MAX + k] < 0 || (k && ml[k - 1] >= ml[k]) ||
		    ml[k] >= pool->st_len[slot] ||
		    (pool->st_undo[slot] != BKV__ST_NO_UNDO && ml[k] <= pool->st_undo_len[slot]))
			return 0;
	return 1;
}
