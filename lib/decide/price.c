/*
 * price.c - pricing hypothetical host calls with the scheduler's cost model,
 * for every cost-model rule of the decision layer: one call's price, the
 * admitted prompts' decayed moments, a decode call of n rows, the expected
 * longest of k prompts (a split kernel pads to it), a prefill group.
 */
#include "decide/decide.h"

#include <math.h>
#include <string.h>


/* The model's price of a call; 0 when it has no answer (no model, or a
 * price that is not positive). Calls are timed with a microsecond clock,
 * so a positive price below one tick (AUTO_CLOCK_US) is raised to it: a
 * model fitted to calls the clock timed at 0 or 1 us (a host faster than
 * the clock, issue 13) knows only that they take less than a tick, and the
 * shape its fit gives below that is noise. */
double bkv__price(const bkv_sched *s, const bkv_step_shape *sh)
{
	double t;

	if (!s->cfg.cost.step_us)
		return 0.0;
	t = s->cfg.cost.step_us(s->cfg.cost.ctx, sh);
	if (!isfinite(t) || t <= 0.0)
		return 0.0;
	return t < AUTO_CLOCK_US ? AUTO_CLOCK_US : t;
}

double bkv__link_us(const bkv_sched *s, uint64_t n)
{
	double link = s->cfg.host_link_bytes_per_us > 0.0 ? s->cfg.host_link_bytes_per_us
							   : AUTO_LINK_BYTES_PER_US;

	return (double)n * s->bt * (double)s->cfg.kv_bytes_per_token / link;
}

void bkv__prompt_stats(const bkv__auto *a, double *mean, double *sd)
{
	double m, v;

	if (a->p_w <= 0.0) {
		*mean = AUTO_DEFAULT_PROMPT;
		*sd = 0.0;
		return;
	}
	m = a->p_sum / a->p_w;
	v = a->p_sq / a->p_w - m * m;
	*mean = m;
	*sd = v > 0.0 ? sqrt(v) : 0.0;
}

/* A decode (or decode-only mixed) call of n rows with typical context. */
double bkv__price_decode(const bkv_sched *s, uint32_t n, double mean)
{
	bkv_step_shape sh;

	memset(&sh, 0, sizeof(sh));
	sh.kind = s->split ? BKV_CALL_DECODE : BKV_CALL_MIXED;
	sh.decode_rows = n;
	sh.padded_rows = n;
	sh.decode_context = (uint64_t)((double)n * (mean + AUTO_CTX_EXTRA));
	return n ? bkv__price(s, &sh) : 0.0;
}

/* Expected longest of k prompts, the distribution taken as uniform with the
 * observed mean and standard deviation (narrowed to keep the mean when its
 * low end would fall below one token). */
double bkv__expected_max(double mean, double sd, uint32_t k)
{
	double lo = mean - sqrt(3.0) * sd, hi = mean + sqrt(3.0) * sd;

	if (lo < 1.0) { /* clamped: keep the mean, so k = 1 gives the mean */
		lo = 1.0;
		hi = 2.0 * mean - lo;
	}
	if (hi < lo)
		hi = lo;
	return lo + (hi - lo) * (double)k / (double)(k + 1);
}

/* The prefill part of admitting k typical prompts: a split host's prefill
 * call, or what the chunks add to a mixed host's call over d decode rows. */
double bkv__price_group(const bkv_sched *s, uint32_t k, double mean, double sd, uint32_t d)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	double lmax = bkv__expected_max(mean, sd, k), rest, base = 0.0;
	uint32_t i;

	if (k > a->chunk_cap)
		k = a->chunk_cap;
	rest = k > 1 ? ((double)k * mean - lmax) / (double)(k - 1) : mean;
	if (rest < 1.0)
		rest = 1.0;
	for (i = 0; i < k; i++) {
		a->chunks[i].len = (uint32_t)llround(i == 0 ? lmax : rest);
		a->chunks[i].start = 0;
	}
	memset(&sh, 0, sizeof(sh));
	sh.kind = s->split ? BKV_CALL_PREFILL : BKV_CALL_MIXED;
	if (!s->split && d) {
		sh.decode_rows = d;
		sh.padded_rows = d;
		sh.decode_context = (uint64_t)((double)d * (mean + AUTO_CTX_EXTRA));
		base = bkv__price(s, &sh);
	}
	sh.n_chunks = k;
	sh.chunks = a->chunks;
	return bkv__price(s, &sh) - base;
}
