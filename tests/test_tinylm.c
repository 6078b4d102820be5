/*
 * test_tinylm.c - tinylm served through libbatchkv gives exactly the tokens
 * of running each request alone.
 *
 * Two layers of evidence. First, the paged host on hand-built batches (plain
 * arrays, no scheduler): scattered block tables, chunked prompts, mixed rows,
 * copy-on-write copies and swaps must reproduce the contiguous reference.
 * Second, a few hundred requests (shared system prompts, n > 1 forks, stop
 * tokens, aborts) served by bkv_step under every policy and with pools small
 * enough to preempt by recompute and by swap, checked token for token.
 *
 * The persistent batch layout gets both layers too: hand-built calls whose
 * tables reach the host only as deltas, and the same workloads served with
 * batch_layout = BKV_BATCH_PERSISTENT, where the host's mirrored tables must
 * equal the library's row_tables on every row of every call.
 *
 * The scheduler runs use tlm_config_small (same architecture, ~125 k
 * parameters) so the suite stays fast; TINYLM_TEST_JOBS overrides the request
 * count; sanitizer builds default to 100 requests.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/tinylm/threaded.h"
#include "../examples/tinylm/tinylm.h"

/* ------------------------------------------------------------------------ */
/* Hand-built batches                                                        */
/* ------------------------------------------------------------------------ */

#define BT 8
#define MAXR 8
#define MAXT 256

/* One row of a hand-built batch: a sequence whose block table is blocks[],
 * whose context after this call is ctx tokens, and whose new tokens are the
 * last n_new of seq[]. */
typedef struct mrow {
	const int32_t *blocks;
	const int32_t *seq;  /* the whole sequence so far, ctx tokens */
	uint32_t ctx;
	uint32_t n_new;
	uint32_t branch;
	tlm_sampling *user;
} mrow;

typedef struct mcopies {
	const bkv_copy *copies, *swap_out, *swap_in;
	uint32_t n_copies, n_swap_out, n_swap_in;
} mcopies;

/* The persistent layout's part of a hand-built call: the rows' slots, the
 * deltas, and the tables the "library" holds (what the host must mirror). */
typedef struct mpersist {
	uint32_t n_slots;
	const uint32_t *row_slot;          /* [n_rows] */
	uint32_t n_deltas;
	const bkv_table_delta *deltas;
	const int32_t *delta_blocks;
	const int32_t *const *tables;      /* [n_slots] */
	const uint32_t *table_len;         /* [n_slots] */
} mpersist;

static int run_rows_ex(tlm_host *h, bkv_call_kind kind, const mrow *rows, uint32_t n_rows,
		       uint32_t n_decode, const mcopies *mc, const mpersist *mp, int32_t *next)
{
	static int32_t tok[MAXT], pos[MAXT], slot[MAXT], qo[MAXR + 1], kvp[MAXR + 1], kvi[MAXT],
		last[MAXR];
	static uint8_t samp[MAXR];
	static uint64_t req[MAXR];
	static uint32_t branch[MAXR];
	static void *user[MAXR];
	uint32_t nt = 0, nb = 0;
	qo[0] = kvp[0] = 0;
	for (uint32_t r = 0; r < n_rows; r++) {
		const mrow *w = &rows[r];
		const uint32_t blocks = (w->ctx + BT - 1) / BT;
		for (uint32_t i = 0; i < blocks; i++)
			kvi[nb++] = w->blocks[i];
		for (uint32_t p = w->ctx - w->n_new; p < w->ctx; p++, nt++) {
			tok[nt] = w->seq[p];
			pos[nt] = (int32_t)p;
			slot[nt] = w->blocks[p / BT] * BT + (int32_t)(p % BT);
		}
		qo[r + 1] = (int32_t)nt;
		kvp[r + 1] = (int32_t)nb;
		last[r] = (int32_t)(w->ctx - (blocks - 1) * BT);
		samp[r] = 1;
		req[r] = r + 1;
		branch[r] = w->branch;
		user[r] = w->user;
	}
	bkv_batch b = {
		.kind = kind, .n_rows = n_rows, .n_decode_rows = n_decode, .n_tokens = nt,
		.block_tokens = BT, .token_ids = tok, .positions = pos, .qo_indptr = qo,
		.kv_indptr = kvp, .kv_indices = kvi, .kv_last_page_len = last,
		.slot_mapping = slot, .row_sample = samp, .row_req = req, .row_branch = branch,
		.row_user = user,
	};
	if (mc) {
		b.copies = mc->copies, b.n_copies = mc->n_copies;
		b.swap_out = mc->swap_out, b.n_swap_out = mc->n_swap_out;
		b.swap_in = mc->swap_in, b.n_swap_in = mc->n_swap_in;
	}
	if (mp) {
		b.layout = BKV_BATCH_PERSISTENT;
		b.kv_indptr = b.kv_indices = NULL;
		b.n_row_slots = mp->n_slots;
		b.row_slot = mp->row_slot;
		b.row_tables = mp->tables;
		b.row_table_len = mp->table_len;
		b.n_table_deltas = mp->n_deltas;
		b.table_deltas = mp->deltas;
		b.delta_blocks = mp->delta_blocks;
	}
	switch (kind) {
	case BKV_CALL_PREFILL:
		return tlm_host_prefill(h, &b, next);
	case BKV_CALL_DECODE:
		return tlm_host_decode(h, &b, next);
	default:
		return tlm_host_forward(h, &b, next);
	}
}

static int run_rows(tlm_host *h, bkv_call_kind kind, const mrow *rows, uint32_t n_rows,
		    uint32_t n_decode, const mcopies *mc, int32_t *next)
{
	return run_rows_ex(h, kind, rows, n_rows, n_decode, mc, NULL, next);
}

static tlm_model *small_model(void)
{
	tlm_config c;
	tlm_config_small(&c);
	tlm_model *m = tlm_model_create(&c);
	cr_assert_not_null(m);
	return m;
}

static void fill_prompt(int32_t *p, uint32_t n, uint32_t salt, uint32_t vocab)
{
	for (uint32_t i = 0; i < n; i++)
		p[i] = (int32_t)(tlm_mix64(salt * 7919u + i) % vocab);
}

