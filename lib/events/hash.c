/*
 * hash.c - vLLM's block hashes: what a router computes from a prompt's
 * tokens to find the blocks a replica holds.
 *
 * vLLM's hashes (vllm/v1/core/kv_cache_utils.py hash_block_tokens, with the
 * functions of vllm/utils/hashing.py): digest = SHA-256(serialize((parent
 * digest, tuple(token ids), extra keys))), where the first block's parent is
 * NONE_HASH = SHA-256(serialize(PYTHONHASHSEED string)) and extra keys is None
 * or a tuple: vLLM's generate_block_hash_extra_keys puts the LoRA name in
 * every block's and the request's cache_salt in its first block's only
 * (lora first). Here a named pool key is the LoRA name, and an unnamed
 * nonzero key is a cache_salt, its decimal digits: the salt makes the first
 * digest differ, and every later one chains from it, so blocks of distinct
 * keys never share a digest. serialize is canonical CBOR
 * ("sha256_cbor") or pickle protocol 5 ("sha256"); both are written here
 * byte for byte as cbor2 and CPython's _pickle write them.
 *
 * This file owns SHA-256, both serializers, bkv_vllm_block_hashes (and its
 * _salted form) and bkv_vllm_hash_int; the encoder (events/encoder.c) digests each stored
 * block through bkv__vllm_block_digest. Nothing here reads a pool.
 */
#include "events/vllm.h"

#include <string.h>

/* ---- SHA-256 (FIPS 180-4) ------------------------------------------------ */

typedef struct sha256_ctx {
	uint32_t h[8];     /* chaining state */
	uint64_t n;        /* bytes hashed so far */
	uint8_t buf[64];   /* partial block */
	uint32_t fill;     /* bytes in buf, < 64 */
} sha256_ctx;

