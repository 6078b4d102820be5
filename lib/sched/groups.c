/*
 * groups.c - a call's KV groups: where each group writes the new tokens'
 * K/V and which blocks each row reads in it.
 *
 * A pool with KV groups (pool/lanes.c) keeps one table per group for every
 * sequence, all of the same length. The batch's own arrays are group 0's;
 * after they are filled, this pass walks the call's rows once per further
 * group: the slot of every new token in that group's table, and (flat
 * layout) the row's blocks from the first one its first new token reads -
 * all of them for full attention, the last few for a sliding window or the
 * current chunk - or (persistent layout) the group's table of the row's
 * slot. The decode context each group reads is summed for the cost model.
 * Everything is sized at create (bkv__groups_alloc) or with the token and
 * block arrays (bkv__bufs.ng), so the pass allocates nothing.
 */
#include "sched/batch.h"

#include <string.h>

/* Row slots a persistent group table array covers (sched/rows.c: depth +
 * 2 times max_running with overlap). */
static uint32_t groups_slots(const bkv_sched *s)
{
	return s->cfg.max_running * (s->cfg.overlap ? s->cfg.overlap + 2 : 1);
}

int bkv__groups_rows_alloc(bkv_sched *s, int32_t **kv_indptr, int32_t **kv_first)
{
	const uint32_t n = s->call.n_lanes, rc = s->plan.row_cap;

	*kv_indptr = bkv__calloc(&s->alloc, (size_t)n * (rc + 1), sizeof(int32_t));
	*kv_first = bkv__calloc(&s->alloc, (size_t)(n + 1) * rc, sizeof(int32_t));
	return *kv_indptr && *kv_first ? BKV_OK : BKV_ENOMEM;
}

void bkv__groups_rows_free(bkv_sched *s, int32_t *kv_indptr, int32_t *kv_first)
{
	const size_t n = s->call.n_lanes, rc = s->plan.row_cap;

	bkv__free(&s->alloc, kv_indptr, n * (rc + 1) * sizeof(int32_t));
	bkv__free(&s->alloc, kv_first, (n + 1) * rc * sizeof(int32_t));
}

int bkv__groups_alloc(bkv_sched *s)
{
	const bkv_allocator *a = &s->alloc;
	const uint32_t n = s->call.n_lanes, rc = s->plan.row_cap, m = groups_slots(s);

	(void)bkv__groups_rows_alloc(s, &s->call.g_kv_indptr, &s->call.g_kv_first);
	s->call.g_row_tables = bkv__calloc(a, (size_t)n * m, sizeof(int32_t *));
	s->call.g_row_table_len = bkv__calloc(a, (size_t)n * m, sizeof(uint32_t));
	s->call.g_state = bkv__calloc(a, 2 * (size_t)rc, sizeof(int32_t));
	if (!s->call.g_kv_indptr || !s->call.g_kv_first || !s->call.g_row_tables ||
	    !s->call.g_row_table_len || !s->call.g_state)
		return BKV_ENOMEM;
	return BKV_OK;
}

void bkv__groups_free(bkv_sched *s)
{
	const bkv_allocator *a = &s->alloc;
	const size_t n = s->call.n_lanes, rc = s->plan.row_cap, m = groups_slots(s);

	bkv__groups_rows_free(s, s->call.g_kv_indptr, s->call.g_kv_first);
	bkv__free(a, (void *)s->call.g_row_tables, n * m * sizeof(int32_t *));
	bkv__free(a, s->call.g_row_table_len, n * m * sizeof(uint32_t));
	bkv__free(a, s->call.g_state, 2 * rc * sizeof(int32_t));
}

/* A STATE group: each row's state units (pool/state.c). */
static void fill_state(bkv_sched *s, const bkv__row *rows, uint32_t n_rows, uint32_t g)
{
	const bkv_kv_group *kg = bkv__pool_group(s->pool, g);
	int32_t *in = s->call.g_state, *out = s->call.g_state + s->plan.row_cap;
	bkv_batch_group *bg = &s->call.groups[g];
	uint32_t r;

	for (r = 0; r < n_rows; r++)
		bkv__pool_state_frames(s->pool, rows[r].lane->seq, &in[r], &out[r]);
	memset(bg, 0, sizeof *bg);
	bg->kind = kg->kind;
	bg->span = kg->span;
	bg->state_in = in;
	bg->state_out = out;
	bg->state_frames = bkv_kv_state_frames(bkv__pool_group(s->pool, 0), g + 1, s->bt);
	s->call.gctx[g] = 0;
}

/* Context tokens a decode row of new tokens [start, end) reads in group g:
 * the union of what its queries read (one query, or a speculated row's
 * token and its drafts, sched/spec.c). A window reads from the first
 * position its first query reads, start + 1 - W; a chunk from the start of
 * its first query's chunk. */
