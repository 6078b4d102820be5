/*
 * main.c - the composition tester's command line (compose.h): runs a range
 * of seeds, or seeds for a while, and prints every failing seed with its
 * features, what went wrong and the command that replays it.
 *
 *   compose                       the CI form: seeds 1..CX_CI_SEEDS
 *   compose --seeds A:B           seeds A..B-1
 *   compose --seed N [-v]         one seed (replay), verbose
 *   compose --seeds A:B --time S  stop after S seconds (the soak)
 *   compose --describe N          the features seed N draws
 *   --skip-reset, --skip-pin-misuse  leave out an action (hunting other
 *                                 defects while a known one is open)
 *
 * Exit status 0 when every seed passed. BKV_COMPOSE_STRICT=1 (or --strict)
 * makes a combination the library refuses at create a failure; otherwise
 * refusals are counted and printed ("refused: N combos").
 *
 * A library assertion abort()s the whole process: a handler prints the
 * seed that was running first, so that it can be replayed.
 */
#define _POSIX_C_SOURCE 200809L
#include "compose.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CX_CI_SEEDS 3000u

static volatile uint64_t running_seed;
static const char *prog = "compose";

static void on_signal(int sig)
{
	char buf[160];
	int n = snprintf(buf, sizeof(buf),
			 "\ncompose: signal %d while running seed %llu; replay: %s --seed %llu -v\n",
			 sig, (unsigned long long)running_seed, prog,
			 (unsigned long long)running_seed);

	if (n > 0)
		(void)!write(2, buf, (size_t)n);
	signal(sig, SIG_DFL);
	raise(sig);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	uint64_t lo = 1, hi = 1 + CX_CI_SEEDS, seed;
	double limit = 0, t0 = now_s();
	cx_opts opt;
	cx_result res;
	uint64_t failed = 0, ran = 0, refused_seeds = 0;
	uint64_t refused[CX_REFUSE_COUNT] = {0};
	uint64_t calls = 0, cells = 0, tokens = 0, reqs = 0, fcalls = 0, preempt = 0, spec = 0,
		 hits = 0, ovl = 0;
	const char *env = getenv("BKV_COMPOSE_STRICT");
	int i, k;

	memset(&opt, 0, sizeof(opt));
	opt.strict = env && *env && strcmp(env, "0") != 0;
	prog = argv[0];
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seeds") && i + 1 < argc) {
			char *colon;

			lo = strtoull(argv[++i], &colon, 0);
			hi = *colon == ':' ? strtoull(colon + 1, NULL, 0) : lo + 1;
		} else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
			lo = strtoull(argv[++i], NULL, 0);
			hi = lo + 1;
		} else if (!strcmp(argv[i], "--time") && i + 1 < argc) {
			limit = atof(argv[++i]);
		} else if (!strcmp(argv[i], "--describe") && i + 1 < argc) {
			char buf[512];

			cx_describe_seed(strtoull(argv[++i], NULL, 0), buf, sizeof(buf));
			printf("%s\n", buf);
			return 0;
		} else if (!strcmp(argv[i], "-v")) {
			opt.verbose = 1;
		} else if (!strcmp(argv[i], "--strict")) {
			opt.strict = 1;
		} else if (!strcmp(argv[i], "--skip-reset")) {
			opt.skip |= CX_SKIP_RESET;
		} else if (!strcmp(argv[i], "--skip-pin-misuse")) {
			opt.skip |= CX_SKIP_PIN_MISUSE;
		} else if (!strcmp(argv[i], "--no-threads")) {
			opt.no_threads = 1;
		} else {
			fprintf(stderr,
				"usage: %s [--seeds A:B | --seed N] [--time S] [-v] [--strict] "
				"[--no-threads] [--skip-reset] [--skip-pin-misuse] | --describe N\n",
				argv[0]);
			return 2;
		}
	}
	signal(SIGABRT, on_signal);
	signal(SIGSEGV, on_signal);
	for (seed = lo; seed < hi; seed++) {
		int any = 0;

		if (limit > 0 && now_s() - t0 > limit)
			break;
		running_seed = seed;
		cx_run_seed(seed, &opt, &res);
		ran++;
		for (k = 0; k < CX_REFUSE_COUNT; k++) {
			refused[k] += res.refused[k];
			any |= res.refused[k] != 0;
		}
		refused_seeds += any;
		calls += res.calls;
		cells += res.cells_checked;
		tokens += res.tokens;
		reqs += res.requests;
		fcalls += res.failed_calls;
		preempt += res.preemptions;
		spec += res.spec_accepted;
		hits += res.hit_tokens;
		ovl += res.overlap_steps;
		if (opt.verbose)
			printf("seed %llu: %s\n  features: %s\n  steps %llu calls %llu cells %llu tokens "
			       "%llu requests %llu failed calls %llu preemptions %llu spec accepted "
			       "%llu hit tokens %llu overlap steps %llu\n",
			       (unsigned long long)seed, res.failed ? "FAIL" : "ok", res.features,
			       (unsigned long long)res.steps, (unsigned long long)res.calls,
			       (unsigned long long)res.cells_checked, (unsigned long long)res.tokens,
			       (unsigned long long)res.requests, (unsigned long long)res.failed_calls,
			       (unsigned long long)res.preemptions,
			       (unsigned long long)res.spec_accepted,
			       (unsigned long long)res.hit_tokens,
			       (unsigned long long)res.overlap_steps);
		if (res.failed) {
			failed++;
			printf("FAIL seed %llu: %s\n  features: %s\n  replay: %s --seed %llu -v\n",
			       (unsigned long long)seed, res.msg, res.features, argv[0],
			       (unsigned long long)seed);
			fflush(stdout);
		}
	}
	printf("compose: %llu seeds (%llu..%llu), %llu failed, %.1f s; %llu requests, %llu calls "
	       "(%llu failed), %llu KV cells checked, %llu tokens, %llu preemptions, %llu drafts "
	       "accepted, %llu hit tokens, %llu overlapped steps\n",
	       (unsigned long long)ran, (unsigned long long)lo, (unsigned long long)(lo + ran - 1),
	       (unsigned long long)failed, now_s() - t0, (unsigned long long)reqs,
	       (unsigned long long)calls, (unsigned long long)fcalls, (unsigned long long)cells,
	       (unsigned long long)tokens, (unsigned long long)preempt, (unsigned long long)spec,
	       (unsigned long long)hits, (unsigned long long)ovl);
	printf("refused: %llu combos (%llu seeds;", (unsigned long long)(refused[0] + refused[1] + refused[2] + refused[3]),
	       (unsigned long long)refused_seeds);
	for (k = 0; k < CX_REFUSE_COUNT; k++)
		printf(" %s %llu", cx_refuse_names[k], (unsigned long long)refused[k]);
	printf(")%s\n", opt.strict ? " [strict: each one failed its seed]" : "");
	return failed ? 1 : 0;
}
