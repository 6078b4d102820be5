/*
 * test_trace.c - bkv-sim's trace parsers on small fixtures written here
 * (good files and malformed lines, each with the line number in the error),
 * Mooncake's shared-prefix tokens, and the deterministic workloads.
 */
#include "../examples/sim/trace.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(trace_format fmt, const char *text, trace *t, char *err)
{
	memset(t, 0, sizeof(*t));
	return trace_parse(fmt, text, strlen(text), NULL, t, err, 256);
}

/* ---- Azure --------------------------------------------------------------- */

Test(trace, azure_reads_lengths_and_relative_arrivals)
{
	const char *text = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
			   "2023-11-16 18:15:46.6805900,374,44\r\n"
			   "2023-11-16 18:15:50.9951690,396,109\n"
			   "\n"
			   "2023-11-16 18:16:00,10,0\n";
	trace t;
	char err[256];
	cr_assert_eq(parse(TRACE_AZURE, text, &t, err), TRACE_OK, "%s", err);
	cr_assert_eq(t.n, 3);
	cr_expect_eq(t.reqs[0].prompt_len, 374);
	cr_expect_eq(t.reqs[0].output_len, 44);
	cr_expect_float_eq(t.reqs[0].arrival_us, 0.0, 1e-6);
	cr_expect_float_eq(t.reqs[1].arrival_us, 4314579.0, 0.5);
	cr_expect_float_eq(t.reqs[2].arrival_us, 13319410.0, 0.5);
	cr_expect_eq(t.reqs[2].output_len, 1, "0 generated tokens is read as 1");
	cr_expect_eq(t.reqs[1].n_hash, 0);
	trace_free(&t);
}

Test(trace, azure_crossing_midnight_and_a_month_keeps_time_running)
{
	const char *text = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
			   "2023-12-31 23:59:59.5,1,1\n"
			   "2024-01-01 00:00:00.25,1,1\n";
	trace t;
	char err[256];
	cr_assert_eq(parse(TRACE_AZURE, text, &t, err), TRACE_OK, "%s", err);
	cr_expect_float_eq(t.reqs[1].arrival_us, 750000.0, 0.5);
	trace_free(&t);
}

/* Each malformed fixture and the line its error must name. */
static const struct {
	const char *text;
	const char *want; /* a substring of the error */
} azure_bad[] = {
	{"", "line 1: empty file"},
	{"time,ctx,gen\n1,2,3\n", "line 1: expected the header"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\n",
	 "line 2: expected 3 comma-separated fields, got 2"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2,3\n",
	 "line 2: expected 3"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n\n2023-11-16 18:15:46,1,2\nyesterday,1,2\n",
	 "line 4: bad TIMESTAMP"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:15:46,1,2\n",
	 "line 2: bad TIMESTAMP"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,0,2\n",
	 "line 2: bad ContextTokens"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-5,2\n",
	 "line 2: bad ContextTokens"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,12x,2\n",
	 "line 2: bad ContextTokens"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,99999999999999999999,2\n",
	 "line 2: bad ContextTokens"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,\n",
	 "line 2: bad GeneratedTokens"},
	{"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n"
	 "2023-11-16 18:15:45,5,1\n",
	 "line 3: TIMESTAMP goes back in time"},
};

Test(trace, azure_malformed_lines_name_the_line_and_leave_an_empty_trace)
{
	for (size_t i = 0; i < sizeof(azure_bad) / sizeof(azure_bad[0]); i++) {
		trace t;
		char err[256];
		cr_expect_eq(parse(TRACE_AZURE, azure_bad[i].text, &t, err), TRACE_EPARSE,
			     "fixture %zu", i);
		cr_expect(strstr(err, azure_bad[i].want) != NULL, "fixture %zu: got '%s'", i, err);
		cr_expect_eq(t.n, 0);
		cr_expect_null(t.reqs);
	}
}

/* ---- Mooncake ------------------------------------------------------------ */

