/*
 * goodput.c - the goodput search (DistServe's definition): the highest
 * arrival rate at which a share of all requests meet a TTFT and a TPOT
 * target, found by simulating the traces with their arrivals rescaled.
 *
 * sim_attainment runs every trace once at its current arrivals and counts
 * the requests meeting both targets (sim_run does the counting through
 * sim_config.slo_ttft_ms and slo_tpot_ms). sim_goodput_search keeps each
 * trace's original arrivals, brackets the answer by doubling or halving
 * the rate, bisects the bracket to 1% and puts the arrivals back (sim.h
 * states the exact rule). Every rate it simulates is kept as a point for the
 * chart (svg.c).
 */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


double sim_trace_rate(const trace *t)
{
	if (!t->n)
		return 0.0;
	double span = t->reqs[t->n - 1].arrival_us - t->reqs[0].arrival_us;
	return span > 0.0 ? (t->n - 1) / (span / 1e6) : 0.0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int sim_trace_buckets(const trace *t, sim_buckets *b)
{
	memset(b, 0, sizeof(*b));
	if (!t->n)
		return 0;
	double *gaps = malloc((size_t)t->n * sizeof(double));
	uint32_t ng = 0, run = 1;
	b->times = 1;
	b->largest = 1;
	for (uint32_t i = 1; i < t->n; i++) {
		double d = t->reqs[i].arrival_us - t->reqs[i - 1].arrival_us;
		if (d == 0.0) {
			b->shared += run == 1 ? 2 : 1; /* the run's first one too */
			if (++run > b->largest)
				b->largest = run;
		} else {
			run = 1;
			b->times++;
			if (gaps && d > 0.0)
				gaps[ng++] = d;
		}
	}
	if (gaps && ng) {
		qsort(gaps, ng, sizeof(double), cmp_double);
		b->width_us = gaps[ng / 2];
	}
	free(gaps);
	return t->n >= 4 && 2u * b->shared >= t->n && b->times > 1 && b->width_us > 0.0;
}

/* splitmix64 of x, as a double in [0, 1) */
static double unit_hash(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return (double)(x >> 11) / 9007199254740992.0;
}

void sim_trace_spread(trace *t, const sim_buckets *b, uint64_t seed)
{
	uint32_t i = 0;
	while (i < t->n) {
		const double a = t->reqs[i].arrival_us;
		uint32_t k = 1;
		while (i + k < t->n && t->reqs[i + k].arrival_us == a)
			k++;
		double w = b->width_us;
		if (i + k < t->n && t->reqs[i + k].arrival_us > a &&
		    t->reqs[i + k].arrival_us - a < w)
			w = t->reqs[i + k].arrival_us - a;
		if (k > 1 && w > 0.0)
			for (uint32_t j = 0; j < k; j++) {
				double u = unit_hash(seed * 0x100000001b3ULL ^ (uint64_t)(i + j));
				t->reqs[i + j].arrival_us = a + w * ((double)j + u) / (double)k;
			}
		i += k;
	}
}

int sim_attainment_p99(const sim_config *cfg, const trace *t, int n, double ttft_ms,
		       double tpot_ms, double *attain, double *ttft_p99, double *tpot_p99,
		       char *err, size_t errlen)
{
	sim_config c = *cfg;
	c.slo_ttft_ms = ttft_ms;
	c.slo_tpot_ms = tpot_ms;
	c.progress = 0;
	uint64_t met = 0, all = 0;
	double *p1 = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
	double *p2 = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
	if (!p1 || !p2) {
		free(p1);
		free(p2);
		snprintf(err, errlen, "out of memory");
		return BKV_ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		sim_result r;
		memset(&r, 0, sizeof(r));
		int rc = sim_run(&c, &t[i], &r, err, errlen);
		if (rc) {
			free(p1);
			free(p2);
			return rc;
		}
		met += r.slo_met;
		all += t[i].n;
		p1[i] = r.ttft_p99;
		p2[i] = r.tpot_p99;
	}
	*attain = all ? (double)met / (double)all : 0.0;
	if (ttft_p99)
		*ttft_p99 = sim_median(p1, n);
	if (tpot_p99)
		*tpot_p99 = sim_median(p2, n);
	free(p1);
	free(p2);
	return 0;
}

int sim_attainment(const sim_config *cfg, const trace *t, int n, double ttft_ms,
		   double tpot_ms, double *attain, char *err, size_t errlen)
{
	return sim_attainment_p99(cfg, t, n, ttft_ms, tpot_ms, attain, NULL, NULL, err, errlen);
}

/* One rate of the search: simulate, record the point. */
static int goodput_eval(const sim_config *cfg, trace *t, int n, double r, double ttft_ms,
			double tpot_ms, sim_goodput *out, double *a, char *err, size_t errlen)
{
	double f1 = 0.0, f2 = 0.0;
	int rc = sim_attainment_p99(cfg, t, n, ttft_ms, tpot_ms, a, &f1, &f2, err, errlen);
	if (rc)
		return rc;
	if (out->evals < SIM_GOODPUT_POINTS)
		out->pt[out->evals] = (sim_goodput_point){r, f1, f2, *a};
	out->evals++;
	return 0;
}

/* Arrivals of every trace at rate r, from the saved originals. */
static void scale_arrivals(trace *t, int n, double *const *orig, double f)
{
	for (int i = 0; i < n; i++) {
		double a0 = t[i].n ? orig[i][0] : 0.0;
		for (uint32_t j = 0; j < t[i].n; j++)
			t[i].reqs[j].arrival_us = a0 + (orig[i][j] - a0) * f;
	}
}

int sim_goodput_search(const sim_config *cfg, trace *t, int n, double rate0, double ttft_ms,
		       double tpot_ms, double pct, sim_goodput *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (!(rate0 > 0.0) || !(ttft_ms > 0.0) || !(tpot_ms > 0.0) || !(pct > 0.0) || pct > 100.0) {
		snprintf(err, errlen, "goodput needs a positive rate, targets and 0 < pct <= 100");
		return BKV_EINVAL;
	}
	double **orig = calloc((size_t)n, sizeof(*orig));
	int rc = orig ? 0 : BKV_ENOMEM;
	for (int i = 0; !rc && i < n; i++) {
		orig[i] = malloc((size_t)(t[i].n ? t[i].n : 1) * sizeof(double));
		if (!orig[i]) {
			rc = BKV_ENOMEM;
			break;
		}
		for (uint32_t j = 0; j < t[i].n; j++)
			orig[i][j] = t[i].reqs[j].arrival_us;
	}
	if (rc) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	double need = pct / 100.0 - 1e-12, lo = 0.0, hi = 0.0, lo_att = 0.0, a;
	double r = rate0;
	/* bracket: from rate0 up while met, or down while not */
	for (int i = 0; i <= 20; i++) {
		scale_arrivals(t, n, orig, rate0 / r);
		if ((rc = goodput_eval(cfg, t, n, r, ttft_ms, tpot_ms, out, &a, err, errlen)))
			goto out;
		if (a >= need) {
			lo = r, lo_att = a;
			if (hi > 0.0)
				break;
			r *= 2.0;
		} else {
			hi = r;
			if (lo > 0.0)
				break;
			r /= 2.0;
		}
	}
	if (lo == 0.0 || hi == 0.0) {
		out->capped = lo == 0.0 ? -1 : 1;
	} else {
		while (hi > 1.01 * lo) {
			r = sqrt(lo * hi);
			scale_arrivals(t, n, orig, rate0 / r);
			if ((rc = goodput_eval(cfg, t, n, r, ttft_ms, tpot_ms, out, &a, err, errlen)))
				goto out;
			if (a >= need)
				lo = r, lo_att = a;
			else
				hi = r;
		}
	}
	out->rps = lo;
	out->hi_rps = hi;
	out->attain = lo_att;
out:
	if (orig) {
		int have = 1;
		for (int i = 0; i < n; i++)
			have &= orig[i] != NULL;
		if (have)
			scale_arrivals(t, n, orig, 1.0);
		for (int i = 0; i < n; i++)
			free(orig[i]);
		free(orig);
	}
	return rc;
}
