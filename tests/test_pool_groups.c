/*
 * test_pool_groups.c - pools with KV groups: a sliding window or a chunked
 * group holds exactly the blocks its next token reads, hits need every
 * group, and seeded random operations (appends with shared prefixes, forks,
 * truncates, swaps, closes, step transactions that commit or abort) keep
 * every group's KV right.
 *
 * The random test plays the host as test_pool_prop.c does: the device and
 * host KV are one int per token slot; computing token t of group g writes t
 * * 8 + g into the slot the group's table gives; copies are performed in the
 * documented order before each compute. After every operation every open
 * sequence is read back through every group's table: each held block must
 * hold this sequence's own tokens of that group, and each block the group
 * must hold must be there.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAXS 10
#define MAXLEN 300
#define NG 4

static const bkv_kv_group groups4[NG] = {
	{BKV_GROUP_FULL, 2, 0, 0, 256},
	{BKV_GROUP_WINDOW, 2, 20, 0, 256},
	{BKV_GROUP_CHUNKED, 1, 32, 0, 256},
	{BKV_GROUP_WINDOW, 1, 1, 0, 256},
};

/* full + window + a recurrent state checkpointed every 8 tokens (the
 * random test's block sizes divide 8) */
static const bkv_kv_group groups_state[3] = {
	{BKV_GROUP_FULL, 2, 0, 0, 256},
	{BKV_GROUP_WINDOW, 2, 12, 0, 256},
	{BKV_GROUP_STATE, 1, 8, 0, 512},
};

/* full + a recurrent state of several frames a unit (4 at block size 4, 2
 * at 8): with state_share its units are chunks of the attention frames */
static const bkv_kv_group groups_state_big[2] = {
	{BKV_GROUP_FULL, 2, 0, 0, 256},
	{BKV_GROUP_STATE, 1, 8, 0, 8192},
};

/* state_share for the next make_group_pool: 0 off, else the floor + 1 */
static uint32_t next_share;
/* host_cache for the next make_group_pool */
static uint32_t next_hcache;

static bkv_pool *make_group_pool(uint32_t bt, uint32_t nb, uint32_t nh, const bkv_kv_group *g,
				 uint32_t ng)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.state_share = next_share != 0;
	c.host_cache = next_hcache;
	c.block_tokens = bt;
	c.device_blocks = nb;
	c.host_blocks = nh;
	c.max_seqs = 128;
	c.n_groups = ng;
	c.groups = g;
	if (ng && g[ng - 1].kind == BKV_GROUP_STATE)
		c.state_units = next_share ? next_share - 1
					   : 40; /* live and scratch states of 10
						    sequences, and checkpoints */
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

/* Blocks group g must hold for a sequence of len tokens (the first one). */
static uint32_t first_needed(const bkv_kv_group *g, uint32_t bt, uint32_t len)
{
	if (g->kind == BKV_GROUP_WINDOW)
		return len + 1 > g->span ? (len + 1 - g->span) / bt : 0;
	if (g->kind == BKV_GROUP_CHUNKED)
		return len / g->span * g->span / bt;
	return 0;
}

Test(pool_groups, config_refuses_bad_groups)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;
	bkv_kv_group g[2] = {{BKV_GROUP_WINDOW, 1, 8, 0, 64}, {BKV_GROUP_FULL, 1, 0, 0, 64}};

	bkv_pool_config_init(&c);
	c.device_blocks = 16;
	c.n_groups = 2;
	c.groups = NULL;
	cr_expect_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL);
	c.groups = g; /* group 0 must be full attention */
	cr_expect_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL);
	g[0] = (bkv_kv_group){BKV_GROUP_FULL, 1, 0, 0, 64};
	g[1] = (bkv_kv_group){BKV_GROUP_WINDOW, 1, 0, 0, 64}; /* window 0 */
	cr_expect_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL);
	c.n_groups = BKV_MAX_GROUPS + 1;
	cr_expect_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL);
	c.n_groups = 1; /* one full group: the plain pool */
	cr_expect_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	cr_expect_null(bkv_seq_group_blocks(p, 1, 1, NULL));
	bkv_pool_destroy(p);
}

