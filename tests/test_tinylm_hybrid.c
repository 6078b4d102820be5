/*
 * test_tinylm_hybrid.c - a hybrid tinylm (full-attention, sliding-window and
 * chunked-local layers, one KV group each) served through libbatchkv gives
 * exactly the tokens of running each request alone over contiguous caches.
 *
 * The reference (examples/tinylm/ref.c) attends, in a windowed layer, to
 * the last W positions and, in a chunked layer, to the positions of the
 * query's own chunk, reading a contiguous array; the paged host reads each
 * layer's K/V only through that layer's group's tables in the batch. A
 * block the pool released too early, a slot in the wrong group, or a hit
 * that one group could not serve shows up as a different token. The runs
 * cover prefix hits, forks, chunked prefill, preemption by recompute and by
 * swap, host failures with rollback, split calls, and both batch layouts;
 * and the production configuration, every one of these features at once with
 * overlapped steps, speculation and the host cache (tinylm_production), at
 * depth 1 and pipelined at depths 2 and 4 (up to that many steps on the
 * device thread while the next is planned).
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/tinylm/threaded.h"
#include "../examples/tinylm/tinylm.h"

static tlm_model *g_model;
static tlm_workload g_w;

static uint32_t test_jobs(void)
{
	const char *e = getenv("TINYLM_TEST_JOBS");
	if (e && atoi(e) > 0)
		return (uint32_t)atoi(e);
	return 120;
}

/* Three layers: full, a window of 24, chunks of 40 (tlm_layer_group). */
static void hybrid_setup(void)
{
	tlm_config c;
	tlm_config_small(&c);
	c.layers = 3;
	c.window = 24;
	c.chunk = 40;
	g_model = tlm_model_create(&c);
	cr_assert_not_null(g_model);
	tlm_workload_config wc;
	tlm_workload_config_default(&wc);
	wc.n_jobs = test_jobs();
	cr_assert_eq(tlm_workload_create(&g_w, &wc, g_model->cfg.vocab), 0);
	cr_assert_eq(tlm_workload_reference(&g_w, g_model), 0);
}

/* Four layers: full, a window of 24, chunks of 40 and a recurrent layer
 * whose state is checkpointed every 16 tokens. */
static void recurrent_setup(void)
{
	tlm_config c;
	tlm_config_small(&c);
	c.layers = 4;
	c.window = 24;
	c.chunk = 40;
	c.recurrent = 16;
	g_model = tlm_model_create(&c);
	cr_assert_not_null(g_model);
	tlm_workload_config wc;
	tlm_workload_config_default(&wc);
	wc.n_jobs = test_jobs();
	cr_assert_eq(tlm_workload_create(&g_w, &wc, g_model->cfg.vocab), 0);
	cr_assert_eq(tlm_workload_reference(&g_w, g_model), 0);
}

static void hybrid_teardown(void)
{
	tlm_workload_destroy(&g_w);
	tlm_model_destroy(g_model);
}

static void run_config(tlm_run_config *rc, uint32_t device_blocks, int persistent)
{
	memset(rc, 0, sizeof(*rc));
	bkv_sched_config_init(&rc->sched);
	rc->sched.max_running = 16;
	rc->sched.admit_group = 1;
	rc->block_tokens = 8;
	rc->device_blocks = device_blocks;
	if (persistent)
		rc->sched.batch_layout = BKV_BATCH_PERSISTENT;
}

static void serve_and_verify(const tlm_run_config *rc, tlm_run_result *res)
{
	int st = tlm_run(&g_w, g_model, rc, res);
	cr_assert_eq(st, 0, "run failed: %s (%d); host: %s",
		     st == TLM_STUCK ? "stuck" : bkv_strerror(st), st, res->host_error);
	char msg[512];
	uint32_t bad = tlm_workload_verify(&g_w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%u of %u requests differ from the reference; first: %s", bad,
		     g_w.n_jobs, msg);
	cr_assert_eq(res->check, 0, "bkv_sched_check = %d", res->check);
	cr_assert_eq(res->host.violations, 0);
	cr_assert_eq(res->sched.finished, g_w.n_jobs);
	cr_assert_gt(res->sched.hit_tokens, 0, "the prefix cache served hits");
	cr_assert_eq(res->pool.nr_used, 0, "blocks still referenced after the run");
	if (rc->sched.batch_layout == BKV_BATCH_PERSISTENT)
		cr_assert_eq(res->host.mirror_mismatches, 0);
	if (g_model->cfg.recurrent)
		cr_assert_gt(res->host.state_rows, 0);
}

