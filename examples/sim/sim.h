/*
 * sim.h - the simulator library (examples/sim/meson.build: bkvsim_dep): one
 * simulated run's settings and results, the virtual host that produces
 * them, and the reports. bkv-sim and the simulator's tests use it through
 * this header; the library reaches batchkv through its public header only.
 *
 * Defined in host.c (sim_run, the virtual host, pricing, quantiles),
 * goodput.c (the goodput search), peers.c (the peer presets), ext.c (an
 * external KV tier behind the KV connector), report.c
 * (rows, table, JSON, CSV, warnings) and svg.c (the charts). The traces
 * they run are trace.h's.
 */
#ifndef BKV_SIM_H
#define BKV_SIM_H

#include "batchkv.h"
#include "trace.h"

#include <stdint.h>
#include <stdio.h>

/* Progress when stderr is not a terminal: a line at most this often, s. */
#define SIM_PROGRESS_S 3.0

/* Which cost model prices the virtual host's calls. */
typedef enum sim_cost_kind {
	SIM_COST_POLY = 0,      /* seed 000's polynomial (bkv_cost_poly) */
	SIM_COST_ROOFLINE = 1,  /* seed 004's roofline preset */
	SIM_COST_DISTSERVE = 2  /* DistServe's vLLM/OPT-13B/A100 fit */
} sim_cost_kind;

/* How a request's trace output length becomes max_new_tokens. A split host
 * samples the first token in the prefill call. Seed 000 counts "a prefill and
 * then g decode steps", so its g becomes g + 1 tokens; real traces count
 * generated tokens, the first one included. */
typedef enum sim_gen_convention {
	SIM_GEN_TOKENS = 0, /* max_new_tokens = output_len */
	SIM_GEN_STEPS = 1   /* max_new_tokens = output_len + 1 */
} sim_gen_convention;

