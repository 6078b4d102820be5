/*
 * pool.c - the pool handle: configuration, create and destroy, the pending
 * copy lists, admission checks, stats, KV events and the scheduler's step
 * transactions.
 *
 * The pool is the library's virtual memory: block tables over the KV
 * layer's frames (kv/), with copy-on-write, a page cache of prompt prefixes
 * and a host tier. This file holds what belongs to the handle as a whole;
 * sequences are pool/seq.c, the host tier pool/swap.c, export and import
 * pool/image.c, the checker pool/check.c.
 *
 * Copy lists: device (copy-on-write), swap-out and swap-in copies queue here
 * until the host performs them and clears the list (bkv_pool_clear_copies);
 * the clear releases copy-on-write sources (kv/frames.c) and the host blocks
 * swap-in copies read.
 *
 * Transactions: the KV layer queues the blocks that fill inside a step and
 * indexes them at commit; when one's content is indexed already, it asks
 * the pool (pool_dedupe) to put the indexed block in its table.
 */
#include "pool/pool.h"

#include <string.h>

/* ---- create / destroy ---------------------------------------------------- */

void bkv_pool_config_init(bkv_pool_config *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof *cfg);
	cfg->size = sizeof *cfg;
	cfg->block_tokens = 16;
	cfg->device_blocks = 0;
	cfg->host_blocks = 0;
	cfg->max_seqs = 1024;
	cfg->watermark_blocks = 0;
	cfg->prefix_cache = 1;
	cfg->hash_seed = 0;
}

#define PC "bkv_pool_config."

/* BKV_OK, or BKV_EINVAL with the message naming the field that breaks its
 * rule (include/batchkv.h, bkv_pool_config). */
static int config_check(const bkv_pool_config *c)
{
	if (c->size < sizeof *c)
		return bkv__fail(BKV_EINVAL, PC "size = %u: must be sizeof(bkv_pool_config) = %zu"
				 " (call bkv_pool_config_init)", c->size, sizeof *c);
	if (c->block_tokens == 0 || c->block_tokens > 65536 ||
	    (c->block_tokens & (c->block_tokens - 1)) != 0)
		return bkv__fail(BKV_EINVAL, PC "block_tokens = %u: must be a power of two in 1..65536",
				 c->block_tokens);
	if (c->device_blocks == 0 || c->device_blocks > (1u << 30))
		return bkv__fail(BKV_EINVAL, PC "device_blocks = %u: must be in 1..2^30 (no default)",
				 c->device_blocks);
	/* slot_mapping holds block * block_tokens + offset as int32_t: every
	 * device slot, up to device_blocks * block_tokens - 1, must fit. */
	if ((uint64_t)c->device_blocks * c->block_tokens > BKV_MAX_TOKEN_SLOTS)
		return bkv__fail(BKV_EINVAL, PC "device_blocks = %u: device_blocks x block_tokens (%u)"
				 " must be <= 2^31 token slots", c->device_blocks, c->block_tokens);
	if (c->host_blocks > (1u << 30))
		return bkv__fail(BKV_EINVAL, PC "host_blocks = %u: must be in 0..2^30", c->host_blocks);
	if (c->max_seqs == 0 || c->max_seqs > (1u << BKV__SEQ_SLOT_BITS))
		return bkv__fail(BKV_EINVAL, PC "max_seqs = %u: must be in 1..%u", c->max_seqs,
				 1u << BKV__SEQ_SLOT_BITS);
	if (c->watermark_blocks > c->device_blocks)
		return bkv__fail(BKV_EINVAL, PC "watermark_blocks = %u: must be <= device_blocks (%u)",
				 c->watermark_blocks, c->device_blocks);
	if (c->event_capacity > (1u << 24))
		return bkv__fail(BKV_EINVAL, PC "event_capacity = %u: must be in 0..2^24",
				 c->event_capacity);
	if (c->pin_permille > 1000)
		return bkv__fail(BKV_EINVAL, PC "pin_permille = %u: must be in 0..1000", c->pin_permille);
	if (c->state_pad || c->reserved)
		return bkv__fail(BKV_EINVAL, PC "%s = %u: must be 0", c->reserved ? "reserved" : "state_pad",
				 c->reserved ? c->reserved : c->state_pad);
	/* a host cache keeps prefix-cache blocks on the host tier
	 * (docs/design.md, "The host cache") */
	if (c->host_cache > 1)
		return bkv__fail(BKV_EINVAL, PC "host_cache = %u: must be 0 or 1", c->host_cache);
	if (c->host_cache && !c->host_blocks)
		return bkv__fail(BKV_EINVAL, PC "host_cache = 1 needs host_blocks > 0");
	if (c->host_cache && !c->prefix_cache)
		return bkv__fail(BKV_EINVAL, PC "host_cache = 1 needs prefix_cache");
	return bkv__lanes_config_check(c);
}

