/*
 * threaded.c - tinylm the way a server embeds libbatchkv: client threads
 * submit requests and receive tokens through callbacks, while one engine
 * thread owns the scheduler and does nothing but step.
 *
 *   client 0 ──bkv_submit/bkv_abort──┐                 ┌── on_token ──> client's
 *   client 1 ──bkv_submit/bkv_abort──┼──> inbox ──> engine thread:     callback
 *   ...                              ┘    bkv_step, bkv_step, ... ─┴── on_finish
 *
 * The library's thread rules are exactly these: bkv_submit and bkv_abort may be
 * called from any thread while the engine thread runs bkv_step; everything
 * else (bkv_step, bkv_sched_pending, the host callbacks) runs on the engine
 * thread. Each request's user pointer is a client_req holding the client's
 * own callbacks; the engine's on_token/on_finish just dispatch to them, so the
 * engine knows nothing about clients. A client keeps a window of requests in
 * flight, and aborts a request itself once enough tokens have arrived (a user
 * closing the connection), from its own thread.
 *
 * The engine sleeps in bkv_sched_wait while nothing is pending (a
 * submission ends it; the last client to leave calls bkv_sched_wake); the
 * overlapped engine sleeps on a condition variable of its own, which a
 * client signals after each submission, as it also waits for the device. Lock order: the engine may hold a
 * client's mutex inside a callback (called from bkv_step), so a client never
 * calls into the library while holding its own mutex.
 *
 * Overlapped (tlm_threaded_serve_overlap, the last part of this file): the
 * engine drives the two-phase step instead, and a device thread
 * (overlap.c) runs the launched steps: the engine plans the next step
 * while the device computes up to rc->sched.overlap steps (1 if 0), and
 * once that many are in flight and one more is launched it waits for the
 * oldest and completes it.
 */
#include "threaded.h"
#include "overlap.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct client;

/* One request as a client sees it; its address is the request's user
 * pointer. */
typedef struct client_req {
	tlm_sampling sampling; /* first: the paged host reads it */
	void (*on_token)(struct client_req *cr, uint32_t branch, int32_t token);
	void (*on_done)(struct client_req *cr, bkv_finish_reason reason);
	tlm_job *job;          /* where tokens go */
	struct client *cl;     /* owner */
	uint64_t req_id;       /* from bkv_submit; read by the client only */
	int done;              /* on_done seen (under cl->mu) */
} client_req;

typedef struct engine {
	bkv_sched *sched;
	tlm_host *host;
	pthread_mutex_t mu;    /* guards clients_left and the wakeup */
	pthread_cond_t cv;     /* signalled on submission and client exit */
	uint32_t clients_left; /* clients still submitting or waiting */
	int failed;            /* bkv_step failed: status in status */
	int status;
	tlm_run_result *res;   /* counters written by the engine thread only */
	uint64_t max_steps;    /* give up (TLM_STUCK) after this many steps */
	/* overlapped serving only */
	tlm_device *dev;       /* the device thread */
	uint32_t depth;        /* sched.overlap: steps in flight at most */
	uint64_t q[BKV_OVERLAP_MAX_DEPTH + 1]; /* outstanding steps, oldest
					  first; n_q <= depth + 1 */
	uint32_t n_q;
} engine;

typedef struct client {
	engine *eng;
	tlm_workload *w;
	uint32_t index, stride; /* serves jobs index, index+stride, ... */
	uint32_t window;        /* most requests in flight */
	client_req *reqs;       /* [n_jobs] (only own jobs used) */
	pthread_mutex_t mu;     /* guards tokens, done flags, in_flight */
	pthread_cond_t cv;      /* a token or a finish arrived */
	uint32_t in_flight;
	int status;             /* first library error seen */
} client;

/* ---- the engine side: dispatch to the client's callbacks ---- */

static int eng_forward(void *p, const bkv_batch *b, int32_t *next)
{
	return tlm_host_forward(((engine *)p)->host, b, next);
}

static int eng_prefill(void *p, const bkv_batch *b, int32_t *next)
{
	return tlm_host_prefill(((engine *)p)->host, b, next);
}

static int eng_decode(void *p, const bkv_batch *b, int32_t *next)
{
	return tlm_host_decode(((engine *)p)->host, b, next);
}

static void eng_token(void *p, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	client_req *cr = user;
	((engine *)p)->res->gen_tokens++;
	cr->on_token(cr, branch, token);
}

static void eng_finish(void *p, uint64_t req, bkv_finish_reason reason, void *user)
{
	client_req *cr = user;
	cr->on_done(cr, reason);
}

static int eng_launch(void *p, const bkv_batch *b, int32_t *next)
{
	return tlm_device_launch(((engine *)p)->dev, b, next);
}

