/*
 * test_spec.c - speculative decoding (issue 17): the step contract (drafts
 * in decode rows, the accepted run and the bonus token, the cut of a
 * rejected tail), its rollback, and speculation together with forks,
 * preemption (recompute and swap), chunked prefill, prefix caching and
 * small pools; drafts from the host and from the library's n-gram lookup;
 * the choice of k.
 *
 * The fake host (tests/support/fakehost.h) samples a closed-form function of
 * (request, branch, position, input), so every request has one true
 * continuation whatever the schedule: its on_token check fails a run that
 * delivers any other token, and its KV cell model fails a run that reads
 * KV a rejected draft left behind. Its drafter proposes the true
 * continuation with each draft right with a set chance.
 */
#include "fakehost_sched.h"
#include "internal.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define NREQ 24

static fake_host *spec_host(uint32_t bt, uint32_t blocks, uint32_t k, bkv_spec_k_mode mode,
			    uint32_t accept, int split)
{
	fh_opts o;
	fake_host *f;

	fh_opts_init(&o);
	o.block_tokens = bt;
	o.device_blocks = blocks;
	o.split = split;
	o.cfg.max_running = 8;
	o.cfg.spec_max_k = k;
	o.cfg.spec_k_mode = mode;
	o.cfg.spec_drafts = BKV_SPEC_DRAFT_HOST;
	f = fh_create(&o);
	f->host.spec_accept_permille = accept;
	return f;
}

static void stats(const fake_host *f, bkv_sched_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->size = sizeof(*st);
	bkv_sched_stats_get(f->s, st);
}

/* Submit NREQ requests (prompts from seeds 1..NREQ) and run them out;
 * returns the steps. Every request must end with LENGTH or STOP, once. */
static uint32_t run_set(fake_host *f, int32_t **prompts, uint32_t max_new, uint32_t n)
{
	uint32_t i, steps;

	for (i = 0; i < NREQ; i++)
		fh_submit_ex(f, prompts[i], 5 + i % 13, max_new, 0, n, i % 5 == 0 ? 9 : 0);
	steps = fh_run(f, 20000);
	cr_assert_eq(bkv_sched_pending(f->s), 0);
	for (i = 1; i <= NREQ; i++) {
		cr_assert_eq(f->finish_count[i], 1, "request %u ended %u times", i,
			     f->finish_count[i]);
		cr_assert(f->reason[i] == BKV_FINISH_LENGTH || f->reason[i] == BKV_FINISH_STOP,
			  "request %u: reason %d", i, f->reason[i]);
	}
	return steps;
}

static int32_t **make_prompts(void)
{
	int32_t **p = malloc(NREQ * sizeof(*p));
	uint32_t i;

	for (i = 0; i < NREQ; i++)
		p[i] = fh_prompt(40, 1 + i); /* the tests use up to 40 */
	return p;
}

static void free_prompts(int32_t **p)
{
	for (uint32_t i = 0; i < NREQ; i++)
		free(p[i]);
	free(p);
}

/* Token-exactness: each request gets exactly what the run without
 * speculation gives it, in fewer steps, with the drafts accepted counted. */
static void exact_vs_plain_some(uint32_t bt, int split, int host_accepts, uint32_t n,
				uint32_t every)
{
	int32_t **p = make_prompts();
	fake_host *plain = spec_host(bt, 1024, 0, BKV_SPEC_K_FIXED, 0, split);
	fake_host *sp = spec_host(bt, 1024, 5, BKV_SPEC_K_FIXED, 800, split);
	bkv_sched_stats st;
	uint32_t s0, s1, i, b;

	sp->host.spec_host_accepts = host_accepts;
	sp->host.spec_draft_every = every;
	s0 = run_set(plain, p, 40, n);
	s1 = run_set(sp, p, 40, n);
	for (i = 1; i <= NREQ; i++)
		for (b = 0; b < n; b++) {
			cr_assert_eq(sp->n_out[i][b], plain->n_out[i][b], "req %u branch %u", i, b);
			cr_assert_arr_eq(sp->out[i][b], plain->out[i][b],
					 BKV_MIN(sp->n_out[i][b], FH_MAX_TOK) * sizeof(int32_t));
		}
	stats(sp, &st);
	cr_assert_gt(st.spec_rows, 0);
	cr_assert_gt(st.spec_accepted, 0);
	cr_assert_lt(st.spec_accepted, st.spec_drafted, "some drafts were rejected");
	cr_assert_eq(st.spec_accepted, sp->host.spec_accepted, "library and host agree");
	cr_assert_lt(s1, s0, "speculation took %u steps, plain %u", s1, s0);
	fh_destroy(plain);
	fh_destroy(sp);
	free_prompts(p);
}

