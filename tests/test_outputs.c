/*
 * test_outputs.c - a step's outputs as arrays (bkv_sched_outputs_enable,
 * bkv_sched_outputs_get): the tokens and the ends the callbacks saw, in
 * their order, per delivery point; an abort between steps read with the
 * next one; off, a refusal. The randomized composition tester
 * (tests/compose) checks the arrays against the callbacks under every
 * feature, overlapped steps included.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "batchkv.h"

typedef struct log {
	uint64_t tok_req[256];
	uint32_t tok_branch[256];
	int32_t tok[256];
	uint32_t n_tok;
	uint64_t fin_req[64];
	int32_t fin_why[64];
	uint32_t n_fin;
} log_t;

static int forward(void *host, const bkv_batch *b, int32_t *next)
{
	uint32_t r;

	(void)host;
	for (r = 0; r < b->n_rows; r++)
		if (b->row_sample[r])
			next[r] = 100 + (int32_t)b->positions[b->qo_indptr[r + 1] - 1];
	return 0;
}

static void on_token(void *host, uint64_t req, uint32_t br, int32_t t, void *user)
{
	log_t *l = host;

	(void)user;
	l->tok_req[l->n_tok] = req;
	l->tok_branch[l->n_tok] = br;
	l->tok[l->n_tok++] = t;
}

static void on_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	log_t *l = host;

	(void)user;
	l->fin_req[l->n_fin] = req;
	l->fin_why[l->n_fin++] = (int32_t)why;
}

static void same_as_log(bkv_sched *s, const log_t *l)
{
	bkv_step_outputs o = {.size = sizeof(o)};
	uint32_t i;

	cr_assert_eq(bkv_sched_outputs_get(s, &o), BKV_OK);
	cr_assert_eq(o.n_tokens, l->n_tok);
	cr_assert_eq(o.n_finished, l->n_fin);
	for (i = 0; i < l->n_tok; i++) {
		cr_assert_eq(o.token_req[i], l->tok_req[i]);
		cr_assert_eq(o.token_branch[i], l->tok_branch[i]);
		cr_assert_eq(o.token_ids[i], l->tok[i]);
	}
	for (i = 0; i < l->n_fin; i++) {
		cr_assert_eq(o.finished_req[i], l->fin_req[i]);
		cr_assert_eq(o.finished_reason[i], l->fin_why[i]);
	}
}

static bkv_sched *make(bkv_pool **pool, log_t *l)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_sched *s = NULL;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, pool), BKV_OK);
	bkv_sched_config_init(&sc);
	sc.max_running = 4;
	memset(&ops, 0, sizeof(ops));
	ops.forward = forward;
	ops.on_token = on_token;
	ops.on_finish = on_finish;
	cr_assert_eq(bkv_sched_create(&sc, *pool, &ops, l, NULL, &s), BKV_OK);
	return s;
}

static uint64_t submit(bkv_sched *s, uint32_t n, uint32_t max_new)
{
	static const int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
	bkv_request q;
	uint64_t id = 0;

	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = 6;
	q.n = n;
	q.max_new_tokens = max_new;
	cr_assert_eq(bkv_submit(s, &q, &id), BKV_OK);
	return id;
}

Test(outputs, each_step_reads_the_tokens_and_ends_its_callbacks_saw)
{
	bkv_pool *pool;
	log_t l;
	bkv_sched *s = make(&pool, &l);
	uint32_t steps = 0, total = 0;

	cr_assert_eq(bkv_sched_outputs_enable(s, 1), BKV_OK);
	(void)submit(s, 1, 5);
	(void)submit(s, 2, 3); /* two branches */
	(void)submit(s, 1, 1);
	while (bkv_sched_pending(s)) {
		memset(&l, 0, sizeof(l));
		cr_assert_eq(bkv_step(s, NULL), BKV_OK);
		same_as_log(s, &l);
		total += l.n_tok;
		steps++;
	}
	cr_assert_eq(total, 5 + 2 * 3 + 1);
	cr_assert_gt(steps, 1);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

Test(outputs, an_abort_between_steps_is_read_with_the_next_step)
{
	bkv_pool *pool;
	log_t l;
	bkv_sched *s = make(&pool, &l);
	uint64_t a;

	cr_assert_eq(bkv_sched_outputs_enable(s, 1), BKV_OK);
	a = submit(s, 1, 50);
	(void)submit(s, 1, 50);
	memset(&l, 0, sizeof(l));
	cr_assert_eq(bkv_step(s, NULL), BKV_OK);
	same_as_log(s, &l);
	cr_assert_eq(bkv_abort(s, a), BKV_OK);
	memset(&l, 0, sizeof(l));
	cr_assert_eq(bkv_step(s, NULL), BKV_OK);
	cr_assert_eq(l.n_fin, 1);
	cr_assert_eq(l.fin_why[0], BKV_FINISH_ABORT);
	same_as_log(s, &l);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

Test(outputs, off_they_are_refused_and_on_twice_is_once)
{
	bkv_pool *pool;
	log_t l;
	bkv_sched *s = make(&pool, &l);
	bkv_step_outputs o = {.size = sizeof(o)};

	cr_assert_eq(bkv_sched_outputs_get(s, &o), BKV_ESTATE);
	cr_assert_eq(bkv_sched_outputs_enable(s, 2), BKV_EINVAL);
	cr_assert_eq(bkv_sched_outputs_enable(NULL, 1), BKV_EINVAL);
	cr_assert_eq(bkv_sched_outputs_enable(s, 1), BKV_OK);
	cr_assert_eq(bkv_sched_outputs_enable(s, 1), BKV_OK);
	cr_assert_eq(bkv_sched_outputs_get(s, &o), BKV_OK);
	cr_assert_eq(o.n_tokens, 0);
	cr_assert_eq(bkv_sched_outputs_get(s, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_sched_outputs_enable(s, 0), BKV_OK);
	cr_assert_eq(bkv_sched_outputs_get(s, &o), BKV_ESTATE);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}
