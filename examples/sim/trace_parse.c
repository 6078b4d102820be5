/*
 * trace_parse.c - the trace file parsers of bkv-sim (trace.h).
 *
 * Three file formats, each read from a byte buffer that need not end in NUL:
 * the Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens;
 * wall-clock timestamps with up to 7 fraction digits), Mooncake's JSON Lines
 * (timestamp in ms, input_length, output_length, hash_ids of 512-token prefix
 * blocks) and the DistServe vLLM ground-truth CSV (named columns, one or more
 * runs). Every line is checked: a wrong field count, a number that does not
 * parse or is out of range, a JSON value of the wrong type, or time running
 * backwards ends the parse with "line N: ..." and an empty trace. The buffer
 * is copied once, NUL-terminated, and cut into lines in place, so no parse
 * step can read past it.
 *
 * The entry points (trace_parse, trace_load, trace_distserve_runs) are at
 * the end; every allocation goes through trace_alloc.h.
 */
#include "trace.h"
#include "trace_alloc.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small parsing helpers ----------------------------------------------- */

#if defined(__GNUC__)
#define PRINTF_LIKE __attribute__((format(printf, 4, 5)))
#else
#define PRINTF_LIKE
#endif

PRINTF_LIKE static void set_err(char *err, size_t errlen, unsigned long line, const char *fmt,
				...)
{
	if (!err || !errlen)
		return;
	int k = snprintf(err, errlen, "line %lu: ", line);
	if (k < 0 || (size_t)k >= errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
	va_end(ap);
}

/* Trim spaces, tabs and a trailing CR in place. */
static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
		s[--n] = '\0';
	return s;
}

/* A whole field as a token count in [lo, TRACE_MAX_TOKENS]. */
static int parse_count(const char *s, uint32_t lo, uint32_t *out)
{
	if (!*s || *s == '-' || *s == '+')
		return -1;
	for (const char *p = s; *p; p++)
		if (*p < '0' || *p > '9')
			return -1;
	errno = 0;
	unsigned long long v = strtoull(s, NULL, 10);
	if (errno || v < lo || v > TRACE_MAX_TOKENS)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* A whole field as a finite double. */
static int parse_real(const char *s, double *out)
{
	if (!*s)
		return -1;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || *end || !isfinite(v))
		return -1;
	*out = v;
	return 0;
}

/* Split a line at commas in place; returns the field count (<= max). */
static int split_csv(char *line, char **fields, int max)
{
	int n = 0;
	char *p = line;
	for (;;) {
		char *c = strchr(p, ',');
		if (n < max)
			fields[n] = trim(p);
		n++;
		if (!c)
			break;
		*c = '\0';
		p = c + 1;
	}
	return n;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's algorithm). */
static long days_from_civil(long y, long m, long d)
{
	y -= m <= 2;
	long era = (y >= 0 ? y : y - 399) / 400;
	long yoe = y - era * 400;
	long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

/* Read exactly n digits. */
static int digits(const char **p, int n, long *out)
{
	long v = 0;
	for (int i = 0; i < n; i++) {
		char c = (*p)[i];
		if (c < '0' || c > '9')
			return -1;
		v = v * 10 + (c - '0');
	}
	*p += n;
	*out = v;
	return 0;
}

/* "YYYY-MM-DD HH:MM:SS[.fffffff]" as microseconds since the epoch. */
static int parse_timestamp(const char *s, double *us)
{
	long y, mo, d, h, mi, se;
	const char *p = s;
	if (digits(&p, 4, &y) || *p++ != '-' || digits(&p, 2, &mo) || *p++ != '-' ||
	    digits(&p, 2, &d) || (*p != ' ' && *p != 'T'))
		return -1;
	p++;
	if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &mi) || *p++ != ':' ||
	    digits(&p, 2, &se))
		return -1;
	if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60)
		return -1;
	double frac = 0.0, scale = 0.1;
	if (*p == '.') {
		p++;
		if (*p < '0' || *p > '9')
			return -1;
		while (*p >= '0' && *p <= '9') {
			frac += (*p - '0') * scale;
			scale /= 10.0;
			p++;
		}
	}
	if (*p)
		return -1;
	double secs = (double)days_from_civil(y, mo, d) * 86400.0 + h * 3600.0 + mi * 60.0 + se;
	*us = (secs + frac) * 1e6;
	return 0;
}

