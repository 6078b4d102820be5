/*
 * spec.c - speculative decoding in the step: drafts for decode rows, the
 * batch's speculation arrays, and the commit that keeps what the host
 * accepted and cuts the rest (docs/design.md, "Speculative decoding").
 *
 * Planning (bkv__spec_plan, after every other row is planned): each decode
 * row of a lane that still has tokens to generate is a candidate; the
 * decision layer chooses its k (decide/spec.c); the drafts come from the
 * host's draft callback or from this file's n-gram lookup and are written
 * into the lane's history buffer just past its known tokens (the buffer
 * holds prompt + max_new tokens and k < the tokens still to generate, so
 * they fit), where the row's token range picks them up like any other
 * token; then they are appended to the lane's sequence privately (no prefix
 * lookup, fresh blocks past a boundary), inside the step's transaction, so
 * no block they fill is indexed before commit. Drafts never preempt
 * anybody: a row whose drafts would need a block while fewer than
 * slots_used + need blocks are available (free, or cached and reclaimable:
 * a warm server's prefix cache fills the free frames) goes without, and so
 * does every later row (speculation is the first thing memory pressure
 * gives up). Drafts
 * are charged to the step's budget after every other row (planned first):
 * the token budget in chunked mode, else the batch arrays' capacity, so a
 * step whose prompts fill the arrays carries no drafts.
 *
 * Commit (bkv__spec_commit_cut before the pool's transaction commits, then
 * bkv__spec_commit_deliver): the accepted run m is the host's n_accepted
 * (or, at -1, the greedy match of spec_tokens against the drafts), cut at
 * the first accepted draft that differs from the token sampled before it;
 * the tokens delivered are spec_tokens[0 .. m], stopped by a stop token,
 * max_new_tokens or BKV_TOKEN_FAIL; the sequence is truncated to the KV of
 * the delivered tokens, which returns the blocks a rejected tail took and
 * un-queues a block the tail had filled, so the transaction's commit indexes
 * only verified blocks. A failed call rolls the drafts back with everything
 * else (lane_restore truncates to the length before the step).
 *
 * KV groups: window and chunked lanes trim only at the transaction's commit
 * (pool/lanes.c), after the cut, so every lane still holds what the row's
 * first token reads and the cut always succeeds; the batch's per-group
 * arrays (sched/groups.c) cover a speculated row like any row of 1 + k
 * tokens. A STATE group keeps one state per row, so a speculated row
 * takes k more units (pool/state.c, per-token states), the batch names
 * them in the group's state_out_spec, the host writes the state after
 * each of the row's tokens there, and the cut's truncate makes the one
 * after the last delivered token live; a row whose units are not free goes
 * without drafts, like one whose blocks are not.
 *
 * N-gram lookup: each lane that speculates takes one of max_running tables
 * (a direct-mapped hash from the n-gram ending at a position to that
 * position, BKV__NGRAM_SLOTS entries, n = 1..BKV__NGRAM_MAX, allocated at
 * create). A table is owned by (request id, branch); a lane whose table was
 * taken by another (a clock hand takes one not used in the current step)
 * rebuilds its own from its history once. Each step indexes only the
 * tokens committed since the last (upto), looks up the last n tokens for n
 * = 3, 2, 1 and, on a verified match at p, proposes the tokens that followed
 * p: O(k + new tokens) per row, no scan of the context.
 */
#include "sched/batch.h"
#include "decide/decide.h"

#include <string.h>

