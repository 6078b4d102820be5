/*
 * test_cost.c - the built-in cost models against hand-computed values, and
 * the calibrated model converging on synthetic hosts with known costs.
 */
#include "internal.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-6

static bkv_step_shape prefill_shape(const bkv_chunk_shape *c, uint32_t n)
{
	bkv_step_shape s = {0};
	s.kind = BKV_CALL_PREFILL;
	s.n_chunks = n;
	s.chunks = c;
	return s;
}

static bkv_step_shape decode_shape(uint32_t rows, uint64_t ctx, uint32_t padded)
{
	bkv_step_shape s = {0};
	s.kind = BKV_CALL_DECODE;
	s.decode_rows = rows;
	s.decode_context = ctx;
	s.padded_rows = padded;
	return s;
}

/* ---- polynomial --------------------------------------------------------- */

Test(cost, poly_defaults_are_seed000_coefficients)
{
	bkv_cost_poly p;
	bkv_cost_poly_init(&p);
	cr_expect_eq(p.size, sizeof(p));
	cr_expect_float_eq(p.a, 1677.0, EPS);
	cr_expect_float_eq(p.b, 101.0, EPS);
	cr_expect_float_eq(p.c, 1.3607, EPS);
	cr_expect_float_eq(p.kappa, 1.45, EPS);
	cr_expect_float_eq(p.rows_ref, 32.0, EPS);
	cr_expect_eq(p.packed, 0);
	cr_expect_float_eq(p.d0, 1064.0, EPS);
	cr_expect_float_eq(p.d1, 24.1, EPS);
	cr_expect_float_eq(p.d2, 0.0, EPS);
	bkv_cost_poly_init(NULL); /* ignored, no crash */
}

/* Seed 000's measured fit at batch 32 (kappa = 1): a + b*P + c*P^2 gives the
 * published prefill times within 6% (a four-point least-squares fit), and d(32) = 1835. */
Test(cost, poly_with_kappa_one_reproduces_seed000_measurements)
{
	bkv_cost_poly p;
	bkv_cost_poly_init(&p);
	p.kappa = 1.0;
	const double published[4][2] = {{8, 2461}, {16, 3836}, {32, 6205}, {64, 13728}};
	for (int i = 0; i < 4; i++) {
		bkv_chunk_shape c[32];
		for (int r = 0; r < 32; r++)
			c[r] = (bkv_chunk_shape){(uint32_t)published[i][0], 0};
		bkv_step_shape s = prefill_shape(c, 32);
		double t = bkv_cost_poly_step_us(&p, &s);
		cr_expect(fabs(t - published[i][1]) / published[i][1] < 0.06, "P=%g: %g vs %g",
			  published[i][0], t, published[i][1]);
	}
	bkv_step_shape d = decode_shape(32, 0, 0);
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &d), 1835.2, EPS);
}

/* Padded prefill of L = {8, 64, 20}: a + 3/32 * 1.45*(101*64 + 1.3607*64^2)
 * = 1677 + 3/32 * 17454.26944 = 3313.33776. */
Test(cost, poly_padded_prefill_pays_longest_row_for_every_row)
{
	bkv_cost_poly p;
	bkv_cost_poly_init(&p);
	bkv_chunk_shape c[3] = {{8, 0}, {64, 0}, {20, 0}};
	bkv_step_shape s = prefill_shape(c, 3);
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 3313.33776, 1e-4);
	/* Padding rows beyond the chunks are paid too: 32 rows -> a + v(64). */
	s.padded_rows = 32;
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 1677.0 + 17454.26944, 1e-4);
}

/* Packed prefill of L = {8, 64}: a + (v(8) + v(64))/32
 * = 1677 + (1297.87296 + 17454.26944)/32 = 2263.0044. */
Test(cost, poly_packed_prefill_pays_each_row_its_own_length)
{
	bkv_cost_poly p;
	bkv_cost_poly_init(&p);
	p.packed = 1;
	bkv_chunk_shape c[2] = {{8, 0}, {64, 0}};
	bkv_step_shape s = prefill_shape(c, 2);
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 2263.0044, 1e-4);
}

Test(cost, poly_decode_is_linear_in_rows_context_and_padding)
{
	bkv_cost_poly p;
	bkv_cost_poly_init(&p);
	bkv_step_shape s = decode_shape(5, 400, 0);
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 1064.0 + 24.1 * 5, 1e-9);
	s.padded_rows = 32; /* static batching: finished rows still run */
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 1835.2, 1e-9);
	p.d2 = 0.5;
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 1835.2 + 200.0, 1e-9);
	s = decode_shape(0, 0, 0);
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 0.0, 1e-12);
}

/* Mixed: d(10) + 1.45*(101*16 + 1.3607*(2*16*32 + 16^2))/32
 * = 1305 + 4868.6592/32 = 1457.1456. Without decode rows the fixed part a is
 * paid: 1677 + 1.45*(1616 + 1.3607*256)/32 = 1766.00912. */
Test(cost, poly_mixed_step_pays_fixed_part_once)
{
	bkv_cost_poly p;
	bkv_cost_poly_init(&p);
	bkv_chunk_shape c = {16, 32};
	bkv_step_shape s = {0};
	s.kind = BKV_CALL_MIXED;
	s.decode_rows = 10;
	s.n_chunks = 1;
	s.chunks = &c;
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 1457.1456, 1e-4);
	c.start = 0;
	s.decode_rows = 0;
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 1766.00912, 1e-4);
	s.n_chunks = 0;
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, &s), 0.0, 1e-12);
}

