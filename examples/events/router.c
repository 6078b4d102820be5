/*
 * router.c - a prefix-aware router over simulated libbatchkv replicas, fed
 * only by their vLLM-format KV events (bkv-router-sim).
 *
 * R replicas run in one process, each a bkv_sched over its own pool on its
 * own virtual clock (a mixed host priced by a roofline cost model, as
 * bkv-sim's virtual host does). After every step a replica's pool is drained
 * through a bkv_vllm_encoder into a KVEventBatch (msgpack, sha256_cbor block
 * hashes sent as ints), and the message is delivered to the router at the
 * step's end time. The router decodes those bytes (a small msgpack reader
 * below, following vLLM's map layout) into one hash set per replica, hashes
 * each arriving prompt with bkv_vllm_block_hashes, and picks a replica:
 *
 *   round-robin   request i goes to replica i mod R;
 *   prefix        the longest run of leading block hashes held (ties: the
 *                 least loaded);
 *   kv-aware      Dynamo's KV router cost with temperature 0: the least of
 *                 overlap_weight x (prompt blocks not cached there) + the
 *                 blocks of the requests it already runs or queues (the
 *                 router counts what it sent and what has finished).
 *
 * It replays the Mooncake conversation trace (examples/sim/trace_gen.c expands
 * each 512-token hash id into the same tokens wherever it appears, so
 * conversations share real prefixes) and reports, per policy, the prompt
 * tokens served from the replicas' prefix caches and the time to first token.
 *
 * Usage: bkv-router-sim [--trace FILE] [--limit N] [--replicas R]
 *          [--kv-blocks N] [--slots N] [--weight W] [--speed X] [--check]
 *   --speed X divides every arrival time by X (X > 1: a heavier load).
 *   --check: at the end of each run, after the last messages are delivered,
 *   every replica's view must equal its pool's index (evw_pool_truth reads
 *   it through bkv_block_info_get); exit 1 otherwise.
 */
#include "sim.h"
#include "trace.h"
#include "workload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BT 16 /* tokens per block, vLLM's default */
#define BKV_MIN_U(a, b) ((a) < (b) ? (a) : (b))

/* ---- the router's view: one set of block hashes per replica ---------------- */

typedef struct hset {
	uint64_t *k;   /* [cap] open addressing; 0 = empty, 1 = deleted */
	uint32_t cap;  /* power of two */
	uint32_t n;    /* keys held */
	uint32_t used; /* slots not empty (keys + tombstones) */
} hset;

static uint64_t mix(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return h;
}

static void hs_init(hset *s, uint32_t cap)
{
	s->cap = cap;
	s->k = calloc(cap, sizeof *s->k);
	s->n = s->used = 0;
}

static void hs_clear(hset *s)
{
	memset(s->k, 0, (size_t)s->cap * sizeof *s->k);
	s->n = s->used = 0;
}

static uint64_t hs_key(uint64_t h)
{
	return h < 2 ? h + 2 : h; /* 0 and 1 are markers (a 2^-63 aliasing) */
}

static int hs_has(const hset *s, uint64_t h)
{
	uint32_t m = s->cap - 1, i = (uint32_t)mix(h = hs_key(h)) & m;

	while (s->k[i]) {
		if (s->k[i] == h)
			return 1;
		i = (i + 1) & m;
	}
	return 0;
}

static void hs_rehash(hset *s)
{
	hset t;

	hs_init(&t, s->cap);
	for (uint32_t i = 0; i < s->cap; i++)
		if (s->k[i] > 1) {
			uint32_t m = t.cap - 1, j = (uint32_t)mix(s->k[i]) & m;

			while (t.k[j])
				j = (j + 1) & m;
			t.k[j] = s->k[i];
			t.n++, t.used++;
		}
	free(s->k);
	*s = t;
}

static void hs_add(hset *s, uint64_t h)
{
	uint32_t m = s->cap - 1, i = (uint32_t)mix(h = hs_key(h)) & m;

	while (s->k[i] > 1) {
		if (s->k[i] == h)
			return;
		i = (i + 1) & m;
	}
	s->k[i] = h;
	s->n++, s->used++;
	if (s->used > s->cap / 2)
		hs_rehash(s);
}

static void hs_del(hset *s, uint64_t h)
{
	uint32_t m = s->cap - 1, i = (uint32_t)mix(h = hs_key(h)) & m;

	while (s->k[i]) {
		if (s->k[i] == h) {
			s->k[i] = 1;
			s->n--;
			return;
		}
		i = (i + 1) & m;
	}
}

