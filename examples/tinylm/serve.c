/*
 * serve.c - workloads for tinylm and the loop that serves them through
 * libbatchkv, shared by the demo (main.c) and the correctness test.
 *
 * A workload is a few hundred requests built from a seed: each prompt is one
 * of a few shared "system prompts" followed by a request-specific suffix, so
 * the prefix cache has something to hit; lengths and max_new_tokens vary; some
 * requests ask for n = 2 or 3 samples (forked branches), some have a stop
 * token, some are aborted (right after submission, or once a few tokens have
 * arrived). The reference output of every job comes from ref.c, one request at
 * a time; a stop token is chosen from the job's own reference output so that
 * it really fires, which is sound because a stop token only truncates.
 * With wc.n_adapters, jobs also get adapters (a LoRA stand-in, model.h),
 * which the reference applies as the paged host does, and with wc.n_images
 * encoder inputs (images, encoder.c) whose spans the reference embeds from
 * the images and the paged host from its encoder cache.
 *
 * tlm_run() then serves the workload with one scheduler configuration: pool,
 * paged host, scheduler; submissions (all up front or a few per step); aborts
 * issued between steps once a job has seen enough tokens; bkv_step until
 * nothing is pending. on_token appends each token to its (job, branch), and
 * tlm_workload_verify() compares token for token.
 *
 * Overlapped (sched.overlap = N): the same loop drives bkv_step_launch and
 * bkv_step_complete instead, and a device thread (overlap.c) runs the
 * launched steps, so the library plans the next step while up to N steps
 * compute; submissions and aborts go in between, as they do between steps.
 */
#include "tinylm.h"
#include "overlap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ABORT_AT_SUBMIT UINT32_MAX

void tlm_workload_config_default(tlm_workload_config *wc)
{
	memset(wc, 0, sizeof(*wc));
	wc->n_jobs = 300;
	wc->n_system = 4;
	wc->system_len = 48;
	wc->user_min = 1;
	wc->user_max = 40;
	wc->new_min = 1;
	wc->new_max = 24;
	wc->pct_fork = 10;
	wc->pct_abort = 8;
	wc->pct_stop = 15;
	wc->seed = 42;
}

static uint32_t rnd(uint64_t *st, uint32_t lo, uint32_t hi)
{
	*st = tlm_mix64(*st);
	return lo + (uint32_t)(*st % (uint64_t)(hi - lo + 1));
}

