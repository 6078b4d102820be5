/*
 * paged.c - tinylm's host callbacks: the model over a paged KV cache.
 *
 * The KV cache is one preallocated tensor per tier, laid out per layer the way
 * FlashInfer's paged cache is (NHD: block, K/V, slot, head, dim):
 *
 *   kv[layer][block][2][block_tokens][n_kv_heads * head_dim]     device tier
 *   kv_host[layer][host_block][2][block_tokens][...]             host tier
 *
 * A callback first performs the batch's block copies in the contract's order
 * (swap_out: device -> host; swap_in: host -> device; copies: device ->
 * device, the copy-on-write ones), then runs the rows' tokens through the
 * model layer by layer. In each layer it computes Q/K/V for every token,
 * writes each token's K/V at slot_mapping[t] (block = slot / block_tokens,
 * offset = slot % block_tokens, vLLM's reshape_and_cache), and then lets each
 * query attend to its row's context, which it reads only through the block
 * table: row r's blocks are kv_indices[kv_indptr[r] .. kv_indptr[r+1]), its
 * context is (blocks - 1) * block_tokens + kv_last_page_len[r] tokens, and its
 * qo_len tokens are the last ones of that context (causal: token i of the row
 * sees positions 0 .. ctx - qo_len + i). Rows marked in row_sample then
 * sample a token from their last token's logits. A row with an adapter
 * (bkv_batch.row_adapter[r] != 0) gets its bias after every layer and on its
 * logits (tlm_adapter_layer, tlm_adapter_logits), as ref.c applies it.
 *
 * Encoder inputs (encoder.c): before anything else a callback drops the
 * batch's encoder_free ids from its encoder cache (whatever it then
 * returns), then runs the encoder on each encode entry, reading the image of
 * the request and input the entry names (the request's user pointer, whose
 * first field is its sampling record, as for rows), and stores the rows
 * under the entry's cache id. A row's token at a position in one of its
 * request's spans (tlm_sampling.inputs) embeds the cached row of that input's
 * cache id; one not held is a violation. The token ids there (the library's
 * bkv_encoder_token) are not read.
 *
 * In the persistent layout (bkv_batch.layout) kv_indptr/kv_indices are NULL.
 * The host keeps its own table per row slot, as a GPU host keeps a 2-D block
 * table on the device, and brings it up to date with each call's
 * table_deltas before anything else, whatever the call then returns (deltas
 * are absolute writes: after a failed call and its rolled-back step, the next
 * call's deltas give the right tables again):
 *
 *   mirror[slot][0 .. mlen[slot])     slot < n_row_slots, width device_blocks
 *   row r's blocks = mirror[row_slot[r]], mlen[row_slot[r]] entries
 *
 * Attention then reads row r's blocks from the mirror. As a self-check the
 * host compares each row's mirrored table with the library's
 * (row_tables[slot]) and counts the rows that differ (mirror_mismatches).
 *
 * The host trusts nothing: before touching memory it checks every index and
 * that positions, slot_mapping and the block tables tell one story. A batch
 * that does not is counted, described, and failed with -1, so a scheduler bug
 * shows up as a host error instead of silently wrong tokens.
 */
#include "tinylm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tlm_host {
	const tlm_model *m;       /* not owned */
	uint32_t block_tokens;    /* slots per block */
	uint32_t device_blocks;   /* blocks in kv */
	uint32_t host_blocks;     /* blocks in kv_host (0: no swap tier) */
	size_t block_floats;      /* floats of one block in one layer: 2 * bt * kv_width */
	float *kv;                /* [layers][device_blocks][2][bt][kv_width] */
	float *kv_host;           /* [layers][host_blocks][2][bt][kv_width] */
	/* scratch, grown to the largest batch (cap_tokens tokens, cap_ctx
	 * context positions) */
	uint32_t cap_tokens;
	uint32_t cap_ctx;
	float *x, *q, *k, *v, *attn, *tmp, *hid; /* per-token activations */
	float *scores;            /* [cap_ctx] */
	const float **krows;      /* [cap_ctx] */
	const float **vrows;      /* [cap_ctx] */
	float *logits;            /* [vocab] */
	float *ltmp;              /* [dim] */
	/* the current call's rows' block tables: into kv_indices (flat) or
	 * into mirror (persistent); cap_rows entries each */
	uint32_t cap_rows;
	const int32_t **row_blk;  /* [cap_rows] row r's table */
	uint32_t *row_nb;         /* [cap_rows] its entries */
	/* a hybrid model's groups after the first (tlm_layer_group): row r's
	 * table in group g, whose logical block i is grp_blk[g][r][i -
	 * grp_first[g][r]] (a window or chunked group lists only the blocks
	 * its tokens read); [0] unused (row_blk) */
	const int32_t **grp_blk[TLM_MAX_GROUPS];  /* [cap_rows] */
	uint32_t *grp_first[TLM_MAX_GROUPS];      /* [cap_rows] */
	/* the persistent layout's mirror (allocated at the first persistent
	 * call, for its n_row_slots) */
	uint32_t n_slots;         /* row slots mirrored; 0: none yet */
	uint32_t *mlen;           /* [n_slots] entries of each mirrored table,
				     <= device_blocks */
	int32_t *mirror;          /* [n_slots][device_blocks] mirrored tables */
	uint64_t *slot_call;      /* [n_slots] call stamp of the row that last
				     used the slot: two rows of a call may not
				     share one */
	uint64_t n_calls;         /* compute callbacks entered */
	int fail_next;            /* tlm_host_fail_next armed: 1 fail before
				     anything, 2 after copies and compute */
	tlm_enc_cache *enc;       /* encoder outputs by cache id (created at
				     the first encode) */
	int step_marks;           /* tlm_host_step_begin was called: the step
				     cost spans calls */
	uint64_t step_cost;       /* encoder cost of the current step (or
				     call) */
	tlm_host_stats stats;
	char last_error[256];     /* the last contract violation */
};

