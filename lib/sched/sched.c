/*
 * sched.c - the scheduler handle: configuration, create and destroy, and
 * the queries (pending requests, stats).
 *
 * The scheduler is built from owned parts (sched/sched.h): the inbox that
 * bkv_submit and bkv_abort share with the stepping thread (sched/inbox.c),
 * the queue and the decisions (decide/), the running set and the ending of
 * requests (sched/req.c), one step's plan (sched/plan.c), the step itself
 * (sched/step.c), the host call's arrays (sched/batch.c). Create allocates
 * every array a step will use, so bkv_step never allocates.
 */
#include "sched/sched.h"
#include "decide/decide.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

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
	cfg->evict = BKV_EVICT_SEGMENTED;
}

void bkv_request_init(bkv_request *req)
{
	if (!req)
		return;
	memset(req, 0, sizeof(*req));
	req->size = sizeof(*req);
	req->n = 1;
}


/* ---- create / destroy ---------------------------------------------------- */

#define SC "bkv_sched_config."
#define REFUSE(...) return bkv__fail(BKV_EINVAL, __VA_ARGS__)

/* The numeric fields: BKV_OK, or BKV_EINVAL with the message naming the
 * field (bkv_last_error). */
static int config_check_sizes(const bkv_sched_config *c)
{
	if (c->size < sizeof(bkv_sched_config))
		REFUSE(SC "size = %u: must be sizeof(bkv_sched_config) = %zu (call "
		       "bkv_sched_config_init)", c->size, sizeof(bkv_sched_config));
	if (c->copy_overlap > 1)
		REFUSE(SC "copy_overlap = %u: must be 0 or 1", c->copy_overlap);
	if (c->overlap > BKV_OVERLAP_MAX_DEPTH)
		REFUSE(SC "overlap = %u: the depth must be in 0..%u", c->overlap,
		       BKV_OVERLAP_MAX_DEPTH);
	if (c->overlap && c->max_running > BKV_TOKEN_PENDING_ROWS / 2)
		REFUSE(SC "max_running = %u: with overlap at most %u (a placeholder names "
		       "one of BKV_TOKEN_PENDING_ROWS rows)", c->max_running,
		       BKV_TOKEN_PENDING_ROWS / 2);
	if (c->prefill_first > 1)
		REFUSE(SC "prefill_first = %u: must be 0 or 1", c->prefill_first);
	if (c->max_running < 1 || c->max_running > MAX_RUNNING_LIMIT)
		REFUSE(SC "max_running = %u: must be in 1..%u", c->max_running, MAX_RUNNING_LIMIT);
	if (c->admit_group > c->max_running)
		REFUSE(SC "admit_group = %u: must be <= max_running (%u)", c->admit_group,
		       c->max_running);
	if (c->token_budget > MAX_BUDGET_LIMIT)
		REFUSE(SC "token_budget = %u: must be in 0..%u", c->token_budget, MAX_BUDGET_LIMIT);
	if (c->max_queue < 1 || c->max_queue > MAX_QUEUE_LIMIT)
		REFUSE(SC "max_queue = %u: must be in 1..%u", c->max_queue, MAX_QUEUE_LIMIT);
	if (!(c->host_link_bytes_per_us >= 0.0) || isinf(c->host_link_bytes_per_us))
		REFUSE(SC "host_link_bytes_per_us = %g: must be finite and >= 0",
		       c->host_link_bytes_per_us);
	if (c->max_bypass_us > MAX_BYPASS_LIMIT && c->max_bypass_us != UINT64_MAX)
		REFUSE(SC "max_bypass_us = %llu: must be <= %llu or UINT64_MAX",
		       (unsigned long long)c->max_bypass_us, (unsigned long long)MAX_BYPASS_LIMIT);
	if (c->spec_max_k > BKV_SPEC_MAX_K)
		REFUSE(SC "spec_max_k = %u: must be in 0..%u", c->spec_max_k, BKV_SPEC_MAX_K);
	if (c->max_adapters > BKV_MAX_ADAPTERS)
		REFUSE(SC "max_adapters = %u: must be in 0..%u", c->max_adapters, BKV_MAX_ADAPTERS);
	if (c->pad0)
		REFUSE(SC "pad0 = %u: must be 0", c->pad0);
	if (c->size >= offsetof(bkv_sched_config, connector) && c->pad1)
		REFUSE(SC "pad1 = %u: must be 0", c->pad1);
	if (c->adapter_wait_us > MAX_BYPASS_LIMIT)
		REFUSE(SC "adapter_wait_us = %llu: must be <= %llu",
		       (unsigned long long)c->adapter_wait_us, (unsigned long long)MAX_BYPASS_LIMIT);
	return BKV_OK;
}

