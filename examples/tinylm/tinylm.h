/*
 * tinylm.h - the pieces of the tinylm example around the model: the reference
 * mode (ref.c), the paged host that serves libbatchkv batches (paged.c) and the
 * workload driver shared by the demo, the threaded variant and the test
 * (serve.c), and encoder inputs (encoder.c).
 */
#ifndef TINYLM_H
#define TINYLM_H

#include "batchkv.h"
#include "model.h"

/* ------------------------------------------------------------------------ */
/* encoder.c                                                                 */
/* ------------------------------------------------------------------------ */

#define TLM_MAX_INPUTS 4u /* most encoder inputs of a job */

/* A request's encoder inputs (images): the spans as submitted
 * (bkv_request.inputs) and the content each one's encoder reads. */
typedef struct tlm_inputs {
	uint32_t n;                           /* inputs, 0..TLM_MAX_INPUTS */
	bkv_encoder_input in[TLM_MAX_INPUTS]; /* [n] spans, ordered; cache_id =
						 tlm_image_cache_id(image) */
	uint64_t image[TLM_MAX_INPUTS];       /* [n] each input's image (its
						 content, what the encoder
						 reads) */
} tlm_inputs;

/* The cache id of an image (a hash of its content; nonzero, distinct
 * for distinct images). */
uint64_t tlm_image_cache_id(uint64_t image);
/* The positions an image's encoder outputs fill (6 for even images, 10 for
 * odd ones: a function of the image alone, so equal cache ids have equal
 * token_len, and many images share a length). */
uint32_t tlm_image_tokens(uint64_t image);
/* The encoder: output i of an image, an embedding row out[dim] (unit
 * variance like the token embeddings, drawn from a hash of cfg.seed, the
 * image, i and the element). */
void tlm_encoder_output(const tlm_model *m, uint64_t image, uint32_t i, float *out);
/* The input whose span holds prompt position pos: its index, or -1 (none,
 * or in is NULL). */
int tlm_inputs_find(const tlm_inputs *in, uint32_t pos);
/* The reference's embedding of spans: rows x[n][dim] at positions start..
 * start + n - 1 that fall in an input's span get its encoder output there
 * (computed now from the image). in may be NULL. */
void tlm_inputs_embed(const tlm_model *m, const tlm_inputs *in, uint32_t start, uint32_t n,
		      float *x);

/* The paged host's encoder cache: outputs by cache id, held between calls
 * (bkv_batch.encode adds, encoder_free drops). */
typedef struct tlm_enc_cache tlm_enc_cache;
tlm_enc_cache *tlm_enc_cache_create(uint32_t dim);
void tlm_enc_cache_destroy(tlm_enc_cache *c);
/* Drop id's outputs; returns the tokens dropped (0: not held). */
uint32_t tlm_enc_cache_drop(tlm_enc_cache *c, uint64_t id);
/* Room for id's len output rows (replacing what id held), for the caller to
 * fill; NULL when out of memory. *replaced: id was held. */
float *tlm_enc_cache_put(tlm_enc_cache *c, uint64_t id, uint32_t len, int *replaced);
/* id's outputs and their count, or NULL when not held. */
const float *tlm_enc_cache_get(const tlm_enc_cache *c, uint64_t id, uint32_t *len);
/* Tokens held (the sum of the held outputs' lengths). */
uint64_t tlm_enc_cache_tokens(const tlm_enc_cache *c);

/* ------------------------------------------------------------------------ */
/* ref.c                                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Generate for one request alone over a contiguous KV cache. Each branch b
 * (0..n_samples-1) writes its tokens at out[b * max_new ...] and its count at
 * out_len[b]; generation stops after max_new tokens or after (and including)
 * a stop token. seed names the request for tlm_sample.
 * Returns 0, or -1 on bad arguments or out of memory.
 */
int tlm_ref_generate(const tlm_model *m, const int32_t *prompt, uint32_t prompt_len,
		     uint32_t max_new, const int32_t *stop, uint32_t n_stop, uint32_t n_samples,
		     uint64_t seed, int32_t *out, uint32_t *out_len);