Test(tinylm, paged_attention_matches_contiguous_on_scattered_blocks)
{
	tlm_model *m = small_model();
	tlm_host *h = tlm_host_create(m, BT, 32, 0);
	cr_assert_not_null(h);
	/* Two requests; their blocks interleave out of order in the tensor. */
	const int32_t blocks_a[] = {11, 3, 17, 0, 29, 6, 21};
	const int32_t blocks_b[] = {5, 30, 2, 14, 9, 25, 1};
	enum { LA = 37, LB = 13, NEW = 12 };
	int32_t seq_a[LA + NEW], seq_b[LB + NEW];
	fill_prompt(seq_a, LA, 1, m->cfg.vocab);
	fill_prompt(seq_b, LB, 2, m->cfg.vocab);
	int32_t ref_a[NEW], ref_b[NEW];
	uint32_t len_a, len_b;
	cr_assert_eq(tlm_ref_generate(m, seq_a, LA, NEW, NULL, 0, 1, 0, ref_a, &len_a), 0);
	cr_assert_eq(tlm_ref_generate(m, seq_b, LB, NEW, NULL, 0, 1, 0, ref_b, &len_b), 0);
	cr_assert_eq(len_a, NEW);
	int32_t next[MAXR];
	/* Step 1: A's first chunk (20 tokens) alone, a split prefill call. */
	mrow r1 = {blocks_a, seq_a, 20, 20, 0, NULL};
	cr_assert_eq(run_rows(h, BKV_CALL_PREFILL, &r1, 1, 0, NULL, next), 0);
	/* Step 2: mixed: A's last 17 prompt tokens and all of B in one call. */
	mrow r2[2] = {{blocks_a, seq_a, LA, LA - 20, 0, NULL}, {blocks_b, seq_b, LB, LB, 0, NULL}};
	cr_assert_eq(run_rows(h, BKV_CALL_MIXED, r2, 2, 0, NULL, next), 0,
		     "%s", tlm_host_last_error(h));
	seq_a[LA] = next[0];
	seq_b[LB] = next[1];
	/* Decode both together. */
	for (uint32_t i = 1; i < NEW; i++) {
		mrow d[2] = {{blocks_a, seq_a, LA + i, 1, 0, NULL},
			     {blocks_b, seq_b, LB + i, 1, 0, NULL}};
		cr_assert_eq(run_rows(h, BKV_CALL_DECODE, d, 2, 2, NULL, next), 0,
			     "%s", tlm_host_last_error(h));
		seq_a[LA + i] = next[0];
		seq_b[LB + i] = next[1];
	}
	for (uint32_t i = 0; i < NEW; i++) {
		cr_assert_eq(seq_a[LA + i], ref_a[i], "A token %u", i);
		cr_assert_eq(seq_b[LB + i], ref_b[i], "B token %u", i);
	}
	tlm_host_stats st;
	tlm_host_stats_get(h, &st);
	cr_assert_eq(st.violations, 0);
	cr_assert_eq(st.tokens, (uint64_t)LA + LB + 2 * (NEW - 1));
	tlm_host_destroy(h);
	tlm_model_destroy(m);
}

Test(tinylm, forked_branches_after_copy_on_write_match_reference)
{
	tlm_model *m = small_model();
	tlm_host *h = tlm_host_create(m, BT, 32, 0);
	enum { L = 21, NEW = 10 }; /* 21 tokens: block 2 is partial (5 of 8) */
	tlm_sampling samp = {.seed = 99, .n_samples = 2};
	int32_t s0[L + NEW], s1[L + NEW];
	fill_prompt(s0, L, 3, m->cfg.vocab);
	int32_t ref[2 * NEW];
	uint32_t ref_len[2];
	cr_assert_eq(tlm_ref_generate(m, s0, L, NEW, NULL, 0, 2, 99, ref, ref_len), 0);
	cr_assert_eq(ref_len[1], NEW);
	int32_t b0[] = {4, 8, 15, 16, 23, 24};
	int32_t b1[] = {4, 8, 12, 20, 22, 26}; /* shares full blocks 4, 8 */
	int32_t next[MAXR];
	mrow p = {b0, s0, L, L, 0, &samp};
	cr_assert_eq(run_rows(h, BKV_CALL_MIXED, &p, 1, 0, NULL, next), 0);
	s0[L] = next[0];
	/* Branch 1 samples its own first token from the same prompt: a prefill
	 * row of zero new tokens is not allowed, so recompute the last prompt
	 * token into its own copy of the partial block. */
	memcpy(s1, s0, L * sizeof(int32_t));
	bkv_copy cow = {15, 12};
	mcopies mc = {.copies = &cow, .n_copies = 1};
	mrow p1 = {b1, s1, L, 1, 1, &samp};
	cr_assert_eq(run_rows(h, BKV_CALL_MIXED, &p1, 1, 0, &mc, next), 0,
		     "%s", tlm_host_last_error(h));
	s1[L] = next[0];
	for (uint32_t i = 1; i < NEW; i++) {
		mrow d[2] = {{b0, s0, L + i, 1, 0, &samp}, {b1, s1, L + i, 1, 1, &samp}};
		cr_assert_eq(run_rows(h, BKV_CALL_DECODE, d, 2, 2, NULL, next), 0);
		s0[L + i] = next[0];
		s1[L + i] = next[1];
	}
	int differ = 0;
	for (uint32_t i = 0; i < NEW; i++) {
		cr_assert_eq(s0[L + i], ref[i], "branch 0 token %u", i);
		cr_assert_eq(s1[L + i], ref[NEW + i], "branch 1 token %u", i);
		differ |= s0[L + i] != s1[L + i];
	}
	cr_assert(differ, "forked branches must sample different tokens");
	tlm_host_stats st;
	tlm_host_stats_get(h, &st);
	cr_assert_eq(st.copies, 1);
	tlm_host_destroy(h);
	tlm_model_destroy(m);
}

Test(tinylm, swapped_out_and_back_sequence_continues_exactly)
{
	tlm_model *m = small_model();
	tlm_host *h = tlm_host_create(m, BT, 8, 8);
	enum { L = 19, NEW = 8 };
	int32_t s[L + NEW], t[40];
	fill_prompt(s, L, 5, m->cfg.vocab);
	fill_prompt(t, 24, 6, m->cfg.vocab);
	int32_t ref[NEW];
	uint32_t ref_len;
	cr_assert_eq(tlm_ref_generate(m, s, L, NEW, NULL, 0, 1, 0, ref, &ref_len), 0);
	int32_t before[] = {1, 2, 3, 4};
	int32_t after[] = {6, 0, 5, 7};
	int32_t next[MAXR];
	mrow p = {before, s, L, L, 0, NULL};
	cr_assert_eq(run_rows(h, BKV_CALL_MIXED, &p, 1, 0, NULL, next), 0);
	s[L] = next[0];
	for (uint32_t i = 1; i < 4; i++) {
		mrow d = {before, s, L + i, 1, 0, NULL};
		cr_assert_eq(run_rows(h, BKV_CALL_DECODE, &d, 1, 1, NULL, next), 0);
		s[L + i] = next[0];
	}
	/* Swap out (device 1,2,3 -> host 7,5,3) in the same call as another
	 * sequence overwrites those device blocks. */
	const bkv_copy out[] = {{1, 7}, {2, 5}, {3, 3}};
	mcopies mo = {.swap_out = out, .n_swap_out = 3};
	int32_t other[] = {3, 1, 2};
	mrow o = {other, t, 24, 24, 0, NULL};
	cr_assert_eq(run_rows(h, BKV_CALL_MIXED, &o, 1, 0, &mo, next), 0);
	/* Swap back in to different device blocks and keep decoding. */
	const bkv_copy in[] = {{7, 6}, {5, 0}, {3, 5}};
	mcopies mi = {.swap_in = in, .n_swap_in = 3};
	for (uint32_t i = 4; i < NEW; i++) {
		mrow d = {after, s, L + i, 1, 0, NULL};
		cr_assert_eq(run_rows(h, BKV_CALL_DECODE, &d, 1, 1, i == 4 ? &mi : NULL, next), 0,
			     "%s", tlm_host_last_error(h));
		s[L + i] = next[0];
	}
	for (uint32_t i = 0; i < NEW; i++)
		cr_assert_eq(s[L + i], ref[i], "token %u", i);
	tlm_host_stats st;
	tlm_host_stats_get(h, &st);
	cr_assert_eq(st.swap_out, 3);
	cr_assert_eq(st.swap_in, 3);
	tlm_host_destroy(h);
	tlm_model_destroy(m);
}

