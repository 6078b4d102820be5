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
 * The copy lists are the pool's pending ones not yet sent in this step (a
 * split host's decode call sees only what appeared after the prefill call).
 */
#include "internal.h"

#include <string.h>

uint32_t bkv__batch_fill(bkv_sched *s, bkv_call_kind kind, bkv__row *rows, uint32_t n_rows,
			 uint32_t n_decode, bkv_batch *b, bkv_step_shape *shape)
{
	const uint32_t bt = s->bt, mask = bt - 1, shift = s->bt_shift;
	uint32_t r, t = 0, k = 0, n_chunks = 0;
	uint64_t ctx = 0;
	int kind_i;

	s->qo_indptr[0] = 0;
	s->kv_indptr[0] = 0;
	for (r = 0; r < n_rows; r++) {
		const bkv__row *row = &rows[r];
		const bkv__lane *l = row->lane;
		uint32_t nb = 0, i, p, need = (row->end + mask) >> shift;
		const int32_t *table = bkv_seq_blocks(s->pool, l->seq, &nb);

		BKV_ASSERT(table && nb == need);
		BKV_ASSERT(t + (row->end - row->start) <= s->bufs.tok_cap);
		BKV_ASSERT(k + need <= s->bufs.kv_cap);
		memcpy(&s->bufs.kv_indices[k], table, (size_t)need * sizeof(int32_t));
		k += need;
		/* new tokens, block by block: slot = block * bt + offset */
		for (p = row->start; p < row->end;) {
			uint32_t blk_end = BKV_MIN((p | mask) + 1, row->end);
			int32_t base = table[p >> shift] << shift;

			for (i = p; i < blk_end; i++, t++) {
				s->bufs.token_ids[t] = l->tok[i];
				s->bufs.positions[t] = (int32_t)i;
				s->bufs.slot_mapping[t] = base + (int32_t)(i & mask);
			}
			p = blk_end;
		}
		s->qo_indptr[r + 1] = (int32_t)t;
		s->kv_indptr[r + 1] = (int32_t)k;
		s->last_page_len[r] = (int32_t)(row->end - ((need - 1) << shift));
		s->row_sample[r] = row->sample;
		s->row_req[r] = l->req->id;
		s->row_branch[r] = l->branch;
		s->row_user[r] = l->req->user;
		s->next_tokens[r] = BKV_TOKEN_FAIL;
		if (r < n_decode) {
			ctx += row->end;
		} else {
			s->chunks[n_chunks].len = row->end - row->start;
			s->chunks[n_chunks].start = row->start;
			n_chunks++;
		}
	}

	b->kind = kind;
	b->n_rows = n_rows;
	b->n_decode_rows = n_decode;
	b->n_tokens = t;
	b->block_tokens = bt;
	b->token_ids = s->bufs.token_ids;
	b->positions = s->bufs.positions;
	b->qo_indptr = s->qo_indptr;
	b->kv_indptr = s->kv_indptr;
	b->kv_indices = s->bufs.kv_indices;
	b->kv_last_page_len = s->last_page_len;
	b->slot_mapping = s->bufs.slot_mapping;
	b->row_sample = s->row_sample;
	b->row_req = s->row_req;
	b->row_branch = s->row_branch;
	b->row_user = s->row_user;
	for (kind_i = 0; kind_i < 3; kind_i++) {
		const bkv_copy *v = NULL;
		uint32_t n = bkv_pool_copies(s->pool, (bkv_copy_kind)kind_i, &v);
		uint32_t sent = BKV_MIN(s->copies_sent[kind_i], n);

		s->copies_sent[kind_i] = n;
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

	shape->kind = kind;
	shape->decode_rows = n_decode;
	shape->decode_context = ctx;
	shape->n_chunks = n_chunks;
	shape->chunks = n_chunks ? s->chunks : NULL;
	shape->padded_rows = n_decode;
	if (s->cfg.policy == BKV_POLICY_STATIC && n_decode && s->group_size > n_decode)
		shape->padded_rows = s->group_size;
	return t;
}
