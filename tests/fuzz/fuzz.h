/*
 * fuzz.h - what the three fuzz harnesses share: a byte reader that turns a
 * fuzzer's input into decisions, a counting allocator that can fail, and the
 * replay main that lets every harness build with any C compiler.
 *
 * A harness defines LLVMFuzzerTestOneInput(data, size). Built with clang and
 * -fsanitize=fuzzer (BKV_LIBFUZZER defined by meson), libFuzzer supplies main
 * and drives it. Built otherwise, the main below replays inputs:
 *
 *   fuzz_pool FILE|DIR...            run each file (each file in each DIR)
 *   fuzz_pool -r N -s SEED DIR...    also run N inputs made by mutating the
 *                                    corpus files with a fixed-seed PRNG
 *
 * so a plain gcc build (and CI without clang) still exercises every corpus
 * input and a reproducible stream of mutants. A harness reports a broken
 * invariant with FZ_FAIL, which prints and abort()s: libFuzzer saves the
 * input as a crash file, the replay exits non-zero.
 *
 * Header-only (static functions). The replay main is in fuzz_main.h, which
 * each harness includes last; tests include this header for the allocator.
 */
#ifndef BKV_FUZZ_H
#define BKV_FUZZ_H

#include "batchkv.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_FAIL(...)                                                           \
	do {                                                                   \
		fprintf(stderr, "fuzz invariant broken at %s:%d: ", __FILE__,  \
			__LINE__);                                             \
		fprintf(stderr, __VA_ARGS__);                                  \
		fputc('\n', stderr);                                           \
		abort();                                                       \
	} while (0)

#define FZ_CHECK(cond, ...)                                                    \
	do {                                                                   \
		if (!(cond))                                                   \
			FZ_FAIL(__VA_ARGS__);                                  \
	} while (0)

/* ---- the byte reader ------------------------------------------------------
 * Reads past the end give zeros, so every input is a complete program. */
typedef struct fz {
	const uint8_t *p; /* the input */
	size_t n;         /* its length */
	size_t i;         /* next byte to read */
} fz;

static inline int fz_more(const fz *f)
{
	return f->i < f->n;
}

static inline uint8_t fz_u8(fz *f)
{
	return f->i < f->n ? f->p[f->i++] : 0;
}

static inline uint16_t fz_u16(fz *f)
{
	uint16_t v = fz_u8(f);

	return (uint16_t)(v | (uint16_t)fz_u8(f) << 8);
}

static inline uint32_t fz_u32(fz *f)
{
	uint32_t v = fz_u16(f);

	return v | (uint32_t)fz_u16(f) << 16;
}

/* A value in [0, n) (n > 0). */
static inline uint32_t fz_below(fz *f, uint32_t n)
{
	return (n <= 256 ? fz_u8(f) : fz_u32(f)) % n;
}

/* ---- a counting allocator that fails on request ---------------------------
 * fail_at = k > 0: the k-th alloc/realloc call fails (once, or every call from
 * k on when sticky). live_bytes must be 0 after every handle is destroyed. */
typedef struct fz_mem {
	uint64_t calls;     /* alloc + realloc calls so far */
	uint64_t fail_at;   /* 1-based call that fails; 0 = none */
	int sticky;         /* nonzero: every call from fail_at on fails */
	uint64_t failures;  /* calls refused */
	int64_t live_bytes; /* allocated minus freed, by the sizes passed back */
	int64_t live_blocks; /* allocations not freed */
} fz_mem;

static inline int fz_mem_refuse(fz_mem *m)
{
	m->calls++;
	if (m->fail_at && (m->calls == m->fail_at || (m->sticky && m->calls > m->fail_at))) {
		m->failures++;
		return 1;
	}
	return 0;
}

static inline void *fz_alloc(void *ud, size_t size)
{
	fz_mem *m = ud;
	void *p;

	FZ_CHECK(size > 0, "alloc of 0 bytes");
	if (fz_mem_refuse(m))
		return NULL;
	p = malloc(size);
	if (p) {
		m->live_bytes += (int64_t)size;
		m->live_blocks++;
	}
	return p;
}

static inline void *fz_realloc(void *ud, void *p, size_t old_size, size_t size)
{
	fz_mem *m = ud;
	void *q;

	FZ_CHECK(size > 0 && old_size > 0 && p, "realloc(%p, %zu, %zu)", p, old_size, size);
	if (fz_mem_refuse(m))
		return NULL;
	q = realloc(p, size);
	if (q)
		m->live_bytes += (int64_t)size - (int64_t)old_size;
	return q;
}

static inline void fz_free(void *ud, void *p, size_t size)
{
	fz_mem *m = ud;

	if (!p)
		return;
	FZ_CHECK(size > 0, "free of %p with size 0", p);
	m->live_bytes -= (int64_t)size;
	m->live_blocks--;
	free(p);
}

static inline bkv_allocator fz_allocator(fz_mem *m)
{
	bkv_allocator a = {fz_alloc, fz_realloc, fz_free, m};

	return a;
}

#endif /* BKV_FUZZ_H */
