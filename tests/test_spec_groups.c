/*
 * test_spec_groups.c - speculative decoding in pools with KV groups: a
 * full-attention group 0, a sliding window and a chunked group (docs/
 * design.md, "Speculative decoding", KV groups).
 *
 * The fake host (tests/support/fakehost.h) checks group 0's positions,
 * slots and KV cells; this file's batch hook checks every further group of
 * every call: each token's slot (drafts included) lies at its position's
 * offset in the block the row's table lists for it in that group, the row
 * lists exactly the blocks from the first one its first query reads, and
 * the shape's per-group decode context is the union of what each decode
 * row's queries read. After every step, every block any group's prefix
 * index holds must be a chain of delivered tokens (a rejected draft never
 * reaches the index), and with every draft wrong the pool holds exactly
 * the blocks the run without speculation holds (the rejected tails' blocks
 * come back in every group). With a recurrent STATE group a hook models
 * the state as the chain of every token it covers: runs with and without
 * speculation deliver the same tokens, and every state a row reads is the
 * one after exactly its delivered tokens (the commit kept the per-token
 * state of the last accepted one), through failing calls and preemption.
 */
#include "fakehost_sched.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define NREQ 24
#define BT 2u
#define WIN 6u
#define CHUNK 8u
#define NBLK 2048u

static const bkv_kv_group g_groups[3] = {
	{BKV_GROUP_FULL, 1, 0, 0, 64},
	{BKV_GROUP_WINDOW, 1, WIN, 0, 64},
	{BKV_GROUP_CHUNKED, 1, CHUNK, 0, 64},
};

/* The shape the cost model saw for the call being made: its per-group
 * decode context (the scheduler prices each call just before making it). */
static uint64_t g_shape_ctx[3];
static int g_shape_has;
static uint64_t g_draft_rows; /* speculated rows the hook saw */

static double cost_us(void *ctx, const bkv_step_shape *sh)
{
	(void)ctx;
	g_shape_has = sh->group_decode_context != NULL && sh->n_groups == 3;
	if (g_shape_has)
		memcpy(g_shape_ctx, sh->group_decode_context, sizeof(g_shape_ctx));
	return 10.0 + sh->decode_rows + 0.5 * sh->decode_drafts;
}

/* First logical block the query at p reads in group g. */
static uint32_t first_block(const bkv_kv_group *g, uint32_t p)
{
	if (g->kind == BKV_GROUP_WINDOW)
		return (p + 1 > g->span ? p + 1 - g->span : 0) / BT;
	if (g->kind == BKV_GROUP_CHUNKED)
		return p / g->span * g->span / BT;
	return 0;
}

/* Row r of group g: every token's slot is in the block its row lists. */
static uint32_t check_row(const bkv_batch *b, uint32_t g, uint32_t r, uint64_t *ctx)
{
	const bkv_batch_group *bg = &b->groups[g];
	const int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
	const uint32_t start = (uint32_t)b->positions[q0], end = start + (uint32_t)(q1 - q0);
	const uint32_t first = first_block(&g_groups[g], start), nb = (end + BT - 1) / BT;
	const int32_t *tab = NULL;
	uint32_t bad = 0, i;
	int32_t t;

	if (r < b->n_decode_rows) /* what the row's queries read, together */
		*ctx += end - (g_groups[g].kind == BKV_GROUP_WINDOW
				       ? (start + 1 > WIN ? start + 1 - WIN : 0)
				       : start / CHUNK * CHUNK);
	if (bg->row_tables) {
		tab = bg->row_tables[b->row_slot[r]];
		bad += bg->row_table_len[b->row_slot[r]] < nb;
	} else {
		bad += (uint32_t)bg->kv_first_block[r] != first;
		bad += (uint32_t)(bg->kv_indptr[r + 1] - bg->kv_indptr[r]) != nb - first;
		tab = bg->kv_indices + bg->kv_indptr[r] - first; /* logical index */
	}
	for (i = first; i < nb; i++)
		bad += tab[i] < 0; /* a block the row reads was released */
	for (t = q0; t < q1; t++) {
		uint32_t p = (uint32_t)b->positions[t];
		int32_t s = bg->slot_mapping[t];

		bad += s < 0 || (uint32_t)s % BT != p % BT || s / (int32_t)BT != tab[p / BT];
		bad += s == b->slot_mapping[t]; /* a lane writes its own frames */
	}
	return bad;
}

