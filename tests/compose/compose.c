/*
 * compose.c - the randomized composition tester (compose.h): features drawn
 * together per seed, a fake device that checks every KV cell a batch reads,
 * and an oracle of what each request delivers when run alone.
 *
 * The fake device. Its memory is one cell per token slot of every device
 * frame (the attention frames and, with a STATE group, the state arena above
 * them) and of every host-tier block. A cell holds what was last written
 * there: the chained hash of the writer's cache key and tokens [0, p] (its
 * identity: a request and branch's history, or a shared prefix), the
 * position p and the KV group. A STATE unit keeps its state in the first
 * cell of its first frame: the chain over the tokens it has consumed and
 * their count. Every call, in order:
 *
 *   apply the persistent layout's table deltas to the host's mirror (group
 *   0; groups >= 1 are read from their row_tables), check it against the
 *   library's tables
 *   decide the fault (a per-scenario rate): half refuse at the door, half
 *   do harm first (copies, poisoned cells, then -1)
 *   copies: swap-out, swap-in, device (host-cache demotions and reloads ride
 *   the swap lists)
 *   pass 1, reads: per row, its shape; every input token against its
 *   history (placeholders of an overlapped step replaced by the sampled
 *   tokens of the step launched before); per attention group every context
 *   cell its first query reads ([0, start) full, the window, the chunk) and
 *   the slot of every new token; a STATE group's state_in
 *   pass 2, writes: every new cell at slot_mapping of every group, the
 *   state at state_out; sampling (the token function below), speculative
 *   rows verified after each draft and a random accepted prefix
 *
 * The oracle. Token p of branch b of a request is its prompt for p < prompt
 * length, else tok(tag, b, p): a hash, now and then the stop token or
 * BKV_TOKEN_FAIL. So what a request delivers run alone is known without
 * running it: per branch the stream up to and including a stop, before a
 * failure, or max_new_tokens long. on_token must deliver exactly that
 * stream, in order; on_finish runs once per request with a reason that fits
 * (ABORT only after bkv_abort, ERROR only at a BKV_TOKEN_FAIL or for an
 * unadmittable request).
 *
 * Features drawn per seed (cx_draw): flat or persistent layout; KV groups
 * (full + window, full + chunked, full + STATE, full + window + STATE);
 * chunked prefill; prefix caching with shared prompt prefixes and cache
 * keys; forks (n > 1); prefix pins (and pin ids misused as sequence ids);
 * bkv_pool_reset_cache between steps; host cache; retention ranges;
 * speculative decoding (n-gram or host drafts, greedy or host-chosen
 * acceptance); overlapped scheduling (launch/complete, placeholders, sync
 * steps mixed in); a split host; tiny pools (preemption) with swap; aborts
 * from the driver, from on_token and from a second thread; failing host
 * calls (and failed launches and completions); KV events; eviction, victim
 * and admission policies; adapters (more distinct ones than the cap, each
 * call's checked against it, and their KV kept apart: a request's cells
 * chain over its adapter); abandoning the scheduler with steps outstanding.
 * After every driver action bkv_sched_check (and, with nothing outstanding,
 * bkv_pool_check) must answer 0. CX_TRACE=1 in the environment logs every
 * call's copies and rows to stderr (a replay's trail).
 */
#define _POSIX_C_SOURCE 200809L
#include "compose.h"

#include "batchkv.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CX_MAGIC 0x636f6d706f736521ull
#define CX_STOP 7
#define CX_MAX_N 3u
#define CX_MAX_REQ 40u
#define CX_MAX_PINS 4u
#define CX_JUNK 0x5eadbeef

const char *const cx_refuse_names[CX_REFUSE_COUNT] = {"overlap+state"};

/* ---- random numbers ------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0x7fb5d329728ea185ull;
	x ^= x >> 27;
	x *= 0x81dadef4bc2dd44dull;
	x ^= x >> 33;
	return x;
}

static uint64_t rnd(uint64_t *s)
{
	*s += 0x9e3779b97f4a7c15ull;
	return mix(*s);
}

/* 0..n-1 */
static uint32_t below(uint64_t *s, uint32_t n)
{
	return n ? (uint32_t)(rnd(s) % n) : 0;
}

static int chance(uint64_t *s, uint32_t permille)
{
	return below(s, 1000) < permille;
}

/* ---- the scenario --------------------------------------------------------- */

enum { GM_NONE, GM_WINDOW, GM_CHUNKED, GM_STATE, GM_WINDOW_STATE, GM_COUNT };
static const char *const gm_names[GM_COUNT] = {"none", "full+window", "full+chunked",
					       "full+state", "full+window+state"};

typedef struct cx_feat {
	uint32_t bt, device_blocks, host_blocks, max_seqs, max_running;
	uint32_t layout;      /* bkv_batch_layout */
	uint32_t gmix;        /* GM_* */
	uint32_t span;        /* window / chunk span */
	uint32_t ckpt;        /* STATE checkpoint interval */
	uint32_t state_share;
	int chunked;
	uint32_t token_budget;
	int prefix_cache;
	uint32_t n_prefixes;  /* shared prompt prefixes */
	uint32_t max_n;       /* most branches */
	int pins, reset_cache, host_cache, retention, events, split, overlap;
	uint32_t spec_k;
	int spec_host, spec_fixed, spec_host_accepts;
	int tiny;
	uint32_t preempt;     /* bkv_preempt_mode */
	uint32_t abort_permille, token_abort_permille;
	int abort_thread;
	uint32_t fail_permille;
	uint32_t vocab, stop_mod, fail_mod;
	int evict_value, evict_seg, victim_cost, reserve_output, static_policy;
	int abandon;
	uint32_t n_reqs;
	uint32_t max_prompt, max_new;
	uint32_t keys;        /* distinct cache keys (1: all 0) */
	uint32_t max_adapters; /* 0: no adapters; else the cap, and requests
				  draw adapters 0..max_adapters + 1 */
	uint32_t enc_cache;   /* 0: no encoder inputs; else encoder_cache */
	uint32_t enc_budget;  /* encoder_budget */
	int connector;        /* a KV connector over the store below */
	int conn_async;       /* its transfers complete between steps */
	uint32_t conn_fail;   /* permille of loaded blocks that fail */
	uint32_t conn_later;  /* permille of lookups answered later */
} cx_feat;

typedef struct cx_req {
	uint64_t magic;
	uint32_t idx;
	uint64_t tag;
	int32_t prompt[96];
	uint32_t plen, max_new, n;
	uint64_t key;         /* its cache identity: cache key and adapter */
	uint64_t cache_key;   /* bkv_request.cache_key */
	bkv_encoder_input in[3]; /* its encoder inputs (their ids are in
				    prompt; sub has placeholders there) */
	uint32_t n_in;
	int32_t sub[96];      /* the prompt as submitted */
	uint32_t adapter;     /* bkv_request.adapter */
	int32_t priority;
	bkv_retention_range ret[2];
	uint32_t n_ret;
	uint32_t submit_at;   /* driver iteration that submits it */
	uint64_t id;          /* atomic */
	int submitted;        /* bkv_submit answered OK */
	int refused;          /* E2BIG at submit */
	int abort_asked;      /* atomic */
	uint32_t finished;
	int reason;
	uint32_t n_out[CX_MAX_N];
	uint8_t done[CX_MAX_N];
} cx_req;

typedef struct cx_cell {
	uint64_t chain; /* identity: chain over key and tokens [0, pos] */
	int32_t pos;    /* position; for a state: tokens consumed */
	int32_t group;  /* KV group that wrote it; -1: never written */
} cx_cell;

typedef struct cx_xfer {     /* a connector transfer not completed yet */
	uint64_t id;
	const bkv_kv_xfer_block *b; /* the library's entries */
	uint32_t n;
	int load;
} cx_xfer;

#define CX_STORE_CAP 4096u /* blocks the connector's store holds */
#define CX_XQ_CAP 64u      /* transfers it queues */

typedef struct cx_dev {      /* one outstanding overlapped step */
	int32_t *next;       /* its next_tokens (the library's) */
	uint32_t rows;
	int failed;          /* the device failed it (or skipped it) */
	const bkv_batch_group *st; /* its STATE group (the library's arrays,
				      valid until it completes), or NULL */
	uint32_t spec_n;     /* entries of st->state_out_spec */
} cx_dev;

typedef struct cx_run {
	cx_feat f;
	cx_opts opt;
	cx_result *res;
	uint64_t seed;
	uint64_t rng_drive, rng_fail;
	bkv_pool *pool;
	bkv_sched *s;
	bkv_kv_group groups[3];
	uint32_t n_groups;   /* 0: plain pool */
	uint32_t state_group; /* index of the STATE group, or UINT32_MAX */
	uint32_t state_frames;
	uint32_t nframes;    /* device frames the cell model covers */
	cx_cell *dev, *host;
	int32_t prefixes[4][64];
	uint32_t prefix_len[4];
	cx_req req[CX_MAX_REQ];
	uint32_t n_req;
	/* the host's encoder cache: ids and lengths */
	uint64_t hc_id[256];
	uint32_t hc_len[256];
	uint32_t hc_n;
	uint64_t enc_cost;   /* encoder work in the current driver step */
	uint64_t iter;
	/* persistent mirror of group 0 */
	uint32_t n_slots, width;
	int32_t *mirror;
	uint32_t *mlen;
	/* overlap */
	cx_dev q[BKV_OVERLAP_MAX_DEPTH + 1];
	uint32_t nq;
	uint64_t tickets[BKV_OVERLAP_MAX_DEPTH + 1];
	uint32_t nt;
	int32_t *subst;
	uint32_t subst_cap;
	/* pins */
	uint32_t pins[CX_MAX_PINS];
	uint32_t n_pins;
	/* scratch */
	uint64_t *chain;
	uint32_t chain_cap;
	int failed;
	int trace;           /* CX_TRACE set: trace_call logs every call */
	int outs;            /* bkv_sched_outputs_enable is on: the arrays
				must repeat the callbacks (check_outputs) */
	uint32_t out_tok, out_fin; /* callbacks since the last delivery point */
	uint64_t out_tok_h, out_fin_h; /* their order-sensitive hashes */
	int unadmittable_ok;
	uint32_t errors_unexplained;
	/* abort thread */
	pthread_t thr;
	int thr_on;
	int thr_stop;        /* atomic */
	uint32_t thr_list[8], thr_n;
	bkv_kv_event ev[64];
	/* the KV connector's store: cells by block hash, a queue of transfers */
	bkv_connector conn;
	uint64_t st_hash[CX_STORE_CAP]; /* 0: empty */
	cx_cell *st_cell;    /* [CX_STORE_CAP x st_cells] */
	uint32_t st_cells;   /* cells per entry (a state's frames x bt) */
	uint32_t st_n;       /* entries used */
	cx_xfer xq[CX_XQ_CAP];
	uint32_t nxq;
	uint64_t rng_conn;
} cx_run;

static void fail(cx_run *x, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (x->failed++)
		return;
	n = snprintf(x->res->msg, sizeof(x->res->msg), "iter %llu: ", (unsigned long long)x->iter);
	va_start(ap, fmt);
	vsnprintf(x->res->msg + n, sizeof(x->res->msg) - (size_t)n, fmt, ap);
	va_end(ap);
	x->res->failed = 1;
}