Test(trace, mooncake_reads_objects_in_any_key_order_and_skips_unknown_keys)
{
	const char *text =
		"{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, "
		"\"hash_ids\": [0, 1]}\n"
		"{\"hash_ids\": [0, 7, 8], \"output_length\": 0, \"extra\": {\"a\": [1, \"x\\\"\"]},"
		" \"input_length\": 1025, \"timestamp\": 3000, \"flag\": true}\n"
		"{\"timestamp\": 3000, \"input_length\": 3, \"output_length\": 2}\n";
	trace t;
	char err[256];
	cr_assert_eq(parse(TRACE_MOONCAKE, text, &t, err), TRACE_OK, "%s", err);
	cr_assert_eq(t.n, 3);
	cr_expect_eq(t.reqs[0].prompt_len, 1000);
	cr_expect_eq(t.reqs[0].n_hash, 2);
	cr_expect_eq(t.reqs[1].prompt_len, 1025);
	cr_expect_eq(t.reqs[1].output_len, 1);
	cr_expect_eq(t.reqs[1].n_hash, 3);
	cr_expect_eq(t.hash_ids[t.reqs[1].hash_off + 2], 8);
	cr_expect_float_eq(t.reqs[1].arrival_us, 3e6, 1e-6);
	cr_expect_eq(t.reqs[2].n_hash, 0);
	trace_free(&t);
}

/* Equal hash ids give equal tokens block by block; the first differing id
 * gives different tokens from there on; the last id covers the remainder. */
Test(trace, mooncake_equal_hash_ids_give_equal_prompt_tokens)
{
	const char *text =
		"{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 5, "
		"\"hash_ids\": [4, 9, 2]}\n"
		"{\"timestamp\": 1, \"input_length\": 1030, \"output_length\": 5, "
		"\"hash_ids\": [4, 9, 3]}\n"
		"{\"timestamp\": 2, \"input_length\": 600, \"output_length\": 5, "
		"\"hash_ids\": [4, 5]}\n";
	trace t;
	char err[256];
	cr_assert_eq(parse(TRACE_MOONCAKE, text, &t, err), TRACE_OK, "%s", err);
	int32_t *a = malloc(1100 * sizeof(int32_t)), *b = malloc(1030 * sizeof(int32_t)),
		*c = malloc(600 * sizeof(int32_t));
	trace_prompt_tokens(&t, 0, a);
	trace_prompt_tokens(&t, 1, b);
	trace_prompt_tokens(&t, 2, c);
	cr_expect_eq(memcmp(a, b, 1024 * sizeof(int32_t)), 0, "ids 4, 9 shared");
	cr_expect_eq(memcmp(a, c, 512 * sizeof(int32_t)), 0, "id 4 shared");
	int differ = 0;
	for (int k = 1024; k < 1030; k++)
		differ += a[k] != b[k];
	cr_expect_gt(differ, 0, "ids 2 and 3 differ");
	differ = 0;
	for (int k = 512; k < 600; k++)
		differ += a[k] != c[k];
	cr_expect_gt(differ, 80);
	for (int k = 0; k < 1100; k++)
		cr_assert(a[k] >= 0 && a[k] < (1 << 30));
	/* Same id at another block position: different tokens (the chain). */
	trace_free(&t);
	free(a), free(b), free(c);
}

Test(trace, unique_prompts_share_no_tokens_across_requests)
{
	trace t = {0};
	cr_assert_eq(trace_push(&t, 0, 64, 1, NULL, 0), TRACE_OK);
	cr_assert_eq(trace_push(&t, 0, 64, 1, NULL, 0), TRACE_OK);
	int32_t a[64], b[64], a2[64];
	trace_prompt_tokens(&t, 0, a);
	trace_prompt_tokens(&t, 1, b);
	trace_prompt_tokens(&t, 0, a2);
	cr_expect_eq(memcmp(a, a2, sizeof(a)), 0, "deterministic");
	int same = 0;
	for (int k = 0; k < 64; k++)
		same += a[k] == b[k];
	cr_expect_lt(same, 2);
	trace_free(&t);
}

static const struct {
	const char *text;
	const char *want;
} mooncake_bad[] = {
	{"[1, 2]\n", "line 1: expected a JSON object"},
	{"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n{\"timestamp\": 1,\n",
	 "line 2: expected a quoted key"},
	{"\n\n{\"timestamp\": 0, \"input_length\": 5}\n", "line 3: missing \"output_length\""},
	{"{\"timestamp\": \"0\", \"input_length\": 5, \"output_length\": 1}\n",
	 "line 1: \"timestamp\" must be a number"},
	{"{\"timestamp\": 0, \"input_length\": 5.5, \"output_length\": 1}\n",
	 "line 1: input_length must be an integer"},
	{"{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1}\n",
	 "line 1: input_length must be an integer"},
	{"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": -1}\n",
	 "line 1: output_length must be an integer"},
	{"{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1]}\n",
	 "line 1: hash_ids has 1 ids, input_length 600 needs 2"},
	{"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [-1]}\n",
	 "line 1: \"hash_ids\" must be an array"},
	{"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1,]}\n",
	 "line 1: \"hash_ids\" must be an array"},
	{"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1} x\n",
	 "line 1: text after the JSON object"},
	{"{\"timestamp\": 0 \"input_length\": 5}\n", "line 1: expected ',' or '}'"},
	{"{\"timestamp\": 9, \"input_length\": 5, \"output_length\": 1}\n"
	 "{\"timestamp\": 8, \"input_length\": 5, \"output_length\": 1}\n",
	 "line 2: timestamp goes back in time"},
	{"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"x\": [[[[[[[[[[[[[[[["
	 "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}\n",
	 "line 1: bad JSON value for \"x\""},
	{"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"s\": \"unterminated}\n",
	 "line 1: bad JSON value"},
	{"{\"timestamp\": -inf, \"input_length\": 5, \"output_length\": 1}\n",
	 "line 1: \"timestamp\" must be a number"},
};

