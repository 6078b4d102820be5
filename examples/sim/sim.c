/*
 * sim.c - bkv-sim's command line: pick a workload or a trace, a policy, a
 * host shape and a cost model, run the real scheduler on a virtual clock
 * (host.c) over one or more seeds and sweep values, and report (report.c).
 *
 *   bkv-sim --workload seed000 --sweep k=1,2,4,8,16,32
 *   bkv-sim --trace azure:FILE --cost roofline:a100-llama2-13b --slots 64
 *   bkv-sim --trace distserve:FILE --fidelity
 *   bkv-sim --workload seed000 --compare      static, k=1, fixed-k sweep, auto,
 *                                             chunked, with ratios
 *
 * Every run of a row uses the same traces as the static baseline of the same
 * seed, so speed-ups are paired. Output is deterministic for given options
 * (the wall-clock column of --json aside). See docs/benchmarks.md.
 */
#include "sim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SWEEP 64
/* Bounds on sizes, so a typo is a clear error instead of gigabytes. */
#define MAX_REQS 1000000u        /* --n, requests of one synthetic trace */
#define MAX_REQS_TOTAL 10000000u /* requests over all seeds */
#define MAX_LEN (1u << 20)       /* --prompt, --output tokens */
#define MAX_BLOCKS (1u << 22)    /* --kv-blocks, --host-blocks (about 110 bytes each) */
#define MAX_SLOTS 65536u         /* --slots */
#define MAX_BLOCK_TOKENS 4096u   /* --block-tokens */

static void usage(FILE *f)
{
	fputs("usage: bkv-sim [options]\n"
	      "workload (one of):\n"
	      "  --workload seed000         seed 000's 256 requests (default)\n"
	      "  --workload synthetic       --n N --arrival burst|uniform:R|poisson:R\n"
	      "                             --prompt N|LO..HI --output N|LO..HI|seed000\n"
	      "  --trace azure:FILE | mooncake:FILE | distserve:FILE [--run NAME]\n"
	      "  --limit N                  first N requests of a trace\n"
	      "  --rate R                   a trace's arrivals scaled to R req/s (its mean\n"
	      "                             rate: (n - 1) / span)\n"
	      "  --seeds N | A..B           seeds of synthetic workloads (seed000: 0..20)\n"
	      "policy:\n"
	      "  --policy static|continuous|chunked|auto   (default continuous; auto =\n"
	      "                             continuous with the cost model choosing k)\n"
	      "  --k N|auto                 admission group (default 1)\n"
	      "  --budget N|auto            token budget of chunked prefill (default 512)\n"
	      "  --tpot US                  the scheduler's time-between-tokens target\n"
	      "  --hints                    requests carry their output length as a hint\n"
	      "                             (not the static baseline: it stays FCFS)\n"
	      "  --max-bypass MS|never      bound on the delay hints may add (default\n"
	      "                             auto: max_bypass_us = 0)\n"
	      "  --compare [K,K,..]         static, k=1, fixed k (default 1,2,3,4,6,8,12,16,\n"
	      "                             24,32 up to --slots; the best is reported), auto,\n"
	      "                             chunked b=512 and chunked auto on a mixed host,\n"
	      "                             same traces, with ratios\n"
	      "  --peers                    with --compare: rows vllm-v1, vllm-v0, sglang,\n"
	      "                             sarathi, tgi, llamacpp, orca (each peer's\n"
	      "                             defaults in our knobs; docs/benchmarks.md)\n"
	      "  --max-wait US|never        partial-group timeout (default never)\n"
	      "  --slots N                  running slots (default 32)\n"
	      "  --host split|mixed         split prefill/decode kernels or one forward\n"
	      "  --no-baseline              no static row; speed-ups are not reported\n"
	      "  --sweep k=1,2,4|budget=..|slots=..\n"
	      "cost model:\n"
	      "  --cost poly|poly-packed|distserve|roofline:PRESET\n"
	      "     presets: a100-llama2-13b, h100-llama3-8b, a100-opt-13b\n"
	      "  --no-model                 do not give the model to the scheduler\n"
	      "  --calibrate                give the scheduler a calibrated model that\n"
	      "                             learns from scratch (observe) instead\n"
	      "  --gen steps|tokens         output length = decode steps after prefill\n"
	      "                             (seed000 default) or tokens (trace default)\n"
	      "pool:\n"
	      "  --kv-blocks N --block-tokens N --host-blocks N --no-prefix-cache\n"
	      "output:\n"
	      "  --json | --csv             instead of the table\n"
	      "  --svg FILE                 prefill/decode time bars per row; with --goodput,\n"
	      "                             p99 TTFT and TPOT against rate per row\n"
	      "  --fidelity                 (distserve) every run vs its measurement\n"
	      "  --check                    bkv_sched_check after every step\n"
	      "  --goodput TTFT_MS,TPOT_MS[,PCT]  per policy, the highest arrival rate\n"
	      "                             (req/s) at which PCT% (default 90) of requests\n"
	      "                             meet both targets; needs arrivals spread in\n"
	      "                             time (a trace, or --arrival poisson:R|uniform:R)\n"
	      "  --allow-errors             exit 0 even when requests fail (default: a\n"
	      "                             warning and exit status 3)\n"
	      "  --quiet                    no progress line\n"
	      "sizes are bounded: --n <= 1000000 (and 10^7 over all seeds), --prompt and\n"
	      "--output <= 1048576 tokens, pools <= 4194304 blocks, --slots <= 65536\n",
	      f);
}

