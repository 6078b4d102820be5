/*
 * kvhost.h - a deterministic, self-checking fake host for the reliability
 * suite (fuzz_sched, test_faults, test_host_faults, test_stress, soak).
 *
 * It stands in for a GPU runtime and checks every batch it is given:
 *
 *   - shape: indptr arrays start at 0 and never decrease, the rows' tokens
 *     are contiguous positions, each row has ceil(end / block_tokens) blocks
 *     and the right last-page length, slot_mapping names the block and offset
 *     of each position, every block id is in range, the call kind matches
 *     the callback, and every input token equals the token the request holds
 *     at that position (its prompt, or what this host sampled for it);
 *   - KV (when verify is set): a model of the KV memory, one 64-bit cell per
 *     device slot and per host slot. The cell of position p holds a hash
 *     chained over the request's cache key and all tokens [0, p] - what real
 *     attention KV depends on. Before computing, the host performs the copy
 *     lists in the documented order (swap-out, swap-in, device copies); then
 *     it checks that every context position [0, start) of every row holds the
 *     right cell (all reads before any write, as one kernel launch would) and
 *     writes the cells of the computed positions. So a wrong block table, a
 *     lost copy-on-write or swap copy, a prefix hit on other content, a cache
 *     key leak or a recompute that resumes at the wrong place is caught.
 *
 * Sampling is a hash of (request tag, branch, position, input token), so a
 * request's tokens depend only on its prompt: runs with preemptions, host
 * failures or other schedules must deliver exactly the tokens of an
 * undisturbed run. A failing call (fail_at, or the fail hook) may first do
 * harm: it performs the copies and writes wrong cells for the rows it was
 * given (garbage), then returns -1; the scheduler must roll back so that no
 * wrong cell is ever read.
 *
 * Callbacks also check the request contract: on_token delivers the sampled
 * tokens in order, never after a branch ended or beyond max_new; on_finish
 * runs once per request, with ABORT only if an abort was asked, ERROR only if
 * the host wrote BKV_TOKEN_FAIL for it, and LENGTH/STOP only when every
 * branch ended. A violation is counted (first message kept) or, with
 * abort_on_violation, abort()s at once (for fuzzers).
 *
 * Requests are named by their user pointer (a kh_req), so the host needs no
 * id map and works with requests submitted from any thread. Plain C, no test
 * framework; header-only.
 */
#ifndef BKV_KVHOST_H
#define BKV_KVHOST_H

#include "batchkv.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KH_MAX_N 8u         /* most samples per request */
#define KH_STOP 7           /* the stop token the sampler emits on request */
#define KH_MAGIC 0x6b7672716b767271ull
#define KH_JUNK 0x5eadbeef  /* written for rows that do not sample */

/* One request, owned by the driver, handed to bkv_submit as its user. */
typedef struct kh_req {
	uint64_t magic;            /* KH_MAGIC */
	uint64_t tag;              /* names the request for sampling; stable
				      across runs */
	const int32_t *prompt;     /* [prompt_len]; owned by the driver */
	uint32_t prompt_len;
	uint32_t max_new;          /* max_new_tokens */
	uint32_t n;                /* samples, <= KH_MAX_N */
	uint64_t key;              /* cache_key */
	uint32_t stop_mod;         /* sampler emits KH_STOP when hash % stop_mod
				      == 0 (0: never); submit with KH_STOP as a
				      stop token for it to end the branch */
	uint32_t fail_mod;         /* sampler emits BKV_TOKEN_FAIL when hash %
				      fail_mod == 1 (0: never) */
	int32_t *hist;             /* [n * max_new] tokens sampled per branch */
	uint32_t n_out[KH_MAX_N];  /* tokens delivered by on_token */
	uint8_t branch_done[KH_MAX_N]; /* branch ended (stop or max_new) */
	int32_t stop[2];           /* stop tokens submitted */
	uint32_t n_stop;
	uint64_t id;               /* from bkv_submit (driver's copy) */
	int submitted;             /* bkv_submit returned BKV_OK */
	int abort_asked;           /* atomic: an abort was requested */
	int error_written;         /* the host wrote BKV_TOKEN_FAIL for it */
	uint32_t finished;         /* on_finish calls: must end at 1 */
	int reason;                /* the finish reason */
} kh_req;

typedef struct kh_host kh_host;

/* Optional hooks (fuzzers): decide to fail a call; replace a sampled token. */
typedef int (*kh_fail_hook)(void *ctx, const bkv_batch *b);
typedef int32_t (*kh_token_hook)(void *ctx, const kh_req *r, uint32_t branch, int32_t token);

