/*
 * fakehost.c - the self-checking fake host (what it checks: fakehost.h).
 *
 * A compute call runs in this order, so that the model matches one kernel
 * launch of a real runtime:
 *
 *   count the call, check kind and heads
 *   decide the fault (fail_at, fail_next, fail_permille, fail_hook)
 *   nested bkv_step (try_nested)          -- must be refused by the library
 *   refuse at the door (failing, no garbage): return -1, nothing done
 *   advance the clock
 *   copies: swap-out, swap-in, device     -- the documented order
 *   pass 1: every row's shape, input tokens and context cells (reads only)
 *   pass 2: every row's computed cells (wrong ones when failing), sampling
 *
 * Records are found through the batch's row_user and the callbacks' user
 * pointer (a kh_req, recognised by its magic), never by id, so the host
 * needs no map and is indifferent to which thread submitted.
 */
#include "fakehost.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kh_violation(kh_host *h, const char *fmt, ...)
{
	va_list ap;

	if (h->violations++ == 0) {
		va_start(ap, fmt);
		vsnprintf(h->first, sizeof(h->first), fmt, ap);
		va_end(ap);
	}
	if (h->abort_on_violation) {
		va_start(ap, fmt);
		fprintf(stderr, "fakehost: ");
		vfprintf(stderr, fmt, ap);
		fputc('\n', stderr);
		va_end(ap);
		abort();
	}
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0x7fb5d329728ea185ull;
	x ^= x >> 27;
	x *= 0x81dadef4bc2dd44dull;
	x ^= x >> 33;
	return x;
}

/* KV cell of a position: chained over the key and every token up to it. */
static uint64_t chain(uint64_t h, int32_t token)
{
	return mix(h ^ (uint64_t)(uint32_t)token) + 0x9e3779b97f4a7c15ull;
}

static uint64_t chain_root(uint64_t key)
{
	return mix(key ^ 0x243f6a8885a308d3ull);
}

/* fail_permille's stream (xorshift64). */
static uint64_t next_rand(kh_host *h)
{
	h->rng ^= h->rng << 13;
	h->rng ^= h->rng >> 7;
	h->rng ^= h->rng << 17;
	return h->rng;
}

int32_t kh_sample(const kh_req *r, uint32_t branch, uint32_t pos, int32_t input)
{
	uint64_t x = mix(r->tag * 0x9e3779b97f4a7c15ull ^ (uint64_t)branch << 56 ^
			 (uint64_t)pos << 24 ^ (uint64_t)(uint32_t)input);
	uint32_t nth = pos + 1 - r->prompt_len; /* output number, 1-based */

	if (pos >= r->prompt_len) {
		if (r->fail_after && nth == r->fail_after)
			return BKV_TOKEN_FAIL;
		if (r->stop_after && nth == r->stop_after)
			return KH_STOP;
	}
	if (r->fail_mod && x % r->fail_mod == 1)
		return BKV_TOKEN_FAIL;
	if (r->stop_mod && x % r->stop_mod == 0)
		return KH_STOP;
	return 1000 + (int32_t)(x % 50000u);
}

int32_t kh_token_at(const kh_req *r, uint32_t b, uint32_t p)
{
	if (p < r->prompt_len)
		return r->prompt[p];
	return r->hist[(size_t)b * r->max_new + (p - r->prompt_len)];
}

int kh_is_stop(const kh_req *r, int32_t t)
{
	uint32_t i;

	for (i = 0; i < r->n_stop; i++)
		if (r->stop[i] == t)
			return 1;
	return 0;
}

/* ---- setup ---------------------------------------------------------------- */

