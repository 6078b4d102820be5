/*
 * ext.c - an external KV tier for bkv-sim (--ext-tier): a simulated store
 * behind the library's KV connector (bkv_connector), its transfers timed on
 * the virtual clock.
 *
 * The store is an index of block hashes (the chained hashes the connector
 * names blocks by, one entry per group's block or state unit) holding at
 * most ext_blocks entries, the least recently used evicted first. A lookup
 * answers at once (the index is the engine's own metadata) with the leading
 * hashes it holds, and touches them. Loads and saves move bytes over a
 * link, one in each direction (full duplex):
 *
 *   load/save at t ──▶ link queue (FIFO) ──bytes / bandwidth──▶ + latency ──▶ done
 *
 * A transfer's bytes go after the bytes of the transfers ahead of it on its
 * link, at the bandwidth; its latency is paid once its bytes are through,
 * overlapping the next transfer's bytes. Alone on an idle link, one started
 * at t completes at t + latency + bytes / bandwidth. A save sends only the
 * blocks the index does not hold when it starts (a store's put checks its
 * keys first); the library saves every block the prefix cache takes, also
 * one recomputed after the device evicted it. A block's bytes are
 * its group's page (bkv_kv_group_page_bytes) with KV groups, else the
 * roofline's KV bytes per token x block_tokens, else Llama-3-8B's in bf16
 * (128 KiB per token).
 *
 * The virtual host completes every transfer whose time the clock has
 * reached before each step (sim_ext_poll) and, when a step had nothing to
 * do, moves the clock to the next completion (sim_ext_next_us) if that
 * comes before the next arrival. A load is checked at completion: a block
 * the store evicted meanwhile fails (the library recomputes it). A save's
 * blocks join the index at completion. Warm (the store filled by other
 * engines) starts the index with every prompt's group-0 hashes, in trace
 * order.
 */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EXT_NONE UINT32_MAX
/* Llama-3-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes. */
#define EXT_DEFAULT_TOKEN_BYTES 131072.0

/* One block the store holds: a node of the LRU list. */
typedef struct ext_ent {
	uint64_t hash; /* its key */
	uint32_t prev; /* more recently used (EXT_NONE: the head) */
	uint32_t next; /* less recently used (EXT_NONE: the tail) */
} ext_ent;

/* One transfer in flight. */
typedef struct ext_xfer {
	uint64_t id;                     /* the library's transfer id */
	const bkv_kv_xfer_block *blocks; /* [n], the library's until done */
	uint32_t n;                      /* entries */
	int load;                        /* 1 load, 0 save */
	double start_us;                 /* when the callback started it */
	double end_us;                   /* when it completes */
} ext_xfer;

struct sim_ext {
	const sim_config *cfg; /* the run's settings (ext_* fields) */
	bkv_sched *sched;      /* completes transfers (sim_ext_attach) */
	const double *clock;   /* the virtual clock, us */
	double block_bytes;    /* bytes of a plain block (no groups) */
	double bytes_per_us;   /* the link's bandwidth, each way */
	double link_free[2];   /* when each link's bytes are through:
				  [0] saves (to the store), [1] loads */
	/* the index: open addressing over tab, linear probing */
	ext_ent *ent;          /* [cap] entries; [0, n_ent) used */
	uint32_t cap;          /* ext_blocks */
	uint32_t n_ent;        /* entries held, <= cap */
	uint32_t *tab;         /* [tab_mask + 1] entry index or EXT_NONE */
	uint32_t tab_mask;     /* a power of two minus one, > 2 x cap */
	uint32_t head, tail;   /* most / least recently used */
	/* transfers in flight */
	ext_xfer *q;           /* [q_cap], [0, n_q) in flight */
	uint32_t n_q, q_cap;
	uint32_t *failed;      /* [fail_cap] scratch: a load's failed blocks */
	uint32_t fail_cap;
	/* counts */
	uint64_t loads;        /* load transfers */
	double wait_us;        /* sum over loads of completion - start */
	double wait_max_us;    /* the longest load */
	uint64_t load_bytes, save_bytes; /* moved */
	uint64_t evicted;      /* entries the capacity evicted */
	uint64_t bad;          /* bkv_kv_xfer_done refused a completion, or
				  the host could not hold a transfer: 0 */
};

