/*
 * test_errors.c - a refused argument is named: for every validated field of
 * bkv_pool_config, bkv_kv_group, bkv_sched_config (and bkv_host_ops),
 * bkv_request and bkv_retention_range, and bkv_vllm_config, the call
 * answers BKV_EINVAL (or bkv_submit's BKV_E2BIG), changes nothing (no
 * allocation, *out untouched, the pool's and scheduler's counters as
 * before), and bkv_last_error() names the field. Successful calls of the
 * checking functions leave the message empty; other calls leave it alone.
 */
#include "batchkv.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- a counting allocator --------------------------------------------------- */

static int n_allocs;

static void *count_alloc(void *ud, size_t size)
{
	(void)ud;
	n_allocs++;
	return malloc(size);
}

static void *count_realloc(void *ud, void *p, size_t old_size, size_t size)
{
	(void)ud;
	(void)old_size;
	n_allocs++;
	return realloc(p, size);
}

static void count_free(void *ud, void *p, size_t size)
{
	(void)ud;
	(void)size;
	free(p);
}

static const bkv_allocator counting = {count_alloc, count_realloc, count_free, NULL};

static int forward(void *host, const bkv_batch *batch, int32_t *next_tokens)
{
	(void)host;
	(void)batch;
	(void)next_tokens;
	return 0;
}

static int draft(void *host, uint64_t req, uint32_t branch, const int32_t *ctx, uint32_t n_ctx,
		 int32_t *out, uint32_t k, void *req_user)
{
	(void)host, (void)req, (void)branch, (void)ctx, (void)n_ctx, (void)out, (void)k;
	(void)req_user;
	return 0;
}

static void expect_named(const char *field)
{
	const char *msg = bkv_last_error();

	cr_expect(msg && strstr(msg, field), "bkv_last_error() = \"%s\" does not name %s",
		  msg ? msg : "(null)", field);
}

/* ---- bkv_pool_config and bkv_kv_group --------------------------------------- */

static bkv_kv_group groups[BKV_MAX_GROUPS + 1];

static void pool_cfg(bkv_pool_config *c)
{
	bkv_pool_config_init(c);
	c->device_blocks = 64;
	c->block_tokens = 16;
	for (int i = 0; i <= BKV_MAX_GROUPS; i++)
		groups[i] = (bkv_kv_group){.kind = BKV_GROUP_FULL, .layers = 2, .bytes = 64};
}

static void expect_pool_refused(const bkv_pool_config *c, const char *field, int line)
{
	bkv_pool *sentinel = (bkv_pool *)&n_allocs, *out = sentinel;
	int rc;

	n_allocs = 0;
	rc = bkv_pool_create(c, &counting, &out);
	cr_expect_eq(rc, BKV_EINVAL, "line %d (%s): rc %d", line, field, rc);
	cr_expect_eq(out, sentinel, "line %d: *out changed", line);
	cr_expect_eq(n_allocs, 0, "line %d: %d allocations", line, n_allocs);
	expect_named(field);
	if (rc == BKV_OK)
		bkv_pool_destroy(out);
}

/* A default config with STMT applied (c names it) is refused, naming FIELD. */
#define POOL_BAD(STMT, FIELD)                                                  \
	do {                                                                   \
		bkv_pool_config c;                                             \
		pool_cfg(&c);                                                  \
		STMT;                                                          \
		expect_pool_refused(&c, FIELD, __LINE__);                      \
	} while (0)

