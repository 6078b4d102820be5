/*
 * test_tinylm_spec.c - tinylm served with speculative decoding (issue 17,
 * point 4): library n-gram drafts and a draft model made from tinylm's own
 * weights (its first layer of two), verified greedily by the library against
 * the paged host's samples at every position of a speculated row. Every
 * request must equal its non-speculative reference (ref.c, one request at a
 * time) token for token, with forks, aborts, stop tokens, shared prefixes
 * (prefix hits), chunked prefill, preemption by recompute and by swap in
 * small pools, host failures, and both batch layouts; each test reports the
 * acceptance it saw.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/tinylm/tinylm.h"
#include "tinylm_fixture.h"

static tlm_model *g_model;
static tlm_workload g_w;

static void setup(void)
{
	tlm_workload_config wc;

	tlm_workload_config_default(&wc);
	wc.n_jobs = tlm_fixture_jobs(150, 60);
	wc.new_min = 8;
	wc.new_max = 40;
	tlm_fixture_setup(&g_model, &g_w, &wc);
}

static void teardown(void)
{
	tlm_fixture_teardown(g_model, &g_w);
}

static void config(tlm_run_config *rc, uint32_t device_blocks, uint32_t k, uint32_t draft_layers)
{
	tlm_fixture_config(rc, device_blocks);
	rc->sched.spec_max_k = k;
	rc->sched.spec_k_mode = BKV_SPEC_K_FIXED;
	rc->sched.spec_drafts = draft_layers ? BKV_SPEC_DRAFT_HOST : BKV_SPEC_DRAFT_NGRAM;
	rc->draft_layers = draft_layers;
}

/* Serve, require the reference's tokens for every request, report the
 * acceptance. */
static void serve(const tlm_run_config *rc, tlm_run_result *res, const char *what)
{
	tlm_fixture_verify(&g_w, res, tlm_run(&g_w, g_model, rc, res), what);
	cr_assert_eq(res->pool.nr_used, 0, "blocks still referenced after the run");
	if (rc->sched.spec_max_k)
		cr_assert_gt(res->sched.spec_rows, 0, "nothing was speculated");
	cr_assert_eq(res->host.spec_rows, res->sched.spec_rows);
	fprintf(stderr,
		"tinylm spec %-38s rows %6llu drafts %6llu accepted %6llu (%.3f) steps %llu\n", what,
		(unsigned long long)res->sched.spec_rows, (unsigned long long)res->sched.spec_drafted,
		(unsigned long long)res->sched.spec_accepted,
		res->sched.spec_drafted
			? (double)res->sched.spec_accepted / (double)res->sched.spec_drafted
			: 0.0,
		(unsigned long long)res->steps);
}

Test(tinylm_spec, ngram_drafts_match_reference_in_fewer_steps, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result plain, sp;
	config(&rc, 2048, 0, 0);
	serve(&rc, &plain, "plain");
	config(&rc, 2048, 4, 0);
	serve(&rc, &sp, "n-gram k=4");
	cr_assert_gt(sp.sched.spec_accepted, 0);
	cr_assert_lt(sp.steps, plain.steps, "speculation took %llu steps, plain %llu",
		     (unsigned long long)sp.steps, (unsigned long long)plain.steps);
}

Test(tinylm_spec, one_layer_draft_model_of_the_two_layer_model_matches_reference, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 2048, 4, 1);
	serve(&rc, &res, "draft model (1 of 2 layers) k=4");
	cr_assert_gt(res.sched.spec_accepted, 0);
}

Test(tinylm_spec, auto_k_with_the_default_cost_model_matches_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 2048, 6, 0);
	rc.sched.spec_k_mode = BKV_SPEC_K_AUTO;
	serve(&rc, &res, "n-gram auto k<=6");
}

Test(tinylm_spec, chunked_prefill_prefix_hits_and_recompute_in_a_tight_pool, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 40, 6, 1);
	rc.block_tokens = 4;
	rc.device_blocks = 120;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	serve(&rc, &res, "chunked, recompute, bt 4, draft model");
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to preempt");
	cr_assert_gt(res.sched.hit_tokens, 0);
}