static void *engine_main(void *arg)
{
	engine *e = arg;
	for (;;) {
		/* sleep in the library until a client submits (bkv_sched_wait);
		 * the last client to leave wakes it (bkv_sched_wake) */
		if (bkv_sched_wait(e->sched, UINT64_MAX) != BKV_OK) {
			pthread_mutex_lock(&e->mu);
			const int quit = e->clients_left == 0 && bkv_sched_pending(e->sched) == 0;
			pthread_mutex_unlock(&e->mu);
			if (quit)
				return NULL;
			continue;
		}
		bkv_step_info info;
		int st = e->res->steps >= e->max_steps ? TLM_STUCK : bkv_step(e->sched, &info);
		if (st) {
			pthread_mutex_lock(&e->mu);
			e->failed = 1;
			e->status = st;
			pthread_mutex_unlock(&e->mu);
			return NULL;
		}
		e->res->steps++;
		e->res->measured_us += info.measured_us;
		e->res->predicted_us += info.predicted_us;
	}
}

/* ---- the client side ---- */

static void client_token(client_req *cr, uint32_t branch, int32_t token)
{
	client *cl = cr->cl;
	tlm_job *jb = cr->job;
	pthread_mutex_lock(&cl->mu);
	if (!jb->got_total++)
		jb->first_us = tlm_now_us();
	if (branch >= jb->sampling.n_samples || jb->got_len[branch] >= jb->max_new)
		jb->bad_tokens++;
	else
		jb->got[(size_t)branch * jb->max_new + jb->got_len[branch]++] = token;
	if (jb->abort_after && jb->got_total == jb->abort_after)
		pthread_cond_signal(&cl->cv);
	pthread_mutex_unlock(&cl->mu);
}

static void client_done(client_req *cr, bkv_finish_reason reason)
{
	client *cl = cr->cl;
	pthread_mutex_lock(&cl->mu);
	cr->job->finished++;
	cr->job->reason = reason;
	cr->job->done_us = tlm_now_us();
	cr->done = 1;
	cl->in_flight--;
	pthread_cond_signal(&cl->cv);
	pthread_mutex_unlock(&cl->mu);
}

static int engine_failed(engine *e)
{
	pthread_mutex_lock(&e->mu);
	int f = e->failed;
	pthread_mutex_unlock(&e->mu);
	return f;
}

/* Abort (outside cl->mu) every request of ours that has seen enough. */
static void client_aborts(client *cl, uint32_t upto)
{
	for (uint32_t j = cl->index; j < upto; j += cl->stride) {
		client_req *cr = &cl->reqs[j];
		tlm_job *jb = cr->job;
		pthread_mutex_lock(&cl->mu);
		const int want = jb->abort_after && jb->abort_after != UINT32_MAX &&
				 !jb->abort_sent && !cr->done && jb->got_total >= jb->abort_after;
		if (want)
			jb->abort_sent = 1;
		pthread_mutex_unlock(&cl->mu);
		if (want) {
			int st = bkv_abort(cl->eng->sched, cr->req_id);
			if (st && st != BKV_ENOENT && !cl->status) /* ENOENT: it just ended */
				cl->status = st;
		}
	}
}

static void wait_until(client *cl, uint32_t max_in_flight, uint32_t upto)
{
	for (;;) {
		client_aborts(cl, upto);
		pthread_mutex_lock(&cl->mu);
		if (cl->in_flight <= max_in_flight) {
			pthread_mutex_unlock(&cl->mu);
			return;
		}
		/* Wake at least every 10 ms to notice an engine failure. */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 10000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&cl->cv, &cl->mu, &ts);
		pthread_mutex_unlock(&cl->mu);
		if (engine_failed(cl->eng))
			return;
	}
}

static void *client_main(void *arg)
{
	client *cl = arg;
	engine *e = cl->eng;
	uint32_t j = cl->index;
	for (; j < cl->w->n_jobs && !cl->status; j += cl->stride) {
		wait_until(cl, cl->window - 1, j);
		if (engine_failed(e))
			break;
		client_req *cr = &cl->reqs[j];
		tlm_job *jb = cr->job;
		bkv_request rq;
		bkv_request_init(&rq);
		rq.prompt = jb->prompt;
		rq.prompt_len = jb->prompt_len;
		rq.max_new_tokens = jb->max_new;
		rq.stop_tokens = jb->stop >= 0 ? &jb->stop : NULL;
		rq.n_stop = jb->stop >= 0 ? 1 : 0;
		rq.n = jb->sampling.n_samples;
		rq.user = cr;
		rq.adapter = jb->adapter;
		rq.n_inputs = jb->inputs.n;
		rq.inputs = jb->inputs.n ? jb->inputs.in : NULL;
		pthread_mutex_lock(&cl->mu);
		cl->in_flight++;
		jb->submit_us = tlm_now_us();
		pthread_mutex_unlock(&cl->mu);
		int st = bkv_submit(e->sched, &rq, &cr->req_id);
		if (st) {
			cl->status = st;
			pthread_mutex_lock(&cl->mu);
			cl->in_flight--;
			pthread_mutex_unlock(&cl->mu);
			break;
		}
		if (jb->abort_after == UINT32_MAX) {
			jb->abort_sent = 1;
			st = bkv_abort(e->sched, cr->req_id);
			if (st && st != BKV_ENOENT)
				cl->status = st;
		}
		pthread_mutex_lock(&e->mu);
		pthread_cond_signal(&e->cv);
		pthread_mutex_unlock(&e->mu);
	}
	wait_until(cl, 0, j < cl->w->n_jobs ? j : cl->w->n_jobs);
	pthread_mutex_lock(&e->mu);
	e->clients_left--;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
	(void)bkv_sched_wake(e->sched); /* the engine sees clients_left */
	return NULL;
}