static uint32_t tab_slot(const sim_ext *e, uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return (uint32_t)h & e->tab_mask;
}

/* The table slot holding h, or the empty slot where it would go. */
static uint32_t tab_find(const sim_ext *e, uint64_t h)
{
	uint32_t i = tab_slot(e, h);
	while (e->tab[i] != EXT_NONE && e->ent[e->tab[i]].hash != h)
		i = (i + 1) & e->tab_mask;
	return i;
}

static void lru_unlink(sim_ext *e, uint32_t x)
{
	ext_ent *n = &e->ent[x];
	if (n->prev != EXT_NONE)
		e->ent[n->prev].next = n->next;
	else
		e->head = n->next;
	if (n->next != EXT_NONE)
		e->ent[n->next].prev = n->prev;
	else
		e->tail = n->prev;
}

static void lru_push(sim_ext *e, uint32_t x)
{
	e->ent[x].prev = EXT_NONE;
	e->ent[x].next = e->head;
	if (e->head != EXT_NONE)
		e->ent[e->head].prev = x;
	e->head = x;
	if (e->tail == EXT_NONE)
		e->tail = x;
}

/* Held: move it to the front and say so. */
static int ext_touch(sim_ext *e, uint64_t h)
{
	uint32_t i = tab_find(e, h);
	if (e->tab[i] == EXT_NONE)
		return 0;
	lru_unlink(e, e->tab[i]);
	lru_push(e, e->tab[i]);
	return 1;
}

/* Remove table slot i, shifting back the run after it (linear probing). */
static void tab_remove(sim_ext *e, uint32_t i)
{
	uint32_t j = i;
	e->tab[i] = EXT_NONE;
	for (;;) {
		j = (j + 1) & e->tab_mask;
		if (e->tab[j] == EXT_NONE)
			return;
		uint32_t k = tab_slot(e, e->ent[e->tab[j]].hash);
		/* move j's entry into the hole at i unless its home k lies
		 * cyclically in (i, j] */
		if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
			continue;
		e->tab[i] = e->tab[j];
		e->tab[j] = EXT_NONE;
		i = j;
	}
}

/* Hold h (the most recently used), evicting the least recently used
 * entry when full. */
static void ext_insert(sim_ext *e, uint64_t h)
{
	if (ext_touch(e, h))
		return;
	uint32_t x;
	if (e->n_ent == e->cap) {
		x = e->tail;
		lru_unlink(e, x);
		tab_remove(e, tab_find(e, e->ent[x].hash));
		e->evicted++;
	} else {
		x = e->n_ent++;
	}
	e->ent[x].hash = h;
	e->tab[tab_find(e, h)] = x;
	lru_push(e, x);
}

/* Bytes of one transfer entry. */
static double ent_bytes(const sim_ext *e, const bkv_kv_xfer_block *b)
{
	const sim_config *c = e->cfg;
	if (c->n_groups && b->group < c->n_groups)
		return (double)bkv_kv_group_page_bytes(&c->groups[b->group], c->block_tokens);
	return e->block_bytes;
}

/* ---- the connector ------------------------------------------------------- */

static int ext_lookup(void *user, uint64_t req, const uint64_t *hashes, uint32_t n)
{
	sim_ext *e = user;
	uint32_t i = 0;
	(void)req;
	while (i < n && ext_touch(e, hashes[i]))
		i++;
	return (int)i;
}

