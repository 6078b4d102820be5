/*
 * connector.c - the KV connector stage (bkv_sched_config.connector): an
 * external store's KV loaded instead of computed, computed KV saved to it.
 *
 * Lookup. A request entering the queue is asked about once: the store
 * answers how many of its prompt's leading full blocks it holds (the
 * hashes were computed at submit, on the caller's thread). "Ask later"
 * keeps the request on the later list, off the queue, asked again at each
 * drain; the queue goes on without it.
 *
 * Load. Admission (or a running lane's next chunk) takes local prefix hits
 * first; when the store holds more, the lane appends the blocks it holds
 * beyond them, marked noindex (pool/connect.c), and gets no row: the
 * request runs, holds its slot and blocks, and waits. After the step
 * commits, the load goes out naming every group's blocks (a STATE group's
 * live unit too). When it completes (bkv_kv_xfer_done, any thread, onto the
 * done list under the inbox lock), the next step, inside its transaction,
 * publishes the blocks to the prefix cache and the lane prefills on. A
 * failed block cuts the lane back to it, or to nothing when a group could
 * not keep the shorter length (a window's blocks, a STATE group's state),
 * and what is cut is computed; a rolled-back step publishes again.
 *
 * Save. After each commit, and before a lane's sequence ends, its full
 * blocks the prefix cache took since the last save go out, in transfers
 * of at most save_blocks blocks, at most max_saves in flight (the rest
 * waits for the next commit).
 *
 * Holding. A transfer counts on its sequence's slot (busy). A sequence
 * whose lane lets go of it (end, abort, preemption) while it is busy is
 * parked: closed, truncated or dropped as asked only once its last
 * transfer completed, so no block a transfer names is freed, evicted or
 * reused meanwhile, and the chain of its parents stays pinned with it. A
 * busy sequence is never swapped out.
 */
#include "sched/sched.h"
#include "decide/decide.h"

#include <string.h>

#define CN_NONE UINT32_MAX
#define CN_IDX_BITS 21u /* record index bits of a transfer id */

/* A request's connector data: one allocation at submit. */
typedef struct bkv__cn_buf {
	size_t size;             /* bytes of this allocation */
	uint32_t nb;             /* hashes: prompt blocks a load may cover */
	uint32_t cap;            /* entries in ents */
	uint8_t busy;            /* ents are named by a load in flight */
	uint64_t *hash;          /* [nb] group 0's chained hashes */
	bkv_kv_xfer_block *ents; /* [cap] a load's entries */
} bkv__cn_buf;

/* One transfer in flight. */
typedef struct bkv__cn_rec {
	uint64_t id;             /* its transfer id; 0: the record is free */
	bkv__req *req;           /* load: the request it loads for; NULL once
				    the request let go (ended, preempted) */
	bkv__cn_buf *own;        /* load: a buffer to free at completion (its
				    request was freed meanwhile) */
	bkv_kv_xfer_block *ents; /* [n] the entries the connector was given */
	uint32_t n;              /* entries */
	uint32_t seq;            /* the sequence whose blocks they are */
	uint32_t from;           /* load: first logical block */
	uint32_t to;             /* load: one past the last */
	uint8_t load;            /* 1: a load, 0: a save */
	uint8_t done;            /* lock: completed, on the done list */
	int32_t status;          /* lock: the completion's status */
	uint32_t next;           /* lock: the done list's link (CN_NONE) */
} bkv__cn_rec;

/* A parked sequence's end (by slot). */
typedef struct bkv__cn_park {
	uint8_t on;    /* parked */
	uint8_t drop;  /* drop, not close */
	uint32_t keep; /* truncate to it first; UINT32_MAX: as it is */
	uint32_t seq;  /* its id */
} bkv__cn_park;

/* A lane marked by a step (a load planned, a publication). */
typedef struct bkv__cn_mark {
	bkv__lane *lane; /* the lane */
	uint64_t step;   /* the step that planned it */
	uint32_t from;   /* a load's first block */
	uint32_t pad;    /* zero */
} bkv__cn_mark;

