/*
 * prefill.c - the prefill process of the pair: its own pool, scheduler and
 * paged host, one thread.
 *
 * Each PREFILL message becomes a request of max_new_tokens 1 (its token is
 * dropped: the decode side samples its own). The connector never loads
 * (lookup answers 0); its save keeps every full block the prefix cache
 * takes as a frame (wire.c) in an in-memory store keyed by the block's
 * hash, and completes at once, inside the call. When a request ends, after
 * the step that ended it (whose saves ran inside it), DONE tells the decode
 * side how many leading blocks of that prompt the store holds; GET is
 * answered from the store, block by block, where the injected faults
 * (pd_faults) cut, corrupt or die. The loop polls the socket between steps
 * and blocks on it when nothing is pending; it ends when the decode side
 * closes its end.
 */
#include "pdpair.h"
#include "filestore.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* One prefill request. */
typedef struct pf_req {
	tlm_sampling sampling; /* first: the paged host samples by it */
	uint64_t job;          /* the decode side's tag */
	int32_t *prompt;       /* [len], owned */
	uint32_t len;          /* tokens */
	int finished;          /* on_finish seen */
	struct pf_req *next;   /* the live list */
} pf_req;

/* The store: open addressing over hash (0 marks a free slot; a zero hash
 * is kept aside in zero). */
typedef struct pf_store {
	uint64_t *key;   /* [cap] hashes */
	uint8_t **frame; /* [cap] frames, owned */
	uint32_t cap;    /* a power of two */
	uint32_t n;      /* entries, n <= cap / 2 */
	uint8_t *zero;   /* the frame of hash 0, if any */
} pf_store;

typedef struct pf {
	const tlm_model *m;   /* the served model */
	const pd_config *cfg; /* the run's settings (block size, faults) */
	int fd;               /* the socket */
	tlm_host *host;       /* the paged host: saves read its KV tensor */
	bkv_sched *sched;     /* the prefill scheduler */
	pf_store st;          /* the saved blocks */
	size_t frame_bytes; /* 48 + payload */
	pf_req *live;       /* submitted, not reported */
	int64_t sent;       /* blocks sent so far (fault counter) */
	uint8_t *scratch;   /* [frame_bytes] a corrupted copy */
} pf;

static uint8_t **st_slot(pf_store *s, uint64_t h)
{
	if (h == 0)
		return &s->zero;
	uint32_t i = (uint32_t)(tlm_mix64(h) & (s->cap - 1));
	while (s->key[i] && s->key[i] != h)
		i = (i + 1) & (s->cap - 1);
	s->key[i] = h; /* claimed; the caller fills the frame or not */
	return &s->frame[i];
}

static const uint8_t *st_get(pf_store *s, uint64_t h)
{
	if (h == 0)
		return s->zero;
	uint32_t i = (uint32_t)(tlm_mix64(h) & (s->cap - 1));
	while (s->key[i] && s->key[i] != h)
		i = (i + 1) & (s->cap - 1);
	return s->key[i] ? s->frame[i] : NULL;
}

static int st_grow(pf_store *s)
{
	pf_store g = {.cap = s->cap ? 2 * s->cap : 1024, .zero = s->zero};
	g.key = calloc(g.cap, sizeof(*g.key));
	g.frame = calloc(g.cap, sizeof(*g.frame));
	if (!g.key || !g.frame) {
		free(g.key), free(g.frame);
		return -1;
	}
	for (uint32_t i = 0; i < s->cap; i++)
		if (s->key[i] && s->frame[i])
			*st_slot(&g, s->key[i]) = s->frame[i], g.n++;
	free(s->key), free(s->frame);
	*s = g;
	return 0;
}

static void st_free(pf_store *s)
{
	for (uint32_t i = 0; i < s->cap; i++)
		free(s->frame[i]);
	free(s->key), free(s->frame), free(s->zero);
	memset(s, 0, sizeof(*s));
}

/* ---- the connector -------------------------------------------------------- */

static int pf_lookup(void *user, uint64_t req, const uint64_t *hashes, uint32_t n)
{
	(void)user, (void)req, (void)hashes, (void)n;
	return 0;
}

