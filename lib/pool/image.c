/*
 * image.c - export and import of a sequence (moving a request between pools:
 * disaggregated prefill, migration).
 *
 * Export copies a sequence's table, tokens and chained hashes into caller
 * arrays, and in a pool with KV groups every further attention group's
 * table (lane) and the first frame of its live state unit. Import validates
 * every field of the image before it reads anything, opens a sequence and
 * appends the tokens (prefix hits are shared), then lists (source block,
 * new block) transfers for every block not hit, group by group, and the
 * state's frames; a failing append gives the opened slot back untouched
 * (slot_unopen).
 *
 *   transfers: [ group 0: n - hit ][ lane 1 ] .. [ lane k ][ state frames ]
 *
 * A lane lists only the blocks it holds once the import is trimmed (a
 * window's blocks below its next token's first are released at once: the
 * imported KV is complete). The groups must be the same on both sides:
 * group_layout is a checksum of the source's group list.
 */
#include "pool/pool.h"

#include <string.h>

/* The group list's checksum (0 for a plain pool): kind, layers, span and
 * bytes of each group, in order, mixed splitmix64-style. */
static uint64_t groups_layout(const bkv_pool *pool)
{
	uint64_t h = 0x9e3779b97f4a7c15u;
	uint32_t g;

	if (!pool->grouped)
		return 0;
	for (g = 0; g < pool->cfg.n_groups; g++) {
		const bkv_kv_group *k = &pool->groups[g];
		uint64_t v[3] = {((uint64_t)k->kind << 32) | k->layers, k->span, k->bytes};
		uint32_t j;

		for (j = 0; j < 3; j++) {
			h ^= v[j];
			h *= 0xbf58476d1ce4e5b9u;
			h ^= h >> 31;
		}
	}
	return h | 1; /* never 0, a plain pool's */
}

/* Attention groups after the first (the lanes). */
static uint32_t image_lanes(const bkv_pool *pool)
{
	return pool->grouped ? pool->n_lanes : 0;
}

/* The first frame of s's state as an export sees it: its live unit, or
 * the scratch unit an append outside a transaction wrote and nothing has
 * settled yet. BKV_ESTATE inside a transaction with the state behind. */
static int export_state(const bkv_pool *pool, const bkv__seq *s, int32_t *frame)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	int32_t u = pool->st_live[slot];

	if (pool->st_len[slot] != s->len) {
		if (pool->kv.txn_active || pool->st_scratch[slot] < 0)
			return BKV_ESTATE;
		u = pool->st_scratch[slot];
	}
	if (u < 0)
		return BKV_ESTATE;
	*frame = (int32_t)(pool->st_first + (uint32_t)u * pool->st_frames);
	return BKV_OK;
}

static void export_lanes(const bkv_pool *pool, const bkv__seq *s, bkv_seq_image *exp)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l;

	/* an empty sequence may have no lane table yet */
	for (l = 0; l < image_lanes(pool) && s->n_blocks; l++)
		memcpy(exp->group_blocks + (size_t)l * exp->cap_blocks,
		       pool->lanes[l].seqs[slot].table, s->n_blocks * sizeof(int32_t));
}

