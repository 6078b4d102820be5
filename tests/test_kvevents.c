/*
 * test_kvevents.c - the vLLM event encoder (lib/events/encoder.c) on hand-built
 * cases: exact bytes of small batches in both layouts, written out by hand
 * from vLLM's structs; chains sharing one BlockStored; a block stored and
 * evicted between two drains left out; a ring overflow turned into a
 * snapshot; argument checks. tests/kvevents_check.py decodes long runs with
 * an independent msgpack, CBOR and pickle.
 */
#include "batchkv.h"
#include "pool_util.h"

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

static bkv_pool *ev_pool(uint32_t bt, uint32_t nb, uint32_t ring)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = bt;
	c.device_blocks = nb;
	c.max_seqs = 8;
	c.event_capacity = ring;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

static bkv_vllm_encoder *native_encoder(bkv_pool *p, uint32_t wire)
{
	bkv_vllm_config vc;
	bkv_vllm_encoder *e = NULL;

	bkv_vllm_config_init(&vc);
	vc.hash = BKV_VLLM_HASH_NATIVE;
	vc.wire = wire;
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, &e), BKV_OK);
	return e;
}

/* A byte string under construction (the expected message). */
typedef struct exp_buf {
	uint8_t b[512];
	size_t n;
} exp_buf;

static void x(exp_buf *e, const char *bytes, size_t n)
{
	memcpy(e->b + e->n, bytes, n);
	e->n += n;
}

#define X(e, lit) x((e), (lit), sizeof(lit) - 1)

/* msgpack uint64 (0xcf): every native hash in these cases is >= 2^32. */
static void x_u64(exp_buf *e, uint64_t v)
{
	cr_assert_geq(v, (uint64_t)1 << 32, "case assumes a 9-byte hash");
	e->b[e->n++] = 0xcf;
	for (int i = 0; i < 8; i++)
		e->b[e->n++] = (uint8_t)(v >> (56 - 8 * i));
}

static void expect_bytes(const uint8_t *got, size_t len, const exp_buf *want)
{
	cr_assert_eq(len, want->n, "length %zu, want %zu", len, want->n);
	for (size_t i = 0; i < len; i++)
		cr_assert_eq(got[i], want->b[i], "byte %zu: %02x, want %02x", i, got[i], want->b[i]);
}

Test(kvevents, two_chained_blocks_are_one_block_stored_map_layout)
{
	bkv_pool *p = ev_pool(2, 4, 16);
	bkv_vllm_encoder *e = native_encoder(p, BKV_VLLM_WIRE_MAP);
	int32_t t[4] = {1, 2, 3, 4};
	uint64_t h[2];
	uint32_t s, hit;
	const uint8_t *msg;
	size_t len;
	exp_buf w = {{0}, 0};

	cr_assert_eq(bkv_block_hashes(0, 0, 2, t, 4, h), 2);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 4, &hit), BKV_OK);
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 1);
	/* {"ts": 0.5, "events": [{"type": "BlockStored", "block_hashes": [h0, h1],
	 *  "parent_block_hash": nil, "token_ids": [1,2,3,4], "block_size": 2,
	 *  "lora_id": nil, "medium": "GPU", "lora_name": nil}]} */
	X(&w, "\x82\xa2ts\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00\xa6" "events\x91\x88");
	X(&w, "\xa4type\xab" "BlockStored\xac" "block_hashes\x92");
	x_u64(&w, h[0]);
	x_u64(&w, h[1]);
	X(&w, "\xb1parent_block_hash\xc0\xa9token_ids\x94\x01\x02\x03\x04");
	X(&w, "\xaa" "block_size\x02\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0");
	expect_bytes(msg, len, &w);
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 0, "nothing new: no batch");
	cr_assert_eq(len, 0);
	cr_assert_null(msg);

	/* reset: {"ts": 1.0, "events": [{"type": "AllBlocksCleared"}]} */
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 1.0, &msg, &len), 1);
	w.n = 0;
	X(&w, "\x82\xa2ts\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\xa6" "events\x91\x81");
	X(&w, "\xa4type\xb0" "AllBlocksCleared");
	expect_bytes(msg, len, &w);
	cr_assert_eq(bkv_vllm_encoder_resyncs(e), 0);
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

