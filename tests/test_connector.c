/*
 * test_connector.c - the KV connector stage (bkv_sched_config.connector)
 * against an in-memory store that moves the fake host's KV cells: what one
 * engine saves, another loads instead of computing, and the host's cell
 * check catches any wrong, missing or early KV. Transfers complete inline
 * (inside the call) or later (queued, completed between steps by the test,
 * in an order it chooses), with failures and lookups answered later.
 */
#define _POSIX_C_SOURCE 200809L
#include "support/fakehost_sched.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_CAP 4096u  /* blocks the store holds */
#define Q_CAP 4096u   /* transfers queued */
#define BT 16u

typedef struct st_block {
	uint64_t hash;         /* key; 0: empty */
	uint64_t cell[BT];     /* the block's KV cells */
} st_block;

typedef struct st_xfer {
	uint64_t id;                      /* transfer id */
	const bkv_kv_xfer_block *b;       /* its blocks */
	uint32_t n;                       /* entries */
	int load;                         /* load or save */
} st_xfer;

typedef struct store {
	st_block blk[ST_CAP];  /* open addressing by hash */
	fake_host *f;          /* the engine it serves now */
	int inline_done;       /* complete inside the call */
	uint32_t later_asks;   /* lookups answer LATER this many times each */
	uint32_t asks;         /* lookups so far */
	uint64_t fail_hash;    /* a block whose load fails (0: none) */
	st_xfer q[Q_CAP];      /* queued transfers */
	uint32_t nq;           /* entries */
	uint64_t loads, saves, load_blocks; /* what it was asked */
} store;

static st_block *st_find(store *st, uint64_t h, int make)
{
	uint32_t i = (uint32_t)(h % ST_CAP), k;

	for (k = 0; k < ST_CAP; k++, i = (i + 1) % ST_CAP) {
		if (st->blk[i].hash == h)
			return &st->blk[i];
		if (!st->blk[i].hash) {
			if (!make)
				return NULL;
			st->blk[i].hash = h;
			return &st->blk[i];
		}
	}
	return NULL;
}

/* Move the cells and complete the transfer. */
static void st_run(store *st, const st_xfer *x)
{
	uint32_t failed[256], nf = 0, i;
	uint64_t *dev = st->f->host.dev;

	for (i = 0; i < x->n; i++) {
		const bkv_kv_xfer_block *b = &x->b[i];
		st_block *sb;

		cr_assert_eq(b->frames, 1, "attention blocks only here");
		if (x->load) {
			sb = st_find(st, b->hash, 0);
			if (!sb || b->hash == st->fail_hash) {
				failed[nf++] = i;
				continue;
			}
			memcpy(&dev[(size_t)b->block * BT], sb->cell, sizeof(sb->cell));
		} else {
			sb = st_find(st, b->hash, 1);
			cr_assert(sb);
			memcpy(sb->cell, &dev[(size_t)b->block * BT], sizeof(sb->cell));
		}
	}
	cr_assert_eq(bkv_kv_xfer_done(st->f->s, x->id, BKV_OK, failed, nf), BKV_OK);
}

static int st_lookup(void *user, uint64_t req, const uint64_t *h, uint32_t n)
{
	store *st = user;
	uint32_t i;

	(void)req;
	if (st->later_asks && st->asks++ % (st->later_asks + 1) != st->later_asks)
		return BKV_CONNECTOR_LATER;
	for (i = 0; i < n && st_find(st, h[i], 0); i++)
		;
	return (int)i;
}

static int st_contains(void *user, uint64_t h)
{
	return st_find(user, h, 0) != NULL;
}

static int st_xfer_start(store *st, uint64_t id, const bkv_kv_xfer_block *b, uint32_t n, int load)
{
	st_xfer x = {id, b, n, load};

	if (st->inline_done) {
		st_run(st, &x);
		return 0;
	}
	cr_assert_lt(st->nq, Q_CAP);
	st->q[st->nq++] = x;
	return 0;
}

static int st_load(void *user, uint64_t id, uint64_t req, const bkv_kv_xfer_block *b, uint32_t n)
{
	store *st = user;

	(void)req;
	st->loads++;
	st->load_blocks += n;
	return st_xfer_start(st, id, b, n, 1);
}

