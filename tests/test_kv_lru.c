/*
 * test_kv_lru.c - the LRU keeps exact release order through its chunks.
 *
 * The LRU holds cached block ids in chunks of 16 slots; a hit leaves -1
 * in its block's slot, an emptied chunk leaves the list and neighbouring
 * chunks that fit in one merge, moving blocks to new slots (kv/cache.c).
 * None of that may change the order: these tests drive a pool of
 * one-block prompts through random hits, misses with eviction and
 * releases in random order, keep the order the LRU must have (oldest
 * release first, a hit taking its block out, an eviction taking the
 * oldest), and compare it with the LRU walked through its slots after
 * every operation, with bkv_pool_check (which checks the chunks' rules)
 * passing throughout.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "internal.h"
#include "pool_util.h"

#define NB 240u
#define PROMPTS 600u
#define OPEN 12u    /* sequences open at once in run() */
#define MAXOPEN 64u /* the pool's max_seqs (pool_util.h) */
#define ALL 48u     /* blocks of the pool every block of which is hit */
#define STEPS 20000u

typedef struct model {
	bkv_pool *p;
	int32_t order[NB]; /* the LRU as it must be, oldest first */
	uint32_t n;        /* entries in order */
	uint32_t seq[MAXOPEN];
	int32_t blk[MAXOPEN]; /* the block each open sequence holds */
	uint32_t nopen;
	int32_t slot[NB];  /* a cached block's LRU slot when it was pushed */
	uint64_t moved;    /* cached blocks found at another slot (merges) */
	uint64_t rng;
} model;

static uint32_t rnd(model *m, uint32_t n)
{
	m->rng ^= m->rng << 13;
	m->rng ^= m->rng >> 7;
	m->rng ^= m->rng << 17;
	return (uint32_t)((m->rng >> 11) % n);
}

static void drop(model *m, int32_t b)
{
	uint32_t i;

	for (i = 0; i < m->n && m->order[i] != b; i++)
		;
	cr_assert_lt(i, m->n, "block %d should have been on the LRU", b);
	memmove(&m->order[i], &m->order[i + 1], (m->n - i - 1) * sizeof m->order[0]);
	m->n--;
}

static void compare(model *m)
{
	const bkv__kv *kv = &m->p->kv;
	uint32_t i = 0;
	int32_t s;

	cr_assert_eq(bkv_pool_check(m->p), 0);
	cr_assert_eq(kv->nr_cached, m->n);
	for (s = kv->lru_head; s >= 0; s = bkv__lru_next(kv, s), i++) {
		int32_t b = kv->lru[s];

		cr_assert_lt(i, m->n);
		cr_assert_eq(b, m->order[i], "LRU[%u] is %d, want %d", i, b, m->order[i]);
		if (s != m->slot[b]) {
			m->moved++;
			m->slot[b] = s;
		}
	}
	cr_assert_eq(i, m->n);
}

/* Open a sequence on prompt q: a hit takes its block off the LRU, a miss
 * in a full pool evicts the oldest. */
static void open_prompt(model *m, uint32_t q)
{
	int32_t t[4] = {(int32_t)q, 7, 8, 9}, b;
	uint64_t ev = m->p->kv.evictions;
	uint32_t hit, n, id;

	cr_assert_eq(bkv_seq_open(m->p, &id), BKV_OK);
	cr_assert_eq(bkv_seq_append(m->p, id, t, 4, &hit), BKV_OK);
	b = bkv_seq_blocks(m->p, id, &n)[0];
	if (m->p->kv.evictions != ev) {
		cr_assert_eq(hit, 0);
		cr_assert_eq(m->p->kv.evictions, ev + 1);
		cr_assert_eq(b, m->order[0], "evicted %d, the oldest is %d", b, m->order[0]);
		drop(m, b);
	} else if (hit && m->n && m->p->kv.blk[b].ref == 1) {
		drop(m, b); /* it was cached, not held by another sequence */
	}
	m->seq[m->nopen] = id;
	m->blk[m->nopen++] = b;
}

static void close_one(model *m, uint32_t i)
{
	int32_t b = m->blk[i];

	cr_assert_eq(bkv_seq_close(m->p, m->seq[i]), BKV_OK);
	if (BLOCK_IS_CACHED(&m->p->kv.blk[b])) {
		m->order[m->n++] = b;
		m->slot[b] = m->p->kv.blk[b].prev;
	}
	m->seq[i] = m->seq[--m->nopen];
	m->blk[i] = m->blk[m->nopen];
}

static void run(uint64_t seed, uint32_t hot)
{
	model m;
	uint32_t k;

	memset(&m, 0, sizeof m);
	m.rng = seed;
	m.p = make_pool(4, NB, 0, 0);
	for (k = 0; k < STEPS; k++) {
		if (m.nopen == OPEN || (m.nopen && rnd(&m, 2)))
			close_one(&m, rnd(&m, m.nopen));
		else /* hot prompts hit often and leave holes everywhere */
			open_prompt(&m, rnd(&m, 4) ? rnd(&m, hot) : rnd(&m, PROMPTS));
		compare(&m);
	}
	while (m.nopen)
		close_one(&m, 0);
	compare(&m);
	cr_assert_gt(m.p->kv.evictions, 0, "the runs must evict");
	cr_assert_gt(m.moved, 0, "the runs must merge chunks (move blocks)");
	bkv_pool_destroy(m.p);
}

Test(kv_lru, release_order_survives_hits_evictions_and_chunk_merges)
{
	run(0x9e3779b97f4a7c15ull, 200);
	run(0x2545f4914f6cdd1dull, 60);
	run(12345, NB);
}

/* Every block cached, then every one hit in random order (each held by
 * its own sequence): the chunks empty and merge down to nothing, and the
 * LRU is empty at the end. */
Test(kv_lru, hitting_every_cached_block_empties_every_chunk)
{
	model m;
	uint32_t q, perm[ALL];

	memset(&m, 0, sizeof m);
	m.rng = 77;
	m.p = make_pool(4, ALL, 0, 0);
	for (q = 0; q < ALL; q++) {
		open_prompt(&m, q);
		close_one(&m, 0);
		perm[q] = q;
	}
	compare(&m);
	cr_assert_eq(m.n, ALL);
	for (q = ALL; q > 1; q--) {
		uint32_t j = rnd(&m, q), t = perm[q - 1];

		perm[q - 1] = perm[j];
		perm[j] = t;
	}
	for (q = 0; q < ALL; q++) {
		open_prompt(&m, perm[q]);
		compare(&m);
	}
	cr_assert_eq(m.p->kv.nr_cached, 0);
	cr_assert_eq(m.p->kv.lru_first, -1);
	cr_assert_eq(m.p->kv.lru_head, -1);
	while (m.nopen)
		close_one(&m, 0);
	compare(&m);
	bkv_pool_destroy(m.p);
}
