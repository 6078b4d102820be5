/*
 * fuzz_trace.c - bkv-sim's trace parsers driven by arbitrary bytes.
 *
 * The first byte picks the format (Azure CSV, Mooncake JSONL, DistServe CSV),
 * whether a DistServe run filter follows (a short NUL-ended string) and
 * which of the parser's heap allocations to refuse; the rest is the file.
 * The parsers allocate through a counting allocator set with
 * trace_set_allocator (examples/sim/trace_alloc.h), so out-of-memory paths
 * are fuzzed too and a leak shows as a live allocation after trace_free
 * (LeakSanitizer sees it too).
 *
 * After each parse the harness checks the parser's contract (trace.h):
 *   - the return is TRACE_OK, TRACE_EPARSE (with a "line N: ..." message that
 *     fits err) or TRACE_ENOMEM (only when an allocation was refused);
 *   - on failure the trace is empty (no arrays, n 0) and its salt kept;
 *   - on success every request has 1 <= prompt_len, output_len <=
 *     TRACE_MAX_TOKENS, finite arrivals that never decrease (for Azure and
 *     Mooncake: starting at 0; for DistServe: within the filtered run),
 *     hash ids inside the stored array, and prompt tokens that are in
 *     [0, 2^30), deterministic, and equal for requests whose first prefix-
 *     block id is equal (what the prefix cache relies on);
 *   - trace_distserve_runs and trace_dist_parse on the same bytes behave.
 */
#include "fuzz.h"
#include "trace.h"
#include "trace_alloc.h"

#include <math.h>

/* ---- the parser, with its allocations counted ---------------------------- */

static uint64_t ft_calls;   /* malloc + realloc calls */
static uint64_t ft_fail_at; /* 1-based call to refuse; 0 none */
static uint64_t ft_refused; /* calls refused */
static int64_t ft_live;     /* allocations not freed */

static void *ft_malloc(size_t n)
{
	void *p;

	if (++ft_calls == ft_fail_at) {
		ft_refused++;
		return NULL;
	}
	p = malloc(n);
	if (p)
		ft_live++;
	return p;
}

static void *ft_realloc(void *p, size_t n)
{
	void *q;

	if (++ft_calls == ft_fail_at) {
		ft_refused++;
		return NULL;
	}
	q = realloc(p, n);
	if (q && !p)
		ft_live++;
	return q;
}

static void ft_free(void *p)
{
	if (p)
		ft_live--;
	free(p);
}

static const trace_allocator ft_allocator = {ft_malloc, ft_realloc, ft_free};

/* ---- checks -------------------------------------------------------------- */

static void check_empty(const trace *t, uint64_t salt)
{
	FZ_CHECK(t->reqs == NULL && t->n == 0 && t->cap == 0 && t->hash_ids == NULL &&
			 t->n_hash == 0 && t->hash_cap == 0,
		 "failed parse left a non-empty trace (n %u)", t->n);
	FZ_CHECK(t->salt == salt, "failed parse lost the salt");
}

/* sorted: arrivals never go back (not promised for an unfiltered DistServe
 * file with several runs: each run's clock starts again). zero: the first
 * arrival is 0 (Azure and Mooncake are made relative to their first request;
 * DistServe keeps the file's per-run relative times). */
