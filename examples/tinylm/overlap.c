/*
 * overlap.c - tinylm's device thread for overlapped scheduling.
 *
 *   engine thread                          device thread
 *   bkv_step_launch -> tlm_device_launch   (queue: batch struct copy, next)
 *     returns at once                      takes the oldest step not run:
 *   bkv_step_launch (plans on top)           placeholders <- its own copy of
 *   tlm_device_wait (the oldest has run)       the tokens of the steps
 *   bkv_step_complete                          launched before it
 *                                            tlm_host_forward(batch, next)
 *                                            keeps a copy of next, signals
 *
 * What a GPU runtime does with streams, on a thread: the device runs the
 * steps in launch order, the sampled tokens of a step stay on the device for
 * the placeholders of the steps launched after it, and the engine
 * synchronises once per step, when it needs that step's tokens. At depth N
 * (bkv_sched_config.overlap) a placeholder BKV_TOKEN_PENDING_AT(back, i)
 * names row i of the step launched `back` launches before (back <= N), so
 * the device keeps the sampled tokens of its last BKV_OVERLAP_MAX_DEPTH
 * steps in a ring of copies, each tagged with its step's launch number:
 *
 *   out[s % DEV_KEEP] = step s's next_tokens    step s + back reads it
 *
 * The library keeps the arrays of a launched step valid until it completes,
 * but not the bkv_batch struct itself, which the launch copies. The queue
 * holds at most the N + 1 outstanding steps the library allows and refuses
 * a launch beyond them; one mutex guards it.
 *
 * In the persistent layout the device thread applies each step's table
 * deltas to the host's mirror as it runs the step: in launch order, each
 * launch's deltas relative to the one before (what a runtime's stream-
 * ordered copy of its block tables does). The library's row_tables (the
 * host's self-check of its mirror, and a hybrid's tables of its other KV
 * groups, which the host reads) are valid only during the launch callback,
 * so the launch copies the tables of the call's rows with the batch (and
 * the batch's groups with their tables), and the device thread reads that
 * copy.
 * The batch's encoder lists (encode, encoder_free) stay valid until the
 * step completes: the device reads them where the library left them.
 */
#include "overlap.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEV_QUEUE (BKV_OVERLAP_MAX_DEPTH + 1u) /* ring slots: the most
							 outstanding steps */
#define DEV_KEEP BKV_OVERLAP_MAX_DEPTH /* sampled-token copies kept: the
					  farthest a placeholder reaches back */

typedef struct dev_step {
	bkv_batch b;      /* the launched batch (struct copied) */
	int32_t *next;    /* the library's next_tokens for it */
	uint64_t seq;     /* its launch number (1, 2, ... in launch order) */
	int status;       /* after it ran */
	int fail;         /* 0, or tlm_host_fail_next's late + 1 (armed at
			     launch) */
	bkv_batch_group grp[BKV_MAX_GROUPS]; /* the call's groups (struct
					  copied; b.groups points here) */
	/* persistent: the call's rows' tables at launch, set 0 the batch's
	 * own (b.row_tables and b.row_table_len point there), set 1 + g
	 * group g's (grp[g].row_tables and row_table_len) */
	const int32_t **tabs; /* [TABLE_SETS * tabs_cap] each slot's copied
				 table, set by set */
	uint32_t *tlen;       /* [TABLE_SETS * tabs_cap] its entries */
	uint32_t tabs_cap;    /* slots per set */
	int32_t *blk;         /* the copied entries */
	uint32_t blk_cap;
} dev_step;

#define TABLE_SETS (1u + BKV_MAX_GROUPS)

/* One step's sampled tokens, as the device keeps them for the placeholders
 * of the steps launched after it. */
typedef struct dev_out {
	int32_t *tok;     /* next_tokens of step seq, copied after it ran */
	uint32_t n, cap;  /* rows in tok; its capacity */
	uint64_t seq;     /* the step's launch number; 0: none (or it failed) */
} dev_out;

