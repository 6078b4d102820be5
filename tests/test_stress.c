/*
 * test_stress.c - concurrency: eight threads submit and abort while one
 * thread steps (the header's thread rule: bkv_submit and bkv_abort from any
 * thread while another runs bkv_step). Run it under -Db_sanitize=thread to
 * catch data races (CI does); it also runs in the normal and ASan builds.
 *
 * Each submitter owns 150 requests (its records are fakehost.h kh_req, handed
 * to bkv_submit as user pointers): it submits them one by one (retrying on
 * BKV_EAGAIN: the queue is kept short so that happens), aborts about one in
 * six of its own recent requests (queued, running or already ended), aborts ids that
 * never existed (BKV_ENOENT), and reads bkv_sched_pending. The stepping
 * thread calls bkv_step until every submitter is done and nothing is
 * pending, checking bkv_sched_check every 32 steps. The host verifies every
 * batch against its KV model.
 *
 * Afterwards every request is accounted for: each was accepted exactly once
 * and ended exactly once; ABORT only where an abort was asked; every request
 * that was not aborted delivered exactly its closed-form tokens (so no token
 * was lost, duplicated or mixed between requests under concurrency); the
 * scheduler's counters agree (submitted, finished, aborted).
 *
 * Criterion cannot start under ThreadSanitizer (Snaipe/Criterion#274: "Could
 * not initialize inheritable arena"), so with BKV_STRESS_MAIN defined this
 * file builds as a plain program (stress_plain, tests/fuzz/meson.build) with
 * the same tests and a main; that is what the TSan build runs.
 */
#ifndef BKV_STRESS_MAIN
#include <criterion/criterion.h>
#else
#include <stdio.h>
#include <stdlib.h>

static void st_check(int ok, const char *what, const char *file, int line)
{
	if (ok)
		return;
	fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, what);
	abort();
}

/* Criterion's forms, the message arguments ignored (the trailing 0 keeps
 * every variadic list non-empty, as ISO C wants). */
#define ST_ONE(c, ...) (c)
#define ST_EQ(a, b, ...) ((a) == (b))
#define ST_LT(a, b, ...) ((a) < (b))
#define cr_assert(...) st_check(!!ST_ONE(__VA_ARGS__, 0), #__VA_ARGS__, __FILE__, __LINE__)
#define cr_assert_not(...) st_check(!ST_ONE(__VA_ARGS__, 0), #__VA_ARGS__, __FILE__, __LINE__)
#define cr_assert_eq(...) st_check(ST_EQ(__VA_ARGS__, 0), #__VA_ARGS__, __FILE__, __LINE__)
#define cr_assert_lt(...) st_check(ST_LT(__VA_ARGS__, 0), #__VA_ARGS__, __FILE__, __LINE__)
#define cr_log_info(...) (printf(__VA_ARGS__), putchar('\n'))
#define Test(suite, name, ...) static void suite##_##name(void)
#endif

#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "fakehost.h"
#include "internal.h"

#define ST_THREADS 8u
#define ST_PER 150u
#define ST_MAXNEW 48u

typedef struct submitter {
	bkv_sched *s;
	uint32_t idx;                 /* thread number */
	kh_req req[ST_PER];
	int32_t prompt[ST_PER][40];
	uint32_t eagain;              /* refusals retried */
	uint32_t aborts_ok;           /* bkv_abort returned BKV_OK */
	uint32_t aborts_late;         /* returned BKV_ENOENT: already ended */
	int failed;                   /* an unexpected status */
	int status;
} submitter;

static uint32_t g_done; /* atomic: submitters finished */

