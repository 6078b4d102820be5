/*
 * test_kv_cold.c - a cold pool's look-ahead paths change nothing.
 *
 * A pool whose index and block records exceed BKV__KV_COLD_BYTES takes
 * other code paths for the same operations: prefix lookups run as a
 * prefetching pipeline (bkv__cache_lookup_run), and an append of whole
 * blocks walks the LRU ahead of its evictions and hashes its blocks ahead
 * of their index inserts (pool/seq.c, append_blocks_cold). Those paths
 * must be pure prefetching: the same hits, the same blocks taken, the same
 * evictions, the same index.
 *
 * Two small pools get the same seeded random operations, one with its
 * index_cold flag forced on, the other forced off. After every operation
 * both answer alike, both pass bkv_pool_check, and their block records,
 * token stores, index slots, list heads and counters are byte for byte the
 * same.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "internal.h"
#include "pool_util.h"

#define SEQS 16
#define FAMILIES 5
#define MAXLEN 400

typedef struct twin {
	bkv_pool *p[2]; /* [0] forced cold, [1] forced warm */
	uint32_t id[SEQS];
	int open[SEQS];
	uint32_t len[SEQS];
	uint32_t fam[SEQS]; /* token family the sequence continues */
	uint64_t rng;
} twin;

static uint32_t rnd(twin *t, uint32_t n)
{
	t->rng ^= t->rng << 13;
	t->rng ^= t->rng >> 7;
	t->rng ^= t->rng << 17;
	return (uint32_t)((t->rng >> 11) % n);
}

/* Token i of family f: families share their first 40 tokens, so prompts
 * hit each other's leading blocks and then diverge. */
static int32_t token(uint32_t f, uint32_t i)
{
	return i < 40 ? (int32_t)i : (int32_t)(f * 100000 + i);
}

static void same_state(const twin *t)
{
	const bkv__kv *a = &t->p[0]->kv, *b = &t->p[1]->kv;
	uint32_t i;

	cr_assert_eq(bkv_pool_check(t->p[0]), 0);
	cr_assert_eq(bkv_pool_check(t->p[1]), 0);
	cr_assert_eq(a->free_head, b->free_head);
	cr_assert_eq(a->lru_head, b->lru_head);
	cr_assert_eq(a->lru_tail, b->lru_tail);
	cr_assert_eq(a->nr_free, b->nr_free);
	cr_assert_eq(a->nr_cached, b->nr_cached);
	cr_assert_eq(a->nr_indexed, b->nr_indexed);
	cr_assert_eq(a->evictions, b->evictions);
	cr_assert_eq(a->tokens, b->tokens);
	cr_assert_eq(a->txn_n, b->txn_n);
	cr_assert_eq(a->ev_seq, b->ev_seq);
	cr_assert_eq(memcmp(a->blk, b->blk, a->nb * sizeof(bkv__block)), 0);
	for (i = 0; i < a->nb; i++)
		cr_assert_eq(memcmp(bkv__tok(a, i), bkv__tok(b, i), a->bt * sizeof(int32_t)), 0);
	if (bkv__index_cap(a))
		cr_assert_eq(memcmp(a->index, b->index, bkv__index_cap(a) * sizeof(bkv__islot)), 0);
	for (i = 0; i < SEQS; i++) {
		uint32_t na, nb;
		const int32_t *ta, *tb;

		if (!t->open[i])
			continue;
		ta = bkv_seq_blocks(t->p[0], t->id[i], &na);
		tb = bkv_seq_blocks(t->p[1], t->id[i], &nb);
		cr_assert_eq(na, nb);
		if (na) /* an empty table may be NULL: no memcmp of NULL */
			cr_assert_eq(memcmp(ta, tb, na * sizeof(int32_t)), 0);
	}
}

