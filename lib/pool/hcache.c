/*
 * hcache.c - the host cache: cached blocks the device evicts, kept in host
 * memory (bkv_pool_config.host_cache) and reloaded on a later prefix hit
 * instead of being recomputed.
 *
 * The host tier's blocks serve two users. A swapped-out sequence owns some
 * (pool/swap.c, BKV__HOST_USED). The host cache holds others, each the KV
 * of one full block under its chain hash, as the device index would:
 *
 *   device cached --evict, demote--> DEMOTING --swap-out copy cleared--> CACHED
 *        ^                          (a pending                     (host index,
 *        |                           device->host copy)              host LRU)
 *        +------ prefix hit: a device block, a host->device copy ------+
 *
 * Demotion. When the device cache evicts block b (kv/cache.c calls
 * bkv__hc_demote through bkv__kv.demote), the pool records a swap-out copy
 * b -> h into a host block h, unless the host holds b's content already
 * (inclusive: a reload leaves its host copy in place, so a block reloaded
 * and evicted again costs no second copy), or b is not worth the copy by
 * the scheduler's prices (worth_keeping: its chance of coming back times
 * what a reload saves, against what the copy costs), or b's content is not yet
 * safe to copy (b is still the destination of a pending copy, or the source
 * of an earlier demotion). The copy list order (swap_out, swap_in, device)
 * makes the host read b before anything the same call writes into it: the
 * taker's new KV is computed after the copies. h becomes findable only when
 * the host has performed the copy (bkv_pool_clear_copies of SWAP_OUT); a
 * failed call forgets it (bkv__hc_forget_demotions).
 *
 * Reload. A prefix lookup that runs out of device hits goes on in the host
 * index (bkv__hc_lookup_run: the same chain hash, verified against the
 * host's token ids, the key and the parent's hash). Each host hit takes a
 * device block with a host -> device copy (the swap-in list); the host
 * block stays cached, off the LRU while copies read it (hc_reads). A reload
 * needs no pending device copy (the rule swap-in follows, pool/swap.c).
 *
 * KV groups. Every group's evicted block is demoted on its own, under its
 * chain hash (a group's block at position i is the child of group 0's
 * block i - 1, so its parent hash is that block's); a hit stays whole at
 * the reload instead: bkv__hc_fit_lanes (pool/hclanes.c) shortens group
 * 0's host run until every group holds what a sequence ending there reads,
 * and a STATE group's device checkpoint ends it (states are not kept on
 * the host). docs/design.md, "The host cache".
 *
 * Room. Host blocks come from the host free list; when it is empty the
 * host cache's LRU head is dropped (bkv__hc_evict), so a swap-out never
 * fails for want of room the host cache holds. Only an unread CACHED block
 * is dropped; DEMOTING ones wait for their copies. Every operation is O(1)
 * per block; nothing scans the host tier.
 *
 * Events (bkv_kv_event.medium = BKV_MEDIUM_HOST): STORED when a block is
 * demoted (its copy pending), REMOVED when the host cache drops it or a
 * failed call forgets it.
 */
#include "pool/hc.h"

#include <string.h>

/* ---- create / destroy --------------------------------------------------- */

int bkv__hc_init(bkv_pool *pool)
{
	const bkv_allocator *a = &pool->alloc;
	const size_t nh = pool->nh;
	size_t cap = 2, i;

	pool->hc_head = pool->hc_tail = -1;
	if (!pool->cfg.host_cache || !nh || !pool->kv.index)
		return BKV_OK;
	while (cap < 2 * nh)
		cap *= 2;
	pool->hc_mask = (uint32_t)(cap - 1); /* the index's size, also for a free */
	pool->hc_hash = bkv__malloc(a, nh * sizeof(uint64_t));
	pool->hc_key = bkv__malloc(a, nh * sizeof(uint64_t));
	pool->hc_phash = bkv__malloc(a, nh * sizeof(uint64_t));
	pool->hc_prev = bkv__malloc(a, nh * sizeof(int32_t));
	pool->hc_next = bkv__malloc(a, nh * sizeof(int32_t));
	pool->hc_reads = bkv__malloc(a, nh * sizeof(uint32_t));
	pool->hc_src = bkv__calloc(a, pool->kv.nb, 1);
	pool->hc_reused = bkv__calloc(a, nh, 1);
	pool->hc_index = bkv__malloc(a, cap * sizeof(bkv__islot));
	if (!pool->hc_hash || !pool->hc_key || !pool->hc_phash || !pool->hc_prev ||
	    !pool->hc_next || !pool->hc_reads || !pool->hc_reused || !pool->hc_src ||
	    !pool->hc_index)
		return BKV_ENOMEM;
	for (i = 0; i < nh; i++) {
		pool->hc_prev[i] = pool->hc_next[i] = -1;
		pool->hc_reads[i] = 0;
	}
	for (i = 0; i < cap; i++)
		pool->hc_index[i].b = -1, pool->hc_index[i].tag = 0;
	pool->hc_on = 1;
	return BKV_OK;
}