static void batch_hook(fake_host *f, const bkv_batch *b)
{
	uint64_t ctx[3] = {0, 0, 0};
	uint32_t g, r;

	if (b->n_groups != 3) {
		f->batch_bad++;
		return;
	}
	for (r = 0; r < b->n_rows; r++)
		g_draft_rows += b->row_drafts && b->row_drafts[r];
	for (g = 1; g < 3; g++)
		for (r = 0; r < b->n_rows; r++)
			f->batch_bad += check_row(b, g, r, &ctx[g]);
	if (!g_shape_has || g_shape_ctx[1] != ctx[1] || g_shape_ctx[2] != ctx[2])
		f->batch_bad++;
}

static fake_host *host(uint32_t k, uint32_t accept, uint32_t blocks, int chunked)
{
	fh_opts o;
	fake_host *f;

	fh_opts_init(&o);
	o.block_tokens = BT;
	o.device_blocks = blocks;
	o.n_groups = 3;
	o.groups = g_groups;
	o.cfg.max_running = 8;
	o.cfg.spec_max_k = k;
	o.cfg.spec_k_mode = BKV_SPEC_K_FIXED;
	o.cfg.spec_drafts = BKV_SPEC_DRAFT_HOST;
	o.cfg.cost.step_us = cost_us;
	if (chunked) {
		o.cfg.chunked_prefill = 1;
		o.cfg.token_budget = 24;
	}
	f = fh_create(&o);
	f->host.spec_accept_permille = accept;
	f->batch_hook = batch_hook;
	return f;
}

static uint64_t used(const fake_host *f)
{
	bkv_pool_stats ps;

	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(f->pool, &ps);
	return ps.nr_used;
}

static void step_ok(fake_host *f)
{
	int rc = bkv_step(f->s, NULL);

	cr_assert_eq(rc, BKV_OK, "step: %s", bkv_strerror(rc));
	cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
	cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	cr_assert_eq(f->batch_bad, 0, "the groups' batch arrays are wrong");
}

/* With every draft wrong the schedule is the plain run's, step for step:
 * after each step both pools hold the same number of blocks over all three
 * groups, so every rejected tail gave back what it took in every group. */
Test(spec_groups, rejected_tails_return_their_blocks_in_every_group)
{
	fake_host *plain = host(0, 0, NBLK, 0), *sp = host(6, 0, NBLK, 0);
	int32_t *p[NREQ];
	bkv_sched_stats st;
	uint32_t i, steps = 0;

	g_draft_rows = 0;
	for (i = 0; i < NREQ; i++) {
		p[i] = fh_prompt(40, 1 + i);
		fh_submit_ex(plain, p[i], 5 + i % 13, 30, 0, 1 + i % 3, 0);
		fh_submit_ex(sp, p[i], 5 + i % 13, 30, 0, 1 + i % 3, 0);
	}
	while (bkv_sched_pending(sp->s) || bkv_sched_pending(plain->s)) {
		step_ok(plain);
		step_ok(sp);
		cr_assert_eq(used(sp), used(plain), "step %u: %llu blocks held, plain %llu", steps,
			     (unsigned long long)used(sp), (unsigned long long)used(plain));
		cr_assert_lt(++steps, 5000);
	}
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(sp->s, &st);
	cr_assert_gt(st.spec_drafted, 0, "the window pool speculated");
	cr_assert_eq(st.spec_accepted, 0);
	cr_assert_gt(g_draft_rows, 0);
	cr_assert_eq(used(sp), 0);
	for (i = 1; i <= NREQ; i++)
		cr_assert_eq(sp->finish_count[i], 1);
	fh_destroy(plain);
	fh_destroy(sp);
	for (i = 0; i < NREQ; i++)
		free(p[i]);
}

/* Does the chain ending at indexed block blk (a lane block hangs from group
 * 0's chain) hold delivered tokens of some request's branch? */