/* Everything one run needs besides the trace. */
typedef struct sim_config {
	bkv_policy policy;         /* static or continuous */
	uint32_t k;                /* admission group (continuous); 0 = auto
				      (the cost model decides) */
	uint64_t max_wait_us;      /* partial-group timeout; UINT64_MAX never */
	int chunked;               /* chunked prefill (needs a mixed host) */
	uint32_t budget;           /* token budget when chunked; 0 = auto */
	uint32_t tpot_us;          /* scheduler's time-between-tokens target;
				      0 = none */
	uint32_t ttft_us;          /* scheduler's time-to-first-token target
				      (bkv_sched_config.ttft_target_us);
				      0 = none */
	uint32_t max_tokens;       /* max_new_tokens every request is sent
				      with (a client's cap; SIM_MAX_TOKENS by
				      default; cut to what the pool holds
				      beside the prompt, as vLLM cuts
				      max_tokens at max_model_len): it ends at
				      a stop token (SIM_STOP_TOKEN) once it has
				      its trace length, or at the cap when that
				      is shorter. Unused with oracle */
	int oracle;                /* nonzero: max_new_tokens = the trace
				      length and no stop token, so the
				      scheduler knows every output length
				      (--oracle-lengths) */
	int hints;                 /* nonzero: each request carries its true
				      output length as predicted_output */
	uint64_t max_bypass_us;    /* bkv_sched_config.max_bypass_us: 0 = auto,
				      UINT64_MAX = no bound */
	int mixed_host;            /* 1: forward(); 0: prefill() + decode() */
	uint32_t slots;            /* max_running */
	uint32_t block_tokens;     /* pool block size */
	uint32_t kv_blocks;        /* device blocks; 0 = derive from the trace */
	uint32_t state_units;      /* a STATE group's units (0: the pool's
				      default) */
	int state_share;           /* 1: the STATE group's units share the
				      frames with attention (state_units is
				      then their floor) */
	uint32_t host_blocks;      /* swap tier blocks */
	int host_cache;            /* bkv_pool_config.host_cache: the host
				      tier keeps evicted prefix blocks */
	uint32_t host_link_gbps;   /* device<->host link, GB/s (default 25,
				      the library's own default): the host
				      prices every swap copy with it, and
				      the scheduler is told
				      (host_link_bytes_per_us) */
	int copy_overlap;          /* 1: the host runs swap copies beside its
				      kernels (a call takes the longest of
				      compute and each direction's copies;
				      bkv_sched_config.copy_overlap); 0: they
				      add */
	int prefix_cache;          /* pool prefix cache on/off */
	sim_gen_convention gen;    /* output length convention */
	sim_cost_kind cost_kind;   /* which model */
	bkv_cost_poly poly;        /* used when cost_kind is POLY */
	bkv_cost_roofline roofline; /* used when ROOFLINE (for MFU/MBU too) */
	int give_model;            /* nonzero: hand the same model to the
				      scheduler (cfg.cost) */
	int calibrate;             /* nonzero: hand the scheduler a calibrated
				      model learning from scratch instead (the
				      host still runs on the model above) */
	double noise_sigma;        /* --noise: each call's measured time is
				      the model's times lognormal(0, sigma);
				      0 = an exact clock */
	double noise_stall_p;      /* probability a call also stalls */
	double noise_stall_x;      /* a stall multiplies the call by this */
	uint32_t noise_seed32;     /* the noise's generator seed (--noise-seed;
				      default 1) */
	int noise_exact;           /* with noise: give the scheduler the exact
				      model (no calibration) instead of a
				      calibrated model over it */
	const char *calib_csv;     /* measured step times (kind,decode_rows,
				      decode_context,prefill_tokens,measured_us;
				      examples/python/gpu_step_times.py) the
				      scheduler's calibrated model learns before
				      the run; NULL: none */
	int check;                 /* run bkv_sched_check after every step */
	int progress;              /* 1: a progress line on stderr every 2^16
				      steps, rewritten in place (a terminal);
				      2: a whole line at most every
				      SIM_PROGRESS_S of wall time (stderr is
				      a pipe or a file); 0: none. The caller
				      checks isatty. */
	double slo_ttft_ms;        /* > 0: count the requests whose TTFT is at
				      most this and whose TPOT is at most
				      slo_tpot_ms (sim_result.slo_met) */
	double slo_tpot_ms;        /* TPOT target of that count (a request of
				      one token meets it) */
	uint32_t pool_slots;       /* slots the derived pool is sized for when
				      kv_blocks is 0 (0 = slots): a preset
				      with more running rows keeps the
				      machine's memory */
	bkv_evict_policy evict;    /* bkv_sched_config.evict (default LRU, not
				      the library's segmented: the sim's
				      documented runs keep their policy) */
	bkv_batch_layout batch_layout; /* bkv_sched_config.batch_layout
				      (--layout; default FLAT): the virtual
				      host prices rows and tokens, so both
				      layouts give the same times */
	bkv_victim_policy victim;  /* bkv_sched_config.victim (default
				      RECENT) */
	bkv_admit_reserve admit_reserve; /* bkv_sched_config.admit_reserve
					    (default PROMPT) */
	bkv_preempt_mode preempt;  /* bkv_sched_config.preempt; AUTO (0) keeps
				      bkv-sim's rule: swap with a host tier,
				      else recompute */
	uint32_t n_groups;         /* the model's KV groups (--shape,
				      shape.c), 0..BKV_MAX_GROUPS; 0 = one
				      full-attention group */
	bkv_kv_group groups[BKV_MAX_GROUPS]; /* [n_groups], the pool's groups;
				      roofline.groups may point here (a copy
				      of this config then shares the
				      original's array) */
	/* speculative decoding (--spec-k, --spec-accept): the host proposes
	 * drafts and accepts each with the request's acceptance rate */
	uint32_t spec_k;           /* bkv_sched_config.spec_max_k; 0 = off */
	int spec_auto;             /* 1: BKV_SPEC_K_AUTO (k chosen per row and
				      step, up to spec_k), 0: fixed spec_k */
	double spec_accept;        /* the workload's acceptance rate in [0, 1) */
	double spec_spread;        /* each request's rate drawn uniformly from
				      spec_accept +- spec_spread (clamped to
				      [0, 0.99]); 0 = every request alike */
	uint32_t host_overhead_us; /* the host's own CPU time per step (input
				      preparation, sampling, an engine's
				      bookkeeping), us, on the virtual clock
				      (--host-overhead-us; 0 = none): the
				      synchronous contract adds it to every
				      step's device time */
	int prefill_first;         /* bkv_sched_config.prefill_first
				      (--prefill-first): a split host's
				      step that admits makes only its
				      prefill call, as vLLM v0 */
	/* an engine's own time beyond the cost model's forward (--call-overhead-us,
	 * --row-overhead-us, --prefill-scale; host.c, "Engine overhead"): each
	 * host call takes prefill_scale x the model's price of its prefill
	 * work, plus the rest of the price, plus call_overhead_us plus
	 * row_overhead_us per row. All 0: the price as it is */
	double call_overhead_us;   /* us per host call (scheduling, launch,
				      output processing of an engine's
				      iteration), >= 0 */
	double row_overhead_us;    /* us per row of a call (sampling,
				      detokenising and streaming one
				      sequence's token), >= 0 */
	double prefill_scale;      /* factor on the price of prefill work (a
				      split host's prefill call, the prefill
				      share of a mixed call); 0 = 1 */
	uint32_t overlap;          /* the overlapped contract's depth
				      (--overlap [N]; 0 off, 1 ..
				      BKV_OVERLAP_MAX_DEPTH):
				      bkv_step_launch / bkv_step_complete, the
				      device runs up to N steps while the host
				      prepares the next (a step then takes
				      max(device, host), not their sum); needs
				      a mixed host */
	/* adapters (LoRA; --adapters, adapters.c) */
	uint32_t adapters;         /* distinct adapters the requests run with,
				      drawn per request by popularity (0:
				      none, the base model) */
	double adapter_zipf;       /* popularity: rank k drawn with weight
				      k^-adapter_zipf (default 1; 0 =
				      uniform) */
	uint32_t max_adapters;     /* bkv_sched_config.max_adapters; 0 = no
				      cap (every adapter, at most
				      BKV_MAX_ADAPTERS) */
	uint32_t adapter_wait_us;  /* bkv_sched_config.adapter_wait_us; 0 =
				      auto */
	/* multimodal: encoder inputs (--mm-images, mm.c) */
	uint32_t mm_images;        /* distinct images the requests carry,
				      drawn by popularity (0: no encoder
				      inputs) */
	double mm_zipf;            /* popularity: image rank k drawn with
				      weight k^-mm_zipf (default 1; 0 =
				      uniform) */
	uint32_t mm_per_request;   /* images per request, at most (each
				      request carries 1..mm_per_request,
				      uniform, fewer when its prompt is
				      short; default 1) */
	uint32_t mm_tokens;        /* prompt positions (encoder outputs) per
				      image (default 576: LLaVA-1.5's
				      24 x 24 patches) */
	double mm_encode_us;       /* the virtual host's encoder time per
				      image token, us (default 10; mm.c) */
	uint32_t encoder_budget;   /* bkv_sched_config.encoder_budget (image
				      tokens per step); 0 = no bound */
	uint32_t encoder_cache;    /* bkv_sched_config.encoder_cache (tokens);
				      0 = 8 x mm_per_request x mm_tokens */
	/* an external KV tier through the KV connector (--ext-tier, ext.c) */
	double ext_gbps;           /* its link's bandwidth each way, GB/s;
				      0 = no tier */
	double ext_latency_us;     /* per transfer, us, after its bytes */
	uint32_t ext_blocks;       /* entries it holds (one per group block
				      or state unit; LRU), >= 1 */
	int ext_warm;              /* it starts with every prompt's blocks
				      (filled by other engines), else
				      empty */
} sim_config;