/* ---- line iteration ------------------------------------------------------ */

typedef struct line_iter {
	char *buf;          /* private NUL-terminated copy */
	char *p;            /* next line */
	char *end;          /* buf + len */
	unsigned long line; /* number of the line last returned, from 1 */
} line_iter;

static int lines_open(line_iter *it, const char *buf, size_t len)
{
	it->buf = trace__malloc(len + 1);
	if (!it->buf)
		return TRACE_ENOMEM;
	if (len)
		memcpy(it->buf, buf, len);
	it->buf[len] = '\0';
	it->p = it->buf;
	it->end = it->buf + len;
	it->line = 0;
	return TRACE_OK;
}

/* Next line (trimmed, NUL-terminated), or NULL at the end. A NUL byte inside
 * the input ends its line there; the rest of that line is ignored. */
static char *lines_next(line_iter *it)
{
	if (it->p >= it->end)
		return NULL;
	char *s = it->p;
	char *nl = memchr(s, '\n', (size_t)(it->end - s));
	if (nl) {
		*nl = '\0';
		it->p = nl + 1;
	} else {
		it->p = it->end;
	}
	it->line++;
	return trim(s);
}

/* ---- Azure CSV ----------------------------------------------------------- */

static int parse_azure(line_iter *it, trace *t, char *err, size_t errlen)
{
	char *line;
	int header = 0;
	double t0 = 0.0, prev = 0.0;
	while ((line = lines_next(it))) {
		if (!*line)
			continue;
		char *f[4];
		int nf = split_csv(line, f, 4);
		if (!header) {
			if (nf != 3 || strcmp(f[0], "TIMESTAMP") || strcmp(f[1], "ContextTokens") ||
			    strcmp(f[2], "GeneratedTokens")) {
				set_err(err, errlen, it->line,
					"expected the header TIMESTAMP,ContextTokens,GeneratedTokens");
				return TRACE_EPARSE;
			}
			header = 1;
			continue;
		}
		if (nf != 3) {
			set_err(err, errlen, it->line, "expected 3 comma-separated fields, got %d",
				nf);
			return TRACE_EPARSE;
		}
		double ts;
		uint32_t ctx, gen;
		if (parse_timestamp(f[0], &ts)) {
			set_err(err, errlen, it->line,
				"bad TIMESTAMP '%.40s' (want YYYY-MM-DD HH:MM:SS.fffffff)", f[0]);
			return TRACE_EPARSE;
		}
		if (parse_count(f[1], 1, &ctx)) {
			set_err(err, errlen, it->line, "bad ContextTokens '%.40s' (want 1..%u)", f[1],
				TRACE_MAX_TOKENS);
			return TRACE_EPARSE;
		}
		if (parse_count(f[2], 0, &gen)) {
			set_err(err, errlen, it->line, "bad GeneratedTokens '%.40s' (want 0..%u)",
				f[2], TRACE_MAX_TOKENS);
			return TRACE_EPARSE;
		}
		if (t->n == 0)
			t0 = ts;
		else if (ts < prev) {
			set_err(err, errlen, it->line, "TIMESTAMP goes back in time");
			return TRACE_EPARSE;
		}
		prev = ts;
		if (trace_push(t, ts - t0, ctx, gen, NULL, 0))
			return TRACE_ENOMEM;
	}
	if (!header) {
		set_err(err, errlen, it->line + 1, "empty file: no header");
		return TRACE_EPARSE;
	}
	return TRACE_OK;
}

