/*
 * adapters.c - bkv-sim's LoRA workload (--adapters N): each request runs
 * with one of N adapters, the scheduler holds at most max_adapters of them
 * among its running requests (bkv_sched_config.max_adapters), and the run
 * reports what that cap cost.
 *
 * Adapter popularity is Zipf-like, as in the multi-LoRA serving papers'
 * workloads (S-LoRA, Punica and dLoRA draw adapters from power laws): the
 * adapter of popularity rank k (1 = the most requested) is drawn with
 * probability proportional to 1 / k^s (s = --adapter-zipf, default 1; 0 is
 * uniform), and its id is k, so ids read as ranks in the report. A request's
 * draw hashes the trace's salt with its index (splitmix64), so a seed's
 * trace gets the same adapters in every row of a report, paired as the
 * rows' traces are.
 *
 * The virtual host hands every call to sim_adapters_call: it counts the
 * call's adapters (bkv_batch.n_adapters, checked against the rows'
 * row_adapter and against the cap) and stamps each request's first call.
 * The queue wait of a request is the time from its arrival to the start of
 * the first host call that carries a row of it (when it was admitted), and
 * sim_adapters_collect reports its p99 over all requests, over the hot
 * quarter of the adapters (ranks 1..ceil(N/4)) and over the cold half
 * (ranks > N/2): how long the cap makes a rare adapter's requests wait
 * beside a popular one's.
 *
 *   arrival ──queue──▶ first call with a row of it ──▶ ... ──▶ finish
 *           └ wait ──┘ (wait_p99 all / hot / cold)
 */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sim_adapters {
	uint32_t n;          /* adapters of the workload (ids 1..n = ranks) */
	uint32_t cap;        /* the scheduler's max_adapters (sim_adapters_cap) */
	uint32_t n_req;      /* requests of the trace */
	uint32_t *of;        /* [n_req] each request's adapter, 1..n */
	double *first_us;    /* [n_req] start of its first call; < 0 before */
	uint64_t calls;      /* host calls with rows */
	uint64_t sum;        /* sum over them of n_adapters */
	uint32_t most;       /* largest n_adapters of one call */
	uint64_t bad_calls;  /* calls whose adapters broke the contract (over
			        the cap, a row's adapter not listed): 0 */
};

static uint64_t mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

uint32_t sim_adapters_cap(const sim_config *cfg)
{
	if (!cfg->adapters)
		return 0;
	if (cfg->max_adapters)
		return cfg->max_adapters;
	return cfg->adapters < BKV_MAX_ADAPTERS ? cfg->adapters : BKV_MAX_ADAPTERS;
}

/* Draw every request's adapter: rank k with probability w_k / sum w,
 * w_k = k^-s, by a binary search of the cumulative weights. */
static int assign(sim_adapters *a, const sim_config *cfg, const trace *t)
{
	double *cdf = malloc((size_t)a->n * sizeof(double)), acc = 0.0;
	if (!cdf)
		return -1;
	for (uint32_t k = 0; k < a->n; k++) {
		acc += pow((double)(k + 1), -cfg->adapter_zipf);
		cdf[k] = acc;
	}
	for (uint32_t i = 0; i < a->n_req; i++) {
		const uint64_t h = mix64(t->salt ^ mix64(((uint64_t)i << 8) ^ 0x4C6F5241ull));
		const double u = (double)(h >> 11) * (1.0 / 9007199254740992.0) * acc;
		uint32_t lo = 0, hi = a->n - 1;
		while (lo < hi) { /* the first k with cdf[k] > u */
			const uint32_t mid = lo + (hi - lo) / 2;
			if (cdf[mid] > u)
				hi = mid;
			else
				lo = mid + 1;
		}
		a->of[i] = lo + 1;
	}
	free(cdf);
	return 0;
}