static int st_save(void *user, uint64_t id, const bkv_kv_xfer_block *b, uint32_t n)
{
	store *st = user;

	st->saves++;
	return st_xfer_start(st, id, b, n, 0);
}

/* Complete the queued transfers, newest first (any order is allowed). */
static void st_flush(store *st)
{
	while (st->nq) {
		st_xfer x = st->q[--st->nq];

		st_run(st, &x);
	}
}

static bkv_connector st_connector(store *st)
{
	bkv_connector c;

	memset(&c, 0, sizeof(c));
	c.lookup = st_lookup;
	c.load = st_load;
	c.save = st_save;
	c.contains = st_contains;
	c.user = st;
	return c;
}

static fake_host *engine(store *st, bkv_connector *c, uint32_t blocks, int overlap_free)
{
	fh_opts o;
	fake_host *f;

	(void)overlap_free;
	fh_opts_init(&o);
	o.device_blocks = blocks;
	o.event_capacity = 4096;
	o.cfg.connector = c;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 256;
	f = fh_create(&o);
	st->f = f;
	return f;
}

/* Step until nothing is pending, completing queued transfers between
 * steps; checks every invariant. */
static uint32_t run(fake_host *f, store *st, uint32_t max_steps)
{
	uint32_t steps = 0;

	while ((bkv_sched_pending(f->s) > 0 || st->nq) && steps < max_steps) {
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
		cr_assert_eq(bkv_pool_check(f->pool), 0);
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
		if (steps % 3 == 2)
			st_flush(st);
		steps++;
	}
	cr_assert_lt(steps, max_steps);
	return steps;
}

/* n prompts of 8 shared blocks and a private tail each. */
static int32_t **prompts(uint32_t n, uint32_t len)
{
	int32_t **p = calloc(n, sizeof(*p)), *shared = fh_prompt(8 * BT, 1);
	uint32_t i;

	for (i = 0; i < n; i++) {
		p[i] = fh_prompt(len, 100 + i);
		memcpy(p[i], shared, 8 * BT * sizeof(int32_t));
	}
	free(shared);
	return p;
}

static void submit_all(fake_host *f, int32_t **p, uint32_t n, uint32_t len)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		fh_submit(f, p[i], len, 8);
}

static void free_prompts(int32_t **p, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		free(p[i]);
	free(p);
}

/* Engine 1 computes and saves; engine 2, a fresh pool, loads instead. */
static void two_engines(store *st, int inline_done, bkv_sched_stats *s2)
{
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(12, 200);
	fake_host *f;
	bkv_sched_stats s1;

	st->inline_done = inline_done;
	f = engine(st, &c, 1024, 0);
	submit_all(f, p, 12, 200);
	run(f, st, 4000);
	st_flush(st);
	memset(&s1, 0, sizeof(s1));
	bkv_sched_stats_get(f->s, &s1);
	cr_assert_gt(s1.kv_saved, 0);
	cr_assert_eq(s1.kv_save_held, 0);
	fh_destroy(f);

	f = engine(st, &c, 1024, 0);
	submit_all(f, p, 12, 200);
	run(f, st, 4000);
	memset(s2, 0, sizeof(*s2));
	bkv_sched_stats_get(f->s, s2);
	if (getenv("CN_DEBUG"))
		fprintf(stderr, "lookups %llu loads %llu tokens %llu failed %llu hits %llu prefill %llu st loads %llu blocks %llu\n",
			(unsigned long long)s2->kv_lookups, (unsigned long long)s2->kv_loads,
			(unsigned long long)s2->kv_load_tokens, (unsigned long long)s2->kv_load_failed,
			(unsigned long long)s2->hit_tokens, (unsigned long long)s2->prefill_tokens,
			(unsigned long long)st->loads, (unsigned long long)st->load_blocks);
	cr_assert_eq(f->finished_total, 12);
	fh_destroy(f);
	free_prompts(p, 12);
}

Test(connector, a_second_engine_loads_what_the_first_saved)
{
	store *st = calloc(1, sizeof(*st));
	bkv_sched_stats s2;

	two_engines(st, 1, &s2);
	cr_assert_gt(s2.kv_loads, 0);
	cr_assert_gt(s2.kv_load_tokens, 12 * 8 * BT / 2, "loaded %llu",
		     (unsigned long long)s2.kv_load_tokens);
	cr_assert_eq(s2.kv_load_failed, 0);
	free(st);
}

