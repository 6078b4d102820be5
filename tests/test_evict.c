/*
 * test_evict.c - eviction by value (lib/kv/value.c, lib/decide/evict.c):
 * which cached blocks survive a shortage, against LRU on the same
 * operations; the policy's life with its scheduler; and the scheduler's
 * features together (chunked prefill, shared prefixes, forks, preemption in
 * a small pool) with every invariant checked after each step.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool_util.h"
#include "support/fakehost_sched.h"

#define BT 4u
#define NB 16u

/* A chain of n blocks from token first: appended, closed, cached. */
static void cache_chain(bkv_pool *p, int32_t first, uint32_t n)
{
	int32_t t[NB * BT];
	uint32_t s, hit;

	fill_tokens(t, n * BT, first);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n * BT, &hit), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
}

/* Tokens of the chain from first the cache still holds (each look a hit,
 * which the value policy counts). */
static uint32_t chain_hits(bkv_pool *p, int32_t first, uint32_t n)
{
	int32_t t[NB * BT];
	uint32_t s, hit = 0;

	fill_tokens(t, n * BT, first);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n * BT, &hit), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	return hit;
}

/* Take n fresh blocks (evicting what the free list lacks), then drop them. */
static void pressure(bkv_pool *p, uint32_t n)
{
	int32_t t[NB * BT];
	uint32_t s, hit;

	fill_tokens(t, n * BT, 90000);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n * BT, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	cr_assert_eq(bkv_seq_drop(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
}

static bkv_pool *pool_with(double p1, int value)
{
	bkv_pool *p = make_pool(BT, NB, 0, 0);

	if (value)
		cr_assert_eq(bkv__pool_value_on(p, 1.0, p1), BKV_OK);
	return p;
}

/* A: 4 blocks hit twice, then B and C released after it, so A is the
 * oldest. 8 fresh blocks find 4 free: LRU evicts A, the value policy B
 * (A's two hits put it two classes up). */
static void reused_prefix(int value, uint32_t *a_hits, uint32_t *b_hits)
{
	bkv_pool *p = pool_with(0.0, value);

	cache_chain(p, 1000, 4);
	cr_assert_eq(chain_hits(p, 1000, 4), 16);
	cr_assert_eq(chain_hits(p, 1000, 4), 16);
	cache_chain(p, 2000, 4);
	cache_chain(p, 3000, 4);
	pressure(p, 8);
	cr_assert_eq(pool_stats(p).evictions, 4);
	*b_hits = chain_hits(p, 2000, 4);
	*a_hits = chain_hits(p, 1000, 4);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(evict, hit_history_keeps_a_reused_prefix_that_lru_evicts)
{
	uint32_t a, b;

	reused_prefix(0, &a, &b);
	cr_expect_eq(a, 0, "LRU evicts the oldest chain, reused or not");
	cr_expect_eq(b, 16);
	reused_prefix(1, &a, &b);
	cr_expect_eq(a, 16, "the reused chain is kept");
	cr_expect_eq(b, 0, "the oldest never-hit chain goes instead");
}

/* D: 8 blocks released first, S: 2 blocks after. 8 fresh blocks find 6
 * free: LRU evicts D's two deepest blocks; with a depth price the value
 * policy evicts S whole (its leaf first, then its root), though S is more
 * recent: its blocks are cheaper to recompute. */
static void deep_and_shallow(int value, uint32_t *d_hits, uint32_t *s_hits)
{
	bkv_pool *p = pool_with(1.0, value);

	cache_chain(p, 1000, 8);
	cache_chain(p, 5000, 2);
	pressure(p, 8);
	cr_assert_eq(pool_stats(p).evictions, 2);
	*s_hits = chain_hits(p, 5000, 2);
	*d_hits = chain_hits(p, 1000, 8);
	bkv_pool_destroy(p);
}

Test(evict, depth_price_keeps_the_deeper_chain)
{
	uint32_t d, s;

	deep_and_shallow(0, &d, &s);
	cr_expect_eq(d, 24, "LRU takes the deep chain's last two blocks");
	cr_expect_eq(s, 8);
	deep_and_shallow(1, &d, &s);
	cr_expect_eq(d, 32, "the deep chain is whole");
	cr_expect_eq(s, 0, "the shallow chain went, child before parent");
}

/* No depth price and no hits: every block is in class 0 in release order,
 * and the policy evicts what LRU evicts, block for block. */
Test(evict, equal_values_evict_what_lru_evicts)
{
	bkv_pool *p[2];
	uint32_t k, h[2][3];

	for (k = 0; k < 2; k++) {
		p[k] = pool_with(0.0, (int)k);
		cache_chain(p[k], 1000, 3);
		cache_chain(p[k], 2000, 2);
		cache_chain(p[k], 3000, 4);
		pressure(p[k], 10); /* 7 free: 3 evicted */
		pressure(p[k], 12); /* 7 free + the pressure's own: 2 more */
	}
	for (k = 0; k < 2; k++) {
		h[k][0] = chain_hits(p[k], 1000, 3);
		h[k][1] = chain_hits(p[k], 2000, 2);
		h[k][2] = chain_hits(p[k], 3000, 4);
	}
	cr_expect_eq(pool_stats(p[0]).evictions, pool_stats(p[1]).evictions);
	cr_expect_eq(h[0][0], h[1][0]);
	cr_expect_eq(h[0][1], h[1][1]);
	cr_expect_eq(h[0][2], h[1][2]);
	cr_expect_eq(h[0][0], 0, "the oldest chain went first");
	cr_expect_eq(h[0][2], 16, "the newest stays");
	for (k = 0; k < 2; k++)
		bkv_pool_destroy(p[k]);
}

/* A hit buys time (GreedyDual): a chain hit once (v = 2) outlasts the
 * never-hit chains released after it for two rounds of evictions, where
 * LRU would take it in the first; after many rounds the clock has passed
 * it (and its hit has decayed), and it goes before them. */
static uint32_t hit_chain_after_rounds(uint32_t rounds)
{
	bkv_pool *p = pool_with(0.0, 1);
	uint32_t i, h;

	cache_chain(p, 1000, 2);
	cr_assert_eq(chain_hits(p, 1000, 2), 8);
	cr_assert_eq(p->kv.val_mask, 1u << 2, "one hit: v = 2, class 2");
	for (i = 0; i < rounds; i++) {
		cache_chain(p, 7000 + 100 * (int32_t)i, 2); /* never hit */
		pressure(p, NB - 2);                         /* 2 evicted */
	}
	cr_assert_eq(pool_stats(p).evictions, 2 * rounds);
	h = chain_hits(p, 1000, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
	return h;
}

Test(evict, a_hit_buys_a_chain_time_that_runs_out)
{
	cr_expect_eq(hit_chain_after_rounds(1), 8, "a fresh hit keeps the chain");
	cr_expect_eq(hit_chain_after_rounds(2), 8, "for two rounds");
	cr_expect_eq(hit_chain_after_rounds(3), 0, "then the clock has passed it");
	cr_expect_eq(hit_chain_after_rounds(64), 0, "and it stays gone");
}

/* ---- with the scheduler -------------------------------------------------- */

Test(evict, value_policy_lives_and_ends_with_its_scheduler)
{
	fh_opts o;
	fake_host *f;

	fh_opts_init(&o);
	f = fh_create(&o);
	cr_expect_not_null(f->pool->kv.val, "the segmented LRU is the default: records");
	cr_expect_eq(f->pool->kv.val_seg, 1);
	fh_destroy(f);
	fh_opts_init(&o);
	o.cfg.evict = BKV_EVICT_LRU;
	f = fh_create(&o);
	cr_expect_null(f->pool->kv.val, "LRU: no records");
	fh_destroy(f);
	fh_opts_init(&o);
	o.cfg.evict = BKV_EVICT_VALUE;
	f = fh_create(&o);
	cr_assert_not_null(f->pool->kv.val);
	cr_expect_gt(f->pool->kv.val_p0, 0.0, "priced by the harness's cost model");
	fh_destroy(f); /* the pool outlives it here: the records go (ASan) */
}

Test(evict, value_policy_without_prefix_cache_is_accepted_and_inert)
{
	fh_opts o;
	fake_host *f;

	fh_opts_init(&o);
	o.prefix_cache = 0;
	o.cfg.evict = BKV_EVICT_VALUE;
	f = fh_create(&o);
	cr_expect_null(f->pool->kv.val);
	fh_destroy(f);
}

/* Chunked prefill, prompts sharing prefixes, n = 2 forks and preemption
 * in a pool that holds a few requests at a time, evicting by value: every
 * request ends once with its full output, every invariant (the pool's 18
 * included) holds after every step, and the cache both hit and evicted. */
Test(evict, chunked_prefix_forks_and_preemption_in_a_small_pool_by_value)
{
	fh_opts o;
	fake_host *f;
	int32_t *base = fh_prompt(96, 7), *pr[24];
	uint32_t i, steps;
	uint64_t id[24];
	bkv_pool_stats ps;
	bkv_sched_stats ss;

	fh_opts_init(&o);
	o.block_tokens = 8;
	o.device_blocks = 40;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 40;
	o.cfg.max_running = 6;
	o.cfg.preempt = BKV_PREEMPT_RECOMPUTE;
	o.cfg.evict = BKV_EVICT_VALUE;
	f = fh_create(&o);
	for (i = 0; i < 24; i++) {
		uint32_t len = 40 + (i * 13) % 57;

		pr[i] = fh_prompt(len, 100 + i);
		memcpy(pr[i], base, (i % 3 == 0 ? 32 : 16) * sizeof(int32_t)); /* shared heads */
		id[i] = fh_submit_ex(f, pr[i], len, 24 + (i % 5) * 8, 0, 1 + (i % 4 == 0), 0);
	}
	steps = fh_run(f, 20000);
	cr_assert_lt(steps, 20000);
	for (i = 0; i < 24; i++) {
		cr_expect_eq(f->finish_count[id[i]], 1, "request %u ended once", i);
		cr_expect_eq(f->reason[id[i]], BKV_FINISH_LENGTH);
	}
	ps = pool_stats(f->pool);
	ss.size = sizeof(ss);
	bkv_sched_stats_get(f->s, &ss);
	cr_expect_gt(ps.hit_tokens, 0);
	cr_expect_gt(ps.evictions, 0);
	cr_expect_gt(ss.preemptions, 0, "the pool is small enough to preempt (%llu evictions %llu)", (unsigned long long)ss.preemptions, (unsigned long long)ps.evictions);
	cr_expect_eq(f->host.violations, 0);
	fh_destroy(f);
	for (i = 0; i < 24; i++)
		free(pr[i]);
	free(base);
}

/* ---- prefix pins (bkv_pool_pin_prefix, lib/pool/pin.c) -------------------- */

static bkv_pool *pin_pool(uint32_t permille)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = BT;
	c.device_blocks = NB;
	c.max_seqs = 64;
	c.pin_permille = permille;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

/* S (the system prompt) is released before X, so LRU evicts S first;
 * pinned, S stays and X goes. */
static uint32_t system_prompt_after_pressure(int pinned, uint32_t *x_hits)
{
	bkv_pool *p = pin_pool(500);
	int32_t t[4 * BT];
	uint32_t pin = 0, got = 0, s;

	cache_chain(p, 1000, 4);
	cache_chain(p, 2000, 4);
	if (pinned) {
		fill_tokens(t, 4 * BT, 1000);
		cr_assert_eq(bkv_pool_pin_prefix(p, 0, t, 4 * BT + 3, &pin, &got), BKV_OK);
		cr_assert_eq(got, 4 * BT, "whole blocks only");
	}
	pressure(p, 12); /* 8 free: 4 evicted */
	*x_hits = chain_hits(p, 2000, 4);
	s = chain_hits(p, 1000, 4);
	if (pinned)
		cr_assert_eq(bkv_pool_unpin(p, pin), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
	return s;
}

Test(pin, a_pinned_system_prompt_outlives_the_eviction_that_takes_it_unpinned)
{
	uint32_t x;

	cr_expect_eq(system_prompt_after_pressure(0, &x), 0, "unpinned, LRU takes it");
	cr_expect_eq(x, 16);
	cr_expect_eq(system_prompt_after_pressure(1, &x), 16, "pinned, it stays");
	cr_expect_eq(x, 0, "the other chain went instead");
}

Test(pin, past_the_pin_share_the_pin_is_refused_and_nothing_changes)
{
	bkv_pool *p = pin_pool(250); /* 4 of 16 blocks */
	int32_t a[3 * BT], b[2 * BT];
	uint32_t pa, pb;
	bkv_pool_stats before;

	cache_chain(p, 1000, 3);
	cache_chain(p, 2000, 2);
	fill_tokens(a, 3 * BT, 1000);
	fill_tokens(b, 2 * BT, 2000);
	cr_assert_eq(bkv_pool_pin_prefix(p, 0, a, 3 * BT, &pa, NULL), BKV_OK);
	before = pool_stats(p);
	pb = 77;
	cr_expect_eq(bkv_pool_pin_prefix(p, 0, b, 2 * BT, &pb, NULL), BKV_ENOSPC);
	cr_expect_eq(pb, 77, "pin untouched on failure");
	expect_same_stats(&before, p);
	cr_expect_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_pool_unpin(p, pa), BKV_OK);
	cr_expect_eq(bkv_pool_pin_prefix(p, 0, b, 2 * BT, &pb, NULL), BKV_OK, "room again");
	cr_assert_eq(bkv_pool_unpin(p, pb), BKV_OK);
	cr_expect_eq(pool_stats(p).nr_used, 0);
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(pin, a_pin_under_one_tenant_salt_never_holds_another_tenants_blocks)
{
	bkv_pool *p = pin_pool(1000);
	int32_t t[2 * BT];
	uint32_t s, hit, pin;

	fill_tokens(t, 2 * BT, 1000);
	cr_assert_eq(bkv_seq_open_keyed(p, 0xA, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 2 * BT, &hit), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_expect_eq(bkv_pool_pin_prefix(p, 0xB, t, 2 * BT, &pin, NULL), BKV_ENOENT,
		     "the same tokens under another salt are not cached");
	cr_expect_eq(bkv_pool_pin_prefix(p, 0, t, 2 * BT, &pin, NULL), BKV_ENOENT);
	cr_assert_eq(bkv_pool_pin_prefix(p, 0xA, t, 2 * BT, &pin, NULL), BKV_OK);
	cr_expect_eq(pool_stats(p).nr_used, 2);
	cr_assert_eq(bkv_pool_unpin(p, pin), BKV_OK);
	cr_expect_eq(pool_stats(p).nr_cached, 2, "back in the cache");
	bkv_pool_destroy(p);
}

Test(pin, bad_input_gets_a_clear_error_and_changes_nothing)
{
	bkv_pool *p = pin_pool(1000), *q;
	bkv_pool_config c;
	int32_t t[2 * BT];
	uint32_t pin, s;
	bkv_pool_stats before;

	fill_tokens(t, 2 * BT, 1000);
	cr_expect_eq(bkv_pool_pin_prefix(p, 0, t, 2 * BT, &pin, NULL), BKV_ENOENT, "nothing cached");
	cache_chain(p, 1000, 2);
	before = pool_stats(p);
	cr_expect_eq(bkv_pool_pin_prefix(NULL, 0, t, 2 * BT, &pin, NULL), BKV_EINVAL);
	cr_expect_eq(bkv_pool_pin_prefix(p, 0, NULL, 2 * BT, &pin, NULL), BKV_EINVAL);
	cr_expect_eq(bkv_pool_pin_prefix(p, 0, t, 0, &pin, NULL), BKV_EINVAL);
	cr_expect_eq(bkv_pool_pin_prefix(p, 0, t, 2 * BT, NULL, NULL), BKV_EINVAL);
	cr_expect_eq(bkv_pool_pin_prefix(p, 0, t, BT - 1, &pin, NULL), BKV_ENOENT, "no whole block");
	cr_expect_eq(bkv_pool_unpin(p, 12345), BKV_ENOENT);
	cr_expect_eq(bkv_pool_unpin(NULL, 1), BKV_EINVAL);
	expect_same_stats(&before, p);
	/* a sequence is not a pin, a pin is not a sequence to close */
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_expect_eq(bkv_pool_unpin(p, s), BKV_ENOENT);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_pin_prefix(p, 0, t, 2 * BT, &pin, NULL), BKV_OK);
	cr_expect_eq(bkv_seq_close(p, pin), BKV_ENOENT);
	cr_expect_eq(bkv_seq_drop(p, pin), BKV_ENOENT);
	cr_assert_eq(bkv_pool_unpin(p, pin), BKV_OK);
	cr_expect_eq(bkv_pool_unpin(p, pin), BKV_ENOENT, "once");
	cr_expect_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
	/* the share's range; a pool without prefix cache */
	bkv_pool_config_init(&c);
	c.block_tokens = BT;
	c.device_blocks = NB;
	c.pin_permille = 1001;
	cr_expect_eq(bkv_pool_create(&c, NULL, &q), BKV_EINVAL);
	c.pin_permille = 1000;
	c.prefix_cache = 0;
	cr_assert_eq(bkv_pool_create(&c, NULL, &q), BKV_OK);
	cr_expect_eq(bkv_pool_pin_prefix(q, 0, t, 2 * BT, &pin, NULL), BKV_ESTATE);
	bkv_pool_destroy(q);
}

/* A pin's id names no sequence: every call that takes a sequence answers
 * it BKV_ENOENT (NULL or 0 where the answer is a table or a count) and
 * changes nothing - not the pinned blocks, not the pool's counters - in a
 * pool with a host tier, so that a swap could have gone through. */
Test(pin, every_sequence_call_refuses_a_pin_id_and_changes_nothing)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;
	int32_t t[2 * BT], one = 7, in, out;
	uint32_t pin, child = 99, n = 99, hit;
	bkv_pool_stats before;
	bkv_seq_info info;
	bkv_seq_image img;
	int32_t blocks[4];
	uint64_t hashes[4];
	int32_t toks[4 * BT];

	bkv_pool_config_init(&c);
	c.block_tokens = BT;
	c.device_blocks = NB;
	c.host_blocks = NB;
	c.pin_permille = 1000;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	cache_chain(p, 1000, 2);
	fill_tokens(t, 2 * BT, 1000);
	cr_assert_eq(bkv_pool_pin_prefix(p, 0, t, 2 * BT, &pin, NULL), BKV_OK);
	before = pool_stats(p);
	cr_expect_eq(bkv_seq_append(p, pin, &one, 1, &hit), BKV_ENOENT);
	cr_expect_eq(bkv_seq_append(p, pin, t, 2 * BT, &hit), BKV_ENOENT);
	cr_expect_eq(bkv_seq_blocks_needed(p, pin, 1), BKV_ENOENT);
	cr_expect_eq(bkv_seq_truncate(p, pin, 0), BKV_ENOENT);
	cr_expect_eq(bkv_seq_fork(p, pin, &child), BKV_ENOENT);
	cr_expect_eq(child, 99, "no child on failure");
	cr_expect_eq(bkv_seq_swap_out(p, pin), BKV_ENOENT);
	cr_expect_eq(bkv_seq_swap_in(p, pin), BKV_ENOENT);
	cr_expect_eq(bkv_seq_info_get(p, pin, &info), BKV_ENOENT);
	cr_expect_null(bkv_seq_blocks(p, pin, &n));
	cr_expect_eq(n, 0);
	n = 99;
	cr_expect_null(bkv_seq_group_blocks(p, pin, 0, &n));
	cr_expect_eq(n, 0);
	cr_expect_eq(bkv_seq_state_frames(p, pin, &in, &out), BKV_EINVAL, "no STATE group");
	memset(&img, 0, sizeof img);
	img.size = sizeof img;
	img.blocks = blocks;
	img.hashes = hashes;
	img.tokens = toks;
	img.cap_blocks = 4;
	img.cap_tokens = 4 * BT;
	cr_expect_eq(bkv_seq_export(p, pin, &img), BKV_ENOENT);
	cr_expect_eq(bkv_seq_close(p, pin), BKV_ENOENT);
	cr_expect_eq(bkv_seq_drop(p, pin), BKV_ENOENT);
	expect_same_stats(&before, p);
	cr_expect_eq(bkv_pool_pending_copies(p, BKV_COPY_SWAP_OUT, NULL), 0);
	cr_expect_eq(bkv_pool_pending_copies(p, BKV_COPY_DEVICE, NULL), 0);
	/* the pin still holds its blocks, and only unpin ends it */
	cr_assert_eq(bkv_pool_unpin(p, pin), BKV_OK);
	cr_expect_eq(bkv_pool_check(p), 0);
	cr_expect_eq(pool_stats(p).nr_cached, 2, "the pinned blocks went back to the cache");
	cr_expect_eq(chain_hits(p, 1000, 2), 2 * BT);
	bkv_pool_destroy(p);
}

/* A pool of 2 sequence slots and a request with two branches, which forks
 * into the second slot after its chunked prefill. Admitted, it keeps that
 * slot from pins: a pin asked for while the fork is to come is refused
 * (BKV_EAGAIN, nothing changed), the request forks and finishes, and the
 * slot can be pinned once it ended. A pin held before admission counts
 * as any open sequence: the request cannot be admitted, and with nothing
 * else running it ends once as unadmittable. */
static fake_host *fork_pin_host(int32_t *sys, uint64_t *sys_id)
{
	fh_opts o;
	fake_host *f;

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.device_blocks = 64;
	o.max_seqs = 2;
	o.pin_permille = 500;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 8;
	f = fh_create(&o);
	*sys_id = fh_submit(f, sys, 16, 2); /* computes the system prompt */
	fh_run(f, 100);
	cr_assert_eq(f->finish_count[*sys_id], 1);
	return f;
}

Test(pin, a_pin_never_takes_the_slot_an_admitted_request_forks_into)
{
	fake_host *f;
	int32_t *sys = fh_prompt(16, 21), *pr = fh_prompt(40, 22);
	uint32_t pin = 77, i;
	uint64_t sid, id;
	bkv_pool_stats before;
	bkv_sched_stats st;

	memcpy(pr, sys, 16 * sizeof(int32_t));
	/* admitted first: the pin waits for the fork */
	f = fork_pin_host(sys, &sid);
	id = fh_submit_ex(f, pr, 40, 6, 0, 2, 0);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	cr_assert_eq(pool_stats(f->pool).nr_seqs, 1, "prefilling, not forked yet");
	before = pool_stats(f->pool);
	cr_expect_eq(bkv_pool_pin_prefix(f->pool, 0, sys, 16, &pin, NULL), BKV_EAGAIN);
	cr_expect_eq(pin, 77, "pin untouched on failure");
	expect_same_stats(&before, f->pool);
	cr_expect_eq(bkv_sched_check(f->s), 0);
	cr_assert_lt(fh_run(f, 400), 400, "the request forks and ends");
	cr_expect_eq(f->finish_count[id], 1);
	cr_expect_eq(f->reason[id], BKV_FINISH_LENGTH);
	for (i = 0; i < 2; i++)
		cr_expect_eq(f->n_out[id][i], 6, "branch %u", i);
	cr_assert_eq(bkv_pool_pin_prefix(f->pool, 0, sys, 16, &pin, NULL), BKV_OK, "free again");
	cr_expect_eq(bkv_sched_check(f->s), 0);
	cr_assert_eq(bkv_pool_unpin(f->pool, pin), BKV_OK);
	fh_destroy(f);

	/* pinned first: the request never gets the slots it needs */
	f = fork_pin_host(sys, &sid);
	cr_assert_eq(bkv_pool_pin_prefix(f->pool, 0, sys, 16, &pin, NULL), BKV_OK);
	f->host.unadmittable_ok = 1;
	id = fh_submit_ex(f, pr, 40, 6, 0, 2, 0);
	cr_assert_lt(fh_run(f, 400), 400, "the request ends");
	cr_expect_eq(f->finish_count[id], 1);
	cr_expect_eq(f->reason[id], BKV_FINISH_ERROR);
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	bkv_sched_stats_get(f->s, &st);
	cr_expect_eq(st.unadmittable, 1);
	cr_assert_eq(bkv_pool_unpin(f->pool, pin), BKV_OK);
	cr_expect_eq(bkv_sched_check(f->s), 0);
	fh_destroy(f);
	free(sys);
	free(pr);
}

/* A scheduler serving requests that share a pinned system prompt in a pool
 * small enough to evict and preempt, evicting by value: every request hits
 * the pinned blocks, bkv_sched_check (which counts the pin among the pool's
 * sequences) holds after every step, and the pin outlives the run. */
Test(pin, requests_share_a_pinned_system_prompt_under_pressure)
{
	fh_opts o;
	fake_host *f;
	int32_t *sys = fh_prompt(64, 3), *pr[16];
	uint32_t i, pin, got;
	uint64_t id;
	bkv_pool_stats ps;

	fh_opts_init(&o);
	o.block_tokens = 8;
	o.device_blocks = 48;
	o.pin_permille = 200;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 48;
	o.cfg.max_running = 4;
	o.cfg.preempt = BKV_PREEMPT_RECOMPUTE;
	o.cfg.evict = BKV_EVICT_VALUE;
	f = fh_create(&o);
	id = fh_submit(f, sys, 64, 4); /* computes the system prompt */
	fh_run(f, 1000);
	cr_assert_eq(f->finish_count[id], 1);
	cr_assert_eq(bkv_pool_pin_prefix(f->pool, 0, sys, 64, &pin, &got), BKV_OK);
	cr_assert_eq(got, 64);
	for (i = 0; i < 16; i++) {
		uint32_t len = 64 + 20 + (i * 7) % 40;

		pr[i] = fh_prompt(len, 50 + i);
		memcpy(pr[i], sys, 64 * sizeof(int32_t));
		fh_submit(f, pr[i], len, 16 + (i % 4) * 8);
	}
	cr_assert_lt(fh_run(f, 20000), 20000);
	cr_expect_eq(f->finished_total, 17);
	ps = pool_stats(f->pool);
	cr_expect_geq(ps.hit_tokens, 16 * 64, "every request hit the pinned prompt");
	cr_expect_gt(ps.evictions, 0);
	cr_expect_eq(ps.nr_used, 8, "only the pin holds blocks after the run");
	cr_expect_eq(bkv_sched_check(f->s), 0);
	cr_assert_eq(bkv_pool_unpin(f->pool, pin), BKV_OK);
	cr_expect_eq(bkv_sched_check(f->s), 0);
	fh_destroy(f);
	for (i = 0; i < 16; i++)
		free(pr[i]);
	free(sys);
}