Test(trace, mooncake_malformed_lines_name_the_line)
{
	for (size_t i = 0; i < sizeof(mooncake_bad) / sizeof(mooncake_bad[0]); i++) {
		trace t;
		char err[256];
		cr_expect_eq(parse(TRACE_MOONCAKE, mooncake_bad[i].text, &t, err), TRACE_EPARSE,
			     "fixture %zu", i);
		cr_expect(strstr(err, mooncake_bad[i].want) != NULL, "fixture %zu: got '%s'", i,
			  err);
		cr_expect_eq(t.n, 0);
	}
}

/* Every prefix of a valid file, and that file with each byte flipped, either
 * parses or fails cleanly (run under ASan in CI: never a crash or overread). */
Test(trace, truncated_and_corrupted_input_never_crashes)
{
	const char *files[3] = {
		"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n",
		"{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2]}\n",
		("run,n_requests,rate_req_s,seq,prompt_len,output_len,issue_time_rel_s,ttft_ms,"
		 "tpot_ms\nvllm-1-1,1,1,0,55,4,0.0,69.5,26.1\n")};
	const char flips[] = {'\0', ',', '"', '[', '{', '-', '9', '\n', '.', ' '};
	for (int f = 0; f < 3; f++) {
		size_t len = strlen(files[f]);
		char *buf = malloc(len);
		for (size_t cut = 0; cut <= len; cut++) {
			trace t = {0};
			char err[64];
			int rc = trace_parse((trace_format)f, files[f], cut, NULL, &t, err,
					     sizeof(err));
			cr_expect(rc == TRACE_OK || rc == TRACE_EPARSE);
			trace_free(&t);
		}
		for (size_t pos = 0; pos < len; pos++) {
			for (size_t k = 0; k < sizeof(flips); k++) {
				memcpy(buf, files[f], len);
				buf[pos] = flips[k];
				trace t = {0};
				char err[64];
				int rc = trace_parse((trace_format)f, buf, len, NULL, &t, err,
						     sizeof(err));
				cr_expect(rc == TRACE_OK || rc == TRACE_EPARSE);
				if (rc == TRACE_EPARSE)
					cr_expect(strncmp(err, "line ", 5) == 0, "'%s'", err);
				trace_free(&t);
			}
		}
		free(buf);
	}
}

/* ---- DistServe ----------------------------------------------------------- */

static const char *distserve_fixture =
	"run,n_requests,rate_req_s,seq,prompt_len,output_len,issue_time_rel_s,ttft_ms,tpot_ms,"
	"latency_ms\n"
	"vllm-2-1,2,1,0,55,4,0.0,69.5,26.25,148.0\n"
	"vllm-2-1,2,1,1,300,20,0.75,80.0,30.5,660.0\n"
	"vllm-1-2,1,2,0,10,2,0.0,40.0,20.0,60.0\n";

Test(trace, distserve_reads_one_run_with_its_measured_latencies)
{
	trace t = {0};
	char err[256];
	cr_assert_eq(trace_parse(TRACE_DISTSERVE, distserve_fixture, strlen(distserve_fixture),
				 "vllm-2-1", &t, err, sizeof(err)),
		     TRACE_OK, "%s", err);
	cr_assert_eq(t.n, 2);
	cr_expect_eq(t.reqs[1].prompt_len, 300);
	cr_expect_eq(t.reqs[1].output_len, 20);
	cr_expect_float_eq(t.reqs[1].arrival_us, 750000.0, 1e-6);
	cr_expect_float_eq(t.reqs[1].ref_ttft_ms, 80.0, 1e-9);
	cr_expect_float_eq(t.reqs[1].ref_tpot_ms, 30.5, 1e-9);
	trace_free(&t);
	char names[4][32];
	cr_assert_eq(trace_distserve_runs(distserve_fixture, strlen(distserve_fixture), names, 4),
		     2);
	cr_expect_str_eq(names[0], "vllm-2-1");
	cr_expect_str_eq(names[1], "vllm-1-2");
}