static void pool_free_all(bkv_pool *pool)
{
	const bkv_allocator *a = &pool->alloc;
	size_t nh = pool->nh, bt = pool->kv.bt;
	uint32_t i, ms = pool->cfg.max_seqs;

	if (pool->seqs)
		for (i = 0; i < ms; i++)
			bkv__free(a, pool->seqs[i].table,
				  (size_t)pool->seqs[i].cap * sizeof(int32_t));
	for (i = 0; i < 3; i++)
		bkv__free(a, pool->copies[i].v, (size_t)pool->copies[i].cap * sizeof(bkv_copy));
	bkv__free(a, pool->xfer_ref, pool->xfer_ref ? (size_t)pool->kv.nb * sizeof(uint32_t) : 0);
	for (i = 0; i < BKV_OVERLAP_MAX_DEPTH; i++)
		bkv__free(a, pool->so_held[i].v, (size_t)pool->so_held[i].cap * sizeof(bkv_copy));
	bkv__free(a, pool->seqs, ms * sizeof(bkv__seq));
	bkv__free(a, pool->slot_ring, ms * sizeof(uint32_t));
	bkv__free(a, pool->host_tok, nh * bt * sizeof(int32_t));
	bkv__free(a, pool->host_state, nh);
	bkv__free(a, pool->host_next, nh * sizeof(int32_t));
	/* the size pool_alloc_rest allocated (the arena's frames, not units) */
	bkv__free(a, pool->scratch, bkv__pool_scratch_len(pool) * sizeof(uint32_t));
	bkv__lanes_free(pool);
	bkv__state_free(pool);
	bkv__hc_free(pool);
	bkv__kv_free(&pool->kv, a);
	bkv__free(a, pool, sizeof *pool);
}

static int pool_dedupe(void *arg, uint64_t owner, int32_t b, int32_t d, int32_t *next);

/* The host tier, sequence slots and copy lists (the KV layer is set up). */
static int pool_alloc_rest(bkv_pool *pool)
{
	const bkv_allocator *a = &pool->alloc;
	size_t nh = pool->nh, bt = pool->kv.bt;
	uint32_t i, ms = pool->cfg.max_seqs;

	if (nh > SIZE_MAX / bt / sizeof(int32_t))
		return BKV_ENOMEM;
	/* the state units are known before the KV layer is set up */
	pool->scratch = bkv__malloc(a, bkv__pool_scratch_len(pool) * sizeof(uint32_t));
	if (!pool->scratch)
		return BKV_ENOMEM;
	if (nh) {
		pool->host_next = bkv__malloc(a, nh * sizeof(int32_t));
		pool->host_state = bkv__malloc(a, nh);
		pool->host_tok = bkv__malloc(a, nh * bt * sizeof(int32_t));
		if (!pool->host_next || !pool->host_state || !pool->host_tok)
			return BKV_ENOMEM;
	}
	pool->seqs = bkv__calloc(a, ms, sizeof(bkv__seq));
	pool->slot_ring = bkv__malloc(a, ms * sizeof(uint32_t));
	if (!pool->seqs || !pool->slot_ring)
		return BKV_ENOMEM;
	/* Copy lists start with room for one CoW per sequence and one swap copy
	 * per host block; they grow (off the steady state) if a caller lets
	 * more accumulate before clearing. */
	if (bkv__copies_reserve(pool, BKV_COPY_DEVICE, ms) ||
	    (nh && (bkv__copies_reserve(pool, BKV_COPY_SWAP_OUT, (uint32_t)nh) ||
		    bkv__copies_reserve(pool, BKV_COPY_SWAP_IN, (uint32_t)nh))))
		return BKV_ENOMEM;
	for (i = 0; i < nh; i++) {
		pool->host_next[i] = i + 1 < nh ? (int32_t)(i + 1) : -1;
		pool->host_state[i] = BKV__HOST_FREE;
	}
	pool->host_free_head = nh ? 0 : -1;
	pool->host_free = (uint32_t)nh;
	for (i = 0; i < ms; i++) {
		pool->seqs[i].gen = 1;
		pool->slot_ring[i] = i;
	}
	if (bkv__lanes_init(pool) != BKV_OK)
		return BKV_ENOMEM;
	return bkv__hc_init(pool);
}

