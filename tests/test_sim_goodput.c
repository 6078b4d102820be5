/*
 * test_sim_goodput.c - bkv-sim's goodput search (sim_goodput_search) and its
 * trust-at-a-glance reports: the bisection on a small synthetic workload
 * (within 1%, the rate found meets the targets and 1.02x of it does not,
 * attainment falls as the rate rises, looser targets never lower it), the
 * arrivals restored afterwards, failed requests counted as errors and the
 * overload line; bucketed arrivals (many requests sharing one time) found,
 * spread within their bucket, and the goodput that spreading makes
 * meaningful.
 */
#include "../examples/sim/sim.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_SEEDS 2
#define RATE0 100.0

static void workload(trace *t, double rate)
{
	trace_dist p = {DIST_UNIFORM, 8, 64}, o = {DIST_SEED000_GEN, 1, 64};
	for (int s = 0; s < N_SEEDS; s++) {
		memset(&t[s], 0, sizeof(t[s]));
		cr_assert_eq(trace_synthetic(&t[s], 300, ARRIVAL_POISSON, rate, &p, &o, (uint64_t)s),
			     TRACE_OK);
	}
}

static void free_all(trace *t)
{
	for (int s = 0; s < N_SEEDS; s++)
		trace_free(&t[s]);
}

static sim_config config(void)
{
	sim_config c;
	sim_config_init(&c);
	c.gen = SIM_GEN_STEPS;
	return c;
}

static double attain_at(const sim_config *c, double rate, double ttft, double tpot)
{
	trace t[N_SEEDS];
	char err[256] = "";
	double a = -1.0;
	workload(t, rate);
	cr_assert_eq(sim_attainment(c, t, N_SEEDS, ttft, tpot, &a, err, sizeof(err)), 0, "%s", err);
	free_all(t);
	return a;
}

static sim_goodput search(const sim_config *c, double ttft, double tpot, double pct)
{
	trace t[N_SEEDS];
	char err[256] = "";
	sim_goodput g;
	workload(t, RATE0);
	double a0 = t[1].reqs[7].arrival_us;
	cr_assert_eq(sim_goodput_search(c, t, N_SEEDS, RATE0, ttft, tpot, pct, &g, err, sizeof(err)),
		     0, "%s", err);
	cr_expect_eq(t[1].reqs[7].arrival_us, a0, "the arrivals are restored");
	free_all(t);
	return g;
}

Test(sim_goodput, bisection_brackets_the_rate_to_one_percent)
{
	sim_config c = config();
	sim_goodput g = search(&c, 20.0, 3.0, 90.0);
	cr_assert_eq(g.capped, 0, "bracketed");
	cr_assert(g.rps > 0.0);
	cr_expect(g.hi_rps > g.rps && g.hi_rps <= 1.01 * g.rps * (1 + 1e-12), "%g .. %g", g.rps,
		  g.hi_rps);
	cr_expect(g.attain >= 0.9);
	cr_expect(g.evals >= 3 && g.evals <= 40, "%d rates", g.evals);
	/* the rate found, drawn afresh at that rate, meets the targets; 1.02x
	 * of it does not */
	cr_expect_geq(attain_at(&c, g.rps, 20.0, 3.0), 0.9);
	cr_expect_lt(attain_at(&c, 1.02 * g.rps, 20.0, 3.0), 0.9);
}

Test(sim_goodput, attainment_falls_as_the_rate_rises)
{
	sim_config c = config();
	double prev = 2.0;
	/* from light load to well past the knee (goodput about 235 req/s);
	 * far beyond it attainment is a few percent either way and may wobble */
	for (double r = 50.0; r <= 1600.0; r *= 2.0) {
		double a = attain_at(&c, r, 20.0, 3.0);
		cr_expect_leq(a, prev + 1e-12, "rate %g: %g after %g", r, a, prev);
		prev = a;
	}
	cr_expect_lt(prev, 0.5, "overloaded at the highest rate");
}

