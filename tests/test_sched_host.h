/*
 * test_sched_host.h - a deterministic fake host for the scheduler suites.
 *
 * The fake keeps a model of the KV memory: one 64-bit cell per device slot and
 * per host slot. Computing a row writes enc(token, position) into the slot
 * slot_mapping names; before that it verifies that every context position of
 * the row (through kv_indices) holds exactly the token the request has at that
 * position. It performs the copy lists in the documented order. So a wrong
 * block table, a lost copy-on-write or swap copy, a prefix hit on the wrong
 * block, or a recompute that resumes at the wrong place all fail loudly.
 *
 * The sampled token is a hash of (request, branch, position, input token), so a
 * request's stream is fixed by its prompt: a run with preemptions, failures or
 * other schedules must produce exactly the tokens of an undisturbed run.
 */
#ifndef TEST_SCHED_HOST_H
#define TEST_SCHED_HOST_H

#include "internal.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FH_MAX_REQ 4096u
#define FH_MAX_BRANCH 4u
#define FH_MAX_TOK 160u
#define FH_MAX_CALLS 8192u
#define FH_STOP 7 /* the stop token the fake emits when asked to */

typedef struct fh_req {
	const int32_t *prompt;
	uint32_t prompt_len;
	uint32_t stop_after; /* emit FH_STOP as output number stop_after (0 = never) */
	uint32_t fail_after; /* emit BKV_TOKEN_FAIL as output number fail_after */
} fh_req;

typedef struct fh_call {
	bkv_call_kind kind;
	uint32_t n_rows, n_decode, n_tokens, n_copies, n_swap_out, n_swap_in;
	uint32_t padded_rows; /* from the cost model hook */
	uint64_t row_req[8];  /* first rows: request, first position, tokens */
	uint32_t row_start[8], row_len[8];
	uint8_t row_sample[8];
} fh_call;

typedef struct fake_host {
	bkv_sched *s;
	bkv_pool *pool;
	uint32_t bt, device_blocks, host_blocks;
	uint64_t *dev_kv;  /* [device_blocks * bt] */
	uint64_t *host_kv; /* [host_blocks * bt] */
	fh_req req[FH_MAX_REQ + 1];
	/* tokens sampled per request and branch, by position (0 = unknown) */
	int32_t hist[FH_MAX_REQ + 1][FH_MAX_BRANCH][FH_MAX_TOK];
	/* what the callbacks reported */
	int32_t out[FH_MAX_REQ + 1][FH_MAX_BRANCH][FH_MAX_TOK];
	uint32_t n_out[FH_MAX_REQ + 1][FH_MAX_BRANCH];
	uint32_t finish_count[FH_MAX_REQ + 1];
	bkv_finish_reason reason[FH_MAX_REQ + 1];
	uint32_t finished_total;
	fh_call calls[FH_MAX_CALLS];
	uint32_t n_calls;
	uint32_t n_forward, n_prefill, n_decode;
	uint64_t now;         /* virtual clock, us */
	uint64_t tick;        /* added per host call */
	int fail_next;        /* fail this many upcoming calls */
	uint32_t fail_at_call; /* fail the call whose number (1-based, over
				  n_calls) this is; 0 = none */
	uint32_t fail_permille; /* random failure rate */
	uint64_t rng;
	int garbage_on_fail;  /* write KV (of wrong values) before failing */
	int nested_rc;        /* result of a bkv_step from inside a callback */
	int try_nested;
	uint32_t errors;      /* consistency violations seen */
	char first_error[256];
	uint32_t max_call_tokens;
	uint32_t last_padded;
	uint64_t abort_on_token;  /* on_token of this id aborts it (0: none) */
	uint64_t abort_on_finish; /* on_finish of any request aborts this id */
	int abort_rc;             /* what that bkv_abort answered */
} fake_host;

