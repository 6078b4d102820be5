/*
 * decode.c - the decode process of the pair, and pd_run, which forks the
 * prefill process (prefill.c) and serves a workload on the decode side.
 *
 * The decode side's connector maps the library's calls onto the socket:
 *
 *   lookup  a job is sent to the prefill side (PREFILL) when submitted, if
 *           its prompt has a full block before the one holding its last
 *           token; lookup answers BKV_CONNECTOR_LATER until the job's DONE
 *           arrived, then the leading blocks the prefill side holds (at
 *           most n); 0 for a prompt not sent, and once the socket closed.
 *   load    records the transfer (its blocks, copied) and sends GET with
 *           their hashes; refused (-1: every block is computed) once the
 *           socket closed.
 *   save    none: the decode side only loads.
 *
 * One receiver thread reads everything the prefill side sends. DONE sets
 * the job's count; BLOCKS takes the transfer off the in-flight list, checks
 * each frame (wire.c) and copies its KV into the device blocks the load
 * named (the library keeps them untouched until the load completes), then
 * calls bkv_kv_xfer_done with the blocks that were short, corrupt or not
 * held. When the socket closes, a transfer cut mid-reply fails from the
 * block that did not arrive whole, and every transfer still in flight fails
 * whole (BKV_EHOST): the library recomputes what they named.
 *
 * When a step had nothing to compute (every request waits for the other
 * side), the stepping thread sleeps on wake until the receiver has read
 * something (or 5 ms passed), instead of spinning on the cores the prefill
 * process needs.
 *
 * Locking: mu guards dead, closing, done[], the in-flight list and heard; the
 * stepping thread is the only writer to the socket, the receiver its only
 * reader. The receiver's counters in pd_result are written under mu.
 */
#include "pdpair.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A load in flight. */
typedef struct dc_xfer {
	uint64_t id;            /* the library's transfer id */
	uint32_t n;             /* blocks */
	bkv_kv_xfer_block *b;   /* [n] copied from the load call */
	struct dc_xfer *next;   /* the in-flight list */
} dc_xfer;

typedef struct dc {
	const tlm_model *m;     /* the served model (the frames' payload size) */
	const pd_config *cfg;   /* the run's settings */
	tlm_workload *w;        /* the jobs; a job's index is its wire tag */
	pd_result *res;         /* what the run measures */
	int fd;                 /* the socket */
	tlm_host *host;         /* the paged host: loads write its KV tensor */
	bkv_sched *sched;       /* the decode scheduler */
	pthread_mutex_t mu;
	pthread_cond_t wake;    /* signalled on heard's change */
	uint64_t heard;         /* mu: messages read (and the close) */
	int dead;               /* mu: the socket closed or failed */
	int closing;            /* mu: this side shut it down (the end) */
	int32_t *done;          /* mu: [n_jobs] DONE's count; -1: not yet */
	uint8_t *sent;          /* [n_jobs] PREFILL sent (stepping thread) */
	dc_xfer *xf;            /* mu: loads in flight */
} dc;

static tlm_job *job_of(dc *d, uint64_t req, uint32_t *j)
{
	for (uint32_t i = 0; i < d->w->n_jobs; i++)
		if (d->w->jobs[i].req_id == req) {
			*j = i;
			return &d->w->jobs[i];
		}
	return NULL;
}

/* ---- the connector -------------------------------------------------------- */

static int dc_lookup(void *user, uint64_t req, const uint64_t *hashes, uint32_t n)
{
	dc *d = user;
	uint32_t j;
	int ans;

	(void)hashes;
	if (n == 0 || !job_of(d, req, &j) || !d->sent[j])
		return 0;
	pthread_mutex_lock(&d->mu);
	if (d->dead)
		ans = 0;
	else if (d->done[j] < 0)
		ans = BKV_CONNECTOR_LATER;
	else
		ans = (int)((uint32_t)d->done[j] < n ? (uint32_t)d->done[j] : n);
	pthread_mutex_unlock(&d->mu);
	if (ans == BKV_CONNECTOR_LATER)
		d->res->later++;
	return ans;
}