int kh_init(kh_host *h, uint32_t bt, uint32_t nb, uint32_t nh, int verify)
{
	memset(h, 0, sizeof(*h));
	h->bt = bt;
	h->nb = nb;
	h->nh = nh;
	h->verify = verify;
	h->garbage = 1;
	h->tick = 100;
	h->rng = 0x1234567;
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

void kh_fini(kh_host *h)
{
	free(h->dev);
	free(h->hostc);
	free(h->mlen);
	free(h->mirror);
	free(h->g_indptr);
	free(h->g_indices);
	free(h->undo);
	h->undo = NULL;
	h->dev = h->hostc = NULL;
	h->mlen = NULL;
	h->mirror = h->g_indptr = h->g_indices = NULL;
}

const int32_t *kh_mirror(const kh_host *h, uint32_t slot, uint32_t *len)
{
	if (!h->mirror || slot >= h->n_slots)
		return NULL;
	*len = h->mlen[slot];
	return h->mirror + (size_t)slot * h->nb;
}

/* Apply the call's table deltas to the mirror (every call's, whatever it
 * returns: they are absolute writes). 0, or -1 without memory. */
static int apply_deltas(kh_host *h, const bkv_batch *b)
{
	const int32_t *blk = b->delta_blocks;
	uint32_t i;

	if (!h->mirror) {
		h->n_slots = b->n_row_slots;
		h->mlen = calloc(h->n_slots ? h->n_slots : 1, sizeof(uint32_t));
		h->mirror = malloc((size_t)(h->n_slots ? h->n_slots : 1) * h->nb * sizeof(int32_t));
		if (!h->mlen || !h->mirror)
			return -1;
	}
	if (b->n_row_slots != h->n_slots)
		kh_violation(h, "n_row_slots %u, was %u", b->n_row_slots, h->n_slots);
	h->undo_n = 0;
	for (i = 0; i < b->n_table_deltas; i++) {
		const bkv_table_delta *d = &b->table_deltas[i];
		int32_t *t;

		if (d->slot >= h->n_slots || d->start + d->n > h->nb || d->len > h->nb ||
		    d->start + d->n > d->len ||
		    ((d->flags & BKV_TABLE_CLOSED) && (d->n || d->len)) ||
		    ((d->flags & BKV_TABLE_OPENED) && d->start != 0)) {
			kh_violation(h, "bad delta %u: slot %u start %u n %u len %u flags %u", i,
				     d->slot, d->start, d->n, d->len, d->flags);
			return 0;
		}
		t = h->mirror + (size_t)d->slot * h->nb;
		if (h->undo_n + d->n + 4 > h->undo_cap) {
			int32_t *u = realloc(h->undo, 2 * (h->undo_n + d->n + 4) * sizeof(int32_t));

			if (!u)
				return -1;
			h->undo = u;
			h->undo_cap = 2 * (h->undo_n + d->n + 4);
		}
		/* the undo record: the old entries, then start, n, slot and
		 * the old length */
		memcpy(h->undo + h->undo_n, t + d->start, (size_t)d->n * sizeof(int32_t));
		h->undo_n += d->n;
		h->undo[h->undo_n++] = (int32_t)d->start;
		h->undo[h->undo_n++] = (int32_t)d->n;
		h->undo[h->undo_n++] = (int32_t)d->slot;
		h->undo[h->undo_n++] = (int32_t)h->mlen[d->slot];
		if (!(d->flags & BKV_TABLE_OPENED) && d->start > h->mlen[d->slot])
			kh_violation(h, "delta %u of slot %u starts at %u past its %u entries", i,
				     d->slot, d->start, h->mlen[d->slot]);
		memcpy(t + d->start, blk, (size_t)d->n * sizeof(int32_t));
		blk += d->n;
		h->mlen[d->slot] = d->len;
		h->deltas_applied++;
		h->delta_entries += d->n;
	}
	return 0;
}

/* A failing call with an odd number: undo its deltas, newest first, as a
 * host that treats a failed call as not run would (the next call's deltas
 * are relative to the last successful one). */
static void undo_deltas(kh_host *h, const bkv_batch *b)
{
	if (b->layout != BKV_BATCH_PERSISTENT || !(h->calls & 1) || !h->mirror)
		return;
	while (h->undo_n) {
		uint32_t len = (uint32_t)h->undo[--h->undo_n];
		uint32_t slot = (uint32_t)h->undo[--h->undo_n];
		uint32_t n = (uint32_t)h->undo[--h->undo_n];
		uint32_t start = (uint32_t)h->undo[--h->undo_n];

		h->undo_n -= n;
		memcpy(h->mirror + (size_t)slot * h->nb + start, h->undo + h->undo_n,
		       (size_t)n * sizeof(int32_t));
		h->mlen[slot] = len;
	}
	h->undone_calls++;
}

/* Build kv_indptr / kv_indices for the call's rows from the mirror (what a
 * FlashInfer host does on the device), checking the library's row tables
 * against it; *out becomes the call with those arrays. -1 without memory. */
static int gather_rows(kh_host *h, const bkv_batch *b, bkv_batch *out)
{
	uint32_t r, k = 0, need = 0;

	for (r = 0; r < b->n_rows; r++)
		if (b->row_slot[r] < h->n_slots)
			need += h->mlen[b->row_slot[r]];
	if (b->n_rows + 1 > h->g_rows) {
		free(h->g_indptr);
		h->g_rows = 2 * (b->n_rows + 1);
		if (!(h->g_indptr = malloc(h->g_rows * sizeof(int32_t))))
			return -1;
	}
	if (need > h->g_cap) {
		free(h->g_indices);
		h->g_cap = 2 * need;
		if (!(h->g_indices = malloc((size_t)h->g_cap * sizeof(int32_t))))
			return -1;
	}
	h->g_indptr[0] = 0;
	for (r = 0; r < b->n_rows; r++) {
		uint32_t slot = b->row_slot[r], n;
		const int32_t *t;

		if (slot >= h->n_slots) {
			kh_violation(h, "row %u: slot %u of %u", r, slot, h->n_slots);
			return 0;
		}
		t = h->mirror + (size_t)slot * h->nb;
		n = h->mlen[slot];
		if (b->row_table_len[slot] != n ||
		    memcmp(b->row_tables[slot], t, (size_t)n * sizeof(int32_t)) != 0)
			kh_violation(h, "row %u slot %u: the mirror (%u entries) differs from the "
				     "library's table (%u)", r, slot, n, b->row_table_len[slot]);
		memcpy(h->g_indices + k, t, (size_t)n * sizeof(int32_t));
		k += n;
		h->g_indptr[r + 1] = (int32_t)k;
	}
	*out = *b;
	out->kv_indptr = h->g_indptr;
	out->kv_indices = h->g_indices;
	return 0;
}

int kh_req_init(kh_req *r, uint64_t tag, const int32_t *prompt, uint32_t prompt_len,
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

void kh_req_fini(kh_req *r)
{
	free(r->hist);
	r->hist = NULL;
}

void kh_request(const kh_req *r, bkv_request *q)
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

int kh_submit(bkv_sched *s, kh_req *r, int32_t priority)
{
	bkv_request q;
	uint64_t id = 0;
	int rc;

	kh_request(r, &q);
	q.priority = priority;
	rc = bkv_submit(s, &q, &id);
	if (rc == BKV_OK) {
		__atomic_store_n(&r->id, id, __ATOMIC_RELEASE);
		r->submitted = 1;
	}
	return rc;
}

int kh_abort(bkv_sched *s, kh_req *r, uint64_t id)
{
	__atomic_store_n(&r->abort_asked, 1, __ATOMIC_RELAXED);
	return bkv_abort(s, id);
}

/* ---- the compute callbacks ------------------------------------------------ */

static void copy_cells(kh_host *h, const bkv_copy *c, uint32_t n, uint64_t *src, uint32_t src_n,
		       uint64_t *dst, uint32_t dst_n, const char *what)
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

/* The record a row names, or NULL (a violation) when it is not one; a
 * record whose id is known must be the row's request. */
static const kh_req *row_req(kh_host *h, const bkv_batch *b, uint32_t r)
{
	const kh_req *q = (const kh_req *)b->row_user[r];
	uint64_t id;

	if (!q || q->magic != KH_MAGIC) {
		kh_violation(h, "row %u: user pointer %p is not a request", r, (void *)q);
		return NULL;
	}
	id = __atomic_load_n(&q->id, __ATOMIC_ACQUIRE);
	if (id && id != b->row_req[r])
		kh_violation(h, "row %u: request %llu carries the record of request %llu", r,
			     (unsigned long long)b->row_req[r], (unsigned long long)id);
	return q;
}

/* The call's kind and the heads of its arrays. */
static void check_heads(kh_host *h, const bkv_batch *b, bkv_call_kind want)
{
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
}

/* Whether this call fails: the first of the four sources that says so. */
static int decide_fault(kh_host *h, const bkv_batch *b)
{
	if (h->fail_at && h->calls == h->fail_at)
		return 1;
	if (h->fail_next > 0) {
		h->fail_next--;
		return 1;
	}
	if (h->fail_permille && next_rand(h) % 1000 < h->fail_permille)
		return 1;
	return h->fail_hook && h->fail_hook(h->hook_ctx, b);
}

/* Pass 1 for row r: shape, input tokens and every context read. */
static void check_row(kh_host *h, const bkv_batch *b, uint32_t r)
{
	const kh_req *q = row_req(h, b, r);
	int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
	int32_t k0 = b->kv_indptr[r], k1 = b->kv_indptr[r + 1];
	uint32_t br = b->row_branch[r], start, end, nblk, p, i;
	uint64_t c;

	if (!q)
		return;
	if (q1 <= q0 || k1 <= k0 ||
	    (r < b->n_decode_rows &&
	     q1 - q0 != 1 + (int32_t)(b->row_drafts ? b->row_drafts[r] : 0)) ||
	    (r >= b->n_decode_rows && b->row_drafts && b->row_drafts[r])) {
		kh_violation(h, "row %u: tokens [%d, %d), blocks [%d, %d)", r, q0, q1, k0, k1);
		return;
	}
	if (br >= q->n) {
		kh_violation(h, "row %u: branch %u of %u", r, br, q->n);
		return;
	}
	start = (uint32_t)b->positions[q0];
	end = start + (uint32_t)(q1 - q0);
	nblk = (end + h->bt - 1) / h->bt;
	if ((uint32_t)(k1 - k0) != nblk ||
	    (uint32_t)b->kv_last_page_len[r] != end - (nblk - 1) * h->bt) {
		kh_violation(h, "row %u: %d blocks, last page %d for %u tokens", r, k1 - k0,
			     b->kv_last_page_len[r], end);
		return;
	}
	if (end > q->prompt_len + q->max_new) {
		kh_violation(h, "row %u: end %u beyond prompt %u + max_new %u", r, end,
			     q->prompt_len, q->max_new);
		return;
	}
	for (i = 0; i < nblk; i++) {
		int32_t blk = b->kv_indices[k0 + (int32_t)i];

		if (blk < 0 || (uint32_t)blk >= h->nb) {
			kh_violation(h, "row %u: block id %d", r, blk);
			nblk = 0;
		}
	}
	if (!nblk)
		return;
	for (p = start; p < end; p++) {
		int32_t blk = b->kv_indices[k0 + (int32_t)(p / h->bt)];
		uint32_t t = (uint32_t)q0 + (p - start);

		if (b->positions[t] != (int32_t)p)
			kh_violation(h, "row %u: position %d where %u belongs", r, b->positions[t], p);
		if (b->slot_mapping[t] != blk * (int32_t)h->bt + (int32_t)(p % h->bt))
			kh_violation(h, "row %u: slot %d for position %u (block %d)", r,
				     b->slot_mapping[t], p, blk);
		if (p > start && b->row_drafts && b->row_drafts[r])
			continue; /* a draft: any token */
		if (b->token_ids[t] != kh_token_at(q, br, p))
			kh_violation(h, "req %llu branch %u: input %d at position %u, holds %d",
				     (unsigned long long)b->row_req[r], br, b->token_ids[t], p,
				     kh_token_at(q, br, p));
	}
	if (!h->verify)
		return;
	c = chain_root(q->key);
	for (p = 0; p < start; p++) {
		int32_t blk = b->kv_indices[k0 + (int32_t)(p / h->bt)];

		c = chain(c, kh_token_at(q, br, p));
		if (h->dev[(size_t)blk * h->bt + p % h->bt] != c) {
			kh_violation(h,
				     "req %llu branch %u: KV at position %u (block %d) is not its "
				     "prefix's (row [%u, %u))",
				     (unsigned long long)b->row_req[r], br, p, blk, start, end);
			break;
		}
	}
}

/* A row with k drafts: sample after each of its 1 + k tokens into
 * spec_tokens, record the accepted run and the bonus token in hist. */
static void compute_spec_row(kh_host *h, const bkv_batch *b, uint32_t r, const kh_req *q,
			     uint32_t start)
{
	const uint32_t k = b->row_drafts[r], br = b->row_branch[r];
	const int32_t q0 = b->qo_indptr[r];
	uint32_t j, m = k, idx;
	int32_t t;

	h->spec_rows++;
	h->spec_drafts += k;
	for (j = 0; j <= k; j++) {
		t = kh_sample(q, br, start + j + 1, b->token_ids[q0 + (int32_t)j]);
		if (h->token_hook)
			t = h->token_hook(h->hook_ctx, q, br, t);
		b->spec_tokens[q0 + (int32_t)j] = t;
		if (j <= m) {
			idx = start + j + 1 - q->prompt_len;
			if (idx >= q->max_new) {
				kh_violation(h, "row %u samples token %u of a request with %u", r, idx,
					     q->max_new);
				return;
			}
			((kh_req *)q)->hist[(size_t)br * q->max_new + idx] = t;
			if (t == BKV_TOKEN_FAIL)
				((kh_req *)q)->error_written = 1;
		}
		if (j < m && t != b->token_ids[q0 + (int32_t)j + 1])
			m = j; /* draft j + 1 rejected: t is the bonus */
	}
	h->spec_accepted += m;
	if (h->spec_host_accepts)
		b->n_accepted[r] = (int32_t)m;
}

int kh_draft(void *host, uint64_t req, uint32_t branch, const int32_t *ctx, uint32_t n_ctx,
	     int32_t *out, uint32_t k, void *user)
{
	kh_host *h = host;
	const kh_req *q = user;
	int32_t prev = ctx[n_ctx - 1];
	uint32_t j;

	(void)req;
	if (!q || q->magic != KH_MAGIC || (h->spec_draft_every && q->tag % h->spec_draft_every))
		return 0;
	for (j = 0; j < k; j++) {
		int32_t t = kh_sample(q, branch, n_ctx + j, prev);

		if (t == BKV_TOKEN_FAIL || kh_is_stop(q, t))
			break; /* a drafter knows nothing past an end */
		if (mix(q->tag * 31 + branch * 7919 + (n_ctx + j) * 104729 + 17) % 1000 >=
		    h->spec_accept_permille)
			t = t + 1; /* a wrong draft (the sampler never gives t + 1 here) */
		out[j] = t;
		prev = t;
	}
	return (int)j;
}

/* Pass 2 for row r: write the computed cells (wrong ones when failing) and
 * sample into next[r]. */
static void compute_row(kh_host *h, const bkv_batch *b, uint32_t r, int fail, int32_t *next)
{
	const kh_req *q = (const kh_req *)b->row_user[r];
	int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
	int32_t k0 = b->kv_indptr[r];
	uint32_t br = b->row_branch[r], start, end, p, idx;
	uint64_t c;
	int32_t t;

	next[r] = KH_JUNK;
	if (!q || q->magic != KH_MAGIC || q1 <= q0 || br >= q->n)
		return;
	start = (uint32_t)b->positions[q0];
	end = start + (uint32_t)(q1 - q0);
	if (end > q->prompt_len + q->max_new)
		return;
	if (h->verify && (!fail || h->garbage)) {
		c = chain_root(q->key);
		for (p = 0; p < end; p++) {
			int32_t blk = b->kv_indices[k0 + (int32_t)(p / h->bt)];
			int draft = p > start && b->row_drafts && b->row_drafts[r];

			c = chain(c, draft ? b->token_ids[q0 + (int32_t)(p - start)]
					   : kh_token_at(q, br, p));
			if (p >= start && blk >= 0 && (uint32_t)blk < h->nb)
				h->dev[(size_t)blk * h->bt + p % h->bt] = fail ? ~c : c;
		}
	}
	if (!b->row_sample[r] || fail)
		return;
	if (b->row_drafts && b->row_drafts[r]) {
		compute_spec_row(h, b, r, q, start);
		return;
	}
	idx = end - q->prompt_len;
	if (end < q->prompt_len || idx >= q->max_new) {
		kh_violation(h, "row %u samples token %u of a request with %u", r,
			     end < q->prompt_len ? 0 : idx, q->max_new);
		return;
	}
	t = kh_sample(q, br, end, b->token_ids[q1 - 1]);
	if (h->token_hook)
		t = h->token_hook(h->hook_ctx, q, br, t);
	((kh_req *)q)->hist[(size_t)br * q->max_new + idx] = t;
	if (t == BKV_TOKEN_FAIL)
		((kh_req *)q)->error_written = 1;
	next[r] = t;
}

int kh_compute(kh_host *h, const bkv_batch *b, int32_t *next, bkv_call_kind want)
{
	uint32_t r;
	int fail;

	h->calls++;
	if (b->layout == BKV_BATCH_PERSISTENT) {
		if (b->kv_indptr || b->kv_indices)
			kh_violation(h, "a persistent batch carries kv_indptr/kv_indices");
		if (apply_deltas(h, b) || gather_rows(h, b, &h->gathered)) {
			kh_violation(h, "out of memory mirroring the tables");
			return -1;
		}
		b = &h->gathered;
	}
	check_heads(h, b, want);
	fail = decide_fault(h, b);
	if (h->try_nested && h->sched)
		h->nested_rc = bkv_step(h->sched, NULL);
	if (fail && !h->garbage) {
		h->failed_calls++;
		undo_deltas(h, b);
		h->last_fail_kind = (int)b->kind;
		return -1;
	}
	h->now += h->tick;
	copy_cells(h, b->swap_out, b->n_swap_out, h->dev, h->nb, h->hostc, h->nh, "swap-out");
	copy_cells(h, b->swap_in, b->n_swap_in, h->hostc, h->nh, h->dev, h->nb, "swap-in");
	copy_cells(h, b->copies, b->n_copies, h->dev, h->nb, h->dev, h->nb, "device");
	for (r = 0; r < b->n_rows; r++)
		check_row(h, b, r);
	for (r = 0; r < b->n_rows; r++)
		compute_row(h, b, r, fail, next);
	if (fail) {
		h->failed_calls++;
		undo_deltas(h, b);
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

/* The record a callback names, or NULL (a violation). */
static kh_req *cb_req(kh_host *h, const char *what, uint64_t req, void *user)
{
	kh_req *q = user;
	uint64_t id;

	if (!q || q->magic != KH_MAGIC) {
		kh_violation(h, "%s: req %llu without its user pointer", what, (unsigned long long)req);
		return NULL;
	}
	id = __atomic_load_n(&q->id, __ATOMIC_ACQUIRE);
	if (id && id != req)
		kh_violation(h, "%s: req %llu carries the record of request %llu", what,
			     (unsigned long long)req, (unsigned long long)id);
	return q;
}

void kh_on_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	kh_host *h = host;
	kh_req *q;
	uint32_t idx;

	h->tokens_out++;
	q = cb_req(h, "on_token", req, user);
	if (!q)
		return;
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

void kh_on_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	kh_host *h = host;
	kh_req *q;
	uint32_t b;

	h->finished++;
	q = cb_req(h, "on_finish", req, user);
	if (!q)
		return;
	if (q->finished++) {
		kh_violation(h, "on_finish: req %llu ended twice", (unsigned long long)req);
		return;
	}
	q->reason = (int)why;
	if ((unsigned)why < 4)
		h->by_reason[why]++;
	switch (why) {
	case BKV_FINISH_ABORT:
		if (!h->aborts_unrecorded && !__atomic_load_n(&q->abort_asked, __ATOMIC_RELAXED))
			kh_violation(h, "req %llu aborted without an abort", (unsigned long long)req);
		break;
	case BKV_FINISH_ERROR:
		if (!q->error_written && !h->unadmittable_ok)
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

bkv_host_ops kh_ops(int split)
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
	o.draft = kh_draft; /* read only with BKV_SPEC_DRAFT_HOST */
	return o;
}