struct tlm_device {
	tlm_host *host;
	pthread_t th;
	pthread_mutex_t mu;    /* guards the queue fields and quit */
	pthread_cond_t cv;     /* work queued, a step done, quit */
	dev_step q[DEV_QUEUE]; /* ring: [head, head + n) launched, the first
				  n_run of them have run */
	uint32_t head, n, n_run;
	uint32_t depth;        /* bkv_sched_config.overlap: n <= depth + 1 */
	uint64_t launched;     /* launch number of the last queued step */
	int quit;
	int broken;            /* a step failed: the ones after it fail too
				  until the queue drains */
	int fail_next;         /* tlm_device_fail_next: the next launch's
				  dev_step.fail */
	char error[192];       /* why the device first refused a launch or
				  failed a step on a placeholder ("" none;
				  under mu) */
	/* device thread only */
	int32_t *tok;          /* the running step's token ids, placeholders
				  replaced */
	uint32_t tok_cap;
	dev_out out[DEV_KEEP]; /* the last steps' sampled tokens: step s's
				  in out[s % DEV_KEEP] once it ran */
	uint64_t placeholders[DEV_KEEP]; /* replaced so far, by back distance
					    - 1 (under mu) */
};

static int grow(int32_t **p, uint32_t *cap, uint32_t n)
{
	if (n <= *cap)
		return 0;
	int32_t *q = realloc(*p, (size_t)n * 2 * sizeof(int32_t));
	if (!q)
		return -1;
	*p = q;
	*cap = n * 2;
	return 0;
}

/* Record why the device failed a step (the first reason only; under mu). */
static void dev_error(tlm_device *d, const char *why, uint64_t seq, int32_t v)
{
	pthread_mutex_lock(&d->mu);
	if (!d->error[0])
		snprintf(d->error, sizeof(d->error),
			 "step %llu: placeholder %d (back %u, row %u) %s",
			 (unsigned long long)seq, (int)v, (unsigned)BKV_TOKEN_PENDING_BACK(v),
			 (unsigned)BKV_TOKEN_PENDING_ROW(v), why);
	pthread_mutex_unlock(&d->mu);
}

/* The token placeholder v of step seq stands for: row
 * BKV_TOKEN_PENDING_ROW(v) of the step launched BKV_TOKEN_PENDING_BACK(v)
 * launches before seq, from the device's copy of its tokens. -1 when v
 * names no step the device ran within the depth, or no row of it. */
static int substitute(tlm_device *d, uint64_t seq, int32_t v, int32_t *tok)
{
	const uint32_t back = BKV_TOKEN_PENDING_BACK(v), row = BKV_TOKEN_PENDING_ROW(v);
	if (back < 1 || back > d->depth || back >= seq) {
		dev_error(d, "reaches beyond the depth", seq, v);
		return -1;
	}
	const dev_out *o = &d->out[(seq - back) % DEV_KEEP];
	if (o->seq != seq - back || row >= o->n) {
		dev_error(d, "names no row the device sampled", seq, v);
		return -1;
	}
	*tok = o->tok[row];
	return 0;
}

/* Run one step on the device thread (outside the mutex); subst counts the
 * placeholders it replaced by back distance. */
static int dev_run(tlm_device *d, dev_step *st, int broken, uint64_t subst[DEV_KEEP])
{
	bkv_batch b = st->b;
	dev_out *o = &d->out[st->seq % DEV_KEEP];
	if (broken) /* skipped: the host still drops what the call frees */
		tlm_host_encoder_free(d->host, &b);
	if (broken || grow(&d->tok, &d->tok_cap, b.n_tokens ? b.n_tokens : 1) ||
	    grow(&o->tok, &o->cap, b.n_rows ? b.n_rows : 1))
		return -1;
	for (uint32_t t = 0; t < b.n_tokens; t++) {
		int32_t v = b.token_ids[t];
		if (BKV_TOKEN_IS_PENDING(v)) {
			if (substitute(d, st->seq, b.token_ids[t], &v))
				return -1;
			subst[BKV_TOKEN_PENDING_BACK(b.token_ids[t]) - 1]++;
		}
		d->tok[t] = v;
	}
	b.token_ids = d->tok;
	if (st->fail) /* the host is the device thread's alone */
		tlm_host_fail_next(d->host, st->fail - 1);
	o->seq = 0; /* its slot now holds this step's tokens, or none */
	int rc = tlm_host_forward(d->host, &b, st->next);
	if (rc == 0) {
		memcpy(o->tok, st->next, (size_t)b.n_rows * sizeof(int32_t));
		o->n = b.n_rows;
		o->seq = st->seq;
	}
	return rc;
}