int bkv__spec_alloc(bkv_sched *s)
{
	const bkv_allocator *a = &s->alloc;
	bkv__spec *sp;
	uint32_t i;
	size_t n;

	if (!s->cfg.spec_max_k)
		return BKV_OK;
	sp = bkv__calloc(a, 1, sizeof(*sp));
	if (!sp)
		return BKV_ENOMEM;
	s->spec = sp;
	sp->max_k = s->cfg.spec_max_k;
	sp->row_cap = 2 * s->plan.row_cap; /* plan.dec's entries */
	sp->n_sets = s->cfg.overlap ? s->cfg.overlap + 1 : 1; /* a step in
								  flight keeps
								  its set */
	n = (size_t)sp->n_sets * sp->row_cap;
	sp->all_drafts = bkv__calloc(a, n, sizeof(uint32_t));
	sp->all_want = bkv__calloc(a, n, sizeof(uint32_t));
	sp->all_accepted = bkv__calloc(a, n, sizeof(int32_t));
	sp->all_tokens = bkv__calloc(a, n * (1 + sp->max_k), sizeof(int32_t));
	if (s->call.has_state)
		sp->all_st_out = bkv__calloc(a, n * (1 + sp->max_k), sizeof(int32_t));
	if (!sp->all_drafts || !sp->all_want || !sp->all_accepted || !sp->all_tokens ||
	    (s->call.has_state && !sp->all_st_out))
		return BKV_ENOMEM;
	bkv__spec_select(s, 0);
	if (s->cfg.spec_drafts == BKV_SPEC_DRAFT_NGRAM) {
		sp->n_tab = s->cfg.max_running;
		sp->tab = bkv__calloc(a, sp->n_tab, sizeof(bkv__ngram));
		sp->slots = bkv__calloc(a, (size_t)sp->n_tab * BKV__NGRAM_SLOTS, sizeof(uint32_t));
		if (!sp->tab || !sp->slots)
			return BKV_ENOMEM;
		for (i = 0; i < sp->n_tab; i++)
			sp->tab[i].pos = sp->slots + (size_t)i * BKV__NGRAM_SLOTS;
	}
	return BKV_OK;
}

void bkv__spec_free(bkv_sched *s)
{
	const bkv_allocator *a = &s->alloc;
	bkv__spec *sp = s->spec;
	size_t n;

	if (!sp)
		return;
	n = (size_t)sp->n_sets * sp->row_cap;
	bkv__free(a, sp->all_drafts, n * sizeof(uint32_t));
	bkv__free(a, sp->all_want, n * sizeof(uint32_t));
	bkv__free(a, sp->all_accepted, n * sizeof(int32_t));
	bkv__free(a, sp->all_tokens, n * (1 + sp->max_k) * sizeof(int32_t));
	bkv__free(a, sp->all_st_out, sp->all_st_out ? n * (1 + sp->max_k) * sizeof(int32_t) : 0);
	bkv__free(a, sp->tab, (size_t)sp->n_tab * sizeof(bkv__ngram));
	bkv__free(a, sp->slots, (size_t)sp->n_tab * BKV__NGRAM_SLOTS * sizeof(uint32_t));
	bkv__free(a, sp, sizeof(*sp));
	s->spec = NULL;
}

/* ---- n-gram lookup ---------------------------------------------------------- */

static uint32_t ngram_hash(const int32_t *t, uint32_t n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull * n;
	uint32_t i;

	for (i = 0; i < n; i++)
		h = (h ^ (uint32_t)t[i]) * 0xff51afd7ed558ccdull;
	return (uint32_t)(h >> 40) & (BKV__NGRAM_SLOTS - 1);
}

/* The table of lane l, taken (and rebuilt from nothing) if it has none. */
static bkv__ngram *ngram_table(bkv_sched *s, bkv__lane *l)
{
	bkv__spec *sp = s->spec;
	bkv__ngram *t = sp->tab;
	uint32_t i;

	if (l->spec_tab < sp->n_tab) {
		t = &sp->tab[l->spec_tab];
		if (t->owner == l->req->id && t->branch == l->branch)
			goto found;
	}
	/* a table no row used in this step: at most max_running rows
	 * speculate in a step, so there is one */
	for (i = 0; i < sp->n_tab; i++) {
		t = &sp->tab[sp->tab_hand];
		l->spec_tab = sp->tab_hand;
		sp->tab_hand = sp->tab_hand + 1 == sp->n_tab ? 0 : sp->tab_hand + 1;
		if (t->used_step != s->plan.step_no)
			break;
	}
	memset(t->pos, 0, BKV__NGRAM_SLOTS * sizeof(uint32_t));
	t->owner = l->req->id;
	t->branch = l->branch;
	t->upto = 0;
found:
	t->used_step = s->plan.step_no;
	return t;
}

