/*
 * test_faults.c - allocation-failure sweeps (SQLite's and Lua's discipline):
 * run a representative workload once with a counting allocator to learn how
 * many allocations it makes, then once more for every N with allocation N
 * refused, and require a defined outcome every time.
 *
 * faults/pool_*: a pool workload (block-table growth, forks and copy-on-write,
 *   copy-list growth, swap out and in, prefix hits, close, drop, cache reset).
 *   The refused call returns BKV_ENOMEM and changes nothing (stats bytewise
 *   equal, checker clean); the workload then retries it, which must succeed,
 *   and the run must end in exactly the state of the failure-free run. No
 *   byte is left after destroy.
 * faults/sched_*: pool + scheduler sharing one allocator, with 40 requests
 *   (enough to grow the id map and the batch buffers), samples, stop tokens,
 *   shared prefixes, an abort, and a pool small enough to preempt. Creation
 *   fails cleanly with BKV_ENOMEM; a refused bkv_submit refuses the request
 *   (BKV_ENOMEM, no callback ever); a refusal inside bkv_step (a block table
 *   or a copy list of the pool) only delays work. bkv_sched_check is clean
 *   after every step, every accepted request ends exactly once, and every
 *   request that ran to its end delivered exactly the tokens of the closed-
 *   form reference (fakehost.h's sampler), the same as the failure-free run.
 * faults/trace_*: bkv-sim's loaders (their malloc, realloc and free
 *   counted through trace_alloc.h): each format, trace_load, and the synthetic
 *   workloads return TRACE_ENOMEM for every refused allocation, leave the
 *   trace empty and leak nothing.
 * Under -Db_sanitize=address LeakSanitizer checks every run as well.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/sim/trace.h"
#include "../examples/sim/trace_alloc.h"
#include "fuzz/fuzz.h"
#include "fakehost.h"
#include "internal.h"

/* ---- the pool ------------------------------------------------------------ */

static bkv_pool_stats pstats(const bkv_pool *p)
{
	bkv_pool_stats st;

	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_pool_stats_get(p, &st);
	return st;
}

/* Run one pool call; on BKV_ENOMEM require the refusal and no change, then
 * retry it. Returns the final result. */
static int pool_call(bkv_pool *p, fz_mem *m, int (*fn)(bkv_pool *, void *), void *arg,
		     uint32_t *enomem)
{
	bkv_pool_stats before = pstats(p), after;
	uint64_t refused = m->failures;
	int rc = fn(p, arg);

	if (rc == BKV_ENOMEM) {
		cr_assert_gt(m->failures, refused, "ENOMEM without a refused allocation");
		after = pstats(p);
		cr_assert_eq(memcmp(&before, &after, sizeof(after)), 0, "a failed call changed stats");
		cr_assert_eq(bkv_pool_check(p), 0);
		(*enomem)++;
		rc = fn(p, arg);
	}
	cr_assert_eq(bkv_pool_check(p), 0);
	return rc;
}

typedef struct pop {
	uint32_t seq;
	uint32_t *out;
	const int32_t *tok;
	uint32_t n;
} pop;

static int op_open(bkv_pool *p, void *a)
{
	return bkv_seq_open_keyed(p, ((pop *)a)->n, ((pop *)a)->out);
}

static int op_append(bkv_pool *p, void *a)
{
	pop *o = a;

	return bkv_seq_append(p, o->seq, o->tok, o->n, NULL);
}

static int op_fork(bkv_pool *p, void *a)
{
	return bkv_seq_fork(p, ((pop *)a)->seq, ((pop *)a)->out);
}

static int op_swap_out(bkv_pool *p, void *a)
{
	return bkv_seq_swap_out(p, ((pop *)a)->seq);
}

static int op_swap_in(bkv_pool *p, void *a)
{
	return bkv_seq_swap_in(p, ((pop *)a)->seq);
}