/* Draw a scenario's features from the seed (the first draws of its stream). */
static void cx_draw(uint64_t seed, cx_feat *f)
{
	uint64_t s = mix(seed ^ 0x5eed5eed5eedull);
	static const uint32_t bts[] = {1, 2, 4, 8, 16};

	memset(f, 0, sizeof(*f));
	f->bt = bts[below(&s, 5)];
	f->layout = below(&s, 2);
	f->gmix = chance(&s, 450) ? 1 + below(&s, GM_COUNT - 1) : GM_NONE;
	f->span = 1 + below(&s, 3 * f->bt + 4);
	f->ckpt = f->bt * below(&s, 4); /* 0: no checkpoints */
	f->state_share = chance(&s, 300);
	f->chunked = chance(&s, 600);
	f->token_budget = chance(&s, 300) ? 0 : 4 + below(&s, 60);
	f->prefix_cache = chance(&s, 800);
	f->n_prefixes = f->prefix_cache ? 1 + below(&s, 3) : 0;
	f->max_n = chance(&s, 350) ? 2 + below(&s, CX_MAX_N - 1) : 1;
	f->pins = f->prefix_cache && chance(&s, 400);
	f->reset_cache = chance(&s, 150);
	f->host_cache = f->prefix_cache && chance(&s, 300);
	f->retention = chance(&s, 200);
	f->events = chance(&s, 200);
	f->overlap = chance(&s, 300);
	f->split = !f->overlap && chance(&s, 200);
	f->spec_k = chance(&s, 350) ? 1 + below(&s, 6) : 0;
	f->spec_host = chance(&s, 500);
	f->spec_fixed = chance(&s, 400);
	f->spec_host_accepts = chance(&s, 500);
	f->tiny = chance(&s, 450);
	f->preempt = below(&s, 3);
	f->abort_permille = chance(&s, 300) ? 20 + below(&s, 80) : 0;
	f->token_abort_permille = chance(&s, 150) ? 5 + below(&s, 20) : 0;
	f->abort_thread = chance(&s, 60);
	f->fail_permille = chance(&s, 350) ? 10 + below(&s, 120) : 0;
	f->vocab = chance(&s, 400) ? 2 + below(&s, 4) : 50000; /* small: n-grams recur */
	f->stop_mod = chance(&s, 500) ? 4 + below(&s, 20) : 0;
	f->fail_mod = chance(&s, 100) ? 20 + below(&s, 40) : 0;
	f->evict_value = chance(&s, 250);
	/* the segmented LRU, from the seed (the draws above and below stay
	 * as found seeds replay them) */
	f->evict_seg = !f->evict_value && (seed * 0x9e3779b97f4a7c15ull) >> 62 == 1;
	/* encoder inputs, from the seed alone too */
	if ((mix(seed ^ 0xe1c0deull) & 3) == 0) {
		f->enc_cache = 24 + (uint32_t)(mix(seed ^ 0xe1c0dfull) % 80);
		f->enc_budget = mix(seed ^ 0xe1c0e0ull) & 1 ? 0 : 18 + (uint32_t)(mix(seed) % 30);
	}
	/* adapters, from the seed alone too */
	if ((mix(seed ^ 0xada97e5ull) & 3) == 0)
		f->max_adapters = 1 + (uint32_t)(mix(seed ^ 0xada97e6ull) % 3);
	/* the overlap depth, from the seed alone too */
	if (f->overlap) {
		const uint32_t d = (uint32_t)(mix(seed ^ 0xde9742ull) % 8);

		f->overlap = d < 4 ? 1 : d < 7 ? (int)d - 2 : BKV_OVERLAP_MAX_DEPTH;
	}
	/* a KV connector, from the seed alone too */
	if ((mix(seed ^ 0xc0ec7ull) % 5) == 0) {
		f->connector = 1;
		f->conn_async = (int)(mix(seed ^ 0xc0ec8ull) & 1);
		f->conn_fail = mix(seed ^ 0xc0ec9ull) % 3 ? 0 : 100;
		f->conn_later = mix(seed ^ 0xc0ecaull) % 3 ? 0 : 300;
		/* the store serves what the device forgot: resets make it */
		f->reset_cache |= (int)(mix(seed ^ 0xc0eccull) & 1);
	}
	f->victim_cost = chance(&s, 250);
	f->reserve_output = chance(&s, 150);
	f->static_policy = !f->overlap && chance(&s, 60);
	f->abandon = chance(&s, 60);
	if (chance(&s, 150)) {
		/* the pressure profile: overlapped steps over a tiny pool, many
		 * rows, recompute preemption and failing steps together */
		f->overlap = 1 + (int)(mix(seed ^ 0xde9743ull) % 4);
		f->split = 0;
		f->static_policy = 0;
		f->tiny = 1; /* (speculation as drawn) */
		f->preempt = chance(&s, 700) ? BKV_PREEMPT_RECOMPUTE : BKV_PREEMPT_AUTO;
		f->fail_permille = 30 + below(&s, 150);
	}
	f->n_reqs = 2 + below(&s, CX_MAX_REQ - 1);
	f->max_prompt = 1 + below(&s, chance(&s, 300) ? 90 : 30);
	f->max_new = 1 + below(&s, chance(&s, 300) ? 48 : 16);
	f->keys = chance(&s, 200) ? 2 : 1;
	f->max_running = 1 + below(&s, 12);
	if (f->tiny && f->max_running < 4)
		f->max_running += below(&s, 4);
	if (f->max_n > f->max_running)
		f->max_running = f->max_n;
	f->max_seqs = f->max_running + CX_MAX_PINS + 2 + below(&s, 24);
	f->host_blocks = (f->host_cache || f->preempt != BKV_PREEMPT_RECOMPUTE || chance(&s, 400))
				 ? 1 + below(&s, 64)
				 : 0;
	if (f->preempt == BKV_PREEMPT_SWAP && !f->host_blocks)
		f->host_blocks = 8;
	if (f->host_cache && !f->host_blocks)
		f->host_blocks = 8;
	{
		/* the largest request must fit: every group holds its own blocks */
		uint32_t per_seq = (f->max_prompt + 16 + f->max_new + f->spec_k) / f->bt + 2;
		uint32_t need = per_seq * f->max_n * (f->gmix == GM_WINDOW_STATE ? 2 : f->gmix ? 2 : 1);

		f->device_blocks = f->tiny ? need + below(&s, 4) : need * (3 + below(&s, 12));
		if (f->device_blocks < 4)
			f->device_blocks = 4;
	}
}

static void describe(const cx_feat *f, char *buf, uint32_t cap)
{
	snprintf(buf, cap,
		 "bt=%u dev=%u host=%u max_seqs=%u max_running=%u layout=%s groups=%s span=%u "
		 "ckpt=%u state_share=%u chunked=%d budget=%u prefix=%d prefixes=%u max_n=%u pins=%d "
		 "reset=%d host_cache=%d retention=%d events=%d split=%d overlap=%d spec_k=%u(%s,%s,%s) "
		 "tiny=%d preempt=%u aborts=%u/%u%s fail=%u vocab=%u stop_mod=%u fail_mod=%u "
		 "evict_value=%d evict_seg=%d victim_cost=%d reserve_output=%d static=%d abandon=%d reqs=%u "
		 "prompt<=%u new<=%u keys=%u adapters=%u enc=%u/%u connector=%d(%s,fail %u,later %u)",
		 f->bt, f->device_blocks, f->host_blocks, f->max_seqs, f->max_running,
		 f->layout ? "persistent" : "flat", gm_names[f->gmix], f->span, f->ckpt,
		 f->state_share, f->chunked, f->token_budget, f->prefix_cache, f->n_prefixes,
		 f->max_n, f->pins, f->reset_cache, f->host_cache, f->retention, f->events, f->split,
		 f->overlap, f->spec_k, f->spec_host ? "host" : "ngram",
		 f->spec_fixed ? "fixed" : "auto", f->spec_host_accepts ? "host-accepts" : "greedy",
		 f->tiny, f->preempt, f->abort_permille, f->token_abort_permille,
		 f->abort_thread ? " abort-thread" : "", f->fail_permille, f->vocab, f->stop_mod,
		 f->fail_mod, f->evict_value, f->evict_seg, f->victim_cost, f->reserve_output, f->static_policy,
		 f->abandon, f->n_reqs, f->max_prompt, f->max_new, f->keys, f->max_adapters,
		 f->enc_cache, f->enc_budget, f->connector && f->prefix_cache,
		 f->conn_async ? "async" : "inline", f->conn_fail, f->conn_later);
}

void cx_describe_seed(uint64_t seed, char *buf, uint32_t cap)
{
	cx_feat f;

	cx_draw(seed, &f);
	describe(&f, buf, cap);
}

/* ---- the oracle ------------------------------------------------------------ */

static void draw_inputs(cx_run *x, cx_req *q, uint32_t i);

static int32_t tok(const cx_run *x, const cx_req *q, uint32_t br, uint32_t pos)
{
	uint64_t h;

	if (pos < q->plen)
		return q->prompt[pos];
	h = mix(q->tag * 0x9e3779b97f4a7c15ull ^ (uint64_t)br << 48 ^ (uint64_t)pos);
	if (x->f.fail_mod && h % x->f.fail_mod == 1)
		return BKV_TOKEN_FAIL;
	if (x->f.stop_mod && (h >> 20) % x->f.stop_mod == 0)
		return CX_STOP;
	return 1000 + (int32_t)((h >> 8) % x->f.vocab);
}

/* Tokens branch br delivers run alone, and whether it ends at a failure. */
static uint32_t expected_len(const cx_run *x, const cx_req *q, uint32_t br, int *fails)
{
	uint32_t i;

	*fails = 0;
	for (i = 0; i < q->max_new; i++) {
		int32_t t = tok(x, q, br, q->plen + i);

		if (t == BKV_TOKEN_FAIL) {
			*fails = 1;
			return i;
		}
		if (t == CX_STOP)
			return i + 1;
	}
	return q->max_new;
}

static uint64_t chain_root(uint64_t key)
{
	return mix(key ^ 0x243f6a8885a308d3ull);
}

static uint64_t chain(uint64_t c, int32_t t)
{
	return mix(c ^ (uint64_t)(uint32_t)t) + 0x9e3779b97f4a7c15ull;
}

/* ---- the fake device ------------------------------------------------------- */

static cx_req *row_req(cx_run *x, const bkv_batch *b, uint32_t r)
{
	cx_req *q = (cx_req *)b->row_user[r];
	uint64_t id;

	if (!q || q->magic != CX_MAGIC) {
		fail(x, "row %u: user pointer is not a request", r);
		return NULL;
	}
	id = __atomic_load_n(&q->id, __ATOMIC_ACQUIRE);
	if (id && id != b->row_req[r]) {
		fail(x, "row %u: row_req %llu carries request %llu's user", r,
		     (unsigned long long)b->row_req[r], (unsigned long long)id);
		return NULL;
	}
	if (b->row_branch[r] >= q->n) {
		fail(x, "row %u: branch %u of %u", r, b->row_branch[r], q->n);
		return NULL;
	}
	return q;
}

static void copy_frames(cx_run *x, const bkv_copy *c, uint32_t n, cx_cell *src, uint32_t src_n,
			cx_cell *dst, uint32_t dst_n, const char *what)
{
	uint32_t i, bt = x->f.bt;

	for (i = 0; i < n; i++) {
		if (c[i].src < 0 || (uint32_t)c[i].src >= src_n || c[i].dst < 0 ||
		    (uint32_t)c[i].dst >= dst_n) {
			fail(x, "%s copy %d -> %d out of range (%u, %u)", what, c[i].src, c[i].dst,
			     src_n, dst_n);
			return;
		}
		memmove(dst + (size_t)c[i].dst * bt, src + (size_t)c[i].src * bt, bt * sizeof(cx_cell));
	}
}

static int apply_deltas(cx_run *x, const bkv_batch *b)
{
	const int32_t *blk = b->delta_blocks;
	uint32_t i;

	if (b->n_row_slots > x->n_slots) {
		uint32_t *ml = realloc(x->mlen, b->n_row_slots * sizeof(uint32_t));
		int32_t *m;

		if (!ml)
			return -1;
		x->mlen = ml;
		m = realloc(x->mirror, (size_t)b->n_row_slots * x->width * sizeof(int32_t));
		if (!m)
			return -1;
		x->mirror = m;
		memset(x->mlen + x->n_slots, 0, (b->n_row_slots - x->n_slots) * sizeof(uint32_t));
		x->n_slots = b->n_row_slots;
	}
	for (i = 0; i < b->n_table_deltas; i++) {
		const bkv_table_delta *d = &b->table_deltas[i];

		if (d->slot >= x->n_slots || d->start + d->n > x->width || d->len > x->width ||
		    d->start + d->n > d->len || ((d->flags & BKV_TABLE_CLOSED) && (d->n || d->len)) ||
		    ((d->flags & BKV_TABLE_OPENED) && d->start)) {
			fail(x, "bad delta %u: slot %u start %u n %u len %u flags %u", i, d->slot,
			     d->start, d->n, d->len, d->flags);
			return 0;
		}
		if (!(d->flags & BKV_TABLE_OPENED) && d->start > x->mlen[d->slot]) {
			fail(x, "delta %u of slot %u starts at %u past its %u entries", i, d->slot,
			     d->start, x->mlen[d->slot]);
			return 0;
		}
		memcpy(x->mirror + (size_t)d->slot * x->width + d->start, blk, d->n * sizeof(int32_t));
		blk += d->n;
		x->mlen[d->slot] = d->len;
	}
	return 0;
}