typedef struct bkv__cn {
	bkv_connector ops;      /* copied; save_blocks and max_saves resolved */
	bkv__cn_rec *rec;       /* [n_rec]: loads [0, n_load), saves after */
	uint32_t n_rec;         /* records */
	uint32_t n_load;        /* load records (2 x max_running) */
	uint32_t *free_load;    /* [n_load] free load records (stack) */
	uint32_t n_free_load;   /* entries in it */
	uint32_t *free_save;    /* [n_rec - n_load] free save records */
	uint32_t n_free_save;   /* entries in it */
	bkv_kv_xfer_block *save_ents; /* [saves x save_blocks] */
	uint64_t serial;        /* transfer counter (an id's high bits) */
	uint32_t done_head;     /* lock: completed records, LIFO */
	uint32_t *busy;         /* [max_seqs] transfers naming each slot */
	bkv__cn_park *park;     /* [max_seqs] parked ends */
	bkv__req *later;        /* requests asked again each step */
	uint32_t n_later;       /* entries on it */
	bkv__cn_mark *plan;     /* [max_running] loads planned by steps not
				   committed yet */
	uint32_t n_plan;        /* entries */
	bkv__cn_mark *pub;      /* [max_running] lanes published by steps not
				   committed yet (a rollback publishes
				   them again) */
	uint32_t n_pub;         /* entries */
	uint32_t n_loading;     /* requests with cn_loading set */
	uint32_t held;          /* blocks named by saves in flight */
	uint32_t slot_mask;     /* a sequence id's slot bits */
	int quiet;              /* no saves (bkv_sched_kv_release: the KV
				   goes with the memory) */
} bkv__cn;

/* ---- create, destroy, requests ------------------------------------------- */

static size_t cn_bytes(const bkv_sched *s, const bkv__cn *c, uint32_t saves, uint32_t max_seqs)
{
	return (size_t)c->n_rec * sizeof(bkv__cn_rec) + (size_t)c->n_rec * sizeof(uint32_t) +
	       (size_t)saves * c->ops.save_blocks * sizeof(bkv_kv_xfer_block) +
	       (size_t)max_seqs * (sizeof(uint32_t) + sizeof(bkv__cn_park)) +
	       2 * (size_t)s->cfg.max_running * sizeof(bkv__cn_mark);
}

int bkv__cn_create(bkv_sched *s, const bkv_connector *ops)
{
	const uint32_t max_seqs = bkv__pool_max_seqs(s->pool);
	uint32_t saves, i;
	bkv__cn *c;
	char *p;

	if (!ops->lookup || !ops->load)
		return bkv__fail(BKV_EINVAL, "bkv_sched_create: bkv_sched_config.connector needs "
				 "lookup and load");
	if (!bkv__pool_prefix_on(s->pool))
		return bkv__fail(BKV_EINVAL, "bkv_sched_create: a KV connector needs the pool's "
				 "prefix cache (bkv_pool_config.prefix_cache)");
	if (ops->save && bkv__pool_xfer_on(s->pool) != BKV_OK)
		return BKV_ENOMEM;
	c = bkv__malloc(&s->alloc, sizeof(*c));
	if (!c)
		return BKV_ENOMEM;
	memset(c, 0, sizeof(*c));
	c->ops = *ops;
	if (!c->ops.save_blocks)
		c->ops.save_blocks = 256;
	if (!c->ops.max_saves)
		c->ops.max_saves = 64;
	saves = ops->save ? c->ops.max_saves : 0;
	c->n_load = 2 * s->cfg.max_running;
	c->n_rec = c->n_load + saves;
	if (c->n_rec >= (1u << CN_IDX_BITS)) {
		bkv__free(&s->alloc, c, sizeof(*c));
		return bkv__fail(BKV_EINVAL, "bkv_sched_create: connector max_saves + 2 x "
				 "max_running must be < 2^21");
	}
	p = bkv__malloc(&s->alloc, cn_bytes(s, c, saves, max_seqs));
	if (!p) {
		bkv__free(&s->alloc, c, sizeof(*c));
		return BKV_ENOMEM;
	}
	memset(p, 0, cn_bytes(s, c, saves, max_seqs));
	/* 8-byte aligned parts first, then the 4-byte ones */
	c->rec = (bkv__cn_rec *)(void *)p;
	c->save_ents = (bkv_kv_xfer_block *)(void *)(c->rec + c->n_rec);
	c->plan = (bkv__cn_mark *)(void *)(c->save_ents + (size_t)saves * c->ops.save_blocks);
	c->pub = c->plan + s->cfg.max_running;
	c->park = (bkv__cn_park *)(void *)(c->pub + s->cfg.max_running);
	c->busy = (uint32_t *)(void *)(c->park + max_seqs);
	c->free_load = c->busy + max_seqs;
	c->free_save = c->free_load + c->n_load;
	for (i = c->n_load; i-- > 0;)
		c->free_load[c->n_free_load++] = i;
	for (i = c->n_rec; i-- > c->n_load;) {
		c->rec[i].ents = c->save_ents + (size_t)(i - c->n_load) * c->ops.save_blocks;
		c->free_save[c->n_free_save++] = i;
	}
	c->done_head = CN_NONE;
	c->slot_mask = (1u << 20) - 1;
	s->cn = c;
	return BKV_OK;
}

