/*
 * test_pool_prop.c - seeded random operations against the pool, with
 * bkv_pool_check after every one and a model of what the host's KV memory
 * holds.
 *
 * The model plays the host: each sequence's tokens are kept in a shadow array;
 * the host's KV is simulated as one int per token slot (device and host
 * tiers). "Computing" a token writes its value into its slot. Before each
 * compute (an append) and at random "step" points, the host performs the
 * pending copies in the documented order (swap_out, swap_in, device) and
 * clears them. After every step the test reads every open sequence back
 * through its block table - from the pool's token store and from the simulated
 * KV - and requires exactly its own tokens: a prefix hit, a copy-on-write or a
 * swap that handed a sequence anyone else's KV fails here.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool_util.h"

#define MAXS 12
#define MAXLEN 256

typedef struct model {
	bkv_pool *p;
	uint32_t bt, nb, nh;
	int32_t *kv_dev;  /* [nb * bt] simulated device KV */
	int32_t *kv_host; /* [nh * bt] simulated host KV */
	uint32_t id[MAXS];
	int open[MAXS];
	uint32_t len[MAXS];
	uint64_t key[MAXS];
	int32_t tok[MAXS][MAXLEN];
	uint64_t rng;
	int lazy;        /* copies wait for a random step: no KV model */
	uint64_t ok[16]; /* successful ops by kind */
} model;

static uint32_t rnd(model *m, uint32_t n)
{
	m->rng ^= m->rng << 13;
	m->rng ^= m->rng >> 7;
	m->rng ^= m->rng << 17;
	return (uint32_t)((m->rng >> 11) % n);
}

/* The host performs every pending copy, in the documented order. */
static void host_step(model *m)
{
	const bkv_copy *c;
	uint32_t n, i, bt = m->bt;

	n = bkv_pool_pending_copies(m->p, BKV_COPY_SWAP_OUT, &c);
	for (i = 0; i < n; i++)
		memcpy(m->kv_host + (size_t)c[i].dst * bt, m->kv_dev + (size_t)c[i].src * bt,
		       bt * sizeof(int32_t));
	n = bkv_pool_pending_copies(m->p, BKV_COPY_SWAP_IN, &c);
	for (i = 0; i < n; i++)
		memcpy(m->kv_dev + (size_t)c[i].dst * bt, m->kv_host + (size_t)c[i].src * bt,
		       bt * sizeof(int32_t));
	n = bkv_pool_pending_copies(m->p, BKV_COPY_DEVICE, &c);
	for (i = 0; i < n; i++)
		memcpy(m->kv_dev + (size_t)c[i].dst * bt, m->kv_dev + (size_t)c[i].src * bt,
		       bt * sizeof(int32_t));
	bkv_pool_clear_copies(m->p, BKV_COPY_SWAP_OUT);
	bkv_pool_clear_copies(m->p, BKV_COPY_SWAP_IN);
	bkv_pool_clear_copies(m->p, BKV_COPY_DEVICE);
}

/* Every open sequence reads back exactly its own tokens (token store always;
 * simulated KV when no copy is pending). */
static void verify(model *m, int kv)
{
	uint32_t s, i, n;

	for (s = 0; s < MAXS; s++) {
		const int32_t *t;
		bkv_seq_info info;

		if (!m->open[s])
			continue;
		cr_assert_eq(bkv_seq_info_get(m->p, m->id[s], &info), BKV_OK);
		cr_assert_eq(info.len, m->len[s]);
		t = bkv_seq_blocks(m->p, m->id[s], &n);
		cr_assert_eq(n, (m->len[s] + m->bt - 1) / m->bt);
		for (i = 0; i < m->len[s]; i++) {
			size_t slot = (size_t)t[i / m->bt] * m->bt + i % m->bt;
			const int32_t *store = info.swapped ? m->p->host_tok + slot - i % m->bt
							    : bkv__tok(&m->p->kv, t[i / m->bt]);
			const int32_t *kvm = info.swapped ? m->kv_host : m->kv_dev;

			cr_assert_eq(store[i % m->bt], m->tok[s][i],
				     "seq %u token %u: store %d want %d", s, i, store[i % m->bt],
				     m->tok[s][i]);
			if (kv)
				cr_assert_eq(kvm[slot], m->tok[s][i], "seq %u token %u: kv %d want %d", s,
					     i, kvm[slot], m->tok[s][i]);
		}
	}
}

static int free_slot(model *m)
{
	uint32_t s;

	for (s = 0; s < MAXS; s++)
		if (!m->open[s])
			return (int)s;
	return -1;
}

