/*
 * fuzz_pool.c - the block pool driven by arbitrary bytes.
 *
 * The input is read as a program: a pool config (block size, 1 included,
 * tiers, sequence slots, watermark, prefix cache on or off, and which
 * allocation to refuse; a device-blocks byte of 0xFF asks for the 2^31
 * token-slot edge, or one block past it, with every allocation refused),
 * then operations until the bytes run out: open, open keyed, append (tokens
 * drawn from a small alphabet, copied from another sequence so prefix hits
 * happen, or extreme ids), truncate, fork, close, drop, swap out, swap in,
 * clear a copy list, reset the cache, step transactions (begin, commit,
 * abort, as the scheduler brackets a step), the read-only queries, and an
 * export of a sequence that is damaged in a chosen way (len, n_blocks, a
 * capacity, block_tokens, size, key, seed, a token, hash or block id, a NULL
 * array, or a size past the pool) and imported back into the pool.
 *
 * A shadow model keeps, per sequence the harness opened, the tokens it should
 * hold. After every operation the harness checks:
 *   - bkv_pool_check() == 0 (the pool's own walk of every invariant);
 *   - each sequence's length, block count and swapped flag equal the model's,
 *     and (every 8th operation and at the end) every token it holds, read
 *     back through its block table from the pool's token store (device or
 *     host tier), equals the model's;
 *   - a failed call changed nothing: the pool's stats are bytewise equal to
 *     those before it (the header's all-or-nothing rule), and BKV_ENOMEM
 *     happens only when the allocator refused a call;
 *   - an append of n tokens that bkv_seq_blocks_needed() says fits in
 *     bkv_pool_available() blocks does not fail with BKV_ENOSPC;
 *   - an import is refused with exactly the code the header's image rule
 *     gives (image_expect, from the rule alone) and changes nothing, or,
 *     for an image the rule accepts, succeeds (or runs out of sequence
 *     slots, blocks or memory) and then holds the image's tokens, with one
 *     transfer (from the image's block) per block that was not a prefix
 *     hit. The arrays it reads are heap buffers of exactly the capacities
 *     the image claims, so an import that reads past them is an
 *     AddressSanitizer heap-buffer-overflow;
 *   - after destroy, the counting allocator holds no byte.
 * Any violation abort()s (FZ_FAIL), which is what the fuzzer reports.
 */
#include "fuzz.h"
#include "internal.h"

#define MAX_SEQS 12u     /* sequences the model tracks */
#define MAX_LEN 2048u    /* tokens per sequence the model keeps */

typedef struct mseq {
	uint32_t id;      /* pool sequence id; 0 = slot unused */
	uint32_t len;     /* tokens */
	int swapped;      /* on the host tier */
	uint64_t key;     /* prefix-cache key */
	int32_t tok[MAX_LEN];
} mseq;

typedef struct model {
	bkv_pool *pool;
	uint32_t bt;
	uint32_t nb;      /* attention frames (device_blocks less a STATE
			     group's arena) */
	uint32_t ng;      /* groups (0: a plain pool) */
	bkv_kv_group g[3]; /* [ng] the pool's groups: full, then a window or
			     chunk, then maybe a state */
	int state;        /* the last group is STATE */
	int share;        /* its units share the frames (state_share): nb is
			     device_blocks and a unit is any aligned chunk */
	uint32_t k;       /* frames per state unit */
	uint32_t arena;   /* frames of the state arena (0 shared) */
	mseq s[MAX_SEQS];
	int txn;          /* inside bkv__pool_txn_begin */
} model;

/* The first block group g's next token reads (0 for FULL), as
 * bkv_kv_group_blocks_held counts them. */
static uint32_t first_needed(const bkv_kv_group *g, uint32_t bt, uint32_t len)
{
	if (g->kind == BKV_GROUP_WINDOW)
		return len + 1 > g->span ? (len + 1 - g->span) / bt : 0;
	if (g->kind == BKV_GROUP_CHUNKED)
		return len / g->span * g->span / bt;
	return 0;
}

static bkv_pool_stats stats_of(const bkv_pool *p)
{
	bkv_pool_stats st;

	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_pool_stats_get(p, &st);
	return st;
}

/* A grouped pool's further tables and state of sequence s (nb blocks in
 * group 0): each attention group's table is as long as group 0's, holds
 * every block its next token reads (released entries are -1, nothing
 * else is negative), each held block is a device frame whose tokens (when
 * full is set) are the model's, and no table entry of a resident sequence
 * is a frame of the state arena. A resident sequence's state units are
 * arena units, read and written out of place. */
