/*
 * encoder.c - encoder inputs (images, audio): their outputs must exist
 * before a chunk that reads them is prefilled, the encoder's work per step
 * is budgeted (bkv_sched_config.encoder_budget) and the host's encoder
 * cache has a capacity in tokens (encoder_cache).
 *
 * An input fills a span of prompt positions with its encoder's outputs. At
 * submit the library writes bkv_encoder_token(cache_id, i) into those
 * positions of the request's history, so the prefix cache (which hashes and
 * verifies tokens) keys the span's KV by the input's content: two requests
 * share it only for the same image at the same place after the same prefix.
 *
 * The cache. An entry per cached input {id, len, refs, state}: NEED (room
 * taken, outputs not computed: new, or its encoding was rolled back), SCHED
 * (a step encodes it; sent in that step's call) and READY (committed). A
 * running request holds a reference on each input it still reads; entries
 * with no reference stay cached for hits, on an LRU list, and are evicted
 * (their ids sent in bkv_batch.encoder_free) when a new input needs room or
 * an entry. SCHED entries are never evicted: the host may be encoding
 * them. An id-to-entry hash (open addressing, backward-shift deletion)
 * finds hits; nothing here scans the cache or the requests.
 *
 * The gate (bkv__enc_cut). Planning sizes a prefill chunk [a, a + c) of a
 * lane as before, then asks the gate: for each input whose span meets the
 * chunk, in order, take a reference (a hit, or a new NEED entry after
 * evictions), and schedule a NEED entry's encoding if the step's budget
 * has room. The first input that gets neither room nor budget cuts the
 * chunk at its start (to nothing without chunked prefill, where a prompt
 * runs whole or waits). Submit refuses inputs that could never pass:
 * longer than the cache or costlier than the budget (and, without chunked
 * prefill, a prompt whose inputs together are), so a step with nothing
 * else scheduled always passes the first input it meets.
 *
 * References end when the request leaves the running set, and, for a
 * one-branch request, once its KV passes the input's end: at the next gate,
 * or at the next step's start for the inputs its last chunk passed (not in
 * the same step: an input evicted then would be dropped before the call
 * that reads it). A rolled-back step turns its SCHED entries back to NEED;
 * a step's encodings become READY when it commits (overlap: on completion).
 * Encodings planned for rows that no call carried go back to NEED at the
 * step's end.
 */
#include "sched/sched.h"

#include <string.h>

#define ENC_NEED 0u
#define ENC_SCHED 1u
#define ENC_READY 2u
#define NIL UINT32_MAX
#define MIN_ENTRIES 64u /* entries at least (and 8 a running request) */

typedef struct bkv__enc_entry {
	uint64_t id;    /* cache_id; 0 = a free entry */
	uint64_t step;  /* SCHED: the step encoding it */
	uint32_t len;   /* cache tokens it takes */
	uint32_t refs;  /* running requests' inputs holding it */
	uint32_t prev;  /* LRU links while refs == 0 (NIL ends); next also */
	uint32_t next;  /* links the free entries */
	uint8_t state;  /* ENC_* */
	uint8_t in_lru; /* on the LRU list (exactly when refs == 0 but for
			   a new entry, held at once) */
} bkv__enc_entry;

struct bkv__enc {
	bkv__enc_entry *e;    /* [cap] */
	uint32_t cap;         /* entries */
	uint32_t *idx;        /* [hmask + 1] entry + 1 by id hash; 0 empty */
	uint32_t hmask;       /* hash slots - 1 (a power of two >= 2 cap) */
	uint32_t free_head;   /* free entries, linked by next */
	uint32_t lru_head;    /* refs == 0 entries, least recent first */
	uint32_t lru_tail;
	uint64_t used;        /* tokens the entries take */
	uint32_t budget_left; /* this step's encoder work left */
	bkv_encode *work;     /* this step's inputs to encode: work_buf[side] */
	uint32_t n_work;
	uint32_t work_sent;   /* of which already in a call */
	uint32_t *unc;        /* [cap] SCHED entries not committed */
	uint32_t n_unc;
	uint64_t *frees;      /* [2 cap] evicted ids no call carried yet */
	uint32_t n_free;
	/* The lists a call points to stay valid until its step completes:
	 * with overlap later steps are planned before, so each batch buffer
	 * set has its own (side: the set s->call holds, bkv__ovl_cur) */
	uint32_t n_sides;     /* 2, or depth + 1 with overlap */
	bkv_encode *work_buf[BKV__OVL_SETS]; /* [cap] each of n_sides */
	uint64_t *said[BKV__OVL_SETS]; /* [2 cap] each: the frees the step's calls
				      carry */
	uint32_t n_said;      /* entries of said[side] this step */
	uint32_t side;        /* this step's set */
	uint64_t runs;        /* inputs sent to encode (bkv_sched_stats) */
	uint64_t evictions;   /* entries evicted (bkv_sched_stats) */
	bkv__req **rel;       /* [max_running] requests whose passed inputs
				 go at the next step's start */
	uint32_t n_rel;
};