/* tlm_ref_generate with an adapter (0: the base model, as tlm_ref_generate). */
int tlm_ref_generate_adapter(const tlm_model *m, uint32_t adapter, const int32_t *prompt,
			     uint32_t prompt_len, uint32_t max_new, const int32_t *stop,
			     uint32_t n_stop, uint32_t n_samples, uint64_t seed, int32_t *out,
			     uint32_t *out_len);
/* ... and with encoder inputs (NULL: none): the prompt positions in their
 * spans embed the encoder's outputs (tlm_inputs_embed), not the tokens. */
int tlm_ref_generate_mm(const tlm_model *m, uint32_t adapter, const tlm_inputs *in,
			const int32_t *prompt, uint32_t prompt_len, uint32_t max_new,
			const int32_t *stop, uint32_t n_stop, uint32_t n_samples, uint64_t seed,
			int32_t *out, uint32_t *out_len);

/* ------------------------------------------------------------------------ */
/* paged.c                                                                   */
/* ------------------------------------------------------------------------ */

/* What the paged host needs to know of a request to sample it. Every request
 * served by a tlm_host must have a user pointer whose target starts with this
 * struct. */
typedef struct tlm_sampling {
	uint64_t seed;      /* names the request for tlm_sample; stable across runs */
	uint32_t n_samples; /* the request's n */
	const tlm_inputs *inputs; /* its encoder inputs (NULL: none): the host
				     embeds their spans' positions from its
				     encoder cache */
} tlm_sampling;

/* Counters of a paged host, all cumulative. */
typedef struct tlm_host_stats {
	uint64_t state_rows;     /* rows a recurrent layer computed (per layer) */
	uint64_t calls[3];      /* host calls by bkv_call_kind */
	uint64_t rows;          /* rows computed */
	uint64_t tokens;        /* tokens computed (K/V written) */
	uint64_t sampled;       /* rows that sampled a token */
	uint64_t copies;        /* device->device block copies performed */
	uint64_t swap_out;      /* device->host block copies performed */
	uint64_t swap_in;       /* host->device block copies performed */
	uint64_t violations;    /* batches that broke the batch contract */
	uint64_t deltas;        /* persistent layout: table deltas applied */
	uint64_t delta_entries; /* ... block ids they wrote */
	uint64_t mirror_rows;   /* ... rows whose mirrored table was compared
				   with the library's row_tables */
	uint64_t mirror_mismatches; /* ... of those, rows whose tables differ
				   (0 unless the host or library is wrong) */
	double compute_us;      /* time in compute callbacks (host clock) */
	uint64_t spec_rows;     /* speculative decoding: rows with drafts */
	uint64_t spec_tokens;   /* ... tokens sampled at their positions */
	uint64_t adapter_rows;  /* rows computed with an adapter (!= 0) */
	uint32_t max_adapters;  /* most adapters (bkv_batch.n_adapters) of one
				   call */
	uint64_t encodes;       /* encoder inputs run (bkv_batch.encode) */
	uint64_t encode_tokens; /* ... their output positions */
	uint64_t reencodes;     /* ... of ids the host still held (a rolled
				   back step's encodings come again) */
	uint64_t encodes_off_rows; /* ... whose request had no row in the call
				   (encoded for a row the step then did not
				   run) */
	uint64_t enc_frees;     /* held ids dropped by encoder_free */
	uint64_t enc_reads;     /* span positions embedded from the cache */
	uint64_t enc_max_held;  /* most tokens the encoder cache held */
	uint64_t enc_max_step_cost; /* most encoder cost (bkv_encoder_input.
				   cost, 0 = token_len) in one step (between
				   tlm_host_step_begin calls; without them,
				   in one call) */
} tlm_host_stats;

/* The paged host: the model, one preallocated device KV tensor of blocks, a
 * host-tier tensor for swap, and scratch that grows to the largest batch. */
typedef struct tlm_host tlm_host;

