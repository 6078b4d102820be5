/*
 * test_basics.c - status codes, version, allocator hook, KV sizing (seed 001).
 */
#include "internal.h"

#include <criterion/criterion.h>
#include <string.h>

Test(basics, strerror_names_every_status_and_unknowns)
{
#define CHECK_MSG(name, value, msg) cr_expect_str_eq(bkv_strerror(BKV_##name), msg);
	BKV_STATUS_MAP(CHECK_MSG)
#undef CHECK_MSG
	cr_expect_str_eq(bkv_strerror(1), "unknown error");
	cr_expect_str_eq(bkv_strerror(-1000), "unknown error");
}

Test(basics, status_codes_are_negative_and_distinct)
{
	int seen[16] = {0};
#define CHECK_NEG(name, value, msg)                                            \
	cr_expect(BKV_##name <= 0);                                            \
	cr_expect(seen[-(BKV_##name)]++ == 0, #name " duplicated");
	BKV_STATUS_MAP(CHECK_NEG)
#undef CHECK_NEG
}

Test(basics, version_matches_header)
{
	cr_expect_str_eq(bkv_version(), BKV_VERSION_STRING);
}

/* Seed 001: Llama 2 13B, 40 layers, 5,120 dims (40 heads x 128), batch 32,
 * 2,048 tokens, 2 bytes: 2*32*2048*40*5120*2 = 53,687,091,200 bytes. */
Test(basics, kv_sizing_reproduces_seed001_llama2_13b)
{
	bkv_model_shape llama13b = {.layers = 40, .kv_heads = 40, .head_dim = 128,
				    .dtype_bytes = 2};
	uint64_t per_token = bkv_kv_bytes_per_token(&llama13b);

	cr_expect_eq(per_token, 819200u);
	cr_expect_eq(per_token * 32u * 2048u, 53687091200ull);
}

Test(basics, kv_sizing_handles_gqa_and_mqa)
{
	bkv_model_shape mha = {32, 32, 128, 2}, gqa = {32, 8, 128, 2}, mqa = {32, 1, 128, 2};

	cr_expect_eq(bkv_kv_bytes_per_token(&mha), 524288u);
	cr_expect_eq(bkv_kv_bytes_per_token(&gqa), 131072u);
	cr_expect_eq(bkv_kv_bytes_per_token(&mqa), 16384u);
	cr_expect_eq(bkv_kv_bytes_per_token(&mha), 4 * bkv_kv_bytes_per_token(&gqa));
}

Test(basics, kv_sizing_rejects_bad_shapes)
{
	bkv_model_shape zero = {0, 8, 128, 2};
	bkv_model_shape huge = {UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX};

	cr_expect_eq(bkv_kv_bytes_per_token(NULL), 0u);
	cr_expect_eq(bkv_kv_bytes_per_token(&zero), 0u);
	cr_expect_eq(bkv_kv_bytes_per_token(&huge), 0u);
	cr_expect_eq(bkv_blocks_for_bytes(1u << 30, NULL, 16), 0u);
}

Test(basics, blocks_for_bytes_rounds_down_to_whole_blocks)
{
	bkv_model_shape llama13b = {40, 40, 128, 2};
	/* one block of 16 tokens = 13,107,200 bytes */
	cr_expect_eq(bkv_blocks_for_bytes(13107200u, &llama13b, 16), 1u);
	cr_expect_eq(bkv_blocks_for_bytes(13107199u, &llama13b, 16), 0u);
	cr_expect_eq(bkv_blocks_for_bytes(53687091200ull, &llama13b, 16), 4096u);
	cr_expect_eq(bkv_blocks_for_bytes(1000, &llama13b, 0), 0u);
	/* clamped to INT32_MAX: block ids are int32_t */
	bkv_model_shape tiny = {1, 1, 1, 1};
	cr_expect_eq(bkv_blocks_for_bytes(UINT64_MAX, &tiny, 1), (uint32_t)INT32_MAX);
}

/* ---- the allocator hook -------------------------------------------------- */

typedef struct counting {
	size_t live_bytes;
	unsigned calls;
} counting;

static void *c_alloc(void *ud, size_t n)
{
	counting *c = ud;
	c->calls++;
	c->live_bytes += n;
	return malloc(n);
}

static void *c_realloc(void *ud, void *p, size_t o, size_t n)
{
	counting *c = ud;
	void *q = realloc(p, n);
	c->calls++;
	if (q)
		c->live_bytes = c->live_bytes - o + n;
	return q;
}

static void c_free(void *ud, void *p, size_t n)
{
	counting *c = ud;
	c->live_bytes -= n;
	free(p);
}

Test(basics, allocator_hook_receives_sizes_back)
{
	counting c = {0, 0};
	bkv_allocator user = {c_alloc, c_realloc, c_free, &c}, a;
	char *p;

	bkv__alloc_init(&a, &user);
	p = bkv__malloc(&a, 10);
	cr_assert_not_null(p);
	p = bkv__realloc(&a, p, 10, 100);
	cr_assert_not_null(p);
	cr_expect_eq(c.live_bytes, 100u);
	bkv__free(&a, p, 100);
	cr_expect_eq(c.live_bytes, 0u);
	cr_expect_eq(c.calls, 2u);
}

Test(basics, allocator_default_is_libc_and_calloc_checks_overflow)
{
	bkv_allocator a;
	bkv__alloc_init(&a, NULL);
	cr_expect_null(bkv__calloc(&a, SIZE_MAX / 2, 4));
	int *p = bkv__calloc(&a, 4, sizeof(int));
	cr_assert_not_null(p);
	cr_expect_eq(p[0] | p[1] | p[2] | p[3], 0);
	bkv__free(&a, p, 4 * sizeof(int));
}