static uint64_t st_rand(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void *submit_main(void *arg)
{
	submitter *t = arg;
	uint64_t rng = 0x9e3779b97f4a7c15ull * (t->idx + 1);
	uint32_t i;

	for (i = 0; i < ST_PER; i++) {
		kh_req *r = &t->req[i];
		int rc;

		while ((rc = kh_submit(t->s, r, (int32_t)(st_rand(&rng) % 3))) == BKV_EAGAIN) {
			t->eagain++;
			sched_yield();
		}
		if (rc != BKV_OK) {
			t->failed = 1;
			t->status = rc;
			break;
		}
		if (st_rand(&rng) % 6 == 0) { /* abort an earlier request of ours */
			uint32_t back = (uint32_t)(st_rand(&rng) % 8);
			kh_req *v = &t->req[i >= back ? i - back : 0];

			if (!__atomic_load_n(&v->abort_asked, __ATOMIC_RELAXED)) {
				rc = kh_abort(t->s, v, v->id);
				if (rc == BKV_OK)
					t->aborts_ok++;
				else if (rc == BKV_ENOENT)
					t->aborts_late++;
				else {
					t->failed = 1;
					t->status = rc;
				}
			}
		}
		if (st_rand(&rng) % 8 == 0) {
			rc = bkv_abort(t->s, (uint64_t)1 << 62 | st_rand(&rng) % 1000);
			if (rc != BKV_ENOENT) {
				t->failed = 1;
				t->status = rc;
			}
			(void)bkv_sched_pending(t->s);
		}
		if (st_rand(&rng) % 4 == 0)
			sched_yield();
	}
	__atomic_add_fetch(&g_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* The closed-form stream of a request branch (see fakehost.h's sampler). */
static uint32_t expected_stream(const kh_req *r, uint32_t b, int32_t *out)
{
	int32_t in = r->prompt[r->prompt_len - 1];
	uint32_t i;

	for (i = 0; i < r->max_new; i++) {
		int32_t t = kh_sample(r, b, r->prompt_len + i, in);

		out[i] = t;
		if (kh_is_stop(r, t))
			return i + 1;
		in = t;
	}
	return r->max_new;
}

static void stress(int split, bkv_preempt_mode preempt, uint32_t device_blocks)
{
	static submitter subs[ST_THREADS];
	pthread_t th[ST_THREADS];
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops = kh_ops(split);
	bkv_sched_stats st;
	bkv_pool *pool = NULL;
	bkv_sched *s = NULL;
	kh_host h;
	uint64_t steps = 0, accepted = 0, aborted = 0, eagain = 0;
	uint32_t t, i, j, b;
	int32_t want[ST_MAXNEW];

	bkv_pool_config_init(&pc);
	pc.block_tokens = 8;
	pc.device_blocks = device_blocks;
	pc.host_blocks = 64;
	pc.max_seqs = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&sc);
	sc.max_running = 12;
	sc.max_queue = 24;
	sc.preempt = preempt;
	cr_assert_eq(kh_init(&h, 8, device_blocks, 64, 1), 0);
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, &h, NULL, &s), BKV_OK);
	__atomic_store_n(&g_done, 0, __ATOMIC_RELAXED);
	for (t = 0; t < ST_THREADS; t++) {
		submitter *x = &subs[t];
		uint64_t rng = 0x2545f4914f6cdd1dull * (t + 3);

		memset(x, 0, sizeof(*x));
		x->s = s;
		x->idx = t;
		for (i = 0; i < ST_PER; i++) {
			kh_req *r = &x->req[i];
			uint32_t len = 1 + (uint32_t)(st_rand(&rng) % 40);

			for (j = 0; j < len; j++)
				x->prompt[i][j] = (int32_t)(i % 2 ? 7000 + j : 100000 * t + 100 * i + j);
			cr_assert_eq(kh_req_init(r, 1 + t * ST_PER + i, x->prompt[i], len,
						 1 + (uint32_t)(st_rand(&rng) % ST_MAXNEW),
						 i % 10 == 3 ? 2 : 1),
				     0);
			r->key = i % 5 == 0 ? t : 0;
			if (i % 4 == 1) {
				r->stop_mod = 6;
				r->stop[0] = KH_STOP;
				r->n_stop = 1;
			}
		}
	}
	for (t = 0; t < ST_THREADS; t++)
		cr_assert_eq(pthread_create(&th[t], NULL, submit_main, &subs[t]), 0);
	while (__atomic_load_n(&g_done, __ATOMIC_ACQUIRE) < ST_THREADS || bkv_sched_pending(s)) {
		bkv_step_info si;
		int rc = bkv_step(s, &si);

		cr_assert_eq(rc, BKV_OK, "step %llu: %d", (unsigned long long)steps, rc);
		if (si.rows == 0)
			sched_yield(); /* nothing to run yet: let the submitters in */
		cr_assert_eq(h.violations, 0, "host: %s", h.first);
		if (++steps % 32 == 0)
			cr_assert_eq(bkv_sched_check(s), 0, "check: %d", bkv_sched_check(s));
		cr_assert_lt(steps, 2000000, "stuck");
	}
	for (t = 0; t < ST_THREADS; t++)
		cr_assert_eq(pthread_join(th[t], NULL), 0);
	cr_assert_eq(bkv_sched_check(s), 0);

	for (t = 0; t < ST_THREADS; t++) {
		submitter *x = &subs[t];

		cr_assert_not(x->failed, "thread %u: unexpected status %d", t, x->status);
		eagain += x->eagain;
		for (i = 0; i < ST_PER; i++) {
			kh_req *r = &x->req[i];

			cr_assert(r->submitted, "thread %u req %u never accepted", t, i);
			cr_assert_eq(r->finished, 1, "thread %u req %u ended %u times", t, i, r->finished);
			accepted++;
			if (r->reason == BKV_FINISH_ABORT) {
				cr_assert(r->abort_asked);
				aborted++;
				continue;
			}
			for (b = 0; b < r->n; b++) {
				uint32_t n = expected_stream(r, b, want);

				cr_assert_eq(r->n_out[b], n, "thread %u req %u branch %u: %u tokens of %u",
					     t, i, b, r->n_out[b], n);
				cr_assert_eq(memcmp(r->hist + (size_t)b * r->max_new, want,
						    n * sizeof(int32_t)),
					     0, "thread %u req %u branch %u: wrong tokens", t, i, b);
			}
		}
	}
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(s, &st);
	cr_assert_eq(st.submitted, accepted);
	cr_assert_eq(st.finished, accepted);
	cr_assert_eq(st.aborted, aborted);
	cr_assert_eq(h.finished, accepted);
	cr_log_info("%s host: %llu requests from %u threads, %llu aborted, %llu EAGAIN retries, "
		    "%llu steps, %llu preemptions (%llu swaps)",
		    split ? "split" : "mixed", (unsigned long long)accepted, ST_THREADS,
		    (unsigned long long)aborted, (unsigned long long)eagain,
		    (unsigned long long)steps, (unsigned long long)st.preemptions,
		    (unsigned long long)st.swaps);
	bkv_sched_destroy(s);
	cr_assert_eq(bkv_pool_check(pool), 0);
	bkv_pool_destroy(pool);
	kh_fini(&h);
	for (t = 0; t < ST_THREADS; t++)
		for (i = 0; i < ST_PER; i++)
			kh_req_fini(&subs[t].req[i]);
}

Test(stress, eight_submitters_and_one_stepper_account_for_every_request, .timeout = 300)
{
	stress(0, BKV_PREEMPT_RECOMPUTE, 32);
}

Test(stress, eight_submitters_with_swap_preemption_and_a_split_host, .timeout = 300)
{
	stress(1, BKV_PREEMPT_SWAP, 32);
}

#ifdef BKV_STRESS_MAIN
int main(void)
{
	stress_eight_submitters_and_one_stepper_account_for_every_request();
	stress_eight_submitters_with_swap_preemption_and_a_split_host();
	printf("stress_plain: ok\n");
	return 0;
}
#endif