/* Row r's table in group g: entries [0, n) cover logical blocks first.. */
static int row_table(cx_run *x, const bkv_batch *b, uint32_t r, uint32_t g, const int32_t **tab,
		     uint32_t *first, uint32_t *n)
{
	const bkv_batch_group *G = b->groups && b->n_groups > g ? &b->groups[g] : NULL;

	if (b->layout == BKV_BATCH_PERSISTENT) {
		uint32_t slot = b->row_slot[r];

		if (slot >= x->n_slots) {
			fail(x, "row %u: slot %u of %u", r, slot, x->n_slots);
			return -1;
		}
		*first = 0;
		if (g == 0) {
			*tab = x->mirror + (size_t)slot * x->width;
			*n = x->mlen[slot];
		} else {
			if (!G || !G->row_tables || !G->row_table_len) {
				fail(x, "group %u: no row tables", g);
				return -1;
			}
			*tab = G->row_tables[slot];
			*n = G->row_table_len[slot];
		}
		return 0;
	}
	{
		const int32_t *indptr = G ? G->kv_indptr : b->kv_indptr;
		const int32_t *indices = G ? G->kv_indices : b->kv_indices;

		if (!indptr || !indices) {
			fail(x, "group %u: flat batch without kv_indptr/kv_indices", g);
			return -1;
		}
		if (indptr[r + 1] < indptr[r]) {
			fail(x, "group %u row %u: indptr decreases", g, r);
			return -1;
		}
		*tab = indices + indptr[r];
		*n = (uint32_t)(indptr[r + 1] - indptr[r]);
		*first = G && G->kv_first_block ? (uint32_t)G->kv_first_block[r] : 0;
	}
	return 0;
}

static uint32_t group_kind(const cx_run *x, uint32_t g)
{
	return x->n_groups ? x->groups[g].kind : BKV_GROUP_FULL;
}

/* The STATE units a row with k drafts writes a state to after each of its
 * tokens (state_out_spec): in the arena, the last its state_out, and none
 * a unit another token of the call writes or any row reads. */
static int spec_states(cx_run *x, const bkv_batch *b, const bkv_batch_group *G, uint32_t r,
		       uint32_t start, uint32_t k)
{
	const int32_t q0 = b->qo_indptr[r];
	const int32_t nd = b->qo_indptr[b->n_decode_rows];
	uint32_t j, i;
	int32_t t;

	if (!G->state_out_spec || G->state_out_spec[q0 + (int32_t)k] != G->state_out[r]) {
		fail(x, "row %u at %u: %u drafts without their states", r, start, k);
		return 1;
	}
	for (j = 0; j <= k; j++) {
		const int32_t u = G->state_out_spec[q0 + (int32_t)j];

		if (u < 0 || (uint32_t)u + G->state_frames > x->nframes) {
			fail(x, "row %u: state %u in unit %d of %u frames", r, j, u, x->nframes);
			return 1;
		}
		for (i = 0; i < b->n_rows; i++)
			if (G->state_in[i] == u || (i != r && G->state_out[i] == u)) {
				fail(x, "row %u: state %u in unit %d, row %u's", r, j, u, i);
				return 1;
			}
		for (t = 0; t < nd; t++)
			if (t != q0 + (int32_t)j && G->state_out_spec[t] == u &&
			    (t < q0 || t > q0 + (int32_t)k || j < k)) {
				fail(x, "row %u: state %u in unit %d, written twice", r, j, u);
				return 1;
			}
	}
	x->res->spec_states += k;
	return 0;
}

/* Pass 1 for row r: shape, tokens, every context cell and state read. The
 * chain of every position [0, end) is left in x->chain. */
static void check_row(cx_run *x, const bkv_batch *b, const int32_t *ids, uint32_t r)
{
	cx_req *q = row_req(x, b, r);
	const uint32_t bt = x->f.bt, ng = x->n_groups ? x->n_groups : 1;
	int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
	uint32_t br, start, end, k, p, g, nblk;
	uint64_t c;

	if (!q || x->failed)
		return;
	br = b->row_branch[r];
	k = b->row_drafts ? b->row_drafts[r] : 0;
	if (q1 <= q0 || (r < b->n_decode_rows && q1 - q0 != 1 + (int32_t)k) ||
	    (r >= b->n_decode_rows && k)) {
		fail(x, "row %u: tokens [%d, %d), %u drafts, %u decode rows", r, q0, q1, k,
		     b->n_decode_rows);
		return;
	}
	start = (uint32_t)b->positions[q0];
	end = start + (uint32_t)(q1 - q0);
	if (start >= q->plen + q->max_new || (!k && end > q->plen + q->max_new)) {
		fail(x, "req %u branch %u: row [%u, %u) beyond prompt %u + max_new %u", q->idx, br,
		     start, end, q->plen, q->max_new);
		return;
	}
	nblk = (end + bt - 1) / bt;
	if ((uint32_t)b->kv_last_page_len[r] != end - (nblk - 1) * bt) {
		fail(x, "row %u: last page %d for %u tokens", r, b->kv_last_page_len[r], end);
		return;
	}
	if (end > x->chain_cap) {
		free(x->chain);
		x->chain_cap = 2 * end;
		x->chain = malloc(x->chain_cap * sizeof(uint64_t));
	}
	c = chain_root(q->key);
	for (p = 0; p < end; p++) {
		int32_t t = p < start ? tok(x, q, br, p) : ids[q0 + (int32_t)(p - start)];

		if (p >= start) {
			if (b->positions[q0 + (int32_t)(p - start)] != (int32_t)p) {
				fail(x, "row %u: position %d where %u belongs", r,
				     b->positions[q0 + (int32_t)(p - start)], p);
				return;
			}
			if ((p == start || !k) && t != tok(x, q, br, p)) {
				fail(x, "req %u branch %u: input token %d at position %u, its history "
					"holds %d",
				     q->idx, br, t, p, tok(x, q, br, p));
				return;
			}
		}
		c = chain(c, t);
		x->chain[p] = c;
	}
	for (g = 0; g < ng; g++) {
		uint32_t kind = group_kind(x, g), span = x->n_groups ? x->groups[g].span : 0;
		const int32_t *tab;
		uint32_t first, n, lo;
		const int32_t *slots = b->groups && b->n_groups > g ? b->groups[g].slot_mapping
								    : b->slot_mapping;

		if (kind == BKV_GROUP_STATE) {
			const bkv_batch_group *G = &b->groups[g];
			int32_t in = G->state_in[r], out = G->state_out[r];
			uint32_t i;

			if (out < 0 || (uint32_t)out + G->state_frames > x->nframes ||
			    (in >= 0 && (uint32_t)in + G->state_frames > x->nframes)) {
				fail(x, "row %u: state in %d out %d of %u frames", r, in, out, x->nframes);
				return;
			}
			for (i = 0; i < b->n_rows; i++)
				if (G->state_in[i] == out) {
					fail(x, "row %u writes state unit %d that row %u reads", r, out, i);
					return;
				}
			if (k && spec_states(x, b, G, r, start, k))
				return;
			if (in < 0) {
				if (start != 0)
					fail(x, "req %u branch %u: zero state for a row at %u", q->idx,
					     br, start);
				continue;
			}
			{
				const cx_cell *cl = &x->dev[(size_t)in * bt];

				x->res->cells_checked++;
				if (start == 0 || cl->group != (int32_t)g || cl->pos != (int32_t)start ||
				    cl->chain != x->chain[start - 1])
					fail(x,
					     "req %u branch %u: state unit %d holds {group %d, %d "
					     "tokens, %s} for a row at %u",
					     q->idx, br, in, cl->group, cl->pos,
					     start && cl->chain == x->chain[start - 1] ? "its chain"
										   : "another chain",
					     start);
			}
			continue;
		}
		if (row_table(x, b, r, g, &tab, &first, &n))
			return;
		if (first + n != nblk) {
			fail(x, "group %u row %u: blocks %u..%u for %u tokens", g, r, first, first + n,
			     end);
			return;
		}
		lo = kind == BKV_GROUP_WINDOW ? (start + 1 > span ? start + 1 - span : 0)
		     : kind == BKV_GROUP_CHUNKED ? start / span * span
						 : 0;
		if (first > lo / bt) {
			fail(x, "group %u row %u: table starts at block %u, the row reads from %u", g,
			     r, first, lo);
			return;
		}
		for (p = lo; p < end; p++) {
			int32_t blk = tab[p / bt - first];
			const cx_cell *cl;

			if (blk < 0 || (uint32_t)blk >= x->nframes) {
				fail(x, "group %u req %u branch %u: block %d at position %u", g, q->idx,
				     br, blk, p);
				return;
			}
			if (p >= start) {
				int32_t want = blk * (int32_t)bt + (int32_t)(p % bt);

				if (slots[q0 + (int32_t)(p - start)] != want) {
					fail(x, "group %u req %u: slot %d for position %u, table says %d",
					     g, q->idx, slots[q0 + (int32_t)(p - start)], p, want);
					return;
				}
				continue;
			}
			cl = &x->dev[(size_t)blk * bt + p % bt];
			x->res->cells_checked++;
			if (cl->group != (int32_t)g || cl->pos != (int32_t)p || cl->chain != x->chain[p]) {
				fail(x,
				     "group %u req %u branch %u (row [%u, %u)): cell of position %u "
				     "(block %d) holds {group %d, position %d, %s}",
				     g, q->idx, br, start, end, p, blk, cl->group, cl->pos,
				     cl->chain == x->chain[p] ? "its chain" : "another chain");
				return;
			}
		}
	}
}

/* Pass 2 for row r: write its cells and state, sample. */
static void compute_row(cx_run *x, const bkv_batch *b, const int32_t *ids, uint32_t r, int failing,
			int32_t *next)
{
	cx_req *q = (cx_req *)b->row_user[r];
	const uint32_t bt = x->f.bt, ng = x->n_groups ? x->n_groups : 1;
	int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
	uint32_t br = b->row_branch[r], start, end, p, g, k;
	uint64_t c;

	if (next)
		next[r] = CX_JUNK;
	if (x->failed)
		return;
	start = (uint32_t)b->positions[q0];
	end = start + (uint32_t)(q1 - q0);
	k = b->row_drafts ? b->row_drafts[r] : 0;
	/* chains again: check_row of a later row reused the scratch */
	c = chain_root(q->key);
	for (p = 0; p < end; p++) {
		c = chain(c, p < start ? tok(x, q, br, p) : ids[q0 + (int32_t)(p - start)]);
		x->chain[p] = c;
	}
	for (g = 0; g < ng; g++) {
		const int32_t *slots = b->groups && b->n_groups > g ? b->groups[g].slot_mapping
								    : b->slot_mapping;

		if (group_kind(x, g) == BKV_GROUP_STATE) {
			/* the state after each token of a speculated row, else
			 * after its last */
			const int32_t *spec = b->groups[g].state_out_spec;

			for (p = k && spec ? start : end - 1; p < end; p++) {
				int32_t u = k && spec ? spec[q0 + (int32_t)(p - start)]
						      : b->groups[g].state_out[r];
				cx_cell *cl = &x->dev[(size_t)u * bt];

				cl->chain = failing ? ~x->chain[p] : x->chain[p];
				cl->pos = failing ? -7 : (int32_t)p + 1;
				cl->group = (int32_t)g;
			}
			continue;
		}
		for (p = start; p < end; p++) {
			cx_cell *cl = &x->dev[slots[q0 + (int32_t)(p - start)]];

			cl->chain = failing ? ~x->chain[p] : x->chain[p];
			cl->pos = (int32_t)p;
			cl->group = (int32_t)g;
		}
	}
	if (failing || !b->row_sample[r])
		return;
	if (end < q->plen) {
		fail(x, "row %u samples inside its prompt (end %u of %u)", r, end, q->plen);
		return;
	}
	if (k) {
		uint32_t j, m = k;

		for (j = 0; j <= k; j++) {
			int32_t t = tok(x, q, br, start + j + 1);

			b->spec_tokens[q0 + (int32_t)j] = t;
			if (j < m && t != ids[q0 + (int32_t)j + 1])
				m = j;
		}
		if (x->f.spec_host_accepts)
			b->n_accepted[r] = (int32_t)below(&x->rng_fail, m + 1);
		return;
	}
	if (end - q->plen >= q->max_new) {
		fail(x, "row %u samples output %u of a request with %u", r, end - q->plen, q->max_new);
		return;
	}
	next[r] = tok(x, q, br, end);
}

