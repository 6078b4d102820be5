/*
 * pool_ops.h - the random pool workload the KV-event tests replay: one call
 * per operation over eight sequence slots (open with a key, append few
 * distinct tokens so prefixes are shared, close, drop, truncate or fork,
 * swap out or in with every copy list cleared, a cache reset, step
 * transactions begun, committed or aborted). Header-only, no Criterion:
 * tests/test_events.c and the plain program tests/kvevents_dump.c both use
 * it. Randomness is rand(); the caller seeds it.
 */
#ifndef BKV_TEST_POOL_OPS_H
#define BKV_TEST_POOL_OPS_H

#include "internal.h"

#include <stdlib.h>

/* One operation on p. seqs[8] are the slots (0 = empty), *txn whether a step
 * transaction is open (updated), keys[n_keys] the keys a new sequence is
 * opened with. Returns 1 when the operation only opened a sequence (the
 * callers skip their per-operation checks then), else 0. */
static inline int pool_random_op(bkv_pool *p, uint32_t seqs[8], int *txn, const uint64_t *keys,
				 uint32_t n_keys)
{
	uint32_t k = (uint32_t)rand() % 8, len, i;
	int what = rand() % 12;
	int32_t t[16];

	if (what < 2 && !*txn) {
		bkv__pool_txn_begin(p);
		*txn = 1;
	} else if (what < 3 && *txn) {
		if (rand() % 2)
			bkv__pool_txn_commit(p);
		else
			bkv__pool_txn_abort(p);
		*txn = 0;
	}
	if (!seqs[k]) {
		bkv_seq_open_keyed(p, keys[(uint32_t)rand() % n_keys], &seqs[k]);
		return 1;
	}
	switch (what) {
	case 3: case 4: case 5: case 6:
		len = 1 + (uint32_t)rand() % 16;
		/* few distinct contents, so prefixes are shared */
		for (i = 0; i < len; i++)
			t[i] = (int32_t)(rand() % 3);
		bkv_seq_append(p, seqs[k], t, len, NULL);
		break;
	case 7:
		bkv_seq_close(p, seqs[k]);
		seqs[k] = 0;
		break;
	case 8:
		bkv_seq_drop(p, seqs[k]);
		seqs[k] = 0;
		break;
	case 9: {
		bkv_seq_info info;
		uint32_t c = (k + 1) % 8;

		if (rand() % 2 && bkv_seq_info_get(p, seqs[k], &info) == BKV_OK && info.len)
			bkv_seq_truncate(p, seqs[k], (uint32_t)rand() % info.len);
		else if (!seqs[c])
			bkv_seq_fork(p, seqs[k], &seqs[c]);
		break;
	}
	case 10:
		if (!*txn && bkv_seq_swap_out(p, seqs[k]) != BKV_OK)
			bkv_seq_swap_in(p, seqs[k]);
		bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
		bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
		bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
		break;
	default:
		if (!*txn && rand() % 8 == 0)
			bkv_pool_reset_cache(p);
		break;
	}
	return 0;
}

#endif /* BKV_TEST_POOL_OPS_H */