/* ---- a msgpack reader for vLLM's KVEventBatch (map layout) ---------------- */

typedef struct rd {
	const uint8_t *p, *end; /* unread bytes */
	int bad;                /* malformed input seen */
} rd;

static uint64_t rd_be(rd *r, int n)
{
	uint64_t v = 0;

	if (r->end - r->p < n) {
		r->bad = 1;
		r->p = r->end;
		return 0;
	}
	for (int i = 0; i < n; i++)
		v = v << 8 | *r->p++;
	return v;
}

/* Read a header: kind 'i' (uint), 'n' (negative int), 's' str, 'b' bin, 'a'
 * array, 'm' map, 'f' float, 'z' nil/bool; *v the value or length. */
static char rd_head(rd *r, uint64_t *v)
{
	uint8_t c;

	if (r->p >= r->end) {
		r->bad = 1;
		return 0;
	}
	c = *r->p++;
	*v = 0;
	if (c < 0x80)
		return *v = c, 'i';
	if (c >= 0xe0)
		return 'n';
	if ((c & 0xf0) == 0x80)
		return *v = c & 15u, 'm';
	if ((c & 0xf0) == 0x90)
		return *v = c & 15u, 'a';
	if ((c & 0xe0) == 0xa0)
		return *v = c & 31u, 's';
	switch (c) {
	case 0xc0: case 0xc2: case 0xc3: return 'z';
	case 0xc4: return *v = rd_be(r, 1), 'b';
	case 0xc5: return *v = rd_be(r, 2), 'b';
	case 0xc6: return *v = rd_be(r, 4), 'b';
	case 0xca: return *v = rd_be(r, 4), 'f';
	case 0xcb: return *v = rd_be(r, 8), 'f';
	case 0xcc: return *v = rd_be(r, 1), 'i';
	case 0xcd: return *v = rd_be(r, 2), 'i';
	case 0xce: return *v = rd_be(r, 4), 'i';
	case 0xcf: return *v = rd_be(r, 8), 'i';
	case 0xd0: return rd_be(r, 1), 'n';
	case 0xd1: return rd_be(r, 2), 'n';
	case 0xd2: return rd_be(r, 4), 'n';
	case 0xd3: return rd_be(r, 8), 'n';
	case 0xd9: return *v = rd_be(r, 1), 's';
	case 0xda: return *v = rd_be(r, 2), 's';
	case 0xdb: return *v = rd_be(r, 4), 's';
	case 0xdc: return *v = rd_be(r, 2), 'a';
	case 0xdd: return *v = rd_be(r, 4), 'a';
	case 0xde: return *v = rd_be(r, 2), 'm';
	case 0xdf: return *v = rd_be(r, 4), 'm';
	default: r->bad = 1; return 0;
	}
}

static void rd_skip(rd *r)
{
	uint64_t v, i;
	char k = rd_head(r, &v);

	if (k == 's' || k == 'b') {
		if ((uint64_t)(r->end - r->p) < v)
			r->bad = 1, r->p = r->end;
		else
			r->p += v;
	} else if (k == 'a') {
		for (i = 0; i < v && !r->bad; i++)
			rd_skip(r);
	} else if (k == 'm') {
		for (i = 0; i < 2 * v && !r->bad; i++)
			rd_skip(r);
	}
}

/* A string value equal to s? (consumes it either way) */
static int rd_str_is(rd *r, const char *s)
{
	uint64_t n;
	size_t l = strlen(s);

	if (rd_head(r, &n) != 's' || (uint64_t)(r->end - r->p) < n) {
		r->bad = 1;
		return 0;
	}
	r->p += n;
	return n == l && memcmp(r->p - n, s, l) == 0;
}