static int chain_delivered(const fake_host *f, int32_t blk)
{
	int32_t tok[64 * BT];
	uint32_t depth = 0, i, j, br;
	int32_t c = blk;

	while (c >= 0) { /* gather the chain, last block first */
		bkv_block_info bi;

		memset(&bi, 0, sizeof(bi));
		bi.size = sizeof(bi);
		if (bkv_block_info_get(f->pool, c, &bi) != BKV_OK || !bi.indexed || depth == 64 ||
		    bi.fill != BT)
			return 0;
		memcpy(tok + (63 - depth) * BT, bi.tokens, BT * sizeof(int32_t));
		depth++;
		c = bi.parent;
	}
	for (i = 1; i <= NREQ; i++) {
		const kh_req *r = &f->req[i];

		for (br = 0; br < r->n; br++) {
			if (r->prompt_len + r->n_out[br] < depth * BT)
				continue;
			for (j = 0; j < depth * BT; j++)
				if (kh_token_at(r, br, j) != tok[(64 - depth) * BT + j])
					break;
			if (j == depth * BT)
				return 1;
		}
	}
	return 0;
}

/* Half the drafts wrong, forks, chunked prefill and shared prompts (prefix
 * hits in every group): after every step each block newly indexed in any
 * group holds a chain of tokens some branch has been delivered. */
Test(spec_groups, no_unverified_block_reaches_the_prefix_index_in_any_group)
{
	static uint64_t seen[NBLK];
	static int32_t shared[40];
	fake_host *f = host(6, 500, NBLK, 1);
	int32_t *p[NREQ];
	bkv_sched_stats st;
	uint32_t i, steps = 0, checked = 0;
	int32_t b;

	memset(seen, 0, sizeof(seen));
	g_draft_rows = 0;
	for (i = 0; i < 40; i++)
		shared[i] = 100 + (int32_t)(i * 7 % 900);
	for (i = 0; i < NREQ; i++) {
		p[i] = fh_prompt(40, 50 + i);
		if (i % 2)
			memcpy(p[i], shared, 24 * sizeof(int32_t));
		fh_submit_ex(f, p[i], 20 + i % 16, 24, 0, 1 + i % 2, 0);
	}
	while (bkv_sched_pending(f->s)) {
		step_ok(f);
		for (b = 0; b < (int32_t)NBLK; b++) {
			bkv_block_info bi;

			memset(&bi, 0, sizeof(bi));
			bi.size = sizeof(bi);
			cr_assert_eq(bkv_block_info_get(f->pool, b, &bi), BKV_OK);
			if (!bi.indexed) {
				seen[b] = 0;
				continue;
			}
			if (seen[b] == bi.hash + 1)
				continue;
			seen[b] = bi.hash + 1;
			checked++;
			cr_assert(chain_delivered(f, b), "step %u: block %d indexes tokens never delivered",
				  steps, b);
		}
		cr_assert_lt(++steps, 5000);
	}
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(f->s, &st);
	cr_assert_gt(st.spec_accepted, 0);
	cr_assert_lt(st.spec_accepted, st.spec_drafted);
	cr_assert_gt(st.hit_tokens, 0);
	cr_assert_gt(checked, 0);
	cr_assert_gt(g_draft_rows, 0);
	for (i = 1; i <= NREQ; i++)
		cr_assert_eq(f->finish_count[i], 1);
	fh_destroy(f);
	for (i = 0; i < NREQ; i++)
		free(p[i]);
}

/* Forks, chunked prefill, prefix hits, preemption (recompute, swap) and
 * failing calls in a small grouped pool: every request ends once and every
 * batch's group arrays hold (the hook), every step's invariants hold. */
