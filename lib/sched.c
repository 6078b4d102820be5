/*
 * sched.c - the scheduler: requests, the inbox, and bkv_step as one
 * transaction.
 *
 * Requests arrive from any thread through bkv_submit, which validates and
 * copies them (one allocation: the request, its lanes, its stop tokens and a
 * token history per lane, sized prompt + max_new so a step never grows it),
 * gives them an id from a counter and links them onto the inbox under a short
 * mutex. bkv_abort looks the id up in an open-addressing map (under the same
 * mutex) and links the request onto the abort list. Nothing else takes the
 * lock: the stepping thread splices both lists out at the start of a step.
 *
 * One bkv_step:
 *
 *   drain    inbox -> queue (policy.c's heap); aborts end at once (ABORT)
 *   plan     forks for n > 1, decode rows, prefill continuations, admissions;
 *            every row's tokens are appended to its sequence now (demand
 *            paging), so "make room" happens here: on ENOSPC the pool has
 *            already reclaimed cached blocks, and the scheduler preempts a
 *            victim (recompute or swap) and retries. Decode rows are one
 *            pass (plan_decode): rollback record, one-token append, row and
 *            the row's batch entries together
 *   call     mixed host: one forward (decode rows, then chunks); split host:
 *            prefill call (with admission auto maybe several, packed by
 *            length: auto.c), then a decode call over every decoding row
 *            plus rows whose prompt finished in a prefill call
 *   commit   record tokens, on_token, finish (length, stop, error), close
 *            finished sequences into the prefix cache, clear copy lists
 *   or
 *   rollback truncate every touched sequence to its length before the step;
 *            nothing reaches a request; BKV_EHOST
 *
 * The pool's transaction hooks keep blocks filled during the step out of the
 * prefix-cache index until commit, so no request can hit KV that has not been
 * computed, and a rolled-back step leaves no uncomputed block in the cache.
 *
 * Lanes: a request with n > 1 samples prefills its prompt but the last token
 * once (lane 0, no sample), then forks n lanes; each lane's first row computes
 * the last prompt token and samples, so every branch samples its own first
 * token from its own row. A lane's state is (kv_len, n_gen, decoding): KV of
 * tok[0, kv_len) is cached; the known tokens are tok[0, prompt_len + n_gen);
 * a decoding lane has exactly one known token without KV.
 */
#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* Fixed values of the "auto" fields until the cost model decides them. */
#define AUTO_ADMIT_GROUP 1u
#define AUTO_MAX_WAIT_US 100000u
#define AUTO_TOKEN_BUDGET 512u
#define MAX_RUNNING_LIMIT (1u << 20)
#define MAX_QUEUE_LIMIT (1u << 24)
#define MAX_BUDGET_LIMIT (1u << 24)
#define MAX_BYPASS_LIMIT (1ull << 42) /* us, about 51 days; past it a value is
					 a unit mistake, not a bound */
#define TOK_CAP_LIMIT (1u << 24)
#define MAP_INIT_CAP 64u

#define LOCK(s) pthread_mutex_lock((pthread_mutex_t *)(s)->in.lock)
#define UNLOCK(s) pthread_mutex_unlock((pthread_mutex_t *)(s)->in.lock)
#define ATOMIC_ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_RELAXED)
#define ATOMIC_SUB(p, v) __atomic_sub_fetch((p), (v), __ATOMIC_RELAXED)
#define ATOMIC_LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)

#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define COLD __attribute__((noinline, cold)) /* rare paths kept out of
						 bkv_step's hot loop */
#else
#define ALWAYS_INLINE inline
#define COLD
#endif
#define LANE_KNOWN(l) ((l)->req->prompt_len + (l)->n_gen)
#define REQ_IS_RUNNING(r) ((r)->state == BKV__REQ_RUNNING)

/* ---- configs ------------------------------------------------------------- */

void bkv_sched_config_init(bkv_sched_config *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
	cfg->policy = BKV_POLICY_CONTINUOUS;
	cfg->max_running = 32;
	cfg->max_queue = 65536;
	cfg->preempt = BKV_PREEMPT_AUTO;
}

void bkv_request_init(bkv_request *req)
{
	if (!req)
		return;
	memset(req, 0, sizeof(*req));
	req->size = sizeof(*req);
	req->n = 1;
}

static uint64_t clock_us(const bkv_sched *s)
{
	return s->ops.now_us ? s->ops.now_us(s->host) : bkv__monotonic_us();
}

/* ---- buffers ------------------------------------------------------------- */

static void bufs_free(const bkv_allocator *a, bkv__bufs *b)
{
	bkv__free(a, b->token_ids, (size_t)b->tok_cap * sizeof(int32_t));
	bkv__free(a, b->positions, (size_t)b->tok_cap * sizeof(int32_t));
	bkv__free(a, b->slot_mapping, (size_t)b->tok_cap * sizeof(int32_t));
	bkv__free(a, b->kv_indices,
		  ((size_t)b->kv_cap + BKV__KV_SLACK) * sizeof(int32_t));
	memset(b, 0, sizeof(*b));
}

static int bufs_alloc(const bkv_allocator *a, bkv__bufs *b, uint32_t tok_cap, uint32_t kv_cap)
{
	memset(b, 0, sizeof(*b));
	b->tok_cap = tok_cap;
	b->kv_cap = kv_cap;
	b->token_ids = bkv__malloc(a, (size_t)tok_cap * sizeof(int32_t));
	b->positions = bkv__malloc(a, (size_t)tok_cap * sizeof(int32_t));
	b->slot_mapping = bkv__malloc(a, (size_t)tok_cap * sizeof(int32_t));
	b->kv_indices = bkv__malloc(a, ((size_t)kv_cap + BKV__KV_SLACK) * sizeof(int32_t));
	if (!b->token_ids || !b->positions || !b->slot_mapping || !b->kv_indices) {
		bufs_free(a, b);
		return BKV_ENOMEM;
	}
	return BKV_OK;
}

/* Token and block entries one call may need for requests whose history (prompt
 * + max_new) is hist: every row is at most one lane's whole history. Returns
 * nonzero when the kv_indices entries would pass KV_CAP_LIMIT (then *kv is
 * capped there and such a request must be refused: a step could need more). */
#define KV_CAP_LIMIT (UINT32_MAX / 8)
static int bufs_need(const bkv_sched *s, uint64_t hist, uint32_t *tok, uint32_t *kv)
{
	uint64_t t, k, dev_tokens = (uint64_t)s->device_blocks * s->bt;

	if (s->cfg.chunked_prefill)
		t = BKV_MAX(s->cfg.token_budget, s->plan.row_cap);
	else
		t = (uint64_t)s->cfg.max_running * BKV_MIN(hist, dev_tokens) + s->plan.row_cap;
	t = BKV_MIN(t, (uint64_t)TOK_CAP_LIMIT);
	t = BKV_MAX(t, (uint64_t)s->plan.row_cap);
	k = (uint64_t)s->cfg.max_running * ((hist + s->bt - 1) / s->bt) + s->plan.row_cap;
	*tok = (uint32_t)t;
	*kv = k > KV_CAP_LIMIT ? KV_CAP_LIMIT : (uint32_t)k;
	return k > KV_CAP_LIMIT;
}

/* ---- the id map (lock held) ---------------------------------------------- */

static uint32_t id_hash(uint64_t id)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdull;
	id ^= id >> 33;
	return (uint32_t)id;
}

static bkv__slot *map_find(const bkv_sched *s, uint64_t id)
{
	uint32_t mask = s->in.map_cap - 1, i = id_hash(id) & mask;

	while (s->in.map[i].id != 0) {
		if (s->in.map[i].id == id)
			return &s->in.map[i];
		i = (i + 1) & mask;
	}
	return NULL;
}

static void map_put(bkv__slot *map, uint32_t cap, uint64_t id, bkv__req *r)
{
	uint32_t mask = cap - 1, i = id_hash(id) & mask;

	while (map[i].id != 0)
		i = (i + 1) & mask;
	map[i].id = id;
	map[i].req = r;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void map_erase(bkv_sched *s, uint64_t id)
{
	uint32_t mask = s->in.map_cap - 1, i, j;
	bkv__slot *e = map_find(s, id);

	if (!e)
		return;
	i = (uint32_t)(e - s->in.map);
	s->in.map[i].id = 0;
	s->in.map_count--;
	for (j = (i + 1) & mask; s->in.map[j].id != 0; j = (j + 1) & mask) {
		uint32_t home = id_hash(s->in.map[j].id) & mask;

		/* move j into the hole i unless its home lies in (i, j] */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			s->in.map[i] = s->in.map[j];
			s->in.map[j].id = 0;
			i = j;
		}
	}
}

static int map_reserve(bkv_sched *s)
{
	uint32_t cap = s->in.map_cap * 2, i;
	bkv__slot *m;

	if ((s->in.map_count + 1) * 2 <= s->in.map_cap)
		return BKV_OK;
	m = bkv__calloc(&s->alloc, cap, sizeof(*m));
	if (!m)
		return BKV_ENOMEM;
	for (i = 0; i < s->in.map_cap; i++)
		if (s->in.map[i].id)
			map_put(m, cap, s->in.map[i].id, s->in.map[i].req);
	bkv__free(&s->alloc, s->in.map, (size_t)s->in.map_cap * sizeof(*m));
	s->in.map = m;
	s->in.map_cap = cap;
	return BKV_OK;
}

/* ---- create / destroy ---------------------------------------------------- */