int tlm_workload_create(tlm_workload *w, const tlm_workload_config *wc, uint32_t vocab)
{
	memset(w, 0, sizeof(*w));
	if (!wc->n_jobs || !wc->n_system || wc->user_min > wc->user_max ||
	    !wc->new_min || wc->new_min > wc->new_max)
		return -1;
	uint64_t st = wc->seed;
	const size_t max_prompt = wc->system_len + wc->user_max + 3;
	w->n_jobs = wc->n_jobs;
	w->jobs = calloc(wc->n_jobs, sizeof(tlm_job));
	w->tokens = malloc((wc->n_system * (size_t)wc->system_len +
			    wc->n_jobs * max_prompt) * sizeof(int32_t));
	if (!w->jobs || !w->tokens) {
		tlm_workload_destroy(w);
		return -1;
	}
	int32_t *sys = w->tokens, *next = w->tokens + wc->n_system * (size_t)wc->system_len;
	for (size_t i = 0; i < wc->n_system * (size_t)wc->system_len; i++)
		sys[i] = (int32_t)rnd(&st, 0, vocab - 1);
	for (uint32_t j = 0; j < wc->n_jobs; j++) {
		tlm_job *jb = &w->jobs[j];
		const uint32_t s = rnd(&st, 0, wc->n_system - 1);
		/* One in twenty has no system prompt and 1..3 tokens: the
		 * edge of a one-token prompt (with n > 1 too). */
		const int bare = rnd(&st, 0, 19) == 0;
		const uint32_t sl = bare ? 0 : wc->system_len;
		const uint32_t ul = bare ? rnd(&st, 1, 3) : rnd(&st, wc->user_min, wc->user_max);
		jb->prompt = next;
		memcpy(next, sys + (size_t)s * wc->system_len, sl * sizeof(int32_t));
		for (uint32_t i = 0; i < ul; i++)
			next[sl + i] = (int32_t)rnd(&st, 0, vocab - 1);
		jb->prompt_len = sl + ul;
		if (jb->prompt_len == 0) { /* a prompt needs a token */
			next[0] = 1;
			jb->prompt_len = 1;
		}
		next += jb->prompt_len;
		jb->max_new = rnd(&st, wc->new_min, wc->new_max);
		jb->sampling.seed = tlm_mix64(wc->seed * 1000003u + j);
		jb->sampling.n_samples = rnd(&st, 0, 99) < wc->pct_fork ? rnd(&st, 2, 3) : 1;
		jb->stop = rnd(&st, 0, 99) < wc->pct_stop ? 0 : -1; /* chosen later */
		jb->abort_after = 0;
		if (rnd(&st, 0, 99) < wc->pct_abort)
			jb->abort_after = rnd(&st, 0, 2) == 0 ? ABORT_AT_SUBMIT
							       : rnd(&st, 1, jb->max_new);
		const size_t outs = (size_t)jb->sampling.n_samples * jb->max_new;
		jb->ref = calloc(outs, sizeof(int32_t));
		jb->got = calloc(outs, sizeof(int32_t));
		jb->ref_len = calloc(jb->sampling.n_samples, sizeof(uint32_t));
		jb->got_len = calloc(jb->sampling.n_samples, sizeof(uint32_t));
		if (!jb->ref || !jb->got || !jb->ref_len || !jb->got_len) {
			tlm_workload_destroy(w);
			return -1;
		}
	}
	uint64_t ast = tlm_mix64(wc->seed ^ 0xADA97E25ull); /* adapters' own stream */
	for (uint32_t j = 0; wc->n_adapters && j < wc->n_jobs; j++)
		w->jobs[j].adapter = rnd(&ast, 0, wc->n_adapters);
	tlm_workload_inputs(w, wc);
	return 0;
}

void tlm_workload_destroy(tlm_workload *w)
{
	if (w->jobs)
		for (uint32_t j = 0; j < w->n_jobs; j++) {
			free(w->jobs[j].ref), free(w->jobs[j].got);
			free(w->jobs[j].ref_len), free(w->jobs[j].got_len);
		}
	free(w->jobs);
	free(w->tokens);
	memset(w, 0, sizeof(*w));
}

int tlm_workload_reference(tlm_workload *w, const tlm_model *m)
{
	for (uint32_t j = 0; j < w->n_jobs; j++) {
		tlm_job *jb = &w->jobs[j];
		const int want_stop = jb->stop >= 0;
		jb->stop = -1;
		if (tlm_ref_generate_mm(m, jb->adapter, jb->sampling.inputs, jb->prompt,
					jb->prompt_len, jb->max_new, NULL, 0, jb->sampling.n_samples,
					jb->sampling.seed, jb->ref, jb->ref_len))
			return -1;
		if (!want_stop)
			continue;
		/* Stop on a token branch 0 really produces, then cut every branch
		 * after its first occurrence: generation up to it is unchanged. */
		jb->stop = jb->ref[jb->ref_len[0] / 2];
		for (uint32_t b = 0; b < jb->sampling.n_samples; b++)
			for (uint32_t i = 0; i < jb->ref_len[b]; i++)
				if (jb->ref[(size_t)b * jb->max_new + i] == jb->stop) {
					jb->ref_len[b] = i + 1;
					break;
				}
	}
	return 0;
}

void tlm_workload_reset(tlm_workload *w)
{
	for (uint32_t j = 0; j < w->n_jobs; j++) {
		tlm_job *jb = &w->jobs[j];
		memset(jb->got_len, 0, jb->sampling.n_samples * sizeof(uint32_t));
		jb->got_total = 0;
		jb->finished = 0;
		jb->reason = BKV_FINISH_LENGTH;
		jb->req_id = 0;
		jb->abort_sent = 0;
		jb->bad_tokens = 0;
		jb->submit_us = jb->first_us = jb->done_us = 0;
	}
}