/* Apply one KVEventBatch to a replica's set; 0 or -1 (malformed). */
static int apply_batch(hset *s, const uint8_t *msg, size_t len)
{
	rd r = {msg, msg + len, 0};
	uint64_t nf, ne, v;

	if (rd_head(&r, &nf) != 'm')
		return -1;
	for (uint64_t f = 0; f < nf && !r.bad; f++) {
		if (!rd_str_is(&r, "events")) {
			rd_skip(&r);
			continue;
		}
		if (rd_head(&r, &ne) != 'a')
			return -1;
		for (uint64_t e = 0; e < ne && !r.bad; e++) {
			uint64_t nk;
			int kind = -1; /* 0 stored, 1 removed, 2 cleared */

			if (rd_head(&r, &nk) != 'm' || nk == 0 || !rd_str_is(&r, "type"))
				return -1;
			if (rd_head(&r, &v) != 's' || (uint64_t)(r.end - r.p) < v)
				return -1;
			if (v == 11 && !memcmp(r.p, "BlockStored", 11))
				kind = 0;
			else if (v == 12 && !memcmp(r.p, "BlockRemoved", 12))
				kind = 1;
			else if (v == 16 && !memcmp(r.p, "AllBlocksCleared", 16))
				kind = 2;
			r.p += v;
			if (kind == 2)
				hs_clear(s);
			for (uint64_t k = 1; k < nk && !r.bad; k++) {
				uint64_t nh;

				if (!rd_str_is(&r, "block_hashes")) {
					rd_skip(&r);
					continue;
				}
				if (rd_head(&r, &nh) != 'a')
					return -1;
				for (uint64_t h = 0; h < nh && !r.bad; h++) {
					if (rd_head(&r, &v) != 'i')
						return -1;
					if (kind == 0)
						hs_add(s, v);
					else if (kind == 1)
						hs_del(s, v);
				}
			}
		}
	}
	return r.bad ? -1 : 0;
}

/* ---- the simulated replicas -------------------------------------------------- */

typedef struct msg {
	double at;        /* delivery time: the end of the step that made it */
	uint8_t *p;       /* payload (a KVEventBatch), malloc */
	size_t n;         /* bytes */
	struct msg *next; /* the next message of the same replica */
} msg;

typedef struct replica {
	bkv_pool *pool;        /* its KV pool (events on) */
	bkv_sched *sched;      /* its scheduler over pool */
	bkv_vllm_encoder *enc; /* turns pool events into KVEventBatch bytes */
	bkv_cost_roofline rl;  /* prices its steps */
	double now;            /* its virtual clock, us */
	uint64_t active_blocks; /* router's count: blocks of requests sent here
				   and not finished */
	hset view;             /* the router's view of its cache */
	msg *head, *tail;      /* messages not yet delivered, oldest first */
	bkv_chunk_shape *chunks; /* [chunk_cap] scratch for a call's shape */
	uint32_t chunk_cap;    /* entries of chunks */
	uint32_t next_token;   /* made-up token counter */
} replica;

typedef struct rreq {
	double first_us;  /* first token; < 0 before */
	uint32_t blocks;  /* (prompt + output) blocks, for the load term */
	uint32_t where;   /* replica */
	uint8_t done;
} rreq;

static rreq *g_req;
static replica *g_rep;

static int host_forward(void *host, const bkv_batch *b, int32_t *next)
{
	replica *R = host;
	uint32_t n_chunks = b->n_rows - b->n_decode_rows;
	bkv_step_shape s;

	if (n_chunks > R->chunk_cap) {
		bkv_chunk_shape *c = realloc(R->chunks, 2 * n_chunks * sizeof *c);

		if (!c)
			return -1;
		R->chunks = c;
		R->chunk_cap = 2 * n_chunks;
	}
	memset(&s, 0, sizeof s);
	s.kind = BKV_CALL_MIXED;
	s.decode_rows = s.padded_rows = b->n_decode_rows;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];

		if (r < b->n_decode_rows) {
			s.decode_context += (uint64_t)b->positions[q1 - 1] + 1;
		} else {
			R->chunks[r - b->n_decode_rows].len = (uint32_t)(q1 - q0);
			R->chunks[r - b->n_decode_rows].start = (uint32_t)b->positions[q0];
		}
	}
	s.n_chunks = n_chunks;
	s.chunks = n_chunks ? R->chunks : NULL;
	R->now += bkv_cost_roofline_step_us(&R->rl, &s);
	for (uint32_t r = 0; r < b->n_rows; r++)
		if (b->row_sample[r]) {
			rreq *q = &g_req[(uintptr_t)b->row_user[r] - 1];

			next[r] = (int32_t)(100 + R->next_token++ % 30000);
			if (q->first_us < 0)
				q->first_us = R->now;
		}
	return 0;
}

static void host_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	(void)host, (void)req, (void)branch, (void)token, (void)user;
}

static void host_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	replica *R = host;
	rreq *q = &g_req[(uintptr_t)user - 1];

	(void)req, (void)why;
	q->done = 1;
	R->active_blocks -= q->blocks;
}

static uint64_t host_now(void *host)
{
	return (uint64_t)llround(((replica *)host)->now);
}