static int config_valid(const bkv_sched_config *c)
{
	uint32_t i;

	if (c->size < sizeof(bkv_sched_config))
		return 0;
	if (c->policy != BKV_POLICY_CONTINUOUS && c->policy != BKV_POLICY_STATIC)
		return 0;
	if (c->max_running < 1 || c->max_running > MAX_RUNNING_LIMIT)
		return 0;
	if (c->admit_group > c->max_running)
		return 0;
	if (c->token_budget > MAX_BUDGET_LIMIT)
		return 0;
	if (c->max_queue < 1 || c->max_queue > MAX_QUEUE_LIMIT)
		return 0;
	if (c->preempt != BKV_PREEMPT_AUTO && c->preempt != BKV_PREEMPT_RECOMPUTE &&
	    c->preempt != BKV_PREEMPT_SWAP)
		return 0;
	if (!(c->host_link_bytes_per_us >= 0.0) || isinf(c->host_link_bytes_per_us))
		return 0;
	if (c->max_bypass_us > MAX_BYPASS_LIMIT && c->max_bypass_us != UINT64_MAX)
		return 0;
	for (i = 0; i < sizeof(c->reserved) / sizeof(c->reserved[0]); i++)
		if (c->reserved[i])
			return 0;
	return 1;
}

int bkv_sched_create(const bkv_sched_config *cfg, bkv_pool *pool, const bkv_host_ops *ops,
		     void *host, const bkv_allocator *alloc, bkv_sched **out)
{
	bkv_allocator a;
	bkv_pool_stats ps;
	bkv_sched *s;
	uint32_t m, tok, kv;

	if (!cfg || !pool || !ops || !out || !config_valid(cfg))
		return BKV_EINVAL;
	if (!ops->forward && !(ops->prefill && ops->decode))
		return BKV_EINVAL;
	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(pool, &ps);
	if (!ps.block_tokens || !ps.device_blocks)
		return BKV_EINVAL;
	if (cfg->preempt == BKV_PREEMPT_SWAP && ps.host_blocks == 0)
		return BKV_EINVAL;

	bkv__alloc_init(&a, alloc);
	s = bkv__calloc(&a, 1, sizeof(*s));
	if (!s)
		return BKV_ENOMEM;
	s->alloc = a;
	s->cfg = *cfg;
	s->cfg.size = sizeof(s->cfg);
	if (!s->cfg.admit_group)
		s->cfg.admit_group = AUTO_ADMIT_GROUP;
	if (!s->cfg.max_wait_us)
		s->cfg.max_wait_us = AUTO_MAX_WAIT_US;
	if (!s->cfg.token_budget)
		s->cfg.token_budget = AUTO_TOKEN_BUDGET;
	s->ops = *ops;
	s->split = ops->forward == NULL;
	s->host = host;
	s->pool = pool;
	s->bt = ps.block_tokens;
	while ((1u << s->bt_shift) < s->bt)
		s->bt_shift++;
	s->device_blocks = ps.device_blocks;
	s->host_blocks = ps.host_blocks;

	m = s->cfg.max_running;
	s->plan.row_cap = 2 * m;
	s->q.heap_cap = s->cfg.max_queue + m;
	s->in.map_cap = MAP_INIT_CAP;
	s->in.lock = bkv__malloc(&a, sizeof(pthread_mutex_t));
	s->in.map = bkv__calloc(&a, s->in.map_cap, sizeof(bkv__slot));
	s->q.heap = bkv__calloc(&a, s->q.heap_cap, sizeof(bkv__req *));
	s->q.age = bkv__calloc(&a, s->q.heap_cap, sizeof(bkv__req *));
	s->rs.run = bkv__calloc(&a, m, sizeof(bkv__req *));
	s->plan.pre = bkv__calloc(&a, s->plan.row_cap, sizeof(bkv__row));
	s->plan.dec = bkv__calloc(&a, 2 * s->plan.row_cap, sizeof(bkv__row));
	s->plan.touched = bkv__calloc(&a, 3 * (size_t)m, sizeof(bkv__lane *));
	s->plan.swap_pend = bkv__calloc(&a, m, sizeof(bkv__req *));
	s->call.qo_indptr = bkv__calloc(&a, s->plan.row_cap + 1, sizeof(int32_t));
	s->call.kv_indptr = bkv__calloc(&a, s->plan.row_cap + 1, sizeof(int32_t));
	s->call.last_page_len = bkv__calloc(&a, s->plan.row_cap, sizeof(int32_t));
	s->call.row_sample = bkv__calloc(&a, s->plan.row_cap, sizeof(uint8_t));
	s->call.row_req = bkv__calloc(&a, s->plan.row_cap, sizeof(uint64_t));
	s->call.row_branch = bkv__calloc(&a, s->plan.row_cap, sizeof(uint32_t));
	s->call.row_user = bkv__calloc(&a, s->plan.row_cap, sizeof(void *));
	s->call.next_tokens = bkv__calloc(&a, s->plan.row_cap, sizeof(int32_t));
	s->call.chunks = bkv__calloc(&a, s->plan.row_cap, sizeof(bkv_chunk_shape));
	(void)bufs_need(s, 256, &tok, &kv);
	if (!s->in.lock || !s->in.map || !s->q.heap || !s->q.age || !s->rs.run || !s->plan.pre || !s->plan.dec ||
	    !s->plan.touched || !s->plan.swap_pend || !s->call.qo_indptr || !s->call.kv_indptr || !s->call.last_page_len ||
	    !s->call.row_sample || !s->call.row_req || !s->call.row_branch || !s->call.row_user ||
	    !s->call.next_tokens || !s->call.chunks || bufs_alloc(&a, &s->call.bufs, tok, kv) != BKV_OK) {
		if (s->in.lock)
			bkv__free(&a, s->in.lock, sizeof(pthread_mutex_t));
		s->in.lock = NULL;
		bkv_sched_destroy(s);
		return BKV_ENOMEM;
	}
	if (pthread_mutex_init((pthread_mutex_t *)s->in.lock, NULL) != 0) {
		bkv__free(&a, s->in.lock, sizeof(pthread_mutex_t));
		s->in.lock = NULL;
		bkv_sched_destroy(s);
		return BKV_ENOMEM;
	}
	if (bkv__auto_create(s, cfg) != BKV_OK) { /* auto.c: default cost model */
		bkv_sched_destroy(s);
		return BKV_ENOMEM;
	}
	s->in.want_tok = tok;
	s->in.want_kv = kv;
	s->stats.size = sizeof(s->stats);
	*out = s;
	return BKV_OK;
}

static void req_free(bkv_sched *s, bkv__req *r)
{
	bkv__free(&s->alloc, r, r->alloc_size);
}

/* Release a request's sequences without callbacks (destroy). */
static void req_drop_seqs(bkv_sched *s, bkv__req *r)
{
	uint32_t i;

	for (i = 0; i < r->n; i++) {
		if (r->lane[i].seq != BKV__SEQ_NONE)
			bkv_seq_drop(s->pool, r->lane[i].seq);
		r->lane[i].seq = BKV__SEQ_NONE;
	}
}

/* Close every lane's sequence (full blocks stay in the prefix cache): the
 * request will recompute from its tokens. */
static void req_close_lanes(bkv_sched *s, bkv__req *r)
{
	uint32_t i;

	for (i = 0; i < r->n; i++) {
		bkv__lane *l = &r->lane[i];

		if (l->seq != BKV__SEQ_NONE)
			bkv_seq_close(s->pool, l->seq);
		l->seq = BKV__SEQ_NONE;
		l->kv_len = 0;
		l->decoding = 0;
	}
}

void bkv_sched_destroy(bkv_sched *s)
{
	const bkv_allocator *a;
	bkv__req *r, *next;
	uint32_t i, m;

	if (!s)
		return;
	a = &s->alloc;
	m = s->cfg.max_running;
	/* every live request is in the map; zombies only on the abort list */
	for (r = s->in.abort_head; r; r = next) {
		next = r->abort_next;
		if (r->zombie)
			req_free(s, r);
	}
	if (s->in.map) {
		for (i = 0; i < s->in.map_cap; i++) {
			if (!s->in.map[i].id)
				continue;
			req_drop_seqs(s, s->in.map[i].req);
			req_free(s, s->in.map[i].req);
		}
	}
	if (s->in.lock) {
		pthread_mutex_destroy((pthread_mutex_t *)s->in.lock);
		bkv__free(a, s->in.lock, sizeof(pthread_mutex_t));
	}
	bkv__free(a, s->in.map, (size_t)s->in.map_cap * sizeof(bkv__slot));
	bkv__free(a, s->q.heap, (size_t)s->q.heap_cap * sizeof(bkv__req *));
	bkv__free(a, s->q.age, (size_t)s->q.heap_cap * sizeof(bkv__req *));
	bkv__free(a, s->rs.run, (size_t)m * sizeof(bkv__req *));
	bkv__free(a, s->plan.pre, (size_t)s->plan.row_cap * sizeof(bkv__row));
	bkv__free(a, s->plan.dec, 2 * (size_t)s->plan.row_cap * sizeof(bkv__row));
	bkv__free(a, s->plan.touched, 3 * (size_t)m * sizeof(bkv__lane *));
	bkv__free(a, s->plan.swap_pend, (size_t)m * sizeof(bkv__req *));
	bkv__free(a, s->call.qo_indptr, ((size_t)s->plan.row_cap + 1) * sizeof(int32_t));
	bkv__free(a, s->call.kv_indptr, ((size_t)s->plan.row_cap + 1) * sizeof(int32_t));
	bkv__free(a, s->call.last_page_len, (size_t)s->plan.row_cap * sizeof(int32_t));
	bkv__free(a, s->call.row_sample, (size_t)s->plan.row_cap * sizeof(uint8_t));
	bkv__free(a, s->call.row_req, (size_t)s->plan.row_cap * sizeof(uint64_t));
	bkv__free(a, s->call.row_branch, (size_t)s->plan.row_cap * sizeof(uint32_t));
	bkv__free(a, s->call.row_user, (size_t)s->plan.row_cap * sizeof(void *));
	bkv__free(a, s->call.next_tokens, (size_t)s->plan.row_cap * sizeof(int32_t));
	bkv__free(a, s->call.chunks, (size_t)s->plan.row_cap * sizeof(bkv_chunk_shape));
	bufs_free(a, &s->call.bufs);
	bufs_free(a, &s->in.spare);
	bkv__auto_destroy(s);
	bkv__free(a, s, sizeof(*s));
}