void bkv__cn_destroy(bkv_sched *s)
{
	bkv__cn *c = s->cn;
	uint32_t i, saves;

	if (!c)
		return;
	for (i = 0; i < bkv__pool_max_seqs(s->pool); i++) /* the host stopped its
							     connector first */
		if (c->park[i].on)
			bkv_seq_drop(s->pool, c->park[i].seq);
	for (i = 0; i < c->n_load; i++)
		if (c->rec[i].id && c->rec[i].own)
			bkv__free(&s->alloc, c->rec[i].own, c->rec[i].own->size);
	for (i = c->n_load; i < c->n_rec; i++) /* saves: their holds go back */
		if (c->rec[i].id)
			bkv__xfer_release(s->pool, c->rec[i].ents, c->rec[i].n);
	saves = c->n_rec - c->n_load;
	bkv__free(&s->alloc, c->rec, cn_bytes(s, c, saves, bkv__pool_max_seqs(s->pool)));
	bkv__free(&s->alloc, c, sizeof(*c));
	s->cn = NULL;
}

int bkv__cn_req_init(bkv_sched *s, bkv__req *r)
{
	const uint32_t nb = (r->prompt_len - 1) >> s->bt_shift;
	uint32_t cap;
	size_t size;
	bkv__cn_buf *b;

	if (nb == 0)
		return BKV_OK; /* nothing a store could give */
	cap = bkv__xfer_ents_max(s->pool, nb);
	size = sizeof(*b) + (size_t)nb * sizeof(uint64_t) + (size_t)cap * sizeof(bkv_kv_xfer_block);
	b = bkv__malloc(&s->alloc, size);
	if (!b)
		return BKV_ENOMEM;
	b->size = size;
	b->nb = nb;
	b->cap = cap;
	b->busy = 0;
	b->hash = (uint64_t *)(void *)(b + 1);
	b->ents = (bkv_kv_xfer_block *)(void *)(b->hash + nb);
	bkv_block_hashes(bkv__pool_hash_seed(s->pool), r->cache_key, s->bt, r->lane[0].tok,
			 nb * s->bt, b->hash);
	r->cn_buf = b;
	return BKV_OK;
}

void bkv__cn_req_free(bkv_sched *s, bkv__req *r)
{
	bkv__cn_buf *b = r->cn_buf;

	r->cn_buf = NULL;
	if (s->cn && r->cn_rec) { /* a load still names it: it frees it */
		s->cn->rec[r->cn_rec - 1].own = b;
		s->cn->rec[r->cn_rec - 1].req = NULL;
		r->cn_rec = 0;
		return;
	}
	bkv__free(&s->alloc, b, b->size);
}

/* ---- lookup --------------------------------------------------------------- */

