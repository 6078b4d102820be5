/* A tiny program that uses libbatchkv the way a third party would: only the
 * installed header and library. Exits 0 when the library answers sensibly. */
#include <batchkv.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	bkv_model_shape shape = {40, 40, 128, 2};
	bkv_pool_config cfg;
	bkv_pool *pool = NULL;
	uint32_t seq, n = 0;
	int32_t toks[20];

	if (strcmp(bkv_version(), BKV_VERSION_STRING) != 0)
		return 1;
	if (bkv_kv_bytes_per_token(&shape) != 819200u)
		return 2;
	bkv_pool_config_init(&cfg);
	cfg.device_blocks = 8;
	if (bkv_pool_create(&cfg, NULL, &pool) != BKV_OK)
		return 3;
	for (int i = 0; i < 20; i++)
		toks[i] = i;
	if (bkv_seq_open(pool, &seq) != BKV_OK || bkv_seq_append(pool, seq, toks, 20, NULL) != BKV_OK)
		return 4;
	bkv_seq_blocks(pool, seq, &n);
	bkv_pool_destroy(pool);
	printf("consumer: libbatchkv %s, 20 tokens in %u blocks\n", bkv_version(), n);
	return n == 2 ? 0 : 5;
}