/* Create a host for a pool of device_blocks (and host_blocks) blocks of
 * block_tokens tokens. Returns NULL on bad arguments or out of memory. */
tlm_host *tlm_host_create(const tlm_model *m, uint32_t block_tokens, uint32_t device_blocks,
			  uint32_t host_blocks);
void tlm_host_destroy(tlm_host *h);

/* The compute callbacks (host = a tlm_host *), for bkv_host_ops. forward
 * takes any batch; prefill and decode insist on their kind. Both batch
 * layouts are served: in the persistent one each callback first applies the
 * batch's table_deltas to the host's own per-slot tables (whatever the call
 * then returns) and reads the rows' tables from them. Each performs the
 * batch's swap_out, swap_in and copies, in that order, then computes every row
 * and samples the rows marked in row_sample. A batch that breaks the contract
 * (ranges, positions inconsistent with the block tables, a decode row with
 * more than one token, ...) is counted in violations, described in
 * tlm_host_last_error and answered with -1. */
int tlm_host_forward(void *host, const bkv_batch *batch, int32_t *next_tokens);
int tlm_host_prefill(void *host, const bkv_batch *batch, int32_t *next_tokens);
int tlm_host_decode(void *host, const bkv_batch *batch, int32_t *next_tokens);

void tlm_host_stats_get(const tlm_host *h, tlm_host_stats *out);
/* A step starts (its encoder cost counts from 0); once called, the step's
 * cost spans its calls. */
void tlm_host_step_begin(tlm_host *h);
/* Drop the batch's encoder_free ids (every callback does first; a device
 * that skips a call calls this instead, as the contract says the host drops
 * them whatever the call returns). */
void tlm_host_encoder_free(tlm_host *h, const bkv_batch *b);
const char *tlm_host_last_error(const tlm_host *h);

/* Make the next compute callback fail, for tests of the scheduler's
 * rollback: late == 0 returns -1 before touching anything but the persistent
 * layout's mirror (the deltas are applied first); late != 0 performs
 * the copies and computes (writing K/V into the batch's slots) and then
 * returns -1 without sampling. */
void tlm_host_fail_next(tlm_host *h, int late);
/* Disarm it (a step with no compute call never consumed it). */
void tlm_host_fail_next_clear(tlm_host *h);

/* Direct access for the self-test: the K (kv = 0) or V (kv = 1) row of a slot
 * in the device tensor. */
float *tlm_host_kv_row(tlm_host *h, uint32_t layer, int32_t block, uint32_t offset, int kv);

/* ------------------------------------------------------------------------ */
/* serve.c                                                                   */
/* ------------------------------------------------------------------------ */

/* One request of a workload and, after a run, what it produced. */
typedef struct tlm_job {
	tlm_sampling sampling; /* first: the request's user pointer is the job */
	int32_t *prompt;       /* [prompt_len], in the workload's token store */
	uint32_t prompt_len;   /* tokens, >= 1 */
	uint32_t max_new;      /* max_new_tokens, >= 1 */
	int32_t stop;          /* one stop token, or -1 for none */
	uint32_t abort_after;  /* abort once this many tokens arrived over all
				  branches; 0 = never */
	int32_t *ref;          /* reference output [n_samples][max_new] */
	uint32_t *ref_len;     /* [n_samples] tokens of each reference branch */
	int32_t *got;          /* served output [n_samples][max_new] (on_token) */
	uint32_t *got_len;     /* [n_samples] tokens received per branch */
	uint32_t got_total;    /* tokens received, all branches */
	int finished;          /* on_finish calls seen */
	bkv_finish_reason reason;
	uint64_t req_id;       /* from bkv_submit */
	int abort_sent;        /* bkv_abort was called */
	uint32_t bad_tokens;   /* on_token calls out of range (branch, count) */
	uint64_t submit_us;    /* tlm_now_us at bkv_submit */
	uint64_t first_us;     /* at the first token (0: none yet) */
	uint64_t done_us;      /* at on_finish */
	uint32_t adapter;      /* its adapter (bkv_request.adapter; 0: the base
				  model), applied by the reference too */
	tlm_inputs inputs;     /* its encoder inputs (sampling.inputs points
				  here when it has some) */
} tlm_job;