/* The workload. Returns the final stats; *calls counts the allocator. */
static bkv_pool_stats pool_workload(fz_mem *m, uint32_t *enomem, int *created)
{
	bkv_allocator a = fz_allocator(m);
	bkv_pool_config cfg;
	bkv_pool *p = NULL;
	bkv_pool_stats end;
	int32_t t[600];
	uint32_t s[8], i, k;
	pop o;
	int rc;

	for (i = 0; i < 600; i++)
		t[i] = (int32_t)(i % 97);
	bkv_pool_config_init(&cfg);
	cfg.block_tokens = 4;
	cfg.device_blocks = 200;
	cfg.host_blocks = 128;
	cfg.max_seqs = 8;
	rc = bkv_pool_create(&cfg, &a, &p);
	memset(&end, 0, sizeof(end));
	*created = rc == BKV_OK;
	if (rc != BKV_OK) {
		cr_assert_eq(rc, BKV_ENOMEM);
		cr_assert_null(p);
		cr_assert_gt(m->failures, 0);
		return end;
	}
	/* three sequences with a shared prefix: hits, table growth */
	for (k = 0; k < 3; k++) {
		o.out = &s[k];
		o.n = 0;
		cr_assert_eq(pool_call(p, m, op_open, &o, enomem), BKV_OK);
		for (i = 0; i < 6; i++) {
			o.seq = s[k];
			o.tok = t + 20 * i;
			o.n = 20 + k;
			cr_assert_eq(pool_call(p, m, op_append, &o, enomem), BKV_OK);
		}
	}
	/* 24 forks with copy-on-write writes, copies uncleared: the device
	 * copy list grows; each fork is closed again */
	for (i = 0; i < 24; i++) {
		o.seq = s[i % 3];
		o.out = &s[3];
		cr_assert_eq(pool_call(p, m, op_fork, &o, enomem), BKV_OK);
		o.seq = s[3];
		o.tok = t + i;
		o.n = 3;
		cr_assert_eq(pool_call(p, m, op_append, &o, enomem), BKV_OK);
		cr_assert_eq(bkv_seq_close(p, s[3]), BKV_OK);
	}
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	/* swap out and in without clearing: swap lists grow */
	for (i = 0; i < 3; i++) {
		o.seq = s[i];
		cr_assert_eq(pool_call(p, m, op_swap_out, &o, enomem), BKV_OK);
	}
	for (i = 0; i < 3; i++) {
		bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
		o.seq = s[i];
		cr_assert_eq(pool_call(p, m, op_swap_in, &o, enomem), BKV_OK);
	}
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	/* a keyed sequence, then close, drop and a cache reset */
	o.out = &s[4];
	o.n = 9;
	cr_assert_eq(pool_call(p, m, op_open, &o, enomem), BKV_OK);
	o.seq = s[4];
	o.tok = t;
	o.n = 300;
	cr_assert_eq(pool_call(p, m, op_append, &o, enomem), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s[0]), BKV_OK);
	cr_assert_eq(bkv_seq_drop(p, s[1]), BKV_OK);
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	end = pstats(p);
	bkv_pool_destroy(p);
	return end;
}

Test(faults, pool_workload_survives_every_allocation_failure)
{
	fz_mem m;
	bkv_pool_stats ref, got;
	uint32_t enomem = 0, total, k, recovered = 0;
	int created;

	memset(&m, 0, sizeof(m));
	ref = pool_workload(&m, &enomem, &created);
	cr_assert(created);
	cr_assert_eq(enomem, 0);
	cr_assert_eq(m.live_bytes, 0, "failure-free run leaked %lld bytes", (long long)m.live_bytes);
	total = (uint32_t)m.calls;
	cr_assert_gt(total, 10, "the workload makes %u allocations", total);
	for (k = 1; k <= total; k++) {
		memset(&m, 0, sizeof(m));
		m.fail_at = k;
		enomem = 0;
		got = pool_workload(&m, &enomem, &created);
		cr_assert_eq(m.failures, 1, "allocation %u was not reached", k);
		cr_assert_eq(m.live_bytes, 0, "allocation %u refused: %lld bytes leaked", k,
			     (long long)m.live_bytes);
		cr_assert_eq(m.live_blocks, 0);
		if (!created)
			continue;
		cr_assert_eq(enomem, 1, "allocation %u: the refusal surfaced %u times", k, enomem);
		cr_assert_eq(memcmp(&ref, &got, sizeof(ref)), 0,
			     "allocation %u refused: the run ended in another state", k);
		recovered++;
	}
	cr_assert_gt(recovered, 0);
	cr_log_info("pool: %u allocations swept, %u runs recovered by a retry", total, recovered);
}

