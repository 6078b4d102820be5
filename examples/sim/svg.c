/*
 * svg.c - bkv-sim's two charts, written as plain SVG text.
 *
 * The bar chart (sim_svg) draws, per row, a bar of busy time split into
 * prefill (dark) and decode (light) on an axis of round ticks, with the
 * row's speed-up over it, like seed 000's figure. The goodput chart
 * (sim_goodput_svg) draws two log-log panels, p99 TTFT and p99 TPOT against
 * arrival rate, one line per row through the rates its search simulated,
 * the target dashed and each row's goodput ticked on the rate axis; the
 * legend gives each goodput.
 *
 *   sim_svg:          title / axis and ticks / a bar per row / legend
 *   sim_goodput_svg:  title and notes / TTFT panel / TPOT panel / legend
 */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- the bar chart ------------------------------------------------------- */

/* The bar chart's geometry, in pixels unless named otherwise. */
typedef struct bars {
	int bar_w, gap;   /* a bar's width, the space between bars */
	int left, top;    /* the plot's top-left corner */
	int height;       /* the plot's height */
	int width;        /* the picture's width (the title may widen it) */
	int slant;        /* labels are slanted (one is wider than a bar) */
	int below;        /* room under the axis for slanted labels */
	double ymax;      /* busy time at the top of the axis, us */
	double step;      /* ms between ticks: 1, 2 or 5 x 10^k */
	int nticks;       /* ticks above 0 (>= 1); ymax is nticks * step */
	int in_s;         /* tick labels in s (else ms) */
} bars;

static void bars_layout(bars *b, const sim_row *rows, int n, const char *title)
{
	b->bar_w = 56, b->gap = 24, b->left = 70, b->top = 50, b->height = 300;
	/* labels longer than a bar is wide are slanted; room below for them */
	size_t longest = 0;
	for (int i = 0; i < n; i++)
		if (strlen(rows[i].med.label) > longest)
			longest = strlen(rows[i].med.label);
	b->slant = longest > 8;
	b->below = b->slant ? 20 + (int)(longest * 7 * 0.6) : 0;
	b->width = b->left + n * (b->bar_w + b->gap) + 140;
	if (title && (int)strlen(title) * 8 + b->left + 20 > b->width)
		b->width = (int)strlen(title) * 8 + b->left + 20;
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
	b->ymax = nticks * step * 1000.0;
	b->step = step;
	b->nticks = nticks;
	b->in_s = nticks * step >= 10000.0;
}

/* The picture's frame: background, title, the axis and its ticks. */
static void bars_axis(FILE *f, const bars *b, const char *title)
{
	const int left = b->left, top = b->top, height = b->height, width = b->width;
	fprintf(f,
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
		"font-family=\"sans-serif\" font-size=\"12\">\n",
		width, top + height + 70 + b->below);
	fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
	fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\">", left);
	xml_text(f, title ? title : "bkv-sim");
	fprintf(f, "</text>\n");
	/* axis and ticks in ms */
	fprintf(f,
		"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
		"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
		left, top, left, top + height, left, top + height, width - 130, top + height);
	for (int k = 0; k <= b->nticks; k++) {
		double v = b->step * k; /* ms */
		int y = top + height - (int)lround((double)height * k / b->nticks);
		fprintf(f,
			"<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%g</text>"
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n",
			left - 6, y + 4, b->in_s ? v / 1000.0 : v, left + 1, y, width - 130, y);
	}
	fprintf(f,
		"<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" "
		"text-anchor=\"middle\">busy time (%s)</text>\n",
		top + height / 2, top + height / 2, b->in_s ? "s" : "ms");
}

/* A bar per row (decode below, prefill on top), its label and speed-up. */
static void bars_rows(FILE *f, const bars *b, const sim_row *rows, int n)
{
	const int bar_w = b->bar_w, top = b->top, height = b->height;
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		int x = b->left + b->gap / 2 + i * (bar_w + b->gap);
		int hp = (int)lround(height * r->prefill_us / b->ymax);
		int hd = (int)lround(height * r->decode_us / b->ymax);
		int yd = top + height - hd;
		int yp = yd - hp;
		fprintf(f,
			"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#9ecae1\"/>\n"
			"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#08519c\"/>\n",
			x, yd, bar_w, hd, x, yp, bar_w, hp);
		if (b->slant)
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
}

static void bars_legend(FILE *f, const bars *b)
{
	int lx = b->width - 120, top = b->top;
	fprintf(f,
		"<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"#08519c\"/>"
		"<text x=\"%d\" y=\"%d\">prefill</text>\n"
		"<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"#9ecae1\"/>"
		"<text x=\"%d\" y=\"%d\">decode</text>\n",
		lx, top, lx + 20, top + 12, lx, top + 22, lx + 20, top + 34);
	fprintf(f,
		"<text x=\"%d\" y=\"%d\" fill=\"#555\">bar labels: speed-up vs static "
		"(median over seeds)</text>\n</svg>\n",
		b->left, top + b->height + 40 + b->below);
}

