/*
 * fakehost_sched.h - the scheduler suites' harness around the fake host
 * (fakehost.h): one call creates a pool, a scheduler and a kh_host with the
 * KV cell model on, requests live in a table indexed by their id, and a run
 * loop steps until nothing is pending, asserting bkv_sched_check and the
 * host's violation count after every step. It uses Criterion's assertions
 * (setup failures end the test) and the public header only.
 *
 * What it adds to the host, all of it bookkeeping the tests read:
 *   - a log of the first FH_MAX_CALLS compute calls (kind, counts, the first
 *     rows, padded_rows from a fake cost model installed unless asked not to);
 *   - per request id: the tokens on_token reported, how often on_finish ran
 *     and with which reason;
 *   - aborts from inside callbacks (abort_on_token, abort_on_finish).
 * Its callbacks wrap the host's (kh_compute, kh_on_token, kh_on_finish), so
 * every check of fakehost.h runs on every call; the host's aborts_unrecorded
 * is set because the tests call bkv_abort on f->s themselves.
 *
 * Request ids: bkv_submit hands out 1, 2, 3, ... in submission order, so the
 * record of the next request is f->req[submitted + 1], submitted read from
 * bkv_sched_stats_get; fh_submit_ex asserts that the id it got names the
 * record it passed.
 */
#ifndef BKV_FAKEHOST_SCHED_H
#define BKV_FAKEHOST_SCHED_H

#include "fakehost.h"

#include <stdint.h>

#define FH_MAX_REQ 4096u  /* most requests one harness can submit */
#define FH_MAX_BRANCH 4u  /* branches the per-id token log keeps */
#define FH_MAX_TOK 160u   /* tokens the per-id token log keeps per branch */
#define FH_MAX_CALLS 8192u /* compute calls the call log keeps */
#define FH_STOP KH_STOP   /* the stop token every fh_submit request carries */

/* One logged compute call; the row fields describe its first 8 rows. */
typedef struct fh_call {
	bkv_call_kind kind;  /* the batch's kind */
	uint32_t n_rows;     /* rows in the batch */
	uint32_t n_decode;   /* of which decode rows */
	uint32_t n_tokens;   /* tokens in the batch */
	uint32_t n_copies;   /* device copies */
	uint32_t n_swap_out; /* swap-out copies */
	uint32_t n_swap_in;  /* swap-in copies */
	uint32_t padded_rows; /* what the step's last cost-model query padded to */
	uint64_t row_req[8];  /* request id of row r */
	uint32_t row_start[8]; /* first position of row r */
	uint32_t row_len[8];  /* tokens of row r */
	uint8_t row_sample[8]; /* row r samples */
} fh_call;

typedef struct fake_host {
	kh_host host;         /* the checking host; its knobs (fail_*, garbage,
				 tick, try_nested) and findings (violations,
				 first, now) are read and set by the tests */
	bkv_sched *s;         /* the scheduler (created by fh_create) */
	bkv_pool *pool;       /* its pool */
	kh_req req[FH_MAX_REQ + 1]; /* record of request id i; [0] unused */
	/* what the callbacks reported, by request id and branch */
	int32_t out[FH_MAX_REQ + 1][FH_MAX_BRANCH][FH_MAX_TOK]; /* tokens, first FH_MAX_TOK */
	uint32_t n_out[FH_MAX_REQ + 1][FH_MAX_BRANCH]; /* on_token calls */
	uint32_t finish_count[FH_MAX_REQ + 1]; /* on_finish calls */
	bkv_finish_reason reason[FH_MAX_REQ + 1]; /* the last finish reason */
	uint32_t finished_total; /* on_finish calls, all requests */
	fh_call calls[FH_MAX_CALLS]; /* the call log, calls[0..min(n_calls, cap)) */
	uint32_t n_calls;     /* compute calls, logged or not */
	uint32_t n_forward, n_prefill, n_decode; /* of which by callback */
	uint32_t max_call_tokens; /* largest n_tokens of any call */
	uint32_t last_padded; /* padded_rows of the last cost-model query */
	uint64_t abort_on_token;  /* on_token of this id aborts it (0: none) */
	uint64_t abort_on_finish; /* on_finish of any request aborts this id */
	int abort_rc;             /* what that bkv_abort answered */
	/* called with every compute call's batch before the host computes it
	 * (NULL: none); a test's extra checks, which count what they find in
	 * batch_bad */
	void (*batch_hook)(struct fake_host *f, const bkv_batch *b);
	uint32_t batch_bad;       /* what batch_hook found wrong */
} fake_host;

typedef struct fh_opts {
	uint32_t block_tokens;  /* pool block_tokens (default 16) */
	uint32_t device_blocks; /* pool device_blocks (default 1024) */
	uint32_t host_blocks;   /* pool host_blocks, the swap tier (default 0) */
	uint32_t max_seqs;      /* pool max_seqs (0: 4096) */
	int prefix_cache;       /* pool prefix_cache (default 1) */
	uint32_t pin_permille;  /* pool pin_permille (default 0: no pins) */
	int split;              /* prefill + decode callbacks instead of forward */
	int no_fake_cost;       /* leave cfg.cost as given even when it has no
				   step_us (default: the harness's cost model) */
	uint32_t event_capacity; /* pool event_capacity (default 0: no events) */
	uint32_t n_groups;      /* pool n_groups (default 0: one full group) */
	const bkv_kv_group *groups; /* pool groups, [n_groups] */
	bkv_sched_config cfg;   /* scheduler config (bkv_sched_config_init) */
	const bkv_allocator *sched_alloc, *pool_alloc; /* NULL: the library's */
} fh_opts;

void fh_opts_init(fh_opts *o);
fake_host *fh_create(const fh_opts *o);
void fh_destroy(fake_host *f);

/* The callbacks fh_create installs, for tests that build their own ops;
 * their host pointer is the fake_host. */
int fh_forward(void *host, const bkv_batch *b, int32_t *next);
int fh_prefill(void *host, const bkv_batch *b, int32_t *next);
int fh_decode(void *host, const bkv_batch *b, int32_t *next);

/* The record the next submitted request will be named by, filled from q
 * (prompt, max_new_tokens, n, stop tokens, cache key; tag = its id): set it
 * as q->user before bkv_submit(f->s, q, ...). */
kh_req *fh_next_req(fake_host *f, const bkv_request *q);

/* Submit a request (stop token FH_STOP, emitted as output stop_after; 0:
 * never); asserts BKV_OK. The prompt must outlive the harness. */
uint64_t fh_submit_ex(fake_host *f, const int32_t *prompt, uint32_t len, uint32_t max_new,
		      int32_t prio, uint32_t n, uint32_t stop_after);
uint64_t fh_submit(fake_host *f, const int32_t *prompt, uint32_t len, uint32_t max_new);
/* Submit q as it is (its user set to the next record, as fh_next_req);
 * asserts BKV_OK and returns the id. */
uint64_t fh_submit_req(fake_host *f, bkv_request *q);

/* Step (checking every invariant and the host after each) until nothing is
 * pending or max_steps; returns the steps taken. */
uint32_t fh_run(fake_host *f, uint32_t max_steps);

/* A prompt of len tokens from a seed (values 100..999, never FH_STOP);
 * malloc'd, the caller frees it. */
int32_t *fh_prompt(uint32_t len, uint64_t seed);

#endif /* BKV_FAKEHOST_SCHED_H */
