/*
 * state_check.c - the invariants of a recurrent-state group (pool/state.c),
 * for bkv_pool_check: every unit's references against the sequences that
 * name it (live, undo, pending checkpoint; scratch and speculated states
 * owned once, unreferenced), the free list, the checkpoints' LRU and map,
 * and with state_share the chunks lent. With overlapped scheduling a
 * sequence holds up to depth + 2 units at once - the state the oldest
 * outstanding step started from (st_undo), the ends of the outstanding
 * steps but the newest (pool/state_mid.c), the one the newest step in
 * flight writes and the next step reads (live), and the one the next step
 * writes (scratch) - and each is counted here like any other.
 */
#include "pool/pool.h"

#include <string.h>

#define ST_INDEXED BKV__ST_INDEXED
#define ST_SCRATCH BKV__ST_SCRATCH

/* ---- the checker ------------------------------------------------------------ */

int bkv__state_check(const bkv_pool *pool, uint32_t *sc)
{
	const uint32_t ms = pool->cfg.max_seqs, nu = pool->st_units;
	uint32_t i, n, cached = 0, free = 0, indexed = 0, held = 0;
	int32_t u;

	memset(sc, 0, (size_t)nu * sizeof *sc);
	for (i = 0; i < ms; i++) {
		const bkv__seq *s = &pool->seqs[i];

		if (s->state == BKV__SEQ_FREE) {
			if (pool->st_live[i] >= 0 || pool->st_scratch[i] >= 0 || pool->st_len[i] ||
			    pool->st_spec[i] >= 0 || pool->st_mid_n[i])
				return CHECK_SEQS;
			continue;
		}
		if (pool->st_len[i] > s->len ||
		    (pool->st_pend[i] >= 0 && pool->st_pend_len[i] >= pool->st_len[i]))
			return CHECK_SEQS;
		/* a state that lags its tokens has the unit the device writes
		 * them to (with overlap, the later step's second unit), and a
		 * kept undo is older than the live state */
		if ((s->state == BKV__SEQ_OPEN && pool->st_len[i] < s->len &&
		     pool->st_scratch[i] < 0) ||
		    (pool->st_undo[i] != BKV__ST_NO_UNDO && pool->st_undo_len[i] >= pool->st_len[i]))
			return CHECK_SEQS;
		if (s->state == BKV__SEQ_OPEN ? (pool->st_len[i] == 0) != (pool->st_live[i] < 0)
					      : pool->st_live[i] >= 0 || pool->st_scratch[i] >= 0)
			return CHECK_SEQS;
		if (pool->st_live[i] >= 0)
			sc[pool->st_live[i]]++;
		if (pool->st_undo[i] >= 0)
			sc[pool->st_undo[i]]++;
		if (!bkv__state_mid_ordered(pool, i))
			return CHECK_SEQS;
		bkv__state_mid_count(pool, i, sc);
		if (pool->st_pend[i] >= 0)
			sc[pool->st_pend[i]]++;
		if (pool->st_scratch[i] >= 0) {
			if (!(pool->st_flags[pool->st_scratch[i]] & ST_SCRATCH))
				return CHECK_SEQS;
			sc[pool->st_scratch[i]] += 1u << 16;
		}
		for (n = 0, u = pool->st_spec[i]; u >= 0; u = pool->st_next[u], n++) {
			if (n >= nu || pool->st_flags[u] != BKV__ST_SPEC || !pool->kv.txn_active)
				return CHECK_SEQS;
			sc[u] += 1u << 16;
		}
	}
	for (u = 0; (uint32_t)u < nu; u++) {
		const uint8_t f = pool->st_flags[u];

		sc[u] += pool->st_xfer[u]; /* a KV connector's saves */
		if (pool->st_share && !pool->kv.ck_lent[u]) { /* attention's chunk */
			if (f || pool->st_ref[u] || sc[u])
				return CHECK_CHUNKS;
			continue;
		}
		held++;
		if ((sc[u] & 0xFFFF) != pool->st_ref[u])
			return CHECK_REFS;
		if ((f & (ST_SCRATCH | BKV__ST_SPEC)) != 0) {
			if ((sc[u] >> 16) != 1 || pool->st_ref[u] || (f & ST_INDEXED))
				return CHECK_SEQS;
			continue;
		}
		if (sc[u] >> 16)
			return CHECK_SEQS;
		indexed += (f & ST_INDEXED) != 0;
		if ((f & ST_INDEXED) && bkv__state_find(pool, pool->st_hash[u] ^ pool->st_salt) != u)
			return CHECK_INDEX;
		cached += (f & ST_INDEXED) && pool->st_ref[u] == 0;
		free += !f && pool->st_ref[u] == 0;
	}
	for (n = 0, u = pool->st_lru_head; u >= 0; u = pool->st_next[u], n++)
		if (n >= nu || pool->st_ref[u] || !(pool->st_flags[u] & ST_INDEXED))
			return CHECK_LRU;
	if (n != cached || n != pool->st_nr_cached)
		return CHECK_LRU;
	for (n = 0, u = pool->st_free_head; u >= 0; u = pool->st_next[u], n++)
		if (n >= nu || pool->st_flags[u] || pool->st_ref[u] ||
		    (pool->st_share && !pool->kv.ck_lent[u]))
			return CHECK_FREE_LIST;
	if (n != free || n != pool->st_nr_free)
		return CHECK_FREE_LIST;
	if (held != pool->st_held || held < (pool->st_share ? pool->st_floor : nu) ||
	    (pool->st_share && held * pool->st_frames != pool->kv.nr_lent))
		return CHECK_CHUNKS;
	for (i = 0, n = 0; i <= pool->st_map_mask; i++)
		n += pool->st_map[i] >= 0;
	return n == indexed && n == pool->st_nr_indexed ? CHECK_OK : CHECK_INDEX;
}

/* The host blocks swapped states hold, counted into sc (the host tier's
 * check). */
void bkv__state_check_host(const bkv_pool *pool, uint32_t *sc, uint64_t *host_refs)
{
	uint32_t i, j;

	for (i = 0; i < pool->cfg.max_seqs; i++) {
		if (pool->seqs[i].state != BKV__SEQ_SWAPPED || !pool->st_len[i])
			continue;
		for (j = 0; j < pool->st_frames; j++) {
			if (sc)
				sc[pool->st_host[(size_t)i * pool->st_frames + j]]++;
			else
				(*host_refs)++;
		}
	}
}