uint32_t tlm_workload_verify(const tlm_workload *w, char *msg, size_t msg_len)
{
	uint32_t bad = 0;
	if (msg_len)
		msg[0] = 0;
	for (uint32_t j = 0; j < w->n_jobs; j++) {
		const tlm_job *jb = &w->jobs[j];
		char why[160] = "";
		if (jb->finished != 1)
			snprintf(why, sizeof(why), "finished %d times", jb->finished);
		else if (jb->bad_tokens)
			snprintf(why, sizeof(why), "%u tokens beyond limits", jb->bad_tokens);
		else if (jb->reason == BKV_FINISH_ERROR)
			snprintf(why, sizeof(why), "ended with BKV_FINISH_ERROR");
		else if (jb->reason == BKV_FINISH_ABORT && !jb->abort_sent)
			snprintf(why, sizeof(why), "aborted without bkv_abort");
		for (uint32_t b = 0; !why[0] && b < jb->sampling.n_samples; b++) {
			const int32_t *g = jb->got + (size_t)b * jb->max_new;
			const int32_t *r = jb->ref + (size_t)b * jb->max_new;
			const uint32_t gl = jb->got_len[b], rl = jb->ref_len[b];
			const int prefix_ok = jb->reason == BKV_FINISH_ABORT;
			if (gl > rl || (!prefix_ok && gl != rl)) {
				snprintf(why, sizeof(why), "branch %u: %u tokens, reference %u%s", b,
					 gl, rl, prefix_ok ? " (aborted)" : "");
				break;
			}
			for (uint32_t i = 0; i < gl; i++)
				if (g[i] != r[i]) {
					snprintf(why, sizeof(why),
						 "branch %u token %u: got %d, reference %d", b, i,
						 g[i], r[i]);
					break;
				}
		}
		if (why[0]) {
			if (!bad && msg_len)
				snprintf(msg, msg_len,
					 "job %u (prompt %u, n %u, max_new %u, adapter %u): %s", j,
					 jb->prompt_len, jb->sampling.n_samples, jb->max_new,
					 jb->adapter, why);
			bad++;
		}
	}
	return bad;
}

void tlm_workload_latency(const tlm_workload *w, tlm_run_result *res)
{
	double ttft = 0.0, lat = 0.0;
	uint32_t n = 0;
	for (uint32_t j = 0; j < w->n_jobs; j++) {
		const tlm_job *jb = &w->jobs[j];
		if (jb->abort_after || !jb->first_us || !jb->done_us)
			continue;
		ttft += (double)(jb->first_us - jb->submit_us);
		lat += (double)(jb->done_us - jb->submit_us);
		n++;
	}
	res->mean_ttft_us = n ? ttft / n : 0.0;
	res->mean_latency_us = n ? lat / n : 0.0;
}

/* ------------------------------------------------------------------------ */
/* Serving                                                                   */
/* ------------------------------------------------------------------------ */

/* The host pointer the scheduler hands back: the paged host plus the run. */
typedef struct serve_ctx {
	tlm_host *host;
	tlm_device *dev;        /* overlapped: the device thread (else NULL) */
	uint32_t depth;         /* overlapped: sched.overlap (else 0) */
	uint64_t q[BKV_OVERLAP_MAX_DEPTH + 1]; /* overlapped: outstanding
				   tickets, oldest first, n_q <= depth + 1 */
	uint32_t n_q;
	tlm_run_result *res;
	const tlm_model *m;     /* the served model (its draft model's weights) */
	uint32_t draft_layers;  /* the draft model's layers */
} serve_ctx;

/* Speculative decoding with host drafts: the draft model's proposal. */
static int serve_draft(void *p, uint64_t req, uint32_t branch, const int32_t *ctx, uint32_t n_ctx,
		       int32_t *out, uint32_t k, void *user)
{
	const serve_ctx *sc = p;
	const tlm_job *jb = user;
	(void)req;
	return (int)tlm_draft_generate(sc->m, sc->draft_layers, ctx, n_ctx, k,
				       jb->sampling.n_samples, jb->sampling.seed, branch,
				       jb->adapter, jb->sampling.inputs, out);
}

static int serve_forward(void *p, const bkv_batch *b, int32_t *next)
{
	return tlm_host_forward(((serve_ctx *)p)->host, b, next);
}

static int serve_prefill(void *p, const bkv_batch *b, int32_t *next)
{
	return tlm_host_prefill(((serve_ctx *)p)->host, b, next);
}