void bkv__hc_free(bkv_pool *pool)
{
	const bkv_allocator *a = &pool->alloc;
	const size_t nh = pool->nh;

	if (pool->hc_index)
		bkv__free(a, pool->hc_index, ((size_t)pool->hc_mask + 1) * sizeof(bkv__islot));
	bkv__free(a, pool->hc_hash, nh * sizeof(uint64_t));
	bkv__free(a, pool->hc_key, nh * sizeof(uint64_t));
	bkv__free(a, pool->hc_phash, nh * sizeof(uint64_t));
	bkv__free(a, pool->hc_prev, nh * sizeof(int32_t));
	bkv__free(a, pool->hc_next, nh * sizeof(int32_t));
	bkv__free(a, pool->hc_reads, nh * sizeof(uint32_t));
	bkv__free(a, pool->hc_src, pool->kv.nb);
	bkv__free(a, pool->hc_reused, nh);
}

/* ---- index and LRU -------------------------------------------------------- */

static int32_t hc_find(const bkv_pool *pool, uint64_t hash)
{
	uint32_t mask = pool->hc_mask, tag = bkv__index_tag(hash), i = tag & mask;

	for (;;) {
		const bkv__islot *e = &pool->hc_index[i];

		if (e->b < 0 || (e->tag == tag && pool->hc_hash[e->b] == hash))
			return e->b;
		i = (i + 1) & mask;
	}
}

int32_t bkv__hc_find(const bkv_pool *pool, uint64_t hash)
{
	return pool->hc_on ? hc_find(pool, hash) : -1;
}

static void lru_push(bkv_pool *pool, int32_t h)
{
	pool->hc_prev[h] = pool->hc_tail;
	pool->hc_next[h] = -1;
	if (pool->hc_tail >= 0)
		pool->hc_next[pool->hc_tail] = h;
	else
		pool->hc_head = h;
	pool->hc_tail = h;
	pool->hc_lru++;
}

static void lru_unlink(bkv_pool *pool, int32_t h)
{
	int32_t p = pool->hc_prev[h], n = pool->hc_next[h];

	if (p >= 0)
		pool->hc_next[p] = n;
	else
		pool->hc_head = n;
	if (n >= 0)
		pool->hc_prev[n] = p;
	else
		pool->hc_tail = p;
	pool->hc_prev[h] = pool->hc_next[h] = -1;
	pool->hc_lru--;
}

/* A cached, unread block leaves the host cache for the free list. */
static void hc_drop(bkv_pool *pool, int32_t h)
{
	BKV_ASSERT(pool->host_state[h] == BKV__HOST_CACHED && pool->hc_reads[h] == 0);
	lru_unlink(pool, h);
	bkv__islot_remove(pool->hc_index, pool->hc_mask, h, bkv__index_tag(pool->hc_hash[h]));
	pool->hc_cached--;
	bkv__event_host(&pool->kv, BKV_EVENT_REMOVED, h, pool->hc_hash[h], 0, 0, 0);
	bkv__host_push(pool, h);
}

void bkv__hc_evict(bkv_pool *pool)
{
	BKV_ASSERT(pool->hc_head >= 0);
	hc_drop(pool, pool->hc_head);
	pool->hc_evictions++;
}

/* ---- demotion -------------------------------------------------------------- */

