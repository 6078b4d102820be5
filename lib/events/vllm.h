/*
 * vllm.h - what the files of lib/events share: the growable byte buffer
 * they write into, the hashing steps and the msgpack writers the encoder
 * calls.
 *
 * events/hash.c owns vLLM's block hashes (SHA-256 over canonical CBOR or
 * pickle); events/msgpack.c the msgpack writers; events/encoder.c the event
 * encoder (translation, snapshots, batches). Calls go one way: the encoder
 * calls the other two, which call nothing of the encoder. The buffer's
 * writers are inline here: every byte of a hash input and of a batch goes
 * through them.
 */
#ifndef BKV_EVENTS_VLLM_H
#define BKV_EVENTS_VLLM_H

#include "base/base.h"

#include <string.h>

/* ---- a growable byte buffer ----------------------------------------------
 * Written by appending; a growth that fails sets oom and every later write
 * is dropped, so a writer checks oom once, at the end. */
typedef struct bkv__wbuf {
	const bkv_allocator *a; /* the owner's allocator */
	uint8_t *p;             /* [cap] bytes, [0, n) written */
	size_t n;               /* bytes written */
	size_t cap;             /* bytes allocated */
	int oom;                /* a growth failed: the content is cut short */
} bkv__wbuf;

static inline int bkv__wb_reserve(bkv__wbuf *w, size_t more)
{
	size_t cap;
	uint8_t *np;

	if (w->oom)
		return -1;
	if (w->cap - w->n >= more)
		return 0;
	cap = w->cap ? w->cap : 256;
	while (cap - w->n < more) {
		if (cap > SIZE_MAX / 2) {
			w->oom = 1;
			return -1;
		}
		cap *= 2;
	}
	np = w->p ? bkv__realloc(w->a, w->p, w->cap, cap) : bkv__malloc(w->a, cap);
	if (!np) {
		w->oom = 1;
		return -1;
	}
	w->p = np;
	w->cap = cap;
	return 0;
}

static inline void bkv__wb_put(bkv__wbuf *w, const void *p, size_t n)
{
	if (n && bkv__wb_reserve(w, n) == 0) {
		memcpy(w->p + w->n, p, n);
		w->n += n;
	}
}

static inline void bkv__wb_byte(bkv__wbuf *w, uint8_t b)
{
	bkv__wb_put(w, &b, 1);
}

/* Big-endian n-byte integer. */
static inline void bkv__wb_be(bkv__wbuf *w, uint64_t v, int n)
{
	uint8_t b[8];
	int i;

	for (i = 0; i < n; i++)
		b[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
	bkv__wb_put(w, b, (size_t)n);
}

/* ---- events/hash.c: vLLM's block hashes, for the encoder ------------------ */

/* A hash_seed vLLM accepts here: non-NULL, at most 255 bytes. */
int bkv__vllm_seed_ok(const char *s);

/* SHA-256 of serialize(seed string): vLLM's NONE_HASH, the first block's
 * parent digest. algo: BKV_VLLM_HASH_SHA256_CBOR or _SHA256. 0, or -1 when
 * the allocator failed. */
int bkv__vllm_none_hash(uint32_t algo, const char *seed, const bkv_allocator *a,
			uint8_t out[32]);

/* One block's digest: SHA-256(serialize((parent, tuple(tok[0..n)), extra))),
 * extra None, or the tuple of name (a LoRA name, every block's) and salt (a
 * cache_salt, a chain's first block's only), each there when not NULL. w is
 * scratch (reset here, kept grown). 0, or -1 when w could not grow. */
int bkv__vllm_block_digest(uint32_t algo, bkv__wbuf *w, const uint8_t *parent,
			   const int32_t *tok, uint32_t n, const char *name, const char *salt,
			   uint8_t out[32]);

/* Bytes of a key's salt text: 20 decimal digits and a NUL. */
#define BKV__VLLM_SALT_BYTES 21

/* The cache_salt a pool key is hashed with: its decimal digits, written to
 * buf, for a nonzero key without a name; NULL for key 0 or a named key (the
 * name is its extra key instead). */
const char *bkv__vllm_key_salt(uint64_t key, const char *name, char buf[BKV__VLLM_SALT_BYTES]);

/* ---- events/msgpack.c: msgpack as msgspec writes it, for the encoder ------ */

void bkv__mp_uint(bkv__wbuf *w, uint64_t v);
void bkv__mp_int(bkv__wbuf *w, int64_t v);
void bkv__mp_nil(bkv__wbuf *w);
void bkv__mp_f64(bkv__wbuf *w, double d);
void bkv__mp_str(bkv__wbuf *w, const char *s);
void bkv__mp_bin(bkv__wbuf *w, const uint8_t *p, size_t n);
void bkv__mp_array(bkv__wbuf *w, size_t n); /* an array header of n entries */
void bkv__mp_map(bkv__wbuf *w, size_t n);   /* a map header of n pairs */

#endif /* BKV_EVENTS_VLLM_H */
