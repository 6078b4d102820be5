/*
 * svg.c - bkv-sim's two charts, written as plain SVG text.
 *
 * The bar chart (sim_svg) draws, per row, a bar of busy time split into
 * prefill (dark) and decode (light) on an axis of round ticks, with the
 * row's speed-up over it, like seed 000's figure. The goodput chart
 * (sim_goodput_svg) draws two log-log panels, p99 TTFT and p99 TPOT against
 * arrival rate, one line per row through the rates its search simulated
 * (a marker at each), the target dashed and each row's goodput ticked on
 * the rate axis; the legend gives each goodput. Rows whose searches gave
 * identical points share one line and one legend entry; each line has its
 * own colour (Okabe-Ito), marker and dash; the axes fit the points, and a
 * rate axis whose goodputs fall into two clusters far apart has a break
 * between them.
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

/* Okabe & Ito's palette for colour-blind readers (yellow left out: it
 * vanishes on white) and a grey; series past the eighth also change dashes,
 * and each series has its own marker, so no two series look alike. */
static const char *const colours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
				      "#E69F00", "#56B4E9", "#000000", "#999999"};
#define N_COLOURS ((int)(sizeof(colours) / sizeof(colours[0])))
static const char *const dashes[] = {NULL, "7 3", "2 2"};
#define N_DASHES ((int)(sizeof(dashes) / sizeof(dashes[0])))
#define N_MARKERS 6 /* circle, square, triangle up, diamond, triangle down, cross */
/* (8 colours by 6 markers: no two of the first 24 series share both) */

/* Series s's style: its colour, its dash pattern (NULL: solid), its
 * marker. */
static const char *gp_colour(int s) { return colours[s % N_COLOURS]; }
static const char *gp_dash(int s) { return dashes[(s / N_COLOURS) % N_DASHES]; }

/* Marker m of series colour col at (x, y), about 7 pixels across. */
static void gp_marker(FILE *f, int m, const char *col, int x, int y)
{
	switch (m % N_MARKERS) {
	case 0:
		fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"3.5\" fill=\"%s\"/>", x, y, col);
		break;
	case 1:
		fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"7\" height=\"7\" fill=\"%s\"/>", x - 3,
			y - 3, col);
		break;
	case 2:
		fprintf(f, "<path d=\"M%d %dl4 7h-8z\" fill=\"%s\"/>", x, y - 4, col);
		break;
	case 3:
		fprintf(f, "<path d=\"M%d %dl4 4l-4 4l-4 -4z\" fill=\"%s\"/>", x, y - 4, col);
		break;
	case 4:
		fprintf(f, "<path d=\"M%d %dl4 -7h-8z\" fill=\"%s\"/>", x, y + 4, col);
		break;
	default:
		fprintf(f,
			"<path d=\"M%d %dl8 8m0 -8l-8 8\" stroke=\"%s\" stroke-width=\"2\" "
			"fill=\"none\"/>",
			x - 4, y - 4, col);
		break;
	}
}

/* The goodput chart's geometry: two panels (p = 0: p99 TTFT, 1: p99 TPOT)
 * one above the other, the legend to their right. Pixels unless named. */
typedef struct gp_chart {
	int left, top;        /* the first panel's top-left corner */
	int pw, ph, gap;      /* a panel's width and height, the space between */
	int legend_w;         /* the legend's width */
	int width, height;    /* the picture's */
	double xlo, xhi;      /* the rate axis, req/s (log scale) */
	double blo, bhi;      /* a break in the rate axis: the rates between
				 get only BREAK_W pixels (0, 0: none) */
	double ylo[2], yhi[2]; /* each panel's latency axis, ms (log scale) */
	double tgt[2];        /* each panel's target, ms */
	int n_series;         /* distinct series (rows with identical points
				 share one) */
	int *series;          /* [n] row i's series */
	int *first;           /* [n_series] the first row of each series */
	int legend_lines;     /* lines of text the legend takes */
} gp_chart;