Test(tinylm, host_rejects_batch_whose_positions_disagree_with_block_table)
{
	tlm_model *m = small_model();
	tlm_host *h = tlm_host_create(m, BT, 8, 0);
	int32_t s[12];
	fill_prompt(s, 12, 7, m->cfg.vocab);
	int32_t blocks[] = {0, 1};
	int32_t next[MAXR];
	mrow p = {blocks, s, 12, 12, 0, NULL};
	/* A decode call must have only single-token rows. */
	cr_assert_eq(run_rows(h, BKV_CALL_DECODE, &p, 1, 1, NULL, next), -1);
	/* A block id past the tensor. */
	int32_t bad[] = {0, 8};
	mrow q = {bad, s, 12, 12, 0, NULL};
	cr_assert_eq(run_rows(h, BKV_CALL_MIXED, &q, 1, 0, NULL, next), -1);
	tlm_host_stats st;
	tlm_host_stats_get(h, &st);
	cr_assert_eq(st.violations, 2);
	cr_assert_eq(st.tokens, 0);
	tlm_host_destroy(h);
	tlm_model_destroy(m);
}

/* ------------------------------------------------------------------------ */
/* Hand-built persistent calls                                               */
/* ------------------------------------------------------------------------ */

#define PSLOTS 4

/* A minimal "library" side of the persistent layout: the tables of PSLOTS
 * slots, what the host was last sent of each, and the call's deltas. */
typedef struct pstate {
	const int32_t *tables[PSLOTS];
	uint32_t len[PSLOTS];
	uint32_t sent[PSLOTS];       /* entries the host has; UINT32_MAX: open it */
	uint32_t slots[MAXR];
	bkv_table_delta d[2 * PSLOTS];
	int32_t blk[MAXT];
	mpersist mp;
} pstate;

static void pstate_init(pstate *ps)
{
	memset(ps, 0, sizeof(*ps));
	for (uint32_t i = 0; i < PSLOTS; i++)
		ps->sent[i] = UINT32_MAX;
	ps->mp.n_slots = PSLOTS;
	ps->mp.row_slot = ps->slots;
	ps->mp.deltas = ps->d;
	ps->mp.delta_blocks = ps->blk;
	ps->mp.tables = ps->tables;
	ps->mp.table_len = ps->len;
}

/* Put rows[i] in slots[i] and build the deltas that bring the host's tables
 * to the rows' (OPENED the first time, then the appended entries). */
static const mpersist *pstate_call(pstate *ps, const mrow *rows, const uint32_t *slots,
				   uint32_t n_rows)
{
	uint32_t nd = 0, nb = 0;
	for (uint32_t r = 0; r < n_rows; r++) {
		const uint32_t s = slots[r], len = (rows[r].ctx + BT - 1) / BT;
		ps->slots[r] = s;
		ps->tables[s] = rows[r].blocks;
		ps->len[s] = len;
		if (ps->sent[s] == len)
			continue;
		const int open = ps->sent[s] == UINT32_MAX;
		const uint32_t start = open ? 0 : ps->sent[s];
		ps->d[nd++] = (bkv_table_delta){.slot = s, .start = start, .n = len - start,
						.len = len, .flags = open ? BKV_TABLE_OPENED : 0};
		memcpy(ps->blk + nb, rows[r].blocks + start, (len - start) * sizeof(int32_t));
		nb += len - start;
		ps->sent[s] = len;
	}
	ps->mp.n_deltas = nd;
	return &ps->mp;
}

Test(tinylm, persistent_calls_attend_through_the_mirrored_tables)
{
	tlm_model *m = small_model();
	tlm_host *h = tlm_host_create(m, BT, 32, 0);
	cr_assert_not_null(h);
	const int32_t blocks_a[] = {11, 3, 17, 0, 29, 6, 21};
	const int32_t blocks_b[] = {5, 30, 2, 14, 9, 25, 1};
	enum { LA = 37, LB = 13, NEW = 12 };
	int32_t seq_a[LA + NEW], seq_b[LB + NEW];
	fill_prompt(seq_a, LA, 1, m->cfg.vocab);
	fill_prompt(seq_b, LB, 2, m->cfg.vocab);
	int32_t ref_a[NEW], ref_b[NEW];
	uint32_t len_a, len_b;
	cr_assert_eq(tlm_ref_generate(m, seq_a, LA, NEW, NULL, 0, 1, 0, ref_a, &len_a), 0);
	cr_assert_eq(tlm_ref_generate(m, seq_b, LB, NEW, NULL, 0, 1, 0, ref_b, &len_b), 0);
	pstate ps;
	pstate_init(&ps);
	int32_t next[MAXR];
	/* A's first chunk in slot 2 (opened with 3 entries). */
	mrow r1 = {blocks_a, seq_a, 20, 20, 0, NULL};
	const uint32_t s1[] = {2};
	cr_assert_eq(run_rows_ex(h, BKV_CALL_PREFILL, &r1, 1, 0, NULL, pstate_call(&ps, &r1, s1, 1),
				 next), 0, "%s", tlm_host_last_error(h));
	/* A's rest (2 entries appended) and B opened in slot 0, one call. */
	mrow r2[2] = {{blocks_a, seq_a, LA, LA - 20, 0, NULL}, {blocks_b, seq_b, LB, LB, 0, NULL}};
	const uint32_t s2[] = {2, 0};
	cr_assert_eq(run_rows_ex(h, BKV_CALL_MIXED, r2, 2, 0, NULL, pstate_call(&ps, r2, s2, 2),
				 next), 0, "%s", tlm_host_last_error(h));
	cr_assert_eq(ps.mp.n_deltas, 2);
	seq_a[LA] = next[0];
	seq_b[LB] = next[1];
	/* Decode in swapped row order: the slot, not the row, names a table;
	 * a delta only when a row crosses into a new block. */
	uint32_t with_delta = 0;
	for (uint32_t i = 1; i < NEW; i++) {
		mrow d[2] = {{blocks_b, seq_b, LB + i, 1, 0, NULL},
			     {blocks_a, seq_a, LA + i, 1, 0, NULL}};
		const uint32_t sd[] = {0, 2};
		const mpersist *mp = pstate_call(&ps, d, sd, 2);
		with_delta += mp->n_deltas > 0;
		cr_assert_eq(run_rows_ex(h, BKV_CALL_DECODE, d, 2, 2, NULL, mp, next), 0, "%s",
			     tlm_host_last_error(h));
		seq_b[LB + i] = next[0];
		seq_a[LA + i] = next[1];
	}
	/* A enters its sixth block at context 41 and B its third at 17: both
	 * at i = 4, one entry each. */
	cr_assert_eq(with_delta, 1);
	for (uint32_t i = 0; i < NEW; i++) {
		cr_assert_eq(seq_a[LA + i], ref_a[i], "A token %u", i);
		cr_assert_eq(seq_b[LB + i], ref_b[i], "B token %u", i);
	}
	tlm_host_stats st;
	tlm_host_stats_get(h, &st);
	cr_assert_eq(st.violations, 0);
	cr_assert_eq(st.deltas, 5);
	cr_assert_eq(st.delta_entries, 3 + 2 + 2 + 1 + 1);
	cr_assert_eq(st.mirror_rows, 1 + 2 + 2 * (NEW - 1));
	cr_assert_eq(st.mirror_mismatches, 0);
	tlm_host_destroy(h);
	tlm_model_destroy(m);
}