/* Ask the store; 1 when it said later. */
static int ask(bkv_sched *s, bkv__req *r)
{
	bkv__cn *c = s->cn;
	int n;

	s->stats.kv_lookups++;
	n = c->ops.lookup(c->ops.user, r->id, r->cn_buf->hash, r->cn_buf->nb);
	if (n == BKV_CONNECTOR_LATER)
		return 1;
	if (n < 0) {
		s->stats.kv_lookup_errors++;
		n = 0;
	}
	r->cn_ext = BKV_MIN((uint32_t)n, r->cn_buf->nb);
	r->cn_ask = 2;
	return 0;
}

int bkv__cn_ask(bkv_sched *s, bkv__req *r)
{
	if (r->cn_ask == 2 || !r->cn_buf) {
		r->cn_ask = 2;
		return 0;
	}
	if (!ask(s, r))
		return 0;
	r->cn_ask = 1;
	r->state = BKV__REQ_INBOX; /* off the queue; counted as not drained */
	r->cn_next = s->cn->later;
	s->cn->later = r;
	s->cn->n_later++;
	return 1;
}

void bkv__cn_drain(bkv_sched *s, uint64_t now)
{
	bkv__cn *c = s->cn;
	bkv__req **link = &c->later, *r;

	while ((r = *link) != NULL) {
		if (ask(s, r)) {
			link = &r->cn_next;
			continue;
		}
		*link = r->cn_next;
		r->cn_next = NULL;
		c->n_later--;
		r->state = BKV__REQ_WAITING;
		r->order = ++s->q.arrival;
		r->enq_us = now;
		r->queued_with = s->q.queue_slots + r->n_live;
		bkv__queue_push(s, r);
	}
}

/* A request on the later list ends (abort): off the list. */
static void unlater(bkv_sched *s, bkv__req *r)
{
	bkv__cn *c = s->cn;
	bkv__req **link;

	for (link = &c->later; *link; link = &(*link)->cn_next) {
		if (*link == r) {
			*link = r->cn_next;
			c->n_later--;
			ATOMIC_SUB(&s->in.nr_queued, 1);
			break;
		}
	}
	r->cn_next = NULL;
	r->cn_ask = 2;
}

/* ---- sequences' ends ------------------------------------------------------ */

int bkv__cn_defer_end(bkv_sched *s, uint32_t seq, int drop, uint32_t keep)
{
	bkv__cn *c = s->cn;
	const uint32_t slot = seq & c->slot_mask;

	if (!c->busy[slot])
		return 0;
	c->park[slot].on = 1;
	c->park[slot].drop = (uint8_t)(drop != 0);
	c->park[slot].keep = keep;
	c->park[slot].seq = seq;
	return 1;
}

/* A transfer on seq completed: a parked end may go now. */
static void unbusy(bkv_sched *s, uint32_t seq)
{
	bkv__cn *c = s->cn;
	const uint32_t slot = seq & c->slot_mask;
	bkv__cn_park *p = &c->park[slot];

	BKV_ASSERT(c->busy[slot] > 0);
	if (--c->busy[slot] || !p->on)
		return;
	p->on = 0;
	bkv__pool_seq_end(s->pool, p->seq, p->drop, p->keep);
}

int bkv__cn_busy_req(const bkv_sched *s, const bkv__req *r)
{
	uint32_t i;

	if (r->cn_loading)
		return 1;
	for (i = 0; i < r->n; i++)
		if (r->lane[i].seq != BKV__SEQ_NONE &&
		    s->cn->busy[r->lane[i].seq & s->cn->slot_mask])
			return 1;
	return 0;
}

void bkv__cn_quiet(bkv_sched *s, int on)
{
	if (s->cn)
		s->cn->quiet = on;
}

void bkv__cn_preempted(bkv_sched *s, const bkv__req *r)
{
	if (s->cn->ops.preempted)
		s->cn->ops.preempted(s->cn->ops.user, r->id);
}

/* The request lets go of its lanes (ends, preempted): its load, if any,
 * completes into a parked sequence. */
void bkv__cn_disown(bkv_sched *s, bkv__req *r)
{
	bkv__cn *c = s->cn;

	if (r->cn_ask == 1)
		unlater(s, r);
	if (r->cn_loading) {
		r->cn_loading = 0;
		c->n_loading--;
	}
	if (r->cn_rec) {
		c->rec[r->cn_rec - 1].req = NULL;
		c->rec[r->cn_rec - 1].own = r->cn_buf; /* the load names it */
		r->cn_buf = NULL;
		r->cn_rec = 0;
	}
}

