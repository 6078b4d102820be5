/*
 * trace_alloc.h - the heap under the trace functions (trace.h), inside the
 * simulator library only, and the seam through which a test or a fuzzer
 * counts or refuses those allocations.
 *
 * Every malloc, realloc and free of trace.c, trace_parse.c and trace_gen.c
 * goes through trace__malloc, trace__realloc and trace__free, which call the
 * allocator set here (libc's until one is set). tests/test_faults.c and
 * tests/fuzz/fuzz_trace.c set a counting allocator to make allocation N fail
 * for every N and to see a leak as an allocation still live after
 * trace_free. bkv-sim never sets one.
 *
 * The allocator is process-wide, not per trace (STYLE.md prefers a hook per
 * handle): trace_distserve_runs and trace_dist_parse take no trace, and the
 * trace struct stays the plain data of trace.h. Set it only while no other
 * thread calls a trace function, and set it back to NULL when done.
 */
#ifndef BKV_SIM_TRACE_ALLOC_H
#define BKV_SIM_TRACE_ALLOC_H

#include <stddef.h>

/* Three functions with libc's contracts (malloc, realloc, free); a refusal
 * returns NULL, and realloc's refusal leaves the old block allocated. */
typedef struct trace_allocator {
	void *(*malloc_fn)(size_t n);            /* as malloc */
	void *(*realloc_fn)(void *p, size_t n);  /* as realloc */
	void (*free_fn)(void *p);                /* as free; NULL is ignored */
} trace_allocator;

/* Route every later allocation of the trace functions through a (not
 * copied: it must outlive its use). NULL restores libc's. Blocks must be
 * freed by the allocator that allocated them: switch only while no trace
 * holds arrays. Not thread-safe. */
void trace_set_allocator(const trace_allocator *a);

/* ---- used by trace*.c -------------------------------------------------- */
void *trace__malloc(size_t n);
void *trace__realloc(void *p, size_t n);
void trace__free(void *p);

#endif /* BKV_SIM_TRACE_ALLOC_H */