Test(kvevents, array_layouts_are_the_array_like_structs)
{
	bkv_pool *p = ev_pool(2, 4, 16);
	bkv_vllm_encoder *e0 = native_encoder(p, BKV_VLLM_WIRE_ARRAY_V0);
	bkv_vllm_config vc;
	bkv_vllm_encoder *e1 = NULL;
	int32_t t[2] = {200, 300};
	uint64_t h[1];
	uint32_t s, hit;
	const uint8_t *msg;
	size_t len;
	exp_buf w = {{0}, 0};

	bkv_vllm_config_init(&vc);
	vc.hash = BKV_VLLM_HASH_NATIVE;
	vc.wire = BKV_VLLM_WIRE_ARRAY;
	vc.data_parallel_rank = 2;
	/* a second encoder on the same pool sees the same blocks (the first
	 * one drains, so it snapshots; compare its first batch below) */
	cr_assert_eq(bkv_block_hashes(0, 0, 2, t, 2, h), 1);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 2, &hit), BKV_OK);
	cr_assert_eq(bkv_vllm_encoder_drain(e0, p, 2.0, &msg, &len), 1);
	/* V0: [2.0, [["BlockStored", [h0], nil, [200, 300], 2, nil]]] */
	X(&w, "\x92\xcb\x40\x00\x00\x00\x00\x00\x00\x00\x91\x96\xab" "BlockStored\x91");
	x_u64(&w, h[0]);
	X(&w, "\xc0\x92\xcc\xc8\xcd\x01\x2c\x02\xc0");
	expect_bytes(msg, len, &w);

	/* ARRAY, created after events were emitted: its first batch is a
	 * snapshot. [2.0, [["AllBlocksCleared"], ["BlockStored", [h0], nil,
	 * [200, 300], 2, nil, "GPU", nil]], 2] */
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, &e1), BKV_OK);
	cr_assert_eq(bkv_vllm_encoder_drain(e1, p, 2.0, &msg, &len), 2);
	w.n = 0;
	X(&w, "\x93\xcb\x40\x00\x00\x00\x00\x00\x00\x00\x92\x91\xb0" "AllBlocksCleared");
	X(&w, "\x98\xab" "BlockStored\x91");
	x_u64(&w, h[0]);
	X(&w, "\xc0\x92\xcc\xc8\xcd\x01\x2c\x02\xc0\xa3GPU\xc0\x02");
	expect_bytes(msg, len, &w);
	bkv_vllm_encoder_destroy(e0);
	bkv_vllm_encoder_destroy(e1);
	bkv_pool_destroy(p);
}

Test(kvevents, block_stored_and_evicted_between_drains_is_left_out)
{
	bkv_pool *p = ev_pool(2, 2, 16);
	bkv_vllm_encoder *e = native_encoder(p, BKV_VLLM_WIRE_MAP);
	int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
	uint64_t hb[2];
	uint32_t s1, s2, hit;
	const uint8_t *msg;
	size_t len;
	exp_buf w = {{0}, 0};

	cr_assert_eq(bkv_block_hashes(0, 0, 2, b, 4, hb), 2);
	cr_assert_eq(bkv_seq_open(p, &s1), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s1, a, 4, &hit), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s1), BKV_OK); /* both blocks cached */
	cr_assert_eq(bkv_seq_open(p, &s2), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s2, b, 4, &hit), BKV_OK); /* evicts both */
	/* pool events: STORED a0, a1, REMOVED x2, STORED b0, b1; a's blocks now
	 * hold b's tokens, so only b's store goes out */
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 1);
	X(&w, "\x82\xa2ts\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00\xa6" "events\x91\x88");
	X(&w, "\xa4type\xab" "BlockStored\xac" "block_hashes\x92");
	x_u64(&w, hb[0]);
	x_u64(&w, hb[1]);
	X(&w, "\xb1parent_block_hash\xc0\xa9token_ids\x94\x05\x06\x07\x08");
	X(&w, "\xaa" "block_size\x02\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0");
	expect_bytes(msg, len, &w);

	/* evicted after a drain: one BlockRemoved per block, oldest first */
	cr_assert_eq(bkv_seq_close(p, s2), BKV_OK);
	cr_assert_eq(bkv_seq_open(p, &s1), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s1, a, 2, &hit), BKV_OK);
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 2);
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