Test(errors, every_pool_config_field_is_named)
{
	POOL_BAD(c.size = 8, "bkv_pool_config.size = 8");
	POOL_BAD(c.block_tokens = 24, "bkv_pool_config.block_tokens = 24: must be a power of two");
	POOL_BAD(c.block_tokens = 0, "bkv_pool_config.block_tokens = 0");
	POOL_BAD(c.block_tokens = 131072, "bkv_pool_config.block_tokens = 131072");
	POOL_BAD(c.device_blocks = 0, "bkv_pool_config.device_blocks = 0");
	POOL_BAD(c.device_blocks = (1u << 30) + 1, "bkv_pool_config.device_blocks");
	POOL_BAD((c.device_blocks = 1u << 30, c.block_tokens = 4), "bkv_pool_config.device_blocks");
	POOL_BAD(c.host_blocks = (1u << 30) + 1, "bkv_pool_config.host_blocks");
	POOL_BAD(c.max_seqs = 0, "bkv_pool_config.max_seqs = 0");
	POOL_BAD(c.max_seqs = (1u << 20) + 1, "bkv_pool_config.max_seqs");
	POOL_BAD(c.watermark_blocks = 65, "bkv_pool_config.watermark_blocks = 65");
	POOL_BAD(c.event_capacity = (1u << 24) + 1, "bkv_pool_config.event_capacity");
	POOL_BAD(c.pin_permille = 1001, "bkv_pool_config.pin_permille = 1001");
	POOL_BAD(c.reserved = 1, "bkv_pool_config.reserved");
	POOL_BAD(c.state_pad = 1, "bkv_pool_config.state_pad");
	POOL_BAD((c.host_blocks = 8, c.host_cache = 2), "bkv_pool_config.host_cache = 2");
	POOL_BAD(c.host_cache = 1, "bkv_pool_config.host_cache = 1 needs host_blocks");
	POOL_BAD((c.host_blocks = 8, c.host_cache = 1, c.prefix_cache = 0),
		 "bkv_pool_config.host_cache = 1 needs prefix_cache");
	POOL_BAD((c.n_groups = BKV_MAX_GROUPS + 1, c.groups = groups), "bkv_pool_config.n_groups");
	POOL_BAD((c.n_groups = 2, c.groups = NULL), "bkv_pool_config.groups = NULL");
}

Test(errors, null_arguments_are_named)
{
	bkv_pool_config c;
	bkv_pool *out = NULL;

	pool_cfg(&c);
	cr_expect_eq(bkv_pool_create(NULL, NULL, &out), BKV_EINVAL);
	expect_named("cfg");
	cr_expect_eq(bkv_pool_create(&c, NULL, NULL), BKV_EINVAL);
	expect_named("out");
	cr_expect_eq(bkv_cost_roofline_init(NULL, 0), BKV_EINVAL);
	expect_named("rl");
	cr_expect_eq(bkv_cost_calib_create(NULL, NULL, NULL), BKV_EINVAL);
	expect_named("out");
}

/* Group GI of a two- (or three-) group list, changed by STMT (g names it). */
#define GROUP_BAD(N, STMT, FIELD)                                              \
	POOL_BAD((c.n_groups = (N), c.groups = groups, groups[1].kind = BKV_GROUP_WINDOW, \
		  groups[1].span = 64, STMT),                                  \
		 FIELD)

Test(errors, every_group_field_is_named)
{
	GROUP_BAD(2, groups[1].layers = 0, "bkv_kv_group[1].layers = 0");
	GROUP_BAD(2, groups[1].bytes = 0, "bkv_kv_group[1].bytes = 0");
	GROUP_BAD(2, groups[1].reserved = 3, "bkv_kv_group[1].reserved = 3");
	GROUP_BAD(2, groups[1].kind = 7, "bkv_kv_group[1].kind = 7");
	GROUP_BAD(2, groups[0].span = 5, "bkv_kv_group[0].span = 5: a FULL group");
	GROUP_BAD(2, groups[1].span = 0, "bkv_kv_group[1].span = 0: a WINDOW group needs a span");
	GROUP_BAD(2, (groups[1].kind = BKV_GROUP_CHUNKED, groups[1].span = 0x80000000u),
		  "bkv_kv_group[1].span = 2147483648: a CHUNKED group");
	GROUP_BAD(2, (groups[1].kind = BKV_GROUP_STATE, groups[1].span = 24),
		  "bkv_kv_group[1].span = 24: a STATE group's span must be a multiple");
	GROUP_BAD(3, (groups[1].kind = BKV_GROUP_STATE, groups[2].kind = BKV_GROUP_STATE),
		  "bkv_kv_group[2].kind = STATE: at most one");
	GROUP_BAD(3, (groups[1].kind = BKV_GROUP_STATE, groups[1].span = 0),
		  "bkv_kv_group[1].kind = STATE: a STATE group must be the last");
	GROUP_BAD(1, (groups[0].kind = BKV_GROUP_STATE, groups[0].span = 0),
		  "bkv_kv_group[0].kind = STATE");
	GROUP_BAD(2, (groups[0].kind = BKV_GROUP_WINDOW, groups[0].span = 64),
		  "bkv_kv_group[0].kind = 1: group 0 must be FULL");
	GROUP_BAD(2, (groups[1].layers = UINT32_MAX, groups[1].bytes = UINT64_MAX / 2),
		  "bkv_pool_config.groups: a frame's bytes");
	/* a STATE arena of 2 x max_seqs units leaves no attention frame */
	GROUP_BAD(2, (groups[1].kind = BKV_GROUP_STATE, groups[1].span = 0, c.max_seqs = 64),
		  "bkv_pool_config.state_units = 0");
	GROUP_BAD(2, (groups[1].kind = BKV_GROUP_STATE, groups[1].span = 0, c.state_units = 500),
		  "bkv_pool_config.state_units = 500");
}