/* The fields that name one of a few choices, after the numeric ones. */
static int config_check(const bkv_sched_config *c)
{
	int rc = config_check_sizes(c);

	if (rc != BKV_OK)
		return rc;
	if (c->policy != BKV_POLICY_CONTINUOUS && c->policy != BKV_POLICY_STATIC)
		REFUSE(SC "policy = %d: must be BKV_POLICY_CONTINUOUS or BKV_POLICY_STATIC",
		       (int)c->policy);
	if (c->preempt != BKV_PREEMPT_AUTO && c->preempt != BKV_PREEMPT_RECOMPUTE &&
	    c->preempt != BKV_PREEMPT_SWAP)
		REFUSE(SC "preempt = %d: must be BKV_PREEMPT_AUTO, _RECOMPUTE or _SWAP",
		       (int)c->preempt);
	if (c->batch_layout != BKV_BATCH_FLAT && c->batch_layout != BKV_BATCH_PERSISTENT)
		REFUSE(SC "batch_layout = %d: must be BKV_BATCH_FLAT or BKV_BATCH_PERSISTENT",
		       (int)c->batch_layout);
	if (c->spec_k_mode != BKV_SPEC_K_AUTO && c->spec_k_mode != BKV_SPEC_K_FIXED)
		REFUSE(SC "spec_k_mode = %d: must be BKV_SPEC_K_AUTO or BKV_SPEC_K_FIXED",
		       (int)c->spec_k_mode);
	if (c->spec_drafts != BKV_SPEC_DRAFT_NGRAM && c->spec_drafts != BKV_SPEC_DRAFT_HOST)
		REFUSE(SC "spec_drafts = %d: must be BKV_SPEC_DRAFT_NGRAM or BKV_SPEC_DRAFT_HOST",
		       (int)c->spec_drafts);
	if (c->evict != BKV_EVICT_LRU && c->evict != BKV_EVICT_VALUE &&
	    c->evict != BKV_EVICT_SEGMENTED)
		REFUSE(SC "evict = %d: must be BKV_EVICT_LRU, _VALUE or _SEGMENTED", (int)c->evict);
	if (c->victim != BKV_VICTIM_RECENT && c->victim != BKV_VICTIM_COST)
		REFUSE(SC "victim = %d: must be BKV_VICTIM_RECENT or BKV_VICTIM_COST",
		       (int)c->victim);
	if (c->admit_reserve != BKV_RESERVE_PROMPT && c->admit_reserve != BKV_RESERVE_OUTPUT)
		REFUSE(SC "admit_reserve = %d: must be BKV_RESERVE_PROMPT or BKV_RESERVE_OUTPUT",
		       (int)c->admit_reserve);
	return BKV_OK;
}

/* The arguments of bkv_sched_create, and the pool they name: BKV_OK with
 * *ps filled, or BKV_EINVAL with the message naming what is wrong. */
static int create_args_valid(const bkv_sched_config *cfg, bkv_pool *pool, const bkv_host_ops *ops,
			     bkv_sched **out, bkv_pool_stats *ps)
{
	int rc;

	if (!cfg || !pool || !ops || !out)
		REFUSE("bkv_sched_create: %s is NULL",
		       !cfg ? "cfg" : !pool ? "pool" : !ops ? "ops" : "out");
	if ((rc = config_check(cfg)) != BKV_OK)
		return rc;
	if (!ops->forward && !(ops->prefill && ops->decode) && !(cfg->overlap && ops->launch))
		REFUSE("bkv_host_ops: needs forward, or prefill and decode%s",
		       cfg->overlap ? ", or launch" : " (launch only with bkv_sched_config.overlap)");
	if (cfg->spec_max_k && cfg->spec_drafts == BKV_SPEC_DRAFT_HOST && !ops->draft)
		REFUSE(SC "spec_drafts = BKV_SPEC_DRAFT_HOST (spec_max_k = %u) needs "
		       "bkv_host_ops.draft", cfg->spec_max_k);
	if (cfg->overlap && !ops->launch)
		REFUSE(SC "overlap = %u needs bkv_host_ops.launch", cfg->overlap);
	if (cfg->overlap && !ops->forward && (ops->prefill || ops->decode))
		REFUSE(SC "overlap = %u: one mixed launch, not a split host (bkv_host_ops.prefill "
		       "and .decode without .forward)", cfg->overlap);
	memset(ps, 0, sizeof(*ps));
	ps->size = sizeof(*ps);
	bkv_pool_stats_get(pool, ps);
	if (!ps->block_tokens || !ps->device_blocks)
		REFUSE("bkv_sched_create: the pool has no device blocks");
	return bkv__decide_config_check(cfg, ps->host_blocks);
}