static int dc_load(void *user, uint64_t xfer, uint64_t req, const bkv_kv_xfer_block *b,
		   uint32_t n)
{
	dc *d = user;
	dc_xfer *x = calloc(1, sizeof(*x));
	uint64_t *h = malloc(n * sizeof(*h));
	pd_msg mh = {PD_GET, n, xfer};
	int ok;

	(void)req;
	if (!x || !h || !(x->b = malloc(n * sizeof(*b)))) {
		free(x ? x->b : NULL), free(x), free(h);
		return -1;
	}
	x->id = xfer;
	x->n = n;
	memcpy(x->b, b, n * sizeof(*b));
	for (uint32_t i = 0; i < n; i++)
		h[i] = b[i].hash;
	pthread_mutex_lock(&d->mu);
	if (d->dead) {
		pthread_mutex_unlock(&d->mu);
		free(x->b), free(x), free(h);
		return -1;
	}
	x->next = d->xf;
	d->xf = x;
	pthread_mutex_unlock(&d->mu);
	ok = !pd_write_full(d->fd, &mh, sizeof(mh)) && !pd_write_full(d->fd, h, n * sizeof(*h));
	free(h);
	if (ok)
		return 0;
	/* Not sent: refuse it, unless the receiver already failed it (the
	 * socket closed meanwhile), which completed it. */
	pthread_mutex_lock(&d->mu);
	d->dead = 1;
	for (dc_xfer **pp = &d->xf; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			pthread_mutex_unlock(&d->mu);
			free(x->b), free(x);
			return -1;
		}
	pthread_mutex_unlock(&d->mu);
	return 0;
}

/* ---- the receiver thread ------------------------------------------------- */

/* Read one BLOCKS reply's frames into x's blocks and complete x. Returns 0,
 * or -1 when the stream ended or broke mid-reply. */
static int recv_blocks(dc *d, dc_xfer *x, uint8_t **buf, size_t *cap)
{
	uint32_t *failed = malloc((x->n ? x->n : 1) * sizeof(uint32_t)), nf = 0, i;
	uint64_t in = 0, bad = 0, missing = 0;
	int cut = 0;

	if (!failed) {
		(void)bkv_kv_xfer_done(d->sched, x->id, BKV_ENOMEM, NULL, 0);
		return -1;
	}
	for (i = 0; i < x->n; i++) {
		uint32_t len;
		if (pd_read_full(d->fd, &len, sizeof(len)) || len > PD_MAX_FRAME) {
			cut = 1;
			break;
		}
		if (len == 0) {
			missing++;
			failed[nf++] = i;
			continue;
		}
		if (len > *cap) {
			uint8_t *g = realloc(*buf, len);
			if (!g) {
				cut = 1;
				break;
			}
			*buf = g, *cap = len;
		}
		if (pd_read_full(d->fd, *buf, len)) {
			cut = 1;
			break;
		}
		if (pd_frame_load(d->host, d->m, d->cfg->rc.block_tokens, x->b[i].block,
				  x->b[i].hash, *buf, len)) {
			bad++;
			failed[nf++] = i;
		} else {
			in++;
		}
	}
	for (; i < x->n; i++) /* cut mid-reply: the rest never came */
		failed[nf++] = i;
	pthread_mutex_lock(&d->mu);
	d->res->blocks_in += in;
	d->res->blocks_bad += bad;
	d->res->blocks_missing += missing;
	d->res->xfers_cut += cut;
	pthread_mutex_unlock(&d->mu);
	(void)bkv_kv_xfer_done(d->sched, x->id, BKV_OK, failed, nf);
	free(failed);
	return cut ? -1 : 0;
}

static void *dc_recv(void *arg)
{
	dc *d = arg;
	uint8_t *buf = NULL;
	size_t cap = 0;
	dc_xfer *x, *rest;

	for (;;) {
		pd_msg mh;
		if (pd_read_full(d->fd, &mh, sizeof(mh)))
			break;
		if (mh.type == PD_DONE && mh.tag < d->w->n_jobs) {
			pthread_mutex_lock(&d->mu);
			d->done[mh.tag] = (int32_t)mh.n;
			d->heard++;
			pthread_cond_signal(&d->wake);
			pthread_mutex_unlock(&d->mu);
			continue;
		}
		if (mh.type != PD_BLOCKS)
			break; /* not our protocol: give up on the peer */
		pthread_mutex_lock(&d->mu);
		dc_xfer **pp = &d->xf;
		while (*pp && (*pp)->id != mh.tag)
			pp = &(*pp)->next;
		x = *pp;
		if (x)
			*pp = x->next;
		pthread_mutex_unlock(&d->mu);
		if (!x || x->n != mh.n) {
			if (x) { /* the reply does not match: the peer is broken */
				(void)bkv_kv_xfer_done(d->sched, x->id, BKV_EHOST, NULL, 0);
				free(x->b), free(x);
			}
			break;
		}
		const int st = recv_blocks(d, x, &buf, &cap);
		free(x->b), free(x);
		pthread_mutex_lock(&d->mu);
		d->heard++;
		pthread_cond_signal(&d->wake);
		pthread_mutex_unlock(&d->mu);
		if (st)
			break;
	}
	/* The socket closed: no more answers. Fail what is in flight. */
	pthread_mutex_lock(&d->mu);
	d->dead = 1;
	if (!d->closing)
		d->res->peer_closed = 1;
	rest = d->xf;
	d->xf = NULL;
	d->heard++;
	pthread_cond_signal(&d->wake);
	for (x = rest; x; x = x->next)
		d->res->xfers_cut++;
	pthread_mutex_unlock(&d->mu);
	while (rest) {
		x = rest;
		rest = x->next;
		(void)bkv_kv_xfer_done(d->sched, x->id, BKV_EHOST, NULL, 0);
		free(x->b), free(x);
	}
	free(buf);
	return NULL;
}

