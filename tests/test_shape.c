/*
 * test_shape.c - bkv-sim's model shapes (examples/sim/shape.c): the presets'
 * KV groups, the custom grammar, what a shape sets in a run's config (the
 * pool's groups, the roofline's groups, KV bytes and weights), the virtual
 * host's per-group decode context, and a hybrid run through sim_run.
 */
#include "../examples/sim/shape.h"

#include <criterion/criterion.h>
#include <string.h>

static sim_shape parse_ok(const char *spec)
{
	sim_shape s;
	char err[256] = "";
	cr_assert_eq(sim_shape_parse(spec, &s, err, sizeof(err)), 0, "%s: %s", spec, err);
	return s;
}

static void expect_group(const bkv_kv_group *g, uint32_t kind, uint32_t layers, uint32_t span,
			 uint64_t bytes)
{
	cr_expect_eq(g->kind, kind);
	cr_expect_eq(g->layers, layers);
	cr_expect_eq(g->span, span);
	cr_expect_eq(g->reserved, 0u);
	cr_expect_eq(g->bytes, bytes);
}

Test(shape, presets_carry_the_published_group_layouts)
{
	sim_shape s = parse_ok("gpt-oss-20b");
	cr_assert_eq(s.n_groups, 2u);
	expect_group(&s.groups[0], BKV_GROUP_FULL, 12, 0, 2048);
	expect_group(&s.groups[1], BKV_GROUP_WINDOW, 12, 128, 2048);
	s = parse_ok("gpt-oss-120b");
	expect_group(&s.groups[0], BKV_GROUP_FULL, 18, 0, 2048);
	expect_group(&s.groups[1], BKV_GROUP_WINDOW, 18, 128, 2048);
	s = parse_ok("gemma3-27b"); /* 62 layers, every sixth global */
	cr_assert_eq(s.n_groups, 5u);
	expect_group(&s.groups[0], BKV_GROUP_FULL, 10, 0, 8192);
	for (int i = 1; i < 5; i++) /* 52 window layers in groups of 13 */
		expect_group(&s.groups[i], BKV_GROUP_WINDOW, 13, 1024, 8192);
	s = parse_ok("llama4-scout"); /* 48 layers, every fourth global */
	cr_assert_eq(s.n_groups, 4u);
	expect_group(&s.groups[0], BKV_GROUP_FULL, 12, 0, 4096);
	for (int i = 1; i < 4; i++) /* 36 chunked layers in groups of 12 */
		expect_group(&s.groups[i], BKV_GROUP_CHUNKED, 12, 8192, 4096);
	s = parse_ok("qwen3-next-80b"); /* 3 Gated DeltaNet layers per full one */
	expect_group(&s.groups[0], BKV_GROUP_FULL, 12, 0, 2048);
	expect_group(&s.groups[1], BKV_GROUP_STATE, 36, 0, (32u * 128 * 128 + 3u * 8192) * 2);
	s = parse_ok("llama3-8b");
	cr_assert_eq(s.n_groups, 1u);
	expect_group(&s.groups[0], BKV_GROUP_FULL, 32, 0, 4096);
	int n = 0;
	for (const char *const *p = sim_shape_presets; *p; p++, n++) {
		sim_config c;
		char err[256] = "";
		sim_config_init(&c);
		s = parse_ok(*p);
		cr_expect_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s: %s", *p, err);
		cr_expect(s.params > 0.0 && s.active_params > 0.0 && s.weight_bytes > 0.0, "%s", *p);
	}
	cr_expect_eq(n, 6);
}

Test(shape, custom_spec_reads_kind_span_layers_and_bytes)
{
	sim_shape s = parse_ok("custom:full:12x2048,window128:12x2048");
	sim_shape p = parse_ok("gpt-oss-20b");
	cr_expect_str_eq(s.name, "custom");
	cr_assert_eq(s.n_groups, 2u);
	cr_expect_eq(memcmp(s.groups, p.groups, 2 * sizeof(s.groups[0])), 0);
	cr_expect(s.params == 0.0);
	s = parse_ok("custom:chunk8192:36x4096,chunked64:1x8,state:2x100,state512:3x7");
	expect_group(&s.groups[0], BKV_GROUP_CHUNKED, 36, 8192, 4096);
	expect_group(&s.groups[1], BKV_GROUP_CHUNKED, 1, 64, 8);
	expect_group(&s.groups[2], BKV_GROUP_STATE, 2, 0, 100);
	expect_group(&s.groups[3], BKV_GROUP_STATE, 3, 512, 7);
}

Test(shape, malformed_specs_and_unknown_presets_are_refused)
{
	static const char *const bad[] = {
		"gpt-oss", "custom:", "custom:full", "custom:full:12", "custom:full:12x",
		"custom:full:x2048", "custom:full:12x2048,", "custom:full:12x2048x",
		"custom:mamba:1x1", "custom:window-1:1x1", "custom:full:4294967296x1",
		"custom:full:1x1,full:1x1,full:1x1,full:1x1,full:1x1,full:1x1,full:1x1,full:1x1,"
		"full:1x1",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sim_shape s;
		char err[256] = "";
		cr_expect_eq(sim_shape_parse(bad[i], &s, err, sizeof(err)), -1, "%s", bad[i]);
		cr_expect(err[0] != '\0', "%s: no message", bad[i]);
	}
}