/* ---- submit / abort (any thread) ----------------------------------------- */

static int request_valid(const bkv_request *q)
{
	if (q->size < sizeof(bkv_request))
		return 0;
	if (!q->prompt || q->prompt_len == 0 || q->max_new_tokens == 0 || q->n == 0)
		return 0;
	if (q->n_stop && !q->stop_tokens)
		return 0;
	return 1;
}

int bkv_submit(bkv_sched *s, const bkv_request *q, uint64_t *req_id)
{
	uint64_t hist, blocks, bytes, id;
	size_t size;
	uint32_t i, tok, kv;
	bkv__req *r;
	int rc = BKV_OK;

	if (!s || !q || !request_valid(q))
		return BKV_EINVAL;
	/* Each of the n lanes may have to be recomputed on its own, so all n
	 * whole histories must fit at once for the request to finish alone. */
	hist = (uint64_t)q->prompt_len + q->max_new_tokens;
	blocks = (hist + s->bt - 1) / s->bt * q->n;
	if (blocks > s->device_blocks || hist > INT32_MAX || q->n > s->cfg.max_running ||
	    q->n > bkv__pool_max_seqs(s->pool) || bufs_need(s, hist, &tok, &kv))
		return BKV_E2BIG; /* could never run all n branches at once, or a
				     step's block-table array could not hold
				     max_running such histories */
	/* request, lanes, stop tokens, then n histories of hist tokens */
	bytes = sizeof(bkv__req) + (uint64_t)q->n * sizeof(bkv__lane) +
		(uint64_t)q->n_stop * sizeof(int32_t) + (uint64_t)q->n * hist * sizeof(int32_t);
	if (bytes > SIZE_MAX / 2)
		return BKV_ENOMEM;
	size = (size_t)bytes;
	r = bkv__malloc(&s->alloc, size);
	if (!r)
		return BKV_ENOMEM;
	memset(r, 0, sizeof(*r));
	r->alloc_size = size;
	r->priority = q->priority;
	r->prompt_len = q->prompt_len;
	r->max_new = q->max_new_tokens;
	r->n = q->n;
	r->n_live = q->n;
	r->n_stop = q->n_stop;
	r->cache_key = q->cache_key;
	r->user = q->user;
	r->predicted_output = q->predicted_output;
	r->state = BKV__REQ_INBOX;
	r->heap_idx = UINT32_MAX;
	r->age_idx = UINT32_MAX;
	r->stop = (int32_t *)(void *)&r->lane[q->n];
	if (q->n_stop)
		memcpy(r->stop, q->stop_tokens, (size_t)q->n_stop * sizeof(int32_t));
	for (i = 0; i < q->n; i++) {
		bkv__lane *l = &r->lane[i];

		memset(l, 0, sizeof(*l));
		l->req = r;
		l->branch = i;
		l->seq = BKV__SEQ_NONE;
		l->tok = r->stop + q->n_stop + (size_t)i * hist;
		memcpy(l->tok, q->prompt, (size_t)q->prompt_len * sizeof(int32_t));
	}
	LOCK(s);
	if (ATOMIC_LOAD(&s->in.nr_queued) >= s->cfg.max_queue) {
		rc = BKV_EAGAIN;
		goto out;
	}
	if (map_reserve(s) != BKV_OK) {
		rc = BKV_ENOMEM;
		goto out;
	}
	if (tok > s->in.want_tok || kv > s->in.want_kv) {
		/* Grow geometrically; the step swaps the spare in when it drains
		 * this request, so bkv_step itself never allocates. */
		bkv__bufs nb;

		tok = BKV_MAX(tok, BKV_MIN(s->in.want_tok * 2u, TOK_CAP_LIMIT));
		kv = BKV_MAX(kv, s->in.want_kv > UINT32_MAX / 16 ? kv : s->in.want_kv * 2u);
		if (bufs_alloc(&s->alloc, &nb, tok, kv) != BKV_OK) {
			rc = BKV_ENOMEM;
			goto out;
		}
		bufs_free(&s->alloc, &s->in.spare);
		s->in.spare = nb;
		s->in.want_tok = tok;
		s->in.want_kv = kv;
	}
	id = ++s->in.next_id;
	r->id = id;
	map_put(s->in.map, s->in.map_cap, id, r);
	s->in.map_count++;
	if (s->in.inbox_tail)
		s->in.inbox_tail->next = r;
	else
		s->in.inbox_head = r;
	s->in.inbox_tail = r;
	ATOMIC_ADD(&s->in.nr_queued, 1);
	ATOMIC_ADD(&s->in.nr_alive, 1);
	ATOMIC_ADD(&s->in.submitted, 1);
out:
	UNLOCK(s);
	if (rc != BKV_OK) {
		req_free(s, r);
		return rc;
	}
	if (req_id)
		*req_id = id;
	return BKV_OK;
}

int bkv_abort(bkv_sched *s, uint64_t req_id)
{
	bkv__slot *e;
	int rc = BKV_OK;

	if (!s || req_id == 0)
		return BKV_EINVAL;
	LOCK(s);
	e = map_find(s, req_id);
	if (!e || e->req->abort_state != 0) {
		rc = BKV_ENOENT;
	} else {
		e->req->abort_state = 1;
		e->req->abort_next = s->in.abort_head;
		s->in.abort_head = e->req;
	}
	UNLOCK(s);
	return rc;
}

/* ---- ending requests ----------------------------------------------------- */

static int is_stop(const bkv__req *r, int32_t t)
{
	uint32_t i;

	for (i = 0; i < r->n_stop; i++)
		if (r->stop[i] == t)
			return 1;
	return 0;
}

static void swap_pend_forget(bkv_sched *s, const bkv__req *r)
{
	uint32_t i;

	for (i = 0; i < s->plan.n_swap_pend; i++) {
		if (s->plan.swap_pend[i] == r) {
			s->plan.swap_pend[i] = s->plan.swap_pend[--s->plan.n_swap_pend];
			return;
		}
	}
}

/* End a request: release its sequences (close keeps full blocks cached, drop
 * for aborts), leave its state, run on_finish once. */
static void finish_req(bkv_sched *s, bkv__req *r, bkv_finish_reason why, bkv_step_info *si)
{
	uint32_t i;

	for (i = 0; i < r->n; i++) {
		bkv__lane *l = &r->lane[i];

		if (l->seq != BKV__SEQ_NONE) {
			if (why == BKV_FINISH_ABORT)
				bkv_seq_drop(s->pool, l->seq);
			else
				bkv_seq_close(s->pool, l->seq);
			l->seq = BKV__SEQ_NONE;
		}
		l->done = 1;
	}
	if (r->state == BKV__REQ_RUNNING) {
		s->rs.slots_used -= r->n_live;
		s->rs.run_dirty = 1;
		if (why == BKV_FINISH_LENGTH || why == BKV_FINISH_STOP)
			bkv__queue_ran(s, r); /* the auto bypass bound's S */
	} else if (r->state == BKV__REQ_WAITING || r->state == BKV__REQ_SWAPPED) {
		bkv__queue_remove(s, r);
		ATOMIC_SUB(&s->in.nr_queued, 1);
	}
	if (r->swap_unsent)
		swap_pend_forget(s, r);
	r->swap_unsent = 0;
	r->n_live = 0;
	r->state = BKV__REQ_DONE;
	r->next = s->plan.done_head;
	s->plan.done_head = r;
	ATOMIC_SUB(&s->in.nr_alive, 1);
	s->stats.finished++;
	if (why == BKV_FINISH_ABORT)
		s->stats.aborted++;
	si->finished++;
	if (s->ops.on_finish)
		s->ops.on_finish(s->host, r->id, why, r->user);
}

/* A lane reached its end: close it (its slot frees now); the request ends
 * with the last lane, with that lane's reason. */
static void lane_done(bkv_sched *s, bkv__lane *l, bkv_finish_reason why, bkv_step_info *si)
{
	bkv__req *r = l->req;

	l->done = 1;
	l->reason = (uint8_t)why;
	if (l->seq != BKV__SEQ_NONE)
		bkv_seq_close(s->pool, l->seq);
	l->seq = BKV__SEQ_NONE;
	r->n_live--;
	s->rs.slots_used--;
	if (r->n_live == 0)
		finish_req(s, r, why, si);
}

/* Remove ended and preempted requests from run[], keeping admission order. */
static void run_compact(bkv_sched *s)
{
	uint32_t i, j = 0, multi = 0;

	if (!s->rs.run_dirty)
		return;
	s->rs.run_dirty = 0;
	for (i = 0; i < s->rs.nr_run; i++) {
		bkv__req *r = s->rs.run[i];

		if (r->state != BKV__REQ_RUNNING)
			continue;
		r->run_idx = j;
		s->rs.run[j++] = r;
		multi += r->n > 1;
	}
	s->rs.nr_run = j;
	s->rs.nr_run_multi = multi;
	if (j == 0)
		s->rs.group_size = 0;
}

/* Forget requests ended in this step: out of the map (so bkv_abort answers
 * ENOENT), then freed - unless an abort is queued for it, in which case the
 * next drain frees it. */