/* ---- bkv_sched_config and bkv_host_ops ------------------------------------- */

static bkv_pool *pool_new(uint32_t host_blocks, int state)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	pool_cfg(&c);
	c.host_blocks = host_blocks;
	c.max_seqs = 8;
	if (state) {
		groups[1] = (bkv_kv_group){.kind = BKV_GROUP_STATE, .layers = 1, .bytes = 64};
		c.groups = groups;
		c.n_groups = 2;
	}
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK, "%s", bkv_last_error());
	cr_expect_str_eq(bkv_last_error(), "");
	return p;
}

static void expect_sched_refused(bkv_pool *pool, const bkv_sched_config *c, const bkv_host_ops *o,
				 const char *field, int line)
{
	bkv_sched *sentinel = (bkv_sched *)&n_allocs, *out = sentinel;
	bkv_pool_stats before, after;
	int rc;

	memset(&before, 0, sizeof before);
	memset(&after, 0, sizeof after);
	before.size = after.size = sizeof before;
	bkv_pool_stats_get(pool, &before);
	n_allocs = 0;
	rc = bkv_sched_create(c, pool, o, NULL, &counting, &out);
	cr_expect_eq(rc, BKV_EINVAL, "line %d (%s): rc %d", line, field, rc);
	cr_expect_eq(out, sentinel, "line %d: *out changed", line);
	cr_expect_eq(n_allocs, 0, "line %d: %d allocations", line, n_allocs);
	bkv_pool_stats_get(pool, &after);
	cr_expect(memcmp(&before, &after, sizeof before) == 0, "line %d: the pool changed", line);
	expect_named(field);
	if (rc == BKV_OK)
		bkv_sched_destroy(out);
}

/* A default config and a forward-only host, with STMT applied (c, o). */
#define SCHED_BAD_ON(POOL, STMT, FIELD)                                        \
	do {                                                                   \
		bkv_sched_config c;                                            \
		bkv_host_ops o;                                                \
		bkv_sched_config_init(&c);                                     \
		memset(&o, 0, sizeof o);                                       \
		o.forward = forward;                                           \
		STMT;                                                          \
		expect_sched_refused(POOL, &c, &o, FIELD, __LINE__);           \
	} while (0)
#define SCHED_BAD(STMT, FIELD) SCHED_BAD_ON(pool, STMT, FIELD)

