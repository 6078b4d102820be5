/*
 * test_encoder_overlap.c - an overlapped launch's encoder lists
 * (bkv_batch.encode, encoder_free) stay valid until its step completes,
 * though the next step is planned, and its lists filled, before: a device
 * that reads the first step's list after the second launch (as a stream
 * would) still finds the first step's inputs.
 *
 * Two requests, each with one image: the first launch encodes image A, the
 * second (planned while the first is in flight) image B. After the second
 * launch the first batch's encode array must still say A.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "batchkv.h"

#define PROMPT 40u

/* The launches seen: the encode array each pointed to and what it held
 * then, and the library's next_tokens to fill before completing. */
typedef struct rec {
	const bkv_encode *enc[4]; /* launch i's bkv_batch.encode */
	bkv_encode copy[4];       /* its first entry at launch */
	uint32_t n_enc[4];        /* its n_encode */
	int32_t *next[4];         /* its next_tokens */
	uint32_t rows[4];         /* its n_rows */
	uint32_t n;               /* launches */
} rec;

static int rec_launch(void *host, const bkv_batch *b, int32_t *next)
{
	rec *r = host;
	if (r->n == 4)
		return -1;
	r->enc[r->n] = b->encode;
	r->n_enc[r->n] = b->n_encode;
	if (b->n_encode)
		r->copy[r->n] = b->encode[0];
	r->next[r->n] = next;
	r->rows[r->n++] = b->n_rows;
	return 0;
}

static int rec_forward(void *host, const bkv_batch *b, int32_t *next)
{
	(void)host;
	for (uint32_t i = 0; i < b->n_rows; i++)
		next[i] = 1;
	return 0;
}

static void submit_image(bkv_sched *s, int32_t *prompt, const bkv_encoder_input *in)
{
	bkv_request q;
	bkv_request_init(&q);
	q.prompt = prompt;
	q.prompt_len = PROMPT;
	q.max_new_tokens = 4;
	q.n_inputs = 1;
	q.inputs = in;
	uint64_t id;
	cr_assert_eq(bkv_submit(s, &q, &id), BKV_OK, "%s", bkv_last_error());
}

Test(encoder_overlap, a_launched_encode_list_stays_valid_until_its_step_completes)
{
	bkv_pool_config pc;
	bkv_pool_config_init(&pc);
	pc.block_tokens = 16;
	pc.device_blocks = 64;
	bkv_pool *pool = NULL;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config sc;
	bkv_sched_config_init(&sc);
	sc.overlap = 1;
	sc.chunked_prefill = 1;
	sc.encoder_cache = 64;
	rec r;
	memset(&r, 0, sizeof(r));
	bkv_host_ops ops = {.launch = rec_launch, .forward = rec_forward};
	bkv_sched *s = NULL;
	cr_assert_eq(bkv_sched_create(&sc, pool, &ops, &r, NULL, &s), BKV_OK, "%s",
		     bkv_last_error());
	int32_t pa[PROMPT], pb[PROMPT];
	for (uint32_t i = 0; i < PROMPT; i++)
		pa[i] = (int32_t)(i + 1), pb[i] = (int32_t)(i + 100);
	const bkv_encoder_input ia = {.cache_id = 0xA, .token_start = 4, .token_len = 8};
	const bkv_encoder_input ib = {.cache_id = 0xB, .token_start = 4, .token_len = 8};
	uint64_t t1 = 0, t2 = 0;
	submit_image(s, pa, &ia);
	cr_assert_eq(bkv_step_launch(s, &t1, NULL), BKV_OK);
	cr_assert_eq(r.n, 1);
	cr_assert_eq(r.n_enc[0], 1);
	cr_assert_eq(r.copy[0].cache_id, 0xA);
	submit_image(s, pb, &ib);
	int st = bkv_step_launch(s, &t2, NULL);
	cr_assert(st == BKV_OK || st == BKV_EAGAIN);
	if (st == BKV_OK && r.n == 2 && r.n_enc[1] == 1) {
		/* the first step is still in flight: its list must hold A */
		cr_expect_eq(r.enc[0][0].cache_id, 0xA,
			     "the in-flight step's encode[0] now says %llx (the second "
			     "launch's input): the library reused the array",
			     (unsigned long long)r.enc[0][0].cache_id);
	} else {
		cr_skip_test("the second launch planned no encoding while the first was in "
			     "flight (st %d, launches %u)", st, r.n);
	}
	for (uint32_t i = 0; i < r.n; i++)
		for (uint32_t k = 0; k < r.rows[i]; k++)
			r.next[i][k] = 1;
	cr_assert_eq(bkv_step_complete(s, t1, 0, NULL), BKV_OK);
	if (t2)
		cr_assert_eq(bkv_step_complete(s, t2, 0, NULL), BKV_OK);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}
