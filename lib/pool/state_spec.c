/*
 * state_spec.c - a recurrent-state group's views: the units a call reads
 * and writes, and for speculative decoding a state unit after each token of
 * a speculated row (docs/design.md, "Speculative decoding", "A STATE
 * group: per-token states").
 *
 * A speculated row of 1 + k tokens computes k + 1 states, one after each
 * token: the k after its first k tokens go to units of a chain (st_spec,
 * linked by st_next, marked BKV__ST_SPEC, unreferenced), the one after its
 * last token to its scratch unit as for any row (pool/state.c). The commit
 * truncates the sequence to its accepted tokens: the chain's unit at that
 * length becomes the live state and the rest go free (bkv__state_truncate,
 * pool/state.c); a rollback truncates to the length before the step, restoring the
 * state the step started from and freeing the chain. The units come from
 * the free list and the checkpoints' LRU, never from a sequence; with
 * state_share from the free list, which idle chunks of free frames join
 * while attention keeps the frames it asked for (attention counts the
 * checkpoints as its room, and the drafts' own blocks may take them:
 * bkv__state_share_prepare). Nothing here allocates, and every walk is
 * over one chain (at most k units).
 */
#include "pool/pool.h"

uint32_t bkv__pool_state_spec_room(bkv_pool *pool, uint32_t k, uint64_t keep)
{
	if (!pool->st_units)
		return 0;
	if (!pool->st_share)
		return pool->st_nr_free + pool->st_nr_cached;
	while (pool->st_nr_free < k && pool->kv.nr_free >= keep + pool->st_frames) {
		const int32_t c = bkv__ck_pick(&pool->kv, 1);

		if (c < 0)
			break;
		bkv__state_unit_gain(pool, c);
	}
	return pool->st_nr_free;
}

void bkv__pool_state_spec_take(bkv_pool *pool, uint32_t seq, uint32_t k)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	int32_t *link = &pool->st_spec[slot];
	uint32_t j;

	BKV_ASSERT(s && pool->st_units && k && k < s->len && pool->st_spec[slot] < 0 && pool->st_scratch[slot] >= 0 &&
		   pool->st_nr_free + (pool->st_share ? 0 : pool->st_nr_cached) >= k);
	pool->st_spec_base[slot] = s->len - k;
	for (j = 0; j < k; j++) {
		const int32_t u = bkv__state_unit_take(pool);

		pool->st_flags[u] = BKV__ST_SPEC;
		*link = u;
		link = &pool->st_next[u];
	}
	*link = -1;
}

void bkv__pool_state_spec_frames(const bkv_pool *pool, uint32_t seq, int32_t *f, uint32_t n)
{
	const bkv__seq *s = bkv__seq_get(pool, seq);
	const uint32_t slot = (uint32_t)(s - pool->seqs), k = pool->st_frames;
	int32_t in, u = pool->st_spec[slot];
	uint32_t j;

	BKV_ASSERT(s && pool->st_units);
	for (j = 0; j + 1 < n; j++, u = u >= 0 ? pool->st_next[u] : -1)
		f[j] = u >= 0 ? (int32_t)(pool->st_first + (uint32_t)u * k) : -1;
	bkv__state_frames(pool, slot, &in, &f[n - 1]);
}

/* ---- views ------------------------------------------------------------------ */

/* The first frames of seq's live unit (-1: zero state, at position 0) and
 * scratch unit (-1: none). */
void bkv__state_frames(const bkv_pool *pool, uint32_t slot, int32_t *in, int32_t *out)
{
	const int32_t l = pool->st_live[slot], s = pool->st_scratch[slot];
	const uint32_t k = pool->st_frames;

	*in = l >= 0 && pool->st_len[slot] ? (int32_t)(pool->st_first + (uint32_t)l * k) : -1;
	*out = s >= 0 ? (int32_t)(pool->st_first + (uint32_t)s * k) : -1;
}

int bkv_seq_state_frames(const bkv_pool *pool, uint32_t seq, int32_t *in, int32_t *out)
{
	const bkv__seq *s;

	if (!pool || !in || !out || !pool->st_units)
		return BKV_EINVAL;
	s = bkv__seq_get(pool, seq);
	if (!s)
		return BKV_ENOENT;
	bkv__state_frames(pool, (uint32_t)(s - pool->seqs), in, out);
	return BKV_OK;
}