/* Copy the configuration, resolve its "auto" fields to their fixed values
 * until the cost model decides them, and take the pool's geometry. */
static void config_resolve(bkv_sched *s, const bkv_sched_config *cfg, const bkv_host_ops *ops,
			   void *host, bkv_pool *pool, const bkv_pool_stats *ps)
{
	s->cfg = *cfg;
	s->cfg.size = sizeof(s->cfg);
	if (!s->cfg.admit_group)
		s->cfg.admit_group = AUTO_ADMIT_GROUP;
	if (!s->cfg.max_wait_us)
		s->cfg.max_wait_us = AUTO_MAX_WAIT_US;
	if (!s->cfg.token_budget)
		s->cfg.token_budget = AUTO_TOKEN_BUDGET;
	s->ops = *ops;
	s->split = ops->forward == NULL && !cfg->overlap; /* a launch is mixed */
	s->host = host;
	s->pool = pool;
	s->in.tok_limit = TOK_CAP_LIMIT;
	s->bt = ps->block_tokens;
	while ((1u << s->bt_shift) < s->bt)
		s->bt_shift++;
	s->device_blocks = bkv__pool_blocks(pool);
	s->host_blocks = ps->host_blocks;
	s->call.n_lanes = bkv__pool_n_groups(pool) - 1;
	s->call.st_interval = bkv__pool_state_interval(pool);
	s->call.has_state = bkv__pool_group(pool, bkv__pool_n_groups(pool) - 1)->kind ==
				    BKV_GROUP_STATE &&
			    bkv__pool_n_groups(pool) > 1;
}

/* Every array a step uses, sized from max_running and max_queue, and the
 * first set of batch buffers (tok and kv entries). BKV_OK or BKV_ENOMEM
 * (then bkv_sched_destroy frees what was taken; the lock is not yet a
 * mutex). */
static int arrays_alloc(bkv_sched *s, uint32_t *tok, uint32_t *kv)
{
	const bkv_allocator *a = &s->alloc;
	uint32_t m = s->cfg.max_running, rc;

	s->plan.row_cap = 2 * m;
	rc = s->plan.row_cap;
	s->q.heap_cap = s->cfg.max_queue + m;
	s->in.map_cap = MAP_INIT_CAP;
	s->in.lock = bkv__malloc(a, sizeof(pthread_mutex_t));
	s->in.map = bkv__calloc(a, s->in.map_cap, sizeof(bkv__slot));
	s->q.heap = bkv__calloc(a, s->q.heap_cap, sizeof(bkv__req *));
	s->q.age = bkv__calloc(a, s->q.heap_cap, sizeof(bkv__req *));
	s->rs.run = bkv__calloc(a, m, sizeof(bkv__req *));
	s->plan.pre = bkv__calloc(a, rc, sizeof(bkv__row));
	s->plan.dec = bkv__calloc(a, 2 * rc, sizeof(bkv__row));
	s->plan.touched = bkv__calloc(a, 3 * (size_t)m, sizeof(bkv__lane *));
	s->plan.swap_pend = bkv__calloc(a, m, sizeof(bkv__req *));
	(void)bkv__bufs_need(s, 256, tok, kv);
	if (!s->in.lock || !s->in.map || !s->q.heap || !s->q.age || !s->rs.run || !s->plan.pre ||
	    !s->plan.dec || !s->plan.touched || !s->plan.swap_pend ||
	    bkv__call_arrays_alloc(a, rc, *tok, *kv, 1 + s->call.n_lanes, &s->call.arr) != BKV_OK)
		return BKV_ENOMEM;
	if (s->call.n_lanes)
		return bkv__groups_alloc(s);
	return BKV_OK;
}