static inline uint64_t fh_rand(fake_host *f)
{
	f->rng ^= f->rng << 13;
	f->rng ^= f->rng >> 7;
	f->rng ^= f->rng << 17;
	return f->rng;
}

static inline uint64_t fh_enc(int32_t token, uint32_t pos)
{
	return ((uint64_t)(uint32_t)token << 32) | (uint64_t)(pos + 1);
}

static inline int32_t fh_next(uint64_t req, uint32_t branch, uint32_t pos, int32_t input)
{
	uint64_t h = req * 0x9e3779b97f4a7c15ull ^ ((uint64_t)branch << 48) ^
		     ((uint64_t)pos << 20) ^ (uint64_t)(uint32_t)input;

	h ^= h >> 31;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 29;
	return 1000 + (int32_t)(h % 100000u);
}

#define FH_ERR(f, ...)                                                          \
	do {                                                                   \
		if ((f)->errors++ == 0)                                        \
			snprintf((f)->first_error, sizeof((f)->first_error),   \
				 __VA_ARGS__);                                 \
	} while (0)

/* The token request `id`, branch b holds at position p. */
static inline int32_t fh_hist(fake_host *f, uint64_t id, uint32_t b, uint32_t p)
{
	const fh_req *q = &f->req[id];

	if (p < q->prompt_len)
		return q->prompt[p];
	if (p >= FH_MAX_TOK) {
		FH_ERR(f, "position %u beyond the fake host's FH_MAX_TOK", p);
		return 0;
	}
	return f->hist[id][b][p];
}

static double fh_cost(void *ctx, const bkv_step_shape *sh)
{
	fake_host *f = ctx;

	f->last_padded = sh->padded_rows;
	return 10.0 * sh->padded_rows + 1.0;
}

