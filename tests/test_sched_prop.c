/*
 * test_sched_prop.c - properties of the scheduler over seeded random
 * workloads, and its memory discipline.
 *
 * Conservation: random configs (policy, group, chunking, host kind, preempt
 * mode, block size), random requests (priorities, n samples, stop tokens),
 * random aborts (of live, ended and unknown ids), random host failures that
 * scribble over the KV they were given, and a pool too small for the load.
 * After every step bkv_sched_check must be clean and the fake host must have
 * seen only consistent batches; at the end every request has ended exactly
 * once, with the tokens an undisturbed run gives, and every block is free or
 * cached.
 *
 * Allocation: bkv_step allocates nothing in steady state (counting
 * allocator); every allocation failure in create and submit is a clean
 * BKV_ENOMEM.
 */
#include "fakehost_sched.h"
#include "internal.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rnd(uint64_t *s, uint32_t n)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((*s >> 33) % n);
}

/* What the seeds exercised, summed (the property must not hold vacuously). */
static uint64_t g_preempt, g_swaps, g_failed, g_aborted, g_hits, g_cow, g_spec;

static void conservation(uint64_t seed)
{
	static const uint32_t bts[] = {2, 4, 8, 16};
	fh_opts o;
	fake_host *f;
	uint64_t rng = seed * 977 + 13, srng = seed * 31 + 7, prng = seed * 53 + 3, id, last_id = 0;
	uint32_t steps = 0, to_submit = 30 + rnd(&rng, 40), i;
	int32_t *prompts[80];
	uint32_t n_prompts = 0, max_new[FH_MAX_REQ + 1] = {0}, nsamp[FH_MAX_REQ + 1] = {0};
	uint8_t aborted[FH_MAX_REQ + 1] = {0};
	bkv_sched_stats st = {.size = sizeof(st)};
	bkv_pool_stats ps = {.size = sizeof(ps)};

	fh_opts_init(&o);
	o.block_tokens = bts[rnd(&rng, 4)];
	o.device_blocks = 8 + rnd(&rng, 24);
	o.host_blocks = rnd(&rng, 2) ? 4 + rnd(&rng, 40) : 0;
	o.prefix_cache = rnd(&rng, 4) != 0;
	o.split = (int)rnd(&rng, 2);
	o.cfg.policy = rnd(&rng, 5) == 0 ? BKV_POLICY_STATIC : BKV_POLICY_CONTINUOUS;
	o.cfg.max_running = 2 + rnd(&rng, 7);
	o.cfg.admit_group = 1 + rnd(&rng, o.cfg.max_running);
	o.cfg.max_wait_us = 100 + rnd(&rng, 2000);
	o.cfg.chunked_prefill = (int)rnd(&rng, 2);
	o.cfg.token_budget = 4 + rnd(&rng, 40);
	o.cfg.preempt = (bkv_preempt_mode)(o.host_blocks ? rnd(&rng, 3) : rnd(&rng, 2));
	/* speculative decoding for half the seeds, from its own stream (the
	 * other draws, and so the seeds without it, are as before) */
	if (rnd(&srng, 2)) {
		o.cfg.spec_max_k = 1 + rnd(&srng, 8);
		o.cfg.spec_k_mode = (bkv_spec_k_mode)rnd(&srng, 2);
		o.cfg.spec_drafts = (bkv_spec_drafts)rnd(&srng, 2);
	}
	/* prefill-first steps for half the seeds, from a third stream */
	o.cfg.prefill_first = (uint32_t)rnd(&prng, 2);
	f = fh_create(&o);
	f->host.garbage = 1;
	f->host.fail_permille = rnd(&rng, 3) ? rnd(&rng, 150) : 0;
	f->host.rng = seed + 1;
	f->host.spec_accept_permille = rnd(&srng, 1001);
	f->host.spec_host_accepts = (int)rnd(&srng, 2);

	while ((to_submit || bkv_sched_pending(f->s)) && steps < 20000) {
		uint32_t k, n_sub = to_submit ? rnd(&rng, 3) : 0;
		int rc;

		for (k = 0; k < n_sub && to_submit; k++, to_submit--) {
			uint32_t n = 1 + (rnd(&rng, 4) == 0 ? rnd(&rng, 3) : 0);
			uint32_t cap, len, gen;

			n = BKV_MIN(n, o.cfg.max_running);
			/* n whole histories must fit (else E2BIG) */
			cap = o.device_blocks / n * o.block_tokens;
			len = 1 + rnd(&rng, BKV_MIN(40u, cap / 2));
			gen = 1 + rnd(&rng, BKV_MIN(30u, cap - len));
			/* reuse prompts so the prefix cache has something to hit */
			if (n_prompts < 80 && (n_prompts == 0 || rnd(&rng, 3)))
				{
				prompts[n_prompts] = fh_prompt(40, seed * 100 + n_prompts);
				n_prompts++;
			}
			id = fh_submit_ex(f, prompts[rnd(&rng, n_prompts)], len, gen,
					  (int32_t)rnd(&rng, 3), n,
					  rnd(&rng, 4) == 0 ? 1 + rnd(&rng, gen) : 0);
			max_new[id] = gen;
			nsamp[id] = n;
			last_id = id;
		}
		for (k = rnd(&rng, 4) == 0 ? 1 + rnd(&rng, 2) : 0; k > 0 && last_id; k--) {
			uint64_t victim = 1 + rnd(&rng, (uint32_t)last_id + 3);

			rc = bkv_abort(f->s, victim);
			cr_assert(rc == BKV_OK || rc == BKV_ENOENT);
			if (rc == BKV_OK) {
				cr_assert(victim <= last_id);
				cr_assert_eq(f->finish_count[victim], 0, "abort OK for an ended request");
				aborted[victim] = 1;
			} else if (victim <= last_id) {
				cr_assert(f->finish_count[victim] == 1 || aborted[victim]);
			}
		}
		rc = bkv_step(f->s, NULL);
		cr_assert(rc == BKV_OK || rc == BKV_EHOST, "seed %llu: %s",
			  (unsigned long long)seed, bkv_strerror(rc));
		rc = bkv_sched_check(f->s);
		cr_assert_eq(rc, 0, "seed %llu step %u: check %d", (unsigned long long)seed, steps, rc);
		cr_assert_eq(f->host.violations, 0, "seed %llu step %u: %s", (unsigned long long)seed, steps,
			     f->host.first);
		steps++;
	}
	cr_assert_eq(bkv_sched_pending(f->s), 0, "seed %llu: %llu pending after %u steps",
		     (unsigned long long)seed, (unsigned long long)bkv_sched_pending(f->s), steps);
	for (id = 1; id <= last_id; id++) {
		uint32_t b;

		cr_assert_eq(f->finish_count[id], 1, "seed %llu: request %llu ended %u times",
			     (unsigned long long)seed, (unsigned long long)id, f->finish_count[id]);
		if (aborted[id])
			cr_assert_eq(f->reason[id], BKV_FINISH_ABORT);
		for (b = 0; b < nsamp[id]; b++) {
			uint32_t got = f->n_out[id][b];

			cr_assert(got <= max_new[id]);
			if (f->reason[id] == BKV_FINISH_LENGTH && nsamp[id] == 1)
				cr_assert_eq(got, max_new[id]);
			if (f->reason[id] == BKV_FINISH_STOP && nsamp[id] == 1)
				cr_assert_eq(f->out[id][b][got - 1], FH_STOP);
		}
	}
	bkv_sched_stats_get(f->s, &st);
	cr_assert_eq(st.finished, last_id);
	cr_assert_eq(st.submitted, last_id);
	g_preempt += st.preemptions;
	g_swaps += st.swaps;
	g_failed += st.failed_steps;
	g_aborted += st.aborted;
	g_hits += st.hit_tokens;
	g_spec += st.spec_accepted;
	cr_assert_eq(st.spec_accepted, f->host.spec_accepted, "seed %llu: library and host agree",
		     (unsigned long long)seed);
	bkv_pool_stats_get(f->pool, &ps);
	g_cow += ps.cow_copies;
	cr_assert_eq(ps.nr_used, 0, "seed %llu: %u blocks used", (unsigned long long)seed, ps.nr_used);
	cr_assert_eq(ps.nr_free + ps.nr_cached, ps.device_blocks);
	cr_assert_eq(ps.nr_seqs, 0);
	cr_assert_eq(bkv_pool_check(f->pool), 0);
	fh_destroy(f);
	for (i = 0; i < n_prompts; i++)
		free(prompts[i]);
}

