/*
 * report.c - bkv-sim's outputs: the table, JSON, CSV and the SVG bar chart.
 *
 * A row aggregates one policy over all seeds: every metric is the median
 * over seeds, and the speed-up is computed per seed (static makespan over
 * the policy's, same trace) before its median and quartiles are taken, as
 * seed 000 reports it. The chart draws, per row, a bar of total time split
 * into prefill (dark) and decode (light), relative to the first row, like
 * seed 000's figure.
 */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Median over n runs of the double at byte offset off of sim_result. */
static double med_field(const sim_result *runs, int n, size_t off, double *scratch)
{
	for (int i = 0; i < n; i++)
		memcpy(&scratch[i], (const char *)&runs[i] + off, sizeof(double));
	return sim_median(scratch, n);
}

static double med_u64(const sim_result *runs, int n, size_t off, double *scratch)
{
	for (int i = 0; i < n; i++) {
		uint64_t v;

		memcpy(&v, (const char *)&runs[i] + off, sizeof(v));
		scratch[i] = (double)v;
	}
	return sim_median(scratch, n);
}

void sim_rows_from_runs(sim_row *row, const sim_result *runs, const sim_result *base, int n)
{
	double *sc = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
	memset(row, 0, sizeof(*row));
	row->n_seeds = n;
	if (!sc || n <= 0) {
		free(sc);
		return;
	}
	sim_result *m = &row->med;
	memcpy(m->label, runs[0].label, sizeof(m->label));
	m->n_req = runs[0].n_req;
	m->finished = runs[0].finished;
	m->errors = runs[0].errors;
	for (int i = 1; i < n; i++) {
		if (runs[i].finished < m->finished)
			m->finished = runs[i].finished;
		if (runs[i].errors > m->errors)
			m->errors = runs[i].errors;
	}
#define MED_D(f) m->f = med_field(runs, n, offsetof(sim_result, f), sc)
#define MED_U(f) m->f = (uint64_t)llround(med_u64(runs, n, offsetof(sim_result, f), sc))
	MED_D(makespan_us);
	MED_D(prefill_us);
	MED_D(decode_us);
	MED_U(prefill_calls);
	MED_U(decode_steps);
	MED_U(steps);
	MED_U(prefill_tokens);
	MED_U(decode_tokens);
	MED_U(out_tokens);
	MED_U(hit_tokens);
	MED_U(dup_tokens);
	MED_U(prompt_tokens);
	MED_U(preemptions);
	MED_D(kv_waste);
	MED_D(ttft_mean);
	MED_D(ttft_p50);
	MED_D(ttft_p99);
	MED_D(tpot_mean);
	MED_D(tpot_p50);
	MED_D(tpot_p99);
	MED_D(tbt_p99);
	MED_D(tput_tok_s);
	MED_D(flops);
	MED_D(bytes);
	MED_D(mfu);
	MED_D(mbu);
	MED_D(ref_ttft_mean);
	MED_D(ref_tpot_mean);
	MED_D(span_us);
#undef MED_D
#undef MED_U
	double wall = 0.0, perr = 0.0;
	for (int i = 0; i < n; i++) {
		wall += runs[i].wall_s;
		if (runs[i].pred_err > perr)
			perr = runs[i].pred_err;
	}
	m->wall_s = wall;
	m->pred_err = perr;
	/* Prefill share: median of per-seed shares. */
	for (int i = 0; i < n; i++) {
		double busy = runs[i].prefill_us + runs[i].decode_us;
		sc[i] = busy > 0 ? runs[i].prefill_us / busy : 0.0;
	}
	row->prefill_share = sim_median(sc, n);
	if (base) {
		row->has_base = 1;
		for (int i = 0; i < n; i++) {
			sc[i] = runs[i].makespan_us > 0 ? base[i].makespan_us / runs[i].makespan_us
							: 0.0;
			row->wins += sc[i] > 1.0;
		}
		row->speedup_q1 = sim_quantile(sc, n, 0.25);
		row->speedup_q3 = sim_quantile(sc, n, 0.75);
		row->speedup = sim_median(sc, n);
	}
	free(sc);
}


static double hit_rate(const sim_result *r)
{
	return r->prompt_tokens ? (double)r->hit_tokens / (double)r->prompt_tokens : 0.0;
}

