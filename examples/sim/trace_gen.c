/*
 * trace_gen.c - made-up traces: deterministic prompt tokens for any trace,
 * seed 000's workload and the synthetic workloads (trace.h).
 *
 * Prompt tokens are made up, deterministically: Mooncake requests expand each
 * hash id into 512 tokens that depend only on the id and the position inside
 * its block, so two requests with the same leading ids share the same leading
 * tokens and the prefix cache finds them; every other prompt is unique.
 *
 * Two generators draw the workloads. splitmix64 draws the synthetic ones
 * (arrival gaps, then prompt, then output length, per request); MT19937,
 * exactly as CPython's random module, draws seed 000's, so its traces are
 * the reference simulator's own. Both are seeded with the workload seed and
 * documented in docs/benchmarks.md so a run can be reproduced elsewhere.
 */
#include "trace.h"
#include "trace_alloc.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- prompt tokens ------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void trace_prompt_tokens(const trace *t, uint32_t i, int32_t *out)
{
	const trace_req *r = &t->reqs[i];
	if (r->n_hash) {
		const uint32_t *ids = t->hash_ids + r->hash_off;
		for (uint32_t k = 0; k < r->prompt_len; k++) {
			uint64_t h = ids[k / TRACE_HASH_BLOCK];
			uint64_t z = mix64((h << 10 | (k % TRACE_HASH_BLOCK)) ^ 0x6d6f6f6e63616b65ULL);
			out[k] = (int32_t)(z & 0x3fffffff);
		}
		return;
	}
	uint64_t base = mix64(t->salt ^ ((uint64_t)i << 32) ^ 0x756e69717565ULL);
	for (uint32_t k = 0; k < r->prompt_len; k++)
		out[k] = (int32_t)(mix64(base + k) & 0x3fffffff);
}

/* ---- synthetic workloads ------------------------------------------------- */

void trace_rng_seed(trace_rng *r, uint64_t seed)
{
	r->state = seed;
}

uint64_t trace_rng_next(trace_rng *r)
{
	return mix64(r->state += 0x9e3779b97f4a7c15ULL);
}

uint32_t trace_rng_range(trace_rng *r, uint32_t lo, uint32_t hi)
{
	if (hi <= lo)
		return lo;
	uint64_t span = (uint64_t)hi - lo + 1;
	uint64_t limit = UINT64_MAX - UINT64_MAX % span;
	uint64_t x;
	do
		x = trace_rng_next(r);
	while (x >= limit);
	return lo + (uint32_t)(x % span);
}

