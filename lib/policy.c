/*
 * policy.c - the scheduler's decisions: queue order, admission, chunk sizes,
 * victims and the preempt mode.
 *
 * sched.c runs the step transaction; every "which one" and "now or later" of
 * it is asked here, so a policy can be read (and changed) in one place.
 *
 * The queue holds waiting and swapped requests in one binary heap keyed by
 * (priority descending, order ascending). order is the arrival count for new
 * requests and a decreasing counter for preempted ones, so a preempted request
 * goes to the front of its priority class (the most recently preempted first,
 * which, because victims are taken most-recent-admission first, restores the
 * original admission order) and FCFS holds within a class. Push, pop and
 * removal by position are O(log n); nothing here scans the waiting requests.
 *
 *      heap[0] = best             (priority 5, order -3)   <- preempted
 *       /            \
 *   (5, 17)        (5, 40)                                 <- FCFS
 *    /    \
 * (0, 2) (0, 9) ...                                        <- lower class
 *
 * Admission (continuous policy) with group k, free slots f, queue slots q:
 * admit when f >= k, or when q <= f (the queue cannot supply more: everything
 * waiting fits), or when the current group has been forming for max_wait_us
 * (measured from the later of the head's enqueue time and the last admission:
 * with a backlog every head has waited long since arrival, so measuring from
 * arrival would turn k into 1 as soon as a backlog forms). Static: admit only
 * when nothing runs, then fill max_running.
 *
 * Victims: lowest priority first, then the most recently admitted, scanning
 * run[] (O(running), the scheduled work). Preempt mode: RECOMPUTE always
 * recomputes; SWAP and AUTO swap when the pool has a host tier with room for
 * the request's blocks and the request has one live lane (multi-lane requests
 * are recomputed, see docs/design.md); AUTO will consult the cost model once it
 * prices swaps.
 */
#include "internal.h"

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

static void heap_set(bkv_sched *s, uint32_t i, bkv__req *r)
{
	s->heap[i] = r;
	r->heap_idx = i;
}

static void sift_up(bkv_sched *s, uint32_t i)
{
	bkv__req *r = s->heap[i];

	while (i > 0) {
		uint32_t p = (i - 1) / 2;

		if (!bkv__queue_less(r, s->heap[p]))
			break;
		heap_set(s, i, s->heap[p]);
		i = p;
	}
	heap_set(s, i, r);
}

static void sift_down(bkv_sched *s, uint32_t i)
{
	bkv__req *r = s->heap[i];

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= s->heap_n)
			break;
		if (c + 1 < s->heap_n && bkv__queue_less(s->heap[c + 1], s->heap[c]))
			c++;
		if (!bkv__queue_less(s->heap[c], r))
			break;
		heap_set(s, i, s->heap[c]);
		i = c;
	}
	heap_set(s, i, r);
}

void bkv__queue_push(bkv_sched *s, bkv__req *r)
{
	BKV_ASSERT(s->heap_n < s->heap_cap);
	BKV_ASSERT(r->state == BKV__REQ_WAITING || r->state == BKV__REQ_SWAPPED);
	heap_set(s, s->heap_n++, r);
	sift_up(s, s->heap_n - 1);
	s->queue_slots += r->n_live;
	if (r->state == BKV__REQ_WAITING)
		s->nr_waiting++;
	else
		s->nr_swapped++;
}

void bkv__queue_remove(bkv_sched *s, bkv__req *r)
{
	uint32_t i = r->heap_idx;

	BKV_ASSERT(i < s->heap_n && s->heap[i] == r);
	s->queue_slots -= r->n_live;
	if (r->state == BKV__REQ_WAITING)
		s->nr_waiting--;
	else
		s->nr_swapped--;
	s->heap_n--;
	if (i != s->heap_n) {
		bkv__req *moved = s->heap[s->heap_n];

		heap_set(s, i, moved);
		sift_down(s, i);
		if (moved->heap_idx == i)
			sift_up(s, i);
	}
	r->heap_idx = UINT32_MAX;
}

bkv__req *bkv__queue_pop(bkv_sched *s)
{
	bkv__req *r;

	if (s->heap_n == 0)
		return NULL;
	r = s->heap[0];
	bkv__queue_remove(s, r);
	return r;
}