Test(tinylm, persistent_host_rejects_bad_deltas_and_counts_a_stale_library_table)
{
	tlm_model *m = small_model();
	tlm_host *h = tlm_host_create(m, BT, 32, 0);
	int32_t s[12];
	fill_prompt(s, 12, 7, m->cfg.vocab);
	int32_t blocks[] = {4, 9};
	int32_t next[MAXR];
	pstate ps;
	pstate_init(&ps);
	mrow p = {blocks, s, 12, 12, 0, NULL};
	const uint32_t s0[] = {1};
	cr_assert_eq(run_rows_ex(h, BKV_CALL_MIXED, &p, 1, 0, NULL, pstate_call(&ps, &p, s0, 1), next),
		     0, "%s", tlm_host_last_error(h));
	/* A delta that starts past the mirrored table's end leaves a hole. */
	const bkv_table_delta hole = {.slot = 1, .start = 3, .n = 1, .len = 4};
	const int32_t hole_blk[] = {7};
	mpersist mp = ps.mp;
	mp.n_deltas = 1, mp.deltas = &hole, mp.delta_blocks = hole_blk;
	cr_assert_eq(run_rows_ex(h, BKV_CALL_MIXED, &p, 1, 0, NULL, &mp, next), -1);
	/* A slot past n_row_slots, and a CLOSED delta that writes. */
	const bkv_table_delta far = {.slot = PSLOTS, .start = 0, .n = 0, .len = 0,
				     .flags = BKV_TABLE_CLOSED};
	mp.deltas = &far;
	cr_assert_eq(run_rows_ex(h, BKV_CALL_MIXED, &p, 1, 0, NULL, &mp, next), -1);
	const bkv_table_delta wclose = {.slot = 1, .start = 0, .n = 1, .len = 1,
					.flags = BKV_TABLE_CLOSED};
	mp.deltas = &wclose;
	cr_assert_eq(run_rows_ex(h, BKV_CALL_MIXED, &p, 1, 0, NULL, &mp, next), -1);
	/* Two rows of one call in one slot. */
	mrow two[2] = {p, p};
	const uint32_t same[] = {1, 1};
	mp = *pstate_call(&ps, two, same, 2);
	cr_assert_eq(run_rows_ex(h, BKV_CALL_MIXED, two, 2, 0, NULL, &mp, next), -1);
	tlm_host_stats st;
	tlm_host_stats_get(h, &st);
	cr_assert_eq(st.violations, 4);
	cr_assert_eq(st.mirror_mismatches, 0);
	/* The library's table disagreeing with a correct mirror is counted
	 * (the host still computes from its mirror, the row's true table). */
	const int32_t other[] = {4, 10};
	mp = *pstate_call(&ps, &p, s0, 1);
	ps.tables[1] = other;
	cr_assert_eq(run_rows_ex(h, BKV_CALL_MIXED, &p, 1, 0, NULL, &mp, next), 0, "%s",
		     tlm_host_last_error(h));
	tlm_host_stats_get(h, &st);
	cr_assert_eq(st.mirror_mismatches, 1);
	/* CLOSED empties the slot: a row on it has no table. */
	const bkv_table_delta close1 = {.slot = 1, .flags = BKV_TABLE_CLOSED};
	mp.n_deltas = 1, mp.deltas = &close1;
	ps.len[1] = 0;
	cr_assert_eq(run_rows_ex(h, BKV_CALL_MIXED, &p, 1, 0, NULL, &mp, next), -1);
	cr_assert(strstr(tlm_host_last_error(h), "empty"), "%s", tlm_host_last_error(h));
	tlm_host_destroy(h);
	tlm_model_destroy(m);
}

/* ------------------------------------------------------------------------ */
/* Batches built from the pool's own block tables                            */
/* ------------------------------------------------------------------------ */

/* A row over a pool sequence: its last n_new tokens (already appended) are
 * this call's tokens; seq_tokens holds the whole sequence. */
typedef struct prow {
	uint32_t seq;
	const int32_t *seq_tokens;
	uint32_t n_new;
	uint32_t branch;
	tlm_sampling *user;
} prow;

/* Build the batch from bkv_seq_blocks / bkv_seq_info_get and the pool's
 * pending copies, run it, clear the copies. */
static int run_pool_rows(tlm_host *h, bkv_pool *pool, const prow *rows, uint32_t n_rows,
			 int32_t *next)
{
	mrow mr[MAXR];
	static int32_t tables[MAXR][64];
	for (uint32_t r = 0; r < n_rows; r++) {
		uint32_t nb = 0;
		const int32_t *t = bkv_seq_blocks(pool, rows[r].seq, &nb);
		bkv_seq_info info;
		cr_assert_eq(bkv_seq_info_get(pool, rows[r].seq, &info), BKV_OK);
		cr_assert(nb <= 64 && t);
		memcpy(tables[r], t, nb * sizeof(int32_t));
		mr[r] = (mrow){tables[r], rows[r].seq_tokens, info.len, rows[r].n_new,
			       rows[r].branch, rows[r].user};
	}
	mcopies mc;
	mc.n_copies = bkv_pool_pending_copies(pool, BKV_COPY_DEVICE, &mc.copies);
	mc.n_swap_out = bkv_pool_pending_copies(pool, BKV_COPY_SWAP_OUT, &mc.swap_out);
	mc.n_swap_in = bkv_pool_pending_copies(pool, BKV_COPY_SWAP_IN, &mc.swap_in);
	uint32_t n_decode = 0;
	while (n_decode < n_rows && rows[n_decode].n_new == 1)
		n_decode++;
	int rc = run_rows(h, BKV_CALL_MIXED, mr, n_rows, n_decode, &mc, next);
	bkv_pool_clear_copies(pool, BKV_COPY_SWAP_OUT);
	bkv_pool_clear_copies(pool, BKV_COPY_SWAP_IN);
	bkv_pool_clear_copies(pool, BKV_COPY_DEVICE);
	return rc;
}

