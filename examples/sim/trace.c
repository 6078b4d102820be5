/*
 * trace.c - the request array under every trace (trace.h): growing it,
 * releasing it, and the allocator every trace function allocates through.
 *
 * A trace is two flat arrays that grow by doubling: the requests, and the
 * Mooncake prefix-block ids they point into (each request holds an offset
 * and a count, never a pointer, so growing hash_ids moves nothing else).
 * The parsers (trace_parse.c) and the workload generators (trace_gen.c) only
 * ever append with trace_push and clean up with trace_free.
 *
 * Allocation goes through trace__malloc, trace__realloc and trace__free
 * (trace_alloc.h): libc's functions unless a test has set a counting
 * allocator to refuse one of them.
 */
#include "trace.h"
#include "trace_alloc.h"

#include <stdlib.h>
#include <string.h>

/* ---- the allocator ------------------------------------------------------- */

static const trace_allocator libc_allocator = {malloc, realloc, free};
static const trace_allocator *allocator = &libc_allocator; /* never NULL */

void trace_set_allocator(const trace_allocator *a)
{
	allocator = a ? a : &libc_allocator;
}

void *trace__malloc(size_t n)
{
	return allocator->malloc_fn(n);
}

void *trace__realloc(void *p, size_t n)
{
	return allocator->realloc_fn(p, n);
}

void trace__free(void *p)
{
	allocator->free_fn(p);
}

/* ---- the request array -------------------------------------------------- */

void trace_free(trace *t)
{
	if (!t)
		return;
	trace__free(t->reqs);
	trace__free(t->hash_ids);
	memset(t, 0, sizeof(*t));
}

int trace_push(trace *t, double arrival_us, uint32_t prompt_len, uint32_t output_len,
	       const uint32_t *hash, uint32_t n_hash)
{
	if (t->n == t->cap) {
		uint32_t cap = t->cap ? t->cap * 2 : 1024;
		if (cap < t->cap)
			return TRACE_ENOMEM;
		trace_req *r = trace__realloc(t->reqs, (size_t)cap * sizeof(*r));
		if (!r)
			return TRACE_ENOMEM;
		t->reqs = r;
		t->cap = cap;
	}
	if (n_hash) {
		if (t->n_hash + n_hash > UINT32_MAX)
			return TRACE_ENOMEM;
		if (t->n_hash + n_hash > t->hash_cap) {
			size_t cap = t->hash_cap ? t->hash_cap * 2 : 4096;
			while (cap < t->n_hash + n_hash)
				cap *= 2;
			uint32_t *h = trace__realloc(t->hash_ids, cap * sizeof(*h));
			if (!h)
				return TRACE_ENOMEM;
			t->hash_ids = h;
			t->hash_cap = cap;
		}
		memcpy(t->hash_ids + t->n_hash, hash, n_hash * sizeof(*hash));
	}
	trace_req *q = &t->reqs[t->n++];
	q->arrival_us = arrival_us;
	q->prompt_len = prompt_len;
	q->output_len = output_len ? output_len : 1;
	q->hash_off = (uint32_t)t->n_hash;
	q->n_hash = n_hash;
	q->ref_ttft_ms = -1.0;
	q->ref_tpot_ms = -1.0;
	t->n_hash += n_hash;
	return TRACE_OK;
}
