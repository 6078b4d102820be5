/*
 * encoder.c - a pool's KV events in vLLM's wire format.
 *
 * A router built for vLLM learns what each replica caches from a stream of
 * msgpack KVEventBatch messages and finds a prompt's blocks by hashing its
 * tokens the way vLLM does (events/hash.c). This file makes a pool look like
 * such a replica. It reads the pool (pool/pool.h) and changes nothing in it:
 * the pool's own events (kv/cache.c writes them, bkv_pool_drain_events
 * drains them) say which block entered or left the index, and the token
 * store says what the block holds.
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
 * msgpack is written as msgspec writes it (events/msgpack.c).
 */
#include "pool/pool.h"
#include "events/vllm.h"

#include <string.h>

/* ---- the encoder ----------------------------------------------------------- */

#define EV_CHUNK 256 /* pool events drained per bkv_pool_drain_events call */

/* A demoting host block by its chain hash (the snapshot's hdem). */
struct hdem {
	uint64_t hash; /* pool->hc_hash[h] */
	int32_t h;     /* the host block */
};

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
	int32_t *ppid;        /* [nb] the parent block b had when published
				 (-1: a first block): a demoted block's
				 parent digest is dig[ppid[b]] */
	uint32_t nh;          /* the pool's host blocks with a host cache, 0
				 without one or on ARRAY_V0 (then no host
				 block is published) */
	uint8_t (*hdig)[32];  /* [nh] a host-cache block's published digest */
	uint8_t (*hpdig)[32]; /* [nh] its parent's digest (hpar[h]) */
	uint64_t *hnat;       /* [nh] the pool hash hdig stands for */
	uint8_t *hvalid;      /* [nh] 1: published as stored on the host */
	uint8_t *hpar;        /* [nh] 1: it has a parent (hpdig is set) */
	int32_t *hpath;       /* [nh] snapshot scratch: a host chain walked up */
	struct hdem *hdem;    /* [nh] snapshot scratch: the demoting host
				 blocks by hash (not in the host index) */
	uint32_t ndem;        /* entries of hdem in use */
	char *host_medium;    /* cfg.host_medium copied, or NULL */
	int rm_ok;            /* the last translated event was the REMOVED of
				 a published device block: rm_* describe it,
				 for the host STORED that follows a demotion */
	uint64_t rm_nat;      /* its pool hash */
	uint8_t rm_dig[32];   /* its digest */
	uint8_t rm_pdig[32];  /* its parent's digest (rm_par) */
	int rm_par;           /* it had a parent */
	int32_t *path;        /* [nb] snapshot scratch: a chain walked up */
	int32_t *group;       /* [nb] the open BlockStored's blocks, a chain */
	uint32_t n_group;     /* blocks in group */
	uint64_t group_key;   /* their key */
	char salt[BKV__VLLM_SALT_BYTES]; /* scratch: an unnamed key's
				 cache_salt (bkv__vllm_key_salt) */
	uint64_t last_seq;    /* the last pool event seq taken */
	uint64_t resyncs;     /* snapshots written */
	int need_resync;      /* the next encode must write a snapshot */
	uint32_t n_events;    /* vLLM events in body */
	bkv__wbuf body;       /* the events of the batch being written */
	bkv__wbuf msg;        /* the whole batch (what encode returns) */
	bkv__wbuf scratch;    /* one block's hash input */
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
	cfg->host_medium = "CPU";
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
	free_str(&a, enc->host_medium);
	bkv__free(&a, enc->hdig, (size_t)enc->nh * 32);
	bkv__free(&a, enc->hpdig, (size_t)enc->nh * 32);
	bkv__free(&a, enc->hnat, (size_t)enc->nh * sizeof(uint64_t));
	bkv__free(&a, enc->hvalid, enc->nh);
	bkv__free(&a, enc->hpar, enc->nh);
	bkv__free(&a, enc->hpath, (size_t)enc->nh * sizeof(int32_t));
	bkv__free(&a, enc->hdem, (size_t)enc->nh * sizeof(struct hdem));
	bkv__free(&a, enc->ppid, nb * sizeof(int32_t));
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

/* The host cache's records (a pool with one, on a layout with a medium
 * field), and every device block's published parent. -1 when an allocation
 * failed. ARRAY_V0 has no medium: a host block's events would read as the
 * device's, so that layout publishes the device tier alone (nh stays 0 and
 * host events are passed over). */