Test(pool_groups, window_holds_only_the_blocks_its_next_token_reads)
{
	const bkv_kv_group g[2] = {{BKV_GROUP_FULL, 12, 0, 0, 2048},
				   {BKV_GROUP_WINDOW, 12, 128, 0, 2048}};
	bkv_pool *p = make_group_pool(16, 4096, 0, g, 2);
	int32_t tok[512];
	uint32_t s, n, i, k, len = 0, held;
	const int32_t *t;

	for (i = 0; i < 512; i++)
		tok[i] = (int32_t)i;
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	/* a prompt in chunks of 512, then decode: after each append, before
	 * the next, the window group holds what the next token reads plus
	 * the last append's blocks; at the next append only the former */
	for (i = 0; i < 8; i++, len += 512)
		cr_assert_eq(bkv_seq_append(p, s, tok, 512, NULL), BKV_OK);
	for (i = 0; i < 40; i++, len++) {
		cr_assert_eq(bkv_seq_append(p, s, tok, 1, NULL), BKV_OK);
		t = bkv_seq_group_blocks(p, s, 1, &n);
		cr_assert_eq(n, (len + 1 + 15) / 16);
		for (held = 0; held < n; held++)
			if (t[held] >= 0)
				break;
		for (k = held; k < n; k++)
			cr_expect_geq(t[k], 0, "held entries are contiguous");
		/* held from the block of position len + 1 - 128 (the token just
		 * appended, at len, read from len - 127) */
		cr_expect_eq(held, (len - 127) / 16, "len %u: first held %u", len, held);
		cr_expect_eq(bkv_pool_check(p), 0);
	}
	/* the group-0 table is whole */
	t = bkv_seq_group_blocks(p, s, 0, &n);
	for (i = 0; i < n; i++)
		cr_expect_geq(t[i], 0);
	cr_expect_eq(bkv_seq_close(p, s), BKV_OK);
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* Open 32,768-token sequences (chunks of 512, then one decode token) until
 * one does not fit; returns how many did. */
static uint32_t fill_with_32k(bkv_pool *p)
{
	int32_t tok[512];
	uint32_t n, s, i;

	for (n = 0;; n++) {
		int rc = BKV_OK;

		for (i = 0; i < 512; i++) /* every sequence its own tokens */
			tok[i] = (int32_t)(i * 7 + n * 100003);
		if (bkv_seq_open(p, &s) != BKV_OK)
			break;
		for (i = 0; i < 64 && rc == BKV_OK; i++)
			rc = bkv_seq_append(p, s, tok, 512, NULL);
		if (rc == BKV_OK)
			rc = bkv_seq_append(p, s, tok, 1, NULL);
		if (rc != BKV_OK)
			break;
	}
	return n;
}

Test(pool_groups, hybrid_fits_twice_the_sequences_of_all_full)
{
	/* gpt-oss-20b's shape: 12 full + 12 windowed (128) layers. A frame of
	 * the all-full model holds 24 layers, of the hybrid 12: the same
	 * memory is twice the frames. */
	const bkv_kv_group hyb[2] = {{BKV_GROUP_FULL, 12, 0, 0, 2048},
				     {BKV_GROUP_WINDOW, 12, 128, 0, 2048}};
	const bkv_kv_group full24[1] = {{BKV_GROUP_FULL, 24, 0, 0, 2048}};
	const uint32_t frames_full = 40 * 2049;
	bkv_pool *pf = make_group_pool(16, frames_full, 0, full24, 1);
	bkv_pool *ph = make_group_pool(16, 2 * frames_full, 0, hyb, 2);
	uint32_t nf = fill_with_32k(pf), nh = fill_with_32k(ph);

	cr_expect_eq(nf, 40);
	/* each hybrid sequence holds 2,049 + 9 blocks: 79 fit (1.975x) */
	cr_expect_geq(nh, 78, "hybrid fits %u sequences of 32k tokens, all-full %u", nh, nf);
	cr_expect_eq(bkv_pool_check(pf), 0);
	cr_expect_eq(bkv_pool_check(ph), 0);
	bkv_pool_destroy(pf);
	bkv_pool_destroy(ph);
}

Test(pool_groups, hit_needs_every_group)
{
	const bkv_kv_group g[2] = {{BKV_GROUP_FULL, 1, 0, 0, 64},
				   {BKV_GROUP_WINDOW, 1, 8, 0, 64}};
	bkv_pool *p = make_group_pool(4, 256, 0, g, 2);
	int32_t tok[64];
	uint32_t a, b, c, hit, i;

	for (i = 0; i < 64; i++)
		tok[i] = (int32_t)(100 + i);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, tok, 64, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK); /* everything cached */
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, tok, 64, &hit), BKV_OK);
	cr_expect_eq(hit, 64, "every block of both groups cached: a full hit");
	cr_expect_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_close(p, b), BKV_OK);
	/* a full reset loses every group's blocks: no hit */
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &c), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, c, tok, 40, &hit), BKV_OK);
	cr_expect_eq(hit, 0);
	cr_assert_eq(bkv_seq_close(p, c), BKV_OK);
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* ---- the random test -------------------------------------------------------- */

typedef struct model {
	bkv_pool *p;
	const bkv_kv_group *g;
	uint32_t ng, bt, nb, nh;
	int32_t *kv_dev, *kv_host;
	uint32_t id[MAXS];
	int open[MAXS];
	uint32_t len[MAXS];
	int32_t tok[MAXS][MAXLEN];
	uint64_t rng;
	uint64_t hits, ops[12];
	uint64_t seed, step;
	int state;       /* the last group is STATE (not among the ng) */
	int always_txn;  /* every append inside a step transaction */
	uint64_t lends;  /* chunks lent to a shared STATE group */
} model;

/* The recurrent state after tokens[0, n): a rolling hash, 1 for none. */
static int32_t state_of(const int32_t *tokens, uint32_t n)
{
	uint32_t v = 1, i;

	for (i = 0; i < n; i++)
		v = v * 31u + (uint32_t)tokens[i];
	return (int32_t)(v & 0x7fffffff);
}

