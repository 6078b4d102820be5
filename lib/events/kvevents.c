/*
 * kvevents.c - a pool's KV events in vLLM's wire format, and vLLM's block
 * hashes.
 *
 * A router built for vLLM learns what each replica caches from a stream of
 * msgpack KVEventBatch messages and finds a prompt's blocks by hashing its
 * tokens the way vLLM does. This file makes a pool look like such a replica.
 * It reads the pool (lib/internal.h) and changes nothing in it: the pool's
 * own events (prefix.c writes them, bkv_pool_drain_events drains them) say which
 * block entered or left the index, and the token store says what the block
 * holds.
 *
 *   pool event ring --drain--> translate --> vLLM events --> msgpack batch
 *                                 |  ^
 *              pool->kv.blk, pool->kv.tok  |  per-block published hash (dig, nat)
 *
 * Translation keeps, per device block, the hash it was published under and
 * the pool hash it had then (nat), so a REMOVED event names the same hash its
 * STORED event did, and a child's parent digest is at hand. A STORED event is
 * translated only if its block is still indexed under the same pool hash when
 * the ring is drained: otherwise the block left the index (and may hold other
 * tokens) before anyone read the event, so both its store and its removal are
 * left out, which replays to the same set. A block is indexed only while its
 * parent is, and a parent's last STORED event comes before its children's, so
 * every parent digest a translation needs was computed earlier in the stream.
 *
 * A gap in the pool's seq (its ring overflowed) cannot be repaired from the
 * events, so the batch becomes a snapshot: AllBlocksCleared, then every
 * indexed block, parents first, chains grouped as BlockStored events.
 *
 * vLLM's hashes (vllm/v1/core/kv_cache_utils.py hash_block_tokens, with the
 * functions of vllm/utils/hashing.py): digest = SHA-256(serialize((parent
 * digest, tuple(token ids), extra keys))), where the first block's parent is
 * NONE_HASH = SHA-256(serialize(PYTHONHASHSEED string)) and extra keys is None
 * or a tuple (here: the LoRA name). serialize is canonical CBOR
 * ("sha256_cbor") or pickle protocol 5 ("sha256"); both are written here
 * byte for byte as cbor2 and CPython's _pickle write them. msgpack is written
 * as msgspec writes it: the shortest form of every integer, string, array and
 * map header, floats as float64.
 */
#include "pool/pool.h"

#include <stdlib.h>
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

/* ---- a growable byte buffer ---------------------------------------------- */

typedef struct wbuf {
	const bkv_allocator *a; /* the owner's allocator */
	uint8_t *p;             /* [cap] bytes, [0, n) written */
	size_t n;               /* bytes written */
	size_t cap;             /* bytes allocated */
	int oom;                /* a growth failed: the content is cut short */
} wbuf;

static int wb_reserve(wbuf *w, size_t more)
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

static void wb_put(wbuf *w, const void *p, size_t n)
{
	if (n && wb_reserve(w, n) == 0) {
		memcpy(w->p + w->n, p, n);
		w->n += n;
	}
}

static void wb_byte(wbuf *w, uint8_t b)
{
	wb_put(w, &b, 1);
}