static void together(bkv_preempt_mode mode, uint32_t host_blocks)
{
	static int32_t shared[40];
	fh_opts o;
	fake_host *f;
	int32_t *p[NREQ];
	bkv_sched_stats st;
	uint32_t i, steps = 0;

	for (i = 0; i < 40; i++)
		shared[i] = 100 + (int32_t)(i * 11 % 900);
	fh_opts_init(&o);
	o.block_tokens = BT;
	o.device_blocks = 130; /* drafts take reclaimable cached blocks:
				   smaller than at 150 to preempt */
	o.host_blocks = host_blocks;
	o.n_groups = 3;
	o.groups = g_groups;
	o.cfg.max_running = 8;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 24;
	o.cfg.preempt = mode;
	o.cfg.spec_max_k = 5;
	o.cfg.spec_k_mode = BKV_SPEC_K_FIXED;
	o.cfg.spec_drafts = BKV_SPEC_DRAFT_HOST;
	o.cfg.cost.step_us = cost_us;
	f = fh_create(&o);
	f->batch_hook = batch_hook;
	f->host.spec_accept_permille = 650;
	f->host.garbage = 1;
	f->host.fail_permille = 40;
	f->host.rng = 4242;
	g_draft_rows = 0;
	for (i = 0; i < NREQ; i++) {
		p[i] = fh_prompt(40, 90 + i);
		if (i % 2)
			memcpy(p[i], shared, 24 * sizeof(int32_t));
		fh_submit_ex(f, p[i], 16 + i % 20, 20 + i % 9, 0, 1 + i % 3, 0);
	}
	while (bkv_sched_pending(f->s)) {
		int rc = bkv_step(f->s, NULL);

		cr_assert(rc == BKV_OK || rc == BKV_EHOST, "step: %s", bkv_strerror(rc));
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
		cr_assert_eq(f->batch_bad, 0);
		cr_assert_lt(++steps, 50000);
	}
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(f->s, &st);
	for (i = 1; i <= NREQ; i++)
		cr_assert_eq(f->finish_count[i], 1);
	cr_assert_gt(st.preemptions, 0, "the pool is small enough to preempt");
	cr_assert_gt(st.spec_accepted, 0);
	cr_assert_gt(st.hit_tokens, 0);
	cr_assert_gt(f->host.failed_calls, 0);
	cr_assert_eq(used(f), 0);
	fh_destroy(f);
	for (i = 0; i < NREQ; i++)
		free(p[i]);
}

Test(spec_groups, forks_chunks_prefix_hits_recompute_and_failures_in_a_small_pool)
{
	together(BKV_PREEMPT_RECOMPUTE, 0);
}

Test(spec_groups, forks_chunks_prefix_hits_swap_and_failures_in_a_small_pool)
{
	together(BKV_PREEMPT_SWAP, 512);
}

/* ---- a recurrent STATE group ----------------------------------------------- */

/* Full attention + a STATE group whose unit is one frame, checkpointed
 * every 4 blocks. The hook models the state: a unit holds the chain of
 * every token before the position it covers (g_st_pos), so a row that
 * reads a state left by a rejected draft, or by a failed call, is caught.
 * A failing call (decided here, given to the host's fail_hook) writes
 * wrong states first. */
#define ST_BLK 400u

static const bkv_kv_group g_st_groups[2] = {
	{BKV_GROUP_FULL, 1, 0, 0, 64},
	{BKV_GROUP_STATE, 1, 4 * BT, 0, 128},
};

static uint64_t g_st_chain[ST_BLK];  /* each frame's state: a token chain */
static uint32_t g_st_pos[ST_BLK];    /* the tokens it covers */
static uint64_t g_st_hchain[512];    /* host blocks' (swap), the same */
static uint32_t g_st_hpos[512];
static uint64_t g_st_rng;            /* failing calls (0: none) */
static uint32_t g_st_fail_pm;        /* their chance, in 1/1000 */
static int g_st_failing;             /* the call being made fails */
static uint64_t g_st_spec;           /* per-token states of drafts written */

static uint64_t st_chain(uint64_t c, int32_t t)
{
	return (c ^ (uint32_t)t) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
}

static int st_fail(void *ctx, const bkv_batch *b)
{
	(void)ctx;
	(void)b;
	return g_st_failing;
}