uint64_t tlm_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

tlm_host *tlm_host_create(const tlm_model *m, uint32_t block_tokens, uint32_t device_blocks,
			  uint32_t host_blocks)
{
	if (!m || !block_tokens || !device_blocks)
		return NULL;
	tlm_host *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	const tlm_config *c = &m->cfg;
	h->m = m;
	h->block_tokens = block_tokens;
	h->device_blocks = device_blocks;
	h->host_blocks = host_blocks;
	h->block_floats = 2 * (size_t)block_tokens * tlm_kv_width(c);
	/* calloc: a kernel reading a slot nobody wrote sees zeros, and ASan
	 * would not hide an uninitialised read behind garbage. */
	h->kv = calloc((size_t)c->layers * device_blocks * h->block_floats, sizeof(float));
	if (host_blocks)
		h->kv_host = calloc((size_t)c->layers * host_blocks * h->block_floats, sizeof(float));
	h->logits = malloc(c->vocab * sizeof(float));
	h->ltmp = malloc(c->dim * sizeof(float));
	if (!h->kv || (host_blocks && !h->kv_host) || !h->logits || !h->ltmp) {
		tlm_host_destroy(h);
		return NULL;
	}
	return h;
}

void tlm_host_destroy(tlm_host *h)
{
	if (!h)
		return;
	free(h->kv), free(h->kv_host), free(h->x), free(h->q), free(h->k), free(h->v);
	free(h->attn), free(h->tmp), free(h->hid), free(h->scores);
	free(h->krows), free(h->vrows), free(h->logits), free(h->ltmp);
	free(h->row_blk), free(h->row_nb), free(h->mlen), free(h->mirror), free(h->slot_call);
	tlm_enc_cache_destroy(h->enc);
	for (uint32_t g = 1; g < TLM_MAX_GROUPS; g++)
		free(h->grp_blk[g]), free(h->grp_first[g]);
	free(h);
}

void tlm_host_stats_get(const tlm_host *h, tlm_host_stats *out)
{
	*out = h->stats;
}

void tlm_host_step_begin(tlm_host *h)
{
	h->step_marks = 1;
	h->step_cost = 0;
}

void tlm_host_encoder_free(tlm_host *h, const bkv_batch *b)
{
	for (uint32_t i = 0; i < b->n_encoder_free; i++)
		h->stats.enc_frees += tlm_enc_cache_drop(h->enc, b->encoder_free[i]) != 0;
}

const char *tlm_host_last_error(const tlm_host *h)
{
	return h->last_error;
}

void tlm_host_fail_next(tlm_host *h, int late)
{
	h->fail_next = late ? 2 : 1;
}

void tlm_host_fail_next_clear(tlm_host *h)
{
	h->fail_next = 0;
}

/* Block b of layer l on a tier. */
static float *block_ptr(const tlm_host *h, float *tier, uint32_t n_blocks, uint32_t l, int32_t b)
{
	return tier + ((size_t)l * n_blocks + (size_t)b) * h->block_floats;
}

float *tlm_host_kv_row(tlm_host *h, uint32_t layer, int32_t block, uint32_t offset, int kv)
{
	const uint32_t kvw = tlm_kv_width(&h->m->cfg);
	return block_ptr(h, h->kv, h->device_blocks, layer, block) +
	       ((size_t)kv * h->block_tokens + offset) * kvw;
}

static int grow(void **p, size_t bytes)
{
	void *n = realloc(*p, bytes);
	if (!n)
		return -1;
	*p = n;
	return 0;
}

static int reserve_rows(tlm_host *h, uint32_t rows)
{
	if (rows <= h->cap_rows)
		return 0;
	if (grow((void **)&h->row_blk, rows * sizeof(*h->row_blk)) ||
	    grow((void **)&h->row_nb, rows * sizeof(*h->row_nb)))
		return -1;
	for (uint32_t g = 1; g < TLM_MAX_GROUPS; g++)
		if (grow((void **)&h->grp_blk[g], rows * sizeof(*h->grp_blk[g])) ||
		    grow((void **)&h->grp_first[g], rows * sizeof(*h->grp_first[g])))
			return -1;
	h->cap_rows = rows;
	return 0;
}