int bkv_pool_create(const bkv_pool_config *cfg, const bkv_allocator *alloc, bkv_pool **out)
{
	bkv_allocator a;
	bkv_pool *pool;
	int rc;

	bkv__error_clear();
	if (!cfg || !out)
		return bkv__fail(BKV_EINVAL, "bkv_pool_create: %s is NULL", cfg ? "out" : "cfg");
	if ((rc = config_check(cfg)) != BKV_OK)
		return rc;
	bkv__alloc_init(&a, alloc);
	pool = bkv__calloc(&a, 1, sizeof *pool);
	if (!pool)
		return BKV_ENOMEM;
	pool->alloc = a;
	pool->cfg = *cfg;
	pool->cfg.size = sizeof pool->cfg;
	pool->nh = cfg->host_blocks;
	pool->host_free_head = -1;
	/* a STATE group's arena is the frames above the attention ones */
	if (bkv__kv_init(&pool->kv, &a, cfg->block_tokens,
			 cfg->device_blocks - (uint32_t)bkv__state_arena(cfg), cfg->prefix_cache,
			 cfg->hash_seed, cfg->event_capacity) != BKV_OK ||
	    pool_alloc_rest(pool) != BKV_OK) {
		pool_free_all(pool);
		return BKV_ENOMEM;
	}
	pool->kv.dedupe = pool_dedupe;
	pool->kv.dedupe_arg = pool;
	if (pool->hc_on) {
		pool->kv.demote = bkv__hc_demote;
		pool->kv.demote_arg = pool;
	}
	*out = pool;
	return BKV_OK;
}

void bkv_pool_destroy(bkv_pool *pool)
{
	if (pool)
		pool_free_all(pool);
}

/* ---- copies, admission, reset, stats, events ------------------------------ */

uint32_t bkv_pool_pending_copies(const bkv_pool *pool, bkv_copy_kind kind, const bkv_copy **out)
{
	if (out)
		*out = NULL;
	if (!pool || (unsigned)kind > BKV_COPY_SWAP_IN)
		return 0;
	if (out)
		*out = pool->copies[kind].v;
	return pool->copies[kind].n;
}

void bkv_pool_clear_copies(bkv_pool *pool, bkv_copy_kind kind)
{
	bkv__copy_list *l;
	uint32_t i;

	if (!pool || (unsigned)kind > BKV_COPY_SWAP_IN)
		return;
	l = &pool->copies[kind];
	for (i = 0; i < l->n; i++) {
		if (kind == BKV_COPY_DEVICE) {
			pool->kv.blk[l->v[i].src].flags &= ~BKV__BLOCK_PEND_DEV;
			pool->kv.blk[l->v[i].dst].flags &= ~BKV__BLOCK_PEND_DEV;
			if (pool->kv.blk[l->v[i].src].flags & BKV__BLOCK_COPY_SRC)
				bkv__block_copy_cleared(&pool->kv, l->v[i].src);
		} else if (kind == BKV_COPY_SWAP_IN) {
			/* a state unit's frames lie above the blocks */
			if ((uint32_t)l->v[i].dst < pool->kv.nb)
				pool->kv.blk[l->v[i].dst].flags &= ~BKV__BLOCK_PEND_SWAPIN;
			if (pool->st_units)
				bkv__state_swap_in_cleared(pool, l->v[i].dst);
			if (pool->host_state[l->v[i].src] == BKV__HOST_CACHED) {
				bkv__hc_swap_in_cleared(pool, l->v[i].src);
				continue;
			}
			BKV_ASSERT(pool->host_state[l->v[i].src] == BKV__HOST_PENDING);
			pool->host_pending--;
			bkv__host_push(pool, l->v[i].src);
		} else if (pool->hc_on) { /* SWAP_OUT: a demotion is cached */
			bkv__hc_swap_out_cleared(pool, l->v[i].src, l->v[i].dst);
		}
	}
	l->n = 0;
}

