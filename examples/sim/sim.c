/*
 * sim.c - bkv-sim's main: pick a workload or a trace, a policy, a host shape
 * and a cost model (the command line: cli.c), run the real scheduler on a
 * virtual clock (host.c) over one or more seeds and sweep values, and report
 * (report.c, svg.c).
 *
 *   bkv-sim --workload seed000 --sweep k=1,2,4,8,16,32
 *   bkv-sim --trace azure:FILE --cost roofline:a100-llama2-13b --slots 64
 *   bkv-sim --trace distserve:FILE --fidelity
 *   bkv-sim --workload seed000 --compare      static, k=1, fixed-k sweep, auto,
 *                                             chunked, with ratios
 *
 * main runs one of three modes: --fidelity (every DistServe run against its
 * measurement), --compare (every policy on the same traces, then the
 * ratios), or the plain rows (a static baseline, then the policy or each
 * swept value). Every run of a row uses the same traces as the static
 * baseline of the same seed, so speed-ups are paired. Output is
 * deterministic for given options (the wall-clock column of --json aside).
 * See docs/benchmarks.md.
 */
#include "cli.h"
#include "sim.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Build the trace of one seed. */
static int make_trace(const opts *o, uint64_t seed, trace *t, char *err, size_t errlen)
{
	memset(t, 0, sizeof(*t));
	int rc;
	if (o->trace_path) {
		rc = trace_load(o->fmt, o->trace_path, o->run, t, err, errlen);
		if (rc == 0 && o->limit && t->n > o->limit)
			t->n = o->limit;
		if (rc == 0 && t->n == 0) {
			snprintf(err, errlen, "%s: no requests%s%s", o->trace_path,
				 o->run ? " in run " : "", o->run ? o->run : "");
			rc = TRACE_EPARSE;
		}
		return rc;
	}
	if (!strcmp(o->workload, "seed000"))
		return trace_seed000(t, seed);
	if (!strcmp(o->workload, "sessions"))
		return trace_sessions(t, &o->sessions, o->arrival, o->rate, &o->prompt, &o->output,
				      seed);
	return trace_synthetic(t, o->n, o->arrival, o->rate, &o->prompt, &o->output, seed);
}

static void apply_sweep(sim_config *c, const char *key, uint32_t v, char *label, size_t len)
{
	if (!strcmp(key, "k")) {
		c->k = v;
		snprintf(label, len, "k=%u", v);
	} else if (!strcmp(key, "budget")) {
		c->budget = v;
		snprintf(label, len, "budget=%u", v);
	} else if (!strcmp(key, "slots")) {
		c->slots = v;
		snprintf(label, len, "slots=%u", v);
	} else if (!strcmp(key, "max_adapters")) {
		c->max_adapters = v;
		snprintf(label, len, "adapters<=%u", v);
	}
}

static void policy_label(const sim_config *c, char *label, size_t len)
{
	if (c->policy == BKV_POLICY_STATIC)
		snprintf(label, len, "static");
	else if (c->chunked && c->budget == 0)
		snprintf(label, len, "chunked auto");
	else if (c->chunked)
		snprintf(label, len, "chunked b=%u", c->budget);
	else if (c->k == 0)
		snprintf(label, len, "auto");
	else
		snprintf(label, len, "k=%u", c->k);
}

/* The monotonic wall clock, s. */
static double wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* When the last progress line went to a stderr that is not a terminal. */
static double last_line_s;

/* Progress on stderr, stdout untouched: on a terminal one line rewritten in
 * place; else (a pipe, a log) a whole line at most every SIM_PROGRESS_S,
 * or always with force. */
static void progress_line(const opts *o, int force, const char *fmt, ...)
{
	if (o->quiet)
		return;
	va_list ap;
	va_start(ap, fmt);
	if (isatty(2)) {
		fputc('\r', stderr);
		vfprintf(stderr, fmt, ap);
		fflush(stderr);
	} else {
		double now = wall_s();
		if (force || last_line_s == 0.0 || now - last_line_s >= SIM_PROGRESS_S) {
			char line[256];
			vsnprintf(line, sizeof(line), fmt, ap);
			size_t n = strlen(line);
			while (n && line[n - 1] == ' ') /* the terminal's padding */
				line[--n] = 0;
			fprintf(stderr, "bkv-sim: %s\n", line);
			last_line_s = now;
		}
	}
	va_end(ap);
}

static void progress(const opts *o, const char *label, uint64_t seed, int done, int total)
{
	progress_line(o, 0, "[%d/%d] %-16s seed %-6llu", done, total, label,
		      (unsigned long long)seed);
}