/* CX_TRACE=1: every call's copies and rows on stderr (a replay's log). */
static void trace_call(const cx_run *x, const bkv_batch *b)
{
	const char *const kind[3] = {"so", "si", "cp"};
	const bkv_copy *v[3] = {b->swap_out, b->swap_in, b->copies};
	const uint32_t n[3] = {b->n_swap_out, b->n_swap_in, b->n_copies};
	uint32_t r, g, k;

	fprintf(stderr, "call %llu: %u rows\n", (unsigned long long)x->res->calls, b->n_rows);
	for (r = 0; r < b->n_encoder_free; r++)
		fprintf(stderr, "  encoder free %llu\n", (unsigned long long)b->encoder_free[r]);
	for (r = 0; r < b->n_encode; r++)
		fprintf(stderr, "  encode %llu (req %llu input %u)\n",
			(unsigned long long)b->encode[r].cache_id, (unsigned long long)b->encode[r].req,
			b->encode[r].input);
	for (k = 0; k < 3; k++)
		for (r = 0; r < n[k]; r++)
			fprintf(stderr, "  %s %d -> %d\n", kind[k], v[k][r].src, v[k][r].dst);
	for (r = 0; r < b->n_rows; r++) {
		const cx_req *q = (const cx_req *)b->row_user[r];

		fprintf(stderr, "  row %u: req %d [%d, +%d)", r, q ? (int)q->idx : -1,
			b->positions[b->qo_indptr[r]], b->qo_indptr[r + 1] - b->qo_indptr[r]);
		for (g = 0; g < b->n_groups; g++)
			if (b->groups[g].state_in)
				fprintf(stderr, " state %d -> %d", b->groups[g].state_in[r],
					b->groups[g].state_out[r]);
		fprintf(stderr, "\n");
	}
}

/* One compute call. ids: token_ids with placeholders replaced. dry: the
 * device skips it (an overlapped step after a failed one). */
/* The host drops the ids the call frees (whatever it returns). */
static void enc_frees(cx_run *x, const bkv_batch *b)
{
	uint32_t i, j;

	if (!x->f.enc_cache) {
		if (b->n_encode || b->encode || b->n_encoder_free || b->encoder_free)
			fail(x, "encoder lists in a call without encoder_cache");
		return;
	}
	for (i = 0; i < b->n_encoder_free; i++)
		for (j = 0; j < x->hc_n; j++)
			if (x->hc_id[j] == b->encoder_free[i]) {
				x->hc_id[j] = x->hc_id[x->hc_n - 1];
				x->hc_len[j] = x->hc_len[--x->hc_n];
				break;
			}
}

static cx_req *req_by_id(cx_run *x, uint64_t id)
{
	uint32_t i;

	for (i = 0; i < x->n_req; i++)
		if (__atomic_load_n(&x->req[i].id, __ATOMIC_ACQUIRE) == id)
			return &x->req[i];
	return NULL;
}

/* The host runs the call's encodes: each names an input of its request,
 * within the step's budget; its cache stays within encoder_cache. Then
 * every row's span positions read cached outputs. */
static void enc_run(cx_run *x, const bkv_batch *b)
{
	uint32_t i, j, k, r, sum = 0;

	for (i = 0; i < b->n_encode && !x->failed; i++) {
		const bkv_encode *w = &b->encode[i];
		cx_req *q = req_by_id(x, w->req);
		const bkv_encoder_input *u = q && w->input < q->n_in ? &q->in[w->input] : NULL;

		if (!u || u->cache_id != w->cache_id || u->token_len != w->len || w->user != q) {
			fail(x, "encode %u: not an input of request %llu", i,
			     (unsigned long long)w->req);
			return;
		}
		x->enc_cost += u->cost ? u->cost : u->token_len;
		for (j = 0; j < x->hc_n && x->hc_id[j] != w->cache_id; j++)
			;
		if (j == x->hc_n && x->hc_n < 256) {
			x->hc_id[x->hc_n] = w->cache_id;
			x->hc_len[x->hc_n++] = w->len;
		}
	}
	if (x->f.enc_budget && x->enc_cost > x->f.enc_budget)
		fail(x, "encoder work %llu in a step, budget %u", (unsigned long long)x->enc_cost,
		     x->f.enc_budget);
	for (j = 0; j < x->hc_n; j++)
		sum += x->hc_len[j];
	if (sum > x->f.enc_cache)
		fail(x, "the host caches %u encoder tokens, encoder_cache %u", sum, x->f.enc_cache);
	for (r = 0; r < b->n_rows && !x->failed; r++) {
		cx_req *q = row_req(x, b, r);
		uint32_t start = (uint32_t)b->positions[b->qo_indptr[r]];
		uint32_t end = start + (uint32_t)(b->qo_indptr[r + 1] - b->qo_indptr[r]);

		for (k = 0; q && k < q->n_in; k++) {
			const bkv_encoder_input *u = &q->in[k];

			if (u->token_start >= end || u->token_start + u->token_len <= start)
				continue;
			for (j = 0; j < x->hc_n && x->hc_id[j] != u->cache_id; j++)
				;
			if (j == x->hc_n)
				fail(x, "row %u reads input %u (id %llu) before it is encoded", r, k,
				     (unsigned long long)u->cache_id);
		}
	}
	if (b->n_encode)
		x->res->encodes += b->n_encode;
}

/* Each row's adapter is its request's; the call lists its rows' distinct
 * nonzero adapters, first row first, at most the cap. */
static void check_adapters(cx_run *x, const bkv_batch *b)
{
	uint32_t r, i, n = 0, seen[BKV_MAX_ADAPTERS];

	if (!x->f.max_adapters) {
		if (b->row_adapter || b->n_adapters || b->adapters)
			fail(x, "adapters in a call without max_adapters");
		return;
	}
	for (r = 0; r < b->n_rows && !x->failed; r++) {
		cx_req *q = row_req(x, b, r);
		uint32_t a = b->row_adapter[r];

		if (q && a != q->adapter)
			fail(x, "row %u: adapter %u, its request's is %u", r, a, q->adapter);
		for (i = 0; a && i < n && seen[i] != a; i++)
			;
		if (a && i == n) {
			if (n == x->f.max_adapters) {
				fail(x, "a call with more than %u adapters", n);
				return;
			}
			seen[n++] = a;
		}
	}
	if (b->n_adapters != n || (n && memcmp(b->adapters, seen, n * sizeof(uint32_t))))
		fail(x, "the call lists %u adapters, its rows have %u", b->n_adapters, n);
	x->res->adapter_calls += n > 0;
}

static int compute(cx_run *x, const bkv_batch *b, const int32_t *ids, int32_t *next, int dry)
{
	uint32_t r;
	int failing = 0;

	x->res->calls++;
	if (b->block_tokens != x->f.bt || b->n_rows == 0 || b->qo_indptr[0] != 0 ||
	    (uint32_t)b->qo_indptr[b->n_rows] != b->n_tokens) {
		fail(x, "bad batch heads: bt %u rows %u tokens %u", b->block_tokens, b->n_rows,
		     b->n_tokens);
		return -1;
	}
	enc_frees(x, b);
	if (b->layout == BKV_BATCH_PERSISTENT) {
		if (apply_deltas(x, b)) {
			fail(x, "out of memory");
			return -1;
		}
		for (r = 0; r < b->n_rows && !x->failed; r++) {
			uint32_t slot = b->row_slot[r];

			if (slot >= x->n_slots || b->row_table_len[slot] != x->mlen[slot] ||
			    memcmp(b->row_tables[slot], x->mirror + (size_t)slot * x->width,
				   x->mlen[slot] * sizeof(int32_t)))
				fail(x, "row %u slot %u: the mirror differs from the library's table", r,
				     slot);
		}
	}
	if (dry || x->failed)
		return -1;
	if (x->trace)
		trace_call(x, b);
	if (x->f.fail_permille && chance(&x->rng_fail, x->f.fail_permille)) {
		x->res->failed_calls++;
		if (chance(&x->rng_fail, 500))
			return -1; /* refused at the door */
		failing = 1;
	}
	copy_frames(x, b->swap_out, b->n_swap_out, x->dev, x->nframes, x->host, x->f.host_blocks,
		    "swap-out");
	copy_frames(x, b->swap_in, b->n_swap_in, x->host, x->f.host_blocks, x->dev, x->nframes,
		    "swap-in");
	copy_frames(x, b->copies, b->n_copies, x->dev, x->nframes, x->dev, x->nframes, "device");
	check_adapters(x, b);
	enc_run(x, b);
	for (r = 0; r < b->n_rows; r++)
		check_row(x, b, ids, r);
	for (r = 0; r < b->n_rows; r++)
		compute_row(x, b, ids, r, failing, next);
	return failing || x->failed ? -1 : 0;
}

static int cx_forward(void *host, const bkv_batch *b, int32_t *next)
{
	cx_run *x = host;

	if (b->kind != BKV_CALL_MIXED)
		fail(x, "forward got a kind-%d batch", b->kind);
	return compute(x, b, b->token_ids, next, 0);
}

static int cx_prefill(void *host, const bkv_batch *b, int32_t *next)
{
	cx_run *x = host;

	if (b->kind != BKV_CALL_PREFILL || b->n_decode_rows)
		fail(x, "prefill got kind %d with %u decode rows", b->kind, b->n_decode_rows);
	return compute(x, b, b->token_ids, next, 0);
}

static int cx_decode(void *host, const bkv_batch *b, int32_t *next)
{
	cx_run *x = host;

	if (b->kind != BKV_CALL_DECODE || b->n_decode_rows != b->n_rows)
		fail(x, "decode got kind %d with %u of %u decode rows", b->kind, b->n_decode_rows,
		     b->n_rows);
	return compute(x, b, b->token_ids, next, 0);
}

/* Does unit u appear among the state units step d reads or writes? */
static int dev_names_unit(const cx_dev *d, int32_t u)
{
	uint32_t i;

	for (i = 0; d->st && i < d->rows; i++)
		if (d->st->state_in[i] == u || d->st->state_out[i] == u)
			return 1;
	for (i = 0; d->st && d->st->state_out_spec && i < d->spec_n; i++)
		if (d->st->state_out_spec[i] == u)
			return 1;
	return 0;
}

/* An overlapped launch with a STATE group: no unit it writes is one the
 * step in flight reads or writes (double-buffered states: a rollback of
 * both steps needs the first one's input, a rollback of the later one the
 * first one's output), and the step in flight's arrays are still its own
 * (they alternate with the later step's). */
