/*
 * main.c - pdpair: a workload with shared prefixes served by the prefill /
 * decode pair (pd_run), checked token for token against tinylm's
 * reference, then (--compare) served again by one process (tlm_run) with
 * the decode side's settings, for wall clock and time to first token.
 *
 *   pdpair [--small] [--jobs N] [--seed S] [--compare]
 *          [--die K] [--cut K] [--corrupt K]
 *
 * --die, --cut and --corrupt inject a fault at the K-th block the prefill
 * process sends (pd_faults). Exit status 0 when every job ended once with
 * its reference tokens and the scheduler's check passed.
 */
#include "pdpair.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static void usage(void)
{
	fprintf(stderr, "usage: pdpair [--small] [--jobs N] [--seed S] [--compare] [--die K] "
			"[--cut K] [--corrupt K]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	tlm_config mc;
	tlm_workload_config wc;
	tlm_workload w;
	pd_config cfg;
	pd_result r;
	int small = 0, compare = 0;
	char msg[256] = "";

	tlm_config_default(&mc);
	tlm_workload_config_default(&wc);
	wc.n_jobs = 120;
	wc.system_len = 96;
	wc.pct_abort = 0; /* the pair serves every job to its end */
	pd_config_default(&cfg);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--small"))
			small = 1;
		else if (!strcmp(a, "--compare"))
			compare = 1;
		else if (i + 1 < argc && !strcmp(a, "--jobs"))
			wc.n_jobs = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (i + 1 < argc && !strcmp(a, "--seed"))
			wc.seed = strtoull(argv[++i], NULL, 10);
		else if (i + 1 < argc && !strcmp(a, "--die"))
			cfg.faults.die_at = strtoll(argv[++i], NULL, 10);
		else if (i + 1 < argc && !strcmp(a, "--cut"))
			cfg.faults.cut_at = strtoll(argv[++i], NULL, 10);
		else if (i + 1 < argc && !strcmp(a, "--corrupt"))
			cfg.faults.corrupt_at = strtoll(argv[++i], NULL, 10);
		else
			usage();
	}
	if (small)
		tlm_config_small(&mc);
	tlm_model *m = tlm_model_create(&mc);
	if (!m || tlm_workload_create(&w, &wc, mc.vocab) || tlm_workload_reference(&w, m)) {
		fprintf(stderr, "pdpair: setup failed\n");
		return 1;
	}
	pd_run(&w, m, &cfg, &r);
	const uint32_t bad = r.status ? w.n_jobs : tlm_workload_verify(&w, msg, sizeof(msg));
	printf("pair: %u jobs, status %d%s%s, check %d, token-exact vs reference: %s (%u differ)%s%s\n",
	       w.n_jobs, r.status, r.err[0] ? ": " : "", r.err, r.check, bad ? "NO" : "yes", bad,
	       bad ? "; first: " : "", bad ? msg : "");
	printf("decode side prompt tokens: %llu submitted, %llu loaded from the prefill side, "
	       "%llu computed, %llu local prefix hits\n",
	       (unsigned long long)r.prompt_tokens, (unsigned long long)r.sched.kv_load_tokens,
	       (unsigned long long)r.sched.prefill_tokens, (unsigned long long)r.sched.hit_tokens);
	printf("transfers: %llu loads, %llu blocks in, %llu bad frames, %llu not held, %llu "
	       "blocks recomputed (kv_load_failed), %llu loads cut; %llu lookups answered LATER; "
	       "prefill process %s%s\n",
	       (unsigned long long)r.sched.kv_loads, (unsigned long long)r.blocks_in,
	       (unsigned long long)r.blocks_bad, (unsigned long long)r.blocks_missing,
	       (unsigned long long)r.sched.kv_load_failed, (unsigned long long)r.xfers_cut,
	       (unsigned long long)r.later,
	       WIFSIGNALED(r.prefill_exit) ? "killed" : "exited",
	       r.peer_closed ? " (socket closed mid-run)" : "");
	printf("pair:        wall %8.1f ms, %7.0f generated tok/s, mean TTFT %7.2f ms "
	       "(wall clock, this machine, both processes sharing its cores)\n",
	       r.wall_us / 1e3, r.gen_tokens / (r.wall_us / 1e6), r.mean_ttft_us / 1e3);
	int fail = r.status != 0 || bad != 0 || r.check != 0;
	if (compare) {
		tlm_run_result one;
		tlm_run(&w, m, &cfg.rc, &one);
		const uint32_t bad1 = one.status ? w.n_jobs : tlm_workload_verify(&w, msg, sizeof(msg));
		printf("one process: wall %8.1f ms, %7.0f generated tok/s, mean TTFT %7.2f ms "
		       "(token-exact: %s)\n",
		       one.wall_us / 1e3, one.gen_tokens / (one.wall_us / 1e6),
		       one.mean_ttft_us / 1e3, bad1 ? "NO" : "yes");
		fail |= one.status != 0 || bad1 != 0;
	}
	tlm_workload_destroy(&w);
	tlm_model_destroy(m);
	return fail;
}