static void release_done(bkv_sched *s)
{
	bkv__req *r, *next, *free_list = NULL;

	if (!s->plan.done_head)
		return;
	LOCK(s);
	for (r = s->plan.done_head; r; r = next) {
		next = r->next;
		map_erase(s, r->id);
		if (r->abort_state == 1) {
			r->zombie = 1;
		} else {
			r->next = free_list;
			free_list = r;
		}
	}
	UNLOCK(s);
	s->plan.done_head = NULL;
	for (r = free_list; r; r = next) {
		next = r->next;
		req_free(s, r);
	}
}

/* ---- drain --------------------------------------------------------------- */

static void drain(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	bkv__req *in, *ab, *r, *next, *rev = NULL;
	bkv__bufs old;
	uint32_t batch_slots = 0, queued_with;

	memset(&old, 0, sizeof(old));
	LOCK(s);
	in = s->in.inbox_head;
	s->in.inbox_head = s->in.inbox_tail = NULL;
	ab = s->in.abort_head;
	s->in.abort_head = NULL;
	for (r = ab; r; r = r->abort_next)
		r->abort_state = 2;
	if (s->in.spare.tok_cap) {
		old = s->call.bufs;
		s->call.bufs = s->in.spare;
		memset(&s->in.spare, 0, sizeof(s->in.spare));
	}
	UNLOCK(s);
	bufs_free(&s->alloc, &old);

	/* the slots queued once this batch is in: its requests arrived
	 * together, so each may wait behind all of them (the auto bypass
	 * bound, policy.c) */
	for (r = in; r; r = r->next)
		batch_slots += r->n_live;
	queued_with = s->q.queue_slots + batch_slots;
	for (r = in; r; r = next) {
		next = r->next;
		r->next = NULL;
		r->state = BKV__REQ_WAITING;
		r->order = ++s->q.arrival;
		r->enq_us = now;
		r->queued_with = queued_with;
		bkv__queue_push(s, r);
	}
	/* the abort list is LIFO; end them in the order they were asked */
	for (r = ab; r; r = next) {
		next = r->abort_next;
		r->abort_next = rev;
		rev = r;
	}
	for (r = rev; r; r = next) {
		next = r->abort_next;
		if (r->zombie)
			req_free(s, r); /* ended before the abort was drained */
		else
			finish_req(s, r, BKV_FINISH_ABORT, si);
	}
	run_compact(s);
}

/* ---- planning ------------------------------------------------------------ */

static void touch(bkv_sched *s, bkv__lane *l)
{
	if (l->touch_step == s->plan.step_no)
		return;
	l->touch_step = s->plan.step_no;
	l->pre_len = l->kv_len;
	s->plan.touched[s->plan.n_touched++] = l;
}

/* Undo a lane's appends of this step (before preempting it). */
static void lane_undo(bkv_sched *s, bkv__lane *l)
{
	if (l->seq == BKV__SEQ_NONE || l->touch_step != s->plan.step_no || l->kv_len == l->pre_len)
		return;
	bkv_seq_truncate(s->pool, l->seq, l->pre_len);
	l->kv_len = l->pre_len;
}

static int device_copies_pending(const bkv_sched *s)
{
	return bkv_pool_copies(s->pool, BKV_COPY_DEVICE, NULL) != 0;
}

/* Preempt a running request: swap its one live lane to the host tier, or free
 * its blocks (full ones stay in the prefix cache) and recompute later. It goes
 * to the front of its priority class and is not readmitted in this step. */
static void preempt(bkv_sched *s, bkv__req *r, uint64_t now, bkv_step_info *si)
{
	int swap = s->plan.n_swap_pend < s->cfg.max_running && !device_copies_pending(s) &&
		   bkv__want_swap(s, r);
	uint32_t i;

	BKV_ASSERT(r->state == BKV__REQ_RUNNING);
	for (i = 0; i < r->n; i++)
		lane_undo(s, &r->lane[i]);
	if (swap) {
		for (i = 0; i < r->n; i++) {
			bkv__lane *l = &r->lane[i];

			if (l->done || l->seq == BKV__SEQ_NONE)
				continue;
			if (bkv_seq_swap_out(s->pool, l->seq) != BKV_OK)
				swap = 0;
		}
	}
	if (!swap)
		req_close_lanes(s, r);
	s->rs.slots_used -= r->n_live;
	s->rs.run_dirty = 1;
	r->state = swap ? BKV__REQ_SWAPPED : BKV__REQ_WAITING;
	r->swap_unsent = (uint8_t)swap;
	if (swap)
		s->plan.swap_pend[s->plan.n_swap_pend++] = r;
	r->order = --s->q.front;
	r->enq_us = now;
	r->preempt_step = s->plan.step_no;
	bkv__queue_push(s, r);
	ATOMIC_ADD(&s->in.nr_queued, 1);
	s->stats.preemptions++;
	if (swap)
		s->stats.swaps++;
	si->preempted++;
}

/* Append n tokens of a lane's history. A row that samples appends its last
 * token on its own and without a prefix lookup (bkv__seq_append_private):
 * the host must compute it to sample, so it is written, and the library
 * never gives a write a slot in a shared or cached block - with
 * block_tokens 1 that token alone is a whole block the cache may hold.
 * All-or-nothing. */
static int lane_append(bkv_sched *s, bkv__lane *l, uint32_t n, int sample, uint32_t *hit)
{
	uint32_t h1 = 0;
	int rc;

	if (!sample)
		return bkv_seq_append(s->pool, l->seq, l->tok + l->kv_len, n, hit);
	if (n > 1) {
		rc = bkv_seq_append(s->pool, l->seq, l->tok + l->kv_len, n - 1, &h1);
		if (rc != BKV_OK)
			return rc;
	}
	rc = bkv__seq_append_private(s->pool, l->seq, l->tok + l->kv_len + n - 1, 1);
	if (rc != BKV_OK) {
		if (n > 1)
			bkv_seq_truncate(s->pool, l->seq, l->kv_len);
		return rc;
	}
	*hit = h1;
	return BKV_OK;
}

/* A prefilling lane takes every prefix hit up to target first (but never
 * the last token of a row that will sample), before its chunk is sized:
 * hits compute nothing, so the step's token budget does not bound them,
 * and a lane whose last chunk ended inside a block takes the cached block
 * holding it once another request has computed it. The lane must be
 * touched (its rollback length recorded) already. Returns the hit tokens
 * (kv_len has moved past them). */
static uint32_t lane_hits(bkv_sched *s, bkv__lane *l, uint32_t target)
{
	uint32_t n = target - l->kv_len;
	int h;

	if (target == LANE_KNOWN(l))
		n--; /* the row's last token samples: computed */
	if (n == 0)
		return 0;
	h = bkv__seq_take_hits(s->pool, l->seq, l->tok + l->kv_len, n);
	l->kv_len += (uint32_t)h;
	return (uint32_t)h;
}

/* Append n tokens of a lane's history, preempting victims while the pool is
 * short. Returns BKV_OK, or an error when the lane got no room (its request
 * may itself have been preempted). */
static int append_room(bkv_sched *s, bkv__lane *l, uint32_t n, int sample, uint32_t *hit,
		       uint64_t now, bkv_step_info *si)
{
	for (;;) {
		int rc;
		bkv__req *v;

		touch(s, l);
		rc = lane_append(s, l, n, sample, hit);
		if (rc == BKV_OK) {
			l->kv_len += n;
			return BKV_OK;
		}
		if (rc != BKV_ENOSPC)
			return rc;
		v = bkv__pick_victim(s);
		if (!v)
			return BKV_ENOSPC;
		preempt(s, v, now, si);
		if (v == l->req)
			return BKV_ENOSPC;
	}
}

/* Where a lane's prefill stops: the whole history, or the prompt but its
 * last token for a request that still has to fork. */
static uint32_t lane_target(const bkv__lane *l)
{
	const bkv__req *r = l->req;

	if (r->n > 1 && !r->forked)
		return r->prompt_len - 1;
	return LANE_KNOWN(l);
}

/* Add the row for a lane that just appended [old, kv_len) with hit leading
 * cache hits. A sampling row always computes at least its last token.
 * Returns the tokens the row computes (charged to the step's budget). */
static uint32_t add_row(bkv_sched *s, bkv__row *rows, uint32_t *n, bkv__lane *l, uint32_t old,
			uint32_t hit, int sample)
{
	bkv__row *row;
	uint32_t start = old + hit;

	s->plan.step_hits += hit;
	if (sample && start >= l->kv_len) /* not reached: a sampled token is
					      never a hit (lane_append, lane_hits);
					      kept, as dropping it costs the
					      fused decode pass 9 instructions a
					      row in GCC 12's code */
		start = l->kv_len - 1;
	if (start >= l->kv_len)
		return 0; /* all hits, nothing to compute */
	BKV_ASSERT(!sample || start < l->kv_len); /* a sampled token is written */
	row = &rows[(*n)++];
	row->lane = l;
	row->start = start;
	row->end = l->kv_len;
	row->sample = (uint8_t)sample;
	row->out = BKV_TOKEN_FAIL;
	return row->end - row->start;
}

static void charge(bkv_sched *s, uint32_t tokens)
{
	s->plan.budget_left -= BKV_MIN(s->plan.budget_left, tokens);
}