int bkv_seq_export(const bkv_pool *pool, uint32_t seq, bkv_seq_image *exp)
{
	bkv__seq *s = NULL;
	uint32_t i, bt;
	uint64_t ph = BKV__HASH_ROOT;
	int32_t frame = -1;
	int rc;

	if (!pool || !exp || exp->size < sizeof *exp)
		return BKV_EINVAL;
	if ((rc = bkv__seq_resident(pool, seq, &s)) != BKV_OK)
		return rc;
	exp->len = s->len;
	exp->n_blocks = s->n_blocks;
	exp->n_groups = pool->cfg.n_groups;
	exp->state_frames = pool->st_units ? pool->st_frames : 0;
	if (exp->cap_blocks < s->n_blocks || exp->cap_tokens < s->len)
		return BKV_E2BIG;
	if (s->n_blocks && (!exp->blocks || !exp->hashes || !exp->tokens ||
			    (image_lanes(pool) && !exp->group_blocks)))
		return BKV_EINVAL;
	if (pool->st_units && s->len && (rc = export_state(pool, s, &frame)) != BKV_OK)
		return rc;
	bt = pool->kv.bt;
	exp->block_tokens = bt;
	exp->key = s->key;
	exp->hash_seed = pool->cfg.hash_seed;
	exp->state_frame = frame;
	exp->group_layout = groups_layout(pool);
	for (i = 0; i < s->n_blocks; i++) {
		int32_t b = s->table[i];
		uint32_t n = bkv__block_len(pool, s->len, i);

		exp->blocks[i] = b;
		memcpy(exp->tokens + (size_t)i * bt, bkv__tok(&pool->kv, b),
		       n * sizeof(int32_t));
		if (n == bt) {
			ph = bkv__block_hash(pool->cfg.hash_seed, ph, s->key,
					     bkv__tok(&pool->kv, b), bt);
			exp->hashes[i] = ph;
		} else {
			exp->hashes[i] = 0;
		}
	}
	export_lanes(pool, s, exp);
	return BKV_OK;
}

/* Undo slot_open of a slot nothing was put in (import's failure path), so
 * that the slot ring, the generation and nr_seqs are as before. */
static void slot_unopen(bkv_pool *pool, bkv__seq *s)
{
	pool->ring_head = pool->ring_head ? pool->ring_head - 1 : pool->cfg.max_seqs - 1;
	BKV_ASSERT(&pool->seqs[pool->slot_ring[pool->ring_head]] == s);
	pool->nr_seqs--;
	s->state = BKV__SEQ_FREE;
}

/* Are the image's groups this pool's, with every block and the state the
 * imported sequence needs? BKV_OK or BKV_EINVAL. Counts were checked. */
static int groups_valid(const bkv_pool *pool, const bkv_seq_image *exp)
{
	uint32_t l, i;

	if (!pool->grouped)
		return exp->n_groups <= 1 ? BKV_OK : BKV_EINVAL;
	if (exp->n_groups != pool->cfg.n_groups || exp->group_layout != groups_layout(pool))
		return BKV_EINVAL;
	if (pool->st_units && (exp->state_frames != pool->st_frames || exp->state_frame < 0 ||
			       exp->state_frame > INT32_MAX - (int32_t)exp->state_frames))
		return BKV_EINVAL;
	if (image_lanes(pool) && !exp->group_blocks)
		return BKV_EINVAL;
	for (l = 0; l < image_lanes(pool); l++) {
		const int32_t *t = exp->group_blocks + (size_t)l * exp->cap_blocks;
		uint32_t first = BKV_MIN(bkv__lane_first(pool, &pool->lanes[l], exp->len),
					 exp->n_blocks);

		for (i = 0; i < exp->n_blocks; i++)
			if (t[i] < -1 || (i >= first && t[i] < 0))
				return BKV_EINVAL;
	}
	return BKV_OK;
}

/* Is an image fit to import? Every field is checked against the image's own
 * capacities and this pool's geometry before any array entry is read: the
 * image may come off a network, so its counts are not trusted. BKV_OK,
 * BKV_EINVAL (inconsistent or damaged) or BKV_E2BIG (larger than the pool). */