static void continuous(int persistent)
{
	tlm_run_config rc;
	run_config(&rc, 4096, persistent);
	rc.submit_per_step = 5;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.host.copies, 0, "forks copied a shared partial block");
}

static void chunked(int persistent)
{
	tlm_run_config rc;
	run_config(&rc, 4096, persistent);
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 48;
	rc.submit_per_step = 4;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
}

static void tight_recompute(int persistent)
{
	tlm_run_config rc;
	run_config(&rc, 150, persistent);
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to force preemption");
}

static void tight_swap_split_chunked(int persistent)
{
	tlm_run_config rc;
	run_config(&rc, 150, persistent);
	rc.host_blocks = 600;
	rc.split = 1;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.submit_per_step = 3;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.sched.swaps, 0, "the pool was meant to force swapping");
	cr_assert_gt(res.host.swap_in, 0);
}

static void failures(int persistent)
{
	tlm_run_config rc;
	run_config(&rc, 240, persistent);
	rc.host_blocks = 400;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.fail_every = 7;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.failed_steps, 0);
}

Test(tinylm_hybrid, continuous_batching_matches_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	continuous(0);
}

Test(tinylm_hybrid, chunked_prefill_with_prefix_hits_matches_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	chunked(0);
}

Test(tinylm_hybrid, preemption_by_recompute_matches_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	tight_recompute(0);
}

Test(tinylm_hybrid, swap_split_calls_and_chunks_in_a_tight_pool_match_reference,
     .init = hybrid_setup, .fini = hybrid_teardown)
{
	tight_swap_split_chunked(0);
}

Test(tinylm_hybrid, host_failures_roll_back_and_match_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	failures(0);
}

Test(tinylm_hybrid, persistent_continuous_matches_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	continuous(1);
}

Test(tinylm_hybrid, persistent_chunked_matches_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	chunked(1);
}

Test(tinylm_hybrid, persistent_preemption_and_swap_match_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	tight_recompute(1);
	tight_swap_split_chunked(1);
}

Test(tinylm_hybrid, persistent_failures_match_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	failures(1);
}

/* ---- with a recurrent layer ------------------------------------------------- */

Test(tinylm_recurrent, continuous_batching_with_checkpoint_hits_matches_reference,
     .init = recurrent_setup, .fini = hybrid_teardown)
{
	continuous(0);
}

Test(tinylm_recurrent, chunked_prefill_cut_at_checkpoints_matches_reference,
     .init = recurrent_setup, .fini = hybrid_teardown)
{
	chunked(0);
}

/* The recurrent model under swap preemption (split calls, chunked prefill)
 * and with host failures, its state units fixed or sharing the frames
 * (share: floor 8 for the swap run, 0 for the other), token-exact; returns
 * the swap run's swaps. */
static uint64_t swap_and_failures(int share)
{
	uint64_t swaps;
	tlm_run_config rc;
	tlm_run_result res;

	run_config(&rc, 164, 0);
	rc.state_share = (uint32_t)share;
	if (share)
		rc.state_units = 8;
	rc.host_blocks = 600;
	rc.split = 1;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.submit_per_step = 3;
	serve_and_verify(&rc, &res);
	swaps = res.sched.swaps;
	run_config(&rc, 304, 0);
	rc.state_share = (uint32_t)share;
	rc.host_blocks = 400;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.fail_every = 7;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.failed_steps, 0);
	return swaps;
}

Test(tinylm_recurrent, preemption_swap_and_failures_match_reference, .init = recurrent_setup,
     .fini = hybrid_teardown)
{
	tlm_run_config rc;
	tlm_run_result res;

	/* attention frames (the 96 state units come on top: tlm_run); 130
	 * forces 3 preemptions here, 164 none since the lane keeping rule
	 * (pool/lanes.c) keeps more hits */
	run_config(&rc, 130, 0);
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to force preemption");
	cr_assert_gt(swap_and_failures(0), 0, "the pool was meant to force swapping");
}

Test(tinylm_recurrent, persistent_layout_matches_reference, .init = recurrent_setup,
     .fini = hybrid_teardown)
{
	continuous(1);
	chunked(1);
}

