/*
 * test_adapters.c - adapters per request (bkv_request.adapter) and the cap
 * on a call's adapters (bkv_sched_config.max_adapters): no call carries
 * more than the cap, whatever stages its rows (chunks of prompts admitted
 * earlier, swap-ins, speculation, preemption); requests of held adapters
 * pass one whose adapter has no room, for a bounded time; the prefix cache
 * never shares KV across adapters; the refusals.
 */
#include <criterion/criterion.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fakehost_sched.h"

/* Submit a request running with adapter a (cache key 0). */
static uint64_t submit_ad(fake_host *f, const int32_t *prompt, uint32_t len, uint32_t max_new,
			  uint32_t a)
{
	static const int32_t stop = FH_STOP;
	bkv_request q;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = len;
	q.max_new_tokens = max_new;
	q.stop_tokens = &stop;
	q.n_stop = 1;
	q.adapter = a;
	return fh_submit_req(f, &q);
}

/* What the calls carried, by the hook below. */
static uint32_t g_cap, g_most, g_calls_with[16];
static uint64_t g_first_call[64], g_last_call[64]; /* by request id: call numbers + 1 */
static uint32_t g_call_no;

/* Every call: its rows' distinct adapters within the cap and exactly the
 * list it gives; each row's adapter is its request's (ids name the test's
 * adapter table g_adapter). */
static uint32_t g_adapter[64];

static void hook(fake_host *f, const bkv_batch *b)
{
	uint32_t r, i, n = 0, seen[16];

	g_call_no++;
	if (!b->row_adapter) {
		f->batch_bad++;
		return;
	}
	for (r = 0; r < b->n_rows; r++) {
		uint32_t a = b->row_adapter[r];
		uint64_t id = b->row_req[r];

		if (id < 64) {
			if (a != g_adapter[id])
				f->batch_bad++;
			if (!g_first_call[id])
				g_first_call[id] = g_call_no;
			g_last_call[id] = g_call_no;
		}
		for (i = 0; a && i < n && seen[i] != a; i++)
			;
		if (a && i == n) {
			if (n == g_cap) {
				f->batch_bad++; /* one adapter more than the cap */
				return;
			}
			seen[n++] = a;
		}
	}
	if (b->n_adapters != n || (n && memcmp(b->adapters, seen, n * sizeof(uint32_t))))
		f->batch_bad++;
	g_most = n > g_most ? n : g_most;
	g_calls_with[n < 16 ? n : 15]++;
}

static void reset_log(uint32_t cap)
{
	g_cap = cap;
	g_most = 0;
	g_call_no = 0;
	memset(g_calls_with, 0, sizeof(g_calls_with));
	memset(g_first_call, 0, sizeof(g_first_call));
	memset(g_last_call, 0, sizeof(g_last_call));
	memset(g_adapter, 0, sizeof(g_adapter));
}

typedef struct mode {
	const char *name;
	uint32_t device_blocks, host_blocks, spec_k;
	bkv_preempt_mode preempt;
} mode;

/* Nine adapters under a cap of eight (sglang#23141's crash): long prompts
 * in chunks of a small budget, so prompts admitted in earlier steps keep
 * joining calls; then a pool so small that requests are preempted (by
 * recompute and by swap) and resumed, and speculation. */
