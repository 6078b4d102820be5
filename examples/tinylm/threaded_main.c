/*
 * threaded_main.c - tinylm-threaded: the threaded variant as a program. Four
 * client threads submit a workload's requests (eight in flight each) and
 * receive tokens through callbacks while one engine thread steps a continuous,
 * chunked-prefill scheduler; then every sequence is checked against the
 * reference.
 *
 * --overlap serves it overlapped instead (bkv_step_launch/bkv_step_complete
 * with a device thread, overlap.c); the TSan build of CI runs it that way
 * (tests/meson.build: tinylm_overlap_plain). --depth N serves it
 * overlapped at depth N (bkv_sched_config.overlap, 1..BKV_OVERLAP_MAX_DEPTH:
 * up to N steps on the device thread while the next is planned; --overlap
 * is --depth 1, and --production's overlap takes it too). --persistent uses the
 * persistent batch layout (the host mirrors the calls' table deltas; with
 * --overlap its device thread applies them in launch order) and fails when
 * a mirrored table differs from the library's.
 *
 * --production serves the production configuration from the client threads:
 * a hybrid model (full, 24-window and 40-chunk layers, one KV group each),
 * overlapped on the device thread, n-gram speculation (k = 4), the host tier
 * for swap and as the host cache, chunked prefill, the persistent layout and
 * a pool of 32 blocks of 16, and prints how many requests were preempted and
 * swapped and how many drafts accepted (with client threads these vary from
 * run to run; tests/test_tinylm_hybrid.c asserts them on a fixed schedule).
 *
 * Usage: tinylm-threaded [--jobs N] [--clients C] [--small] [--overlap]
 *                        [--depth N] [--persistent] [--production]
 */
#include "threaded.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	uint32_t jobs = 200, clients = 4;
	int small = 0, overlap = 0, persistent = 0, production = 0;
	uint32_t depth = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--jobs") && i + 1 < argc)
			jobs = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
			clients = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--small"))
			small = 1;
		else if (!strcmp(argv[i], "--overlap"))
			overlap = 1;
		else if (!strcmp(argv[i], "--depth") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
			depth = (uint32_t)strtoul(argv[++i], NULL, 10);
			overlap = 1;
		}
		else if (!strcmp(argv[i], "--persistent"))
			persistent = 1;
		else if (!strcmp(argv[i], "--production"))
			production = overlap = persistent = 1;
		else {
			fprintf(stderr,
				"usage: %s [--jobs N] [--clients C] [--small] [--overlap] [--depth N] "
				"[--persistent] [--production]\n",
				argv[0]);
			return 2;
		}
	}
	tlm_config mc;
	if (small)
		tlm_config_small(&mc);
	else
		tlm_config_default(&mc);
	if (production) {
		mc.window = 24;
		mc.chunk = 40;
		if (mc.layers < 3)
			mc.layers = 3;
	}
	tlm_model *m = tlm_model_create(&mc);
	tlm_workload_config wc;
	tlm_workload_config_default(&wc);
	wc.n_jobs = jobs;
	tlm_workload w;
	if (!m || tlm_workload_create(&w, &wc, mc.vocab) || tlm_workload_reference(&w, m)) {
		fprintf(stderr, "setup failed\n");
		return 1;
	}
	tlm_run_config rc;
	memset(&rc, 0, sizeof(rc));
	bkv_sched_config_init(&rc.sched);
	rc.sched.max_running = 32;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 256;
	rc.block_tokens = 16;
	rc.device_blocks = 1024;
	if (persistent)
		rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	if (overlap)
		rc.sched.overlap = depth;
	if (production) {
		rc.device_blocks = 32;
		rc.host_blocks = 512;
		rc.host_cache = 1;
		rc.sched.preempt = BKV_PREEMPT_SWAP;
		rc.sched.token_budget = 128;
		rc.sched.spec_max_k = 4;
		rc.sched.spec_k_mode = BKV_SPEC_K_FIXED;
	}
	tlm_run_result res;
	int st = overlap ? tlm_threaded_serve_overlap(&w, m, &rc, clients, 8, &res)
			 : tlm_threaded_serve(&w, m, &rc, clients, 8, &res);
	char msg[256] = "";
	uint32_t bad = st ? w.n_jobs : tlm_workload_verify(&w, msg, sizeof(msg));
	if (st)
		printf("serve failed: %s (%d) %s%s\n", bkv_strerror(st), st, res.lib_error,
		       res.host_error);
	printf("tinylm-threaded: %u clients x 8 in flight, 1 engine thread: %u requests, %llu "
	       "steps, %.2f s, %.0f generated tokens/s, prefix hits %.1f%% of prompt tokens\n",
	       clients, w.n_jobs, (unsigned long long)res.steps, res.wall_us / 1e6,
	       (double)res.gen_tokens / (res.wall_us / 1e6),
	       res.prompt_tokens ? 100.0 * (double)res.sched.hit_tokens / (double)res.prompt_tokens
				 : 0.0);
	if (overlap && depth == 1)
		printf("overlapped: %llu of %llu steps planned while the one before ran, %llu tokens "
		       "computed and discarded\n",
		       (unsigned long long)res.sched.overlap_steps, (unsigned long long)res.steps,
		       (unsigned long long)res.sched.overlap_wasted_tokens);
	if (overlap && depth > 1)
		printf("overlapped, depth %u: %llu of %llu steps planned while others ran, at most "
		       "%u outstanding, %llu tokens computed and discarded\n",
		       depth, (unsigned long long)res.sched.overlap_steps,
		       (unsigned long long)res.steps, res.max_outstanding,
		       (unsigned long long)res.sched.overlap_wasted_tokens);
	if (overlap && depth > 1) {
		printf("placeholders by back distance:");
		for (uint32_t k = 0; k < depth && k < BKV_OVERLAP_MAX_DEPTH; k++)
			printf(" %u: %llu", k + 1, (unsigned long long)res.placeholders[k]);
		printf("\n");
	}
	printf("%s%s\n", bad ? "FAILED: " : "every sequence matches the reference token for token",
	       bad ? msg : "");
	if (overlap && !bad && !st && res.sched.overlap_steps == 0)
		bad = 1; /* nothing overlapped: the mode did not run */
	if (production) {
		printf("production: %llu preemptions, %llu swaps, %llu blocks reloaded from the host "
		       "cache, %llu of %llu drafts accepted\n",
		       (unsigned long long)res.sched.preemptions, (unsigned long long)res.sched.swaps,
		       (unsigned long long)res.pool.host_hit_blocks,
		       (unsigned long long)res.sched.spec_accepted,
		       (unsigned long long)res.sched.spec_drafted);
	}
	if (persistent) {
		printf("persistent: %llu deltas; %llu rows' mirrored tables compared, %llu differ\n",
		       (unsigned long long)res.host.deltas, (unsigned long long)res.host.mirror_rows,
		       (unsigned long long)res.host.mirror_mismatches);
		if (!st && (res.host.mirror_mismatches || !res.host.mirror_rows))
			bad = 1;
	}
	tlm_workload_destroy(&w);
	tlm_model_destroy(m);
	return bad || res.check ? 1 : 0;
}