Test(tinylm, pool_tables_with_prefix_hits_fork_and_swap_match_reference)
{
	tlm_model *m = small_model();
	bkv_pool_config pc;
	bkv_pool_config_init(&pc);
	pc.block_tokens = BT;
	pc.device_blocks = 24;
	pc.host_blocks = 16;
	bkv_pool *pool = NULL;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	tlm_host *h = tlm_host_create(m, BT, 24, 16);
	enum { L = 21, NEW = 10 };
	/* A: n = 2 (branches in seqs a and c); B: same prompt, n = 1. */
	tlm_sampling sa = {.seed = 11, .n_samples = 2}, sb = {.seed = 12, .n_samples = 1};
	int32_t a[L + NEW], b[L + NEW], c[L + NEW];
	fill_prompt(a, L, 9, m->cfg.vocab);
	memcpy(b, a, L * sizeof(int32_t));
	memcpy(c, a, L * sizeof(int32_t));
	int32_t ref_a[2 * NEW], ref_b[NEW];
	uint32_t la[2], lb;
	cr_assert_eq(tlm_ref_generate(m, a, L, NEW, NULL, 0, 2, 11, ref_a, la), 0);
	cr_assert_eq(tlm_ref_generate(m, b, L, NEW, NULL, 0, 1, 12, ref_b, &lb), 0);
	uint32_t sqa, sqb, sqc, hit = 99;
	int32_t next[MAXR];
	cr_assert_eq(bkv_seq_open(pool, &sqa), BKV_OK);
	cr_assert_eq(bkv_seq_append(pool, sqa, a, L, &hit), BKV_OK);
	cr_assert_eq(hit, 0);
	prow pa = {sqa, a, L, 0, &sa};
	cr_assert_eq(run_pool_rows(h, pool, &pa, 1, next), 0, "%s", tlm_host_last_error(h));
	a[L] = next[0];
	/* B hits A's two full blocks and computes only the last 5 tokens. */
	cr_assert_eq(bkv_seq_open(pool, &sqb), BKV_OK);
	cr_assert_eq(bkv_seq_append(pool, sqb, b, L, &hit), BKV_OK);
	cr_assert_eq(hit, 16);
	/* C forks A before A's first token; its first sample recomputes the
	 * last prompt token, into a copy of the shared partial block. */
	cr_assert_eq(bkv_seq_fork(pool, sqa, &sqc), BKV_OK);
	cr_assert_eq(bkv_seq_truncate(pool, sqc, L - 1), BKV_OK);
	cr_assert_eq(bkv_seq_append(pool, sqc, &c[L - 1], 1, NULL), BKV_OK);
	cr_assert_eq(bkv_seq_append(pool, sqa, &a[L], 1, NULL), BKV_OK);
	{
		prow rows[3] = {{sqa, a, 1, 0, &sa}, {sqb, b, L - 16, 0, &sb}, {sqc, c, 1, 1, &sa}};
		cr_assert_eq(run_pool_rows(h, pool, rows, 3, next), 0, "%s",
			     tlm_host_last_error(h));
		a[L + 1] = next[0];
		b[L] = next[1];
		c[L] = next[2];
	}
	/* Decode all three; C is swapped out for steps 3..5 and comes back. */
	uint32_t c_done = 1; /* tokens C has */
	for (uint32_t i = 1; i < NEW; i++) {
		if (i == 3)
			cr_assert_eq(bkv_seq_swap_out(pool, sqc), BKV_OK);
		if (i == 6)
			cr_assert_eq(bkv_seq_swap_in(pool, sqc), BKV_OK);
		const int c_on = i < 3 || i >= 6;
		prow rows[3];
		uint32_t n = 0;
		if (i + 1 < NEW) {
			cr_assert_eq(bkv_seq_append(pool, sqa, &a[L + i], 1, NULL), BKV_OK);
			rows[n++] = (prow){sqa, a, 1, 0, &sa};
		}
		cr_assert_eq(bkv_seq_append(pool, sqb, &b[L + i - 1], 1, NULL), BKV_OK);
		rows[n++] = (prow){sqb, b, 1, 0, &sb};
		if (c_on) {
			cr_assert_eq(bkv_seq_append(pool, sqc, &c[L + c_done - 1], 1, NULL), BKV_OK);
			rows[n++] = (prow){sqc, c, 1, 1, &sa};
		}
		cr_assert_eq(run_pool_rows(h, pool, rows, n, next), 0, "step %u: %s", i,
			     tlm_host_last_error(h));
		uint32_t k = 0;
		if (i + 1 < NEW)
			a[L + i + 1] = next[k++];
		b[L + i] = next[k++];
		if (c_on)
			c[L + c_done++] = next[k++];
		cr_assert_eq(bkv_pool_check(pool), 0);
	}
	for (uint32_t i = 0; i < NEW; i++) {
		cr_assert_eq(a[L + i], ref_a[i], "A branch 0 token %u", i);
		cr_assert_eq(b[L + i], ref_b[i], "B token %u", i);
	}
	for (uint32_t i = 0; i < NEW - 3; i++)
		cr_assert_eq(c[L + i], ref_a[NEW + i], "A branch 1 token %u", i);
	tlm_host_stats st;
	tlm_host_stats_get(h, &st);
	cr_assert_geq(st.copies, 1);
	cr_assert_geq(st.swap_out, 1);
	cr_assert_geq(st.swap_in, 1);
	tlm_host_destroy(h);
	bkv_pool_destroy(pool);
	tlm_model_destroy(m);
}

/* ------------------------------------------------------------------------ */
/* A few hundred requests through bkv_step                                   */
/* ------------------------------------------------------------------------ */

/* Requests per scheduler test: 300, or TINYLM_TEST_JOBS; AddressSanitizer
 * builds default to 100 (the same mix, fewer of them). */
static uint32_t test_jobs(void)
{
	const char *e = getenv("TINYLM_TEST_JOBS");
	if (e && atoi(e) > 0)
		return (uint32_t)atoi(e);
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TINYLM_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(TINYLM_ASAN)
	return 100;
#else
	return 300;
#endif
}

static tlm_model *g_model;
static tlm_workload g_w;

static void serve_setup(void)
{
	g_model = small_model();
	tlm_workload_config wc;
	tlm_workload_config_default(&wc);
	wc.n_jobs = test_jobs();
	cr_assert_eq(tlm_workload_create(&g_w, &wc, g_model->cfg.vocab), 0);
	cr_assert_eq(tlm_workload_reference(&g_w, g_model), 0);
}

static void serve_teardown(void)
{
	tlm_workload_destroy(&g_w);
	tlm_model_destroy(g_model);
}

static void run_config(tlm_run_config *rc, uint32_t device_blocks)
{
	memset(rc, 0, sizeof(*rc));
	bkv_sched_config_init(&rc->sched);
	rc->sched.max_running = 16;
	/* An explicit k: with k = 0 (auto) the default cost model, which
	 * learns from measured step times, would pick k and a batch cap, and
	 * whether a tight pool preempts would depend on the machine's load. */
	rc->sched.admit_group = 1;
	rc->block_tokens = 16;
	rc->device_blocks = device_blocks;
	rc->submit_per_step = 0;
}

/* Serve g_w under rc and require every sequence to equal the reference. */
static void serve_and_verify(const tlm_run_config *rc, tlm_run_result *res)
{
	int st = tlm_run(&g_w, g_model, rc, res);
	cr_assert_eq(st, 0, "run failed: %s (%d); host: %s",
		     st == TLM_STUCK ? "stuck: requests pending after max_steps" : bkv_strerror(st), st,
		     res->host_error);
	char msg[512];
	uint32_t bad = tlm_workload_verify(&g_w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%u of %u requests differ from the reference; first: %s", bad,
		     g_w.n_jobs, msg);
	cr_assert_eq(res->check, 0, "bkv_sched_check = %d", res->check);
	cr_assert_eq(res->host.violations, 0);
	cr_assert_eq(res->sched.finished, g_w.n_jobs);
	cr_assert_eq(res->sched.submitted, g_w.n_jobs);
	/* The workload really exercised the prefix cache. */
	cr_assert_gt(res->sched.hit_tokens, 0);
	cr_assert_eq(res->pool.nr_used, 0, "blocks still referenced after the run");
}

/* Serve g_w under rc in the persistent layout: token-exact as in the flat
 * one, and on every row of every call the host's mirrored table equals the
 * library's row_tables. */