/* One run's outcome. Times in microseconds of virtual time. */
typedef struct sim_result {
	char label[48];            /* e.g. "k=4", "static" */
	uint32_t n_req;            /* requests in the trace */
	uint32_t finished;         /* requests that ended (all reasons) */
	uint32_t errors;           /* requests that ended with an error/abort */
	double makespan_us;        /* first arrival to last finish */
	double prefill_us;         /* time in prefill calls (and the prefill
				      part of mixed calls, priced separately) */
	double decode_us;          /* time in decode calls (and the rest) */
	uint64_t prefill_calls;    /* host calls carrying prefill */
	uint64_t decode_steps;     /* host calls carrying decode rows */
	uint64_t steps;            /* bkv_step calls that did work */
	uint64_t prefill_tokens;   /* prompt tokens computed */
	uint64_t decode_tokens;    /* tokens delivered by decode rows (the
				      scheduler's bkv_sched_stats count) */
	uint64_t out_tokens;       /* tokens delivered through on_token */
	uint64_t hit_tokens;       /* prompt tokens served by the prefix cache */
	uint64_t dup_tokens;       /* tokens of blocks computed twice in one
				      step (bkv_pool_stats.dup_blocks) */
	uint64_t prompt_tokens;    /* prompt tokens submitted */
	uint64_t state_ckpt_bytes; /* a STATE group's checkpoints held at the
				      end, in bytes (units x frames x frame
				      bytes; 0 without one) */
	uint64_t state_hits;       /* prefix hits that read a checkpoint */
	uint64_t preemptions;      /* scheduler preemptions */
	uint64_t host_hit_tokens;  /* of hit_tokens, those reloaded from the
				      host cache (bkv_pool_stats
				      .host_hit_blocks x block_tokens) */
	uint64_t host_demoted;     /* blocks the device demoted to the host */
	double link_us;            /* time the host link spent on swap copies
				      (added to prefill_us + decode_us, or
				      with copy_overlap only where it
				      outlasts the call's compute) */
	double kv_waste;           /* mean over steps of waste slots / used
				      slots in the pool */
	double ttft_mean, ttft_p50, ttft_p99; /* ms */
	double tpot_mean, tpot_p50, tpot_p99; /* ms */
	double tbt_p99;            /* ms: p99 over every gap between two
				      consecutive tokens of a request (each
				      token timed at the end of its step) */
	double tput_tok_s;         /* generated tokens per virtual second */
	double flops;              /* roofline FLOPs of all calls */
	double bytes;              /* roofline bytes of all calls */
	double mfu, mbu;           /* predicted utilisations (roofline only) */
	double pred_err;           /* |scheduler prediction - host time| /
				      host time per step: the maximum when the
				      model is given; with calibrate, the mean
				      over steps after the first
				      SIM_CALIB_WARMUP */
	double wall_s;             /* real seconds the run took */
	double ref_ttft_mean;      /* measured (DistServe) mean TTFT, ms; <0 none */
	double ref_tpot_mean;      /* measured mean TPOT, ms; <0 none */
	double ttft_p90, tpot_p90; /* ms (TPOT over requests of > 1 token) */
	double ref_ttft_p90;       /* measured p90 TTFT, ms; <0 none */
	double ref_tpot_p90;       /* measured p90 TPOT, ms; <0 none */
	double span_us;            /* first to last arrival of the trace */
	uint64_t spec_drafted;     /* draft tokens verified */
	uint64_t spec_accepted;    /* of which accepted */
	uint64_t spec_rows;        /* decode rows that carried drafts */
	double spec_blocks_row;    /* mean over decode steps of the blocks the
				      steps' drafts held past their rows'
				      committed tokens, per running row */
	double spec_reserve_row;   /* the same for reserving spec_k slots for
				      every running row (vLLM's rule) */
	uint32_t slo_met;          /* requests that finished without error with
				      TTFT <= slo_ttft_ms and TPOT <=
				      slo_tpot_ms (0 when no target is set) */
	uint32_t ref_slo_met;      /* requests whose measured (DistServe) TTFT
				      and TPOT meet the same targets (0 when
				      no target is set or nothing measured) */
	uint64_t overlap_steps;    /* --overlap: steps planned while one ran */
	uint64_t overlap_syncs;    /* launches declined (BKV_EAGAIN) */
	uint64_t overlap_wasted;   /* tokens computed and discarded (requests
				      that ended in the step before) */
	uint64_t overlap_placeholders; /* placeholders the host resolved
				      (each checked: the sequence's token
				      one position back) */
	uint64_t overlap_far_placeholders; /* of which named a step launched
				      before the previous one (back >= 2) */
	double device_busy_us;     /* --overlap: time the device computed */
	uint32_t host_model;       /* the run modelled host time
				      (--host-overhead-us or --overlap): the
				      table adds a line per row */
	uint32_t host_overhead_us; /* its host time per step */
	/* adapters (--adapters; all 0 without) */
	uint32_t adapters;         /* distinct adapters the requests used */
	uint32_t adapter_cap;      /* the scheduler's max_adapters */
	uint32_t adapters_call_max; /* most adapters of one host call
				      (bkv_batch.n_adapters; <= adapter_cap) */
	double adapters_call_mean; /* mean adapters per host call with rows */
	uint64_t adapter_bad_calls; /* calls whose adapters broke the contract
				      (over the cap, a row's adapter not its
				      request's or not listed): 0 */
	double wait_p99_ms;        /* p99 queue wait: arrival to the start of
				      the first host call carrying a row of
				      the request, ms */
	double wait_p99_hot_ms;    /* ... of the requests of the hot quarter
				      of the adapters (popularity ranks
				      1..ceil(N/4)) */
	double wait_p99_cold_ms;   /* ... of the cold half (ranks > N/2) */
	double wait_max_ms;        /* the longest queue wait, ms */
	uint32_t n_hot, n_cold;    /* requests in those two groups */
	/* encoder inputs (--mm-images; all 0 without) */
	uint32_t mm_cache;         /* the scheduler's encoder_cache, tokens
				      (nonzero: the run had images) */
	uint32_t mm_budget;        /* its encoder_budget (0: no bound) */
	uint64_t mm_inputs;        /* images the submitted requests carried */
	uint64_t mm_encodes;       /* encoder runs (bkv_batch.encode entries) */
	double mm_hit_rate;        /* 1 - encodes / inputs: the share of
				      images served without an encoder run
				      (encoder cache or prefix cache hits) */
	double mm_encode_us;       /* virtual encoder time, us */
	uint64_t mm_step_cost_max; /* most encoder cost of one step (<=
				      mm_budget when bounded) */
	uint64_t mm_held_max;      /* most tokens the host's encoder cache
				      held (<= mm_cache) */
	uint64_t mm_bad;           /* contract breaks: a row read an image
				      the host did not hold, an encode named
				      another input, a step over the budget
				      or the cache over its capacity: 0 */
	/* the external tier (--ext-tier; all 0 without) */
	uint32_t ext_on;           /* the run had one */
	uint64_t kv_lookups;       /* bkv_sched_stats' kv_* counters */
	uint64_t kv_loads;
	uint64_t kv_load_tokens;   /* prompt tokens loaded, not computed */
	uint64_t kv_load_failed;   /* blocks whose load failed (recomputed) */
	uint64_t kv_saved;         /* blocks saved */
	uint64_t kv_save_failed;
	double ext_wait_ms;        /* sum over loads of start to completion:
				      request time spent waiting for KV */
	double ext_wait_mean_ms;   /* per load */
	double ext_wait_max_ms;    /* the longest load */
	double ext_load_gb, ext_save_gb; /* bytes moved each way, 1e9 */
	uint64_t ext_held;         /* entries the store held at the end */
	uint64_t ext_evicted;      /* entries its capacity evicted */
	uint64_t ext_bad;          /* completions the library refused or the
				      host could not hold: 0 */
} sim_result;

