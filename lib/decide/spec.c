/*
 * spec.c - how many drafts a speculated decode row carries (k), and each
 * request's acceptance rate.
 *
 * A request's acceptance a is the chance that a draft is accepted given that
 * the one before it was: a verify step of k drafts that accepted m of them
 * counts m successes and, when m < k, one failure (the geometric model's
 * maximum-likelihood fit), both decayed by SPEC_DECAY per step so a request
 * that changes character (quoting, then free text) is followed; a request
 * starts from a prior worth SPEC_PRIOR_W trials: the acceptance of every
 * request's verifications so far (decayed by SPEC_G_DECAY per verified row),
 * SPEC_PRIOR_A before the first. A row the choice gives no drafts decays its
 * counts all the same, so its estimate returns to the prior and it is tried
 * again: without that, a request whose estimate fell below the threshold
 * once would never be measured again.
 *
 * With acceptance a, the j-th draft adds a^j expected tokens, so a row of k
 * drafts yields (1 - a^(k+1)) / (1 - a) tokens per verify step. The step's
 * price with e extra query tokens, T(e), comes from the cost model
 * (bkv_step_shape.decode_drafts). Auto k takes drafts in decreasing order of
 * their gain a^j (rows grouped by acceptance into SPEC_BUCKETS buckets, each
 * taken at its rows' mean acceptance, so one group is "draft j of every row
 * in bucket b") while the expected tokens
 * per unit of price, E(e) / T(e), grows; E is concave and T convex in e for
 * the roofline and polynomial models, so the first group that lowers the
 * ratio ends the walk. With a TPOT target, the walk goes on while the mean
 * time per token of a row, T / (E / rows), stays within the target or is
 * still falling, and keeps the best-throughput prefix that meets it (or, if
 * none does, the one with the least time per token). Fixed k gives every
 * row its cap. O(rows + SPEC_BUCKETS * k) per step, at most SPEC_MAX_PRICES
 * cost-model calls; no allocation (the group table is on the stack).
 */
#include "decide/decide.h"

#include <math.h>
#include <string.h>

#define SPEC_DECAY 0.98f    /* per verify step: about the last 50 */
#define SPEC_PRIOR_A 0.6    /* a new request's acceptance before any
			       request was measured */
#define SPEC_G_DECAY 0.999  /* the prior's decay per verified row */
#define SPEC_PRIOR_W 2.0    /* worth this many trials */
#define SPEC_BUCKETS 8u     /* acceptance buckets */
#define SPEC_MAX_PRICES 64u /* groups priced per step, at most (every
			       group of 8 buckets x k <= 8) */

/* The prior: every request's verifications so far (decayed slowly), or
 * SPEC_PRIOR_A before the first. */
static double spec_prior(const bkv_sched *s)
{
	const bkv__spec *sp = s->spec;

	return sp && sp->g_trials > 1.0 ? sp->g_acc / sp->g_trials : SPEC_PRIOR_A;
}

double bkv__spec_accept(const bkv_sched *s, const bkv__req *r)
{
	double a = ((double)r->spec_acc + spec_prior(s) * SPEC_PRIOR_W) /
		   ((double)r->spec_trials + SPEC_PRIOR_W);

	return a < 0.01 ? 0.01 : a > 0.99 ? 0.99 : a;
}

void bkv__spec_observe(bkv_sched *s, bkv__req *r, uint32_t k, uint32_t m)
{
	const float t = (float)m + (m < k ? 1.0f : 0.0f);

	if (k == 0)
		return;
	r->spec_acc = r->spec_acc * SPEC_DECAY + (float)m;
	r->spec_trials = r->spec_trials * SPEC_DECAY + t;
	s->spec->g_acc = s->spec->g_acc * SPEC_G_DECAY + (double)m;
	s->spec->g_trials = s->spec->g_trials * SPEC_G_DECAY + (double)t;
}

static double spec_price(const bkv_sched *s, uint32_t n_dec, uint64_t ctx, uint32_t e)
{
	bkv_step_shape sh;

	memset(&sh, 0, sizeof(sh));
	sh.kind = s->split ? BKV_CALL_DECODE : BKV_CALL_MIXED;
	sh.decode_rows = n_dec;
	sh.padded_rows = n_dec;
	sh.decode_context = ctx + e;
	sh.decode_drafts = e;
	return bkv__price(s, &sh);
}

typedef struct spec_group {
	double gain;    /* a_b^j */
	uint32_t b, j;  /* bucket, draft number */
	uint32_t count; /* rows of bucket b with cap >= j */
} spec_group;

/* The groups "draft j of bucket b" of the candidate rows, sorted by gain
 * (largest first) into g; k[i] receives row i's bucket. Returns the groups. */