/* Is evicted block b worth a host copy? With the scheduler's prices: when
 * the chance that it comes back times what a reload saves - recomputing b
 * at its depth, less the reload's link time - exceeds what the copy costs
 * (the link's time, or 0 when the host overlaps copies with its kernels).
 * The chance is the host cache's own record: the share of its demotions
 * reloaded at least once, decayed, from a prior of 1/2; while the rule
 * refuses, a probe run of evictions is demoted anyway so that it can
 * learn. The depth is known with the value records
 * (eviction by value), else taken as 0, which undervalues deep blocks.
 * Without prices every block is demoted. */
static int worth_keeping(const bkv_pool *pool, int32_t b)
{
	double save, p;

	if (!pool->hc_priced)
		return 1;
	save = pool->hc_p0 - pool->hc_load;
	if (pool->kv.val)
		save += pool->hc_p1 * pool->kv.val[b].depth;
	p = (pool->hc_rel + 1.0) / (pool->hc_dem + 2.0);
	if (p * save > pool->hc_store)
		return 1;
	/* explore: one run of BKV__HC_PROBE consecutive evictions in
	 * BKV__HC_PROBE_EVERY is demoted anyway (whole runs, because the LRU
	 * gives up a chain's blocks together and a reload needs the run from
	 * the device's last hit on), so the estimate can learn */
	return (pool->kv.evictions / BKV__HC_PROBE) % BKV__HC_PROBE_EVERY == 0;
}

/* A demotion is counted; the counts halve every nh demotions, so the
 * chance follows the traffic. */
static void count_demotion(bkv_pool *pool, int32_t h)
{
	pool->hc_reused[h] = 0;
	if ((pool->hc_dem += 1.0) >= 2.0 * pool->nh) {
		pool->hc_dem *= 0.5;
		pool->hc_rel *= 0.5;
	}
}

void bkv__hc_demote(void *arg, int32_t b)
{
	bkv_pool *pool = arg;
	bkv__kv *kv = &pool->kv;
	bkv__block *k = &kv->blk[b];
	const uint32_t bt = kv->bt;
	int32_t h;

	if ((k->flags & (BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN)) || pool->hc_src[b] ||
	    !worth_keeping(pool, b)) {
		pool->hc_skipped++;
		return;
	}
	h = hc_find(pool, k->hash);
	if (h >= 0 && pool->hc_key[h] == k->key) { /* the host has it already */
		if (pool->hc_reads[h] == 0) {
			lru_unlink(pool, h);
			lru_push(pool, h);
		}
		pool->hc_kept++;
		return;
	}
	/* no host block to spare, or no room left in the swap-out list (it
	 * has one entry per host block; more only while a closed swapped
	 * sequence's copies wait, and an eviction cannot grow it) */
	if ((pool->host_free == 0 && pool->hc_head < 0) ||
	    pool->copies[BKV_COPY_SWAP_OUT].n == pool->copies[BKV_COPY_SWAP_OUT].cap) {
		pool->hc_skipped++;
		return;
	}
	h = bkv__host_pop(pool);
	pool->host_state[h] = BKV__HOST_DEMOTING;
	pool->hc_demoting++;
	memcpy(pool->host_tok + (size_t)h * bt, bkv__tok(kv, b), bt * sizeof(int32_t));
	pool->hc_hash[h] = k->hash;
	pool->hc_key[h] = k->key;
	pool->hc_phash[h] = k->parent >= 0 ? kv->blk[k->parent].hash : BKV__HASH_ROOT;
	count_demotion(pool, h);
	bkv__copy_push(pool, BKV_COPY_SWAP_OUT, b, h);
	pool->hc_src[b] = 1;
	pool->hc_demoted++;
	bkv__event_host(kv, BKV_EVENT_STORED, h, k->hash, pool->hc_phash[h], k->parent >= 0,
			k->key);
}

void bkv__hc_swap_out_cleared(bkv_pool *pool, int32_t src, int32_t h)
{
	int32_t o;

	if ((uint32_t)src < pool->kv.nb)
		pool->hc_src[src] = 0;
	if (pool->host_state[h] != BKV__HOST_DEMOTING)
		return;
	pool->hc_demoting--;
	o = hc_find(pool, pool->hc_hash[h]);
	if (o >= 0) { /* demoted twice in one call: keep the first */
		bkv__event_host(&pool->kv, BKV_EVENT_REMOVED, h, pool->hc_hash[h], 0, 0, 0);
		bkv__host_push(pool, h);
		return;
	}
	pool->host_state[h] = BKV__HOST_CACHED;
	pool->hc_cached++;
	bkv__islot_insert(pool->hc_index, pool->hc_mask, h, bkv__index_tag(pool->hc_hash[h]));
	lru_push(pool, h);
}