/* The default cap on generated tokens (sim_config.max_tokens), and the
 * token id that ends a request at its trace length (the host's made-up
 * tokens are 100 and above). */
#define SIM_MAX_TOKENS 4096u
#define SIM_STOP_TOKEN 2

/* Most blocks sim_run derives for a pool when kv_blocks is 0. */
#define SIM_MAX_DERIVED_BLOCKS (1u << 22)

/* Steps a calibrated scheduler model may learn before its error counts. */
#define SIM_CALIB_WARMUP 200

/* Run one trace through the real scheduler on a virtual clock. Returns 0, or
 * a negative bkv_status / -100 (the scheduler stalled) with a message in err. */
/* Seed 000's setup: continuous k = 1 on a split host, budget 512, 32 slots,
 * 16-token blocks, prefix cache on, seed 000's polynomial given to the
 * scheduler, requests sent with a SIM_MAX_TOKENS cap and a stop token (no
 * oracle); the rest zero. Every caller starts from it. */
void sim_config_init(sim_config *c);

int sim_run(const sim_config *cfg, const trace *t, sim_result *res, char *err, size_t errlen);

/* The host's price of one call under cfg's cost model, us. */
double sim_price_us(const sim_config *cfg, const bkv_step_shape *s);

/* The DistServe latency model (see ../shared/data/traces/README.md) as a cost
 * model; ctx unused. */
