/*
 * fakehost_sched.c - the scheduler suites' harness (fakehost_sched.h): a
 * pool, a scheduler and the checking host, requests by id, a run loop that
 * asserts every invariant after every step. The callbacks here log and
 * count, then hand each call to the host (kh_compute, kh_on_token,
 * kh_on_finish), which does every check.
 */
#include "fakehost_sched.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* The harness's cost model: 10 us per padded row plus 1, and the padding
 * remembered for the call log. */
static double fh_cost(void *ctx, const bkv_step_shape *sh)
{
	fake_host *f = ctx;

	f->last_padded = sh->padded_rows;
	return 10.0 * sh->padded_rows + 1.0;
}

/* Drafts: the host's (kh_draft), read with BKV_SPEC_DRAFT_HOST only. */
static int fh_draft(void *h, uint64_t req, uint32_t branch, const int32_t *ctx, uint32_t n_ctx,
		    int32_t *out, uint32_t k, void *user)
{
	return kh_draft(&((fake_host *)h)->host, req, branch, ctx, n_ctx, out, k, user);
}

/* Log the call, then let the host check and compute it. */
static int fh_call_host(fake_host *f, const bkv_batch *b, int32_t *next, bkv_call_kind want)
{
	fh_call *c = f->n_calls < FH_MAX_CALLS ? &f->calls[f->n_calls] : NULL;
	uint32_t r;

	f->n_calls++;
	if (f->batch_hook)
		f->batch_hook(f, b);
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
	f->host.sched = f->s; /* a test may swap in its own scheduler */
	return kh_compute(&f->host, b, next, want);
}

int fh_forward(void *h, const bkv_batch *b, int32_t *next)
{
	((fake_host *)h)->n_forward++;
	return fh_call_host(h, b, next, BKV_CALL_MIXED);
}

int fh_prefill(void *h, const bkv_batch *b, int32_t *next)
{
	((fake_host *)h)->n_prefill++;
	return fh_call_host(h, b, next, BKV_CALL_PREFILL);
}

int fh_decode(void *h, const bkv_batch *b, int32_t *next)
{
	((fake_host *)h)->n_decode++;
	return fh_call_host(h, b, next, BKV_CALL_DECODE);
}

/* The id names this harness's record of it, and the id fits the tables. */
static int fh_known(fake_host *f, uint64_t id, uint32_t br, const void *user)
{
	return id != 0 && id <= FH_MAX_REQ && br < FH_MAX_BRANCH && user == &f->req[id];
}

static void fh_on_token(void *h, uint64_t id, uint32_t br, int32_t token, void *user)
{
	fake_host *f = h;

	kh_on_token(&f->host, id, br, token, user);
	if (!fh_known(f, id, br, user)) {
		kh_violation(&f->host, "on_token: bad id %llu", (unsigned long long)id);
		return;
	}
	if (f->n_out[id][br] < FH_MAX_TOK)
		f->out[id][br][f->n_out[id][br]] = token;
	f->n_out[id][br]++;
	if (f->abort_on_token == id) {
		f->abort_rc = kh_abort(f->s, &f->req[id], id);
		f->abort_on_token = 0;
	}
}

static void fh_on_finish(void *h, uint64_t id, bkv_finish_reason why, void *user)
{
	fake_host *f = h;
	uint64_t victim;

	kh_on_finish(&f->host, id, why, user);
	if (!fh_known(f, id, 0, user)) {
		kh_violation(&f->host, "on_finish: bad id %llu", (unsigned long long)id);
		return;
	}
	f->finish_count[id]++;
	f->reason[id] = why;
	f->finished_total++;
	victim = f->abort_on_finish;
	if (victim) {
		f->abort_on_finish = 0;
		f->abort_rc = victim <= FH_MAX_REQ ? kh_abort(f->s, &f->req[victim], victim)
						   : bkv_abort(f->s, victim);
	}
}

static uint64_t fh_now(void *h)
{
	return ((fake_host *)h)->host.now;
}

void fh_opts_init(fh_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->block_tokens = 16;
	o->device_blocks = 1024;
	o->prefix_cache = 1;
	bkv_sched_config_init(&o->cfg);
}