static int reserve(tlm_host *h, uint32_t tokens, uint32_t ctx)
{
	const tlm_config *c = &h->m->cfg;
	if (tokens > h->cap_tokens) {
		const size_t n = tokens, qw = tlm_q_width(c), kvw = tlm_kv_width(c);
		const size_t d = c->dim > qw ? c->dim : qw;
		if (grow((void **)&h->x, n * c->dim * sizeof(float)) ||
		    grow((void **)&h->q, n * qw * sizeof(float)) ||
		    grow((void **)&h->k, n * kvw * sizeof(float)) ||
		    grow((void **)&h->v, n * kvw * sizeof(float)) ||
		    grow((void **)&h->attn, n * qw * sizeof(float)) ||
		    grow((void **)&h->tmp, n * d * sizeof(float)) ||
		    grow((void **)&h->hid, 2 * n * c->ffn * sizeof(float)))
			return -1;
		h->cap_tokens = tokens;
	}
	if (ctx > h->cap_ctx) {
		if (grow((void **)&h->scores, ctx * sizeof(float)) ||
		    grow((void **)&h->krows, ctx * sizeof(float *)) ||
		    grow((void **)&h->vrows, ctx * sizeof(float *)))
			return -1;
		h->cap_ctx = ctx;
	}
	return 0;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int violation(tlm_host *h, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(h->last_error, sizeof(h->last_error), fmt, ap);
	va_end(ap);
	h->stats.violations++;
	return -1;
}

/* Row r's context length from its block table (row_tables() ran). */
static uint32_t row_ctx(const tlm_host *h, const bkv_batch *b, uint32_t r)
{
	const uint32_t nb = h->row_nb[r];
	return nb ? (nb - 1) * b->block_tokens + (uint32_t)b->kv_last_page_len[r] : 0;
}

/* The persistent layout: bring the mirror up to date with the call's
 * deltas, in order. Each sets entries [start, start + n) of its slot's table
 * from delta_blocks and then the length to len; OPENED starts the slot
 * afresh (start is 0), CLOSED empties it. A delta that breaks these rules is
 * a violation (-1); so is running out of memory for the mirror. */
static int apply_deltas(tlm_host *h, const bkv_batch *b)
{
	if (b->layout != BKV_BATCH_PERSISTENT)
		return 0;
	if (!h->mirror) {
		const size_t n = b->n_row_slots ? b->n_row_slots : 1;
		h->mlen = calloc(n, sizeof(uint32_t));
		h->slot_call = calloc(n, sizeof(uint64_t));
		h->mirror = malloc(n * h->device_blocks * sizeof(int32_t));
		if (!h->mlen || !h->slot_call || !h->mirror) {
			free(h->mlen), free(h->slot_call), free(h->mirror);
			h->mlen = NULL, h->slot_call = NULL, h->mirror = NULL;
			return violation(h, "out of memory for %u mirrored row slots",
					 b->n_row_slots);
		}
		h->n_slots = b->n_row_slots;
	}
	if (b->n_row_slots != h->n_slots)
		return violation(h, "n_row_slots %u, was %u", b->n_row_slots, h->n_slots);
	if (b->n_table_deltas && (!b->table_deltas || !b->delta_blocks))
		return violation(h, "%u deltas without their arrays", b->n_table_deltas);
	const int32_t *blk = b->delta_blocks;
	for (uint32_t i = 0; i < b->n_table_deltas; i++) {
		const bkv_table_delta *d = &b->table_deltas[i];
		const int opened = (d->flags & BKV_TABLE_OPENED) != 0;
		const int closed = (d->flags & BKV_TABLE_CLOSED) != 0;
		if (d->slot >= h->n_slots || d->len > h->device_blocks || d->n > d->len ||
		    d->start > d->len - d->n || (closed && (opened || d->len)) ||
		    (opened && d->start) || (!opened && d->start > h->mlen[d->slot]))
			return violation(h, "delta %u: slot %u start %u n %u len %u flags %#x"
					 " (mirror has %u entries)", i, d->slot, d->start, d->n,
					 d->len, d->flags,
					 d->slot < h->n_slots ? h->mlen[d->slot] : 0);
		for (uint32_t k = 0; k < d->n; k++)
			if (blk[k] < 0 || (uint32_t)blk[k] >= h->device_blocks)
				return violation(h, "delta %u: block %d out of range", i, blk[k]);
		memcpy(h->mirror + (size_t)d->slot * h->device_blocks + d->start, blk,
		       d->n * sizeof(int32_t));
		blk += d->n;
		h->mlen[d->slot] = d->len;
		h->stats.deltas++;
		h->stats.delta_entries += d->n;
	}
	return 0;
}

/* Point row_blk/row_nb at each row's block table: kv_indices in the flat
 * layout, the row's slot in the mirror in the persistent one (where each row
 * is also compared with the library's row_tables). */
static int row_tables(tlm_host *h, const bkv_batch *b)
{
	if (reserve_rows(h, b->n_rows))
		return violation(h, "out of memory for %u rows", b->n_rows);
	if (b->layout != BKV_BATCH_PERSISTENT) {
		if (!b->kv_indptr || !b->kv_indices)
			return violation(h, "flat batch without kv_indptr/kv_indices");
		if (b->kv_indptr[0] != 0)
			return violation(h, "kv_indptr does not start at 0");
		for (uint32_t r = 0; r < b->n_rows; r++) {
			const int32_t k0 = b->kv_indptr[r], k1 = b->kv_indptr[r + 1];
			if (k1 < k0)
				return violation(h, "row %u kv %d..%d", r, k0, k1);
			h->row_blk[r] = b->kv_indices + k0;
			h->row_nb[r] = (uint32_t)(k1 - k0);
		}
		return 0;
	}
	if (b->kv_indptr || b->kv_indices)
		return violation(h, "persistent batch carries kv_indptr/kv_indices");
	if (!b->row_slot || !b->row_tables || !b->row_table_len)
		return violation(h, "persistent batch without row_slot/row_tables");
	for (uint32_t r = 0; r < b->n_rows; r++) {
		const uint32_t slot = b->row_slot[r];
		if (slot >= h->n_slots)
			return violation(h, "row %u slot %u of %u", r, slot, h->n_slots);
		if (h->slot_call[slot] == h->n_calls)
			return violation(h, "row %u shares slot %u with an earlier row", r, slot);
		h->slot_call[slot] = h->n_calls;
		h->row_blk[r] = h->mirror + (size_t)slot * h->device_blocks;
		h->row_nb[r] = h->mlen[slot];
		h->stats.mirror_rows++;
		if (b->row_table_len[slot] != h->row_nb[r] ||
		    (h->row_nb[r] && memcmp(b->row_tables[slot], h->row_blk[r],
					   h->row_nb[r] * sizeof(int32_t))))
			h->stats.mirror_mismatches++;
	}
	return 0;
}

/* A STATE group: every row reads a unit (or the zero state, only at
 * position 0) and writes another one, each whole inside the device frames
 * and never a unit another row of the call reads or writes. */
static int state_units(tlm_host *h, const bkv_batch *b, const bkv_batch_group *bg)
{
	const uint32_t sf = tlm_state_floats(&h->m->cfg);
	if (!bg->state_in || !bg->state_out || bg->state_frames == 0 ||
	    (size_t)bg->state_frames * h->block_floats < sf)
		return violation(h, "state group: no units, or %u frames per unit", bg->state_frames);
	for (uint32_t r = 0; r < b->n_rows; r++) {
		const int32_t in = bg->state_in[r], out = bg->state_out[r];
		const int32_t pos0 = b->positions[b->qo_indptr[r]];
		if (out < 0 || (uint32_t)out + bg->state_frames > h->device_blocks || in == out ||
		    (in >= 0 && (uint32_t)in + bg->state_frames > h->device_blocks) ||
		    (in < 0 && pos0 != 0))
			return violation(h, "row %u: state %d -> %d at position %d", r, in, out, pos0);
		for (uint32_t q = 0; q < r; q++)
			if (bg->state_out[q] == out || bg->state_out[q] == in ||
			    bg->state_in[q] == out)
				return violation(h, "rows %u and %u share a state unit", q, r);
	}
	return 0;
}

/* A hybrid's groups after the first: each row's table in each group, from
 * the batch's groups (flat: the blocks the row reads, from kv_first_block
 * on; persistent: the library's table of the row's slot). */
static int group_tables(tlm_host *h, const bkv_batch *b)
{
	const uint32_t ng = tlm_n_groups(&h->m->cfg);
	if (ng == 1)
		return 0;
	if (b->n_groups != ng || !b->groups)
		return violation(h, "batch has %u KV groups, the model %u", b->n_groups, ng);
	for (uint32_t g = 1; g < ng; g++) {
		const bkv_batch_group *bg = &b->groups[g];
		uint32_t span, kind = tlm_group_kind(&h->m->cfg, g, &span);
		if (bg->kind != kind || bg->span != span)
			return violation(h, "group %u: kind %u span %u, model %u %u", g, bg->kind,
					 bg->span, kind, span);
		if (kind == BKV_GROUP_STATE) {
			if (state_units(h, b, bg))
				return -1;
			continue;
		}
		if (!bg->slot_mapping)
			return violation(h, "group %u without a slot mapping", g);
		for (uint32_t r = 0; r < b->n_rows; r++) {
			if (b->layout == BKV_BATCH_PERSISTENT) {
				const uint32_t slot = b->row_slot[r];
				if (!bg->row_tables || bg->row_table_len[slot] != h->row_nb[r])
					return violation(h, "group %u row %u: no table of %u entries",
							 g, r, h->row_nb[r]);
				h->grp_blk[g][r] = bg->row_tables[slot];
				h->grp_first[g][r] = 0;
				continue;
			}
			if (!bg->kv_indptr || !bg->kv_indices || !bg->kv_first_block)
				return violation(h, "flat group %u without its kv arrays", g);
			const int32_t k0 = bg->kv_indptr[r], k1 = bg->kv_indptr[r + 1];
			const int32_t f = bg->kv_first_block[r];
			if (k1 < k0 || f < 0 || (uint32_t)f + (uint32_t)(k1 - k0) != h->row_nb[r])
				return violation(h, "group %u row %u: blocks %d..%d from %d, group 0 %u",
						 g, r, k0, k1, f, h->row_nb[r]);
			h->grp_blk[g][r] = bg->kv_indices + k0;
			h->grp_first[g][r] = (uint32_t)f;
		}
	}
	return 0;
}

/* Block of position pos of row r in group g, or -1 when the group's table
 * does not hold it. */
static int32_t group_block(const tlm_host *h, uint32_t g, uint32_t r, uint32_t pos)
{
	const uint32_t i = pos / h->block_tokens;
	if (g == 0)
		return i < h->row_nb[r] ? h->row_blk[r][i] : -1;
	if (i < h->grp_first[g][r] || i >= h->row_nb[r])
		return -1;
	return h->grp_blk[g][r][i - h->grp_first[g][r]];
}

/* Every group's view of row r agrees with its positions: each new token's
 * slot is the group's block of its position, and every block its tokens
 * attend to is a device block. */
/* Row r's request's encoder inputs (NULL: none). */
static const tlm_inputs *row_inputs(const bkv_batch *b, uint32_t r)
{
	const tlm_sampling *s = b->row_user ? b->row_user[r] : NULL;
	return s ? s->inputs : NULL;
}

static int validate_groups(tlm_host *h, const bkv_batch *b, uint32_t r, uint32_t ctx, uint32_t qo)
{
	const tlm_config *c = &h->m->cfg;
	const uint32_t ng = tlm_n_groups(c) - (c->recurrent != 0), q0 = (uint32_t)b->qo_indptr[r];
	for (uint32_t g = 1; g < ng; g++) {
		const int32_t *slots = b->groups[g].slot_mapping;
		uint32_t l = 0;
		while (tlm_layer_group(c, l) != g)
			l++;
		for (uint32_t t = 0; t < qo; t++) {
			const uint32_t pos = ctx - qo + t;
			const int32_t blk = group_block(h, g, r, pos);
			if (blk < 0 || (uint32_t)blk >= h->device_blocks ||
			    slots[q0 + t] != blk * (int32_t)h->block_tokens +
						     (int32_t)(pos % h->block_tokens))
				return violation(h, "group %u row %u pos %u: slot %d, block %d", g, r,
						 pos, slots[q0 + t], blk);
			for (uint32_t j = tlm_attn_first(c, l, pos); j < pos; j += h->block_tokens) {
				const int32_t rb = group_block(h, g, r, j);
				if (rb < 0 || (uint32_t)rb >= h->device_blocks)
					return violation(h, "group %u row %u: position %u unreadable",
							 g, r, j);
			}
		}
	}
	return 0;
}

/* Check everything the computation will rely on; returns the largest context
 * through *max_ctx. */
static int validate(tlm_host *h, const bkv_batch *b, bkv_call_kind want, uint32_t *max_ctx)
{
	const tlm_config *c = &h->m->cfg;
	if (b->kind != want)
		return violation(h, "batch kind %d in a kind-%d callback", (int)b->kind, (int)want);
	if (b->block_tokens != h->block_tokens)
		return violation(h, "block_tokens %u, host has %u", b->block_tokens, h->block_tokens);
	if (b->n_decode_rows > b->n_rows)
		return violation(h, "n_decode_rows %u > n_rows %u", b->n_decode_rows, b->n_rows);
	if (want == BKV_CALL_DECODE && b->n_decode_rows != b->n_rows)
		return violation(h, "decode call with %u prefill rows", b->n_rows - b->n_decode_rows);
	if (want == BKV_CALL_PREFILL && b->n_decode_rows != 0)
		return violation(h, "prefill call with %u decode rows", b->n_decode_rows);
	for (uint32_t i = 0; i < b->n_swap_out; i++)
		if (b->swap_out[i].src < 0 || (uint32_t)b->swap_out[i].src >= h->device_blocks ||
		    b->swap_out[i].dst < 0 || (uint32_t)b->swap_out[i].dst >= h->host_blocks)
			return violation(h, "swap_out %d->%d out of range", b->swap_out[i].src,
					 b->swap_out[i].dst);
	for (uint32_t i = 0; i < b->n_swap_in; i++)
		if (b->swap_in[i].src < 0 || (uint32_t)b->swap_in[i].src >= h->host_blocks ||
		    b->swap_in[i].dst < 0 || (uint32_t)b->swap_in[i].dst >= h->device_blocks)
			return violation(h, "swap_in %d->%d out of range", b->swap_in[i].src,
					 b->swap_in[i].dst);
	for (uint32_t i = 0; i < b->n_copies; i++)
		if (b->copies[i].src < 0 || (uint32_t)b->copies[i].src >= h->device_blocks ||
		    b->copies[i].dst < 0 || (uint32_t)b->copies[i].dst >= h->device_blocks ||
		    b->copies[i].src == b->copies[i].dst)
			return violation(h, "copy %d->%d invalid", b->copies[i].src, b->copies[i].dst);
	if (b->n_rows == 0)
		return 0;
	if (b->qo_indptr[0] != 0)
		return violation(h, "qo_indptr does not start at 0");
	if (row_tables(h, b) || group_tables(h, b))
		return -1;
	if ((uint32_t)b->qo_indptr[b->n_rows] != b->n_tokens)
		return violation(h, "qo_indptr ends at %d, n_tokens %u", b->qo_indptr[b->n_rows],
				 b->n_tokens);
	*max_ctx = 0;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		const int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
		const int32_t *blocks = h->row_blk[r];
		const uint32_t nb = h->row_nb[r];
		if (q1 <= q0 || nb == 0)
			return violation(h, "row %u empty (qo %d..%d, %u blocks)", r, q0, q1, nb);
		/* a speculated decode row: its token and row_drafts[r] drafts */
		const int32_t want_q = 1 + (int32_t)(b->row_drafts ? b->row_drafts[r] : 0);
		if (r < b->n_decode_rows && q1 - q0 != want_q)
			return violation(h, "decode row %u has %d tokens, %d expected", r, q1 - q0,
					 want_q);
		if (r >= b->n_decode_rows && b->row_drafts && b->row_drafts[r])
			return violation(h, "prefill row %u carries drafts", r);
		const int32_t last = b->kv_last_page_len[r];
		if (last < 1 || (uint32_t)last > h->block_tokens)
			return violation(h, "row %u kv_last_page_len %d", r, last);
		const uint32_t ctx = row_ctx(h, b, r), qo = (uint32_t)(q1 - q0);
		if (ctx < qo || ctx > c->max_pos)
			return violation(h, "row %u context %u, %u new tokens", r, ctx, qo);
		if (ctx > *max_ctx)
			*max_ctx = ctx;
		for (uint32_t i = 0; i < nb; i++)
			if (blocks[i] < 0 || (uint32_t)blocks[i] >= h->device_blocks)
				return violation(h, "row %u block %d out of range", r, blocks[i]);
		for (int32_t t = q0; t < q1; t++) {
			const uint32_t pos = ctx - qo + (uint32_t)(t - q0);
			if (b->positions[t] != (int32_t)pos)
				return violation(h, "row %u token %d position %d, block table says %u",
						 r, t, b->positions[t], pos);
			if ((b->token_ids[t] < 0 || (uint32_t)b->token_ids[t] >= c->vocab) &&
			    tlm_inputs_find(row_inputs(b, r), pos) < 0)
				return violation(h, "token id %d out of range", b->token_ids[t]);
			const int64_t want_slot =
				(int64_t)blocks[pos / h->block_tokens] * h->block_tokens +
				pos % h->block_tokens;
			if (b->slot_mapping[t] != want_slot)
				return violation(h, "row %u token %d slot %d, block table says %lld", r,
						 t, b->slot_mapping[t], (long long)want_slot);
		}
		if (validate_groups(h, b, r, ctx, qo))
			return -1;
	}
	return 0;
}