Test(sim_goodput, looser_targets_never_lower_the_goodput)
{
	sim_config c = config();
	sim_goodput tight = search(&c, 20.0, 3.0, 90.0);
	sim_goodput ttft = search(&c, 40.0, 3.0, 90.0);
	sim_goodput pct = search(&c, 20.0, 3.0, 50.0);
	cr_expect_geq(ttft.rps, tight.rps * 0.99);
	cr_expect_geq(pct.rps, tight.rps * 0.99);
	/* a batching policy of the same engine: static batching holds every
	 * request for a whole group, so its goodput is lower */
	sim_config s = config();
	s.policy = BKV_POLICY_STATIC;
	sim_goodput st = search(&s, 20.0, 3.0, 90.0);
	cr_expect_lt(st.rps, tight.rps, "static %g, continuous %g", st.rps, tight.rps);
}

Test(sim_goodput, bad_targets_are_refused)
{
	sim_config c = config();
	trace t[N_SEEDS];
	char err[256] = "";
	sim_goodput g;
	workload(t, RATE0);
	cr_expect_eq(sim_goodput_search(&c, t, N_SEEDS, RATE0, 0.0, 3.0, 90.0, &g, err, sizeof(err)),
		     BKV_EINVAL);
	cr_expect_eq(sim_goodput_search(&c, t, N_SEEDS, RATE0, 20.0, 3.0, 101.0, &g, err,
					sizeof(err)),
		     BKV_EINVAL);
	cr_expect_eq(sim_goodput_search(&c, t, N_SEEDS, 0.0, 20.0, 3.0, 90.0, &g, err, sizeof(err)),
		     BKV_EINVAL);
	free_all(t);
}

/* A pool of one block: most requests fail at submission; the row counts
 * them, and the warning names the row. */
Test(sim_goodput, failed_requests_are_counted_and_warned)
{
	trace t[N_SEEDS];
	workload(t, RATE0);
	sim_config c = config();
	c.kv_blocks = 1;
	sim_result r;
	char err[256] = "";
	memset(&r, 0, sizeof(r));
	snprintf(r.label, sizeof(r.label), "k=1");
	cr_assert_eq(sim_run(&c, &t[0], &r, err, sizeof(err)), 0, "%s", err);
	cr_expect_gt(r.errors, 0);
	sim_row row;
	sim_rows_from_runs(&row, &r, NULL, 1);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert(f);
	cr_expect_eq(sim_warn_errors(f, &row, 1), 1);
	fclose(f);
	cr_expect(strstr(buf, "k=1") && strstr(buf, "requests failed"), "%s", buf);
	free(buf);
	free_all(t);
}

/* A workload at 20x the rate it can serve: the overload line appears, and
 * not at a light load. */
Test(sim_goodput, overload_line_when_the_makespan_outruns_the_arrivals)
{
	sim_config c = config();
	for (int heavy = 0; heavy < 2; heavy++) {
		trace t[N_SEEDS];
		workload(t, heavy ? 20000.0 : 10.0);
		sim_result r;
		char err[256] = "";
		memset(&r, 0, sizeof(r));
		cr_assert_eq(sim_run(&c, &t[0], &r, err, sizeof(err)), 0, "%s", err);
		sim_row row;
		sim_rows_from_runs(&row, &r, NULL, 1);
		char *buf = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);
		sim_note_overload(f, &row, 1);
		fclose(f);
		if (heavy)
			cr_expect(strstr(buf, "overload:") != NULL, "%s", buf);
		else
			cr_expect_eq(len, 0, "%s", buf);
		free(buf);
		free_all(t);
	}
}

/* The peer presets: the labels other projects read, the knobs each sets,
 * and a clean run of each on seed 000's workload. */
