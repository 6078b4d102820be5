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
 *   bench_pool_mlp pair AHEAD MB      whether the two halves of a 128-byte
 *                                     aligned pair cost one random miss
 *                                     (the L2's adjacent-line prefetcher):
 *                                     per item, one random line plus both
 *                                     lines of one random 128-byte pair,
 *                                     against 2 and 3 random lines, all
 *                                     prefetched AHEAD items on; the pair
 *                                     once with both its lines prefetched
 *                                     and once with only its first. Five
 *                                     rounds of the four, in turn
 *   bench_pool_mlp lookup H S MB      a lookup's pattern without the
 *                                     library: an index (8-byte slots, a
 *                                     quarter of MB) whose slots name
 *                                     128-byte frames (record line, token
 *                                     line; the rest of MB); per item the
 *                                     slot is asked for H items ahead and
 *                                     read S ahead, which asks for its
 *                                     frame's lines, then the frame's
 *                                     record is written and its token line
 *                                     read
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

/*
 * One timed pass over the items in one of four ways. r[3i..3i+2] are random
 * line offsets; a pair is r[3i+1] rounded down to 128 bytes and the line
 * after it.
 */
enum pair_mode { RAND2, RAND3, PAIR_PF2, PAIR_PF1 };

static double pair_pass(char *a, const uint64_t *r, unsigned ahead, enum pair_mode m)
{
	double t0 = now_ns();
	size_t i;

	for (i = 0; i < ITEMS; i++) {
		const uint64_t *x = r + 3 * i, *y = x + 3 * (size_t)ahead;
		uint64_t p;

		switch (m) {
		case RAND2:
			if (i + ahead < ITEMS) {
				__builtin_prefetch(a + y[0], 1);
				__builtin_prefetch(a + y[1], 1);
			}
			a[x[0]]++;
			a[x[1]]++;
			break;
		case RAND3:
			if (i + ahead < ITEMS) {
				__builtin_prefetch(a + y[0], 1);
				__builtin_prefetch(a + y[1], 1);
				__builtin_prefetch(a + y[2], 1);
			}
			a[x[0]]++;
			a[x[1]]++;
			a[x[2]]++;
			break;
		case PAIR_PF2:
		case PAIR_PF1:
			if (i + ahead < ITEMS) {
				p = y[1] & ~(uint64_t)127;
				__builtin_prefetch(a + y[0], 1);
				__builtin_prefetch(a + p, 1);
				if (m == PAIR_PF2)
					__builtin_prefetch(a + p + 64, 1);
			}
			p = x[1] & ~(uint64_t)127;
			a[x[0]]++;
			a[p]++;
			a[p + 64]++;
			break;
		}
	}
	return (now_ns() - t0) / ITEMS;
}

static void pair(unsigned ahead, size_t mb)
{
	static const char *const name[] = {"2 random lines", "3 random lines",
					   "1 line + 1 pair, 3 prefetches",
					   "1 line + 1 pair, 2 prefetches"};
	size_t bytes = mb << 20, n = bytes / 64, i;
	char *a = huge_array(bytes);
	uint64_t *r = malloc(((size_t)ITEMS + ahead) * 3 * sizeof *r);
	double best[4];
	int round, m, k;

	if (!r)
		exit(1);
	for (i = 0; i < ((size_t)ITEMS + ahead) * 3; i++)
		r[i] = (rnd() % n) * 64;
	printf("pair, %u ahead, %zu MB: ns/item, best of %d passes, per round\n", ahead, mb, RUNS);
	for (round = 0; round < 5; round++) {
		for (m = 0; m < 4; m++) {
			best[m] = 1e300;
			for (k = 0; k < RUNS; k++) {
				double d = pair_pass(a, r, ahead, (enum pair_mode)m);

				if (d < best[m])
					best[m] = d;
			}
		}
		for (m = 0; m < 4; m++)
			printf("  %-31s %6.1f\n", name[m], best[m]);
		printf("\n");
	}
	printf("(end %d)\n", a[0]);
}

static double lookup_pass(const uint64_t *slots, char *frames, const uint64_t *r, size_t items,
			  unsigned h, unsigned s, int both)
{
	double t0 = now_ns();
	uint64_t sum = 0;
	size_t i;

	for (i = 0; i < items; i++) {
		const char *f;

		if (i + h < items)
			__builtin_prefetch(&slots[r[i + h]]);
		if (i + s < items) {
			f = frames + slots[r[i + s]] * 128;
			__builtin_prefetch(f, 1);
			if (both)
				__builtin_prefetch(f + 64);
		}
		f = frames + slots[r[i]] * 128;
		(*(uint32_t *)(void *)(f + 24))++;
		sum += *(const uint64_t *)(const void *)(f + 64) ^ *(const uint64_t *)(const void *)(f + 120);
	}
	if (sum == 42)
		printf("!");
	return (now_ns() - t0) / items;
}

static void lookup(unsigned h, unsigned s, size_t mb)
{
	size_t bytes = mb << 20, nslots = bytes / 4 / 8, nf = (bytes - nslots * 8) / 128, i;
	uint64_t *slots = (uint64_t *)(void *)huge_array(nslots * 8);
	char *frames = huge_array(nf * 128);
	uint64_t *r = malloc((size_t)ITEMS * sizeof *r);
	double best[2] = {1e300, 1e300};
	int k, both;

	if (!r)
		exit(1);
	for (i = 0; i < nslots; i++)
		slots[i] = rnd() % nf;
	for (i = 0; i < ITEMS; i++)
		r[i] = rnd() % nslots;
	for (k = 0; k < RUNS; k++)
		for (both = 0; both < 2; both++) {
			double d = lookup_pass(slots, frames, r, ITEMS, h, s, both);

			if (d < best[both])
				best[both] = d;
		}
	printf("lookup, slots %u ahead, frames %u ahead, %zu MB: %.1f ns/item (record line "
	       "asked for), %.1f (both lines)\n", h, s, mb, best[0], best[1]);
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
	if (argc == 4 && !strcmp(argv[1], "pair")) {
		pair((unsigned)strtoul(argv[2], NULL, 10), strtoul(argv[3], NULL, 10));
		return 0;
	}
	if (argc == 5 && !strcmp(argv[1], "lookup")) {
		lookup((unsigned)strtoul(argv[2], NULL, 10), (unsigned)strtoul(argv[3], NULL, 10),
		       strtoul(argv[4], NULL, 10));
		return 0;
	}
	fprintf(stderr, "usage: bench_pool_mlp chase MB | rmw LINES AHEAD MB | pair AHEAD MB | "
			"lookup H S MB\n");
	return 2;
}