/* ---- Mooncake JSONL ------------------------------------------------------ */

/* A cursor over one JSON line. */
typedef struct json {
	const char *p;   /* next character */
	uint32_t *ids;   /* scratch for hash_ids, grown as needed */
	size_t n_ids;    /* ids read */
	size_t cap_ids;  /* allocated entries of ids */
} json;

static void ws(json *j)
{
	while (*j->p == ' ' || *j->p == '\t' || *j->p == '\r')
		j->p++;
}

/* A JSON string (contents ignored except for the key comparison). Writes up
 * to cap-1 bytes of it into out. Returns 0 or -1. */
static int json_string(json *j, char *out, size_t cap)
{
	if (*j->p != '"')
		return -1;
	j->p++;
	size_t n = 0;
	while (*j->p && *j->p != '"') {
		char c = *j->p++;
		if (c == '\\') {
			if (!*j->p)
				return -1;
			c = *j->p++;
		}
		if (n + 1 < cap)
			out[n++] = c;
	}
	if (*j->p != '"')
		return -1;
	j->p++;
	if (cap)
		out[n] = '\0';
	return 0;
}

/* A JSON number. */
static int json_number(json *j, double *v)
{
	char *end;
	if (!((*j->p >= '0' && *j->p <= '9') || *j->p == '-'))
		return -1;
	errno = 0;
	*v = strtod(j->p, &end);
	if (end == j->p || errno || !isfinite(*v))
		return -1;
	j->p = end;
	return 0;
}

/* Skip any JSON value (depth-limited). */
static int json_skip(json *j, int depth)
{
	ws(j);
	if (depth > 32)
		return -1;
	char c = *j->p;
	if (c == '"')
		return json_string(j, NULL, 0);
	if (c == '[' || c == '{') {
		char close = c == '[' ? ']' : '}';
		j->p++;
		ws(j);
		if (*j->p == close) {
			j->p++;
			return 0;
		}
		for (;;) {
			if (c == '{') {
				ws(j);
				if (json_string(j, NULL, 0))
					return -1;
				ws(j);
				if (*j->p++ != ':')
					return -1;
			}
			if (json_skip(j, depth + 1))
				return -1;
			ws(j);
			if (*j->p == ',') {
				j->p++;
				continue;
			}
			if (*j->p == close) {
				j->p++;
				return 0;
			}
			return -1;
		}
	}
	if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) {
		j->p += 4;
		return 0;
	}
	if (!strncmp(j->p, "false", 5)) {
		j->p += 5;
		return 0;
	}
	double v;
	return json_number(j, &v);
}

/* An array of non-negative integers below 2^32 into j->ids. */
static int json_ids(json *j)
{
	j->n_ids = 0;
	if (*j->p != '[')
		return -1;
	j->p++;
	ws(j);
	if (*j->p == ']') {
		j->p++;
		return 0;
	}
	for (;;) {
		ws(j);
		double v;
		if (json_number(j, &v) || v < 0 || v > 4294967295.0 || v != floor(v))
			return -1;
		if (j->n_ids == j->cap_ids) {
			size_t cap = j->cap_ids ? j->cap_ids * 2 : 256;
			uint32_t *ids = trace__realloc(j->ids, cap * sizeof(*ids));
			if (!ids)
				return -2;
			j->ids = ids;
			j->cap_ids = cap;
		}
		j->ids[j->n_ids++] = (uint32_t)v;
		ws(j);
		if (*j->p == ',') {
			j->p++;
			continue;
		}
		if (*j->p == ']') {
			j->p++;
			return 0;
		}
		return -1;
	}
}