static int pf_load(void *user, uint64_t xfer, uint64_t req, const bkv_kv_xfer_block *b,
		   uint32_t n)
{
	(void)user, (void)xfer, (void)req, (void)b, (void)n;
	return -1; /* never asked: lookup answers 0 */
}

static int pf_save(void *user, uint64_t xfer, const bkv_kv_xfer_block *b, uint32_t n)
{
	pf *p = user;
	uint32_t failed[256], nf = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (st_get(&p->st, b[i].hash))
			continue; /* the same content, saved before */
		uint8_t *f = malloc(p->frame_bytes);
		if (!f || ((p->st.n + 1) * 2 > p->st.cap && st_grow(&p->st))) {
			free(f);
			if (nf < 256)
				failed[nf++] = i;
			continue;
		}
		pd_frame_encode(p->host, p->m, p->cfg->rc.block_tokens, b[i].block, b[i].hash, f);
		*st_slot(&p->st, b[i].hash) = f;
		p->st.n += b[i].hash != 0;
	}
	(void)bkv_kv_xfer_done(p->sched, xfer, BKV_OK, nf ? failed : NULL, nf);
	return 0;
}

/* ---- the host callbacks --------------------------------------------------- */

static int pf_forward(void *user, const bkv_batch *batch, int32_t *next)
{
	return tlm_host_forward(((pf *)user)->host, batch, next);
}

static void pf_token(void *user, uint64_t req, uint32_t branch, int32_t token, void *ru)
{
	(void)user, (void)req, (void)branch, (void)token, (void)ru;
}

static void pf_finish(void *user, uint64_t req, bkv_finish_reason reason, void *ru)
{
	(void)user, (void)req, (void)reason;
	((pf_req *)ru)->finished = 1;
}

/* ---- messages ------------------------------------------------------------- */

static int on_prefill(pf *p, const pd_msg *mh)
{
	pf_req *r = calloc(1, sizeof(*r));
	bkv_request rq;
	uint64_t id;

	if (!r || mh->n == 0 || mh->n > p->m->cfg.max_pos || !(r->prompt = malloc(mh->n * 4u))) {
		free(r);
		return -1;
	}
	if (pd_read_full(p->fd, r->prompt, mh->n * sizeof(int32_t))) {
		free(r->prompt), free(r);
		return -1;
	}
	r->job = mh->tag;
	r->len = mh->n;
	r->sampling.seed = mh->tag;
	r->sampling.n_samples = 1;
	bkv_request_init(&rq);
	rq.prompt = r->prompt;
	rq.prompt_len = r->len;
	rq.max_new_tokens = 1;
	rq.user = r;
	if (bkv_submit(p->sched, &rq, &id) != BKV_OK) {
		free(r->prompt), free(r);
		return -1;
	}
	r->next = p->live;
	p->live = r;
	return 0;
}

/* Send one block (its frame, or a zero length when not held), applying
 * the faults. */
static int send_block(pf *p, const uint8_t *f)
{
	const pd_faults *ft = &p->cfg->faults;
	uint32_t len = f ? (uint32_t)p->frame_bytes : 0;

	if (!f)
		return pd_write_full(p->fd, &len, sizeof(len));
	const int64_t k = p->sent++;
	if (k == ft->die_at) {
		(void)pd_write_full(p->fd, &len, sizeof(len));
		(void)pd_write_full(p->fd, f, len / 2);
		raise(SIGKILL);
	}
	if (k == ft->cut_at)
		len /= 2;
	if (k == ft->corrupt_at) {
		memcpy(p->scratch, f, p->frame_bytes);
		p->scratch[BKV_FILESTORE_HEADER_BYTES + (p->frame_bytes - 48) / 2] ^= 0x40;
		f = p->scratch;
	}
	if (pd_write_full(p->fd, &len, sizeof(len)))
		return -1;
	return pd_write_full(p->fd, f, len);
}