Test(errors, every_sched_config_field_is_named)
{
	bkv_pool *pool = pool_new(0, 0), *state_pool = pool_new(0, 1);

	SCHED_BAD(c.size = 4, "bkv_sched_config.size = 4");
	SCHED_BAD(c.policy = 5, "bkv_sched_config.policy = 5");
	SCHED_BAD(c.max_running = 0, "bkv_sched_config.max_running = 0");
	SCHED_BAD(c.max_running = (1u << 20) + 1, "bkv_sched_config.max_running = 1048577");
	SCHED_BAD(c.admit_group = 33, "bkv_sched_config.admit_group = 33");
	SCHED_BAD(c.token_budget = (1u << 24) + 1, "bkv_sched_config.token_budget");
	SCHED_BAD(c.max_queue = 0, "bkv_sched_config.max_queue = 0");
	SCHED_BAD(c.max_queue = (1u << 24) + 1, "bkv_sched_config.max_queue");
	SCHED_BAD(c.preempt = 7, "bkv_sched_config.preempt = 7");
	SCHED_BAD(c.preempt = BKV_PREEMPT_SWAP, "bkv_sched_config.preempt = BKV_PREEMPT_SWAP needs");
	SCHED_BAD(c.host_link_bytes_per_us = -1.0, "bkv_sched_config.host_link_bytes_per_us");
	SCHED_BAD(c.host_link_bytes_per_us = NAN, "bkv_sched_config.host_link_bytes_per_us");
	SCHED_BAD(c.host_link_bytes_per_us = INFINITY, "bkv_sched_config.host_link_bytes_per_us");
	SCHED_BAD(c.max_bypass_us = (1ull << 42) + 1, "bkv_sched_config.max_bypass_us");
	SCHED_BAD(c.batch_layout = 5, "bkv_sched_config.batch_layout = 5");
	SCHED_BAD(c.spec_max_k = BKV_SPEC_MAX_K + 1, "bkv_sched_config.spec_max_k = 17");
	SCHED_BAD(c.spec_k_mode = 3, "bkv_sched_config.spec_k_mode = 3");
	SCHED_BAD(c.spec_drafts = 3, "bkv_sched_config.spec_drafts = 3");
	SCHED_BAD((c.spec_max_k = 2, c.spec_drafts = BKV_SPEC_DRAFT_HOST),
		  "bkv_sched_config.spec_drafts = BKV_SPEC_DRAFT_HOST (spec_max_k = 2) needs "
		  "bkv_host_ops.draft");
	SCHED_BAD(c.evict = 5, "bkv_sched_config.evict = 5");
	SCHED_BAD(c.victim = 5, "bkv_sched_config.victim = 5");
	SCHED_BAD(c.admit_reserve = 5, "bkv_sched_config.admit_reserve = 5");
	SCHED_BAD(c.copy_overlap = 2, "bkv_sched_config.copy_overlap = 2");
	SCHED_BAD(c.prefill_first = 2, "bkv_sched_config.prefill_first = 2");
	SCHED_BAD(c.overlap = 1, "bkv_sched_config.overlap = 1 needs bkv_host_ops.launch");
	SCHED_BAD((c.overlap = 1, o.launch = forward, o.forward = NULL, o.prefill = forward),
		  "bkv_sched_config.overlap = 1: one mixed launch");
	SCHED_BAD_ON(state_pool, (c.overlap = 1, o.launch = NULL),
		     "bkv_sched_config.overlap = 1 needs bkv_host_ops.launch");
	SCHED_BAD(o.forward = NULL, "bkv_host_ops: needs forward");
	SCHED_BAD((o.forward = NULL, o.prefill = forward), "bkv_host_ops: needs forward");
	bkv_pool_destroy(state_pool);
	bkv_pool_destroy(pool);
}