static int fh_compute(fake_host *f, const bkv_batch *b, int32_t *next, bkv_call_kind want)
{
	uint32_t r, i, bt = b->block_tokens;
	int fail = 0;
	fh_call *c = f->n_calls < FH_MAX_CALLS ? &f->calls[f->n_calls] : NULL;

	f->n_calls++;
	if (b->kind != want)
		FH_ERR(f, "batch kind %d in callback %d", b->kind, want);
	if (c) {
		c->kind = b->kind;
		c->n_rows = b->n_rows;
		c->n_decode = b->n_decode_rows;
		c->n_tokens = b->n_tokens;
		c->n_copies = b->n_copies;
		c->n_swap_out = b->n_swap_out;
		c->n_swap_in = b->n_swap_in;
		c->padded_rows = f->last_padded;
		for (r = 0; r < b->n_rows && r < 8; r++) {
			c->row_req[r] = b->row_req[r];
			c->row_start[r] = (uint32_t)b->positions[b->qo_indptr[r]];
			c->row_len[r] = (uint32_t)(b->qo_indptr[r + 1] - b->qo_indptr[r]);
			c->row_sample[r] = b->row_sample[r];
		}
	}
	if (b->n_tokens > f->max_call_tokens)
		f->max_call_tokens = b->n_tokens;
	if (f->try_nested)
		f->nested_rc = bkv_step(f->s, NULL);
	if (f->fail_at_call && f->n_calls == f->fail_at_call) {
		fail = 1;
	} else if (f->fail_next > 0) {
		f->fail_next--;
		fail = 1;
	} else if (f->fail_permille && fh_rand(f) % 1000 < f->fail_permille) {
		fail = 1;
	}
	if (fail && !f->garbage_on_fail)
		return -1;
	/* copies, in the documented order */
	for (i = 0; i < b->n_swap_out; i++)
		memcpy(&f->host_kv[(size_t)b->swap_out[i].dst * bt],
		       &f->dev_kv[(size_t)b->swap_out[i].src * bt], bt * sizeof(uint64_t));
	for (i = 0; i < b->n_swap_in; i++)
		memcpy(&f->dev_kv[(size_t)b->swap_in[i].dst * bt],
		       &f->host_kv[(size_t)b->swap_in[i].src * bt], bt * sizeof(uint64_t));
	for (i = 0; i < b->n_copies; i++)
		memcpy(&f->dev_kv[(size_t)b->copies[i].dst * bt],
		       &f->dev_kv[(size_t)b->copies[i].src * bt], bt * sizeof(uint64_t));
	if (b->qo_indptr[0] != 0 || b->kv_indptr[0] != 0 ||
	    (uint32_t)b->qo_indptr[b->n_rows] != b->n_tokens)
		FH_ERR(f, "indptr ends wrong");
	if (b->n_decode_rows > b->n_rows)
		FH_ERR(f, "n_decode_rows > n_rows");
	for (r = 0; r < b->n_rows; r++) {
		uint64_t id = b->row_req[r];
		uint32_t br = b->row_branch[r], t0 = (uint32_t)b->qo_indptr[r];
		uint32_t t1 = (uint32_t)b->qo_indptr[r + 1];
		uint32_t k0 = (uint32_t)b->kv_indptr[r], k1 = (uint32_t)b->kv_indptr[r + 1];
		uint32_t start, end, q, nb;
		const int32_t *tab = &b->kv_indices[k0];

		if (id == 0 || id > FH_MAX_REQ || br >= FH_MAX_BRANCH || t1 <= t0) {
			FH_ERR(f, "row %u: bad id/branch/len", r);
			continue;
		}
		if (b->row_user[r] != (void *)&f->req[id])
			FH_ERR(f, "row %u: user pointer", r);
		if (r < b->n_decode_rows && t1 - t0 != 1)
			FH_ERR(f, "decode row %u has %u tokens", r, t1 - t0);
		start = (uint32_t)b->positions[t0];
		end = start + (t1 - t0);
		nb = (end + bt - 1) / bt;
		if (k1 - k0 != nb)
			FH_ERR(f, "row %u: %u blocks for %u tokens", r, k1 - k0, end);
		if ((uint32_t)b->kv_last_page_len[r] != end - (nb - 1) * bt)
			FH_ERR(f, "row %u: last_page_len", r);
		for (q = 0; q < start; q++) {
			uint64_t expect = fh_enc(fh_hist(f, id, br, q), q);
			uint64_t have = f->dev_kv[(size_t)tab[q / bt] * bt + q % bt];

			if (expect != have) {
				FH_ERR(f, "req %llu br %u: context pos %u holds %llx, want %llx",
				       (unsigned long long)id, br, q, (unsigned long long)have,
				       (unsigned long long)expect);
				break;
			}
		}
		for (i = t0; i < t1; i++) {
			uint32_t p = start + (i - t0);
			int32_t slot = tab[p / bt] * (int32_t)bt + (int32_t)(p % bt);

			if ((uint32_t)b->positions[i] != p)
				FH_ERR(f, "row %u: positions not consecutive", r);
			if (b->slot_mapping[i] != slot)
				FH_ERR(f, "row %u pos %u: slot %d, table says %d", r, p,
				       b->slot_mapping[i], slot);
			if (b->token_ids[i] != fh_hist(f, id, br, p))
				FH_ERR(f, "req %llu br %u pos %u: input %d, want %d",
				       (unsigned long long)id, br, p, b->token_ids[i],
				       fh_hist(f, id, br, p));
			f->dev_kv[(size_t)slot] = fail ? 0xdeadull : fh_enc(b->token_ids[i], p);
		}
		if (b->row_sample[r] && !fail) {
			const fh_req *qq = &f->req[id];
			uint32_t nth = end + 1 - qq->prompt_len; /* output number */
			int32_t t = fh_next(id, br, end, b->token_ids[t1 - 1]);

			if (qq->stop_after && nth == qq->stop_after)
				t = FH_STOP;
			if (qq->fail_after && nth == qq->fail_after)
				t = BKV_TOKEN_FAIL;
			if (end < FH_MAX_TOK)
				f->hist[id][br][end] = t;
			next[r] = t;
		}
	}
	f->now += f->tick;
	return fail ? -1 : 0;
}

