/*
 * minimal.c - the shortest complete integration of libbatchkv.
 *
 * A fake host whose "model" answers each row with (last input token + 1):
 * one pool, one scheduler with a mixed-batch forward callback, three requests,
 * bkv_step until every request has ended. A real host would run its attention
 * kernels over batch->kv_indices / slot_mapping where this one adds one.
 */
#include <batchkv.h>

#include <stdio.h>

static int forward(void *host, const bkv_batch *b, int32_t *next_tokens)
{
	uint32_t r;

	(void)host;
	/* a real host performs b->swap_out, b->swap_in, b->copies first */
	for (r = 0; r < b->n_rows; r++)
		if (b->row_sample[r])
			next_tokens[r] = b->token_ids[b->qo_indptr[r + 1] - 1] + 1;
	return 0;
}

static void on_token(void *host, uint64_t req, uint32_t branch, int32_t token, void *user)
{
	(void)host;
	(void)branch;
	(void)user;
	printf("request %llu: token %d\n", (unsigned long long)req, token);
}

static void on_finish(void *host, uint64_t req, bkv_finish_reason why, void *user)
{
	(void)user;
	++*(int *)host;
	printf("request %llu: finished (%s)\n", (unsigned long long)req,
	       why == BKV_FINISH_STOP ? "stop token" : why == BKV_FINISH_LENGTH ? "length" : "other");
}

int main(void)
{
	static const int32_t prompt[] = {100, 101, 102, 103, 104};
	static const int32_t stop = 110;
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops = {0};
	bkv_pool *pool = NULL;
	bkv_sched *sched = NULL;
	int finished = 0, i, rc;

	bkv_pool_config_init(&pc);
	pc.device_blocks = 64;
	bkv_sched_config_init(&sc);
	ops.forward = forward;
	ops.on_token = on_token;
	ops.on_finish = on_finish;
	/* a refused config says which field and why (bkv_last_error) */
	if ((rc = bkv_pool_create(&pc, NULL, &pool)) != BKV_OK)
		return fprintf(stderr, "bkv_pool_create: %s: %s\n", bkv_strerror(rc),
			       bkv_last_error()), 1;
	if ((rc = bkv_sched_create(&sc, pool, &ops, &finished, NULL, &sched)) != BKV_OK)
		return fprintf(stderr, "bkv_sched_create: %s: %s\n", bkv_strerror(rc),
			       bkv_last_error()), 1;

	for (i = 0; i < 3; i++) {
		bkv_request req;

		bkv_request_init(&req);
		req.prompt = prompt;
		req.prompt_len = 5;
		req.max_new_tokens = (uint32_t)(2 + 2 * i);
		req.stop_tokens = &stop;
		req.n_stop = 1;
		if ((rc = bkv_submit(sched, &req, NULL)) != BKV_OK)
			return fprintf(stderr, "bkv_submit: %s: %s\n", bkv_strerror(rc),
				       bkv_last_error()), 1;
	}
	while (bkv_sched_pending(sched) > 0)
		if ((rc = bkv_step(sched, NULL)) != BKV_OK)
			return fprintf(stderr, "bkv_step: %s\n", bkv_strerror(rc)), 1;

	bkv_sched_destroy(sched);
	bkv_pool_destroy(pool);
	return finished == 3 ? 0 : 1;
}