/* Occurrences of the n bytes at pat in msg. */
static uint32_t count_bytes(const uint8_t *msg, size_t len, const void *pat, size_t n)
{
	uint32_t c = 0;

	for (size_t i = 0; i + n <= len; i++)
		c += memcmp(msg + i, pat, n) == 0;
	return c;
}

/* Where pat first occurs in msg (len when it does not). */
static size_t first_at(const uint8_t *msg, size_t len, const void *pat, size_t n)
{
	for (size_t i = 0; i + n <= len; i++)
		if (memcmp(msg + i, pat, n) == 0)
			return i;
	return len;
}

/* A sequence of the n tokens t opened, filled and closed (its full blocks
 * stay cached). */
static void fill_and_close(bkv_pool *p, const int32_t *t, uint32_t n)
{
	uint32_t s, hit;

	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n, &hit), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
}

/* A host cache (bkv_pool_config.host_cache): a block the device evicts is
 * published again on the host medium ("CPU") under the hash its device
 * copy had, and the host's drops are BlockRemoved on that medium. */
Test(kvevents, host_cache_blocks_are_published_on_the_host_medium)
{
	bkv_pool *p;
	bkv_vllm_encoder *e;
	int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, d[4] = {9, 10, 11, 12};
	uint64_t ha[2];
	uint8_t h8[9];
	const uint8_t *msg;
	size_t len;
	static const char cpu[] = "\xa6medium\xa3" "CPU", gpu_rm[] = "\xac" "BlockRemoved";

	p = make_hc_pool(2, 2, 2, 64);
	e = native_encoder(p, BKV_VLLM_WIRE_MAP);
	cr_assert_eq(bkv_block_hashes(0, 0, 2, a, 4, ha), 2);
	fill_and_close(p, a, 4);
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 1); /* a on GPU */
	cr_assert_eq(count_bytes(msg, len, cpu, sizeof cpu - 1), 0);
	/* b evicts a: each of a's blocks removed from GPU, stored on CPU */
	fill_and_close(p, b, 4);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_gt(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 0);
	cr_assert_eq(count_bytes(msg, len, cpu, sizeof cpu - 1), 2);
	cr_assert_eq(count_bytes(msg, len, gpu_rm, sizeof gpu_rm - 1), 2);
	for (int i = 0; i < 2; i++) { /* each of a's hashes: GPU removed, CPU stored */
		h8[0] = 0xcf;
		for (int j = 0; j < 8; j++)
			h8[1 + j] = (uint8_t)(ha[i] >> (56 - 8 * j));
		cr_assert_eq(count_bytes(msg, len, h8, 9), 2 + (i == 0), "hash of a%d", i);
	}
	/* d evicts b: b goes to the host, which drops a for it (CPU removed) */
	fill_and_close(p, d, 4);
	cr_assert_gt(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 0);
	cr_assert_eq(count_bytes(msg, len, cpu, sizeof cpu - 1), 4, "2 CPU stores, 2 CPU removals");
	cr_assert_eq(count_bytes(msg, len, gpu_rm, sizeof gpu_rm - 1), 4);
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

/* ARRAY_V0 has no medium field: a host block's events would read as the
 * device's, so that layout publishes the device tier alone (a demotion is
 * the device's BlockRemoved, the host's drops are not sent). */
Test(kvevents, the_first_array_layout_publishes_the_device_tier_alone)
{
	bkv_pool *p;
	bkv_vllm_encoder *e;
	int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, d[4] = {9, 10, 11, 12};
	const uint8_t *msg;
	size_t len;
	static const char st[] = "\xab" "BlockStored", rm[] = "\xac" "BlockRemoved";

	p = make_hc_pool(2, 2, 2, 64);
	e = native_encoder(p, BKV_VLLM_WIRE_ARRAY_V0);
	fill_and_close(p, a, 4);
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 1); /* a's chain */
	fill_and_close(p, b, 4); /* b evicts a to the host */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(pool_stats(p).host_cached, 2, "a is on the host");
	/* per block: a's REMOVED, then b's STORED (no chain of two) */
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 4);
	cr_assert_eq(count_bytes(msg, len, st, sizeof st - 1), 2, "b0, b1; a not stored again");
	cr_assert_eq(count_bytes(msg, len, rm, sizeof rm - 1), 2, "a0, a1");
	fill_and_close(p, d, 4); /* b to the host, which drops a for it */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 4);
	cr_assert_eq(count_bytes(msg, len, st, sizeof st - 1), 2, "d0, d1; b not stored again");
	cr_assert_eq(count_bytes(msg, len, rm, sizeof rm - 1), 2, "b0, b1; a's host drops not sent");
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