Test(tinylm_spec, split_host_swap_and_failures_in_a_tight_pool, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 44, 5, 0);
	rc.host_blocks = 256;
	rc.split = 1;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	rc.fail_every = 5;
	serve(&rc, &res, "split, swap, failures, n-gram");
	cr_assert_gt(res.sched.swaps, 0);
	cr_assert_gt(res.failed_steps, 0);
}

Test(tinylm_spec, persistent_layout_matches_reference, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 48, 6, 1);
	rc.host_blocks = 128;
	rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 48;
	rc.fail_every = 7;
	serve(&rc, &res, "persistent, chunked, failures, draft");
	cr_assert_eq(res.host.mirror_mismatches, 0);
	cr_assert_gt(res.host.deltas, 0);
}

/* ---- a hybrid model: full, sliding-window and chunked layers ---------------- */

/* Three layers, one KV group each (as test_tinylm_hybrid.c): full, a
 * window of 24, chunks of 40. The paged host reads the window and chunk
 * layers only through their groups' tables, so a draft's KV written to the
 * wrong group, a block a cut released while a later token still reads it,
 * or a window block released before the step's first query read it shows
 * up as a different token. */
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
	wc.n_jobs = tlm_fixture_jobs(150, 60);
	wc.new_min = 8;
	wc.new_max = 40;
	cr_assert_eq(tlm_workload_create(&g_w, &wc, g_model->cfg.vocab), 0);
	cr_assert_eq(tlm_workload_reference(&g_w, g_model), 0);
}

static void hybrid_config(tlm_run_config *rc, uint32_t device_blocks, uint32_t k,
			  uint32_t draft_layers)
{
	config(rc, device_blocks, k, draft_layers);
	rc->block_tokens = 8;
}

Test(tinylm_spec_hybrid, ngram_drafts_match_reference_in_fewer_steps, .init = hybrid_setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result plain, sp;
	hybrid_config(&rc, 4096, 0, 0);
	serve(&rc, &plain, "hybrid plain");
	hybrid_config(&rc, 4096, 4, 0);
	serve(&rc, &sp, "hybrid n-gram k=4");
	cr_assert_gt(sp.sched.spec_accepted, 0);
	cr_assert_gt(sp.host.copies, 0, "forks copied a shared partial block");
	cr_assert_lt(sp.steps, plain.steps, "speculation took %llu steps, plain %llu",
		     (unsigned long long)sp.steps, (unsigned long long)plain.steps);
}

Test(tinylm_spec_hybrid, draft_model_with_forks_matches_reference, .init = hybrid_setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	hybrid_config(&rc, 4096, 6, 2);
	rc.submit_per_step = 5;
	serve(&rc, &res, "hybrid draft model (2 of 3 layers) k=6");
	cr_assert_gt(res.sched.spec_accepted, 0);
	cr_assert_gt(res.host.copies, 0, "forks copied a shared partial block");
}

Test(tinylm_spec_hybrid, chunked_prefill_prefix_hits_and_recompute_in_a_tight_pool,
     .init = hybrid_setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	hybrid_config(&rc, 150, 6, 2);
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 48;
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	rc.submit_per_step = 4;
	serve(&rc, &res, "hybrid chunked, recompute, draft model");
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to preempt");
	cr_assert_gt(res.sched.hit_tokens, 0);
	cr_assert_gt(res.sched.spec_accepted, 0);
}

Test(tinylm_spec_hybrid, split_host_swap_and_failures_in_a_tight_pool, .init = hybrid_setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	hybrid_config(&rc, 120, 5, 0);
	rc.host_blocks = 600;
	rc.split = 1;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.submit_per_step = 3;
	rc.fail_every = 5;
	serve(&rc, &res, "hybrid split, swap, failures, n-gram");
	cr_assert_gt(res.sched.swaps, 0);
	cr_assert_gt(res.failed_steps, 0);
}

Test(tinylm_spec_hybrid, persistent_layout_chunks_and_failures_match_reference,
     .init = hybrid_setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	hybrid_config(&rc, 400, 6, 2);
	rc.host_blocks = 400;
	rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.fail_every = 7;
	serve(&rc, &res, "hybrid persistent, chunked, failures, draft");
	cr_assert_eq(res.host.mirror_mismatches, 0);
	cr_assert_gt(res.host.deltas, 0);
	cr_assert_gt(res.failed_steps, 0);
}