static void copy_block(tlm_host *h, float *dst_tier, uint32_t dst_n, int32_t dst, float *src_tier,
		       uint32_t src_n, int32_t src)
{
	for (uint32_t l = 0; l < h->m->cfg.layers; l++)
		memcpy(block_ptr(h, dst_tier, dst_n, l, dst), block_ptr(h, src_tier, src_n, l, src),
		       h->block_floats * sizeof(float));
}

static void do_copies(tlm_host *h, const bkv_batch *b)
{
	for (uint32_t i = 0; i < b->n_swap_out; i++)
		copy_block(h, h->kv_host, h->host_blocks, b->swap_out[i].dst, h->kv,
			   h->device_blocks, b->swap_out[i].src);
	for (uint32_t i = 0; i < b->n_swap_in; i++)
		copy_block(h, h->kv, h->device_blocks, b->swap_in[i].dst, h->kv_host,
			   h->host_blocks, b->swap_in[i].src);
	for (uint32_t i = 0; i < b->n_copies; i++)
		copy_block(h, h->kv, h->device_blocks, b->copies[i].dst, h->kv, h->device_blocks,
			   b->copies[i].src);
	h->stats.swap_out += b->n_swap_out;
	h->stats.swap_in += b->n_swap_in;
	h->stats.copies += b->n_copies;
}

