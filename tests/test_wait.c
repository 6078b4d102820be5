/*
 * test_wait.c - the engine thread's wait for work (bkv_sched_wait,
 * bkv_sched_wake): at once when a request is pending, woken by a
 * submission from another thread or by bkv_sched_wake, a timeout that
 * ends without work, a poll, and the refusals.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "batchkv.h"

static int in_callback_rc = 1;
static bkv_sched *g_s; /* the scheduler the callback asks */

static int forward(void *host, const bkv_batch *b, int32_t *next)
{
	uint32_t r;

	(void)host;
	in_callback_rc = bkv_sched_wait(g_s, 0);
	for (r = 0; r < b->n_rows; r++)
		next[r] = 7;
	return 0;
}

typedef struct fixture {
	bkv_pool *pool;
	bkv_sched *s;
} fixture;

static void make(fixture *f)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;

	bkv_pool_config_init(&pc);
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &f->pool), BKV_OK);
	bkv_sched_config_init(&sc);
	memset(&ops, 0, sizeof(ops));
	ops.forward = forward;
	cr_assert_eq(bkv_sched_create(&sc, f->pool, &ops, NULL, NULL, &f->s), BKV_OK);
	g_s = f->s;
}

static void submit(bkv_sched *s)
{
	static const int32_t prompt[4] = {1, 2, 3, 4};
	bkv_request q;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = 4;
	q.max_new_tokens = 2;
	cr_assert_eq(bkv_submit(s, &q, NULL), BKV_OK);
}

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void *submit_later(void *arg)
{
	struct timespec d = {0, 20 * 1000 * 1000};

	nanosleep(&d, NULL);
	submit(arg);
	return NULL;
}

static void *wake_later(void *arg)
{
	struct timespec d = {0, 20 * 1000 * 1000};

	nanosleep(&d, NULL);
	cr_assert_eq(bkv_sched_wake(arg), BKV_OK);
	return NULL;
}

Test(wait, a_pending_request_returns_at_once_and_nothing_pending_polls_eagain)
{
	fixture f;

	make(&f);
	cr_assert_eq(bkv_sched_wait(f.s, 0), BKV_EAGAIN);
	submit(f.s);
	cr_assert_eq(bkv_sched_wait(f.s, 0), BKV_OK);
	cr_assert_eq(bkv_sched_wait(f.s, UINT64_MAX), BKV_OK);
	bkv_sched_destroy(f.s);
	bkv_pool_destroy(f.pool);
}

Test(wait, a_submission_from_another_thread_ends_an_unlimited_wait)
{
	fixture f;
	pthread_t t;

	make(&f);
	cr_assert_eq(pthread_create(&t, NULL, submit_later, f.s), 0);
	cr_assert_eq(bkv_sched_wait(f.s, UINT64_MAX), BKV_OK);
	cr_assert_gt(bkv_sched_pending(f.s), 0);
	pthread_join(t, NULL);
	while (bkv_sched_pending(f.s))
		cr_assert_eq(bkv_step(f.s, NULL), BKV_OK);
	bkv_sched_destroy(f.s);
	bkv_pool_destroy(f.pool);
}

Test(wait, wake_ends_a_wait_without_work)
{
	fixture f;
	pthread_t t;

	make(&f);
	cr_assert_eq(pthread_create(&t, NULL, wake_later, f.s), 0);
	cr_assert_eq(bkv_sched_wait(f.s, UINT64_MAX), BKV_EAGAIN);
	pthread_join(t, NULL);
	bkv_sched_destroy(f.s);
	bkv_pool_destroy(f.pool);
}

Test(wait, a_timeout_ends_the_wait_no_sooner_than_asked)
{
	fixture f;
	double t0;

	make(&f);
	t0 = now_ms();
	cr_assert_eq(bkv_sched_wait(f.s, 30000), BKV_EAGAIN);
	cr_assert_geq(now_ms() - t0, 29.0, "a 30 ms wait ended after %.1f ms", now_ms() - t0);
	bkv_sched_destroy(f.s);
	bkv_pool_destroy(f.pool);
}

Test(wait, refused_without_a_scheduler_and_from_a_callback)
{
	fixture f;

	cr_assert_eq(bkv_sched_wait(NULL, 0), BKV_EINVAL);
	cr_assert_eq(bkv_sched_wake(NULL), BKV_EINVAL);
	make(&f);
	submit(f.s);
	cr_assert_eq(bkv_step(f.s, NULL), BKV_OK);
	cr_assert_eq(in_callback_rc, BKV_ESTATE, "a wait from inside the step");
	bkv_sched_destroy(f.s);
	bkv_pool_destroy(f.pool);
}

Test(wait, a_wake_before_the_wait_is_not_lost)
{
	fixture f;

	make(&f);
	cr_assert_eq(bkv_sched_wake(f.s), BKV_OK);
	cr_assert_eq(bkv_sched_wait(f.s, UINT64_MAX), BKV_EAGAIN, "the earlier wake ends it");
	cr_assert_eq(bkv_sched_wait(f.s, 1000), BKV_EAGAIN, "and only that wait: a timeout");
	bkv_sched_destroy(f.s);
	bkv_pool_destroy(f.pool);
}