/* Big-endian n-byte integer. */
static void wb_be(wbuf *w, uint64_t v, int n)
{
	uint8_t b[8];
	int i;

	for (i = 0; i < n; i++)
		b[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
	wb_put(w, b, (size_t)n);
}


/* ---- msgpack, as msgspec writes it ---------------------------------------- */

static void mp_uint(wbuf *w, uint64_t v)
{
	if (v < 128)
		wb_byte(w, (uint8_t)v);
	else if (v < 256)
		wb_byte(w, 0xcc), wb_be(w, v, 1);
	else if (v < 65536)
		wb_byte(w, 0xcd), wb_be(w, v, 2);
	else if (v <= 0xffffffffu)
		wb_byte(w, 0xce), wb_be(w, v, 4);
	else
		wb_byte(w, 0xcf), wb_be(w, v, 8);
}

static void mp_int(wbuf *w, int64_t v)
{
	if (v >= 0)
		mp_uint(w, (uint64_t)v);
	else if (v >= -32)
		wb_byte(w, (uint8_t)(0xe0 | (v + 32)));
	else if (v >= -128)
		wb_byte(w, 0xd0), wb_be(w, (uint64_t)v, 1);
	else if (v >= -32768)
		wb_byte(w, 0xd1), wb_be(w, (uint64_t)v, 2);
	else if (v >= INT32_MIN)
		wb_byte(w, 0xd2), wb_be(w, (uint64_t)v, 4);
	else
		wb_byte(w, 0xd3), wb_be(w, (uint64_t)v, 8);
}

static void mp_nil(wbuf *w)
{
	wb_byte(w, 0xc0);
}

static void mp_f64(wbuf *w, double d)
{
	uint64_t u;

	memcpy(&u, &d, sizeof u);
	wb_byte(w, 0xcb);
	wb_be(w, u, 8);
}

static void mp_str(wbuf *w, const char *s)
{
	size_t n = strlen(s);

	if (n < 32)
		wb_byte(w, (uint8_t)(0xa0 | n));
	else if (n < 256)
		wb_byte(w, 0xd9), wb_be(w, n, 1);
	else if (n < 65536)
		wb_byte(w, 0xda), wb_be(w, n, 2);
	else
		wb_byte(w, 0xdb), wb_be(w, n, 4);
	wb_put(w, s, n);
}

static void mp_bin(wbuf *w, const uint8_t *p, size_t n)
{
	if (n < 256)
		wb_byte(w, 0xc4), wb_be(w, n, 1);
	else if (n < 65536)
		wb_byte(w, 0xc5), wb_be(w, n, 2);
	else
		wb_byte(w, 0xc6), wb_be(w, n, 4);
	wb_put(w, p, n);
}

/* An array or map header of n entries: the fix form (fix | n) below 16, else
 * the 16-bit form (tag16) or the 32-bit one (tag16 + 1). */
static void mp_container(wbuf *w, size_t n, uint8_t fix, uint8_t tag16)
{
	if (n < 16)
		wb_byte(w, (uint8_t)(fix | n));
	else if (n < 65536)
		wb_byte(w, tag16), wb_be(w, n, 2);
	else
		wb_byte(w, (uint8_t)(tag16 + 1)), wb_be(w, n, 4);
}

static void mp_array(wbuf *w, size_t n)
{
	mp_container(w, n, 0x90, 0xdc);
}

static void mp_map(wbuf *w, size_t n)
{
	mp_container(w, n, 0x80, 0xde);
}

/* ---- vLLM's hash input: canonical CBOR and pickle ------------------------- */

/* CBOR head: major type and argument in the shortest form (RFC 8949 4.2.1). */
static void cbor_head(wbuf *w, uint8_t major, uint64_t v)
{
	uint8_t m = (uint8_t)(major << 5);

	if (v < 24)
		wb_byte(w, (uint8_t)(m | v));
	else if (v < 256)
		wb_byte(w, m | 24), wb_be(w, v, 1);
	else if (v < 65536)
		wb_byte(w, m | 25), wb_be(w, v, 2);
	else if (v <= 0xffffffffu)
		wb_byte(w, m | 26), wb_be(w, v, 4);
	else
		wb_byte(w, m | 27), wb_be(w, v, 8);
}

static void cbor_text(wbuf *w, const char *s)
{
	size_t n = strlen(s);

	cbor_head(w, 3, n);
	wb_put(w, s, n);
}

/* (parent, tuple(tokens), extra) with extra None or (name,). */
static void cbor_block(wbuf *w, const uint8_t *parent, const int32_t *tok, uint32_t n,
		       const char *name)
{
	uint32_t i;

	cbor_head(w, 4, 3);
	cbor_head(w, 2, BKV_VLLM_DIGEST_BYTES);
	wb_put(w, parent, BKV_VLLM_DIGEST_BYTES);
	cbor_head(w, 4, n);
	for (i = 0; i < n; i++) {
		if (tok[i] >= 0)
			cbor_head(w, 0, (uint64_t)tok[i]);
		else
			cbor_head(w, 1, (uint64_t)(-1 - (int64_t)tok[i]));
	}
	if (name) {
		cbor_head(w, 4, 1);
		cbor_text(w, name);
	} else {
		wb_byte(w, 0xf6); /* null */
	}
}

/* Pickle protocol 5 as CPython's C pickler frames it: after PROTO, opcodes go
 * into frames; before each object is saved, a frame of 64 KiB or more is
 * closed; a closed frame of fewer than 4 bytes loses its FRAME header. */
#define PK_FRAME_TARGET 65536
#define PK_FRAME_MIN 4

typedef struct pickler {
	wbuf *w;        /* output */
	size_t start;   /* offset of the open frame's 9-byte header; SIZE_MAX
			   when no frame is open */
} pickler;

static void pk_commit(pickler *k)
{
	wbuf *w = k->w;
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
		wb_put(k->w, hole, sizeof hole);
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
	wb_put(k->w, p, n);
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
	wb_put(k->w, s, n);
	pk_op(k, "\x94", 1); /* MEMOIZE */
}

static void pk_begin(pickler *k, wbuf *w)
{
	k->w = w;
	k->start = SIZE_MAX;
	wb_put(w, "\x80\x05", 2); /* PROTO 5 */
}

static void pk_end(pickler *k)
{
	pk_op(k, ".", 1); /* STOP */
	pk_commit(k);
}

static void pickle_block(wbuf *w, const uint8_t *parent, const int32_t *tok, uint32_t n,
			 const char *name)
{
	pickler k;
	uint32_t i;
	uint8_t b[2] = {'C', BKV_VLLM_DIGEST_BYTES}; /* SHORT_BINBYTES */

	pk_begin(&k, w);
	pk_boundary(&k); /* the outer tuple */
	pk_boundary(&k); /* its first item */
	pk_op(&k, b, 2);
	wb_put(w, parent, BKV_VLLM_DIGEST_BYTES);
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
	if (name) {
		pk_str(&k, name);
		pk_op(&k, "\x85\x94", 2); /* TUPLE1, MEMOIZE */
	} else {
		pk_op(&k, "N", 1);
	}
	pk_op(&k, "\x87\x94", 2); /* TUPLE3, MEMOIZE */
	pk_end(&k);
}

/* SHA-256 of serialize(seed string): vLLM's NONE_HASH. */
static int none_hash(uint32_t algo, const char *seed, const bkv_allocator *a, uint8_t out[32])
{
	wbuf w = {a, NULL, 0, 0, 0};
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
static int block_digest(uint32_t algo, wbuf *w, const uint8_t *parent, const int32_t *tok,
			uint32_t n, const char *name, uint8_t out[32])
{
	sha256_ctx c;

	w->n = 0;
	w->oom = 0; /* a failed growth earlier is not this block's */
	if (algo == BKV_VLLM_HASH_SHA256_CBOR)
		cbor_block(w, parent, tok, n, name);
	else
		pickle_block(w, parent, tok, n, name);
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

static int seed_ok(const char *s)
{
	return s && strlen(s) <= 255;
}

uint32_t bkv_vllm_block_hashes(const bkv_vllm_config *cfg, const char *lora_name,
			       uint32_t block_tokens, const int32_t *tokens, uint32_t n,
			       uint8_t *digests)
{
	bkv_allocator a;
	wbuf w;
	uint8_t parent[32];
	uint32_t nb, i;

	if (!cfg || cfg->size < sizeof *cfg || block_tokens == 0 || !seed_ok(cfg->hash_seed) ||
	    (cfg->hash != BKV_VLLM_HASH_SHA256_CBOR && cfg->hash != BKV_VLLM_HASH_SHA256))
		return 0;
	nb = n / block_tokens;
	if (nb == 0)
		return 0;
	if (!tokens || !digests)
		return 0;
	bkv__alloc_init(&a, NULL);
	w = (wbuf){&a, NULL, 0, 0, 0};
	if (none_hash(cfg->hash, cfg->hash_seed, &a, parent)) {
		return 0;
	}
	for (i = 0; i < nb; i++) {
		uint8_t *d = digests + (size_t)i * BKV_VLLM_DIGEST_BYTES;

		if (block_digest(cfg->hash, &w, parent, tokens + (size_t)i * block_tokens,
				 block_tokens, lora_name, d)) {
			bkv__free(&a, w.p, w.cap);
			return 0;
		}
		memcpy(parent, d, sizeof parent);
	}
	bkv__free(&a, w.p, w.cap);
	return nb;
}

/* ---- the encoder ----------------------------------------------------------- */

#define EV_CHUNK 256 /* pool events drained per bkv_pool_drain_events call */

struct bkv_vllm_encoder {
	bkv_allocator alloc;  /* copied at create; all memory below */
	bkv_vllm_config cfg;  /* copied; strings point into the copies below */
	char seed[256];       /* cfg.hash_seed copied */
	char *medium;         /* cfg.medium copied, or NULL */
	char *spec_kind;      /* cfg.spec_kind copied, or NULL */
	const bkv_pool *pool; /* the pool it drains; not owned */
	uint32_t nb;          /* pool device blocks */
	uint32_t bt;          /* pool block_tokens */
	uint8_t none[32];     /* NONE_HASH: the first block's parent digest */
	uint8_t (*dig)[32];   /* [nb] each block's published digest (NATIVE: its
				 pool hash, big-endian in the last 8 bytes);
				 meaningful while valid[b] */
	uint64_t *nat;        /* [nb] the pool hash the block had when dig was
				 computed: dig[b] stands for nat[b] */
	uint8_t *valid;       /* [nb] dig[b]/nat[b] describe a block that is
				 published as stored (1) or not (0) */
	int32_t *path;        /* [nb] snapshot scratch: a chain walked up */
	int32_t *group;       /* [nb] the open BlockStored's blocks, a chain */
	uint32_t n_group;     /* blocks in group */
	uint64_t group_key;   /* their key */
	uint64_t last_seq;    /* the last pool event seq taken */
	uint64_t resyncs;     /* snapshots written */
	int need_resync;      /* the next encode must write a snapshot */
	uint32_t n_events;    /* vLLM events in body */
	wbuf body;            /* the events of the batch being written */
	wbuf msg;             /* the whole batch (what encode returns) */
	wbuf scratch;         /* one block's hash input */
	bkv_kv_event ev[EV_CHUNK]; /* drain buffer */
};

void bkv_vllm_config_init(bkv_vllm_config *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof *cfg);
	cfg->size = sizeof *cfg;
	cfg->wire = BKV_VLLM_WIRE_MAP;
	cfg->hash = BKV_VLLM_HASH_SHA256_CBOR;
	cfg->int_hashes = 1;
	cfg->hash_seed = "0";
	cfg->medium = "GPU";
	cfg->data_parallel_rank = -1;
	cfg->group_idx = -1;
}

static char *dup_str(const bkv_allocator *a, const char *s)
{
	size_t n;
	char *d;

	if (!s)
		return NULL;
	n = strlen(s) + 1;
	d = bkv__malloc(a, n);
	if (d)
		memcpy(d, s, n);
	return d;
}

static void free_str(const bkv_allocator *a, char *s)
{
	if (s)
		bkv__free(a, s, strlen(s) + 1);
}

void bkv_vllm_encoder_destroy(bkv_vllm_encoder *enc)
{
	bkv_allocator a;
	size_t nb;

	if (!enc)
		return;
	a = enc->alloc;
	nb = enc->nb;
	free_str(&a, enc->medium);
	free_str(&a, enc->spec_kind);
	bkv__free(&a, enc->dig, nb * 32);
	bkv__free(&a, enc->nat, nb * sizeof(uint64_t));
	bkv__free(&a, enc->valid, nb);
	bkv__free(&a, enc->path, nb * sizeof(int32_t));
	bkv__free(&a, enc->group, nb * sizeof(int32_t));
	bkv__free(&a, enc->body.p, enc->body.cap);
	bkv__free(&a, enc->msg.p, enc->msg.cap);
	bkv__free(&a, enc->scratch.p, enc->scratch.cap);
	bkv__free(&a, enc, sizeof *enc);
}

int bkv_vllm_encoder_create(const bkv_vllm_config *cfg, const bkv_pool *pool,
			    const bkv_allocator *alloc, bkv_vllm_encoder **out)
{
	bkv_allocator a;
	bkv_vllm_encoder *e;
	size_t nb;

	if (!cfg || !pool || !out || cfg->size < sizeof *cfg)
		return BKV_EINVAL;
	if (cfg->wire > BKV_VLLM_WIRE_ARRAY_V0 || cfg->hash > BKV_VLLM_HASH_SHA256 ||
	    !seed_ok(cfg->hash_seed) || !pool->kv.ev || cfg->data_parallel_rank < -1 ||
	    cfg->group_idx < -1)
		return BKV_EINVAL;
	bkv__alloc_init(&a, alloc);
	e = bkv__calloc(&a, 1, sizeof *e);
	if (!e)
		return BKV_ENOMEM;
	e->alloc = a;
	e->cfg = *cfg;
	e->pool = pool;
	e->nb = pool->kv.nb;
	e->bt = pool->kv.bt;
	nb = e->nb;
	strcpy(e->seed, cfg->hash_seed);
	e->cfg.hash_seed = e->seed;
	e->body.a = e->msg.a = e->scratch.a = &e->alloc;
	e->medium = dup_str(&e->alloc, cfg->medium);
	e->spec_kind = dup_str(&e->alloc, cfg->spec_kind);
	e->cfg.medium = e->medium;
	e->cfg.spec_kind = e->spec_kind;
	e->dig = bkv__calloc(&e->alloc, nb, 32);
	e->nat = bkv__calloc(&e->alloc, nb, sizeof(uint64_t));
	e->valid = bkv__calloc(&e->alloc, nb, 1);
	e->path = bkv__calloc(&e->alloc, nb, sizeof(int32_t));
	e->group = bkv__calloc(&e->alloc, nb, sizeof(int32_t));
	if ((cfg->medium && !e->medium) || (cfg->spec_kind && !e->spec_kind) || !e->dig ||
	    !e->nat || !e->valid || !e->path || !e->group ||
	    (cfg->hash != BKV_VLLM_HASH_NATIVE &&
	     none_hash(cfg->hash, e->seed, &e->alloc, e->none))) {
		bkv_vllm_encoder_destroy(e);
		return BKV_ENOMEM;
	}
	/* Events the pool emitted before the encoder existed were never seen:
	 * unless there were none, the first batch is a snapshot. */
	e->last_seq = 0;
	e->need_resync = pool->kv.ev_seq != 0;
	*out = e;
	return BKV_OK;
}

uint64_t bkv_vllm_encoder_resyncs(const bkv_vllm_encoder *enc)
{
	return enc ? enc->resyncs : 0;
}

/* A published hash: an int (NATIVE, ARRAY_V0, int_hashes) or 32 bytes. */
static void put_hash(bkv_vllm_encoder *e, wbuf *w, const uint8_t *d)
{
	if (e->cfg.hash == BKV_VLLM_HASH_NATIVE || e->cfg.wire == BKV_VLLM_WIRE_ARRAY_V0 ||
	    e->cfg.int_hashes)
		mp_uint(w, bkv_vllm_hash_int(d));
	else
		mp_bin(w, d, BKV_VLLM_DIGEST_BYTES);
}

static const char *key_name(const bkv_vllm_encoder *e, uint64_t key)
{
	return key && e->cfg.key_name ? e->cfg.key_name(e->cfg.key_name_ud, key) : NULL;
}

/* Compute and record block b's digest from its parent's. -1: the parent has
 * none (only after lost events) or no memory. */
static int publish_digest(bkv_vllm_encoder *e, int32_t b)
{
	const bkv__block *k = &e->pool->kv.blk[b];
	const uint8_t *parent = e->none;

	if (k->parent >= 0) {
		int32_t p = k->parent;

		if (!e->valid[p] || e->nat[p] != e->pool->kv.blk[p].hash)
			return -1;
		parent = e->dig[p];
	}
	if (e->cfg.hash == BKV_VLLM_HASH_NATIVE) {
		memset(e->dig[b], 0, 24);
		for (int i = 0; i < 8; i++)
			e->dig[b][24 + i] = (uint8_t)(k->hash >> (56 - 8 * i));
	} else {
		if (block_digest(e->cfg.hash, &e->scratch, parent,
				 e->pool->kv.tok + (size_t)b * e->bt, e->bt, key_name(e, k->key),
				 e->dig[b]))
			return -1;
	}
	e->nat[b] = k->hash;
	e->valid[b] = 1;
	return 0;
}

/* An event's head: in the map layout a map of n_map fields whose first is
 * the "type" tag, in the array layouts an array of n_array (the tag is its
 * first element); then the event's name. */
static void event_head(bkv_vllm_encoder *e, const char *name, size_t n_map, size_t n_array)
{
	if (e->cfg.wire == BKV_VLLM_WIRE_MAP) {
		mp_map(&e->body, n_map);
		mp_str(&e->body, "type");
	} else {
		mp_array(&e->body, n_array);
	}
	mp_str(&e->body, name);
}

/* Write the open BlockStored (the chain in group) into body. */
static void flush_group(bkv_vllm_encoder *e)
{
	const bkv_pool *pool = e->pool;
	wbuf *w = &e->body;
	uint32_t i, j, n = e->n_group;
	int32_t first, parent;
	const char *name;
	int map = e->cfg.wire == BKV_VLLM_WIRE_MAP;

	if (n == 0)
		return;
	first = e->group[0];
	parent = pool->kv.blk[first].parent;
	name = key_name(e, e->group_key);
	event_head(e, "BlockStored",
		   8 + (e->cfg.extra_keys != 0) + (e->cfg.group_idx >= 0) +
			   (e->cfg.spec_kind != NULL) + (e->cfg.sliding_window != 0),
		   e->cfg.wire == BKV_VLLM_WIRE_ARRAY ? 8 : 6);
	if (map)
		mp_str(w, "block_hashes");
	mp_array(w, n);
	for (i = 0; i < n; i++)
		put_hash(e, w, e->dig[e->group[i]]);
	if (map)
		mp_str(w, "parent_block_hash");
	if (parent >= 0)
		put_hash(e, w, e->dig[parent]);
	else
		mp_nil(w);
	if (map)
		mp_str(w, "token_ids");
	mp_array(w, (size_t)n * e->bt);
	for (i = 0; i < n; i++) {
		const int32_t *t = pool->kv.tok + (size_t)e->group[i] * e->bt;

		for (j = 0; j < e->bt; j++)
			mp_int(w, t[j]);
	}
	if (map)
		mp_str(w, "block_size");
	mp_uint(w, e->bt);
	if (map)
		mp_str(w, "lora_id");
	if (e->group_key)
		mp_uint(w, e->group_key);
	else
		mp_nil(w);
	if (e->cfg.wire != BKV_VLLM_WIRE_ARRAY_V0) {
		if (map)
			mp_str(w, "medium");
		if (e->cfg.medium)
			mp_str(w, e->cfg.medium);
		else
			mp_nil(w);
		if (map)
			mp_str(w, "lora_name");
		if (name)
			mp_str(w, name);
		else
			mp_nil(w);
	}
	if (map) {
		if (e->cfg.extra_keys) {
			mp_str(w, "extra_keys");
			mp_array(w, n);
			for (i = 0; i < n; i++) {
				if (name) {
					mp_array(w, 1);
					mp_str(w, name);
				} else {
					mp_nil(w);
				}
			}
		}
		if (e->cfg.group_idx >= 0) {
			mp_str(w, "group_idx");
			mp_uint(w, (uint64_t)e->cfg.group_idx);
		}
		if (e->cfg.spec_kind) {
			mp_str(w, "kv_cache_spec_kind");
			mp_str(w, e->cfg.spec_kind);
		}
		if (e->cfg.sliding_window) {
			mp_str(w, "kv_cache_spec_sliding_window");
			mp_uint(w, e->cfg.sliding_window);
		}
	}
	e->n_events++;
	e->n_group = 0;
}

/* Add stored block b (digest already published) to the open BlockStored, or
 * start a new one when it does not continue the chain. */
static void add_stored(bkv_vllm_encoder *e, int32_t b)
{
	const bkv__block *k = &e->pool->kv.blk[b];

	if (e->n_group &&
	    (k->parent != e->group[e->n_group - 1] || k->key != e->group_key))
		flush_group(e);
	if (e->n_group == 0)
		e->group_key = k->key;
	e->group[e->n_group++] = b;
}

static void put_removed(bkv_vllm_encoder *e, const uint8_t *d)
{
	wbuf *w = &e->body;
	int map = e->cfg.wire == BKV_VLLM_WIRE_MAP;

	flush_group(e);
	event_head(e, "BlockRemoved", 3 + (e->cfg.group_idx >= 0),
		   e->cfg.wire == BKV_VLLM_WIRE_ARRAY ? 3 : 2);
	if (map)
		mp_str(w, "block_hashes");
	mp_array(w, 1);
	put_hash(e, w, d);
	if (e->cfg.wire != BKV_VLLM_WIRE_ARRAY_V0) {
		if (map)
			mp_str(w, "medium");
		if (e->cfg.medium)
			mp_str(w, e->cfg.medium);
		else
			mp_nil(w);
	}
	if (map) {
		if (e->cfg.group_idx >= 0) {
			mp_str(w, "group_idx");
			mp_uint(w, (uint64_t)e->cfg.group_idx);
		}
	}
	e->n_events++;
}

static void put_cleared(bkv_vllm_encoder *e)
{
	flush_group(e);
	event_head(e, "AllBlocksCleared", 1, 1);
	e->n_events++;
}

/* Body := AllBlocksCleared + every indexed block, parents first. */
static int snapshot(bkv_vllm_encoder *e)
{
	const bkv_pool *pool = e->pool;
	uint32_t b;

	e->body.n = 0;
	e->body.oom = 0;
	e->n_events = 0;
	e->n_group = 0;
	memset(e->valid, 0, e->nb);
	put_cleared(e);
	for (b = 0; b < e->nb; b++) {
		uint32_t depth = 0;
		int32_t c = (int32_t)b;

		if (!BLOCK_IS_INDEXED(&pool->kv.blk[b]) || e->valid[b])
			continue;
		while (c >= 0 && !e->valid[c]) {
			BKV_ASSERT(BLOCK_IS_INDEXED(&pool->kv.blk[c]) && depth < e->nb);
			e->path[depth++] = c;
			c = pool->kv.blk[c].parent;
		}
		while (depth-- > 0) {
			if (publish_digest(e, e->path[depth]))
				return -1;
			add_stored(e, e->path[depth]);
		}
	}
	flush_group(e);
	e->resyncs++;
	return e->body.oom ? -1 : 0;
}

/* Translate one drained pool event into body. -1: a snapshot is needed. */
static int translate(bkv_vllm_encoder *e, const bkv_kv_event *ev)
{
	const bkv_pool *pool = e->pool;
	int32_t b = ev->block;

	switch (ev->kind) {
	case BKV_EVENT_STORED:
		if (b < 0 || (uint32_t)b >= e->nb)
			return -1;
		if (!BLOCK_IS_INDEXED(&pool->kv.blk[b]) || pool->kv.blk[b].hash != ev->hash)
			return 0; /* gone before it was read: left out */
		if ((pool->kv.blk[b].parent >= 0) != (ev->has_parent != 0) ||
		    (ev->has_parent && pool->kv.blk[pool->kv.blk[b].parent].hash != ev->parent_hash))
			return -1; /* not the chain the event names */
		if (publish_digest(e, b))
			return -1;
		add_stored(e, b);
		return 0;
	case BKV_EVENT_REMOVED:
		if (b < 0 || (uint32_t)b >= e->nb)
			return -1;
		if (!e->valid[b] || e->nat[b] != ev->hash)
			return 0; /* its store was left out */
		e->valid[b] = 0;
		put_removed(e, e->dig[b]);
		return 0;
	case BKV_EVENT_CLEARED:
		memset(e->valid, 0, e->nb);
		put_cleared(e);
		return 0;
	default:
		return -1;
	}
}

int bkv_vllm_encoder_drain(bkv_vllm_encoder *enc, bkv_pool *pool, double ts, const uint8_t **msg,
		    size_t *len)
{
	bkv_vllm_encoder *e = enc;
	wbuf *m;
	uint32_t n, i;
	int map;

	if (!e || !pool || !msg || !len || pool != e->pool)
		return BKV_EINVAL;
	*msg = NULL;
	*len = 0;
	e->body.n = 0;
	e->body.oom = 0;
	e->n_events = 0;
	e->n_group = 0;
	while ((n = bkv_pool_drain_events(pool, e->ev, EV_CHUNK)) > 0) {
		for (i = 0; i < n; i++) {
			if (e->ev[i].seq != e->last_seq + 1)
				e->need_resync = 1;
			e->last_seq = e->ev[i].seq;
			if (!e->need_resync && translate(e, &e->ev[i]))
				e->need_resync = 1;
		}
	}
	if (pool->kv.ev_seq != e->last_seq) { /* dropped after the last one kept */
		e->need_resync = 1;
		e->last_seq = pool->kv.ev_seq;
	}
	flush_group(e);
	if (e->body.oom)
		e->need_resync = 1;
	if (e->need_resync) {
		if (snapshot(e)) {
			e->need_resync = 1;
			return BKV_ENOMEM;
		}
		e->need_resync = 0;
	}
	if (e->n_events == 0)
		return 0;

	m = &e->msg;
	m->n = 0;
	m->oom = 0;
	map = e->cfg.wire == BKV_VLLM_WIRE_MAP;
	if (map) {
		mp_map(m, 2 + (e->cfg.data_parallel_rank >= 0));
		mp_str(m, "ts");
	} else {
		mp_array(m, 2 + (e->cfg.wire == BKV_VLLM_WIRE_ARRAY &&
				 e->cfg.data_parallel_rank >= 0));
	}
	mp_f64(m, ts);
	if (map)
		mp_str(m, "events");
	mp_array(m, e->n_events);
	wb_put(m, e->body.p, e->body.n);
	if (e->cfg.wire != BKV_VLLM_WIRE_ARRAY_V0 && e->cfg.data_parallel_rank >= 0) {
		if (map)
			mp_str(m, "data_parallel_rank");
		mp_uint(m, (uint64_t)e->cfg.data_parallel_rank);
	}
	if (m->oom) {
		e->need_resync = 1;
		return BKV_ENOMEM;
	}
	*msg = m->p;
	*len = m->n;
	return (int)e->n_events;
}
