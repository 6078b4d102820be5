/*
 * batch.c - building the host's bkv_batch from planned rows.
 *
 * A row is one lane computing tokens [start, end) of its history; its KV
 * sequence already holds end tokens (the step appended them), so its block
 * table covers context and new tokens. The arrays follow FlashInfer's paged
 * layout and vLLM's slot mapping; for rows r = 0..n-1:
 *
 *   qo_indptr    0 .. +len(r) ..        tokens of row r: [qo[r], qo[r+1])
 *   kv_indptr    0 .. +nblk(r) ..       blocks of row r: kv_indices[kv[r]..]
 *   kv_indices   | r0's table | r1's table | ...   (physical block ids)
 *   kv_last_page_len[r] = end - (nblk(r) - 1) * block_tokens   (1..bt)
 *   slot_mapping[t] = table[pos / bt] * bt + pos % bt
 *
 * Every array was sized when the scheduler was created or when a larger
 * request was submitted (see struct bkv__bufs), so filling allocates nothing.
 *
 * Decode rows are usually written while the step plans them (sched/plan.c's
 * plan_decode, through bkv__fill in sched/batch.h: the planning pass has the
 * request, lane and block table in hand, so a second pass here would only
 * load them again; speculation's drafts are laid into them in place,
 * bkv__batch_drafts); bkv__batch_fill then starts after those rows (`first`)
 * and writes the rest: prefill chunks, rows planned later, or everything
 * when a preemption pruned rows or a split host's prefill call reused the
 * arrays.
 * The copy lists are the pool's pending ones not yet sent in this step (a
 * split host's later calls - a second packed prefill call, the decode call -
 * see only what appeared after the calls before them).
 */
#include "sched/batch.h"

#include <string.h>

/* A row's new tokens [start, end), block by block: slot = block * bt +
 * offset (a decode row's one token on its own, without the loops). Returns
 * the next token index. */
static ALWAYS_INLINE uint32_t row_tokens(int32_t *tok_ids, int32_t *pos, int32_t *slots, uint32_t t,
					 const int32_t *tok, const int32_t *table, uint32_t start,
					 uint32_t end, uint32_t shift)
{
	const uint32_t mask = (1u << shift) - 1;
	uint32_t p, i;

	if (end - start == 1) {
		tok_ids[t] = tok[start];
		pos[t] = (int32_t)start;
		slots[t++] = (table[start >> shift] << shift) + (int32_t)(start & mask);
		return t;
	}
	for (p = start; p < end;) {
		uint32_t blk_end = BKV_MIN((p | mask) + 1, end);
		int32_t base = table[p >> shift] << shift;

		for (i = p; i < blk_end; i++, t++) {
			tok_ids[t] = tok[i];
			pos[t] = (int32_t)i;
			slots[t] = base + (int32_t)(i & mask);
		}
		p = blk_end;
	}
	return t;
}

/* The batch's array pointers and counts, and its rows' adapters. */
static void batch_point(const bkv_sched *s, bkv_batch *b, bkv_call_kind kind, const bkv__row *rows,
			uint32_t n_rows, uint32_t n_decode, uint32_t n_tokens)
{
	b->kind = kind;
	b->n_rows = n_rows;
	b->n_decode_rows = n_decode;
	b->n_tokens = n_tokens;
	b->block_tokens = s->bt;
	b->token_ids = s->call.arr.bufs.token_ids;
	b->positions = s->call.arr.bufs.positions;
	b->qo_indptr = s->call.arr.qo_indptr;
	b->kv_indptr = s->call.arr.kv_indptr;
	b->kv_indices = s->call.arr.bufs.kv_indices;
	b->kv_last_page_len = s->call.arr.last_page_len;
	b->slot_mapping = s->call.arr.bufs.slot_mapping;
	b->row_sample = s->call.arr.row_sample;
	b->row_req = s->call.arr.row_req;
	b->row_branch = s->call.arr.row_branch;
	b->row_user = s->call.arr.row_user;
	b->row_adapter = NULL;
	b->n_adapters = 0;
	b->adapters = NULL;
	if (s->ad)
		bkv__adapters_batch(s, b, rows, n_rows);
	if (s->enc)
		bkv__enc_batch(s->enc, b);
	if (s->call.persistent) {
		b->layout = BKV_BATCH_PERSISTENT;
		b->kv_indptr = NULL;
		b->kv_indices = NULL;
		b->n_row_slots = s->call.n_slots;
		b->row_slot = s->call.row_slot;
		b->row_tables = s->call.row_tables;
		b->row_table_len = s->call.row_table_len;
		b->n_table_deltas = s->call.n_deltas;
		b->table_deltas = s->call.deltas;
		b->delta_blocks = s->call.arr.bufs.kv_indices;
	} else {
		b->layout = BKV_BATCH_FLAT;
	}
}