/* ---- loads ---------------------------------------------------------------- */

int bkv__cn_load_plan(bkv_sched *s, bkv__lane *l, uint32_t target)
{
	bkv__cn *c = s->cn;
	bkv__req *r = l->req;
	uint32_t from = l->kv_len >> s->bt_shift, to = r->cn_ext, iv = bkv__pool_state_interval(s->pool);

	if (l != &r->lane[0] || r->cn_ask != 2 || !r->cn_buf || r->cn_buf->busy || r->cn_loading ||
	    (l->kv_len & (s->bt - 1)) || target == 0)
		return 0;
	to = BKV_MIN(to, (target - 1) >> s->bt_shift); /* the last token computes */
	if (iv) /* a STATE group keeps states at multiples of its interval */
		to = to * s->bt / iv * iv / s->bt;
	if (to <= from || c->n_plan >= s->cfg.max_running)
		return 0;
	/* with KV groups: where every group's blocks are held */
	to = bkv__xfer_fit(s->pool, r->cache_key, l->tok, r->cn_buf->hash, from, to, c->ops.contains,
			   c->ops.user);
	if (to <= from) {
		r->cn_ext = from; /* no end is whole there: not asked again */
		return 0;
	}
	if (bkv__seq_append_load(s->pool, l->seq, l->tok + l->kv_len, (to - from) << s->bt_shift) !=
	    BKV_OK)
		return 0;
	l->kv_len = to << s->bt_shift;
	l->cn_saved = to;
	r->cn_loading = 1;
	c->n_loading++;
	c->plan[c->n_plan].lane = l;
	c->plan[c->n_plan].step = s->plan.step_no;
	c->plan[c->n_plan++].from = from;
	return 1;
}

static uint64_t rec_take(bkv__cn *c, int load)
{
	uint32_t i;
	bkv__cn_rec *x;

	if (load ? !c->n_free_load : !c->n_free_save)
		return 0;
	i = load ? c->free_load[--c->n_free_load] : c->free_save[--c->n_free_save];
	x = &c->rec[i];
	x->id = ++c->serial << CN_IDX_BITS | i;
	x->load = (uint8_t)load;
	x->done = 0;
	x->status = 0;
	x->next = CN_NONE;
	x->req = NULL;
	x->own = NULL;
	return x->id;
}

static void rec_put(bkv__cn *c, bkv__cn_rec *x)
{
	uint32_t i = (uint32_t)(x - c->rec);

	x->id = 0;
	if (x->load)
		c->free_load[c->n_free_load++] = i;
	else
		c->free_save[c->n_free_save++] = i;
}

/* The transfer could not start: complete it as failed at the next step. */
static void failed_start(bkv_sched *s, bkv__cn_rec *x)
{
	LOCK(s);
	if (!x->done) {
		x->done = 1;
		x->status = BKV_EHOST;
		x->next = s->cn->done_head;
		s->cn->done_head = (uint32_t)(x - s->cn->rec);
	}
	UNLOCK(s);
}

/* Cut a loading lane back to len tokens, or to none where a group cannot
 * keep that length (a window's blocks before the load's end went, a STATE
 * group keeps only the state at its end). */
static void cut_back(bkv_sched *s, bkv__lane *l, uint32_t len)
{
	if (len < l->kv_len && !bkv__seq_can_cut(s->pool, l->seq, len))
		len = 0;
	if (len < l->kv_len && bkv_seq_truncate(s->pool, l->seq, len) == BKV_OK)
		l->kv_len = len;
	l->cn_saved = l->kv_len >> s->bt_shift;
}

/* A planned load that cannot go out: the lane computes instead. */
static void load_cancel(bkv_sched *s, bkv__lane *l, uint32_t from)
{
	bkv__req *r = l->req;

	bkv__seq_noindex(s->pool, l->seq, 0);
	cut_back(s, l, from << s->bt_shift);
	r->cn_loading = 0;
	s->cn->n_loading--;
}