Test(cost, poly_model_wraps_the_struct_it_was_given)
{
	bkv_cost_poly p;
	bkv_cost_poly_init(&p);
	bkv_cost_model m = bkv_cost_poly_model(&p);
	cr_assert_not_null(m.step_us);
	cr_expect_null(m.observe);
	cr_expect_eq(m.ctx, &p);
	bkv_step_shape s = decode_shape(32, 0, 0);
	cr_expect_float_eq(m.step_us(m.ctx, &s), 1835.2, 1e-9);
	p.d0 = 0.0; /* the model follows its struct */
	cr_expect_float_eq(m.step_us(m.ctx, &s), 24.1 * 32, 1e-9);
	m = bkv_cost_poly_model(NULL);
	cr_expect_null(m.step_us);
	cr_expect_float_eq(bkv_cost_poly_step_us(NULL, &s), 0.0, 1e-12);
	cr_expect_float_eq(bkv_cost_poly_step_us(&p, NULL), 0.0, 1e-12);
}

/* ---- roofline ----------------------------------------------------------- */

/* 1 TFLOP/s, 100 GB/s, 1 GB of weights, 1e9 active parameters, 100 kB of KV
 * per token, attention ignored. */
static bkv_cost_roofline toy_roofline(void)
{
	bkv_cost_roofline rl;
	bkv_cost_roofline_init(&rl, BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16);
	rl.peak_flops = 1e12;
	rl.mem_bw = 1e11;
	rl.model_bytes = 1e9;
	rl.active_params = 1e9;
	rl.kv_bytes_per_token = 1e5;
	rl.attn_flops_per_pair = 0.0;
	return rl;
}

/* Decode 4 rows over 1000 context tokens: compute 2e9*4/1e12 = 8000 us,
 * memory (1e9 + 1e5*(1000 + 4))/1e11 = 11004 us: memory-bound. 64 rows and no
 * context: compute 128000 us, memory 10064 us: compute-bound. */
Test(cost, roofline_takes_the_larger_of_compute_and_memory)
{
	bkv_cost_roofline rl = toy_roofline();
	bkv_step_shape s = decode_shape(4, 1000, 0);
	cr_expect_float_eq(bkv_cost_roofline_step_us(&rl, &s), 11004.0, 1e-6);
	double f, b;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	cr_expect_float_eq(f, 8e9, 1.0);
	cr_expect_float_eq(b, 1.1004e9, 1.0);
	s = decode_shape(64, 0, 0);
	cr_expect_float_eq(bkv_cost_roofline_step_us(&rl, &s), 128000.0, 1e-6);
	rl.overhead_us = 10.0;
	cr_expect_float_eq(bkv_cost_roofline_step_us(&rl, &s), 128010.0, 1e-6);
	rl.flops_eff = 0.5;
	cr_expect_float_eq(bkv_cost_roofline_step_us(&rl, &s), 256010.0, 1e-6);
}

/* A prefill chunk of 100 tokens after 50 cached ones, attention counted:
 * pairs = 100*50 + 100*101/2 = 10050; flops = 2e9*100 + 1e3*10050. */
Test(cost, roofline_counts_prefill_tokens_and_attention_pairs)
{
	bkv_cost_roofline rl = toy_roofline();
	rl.attn_flops_per_pair = 1e3;
	bkv_chunk_shape c = {100, 50};
	bkv_step_shape s = prefill_shape(&c, 1);
	double f, b;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	cr_expect_float_eq(f, 2e11 + 1.005e7, 1.0);
	cr_expect_float_eq(b, 1e9 + 1e5 * 150, 1.0);
	cr_expect_float_eq(bkv_cost_roofline_step_us(&rl, &s), (2e11 + 1.005e7) / 1e12 * 1e6,
			   1e-6);
}

/* Seed 004: cost per token falls as the batch grows until it meets the
 * compute floor, and past some batch KV traffic makes it rise again. */
Test(cost, roofline_cost_per_token_falls_to_a_floor_then_kv_raises_it)
{
	bkv_cost_roofline rl;
	cr_assert_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16), BKV_OK);
	rl.attn_flops_per_pair = 0.0;
	double prev = INFINITY;
	for (uint32_t b = 1; b <= 256; b *= 2) { /* no context: weights dominate */
		bkv_step_shape s = decode_shape(b, 0, 0);
		double per_tok = bkv_cost_roofline_step_us(&rl, &s) / b;
		cr_expect(per_tok <= prev, "batch %u: %g > %g", b, per_tok, prev);
		prev = per_tok;
	}
	/* floor: 2 * active params / peak */
	cr_expect_float_eq(prev, 2.0 * rl.active_params / rl.peak_flops * 1e6, 1e-9);
	/* With 2048 tokens of context per row, per-token cost rises past the
	 * point where KV reads outweigh the weights. */
	bkv_step_shape s16 = decode_shape(16, 16 * 2048, 0);
	bkv_step_shape s256 = decode_shape(256, 256 * 2048, 0);
	double c16 = bkv_cost_roofline_step_us(&rl, &s16) / 16;
	double c256 = bkv_cost_roofline_step_us(&rl, &s256) / 256;
	double floor_kv = rl.kv_bytes_per_token * 2049 / rl.mem_bw * 1e6;
	cr_expect(c256 > floor_kv * 0.99 && c256 < c16, "%g %g %g", c16, c256, floor_kv);
}