void bkv__pool_forget_swap_ins(bkv_pool *pool)
{
	const bkv__copy_list *l = &pool->copies[BKV_COPY_SWAP_IN];
	uint32_t i;

	/* a destination indexed at a commit no call came before holds no KV:
	 * out of the index, children first (a block with indexed children
	 * is one of theirs' parents, dropped before it in this order) */
	for (i = l->n; i-- > 0;) {
		int32_t b = l->v[i].dst;
		bkv__block *k;

		if ((uint32_t)b >= pool->kv.nb || !BLOCK_IS_INDEXED(&pool->kv.blk[b]) ||
		    pool->kv.blk[b].kids)
			continue;
		k = &pool->kv.blk[b];
		if (BLOCK_IS_CACHED(k)) {
			bkv__lru_unlink(&pool->kv, b);
			bkv__cache_forget(&pool->kv, b);
			bkv__kv_free_push(&pool->kv, b);
		} else {
			bkv__cache_forget(&pool->kv, b);
		}
	}
	bkv_pool_clear_copies(pool, BKV_COPY_SWAP_IN);
}

uint32_t bkv_pool_available(const bkv_pool *pool)
{
	return pool ? pool->kv.nr_free + pool->kv.nr_cached + bkv__state_spare(pool) : 0;
}

int bkv_pool_can_admit(const bkv_pool *pool, uint32_t n_tokens)
{
	uint64_t avail;

	if (!pool)
		return 0;
	avail = (uint64_t)pool->kv.nr_free + pool->kv.nr_cached + bkv__state_spare(pool);
	/* a prompt's first append writes all its blocks in every lane */
	return avail >= (uint64_t)bkv__blocks_for(pool, n_tokens) * (1 + pool->n_lanes) +
				pool->cfg.watermark_blocks;
}

int bkv_pool_reset_cache(bkv_pool *pool)
{
	uint32_t i;

	if (!pool)
		return BKV_EINVAL;
	bkv__kv_reset_cache(&pool->kv);
	if (pool->st_units)
		bkv__state_reset_cache(pool);
	for (i = 0; i < pool->cfg.max_seqs; i++) {
		bkv__seq *s = &pool->seqs[i];

		if (s->state == BKV__SEQ_OPEN && s->len >= pool->kv.bt)
			s->uncached = 1; /* its chain left the cache */
	}
	if (pool->hc_on)
		bkv__hc_reset(pool);
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
	return BKV_OK;
}

_Static_assert(sizeof(((bkv_pool_stats *)0)->group_used) == BKV_MAX_GROUPS * sizeof(uint32_t),
	       "bkv_pool_stats.group_used holds BKV_MAX_GROUPS counts");

void bkv_pool_stats_get(const bkv_pool *pool, bkv_pool_stats *stats)
{
	bkv_pool_stats st;
	size_t n;

	if (!stats)
		return;
	n = stats->size ? BKV_MIN((size_t)stats->size, sizeof st) : sizeof st;
	memset(&st, 0, sizeof st);
	if (pool) {
		st.block_tokens = pool->kv.bt;
		st.device_blocks = pool->kv.nb - pool->kv.nr_lent;
		st.host_blocks = pool->nh;
		st.nr_free = pool->kv.nr_free;
		st.nr_used = pool->kv.nr_used;
		st.nr_cached = pool->kv.nr_cached;
		st.nr_indexed = pool->kv.nr_indexed;
		st.host_free = pool->host_free;
		st.host_used = pool->nh - pool->host_free;
		st.nr_seqs = pool->nr_seqs;
		st.nr_swapped = pool->nr_swapped;
		st.tokens = pool->kv.tokens;
		st.waste_slots = (uint64_t)pool->kv.nr_used * pool->kv.bt - pool->kv.tokens;
		st.hit_tokens = pool->hit_tokens;
		st.miss_tokens = pool->miss_tokens;
		st.evictions = pool->kv.evictions;
		st.cow_copies = pool->cow_copies;
		st.swap_out_blocks = pool->swap_out_blocks;
		st.swap_in_blocks = pool->swap_in_blocks;
		st.events = pool->kv.ev_seq;
		st.events_dropped = pool->kv.ev_dropped;
		st.dup_blocks = pool->kv.dedup_blocks;
		st.state_units = pool->st_held;
		st.state_free = pool->st_nr_free;
		st.state_checkpoints = pool->st_nr_indexed;
		st.state_frames = pool->st_units ? pool->st_frames : 0;
		st.state_hits = pool->st_ckpt_hits;
		st.state_evictions = pool->st_evictions;
		st.host_cached = pool->hc_cached;
		st.host_demoting = pool->hc_demoting;
		st.host_demoted = pool->hc_demoted;
		st.host_kept = pool->hc_kept;
		st.host_skipped = pool->hc_skipped;
		st.host_hit_blocks = pool->hc_hits;
		st.host_evictions = pool->hc_evictions;
		st.n_groups = 1 + pool->n_lanes;
		if (pool->kv.grp) {
			memcpy(st.group_used, pool->kv.grp_used, sizeof st.group_used);
			memcpy(st.group_cached, pool->kv.grp_cached, sizeof st.group_cached);
		} else {
			st.group_used[0] = pool->kv.nr_used;
			st.group_cached[0] = pool->kv.nr_cached;
		}
	}
	st.size = (uint32_t)n;
	memcpy(stats, &st, n);
}