/* The 9-byte msgpack uint64 of a digest's int (int_hashes). */
static void digest_u64(const uint8_t *d, uint8_t out[9])
{
	uint64_t v = bkv_vllm_hash_int(d);

	out[0] = 0xcf;
	for (int j = 0; j < 8; j++)
		out[1 + j] = (uint8_t)(v >> (56 - 8 * j));
}

/* Keys without a name (no key_name here) hash as vLLM's cache_salt, the
 * key's decimal digits on a chain's first block: equal tokens under keys 0,
 * 5 and 6 are three chains of distinct digests, each what
 * bkv_vllm_block_hashes_salted gives a router. */
Test(kvevents, unnamed_keys_give_equal_tokens_distinct_digests)
{
	bkv_pool *p = ev_pool(2, 8, 64);
	bkv_vllm_config vc;
	bkv_vllm_encoder *e = NULL;
	int32_t t[4] = {1, 2, 3, 4};
	static const uint64_t keys[3] = {0, 5, 6};
	static const char *const salts[3] = {NULL, "5", "6"};
	uint8_t d[3][2][BKV_VLLM_DIGEST_BYTES], h8[9];
	const uint8_t *msg;
	size_t len;
	uint32_t s, hit, i, j;

	bkv_vllm_config_init(&vc);
	vc.extra_keys = 1;
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, &e), BKV_OK);
	for (i = 0; i < 3; i++) {
		cr_assert_eq(bkv_seq_open_keyed(p, keys[i], &s), BKV_OK);
		cr_assert_eq(bkv_seq_append(p, s, t, 4, &hit), BKV_OK);
		cr_assert_eq(hit, 0, "keys never share blocks");
		cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
		cr_assert_eq(bkv_vllm_block_hashes_salted(&vc, NULL, salts[i], 2, t, 4, d[i][0]), 2);
	}
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 3, "one chain per key");
	for (i = 0; i < 3; i++)
		for (j = 0; j < 2; j++) {
			digest_u64(d[i][j], h8);
			cr_assert_eq(count_bytes(msg, len, h8, 9), 1, "key %u block %u", i, j);
		}
	/* extra_keys: the salt on the first block alone */
	cr_assert_eq(count_bytes(msg, len, "\x92\x91\xa1" "5\xc0", 5), 1);
	cr_assert_eq(count_bytes(msg, len, "\x92\x91\xa1" "6\xc0", 5), 1);
	cr_assert_eq(count_bytes(msg, len, "\x92\xc0\xc0", 3), 1, "key 0: none");
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

Test(kvevents, ring_overflow_becomes_a_snapshot)
{
	bkv_pool *p = ev_pool(2, 4, 1);
	bkv_vllm_encoder *e = native_encoder(p, BKV_VLLM_WIRE_MAP);
	int32_t t[4] = {1, 2, 3, 4};
	uint64_t h[2];
	uint32_t s, hit;
	const uint8_t *msg;
	size_t len;
	exp_buf w = {{0}, 0};

	cr_assert_eq(bkv_block_hashes(0, 0, 2, t, 4, h), 2);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 4, &hit), BKV_OK); /* the 2nd event drops */
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 2);
	X(&w, "\x82\xa2ts\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00\xa6" "events\x92");
	X(&w, "\x81\xa4type\xb0" "AllBlocksCleared\x88");
	X(&w, "\xa4type\xab" "BlockStored\xac" "block_hashes\x92");
	x_u64(&w, h[0]);
	x_u64(&w, h[1]);
	X(&w, "\xb1parent_block_hash\xc0\xa9token_ids\x94\x01\x02\x03\x04");
	X(&w, "\xaa" "block_size\x02\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0");
	expect_bytes(msg, len, &w);
	cr_assert_eq(bkv_vllm_encoder_resyncs(e), 1);
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

/* A ring overflow after demotions: the snapshot announces the device's
 * blocks, then the host cache's, parents first, under the hashes their
 * device copies had (native hashes are the pool's). */