static void exact_vs_plain(uint32_t bt, int split, int host_accepts, uint32_t n)
{
	exact_vs_plain_some(bt, split, host_accepts, n, 0);
}

/* Drafts for every third request only: the fused pass's rows of the others
 * stay where it wrote them, the later ones move past the drafted rows (with
 * block_tokens 2 most drafts open a block), and the host checks every row's
 * tokens, positions, slots and block table. */
Test(spec, drafts_in_some_rows_move_only_what_they_displace)
{
	exact_vs_plain_some(2, 0, 0, 1, 3);
	exact_vs_plain_some(16, 0, 0, 1, 3);
}

Test(spec, greedy_verify_delivers_exactly_the_plain_runs_tokens)
{
	exact_vs_plain(16, 0, 0, 1);
}

Test(spec, host_reported_acceptance_delivers_the_same_tokens)
{
	exact_vs_plain(16, 0, 1, 1);
}

Test(spec, split_host_and_drafts_across_block_boundaries)
{
	exact_vs_plain(2, 1, 0, 1);
}

Test(spec, forked_branches_speculate_each_on_its_own)
{
	exact_vs_plain(4, 0, 0, 3);
}

/* A decode row carries 1 + k tokens with consecutive positions and slots
 * in the lane's blocks (the fake host checks positions and slots); with
 * every draft wrong, the rejected tails' blocks come back: after every
 * step the pool holds exactly the blocks of the committed tokens
 * (bkv_sched_check 11, 13) and no more blocks than the plain run. */
Test(spec, rejected_tails_return_their_blocks)
{
	int32_t **p = make_prompts();
	fake_host *f = spec_host(2, 1024, 8, BKV_SPEC_K_FIXED, 0, 0);
	bkv_sched_stats st;
	bkv_pool_stats ps;
	uint32_t i;

	for (i = 0; i < NREQ; i++)
		fh_submit(f, p[i], 7, 30);
	while (bkv_sched_pending(f->s)) {
		cr_assert(bkv_step(f->s, NULL) == BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0, "check %d", bkv_sched_check(f->s));
		cr_assert_eq(f->host.violations, 0, "%s", f->host.first);
	}
	stats(f, &st);
	cr_assert_gt(st.spec_drafted, 0);
	cr_assert_eq(st.spec_accepted, 0);
	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(f->pool, &ps);
	cr_assert_eq(ps.nr_used, 0, "every block back once the requests ended");
	fh_destroy(f);
	free_prompts(p);
}

/* The prefix cache never indexes a block holding a rejected draft: every
 * STORED event's hash is the hash of a block of some request's delivered
 * history (drafts the fake drafter gets wrong are tokens no request
 * delivers). */
