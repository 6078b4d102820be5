/*
 * status.c - status codes, the last error message, the version and the
 * allocator hook.
 *
 * The small pieces every other file leans on. Status messages come from the
 * one X-macro in batchkv.h so the enum and bkv_strerror() cannot drift. The
 * last error message (bkv_last_error) is per thread. The
 * allocator hook is per handle (never process-global): each handle copies the
 * caller's bkv_allocator at create time, or the libc one below, and hands the
 * old size back on realloc and free so a caller's allocator needs no header.
 * KV sizing lives next door, in sizing.c.
 */
#include "base/base.h"

#include <stdarg.h>
#include <stdio.h>
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

/* ---- the last error message ----------------------------------------------
 * One buffer per thread: a refused call on one thread never overwrites what
 * another thread is about to read. */

static _Thread_local char last_error[256];

const char *bkv_last_error(void)
{
	return last_error;
}

int bkv__fail(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (vsnprintf(last_error, sizeof last_error, fmt, ap) < 0)
		last_error[0] = '\0';
	va_end(ap);
	return code;
}

void bkv__error_clear(void)
{
	last_error[0] = '\0';
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
