/*
 * kvevents_dump.c - runs the events workload (examples/events/workload.c)
 * through a bkv_vllm_encoder and writes, on stdout, every encoded batch and
 * after each drain the pool's true index, for tests/kvevents_check.py to
 * decode with vLLM's schema.
 *
 * Records: 'B' u32le length, payload (one KVEventBatch); 'T' u32le n, n x 32
 * bytes (the digests of the indexed blocks, from evw_truth); at the end 'S'
 * six u64le counters: evictions, swap-out blocks, preemptions, swaps,
 * dropped pool events, encoder resyncs. Drains are skipped on steps 30..39,
 * so the 64-event ring overflows there.
 *
 * Usage: kvevents_dump WIRE HASH INT EXTRA DP GROUP KIND SEED
 *        kvevents_dump hash cbor|pickle SEED BLOCK_TOKENS LORA|- [SALT] < tokens
 *        kvevents_dump random WIRE HASH ROUNDS
 *   The random form runs ROUNDS random pool workloads instead (appends of
 *   few distinct tokens, forks, truncates, closes, drops, swaps, resets and
 *   step transactions through lib/internal.h, on a 24-block pool with a
 *   12-event ring; odd rounds with a host cache; keys 0, 7 and 9 named by
 *   evw_key_name and 5 unnamed), drains 1..3 operations
 *   apart and now and then up to 12
 *   (the ring overflows) and writes the same
 *   records, each workload opened by an 'R' record (a new, empty
 *   replica); its 'S' record counts stores and removals instead of
 *   evictions and swap-outs (then 0, 0, dropped, resyncs).
 *   The second form reads token ids (text) from stdin and prints each full
 *   block's bkv_vllm_block_hashes_salted digest (SALT the cache_salt, none
 *   when left out) in hex, one per line.
 *   WIRE map|array|array0, HASH native|cbor|pickle, INT 0|1, EXTRA 0|1, DP and
 *   GROUP an int (-1 omits), KIND a string ("-" omits), SEED PYTHONHASHSEED.
 */
#include "../examples/events/workload.h"
#include "pool_ops.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put32(uint32_t v)
{
	uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};

	fwrite(b, 1, 4, stdout);
}

static void put64(uint64_t v)
{
	put32((uint32_t)v);
	put32((uint32_t)(v >> 32));
}

static int hash_mode(char **argv)
{
	bkv_vllm_config vc;
	uint32_t bt = (uint32_t)atoi(argv[4]), n = 0, cap = 1024, nb, i, j;
	int32_t *tok = malloc(cap * sizeof *tok);
	uint8_t *dig;
	long v;

	bkv_vllm_config_init(&vc);
	vc.hash = strcmp(argv[2], "pickle") == 0 ? BKV_VLLM_HASH_SHA256 : BKV_VLLM_HASH_SHA256_CBOR;
	vc.hash_seed = argv[3];
	while (tok && scanf("%ld", &v) == 1) {
		if (n == cap)
			tok = realloc(tok, (cap *= 2) * sizeof *tok);
		if (tok)
			tok[n++] = (int32_t)v;
	}
	if (!tok || bt == 0)
		return 1;
	dig = malloc((size_t)(n / bt + 1) * BKV_VLLM_DIGEST_BYTES);
	nb = bkv_vllm_block_hashes_salted(&vc, strcmp(argv[5], "-") ? argv[5] : NULL,
					  argv[6], bt, tok, n, dig);
	if (nb != n / bt)
		return 1;
	for (i = 0; i < nb; i++) {
		for (j = 0; j < BKV_VLLM_DIGEST_BYTES; j++)
			printf("%02x", dig[(size_t)i * BKV_VLLM_DIGEST_BYTES + j]);
		printf("\n");
	}
	free(tok);
	free(dig);
	return 0;
}