bkv_cost_model sim_distserve_model(void);
double sim_distserve_step_us(const bkv_step_shape *shape);

/* ---- adapters (adapters.c) ------------------------------------------------
 * Each request's adapter (Zipf-like popularity, ids = ranks), the count of
 * every call's adapters and each request's queue wait, for a run with
 * cfg->adapters. */
typedef struct sim_adapters sim_adapters;
/* The scheduler's max_adapters for cfg (0 without adapters). */
uint32_t sim_adapters_cap(const sim_config *cfg);
/* Draw t's requests' adapters into *out (NULL without cfg->adapters).
 * 0, or -1 out of memory. */
int sim_adapters_open(const sim_config *cfg, const trace *t, sim_adapters **out);
void sim_adapters_close(sim_adapters *a);
/* Request i's adapter (0 with a NULL). */
uint32_t sim_adapter_of(const sim_adapters *a, uint32_t i);
/* A host call starting at start_us (its rows' row_user are request index
 * + 1). NULL a: nothing. */
void sim_adapters_call(sim_adapters *a, const bkv_batch *b, double start_us);
/* The adapter fields of res. NULL a: nothing. */
void sim_adapters_collect(const sim_adapters *a, const trace *t, sim_result *res);

/* ---- encoder inputs (mm.c) ------------------------------------------------
 * Each request's images (Zipf-like popularity, spans spread over the
 * prompt), the virtual host's encoder cache and encoder time, for a run
 * with cfg->mm_images. */
