/*
 * inbox.c - requests in: bkv_submit and bkv_abort (any thread), the batch
 * buffers sized for the largest request, and the stepping thread's drain.
 *
 * Requests arrive from any thread through bkv_submit, which validates and
 * copies them (one allocation: the request, its lanes, its stop tokens and a
 * token history per lane, sized prompt + max_new so a step never grows it),
 * gives them an id from a counter and links them onto the inbox under a short
 * mutex. A request larger than any before also prepares, under the lock, a
 * larger set of batch buffers that the step swaps in at drain time, so the
 * step never allocates. bkv_abort looks the id up in the id map (under the
 * same mutex) and links the request onto the abort list. Nothing else takes
 * the lock: the stepping thread splices both lists out at the start of a step
 * (drain): new requests into the queue, aborts ended at once (ABORT).
 */
#include "sched/batch.h"
#include "decide/decide.h"

#include <stddef.h>
#include <string.h>

/* ---- buffers ------------------------------------------------------------- */

void bkv__bufs_free(const bkv_allocator *a, bkv__bufs *b)
{
	bkv__free(a, b->token_ids, (size_t)b->tok_cap * sizeof(int32_t));
	bkv__free(a, b->positions, (size_t)b->tok_cap * sizeof(int32_t));
	bkv__free(a, b->slot_mapping, (size_t)b->ng * b->tok_cap * sizeof(int32_t));
	bkv__free(a, b->kv_indices,
		  (size_t)b->ng * ((size_t)b->kv_cap + BKV__KV_SLACK) * sizeof(int32_t));
	memset(b, 0, sizeof(*b));
}

int bkv__bufs_alloc(const bkv_allocator *a, bkv__bufs *b, uint32_t tok_cap, uint32_t kv_cap,
		    uint32_t ng)
{
	memset(b, 0, sizeof(*b));
	b->tok_cap = tok_cap;
	b->kv_cap = kv_cap;
	b->ng = ng;
	b->token_ids = bkv__malloc(a, (size_t)tok_cap * sizeof(int32_t));
	b->positions = bkv__malloc(a, (size_t)tok_cap * sizeof(int32_t));
	b->slot_mapping = bkv__malloc(a, (size_t)ng * tok_cap * sizeof(int32_t));
	b->kv_indices = bkv__malloc(a, (size_t)ng * ((size_t)kv_cap + BKV__KV_SLACK) *
					       sizeof(int32_t));
	if (!b->token_ids || !b->positions || !b->slot_mapping || !b->kv_indices) {
		bkv__bufs_free(a, b);
		return BKV_ENOMEM;
	}
	return BKV_OK;
}

void bkv__call_arrays_free(const bkv_allocator *a, size_t rc, bkv__call_arrays *x)
{
	bkv__bufs_free(a, &x->bufs);
	bkv__free(a, x->qo_indptr, (rc + 1) * sizeof(int32_t));
	bkv__free(a, x->kv_indptr, (rc + 1) * sizeof(int32_t));
	bkv__free(a, x->last_page_len, rc * sizeof(int32_t));
	bkv__free(a, x->row_sample, rc * sizeof(uint8_t));
	bkv__free(a, x->row_req, rc * sizeof(uint64_t));
	bkv__free(a, x->row_branch, rc * sizeof(uint32_t));
	bkv__free(a, x->row_user, rc * sizeof(void *));
	bkv__free(a, x->next_tokens, rc * sizeof(int32_t));
	bkv__free(a, x->chunks, rc * sizeof(bkv_chunk_shape));
	bkv__free(a, x->row_adapter, rc * sizeof(uint32_t));
	bkv__free(a, x->adapters, rc * sizeof(uint32_t));
	memset(x, 0, sizeof(*x));
}