static uint32_t rnd(model *m, uint32_t n)
{
	m->rng ^= m->rng << 13;
	m->rng ^= m->rng >> 7;
	m->rng ^= m->rng << 17;
	return (uint32_t)((m->rng >> 11) % n);
}

static void host_copies(model *m)
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
	for (i = 0; i < 3; i++)
		bkv_pool_clear_copies(m->p, (bkv_copy_kind)i);
}

/* The host computes positions [from, to) of sequence i in every group; a
 * state reads its unit's first slot and writes the next unit's. */
static void compute(model *m, int i, uint32_t from, uint32_t to)
{
	uint32_t g, pos, n;

	host_copies(m);
	if (m->state) {
		int32_t in, out;

		cr_assert_eq(bkv_seq_state_frames(m->p, m->id[i], &in, &out), BKV_OK);
		if (from == to) { /* all hits: the state is a checkpoint's */
			cr_assert_geq(in, 0);
			cr_assert_eq(m->kv_dev[(size_t)in * m->bt], state_of(m->tok[i], to));
			goto attention;
		}
		cr_assert_geq(out, 0, "an append with new tokens has a unit to write");
		cr_assert_neq(in, out, "states are written out of place");
		cr_assert_eq(in < 0 ? 1 : m->kv_dev[(size_t)in * m->bt], state_of(m->tok[i], from),
			     "seed %lu step %lu: seq %d reads the state at %u", (unsigned long)m->seed,
			     (unsigned long)m->step, i, from);
		m->kv_dev[(size_t)out * m->bt] = state_of(m->tok[i], to);
	}
attention:
	for (g = 0; g < m->ng; g++) {
		const int32_t *t = bkv_seq_group_blocks(m->p, m->id[i], g, &n);

		for (pos = from; pos < to; pos++) {
			int32_t b = t[pos / m->bt];

			cr_assert_geq(b, 0, "group %u: the block of a written position is held", g);
			m->kv_dev[(size_t)b * m->bt + pos % m->bt] = m->tok[i][pos] * 8 + (int32_t)g;
		}
	}
}

static void verify(model *m)
{
	uint32_t i, g, pos, n;
	int rc = bkv_pool_check(m->p);

	cr_assert_eq(rc, 0, "bkv_pool_check: %d", rc);
	host_copies(m);
	for (i = 0; i < MAXS; i++) {
		bkv_seq_info info = {0};

		if (!m->open[i])
			continue;
		cr_assert_eq(bkv_seq_info_get(m->p, m->id[i], &info), BKV_OK);
		cr_assert_eq(info.len, m->len[i]);
		if (m->state && !info.swapped) {
			int32_t in, out, v;

			cr_assert_eq(bkv_seq_state_frames(m->p, m->id[i], &in, &out), BKV_OK);
			v = out >= 0 ? m->kv_dev[(size_t)out * m->bt]
				     : in >= 0 ? m->kv_dev[(size_t)in * m->bt] : 1;
			cr_assert_eq(v, state_of(m->tok[i], m->len[i]),
				     "seed %lu step %lu: seq %u state", (unsigned long)m->seed,
				     (unsigned long)m->step, i);
		}
		for (g = 0; g < m->ng; g++) {
			const int32_t *t = bkv_seq_group_blocks(m->p, m->id[i], g, &n);
			uint32_t first = first_needed(&m->g[g], m->bt, m->len[i]);
			const int32_t *kv = info.swapped ? m->kv_host : m->kv_dev;

			for (pos = 0; pos < m->len[i]; pos++) {
				int32_t b = t[pos / m->bt];

				if (pos / m->bt >= first)
					cr_assert_geq(b, 0, "seq %u group %u block %u needed", i, g,
						      pos / m->bt);
				if (b < 0)
					continue;
				cr_assert_eq(kv[(size_t)b * m->bt + pos % m->bt],
					     m->tok[i][pos] * 8 + (int32_t)g,
					     "seed %lu step %lu: seq %u group %u pos %u: wrong KV",
					     (unsigned long)m->seed, (unsigned long)m->step, i, g, pos);
			}
		}
	}
}

/* Tokens from a few shared prefixes, so that appends hit. */
static void gen_tokens(model *m, int32_t *out, uint32_t start, uint32_t n, uint32_t family)
{
	uint32_t k;

	for (k = 0; k < n; k++)
		out[k] = (int32_t)(family * 1000 + (start + k) % 997);
}

