/*
 * main.c - tinylm-demo: a real (random-weight) transformer served through
 * libbatchkv, checked against running each request alone, and timed.
 *
 * It builds a workload of a few hundred requests (shared system prompts,
 * varied lengths, n > 1 forks, stop tokens, aborts), computes every request's
 * reference output alone over a contiguous cache, then serves the workload
 * under several scheduler configurations: static batching, continuous
 * batching with admission groups of k = 1 and 4, chunked prefill in mixed
 * steps under a token budget, split prefill/decode kernels, the cost model's
 * own choices (k = 0, budget 0: it picks the group size, the budget and a
 * batch cap from what it learned of this CPU), and a pool too small for the
 * load, preempting by recompute and by swap; then a few of these again in the
 * persistent batch layout (rows keep a row slot; the host keeps its own block
 * tables from the calls' deltas; "persistent ..." rows). For each it
 * prints
 *
 *   - whether every generated sequence equals the reference token for token
 *     (aborted ones: a prefix of it),
 *   - generated tokens per second and the speed-up over static batching,
 *   - the prefix-cache hit rate (prompt tokens served from the cache) and
 *     preemptions,
 *   - the cost model's predicted step time against the measured one.
 *
 * The cost model is libbatchkv's calibrated model over a roofline base set to
 * this CPU's rough figures; it starts from the base and fits itself to the
 * measured step times, and it keeps learning from run to run (same host).
 *
 * Usage: tinylm-demo [--jobs N] [--small] [--seed S] [--hybrid] [--production]
 *                    [--spec K] [--adapters N] [--depth N]
 *   --hybrid  the model as a hybrid: full-attention, 24-token sliding-window,
 *             40-token chunked and (the last layer) recurrent layers, one KV
 *             group each, the state checkpointed every 16 tokens; then the
 *             production section (below)
 *   --production  only the production section: the hybrid without its
 *             recurrent layer (overlapped scheduling refuses a STATE group)
 *             served with every feature at once, overlapped steps on a
 *             device thread, n-gram speculation (k = 4), the host tier for
 *             swap and the host cache, the prefix cache, chunked prefill, the
 *             persistent layout and a pool small enough to preempt and swap;
 *             the same synchronous (bkv_step) for comparison
 *   --depth N  the production section's overlapped run at depth N
 *             (bkv_sched_config.overlap, 1..BKV_OVERLAP_MAX_DEPTH; default
 *             1): up to N steps on the device thread while the next is
 *             planned
 *   --spec K  after the other runs, speculative decoding with K drafts per
 *             row: library n-gram drafts (fixed and auto k), and a draft
 *             model made of the model's first half of its layers; each
 *             run's acceptance is printed (no effect on the runs before)
 *   --adapters N  the requests run with adapters 0..N (0: the base model; a
 *             LoRA stand-in, model.h), the reference too, and every run
 *             holds at most (N + 1) / 2 adapters at once
 *             (bkv_sched_config.max_adapters); not the production section
 * Exit status 0 only when every run matched the reference.
 */
#include "tinylm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct demo_run {
	const char *name;
	tlm_run_config rc;
} demo_run;

/* FLOP/s of tlm_matmul on 32 rows of the model's largest matrix. */
static double measure_flops(const tlm_model *m)
{
	const uint32_t n = 32, in = m->cfg.dim, out = m->cfg.ffn;
	float *x = calloc((size_t)n * in, sizeof(float)), *y = malloc((size_t)n * out * sizeof(float));
	double flops = 5e9;
	if (x && y) {
		uint32_t reps = 0;
		const uint64_t t0 = tlm_now_us();
		uint64_t t1 = t0;
		while (t1 - t0 < 50000) { /* 50 ms */
			tlm_matmul(y, x, m->layer[0].w_gate, n, in, out);
			reps++;
			t1 = tlm_now_us();
		}
		flops = 2.0 * n * in * out * reps / ((double)(t1 - t0) / 1e6);
	}
	free(x);
	free(y);
	return flops;
}

static void base_run(tlm_run_config *rc, uint32_t device_blocks)
{
	memset(rc, 0, sizeof(*rc));
	bkv_sched_config_init(&rc->sched);
	rc->sched.max_running = 32;
	rc->sched.admit_group = 1; /* explicit; the "auto" run lets the cost
				      model choose k and cap the batch */
	rc->block_tokens = 16;
	rc->device_blocks = device_blocks;
	rc->submit_per_step = 0;
}