void sim_report(FILE *out, sim_format fmt, const sim_row *rows, int n, int roofline,
		const char *title)
{
	if (fmt == SIM_JSON) {
		fprintf(out, "[\n");
		for (int i = 0; i < n; i++) {
			const sim_result *r = &rows[i].med;
			fprintf(out,
				"  {\"label\": \"%s\", \"seeds\": %d, \"requests\": %u, "
				"\"finished\": %u, \"errors\": %u, \"speedup\": %.10g, "
				"\"speedup_q1\": %.10g, \"speedup_q3\": %.10g, \"wins\": %d, "
				"\"makespan_us\": %.10g, \"prefill_us\": %.10g, \"decode_us\": %.10g, "
				"\"prefill_share\": %.10g, \"prefill_calls\": %llu, "
				"\"decode_steps\": %llu, \"steps\": %llu, \"prefill_tokens\": %llu, "
				"\"decode_tokens\": %llu, \"out_tokens\": %llu, \"throughput_tok_s\": %.10g, "
				"\"ttft_ms\": {\"mean\": %.10g, \"p50\": %.10g, \"p99\": %.10g}, "
				"\"tpot_ms\": {\"mean\": %.10g, \"p50\": %.10g, \"p99\": %.10g}, "
				"\"tbt_p99_ms\": %.10g, "
				"\"preemptions\": %llu, \"prefix_hit_rate\": %.10g, "
				"\"dup_tokens\": %llu, \"kv_waste\": %.10g",
				r->label, rows[i].n_seeds, r->n_req, r->finished, r->errors,
				rows[i].has_base ? rows[i].speedup : 0.0, rows[i].speedup_q1,
				rows[i].speedup_q3, rows[i].wins, r->makespan_us, r->prefill_us,
				r->decode_us, rows[i].prefill_share, (unsigned long long)r->prefill_calls,
				(unsigned long long)r->decode_steps, (unsigned long long)r->steps,
				(unsigned long long)r->prefill_tokens,
				(unsigned long long)r->decode_tokens,
				(unsigned long long)r->out_tokens, r->tput_tok_s, r->ttft_mean,
				r->ttft_p50, r->ttft_p99, r->tpot_mean, r->tpot_p50, r->tpot_p99,
				r->tbt_p99, (unsigned long long)r->preemptions, hit_rate(r),
				(unsigned long long)r->dup_tokens, r->kv_waste);
			if (roofline)
				fprintf(out, ", \"mfu\": %.10g, \"mbu\": %.10g", r->mfu, r->mbu);
			if (r->ref_ttft_mean >= 0)
				fprintf(out,
					", \"ref_ttft_mean_ms\": %.10g, \"ref_tpot_mean_ms\": %.10g",
					r->ref_ttft_mean, r->ref_tpot_mean);
			if (rows[i].has_goodput)
				fprintf(out, ", \"goodput_rps\": %.10g, \"goodput_capped\": %d",
					rows[i].goodput_rps, rows[i].goodput_capped);
			fprintf(out, ", \"prediction_error\": %.10g, \"wall_s\": %.10g}%s\n",
				r->pred_err, r->wall_s, i + 1 < n ? "," : "");
		}
		fprintf(out, "]\n");
		return;
	}
	if (fmt == SIM_CSV) {
		fprintf(out, "label,seeds,requests,speedup,prefill_calls,decode_steps,prefill_share,"
			     "makespan_us,throughput_tok_s,ttft_mean_ms,ttft_p50_ms,ttft_p99_ms,"
			     "tpot_mean_ms,tpot_p50_ms,tpot_p99_ms,tbt_p99_ms,preemptions,prefix_hit_rate,"
			     "kv_waste,mfu,mbu,ref_ttft_mean_ms,ref_tpot_mean_ms,errors,goodput_rps\n");
		for (int i = 0; i < n; i++) {
			const sim_result *r = &rows[i].med;
			fprintf(out,
				"%s,%d,%u,%.10g,%llu,%llu,%.10g,%.10g,%.10g,%.10g,%.10g,%.10g,%.10g,%.10g,"
				"%.10g,%.10g,%llu,%.10g,%.10g,%.10g,%.10g,%.10g,%.10g,%u,",
				r->label, rows[i].n_seeds, r->n_req,
				rows[i].has_base ? rows[i].speedup : 0.0,
				(unsigned long long)r->prefill_calls,
				(unsigned long long)r->decode_steps, rows[i].prefill_share, r->makespan_us,
				r->tput_tok_s, r->ttft_mean, r->ttft_p50, r->ttft_p99, r->tpot_mean,
				r->tpot_p50, r->tpot_p99, r->tbt_p99, (unsigned long long)r->preemptions,
				hit_rate(r), r->kv_waste, roofline ? r->mfu : 0.0,
				roofline ? r->mbu : 0.0, r->ref_ttft_mean, r->ref_tpot_mean, r->errors);
			if (rows[i].has_goodput)
				fprintf(out, "%.10g", rows[i].goodput_rps);
			fprintf(out, "\n");
		}
		return;
	}
	if (title)
		fprintf(out, "%s\n", title);
	fprintf(out, "%-14s %8s %6s %8s %8s %7s %10s %9s %9s %9s %8s %8s %8s %8s %6s %6s %6s",
		"policy", "speedup", "errors", "prefills", "decodes", "pf%", "tok/s", "ttft_avg",
		"ttft_p50", "ttft_p99", "tpot_avg", "tpot_p50", "tpot_p99", "tbt_p99", "preempt",
		"hit%", "waste%");
	if (roofline)
		fprintf(out, " %6s %6s", "MFU%", "MBU%");
	fprintf(out, "\n");
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		char sp[16];
		if (rows[i].has_base)
			snprintf(sp, sizeof(sp), "%.3f", rows[i].speedup);
		else
			snprintf(sp, sizeof(sp), "-");
		fprintf(out,
			"%-14s %8s %6u %8llu %8llu %6.1f%% %10.1f %9.2f %9.2f %9.2f %8.2f %8.2f "
			"%8.2f %8.2f %6llu %5.1f%% %5.1f%%",
			r->label, sp, r->errors, (unsigned long long)r->prefill_calls,
			(unsigned long long)r->decode_steps, 100.0 * rows[i].prefill_share, r->tput_tok_s,
			r->ttft_mean, r->ttft_p50, r->ttft_p99, r->tpot_mean, r->tpot_p50,
			r->tpot_p99, r->tbt_p99, (unsigned long long)r->preemptions, 100.0 * hit_rate(r),
			100.0 * r->kv_waste);
		if (roofline)
			fprintf(out, " %5.1f%% %5.1f%%", 100.0 * r->mfu, 100.0 * r->mbu);
		fprintf(out, "\n");
	}
	if (n)
		fprintf(out, "(medians over %d seed%s; times in ms; speed-up vs static on the "
			     "same traces)\n",
			rows[0].n_seeds, rows[0].n_seeds == 1 ? "" : "s");
	if (title) {
		fputs("columns: speedup = static makespan / the row's (per seed, then the median);\n"
		      "  errors = requests ended by an error or abort (the most over seeds; a row\n"
		      "  with errors is not a valid result); prefills / decodes = host calls carrying\n"
		      "  prefill / decode rows; pf% = prefill time / busy time; tok/s = generated\n"
		      "  tokens per virtual second; ttft = first token - arrival; tpot = (last -\n"
		      "  first) / (tokens - 1) per request; tbt_p99 = p99 of every gap between two\n"
		      "  tokens of a request; preempt = preemptions; hit% = prompt tokens served by\n"
		      "  the prefix cache; waste% = allocated KV slots holding no token (mean over\n"
		      "  steps)",
		      out);
		if (roofline)
			fputs("; MFU% / MBU% = roofline FLOPs / bytes over busy time at peak", out);
		fputs(".\n", out);
	}
}