/* The recurrent model with its state units sharing the frames (floor 0, as
 * many frames as the runs above): token-exact with checkpoint hits, forks,
 * chunks, preemption, swap and failed steps. */
Test(tinylm_recurrent, shared_state_units_match_reference, .init = recurrent_setup,
     .fini = hybrid_teardown)
{
	tlm_run_config rc;
	tlm_run_result res;

	run_config(&rc, 4096, 0);
	rc.state_share = 1;
	rc.submit_per_step = 5;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.pool.state_hits, 0, "checkpoint hits");
	/* idle frames held more checkpoints than the arena's 96 units could */
	cr_assert_gt(res.pool.state_units, 96, "units %u", res.pool.state_units);
	cr_assert_eq(res.pool.device_blocks + res.pool.state_units * res.pool.state_frames,
		     4096 + 96 * res.pool.state_frames);
	run_config(&rc, 4096, 1);
	rc.state_share = 1;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 48;
	rc.submit_per_step = 4;
	serve_and_verify(&rc, &res);
	run_config(&rc, 164, 0);
	rc.state_share = 1;
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	serve_and_verify(&rc, &res);
	(void)swap_and_failures(1);
}

/* ---- the production configuration ------------------------------------------ */

/* Every feature a production server turns on at once, over the three-group
 * model (full, window, chunked): overlapped steps on a device thread, n-gram
 * speculation (library drafts, k = 4), the host tier for swap and the host
 * cache, the prefix cache, chunked prefill, the persistent layout (or the
 * flat one), and a pool of 60 blocks, small enough that requests are
 * preempted and swapped (150 is not, with the host cache). */
static void production_config(tlm_run_config *rc, int persistent)
{
	run_config(rc, 60, persistent);
	rc->host_blocks = 600;
	rc->host_cache = 1;
	rc->sched.preempt = BKV_PREEMPT_SWAP;
	rc->sched.chunked_prefill = 1;
	rc->sched.token_budget = 64;
	rc->sched.spec_max_k = 4;
	rc->sched.spec_k_mode = BKV_SPEC_K_FIXED;
	rc->sched.overlap = 1;
	rc->submit_per_step = 3;
}

/* Placeholders the device replaced that named a step launched before the
 * previous one (back distance 2 or more). */
static uint64_t far_placeholders(const tlm_run_result *res)
{
	uint64_t n = 0;

	for (uint32_t k = 1; k < BKV_OVERLAP_MAX_DEPTH; k++)
		n += res->placeholders[k];
	return n;
}

/* The production configuration at overlap depth `depth`: the loop keeps
 * depth steps in flight while it plans the next (depth + 1 outstanding),
 * and every request still matches the reference. */
static void production(int persistent, uint32_t depth)
{
	tlm_run_config rc;
	tlm_run_result res;

	production_config(&rc, persistent);
	rc.sched.overlap = depth;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.sched.overlap_steps, 0, "steps were planned while another ran");
	cr_assert_eq(res.max_outstanding, depth + 1, "%u steps outstanding at most at depth %u",
		     res.max_outstanding, depth);
	cr_assert_gt(res.placeholders[0], 0, "rows waited for the previous launch's tokens");
	if (depth == 1)
		cr_assert_eq(far_placeholders(&res), 0, "depth 1 names the previous launch only");
	cr_assert_gt(res.sched.spec_accepted, 0, "drafts were accepted");
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to force preemption");
	cr_assert_gt(res.sched.swaps, 0, "the pool was meant to force swapping");
	cr_assert_gt(res.host.swap_in, 0);
	cr_assert_gt(res.pool.host_demoted, 0, "evicted blocks went to the host cache");
	cr_assert_gt(res.pool.host_hit_blocks, 0, "prefix hits were reloaded from the host");
}

Test(tinylm_production, every_feature_at_once_matches_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	production(1, 1);
}

Test(tinylm_production, every_feature_at_once_flat_layout_matches_reference,
     .init = hybrid_setup, .fini = hybrid_teardown)
{
	production(0, 1);
}

/* Pipelined: two and four steps on the device thread while the next is
 * planned, in both layouts. The device resolves each placeholder by its
 * back distance and row from its copies of the earlier steps' tokens, so a
 * placeholder naming the wrong launch or row gives a different token. */