/* Run every seed of one configuration into runs[]. */
static int run_seeds(const opts *o, const sim_config *c, const char *label, trace *traces,
		     int n_seeds, sim_result *runs, int *done, int total)
{
	for (int s = 0; s < n_seeds; s++) {
		char err[256] = "";
		progress(o, label, o->seed_lo + (uint64_t)s, ++*done, total);
		snprintf(runs[s].label, sizeof(runs[s].label), "%s", label);
		int rc = sim_run(c, &traces[s], &runs[s], err, sizeof(err));
		if (rc) {
			if (!o->quiet && isatty(2))
				fputc('\n', stderr);
			fprintf(stderr, "bkv-sim: %s, seed %llu: %s\n", label,
				(unsigned long long)(o->seed_lo + (uint64_t)s), err);
			return rc;
		}
		if (c->spec_k) /* speculative decoding: on stderr, the reports unchanged */
			fprintf(stderr,
				"bkv-sim: %s, seed %llu: speculation: %llu drafts, %llu accepted "
				"(%.3f); blocks drafts held per running row %.3f, reserving %u "
				"slots per row would hold %.3f\n",
				label, (unsigned long long)(o->seed_lo + (uint64_t)s),
				(unsigned long long)runs[s].spec_drafted,
				(unsigned long long)runs[s].spec_accepted,
				runs[s].spec_drafted ? (double)runs[s].spec_accepted /
							       (double)runs[s].spec_drafted
						     : 0.0,
				runs[s].spec_blocks_row, c->spec_k, runs[s].spec_reserve_row);
	}
	return 0;
}

/* The rate the traces' arrivals stand for: a synthetic workload's rate, a
 * file's own mean rate; 0 when arrivals are not spread in time. */
static double base_rate(const opts *o, const trace *t)
{
	if (o->trace_path)
		return sim_trace_rate(t);
	if (!strcmp(o->workload, "synthetic") && o->arrival != ARRIVAL_BURST)
		return o->rate;
	return 0.0;
}

/* --goodput: search every row's rate (sim_goodput_search) into rows[]; with
 * --svg, the chart of p99s against rate instead of the bars. */
static int goodput_rows(const opts *o, const sim_config *cf, sim_row *rows, int n_rows,
			trace *traces, int n_seeds)
{
	double r0 = base_rate(o, &traces[0]);
	sim_goodput *all = calloc((size_t)n_rows, sizeof(*all));
	const char **labels = calloc((size_t)n_rows, sizeof(*labels));
	if (!all || !labels) {
		free(all);
		free(labels);
		return 1;
	}
	for (int i = 0; i < n_rows; i++) {
		sim_goodput g;
		char err[256] = "";
		progress_line(o, 1, "[goodput %d/%d] %-16s", i + 1, n_rows, rows[i].med.label);
		sim_config c = cf[i];
		c.progress = 0;
		if (sim_goodput_search(&c, traces, n_seeds, r0, o->gp_ttft_ms, o->gp_tpot_ms,
				       o->gp_pct, &g, err, sizeof(err))) {
			fprintf(stderr, "bkv-sim: goodput of %s: %s\n", rows[i].med.label, err);
			free(all);
			free(labels);
			return 1;
		}
		all[i] = g;
		labels[i] = rows[i].med.label;
		rows[i].has_goodput = 1;
		rows[i].goodput_rps = g.rps;
		rows[i].goodput_capped = g.capped;
	}
	if (!o->quiet && isatty(2))
		fprintf(stderr, "\r%-72s\r", "");
	int st = 0;
	if (o->svg) {
		char title[200];
		snprintf(title, sizeof(title), "bkv-sim goodput: %s (TTFT <= %g ms, TPOT <= %g ms)",
			 o->trace_path ? o->trace_path : o->workload, o->gp_ttft_ms, o->gp_tpot_ms);
		if (sim_goodput_svg(o->svg, title, labels, all, n_rows, o->gp_ttft_ms, o->gp_tpot_ms,
				    o->gp_pct)) {
			fprintf(stderr, "bkv-sim: cannot write %s\n", o->svg);
			st = 1;
		}
	}
	free(all);
	free(labels);
	return st;
}