/* The pool's pending copies not yet sent in this step's earlier calls. */
static void batch_copies(bkv_sched *s, bkv_batch *b)
{
	int kind_i;

	for (kind_i = 0; kind_i < 3; kind_i++) {
		const bkv_copy *v = NULL;
		uint32_t n = bkv_pool_pending_copies(s->pool, (bkv_copy_kind)kind_i, &v);
		uint32_t sent = BKV_MIN(s->call.copies_sent[kind_i], n);

		s->call.copies_sent[kind_i] = n;
		n -= sent;
		v = n ? v + sent : NULL;
		if (kind_i == BKV_COPY_DEVICE) {
			b->n_copies = n;
			b->copies = v;
		} else if (kind_i == BKV_COPY_SWAP_OUT) {
			b->n_swap_out = n;
			b->swap_out = v;
		} else {
			b->n_swap_in = n;
			b->swap_in = v;
		}
	}
}

#if BKV_DEBUG_LEVEL >= 1
/* Every slot a call writes (slot_mapping) must lie in a block only the
 * writing row's sequence holds: one table reference and not in the prefix
 * cache. Checked under BKV_DEBUG_LEVEL >= 1 for tokens [from, to) (one load
 * per row and block); a violation sticks and bkv_sched_check reports it
 * (invariant 30). A call (sched/step.c) checks its tokens from
 * s->plan.fill_tok on: the ones before are decode rows the fused pass wrote
 * (plan_decode), each its lane's append into its last block through
 * bkv__append_fast, whose test is this one (one reference, filled to the
 * token's offset, so not indexed), or through the private append of
 * bkv__seq_append1_slow (copy-on-write first, no prefix lookup); drafts
 * laid into those rows are checked as they are (bkv__batch_drafts). */