/* ---- the host callbacks --------------------------------------------------- */

static int dc_forward(void *user, const bkv_batch *batch, int32_t *next)
{
	return tlm_host_forward(((dc *)user)->host, batch, next);
}

static void dc_token(void *user, uint64_t req, uint32_t branch, int32_t token, void *ru)
{
	dc *d = user;
	tlm_job *jb = ru;

	d->res->gen_tokens++;
	if (!jb->got_total++)
		jb->first_us = tlm_now_us();
	if (branch >= jb->sampling.n_samples || jb->got_len[branch] >= jb->max_new ||
	    req != jb->req_id) {
		jb->bad_tokens++;
		return;
	}
	jb->got[(size_t)branch * jb->max_new + jb->got_len[branch]++] = token;
}

static void dc_finish(void *user, uint64_t req, bkv_finish_reason reason, void *ru)
{
	tlm_job *jb = ru;

	(void)user;
	if (req != jb->req_id)
		jb->bad_tokens++;
	jb->finished++;
	jb->reason = reason;
	jb->done_us = tlm_now_us();
}

/* ---- the run -------------------------------------------------------------- */

void pd_config_default(pd_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	bkv_sched_config_init(&cfg->rc.sched);
	cfg->rc.sched.max_running = 16;
	cfg->rc.sched.admit_group = 1;
	cfg->rc.block_tokens = 16;
	cfg->rc.device_blocks = 512;
	cfg->prefill_blocks = 512;
	cfg->prefill_running = 16;
	cfg->faults.die_at = -1;
	cfg->faults.cut_at = -1;
	cfg->faults.corrupt_at = -1;
}

/* Wait until the receiver read something after `since` (or 5 ms). */
static void wait_heard(dc *d, uint64_t since)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_nsec += 5000000;
	if (until.tv_nsec >= 1000000000)
		until.tv_sec++, until.tv_nsec -= 1000000000;
	pthread_mutex_lock(&d->mu);
	while (d->heard == since)
		if (pthread_cond_timedwait(&d->wake, &d->mu, &until))
			break;
	pthread_mutex_unlock(&d->mu);
}

/* Submit job j, and send it to the prefill side when its prompt has a
 * block the connector may load. */
static int submit(dc *d, uint32_t j)
{
	tlm_job *jb = &d->w->jobs[j];
	bkv_request rq;

	bkv_request_init(&rq);
	rq.prompt = jb->prompt;
	rq.prompt_len = jb->prompt_len;
	rq.max_new_tokens = jb->max_new;
	rq.stop_tokens = jb->stop >= 0 ? &jb->stop : NULL;
	rq.n_stop = jb->stop >= 0 ? 1 : 0;
	rq.n = jb->sampling.n_samples;
	rq.user = jb;
	if (jb->prompt_len > d->cfg->rc.block_tokens) {
		pd_msg mh = {PD_PREFILL, jb->prompt_len, j};
		pthread_mutex_lock(&d->mu);
		const int dead = d->dead;
		pthread_mutex_unlock(&d->mu);
		if (!dead && (pd_write_full(d->fd, &mh, sizeof(mh)) ||
			      pd_write_full(d->fd, jb->prompt, jb->prompt_len * sizeof(int32_t)))) {
			pthread_mutex_lock(&d->mu);
			d->dead = 1;
			pthread_mutex_unlock(&d->mu);
		}
		d->sent[j] = !dead;
	}
	d->res->prompt_tokens += jb->prompt_len;
	jb->submit_us = tlm_now_us();
	return bkv_submit(d->sched, &rq, &jb->req_id);
}

