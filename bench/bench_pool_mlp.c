/*
 * bench_pool_mlp.c - what random cache lines cost on this machine, without
 * the library: the floor under bench_pool's scale figures.
 *
 *   bench_pool_mlp chase MB           a dependent walk (each load's address
 *                                     is the previous load's value) over
 *                                     MB of 64-byte lines in a random
 *                                     cycle: ns per hop, the latency one
 *                                     linked-list step pays
 *   bench_pool_mlp rmw L AHEAD MB     per item, L independent
 *                                     read-modify-writes of random lines,
 *                                     the lines of the item AHEAD items on
 *                                     prefetched first: ns per item and per
 *                                     line, the throughput a pipeline of
 *                                     prefetched misses reaches
 *
 * The array is advised onto transparent huge pages, as the pool's are
 * (kv/frames.c), and written once before timing. Timed on the thread's CPU
 * clock (the machine is shared); the best of 5 runs.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* madvise */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define RUNS 5
#define HOPS 2000000u
#define ITEMS (1u << 20)

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;

static uint64_t rnd(void) /* xorshift64 */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static char *huge_array(size_t bytes)
{
	char *a = aligned_alloc((size_t)2 << 20, bytes);

	if (!a) {
		fprintf(stderr, "bench_pool_mlp: out of memory\n");
		exit(1);
	}
#if defined(__linux__) && defined(MADV_HUGEPAGE)
	(void)madvise(a, bytes, MADV_HUGEPAGE);
#endif
	memset(a, 1, bytes);
	return a;
}

static void chase(size_t mb)
{
	size_t bytes = mb << 20, n = bytes / 64, i;
	uint64_t *a = (uint64_t *)(void *)huge_array(bytes), p = 0;
	uint32_t *perm = malloc(n * sizeof *perm);
	double best = 1e300;
	int r;

	if (!perm)
		exit(1);
	for (i = 0; i < n; i++)
		perm[i] = (uint32_t)i;
	for (i = n - 1; i > 0; i--) { /* Fisher-Yates: one random cycle */
		size_t j = rnd() % (i + 1);
		uint32_t t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (i = 0; i < n; i++)
		a[(size_t)perm[i] * 8] = (uint64_t)perm[(i + 1) % n] * 8;
	for (r = 0; r < RUNS; r++) {
		double t0 = now_ns(), d;

		for (i = 0; i < HOPS; i++)
			p = a[p];
		d = (now_ns() - t0) / HOPS;
		if (d < best)
			best = d;
	}
	printf("chase %zu MB: %.1f ns/hop (end %llu)\n", mb, best, (unsigned long long)p);
}

static void rmw(unsigned lines, unsigned ahead, size_t mb)
{
	size_t bytes = mb << 20, n = bytes / 64, i;
	char *a = huge_array(bytes);
	uint64_t *idx = malloc((size_t)ITEMS * lines * sizeof *idx);
	double best = 1e300;
	unsigned k;
	int r;

	if (!idx)
		exit(1);
	for (i = 0; i < (size_t)ITEMS * lines; i++)
		idx[i] = (rnd() % n) * 64;
	for (r = 0; r < RUNS; r++) {
		double t0 = now_ns(), d;

		for (i = 0; i < ITEMS; i++) {
			if (ahead && i + ahead < ITEMS)
				for (k = 0; k < lines; k++)
					__builtin_prefetch(a + idx[(i + ahead) * lines + k], 1);
			for (k = 0; k < lines; k++)
				a[idx[i * lines + k]]++;
		}
		d = (now_ns() - t0) / ITEMS;
		if (d < best)
			best = d;
	}
	printf("rmw %u lines, %u ahead, %zu MB: %.1f ns/item, %.1f ns/line\n", lines, ahead, mb,
	       best, best / lines);
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "chase")) {
		chase(strtoul(argv[2], NULL, 10));
		return 0;
	}
	if (argc == 5 && !strcmp(argv[1], "rmw")) {
		rmw((unsigned)strtoul(argv[2], NULL, 10), (unsigned)strtoul(argv[3], NULL, 10),
		    strtoul(argv[4], NULL, 10));
		return 0;
	}
	fprintf(stderr, "usage: bench_pool_mlp chase MB | rmw LINES AHEAD MB\n");
	return 2;
}