typedef struct sim_mm sim_mm;
/* The scheduler's encoder_cache for cfg (0 without images). */
uint32_t sim_mm_cache(const sim_config *cfg);
/* Draw t's requests' images into *out (NULL without cfg->mm_images).
 * 0, or -1 out of memory. */
int sim_mm_open(const sim_config *cfg, const trace *t, sim_mm **out);
void sim_mm_close(sim_mm *m);
/* Request i's inputs and their count (NULL and 0 with a NULL m). */
const bkv_encoder_input *sim_mm_inputs(const sim_mm *m, uint32_t i, uint32_t *n);
/* Request i was submitted under scheduler id id (its images count). */
void sim_mm_submitted(sim_mm *m, uint32_t i, uint64_t id);
/* A step starts (its encoder cost counts from 0). */
void sim_mm_step_begin(sim_mm *m);
/* A host call: drop its encoder_free ids, run its encodes, check its rows'
 * span reads (row_user = request index + 1). Returns the encoder time the
 * call adds, us (0 with a NULL m). */
double sim_mm_call(sim_mm *m, const bkv_batch *b);
/* The mm fields of res. NULL m: nothing. */
void sim_mm_collect(const sim_mm *m, sim_result *res);

/* ---- the external KV tier (ext.c) -----------------------------------------
 * A simulated store behind bkv_connector for a run with cfg->ext_gbps > 0:
 * an LRU index of block hashes, loads and saves completed on the virtual
 * clock. */
typedef struct sim_ext sim_ext;
/* The store for cfg into *out (NULL without a tier); clock is the virtual
 * clock the transfers are timed by. With cfg->ext_warm it holds every
 * prompt of t (hashed with hash_seed and each request's adapter key).
 * 0, or -1 out of memory. */
