/*
 * test_sched_thread.c - bkv_submit and bkv_abort from 8 threads while one
 * thread runs bkv_step.
 *
 * The submitters retry on BKV_EAGAIN (a small max_queue makes the bound bite),
 * abort some of their own requests (live or already ended) and some ids that
 * were never handed out. The stepping thread checks every invariant after each
 * step. At the end every accepted request has ended exactly once, and every
 * abort that answered BKV_OK ended its request (with ABORT, unless the request
 * was ending in the very step that raced with the abort).
 *
 * Criterion's forking runner does not start under ThreadSanitizer, so the same
 * file also builds as a plain program (-DSCHED_THREAD_MAIN) for the TSan run
 * documented in docs/design.md.
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>

#ifdef SCHED_THREAD_MAIN
#include <stdio.h>
#include <stdlib.h>
#define cr_assert(cond, ...)                                                   \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                               \
		}                                                              \
	} while (0)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b))
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b))
#define cr_expect(cond, ...) cr_assert(cond)
#define cr_log_info(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))
#define Test(suite, name) int main(void)
#else
#include <criterion/criterion.h>
#endif

#define THREADS 8
#define PER_THREAD 300
#define MAX_ID (THREADS * PER_THREAD + 1)

typedef struct world {
	bkv_sched *s;
	bkv_pool *pool;
	/* written by the stepping thread only (callbacks) */
	uint32_t finish_count[MAX_ID + 1];
	bkv_finish_reason reason[MAX_ID + 1];
	uint32_t tokens[MAX_ID + 1];
	uint32_t finished;
	uint32_t threads_done; /* atomic: submitters that returned */
	uint32_t bad;          /* atomic: unexpected answers seen by threads */
} world;

typedef struct worker {
	world *w;
	uint32_t index;
	uint64_t ids[PER_THREAD];
	uint8_t abort_ok[PER_THREAD];
	uint32_t eagain;
} worker;

static int forward(void *h, const bkv_batch *b, int32_t *next)
{
	uint32_t r;

	(void)h;
	for (r = 0; r < b->n_rows; r++)
		if (b->row_sample[r])
			next[r] = 1000 + b->positions[b->qo_indptr[r + 1] - 1];
	return 0;
}

static void on_token(void *h, uint64_t id, uint32_t br, int32_t t, void *u)
{
	world *w = h;

	(void)br;
	(void)t;
	(void)u;
	if (id <= MAX_ID)
		w->tokens[id]++;
}

static void on_finish(void *h, uint64_t id, bkv_finish_reason why, void *u)
{
	world *w = h;

	(void)u;
	if (id <= MAX_ID) {
		w->finish_count[id]++;
		w->reason[id] = why;
	}
	w->finished++;
}