typedef struct opts {
	const char *trace;   /* Mooncake JSONL path */
	uint32_t limit;      /* requests replayed, from the first */
	uint32_t replicas;   /* simulated replicas */
	uint32_t kv_blocks;  /* device blocks per replica */
	uint32_t slots;      /* max_running per replica */
	double weight;       /* kv-aware: overlap weight of uncached blocks */
	double speed;        /* arrival times are divided by it */
	int check;           /* compare views with the pools at the end */
} opts;

enum { POL_RR = 0, POL_PREFIX = 1, POL_KV = 2 };
static const char *const pol_name[3] = {"round-robin", "prefix", "kv-aware"};

typedef struct result {
	uint64_t prompt_tokens;   /* submitted */
	uint64_t hit_tokens;      /* served from the replicas' prefix caches */
	uint64_t preemptions;     /* over all replicas */
	double ttft_mean, ttft_p50, ttft_p99; /* ms, arrival to first token */
	double makespan_s;        /* the last replica clock, s */
	uint64_t events_bytes;    /* KVEventBatch bytes the router decoded or
				     had queued */
	uint64_t batches;         /* KVEventBatch messages */
	uint32_t per_replica_max, per_replica_min; /* requests routed */
	uint64_t checked_blocks;  /* --check: indexed blocks found in the views */
} result;

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int run(const opts *o, const trace *t, int pol, result *res)
{
	uint32_t R = o->replicas, n = BKV_MIN_U(t->n, o->limit);
	bkv_vllm_config vc;
	uint8_t *dig = NULL;
	uint64_t *hh = NULL;
	int32_t *tok = NULL;
	double *ttft;
	uint32_t next_arrival = 0, tok_cap = 0, *count;

	memset(res, 0, sizeof *res);
	g_req = calloc(n, sizeof *g_req);
	g_rep = calloc(R, sizeof *g_rep);
	count = calloc(R, sizeof *count);
	ttft = malloc(n * sizeof *ttft);
	bkv_vllm_config_init(&vc);
	for (uint32_t r = 0; r < R; r++) {
		replica *P = &g_rep[r];
		bkv_pool_config pc;
		bkv_sched_config sc;
		bkv_host_ops ops;

		bkv_pool_config_init(&pc);
		pc.block_tokens = BT;
		pc.device_blocks = o->kv_blocks;
		pc.max_seqs = 2 * o->slots;
		pc.event_capacity = 1u << 16;
		bkv_sched_config_init(&sc);
		sc.max_running = o->slots;
		sc.chunked_prefill = 1;
		sc.token_budget = 2048;
		bkv_cost_roofline_init(&P->rl, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16);
		sc.cost = bkv_cost_roofline_model(&P->rl);
		memset(&ops, 0, sizeof ops);
		ops.forward = host_forward;
		ops.on_token = host_token;
		ops.on_finish = host_finish;
		ops.now_us = host_now;
		if (bkv_pool_create(&pc, NULL, &P->pool) ||
		    bkv_sched_create(&sc, P->pool, &ops, P, NULL, &P->sched) ||
		    bkv_vllm_encoder_create(&vc, P->pool, NULL, &P->enc)) {
			fprintf(stderr, "bkv-router-sim: replica %u: %s\n", r, bkv_last_error());
			return -1;
		}
		hs_init(&P->view, 1u << 16);
	}
	for (uint32_t i = 0; i < n; i++)
		g_req[i].first_us = -1;

	for (;;) {
		int busy = -1;
		double t_arr = next_arrival < n ? t->reqs[next_arrival].arrival_us / o->speed : INFINITY;

		for (uint32_t r = 0; r < R; r++)
			if (bkv_sched_pending(g_rep[r].sched) &&
			    (busy < 0 || g_rep[r].now < g_rep[busy].now))
				busy = (int)r;
		if (busy < 0 && next_arrival >= n)
			break;
		if (busy < 0 || t_arr <= g_rep[busy].now) {
			/* an arrival: deliver what the router has heard by now, route */
			const trace_req *q = &t->reqs[next_arrival];
			uint32_t nb = q->prompt_len / BT, best = 0, i = next_arrival;
			double best_cost = INFINITY;
			bkv_request rq;
			uint64_t id;

			for (uint32_t r = 0; r < R; r++) {
				replica *P = &g_rep[r];

				while (P->head && P->head->at <= t_arr) {
					msg *m = P->head;

					if (apply_batch(&P->view, m->p, m->n))
						return fprintf(stderr, "router: malformed batch\n"), -1;
					P->head = m->next;
					if (!P->head)
						P->tail = NULL;
					free(m->p);
					free(m);
				}
			}
			if (q->prompt_len > tok_cap) {
				tok_cap = q->prompt_len;
				tok = realloc(tok, tok_cap * sizeof *tok);
				dig = realloc(dig, (size_t)(tok_cap / BT + 1) * BKV_VLLM_DIGEST_BYTES);
				hh = realloc(hh, (size_t)(tok_cap / BT + 1) * sizeof *hh);
			}
			trace_prompt_tokens(t, i, tok);
			if (pol != POL_RR) {
				bkv_vllm_block_hashes(&vc, NULL, BT, tok, q->prompt_len, dig);
				for (uint32_t k = 0; k < nb; k++)
					hh[k] = bkv_vllm_hash_int(dig + (size_t)k * BKV_VLLM_DIGEST_BYTES);
			}
			for (uint32_t r = 0; r < R && pol != POL_RR; r++) {
				uint32_t ov = 0;
				double cost;

				while (ov < nb && hs_has(&g_rep[r].view, hh[ov]))
					ov++;
				if (pol == POL_PREFIX)
					cost = -(double)ov * 1e12 + (double)g_rep[r].active_blocks;
				else
					cost = o->weight * (double)(nb - ov) + (double)g_rep[r].active_blocks;
				if (cost < best_cost)
					best_cost = cost, best = r;
			}
			if (pol == POL_RR)
				best = i % R;
			g_req[i].where = best;
			g_req[i].blocks = (q->prompt_len + q->output_len + BT - 1) / BT;
			g_rep[best].active_blocks += g_req[i].blocks;
			count[best]++;
			if (g_rep[best].now < t_arr)
				g_rep[best].now = t_arr;
			bkv_request_init(&rq);
			rq.prompt = tok;
			rq.prompt_len = q->prompt_len;
			rq.max_new_tokens = q->output_len;
			rq.user = (void *)(uintptr_t)(i + 1);
			if (bkv_submit(g_rep[best].sched, &rq, &id) != BKV_OK)
				return fprintf(stderr, "router: submit %u refused\n", i), -1;
			res->prompt_tokens += q->prompt_len;
			next_arrival++;
		} else {
			replica *P = &g_rep[busy];
			const uint8_t *m;
			size_t len;
			double before = P->now;
			int rc = bkv_step(P->sched, NULL);

			if (rc != BKV_OK)
				return fprintf(stderr, "router: step: %s\n", bkv_strerror(rc)), -1;
			if (P->now == before) { /* nothing ran: wait for the next arrival */
				if (next_arrival >= n)
					return fprintf(stderr, "router: replica %d stalled\n", busy), -1;
				P->now = t_arr;
			}
			rc = bkv_vllm_encoder_drain(P->enc, P->pool, P->now * 1e-6, &m, &len);
			if (rc < 0)
				return fprintf(stderr, "router: encode: %s\n", bkv_strerror(rc)), -1;
			if (len) {
				msg *x = malloc(sizeof *x);

				x->at = P->now;
				x->p = malloc(len);
				memcpy(x->p, m, len);
				x->n = len;
				x->next = NULL;
				if (P->tail)
					P->tail->next = x;
				else
					P->head = x;
				P->tail = x;
				res->events_bytes += len;
				res->batches++;
			}
		}
	}

	res->per_replica_min = UINT32_MAX;
	for (uint32_t r = 0; r < R && o->check; r++) {
		replica *P = &g_rep[r];
		uint8_t *truth = malloc((size_t)o->kv_blocks * BKV_VLLM_DIGEST_BYTES);
		uint32_t nt;

		while (P->head) { /* deliver the rest */
			msg *m = P->head;

			if (apply_batch(&P->view, m->p, m->n))
				return fprintf(stderr, "router: malformed batch\n"), -1;
			P->head = m->next;
			free(m->p);
			free(m);
		}
		P->tail = NULL;
		nt = evw_pool_truth(P->pool, 0, &vc, truth, o->kv_blocks); /* default hash_seed */
		if (nt != P->view.n)
			return fprintf(stderr, "router: replica %u: view %u blocks, index %u\n", r,
				       P->view.n, nt), -1;
		for (uint32_t k = 0; k < nt; k++)
			if (!hs_has(&P->view, bkv_vllm_hash_int(truth + (size_t)k * BKV_VLLM_DIGEST_BYTES)))
				return fprintf(stderr, "router: replica %u: an indexed block unknown\n", r), -1;
		res->checked_blocks += nt;
		free(truth);
	}
	for (uint32_t r = 0; r < R; r++) {
		replica *P = &g_rep[r];
		bkv_sched_stats ss;

		ss.size = sizeof ss;
		bkv_sched_stats_get(P->sched, &ss);
		res->hit_tokens += ss.hit_tokens;
		res->preemptions += ss.preemptions;
		if (P->now * 1e-6 > res->makespan_s)
			res->makespan_s = P->now * 1e-6;
		res->per_replica_max = count[r] > res->per_replica_max ? count[r] : res->per_replica_max;
		res->per_replica_min = count[r] < res->per_replica_min ? count[r] : res->per_replica_min;
		while (P->head) {
			msg *m = P->head;

			P->head = m->next;
			free(m->p);
			free(m);
		}
		free(P->view.k);
		free(P->chunks);
		bkv_vllm_encoder_destroy(P->enc);
		bkv_sched_destroy(P->sched);
		bkv_pool_destroy(P->pool);
	}
	for (uint32_t i = 0; i < n; i++) {
		ttft[i] = (g_req[i].first_us - t->reqs[i].arrival_us / o->speed) * 1e-3;
		res->ttft_mean += ttft[i] / n;
	}
	qsort(ttft, n, sizeof *ttft, cmp_d);
	res->ttft_p50 = ttft[n / 2];
	res->ttft_p99 = ttft[(size_t)((n - 1) * 0.99)];
	free(ttft);
	free(count);
	free(g_req);
	free(g_rep);
	free(tok);
	free(dig);
	free(hh);
	return 0;
}