/* The recurrent layer: each row's state from its state_in unit (zero at
 * position 0), its tokens in order, the new state into its state_out unit
 * (out of place: a failed call leaves every state_in as it was). */
static void recurrent_layer(tlm_host *h, const bkv_batch *b, uint32_t l, const bkv_batch_group *bg)
{
	const tlm_config *c = &h->m->cfg;
	const uint32_t sf = tlm_state_floats(c), qw = tlm_q_width(c), kvw = tlm_kv_width(c);
	float *st = h->scores; /* scratch of >= sf floats (reserve) */
	for (uint32_t r = 0; r < b->n_rows; r++) {
		const uint32_t q0 = (uint32_t)b->qo_indptr[r], q1 = (uint32_t)b->qo_indptr[r + 1];
		if (bg->state_in[r] < 0)
			memset(st, 0, sf * sizeof(float));
		else
			memcpy(st, block_ptr(h, h->kv, h->device_blocks, l, bg->state_in[r]),
			       sf * sizeof(float));
		for (uint32_t t = q0; t < q1; t++)
			tlm_recurrent_step(h->m, st, h->q + (size_t)t * qw, h->k + (size_t)t * kvw,
					   h->v + (size_t)t * kvw, h->attn + (size_t)t * qw);
		memcpy(block_ptr(h, h->kv, h->device_blocks, l, bg->state_out[r]), st,
		       sf * sizeof(float));
		h->stats.state_rows++;
	}
}