static void state_hook(fake_host *f, const bkv_batch *b)
{
	const bkv_batch_group *G = &b->groups[1];
	uint32_t r, j;

	g_st_failing = 0;
	if (g_st_rng) {
		g_st_rng ^= g_st_rng << 13;
		g_st_rng ^= g_st_rng >> 7;
		g_st_rng ^= g_st_rng << 17;
		g_st_failing = g_st_rng % 1000 < g_st_fail_pm;
	}
	if (b->n_groups != 2 || G->kind != BKV_GROUP_STATE || G->state_frames != 1) {
		f->batch_bad++;
		return;
	}
	/* the copies first: swap-outs, swap-ins, device copies */
	for (j = 0; j < b->n_swap_out; j++) {
		g_st_hchain[b->swap_out[j].dst] = g_st_chain[b->swap_out[j].src];
		g_st_hpos[b->swap_out[j].dst] = g_st_pos[b->swap_out[j].src];
	}
	for (j = 0; j < b->n_swap_in; j++) {
		g_st_chain[b->swap_in[j].dst] = g_st_hchain[b->swap_in[j].src];
		g_st_pos[b->swap_in[j].dst] = g_st_hpos[b->swap_in[j].src];
	}
	for (j = 0; j < b->n_copies; j++) {
		g_st_chain[b->copies[j].dst] = g_st_chain[b->copies[j].src];
		g_st_pos[b->copies[j].dst] = g_st_pos[b->copies[j].src];
	}
	for (r = 0; r < b->n_rows; r++) {
		const kh_req *q = b->row_user[r];
		const int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];
		const uint32_t start = (uint32_t)b->positions[q0], end = start + (uint32_t)(q1 - q0);
		const uint32_t k = b->row_drafts ? b->row_drafts[r] : 0, br = b->row_branch[r];
		const int32_t in = G->state_in[r];
		uint64_t c = 0;
		uint32_t p;

		for (p = 0; p < start; p++)
			c = st_chain(c, kh_token_at(q, br, p));
		if (in < 0 ? start != 0
			   : (uint32_t)in >= ST_BLK || g_st_pos[in] != start || g_st_chain[in] != c)
			f->batch_bad++; /* the state read is not the one after start tokens */
		if (k && (!G->state_out_spec || G->state_out_spec[q0 + (int32_t)k] != G->state_out[r]))
			f->batch_bad++;
		for (p = start; p < end; p++) {
			int32_t u;

			c = st_chain(c, b->token_ids[q0 + (int32_t)(p - start)]);
			if (!k && p + 1 < end)
				continue; /* a plain row writes its last state */
			u = k ? G->state_out_spec[q0 + (int32_t)(p - start)] : G->state_out[r];
			if (u < 0 || (uint32_t)u >= ST_BLK) {
				f->batch_bad++;
				continue;
			}
			for (j = 0; j < b->n_rows; j++)
				f->batch_bad += G->state_in[j] == u;
			g_st_chain[u] = g_st_failing ? ~c : c;
			g_st_pos[u] = g_st_failing ? 0x7fffffffu : p + 1;
			g_st_spec += k && p + 1 < end;
		}
	}
}

static fake_host *state_host(uint32_t k, uint32_t accept, uint32_t blocks, bkv_preempt_mode mode,
			     uint32_t host_blocks)
{
	fh_opts o;
	fake_host *f;

	cr_assert_eq(bkv_kv_state_frames(g_st_groups, 2, BT), 1);
	fh_opts_init(&o);
	o.block_tokens = BT;
	o.device_blocks = blocks;
	o.host_blocks = host_blocks;
	o.max_seqs = 40;
	o.n_groups = 2;
	o.groups = g_st_groups;
	o.cfg.max_running = 8;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 24;
	o.cfg.preempt = mode;
	o.cfg.spec_max_k = k;
	o.cfg.spec_k_mode = BKV_SPEC_K_FIXED;
	o.cfg.spec_drafts = BKV_SPEC_DRAFT_HOST;
	f = fh_create(&o);
	f->host.spec_accept_permille = accept;
	f->host.fail_hook = st_fail;
	f->batch_hook = state_hook;
	return f;
}

/* Runs with and without speculation over the same STATE pool deliver the
 * same tokens, token for token, and every state a row reads (the hook) is
 * the one after exactly its delivered tokens: the commit kept the state
 * after the last accepted token, never the one after a rejected draft.
 * Forks share states, shared prompts hit checkpoints. */