int sim_adapters_open(const sim_config *cfg, const trace *t, sim_adapters **out)
{
	*out = NULL;
	if (!cfg->adapters)
		return 0;
	sim_adapters *a = calloc(1, sizeof(*a));
	if (!a)
		return -1;
	a->n = cfg->adapters;
	a->cap = sim_adapters_cap(cfg);
	a->n_req = t->n;
	a->of = malloc((size_t)(t->n ? t->n : 1) * sizeof(uint32_t));
	a->first_us = malloc((size_t)(t->n ? t->n : 1) * sizeof(double));
	if (!a->of || !a->first_us || assign(a, cfg, t)) {
		sim_adapters_close(a);
		return -1;
	}
	for (uint32_t i = 0; i < t->n; i++)
		a->first_us[i] = -1.0;
	*out = a;
	return 0;
}

void sim_adapters_close(sim_adapters *a)
{
	if (!a)
		return;
	free(a->of);
	free(a->first_us);
	free(a);
}

uint32_t sim_adapter_of(const sim_adapters *a, uint32_t i)
{
	return a && i < a->n_req ? a->of[i] : 0;
}

/* Does the call's list name adapter x? */
static int listed(const bkv_batch *b, uint32_t x)
{
	for (uint32_t i = 0; i < b->n_adapters; i++)
		if (b->adapters[i] == x)
			return 1;
	return 0;
}

void sim_adapters_call(sim_adapters *a, const bkv_batch *b, double start_us)
{
	int bad = 0;
	if (!a || !b->n_rows)
		return;
	a->calls++;
	a->sum += b->n_adapters;
	if (b->n_adapters > a->most)
		a->most = b->n_adapters;
	bad = b->n_adapters > a->cap || !b->row_adapter;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		const uint32_t i = (uint32_t)((uintptr_t)b->row_user[r] - 1);
		if (i >= a->n_req)
			continue;
		if (b->row_adapter && (b->row_adapter[r] != a->of[i] || !listed(b, a->of[i])))
			bad = 1;
		if (a->first_us[i] < 0.0)
			a->first_us[i] = start_us;
	}
	a->bad_calls += bad;
}

/* p99 of the waits of the requests whose rank is in [lo, hi], ms (0 when
 * none); their number into *n. w: scratch of n_req doubles. */
static double wait_p99(const sim_adapters *a, const trace *t, uint32_t lo, uint32_t hi,
		       double *w, uint32_t *n)
{
	int k = 0;
	for (uint32_t i = 0; i < a->n_req; i++)
		if (a->first_us[i] >= 0.0 && a->of[i] >= lo && a->of[i] <= hi)
			w[k++] = (a->first_us[i] - t->reqs[i].arrival_us) / 1000.0;
	*n = (uint32_t)k;
	return k ? sim_quantile(w, k, 0.99) : 0.0;
}

void sim_adapters_collect(const sim_adapters *a, const trace *t, sim_result *res)
{
	if (!a)
		return;
	uint8_t *seen = calloc(a->n + 1, 1);
	double *w = malloc((size_t)(a->n_req ? a->n_req : 1) * sizeof(double));
	uint32_t n_all;
	res->adapter_cap = a->cap;
	res->adapters_call_max = a->most;
	res->adapters_call_mean = a->calls ? (double)a->sum / (double)a->calls : 0.0;
	res->adapter_bad_calls = a->bad_calls;
	for (uint32_t i = 0; seen && i < a->n_req; i++)
		if (!seen[a->of[i]]) {
			seen[a->of[i]] = 1;
			res->adapters++;
		}
	for (uint32_t i = 0; i < a->n_req; i++)
		if (a->first_us[i] >= 0.0 &&
		    a->first_us[i] - t->reqs[i].arrival_us > res->wait_max_ms * 1000.0)
			res->wait_max_ms = (a->first_us[i] - t->reqs[i].arrival_us) / 1000.0;
	if (w) {
		res->wait_p99_ms = wait_p99(a, t, 1, a->n, w, &n_all);
		res->wait_p99_hot_ms = wait_p99(a, t, 1, (a->n + 3) / 4, w, &res->n_hot);
		res->wait_p99_cold_ms = wait_p99(a, t, a->n / 2 + 1, a->n, w, &res->n_cold);
	}
	free(seen);
	free(w);
}