Test(adapters, no_call_carries_more_adapters_than_the_cap_with_chunks_in_progress)
{
	static const mode modes[] = {
		{"ample pool", 1024, 0, 0, BKV_PREEMPT_AUTO},
		{"tiny pool, recompute", 40, 0, 0, BKV_PREEMPT_RECOMPUTE},
		{"tiny pool, swap", 40, 256, 0, BKV_PREEMPT_SWAP},
		{"speculation", 1024, 0, 3, BKV_PREEMPT_AUTO},
	};
	uint32_t m, i;

	for (m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		fh_opts o;
		fake_host *f;
		int32_t *p[40];
		bkv_sched_stats st = {.size = sizeof(st)};

		fh_opts_init(&o);
		o.block_tokens = 4;
		o.device_blocks = modes[m].device_blocks;
		o.host_blocks = modes[m].host_blocks;
		o.cfg.max_running = 24;
		o.cfg.chunked_prefill = 1;
		o.cfg.token_budget = 48;
		o.cfg.preempt = modes[m].preempt;
		o.cfg.spec_max_k = modes[m].spec_k;
		o.cfg.max_adapters = 8;
		f = fh_create(&o);
		f->batch_hook = hook;
		reset_log(8);
		for (i = 0; i < 40; i++) {
			uint32_t len = 30 + (i * 7) % 40;

			p[i] = fh_prompt(len, 100 + i);
			g_adapter[i + 1] = i % 9 + 1;
			submit_ad(f, p[i], len, 6 + i % 5, g_adapter[i + 1]);
		}
		fh_run(f, 5000);
		cr_assert_eq(f->batch_bad, 0, "%s: a call broke the cap or misreported adapters",
			     modes[m].name);
		/* (a tiny pool runs a few requests at a time) */
		cr_assert_eq(g_most, modes[m].device_blocks < 100 ? g_most : 8,
			     "%s: calls reached the cap (%u)", modes[m].name, g_most);
		cr_assert_geq(g_most, 2, "%s: calls mixed adapters", modes[m].name);
		cr_assert_eq(f->host.violations, 0, "%s: %s", modes[m].name, f->host.first);
		bkv_sched_stats_get(f->s, &st);
		cr_assert_eq(st.finished, 40, "%s: every request ended", modes[m].name);
		if (modes[m].device_blocks < 100)
			cr_assert_gt(st.preemptions, 0, "%s: the pool preempted", modes[m].name);
		for (i = 1; i <= 40; i++)
			cr_assert_eq(f->finish_count[i], 1);
		fh_destroy(f);
		for (i = 0; i < 40; i++)
			free(p[i]);
	}
}

/* One adapter slot: a request of adapter 2 waits while adapter 1 runs, and
 * the adapter-1 requests behind it are admitted past it meanwhile. */
Test(adapters, requests_of_a_held_adapter_pass_one_whose_adapter_has_no_room)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(8, 7);
	uint64_t a, b, c, d;

	fh_opts_init(&o);
	o.cfg.max_adapters = 1;
	o.cfg.adapter_wait_us = 10000000; /* never reached here */
	f = fh_create(&o);
	f->batch_hook = hook;
	reset_log(1);
	g_adapter[1] = 1, g_adapter[2] = 2, g_adapter[3] = 1, g_adapter[4] = 1;
	a = submit_ad(f, p, 8, 20, 1);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	b = submit_ad(f, p, 8, 5, 2);
	c = submit_ad(f, p, 8, 5, 1);
	d = submit_ad(f, p, 8, 5, 1);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert(g_first_call[c] && g_first_call[d], "adapter 1's requests went past");
	cr_assert_eq(g_first_call[b], 0, "adapter 2 has no room while adapter 1 runs");
	{
		bkv_sched_stats st = {.size = sizeof(st)};

		bkv_sched_stats_get(f->s, &st);
		cr_assert_eq(st.adapter_passes, 1, "b was set aside once");
	}
	fh_run(f, 1000);
	cr_assert_eq(f->batch_bad, 0);
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	cr_assert_gt(g_first_call[b], g_last_call[a], "it ran once adapter 1's requests ended");
	cr_assert_eq(f->finish_count[b], 1);
	fh_destroy(f);
	free(p);
}

/* A steady stream of adapter-1 requests would hold the one slot forever;
 * once the adapter-2 request has been passed for adapter_wait_us, nothing
 * more is admitted ahead of it, adapter 1 drains and it runs. */
Test(adapters, a_passed_request_waits_at_most_its_bound_and_one_drain)
{
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(8, 9);
	uint64_t rare = 0, enq = 0, start = 0;
	uint32_t i, passed_by = 0;
	uint64_t j;

	fh_opts_init(&o);
	o.cfg.max_adapters = 1;
	o.cfg.max_running = 4;
	o.cfg.adapter_wait_us = 5000;
	f = fh_create(&o);
	f->host.tick = 100; /* us per call */
	f->batch_hook = hook;
	reset_log(1);
	for (i = 0; i < 400 && f->host.violations == 0; i++) {
		if (i < 60) { /* two adapter-1 arrivals a step: always a backlog */
			uint64_t id = submit_ad(f, p, 8, 8, 1);

			g_adapter[id < 64 ? id : 0] = 1;
			id = submit_ad(f, p, 8, 8, 1);
			g_adapter[id < 64 ? id : 0] = 1;
		}
		if (i == 3) {
			rare = submit_ad(f, p, 8, 4, 2);
			g_adapter[rare] = 2;
			enq = f->host.now;
		}
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
		if (rare && !start && g_first_call[rare])
			start = f->host.now;
		if (!bkv_sched_pending(f->s))
			break;
	}
	cr_assert_gt(start, 0, "the rare adapter ran");
	for (j = rare + 1; j < 64; j++)
		passed_by += g_first_call[j] && g_first_call[j] < g_first_call[rare];
	cr_assert_gt(passed_by, 4, "adapter-1 requests behind it ran first (%u)", passed_by);
	/* 5000 us passed, then adapter 1's running requests (9 calls each at
	 * most, 100 us a call) end */
	cr_assert_leq(start - enq, 5000 + 12 * 100, "waited %llu us",
		      (unsigned long long)(start - enq));
	cr_assert_eq(f->batch_bad, 0);
	fh_run(f, 2000);
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	cr_assert_eq(bkv_sched_pending(f->s), 0);
	fh_destroy(f);
	free(p);
}