Test(cost, roofline_presets_carry_spec_sheet_figures)
{
	bkv_cost_roofline rl;
	bkv_model_shape l2 = {40, 40, 128, 2}, l3 = {32, 8, 128, 2};
	cr_assert_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16), BKV_OK);
	cr_expect_float_eq(rl.peak_flops, 312e12, 1.0);
	cr_expect_float_eq(rl.mem_bw, 2039e9, 1.0);
	cr_expect_float_eq(rl.model_bytes, 2.0 * 13015864320.0, 1.0);
	cr_expect_float_eq(rl.kv_bytes_per_token, (double)bkv_kv_bytes_per_token(&l2), 0.5);
	cr_expect_not_null(rl.name);
	cr_assert_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16), BKV_OK);
	cr_expect_float_eq(rl.peak_flops, 989e12, 1.0);
	cr_expect_float_eq(rl.mem_bw, 3350e9, 1.0);
	cr_expect_float_eq(rl.model_bytes, 2.0 * 8030261248.0, 1.0);
	cr_expect_float_eq(rl.kv_bytes_per_token, (double)bkv_kv_bytes_per_token(&l3), 0.5);
	cr_assert_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_A100_80GB_OPT_13B_FP16), BKV_OK);
	cr_expect_eq(bkv_cost_roofline_init(&rl, BKV_ROOFLINE_PRESET_COUNT), BKV_EINVAL);
	cr_expect_eq(bkv_cost_roofline_init(&rl, (bkv_roofline_preset)-1), BKV_EINVAL);
	cr_expect_eq(bkv_cost_roofline_init(NULL, BKV_ROOFLINE_A100_80GB_OPT_13B_FP16),
		     BKV_EINVAL);
	bkv_cost_model m = bkv_cost_roofline_model(&rl);
	cr_expect_eq(m.ctx, &rl);
	cr_expect_null(m.observe);
	/* Llama-2-13B decode at batch 1 is bound by reading 26 GB of weights:
	 * 26.03e9 / 2.039e12 s = 12.77 ms. */
	bkv_cost_roofline_init(&rl, BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16);
	bkv_step_shape s = decode_shape(1, 0, 0);
	cr_expect_float_eq(m.step_us(m.ctx, &s),
			   (2.0 * 13015864320.0 + 819200.0) / 2039e9 * 1e6, 1e-6);
}

/* ---- roofline over KV groups --------------------------------------------- */

static uint64_t rng_next(uint64_t *s); /* below, with the calibrated tests */

/* Attention pairs of queries s..s+l-1 of a group, by walking every query. */
static double pairs_by_walk(const bkv_kv_group *g, uint32_t s, uint32_t l)
{
	double pairs = 0.0;
	for (uint64_t q = s; q < (uint64_t)s + l; q++) {
		uint64_t first = 0;
		if (g->kind == BKV_GROUP_WINDOW)
			first = q + 1 > g->span ? q + 1 - g->span : 0;
		else if (g->kind == BKV_GROUP_CHUNKED)
			first = q - q % g->span;
		pairs += (double)(q + 1 - first);
	}
	return pairs;
}

/* Llama-2-13B's 40 layers of 20,480 KV bytes per token as one FULL group:
 * every call prices as the same model without groups. */
Test(cost, roofline_one_full_group_prices_as_no_groups)
{
	bkv_cost_roofline plain, grouped;
	bkv_cost_roofline_init(&plain, BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16);
	bkv_kv_group full = {BKV_GROUP_FULL, 40, 0, 0, 20480};
	grouped = plain;
	grouped.n_groups = 1;
	grouped.groups = &full;
	uint64_t seed = 7;
	for (int it = 0; it < 500; it++) {
		bkv_chunk_shape c[4];
		uint64_t r = rng_next(&seed);
		bkv_step_shape sh = {0};
		sh.kind = (bkv_call_kind)(r % 3);
		sh.decode_rows = sh.kind == BKV_CALL_PREFILL ? 0 : (uint32_t)(r >> 8) % 64;
		sh.decode_context = sh.decode_rows * ((r >> 16) % 40000);
		sh.padded_rows = (uint32_t)(r >> 32) % 80;
		sh.n_chunks = sh.kind == BKV_CALL_DECODE ? 0 : (uint32_t)(r >> 40) % 5;
		for (uint32_t i = 0; i < sh.n_chunks; i++) {
			uint64_t q = rng_next(&seed);
			c[i].len = 1 + (uint32_t)(q % 4096);
			c[i].start = (uint32_t)((q >> 20) % 30000);
		}
		sh.chunks = sh.n_chunks ? c : NULL;
		double f0, b0, f1, b1;
		bkv_cost_roofline_work(&plain, &sh, &f0, &b0);
		bkv_cost_roofline_work(&grouped, &sh, &f1, &b1);
		cr_assert(fabs(f1 - f0) <= 1e-12 * f0 && fabs(b1 - b0) <= 1e-12 * b0,
			  "it %d: flops %.17g vs %.17g, bytes %.17g vs %.17g", it, f1, f0, b1, b0);
		double t0 = bkv_cost_roofline_step_us(&plain, &sh);
		double t1 = bkv_cost_roofline_step_us(&grouped, &sh);
		cr_assert(fabs(t1 - t0) <= 1e-12 * t0, "it %d: %.17g vs %.17g", it, t1, t0);
	}
}

/* gpt-oss-20b's window group alone (12 layers, 2,048 B, W 128): a decode
 * row at 32,768 tokens of context reads 128 tokens and writes its own. */
Test(cost, roofline_window_decode_at_32k_reads_w_tokens)
{
	bkv_cost_roofline rl = toy_roofline();
	bkv_kv_group win = {BKV_GROUP_WINDOW, 12, 128, 0, 2048};
	rl.attn_flops_per_pair = 4.0 * 12 * 64 * 64;
	rl.n_groups = 1;
	rl.groups = &win;
	uint64_t gctx = 128; /* min(32768, 128), what the scheduler reports */
	bkv_step_shape s = decode_shape(1, 32768, 0);
	s.n_groups = 1;
	s.group_decode_context = &gctx;
	double f, b;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	cr_expect_float_eq(b, 1e9 + 12.0 * 2048.0 * (128 + 1), 1e-3);
	cr_expect_float_eq(f, 2e9 + rl.attn_flops_per_pair * (128 + 1), 1e-3);
	/* Without the scheduler's per-group figure the bound rows x W is the
	 * same here. */
	s.n_groups = 0;
	s.group_decode_context = NULL;
	double f2, b2;
	bkv_cost_roofline_work(&rl, &s, &f2, &b2);
	cr_expect_float_eq(b2, b, 1e-3);
	cr_expect_float_eq(f2, f, 1e-3);
}

