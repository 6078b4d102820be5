/*
 * queue.c - the queue of waiting and swapped requests: the order admission
 * takes them in (priority, FCFS, output-length hints, the bypass bound).
 *
 * The queue holds waiting and swapped requests in one binary heap keyed by
 * (priority descending, order ascending). order is the arrival count for new
 * requests and a decreasing counter for preempted ones, so a preempted request
 * goes to the front of its priority class (the most recently preempted first,
 * which, because victims are taken most-recent-admission first, restores the
 * original admission order) and FCFS holds within a class - unless requests
 * carry output-length hints: new requests of a class then go longest hint
 * first, unhinted last.
 *
 *      heap[0] = best             (priority 5, order -3)   <- preempted
 *       /            \
 *   (5, 17)        (5, 40)                                 <- FCFS
 *    /    \
 * (0, 2) (0, 9) ...                                        <- lower class
 *
 * The bypass bound. Under a steady stream of long hints a short or unhinted
 * request could be passed forever, so a second heap, the age heap, holds the
 * new requests (order > 0) keyed by (priority, order) alone: age[0] is the
 * oldest new request of the highest class holding one. When heap[0] is new
 * (no preempted request is ahead of it), age[0] is the oldest of the same
 * class; once it has waited longer than max_bypass_us (or the auto bound,
 * 2 * S * (1 + Q / max_running): bkv__queue_head), admission takes it before
 * heap[0]. Without hints both heaps agree on the head and nothing changes.
 * Both heaps share the sift code; push, pop and removal by position are
 * O(log n), reading the head is O(1), and nothing here scans the waiting
 * requests.
 *
 */
#include "decide/decide.h"

/* ---- the queue ----------------------------------------------------------- */

int bkv__queue_less(const bkv__req *a, const bkv__req *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	/* output-length hints (new requests only; preempted ones, order < 0,
	 * stay in front): longest first, unhinted (0) last */
	if (a->order > 0 && b->order > 0 && a->predicted_output != b->predicted_output)
		return a->predicted_output > b->predicted_output;
	return a->order < b->order;
}

/* The age heap's key: the queue's without the hints. */
static int age_less(const bkv__req *a, const bkv__req *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	return a->order < b->order;
}

/* Both heaps share this code, instantiated once per heap (a runtime switch
 * cost a tenth more instructions per churning step): ARR entries, N count,
 * IDX the request's position field, LESS the order. heap_delete removes entry
 * i: the last entry takes its place and moves up or down. */
#define DEFINE_HEAP(NAME, ARR, N, IDX, LESS)                                       \
	static void NAME##_set(bkv__queue *s, uint32_t i, bkv__req *r)               \
	{                                                                           \
		s->ARR[i] = r;                                                      \
		r->IDX = i;                                                         \
	}                                                                           \
	static void NAME##_up(bkv__queue *s, uint32_t i)                             \
	{                                                                           \
		bkv__req *r = s->ARR[i];                                            \
                                                                                    \
		while (i > 0) {                                                     \
			uint32_t p = (i - 1) / 2;                                   \
                                                                                    \
			if (!LESS(r, s->ARR[p]))                                    \
				break;                                              \
			NAME##_set(s, i, s->ARR[p]);                                \
			i = p;                                                      \
		}                                                                   \
		NAME##_set(s, i, r);                                                \
	}                                                                           \
	static void NAME##_down(bkv__queue *s, uint32_t i)                           \
	{                                                                           \
		bkv__req *r = s->ARR[i];                                            \
		uint32_t n = s->N;                                                  \
                                                                                    \
		for (;;) {                                                          \
			uint32_t c = 2 * i + 1;                                     \
                                                                                    \
			if (c >= n)                                                 \
				break;                                              \
			if (c + 1 < n && LESS(s->ARR[c + 1], s->ARR[c]))            \
				c++;                                                \
			if (!LESS(s->ARR[c], r))                                    \
				break;                                              \
			NAME##_set(s, i, s->ARR[c]);                                \
			i = c;                                                      \
		}                                                                   \
		NAME##_set(s, i, r);                                                \
	}                                                                           \
	static void NAME##_insert(bkv__queue *s, bkv__req *r)                        \
	{                                                                           \
		NAME##_set(s, s->N++, r);                                           \
		NAME##_up(s, s->N - 1);                                             \
	}                                                                           \
	static void NAME##_delete(bkv__queue *s, uint32_t i)                         \
	{                                                                           \
		s->N--;                                                             \
		if (i != s->N) {                                                    \
			bkv__req *moved = s->ARR[s->N];                             \
                                                                                    \
			NAME##_set(s, i, moved);                                    \
			NAME##_down(s, i);                                          \
			if (moved->IDX == i)                                        \
				NAME##_up(s, i);                                    \
		}                                                                   \
	}