static void *engine_main_overlap(void *arg);

static int serve(tlm_workload *w, const tlm_model *m, const tlm_run_config *rc,
		 uint32_t n_clients, uint32_t window, tlm_run_result *res, int overlap)
{
	memset(res, 0, sizeof(*res));
	if (!n_clients || !window)
		return BKV_EINVAL;
	tlm_workload_reset(w);
	bkv_kv_group groups[TLM_MAX_GROUPS];
	bkv_pool_config pc;
	tlm_pool_config(m, rc, groups, &pc);
	bkv_pool *pool = NULL;
	engine e = {.res = res, .clients_left = n_clients,
		    .max_steps = rc->max_steps ? rc->max_steps : 200000};
	pthread_mutex_init(&e.mu, NULL);
	pthread_cond_init(&e.cv, NULL);
	client *cls = calloc(n_clients, sizeof(client));
	client_req *reqs = calloc(w->n_jobs, sizeof(client_req));
	int st = !cls || !reqs ? BKV_ENOMEM : bkv_pool_create(&pc, NULL, &pool);
	if (st)
		goto out;
	e.host = tlm_host_create(m, rc->block_tokens, pc.device_blocks, rc->host_blocks);
	if (!e.host) {
		st = BKV_ENOMEM;
		goto out;
	}
	bkv_host_ops ops = {.on_token = eng_token, .on_finish = eng_finish};
	bkv_sched_config sc = rc->sched;
	if (overlap) {
		if (!sc.overlap)
			sc.overlap = 1;
		/* a depth out of range: the scheduler refuses it below */
		e.depth = sc.overlap <= BKV_OVERLAP_MAX_DEPTH ? sc.overlap : BKV_OVERLAP_MAX_DEPTH;
		e.dev = tlm_device_create(e.host, e.depth);
		if (!e.dev) {
			st = BKV_ENOMEM;
			goto out;
		}
		ops.launch = eng_launch;
		ops.forward = eng_forward;
	} else if (rc->split) {
		ops.prefill = eng_prefill;
		ops.decode = eng_decode;
	} else {
		ops.forward = eng_forward;
	}
	/* bkv_submit from several threads: the default (libc) allocator is
	 * thread-safe, as the header requires. */
	st = bkv_sched_create(&sc, pool, &ops, &e, NULL, &e.sched);
	if (st)
		goto out;
	for (uint32_t j = 0; j < w->n_jobs; j++) {
		reqs[j].sampling = w->jobs[j].sampling;
		reqs[j].on_token = client_token;
		reqs[j].on_done = client_done;
		reqs[j].job = &w->jobs[j];
		reqs[j].cl = &cls[j % n_clients];
		res->prompt_tokens += w->jobs[j].prompt_len;
	}
	const uint64_t t0 = tlm_now_us();
	pthread_t eng_thread, *cl_threads = calloc(n_clients, sizeof(pthread_t));
	if (!cl_threads) {
		st = BKV_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n_clients; i++) {
		cls[i] = (client){.eng = &e, .w = w, .index = i, .stride = n_clients,
				  .window = window, .reqs = reqs};
		pthread_mutex_init(&cls[i].mu, NULL);
		pthread_cond_init(&cls[i].cv, NULL);
	}
	pthread_create(&eng_thread, NULL, overlap ? engine_main_overlap : engine_main, &e);
	for (uint32_t i = 0; i < n_clients; i++)
		pthread_create(&cl_threads[i], NULL, client_main, &cls[i]);
	for (uint32_t i = 0; i < n_clients; i++)
		pthread_join(cl_threads[i], NULL);
	pthread_join(eng_thread, NULL);
	res->wall_us = (double)(tlm_now_us() - t0);
	free(cl_threads);
	for (uint32_t i = 0; i < n_clients; i++) {
		if (!st && cls[i].status)
			st = cls[i].status;
		pthread_mutex_destroy(&cls[i].mu);
		pthread_cond_destroy(&cls[i].cv);
	}
	if (e.failed)
		st = e.status;
	if (!st)
		res->check = bkv_sched_check(e.sched);
	tlm_workload_latency(w, res);
out:
	res->status = st;
	if (st == BKV_EINVAL || st == BKV_E2BIG) /* this thread's refused create or submit */
		snprintf(res->lib_error, sizeof(res->lib_error), "%s", bkv_last_error());
	if (e.sched) {
		res->sched.size = sizeof(res->sched);
		bkv_sched_stats_get(e.sched, &res->sched);
	}
	if (e.host) {
		tlm_host_stats_get(e.host, &res->host);
		snprintf(res->host_error, sizeof(res->host_error), "%s", tlm_host_last_error(e.host));
	}
	if (pool) {
		res->pool.size = sizeof(res->pool);
		bkv_pool_stats_get(pool, &res->pool);
	}
	if (e.dev)
		tlm_device_result(e.dev, res);
	bkv_sched_destroy(e.sched);
	bkv_pool_destroy(pool);
	tlm_device_destroy(e.dev);
	tlm_host_destroy(e.host);
	pthread_mutex_destroy(&e.mu);
	pthread_cond_destroy(&e.cv);
	free(cls);
	free(reqs);
	return st;
}

