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
 *        kvevents_dump hash cbor|pickle SEED BLOCK_TOKENS LORA|- < tokens
 *   The second form reads token ids (text) from stdin and prints each full
 *   block's bkv_vllm_block_hashes digest in hex, one per line.
 *   WIRE map|array|array0, HASH native|cbor|pickle, INT 0|1, EXTRA 0|1, DP and
 *   GROUP an int (-1 omits), KIND a string ("-" omits), SEED PYTHONHASHSEED.
 */
#include "../examples/events/workload.h"

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
	nb = bkv_vllm_block_hashes(&vc, strcmp(argv[5], "-") ? argv[5] : NULL, bt, tok, n, dig);
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

	if (argc == 6 && strcmp(argv[1], "hash") == 0)
		return hash_mode(argv);
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

			rc = bkv_vllm_encode(enc, w.pool, ts + w.step * 0.25, &msg, &len);
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
