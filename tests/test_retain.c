/*
 * test_retain.c - retention from the request (bkv_request.retention,
 * lib/pool/retain.c, kv/value.c's priorities): a prompt range given a high
 * priority outlives churn that plain LRU evicts it in; its duration returns
 * it to the default; a low priority goes first; tenants' salts keep their
 * blocks apart; bad ranges are refused and change nothing; and the
 * scheduler's features together (chunked prefill, shared prefixes, forks,
 * preemption in a small pool) with ranges, under both eviction policies.
 */
#include <criterion/criterion.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool_util.h"
#include "support/fakehost_sched.h"

#define BT 4u
#define NB 16u

/* ---- the pool alone ------------------------------------------------------- */

/* A chain of n blocks from token first, given priority prio (none when
 * prio < 0) over its whole length, then closed into the cache. */
static void cache_chain_prio(bkv_pool *p, int32_t first, uint32_t n, int prio, uint64_t dur)
{
	int32_t t[NB * BT];
	uint32_t s, hit;
	bkv_retention_range r = {0, n * BT, prio < 0 ? 0u : (uint32_t)prio, 0, dur};

	fill_tokens(t, n * BT, first);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n * BT, &hit), BKV_OK);
	if (prio >= 0)
		bkv__pool_seq_retain(p, s, &r, 1, p->kv.val_now);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
}

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

