/*
 * soak.c - one million requests through the scheduler and a small pool, on
 * a virtual clock, to show that nothing accumulates: resident memory stays
 * flat after warm-up, the library's live heap stays flat, and every
 * invariant holds at intervals.
 *
 * The host is tests/support/fakehost.h (batch shape and input tokens checked on
 * every call; the KV cell model is off to keep a million requests fast).
 * Requests are drawn with bkv-sim's generator (examples/sim/trace.h,
 * splitmix64): a prompt of one of 8 shared 32-token system prompts (prefix
 * hits) plus a 1..96-token suffix, 1..64 new tokens, two samples for one
 * request in 50, a stop token for one in 10, an abort for one in 100 (a few
 * steps after its submission), and a host failure every 997th call (rolled
 * back and retried). About 64 requests are in flight at a time; the pool has
 * 160 blocks of 16 tokens, a 128-block swap tier, and preempts by swap or
 * recompute as its cost rule decides.
 *
 * Every request is accounted for: each ends exactly once, and each that ran
 * to its end (length or stop) delivered exactly its closed-form tokens.
 * bkv_sched_check runs every 4096 steps. Resident memory (VmRSS from
 * /proc/self/statm) and the library's live bytes (a counting allocator) are
 * sampled every 50,000 requests. The run pauses submitting once 100,000
 * requests (the warm-up) are in, lets the scheduler drain, and records the
 * library's idle live bytes; at the end (idle again) they must be exactly the
 * same, and RSS may not have grown by more than 1 MiB since the warm-up, or
 * the program fails. (While requests are in flight the live bytes move with
 * their sizes: each request is one allocation of its prompt + max_new.)
 *
 *   soak [REQUESTS]     default 1000000
 */
#include "batchkv.h"
#include "fuzz.h"
#include "fakehost.h"
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* AddressSanitizer holds freed memory in a quarantine (up to 256 MiB), so
 * RSS says nothing about leaks there; its builds check the live bytes and
 * leave leaks to LeakSanitizer. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_MEANINGFUL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_MEANINGFUL 0
#endif
#endif
#ifndef RSS_MEANINGFUL
#define RSS_MEANINGFUL 1
#endif

#define INFLIGHT 64u
#define RECS 256u            /* request records, recycled */
#define SYS_LEN 32u
#define MAX_SUFFIX 96u
#define MAX_NEW 64u
#define SAMPLE_EVERY 50000u
#define WARMUP 100000u

typedef struct rec {
	kh_req q;
	int32_t prompt[SYS_LEN + MAX_SUFFIX];
	int32_t hist[2 * MAX_NEW];
	uint64_t abort_at;   /* step at which to abort it; 0 = never */
	int busy;            /* submitted, not yet recycled */
} rec;

typedef struct soak {
	kh_host h;
	rec r[RECS];
	uint32_t free_stack[RECS];
	uint32_t n_free;
	uint32_t done_stack[RECS]; /* ended this step, to check and recycle */
	uint32_t n_done;
	uint64_t finished, aborted, errors, checked_tokens;
	int bad;
} soak;

static soak S;

static void soak_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	rec *r = user;

	kh_on_finish(host, req, why, user);
	S.done_stack[S.n_done++] = (uint32_t)(r - S.r);
}

static uint64_t fail_calls;

static int fail_hook(void *ctx, const bkv_batch *b)
{
	(void)ctx;
	(void)b;
	return ++fail_calls % 997 == 0;
}