static void print_goodput(const opts *o, const sim_row *rows, int n_rows, const trace *t)
{
	if (!o->goodput || o->fmt_out != SIM_TABLE)
		return;
	printf("goodput: the highest arrival rate at which %g%% of requests meet TTFT <= %g ms "
	       "and TPOT <= %g ms (bisection to 1%%; the workload's own rate %.4g req/s)\n",
	       o->gp_pct, o->gp_ttft_ms, o->gp_tpot_ms, base_rate(o, t));
	if (o->spread)
		printf("(the trace's arrivals come in %.3g s buckets, %u of %u requests sharing "
		       "a time; they are spread uniformly over their bucket, seed %llu, so that "
		       "rescaling separates them; --no-spread keeps them)\n",
		       o->buckets.width_us / 1e6, o->buckets.shared, t->n,
		       (unsigned long long)o->seed_lo);
	else if (o->bucketed)
		printf("(WARNING: the trace's arrivals come in %.3g s buckets, %u of %u requests "
		       "sharing a time, kept as recorded (--no-spread): each bucket arrives as one "
		       "burst at every rate)\n",
		       o->buckets.width_us / 1e6, o->buckets.shared, t->n);
	for (int i = 0; i < n_rows; i++) {
		const sim_row *r = &rows[i];
		if (r->goodput_capped < 0)
			printf("  %-14s        0 req/s (not met even at 2^-20 of the workload's rate)\n",
			       r->med.label);
		else
			printf("  %-14s %10.4g req/s%s\n", r->med.label, r->goodput_rps,
			       r->goodput_capped > 0 ? " (a lower bound: met at 2^20 of the "
						       "workload's rate)"
						     : "");
	}
}

/* After a report: warn about failed requests and overload. Returns the exit
 * status errors give (3 unless --allow-errors). */
static int after_report(const opts *o, const sim_row *rows, int n)
{
	sim_note_overload(o->fmt_out == SIM_TABLE ? stdout : stderr, rows, n);
	if (sim_warn_errors(stderr, rows, n) && !o->allow_errors) {
		fprintf(stderr, "bkv-sim: requests failed: exit status 3 (--allow-errors to "
				"accept)\n");
		return 3;
	}
	return 0;
}

#define REL(sim_, ref_) (100.0 * ((sim_) - (ref_)) / (ref_))

/* --fidelity's attainment targets: those of DistServe's check of its own
 * simulator against these runs (simdistserve/benchmarks/alignment/
 * align_with_real.py, commit 20a1633: TTFT 200 ms, TPOT 100 ms) */
#define FIDELITY_TTFT_MS 200.0
#define FIDELITY_TPOT_MS 100.0

/* --fidelity's table: per run, measured and simulated mean and p90 of TTFT
 * and TPOT, with the relative errors; the footer names the engine
 * calibration c0 adds to the preset, if any. */
static void fidelity_table(const sim_row *rows, int nr, const sim_config *c0)
{
	printf("%-12s %4s %9s %9s %7s %9s %9s %7s %7s %7s %7s %7s %7s %7s %6s %6s\n", "run",
	       "reqs", "ttft_meas", "ttft_sim", "err", "p90_meas", "p90_sim", "err", "tpot_m",
	       "tpot_s", "err", "p90_m", "p90_s", "err", "slo_m", "slo_s");
	for (int i = 0; i < nr; i++) {
		const sim_result *r = &rows[i].med;
		double n = r->n_req ? r->n_req : 1;
		printf("%-12s %4u %9.1f %9.1f %+6.1f%% %9.1f %9.1f %+6.1f%% %7.2f %7.2f %+6.1f%% "
		       "%7.2f %7.2f %+6.1f%% %5.1f%% %5.1f%%\n",
		       r->label, r->n_req, r->ref_ttft_mean, r->ttft_mean,
		       REL(r->ttft_mean, r->ref_ttft_mean), r->ref_ttft_p90, r->ttft_p90,
		       REL(r->ttft_p90, r->ref_ttft_p90), r->ref_tpot_mean, r->tpot_mean,
		       REL(r->tpot_mean, r->ref_tpot_mean), r->ref_tpot_p90, r->tpot_p90,
		       REL(r->tpot_p90, r->ref_tpot_p90), 100.0 * r->ref_slo_met / n,
		       100.0 * r->slo_met / n);
	}
	printf("(TTFT and TPOT in ms, mean and p90 over the run's requests; TPOT over "
	       "requests with more than one output token; slo_m, slo_s: the share of requests "
	       "with TTFT <= %g ms and TPOT <= %g ms, measured and simulated, the targets "
	       "DistServe's own alignment check uses; policy: the vllm-v0 preset, "
	       "prefill-first steps)\n",
	       FIDELITY_TTFT_MS, FIDELITY_TPOT_MS);
	if (c0->call_overhead_us > 0.0 || c0->row_overhead_us > 0.0 ||
	    (c0->prefill_scale > 0.0 && c0->prefill_scale != 1.0))
		printf("(engine calibration: %.3f us per call, %.3f us per row, prefill x %g)\n",
		       c0->call_overhead_us, c0->row_overhead_us,
		       c0->prefill_scale > 0.0 ? c0->prefill_scale : 1.0);
}