/* One random operation on both pools. */
static void step(twin *t, int32_t *buf)
{
	uint32_t s = rnd(t, SEQS), op = rnd(t, 100), k, n, i, hit[2];
	int rc[2];

	if (!t->open[s]) {
		uint64_t key = rnd(t, 8) == 0;
		uint32_t id[2];

		for (k = 0; k < 2; k++)
			rc[k] = bkv_seq_open_keyed(t->p[k], key, &id[k]);
		cr_assert_eq(rc[0], rc[1]);
		cr_assert_eq(id[0], id[1]);
		t->id[s] = id[0];
		if (rc[0] == BKV_OK) {
			t->open[s] = 1;
			t->len[s] = 0;
			t->fam[s] = rnd(t, FAMILIES);
		}
		return;
	}
	if (op < 55) { /* append: a whole prompt, a few blocks or one token */
		n = op < 25 ? 1 + rnd(t, MAXLEN) : op < 45 ? 1 + rnd(t, 64) : 1;
		if (t->len[s] + n > MAXLEN)
			n = MAXLEN - t->len[s];
		if (n == 0)
			return;
		for (i = 0; i < n; i++)
			buf[i] = token(t->fam[s], t->len[s] + i);
		for (k = 0; k < 2; k++) {
			hit[k] = 0;
			rc[k] = op % 7 == 0 ? bkv__seq_append_private(t->p[k], t->id[s], buf, n)
					    : bkv_seq_append(t->p[k], t->id[s], buf, n, &hit[k]);
		}
		cr_assert_eq(rc[0], rc[1]);
		cr_assert_eq(hit[0], hit[1]);
		if (rc[0] == BKV_OK)
			t->len[s] += n;
	} else if (op < 70) { /* close or abort */
		for (k = 0; k < 2; k++)
			rc[k] = op < 64 ? bkv_seq_close(t->p[k], t->id[s])
					: bkv_seq_drop(t->p[k], t->id[s]);
		cr_assert_eq(rc[0], BKV_OK);
		cr_assert_eq(rc[1], BKV_OK);
		t->open[s] = 0;
	} else if (op < 80) { /* truncate */
		n = rnd(t, t->len[s] + 1);
		for (k = 0; k < 2; k++)
			rc[k] = bkv_seq_truncate(t->p[k], t->id[s], n);
		cr_assert_eq(rc[0], BKV_OK);
		cr_assert_eq(rc[1], BKV_OK);
		t->len[s] = n;
	} else if (op < 84) { /* switch family: the rest of the sequence diverges */
		t->fam[s] = rnd(t, FAMILIES);
	} else if (op < 92) { /* appends inside a step transaction */
		n = 1 + rnd(t, 200);
		if (t->len[s] + n > MAXLEN)
			return;
		for (i = 0; i < n; i++)
			buf[i] = token(t->fam[s], t->len[s] + i);
		for (k = 0; k < 2; k++) {
			bkv__pool_txn_begin(t->p[k]);
			rc[k] = bkv_seq_append(t->p[k], t->id[s], buf, n, &hit[k]);
			if (op & 1)
				bkv__pool_txn_commit(t->p[k]);
			else
				bkv__pool_txn_abort(t->p[k]);
		}
		cr_assert_eq(rc[0], rc[1]);
		if (rc[0] == BKV_OK) {
			cr_assert_eq(hit[0], hit[1]);
			t->len[s] += n;
		}
	} else { /* hits ahead of a chunk */
		n = 1 + rnd(t, 200);
		if (t->len[s] + n > MAXLEN)
			return;
		for (i = 0; i < n; i++)
			buf[i] = token(t->fam[s], t->len[s] + i);
		for (k = 0; k < 2; k++)
			rc[k] = bkv__seq_take_hits(t->p[k], t->id[s], buf, n);
		cr_assert_eq(rc[0], rc[1]);
		t->len[s] += (uint32_t)rc[0];
	}
}

static void run(uint32_t bt, uint32_t nb, uint64_t seed, uint32_t steps)
{
	static int32_t buf[MAXLEN];
	twin t;
	uint32_t i, k;

	memset(&t, 0, sizeof t);
	t.rng = seed;
	for (k = 0; k < 2; k++) {
		t.p[k] = make_pool(bt, nb, 0, 0);
		t.p[k]->kv.index_cold = k == 0;
	}
	for (i = 0; i < steps; i++) {
		step(&t, buf);
		same_state(&t);
	}
	for (k = 0; k < 2; k++)
		bkv_pool_destroy(t.p[k]);
}

Test(kv_cold, lookahead_changes_nothing_block_tokens_16, .timeout = 120)
{
	run(16, 96, 0x9e3779b97f4a7c15ull, 20000);
}

Test(kv_cold, lookahead_changes_nothing_block_tokens_4, .timeout = 120)
{
	run(4, 300, 0x2545f4914f6cdd1dull, 20000);
}

Test(kv_cold, lookahead_changes_nothing_block_tokens_1, .timeout = 120)
{
	run(1, 700, 0x8ebc6af09c88c6e3ull, 10000);
}

/* The cold lookup run (a pipeline: blocks hashed ahead, the slots of
 * nearer ones read and the records and token ids they name asked for,
 * probing past an entry's home slot) finds what the warm one finds when a
 * prompt leaves the cache at any block: the first, inside the slot stage's
 * distance, past the hash distance, after its ring of hashes wraps, or
 * none. The pool is nearly full of one prompt's cached blocks, so the
 * index is half taken and entries sit past their home slots. */
Test(kv_cold, lookup_run_stops_where_the_warm_one_does)
{
	enum { BT = 4, NB = 128, LEN = 120 };
	static int32_t t[LEN * BT], q[LEN * BT];
	bkv_pool *p = make_pool(BT, NB, 0, 0);
	int32_t out[2][LEN];
	uint32_t id, m, k, i, hits[2], rel[2], displaced = 0;

	fill_tokens(t, LEN * BT, 1000);
	cr_assert_eq(bkv_seq_open_keyed(p, 7, &id), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, id, t, LEN * BT, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, id), BKV_OK);
	cr_assert_eq(p->kv.nr_cached, LEN);
	for (i = 0; i <= p->kv.index_mask; i++)
		displaced += p->kv.index[i].b >= 0 && (p->kv.index[i].tag & p->kv.index_mask) != i;
	cr_assert_gt(displaced, 0);
	for (m = 0; m <= LEN; m++) {
		memcpy(q, t, sizeof q);
		if (m < LEN)
			q[m * BT + m % BT] ^= 1 << 20; /* block m differs */
		for (k = 0; k < 2; k++) {
			p->kv.index_cold = k == 0;
			hits[k] = bkv__cache_lookup_run(&p->kv, BKV__HASH_ROOT, -1, 7, q, LEN, out[k],
							&rel[k]);
		}
		cr_assert_eq(hits[0], m);
		cr_assert_eq(hits[1], m);
		cr_assert_eq(rel[0], m);
		cr_assert_eq(rel[1], m);
		cr_assert_eq(memcmp(out[0], out[1], m * sizeof(int32_t)), 0);
		/* another key: no hit, cold or warm */
		for (k = 0; k < 2; k++) {
			p->kv.index_cold = k == 0;
			cr_assert_eq(bkv__cache_lookup_run(&p->kv, BKV__HASH_ROOT, -1, 8, q, LEN,
							   out[k], &rel[k]),
				     0);
		}
	}
	bkv_pool_destroy(p);
}