static void serve_persistent(tlm_run_config *rc, tlm_run_result *res)
{
	rc->sched.batch_layout = BKV_BATCH_PERSISTENT;
	serve_and_verify(rc, res);
	cr_assert_gt(res->host.mirror_rows, 0);
	cr_assert_geq(res->host.mirror_rows, res->host.rows);
	cr_assert_eq(res->host.mirror_mismatches, 0, "%llu of %llu rows' mirrored tables differ",
		     (unsigned long long)res->host.mirror_mismatches,
		     (unsigned long long)res->host.mirror_rows);
	cr_assert_gt(res->host.deltas, 0);
	/* forks copy-on-write their shared partial last block (a replaced
	 * entry in the delta); one-token blocks are never partial */
	if (rc->block_tokens > 1)
		cr_assert_gt(res->host.copies, 0);
	cr_assert_gt(res->sched.aborted, 0);
}

/* The scenarios both layouts run (the flat suite's tests and their
 * persistent twins): serve is serve_flat or serve_persistent. */
typedef void (*serve_fn)(tlm_run_config *rc, tlm_run_result *res);

static void serve_flat(tlm_run_config *rc, tlm_run_result *res)
{
	serve_and_verify(rc, res);
}

static void split_calls(serve_fn serve, tlm_run_result *res)
{
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.split = 1;
	serve(&rc, res);
	cr_assert_gt(res->host.calls[BKV_CALL_PREFILL], 0);
	cr_assert_gt(res->host.calls[BKV_CALL_DECODE], 0);
	cr_assert_eq(res->host.calls[BKV_CALL_MIXED], 0);
}

static void split_failures_with_swap(serve_fn serve, tlm_run_result *res)
{
	tlm_run_config rc;
	run_config(&rc, 32);
	rc.host_blocks = 256;
	rc.split = 1;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	rc.fail_every = 5;
	serve(&rc, res);
	cr_assert_gt(res->failed_steps, 1);
	cr_assert_eq(res->sched.failed_steps, res->failed_steps);
	cr_assert_gt(res->sched.preemptions, 0);
}

static void tight_pool_swap(serve_fn serve, tlm_run_result *res)
{
	tlm_run_config rc;
	run_config(&rc, 40);
	rc.host_blocks = 256;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	serve(&rc, res);
	cr_assert_gt(res->sched.swaps, 0, "the pool was meant to force swapping");
	cr_assert_gt(res->host.swap_out, 0);
	cr_assert_gt(res->host.swap_in, 0);
}

static void failures_roll_back(serve_fn serve, tlm_run_result *res)
{
	tlm_run_config rc;
	run_config(&rc, 48);
	rc.host_blocks = 128;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.fail_every = 7;
	serve(&rc, res);
	cr_assert_gt(res->failed_steps, 0);
	cr_assert_eq(res->sched.failed_steps, res->failed_steps);
}

static void case_chunked_split_swap_tight_pool_matches_re(serve_fn serve, tlm_run_result *res)
{
	tlm_run_config rc;
	/* 32 blocks: a shared prompt's blocks are held once (duplicates are
	 * swapped for the cached copy at commit), so 40 no longer forced
	 * preemption with the sanitizer build's 100 jobs */
	run_config(&rc, 32);
	rc.host_blocks = 256;
	rc.split = 1;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.admit_group = 4;
	rc.submit_per_step = 3;
	serve(&rc, res);
	cr_assert_gt(res->sched.preemptions, 0);
}

/* What every workload must contain for the tests to mean something. */
Test(tinylm_serve, workload_has_forks_aborts_stops_and_shared_prefixes, .init = serve_setup,
     .fini = serve_teardown)
{
	uint32_t forks = 0, aborts = 0, stops = 0, bare = 0;
	for (uint32_t j = 0; j < g_w.n_jobs; j++) {
		const tlm_job *jb = &g_w.jobs[j];
		forks += jb->sampling.n_samples > 1;
		aborts += jb->abort_after != 0;
		stops += jb->stop >= 0 && jb->ref_len[0] < jb->max_new;
		bare += jb->prompt_len <= 3;
	}
	cr_assert_gt(forks, 3);
	cr_assert_gt(aborts, 3);
	cr_assert_gt(stops, 3);
	cr_assert_gt(bare, 0);
}

Test(tinylm_serve, static_batching_matches_reference, .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.sched.policy = BKV_POLICY_STATIC;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_eq(res.sched.preemptions, 0);
}

Test(tinylm_serve, continuous_k1_matches_reference, .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.sched.admit_group = 1;
	rc.submit_per_step = 5; /* arrivals over time */
	tlm_run_result res;
	serve_and_verify(&rc, &res);
}

Test(tinylm_serve, continuous_k4_matches_reference, .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.sched.admit_group = 4;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
}

Test(tinylm_serve, chunked_mixed_steps_under_a_token_budget_match_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 40; /* below most prompts: they are split */
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_leq(res.host.tokens, (uint64_t)res.steps * 40);
}

Test(tinylm_serve, split_prefill_and_decode_calls_match_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_result res;
	split_calls(serve_flat, &res);
}

Test(tinylm_serve, split_host_packing_prefill_calls_by_length_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	/* admission auto on a split host packs each step's prompts into
	 * prefill calls by length; seed 000's padded polynomial as the model
	 * (not a learnt one) keeps the schedule independent of the machine */
	bkv_cost_poly poly;
	bkv_cost_poly_init(&poly);
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.split = 1;
	rc.sched.admit_group = 0;
	rc.sched.cost = bkv_cost_poly_model(&poly);
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.multi_prefill_steps, 0, "no step packed its prompts into several calls");
	cr_assert_gt(res.sched.prefill_calls, res.multi_prefill_steps);
	cr_assert_eq(res.host.calls[BKV_CALL_PREFILL], res.sched.prefill_calls);
	cr_assert_eq(res.host.calls[BKV_CALL_MIXED], 0);
}

Test(tinylm_serve, preemption_by_recompute_in_a_tight_pool_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 40); /* 640 slots for 16 running requests of ~50..110 */
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to force preemption");
	cr_assert_eq(res.sched.swaps, 0);
}

/* Issue 22's rules together in a tight pool with chunked prefill: the
 * cache evicts by value, preemption picks victims by cost; every request
 * still matches the reference token for token. */
Test(tinylm_serve, chunked_tight_pool_evicting_by_value_victims_by_cost_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	tlm_run_result res;

	run_config(&rc, 40);
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.evict = BKV_EVICT_VALUE;
	rc.sched.victim = BKV_VICTIM_COST;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.sched.preemptions, 0, "the pool was meant to force preemption");
	cr_assert_gt(res.pool.evictions, 0, "the cache was meant to evict");
}

/* Admission by expected memory takes fewer preemptions than admission by
 * the prompt in the same tight pool, and stays token-exact. */
Test(tinylm_serve, admission_by_expected_memory_preempts_less_and_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	tlm_run_result by_prompt, by_output;

	run_config(&rc, 40);
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	serve_and_verify(&rc, &by_prompt);
	rc.sched.admit_reserve = BKV_RESERVE_OUTPUT;
	serve_and_verify(&rc, &by_output);
	cr_assert_gt(by_prompt.sched.preemptions, 0);
	cr_assert_lt(by_output.sched.preemptions, by_prompt.sched.preemptions,
		     "reserve output %llu, prompt %llu",
		     (unsigned long long)by_output.sched.preemptions,
		     (unsigned long long)by_prompt.sched.preemptions);
}