int pd_run(tlm_workload *w, const tlm_model *m, const pd_config *cfg, pd_result *res)
{
	dc d = {.m = m, .cfg = cfg, .w = w, .res = res, .fd = -1};
	bkv_kv_group groups[TLM_MAX_GROUPS];
	bkv_pool_config pc;
	bkv_pool *pool = NULL;
	bkv_sched_config sc = cfg->rc.sched;
	bkv_connector cn;
	pthread_t rx;
	int sv[2], st = -1, have_rx = 0;
	pid_t pid;

	memset(res, 0, sizeof(*res));
	tlm_workload_reset(w);
	for (uint32_t j = 0; j < w->n_jobs; j++)
		if (w->jobs[j].abort_after) {
			snprintf(res->err, sizeof(res->err), "job %u is aborted: not supported", j);
			return res->status = BKV_EINVAL;
		}
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
		snprintf(res->err, sizeof(res->err), "socketpair failed");
		return res->status = -1;
	}
	fflush(stdout), fflush(stderr);
	pid = fork();
	if (pid < 0) {
		close(sv[0]), close(sv[1]);
		snprintf(res->err, sizeof(res->err), "fork failed");
		return res->status = -1;
	}
	if (pid == 0) { /* the prefill process */
		close(sv[0]);
		const int rc = pd_prefill_main(sv[1], m, cfg);
		close(sv[1]);
		exit(rc ? 1 : 0);
	}
	close(sv[1]);
	d.fd = sv[0];
	pthread_mutex_init(&d.mu, NULL);
	pthread_cond_init(&d.wake, NULL);
	d.done = malloc(w->n_jobs * sizeof(*d.done));
	d.sent = calloc(w->n_jobs, 1);
	if (!d.done || !d.sent)
		goto out;
	for (uint32_t j = 0; j < w->n_jobs; j++)
		d.done[j] = -1;
	tlm_pool_config(m, &cfg->rc, groups, &pc);
	if ((st = bkv_pool_create(&pc, NULL, &pool)) != BKV_OK)
		goto out;
	st = -1;
	d.host = tlm_host_create(m, cfg->rc.block_tokens, pc.device_blocks, cfg->rc.host_blocks);
	if (!d.host)
		goto out;
	memset(&cn, 0, sizeof(cn));
	cn.lookup = dc_lookup;
	cn.load = dc_load;
	cn.user = &d;
	sc.connector = &cn;
	bkv_host_ops ops = {.forward = dc_forward, .on_token = dc_token, .on_finish = dc_finish};
	if ((st = bkv_sched_create(&sc, pool, &ops, &d, NULL, &d.sched)) != BKV_OK) {
		snprintf(res->err, sizeof(res->err), "%s", bkv_last_error());
		goto out;
	}
	if (pthread_create(&rx, NULL, dc_recv, &d)) {
		st = -1;
		goto out;
	}
	have_rx = 1;
	const uint64_t t0 = tlm_now_us(), limit_us = 300u * 1000000u;
	uint32_t next = 0;
	for (;;) {
		uint32_t quota = cfg->rc.submit_per_step ? cfg->rc.submit_per_step : w->n_jobs;
		for (; quota && next < w->n_jobs; quota--, next++)
			if ((st = submit(&d, next)) != BKV_OK)
				goto out;
		if (next == w->n_jobs && bkv_sched_pending(d.sched) == 0)
			break;
		if (tlm_now_us() - t0 > limit_us) {
			st = TLM_STUCK;
			snprintf(res->err, sizeof(res->err), "not done after %llu s",
				 (unsigned long long)(limit_us / 1000000u));
			goto out;
		}
		bkv_step_info info;
		memset(&info, 0, sizeof(info));
		pthread_mutex_lock(&d.mu);
		const uint64_t heard = d.heard;
		pthread_mutex_unlock(&d.mu);
		if ((st = bkv_step(d.sched, &info)) != BKV_OK) {
			snprintf(res->err, sizeof(res->err), "bkv_step: %s", bkv_strerror(st));
			goto out;
		}
		if (info.rows == 0) /* everything waits for the other side */
			wait_heard(&d, heard);
	}
	res->wall_us = (double)(tlm_now_us() - t0);
	res->check = bkv_sched_check(d.sched);
	tlm_run_result lat;
	memset(&lat, 0, sizeof(lat));
	tlm_workload_latency(w, &lat);
	res->mean_ttft_us = lat.mean_ttft_us;
	res->mean_latency_us = lat.mean_latency_us;
	st = 0;
out:
	pthread_mutex_lock(&d.mu);
	d.closing = 1;
	pthread_mutex_unlock(&d.mu);
	shutdown(d.fd, SHUT_WR); /* the prefill process sees the end, exits, and
				    its end closes: the receiver ends */
	if (have_rx)
		pthread_join(rx, NULL);
	close(d.fd);
	waitpid(pid, &res->prefill_exit, 0);
	if (d.sched) {
		res->sched.size = sizeof(res->sched);
		bkv_sched_stats_get(d.sched, &res->sched);
	}
	bkv_sched_destroy(d.sched);
	bkv_pool_destroy(pool);
	tlm_host_destroy(d.host);
	pthread_mutex_destroy(&d.mu);
	pthread_cond_destroy(&d.wake);
	free(d.done);
	free(d.sent);
	return res->status = st;
}