/* ---- the ids ---------------------------------------------------------------- */

int32_t bkv_encoder_token(uint64_t cache_id, uint32_t i)
{
	uint64_t h = bkv__fmix64(cache_id ^ (0x8cb92ba72f3d8dd7ull * ((uint64_t)i + 1u)));

	/* [-(2^31 - 1), -2^23]: below BKV_TOKEN_FAIL and the placeholders */
	return -(int32_t)(0x800000u + (uint32_t)(h % (0x80000000ull - 0x800000u)));
}

/* ---- create / destroy -------------------------------------------------------- */

int bkv__enc_alloc(bkv_sched *s)
{
	struct bkv__enc *c;
	uint64_t cap;
	uint32_t i, h = 1;

	if (!s->cfg.encoder_cache)
		return BKV_OK;
	c = bkv__calloc(&s->alloc, 1, sizeof(*c));
	if (!c)
		return BKV_ENOMEM;
	s->enc = c;
	cap = BKV_MAX((uint64_t)MIN_ENTRIES, 8ull * s->cfg.max_running);
	c->cap = (uint32_t)BKV_MIN(cap, (uint64_t)s->cfg.encoder_cache + BKV_MAX_ENCODER_INPUTS);
	while (h < 2 * c->cap)
		h <<= 1;
	c->hmask = h - 1;
	c->e = bkv__calloc(&s->alloc, c->cap, sizeof(bkv__enc_entry));
	c->idx = bkv__calloc(&s->alloc, h, sizeof(uint32_t));
	c->n_sides = s->cfg.overlap ? s->cfg.overlap + 1 : 2;
	for (i = 0; i < c->n_sides; i++) {
		c->work_buf[i] = bkv__calloc(&s->alloc, c->cap, sizeof(bkv_encode));
		c->said[i] = bkv__calloc(&s->alloc, 2 * (size_t)c->cap, sizeof(uint64_t));
		if (!c->work_buf[i] || !c->said[i])
			return BKV_ENOMEM;
	}
	c->work = c->work_buf[0];
	c->unc = bkv__calloc(&s->alloc, c->cap, sizeof(uint32_t));
	c->frees = bkv__calloc(&s->alloc, 2 * (size_t)c->cap, sizeof(uint64_t));
	c->rel = bkv__calloc(&s->alloc, s->cfg.max_running, sizeof(bkv__req *));
	if (!c->e || !c->idx || !c->unc || !c->frees || !c->rel)
		return BKV_ENOMEM;
	for (i = 0; i < c->cap; i++)
		c->e[i].next = i + 1 < c->cap ? i + 1 : NIL;
	c->free_head = 0;
	c->lru_head = c->lru_tail = NIL;
	return BKV_OK;
}

void bkv__enc_free(bkv_sched *s)
{
	struct bkv__enc *c = s->enc;
	const bkv_allocator *a = &s->alloc;
	uint32_t i;

	if (!c)
		return;
	bkv__free(a, c->e, (size_t)c->cap * sizeof(bkv__enc_entry));
	bkv__free(a, c->idx, ((size_t)c->hmask + 1) * sizeof(uint32_t));
	for (i = 0; i < c->n_sides; i++) {
		bkv__free(a, c->work_buf[i], (size_t)c->cap * sizeof(bkv_encode));
		bkv__free(a, c->said[i], 2 * (size_t)c->cap * sizeof(uint64_t));
	}
	bkv__free(a, c->unc, (size_t)c->cap * sizeof(uint32_t));
	bkv__free(a, c->frees, 2 * (size_t)c->cap * sizeof(uint64_t));
	bkv__free(a, c->rel, (size_t)s->cfg.max_running * sizeof(bkv__req *));
	bkv__free(a, c, sizeof(*c));
	s->enc = NULL;
}