#define BREAK_W 26 /* pixels of a break in the rate axis */
#define LEGEND_CHARS 34 /* characters of a legend line before it wraps */

/* The points of every row, min(evals, SIM_GOODPUT_POINTS) each. */
#define FOR_POINTS(g, n, i, k)                                                 \
	for (int i = 0; i < (n); i++)                                          \
		for (int k = 0; k < (g)[i].evals && k < SIM_GOODPUT_POINTS; k++)

/* Do two rows' searches give the same result and the same points? */
static int gp_same(const sim_goodput *a, const sim_goodput *b)
{
	if (a->rps != b->rps || a->capped != b->capped || a->evals != b->evals)
		return 0;
	for (int k = 0; k < a->evals && k < SIM_GOODPUT_POINTS; k++)
		if (a->pt[k].rps != b->pt[k].rps || a->pt[k].ttft_p99_ms != b->pt[k].ttft_p99_ms ||
		    a->pt[k].tpot_p99_ms != b->pt[k].tpot_p99_ms)
			return 0;
	return 1;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The rate axis: the rates simulated, a margin of 1.2x either way (1 to 10
 * when there are none). When the goodputs fall into two clusters more than
 * 10x apart (static batching far below the rest), the rates between the
 * clusters' goodputs, past a factor of 2 beyond each, are squeezed into a
 * break of BREAK_W pixels, so that neither cluster is squeezed into a
 * corner of the axis. */
static void gp_rate_range(gp_chart *c, const sim_goodput *g, int n)
{
	double lo = 0.0, hi = 0.0;
	FOR_POINTS(g, n, i, k) {
		double r = g[i].pt[k].rps;
		if (!(r > 0.0))
			continue;
		if (lo == 0.0 || r < lo)
			lo = r;
		if (r > hi)
			hi = r;
	}
	if (!(lo > 0.0))
		lo = 1.0, hi = 10.0;
	c->xlo = lo / 1.2;
	c->xhi = hi * 1.2;
	c->blo = c->bhi = 0.0;
	double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
	int m = 0;
	for (int i = 0; v && i < n; i++)
		if (g[i].rps > 0.0)
			v[m++] = g[i].rps;
	if (v && m >= 2) {
		qsort(v, (size_t)m, sizeof(double), cmp_dbl);
		double best = 0.0;
		int at = -1;
		for (int j = 0; j + 1 < m; j++)
			if (v[j + 1] / v[j] > best)
				best = v[j + 1] / v[j], at = j;
		if (best >= 10.0 && v[at] * 2.0 > c->xlo && v[at + 1] / 2.0 < c->xhi) {
			c->blo = v[at] * 2.0;
			c->bhi = v[at + 1] / 2.0;
		}
	}
	free(v);
}

/* Pixel column of rate r and row of latency v in panel p. */
static int gp_x(const gp_chart *c, double r)
{
	double lx0 = log10(c->xlo), lx1 = log10(c->xhi), L = log10(r);
	if (!(c->bhi > c->blo))
		return c->left + (int)lround(c->pw * (L - lx0) / (lx1 - lx0));
	double lb0 = log10(c->blo), lb1 = log10(c->bhi);
	double w = c->pw - BREAK_W, span = (lb0 - lx0) + (lx1 - lb1), x;
	if (L <= lb0)
		x = w * (L - lx0) / span;
	else if (L >= lb1)
		x = w * (lb0 - lx0) / span + BREAK_W + w * (L - lb1) / span;
	else
		x = w * (lb0 - lx0) / span + BREAK_W * (L - lb0) / (lb1 - lb0);
	return c->left + (int)lround(x);
}

static int in_break(const gp_chart *c, double r)
{
	return c->bhi > c->blo && r > c->blo && r < c->bhi;
}

/* The lines label takes in the legend, wrapped after a comma. */
static int legend_wrap(const char *label, char lines[][LEGEND_CHARS + 24], int max)
{
	int nl = 0;
	size_t len = strlen(label), at = 0;
	while (at < len && nl < max) {
		size_t take = len - at;
		if (take > LEGEND_CHARS) {
			take = LEGEND_CHARS;
			while (take > 1 && label[at + take - 1] != ',' && label[at + take - 1] != ' ')
				take--;
			if (take <= 1)
				take = LEGEND_CHARS;
		}
		snprintf(lines[nl++], LEGEND_CHARS + 24, "%.*s", (int)take, label + at);
		at += take;
		while (at < len && label[at] == ' ')
			at++;
	}
	return nl;
}

/* Row i's legend label: the rows of its series, then the goodput. */
static void legend_label(const gp_chart *c, const char *const *labels, const sim_goodput *g,
			 int n, int s, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = 0;
	for (int i = 0; i < n; i++)
		if (c->series[i] == s)
			used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%s",
						 used ? ", " : "", labels[i]);
	const sim_goodput *gi = &g[c->first[s]];
	if (used < len) {
		if (gi->capped < 0)
			snprintf(buf + used, len - used, ": 0 req/s");
		else
			snprintf(buf + used, len - used, ": %.4g req/s%s", gi->rps,
				 gi->capped > 0 ? " or more" : "");
	}
}