Test(spec, rejected_drafts_never_reach_the_prefix_index)
{
	int32_t **p = make_prompts();
	fh_opts o;
	fake_host *f;
	bkv_pool_config pc;
	bkv_kv_event ev[256];
	uint64_t *known = NULL, *h;
	uint32_t n_known = 0, i, n, stored = 0;
	int32_t hist[64];

	fh_opts_init(&o);
	o.block_tokens = 2;
	o.device_blocks = 4096;
	o.event_capacity = 1u << 16;
	o.cfg.max_running = 8;
	o.cfg.spec_max_k = 6;
	o.cfg.spec_k_mode = BKV_SPEC_K_FIXED;
	o.cfg.spec_drafts = BKV_SPEC_DRAFT_HOST;
	f = fh_create(&o);
	f->host.spec_accept_permille = 500;
	for (i = 0; i < NREQ; i++)
		fh_submit(f, p[i], 9, 40);
	fh_run(f, 20000);
	bkv_pool_config_init(&pc);
	h = malloc(64 * sizeof(uint64_t));
	known = malloc((size_t)NREQ * 64 * sizeof(uint64_t));
	for (i = 1; i <= NREQ; i++) {
		const kh_req *r = &f->req[i];
		uint32_t len = r->prompt_len + f->n_out[i][0], j, m;

		cr_assert(len <= 64);
		for (j = 0; j < len; j++)
			hist[j] = kh_token_at(r, 0, j);
		m = bkv_block_hashes(pc.hash_seed, 0, 2, hist, len, h);
		memcpy(known + n_known, h, m * sizeof(uint64_t));
		n_known += m;
	}
	while ((n = bkv_pool_drain_events(f->pool, ev, 256)) > 0) {
		for (i = 0; i < n; i++) {
			uint32_t j;

			if (ev[i].kind != BKV_EVENT_STORED)
				continue;
			stored++;
			for (j = 0; j < n_known && known[j] != ev[i].hash; j++)
				;
			cr_assert(j < n_known, "event %llu stored a block of no delivered history",
				  (unsigned long long)ev[i].seq);
		}
	}
	cr_assert_gt(stored, 0);
	free(h);
	free(known);
	fh_destroy(f);
	free_prompts(p);
}

/* A failing call (the host writes garbage KV first) rolls back the drafts
 * with everything else; every request still gets its true tokens. */
Test(spec, failed_calls_roll_the_drafts_back)
{
	int32_t **p = make_prompts();
	fake_host *f = spec_host(4, 1024, 4, BKV_SPEC_K_FIXED, 700, 0);
	bkv_sched_stats st;

	f->host.garbage = 1;
	f->host.fail_permille = 150;
	f->host.rng = 12345;
	run_set(f, p, 30, 1);
	stats(f, &st);
	cr_assert_gt(f->host.failed_calls, 0);
	cr_assert_gt(st.spec_accepted, 0);
	fh_destroy(f);
	free_prompts(p);
}

/* Everything together in a small pool: forks, shared prompts (prefix
 * hits), chunked prefill, preemption by swap and by recompute, drafts
 * crossing block boundaries, some calls failing. */
static void together(bkv_preempt_mode mode, uint32_t host_blocks)
{
	static int32_t shared[40];
	int32_t *prompts[NREQ];
	fh_opts o;
	fake_host *f;
	bkv_sched_stats st;
	uint32_t i;

	for (i = 0; i < 40; i++)
		shared[i] = 100 + (int32_t)(i * 7 % 900);
	fh_opts_init(&o);
	o.block_tokens = 4;
	o.device_blocks = 56;
	o.host_blocks = host_blocks;
	o.cfg.max_running = 8;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 24;
	o.cfg.preempt = mode;
	o.cfg.spec_max_k = 6;
	o.cfg.spec_k_mode = BKV_SPEC_K_FIXED;
	o.cfg.spec_drafts = BKV_SPEC_DRAFT_HOST;
	f = fh_create(&o);
	f->host.spec_accept_permille = 650;
	f->host.garbage = 1;
	f->host.fail_permille = 40;
	f->host.rng = 777;
	for (i = 0; i < NREQ; i++) {
		prompts[i] = fh_prompt(40, 50 + i);
		if (i % 2)
			memcpy(prompts[i], shared, 32 * sizeof(int32_t)); /* prefix hits */
		fh_submit_ex(f, prompts[i], 20 + i % 20, 24 + i % 9, 0, 1 + i % 3, 0);
	}
	fh_run(f, 50000);
	cr_assert_eq(bkv_sched_pending(f->s), 0);
	for (i = 1; i <= NREQ; i++)
		cr_assert_eq(f->finish_count[i], 1);
	stats(f, &st);
	cr_assert_gt(st.preemptions, 0, "the pool is small enough to preempt");
	cr_assert_gt(st.spec_accepted, 0);
	cr_assert_gt(st.hit_tokens, 0);
	fh_destroy(f);
	for (i = 0; i < NREQ; i++)
		free(prompts[i]);
}

