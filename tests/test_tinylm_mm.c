/*
 * test_tinylm_mm.c - tinylm served with encoder inputs (images, encoder.c:
 * the encoder's rows replace the token embeddings of an input's span). The
 * workload's jobs carry 0..3 images of ten; a job with a system prompt puts
 * its first image at one place inside it, drawn from three, so requests with
 * the same system prompt share that prefix when their image is the same and
 * must not share it when it differs (the images there have one length, so
 * only the library's keying of the span's KV by content, bkv_encoder_token,
 * tells them apart). The paged host keeps an encoder cache it
 * fills only from the calls' encode lists (running the encoder on the
 * request's own image) and empties by their encoder_free lists; a row that
 * reads a span whose input the cache does not hold is a violation. Every
 * request must equal the reference run of it alone (ref.c, which embeds the
 * spans straight from the images), token for token, under plain continuous
 * batching, chunked prefill with preemption in a tight pool and a small
 * encoder cache, the persistent layout with swap, split calls with host
 * failures, overlapped scheduling and speculative decoding; repeated images
 * must be encoded fewer times than they were submitted, no step may spend
 * more than encoder_budget and the host's cache may never hold more than
 * encoder_cache tokens.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/tinylm/tinylm.h"
#include "tinylm_fixture.h"
#include "../examples/tinylm/threaded.h"

#define N_IMAGES 10u

static tlm_model *g_model;
static tlm_workload g_w;

static void setup(void)
{
	tlm_workload_config wc;

	tlm_workload_config_default(&wc);
	wc.n_jobs = tlm_fixture_jobs(300, 100);
	wc.n_images = N_IMAGES;
	tlm_fixture_setup(&g_model, &g_w, &wc);
}

static void teardown(void)
{
	tlm_fixture_teardown(g_model, &g_w);
}

/* Inputs the run submitted (jobs aborted at submit included). */
static uint64_t inputs_submitted(void)
{
	uint64_t n = 0;
	for (uint32_t j = 0; j < g_w.n_jobs; j++)
		n += g_w.jobs[j].inputs.n;
	return n;
}

/* encoder_cache: a few images' worth; budget: two to three images a step
 * (both at least what one prompt's inputs need without chunked prefill). */
static void config(tlm_run_config *rc, uint32_t device_blocks, uint32_t cache, uint32_t budget)
{
	tlm_fixture_config(rc, device_blocks);
	rc->sched.encoder_cache = cache;
	rc->sched.encoder_budget = budget;
}

/* What every run must show: the reference's tokens for every request, span
 * positions embedded from the host's cache, fewer encodes than inputs, the
 * budget and the capacity kept, prefix hits. */
static void verify(const tlm_run_config *rc, const tlm_run_result *res, int st, const char *what)
{
	tlm_fixture_verify(&g_w, res, st, what);
	const uint64_t submitted = inputs_submitted();
	cr_assert_gt(res->host.encodes, 0, "%s: nothing encoded", what);
	cr_assert_gt(res->host.enc_reads, 0, "%s: no span read from the encoder cache", what);
	cr_assert_lt(res->host.encodes, submitted, "%s: %llu encodes for %llu inputs: no hit", what,
		     (unsigned long long)res->host.encodes, (unsigned long long)submitted);
	cr_assert_leq(res->host.enc_max_held, rc->sched.encoder_cache,
		      "%s: the host held %llu encoder tokens, capacity %u", what,
		      (unsigned long long)res->host.enc_max_held, rc->sched.encoder_cache);
	if (rc->sched.encoder_budget)
		cr_assert_leq(res->host.enc_max_step_cost, rc->sched.encoder_budget,
			      "%s: a step encoded %llu, budget %u", what,
			      (unsigned long long)res->host.enc_max_step_cost,
			      rc->sched.encoder_budget);
	cr_assert_gt(res->sched.hit_tokens, 0, "no prefix hit");
	fprintf(stderr, "tinylm mm %-34s steps %6llu hit tokens %7llu inputs %5llu encodes %5llu "
		"(re %llu, off rows %llu) frees %5llu most held %3llu most cost/step %3llu\n", what,
		(unsigned long long)res->steps, (unsigned long long)res->sched.hit_tokens,
		(unsigned long long)submitted, (unsigned long long)res->host.encodes,
		(unsigned long long)res->host.reencodes,
		(unsigned long long)res->host.encodes_off_rows, (unsigned long long)res->host.enc_frees,
		(unsigned long long)res->host.enc_max_held,
		(unsigned long long)res->host.enc_max_step_cost);
}