static int gp_layout(gp_chart *c, const char *title, const char *const *labels,
		     const sim_goodput *g, int n, double ttft_ms, double tpot_ms)
{
	c->left = 90, c->top = 92, c->pw = 560, c->ph = 230, c->gap = 70, c->legend_w = 290;
	c->series = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
	c->first = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
	if (!c->series || !c->first)
		return -1;
	c->n_series = 0;
	for (int i = 0; i < n; i++) {
		int s = 0;
		while (s < c->n_series && !gp_same(&g[c->first[s]], &g[i]))
			s++;
		if (s == c->n_series)
			c->first[c->n_series++] = i;
		c->series[i] = s;
	}
	c->legend_lines = 0;
	for (int s = 0; s < c->n_series; s++) {
		char buf[1024], lines[32][LEGEND_CHARS + 24];
		legend_label(c, labels, g, n, s, buf, sizeof(buf));
		c->legend_lines += legend_wrap(buf, lines, 32);
	}
	c->width = c->left + c->pw + 30 + c->legend_w;
	if (title && (int)strlen(title) * 8 + c->left > c->width)
		c->width = (int)strlen(title) * 8 + c->left;
	int legend_h = 20 + 16 * c->legend_lines + 6 * c->n_series;
	c->height = c->top + 2 * c->ph + c->gap + 80;
	if (c->top + legend_h + 20 > c->height)
		c->height = c->top + legend_h + 20;
	gp_rate_range(c, g, n);
	c->tgt[0] = ttft_ms;
	c->tgt[1] = tpot_ms;
	/* each latency axis: the target and the points of each row up to
	 * twice the rate where it first failed (past it latencies only grow:
	 * they are drawn at the axis's edge), with a margin of 1.2x */
	for (int p = 0; p < 2; p++) {
		c->ylo[p] = c->yhi[p] = c->tgt[p];
		FOR_POINTS(g, n, i, k) {
			const sim_goodput_point *q = &g[i].pt[k];
			double v = p ? q->tpot_p99_ms : q->ttft_p99_ms;
			if (!(v > 0.0))
				continue;
			if (v < c->ylo[p])
				c->ylo[p] = v;
			if (v > c->yhi[p] && !(g[i].capped >= 0 && g[i].hi_rps > 0.0 &&
					       q->rps > 2.0 * g[i].hi_rps))
				c->yhi[p] = v;
		}
		c->ylo[p] /= 1.2;
		c->yhi[p] *= 1.2;
	}
	return 0;
}