fake_host *fh_create(const fh_opts *o)
{
	fake_host *f = calloc(1, sizeof(*f));
	bkv_pool_config pc;
	bkv_host_ops ops;
	bkv_sched_config cfg = o->cfg;
	int rc;

	cr_assert(f);
	/* BKV_TEST_LAYOUT=persistent runs a suite in the persistent batch layout
	 * (the host mirrors the deltas and checks everything through them) */
	if (getenv("BKV_TEST_LAYOUT") && strcmp(getenv("BKV_TEST_LAYOUT"), "persistent") == 0)
		cfg.batch_layout = BKV_BATCH_PERSISTENT;
	cr_assert_eq(kh_init(&f->host, o->block_tokens, o->device_blocks, o->host_blocks, 1), 0);
	f->host.garbage = 0;
	f->host.aborts_unrecorded = 1;
	bkv_pool_config_init(&pc);
	pc.block_tokens = o->block_tokens;
	pc.device_blocks = o->device_blocks;
	pc.host_blocks = o->host_blocks;
	pc.max_seqs = o->max_seqs ? o->max_seqs : 4096;
	pc.prefix_cache = o->prefix_cache;
	pc.event_capacity = o->event_capacity;
	pc.pin_permille = o->pin_permille;
	pc.n_groups = o->n_groups;
	pc.groups = o->groups;
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
	ops.draft = fh_draft;
	if (!cfg.cost.step_us && !o->no_fake_cost) {
		cfg.cost.step_us = fh_cost;
		cfg.cost.ctx = f;
	}
	rc = bkv_sched_create(&cfg, f->pool, &ops, f, o->sched_alloc, &f->s);
	cr_assert_eq(rc, BKV_OK, "sched create: %s", bkv_strerror(rc));
	f->host.sched = f->s;
	return f;
}

void fh_destroy(fake_host *f)
{
	uint32_t i;

	bkv_sched_destroy(f->s);
	bkv_pool_destroy(f->pool);
	kh_fini(&f->host);
	for (i = 0; i <= FH_MAX_REQ; i++)
		kh_req_fini(&f->req[i]);
	free(f);
}

kh_req *fh_next_req(fake_host *f, const bkv_request *q)
{
	bkv_sched_stats st;
	uint64_t id;
	kh_req *r;
	uint32_t i;

	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(f->s, &st);
	id = st.submitted + 1;
	cr_assert(id <= FH_MAX_REQ, "request %llu beyond FH_MAX_REQ", (unsigned long long)id);
	cr_assert(q->n <= KH_MAX_N && q->n_stop <= 2);
	r = &f->req[id];
	kh_req_fini(r);
	cr_assert_eq(kh_req_init(r, id, q->prompt, q->prompt_len, q->max_new_tokens, q->n), 0);
	r->key = bkv_adapter_cache_key(q->cache_key, q->adapter); /* the pool key */
	for (i = 0; i < q->n_stop; i++)
		r->stop[i] = q->stop_tokens[i];
	r->n_stop = q->n_stop;
	r->id = id; /* the host checks every row and callback against it */
	return r;
}

uint64_t fh_submit_ex(fake_host *f, const int32_t *prompt, uint32_t len, uint32_t max_new,
		      int32_t prio, uint32_t n, uint32_t stop_after)
{
	static const int32_t stop = FH_STOP;
	bkv_request q;
	uint64_t id;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = len;
	q.max_new_tokens = max_new;
	q.priority = prio;
	q.n = n;
	q.stop_tokens = &stop;
	q.n_stop = 1;
	id = fh_submit_req(f, &q);
	cr_assert_eq(q.user, (void *)&f->req[id]);
	f->req[id].stop_after = stop_after;
	return id;
}

uint64_t fh_submit_req(fake_host *f, bkv_request *q)
{
	uint64_t id = 0;
	int rc;

	q->user = fh_next_req(f, q);
	rc = bkv_submit(f->s, q, &id);
	cr_assert_eq(rc, BKV_OK, "submit: %s", bkv_last_error());
	cr_assert(id <= FH_MAX_REQ);
	f->req[id].submitted = 1;
	return id;
}

uint64_t fh_submit(fake_host *f, const int32_t *prompt, uint32_t len, uint32_t max_new)
{
	return fh_submit_ex(f, prompt, len, max_new, 0, 1, 0);
}

uint32_t fh_run(fake_host *f, uint32_t max_steps)
{
	uint32_t steps = 0;

	while (bkv_sched_pending(f->s) > 0 && steps < max_steps) {
		int rc = bkv_step(f->s, NULL);

		cr_assert(rc == BKV_OK || rc == BKV_EHOST, "step: %s", bkv_strerror(rc));
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d after step %u",
			     bkv_sched_check(f->s), steps);
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
		steps++;
	}
	return steps;
}

int32_t *fh_prompt(uint32_t len, uint64_t seed)
{
	int32_t *p = malloc(len * sizeof(int32_t));
	uint32_t i;

	for (i = 0; i < len; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = 100 + (int32_t)((seed >> 33) % 900);
	}
	return p;
}