/* A row's adapter: bkv_batch.row_adapter[r], 0 when adapters are off. */
static uint32_t row_adapter(const bkv_batch *b, uint32_t r)
{
	return b->row_adapter ? b->row_adapter[r] : 0;
}

/* Each row's adapter bias of layer l on its tokens' hidden rows. */
static void adapt_rows(tlm_host *h, const bkv_batch *b, uint32_t l)
{
	if (!b->row_adapter)
		return;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		const uint32_t q0 = (uint32_t)b->qo_indptr[r], q1 = (uint32_t)b->qo_indptr[r + 1];
		tlm_adapter_layer(h->m, b->row_adapter[r], l, q1 - q0,
				  h->x + (size_t)q0 * h->m->cfg.dim);
	}
}

/* The call's adapters: each nonzero, listed once, and every row's adapter
 * (when nonzero) among them: the adapters the host would have loaded. */
static int check_adapters(tlm_host *h, const bkv_batch *b)
{
	if (!b->row_adapter)
		return b->n_adapters ? violation(h, "n_adapters %u without row_adapter",
						 b->n_adapters) : 0;
	for (uint32_t i = 0; i < b->n_adapters; i++) {
		if (!b->adapters[i])
			return violation(h, "adapters[%u] is 0", i);
		for (uint32_t j = 0; j < i; j++)
			if (b->adapters[j] == b->adapters[i])
				return violation(h, "adapter %u listed twice", b->adapters[i]);
	}
	for (uint32_t r = 0; r < b->n_rows; r++) {
		uint32_t i = 0;
		while (b->row_adapter[r] && i < b->n_adapters && b->adapters[i] != b->row_adapter[r])
			i++;
		if (i == b->n_adapters && b->row_adapter[r])
			return violation(h, "row %u: adapter %u not in the call's adapters", r,
					 b->row_adapter[r]);
		h->stats.adapter_rows += b->row_adapter[r] != 0;
	}
	if (b->n_adapters > h->stats.max_adapters)
		h->stats.max_adapters = b->n_adapters;
	return 0;
}