/* ---- submit ------------------------------------------------------------------- */

#define RQ "bkv_request."
#define REFUSE(code, ...) return bkv__fail(code, __VA_ARGS__)

int bkv__enc_request_check(const bkv_sched *s, const bkv_request *q, uint32_t n)
{
	uint64_t len = 0, cost = 0;
	uint32_t i, prev_end = 0;

	if (!n)
		return BKV_OK;
	if (!s->cfg.encoder_cache)
		REFUSE(BKV_EINVAL, RQ "n_inputs = %u needs bkv_sched_config.encoder_cache", n);
	if (n > BKV_MAX_ENCODER_INPUTS)
		REFUSE(BKV_EINVAL, RQ "n_inputs = %u: must be in 0..%u", n, BKV_MAX_ENCODER_INPUTS);
	if (!q->inputs)
		REFUSE(BKV_EINVAL, RQ "inputs = NULL with n_inputs = %u", n);
	for (i = 0; i < n; i++) {
		const bkv_encoder_input *u = &q->inputs[i];
		uint32_t c = u->cost ? u->cost : u->token_len;

		if (!u->cache_id || !u->token_len || u->pad || u->token_start < prev_end ||
		    u->token_len > q->prompt_len - u->token_start || u->token_start >= q->prompt_len)
			REFUSE(BKV_EINVAL, RQ "inputs[%u]: cache_id nonzero, token_len >= 1, pad 0, "
			       "the span inside the prompt and after the previous input's", i);
		if (u->token_len > s->cfg.encoder_cache)
			REFUSE(BKV_E2BIG, RQ "inputs[%u].token_len = %u: more than encoder_cache "
			       "(%u)", i, u->token_len, s->cfg.encoder_cache);
		if (s->cfg.encoder_budget && c > s->cfg.encoder_budget)
			REFUSE(BKV_E2BIG, RQ "inputs[%u]: cost %u, more than encoder_budget (%u)", i,
			       c, s->cfg.encoder_budget);
		prev_end = u->token_start + u->token_len;
		len += u->token_len;
		cost += c;
	}
	if (!s->cfg.chunked_prefill &&
	    (len > s->cfg.encoder_cache || (s->cfg.encoder_budget && cost > s->cfg.encoder_budget)))
		REFUSE(BKV_E2BIG, RQ "inputs: without chunked prefill a prompt's inputs (%llu tokens, "
		       "cost %llu) must fit encoder_cache and encoder_budget together",
		       (unsigned long long)len, (unsigned long long)cost);
	return BKV_OK;
}

void bkv__enc_copy(bkv__req *r, const bkv_request *q, uint32_t hist)
{
	uint32_t i, j, b;

	(void)hist;
	for (i = 0; i < r->n_enc; i++) {
		const bkv_encoder_input *u = &q->inputs[i];
		bkv__enc_use *e = &r->enc[i];

		e->id = u->cache_id;
		e->start = u->token_start;
		e->end = u->token_start + u->token_len;
		e->cost = u->cost ? u->cost : u->token_len;
		e->entry = NIL;
		e->held = 0;
		for (b = 0; b < r->n; b++)
			for (j = e->start; j < e->end; j++)
				r->lane[b].tok[j] = bkv_encoder_token(e->id, j - e->start);
	}
}

/* ---- the cache -------------------------------------------------------------- */

static uint32_t find(const struct bkv__enc *c, uint64_t id)
{
	uint32_t h = (uint32_t)bkv__fmix64(id) & c->hmask;

	for (; c->idx[h]; h = (h + 1) & c->hmask)
		if (c->e[c->idx[h] - 1].id == id)
			return c->idx[h] - 1;
	return NIL;
}