static int pick_open(model *m)
{
	uint32_t s = rnd(m, MAXS), i;

	for (i = 0; i < MAXS; i++, s = (s + 1) % MAXS)
		if (m->open[s])
			return (int)s;
	return -1;
}

/* Tokens for an append: often a prefix of a shared prompt or of another
 * sequence, so that prefix hits (and near misses) are frequent. */
/* Three shared 64-token prompts (sharing their first 8 tokens). */
static int32_t prompt_tok(uint32_t p, uint32_t i)
{
	return i < 8 ? (int32_t)i : (int32_t)((p * 7 + i * i) % 5);
}

static uint32_t gen_tokens(model *m, int s, int32_t *out)
{
	uint32_t n = 1 + rnd(m, 3 * m->bt + 2), i, kind = rnd(m, 4);
	int o;

	/* whole blocks from an aligned end, so that prefix lookups happen */
	if (kind <= 1 && m->len[s] % m->bt == 0)
		n = m->bt * (1 + rnd(m, 3)) + rnd(m, 2);
	if (m->len[s] + n > MAXLEN)
		n = MAXLEN - m->len[s];
	for (i = 0; i < n; i++)
		out[i] = (int32_t)rnd(m, 3);
	if (kind == 0 && m->len[s] + n <= 64) {
		uint32_t pr = rnd(m, 3);

		for (i = 0; i < n; i++)
			out[i] = prompt_tok(pr, m->len[s] + i);
	} else if (kind == 1 && (o = pick_open(m)) >= 0 && m->len[o] > m->len[s]) {
		uint32_t k = BKV_MIN(n, m->len[o] - m->len[s]);

		memcpy(out, m->tok[o] + m->len[s], k * sizeof(int32_t));
	}
	return n;
}

enum { OP_OPEN, OP_APPEND, OP_FORK, OP_CLOSE, OP_DROP, OP_TRUNC, OP_SWAP_OUT, OP_SWAP_IN,
       OP_STEP, OP_RESET, OP_TXN, OP_N };