/* The production section (--production, and after --hybrid's runs): a model
 * of mc's shape with full, windowed and chunked layers and no recurrent one,
 * its own workload from wc, served with every feature at once, synchronous
 * and overlapped at depth `depth`. Returns 0 when both runs match the
 * reference, 1 if not, -1 on setup failure. */
static int production(const tlm_config *mc0, const tlm_workload_config *wc, uint32_t depth)
{
	tlm_config mc = *mc0;
	mc.window = 24;
	mc.chunk = 40;
	mc.recurrent = 0;
	if (mc.layers < 3)
		mc.layers = 3;
	tlm_model *m = tlm_model_create(&mc);
	tlm_workload w;
	if (!m || tlm_workload_create(&w, wc, mc.vocab)) {
		tlm_model_destroy(m);
		return -1;
	}
	int failed = tlm_workload_reference(&w, m) ? -1 : 0;
	const uint32_t blocks = 32; /* as many as the tight runs', shared
				       by the three groups' frames */
	printf("\nproduction: the same model with full, 24-window and 40-chunk layers (%u "
	       "layers, no recurrent one),\n%u requests; overlapped steps on a device thread, "
	       "n-gram speculation k=4, host cache\nand swap (512 host blocks), prefix cache, "
	       "chunked prefill (budget 128), persistent layout,\n%u device blocks of 16 "
	       "tokens for all three groups (preemption and swap happen)\n",
	       mc.layers, w.n_jobs, blocks);
	printf("%-26s %4s %6s %8s %8s %5s %7s %5s %9s %11s %8s\n", "run", "ok", "steps",
	       "tokens/s", "ttft ms", "hit%", "preempt", "swaps", "host hits", "drafts acc",
	       "overlap");
	for (int ov = 0; ov < 2 && failed == 0; ov++) {
		tlm_run_config rc;
		base_run(&rc, blocks);
		rc.host_blocks = 512;
		rc.host_cache = 1;
		rc.sched.preempt = BKV_PREEMPT_SWAP;
		rc.sched.chunked_prefill = 1;
		rc.sched.token_budget = 128;
		rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
		rc.sched.spec_max_k = 4;
		rc.sched.spec_k_mode = BKV_SPEC_K_FIXED;
		rc.sched.overlap = ov ? depth : 0;
		rc.submit_per_step = 4;
		tlm_run_result res;
		const int st = tlm_run(&w, m, &rc, &res);
		char msg[512];
		const uint32_t bad = st ? w.n_jobs : tlm_workload_verify(&w, msg, sizeof(msg));
		if (st)
			snprintf(msg, sizeof(msg), "run failed: %s (%d) %s", bkv_strerror(st), st,
				 res.host_error);
		char acc[32];
		snprintf(acc, sizeof(acc), "%llu/%llu", (unsigned long long)res.sched.spec_accepted,
			 (unsigned long long)res.sched.spec_drafted);
		char name[32];
		if (ov && depth > 1)
			snprintf(name, sizeof(name), "production, depth %u", depth);
		else
			snprintf(name, sizeof(name), "production, %s",
				 ov ? "overlapped" : "synchronous");
		printf("%-26s %4s %6llu %8.0f %8.1f %4.1f%% %7llu %5llu %9llu %11s %8llu\n", name,
		       bad || res.check || res.host.mirror_mismatches ? "FAIL" : "yes",
		       (unsigned long long)res.steps, (double)res.gen_tokens / (res.wall_us / 1e6),
		       res.mean_ttft_us / 1e3,
		       res.prompt_tokens ? 100.0 * (double)res.sched.hit_tokens /
						   (double)res.prompt_tokens
					 : 0.0,
		       (unsigned long long)res.sched.preemptions, (unsigned long long)res.sched.swaps,
		       (unsigned long long)res.pool.host_hit_blocks, acc,
		       (unsigned long long)res.sched.overlap_steps);
		if (bad || res.check || res.host.mirror_mismatches) {
			printf("    %u requests differ from the reference; check %d; %llu mirrored "
			       "tables differ; %s\n",
			       bad, res.check, (unsigned long long)res.host.mirror_mismatches, msg);
			failed = 1;
		}
	}
	printf("host hits: prefix-hit blocks reloaded from the host cache; drafts acc: accepted "
	       "of drafted;\noverlap: steps planned while the one before ran on the device "
	       "thread.\n");
	tlm_workload_destroy(&w);
	tlm_model_destroy(m);
	return failed;
}