Test(errors, a_good_config_after_a_bad_one_clears_the_message)
{
	bkv_pool *pool = pool_new(0, 0);
	bkv_sched_config c;
	bkv_host_ops o;
	bkv_sched *s = NULL;

	bkv_sched_config_init(&c);
	memset(&o, 0, sizeof o);
	o.forward = forward;
	o.draft = draft;
	c.max_running = 0;
	cr_expect_eq(bkv_sched_create(&c, pool, &o, NULL, NULL, &s), BKV_EINVAL);
	expect_named("max_running");
	/* a call that does not check a config leaves the message as it is */
	cr_expect_eq(bkv_seq_close(pool, 12345), BKV_ENOENT);
	expect_named("max_running");
	c.max_running = 4;
	cr_expect_eq(bkv_sched_create(&c, pool, &o, NULL, NULL, &s), BKV_OK);
	cr_expect_str_eq(bkv_last_error(), "");
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

/* ---- bkv_request and bkv_retention_range ------------------------------------ */

static const int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
static bkv_retention_range ranges[BKV_RETENTION_MAX_RANGES + 1];

static void expect_submit_refused(bkv_sched *s, const bkv_request *q, int code, const char *field,
				  int line)
{
	bkv_sched_stats before, after;
	uint64_t id = 77;
	int rc;

	memset(&before, 0, sizeof before);
	memset(&after, 0, sizeof after);
	before.size = after.size = sizeof before;
	bkv_sched_stats_get(s, &before);
	rc = bkv_submit(s, q, &id);
	cr_expect_eq(rc, code, "line %d (%s): rc %d", line, field, rc);
	cr_expect_eq(id, 77u, "line %d: *req_id changed", line);
	bkv_sched_stats_get(s, &after);
	cr_expect_eq(after.submitted, before.submitted, "line %d: a request was taken", line);
	cr_expect_eq(after.waiting, before.waiting, "line %d", line);
	expect_named(field);
}

#define REQ_BAD_CODE(S, STMT, CODE, FIELD)                                     \
	do {                                                                   \
		bkv_request q;                                                 \
		bkv_request_init(&q);                                          \
		q.prompt = prompt;                                             \
		q.prompt_len = 8;                                              \
		q.max_new_tokens = 4;                                          \
		memset(ranges, 0, sizeof ranges);                              \
		for (int i_ = 0; i_ <= (int)BKV_RETENTION_MAX_RANGES; i_++)    \
			ranges[i_].token_start = 0, ranges[i_].token_end = 1;  \
		STMT;                                                          \
		expect_submit_refused(S, &q, CODE, FIELD, __LINE__);           \
	} while (0)
#define REQ_BAD(S, STMT, FIELD) REQ_BAD_CODE(S, STMT, BKV_EINVAL, FIELD)

static bkv_sched *sched_new(bkv_pool *pool, uint32_t retention)
{
	bkv_sched_config c;
	bkv_host_ops o;
	bkv_sched *s = NULL;

	bkv_sched_config_init(&c);
	c.max_running = 4;
	c.retention = retention;
	memset(&o, 0, sizeof o);
	o.forward = forward;
	cr_assert_eq(bkv_sched_create(&c, pool, &o, NULL, NULL, &s), BKV_OK, "%s", bkv_last_error());
	return s;
}

Test(errors, every_request_field_is_named)
{
	bkv_pool *pool = pool_new(0, 0), *pool2 = pool_new(0, 0);
	bkv_sched *s = sched_new(pool, 0), *r = sched_new(pool2, 1);
	int32_t stop = 9;

	REQ_BAD(s, q.size = 4, "bkv_request.size = 4");
	REQ_BAD(s, q.prompt = NULL, "bkv_request.prompt = NULL");
	REQ_BAD(s, q.prompt_len = 0, "bkv_request.prompt_len = 0");
	REQ_BAD(s, q.max_new_tokens = 0, "bkv_request.max_new_tokens = 0");
	REQ_BAD(s, q.n = 0, "bkv_request.n = 0");
	REQ_BAD(s, q.n_stop = 2, "bkv_request.stop_tokens = NULL with n_stop = 2");
	REQ_BAD(s, (q.retention = ranges, q.n_retention = 1),
		"bkv_request.n_retention = 1 needs bkv_sched_config.retention");
	REQ_BAD(r, (q.retention = ranges, q.n_retention = BKV_RETENTION_MAX_RANGES + 1),
		"bkv_request.n_retention = 17");
	REQ_BAD(r, q.n_retention = 1, "bkv_request.retention = NULL");
	REQ_BAD(r, (q.retention = ranges, q.n_retention = 1, ranges[0].token_start = 1),
		"bkv_retention_range[0].token_start = 1");
	REQ_BAD(r, (q.retention = ranges, q.n_retention = 1, ranges[0].token_end = 9),
		"bkv_retention_range[0].token_end = 9");
	REQ_BAD(r, (q.retention = ranges, q.n_retention = 1, ranges[0].priority = 101),
		"bkv_retention_range[0].priority = 101");
	REQ_BAD(r, (q.retention = ranges, q.n_retention = 1, ranges[0].pad = 1),
		"bkv_retention_range[0].pad = 1");
	REQ_BAD(r, (q.retention = ranges, q.n_retention = 2),
		"bkv_retention_range[1].token_start = 0: overlaps bkv_retention_range[0]");
	/* what can never fit: BKV_E2BIG, named the same way */
	REQ_BAD_CODE(s, q.max_new_tokens = 64 * 16, BKV_E2BIG, "blocks, the pool has 64");
	REQ_BAD_CODE(s, q.max_new_tokens = INT32_MAX, BKV_E2BIG,
		     "bkv_request.prompt_len + max_new_tokens");
	REQ_BAD_CODE(s, q.n = 5, BKV_E2BIG, "bkv_request.n = 5");
	/* and a good request after them clears the message */
	REQ_BAD(s, q.n = 0, "bkv_request.n");
	{
		bkv_request q;
		uint64_t id = 0;

		bkv_request_init(&q);
		q.prompt = prompt;
		q.prompt_len = 8;
		q.max_new_tokens = 2;
		q.stop_tokens = &stop;
		q.n_stop = 1;
		cr_expect_eq(bkv_submit(s, &q, &id), BKV_OK);
		cr_expect_str_eq(bkv_last_error(), "");
	}
	bkv_sched_destroy(r);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool2);
	bkv_pool_destroy(pool);
}