static int fidelity(const opts *o, sim_config *c0)
{
	FILE *f = fopen(o->trace_path, "rb");
	if (!f) {
		fprintf(stderr, "bkv-sim: %s: %s\n", o->trace_path, strerror(errno));
		return 1;
	}
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc(len > 0 ? (size_t)len : 1);
	size_t got = buf ? fread(buf, 1, (size_t)len, f) : 0;
	fclose(f);
	char names[32][32];
	int nr = buf ? trace_distserve_runs(buf, got, names, 32) : -1;
	if (nr <= 0) {
		fprintf(stderr, "bkv-sim: %s: no runs found\n", o->trace_path);
		free(buf);
		return 1;
	}
	sim_row *rows = calloc((size_t)nr, sizeof(*rows));
	int status = 0;
	for (int i = 0; i < nr && rows; i++) {
		trace t = {0};
		char err[256];
		int rc = trace_parse(TRACE_DISTSERVE, buf, got, names[i], &t, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "bkv-sim: %s: %s\n", o->trace_path, err);
			status = 1;
			break;
		}
		sim_result r;
		sim_config c;
		/* vLLM v0, the engine DistServe measured, on the run's machine */
		sim_peer_config(1, c0, &t, o->big_gpu, 0.0, &c);
		c.slo_ttft_ms = FIDELITY_TTFT_MS;
		c.slo_tpot_ms = FIDELITY_TPOT_MS;
		snprintf(r.label, sizeof(r.label), "%s", names[i]);
		progress(o, names[i], 0, i + 1, nr);
		rc = sim_run(&c, &t, &r, err, sizeof(err));
		trace_free(&t);
		if (rc) {
			fprintf(stderr, "bkv-sim: %s: %s\n", names[i], err);
			status = 1;
			break;
		}
		sim_rows_from_runs(&rows[i], &r, NULL, 1);
	}
	if (!o->quiet && isatty(2))
		fputc('\n', stderr);
	if (!status) {
		if (o->fmt_out != SIM_TABLE) {
			sim_report(stdout, o->fmt_out, rows, nr, 0, NULL);
		} else {
			fidelity_table(rows, nr, c0);
		}
		status = after_report(o, rows, nr);
	}
	free(rows);
	free(buf);
	return status;
}

/* How much faster a is than b on the same traces: per seed, b's makespan
 * over a's, then the median over seeds. */
static double paired_ratio(const sim_result *a, const sim_result *b, int n)
{
	double *v = malloc((size_t)n * sizeof(double));
	if (!v)
		return 0.0;
	for (int i = 0; i < n; i++)
		v[i] = a[i].makespan_us > 0 ? b[i].makespan_us / a[i].makespan_us : 0.0;
	double m = sim_median(v, n);
	free(v);
	return m;
}

/* Clear the progress line (when there is one). */
static void progress_done(const opts *o)
{
	if (!o->quiet && isatty(2))
		fprintf(stderr, "\r%-72s\r", "");
}

/* ---- --compare ----------------------------------------------------------- */

/* The fixed k of --compare into ks ([MAX_SWEEP]): the given list or the
 * default one, each at most --slots, k = 1 always first. Returns how many. */
static int compare_ks(const opts *o, const sim_config *c0, uint32_t *ks)
{
	static const uint32_t def_k[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128};
	int nk = 0;
	if (o->n_cmp_k) {
		for (int i = 0; i < o->n_cmp_k; i++)
			if (o->cmp_k[i] <= c0->slots)
				ks[nk++] = o->cmp_k[i];
	} else {
		for (size_t i = 0; i < sizeof(def_k) / sizeof(def_k[0]); i++)
			if (def_k[i] <= c0->slots)
				ks[nk++] = def_k[i];
	}
	if (nk == 0 || ks[0] != 1) { /* k = 1 always runs */
		memmove(ks + 1, ks, (size_t)nk * sizeof(ks[0]));
		ks[0] = 1;
		nk++;
	}
	return nk;
}

/* The rows of --compare into cf[n_rows]: static, k..., auto, chunked
 * b=512, chunked auto[, peers]. */
static void compare_configs(const opts *o, const sim_config *c0, const trace *traces,
			    const uint32_t *ks, int nk, sim_config *cf, int n_rows)
{
	for (int i = 0; i < n_rows; i++) {
		cf[i] = *c0;
		cf[i].policy = BKV_POLICY_CONTINUOUS;
		cf[i].chunked = 0;
	}
	cf[0].policy = BKV_POLICY_STATIC;
	cf[0].mixed_host = 0;
	cf[0].hints = 0; /* the baseline is seed 000's FCFS static */
	for (int i = 0; i < nk; i++)
		cf[1 + i].k = ks[i];
	cf[1 + nk].k = 0;
	cf[2 + nk].k = 0;
	cf[2 + nk].chunked = 1;
	cf[2 + nk].mixed_host = 1;
	cf[2 + nk].budget = 512;
	cf[3 + nk].k = 0;
	cf[3 + nk].chunked = 1;
	cf[3 + nk].mixed_host = 1;
	cf[3 + nk].budget = 0;
	for (int p = 0; o->peers && p < SIM_N_PEERS; p++)
		sim_peer_config(p, c0, &traces[0], o->big_gpu,
				o->goodput ? o->gp_tpot_ms : 0.0, &cf[4 + nk + p]);
	for (int i = 0; i < n_rows; i++) /* a launch is one mixed call */
		cf[i].overlap = cf[i].mixed_host ? c0->overlap : 0;
}