static int gp_y(const gp_chart *c, int p, double v)
{
	int y0 = c->top + p * (c->ph + c->gap);
	double ly0 = log10(c->ylo[p]), ly1 = log10(c->yhi[p]);
	return y0 + c->ph - (int)lround(c->ph * (log10(v) - ly0) / (ly1 - ly0));
}

static void gp_header(FILE *f, const gp_chart *c, const char *title, double pct, int n)
{
	fprintf(f,
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
		"font-family=\"sans-serif\" font-size=\"12\">\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
		"<text x=\"%d\" y=\"24\" font-size=\"15\">",
		c->width, c->height, c->left);
	xml_text(f, title ? title : "bkv-sim goodput");
	fprintf(f, "</text>\n<text x=\"%d\" y=\"42\" fill=\"#555\">p99 over each run's requests "
		   "(median over seeds) against arrival rate, log scales; dashed black: the target; "
		   "a marker per rate simulated;</text>\n"
		   "<text x=\"%d\" y=\"58\" fill=\"#555\">ticks on the rate axis: each row's goodput "
		   "(the highest rate at which %g%% of requests meet both targets);</text>\n",
		c->left, c->left, pct);
	fprintf(f, "<text x=\"%d\" y=\"74\" fill=\"#555\">latencies above an axis are drawn at "
		   "its top%s%s</text>\n",
		c->left, c->n_series < n ? "; rows with identical results share one line" : "",
		c->bhi > c->blo ? "; grey band: a break in the rate axis" : "");
}

/* Panel p's frame, its grid at 1, 2, 5 x 10^k on both axes (none in the
 * break), the axis names, the break and the dashed target. */
static void gp_panel_axes(FILE *f, const gp_chart *c, int p)
{
	static const double m125[] = {1, 2, 5};
	const int left = c->left, pw = c->pw, ph = c->ph;
	int y0 = c->top + p * (ph + c->gap);
	double ly0 = log10(c->ylo[p]), ly1 = log10(c->yhi[p]);
	double lx0 = log10(c->xlo), lx1 = log10(c->xhi);
	if (c->bhi > c->blo) {
		int bx0 = gp_x(c, c->blo), bx1 = gp_x(c, c->bhi);
		fprintf(f,
			"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#eeeeee\"/>"
			"<path d=\"M%d %dl6 -12M%d %dl6 -12\" stroke=\"black\"/>\n",
			bx0, y0, bx1 - bx0, ph, bx0 + 4, y0 + ph + 6, bx1 - 10, y0 + ph + 6);
	}
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
	/* past 3 decades only 10^k; a label that would overlap the one before
	 * is left out (about 7 pixels a character) */
	double shown = lx1 - lx0 - (c->bhi > c->blo ? log10(c->bhi / c->blo) : 0.0);
	int last_x = -1000, last_w = 0, sparse = shown > 3.0;
	for (int e = (int)floor(lx0) - 1; e <= (int)ceil(lx1); e++)
		for (int m = 0; m < (sparse ? 1 : 3); m++) {
			double v = m125[m] * pow(10.0, e);
			if (v < c->xlo || v > c->xhi || in_break(c, v))
				continue;
			int x = gp_x(c, v);
			char lab[32];
			snprintf(lab, sizeof(lab), "%g", v);
			int w = 7 * (int)strlen(lab);
			fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#e5e5e5\"/>",
				x, y0, x, y0 + ph);
			if (x - last_x >= (w + last_w) / 2 + 6) {
				fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>", x,
					y0 + ph + 16, lab);
				last_x = x;
				last_w = w;
			}
			fputc('\n', f);
		}
	fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">arrival rate (req/s)</text>\n",
		left + pw / 2, y0 + ph + 34);
	if (c->tgt[p] >= c->ylo[p] && c->tgt[p] <= c->yhi[p])
		fprintf(f,
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\" "
			"stroke-dasharray=\"6 4\"/>\n",
			left, gp_y(c, p, c->tgt[p]), left + pw, gp_y(c, p, c->tgt[p]));
}