int sim_svg(const char *path, const sim_row *rows, int n, const char *title)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	bars b;
	bars_layout(&b, rows, n, title);
	bars_axis(f, &b, title);
	bars_rows(f, &b, rows, n);
	bars_legend(f, &b);
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

static const char *const colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
				      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
				      "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"};
#define N_COLOURS ((int)(sizeof(colours) / sizeof(colours[0])))

/* The goodput chart's geometry: two panels (p = 0: p99 TTFT, 1: p99 TPOT)
 * one above the other, the legend to their right. Pixels unless named. */
typedef struct gp_chart {
	int left, top;        /* the first panel's top-left corner */
	int pw, ph, gap;      /* a panel's width and height, the space between */
	int legend_w;         /* the legend's width */
	int width, height;    /* the picture's */
	double xlo, xhi;      /* the rate axis, req/s (log scale) */
	double ylo[2], yhi[2]; /* each panel's latency axis, ms (log scale) */
	double tgt[2];        /* each panel's target, ms */
} gp_chart;

/* The points of every row, min(evals, SIM_GOODPUT_POINTS) each. */
#define FOR_POINTS(g, n, i, k)                                                 \
	for (int i = 0; i < (n); i++)                                          \
		for (int k = 0; k < (g)[i].evals && k < SIM_GOODPUT_POINTS; k++)

/* The rate axis: a quarter of the lowest goodput found to four times the
 * highest (when none was found, of the rates simulated; else 1 to 10). */
static void gp_rate_range(gp_chart *c, const sim_goodput *g, int n)
{
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
		FOR_POINTS(g, n, i, k) {
			double r = g[i].pt[k].rps;
			if (glo == 0.0 || r < glo)
				glo = r;
			if (r > ghi)
				ghi = r;
		}
	}
	if (!(glo > 0.0))
		glo = 1.0, ghi = 10.0;
	c->xlo = glo / 4.0;
	c->xhi = ghi * 4.0;
}

static void gp_layout(gp_chart *c, const char *title, const sim_goodput *g, int n,
		      double ttft_ms, double tpot_ms)
{
	c->left = 90, c->top = 76, c->pw = 560, c->ph = 230, c->gap = 70, c->legend_w = 260;
	c->width = c->left + c->pw + 30 + c->legend_w;
	if (title && (int)strlen(title) * 8 + c->left > c->width)
		c->width = (int)strlen(title) * 8 + c->left;
	int legend_h = 20 + 18 * n;
	c->height = c->top + 2 * c->ph + c->gap + 80;
	if (c->top + legend_h + 20 > c->height)
		c->height = c->top + legend_h + 20;
	gp_rate_range(c, g, n);
	c->tgt[0] = ttft_ms;
	c->tgt[1] = tpot_ms;
	/* each latency axis: the target and the points in the rate range,
	 * with a margin of 1.5x either way */
	for (int p = 0; p < 2; p++) {
		c->ylo[p] = c->yhi[p] = c->tgt[p];
		FOR_POINTS(g, n, i, k) {
			const sim_goodput_point *q = &g[i].pt[k];
			double v = p ? q->tpot_p99_ms : q->ttft_p99_ms;
			if (q->rps < c->xlo || q->rps > c->xhi || !(v > 0.0))
				continue;
			if (v < c->ylo[p])
				c->ylo[p] = v;
			if (v > c->yhi[p])
				c->yhi[p] = v;
		}
		c->ylo[p] /= 1.5;
		c->yhi[p] *= 1.5;
	}
}

/* Pixel column of rate r and row of latency v in panel p. */
static int gp_x(const gp_chart *c, double r)
{
	double lx0 = log10(c->xlo), lx1 = log10(c->xhi);
	return c->left + (int)lround(c->pw * (log10(r) - lx0) / (lx1 - lx0));
}

static int gp_y(const gp_chart *c, int p, double v)
{
	int y0 = c->top + p * (c->ph + c->gap);
	double ly0 = log10(c->ylo[p]), ly1 = log10(c->yhi[p]);
	return y0 + c->ph - (int)lround(c->ph * (log10(v) - ly0) / (ly1 - ly0));
}

static void gp_header(FILE *f, const gp_chart *c, const char *title, double pct)
{
	fprintf(f,
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
		"font-family=\"sans-serif\" font-size=\"12\">\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
		"<text x=\"%d\" y=\"24\" font-size=\"15\">",
		c->width, c->height, c->left);
	xml_text(f, title ? title : "bkv-sim goodput");
	fprintf(f, "</text>\n<text x=\"%d\" y=\"42\" fill=\"#555\">p99 over each run's requests "
		   "(median over seeds) against arrival rate, log scales; dashed: the target;</text>\n"
		   "<text x=\"%d\" y=\"58\" fill=\"#555\">ticks on the rate axis: each row's goodput "
		   "(the highest rate at which %g%% of requests meet both targets)</text>\n",
		c->left, c->left, pct);
}