static void *dev_main(void *arg)
{
	tlm_device *d = arg;
	pthread_mutex_lock(&d->mu);
	for (;;) {
		while (!d->quit && d->n_run == d->n)
			pthread_cond_wait(&d->cv, &d->mu);
		if (d->quit && d->n_run == d->n)
			break;
		dev_step *st = &d->q[(d->head + d->n_run) % DEV_QUEUE];
		const int broken = d->broken;
		pthread_mutex_unlock(&d->mu);
		uint64_t subst[DEV_KEEP] = {0};
		int rc = dev_run(d, st, broken, subst);
		pthread_mutex_lock(&d->mu);
		st->status = rc;
		for (uint32_t k = 0; k < DEV_KEEP; k++)
			d->placeholders[k] += subst[k];
		if (rc)
			d->broken = 1;
		d->n_run++;
		pthread_cond_broadcast(&d->cv);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

tlm_device *tlm_device_create(tlm_host *host, uint32_t depth)
{
	if (depth < 1 || depth > BKV_OVERLAP_MAX_DEPTH)
		return NULL;
	tlm_device *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->host = host;
	d->depth = depth;
	pthread_mutex_init(&d->mu, NULL);
	pthread_cond_init(&d->cv, NULL);
	if (pthread_create(&d->th, NULL, dev_main, d) != 0) {
		pthread_mutex_destroy(&d->mu);
		pthread_cond_destroy(&d->cv);
		free(d);
		return NULL;
	}
	return d;
}

void tlm_device_destroy(tlm_device *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->mu);
	d->quit = 1;
	pthread_cond_broadcast(&d->cv);
	pthread_mutex_unlock(&d->mu);
	pthread_join(d->th, NULL);
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->cv);
	for (uint32_t i = 0; i < DEV_QUEUE; i++) {
		free(d->q[i].tabs);
		free(d->q[i].tlen);
		free(d->q[i].blk);
	}
	for (uint32_t i = 0; i < DEV_KEEP; i++)
		free(d->out[i].tok);
	free(d->tok);
	free(d);
}

/* Copy the tables of b's rows in one table set (tabs, len: the library's,
 * valid during the launch callback only) to set `set` of st, at *off in
 * st->blk. Returns the set's slots' tables. */
static const int32_t **copy_set(dev_step *st, const bkv_batch *b, uint32_t set,
				const int32_t *const *tabs, const uint32_t *len, uint32_t *off)
{
	const int32_t **out = st->tabs + (size_t)set * st->tabs_cap;
	uint32_t *olen = st->tlen + (size_t)set * st->tabs_cap;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		const uint32_t slot = b->row_slot[r];
		if (slot >= b->n_row_slots)
			continue; /* the host reports it */
		const uint32_t n = len[slot];
		memcpy(st->blk + *off, tabs[slot], (size_t)n * sizeof(int32_t));
		out[slot] = st->blk + *off;
		olen[slot] = n;
		*off += n;
	}
	return out;
}

/* Copy b's groups into st and, in the persistent layout, the tables of b's
 * rows in every table set (valid during the launch callback only); point
 * st's batch at the copies. -1 without memory. */