int bkv__call_arrays_alloc(const bkv_allocator *a, size_t rc, uint32_t tok_cap, uint32_t kv_cap,
			   uint32_t ng, bkv__call_arrays *x)
{
	x->qo_indptr = bkv__calloc(a, rc + 1, sizeof(int32_t));
	x->kv_indptr = bkv__calloc(a, rc + 1, sizeof(int32_t));
	x->last_page_len = bkv__calloc(a, rc, sizeof(int32_t));
	x->row_sample = bkv__calloc(a, rc, sizeof(uint8_t));
	x->row_req = bkv__calloc(a, rc, sizeof(uint64_t));
	x->row_branch = bkv__calloc(a, rc, sizeof(uint32_t));
	x->row_user = bkv__calloc(a, rc, sizeof(void *));
	x->next_tokens = bkv__calloc(a, rc, sizeof(int32_t));
	x->chunks = bkv__calloc(a, rc, sizeof(bkv_chunk_shape));
	x->row_adapter = bkv__calloc(a, rc, sizeof(uint32_t));
	x->adapters = bkv__calloc(a, rc, sizeof(uint32_t));
	if (!x->qo_indptr || !x->kv_indptr || !x->last_page_len || !x->row_sample || !x->row_req ||
	    !x->row_branch || !x->row_user || !x->next_tokens || !x->chunks || !x->row_adapter ||
	    !x->adapters)
		return BKV_ENOMEM;
	return bkv__bufs_alloc(a, &x->bufs, tok_cap, kv_cap, ng);
}

/* Token and block entries one call may need for requests whose history (prompt
 * + max_new) is hist: every row is at most one lane's whole history. Returns
 * nonzero when the kv_indices entries would pass KV_CAP_LIMIT (then *kv is
 * capped there and such a request must be refused: a step could need more). */
#define KV_CAP_LIMIT (UINT32_MAX / 8)
int bkv__bufs_need(const bkv_sched *s, uint64_t hist, uint32_t *tok, uint32_t *kv)
{
	uint64_t t, k, dev_tokens = (uint64_t)s->device_blocks * s->bt;

	if (s->cfg.chunked_prefill)
		t = BKV_MAX(s->cfg.token_budget, s->plan.row_cap);
	else
		t = (uint64_t)s->cfg.max_running * BKV_MIN(hist, dev_tokens) + s->plan.row_cap;
	if (s->cfg.spec_max_k) /* drafts: up to spec_max_k more per row */
		t += (uint64_t)s->cfg.max_running * s->cfg.spec_max_k;
	t = BKV_MIN(t, (uint64_t)s->in.tok_limit);
	t = BKV_MAX(t, (uint64_t)s->plan.row_cap);
	k = (uint64_t)s->cfg.max_running * ((hist + s->bt - 1) / s->bt) + s->plan.row_cap;
	*tok = (uint32_t)t;
	*kv = k > KV_CAP_LIMIT ? KV_CAP_LIMIT : (uint32_t)k;
	return k > KV_CAP_LIMIT;
}

/* ---- submit / abort (any thread) ----------------------------------------- */

/* The request's retention ranges: none when its size ends before them
 * (a caller built against the struct without them). */
static uint32_t ret_count(const bkv_request *q)
{
	if (q->size < offsetof(bkv_request, adapter) + sizeof(q->adapter))
		return 0;
	return q->n_retention;
}

#define RQ "bkv_request."

/* The request's encoder inputs: none when its size ends before them. */
static uint32_t req_n_inputs(const bkv_request *q)
{
	return q->size < offsetof(bkv_request, inputs) + sizeof(q->inputs) ? 0 : q->n_inputs;
}

/* The request's adapter: 0 when its size ends before the field. */
static uint32_t req_adapter(const bkv_request *q)
{
	return q->size < offsetof(bkv_request, adapter) + sizeof(q->adapter) ? 0 : q->adapter;
}
#define RR "bkv_retention_range[%u]."
#define REFUSE(...) return bkv__fail(BKV_EINVAL, __VA_ARGS__)