/* Up to k drafts for lane l, whose known tokens are tok[0, known), written
 * to tok[known, known + k). Returns how many. */
static uint32_t ngram_propose(bkv_sched *s, bkv__lane *l, uint32_t known, uint32_t k)
{
	bkv__ngram *t = ngram_table(s, l);
	int32_t *tok = l->tok;
	uint32_t p, n, j;

	/* index the n-grams ending before the last token */
	for (p = t->upto; p + 1 < known; p++)
		for (n = 1; n <= BKV__NGRAM_MAX && n <= p + 1; n++)
			t->pos[ngram_hash(tok + p + 1 - n, n)] = p + 1;
	if (known > t->upto + 1)
		t->upto = known - 1;
	for (n = BKV__NGRAM_MAX; n >= 1; n--) {
		uint32_t e;

		if (known < n + 1)
			continue;
		e = t->pos[ngram_hash(tok + known - n, n)];
		if (!e)
			continue;
		p = e - 1; /* the n-gram ended at p < known - 1 */
		if (p + 1 < n || memcmp(tok + p + 1 - n, tok + known - n, n * sizeof(int32_t)) != 0)
			continue; /* another n-gram in the slot */
		/* tok[p + j] is known or a draft written before it (p < known -
		 * 1); an encoder input's ids (negative) are never drafted */
		for (j = 1; j <= k && tok[p + j] >= 0; j++)
			tok[known + j - 1] = tok[p + j];
		return j - 1;
	}
	return 0;
}

/* ---- planning --------------------------------------------------------------- */

static uint32_t propose(bkv_sched *s, bkv__lane *l, uint32_t known, uint32_t k)
{
	int got;

	if (s->cfg.spec_drafts == BKV_SPEC_DRAFT_NGRAM)
		return ngram_propose(s, l, known, k);
	got = s->ops.draft(s->host, l->req->id, l->branch, l->tok, known, l->tok + known, k,
			   l->req->user);
	return got <= 0 ? 0 : (uint32_t)got > k ? k : (uint32_t)got;
}

/* Candidates among plan.dec[0, n_dec): want[i] = the row's cap on k (0 for
 * a row that is not one), drafts[i] = 0; *ctx = the rows' context. Returns
 * the candidates. */
static uint32_t spec_candidates(bkv_sched *s, uint32_t n_dec, uint64_t *ctx)
{
	bkv__spec *sp = s->spec;
	uint32_t i, n = 0;

	*ctx = 0;
	for (i = 0; i < n_dec; i++) {
		const bkv__row *row = &s->plan.dec[i];
		const bkv__lane *l = row->lane;
		const bkv__req *r = l->req;
		uint32_t left;

		*ctx += row->end;
		sp->drafts[i] = 0;
		sp->want[i] = 0;
		if (!row->sample || row->end - row->start != 1 || !REQ_IS_RUNNING(r) || l->done)
			continue;
		left = r->max_new - l->n_gen; /* tokens still to generate, >= 1 */
		if (l->ovl_pend) {
			/* overlap: its last token is the placeholder of the
			 * step in flight; no draft may follow an unknown
			 * token (counted: a row overlap plans without drafts) */
			s->stats.overlap_spec_undrafted += left > 1;
			continue;
		}
		sp->want[i] = BKV_MIN(sp->max_k, left - 1);
		n += sp->want[i] > 0;
	}
	return n;
}