Test(spec_groups, a_state_group_keeps_the_state_after_the_last_accepted_token)
{
	static int32_t shared[40];
	fake_host *plain, *sp;
	int32_t *p[NREQ];
	bkv_sched_stats st;
	uint32_t i, b, j, steps = 0;

	memset(g_st_pos, 0, sizeof(g_st_pos));
	g_st_rng = 0;
	g_st_spec = 0;
	plain = state_host(0, 0, ST_BLK, BKV_PREEMPT_RECOMPUTE, 0);
	sp = state_host(5, 600, ST_BLK, BKV_PREEMPT_RECOMPUTE, 0);
	for (i = 0; i < 40; i++)
		shared[i] = 100 + (int32_t)(i * 13 % 900);
	for (i = 0; i < NREQ; i++) {
		p[i] = fh_prompt(40, 300 + i);
		if (i % 2)
			memcpy(p[i], shared, 24 * sizeof(int32_t));
		fh_submit_ex(plain, p[i], 9 + i % 17, 12 + i % 19, 0, 1 + i % 3, 0);
		fh_submit_ex(sp, p[i], 9 + i % 17, 12 + i % 19, 0, 1 + i % 3, 0);
	}
	while (bkv_sched_pending(plain->s)) {
		step_ok(plain);
		cr_assert_lt(++steps, 5000);
	}
	while (bkv_sched_pending(sp->s)) {
		step_ok(sp);
		cr_assert_lt(++steps, 10000);
	}
	for (i = 1; i <= NREQ; i++) {
		cr_assert_eq(sp->finish_count[i], 1);
		for (b = 0; b < 1 + (i - 1) % 3; b++) {
			cr_assert_eq(sp->n_out[i][b], plain->n_out[i][b], "req %u branch %u", i, b);
			for (j = 0; j < sp->n_out[i][b] && j < FH_MAX_TOK; j++)
				cr_assert_eq(sp->out[i][b][j], plain->out[i][b][j],
					     "req %u branch %u token %u", i, b, j);
		}
	}
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(sp->s, &st);
	cr_assert_gt(st.spec_accepted, 0);
	cr_assert_lt(st.spec_accepted, st.spec_drafted, "some drafts were rejected");
	cr_assert_gt(g_st_spec, 0, "rows wrote per-token states");
	cr_assert_gt(st.hit_tokens, 0, "shared prompts hit checkpoints");
	cr_assert_eq(used(sp), 0);
	fh_destroy(plain);
	fh_destroy(sp);
	for (i = 0; i < NREQ; i++)
		free(p[i]);
}

/* Failing calls (writing wrong states first), preemption by recompute or
 * swap, forks and prefix hits in a small STATE pool with speculation: a
 * rolled-back step leaves the state it started from, every state read is
 * right, every request ends once. */
static void state_together(bkv_preempt_mode mode, uint32_t host_blocks)
{
	fake_host *f;
	int32_t *p[NREQ];
	bkv_sched_stats st;
	uint32_t i, steps = 0;

	memset(g_st_pos, 0, sizeof(g_st_pos));
	g_st_rng = 777;
	g_st_fail_pm = 60;
	g_st_spec = 0;
	f = state_host(4, 550, 180, mode, host_blocks);
	for (i = 0; i < NREQ; i++) {
		p[i] = fh_prompt(40, 500 + i);
		if (i % 2)
			memcpy(p[i], p[0], 16 * sizeof(int32_t));
		fh_submit_ex(f, p[i], 16 + i % 20, 20 + i % 9, 0, 1 + i % 3, 0);
	}
	while (bkv_sched_pending(f->s)) {
		int rc = bkv_step(f->s, NULL);

		cr_assert(rc == BKV_OK || rc == BKV_EHOST, "step: %s", bkv_strerror(rc));
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
		cr_assert_eq(f->batch_bad, 0, "step %u: a wrong state was read", steps);
		cr_assert_lt(++steps, 50000);
	}
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(f->s, &st);
	for (i = 1; i <= NREQ; i++)
		cr_assert_eq(f->finish_count[i], 1);
	cr_assert_gt(st.preemptions, 0, "the pool is small enough to preempt");
	cr_assert_gt(st.spec_accepted, 0);
	cr_assert_gt(g_st_spec, 0);
	cr_assert_gt(f->host.failed_calls, 0);
	cr_assert_eq(used(f), 0);
	g_st_rng = 0;
	fh_destroy(f);
	for (i = 0; i < NREQ; i++)
		free(p[i]);
}

Test(spec_groups, a_state_group_with_recompute_and_failures_in_a_small_pool)
{
	state_together(BKV_PREEMPT_RECOMPUTE, 0);
}

Test(spec_groups, a_state_group_with_swap_and_failures_in_a_small_pool)
{
	state_together(BKV_PREEMPT_SWAP, 512);
}