/* Panel p's frame, its grid at 1, 2, 5 x 10^k on both axes, the axis names
 * and the dashed target. */
static void gp_panel_axes(FILE *f, const gp_chart *c, int p)
{
	static const double m125[] = {1, 2, 5};
	const int left = c->left, pw = c->pw, ph = c->ph;
	int y0 = c->top + p * (ph + c->gap);
	double ly0 = log10(c->ylo[p]), ly1 = log10(c->yhi[p]);
	double lx0 = log10(c->xlo), lx1 = log10(c->xhi);
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
			if (v < c->ylo[p] || v > c->yhi[p])
				continue;
			char lab[32];
			fmt_ms(lab, sizeof(lab), v);
			fprintf(f,
				"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#e5e5e5\"/>"
				"<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n",
				left, gp_y(c, p, v), left + pw, gp_y(c, p, v), left - 6,
				gp_y(c, p, v) + 4, lab);
		}
	for (int e = (int)floor(lx0) - 1; e <= (int)ceil(lx1); e++)
		for (int m = 0; m < 3; m++) {
			double v = m125[m] * pow(10.0, e);
			if (v < c->xlo || v > c->xhi)
				continue;
			fprintf(f,
				"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#e5e5e5\"/>"
				"<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
				gp_x(c, v), y0, gp_x(c, v), y0 + ph, gp_x(c, v), y0 + ph + 16, v);
		}
	fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">arrival rate (req/s)</text>\n",
		left + pw / 2, y0 + ph + 34);
	if (c->tgt[p] >= c->ylo[p] && c->tgt[p] <= c->yhi[p])
		fprintf(f,
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\" "
			"stroke-dasharray=\"6 4\"/>\n",
			left, gp_y(c, p, c->tgt[p]), left + pw, gp_y(c, p, c->tgt[p]));
}

/* Row i's line in panel p through its points in the rate range (sorted by
 * rate, latencies clamped to the axis), and its goodput's tick. */
static void gp_panel_row(FILE *f, const gp_chart *c, int p, const sim_goodput *gi, int i)
{
	int y0 = c->top + p * (c->ph + c->gap);
	sim_goodput_point pts[SIM_GOODPUT_POINTS];
	int np = 0;
	for (int k = 0; k < gi->evals && k < SIM_GOODPUT_POINTS; k++) {
		const sim_goodput_point *q = &gi->pt[k];
		double v = p ? q->tpot_p99_ms : q->ttft_p99_ms;
		if (q->rps >= c->xlo && q->rps <= c->xhi && v > 0.0)
			pts[np++] = *q;
	}
	qsort(pts, (size_t)np, sizeof(pts[0]), cmp_point);
	const char *col = colours[i % N_COLOURS];
	if (np) {
		fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
			   "points=\"",
			col);
		for (int k = 0; k < np; k++) {
			double v = p ? pts[k].tpot_p99_ms : pts[k].ttft_p99_ms;
			double vc = v < c->ylo[p] ? c->ylo[p] : v > c->yhi[p] ? c->yhi[p] : v;
			fprintf(f, "%s%d,%d", k ? " " : "", gp_x(c, pts[k].rps), gp_y(c, p, vc));
		}
		fprintf(f, "\"/>\n");
	}
	if (gi->rps >= c->xlo && gi->rps <= c->xhi)
		fprintf(f,
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
			"stroke-width=\"2\"/>\n",
			gp_x(c, gi->rps), y0 + c->ph, gp_x(c, gi->rps), y0 + c->ph - 10, col);
}

static void gp_legend(FILE *f, const gp_chart *c, const char *const *labels,
		      const sim_goodput *g, int n)
{
	int lx = c->left + c->pw + 30;
	for (int i = 0; i < n; i++) {
		int y = c->top + 12 + 18 * i;
		fprintf(f,
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
			"stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">",
			lx, y - 4, lx + 18, y - 4, colours[i % N_COLOURS], lx + 24, y);
		xml_text(f, labels[i]);
		if (g[i].capped < 0)
			fprintf(f, ": 0 req/s</text>\n");
		else
			fprintf(f, ": %.4g req/s%s</text>\n", g[i].rps, g[i].capped > 0 ? " or more" : "");
	}
}

int sim_goodput_svg(const char *path, const char *title, const char *const *labels,
		    const sim_goodput *g, int n, double ttft_ms, double tpot_ms, double pct)
{
	gp_chart c;
	gp_layout(&c, title, g, n, ttft_ms, tpot_ms);
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	gp_header(f, &c, title, pct);
	for (int p = 0; p < 2; p++) {
		gp_panel_axes(f, &c, p);
		for (int i = 0; i < n; i++)
			gp_panel_row(f, &c, p, &g[i], i);
	}
	gp_legend(f, &c, labels, g, n);
	fprintf(f, "</svg>\n");
	int bad = ferror(f);
	if (fclose(f) || bad)
		return -1;
	return 0;
}