DEFINE_HEAP(qheap, heap, heap_n, heap_idx, bkv__queue_less)
DEFINE_HEAP(aheap, age, age_n, age_idx, age_less)

void bkv__queue_push(bkv_sched *s, bkv__req *r)
{
	BKV_ASSERT(s->q.heap_n < s->q.heap_cap);
	BKV_ASSERT(r->state == BKV__REQ_WAITING || r->state == BKV__REQ_SWAPPED);
	qheap_insert(&s->q, r);
	if (r->order > 0) { /* new: the bypass bound may pick it (age heap) */
		BKV_ASSERT(r->state == BKV__REQ_WAITING && s->q.age_n < s->q.heap_cap);
		aheap_insert(&s->q, r);
	}
	s->q.queue_slots += r->n_live;
	if (r->state == BKV__REQ_WAITING)
		s->q.nr_waiting++;
	else
		s->q.nr_swapped++;
}

void bkv__queue_remove(bkv_sched *s, bkv__req *r)
{
	uint32_t i = r->heap_idx;

	BKV_ASSERT(i < s->q.heap_n && s->q.heap[i] == r);
	s->q.queue_slots -= r->n_live;
	if (r->state == BKV__REQ_WAITING)
		s->q.nr_waiting--;
	else
		s->q.nr_swapped--;
	qheap_delete(&s->q, i);
	r->heap_idx = UINT32_MAX;
	if (r->age_idx != UINT32_MAX) {
		BKV_ASSERT(r->age_idx < s->q.age_n && s->q.age[r->age_idx] == r);
		aheap_delete(&s->q, r->age_idx);
		r->age_idx = UINT32_MAX;
	}
}

bkv__req *bkv__queue_pop(bkv_sched *s)
{
	bkv__req *r;

	if (s->q.heap_n == 0)
		return NULL;
	r = s->q.heap[0];
	bkv__queue_remove(s, r);
	return r;
}

/* The bypass bound (docs/design.md, "Output-length hints"). */
#define BYPASS_FACTOR 2.0    /* auto: times the FCFS wait expected */
#define BYPASS_RUN_DECAY 0.99 /* weight of the past in run_mean_us: about
				       the last 100 ends count */

bkv__req *bkv__queue_head(const bkv_sched *s, uint64_t now)
{
	bkv__req *h = s->q.heap[0], *a;
	double waited, bound;

	BKV_ASSERT(s->q.heap_n > 0);
	/* preempted requests (order < 0) go first; with no new request
	 * queued, or the oldest one already in front, nothing was passed */
	if (h->order < 0 || s->q.age_n == 0 || s->q.age[0] == h)
		return h;
	a = s->q.age[0];
	/* h is new, so no queued request outranks its class, and a is the
	 * oldest new request of that class: hints put h before it */
	BKV_ASSERT(a->priority == h->priority && a->order < h->order);
	if (s->cfg.max_bypass_us == UINT64_MAX || now <= a->enq_us)
		return h;
	waited = (double)(now - a->enq_us);
	bound = s->cfg.max_bypass_us ? (double)s->cfg.max_bypass_us : bkv__bypass_bound(s, a);
	if (bound < 0.0)
		return h; /* auto, and no request has ended yet: no estimate */
	return waited > bound ? a : h;
}