void bkv__spec_plan(bkv_sched *s, bkv_step_info *si)
{
	bkv__spec *sp = s->spec;
	bkv_pool *pool = s->pool;
	bkv__row *dec = s->plan.dec;
	uint32_t i, n = 0, n_dec, skipped = 0;
	uint64_t ctx = 0;
	int stop = 0;

	sp->n_rows = 0;
	sp->n_set = 0;
	if (si->preempted) { /* drafts index plan.dec as the call will see it */
		bkv__rows_prune(s->plan.dec, &s->plan.n_dec);
		bkv__rows_prune(s->plan.pre, &s->plan.n_pre);
		s->plan.fill_rows = 0; /* the written rows may be among them */
		s->call.n_dirty = 0;
	}
	n_dec = s->plan.n_dec;
	if (n_dec > sp->row_cap)
		return;
	n = spec_candidates(s, n_dec, &ctx);
	sp->n_set = n_dec;
	if (!n) {
		sp->n_set = 0; /* no drafts: the calls' row_drafts are zeros */
		return;
	}
	/* the choice, over every row at once: drafts[] = each row's k */
	bkv__spec_choose(s, dec, sp->want, n_dec, n_dec, ctx, sp->drafts);
	for (i = 0; i < n_dec; i++) {
		bkv__row *row = &dec[i];
		bkv__lane *l = row->lane;
		uint32_t k = sp->drafts[i], got, need;

		sp->drafts[i] = 0; /* until its drafts are appended */
		if (sp->want[i]) /* offered: cleared below when it drafts */
			l->spec_miss = 1;
		if (!k)
			continue;
		if (stop) {
			skipped++;
			continue;
		}
		k = BKV_MIN(k, s->plan.budget_left); /* the budget, or what is
							 left of the arrays */
		if (!k) {
			stop = 1;
			skipped++;
			continue;
		}
		BKV_ASSERT(l->kv_len == row->end && row->end == LANE_KNOWN(l));
		got = propose(s, l, row->end, k);
		if (!got)
			continue;
		l->spec_miss = 0;
		need = (uint32_t)bkv_seq_blocks_needed(pool, l->seq, got);
		if (bkv_pool_available(pool) < (uint64_t)need + s->rs.slots_used ||
		    (s->call.has_state &&
		     bkv__pool_state_spec_room(pool, got, (uint64_t)need + s->rs.slots_used) < got) ||
		    bkv__seq_append_private(pool, l->seq, l->tok + row->end, got) != BKV_OK) {
			stop = 1; /* memory pressure: no more drafts this step */
			skipped++;
			continue;
		}
		if (s->call.has_state) /* a state unit after each draft's token */
			bkv__pool_state_spec_take(pool, l->seq, got);
		l->kv_len += got;
		row->end += got;
		sp->drafts[i] = got;
		sp->n_rows++;
		s->plan.budget_left -= BKV_MIN(s->plan.budget_left, got);
	}
	s->stats.spec_skipped_rows += skipped;
	if (!sp->n_rows)
		sp->n_set = 0;
	else if (s->plan.fill_rows) /* the fused pass wrote its rows one token each */
		bkv__batch_drafts(s, sp->drafts);
}

int bkv__spec_hold(const bkv_sched *s, const bkv__lane *l)
{
	const bkv__req *r = l->req;
	uint32_t k, j;
	double a, aj, e = 0.0;

	if (l->spec_miss || l->n_gen + 1 >= r->max_new) /* (n_gen counts the
							   placeholder) */
		return 0;
	k = BKV_MIN(s->spec->max_k, r->max_new - l->n_gen - 1);
	a = bkv__spec_accept(s, r);
	for (j = 1, aj = a; j <= k && e <= 1.0; j++, aj *= a)
		e += aj;
	return e > 1.0;
}

/* A STATE group's state_out_spec: for each decode row, the unit after
 * each of its tokens (a row without drafts: its state_out). */
static void spec_state_frames(bkv_sched *s, bkv_batch *b, const bkv__row *rows)
{
	bkv_batch_group *bg = &s->call.groups[s->call.n_lanes];
	uint32_t i;

	for (i = 0; i < b->n_decode_rows; i++) {
		const int32_t q0 = b->qo_indptr[i];

		bkv__pool_state_spec_frames(s->pool, rows[i].lane->seq, s->spec->st_out + q0,
					    (uint32_t)(b->qo_indptr[i + 1] - q0));
	}
	bg->state_out_spec = s->spec->st_out;
}