/* One range: inside the prompt, its priority in scale, pad zero. */
static int range_check(const bkv_request *q, const bkv_retention_range *a, uint32_t i)
{
	if (a->token_start >= a->token_end)
		REFUSE(RR "token_start = %u: must be < token_end (%u)", i, a->token_start,
		       a->token_end);
	if (a->token_end > q->prompt_len)
		REFUSE(RR "token_end = %u: must be <= bkv_request.prompt_len (%u)", i, a->token_end,
		       q->prompt_len);
	if (a->priority > BKV_RETENTION_PRIORITY_MAX)
		REFUSE(RR "priority = %u: must be in 0..%u", i, a->priority,
		       BKV_RETENTION_PRIORITY_MAX);
	if (a->pad)
		REFUSE(RR "pad = %u: must be 0", i, a->pad);
	return BKV_OK;
}

/* Ranges inside the prompt, priorities in scale, no two overlapping, and
 * only on a scheduler with retention on: BKV_OK, or BKV_EINVAL naming the
 * field (bkv_last_error). */
static int ret_check(const bkv_sched *s, const bkv_request *q)
{
	uint32_t n = ret_count(q), i, j;

	if (!n)
		return BKV_OK;
	if (!s->cfg.retention)
		REFUSE(RQ "n_retention = %u needs bkv_sched_config.retention", n);
	if (n > BKV_RETENTION_MAX_RANGES)
		REFUSE(RQ "n_retention = %u: must be in 0..%u", n, BKV_RETENTION_MAX_RANGES);
	if (!q->retention)
		REFUSE(RQ "retention = NULL with n_retention = %u", n);
	for (i = 0; i < n; i++) {
		const bkv_retention_range *a = &q->retention[i];

		if (range_check(q, a, i) != BKV_OK)
			return BKV_EINVAL;
		for (j = 0; j < i; j++) {
			const bkv_retention_range *b = &q->retention[j];

			if (a->token_start < b->token_end && b->token_start < a->token_end)
				REFUSE(RR "token_start = %u: overlaps bkv_retention_range[%u] "
				       "(%u..%u)", i, a->token_start, j, b->token_start, b->token_end);
		}
	}
	return BKV_OK;
}

static int request_check(const bkv_sched *s, const bkv_request *q)
{
	int rc;

	if (q->size < offsetof(bkv_request, retention))
		REFUSE(RQ "size = %u: must be sizeof(bkv_request) (call bkv_request_init)", q->size);
	if (!q->prompt)
		REFUSE(RQ "prompt = NULL: needs prompt_len tokens");
	if (q->prompt_len == 0)
		REFUSE(RQ "prompt_len = 0: must be >= 1");
	if (q->max_new_tokens == 0)
		REFUSE(RQ "max_new_tokens = 0: must be >= 1");
	if (q->n == 0)
		REFUSE(RQ "n = 0: must be >= 1");
	if (q->n_stop && !q->stop_tokens)
		REFUSE(RQ "stop_tokens = NULL with n_stop = %u", q->n_stop);
	if (req_adapter(q) && !s->cfg.max_adapters)
		REFUSE(RQ "adapter = %u needs bkv_sched_config.max_adapters", req_adapter(q));
	rc = bkv__enc_request_check(s, q, req_n_inputs(q));
	if (rc != BKV_OK)
		return rc;
	return ret_check(s, q);
}

/* Copy q into one allocation: the request, its lanes, its stop tokens,
 * then n token histories of hist tokens each holding the prompt. NULL on
 * ENOMEM. */