static void check_groups(const model *m, const mseq *s, uint32_t nb, int full)
{
	const bkv_pool *p = m->pool;
	uint32_t g, i, j, n, first;

	for (g = 1; g < m->ng; g++) {
		const int32_t *t;

		if (m->g[g].kind == BKV_GROUP_STATE)
			continue;
		t = bkv_seq_group_blocks(p, s->id, g, &n);
		FZ_CHECK(n == nb && (n == 0 || t), "seq %u group %u: %u entries, group 0 %u",
			 s->id, g, n, nb);
		if (s->swapped)
			continue;
		first = first_needed(&m->g[g], m->bt, s->len);
		for (i = 0; i < n; i++) {
			FZ_CHECK(t[i] >= -1 && t[i] < (int32_t)m->nb,
				 "seq %u group %u block %u is %d", s->id, g, i, t[i]);
			FZ_CHECK(i < first || t[i] >= 0,
				 "seq %u group %u: block %u (first needed %u) released", s->id, g,
				 i, first);
			for (j = i * m->bt; full && t[i] >= 0 && j < s->len && j < (i + 1) * m->bt; j++)
				FZ_CHECK(bkv__tok(&p->kv, (size_t)t[i])[j % m->bt] == s->tok[j],
					 "seq %u group %u token %u is %d, model %d", s->id, g, j,
					 bkv__tok(&p->kv, (size_t)t[i])[j % m->bt], s->tok[j]);
		}
	}
	FZ_CHECK(bkv_seq_group_blocks(p, s->id, m->ng ? m->ng : 1, &n) == NULL && n == 0,
		 "seq %u: a table for group %u of %u", s->id, m->ng ? m->ng : 1, m->ng);
	if (m->state && !s->swapped) {
		int32_t in = -2, out = -2;
		int rc = bkv_seq_state_frames(p, s->id, &in, &out);
		int32_t lo = m->share ? 0 : (int32_t)m->nb, hi = (int32_t)(m->nb + m->arena);

		FZ_CHECK(rc == BKV_OK, "seq %u state_frames: %d", s->id, rc);
		FZ_CHECK(!m->share || ((in < 0 || in % (int32_t)m->k == 0) &&
				       (out < 0 || out % (int32_t)m->k == 0)),
			 "seq %u: shared state frames %d, %d not chunk-aligned", s->id, in, out);
		FZ_CHECK(in == -1 || (in >= lo && in < hi), "seq %u reads state frame %d", s->id, in);
		FZ_CHECK(out == -1 || (out >= lo && out < hi), "seq %u writes state frame %d", s->id,
			 out);
		FZ_CHECK(in < 0 || in != out, "seq %u: state written in place (%d)", s->id, in);
		FZ_CHECK(s->len > 0 || (in == -1 && out == -1), "empty seq %u has a state", s->id);
	}
}

/* Would the window or chunk of s at length n read a block it released? */
static int truncate_needs_released(const model *m, const mseq *s, uint32_t n)
{
	uint32_t nbk = (n + m->bt - 1) / m->bt, g, i, cnt;

	for (g = 1; g < m->ng; g++) {
		const int32_t *t = bkv_seq_group_blocks(m->pool, s->id, g, &cnt);

		if (m->g[g].kind == BKV_GROUP_STATE)
			continue;
		for (i = first_needed(&m->g[g], m->bt, n); i < nbk && i < cnt; i++)
			if (t[i] < 0)
				return 1;
	}
	return 0;
}

/* Every invariant the harness can see, after every operation; the token
 * contents (O(all tokens)) when full is set (every 8th operation, and at the
 * end) to keep the harness fast. */
static void check_all(const model *m, int full)
{
	const bkv_pool *p = m->pool;
	int rc = bkv_pool_check(p);
	uint32_t i, j, nb;

	FZ_CHECK(rc == 0, "bkv_pool_check = %d", rc);
	for (i = 0; i < MAX_SEQS; i++) {
		const mseq *s = &m->s[i];
		const int32_t *table;
		const int32_t *store;
		bkv_seq_info info;

		if (!s->id)
			continue;
		rc = bkv_seq_info_get(p, s->id, &info);
		FZ_CHECK(rc == BKV_OK, "info of open seq %u: %d", s->id, rc);
		FZ_CHECK(info.len == s->len, "seq %u len %u, model %u", s->id, info.len, s->len);
		FZ_CHECK(!!info.swapped == !!s->swapped, "seq %u swapped %d, model %d", s->id,
			 info.swapped, s->swapped);
		FZ_CHECK(info.key == s->key, "seq %u key", s->id);
		table = bkv_seq_blocks(p, s->id, &nb);
		FZ_CHECK(nb == (s->len + m->bt - 1) / m->bt, "seq %u has %u blocks for %u tokens",
			 s->id, nb, s->len);
		FZ_CHECK(nb == 0 || table, "seq %u: NULL table", s->id);
		for (j = 0; full && j < s->len; j++) {
			int32_t b = table[j / m->bt];
			uint32_t lim = s->swapped ? p->nh : p->kv.nb;

			FZ_CHECK(b >= 0 && (uint32_t)b < lim, "seq %u block %d out of range", s->id, b);
			store = s->swapped ? p->host_tok + (size_t)b * m->bt : bkv__tok(&p->kv, b);
			FZ_CHECK(store[j % m->bt] == s->tok[j], "seq %u token %u is %d, model %d",
				 s->id, j, store[j % m->bt], s->tok[j]);
		}
		check_groups(m, s, nb, full);
	}
}

static mseq *free_slot(model *m)
{
	uint32_t i;

	for (i = 0; i < MAX_SEQS; i++)
		if (!m->s[i].id)
			return &m->s[i];
	return NULL;
}

/* Pick a tracked sequence (NULL when none), or sometimes a bogus id. */
static mseq *pick(model *m, fz *f, uint32_t *id)
{
	uint8_t b = fz_u8(f);
	mseq *s = &m->s[b % MAX_SEQS];

	if (b >= 0xF8) { /* an id the pool never gave, or 0 */
		*id = b == 0xFF ? 0 : (uint32_t)b << 20 | 7u;
		return NULL;
	}
	*id = s->id;
	return s->id ? s : NULL;
}

/* Name the first counter two stats differ in (for a failure's message). */
static const char *stats_diff(const bkv_pool_stats *a, const bkv_pool_stats *b)
{
#define SD(f)                                                                          \
	if (a->f != b->f)                                                              \
		return #f;
	SD(nr_free) SD(nr_used) SD(nr_cached) SD(nr_indexed) SD(host_free) SD(host_used)
	SD(nr_seqs) SD(nr_swapped) SD(tokens) SD(waste_slots) SD(hit_tokens) SD(miss_tokens)
	SD(evictions) SD(cow_copies) SD(swap_out_blocks) SD(swap_in_blocks) SD(events)
	SD(events_dropped) SD(dup_blocks) SD(state_units) SD(state_free)
	SD(state_checkpoints) SD(state_frames) SD(state_hits) SD(state_evictions)
#undef SD
	return "another field";
}