Test(shape, apply_sets_pool_and_roofline_groups_and_weights)
{
	sim_config c;
	char err[256] = "";
	sim_config_init(&c);
	c.cost_kind = SIM_COST_ROOFLINE;
	bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16);
	sim_shape s = parse_ok("gpt-oss-20b");
	cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(c.n_groups, 2u);
	cr_expect_eq(c.roofline.n_groups, 2u);
	cr_expect_eq(c.roofline.groups, c.groups);
	cr_expect_float_eq(c.roofline.kv_bytes_per_token, 24.0 * 2048, 1e-9);
	cr_expect_float_eq(c.roofline.model_bytes, 13.8e9, 1.0);
	cr_expect_float_eq(c.roofline.active_params, 3.6e9, 1.0);
	cr_expect_float_eq(c.roofline.attn_flops_per_pair, 4.0 * 24 * 64 * 64, 1e-9);
	cr_expect_float_eq(c.roofline.peak_flops, 989e12, 1.0); /* the GPU stays */
	/* A custom shape keeps the preset's weights. */
	sim_config_init(&c);
	c.cost_kind = SIM_COST_ROOFLINE;
	bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16);
	s = parse_ok("custom:full:16x4096,window4096:16x4096");
	cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
	cr_expect_float_eq(c.roofline.model_bytes, 2.0 * 8030261248.0, 1.0);
	cr_expect_float_eq(c.roofline.kv_bytes_per_token, 131072.0, 1e-9);
	/* Without the roofline only the pool's groups change. */
	sim_config_init(&c);
	cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(c.n_groups, 2u);
	cr_expect_eq(c.roofline.n_groups, 0u);
}

/* Splitting a group into groups of fewer layers changes what a frame holds,
 * not what a call reads: the roofline prices gemma3-27b's five groups as
 * the same model with one 52-layer window group. */
Test(shape, split_window_groups_price_as_one)
{
	sim_config c;
	char err[256] = "";
	sim_config_init(&c);
	c.cost_kind = SIM_COST_ROOFLINE;
	bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16);
	sim_shape s = parse_ok("gemma3-27b");
	cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
	bkv_cost_roofline one = c.roofline;
	bkv_kv_group merged[2] = {{BKV_GROUP_FULL, 10, 0, 0, 8192},
				  {BKV_GROUP_WINDOW, 52, 1024, 0, 8192}};
	one.n_groups = 2;
	one.groups = merged;
	uint64_t ctx5[5] = {2 * 32768, 2 * 1024, 2 * 1024, 2 * 1024, 2 * 1024};
	uint64_t ctx2[2] = {2 * 32768, 2 * 1024};
	bkv_chunk_shape chunk = {4096, 20000};
	bkv_step_shape sh = {BKV_CALL_MIXED, 2, 2 * 32768, 1, &chunk, 2, 5, ctx5, 0};
	double f5, b5, f2, b2;
	bkv_cost_roofline_work(&c.roofline, &sh, &f5, &b5);
	sh.n_groups = 2;
	sh.group_decode_context = ctx2;
	bkv_cost_roofline_work(&one, &sh, &f2, &b2);
	cr_expect_float_eq(f5, f2, 1e-9 * f2);
	cr_expect_float_eq(b5, b2, 1e-9 * b2);
}

Test(shape, one_full_group_is_the_plain_model)
{
	sim_config c, plain;
	char err[256] = "";
	sim_config_init(&c);
	c.cost_kind = SIM_COST_ROOFLINE;
	bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16);
	plain = c;
	sim_shape s = parse_ok("llama3-8b");
	cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(c.n_groups, 0u);
	cr_expect_eq(c.roofline.n_groups, 0u);
	cr_expect_null(c.roofline.groups);
	cr_expect(c.roofline.kv_bytes_per_token == plain.roofline.kv_bytes_per_token);
	cr_expect(c.roofline.model_bytes == plain.roofline.model_bytes);
	cr_expect(c.roofline.active_params == plain.roofline.active_params);
	cr_expect(c.roofline.attn_flops_per_pair == plain.roofline.attn_flops_per_pair);
}

