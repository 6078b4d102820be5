/*
 * release.c - giving the device KV memory back and taking it again
 * (bkv_sched_kv_release, bkv_sched_kv_resume): for an engine that frees its
 * KV tensors while it updates weights, sleeps, or hands the memory to
 * another model, and serves again after.
 *
 * Release empties the device of everything the library keeps there: the
 * running requests leave it (the caller's choice: refused, recomputed
 * later, or swapped out to the host tier, whose copies the host performs
 * before it frees the memory) and the prefix cache is dropped (its blocks'
 * contents go with the memory). While released a step only drains: new
 * requests queue, aborts end, nothing is computed. Resume lets steps plan
 * again over a device the host has allocated anew: the swapped requests
 * come back through swap-in copies, the others recompute their prompts.
 */
#include "sched/batch.h"
#include "decide/decide.h"

static int release_args(bkv_sched *s, bkv_kv_release_mode mode)
{
	if (!s)
		return bkv__fail(BKV_EINVAL, "bkv_sched_kv_release: sched is NULL");
	if (mode != BKV_RELEASE_REFUSE && mode != BKV_RELEASE_RECOMPUTE &&
	    mode != BKV_RELEASE_SWAP)
		return bkv__fail(BKV_EINVAL, "bkv_sched_kv_release: mode = %d: not a "
					     "bkv_kv_release_mode", (int)mode);
	if (s->plan.in_step || bkv__ovl_outstanding(s))
		return bkv__fail(BKV_ESTATE, "bkv_sched_kv_release: a step is running or "
					     "outstanding (complete it first)");
	if (s->kv_released)
		return bkv__fail(BKV_ESTATE, "bkv_sched_kv_release: released already");
	if (bkv__pool_nr_pins(s->pool))
		return bkv__fail(BKV_ESTATE, "bkv_sched_kv_release: %u prefix pins hold device "
					     "blocks (bkv_pool_unpin them first)",
				 bkv__pool_nr_pins(s->pool));
	if (bkv__cn_in_flight(s) || (s->cn && bkv__cn_loads_planned(s)))
		return bkv__fail(BKV_ESTATE, "bkv_sched_kv_release: %u KV connector transfers "
					     "read or write device blocks (complete them first)",
				 bkv__cn_in_flight(s));
	if (mode == BKV_RELEASE_REFUSE && s->rs.nr_run)
		return bkv__fail(BKV_ESTATE, "bkv_sched_kv_release: %u requests are running "
					     "(mode BKV_RELEASE_REFUSE)", s->rs.nr_run);
	return BKV_OK;
}

/* Running request r leaves the device: its one live lane swapped out (swap,
 * when preemption would swap it: bkv__swap_fits), else its lanes closed to
 * be recomputed. It waits at the front of its priority class. */
static void leave(bkv_sched *s, bkv__req *r, int swap, uint64_t now)
{
	uint32_t i;

	BKV_ASSERT(r->state == BKV__REQ_RUNNING);
	if (s->cn)
		bkv__cn_preempted(s, r);
	swap = swap && bkv__swap_fits(s, r);
	for (i = 0; swap && i < r->n; i++) {
		bkv__lane *l = &r->lane[i];

		if (l->done || l->seq == BKV__SEQ_NONE)
			continue;
		if (bkv_seq_swap_out(s->pool, l->seq) != BKV_OK)
			swap = 0; /* the lanes swapped so far are closed below */
		else
			bkv__slot_release(s, l);
	}
	if (!swap)
		bkv__req_close_lanes(s, r);
	/* swap_unsent stays 0: the host makes the copies before it frees */
	bkv__req_requeue(s, r, swap, now);
}

int bkv_sched_kv_release(bkv_sched *s, bkv_kv_release_mode mode)
{
	uint64_t now;
	uint32_t i;
	int rc;

	bkv__error_clear();
	if ((rc = release_args(s, mode)) != BKV_OK)
		return rc;
	now = bkv__clock_us(s);
	bkv__cn_quiet(s, 1); /* nothing may read the memory that goes */
	for (i = 0; i < s->rs.nr_run; i++)
		if (s->rs.run[i]->state == BKV__REQ_RUNNING)
			leave(s, s->rs.run[i], mode == BKV_RELEASE_SWAP, now);
	bkv__cn_quiet(s, 0);
	bkv__run_compact(s);
	(void)bkv_pool_reset_cache(s->pool); /* the contents go with the memory */
	s->kv_released = 1;
	BKV_ASSERT_EXPENSIVE(bkv_sched_check(s) == 0);
	return BKV_OK;
}

int bkv_sched_kv_resume(bkv_sched *s)
{
	if (!s)
		return BKV_EINVAL;
	if (s->plan.in_step || !s->kv_released)
		return BKV_ESTATE;
	s->kv_released = 0;
	return BKV_OK;
}