/* ---- bkv_vllm_config ------------------------------------------------------------ */

#define VLLM_BAD(POOL, STMT, FIELD)                                            \
	do {                                                                   \
		bkv_vllm_config v;                                             \
		bkv_vllm_encoder *e = (bkv_vllm_encoder *)&n_allocs;           \
		bkv_vllm_config_init(&v);                                      \
		STMT;                                                          \
		n_allocs = 0;                                                  \
		cr_expect_eq(bkv_vllm_encoder_create(&v, POOL, &counting, &e), BKV_EINVAL, \
			     "%s", FIELD);                                     \
		cr_expect_eq(e, (bkv_vllm_encoder *)&n_allocs);                \
		cr_expect_eq(n_allocs, 0);                                     \
		expect_named(FIELD);                                           \
	} while (0)

Test(errors, every_vllm_config_field_is_named)
{
	bkv_pool_config c;
	bkv_pool *ev = NULL, *quiet = pool_new(0, 0);
	char long_seed[300];

	pool_cfg(&c);
	c.event_capacity = 64;
	cr_assert_eq(bkv_pool_create(&c, NULL, &ev), BKV_OK);
	memset(long_seed, 'x', sizeof long_seed - 1);
	long_seed[sizeof long_seed - 1] = '\0';
	VLLM_BAD(ev, v.size = 4, "bkv_vllm_config.size = 4");
	VLLM_BAD(ev, v.wire = 9, "bkv_vllm_config.wire = 9");
	VLLM_BAD(ev, v.hash = 9, "bkv_vllm_config.hash = 9");
	VLLM_BAD(ev, v.hash_seed = NULL, "bkv_vllm_config.hash_seed");
	VLLM_BAD(ev, v.hash_seed = long_seed, "bkv_vllm_config.hash_seed");
	VLLM_BAD(ev, v.data_parallel_rank = -2, "bkv_vllm_config.data_parallel_rank = -2");
	VLLM_BAD(ev, v.group_idx = -2, "bkv_vllm_config.group_idx = -2");
	VLLM_BAD(quiet, (void)0, "bkv_pool_config.event_capacity = 0");
	bkv_pool_destroy(quiet);
	bkv_pool_destroy(ev);
}

static void *other_thread(void *arg)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;
	char *seen = arg;

	strcpy(seen, bkv_last_error()); /* this thread's: empty */
	pool_cfg(&c);
	c.device_blocks = 0;
	if (bkv_pool_create(&c, NULL, &p) == BKV_EINVAL)
		strcat(seen, bkv_last_error());
	return NULL;
}

Test(errors, messages_are_per_thread)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;
	pthread_t t;
	char seen[512] = "unset";

	pool_cfg(&c);
	c.block_tokens = 24;
	cr_expect_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL);
	expect_named("block_tokens = 24");
	cr_assert_eq(pthread_create(&t, NULL, other_thread, seen), 0);
	pthread_join(t, NULL);
	cr_expect(strncmp(seen, "bkv_pool_config.device_blocks = 0", 33) == 0, "%s", seen);
	expect_named("block_tokens = 24"); /* untouched by the other thread */
	cr_expect(strlen(bkv_last_error()) < 256);
}

Test(errors, cost_calls_name_their_argument)
{
	bkv_cost_roofline rl;

	cr_expect_eq(bkv_cost_roofline_init(NULL, BKV_ROOFLINE_PRESET_COUNT), BKV_EINVAL);
	expect_named("bkv_cost_roofline_init: rl is NULL");
	cr_expect_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_PRESET_COUNT), BKV_EINVAL);
	expect_named("preset = 3");
	cr_expect_eq(bkv_cost_roofline_init(&rl, 0), BKV_OK);
	cr_expect_str_eq(bkv_last_error(), "");
}