Test(kvevents, a_snapshot_reannounces_the_host_cache_blocks)
{
	bkv_pool *p;
	bkv_vllm_encoder *e;
	int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
	uint64_t ha[2], hb[2];
	uint8_t h8[2][9];
	uint32_t i;
	const uint8_t *msg;
	size_t len;
	static const char cpu[] = "\xa6medium\xa3" "CPU", gpu[] = "\xa6medium\xa3" "GPU",
			  cleared[] = "AllBlocksCleared";

	p = make_hc_pool(2, 2, 2, 2); /* a's two stores fill the ring: b's events overflow */
	e = native_encoder(p, BKV_VLLM_WIRE_MAP);
	cr_assert_eq(bkv_block_hashes(0, 0, 2, a, 4, ha), 2);
	cr_assert_eq(bkv_block_hashes(0, 0, 2, b, 4, hb), 2);
	fill_and_close(p, a, 4);
	fill_and_close(p, b, 4); /* b evicts a to the host */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_gt(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 0);
	cr_assert_eq(bkv_vllm_encoder_resyncs(e), 1, "the ring overflowed");
	cr_assert_eq(count_bytes(msg, len, cleared, sizeof cleared - 1), 1);
	cr_assert_eq(count_bytes(msg, len, gpu, sizeof gpu - 1), 1, "b's chain, one event");
	cr_assert_eq(count_bytes(msg, len, cpu, sizeof cpu - 1), 2, "a's blocks, one each");
	for (i = 0; i < 2; i++) {
		h8[i][0] = 0xcf;
		for (int j = 0; j < 8; j++)
			h8[i][1 + j] = (uint8_t)(ha[i] >> (56 - 8 * j));
	}
	/* a0 stored once and named once as a1's parent; a1 stored once */
	cr_assert_eq(count_bytes(msg, len, h8[0], 9), 2);
	cr_assert_eq(count_bytes(msg, len, h8[1], 9), 1);
	cr_assert_lt(first_at(msg, len, h8[0], 9), first_at(msg, len, h8[1], 9),
		     "parents first: a0's store before a1's");
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 0, "nothing new since");
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

/* A host block cached before its parent was demoted: at the snapshot the
 * parent is still demoting (its copy pending, so not in the host index),
 * and both are announced, the parent first. */
Test(kvevents, a_snapshot_announces_a_host_block_under_a_demoting_parent)
{
	bkv_pool *p;
	bkv_vllm_encoder *e;
	int32_t a[4] = {1, 2, 3, 4}, z[4] = {9, 10, 11, 12}, w[2] = {20, 21};
	uint64_t ha[2];
	uint8_t h8[2][9];
	uint32_t y, zs, ws, hit, i;
	const uint8_t *msg;
	size_t len;
	static const char cpu[] = "\xa6medium\xa3" "CPU";

	p = make_hc_pool(2, 3, 4, 2); /* the ring overflows: the drain is a snapshot */
	e = native_encoder(p, BKV_VLLM_WIRE_MAP);
	cr_assert_eq(bkv_block_hashes(0, 0, 2, a, 4, ha), 2);
	fill_and_close(p, a, 4); /* a0, a1 cached */
	cr_assert_eq(bkv_seq_open(p, &y), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, y, a, 2, &hit), BKV_OK); /* pins a0 */
	cr_assert_eq(hit, 2);
	cr_assert_eq(bkv_seq_open(p, &zs), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, zs, z, 4, &hit), BKV_OK); /* evicts a1 */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT); /* a1 cached on the host */
	cr_assert_eq(bkv_seq_close(p, y), BKV_OK); /* a0 cached, z pinned */
	cr_assert_eq(bkv_seq_open(p, &ws), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, ws, w, 2, &hit), BKV_OK); /* evicts a0 */
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len) > 0, 1);
	cr_assert_eq(bkv_vllm_encoder_resyncs(e), 1, "the ring overflowed");
	for (i = 0; i < 2; i++) {
		h8[i][0] = 0xcf;
		for (int j = 0; j < 8; j++)
			h8[i][1 + j] = (uint8_t)(ha[i] >> (56 - 8 * j));
	}
	cr_assert_eq(count_bytes(msg, len, cpu, sizeof cpu - 1), 2, "a0 (demoting), a1 (cached)");
	cr_assert_eq(count_bytes(msg, len, h8[1], 9), 1, "a1 announced");
	cr_assert_lt(first_at(msg, len, h8[0], 9), first_at(msg, len, h8[1], 9),
		     "parents first: a0's store before a1's");
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