Test(connector, loads_completed_later_keep_others_running)
{
	store *st = calloc(1, sizeof(*st));
	bkv_sched_stats s2;

	two_engines(st, 0, &s2);
	cr_assert_gt(s2.kv_load_tokens, 0);
	cr_assert_eq(s2.kv_waiting, 0);
	free(st);
}

Test(connector, a_failed_block_is_recomputed_from_there)
{
	store *st = calloc(1, sizeof(*st));
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(4, 200);
	uint64_t h[12];
	bkv_sched_stats s;
	fake_host *f;

	st->inline_done = 1;
	f = engine(st, &c, 1024, 0);
	submit_all(f, p, 4, 200);
	run(f, st, 4000);
	fh_destroy(f);
	bkv_block_hashes(0, 0, BT, p[0], 12 * BT, h);
	st->fail_hash = h[5]; /* shared by all four */
	f = engine(st, &c, 1024, 0);
	submit_all(f, p, 4, 200);
	run(f, st, 4000);
	memset(&s, 0, sizeof(s));
	bkv_sched_stats_get(f->s, &s);
	cr_assert_gt(s.kv_load_failed, 0);
	cr_assert_eq(f->finished_total, 4);
	fh_destroy(f);
	free_prompts(p, 4);
	free(st);
}

Test(connector, lookups_answered_later_wait_off_the_queue)
{
	store *st = calloc(1, sizeof(*st));
	bkv_sched_stats s2;

	st->later_asks = 2;
	two_engines(st, 1, &s2);
	cr_assert_gt(s2.kv_lookups, 12 * 2);
	cr_assert_gt(s2.kv_load_tokens, 0);
	free(st);
}

Test(connector, an_abort_while_loading_frees_the_blocks_once_the_load_completes)
{
	store *st = calloc(1, sizeof(*st));
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(1, 200);
	bkv_pool_stats ps;
	bkv_sched_stats s;
	fake_host *f;
	uint64_t id;
	uint32_t i, avail;

	st->inline_done = 1;
	f = engine(st, &c, 256, 0);
	submit_all(f, p, 1, 200);
	run(f, st, 1000);
	fh_destroy(f);

	st->inline_done = 0;
	f = engine(st, &c, 256, 0);
	avail = bkv_pool_available(f->pool);
	id = fh_submit(f, p[0], 200, 8);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(st->nq, 1, "the load is in flight");
	memset(&s, 0, sizeof(s));
	bkv_sched_stats_get(f->s, &s);
	cr_assert_eq(s.kv_waiting, 1);
	cr_assert_eq(bkv_abort(f->s, id), BKV_OK);
	for (i = 0; i < 3; i++) {
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
	}
	bkv_pool_stats_get(f->pool, &ps);
	cr_assert_eq(ps.nr_seqs, 1, "parked until the load completes");
	cr_assert_eq(f->finish_count[id], 1);
	st_flush(st);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	bkv_pool_stats_get(f->pool, &ps);
	cr_assert_eq(ps.nr_seqs, 0);
	cr_assert_eq(bkv_pool_available(f->pool), avail);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	fh_destroy(f);
	free_prompts(p, 1);
	free(st);
}

Test(connector, saves_hold_their_blocks_past_the_request_and_name_the_external_medium)
{
	store *st = calloc(1, sizeof(*st));
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(1, 200);
	bkv_kv_event ev[4096];
	bkv_sched_stats s;
	bkv_pool_stats ps;
	fake_host *f;
	uint32_t i, n, ext = 0;

	st->inline_done = 0;
	f = engine(st, &c, 256, 0);
	submit_all(f, p, 1, 200);
	while (bkv_sched_pending(f->s))
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	memset(&s, 0, sizeof(s));
	bkv_sched_stats_get(f->s, &s);
	cr_assert_gt(s.kv_save_held, 0);
	bkv_pool_stats_get(f->pool, &ps);
	cr_assert_eq(ps.nr_seqs, 1, "its sequence waits for the saves");
	st_flush(st);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	memset(&s, 0, sizeof(s));
	bkv_sched_stats_get(f->s, &s);
	cr_assert_eq(s.kv_save_held, 0);
	cr_assert_eq(s.kv_saved, 200 / BT);
	bkv_pool_stats_get(f->pool, &ps);
	cr_assert_eq(ps.nr_seqs, 0);
	n = bkv_pool_drain_events(f->pool, ev, 4096);
	for (i = 0; i < n; i++)
		ext += ev[i].medium == BKV_MEDIUM_EXTERNAL && ev[i].kind == BKV_EVENT_STORED;
	cr_assert_eq(ext, 200 / BT);
	fh_destroy(f);
	free_prompts(p, 1);
	free(st);
}