Test(tinylm_production, pipeline_depth_2_keeps_three_steps_outstanding_and_matches_reference,
     .init = hybrid_setup, .fini = hybrid_teardown)
{
	production(1, 2);
	production(0, 2);
}

Test(tinylm_production, pipeline_depth_4_keeps_five_steps_outstanding_and_matches_reference,
     .init = hybrid_setup, .fini = hybrid_teardown)
{
	production(1, 4);
	production(0, 4);
}

/* The production configuration with the device failing every seventh
 * launched step, before computing or after writing its K/V (alternately):
 * every outstanding step completes failed, the last completion rolls them
 * back, and the outputs are still the reference's. */
static void production_failures(int persistent, uint32_t depth)
{
	tlm_run_config rc;
	tlm_run_result res;

	production_config(&rc, persistent);
	rc.sched.overlap = depth;
	rc.fail_every = 7;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.failed_steps, 1, "both kinds of failure were injected");
	cr_assert_geq(res.failed_completions, res.failed_steps);
	if (depth > 1) /* at depth 1 a failure has at most one step behind it */
		cr_assert_gt(res.failed_completions, 2 * res.failed_steps,
			     "%llu failed completions for %llu failures: several outstanding each",
			     (unsigned long long)res.failed_completions,
			     (unsigned long long)res.failed_steps);
	cr_assert_gt(res.sched.overlap_steps, 0);
	cr_assert_gt(res.sched.preemptions, 0);
}

Test(tinylm_production, device_failures_roll_back_and_match_reference, .init = hybrid_setup,
     .fini = hybrid_teardown)
{
	production_failures(1, 1);
	production_failures(0, 1);
}

/* At depth 4 a failed step has up to four others outstanding behind it:
 * each completes failed (BKV_EHOST), the last completion rolls all of them
 * back, and the retried requests still match the reference. */
Test(tinylm_production, device_failures_at_depth_4_roll_back_every_outstanding_step,
     .init = hybrid_setup, .fini = hybrid_teardown)
{
	production_failures(1, 4);
	production_failures(0, 4);
}

/* The recurrent model served overlapped (tlm_threaded_serve_overlap: client
 * threads, an engine thread planning each step while a device thread runs
 * the one before): a launch planned on a step in flight reads the state
 * unit that step writes, computed for real, and every request matches the
 * reference; in a roomy pool and in a tight one (steps with none in flight,
 * preemption); at depth `depth` (bkv_sched_config.overlap). */
static void overlapped(uint32_t device_blocks, uint32_t host_blocks, uint32_t depth)
{
	tlm_run_config rc;
	tlm_run_result res;
	char msg[512];
	uint32_t bad;
	int st;

	run_config(&rc, device_blocks, 0);
	rc.host_blocks = host_blocks;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.overlap = depth;
	st = tlm_threaded_serve_overlap(&g_w, g_model, &rc, 4, 6, &res);
	cr_assert_eq(st, 0, "overlapped serve failed: %s (%d); host: %s", bkv_strerror(st), st,
		     res.host_error);
	bad = tlm_workload_verify(&g_w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%u requests differ; first: %s", bad, msg);
	cr_assert_eq(res.check, 0);
	cr_assert_eq(res.host.violations, 0);
	cr_assert_eq(res.sched.finished, g_w.n_jobs);
	cr_assert_gt(res.sched.overlap_steps, res.steps / 4, "%llu of %llu steps overlapped",
		     (unsigned long long)res.sched.overlap_steps, (unsigned long long)res.steps);
	cr_assert_gt(res.host.state_rows, 0);
	cr_assert_eq(res.max_outstanding, depth + 1);
}

Test(tinylm_recurrent, overlapped_with_a_device_thread_matches_reference,
     .init = recurrent_setup, .fini = hybrid_teardown)
{
	overlapped(4096, 0, 1);
	overlapped(164, 600, 1);
}

/* Two and four steps in flight while the next is planned (the library
 * keeps up to depth + 2 states a sequence): each launch reads the state the
 * steps launched before it wrote, run in launch order on the device, and
 * every request matches. */
Test(tinylm_recurrent, pipeline_depths_2_and_4_with_a_device_thread_match_reference,
     .init = recurrent_setup, .fini = hybrid_teardown)
{
	overlapped(4096, 0, 2);
	overlapped(164, 600, 2);
	overlapped(4096, 0, 4);
	overlapped(164, 600, 4);
}
