/*
 * pool_util.h - helpers shared by the pool test files (header-only, static).
 */
#ifndef BKV_TEST_POOL_UTIL_H
#define BKV_TEST_POOL_UTIL_H

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "batchkv.h"

/* splitmix64 (Steele, Lea and Flood 2014): a deterministic test generator. */
static inline uint64_t test_rand(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* An allocator hook over libc that counts alloc and realloc calls. */
typedef struct test_alloc_count {
	uint64_t calls; /* alloc + realloc calls so far */
} test_alloc_count;

static inline void *test_count_alloc(void *ud, size_t size)
{
	((test_alloc_count *)ud)->calls++;
	return malloc(size);
}

static inline void *test_count_realloc(void *ud, void *p, size_t old_size, size_t size)
{
	(void)old_size;
	((test_alloc_count *)ud)->calls++;
	return realloc(p, size);
}

static inline void test_count_free(void *ud, void *p, size_t size)
{
	(void)ud;
	(void)size;
	free(p);
}

static inline bkv_allocator test_counting_allocator(test_alloc_count *c)
{
	bkv_allocator a = {test_count_alloc, test_count_realloc, test_count_free, c};

	return a;
}

static inline bkv_pool *make_pool_ex(uint32_t bt, uint32_t nb, uint32_t nh, uint32_t watermark,
				     int prefix_cache)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = bt;
	c.device_blocks = nb;
	c.host_blocks = nh;
	c.watermark_blocks = watermark;
	c.max_seqs = 64;
	c.prefix_cache = prefix_cache;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

static inline bkv_pool *make_pool(uint32_t bt, uint32_t nb, uint32_t nh, uint32_t watermark)
{
	return make_pool_ex(bt, nb, nh, watermark, 1);
}

/* A pool with a host cache (bkv_pool_config.host_cache): bt-token blocks, nb
 * on the device, nh on the host, an event ring events long. */
static inline bkv_pool *make_hc_pool(uint32_t bt, uint32_t nb, uint32_t nh, uint32_t events)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = bt;
	c.device_blocks = nb;
	c.host_blocks = nh;
	c.host_cache = 1;
	c.max_seqs = 16;
	c.event_capacity = events;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

static inline void fill_tokens(int32_t *t, uint32_t n, int32_t first)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		t[i] = first + (int32_t)i;
}

static inline bkv_pool_stats pool_stats(const bkv_pool *p)
{
	bkv_pool_stats s;

	memset(&s, 0, sizeof s);
	s.size = sizeof s;
	bkv_pool_stats_get(p, &s);
	return s;
}

static inline void expect_same_stats(const bkv_pool_stats *before, const bkv_pool *p)
{
	bkv_pool_stats now = pool_stats(p);

	cr_assert_eq(memcmp(before, &now, sizeof now), 0, "pool stats changed");
	cr_assert_eq(bkv_pool_check(p), 0);
}

static inline void expect_table(const bkv_pool *p, uint32_t seq, const int32_t *want, uint32_t n)
{
	uint32_t got_n = 0, i;
	const int32_t *got = bkv_seq_blocks(p, seq, &got_n);

	cr_assert_not_null(got);
	cr_assert_eq(got_n, n, "table has %u entries, want %u", got_n, n);
	for (i = 0; i < n; i++)
		cr_assert_eq(got[i], want[i], "entry %u is %d, want %d", i, got[i], want[i]);
}

static inline void expect_len(const bkv_pool *p, uint32_t seq, uint32_t len)
{
	bkv_seq_info info;

	cr_assert_eq(bkv_seq_info_get(p, seq, &info), BKV_OK);
	cr_assert_eq(info.len, len);
}

static inline void expect_counts(const bkv_pool *p, uint32_t nr_free, uint32_t nr_used,
				 uint32_t nr_cached)
{
	bkv_pool_stats s = pool_stats(p);

	cr_assert_eq(s.nr_free, nr_free, "nr_free %u, want %u", s.nr_free, nr_free);
	cr_assert_eq(s.nr_used, nr_used, "nr_used %u, want %u", s.nr_used, nr_used);
	cr_assert_eq(s.nr_cached, nr_cached, "nr_cached %u, want %u", s.nr_cached, nr_cached);
	cr_assert_eq(bkv_pool_check(p), 0);
}

#ifdef BKV_INTERNAL_H
/* Internals: ref counts of blocks 0..n-1, and the LRU from oldest. */
static inline void expect_refs(const bkv_pool *p, const uint32_t *want, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		cr_assert_eq(p->kv.blk[i].ref, want[i], "block %u ref %u, want %u", i,
			     p->kv.blk[i].ref, want[i]);
}

static inline void expect_lru(const bkv_pool *p, const int32_t *want, uint32_t n)
{
	uint32_t i = 0;
	int32_t b, s;

	for (b = -1, s = p->kv.lru_head; s >= 0; s = bkv__lru_next(&p->kv, s), i++) {
		b = p->kv.lru[s];
		cr_assert_lt(i, n, "LRU longer than %u", n);
		cr_assert_eq(b, want[i], "LRU[%u] is %d, want %d", i, b, want[i]);
	}
	cr_assert_eq(i, n, "LRU has %u blocks, want %u", i, n);
}
#endif

#endif