static void check_state_units(cx_run *x, const bkv_batch *b, const cx_dev *prev)
{
	const bkv_batch_group *G = &b->groups[x->state_group];
	const uint32_t nd = (uint32_t)b->qo_indptr[b->n_decode_rows];
	uint32_t r;

	if (!prev->st || G->state_out == prev->st->state_out || G->state_in == prev->st->state_in ||
	    (G->state_out_spec && G->state_out_spec == prev->st->state_out_spec)) {
		fail(x, "an overlapped launch's state arrays are the step in flight's");
		return;
	}
	for (r = 0; r < b->n_rows; r++)
		if (dev_names_unit(prev, G->state_out[r])) {
			fail(x, "row %u writes state unit %d, which the step in flight names", r,
			     G->state_out[r]);
			return;
		}
	for (r = 0; G->state_out_spec && r < nd; r++)
		if (dev_names_unit(prev, G->state_out_spec[r])) {
			fail(x, "token %u writes state unit %d, which the step in flight names", r,
			     G->state_out_spec[r]);
			return;
		}
}

static int cx_launch(void *host, const bkv_batch *b, int32_t *next)
{
	cx_run *x = host;
	cx_dev *prev = x->nq ? &x->q[x->nq - 1] : NULL;
	uint32_t i;
	int dry = 0, rc;

	for (i = 0; i < x->nq; i++) /* the device skips what follows a failure */
		dry |= x->q[i].failed;
	if (x->nq > (uint32_t)x->f.overlap) {
		fail(x, "launch with %u steps outstanding at depth %d", x->nq, x->f.overlap);
		return -1;
	}
	if (b->n_tokens > x->subst_cap) {
		free(x->subst);
		x->subst_cap = 2 * b->n_tokens;
		x->subst = malloc(x->subst_cap * sizeof(int32_t));
	}
	for (i = 0; i < b->n_tokens; i++) {
		int32_t t = b->token_ids[i];

		if (BKV_TOKEN_IS_PENDING(t)) {
			uint32_t row = BKV_TOKEN_PENDING_ROW(t), back = BKV_TOKEN_PENDING_BACK(t);
			const cx_dev *d = back <= x->nq ? &x->q[x->nq - back] : NULL;

			if (!d || row >= d->rows || i >= (uint32_t)b->qo_indptr[b->n_decode_rows]) {
				fail(x, "placeholder of row %u, %u launches back, %s", row, back,
				     !d ? "with fewer steps in flight"
				     : row >= d->rows ? "a step of fewer rows" : "in a prefill row");
				return -1;
			}
			t = dry ? tok(x, (cx_req *)b->row_user[0], 0, 0) : d->next[row];
		}
		x->subst[i] = t;
	}
	if (x->f.fail_permille && chance(&x->rng_fail, x->f.fail_permille / 2)) {
		x->res->failed_calls++;
		if (b->layout == BKV_BATCH_PERSISTENT)
			(void)apply_deltas(x, b);
		enc_frees(x, b);
		return -1; /* refused at launch */
	}
	for (i = 0; prev && x->state_group != UINT32_MAX && i < x->nq; i++)
		check_state_units(x, b, &x->q[i]);
	rc = compute(x, b, x->subst, next, dry);
	x->q[x->nq].next = next;
	x->q[x->nq].rows = b->n_rows;
	x->q[x->nq].st = x->state_group != UINT32_MAX ? &b->groups[x->state_group] : NULL;
	x->q[x->nq].spec_n = (uint32_t)b->qo_indptr[b->n_decode_rows];
	x->q[x->nq].failed = rc != 0;
	x->nq++;
	return 0;
}

static void cx_on_token(void *host, uint64_t id, uint32_t br, int32_t t, void *user)
{
	cx_run *x = host;
	cx_req *q = user;
	uint32_t i;

	if (!q || q->magic != CX_MAGIC) {
		fail(x, "on_token: request %llu without its user", (unsigned long long)id);
		return;
	}
	if (br >= q->n || q->finished || q->done[br]) {
		fail(x, "on_token: req %u branch %u after its end", q->idx, br);
		return;
	}
	i = q->n_out[br];
	if (i >= q->max_new || t != tok(x, q, br, q->plen + i)) {
		fail(x, "on_token: req %u branch %u output %u is %d, run alone it is %d", q->idx, br,
		     i, t, i < q->max_new ? tok(x, q, br, q->plen + i) : 0);
		return;
	}
	x->res->tokens++;
	x->out_tok++;
	x->out_tok_h = mix(x->out_tok_h ^ mix(id * 31 + br) ^ (uint64_t)(uint32_t)t);
	q->n_out[br] = i + 1;
	if (t == CX_STOP || i + 1 == q->max_new)
		q->done[br] = 1;
	if (x->f.token_abort_permille && chance(&x->rng_drive, x->f.token_abort_permille)) {
		__atomic_store_n(&q->abort_asked, 1, __ATOMIC_RELAXED);
		(void)bkv_abort(x->s, id);
	}
}

static void cx_on_finish(void *host, uint64_t id, bkv_finish_reason why, void *user)
{
	cx_run *x = host;
	cx_req *q = user;
	uint32_t br;
	int fails, any_fail = 0;

	if (!q || q->magic != CX_MAGIC) {
		fail(x, "on_finish: request %llu without its user", (unsigned long long)id);
		return;
	}
	x->out_fin++;
	x->out_fin_h = mix(x->out_fin_h ^ mix(id) ^ (uint64_t)why);
	if (q->finished++) {
		fail(x, "on_finish: req %u ended twice (%d, then %d)", q->idx, q->reason, why);
		return;
	}
	q->reason = (int)why;
	for (br = 0; br < q->n; br++) {
		uint32_t len = expected_len(x, q, br, &fails);

		if (fails && q->n_out[br] == len)
			any_fail = 1;
	}
	switch (why) {
	case BKV_FINISH_ABORT:
		if (!__atomic_load_n(&q->abort_asked, __ATOMIC_RELAXED))
			fail(x, "req %u aborted without bkv_abort", q->idx);
		break;
	case BKV_FINISH_ERROR:
		if (!any_fail) {
			if (x->unadmittable_ok)
				x->errors_unexplained++;
			else
				fail(x, "req %u ended in error at outputs %u; the host wrote no failure",
				     q->idx, q->n_out[0]);
		}
		break;
	case BKV_FINISH_LENGTH:
	case BKV_FINISH_STOP:
		for (br = 0; br < q->n; br++)
			if (!q->done[br])
				fail(x, "req %u ended (%d) with branch %u at %u of %u outputs", q->idx,
				     why, br, q->n_out[br], expected_len(x, q, br, &fails));
		if (q->n == 1 && q->done[0] &&
		    (why == BKV_FINISH_STOP) != (tok(x, q, 0, q->plen + q->n_out[0] - 1) == CX_STOP))
			fail(x, "req %u ended with reason %d after output %d", q->idx, why,
			     tok(x, q, 0, q->plen + q->n_out[0] - 1));
		break;
	default:
		fail(x, "req %u: finish reason %d", q->idx, why);
	}
}

static int cx_draft(void *host, uint64_t id, uint32_t br, const int32_t *ctx, uint32_t n_ctx,
		    int32_t *out, uint32_t k, void *user)
{
	cx_run *x = host;
	cx_req *q = user;
	uint32_t j;

	(void)id;
	if (!q || q->magic != CX_MAGIC || br >= q->n)
		return 0;
	for (j = 0; j < n_ctx; j++)
		if (ctx[j] != tok(x, q, br, j)) {
			fail(x, "draft: req %u branch %u context token %u is %d, history %d", q->idx, br,
			     j, ctx[j], tok(x, q, br, j));
			return 0;
		}
	for (j = 0; j < k; j++) {
		int32_t t = tok(x, q, br, n_ctx + j);

		if (t == BKV_TOKEN_FAIL || t == CX_STOP)
			break;
		if (mix(q->tag * 31 + br * 7919 + (n_ctx + j) * 104729) % 4 == 0)
			t += 1; /* a wrong draft */
		out[j] = t;
	}
	return (int)j;
}

static uint64_t cx_now(void *host)
{
	return ((cx_run *)host)->iter * 1000;
}

/* ---- the driver ------------------------------------------------------------ */

/* ---- the KV connector's store ---------------------------------------------
 * Cells by block hash (a state's frames too). A load copies the stored cells
 * into the blocks named, a save the blocks' cells into the store, both when
 * the transfer completes: inline, or between steps (so a save reads the
 * blocks after the step that wrote them, and any change meanwhile - a block
 * freed, reused, evicted - is caught by the reads that follow a load). Some
 * loaded blocks fail, some whole transfers, some lookups answer later or an
 * error; a full store fails saves. */

static cx_cell *st_find(cx_run *x, uint64_t h, int make)
{
	uint32_t i = (uint32_t)(h % CX_STORE_CAP), k;

	for (k = 0; k < CX_STORE_CAP; k++, i = (i + 1) % CX_STORE_CAP) {
		if (x->st_hash[i] == h)
			return &x->st_cell[(size_t)i * x->st_cells];
		if (!x->st_hash[i]) {
			if (!make || x->st_n >= CX_STORE_CAP * 3 / 4)
				return NULL;
			x->st_hash[i] = h;
			x->st_n++;
			return &x->st_cell[(size_t)i * x->st_cells];
		}
	}
	return NULL;
}

static void st_run(cx_run *x, const cx_xfer *q)
{
	uint32_t failed[512], nf = 0, i;
	const uint32_t bt = x->f.bt;
	int status = BKV_OK, rc;

	if (chance(&x->rng_conn, 20))
		status = -1; /* the whole transfer (a peer gone) */
	if (x->trace) {
		fprintf(stderr, "%s %llu:%s", q->load ? "load" : "save", (unsigned long long)q->id,
			status ? " (fails)" : "");
		for (i = 0; i < q->n; i++)
			fprintf(stderr, " [%u g%u b%d]", q->b[i].index, q->b[i].group, q->b[i].block);
		fprintf(stderr, "\n");
	}
	for (i = 0; i < q->n && status == BKV_OK; i++) {
		const bkv_kv_xfer_block *b = &q->b[i];
		cx_cell *c;

		if (b->block < 0 || (uint64_t)b->block + b->frames > x->nframes || b->frames == 0 ||
		    (size_t)b->frames * bt > x->st_cells) {
			fail(x, "connector: entry %u names frames %d+%u of %u", i, b->block, b->frames,
			     x->nframes);
			return;
		}
		c = st_find(x, b->hash, !q->load);
		if (!c || (q->load && x->f.conn_fail && chance(&x->rng_conn, x->f.conn_fail))) {
			if (nf < 512)
				failed[nf++] = i;
			continue;
		}
		if (q->load) {
			memcpy(&x->dev[(size_t)b->block * bt], c, (size_t)b->frames * bt * sizeof(cx_cell));
			continue;
		}
		if (b->frames == 1) { /* a block the save still holds: as written */
			const cx_cell *d = &x->dev[(size_t)b->block * bt];
			uint32_t j;

			for (j = 0; j < bt; j++)
				if (d[j].pos != (int32_t)(b->index * bt + j) ||
				    d[j].group != (int32_t)b->group) {
					fail(x, "connector: save of block %d (index %u, group %u): cell %u "
						"holds position %d of group %d", b->block, b->index, b->group,
					     j, d[j].pos, d[j].group);
					return;
				}
		}
		memcpy(c, &x->dev[(size_t)b->block * bt], (size_t)b->frames * bt * sizeof(cx_cell));
	}
	rc = bkv_kv_xfer_done(x->s, q->id, status, failed, status == BKV_OK ? nf : 0);
	if (rc != BKV_OK)
		fail(x, "bkv_kv_xfer_done: %d", rc);
}

static int cx_lookup(void *user, uint64_t req, const uint64_t *h, uint32_t n)
{
	cx_run *x = user;
	uint32_t i;

	(void)req;
	if (x->f.conn_later && chance(&x->rng_conn, x->f.conn_later))
		return BKV_CONNECTOR_LATER;
	if (chance(&x->rng_conn, 20))
		return -1; /* counted as a lookup error, taken as 0 */
	for (i = 0; i < n && st_find(x, h[i], 0); i++)
		;
	return (int)i;
}

static int cx_contains(void *user, uint64_t h)
{
	return st_find(user, h, 0) != NULL;
}