static void index_put(struct bkv__enc *c, uint32_t e)
{
	uint32_t h = (uint32_t)bkv__fmix64(c->e[e].id) & c->hmask;

	while (c->idx[h])
		h = (h + 1) & c->hmask;
	c->idx[h] = e + 1;
}

/* Backward-shift deletion: the run after the hole moves up where its
 * entries' home slots allow. */
static void index_del(struct bkv__enc *c, uint32_t e)
{
	uint32_t h = (uint32_t)bkv__fmix64(c->e[e].id) & c->hmask, j, home;

	while (c->idx[h] != e + 1)
		h = (h + 1) & c->hmask;
	for (j = (h + 1) & c->hmask; c->idx[j]; j = (j + 1) & c->hmask) {
		home = (uint32_t)bkv__fmix64(c->e[c->idx[j] - 1].id) & c->hmask;
		/* movable to h unless home lies cyclically in (h, j] */
		if (((j - home) & c->hmask) >= ((j - h) & c->hmask)) {
			c->idx[h] = c->idx[j];
			h = j;
		}
	}
	c->idx[h] = 0;
}

static void lru_unlink(struct bkv__enc *c, uint32_t e)
{
	bkv__enc_entry *x = &c->e[e];

	if (x->prev != NIL)
		c->e[x->prev].next = x->next;
	else
		c->lru_head = x->next;
	if (x->next != NIL)
		c->e[x->next].prev = x->prev;
	else
		c->lru_tail = x->prev;
	x->prev = x->next = NIL;
	x->in_lru = 0;
}

static void lru_push(struct bkv__enc *c, uint32_t e)
{
	bkv__enc_entry *x = &c->e[e];

	x->next = NIL;
	x->in_lru = 1;
	x->prev = c->lru_tail;
	if (c->lru_tail != NIL)
		c->e[c->lru_tail].next = e;
	else
		c->lru_head = e;
	c->lru_tail = e;
}

static void unc_remove(struct bkv__enc *c, uint32_t e)
{
	uint32_t i;

	for (i = 0; i < c->n_unc; i++)
		if (c->unc[i] == e) {
			c->unc[i] = c->unc[--c->n_unc];
			return;
		}
}

/* Evict the least recently used entry no one holds and no step encodes.
 * 0 when there is none (or no room to say so to the host). */
static int evict_one(struct bkv__enc *c)
{
	uint32_t e = c->lru_head;

	while (e != NIL && c->e[e].state == ENC_SCHED)
		e = c->e[e].next;
	if (e == NIL || c->n_free == 2 * c->cap)
		return 0;
	lru_unlink(c, e);
	index_del(c, e);
	c->used -= c->e[e].len;
	c->frees[c->n_free++] = c->e[e].id;
	c->evictions++;
	c->e[e].id = 0;
	c->e[e].next = c->free_head;
	c->free_head = e;
	return 1;
}

/* A new NEED entry for id (len tokens), after evictions; NIL if no room. */
static uint32_t entry_new(struct bkv__enc *c, uint64_t id, uint32_t len, uint32_t cache)
{
	uint32_t e, i;

	while (c->used + len > cache || c->free_head == NIL)
		if (!evict_one(c))
			return NIL;
	e = c->free_head;
	c->free_head = c->e[e].next;
	memset(&c->e[e], 0, sizeof(c->e[e]));
	c->e[e].id = id;
	c->e[e].len = len;
	c->e[e].state = ENC_NEED;
	c->e[e].prev = c->e[e].next = NIL;
	c->used += len;
	index_put(c, e);
	for (i = 0; i < c->n_free; i++) /* evicted before and not yet said:
					   the host need not drop it now */
		if (c->frees[i] == id) {
			c->frees[i] = c->frees[--c->n_free];
			break;
		}
	return e;
}

static void unhold(struct bkv__enc *c, bkv__enc_use *u)
{
	if (!u->held)
		return;
	if (--c->e[u->entry].refs == 0)
		lru_push(c, u->entry);
	u->held = 0;
	u->entry = NIL;
}

/* Drop the references of r's inputs its KV has passed (kv_len a). */
static void release_passed(struct bkv__enc *c, bkv__req *r, uint32_t a)
{
	while (r->enc_next < r->n_enc && r->enc[r->enc_next].end <= a)
		unhold(c, &r->enc[r->enc_next++]);
}