static void op_append(model *m, int i, int txn)
{
	uint32_t n = 1 + (rnd(m, 4) ? rnd(m, 3) : rnd(m, 70)), hit = 0, fam = (uint32_t)i % 3;
	int32_t buf[MAXLEN];
	int rc;

	if (m->len[i] + n > MAXLEN)
		return;
	gen_tokens(m, buf, m->len[i], n, fam);
	if (rnd(m, 8) == 0)
		buf[0] += 1; /* diverge */
	txn |= m->always_txn;
	if (txn)
		bkv__pool_txn_begin(m->p);
	rc = bkv_seq_append(m->p, m->id[i], buf, n, &hit);
	if (rc == BKV_OK) {
		memcpy(&m->tok[i][m->len[i]], buf, n * sizeof(int32_t));
		compute(m, i, m->len[i] + hit, m->len[i] + n);
		m->hits += hit;
		m->len[i] += n;
		m->ops[0]++;
	} else {
		/* E2BIG: a pool smaller than MAXLEN tokens */
		cr_assert(rc == BKV_ENOSPC || rc == BKV_ESTATE || rc == BKV_E2BIG, "append: %d", rc);
	}
	if (txn) {
		if (rc == BKV_OK && rnd(m, 4) == 0) {
			/* the step failed: roll back as the scheduler does */
			bkv__pool_txn_abort(m->p);
			cr_assert_eq(bkv_seq_truncate(m->p, m->id[i], m->len[i] - n), BKV_OK);
			m->len[i] -= n;
			m->ops[1]++;
		} else {
			bkv__pool_txn_commit(m->p);
		}
	}
}

static void op_other(model *m, int i, uint32_t k)
{
	uint32_t c;
	int j, rc;

	switch (k) {
	case 0: /* fork into a closed slot */
		for (j = 0; j < MAXS && m->open[j]; j++)
			;
		if (j == MAXS)
			return;
		rc = bkv_seq_fork(m->p, m->id[i], &c);
		if (rc == BKV_OK) {
			m->id[j] = c;
			m->open[j] = 1;
			m->len[j] = m->len[i];
			memcpy(m->tok[j], m->tok[i], sizeof m->tok[i]);
			m->ops[2]++;
		}
		return;
	case 1:
		cr_assert_eq(rnd(m, 2) ? bkv_seq_close(m->p, m->id[i]) : bkv_seq_drop(m->p, m->id[i]),
			     BKV_OK);
		m->open[i] = 0;
		m->ops[3]++;
		return;
	case 2: {
		uint32_t nl = m->len[i] ? rnd(m, m->len[i] + 1) : 0;

		rc = bkv_seq_truncate(m->p, m->id[i], nl);
		if (rc == BKV_OK) {
			m->len[i] = nl;
			m->ops[4]++;
		} else {
			cr_assert(rc == BKV_ESTATE, "truncate: %d", rc);
			m->ops[5]++;
		}
		return;
	}
	case 3:
		rc = bkv_seq_swap_out(m->p, m->id[i]);
		cr_assert(rc == BKV_OK || rc == BKV_ESTATE || rc == BKV_ENOSPC);
		m->ops[6] += rc == BKV_OK;
		return;
	default:
		host_copies(m);
		rc = bkv_seq_swap_in(m->p, m->id[i]);
		cr_assert(rc == BKV_OK || rc == BKV_ESTATE || rc == BKV_ENOSPC);
		m->ops[7] += rc == BKV_OK;
		return;
	}
}

/* The host cache's reloads in run_random_ex's last pool. */
static uint64_t last_reloads;

static uint64_t run_random_ex(uint64_t seed, uint32_t bt, uint32_t nb, uint32_t steps, int state)
{
	model m;
	uint32_t step;
	int i;

	memset(&m, 0, sizeof m);
	m.g = next_share ? groups_state_big : state ? groups_state : groups4;
	m.ng = next_share ? 1 : state ? 2 : NG;
	m.state = state;
	m.always_txn = state == 2;
	m.bt = bt;
	m.nb = nb;
	m.nh = 256;
	m.rng = seed * 2654435761u + 1;
	m.seed = seed;
	m.p = make_group_pool(bt, nb, m.nh, m.g, next_share ? 2 : state ? 3 : NG);
	m.kv_dev = calloc((size_t)nb * bt, sizeof(int32_t));
	m.kv_host = calloc((size_t)m.nh * bt, sizeof(int32_t));
	for (step = 0; step < steps; step++) {
		m.step = step;
		i = (int)rnd(&m, MAXS);
		if (!m.open[i]) {
			cr_assert_eq(bkv_seq_open(m.p, &m.id[i]), BKV_OK);
			m.open[i] = 1;
			m.len[i] = 0;
			continue;
		}
		if (rnd(&m, 3)) {
			bkv_seq_info info;

			cr_assert_eq(bkv_seq_info_get(m.p, m.id[i], &info), BKV_OK);
			if (!info.swapped)
				op_append(&m, i, (int)rnd(&m, 2));
		} else {
			op_other(&m, i, rnd(&m, 5));
		}
		verify(&m);
	}
	cr_expect_gt(m.ops[0], steps / 8, "appends: %lu", (unsigned long)m.ops[0]);
	if (next_share) { /* the units came from the attention frames and went back */
		cr_expect_gt(m.p->kv.ck_lends, 0);
		cr_expect_gt(m.p->kv.ck_returns, 0);
		m.lends += m.p->kv.ck_lends;
	}
	cr_expect_gt(m.ops[2] + m.ops[4] + m.ops[6], 0, "forks, truncates and swaps ran");
	for (i = 0; i < MAXS; i++)
		if (m.open[i])
			cr_assert_eq(bkv_seq_close(m.p, m.id[i]), BKV_OK);
	cr_assert_eq(bkv_pool_check(m.p), 0);
	last_reloads = m.p->hc_hits;
	bkv_pool_destroy(m.p);
	free(m.kv_dev);
	free(m.kv_host);
	return m.hits;
}

