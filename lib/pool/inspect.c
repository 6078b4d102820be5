/*
 * inspect.c - reading a pool from outside: its memory by structure
 * (bkv_pool_memory_get) and one device block's state (bkv_block_info_get).
 *
 * Both calls only read struct bkv_pool and its bkv__block records (lib/
 * internal.h); they exist so that benchmarks, examples and engines can see
 * what the pool holds without its internal header. The byte figures repeat
 * the sizes bkv_pool_create allocates and pool_free_all (pool.c) frees, one
 * figure per allocation (the KV groups' structures through the byte counts
 * each owner keeps beside its free function), so total equals the bytes
 * live in the pool's allocator (the inspect test checks it against a
 * counting allocator, with and without groups).
 *
 * A block's fields are reported only where they mean something: key and hash
 * while it is indexed, parent, fill and tokens while it is not free (a free
 * block's record keeps whatever its last user left there).
 */
#include "pool/pool.h"

/* The size convention of bkv_pool_stats_get: fill min(size, ours) bytes, 0
 * meaning all of ours. */
static size_t want(uint32_t size, size_t ours)
{
	return size ? BKV_MIN((size_t)size, ours) : ours;
}

int bkv_pool_memory_get(const bkv_pool *pool, bkv_pool_memory *mem)
{
	bkv_pool_memory m;
	uint64_t nb, nh, bt, tables = 0, copies = 0, lane_slot, lane_entries, st_slot, st_units;
	uint32_t i;
	size_t n;

	if (!pool || !mem)
		return BKV_EINVAL;
	n = want(mem->size, sizeof m);
	nb = pool->kv.nb;
	nh = pool->nh;
	bt = pool->kv.bt;
	for (i = 0; i < pool->cfg.max_seqs; i++)
		tables += pool->seqs[i].cap;
	for (i = 0; i < 3; i++)
		copies += pool->copies[i].cap;
	for (i = 0; i < BKV_OVERLAP_MAX_DEPTH; i++)
		copies += pool->so_held[i].cap;
	bkv__lanes_bytes(pool, &lane_slot, &lane_entries);
	bkv__state_bytes(pool, &st_slot, &st_units);

	memset(&m, 0, sizeof m);
	m.block_bytes = (uint32_t)sizeof(bkv__block);
	m.seq_slot_bytes = (uint32_t)(sizeof(bkv__seq) + sizeof(uint32_t) + lane_slot + st_slot);
	m.index_slots = pool->kv.index ? pool->kv.index_mask + 1 : 0;
	m.index_used = pool->kv.nr_indexed;
	m.blocks = nb * sizeof(bkv__block) + bkv__kv_value_bytes(&pool->kv) +
		   bkv__ck_bytes(&pool->kv) + st_units +
		   (pool->kv.grp ? nb : 0) + /* each frame's group (kv/frames.c) */
		   (pool->xfer_ref ? nb * sizeof(uint32_t) : 0); /* (pool/connect.c) */
	m.device_tokens = bkv__kv_tok_bytes(nb, bt);
	m.index = (uint64_t)m.index_slots * sizeof(bkv__islot) + bkv__kv_lru_bytes(&pool->kv);
	m.txn_queue = pool->kv.txn_pending ? nb * sizeof(int32_t) : 0;
	m.txn_owners = pool->kv.txn_owner ? nb * sizeof(uint64_t) : 0;
	m.check_scratch = bkv__pool_scratch_len(pool) * sizeof(uint32_t);
	m.host = nh * (sizeof(int32_t) + sizeof(uint8_t) + bt * sizeof(int32_t));
	if (pool->hc_on) /* the host cache's records and index (pool/hcache.c) */
		m.host += nh * (3 * sizeof(uint64_t) + 3 * sizeof(int32_t) + 1) +
			  ((size_t)pool->hc_mask + 1) * sizeof(bkv__islot) + pool->kv.nb;
	m.seq_slots = (uint64_t)pool->cfg.max_seqs * m.seq_slot_bytes;
	m.block_tables = (tables + lane_entries) * sizeof(int32_t);
	m.copy_lists = copies * sizeof(bkv_copy);
	m.event_ring = pool->kv.ev ? (uint64_t)pool->cfg.event_capacity * sizeof(bkv_kv_event) : 0;
	m.total = sizeof *pool + m.blocks + m.device_tokens + m.index + m.txn_queue +
		  m.txn_owners + m.check_scratch + m.host + m.seq_slots + m.block_tables +
		  m.copy_lists + m.event_ring;
	m.size = (uint32_t)n;
	memcpy(mem, &m, n);
	return BKV_OK;
}

int bkv_block_info_get(const bkv_pool *pool, int32_t block, bkv_block_info *info)
{
	bkv_block_info bi;
	const bkv__block *k;
	size_t n;

	if (!pool || !info || block < 0 || (uint32_t)block >= pool->kv.nb ||
	    bkv__ck_is_lent(&pool->kv, (uint32_t)block))
		return BKV_EINVAL; /* (a lent frame is a state unit's) */
	n = want(info->size, sizeof bi);
	k = &pool->kv.blk[block];

	memset(&bi, 0, sizeof bi);
	bi.state = BLOCK_IS_PINNED(k)	 ? BKV_BLOCK_PINNED
		   : BLOCK_IS_INDEXED(k) ? BKV_BLOCK_CACHED
					 : BKV_BLOCK_FREE;
	bi.ref_count = k->ref;
	bi.indexed = BLOCK_IS_INDEXED(k);
	bi.copy_pending =
		(k->flags & (BKV__BLOCK_PEND_DEV | BKV__BLOCK_PEND_SWAPIN | BKV__BLOCK_COPY_SRC)) != 0;
	bi.kids = k->kids;
	bi.parent = -1;
	if (bi.state != BKV_BLOCK_FREE) {
		bi.fill = k->fill;
		bi.parent = k->parent;
		if (k->fill)
			bi.tokens = bkv__tok(&pool->kv, block);
	}
	if (bi.indexed) {
		bi.key = k->key;
		bi.hash = k->hash;
	}
	bi.size = (uint32_t)n;
	memcpy(info, &bi, n);
	return BKV_OK;
}