/* Series s's line in panel p through its points (sorted by rate,
 * latencies clamped to the axis), a marker on each, and its goodput's
 * tick. */
static void gp_panel_row(FILE *f, const gp_chart *c, int p, const sim_goodput *gi, int s)
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
	const char *col = gp_colour(s), *dash = gp_dash(s);
	if (np) {
		fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"", col);
		if (dash)
			fprintf(f, " stroke-dasharray=\"%s\"", dash);
		fprintf(f, " points=\"");
		for (int k = 0; k < np; k++) {
			double v = p ? pts[k].tpot_p99_ms : pts[k].ttft_p99_ms;
			double vc = v < c->ylo[p] ? c->ylo[p] : v > c->yhi[p] ? c->yhi[p] : v;
			fprintf(f, "%s%d,%d", k ? " " : "", gp_x(c, pts[k].rps), gp_y(c, p, vc));
		}
		fprintf(f, "\"/>\n");
		for (int k = 0; k < np; k++) {
			double v = p ? pts[k].tpot_p99_ms : pts[k].ttft_p99_ms;
			double vc = v < c->ylo[p] ? c->ylo[p] : v > c->yhi[p] ? c->yhi[p] : v;
			gp_marker(f, s, col, gp_x(c, pts[k].rps), gp_y(c, p, vc));
		}
		fputc('\n', f);
	}
	if (gi->rps >= c->xlo && gi->rps <= c->xhi)
		fprintf(f,
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
			"stroke-width=\"2.5\"/>\n",
			gp_x(c, gi->rps), y0 + c->ph, gp_x(c, gi->rps), y0 + c->ph - 12, col);
}

static void gp_legend(FILE *f, const gp_chart *c, const char *const *labels,
		      const sim_goodput *g, int n)
{
	int lx = c->left + c->pw + 30, y = c->top + 12;
	for (int s = 0; s < c->n_series; s++) {
		char buf[1024], lines[32][LEGEND_CHARS + 24];
		legend_label(c, labels, g, n, s, buf, sizeof(buf));
		int nl = legend_wrap(buf, lines, 32);
		fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
			   "stroke-width=\"2\"",
			lx, y - 4, lx + 26, y - 4, gp_colour(s));
		if (gp_dash(s))
			fprintf(f, " stroke-dasharray=\"%s\"", gp_dash(s));
		fprintf(f, "/>");
		gp_marker(f, s, gp_colour(s), lx + 13, y - 4);
		for (int l = 0; l < nl; l++) {
			fprintf(f, "<text x=\"%d\" y=\"%d\">", lx + 32, y + 16 * l);
			xml_text(f, lines[l]);
			fprintf(f, "</text>");
		}
		fputc('\n', f);
		y += 16 * nl + 6;
	}
}

int sim_goodput_svg(const char *path, const char *title, const char *const *labels,
		    const sim_goodput *g, int n, double ttft_ms, double tpot_ms, double pct)
{
	gp_chart c;
	memset(&c, 0, sizeof(c));
	if (gp_layout(&c, title, labels, g, n, ttft_ms, tpot_ms)) {
		free(c.series);
		free(c.first);
		return -1;
	}
	FILE *f = fopen(path, "w");
	if (!f) {
		free(c.series);
		free(c.first);
		return -1;
	}
	gp_header(f, &c, title, pct, n);
	for (int p = 0; p < 2; p++) {
		gp_panel_axes(f, &c, p);
		for (int s = 0; s < c.n_series; s++)
			gp_panel_row(f, &c, p, &g[c.first[s]], s);
	}
	gp_legend(f, &c, labels, g, n);
	fprintf(f, "</svg>\n");
	free(c.series);
	free(c.first);
	int bad = ferror(f);
	if (fclose(f) || bad)
		return -1;
	return 0;
}