/* The value of a metric line "name value" in Prometheus text. */
static double metric(const char *text, const char *name)
{
	char key[128];
	const char *p;

	snprintf(key, sizeof(key), "\n%s ", name);
	p = strstr(text, key);
	cr_assert(p, "no metric %s", name);
	return strtod(p + strlen(key), NULL);
}

Test(connector, the_metrics_repeat_the_counters)
{
	store *st = calloc(1, sizeof(*st));
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(6, 200);
	static char text[65536];
	bkv_sched_stats s;
	fake_host *f;

	st->inline_done = 1;
	f = engine(st, &c, 1024, 0);
	submit_all(f, p, 6, 200);
	run(f, st, 4000);
	fh_destroy(f);
	f = engine(st, &c, 1024, 0);
	submit_all(f, p, 6, 200);
	run(f, st, 4000);
	memset(&s, 0, sizeof(s));
	bkv_sched_stats_get(f->s, &s);
	cr_assert_lt(bkv_sched_metrics_prometheus(f->s, text, sizeof(text)), sizeof(text));
	cr_assert_gt(s.kv_load_tokens, 0);
	cr_assert_eq(metric(text, "bkv_kv_connector_loaded_tokens_total"), (double)s.kv_load_tokens);
	cr_assert_eq(metric(text, "bkv_kv_connector_loads_total"), (double)s.kv_loads);
	cr_assert_eq(metric(text, "bkv_kv_connector_lookups_total"), (double)s.kv_lookups);
	cr_assert_eq(metric(text, "bkv_kv_connector_saved_blocks_total"), (double)s.kv_saved);
	cr_assert_eq(metric(text, "bkv_kv_connector_waiting_requests"), 0);
	cr_assert_eq(metric(text, "bkv_kv_connector_held_blocks"), 0);
	fh_destroy(f);
	free_prompts(p, 6);
	free(st);
}

static uint32_t preempted_calls;

static void on_preempted(void *user, uint64_t req)
{
	(void)user;
	(void)req;
	preempted_calls++;
}

Test(connector, every_preemption_is_reported)
{
	store *st = calloc(1, sizeof(*st));
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(16, 160);
	bkv_sched_stats s;
	fake_host *f;

	c.preempted = on_preempted;
	st->inline_done = 0;
	f = engine(st, &c, 40, 0); /* room for a few: preemption */
	for (uint32_t i = 0; i < 16; i++)
		fh_submit(f, p[i], 160, 96);
	run(f, st, 20000);
	memset(&s, 0, sizeof(s));
	bkv_sched_stats_get(f->s, &s);
	cr_assert_gt(s.preemptions, 0);
	cr_assert_eq(preempted_calls, s.preemptions);
	cr_assert_eq(f->finished_total, 16);
	fh_destroy(f);
	free_prompts(p, 16);
	free(st);
}