Test(trace, distserve_malformed_lines_name_the_line)
{
	trace t;
	char err[256];
	cr_expect_eq(parse(TRACE_DISTSERVE, "run,prompt_len\nx,1\n", &t, err), TRACE_EPARSE);
	cr_expect(strstr(err, "line 1: header lacks the column 'output_len'"), "%s", err);
	const char *short_row = "run,prompt_len,output_len,issue_time_rel_s,ttft_ms,tpot_ms\n"
				"a,1,1,0,1,1\n"
				"a,1,1,0.5,1\n";
	cr_expect_eq(parse(TRACE_DISTSERVE, short_row, &t, err), TRACE_EPARSE);
	cr_expect(strstr(err, "line 3: expected 6 comma-separated fields, got 5"), "%s", err);
	const char *bad_time = "run,prompt_len,output_len,issue_time_rel_s,ttft_ms,tpot_ms\n"
			       "a,1,1,zero,1,1\n";
	cr_expect_eq(parse(TRACE_DISTSERVE, bad_time, &t, err), TRACE_EPARSE);
	cr_expect(strstr(err, "line 2: bad issue_time_rel_s"), "%s", err);
	const char *back = "run,prompt_len,output_len,issue_time_rel_s,ttft_ms,tpot_ms\n"
			   "a,1,1,2,1,1\na,1,1,1,1,1\n";
	cr_expect_eq(parse(TRACE_DISTSERVE, back, &t, err), TRACE_EPARSE);
	cr_expect(strstr(err, "line 3: issue_time_rel_s goes back"), "%s", err);
}

Test(trace, load_reports_a_missing_file)
{
	trace t = {0};
	char err[256];
	cr_expect_eq(trace_load(TRACE_AZURE, "/nonexistent/trace.csv", NULL, &t, err, sizeof(err)),
		     TRACE_EIO);
	cr_expect(strstr(err, "/nonexistent/trace.csv") != NULL);
}

/* ---- synthetic workloads -------------------------------------------------- */

Test(trace, seed000_workload_follows_its_definition)
{
	trace t = {0};
	cr_assert_eq(trace_seed000(&t, 0), TRACE_OK);
	cr_assert_eq(t.n, 256);
	uint32_t n64 = 0;
	for (uint32_t i = 0; i < t.n; i++) {
		const trace_req *r = &t.reqs[i];
		cr_expect_float_eq(r->arrival_us, 0.0, 1e-12);
		cr_expect(r->prompt_len >= 8 && r->prompt_len <= 64);
		cr_expect(r->output_len == 64 || (r->output_len >= 1 && r->output_len <= 39));
		n64 += r->output_len == 64;
	}
	/* 40% +- 4 sigma of a binomial(256, 0.4) */
	cr_expect(n64 > 70 && n64 < 135, "%u of 256 at 64", n64);
	/* Determinism: the same seed gives the same trace, another a different one. */
	trace u = {0}, v = {0};
	trace_seed000(&u, 0);
	trace_seed000(&v, 1);
	cr_expect_eq(memcmp(t.reqs, u.reqs, 256 * sizeof(trace_req)), 0);
	cr_expect_neq(memcmp(t.reqs, v.reqs, 256 * sizeof(trace_req)), 0);
	/* The mean generation over many seeds is about 37.6. */
	double total = 0.0;
	for (uint64_t s = 0; s < 40; s++) {
		trace w = {0};
		trace_seed000(&w, s);
		for (uint32_t i = 0; i < w.n; i++)
			total += w.reqs[i].output_len;
		trace_free(&w);
	}
	cr_expect(fabs(total / (40 * 256) - 37.6) < 1.0, "mean %g", total / (40 * 256));
	trace_free(&t), trace_free(&u), trace_free(&v);
}

/* CPython: random.seed(s); [(randint(8, 64), 64 if random() < 0.4 else
 * randint(1, 39)) for _ in range(256)] gives, for seed 0, (62, 64), (64, 17),
 * (40, 20), (38, 64), (21, 19), (16, 17), ... with sums 9546 and 9545; seed 1
 * sums 9022 and 10556; seed 20 starts (54, 10), (24, 7), sums 8953, 9308. */