static void put_batch_and_truth(bkv_vllm_encoder *enc, bkv_pool *p, const bkv_vllm_config *vc,
				uint8_t *truth, uint32_t nb, double ts)
{
	const uint8_t *msg;
	size_t len;
	uint32_t n;
	int rc = bkv_vllm_encoder_drain(enc, p, ts, &msg, &len);

	if (rc < 0) {
		fprintf(stderr, "encode: %s\n", bkv_strerror(rc));
		exit(1);
	}
	if (len) {
		fputc('B', stdout);
		put32((uint32_t)len);
		fwrite(msg, 1, len, stdout);
	}
	n = evw_pool_truth(p, 0, vc, truth, nb); /* the pools keep hash_seed 0 */
	fputc('T', stdout);
	put32(n);
	fwrite(truth, BKV_VLLM_DIGEST_BYTES, n, stdout);
}

static int random_mode(char **argv)
{
	bkv_vllm_config vc;
	uint32_t rounds = (uint32_t)atoi(argv[4]), round;
	uint64_t stored = 0, removed = 0, dropped = 0, resyncs = 0;
	uint8_t truth[24 * BKV_VLLM_DIGEST_BYTES];

	bkv_vllm_config_init(&vc);
	vc.wire = strcmp(argv[2], "array") == 0    ? BKV_VLLM_WIRE_ARRAY
		  : strcmp(argv[2], "array0") == 0 ? BKV_VLLM_WIRE_ARRAY_V0
						   : BKV_VLLM_WIRE_MAP;
	vc.hash = strcmp(argv[3], "native") == 0   ? BKV_VLLM_HASH_NATIVE
		  : strcmp(argv[3], "pickle") == 0 ? BKV_VLLM_HASH_SHA256
						   : BKV_VLLM_HASH_SHA256_CBOR;
	vc.key_name = evw_key_name;
	for (round = 0; round < rounds; round++) {
		bkv_pool_config c;
		bkv_pool *p = NULL;
		bkv_vllm_encoder *enc = NULL;
		bkv_pool_stats ps;
		uint32_t seqs[8] = {0}, op, next_drain = 1;
		int txn = 0;
		static const uint64_t keys[4] = {0, 7, 9, 5};

		bkv_pool_config_init(&c);
		c.block_tokens = 4;
		c.device_blocks = 24;
		c.host_blocks = 16;
		c.host_cache = round & 1; /* odd rounds demote evictions to the host */
		c.max_seqs = 64;
		c.event_capacity = 12;
		if (bkv_pool_create(&c, NULL, &p) || bkv_vllm_encoder_create(&vc, p, NULL, &enc))
			return 1;
		fputc('R', stdout); /* a new replica: the subscriber starts empty */
		srand(round + 1);
		for (op = 0; op < 400; op++) {
			if (pool_random_op(p, seqs, &txn, keys, 4))
				continue;
			if (txn || op + 1 < next_drain)
				continue; /* inside a transaction the index waits for commit */
			put_batch_and_truth(enc, p, &vc, truth, 24, (double)op);
			{
				uint32_t span = rand() % 8 ? 3 : 12; /* drawn first */

				next_drain = op + 1 + 1 + (uint32_t)rand() % span;
			}
		}
		if (txn)
			bkv__pool_txn_commit(p);
		put_batch_and_truth(enc, p, &vc, truth, 24, 400.0);
		ps.size = sizeof ps;
		bkv_pool_stats_get(p, &ps);
		stored += ps.events; /* all pool events, for the coverage check */
		removed += ps.evictions;
		dropped += ps.events_dropped;
		resyncs += bkv_vllm_encoder_resyncs(enc);
		bkv_vllm_encoder_destroy(enc);
		bkv_pool_destroy(p);
	}
	fputc('S', stdout);
	put64(stored);
	put64(removed);
	put64(0);
	put64(0);
	put64(dropped);
	put64(resyncs);
	return fflush(stdout) != 0;
}