static void plan_forks(bkv_sched *s)
{
	uint32_t i, j;

	if (s->rs.nr_run_multi == 0)
		return; /* no request in run[] has n > 1 */
	for (i = 0; i < s->rs.nr_run; i++) {
		bkv__req *r = s->rs.run[i];
		bkv__lane *l0 = &r->lane[0];
		int rc = BKV_OK;

		if (r->n == 1 || r->forked || l0->kv_len != r->prompt_len - 1)
			continue;
		for (j = 1; j < r->n && rc == BKV_OK; j++) {
			bkv__lane *l = &r->lane[j];

			if (l0->kv_len == 0)
				rc = bkv_seq_open_keyed(s->pool, r->cache_key, &l->seq);
			else
				rc = bkv_seq_fork(s->pool, l0->seq, &l->seq);
			if (rc != BKV_OK)
				l->seq = BKV__SEQ_NONE;
			else
				bkv__seq_reserve(s->pool, l->seq,
						 (r->prompt_len + r->max_new + s->bt - 1) >>
							 s->bt_shift);
		}
		if (rc != BKV_OK) { /* retry next step */
			for (j = 1; j < r->n; j++) {
				if (r->lane[j].seq != BKV__SEQ_NONE)
					bkv_seq_close(s->pool, r->lane[j].seq);
				r->lane[j].seq = BKV__SEQ_NONE;
			}
			continue;
		}
		r->forked = 1;
		for (j = 0; j < r->n; j++) {
			r->lane[j].kv_len = l0->kv_len;
			r->lane[j].decoding = 1;
		}
	}
}

/* Decode rows for every decoding lane, each written into the batch arrays as
 * it is planned (bkv__fill; s->plan.fill_rows says how many made it), until a
 * preemption - which may prune rows already written - stops the writing.
 *
 * The common case, a running single-lane request in decode whose append is
 * simple, is one pass with the step's counters in locals: touch (the
 * rollback record: pre_len and touch_step, but no touched-list entry -
 * rollback finds these lanes through their rows), append (bkv__append_fast,
 * or bkv__seq_append1_slow at a block boundary), the row, its batch entries;
 * its budget charge (one token a row) is made once at the end (saturating
 * subtractions add up to the same). Everything else takes append_room
 * (preemption on ENOSPC) and add_row, with the counters written back first.
 * A row is [old, old + 1) either way: the token is appended without a
 * prefix lookup, into a private block, and computed (with block_tokens 1 the
 * cache may hold it; it is still written, never shared).
 * Returns the lanes it saw that are still prefilling (zero lets the step
 * skip plan_continue's pass). */
static uint32_t plan_decode(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	bkv_pool *const pool = s->pool;
	bkv__row *const dec = s->plan.dec;
	const uint64_t step = s->plan.step_no;
	const uint32_t n_dec0 = s->plan.n_dec;
	uint32_t i, j, prefilling = 0, n_dec = n_dec0, slow = 0;
	uint32_t hits = 0;
	int writing = !si->preempted; /* si->preempted in a local: stores
					 through the arrays would reload it */
	bkv__appender ap;
	bkv__fill f;

	bkv__append_begin(pool, &ap);
	bkv__fill_begin(s, &f);
	for (i = 0; i < s->rs.nr_run; i++) {
		bkv__req *r = s->rs.run[i];
		bkv__lane *l = &r->lane[0];

		/* a running single-lane request's lane is live and holds a
		 * sequence (bkv_sched_check 9, 10) */
		if (r->n == 1 && REQ_IS_RUNNING(r) && l->decoding) {
			const uint32_t old = l->kv_len;
			const int32_t token = l->tok[old];
			bkv__appended ad;
			bkv__row *row;

			BKV_ASSERT(!l->done && l->seq != BKV__SEQ_NONE &&
				   old + 1 == r->prompt_len + l->n_gen); /* LANE_KNOWN */
			ad = bkv__append_fast(&ap, l->seq, token);
			if (!ad.table) { /* a block boundary or anything unusual */
				const bkv__seq *sq;
				uint32_t hit;

				bkv__append_flush(&ap);
				if (bkv__seq_append1_slow(pool, l->seq, token, &hit, &sq) !=
				    BKV_OK)
					goto general; /* ENOSPC or another answer: the
							 pool is unchanged; the general
							 path retries with preemption */
				hits += hit;
				ad.table = sq->table;
				ad.nb = sq->n_blocks;
				ad.off = bkv__fill_slot(&f, old, ad.table, ad.nb, &ad.slot);
			}
			row = &dec[n_dec++];
			/* touch() without the touched list: nothing appended to
			 * a lane before this pass, which sees each lane once;
			 * rollback finds the lane through this row */
			BKV_ASSERT(l->touch_step != step);
			l->touch_step = step;
			l->pre_len = old;
			l->kv_len = old + 1;
			row->lane = l;
			row->start = old;
			row->end = old + 1;
			row->sample = 1; /* row->out is read for prefill rows only */
			if (writing)
				bkv__fill_decode(&f, r, l, token, old, ad.table, ad.nb, ad.off,
						 ad.slot);
			continue;
		}
general:
		bkv__append_flush(&ap);
		s->plan.n_dec = n_dec;
		for (j = 0; j < r->n && REQ_IS_RUNNING(r); j++) {
			uint32_t old, hit = 0, nb = 0, off;
			const int32_t *table;
			int32_t slot;

			l = &r->lane[j];
			old = l->kv_len;
			if (l->done || l->seq == BKV__SEQ_NONE)
				continue;
			if (!l->decoding) {
				prefilling++;
				continue;
			}
			BKV_ASSERT(l->kv_len + 1 == LANE_KNOWN(l));
			if (append_room(s, l, 1, 1, &hit, now, si) != BKV_OK)
				continue;
			charge(s, add_row(s, s->plan.dec, &s->plan.n_dec, l, old, hit, 1));
			if (si->preempted)
				continue; /* rows may be pruned: stop writing */
			table = bkv_seq_blocks(pool, l->seq, &nb);
			off = bkv__fill_slot(&f, old, table, nb, &slot);
			bkv__fill_decode(&f, r, l, l->tok[old], old, table, nb, off, slot);
		}
		slow += s->plan.n_dec - n_dec; /* the general path's rows */
		n_dec = s->plan.n_dec;
		writing = !si->preempted;
	}
	bkv__append_flush(&ap);
	s->plan.n_dec = n_dec;
	s->plan.step_hits += hits;
	charge(s, n_dec - n_dec0 - slow); /* the fast rows */
	BKV_ASSERT(f.k <= f.kv_cap);
	BKV_ASSERT(si->preempted || f.r == n_dec);
	s->plan.fill_rows = si->preempted ? 0 : f.r;
	s->plan.fill_kv = f.k;
	s->plan.fill_ctx = f.ctx;
	return prefilling;
}

/* Continue partially prefilled lanes in admission order. */
static void plan_continue(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	uint32_t i, j;

	for (i = 0; i < s->rs.nr_run && s->plan.budget_left; i++) {
		bkv__req *r = s->rs.run[i];

		for (j = 0; j < r->n && REQ_IS_RUNNING(r) && s->plan.budget_left; j++) {
			bkv__lane *l = &r->lane[j];
			uint32_t old = l->kv_len, hit = 0, h0, target, c;
			int sample;

			if (l->done || l->decoding || l->seq == BKV__SEQ_NONE)
				continue;
			target = lane_target(l);
			if (l->kv_len >= target)
				continue;
			touch(s, l);
			h0 = lane_hits(s, l, target);
			c = l->kv_len < target ? bkv__auto_chunk_fit(s, l->kv_len,
								     bkv__chunk_len(s, target - l->kv_len))
					       : 0;
			sample = l->kv_len + c == LANE_KNOWN(l) && (r->n == 1 || r->forked);
			if (c == 0 || append_room(s, l, c, sample, &hit, now, si) != BKV_OK) {
				if (REQ_IS_RUNNING(r))
					s->plan.step_hits += h0; /* taken, nothing computed */
				continue; /* (c 0: no room under the TPOT target) */
			}
			charge(s, add_row(s, s->plan.pre, &s->plan.n_pre, l, old, h0 + hit, sample));
		}
	}
}

/* Admission of a waiting request: open its lanes and append their first
 * chunks. Never preempts; all-or-nothing (on failure the request stays at the
 * head of the queue). */
static int admit_waiting(bkv_sched *s, bkv__req *r)
{
	uint32_t j, tokens = 0, n_rows = s->plan.n_pre, budget = s->plan.budget_left, hits = s->plan.step_hits;
	int rc = BKV_OK;

	for (j = 0; j < r->n; j++)
		if (!r->lane[j].done && (j == 0 || r->forked))
			tokens += lane_target(&r->lane[j]) + 1;
	/* the watermark keeps room for running lanes to grow; with nothing
	 * running it would only starve a request larger than the room above it */
	if (s->rs.nr_run > 0 && !bkv_pool_can_admit(s->pool, tokens))
		return BKV_ENOSPC;
	for (j = 0; j < r->n && rc == BKV_OK; j++) {
		bkv__lane *l = &r->lane[j];
		uint32_t target, c, hit = 0, h0;
		int sample;

		if (l->done || (j > 0 && !r->forked))
			continue;
		rc = bkv_seq_open_keyed(s->pool, r->cache_key, &l->seq);
		if (rc != BKV_OK) {
			l->seq = BKV__SEQ_NONE;
			break;
		}
		/* the table for the whole history now: decode steps then
		 * never reallocate it */
		bkv__seq_reserve(s->pool, l->seq,
				 (r->prompt_len + r->max_new + s->bt - 1) >> s->bt_shift);
		l->kv_len = 0;
		l->decoding = 0;
		touch(s, l);
		target = lane_target(l);
		if (target == 0)
			continue; /* n > 1, one-token prompt: forks next step */
		h0 = lane_hits(s, l, target);
		if (l->kv_len == target) { /* all hits (n > 1: forks next step) */
			s->plan.step_hits += h0;
			continue;
		}
		c = bkv__auto_chunk_fit(s, l->kv_len, bkv__chunk_len(s, target - l->kv_len));
		if (c == 0 && j > 0) {
			s->plan.step_hits += h0;
			continue; /* the budget went to earlier branches: this one
				     goes on in a later step (plan_continue) */
		}
		if (c == 0) {
			rc = BKV_ENOSPC;
			break;
		}
		sample = l->kv_len + c == LANE_KNOWN(l) && (r->n == 1 || r->forked);
		rc = lane_append(s, l, c, sample, &hit);
		if (rc != BKV_OK)
			break;
		l->kv_len += c;
		charge(s, add_row(s, s->plan.pre, &s->plan.n_pre, l, 0, h0 + hit, sample));
	}
	if (rc != BKV_OK) {
		for (j = 0; j < r->n; j++) {
			bkv__lane *l = &r->lane[j];

			if (l->seq != BKV__SEQ_NONE && !l->done)
				bkv_seq_close(s->pool, l->seq);
			if (!l->done) {
				l->seq = BKV__SEQ_NONE;
				l->kv_len = 0;
			}
		}
		s->plan.n_pre = n_rows;
		s->plan.budget_left = budget;
		s->plan.step_hits = hits;
		return rc;
	}
	return BKV_OK;
}