Test(kvevents, optional_fields_follow_the_config)
{
	bkv_pool *p = ev_pool(1, 4, 16);
	bkv_vllm_config vc;
	bkv_vllm_encoder *e = NULL;
	int32_t t[1] = {9};
	uint32_t s, hit;
	const uint8_t *msg;
	size_t len;
	uint8_t d[32];
	exp_buf w = {{0}, 0};

	bkv_vllm_config_init(&vc);
	vc.int_hashes = 0; /* 32-byte digests */
	vc.data_parallel_rank = 1;
	vc.group_idx = 0;
	vc.spec_kind = "full_attention";
	vc.sliding_window = 128;
	vc.extra_keys = 1;
	vc.medium = NULL;
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, &e), BKV_OK);
	cr_assert_eq(bkv_vllm_block_hashes(&vc, NULL, 1, t, 1, d), 1);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, 1, &hit), BKV_OK);
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0.5, &msg, &len), 1);
	X(&w, "\x83\xa2ts\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00\xa6" "events\x91\x8c");
	X(&w, "\xa4type\xab" "BlockStored\xac" "block_hashes\x91\xc4\x20");
	x(&w, (const char *)d, 32);
	X(&w, "\xb1parent_block_hash\xc0\xa9token_ids\x91\x09");
	X(&w, "\xaa" "block_size\x01\xa7lora_id\xc0\xa6medium\xc0\xa9lora_name\xc0");
	X(&w, "\xaa" "extra_keys\x91\xc0\xa9group_idx\x00");
	X(&w, "\xb2kv_cache_spec_kind\xae" "full_attention");
	X(&w, "\xbckv_cache_spec_sliding_window\xcc\x80");
	X(&w, "\xb2" "data_parallel_rank\x01");
	expect_bytes(msg, len, &w);
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
}

Test(kvevents, bad_arguments_are_refused)
{
	bkv_pool *p = ev_pool(2, 4, 16), *quiet = ev_pool(2, 4, 0);
	bkv_vllm_config vc;
	bkv_vllm_encoder *e = NULL;
	char longseed[300];
	int32_t t[2] = {1, 2};
	uint8_t d[32];
	const uint8_t *msg;
	size_t len;

	bkv_vllm_config_init(&vc);
	cr_assert_eq(bkv_vllm_encoder_create(NULL, p, NULL, &e), BKV_EINVAL);
	cr_assert_eq(bkv_vllm_encoder_create(&vc, NULL, NULL, &e), BKV_EINVAL);
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_vllm_encoder_create(&vc, quiet, NULL, &e), BKV_EINVAL, "events off");
	vc.wire = 3;
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, &e), BKV_EINVAL);
	bkv_vllm_config_init(&vc);
	vc.hash_seed = NULL;
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, &e), BKV_EINVAL);
	cr_assert_eq(bkv_vllm_block_hashes(&vc, NULL, 2, t, 2, d), 0);
	memset(longseed, 'a', sizeof longseed - 1);
	longseed[sizeof longseed - 1] = 0;
	vc.hash_seed = longseed;
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, &e), BKV_EINVAL);
	bkv_vllm_config_init(&vc);
	vc.hash = BKV_VLLM_HASH_NATIVE;
	cr_assert_eq(bkv_vllm_block_hashes(&vc, NULL, 2, t, 2, d), 0, "native: bkv_block_hashes");
	vc.hash = BKV_VLLM_HASH_SHA256_CBOR;
	cr_assert_eq(bkv_vllm_block_hashes(&vc, NULL, 0, t, 2, d), 0);
	cr_assert_eq(bkv_vllm_block_hashes(&vc, NULL, 2, t, 1, NULL), 0, "no full block");
	cr_assert_eq(bkv_vllm_encoder_create(&vc, p, NULL, &e), BKV_OK);
	cr_assert_eq(bkv_vllm_encoder_drain(e, quiet, 0, &msg, &len), BKV_EINVAL, "another pool");
	cr_assert_eq(bkv_vllm_encoder_drain(e, p, 0, NULL, &len), BKV_EINVAL);
	cr_assert_eq(bkv_vllm_encoder_drain(NULL, p, 0, &msg, &len), BKV_EINVAL);
	bkv_vllm_encoder_destroy(e);
	bkv_vllm_encoder_destroy(NULL);
	cr_assert_eq(bkv_vllm_encoder_resyncs(NULL), 0);
	bkv_pool_destroy(p);
	bkv_pool_destroy(quiet);
}