static int fh_forward(void *h, const bkv_batch *b, int32_t *next)
{
	((fake_host *)h)->n_forward++;
	return fh_compute(h, b, next, BKV_CALL_MIXED);
}

static int fh_prefill(void *h, const bkv_batch *b, int32_t *next)
{
	((fake_host *)h)->n_prefill++;
	return fh_compute(h, b, next, BKV_CALL_PREFILL);
}

static int fh_decode(void *h, const bkv_batch *b, int32_t *next)
{
	((fake_host *)h)->n_decode++;
	return fh_compute(h, b, next, BKV_CALL_DECODE);
}

static void fh_on_token(void *h, uint64_t id, uint32_t br, int32_t token, void *user)
{
	fake_host *f = h;
	uint32_t pos;

	if (id == 0 || id > FH_MAX_REQ || br >= FH_MAX_BRANCH || user != &f->req[id]) {
		FH_ERR(f, "on_token: bad id %llu", (unsigned long long)id);
		return;
	}
	if (f->finish_count[id])
		FH_ERR(f, "on_token after on_finish for %llu", (unsigned long long)id);
	pos = f->req[id].prompt_len + f->n_out[id][br];
	if (pos < FH_MAX_TOK && token != f->hist[id][br][pos])
		FH_ERR(f, "on_token %llu br %u pos %u: %d, sampled %d", (unsigned long long)id, br,
		       pos, token, f->hist[id][br][pos]);
	if (f->n_out[id][br] < FH_MAX_TOK)
		f->out[id][br][f->n_out[id][br]] = token;
	f->n_out[id][br]++;
	if (f->abort_on_token == id) {
		f->abort_rc = bkv_abort(f->s, id);
		f->abort_on_token = 0;
	}
}

static void fh_on_finish(void *h, uint64_t id, bkv_finish_reason why, void *user)
{
	fake_host *f = h;

	if (id == 0 || id > FH_MAX_REQ || user != &f->req[id]) {
		FH_ERR(f, "on_finish: bad id %llu", (unsigned long long)id);
		return;
	}
	if (f->finish_count[id]++)
		FH_ERR(f, "on_finish twice for %llu", (unsigned long long)id);
	f->reason[id] = why;
	f->finished_total++;
	if (f->abort_on_finish) {
		f->abort_rc = bkv_abort(f->s, f->abort_on_finish);
		f->abort_on_finish = 0;
	}
}

static uint64_t fh_now(void *h)
{
	return ((fake_host *)h)->now;
}

typedef struct fh_opts {
	uint32_t block_tokens, device_blocks, host_blocks;
	uint32_t max_seqs; /* pool max_seqs (default 4096) */
	int prefix_cache;
	int split;
	bkv_sched_config cfg;
	const bkv_allocator *sched_alloc, *pool_alloc;
} fh_opts;

static inline void fh_opts_init(fh_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->block_tokens = 16;
	o->device_blocks = 1024;
	o->prefix_cache = 1;
	bkv_sched_config_init(&o->cfg);
}