Test(sched_prop, every_request_ends_once_and_every_block_returns_seeds_0_to_59)
{
	uint64_t seed;

	for (seed = 0; seed < 60; seed++)
		conservation(seed);
	cr_log_info("preemptions %llu (swaps %llu), failed steps %llu, aborts %llu, "
		    "hit tokens %llu, CoW copies %llu, accepted drafts %llu",
		    (unsigned long long)g_preempt, (unsigned long long)g_swaps,
		    (unsigned long long)g_failed, (unsigned long long)g_aborted,
		    (unsigned long long)g_hits, (unsigned long long)g_cow,
		    (unsigned long long)g_spec);
	cr_expect(g_preempt > 100 && g_swaps > 10 && g_failed > 100 && g_aborted > 50 &&
		  g_hits > 0 && g_cow > 0 && g_spec > 100);
}

/* ---- allocation discipline ----------------------------------------------- */

typedef struct counting {
	uint64_t allocs;  /* alloc + realloc calls */
	uint64_t fail_at; /* fail the call with this number (1-based); 0 never */
	uint64_t live;    /* bytes outstanding */
} counting;

static void *c_alloc(void *ud, size_t size)
{
	counting *c = ud;

	if (++c->allocs == c->fail_at)
		return NULL;
	c->live += size;
	return malloc(size);
}