/* The ratios after --compare's table: the best fixed k (highest median
 * speed-up; on a tie to 0.05% the lower p99 TTFT), auto against it and
 * against static, and the time between tokens against a TPOT target.
 * rows[1 + nk] is auto; runs holds n_seeds runs per row. */
static void compare_summary(const opts *o, const sim_config *c0, const sim_row *rows,
			    const sim_result *runs, char (*labels)[48], int nk, int n_rows,
			    int n_seeds)
{
	int best = 1;
	for (int i = 2; i <= nk; i++) {
		double d = rows[i].speedup - rows[best].speedup;
		if (d > 0.0005 * rows[best].speedup ||
		    (fabs(d) <= 0.0005 * rows[best].speedup &&
		     rows[i].med.ttft_p99 < rows[best].med.ttft_p99))
			best = i;
	}
	const sim_result *ra = &runs[(size_t)(1 + nk) * n_seeds];
	const sim_result *rb = &runs[(size_t)best * n_seeds];
	FILE *out = o->fmt_out == SIM_TABLE ? stdout : stderr;
	fprintf(out, "best fixed k: %s (speed-up %.3f, p99 TTFT %.2f ms)\n", labels[best],
		rows[best].speedup, rows[best].med.ttft_p99);
	if (c0->overlap)
		fprintf(out, "overlap: the rows on a mixed host overlap their steps; the split-host "
			     "rows (static, fixed k, split-host peers) run synchronous steps, since "
			     "an overlapped launch is one mixed call\n");
	fprintf(out, "auto / best fixed k: %.4f (median over seeds of paired makespan "
		     "ratios; medians of speed-ups %.3f / %.3f = %.4f)\n",
		paired_ratio(ra, rb, n_seeds), rows[1 + nk].speedup, rows[best].speedup,
		rows[best].speedup > 0 ? rows[1 + nk].speedup / rows[best].speedup : 0.0);
	fprintf(out, "auto vs best fixed k, p99 TTFT: %.2f vs %.2f ms; p99 time between "
		     "tokens %.2f vs %.2f ms\n",
		rows[1 + nk].med.ttft_p99, rows[best].med.ttft_p99, rows[1 + nk].med.tbt_p99,
		rows[best].med.tbt_p99);
	fprintf(out, "auto / static: %.4f; chunked b=512 / static: %.4f; chunked auto / "
		     "static: %.4f\n",
		rows[1 + nk].speedup, rows[2 + nk].speedup, rows[3 + nk].speedup);
	if (c0->tpot_us) {
		fprintf(out, "TPOT target %.2f ms; p99 time between tokens:", c0->tpot_us / 1000.0);
		for (int i = 0; i < n_rows; i++)
			fprintf(out, " %s %.2f%s", labels[i], rows[i].med.tbt_p99,
				i + 1 < n_rows ? "," : "\n");
	}
}

/* Run every row of --compare (labels[i] names row i) and report them; the
 * exit status. */
static int compare_run(const opts *o, const sim_config *c0, trace *traces, int n_seeds,
		       int nk, sim_config *cf, sim_row *rows, sim_result *runs,
		       char (*labels)[48], int n_rows)
{
	int done = 0, total = n_rows * n_seeds;
	for (int i = 0; i < n_rows; i++) {
		policy_label(&cf[i], labels[i], sizeof(labels[i]));
		if (i >= 4 + nk)
			snprintf(labels[i], sizeof(labels[i]), "%s", sim_peer_names[i - 4 - nk]);
		if (run_seeds(o, &cf[i], labels[i], traces, n_seeds, &runs[(size_t)i * n_seeds],
			      &done, total))
			return 1;
		sim_rows_from_runs(&rows[i], &runs[(size_t)i * n_seeds], runs, n_seeds);
	}
	progress_done(o);
	if (o->goodput && goodput_rows(o, cf, rows, n_rows, traces, n_seeds))
		return 1;
	sim_report(stdout, o->fmt_out, rows, n_rows, c0->cost_kind == SIM_COST_ROOFLINE,
		   o->title);
	print_goodput(o, rows, n_rows, traces);
	if (o->svg && !o->goodput) {
		char title[160];
		snprintf(title, sizeof(title), "bkv-sim --compare: %s, time split into prefill and decode",
			 o->trace_path ? o->trace_path : o->workload);
		if (sim_svg(o->svg, rows, n_rows, title)) {
			fprintf(stderr, "bkv-sim: cannot write %s\n", o->svg);
			return 1;
		}
	}
	compare_summary(o, c0, rows, runs, labels, nk, n_rows, n_seeds);
	return after_report(o, rows, n_rows);
}