/* The same prompt under adapter 1, adapter 2, adapter 1 again and the base
 * model: only the second adapter-1 request hits. */
Test(adapters, the_prefix_cache_keeps_adapters_apart)
{
	static const uint32_t ads[] = {1, 2, 1, 0};
	fh_opts o;
	fake_host *f;
	int32_t *p = fh_prompt(32, 11);
	uint64_t hits[4];
	uint32_t i;

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.cfg.max_adapters = 2;
	f = fh_create(&o);
	for (i = 0; i < 4; i++) {
		bkv_sched_stats st = {.size = sizeof(st)};

		submit_ad(f, p, 32, 2, ads[i]);
		fh_run(f, 100);
		bkv_sched_stats_get(f->s, &st);
		hits[i] = st.hit_tokens;
	}
	cr_assert_eq(hits[0], 0);
	cr_assert_eq(hits[1], 0, "adapter 2 must not read adapter 1's KV");
	cr_assert_eq(hits[2] - hits[1], 28, "adapter 1 hits its own (7 full blocks)");
	cr_assert_eq(hits[3], hits[2], "the base model hits no adapter's KV");
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	/* the key, as the pool sees it */
	cr_assert_eq(bkv_adapter_cache_key(5, 0), 5);
	cr_assert_neq(bkv_adapter_cache_key(0, 1), 0);
	cr_assert_neq(bkv_adapter_cache_key(0, 1), bkv_adapter_cache_key(0, 2));
	cr_assert_neq(bkv_adapter_cache_key(5, 1), bkv_adapter_cache_key(0, 1));
	cr_assert_neq(bkv_adapter_cache_key(0, 1), 1, "not the plain key 1 of a tenant");
	fh_destroy(f);
	free(p);
}

Test(adapters, adapters_need_a_cap_and_bad_caps_are_refused)
{
	static const int32_t prompt[3] = {1, 2, 3};
	bkv_sched_stats st = {.size = sizeof(st)};
	bkv_request q;
	fh_opts o;
	fake_host *f;
	bkv_sched *s = NULL;
	uint64_t id = 0;

	fh_opts_init(&o);
	f = fh_create(&o);
	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = 3;
	q.max_new_tokens = 2;
	q.adapter = 3;
	cr_assert_eq(bkv_submit(f->s, &q, &id), BKV_EINVAL);
	cr_assert(strstr(bkv_last_error(), "max_adapters"), "%s", bkv_last_error());
	bkv_sched_stats_get(f->s, &st);
	cr_assert_eq(st.submitted, 0, "a refused request changes nothing");
	/* a caller built before the field: its adapter is 0 */
	q.size = (uint32_t)offsetof(bkv_request, adapter);
	q.user = fh_next_req(f, &q);
	cr_assert_eq(bkv_submit(f->s, &q, &id), BKV_OK);
	f->req[id].submitted = 1;
	fh_run(f, 100);
	cr_assert_eq(f->finish_count[id], 1);
	{
		bkv_host_ops ops;
		bkv_sched_config c;

		memset(&ops, 0, sizeof(ops));
		ops.forward = fh_forward;
		bkv_sched_config_init(&c);
		c.max_adapters = BKV_MAX_ADAPTERS + 1;
		cr_assert_eq(bkv_sched_create(&c, f->pool, &ops, f, NULL, &s), BKV_EINVAL);
		bkv_sched_config_init(&c);
		c.max_adapters = 2;
		c.pad0 = 1;
		cr_assert_eq(bkv_sched_create(&c, f->pool, &ops, f, NULL, &s), BKV_EINVAL);
		bkv_sched_config_init(&c);
		c.max_adapters = 2;
		c.adapter_wait_us = (1ull << 42) + 1;
		cr_assert_eq(bkv_sched_create(&c, f->pool, &ops, f, NULL, &s), BKV_EINVAL);
		cr_assert_null(s);
	}
	fh_destroy(f);
}
