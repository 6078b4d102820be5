/*
 * image.c - export and import of a sequence (moving a request between pools:
 * disaggregated prefill, migration).
 *
 * Export copies a sequence's table, tokens and chained hashes into caller
 * arrays. Import validates every field of the image before it reads
 * anything, opens a sequence and appends the tokens (prefix hits are
 * shared), then lists (source block, new block) transfers for every block
 * not hit; a failing append gives the opened slot back untouched
 * (slot_unopen).
 */
#include "pool/pool.h"

#include <string.h>

int bkv_seq_export(const bkv_pool *pool, uint32_t seq, bkv_seq_image *exp)
{
	bkv__seq *s = NULL;
	uint32_t i, bt;
	uint64_t ph = BKV__HASH_ROOT;
	int rc;

	if (!pool || !exp || exp->size < sizeof *exp)
		return BKV_EINVAL;
	if (pool->grouped) /* images carry one group's table (docs/design.md) */
		return BKV_ESTATE;
	if ((rc = bkv__seq_resident(pool, seq, &s)) != BKV_OK)
		return rc;
	exp->len = s->len;
	exp->n_blocks = s->n_blocks;
	if (exp->cap_blocks < s->n_blocks || exp->cap_tokens < s->len)
		return BKV_E2BIG;
	if (s->n_blocks && (!exp->blocks || !exp->hashes || !exp->tokens))
		return BKV_EINVAL;
	bt = pool->kv.bt;
	exp->block_tokens = bt;
	exp->key = s->key;
	exp->hash_seed = pool->cfg.hash_seed;
	for (i = 0; i < s->n_blocks; i++) {
		int32_t b = s->table[i];
		uint32_t n = bkv__block_len(pool, s->len, i);

		exp->blocks[i] = b;
		memcpy(exp->tokens + (size_t)i * bt, pool->kv.tok + (size_t)b * bt,
		       n * sizeof(int32_t));
		if (n == bt) {
			ph = bkv__block_hash(pool->cfg.hash_seed, ph, s->key,
					     pool->kv.tok + (size_t)b * bt, bt);
			exp->hashes[i] = ph;
		} else {
			exp->hashes[i] = 0;
		}
	}
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
	*seq = id;
	*n_transfers = nt;
	return BKV_OK;
}
