/*
 * wait.c - the engine thread's wait for work (bkv_sched_wait): block until
 * a request is pending, another thread calls bkv_sched_wake, or a timeout
 * passes, instead of polling bkv_sched_pending. With a KV connector the
 * requests whose loads are in flight do not count as work (a step cannot
 * move them) until bkv_kv_xfer_done, which broadcasts under the same
 * mutex, completes a transfer.
 *
 * The sleep is a condition variable beside the inbox's mutex, on the
 * monotonic clock (a wall-clock change neither shortens nor stretches a
 * timeout). bkv_submit broadcasts it under the mutex when a waiter is
 * present (one test of a counter otherwise), so a submission between the
 * waiter's check and its sleep cannot be missed: both happen under the
 * mutex. bkv_sched_wake counts its calls; a wait returns when the count
 * moved since the previous wait ended, so a wake that comes before the
 * wait it is meant for is not lost.
 */
#define _POSIX_C_SOURCE 200809L
#include "sched/sched.h"

#include <time.h>

int bkv__wait_init(bkv_sched *s)
{
	pthread_condattr_t at;
	pthread_cond_t *cv = bkv__malloc(&s->alloc, sizeof(*cv));
	int ok;

	if (!cv)
		return BKV_ENOMEM;
	ok = pthread_condattr_init(&at) == 0;
	if (ok) {
		ok = pthread_condattr_setclock(&at, CLOCK_MONOTONIC) == 0 &&
		     pthread_cond_init(cv, &at) == 0;
		pthread_condattr_destroy(&at);
	}
	if (!ok) {
		bkv__free(&s->alloc, cv, sizeof(*cv));
		return BKV_ENOMEM;
	}
	s->in.cv = cv;
	return BKV_OK;
}

void bkv__wait_destroy(bkv_sched *s)
{
	if (!s->in.cv)
		return;
	pthread_cond_destroy((pthread_cond_t *)s->in.cv);
	bkv__free(&s->alloc, s->in.cv, sizeof(pthread_cond_t));
	s->in.cv = NULL;
}

/* now + us on the monotonic clock, saturating (a deadline past the clock's
 * range is as good as none). */
static struct timespec deadline(uint64_t us)
{
	struct timespec t;
	uint64_t sec = us / 1000000u;

	clock_gettime(CLOCK_MONOTONIC, &t);
	if (sec > (uint64_t)INT32_MAX) /* some centuries: forever */
		sec = (uint64_t)INT32_MAX;
	t.tv_sec += (time_t)sec;
	t.tv_nsec += (long)(us % 1000000u) * 1000;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

/* Lock held: a request is pending that a step can move (not one that only
 * waits for a KV connector's load in flight), or completed transfers wait
 * to be applied, or overlapped steps are outstanding. */
static int work(const bkv_sched *s)
{
	const uint32_t alive = ATOMIC_LOAD(&((bkv_sched *)s)->in.nr_alive);

	return alive > bkv__cn_idle(s) || (s->cn && bkv__ovl_outstanding(s));
}

int bkv_sched_wait(bkv_sched *s, uint64_t timeout_us)
{
	struct timespec until = {0, 0};
	uint32_t wakes;
	int rc = 0;

	if (!s)
		return BKV_EINVAL;
	if (s->plan.in_step)
		return BKV_ESTATE; /* from a callback: it would wait on itself */
	if (ATOMIC_LOAD(&s->in.nr_alive) && !s->cn)
		return BKV_OK;
	if (timeout_us != UINT64_MAX)
		until = deadline(timeout_us);
	LOCK(s);
	if (work(s) || timeout_us == 0) {
		rc = work(s) ? BKV_OK : BKV_EAGAIN;
		UNLOCK(s);
		return rc;
	}
	wakes = s->in.wakes_seen; /* a wake since the last wait ended counts */
	s->in.waiters++;
	while (!work(s) && s->in.wakes == wakes && rc == 0) {
		if (timeout_us == UINT64_MAX)
			pthread_cond_wait((pthread_cond_t *)s->in.cv, (pthread_mutex_t *)s->in.lock);
		else
			rc = pthread_cond_timedwait((pthread_cond_t *)s->in.cv,
						    (pthread_mutex_t *)s->in.lock, &until);
	}
	s->in.waiters--;
	s->in.wakes_seen = s->in.wakes;
	rc = work(s) ? BKV_OK : BKV_EAGAIN;
	UNLOCK(s);
	return rc;
}

int bkv_sched_wake(bkv_sched *s)
{
	if (!s)
		return BKV_EINVAL;
	LOCK(s);
	s->in.wakes++;
	if (s->in.waiters)
		pthread_cond_broadcast((pthread_cond_t *)s->in.cv);
	UNLOCK(s);
	return BKV_OK;
}
