/*
 * main.c - the composition tester's command line (compose.h): runs a range
 * of seeds, or seeds for a while, and prints every failing seed with its
 * features, what went wrong and the command that replays it.
 *
 *   compose                       the CI form: seeds 1..CX_CI_SEEDS and the
 *                                 seeds a longer soak once failed (found[])
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
 * A seed range runs each seed in a child process (--in-process: not), so
 * that a library assertion or a crash fails that seed only; a single seed
 * runs in this process (for a debugger), where a handler prints the seed
 * before the process dies.
 */
#define _POSIX_C_SOURCE 200809L
#include "compose.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define CX_CI_SEEDS 3000u

/* Seeds beyond CX_CI_SEEDS that a soak (bench/compose_soak.sh) found
 * failing, each a defect since fixed: the CI form runs them too. */
static const uint64_t found[] = {150332, 157918, 182639, 1013044};

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

/* What the run adds up. */
typedef struct tally {
	uint64_t failed, ran, refused_seeds, refused[CX_REFUSE_COUNT];
	uint64_t calls, cells, tokens, reqs, fcalls, preempt, spec, hits, ovl;
	uint64_t spec_states; /* per-token states of speculated rows */
	uint64_t kv_loaded, kv_loaded_state, kv_saved; /* KV connector */
	uint64_t releases;    /* device KV released and resumed */
	uint64_t adapter_calls; /* calls whose rows carried adapters */
	uint64_t encodes;     /* encoder inputs run */
} tally;

static void account(tally *t, uint64_t seed, const cx_result *res, int verbose)
{
	int k, any = 0;

	t->ran++;
	for (k = 0; k < CX_REFUSE_COUNT; k++) {
		t->refused[k] += res->refused[k];
		any |= res->refused[k] != 0;
	}
	t->refused_seeds += any;
	t->calls += res->calls;
	t->spec_states += res->spec_states;
	t->kv_loaded += res->kv_loaded;
	t->kv_loaded_state += res->kv_loaded_state;
	t->kv_saved += res->kv_saved;
	t->releases += res->releases;
	t->adapter_calls += res->adapter_calls;
	t->encodes += res->encodes;
	t->cells += res->cells_checked;
	t->tokens += res->tokens;
	t->reqs += res->requests;
	t->fcalls += res->failed_calls;
	t->preempt += res->preemptions;
	t->spec += res->spec_accepted;
	t->hits += res->hit_tokens;
	t->ovl += res->overlap_steps;
	if (verbose)
		printf("seed %llu: %s\n  features: %s\n  steps %llu calls %llu cells %llu tokens "
		       "%llu requests %llu failed calls %llu preemptions %llu spec accepted %llu hit "
		       "tokens %llu overlap steps %llu%s\n",
		       (unsigned long long)seed, res->failed ? "FAIL" : "ok", res->features,
		       (unsigned long long)res->steps, (unsigned long long)res->calls,
		       (unsigned long long)res->cells_checked, (unsigned long long)res->tokens,
		       (unsigned long long)res->requests, (unsigned long long)res->failed_calls,
		       (unsigned long long)res->preemptions, (unsigned long long)res->spec_accepted,
		       (unsigned long long)res->hit_tokens, (unsigned long long)res->overlap_steps,
		       res->abandoned ? (res->abandoned > 1 ? " (abandoned, steps outstanding)"
							    : " (abandoned)")
				      : "");
	if (res->failed) {
		t->failed++;
		printf("FAIL seed %llu: %s\n  features: %s\n  replay: %s --seed %llu -v\n",
		       (unsigned long long)seed, res->msg, res->features, prog,
		       (unsigned long long)seed);
	}
	fflush(stdout);
}

typedef struct record {
	uint64_t seed;
	cx_result res;
} record;

/* Seeds [lo, hi) in child processes: a child runs seeds in order and sends
 * each result down a pipe; when one dies (a library assertion, a crash),
 * the seed after its last result is the one that killed it, and a new
 * child goes on from the next. Returns the seed to stop at (time). */