void bkv__spec_batch(bkv_sched *s, bkv_batch *b, bkv_step_shape *sh, const bkv__row *rows,
		     uint32_t n)
{
	bkv__spec *sp = s->spec;
	uint32_t i, e = 0;

	b->row_drafts = sp->drafts;
	b->spec_tokens = sp->tokens;
	b->n_accepted = sp->accepted;
	if (rows != s->plan.dec || !sp->n_rows) {
		/* no drafts in this call: want[] is free until the commit */
		memset(sp->want, 0, (size_t)n * sizeof(uint32_t));
		b->row_drafts = sp->want;
		b->n_spec_rows = 0;
		return;
	}
	for (i = sp->n_set; i < n; i++) /* rows planned after the drafts */
		sp->drafts[i] = 0;
	sp->n_set = BKV_MAX(sp->n_set, n);
	for (i = 0; i < n; i++) {
		sp->accepted[i] = -1;
		if (sp->drafts[i]) {
			int32_t q0 = s->call.arr.qo_indptr[i];
			uint32_t j;

			for (j = 0; j <= sp->drafts[i]; j++)
				sp->tokens[q0 + j] = BKV_TOKEN_FAIL;
			e += sp->drafts[i];
		}
	}
	b->n_spec_rows = sp->n_rows;
	sh->decode_drafts = e;
	if (s->call.has_state) /* groups.c filled the STATE group first */
		spec_state_frames(s, b, rows);
}

/* ---- commit ----------------------------------------------------------------- */

#define CUT_FAIL 0x80000000u /* want[i]: the run ends in BKV_TOKEN_FAIL */

/* The cut of one step: rows[0, n) its call's rows, st its drafts. */
void bkv__spec_cut_step(bkv_sched *s, const bkv__spec_step *st, bkv__row *rows, uint32_t n)
{
	/* in locals: the stores below would reload them for every row, and
	 * most rows have no drafts */
	const uint32_t *const drafts = st->drafts, n_end = BKV_MIN(st->n_set, n);
	uint32_t i;

	for (i = 0; i < n_end; i++) {
		bkv__row *row;
		bkv__lane *l;
		bkv__req *r;
		const uint32_t k = drafts[i];
		const int32_t *t, *d;
		uint32_t m, j, c = 0, keep, fail = 0;

		if (!k)
			continue;
		row = &rows[i];
		l = row->lane;
		r = l->req;
		row->sample = 0; /* delivered by bkv__spec_deliver_step */
		st->want[i] = 0;
		if (!REQ_IS_RUNNING(r) || l->done)
			continue;
		t = st->tokens + st->qo[i];
		d = l->tok + row->start + 1; /* the drafts */
		m = st->accepted[i] < 0 ? k : BKV_MIN((uint32_t)st->accepted[i], k);
		for (j = 0; j < m; j++)
			if (t[j] != d[j])
				break;
		m = j; /* greedy, or the host's run cut at a draft it did not sample */
		bkv__spec_observe(s, r, k, m);
		s->stats.spec_rows++;
		s->stats.spec_drafted += k;
		s->stats.spec_accepted += m;
		for (j = 0; j <= m; j++) {
			if (t[j] == BKV_TOKEN_FAIL) {
				fail = CUT_FAIL;
				break;
			}
			c++;
			if ((r->n_stop && bkv__is_stop(r, t[j])) || l->n_gen + c >= r->max_new)
				break;
		}
		keep = row->start + 1 + BKV_MIN(m, c);
		if (keep < l->kv_len) {
			/* never refused: with KV groups, no lane trimmed in
			 * the open transaction (docs/design.md) */
			int rc = bkv_seq_truncate(s->pool, l->seq, keep);

			BKV_ASSERT(rc == BKV_OK);
			(void)rc;
			l->kv_len = keep;
		}
		st->want[i] = c | fail;
	}
}