int main(int argc, char **argv)
{
	opts o = {"../shared/data/traces/mooncake_conversation_trace.jsonl", 3000, 4, 20000, 64,
		  1.0, 1.0, 0};
	trace t;
	char err[256];

	for (int i = 1; i < argc; i += 2) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";

		if (!strcmp(a, "--check")) {
			o.check = 1;
			i--;
		} else if (!strcmp(a, "--trace"))
			o.trace = v;
		else if (!strcmp(a, "--limit"))
			o.limit = (uint32_t)atoi(v);
		else if (!strcmp(a, "--replicas"))
			o.replicas = (uint32_t)atoi(v);
		else if (!strcmp(a, "--kv-blocks"))
			o.kv_blocks = (uint32_t)atoi(v);
		else if (!strcmp(a, "--slots"))
			o.slots = (uint32_t)atoi(v);
		else if (!strcmp(a, "--weight"))
			o.weight = atof(v);
		else if (!strcmp(a, "--speed"))
			o.speed = atof(v);
		else
			return fprintf(stderr, "unknown option %s\n", a), 2;
	}
	if (o.replicas == 0 || o.limit == 0 || o.speed <= 0)
		return fprintf(stderr, "bad options\n"), 2;
	memset(&t, 0, sizeof t);
	if (trace_load(TRACE_MOONCAKE, o.trace, NULL, &t, err, sizeof err) != TRACE_OK)
		return fprintf(stderr, "%s: %s\n", o.trace, err), 1;
	printf("Mooncake conversation trace, first %u requests, %u replicas x %u blocks of %d "
	       "tokens, %u slots, H100 roofline, arrivals / %.2f\n",
	       BKV_MIN_U(t.n, o.limit), o.replicas, o.kv_blocks, BT, o.slots, o.speed);
	printf("%-12s %10s %12s %10s %10s %10s %9s %9s %11s\n", "policy", "hit%", "hit_tokens",
	       "ttft_avg", "ttft_p50", "ttft_p99", "makespan", "preempt", "reqs/replica");
	for (int pol = 0; pol < 3; pol++) {
		result r;

		if (run(&o, &t, pol, &r))
			return 1;
		printf("%-12s %9.1f%% %12llu %8.1fms %8.1fms %8.1fms %8.1fs %9llu %5u..%u\n",
		       pol_name[pol], 100.0 * (double)r.hit_tokens / (double)r.prompt_tokens,
		       (unsigned long long)r.hit_tokens, r.ttft_mean, r.ttft_p50, r.ttft_p99,
		       r.makespan_s, (unsigned long long)r.preemptions, r.per_replica_min,
		       r.per_replica_max);
		if (o.check)
			printf("  check: every replica's view equals its index (%llu blocks)\n",
			       (unsigned long long)r.checked_blocks);
	}
	trace_free(&t);
	return 0;
}
