/*
 * test_pool_txn.c - step transactions: blocks filled inside a transaction are
 * indexed only at commit, forgotten at abort, and copy-on-write sources stay
 * pinned while their copy is pending (so a failed step may re-send copies).
 */
#include "internal.h"
#include "pool_util.h"

Test(pool_txn, block_filled_in_a_transaction_is_not_hit_until_commit)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, c, hit = 99;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	bkv__pool_txn_begin(p);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 8, NULL), BKV_OK); /* [0, 1] full */
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(pool_stats(p).nr_indexed, 0);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 0, "a block the step has not computed must not hit");
	expect_table(p, b, (int32_t[]){2, 3}, 2);
	bkv__pool_txn_commit(p);
	cr_assert_eq(bkv_pool_check(p), 0);
	/* a's blocks were queued first, so they hold the hashes; b's stay
	 * private copies */
	cr_assert_eq(pool_stats(p).nr_indexed, 2);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8);
	expect_table(p, c, (int32_t[]){0, 1}, 2);
	bkv_pool_destroy(p);
}

Test(pool_txn, abort_forgets_queued_blocks_and_truncate_frees_them)
{
	bkv_pool *p = make_pool(4, 8, 0, 0);
	uint32_t a, b, hit = 99;
	int32_t t[8];

	fill_tokens(t, 8, 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 4, NULL), BKV_OK); /* [0] indexed */
	bkv__pool_txn_begin(p);
	cr_assert_eq(bkv_seq_append(p, a, t + 4, 4, NULL), BKV_OK); /* [0, 1] */
	bkv__pool_txn_abort(p);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(pool_stats(p).nr_indexed, 1);
	cr_assert_eq(bkv_seq_truncate(p, a, 4), BKV_OK); /* the rollback */
	expect_counts(p, 7, 1, 0);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, t, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 4, "only the block indexed before the step hits");
	bkv_pool_destroy(p);
}

Test(pool_txn, block_released_and_retaken_in_a_transaction_is_indexed_once)
{
	bkv_pool *p = make_pool(4, 2, 0, 0);
	uint32_t a, b;
	int32_t t[4], u[4];

	fill_tokens(t, 4, 1);
	fill_tokens(u, 4, 100);
	bkv__pool_txn_begin(p);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t, 4, NULL), BKV_OK); /* 0 queued */
	cr_assert_eq(bkv_seq_drop(p, a), BKV_OK);                /* 0 freed */
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, u, 4, NULL), BKV_OK); /* 0 again */
	expect_table(p, b, (int32_t[]){0}, 1);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv__pool_txn_commit(p);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(pool_stats(p).nr_indexed, 1);
	bkv_pool_destroy(p);
}

Test(pool_txn, queue_squeezes_stale_entries_when_full)
{
	bkv_pool *p = make_pool(1, 2, 0, 0);
	uint32_t a;
	int32_t t = 7;
	int i;

	bkv__pool_txn_begin(p);
	for (i = 0; i < 20; i++) {
		cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
		cr_assert_eq(bkv_seq_append(p, a, &t, 1, NULL), BKV_OK);
		cr_assert_eq(bkv_pool_check(p), 0);
		if (i < 19)
			cr_assert_eq(bkv_seq_drop(p, a), BKV_OK);
	}
	cr_assert_leq(p->kv.txn_n, 2u);
	bkv__pool_txn_commit(p);
	cr_assert_eq(pool_stats(p).nr_indexed, 1);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}