static uint64_t group_ctx(const bkv_kv_group *g, uint32_t start, uint32_t end)
{
	if (g->kind == BKV_GROUP_WINDOW)
		return end - (start + 1 > g->span ? start + 1 - g->span : 0);
	if (g->kind == BKV_GROUP_CHUNKED)
		return end - start / g->span * g->span;
	return end;
}

/* Group g (>= 1) of the call. */
static void fill_group(bkv_sched *s, bkv_batch *b, const bkv__row *rows, uint32_t n_rows,
		       uint32_t n_decode, uint32_t g)
{
	const uint32_t shift = s->bt_shift, mask = s->bt - 1, rc = s->plan.row_cap;
	const uint32_t l = g - 1, m = groups_slots(s);
	const bkv_kv_group *kg = bkv__pool_group(s->pool, g);
	bkv__bufs *bf = &s->call.arr.bufs;
	int32_t *slots = bf->slot_mapping + (size_t)g * bf->tok_cap;
	int32_t *kvi = bf->kv_indices + (size_t)g * (bf->kv_cap + BKV__KV_SLACK);
	int32_t *kvp = s->call.g_kv_indptr + (size_t)l * (rc + 1);
	int32_t *kvf = s->call.g_kv_first + (size_t)g * rc;
	const int32_t **rt = s->call.g_row_tables + (size_t)l * m;
	uint32_t *rtl = s->call.g_row_table_len + (size_t)l * m;
	bkv_batch_group *bg = &s->call.groups[g];
	uint32_t r, t = 0, k = 0, p, nb;
	uint64_t ctx = 0;

	kvp[0] = 0;
	for (r = 0; r < n_rows; r++) {
		const uint32_t start = rows[r].start, end = rows[r].end;
		const int32_t *table = bkv__pool_group_table(s->pool, rows[r].lane->seq, g, &nb);
		uint32_t first;

		BKV_ASSERT(table && nb == ((end + mask) >> shift));
		for (p = start; p < end; p++)
			slots[t++] = (table[p >> shift] << shift) + (int32_t)(p & mask);
		if (r < n_decode)
			ctx += group_ctx(kg, start, end);
		if (s->call.persistent) {
			rt[b->row_slot[r]] = table;
			rtl[b->row_slot[r]] = nb;
			continue;
		}
		first = bkv__pool_group_first(s->pool, g, start);
		BKV_ASSERT(first < nb && k + (nb - first) <= bf->kv_cap);
		memcpy(kvi + k, table + first, (size_t)(nb - first) * sizeof(int32_t));
		kvf[r] = (int32_t)first;
		k += nb - first;
		kvp[r + 1] = (int32_t)k;
	}
	bg->kind = kg->kind;
	bg->span = kg->span;
	bg->slot_mapping = slots;
	bg->kv_indptr = s->call.persistent ? NULL : kvp;
	bg->kv_indices = s->call.persistent ? NULL : kvi;
	bg->kv_first_block = s->call.persistent ? NULL : kvf;
	bg->row_tables = s->call.persistent ? rt : NULL;
	bg->row_table_len = s->call.persistent ? rtl : NULL;
	s->call.gctx[g] = ctx;
}

void bkv__batch_groups(bkv_sched *s, bkv_batch *b, const bkv__row *rows, uint32_t n_rows,
		       uint32_t n_decode, bkv_step_shape *shape)
{
	bkv_batch_group *g0 = &s->call.groups[0];
	uint32_t g;

	/* group 0 is the batch's own arrays, in every pool */
	g0->kind = BKV_GROUP_FULL;
	g0->span = 0;
	g0->slot_mapping = b->slot_mapping;
	g0->kv_indptr = b->kv_indptr;
	g0->kv_indices = b->kv_indices;
	g0->kv_first_block = s->call.persistent ? NULL : s->call.g_kv_first; /* zeros */
	g0->row_tables = b->row_tables;
	g0->row_table_len = b->row_table_len;
	b->n_groups = 1;
	b->groups = s->call.groups;
	shape->n_groups = 0; /* one full group: the plain shape */
	shape->group_decode_context = NULL;
	if (!s->call.n_lanes)
		return;
	s->call.gctx[0] = shape->decode_context;
	for (g = 1; g <= s->call.n_lanes; g++) {
		if (bkv__pool_group(s->pool, g)->kind == BKV_GROUP_STATE)
			fill_state(s, rows, n_rows, g);
		else
			fill_group(s, b, rows, n_rows, n_decode, g);
	}
	b->n_groups = 1 + s->call.n_lanes;
	b->groups = s->call.groups;
	shape->n_groups = b->n_groups;
	shape->group_decode_context = s->call.gctx;
}
