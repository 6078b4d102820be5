/*
 * trace.h - request traces for bkv-sim: parsers for real trace files, the
 * synthetic workloads, and deterministic prompt tokens.
 *
 * A trace is a flat array of requests (arrival time, prompt and output
 * lengths) plus, for Mooncake traces, a shared pool of 512-token prefix-block
 * ids. The parsers take a byte buffer, never a path, so a fuzz harness can feed
 * them anything: malformed input gives TRACE_EPARSE and a message naming the
 * line, never a crash. This unit needs only libc (and libm for the workloads).
 *
 * Part of the simulator library (examples/sim/meson.build): trace.c holds
 * the request array, trace_parse.c the parsers, trace_gen.c the made-up
 * prompt tokens and workloads; trace_alloc.h is the allocation seam the
 * fault tests and the fuzzer use.
 */
#ifndef BKV_SIM_TRACE_H
#define BKV_SIM_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define TRACE_OK 0
#define TRACE_EPARSE (-1) /* malformed input; err names the line */
#define TRACE_ENOMEM (-2) /* out of memory */
#define TRACE_EIO (-3)    /* the file could not be read */

/* Mooncake's prefix-block size: one hash id stands for this many tokens. */
#define TRACE_HASH_BLOCK 512
/* Longest prompt or output a trace may give (guards the simulator's pool). */
#define TRACE_MAX_TOKENS (1u << 24)

typedef struct trace_req {
	double arrival_us;     /* arrival, microseconds after the trace start */
	uint32_t prompt_len;   /* prompt tokens, >= 1 */
	uint32_t output_len;   /* tokens to generate, >= 1 (0 in a file is
				  read as 1) */
	uint32_t hash_off;     /* first of its ids in trace.hash_ids */
	uint32_t n_hash;       /* prefix-block ids; 0 = unique prompt */
	double ref_ttft_ms;    /* measured TTFT (DistServe ground truth), or
				  a negative value when unknown */
	double ref_tpot_ms;    /* measured TPOT, or negative */
} trace_req;

typedef struct trace {
	trace_req *reqs;    /* [n] in file order: sorted by arrival for Azure
			       and Mooncake (the parsers check), and within
			       each run for DistServe (see trace_parse) */
	uint32_t n;         /* requests */
	uint32_t cap;       /* allocated entries of reqs */
	uint32_t *hash_ids; /* [n_hash] Mooncake block ids, per request in order */
	size_t n_hash;      /* ids stored */
	size_t hash_cap;    /* allocated entries of hash_ids */
	uint64_t salt;      /* mixed into unique prompts' tokens */
} trace;

typedef enum trace_format {
	TRACE_AZURE = 0,     /* TIMESTAMP,ContextTokens,GeneratedTokens */
	TRACE_MOONCAKE = 1,  /* JSONL: timestamp (ms), input_length,
				output_length, hash_ids */
	TRACE_DISTSERVE = 2  /* DistServe vLLM ground-truth CSV */
} trace_format;

/* Release a trace's arrays and zero it. NULL is ignored. */
void trace_free(trace *t);

/* Append one request (copying n_hash ids). Returns TRACE_OK or TRACE_ENOMEM. */
int trace_push(trace *t, double arrival_us, uint32_t prompt_len, uint32_t output_len,
	       const uint32_t *hash, uint32_t n_hash);

/*
 * Parse a buffer into t (which must be zeroed or freed; on failure it is left
 * empty). filter: for TRACE_DISTSERVE, keep only the rows whose run column
 * equals it (e.g. "vllm-100-1"); NULL keeps every row; ignored by the other
 * formats. Azure and Mooncake arrivals are made relative to the first
 * request. DistServe arrivals are the file's issue_time_rel_s, relative to
 * the first request of their own run: without a filter, several runs follow
 * one another and arrivals start again with each run (pass a filter to
 * replay one run). err (may be NULL) receives "line N: what is wrong" on
 * TRACE_EPARSE; on TRACE_ENOMEM it may be left untouched.
 */
int trace_parse(trace_format fmt, const char *buf, size_t len, const char *filter, trace *t,
		char *err, size_t errlen);

/* Read a whole file and parse it; TRACE_EIO when it cannot be read. */
int trace_load(trace_format fmt, const char *path, const char *filter, trace *t, char *err,
	       size_t errlen);

/* The run names of a DistServe file in order of first appearance, written
 * into names[max][32]. Returns how many (<= max) or a negative TRACE_ code. */
int trace_distserve_runs(const char *buf, size_t len, char (*names)[32], int max);

/*
 * The prompt tokens of request i into out[prompt_len]. A Mooncake request's
 * tokens come from its hash ids: id h expands into 512 tokens that depend on
 * h and the position in the block only, so equal ids give equal tokens (the
 * last id covers the remainder). Other requests get tokens from (salt, i,
 * position), unique across requests. Token ids are in [0, 2^30).
 */
void trace_prompt_tokens(const trace *t, uint32_t i, int32_t *out);