/* A chunk of 100 queries from offset 50: W 64 gives 13 queries
 * (51..63 keys) + 87 x 64 = 6,309 pairs; C 64 gives 51..64, 1..64 and
 * 1..22 = 3,138 pairs; both read the 50 cached keys. */
Test(cost, roofline_prefill_counts_only_the_keys_a_window_or_chunk_reads)
{
	bkv_cost_roofline rl = toy_roofline();
	rl.attn_flops_per_pair = 1000.0;
	bkv_kv_group g = {BKV_GROUP_WINDOW, 1, 64, 0, 1000};
	rl.n_groups = 1;
	rl.groups = &g;
	bkv_chunk_shape c = {100, 50};
	bkv_step_shape s = prefill_shape(&c, 1);
	double f, b;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	cr_expect_float_eq(f, 2e11 + 1000.0 * 6309, 1e-3);
	cr_expect_float_eq(b, 1e9 + 1000.0 * (50 + 100), 1e-3);
	g.kind = BKV_GROUP_CHUNKED;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	cr_expect_float_eq(f, 2e11 + 1000.0 * 3138, 1e-3);
	cr_expect_float_eq(b, 1e9 + 1000.0 * (50 + 100), 1e-3);
	/* Past the first window only W - 1 cached keys are read; a chunk
	 * boundary reads none. */
	c.start = 1000;
	g.kind = BKV_GROUP_WINDOW;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	cr_expect_float_eq(b, 1e9 + 1000.0 * (63 + 100), 1e-3);
	c.start = 1024;
	g.kind = BKV_GROUP_CHUNKED;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	cr_expect_float_eq(b, 1e9 + 1000.0 * 100, 1e-3);
	/* The closed forms against a walk over every query. */
	static const uint32_t spans[] = {1, 7, 64, 128, 8192};
	for (uint32_t k = BKV_GROUP_FULL; k <= BKV_GROUP_CHUNKED; k++)
		for (size_t si = 0; si < sizeof(spans) / sizeof(spans[0]); si++)
			for (uint32_t st = 0; st < 20000; st += 997) {
				g = (bkv_kv_group){k, 1, k == BKV_GROUP_FULL ? 0 : spans[si], 0, 1};
				c = (bkv_chunk_shape){1 + st % 3001, st};
				bkv_cost_roofline_work(&rl, &s, &f, &b);
				double want = 2e9 * c.len + 1000.0 * pairs_by_walk(&g, c.start, c.len);
				cr_assert_float_eq(f, want, 1e-6 * want, "kind %u span %u start %u", k,
						   g.span, st);
			}
}

/* gpt-oss-20b-like: 24 layers of 2,048 B. Half window (W 128) prices between
 * all window and all full, for decode at 32k and for a long prefill. */
Test(cost, roofline_hybrid_prices_between_all_window_and_all_full)
{
	bkv_kv_group hybrid[2] = {{BKV_GROUP_FULL, 12, 0, 0, 2048},
				  {BKV_GROUP_WINDOW, 12, 128, 0, 2048}};
	bkv_kv_group full = {BKV_GROUP_FULL, 24, 0, 0, 2048};
	bkv_kv_group win = {BKV_GROUP_WINDOW, 24, 128, 0, 2048};
	bkv_cost_roofline rl;
	bkv_cost_roofline_init(&rl, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16);
	rl.model_bytes = 13e9;
	rl.active_params = 3.6e9;
	rl.attn_flops_per_pair = 4.0 * 24 * 64 * 64;
	bkv_chunk_shape c = {8192, 24576};
	bkv_step_shape shapes[2] = {decode_shape(256, 256ull * 32768, 0), prefill_shape(&c, 1)};
	for (int i = 0; i < 2; i++) {
		double t[3];
		const bkv_kv_group *gs[3] = {&win, hybrid, &full};
		uint32_t ns[3] = {1, 2, 1};
		for (int m = 0; m < 3; m++) {
			rl.n_groups = ns[m];
			rl.groups = gs[m];
			t[m] = bkv_cost_roofline_step_us(&rl, &shapes[i]);
		}
		cr_expect(t[0] < t[1] && t[1] < t[2], "shape %d: %g %g %g", i, t[0], t[1], t[2]);
	}
	/* Decode at 32k is KV-bound: the hybrid's KV read is half the full one
	 * plus the window's 12 x 129 tokens per row. */
	double b_full, b_hyb;
	rl.n_groups = 1;
	rl.groups = &full;
	bkv_cost_roofline_work(&rl, &shapes[0], NULL, &b_full);
	rl.n_groups = 2;
	rl.groups = hybrid;
	bkv_cost_roofline_work(&rl, &shapes[0], NULL, &b_hyb);
	cr_expect_float_eq(b_full - 13e9, 24.0 * 2048 * 256 * (32768 + 1), 1.0);
	cr_expect_float_eq(b_hyb - 13e9, 12.0 * 2048 * 256 * (32768 + 1 + 128 + 1), 1.0);
}

Test(cost, roofline_state_group_moves_its_unit_per_row_and_chunk)
{
	bkv_cost_roofline rl = toy_roofline();
	rl.attn_flops_per_pair = 100.0;
	bkv_kv_group g[2] = {{BKV_GROUP_FULL, 1, 0, 0, 1000},
			     {BKV_GROUP_STATE, 3, 0, 0, 500000}};
	rl.n_groups = 2;
	rl.groups = g;
	bkv_chunk_shape c[2] = {{10, 0}, {20, 5}};
	bkv_step_shape s = prefill_shape(c, 2);
	s.kind = BKV_CALL_MIXED;
	s.decode_rows = 4;
	s.decode_context = 400;
	double f, b;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	/* full: 400 + 4 decode tokens, chunks 0 + 10 and 5 + 20; state: read
	 * and written for 4 rows and 2 chunks. Pairs: 404 + 55 + (20*5 + 210). */
	cr_expect_float_eq(b, 1e9 + 1000.0 * (404 + 10 + 25) + 2.0 * 1.5e6 * 6, 1e-3);
	cr_expect_float_eq(f, 2e9 * 34 + 100.0 * (404 + 55 + 310), 1e-3);
}