/* Sample the rows marked in row_sample from their last token's logits (a
 * speculated row: after each of its tokens), with the row's adapter. */
static void sample_rows(tlm_host *h, const bkv_batch *b, int32_t *next_tokens)
{
	const tlm_model *m = h->m;
	const tlm_config *c = &m->cfg;
	for (uint32_t r = 0; r < b->n_rows; r++) {
		if (!b->row_sample[r])
			continue;
		const uint32_t last = (uint32_t)b->qo_indptr[r + 1] - 1;
		const tlm_sampling *s = b->row_user[r];
		if (b->row_drafts && b->row_drafts[r]) {
			/* speculated: a token after each of the row's tokens; the
			 * library accepts greedily (n_accepted left at -1) */
			for (uint32_t t = (uint32_t)b->qo_indptr[r]; t <= last; t++) {
				tlm_logits(m, h->x + (size_t)t * c->dim, h->logits, h->ltmp);
				tlm_adapter_logits(m, row_adapter(b, r), h->logits);
				b->spec_tokens[t] = tlm_sample(
					h->logits, c->vocab, s ? s->n_samples : 1, s ? s->seed : 0,
					b->row_branch[r], (uint32_t)b->positions[t] + 1);
				h->stats.spec_tokens++;
			}
			h->stats.spec_rows++;
			h->stats.sampled++;
			continue;
		}
		tlm_logits(m, h->x + (size_t)last * c->dim, h->logits, h->ltmp);
		tlm_adapter_logits(m, row_adapter(b, r), h->logits);
		next_tokens[r] = tlm_sample(h->logits, c->vocab, s ? s->n_samples : 1,
					    s ? s->seed : 0, b->row_branch[r],
					    (uint32_t)b->positions[last] + 1);
		h->stats.sampled++;
	}
}

/* The request an encode entry names: its user pointer (the request's
 * sampling record, as row_user). Entries whose request has no row in the
 * call are counted (encodes_off_rows). */
static const tlm_sampling *encode_request(tlm_host *h, const bkv_batch *b, const bkv_encode *e)
{
	uint32_t r;

	for (r = 0; b->row_req && r < b->n_rows && b->row_req[r] != e->req; r++)
		;
	if (!b->row_req || r == b->n_rows)
		h->stats.encodes_off_rows++;
	return e->user;
}

/* Run the encoder on each entry of b->encode: the image of the request's
 * input, its rows stored under the entry's cache id. */
static int run_encodes(tlm_host *h, const bkv_batch *b)
{
	const uint32_t d = h->m->cfg.dim;
	if (!h->step_marks)
		h->step_cost = 0;
	for (uint32_t i = 0; i < b->n_encode; i++) {
		const bkv_encode *e = &b->encode[i];
		const tlm_sampling *s = encode_request(h, b, e);
		if (!s || !s->inputs || e->input >= s->inputs->n)
			return violation(h, "encode %u: request %llu has no input %u", i,
					 (unsigned long long)e->req, e->input);
		const bkv_encoder_input *in = &s->inputs->in[e->input];
		if (in->cache_id != e->cache_id || in->token_len != e->len)
			return violation(h, "encode %u: cache id %llx len %u, the input has %llx %u",
					 i, (unsigned long long)e->cache_id, e->len,
					 (unsigned long long)in->cache_id, in->token_len);
		if (!h->enc && !(h->enc = tlm_enc_cache_create(d)))
			return violation(h, "out of memory");
		int replaced = 0;
		float *out = tlm_enc_cache_put(h->enc, e->cache_id, e->len, &replaced);
		if (!out)
			return violation(h, "out of memory");
		for (uint32_t t = 0; t < e->len; t++)
			tlm_encoder_output(h->m, s->inputs->image[e->input], t, out + (size_t)t * d);
		h->stats.encodes++;
		h->stats.encode_tokens += e->len;
		h->stats.reencodes += replaced != 0;
		h->step_cost += in->cost ? in->cost : in->token_len;
		if (h->step_cost > h->stats.enc_max_step_cost)
			h->stats.enc_max_step_cost = h->step_cost;
		if (tlm_enc_cache_tokens(h->enc) > h->stats.enc_max_held)
			h->stats.enc_max_held = tlm_enc_cache_tokens(h->enc);
	}
	return 0;
}

/* The call's token embeddings into h->x; a position in an input's span
 * takes that input's row from the encoder cache instead. */