static bkv__req *req_copy(bkv_sched *s, const bkv_request *q, uint64_t hist)
{
	uint64_t bytes;
	size_t size;
	uint32_t i;
	bkv__req *r;

	uint32_t n_ret = ret_count(q), n_enc = req_n_inputs(q);

	bytes = sizeof(bkv__req) + (uint64_t)q->n * sizeof(bkv__lane) +
		(uint64_t)n_ret * sizeof(bkv_retention_range) +
		(uint64_t)n_enc * sizeof(bkv__enc_use) +
		(uint64_t)q->n_stop * sizeof(int32_t) + (uint64_t)q->n * hist * sizeof(int32_t);
	if (bytes > SIZE_MAX / 2)
		return NULL;
	size = (size_t)bytes;
	r = bkv__malloc(&s->alloc, size);
	if (!r)
		return NULL;
	memset(r, 0, sizeof(*r));
	r->alloc_size = size;
	r->priority = q->priority;
	r->prompt_len = q->prompt_len;
	r->max_new = q->max_new_tokens;
	r->n = q->n;
	r->n_live = q->n;
	r->n_stop = q->n_stop;
	r->adapter = req_adapter(q);
	r->cache_key = bkv_adapter_cache_key(q->cache_key, r->adapter);
	r->user = q->user;
	r->predicted_output = q->predicted_output;
	r->state = BKV__REQ_INBOX;
	r->heap_idx = UINT32_MAX;
	r->age_idx = UINT32_MAX;
	r->n_ret = n_ret;
	r->ret = n_ret ? (bkv_retention_range *)(void *)&r->lane[q->n] : NULL;
	if (n_ret)
		memcpy(r->ret, q->retention, (size_t)n_ret * sizeof(bkv_retention_range));
	r->n_enc = n_enc;
	r->enc = n_enc ? (bkv__enc_use *)(void *)((char *)&r->lane[q->n] +
						  (size_t)n_ret * sizeof(bkv_retention_range))
		       : NULL;
	r->stop = (int32_t *)(void *)((char *)&r->lane[q->n] +
				      (size_t)n_ret * sizeof(bkv_retention_range) +
				      (size_t)n_enc * sizeof(bkv__enc_use));
	if (q->n_stop)
		memcpy(r->stop, q->stop_tokens, (size_t)q->n_stop * sizeof(int32_t));
	for (i = 0; i < q->n; i++) {
		bkv__lane *l = &r->lane[i];

		memset(l, 0, sizeof(*l));
		l->req = r;
		l->branch = i;
		l->seq = BKV__SEQ_NONE;
		l->row_slot = BKV__SLOT_NONE;
		l->def_seq = BKV__SEQ_NONE;
		l->tok = r->stop + q->n_stop + (size_t)i * hist;
		memcpy(l->tok, q->prompt, (size_t)q->prompt_len * sizeof(int32_t));
	}
	if (n_enc)
		bkv__enc_copy(r, q, (uint32_t)hist);
	return r;
}

/* Lock held: when a request needs larger batch arrays than any before
 * (tok, kv entries), prepare them as the spare set, grown geometrically;
 * the step swaps the spare in when it drains this request, so bkv_step
 * itself never allocates. BKV_OK or BKV_ENOMEM (nothing changed). */
static int spare_grow(bkv_sched *s, uint32_t tok, uint32_t kv)
{
	bkv__bufs nb[BKV__OVL_SETS];
	uint32_t i, n;

	if (tok <= s->in.want_tok && kv <= s->in.want_kv)
		return BKV_OK;
	tok = BKV_MAX(tok, BKV_MIN(s->in.want_tok * 2u, s->in.tok_limit));
	kv = BKV_MAX(kv, s->in.want_kv > UINT32_MAX / 16 ? kv : s->in.want_kv * 2u);
	n = s->ovl ? s->cfg.overlap + 1 : 1; /* overlap: every set grows */
	for (i = 0; i < n; i++) {
		if (bkv__bufs_alloc(&s->alloc, &nb[i], tok, kv, 1 + s->call.n_lanes) != BKV_OK) {
			while (i--)
				bkv__bufs_free(&s->alloc, &nb[i]);
			return BKV_ENOMEM;
		}
	}
	for (i = 0; i < n; i++) {
		bkv__bufs_free(&s->alloc, &s->in.spare[i]);
		s->in.spare[i] = nb[i];
	}
	s->in.want_tok = tok;
	s->in.want_kv = kv;
	return BKV_OK;
}