int sim_warn_errors(FILE *err, const sim_row *rows, int n)
{
	int bad = 0;
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		if (!r->errors)
			continue;
		bad++;
		fprintf(err,
			"bkv-sim: warning: %s: %u of %u requests failed (ended by an error or "
			"abort, e.g. a prompt larger than the pool: see --kv-blocks); its "
			"latencies and speed-up cover only the others\n",
			r->label, r->errors, r->n_req);
	}
	return bad;
}

void sim_note_overload(FILE *out, const sim_row *rows, int n)
{
	int over = 0, listed = 0;
	double span = 0.0;
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		if (r->span_us > 0.0 && r->makespan_us > SIM_OVERLOAD * r->span_us)
			over++, span = r->span_us;
	}
	if (!over)
		return;
	fprintf(out, "overload: %d of %d rows take more than %.1fx the trace's arrival span "
		     "(%.1f s), so requests queue and TTFT measures the queue; makespan / span:",
		over, n, SIM_OVERLOAD, span / 1e6);
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		if (!(r->span_us > 0.0 && r->makespan_us > SIM_OVERLOAD * r->span_us))
			continue;
		if (listed++ == 12) {
			fprintf(out, " ...");
			break;
		}
		fprintf(out, "%s %s %.2fx", listed > 1 ? "," : "", r->label, r->makespan_us / r->span_us);
	}
	fprintf(out, "\n");
}