static void *c_realloc(void *ud, void *p, size_t old, size_t size)
{
	counting *c = ud;
	void *q;

	if (++c->allocs == c->fail_at)
		return NULL;
	q = realloc(p, size);
	if (q)
		c->live = c->live - old + size;
	return q;
}

static void c_free(void *ud, void *p, size_t size)
{
	counting *c = ud;

	if (p)
		c->live -= size;
	free(p);
}

static void steady_state(uint32_t spec_k, bkv_spec_drafts drafts)
{
	counting cs = {0}, cp = {0};
	bkv_allocator as = {c_alloc, c_realloc, c_free, &cs};
	bkv_allocator ap = {c_alloc, c_realloc, c_free, &cp};
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(40, 1);
	uint64_t rng = 5, step_allocs_s = 0, step_allocs_p = 0;
	uint32_t i;

	fh_opts_init(&o);
	o.block_tokens = 8;
	o.device_blocks = spec_k ? 100 : 40; /* tight: preemptions happen in steady
						 state (with drafts, room for some:
						 they give way to memory pressure) */
	o.max_seqs = 20;      /* slots are reused oldest first: all warm soon */
	o.cfg.max_running = 16;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 64;
	o.sched_alloc = &as;
	o.pool_alloc = &ap;
	o.cfg.spec_max_k = spec_k;
	o.cfg.spec_drafts = drafts;
	f = fh_create(&o);
	f->host.spec_accept_permille = 600;
	for (i = 0; i < 3000; i++) {
		uint64_t s0, p0;

		/* a new request now and then, submitted outside the step */
		if (bkv_sched_pending(f->s) < 24)
			fh_submit(f, p, 1 + rnd(&rng, 34), 1 + rnd(&rng, 30)); /* <= 8 blocks */
		s0 = cs.allocs;
		p0 = cp.allocs;
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
		if (i >= 1000) { /* warm: block tables and copy lists have grown */
			step_allocs_s += cs.allocs - s0;
			step_allocs_p += cp.allocs - p0;
		}
	}
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	cr_expect_eq(step_allocs_s, 0, "bkv_step allocated %llu times (scheduler)",
		     (unsigned long long)step_allocs_s);
	cr_expect_eq(step_allocs_p, 0, "bkv_step allocated %llu times (pool)",
		     (unsigned long long)step_allocs_p);
	cr_expect(f->finished_total > 500);
	{
		bkv_sched_stats st = {.size = sizeof(st)};

		bkv_sched_stats_get(f->s, &st);
		cr_expect(spec_k || st.preemptions > 10, "steady state includes preemption: %llu",
			  (unsigned long long)st.preemptions);
	}
	if (spec_k && drafts == BKV_SPEC_DRAFT_HOST) { /* (the fake host's tokens
							    give n-grams little to find;
							    the lookup runs all the same) */
		bkv_sched_stats st = {.size = sizeof(st)};

		bkv_sched_stats_get(f->s, &st);
		cr_expect(st.spec_rows > 100, "speculated rows: %llu",
			  (unsigned long long)st.spec_rows);
	}
	fh_destroy(f);
	cr_expect_eq(cs.live, 0, "scheduler memory all returned");
	free(p);
}