static void one_op(model *m)
{
	static const uint32_t weight[OP_N] = {32, 120, 20, 20, 8, 24, 20, 20, 24, 1, 12};
	uint32_t total = 0, r, op, i;
	int s, c, st;
	bkv_pool_stats before = pool_stats(m->p);

	for (i = 0; i < OP_N; i++)
		total += weight[i];
	r = rnd(m, total);
	for (op = 0; r >= weight[op]; op++)
		r -= weight[op];

	switch (op) {
	case OP_OPEN:
		s = free_slot(m);
		if (s < 0)
			return;
		m->key[s] = rnd(m, 4) == 0 ? 7 : 0;
		cr_assert_eq(bkv_seq_open_keyed(m->p, m->key[s], &m->id[s]), BKV_OK);
		m->open[s] = 1;
		m->len[s] = 0;
		break;
	case OP_APPEND: {
		int32_t t[MAXLEN];
		uint32_t n, hit = 0, off;
		int64_t need;
		bkv_seq_info info;

		s = pick_open(m);
		if (s < 0 || m->len[s] >= MAXLEN)
			return;
		n = gen_tokens(m, s, t);
		cr_assert_eq(bkv_seq_info_get(m->p, m->id[s], &info), BKV_OK);
		need = bkv_seq_blocks_needed(m->p, m->id[s], n);
		st = bkv_seq_append(m->p, m->id[s], t, n, &hit);
		if (info.swapped) {
			cr_assert_eq(st, BKV_ESTATE);
			cr_assert_eq(need, BKV_ESTATE);
			expect_same_stats(&before, m->p);
			return;
		}
		cr_assert_geq(need, 0);
		if ((m->len[s] + n + m->bt - 1) / m->bt > m->nb) {
			cr_assert_eq(st, BKV_E2BIG);
		} else if (need <= (int64_t)bkv_pool_available(m->p) && st != BKV_OK) {
			cr_assert_fail("append refused (%d) with %lld needed, %u available", st,
				       (long long)need, bkv_pool_available(m->p));
		}
		if (st != BKV_OK) {
			cr_assert(st == BKV_ENOSPC || st == BKV_E2BIG, "append: %d", st);
			expect_same_stats(&before, m->p);
			return;
		}
		cr_assert_eq(hit % m->bt, 0);
		cr_assert_leq(hit, n);
		/* The host: copies first, then computes the new tokens' KV. A
		 * lazy run lets copies pile up (the pool's bookkeeping must hold
		 * whatever the host does; the KV model then no longer applies). */
		if (!m->lazy)
			host_step(m);
		memcpy(m->tok[s] + m->len[s], t, n * sizeof(int32_t));
		off = m->len[s];
		m->len[s] += n;
		{
			const int32_t *tb = bkv_seq_blocks(m->p, m->id[s], NULL);

			for (i = off + hit; i < m->len[s]; i++)
				m->kv_dev[(size_t)tb[i / m->bt] * m->bt + i % m->bt] = m->tok[s][i];
		}
		verify(m, !m->lazy);
		break;
	}
	case OP_FORK:
		s = pick_open(m);
		c = free_slot(m);
		if (s < 0 || c < 0)
			return;
		st = bkv_seq_fork(m->p, m->id[s], &m->id[c]);
		if (st == BKV_ESTATE) {
			cr_assert_eq(bkv_seq_blocks_needed(m->p, m->id[s], 1), BKV_ESTATE);
			return;
		}
		cr_assert_eq(st, BKV_OK);
		m->open[c] = 1;
		m->len[c] = m->len[s];
		m->key[c] = m->key[s];
		memcpy(m->tok[c], m->tok[s], m->len[s] * sizeof(int32_t));
		break;
	case OP_CLOSE:
	case OP_DROP:
		s = pick_open(m);
		if (s < 0)
			return;
		st = op == OP_CLOSE ? bkv_seq_close(m->p, m->id[s]) : bkv_seq_drop(m->p, m->id[s]);
		cr_assert_eq(st, BKV_OK);
		cr_assert_eq(bkv_seq_close(m->p, m->id[s]), BKV_ENOENT);
		m->open[s] = 0;
		break;
	case OP_TRUNC:
		s = pick_open(m);
		if (s < 0)
			return;
		r = m->len[s] ? rnd(m, m->len[s] + 1) : 0;
		st = bkv_seq_truncate(m->p, m->id[s], r);
		if (st == BKV_ESTATE)
			return;
		cr_assert_eq(st, BKV_OK);
		m->len[s] = r;
		break;
	case OP_SWAP_OUT: {
		uint32_t n;

		s = pick_open(m);
		if (s < 0)
			return;
		bkv_seq_blocks(m->p, m->id[s], &n);
		st = bkv_seq_swap_out(m->p, m->id[s]);
		if (st == BKV_ENOSPC)
			cr_assert_gt(n, pool_stats(m->p).host_free);
		else
			cr_assert(st == BKV_OK || st == BKV_ESTATE, "swap_out: %d", st);
		if (st != BKV_OK) {
			expect_same_stats(&before, m->p);
			return;
		}
		break;
	}
	case OP_SWAP_IN:
		s = pick_open(m);
		if (s < 0)
			return;
		bkv_seq_blocks(m->p, m->id[s], &i);
		st = bkv_seq_swap_in(m->p, m->id[s]);
		if (st == BKV_ENOSPC)
			cr_assert_gt(i, bkv_pool_available(m->p));
		cr_assert(st == BKV_OK || st == BKV_ESTATE || st == BKV_ENOSPC, "swap_in: %d", st);
		if (st != BKV_OK) {
			expect_same_stats(&before, m->p);
			return;
		}
		break;
	case OP_STEP:
		host_step(m);
		verify(m, !m->lazy);
		break;
	case OP_RESET:
		cr_assert_eq(bkv_pool_reset_cache(m->p), BKV_OK);
		cr_assert_eq(pool_stats(m->p).nr_cached, 0);
		cr_assert_eq(pool_stats(m->p).nr_indexed, 0);
		break;
	case OP_TXN: /* the scheduler's step transaction: begin, or end it */
		if (!m->p->kv.txn_active)
			bkv__pool_txn_begin(m->p);
		else if (rnd(m, 3))
			bkv__pool_txn_commit(m->p);
		else
			bkv__pool_txn_abort(m->p);
		break;
	}
	m->ok[op]++;
}

/* Eviction by value (kv/value.c) for the next run: prices p0 = 1 and this
 * p1 per block of depth; 0 = LRU. */
static double run_value_p1;