struct kh_host {
	uint32_t bt, nb, nh;       /* pool geometry */
	int verify;                /* keep and check the KV cell model */
	uint64_t *dev;             /* [nb * bt] device cells (verify) */
	uint64_t *hostc;           /* [nh * bt] host-tier cells (verify) */
	uint64_t calls;            /* compute calls so far */
	uint64_t fail_at;          /* 1-based compute call that fails; 0 none */
	uint64_t failed_calls;     /* calls that returned -1 */
	int last_fail_kind;        /* bkv_call_kind of the last failed call */
	int garbage;               /* a failing call writes wrong cells first */
	kh_fail_hook fail_hook;
	kh_token_hook token_hook;
	void *hook_ctx;
	uint64_t now;              /* virtual clock, us (now_us) */
	uint64_t tick;             /* added per compute call */
	uint64_t tokens_out;       /* on_token calls */
	uint64_t finished;         /* on_finish calls */
	uint64_t by_reason[4];     /* of which by bkv_finish_reason */
	uint64_t violations;       /* contract breaks seen */
	char first[320];           /* the first one */
	int abort_on_violation;    /* fuzzers: abort() at once */
	bkv_sched *sched;          /* for the nested-step check (optional) */
	int try_nested;            /* call bkv_step from a callback */
	int nested_rc;             /* what it returned */
};

#if defined(__GNUC__)
#define KH_PRINTF_LIKE __attribute__((format(printf, 2, 3)))
#else
#define KH_PRINTF_LIKE
#endif

KH_PRINTF_LIKE static inline void kh_violation(kh_host *h, const char *fmt, ...)
{
	va_list ap;

	if (h->violations++ == 0) {
		va_start(ap, fmt);
		vsnprintf(h->first, sizeof(h->first), fmt, ap);
		va_end(ap);
	}
	if (h->abort_on_violation) {
		va_start(ap, fmt);
		fprintf(stderr, "kvhost: ");
		vfprintf(stderr, fmt, ap);
		fputc('\n', stderr);
		va_end(ap);
		abort();
	}
}

static inline uint64_t kh_mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0x7fb5d329728ea185ull;
	x ^= x >> 27;
	x *= 0x81dadef4bc2dd44dull;
	x ^= x >> 33;
	return x;
}

/* KV cell of a position: chained over the key and every token before it. */
static inline uint64_t kh_chain(uint64_t h, int32_t token)
{
	return kh_mix(h ^ (uint64_t)(uint32_t)token) + 0x9e3779b97f4a7c15ull;
}

static inline uint64_t kh_chain_root(uint64_t key)
{
	return kh_mix(key ^ 0x243f6a8885a308d3ull);
}

/* The sampler: depends only on (tag, branch, position, input). */
static inline int32_t kh_sample(const kh_req *r, uint32_t branch, uint32_t pos, int32_t input)
{
	uint64_t x = kh_mix(r->tag * 0x9e3779b97f4a7c15ull ^ (uint64_t)branch << 56 ^
			    (uint64_t)pos << 24 ^ (uint64_t)(uint32_t)input);

	if (r->fail_mod && x % r->fail_mod == 1)
		return BKV_TOKEN_FAIL;
	if (r->stop_mod && x % r->stop_mod == 0)
		return KH_STOP;
	return 1000 + (int32_t)(x % 50000u);
}

/* The token request r, branch b holds at position p (prompt or sampled). */
static inline int32_t kh_token_at(const kh_req *r, uint32_t b, uint32_t p)
{
	if (p < r->prompt_len)
		return r->prompt[p];
	return r->hist[(size_t)b * r->max_new + (p - r->prompt_len)];
}

/* ---- setup --------------------------------------------------------------- */

/* Returns 0, or -1 when the cells cannot be allocated. */
static inline int kh_init(kh_host *h, uint32_t bt, uint32_t nb, uint32_t nh, int verify)
{
	memset(h, 0, sizeof(*h));
	h->bt = bt;
	h->nb = nb;
	h->nh = nh;
	h->verify = verify;
	h->garbage = 1;
	h->tick = 100;
	if (verify) {
		h->dev = calloc((size_t)nb * bt, sizeof(uint64_t));
		h->hostc = calloc((size_t)(nh ? nh : 1) * bt, sizeof(uint64_t));
		if (!h->dev || !h->hostc) {
			free(h->dev);
			free(h->hostc);
			return -1;
		}
	}
	return 0;
}

static inline void kh_fini(kh_host *h)
{
	free(h->dev);
	free(h->hostc);
	h->dev = h->hostc = NULL;
}