void bkv__spec_deliver_step(bkv_sched *s, const bkv__spec_step *st, const bkv__row *rows,
			    uint32_t n, bkv_step_info *si)
{
	const uint32_t *const drafts = st->drafts, n_end = BKV_MIN(st->n_set, n);
	uint32_t i, j;

	for (i = 0; i < n_end; i++) {
		bkv__lane *l;
		bkv__req *r;
		const int32_t *t;
		uint32_t c;

		if (!drafts[i])
			continue;
		l = rows[i].lane;
		r = l->req;
		if (!REQ_IS_RUNNING(r) || l->done)
			continue;
		t = st->tokens + st->qo[i];
		c = st->want[i] & ~CUT_FAIL;
		for (j = 0; j < c; j++) {
			l->tok[LANE_KNOWN(l)] = t[j];
			l->n_gen++;
			s->stats.decode_tokens++; /* a decode row's, delivered */
			l->decoding = 1;
			if (s->outs)
				bkv__outs_token(s, r->id, l->branch, t[j]);
			if (s->ops.on_token) {
				s->ops.on_token(s->host, r->id, l->branch, t[j], r->user);
				if (!REQ_IS_RUNNING(r) || l->done)
					break;
			}
			if (r->n_stop && bkv__is_stop(r, t[j])) {
				bkv__lane_done(s, l, BKV_FINISH_STOP, si);
				break;
			}
			if (l->n_gen >= r->max_new) {
				bkv__lane_done(s, l, BKV_FINISH_LENGTH, si);
				break;
			}
		}
		if ((st->want[i] & CUT_FAIL) && REQ_IS_RUNNING(r) && !l->done)
			bkv__finish_req(s, r, BKV_FINISH_ERROR, si);
	}
}

/* The current step's drafts, as the commit reads them. */
static bkv__spec_step cur_step(const bkv_sched *s)
{
	const bkv__spec *sp = s->spec;
	bkv__spec_step st;

	st.drafts = sp->drafts;
	st.want = sp->want;
	st.accepted = sp->accepted;
	st.tokens = sp->tokens;
	st.qo = s->call.arr.qo_indptr;
	st.n_rows = sp->n_rows;
	st.n_set = sp->n_set;
	return st;
}

void bkv__spec_commit_cut(bkv_sched *s)
{
	bkv__spec_step st = cur_step(s);

	bkv__spec_cut_step(s, &st, s->plan.dec, s->plan.n_dec);
}

void bkv__spec_commit_deliver(bkv_sched *s, bkv_step_info *si)
{
	bkv__spec_step st = cur_step(s);

	bkv__spec_deliver_step(s, &st, s->plan.dec, s->plan.n_dec, si);
	s->spec->n_rows = s->spec->n_set = 0;
}

void bkv__spec_take(bkv_sched *s, bkv__spec_step *st)
{
	*st = cur_step(s);
	s->spec->n_rows = s->spec->n_set = 0;
}

void bkv__spec_select(bkv_sched *s, uint32_t set)
{
	bkv__spec *sp = s->spec;
	const size_t n = (size_t)set * sp->row_cap;

	BKV_ASSERT(set < sp->n_sets);
	sp->drafts = sp->all_drafts + n;
	sp->want = sp->all_want + n;
	sp->accepted = sp->all_accepted + n;
	sp->tokens = sp->all_tokens + n * (1 + sp->max_k);
	sp->st_out = sp->all_st_out ? sp->all_st_out + n * (1 + sp->max_k) : NULL;
}

void bkv__spec_rollback(bkv_sched *s)
{
	s->spec->n_rows = 0;
	s->spec->n_set = 0;
}

/* ---- the checker ------------------------------------------------------------ */

int bkv__spec_check(const bkv_sched *s)
{
	const bkv__spec *sp = s->spec;
	uint32_t i, j;

	if (sp->n_rows || sp->n_set)
		return 1; /* a step's drafts outlived it */
	if (!(sp->g_acc >= 0.0) || !(sp->g_acc <= sp->g_trials + 1e-6))
		return 1;
	for (i = 0; i < s->rs.nr_run; i++) {
		const bkv__req *r = s->rs.run[i];

		if (!REQ_IS_RUNNING(r))
			continue;
		if (!(r->spec_acc >= 0.0f) || !(r->spec_acc <= r->spec_trials * 1.0001f + 1e-3f))
			return 1;
		for (j = 0; j < r->n && sp->n_tab; j++) {
			const bkv__lane *l = &r->lane[j];
			const bkv__ngram *t;

			if (l->spec_tab >= sp->n_tab)
				continue;
			t = &sp->tab[l->spec_tab];
			if (t->owner == r->id && t->branch == l->branch && t->upto > LANE_KNOWN(l))
				return 1; /* it indexed a draft */
		}
	}
	return 0;
}