static void pressure(bkv_pool *p, uint32_t n)
{
	int32_t t[NB * BT];
	uint32_t s, hit;

	fill_tokens(t, n * BT, 90000);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n * BT, &hit), BKV_OK);
	cr_assert_eq(bkv_seq_drop(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
}

static bkv_pool *band_pool(int on)
{
	bkv_pool *p = make_pool(BT, NB, 0, 0);

	if (on)
		cr_assert_eq(bkv__pool_retain_on(p, BKV__RET_BANDS), BKV_OK);
	return p;
}

static void band_pool_done(bkv_pool *p, int on)
{
	cr_assert_eq(bkv_pool_check(p), 0);
	if (on)
		bkv__pool_retain_off(p, BKV__RET_BANDS);
	cr_expect_null(p->kv.val_exp);
	cr_expect_null(p->kv.val, "retention's records go with it");
	bkv_pool_destroy(p);
}

/* S (4 blocks, priority 90) is released before X (4, no range): LRU
 * evicts S first; by bands S stays and X goes. */
Test(retain, a_high_priority_chain_outlives_the_eviction_lru_makes)
{
	for (int on = 0; on < 2; on++) {
		bkv_pool *p = band_pool(on);

		cache_chain_prio(p, 1000, 4, 90, 0);
		cache_chain_prio(p, 2000, 4, -1, 0);
		pressure(p, 12); /* 8 free: 4 evicted */
		cr_assert_eq(pool_stats(p).evictions, 4);
		if (on) {
			cr_expect_eq(chain_hits(p, 1000, 4), 16, "the kept range is whole");
			cr_expect_eq(chain_hits(p, 2000, 4), 0);
		} else {
			cr_expect_eq(chain_hits(p, 2000, 4), 16);
			cr_expect_eq(chain_hits(p, 1000, 4), 0, "plain LRU: oldest first");
		}
		band_pool_done(p, on);
	}
}

/* A low priority (10) goes before the default even when it is more
 * recent. */
Test(retain, a_low_priority_chain_goes_before_older_default_ones)
{
	bkv_pool *p = band_pool(1);

	cache_chain_prio(p, 1000, 4, -1, 0);
	cache_chain_prio(p, 2000, 4, 10, 0);
	pressure(p, 12);
	cr_expect_eq(chain_hits(p, 1000, 4), 16);
	cr_expect_eq(chain_hits(p, 2000, 4), 0);
	band_pool_done(p, 1);
}

/* A range with a duration counts as the default once the clock passes it:
 * S (priority 90 for 50 us) beats X (priority 60, no expiry) until then,
 * and loses to it after. */
Test(retain, an_expired_priority_decays_to_the_default)
{
	for (int expire = 0; expire < 2; expire++) {
		bkv_pool *p = band_pool(1);

		bkv__pool_retain_now(p, 1000);
		cache_chain_prio(p, 1000, 4, 90, 50);
		cache_chain_prio(p, 2000, 4, 60, 0);
		bkv__pool_retain_now(p, expire ? 1050 : 1049);
		pressure(p, 12); /* 4 evicted */
		cr_expect_eq(chain_hits(p, 1000, 4), expire ? 0 : 16, "expired %d", expire);
		cr_expect_eq(chain_hits(p, 2000, 4), expire ? 16 : 0, "expired %d", expire);
		band_pool_done(p, 1);
	}
}

/* Equal priorities everywhere (no ranges): bands evict what LRU evicts. */
Test(retain, bands_without_ranges_evict_what_lru_evicts)
{
	uint32_t h[2][3];

	for (int on = 0; on < 2; on++) {
		bkv_pool *p = band_pool(on);

		cache_chain_prio(p, 1000, 3, -1, 0);
		cache_chain_prio(p, 2000, 2, -1, 0);
		cache_chain_prio(p, 3000, 4, -1, 0);
		pressure(p, 12);
		h[on][0] = chain_hits(p, 1000, 3);
		h[on][1] = chain_hits(p, 2000, 2);
		h[on][2] = chain_hits(p, 3000, 4);
		band_pool_done(p, on);
	}
	cr_expect_eq(memcmp(h[0], h[1], sizeof(h[0])), 0);
}

/* The checker sees a priority out of scale. */
Test(retain, the_checker_catches_a_priority_past_the_scale)
{
	bkv_pool *p = band_pool(1);

	cache_chain_prio(p, 1000, 2, 90, 0);
	cr_assert_eq(bkv_pool_check(p), 0);
	p->kv.val[p->kv.lru[p->kv.lru_head]].rprio = BKV_RETENTION_PRIORITY_MAX + 2;
	cr_expect_neq(bkv_pool_check(p), 0);
	p->kv.val[p->kv.lru[p->kv.lru_head]].rprio = 1;
	band_pool_done(p, 1);
}

/* ---- with the scheduler -------------------------------------------------- */

static uint64_t submit_ret(fake_host *f, const int32_t *pr, uint32_t len, uint32_t max_new,
			   uint64_t key, uint32_t n, const bkv_retention_range *r, uint32_t nr)
{
	bkv_request q;
	uint64_t id = 0;
	int rc;

	bkv_request_init(&q);
	q.prompt = pr;
	q.prompt_len = len;
	q.max_new_tokens = max_new;
	q.cache_key = key;
	q.n = n;
	q.retention = r;
	q.n_retention = nr;
	q.user = fh_next_req(f, &q);
	rc = bkv_submit(f->s, &q, &id);
	cr_assert_eq(rc, BKV_OK, "submit: %s", bkv_strerror(rc));
	f->req[id].submitted = 1;
	return id;
}

static fake_host *small_host(uint32_t retention, bkv_evict_policy ev)
{
	fh_opts o;

	fh_opts_init(&o);
	o.block_tokens = 8;
	o.device_blocks = 32;
	o.cfg.max_running = 2;
	o.cfg.retention = retention;
	o.cfg.evict = ev;
	return fh_create(&o);
}

/* Prompt tokens the pool served from the cache while fn's requests ran. */
static uint64_t hits_of(fake_host *f, const int32_t *pr, uint32_t len, uint64_t key)
{
	uint64_t before = pool_stats(f->pool).hit_tokens;

	submit_ret(f, pr, len, 2, key, 1, NULL, 0);
	cr_assert_lt(fh_run(f, 5000), 5000);
	return pool_stats(f->pool).hit_tokens - before;
}

/* Churn: 12 requests of 64 distinct prompt tokens (8 blocks each) through
 * a 32-block pool. */
static void churn(fake_host *f, int32_t **keep)
{
	for (uint32_t i = 0; i < 12; i++) {
		keep[i] = fh_prompt(64, 500 + i);
		submit_ret(f, keep[i], 64, 4, 0, 1, NULL, 0);
	}
	cr_assert_lt(fh_run(f, 20000), 20000);
}

/* The system prompt (its first 32 tokens, 4 blocks) given priority 80 by
 * the request that computed it: after churn a request with the same
 * system prompt hits it whole, where plain LRU (no range) evicted it; the
 * same under the value policy, where the priority multiplies the value. */
static uint64_t system_prompt_hits(uint32_t retention, bkv_evict_policy ev, uint32_t prio,
				   uint64_t dur)
{
	fake_host *f = small_host(retention, ev);
	int32_t *sys = fh_prompt(40, 7), *ch[12];
	bkv_retention_range r = {0, 32, prio, 0, dur};
	uint64_t h;

	submit_ret(f, sys, 40, 4, 0, 1, retention ? &r : NULL, retention ? 1 : 0);
	cr_assert_lt(fh_run(f, 5000), 5000);
	churn(f, ch);
	h = hits_of(f, sys, 40, 0);
	cr_expect_eq(f->host.violations, 0);
	cr_expect_eq(bkv_sched_check(f->s), 0);
	fh_destroy(f);
	for (int i = 0; i < 12; i++)
		free(ch[i]);
	free(sys);
	return h;
}

Test(retain, a_high_priority_system_prompt_survives_churn_that_lru_evicts)
{
	cr_expect_eq(system_prompt_hits(0, BKV_EVICT_LRU, 0, 0), 0, "plain LRU evicts it");
	cr_expect_eq(system_prompt_hits(1, BKV_EVICT_LRU, 35, 0), 0, "the default is LRU");
	cr_expect_eq(system_prompt_hits(1, BKV_EVICT_LRU, 80, 0), 32, "priority 80 keeps it");
	cr_expect_eq(system_prompt_hits(0, BKV_EVICT_VALUE, 0, 0), 0, "by value it goes too");
	cr_expect_eq(system_prompt_hits(1, BKV_EVICT_VALUE, 100, 0), 32,
		     "priority 100 keeps it by value");
}

/* A duration shorter than the churn (the harness's clock ticks 100 us a
 * call): the priority has decayed by the time the churn evicts. */
Test(retain, a_priority_whose_duration_ran_out_is_evicted_like_the_default)
{
	cr_expect_eq(system_prompt_hits(1, BKV_EVICT_LRU, 80, 200), 0);
	cr_expect_eq(system_prompt_hits(1, BKV_EVICT_LRU, 80, 100000000), 32);
}

/* Tenant 1 keeps its system prompt by priority; tenant 2's copy of the
 * same tokens (another salt) is other blocks, hit by neither, and evicted
 * by the churn. */
Test(retain, tenants_salts_keep_priorities_apart)
{
	fake_host *f = small_host(1, BKV_EVICT_LRU);
	int32_t *sys = fh_prompt(40, 7), *ch[12];
	bkv_retention_range r = {0, 32, 90, 0, 0};
	uint64_t before = pool_stats(f->pool).hit_tokens;

	submit_ret(f, sys, 40, 4, 1, 1, &r, 1);
	cr_assert_lt(fh_run(f, 5000), 5000);
	submit_ret(f, sys, 40, 4, 2, 1, NULL, 0);
	cr_assert_lt(fh_run(f, 5000), 5000);
	cr_expect_eq(pool_stats(f->pool).hit_tokens, before, "another salt never hits");
	churn(f, ch);
	cr_expect_eq(hits_of(f, sys, 40, 1), 32, "tenant 1's priority kept its blocks");
	cr_expect_eq(hits_of(f, sys, 40, 2), 0, "tenant 2's went");
	cr_expect_eq(bkv_sched_check(f->s), 0);
	fh_destroy(f);
	for (int i = 0; i < 12; i++)
		free(ch[i]);
	free(sys);
}

/* Overlapping, out-of-range, reversed, past-the-scale or too many ranges,
 * a NULL array, a padding word set, or ranges on a scheduler without
 * retention: BKV_EINVAL and nothing queued. A caller whose size ends before
 * the ranges (an older struct) submits as before. */
Test(retain, bad_ranges_are_refused_and_change_nothing)
{
	fake_host *f = small_host(1, BKV_EVICT_LRU), *g = small_host(0, BKV_EVICT_LRU);
	int32_t *pr = fh_prompt(40, 3);
	bkv_retention_range ok = {0, 8, 50, 0, 0};
	bkv_retention_range bad[][2] = {
		{{0, 16, 50, 0, 0}, {8, 24, 50, 0, 0}}, /* overlap */
		{{0, 41, 50, 0, 0}, {0, 0, 0, 0, 0}},   /* past the prompt */
		{{8, 8, 50, 0, 0}, {0, 0, 0, 0, 0}},    /* empty */
		{{9, 8, 50, 0, 0}, {0, 0, 0, 0, 0}},    /* reversed */
		{{0, 8, 101, 0, 0}, {0, 0, 0, 0, 0}},   /* past the scale */
		{{0, 8, 50, 1, 0}, {0, 0, 0, 0, 0}},    /* pad set */
	};
	bkv_retention_range many[BKV_RETENTION_MAX_RANGES + 1];
	bkv_request q;
	uint64_t id = 0;

	bkv_request_init(&q);
	q.prompt = pr;
	q.prompt_len = 40;
	q.max_new_tokens = 2;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		q.retention = bad[i];
		q.n_retention = bad[i][1].token_end ? 2 : 1;
		cr_expect_eq(bkv_submit(f->s, &q, &id), BKV_EINVAL, "case %zu", i);
	}
	for (uint32_t i = 0; i <= BKV_RETENTION_MAX_RANGES; i++)
		many[i] = (bkv_retention_range){i * 2, i * 2 + 1, 40, 0, 0};
	q.retention = many;
	q.n_retention = BKV_RETENTION_MAX_RANGES + 1;
	cr_expect_eq(bkv_submit(f->s, &q, &id), BKV_EINVAL, "too many");
	q.retention = NULL;
	q.n_retention = 1;
	cr_expect_eq(bkv_submit(f->s, &q, &id), BKV_EINVAL, "NULL array");
	q.retention = &ok;
	cr_expect_eq(bkv_submit(g->s, &q, &id), BKV_EINVAL, "retention off");
	cr_expect_eq(bkv_sched_pending(f->s), 0);
	cr_expect_eq(bkv_sched_pending(g->s), 0);
	q.retention = many;
	q.n_retention = BKV_RETENTION_MAX_RANGES; /* the most, none overlapping */
	q.user = fh_next_req(f, &q);
	cr_expect_eq(bkv_submit(f->s, &q, &id), BKV_OK);
	f->req[id].submitted = 1;
	cr_assert_lt(fh_run(f, 1000), 1000);
	cr_expect_eq(f->finish_count[id], 1);
	q.user = NULL;
	/* the size convention: an old caller's struct ends at user */
	q.size = (uint32_t)offsetof(bkv_request, retention);
	q.retention = bad[0];
	q.n_retention = 2;
	q.user = fh_next_req(g, &q);
	cr_expect_eq(bkv_submit(g->s, &q, &id), BKV_OK, "the ranges are not read");
	g->req[id].submitted = 1;
	cr_assert_lt(fh_run(g, 1000), 1000);
	cr_expect_eq(g->finish_count[id], 1);
	fh_destroy(f);
	fh_destroy(g);
	free(pr);
}