/* Admission of a swapped request (one live lane): swap it in, then give it
 * its row if the pool has room for it (no preemption). */
static int admit_swapped(bkv_sched *s, bkv__req *r)
{
	bkv__lane *l = NULL;
	uint32_t j, old, hit = 0, need;
	int rc;

	for (j = 0; j < r->n; j++)
		if (!r->lane[j].done)
			l = &r->lane[j];
	BKV_ASSERT(l && l->seq != BKV__SEQ_NONE);
	need = (l->kv_len + s->bt - 1) / s->bt + 1;
	if (bkv_pool_available(s->pool) < need)
		return BKV_ENOSPC;
	rc = bkv_seq_swap_in(s->pool, l->seq);
	if (rc != BKV_OK)
		return rc;
	old = l->kv_len;
	if (l->decoding) {
		touch(s, l);
		if (bkv__seq_append_private(s->pool, l->seq, l->tok + l->kv_len, 1) == BKV_OK) {
			l->kv_len++;
			charge(s, add_row(s, s->plan.dec, &s->plan.n_dec, l, old, 0, 1));
		}
	} else {
		uint32_t target = lane_target(l), c, h0;
		int sample;

		touch(s, l);
		h0 = l->kv_len < target ? lane_hits(s, l, target) : 0;
		c = bkv__chunk_len(s, target - l->kv_len);
		sample = l->kv_len + c == LANE_KNOWN(l) && (r->n == 1 || r->forked);
		if (c && lane_append(s, l, c, sample, &hit) == BKV_OK) {
			l->kv_len += c;
			charge(s, add_row(s, s->plan.pre, &s->plan.n_pre, l, old, h0 + hit, sample));
		} else {
			s->plan.step_hits += h0;
		}
	}
	return BKV_OK;
}

/* Pool sequences the running requests will still open: n - 1 for each that
 * has not forked yet. Admission keeps them free, so a fork never waits for
 * a sequence that only another waiting fork could give back. */
static COLD uint32_t fork_seqs_walk(const bkv_sched *s)
{
	uint32_t i, n = 0;

	for (i = 0; i < s->rs.nr_run; i++) {
		const bkv__req *r = s->rs.run[i];

		if (REQ_IS_RUNNING(r) && r->n > 1 && !r->forked)
			n += r->n - 1;
	}
	return n;
}

static inline uint32_t fork_seqs(const bkv_sched *s)
{
	return s->rs.nr_run_multi ? fork_seqs_walk(s) : 0;
}

static void plan_admit(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	int was_empty;
	uint32_t forks;

	run_compact(s); /* preempted requests leave run[] before it grows */
	was_empty = s->rs.nr_run == 0;
	s->plan.admit_tried = 0;
	if (!bkv__admit_allowed(s, now))
		return;
	s->plan.admit_tried = 1;
	forks = fork_seqs(s);
	while (s->q.heap_n && s->plan.budget_left) {
		bkv__req *r = bkv__queue_head(s, now); /* heap[0] unless the
							   bypass bound acts */
		uint32_t free_slots = s->cfg.max_running - s->rs.slots_used;
		int rc;

		if (r->preempt_step == s->plan.step_no || r->swap_unsent)
			break; /* no thrash: not back in the step that preempted it */
		if (r->n_live > free_slots)
			break;
		if (!bkv__auto_admit_ok(s, r))
			break; /* auto.c: batch cap, TPOT target, padding */
		/* a new (or recomputing) request opens n_live sequences, now or
		 * when it forks; a swapped one holds its own */
		if (r->state == BKV__REQ_WAITING &&
		    (uint64_t)r->n_live + forks + bkv__pool_nr_seqs(s->pool) > bkv__pool_max_seqs(s->pool))
			break;
		rc = r->state == BKV__REQ_SWAPPED ? admit_swapped(s, r) : admit_waiting(s, r);
		if (rc != BKV_OK)
			break;
		bkv__queue_remove(s, r);
		ATOMIC_SUB(&s->in.nr_queued, 1);
		r->state = BKV__REQ_RUNNING;
		r->swap_unsent = 0;
		r->admit_seq = ++s->rs.admit_seq;
		r->admit_us = now;
		r->run_idx = s->rs.nr_run;
		s->rs.run[s->rs.nr_run++] = r;
		s->rs.nr_run_multi += r->n > 1;
		s->rs.slots_used += r->n_live;
		s->rs.last_admit_us = now;
		si->admitted++;
		if (r->n > 1 && !r->forked)
			forks += r->n - 1;
		bkv__auto_admitted(s, r);
	}
	if (s->cfg.policy == BKV_POLICY_STATIC && was_empty && s->rs.nr_run)
		s->rs.group_size = s->rs.slots_used;
}

/* Drop rows whose request was preempted after they were planned. */
static void rows_prune(bkv__row *rows, uint32_t *n)
{
	uint32_t i, j = 0;

	for (i = 0; i < *n; i++)
		if (REQ_IS_RUNNING(rows[i].lane->req))
			rows[j++] = rows[i];
	*n = j;
}

/* ---- calls --------------------------------------------------------------- */

#if BKV_DEBUG_LEVEL >= 1
/* Every slot a call writes (slot_mapping) must lie in a block only the
 * writing row's sequence holds: one table reference and not in the prefix
 * cache. Checked under BKV_DEBUG_LEVEL >= 1 from token `first` on (one load
 * per row and block); a violation sticks and bkv_sched_check reports it
 * (invariant 30). The tokens before `first` are the decode rows the fused
 * pass wrote (plan_decode): each is its lane's append into its last block
 * through bkv__append_fast, whose test is this one (one reference, filled
 * to the token's offset, so not indexed), or through the private append of
 * bkv__seq_append1_slow (copy-on-write first, no prefix lookup). */
static COLD int batch_writes_shared(const bkv_sched *s, const bkv_batch *b, uint32_t first)
{
	const bkv_pool *p = s->pool;
	uint32_t t, last = UINT32_MAX;

	for (t = first; t < b->n_tokens; t++) {
		uint32_t id = (uint32_t)b->slot_mapping[t] >> s->bt_shift;

		if (id == last)
			continue;
		last = id;
		if (id >= s->device_blocks || bkv__pool_block_ref(p, (int32_t)id) != 1 ||
		    (bkv__pool_block_flags(p, (int32_t)id) & BKV__BLOCK_INDEXED))
			return 1;
	}
	return 0;
}
#endif

static int call_host(bkv_sched *s, bkv_call_kind kind, bkv__row *rows, uint32_t n,
		     uint32_t n_decode, bkv_step_info *si)
{
	int (*fn)(void *, const bkv_batch *, int32_t *);
	bkv_batch b;
	bkv_step_shape sh;
	uint64_t t0, t1;
	double us;
	uint32_t i, first;
	int rc;

	fn = kind == BKV_CALL_MIXED ? s->ops.forward
	     : kind == BKV_CALL_PREFILL ? s->ops.prefill : s->ops.decode;
	memset(&b, 0, sizeof(b));
	first = rows == s->plan.dec ? s->plan.fill_rows : 0;
	bkv__batch_fill(s, kind, rows, n, n_decode, first, &b, &sh);
#if BKV_DEBUG_LEVEL >= 1
	if (!s->bad_write && first < b.n_tokens)
		s->bad_write = batch_writes_shared(s, &b, first);
#endif
	if (n_decode)
		s->plan.dec_ctx_row = (double)sh.decode_context / (double)n_decode;
	if (s->cfg.cost.step_us)
		si->predicted_us += s->cfg.cost.step_us(s->cfg.cost.ctx, &sh);
	t0 = clock_us(s);
	rc = fn(s->host, &b, s->call.next_tokens);
	t1 = clock_us(s);
	us = t1 >= t0 ? (double)(t1 - t0) : 0.0;
	si->measured_us += us;
	if (rc < 0)
		return BKV_EHOST;
	if (s->cfg.cost.observe)
		s->cfg.cost.observe(s->cfg.cost.ctx, &sh, us);
	if (kind == BKV_CALL_PREFILL) /* the decode call reuses next_tokens */
		for (i = 0; i < n; i++)
			rows[i].out = s->call.next_tokens[i];
	si->decode_tokens += n_decode;
	for (i = n_decode; i < n; i++)
		si->prefill_tokens += rows[i].end - rows[i].start;
	si->rows += n;
	if (kind == BKV_CALL_DECODE)
		si->decode_calls++;
	else if (n > n_decode)
		si->prefill_calls++;
	return BKV_OK;
}