/* ---- synthetic workloads ------------------------------------------------
 * The generator is splitmix64 (Steele, Lea and Flood 2014), seeded with the
 * workload seed; every draw is documented in docs/benchmarks.md so a run can
 * be reproduced in any language. */

typedef struct trace_rng {
	uint64_t state; /* splitmix64 state */
} trace_rng;

void trace_rng_seed(trace_rng *r, uint64_t seed);
uint64_t trace_rng_next(trace_rng *r);
/* Uniform integer in [lo, hi] (by rejection, no modulo bias). */
uint32_t trace_rng_range(trace_rng *r, uint32_t lo, uint32_t hi);
/* Uniform double in [0, 1). */
double trace_rng_unit(trace_rng *r);

/* MT19937 exactly as CPython's random module: trace_mt_seed(m, s) is
 * random.seed(s), randint(lo, hi) and random() are random.randint and
 * random.random (same outputs, bit for bit). */
typedef struct trace_mt {
	uint32_t mt[624]; /* state vector */
	int mti;          /* next word; 624 = regenerate */
} trace_mt;

void trace_mt_seed(trace_mt *m, uint64_t seed);
uint32_t trace_mt_next(trace_mt *m);
uint32_t trace_mt_randint(trace_mt *m, uint32_t lo, uint32_t hi);
double trace_mt_random(trace_mt *m);

/* Seed 000's workload (../shared/design/SEED000-MODEL.md): 256 requests at
 * time 0, drawn with MT19937 as Python does it:
 *   random.seed(seed); for each request: prompt = randint(8, 64);
 *   output = 64 if random() < 0.40 else randint(1, 39)
 * (the reference simulator's draws: its "fitted" column is reproduced). */
int trace_seed000(trace *t, uint64_t seed);

/* A length distribution: constant, uniform in [lo, hi], or seed 000's
 * generation mix (64 with probability 0.4, else uniform 1..39). */
typedef struct trace_dist {
	enum { DIST_CONST, DIST_UNIFORM, DIST_SEED000_GEN } kind; /* the shape */
	uint32_t lo, hi; /* tokens, inclusive bounds; CONST uses lo */
} trace_dist;

/* Parse "N", "LO..HI" or "seed000". Returns 0 or -1. */
int trace_dist_parse(const char *s, trace_dist *d);
uint32_t trace_dist_draw(const trace_dist *d, trace_rng *r);

typedef enum trace_arrival {
	ARRIVAL_BURST = 0,   /* everyone at time 0 */
	ARRIVAL_UNIFORM = 1, /* evenly spaced at rate per second */
	ARRIVAL_POISSON = 2, /* exponential gaps at rate per second */
	ARRIVAL_BURSTY = 3   /* bursts of requests arriving together, the
				bursts Poisson at rate / TRACE_BURST_MEAN per
				second, each of a geometric number of requests
				(mean TRACE_BURST_MEAN): rate per second */
} trace_arrival;

#define TRACE_BURST_MEAN 8.0 /* mean requests of a bursty arrival's burst */

/* n requests with the given arrivals and lengths, drawn from seed: per
 * request, gap (Poisson: -ln(1 - unit()) / rate; bursty: at a burst's first
 * request the gap to it, -ln(1 - unit()) / (rate / TRACE_BURST_MEAN), then
 * its size, 1 + floor(ln(1 - unit()) / ln(1 - 1 / TRACE_BURST_MEAN))), then
 * prompt, then output. */
int trace_synthetic(trace *t, uint32_t n, trace_arrival arr, double rate_per_s,
		    const trace_dist *prompt, const trace_dist *output, uint64_t seed);

/* Rotating sessions: `sessions` conversations (or agents) take turns, each
 * turn's prompt the session's whole context so far. A session's first
 * context is drawn from the context distribution (rounded up to whole
 * 512-token prefix blocks); every later turn adds `grow` tokens (rounded up
 * likewise: the last answer and the next message) and re-reads the rest.
 * Turn order per round: the same rotation every round, or a fresh random
 * permutation. Requests carry prefix-block ids, as Mooncake's do. */
typedef enum trace_sessions_order {
	SESSIONS_ROUND_ROBIN = 0, /* sessions 0, 1, ..., n - 1 every round */
	SESSIONS_SHUFFLE = 1      /* a random permutation every round */
} trace_sessions_order;

typedef struct trace_sessions_spec {
	uint32_t sessions;          /* sessions in rotation, >= 1 */
	uint32_t turns;             /* rounds: requests = sessions x turns */
	uint32_t grow;              /* tokens a turn adds to its session */
	trace_sessions_order order; /* turn order within a round */
} trace_sessions_spec;

/* sessions x turns requests, round after round, arrivals as trace_synthetic
 * (per request: gap, then output length; first contexts drawn first, then
 * each round's permutation). TRACE_EPARSE when a context could pass
 * TRACE_MAX_TOKENS. */
int trace_sessions(trace *t, const trace_sessions_spec *sp, trace_arrival arr, double rate_per_s,
		   const trace_dist *context, const trace_dist *output, uint64_t seed);

#endif /* BKV_SIM_TRACE_H */
