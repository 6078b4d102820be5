/*
 * fakehost.h - the self-checking fake host every scheduler test, fuzzer and
 * the soak run through: a stand-in for a GPU runtime that checks every batch
 * it is given and every callback the scheduler makes.
 *
 * It owns two things: a model of the KV memory (one 64-bit cell per device
 * slot and per host-tier slot) and, through the driver's kh_req records, what
 * each request was sampled and delivered. The driver owns the pool, the
 * scheduler and the records; the host only reads them through the batch and
 * the callbacks' user pointer, so it works with requests submitted from any
 * thread. It includes the public header only (include/batchkv.h).
 *
 * Checks on every compute call (kh_compute):
 *   - shape: the call kind matches the callback (a decode call has only
 *     decode rows, a prefill call none); block_tokens is the pool's; indptr
 *     arrays start at 0 and qo_indptr ends at n_tokens; each row has tokens
 *     and blocks, a decode row exactly one token; its branch is one of the
 *     request's; it has ceil(end / block_tokens) blocks and the right
 *     last-page length; every block id is in range; positions are
 *     consecutive; slot_mapping names the block and offset of each position;
 *     the row ends inside prompt + max_new; its row_req is the id the record
 *     was submitted under; every input token is the token the request holds
 *     at that position (its prompt, or what this host sampled for it);
 *   - KV (when verify is set): the cell of position p holds a hash chained
 *     over the request's cache key and all tokens [0, p], what real attention
 *     KV depends on. Before computing, the host performs the copy lists in
 *     the documented order (swap-out, swap-in, device copies), then checks
 *     that every context position [0, start) of every row holds the right
 *     cell (all reads before any write, as one kernel launch would) and
 *     writes the cells of the computed positions. So a wrong block table, a
 *     lost copy-on-write or swap copy, a prefix hit on other content or on a
 *     block not written yet, a cache-key leak or a recompute that resumes at
 *     the wrong place is caught.
 *
 * Checks on the callbacks: on_token delivers the sampled tokens in order,
 * never after a branch ended, beyond max_new or after on_finish; on_finish
 * runs once per request, with ABORT only if an abort was asked (kh_abort;
 * see aborts_unrecorded), ERROR only if the host wrote BKV_TOKEN_FAIL for it,
 * LENGTH/STOP only when every branch ended; both name the request by the id
 * it was submitted under.
 *
 * Sampling (kh_sample) is a closed-form hash of (request tag, branch,
 * position, input token), so a request's tokens depend only on its prompt:
 * runs with preemptions, host failures or other schedules must deliver
 * exactly the tokens of an undisturbed run. Per request it can emit KH_STOP
 * or BKV_TOKEN_FAIL by hash (stop_mod, fail_mod) or at a fixed output number
 * (stop_after, fail_after).
 *
 * Faults: a call fails when it is call number fail_at, while fail_next is
 * positive (counting down), with probability fail_permille (a xorshift
 * stream from rng), or when fail_hook says so (tested in that order, the
 * first that says yes wins). With garbage set, a failing call first does
 * harm: it performs the copies, writes wrong cells for the rows it was given
 * and lets the clock run, then returns -1; the scheduler must roll back so
 * that no wrong cell is ever read. Without garbage it refuses at the door
 * (kind and heads checked, nothing done, no time passes).
 *
 * A violation is counted (the first message kept) or, with
 * abort_on_violation, abort()s at once (for fuzzers). Plain C, no test
 * framework: tests/support/fakehost_sched.h puts a Criterion harness on top.
 */
#ifndef BKV_FAKEHOST_H
#define BKV_FAKEHOST_H

#include "batchkv.h"

#include <stdint.h>

#define KH_MAX_N 8u         /* most samples per request */
#define KH_STOP 7           /* the stop token the sampler emits on request */
#define KH_MAGIC 0x6b7672716b767271ull /* kh_req.magic: the user pointer is a record */
#define KH_JUNK 0x5eadbeef  /* written to next[] for rows that do not sample */

/* One request, owned by the driver, handed to bkv_submit as its user. The
 * driver fills the fields up to n_stop (kh_req_init, then its own choices);
 * the host writes hist and the fields after it. */
