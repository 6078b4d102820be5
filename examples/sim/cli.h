/*
 * cli.h - bkv-sim's command line, parsed (cli.c): what sim.c's main needs to
 * know about the options besides the sim_config they fill in. Part of the
 * bkv-sim program, not of the simulator library.
 */
#ifndef BKV_SIM_CLI_H
#define BKV_SIM_CLI_H

#include "sim.h"

#define MAX_SWEEP 64
/* Bounds on sizes, so a typo is a clear error instead of gigabytes. */
#define MAX_REQS 1000000u        /* --n, requests of one synthetic trace */
#define MAX_REQS_TOTAL 10000000u /* requests over all seeds */
#define MAX_LEN (1u << 20)       /* --prompt, --output tokens */
#define MAX_BLOCKS (1u << 22)    /* --kv-blocks, --host-blocks (about 110 bytes each) */
#define MAX_SLOTS 65536u         /* --slots */
#define MAX_BLOCK_TOKENS 4096u   /* --block-tokens */
#define MAX_EXT_BLOCKS (1u << 24) /* --ext-tier capacity (about 32 bytes a block) */

/* The command line, parsed, apart from what goes straight into sim_config. */
typedef struct opts {
	const char *workload;    /* "seed000", "synthetic" or "sessions" */
	trace_format fmt;        /* format of trace_path */
	const char *trace_path;  /* a trace file; NULL: synthetic workload */
	const char *run;         /* DistServe run filter; NULL: all rows */
	uint32_t limit;          /* first requests of a trace; 0 = all */
	uint32_t n;              /* synthetic: requests */
	trace_arrival arrival;   /* synthetic: arrival process */
	double rate;             /* synthetic: requests per second */
	trace_dist prompt;       /* synthetic: prompt tokens */
	trace_dist output;       /* synthetic: output tokens */
	trace_sessions_spec sessions; /* sessions: the rotation (--sessions,
				    --turns, --grow, --order); --prompt is
				    a session's first context */
	uint64_t seed_lo;        /* first seed */
	uint64_t seed_hi;        /* last seed, inclusive (>= seed_lo) */
	int seeds_set;           /* --seeds given (else the workload's default) */
	int baseline;            /* add the static row and speed-ups */
	char sweep_key[16];      /* "k", "budget" or "slots"; "" = no sweep */
	uint32_t sweep_vals[MAX_SWEEP]; /* [n_sweep] values swept */
	int n_sweep;             /* values in sweep_vals */
	sim_format fmt_out;      /* table, JSON or CSV */
	const char *svg;         /* chart path, or NULL */
	int fidelity;            /* --fidelity: every DistServe run */
	int quiet;               /* no progress line */
	int gen_set;             /* --gen given (else the workload's default) */
	int host_set;            /* --host given (else --policy chunked picks
				    a mixed host) */
	int policy_chunked;      /* --policy chunked */
	int compare;             /* --compare */
	uint32_t cmp_k[MAX_SWEEP]; /* [n_cmp_k] fixed k of --compare */
	int n_cmp_k;             /* 0: the default list */
	int allow_errors;        /* --allow-errors */
	int peers;               /* --peers: the peer presets join --compare */
	double trace_rate;       /* --rate: a trace's arrivals scaled to this
				    mean rate, req/s; 0 = as recorded */
	const char *cost_name;   /* --cost as given, for the title ("poly") */
	const char *shape;       /* --shape as given (shape.c); NULL: none */
	int big_gpu;             /* the cost model is an H100's (vLLM's larger
				    defaults) */
	int no_spread;           /* --no-spread: a bucketed trace's arrivals
				    stay as recorded when rescaled */
	int bucketed;            /* the trace's arrivals come in buckets
				    (sim_trace_buckets; sim.c fills it in) */
	int spread;              /* ... and were spread within them */
	sim_buckets buckets;     /* what sim_trace_buckets counted */
	int goodput;             /* --goodput given */
	double gp_ttft_ms, gp_tpot_ms, gp_pct; /* its targets */
	char title[256];         /* the table's title (sim.c fills it in) */
} opts;

/* Both halves of a parsed command line: the options table (cli.c) names
 * where each option is stored as an offset into this. */
typedef struct cli_args {
	opts o;       /* bkv-sim's own options */
	sim_config c; /* the run's settings (sim_config_init, then the options) */
} cli_args;

/* Parse argv into a (which it initialises: defaults first), then settle
 * what depends on several options (a chunked policy's host, the output
 * length convention, the progress line). Returns -1 when the program should
 * run, else the exit status to end with: 0 after --help (the usage on
 * stdout), 2 after a message on stderr ("bkv-sim: unknown option ...",
 * "bkv-sim: --slots needs a value", "bkv-sim: bad value for --k: '0'", or
 * an option's own bound). */
int cli_parse(int argc, char **argv, cli_args *a);

#endif /* BKV_SIM_CLI_H */
