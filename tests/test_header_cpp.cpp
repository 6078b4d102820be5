// The public header must compile as C++ (with extern "C" linkage) and its
// types must be usable from C++ code. Linking the calls proves the symbols
// are exported with C linkage.
#include "batchkv.h"

#include <cstdio>
#include <cstring>

int main()
{
	bkv_model_shape shape = {40, 40, 128, 2};
	if (bkv_kv_bytes_per_token(&shape) != 819200u)
		return 1;
	if (std::strcmp(bkv_version(), BKV_VERSION_STRING) != 0)
		return 1;
	bkv_batch batch;
	std::memset(&batch, 0, sizeof batch);
	bkv_request req;
	std::memset(&req, 0, sizeof req);
	bkv_pool_config pcfg;
	bkv_pool_config_init(&pcfg);
	pcfg.device_blocks = 4;
	bkv_pool *pool = nullptr;
	if (bkv_pool_create(&pcfg, nullptr, &pool) != BKV_OK || pool == nullptr)
		return 1;
	uint32_t seq = 0;
	const int32_t toks[3] = {1, 2, 3};
	if (bkv_seq_open(pool, &seq) != BKV_OK || bkv_seq_append(pool, seq, toks, 3, nullptr) != BKV_OK)
		return 1;
	if (bkv_pool_check(pool) != 0)
		return 1;
	bkv_pool_destroy(pool);
	std::printf("%s %u\n", bkv_strerror(BKV_ENOSPC), (unsigned)batch.n_rows);
	return 0;
}