static int host_arrays(bkv_vllm_encoder *e, const bkv_vllm_config *cfg)
{
	size_t nh;

	e->ppid = bkv__calloc(&e->alloc, e->nb, sizeof(int32_t));
	if (!e->ppid)
		return -1;
	e->host_medium = dup_str(&e->alloc, cfg->host_medium);
	e->cfg.host_medium = e->host_medium;
	if (cfg->host_medium && !e->host_medium)
		return -1;
	if (!e->pool->hc_on || cfg->wire == BKV_VLLM_WIRE_ARRAY_V0)
		return 0;
	e->nh = e->pool->nh;
	nh = e->nh;
	e->hdig = bkv__calloc(&e->alloc, nh, 32);
	e->hpdig = bkv__calloc(&e->alloc, nh, 32);
	e->hnat = bkv__calloc(&e->alloc, nh, sizeof(uint64_t));
	e->hvalid = bkv__calloc(&e->alloc, nh, 1);
	e->hpar = bkv__calloc(&e->alloc, nh, 1);
	e->hpath = bkv__calloc(&e->alloc, nh, sizeof(int32_t));
	e->hdem = bkv__calloc(&e->alloc, nh, sizeof(struct hdem));
	return e->hdig && e->hpdig && e->hnat && e->hvalid && e->hpar && e->hpath && e->hdem
		       ? 0
		       : -1;
}

#define VC "bkv_vllm_config."

/* BKV_OK, or BKV_EINVAL with the message naming the field (bkv_last_error). */
static int config_check(const bkv_vllm_config *cfg, const bkv_pool *pool)
{
	if (cfg->size < sizeof *cfg)
		return bkv__fail(BKV_EINVAL, VC "size = %u: must be sizeof(bkv_vllm_config) = %zu "
				 "(call bkv_vllm_config_init)", cfg->size, sizeof *cfg);
	if (cfg->wire > BKV_VLLM_WIRE_ARRAY_V0)
		return bkv__fail(BKV_EINVAL, VC "wire = %u: not a bkv_vllm_wire", cfg->wire);
	if (cfg->hash > BKV_VLLM_HASH_SHA256)
		return bkv__fail(BKV_EINVAL, VC "hash = %u: not a bkv_vllm_hash", cfg->hash);
	if (!bkv__vllm_seed_ok(cfg->hash_seed))
		return bkv__fail(BKV_EINVAL, VC "hash_seed: must be a string of at most 255 bytes%s",
				 cfg->hash_seed ? "" : " (is NULL)");
	if (cfg->data_parallel_rank < -1)
		return bkv__fail(BKV_EINVAL, VC "data_parallel_rank = %d: must be >= -1",
				 (int)cfg->data_parallel_rank);
	if (cfg->group_idx < -1)
		return bkv__fail(BKV_EINVAL, VC "group_idx = %d: must be >= -1", (int)cfg->group_idx);
	if (!pool->kv.ev)
		return bkv__fail(BKV_EINVAL, "bkv_vllm_encoder_create: the pool keeps no KV events "
				 "(bkv_pool_config.event_capacity = 0)");
	return BKV_OK;
}