Test(spec, forks_chunks_prefix_hits_and_recompute_in_a_small_pool)
{
	together(BKV_PREEMPT_RECOMPUTE, 0);
}

Test(spec, forks_chunks_prefix_hits_and_swap_in_a_small_pool)
{
	together(BKV_PREEMPT_SWAP, 512);
}

/* Speculation is the first thing memory pressure gives up: a pool just
 * large enough for the plain run without preemption sees none with
 * drafts of 8 either. */
/* Submit the NREQ prompts to both hosts and run both out: every request
 * of sp ends once with as many tokens as in plain. */
static void s_run_pair(fake_host *plain, fake_host *sp, int32_t **p)
{
	uint32_t i;

	for (i = 0; i < NREQ; i++) {
		fh_submit(plain, p[i], 5 + i % 13, 12);
		fh_submit(sp, p[i], 5 + i % 13, 12);
	}
	fh_run(plain, 20000);
	fh_run(sp, 20000);
	for (i = 1; i <= NREQ; i++) {
		cr_assert_eq(sp->finish_count[i], 1);
		cr_assert_eq(sp->n_out[i][0], plain->n_out[i][0], "req %u", i);
	}
}

Test(spec, drafts_never_cause_a_preemption)
{
	int32_t **p = make_prompts();
	fake_host *plain = spec_host(4, 60, 0, BKV_SPEC_K_FIXED, 0, 0);
	fake_host *sp = spec_host(4, 60, 8, BKV_SPEC_K_FIXED, 300, 0);
	bkv_sched_stats a, b;

	s_run_pair(plain, sp, p);
	stats(plain, &a);
	stats(sp, &b);
	cr_assert_eq(a.preemptions, 0, "the plain run fits (%llu)",
		     (unsigned long long)a.preemptions);
	cr_assert_eq(b.preemptions, 0);
	cr_assert_gt(b.spec_rows, 0);
	fh_destroy(plain);
	fh_destroy(sp);
	free_prompts(p);
}

/* A pool too small for every row's drafts: the rows left without them are
 * counted (bkv_sched_stats.spec_skipped_rows, the fallbacks metric), and
 * every request still ends with exactly the plain run's tokens. */
Test(spec, rows_pressure_leaves_without_drafts_are_counted)
{
	int32_t **p = make_prompts();
	fake_host *plain = spec_host(4, 40, 0, BKV_SPEC_K_FIXED, 0, 0);
	fake_host *sp = spec_host(4, 40, 8, BKV_SPEC_K_FIXED, 300, 0);
	bkv_sched_stats a, b;
	uint32_t i;

	s_run_pair(plain, sp, p);
	stats(plain, &a);
	stats(sp, &b);
	cr_assert_gt(b.spec_rows, 0);
	cr_assert_gt(b.spec_skipped_rows, 0, "no row went without its drafts");
	cr_assert_eq(a.spec_skipped_rows, 0);
	for (i = 1; i <= NREQ; i++)
		cr_assert_arr_eq(sp->out[i][0], plain->out[i][0],
				 BKV_MIN(sp->n_out[i][0], FH_MAX_TOK) * sizeof(int32_t));
	fh_destroy(plain);
	fh_destroy(sp);
	free_prompts(p);
}

/* A warm server: earlier requests left the prefix cache holding nearly
 * every free frame. Cached blocks are room (the pool reclaims them), so the
 * next requests still draft, about as much as in a cold pool. */