static void run_children(tally *t, uint64_t lo, uint64_t hi, double t0, double limit,
			 const cx_opts *opt)
{
	uint64_t seed = lo;

	while (seed < hi && !(limit > 0 && now_s() - t0 > limit)) {
		int fd[2], status = 0;
		pid_t pid;
		record rec;
		uint64_t next = seed;

		if (pipe(fd) != 0 || (pid = fork()) < 0) {
			perror("compose: fork");
			exit(2);
		}
		if (pid == 0) {
			close(fd[0]);
			for (; seed < hi && !(limit > 0 && now_s() - t0 > limit); seed++) {
				running_seed = seed;
				memset(&rec, 0, sizeof(rec));
				rec.seed = seed;
				cx_run_seed(seed, opt, &rec.res);
				if (write(fd[1], &rec, sizeof(rec)) != (ssize_t)sizeof(rec))
					_exit(3);
			}
			_exit(0);
		}
		close(fd[1]);
		for (;;) {
			size_t got = 0;

			while (got < sizeof(rec)) {
				ssize_t n = read(fd[0], (char *)&rec + got, sizeof(rec) - got);

				if (n <= 0)
					break;
				got += (size_t)n;
			}
			if (got < sizeof(rec))
				break;
			account(t, rec.seed, &rec.res, opt->verbose);
			next = rec.seed + 1;
		}
		close(fd[0]);
		waitpid(pid, &status, 0);
		if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
			return;
		memset(&rec, 0, sizeof(rec));
		rec.res.failed = 1;
		cx_describe_seed(next, rec.res.features, sizeof(rec.res.features));
		snprintf(rec.res.msg, sizeof(rec.res.msg),
			 "crashed (%s %d; the library's message is above)",
			 WIFSIGNALED(status) ? "signal" : "exit status",
			 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
		account(t, next, &rec.res, opt->verbose);
		seed = next + 1;
	}
}

int main(int argc, char **argv)
{
	uint64_t lo = 1, hi = 1 + CX_CI_SEEDS, seed, n_found = 0;
	double limit = 0, t0 = now_s();
	cx_opts opt;
	cx_result res;
	tally t;
	const char *env = getenv("BKV_COMPOSE_STRICT");
	int i, k, in_process = 0, ci_form = 1;

	memset(&opt, 0, sizeof(opt));
	memset(&t, 0, sizeof(t));
	opt.strict = env && *env && strcmp(env, "0") != 0;
	prog = argv[0];
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seeds") && i + 1 < argc) {
			char *colon;

			ci_form = 0;
			lo = strtoull(argv[++i], &colon, 0);
			hi = *colon == ':' ? strtoull(colon + 1, NULL, 0) : lo + 1;
		} else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
			ci_form = 0;
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
		} else if (!strcmp(argv[i], "--in-process")) {
			in_process = 1;
		} else if (!strcmp(argv[i], "--skip-reset")) {
			opt.skip |= CX_SKIP_RESET;
		} else if (!strcmp(argv[i], "--skip-pin-misuse")) {
			opt.skip |= CX_SKIP_PIN_MISUSE;
		} else if (!strcmp(argv[i], "--no-threads")) {
			opt.no_threads = 1;
		} else {
			fprintf(stderr,
				"usage: %s [--seeds A:B | --seed N] [--time S] [-v] [--strict] "
				"[--no-threads] [--in-process] [--skip-reset] [--skip-pin-misuse] | --describe N\n",
				argv[0]);
			return 2;
		}
	}
	signal(SIGABRT, on_signal);
	signal(SIGSEGV, on_signal);
	if (hi - lo > 1 && !in_process) {
		run_children(&t, lo, hi, t0, limit, &opt);
	} else {
		for (seed = lo; seed < hi && !(limit > 0 && now_s() - t0 > limit); seed++) {
			running_seed = seed;
			cx_run_seed(seed, &opt, &res);
			account(&t, seed, &res, opt.verbose);
		}
	}
	if (ci_form) {
		for (k = 0; k < (int)(sizeof(found) / sizeof(found[0])); k++)
			run_children(&t, found[k], found[k] + 1, t0, 0, &opt);
		n_found = (uint64_t)k;
		printf("compose: and the %llu seeds a soak once failed\n",
		       (unsigned long long)n_found);
	}
	printf("compose: %llu seeds (%llu..%llu), %llu failed, %.1f s; %llu requests, %llu calls "
	       "(%llu failed), %llu KV cells checked, %llu tokens, %llu preemptions, %llu drafts "
	       "accepted, %llu hit tokens, %llu overlapped steps\n",
	       (unsigned long long)t.ran, (unsigned long long)lo,
	       (unsigned long long)(lo + t.ran - n_found - 1), (unsigned long long)t.failed, now_s() - t0,
	       (unsigned long long)t.reqs, (unsigned long long)t.calls, (unsigned long long)t.fcalls,
	       (unsigned long long)t.cells, (unsigned long long)t.tokens,
	       (unsigned long long)t.preempt, (unsigned long long)t.spec, (unsigned long long)t.hits,
	       (unsigned long long)t.ovl);
	printf("speculation over a STATE group: %llu per-token states of drafts\n",
	       (unsigned long long)t.spec_states);
	printf("device KV released and resumed: %llu times\n", (unsigned long long)t.releases);
	printf("KV connector: %llu prompt tokens loaded (%llu with a STATE group), %llu blocks "
	       "saved\n", (unsigned long long)t.kv_loaded, (unsigned long long)t.kv_loaded_state,
	       (unsigned long long)t.kv_saved);
	printf("calls with adapters: %llu, encoder inputs run: %llu\n",
	       (unsigned long long)t.adapter_calls, (unsigned long long)t.encodes);
	for (k = 0, seed = 0; k < CX_REFUSE_COUNT; k++)
		seed += t.refused[k];
	printf("refused: %llu combos (in %llu seeds:", (unsigned long long)seed,
	       (unsigned long long)t.refused_seeds);
	for (k = 0; k < CX_REFUSE_COUNT; k++)
		printf(" %s %llu", cx_refuse_names[k], (unsigned long long)t.refused[k]);
	printf(")%s\n", opt.strict ? " [strict: each one failed its seed]" : "");
	return t.failed ? 1 : 0;
}
