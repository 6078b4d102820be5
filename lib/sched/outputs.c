/*
 * outputs.c - what a step delivered, as arrays: the tokens (request,
 * branch, token) and the ended requests (request, reason), for a host that
 * reads them once per step instead of taking a callback per token (a
 * Python or Rust engine: one crossing per step).
 *
 * Off until bkv_sched_outputs_enable; on, the places that call on_token
 * and on_finish record into arrays sized at enable time: tokens for every
 * row a step may deliver (two per row on a split host, 1 + the drafts with
 * speculation), ends for every request that may be alive (max_running +
 * max_queue), so recording never allocates and never runs out. The arrays
 * hold what was delivered since the previous delivery point (bkv_step or
 * bkv_step_complete) returned: the first record after one, or the next
 * delivery point's start, empties them, so requests a launch ends (its
 * drain: aborts) are read with the completion that follows.
 */
#include "sched/sched.h"

#include <string.h>

static void outs_free(bkv_sched *s, struct bkv__outs *o)
{
	const bkv_allocator *a = &s->alloc;

	if (!o)
		return;
	bkv__free(a, o->tok_req, (size_t)o->tok_cap * sizeof(uint64_t));
	bkv__free(a, o->tok_branch, (size_t)o->tok_cap * sizeof(uint32_t));
	bkv__free(a, o->tok, (size_t)o->tok_cap * sizeof(int32_t));
	bkv__free(a, o->fin_req, (size_t)o->fin_cap * sizeof(uint64_t));
	bkv__free(a, o->fin_why, (size_t)o->fin_cap * sizeof(int32_t));
	bkv__free(a, o, sizeof(*o));
}

int bkv_sched_outputs_enable(bkv_sched *s, int on)
{
	struct bkv__outs *o;

	if (!s || (on != 0 && on != 1))
		return BKV_EINVAL;
	if (s->plan.in_step)
		return BKV_ESTATE;
	if (!on) {
		outs_free(s, s->outs);
		s->outs = NULL;
		return BKV_OK;
	}
	if (s->outs)
		return BKV_OK;
	o = bkv__calloc(&s->alloc, 1, sizeof(*o));
	if (!o)
		return BKV_ENOMEM;
	/* a row delivers its token, a split host's prefill row a second one
	 * in the same step's decode call, a speculated row its drafts too */
	o->tok_cap = s->plan.row_cap * (2 + s->cfg.spec_max_k);
	o->fin_cap = s->cfg.max_running + s->cfg.max_queue;
	o->tok_req = bkv__malloc(&s->alloc, (size_t)o->tok_cap * sizeof(uint64_t));
	o->tok_branch = bkv__malloc(&s->alloc, (size_t)o->tok_cap * sizeof(uint32_t));
	o->tok = bkv__malloc(&s->alloc, (size_t)o->tok_cap * sizeof(int32_t));
	o->fin_req = bkv__malloc(&s->alloc, (size_t)o->fin_cap * sizeof(uint64_t));
	o->fin_why = bkv__malloc(&s->alloc, (size_t)o->fin_cap * sizeof(int32_t));
	if (!o->tok_req || !o->tok_branch || !o->tok || !o->fin_req || !o->fin_why) {
		outs_free(s, o);
		return BKV_ENOMEM;
	}
	s->outs = o;
	return BKV_OK;
}

void bkv__outs_destroy(bkv_sched *s)
{
	outs_free(s, s->outs);
	s->outs = NULL;
}

void bkv__outs_begin(bkv_sched *s)
{
	if (s->outs)
		bkv__outs_fresh(s->outs);
}

void bkv__outs_end(bkv_sched *s)
{
	if (s->outs)
		s->outs->stale = 1;
}

int bkv_sched_outputs_get(const bkv_sched *s, bkv_step_outputs *out)
{
	const struct bkv__outs *o;
	bkv_step_outputs v;
	size_t n;

	if (!s || !out)
		return BKV_EINVAL;
	if (!s->outs)
		return BKV_ESTATE;
	o = s->outs;
	memset(&v, 0, sizeof(v));
	v.size = sizeof(v);
	v.n_tokens = o->n_tok;
	v.token_req = o->tok_req;
	v.token_branch = o->tok_branch;
	v.token_ids = o->tok;
	v.n_finished = o->n_fin;
	v.finished_req = o->fin_req;
	v.finished_reason = o->fin_why;
	n = out->size && out->size < sizeof(v) ? out->size : sizeof(v);
	memcpy(out, &v, n);
	out->size = (uint32_t)n;
	return BKV_OK;
}