double bkv__bypass_bound(const bkv_sched *s, const bkv__req *a)
{
	if (s->q.run_mean_us <= 0.0)
		return -1.0;
	return BYPASS_FACTOR * s->q.run_mean_us *
	       (1.0 + (double)a->queued_with / (double)s->cfg.max_running);
}

/* The output lengths the calendar draws from (decide.c, expected_rem):
 * kept here, where a request's end is seen. O(AUTO_OUT_BUCKETS) a lane. */
void bkv__auto_ended(bkv_sched *s, const bkv__req *r)
{
	bkv__auto *a = s->autos;
	uint32_t i, j;

	if (!a)
		return;
	for (i = 0; i < r->n; i++) {
		uint32_t g = r->lane[i].n_gen;

		a->out_w = a->out_w * AUTO_OUT_DECAY + 1.0;
		a->out_sum = a->out_sum * AUTO_OUT_DECAY + (double)g;
		a->len_w = a->len_w * AUTO_OUT_DECAY + (g >= r->max_new);
		for (j = 0; j < AUTO_OUT_BUCKETS; j++)
			a->out_hist[j] *= AUTO_OUT_DECAY;
		j = g / (AUTO_RING / AUTO_OUT_BUCKETS);
		a->out_hist[j < AUTO_OUT_BUCKETS ? j : AUTO_OUT_BUCKETS - 1] += 1.0;
	}
}

void bkv__queue_ran(bkv_sched *s, const bkv__req *r)
{
	double ran;

	bkv__auto_ended(s, r);
	if (s->plan.step_us < r->admit_us)
		return;
	/* at least 1 us, so that 0 keeps meaning "none ended yet" */
	ran = BKV_MAX((double)(s->plan.step_us - r->admit_us), 1.0);
	if (s->q.run_mean_us <= 0.0)
		s->q.run_mean_us = ran;
	else
		s->q.run_mean_us = BYPASS_RUN_DECAY * s->q.run_mean_us + (1.0 - BYPASS_RUN_DECAY) * ran;
}

/* O(queue): for bkv_sched_check only. 1-5: the queue heap; 24-29: the age
 * heap (the numbers sched.c lists). */
int bkv__queue_check(const bkv_sched *s)
{
	uint32_t i, slots = 0, waiting = 0, swapped = 0, young = 0;

	for (i = 0; i < s->q.heap_n; i++) {
		const bkv__req *r = s->q.heap[i];

		if (r->heap_idx != i)
			return 1;
		if (i > 0 && bkv__queue_less(r, s->q.heap[(i - 1) / 2]))
			return 2;
		if (r->state == BKV__REQ_WAITING)
			waiting++;
		else if (r->state == BKV__REQ_SWAPPED)
			swapped++;
		else
			return 3;
		slots += r->n_live;
		/* the age heap holds exactly the new requests, each once */
		if (r->order > 0) {
			young++;
			if (r->age_idx >= s->q.age_n || s->q.age[r->age_idx] != r)
				return 24;
		} else if (r->age_idx != UINT32_MAX) {
			return 25;
		}
	}
	if (waiting != s->q.nr_waiting || swapped != s->q.nr_swapped)
		return 4;
	if (slots != s->q.queue_slots)
		return 5;
	if (young != s->q.age_n)
		return 26;
	/* ... in (class, arrival) heap order, each also in the queue */
	for (i = 0; i < s->q.age_n; i++) {
		const bkv__req *r = s->q.age[i];

		if (r->age_idx != i || r->heap_idx >= s->q.heap_n || s->q.heap[r->heap_idx] != r)
			return 27;
		if (r->order <= 0 || r->state != BKV__REQ_WAITING)
			return 28;
		if (i > 0 && age_less(r, s->q.age[(i - 1) / 2]))
			return 29;
	}
	return 0;
}