static void serve(const tlm_run_config *rc, const char *what, tlm_run_result *res)
{
	verify(rc, res, tlm_run(&g_w, g_model, rc, res), what);
}

/* Does job a's prompt equal b's over [0, end) but for their inputs there? */
static int same_text(const tlm_job *a, const tlm_job *b, uint32_t end)
{
	return a->prompt_len >= end && b->prompt_len >= end &&
	       !memcmp(a->prompt, b->prompt, end * sizeof(int32_t));
}

/* The workload means something: images repeat; some requests share a
 * system prompt with the same image at the same place (the prefix cache may
 * hit past it) and some with another image of the same length there (it
 * must not: only the content differs); distinct
 * images have distinct cache ids; spans lie in their prompts, in order. */
Test(tinylm_mm, workload_repeats_images_and_places_same_and_other_images_alike, .init = setup,
     .fini = teardown)
{
	uint32_t uses[N_IMAGES] = {0}, same = 0, other = 0, with = 0;
	for (uint64_t i = 0; i < N_IMAGES; i++)
		for (uint64_t k = 0; k < i; k++)
			cr_assert_neq(tlm_image_cache_id(i), tlm_image_cache_id(k));
	for (uint32_t j = 0; j < g_w.n_jobs; j++) {
		const tlm_job *a = &g_w.jobs[j];
		with += a->inputs.n > 0;
		for (uint32_t k = 0; k < a->inputs.n; k++) {
			const bkv_encoder_input *in = &a->inputs.in[k];
			cr_assert_lt(a->inputs.image[k], N_IMAGES);
			uses[a->inputs.image[k]]++;
			cr_assert_eq(in->token_len, tlm_image_tokens(a->inputs.image[k]));
			cr_assert_leq(in->token_start + in->token_len, a->prompt_len);
			cr_assert(k == 0 || in->token_start >= a->inputs.in[k - 1].token_start +
								   a->inputs.in[k - 1].token_len);
		}
		for (uint32_t i = 0; i < j && a->inputs.n; i++) {
			const tlm_job *b = &g_w.jobs[i];
			if (!b->inputs.n || a->inputs.in[0].token_start != b->inputs.in[0].token_start ||
			    !same_text(a, b, 48))
				continue;
			same += a->inputs.image[0] == b->inputs.image[0];
			other += a->inputs.image[0] != b->inputs.image[0] &&
				 a->inputs.in[0].token_len == b->inputs.in[0].token_len;
		}
	}
	uint32_t repeated = 0;
	for (uint32_t i = 0; i < N_IMAGES; i++)
		repeated += uses[i] > 1;
	cr_assert_gt(with, g_w.n_jobs / 2, "most jobs carry images");
	cr_assert_gt(repeated, 3, "images repeat across requests");
	cr_assert_gt(same, g_w.n_jobs, "a system prompt with the same image, often");
	cr_assert_gt(other, g_w.n_jobs, "a system prompt with another image there, often");
}

/* The images change what the model says: most requests with inputs generate
 * other tokens than their prompt's tokens alone would. */
Test(tinylm_mm, images_change_the_reference_tokens, .init = setup, .fini = teardown)
{
	uint32_t with = 0, differ = 0;
	for (uint32_t j = 0; j < g_w.n_jobs; j++) {
		const tlm_job *jb = &g_w.jobs[j];
		if (!jb->inputs.n || jb->stop >= 0)
			continue;
		const size_t outs = (size_t)jb->sampling.n_samples * jb->max_new;
		int32_t *plain = calloc(outs, sizeof(int32_t));
		uint32_t plen[3];
		cr_assert_not_null(plain);
		cr_assert_eq(tlm_ref_generate(g_model, jb->prompt, jb->prompt_len, jb->max_new, NULL,
					      0, jb->sampling.n_samples, jb->sampling.seed, plain,
					      plen), 0);
		with++;
		differ += memcmp(plain, jb->ref, jb->ref_len[0] * sizeof(int32_t)) != 0;
		free(plain);
	}
	cr_assert_gt(with, 0);
	cr_assert_gt(differ * 3, with * 2, "only %u of %u requests' tokens changed", differ, with);
}