Test(spec, drafts_count_reclaimable_cached_blocks_as_room)
{
	int32_t **p = make_prompts();
	fake_host *cold = spec_host(4, 128, 4, BKV_SPEC_K_FIXED, 800, 0);
	fake_host *warm = spec_host(4, 128, 4, BKV_SPEC_K_FIXED, 800, 0);
	bkv_pool_stats ps;
	bkv_sched_stats a, b, w;
	int32_t *fill[40];
	uint32_t i;

	for (i = 0; i < 40; i++) { /* 40 distinct 12-token prompts: 120 blocks cached */
		fill[i] = fh_prompt(12, 500 + i);
		fh_submit(warm, fill[i], 12, 1);
	}
	fh_run(warm, 20000);
	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(warm->pool, &ps);
	cr_assert_lt(ps.nr_free, 16, "the cache holds the free frames (%u free)", ps.nr_free);
	stats(warm, &a);
	for (i = 0; i < 8; i++) {
		fh_submit(cold, p[i], 5 + i, 24);
		fh_submit(warm, p[i], 5 + i, 24);
	}
	fh_run(cold, 20000);
	fh_run(warm, 20000);
	stats(cold, &b);
	stats(warm, &w);
	cr_assert_gt(b.spec_drafted, 0);
	/* (acceptance is drawn at random: the counts differ run to run) */
	cr_assert_geq(10 * (w.spec_drafted - a.spec_drafted), 8 * b.spec_drafted,
		      "warm %llu drafts, cold %llu",
		      (unsigned long long)(w.spec_drafted - a.spec_drafted),
		      (unsigned long long)b.spec_drafted);
	cr_assert_eq(w.preemptions, 0, "drafts evict cached blocks, never a request");
	for (i = 0; i < 40; i++)
		free(fill[i]);
	fh_destroy(cold);
	fh_destroy(warm);
	free_prompts(p);
}

/* Without chunked prefill a prompt runs whole in what the batch arrays have
 * left: a step whose decode row leaves L - 1 tokens of the L-token arrays
 * (the bound, lowered here from 2^24 to keep the arrays small) admits a
 * prompt of L - 1 tokens, and the decode row's drafts must not go past the
 * arrays. They are charged to what is left: none this step. */
Test(spec, drafts_fit_what_a_whole_prompt_left_of_the_batch_arrays)
{
	enum { L = 1024 };
	fh_opts o;
	fake_host *f;
	int32_t *a = fh_prompt(16, 31), *b = fh_prompt(L - 1, 32);
	bkv_sched_stats st;
	uint64_t ia, ib;
	uint32_t steps = 0;

	fh_opts_init(&o);
	o.block_tokens = 16;
	o.device_blocks = 512;
	o.cfg.max_running = 2;
	o.cfg.admit_group = 1;
	o.cfg.spec_max_k = 4;
	o.cfg.spec_k_mode = BKV_SPEC_K_FIXED;
	o.cfg.spec_drafts = BKV_SPEC_DRAFT_HOST;
	f = fh_create(&o);
	f->host.spec_accept_permille = 1000;
	f->s->in.tok_limit = L;
	ia = fh_submit(f, a, 16, 64);
	while (f->n_out[ia][0] < 2 && steps++ < 10) { /* a decodes */
		cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
		cr_assert_eq(bkv_sched_check(f->s), 0);
	}
	stats(f, &st);
	cr_assert_gt(st.spec_rows, 0, "a speculates");
	ib = fh_submit(f, b, L - 1, 2);
	cr_assert_eq(bkv_step(f->s, NULL), BKV_OK);
	cr_assert_eq(bkv_sched_check(f->s), 0);
	cr_assert_eq(f->max_call_tokens, L, "a's decode row and b's prompt fill the arrays");
	fh_run(f, 1000);
	cr_expect_eq(f->finish_count[ia], 1);
	cr_expect_eq(f->finish_count[ib], 1);
	cr_expect_eq(f->reason[ia], BKV_FINISH_LENGTH);
	cr_expect_eq(f->reason[ib], BKV_FINISH_LENGTH);
	cr_expect_leq(f->max_call_tokens, L);
	fh_destroy(f);
	free(a);
	free(b);
}