/* The command line, parsed. */
typedef struct opts {
	const char *workload;    /* "seed000" or "synthetic" */
	trace_format fmt;        /* format of trace_path */
	const char *trace_path;  /* a trace file; NULL: synthetic workload */
	const char *run;         /* DistServe run filter; NULL: all rows */
	uint32_t limit;          /* first requests of a trace; 0 = all */
	uint32_t n;              /* synthetic: requests */
	trace_arrival arrival;   /* synthetic: arrival process */
	double rate;             /* synthetic: requests per second */
	trace_dist prompt;       /* synthetic: prompt tokens */
	trace_dist output;       /* synthetic: output tokens */
	uint64_t seed_lo;        /* first seed */
	uint64_t seed_hi;        /* last seed, inclusive (>= seed_lo) */
	int seeds_set;           /* --seeds given (else the workload's default) */
	int baseline;            /* add the static row and speed-ups */
	char sweep_key[16];      /* "k", "budget" or "slots"; "" = no sweep */
	uint32_t sweep_vals[MAX_SWEEP]; /* [n_sweep] values swept */
	int n_sweep;             /* values in sweep_vals */
	sim_format fmt_out;      /* table, JSON or CSV */
	const char *svg;         /* chart path, or NULL */
	int fidelity;            /* --fidelity: every DistServe run */
	int quiet;               /* no progress line */
	int gen_set;             /* --gen given (else the workload's default) */
	int policy_chunked;      /* --policy chunked */
	int compare;             /* --compare */
	uint32_t cmp_k[MAX_SWEEP]; /* [n_cmp_k] fixed k of --compare */
	int n_cmp_k;             /* 0: the default list */
	int allow_errors;        /* --allow-errors */
	int peers;               /* --peers: the peer presets join --compare */
	double trace_rate;       /* --rate: a trace's arrivals scaled to this
				    mean rate, req/s; 0 = as recorded */
	int big_gpu;             /* the cost model is an H100's (vLLM's larger
				    defaults) */
	int goodput;             /* --goodput given */
	double gp_ttft_ms, gp_tpot_ms, gp_pct; /* its targets */
	char title[256];         /* the table's title */
} opts;

static int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX || *s == '-')
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_preset(const char *s, bkv_roofline_preset *p)
{
	if (!strcmp(s, "a100-llama2-13b"))
		*p = BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16;
	else if (!strcmp(s, "h100-llama3-8b"))
		*p = BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16;
	else if (!strcmp(s, "a100-opt-13b"))
		*p = BKV_ROOFLINE_A100_80GB_OPT_13B_FP16;
	else
		return -1;
	return 0;
}

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