Test(kvevents, hash_int_is_the_last_eight_bytes_big_endian)
{
	uint8_t d[32];

	for (int i = 0; i < 32; i++)
		d[i] = (uint8_t)i;
	cr_assert_eq(bkv_vllm_hash_int(d), 0x18191a1b1c1d1e1full);
	cr_assert_eq(bkv_vllm_hash_int(NULL), 0);
}

/* A counting allocator that fails allocation number fail_at (1-based; 0 =
 * never), Lua's Memcontrol idea. */
typedef struct failing {
	long n;       /* allocations and reallocations so far */
	long fail_at; /* the one to fail */
	long live;    /* bytes held */
} failing;

static void *f_alloc(void *ud, size_t size)
{
	failing *f = ud;
	void *p;

	if (++f->n == f->fail_at)
		return NULL;
	p = malloc(size);
	if (p)
		f->live += (long)size;
	return p;
}

static void *f_realloc(void *ud, void *p, size_t old, size_t size)
{
	failing *f = ud;
	void *q;

	if (++f->n == f->fail_at)
		return NULL;
	q = realloc(p, size);
	if (q)
		f->live += (long)size - (long)old;
	return q;
}

static void f_free(void *ud, void *p, size_t size)
{
	failing *f = ud;

	if (p)
		f->live -= (long)size;
	free(p);
}

Test(kvevents, every_failed_allocation_is_enomem_and_the_next_encode_resyncs)
{
	int32_t t[64];
	long k;
	int done = 0;

	for (int i = 0; i < 64; i++)
		t[i] = 1000 + i;
	for (k = 1; !done && k < 200; k++) {
		failing f = {0, k, 0};
		bkv_allocator a = {f_alloc, f_realloc, f_free, &f};
		bkv_pool *p = ev_pool(2, 64, 256);
		bkv_vllm_config vc;
		bkv_vllm_encoder *e = NULL;
		const uint8_t *msg;
		size_t len;
		uint32_t s, hit;
		int rc;

		bkv_vllm_config_init(&vc);
		rc = bkv_vllm_encoder_create(&vc, p, &a, &e);
		if (rc != BKV_OK) {
			cr_assert_eq(rc, BKV_ENOMEM, "allocation %ld: %d", k, rc);
			cr_assert_null(e);
			cr_assert_eq(f.live, 0, "allocation %ld: create leaked %ld bytes", k, f.live);
			bkv_pool_destroy(p);
			continue;
		}
		cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
		cr_assert_eq(bkv_seq_append(p, s, t, 64, &hit), BKV_OK); /* 32 blocks */
		rc = bkv_vllm_encoder_drain(e, p, 1.0, &msg, &len);
		if (rc == BKV_ENOMEM) {
			/* the events are lost; the next call resynchronises */
			rc = bkv_vllm_encoder_drain(e, p, 1.0, &msg, &len);
			cr_assert_eq(rc, 2, "allocation %ld: %d, want AllBlocksCleared + one BlockStored", k, rc);
			cr_assert_eq(bkv_vllm_encoder_resyncs(e), 1);
		} else if (f.n >= f.fail_at) {
			/* a hash input failed to grow: recovered by a snapshot at once */
			cr_assert_eq(rc, 2, "allocation %ld: %d", k, rc);
			cr_assert_eq(bkv_vllm_encoder_resyncs(e), 1);
		} else {
			cr_assert_eq(rc, 1, "allocation %ld: %d", k, rc);
			cr_assert_eq(bkv_vllm_encoder_resyncs(e), 0);
			done = 1; /* no allocation left to fail */
		}
		cr_assert_gt(len, 32 * 9);
		bkv_vllm_encoder_destroy(e);
		cr_assert_eq(f.live, 0, "allocation %ld: %ld bytes leaked", k, f.live);
		bkv_pool_destroy(p);
	}
	cr_assert(done, "the encoder still failed after %ld allocations", k);
}