/* O(queue): for bkv_sched_check only. */
int bkv__queue_check(const bkv_sched *s)
{
	uint32_t i, slots = 0, waiting = 0, swapped = 0;

	for (i = 0; i < s->heap_n; i++) {
		const bkv__req *r = s->heap[i];

		if (r->heap_idx != i)
			return 1;
		if (i > 0 && bkv__queue_less(r, s->heap[(i - 1) / 2]))
			return 2;
		if (r->state == BKV__REQ_WAITING)
			waiting++;
		else if (r->state == BKV__REQ_SWAPPED)
			swapped++;
		else
			return 3;
		slots += r->n_live;
	}
	if (waiting != s->nr_waiting || swapped != s->nr_swapped)
		return 4;
	if (slots != s->queue_slots)
		return 5;
	return 0;
}

/* ---- admission ----------------------------------------------------------- */

/* May this step start admitting from the queue head? (Each admission is
 * further limited by free slots, the watermark and the token budget.) */
int bkv__admit_allowed(const bkv_sched *s, uint64_t now)
{
	uint32_t free_slots = s->cfg.max_running - s->slots_used;
	const bkv__req *head;
	uint64_t since;

	if (s->heap_n == 0 || free_slots == 0)
		return 0;
	if (s->cfg.policy == BKV_POLICY_STATIC)
		return s->nr_run == 0;
	if (bkv__auto_admit_on(s)) /* the cost model decides (auto.c) */
		return bkv__auto_admit((bkv_sched *)s, now, free_slots);
	if (free_slots >= s->cfg.admit_group)
		return 1;
	if (s->queue_slots <= free_slots)
		return 1; /* the queue cannot supply a bigger group */
	if (s->cfg.max_wait_us == UINT64_MAX)
		return 0;
	head = s->heap[0];
	since = BKV_MAX(head->enq_us, s->last_admit_us);
	return now >= since && now - since >= s->cfg.max_wait_us;
}

/* Tokens of a prefill chunk: everything remaining, capped by what is left of
 * the step's budget (the token budget when chunking, else the batch arrays'
 * capacity). */
uint32_t bkv__chunk_len(const bkv_sched *s, uint32_t remaining)
{
	return BKV_MIN(remaining, s->budget_left);
}

/* ---- preemption ---------------------------------------------------------- */

/* Lowest priority, then most recently admitted; skips requests preempted or
 * ended in this step. NULL when nothing can be preempted. */
bkv__req *bkv__pick_victim(const bkv_sched *s)
{
	bkv__req *best = NULL;
	uint32_t i;

	for (i = s->nr_run; i-- > 0;) {
		bkv__req *r = s->run[i];

		if (r->state != BKV__REQ_RUNNING)
			continue;
		if (!best || r->priority < best->priority ||
		    (r->priority == best->priority && r->admit_seq > best->admit_seq))
			best = r;
	}
	return best;
}

/* Swap (1) or recompute (0) this victim. */
int bkv__want_swap(const bkv_sched *s, const bkv__req *r)
{
	bkv_pool_stats ps;
	const bkv__lane *l = NULL;
	uint32_t i, n_blocks = 0;

	if (s->cfg.preempt == BKV_PREEMPT_RECOMPUTE || s->host_blocks == 0)
		return 0;
	if (r->n_live != 1 || (r->n > 1 && !r->forked))
		return 0;
	for (i = 0; i < r->n; i++)
		if (!r->lane[i].done)
			l = &r->lane[i];
	if (!l || l->seq == BKV__SEQ_NONE || l->kv_len == 0)
		return 0;
	n_blocks = (l->kv_len + s->bt - 1) / s->bt;
	if (bkv__auto_want_swap(s, l->kv_len) == 0)
		return 0; /* AUTO: recomputing is predicted cheaper (auto.c) */
	ps.size = sizeof(ps);
	bkv_pool_stats_get(s->pool, &ps);
	/* SWAP, and AUTO when swapping is cheaper or the KV size is unknown:
	 * swap when the host tier has room, else recompute. */
	return ps.host_free >= n_blocks;
}