Test(spec, off_means_no_speculation_arrays)
{
	fake_host *f = spec_host(16, 256, 0, BKV_SPEC_K_AUTO, 0, 0);
	int32_t *p = fh_prompt(8, 3);
	bkv_sched_stats st;

	fh_submit(f, p, 8, 10);
	fh_run(f, 100);
	stats(f, &st);
	cr_assert_eq(st.spec_rows + st.spec_drafted + f->host.spec_rows, 0);
	cr_assert_null(f->s->spec);
	fh_destroy(f);
	free(p);
}

Test(spec, host_drafts_need_the_draft_callback)
{
	bkv_pool_config pc;
	bkv_sched_config c;
	bkv_host_ops ops;
	bkv_pool *pool;
	bkv_sched *s = (bkv_sched *)0x1;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 16;
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&c);
	c.spec_max_k = 4;
	c.spec_drafts = BKV_SPEC_DRAFT_HOST;
	memset(&ops, 0, sizeof(ops));
	ops.forward = fh_forward;
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_EINVAL);
	cr_assert_eq(s, (bkv_sched *)0x1);
	c.spec_drafts = BKV_SPEC_DRAFT_NGRAM;
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_OK);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

/* ---- n-gram drafts -------------------------------------------------------- */

/* A host whose "model" continues a cycle: the token after t is
 * cyc(t) = 100 + (t - 100 + 1) % CYC, whatever came before. Its output repeats
 * with period CYC, which n-gram lookup over the sequence's own tokens
 * predicts once one period has been seen. */
#define CYC 7

typedef struct cyc_host {
	uint64_t rows, spec_rows;
	int32_t out[8][128]; /* by request id - 1 */
	uint32_t n_out[8];
} cyc_host;

static int32_t cyc(int32_t t)
{
	return 100 + (t - 100 + 1) % CYC;
}

static int cyc_forward(void *host, const bkv_batch *b, int32_t *next)
{
	cyc_host *h = host;
	uint32_t r;
	int32_t t;

	for (r = 0; r < b->n_rows; r++) {
		int32_t q0 = b->qo_indptr[r], q1 = b->qo_indptr[r + 1];

		h->rows++;
		if (!b->row_sample[r])
			continue;
		if (b->row_drafts && b->row_drafts[r]) {
			cr_assert_eq(q1 - q0, 1 + (int32_t)b->row_drafts[r]);
			for (t = q0; t < q1; t++)
				b->spec_tokens[t] = cyc(b->token_ids[t]);
			h->spec_rows++;
		} else {
			next[r] = cyc(b->token_ids[q1 - 1]);
		}
	}
	return 0;
}

static void cyc_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	cyc_host *h = host;

	(void)branch;
	(void)user;
	h->out[req - 1][h->n_out[req - 1]++] = token;
}

static void cyc_run(uint32_t k, uint32_t max_running, cyc_host *h, bkv_sched_stats *st,
		    uint32_t *steps)
{
	static const int32_t prompt[5] = {100, 101, 102, 103, 104};
	bkv_pool_config pc;
	bkv_sched_config c;
	bkv_host_ops ops;
	bkv_request q;
	bkv_pool *pool;
	bkv_sched *s;
	uint32_t i;

	memset(h, 0, sizeof(*h));
	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 256;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&c);
	c.max_running = max_running;
	c.admit_group = 1;
	c.spec_max_k = k;
	c.spec_k_mode = BKV_SPEC_K_FIXED;
	memset(&ops, 0, sizeof(ops));
	ops.forward = cyc_forward;
	ops.on_token = cyc_token;
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, h, NULL, &s), BKV_OK);
	for (i = 0; i < 8; i++) {
		bkv_request_init(&q);
		q.prompt = prompt;
		q.prompt_len = 1 + i % 5;
		q.max_new_tokens = 60 + i;
		cr_assert_eq(bkv_submit(s, &q, NULL), BKV_OK);
	}
	for (*steps = 0; bkv_sched_pending(s); ++*steps) {
		cr_assert_eq(bkv_step(s, NULL), BKV_OK);
		cr_assert_eq(bkv_sched_check(s), 0);
	}
	memset(st, 0, sizeof(*st));
	st->size = sizeof(*st);
	bkv_sched_stats_get(s, st);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
	for (i = 0; i < 8; i++) {
		int32_t t = prompt[i % 5];
		uint32_t j;

		cr_assert_eq(h->n_out[i], 60 + i);
		for (j = 0; j < h->n_out[i]; j++) {
			t = cyc(t);
			cr_assert_eq(h->out[i][j], t, "request %u token %u", i + 1, j);
		}
	}
}