static int embed_rows(tlm_host *h, const bkv_batch *b)
{
	const uint32_t d = h->m->cfg.dim;
	tlm_embed(h->m, b->n_tokens, b->token_ids, h->x);
	for (uint32_t r = 0; r < b->n_rows; r++) {
		const tlm_inputs *in = row_inputs(b, r);
		for (int32_t t = b->qo_indptr[r]; in && t < b->qo_indptr[r + 1]; t++) {
			const uint32_t pos = (uint32_t)b->positions[t];
			const int k = tlm_inputs_find(in, pos);
			if (k < 0)
				continue;
			uint32_t len = 0;
			const float *out = tlm_enc_cache_get(h->enc, in->in[k].cache_id, &len);
			const uint32_t i = pos - in->in[k].token_start;
			if (!out || i >= len)
				return violation(h, "call %llu row %u (request %llu) position %u reads "
						 "input %d (cache id %llx), not in the encoder cache",
						 (unsigned long long)h->n_calls, r,
						 (unsigned long long)(b->row_req ? b->row_req[r] : 0), pos,
						 k, (unsigned long long)in->in[k].cache_id);
			memcpy(h->x + (size_t)t * d, out + (size_t)i * d, d * sizeof(float));
			h->stats.enc_reads++;
		}
	}
	return 0;
}

static int compute(tlm_host *h, const bkv_batch *b, int32_t *next_tokens, bkv_call_kind want)
{
	const uint64_t t0 = tlm_now_us();
	const int fail = h->fail_next;
	h->fail_next = 0;
	h->n_calls++;
	/* The deltas first, even for a call about to fail: the mirror must
	 * follow every call the library made. */
	if (apply_deltas(h, b))
		return -1;
	tlm_host_encoder_free(h, b); /* dropped whatever the call returns */
	if (fail == 1)
		return -1;
	uint32_t max_ctx = 0;
	if (validate(h, b, want, &max_ctx) || check_adapters(h, b) || run_encodes(h, b))
		return -1;
	if (reserve(h, b->n_tokens, max_ctx > tlm_state_floats(&h->m->cfg)
					     ? max_ctx : tlm_state_floats(&h->m->cfg)))
		return -1;
	if (embed_rows(h, b))
		return -1;
	do_copies(h, b);
	h->stats.calls[want]++;
	if (b->n_rows == 0)
		return 0;
	const tlm_model *m = h->m;
	const tlm_config *c = &m->cfg;
	const uint32_t n = b->n_tokens, bt = h->block_tokens;
	const uint32_t qw = tlm_q_width(c), kvw = tlm_kv_width(c);
	for (uint32_t l = 0; l < c->layers; l++) {
		const uint32_t g = tlm_layer_group(c, l);
		const int32_t *slots = g ? b->groups[g].slot_mapping : b->slot_mapping;
		tlm_layer_qkv(m, l, n, h->x, b->positions, h->q, h->k, h->v, h->tmp);
		if (tlm_layer_recurrent(c, l)) {
			recurrent_layer(h, b, l, &b->groups[g]);
			tlm_layer_out(m, l, n, h->x, h->attn, h->tmp, h->hid);
			adapt_rows(h, b, l);
			continue;
		}
		/* reshape_and_cache: new K/V go where the layer's group's
		 * slot_mapping says. */
		for (uint32_t t = 0; t < n; t++) {
			const int32_t slot = slots[t];
			const int32_t blk = slot / (int32_t)bt;
			const uint32_t off = (uint32_t)slot % bt;
			float *base = block_ptr(h, h->kv, h->device_blocks, l, blk);
			memcpy(base + (size_t)off * kvw, h->k + (size_t)t * kvw, kvw * sizeof(float));
			memcpy(base + ((size_t)bt + off) * kvw, h->v + (size_t)t * kvw,
			       kvw * sizeof(float));
		}
		/* Paged attention: context only through the layer's group's
		 * block table, from the first position the row's tokens read
		 * (a window or a chunk: not from 0). */
		for (uint32_t r = 0; r < b->n_rows; r++) {
			const uint32_t ctx = row_ctx(h, b, r);
			const uint32_t q0 = (uint32_t)b->qo_indptr[r], q1 = (uint32_t)b->qo_indptr[r + 1];
			const uint32_t lo = tlm_attn_first(c, l, ctx - (q1 - q0));
			for (uint32_t j = lo; j < ctx; j++) {
				const float *base = block_ptr(h, h->kv, h->device_blocks, l,
							      group_block(h, g, r, j));
				h->krows[j] = base + (size_t)(j % bt) * kvw;
				h->vrows[j] = base + ((size_t)bt + j % bt) * kvw;
			}
			for (uint32_t t = q0; t < q1; t++) {
				const uint32_t p = ctx - (q1 - t), first = tlm_attn_first(c, l, p);
				tlm_attend(m, h->q + (size_t)t * qw, p + 1 - first, h->krows + first,
					   h->vrows + first, h->attn + (size_t)t * qw, h->scores);
			}
		}
		tlm_layer_out(m, l, n, h->x, h->attn, h->tmp, h->hid);
		adapt_rows(h, b, l);
	}
	if (fail == 2)
		return -1; /* K/V written, no token: a kernel failing late */
	sample_rows(h, b, next_tokens);
	h->stats.rows += b->n_rows;
	h->stats.tokens += n;
	h->stats.compute_us += (double)(tlm_now_us() - t0);
	return 0;
}

int tlm_host_forward(void *host, const bkv_batch *batch, int32_t *next_tokens)
{
	return compute(host, batch, next_tokens, BKV_CALL_MIXED);
}

int tlm_host_prefill(void *host, const bkv_batch *batch, int32_t *next_tokens)
{
	return compute(host, batch, next_tokens, BKV_CALL_PREFILL);
}

int tlm_host_decode(void *host, const bkv_batch *batch, int32_t *next_tokens)
{
	return compute(host, batch, next_tokens, BKV_CALL_DECODE);
}