Test(sim_goodput, peer_presets_have_their_labels_and_knobs)
{
	static const char *want[] = {"vllm-v1", "vllm-v0", "sglang", "sarathi",
				     "tgi", "llamacpp", "orca"};
	cr_assert_eq(SIM_N_PEERS, 7);
	for (int i = 0; i < SIM_N_PEERS; i++)
		cr_expect_str_eq(sim_peer_names[i], want[i]);
	trace t = {0};
	cr_assert_eq(trace_seed000(&t, 0), TRACE_OK);
	sim_config c0 = config(), c[SIM_N_PEERS];
	for (int i = 0; i < SIM_N_PEERS; i++) {
		sim_peer_config(i, &c0, &t, 0, 0.0, &c[i]);
		cr_expect_leq(c[i].slots, c0.slots, "%s", want[i]);
		cr_expect_eq(c[i].pool_slots, c0.slots, "%s keeps the machine's pool", want[i]);
		cr_expect_eq(c[i].policy, BKV_POLICY_CONTINUOUS);
		sim_result r;
		char err[256] = "";
		memset(&r, 0, sizeof(r));
		cr_assert_eq(sim_run(&c[i], &t, &r, err, sizeof(err)), 0, "%s: %s", want[i], err);
		cr_expect_eq(r.errors, 0, "%s", want[i]);
		cr_expect_eq(r.finished, t.n, "%s", want[i]);
	}
	cr_expect(c[0].chunked && c[0].mixed_host && c[0].budget == 2048);
	cr_expect(!c[1].chunked && !c[1].mixed_host && c[1].k == 1);
	cr_expect(!c[2].chunked && !c[2].mixed_host);
	cr_expect(c[3].chunked && c[3].budget == 512 && c[3].tpot_us == 0);
	cr_expect(c[4].k == c0.slots && c[4].max_wait_us > 0 && c[4].max_wait_us != UINT64_MAX);
	cr_expect(c[5].chunked && c[5].budget == 2048 && c[5].slots == 1);
	cr_expect(c[6].mixed_host && !c[6].chunked);
	/* vLLM's H100-class defaults; Sarathi under a TBT target; Orca's
	 * reservation under a fixed pool */
	sim_config v;
	sim_peer_config(0, &c0, &t, 1, 0.0, &v);
	cr_expect_eq(v.budget, 8192);
	sim_peer_config(3, &c0, &t, 0, 4.0, &v);
	cr_expect(v.budget == 0 && v.tpot_us == 4000);
	sim_config small = c0;
	small.kv_blocks = 60;
	small.oracle = 1; /* longest seed 000 request: 64 + 65 tokens = 10 blocks */
	sim_peer_config(6, &small, &t, 0, 0.0, &v);
	cr_expect_eq(v.slots, 6);
	small.oracle = 0; /* each reserves 64 + 4,096 tokens: 260 + 1 blocks */
	small.kv_blocks = 5 * 261;
	sim_peer_config(6, &small, &t, 0, 0.0, &v);
	cr_expect_eq(v.slots, 5, "Orca reserves the cap requests are sent with");
	trace_free(&t);
}

/* A parse error names the file and the line; a binary file says so. */
Test(sim_goodput, trace_errors_name_the_file_and_a_binary_file_is_named_binary)
{
	char bad[] = "/tmp/bkv_sim_badXXXXXX", bin[] = "/tmp/bkv_sim_binXXXXXX";
	int fd = mkstemp(bad);
	cr_assert(fd >= 0);
	FILE *f = fdopen(fd, "w");
	fputs("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
	      "bad,line\n",
	      f);
	fclose(f);
	fd = mkstemp(bin);
	cr_assert(fd >= 0);
	f = fdopen(fd, "w");
	fwrite("\x7f" "ELF\x02\x01\x01\x00\x00\x00", 1, 10, f);
	fclose(f);
	trace t = {0};
	char err[512] = "";
	cr_expect_eq(trace_load(TRACE_AZURE, bad, NULL, &t, err, sizeof(err)), TRACE_EPARSE);
	cr_expect(strstr(err, bad) && strstr(err, "line 3"), "%s", err);
	cr_expect_eq(trace_load(TRACE_AZURE, bin, NULL, &t, err, sizeof(err)), TRACE_EPARSE);
	cr_expect(strstr(err, bin) && strstr(err, "binary"), "%s", err);
	remove(bad);
	remove(bin);
}

