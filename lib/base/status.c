/*
 * status.c - status codes, the version, the allocator hook and KV sizing.
 *
 * The small pieces every other file leans on. Status messages come from the
 * one X-macro in batchkv.h so the enum and bkv_strerror() cannot drift. The
 * allocator hook is per handle (never process-global): each handle copies the
 * caller's bkv_allocator at create time, or the libc one below, and hands the
 * old size back on realloc and free so a caller's allocator needs no header.
 *
 * KV sizing follows seed 001: one token's KV is 2 (K and V) x layers x
 * kv_heads x head_dim x dtype_bytes. With kv_heads equal to the query heads
 * this is MHA; fewer is GQA; one is MQA.
 */
#include "base/base.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *bkv_strerror(int status)
{
	switch (status) {
#define BKV__STATUS_MSG(name, value, msg)                                      \
	case value:                                                            \
		return msg;
		BKV_STATUS_MAP(BKV__STATUS_MSG)
#undef BKV__STATUS_MSG
	default:
		return "unknown error";
	}
}

const char *bkv_version(void)
{
	return BKV_VERSION_STRING;
}

/* ---- allocator hook ------------------------------------------------------ */

static void *libc_alloc(void *ud, size_t size)
{
	BKV_UNUSED(ud);
	return malloc(size);
}

static void *libc_realloc(void *ud, void *p, size_t old_size, size_t size)
{
	BKV_UNUSED(ud);
	BKV_UNUSED(old_size);
	return realloc(p, size);
}

static void libc_free(void *ud, void *p, size_t size)
{
	BKV_UNUSED(ud);
	BKV_UNUSED(size);
	free(p);
}

void bkv__alloc_init(bkv_allocator *dst, const bkv_allocator *src)
{
	if (src && src->alloc && src->realloc && src->free) {
		*dst = *src;
	} else {
		dst->alloc = libc_alloc;
		dst->realloc = libc_realloc;
		dst->free = libc_free;
		dst->ud = NULL;
	}
}

void *bkv__malloc(const bkv_allocator *a, size_t size)
{
	if (size == 0)
		size = 1;
	return a->alloc(a->ud, size);
}

void *bkv__calloc(const bkv_allocator *a, size_t n, size_t size)
{
	size_t total;
	void *p;

	if (!bkv__mul_size(n, size, &total))
		return NULL;
	p = bkv__malloc(a, total);
	if (p)
		memset(p, 0, total ? total : 1);
	return p;
}

void *bkv__realloc(const bkv_allocator *a, void *p, size_t old_size, size_t size)
{
	if (!p)
		return bkv__malloc(a, size);
	if (size == 0)
		size = 1;
	return a->realloc(a->ud, p, old_size ? old_size : 1, size);
}

void bkv__free(const bkv_allocator *a, void *p, size_t size)
{
	if (p)
		a->free(a->ud, p, size ? size : 1);
}

int bkv__mul_size(size_t n, size_t size, size_t *out)
{
	if (size != 0 && n > SIZE_MAX / size)
		return 0;
	*out = n * size;
	return 1;
}

uint64_t bkv__monotonic_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- KV sizing (seed 001) ------------------------------------------------ */

static int mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	if (b != 0 && a > UINT64_MAX / b)
		return 0;
	*out = a * b;
	return 1;
}

uint64_t bkv_kv_bytes_per_token(const bkv_model_shape *shape)
{
	uint64_t v = 2;

	if (!shape || !shape->layers || !shape->kv_heads || !shape->head_dim ||
	    !shape->dtype_bytes)
		return 0;
	if (!mul_u64(v, shape->layers, &v) || !mul_u64(v, shape->kv_heads, &v) ||
	    !mul_u64(v, shape->head_dim, &v) || !mul_u64(v, shape->dtype_bytes, &v))
		return 0;
	return v;
}

uint32_t bkv_blocks_for_bytes(uint64_t budget, const bkv_model_shape *shape,
			      uint32_t block_tokens)
{
	uint64_t per_token = bkv_kv_bytes_per_token(shape);
	uint64_t per_block, blocks;

	if (!per_token || !block_tokens || !mul_u64(per_token, block_tokens, &per_block))
		return 0;
	blocks = budget / per_block;
	return blocks > INT32_MAX ? (uint32_t)INT32_MAX : (uint32_t)blocks;
}