static int copy_tables(dev_step *st, const bkv_batch *b)
{
	uint32_t need = 0, off = 0, r, g;
	const uint32_t ng = b->groups && b->n_groups <= BKV_MAX_GROUPS ? b->n_groups : 0;

	if (ng) {
		memcpy(st->grp, b->groups, ng * sizeof(*st->grp));
		st->b.groups = st->grp;
	}
	if (b->layout != BKV_BATCH_PERSISTENT || !b->row_tables || !b->row_table_len)
		return 0;
	for (r = 0; r < b->n_rows; r++) {
		const uint32_t slot = b->row_slot[r];
		if (slot >= b->n_row_slots)
			continue;
		need += b->row_table_len[slot];
		for (g = 0; g < ng; g++)
			if (b->groups[g].row_tables && b->groups[g].row_table_len)
				need += b->groups[g].row_table_len[slot];
	}
	if (b->n_row_slots > st->tabs_cap) {
		free(st->tabs);
		free(st->tlen);
		st->tabs_cap = b->n_row_slots;
		st->tabs = calloc((size_t)TABLE_SETS * st->tabs_cap, sizeof(*st->tabs));
		st->tlen = calloc((size_t)TABLE_SETS * st->tabs_cap, sizeof(*st->tlen));
		if (!st->tabs || !st->tlen) {
			st->tabs_cap = 0;
			return -1;
		}
	}
	if (grow(&st->blk, &st->blk_cap, need ? need : 1))
		return -1;
	st->b.row_tables = copy_set(st, b, 0, b->row_tables, b->row_table_len, &off);
	st->b.row_table_len = st->tlen;
	for (g = 0; g < ng; g++) {
		if (!b->groups[g].row_tables || !b->groups[g].row_table_len)
			continue;
		st->grp[g].row_tables = copy_set(st, b, 1 + g, b->groups[g].row_tables,
						 b->groups[g].row_table_len, &off);
		st->grp[g].row_table_len = st->tlen + (size_t)(1 + g) * st->tabs_cap;
	}
	return 0;
}

int tlm_device_launch(void *dev, const bkv_batch *batch, int32_t *next_tokens)
{
	tlm_device *d = dev;
	int rc = 0;
	pthread_mutex_lock(&d->mu);
	if (d->n == d->depth + 1) {
		rc = -1; /* beyond the N + 1 outstanding steps the library allows */
		if (!d->error[0])
			snprintf(d->error, sizeof(d->error),
				 "a launch with %u steps outstanding at depth %u", d->n, d->depth);
	} else {
		dev_step *st = &d->q[(d->head + d->n) % DEV_QUEUE];
		st->b = *batch;
		st->next = next_tokens;
		st->seq = d->launched + 1;
		st->status = 0;
		st->fail = d->fail_next;
		if (copy_tables(st, batch)) {
			rc = -1;
		} else {
			d->n++;
			d->launched++;
			d->fail_next = 0;
			pthread_cond_broadcast(&d->cv);
		}
	}
	pthread_mutex_unlock(&d->mu);
	return rc;
}

int tlm_device_wait(tlm_device *d)
{
	pthread_mutex_lock(&d->mu);
	if (d->n == 0) {
		pthread_mutex_unlock(&d->mu);
		return -1;
	}
	while (d->n_run == 0)
		pthread_cond_wait(&d->cv, &d->mu);
	int rc = d->q[d->head].status;
	d->head = (d->head + 1) % DEV_QUEUE;
	d->n--;
	d->n_run--;
	if (d->n == 0)
		d->broken = 0; /* drained: the next step starts afresh */
	pthread_mutex_unlock(&d->mu);
	return rc;
}

void tlm_device_fail_next(tlm_device *d, int late)
{
	pthread_mutex_lock(&d->mu);
	d->fail_next = late ? 2 : 1;
	pthread_mutex_unlock(&d->mu);
}

uint64_t tlm_device_placeholders(tlm_device *d, uint32_t back)
{
	uint64_t n = 0;
	pthread_mutex_lock(&d->mu);
	for (uint32_t k = 0; k < DEV_KEEP; k++)
		if (back == 0 || back == k + 1)
			n += d->placeholders[k];
	pthread_mutex_unlock(&d->mu);
	return n;
}

void tlm_device_last_error(tlm_device *d, char *buf, size_t len)
{
	if (!len)
		return;
	pthread_mutex_lock(&d->mu);
	snprintf(buf, len, "%s", d->error);
	pthread_mutex_unlock(&d->mu);
}

void tlm_device_result(tlm_device *d, tlm_run_result *res)
{
	char why[sizeof(d->error)];
	for (uint32_t k = 0; k < BKV_OVERLAP_MAX_DEPTH; k++)
		res->placeholders[k] = tlm_device_placeholders(d, k + 1);
	tlm_device_last_error(d, why, sizeof(why));
	if (why[0])
		snprintf(res->host_error, sizeof(res->host_error), "device: %s", why);
}