int sim_ext_open(const sim_config *cfg, const trace *t, uint64_t hash_seed,
		 const sim_adapters *ad, const double *clock, sim_ext **out);
void sim_ext_close(sim_ext *e);
/* The connector to hand the scheduler (bkv_sched_config.connector). */
void sim_ext_connector(sim_ext *e, bkv_connector *c);
/* The scheduler that completes the transfers (NULL e: nothing). */
void sim_ext_attach(sim_ext *e, bkv_sched *s);
/* Complete every transfer that ends at or before now_us, in time order
 * (bkv_kv_xfer_done). Returns how many (0 with a NULL e). */
uint32_t sim_ext_poll(sim_ext *e, double now_us);
/* When the next transfer completes, us (INFINITY: none, or a NULL e). */
double sim_ext_next_us(const sim_ext *e);
/* Transfers in flight (0 with a NULL e). */
uint32_t sim_ext_in_flight(const sim_ext *e);
/* The ext fields of res, from the store and the scheduler's stats. NULL
 * e: nothing. */
void sim_ext_collect(const sim_ext *e, const bkv_sched_stats *ss, sim_result *res);

/* ---- reports ------------------------------------------------------------- */

/* Median, over seeds, of every metric; speed-up relative to base (the
 * static run of the same seed) is computed per seed then taken the median. */
typedef struct sim_row {
	sim_result med;   /* field-wise medians */
	double speedup;   /* median over seeds of base makespan / makespan */
	double speedup_q1, speedup_q3; /* quartiles */
	double prefill_share; /* median over seeds of prefill time / busy time */
	int wins;         /* seeds where it beat the base */
	int n_seeds;      /* seeds aggregated */
	int has_base;     /* speedup is meaningful */
	int has_goodput;  /* goodput_rps was searched (--goodput) */
	double goodput_rps; /* highest rate meeting the targets, req/s (0:
			       not even at the lowest rate tried) */
	int goodput_capped; /* 1: still met at the highest rate tried (a
			       lower bound), -1: not met at the lowest */
} sim_row;

void sim_rows_from_runs(sim_row *row, const sim_result *runs, const sim_result *base, int n);

typedef enum sim_format { SIM_TABLE = 0, SIM_JSON = 1, SIM_CSV = 2 } sim_format;

/* The table, JSON or CSV. title (table only; NULL: none) heads the table and
 * a legend of its columns follows it. */
void sim_report(FILE *out, sim_format fmt, const sim_row *rows, int n, int roofline,
		const char *title);
/* Warnings after a report, on err: rows whose requests failed (returns how
 * many such rows), and a trace the simulated machine cannot keep up with
 * (a makespan more than SIM_OVERLOAD times the arrival span). */
int sim_warn_errors(FILE *err, const sim_row *rows, int n);
#define SIM_OVERLOAD 1.5
void sim_note_overload(FILE *out, const sim_row *rows, int n);

/* ---- peer presets ----------------------------------------------------------
 * Other engines' default scheduling in the scheduler's knobs (bkv-sim
 * --compare --peers; docs/benchmarks.md, "Peer presets" has each source and
 * what the knobs cannot express). Labels, in order: vllm-v1, vllm-v0,
 * sglang, sarathi, tgi, llamacpp, orca (read by tests outside the project:
 * never rename). */
#define SIM_N_PEERS 7
extern const char *const sim_peer_names[SIM_N_PEERS];
/* Preset which (0..SIM_N_PEERS-1) on c0's machine into c: its cost model and
 * pool (pool_slots = c0->slots), at most c0->slots running rows. t (the
 * first trace) sizes TGI's wait and Orca's reservation; big_gpu: vLLM's
 * H100-class defaults; tpot_target_ms > 0: Sarathi's TBT target (else
 * c0->tpot_us, else a fixed 512-token budget). */
void sim_peer_config(int which, const sim_config *c0, const trace *t, int big_gpu,
		     double tpot_target_ms, sim_config *c);