/* ---- the scheduler ------------------------------------------------------- */

#define SR_REQS 40u
#define SR_MAXNEW 12u

typedef struct srun {
	kh_req req[SR_REQS];
	int32_t prompt[SR_REQS][64];
	int submit_rc[SR_REQS];
	uint64_t steps;
	uint64_t preemptions;
	int created;
} srun;

/* The closed-form stream of request r, branch b: what any correct schedule
 * delivers. Returns the token count. */
static uint32_t expected_stream(const kh_req *r, uint32_t b, int32_t *out)
{
	int32_t in = r->prompt[r->prompt_len - 1];
	uint32_t i;

	for (i = 0; i < r->max_new; i++) {
		int32_t t = kh_sample(r, b, r->prompt_len + i, in);

		out[i] = t;
		if (t == BKV_TOKEN_FAIL)
			return i;
		if (kh_is_stop(r, t))
			return i + 1;
		in = t;
	}
	return r->max_new;
}

static void check_streams(const srun *x)
{
	int32_t want[SR_MAXNEW];
	uint32_t i, b, n;

	for (i = 0; i < SR_REQS; i++) {
		const kh_req *r = &x->req[i];

		if (!r->submitted || r->reason == BKV_FINISH_ABORT)
			continue;
		for (b = 0; b < r->n; b++) {
			n = expected_stream(r, b, want);
			if (r->reason == BKV_FINISH_ERROR)
				continue; /* one branch failed; others stopped early */
			cr_assert_eq(r->n_out[b], n, "req %u branch %u: %u tokens, expected %u", i, b,
				     r->n_out[b], n);
			cr_assert_eq(memcmp(r->hist + (size_t)b * r->max_new, want,
					    n * sizeof(int32_t)),
				     0, "req %u branch %u: tokens differ from the reference", i, b);
		}
	}
}

static void sched_workload(srun *x, fz_mem *m, int split)
{
	bkv_allocator a = fz_allocator(m);
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops = kh_ops(split);
	bkv_sched_stats st;
	bkv_pool *pool = NULL;
	bkv_sched *s = NULL;
	kh_host h;
	uint32_t i, j, steps = 0;
	int rc;

	memset(x, 0, sizeof(*x));
	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 28;
	pc.host_blocks = 24;
	pc.max_seqs = 16;
	bkv_sched_config_init(&sc);
	sc.max_running = 8;
	sc.max_queue = 64;
	cr_assert_eq(kh_init(&h, 4, 28, 24, 1), 0);
	rc = bkv_pool_create(&pc, &a, &pool);
	if (rc != BKV_OK) {
		cr_assert_eq(rc, BKV_ENOMEM);
		kh_fini(&h);
		return;
	}
	rc = bkv_sched_create(&sc, pool, &ops, &h, &a, &s);
	if (rc != BKV_OK) {
		cr_assert_eq(rc, BKV_ENOMEM);
		cr_assert_null(s);
		cr_assert_eq(bkv_pool_check(pool), 0);
		bkv_pool_destroy(pool);
		kh_fini(&h);
		return;
	}
	x->created = 1;
	for (i = 0; i < SR_REQS; i++) {
		kh_req *r = &x->req[i];
		uint32_t len = 5 + (i * 7) % 30;

		if (i == 7)
			len = 60; /* a longer history: the batch buffers grow */
		for (j = 0; j < len; j++)
			x->prompt[i][j] = (int32_t)(i % 4 == 0 ? j : 100 * i + j); /* shared */
		cr_assert_eq(kh_req_init(r, 1 + i, x->prompt[i], len, 4 + i % (SR_MAXNEW - 3),
					 i % 5 == 0 ? 2 : 1),
			     0);
		r->key = i % 7 == 0;
		if (i % 3 == 0) {
			r->stop_mod = 5;
			r->stop[0] = KH_STOP;
			r->n_stop = 1;
		}
	}
	/* 36 submitted at once (the id map grows past 32), 4 later */
	for (i = 0; i < 36; i++) {
		uint64_t refused = m->failures;

		x->submit_rc[i] = kh_submit(s, &x->req[i], (int32_t)(i % 3));
		if (x->submit_rc[i] != BKV_OK) {
			cr_assert_eq(x->submit_rc[i], BKV_ENOMEM, "submit %u: %d", i, x->submit_rc[i]);
			cr_assert_gt(m->failures, refused);
		}
	}
	while (bkv_sched_pending(s) && steps < 5000) {
		rc = bkv_step(s, NULL);
		cr_assert_eq(rc, BKV_OK, "step %u: %d", steps, rc);
		cr_assert_eq(bkv_sched_check(s), 0, "check after step %u: %d", steps,
			     bkv_sched_check(s));
		cr_assert_eq(h.violations, 0, "host: %s", h.first);
		if (++steps == 3) {
			if (x->req[2].submitted)
				rc = kh_abort(s, &x->req[2], x->req[2].id);
			for (i = 36; i < SR_REQS; i++) {
				x->submit_rc[i] = kh_submit(s, &x->req[i], 0);
				cr_assert(x->submit_rc[i] == BKV_OK || x->submit_rc[i] == BKV_ENOMEM);
			}
		}
	}
	cr_assert_eq(bkv_sched_pending(s), 0, "requests left after %u steps", steps);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(s, &st);
	x->steps = st.steps;
	x->preemptions = st.preemptions;
	for (i = 0; i < SR_REQS; i++) {
		const kh_req *r = &x->req[i];

		cr_assert_eq(r->finished, r->submitted ? 1u : 0u, "req %u (submitted %d) ended %u times",
			     i, r->submitted, r->finished);
	}
	check_streams(x);
	bkv_sched_destroy(s);
	cr_assert_eq(bkv_pool_check(pool), 0);
	bkv_pool_destroy(pool);
	kh_fini(&h);
}