static int cx_xfer_start(cx_run *x, uint64_t id, const bkv_kv_xfer_block *b, uint32_t n, int load)
{
	cx_xfer q = {id, b, n, load};

	if (chance(&x->rng_conn, 10))
		return -1; /* could not start */
	if (!x->f.conn_async) {
		st_run(x, &q);
		return 0;
	}
	if (x->nxq == CX_XQ_CAP) { /* full: the oldest completes now */
		cx_xfer old = x->xq[0];

		memmove(x->xq, x->xq + 1, (CX_XQ_CAP - 1) * sizeof(cx_xfer));
		x->nxq--;
		st_run(x, &old);
	}
	x->xq[x->nxq++] = q;
	return 0;
}

static int cx_load(void *user, uint64_t id, uint64_t req, const bkv_kv_xfer_block *b, uint32_t n)
{
	(void)req;
	return cx_xfer_start(user, id, b, n, 1);
}

static int cx_save(void *user, uint64_t id, const bkv_kv_xfer_block *b, uint32_t n)
{
	return cx_xfer_start(user, id, b, n, 0);
}

/* Complete each queued transfer with chance permille, any order. */
static void st_flush(cx_run *x, uint32_t permille)
{
	uint32_t i = 0;

	while (i < x->nxq && !x->failed) {
		if (permille < 1000 && !chance(&x->rng_conn, permille)) {
			i++;
			continue;
		}
		{
			cx_xfer q = x->xq[i];

			x->xq[i] = x->xq[--x->nxq];
			st_run(x, &q);
		}
	}
}

static void check_all(cx_run *x)
{
	int rc;

	if (x->failed)
		return;
	rc = bkv_sched_check(x->s);
	if (rc)
		fail(x, "bkv_sched_check: %d", rc);
	else if (!x->nt && (rc = bkv_pool_check(x->pool)))
		fail(x, "bkv_pool_check: %d", rc);
}

static void *abort_thread(void *arg)
{
	cx_run *x = arg;
	uint32_t i = 0;
	struct timespec ts = {0, 20000};

	while (i < x->thr_n && !__atomic_load_n(&x->thr_stop, __ATOMIC_ACQUIRE)) {
		cx_req *q = &x->req[x->thr_list[i]];
		uint64_t id = __atomic_load_n(&q->id, __ATOMIC_ACQUIRE);

		if (!id) {
			nanosleep(&ts, NULL);
			continue;
		}
		nanosleep(&ts, NULL);
		__atomic_store_n(&q->abort_asked, 1, __ATOMIC_RELAXED);
		(void)bkv_abort(x->s, id);
		i++;
	}
	return NULL;
}

static void make_requests(cx_run *x, uint64_t *s)
{
	const cx_feat *f = &x->f;
	uint32_t i, j;

	for (i = 0; i < f->n_prefixes; i++) {
		x->prefix_len[i] = 1 + below(s, f->max_prompt < 64 ? f->max_prompt : 64);
		for (j = 0; j < x->prefix_len[i]; j++)
			x->prefixes[i][j] = 1000 + (int32_t)below(s, f->vocab);
	}
	x->n_req = f->n_reqs;
	for (i = 0; i < x->n_req; i++) {
		cx_req *q = &x->req[i];
		uint32_t pre = 0;

		memset(q, 0, sizeof(*q));
		q->magic = CX_MAGIC;
		q->idx = i;
		q->tag = mix(x->seed * 1000003 + i + 1);
		if (f->n_prefixes && chance(s, 700)) {
			uint32_t w = below(s, f->n_prefixes);

			pre = x->prefix_len[w];
			memcpy(q->prompt, x->prefixes[w], pre * sizeof(int32_t));
		}
		q->plen = pre + (pre ? below(s, 12) : 1 + below(s, f->max_prompt));
		if (q->plen > 90)
			q->plen = 90;
		if (q->plen == 0)
			q->plen = 1;
		for (j = pre; j < q->plen; j++)
			q->prompt[j] = 1000 + (int32_t)below(s, f->vocab);
		q->max_new = 1 + below(s, f->max_new);
		q->n = 1 + below(s, f->max_n);
		q->cache_key = f->keys > 1 ? below(s, f->keys) : 0;
		/* (drawn off the scenario's stream: seeds replay as before) */
		q->adapter = f->max_adapters
				     ? (uint32_t)(mix(x->seed ^ (0xada0000ull + i)) % (f->max_adapters + 2))
				     : 0;
		/* the tester's own mix: KV of different adapters must differ */
		q->key = q->cache_key ^ ((uint64_t)q->adapter << 40);
		draw_inputs(x, q, i);
		q->priority = chance(s, 200) ? (int32_t)below(s, 3) : 0;
		q->submit_at = chance(s, 500) ? 0 : below(s, 40);
		if (f->retention && q->plen >= 2 && chance(s, 600)) {
			uint32_t a = below(s, q->plen - 1);

			q->ret[0].token_start = a;
			q->ret[0].token_end = a + 1 + below(s, q->plen - a);
			q->ret[0].priority = below(s, BKV_RETENTION_PRIORITY_MAX + 1);
			q->ret[0].duration_us = chance(s, 500) ? 0 : 1000 * (1 + below(s, 50));
			q->n_ret = 1;
		}
	}
	if (f->abort_thread && !x->opt.no_threads) {
		x->thr_n = 1 + below(s, 4);
		for (i = 0; i < x->thr_n; i++)
			x->thr_list[i] = below(s, x->n_req);
	}
}

/* Encoder inputs of request i (up to 3, ids 1..5 so that they recur): the
 * prompt gets their ids, the submitted copy a placeholder 7. */
static void draw_inputs(cx_run *x, cx_req *q, uint32_t i)
{
	uint64_t h = mix(x->seed ^ (0xe1c0000ull + i));
	uint32_t k, p = 0, j;

	memcpy(q->sub, q->prompt, q->plen * sizeof(int32_t));
	if (!x->f.enc_cache)
		return;
	for (k = 0; k < (uint32_t)(h % 4); k++) {
		uint64_t g = mix(h + k);
		bkv_encoder_input *u = &q->in[q->n_in];

		p += (uint32_t)(g % 5);
		if (p + 1 > q->plen)
			break;
		memset(u, 0, sizeof(*u));
		u->cache_id = 1 + (g >> 8) % 5;
		u->token_start = p;
		u->token_len = 1 + (uint32_t)(u->cache_id * 5 % 6); /* the id's */
		if (u->token_len > q->plen - p)
			break;
		u->cost = (g >> 24) & 1 ? 0 : 1 + (uint32_t)((g >> 28) % 6);
		for (j = 0; j < u->token_len; j++) {
			q->prompt[p + j] = bkv_encoder_token(u->cache_id, j);
			q->sub[p + j] = 7;
		}
		p += u->token_len;
		q->n_in++;
	}
}

static void submit_due(cx_run *x)
{
	uint32_t i;

	for (i = 0; i < x->n_req; i++) {
		cx_req *q = &x->req[i];
		bkv_request r;
		uint64_t id = 0;
		int rc;

		if (q->submitted || q->refused || q->submit_at > x->iter)
			continue;
		bkv_request_init(&r);
		r.prompt = q->sub;
		r.prompt_len = q->plen;
		r.inputs = q->n_in ? q->in : NULL;
		r.n_inputs = q->n_in;
		r.max_new_tokens = q->max_new;
		r.stop_tokens = (const int32_t[]){CX_STOP};
		r.n_stop = 1;
		r.priority = q->priority;
		r.cache_key = q->cache_key;
		r.adapter = q->adapter;
		r.n = q->n;
		r.user = q;
		r.predicted_output = chance(&x->rng_drive, 200) ? q->max_new : 0;
		r.retention = q->n_ret ? q->ret : NULL;
		r.n_retention = q->n_ret;
		rc = bkv_submit(x->s, &r, &id);
		if (rc == BKV_E2BIG) {
			q->refused = 1;
			continue;
		}
		if (rc != BKV_OK) {
			fail(x, "bkv_submit of req %u (prompt %u, new %u, n %u): %d", i, q->plen,
			     q->max_new, q->n, rc);
			return;
		}
		__atomic_store_n(&q->id, id, __ATOMIC_RELEASE);
		q->submitted = 1;
		x->res->requests++;
	}
}

/* After a bkv_step or bkv_step_complete that ran (rc not an entry
 * refusal): the output arrays hold exactly what the callbacks saw since
 * the previous one, in the same order. */
static void check_outputs(cx_run *x, int rc)
{
	bkv_step_outputs o = {.size = sizeof(o)};
	uint64_t th = 0, fh = 0;
	uint32_t i;

	if (!x->outs || rc == BKV_ESTATE || rc == BKV_EINVAL || x->failed)
		return;
	if (bkv_sched_outputs_get(x->s, &o) != BKV_OK) {
		fail(x, "bkv_sched_outputs_get refused");
		return;
	}
	for (i = 0; i < o.n_tokens; i++)
		th = mix(th ^ mix(o.token_req[i] * 31 + o.token_branch[i]) ^
			 (uint64_t)(uint32_t)o.token_ids[i]);
	for (i = 0; i < o.n_finished; i++)
		fh = mix(fh ^ mix(o.finished_req[i]) ^ (uint64_t)o.finished_reason[i]);
	if (o.n_tokens != x->out_tok || th != x->out_tok_h || o.n_finished != x->out_fin ||
	    fh != x->out_fin_h)
		fail(x, "step outputs: %u tokens, %u ends; the callbacks saw %u, %u%s", o.n_tokens,
		     o.n_finished, x->out_tok, x->out_fin,
		     o.n_tokens == x->out_tok && o.n_finished == x->out_fin ? " (other values)" : "");
	x->out_tok = x->out_fin = 0;
	x->out_tok_h = x->out_fin_h = 0;
}

static void complete_oldest(cx_run *x)
{
	int status, rc;

	if (!x->nt)
		return;
	if (!x->nq) {
		fail(x, "a ticket without a launched step on the device");
		return;
	}
	status = x->q[0].failed ? -1 : 0;
	if (!status && x->f.fail_permille && chance(&x->rng_fail, x->f.fail_permille / 3)) {
		status = -1; /* the device reports a failure it found late */
		x->res->failed_calls++;
	}
	memmove(&x->q[0], &x->q[1], sizeof(x->q[0]) * (x->nq - 1));
	x->nq--;
	/* a step after a failed one was skipped by the device */
	if (status && x->nq)
		x->q[0].failed = 1;
	rc = bkv_step_complete(x->s, x->tickets[0], status, NULL);
	check_outputs(x, rc);
	memmove(&x->tickets[0], &x->tickets[1], sizeof(x->tickets[0]) * (x->nt - 1));
	x->nt--;
	if (rc != BKV_OK && rc != BKV_EHOST)
		fail(x, "bkv_step_complete: %d", rc);
	if (status && rc != BKV_EHOST)
		fail(x, "bkv_step_complete of a failed step: %d", rc);
	check_all(x);
	/* a failed step: every outstanding one must complete before a launch */
	if (rc == BKV_EHOST && x->nt && !x->failed)
		complete_oldest(x);
}

static void complete_all(cx_run *x)
{
	while (x->nt && !x->failed)
		complete_oldest(x);
}

/* Misuse of a pin id as a sequence id: every sequence call must refuse it. */
static void misuse_pin(cx_run *x, uint32_t pin)
{
	uint32_t child = 0, h = 0;
	int32_t t = 1000;
	int rc;

	const char *what[] = {"close", "drop", "append", "fork", "truncate"};
	uint32_t which = below(&x->rng_drive, 5);

	switch (which) {
	case 0:
		rc = bkv_seq_close(x->pool, pin);
		break;
	case 1:
		rc = bkv_seq_drop(x->pool, pin);
		break;
	case 2:
		rc = bkv_seq_append(x->pool, pin, &t, 1, &h);
		break;
	case 3:
		rc = bkv_seq_fork(x->pool, pin, &child);
		break;
	default:
		rc = bkv_seq_truncate(x->pool, pin, 0);
		break;
	}
	if (rc == BKV_OK)
		fail(x, "bkv_seq_%s took pin id %u as a sequence", what[which], pin);
	else if ((rc = bkv_pool_check(x->pool)))
		fail(x, "bkv_pool_check after bkv_seq_%s(pin id %u): %d", what[which], pin, rc);
}