/* Queue a transfer on its link; 0, or -1 when the host cannot hold it. */
static int ext_start(sim_ext *e, uint64_t id, const bkv_kv_xfer_block *b, uint32_t n, int load)
{
	if (e->n_q == e->q_cap) {
		uint32_t cap = e->q_cap ? 2 * e->q_cap : 64;
		ext_xfer *q = realloc(e->q, (size_t)cap * sizeof(*q));
		if (!q) {
			e->bad++;
			return -1;
		}
		e->q = q;
		e->q_cap = cap;
	}
	double bytes = 0.0, now = *e->clock;
	for (uint32_t i = 0; i < n; i++) /* a save skips what the store holds */
		if (load || e->tab[tab_find(e, b[i].hash)] == EXT_NONE)
			bytes += ent_bytes(e, &b[i]);
	double *free_us = &e->link_free[load];
	*free_us = (*free_us > now ? *free_us : now) + bytes / e->bytes_per_us;
	e->q[e->n_q++] = (ext_xfer){id, b, n, load, now, *free_us + e->cfg->ext_latency_us};
	if (load)
		e->load_bytes += (uint64_t)bytes;
	else
		e->save_bytes += (uint64_t)bytes;
	return 0;
}

static int ext_load(void *user, uint64_t xfer, uint64_t req, const bkv_kv_xfer_block *blocks,
		    uint32_t n)
{
	(void)req;
	return ext_start(user, xfer, blocks, n, 1);
}

static int ext_save(void *user, uint64_t xfer, const bkv_kv_xfer_block *blocks, uint32_t n)
{
	return ext_start(user, xfer, blocks, n, 0);
}

/* Complete transfer x: a save's blocks join the index, a load's blocks the
 * index no longer holds fail. */
static void ext_complete(sim_ext *e, const ext_xfer *x)
{
	uint32_t nf = 0;
	if (x->load) {
		if (x->n > e->fail_cap) {
			uint32_t *f = realloc(e->failed, (size_t)x->n * sizeof(*f));
			if (!f) {
				e->bad++;
				bkv_kv_xfer_done(e->sched, x->id, BKV_ENOMEM, NULL, 0);
				return;
			}
			e->failed = f;
			e->fail_cap = x->n;
		}
		for (uint32_t i = 0; i < x->n; i++)
			if (!ext_touch(e, x->blocks[i].hash))
				e->failed[nf++] = i;
		e->loads++;
		e->wait_us += x->end_us - x->start_us;
		if (x->end_us - x->start_us > e->wait_max_us)
			e->wait_max_us = x->end_us - x->start_us;
	} else {
		for (uint32_t i = 0; i < x->n; i++)
			ext_insert(e, x->blocks[i].hash);
	}
	if (bkv_kv_xfer_done(e->sched, x->id, BKV_OK, e->failed, nf) != BKV_OK)
		e->bad++;
}

/* ---- the host's side ----------------------------------------------------- */

/* Every prompt's group-0 hashes, in trace order (--ext-tier ...,warm). */
static int ext_warm(sim_ext *e, const trace *t, uint64_t hash_seed, const sim_adapters *ad)
{
	uint32_t longest = 1;
	for (uint32_t i = 0; i < t->n; i++)
		if (t->reqs[i].prompt_len > longest)
			longest = t->reqs[i].prompt_len;
	int32_t *tok = malloc((size_t)longest * sizeof(*tok));
	uint64_t *h = malloc(((size_t)longest / e->cfg->block_tokens + 1) * sizeof(*h));
	if (!tok || !h) {
		free(tok);
		free(h);
		return -1;
	}
	for (uint32_t i = 0; i < t->n; i++) {
		uint32_t len = t->reqs[i].prompt_len;
		trace_prompt_tokens(t, i, tok);
		uint32_t nb = bkv_block_hashes(hash_seed,
					       bkv_adapter_cache_key(0, sim_adapter_of(ad, i)),
					       e->cfg->block_tokens, tok, len ? len - 1 : 0, h);
		for (uint32_t b = 0; b < nb; b++)
			ext_insert(e, h[b]);
	}
	free(tok);
	free(h);
	return 0;
}

