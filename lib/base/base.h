/*
 * base.h - what every layer of lib/ shares: the assertion tiers, the
 * allocator hook every handle routes its memory through, a few macros.
 *
 * lib/ is built in layers (docs/design.md, "The layers"); each layer's
 * header names its owner file for every declaration. Cross-file internals
 * are named bkv__name (libuv's convention); file-static helpers carry no
 * prefix.
 */
#ifndef BKV_BASE_H
#define BKV_BASE_H

#include "batchkv.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* MurmurHash3's 64-bit finalizer: every input bit reaches every output bit
 * (keys of the adapters' and the encoder inputs' domains). */
static inline uint64_t bkv__fmix64(uint64_t z)
{
	z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdull;
	z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ull;
	return z ^ (z >> 33);
}

/* ---- base/status.c: allocator hook --------------------------------------------
 * Every handle copies the caller's bkv_allocator (or the libc one) and all of
 * its memory goes through these. Sizes are passed back on free and realloc. */
void bkv__alloc_init(bkv_allocator *dst, const bkv_allocator *src);
void *bkv__malloc(const bkv_allocator *a, size_t size);
void *bkv__calloc(const bkv_allocator *a, size_t n, size_t size);
void *bkv__realloc(const bkv_allocator *a, void *p, size_t old_size, size_t size);
void bkv__free(const bkv_allocator *a, void *p, size_t size);

/* ---- base/status.c: the last error message --------------------------------
 * The calling thread's bkv_last_error() message. bkv__fail formats it
 * (printf rules, cut at 255 bytes) and returns code, so a check reads
 *     return bkv__fail(BKV_EINVAL, "bkv_pool_config.x = %u: must be ...", x);
 * bkv__error_clear empties it: the calls that check arguments do so first
 * (include/batchkv.h, bkv_last_error). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
int bkv__fail(int code, const char *fmt, ...);
void bkv__error_clear(void);

/* Overflow-checked n * size; returns 0 (and *out untouched) on overflow. */
int bkv__mul_size(size_t n, size_t size, size_t *out);

/* Monotonic clock in microseconds (CLOCK_MONOTONIC). */
uint64_t bkv__monotonic_us(void);

/* ---- base/sizing.c: KV groups ---------------------------------------------
 * The rules every bkv_kv_group must keep (the pool checks its config with
 * these): layers and bytes >= 1, reserved 0, a known kind; FULL span 0,
 * WINDOW and CHUNKED span 1..INT32_MAX, STATE span a multiple of
 * block_tokens. A
 * block_tokens of 0 skips the checks that need it; any other must be a
 * power of two. The list form also wants 1..BKV_MAX_GROUPS groups and at
 * most one STATE group. Both return 1 when valid, 0 otherwise.
 * bkv__kv_groups_check keeps the list form's rules on the groups (not on
 * block_tokens): BKV_OK, or BKV_EINVAL, and with owner (the config struct's
 * name, "bkv_pool_config") the message names the field and the rule
 * ("bkv_kv_group[1].span = 0: a WINDOW group needs a span ..."). */
int bkv__kv_group_ok(const bkv_kv_group *g, uint32_t block_tokens);
int bkv__kv_groups_ok(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens);
int bkv__kv_groups_check(const bkv_kv_group *groups, uint32_t n, uint32_t block_tokens,
			 const char *owner);


#if defined(__GNUC__) || defined(__clang__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define NOINLINE __attribute__((noinline))
#define PREFETCH(p) __builtin_prefetch(p)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define COLD __attribute__((noinline, cold)) /* rare paths kept out of hot
						 loops */
#else
#define ALWAYS_INLINE inline
#define COLD
#define LIKELY(x) (x)
#define UNLIKELY(x) (x)
#define NOINLINE
#define PREFETCH(p) ((void)(p))
#endif

#endif /* BKV_BASE_H */