/* Chunked prefill, prompts sharing prefixes given priorities (some with
 * durations), n = 2 forks and preemption in a small pool, under LRU bands
 * and by value: every request ends once with its full output, every
 * invariant holds after every step, the cache hit and evicted. */
static void features_together(bkv_evict_policy ev)
{
	fh_opts o;
	fake_host *f;
	int32_t *base = fh_prompt(96, 7), *pr[24];
	uint32_t i;
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
	o.cfg.evict = ev;
	o.cfg.retention = 1;
	f = fh_create(&o);
	for (i = 0; i < 24; i++) {
		uint32_t len = 40 + (i * 13) % 57, head = i % 3 == 0 ? 32 : 16;
		bkv_retention_range r[2] = {{0, head, 60 + i, 0, i % 2 ? 300u * i : 0},
					    {head + 1, len, i % 4 * 10, 0, 0}};

		pr[i] = fh_prompt(len, 100 + i);
		memcpy(pr[i], base, head * sizeof(int32_t)); /* shared heads */
		id[i] = submit_ret(f, pr[i], len, 24 + (i % 5) * 8, 0, 1 + (i % 4 == 0), r,
				   1 + (i % 2));
	}
	cr_assert_lt(fh_run(f, 20000), 20000);
	for (i = 0; i < 24; i++) {
		cr_expect_eq(f->finish_count[id[i]], 1, "request %u ended once", i);
		cr_expect_eq(f->reason[id[i]], BKV_FINISH_LENGTH);
	}
	ps = pool_stats(f->pool);
	ss.size = sizeof(ss);
	bkv_sched_stats_get(f->s, &ss);
	cr_expect_gt(ps.hit_tokens, 0);
	cr_expect_gt(ps.evictions, 0);
	cr_expect_gt(ss.preemptions, 0);
	cr_expect_eq(f->host.violations, 0);
	cr_expect_eq(bkv_sched_check(f->s), 0);
	fh_destroy(f);
	for (i = 0; i < 24; i++)
		free(pr[i]);
	free(base);
}

Test(retain, chunked_prefix_forks_and_preemption_with_ranges_under_lru_bands)
{
	features_together(BKV_EVICT_LRU);
}

Test(retain, chunked_prefix_forks_and_preemption_with_ranges_by_value)
{
	features_together(BKV_EVICT_VALUE);
}