/* --hybrid's header: the layers by kind (tlm_layer_group), not the plain
 * model's line. */
static void print_hybrid_header(const tlm_config *mc, double mparams)
{
	uint32_t per[TLM_MAX_GROUPS] = {0}, rec = 0;
	for (uint32_t l = 0; l < mc->layers; l++) {
		if (tlm_layer_recurrent(mc, l))
			rec++;
		else
			per[tlm_layer_group(mc, l) % TLM_MAX_GROUPS]++;
	}
	uint32_t full = per[0], win = mc->window ? per[1] : 0;
	uint32_t chk = mc->chunk ? per[mc->window ? 2 : 1] : 0;
	printf("tinylm hybrid: vocab %u, dim %u, %u layers: %u full-attention, %u sliding-window "
	       "(%u tokens), %u chunked (%u tokens), %u recurrent (state checkpointed every %u "
	       "tokens); %u query heads over %u KV heads of %u, SwiGLU %u: %.2f M parameters "
	       "(float32)\n",
	       mc->vocab, mc->dim, mc->layers, full, win, mc->window, chk, mc->chunk, rec,
	       mc->recurrent, mc->n_heads, mc->n_kv_heads, mc->head_dim, mc->ffn, mparams);
}

int main(int argc, char **argv)
{
	uint32_t jobs = 200;
	int small = 0, hybrid = 0, prod_only = 0;
	uint32_t spec_k = 0, n_adapters = 0, depth = 1;
	uint64_t seed = 42;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--jobs") && i + 1 < argc)
			jobs = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--small"))
			small = 1;
		else if (!strcmp(argv[i], "--hybrid"))
			hybrid = 1;
		else if (!strcmp(argv[i], "--production"))
			prod_only = 1;
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--spec") && i + 1 < argc)
			spec_k = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--adapters") && i + 1 < argc)
			n_adapters = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--depth") && i + 1 < argc && atoi(argv[i + 1]) > 0)
			depth = (uint32_t)strtoul(argv[++i], NULL, 10);
		else {
			fprintf(stderr, "usage: %s [--jobs N] [--small] [--seed S] [--hybrid] [--production] "
				"[--spec K] [--adapters N] [--depth N]\n",
				argv[0]);
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0); /* piped or logged: each line as it comes */
	tlm_config mc;
	if (small)
		tlm_config_small(&mc);
	else
		tlm_config_default(&mc);
	if (hybrid) {
		mc.window = 24;
		mc.chunk = 40;
		mc.recurrent = 16;
		if (mc.layers < 4)
			mc.layers = 4;
	}
	tlm_workload_config wc;
	tlm_workload_config_default(&wc);
	wc.n_jobs = jobs;
	wc.seed = seed;
	if (prod_only) {
		const int pr = production(&mc, &wc, depth);
		if (pr < 0)
			fprintf(stderr, "production: out of memory\n");
		printf("%s\n", pr ? "FAILED: the production runs differ from the reference"
				   : "the production runs match the reference token for token");
		return pr ? 1 : 0;
	}
	tlm_model *m = tlm_model_create(&mc);
	if (!m) {
		fprintf(stderr, "model: out of memory\n");
		return 1;
	}
	if (hybrid)
		print_hybrid_header(&mc, (double)m->n_params / 1e6);
	else
		printf("tinylm: vocab %u, dim %u, %u layers, %u query heads over %u KV heads of "
		       "%u, SwiGLU %u: %.2f M parameters (float32)\n",
		       mc.vocab, mc.dim, mc.layers, mc.n_heads, mc.n_kv_heads, mc.head_dim, mc.ffn,
		       (double)m->n_params / 1e6);

	tlm_workload w;
	wc.n_adapters = n_adapters;
	if (tlm_workload_create(&w, &wc, mc.vocab)) {
		fprintf(stderr, "workload: out of memory\n");
		return 1;
	}
	uint64_t ref_tokens = 0, forks = 0, aborts = 0;
	fprintf(stderr, "tinylm-demo: computing every request's reference output alone "
			"(%u requests)...\n", w.n_jobs);
	const uint64_t t0 = tlm_now_us();
	if (tlm_workload_reference(&w, m)) {
		fprintf(stderr, "reference failed\n");
		return 1;
	}
	const double ref_s = (double)(tlm_now_us() - t0) / 1e6;
	for (uint32_t j = 0; j < w.n_jobs; j++) {
		for (uint32_t b = 0; b < w.jobs[j].sampling.n_samples; b++)
			ref_tokens += w.jobs[j].ref_len[b];
		forks += w.jobs[j].sampling.n_samples > 1;
		aborts += w.jobs[j].abort_after != 0;
	}
	printf("workload: %u requests (%u system prompts of %u tokens + %u..%u own, "
	       "max_new %u..%u), %llu with n > 1, %llu aborted\n",
	       w.n_jobs, wc.n_system, wc.system_len, wc.user_min, wc.user_max, wc.new_min,
	       wc.new_max, (unsigned long long)forks, (unsigned long long)aborts);
	if (n_adapters)
		printf("adapters: each request runs with one of 0..%u (0: the base model); at "
		       "most %u held at once\n", n_adapters, (n_adapters + 1) / 2);
	printf("reference (each request alone, contiguous KV): %.2f s, %.0f tokens/s\n", ref_s,
	       (double)ref_tokens / ref_s);

	/* The cost model: a CPU roofline as the base, its FLOP rate measured
	 * here on the model's own matmul (32 rows through the SwiGLU gate),
	 * ~10 GB/s of memory; then calibrated online from the step times. */
	bkv_cost_roofline rl;
	bkv_cost_roofline_init(&rl, BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16);
	rl.name = "tinylm-cpu";
	rl.peak_flops = measure_flops(m);
	rl.mem_bw = 10e9;
	rl.model_bytes = (double)m->n_params * 4.0;
	rl.active_params = (double)m->n_params;
	rl.kv_bytes_per_token = 2.0 * mc.layers * tlm_kv_width(&mc) * 4.0;
	rl.attn_flops_per_pair = 4.0 * mc.layers * mc.n_heads * mc.head_dim;
	rl.flops_eff = rl.mem_eff = 1.0;
	rl.overhead_us = 20.0;
	printf("cost model: calibrated over a roofline of this CPU (%.1f GFLOP/s measured)\n\n",
	       rl.peak_flops / 1e9);
	bkv_cost_model base = bkv_cost_roofline_model(&rl);
	bkv_cost_calib *calib = NULL;
	if (bkv_cost_calib_create(&base, NULL, &calib)) {
		fprintf(stderr, "calibrated cost model: out of memory\n");
		return 1;
	}

	/* Enough blocks for everything at once, and a pool that is not. */
	const uint32_t big = 4096, tight = 32;
	demo_run runs[20];
	uint32_t nr = 0;
	runs[nr].name = "static";
	base_run(&runs[nr].rc, big);
	runs[nr++].rc.sched.policy = BKV_POLICY_STATIC;
	runs[nr].name = "continuous k=1";
	base_run(&runs[nr].rc, big);
	runs[nr++].rc.sched.admit_group = 1;
	runs[nr].name = "continuous k=4";
	base_run(&runs[nr].rc, big);
	runs[nr++].rc.sched.admit_group = 4;
	runs[nr].name = "chunked mixed, budget 256";
	base_run(&runs[nr].rc, big);
	runs[nr].rc.sched.chunked_prefill = 1;
	runs[nr++].rc.sched.token_budget = 256;
	runs[nr].name = "split prefill/decode";
	base_run(&runs[nr].rc, big);
	runs[nr++].rc.split = 1;
	runs[nr].name = "auto k+budget, chunked";
	base_run(&runs[nr].rc, big);
	runs[nr].rc.sched.admit_group = 0;
	runs[nr].rc.sched.chunked_prefill = 1;
	runs[nr++].rc.sched.token_budget = 0;
	runs[nr].name = "tight pool, recompute";
	base_run(&runs[nr].rc, tight);
	runs[nr++].rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	runs[nr].name = "tight pool, swap";
	base_run(&runs[nr].rc, tight);
	runs[nr].rc.host_blocks = 512;
	runs[nr++].rc.sched.preempt = BKV_PREEMPT_SWAP;
	/* The persistent layout, after every flat run (so the flat rows and
	 * the cost model they see are as without these). */
	const uint32_t n_flat = nr;
	runs[nr].name = "persistent continuous k=1";
	base_run(&runs[nr].rc, big);
	runs[nr++].rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	runs[nr].name = "persistent chunked 256";
	base_run(&runs[nr].rc, big);
	runs[nr].rc.sched.chunked_prefill = 1;
	runs[nr].rc.sched.token_budget = 256;
	runs[nr++].rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	runs[nr].name = "persistent split p/d";
	base_run(&runs[nr].rc, big);
	runs[nr].rc.split = 1;
	runs[nr++].rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	runs[nr].name = "persistent tight recompute";
	base_run(&runs[nr].rc, tight);
	runs[nr].rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	runs[nr++].rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	runs[nr].name = "persistent tight swap";
	base_run(&runs[nr].rc, tight);
	runs[nr].rc.host_blocks = 512;
	runs[nr].rc.sched.preempt = BKV_PREEMPT_SWAP;
	runs[nr++].rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	/* Speculative decoding (--spec K), last: nothing before it changes. */
	const uint32_t n_plain = nr;
	if (spec_k && !hybrid && spec_k <= BKV_SPEC_MAX_K) {
		runs[nr].name = "spec n-gram, fixed k";
		base_run(&runs[nr].rc, big);
		runs[nr].rc.sched.spec_max_k = spec_k;
		runs[nr++].rc.sched.spec_k_mode = BKV_SPEC_K_FIXED;
		runs[nr].name = "spec n-gram, auto k";
		base_run(&runs[nr].rc, big);
		runs[nr++].rc.sched.spec_max_k = spec_k;
		runs[nr].name = "spec draft model, fixed k";
		base_run(&runs[nr].rc, big);
		runs[nr].rc.sched.spec_max_k = spec_k;
		runs[nr].rc.sched.spec_k_mode = BKV_SPEC_K_FIXED;
		runs[nr].rc.sched.spec_drafts = BKV_SPEC_DRAFT_HOST;
		runs[nr++].rc.draft_layers = mc.layers / 2 ? mc.layers / 2 : 1;
	}
	uint64_t p_deltas = 0, p_entries = 0, p_rows = 0, p_differ = 0;

	printf("wall-clock figures (tokens/s, speedup, ttft, lat, meas ms) vary from run to run "
	       "on a shared machine;\nthe stable ones: ok (token-exact against the "
	       "reference), and steps, hit%%, preempt, swaps and cow\nof the static, "
	       "continuous, chunked, split and tight-pool rows (they do not time themselves).\n");
	fprintf(stderr, "tinylm-demo: %u runs, each row printed when its run ends\n", nr);
	printf("%-26s %4s %6s %8s %7s %8s %8s %5s %7s %5s %4s %8s %8s %5s\n", "run", "ok",
	       "steps", "tokens/s", "speedup", "ttft ms", "lat ms", "hit%", "preempt", "swaps",
	       "cow", "pred ms", "meas ms", "err%");
	int failed = 0;
	double static_tps = 0.0;
	for (uint32_t i = 0; i < nr; i++) {
		tlm_run_config *rc = &runs[i].rc;
		if (i == n_flat || i == n_plain)
			printf("\n");
		rc->sched.cost = bkv_cost_calib_model(calib);
		rc->sched.kv_bytes_per_token = (uint64_t)rl.kv_bytes_per_token;
		rc->sched.max_adapters = (n_adapters + 1) / 2;
		tlm_run_result res;
		int st = tlm_run(&w, m, rc, &res);
		char msg[1024];
		uint32_t bad = st ? w.n_jobs : tlm_workload_verify(&w, msg, sizeof(msg));
		if (st)
			snprintf(msg, sizeof(msg), "run failed: %s (%d) %s%s", bkv_strerror(st), st,
				 res.lib_error, res.host_error);
		const double tps = (double)res.gen_tokens / (res.wall_us / 1e6);
		if (i == 0)
			static_tps = tps;
		const double hit = res.prompt_tokens
					   ? 100.0 * (double)res.sched.hit_tokens / (double)res.prompt_tokens
					   : 0.0;
		printf("%-26s %4s %6llu %8.0f %6.2fx %8.1f %8.1f %4.1f%% %7llu %5llu %4llu %8.1f "
		       "%8.1f %4.1f%%\n",
		       runs[i].name, bad ? "FAIL" : "yes", (unsigned long long)res.steps, tps,
		       static_tps > 0 ? tps / static_tps : 0.0, res.mean_ttft_us / 1e3,
		       res.mean_latency_us / 1e3, hit,
		       (unsigned long long)res.sched.preemptions, (unsigned long long)res.sched.swaps,
		       (unsigned long long)res.host.copies, res.predicted_us / 1e3,
		       res.measured_us / 1e3,
		       res.measured_us > 0 ? 100.0 * res.abs_err_us / res.measured_us : 0.0);
		if (bad || res.check) {
			printf("    %u requests differ from the reference; check %d; %s\n", bad,
			       res.check, msg);
			failed = 1;
		}
		if (i >= n_plain)
			printf("    speculation: %llu rows, %llu drafts, %llu accepted (%.3f)\n",
			       (unsigned long long)res.sched.spec_rows,
			       (unsigned long long)res.sched.spec_drafted,
			       (unsigned long long)res.sched.spec_accepted,
			       res.sched.spec_drafted ? (double)res.sched.spec_accepted /
							(double)res.sched.spec_drafted
						      : 0.0);
		if (rc->sched.batch_layout == BKV_BATCH_PERSISTENT) {
			p_deltas += res.host.deltas;
			p_entries += res.host.delta_entries;
			p_rows += res.host.mirror_rows;
			p_differ += res.host.mirror_mismatches;
			if (res.host.mirror_mismatches || !res.host.mirror_rows) {
				printf("    the host's mirrored tables differ from the library's on "
				       "%llu of %llu rows\n",
				       (unsigned long long)res.host.mirror_mismatches,
				       (unsigned long long)res.host.mirror_rows);
				failed = 1;
			}
		}
	}
	printf("\ntokens/s: generated tokens over the run's wall time (all branches); speedup: "
	       "against static.\nttft, lat: mean time from submission to the first token and "
	       "to the end (requests not aborted).\n"
	       "hit%%: prompt tokens served from the prefix cache.  cow: copy-on-write block "
	       "copies the host performed.\npred/meas: the calibrated cost model's predicted "
	       "step time summed over the run, against the measured host time;\nerr%%: sum of "
	       "|predicted - measured| per step over the measured total.\n"
	       "persistent: the batch layout where rows keep a slot and the host keeps its "
	       "own block tables from\nthe calls' deltas (no kv_indices): %llu deltas, %llu "
	       "block ids; the mirrored tables of %llu rows\ncompared with the library's, "
	       "%llu differ.\n",
	       (unsigned long long)p_deltas, (unsigned long long)p_entries,
	       (unsigned long long)p_rows, (unsigned long long)p_differ);
	double w8[BKV_COST_CALIB_FEATURES];
	const char *kinds[] = {"mixed", "prefill", "decode"};
	for (int k = 0; k < 3; k++) {
		if (bkv_cost_calib_coefficients_get(calib, (bkv_call_kind)k, w8) != BKV_OK)
			continue;
		printf("calibrated %-7s after %5llu calls: w0 %.3g (x roofline) w1 %.3g us "
		       "w2 %.3g us/row w5 %.3g us/prefill token\n",
		       kinds[k], (unsigned long long)bkv_cost_calib_observations(calib, (bkv_call_kind)k),
		       w8[0], w8[1], w8[2], w8[5]);
	}
	bkv_cost_calib_destroy(calib);
	tlm_workload_destroy(&w);
	tlm_model_destroy(m);
	if (hybrid) {
		wc.n_adapters = 0; /* its runs set no max_adapters */
		const int pr = production(&mc, &wc, depth);
		if (pr < 0)
			fprintf(stderr, "production: out of memory\n");
		failed |= pr != 0;
	}
	printf("%s\n", failed ? "FAILED: some runs differ from the reference"
			      : "all runs match the reference token for token");
	return failed;
}