static int count_field(double v, uint32_t lo, uint32_t *out)
{
	if (!(v >= lo && v <= TRACE_MAX_TOKENS) || v != floor(v))
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_mooncake_line(json *j, unsigned long line, trace *t, double *t0, double *prev,
			       char *err, size_t errlen)
{
	double ts = 0.0, in = 0.0, out = 0.0;
	int have_ts = 0, have_in = 0, have_out = 0, have_ids = 0;
	ws(j);
	if (*j->p != '{') {
		set_err(err, errlen, line, "expected a JSON object");
		return TRACE_EPARSE;
	}
	j->p++;
	ws(j);
	if (*j->p == '}') {
		j->p++;
	} else {
		for (;;) {
			char key[32];
			ws(j);
			if (json_string(j, key, sizeof(key))) {
				set_err(err, errlen, line, "expected a quoted key");
				return TRACE_EPARSE;
			}
			ws(j);
			if (*j->p++ != ':') {
				set_err(err, errlen, line, "expected ':' after \"%s\"", key);
				return TRACE_EPARSE;
			}
			ws(j);
			double *num = !strcmp(key, "timestamp")       ? &ts
				      : !strcmp(key, "input_length")  ? &in
				      : !strcmp(key, "output_length") ? &out
								      : NULL;
			if (num) {
				if (json_number(j, num)) {
					set_err(err, errlen, line, "\"%s\" must be a number", key);
					return TRACE_EPARSE;
				}
				have_ts |= num == &ts;
				have_in |= num == &in;
				have_out |= num == &out;
			} else if (!strcmp(key, "hash_ids")) {
				int rc = json_ids(j);
				if (rc == -2)
					return TRACE_ENOMEM;
				if (rc) {
					set_err(err, errlen, line,
						"\"hash_ids\" must be an array of integers in 0..2^32-1");
					return TRACE_EPARSE;
				}
				have_ids = 1;
			} else if (json_skip(j, 0)) {
				set_err(err, errlen, line, "bad JSON value for \"%s\"", key);
				return TRACE_EPARSE;
			}
			ws(j);
			if (*j->p == ',') {
				j->p++;
				continue;
			}
			if (*j->p == '}') {
				j->p++;
				break;
			}
			set_err(err, errlen, line, "expected ',' or '}'");
			return TRACE_EPARSE;
		}
	}
	ws(j);
	if (*j->p) {
		set_err(err, errlen, line, "text after the JSON object");
		return TRACE_EPARSE;
	}
	if (!have_ts || !have_in || !have_out) {
		set_err(err, errlen, line, "missing \"%s\"",
			!have_ts ? "timestamp" : !have_in ? "input_length" : "output_length");
		return TRACE_EPARSE;
	}
	uint32_t plen, olen;
	if (count_field(in, 1, &plen)) {
		set_err(err, errlen, line, "input_length must be an integer in 1..%u",
			TRACE_MAX_TOKENS);
		return TRACE_EPARSE;
	}
	if (count_field(out, 0, &olen)) {
		set_err(err, errlen, line, "output_length must be an integer in 0..%u",
			TRACE_MAX_TOKENS);
		return TRACE_EPARSE;
	}
	if (!(ts >= 0.0)) {
		set_err(err, errlen, line, "timestamp must be >= 0");
		return TRACE_EPARSE;
	}
	size_t want = ((size_t)plen + TRACE_HASH_BLOCK - 1) / TRACE_HASH_BLOCK;
	if (have_ids && j->n_ids != want) {
		set_err(err, errlen, line, "hash_ids has %zu ids, input_length %u needs %zu",
			j->n_ids, plen, want);
		return TRACE_EPARSE;
	}
	double us = ts * 1000.0;
	if (t->n == 0)
		*t0 = us;
	else if (us < *prev) {
		set_err(err, errlen, line, "timestamp goes back in time");
		return TRACE_EPARSE;
	}
	*prev = us;
	if (trace_push(t, us - *t0, plen, olen, have_ids ? j->ids : NULL,
		       have_ids ? (uint32_t)j->n_ids : 0))
		return TRACE_ENOMEM;
	return TRACE_OK;
}

static int parse_mooncake(line_iter *it, trace *t, char *err, size_t errlen)
{
	json j = {0};
	char *line;
	double t0 = 0.0, prev = 0.0;
	int rc = TRACE_OK;
	while ((line = lines_next(it))) {
		if (!*line)
			continue;
		j.p = line;
		rc = parse_mooncake_line(&j, it->line, t, &t0, &prev, err, errlen);
		if (rc)
			break;
	}
	trace__free(j.ids);
	return rc;
}

/* ---- DistServe ground truth ---------------------------------------------- */

enum { DS_RUN, DS_PROMPT, DS_OUTPUT, DS_ISSUE, DS_TTFT, DS_TPOT, DS_NCOLS };
static const char *const ds_names[DS_NCOLS] = {"run",   "prompt_len", "output_len",
					       "issue_time_rel_s", "ttft_ms", "tpot_ms"};

#define DS_MAX_FIELDS 32

static int ds_header(char *line, int *col, unsigned long lineno, char *err, size_t errlen)
{
	char *f[DS_MAX_FIELDS];
	int nf = split_csv(line, f, DS_MAX_FIELDS);
	if (nf > DS_MAX_FIELDS)
		nf = DS_MAX_FIELDS;
	for (int c = 0; c < DS_NCOLS; c++) {
		col[c] = -1;
		for (int i = 0; i < nf; i++)
			if (!strcmp(f[i], ds_names[c]))
				col[c] = i;
		if (col[c] < 0) {
			set_err(err, errlen, lineno, "header lacks the column '%s'", ds_names[c]);
			return TRACE_EPARSE;
		}
	}
	return nf;
}

static int parse_distserve(line_iter *it, const char *filter, trace *t, char *err, size_t errlen)
{
	char *line;
	int col[DS_NCOLS], ncols = 0;
	double prev = 0.0;
	char prev_run[64] = "";
	while ((line = lines_next(it))) {
		if (!*line)
			continue;
		if (!ncols) {
			ncols = ds_header(line, col, it->line, err, errlen);
			if (ncols < 0)
				return ncols;
			continue;
		}
		char *f[DS_MAX_FIELDS];
		int nf = split_csv(line, f, DS_MAX_FIELDS);
		if (nf != ncols) {
			set_err(err, errlen, it->line, "expected %d comma-separated fields, got %d",
				ncols, nf);
			return TRACE_EPARSE;
		}
		if (filter && strcmp(f[col[DS_RUN]], filter))
			continue;
		uint32_t plen, olen;
		double issue, ttft, tpot;
		if (parse_count(f[col[DS_PROMPT]], 1, &plen) ||
		    parse_count(f[col[DS_OUTPUT]], 0, &olen)) {
			set_err(err, errlen, it->line, "bad prompt_len or output_len");
			return TRACE_EPARSE;
		}
		if (parse_real(f[col[DS_ISSUE]], &issue) || issue < 0.0 ||
		    parse_real(f[col[DS_TTFT]], &ttft) || parse_real(f[col[DS_TPOT]], &tpot)) {
			set_err(err, errlen, it->line, "bad issue_time_rel_s, ttft_ms or tpot_ms");
			return TRACE_EPARSE;
		}
		/* Within one run, issue times must not go back. */
		int same_run = !strncmp(prev_run, f[col[DS_RUN]], sizeof(prev_run) - 1);
		if (t->n && same_run && issue * 1e6 < prev) {
			set_err(err, errlen, it->line, "issue_time_rel_s goes back in time");
			return TRACE_EPARSE;
		}
		snprintf(prev_run, sizeof(prev_run), "%s", f[col[DS_RUN]]);
		prev = issue * 1e6;
		if (trace_push(t, issue * 1e6, plen, olen, NULL, 0))
			return TRACE_ENOMEM;
		t->reqs[t->n - 1].ref_ttft_ms = ttft;
		t->reqs[t->n - 1].ref_tpot_ms = tpot;
	}
	if (!ncols) {
		set_err(err, errlen, it->line + 1, "empty file: no header");
		return TRACE_EPARSE;
	}
	return TRACE_OK;
}

int trace_distserve_runs(const char *buf, size_t len, char (*names)[32], int max)
{
	line_iter it;
	if (lines_open(&it, buf, len))
		return TRACE_ENOMEM;
	int col[DS_NCOLS], ncols = 0, n = 0;
	char *line;
	while ((line = lines_next(&it))) {
		if (!*line)
			continue;
		if (!ncols) {
			ncols = ds_header(line, col, it.line, NULL, 0);
			if (ncols < 0)
				break;
			continue;
		}
		char *f[DS_MAX_FIELDS];
		if (split_csv(line, f, DS_MAX_FIELDS) != ncols)
			continue;
		const char *run = f[col[DS_RUN]];
		int seen = 0;
		for (int i = 0; i < n; i++)
			seen |= !strncmp(names[i], run, 31);
		if (!seen && n < max)
			snprintf(names[n++], 32, "%s", run);
	}
	trace__free(it.buf);
	return ncols < 0 ? TRACE_EPARSE : n;
}

/* ---- entry points -------------------------------------------------------- */

int trace_parse(trace_format fmt, const char *buf, size_t len, const char *filter, trace *t,
		char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!t || (!buf && len))
		return TRACE_EPARSE;
	uint64_t salt = t->salt;
	memset(t, 0, sizeof(*t));
	t->salt = salt;
	line_iter it;
	if (lines_open(&it, buf ? buf : "", len))
		return TRACE_ENOMEM;
	int rc;
	switch (fmt) {
	case TRACE_AZURE:
		rc = parse_azure(&it, t, err, errlen);
		break;
	case TRACE_MOONCAKE:
		rc = parse_mooncake(&it, t, err, errlen);
		break;
	case TRACE_DISTSERVE:
		rc = parse_distserve(&it, filter, t, err, errlen);
		break;
	default:
		set_err(err, errlen, 0, "unknown trace format");
		rc = TRACE_EPARSE;
	}
	trace__free(it.buf);
	if (rc) {
		if (rc == TRACE_ENOMEM && err && errlen)
			snprintf(err, errlen, "out of memory");
		trace_free(t);
		t->salt = salt;
	}
	return rc;
}