Test(spec, ngram_lookup_predicts_repetitive_output)
{
	cyc_host plain, ng;
	bkv_sched_stats a, b;
	uint32_t s0, s1;

	cyc_run(0, 8, &plain, &a, &s0);
	cyc_run(6, 8, &ng, &b, &s1);
	cr_assert_eq(plain.spec_rows, 0);
	cr_assert_gt(ng.spec_rows, 0);
	cr_assert_gt(b.spec_accepted * 10, b.spec_drafted * 9, "acceptance %llu / %llu",
		     (unsigned long long)b.spec_accepted, (unsigned long long)b.spec_drafted);
	cr_assert_lt(s1 * 3, s0, "n-gram steps %u, plain %u", s1, s0);
}

/* decode_tokens counts the tokens decode rows delivered, accepted drafts
 * included: 8 requests deliver 60..67 tokens each, the first of each from
 * its prefill, with or without speculation. */
Test(spec, decode_tokens_counts_every_delivered_token_accepted_drafts_included)
{
	cyc_host plain, ng;
	bkv_sched_stats a, b;
	uint32_t s0, s1;

	cyc_run(0, 8, &plain, &a, &s0);
	cyc_run(6, 8, &ng, &b, &s1);
	cr_assert_gt(b.spec_accepted, 300);
	cr_assert_eq(a.decode_tokens, 8 * 60 + 28 - 8);
	cr_assert_eq(b.decode_tokens, 8 * 60 + 28 - 8, "decode_tokens %llu",
		     (unsigned long long)b.decode_tokens);
}

/* A table whose request ended is taken by the next lane and rebuilt from
 * that lane's history: 8 requests over max_running = 2 tables still predict
 * their cycles. (A stale entry could only cost a draft, never a wrong
 * token: a match is verified against the lane's own tokens.) */