/* Input u of r is cached or encoded in this step: 1; else 0. */
static int enc_ready(bkv_sched *s, bkv__req *r, bkv__enc_use *u)
{
	struct bkv__enc *c = s->enc;
	bkv__enc_entry *x;

	if (!u->held) {
		uint32_t e = find(c, u->id);

		s->stats.encoder_lookups++;
		s->stats.encoder_hits += e != NIL && c->e[e].state != ENC_NEED;
		if (e == NIL)
			e = entry_new(c, u->id, u->end - u->start, s->cfg.encoder_cache);
		if (e == NIL)
			return 0;
		if (c->e[e].refs++ == 0 && c->e[e].in_lru)
			lru_unlink(c, e);
		u->held = 1;
		u->entry = e;
	}
	x = &c->e[u->entry];
	if (x->state != ENC_NEED)
		return 1;
	if (s->cfg.encoder_budget && c->budget_left < u->cost)
		return 0;
	c->budget_left -= s->cfg.encoder_budget ? u->cost : 0;
	x->state = ENC_SCHED;
	x->step = s->plan.step_no;
	c->unc[c->n_unc++] = u->entry;
	c->work[c->n_work].cache_id = u->id;
	c->work[c->n_work].req = r->id;
	c->work[c->n_work].user = r->user;
	c->work[c->n_work].input = (uint32_t)(u - r->enc);
	c->work[c->n_work].len = u->end - u->start;
	c->n_work++;
	return 1;
}

/* ---- planning --------------------------------------------------------------- */

/* With KV groups a chunk that does not end the prompt ends on a block
 * boundary, and at a multiple of a STATE group's checkpoint interval
 * (sched/plan.c, chunk_cut): the cut, moved back to one (0: none). */
static uint32_t group_cut(const bkv_sched *s, uint32_t a, uint32_t cut)
{
	uint32_t end = (a + cut) & ~(s->bt - 1), iv = s->call.st_interval;

	if (iv)
		end = end / iv * iv;
	return end > a ? end - a : 0;
}

uint32_t bkv__enc_cut(bkv_sched *s, bkv__lane *l, uint32_t c)
{
	bkv__req *r = l->req;
	const uint32_t a = l->kv_len, end = a + c;
	uint32_t i, cut = c;

	if (!s->enc || !r->n_enc || !c)
		return c;
	if (r->enc_next && r->enc[r->enc_next - 1].end > a)
		r->enc_next = 0; /* a rollback took its KV back before them */
	if (r->n == 1)
		release_passed(s->enc, r, a);
	for (i = r->n == 1 ? r->enc_next : 0; i < r->n_enc; i++) {
		bkv__enc_use *u = &r->enc[i];

			if (u->end <= a)
			continue;
		if (u->start >= end)
			break;
		if (!enc_ready(s, r, u)) {
			cut = u->start > a ? u->start - a : 0;
			break;
		}
	}
	if (cut < c && !s->cfg.chunked_prefill)
		cut = 0; /* a whole prompt or nothing */
	else if (cut < c && s->call.n_lanes)
		cut = group_cut(s, a, cut);
	if (r->n == 1 && !r->enc_pend && r->enc_next < r->n_enc &&
	    r->enc[r->enc_next].end <= a + cut) {
		r->enc_pend = 1; /* it passes an input: released next step */
		s->enc->rel[s->enc->n_rel++] = r;
	}
	return cut;
}

void bkv__enc_drop(bkv_sched *s, bkv__req *r)
{
	struct bkv__enc *c = s->enc;
	uint32_t i;

	if (!c)
		return;
	for (i = 0; i < r->n_enc; i++)
		unhold(c, &r->enc[i]);
	r->enc_next = 0;
	if (r->enc_pend) {
		for (i = 0; i < c->n_rel; i++)
			if (c->rel[i] == r) {
				c->rel[i] = c->rel[--c->n_rel];
				break;
			}
		r->enc_pend = 0;
	}
}

