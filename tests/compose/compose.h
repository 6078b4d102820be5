/*
 * compose.h - the randomized composition tester: one seed draws a scenario
 * (pool and scheduler features together, requests, and what happens between
 * steps), runs it through a fake device that checks every KV cell a batch
 * reads, and checks every request's delivered tokens against the tokens it
 * would get run alone. Written against the public header only
 * (include/batchkv.h); what it draws and checks: compose.c's top comment.
 *
 * Used by tests/compose/main.c (the meson test, suite 'compose', and the soak
 * run of bench/compose_soak.sh) and tests/fuzz/fuzz_compose.c.
 */
#ifndef BKV_COMPOSE_H
#define BKV_COMPOSE_H

#include <stdint.h>

/* Combinations the library may refuse at create (BKV_EINVAL). A refused
 * scenario is counted under its combination and run again without one of
 * the two features (unless strict: then the refusal is a failure). The
 * library accepts every combination listed; the meson test runs strict, so
 * a refusal fails it. */
enum {
	CX_REFUSE_OVERLAP_STATE = 0, /* overlap with a STATE group (sched create) */
	CX_REFUSE_COUNT
};

extern const char *const cx_refuse_names[CX_REFUSE_COUNT];

/* cx_opts.skip: leave out one action while hunting other defects (a seed
 * then draws the same scenario, minus that action's calls). */
#define CX_SKIP_RESET 0x1u      /* bkv_pool_reset_cache between steps */
#define CX_SKIP_PIN_MISUSE 0x2u /* sequence calls on a pin id */

typedef struct cx_opts {
	int strict;       /* a refusal at create fails the seed
			     (BKV_COMPOSE_STRICT=1) */
	int verbose;      /* print each seed's features and counters */
	int no_threads;   /* never abort from a second thread (fuzzers) */
	uint32_t max_steps; /* driver iterations before "did not finish"
			       (0: 4000) */
	uint32_t skip;    /* CX_SKIP_* */
} cx_opts;

typedef struct cx_result {
	int failed;                 /* nonzero: msg says what went wrong */
	char msg[512];              /* the first violation */
	char features[512];         /* the drawn features, one line */
	uint32_t refused[CX_REFUSE_COUNT]; /* refusals met by this seed */
	uint64_t spec_states;       /* STATE units of drafts written (per-token
				       states of speculated rows) */
	uint64_t steps;             /* driver iterations */
	uint64_t calls;             /* compute and launch callbacks */
	uint64_t cells_checked;     /* KV cells read and verified */
	uint64_t tokens;            /* tokens delivered */
	uint64_t requests;          /* requests submitted */
	uint64_t failed_calls;      /* host calls that failed */
	uint64_t preemptions;       /* from bkv_sched_stats */
	uint64_t spec_accepted;     /* from bkv_sched_stats */
	uint64_t hit_tokens;        /* prefix-cache hits, from bkv_sched_stats */
	uint64_t overlap_steps;     /* from bkv_sched_stats */
	uint64_t releases;          /* bkv_sched_kv_release / _resume rounds */
	uint64_t adapter_calls;     /* calls whose rows carried adapters */
	uint64_t encodes;           /* encoder inputs the calls ran */
	uint64_t kv_loaded;         /* KV connector: prompt tokens loaded */
	uint64_t kv_loaded_state;   /* of which in pools with a STATE group */
	uint64_t kv_saved;          /* blocks (and states) saved */
	uint32_t abandoned;         /* the scheduler was destroyed mid-run:
				       1 + the steps it had outstanding */
} cx_result;

/* Run one seed. Deterministic per seed unless the scenario drew an abort
 * thread (features say "abort-thread"). Returns 0 or -1 (res->failed). */
int cx_run_seed(uint64_t seed, const cx_opts *opt, cx_result *res);

/* The features seed would draw (res->features), without running it. */
void cx_describe_seed(uint64_t seed, char *buf, uint32_t cap);

#endif /* BKV_COMPOSE_H */
