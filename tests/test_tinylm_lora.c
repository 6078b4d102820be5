/*
 * test_tinylm_lora.c - tinylm served with adapters (bkv_request.adapter, a
 * LoRA stand-in: model.h's per-adapter biases on every layer's output and on
 * the logits). The workload has more distinct adapters than
 * bkv_sched_config.max_adapters, drawn independently of the shared system
 * prompts, so requests of different adapters share prompt prefixes: a
 * prefix cache that handed one adapter's KV to another (or to the base
 * model) would give them the other adapter's K/V from the second layer on,
 * and their tokens would differ from the reference. Every request must equal
 * the reference run of it alone with its adapter (ref.c), token for token,
 * under plain continuous batching, chunked prefill with preemption in a
 * tight pool, the persistent layout, swap, overlapped scheduling, threaded
 * clients and speculative decoding; and no call may carry more adapters than
 * the cap (the paged host checks each call's list against its rows).
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/tinylm/threaded.h"
#include "../examples/tinylm/tinylm.h"
#include "tinylm_fixture.h"

#define N_ADAPTERS 8u   /* adapters 1..8, and 0 (the base model) */
#define MAX_ADAPTERS 3u /* the scheduler's cap */

static tlm_model *g_model;
static tlm_workload g_w;

static void setup(void)
{
	tlm_workload_config wc;

	tlm_workload_config_default(&wc);
	wc.n_jobs = tlm_fixture_jobs(300, 100);
	wc.n_adapters = N_ADAPTERS;
	tlm_fixture_setup(&g_model, &g_w, &wc);
}

static void teardown(void)
{
	tlm_fixture_teardown(g_model, &g_w);
}

static void config(tlm_run_config *rc, uint32_t device_blocks)
{
	tlm_fixture_config(rc, device_blocks);
	rc->sched.max_adapters = MAX_ADAPTERS;
}

/* What every run must show: the reference's tokens for every request, the
 * cap kept in every call, adapters really served, prefix hits. */
static void verify(const tlm_run_config *rc, const tlm_run_result *res, int st, const char *what)
{
	tlm_fixture_verify(&g_w, res, st, what);
	cr_assert_gt(res->host.adapter_rows, 0, "no row ran with an adapter");
	cr_assert_leq(res->host.max_adapters, rc->sched.max_adapters, "a call carried %u adapters",
		      res->host.max_adapters);
	cr_assert_gt(res->host.max_adapters, 1, "never more than one adapter in a call");
	cr_assert_gt(res->sched.hit_tokens, 0, "no prefix hit");
	fprintf(stderr, "tinylm lora %-34s steps %6llu hit tokens %7llu adapter rows %7llu "
		"most adapters/call %u\n", what, (unsigned long long)res->steps,
		(unsigned long long)res->sched.hit_tokens, (unsigned long long)res->host.adapter_rows,
		res->host.max_adapters);
}

static void serve(const tlm_run_config *rc, const char *what, tlm_run_result *res)
{
	verify(rc, res, tlm_run(&g_w, g_model, rc, res), what);
}

/* The workload means something: more adapters than the cap, and system
 * prompts shared by requests of different adapters. */
Test(tinylm_lora, workload_shares_prefixes_across_more_adapters_than_the_cap, .init = setup,
     .fini = teardown)
{
	uint32_t seen[N_ADAPTERS + 1] = {0}, distinct = 0, cross = 0;
	for (uint32_t j = 0; j < g_w.n_jobs; j++) {
		const tlm_job *a = &g_w.jobs[j];
		distinct += a->adapter && !seen[a->adapter];
		seen[a->adapter]++;
		for (uint32_t i = 0; i < j && a->prompt_len > 16; i++) {
			const tlm_job *b = &g_w.jobs[i];
			if (b->prompt_len > 16 && b->adapter != a->adapter &&
			    !memcmp(a->prompt, b->prompt, 16 * sizeof(int32_t))) {
				cross++;
				break;
			}
		}
	}
	cr_assert_gt(distinct, MAX_ADAPTERS);
	cr_assert_gt(seen[0], 0, "requests of the base model too");
	cr_assert_gt(cross, g_w.n_jobs / 2, "a full block shared with another adapter's request");
}