static uint64_t run_random(uint64_t seed, uint32_t bt, uint32_t nb, uint32_t steps)
{
	return run_random_ex(seed, bt, nb, steps, 0);
}

Test(pool_groups, random_ops_keep_a_recurrent_state_right)
{
	uint64_t seed, hits = 0;

	/* 2: every append in a step transaction (as the scheduler), 1: some
	 * outside one (committed lazily) */
	for (seed = 40; seed <= 51; seed++)
		hits += run_random_ex(seed, seed % 2 ? 4 : 8, 200, 1500, 1 + (int)(seed % 3 == 0));
	cr_expect_gt(hits, 0, "hits at checkpoints");
}

Test(pool_groups, random_ops_keep_shared_state_units_and_blocks_apart)
{
	uint64_t seed, hits = 0;

	/* units lent from the attention frames and given back, under every
	 * operation; a floor of 0 or 3 units; pools of 120 and 60 frames (the
	 * smaller one runs out, so lending, evicting and giving back meet
	 * refused appends) */
	for (seed = 60; seed <= 71; seed++) {
		next_share = seed % 2 ? 1 : 4;
		hits += run_random_ex(seed, seed % 4 < 2 ? 4 : 8, seed % 3 ? 120 : 60, 1500,
				      1 + (int)(seed % 3 == 0));
	}
	next_share = 0;
	cr_expect_gt(hits, 0, "hits at checkpoints");
}

/* With a host cache (pool/hcache.c): evicted blocks of every group go to
 * the host and come back on hits, which the model checks cell by cell
 * (host_copies performs the demotions and reloads); pools small enough to
 * evict. */
Test(pool_groups, random_ops_with_a_host_cache_keep_every_groups_kv)
{
	uint64_t seed, hits = 0, reloads = 0;

	next_hcache = 1;
	for (seed = 80; seed <= 97; seed++) {
		uint32_t bt = seed % 3 == 0 ? 1 : seed % 3 == 1 ? 4 : 8;

		hits += run_random_ex(seed, bt, bt == 1 ? 400 : bt == 4 ? 120 : 70, 1500,
				      seed % 6 < 2 ? 0 : 1 + (int)(seed % 2));
		reloads += last_reloads;
	}
	next_hcache = 0;
	cr_expect_gt(hits, 0);
	cr_expect_gt(reloads, 0, "hits reloaded from the host");
}

Test(pool_groups, random_ops_keep_every_groups_kv)
{
	uint64_t seed, hits[3] = {0, 0, 0};

	for (seed = 1; seed <= 12; seed++)
		hits[seed % 3] += run_random(seed, seed % 3 == 0 ? 1 : seed % 3 == 1 ? 4 : 8, 160, 1500);
	for (seed = 0; seed < 3; seed++)
		cr_expect_gt(hits[seed], 0, "the shared prefixes hit (block size class %lu)",
			     (unsigned long)seed);
}

Test(pool_groups, random_ops_in_a_small_pool)
{
	uint64_t seed;

	for (seed = 20; seed <= 26; seed++)
		(void)run_random(seed, 4, 48, 1500);
}

/* A call that names a sequence first completes what its last append left
 * for later (outside a step: the window blocks that append's tokens read,
 * and its state made live). A refused call must not: stats, every group's
 * table and the state units stay as they were. Each case below changed the
 * pool before the fix (found by fuzz_pool drawing KV groups). */
static void same_pool(bkv_pool *p, const bkv_pool_stats *st0, uint32_t seq,
		      const int32_t *win0, uint32_t n0, int32_t in0, int32_t out0)
{
	bkv_pool_stats st = {.size = sizeof(st)};
	const int32_t *win;
	uint32_t n;
	int32_t in, out;

	bkv_pool_stats_get(p, &st);
	cr_assert_eq(memcmp(&st, st0, sizeof(st)), 0, "a refused call changed the stats");
	win = bkv_seq_group_blocks(p, seq, 1, &n);
	cr_assert_eq(n, n0);
	cr_assert_eq(memcmp(win, win0, n * sizeof(*win)), 0, "a refused call trimmed the window");
	cr_assert_eq(bkv_seq_state_frames(p, seq, &in, &out), BKV_OK);
	cr_assert(in == in0 && out == out0, "a refused call settled the state");
	cr_assert_eq(bkv_pool_check(p), 0);
}