static void srun_fini(srun *x)
{
	uint32_t i;

	for (i = 0; i < SR_REQS; i++)
		kh_req_fini(&x->req[i]);
}

static void sched_sweep(int split)
{
	static srun ref, x;
	fz_mem m;
	uint32_t total, k, i, refused_submits = 0, absorbed = 0;

	memset(&m, 0, sizeof(m));
	sched_workload(&ref, &m, split);
	cr_assert(ref.created);
	cr_assert_eq(m.live_bytes, 0);
	cr_assert_gt(ref.preemptions, 0, "the workload should preempt");
	for (i = 0; i < SR_REQS; i++)
		cr_assert(ref.req[i].submitted);
	total = (uint32_t)m.calls;
	for (k = 1; k <= total; k++) {
		memset(&m, 0, sizeof(m));
		m.fail_at = k;
		sched_workload(&x, &m, split);
		cr_assert_eq(m.failures, 1, "allocation %u was not reached", k);
		cr_assert_eq(m.live_bytes, 0, "allocation %u refused: %lld bytes leaked", k,
			     (long long)m.live_bytes);
		cr_assert_eq(m.live_blocks, 0);
		if (x.created) {
			uint32_t refused = 0;

			for (i = 0; i < SR_REQS; i++) {
				refused += !x.req[i].submitted;
				/* the same tokens as the failure-free run */
				if (x.req[i].submitted && x.req[i].reason == ref.req[i].reason &&
				    ref.req[i].reason != BKV_FINISH_ABORT)
					cr_assert_eq(memcmp(x.req[i].hist, ref.req[i].hist,
							    ref.req[i].n * ref.req[i].max_new *
								    sizeof(int32_t)),
						     0, "allocation %u: req %u tokens differ", k, i);
			}
			refused_submits += refused;
			absorbed += refused == 0;
		}
		srun_fini(&x);
	}
	srun_fini(&ref);
	cr_log_info("%s host: %u allocations swept; %u runs refused a submit, %u absorbed a "
		    "refusal inside the scheduler or pool",
		    split ? "split" : "mixed", total, refused_submits, absorbed);
	cr_assert_gt(refused_submits, 0);
}

Test(faults, sched_workload_survives_every_allocation_failure_mixed_host)
{
	sched_sweep(0);
}

Test(faults, sched_workload_survives_every_allocation_failure_split_host)
{
	sched_sweep(1);
}