/* Split hosts: lanes whose prompt the prefill call finished join the decode
 * call with the token it sampled, unless that token ends them. No preemption
 * here: a lane the pool has no room for decodes in the next step. */
static void plan_after_prefill(bkv_sched *s)
{
	uint32_t i;

	for (i = 0; i < s->plan.n_pre; i++) {
		bkv__row *row = &s->plan.pre[i];
		bkv__lane *l = row->lane;
		bkv__req *r = l->req;
		uint32_t old = l->kv_len;
		int32_t t = row->out;

		if (!row->sample || t == BKV_TOKEN_FAIL || is_stop(r, t) ||
		    l->n_gen + 1 >= r->max_new)
			continue;
		l->tok[LANE_KNOWN(l)] = t; /* committed (n_gen++) only at commit */
		BKV_ASSERT(l->kv_len == LANE_KNOWN(l));
		if (bkv__seq_append_private(s->pool, l->seq, &l->tok[l->kv_len], 1) != BKV_OK)
			continue;
		l->kv_len++;
		add_row(s, s->plan.dec, &s->plan.n_dec, l, old, 0, 1);
	}
}

/* Split hosts: the step's prefill rows as one prefill call, or (auto.c's
 * packing) as several, one per run of similar lengths; the sampled tokens
 * go back to s->plan.pre's rows, in their order. Copies go out with the first. */
static int run_prefill(bkv_sched *s, bkv_step_info *si)
{
	bkv__row *rows;
	const uint32_t *order, *end;
	uint32_t g, i, b = 0, n_calls;
	int rc;

	n_calls = bkv__auto_pack(s, s->plan.pre, s->plan.n_pre, &rows, &order, &end);
	if (n_calls < 2)
		return call_host(s, BKV_CALL_PREFILL, s->plan.pre, s->plan.n_pre, 0, si);
	for (g = 0; g < n_calls; b = end[g++]) {
		rc = call_host(s, BKV_CALL_PREFILL, rows + b, end[g] - b, 0, si);
		if (rc != BKV_OK)
			return rc;
	}
	for (i = 0; i < s->plan.n_pre; i++)
		s->plan.pre[order[i]].out = rows[i].out;
	return BKV_OK;
}

static int run_calls(bkv_sched *s, bkv_step_info *si, int *called)
{
	int rc;

	if (si->preempted) { /* rows of requests preempted after planning */
		rows_prune(s->plan.dec, &s->plan.n_dec);
		rows_prune(s->plan.pre, &s->plan.n_pre);
		s->plan.fill_rows = 0; /* the written rows may be among them */
	}
	if (!s->split) {
		if (s->plan.n_dec + s->plan.n_pre == 0)
			return BKV_OK;
		memcpy(&s->plan.dec[s->plan.n_dec], s->plan.pre, (size_t)s->plan.n_pre * sizeof(bkv__row));
		*called = 1;
		rc = call_host(s, BKV_CALL_MIXED, s->plan.dec, s->plan.n_dec + s->plan.n_pre, s->plan.n_dec, si);
		s->plan.n_dec += s->plan.n_pre;
		s->plan.n_pre = 0;
		return rc;
	}
	if (s->plan.n_pre) {
		*called = 1;
		s->plan.fill_rows = 0; /* the prefill call reuses the batch arrays */
		rc = run_prefill(s, si);
		if (rc != BKV_OK)
			return rc;
		plan_after_prefill(s);
	}
	if (s->plan.n_dec) {
		*called = 1;
		rc = call_host(s, BKV_CALL_DECODE, s->plan.dec, s->plan.n_dec, s->plan.n_dec, si);
		if (rc != BKV_OK)
			return rc;
	}
	return BKV_OK;
}

/* ---- commit / rollback --------------------------------------------------- */

typedef void (*on_token_fn)(void *, uint64_t, uint32_t, int32_t, void *);

/* Record each sampling row's token: outs[i] (the last call's next_tokens)
 * or, with from_outs 0, rows[i].out (a split host's prefill rows), and tell
 * on_token (s->ops.on_token). from_outs and on_token are passed in so that
 * commit's calls, with constants, compile to loops without those tests. */
static ALWAYS_INLINE void commit_rows(bkv_sched *s, const bkv__row *rows, uint32_t n,
				      int from_outs, const int32_t *outs, on_token_fn on_token,
				      bkv_step_info *si)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		bkv__lane *l = rows[i].lane;
		bkv__req *r = l->req;
		int32_t t = from_outs ? outs[i] : rows[i].out;

		if (!rows[i].sample || !REQ_IS_RUNNING(r) || l->done)
			continue;
		if (t == BKV_TOKEN_FAIL) {
			finish_req(s, r, BKV_FINISH_ERROR, si);
			continue;
		}
		l->tok[LANE_KNOWN(l)] = t;
		l->n_gen++;
		l->decoding = 1;
		if (on_token) {
			on_token(s->host, r->id, l->branch, t, r->user);
			if (!REQ_IS_RUNNING(r) || l->done)
				continue;
		}
		if (r->n_stop && is_stop(r, t))
			lane_done(s, l, BKV_FINISH_STOP, si);
		else if (l->n_gen >= r->max_new)
			lane_done(s, l, BKV_FINISH_LENGTH, si);
	}
}

static void commit(bkv_sched *s, int called, bkv_step_info *si)
{
	uint32_t i;

	if (called) {
		/* every pending copy went out in this step's first call */
		bkv_pool_clear_copies(s->pool, BKV_COPY_SWAP_OUT);
		bkv_pool_clear_copies(s->pool, BKV_COPY_SWAP_IN);
		bkv_pool_clear_copies(s->pool, BKV_COPY_DEVICE);
		for (i = 0; i < s->plan.n_swap_pend; i++)
			s->plan.swap_pend[i]->swap_unsent = 0;
		s->plan.n_swap_pend = 0;
	}
	bkv__pool_txn_commit(s->pool);
	if (s->split)
		commit_rows(s, s->plan.pre, s->plan.n_pre, 0, NULL, s->ops.on_token, si);
	if (s->ops.on_token)
		commit_rows(s, s->plan.dec, s->plan.n_dec, 1, s->call.next_tokens, s->ops.on_token, si);
	else
		commit_rows(s, s->plan.dec, s->plan.n_dec, 1, s->call.next_tokens, NULL, si);
	s->stats.steps++;
	s->stats.prefill_tokens += si->prefill_tokens;
	s->stats.decode_tokens += si->decode_tokens;
	s->stats.hit_tokens += si->hit_tokens;
	s->stats.prefill_calls += si->prefill_calls;
	s->stats.decode_calls += si->decode_calls;
	s->stats.busy_us += si->measured_us;
}

/* A swapped request recomputes instead: its sequences (and host blocks) go,
 * it waits where it was in the queue. */
static void swapped_to_recompute(bkv_sched *s, bkv__req *r, uint64_t now)
{
	BKV_ASSERT(r->state == BKV__REQ_SWAPPED);
	bkv__queue_remove(s, r);
	req_close_lanes(s, r);
	r->swap_unsent = 0;
	r->state = BKV__REQ_WAITING;
	r->enq_us = now;
	bkv__queue_push(s, r);
}

/* Swap-outs whose copies no host call carried yet become recompute
 * preemptions (their freed device blocks may hold other KV by the time a
 * call would carry them). */
static void swaps_to_recompute(bkv_sched *s, uint64_t now)
{
	uint32_t i;

	for (i = 0; i < s->plan.n_swap_pend; i++)
		swapped_to_recompute(s, s->plan.swap_pend[i], now);
	s->plan.n_swap_pend = 0;
	bkv_pool_clear_copies(s->pool, BKV_COPY_SWAP_OUT);
}

/* Put a lane touched this step back to its length before the step. */
static void lane_restore(bkv_sched *s, bkv__lane *l)
{
	BKV_ASSERT(l->touch_step == s->plan.step_no);
	if (!REQ_IS_RUNNING(l->req) || l->done || l->seq == BKV__SEQ_NONE)
		return;
	if (l->kv_len != l->pre_len)
		bkv_seq_truncate(s->pool, l->seq, l->pre_len);
	l->kv_len = l->pre_len;
}

/* A host call failed: truncate every sequence the step appended to, forget
 * uncommitted blocks, and turn swap-outs whose copies a host may not have made
 * (their freed device blocks may since hold other KV) into recompute
 * preemptions. Device and swap-in copies stay pending for the next call. */
static void rollback(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	uint32_t i;

	for (i = 0; i < s->plan.n_touched; i++)
		lane_restore(s, s->plan.touched[i]);
	/* plan_decode's fast rows touched their lanes without the touched list
	 * (every decode row's lane was touched; restoring twice is harmless) */
	for (i = 0; i < s->plan.n_dec; i++)
		lane_restore(s, s->plan.dec[i].lane);
	bkv__pool_txn_abort(s->pool);
	swaps_to_recompute(s, now);
	s->stats.failed_steps++;
	si->rows = si->prefill_tokens = si->decode_tokens = si->hit_tokens = 0;
	si->prefill_calls = si->decode_calls = 0;
}

/* ---- the step ------------------------------------------------------------ */

/* The progress rule. A step in which nothing runs, no row is planned and
 * admission was allowed but took nothing, twice in a row, would repeat
 * forever: nothing it depends on changes by itself. Break it: swap-outs no
 * call carried become recomputes (their copies need a call that never
 * comes), then a swapped request that holds a sequence a waiting one
 * needs; and a head that cannot be admitted into an otherwise empty pool
 * ends with BKV_FINISH_ERROR rather than wait forever (bkv_step returns
 * BKV_OK with the request ended: it is no longer pending). */