Test(pool_groups, refused_calls_leave_the_last_appends_releases_pending)
{
	static const bkv_kv_group g[3] = {
		{BKV_GROUP_FULL, 1, 0, 0, 64},
		{BKV_GROUP_WINDOW, 1, 4, 0, 64},
		{BKV_GROUP_STATE, 1, 0, 0, 128},
	};
	bkv_pool_config c;
	bkv_pool *p = NULL;
	bkv_pool_stats st0 = {.size = sizeof(st0)};
	int32_t tok[12], win0[8], in0, out0;
	const int32_t *w;
	uint32_t a, b, n0, i;

	for (i = 0; i < 12; i++)
		tok[i] = (int32_t)i + 100;
	bkv_pool_config_init(&c);
	c.block_tokens = 4;
	c.device_blocks = 40;
	c.host_blocks = 3;
	c.max_seqs = 1;
	c.n_groups = 3;
	c.groups = g;
	c.state_units = 1; /* a live state and no unit to write the next one */
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, tok, 8, NULL), BKV_OK);
	/* pending: the window's block 0 (position 8 reads 5..8) and the state */
	w = bkv_seq_group_blocks(p, a, 1, &n0);
	cr_assert_eq(n0, 2);
	cr_assert_geq(w[0], 0, "the block the append's tokens read is still held");
	memcpy(win0, w, n0 * sizeof(*w));
	cr_assert_eq(bkv_seq_state_frames(p, a, &in0, &out0), BKV_OK);
	cr_assert(in0 == -1 && out0 >= 0);
	bkv_pool_stats_get(p, &st0);

	/* append: no unit for the next state */
	cr_assert_eq(bkv_seq_append(p, a, tok + 8, 4, NULL), BKV_ENOSPC);
	same_pool(p, &st0, a, win0, n0, in0, out0);
	/* fork: no sequence slot */
	cr_assert_eq(bkv_seq_fork(p, a, &b), BKV_EAGAIN);
	same_pool(p, &st0, a, win0, n0, in0, out0);
	/* swap-out: 2 + 1 blocks and a state frame, 3 host blocks */
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_ENOSPC);
	same_pool(p, &st0, a, win0, n0, in0, out0);
	bkv_pool_destroy(p);
}

/* A swapped-in state is loaded by a copy the next host call makes; until
 * the copies are cleared its unit holds nothing. Swapping the sequence out
 * again before that would copy the unit out ahead of the load (swap-outs
 * go first): refused, like a block still being loaded. */
Test(pool_groups, a_state_still_being_swapped_in_is_not_swapped_out_again)
{
	static const bkv_kv_group g[2] = {
		{BKV_GROUP_FULL, 1, 0, 0, 64},
		{BKV_GROUP_STATE, 1, 4, 0, 128},
	};
	bkv_pool_config c;
	bkv_pool *p = NULL;
	int32_t tok[8], in, out;
	uint32_t a, i;

	for (i = 0; i < 8; i++)
		tok[i] = (int32_t)i + 100;
	bkv_pool_config_init(&c);
	c.block_tokens = 4;
	c.device_blocks = 16;
	c.host_blocks = 16;
	c.max_seqs = 2;
	c.n_groups = 2;
	c.groups = g;
	c.state_units = 4;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, tok, 8, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_OK);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(bkv_seq_swap_in(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_state_frames(p, a, &in, &out), BKV_OK);
	cr_assert_geq(in, 0, "the swapped-in state is live");
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_ESTATE, "its load is still pending");
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	cr_assert_eq(bkv_seq_swap_out(p, a), BKV_OK, "loaded: it may go again");
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* ---- the scheduler on a grouped pool -------------------------------------- */

/* One token each, no host state: the scheduler's progress is what is tested. */
static int fwd_sevens(void *host, const bkv_batch *b, int32_t *next)
{
	uint32_t r;

	(void)host;
	for (r = 0; r < b->n_rows; r++)
		next[r] = 7;
	return 0;
}

static void note_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	(void)req;
	(void)user;
	*(int *)host = (int)why;
}

/* A step costs 1 ms per token computed: a TPOT target of 1.5 ms lets a
 * step take one token, less than a block of 2. */
static double ms_per_token(void *ctx, const bkv_step_shape *sh)
{
	double t = sh->decode_rows;
	uint32_t i;

	(void)ctx;
	for (i = 0; i < sh->n_chunks; i++)
		t += sh->chunks[i].len;
	return 1000.0 * t;
}

/* A grouped pool's prefill chunks end on block boundaries; when the TPOT
 * target lets a step take less than a block, the step's first chunk still
 * takes its block (fuzz_sched found the request waiting forever: every
 * step cut its one-token chunk to nothing). */
Test(pool_groups, chunked_prefill_progresses_when_the_tpot_target_allows_less_than_a_block)
{
	static const bkv_kv_group g[2] = {
		{BKV_GROUP_FULL, 1, 0, 0, 64},
		{BKV_GROUP_CHUNKED, 1, 8, 0, 64},
	};
	static const int32_t prompt[6] = {11, 12, 13, 14, 15, 16};
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_request q;
	bkv_pool *p = NULL;
	bkv_sched *s = NULL;
	uint64_t id;
	uint32_t i;
	int why = -1;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 2;
	pc.device_blocks = 9;
	pc.n_groups = 2;
	pc.groups = g;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &p), BKV_OK);
	bkv_sched_config_init(&sc);
	sc.max_running = 1;
	sc.chunked_prefill = 1;
	sc.token_budget = 512;
	sc.tpot_target_us = 1500;
	sc.cost.step_us = ms_per_token;
	memset(&ops, 0, sizeof(ops));
	ops.forward = fwd_sevens;
	ops.on_finish = note_finish;
	cr_assert_eq(bkv_sched_create(&sc, p, &ops, &why, NULL, &s), BKV_OK);
	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = 6;
	q.max_new_tokens = 5;
	cr_assert_eq(bkv_submit(s, &q, &id), BKV_OK);
	for (i = 0; i < 100 && bkv_sched_pending(s); i++)
		cr_assert_eq(bkv_step(s, NULL), BKV_OK);
	cr_assert_eq(bkv_sched_pending(s), 0, "the request still waits after %u steps", i);
	cr_assert_eq(why, BKV_FINISH_LENGTH, "the request ended with reason %d, not its length",
		     why);
	cr_assert_eq(bkv_sched_check(s), 0);
	bkv_sched_destroy(s);
	bkv_pool_destroy(p);
}