/* Fill a request record (hist allocated here; kh_req_fini frees it). */
static inline int kh_req_init(kh_req *r, uint64_t tag, const int32_t *prompt, uint32_t prompt_len,
			      uint32_t max_new, uint32_t n)
{
	memset(r, 0, sizeof(*r));
	r->magic = KH_MAGIC;
	r->tag = tag;
	r->prompt = prompt;
	r->prompt_len = prompt_len;
	r->max_new = max_new;
	r->n = n;
	r->hist = calloc((size_t)n * (max_new ? max_new : 1), sizeof(int32_t));
	return r->hist ? 0 : -1;
}

static inline void kh_req_fini(kh_req *r)
{
	free(r->hist);
	r->hist = NULL;
}

static inline void kh_request(const kh_req *r, bkv_request *q)
{
	bkv_request_init(q);
	q->prompt = r->prompt;
	q->prompt_len = r->prompt_len;
	q->max_new_tokens = r->max_new;
	q->n = r->n;
	q->cache_key = r->key;
	q->stop_tokens = r->n_stop ? r->stop : NULL;
	q->n_stop = r->n_stop;
	q->user = (void *)r;
}

/* Submit r; records the id. */
static inline int kh_submit(bkv_sched *s, kh_req *r, int32_t priority)
{
	bkv_request q;
	uint64_t id = 0;
	int rc;

	kh_request(r, &q);
	q.priority = priority;
	rc = bkv_submit(s, &q, &id);
	if (rc == BKV_OK) {
		r->id = id;
		r->submitted = 1;
	}
	return rc;
}

/* Ask for an abort (any thread). */
static inline int kh_abort(bkv_sched *s, kh_req *r, uint64_t id)
{
	__atomic_store_n(&r->abort_asked, 1, __ATOMIC_RELAXED);
	return bkv_abort(s, id);
}

/* ---- the compute callbacks ----------------------------------------------- */

static inline void kh_copy_cells(kh_host *h, const bkv_copy *c, uint32_t n, uint64_t *src,
				 uint32_t src_n, uint64_t *dst, uint32_t dst_n, const char *what)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		if (c[i].src < 0 || (uint32_t)c[i].src >= src_n || c[i].dst < 0 ||
		    (uint32_t)c[i].dst >= dst_n) {
			kh_violation(h, "%s copy %d -> %d out of range", what, c[i].src, c[i].dst);
			continue;
		}
		if (h->verify)
			memcpy(dst + (size_t)c[i].dst * h->bt, src + (size_t)c[i].src * h->bt,
			       h->bt * sizeof(uint64_t));
	}
}

static inline const kh_req *kh_row_req(kh_host *h, const bkv_batch *b, uint32_t r)
{
	const kh_req *q = (const kh_req *)b->row_user[r];

	if (!q || q->magic != KH_MAGIC) {
		kh_violation(h, "row %u: user pointer %p is not a request", r, (void *)q);
		return NULL;
	}
	return q;
}

