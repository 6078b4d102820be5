/*
 * pack.c - packing a split host's prefill rows into calls: with admission
 * by the cost model, the step's prefill rows are sorted by length and a DP
 * over contiguous runs prices every partition into calls (a split kernel
 * pads each call to its longest row), taking the cheapest (docs/cost-
 * model.md, "Length-aware packing"). Otherwise one call.
 */
#include "decide/decide.h"

#include <math.h>
#include <string.h>


/* Does row a sort before row b: the shorter chunk first, then the earlier
 * start, then the caller's order (a total order: the result is the same on
 * every run). */
static int pack_less(const bkv__row *rows, uint32_t a, uint32_t b)
{
	uint32_t la = rows[a].end - rows[a].start, lb = rows[b].end - rows[b].start;

	if (la != lb)
		return la < lb;
	if (rows[a].start != rows[b].start)
		return rows[a].start < rows[b].start;
	return a < b;
}

static void pack_sift(const bkv__row *rows, uint32_t *idx, uint32_t root, uint32_t n)
{
	for (;;) {
		uint32_t child = 2 * root + 1, t;

		if (child >= n)
			return;
		if (child + 1 < n && pack_less(rows, idx[child], idx[child + 1]))
			child++;
		if (!pack_less(rows, idx[root], idx[child]))
			return;
		t = idx[root];
		idx[root] = idx[child];
		idx[child] = t;
		root = child;
	}
}

/* Heapsort of the row indices idx[0, n) by pack_less: O(n log n), in place
 * (libc's qsort may allocate). */
static void pack_sort(const bkv__row *rows, uint32_t *idx, uint32_t n)
{
	uint32_t i, t;

	for (i = n / 2; i-- > 0;)
		pack_sift(rows, idx, i, n);
	for (i = n; i-- > 1;) {
		t = idx[0];
		idx[0] = idx[i];
		idx[i] = t;
		pack_sift(rows, idx, 0, i);
	}
}

/* Split host, admission auto: the step's n prefill rows as the cheapest set
 * of prefill calls. The rows are sorted by chunk length (then start), and
 * the calls are contiguous runs of that order: on a kernel that pads every
 * row to the longest, a call should hold rows of similar length, and
 * for chunks that start at 0 some optimal partition of a padded kernel's rows
 * is such runs (swap a long row of the call with the shorter maximum and a
 * short row of the other: neither maximum grows, no call changes size). Runs are priced with the scheduler's model as the prefill
 * call they would be (each run's chunks, no padding rows), and a dynamic
 * programme over the run boundaries finds the cheapest partition:
 *
 *     best[0] = 0,   best[j] = min_{i < j} best[i] + P(rows cut[i] .. cut[j])
 *
 * Boundaries are only where the (length, start) changes, so rows of one
 * shape always share a call, and at most AUTO_PACK_CUTS of them are kept
 * (evenly spread): O(AUTO_PACK_CUTS^2) prices, each O(rows of its run) in
 * the model. The single call is one of the candidates and ties keep the
 * fewer calls, so the partition's predicted price is never above one call's;
 * a model without padding (ragged prefill) prices one call cheapest (one
 * fixed part) and gets one. Returns the number of calls; with 2 or more,
 * *sorted (scratch taken at create), *order (sorted[i] is rows[order[i]])
 * and *ends (call g is sorted[ends[g-1] .. ends[g]), ends[-1] = 0) are set,
 * valid until the next call. 1 means one call over rows as given. */
uint32_t bkv__auto_pack(bkv_sched *s, const bkv__row *rows, uint32_t n, bkv__row **sorted,
			const uint32_t **order, const uint32_t **ends)
{
	bkv__auto *a = s->autos;
	bkv_step_shape sh;
	uint32_t i, j, k = 0, g;

	if (!a || !a->admit || !s->split || n < 2 || n > a->pack_cap || n > a->chunk_cap ||
	    !s->cfg.cost.step_us)
		return 1;
	for (i = 0; i < n; i++)
		a->pack_order[i] = i;
	pack_sort(rows, a->pack_order, n);
	for (i = 0; i < n; i++) {
		const bkv__row *r = &rows[a->pack_order[i]];

		a->pack_rows[i] = *r;
		a->chunks[i].len = r->end - r->start;
		a->chunks[i].start = r->start;
		if (i == 0 || a->chunks[i].len != a->chunks[i - 1].len ||
		    a->chunks[i].start != a->chunks[i - 1].start)
			a->pack_cut[k++] = i;
	}
	a->pack_cut[k++] = n;
	if (k == 2)
		return 1; /* one shape: one call */
	if (k - 2 > AUTO_PACK_CUTS) { /* keep every stride-th inner boundary */
		uint32_t stride = (k - 2 + AUTO_PACK_CUTS - 1) / AUTO_PACK_CUTS, kept = 1;

		for (i = 1; i + 1 < k; i++)
			if (i % stride == 0)
				a->pack_cut[kept++] = a->pack_cut[i];
		a->pack_cut[kept++] = n;
		k = kept;
	}
	memset(&sh, 0, sizeof(sh));
	sh.kind = BKV_CALL_PREFILL;
	a->pack_best[0] = 0.0;
	for (j = 1; j < k; j++) {
		double best = INFINITY;
		uint32_t from = 0;

		for (i = 0; i < j; i++) {
			double t;

			sh.chunks = a->chunks + a->pack_cut[i];
			sh.n_chunks = a->pack_cut[j] - a->pack_cut[i];
			t = a->pack_best[i] + bkv__price(s, &sh);
			/* a later start must save AUTO_PACK_GAIN: ties (and
			 * rounding) keep the longer last call, fewer calls */
			if (t < best * (1.0 - AUTO_PACK_GAIN)) {
				best = t;
				from = i;
			}
		}
		a->pack_best[j] = best;
		a->pack_from[j] = from;
	}
	g = 0;
	for (j = k - 1; j > 0; j = a->pack_from[j])
		g++;
	if (g < 2)
		return 1;
	i = g;
	for (j = k - 1; j > 0; j = a->pack_from[j])
		a->pack_end[--i] = a->pack_cut[j];
	*sorted = a->pack_rows;
	*order = a->pack_order;
	*ends = a->pack_end;
	return g;
}

/* One call over the rows as given. */
static uint32_t pack_one(bkv_sched *s, const bkv__row *rows, uint32_t n, bkv__row **sorted,
			 const uint32_t **order, const uint32_t **ends)
{
	(void)s;
	(void)rows;
	(void)n;
	(void)sorted;
	(void)order;
	(void)ends;
	return 1;
}

void bkv__pack_choose(bkv__policy *p, const bkv_sched_config *user)
{
	p->pack = user->policy == BKV_POLICY_CONTINUOUS && user->admit_group == 0 ? bkv__auto_pack
										     : pack_one;
}
