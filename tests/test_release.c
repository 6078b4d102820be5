/*
 * test_release.c - the device KV given back and taken again
 * (bkv_sched_kv_release, bkv_sched_kv_resume): the running requests
 * recomputed or swapped out, the prefix cache dropped, steps that only drain
 * while released, and every request still delivering exactly the tokens of
 * an undisturbed run after the device memory was wiped; the refusals.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "fakehost_sched.h"

static fake_host *make(uint32_t host_blocks)
{
	fh_opts o;

	fh_opts_init(&o);
	o.block_tokens = 4;
	o.device_blocks = 256;
	o.host_blocks = host_blocks;
	o.pin_permille = 100;
	if (host_blocks)
		o.cfg.preempt = BKV_PREEMPT_SWAP;
	return fh_create(&o);
}

/* The device memory is gone: every cell garbage. */
static void wipe_device(fake_host *f)
{
	memset(f->host.dev, 0xA5, (size_t)f->host.nb * f->host.bt * sizeof(uint64_t));
}

/* The host makes the pool's pending swap-out copies now (before it frees
 * the device memory) and clears them. */
static uint32_t make_swap_outs(fake_host *f)
{
	const bkv_copy *v;
	uint32_t n = bkv_pool_pending_copies(f->pool, BKV_COPY_SWAP_OUT, &v), i, bt = f->host.bt;

	for (i = 0; i < n; i++)
		memcpy(f->host.hostc + (size_t)v[i].dst * bt, f->host.dev + (size_t)v[i].src * bt,
		       bt * sizeof(uint64_t));
	bkv_pool_clear_copies(f->pool, BKV_COPY_SWAP_OUT);
	return n;
}

static void release_midway(bkv_kv_release_mode mode)
{
	fake_host *f = make(mode == BKV_RELEASE_SWAP ? 256 : 0);
	int32_t *p[6];
	uint32_t i, calls;
	bkv_sched_stats st = {.size = sizeof(st)};

	for (i = 0; i < 6; i++) {
		p[i] = fh_prompt(10 + 3 * i, i + 1);
		fh_submit_ex(f, p[i], 10 + 3 * i, 12, 0, 1 + (i == 2), 0);
	}
	for (i = 0; i < 5; i++)
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(bkv_sched_kv_release(f->s, mode), BKV_OK, "%s", bkv_last_error());
	if (mode == BKV_RELEASE_SWAP)
		cr_assert_gt(make_swap_outs(f), 0, "the running requests went to the host tier");
	wipe_device(f);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	/* released: steps drain, nothing is computed */
	calls = f->n_calls;
	for (i = 0; i < 3; i++)
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(f->n_calls, calls, "a released step computed something");
	cr_assert_gt(bkv_sched_pending(f->s), 0);
	cr_assert_eq(bkv_sched_kv_resume(f->s), BKV_OK);
	fh_run(f, 1000);
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	cr_assert_eq(bkv_sched_pending(f->s), 0);
	bkv_sched_stats_get(f->s, &st);
	cr_assert_eq(st.finished, 6);
	if (mode == BKV_RELEASE_SWAP)
		cr_assert_gt(st.swaps, 0);
	for (i = 0; i < 6; i++)
		free(p[i]);
	fh_destroy(f);
}

Test(release, running_requests_recompute_after_the_memory_comes_back)
{
	release_midway(BKV_RELEASE_RECOMPUTE);
}

Test(release, running_requests_swapped_out_come_back_through_swap_in)
{
	release_midway(BKV_RELEASE_SWAP);
}

Test(release, refused_while_requests_run_pins_are_held_or_steps_are_outstanding)
{
	fake_host *f = make(0);
	int32_t *p = fh_prompt(16, 3);
	uint32_t pin, got;

	cr_assert_eq(bkv_sched_kv_release(NULL, BKV_RELEASE_REFUSE), BKV_EINVAL);
	cr_assert_eq(bkv_sched_kv_release(f->s, (bkv_kv_release_mode)7), BKV_EINVAL);
	cr_assert_eq(bkv_sched_kv_resume(f->s), BKV_ESTATE, "not released");
	fh_submit(f, p, 16, 4);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(bkv_sched_kv_release(f->s, BKV_RELEASE_REFUSE), BKV_ESTATE);
	cr_assert(strstr(bkv_last_error(), "running") != NULL, "%s", bkv_last_error());
	fh_run(f, 100);
	cr_assert_eq(bkv_pool_pin_prefix(f->pool, 0, p, 16, &pin, &got), BKV_OK);
	cr_assert_eq(bkv_sched_kv_release(f->s, BKV_RELEASE_REFUSE), BKV_ESTATE, "a pin is held");
	cr_assert_eq(bkv_pool_unpin(f->pool, pin), BKV_OK);
	cr_assert_eq(bkv_sched_kv_release(f->s, BKV_RELEASE_REFUSE), BKV_OK);
	cr_assert_eq(bkv_sched_kv_release(f->s, BKV_RELEASE_REFUSE), BKV_ESTATE, "twice");
	cr_assert_eq(bkv_sched_kv_resume(f->s), BKV_OK);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	free(p);
	fh_destroy(f);
}

Test(release, the_prefix_cache_is_dropped_with_the_memory)
{
	fake_host *f = make(0);
	int32_t *p = fh_prompt(16, 5);
	bkv_pool_stats ps = {.size = sizeof(ps)};

	fh_submit(f, p, 16, 2);
	fh_run(f, 100);
	bkv_pool_stats_get(f->pool, &ps);
	cr_assert_gt(ps.nr_cached, 0);
	cr_assert_eq(bkv_sched_kv_release(f->s, BKV_RELEASE_RECOMPUTE), BKV_OK);
	wipe_device(f);
	bkv_pool_stats_get(f->pool, &ps);
	cr_assert_eq(ps.nr_indexed, 0, "a cached block would read the wiped memory");
	cr_assert_eq(bkv_sched_kv_resume(f->s), BKV_OK);
	fh_submit(f, p, 16, 2); /* the same prompt: computed again, not hit */
	fh_run(f, 100);
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	free(p);
	fh_destroy(f);
}