/* Lock held: give r the next id, map it and link it onto the inbox. */
static uint64_t inbox_push(bkv_sched *s, bkv__req *r)
{
	uint64_t id = ++s->in.next_id;

	r->id = id;
	bkv__map_put(s->in.map, s->in.map_cap, id, r);
	s->in.map_count++;
	if (s->in.inbox_tail)
		s->in.inbox_tail->next = r;
	else
		s->in.inbox_head = r;
	s->in.inbox_tail = r;
	ATOMIC_ADD(&s->in.nr_queued, 1);
	ATOMIC_ADD(&s->in.nr_alive, 1);
	ATOMIC_ADD(&s->in.submitted, 1);
	return id;
}

/* Could the request ever run, all n branches at once? BKV_OK with *tok and
 * *kv the step arrays it needs, or BKV_E2BIG naming what is too big. */
static int fits_check(const bkv_sched *s, const bkv_request *q, uint64_t hist, uint32_t *tok,
		      uint32_t *kv)
{
	/* Each of the n lanes may have to be recomputed on its own, so all n
	 * whole histories must fit at once for the request to finish alone.
	 * group 0's blocks: with KV groups a request that passes may still
	 * find no room for every group's blocks even alone; it then ends as
	 * unadmittable (BKV_FINISH_ERROR). A STATE group's units must carry
	 * its branches (bkv__pool_state_units). */
	uint64_t blocks = (hist + s->bt - 1) / s->bt * q->n;
	uint32_t units = bkv__pool_state_units(s->pool);

	if (hist > INT32_MAX)
		return bkv__fail(BKV_E2BIG, RQ "prompt_len + max_new_tokens = %llu: must be <= "
				 "2^31 - 1", (unsigned long long)hist);
	if (blocks > bkv__pool_attn_blocks(s->pool))
		return bkv__fail(BKV_E2BIG, RQ "n x (prompt_len + max_new_tokens) needs %llu blocks, "
				 "the pool has %u", (unsigned long long)blocks,
				 bkv__pool_attn_blocks(s->pool));
	if (q->n > s->cfg.max_running || q->n > bkv__pool_max_seqs(s->pool) ||
	    (units && 4ull * q->n > units))
		return bkv__fail(BKV_E2BIG, RQ "n = %u: more branches than bkv_sched_config."
				 "max_running (%u), bkv_pool_config.max_seqs (%u) or a quarter of "
				 "the STATE units (%u) allow", q->n, s->cfg.max_running,
				 bkv__pool_max_seqs(s->pool), units);
	/* a step's block-table array could not hold max_running such histories */
	if (bkv__bufs_need(s, hist, tok, kv))
		return bkv__fail(BKV_E2BIG, RQ "prompt_len + max_new_tokens = %llu: max_running (%u) "
				 "such histories overflow a step's block-table array",
				 (unsigned long long)hist, s->cfg.max_running);
	return BKV_OK;
}

int bkv_submit(bkv_sched *s, const bkv_request *q, uint64_t *req_id)
{
	uint64_t hist, id = 0;
	uint32_t tok = 0, kv = 0;
	bkv__req *r;
	int rc = BKV_OK;

	bkv__error_clear();
	if (!s || !q)
		REFUSE("bkv_submit: %s is NULL", s ? "req" : "sched");
	if ((rc = request_check(s, q)) != BKV_OK)
		return rc;
	hist = (uint64_t)q->prompt_len + q->max_new_tokens;
	if ((rc = fits_check(s, q, hist, &tok, &kv)) != BKV_OK)
		return rc;
	r = req_copy(s, q, hist);
	if (!r)
		return BKV_ENOMEM;
	if (s->cn && bkv__cn_req_init(s, r) != BKV_OK) {
		bkv__req_free(s, r);
		return BKV_ENOMEM;
	}
	LOCK(s);
	if (ATOMIC_LOAD(&s->in.nr_queued) >= s->cfg.max_queue)
		rc = BKV_EAGAIN;
	else if (bkv__map_reserve(s) != BKV_OK || spare_grow(s, tok, kv) != BKV_OK)
		rc = BKV_ENOMEM;
	else
		id = inbox_push(s, r);
	if (rc == BKV_OK)
		bkv__wait_signal(s);
	UNLOCK(s);
	if (rc != BKV_OK) {
		bkv__req_free(s, r);
		return rc;
	}
	if (req_id)
		*req_id = id;
	return BKV_OK;
}