static int image_valid(const bkv_pool *pool, const bkv_seq_image *exp)
{
	uint32_t bt = pool->kv.bt, i;
	uint64_t ph = BKV__HASH_ROOT;

	if (exp->size < sizeof *exp || exp->block_tokens != bt || exp->len == 0 ||
	    exp->n_blocks != bkv__blocks_for(pool, exp->len))
		return BKV_EINVAL;
	/* the counts must fit the arrays the image says it carries */
	if (exp->len > exp->cap_tokens || exp->n_blocks > exp->cap_blocks || !exp->tokens ||
	    !exp->blocks)
		return BKV_EINVAL;
	if (exp->n_blocks > pool->kv.nb)
		return BKV_E2BIG;
	for (i = 0; i < exp->n_blocks; i++)
		if (exp->blocks[i] < 0)
			return BKV_EINVAL;
	if (groups_valid(pool, exp) != BKV_OK)
		return BKV_EINVAL;
	if (exp->hash_seed != pool->cfg.hash_seed)
		return BKV_OK; /* another seed: the hashes cannot be checked */
	if (!exp->hashes)
		return BKV_EINVAL;
	for (i = 0; i < exp->n_blocks; i++) {
		if ((uint64_t)(i + 1) * bt > exp->len) { /* the partial last block */
			if (exp->hashes[i] != 0)
				return BKV_EINVAL;
			break;
		}
		ph = bkv__block_hash(pool->cfg.hash_seed, ph, exp->key,
				     exp->tokens + (size_t)i * bt, bt);
		if (exp->hashes[i] != ph)
			return BKV_EINVAL;
	}
	return BKV_OK;
}

/* The imported sequence s (its tokens appended, hit tokens shared) in a
 * pool with groups: trim what its next token does not read, list each
 * lane's held blocks past the hit, then make the state the append wrote
 * live and list its frames. Returns the transfers written at t. */
static uint32_t import_groups(bkv_pool *pool, const bkv__seq *s, const bkv_seq_image *exp,
			      uint32_t hit_blocks, bkv_copy *t)
{
	const uint32_t slot = (uint32_t)(s - pool->seqs);
	uint32_t l, i, nt = 0;
	int32_t u;

	bkv__lanes_trim(pool, s); /* the imported KV is complete */
	for (l = 0; l < image_lanes(pool); l++) {
		const int32_t *src = exp->group_blocks + (size_t)l * exp->cap_blocks;
		const int32_t *dst = pool->lanes[l].seqs[slot].table;

		for (i = hit_blocks; i < s->n_blocks; i++) {
			if (dst[i] < 0)
				continue;
			BKV_ASSERT(src[i] >= 0); /* groups_valid */
			t[nt].src = src[i];
			t[nt].dst = dst[i];
			nt++;
		}
	}
	if (!pool->st_units || pool->st_len[slot] == s->len)
		return nt; /* no state, or a checkpoint covering it all */
	if (pool->kv.txn_active)
		bkv__state_advance(pool, s, s->len); /* the step's commit indexes it */
	else
		bkv__state_begin(pool, s);
	u = pool->st_live[slot];
	BKV_ASSERT(u >= 0 && pool->st_len[slot] == s->len);
	for (i = 0; i < pool->st_frames; i++) {
		t[nt].src = exp->state_frame + (int32_t)i;
		t[nt].dst = (int32_t)(pool->st_first + (uint32_t)u * pool->st_frames + i);
		nt++;
	}
	return nt;
}

int bkv_seq_import(bkv_pool *pool, const bkv_seq_image *exp, uint32_t *seq,
		   bkv_copy *transfers, uint32_t *n_transfers)
{
	uint32_t bt, i, hits = 0, id, nt = 0;
	bkv__seq *s;
	int rc;

	if (!pool || !exp || !seq || !transfers || !n_transfers)
		return BKV_EINVAL;
	if ((rc = image_valid(pool, exp)) != BKV_OK)
		return rc;
	bt = pool->kv.bt;
	s = bkv__slot_peek(pool);
	if (!s)
		return BKV_EAGAIN;
	bkv__slot_open(pool, s, exp->key);
	if (pool->grouped)
		bkv__lanes_open(pool, (uint32_t)(s - pool->seqs));
	id = bkv__seq_id(pool, s);
	rc = bkv_seq_append(pool, id, exp->tokens, exp->len, &hits);
	if (rc != BKV_OK) {
		slot_unopen(pool, s);
		return rc;
	}
	for (i = hits / bt; i < s->n_blocks; i++) {
		transfers[nt].src = exp->blocks[i];
		transfers[nt].dst = s->table[i];
		nt++;
	}
	if (pool->grouped)
		nt += import_groups(pool, s, exp, hits / bt, transfers + nt);
	*seq = id;
	*n_transfers = nt;
	return BKV_OK;
}