/* The adapters change what the model says: most requests with an adapter
 * generate other tokens than the base model would, and one with adapter 0
 * is exactly the base model. */
Test(tinylm_lora, adapters_change_the_reference_tokens, .init = setup, .fini = teardown)
{
	uint32_t with = 0, differ = 0;
	for (uint32_t j = 0; j < g_w.n_jobs; j++) {
		const tlm_job *jb = &g_w.jobs[j];
		const size_t outs = (size_t)jb->sampling.n_samples * jb->max_new;
		int32_t *base = calloc(outs, sizeof(int32_t)), *zero = calloc(outs, sizeof(int32_t));
		uint32_t blen[3], zlen[3];
		cr_assert(base && zero);
		cr_assert_eq(tlm_ref_generate(g_model, jb->prompt, jb->prompt_len, jb->max_new, NULL,
					      0, jb->sampling.n_samples, jb->sampling.seed, base,
					      blen), 0);
		cr_assert_eq(tlm_ref_generate_adapter(g_model, 0, jb->prompt, jb->prompt_len,
						      jb->max_new, NULL, 0, jb->sampling.n_samples,
						      jb->sampling.seed, zero, zlen), 0);
		cr_assert_eq(memcmp(base, zero, outs * sizeof(int32_t)), 0);
		if (jb->adapter && jb->stop < 0) {
			with++;
			differ += memcmp(base, jb->ref, jb->ref_len[0] * sizeof(int32_t)) != 0;
		}
		free(base), free(zero);
	}
	cr_assert_gt(with, 0);
	cr_assert_gt(differ * 4, with * 3, "only %u of %u requests' tokens changed", differ, with);
}

Test(tinylm_lora, continuous_batching_matches_reference, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 2048);
	serve(&rc, "continuous", &res);
}

Test(tinylm_lora, chunked_prefill_with_prefix_cache_in_a_tight_pool_matches_reference,
     .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 32);
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.submit_per_step = 3;
	serve(&rc, "chunked, tight pool", &res);
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to force preemption");
}

Test(tinylm_lora, persistent_layout_chunked_with_swap_matches_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 40);
	rc.host_blocks = 256;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	serve(&rc, "persistent, chunked, swap", &res);
	cr_assert_eq(res.host.mirror_mismatches, 0);
	cr_assert_gt(res.sched.swaps, 0, "the pool was meant to force swapping");
}

Test(tinylm_lora, split_calls_with_host_failures_match_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64);
	rc.split = 1;
	rc.fail_every = 7;
	serve(&rc, "split calls, host failures", &res);
	cr_assert_gt(res.failed_steps, 0);
}

Test(tinylm_lora, overlapped_steps_match_reference, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64);
	rc.host_blocks = 256;
	rc.host_cache = 1;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.overlap = 1;
	rc.submit_per_step = 3;
	serve(&rc, "overlapped, chunked, host cache", &res);
	cr_assert_gt(res.sched.overlap_steps, 0, "no step planned while another ran");
}

Test(tinylm_lora, overlapped_device_thread_with_threaded_clients_matches_reference,
     .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64);
	rc.host_blocks = 128;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 96;
	verify(&rc, &res, tlm_threaded_serve_overlap(&g_w, g_model, &rc, 4, 6, &res),
	       "threaded clients, overlapped");
	cr_assert_gt(res.sched.overlap_steps, 0);
}

Test(tinylm_lora, speculative_decoding_with_a_draft_model_matches_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 2048);
	rc.sched.spec_max_k = 4;
	rc.sched.spec_k_mode = BKV_SPEC_K_FIXED;
	rc.sched.spec_drafts = BKV_SPEC_DRAFT_HOST;
	rc.draft_layers = 1;
	serve(&rc, "spec, draft model k=4", &res);
	cr_assert_gt(res.sched.spec_accepted, 0, "no draft accepted");
}

Test(tinylm_lora, speculative_decoding_with_ngram_drafts_chunked_matches_reference,
     .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64);
	rc.sched.spec_max_k = 4;
	rc.sched.spec_k_mode = BKV_SPEC_K_FIXED;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	serve(&rc, "spec, n-gram k=4, chunked", &res);
}