/* Call a mutating operation; on failure require that nothing changed and that
 * BKV_ENOMEM came from a refused allocation. */
#define MUTATE(m, mem, call, rc_out)                                                   \
	do {                                                                           \
		bkv_pool_stats before_ = stats_of((m)->pool), after_;                 \
		uint64_t fails_ = (mem)->failures;                                     \
		(rc_out) = (call);                                                     \
		if ((rc_out) != BKV_OK) {                                              \
			after_ = stats_of((m)->pool);                                  \
			FZ_CHECK(!memcmp(&before_, &after_, sizeof(after_)),           \
				 "%s failed with %d and changed the pool (%s)", #call, \
				 (rc_out), stats_diff(&before_, &after_));             \
			FZ_CHECK((rc_out) != BKV_ENOMEM || (mem)->failures > fails_,   \
				 "%s: ENOMEM without a refused allocation", #call);    \
		}                                                                      \
		FZ_CHECK((rc_out) <= 0, "%s returned %d", #call, (rc_out));            \
	} while (0)

/* ---- damaged export images ------------------------------------------------ */

#define IMG_BLOCKS 64u /* export room: more than any fuzzed device_blocks */

/* What bkv_seq_import must answer for an image, from the header's rule alone:
 * BKV_EINVAL, BKV_E2BIG, or BKV_OK (valid; the pool may still lack room). */
static int image_expect(const model *m, const bkv_pool_config *cfg, const bkv_seq_image *im,
			uint64_t layout)
{
	uint32_t bt = cfg->block_tokens, nfull, i;
	uint64_t *h;
	int rc = BKV_OK;

	if (im->size < sizeof(*im) || im->block_tokens != bt || im->len == 0 ||
	    im->n_blocks != ((uint64_t)im->len + bt - 1) / bt)
		return BKV_EINVAL;
	if (im->len > im->cap_tokens || im->n_blocks > im->cap_blocks || !im->tokens ||
	    !im->blocks)
		return BKV_EINVAL;
	if (im->n_blocks > m->nb)
		return BKV_E2BIG;
	for (i = 0; i < im->n_blocks; i++)
		if (im->blocks[i] < 0)
			return BKV_EINVAL;
	if (!m->ng && im->n_groups > 1)
		return BKV_EINVAL;
	if (m->ng) { /* the groups' part of the rule */
		uint32_t first = first_needed(&m->g[1], bt, im->len);
		uint32_t sf = m->state ? bkv_kv_state_frames(m->g, m->ng, bt) : 0;

		if (im->n_groups != m->ng || im->group_layout != layout)
			return BKV_EINVAL;
		if (m->state && (im->state_frames != sf || im->state_frame < 0 ||
				 im->state_frame > INT32_MAX - (int32_t)sf))
			return BKV_EINVAL;
		if (!im->group_blocks)
			return BKV_EINVAL;
		for (i = 0; i < im->n_blocks; i++)
			if (im->group_blocks[i] < -1 || (i >= first && im->group_blocks[i] < 0))
				return BKV_EINVAL;
	}
	if (im->hash_seed != cfg->hash_seed)
		return BKV_OK;
	if (!im->hashes)
		return BKV_EINVAL;
	nfull = im->len / bt;
	h = malloc(((size_t)nfull + 1) * sizeof(*h));
	FZ_CHECK(h, "out of memory in the harness");
	FZ_CHECK(bkv_block_hashes(im->hash_seed, im->key, bt, im->tokens, im->len, h) == nfull,
		 "bkv_block_hashes count");
	for (i = 0; i < nfull && rc == BKV_OK; i++)
		if (im->hashes[i] != h[i])
			rc = BKV_EINVAL;
	if (rc == BKV_OK && im->n_blocks > nfull && im->hashes[nfull] != 0)
		rc = BKV_EINVAL;
	free(h);
	return rc;
}

/* A heap copy of n entries of size sz from src (n_src of them valid; the rest
 * garbage), exactly n entries long so that reading past it is caught. */
static void *exact_copy(const void *src, uint32_t n_src, uint32_t n, size_t sz)
{
	unsigned char *p = malloc(((size_t)n ? n : 1) * sz);

	FZ_CHECK(p, "out of memory in the harness");
	memset(p, 0x5a, ((size_t)n ? n : 1) * sz);
	memcpy(p, src, (size_t)(n_src < n ? n_src : n) * sz);
	return p;
}

/* Export s, damage the image as the input says, import it into the same pool
 * and check the answer against image_expect. */
static void op_import(model *m, fz *f, fz_mem *mem, const bkv_pool_config *cfg)
{
	static int32_t etok[MAX_LEN];
	static int32_t eblk[IMG_BLOCKS];
	static uint64_t ehash[IMG_BLOCKS];
	static int32_t egb[IMG_BLOCKS];
	static bkv_copy x[2 * IMG_BLOCKS + 8];
	bkv_seq_image im, orig;
	uint32_t id, got = 0, nx = 0, cap_t, cap_b, i, want, bt = m->bt;
	uint8_t kind = fz_u8(f) % 16, v = fz_u8(f);
	mseq *s = pick(m, f, &id), *t;
	int rc;

	memset(&im, 0, sizeof(im));
	im.size = sizeof(im);
	im.blocks = eblk;
	im.hashes = ehash;
	im.tokens = etok;
	im.cap_blocks = IMG_BLOCKS;
	im.cap_tokens = MAX_LEN;
	im.group_blocks = m->ng ? egb : NULL;
	rc = bkv_seq_export(m->pool, id, &im);
	if (!s) {
		FZ_CHECK(rc == BKV_ENOENT || rc == BKV_EINVAL, "export of bogus: %d", rc);
		return;
	}
	if (s->swapped) {
		FZ_CHECK(rc == BKV_ESTATE, "export of swapped: %d", rc);
		return;
	}
	if (rc == BKV_ESTATE && m->state && m->txn)
		return; /* a state the open step has not committed */
	FZ_CHECK(rc == BKV_OK, "export: %d", rc);
	FZ_CHECK(im.n_groups == m->ng && (m->ng == 0) == (im.group_layout == 0) &&
			 (m->state ? im.state_frame >= (m->share ? 0 : (int32_t)m->nb) ||
					     (im.state_frame == -1 && s->len == 0)
				   : im.state_frame == -1),
		 "export groups of seq %u: %u groups, state frame %d", id, im.n_groups,
		 im.state_frame);
	FZ_CHECK(im.len == s->len && im.n_blocks == (s->len + bt - 1) / bt &&
			 im.block_tokens == bt && im.key == s->key &&
			 im.hash_seed == cfg->hash_seed,
		 "export header of seq %u", id);
	FZ_CHECK(!memcmp(etok, s->tok, (size_t)s->len * sizeof(int32_t)), "export tokens");
	orig = im;
	cap_t = im.len;
	cap_b = im.n_blocks;
	switch (kind) {
	case 0: /* intact */
		break;
	case 1: /* len past the tokens array, n_blocks kept */
		im.len += 1 + v % (2 * bt);
		break;
	case 2: /* len and n_blocks grown together past both arrays */
		im.len += 1 + v % (4 * bt);
		im.n_blocks = (uint32_t)(((uint64_t)im.len + bt - 1) / bt);
		break;
	case 3: /* the tokens array claims less than len */
		cap_t = im.len ? v % im.len : 0;
		break;
	case 4: /* blocks and hashes claim less than n_blocks */
		cap_b = im.n_blocks ? v % im.n_blocks : 0;
		break;
	case 5: /* n_blocks off */
		if (v & 1)
			im.n_blocks += 1u + v % 3u;
		else
			im.n_blocks -= 1u + v % 3u;
		break;
	case 6: /* another block size */
		im.block_tokens = v & 1 ? bt * 2 : (v & 2 ? 0 : bt + 1);
		break;
	case 7: /* a token changed in transit */
		if (im.len)
			etok[v % im.len] ^= 1 + (v >> 4);
		break;
	case 8: /* a hash changed */
		if (im.n_blocks)
			ehash[v % im.n_blocks] ^= 1u + v;
		break;
	case 9: /* a negative source block id */
		if (im.n_blocks)
			eblk[v % im.n_blocks] = v & 1 ? -1 : INT32_MIN;
		break;
	case 10: /* a short size */
		im.size = v % sizeof(im);
		break;
	case 11: /* a NULL array */
		if (v % 3 == 0)
			im.tokens = NULL;
		else if (v % 3 == 1)
			im.blocks = NULL;
		else
			im.hashes = NULL;
		break;
	case 12: /* another key or seed */
		if (v & 1)
			im.key ^= 1u + (v >> 1);
		else
			im.hash_seed ^= 1u + (v >> 1);
		break;
	case 13: { /* honest arrays, more blocks than the pool has */
		uint64_t len = ((uint64_t)cfg->device_blocks + 1 + v % 3) * bt;

		if (len > (1u << 18))
			break;
		im.len = (uint32_t)len - (v & 1 ? bt - 1 : 0);
		im.n_blocks = (uint32_t)(((uint64_t)im.len + bt - 1) / bt);
		cap_t = im.len;
		cap_b = im.n_blocks;
		break;
	}
	case 14: /* extreme counts that agree with each other */
		im.len = v & 1 ? UINT32_MAX : INT32_MAX;
		im.n_blocks = (uint32_t)(((uint64_t)im.len + bt - 1) / bt);
		break;
	default: /* a nonzero hash on a partial last block, or len 0 */
		if (im.len % bt)
			ehash[im.n_blocks - 1] = 1u + v;
		else
			im.len = 0;
		break;
	}
	if (m->ng && kind == 0 && (v & 0x80)) {
		/* the groups' fields damaged (an intact image otherwise) */
		switch (v % 7) {
		case 0:
			im.group_blocks = NULL;
			break;
		case 1:
			im.n_groups = v & 8 ? 1 : m->ng + 1;
			break;
		case 2:
			im.group_layout ^= 1u + (v >> 3);
			break;
		case 3: /* an entry below -1 */
			if (im.n_blocks)
				egb[v % im.n_blocks] = v & 8 ? -2 : INT32_MIN;
			break;
		case 4: /* a needed block released */
			if (im.n_blocks)
				egb[im.n_blocks - 1] = -1;
			break;
		case 5:
			im.state_frames += 1u + (v & 1);
			break;
		default:
			im.state_frame = v & 8 ? -1 : INT32_MAX;
			break;
		}
	}
	/* the arrays the import may read: exactly the claimed capacities */
	im.cap_tokens = cap_t;
	im.cap_blocks = cap_b;
	if (im.tokens)
		im.tokens = exact_copy(etok, orig.len, cap_t, sizeof(int32_t));
	if (im.blocks)
		im.blocks = exact_copy(eblk, orig.n_blocks, cap_b, sizeof(int32_t));
	if (im.hashes)
		im.hashes = exact_copy(ehash, orig.n_blocks, cap_b, sizeof(uint64_t));
	if (im.group_blocks)
		im.group_blocks = exact_copy(egb, orig.n_blocks, cap_b, sizeof(int32_t));
	want = (uint32_t)-image_expect(m, cfg, &im, orig.group_layout);
	t = free_slot(m);
	MUTATE(m, mem, bkv_seq_import(m->pool, &im, &got, x, &nx), rc);
	if (want != 0) {
		FZ_CHECK(rc == -(int)want, "import of damage %u: %d, the rule says %d", kind, rc,
			 -(int)want);
	} else if (rc != BKV_OK) {
		FZ_CHECK(rc == BKV_EAGAIN || rc == BKV_ENOSPC || rc == BKV_ENOMEM,
			 "import of a valid image (damage %u): %d", kind, rc);
	} else {
		const int32_t *table;
		uint32_t nb, first;

		table = bkv_seq_blocks(m->pool, got, &nb);
		FZ_CHECK(nb == im.n_blocks, "import: %u blocks of %u", nb, im.n_blocks);
		if (!m->ng) {
			FZ_CHECK(nx <= nb, "import: %u blocks, %u transfers", nb, nx);
			first = nb - nx; /* the leading blocks were prefix hits */
			for (i = 0; i < nx; i++)
				FZ_CHECK(x[i].src == im.blocks[first + i] &&
						 x[i].dst == table[first + i] && x[i].dst >= 0 &&
						 (uint32_t)x[i].dst < m->nb,
					 "transfer %u: %d -> %d", i, x[i].src, x[i].dst);
		} else { /* group 0's, the window's, then the state's frames */
			FZ_CHECK(nx <= 2 * nb + (m->state ? im.state_frames : 0),
				 "import: %u blocks, %u transfers", nb, nx);
			for (i = 0; i < nx; i++)
				FZ_CHECK(x[i].dst >= 0 && (uint32_t)x[i].dst < cfg->device_blocks &&
						 x[i].src >= 0,
					 "transfer %u: %d -> %d", i, x[i].src, x[i].dst);
		}
		if (t && im.len <= MAX_LEN) {
			t->id = got;
			t->len = im.len;
			t->swapped = 0;
			t->key = im.key;
			memcpy(t->tok, im.tokens, (size_t)im.len * sizeof(int32_t));
		} else {
			FZ_CHECK(bkv_seq_drop(m->pool, got) == BKV_OK, "drop import");
		}
	}
	free(im.tokens);
	free(im.blocks);
	free(im.hashes);
	free(im.group_blocks);
}

static void make_tokens(model *m, fz *f, int32_t *t, uint32_t n)
{
	uint8_t mode = fz_u8(f) % 4;
	uint32_t i;

	if (mode == 0) { /* a prefix of another sequence: hits */
		const mseq *o = &m->s[fz_u8(f) % MAX_SEQS];
		uint32_t from = o->len ? fz_below(f, o->len) / m->bt * m->bt : 0;

		for (i = 0; i < n; i++)
			t[i] = from + i < o->len ? o->tok[from + i] : (int32_t)(i % 3);
		return;
	}
	for (i = 0; i < n; i++) {
		if (mode == 1)
			t[i] = (int32_t)(fz_u8(f) % 3); /* tiny alphabet */
		else if (mode == 2)
			t[i] = (int32_t)i;              /* the same run each time */
		else {
			static const int32_t odd[] = {INT32_MIN, -1, 0, INT32_MAX, 1 << 30};

			t[i] = odd[fz_u8(f) % 5];
		}
	}
}

/* Would create refuse these groups (bkv_pool_config's rules): the arena
 * must leave at least one attention frame, and every group must be valid
 * for the block size (a window or chunk of any span is; the state's
 * interval is a multiple of block_tokens by construction). */
static int groups_refused(const bkv_pool_config *c)
{
	uint32_t k;

	if (c->n_groups < 3)
		return c->n_groups && !bkv_kv_frame_bytes(c->groups, c->n_groups, c->block_tokens);
	k = bkv_kv_state_frames(c->groups, c->n_groups, c->block_tokens);
	if (c->state_share) /* the floor and one unit more */
		return k == 0 || (uint64_t)(c->state_units + 1) * k > c->device_blocks;
	return k == 0 || (uint64_t)c->state_units * k >= c->device_blocks;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz f = {data, size, 0};
	fz_mem mem;
	bkv_allocator a;
	bkv_pool_config cfg;
	model *m;
	uint8_t b;
	int rc, huge;
	uint32_t steps = 0, gsel, hc;
	static bkv_kv_group m_groups[3];
	static int32_t tok[4 * MAX_LEN];

	memset(&mem, 0, sizeof(mem));
	a = fz_allocator(&mem);
	bkv_pool_config_init(&cfg);
	b = fz_u8(&f);
	cfg.block_tokens = 1u << (b % 8);          /* 1..128 */
	if (b >= 0xF0)
		cfg.block_tokens = b == 0xFF ? 3 : 65536; /* invalid / extreme */
	b = fz_u8(&f);
	cfg.device_blocks = b % 40;                 /* 0 is refused */
	if (cfg.block_tokens == 65536)
		cfg.device_blocks = 1 + cfg.device_blocks % 2;
	huge = b == 0xFF && cfg.block_tokens != 3;
	b = fz_u8(&f);
	cfg.host_blocks = b % 24;
	gsel = b / 24; /* 8, 9, 10: KV groups (a quarter of the bytes) */
	if (huge) {
		/* the slot-geometry edge: 2^31 device token slots (or one block
		 * more) with every allocation refused, so that no gigabytes are
		 * touched: BKV_ENOMEM when the geometry is valid, else EINVAL */
		uint32_t most = (uint32_t)(BKV_MAX_TOKEN_SLOTS / cfg.block_tokens);

		cfg.device_blocks = (most > (1u << 30) ? (1u << 30) : most) + (cfg.host_blocks & 1);
	}
	b = fz_u8(&f);
	cfg.max_seqs = 1 + b % MAX_SEQS;
	if (gsel >= 8 && !huge) {
		/* full attention, then a window (8, 10) or a chunk (9) of span
		 * 1..2 blocks and a bit, then (10) a recurrent state of 1..3
		 * frames with checkpoints every 2 blocks or none; a byte past
		 * the arena's room is refused at create */
		uint32_t q = b / MAX_SEQS, bt = cfg.block_tokens;

		m_groups[0] = (bkv_kv_group){BKV_GROUP_FULL, 1, 0, 0, 2};
		m_groups[1] = (bkv_kv_group){gsel == 9 ? BKV_GROUP_CHUNKED : BKV_GROUP_WINDOW, 1,
					     1 + (q % 8) * (bt + 1) / 4, 0, 2};
		cfg.n_groups = 2;
		if (gsel == 10) {
			m_groups[2] = (bkv_kv_group){BKV_GROUP_STATE, 1, q & 1 ? 2 * bt : 0, 0,
						     (uint64_t)(1 + q % 3) * 2 * bt - 1};
			cfg.n_groups = 3;
			cfg.state_units = 1 + (q >> 1) % 6;
			if (q >= 11) { /* shared with attention: a floor of 0..2 */
				cfg.state_share = 1;
				cfg.state_units = (q >> 1) % 3;
			}
		}
		cfg.groups = m_groups;
	}
	b = fz_u8(&f);
	cfg.watermark_blocks = b % 4;
	hc = (b >> 2) & 1; /* a host cache, where the pool can have one */
	b = fz_u8(&f);
	cfg.prefix_cache = b & 1;
	cfg.hash_seed = b >> 1;
	cfg.host_cache = hc && cfg.prefix_cache && cfg.host_blocks && !cfg.n_groups;
	mem.fail_at = fz_u8(&f);
	mem.sticky = (b & 0x80) != 0;
	if (huge) {
		mem.fail_at = 1;
		mem.sticky = 1;
	}

	m = calloc(1, sizeof(*m));
	if (!m)
		return 0;
	rc = bkv_pool_create(&cfg, &a, &m->pool);
	if (rc != BKV_OK) {
		FZ_CHECK(rc == BKV_EINVAL || rc == BKV_ENOMEM, "create: %d", rc);
		FZ_CHECK(rc != BKV_EINVAL || groups_refused(&cfg) ||
				 (cfg.device_blocks == 0 || cfg.block_tokens == 3 ||
				  cfg.watermark_blocks > cfg.device_blocks ||
				  cfg.device_blocks > (1u << 30) ||
				  (uint64_t)cfg.device_blocks * cfg.block_tokens > BKV_MAX_TOKEN_SLOTS),
			 "valid config refused");
		FZ_CHECK(rc == BKV_EINVAL ||
				 (uint64_t)cfg.device_blocks * cfg.block_tokens <= BKV_MAX_TOKEN_SLOTS,
			 "a pool of %llu token slots was not refused",
			 (unsigned long long)cfg.device_blocks * cfg.block_tokens);
		FZ_CHECK(rc == BKV_EINVAL || mem.calls > 0, "create: %d without allocating", rc);
		FZ_CHECK(rc != BKV_EINVAL || !huge || mem.calls == 0,
			 "create refused the geometry after allocating");
		FZ_CHECK(rc != BKV_ENOMEM || mem.failures, "create: ENOMEM, no refusal");
		FZ_CHECK(m->pool == NULL, "failed create wrote the handle");
		FZ_CHECK(mem.live_bytes == 0 && mem.live_blocks == 0,
			 "failed create leaked %lld bytes", (long long)mem.live_bytes);
		free(m);
		return 0;
	}
	m->bt = cfg.block_tokens;
	m->ng = cfg.n_groups;
	memcpy(m->g, m_groups, sizeof(m->g));
	m->state = m->ng == 3;
	m->share = m->state && cfg.state_share;
	m->k = m->state ? bkv_kv_state_frames(m->g, m->ng, m->bt) : 0;
	m->arena = m->state && !m->share ? cfg.state_units * m->k : 0;
	m->nb = cfg.device_blocks - m->arena;
	FZ_CHECK(stats_of(m->pool).device_blocks + (m->share ? cfg.state_units * m->k : 0) == m->nb,
		 "device_blocks %u, %u attention frames", stats_of(m->pool).device_blocks, m->nb);
	check_all(m, 1);

	while (fz_more(&f) && steps++ < 400) {
		uint32_t id, n, i, got;
		mseq *s, *t;
		uint8_t op = fz_u8(&f);

		/* 0xF0..0xFF: the import of a damaged export; below, op % 17 */
		op = op >= 0xF0 ? 17 : op % 17;

		switch (op) {
		case 0: /* open */
		case 1: { /* open keyed */
			uint64_t key = op == 1 ? fz_u8(&f) % 3 : 0;

			t = free_slot(m);
			MUTATE(m, &mem,
			       op ? bkv_seq_open_keyed(m->pool, key, &id) : bkv_seq_open(m->pool, &id),
			       rc);
			FZ_CHECK(rc == BKV_OK || rc == BKV_EAGAIN || rc == BKV_ENOMEM, "open: %d",
				 rc);
			if (rc == BKV_OK) {
				FZ_CHECK(id != 0, "open gave id 0");
				if (t) {
					t->id = id;
					t->len = 0;
					t->swapped = 0;
					t->key = key;
				} else {
					/* model full: close it again */
					FZ_CHECK(bkv_seq_close(m->pool, id) == BKV_OK, "close");
				}
			}
			break;
		}
		case 2:
		case 3:
		case 4: { /* append */
			int64_t need;
			uint32_t avail, hits = 0xFFFFFFFF;

			s = pick(m, &f, &id);
			n = fz_u8(&f) % (3 * m->bt + 4);
			if (fz_u8(&f) == 0xFF)
				n = 4 * MAX_LEN; /* larger than the pool */
			make_tokens(m, &f, tok, n);
			need = bkv_seq_blocks_needed(m->pool, id, n);
			avail = bkv_pool_available(m->pool);
			MUTATE(m, &mem, bkv_seq_append(m->pool, id, tok, n, &hits), rc);
			if (!s) {
				FZ_CHECK(rc == BKV_ENOENT || rc == BKV_EINVAL, "append to bogus: %d", rc);
				break;
			}
			if (s->swapped) {
				FZ_CHECK(rc == BKV_ESTATE, "append to swapped: %d", rc);
				FZ_CHECK(need == BKV_ESTATE, "blocks_needed on swapped: %lld",
					 (long long)need);
				break;
			}
			FZ_CHECK(need >= 0, "blocks_needed: %lld", (long long)need);
			/* (a state group may also run out of units) */
			if (need <= avail && s->len + n <= (uint64_t)m->nb * m->bt && !m->state)
				FZ_CHECK(rc != BKV_ENOSPC,
					 "ENOSPC although %lld blocks needed <= %u available",
					 (long long)need, avail);
			if (rc == BKV_OK) {
				FZ_CHECK(hits <= n && hits % m->bt == 0, "hits %u of %u", hits, n);
				if (s->len + n > MAX_LEN) {
					/* beyond the model: forget it */
					FZ_CHECK(bkv_seq_drop(m->pool, id) == BKV_OK, "drop");
					s->id = 0;
					break;
				}
				memcpy(s->tok + s->len, tok, (size_t)n * sizeof(int32_t));
				s->len += n;
			} else {
				FZ_CHECK(rc == BKV_ENOSPC || rc == BKV_E2BIG || rc == BKV_ENOMEM,
					 "append: %d", rc);
				FZ_CHECK(rc != BKV_E2BIG ||
						 s->len + n > (uint64_t)m->nb * m->bt,
					 "E2BIG for %u + %u tokens in %u blocks", s->len, n, m->nb);
			}
			break;
		}
		case 5: /* truncate */
			s = pick(m, &f, &id);
			n = s ? fz_below(&f, s->len + 2) : fz_u8(&f);
			MUTATE(m, &mem, bkv_seq_truncate(m->pool, id, n), rc);
			if (!s)
				FZ_CHECK(rc == BKV_ENOENT || rc == BKV_EINVAL, "truncate bogus: %d", rc);
			else if (s->swapped)
				FZ_CHECK(rc == BKV_ESTATE, "truncate swapped: %d", rc);
			else if (n > s->len)
				FZ_CHECK(rc == BKV_EINVAL, "truncate longer: %d", rc);
			else if (rc == BKV_ESTATE && m->ng)
				FZ_CHECK(m->state || (n > 0 && truncate_needs_released(m, s, n)),
					 "truncate of seq %u to %u: ESTATE with every block held",
					 s->id, n);
			else {
				FZ_CHECK(rc == BKV_OK, "truncate: %d", rc);
				s->len = n;
			}
			break;
		case 6: /* fork */
			s = pick(m, &f, &id);
			t = free_slot(m);
			MUTATE(m, &mem, bkv_seq_fork(m->pool, id, &got), rc);
			if (!s) {
				FZ_CHECK(rc == BKV_ENOENT || rc == BKV_EINVAL, "fork bogus: %d", rc);
			} else if (s->swapped) {
				FZ_CHECK(rc == BKV_ESTATE, "fork swapped: %d", rc);
			} else if (rc == BKV_ESTATE) {
				/* a state the open step appended to and has not
				 * committed cannot be shared */
				FZ_CHECK(m->state && m->txn, "fork: ESTATE");
			} else if (rc == BKV_OK) {
				if (!t) {
					FZ_CHECK(bkv_seq_close(m->pool, got) == BKV_OK, "close");
					break;
				}
				*t = *s;
				t->id = got;
			} else {
				FZ_CHECK(rc == BKV_EAGAIN || rc == BKV_ENOMEM, "fork: %d", rc);
			}
			break;
		case 7: /* close */
		case 8: /* drop */
			s = pick(m, &f, &id);
			MUTATE(m, &mem,
			       op == 7 ? bkv_seq_close(m->pool, id) : bkv_seq_drop(m->pool, id), rc);
			if (!s) {
				FZ_CHECK(rc == BKV_ENOENT || rc == BKV_EINVAL, "close bogus: %d", rc);
			} else {
				FZ_CHECK(rc == BKV_OK, "close/drop: %d", rc);
				s->id = 0;
			}
			break;
		case 9: /* swap out */
			s = pick(m, &f, &id);
			MUTATE(m, &mem, bkv_seq_swap_out(m->pool, id), rc);
			if (!s)
				FZ_CHECK(rc == BKV_ENOENT || rc == BKV_EINVAL, "swap_out bogus: %d", rc);
			else if (rc == BKV_OK)
				s->swapped = 1;
			else
				FZ_CHECK(rc == BKV_ESTATE || rc == BKV_ENOSPC || rc == BKV_ENOMEM,
					 "swap_out: %d", rc);
			FZ_CHECK(!(s && s->swapped && rc == BKV_OK && cfg.host_blocks == 0),
				 "swap_out without a host tier");
			break;
		case 10: /* swap in */
			s = pick(m, &f, &id);
			MUTATE(m, &mem, bkv_seq_swap_in(m->pool, id), rc);
			if (!s)
				FZ_CHECK(rc == BKV_ENOENT || rc == BKV_EINVAL, "swap_in bogus: %d", rc);
			else if (!s->swapped)
				FZ_CHECK(rc == BKV_ESTATE, "swap_in of a resident seq: %d", rc);
			else if (rc == BKV_OK)
				s->swapped = 0;
			else
				FZ_CHECK(rc == BKV_ESTATE || rc == BKV_ENOSPC || rc == BKV_ENOMEM,
					 "swap_in: %d", rc);
			break;
		case 11: { /* clear one copy list, after checking its entries */
			const bkv_copy *c = NULL;
			bkv_copy_kind kind = (bkv_copy_kind)(fz_u8(&f) % 3);

			n = bkv_pool_pending_copies(m->pool, kind, &c);
			for (i = 0; i < n; i++) {
				uint32_t slim = kind == BKV_COPY_SWAP_IN ? cfg.host_blocks
									 : cfg.device_blocks;
				uint32_t dlim = kind == BKV_COPY_SWAP_OUT ? cfg.host_blocks
									  : cfg.device_blocks;

				FZ_CHECK(c[i].src >= 0 && (uint32_t)c[i].src < slim &&
						 c[i].dst >= 0 && (uint32_t)c[i].dst < dlim,
					 "copy %u of kind %d: %d -> %d", i, kind, c[i].src, c[i].dst);
			}
			bkv_pool_clear_copies(m->pool, kind);
			FZ_CHECK(bkv_pool_pending_copies(m->pool, kind, NULL) == 0, "clear left copies");
			break;
		}
		case 12:
			FZ_CHECK(bkv_pool_reset_cache(m->pool) == BKV_OK, "reset_cache");
			FZ_CHECK(stats_of(m->pool).nr_cached == 0, "reset left cached blocks");
			break;
		case 13: /* step transactions, as the scheduler uses them */
			if (!m->txn)
				bkv__pool_txn_begin(m->pool);
			else if (fz_u8(&f) & 1)
				bkv__pool_txn_commit(m->pool);
			else
				bkv__pool_txn_abort(m->pool);
			m->txn = !m->txn;
			break;
		case 14: { /* queries agree with the stats */
			bkv_pool_stats st = stats_of(m->pool);
			uint32_t avail = bkv_pool_available(m->pool);
			uint32_t ntok = fz_u16(&f);

			FZ_CHECK(st.nr_free + st.nr_used + st.nr_cached ==
					 m->nb - (m->share ? st.state_units * m->k : 0) &&
					 st.device_blocks + (m->share ? st.state_units * m->k : 0) == m->nb,
				 "free %u + used %u + cached %u != %u", st.nr_free, st.nr_used,
				 st.nr_cached, m->nb);
			FZ_CHECK(st.state_free <= st.state_units &&
					 (m->share ? st.state_units >= cfg.state_units
						   : st.state_units == (m->state ? cfg.state_units : 0)),
				 "state units %u, free %u", st.state_units, st.state_free);
			FZ_CHECK(avail <= st.nr_free + st.nr_cached +
						  (m->share ? st.state_units * m->k : 0) &&
					 avail >= st.nr_free,
				 "available %u outside [free %u, free + cached %u]", avail,
				 st.nr_free, st.nr_free + st.nr_cached);
			rc = bkv_pool_can_admit(m->pool, ntok);
			FZ_CHECK(rc == ((uint64_t)avail >= (uint64_t)(ntok + m->bt - 1) / m->bt *
								   (m->ng ? 2 : 1) +
							   cfg.watermark_blocks),
				 "can_admit(%u) = %d with %u available, watermark %u", ntok, rc,
				 avail, cfg.watermark_blocks);
			FZ_CHECK(st.host_free + st.host_used == cfg.host_blocks, "host counts");
			break;
		}
		case 17:
			op_import(m, &f, &mem, &cfg);
			break;
		default: { /* a burst: append one token to every resident sequence */
			for (i = 0; i < MAX_SEQS; i++) {
				s = &m->s[i];
				if (!s->id || s->swapped || s->len >= MAX_LEN)
					continue;
				tok[0] = (int32_t)(fz_u8(&f) % 3);
				MUTATE(m, &mem, bkv_seq_append(m->pool, s->id, tok, 1, NULL), rc);
				if (rc == BKV_OK)
					s->tok[s->len++] = tok[0];
				else
					FZ_CHECK(rc == BKV_ENOSPC || rc == BKV_ENOMEM || rc == BKV_E2BIG,
						 "burst append: %d", rc);
			}
			break;
		}
		}
		check_all(m, steps % 8 == 0);
	}
	if (m->txn)
		bkv__pool_txn_commit(m->pool);
	check_all(m, 1);
	bkv_pool_destroy(m->pool);
	FZ_CHECK(mem.live_bytes == 0 && mem.live_blocks == 0, "destroy leaked %lld bytes in %lld",
		 (long long)mem.live_bytes, (long long)mem.live_blocks);
	free(m);
	return 0;
}

#include "fuzz_main.h"