typedef struct tlm_workload {
	uint32_t n_jobs;       /* entries in jobs */
	tlm_job *jobs;         /* [n_jobs], owned */
	int32_t *tokens;       /* backing store of all prompts (jobs point in) */
} tlm_workload;

/* Workload knobs. */
typedef struct tlm_workload_config {
	uint32_t n_jobs;        /* requests */
	uint32_t n_system;      /* distinct shared system prompts */
	uint32_t system_len;    /* tokens per system prompt */
	uint32_t user_min;      /* per-request suffix length, lowest */
	uint32_t user_max;      /* ... highest (one in twenty jobs instead has
				   no system prompt and 1..3 tokens) */
	uint32_t new_min;       /* max_new_tokens, lowest (>= 1) */
	uint32_t new_max;       /* ... highest */
	uint32_t pct_fork;      /* percent of requests with n > 1 (n = 2..3) */
	uint32_t pct_abort;     /* percent of requests aborted mid-way */
	uint32_t pct_stop;      /* percent of requests with a stop token */
	uint64_t seed;          /* everything above is drawn from it */
	uint32_t n_adapters;    /* 0: every job runs the base model; else each
				   job's adapter is uniform in 0..n_adapters
				   (0: the base model), drawn from a stream of
				   its own so the rest of the workload is the
				   same as without */
	uint32_t n_images;      /* 0: no encoder inputs; else jobs carry 0..3
				   images of 0..n_images-1 (encoder.c's
				   tlm_workload_inputs), from a stream of
				   their own */
} tlm_workload_config;

void tlm_workload_config_default(tlm_workload_config *wc);
/* Build the jobs (deterministic in wc->seed). Returns 0 or -1. */
int tlm_workload_create(tlm_workload *w, const tlm_workload_config *wc, uint32_t vocab);
void tlm_workload_destroy(tlm_workload *w);
/* Speculative decoding's draft model (spec.c): up to k tokens that follow
 * ctx[0, n_ctx) in branch `branch` of a request sampled as tlm_sample does
 * (n_samples, seed), from m cut to its first `layers` layers, with the
 * request's adapter and encoder inputs (NULL: none). Returns the
 * drafts written to out, 0 when there are none (context too long, out of
 * memory). */
uint32_t tlm_draft_generate(const tlm_model *m, uint32_t layers, const int32_t *ctx,
			    uint32_t n_ctx, uint32_t k, uint32_t n_samples, uint64_t seed,
			    uint32_t branch, uint32_t adapter, const tlm_inputs *in,
			    int32_t *out);
/* Draw the jobs' encoder inputs (wc->n_images > 0; encoder.c). */
void tlm_workload_inputs(tlm_workload *w, const tlm_workload_config *wc);

/* Fill every job's reference output with tlm_ref_generate. */
int tlm_workload_reference(tlm_workload *w, const tlm_model *m);
/* Clear the served outputs before a run. */
void tlm_workload_reset(tlm_workload *w);

/* One serving run's settings. */
typedef struct tlm_run_config {
	bkv_sched_config sched;  /* policy, k, chunking, preemption, ...;
				    sched.overlap = N != 0: overlapped
				    scheduling, the steps launched to a
				    device thread (overlap.c) and completed
				    up to N steps behind (split must be 0;
				    fail_every makes the device fail the
				    launched step) */
	uint32_t block_tokens;   /* pool and host block size */
	uint32_t device_blocks;  /* device tier: the pool and the KV tensor
				    (a recurrent model's state arena comes
				    on top: state_units) */
	uint32_t host_blocks;    /* host (swap) tier; 0 = none */
	uint32_t host_cache;     /* 1: the host tier also keeps evicted
				    prefix-cache blocks
				    (bkv_pool_config.host_cache) */
	int split;               /* 1: prefill/decode callbacks; 0: forward */
	uint32_t submit_per_step; /* jobs submitted before each step (0 = all
				     up front) */
	uint32_t fail_every;     /* nonzero: make the host fail once every this
				    many steps (the step is rolled back and
				    retried); overlapped, the launched step
				    and the ones launched after it fail */
	uint64_t max_steps;      /* give up (-100, "stuck") after this many
				    steps; 0 = 200000 */
	uint32_t state_units;    /* a recurrent model's state units (0: four per
				    running row and 32) */
	int state_share;         /* 1: a recurrent model's units share the
				    frames with attention (bkv_pool_config.
				    state_share): the frames are as many as
				    with the arena, state_units is the floor */
	uint32_t draft_layers;   /* speculative decoding with
				    sched.spec_drafts == BKV_SPEC_DRAFT_HOST:
				    the host's draft model is the served model
				    cut to its first draft_layers layers (same
				    weights; spec.c); 0 with library drafts */
} tlm_run_config;