/* --compare: every policy on the same traces, then the ratios the cost-model
 * targets are stated in (docs/benchmarks.md, "Cost-model decisions"). */
static int compare(const opts *o, const sim_config *c0, trace *traces, int n_seeds)
{
	uint32_t ks[MAX_SWEEP];
	int nk = compare_ks(o, c0, ks);
	int n_rows = 1 + nk + 3 + (o->peers ? SIM_N_PEERS : 0);
	sim_config *cf = calloc((size_t)n_rows, sizeof(*cf));
	sim_row *rows = calloc((size_t)n_rows, sizeof(*rows));
	sim_result *runs = calloc((size_t)n_rows * (size_t)n_seeds, sizeof(*runs));
	char (*labels)[48] = calloc((size_t)n_rows, sizeof(*labels));
	int st = 1;
	if (cf && rows && runs && labels) {
		compare_configs(o, c0, traces, ks, nk, cf, n_rows);
		st = compare_run(o, c0, traces, n_seeds, nk, cf, rows, runs, labels, n_rows);
	}
	free(cf);
	free(rows);
	free(runs);
	free(labels);
	return st;
}

/* ---- the plain rows ------------------------------------------------------ */

/* The static baseline of a configuration: seed 000's split, padded kernels
 * and FCFS (hints do not reach the baseline). */
static sim_config static_baseline(const sim_config *c)
{
	sim_config sc = *c;
	sc.policy = BKV_POLICY_STATIC;
	sc.chunked = 0;
	sc.mixed_host = 0;
	sc.hints = 0;
	return sc;
}

/* The rows one report holds and the configurations that made them. */
typedef struct row_set {
	sim_row *rows;    /* [cap] */
	sim_config *cfgs; /* [cap] row i's configuration */
	sim_result *base; /* [n_seeds] the static baseline's runs */
	sim_result *runs; /* [n_seeds] the current row's runs */
	int n;            /* rows filled (<= cap) */
	int cap;          /* rows allocated */
} row_set;

/* The configured policy, or each swept value of it, as rows after the
 * baseline. 0, or 1 when a run failed. */
static int run_variants(const opts *o, const sim_config *c, trace *traces, int n_seeds,
			row_set *rs, int *done)
{
	int n_var = o->n_sweep ? o->n_sweep : 1, total = rs->cap * n_seeds;
	for (int v = 0; v < n_var; v++) {
		sim_config vc = *c;
		char label[48];
		policy_label(&vc, label, sizeof(label));
		if (o->n_sweep)
			apply_sweep(&vc, o->sweep_key, o->sweep_vals[v], label, sizeof(label));
		if (vc.chunked && o->n_sweep && strcmp(o->sweep_key, "budget") == 0)
			snprintf(label, sizeof(label), "chunked b=%u", vc.budget);
		if (run_seeds(o, &vc, label, traces, n_seeds, rs->runs, done, total))
			return 1;
		rs->cfgs[rs->n] = vc;
		sim_rows_from_runs(&rs->rows[rs->n++], rs->runs, o->baseline ? rs->base : NULL,
				   n_seeds);
	}
	return 0;
}

/* The report of the plain rows: table, goodput lines, the bars chart, then
 * the warnings. The exit status. */
static int report_rows(const opts *o, const sim_config *c, const row_set *rs,
		       const trace *traces)
{
	sim_report(stdout, o->fmt_out, rs->rows, rs->n, c->cost_kind == SIM_COST_ROOFLINE,
		   o->title);
	print_goodput(o, rs->rows, rs->n, traces);
	if (o->svg && !o->goodput) {
		char title[128];
		snprintf(title, sizeof(title), "bkv-sim: %s, time split into prefill and decode",
			 o->trace_path ? o->trace_path : o->workload);
		if (sim_svg(o->svg, rs->rows, rs->n, title)) {
			fprintf(stderr, "bkv-sim: cannot write %s\n", o->svg);
			return 1;
		}
	}
	return after_report(o, rs->rows, rs->n);
}

/* Without --compare: the static baseline (unless --no-baseline), then the
 * configured policy or one row per swept value; the exit status. */