static void *submitter(void *arg)
{
	worker *k = arg;
	uint64_t rng = 0x9e3779b97f4a7c15ull * (k->index + 1);
	int32_t prompt[32];
	uint32_t i, j;

	for (i = 0; i < 32; i++)
		prompt[i] = (int32_t)(k->index * 100 + i);
	for (i = 0; i < PER_THREAD; i++) {
		bkv_request q;
		int rc;

		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		bkv_request_init(&q);
		q.prompt = prompt;
		q.prompt_len = 1 + (uint32_t)((rng >> 33) % 32);
		q.max_new_tokens = 1 + (uint32_t)((rng >> 40) % 8);
		while ((rc = bkv_submit(k->w->s, &q, &k->ids[i])) == BKV_EAGAIN) {
			k->eagain++;
			sched_yield();
		}
		if (rc != BKV_OK)
			__atomic_add_fetch(&k->w->bad, 1, __ATOMIC_RELAXED);
		if ((rng >> 50) % 4 == 0) { /* abort one of ours, live or ended */
			j = (uint32_t)((rng >> 20) % (i + 1));
			rc = bkv_abort(k->w->s, k->ids[j]);
			if (rc == BKV_OK && k->abort_ok[j])
				__atomic_add_fetch(&k->w->bad, 1, __ATOMIC_RELAXED);
			else if (rc == BKV_OK)
				k->abort_ok[j] = 1;
			else if (rc != BKV_ENOENT)
				__atomic_add_fetch(&k->w->bad, 1, __ATOMIC_RELAXED);
		}
		if ((rng >> 55) % 16 == 0 && bkv_abort(k->w->s, (uint64_t)1 << 40) != BKV_ENOENT)
			__atomic_add_fetch(&k->w->bad, 1, __ATOMIC_RELAXED);
	}
	__atomic_add_fetch(&k->w->threads_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

Test(sched_thread, eight_submitters_one_stepper_every_request_accounted_for)
{
	static world w;
	static worker wk[THREADS];
	pthread_t th[THREADS];
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_sched_stats st = {.size = sizeof(st)};
	uint32_t i, j, steps = 0, eagain = 0, aborted_ok = 0;
	uint64_t id;

	memset(&w, 0, sizeof(w));
	memset(wk, 0, sizeof(wk));
	bkv_pool_config_init(&pc);
	pc.device_blocks = 64;
	pc.max_seqs = 256;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &w.pool), BKV_OK);
	bkv_sched_config_init(&sc);
	sc.max_running = 16;
	sc.max_queue = 48;
	memset(&ops, 0, sizeof(ops));
	ops.forward = forward;
	ops.on_token = on_token;
	ops.on_finish = on_finish;
	cr_assert_eq(bkv_sched_create(&sc, w.pool, &ops, &w, NULL, &w.s), BKV_OK);
	for (i = 0; i < THREADS; i++) {
		wk[i].w = &w;
		wk[i].index = i;
		cr_assert_eq(pthread_create(&th[i], NULL, submitter, &wk[i]), 0);
	}
	for (;;) {
		int submitting = __atomic_load_n(&w.threads_done, __ATOMIC_ACQUIRE) < THREADS;

		cr_assert_eq(bkv_step(w.s, NULL), BKV_OK);
		cr_assert_eq(bkv_sched_check(w.s), 0, "check %d at step %u",
			     bkv_sched_check(w.s), steps);
		steps++;
		if (!submitting && bkv_sched_pending(w.s) == 0)
			break;
		cr_assert(steps < 1000000);
	}
	for (i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	/* joined: nothing can be in flight now */
	while (bkv_sched_pending(w.s))
		cr_assert_eq(bkv_step(w.s, NULL), BKV_OK);
	cr_assert_eq(bkv_sched_check(w.s), 0);
	cr_assert_eq(w.bad, 0, "a submitter saw an unexpected answer");
	for (i = 0; i < THREADS; i++) {
		eagain += wk[i].eagain;
		for (j = 0; j < PER_THREAD; j++) {
			id = wk[i].ids[j];
			cr_assert(id >= 1 && id <= MAX_ID);
			cr_assert_eq(w.finish_count[id], 1, "request %llu ended %u times",
				     (unsigned long long)id, w.finish_count[id]);
			if (wk[i].abort_ok[j]) {
				aborted_ok++;
				cr_assert(w.reason[id] == BKV_FINISH_ABORT || w.tokens[id] > 0);
			} else {
				cr_assert_neq(w.reason[id], BKV_FINISH_ABORT);
			}
		}
	}
	cr_assert_eq(w.finished, THREADS * PER_THREAD);
	bkv_sched_stats_get(w.s, &st);
	cr_assert_eq(st.submitted, THREADS * PER_THREAD);
	cr_assert_eq(st.finished, THREADS * PER_THREAD);
	cr_log_info("%u steps, %u EAGAIN retries, %u aborts answered OK (%llu ended ABORT)",
		    steps, eagain, aborted_ok, (unsigned long long)st.aborted);
	cr_expect(aborted_ok > 50);
	cr_expect(eagain > 0, "max_queue was reached");
	bkv_sched_destroy(w.s);
	cr_assert_eq(bkv_pool_check(w.pool), 0);
	bkv_pool_destroy(w.pool);
#ifdef SCHED_THREAD_MAIN
	return 0;
#endif
}