uint32_t bkv_pool_drain_events(bkv_pool *pool, bkv_kv_event *out, uint32_t max)
{
	if (!pool || !out)
		return 0;
	return bkv__kv_events(&pool->kv, out, max);
}

/* ---- the eviction policy (for the decision layer) -------------------------- */

int bkv__pool_value_on(bkv_pool *pool, double p0, double p1)
{
	if (!pool->kv.index)
		return BKV_OK; /* no prefix cache: nothing is ever evicted */
	return bkv__kv_value_on(&pool->kv, &pool->alloc, p0, p1);
}

void bkv__pool_value_off(bkv_pool *pool)
{
	bkv__kv_value_off(&pool->kv, &pool->alloc);
}

int bkv__pool_seg_on(bkv_pool *pool)
{
	if (!pool->kv.index)
		return BKV_OK; /* no prefix cache: nothing is ever evicted */
	return bkv__kv_seg_on(&pool->kv, &pool->alloc);
}

void bkv__pool_seg_off(bkv_pool *pool)
{
	bkv__kv_seg_off(&pool->kv, &pool->alloc);
}

/* ---- step transactions (for the scheduler) -------------------------------- */

void bkv__pool_txn_begin(bkv_pool *pool)
{
	bkv__kv_txn_begin(&pool->kv);
	if (pool->grouped)
		bkv__lanes_txn_end(pool, 0); /* a fresh serial, nothing noted */
}

/* The KV layer's duplicate hook: queued block b, noted as sequence slot <<
 * 32 | table position, has the content of indexed block d. Put d in b's
 * place when that table still holds b there (the KV layer frees b). */
static int pool_dedupe(void *arg, uint64_t owner, int32_t b, int32_t d, int32_t *next)
{
	bkv_pool *pool = arg;
	uint32_t slot = (uint32_t)(owner >> 32), pos = (uint32_t)owner;
	bkv__seq *s;

	if (owner >> 52) { /* a lane's block (pool/lanes.c) */
		*next = -1;
		return bkv__lanes_dedupe(pool, owner, b, d);
	}
	if (slot >= pool->cfg.max_seqs)
		return 0;
	s = &pool->seqs[slot];
	if (s->state != BKV__SEQ_OPEN || pos >= s->n_blocks || s->table[pos] != b ||
	    s->key != pool->kv.blk[d].key)
		return 0;
	s->table[pos] = d;
	bkv__seq_dirty(s, pos);
	*next = pos + 1 < s->n_blocks ? s->table[pos + 1] : -1;
	if (pool->n_lanes)
		bkv__lanes_reparent(pool, slot, pos, b, d);
	return 1;
}

void bkv__pool_txn_commit(bkv_pool *pool)
{
	bkv__kv_txn_end(&pool->kv, 1);
	if (pool->grouped)
		bkv__lanes_txn_end(pool, 1);
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
}

void bkv__pool_txn_abort(bkv_pool *pool)
{
	bkv__kv_txn_end(&pool->kv, 0);
	if (pool->grouped)
		bkv__lanes_txn_end(pool, 0);
	BKV_ASSERT_EXPENSIVE(bkv_pool_check(pool) == 0);
}