static void run(uint32_t bt, uint32_t nb, uint32_t nh, int prefix, uint64_t seed, uint32_t ops,
		int lazy)
{
	model m;
	uint32_t i, s;
	int r;
	bkv_pool_stats st;

	memset(&m, 0, sizeof m);
	m.p = make_pool_ex(bt, nb, nh, 0, prefix);
	m.bt = bt;
	m.nb = nb;
	m.nh = nh;
	m.rng = seed;
	m.lazy = lazy;
	m.kv_dev = calloc((size_t)nb * bt, sizeof(int32_t));
	m.kv_host = calloc((size_t)(nh ? nh : 1) * bt, sizeof(int32_t));
	cr_assert(m.kv_dev && m.kv_host);
	for (i = 0; i < ops; i++) {
		/* the value policy goes on a tenth of the way in (cached blocks
		 * join their classes then) */
		if (run_value_p1 > 0.0 && i == ops / 10)
			cr_assert_eq(bkv__pool_value_on(m.p, 1.0, run_value_p1), BKV_OK);
		one_op(&m);
		r = bkv_pool_check(m.p);
		cr_assert_eq(r, 0, "check failed with %d after op %u (seed %llu)", r, i,
			     (unsigned long long)seed);
	}
	if (m.p->kv.txn_active)
		bkv__pool_txn_commit(m.p);
	host_step(&m);
	verify(&m, !lazy);
	for (s = 0; s < MAXS; s++)
		if (m.open[s])
			cr_assert_eq(bkv_seq_close(m.p, m.id[s]), BKV_OK);
	cr_assert_eq(bkv_pool_check(m.p), 0);
	st = pool_stats(m.p);
	cr_assert_eq(st.nr_used, 0);
	cr_assert_eq(st.nr_free + st.nr_cached, nb);
	cr_assert_eq(st.nr_indexed, st.nr_cached);
	cr_assert_eq(st.host_free, nh);
	cr_assert_eq(st.nr_seqs, 0);
	cr_assert_eq(st.tokens, 0);
	/* the run exercised every kind of operation, and the cache did work */
	for (i = 0; i < OP_N; i++)
		if (nh || (i != OP_SWAP_OUT && i != OP_SWAP_IN))
			cr_assert_gt(m.ok[i], 0, "op %u never succeeded", i);
	if (prefix) {
		cr_assert_gt(st.hit_tokens, 0);
		cr_assert_gt(st.evictions, 0);
	}
	if (nh)
		cr_assert_gt(st.swap_in_blocks, 0);
	if (run_value_p1 > 0.0) {
		cr_assert(m.p->kv.val != NULL);
		cr_assert_gt(m.p->kv.val_moves, 0, "no class head ever moved");
		bkv__pool_value_off(m.p);
		cr_assert(m.p->kv.val == NULL);
	}
	if (bt > 1)
		cr_assert_gt(st.cow_copies, 0);
	cr_log_info("bt %u: ok ops open %llu append %llu fork %llu close %llu drop %llu trunc %llu "
		    "out %llu in %llu step %llu reset %llu txn %llu; hits %llu misses %llu evictions %llu "
		    "cow %llu swap out %llu in %llu",
		    bt, (unsigned long long)m.ok[0], (unsigned long long)m.ok[1],
		    (unsigned long long)m.ok[2], (unsigned long long)m.ok[3],
		    (unsigned long long)m.ok[4], (unsigned long long)m.ok[5],
		    (unsigned long long)m.ok[6], (unsigned long long)m.ok[7],
		    (unsigned long long)m.ok[8], (unsigned long long)m.ok[9],
		    (unsigned long long)m.ok[10],
		    (unsigned long long)st.hit_tokens, (unsigned long long)st.miss_tokens,
		    (unsigned long long)st.evictions, (unsigned long long)st.cow_copies,
		    (unsigned long long)st.swap_out_blocks, (unsigned long long)st.swap_in_blocks);
	bkv_pool_destroy(m.p);
	free(m.kv_dev);
	free(m.kv_host);
}

Test(pool_prop, random_ops_keep_every_invariant, .timeout = 120)
{
	run(4, 40, 24, 1, 0x9e3779b97f4a7c15ull, 100000, 0);
}

Test(pool_prop, random_ops_with_copies_cleared_late, .timeout = 120)
{
	run(4, 40, 24, 1, 31337, 50000, 1);
}

Test(pool_prop, random_ops_late_copies_under_pressure, .timeout = 120)
{
	run(4, 20, 24, 1, 2718, 50000, 1);
}

Test(pool_prop, random_ops_one_token_blocks, .timeout = 120)
{
	run(1, 96, 64, 1, 12345, 20000, 0);
}

Test(pool_prop, random_ops_without_prefix_cache, .timeout = 120)
{
	run(8, 24, 16, 0, 777, 20000, 0);
}

Test(pool_prop, random_ops_without_host_tier, .timeout = 120)
{
	run(2, 48, 0, 1, 4242, 20000, 0);
}

/* The value policy's class lists beside the LRU, its chain rule (a head with
 * indexed children moves up) and its aging hold every pool invariant,
 * invariant 18 included, through the same random operations. */
Test(pool_prop, random_ops_evicting_by_value_keep_every_invariant, .timeout = 120)
{
	run_value_p1 = 0.25;
	run(4, 40, 24, 1, 0x5eed, 60000, 0);
}

Test(pool_prop, random_ops_evicting_by_value_one_token_blocks, .timeout = 120)
{
	run_value_p1 = 0.05;
	run(1, 96, 64, 1, 99, 20000, 0);
}