double trace_rng_unit(trace_rng *r)
{
	return (double)(trace_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

int trace_dist_parse(const char *s, trace_dist *d)
{
	if (!s || !*s)
		return -1;
	if (!strcmp(s, "seed000")) {
		d->kind = DIST_SEED000_GEN;
		d->lo = 1;
		d->hi = 64;
		return 0;
	}
	char *end;
	errno = 0;
	unsigned long lo = strtoul(s, &end, 10);
	if (errno || end == s || lo < 1 || lo > TRACE_MAX_TOKENS || *s == '-')
		return -1;
	if (!*end) {
		d->kind = DIST_CONST;
		d->lo = d->hi = (uint32_t)lo;
		return 0;
	}
	if (end[0] != '.' || end[1] != '.')
		return -1;
	const char *h = end + 2;
	unsigned long hi = strtoul(h, &end, 10);
	if (errno || end == h || *end || hi < lo || hi > TRACE_MAX_TOKENS || *h == '-')
		return -1;
	d->kind = DIST_UNIFORM;
	d->lo = (uint32_t)lo;
	d->hi = (uint32_t)hi;
	return 0;
}

uint32_t trace_dist_draw(const trace_dist *d, trace_rng *r)
{
	switch (d->kind) {
	case DIST_CONST:
		return d->lo;
	case DIST_UNIFORM:
		return trace_rng_range(r, d->lo, d->hi);
	case DIST_SEED000_GEN:
	default:
		return trace_rng_unit(r) < 0.40 ? 64 : trace_rng_range(r, 1, 39);
	}
}

/* ---- MT19937, as CPython's random module uses it -------------------------
 * Matsumoto and Nishimura's generator with init_by_array seeding; the
 * integer seed becomes the key of its 32-bit words (CPython's random.seed for
 * a non-negative int). randint and random() follow CPython's
 * _randbelow_with_getrandbits and random_random, so trace_seed000 yields the
 * very traces of the reference simulator SEED000-MODEL.md was fitted with. */

static void mt_init_genrand(trace_mt *m, uint32_t s)
{
	m->mt[0] = s;
	for (int i = 1; i < 624; i++)
		m->mt[i] = 1812433253u * (m->mt[i - 1] ^ (m->mt[i - 1] >> 30)) + (uint32_t)i;
	m->mti = 624;
}

void trace_mt_seed(trace_mt *m, uint64_t seed)
{
	uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
	int klen = key[1] ? 2 : 1;
	mt_init_genrand(m, 19650218u);
	int i = 1, j = 0;
	for (int k = 624 > klen ? 624 : klen; k; k--) {
		m->mt[i] = (m->mt[i] ^ ((m->mt[i - 1] ^ (m->mt[i - 1] >> 30)) * 1664525u)) + key[j] +
			   (uint32_t)j;
		i++;
		j++;
		if (i >= 624) {
			m->mt[0] = m->mt[623];
			i = 1;
		}
		if (j >= klen)
			j = 0;
	}
	for (int k = 623; k; k--) {
		m->mt[i] = (m->mt[i] ^ ((m->mt[i - 1] ^ (m->mt[i - 1] >> 30)) * 1566083941u)) -
			   (uint32_t)i;
		i++;
		if (i >= 624) {
			m->mt[0] = m->mt[623];
			i = 1;
		}
	}
	m->mt[0] = 0x80000000u;
}

uint32_t trace_mt_next(trace_mt *m)
{
	static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
	uint32_t y;
	if (m->mti >= 624) {
		int kk;
		for (kk = 0; kk < 624 - 397; kk++) {
			y = (m->mt[kk] & 0x80000000u) | (m->mt[kk + 1] & 0x7fffffffu);
			m->mt[kk] = m->mt[kk + 397] ^ (y >> 1) ^ mag01[y & 1u];
		}
		for (; kk < 623; kk++) {
			y = (m->mt[kk] & 0x80000000u) | (m->mt[kk + 1] & 0x7fffffffu);
			m->mt[kk] = m->mt[kk + (397 - 624)] ^ (y >> 1) ^ mag01[y & 1u];
		}
		y = (m->mt[623] & 0x80000000u) | (m->mt[0] & 0x7fffffffu);
		m->mt[623] = m->mt[396] ^ (y >> 1) ^ mag01[y & 1u];
		m->mti = 0;
	}
	y = m->mt[m->mti++];
	y ^= y >> 11;
	y ^= (y << 7) & 0x9d2c5680u;
	y ^= (y << 15) & 0xefc60000u;
	y ^= y >> 18;
	return y;
}

uint32_t trace_mt_randint(trace_mt *m, uint32_t lo, uint32_t hi)
{
	uint32_t n = hi - lo + 1, k = 0, r;
	if (hi <= lo)
		return lo;
	for (uint32_t v = n; v; v >>= 1)
		k++;
	do
		r = trace_mt_next(m) >> (32 - k);
	while (r >= n);
	return lo + r;
}

double trace_mt_random(trace_mt *m)
{
	uint32_t a = trace_mt_next(m) >> 5, b = trace_mt_next(m) >> 6;
	return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

int trace_seed000(trace *t, uint64_t seed)
{
	uint64_t salt = t->salt;
	memset(t, 0, sizeof(*t));
	t->salt = salt ^ seed;
	trace_mt m;
	trace_mt_seed(&m, seed);
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t p = trace_mt_randint(&m, 8, 64);
		uint32_t g = trace_mt_random(&m) < 0.40 ? 64 : trace_mt_randint(&m, 1, 39);
		if (trace_push(t, 0.0, p, g, NULL, 0)) {
			trace_free(t);
			return TRACE_ENOMEM;
		}
	}
	return TRACE_OK;
}

/* The next request's arrival time (us) after now; first: the workload's
 * first request. A bursty arrival draws, at a burst's first request, the gap
 * to it and the burst's size (*burst_left: its requests still to come). */
static double next_arrival(trace_arrival arr, double rate_per_s, trace_rng *r, double now,
			   int first, uint32_t *burst_left)
{
	if (!(rate_per_s > 0.0))
		return now;
	if (arr == ARRIVAL_POISSON)
		return now - log(1.0 - trace_rng_unit(r)) / rate_per_s * 1e6;
	if (arr == ARRIVAL_UNIFORM)
		return first ? now : now + 1e6 / rate_per_s;
	if (arr != ARRIVAL_BURSTY)
		return now;
	if (*burst_left) {
		(*burst_left)--;
		return now;
	}
	now -= log(1.0 - trace_rng_unit(r)) / rate_per_s * TRACE_BURST_MEAN * 1e6;
	double sz = log(1.0 - trace_rng_unit(r)) / log(1.0 - 1.0 / TRACE_BURST_MEAN);
	*burst_left = sz < 1e9 ? (uint32_t)sz : 1000000000u;
	return now;
}

int trace_synthetic(trace *t, uint32_t n, trace_arrival arr, double rate_per_s,
		    const trace_dist *prompt, const trace_dist *output, uint64_t seed)
{
	uint64_t salt = t->salt;
	memset(t, 0, sizeof(*t));
	t->salt = salt ^ seed;
	trace_rng r;
	trace_rng_seed(&r, seed);
	double now = 0.0;
	uint32_t burst_left = 0;
	for (uint32_t i = 0; i < n; i++) {
		now = next_arrival(arr, rate_per_s, &r, now, i == 0, &burst_left);
		uint32_t p = trace_dist_draw(prompt, &r);
		uint32_t o = trace_dist_draw(output, &r);
		if (trace_push(t, now, p, o, NULL, 0)) {
			trace_free(t);
			return TRACE_ENOMEM;
		}
	}
	return TRACE_OK;
}

/* ---- rotating sessions --------------------------------------------------- */

/* Session s's context lives in ids[s * cap .. s * cap + len[s]); every id is
 * fresh (the first session's first id is 0), so sessions share nothing and
 * a session's turn shares its whole previous prompt. */
int trace_sessions(trace *t, const trace_sessions_spec *sp, trace_arrival arr, double rate_per_s,
		   const trace_dist *context, const trace_dist *output, uint64_t seed)
{
	uint64_t salt = t->salt;
	memset(t, 0, sizeof(*t));
	t->salt = salt ^ seed;
	uint32_t ns = sp->sessions, grow = (sp->grow + TRACE_HASH_BLOCK - 1) / TRACE_HASH_BLOCK;
	if (ns == 0 || sp->turns == 0)
		return TRACE_OK;
	trace_rng r;
	trace_rng_seed(&r, seed);
	/* the longest context: the longest first one plus every turn's growth */
	uint32_t cap = (context->kind == DIST_CONST ? context->lo : context->hi) / TRACE_HASH_BLOCK +
		       1 + grow * sp->turns;
	if ((uint64_t)cap * TRACE_HASH_BLOCK > TRACE_MAX_TOKENS)
		return TRACE_EPARSE;
	uint32_t *ids = trace__malloc((size_t)ns * cap * sizeof(*ids));
	uint32_t *len = trace__malloc((size_t)ns * sizeof(*len));
	uint32_t *order = trace__malloc((size_t)ns * sizeof(*order));
	uint32_t fresh = 0, burst_left = 0;
	int rc = TRACE_OK;
	double now = 0.0;
	if (!ids || !len || !order) {
		rc = TRACE_ENOMEM;
		goto out;
	}
	for (uint32_t s = 0; s < ns; s++) { /* first contexts, whole blocks */
		uint32_t n = (trace_dist_draw(context, &r) + TRACE_HASH_BLOCK - 1) / TRACE_HASH_BLOCK;
		len[s] = n ? n : 1;
		for (uint32_t k = 0; k < len[s]; k++)
			ids[(size_t)s * cap + k] = fresh++;
		order[s] = s;
	}
	for (uint32_t turn = 0; turn < sp->turns && rc == TRACE_OK; turn++) {
		if (sp->order == SESSIONS_SHUFFLE) /* a fresh permutation per round */
			for (uint32_t i = ns - 1; i > 0; i--) {
				uint32_t j = trace_rng_range(&r, 0, i), x = order[i];
				order[i] = order[j];
				order[j] = x;
			}
		for (uint32_t i = 0; i < ns && rc == TRACE_OK; i++) {
			uint32_t s = order[i], *ctx = ids + (size_t)s * cap;
			if (turn > 0) /* the last answer and the next question */
				for (uint32_t k = 0; k < grow; k++)
					ctx[len[s]++] = fresh++;
			now = next_arrival(arr, rate_per_s, &r, now, t->n == 0, &burst_left);
			rc = trace_push(t, now, len[s] * TRACE_HASH_BLOCK, trace_dist_draw(output, &r),
					ctx, len[s]);
		}
	}
out:
	trace__free(ids);
	trace__free(len);
	trace__free(order);
	if (rc != TRACE_OK)
		trace_free(t);
	return rc;
}