static void load_issue(bkv_sched *s, bkv__lane *l, uint32_t from)
{
	bkv__cn *c = s->cn;
	bkv__req *r = l->req;
	bkv__cn_buf *b = r->cn_buf;
	const uint32_t to = l->kv_len >> s->bt_shift;
	uint64_t id;
	bkv__cn_rec *x;

	id = rec_take(c, 1);
	if (!id) {
		load_cancel(s, l, from);
		return;
	}
	x = &c->rec[id & ((1u << CN_IDX_BITS) - 1)];
	x->req = r;
	x->seq = l->seq;
	x->from = from;
	x->to = to;
	x->ents = b->ents;
	x->n = bkv__seq_xfer_ents(s->pool, l->seq, from, to, b->hash + from, b->ents, b->cap);
	if (!x->n || bkv__xfer_copies_touch(s->pool, x->ents, x->n)) {
		/* a pending copy (made by the host at its next call) still
		 * reads or writes one of them: compute instead */
		s->stats.kv_load_failed += to - from;
		rec_put(c, x);
		load_cancel(s, l, from);
		return;
	}
	b->busy = 1;
	r->cn_rec = (uint32_t)(x - c->rec) + 1;
	c->busy[l->seq & c->slot_mask]++;
	s->stats.kv_loads++;
	if (c->ops.load(c->ops.user, id, r->id, x->ents, x->n) < 0)
		failed_start(s, x);
}

/* A completed load: publish what arrived, cut what failed. */
static void load_done(bkv_sched *s, bkv__cn_rec *x)
{
	bkv__cn *c = s->cn;
	bkv__req *r = x->req;
	bkv__lane *l = r ? &r->lane[0] : NULL;
	uint32_t at = x->status < 0 ? x->from : x->to, i, nf = 0, len;

	for (i = 0; i < x->n; i++) {
		if (x->status < 0 || x->ents[i].frames == 0) {
			nf++;
			at = BKV_MIN(at, x->ents[i].index);
		}
	}
	s->stats.kv_load_failed += x->status < 0 ? x->to - x->from : nf;
	if (x->own) {
		bkv__free(&s->alloc, x->own, x->own->size);
		x->own = NULL;
	} else if (r) {
		r->cn_buf->busy = 0;
	}
	if (!r || !r->cn_loading || l->seq != x->seq) {
		unbusy(s, x->seq); /* it let go: the parked end may go */
		return;
	}
	r->cn_rec = 0;
	r->cn_loading = 0;
	c->n_loading--;
	r->cn_ext = BKV_MIN(r->cn_ext, at); /* never asked past a failure again */
	cut_back(s, l, at << s->bt_shift);
	len = l->kv_len;
	s->stats.kv_load_tokens += len > (x->from << s->bt_shift) ? len - (x->from << s->bt_shift) : 0;
	bkv__seq_publish(s->pool, l->seq, x->from);
	if (c->n_pub < s->cfg.max_running) {
		c->pub[c->n_pub].lane = l;
		c->pub[c->n_pub++].step = s->plan.step_no;
	}
	unbusy(s, x->seq);
}

/* ---- saves ---------------------------------------------------------------- */

static void save_done(bkv_sched *s, bkv__cn_rec *x)
{
	uint32_t i;

	for (i = 0; i < x->n; i++) {
		if (x->status < 0 || x->ents[i].frames == 0) {
			s->stats.kv_save_failed++;
			continue;
		}
		s->stats.kv_saved++;
		if (x->ents[i].group == 0)
			bkv__event_external(s->pool, x->ents[i].hash);
	}
	s->cn->held -= x->n;
	bkv__xfer_release(s->pool, x->ents, x->n);
	unbusy(s, x->seq);
}