/* ---- goodput ------------------------------------------------------------
 * The highest arrival rate at which pct% of all requests (pooled over the
 * traces) finish without error with TTFT <= ttft_ms and TPOT <= tpot_ms
 * (DistServe's definition). Arrivals are scaled: at rate r every arrival
 * time a_i becomes a_0 + (a_i - a_0) * rate0 / r, rate0 being the traces'
 * own rate (a synthetic workload's --arrival rate, a file's (n - 1) / span);
 * a Poisson or uniform workload scaled so is exactly that workload drawn at
 * rate r. The search doubles or halves from rate0 until one rate meets the
 * targets and another does not (at most 2^20 either way), then bisects
 * until the two are within 1% (hi <= 1.01 lo). The traces' arrivals are
 * restored before it returns. */
#define SIM_GOODPUT_POINTS 64
/* One rate the search simulated: medians over traces of the p99s. */
typedef struct sim_goodput_point {
	double rps, ttft_p99_ms, tpot_p99_ms, attain;
} sim_goodput_point;

typedef struct sim_goodput {
	double rps;        /* the highest rate found meeting the targets (0:
			      none) */
	double hi_rps;     /* the lowest rate found failing them (0: none) */
	double attain;     /* share meeting the targets at rps */
	int capped;        /* 1: met at the highest rate tried; -1: not met at
			      the lowest; 0: bracketed to 1% */
	int evals;         /* rates simulated */
	sim_goodput_point pt[SIM_GOODPUT_POINTS]; /* [min(evals, 64)] in the
				      order simulated */
} sim_goodput;

/* Chart of p99 TTFT and p99 TPOT against rate (log-log), one line per row
 * (labels[i], g[i]), the targets dashed and each goodput marked. 0 or -1. */
int sim_goodput_svg(const char *path, const char *title, const char *const *labels,
		    const sim_goodput *g, int n, double ttft_ms, double tpot_ms, double pct);

/* The share of requests meeting the targets over n traces at their
 * current arrivals, into *attain. 0 or a sim_run error. */
int sim_attainment(const sim_config *cfg, const trace *t, int n, double ttft_ms,
		   double tpot_ms, double *attain, char *err, size_t errlen);
/* The same, also giving the medians over traces of p99 TTFT and TPOT (ms;
 * either pointer may be NULL). */
int sim_attainment_p99(const sim_config *cfg, const trace *t, int n, double ttft_ms,
		       double tpot_ms, double *attain, double *ttft_p99, double *tpot_p99,
		       char *err, size_t errlen);
int sim_goodput_search(const sim_config *cfg, trace *t, int n, double rate0, double ttft_ms,
		       double tpot_ms, double pct, sim_goodput *out, char *err, size_t errlen);
/* A trace's own arrival rate, (n - 1) / span in req/s; 0 when the span is 0. */
double sim_trace_rate(const trace *t);

/* Arrivals recorded in time buckets (Mooncake's come in 3 s buckets): many
 * requests share one timestamp, so rescaling the rate never separates
 * them and every bucket stays a burst at any rate. */
typedef struct sim_buckets {
	uint32_t shared;   /* requests arriving at the same time as another */
	uint32_t times;    /* distinct arrival times */
	uint32_t largest;  /* most requests sharing one time */
	double width_us;   /* the bucket: the median gap between consecutive
			      distinct times, us (0 with one time) */
} sim_buckets;
/* Count t's shared arrival times into *b. Returns 1 when the arrivals are
 * bucketed (at least 4 requests, at least half of them sharing their time
 * with another, more than one distinct time), else 0. */
int sim_trace_buckets(const trace *t, sim_buckets *b);
/* Spread each run of k requests sharing a time a over its bucket: request
 * j of the run (file order kept) arrives at a + w (j + u_j) / k, w the
 * bucket's width or the gap to the next distinct time when shorter, u_j
 * uniform in [0, 1) drawn from seed and the request's index (splitmix64):
 * the same seed gives the same arrivals. */
void sim_trace_spread(trace *t, const sim_buckets *b, uint64_t seed);
int sim_svg(const char *path, const sim_row *rows, int n, const char *title);
double sim_median(double *v, int n);
double sim_quantile(double *v, int n, double q);

#endif /* BKV_SIM_H */