static void unstick(bkv_sched *s, uint64_t now, bkv_step_info *si)
{
	bkv__req *head = bkv__queue_head(s, now);
	uint32_t i;

	s->plan.stalls = 0;
	if (s->plan.n_swap_pend) {
		swaps_to_recompute(s, now);
		return;
	}
	if (head->state == BKV__REQ_SWAPPED) {
		swapped_to_recompute(s, head, now);
		return;
	}
	for (i = 0; i < s->q.heap_n; i++) { /* only when stuck: O(queue) */
		if (s->q.heap[i]->state == BKV__REQ_SWAPPED) {
			swapped_to_recompute(s, s->q.heap[i], now);
			return;
		}
	}
	s->stats.unadmittable++;
	finish_req(s, head, BKV_FINISH_ERROR, si);
}


/* With nothing running, no table references a block that a pending device
 * (copy-on-write) or swap-in copy would write: their sequences were
 * preempted or ended before any host call carried the copies. The copies are
 * moot; forget them, which releases the copy-on-write sources they pin and
 * the host blocks they read. Without this, a pool with no slack left could
 * never admit again: no host call comes to clear them. Swap-out copies are
 * kept: the swapped requests still need them. */
static void forget_moot_copies(bkv_sched *s)
{
	bkv_pool_clear_copies(s->pool, BKV_COPY_DEVICE);
	bkv_pool_clear_copies(s->pool, BKV_COPY_SWAP_IN);
}

int bkv_step(bkv_sched *s, bkv_step_info *info)
{
	bkv_step_info si;
	uint64_t now;
	int rc, called = 0;

	if (!s)
		return BKV_EINVAL;
	if (s->plan.in_step)
		return BKV_ESTATE;
	s->plan.in_step = 1;
	memset(&si, 0, sizeof(si));
	now = clock_us(s);
	s->plan.step_us = now;
	drain(s, now, &si);
	if (s->rs.nr_run == 0)
		forget_moot_copies(s);

	s->plan.step_no++;
	s->plan.n_pre = s->plan.n_dec = s->plan.n_touched = s->plan.step_hits = s->plan.fill_rows = 0;
	memset(s->call.copies_sent, 0, sizeof(s->call.copies_sent));
	bkv__auto_step_begin(s);
	s->plan.budget_left = s->cfg.chunked_prefill
				 ? bkv__auto_budget(s, s->cfg.token_budget, s->call.bufs.tok_cap)
				 : s->call.bufs.tok_cap;
	bkv__pool_txn_begin(s->pool);
	plan_forks(s);
	if (plan_decode(s, now, &si))
		plan_continue(s, now, &si);
	plan_admit(s, now, &si);
	bkv__auto_after_admit(s);
	if (s->plan.n_pre + s->plan.n_dec == 0 && s->rs.nr_run == 0 && s->q.heap_n && s->plan.admit_tried &&
	    !si.admitted) {
		if (++s->plan.stalls >= 2)
			unstick(s, now, &si);
	} else {
		s->plan.stalls = 0;
	}
	si.hit_tokens = s->plan.step_hits;

	rc = run_calls(s, &si, &called);
	if (rc == BKV_OK)
		commit(s, called, &si);
	else
		rollback(s, now, &si);
	run_compact(s);
	release_done(s);

	si.running = s->rs.nr_run;
	si.waiting = s->q.heap_n;
	bkv__step_observe(s, clock_us(s) - now);
	if (info)
		*info = si;
	s->plan.in_step = 0;
	return rc;
}

/* ---- queries ------------------------------------------------------------- */

uint64_t bkv_sched_pending(bkv_sched *s)
{
	return s ? ATOMIC_LOAD(&s->in.nr_alive) : 0;
}

void bkv_sched_stats_get(const bkv_sched *s, bkv_sched_stats *stats)
{
	bkv_sched_stats st;
	size_t n;

	if (!s || !stats)
		return;
	n = stats->size ? BKV_MIN((size_t)stats->size, sizeof(st)) : sizeof(st);
	st = s->stats;
	st.size = (uint32_t)n;
	st.waiting = s->q.nr_waiting;
	st.running = s->rs.nr_run;
	st.swapped = s->q.nr_swapped;
	st.submitted = ATOMIC_LOAD(&((bkv_sched *)s)->in.submitted);
	memcpy(stats, &st, n);
}

/* Invariant numbers (0 = consistent; 1000 + n: the pool's invariant n):
 *  1-5  the queue heap (policy.c)     6-15 run[], lanes and slots
 * 16-17 queued requests' sequences    18-22 map, inbox and counters
 * 23    open pool sequences == lanes holding one
 * 24-29 the age heap (policy.c): exactly the queued requests with order > 0,
 *       each once, WAITING, in (priority, arrival) heap order
 * 30    a call's slot_mapping named a slot in a shared or cached block
 *       (sticky; checked at the call under BKV_DEBUG_LEVEL >= 1)
 * 31    the running requests' unforked branches cannot all get a sequence
 * 32    a running lane's full block (KV committed) is not in the prefix
 *       cache: every full block a step computes is indexed at its commit
 *       (a duplicate of an indexed block is swapped for it, txn_dedupe in
 *       pool.c), or still waits for the swap-in copy that brings its KV */
static int lane_blocks_indexed(const bkv_sched *s, const bkv__lane *l)
{
	const bkv_pool *p = s->pool;
	uint32_t i, n, nb;
	const int32_t *t;

	if (!bkv__pool_prefix_on(p))
		return 1;
	t = bkv_seq_blocks(p, l->seq, &nb);
	n = BKV_MIN(l->kv_len >> s->bt_shift, nb);
	/* a swapped-in block whose copy a rolled-back call was to carry is
	 * indexed when the copy is cleared (its KV is not in yet) */
	for (i = 0; i < n; i++)
		if (!(bkv__pool_block_flags(p, t[i]) & (BKV__BLOCK_INDEXED | BKV__BLOCK_PEND_SWAPIN)))
			return 0;
	return 1;
}

int bkv_sched_check(const bkv_sched *s)
{
	uint32_t i, j, slots = 0, n_inbox = 0, n_seqs = 0, mapped = 0;
	bkv_pool_stats ps;
	const bkv__req *r;
	int rc;

	if (!s)
		return BKV_EINVAL;
	rc = bkv__queue_check(s);
	if (rc)
		return rc;
	for (i = 0; i < s->rs.nr_run; i++) {
		uint32_t live = 0;

		r = s->rs.run[i];
		if (r->state != BKV__REQ_RUNNING)
			return 6;
		if (r->run_idx != i)
			return 7;
		for (j = 0; j < r->n; j++) {
			const bkv__lane *l = &r->lane[j];
			bkv_seq_info si;

			if (l->done) {
				if (l->seq != BKV__SEQ_NONE)
					return 9;
				continue;
			}
			live++;
			if (r->n > 1 && !r->forked && j > 0) {
				if (l->seq != BKV__SEQ_NONE)
					return 10;
				continue;
			}
			if (l->seq == BKV__SEQ_NONE)
				return 10;
			n_seqs++;
			if (bkv_seq_info_get(s->pool, l->seq, &si) != BKV_OK || si.swapped ||
			    si.len != l->kv_len)
				return 11;
			if (l->kv_len > LANE_KNOWN(l) || l->n_gen > r->max_new)
				return 12;
			if (l->decoding && l->kv_len + 1 != LANE_KNOWN(l))
				return 13;
			if (!lane_blocks_indexed(s, l))
				return 32;
		}
		if (live != r->n_live)
			return 8;
		slots += r->n_live;
	}
	if (slots != s->rs.slots_used)
		return 14;
	if (s->rs.slots_used > s->cfg.max_running)
		return 15;
	if (s->bad_write)
		return 30;
	if ((uint64_t)bkv__pool_nr_seqs(s->pool) + fork_seqs(s) > bkv__pool_max_seqs(s->pool))
		return 31;
	for (i = 0; i < s->q.heap_n; i++) {
		r = s->q.heap[i];
		for (j = 0; j < r->n; j++) {
			const bkv__lane *l = &r->lane[j];
			bkv_seq_info si;

			if (r->state == BKV__REQ_WAITING && l->seq != BKV__SEQ_NONE)
				return 16;
			if (r->state == BKV__REQ_SWAPPED && !l->done) {
				if (bkv_seq_info_get(s->pool, l->seq, &si) != BKV_OK || !si.swapped ||
				    si.len != l->kv_len)
					return 17;
				n_seqs++;
			}
		}
	}
	LOCK(s);
	for (r = s->in.inbox_head; r; r = r->next)
		n_inbox++;
	for (i = 0; i < s->in.map_cap; i++) {
		if (!s->in.map[i].id)
			continue;
		mapped++;
		if (s->in.map[i].req->state == BKV__REQ_DONE || s->in.map[i].req->id != s->in.map[i].id)
			rc = 18;
	}
	if (!rc && mapped != s->in.map_count)
		rc = 19;
	if (!rc && mapped != n_inbox + s->q.heap_n + s->rs.nr_run)
		rc = 20;
	/* submit changes these under the lock; the stepping thread is us */
	if (!rc && ATOMIC_LOAD(&((bkv_sched *)s)->in.nr_alive) != mapped)
		rc = 21;
	if (!rc && ATOMIC_LOAD(&((bkv_sched *)s)->in.nr_queued) != n_inbox + s->q.heap_n)
		rc = 22;
	UNLOCK(s);
	if (rc)
		return rc;
	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(s->pool, &ps);
	if (ps.nr_seqs != n_seqs)
		return 23;
	rc = bkv_pool_check(s->pool);
	return rc > 0 ? 1000 + rc : rc;
}