static const uint32_t sha_k[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	0xc67178f2,
};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const uint8_t *p)
{
	uint32_t w[64], a, b, c, d, e, f, g, k, t1, t2;
	int i;

	for (i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (i = 16; i < 64; i++) {
		uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);

		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
	for (i = 0; i < 64; i++) {
		t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] +
		     w[i];
		t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
		k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
	}
	h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

static void sha256_init(sha256_ctx *c)
{
	static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
				       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

	memcpy(c->h, iv, sizeof iv);
	c->n = 0;
	c->fill = 0;
}

static void sha256_update(sha256_ctx *c, const uint8_t *p, size_t n)
{
	c->n += n;
	if (c->fill) {
		size_t take = BKV_MIN(n, (size_t)(64 - c->fill));

		memcpy(c->buf + c->fill, p, take);
		c->fill += (uint32_t)take;
		p += take;
		n -= take;
		if (c->fill < 64)
			return;
		sha256_block(c->h, c->buf);
		c->fill = 0;
	}
	for (; n >= 64; p += 64, n -= 64)
		sha256_block(c->h, p);
	memcpy(c->buf, p, n);
	c->fill = (uint32_t)n;
}

static void sha256_final(sha256_ctx *c, uint8_t out[32])
{
	uint64_t bits = c->n * 8;
	uint8_t pad[72] = {0x80};
	size_t npad = (c->fill < 56 ? 56 : 120) - c->fill;
	int i;

	for (i = 0; i < 8; i++)
		pad[npad + i] = (uint8_t)(bits >> (56 - 8 * i));
	sha256_update(c, pad, npad + 8);
	for (i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(c->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)c->h[i];
	}
}

/* ---- vLLM's hash input: canonical CBOR and pickle ------------------------- */

/* CBOR head: major type and argument in the shortest form (RFC 8949 4.2.1). */
static void cbor_head(bkv__wbuf *w, uint8_t major, uint64_t v)
{
	uint8_t m = (uint8_t)(major << 5);

	if (v < 24)
		bkv__wb_byte(w, (uint8_t)(m | v));
	else if (v < 256)
		bkv__wb_byte(w, m | 24), bkv__wb_be(w, v, 1);
	else if (v < 65536)
		bkv__wb_byte(w, m | 25), bkv__wb_be(w, v, 2);
	else if (v <= 0xffffffffu)
		bkv__wb_byte(w, m | 26), bkv__wb_be(w, v, 4);
	else
		bkv__wb_byte(w, m | 27), bkv__wb_be(w, v, 8);
}

static void cbor_text(bkv__wbuf *w, const char *s)
{
	size_t n = strlen(s);

	cbor_head(w, 3, n);
	bkv__wb_put(w, s, n);
}

/* (parent, tuple(tokens), extra) with extra None, or the tuple of name and
 * salt, each there when not NULL. */
static void cbor_block(bkv__wbuf *w, const uint8_t *parent, const int32_t *tok, uint32_t n,
		       const char *name, const char *salt)
{
	uint32_t i;

	cbor_head(w, 4, 3);
	cbor_head(w, 2, BKV_VLLM_DIGEST_BYTES);
	bkv__wb_put(w, parent, BKV_VLLM_DIGEST_BYTES);
	cbor_head(w, 4, n);
	for (i = 0; i < n; i++) {
		if (tok[i] >= 0)
			cbor_head(w, 0, (uint64_t)tok[i]);
		else
			cbor_head(w, 1, (uint64_t)(-1 - (int64_t)tok[i]));
	}
	if (name || salt) {
		cbor_head(w, 4, (uint64_t)(name != NULL) + (salt != NULL));
		if (name)
			cbor_text(w, name);
		if (salt)
			cbor_text(w, salt);
	} else {
		bkv__wb_byte(w, 0xf6); /* null */
	}
}

/* Pickle protocol 5 as CPython's C pickler frames it: after PROTO, opcodes go
 * into frames; before each object is saved, a frame of 64 KiB or more is
 * closed; a closed frame of fewer than 4 bytes loses its FRAME header. */
#define PK_FRAME_TARGET 65536
#define PK_FRAME_MIN 4

typedef struct pickler {
	bkv__wbuf *w;        /* output */
	size_t start;   /* offset of the open frame's 9-byte header; SIZE_MAX
			   when no frame is open */
} pickler;

static void pk_commit(pickler *k)
{
	bkv__wbuf *w = k->w;
	size_t len;

	if (k->start == SIZE_MAX || w->oom)
		return;
	len = w->n - k->start - 9;
	if (len >= PK_FRAME_MIN) {
		int i;

		w->p[k->start] = 0x95; /* FRAME */
		for (i = 0; i < 8; i++)
			w->p[k->start + 1 + (size_t)i] = (uint8_t)((uint64_t)len >> (8 * i));
	} else {
		memmove(w->p + k->start, w->p + k->start + 9, len);
		w->n -= 9;
	}
	k->start = SIZE_MAX;
}

/* Before an opcode's bytes: open a frame if none is open. */
static void pk_open(pickler *k)
{
	static const uint8_t hole[9];

	if (k->start == SIZE_MAX) {
		k->start = k->w->n;
		bkv__wb_put(k->w, hole, sizeof hole);
	}
}

/* Before each object: close a full frame. */
static void pk_boundary(pickler *k)
{
	if (k->start != SIZE_MAX && k->w->n - k->start - 9 >= PK_FRAME_TARGET)
		pk_commit(k);
}

static void pk_op(pickler *k, const void *p, size_t n)
{
	pk_open(k);
	bkv__wb_put(k->w, p, n);
}

static void pk_int(pickler *k, int32_t v)
{
	uint8_t b[5];

	pk_boundary(k);
	if (v >= 0 && v <= 0xff) {
		b[0] = 'K', b[1] = (uint8_t)v;
		pk_op(k, b, 2);
	} else if (v >= 0 && v <= 0xffff) {
		b[0] = 'M', b[1] = (uint8_t)v, b[2] = (uint8_t)(v >> 8);
		pk_op(k, b, 3);
	} else {
		uint32_t u = (uint32_t)v;

		b[0] = 'J', b[1] = (uint8_t)u, b[2] = (uint8_t)(u >> 8);
		b[3] = (uint8_t)(u >> 16), b[4] = (uint8_t)(u >> 24);
		pk_op(k, b, 5);
	}
}

static void pk_str(pickler *k, const char *s)
{
	size_t n = strlen(s);
	uint8_t b[9];

	pk_boundary(k);
	if (n < 256) {
		b[0] = 0x8c, b[1] = (uint8_t)n; /* SHORT_BINUNICODE */
		pk_op(k, b, 2);
	} else {
		int i;

		b[0] = 'X'; /* BINUNICODE (a seed or name is < 2^32 bytes) */
		for (i = 0; i < 4; i++)
			b[1 + i] = (uint8_t)((uint64_t)n >> (8 * i));
		pk_op(k, b, 5);
	}
	bkv__wb_put(k->w, s, n);
	pk_op(k, "\x94", 1); /* MEMOIZE */
}

static void pk_begin(pickler *k, bkv__wbuf *w)
{
	k->w = w;
	k->start = SIZE_MAX;
	bkv__wb_put(w, "\x80\x05", 2); /* PROTO 5 */
}

static void pk_end(pickler *k)
{
	pk_op(k, ".", 1); /* STOP */
	pk_commit(k);
}

static void pickle_block(bkv__wbuf *w, const uint8_t *parent, const int32_t *tok, uint32_t n,
			 const char *name, const char *salt)
{
	pickler k;
	uint32_t i;
	uint8_t b[2] = {'C', BKV_VLLM_DIGEST_BYTES}; /* SHORT_BINBYTES */

	pk_begin(&k, w);
	pk_boundary(&k); /* the outer tuple */
	pk_boundary(&k); /* its first item */
	pk_op(&k, b, 2);
	bkv__wb_put(w, parent, BKV_VLLM_DIGEST_BYTES);
	pk_op(&k, "\x94", 1);
	pk_boundary(&k); /* the token tuple */
	if (n == 0) {
		pk_op(&k, ")", 1); /* EMPTY_TUPLE, not memoized */
	} else {
		if (n > 3)
			pk_op(&k, "(", 1); /* MARK */
		for (i = 0; i < n; i++)
			pk_int(&k, tok[i]);
		if (n > 3)
			pk_op(&k, "t", 1); /* TUPLE */
		else
			pk_op(&k, n == 1 ? "\x85" : n == 2 ? "\x86" : "\x87", 1);
		pk_op(&k, "\x94", 1);
	}
	pk_boundary(&k); /* extra keys */
	if (name)
		pk_str(&k, name);
	if (salt)
		pk_str(&k, salt);
	if (name && salt)
		pk_op(&k, "\x86\x94", 2); /* TUPLE2, MEMOIZE */
	else if (name || salt)
		pk_op(&k, "\x85\x94", 2); /* TUPLE1, MEMOIZE */
	else
		pk_op(&k, "N", 1);
	pk_op(&k, "\x87\x94", 2); /* TUPLE3, MEMOIZE */
	pk_end(&k);
}

/* SHA-256 of serialize(seed string): vLLM's NONE_HASH. */
int bkv__vllm_none_hash(uint32_t algo, const char *seed, const bkv_allocator *a, uint8_t out[32])
{
	bkv__wbuf w = {a, NULL, 0, 0, 0};
	sha256_ctx c;

	if (algo == BKV_VLLM_HASH_SHA256_CBOR) {
		cbor_text(&w, seed);
	} else {
		pickler k;

		pk_begin(&k, &w);
		pk_str(&k, seed);
		pk_end(&k);
	}
	if (w.oom) {
		bkv__free(a, w.p, w.cap);
		return -1;
	}
	sha256_init(&c);
	sha256_update(&c, w.p, w.n);
	sha256_final(&c, out);
	bkv__free(a, w.p, w.cap);
	return 0;
}

/* One block's digest; w is scratch (reset here). */
int bkv__vllm_block_digest(uint32_t algo, bkv__wbuf *w, const uint8_t *parent, const int32_t *tok,
			uint32_t n, const char *name, const char *salt, uint8_t out[32])
{
	sha256_ctx c;

	w->n = 0;
	w->oom = 0; /* a failed growth earlier is not this block's */
	if (algo == BKV_VLLM_HASH_SHA256_CBOR)
		cbor_block(w, parent, tok, n, name, salt);
	else
		pickle_block(w, parent, tok, n, name, salt);
	if (w->oom)
		return -1;
	sha256_init(&c);
	sha256_update(&c, w->p, w->n);
	sha256_final(&c, out);
	return 0;
}

uint64_t bkv_vllm_hash_int(const uint8_t *digest)
{
	uint64_t v = 0;
	int i;

	if (!digest)
		return 0;
	for (i = BKV_VLLM_DIGEST_BYTES - 8; i < BKV_VLLM_DIGEST_BYTES; i++)
		v = v << 8 | digest[i];
	return v;
}

int bkv__vllm_seed_ok(const char *s)
{
	return s && strlen(s) <= 255;
}

const char *bkv__vllm_key_salt(uint64_t key, const char *name, char buf[BKV__VLLM_SALT_BYTES])
{
	char rev[BKV__VLLM_SALT_BYTES];
	uint32_t n = 0, i;

	if (name || key == 0)
		return NULL;
	do
		rev[n++] = (char)('0' + key % 10);
	while ((key /= 10) != 0);
	for (i = 0; i < n; i++)
		buf[i] = rev[n - 1 - i];
	buf[n] = 0;
	return buf;
}

uint32_t bkv_vllm_block_hashes(const bkv_vllm_config *cfg, const char *lora_name,
			       uint32_t block_tokens, const int32_t *tokens, uint32_t n,
			       uint8_t *digests)
{
	return bkv_vllm_block_hashes_salted(cfg, lora_name, NULL, block_tokens, tokens, n, digests);
}

uint32_t bkv_vllm_block_hashes_salted(const bkv_vllm_config *cfg, const char *lora_name,
				      const char *cache_salt, uint32_t block_tokens,
				      const int32_t *tokens, uint32_t n, uint8_t *digests)
{
	bkv_allocator a;
	bkv__wbuf w;
	uint8_t parent[32];
	uint32_t nb, i;

	if (!cfg || cfg->size < sizeof *cfg || block_tokens == 0 || !bkv__vllm_seed_ok(cfg->hash_seed) ||
	    (cfg->hash != BKV_VLLM_HASH_SHA256_CBOR && cfg->hash != BKV_VLLM_HASH_SHA256))
		return 0;
	nb = n / block_tokens;
	if (nb == 0)
		return 0;
	if (!tokens || !digests)
		return 0;
	bkv__alloc_init(&a, NULL);
	w = (bkv__wbuf){&a, NULL, 0, 0, 0};
	if (bkv__vllm_none_hash(cfg->hash, cfg->hash_seed, &a, parent)) {
		return 0;
	}
	for (i = 0; i < nb; i++) {
		uint8_t *d = digests + (size_t)i * BKV_VLLM_DIGEST_BYTES;

		if (bkv__vllm_block_digest(cfg->hash, &w, parent, tokens + (size_t)i * block_tokens,
					   block_tokens, lora_name, i == 0 ? cache_salt : NULL, d)) {
			bkv__free(&a, w.p, w.cap);
			return 0;
		}
		memcpy(parent, d, sizeof parent);
	}
	bkv__free(&a, w.p, w.cap);
	return nb;
}