int main(int argc, char **argv)
{
	bkv_vllm_config vc;
	bkv_vllm_encoder *enc = NULL;
	bkv_pool_stats ps;
	bkv_sched_stats ss;
	uint8_t *truth;
	evw w;
	int more, rc;
	double ts = 1700000000.0;

	if ((argc == 6 || argc == 7) && strcmp(argv[1], "hash") == 0)
		return hash_mode(argv);
	if (argc == 5 && strcmp(argv[1], "random") == 0)
		return random_mode(argv);
	if (argc != 9)
		return fprintf(stderr, "usage: kvevents_dump WIRE HASH INT EXTRA DP GROUP KIND SEED\n"), 2;
	bkv_vllm_config_init(&vc);
	vc.wire = strcmp(argv[1], "array") == 0    ? BKV_VLLM_WIRE_ARRAY
		  : strcmp(argv[1], "array0") == 0 ? BKV_VLLM_WIRE_ARRAY_V0
						   : BKV_VLLM_WIRE_MAP;
	vc.hash = strcmp(argv[2], "native") == 0   ? BKV_VLLM_HASH_NATIVE
		  : strcmp(argv[2], "pickle") == 0 ? BKV_VLLM_HASH_SHA256
						   : BKV_VLLM_HASH_SHA256_CBOR;
	vc.int_hashes = (uint32_t)atoi(argv[3]);
	vc.extra_keys = (uint32_t)atoi(argv[4]);
	vc.data_parallel_rank = atoi(argv[5]);
	vc.group_idx = atoi(argv[6]);
	vc.spec_kind = strcmp(argv[7], "-") ? argv[7] : NULL;
	vc.hash_seed = argv[8];
	vc.key_name = evw_key_name;

	if (evw_create(&w, (uint32_t)(getenv("EVW_RING") ? atoi(getenv("EVW_RING")) : 64), 160, 42) != 0)
		return fprintf(stderr, "evw_create failed\n"), 1;
	if ((rc = bkv_vllm_encoder_create(&vc, w.pool, NULL, &enc)) != BKV_OK)
		return fprintf(stderr, "encoder: %s\n", bkv_strerror(rc)), 1;
	ps.size = sizeof ps;
	bkv_pool_stats_get(w.pool, &ps);
	truth = malloc((size_t)ps.device_blocks * BKV_VLLM_DIGEST_BYTES);
	do {
		more = evw_step(&w);
		if (more < 0)
			return fprintf(stderr, "step %u: %s\n", w.step, bkv_strerror(more)), 1;
		if (w.step >= 30 && w.step < 40 && more)
			continue;
		{
			const uint8_t *msg;
			size_t len;
			uint32_t n;

			rc = bkv_vllm_encoder_drain(enc, w.pool, ts + w.step * 0.25, &msg, &len);
			if (rc < 0)
				return fprintf(stderr, "encode: %s\n", bkv_strerror(rc)), 1;
			if (len) {
				fputc('B', stdout);
				put32((uint32_t)len);
				fwrite(msg, 1, len, stdout);
			}
			n = evw_truth(&w, &vc, truth, ps.device_blocks);
			fputc('T', stdout);
			put32(n);
			fwrite(truth, BKV_VLLM_DIGEST_BYTES, n, stdout);
		}
	} while (more);
	ps.size = sizeof ps;
	bkv_pool_stats_get(w.pool, &ps);
	ss.size = sizeof ss;
	bkv_sched_stats_get(w.sched, &ss);
	fputc('S', stdout);
	put64(ps.evictions);
	put64(ps.swap_out_blocks);
	put64(ss.preemptions);
	put64(ss.swaps);
	put64(ps.events_dropped);
	put64(bkv_vllm_encoder_resyncs(enc));
	free(truth);
	bkv_vllm_encoder_destroy(enc);
	evw_destroy(&w);
	return fflush(stdout) != 0;
}