Test(trace, seed000_draws_equal_cpython_random)
{
	const uint32_t first0[6][2] = {{62, 64}, {64, 17}, {40, 20}, {38, 64}, {21, 19}, {16, 17}};
	const struct {
		uint64_t seed;
		uint32_t sum_p, sum_g;
	} sums[3] = {{0, 9546, 9545}, {1, 9022, 10556}, {20, 8953, 9308}};
	trace t = {0};
	cr_assert_eq(trace_seed000(&t, 0), TRACE_OK);
	for (int i = 0; i < 6; i++) {
		cr_expect_eq(t.reqs[i].prompt_len, first0[i][0], "request %d", i);
		cr_expect_eq(t.reqs[i].output_len, first0[i][1], "request %d", i);
	}
	trace_free(&t);
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(trace_seed000(&t, sums[k].seed), TRACE_OK);
		uint32_t sp = 0, sg = 0;
		for (uint32_t i = 0; i < t.n; i++)
			sp += t.reqs[i].prompt_len, sg += t.reqs[i].output_len;
		cr_expect_eq(sp, sums[k].sum_p, "seed %llu", (unsigned long long)sums[k].seed);
		cr_expect_eq(sg, sums[k].sum_g, "seed %llu", (unsigned long long)sums[k].seed);
		trace_free(&t);
	}
	cr_assert_eq(trace_seed000(&t, 20), TRACE_OK);
	cr_expect_eq(t.reqs[0].prompt_len, 54);
	cr_expect_eq(t.reqs[0].output_len, 10);
	cr_expect_eq(t.reqs[1].prompt_len, 24);
	cr_expect_eq(t.reqs[1].output_len, 7);
	trace_free(&t);
}

Test(trace, synthetic_arrivals_have_the_requested_rate)
{
	trace_dist p, o;
	cr_assert_eq(trace_dist_parse("256..2048", &p), 0);
	cr_assert_eq(trace_dist_parse("100", &o), 0);
	cr_expect_eq(p.kind, DIST_UNIFORM);
	cr_expect_eq(o.kind, DIST_CONST);
	trace_dist bad;
	cr_expect_eq(trace_dist_parse("9..3", &bad), -1);
	cr_expect_eq(trace_dist_parse("x", &bad), -1);
	cr_expect_eq(trace_dist_parse("0", &bad), -1);
	cr_expect_eq(trace_dist_parse("5..", &bad), -1);
	trace t = {0};
	cr_assert_eq(trace_synthetic(&t, 4000, ARRIVAL_POISSON, 2.0, &p, &o, 42), TRACE_OK);
	double span = t.reqs[t.n - 1].arrival_us / 1e6;
	cr_expect(fabs(4000 / span - 2.0) < 0.15, "rate %g", 4000 / span);
	for (uint32_t i = 1; i < t.n; i++)
		cr_assert(t.reqs[i].arrival_us >= t.reqs[i - 1].arrival_us);
	trace_free(&t);
	cr_assert_eq(trace_synthetic(&t, 5, ARRIVAL_UNIFORM, 4.0, &p, &o, 1), TRACE_OK);
	cr_expect_float_eq(t.reqs[4].arrival_us, 1e6, 1e-6);
	trace_free(&t);
	/* bursty: the same mean rate, in bursts of 8 requests on average */
	cr_assert_eq(trace_synthetic(&t, 8000, ARRIVAL_BURSTY, 2.0, &p, &o, 42), TRACE_OK);
	span = t.reqs[t.n - 1].arrival_us / 1e6;
	cr_expect(fabs(8000 / span - 2.0) < 0.3, "rate %g", 8000 / span);
	uint32_t bursts = 1;
	for (uint32_t i = 1; i < t.n; i++) {
		cr_assert(t.reqs[i].arrival_us >= t.reqs[i - 1].arrival_us);
		bursts += t.reqs[i].arrival_us > t.reqs[i - 1].arrival_us;
	}
	cr_expect(fabs(8000.0 / bursts - TRACE_BURST_MEAN) < 1.0, "mean burst %g",
		  8000.0 / bursts);
	trace_free(&t);
}

Test(trace, rng_range_covers_its_bounds_uniformly)
{
	trace_rng r;
	trace_rng_seed(&r, 3);
	int hist[5] = {0};
	for (int i = 0; i < 50000; i++) {
		uint32_t v = trace_rng_range(&r, 10, 14);
		cr_assert(v >= 10 && v <= 14);
		hist[v - 10]++;
	}
	for (int k = 0; k < 5; k++)
		cr_expect(abs(hist[k] - 10000) < 500, "bin %d: %d", k, hist[k]);
}