/* ---- state units sharing the frames with attention (state_share) ---------- */

/* 64 frames of block size 4, full attention + a state of 4 frames a unit;
 * shared (floor 0) or a fixed arena of 8 units (32 frames). */
static bkv_pool *trade_pool(int share)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = 4;
	c.device_blocks = 64;
	c.max_seqs = 32;
	c.n_groups = 2;
	c.groups = groups_state_big;
	c.state_share = (uint32_t)share;
	c.state_units = share ? 0 : 8;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	cr_assert_eq(bkv_kv_state_frames(groups_state_big, 2, 4), 4);
	return p;
}

/* One step's append of n tokens of family f to seq (committed: the state is
 * live and, at a multiple of 8 tokens, a checkpoint); the checker after it
 * and the stats' sum. */
static int trade_append(bkv_pool *p, uint32_t seq, uint32_t n, uint32_t f)
{
	int32_t tok[256];
	bkv_pool_stats st = {.size = sizeof(st)};
	uint32_t i;
	int rc;

	for (i = 0; i < n; i++)
		tok[i] = (int32_t)(f * 1000 + i);
	bkv__pool_txn_begin(p);
	rc = bkv_seq_append(p, seq, tok, n, NULL);
	if (rc == BKV_OK)
		bkv__pool_state_advance(p, seq, n);
	bkv__pool_txn_commit(p);
	cr_assert_eq(bkv_pool_check(p), 0, "check: %d", bkv_pool_check(p));
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.nr_free + st.nr_used + st.nr_cached, st.device_blocks);
	cr_assert_eq(st.device_blocks + st.state_units * 4, 64);
	return rc;
}

static void trade_close_all(bkv_pool *p, const uint32_t *s, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		cr_assert_eq(bkv_seq_close(p, s[i]), BKV_OK);
		cr_assert_eq(bkv_pool_check(p), 0);
	}
}

Test(pool_groups, shared_state_units_and_blocks_trade_frames_under_load)
{
	bkv_pool *p = trade_pool(1), *fx = trade_pool(0);
	bkv_pool_stats st = {.size = sizeof(st)};
	uint32_t s[12], f[12], i, one;

	/* 10 sequences of 8 tokens hold 10 live states (40 frames) beside
	 * their 20 blocks: the fixed arena's 8 units refuse the ninth */
	for (i = 0; i < 10; i++) {
		cr_assert_eq(bkv_seq_open(p, &s[i]), BKV_OK);
		cr_assert_eq(trade_append(p, s[i], 8, i), BKV_OK, "shared: seq %u", i);
		cr_assert_eq(bkv_seq_open(fx, &f[i]), BKV_OK);
		cr_assert_eq(trade_append(fx, f[i], 8, i), i < 8 ? BKV_OK : BKV_ENOSPC,
			     "fixed: seq %u", i);
	}
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.state_units, 10);
	cr_assert_eq(st.state_checkpoints, 10);
	{ /* a lent frame is a state unit's, not a block */
		bkv_block_info bi = {.size = sizeof(bi)};
		int32_t in, out;

		cr_assert_eq(bkv_seq_state_frames(p, s[0], &in, &out), BKV_OK);
		cr_assert(in >= 0 && in % 4 == 0 && out == -1);
		cr_assert_eq(bkv_block_info_get(p, in + 3, &bi), BKV_EINVAL);
		cr_assert_eq(bkv_block_info_get(p, (int32_t)bkv_seq_blocks(p, s[0], &i)[0], &bi),
			     BKV_OK);
		cr_assert_eq(bi.state, BKV_BLOCK_PINNED);
	}
	trade_close_all(p, s, 10);
	trade_close_all(fx, f, 10);
	/* closed, their states are cached checkpoints still holding 40
	 * frames; a 200-token prompt (50 blocks, more than the fixed pool's
	 * 32 attention frames) takes most of them back, oldest first */
	cr_assert_eq(bkv_pool_available(p), 64);
	cr_assert_eq(bkv_seq_open(p, &one), BKV_OK);
	cr_assert_eq(trade_append(p, one, 200, 77), BKV_OK);
	bkv_pool_stats_get(p, &st);
	cr_assert_leq(st.state_units, 3);
	cr_assert_geq(st.nr_used, 50);
	cr_assert_eq(bkv_seq_open(fx, &f[0]), BKV_OK);
	cr_assert_eq(trade_append(fx, f[0], 200, 77), BKV_E2BIG); /* never fits */
	/* and back: closed, its blocks are one cached chain (every frame but
	 * the last a parent); 12 new sequences of 4 tokens take 12 units,
	 * evicting the chain in the cache's order */
	trade_close_all(p, &one, 1);
	for (i = 0; i < 12; i++) {
		cr_assert_eq(bkv_seq_open(p, &s[i]), BKV_OK);
		cr_assert_eq(trade_append(p, s[i], 4, 100 + i), BKV_OK, "again: seq %u", i);
	}
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.state_units, 12);
	/* 10 lent first, 7 given back to the long prompt, 9 lent again (the
	 * other 3 units were its checkpoints, evicted for the new states;
	 * checkpoints evicted: 1 for its own state, 7 given back, 3) */
	cr_assert_eq(p->kv.ck_lends, 19);
	cr_assert_eq(p->kv.ck_returns, 7);
	cr_assert_eq(st.state_evictions, 11, "%lu", (unsigned long)st.state_evictions);
	cr_assert_gt(st.evictions, 0, "lending evicted cached blocks");
	/* the pool is full now: a 13th sequence is refused, and nothing moved */
	cr_assert_eq(bkv_seq_open(p, &one), BKV_OK);
	cr_assert_eq(trade_append(p, one, 8, 200), BKV_ENOSPC);
	trade_close_all(p, s, 12);
	trade_close_all(p, &one, 1);
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.state_units, 0, "above a floor of 0 every unit went back");
	bkv_pool_destroy(p);
	bkv_pool_destroy(fx);
}