int bkv_abort(bkv_sched *s, uint64_t req_id)
{
	bkv__slot *e;
	int rc = BKV_OK;

	if (!s || req_id == 0)
		return BKV_EINVAL;
	LOCK(s);
	e = bkv__map_find(s, req_id);
	if (!e || e->req->abort_state != 0) {
		rc = BKV_ENOENT;
	} else {
		e->req->abort_state = 1;
		e->req->abort_next = s->in.abort_head;
		s->in.abort_head = e->req;
	}
	UNLOCK(s);
	return rc;
}

/* ---- drain --------------------------------------------------------------- */

void bkv__drain(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	bkv__req *in, *ab, *r, *next, *rev = NULL;
	bkv__bufs old[BKV__OVL_SETS]; /* [n_old] */
	uint32_t batch_slots = 0, queued_with, i, n_old = 0;

	if (s->cfg.retention)
		bkv__pool_retain_now(s->pool, now); /* retention expiries */
	LOCK(s);
	in = s->in.inbox_head;
	s->in.inbox_head = s->in.inbox_tail = NULL;
	ab = s->in.abort_head;
	s->in.abort_head = NULL;
	for (r = ab; r; r = r->abort_next)
		r->abort_state = 2;
	if (s->ovl) {
		n_old = bkv__ovl_spares(s, old); /* sets, some maybe in flight */
	} else if (s->in.spare[0].tok_cap) {
		old[n_old++] = s->call.arr.bufs;
		s->call.arr.bufs = s->in.spare[0];
		memset(&s->in.spare[0], 0, sizeof(s->in.spare[0]));
	}
	UNLOCK(s);
	for (i = 0; i < n_old; i++)
		bkv__bufs_free(&s->alloc, &old[i]);

	/* the slots queued once this batch is in: its requests arrived
	 * together, so each may wait behind all of them (the auto bypass
	 * bound, policy.c) */
	for (r = in; r; r = r->next)
		batch_slots += r->n_live;
	queued_with = s->q.queue_slots + batch_slots;
	if (s->cn) /* those that waited for the store's answer first */
		bkv__cn_drain(s, now);
	for (r = in; r; r = next) {
		next = r->next;
		r->next = NULL;
		r->state = BKV__REQ_WAITING;
		r->order = ++s->q.arrival;
		r->enq_us = now;
		r->queued_with = queued_with;
		if (s->cn && bkv__cn_ask(s, r))
			continue; /* asked again at the next drain */
		bkv__queue_push(s, r);
	}
	/* the abort list is LIFO; end them in the order they were asked */
	for (r = ab; r; r = next) {
		next = r->abort_next;
		r->abort_next = rev;
		rev = r;
	}
	for (r = rev; r; r = next) {
		next = r->abort_next;
		if (r->zombie && s->plan.fenced) {
			r->next = NULL; /* overlap: an outstanding step may name it */
			bkv__ovl_hold(s, r);
		} else if (r->zombie) {
			bkv__req_free(s, r); /* ended before the abort was drained */
		} else {
			bkv__finish_req(s, r, BKV_FINISH_ABORT, si);
		}
	}
	bkv__run_compact(s);
}