COLD int bkv__writes_shared(const bkv_sched *s, const int32_t *slots, uint32_t from,
			    uint32_t to)
{
	const bkv_pool *p = s->pool;
	uint32_t t, last = UINT32_MAX;

	for (t = from; t < to; t++) {
		uint32_t id = (uint32_t)slots[t] >> s->bt_shift;

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

/* bkv__batch_drafts: rows (i, hi), undrafted, move: tokens [i + 1, hi) by
 * d, their block ids [kv_indptr[i + 1], kend) by g (the drafts and blocks
 * of rows <= i). */
static void drafts_move_run(bkv_sched *s, uint32_t i, uint32_t hi, uint32_t d, uint32_t g,
			    uint32_t kend)
{
	int32_t *const tok_ids = s->call.arr.bufs.token_ids, *const pos = s->call.arr.bufs.positions;
	int32_t *const slots = s->call.arr.bufs.slot_mapping, *const kvi = s->call.arr.bufs.kv_indices;
	int32_t *const qo = s->call.arr.qo_indptr, *const kvp = s->call.arr.kv_indptr;
	const uint32_t m = hi - i - 1;
	uint32_t r;

	memmove(&tok_ids[i + 1 + d], &tok_ids[i + 1], m * sizeof(int32_t));
	memmove(&pos[i + 1 + d], &pos[i + 1], m * sizeof(int32_t));
	memmove(&slots[i + 1 + d], &slots[i + 1], m * sizeof(int32_t));
	for (r = i + 1; r < hi; r++)
		qo[r + 1] += (int32_t)d;
	if (g) {
		const uint32_t k0 = (uint32_t)kvp[i + 1];

		memmove(&kvi[k0 + g], &kvi[k0], (kend - k0) * sizeof(int32_t));
		for (r = i + 1; r < hi; r++)
			kvp[r + 1] += (int32_t)g;
	}
}

/* Drafts appended to rows the fused pass wrote (dec[0, fill_rows), one
 * token each): row i now computes 1 + drafts[i] tokens, and its table may
 * have grown by the blocks the drafts opened. Rows before the first drafted
 * one stay as they are; after it, one pass from the last row back moves
 * each run of undrafted rows at once: their tokens by the drafts before
 * them (three memmoves and an add per row to qo_indptr), and in the flat
 * layout their kv_indices by the blocks the drafts before them opened (a
 * memmove, none while no drafted row opened a block). Each drafted row is
 * written whole from its table: its tokens, last_page_len, and its block
 * ids when they moved or grew (in the persistent layout it joins the dirty
 * list: the call sends its table's change, sched/rows.c). */
void bkv__batch_drafts(bkv_sched *s, const uint32_t *drafts)
{
	const uint32_t n = s->plan.fill_rows, shift = s->bt_shift, mask = s->bt - 1;
	const bkv__row *const rows = s->plan.dec;
	int32_t *const tok_ids = s->call.arr.bufs.token_ids, *const pos = s->call.arr.bufs.positions;
	int32_t *const slots = s->call.arr.bufs.slot_mapping, *const kvi = s->call.arr.bufs.kv_indices;
	int32_t *const qo = s->call.arr.qo_indptr, *const kvp = s->call.arr.kv_indptr;
	int32_t *const lpl = s->call.arr.last_page_len;
	const int persistent = s->call.persistent;
	uint32_t i, d = 0, g = 0, hi = n, first = n, kend;

	BKV_ASSERT(s->plan.fill_tok == n); /* one token a row so far */
	for (i = 0; i < n; i++) { /* the tokens and blocks the drafts add */
		const uint32_t k = drafts[i], start = rows[i].start;

		if (!k)
			continue;
		BKV_ASSERT(rows[i].end == start + 1 + k);
		first = BKV_MIN(first, i);
		d += k;
		if (!persistent)
			g += ((start + 1 + k + mask) >> shift) - ((start + 1 + mask) >> shift);
	}
	if (!d)
		return;
	s->plan.fill_tok = n + d;
	s->plan.fill_ctx += d;
	kend = persistent ? 0 : s->plan.fill_kv; /* the old end of rows [i + 1, hi) */
	s->plan.fill_kv += g;
	BKV_ASSERT(n + d <= s->call.arr.bufs.tok_cap);
	BKV_ASSERT(persistent || s->plan.fill_kv <= s->call.arr.bufs.kv_cap);
	for (i = n; i-- > first;) {
		const uint32_t k = drafts[i];
		uint32_t nb = 0, need, t;
		const bkv__lane *l;
		const int32_t *table;

		if (!k)
			continue;
		if (hi > i + 1)
			drafts_move_run(s, i, hi, d, g, kend);
		/* row i itself: what comes before it moves it by d - k tokens and
		 * by g less its own new blocks */
		l = rows[i].lane;
		table = bkv_seq_blocks(s->pool, l->seq, &nb);
		need = (rows[i].end + mask) >> shift;
		BKV_ASSERT(table && nb == need);
		d -= k;
		t = row_tokens(tok_ids, pos, slots, i + d, l->tok, table, rows[i].start, rows[i].end,
			       shift);
		qo[i + 1] = (int32_t)t;
#if BKV_DEBUG_LEVEL >= 1
		if (!s->bad_write) /* the call checks from fill_tok on (sched/step.c) */
			s->bad_write = bkv__writes_shared(s, slots, i + d, t);
#endif
		lpl[i] = (int32_t)(rows[i].end - ((need - 1) << shift));
		if (persistent) {
			BKV_ASSERT(s->call.n_dirty < s->plan.row_cap);
			s->call.dirty[s->call.n_dirty++] = i; /* twice is harmless:
								 the second sends nothing */
		} else {
			const uint32_t k0 = (uint32_t)kvp[i], grew = need - ((uint32_t)kvp[i + 1] - k0);

			kend = k0; /* the old end of the run before row i */
			g -= grew;
			if (g || grew) {
				memcpy(&kvi[k0 + g], table, need * sizeof(int32_t));
				kvp[i + 1] = (int32_t)(k0 + g + need);
			}
		}
		hi = i;
	}
	BKV_ASSERT(!d && !g);
}

uint32_t bkv__batch_fill(bkv_sched *s, bkv_call_kind kind, bkv__row *rows, uint32_t n_rows,
			 uint32_t n_decode, uint32_t first, bkv_batch *b, bkv_step_shape *shape)
{
	const uint32_t mask = s->bt - 1, shift = s->bt_shift;
	/* the arrays, hoisted: the uint8_t stores would otherwise make the
	 * compiler reload every pointer from s on each row */
	int32_t *const tok_ids = s->call.arr.bufs.token_ids, *const pos = s->call.arr.bufs.positions;
	int32_t *const slots = s->call.arr.bufs.slot_mapping, *const kvi = s->call.arr.bufs.kv_indices;
	int32_t *const qo = s->call.arr.qo_indptr, *const kvp = s->call.arr.kv_indptr;
	int32_t *const lpl = s->call.arr.last_page_len, *const next = s->call.arr.next_tokens;
	uint8_t *const smp = s->call.arr.row_sample;
	uint64_t *const rid = s->call.arr.row_req;
	uint32_t *const rbr = s->call.arr.row_branch;
	void **const rus = s->call.arr.row_user;
	const bkv_pool *pool = s->pool;
	const int persistent = s->call.persistent;
	uint32_t r = 0, t = 0, k = 0, n_chunks = 0;
	uint64_t ctx = 0;

	if (first) { /* decode rows the planning pass wrote (bkv__fill) */
		BKV_ASSERT(first <= n_decode && rows == s->plan.dec);
		r = first;
		t = s->plan.fill_tok;
		k = s->plan.fill_kv;
		ctx = s->plan.fill_ctx;
	} else {
		qo[0] = 0;
		kvp[0] = 0;
	}
	for (; r < n_rows; r++) {
		/* the row in locals: int32_t stores may alias its fields */
		bkv__lane *l = rows[r].lane;
		const uint32_t start = rows[r].start, end = rows[r].end;
		const bkv__req *q = l->req;
		uint32_t nb = 0, i, need = (end + mask) >> shift;
		const int32_t *table = bkv_seq_blocks(pool, l->seq, &nb);

		BKV_ASSERT(table && nb == need);
		BKV_ASSERT(t + (end - start) <= s->call.arr.bufs.tok_cap);
		BKV_ASSERT(k + need <= s->call.arr.bufs.kv_cap);
		smp[r] = rows[r].sample;
		rid[r] = q->id;
		rbr[r] = l->branch;
		rus[r] = q->user;
		next[r] = BKV_TOKEN_FAIL;
		lpl[r] = (int32_t)(end - ((need - 1) << shift));
		if (persistent) {
			/* the row's slot and the change to its table (sched/rows.c) */
			bkv__row_persist(s, r, l, table, nb);
		} else {
			/* the block table, four ids per fixed-size copy (no call) */
			for (i = 0; i + 4 <= need; i += 4)
				memcpy(&kvi[k + i], &table[i], 4 * sizeof(int32_t));
			for (; i < need; i++)
				kvi[k + i] = table[i];
			k += need;
			kvp[r + 1] = (int32_t)k;
		}
		t = row_tokens(tok_ids, pos, slots, t, l->tok, table, start, end, shift);
		qo[r + 1] = (int32_t)t;
		if (r < n_decode) {
			ctx += end;
		} else {
			s->call.arr.chunks[n_chunks].len = end - start;
			s->call.arr.chunks[n_chunks].start = start;
			n_chunks++;
		}
	}
	batch_point(s, b, kind, rows, n_rows, n_decode, t);
	batch_copies(s, b);
	shape->kind = kind;
	shape->decode_rows = n_decode;
	shape->decode_context = ctx;
	shape->n_chunks = n_chunks;
	shape->chunks = n_chunks ? s->call.arr.chunks : NULL;
	shape->padded_rows = s->pol.padded_rows(s, n_decode);
	shape->decode_drafts = 0; /* speculated rows: sched/spec.c sets it */
	bkv__batch_groups(s, b, rows, n_rows, n_decode, shape);
	return t;
}