/* The goodput chart: every rate searched is a point, each row in the
 * legend with its goodput, both panels drawn. */
Test(sim_goodput, goodput_chart_has_every_row_and_both_panels)
{
	sim_config c[2] = {config(), config()};
	c[1].policy = BKV_POLICY_STATIC;
	sim_goodput g[2];
	g[0] = search(&c[0], 20.0, 3.0, 90.0);
	g[1] = search(&c[1], 20.0, 3.0, 90.0);
	cr_expect_eq(g[0].pt[0].rps, RATE0, "the first rate tried is the workload's");
	cr_expect(g[0].pt[0].ttft_p99_ms > 0.0 && g[0].pt[0].tpot_p99_ms > 0.0);
	char path[] = "/tmp/bkv_sim_gpXXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);
	const char *labels[] = {"k=1", "static"};
	cr_assert_eq(sim_goodput_svg(path, "t", labels, g, 2, 20.0, 3.0, 90.0), 0);
	FILE *f = fopen(path, "r");
	char buf[65536];
	size_t len = fread(buf, 1, sizeof(buf) - 1, f);
	buf[len] = 0;
	fclose(f);
	remove(path);
	cr_expect(strstr(buf, "p99 TTFT") && strstr(buf, "p99 TPOT"));
	cr_expect(strstr(buf, "k=1: ") && strstr(buf, "static: "));
	cr_expect(strstr(buf, "<polyline") != NULL);
	cr_expect(strstr(buf, "</svg>") != NULL);
}

/* n_b buckets 3 s apart of k requests each sharing one time (Mooncake's
 * shape), prompts of 64 tokens, 8 generated. */
static void bucketed(trace *t, uint32_t n_b, uint32_t k)
{
	memset(t, 0, sizeof(*t));
	for (uint32_t b = 0; b < n_b; b++)
		for (uint32_t j = 0; j < k; j++)
			cr_assert_eq(trace_push(t, 3e6 * b, 64, 8, NULL, 0), TRACE_OK);
}

Test(sim_goodput, bucketed_arrivals_are_found_and_spread_within_their_bucket)
{
	trace t, u;
	sim_buckets b;
	bucketed(&t, 10, 12);
	cr_assert_eq(sim_trace_buckets(&t, &b), 1, "bucketed");
	cr_expect_eq(b.shared, 120);
	cr_expect_eq(b.times, 10);
	cr_expect_eq(b.largest, 12);
	cr_expect_eq(b.width_us, 3e6);
	sim_trace_spread(&t, &b, 5);
	for (uint32_t i = 0; i < t.n; i++) {
		double a0 = 3e6 * (i / 12);
		cr_expect(t.reqs[i].arrival_us >= a0 && t.reqs[i].arrival_us < a0 + 3e6,
			  "request %u at %g stays in its bucket", i, t.reqs[i].arrival_us);
		if (i)
			cr_expect(t.reqs[i].arrival_us > t.reqs[i - 1].arrival_us,
				  "file order kept, no two at once");
	}
	cr_expect_eq(sim_trace_buckets(&t, &b), 0, "spread: no longer bucketed");
	/* the same seed gives the same arrivals, another seed others */
	bucketed(&u, 10, 12);
	sim_buckets bu;
	sim_trace_buckets(&u, &bu);
	sim_trace_spread(&u, &bu, 5);
	cr_expect_eq(memcmp(t.reqs, u.reqs, t.n * sizeof(t.reqs[0])), 0);
	trace_free(&u);
	bucketed(&u, 10, 12);
	sim_trace_spread(&u, &bu, 6);
	cr_expect_neq(t.reqs[3].arrival_us, u.reqs[3].arrival_us);
	trace_free(&u);
	trace_free(&t);
	/* Poisson arrivals are not bucketed */
	trace p[N_SEEDS];
	workload(p, RATE0);
	cr_expect_eq(sim_trace_buckets(&p[0], &b), 0);
	free_all(p);
}