Test(cost, roofline_with_invalid_groups_prices_zero)
{
	bkv_cost_roofline rl = toy_roofline();
	bkv_kv_group bad = {BKV_GROUP_WINDOW, 4, 0, 0, 1000}; /* no window */
	rl.n_groups = 1;
	rl.groups = &bad;
	bkv_step_shape s = decode_shape(4, 1000, 0);
	double f = -1.0, b = -1.0;
	bkv_cost_roofline_work(&rl, &s, &f, &b);
	cr_expect(f == 0.0 && b == 0.0);
	cr_expect_eq(bkv_cost_roofline_step_us(&rl, &s), 0.0);
	rl.groups = NULL;
	cr_expect_eq(bkv_cost_roofline_step_us(&rl, &s), 0.0);
	bad.span = 16;
	rl.groups = &bad;
	cr_expect(bkv_cost_roofline_step_us(&rl, &s) > 0.0);
}

/* ---- calibrated ---------------------------------------------------------- */

/* splitmix64: a deterministic generator for shapes and noise. */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint32_t rng_range(uint64_t *s, uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static double rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

/* A random call of one kind; chunks[] has room for 32. */
static bkv_step_shape random_shape(uint64_t *rng, bkv_call_kind kind, bkv_chunk_shape *chunks)
{
	bkv_step_shape s = {0};
	s.kind = kind;
	s.chunks = chunks;
	if (kind != BKV_CALL_PREFILL) {
		s.decode_rows = rng_range(rng, kind == BKV_CALL_DECODE ? 1 : 0, 64);
		s.decode_context = (uint64_t)s.decode_rows * rng_range(rng, 16, 2048);
	}
	if (kind != BKV_CALL_DECODE) {
		s.n_chunks = rng_range(rng, kind == BKV_CALL_PREFILL ? 1 : 0, 8);
		if (kind == BKV_CALL_MIXED && s.decode_rows == 0 && s.n_chunks == 0)
			s.n_chunks = 1;
		for (uint32_t i = 0; i < s.n_chunks; i++) {
			chunks[i].len = rng_range(rng, 8, 512);
			chunks[i].start = rng_range(rng, 0, 2) ? 0 : rng_range(rng, 0, 1024);
		}
	}
	return s;
}

/* The synthetic host's true cost: a polynomial unlike the default one. */
static bkv_cost_poly truth_poly(void)
{
	bkv_cost_poly t;
	bkv_cost_poly_init(&t);
	t.a = 2500.0;
	t.b = 60.0;
	t.c = 0.4;
	t.kappa = 1.0;
	t.d0 = 900.0;
	t.d1 = 31.0;
	t.d2 = 0.05;
	return t;
}

/* Train on n_train noisy calls per kind (+-2% uniform noise), then return the
 * largest relative error on 300 fresh calls per kind. */
static double calib_max_error(bkv_cost_calib *cal, const bkv_cost_poly *truth, int n_train,
			      uint64_t seed)
{
	uint64_t rng = seed;
	bkv_chunk_shape ch[32];
	for (int i = 0; i < n_train; i++) {
		for (int k = 0; k < 3; k++) {
			bkv_step_shape s = random_shape(&rng, (bkv_call_kind)k, ch);
			double t = bkv_cost_poly_step_us(truth, &s);
			bkv_cost_calib_observe(cal, &s, t * (0.98 + 0.04 * rng_unit(&rng)));
		}
	}
	double worst = 0.0;
	for (int i = 0; i < 300; i++) {
		for (int k = 0; k < 3; k++) {
			bkv_step_shape s = random_shape(&rng, (bkv_call_kind)k, ch);
			double t = bkv_cost_poly_step_us(truth, &s);
			double p = bkv_cost_calib_step_us(cal, &s);
			double e = fabs(p - t) / t;
			if (e > worst)
				worst = e;
		}
	}
	return worst;
}

/* A calibrated model over seed 000's polynomial defaults, written to *p
 * (which must outlive it). */
static bkv_cost_calib *calib_over_defaults(bkv_cost_poly *p)
{
	bkv_cost_poly_init(p);
	bkv_cost_model base = bkv_cost_poly_model(p);
	bkv_cost_calib *cal = NULL;
	cr_assert_eq(bkv_cost_calib_create(&base, NULL, &cal), BKV_OK);
	return cal;
}

Test(cost, calib_predicts_its_base_until_it_has_observations)
{
	bkv_cost_poly p;
	bkv_cost_calib *cal = calib_over_defaults(&p);
	bkv_step_shape s = decode_shape(32, 0, 0);
	cr_expect_float_eq(bkv_cost_calib_step_us(cal, &s), 1835.2, 1e-9);
	for (int i = 0; i < BKV_COST_CALIB_MIN_OBS - 1; i++)
		bkv_cost_calib_observe(cal, &s, 5000.0);
	cr_expect_float_eq(bkv_cost_calib_step_us(cal, &s), 1835.2, 1e-9);
	cr_expect_eq(bkv_cost_calib_observations(cal, BKV_CALL_DECODE),
		     (uint64_t)BKV_COST_CALIB_MIN_OBS - 1);
	cr_expect_eq(bkv_cost_calib_observations(cal, BKV_CALL_PREFILL), 0);
	bkv_cost_calib_observe(cal, &s, 5000.0);
	cr_expect_float_eq(bkv_cost_calib_step_us(cal, &s), 5000.0, 1.0);
	bkv_cost_calib_destroy(cal);
}

/* A host whose costs follow a different polynomial: after 300 calls of each
 * kind the calibrated model predicts every fresh call within 5%. */
Test(cost, calib_converges_within_5_percent_from_a_wrong_base)
{
	bkv_cost_poly p, truth = truth_poly();
	bkv_cost_calib *cal = calib_over_defaults(&p);
	cr_assert_eq(bkv_cost_calib_set_forget(cal, 1.0), BKV_OK);
	/* The base alone is far off. */
	bkv_chunk_shape c = {512, 0};
	bkv_step_shape s = prefill_shape(&c, 1);
	double t = bkv_cost_poly_step_us(&truth, &s);
	cr_expect(fabs(bkv_cost_calib_step_us(cal, &s) - t) / t > 0.2);
	double worst = calib_max_error(cal, &truth, 300, 7);
	cr_expect(worst < 0.05, "worst relative error %g", worst);
	bkv_cost_calib_destroy(cal);
}

Test(cost, calib_learns_from_scratch_without_a_base)
{
	bkv_cost_poly truth = truth_poly();
	truth.packed = 1;
	bkv_cost_calib *cal = NULL;
	cr_assert_eq(bkv_cost_calib_create(NULL, NULL, &cal), BKV_OK);
	bkv_chunk_shape c = {64, 0};
	bkv_step_shape s = prefill_shape(&c, 1);
	cr_expect_float_eq(bkv_cost_calib_step_us(cal, &s), 0.0, 1e-12);
	double worst = calib_max_error(cal, &truth, 300, 11);
	cr_expect(worst < 0.05, "worst relative error %g", worst);
	bkv_cost_calib_destroy(cal);
}

/* The host's costs double halfway (thermal throttling, a neighbour): with the
 * default forgetting the fit follows within a few thousand calls. */
Test(cost, calib_follows_a_host_whose_costs_drift)
{
	bkv_cost_poly truth = truth_poly();
	bkv_cost_model base = bkv_cost_poly_model(&truth);
	bkv_cost_calib *cal = NULL;
	cr_assert_eq(bkv_cost_calib_create(&base, NULL, &cal), BKV_OK);
	cr_expect(calib_max_error(cal, &truth, 500, 3) < 0.05);
	bkv_cost_poly slow = truth;
	slow.a *= 2, slow.b *= 2, slow.c *= 2, slow.d0 *= 2, slow.d1 *= 2, slow.d2 *= 2;
	double worst = calib_max_error(cal, &slow, 4000, 5);
	cr_expect(worst < 0.05, "worst relative error %g after drift", worst);
	bkv_step_shape s = decode_shape(32, 32 * 500, 0);
	double want = bkv_cost_poly_step_us(&slow, &s);
	cr_expect(fabs(bkv_cost_calib_step_us(cal, &s) - want) / want < 0.02);
	bkv_cost_calib_destroy(cal);
}

/* A standard normal draw (Box-Muller). */
static double rng_normal(uint64_t *s)
{
	double u = rng_unit(s), v = rng_unit(s);
	return sqrt(-2.0 * log(u > 0.0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

/* Heavy-tailed timing noise: lognormal(0, sigma), times stall_x with
 * probability stall_p. */
static double noisy(uint64_t *rng, double sigma, double stall_p, double stall_x)
{
	double n = exp(sigma * rng_normal(rng));
	return rng_unit(rng) < stall_p ? n * stall_x : n;
}

/* Train on n calls per kind of truth * mult with the given noise. */
static void calib_train(bkv_cost_calib *cal, const bkv_cost_poly *truth, double mult, int n,
			double sigma, double stall_p, uint64_t *rng)
{
	bkv_chunk_shape ch[32];
	for (int i = 0; i < n; i++) {
		for (int k = 0; k < 3; k++) {
			bkv_step_shape s = random_shape(rng, (bkv_call_kind)k, ch);
			double t = bkv_cost_poly_step_us(truth, &s) * mult;
			bkv_cost_calib_observe(cal, &s, t * noisy(rng, sigma, stall_p, 10.0));
		}
	}
}

/* Mean relative error of one kind over 300 fresh calls against truth * mult. */
static double calib_mean_error(bkv_cost_calib *cal, const bkv_cost_poly *truth, double mult,
			       bkv_call_kind kind, uint64_t seed)
{
	uint64_t rng = seed;
	bkv_chunk_shape ch[32];
	double sum = 0.0;
	for (int i = 0; i < 300; i++) {
		bkv_step_shape s = random_shape(&rng, kind, ch);
		double t = bkv_cost_poly_step_us(truth, &s) * mult;
		sum += fabs(bkv_cost_calib_step_us(cal, &s) - t) / t;
	}
	return sum / 300.0;
}

/* A call measured at 10x its cost (the host was descheduled) moves the
 * prediction of that very shape by less than 1%: it is clipped at 2.5
 * robust scales (here 0.04, the floor) from the prediction. Unclipped, one
 * such call among ~300 moves it by several percent. */
Test(cost, calib_a_stall_barely_moves_the_fit)
{
	bkv_cost_poly p, truth = truth_poly();
	bkv_cost_calib *cal = calib_over_defaults(&p);
	uint64_t rng = 21;
	calib_train(cal, &truth, 1.0, 300, 0.01, 0.0, &rng);
	bkv_chunk_shape c[2] = {{300, 0}, {40, 200}};
	bkv_step_shape s = prefill_shape(c, 2);
	double t = bkv_cost_poly_step_us(&truth, &s);
	double p1 = bkv_cost_calib_step_us(cal, &s);
	cr_expect(fabs(p1 - t) / t < 0.02, "before: %g against %g", p1, t);
	bkv_cost_calib_observe(cal, &s, 10.0 * t);
	double p2 = bkv_cost_calib_step_us(cal, &s);
	cr_expect(fabs(p2 - p1) / p1 < 0.01, "one stall moved %g to %g", p1, p2);
	/* and 1% stalls of 10x in lognormal noise (sigma 0.3) leave the
	 * mean error of every kind under 10% after 1,000 calls per kind (the
	 * noise alone spreads single calls by 30%) */
	bkv_cost_calib *cal2 = calib_over_defaults(&p);
	calib_train(cal2, &truth, 1.0, 1000, 0.3, 0.01, &rng);
	for (int k = 0; k < 3; k++) {
		double e = calib_mean_error(cal2, &truth, exp(0.045), (bkv_call_kind)k, 5);
		cr_expect(e < 0.10, "kind %d: mean error %g under stalls", k, e);
	}
	bkv_cost_calib_destroy(cal2);
	bkv_cost_calib_destroy(cal);
}

/* A host whose calls get cheaper with more rows (noise, a clock coarser
 * than the calls) would fit a negative price per row; every coefficient
 * stays >= 0, so no call is priced below zero and none below a smaller one. */
Test(cost, calib_prices_stay_non_negative)
{
	bkv_cost_calib *cal = NULL;
	cr_assert_eq(bkv_cost_calib_create(NULL, NULL, &cal), BKV_OK);
	uint64_t rng = 5;
	for (int i = 0; i < 400; i++) {
		uint32_t rows = rng_range(&rng, 1, 64);
		bkv_step_shape s = decode_shape(rows, (uint64_t)rows * rng_range(&rng, 16, 512), 0);
		double t = 4000.0 - 50.0 * rows; /* unphysical: falls with the rows */
		bkv_cost_calib_observe(cal, &s, t * (0.98 + 0.04 * rng_unit(&rng)));
		s = decode_shape(rows, 0, 0);
		bkv_cost_calib_observe(cal, &s, (double)(rng_next(&rng) & 1)); /* a 1 us clock */
	}
	double w[BKV_COST_CALIB_FEATURES];
	cr_assert_eq(bkv_cost_calib_coefficients_get(cal, BKV_CALL_DECODE, w), BKV_OK);
	for (int j = 0; j < BKV_COST_CALIB_FEATURES; j++)
		cr_expect(w[j] >= 0.0, "w%d = %g", j, w[j]);
	double prev = 0.0;
	for (uint32_t rows = 1; rows <= 256; rows++) {
		bkv_step_shape s = decode_shape(rows, (uint64_t)rows * 256, 0);
		double p = bkv_cost_calib_step_us(cal, &s);
		cr_expect(p >= prev, "rows %u priced %g, below %g", rows, p, prev);
		prev = p;
	}
	bkv_cost_calib_destroy(cal);
}

/* A host faster than the microsecond clock (issue 13): decode calls timed
 * at 0 or 1 us say how fast the host is, not how a call's cost grows with
 * its rows. The fit scales the base and keeps its shape, fixed cost
 * included: 16 rows cost less than 16 times one row, as in the base. A free
 * fit of the same noise priced a row with no fixed cost (all on context),
 * which put the batch cap's knee at one row. */
Test(cost, calib_keeps_the_base_shape_under_the_clock_resolution)
{
	bkv_cost_poly p;
	bkv_cost_calib *cal = calib_over_defaults(&p);
	uint64_t rng = 13;
	for (int i = 0; i < 2000; i++) {
		uint32_t rows = rng_range(&rng, 1, 16);
		bkv_step_shape s = decode_shape(rows, (uint64_t)rows * rng_range(&rng, 8, 112), 0);
		bkv_cost_calib_observe(cal, &s, rng_next(&rng) % 3 == 0 ? 1.0 : 0.0);
	}
	bkv_step_shape one = decode_shape(1, 66, 0), sixteen = decode_shape(16, 16 * 66, 0);
	double f1 = bkv_cost_calib_step_us(cal, &one), f16 = bkv_cost_calib_step_us(cal, &sixteen);
	double b1 = bkv_cost_poly_step_us(&p, &one), b16 = bkv_cost_poly_step_us(&p, &sixteen);
	cr_expect(f1 > 0.0 && f1 < 2.0, "one row priced %g us, measured 0 or 1", f1);
	cr_expect_float_eq(f16 / f1, b16 / b1, 1e-9 * b16 / b1, "shape %g, the base's %g",
			   f16 / f1, b16 / b1);
	bkv_cost_calib_destroy(cal);
}

/* The fit is trusted only with BKV_COST_CALIB_MIN_OBS observations; until
 * then every prediction is the base's, whatever was measured. Once trusted,
 * a fit whose residuals are narrower than a wrong base's is used. */
Test(cost, calib_falls_back_to_the_base_until_it_is_trusted)
{
	bkv_cost_poly p, truth = truth_poly();
	bkv_cost_calib *cal = calib_over_defaults(&p);
	bkv_cost_calib_confidence c = {0};
	cr_expect_eq(bkv_cost_calib_confidence_get(cal, BKV_CALL_DECODE, &c), BKV_EINVAL);
	c.size = sizeof(c);
	uint64_t rng = 8;
	bkv_chunk_shape ch[32];
	for (int i = 0; i < BKV_COST_CALIB_MIN_OBS - 1; i++) {
		bkv_step_shape s = random_shape(&rng, BKV_CALL_DECODE, ch);
		bkv_cost_calib_observe(cal, &s, bkv_cost_poly_step_us(&truth, &s) *
							noisy(&rng, 0.3, 0.2, 10.0));
		s = random_shape(&rng, BKV_CALL_DECODE, ch);
		cr_expect_float_eq(bkv_cost_calib_step_us(cal, &s), bkv_cost_poly_step_us(&p, &s),
				   1e-9);
	}
	cr_assert_eq(bkv_cost_calib_confidence_get(cal, BKV_CALL_DECODE, &c), BKV_OK);
	cr_expect_eq(c.trusted, 0);
	cr_expect_eq(c.uses_fit, 0);
	cr_expect_float_eq(c.n_eff, (1.0 - pow(0.999, BKV_COST_CALIB_MIN_OBS - 1)) / 0.001, 1e-9);
	calib_train(cal, &truth, 1.0, 300, 0.02, 0.0, &rng);
	cr_assert_eq(bkv_cost_calib_confidence_get(cal, BKV_CALL_DECODE, &c), BKV_OK);
	cr_expect_eq(c.trusted, 1);
	cr_expect_eq(c.uses_fit, 1);
	cr_expect(c.scale_fit < 0.1 && c.scale_base > 0.3, "scales %g, %g", c.scale_fit,
		  c.scale_base);
	double e = calib_mean_error(cal, &truth, 1.0, BKV_CALL_DECODE, 3);
	cr_expect(e < 0.03, "mean error %g", e);
	bkv_cost_calib_destroy(cal);
}

/* A host that becomes 30% slower is followed: on a quiet clock every kind's
 * mean error is under 5% within 64 calls of that kind (the level factor's
 * gain is 1/32: ln 1.3 decays to ln 1.05 in 53 calls, after the robust
 * scale has widened to let the residuals through); with lognormal noise of
 * sigma 0.3 and 1% stalls, under 10% within 200. */
Test(cost, calib_follows_a_30_percent_slowdown_within_64_calls)
{
	bkv_cost_poly p, truth = truth_poly();
	bkv_cost_calib *cal = calib_over_defaults(&p);
	uint64_t rng = 13;
	calib_train(cal, &truth, 1.0, 500, 0.01, 0.0, &rng);
	for (int k = 0; k < 3; k++)
		cr_expect(calib_mean_error(cal, &truth, 1.3, (bkv_call_kind)k, 4) > 0.2);
	calib_train(cal, &truth, 1.3, 64, 0.01, 0.0, &rng);
	for (int k = 0; k < 3; k++) {
		double e = calib_mean_error(cal, &truth, 1.3, (bkv_call_kind)k, 4);
		cr_expect(e < 0.05, "kind %d: mean error %g 64 calls after the slowdown", k, e);
	}
	bkv_cost_calib_destroy(cal);
	cal = calib_over_defaults(&p);
	calib_train(cal, &truth, 1.0, 1000, 0.3, 0.01, &rng);
	calib_train(cal, &truth, 1.3, 200, 0.3, 0.01, &rng);
	for (int k = 0; k < 3; k++) {
		double e = calib_mean_error(cal, &truth, 1.3 * exp(0.045), (bkv_call_kind)k, 4);
		cr_expect(e < 0.10, "kind %d: mean error %g 200 noisy calls after", k, e);
	}
	bkv_cost_calib_destroy(cal);
}

/* Counting allocator: observe and predict never allocate. */
static int n_allocs;
static void *count_alloc(void *ud, size_t n)
{
	(void)ud;
	n_allocs++;
	return malloc(n);
}
static void *count_realloc(void *ud, void *p, size_t o, size_t n)
{
	(void)ud, (void)o;
	n_allocs++;
	return realloc(p, n);
}
static void count_free(void *ud, void *p, size_t n)
{
	(void)ud, (void)n;
	free(p);
}
static void *fail_alloc(void *ud, size_t n)
{
	(void)ud, (void)n;
	return NULL;
}

Test(cost, calib_observe_does_not_allocate_and_create_reports_enomem)
{
	bkv_allocator a = {count_alloc, count_realloc, count_free, NULL};
	bkv_cost_calib *cal = NULL;
	n_allocs = 0;
	cr_assert_eq(bkv_cost_calib_create(NULL, &a, &cal), BKV_OK);
	int after_create = n_allocs;
	bkv_cost_poly truth = truth_poly();
	calib_max_error(cal, &truth, 100, 1);
	cr_expect_eq(n_allocs, after_create);
	bkv_cost_calib_destroy(cal);

	bkv_allocator bad = {fail_alloc, count_realloc, count_free, NULL};
	cal = (bkv_cost_calib *)0x1;
	cr_expect_eq(bkv_cost_calib_create(NULL, &bad, &cal), BKV_ENOMEM);
	cr_expect_eq(cal, (bkv_cost_calib *)0x1);
}

Test(cost, calib_rejects_bad_arguments_and_ignores_bad_measurements)
{
	bkv_cost_calib *cal = NULL;
	cr_expect_eq(bkv_cost_calib_create(NULL, NULL, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_cost_calib_create(NULL, NULL, &cal), BKV_OK);
	cr_expect_eq(bkv_cost_calib_set_forget(cal, 0.5), BKV_EINVAL);
	cr_expect_eq(bkv_cost_calib_set_forget(cal, 1.5), BKV_EINVAL);
	cr_expect_eq(bkv_cost_calib_set_forget(NULL, 1.0), BKV_EINVAL);
	bkv_step_shape s = decode_shape(4, 0, 0);
	bkv_cost_calib_observe(cal, &s, NAN);
	bkv_cost_calib_observe(cal, &s, -1.0);
	bkv_cost_calib_observe(cal, &s, INFINITY);
	bkv_cost_calib_observe(cal, NULL, 1.0);
	bkv_cost_calib_observe(NULL, &s, 1.0);
	cr_expect_eq(bkv_cost_calib_observations(cal, BKV_CALL_DECODE), 0);
	cr_expect_eq(bkv_cost_calib_observations(cal, (bkv_call_kind)7), 0);
	double w[BKV_COST_CALIB_FEATURES];
	cr_expect_eq(bkv_cost_calib_coefficients_get(cal, (bkv_call_kind)7, w), BKV_EINVAL);
	cr_expect_eq(bkv_cost_calib_coefficients_get(cal, BKV_CALL_MIXED, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_cost_calib_coefficients_get(cal, BKV_CALL_MIXED, w), BKV_OK);
	cr_expect_float_eq(w[0], 1.0, 1e-12);
	bkv_cost_model m = bkv_cost_calib_model(cal);
	cr_expect_eq(m.ctx, cal);
	cr_expect_not_null(m.observe);
	m = bkv_cost_calib_model(NULL);
	cr_expect_null(m.step_us);
	bkv_cost_calib_destroy(cal);
	bkv_cost_calib_destroy(NULL);
}