int bkv_vllm_encoder_create(const bkv_vllm_config *cfg, const bkv_pool *pool,
			    const bkv_allocator *alloc, bkv_vllm_encoder **out)
{
	bkv_allocator a;
	bkv_vllm_encoder *e;
	size_t nb;

	bkv__error_clear();
	if (!cfg || !pool || !out)
		return bkv__fail(BKV_EINVAL, "bkv_vllm_encoder_create: %s is NULL",
				 !cfg ? "cfg" : !pool ? "pool" : "out");
	if (config_check(cfg, pool) != BKV_OK)
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
	if (host_arrays(e, cfg) ||
	    (cfg->medium && !e->medium) || (cfg->spec_kind && !e->spec_kind) || !e->dig ||
	    !e->nat || !e->valid || !e->path || !e->group ||
	    (cfg->hash != BKV_VLLM_HASH_NATIVE &&
	     bkv__vllm_none_hash(cfg->hash, e->seed, &e->alloc, e->none))) {
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
static void put_hash(bkv_vllm_encoder *e, bkv__wbuf *w, const uint8_t *d)
{
	if (e->cfg.hash == BKV_VLLM_HASH_NATIVE || e->cfg.wire == BKV_VLLM_WIRE_ARRAY_V0 ||
	    e->cfg.int_hashes)
		bkv__mp_uint(w, bkv_vllm_hash_int(d));
	else
		bkv__mp_bin(w, d, BKV_VLLM_DIGEST_BYTES);
}

static const char *key_name(const bkv_vllm_encoder *e, uint64_t key)
{
	return key && e->cfg.key_name ? e->cfg.key_name(e->cfg.key_name_ud, key) : NULL;
}

/* The cache_salt of a block under key (named name): a chain's first block
 * (root) of an unnamed nonzero key has one, every other block none. */
static const char *block_salt(bkv_vllm_encoder *e, uint64_t key, const char *name, int root)
{
	return root ? bkv__vllm_key_salt(key, name, e->salt) : NULL;
}

/* One block's digest under key, from its parent's (parent NULL: a first
 * block, whose parent is NONE_HASH). -1: no memory. */
static int block_digest(bkv_vllm_encoder *e, const uint8_t *parent, const int32_t *tok,
			uint64_t key, uint8_t out[32])
{
	const char *name = key_name(e, key);

	return bkv__vllm_block_digest(e->cfg.hash, &e->scratch, parent ? parent : e->none, tok,
				      e->bt, name, block_salt(e, key, name, parent == NULL), out);
}

/* Compute and record block b's digest from its parent's. -1: the parent has
 * none (only after lost events) or no memory. */
static int publish_digest(bkv_vllm_encoder *e, int32_t b)
{
	const bkv__block *k = &e->pool->kv.blk[b];
	const uint8_t *parent = NULL;

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
	} else if (block_digest(e, parent, bkv__tok(&e->pool->kv, b), k->key, e->dig[b])) {
		return -1;
	}
	e->nat[b] = k->hash;
	e->valid[b] = 1;
	e->ppid[b] = k->parent;
	return 0;
}

/* An event's head: in the map layout a map of n_map fields whose first is
 * the "type" tag, in the array layouts an array of n_array (the tag is its
 * first element); then the event's name. */
static void event_head(bkv_vllm_encoder *e, const char *name, size_t n_map, size_t n_array)
{
	if (e->cfg.wire == BKV_VLLM_WIRE_MAP) {
		bkv__mp_map(&e->body, n_map);
		bkv__mp_str(&e->body, "type");
	} else {
		bkv__mp_array(&e->body, n_array);
	}
	bkv__mp_str(&e->body, name);
}

/* In the map layout, a field's name before its value; the array layouts
 * go by position and write none. */
static void field(bkv__wbuf *w, int map, const char *name)
{
	if (map)
		bkv__mp_str(w, name);
}

static void str_or_nil(bkv__wbuf *w, const char *s)
{
	if (s)
		bkv__mp_str(w, s);
	else
		bkv__mp_nil(w);
}

/* BlockStored's block_hashes (the chain's digests) and parent_block_hash
 * (the first block's parent's digest, nil for a root). */
static void stored_hashes(bkv_vllm_encoder *e, bkv__wbuf *w, int map)
{
	int32_t parent = e->pool->kv.blk[e->group[0]].parent;
	uint32_t i;

	field(w, map, "block_hashes");
	bkv__mp_array(w, e->n_group);
	for (i = 0; i < e->n_group; i++)
		put_hash(e, w, e->dig[e->group[i]]);
	field(w, map, "parent_block_hash");
	if (parent >= 0)
		put_hash(e, w, e->dig[parent]);
	else
		bkv__mp_nil(w);
}

/* BlockStored's token_ids (every block's tokens, in chain order) and
 * block_size. */
static void stored_tokens(bkv_vllm_encoder *e, bkv__wbuf *w, int map)
{
	uint32_t i, j;

	field(w, map, "token_ids");
	bkv__mp_array(w, (size_t)e->n_group * e->bt);
	for (i = 0; i < e->n_group; i++) {
		const int32_t *t = bkv__tok(&e->pool->kv, e->group[i]);

		for (j = 0; j < e->bt; j++)
			bkv__mp_int(w, t[j]);
	}
	field(w, map, "block_size");
	bkv__mp_uint(w, e->bt);
}

/* BlockStored's lora_id (key), then (not in ARRAY_V0) medium and
 * lora_name. */
static void stored_lora(bkv_vllm_encoder *e, bkv__wbuf *w, int map, const char *name,
			uint64_t key, const char *medium)
{
	field(w, map, "lora_id");
	if (key)
		bkv__mp_uint(w, key);
	else
		bkv__mp_nil(w);
	if (e->cfg.wire != BKV_VLLM_WIRE_ARRAY_V0) {
		field(w, map, "medium");
		str_or_nil(w, medium);
		field(w, map, "lora_name");
		str_or_nil(w, name);
	}
}

/* BlockStored's optional fields for n blocks under key (named name), the
 * first a chain's first block when root, map layout only: each one present
 * when the config asks for it (stored_head counts them). */
static void stored_options(bkv_vllm_encoder *e, bkv__wbuf *w, const char *name, uint64_t key,
			   int root, uint32_t n)
{
	uint32_t i;

	if (e->cfg.extra_keys) {
		bkv__mp_str(w, "extra_keys");
		bkv__mp_array(w, n);
		for (i = 0; i < n; i++) {
			const char *ex = name ? name : block_salt(e, key, name, root && i == 0);

			if (ex) {
				bkv__mp_array(w, 1);
				bkv__mp_str(w, ex);
			} else {
				bkv__mp_nil(w);
			}
		}
	}
	if (e->cfg.group_idx >= 0) {
		bkv__mp_str(w, "group_idx");
		bkv__mp_uint(w, (uint64_t)e->cfg.group_idx);
	}
	if (e->cfg.spec_kind) {
		bkv__mp_str(w, "kv_cache_spec_kind");
		bkv__mp_str(w, e->cfg.spec_kind);
	}
	if (e->cfg.sliding_window) {
		bkv__mp_str(w, "kv_cache_spec_sliding_window");
		bkv__mp_uint(w, e->cfg.sliding_window);
	}
}

/* A BlockStored's head: in the map layout 8 fields and the optional ones,
 * in ARRAY the tag and 7 fields, in ARRAY_V0 the tag and 5. */
static void stored_head(bkv_vllm_encoder *e)
{
	event_head(e, "BlockStored",
		   8 + (e->cfg.extra_keys != 0) + (e->cfg.group_idx >= 0) +
			   (e->cfg.spec_kind != NULL) + (e->cfg.sliding_window != 0),
		   e->cfg.wire == BKV_VLLM_WIRE_ARRAY ? 8 : 6);
}

/* Write the open BlockStored (the chain in group) into body: in the map
 * layout 8 fields and the optional ones, in ARRAY the tag and 7 fields, in
 * ARRAY_V0 the tag and 5 (no medium, no lora_name). */
static void flush_group(bkv_vllm_encoder *e)
{
	bkv__wbuf *w = &e->body;
	int map = e->cfg.wire == BKV_VLLM_WIRE_MAP;
	const char *name;

	if (e->n_group == 0)
		return;
	name = key_name(e, e->group_key);
	stored_head(e);
	stored_hashes(e, w, map);
	stored_tokens(e, w, map);
	stored_lora(e, w, map, name, e->group_key, e->cfg.medium);
	if (map)
		stored_options(e, w, name, e->group_key,
			       e->pool->kv.blk[e->group[0]].parent < 0, e->n_group);
	e->n_events++;
	e->n_group = 0;
}

/* A host-cache block h as a BlockStored of its own (host_medium): its
 * digest and its parent's recorded at its demotion, the host's token ids. */
static void put_host_stored(bkv_vllm_encoder *e, int32_t h)
{
	bkv__wbuf *w = &e->body;
	int map = e->cfg.wire == BKV_VLLM_WIRE_MAP;
	uint64_t key = e->pool->hc_key[h];
	const char *name = key_name(e, key);
	const int32_t *t = e->pool->host_tok + (size_t)h * e->bt;
	uint32_t j;

	flush_group(e);
	stored_head(e);
	field(w, map, "block_hashes");
	bkv__mp_array(w, 1);
	put_hash(e, w, e->hdig[h]);
	field(w, map, "parent_block_hash");
	if (e->hpar[h])
		put_hash(e, w, e->hpdig[h]);
	else
		bkv__mp_nil(w);
	field(w, map, "token_ids");
	bkv__mp_array(w, e->bt);
	for (j = 0; j < e->bt; j++)
		bkv__mp_int(w, t[j]);
	field(w, map, "block_size");
	bkv__mp_uint(w, e->bt);
	stored_lora(e, w, map, name, key, e->cfg.host_medium);
	if (map)
		stored_options(e, w, name, key, !e->hpar[h], 1);
	e->n_events++;
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

static void put_removed(bkv_vllm_encoder *e, const uint8_t *d, const char *medium)
{
	bkv__wbuf *w = &e->body;
	int map = e->cfg.wire == BKV_VLLM_WIRE_MAP;

	flush_group(e);
	event_head(e, "BlockRemoved", 3 + (e->cfg.group_idx >= 0),
		   e->cfg.wire == BKV_VLLM_WIRE_ARRAY ? 3 : 2);
	field(w, map, "block_hashes");
	bkv__mp_array(w, 1);
	put_hash(e, w, d);
	if (e->cfg.wire != BKV_VLLM_WIRE_ARRAY_V0) {
		field(w, map, "medium");
		str_or_nil(w, medium);
	}
	if (map && e->cfg.group_idx >= 0) {
		bkv__mp_str(w, "group_idx");
		bkv__mp_uint(w, (uint64_t)e->cfg.group_idx);
	}
	e->n_events++;
}

static void put_cleared(bkv_vllm_encoder *e)
{
	flush_group(e);
	event_head(e, "AllBlocksCleared", 1, 1);
	e->n_events++;
}

/* Every published block forgotten (a CLEARED event or a snapshot). */
static void forget_all(bkv_vllm_encoder *e)
{
	memset(e->valid, 0, e->nb);
	if (e->nh)
		memset(e->hvalid, 0, e->nh);
	e->rm_ok = 0;
}

/* ---- the host cache in a snapshot ------------------------------------------
 * A snapshot re-announces the host cache's blocks (cached, or demoting:
 * their STORED was published at demotion) after the device's, parents
 * first, each under the digest computed from its parent's. A block whose
 * parent is in neither index is left out with its descendants: no lookup
 * reaches it (a host hit continues a chain of hits), and the stream never
 * names a parent it has not stored. A parent may be a demoting block: not
 * in the host index until its copy clears, it is found in hdem, sorted
 * once per snapshot. During the walk hvalid[h] is 1 for a block announced,
 * HV_OUT for one left out, 0 for one not reached yet. */
#define HV_OUT 2

static int host_live(const bkv_pool *pool, int32_t h)
{
	return pool->host_state[h] == BKV__HOST_CACHED || pool->host_state[h] == BKV__HOST_DEMOTING;
}

/* Heapsort of d[0, n) by hash, in place (libc's qsort may allocate). */
static void hdem_sift(struct hdem *d, uint32_t root, uint32_t n)
{
	uint32_t child;
	struct hdem t;

	for (; (child = 2 * root + 1) < n; root = child) {
		child += child + 1 < n && d[child + 1].hash > d[child].hash;
		if (d[root].hash >= d[child].hash)
			return;
		t = d[root], d[root] = d[child], d[child] = t;
	}
}

static void hdem_sort(struct hdem *d, uint32_t n)
{
	uint32_t i;
	struct hdem t;

	for (i = n / 2; i-- > 0;)
		hdem_sift(d, i, n);
	for (i = n; i-- > 1; hdem_sift(d, 0, i))
		t = d[0], d[0] = d[i], d[i] = t;
}

/* hdem := the demoting host blocks (the pending swap-out copies' targets)
 * sorted by hash, each once (hvalid, all 0 here, marks them meanwhile). */
static void sort_demoting(bkv_vllm_encoder *e)
{
	const bkv_pool *pool = e->pool;
	uint32_t i, j;

	e->ndem = 0;
	for (j = 0; j <= BKV_OVERLAP_MAX_DEPTH; j++) { /* the steps in flight's
							   (overlap), then the
							   rest */
		const bkv__copy_list *l = j < BKV_OVERLAP_MAX_DEPTH ? &pool->so_held[j]
								    : &pool->copies[BKV_COPY_SWAP_OUT];

		for (i = 0; i < l->n && e->ndem < e->nh; i++) {
			int32_t h = l->v[i].dst;

			if (pool->host_state[h] != BKV__HOST_DEMOTING || e->hvalid[h])
				continue;
			e->hvalid[h] = 1;
			e->hdem[e->ndem].hash = pool->hc_hash[h];
			e->hdem[e->ndem++].h = h;
		}
	}
	for (i = 0; i < e->ndem; i++)
		e->hvalid[e->hdem[i].h] = 0;
	hdem_sort(e->hdem, e->ndem);
}

/* The live host block whose chain hash is ph: cached (the host index) or
 * demoting (hdem); -1 when the host holds none. */
static int32_t host_find(const bkv_vllm_encoder *e, uint64_t ph)
{
	int32_t h = bkv__hc_find(e->pool, ph);
	uint32_t lo = 0, hi = e->ndem;

	if (h >= 0)
		return h;
	while (lo < hi) { /* the first entry whose hash is not below ph */
		uint32_t mid = lo + (hi - lo) / 2;

		if (e->hdem[mid].hash < ph)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < e->ndem && e->hdem[lo].hash == ph ? e->hdem[lo].h : -1;
}

/* The digest of the block whose chain hash is ph, when one is published in
 * this snapshot (a device block, or a host block announced already). */
static const uint8_t *host_parent_digest(const bkv_vllm_encoder *e, uint64_t ph)
{
	const bkv_pool *pool = e->pool;
	int32_t d = bkv__index_find(&pool->kv, ph), h;

	if (d >= 0 && e->valid[d] && e->nat[d] == ph)
		return e->dig[d];
	h = host_find(e, ph);
	return h >= 0 && e->hvalid[h] == 1 ? e->hdig[h] : NULL;
}

/* Host block h's digest from its parent's (published); -1 when the hash
 * failed. */
static int host_digest(bkv_vllm_encoder *e, int32_t h)
{
	const bkv_pool *pool = e->pool;
	uint64_t ph = pool->hc_phash[h], hash = pool->hc_hash[h];
	const uint8_t *parent = ph == BKV__HASH_ROOT ? NULL : host_parent_digest(e, ph);

	if (!parent && ph != BKV__HASH_ROOT)
		return -1;
	if (e->cfg.hash == BKV_VLLM_HASH_NATIVE) {
		memset(e->hdig[h], 0, 24);
		for (int i = 0; i < 8; i++)
			e->hdig[h][24 + i] = (uint8_t)(hash >> (56 - 8 * i));
	} else if (block_digest(e, parent, pool->host_tok + (size_t)h * e->bt, pool->hc_key[h],
				e->hdig[h])) {
		return -1;
	}
	e->hpar[h] = ph != BKV__HASH_ROOT;
	if (e->hpar[h])
		memcpy(e->hpdig[h], parent, 32);
	e->hnat[h] = hash;
	return 0;
}

/* Announce live host block h and the unreached host blocks above it,
 * parents first; or leave them all out when the chain's top has no
 * published parent. -1: a hash ran out of memory. */
static int host_announce(bkv_vllm_encoder *e, int32_t h)
{
	const bkv_pool *pool = e->pool;
	uint32_t depth = 0;
	int32_t c = h;
	int out = 1;

	while (c >= 0 && e->hvalid[c] == 0 && host_live(pool, c) && depth < e->nh) {
		uint64_t ph = pool->hc_phash[c];

		e->hpath[depth++] = c;
		if (ph == BKV__HASH_ROOT || host_parent_digest(e, ph)) {
			out = 0;
			break;
		}
		c = host_find(e, ph);
	}
	while (depth-- > 0) {
		c = e->hpath[depth];
		if (out) {
			e->hvalid[c] = HV_OUT;
			continue;
		}
		if (host_digest(e, c)) /* its parent is published: the hash failed */
			return -1;
		e->hvalid[c] = 1;
		put_host_stored(e, c);
	}
	return 0;
}

static int snapshot_host(bkv_vllm_encoder *e)
{
	uint32_t h;
	int rc = 0;

	memset(e->hvalid, 0, e->nh);
	sort_demoting(e);
	for (h = 0; h < e->nh && !rc; h++)
		if (e->hvalid[h] == 0 && host_live(e->pool, (int32_t)h))
			rc = host_announce(e, (int32_t)h);
	for (h = 0; h < e->nh; h++)
		if (e->hvalid[h] == HV_OUT)
			e->hvalid[h] = 0;
	return rc;
}

/* Body := AllBlocksCleared + every indexed block, parents first, then the
 * host cache's blocks. */
static int snapshot(bkv_vllm_encoder *e)
{
	const bkv_pool *pool = e->pool;
	uint32_t b;

	e->body.n = 0;
	e->body.oom = 0;
	e->n_events = 0;
	e->n_group = 0;
	forget_all(e);
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
	if (e->nh && snapshot_host(e))
		return -1;
	e->resyncs++;
	return e->body.oom ? -1 : 0;
}

/* A published device block b leaves the index: remember it (digest and
 * parent digest) for the host STORED a demotion writes next. */
static void note_removed(bkv_vllm_encoder *e, int32_t b)
{
	int32_t p = e->ppid[b];

	e->rm_ok = 1;
	e->rm_nat = e->nat[b];
	memcpy(e->rm_dig, e->dig[b], 32);
	e->rm_par = p >= 0;
	if (p >= 0)
		memcpy(e->rm_pdig, e->valid[p] ? e->dig[p] : e->none, 32);
}

/* A host-cache event. A demoted block is published under the digest its
 * device copy had (the same content and chain), which the device REMOVED
 * just before it carried (only a host REMOVED, the block the demotion
 * dropped for room, may come between); one whose device copy was never
 * published, or that left the host before the drain, is left out with its
 * removal. */
static int translate_host(bkv_vllm_encoder *e, const bkv_kv_event *ev)
{
	const bkv_pool *pool = e->pool;
	int32_t h = ev->block;
	int was_rm = e->rm_ok;

	if (!e->nh || h < 0 || (uint32_t)h >= e->nh)
		return e->nh ? -1 : 0;
	if (ev->kind == BKV_EVENT_REMOVED) { /* (a demotion may drop one first) */
		if (e->hvalid[h] && e->hnat[h] == ev->hash) {
			e->hvalid[h] = 0;
			put_removed(e, e->hdig[h], e->cfg.host_medium);
		}
		return 0;
	}
	e->rm_ok = 0;
	if (!was_rm || e->rm_nat != ev->hash || pool->hc_hash[h] != ev->hash ||
	    (pool->host_state[h] != BKV__HOST_DEMOTING && pool->host_state[h] != BKV__HOST_CACHED))
		return 0;
	memcpy(e->hdig[h], e->rm_dig, 32);
	memcpy(e->hpdig[h], e->rm_pdig, 32);
	e->hpar[h] = (uint8_t)e->rm_par;
	e->hnat[h] = ev->hash;
	e->hvalid[h] = 1;
	put_host_stored(e, h);
	return 0;
}

/* Translate one drained pool event into body. -1: a snapshot is needed. */
static int translate(bkv_vllm_encoder *e, const bkv_kv_event *ev)
{
	const bkv_pool *pool = e->pool;
	int32_t b = ev->block;

	if (ev->medium == BKV_MEDIUM_HOST && ev->kind != BKV_EVENT_CLEARED)
		return translate_host(e, ev);
	e->rm_ok = 0;
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
		note_removed(e, b);
		e->valid[b] = 0;
		put_removed(e, e->dig[b], e->cfg.medium);
		return 0;
	case BKV_EVENT_CLEARED:
		forget_all(e);
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
	bkv__wbuf *m;
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
		bkv__mp_map(m, 2 + (e->cfg.data_parallel_rank >= 0));
		bkv__mp_str(m, "ts");
	} else {
		bkv__mp_array(m, 2 + (e->cfg.wire == BKV_VLLM_WIRE_ARRAY &&
				 e->cfg.data_parallel_rank >= 0));
	}
	bkv__mp_f64(m, ts);
	if (map)
		bkv__mp_str(m, "events");
	bkv__mp_array(m, e->n_events);
	bkv__wb_put(m, e->body.p, e->body.n);
	if (e->cfg.wire != BKV_VLLM_WIRE_ARRAY_V0 && e->cfg.data_parallel_rank >= 0) {
		if (map)
			bkv__mp_str(m, "data_parallel_rank");
		bkv__mp_uint(m, (uint64_t)e->cfg.data_parallel_rank);
	}
	if (m->oom) {
		e->need_resync = 1;
		return BKV_ENOMEM;
	}
	*msg = m->p;
	*len = m->n;
	return (int)e->n_events;
}