static void progress(const opts *o, const char *label, uint64_t seed, int done, int total)
{
	if (o->quiet || !isatty(2))
		return;
	fprintf(stderr, "\r[%d/%d] %-16s seed %-6llu", done, total, label,
		(unsigned long long)seed);
	fflush(stderr);
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
		if (!o->quiet && isatty(2)) {
			fprintf(stderr, "\r[goodput %d/%d] %-16s", i + 1, n_rows, rows[i].med.label);
			fflush(stderr);
		}
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

static int fidelity(const opts *o, sim_config *c)
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
		snprintf(r.label, sizeof(r.label), "%s", names[i]);
		progress(o, names[i], 0, i + 1, nr);
		rc = sim_run(c, &t, &r, err, sizeof(err));
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
			printf("%-12s %5s %12s %12s %8s %12s %12s %8s\n", "run", "reqs",
			       "ttft_meas", "ttft_sim", "err", "tpot_meas", "tpot_sim", "err");
			for (int i = 0; i < nr; i++) {
				const sim_result *r = &rows[i].med;
				printf("%-12s %5u %12.1f %12.1f %+7.1f%% %12.2f %12.2f %+7.1f%%\n",
				       r->label, r->n_req, r->ref_ttft_mean, r->ttft_mean,
				       100.0 * (r->ttft_mean - r->ref_ttft_mean) / r->ref_ttft_mean,
				       r->ref_tpot_mean, r->tpot_mean,
				       100.0 * (r->tpot_mean - r->ref_tpot_mean) / r->ref_tpot_mean);
			}
			printf("(mean TTFT and TPOT in ms; TPOT over requests with more than one "
			       "output token)\n");
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

/* --compare: every policy on the same traces, then the ratios the cost-model
 * targets are stated in (docs/benchmarks.md, "Cost-model decisions"). */
static int compare(const opts *o, const sim_config *c0, trace *traces, int n_seeds)
{
	static const uint32_t def_k[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128};
	uint32_t ks[MAX_SWEEP];
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
	/* rows: static, k..., auto, chunked b=512, chunked auto[, peers] */
	int n_rows = 1 + nk + 3 + (o->peers ? SIM_N_PEERS : 0);
	sim_config *cf = calloc((size_t)n_rows, sizeof(*cf));
	sim_row *rows = calloc((size_t)n_rows, sizeof(*rows));
	sim_result *runs = calloc((size_t)n_rows * (size_t)n_seeds, sizeof(*runs));
	char (*labels)[48] = calloc((size_t)n_rows, sizeof(*labels));
	if (!cf || !rows || !runs || !labels)
		return 1;
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
	if (!o->quiet && isatty(2))
		fprintf(stderr, "\r%-72s\r", "");
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
	/* the best fixed k: highest median speed-up; on a tie (to 0.05%) the
	 * lower p99 TTFT */
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
	int st = after_report(o, rows, n_rows);
	free(cf);
	free(rows);
	free(runs);
	free(labels);
	return st;
}

int main(int argc, char **argv)
{
	opts o;
	memset(&o, 0, sizeof(o));
	o.workload = "seed000";
	o.n = 256;
	o.baseline = 1;
	o.prompt = (trace_dist){DIST_UNIFORM, 8, 64};
	o.output = (trace_dist){DIST_SEED000_GEN, 1, 64};
	sim_config c;
	sim_config_init(&c);
	int host_set = 0;
	const char *cost_name = "poly";

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_ARG()                                                             \
	do {                                                                   \
		if (!v) {                                                      \
			fprintf(stderr, "bkv-sim: %s needs a value\n", a);    \
			return 2;                                              \
		}                                                              \
		i++;                                                           \
	} while (0)
#define BAD_ARG()                                                              \
	do {                                                                   \
		fprintf(stderr, "bkv-sim: bad value for %s: '%s'\n", a, v);   \
		return 2;                                                      \
	} while (0)
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--workload")) {
			NEED_ARG();
			if (strcmp(v, "seed000") && strcmp(v, "synthetic"))
				BAD_ARG();
			o.workload = v;
		} else if (!strcmp(a, "--trace")) {
			NEED_ARG();
			const char *colon = strchr(v, ':');
			if (!colon)
				BAD_ARG();
			size_t k = (size_t)(colon - v);
			if (k == 5 && !strncmp(v, "azure", 5))
				o.fmt = TRACE_AZURE;
			else if (k == 8 && !strncmp(v, "mooncake", 8))
				o.fmt = TRACE_MOONCAKE;
			else if (k == 9 && !strncmp(v, "distserve", 9))
				o.fmt = TRACE_DISTSERVE;
			else
				BAD_ARG();
			o.trace_path = colon + 1;
		} else if (!strcmp(a, "--run")) {
			NEED_ARG();
			o.run = v;
		} else if (!strcmp(a, "--limit")) {
			NEED_ARG();
			if (parse_u32(v, &o.limit))
				BAD_ARG();
		} else if (!strcmp(a, "--n")) {
			NEED_ARG();
			if (parse_u32(v, &o.n) || o.n == 0)
				BAD_ARG();
			if (o.n > MAX_REQS) {
				fprintf(stderr, "bkv-sim: --n %u is more than %u requests\n", o.n,
					MAX_REQS);
				return 2;
			}
		} else if (!strcmp(a, "--arrival")) {
			NEED_ARG();
			if (!strcmp(v, "burst")) {
				o.arrival = ARRIVAL_BURST;
			} else if (!strncmp(v, "uniform:", 8) || !strncmp(v, "poisson:", 8)) {
				o.arrival = v[0] == 'u' ? ARRIVAL_UNIFORM : ARRIVAL_POISSON;
				char *end;
				o.rate = strtod(v + 8, &end);
				if (*end || !(o.rate > 0))
					BAD_ARG();
			} else {
				BAD_ARG();
			}
		} else if (!strcmp(a, "--prompt")) {
			NEED_ARG();
			if (trace_dist_parse(v, &o.prompt) || o.prompt.kind == DIST_SEED000_GEN) {
				fprintf(stderr, "bkv-sim: bad value for --prompt: '%s' (N or LO..HI, "
						"1 to %u tokens)\n", v, MAX_LEN);
				return 2;
			}
			if (o.prompt.hi > MAX_LEN || o.prompt.lo > MAX_LEN) {
				fprintf(stderr, "bkv-sim: --prompt %s: at most %u tokens\n", v,
					MAX_LEN);
				return 2;
			}
		} else if (!strcmp(a, "--output")) {
			NEED_ARG();
			if (trace_dist_parse(v, &o.output)) {
				fprintf(stderr, "bkv-sim: bad value for --output: '%s' (N, LO..HI or "
						"seed000; 1 to %u tokens)\n", v, MAX_LEN);
				return 2;
			}
			if (o.output.hi > MAX_LEN || o.output.lo > MAX_LEN) {
				fprintf(stderr, "bkv-sim: --output %s: at most %u tokens\n", v,
					MAX_LEN);
				return 2;
			}
		} else if (!strcmp(a, "--seeds")) {
			NEED_ARG();
			uint32_t lo, hi;
			const char *dots = strstr(v, "..");
			if (dots) {
				char tmp[32];
				snprintf(tmp, sizeof(tmp), "%.*s", (int)(dots - v), v);
				if (parse_u32(tmp, &lo) || parse_u32(dots + 2, &hi) || hi < lo)
					BAD_ARG();
			} else {
				if (parse_u32(v, &hi) || hi == 0)
					BAD_ARG();
				lo = 0;
				hi -= 1;
			}
			o.seed_lo = lo;
			o.seed_hi = hi;
			o.seeds_set = 1;
		} else if (!strcmp(a, "--policy")) {
			NEED_ARG();
			if (!strcmp(v, "static"))
				c.policy = BKV_POLICY_STATIC;
			else if (!strcmp(v, "continuous"))
				c.policy = BKV_POLICY_CONTINUOUS;
			else if (!strcmp(v, "chunked"))
				c.policy = BKV_POLICY_CONTINUOUS, o.policy_chunked = 1;
			else if (!strcmp(v, "auto"))
				c.policy = BKV_POLICY_CONTINUOUS, c.k = 0;
			else
				BAD_ARG();
		} else if (!strcmp(a, "--k")) {
			NEED_ARG();
			if (!strcmp(v, "auto"))
				c.k = 0;
			else if (parse_u32(v, &c.k) || c.k == 0)
				BAD_ARG();
		} else if (!strcmp(a, "--budget")) {
			NEED_ARG();
			if (!strcmp(v, "auto"))
				c.budget = 0;
			else if (parse_u32(v, &c.budget) || c.budget == 0)
				BAD_ARG();
		} else if (!strcmp(a, "--tpot")) {
			NEED_ARG();
			if (parse_u32(v, &c.tpot_us))
				BAD_ARG();
		} else if (!strcmp(a, "--max-bypass")) {
			uint32_t ms;

			NEED_ARG();
			if (!strcmp(v, "never"))
				c.max_bypass_us = UINT64_MAX;
			else if (parse_u32(v, &ms))
				BAD_ARG();
			else
				c.max_bypass_us = (uint64_t)ms * 1000u;
		} else if (!strcmp(a, "--hints")) {
			c.hints = 1;
		} else if (!strcmp(a, "--compare")) {
			o.compare = 1;
			if (v && v[0] >= '0' && v[0] <= '9') {
				char list[512];
				i++;
				snprintf(list, sizeof(list), "%s", v);
				for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
					if (o.n_cmp_k == MAX_SWEEP ||
					    parse_u32(tok, &o.cmp_k[o.n_cmp_k]) ||
					    o.cmp_k[o.n_cmp_k] == 0)
						BAD_ARG();
					o.n_cmp_k++;
				}
			}
		} else if (!strcmp(a, "--max-wait")) {
			NEED_ARG();
			uint32_t w;
			if (!strcmp(v, "never"))
				c.max_wait_us = UINT64_MAX;
			else if (!parse_u32(v, &w))
				c.max_wait_us = w;
			else
				BAD_ARG();
		} else if (!strcmp(a, "--slots")) {
			NEED_ARG();
			if (parse_u32(v, &c.slots) || c.slots == 0)
				BAD_ARG();
			if (c.slots > MAX_SLOTS) {
				fprintf(stderr, "bkv-sim: --slots %u: at most %u\n", c.slots, MAX_SLOTS);
				return 2;
			}
		} else if (!strcmp(a, "--host")) {
			NEED_ARG();
			if (!strcmp(v, "split"))
				c.mixed_host = 0;
			else if (!strcmp(v, "mixed"))
				c.mixed_host = 1;
			else
				BAD_ARG();
			host_set = 1;
		} else if (!strcmp(a, "--no-baseline")) {
			o.baseline = 0;
		} else if (!strcmp(a, "--sweep")) {
			NEED_ARG();
			const char *eq = strchr(v, '=');
			if (!eq || eq - v >= (long)sizeof(o.sweep_key))
				BAD_ARG();
			snprintf(o.sweep_key, sizeof(o.sweep_key), "%.*s", (int)(eq - v), v);
			if (strcmp(o.sweep_key, "k") && strcmp(o.sweep_key, "budget") &&
			    strcmp(o.sweep_key, "slots"))
				BAD_ARG();
			char list[512];
			snprintf(list, sizeof(list), "%s", eq + 1);
			o.n_sweep = 0;
			for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
				if (o.n_sweep == MAX_SWEEP ||
				    parse_u32(tok, &o.sweep_vals[o.n_sweep]) ||
				    o.sweep_vals[o.n_sweep] == 0)
					BAD_ARG();
				o.n_sweep++;
			}
			if (!o.n_sweep)
				BAD_ARG();
		} else if (!strcmp(a, "--cost")) {
			NEED_ARG();
			cost_name = v;
			o.big_gpu = strstr(v, "h100") != NULL;
			bkv_roofline_preset p;
			if (!strcmp(v, "poly")) {
				c.cost_kind = SIM_COST_POLY;
			} else if (!strcmp(v, "poly-packed")) {
				c.cost_kind = SIM_COST_POLY;
				c.poly.packed = 1;
			} else if (!strcmp(v, "distserve")) {
				c.cost_kind = SIM_COST_DISTSERVE;
			} else if (!strncmp(v, "roofline:", 9) && !parse_preset(v + 9, &p)) {
				c.cost_kind = SIM_COST_ROOFLINE;
				bkv_cost_roofline_init(&c.roofline, p);
			} else {
				BAD_ARG();
			}
		} else if (!strcmp(a, "--no-model")) {
			c.give_model = 0;
		} else if (!strcmp(a, "--calibrate")) {
			c.calibrate = 1;
		} else if (!strcmp(a, "--gen")) {
			NEED_ARG();
			if (!strcmp(v, "steps"))
				c.gen = SIM_GEN_STEPS;
			else if (!strcmp(v, "tokens"))
				c.gen = SIM_GEN_TOKENS;
			else
				BAD_ARG();
			o.gen_set = 1;
		} else if (!strcmp(a, "--kv-blocks")) {
			NEED_ARG();
			if (parse_u32(v, &c.kv_blocks))
				BAD_ARG();
			if (c.kv_blocks > MAX_BLOCKS) {
				fprintf(stderr, "bkv-sim: --kv-blocks %u: at most %u\n", c.kv_blocks,
					MAX_BLOCKS);
				return 2;
			}
		} else if (!strcmp(a, "--block-tokens")) {
			NEED_ARG();
			if (parse_u32(v, &c.block_tokens) || c.block_tokens == 0)
				BAD_ARG();
			if (c.block_tokens > MAX_BLOCK_TOKENS) {
				fprintf(stderr, "bkv-sim: --block-tokens %u: at most %u\n",
					c.block_tokens, MAX_BLOCK_TOKENS);
				return 2;
			}
		} else if (!strcmp(a, "--host-blocks")) {
			NEED_ARG();
			if (parse_u32(v, &c.host_blocks))
				BAD_ARG();
			if (c.host_blocks > MAX_BLOCKS) {
				fprintf(stderr, "bkv-sim: --host-blocks %u: at most %u\n",
					c.host_blocks, MAX_BLOCKS);
				return 2;
			}
		} else if (!strcmp(a, "--no-prefix-cache")) {
			c.prefix_cache = 0;
		} else if (!strcmp(a, "--json")) {
			o.fmt_out = SIM_JSON;
		} else if (!strcmp(a, "--csv")) {
			o.fmt_out = SIM_CSV;
		} else if (!strcmp(a, "--svg")) {
			NEED_ARG();
			o.svg = v;
		} else if (!strcmp(a, "--fidelity")) {
			o.fidelity = 1;
		} else if (!strcmp(a, "--check")) {
			c.check = 1;
		} else if (!strcmp(a, "--quiet")) {
			o.quiet = 1;
		} else if (!strcmp(a, "--rate")) {
			NEED_ARG();
			char *end;
			o.trace_rate = strtod(v, &end);
			if (*end || !(o.trace_rate > 0) || o.trace_rate > 1e9)
				BAD_ARG();
		} else if (!strcmp(a, "--peers")) {
			o.peers = 1;
		} else if (!strcmp(a, "--allow-errors")) {
			o.allow_errors = 1;
		} else if (!strcmp(a, "--goodput")) {
			NEED_ARG();
			char *end;
			o.gp_pct = 90.0;
			o.gp_ttft_ms = strtod(v, &end);
			if (*end != ',')
				BAD_ARG();
			o.gp_tpot_ms = strtod(end + 1, &end);
			if (*end == ',')
				o.gp_pct = strtod(end + 1, &end);
			if (*end || !(o.gp_ttft_ms > 0) || !(o.gp_tpot_ms > 0) || !(o.gp_pct > 0) ||
			    o.gp_pct > 100 || o.gp_ttft_ms > 1e9 || o.gp_tpot_ms > 1e9)
				BAD_ARG();
			o.goodput = 1;
		} else {
			fprintf(stderr, "bkv-sim: unknown option '%s' (see --help)\n", a);
			return 2;
		}