int trace_load(trace_format fmt, const char *path, const char *filter, trace *t, char *err,
	       size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		if (err)
			snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return TRACE_EIO;
	}
	size_t cap = 1 << 20, len = 0;
	char *buf = trace__malloc(cap);
	while (buf) {
		size_t got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (len < cap)
			break;
		char *b = trace__realloc(buf, cap * 2);
		if (!b) {
			trace__free(buf);
			buf = NULL;
			break;
		}
		buf = b;
		cap *= 2;
	}
	int bad = ferror(f);
	fclose(f);
	if (!buf) {
		if (err)
			snprintf(err, errlen, "out of memory");
		return TRACE_ENOMEM;
	}
	if (bad) {
		trace__free(buf);
		if (err)
			snprintf(err, errlen, "%s: read error", path);
		return TRACE_EIO;
	}
	/* a NUL byte never appears in a text trace: name the file as binary
	 * rather than report its first line's shape */
	const char *nul = memchr(buf, 0, len < 65536 ? len : 65536);
	if (nul) {
		if (err)
			snprintf(err, errlen, "%s: a binary file (a NUL byte at offset %zu), not a "
					      "text trace",
				 path, (size_t)(nul - buf));
		trace__free(buf);
		return TRACE_EPARSE;
	}
	int rc = trace_parse(fmt, buf, len, filter, t, err, errlen);
	trace__free(buf);
	if (rc == TRACE_EPARSE && err && errlen) {
		/* name the file before the parser's "line N: ..." */
		char tmp[512];
		snprintf(tmp, sizeof(tmp), "%s", err);
		snprintf(err, errlen, "%s: %s", path, tmp);
	}
	return rc;
}