static uint32_t spec_groups(const bkv_sched *s, const bkv__row *rows, const uint32_t *cap,
			    uint32_t n, uint32_t *k, spec_group *g)
{
	const uint32_t K = s->cfg.spec_max_k;
	uint32_t cnt[SPEC_BUCKETS][BKV_SPEC_MAX_K + 1]; /* [b][0]: rows in b */
	double suma[SPEC_BUCKETS];
	uint32_t i, b, j, ng = 0;

	memset(cnt, 0, sizeof(cnt));
	memset(suma, 0, sizeof(suma));
	for (i = 0; i < n; i++) {
		double a;

		if (!cap[i])
			continue;
		a = bkv__spec_accept(s, rows[i].lane->req);
		b = (uint32_t)(a * SPEC_BUCKETS);
		b = b >= SPEC_BUCKETS ? SPEC_BUCKETS - 1 : b;
		k[i] = b;
		suma[b] += a;
		cnt[b][0]++;
		for (j = 1; j <= cap[i] && j <= K; j++)
			cnt[b][j]++;
	}
	for (b = 0; b < SPEC_BUCKETS; b++) {
		/* the bucket's rows at their mean acceptance */
		double a = cnt[b][0] ? suma[b] / cnt[b][0] : 0.0, gain = 1.0;

		for (j = 1; j <= K; j++) {
			gain *= a;
			if (!cnt[b][j])
				break;
			/* insertion keeps g sorted by gain, largest first */
			for (i = ng++; i > 0 && g[i - 1].gain < gain; i--)
				g[i] = g[i - 1];
			g[i].gain = gain;
			g[i].b = b;
			g[i].j = j;
			g[i].count = cnt[b][j];
		}
	}
	return ng;
}

/* The walk over the groups g[0, ng): best_take[b] = the drafts bucket b's
 * rows get. */
static void spec_walk(const bkv_sched *s, const spec_group *g, uint32_t ng, uint32_t n_dec,
		      uint64_t ctx, uint32_t *best_take)
{
	const double tgt = (double)s->cfg.tpot_target_us;
	uint32_t take[SPEC_BUCKETS], i, e = 0;
	double t0 = spec_price(s, n_dec, ctx, 0), tokens = (double)n_dec, best, best_tpot;
	int best_meets;

	memset(take, 0, sizeof(take));
	memset(best_take, 0, SPEC_BUCKETS * sizeof(uint32_t));
	if (t0 <= 0.0 || n_dec == 0)
		return;
	best = tokens / t0;
	best_tpot = t0 / (tokens / n_dec);
	best_meets = !tgt || best_tpot <= tgt;
	for (i = 0; i < ng && i < SPEC_MAX_PRICES; i++) {
		double t, thr, tpot;
		int meets;

		e += g[i].count;
		tokens += g[i].gain * g[i].count;
		take[g[i].b] = g[i].j;
		t = spec_price(s, n_dec, ctx, e);
		if (t <= 0.0)
			break;
		thr = tokens / t;
		tpot = t / (tokens / n_dec);
		meets = !tgt || tpot <= tgt;
		if ((meets && (!best_meets || thr > best)) || (!meets && !best_meets && tpot < best_tpot)) {
			best = thr;
			best_tpot = tpot;
			best_meets = meets;
			memcpy(best_take, take, sizeof(take));
		} else if (!tgt) {
			break; /* quasi-concave: past the top */
		}
	}
}

void bkv__spec_choose(const bkv_sched *s, const bkv__row *rows, const uint32_t *cap, uint32_t n,
		      uint32_t n_dec, uint64_t ctx, uint32_t *k)
{
	spec_group g[SPEC_BUCKETS * BKV_SPEC_MAX_K];
	uint32_t best_take[SPEC_BUCKETS], i, ng;

	if (s->cfg.spec_k_mode == BKV_SPEC_K_FIXED) {
		if (k != cap)
			memcpy(k, cap, (size_t)n * sizeof(uint32_t));
		return;
	}
	ng = spec_groups(s, rows, cap, n, k, g); /* k[i]: row i's bucket */
	spec_walk(s, g, ng, n_dec, ctx, best_take);
	for (i = 0; i < n; i++) {
		k[i] = cap[i] ? BKV_MIN(cap[i], best_take[k[i]]) : 0;
		if (cap[i] && !k[i]) {
			/* no drafts, no observation: forget as if observed, so
			 * the estimate drifts back to the prior and the row is
			 * tried again (else one unlucky run stops it for good) */
			bkv__req *r = rows[i].lane->req;

			r->spec_acc *= SPEC_DECAY;
			r->spec_trials *= SPEC_DECAY;
		}
	}
}