typedef struct kh_req {
	uint64_t magic;            /* KH_MAGIC while the record is live */
	uint64_t tag;              /* names the request for sampling; stable
				      across runs */
	const int32_t *prompt;     /* [prompt_len]; owned by the driver */
	uint32_t prompt_len;       /* tokens in prompt */
	uint32_t max_new;          /* max_new_tokens it was submitted with */
	uint32_t n;                /* samples (branches), <= KH_MAX_N */
	uint64_t key;              /* cache_key it was submitted with */
	uint32_t stop_mod;         /* sampler emits KH_STOP when hash % stop_mod
				      == 0 (0: never); submit with KH_STOP as a
				      stop token for it to end the branch */
	uint32_t fail_mod;         /* sampler emits BKV_TOKEN_FAIL when hash %
				      fail_mod == 1 (0: never) */
	uint32_t stop_after;       /* sampler emits KH_STOP as output number
				      stop_after of each branch (1-based; 0:
				      never); wins over stop_mod and fail_mod */
	uint32_t fail_after;       /* sampler emits BKV_TOKEN_FAIL as output
				      number fail_after (1-based; 0: never);
				      wins over stop_after */
	int32_t *hist;             /* [n * max_new] tokens sampled per branch, by
				      output number; kh_req_init allocates it,
				      or the driver points it at its own */
	uint32_t n_out[KH_MAX_N];  /* tokens on_token delivered, per branch */
	uint8_t branch_done[KH_MAX_N]; /* branch ended (stop or max_new) */
	int32_t stop[2];           /* stop tokens submitted ([n_stop]) */
	uint32_t n_stop;           /* 0..2 */
	uint64_t id;               /* from bkv_submit; 0 until known. Atomic:
				      kh_submit stores it while another thread
				      may be stepping, and the host checks rows
				      and callbacks against it once it is set */
	int submitted;             /* bkv_submit returned BKV_OK (driver's) */
	int abort_asked;           /* atomic: kh_abort was called for it */
	int error_written;         /* the host wrote BKV_TOKEN_FAIL for it */
	uint32_t finished;         /* on_finish calls: must end at 1 */
	int reason;                /* the finish reason (bkv_finish_reason) */
} kh_req;

typedef struct kh_host kh_host;

/* Optional hooks (fuzzers, soak): decide to fail a call; replace a sampled
 * token. Both get hook_ctx. */
typedef int (*kh_fail_hook)(void *ctx, const bkv_batch *b);
typedef int32_t (*kh_token_hook)(void *ctx, const kh_req *r, uint32_t branch, int32_t token);

struct kh_host {
	uint32_t bt, nb, nh;       /* pool geometry: block tokens, device blocks,
				      host-tier blocks */
	int verify;                /* keep and check the KV cell model */
	uint64_t *dev;             /* [nb * bt] device cells (verify) */
	uint64_t *hostc;           /* [max(nh, 1) * bt] host-tier cells (verify) */
	uint64_t calls;            /* compute calls so far, failed ones included */
	uint64_t fail_at;          /* 1-based compute call that fails; 0 none */
	int fail_next;             /* fail this many upcoming calls (counts down) */
	uint32_t fail_permille;    /* fail each call with this chance, in 1/1000 */
	uint64_t rng;              /* xorshift64 state for fail_permille; nonzero */
	uint64_t failed_calls;     /* calls that returned -1 */
	int last_fail_kind;        /* bkv_call_kind of the last failed call */
	int garbage;               /* a failing call copies, writes wrong cells
				      and takes time first (default 1) */
	kh_fail_hook fail_hook;    /* NULL: none */
	kh_token_hook token_hook;  /* NULL: none */
	void *hook_ctx;            /* handed to both hooks; the host never reads it */
	uint64_t now;              /* virtual clock, us (now_us) */
	uint64_t tick;             /* added per compute call that runs (default 100) */
	uint64_t tokens_out;       /* on_token calls */
	uint64_t finished;         /* on_finish calls */
	uint64_t by_reason[4];     /* of which by bkv_finish_reason */
	uint64_t violations;       /* contract breaks seen */
	char first[320];           /* the first one's message */
	int abort_on_violation;    /* fuzzers: abort() at once */
	int unadmittable_ok;       /* a request may end in error without a host
				      failure (bkv_sched_stats.unadmittable:
				      a pool with KV groups whose state units
				      or window chunks never fit) */
	int aborts_unrecorded;     /* the driver calls bkv_abort itself, so an
				      ABORT finish needs no kh_abort first */
	/* the persistent layout: the host's own copy of every row slot's block
	 * table, kept by applying each call's deltas (as a GPU host would on
	 * the device), and the flat arrays it builds from it for its checks
	 * (a FlashInfer host's gather kernel) */
	uint32_t n_slots;          /* row slots of the batches seen */
	uint32_t *mlen;            /* [n_slots] entries of each mirrored table */
	int32_t *mirror;           /* [n_slots * nb] mirrored tables, row-major */
	int32_t *g_indptr;         /* [rows + 1] gathered kv_indptr */
	int32_t *g_indices;        /* gathered kv_indices */
	uint32_t g_rows, g_cap;    /* capacities of the two */
	bkv_batch gathered;        /* the call with the gathered arrays */
	int32_t *undo;             /* the entries the call's deltas overwrote, and
				      each touched slot's old length: a failing
				      call with an odd number undoes its deltas
				      (the host treats it as not run), one with
				      an even number keeps them: either must
				      leave the right tables after the next call */
	uint32_t undo_n, undo_cap; /* entries used / allocated */
	uint64_t undone_calls;     /* failing calls whose deltas were undone */
	uint64_t deltas_applied;   /* bkv_table_delta entries applied */
	uint64_t delta_entries;    /* block ids they carried */
	bkv_sched *sched;          /* for the nested-step check (optional) */
	int try_nested;            /* call bkv_step(sched) from each compute call */
	int nested_rc;             /* what it returned */
	/* speculative decoding: a row with drafts is computed causally, the
	 * host samples after each of its tokens into spec_tokens and accepts
	 * greedily itself (writing n_accepted) when spec_host_accepts is set,
	 * else leaves n_accepted at -1; kh_draft proposes the sampler's true
	 * continuation, each draft right with spec_accept_permille / 1000
	 * (by hash, so reruns propose the same) */
	uint32_t spec_accept_permille; /* kh_draft's per-draft accuracy */
	uint32_t spec_draft_every; /* kh_draft proposes only for requests whose
				      tag is a multiple of it (0: every one) */
	int spec_host_accepts;     /* write n_accepted */
	uint64_t spec_rows;        /* rows with drafts computed */
	uint64_t spec_drafts;      /* drafts they carried */
	uint64_t spec_accepted;    /* of which the sampler agreed with */
};