void bkv__cn_save_lane(bkv_sched *s, bkv__lane *l)
{
	bkv__cn *c = s->cn;
	const uint32_t per = 2 + bkv__pool_n_lanes(s->pool);

	if (!c->ops.save || l->seq == BKV__SEQ_NONE || l->req->cn_loading || c->quiet)
		return;
	while (l->cn_saved < (l->kv_len >> s->bt_shift) && c->n_free_save) {
		uint32_t to = BKV_MIN(l->kv_len >> s->bt_shift,
				      l->cn_saved + BKV_MAX(1u, c->ops.save_blocks / per)), stop = to;
		uint64_t id;
		bkv__cn_rec *x;

		(void)bkv__seq_save_ents(s->pool, l->seq, l->cn_saved, &stop, NULL, 0);
		if (stop == l->cn_saved)
			return; /* not indexed yet (a step in flight appended it) */
		id = rec_take(c, 0);
		x = &c->rec[id & ((1u << CN_IDX_BITS) - 1)];
		x->seq = l->seq;
		x->n = bkv__seq_save_ents(s->pool, l->seq, l->cn_saved, &stop, x->ents,
					  c->ops.save_blocks);
		l->cn_saved = stop;
		if (!x->n) {
			rec_put(c, x);
			continue;
		}
		c->busy[l->seq & c->slot_mask]++;
		c->held += x->n;
		if (c->ops.save(c->ops.user, id, x->ents, x->n) < 0)
			failed_start(s, x);
	}
}

/* ---- the step's hooks ------------------------------------------------------- */

/* Keep the marks of steps after upto. */
static uint32_t marks_after(bkv__cn_mark *m, uint32_t n, uint64_t upto)
{
	uint32_t i, j = 0;

	for (i = 0; i < n; i++)
		if (m[i].step > upto)
			m[j++] = m[i];
	return j;
}

void bkv__cn_after_commit(bkv_sched *s, uint64_t upto)
{
	bkv__cn *c = s->cn;
	uint32_t i;

	for (i = 0; i < c->n_plan; i++) {
		bkv__lane *l = c->plan[i].lane;

		if (c->plan[i].step <= upto && REQ_IS_RUNNING(l->req) && l->req->cn_loading &&
		    !l->req->cn_rec && l->seq != BKV__SEQ_NONE)
			load_issue(s, l, c->plan[i].from);
	}
	c->n_plan = marks_after(c->plan, c->n_plan, upto);
	c->n_pub = marks_after(c->pub, c->n_pub, upto);
}

void bkv__cn_save_rows(bkv_sched *s, const bkv__row *rows, uint32_t n)
{
	uint32_t i;

	if (!s->cn->ops.save)
		return;
	for (i = 0; i < n; i++)
		if (REQ_IS_RUNNING(rows[i].lane->req))
			bkv__cn_save_lane(s, rows[i].lane);
}

void bkv__cn_rollback(bkv_sched *s)
{
	bkv__cn *c = s->cn;
	uint32_t i;

	for (i = 0; i < c->n_plan; i++) { /* the appends were undone */
		bkv__lane *l = c->plan[i].lane;
		bkv__req *r = l->req;

		if (r->cn_loading && !r->cn_rec) {
			const uint32_t from = c->plan[i].from << s->bt_shift;

			r->cn_loading = 0;
			c->n_loading--;
			if (l->seq != BKV__SEQ_NONE) {
				bkv__seq_noindex(s->pool, l->seq, 0);
				cut_back(s, l, from); /* (overlap: no ticket's row
							 undid it) */
			}
		}
	}
	if (c->n_pub) { /* the transaction forgot them: a commit of their
			   own (which swaps a duplicate for the cached copy) */
		bkv__pool_txn_begin(s->pool);
		for (i = 0; i < c->n_pub; i++) {
			bkv__lane *l = c->pub[i].lane;

			if (REQ_IS_RUNNING(l->req) && l->seq != BKV__SEQ_NONE)
				bkv__seq_publish(s->pool, l->seq, 0);
		}
		bkv__pool_txn_commit(s->pool);
	}
	c->n_plan = c->n_pub = 0;
}

void bkv__cn_complete(bkv_sched *s)
{
	bkv__cn *c = s->cn;
	uint32_t i, next;

	LOCK(s);
	i = c->done_head;
	c->done_head = CN_NONE;
	UNLOCK(s);
	for (; i != CN_NONE; i = next) {
		bkv__cn_rec *x = &c->rec[i];

		next = x->next;
		if (x->load)
			load_done(s, x);
		else
			save_done(s, x);
		rec_put(c, x);
	}
}