Test(shape, preset_state_interval_rounds_up_to_the_block)
{
	static const struct {
		uint32_t block, interval; /* --block-tokens and the interval set */
	} cases[] = {{1, 256}, {16, 256}, {256, 256}, {512, 512}, {1024, 1024}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		sim_config c;
		char err[256] = "";
		sim_config_init(&c);
		c.block_tokens = cases[i].block;
		sim_shape s = parse_ok("qwen3-next-80b");
		cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
		cr_expect_eq(c.groups[1].span, cases[i].interval, "block %u", cases[i].block);
	}
	/* A custom interval off the block, or a block that is no power of two,
	 * is refused with a message. */
	sim_config c;
	char err[256] = "";
	sim_config_init(&c);
	sim_shape s = parse_ok("custom:full:1x64,state24:1x64");
	cr_expect_eq(sim_shape_apply(&s, &c, err, sizeof(err)), -1);
	cr_expect(strstr(err, "not valid at 16-token blocks") != NULL, "%s", err);
	cr_expect_eq(c.n_groups, 0u);
	c.block_tokens = 24;
	s = parse_ok("gpt-oss-20b");
	cr_expect_eq(sim_shape_apply(&s, &c, err, sizeof(err)), -1);
}

Test(shape, decode_rows_read_what_each_group_keeps)
{
	sim_config c;
	char err[256] = "";
	sim_config_init(&c);
	sim_shape s = parse_ok("custom:full:1x8,window128:1x8,chunk100:1x8,state16:1x8");
	cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
	uint64_t g[BKV_MAX_GROUPS] = {0};
	sim_shape_add_row(&c, 1, g);     /* position 0 */
	cr_expect(g[0] == 1 && g[1] == 1 && g[2] == 1 && g[3] == 0);
	sim_shape_add_row(&c, 250, g);   /* position 249: chunk 200..249 */
	cr_expect(g[0] == 251 && g[1] == 129 && g[2] == 51 && g[3] == 0);
	sim_shape_add_row(&c, 200, g);   /* position 199: chunk 100..199 */
	cr_expect(g[0] == 451 && g[1] == 257 && g[2] == 151, "%llu %llu %llu",
		  (unsigned long long)g[0], (unsigned long long)g[1], (unsigned long long)g[2]);
}

/* A gpt-oss-20b run on a Mooncake-style burst: where the pool takes KV
 * groups the run completes with every request finished; where it does not
 * (before issue 16's pool side), sim_run says so. */
Test(shape, hybrid_run_completes_or_names_the_refusing_pool)
{
	sim_config c;
	char err[256] = "";
	sim_config_init(&c);
	c.cost_kind = SIM_COST_ROOFLINE;
	bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16);
	c.give_model = 1;
	sim_shape s = parse_ok("gpt-oss-20b");
	cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
	trace t = {0};
	for (int i = 0; i < 12; i++)
		cr_assert_eq(trace_push(&t, 1000.0 * i, 300 + 40 * i, 20, NULL, 0), TRACE_OK);
	bkv_pool_config pc;
	bkv_pool *probe = NULL;
	bkv_pool_config_init(&pc);
	pc.device_blocks = 4096;
	pc.n_groups = c.n_groups;
	pc.groups = c.groups;
	int accepts = bkv_pool_create(&pc, NULL, &probe) == BKV_OK;
	bkv_pool_destroy(probe);
	sim_result r;
	memset(&r, 0, sizeof(r));
	int rc = sim_run(&c, &t, &r, err, sizeof(err));
	if (accepts) {
		cr_expect_eq(rc, 0, "%s", err);
		cr_expect_eq(r.finished, t.n);
		cr_expect_eq(r.errors, 0u);
	} else {
		cr_expect_eq(rc, BKV_EINVAL);
		cr_expect(strstr(err, "bkv_pool_create: invalid argument: bkv_") != NULL, "%s", err);
	}
	trace_free(&t);
}

/* A recurrent shape with the derived pool (no kv_blocks): the state arena
 * comes on top of the frames every slot's longest request needs, so every
 * request finishes (qwen3-next-80b's default pool was refused at create,
 * and a custom state shape's requests all ended unadmittable), overlapped
 * steps too. */
Test(shape, state_shape_derived_pool_holds_the_arena)
{
	const char *specs[] = {"qwen3-next-80b", "custom:full:16x4096,state16:16x65536"};
	for (int i = 0; i < 2; i++) {
		for (int overlap = 0; overlap < 2; overlap++) {
			sim_config c;
			char err[256] = "";
			sim_config_init(&c);
			c.mixed_host = 1;
			c.overlap = overlap;
			sim_shape s = parse_ok(specs[i]);
			cr_assert_eq(sim_shape_apply(&s, &c, err, sizeof(err)), 0, "%s", err);
			trace t = {0};
			for (int j = 0; j < 40; j++)
				cr_assert_eq(trace_push(&t, 500.0 * j, 100 + 37 * j, 30, NULL, 0),
					     TRACE_OK);
			sim_result r;
			memset(&r, 0, sizeof(r));
			int rc = sim_run(&c, &t, &r, err, sizeof(err));
			cr_expect_eq(rc, 0, "%s (overlap %d): %s", specs[i], overlap, err);
			cr_expect_eq(r.finished, t.n, "%s", specs[i]);
			cr_expect_eq(r.errors, 0u, "%s", specs[i]);
			trace_free(&t);
		}
	}
}