/* Escape the few XML characters a label may hold. */
static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '<')
			fputs("&lt;", f);
		else if (*s == '>')
			fputs("&gt;", f);
		else if (*s == '&')
			fputs("&amp;", f);
		else
			fputc(*s, f);
	}
}

int sim_svg(const char *path, const sim_row *rows, int n, const char *title)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	const int bar_w = 56, gap = 24, left = 70, top = 50, height = 300;
	/* labels longer than a bar is wide are slanted; room below for them */
	size_t longest = 0;
	for (int i = 0; i < n; i++)
		if (strlen(rows[i].med.label) > longest)
			longest = strlen(rows[i].med.label);
	int slant = longest > 8;
	int below = slant ? 20 + (int)(longest * 7 * 0.6) : 0;
	int width = left + n * (bar_w + gap) + 140;
	if (title && (int)strlen(title) * 8 + left + 20 > width)
		width = (int)strlen(title) * 8 + left + 20;
	double ymax = 0.0;
	for (int i = 0; i < n; i++) {
		double tot = rows[i].med.prefill_us + rows[i].med.decode_us;
		if (tot > ymax)
			ymax = tot;
	}
	if (ymax <= 0.0)
		ymax = 1.0;
	/* round ticks: a step of 1, 2 or 5 x 10^k ms, the axis a multiple of it */
	double ms = ymax / 1000.0, step = pow(10.0, floor(log10(ms / 4.0)));
	if (step * 5 * 4 < ms)
		step *= 5;
	else if (step * 2 * 4 < ms)
		step *= 2;
	int nticks = (int)ceil(ms / step - 1e-9);
	if (nticks < 1)
		nticks = 1;
	ymax = nticks * step * 1000.0;
	int in_s = nticks * step >= 10000.0;
	fprintf(f,
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
		"font-family=\"sans-serif\" font-size=\"12\">\n",
		width, top + height + 70 + below);
	fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
	fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\">", left);
	xml_text(f, title ? title : "bkv-sim");
	fprintf(f, "</text>\n");
	/* axis and ticks in ms */
	fprintf(f,
		"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
		"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
		left, top, left, top + height, left, top + height, width - 130, top + height);
	for (int k = 0; k <= nticks; k++) {
		double v = step * k; /* ms */
		int y = top + height - (int)lround((double)height * k / nticks);
		fprintf(f,
			"<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%g</text>"
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n",
			left - 6, y + 4, in_s ? v / 1000.0 : v, left + 1, y, width - 130, y);
	}
	fprintf(f,
		"<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" "
		"text-anchor=\"middle\">busy time (%s)</text>\n",
		top + height / 2, top + height / 2, in_s ? "s" : "ms");
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		int x = left + gap / 2 + i * (bar_w + gap);
		int hp = (int)lround(height * r->prefill_us / ymax);
		int hd = (int)lround(height * r->decode_us / ymax);
		int yd = top + height - hd;
		int yp = yd - hp;
		fprintf(f,
			"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#9ecae1\"/>\n"
			"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#08519c\"/>\n",
			x, yd, bar_w, hd, x, yp, bar_w, hp);
		if (slant)
			fprintf(f,
				"<text x=\"%d\" y=\"%d\" text-anchor=\"end\" "
				"transform=\"rotate(-35 %d %d)\">",
				x + bar_w / 2 + 4, top + height + 16, x + bar_w / 2 + 4, top + height + 16);
		else
			fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", x + bar_w / 2,
				top + height + 16);
		xml_text(f, r->label);
		fprintf(f, "</text>\n");
		if (rows[i].has_base)
			fprintf(f,
				"<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%.2fx</text>\n",
				x + bar_w / 2, yp - 6, rows[i].speedup);
	}
	int lx = width - 120;
	fprintf(f,
		"<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"#08519c\"/>"
		"<text x=\"%d\" y=\"%d\">prefill</text>\n"
		"<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"#9ecae1\"/>"
		"<text x=\"%d\" y=\"%d\">decode</text>\n",
		lx, top, lx + 20, top + 12, lx, top + 22, lx + 20, top + 34);
	fprintf(f,
		"<text x=\"%d\" y=\"%d\" fill=\"#555\">bar labels: speed-up vs static "
		"(median over seeds)</text>\n</svg>\n",
		left, top + height + 40 + below);
	int bad = ferror(f);
	if (fclose(f) || bad)
		return -1;
	return 0;
}