Test(tinylm_mm, continuous_batching_matches_reference, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 2048, 48, 40);
	serve(&rc, "continuous", &res);
}

Test(tinylm_mm, continuous_batching_unbounded_budget_matches_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 2048, 256, 0);
	serve(&rc, "continuous, no budget, big cache", &res);
}

Test(tinylm_mm, chunked_prefill_with_prefix_cache_in_a_tight_pool_matches_reference,
     .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 32, 24, 16);
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.submit_per_step = 3;
	serve(&rc, "chunked, tight pool, small cache", &res);
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to force preemption");
	cr_assert_gt(res.host.enc_frees, 0, "the small cache was meant to evict");
}

Test(tinylm_mm, persistent_layout_chunked_with_swap_matches_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 40, 32, 16);
	rc.host_blocks = 256;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	serve(&rc, "persistent, chunked, swap", &res);
	cr_assert_eq(res.host.mirror_mismatches, 0);
	cr_assert_gt(res.sched.swaps, 0, "the pool was meant to force swapping");
}

Test(tinylm_mm, split_calls_with_host_failures_match_reference, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64, 48, 40);
	rc.split = 1;
	rc.fail_every = 7;
	serve(&rc, "split calls, host failures", &res);
	cr_assert_gt(res.failed_steps, 0);
}

Test(tinylm_mm, chunked_with_host_failures_and_a_small_cache_match_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64, 16, 12);
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 48;
	rc.fail_every = 5;
	serve(&rc, "chunked, failures, cache 16", &res);
	cr_assert_gt(res.failed_steps, 0);
	cr_assert_gt(res.host.enc_frees, 0);
}

Test(tinylm_mm, overlapped_steps_match_reference, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64, 32, 16);
	rc.host_blocks = 256;
	rc.host_cache = 1;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.overlap = 1;
	rc.submit_per_step = 3;
	serve(&rc, "overlapped, chunked, host cache", &res);
	cr_assert_gt(res.sched.overlap_steps, 0, "no step planned while another ran");
}

Test(tinylm_mm, overlapped_with_device_failures_match_reference, .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64, 24, 16);
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.overlap = 1;
	rc.fail_every = 6;
	serve(&rc, "overlapped, failures", &res);
	cr_assert_gt(res.failed_steps, 0);
}

/* Clients on their own threads: an encode's request is found by its user
 * pointer (bkv_encode.user), before the client has its id. */
Test(tinylm_mm, overlapped_device_thread_with_threaded_clients_matches_reference,
     .init = setup, .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64, 32, 16);
	rc.host_blocks = 128;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 96;
	verify(&rc, &res, tlm_threaded_serve_overlap(&g_w, g_model, &rc, 4, 6, &res),
	       "threaded clients, overlapped");
	cr_assert_gt(res.sched.overlap_steps, 0);
}

Test(tinylm_mm, speculative_decoding_with_a_draft_model_matches_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 2048, 48, 40);
	rc.sched.spec_max_k = 4;
	rc.sched.spec_k_mode = BKV_SPEC_K_FIXED;
	rc.sched.spec_drafts = BKV_SPEC_DRAFT_HOST;
	rc.draft_layers = 1;
	serve(&rc, "spec, draft model k=4", &res);
	cr_assert_gt(res.sched.spec_accepted, 0, "no draft accepted");
}

Test(tinylm_mm, speculative_decoding_with_ngram_drafts_chunked_matches_reference, .init = setup,
     .fini = teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	config(&rc, 64, 32, 16);
	rc.sched.spec_max_k = 4;
	rc.sched.spec_k_mode = BKV_SPEC_K_FIXED;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	serve(&rc, "spec, n-gram k=4, chunked", &res);
}