/* The host cache (bkv_pool_config.host_cache) in a tight pool with
 * chunked prefill and swapping: blocks the device evicts are copied to the
 * host and reloaded by later prefix hits, and every request still matches
 * the reference token for token (the host performs the demotions' and
 * reloads' copies as it does swaps'). With fail_every, a failed call also
 * forgets the demotions it carried (their copies may not have been made). */
static void host_cache_run(serve_fn serve, uint32_t fail_every, tlm_run_result *res)
{
	tlm_run_config rc;

	run_config(&rc, 40);
	rc.host_blocks = 256;
	rc.host_cache = 1;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.fail_every = fail_every;
	serve(&rc, res);
	cr_assert_gt(res->pool.host_demoted, 0, "the device cache was meant to demote");
	cr_assert_gt(res->pool.host_hit_blocks, 0, "no prefix hit reloaded from the host");
}

Test(tinylm_serve, host_cache_reloads_evicted_prefixes_and_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_result res;

	host_cache_run(serve_flat, 0, &res);
}

/* The same in the persistent layout: a reload is a new table entry in the
 * block-table delta, and the host's mirrored tables stay the library's. */
Test(tinylm_serve, persistent_host_cache_mirrors_the_tables_and_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_result res;

	host_cache_run(serve_persistent, 0, &res);
}

Test(tinylm_serve, host_cache_with_host_failures_matches_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_result res;

	host_cache_run(serve_flat, 5, &res);
	cr_assert_gt(res.failed_steps, 0);
}

Test(tinylm_serve, preemption_by_swap_in_a_tight_pool_matches_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_result res;
	tight_pool_swap(serve_flat, &res);
}

Test(tinylm_serve, chunked_split_swap_tight_pool_matches_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_result res;
	case_chunked_split_swap_tight_pool_matches_re(serve_flat, &res);
}

Test(tinylm_serve, host_failures_roll_back_and_retries_match_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_result res;
	failures_roll_back(serve_flat, &res);
}

Test(tinylm_serve, failures_of_split_calls_with_swapping_roll_back_and_match_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_result res;
	split_failures_with_swap(serve_flat, &res);
}

Test(tinylm_serve, threaded_clients_and_one_engine_thread_match_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 64);
	rc.host_blocks = 128;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 96;
	tlm_run_result res;
	int st = tlm_threaded_serve(&g_w, g_model, &rc, 4, 6, &res);
	cr_assert_eq(st, 0, "threaded serve failed: %s (%d); host: %s", bkv_strerror(st), st,
		     res.host_error);
	char msg[512];
	uint32_t bad = tlm_workload_verify(&g_w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%u requests differ; first: %s", bad, msg);
	cr_assert_eq(res.check, 0);
	cr_assert_eq(res.sched.finished, g_w.n_jobs);
}

Test(tinylm_serve, overlapped_with_a_device_thread_matches_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 64);
	rc.host_blocks = 128;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 96;
	tlm_run_result res;
	int st = tlm_threaded_serve_overlap(&g_w, g_model, &rc, 4, 6, &res);
	cr_assert_eq(st, 0, "overlapped serve failed: %s (%d); host: %s", bkv_strerror(st), st,
		     res.host_error);
	char msg[512];
	uint32_t bad = tlm_workload_verify(&g_w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%u requests differ; first: %s", bad, msg);
	cr_assert_eq(res.check, 0);
	cr_assert_eq(res.sched.finished, g_w.n_jobs);
	cr_assert_gt(res.sched.overlap_steps, res.steps / 4, "%llu of %llu steps overlapped",
		     (unsigned long long)res.sched.overlap_steps, (unsigned long long)res.steps);
	cr_assert_gt(res.sched.overlap_syncs, 0, "the 64-block pool needs steps with none in flight");
	cr_assert_gt(res.sched.overlap_wasted_tokens, 0, "stops and aborts in the step in flight");
}

/* Overlapped scheduling with a host cache in a tight pool: demotions (and
 * reloads, when the threads' timing brings a demoted prefix back) planned
 * while a step is in flight go out with the next launch, and every request
 * still matches the reference. */