static long rss_kib(void)
{
	long pages = 0, res = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (!f)
		return -1;
	if (fscanf(f, "%ld %ld", &pages, &res) != 2)
		res = -1;
	fclose(f);
	return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Check a request that ran to its end against the sampler's closed form. */
static void verify(const rec *x)
{
	const kh_req *q = &x->q;
	uint32_t b, i;

	for (b = 0; b < q->n; b++) {
		int32_t in = q->prompt[q->prompt_len - 1];

		for (i = 0; i < q->n_out[b]; i++) {
			int32_t t = kh_sample(q, b, q->prompt_len + i, in);

			if (q->hist[b * q->max_new + i] != t) {
				fprintf(stderr, "soak: req tag %llu branch %u token %u is %d, not %d\n",
					(unsigned long long)q->tag, b, i, q->hist[b * q->max_new + i], t);
				S.bad = 1;
				return;
			}
			in = t;
		}
		S.checked_tokens += q->n_out[b];
		if (q->n_out[b] != q->max_new && !(q->n_out[b] && kh_is_stop(q, in))) {
			fprintf(stderr, "soak: req tag %llu branch %u ended after %u of %u tokens\n",
				(unsigned long long)q->tag, b, q->n_out[b], q->max_new);
			S.bad = 1;
		}
	}
}

int main(int argc, char **argv)
{
	uint64_t total = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000ull;
	uint64_t submitted = 0, steps = 0, next_sample = SAMPLE_EVERY, tag = 0;
	int32_t sys_prompt[8][SYS_LEN];
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops = kh_ops(0);
	bkv_allocator a;
	bkv_sched_stats st;
	bkv_pool_stats ps;
	bkv_pool *pool = NULL;
	bkv_sched *s = NULL;
	fz_mem mem;
	trace_rng rng;
	trace_dist suffix = {DIST_UNIFORM, 1, MAX_SUFFIX}, out = {DIST_UNIFORM, 1, MAX_NEW};
	long rss_warm = -1, rss_max = 0, rss_min = 0, rss;
	int64_t live_warm = -1, live_max = 0, idle_warm = -1;
	uint64_t warmup = total < 2 * WARMUP ? total / 2 : WARMUP;
	uint32_t i, j;
	struct timespec t0, t1;
	int rc, fail = 0;

	if (total == 0)
		return 2;
	memset(&mem, 0, sizeof(mem));
	a = fz_allocator(&mem);
	trace_rng_seed(&rng, 20261129);
	for (i = 0; i < 8; i++)
		for (j = 0; j < SYS_LEN; j++)
			sys_prompt[i][j] = (int32_t)(1000 * (i + 1) + j);
	for (i = 0; i < RECS; i++)
		S.free_stack[S.n_free++] = RECS - 1 - i;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 16;
	pc.device_blocks = 160;
	pc.host_blocks = 128;
	pc.max_seqs = 256;
	bkv_sched_config_init(&sc);
	sc.max_running = 32;
	sc.max_queue = 4096;
	if (bkv_pool_create(&pc, &a, &pool) != BKV_OK ||
	    kh_init(&S.h, pc.block_tokens, pc.device_blocks, pc.host_blocks, 0) != 0)
		return 2;
	S.h.fail_hook = fail_hook;
	ops.on_finish = soak_finish;
	if (bkv_sched_create(&sc, pool, &ops, &S.h, &a, &s) != BKV_OK)
		return 2;

	printf("soak: %llu requests, pool %u x %u-token blocks (+%u host), %u slots, ~%u in "
	       "flight\n",
	       (unsigned long long)total, pc.device_blocks, pc.block_tokens, pc.host_blocks,
	       sc.max_running, INFLIGHT);
	printf("%10s %10s %9s %12s %8s %8s %10s %8s\n", "requests", "steps", "rss_kib",
	       "lib_live_b", "used", "cached", "preempt", "failed");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (S.finished < total) {
		/* keep INFLIGHT requests in the scheduler */
		if (idle_warm < 0 && submitted == warmup && S.finished == warmup) {
			idle_warm = mem.live_bytes; /* drained after the warm-up */
			rss_warm = rss_kib();
			rss_min = rss_max = rss_warm;
		}
		while (submitted < total && submitted - S.finished < INFLIGHT && S.n_free &&
		       (submitted < warmup || idle_warm >= 0)) {
			rec *x = &S.r[S.free_stack[--S.n_free]];
			kh_req *q = &x->q;
			uint32_t sys = trace_rng_range(&rng, 0, 7);
			uint32_t len = SYS_LEN + trace_dist_draw(&suffix, &rng);
			uint32_t n = trace_rng_range(&rng, 0, 49) == 0 ? 2 : 1;

			memcpy(x->prompt, sys_prompt[sys], sizeof(sys_prompt[sys]));
			for (j = SYS_LEN; j < len; j++)
				x->prompt[j] = (int32_t)(trace_rng_next(&rng) & 0xffffff);
			memset(q, 0, sizeof(*q));
			q->magic = KH_MAGIC;
			q->tag = ++tag;
			q->prompt = x->prompt;
			q->prompt_len = len;
			q->max_new = trace_dist_draw(&out, &rng);
			q->n = n;
			q->hist = x->hist;
			memset(x->hist, 0, sizeof(x->hist));
			if (trace_rng_range(&rng, 0, 9) == 0) {
				q->stop_mod = 8;
				q->stop[0] = KH_STOP;
				q->n_stop = 1;
			}
			x->abort_at = trace_rng_range(&rng, 0, 99) == 0
					      ? steps + trace_rng_range(&rng, 0, 40)
					      : 0;
			rc = kh_submit(s, q, 0);
			if (rc != BKV_OK) {
				fprintf(stderr, "soak: submit: %s\n", bkv_strerror(rc));
				return 1;
			}
			x->busy = 1;
			submitted++;
		}
		rc = bkv_step(s, NULL);
		steps++;
		if (rc != BKV_OK && rc != BKV_EHOST) {
			fprintf(stderr, "soak: step: %s\n", bkv_strerror(rc));
			return 1;
		}
		if (S.h.violations) {
			fprintf(stderr, "soak: host: %s\n", S.h.first);
			return 1;
		}
		/* aborts that are due */
		for (i = 0; i < RECS; i++) {
			rec *x = &S.r[i];

			if (x->busy && x->abort_at && x->abort_at <= steps && !x->q.finished) {
				x->abort_at = 0;
				rc = kh_abort(s, &x->q, x->q.id);
				if (rc != BKV_OK) {
					fprintf(stderr, "soak: abort: %s\n", bkv_strerror(rc));
					return 1;
				}
			}
		}
		/* check and recycle the requests that ended */
		for (i = 0; i < S.n_done; i++) {
			rec *x = &S.r[S.done_stack[i]];

			if (x->q.finished != 1) {
				fprintf(stderr, "soak: req tag %llu ended %u times\n",
					(unsigned long long)x->q.tag, x->q.finished);
				return 1;
			}
			if (x->q.reason == BKV_FINISH_ABORT)
				S.aborted++;
			else if (x->q.reason == BKV_FINISH_ERROR)
				S.errors++;
			else
				verify(x);
			x->busy = 0;
			S.free_stack[S.n_free++] = S.done_stack[i];
			S.finished++;
		}
		S.n_done = 0;
		if (S.bad)
			return 1;
		if (steps % 4096 == 0 && (rc = bkv_sched_check(s)) != 0) {
			fprintf(stderr, "soak: bkv_sched_check = %d at step %llu\n", rc,
				(unsigned long long)steps);
			return 1;
		}
		if (S.finished >= next_sample || S.finished == total) {
			rss = rss_kib();
			memset(&ps, 0, sizeof(ps));
			ps.size = sizeof(ps);
			bkv_pool_stats_get(pool, &ps);
			memset(&st, 0, sizeof(st));
			st.size = sizeof(st);
			bkv_sched_stats_get(s, &st);
			printf("%10llu %10llu %9ld %12lld %8u %8u %10llu %8llu\n",
			       (unsigned long long)S.finished, (unsigned long long)steps, rss,
			       (long long)mem.live_bytes, ps.nr_used, ps.nr_cached,
			       (unsigned long long)st.preemptions, (unsigned long long)st.failed_steps);
			fflush(stdout);
			if (idle_warm >= 0) {
				if (live_warm < 0)
					live_warm = live_max = mem.live_bytes;
				rss_max = rss > rss_max ? rss : rss_max;
				rss_min = rss < rss_min ? rss : rss_min;
				live_max = mem.live_bytes > live_max ? mem.live_bytes : live_max;
			}
			while (next_sample <= S.finished)
				next_sample += SAMPLE_EVERY;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	rc = bkv_sched_check(s);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(s, &st);
	printf("soak: %llu requests ended (%llu aborted, %llu by host error), %llu tokens checked, "
	       "%llu steps (%llu rolled back), %llu preemptions (%llu swaps), %llu prefix-hit "
	       "tokens, %.1f s\n",
	       (unsigned long long)S.finished, (unsigned long long)S.aborted,
	       (unsigned long long)S.errors, (unsigned long long)S.checked_tokens,
	       (unsigned long long)st.steps, (unsigned long long)st.failed_steps,
	       (unsigned long long)st.preemptions, (unsigned long long)st.swaps,
	       (unsigned long long)st.hit_tokens,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	printf("soak: RSS after warm-up %ld KiB, range %ld..%ld KiB (growth %ld KiB); library "
	       "live bytes idle after warm-up %lld, idle at the end %lld, busy max %lld\n",
	       rss_warm, rss_min, rss_max, rss_max - rss_warm, (long long)idle_warm,
	       (long long)mem.live_bytes, (long long)live_max);
	if (rc != 0) {
		fprintf(stderr, "soak: final bkv_sched_check = %d\n", rc);
		fail = 1;
	}
	if (st.submitted != total || st.finished != total || bkv_sched_pending(s) != 0) {
		fprintf(stderr, "soak: submitted %llu, finished %llu of %llu\n",
			(unsigned long long)st.submitted, (unsigned long long)st.finished,
			(unsigned long long)total);
		fail = 1;
	}
	if (RSS_MEANINGFUL && rss_max - rss_warm > 1024) {
		fprintf(stderr, "soak: RSS grew by %ld KiB after warm-up\n", rss_max - rss_warm);
		fail = 1;
	}
	if (mem.live_bytes != idle_warm) {
		fprintf(stderr, "soak: the library's idle heap grew after warm-up\n");
		fail = 1;
	}
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
	kh_fini(&S.h);
	if (mem.live_bytes != 0) {
		fprintf(stderr, "soak: %lld bytes left after destroy\n", (long long)mem.live_bytes);
		fail = 1;
	}
	printf("soak: %s\n", fail ? "FAILED" : "ok");
	return fail;
}