static void drive_sync(cx_run *x);

/* The device KV given back and taken again (bkv_sched_kv_release): with
 * swap, the host makes the pending swap-out copies first; then the device
 * memory is gone (every cell poisoned), a released step computes nothing,
 * and after the resume every request must still read only what it wrote. */
static void release_kv(cx_run *x)
{
	const bkv_kv_release_mode mode = (bkv_kv_release_mode)below(&x->rng_drive, 3);
	const bkv_copy *v;
	uint64_t calls = x->res->calls;
	uint32_t n, i;
	int rc = bkv_sched_kv_release(x->s, mode);

	if (rc == BKV_ESTATE && mode == BKV_RELEASE_REFUSE)
		return; /* requests are running */
	if (rc == BKV_ESTATE && x->f.connector)
		return; /* connector transfers name device blocks */
	if (rc != BKV_OK) {
		fail(x, "bkv_sched_kv_release(%d): %d (%s)", mode, rc, bkv_last_error());
		return;
	}
	n = bkv_pool_pending_copies(x->pool, BKV_COPY_SWAP_OUT, &v);
	copy_frames(x, v, n, x->dev, x->nframes, x->host, x->f.host_blocks, "swap-out");
	bkv_pool_clear_copies(x->pool, BKV_COPY_SWAP_OUT);
	for (i = 0; i < x->nframes * x->f.bt; i++) {
		x->dev[i].chain = 0x9015011ed;
		x->dev[i].pos = -11;
		x->dev[i].group = -11;
	}
	check_all(x);
	if (chance(&x->rng_drive, 500)) {
		drive_sync(x); /* drains only */
		if (x->res->calls != calls)
			fail(x, "a step computed while the KV was released");
	}
	if (bkv_sched_kv_resume(x->s) != BKV_OK)
		fail(x, "bkv_sched_kv_resume refused");
	x->res->releases++;
	check_all(x);
}

static void between_steps(cx_run *x)
{
	const cx_feat *f = &x->f;
	uint32_t i;

	submit_due(x);
	if (x->nxq)
		st_flush(x, 300);
	if (f->abort_permille && chance(&x->rng_drive, f->abort_permille)) {
		cx_req *q = &x->req[below(&x->rng_drive, x->n_req)];

		if (q->submitted) {
			__atomic_store_n(&q->abort_asked, 1, __ATOMIC_RELAXED);
			(void)bkv_abort(x->s, q->id);
		}
	}
	if (f->events) {
		while (bkv_pool_drain_events(x->pool, x->ev, 64) == 64)
			;
	}
	if (x->nt)
		return; /* pool calls only with no step outstanding */
	if (f->reset_cache && !(x->opt.skip & CX_SKIP_RESET) &&
	    chance(&x->rng_drive, f->connector ? 250 : 60)) {
		if (bkv_pool_reset_cache(x->pool) != BKV_OK)
			fail(x, "bkv_pool_reset_cache failed");
		check_all(x);
	}
	if (f->pins && chance(&x->rng_drive, 250)) {
		if (x->n_pins && chance(&x->rng_drive, 400)) {
			i = below(&x->rng_drive, x->n_pins);
			if (bkv_pool_unpin(x->pool, x->pins[i]) != BKV_OK)
				fail(x, "bkv_pool_unpin(%u) failed", x->pins[i]);
			x->pins[i] = x->pins[--x->n_pins];
		} else if (x->n_pins < CX_MAX_PINS && f->n_prefixes) {
			uint32_t w = below(&x->rng_drive, f->n_prefixes), pin = 0, pinned = 0;
			int rc = bkv_pool_pin_prefix(x->pool, f->keys > 1 ? below(&x->rng_drive, 2) : 0,
						     x->prefixes[w], x->prefix_len[w], &pin, &pinned);

			if (rc == BKV_OK)
				x->pins[x->n_pins++] = pin;
			else if (rc != BKV_ENOENT && rc != BKV_ENOSPC && rc != BKV_EAGAIN &&
				 !(rc == BKV_ESTATE && x->n_groups))
				fail(x, "bkv_pool_pin_prefix: %d", rc);
		}
		if (x->n_pins && !(x->opt.skip & CX_SKIP_PIN_MISUSE) && chance(&x->rng_drive, 200))
			misuse_pin(x, x->pins[below(&x->rng_drive, x->n_pins)]);
		check_all(x);
	}
	if (!x->n_pins && chance(&x->rng_drive, 8))
		release_kv(x);
}

static void drive_sync(cx_run *x)
{
	bkv_step_info info;
	int rc;

	x->enc_cost = 0;
	rc = bkv_step(x->s, &info);

	check_outputs(x, rc);
	if (rc != BKV_OK && rc != BKV_EHOST)
		fail(x, "bkv_step: %d", rc);
	check_all(x);
}

static void drive_overlap(cx_run *x)
{
	uint64_t t = 0;
	int rc;

	if (!x->nt && chance(&x->rng_drive, 120)) {
		drive_sync(x); /* bkv_step between launches */
		return;
	}
	x->enc_cost = 0;
	rc = bkv_step_launch(x->s, &t, NULL);
	if (rc == BKV_EAGAIN) {
		if (!x->nt)
			fail(x, "bkv_step_launch: EAGAIN with nothing outstanding");
		complete_all(x);
		return;
	}
	if (rc == BKV_EHOST) {
		if (t)
			fail(x, "a failed launch gave ticket %llu", (unsigned long long)t);
		check_all(x);
		complete_all(x);
		return;
	}
	if (rc != BKV_OK) {
		fail(x, "bkv_step_launch: %d (%u outstanding)", rc, x->nt);
		return;
	}
	if (t) {
		if (x->nq != x->nt + 1) {
			fail(x, "launch ticket %llu without one launch callback",
			     (unsigned long long)t);
			return;
		}
		x->tickets[x->nt++] = t;
	}
	check_all(x);
	/* the drain rules: N in flight, or ticket 0 with some in flight */
	if (x->nt == (uint32_t)x->f.overlap + 1 || (t == 0 && x->nt) ||
	    (x->nt && chance(&x->rng_drive, 150)))
		complete_oldest(x);
}

static int all_submitted(const cx_run *x)
{
	uint32_t i;

	for (i = 0; i < x->n_req; i++)
		if (!x->req[i].submitted && !x->req[i].refused)
			return 0;
	return 1;
}

/* After the run: every request ended once with what it gets run alone. */
static void check_outcomes(cx_run *x)
{
	uint32_t i, br;
	int fails;
	bkv_sched_stats st;

	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(x->s, &st);
	x->res->preemptions = st.preemptions;
	x->res->spec_accepted = st.spec_accepted;
	x->res->hit_tokens = st.hit_tokens;
	x->res->kv_loaded = st.kv_load_tokens;
	x->res->kv_loaded_state = x->state_group != UINT32_MAX ? st.kv_load_tokens : 0;
	x->res->kv_saved = st.kv_saved;
	x->res->overlap_steps = st.overlap_steps;
	if (x->errors_unexplained > st.unadmittable)
		fail(x, "%u requests ended in error unexplained, %llu unadmittable",
		     x->errors_unexplained, (unsigned long long)st.unadmittable);
	for (i = 0; i < x->n_req && !x->failed; i++) {
		cx_req *q = &x->req[i];

		if (!q->submitted)
			continue;
		if (q->finished != 1) {
			fail(x, "req %u (n %u, prompt %u, new %u) ended %u times", i, q->n, q->plen,
			     q->max_new, q->finished);
			return;
		}
		for (br = 0; br < q->n; br++) {
			uint32_t len = expected_len(x, q, br, &fails);

			if (q->reason == BKV_FINISH_ABORT || q->reason == BKV_FINISH_ERROR) {
				if (q->n_out[br] > len)
					fail(x, "req %u branch %u delivered %u of %u", i, br,
					     q->n_out[br], len);
			} else if (q->n_out[br] != len) {
				fail(x, "req %u branch %u delivered %u outputs, run alone %u (reason %d)",
				     i, br, q->n_out[br], len, q->reason);
			}
		}
	}
}

/* A second scheduler on the pool the first one left: synchronous steps,
 * the first two requests submitted again as fresh records, run to the end
 * with every check. */
static void rerun_on_pool(cx_run *x)
{
	bkv_sched_config sc;
	bkv_host_ops ops;
	uint32_t i;
	int rc;

	bkv_sched_config_init(&sc);
	sc.max_running = x->f.max_running;
	sc.batch_layout = (bkv_batch_layout)x->f.layout;
	sc.max_wait_us = 1;
	sc.max_adapters = x->f.max_adapters;
	sc.encoder_cache = x->f.enc_cache;
	sc.encoder_budget = x->f.enc_budget;
	memset(&ops, 0, sizeof(ops));
	ops.forward = cx_forward;
	ops.on_token = cx_on_token;
	ops.on_finish = cx_on_finish;
	ops.now_us = cx_now;
	rc = bkv_sched_create(&sc, x->pool, &ops, x, NULL, &x->s);
	if (rc) {
		fail(x, "a second scheduler on the abandoned pool: bkv_sched_create %d", rc);
		x->s = NULL;
		return;
	}
	if (x->outs && bkv_sched_outputs_enable(x->s, 1) != BKV_OK) {
		fail(x, "bkv_sched_outputs_enable refused");
		return;
	}
	x->out_tok = x->out_fin = 0; /* the abandoned scheduler's ends */
	x->out_tok_h = x->out_fin_h = 0;
	x->n_req = x->n_req < 2 ? x->n_req : 2;
	x->f.fail_permille = 0;
	x->f.token_abort_permille = 0;
	x->nq = x->nt = 0;
	x->errors_unexplained = 0;
	for (i = 0; i < x->n_req; i++) {
		cx_req *q = &x->req[i];

		q->tag ^= 0x2d2d;
		q->submitted = q->refused = q->abort_asked = 0;
		q->id = 0;
		q->finished = 0;
		q->submit_at = 0;
		q->n_ret = 0;
		memset(q->n_out, 0, sizeof(q->n_out));
		memset(q->done, 0, sizeof(q->done));
	}
	submit_due(x);
	for (i = 0; i < 2000 && !x->failed && bkv_sched_pending(x->s); i++)
		drive_sync(x);
	if (!x->failed && bkv_sched_pending(x->s))
		fail(x, "the second scheduler did not finish");
	if (!x->failed)
		check_outcomes(x);
	if (!x->failed) {
		bkv_sched_destroy(x->s);
		x->s = NULL;
		if ((rc = bkv_pool_check(x->pool)))
			fail(x, "bkv_pool_check after the second scheduler: %d", rc);
	}
}

/* Scheduler gone with steps outstanding or requests running: the pool must
 * be whole and usable. */
static void check_abandoned_pool(cx_run *x)
{
	bkv_pool_stats ps;
	uint32_t seq;
	int32_t t[3] = {1001, 1002, 1003};
	int rc = bkv_pool_check(x->pool);

	if (rc) {
		fail(x, "bkv_pool_check after destroying the scheduler: %d", rc);
		return;
	}
	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(x->pool, &ps);
	if (ps.nr_seqs != x->n_pins)
		fail(x, "%u sequences open after destroying the scheduler (%u pins)", ps.nr_seqs,
		     x->n_pins);
	else if (x->n_pins >= x->f.max_seqs) /* the pins hold every slot */
		(void)0;
	else if ((rc = bkv_seq_open(x->pool, &seq)) != BKV_OK)
		fail(x, "bkv_seq_open after destroying the scheduler: %d", rc);
	else if ((rc = bkv_seq_append(x->pool, seq, t, 3, NULL)) != BKV_OK &&
		 rc != BKV_ENOSPC)
		fail(x, "bkv_seq_append after destroying the scheduler: %d", rc);
	else if ((rc = bkv_seq_drop(x->pool, seq)) != BKV_OK) /* dropped: its KV was
								  never computed, so
								  it must not be cached */
		fail(x, "bkv_seq_drop: %d", rc);
	else if ((rc = bkv_pool_check(x->pool)))
		fail(x, "bkv_pool_check after reuse: %d", rc);
	if (!x->failed)
		rerun_on_pool(x);
}

