/*
 * internal.h - what lib/ files share and nobody else sees.
 *
 * Grouped by the file that defines each piece. Cross-file internals are named
 * bkv__name (libuv's convention); file-static helpers carry no prefix. Tests
 * that need internals include this header and link the static library.
 */
#ifndef BKV_INTERNAL_H
#define BKV_INTERNAL_H

#include "batchkv.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

/* ---- assertion tiers ------------------------------------------------------
 * BKV_DEBUG_LEVEL 0: none. 1: BKV_ASSERT (cheap, O(1)). 2: also
 * BKV_ASSERT_EXPENSIVE (a full invariant walk after each mutation). */
#ifndef BKV_DEBUG_LEVEL
#define BKV_DEBUG_LEVEL 1
#endif
#if BKV_DEBUG_LEVEL >= 1
#define BKV_ASSERT(x) assert(x)
#else
#define BKV_ASSERT(x) ((void)0)
#endif
#if BKV_DEBUG_LEVEL >= 2
#define BKV_ASSERT_EXPENSIVE(x) assert(x)
#else
#define BKV_ASSERT_EXPENSIVE(x) ((void)0)
#endif

#define BKV_UNUSED(x) ((void)(x))
#define BKV_MIN(a, b) ((a) < (b) ? (a) : (b))
#define BKV_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- status.c: allocator hook --------------------------------------------
 * Every handle copies the caller's bkv_allocator (or the libc one) and all of
 * its memory goes through these. Sizes are passed back on free and realloc. */
void bkv__alloc_init(bkv_allocator *dst, const bkv_allocator *src);
void *bkv__malloc(const bkv_allocator *a, size_t size);
void *bkv__calloc(const bkv_allocator *a, size_t n, size_t size);
void *bkv__realloc(const bkv_allocator *a, void *p, size_t old_size, size_t size);
void bkv__free(const bkv_allocator *a, void *p, size_t size);

/* Overflow-checked n * size; returns 0 (and *out untouched) on overflow. */
int bkv__mul_size(size_t n, size_t size, size_t *out);

/* Monotonic clock in microseconds (CLOCK_MONOTONIC). */
uint64_t bkv__monotonic_us(void);

#endif /* BKV_INTERNAL_H */