/* ---- completion (any thread) ---------------------------------------------- */

int bkv_kv_xfer_done(bkv_sched *s, uint64_t xfer, int status, const uint32_t *failed,
		     uint32_t n_failed)
{
	bkv__cn_rec *x;
	uint32_t i, k;
	int rc = BKV_OK;

	if (!s || (n_failed && !failed))
		return BKV_EINVAL;
	if (!s->cn)
		return BKV_ENOENT;
	k = (uint32_t)(xfer & ((1u << CN_IDX_BITS) - 1));
	LOCK(s);
	x = k < s->cn->n_rec ? &s->cn->rec[k] : NULL;
	if (!x || !xfer || x->id != xfer || x->done) {
		rc = BKV_ENOENT;
	} else {
		for (i = 0; i < n_failed; i++)
			if (failed[i] >= x->n)
				rc = BKV_EINVAL;
	}
	if (rc == BKV_OK) {
		for (i = 0; i < n_failed; i++)
			x->ents[failed[i]].frames = 0; /* read at the next step */
		x->done = 1;
		x->status = status < 0 ? status : 0;
		x->next = s->cn->done_head;
		s->cn->done_head = k;
		bkv__wait_signal(s);
	}
	UNLOCK(s);
	return rc;
}

/* ---- stats and invariants --------------------------------------------------- */

uint32_t bkv__cn_in_flight(const bkv_sched *s)
{
	const bkv__cn *c = s->cn;

	return c ? c->n_rec - c->n_free_load - c->n_free_save : 0;
}

uint32_t bkv__cn_idle(const bkv_sched *s)
{
	const bkv__cn *c = s->cn;
	uint32_t i, n = 0;

	if (!c || c->done_head != CN_NONE) /* (lock held) completions to apply */
		return 0;
	for (i = 0; i < c->n_load; i++)
		n += c->rec[i].id && !c->rec[i].done && c->rec[i].req;
	return n;
}

uint32_t bkv__cn_loads_planned(const bkv_sched *s)
{
	return s->cn->n_loading;
}

uint32_t bkv__cn_n_later(const bkv_sched *s)
{
	return s->cn ? s->cn->n_later : 0;
}

void bkv__cn_stats(const bkv_sched *s, bkv_sched_stats *st)
{
	st->kv_waiting = s->cn ? s->cn->n_later + s->cn->n_loading : 0;
	st->kv_save_held = s->cn ? s->cn->held : 0;
}

uint32_t bkv__cn_parked(const bkv_sched *s)
{
	const uint32_t max_seqs = s->cn ? bkv__pool_max_seqs(s->pool) : 0;
	uint32_t i, n = 0;

	for (i = 0; i < max_seqs; i++)
		n += s->cn->park[i].on;
	return n;
}

/* 40: busy counts match the transfers in flight; parked ends only on busy
 *     slots; the later list's count; loading requests counted. */
int bkv__cn_check(const bkv_sched *s)
{
	const bkv__cn *c = s->cn;
	const uint32_t max_seqs = c ? bkv__pool_max_seqs(s->pool) : 0;
	uint32_t i, n = 0, loading = 0, busy = 0;
	const bkv__req *r;

	if (!c)
		return 0;
	for (i = 0; i < c->n_rec; i++)
		n += c->rec[i].id != 0;
	for (i = 0; i < max_seqs; i++) {
		busy += c->busy[i];
		if (c->park[i].on && !c->busy[i])
			return 40;
	}
	if (n != busy || n != bkv__cn_in_flight(s))
		return 40;
	for (i = 0, n = 0, r = c->later; r; r = r->cn_next, n++)
		if (r->cn_ask != 1 || r->state != BKV__REQ_INBOX)
			return 40;
	if (n != c->n_later)
		return 40;
	for (i = 0; i < s->rs.nr_run; i++)
		loading += s->rs.run[i]->state == BKV__REQ_RUNNING && s->rs.run[i]->cn_loading;
	return loading == c->n_loading ? 0 : 40;
}