static int on_get(pf *p, const pd_msg *mh)
{
	pd_msg out = {PD_BLOCKS, mh->n, mh->tag};
	uint64_t *h;
	int st = 0;

	if (mh->n == 0 || mh->n > 65536 || !(h = malloc(mh->n * sizeof(*h))))
		return -1;
	if (pd_read_full(p->fd, h, mh->n * sizeof(*h)) || pd_write_full(p->fd, &out, sizeof(out)))
		st = -1;
	for (uint32_t i = 0; !st && i < mh->n; i++)
		st = send_block(p, st_get(&p->st, h[i]));
	free(h);
	return st;
}

/* Report the requests that ended: DONE with the leading prompt blocks the
 * store holds. */
static int report(pf *p)
{
	const uint32_t bt = p->cfg->rc.block_tokens;
	pf_req **pp = &p->live;
	uint64_t *h = NULL;
	int st = 0;

	while (*pp) {
		pf_req *r = *pp;
		if (!r->finished) {
			pp = &r->next;
			continue;
		}
		uint32_t nh = r->len / bt, held = 0;
		free(h);
		h = malloc((nh ? nh : 1) * sizeof(*h));
		if (!h)
			return -1;
		nh = bkv_block_hashes(0, 0, bt, r->prompt, r->len, h);
		while (held < nh && st_get(&p->st, h[held]))
			held++;
		pd_msg d = {PD_DONE, held, r->job};
		if (!st)
			st = pd_write_full(p->fd, &d, sizeof(d));
		*pp = r->next;
		free(r->prompt), free(r);
	}
	free(h);
	return st;
}

int pd_prefill_main(int fd, const tlm_model *m, const pd_config *cfg)
{
	pf p = {.m = m, .cfg = cfg, .fd = fd};
	tlm_run_config rc = cfg->rc;
	bkv_kv_group groups[TLM_MAX_GROUPS];
	bkv_pool_config pc;
	bkv_pool *pool = NULL;
	bkv_sched_config sc = cfg->rc.sched;
	bkv_connector cn;
	int st = -1;

	rc.device_blocks = cfg->prefill_blocks;
	rc.host_blocks = 0;
	rc.host_cache = 0;
	tlm_pool_config(m, &rc, groups, &pc);
	p.frame_bytes = BKV_FILESTORE_HEADER_BYTES + pd_block_payload(m, rc.block_tokens);
	p.scratch = malloc(p.frame_bytes);
	if (!p.scratch || st_grow(&p.st) || bkv_pool_create(&pc, NULL, &pool) != BKV_OK)
		goto out;
	p.host = tlm_host_create(m, rc.block_tokens, pc.device_blocks, 0);
	if (!p.host)
		goto out;
	memset(&cn, 0, sizeof(cn));
	cn.lookup = pf_lookup;
	cn.load = pf_load;
	cn.save = pf_save;
	cn.user = &p;
	sc.connector = &cn;
	sc.max_running = cfg->prefill_running;
	sc.preempt = BKV_PREEMPT_RECOMPUTE;
	bkv_host_ops ops = {.forward = pf_forward, .on_token = pf_token, .on_finish = pf_finish};
	if (bkv_sched_create(&sc, pool, &ops, &p, NULL, &p.sched) != BKV_OK)
		goto out;
	for (;;) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		const int busy = bkv_sched_pending(p.sched) > 0;
		int r = poll(&pfd, 1, busy ? 0 : -1);
		if (r > 0) {
			pd_msg mh;
			if (pd_read_full(fd, &mh, sizeof(mh)))
				break; /* the decode side closed: the end */
			if (mh.type == PD_PREFILL)
				r = on_prefill(&p, &mh);
			else if (mh.type == PD_GET)
				r = on_get(&p, &mh);
			else
				r = -1;
			if (r)
				break;
			continue; /* drain the socket before stepping */
		}
		if (!busy)
			continue;
		if (bkv_step(p.sched, NULL) != BKV_OK || report(&p))
			break;
	}
	st = 0;
out:
	while (p.live) {
		pf_req *r = p.live;
		p.live = r->next;
		free(r->prompt), free(r);
	}
	bkv_sched_destroy(p.sched);
	bkv_pool_destroy(pool);
	tlm_host_destroy(p.host);
	st_free(&p.st);
	free(p.scratch);
	return st;
}