/* Bucketed arrivals stay a burst at every rate: spreading them within their
 * bucket gives the goodput search rates that separate the requests. */
Test(sim_goodput, spreading_a_bucketed_trace_raises_its_goodput)
{
	sim_config c = config();
	c.gen = SIM_GEN_TOKENS;
	trace t;
	sim_buckets b;
	char err[256] = "";
	sim_goodput g0, g1;
	bucketed(&t, 20, 16);
	double r0 = sim_trace_rate(&t);
	cr_assert_eq(sim_goodput_search(&c, &t, 1, r0, 5.0, 3.0, 90.0, &g0, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_eq(sim_trace_buckets(&t, &b), 1);
	sim_trace_spread(&t, &b, 0);
	r0 = sim_trace_rate(&t);
	cr_assert_eq(sim_goodput_search(&c, &t, 1, r0, 5.0, 3.0, 90.0, &g1, err, sizeof(err)), 0,
		     "%s", err);
	cr_expect(g1.rps > g0.rps, "spread %g (capped %d) against bucketed %g (capped %d) req/s",
		  g1.rps, g1.capped, g0.rps, g0.capped);
	cr_expect_eq(g0.capped, -1, "bucketed: %g req/s", g0.rps);
	trace_free(&t);
}

/* Rows with identical searches share one line and one legend entry that
 * names them all; distinct rows get distinct colours; the rate axis fits
 * the rates simulated. */
Test(sim_goodput, goodput_chart_draws_identical_rows_once_in_distinct_colours)
{
	sim_config c[2] = {config(), config()};
	c[1].policy = BKV_POLICY_STATIC;
	sim_goodput g[3];
	g[0] = search(&c[0], 20.0, 3.0, 90.0);
	g[1] = g[0];
	g[2] = search(&c[1], 20.0, 3.0, 90.0);
	char path[] = "/tmp/bkv_sim_gpXXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);
	const char *labels[] = {"k=1", "k=4", "static"};
	cr_assert_eq(sim_goodput_svg(path, "t", labels, g, 3, 20.0, 3.0, 90.0), 0);
	FILE *f = fopen(path, "r");
	static char buf[1 << 18];
	size_t len = fread(buf, 1, sizeof(buf) - 1, f);
	buf[len] = 0;
	fclose(f);
	remove(path);
	cr_expect(strstr(buf, "k=1, k=4: ") != NULL, "one legend entry names both");
	cr_expect(strstr(buf, "identical results share one line") != NULL);
	int lines = 0;
	for (const char *p = buf; (p = strstr(p, "<polyline")); p++)
		lines++;
	cr_expect_eq(lines, 4, "two series in two panels, not three: %d", lines);
	cr_expect(strstr(buf, "stroke=\"#0072B2\"") && strstr(buf, "stroke=\"#D55E00\""),
		  "Okabe-Ito colours, one per series");
	/* every rate tick lies within 1.2x of the rates simulated */
	double lo = 1e300, hi = 0.0;
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < g[i].evals && k < SIM_GOODPUT_POINTS; k++) {
			if (g[i].pt[k].rps < lo)
				lo = g[i].pt[k].rps;
			if (g[i].pt[k].rps > hi)
				hi = g[i].pt[k].rps;
		}
	int ticks = 0;
	const char *key = "text-anchor=\"middle\">";
	for (const char *p = buf; (p = strstr(p, key)); p++) {
		char *end;
		double v = strtod(p + strlen(key), &end);
		if (end == p + strlen(key) || strncmp(end, "</text>", 7))
			continue;
		ticks++;
		cr_expect(v >= lo / 1.2 * (1 - 1e-9) && v <= hi * 1.2 * (1 + 1e-9),
			  "rate tick %g outside %g .. %g", v, lo, hi);
	}
	cr_expect(ticks >= 2, "%d rate ticks", ticks);
}