#if defined(__GNUC__)
#define KH_PRINTF_LIKE __attribute__((format(printf, 2, 3)))
#else
#define KH_PRINTF_LIKE
#endif

/* ---- setup ---------------------------------------------------------------- */

/* Zero h and set it up for a pool of nb device and nh host blocks of bt
 * tokens; verify keeps the KV cell model. Returns 0, or -1 when the cells
 * cannot be allocated. */
int kh_init(kh_host *h, uint32_t bt, uint32_t nb, uint32_t nh, int verify);
void kh_fini(kh_host *h);

/* Fill a request record: zeroed, live, hist allocated for n x max_new
 * (kh_req_fini frees it). Returns 0, or -1 without memory. */
int kh_req_init(kh_req *r, uint64_t tag, const int32_t *prompt, uint32_t prompt_len,
		uint32_t max_new, uint32_t n);
void kh_req_fini(kh_req *r);

/* The bkv_request for r (user = r). */
void kh_request(const kh_req *r, bkv_request *q);
/* Submit r with a priority; records its id. Returns bkv_submit's result. */
int kh_submit(bkv_sched *s, kh_req *r, int32_t priority);
/* Ask for an abort (any thread); returns bkv_abort's result. */
int kh_abort(bkv_sched *s, kh_req *r, uint64_t id);

/* The callbacks: split (prefill + decode) or one forward, on_token,
 * on_finish, now_us; the host pointer is the kh_host. */
bkv_host_ops kh_ops(int split);

/* bkv_host_ops.draft for BKV_SPEC_DRAFT_HOST (host = the kh_host). */
int kh_draft(void *host, uint64_t req, uint32_t branch, const int32_t *ctx, uint32_t n_ctx,
	     int32_t *out, uint32_t k, void *user);

/* ---- the pieces, for drivers that wrap the callbacks ------------------------ */

/* One compute call of kind `want`: checks, copies, KV, faults, sampling.
 * Returns 0, or -1 when the call fails. */
int kh_compute(kh_host *h, const bkv_batch *b, int32_t *next, bkv_call_kind want);
/* The persistent layout: slot's mirrored table and its length (NULL when
 * the host has seen no persistent batch or slot is out of range). */
const int32_t *kh_mirror(const kh_host *h, uint32_t slot, uint32_t *len);
void kh_on_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user);
void kh_on_finish(void *host, uint64_t req, bkv_finish_reason why, void *user);

/* The sampler: depends only on (r's tag and sampling fields, branch,
 * position, input). */
int32_t kh_sample(const kh_req *r, uint32_t branch, uint32_t pos, int32_t input);
/* The token r's branch b holds at position p (prompt or sampled). */
int32_t kh_token_at(const kh_req *r, uint32_t b, uint32_t p);
/* Whether t is one of r's stop tokens. */
int kh_is_stop(const kh_req *r, int32_t t);

/* Record a violation (printf-style message). */
KH_PRINTF_LIKE void kh_violation(kh_host *h, const char *fmt, ...);

#endif /* BKV_FAKEHOST_H */