Test(tinylm_serve, overlapped_with_a_host_cache_matches_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_config rc;
	tlm_run_result res;
	char msg[512];
	uint32_t bad;
	int st;

	run_config(&rc, 40);
	rc.host_blocks = 256;
	rc.host_cache = 1;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	st = tlm_threaded_serve_overlap(&g_w, g_model, &rc, 4, 6, &res);
	cr_assert_eq(st, 0, "overlapped serve failed: %s (%d); host: %s", bkv_strerror(st), st,
		     res.host_error);
	bad = tlm_workload_verify(&g_w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%u requests differ; first: %s", bad, msg);
	cr_assert_eq(res.check, 0);
	cr_assert_eq(res.sched.finished, g_w.n_jobs);
	cr_assert_gt(res.sched.overlap_steps, 0);
	/* the clients' threads set the timing, so whether a demoted prefix is
	 * asked for again varies; that the device demotes does not */
	cr_assert_gt(res.pool.host_demoted, 0, "the device cache was meant to demote");
}

Test(tinylm_serve, overlapped_in_the_persistent_layout_mirrors_the_tables_and_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 64);
	rc.host_blocks = 128;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 96;
	rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	tlm_run_result res;
	int st = tlm_threaded_serve_overlap(&g_w, g_model, &rc, 4, 6, &res);
	cr_assert_eq(st, 0, "overlapped serve failed: %s (%d); host: %s", bkv_strerror(st), st,
		     res.host_error);
	char msg[512];
	uint32_t bad = tlm_workload_verify(&g_w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%u requests differ; first: %s", bad, msg);
	cr_assert_eq(res.check, 0);
	cr_assert_eq(res.sched.finished, g_w.n_jobs);
	cr_assert_gt(res.sched.overlap_steps, res.steps / 4, "%llu of %llu steps overlapped",
		     (unsigned long long)res.sched.overlap_steps, (unsigned long long)res.steps);
	cr_assert_gt(res.host.deltas, 0);
	cr_assert_gt(res.host.mirror_rows, 0);
	cr_assert_eq(res.host.mirror_mismatches, 0, "%llu rows' mirrored tables differ",
		     (unsigned long long)res.host.mirror_mismatches);
}

Test(tinylm_serve, measured_host_calls_calibrate_the_cost_model, .init = serve_setup,
     .fini = serve_teardown)
{
	bkv_cost_calib *calib = NULL;
	cr_assert_eq(bkv_cost_calib_create(NULL, NULL, &calib), BKV_OK);
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.split = 1;
	rc.sched.cost = bkv_cost_calib_model(calib);
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	/* Every host call the paged host served was observed, by kind. */
	cr_assert_eq(bkv_cost_calib_observations(calib, BKV_CALL_PREFILL),
		     res.host.calls[BKV_CALL_PREFILL]);
	cr_assert_eq(bkv_cost_calib_observations(calib, BKV_CALL_DECODE),
		     res.host.calls[BKV_CALL_DECODE]);
	cr_assert_eq(bkv_cost_calib_observations(calib, BKV_CALL_MIXED), 0);
	/* Learning from nothing, it now predicts a positive decode cost. */
	bkv_step_shape shape = {.kind = BKV_CALL_DECODE, .decode_rows = 8, .decode_context = 600,
				.padded_rows = 8};
	cr_assert_gt(bkv_cost_calib_step_us(calib, &shape), 0.0);
	cr_assert_gt(res.measured_us, 0.0);
	cr_assert_gt(res.predicted_us, 0.0);
	bkv_cost_calib_destroy(calib);
}

/*
 * KNOWN FAILURE, disabled until the scheduler is fixed (reported to the
 * lead): a request with n > 1 that was preempted by recompute after forking
 * is re-admitted through admit_waiting (lib/sched/plan.c), which appends a first
 * chunk for every lane in one step. Once lane 0's chunk has used the step's
 * token budget, bkv__chunk_len gives lane 1 zero tokens, admission answers
 * BKV_ENOSPC and is rolled back, and the same happens at every later step:
 * the request waits forever on an empty pool. It needs chunked prefill with
 * a token_budget no larger than one lane's history. Fixed: a later branch
 * that gets no budget is opened empty and starts in a later step.
 */
Test(tinylm_serve, resumed_forked_request_under_a_small_token_budget_finishes)
{
	g_model = small_model();
	tlm_workload_config wc;
	tlm_workload_config_default(&wc);
	wc.n_jobs = 60;
	wc.seed = 100;
	wc.pct_fork = 20;
	wc.pct_abort = 15;
	wc.pct_stop = 20;
	wc.system_len = 36;
	wc.new_max = 18;
	wc.user_max = 1;
	cr_assert_eq(tlm_workload_create(&g_w, &wc, g_model->cfg.vocab), 0);
	cr_assert_eq(tlm_workload_reference(&g_w, g_model), 0);
	tlm_run_config rc;
	run_config(&rc, 180);
	rc.block_tokens = 1;
	rc.sched.max_running = 14;
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 25;
	rc.sched.admit_group = 3;
	rc.max_steps = 5000;
	tlm_run_result res;
	serve_and_verify(&rc, &res);
	cr_assert_gt(res.sched.preemptions, 0);
	serve_teardown();
}

/* ------------------------------------------------------------------------ */
/* The same workloads in the persistent layout                               */
/* ------------------------------------------------------------------------ */


Test(tinylm_persistent, continuous_mixed_host_matches_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.submit_per_step = 5;
	tlm_run_result res;
	serve_persistent(&rc, &res);
	/* Rows keep their slots: far fewer deltas than rows computed. */
	cr_assert_lt(res.host.deltas, res.host.rows / 2);
}

Test(tinylm_persistent, chunked_mixed_steps_under_a_token_budget_match_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 40;
	tlm_run_result res;
	serve_persistent(&rc, &res);
}

Test(tinylm_persistent, split_prefill_and_decode_calls_match_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_result res;
	split_calls(serve_persistent, &res);
}

Test(tinylm_persistent, split_host_packing_prefill_calls_matches_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	bkv_cost_poly poly;
	bkv_cost_poly_init(&poly);
	tlm_run_config rc;
	run_config(&rc, 2048);
	rc.split = 1;
	rc.sched.admit_group = 0;
	rc.sched.cost = bkv_cost_poly_model(&poly);
	tlm_run_result res;
	serve_persistent(&rc, &res);
	cr_assert_gt(res.multi_prefill_steps, 0);
}

Test(tinylm_persistent, preemption_by_recompute_in_a_tight_pool_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 40);
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	tlm_run_result res;
	serve_persistent(&rc, &res);
	cr_assert_gt(res.sched.preemptions, 0);
	cr_assert_eq(res.sched.swaps, 0);
}

Test(tinylm_persistent, preemption_by_swap_in_a_tight_pool_matches_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_result res;
	tight_pool_swap(serve_persistent, &res);
}

Test(tinylm_persistent, chunked_split_swap_tight_pool_matches_reference, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_result res;
	case_chunked_split_swap_tight_pool_matches_re(serve_persistent, &res);
}

/* Host failures, early (before anything but the deltas) and late (after
 * writing K/V): the host has applied the failed call's deltas, the step is
 * rolled back, and the retry's deltas bring the mirror back in line. */
Test(tinylm_persistent, host_failures_roll_back_and_the_mirror_follows, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_result res;
	failures_roll_back(serve_persistent, &res);
	cr_assert_gt(res.failed_steps, 1);
}

Test(tinylm_persistent, failures_of_split_calls_with_swapping_match_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_result res;
	split_failures_with_swap(serve_persistent, &res);
}

Test(tinylm_persistent, failures_with_recompute_and_one_token_blocks_match_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	/* one-token blocks: every token changes a table, every preemption
	 * closes a slot and every resume opens one */
	tlm_run_config rc;
	run_config(&rc, 400);
	rc.block_tokens = 1;
	rc.sched.preempt = BKV_PREEMPT_RECOMPUTE;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 48;
	rc.fail_every = 6;
	tlm_run_result res;
	serve_persistent(&rc, &res);
	cr_assert_gt(res.sched.preemptions, 0);
	cr_assert_gt(res.failed_steps, 1);
}

Test(tinylm_persistent, threaded_clients_and_one_engine_thread_match_reference,
     .init = serve_setup, .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 64);
	rc.host_blocks = 128;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 96;
	rc.sched.batch_layout = BKV_BATCH_PERSISTENT;
	tlm_run_result res;
	int st = tlm_threaded_serve(&g_w, g_model, &rc, 4, 6, &res);
	cr_assert_eq(st, 0, "threaded serve failed: %s (%d); host: %s", bkv_strerror(st), st,
		     res.host_error);
	char msg[512];
	uint32_t bad = tlm_workload_verify(&g_w, msg, sizeof(msg));
	cr_assert_eq(bad, 0, "%u requests differ; first: %s", bad, msg);
	cr_assert_eq(res.check, 0);
	cr_assert_eq(res.sched.finished, g_w.n_jobs);
	cr_assert_gt(res.host.mirror_rows, 0);
	cr_assert_eq(res.host.mirror_mismatches, 0);
	cr_assert_eq(res.host.violations, 0);
}

/* The layout changes how tables travel, not what is scheduled: the same
 * configuration takes the same steps, preemptions, swaps, hits and copies
 * in both layouts. */
Test(tinylm_persistent, same_schedule_as_the_flat_layout, .init = serve_setup,
     .fini = serve_teardown)
{
	tlm_run_config rc;
	run_config(&rc, 32);
	rc.host_blocks = 256;
	rc.split = 1;
	rc.sched.chunked_prefill = 1;
	rc.sched.token_budget = 64;
	rc.sched.preempt = BKV_PREEMPT_SWAP;
	tlm_run_result flat, pers;
	serve_and_verify(&rc, &flat);
	serve_persistent(&rc, &pers);
	cr_assert_eq(pers.steps, flat.steps);
	cr_assert_eq(pers.sched.preemptions, flat.sched.preemptions);
	cr_assert_eq(pers.sched.swaps, flat.sched.swaps);
	cr_assert_eq(pers.sched.hit_tokens, flat.sched.hit_tokens);
	cr_assert_eq(pers.host.copies, flat.host.copies);
	cr_assert_eq(pers.host.rows, flat.host.rows);
	cr_assert_eq(pers.host.tokens, flat.host.tokens);
	cr_assert_eq(flat.host.mirror_rows, 0);
}