/* A tiny pool: room for the largest request drawn and little more, so
 * that requests preempt one another; and few sequence slots, so that pins
 * and forks compete for them. */
static void size_tiny(cx_run *x, uint64_t *s)
{
	cx_feat *f = &x->f;
	uint32_t i, need = 4, seqs = 1;

	for (i = 0; i < x->n_req; i++) {
		const cx_req *q = &x->req[i];
		uint32_t blocks = (q->plen + q->max_new + f->spec_k) / f->bt + 2;

		if (blocks * q->n > need)
			need = blocks * q->n;
		if (q->n > seqs)
			seqs = q->n;
	}
	f->device_blocks = need * (f->gmix ? 2 : 1) + below(s, 3);
	if (chance(s, 500))
		f->max_seqs = seqs + below(s, 3) + (f->pins ? below(s, 3) : 0);
	if (f->max_running > f->max_seqs)
		f->max_running = f->max_seqs;
}

/* Create the pool and scheduler; a known refusal drops one feature and
 * tries again. Returns 0, or -1 (failed). */
static int create(cx_run *x)
{
	cx_feat *f = &x->f;
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	int rc, tries;

	for (tries = 0; tries < 6; tries++) {
		uint32_t g = 0;

		x->n_groups = 0;
		x->state_group = UINT32_MAX;
		if (f->gmix) {
			uint64_t bytes = 64;

			x->groups[g++] = (bkv_kv_group){BKV_GROUP_FULL, 2, 0, 0, bytes};
			if (f->gmix == GM_WINDOW || f->gmix == GM_WINDOW_STATE)
				x->groups[g++] = (bkv_kv_group){BKV_GROUP_WINDOW, 2, f->span, 0, bytes};
			if (f->gmix == GM_CHUNKED)
				x->groups[g++] = (bkv_kv_group){BKV_GROUP_CHUNKED, 1, f->span, 0, bytes};
			if (f->gmix == GM_STATE || f->gmix == GM_WINDOW_STATE) {
				x->state_group = g;
				x->groups[g++] = (bkv_kv_group){BKV_GROUP_STATE, 1, f->ckpt, 0,
								 bytes * f->bt * 3};
			}
			x->n_groups = g;
		}
		bkv_pool_config_init(&pc);
		pc.block_tokens = f->bt;
		pc.device_blocks = f->device_blocks;
		pc.host_blocks = f->host_blocks;
		pc.max_seqs = f->max_seqs;
		pc.prefix_cache = f->prefix_cache;
		pc.hash_seed = x->seed;
		pc.event_capacity = f->events ? 32 : 0;
		pc.pin_permille = f->pins ? 300 : 0;
		pc.host_cache = f->host_cache;
		pc.n_groups = x->n_groups;
		pc.groups = x->n_groups ? x->groups : NULL;
		pc.state_units = x->state_group != UINT32_MAX && !f->state_share ? 2 * f->max_seqs : 0;
		pc.state_share = f->state_share;
		if (x->state_group != UINT32_MAX)
			/* the state arena (or the shared frames' units) is carved
			 * from device_blocks: add room for a unit per sequence */
			pc.device_blocks += 2 * f->max_seqs *
					    bkv_kv_state_frames(x->groups, x->n_groups, f->bt);
		rc = bkv_pool_create(&pc, NULL, &x->pool);
		if (rc != BKV_OK) {
			fail(x, "bkv_pool_create: %d", rc);
			return -1;
		}
		x->state_frames = x->state_group != UINT32_MAX
					  ? bkv_kv_state_frames(x->groups, x->n_groups, f->bt)
					  : 0;
		bkv_sched_config_init(&sc);
		sc.policy = f->static_policy ? BKV_POLICY_STATIC : BKV_POLICY_CONTINUOUS;
		sc.max_running = f->max_running;
		sc.chunked_prefill = f->chunked;
		sc.token_budget = f->chunked ? f->token_budget : 0;
		sc.preempt = f->host_blocks ? (bkv_preempt_mode)f->preempt : BKV_PREEMPT_RECOMPUTE;
		sc.kv_bytes_per_token = 256;
		sc.batch_layout = (bkv_batch_layout)f->layout;
		sc.spec_max_k = f->spec_k;
		sc.spec_k_mode = f->spec_fixed ? BKV_SPEC_K_FIXED : BKV_SPEC_K_AUTO;
		sc.spec_drafts = f->spec_host ? BKV_SPEC_DRAFT_HOST : BKV_SPEC_DRAFT_NGRAM;
		sc.overlap = f->overlap;
		sc.evict = f->evict_value ? BKV_EVICT_VALUE
					  : f->evict_seg ? BKV_EVICT_SEGMENTED
							 : BKV_EVICT_LRU;
		sc.victim = f->victim_cost ? BKV_VICTIM_COST : BKV_VICTIM_RECENT;
		sc.admit_reserve = f->reserve_output ? BKV_RESERVE_OUTPUT : BKV_RESERVE_PROMPT;
		sc.retention = f->retention;
		sc.max_adapters = f->max_adapters;
		sc.adapter_wait_us = 1000 * (1 + x->seed % 20);
		sc.encoder_cache = f->enc_cache;
		sc.encoder_budget = f->enc_budget;
		sc.max_wait_us = 1;
		if (f->connector && f->prefix_cache) {
			memset(&x->conn, 0, sizeof(x->conn));
			x->conn.lookup = cx_lookup;
			x->conn.load = cx_load;
			x->conn.save = cx_save;
			x->conn.contains = x->seed & 8 ? cx_contains : NULL;
			x->conn.user = x;
			x->conn.save_blocks = 1 + (uint32_t)(x->seed % 7);
			x->conn.max_saves = 1 + (uint32_t)(x->seed % 5);
			sc.connector = &x->conn;
		}
		memset(&ops, 0, sizeof(ops));
		if (f->split) {
			ops.prefill = cx_prefill;
			ops.decode = cx_decode;
		} else {
			ops.forward = cx_forward;
		}
		if (f->overlap)
			ops.launch = cx_launch;
		ops.on_token = cx_on_token;
		ops.on_finish = cx_on_finish;
		ops.now_us = cx_now;
		ops.draft = cx_draft;
		rc = bkv_sched_create(&sc, x->pool, &ops, x, NULL, &x->s);
		if (rc == BKV_EINVAL) {
			int which = -1;

			if (f->overlap && x->state_group != UINT32_MAX)
				which = CX_REFUSE_OVERLAP_STATE;
			if (which >= 0) {
				x->res->refused[which]++;
				bkv_pool_destroy(x->pool);
				x->pool = NULL;
				if (x->opt.strict) {
					fail(x, "refused at scheduler create: %s", cx_refuse_names[which]);
					return -1;
				}
				if ((x->seed >> 1) & 1)
					f->overlap = 0;
				else /* overlap+state: the attention groups stay */
					f->gmix = f->gmix == GM_WINDOW_STATE ? GM_WINDOW : GM_NONE;
				continue;
			}
		}
		if (rc != BKV_OK) {
			fail(x, "bkv_sched_create: %d", rc);
			return -1;
		}
		/* most seeds read the step outputs as arrays too */
		x->outs = (x->seed % 4) != 0;
		if (x->outs && bkv_sched_outputs_enable(x->s, 1) != BKV_OK) {
			fail(x, "bkv_sched_outputs_enable refused");
			return -1;
		}
		break;
	}
	if (!x->s) {
		fail(x, "create refused too often");
		return -1;
	}
	/* pins (blocks held out of the pool) can make a request unadmittable:
	 * it ends in error, counted in bkv_sched_stats.unadmittable
	 * (check_outcomes compares); without them every request fits the
	 * drawn pool, so an error the host did not cause is a defect */
	x->unadmittable_ok = f->pins;
	x->nframes = pc.device_blocks;
	x->st_cells = (x->state_frames ? x->state_frames : 1) * f->bt;
	x->st_cell = f->connector ? calloc((size_t)CX_STORE_CAP * x->st_cells, sizeof(cx_cell)) : NULL;
	x->rng_conn = mix(x->seed ^ 0xc0ecbull);
	x->dev = calloc((size_t)x->nframes * f->bt, sizeof(cx_cell));
	x->host = calloc((size_t)(f->host_blocks ? f->host_blocks : 1) * f->bt, sizeof(cx_cell));
	x->width = pc.device_blocks + 8;
	if (!x->dev || !x->host) {
		fail(x, "out of memory");
		return -1;
	}
	for (uint32_t i = 0; i < x->nframes * f->bt; i++)
		x->dev[i].group = -1;
	for (uint32_t i = 0; i < (f->host_blocks ? f->host_blocks : 1) * f->bt; i++)
		x->host[i].group = -1;
	return 0;
}

int cx_run_seed(uint64_t seed, const cx_opts *opt, cx_result *res)
{
	cx_run *x = calloc(1, sizeof(*x));
	uint64_t s;
	uint32_t max_iters, abandon_at = UINT32_MAX;
	int rc;

	memset(res, 0, sizeof(*res));
	if (!x) {
		snprintf(res->msg, sizeof(res->msg), "out of memory");
		res->failed = 1;
		return -1;
	}
	x->opt = *opt;
	x->trace = getenv("CX_TRACE") != NULL;
	x->res = res;
	x->seed = seed;
	cx_draw(seed, &x->f);
	s = mix(seed ^ 0xa11ce);
	x->rng_drive = mix(seed ^ 0xd71e);
	x->rng_fail = mix(seed ^ 0xfa11);
	max_iters = opt->max_steps ? opt->max_steps : 4000;
	make_requests(x, &s);
	if (x->f.tiny)
		size_tiny(x, &s);
	if (create(x) == 0) {
		describe(&x->f, res->features, sizeof(res->features));
		if (x->f.abandon)
			abandon_at = 1 + below(&s, 60);
		if (x->thr_n) {
			x->thr_on = pthread_create(&x->thr, NULL, abort_thread, x) == 0;
		}
		for (x->iter = 0; x->iter < max_iters && !x->failed; x->iter++) {
			between_steps(x);
			if (x->failed)
				break;
			if (all_submitted(x) && bkv_sched_pending(x->s) == 0 && !x->nt) {
				if (!x->nxq)
					break;
				st_flush(x, 1000); /* the saves left */
				continue;
			}
			if (x->iter >= abandon_at && (!x->f.overlap || x->nt))
				break;
			if (x->f.overlap)
				drive_overlap(x);
			else
				drive_sync(x);
		}
		res->steps = x->iter;
		if (x->thr_on) {
			__atomic_store_n(&x->thr_stop, 1, __ATOMIC_RELEASE);
			pthread_join(x->thr, NULL);
		}
		if (!x->failed && x->iter >= max_iters)
			fail(x, "did not finish in %u iterations (%llu pending)", max_iters,
			     (unsigned long long)bkv_sched_pending(x->s));
		if (!x->failed && x->iter < abandon_at)
			check_outcomes(x);
		if (!x->failed) {
			int abandoned = x->iter >= abandon_at && x->iter < max_iters;

			res->abandoned = abandoned ? 1 + x->nt : 0;
			bkv_sched_destroy(x->s);
			x->s = NULL;
			if (abandoned)
				check_abandoned_pool(x);
			else if ((rc = bkv_pool_check(x->pool)))
				fail(x, "bkv_pool_check after the scheduler: %d", rc);
		}
	} else {
		describe(&x->f, res->features, sizeof(res->features));
	}
	if (x->s)
		bkv_sched_destroy(x->s);
	while (x->pool && x->n_pins)
		(void)bkv_pool_unpin(x->pool, x->pins[--x->n_pins]);
	bkv_pool_destroy(x->pool);
	free(x->dev);
	free(x->st_cell);
	free(x->host);
	free(x->mirror);
	free(x->mlen);
	free(x->subst);
	free(x->chain);
	free(x);
	return res->failed ? -1 : 0;
}