Test(sched_prop, steady_state_steps_allocate_nothing)
{
	steady_state(0, BKV_SPEC_DRAFT_NGRAM);
}

Test(sched_prop, steady_state_speculative_steps_allocate_nothing)
{
	steady_state(6, BKV_SPEC_DRAFT_HOST);
	steady_state(6, BKV_SPEC_DRAFT_NGRAM);
}

static int noop_fw(void *h, const bkv_batch *b, int32_t *n)
{
	(void)h;
	(void)b;
	(void)n;
	return 0;
}

Test(sched_prop, every_allocation_failure_in_create_and_submit_is_clean_enomem)
{
	bkv_pool_config pc;
	bkv_pool *pool;
	bkv_sched_config sc;
	bkv_host_ops ops = {.forward = noop_fw};
	counting c = {0};
	bkv_allocator a = {c_alloc, c_realloc, c_free, &c};
	bkv_sched *s;
	uint64_t n, total;
	int32_t prompt[600];
	bkv_request q;
	uint32_t i;

	for (i = 0; i < 600; i++)
		prompt[i] = (int32_t)i;
	bkv_pool_config_init(&pc);
	pc.device_blocks = 4096;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&sc);
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, NULL, &a, &s), BKV_OK);
	total = c.allocs;
	bkv_sched_destroy(s);
	cr_assert_eq(c.live, 0);
	for (n = 1; n <= total; n++) {
		c.allocs = 0;
		c.fail_at = n;
		s = (bkv_sched *)0x1;
		cr_assert_eq(bkv_sched_create(&sc, pool, &ops, NULL, &a, &s), BKV_ENOMEM,
			     "allocation %llu", (unsigned long long)n);
		cr_assert_eq(s, (bkv_sched *)0x1);
		cr_assert_eq(c.live, 0, "allocation %llu leaked", (unsigned long long)n);
	}
	/* submit: the request, a map growth, a larger set of batch arrays */
	c.fail_at = 0;
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, NULL, &a, &s), BKV_OK);
	bkv_request_init(&q);
	q.prompt = prompt;
	q.max_new_tokens = 10;
	for (i = 0; i < 100; i++) {
		uint64_t id = 0, before;

		q.prompt_len = 1 + i * 6; /* growing: the batch arrays must grow */
		before = bkv_sched_pending(s);
		c.allocs = 0;
		c.fail_at = 1 + i % 3;
		if (bkv_submit(s, &q, &id) == BKV_ENOMEM) {
			cr_assert_eq(bkv_sched_pending(s), before);
			cr_assert_eq(id, 0);
		}
		c.fail_at = 0;
		cr_assert_eq(bkv_submit(s, &q, &id), BKV_OK);
		cr_assert_neq(id, 0);
		cr_assert_eq(bkv_sched_check(s), 0);
	}
	cr_assert_eq(bkv_step(s, NULL), BKV_OK); /* the spare arrays swap in */
	cr_assert_eq(bkv_sched_check(s), 0);
	bkv_sched_destroy(s);
	cr_assert_eq(c.live, 0);
	bkv_pool_destroy(pool);
}