static inline int kh_compute(kh_host *h, const bkv_batch *b, int32_t *next, bkv_call_kind want)
{
	uint32_t r, i;
	int fail;

	h->calls++;
	h->now += h->tick;
	if (b->kind != want)
		kh_violation(h, "batch kind %d in callback for %d", b->kind, want);
	if (b->block_tokens != h->bt)
		kh_violation(h, "block_tokens %u, pool has %u", b->block_tokens, h->bt);
	if (b->n_decode_rows > b->n_rows || (want == BKV_CALL_DECODE && b->n_decode_rows != b->n_rows) ||
	    (want == BKV_CALL_PREFILL && b->n_decode_rows != 0))
		kh_violation(h, "%u decode rows of %u in a kind-%d call", b->n_decode_rows, b->n_rows,
			     want);
	if (b->n_rows == 0 || b->qo_indptr[0] != 0 || b->kv_indptr[0] != 0 ||
	    (uint32_t)b->qo_indptr[b->n_rows] != b->n_tokens)
		kh_violation(h, "bad indptr heads (rows %u tokens %u)", b->n_rows, b->n_tokens);
	fail = (h->fail_at && h->calls == h->fail_at) ||
	       (h->fail_hook && h->fail_hook(h->hook_ctx, b));
	if (h->try_nested && h->sched)
		h->nested_rc = bkv_step(h->sched, NULL);

	/* the copies first, in the documented order */
	kh_copy_cells(h, b->swap_out, b->n_swap_out, h->dev, h->nb, h->hostc, h->nh, "swap-out");
	kh_copy_cells(h, b->swap_in, b->n_swap_in, h->hostc, h->nh, h->dev, h->nb, "swap-in");
	kh_copy_cells(h, b->copies, b->n_copies, h->dev, h->nb, h->dev, h->nb, "device");

	/* pass 1: shape, input tokens and every context read */
	for (r = 0; r < b->n_rows; r++) {
		const kh_req *q = kh_row_req(h, b, r);
		int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
		int32_t k0 = b->kv_indptr[r], k1 = b->kv_indptr[r + 1];
		uint32_t br = b->row_branch[r], start, end, nblk, p;
		uint64_t c;

		if (!q)
			continue;
		if (q1 <= q0 || k1 <= k0 || (r < b->n_decode_rows && q1 - q0 != 1)) {
			kh_violation(h, "row %u: tokens [%d, %d), blocks [%d, %d)", r, q0, q1, k0, k1);
			continue;
		}
		if (br >= q->n) {
			kh_violation(h, "row %u: branch %u of %u", r, br, q->n);
			continue;
		}
		start = (uint32_t)b->positions[q0];
		end = start + (uint32_t)(q1 - q0);
		nblk = (end + h->bt - 1) / h->bt;
		if ((uint32_t)(k1 - k0) != nblk ||
		    (uint32_t)b->kv_last_page_len[r] != end - (nblk - 1) * h->bt) {
			kh_violation(h, "row %u: %d blocks, last page %d for %u tokens", r, k1 - k0,
				     b->kv_last_page_len[r], end);
			continue;
		}
		if (end > q->prompt_len + q->max_new) {
			kh_violation(h, "row %u: end %u beyond prompt %u + max_new %u", r, end,
				     q->prompt_len, q->max_new);
			continue;
		}
		for (i = 0; i < nblk; i++) {
			int32_t blk = b->kv_indices[k0 + (int32_t)i];

			if (blk < 0 || (uint32_t)blk >= h->nb) {
				kh_violation(h, "row %u: block id %d", r, blk);
				nblk = 0;
			}
		}
		if (!nblk)
			continue;
		for (p = start; p < end; p++) {
			int32_t blk = b->kv_indices[k0 + (int32_t)(p / h->bt)];
			uint32_t t = (uint32_t)q0 + (p - start);

			if (b->positions[t] != (int32_t)p)
				kh_violation(h, "row %u: position %d where %u belongs", r, b->positions[t], p);
			if (b->slot_mapping[t] != blk * (int32_t)h->bt + (int32_t)(p % h->bt))
				kh_violation(h, "row %u: slot %d for position %u (block %d)", r,
					     b->slot_mapping[t], p, blk);
			if (b->token_ids[t] != kh_token_at(q, br, p))
				kh_violation(h, "req %llu branch %u: input %d at position %u, holds %d",
					     (unsigned long long)b->row_req[r], br, b->token_ids[t], p,
					     kh_token_at(q, br, p));
		}
		if (!h->verify)
			continue;
		c = kh_chain_root(q->key);
		for (p = 0; p < start; p++) {
			int32_t blk = b->kv_indices[k0 + (int32_t)(p / h->bt)];

			c = kh_chain(c, kh_token_at(q, br, p));
			if (h->dev[(size_t)blk * h->bt + p % h->bt] != c) {
				kh_violation(h,
					     "req %llu branch %u: KV at position %u (block %d) is not its "
					     "prefix's (row [%u, %u))",
					     (unsigned long long)b->row_req[r], br, p, blk, start, end);
				break;
			}
		}
	}
	/* pass 2: write the computed cells (wrong ones when failing) and sample */
	for (r = 0; r < b->n_rows; r++) {
		const kh_req *q = (const kh_req *)b->row_user[r];
		int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
		int32_t k0 = b->kv_indptr[r];
		uint32_t br = b->row_branch[r], start, end, p;
		uint64_t c;

		next[r] = KH_JUNK;
		if (!q || q->magic != KH_MAGIC || q1 <= q0 || br >= q->n)
			continue;
		start = (uint32_t)b->positions[q0];
		end = start + (uint32_t)(q1 - q0);
		if (end > q->prompt_len + q->max_new)
			continue;
		if (h->verify && (!fail || h->garbage)) {
			c = kh_chain_root(q->key);
			for (p = 0; p < end; p++) {
				int32_t blk = b->kv_indices[k0 + (int32_t)(p / h->bt)];

				c = kh_chain(c, kh_token_at(q, br, p));
				if (p >= start && blk >= 0 && (uint32_t)blk < h->nb)
					h->dev[(size_t)blk * h->bt + p % h->bt] = fail ? ~c : c;
			}
		}
		if (b->row_sample[r] && !fail) {
			int32_t t;
			uint32_t idx = end - q->prompt_len;

			if (end < q->prompt_len || idx >= q->max_new) {
				kh_violation(h, "row %u samples token %u of a request with %u", r,
					     end < q->prompt_len ? 0 : idx, q->max_new);
				continue;
			}
			t = kh_sample(q, br, end, b->token_ids[q1 - 1]);
			if (h->token_hook)
				t = h->token_hook(h->hook_ctx, q, br, t);
			((kh_req *)q)->hist[(size_t)br * q->max_new + idx] = t;
			if (t == BKV_TOKEN_FAIL)
				((kh_req *)q)->error_written = 1;
			next[r] = t;
		}
	}
	if (fail) {
		h->failed_calls++;
		h->last_fail_kind = (int)b->kind;
		return -1;
	}
	return 0;
}