/* Found by fuzz_sched: a request with more samples than the pool has
 * sequence slots is accepted but can never fork, so it stays pending
 * forever. bkv_submit now refuses it (BKV_E2BIG, like n > max_running);
 * see docs/reliability.md. */
Test(faults, submit_refuses_more_samples_than_pool_sequences)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops = kh_ops(0);
	bkv_pool *pool = NULL;
	bkv_sched *s = NULL;
	kh_host h;
	kh_req r;
	int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
	int rc, i;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 21;
	pc.max_seqs = 1;
	bkv_sched_config_init(&sc);
	sc.max_running = 6;
	cr_assert_eq(kh_init(&h, 4, 21, 0, 1), 0);
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, &h, NULL, &s), BKV_OK);
	cr_assert_eq(kh_req_init(&r, 1, prompt, 6, 5, 2), 0);
	rc = kh_submit(s, &r, 0);
	for (i = 0; i < 100 && bkv_sched_pending(s); i++)
		bkv_step(s, NULL);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
	kh_fini(&h);
	kh_req_fini(&r);
	cr_assert(rc == BKV_E2BIG || r.finished == 1,
		  "accepted (%d) a request that can never run: still pending after 100 steps", rc);
}

/* ---- the trace loaders --------------------------------------------------- */

static uint64_t tr_calls, tr_fail_at, tr_refused;
static int64_t tr_live;

static void *tr_malloc(size_t n)
{
	void *p;

	if (++tr_calls == tr_fail_at) {
		tr_refused++;
		return NULL;
	}
	p = malloc(n);
	tr_live += p != NULL;
	return p;
}

static void *tr_realloc(void *p, size_t n)
{
	void *q;

	if (++tr_calls == tr_fail_at) {
		tr_refused++;
		return NULL;
	}
	q = realloc(p, n);
	tr_live += q && !p;
	return q;
}

static void tr_free(void *p)
{
	tr_live -= p != NULL;
	free(p);
}

/* The trace functions allocate through these while loader_sweep runs. */
static const trace_allocator tr_allocator = {tr_malloc, tr_realloc, tr_free};

/* A file of n lines in each format (made-up values). */
static char *make_file(trace_format fmt, uint32_t n, size_t *len)
{
	size_t cap = 200 + (size_t)n * 200, k = 0;
	char *b = malloc(cap);
	uint32_t i, j;

	cr_assert_not_null(b);
	if (fmt == TRACE_AZURE)
		k += (size_t)sprintf(b + k, "TIMESTAMP,ContextTokens,GeneratedTokens\n");
	if (fmt == TRACE_DISTSERVE)
		k += (size_t)sprintf(b + k, "run,n_requests,rate_req_s,seq,prompt_len,output_len,"
					    "issue_time_rel_s,ttft_ms,tpot_ms,latency_ms,"
					    "issue_time_abs_s,first_token_time_abs_s,"
					    "complete_time_abs_s\n");
	for (i = 0; i < n; i++) {
		if (fmt == TRACE_AZURE) {
			k += (size_t)sprintf(b + k, "2024-03-01 10:%02u:%02u.%07u,%u,%u\n", i / 3600 % 60,
					     i / 60 % 60, (i % 60) * 1000, 10 + i % 300, 1 + i % 50);
		} else if (fmt == TRACE_MOONCAKE) {
			k += (size_t)sprintf(b + k,
					     "{\"timestamp\": %u, \"input_length\": %u, "
					     "\"output_length\": %u, \"hash_ids\": [",
					     i * 10, 1025 + i % 500, 1 + i % 90);
			for (j = 0; j < 3; j++)
				k += (size_t)sprintf(b + k, "%s%u", j ? ", " : "", j == 0 ? 0 : i * 3 + j);
			k += (size_t)sprintf(b + k, "]}\n");
		} else {
			k += (size_t)sprintf(b + k, "run-x,%u,1,%u,%u,%u,%u.5,50.0,20.0,300.0,1.0,2.0,3.0\n",
					     n, i, 10 + i % 400, 1 + i % 60, i);
		}
	}
	*len = k;
	return b;
}

/* keeps_salt: the call keeps the trace's salt on failure (the parsers do;
 * the synthetic workloads derive a new one). */