int sim_ext_open(const sim_config *cfg, const trace *t, uint64_t hash_seed,
		 const sim_adapters *ad, const double *clock, sim_ext **out)
{
	*out = NULL;
	if (!(cfg->ext_gbps > 0.0))
		return 0;
	sim_ext *e = calloc(1, sizeof(*e));
	if (!e)
		return -1;
	e->cfg = cfg;
	e->clock = clock;
	e->cap = cfg->ext_blocks ? cfg->ext_blocks : 1;
	e->head = e->tail = EXT_NONE;
	e->bytes_per_us = cfg->ext_gbps * 1e3;
	double tok = cfg->cost_kind == SIM_COST_ROOFLINE && cfg->roofline.kv_bytes_per_token > 0.0
			     ? cfg->roofline.kv_bytes_per_token
			     : EXT_DEFAULT_TOKEN_BYTES;
	e->block_bytes = tok * cfg->block_tokens;
	uint32_t size = 1;
	while (size <= 2u * e->cap)
		size <<= 1;
	e->tab_mask = size - 1;
	e->ent = malloc((size_t)e->cap * sizeof(*e->ent));
	e->tab = malloc((size_t)size * sizeof(*e->tab));
	if (!e->ent || !e->tab) {
		sim_ext_close(e);
		return -1;
	}
	memset(e->tab, 0xff, (size_t)size * sizeof(*e->tab));
	if (cfg->ext_warm && ext_warm(e, t, hash_seed, ad)) {
		sim_ext_close(e);
		return -1;
	}
	*out = e;
	return 0;
}

void sim_ext_close(sim_ext *e)
{
	if (!e)
		return;
	free(e->ent);
	free(e->tab);
	free(e->q);
	free(e->failed);
	free(e);
}

void sim_ext_connector(sim_ext *e, bkv_connector *c)
{
	memset(c, 0, sizeof(*c));
	c->lookup = ext_lookup;
	c->load = ext_load;
	c->save = ext_save;
	c->user = e;
}

void sim_ext_attach(sim_ext *e, bkv_sched *s)
{
	if (e)
		e->sched = s;
}

uint32_t sim_ext_poll(sim_ext *e, double now_us)
{
	uint32_t done = 0;
	while (e && e->n_q) {
		uint32_t m = 0;
		for (uint32_t i = 1; i < e->n_q; i++)
			if (e->q[i].end_us < e->q[m].end_us ||
			    (e->q[i].end_us == e->q[m].end_us && e->q[i].id < e->q[m].id))
				m = i;
		if (e->q[m].end_us > now_us)
			break;
		ext_xfer x = e->q[m];
		e->q[m] = e->q[--e->n_q];
		ext_complete(e, &x);
		done++;
	}
	return done;
}

double sim_ext_next_us(const sim_ext *e)
{
	double t = INFINITY;
	for (uint32_t i = 0; e && i < e->n_q; i++)
		if (e->q[i].end_us < t)
			t = e->q[i].end_us;
	return t;
}

uint32_t sim_ext_in_flight(const sim_ext *e)
{
	return e ? e->n_q : 0;
}

void sim_ext_collect(const sim_ext *e, const bkv_sched_stats *ss, sim_result *res)
{
	if (!e)
		return;
	res->ext_on = 1;
	res->kv_lookups = ss->kv_lookups;
	res->kv_loads = ss->kv_loads;
	res->kv_load_tokens = ss->kv_load_tokens;
	res->kv_load_failed = ss->kv_load_failed;
	res->kv_saved = ss->kv_saved;
	res->kv_save_failed = ss->kv_save_failed;
	res->ext_wait_ms = e->wait_us / 1000.0;
	res->ext_wait_mean_ms = e->loads ? e->wait_us / 1000.0 / (double)e->loads : 0.0;
	res->ext_wait_max_ms = e->wait_max_us / 1000.0;
	res->ext_load_gb = (double)e->load_bytes / 1e9;
	res->ext_save_gb = (double)e->save_bytes / 1e9;
	res->ext_held = e->n_ent;
	res->ext_evicted = e->evicted;
	res->ext_bad = e->bad;
}