static inline fake_host *fh_create(const fh_opts *o)
{
	fake_host *f = calloc(1, sizeof(*f));
	bkv_pool_config pc;
	bkv_host_ops ops;
	bkv_sched_config cfg = o->cfg;
	int rc;

	cr_assert(f);
	f->bt = o->block_tokens;
	f->device_blocks = o->device_blocks;
	f->host_blocks = o->host_blocks;
	f->dev_kv = calloc((size_t)o->device_blocks * o->block_tokens, sizeof(uint64_t));
	f->host_kv = calloc((size_t)(o->host_blocks + 1) * o->block_tokens, sizeof(uint64_t));
	f->rng = 0x1234567;
	f->tick = 100;
	bkv_pool_config_init(&pc);
	pc.block_tokens = o->block_tokens;
	pc.device_blocks = o->device_blocks;
	pc.host_blocks = o->host_blocks;
	pc.max_seqs = o->max_seqs ? o->max_seqs : 4096;
	pc.prefix_cache = o->prefix_cache;
	rc = bkv_pool_create(&pc, o->pool_alloc, &f->pool);
	cr_assert_eq(rc, BKV_OK, "pool create: %s", bkv_strerror(rc));
	memset(&ops, 0, sizeof(ops));
	if (o->split) {
		ops.prefill = fh_prefill;
		ops.decode = fh_decode;
	} else {
		ops.forward = fh_forward;
	}
	ops.on_token = fh_on_token;
	ops.on_finish = fh_on_finish;
	ops.now_us = fh_now;
	if (!cfg.cost.step_us) {
		cfg.cost.step_us = fh_cost;
		cfg.cost.ctx = f;
	}
	rc = bkv_sched_create(&cfg, f->pool, &ops, f, o->sched_alloc, &f->s);
	cr_assert_eq(rc, BKV_OK, "sched create: %s", bkv_strerror(rc));
	return f;
}

static inline void fh_destroy(fake_host *f)
{
	bkv_sched_destroy(f->s);
	bkv_pool_destroy(f->pool);
	free(f->dev_kv);
	free(f->host_kv);
	free(f);
}

/* Submit a request; the prompt must outlive the fake (it is read back). */
static inline uint64_t fh_submit_ex(fake_host *f, const int32_t *prompt, uint32_t len,
				    uint32_t max_new, int32_t prio, uint32_t n, uint32_t stop_after)
{
	static const int32_t stop = FH_STOP;
	bkv_request q;
	uint64_t id = 0;
	int rc;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = len;
	q.max_new_tokens = max_new;
	q.priority = prio;
	q.n = n;
	q.stop_tokens = &stop;
	q.n_stop = 1;
	/* ids are handed out in order, so the user pointer can be set up front */
	q.user = &f->req[__atomic_load_n(&f->s->in.next_id, __ATOMIC_RELAXED) + 1];
	rc = bkv_submit(f->s, &q, &id);
	cr_assert_eq(rc, BKV_OK, "submit: %s", bkv_strerror(rc));
	cr_assert(id <= FH_MAX_REQ);
	cr_assert_eq(q.user, (void *)&f->req[id]);
	f->req[id].prompt = prompt;
	f->req[id].prompt_len = len;
	f->req[id].stop_after = stop_after;
	return id;
}

static inline uint64_t fh_submit(fake_host *f, const int32_t *prompt, uint32_t len,
				 uint32_t max_new)
{
	return fh_submit_ex(f, prompt, len, max_new, 0, 1, 0);
}

/* Step (checking every invariant after each) until nothing is pending. */
static inline uint32_t fh_run(fake_host *f, uint32_t max_steps)
{
	uint32_t steps = 0;

	while (bkv_sched_pending(f->s) > 0 && steps < max_steps) {
		int rc = bkv_step(f->s, NULL);

		cr_assert(rc == BKV_OK || rc == BKV_EHOST, "step: %s", bkv_strerror(rc));
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d after step %u",
			     bkv_sched_check(f->s), steps);
		cr_assert_eq(f->errors, 0, "%s", f->first_error);
		steps++;
	}
	return steps;
}

/* A prompt of len tokens from a seed (values 100..999, never FH_STOP). */
static inline int32_t *fh_prompt(uint32_t len, uint64_t seed)
{
	int32_t *p = malloc(len * sizeof(int32_t));
	uint32_t i;

	for (i = 0; i < len; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = 100 + (int32_t)((seed >> 33) % 900);
	}
	return p;
}

#endif /* TEST_SCHED_HOST_H */