static void loader_sweep(const char *what, int (*load)(trace *, void *), void *arg,
			 uint32_t want_n, int keeps_salt)
{
	trace t;
	uint64_t total, k;
	int rc;

	trace_set_allocator(&tr_allocator);
	memset(&t, 0, sizeof(t));
	tr_calls = tr_refused = 0;
	tr_fail_at = 0;
	tr_live = 0;
	rc = load(&t, arg);
	cr_assert_eq(rc, TRACE_OK, "%s: %d", what, rc);
	cr_assert_eq(t.n, want_n, "%s: %u requests", what, t.n);
	trace_free(&t);
	cr_assert_eq(tr_live, 0, "%s leaked", what);
	total = tr_calls;
	cr_assert_geq(total, 1, "%s: %llu allocations", what, (unsigned long long)total);
	for (k = 1; k <= total; k++) {
		memset(&t, 0, sizeof(t));
		t.salt = 77;
		tr_calls = tr_refused = 0;
		tr_fail_at = k;
		rc = load(&t, arg);
		cr_assert_eq(tr_refused, 1, "%s: allocation %llu not reached", what,
			     (unsigned long long)k);
		cr_assert_eq(rc, TRACE_ENOMEM, "%s: allocation %llu refused, returned %d", what,
			     (unsigned long long)k, rc);
		cr_assert(t.n == 0 && t.reqs == NULL && t.hash_ids == NULL &&
				  (!keeps_salt || t.salt == 77),
			  "%s: allocation %llu refused: trace not left empty", what,
			  (unsigned long long)k);
		trace_free(&t);
		cr_assert_eq(tr_live, 0, "%s: allocation %llu refused: %lld leaked", what,
			     (unsigned long long)k, (long long)tr_live);
	}
	tr_fail_at = 0;
	trace_set_allocator(NULL);
}

typedef struct pbuf {
	trace_format fmt;
	const char *buf;
	size_t len;
	const char *path;
} pbuf;

static int load_parse(trace *t, void *a)
{
	pbuf *p = a;
	char err[128];

	return trace_parse(p->fmt, p->buf, p->len, NULL, t, err, sizeof(err));
}

static int load_file(trace *t, void *a)
{
	pbuf *p = a;
	char err[128];

	return trace_load(p->fmt, p->path, NULL, t, err, sizeof(err));
}

static int load_synthetic(trace *t, void *a)
{
	trace_dist pd = {DIST_UNIFORM, 8, 64}, od = {DIST_SEED000_GEN, 1, 64};

	(void)a;
	return trace_synthetic(t, 2500, ARRIVAL_POISSON, 4.0, &pd, &od, 3);
}

static int load_seed000(trace *t, void *a)
{
	(void)a;
	return trace_seed000(t, 1);
}

Test(faults, trace_parsers_survive_every_allocation_failure)
{
	static const trace_format fmts[] = {TRACE_AZURE, TRACE_MOONCAKE, TRACE_DISTSERVE};
	static const char *names[] = {"azure", "mooncake", "distserve"};
	uint32_t i;

	for (i = 0; i < 3; i++) {
		pbuf p;
		char *buf;

		/* past the first 1024-entry array: growth is swept too */
		buf = make_file(fmts[i], 1500, &p.len);
		p.fmt = fmts[i];
		p.buf = buf;
		loader_sweep(names[i], load_parse, &p, 1500, 1);
		free(buf);
	}
}

Test(faults, trace_load_survives_every_allocation_failure)
{
	char path[] = "/tmp/bkv-faults-XXXXXX";
	pbuf p;
	char *buf;
	FILE *f;
	int fd;

	/* more than trace_load's first 1 MiB read buffer */
	buf = make_file(TRACE_MOONCAKE, 12000, &p.len);
	cr_assert_gt(p.len, (size_t)1 << 20);
	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	f = fdopen(fd, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(buf, 1, p.len, f), p.len);
	fclose(f);
	free(buf);
	p.fmt = TRACE_MOONCAKE;
	p.path = path;
	loader_sweep("trace_load", load_file, &p, 12000, 1);
	remove(path);
}

Test(faults, synthetic_workloads_survive_every_allocation_failure)
{
	loader_sweep("synthetic", load_synthetic, NULL, 2500, 0);
	loader_sweep("seed000", load_seed000, NULL, 256, 0);
}