static int run_rows(const opts *o, const sim_config *c, trace *traces, int n_seeds)
{
	row_set rs = {0};
	rs.cap = (o->n_sweep ? o->n_sweep : 1) + (o->baseline ? 1 : 0);
	rs.rows = calloc((size_t)rs.cap, sizeof(*rs.rows));
	rs.cfgs = calloc((size_t)rs.cap, sizeof(*rs.cfgs));
	rs.base = calloc((size_t)n_seeds, sizeof(*rs.base));
	rs.runs = calloc((size_t)n_seeds, sizeof(*rs.runs));
	int done = 0, status = 1;
	if (!rs.rows || !rs.cfgs || !rs.base || !rs.runs)
		goto out;
	if (o->baseline) {
		sim_config sc = static_baseline(c);
		if (run_seeds(o, &sc, "static", traces, n_seeds, rs.base, &done,
			      rs.cap * n_seeds))
			goto out;
		rs.cfgs[rs.n] = sc;
		sim_rows_from_runs(&rs.rows[rs.n++], rs.base, rs.base, n_seeds);
	}
	status = run_variants(o, c, traces, n_seeds, &rs, &done);
	progress_done(o);
	if (!status && o->goodput && goodput_rows(o, rs.cfgs, rs.rows, rs.n, traces, n_seeds))
		status = 1;
	if (!status)
		status = report_rows(o, c, &rs, traces);
out:
	free(rs.rows);
	free(rs.cfgs);
	free(rs.base);
	free(rs.runs);
	return status;
}

/* ---- main's steps -------------------------------------------------------- */

/* The seeds to run (a file is one trace) and the bounds on them, checked
 * before any trace is built: 0, or exit status 2 after a message. */
static int plan_seeds(opts *o, int *n_seeds)
{
	int synthetic = !o->trace_path && !strcmp(o->workload, "synthetic");
	if (!o->seeds_set) {
		o->seed_lo = 0;
		o->seed_hi = (!o->trace_path && !strcmp(o->workload, "seed000")) ? 20 : 0;
	}
	if (o->trace_path)
		o->seed_hi = o->seed_lo; /* a file is one trace */
	int n = (int)(o->seed_hi - o->seed_lo + 1);
	if (n > 100000) {
		fprintf(stderr, "bkv-sim: too many seeds\n");
		return 2;
	}
	if (synthetic && (uint64_t)o->n * (uint64_t)n > MAX_REQS_TOTAL) {
		fprintf(stderr, "bkv-sim: --n %u x %d seeds is more than %u requests\n", o->n, n,
			MAX_REQS_TOTAL);
		return 2;
	}
	if (o->goodput && !o->trace_path && (!synthetic || o->arrival == ARRIVAL_BURST)) {
		fprintf(stderr, "bkv-sim: --goodput needs arrivals spread in time: a --trace, or "
				"--workload synthetic --arrival poisson:R|uniform:R|bursty:R (seed 000's "
				"shape: --prompt 8..64 --output seed000 --gen steps)\n");
		return 2;
	}
	*n_seeds = n;
	return 0;
}

static void free_traces(trace *traces, int n)
{
	for (int s = 0; s < n; s++)
		trace_free(&traces[s]);
	free(traces);
}

/* One trace per seed into *out; 0, or exit status 1 after a message. */
static int make_traces(const opts *o, int n_seeds, trace **out)
{
	trace *traces = calloc((size_t)n_seeds, sizeof(*traces));
	if (!traces)
		return 1;
	for (int s = 0; s < n_seeds; s++) {
		char err[256] = "";
		if (make_trace(o, o->seed_lo + (uint64_t)s, &traces[s], err, sizeof(err))) {
			fprintf(stderr, "bkv-sim: %s\n", err);
			free_traces(traces, s + 1);
			return 1;
		}
	}
	*out = traces;
	return 0;
}

/* A trace file whose arrivals come in buckets (many requests sharing one
 * time, Mooncake's 3 s): rescaled by --rate or --goodput, each bucket would
 * stay one burst at every rate. Spread them over their bucket (unless
 * --no-spread) and say so on stderr; print_goodput says it again. */