/* What one run measured. */
typedef struct tlm_run_result {
	int status;              /* 0, or the first failing bkv_* status */
	uint64_t steps;          /* successful bkv_step calls */
	uint64_t failed_steps;   /* injected host failures (rolled back) */
	uint64_t multi_prefill_steps; /* successful steps with more than one
				    prefill call (a split host's packing) */
	double wall_us;          /* whole run */
	double measured_us;      /* sum of step_info.measured_us */
	double predicted_us;     /* sum of step_info.predicted_us */
	double abs_err_us;       /* sum |predicted - measured| over steps */
	uint64_t gen_tokens;     /* tokens delivered by on_token */
	double mean_ttft_us;     /* submit -> first token, requests not aborted */
	double mean_latency_us;  /* submit -> finish, requests not aborted */
	bkv_sched_stats sched;   /* the scheduler's counters at the end */
	bkv_pool_stats pool;     /* the pool's counters at the end */
	tlm_host_stats host;     /* the paged host's counters */
	uint64_t prompt_tokens;  /* prompt tokens submitted (incl. branches 0) */
	int check;               /* bkv_sched_check after the run (0 = ok) */
	uint64_t placeholders[BKV_OVERLAP_MAX_DEPTH]; /* overlapped:
				    placeholders the device replaced, by back
				    distance - 1 (BKV_TOKEN_PENDING_BACK) */
	uint32_t max_outstanding; /* overlapped: the most steps outstanding
				    (launched, not completed) at once; at
				    most sched.overlap + 1 */
	uint64_t failed_completions; /* overlapped (tlm_run): completions
				    answered BKV_EHOST, one per outstanding
				    step a failure rolled back */
	char host_error[256];    /* the paged host's last contract violation */
	char lib_error[256];     /* bkv_last_error() of a refused create or
				    submit (the field and the rule); "" else */
} tlm_run_result;

/* The pool of a run under rc for model m: rc's blocks and host tier, and a
 * hybrid's KV groups (one per kind of layer, written to groups, which
 * out->groups then points to) with a recurrent state's arena on top of
 * rc->device_blocks. */
void tlm_pool_config(const tlm_model *m, const tlm_run_config *rc,
		     bkv_kv_group groups[TLM_MAX_GROUPS], bkv_pool_config *out);

/* A run that did not finish within rc->max_steps steps. */
#define TLM_STUCK (-100)

/* Serve the workload under rc through bkv_step until nothing is pending.
 * Returns 0, or a negative bkv_status / TLM_STUCK. */
int tlm_run(tlm_workload *w, const tlm_model *m, const tlm_run_config *rc, tlm_run_result *res);

/* Compare served outputs with the reference. Returns the number of jobs that
 * differ (aborted jobs must be a prefix); describes the first one in msg. */
uint32_t tlm_workload_verify(const tlm_workload *w, char *msg, size_t msg_len);

/* Fill res->mean_ttft_us and mean_latency_us from the jobs' timestamps. */
void tlm_workload_latency(const tlm_workload *w, tlm_run_result *res);

/* Microseconds of a monotonic clock. */
uint64_t tlm_now_us(void);

#endif /* TINYLM_H */