void bkv__hc_forget_list(bkv_pool *pool, const bkv__copy_list *l)
{
	uint32_t i;

	if (!pool->hc_on)
		return;
	for (i = 0; i < l->n; i++) {
		int32_t src = l->v[i].src, h = l->v[i].dst;

		if ((uint32_t)src < pool->kv.nb)
			pool->hc_src[src] = 0;
		if (pool->host_state[h] != BKV__HOST_DEMOTING)
			continue;
		pool->hc_demoting--;
		bkv__event_host(&pool->kv, BKV_EVENT_REMOVED, h, pool->hc_hash[h], 0, 0, 0);
		bkv__host_push(pool, h);
	}
}

void bkv__hc_forget_demotions(bkv_pool *pool)
{
	bkv__hc_forget_list(pool, &pool->copies[BKV_COPY_SWAP_OUT]);
}

/* ---- reload ---------------------------------------------------------------- */

int32_t bkv__hc_lookup(const bkv_pool *pool, uint64_t ph, uint64_t key, const int32_t *tokens)
{
	const uint32_t bt = pool->kv.bt;
	int32_t c = hc_find(pool, bkv__block_hash(pool->kv.hash_seed, ph, key, tokens, bt));

	if (c < 0 || pool->hc_key[c] != key || pool->hc_phash[c] != ph ||
	    memcmp(pool->host_tok + (size_t)c * bt, tokens, bt * sizeof(int32_t)) != 0)
		return -1;
	return c;
}

uint32_t bkv__hc_lookup_run(const bkv_pool *pool, uint64_t ph, uint64_t key,
			    const int32_t *tokens, uint32_t max, int32_t *out)
{
	uint32_t n;

	if (!pool->hc_on || pool->hc_cached == 0 || pool->copies[BKV_COPY_DEVICE].n)
		return 0;
	for (n = 0; n < max; n++) {
		int32_t c = bkv__hc_lookup(pool, ph, key, tokens + (size_t)n * pool->kv.bt);

		if (c < 0)
			break;
		out[n] = c;
		ph = pool->hc_hash[c];
	}
	return n;
}

/* Host hit h will be read: off the LRU, so that no eviction the reloads'
 * takes cause (a demotion may need a host block) can drop it. */
void bkv__hc_hold(bkv_pool *pool, int32_t h)
{
	BKV_ASSERT(pool->host_state[h] == BKV__HOST_CACHED);
	if (!pool->hc_reused[h]) { /* a demotion that paid off */
		pool->hc_reused[h] = 1;
		pool->hc_rel += 1.0;
	}
	if (pool->hc_reads[h]++ == 0)
		lru_unlink(pool, h);
}

/* A device block after parent with host block h's tokens and a pending
 * host->device copy (room reserved; h held). */
int32_t bkv__hc_reload(bkv_pool *pool, int32_t h, int32_t parent)
{
	const uint32_t bt = pool->kv.bt;
	int32_t d;

	d = bkv__block_take(&pool->kv, parent);
	memcpy(bkv__tok(&pool->kv, d), pool->host_tok + (size_t)h * bt,
	       bt * sizeof(int32_t));
	pool->kv.blk[d].fill = bt;
	pool->kv.blk[d].flags |= BKV__BLOCK_PEND_SWAPIN;
	pool->kv.tokens += bt;
	bkv__copy_push(pool, BKV_COPY_SWAP_IN, h, d);
	pool->hc_hits++;
	return d;
}

void bkv__hc_hold_run(bkv_pool *pool, const bkv__seq *s, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		bkv__hc_hold(pool, s->table[s->n_blocks + i]);
}

