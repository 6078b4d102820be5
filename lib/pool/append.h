/*
 * append.h - the scheduler's one-token appends (decode rows), made through
 * a cursor over the pool (pool/seq.c): an inline case for a token landing
 * inside the sequence's last block, its KV groups' case, and the general
 * path behind both. Included by pool.h, after the types it uses.
 */
#ifndef BKV_POOL_APPEND_H
#define BKV_POOL_APPEND_H

/* The scheduler's one-token appends (decode rows), made through a cursor
 * over the pool. bkv__append_fast, and when it declines bkv__append_flush
 * then bkv__seq_append1_slow, together have the same effects and answers
 * as bkv_seq_append(pool, seq, &token, 1, hit). The common case - the
 * token lands inside the sequence's last block, which is private,
 * unindexed, filled exactly to the end and does not fill up with it - is
 * handled inline (bkv__append_fast), with the pool's fields held in the
 * cursor (stores through the batch arrays cannot make the compiler reload
 * them), the id decoded once, no other argument checks, and the token
 * counters (pool->kv.tokens, miss_tokens) added up in the cursor:
 * bkv__append_flush adds them to the pool, and must run before any other
 * pool call (the counters are part of the pool's invariants). Everything
 * else (a block boundary, a block filling up, copy-on-write, errors) goes
 * through bkv__seq_append1_slow (pool/seq.c). On BKV_OK *out is the sequence
 * after the append (the batch reads its table); on an error nothing
 * changed. */
int bkv__seq_append1_slow(bkv_pool *pool, uint32_t seq, int32_t token, uint32_t *hit,
			  const bkv__seq **out);
/* Grow an open sequence's table to n_blocks entries now (at most the pool's
 * block count), so that appends up to that length never reallocate it
 * (inside later steps). Best effort: on ENOMEM nothing changes and an append
 * grows the table as before. */
void bkv__seq_reserve(bkv_pool *pool, uint32_t seq, uint32_t n_blocks);

/* bkv_seq_append without prefix lookups: every token is written, into
 * private blocks (copy-on-write first), so no slot it gives lies in a shared
 * or indexed block. For the tokens a row samples from. */
int bkv__seq_append_private(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n);
/* Append only the prefix hits among the first n of tokens (no block taken,
 * nothing written): whole blocks the cache holds, and first, when the
 * sequence ends inside a private block, the cached block holding that
 * block's tokens and the next ones (then the private block is freed: its
 * KV equals the cached one's). Returns the tokens appended (0..n); nothing
 * else changes. */
int bkv__seq_take_hits(bkv_pool *pool, uint32_t seq, const int32_t *tokens, uint32_t n);

typedef struct bkv__appender {
	bkv_pool *pool;     /* the pool appended to */
	bkv__seq *seqs;     /* pool->seqs */
	bkv__block *blk;    /* pool->kv.blk */
	int32_t *tok;       /* pool->kv.tok */
	uint32_t bt;        /* pool->kv.bt */
	uint32_t shift;     /* pool->kv.bt_shift */
	uint32_t bt_m2;     /* pool->kv.bt - 2 (wraps to UINT32_MAX for 1) */
	uint32_t max_seqs;  /* pool->cfg.max_seqs */
	uint32_t n;         /* tokens appended inline, not yet in the pool's
			       tokens and miss_tokens counters */
	uint32_t grouped;   /* KV groups (lanes, a STATE group or both):
			       bkv__append_groups decides, else 0 */
} bkv__appender;

static inline void bkv__append_begin(bkv_pool *pool, bkv__appender *a)
{
	a->pool = pool;
	a->seqs = pool->seqs;
	a->blk = pool->kv.blk;
	a->tok = pool->kv.tok;
	a->bt = pool->kv.bt;
	a->shift = pool->kv.bt_shift;
	a->bt_m2 = pool->kv.bt - 2;
	/* with KV groups bkv__append_fast declines (a max_seqs of 0) and
	 * bkv__append_groups decides */
	a->max_seqs = pool->grouped ? 0 : pool->cfg.max_seqs;
	a->n = 0;
	a->grouped = pool->grouped != 0;
}

static inline void bkv__append_flush(bkv__appender *a)
{
	a->pool->kv.tokens += a->n;
	a->pool->miss_tokens += a->n;
	a->n = 0;
}

/* What a decode row's batch entries need from its append: the sequence's
 * table after it, and where the token went (bkv__fill_decode). */
typedef struct bkv__appended {
	const int32_t *table; /* the sequence's block table; NULL: the inline
				 case did not apply, nothing changed */
	uint32_t nb;          /* its entries */
	uint32_t off;         /* the token's offset in block table[nb - 1] */
	int32_t slot;         /* its token-store index, table[nb - 1] *
				 block_tokens + off (the row's slot_mapping) */
	uint32_t clean;       /* the sequence's clean mark (bkv__seq.clean) */
} bkv__appended;

/* The inline case: appends and answers the sequence's
 * table and the token's slot, or answers table NULL having changed nothing
 * (then bkv__append_flush and bkv__seq_append1_slow decide). The values come
 * from the checks' own loads, before the stores, so the caller reloads
 * nothing. off in [1, block_tokens - 2] is tested as one unsigned compare
 * (bt_m2 = block_tokens - 2, UINT32_MAX when block_tokens is 1). */
static inline bkv__appended bkv__append_fast(bkv__appender *a, uint32_t seq, int32_t token)
{
	const uint32_t slot = seq & BKV__SEQ_SLOT_MASK;
	bkv__seq *s = &a->seqs[slot < a->max_seqs ? slot : 0]; /* read in bounds */
	const uint32_t off = s->len & (a->bt - 1);
	bkv__appended res = {NULL, 0, 0, 0, 0};

	/* off != 0 implies block_tokens >= 2 and a nonempty table; off + 1 <
	 * block_tokens implies len + 1 < INT32_MAX (INT32_MAX ends a block) */
	if (off - 1 < a->bt_m2 && slot < a->max_seqs && s->state == BKV__SEQ_OPEN &&
	    s->gen == (seq >> BKV__SEQ_SLOT_BITS)) {
		const uint32_t nb = s->n_blocks;
		const int32_t *const table = s->table;
		const int32_t b = table[nb - 1];
		bkv__block *k = &a->blk[b];

		/* not INDEXED either: only full blocks are (bkv_pool_check's
		 * CHECK_FILL), and fill == off < block_tokens - 1 */
		if (k->ref == 1 && k->fill == off) {
			const size_t at = ((size_t)b << a->shift) + off;

			a->tok[at] = token;
			k->fill = off + 1;
			s->len++;
			a->n++;
			res.table = table;
			res.nb = nb;
			res.off = off;
			res.slot = (int32_t)at;
			res.clean = s->clean;
		}
	}
	return res;
}

/* bkv__append_fast's case in a pool with KV groups (and no STATE group;
 * else it declines): the token lands inside every group's last block, each
 * private and filled exactly to its offset (bkv__lanes_append1, which
 * notes a window that passes a block for the commit's trim). Same answers
 * as bkv__append_fast (pool/seq.c). */
bkv__appended bkv__append_groups(bkv__appender *a, uint32_t seq, int32_t token);

#endif /* BKV_POOL_APPEND_H */