/* ---- the goodput chart --------------------------------------------------- */

static int cmp_point(const void *a, const void *b)
{
	double x = ((const sim_goodput_point *)a)->rps, y = ((const sim_goodput_point *)b)->rps;
	return (x > y) - (x < y);
}

/* A round tick label: ms below a second, s above. */
static void fmt_ms(char *buf, size_t len, double ms)
{
	if (ms >= 1000.0)
		snprintf(buf, len, "%g s", ms / 1000.0);
	else
		snprintf(buf, len, "%g ms", ms);
}

int sim_goodput_svg(const char *path, const char *title, const char *const *labels,
		    const sim_goodput *g, int n, double ttft_ms, double tpot_ms, double pct)
{
	static const char *const col[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
					  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
					  "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"};
	const int ncol = (int)(sizeof(col) / sizeof(col[0]));
	const int left = 90, top = 76, pw = 560, ph = 230, gap = 70, legend_w = 260;
	int width = left + pw + 30 + legend_w;
	if (title && (int)strlen(title) * 8 + left > width)
		width = (int)strlen(title) * 8 + left;
	int legend_h = 20 + 18 * n;
	int height = top + 2 * ph + gap + 80;
	if (top + legend_h + 20 > height)
		height = top + legend_h + 20;
	/* x range: around the goodputs found (a quarter to four times) */
	double glo = 0.0, ghi = 0.0;
	for (int i = 0; i < n; i++) {
		if (g[i].rps <= 0.0)
			continue;
		if (glo == 0.0 || g[i].rps < glo)
			glo = g[i].rps;
		if (g[i].rps > ghi)
			ghi = g[i].rps;
	}
	if (glo == 0.0) {
		for (int i = 0; i < n; i++)
			for (int k = 0; k < g[i].evals && k < SIM_GOODPUT_POINTS; k++) {
				double r = g[i].pt[k].rps;
				if (glo == 0.0 || r < glo)
					glo = r;
				if (r > ghi)
					ghi = r;
			}
	}
	if (!(glo > 0.0))
		glo = 1.0, ghi = 10.0;
	double xlo = glo / 4.0, xhi = ghi * 4.0;
	double ylo[2] = {0, 0}, yhi[2] = {0, 0}, tgt[2] = {ttft_ms, tpot_ms};
	for (int p = 0; p < 2; p++) {
		ylo[p] = yhi[p] = tgt[p];
		for (int i = 0; i < n; i++)
			for (int k = 0; k < g[i].evals && k < SIM_GOODPUT_POINTS; k++) {
				const sim_goodput_point *q = &g[i].pt[k];
				double v = p ? q->tpot_p99_ms : q->ttft_p99_ms;
				if (q->rps < xlo || q->rps > xhi || !(v > 0.0))
					continue;
				if (v < ylo[p])
					ylo[p] = v;
				if (v > yhi[p])
					yhi[p] = v;
			}
		ylo[p] /= 1.5;
		yhi[p] *= 1.5;
	}
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f,
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
		"font-family=\"sans-serif\" font-size=\"12\">\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
		"<text x=\"%d\" y=\"24\" font-size=\"15\">",
		width, height, left);
	xml_text(f, title ? title : "bkv-sim goodput");
	fprintf(f, "</text>\n<text x=\"%d\" y=\"42\" fill=\"#555\">p99 over each run's requests "
		   "(median over seeds) against arrival rate, log scales; dashed: the target;</text>\n"
		   "<text x=\"%d\" y=\"58\" fill=\"#555\">ticks on the rate axis: each row's goodput "
		   "(the highest rate at which %g%% of requests meet both targets)</text>\n",
		left, left, pct);
	const double m125[] = {1, 2, 5};
	for (int p = 0; p < 2; p++) {
		int y0 = top + p * (ph + gap);
		double ly0 = log10(ylo[p]), ly1 = log10(yhi[p]), lx0 = log10(xlo), lx1 = log10(xhi);
#define PX(r) (left + (int)lround(pw * (log10(r) - lx0) / (lx1 - lx0)))
#define PY(v) (y0 + ph - (int)lround(ph * (log10(v) - ly0) / (ly1 - ly0)))
		fprintf(f,
			"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
			"stroke=\"black\"/>\n",
			left, y0, pw, ph);
		fprintf(f,
			"<text x=\"18\" y=\"%d\" transform=\"rotate(-90 18 %d)\" "
			"text-anchor=\"middle\">%s</text>\n",
			y0 + ph / 2, y0 + ph / 2, p ? "p99 TPOT" : "p99 TTFT");
		/* y ticks at 1, 2, 5 x 10^k */
		for (int e = (int)floor(ly0) - 1; e <= (int)ceil(ly1); e++)
			for (int m = 0; m < 3; m++) {
				double v = m125[m] * pow(10.0, e);
				if (v < ylo[p] || v > yhi[p])
					continue;
				char lab[32];
				fmt_ms(lab, sizeof(lab), v);
				fprintf(f,
					"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#e5e5e5\"/>"
					"<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n",
					left, PY(v), left + pw, PY(v), left - 6, PY(v) + 4, lab);
			}
		for (int e = (int)floor(lx0) - 1; e <= (int)ceil(lx1); e++)
			for (int m = 0; m < 3; m++) {
				double v = m125[m] * pow(10.0, e);
				if (v < xlo || v > xhi)
					continue;
				fprintf(f,
					"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#e5e5e5\"/>"
					"<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
					PX(v), y0, PX(v), y0 + ph, PX(v), y0 + ph + 16, v);
			}
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">arrival rate (req/s)</text>\n",
			left + pw / 2, y0 + ph + 34);
		if (tgt[p] >= ylo[p] && tgt[p] <= yhi[p])
			fprintf(f,
				"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\" "
				"stroke-dasharray=\"6 4\"/>\n",
				left, PY(tgt[p]), left + pw, PY(tgt[p]));
		for (int i = 0; i < n; i++) {
			sim_goodput_point pts[SIM_GOODPUT_POINTS];
			int np = 0;
			for (int k = 0; k < g[i].evals && k < SIM_GOODPUT_POINTS; k++) {
				const sim_goodput_point *q = &g[i].pt[k];
				double v = p ? q->tpot_p99_ms : q->ttft_p99_ms;
				if (q->rps >= xlo && q->rps <= xhi && v > 0.0)
					pts[np++] = *q;
			}
			qsort(pts, (size_t)np, sizeof(pts[0]), cmp_point);
			const char *c = col[i % ncol];
			if (np) {
				fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
					   "points=\"",
					c);
				for (int k = 0; k < np; k++) {
					double v = p ? pts[k].tpot_p99_ms : pts[k].ttft_p99_ms;
					double vc = v < ylo[p] ? ylo[p] : v > yhi[p] ? yhi[p] : v;
					fprintf(f, "%s%d,%d", k ? " " : "", PX(pts[k].rps), PY(vc));
				}
				fprintf(f, "\"/>\n");
			}
			if (g[i].rps >= xlo && g[i].rps <= xhi)
				fprintf(f,
					"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
					"stroke-width=\"2\"/>\n",
					PX(g[i].rps), y0 + ph, PX(g[i].rps), y0 + ph - 10, c);
		}
#undef PX
#undef PY
	}
	int lx = left + pw + 30;
	for (int i = 0; i < n; i++) {
		int y = top + 12 + 18 * i;
		fprintf(f,
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
			"stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">",
			lx, y - 4, lx + 18, y - 4, col[i % ncol], lx + 24, y);
		xml_text(f, labels[i]);
		if (g[i].capped < 0)
			fprintf(f, ": 0 req/s</text>\n");
		else
			fprintf(f, ": %.4g req/s%s</text>\n", g[i].rps, g[i].capped > 0 ? " or more" : "");
	}
	fprintf(f, "</svg>\n");
	int bad = ferror(f);
	if (fclose(f) || bad)
		return -1;
	return 0;
}