int tlm_threaded_serve(tlm_workload *w, const tlm_model *m, const tlm_run_config *rc,
		       uint32_t n_clients, uint32_t window, tlm_run_result *res)
{
	return serve(w, m, rc, n_clients, window, res, 0);
}

/* ---- overlapped serving: the two-phase step and a device thread ---- */

/* Wait for the oldest outstanding step on the device and complete it. */
static int eng_complete1(engine *e)
{
	bkv_step_info info;
	int dst = tlm_device_wait(e->dev);
	int st = bkv_step_complete(e->sched, e->q[0], dst < 0 ? -1 : 0, &info);
	e->n_q--;
	memmove(e->q, e->q + 1, e->n_q * sizeof(e->q[0]));
	if (st == BKV_OK) {
		e->res->steps++;
		e->res->measured_us += info.measured_us;
		e->res->predicted_us += info.predicted_us;
	}
	return st;
}

static void eng_fail(engine *e, int st)
{
	while (e->n_q) /* the device may still read the steps' arrays */
		(void)eng_complete1(e);
	pthread_mutex_lock(&e->mu);
	e->failed = 1;
	e->status = st;
	pthread_mutex_unlock(&e->mu);
}

/* Launch the next step; once depth + 1 steps are outstanding complete the
 * oldest (the device computes the others while the library plans), and
 * after a launch with nothing to compute too. BKV_EAGAIN (the plan needs
 * the results of the steps in flight) completes what is outstanding and
 * launches again. */
static void *engine_main_overlap(void *arg)
{
	engine *e = arg;
	for (;;) {
		pthread_mutex_lock(&e->mu);
		while (bkv_sched_pending(e->sched) == 0 && e->clients_left > 0 && e->n_q == 0)
			pthread_cond_wait(&e->cv, &e->mu);
		const int quit = e->clients_left == 0 && bkv_sched_pending(e->sched) == 0 &&
				 e->n_q == 0;
		pthread_mutex_unlock(&e->mu);
		if (quit)
			return NULL;
		if (e->res->steps >= e->max_steps) {
			eng_fail(e, TLM_STUCK);
			return NULL;
		}
		uint64_t t = 0;
		int st = bkv_step_launch(e->sched, &t, NULL);
		if (st == BKV_EAGAIN) {
			while (e->n_q) {
				st = eng_complete1(e);
				if (st != BKV_OK) {
					eng_fail(e, st);
					return NULL;
				}
			}
			continue;
		}
		if (st != BKV_OK) {
			eng_fail(e, st);
			return NULL;
		}
		if (t)
			e->q[e->n_q++] = t;
		if (e->n_q > e->res->max_outstanding)
			e->res->max_outstanding = e->n_q;
		if (e->n_q == e->depth + 1 || (t == 0 && e->n_q)) {
			st = eng_complete1(e);
			if (st != BKV_OK) {
				eng_fail(e, st);
				return NULL;
			}
		}
	}
}

int tlm_threaded_serve_overlap(tlm_workload *w, const tlm_model *m, const tlm_run_config *rc,
			       uint32_t n_clients, uint32_t window, tlm_run_result *res)
{
	if (rc->split || rc->fail_every)
		return BKV_EINVAL; /* a launch is one mixed call; no injection here */
	return serve(w, m, rc, n_clients, window, res, 1);
}