Test(connector, a_hybrid_pool_loads_every_groups_blocks)
{
	const bkv_kv_group g[2] = {{BKV_GROUP_FULL, 2, 0, 0, 64}, {BKV_GROUP_WINDOW, 2, 40, 0, 64}};
	store *st = calloc(1, sizeof(*st));
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(6, 200);
	bkv_sched_stats s;
	fake_host *f;
	fh_opts o;
	int e;

	st->inline_done = 0;
	for (e = 0; e < 2; e++) {
		fh_opts_init(&o);
		o.device_blocks = 2048;
		o.cfg.connector = &c;
		o.n_groups = 2;
		o.groups = g;
		f = fh_create(&o);
		st->f = f;
		submit_all(f, p, 6, 200);
		run(f, st, 4000);
		st_flush(st);
		memset(&s, 0, sizeof(s));
		bkv_sched_stats_get(f->s, &s);
		cr_assert_eq(f->finished_total, 6);
		cr_assert(e || s.kv_saved > 0);
		fh_destroy(f);
	}
	cr_assert_gt(s.kv_load_tokens, 0, "the second engine loads (%llu failed, %llu loads, %llu lookups)",
		     (unsigned long long)s.kv_load_failed, (unsigned long long)s.kv_loads,
		     (unsigned long long)s.kv_lookups);
	cr_assert_eq(s.kv_load_failed, 0, "window blocks were saved too");
	free_prompts(p, 6);
	free(st);
}

static void *flush_later(void *arg)
{
	struct timespec t = {0, 20 * 1000 * 1000};

	nanosleep(&t, NULL);
	st_flush(arg);
	return NULL;
}

Test(connector, the_wait_sleeps_through_a_load_until_it_completes)
{
	store *st = calloc(1, sizeof(*st));
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(1, 200);
	pthread_t thr;
	fake_host *f;

	st->inline_done = 1;
	f = engine(st, &c, 256, 0);
	submit_all(f, p, 1, 200);
	run(f, st, 1000);
	fh_destroy(f);
	st->inline_done = 0;
	f = engine(st, &c, 256, 0);
	submit_all(f, p, 1, 200);
	cr_assert_eq(bkv_sched_wait(f->s, 0), BKV_OK, "a request to admit");
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(st->nq, 1, "its load is in flight");
	cr_assert_eq(bkv_sched_wait(f->s, 0), BKV_EAGAIN, "no step can move it");
	cr_assert_eq(bkv_sched_wait(f->s, 2000), BKV_EAGAIN);
	cr_assert_eq(pthread_create(&thr, NULL, flush_later, st), 0);
	cr_assert_eq(bkv_sched_wait(f->s, UINT64_MAX), BKV_OK, "the completion wakes it");
	pthread_join(thr, NULL);
	run(f, st, 1000);
	cr_assert_eq(f->finished_total, 1);
	fh_destroy(f);
	free_prompts(p, 1);
	free(st);
}

Test(connector, a_bad_completion_is_refused_and_changes_nothing)
{
	store *st = calloc(1, sizeof(*st));
	bkv_connector c = st_connector(st);
	int32_t **p = prompts(1, 200);
	uint32_t bad = 100000;
	fake_host *f;

	st->inline_done = 0;
	f = engine(st, &c, 256, 0);
	submit_all(f, p, 1, 200);
	while (!st->nq)
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(bkv_kv_xfer_done(f->s, st->q[0].id ^ (1ull << 40), 0, NULL, 0), BKV_ENOENT);
	cr_assert_eq(bkv_kv_xfer_done(f->s, st->q[0].id, 0, &bad, 1), BKV_EINVAL);
	cr_assert_eq(bkv_kv_xfer_done(f->s, st->q[0].id, 0, NULL, 1), BKV_EINVAL);
	cr_assert_eq(bkv_kv_xfer_done(NULL, st->q[0].id, 0, NULL, 0), BKV_EINVAL);
	run(f, st, 1000);
	cr_assert_eq(bkv_kv_xfer_done(f->s, st->q[0].id, 0, NULL, 0), BKV_ENOENT, "done once");
	fh_destroy(f);
	free_prompts(p, 1);
	free(st);
}

Test(connector, a_connector_without_lookup_or_prefix_cache_is_refused)
{
	bkv_connector c;
	fh_opts o;
	bkv_pool *pool;
	bkv_pool_config pc;
	bkv_sched *s = NULL;
	bkv_host_ops ops = kh_ops(0);

	memset(&c, 0, sizeof(c));
	bkv_pool_config_init(&pc);
	pc.block_tokens = BT;
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	fh_opts_init(&o);
	o.cfg.connector = &c;
	cr_assert_eq(bkv_sched_create(&o.cfg, pool, &ops, NULL, NULL, &s), BKV_EINVAL);
	cr_assert_null(s);
	bkv_pool_destroy(pool);
}