static void spread_buckets(opts *o, trace *t)
{
	if (!o->trace_path || !sim_trace_buckets(t, &o->buckets))
		return;
	o->bucketed = 1;
	const sim_buckets *b = &o->buckets;
	if (!(o->trace_rate > 0.0) && !o->goodput) {
		fprintf(stderr, "bkv-sim: note: %s: arrivals come in %.3g s buckets (%u of %u "
			"requests share a time, up to %u at once); replayed as recorded\n",
			o->trace_path, b->width_us / 1e6, b->shared, t->n, b->largest);
		return;
	}
	if (o->no_spread) {
		fprintf(stderr, "bkv-sim: WARNING: %s: arrivals come in %.3g s buckets (%u of %u "
			"requests share a time, up to %u at once) and --no-spread keeps them: "
			"rescaling the rate never separates a bucket, so each arrives as one "
			"burst at every rate and TTFT includes its queue (goodput may be 0 at "
			"every rate)\n",
			o->trace_path, b->width_us / 1e6, b->shared, t->n, b->largest);
		return;
	}
	sim_trace_spread(t, b, o->seed_lo);
	o->spread = 1;
	fprintf(stderr, "bkv-sim: %s: arrivals come in %.3g s buckets (%u of %u requests "
		"share a time, up to %u at once); spread uniformly over their bucket (seed "
		"%llu) before rescaling; --no-spread keeps them\n",
		o->trace_path, b->width_us / 1e6, b->shared, t->n, b->largest,
		(unsigned long long)o->seed_lo);
}

/* --rate scales a trace file's arrivals to that mean rate; --goodput needs a
 * file whose arrivals are spread in time. 0, or exit status 2. */
static int scale_trace_rate(const opts *o, trace *traces)
{
	if (o->trace_rate > 0.0) {
		double r0 = o->trace_path ? sim_trace_rate(&traces[0]) : 0.0;
		if (!(r0 > 0.0)) {
			fprintf(stderr, "bkv-sim: --rate needs a trace whose arrivals are spread in "
					"time (synthetic workloads: --arrival poisson:R)\n");
			return 2;
		}
		double a0 = traces[0].reqs[0].arrival_us;
		for (uint32_t j = 0; j < traces[0].n; j++)
			traces[0].reqs[j].arrival_us =
				a0 + (traces[0].reqs[j].arrival_us - a0) * r0 / o->trace_rate;
	}
	if (o->goodput && o->trace_path && sim_trace_rate(&traces[0]) <= 0.0) {
		fprintf(stderr, "bkv-sim: --goodput: %s's arrivals all share one time\n",
			o->trace_path);
		return 2;
	}
	return 0;
}

/* The table's title: the workload, its size and the machine. */
static void make_title(opts *o, const sim_config *c, const trace *traces, int n_seeds)
{
	char src[160];
	if (o->trace_path)
		snprintf(src, sizeof(src), "%s", o->trace_path);
	else if (!strcmp(o->workload, "synthetic"))
		snprintf(src, sizeof(src), "synthetic %s%.6g", o->arrival == ARRIVAL_BURST ? "burst"
				: o->arrival == ARRIVAL_POISSON ? "poisson:"
				: o->arrival == ARRIVAL_BURSTY ? "bursty:" : "uniform:",
			 o->arrival == ARRIVAL_BURST ? 0.0 : o->rate);
	else
		snprintf(src, sizeof(src), "seed000");
	if (!o->trace_path && !strcmp(o->workload, "synthetic") && o->arrival == ARRIVAL_BURST)
		src[strlen("synthetic burst")] = 0;
	char lens[32];
	if (c->oracle || !c->max_tokens)
		snprintf(lens, sizeof(lens), "oracle lengths");
	else
		snprintf(lens, sizeof(lens), "cap %u + stop token", c->max_tokens);
	snprintf(o->title, sizeof(o->title),
		 "bkv-sim: %.80s, %u requests, %d seed%s, %s host, %u slots, cost %.40s, %s", src,
		 traces[0].n, n_seeds, n_seeds == 1 ? "" : "s", c->mixed_host ? "mixed" : "split",
		 c->slots, o->cost_name, lens);
}

int main(int argc, char **argv)
{
	cli_args a;
	int st = cli_parse(argc, argv, &a);
	if (st >= 0)
		return st;
	opts *o = &a.o;
	if (o->fidelity) {
		if (!o->trace_path || o->fmt != TRACE_DISTSERVE) {
			fprintf(stderr, "bkv-sim: --fidelity needs --trace distserve:FILE\n");
			return 2;
		}
		return fidelity(o, &a.c);
	}
	int n_seeds = 0;
	trace *traces = NULL;
	if ((st = plan_seeds(o, &n_seeds)) || (st = make_traces(o, n_seeds, &traces)))
		return st;
	spread_buckets(o, &traces[0]);
	st = scale_trace_rate(o, traces);
	if (!st) {
		make_title(o, &a.c, traces, n_seeds);
		if (o->peers && !o->compare) {
			fprintf(stderr, "bkv-sim: --peers adds rows to --compare\n");
			st = 2;
		} else if (o->compare) {
			st = compare(o, &a.c, traces, n_seeds);
		} else {
			st = run_rows(o, &a.c, traces, n_seeds);
		}
	}
	free_traces(traces, n_seeds);
	return st;
}