static int serve_decode(void *p, const bkv_batch *b, int32_t *next)
{
	return tlm_host_decode(((serve_ctx *)p)->host, b, next);
}

static int serve_launch(void *p, const bkv_batch *b, int32_t *next)
{
	return tlm_device_launch(((serve_ctx *)p)->dev, b, next);
}

static void serve_token(void *p, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	serve_ctx *sc = p;
	tlm_job *jb = user;
	sc->res->gen_tokens++;
	if (!jb->got_total++)
		jb->first_us = tlm_now_us();
	if (branch >= jb->sampling.n_samples || jb->got_len[branch] >= jb->max_new ||
	    req != jb->req_id) {
		jb->bad_tokens++;
		return;
	}
	jb->got[(size_t)branch * jb->max_new + jb->got_len[branch]++] = token;
}

static void serve_finish(void *p, uint64_t req, bkv_finish_reason reason, void *user)
{
	tlm_job *jb = user;
	if (req != jb->req_id)
		jb->bad_tokens++;
	jb->finished++;
	jb->reason = reason;
	jb->done_us = tlm_now_us();
}

static int submit(bkv_sched *s, serve_ctx *sc, tlm_job *jb)
{
	bkv_request rq;
	bkv_request_init(&rq);
	rq.prompt = jb->prompt;
	rq.prompt_len = jb->prompt_len;
	rq.max_new_tokens = jb->max_new;
	rq.stop_tokens = jb->stop >= 0 ? &jb->stop : NULL;
	rq.n_stop = jb->stop >= 0 ? 1 : 0;
	rq.n = jb->sampling.n_samples;
	rq.user = jb;
	rq.adapter = jb->adapter;
	rq.n_inputs = jb->inputs.n;
	rq.inputs = jb->inputs.n ? jb->inputs.in : NULL;
	jb->submit_us = tlm_now_us();
	int st = bkv_submit(s, &rq, &jb->req_id);
	if (st == BKV_OK && jb->abort_after == ABORT_AT_SUBMIT) {
		st = bkv_abort(s, jb->req_id);
		jb->abort_sent = 1;
	}
	return st;
}

static void account(tlm_run_result *res, const bkv_step_info *info)
{
	res->steps++;
	res->multi_prefill_steps += info->prefill_calls > 1;
	res->measured_us += info->measured_us;
	res->predicted_us += info->predicted_us;
	res->abs_err_us += info->predicted_us > info->measured_us
				   ? info->predicted_us - info->measured_us
				   : info->measured_us - info->predicted_us;
}

/* Overlapped: wait for the oldest outstanding step on the device thread and
 * complete it. */
static int complete_oldest(bkv_sched *s, serve_ctx *sc)
{
	bkv_step_info info;
	memset(&info, 0, sizeof(info));
	const int dst = tlm_device_wait(sc->dev);
	const int st = bkv_step_complete(s, sc->q[0], dst < 0 ? -1 : 0, &info);
	sc->n_q--;
	memmove(sc->q, sc->q + 1, sc->n_q * sizeof(sc->q[0]));
	if (st == BKV_OK)
		account(sc->res, &info);
	else if (st == BKV_EHOST)
		sc->res->failed_completions++;
	return st;
}

/* Overlapped: launch the next step; once depth + 1 steps are outstanding,
 * complete the oldest (the device computes the others meanwhile), and after
 * a launch with nothing to compute too. BKV_EAGAIN (the plan needs the
 * results of the steps in flight) completes what is outstanding; the next
 * call launches again. */
static int overlap_step(bkv_sched *s, serve_ctx *sc)
{
	uint64_t t = 0;
	int st = bkv_step_launch(s, &t, NULL);
	if (st == BKV_EAGAIN) {
		while (sc->n_q)
			if ((st = complete_oldest(s, sc)) != BKV_OK)
				return st;
		return BKV_OK;
	}
	if (st != BKV_OK)
		return st;
	if (t)
		sc->q[sc->n_q++] = t;
	if (sc->n_q > sc->res->max_outstanding)
		sc->res->max_outstanding = sc->n_q;
	if (sc->n_q == sc->depth + 1 || (t == 0 && sc->n_q))
		return complete_oldest(s, sc);
	return BKV_OK;
}