void bkv__enc_step_begin(bkv_sched *s)
{
	struct bkv__enc *c = s->enc;
	uint32_t i;

	if (!c)
		return;
	/* a set no step in flight uses */
	c->side = s->ovl ? bkv__ovl_cur(s) : c->side ^ 1;
	c->work = c->work_buf[c->side];
	c->n_work = c->work_sent = c->n_said = 0;
	c->budget_left = s->cfg.encoder_budget;
	for (i = 0; i < c->n_rel; i++) {
		bkv__req *r = c->rel[i];

		r->enc_pend = 0;
		if (REQ_IS_RUNNING(r))
			release_passed(c, r, r->lane[0].kv_len);
	}
	c->n_rel = 0;
}

/* Encodings planned for rows no call carried: not computed. */
void bkv__enc_step_end(bkv_sched *s)
{
	struct bkv__enc *c = s->enc;
	uint32_t i;

	if (!c)
		return;
	for (i = c->work_sent; i < c->n_work; i++) {
		uint32_t e = find(c, c->work[i].cache_id);

		BKV_ASSERT(e != NIL && c->e[e].state == ENC_SCHED);
		c->e[e].state = ENC_NEED;
		unc_remove(c, e);
		if (!c->e[e].refs && !c->e[e].in_lru)
			lru_push(c, e);
	}
	c->n_work = c->work_sent;
}

void bkv__enc_batch(struct bkv__enc *c, bkv_batch *b)
{
	b->n_encode = c->n_work - c->work_sent;
	b->encode = b->n_encode ? c->work + c->work_sent : NULL;
	c->runs += b->n_encode;
	c->work_sent = c->n_work;
	/* said once: the host drops them whatever the call returns */
	b->n_encoder_free = c->n_free;
	b->encoder_free = c->n_free ? c->said[c->side] + c->n_said : NULL;
	memcpy(c->said[c->side] + c->n_said, c->frees, (size_t)c->n_free * sizeof(uint64_t));
	c->n_said += c->n_free;
	c->n_free = 0;
}

void bkv__enc_commit(bkv_sched *s, uint64_t step)
{
	struct bkv__enc *c = s->enc;
	uint32_t i = 0;

	if (!c)
		return;
	while (i < c->n_unc) {
		bkv__enc_entry *x = &c->e[c->unc[i]];

		if (x->step <= step) {
			x->state = ENC_READY;
			c->unc[i] = c->unc[--c->n_unc];
		} else {
			i++;
		}
	}
}

void bkv__enc_rollback(bkv_sched *s)
{
	struct bkv__enc *c = s->enc;
	uint32_t i;

	if (!c)
		return;
	for (i = 0; i < c->n_unc; i++)
		c->e[c->unc[i]].state = ENC_NEED;
	c->n_unc = 0;
}

/* bkv_sched_check 39: every held input's entry names it and counts it; an
 * entry is on the LRU list exactly when no one holds it; the tokens add
 * up; the index finds every entry. */
int bkv__enc_check(const bkv_sched *s)
{
	const struct bkv__enc *c = s->enc;
	uint64_t used = 0;
	uint32_t i, j, lru = 0, live = 0, e;

	if (!c)
		return 0;
	for (e = c->lru_head; e != NIL; e = c->e[e].next) {
		if (!c->e[e].in_lru || c->e[e].refs || !c->e[e].id || ++lru > c->cap)
			return 1;
	}
	for (i = 0; i < c->cap; i++) {
		const bkv__enc_entry *x = &c->e[i];
		uint32_t refs = 0;

		if (!x->id)
			continue;
		live++;
		used += x->len;
		if (find(c, x->id) != i || x->in_lru != (x->refs == 0))
			return 1;
		for (j = 0; j < s->rs.nr_run; j++) {
			const bkv__req *r = s->rs.run[j];
			uint32_t k;

			for (k = 0; REQ_IS_RUNNING(r) && k < r->n_enc; k++)
				refs += r->enc[k].held && r->enc[k].entry == i;
		}
		if (refs != x->refs)
			return 1;
	}
	if (used != c->used || used > s->cfg.encoder_cache || lru > live || c->n_work != c->work_sent)
		return 1;
	return 0;
}

void bkv__enc_stats(const bkv_sched *s, bkv_sched_stats *st)
{
	if (s->enc) {
		st->encoder_runs = s->enc->runs;
		st->encoder_evictions = s->enc->evictions;
	}
}