static void check_trace(const trace *t, int sorted, int zero)
{
	static int32_t a[1 << 16], b[1 << 16];
	uint32_t i, j, checked = 0;

	FZ_CHECK(t->n <= t->cap && t->n_hash <= t->hash_cap, "counts above capacity");
	for (i = 0; i < t->n; i++) {
		const trace_req *r = &t->reqs[i];

		FZ_CHECK(isfinite(r->arrival_us) && r->arrival_us >= 0.0, "req %u arrival %g", i,
			 r->arrival_us);
		FZ_CHECK(!zero || i > 0 || r->arrival_us == 0.0, "first arrival %g, not 0",
			 r->arrival_us);
		FZ_CHECK(!sorted || i == 0 || r->arrival_us >= t->reqs[i - 1].arrival_us,
			 "req %u arrives before req %u", i, i - 1);
		FZ_CHECK(r->prompt_len >= 1 && r->prompt_len <= TRACE_MAX_TOKENS,
			 "req %u prompt_len %u", i, r->prompt_len);
		FZ_CHECK(r->output_len >= 1 && r->output_len <= TRACE_MAX_TOKENS,
			 "req %u output_len %u", i, r->output_len);
		FZ_CHECK((uint64_t)r->hash_off + r->n_hash <= t->n_hash, "req %u hash ids outside",
			 i);
		if (r->prompt_len > (1u << 16) || checked >= 8)
			continue;
		checked++;
		trace_prompt_tokens(t, i, a);
		trace_prompt_tokens(t, i, b);
		FZ_CHECK(!memcmp(a, b, (size_t)r->prompt_len * sizeof(int32_t)),
			 "req %u tokens not deterministic", i);
		for (j = 0; j < r->prompt_len; j++)
			FZ_CHECK(a[j] >= 0 && a[j] < (1 << 30), "req %u token %u = %d", i, j, a[j]);
		/* an earlier request with the same first block id: same first block */
		for (j = 0; j < i && r->n_hash; j++) {
			const trace_req *o = &t->reqs[j];
			uint32_t k, m;

			if (!o->n_hash || o->prompt_len > (1u << 16) ||
			    t->hash_ids[o->hash_off] != t->hash_ids[r->hash_off])
				continue;
			m = TRACE_HASH_BLOCK;
			if (r->n_hash == 1 || o->n_hash == 1)
				break; /* a last id covers only a remainder */
			trace_prompt_tokens(t, j, b);
			m = m < r->prompt_len ? m : r->prompt_len;
			m = m < o->prompt_len ? m : o->prompt_len;
			for (k = 0; k < m; k++)
				FZ_CHECK(a[k] == b[k], "reqs %u and %u share id %u but token %u differs",
					 j, i, t->hash_ids[r->hash_off], k);
			break;
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz f = {data, size, 0};
	uint8_t head = fz_u8(&f);
	trace_format fmt = (trace_format)(head % 4); /* 3 is not a format */
	char filter[17], err[96], names[8][32];
	const char *buf;
	size_t len, k = 0;
	trace t;
	trace_dist d;
	int rc, i;

	memset(&t, 0, sizeof(t));
	t.salt = 0x5a17;
	if (head & 0x10) {
		while (k < 16 && fz_more(&f) && (filter[k] = (char)fz_u8(&f)) != '\0')
			k++;
	}
	filter[k] = '\0';
	trace_set_allocator(&ft_allocator);
	ft_calls = ft_refused = 0;
	ft_live = 0;
	ft_fail_at = (head & 0x20) ? fz_u8(&f) % 8 + 1 : 0;
	buf = (const char *)data + f.i;
	len = size - f.i;

	rc = trace_parse(fmt, buf, len, (head & 0x10) ? filter : NULL, &t, err, sizeof(err));
	FZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL, "err not terminated");
	if (rc == TRACE_OK) {
		FZ_CHECK(fmt <= TRACE_DISTSERVE, "unknown format parsed");
		FZ_CHECK(t.salt == 0x5a17, "parse lost the salt");
		check_trace(&t, fmt != TRACE_DISTSERVE || (head & 0x10), fmt != TRACE_DISTSERVE);
	} else {
		FZ_CHECK(rc == TRACE_EPARSE || rc == TRACE_ENOMEM, "parse returned %d", rc);
		FZ_CHECK(rc != TRACE_ENOMEM || ft_refused, "ENOMEM with no refused allocation");
		FZ_CHECK(rc != TRACE_EPARSE || err[0] != 0, "EPARSE without a message");
		FZ_CHECK(rc != TRACE_EPARSE || !strncmp(err, "line ", 5), "message '%s'", err);
		check_empty(&t, 0x5a17);
	}
	trace_free(&t);
	FZ_CHECK(ft_live == 0, "%lld allocations leaked", (long long)ft_live);

	ft_fail_at = 0;
	rc = trace_distserve_runs(buf, len, names, 8);
	FZ_CHECK(rc <= 8, "distserve_runs = %d", rc);
	for (i = 0; i < rc; i++)
		FZ_CHECK(memchr(names[i], '\0', 32) != NULL, "run name %d not terminated", i);
	FZ_CHECK(ft_live == 0, "distserve_runs leaked");

	k = len < 24 ? len : 24;
	memcpy(filter, buf, k < 16 ? k : 16);
	filter[k < 16 ? k : 16] = '\0';
	if (trace_dist_parse(filter, &d) == 0) {
		trace_rng r;
		uint32_t v;

		FZ_CHECK(d.lo >= 1 && d.lo <= d.hi && d.hi <= TRACE_MAX_TOKENS, "dist [%u, %u]",
			 d.lo, d.hi);
		trace_rng_seed(&r, size);
		v = trace_dist_draw(&d, &r);
		FZ_CHECK(v >= 1 && (d.kind == DIST_SEED000_GEN || (v >= d.lo && v <= d.hi)),
			 "draw %u outside [%u, %u]", v, d.lo, d.hi);
	}
	return 0;
}

#include "fuzz_main.h"