void tlm_pool_config(const tlm_model *m, const tlm_run_config *rc,
		     bkv_kv_group groups[TLM_MAX_GROUPS], bkv_pool_config *out)
{
	bkv_pool_config pc;
	bkv_pool_config_init(&pc);
	pc.block_tokens = rc->block_tokens;
	pc.device_blocks = rc->device_blocks;
	pc.host_blocks = rc->host_blocks;
	pc.host_cache = rc->host_cache;
	pc.max_seqs = 4096;
	/* a hybrid model: one KV group per kind of layer (tlm_layer_group) */
	pc.n_groups = tlm_n_groups(&m->cfg);
	for (uint32_t g = 0; g < pc.n_groups; g++) {
		uint32_t span, kind = tlm_group_kind(&m->cfg, g, &span), layers = 0;
		for (uint32_t l = 0; l < m->cfg.layers; l++)
			layers += tlm_layer_group(&m->cfg, l) == g;
		groups[g] = (bkv_kv_group){.kind = kind, .layers = layers ? layers : 1,
					   .span = span,
					   .bytes = kind == BKV_GROUP_STATE
							    ? tlm_state_floats(&m->cfg) * sizeof(float)
							    : 2u * tlm_kv_width(&m->cfg) * sizeof(float)};
	}
	pc.groups = groups;
	/* a recurrent state's units: a live and a scratch state per running
	 * branch, and checkpoints */
	pc.state_units = rc->state_units ? rc->state_units : 4 * rc->sched.max_running + 32;
	/* rc->device_blocks are the attention frames; a recurrent state's
	 * arena comes on top (its units are consecutive frames above them).
	 * Shared, the same frames in all, and state_units is the floor. */
	if (pc.n_groups > 1 && groups[pc.n_groups - 1].kind == BKV_GROUP_STATE)
		pc.device_blocks += (rc->state_share ? 4 * rc->sched.max_running + 32
						     : pc.state_units) *
				    bkv_kv_state_frames(groups, pc.n_groups, pc.block_tokens);
	if (rc->state_share) {
		pc.state_share = 1;
		pc.state_units = rc->state_units;
	}
	if (pc.n_groups == 1)
		pc.n_groups = 0, pc.groups = NULL; /* the plain pool */
	*out = pc;
}