static int kh_forward(void *host, const bkv_batch *b, int32_t *next)
{
	return kh_compute(host, b, next, BKV_CALL_MIXED);
}

static int kh_prefill(void *host, const bkv_batch *b, int32_t *next)
{
	return kh_compute(host, b, next, BKV_CALL_PREFILL);
}

static int kh_decode(void *host, const bkv_batch *b, int32_t *next)
{
	return kh_compute(host, b, next, BKV_CALL_DECODE);
}

static inline int kh_is_stop(const kh_req *q, int32_t t)
{
	uint32_t i;

	for (i = 0; i < q->n_stop; i++)
		if (q->stop[i] == t)
			return 1;
	return 0;
}

static void kh_on_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	kh_host *h = host;
	kh_req *q = user;
	uint32_t idx;

	h->tokens_out++;
	if (!q || q->magic != KH_MAGIC) {
		kh_violation(h, "on_token: req %llu without its user pointer", (unsigned long long)req);
		return;
	}
	if (branch >= q->n || q->finished || q->branch_done[branch]) {
		kh_violation(h, "on_token: req %llu branch %u after its end", (unsigned long long)req,
			     branch);
		return;
	}
	idx = q->n_out[branch];
	if (idx >= q->max_new || token != q->hist[(size_t)branch * q->max_new + idx]) {
		kh_violation(h, "on_token: req %llu branch %u token %u is %d, sampled %d",
			     (unsigned long long)req, branch, idx, token,
			     idx < q->max_new ? q->hist[(size_t)branch * q->max_new + idx] : 0);
		return;
	}
	q->n_out[branch] = idx + 1;
	if (idx + 1 == q->max_new || kh_is_stop(q, token))
		q->branch_done[branch] = 1;
}

static void kh_on_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	kh_host *h = host;
	kh_req *q = user;
	uint32_t b;

	h->finished++;
	if (!q || q->magic != KH_MAGIC) {
		kh_violation(h, "on_finish: req %llu without its user pointer", (unsigned long long)req);
		return;
	}
	if (q->finished++) {
		kh_violation(h, "on_finish: req %llu ended twice", (unsigned long long)req);
		return;
	}
	q->reason = (int)why;
	if ((unsigned)why < 4)
		h->by_reason[why]++;
	switch (why) {
	case BKV_FINISH_ABORT:
		if (!__atomic_load_n(&q->abort_asked, __ATOMIC_RELAXED))
			kh_violation(h, "req %llu aborted without an abort", (unsigned long long)req);
		break;
	case BKV_FINISH_ERROR:
		if (!q->error_written)
			kh_violation(h, "req %llu ended in error; the host wrote no failure",
				     (unsigned long long)req);
		break;
	case BKV_FINISH_LENGTH:
	case BKV_FINISH_STOP:
		for (b = 0; b < q->n; b++)
			if (!q->branch_done[b])
				kh_violation(h, "req %llu ended (%d) with branch %u at %u of %u tokens",
					     (unsigned long long)req, why, b, q->n_out[b], q->max_new);
		break;
	default:
		kh_violation(h, "req %llu: finish reason %d", (unsigned long long)req, why);
	}
}

static uint64_t kh_now(void *host)
{
	return ((kh_host *)host)->now;
}

/* The callbacks: split (prefill + decode) or one forward. */
static inline bkv_host_ops kh_ops(int split)
{
	bkv_host_ops o;

	memset(&o, 0, sizeof(o));
	if (split) {
		o.prefill = kh_prefill;
		o.decode = kh_decode;
	} else {
		o.forward = kh_forward;
	}
	o.on_token = kh_on_token;
	o.on_finish = kh_on_finish;
	o.now_us = kh_now;
	return o;
}

#endif /* BKV_KVHOST_H */