Test(spec, ngram_tables_pass_from_ended_requests_to_new_ones)
{
	cyc_host h;
	bkv_sched_stats st;
	uint32_t steps;

	cyc_run(3, 2, &h, &st, &steps);
	cr_assert_gt(st.spec_accepted * 10, st.spec_drafted * 8, "acceptance %llu / %llu",
		     (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted);
}

/* ---- the choice of k ------------------------------------------------------ */

/* Tokens per us of n rows at acceptance a, context ctx each, k drafts each,
 * under the roofline model rl. */
static double spec_rate(const bkv_cost_roofline *rl, uint32_t n, double a, uint64_t ctx, uint32_t k)
{
	bkv_step_shape sh;
	double e = 0.0, g = 1.0;

	memset(&sh, 0, sizeof(sh));
	sh.kind = BKV_CALL_MIXED;
	sh.decode_rows = n;
	sh.padded_rows = n;
	sh.decode_drafts = n * k;
	sh.decode_context = n * ctx + n * k;
	for (uint32_t j = 0; j <= k; j++, g *= a)
		e += g;
	return (double)n * e / bkv_cost_roofline_step_us(rl, &sh);
}

/* Auto k at rows x acceptance on a roofline preset: at least 0.98 of the
 * best fixed k and never below no speculation (the grid of
 * docs/benchmarks.md, at the cost model's level). */
Test(spec, auto_k_is_within_two_percent_of_the_best_fixed_k)
{
	static const double acc[4] = {0.3, 0.5, 0.7, 0.9};
	static const uint32_t rows[5] = {1, 8, 32, 128, 256};
	bkv_cost_roofline rl;
	bkv_pool_config pc;
	bkv_sched_config c;
	bkv_host_ops ops;
	bkv_pool *pool;
	bkv_sched *s;
	bkv__req *reqs[256];
	bkv__lane lanes[256];
	bkv__row rws[256];
	uint32_t cap[256], k[256], i, ai, ri;

	cr_assert_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16), BKV_OK);
	bkv_pool_config_init(&pc);
	pc.block_tokens = 16;
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&c);
	c.max_running = 256;
	c.spec_max_k = 8;
	c.cost = bkv_cost_roofline_model(&rl);
	memset(&ops, 0, sizeof(ops));
	ops.forward = cyc_forward;
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_OK);
	memset(lanes, 0, sizeof(lanes));
	memset(rws, 0, sizeof(rws));
	for (i = 0; i < 256; i++) {
		reqs[i] = calloc(1, sizeof(bkv__req));
		lanes[i].req = reqs[i];
		rws[i].lane = &lanes[i];
	}
	for (ai = 0; ai < 4; ai++) {
		for (ri = 0; ri < 5; ri++) {
			uint32_t n = rows[ri], best_k = 0, kk;
			double best = 0.0, got, none = spec_rate(&rl, n, acc[ai], 1024, 0);

			for (i = 0; i < n; i++) { /* a request that measured acc[ai] */
				reqs[i]->spec_trials = 1e6f;
				reqs[i]->spec_acc = (float)(acc[ai] * 1e6);
				cap[i] = 8;
			}
			for (kk = 0; kk <= 8; kk++) {
				double r = spec_rate(&rl, n, acc[ai], 1024, kk);

				if (r > best) {
					best = r;
					best_k = kk;
				}
			}
			bkv__spec_choose(s, rws, cap, n, n, (uint64_t)n * 1024, k);
			for (i = 1; i < n; i++)
				cr_assert_eq(k[i], k[0], "rows alike, k alike");
			got = spec_rate(&rl, n, acc[ai], 1024, k[0]);
			cr_assert_geq(got, 0.98 * best, "a %.1f rows %u: auto k %u %.4f, best k %u %.4f",
				      acc[ai], n, k[0], got, best_k, best);
			cr_assert_geq(got, none);
		}
	}
	for (i = 0; i < 256; i++)
		free(reqs[i]);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

/* With a TPOT target the choice keeps the target where speculation can
 * meet it: one row at acceptance 0.9 whose plain step misses the target
 * gets drafts that bring its time per token under it. */
Test(spec, auto_k_meets_a_tpot_target_it_can_meet)
{
	bkv_cost_roofline rl;
	bkv_pool_config pc;
	bkv_sched_config c;
	bkv_host_ops ops;
	bkv_pool *pool;
	bkv_sched *s;
	bkv__req *r = calloc(1, sizeof(bkv__req));
	bkv__lane lane;
	bkv__row row;
	uint32_t cap = 8, k = 0;
	double t0, per_tok;

	cr_assert_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16), BKV_OK);
	t0 = spec_rate(&rl, 1, 0.9, 1024, 0); /* tokens per us without drafts */
	bkv_pool_config_init(&pc);
	pc.block_tokens = 16;
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&c);
	c.spec_max_k = 8;
	c.cost = bkv_cost_roofline_model(&rl);
	c.tpot_target_us = (uint32_t)(0.5 / t0); /* half the plain step's time */
	memset(&ops, 0, sizeof(ops));
	ops.forward = cyc_forward;
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_OK);
	r->spec_trials = 1e6f;
	r->spec_acc = 0.9e6f;
	memset(&lane, 0, sizeof(lane));
	memset(&row, 0, sizeof(row));
	lane.req = r;
	row.lane = &lane;
	bkv__spec_choose(s, &row, &cap, 1, 1, 1024, &k);
	per_tok = 1.0 / spec_rate(&rl, 1, 0.9, 1024, k);
	cr_assert_gt(k, 0);
	cr_assert_leq(per_tok, (double)c.tpot_target_us, "k %u: %.1f us per token, target %u", k,
		      per_tok, c.tpot_target_us);
	free(r);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}