int tlm_run(tlm_workload *w, const tlm_model *m, const tlm_run_config *rc, tlm_run_result *res)
{
	memset(res, 0, sizeof(*res));
	tlm_workload_reset(w);
	bkv_kv_group groups[TLM_MAX_GROUPS];
	bkv_pool_config pc;
	tlm_pool_config(m, rc, groups, &pc);
	bkv_pool *pool = NULL;
	bkv_sched *sched = NULL;
	serve_ctx sc = {.res = res, .m = m, .draft_layers = rc->draft_layers};
	int st = bkv_pool_create(&pc, NULL, &pool);
	if (st)
		goto out;
	sc.host = tlm_host_create(m, rc->block_tokens, pc.device_blocks, rc->host_blocks);
	if (!sc.host) {
		st = BKV_ENOMEM;
		goto out;
	}
	bkv_host_ops ops = {.on_token = serve_token, .on_finish = serve_finish};
	const int overlap = rc->sched.overlap != 0;
	if (overlap && rc->split) {
		st = BKV_EINVAL; /* a launch is one mixed call */
		goto out;
	}
	if (overlap) {
		/* a depth out of range: the scheduler refuses it below */
		sc.depth = rc->sched.overlap <= BKV_OVERLAP_MAX_DEPTH ? rc->sched.overlap
								     : BKV_OVERLAP_MAX_DEPTH;
		sc.dev = tlm_device_create(sc.host, sc.depth);
		if (!sc.dev) {
			st = BKV_ENOMEM;
			goto out;
		}
		ops.launch = serve_launch;
		ops.forward = serve_forward;
	} else if (rc->split) {
		ops.prefill = serve_prefill;
		ops.decode = serve_decode;
	} else {
		ops.forward = serve_forward;
	}
	if (rc->draft_layers)
		ops.draft = serve_draft;
	st = bkv_sched_create(&rc->sched, pool, &ops, &sc, NULL, &sched);
	if (st)
		goto out;
	const uint64_t t0 = tlm_now_us();
	uint32_t next_job = 0;
	uint64_t attempts = 0;
	int last_failed = 0;
	const uint64_t max_steps = rc->max_steps ? rc->max_steps : 200000;
	for (;;) {
		uint32_t quota = rc->submit_per_step ? rc->submit_per_step : w->n_jobs;
		for (; quota && next_job < w->n_jobs; quota--, next_job++) {
			res->prompt_tokens += w->jobs[next_job].prompt_len;
			st = submit(sched, &sc, &w->jobs[next_job]);
			if (st)
				goto out;
		}
		if (next_job == w->n_jobs && bkv_sched_pending(sched) == 0 && sc.n_q == 0)
			break;
		if (res->steps >= max_steps || attempts >= 4 * max_steps) {
			st = TLM_STUCK;
			goto out;
		}
		if (overlap) {
			/* Fault injection, overlapped: the device fails the next
			 * launched step (and the ones launched after it); every
			 * outstanding step completes failed and the last
			 * completion rolls them all back. */
			const int inject = rc->fail_every && !last_failed &&
					   ++attempts % rc->fail_every == 0;
			if (inject)
				tlm_device_fail_next(sc.dev, (int)(res->failed_steps & 1));
			else if (!rc->fail_every)
				attempts++;
			st = overlap_step(sched, &sc);
			last_failed = st == BKV_EHOST && rc->fail_every;
			if (last_failed) {
				while (sc.n_q) /* they failed with it */
					(void)complete_oldest(sched, &sc);
				res->failed_steps++;
				st = BKV_OK; /* it may have been the last step */
				continue;
			}
			if (st != BKV_OK)
				goto out;
			goto aborts;
		}
		bkv_step_info info;
		memset(&info, 0, sizeof(info));
		/* Fault injection: every fail_every-th attempt the host fails
		 * (never twice in a row), before touching anything or after
		 * writing K/V; the step must roll back and a retry must carry
		 * on as if nothing happened. */
		const int inject = rc->fail_every && !last_failed &&
				   ++attempts % rc->fail_every == 0;
		if (inject) /* alternate early and late failures */
			tlm_host_fail_next(sc.host, (int)(res->failed_steps & 1));
		tlm_host_step_begin(sc.host); /* the encoder budget is per step */
		st = bkv_step(sched, &info);
		tlm_host_fail_next_clear(sc.host); /* a step with no compute call */
		last_failed = st == BKV_EHOST && inject;
		if (last_failed) {
			res->failed_steps++;
			st = BKV_OK;
			continue;
		}
		if (st)
			goto out;
		account(res, &info);
	aborts:
		/* Aborts chosen "after a few tokens" go out between steps. */
		for (uint32_t j = 0; j < next_job; j++) {
			tlm_job *jb = &w->jobs[j];
			if (jb->abort_after && jb->abort_after != ABORT_AT_SUBMIT &&
			    !jb->abort_sent && !jb->finished && jb->got_total >= jb->abort_after) {
				jb->abort_sent = 1;
				st = bkv_abort(sched, jb->req_id);
				if (st)
					goto out;
			}
		}
	}
	res->wall_us = (double)(tlm_now_us() - t0);
	res->check = bkv_sched_check(sched);
	tlm_workload_latency(w, res);
out:
	while (sc.n_q) /* the device may still read the steps' arrays */
		(void)complete_oldest(sched, &sc);
	res->status = st;
	if (st == BKV_EINVAL || st == BKV_E2BIG) /* this thread's refused create or submit */
		snprintf(res->lib_error, sizeof(res->lib_error), "%s", bkv_last_error());
	if (sched) {
		res->sched.size = sizeof(res->sched);
		bkv_sched_stats_get(sched, &res->sched);
	}
	if (pool) {
		res->pool.size = sizeof(res->pool);
		bkv_pool_stats_get(pool, &res->pool);
	}
	if (sc.host) {
		tlm_host_stats_get(sc.host, &res->host);
		snprintf(res->host_error, sizeof(res->host_error), "%s",
			 tlm_host_last_error(sc.host));
	}
	if (sc.dev)
		tlm_device_result(sc.dev, res);
	bkv_sched_destroy(sched);
	bkv_pool_destroy(pool);
	tlm_device_destroy(sc.dev);
	tlm_host_destroy(sc.host);
	return st;
}