#undef NEED_ARG
#undef BAD_ARG
	}
	if (o.policy_chunked) {
		c.chunked = 1;
		if (!host_set)
			c.mixed_host = 1;
	}
	c.progress = !o.quiet && isatty(2);
	if (!o.gen_set)
		c.gen = (!o.trace_path && !strcmp(o.workload, "seed000")) ? SIM_GEN_STEPS
									   : SIM_GEN_TOKENS;
	if (o.fidelity) {
		if (!o.trace_path || o.fmt != TRACE_DISTSERVE) {
			fprintf(stderr, "bkv-sim: --fidelity needs --trace distserve:FILE\n");
			return 2;
		}
		return fidelity(&o, &c);
	}
	if (!o.seeds_set) {
		o.seed_lo = 0;
		o.seed_hi = (!o.trace_path && !strcmp(o.workload, "seed000")) ? 20 : 0;
	}
	if (o.trace_path)
		o.seed_hi = o.seed_lo; /* a file is one trace */
	int n_seeds = (int)(o.seed_hi - o.seed_lo + 1);
	if (n_seeds > 100000) {
		fprintf(stderr, "bkv-sim: too many seeds\n");
		return 2;
	}
	if (!o.trace_path && !strcmp(o.workload, "synthetic") &&
	    (uint64_t)o.n * (uint64_t)n_seeds > MAX_REQS_TOTAL) {
		fprintf(stderr, "bkv-sim: --n %u x %d seeds is more than %u requests\n", o.n,
			n_seeds, MAX_REQS_TOTAL);
		return 2;
	}
	if (o.goodput && !o.trace_path &&
	    (strcmp(o.workload, "synthetic") || o.arrival == ARRIVAL_BURST)) {
		fprintf(stderr, "bkv-sim: --goodput needs arrivals spread in time: a --trace, or "
				"--workload synthetic --arrival poisson:R|uniform:R (seed 000's "
				"shape: --prompt 8..64 --output seed000 --gen steps)\n");
		return 2;
	}

	trace *traces = calloc((size_t)n_seeds, sizeof(*traces));
	if (!traces)
		return 1;
	for (int s = 0; s < n_seeds; s++) {
		char err[256] = "";
		if (make_trace(&o, o.seed_lo + (uint64_t)s, &traces[s], err, sizeof(err))) {
			fprintf(stderr, "bkv-sim: %s\n", err);
			return 1;
		}
	}

	if (o.trace_rate > 0.0) {
		double r0 = o.trace_path ? sim_trace_rate(&traces[0]) : 0.0;
		if (!(r0 > 0.0)) {
			fprintf(stderr, "bkv-sim: --rate needs a trace whose arrivals are spread in "
					"time (synthetic workloads: --arrival poisson:R)\n");
			return 2;
		}
		double a0 = traces[0].reqs[0].arrival_us;
		for (uint32_t j = 0; j < traces[0].n; j++)
			traces[0].reqs[j].arrival_us =
				a0 + (traces[0].reqs[j].arrival_us - a0) * r0 / o.trace_rate;
	}
	if (o.goodput && o.trace_path && sim_trace_rate(&traces[0]) <= 0.0) {
		fprintf(stderr, "bkv-sim: --goodput: %s's arrivals all share one time\n",
			o.trace_path);
		return 2;
	}
	{
		char src[160];
		if (o.trace_path)
			snprintf(src, sizeof(src), "%s", o.trace_path);
		else if (!strcmp(o.workload, "synthetic"))
			snprintf(src, sizeof(src), "synthetic %s%.6g", o.arrival == ARRIVAL_BURST ? "burst"
					: o.arrival == ARRIVAL_POISSON ? "poisson:" : "uniform:",
				 o.arrival == ARRIVAL_BURST ? 0.0 : o.rate);
		else
			snprintf(src, sizeof(src), "seed000");
		if (!o.trace_path && !strcmp(o.workload, "synthetic") && o.arrival == ARRIVAL_BURST)
			src[strlen("synthetic burst")] = 0;
		snprintf(o.title, sizeof(o.title),
			 "bkv-sim: %s, %u requests, %d seed%s, %s host, %u slots, cost %s", src,
			 traces[0].n, n_seeds, n_seeds == 1 ? "" : "s",
			 c.mixed_host ? "mixed" : "split", c.slots, cost_name);
	}
	if (o.peers && !o.compare) {
		fprintf(stderr, "bkv-sim: --peers adds rows to --compare\n");
		return 2;
	}
	if (o.compare) {
		int st = compare(&o, &c, traces, n_seeds);
		for (int s = 0; s < n_seeds; s++)
			trace_free(&traces[s]);
		free(traces);
		return st;
	}
	int n_var = o.n_sweep ? o.n_sweep : 1;
	int n_rows = n_var + (o.baseline ? 1 : 0);
	sim_row *rows = calloc((size_t)n_rows, sizeof(*rows));
	sim_config *cfgs = calloc((size_t)n_rows, sizeof(*cfgs));
	sim_result *base = calloc((size_t)n_seeds, sizeof(*base));
	sim_result *runs = calloc((size_t)n_seeds, sizeof(*runs));
	if (!rows || !base || !runs || !cfgs)
		return 1;
	int done = 0, total = n_rows * n_seeds, row = 0, status = 0;
	if (o.baseline) {
		sim_config sc = c;
		sc.policy = BKV_POLICY_STATIC;
		sc.chunked = 0;
		sc.mixed_host = 0; /* seed 000's static: split, padded kernels */
		sc.hints = 0;      /* and FCFS: hints do not reach the baseline */
		if (run_seeds(&o, &sc, "static", traces, n_seeds, base, &done, total))
			return 1;
		cfgs[row] = sc;
		sim_rows_from_runs(&rows[row++], base, base, n_seeds);
	}
	for (int v = 0; v < n_var; v++) {
		sim_config vc = c;
		char label[48];
		policy_label(&vc, label, sizeof(label));
		if (o.n_sweep)
			apply_sweep(&vc, o.sweep_key, o.sweep_vals[v], label, sizeof(label));
		if (vc.chunked && o.n_sweep && strcmp(o.sweep_key, "budget") == 0)
			snprintf(label, sizeof(label), "chunked b=%u", vc.budget);
		if (run_seeds(&o, &vc, label, traces, n_seeds, runs, &done, total)) {
			status = 1;
			break;
		}
		cfgs[row] = vc;
		sim_rows_from_runs(&rows[row++], runs, o.baseline ? base : NULL, n_seeds);
	}
	if (!o.quiet && isatty(2))
		fprintf(stderr, "\r%-72s\r", "");
	if (!status && o.goodput && goodput_rows(&o, cfgs, rows, row, traces, n_seeds))
		status = 1;
	if (!status) {
		sim_report(stdout, o.fmt_out, rows, row, c.cost_kind == SIM_COST_ROOFLINE, o.title);
		print_goodput(&o, rows, row, traces);
		if (o.svg && !o.goodput) {
			char title[128];
			snprintf(title, sizeof(title), "bkv-sim: %s, time split into prefill and decode",
				 o.trace_path ? o.trace_path : o.workload);
			if (sim_svg(o.svg, rows, row, title)) {
				fprintf(stderr, "bkv-sim: cannot write %s\n", o.svg);
				status = 1;
			}
		}
		if (!status)
			status = after_report(&o, rows, row);
	}
	for (int s = 0; s < n_seeds; s++)
		trace_free(&traces[s]);
	free(traces);
	free(rows);
	free(cfgs);
	free(base);
	free(runs);
	return status;
}