int bkv_sched_create(const bkv_sched_config *cfg, bkv_pool *pool, const bkv_host_ops *ops,
		     void *host, const bkv_allocator *alloc, bkv_sched **out)
{
	bkv_allocator a;
	bkv_pool_stats ps;
	bkv_sched *s;
	uint32_t tok, kv;
	int rc;

	bkv__error_clear();
	if ((rc = create_args_valid(cfg, pool, ops, out, &ps)) != BKV_OK)
		return rc;
	bkv__alloc_init(&a, alloc);
	s = bkv__calloc(&a, 1, sizeof(*s));
	if (!s)
		return BKV_ENOMEM;
	s->alloc = a;
	config_resolve(s, cfg, ops, host, pool, &ps);
	if (arrays_alloc(s, &tok, &kv) != BKV_OK || bkv__rows_alloc(s) != BKV_OK ||
	    bkv__spec_alloc(s) != BKV_OK || bkv__adapters_alloc(s) != BKV_OK ||
	    bkv__enc_alloc(s) != BKV_OK ||
	    bkv__ovl_create(s) != BKV_OK ||
	    pthread_mutex_init((pthread_mutex_t *)s->in.lock, NULL) != 0) {
		if (s->in.lock)
			bkv__free(&a, s->in.lock, sizeof(pthread_mutex_t));
		s->in.lock = NULL;
		bkv_sched_destroy(s);
		return BKV_ENOMEM;
	}
	if (bkv__wait_init(s) != BKV_OK) {
		bkv_sched_destroy(s);
		return BKV_ENOMEM;
	}
	if (bkv__decide_create(s, cfg) != BKV_OK) { /* the decisions and the default cost model */
		bkv_sched_destroy(s);
		return BKV_ENOMEM;
	}
	if (cfg->size >= offsetof(bkv_sched_config, connector) + sizeof(cfg->connector) &&
	    cfg->connector && (rc = bkv__cn_create(s, cfg->connector)) != BKV_OK) {
		bkv_sched_destroy(s);
		return rc;
	}
	s->in.want_tok = tok;
	s->in.want_kv = kv;
	s->stats.size = sizeof(s->stats);
	*out = s;
	return BKV_OK;
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
	bkv__ovl_destroy(s); /* the sequences and requests it holds */
	/* every live request is in the map; zombies only on the abort list */
	for (r = s->in.abort_head; r; r = next) {
		next = r->abort_next;
		if (r->zombie)
			bkv__req_free(s, r);
	}
	if (s->in.map) {
		for (i = 0; i < s->in.map_cap; i++) {
			if (!s->in.map[i].id)
				continue;
			bkv__req_drop_seqs(s, s->in.map[i].req);
			bkv__req_free(s, s->in.map[i].req);
		}
	}
	bkv__cn_destroy(s); /* (the later list's requests are in the map) */
	if (s->pool) /* its forks' slots are the pool's again */
		bkv__pool_reserve_seqs(s->pool, 0);
	bkv__wait_destroy(s);
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
	bkv__rows_free(s);
	bkv__outs_destroy(s);
	bkv__spec_free(s);
	bkv__adapters_free(s);
	bkv__enc_free(s);
	bkv__groups_free(s);
	bkv__call_arrays_free(a, s->plan.row_cap, &s->call.arr);
	for (i = 0; i < BKV__OVL_SETS; i++)
		bkv__bufs_free(a, &s->in.spare[i]);
	bkv__decide_destroy(s);
	bkv__free(a, s, sizeof(*s));
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
	bkv__enc_stats(s, &st);
	bkv__cn_stats(s, &st);
	memcpy(stats, &st, n);
}

/* Invariant numbers (0 = consistent; 1000 + n: the pool's invariant n):
 *  1-5  the queue heap (policy.c)     6-15 run[], lanes and slots
 * 16-17 queued requests' sequences    18-22 map, inbox and counters
 * 23    open pool sequences == lanes holding one (and deferred, pinned
 *       or parked ones)
 * 24-29 the age heap (policy.c): exactly the queued requests with order > 0,
 *       each once, WAITING, in (priority, arrival) heap order
 * 30    a call's slot_mapping named a slot in a shared or cached block
 *       (sticky; checked at the call under BKV_DEBUG_LEVEL >= 1)
 * 31    the running requests' unforked branches cannot all get a sequence
 * 32    a running lane's full block (KV committed) is not in the prefix
 *       cache: every full block a step computes is indexed at its commit
 *       (a duplicate of an indexed block is swapped for it, txn_dedupe in
 *       pool.c), or still waits for the swap-in copy that brings its KV
 * 33    persistent layout: the row slots
 * 34    speculative decoding's per-step state (sched/spec.c)
 * 35-37 overlapped scheduling: the deferred-release list, the tickets, the
 *       held requests and placeholders (sched/defer.c)
 * 38    adapters: the held table counts exactly the running requests'
 *       adapters, at most max_adapters (sched/adapters.c)
 * 39    encoder inputs: the cache's references, LRU list, tokens and index
 *       (sched/encoder.c)
 * 40    KV connector: transfers in flight against the sequences they hold,
 *       parked sequences, the later list, loading requests
 *       (sched/connector.c) */