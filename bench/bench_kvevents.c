/*
 * bench_kvevents.c - what vLLM-compatible KV events cost.
 *
 *   hash       per block of a 2,048-token prompt: the pool's own chained hash
 *              (bkv_block_hashes) against vLLM's sha256_cbor and sha256
 *              (pickle) digests (bkv_vllm_block_hashes), at block_tokens 16
 *              (vLLM's default) and 128.
 *   encode     per stored block, the whole bkv_vllm_encoder_drain of a step's
 *              events (drain, hash, msgpack), with the pool's own hashes and
 *              with sha256_cbor: a 2,048-token prompt is appended (128
 *              blocks stored, as many evicted from the previous round) and
 *              encoded, round after round.
 *
 * Best of 7 runs each.
 */
#include <batchkv.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define PROMPT 2048

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int32_t tok[PROMPT];
static uint64_t sink;

static double hash_ns(int kind, uint32_t bt, int iters)
{
	static uint64_t h[PROMPT];
	static uint8_t d[PROMPT * BKV_VLLM_DIGEST_BYTES];
	bkv_vllm_config vc;
	double best = 1e300;

	bkv_vllm_config_init(&vc);
	vc.hash = kind == 1 ? BKV_VLLM_HASH_SHA256_CBOR : BKV_VLLM_HASH_SHA256;
	for (int run = 0; run < 7; run++) {
		double t0 = now_ns();

		for (int i = 0; i < iters; i++) {
			tok[0] = i;
			if (kind == 0)
				sink += bkv_block_hashes(0, 0, bt, tok, PROMPT, h) + h[0];
			else
				sink += bkv_vllm_block_hashes(&vc, NULL, bt, tok, PROMPT, d) + d[0];
		}
		double ns = (now_ns() - t0) / ((double)iters * (PROMPT / bt));
		if (ns < best)
			best = ns;
	}
	return best;
}

static double encode_ns(uint32_t hash, int rounds)
{
	bkv_pool_config pc;
	bkv_vllm_config vc;
	bkv_pool *p;
	bkv_vllm_encoder *e;
	double best = 1e300;
	uint64_t blocks = 0;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 16;
	pc.device_blocks = PROMPT / 16; /* one prompt: each round evicts the last */
	pc.event_capacity = 4096;
	bkv_vllm_config_init(&vc);
	vc.hash = hash;
	if (bkv_pool_create(&pc, NULL, &p) || bkv_vllm_encoder_create(&vc, p, NULL, &e))
		exit(1);
	for (int run = 0; run < 7; run++) {
		double t = 0;

		blocks = 0;
		for (int r = 0; r < rounds; r++) {
			const uint8_t *msg;
			size_t len;
			uint32_t s, hit;
			double t0;
			int n;

			for (int i = 0; i < PROMPT; i++)
				tok[i] = (int32_t)((uint32_t)(run * rounds + r) * 7919u + (uint32_t)i) % 50000;
			if (bkv_seq_open(p, &s) || bkv_seq_append(p, s, tok, PROMPT, &hit) ||
			    bkv_seq_close(p, s))
				exit(1);
			t0 = now_ns();
			n = bkv_vllm_encoder_drain(e, p, 0.0, &msg, &len);
			t += now_ns() - t0;
			if (n < 0)
				exit(1);
			sink += len;
			blocks += PROMPT / 16;
		}
		if (t / (double)blocks < best)
			best = t / (double)blocks;
	}
	bkv_vllm_encoder_destroy(e);
	bkv_pool_destroy(p);
	return best;
}

int main(void)
{
	static const uint32_t bts[2] = {16, 128};

	for (int i = 0; i < PROMPT; i++)
		tok[i] = (int32_t)((i * 2654435761u) % 128000u);
	printf("%-28s %12s %12s\n", "hash per block (ns)", "bt=16", "bt=128");
	printf("%-28s %12.1f %12.1f\n", "native (bkv_block_hashes)", hash_ns(0, bts[0], 400),
	       hash_ns(0, bts[1], 400));
	printf("%-28s %12.1f %12.1f\n", "vLLM sha256_cbor", hash_ns(1, bts[0], 40),
	       hash_ns(1, bts[1], 40));
	printf("%-28s %12.1f %12.1f\n", "vLLM sha256 (pickle)", hash_ns(2, bts[0], 40),
	       hash_ns(2, bts[1], 40));
	printf("\n%-28s %12s\n", "encode per stored block (ns)", "bt=16");
	printf("%-28s %12.1f\n", "native hashes", encode_ns(BKV_VLLM_HASH_NATIVE, 40));
	printf("%-28s %12.1f\n", "vLLM sha256_cbor", encode_ns(BKV_VLLM_HASH_SHA256_CBOR, 40));
	fprintf(stderr, "(checksum %llu)\n", (unsigned long long)sink);
	return 0;
}