/* The frames of a full and a window group come from one free list: the full
 * group can hold nearly all of them while the window group holds a few, and
 * a new sequence still gets what it needs from what is free (no group has a
 * share of its own to run out of), with each group's frames counted. */
Test(pool_groups, one_group_filling_the_frames_never_stalls_the_other)
{
	static const bkv_kv_group g[2] = {
		{BKV_GROUP_FULL, 2, 0, 0, 256},
		{BKV_GROUP_WINDOW, 2, 8, 0, 256},
	};
	bkv_pool *p = make_group_pool(4, 64, 0, g, 2);
	bkv_pool_stats st;
	uint32_t a, b, hit;
	int32_t t[200];
	uint32_t i;

	for (i = 0; i < 200; i++)
		t[i] = (int32_t)(i + 1);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	for (i = 0; i < 10; i++) /* in chunks: the window releases behind */
		cr_assert_eq(bkv_seq_append(p, a, t + 16 * i, 16, &hit), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, a, t + 160, 1, &hit), BKV_OK);
	st.size = sizeof st;
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.n_groups, 2);
	cr_assert_eq(st.group_used[0], 41, "161 tokens in 4-token blocks");
	cr_assert_leq(st.group_used[1], 4, "the window's last 8 tokens");
	cr_assert_eq(st.group_used[0] + st.group_used[1], st.nr_used);
	cr_assert_eq(st.group_cached[0] + st.group_cached[1], st.nr_cached);
	cr_assert_eq(st.group_cached[0], 0);
	/* 64 - 41 - (at most 4) frames left: 12 more full blocks and the
	 * window's fit */
	for (i = 0; i < 200; i++)
		t[i] = (int32_t)(5000 + i);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	for (i = 0; i < 3; i++)
		cr_assert_eq(bkv_seq_append(p, b, t + 15 * i, 15, &hit), BKV_OK);
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.group_used[0], 53, "%u", st.group_used[0]);
	cr_assert_eq(st.group_used[0] + st.group_used[1], st.nr_used);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	bkv_pool_stats_get(p, &st);
	cr_assert_gt(st.group_cached[0], 0, "a's full blocks are cached");
	cr_assert_gt(st.group_cached[1], 0, "and its window's last blocks");
	cr_assert_eq(st.group_cached[0] + st.group_cached[1], st.nr_cached);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* A cache reset disowns the states too: a checkpoint a sequence could start
 * from before bkv_pool_reset_cache gives no hit after it (after a weight
 * update, or with the device memory released, its state is not the
 * model's), and the unreferenced ones are free units again. */
Test(pool_groups, a_cache_reset_drops_the_state_checkpoints)
{
	bkv_pool *p = trade_pool(0);
	bkv_pool_stats st = {.size = sizeof(st)};
	int32_t tok[8];
	uint32_t a, b, hit = 0, i;

	for (i = 0; i < 8; i++)
		tok[i] = (int32_t)(3 * 1000 + i);
	cr_assert_eq(bkv_seq_open(p, &a), BKV_OK);
	cr_assert_eq(trade_append(p, a, 8, 3), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, a), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, tok, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 8, "before the reset: a hit ending at the checkpoint");
	cr_assert_eq(bkv_seq_drop(p, b), BKV_OK);
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	bkv_pool_stats_get(p, &st);
	cr_assert_eq(st.state_checkpoints, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_open(p, &b), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, b, tok, 8, &hit), BKV_OK);
	cr_assert_eq(hit, 0, "after the reset: computed again");
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}