void bkv__hc_reload_run(bkv_pool *pool, bkv__seq *s, uint32_t n)
{
	const uint32_t at = s->n_blocks;
	uint32_t i;

	for (i = 0; i < n; i++) {
		int32_t h = s->table[at + i], d, parent = at + i ? s->table[at + i - 1] : -1;

		d = bkv__hc_reload(pool, h, parent);
		s->table[at + i] = d;
		s->n_blocks = at + i + 1;
		/* indexed under the hash the host lookup verified (a
		 * transaction's commit hashes its queue anyway) */
		if (pool->kv.txn_active || (parent >= 0 && !BLOCK_IS_INDEXED(&pool->kv.blk[parent])))
			bkv__seq_block_filled(pool, s, at + i);
		else
			(void)bkv__cache_add_hashed(&pool->kv, d, s->key, pool->hc_hash[h]);
	}
}

void bkv__hc_swap_in_cleared(bkv_pool *pool, int32_t h)
{
	BKV_ASSERT(pool->host_state[h] == BKV__HOST_CACHED && pool->hc_reads[h] > 0);
	if (--pool->hc_reads[h] == 0)
		lru_push(pool, h);
}

/* ---- reset and check ------------------------------------------------------- */

void bkv__hc_reset(bkv_pool *pool)
{
	while (pool->hc_head >= 0)
		hc_drop(pool, pool->hc_head);
}

int bkv__hc_check(const bkv_pool *pool, uint32_t *sc)
{
	const bkv__copy_list *so = &pool->copies[BKV_COPY_SWAP_OUT];
	const bkv__copy_list *si = &pool->copies[BKV_COPY_SWAP_IN];
	uint32_t i, j, n = 0, cached = 0, demoting = 0, marked = 0;
	int32_t h, p = -1;

	if (!pool->hc_on)
		return pool->hc_cached || pool->hc_demoting || pool->hc_head >= 0 ? CHECK_HOST
										   : CHECK_OK;
	memset(sc, 0, (size_t)pool->nh * sizeof *sc);
	for (i = 0; i < si->n; i++)
		if (pool->host_state[si->v[i].src] == BKV__HOST_CACHED)
			sc[si->v[i].src]++;
	for (h = pool->hc_head; h >= 0; p = h, h = pool->hc_next[h], n++)
		if (n >= pool->nh || pool->hc_prev[h] != p ||
		    pool->host_state[h] != BKV__HOST_CACHED || pool->hc_reads[h] != 0)
			return CHECK_HOST;
	if (p != pool->hc_tail || n != pool->hc_lru)
		return CHECK_HOST;
	/* a demoting block is a pending swap-out's destination (a closed
	 * swapped sequence's stale copy may name it first: the host performs
	 * both, the demotion last) */
	for (i = 0; i < so->n; i++)
		if (pool->host_state[so->v[i].dst] == BKV__HOST_DEMOTING)
			sc[so->v[i].dst] = 1;
	for (j = 0; j < BKV_OVERLAP_MAX_DEPTH; j++) /* the steps in flight's */
		for (i = 0; i < pool->so_held[j].n; i++)
			if (pool->host_state[pool->so_held[j].v[i].dst] == BKV__HOST_DEMOTING)
				sc[pool->so_held[j].v[i].dst] = 1;
	for (i = 0; i < pool->nh; i++) {
		if (pool->host_state[i] == BKV__HOST_DEMOTING && (demoting++, sc[i] != 1))
			return CHECK_HOST;
		if (pool->host_state[i] != BKV__HOST_CACHED)
			continue;
		cached++;
		if (pool->hc_reads[i] != sc[i] || hc_find(pool, pool->hc_hash[i]) != (int32_t)i)
			return CHECK_HOST;
	}
	/* one marked source per demotion */
	for (i = 0; i < pool->kv.nb; i++)
		marked += pool->hc_src[i];
	if (cached != pool->hc_cached || demoting != pool->hc_demoting || marked != demoting)
		return CHECK_HOST;
	for (i = 0, n = 0; i < pool->nh; i++)
		n += pool->host_state[i] == BKV__HOST_CACHED && pool->hc_reads[i] == 0;
	if (n != pool->hc_lru)
		return CHECK_HOST;
	for (i = 0, n = 0; i <= pool->hc_mask; i++)
		n += pool->hc_index[i].b >= 0;
	return n == cached ? CHECK_OK : CHECK_HOST;
}
