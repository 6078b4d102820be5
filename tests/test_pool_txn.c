/*
 * test_pool_txn.c - step transactions: blocks filled inside a transaction are
 * indexed only at commit, forgotten at abort, and copy-on-write sources stay
 * pinned while their copy is pending (so a failed step may re-send copies);
 * with overlapped scheduling and a STATE group, no prefix hit replaces a
 * state an outstanding step's rollback needs.
 */
#include "internal.h"
#include "pool/overlap.h"
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

/* Overlapped scheduling with a STATE group: while a step is planned on one
 * in flight (bkv__pool_state_fence), a sequence whose state an outstanding
 * step changed - here by a checkpoint hit, computing nothing - takes no
 * further hit: the hit would replace the live state, which a rollback of
 * the later step alone needs back. Without the fence it takes it. */

static bkv_pool *state_pool(void)
{
	static const bkv_kv_group g[2] = {{BKV_GROUP_FULL, 1, 0, 0, 64},
					  {BKV_GROUP_STATE, 1, 4, 0, 256}};
	bkv_pool_config c;
	bkv_pool *p;

	bkv_pool_config_init(&c);
	c.block_tokens = 4;
	c.max_seqs = 8;
	c.state_units = 16;
	c.device_blocks = 64 + 16 * bkv_kv_state_frames(g, 2, 4);
	c.prefix_cache = 1;
	c.n_groups = 2;
	c.groups = g;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

/* B takes the checkpoint hit at 8, then asks for 4 more tokens (the
 * checkpoint at 12 is there) with the fence on or off. */
static int hit_after_hit(int fenced)
{
	bkv_pool *p = state_pool();
	uint32_t a, b, i;
	int32_t t[12], in, out, in8, got;

	fill_tokens(t, 12, 3);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	for (i = 0; i < 3; i++) { /* three steps: checkpoints at 4, 8, 12 */
		bkv__pool_txn_begin(p);
		cr_assert_eq(bkv_seq_append(p, a, t + 4 * i, 4, NULL), BKV_OK);
		bkv__pool_state_advance(p, a, 4 * (i + 1));
		bkv__pool_txn_commit(p);
	}
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv__pool_txn_begin(p); /* step N: b's hit, nothing computed */
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv__seq_take_hits(p, b, t, 8), 8);
	cr_assert_eq(bkv_seq_state_frames(p, b, &in8, &out), BKV_OK);
	cr_assert(in8 >= 0);
	bkv__pool_state_fence(p, fenced); /* step N + 1 planned on N, or not */
	got = bkv__seq_take_hits(p, b, t + 8, 4);
	bkv__pool_state_fence(p, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_state_frames(p, b, &in, &out), BKV_OK);
	cr_assert_eq(in == in8, got == 0, "the state moves exactly with a hit");
	bkv__pool_txn_abort(p); /* both steps fail: b back to nothing */
	cr_assert_eq(bkv_seq_truncate(p, b, 0), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
	return got;
}

Test(pool_txn, a_state_kept_for_an_outstanding_step_takes_no_hit_while_the_next_is_planned)
{
	cr_assert_eq(hit_after_hit(0), 4, "a plain step takes the second hit");
	cr_assert_eq(hit_after_hit(1), 0, "planned on a step in flight it does not");
}
