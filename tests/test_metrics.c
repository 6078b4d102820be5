/*
 * test_metrics.c - bkv_sched_metrics_prometheus: the text parses back as the
 * Prometheus exposition format (HELP and TYPE before each family, valid names
 * and values, cumulative histogram buckets), values match the scheduler's
 * counters, counters never decrease across steps, the step-duration histogram
 * counts steps in the right buckets (a fake clock), and the snprintf contract.
 */
#include "internal.h"

#include <criterion/criterion.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A host whose forward takes cost_us on a fake clock and samples token 5. */
typedef struct mhost {
	uint64_t now;     /* fake clock, us */
	uint64_t cost_us; /* what each forward advances it by */
} mhost;

static int mh_forward(void *h, const bkv_batch *b, int32_t *next)
{
	mhost *m = h;
	uint32_t r;

	m->now += m->cost_us;
	for (r = 0; r < b->n_rows; r++)
		if (b->row_sample[r])
			next[r] = 5;
	return 0;
}

static uint64_t mh_now(void *h)
{
	return ((mhost *)h)->now;
}

static bkv_sched *make_sched(mhost *m, bkv_pool **pool)
{
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_sched *s = NULL;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, pool), BKV_OK);
	bkv_sched_config_init(&sc);
	sc.admit_group = 1;
	memset(&ops, 0, sizeof ops);
	ops.forward = mh_forward;
	ops.now_us = mh_now;
	cr_assert_eq(bkv_sched_create(&sc, *pool, &ops, m, NULL, &s), BKV_OK);
	return s;
}

static void submit(bkv_sched *s, uint32_t prompt_len, uint32_t max_new)
{
	int32_t p[64];
	bkv_request rq;
	uint32_t i;

	for (i = 0; i < prompt_len; i++)
		p[i] = (int32_t)(i + 10);
	bkv_request_init(&rq);
	rq.prompt = p;
	rq.prompt_len = prompt_len;
	rq.max_new_tokens = max_new;
	cr_assert_eq(bkv_submit(s, &rq, NULL), BKV_OK);
}

/* One parsed sample. */
typedef struct sample {
	char name[64];    /* metric name, labels stripped */
	char labels[64];  /* the text inside {...}, or "" */
	double value;
} sample;

typedef struct parsed {
	sample v[128];
	uint32_t n;
} parsed;

static int valid_name(const char *s, size_t n)
{
	size_t i;

	if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
		return 0;
	for (i = 1; i < n; i++)
		if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
			return 0;
	return 1;
}

/* Does sample name belong to family fam of type type? */
static int in_family(const char *name, const char *fam, const char *type)
{
	size_t n = strlen(fam);

	if (strcmp(name, fam) == 0)
		return strcmp(type, "histogram") != 0;
	if (strcmp(type, "histogram") != 0 || strncmp(name, fam, n) != 0)
		return 0;
	return strcmp(name + n, "_bucket") == 0 || strcmp(name + n, "_sum") == 0 ||
	       strcmp(name + n, "_count") == 0;
}

/* Parse the exposition text line by line, asserting its grammar. */
static void parse(const char *text, parsed *out)
{
	char fam[64] = "", type[16] = "", help_for[64] = "";
	const char *line = text;

	out->n = 0;
	cr_assert(strlen(text) > 0 && text[strlen(text) - 1] == '\n', "ends with a newline");
	while (*line) {
		const char *eol = strchr(line, '\n');
		size_t len = (size_t)(eol - line);
		char buf[256];

		cr_assert_not_null(eol);
		cr_assert_lt(len, sizeof buf);
		memcpy(buf, line, len);
		buf[len] = '\0';
		if (strncmp(buf, "# HELP ", 7) == 0) {
			char *sp = strchr(buf + 7, ' ');

			cr_assert_not_null(sp, "HELP without text: %s", buf);
			cr_assert(valid_name(buf + 7, (size_t)(sp - buf - 7)), "%s", buf);
			cr_assert_gt(strlen(sp + 1), 0);
			memcpy(help_for, buf + 7, (size_t)(sp - buf - 7));
			help_for[sp - buf - 7] = '\0';
		} else if (strncmp(buf, "# TYPE ", 7) == 0) {
			char *sp = strchr(buf + 7, ' ');

			cr_assert_not_null(sp);
			*sp = '\0';
			cr_assert_str_eq(buf + 7, help_for, "TYPE %s without its HELP", buf + 7);
			cr_assert(strcmp(sp + 1, "counter") == 0 || strcmp(sp + 1, "gauge") == 0 ||
					  strcmp(sp + 1, "histogram") == 0,
				  "type %s", sp + 1);
			strcpy(fam, buf + 7);
			strcpy(type, sp + 1);
			if (strcmp(type, "counter") == 0)
				cr_assert(strlen(fam) > 6 && strcmp(fam + strlen(fam) - 6, "_total") == 0,
					  "counter %s does not end in _total", fam);
		} else {
			sample *sm = &out->v[out->n];
			char *end, *val = strrchr(buf, ' ');
			char *brace = strchr(buf, '{');
			size_t nlen;

			cr_assert_neq(buf[0], '#', "unknown comment: %s", buf);
			cr_assert_not_null(val, "%s", buf);
			*val++ = '\0';
			nlen = brace ? (size_t)(brace - buf) : strlen(buf);
			cr_assert(valid_name(buf, nlen), "bad name in %s", buf);
			cr_assert_lt(nlen, sizeof sm->name);
			memcpy(sm->name, buf, nlen);
			sm->name[nlen] = '\0';
			sm->labels[0] = '\0';
			if (brace) {
				size_t l = strlen(brace);

				cr_assert_eq(brace[l - 1], '}', "%s", buf);
				cr_assert_lt(l - 2, sizeof sm->labels);
				memcpy(sm->labels, brace + 1, l - 2);
				sm->labels[l - 2] = '\0';
				cr_assert_not_null(strstr(sm->labels, "=\""), "%s", sm->labels);
			}
			sm->value = strtod(val, &end);
			cr_assert(*val && *end == '\0', "value %s of %s", val, sm->name);
			cr_assert(fam[0] && in_family(sm->name, fam, type),
				  "sample %s outside its family %s", sm->name, fam);
			cr_assert_lt(out->n + 1, 128u);
			out->n++;
		}
		line = eol + 1;
	}
}

static double get(const parsed *p, const char *name, const char *labels)
{
	uint32_t i;

	for (i = 0; i < p->n; i++)
		if (strcmp(p->v[i].name, name) == 0 && strcmp(p->v[i].labels, labels) == 0)
			return p->v[i].value;
	cr_assert_fail("no sample %s{%s}", name, labels);
	return 0;
}

static char *metrics(const bkv_sched *s)
{
	size_t n = bkv_sched_metrics_prometheus(s, NULL, 0);
	char *t = malloc(n + 1);

	cr_assert_not_null(t);
	cr_assert_eq(bkv_sched_metrics_prometheus(s, t, n + 1), n);
	cr_assert_eq(strlen(t), n);
	return t;
}

Test(metrics, text_parses_back_and_matches_the_counters)
{
	mhost m = {1000, 3000};
	bkv_pool *pool;
	bkv_sched *s = make_sched(&m, &pool);
	bkv_sched_stats st;
	parsed p;
	char *t;
	uint32_t i;

	submit(s, 8, 3);
	for (i = 0; i < 5; i++)
		cr_assert_eq(bkv_step(s, NULL), BKV_OK);
	submit(s, 8, 2); /* after the first finished: its prompt blocks hit */
	submit(s, 5, 1);
	for (i = 0; i < 5; i++)
		cr_assert_eq(bkv_step(s, NULL), BKV_OK);
	st.size = sizeof st;
	bkv_sched_stats_get(s, &st);
	t = metrics(s);
	parse(t, &p);
	cr_assert_eq(get(&p, "bkv_requests_submitted_total", ""), 3);
	cr_assert_eq(get(&p, "bkv_requests_finished_total", ""), 3);
	cr_assert_eq(get(&p, "bkv_requests_running", ""), 0);
	cr_assert_eq(get(&p, "bkv_requests_waiting", ""), 0);
	cr_assert_eq(get(&p, "bkv_generation_tokens_total", ""), (double)st.decode_tokens);
	cr_assert_eq(get(&p, "bkv_prompt_tokens_total", ""), (double)st.prefill_tokens);
	cr_assert_eq(get(&p, "bkv_prefix_cache_hit_tokens_total", ""), (double)st.hit_tokens);
	cr_assert_gt(st.hit_tokens, 0, "the second prompt shares the first's blocks");
	cr_assert_eq(get(&p, "bkv_prefix_cache_query_tokens_total", ""),
		     (double)(st.prefill_tokens + st.hit_tokens));
	cr_assert_float_eq(get(&p, "bkv_prefix_cache_hit_ratio", ""),
			   (double)st.hit_tokens / (double)(st.prefill_tokens + st.hit_tokens),
			   1e-9);
	cr_assert_eq(get(&p, "bkv_steps_total", ""), 10);
	cr_assert_eq(get(&p, "bkv_preemptions_total", "mode=\"swap\""), 0);
	cr_assert_eq(get(&p, "bkv_kv_cache_usage_ratio", ""), 0);
	cr_assert_eq(get(&p, "bkv_kv_blocks", "state=\"free\"") +
			     get(&p, "bkv_kv_blocks", "state=\"cached\"") +
			     get(&p, "bkv_kv_blocks", "state=\"used\""),
		     64);
	/* one group: its frames are the pool's */
	cr_assert_eq(get(&p, "bkv_kv_group_blocks", "group=\"0\",state=\"used\""),
		     get(&p, "bkv_kv_blocks", "state=\"used\""));
	cr_assert_eq(get(&p, "bkv_kv_group_blocks", "group=\"0\",state=\"cached\""),
		     get(&p, "bkv_kv_blocks", "state=\"cached\""));
	cr_assert_gt(get(&p, "bkv_kv_group_blocks", "group=\"0\",state=\"cached\""), 0);
	cr_assert_float_eq(get(&p, "bkv_host_busy_seconds_total", ""), st.busy_us / 1e6, 1e-9);
	cr_assert_eq(get(&p, "bkv_fallbacks_total", "kind=\"overlap_sync\""), (double)st.overlap_syncs);
	cr_assert_eq(get(&p, "bkv_fallbacks_total", "kind=\"spec_skipped_row\""),
		     (double)st.spec_skipped_rows);
	cr_assert_eq(get(&p, "bkv_overlap_steps_total", ""), (double)st.overlap_steps);
	cr_assert_eq(get(&p, "bkv_spec_draft_tokens_total", ""), (double)st.spec_drafted);
	cr_assert_eq(get(&p, "bkv_adapter_passes_total", ""), (double)st.adapter_passes);
	cr_assert_eq(get(&p, "bkv_encoder_lookups_total", ""), (double)st.encoder_lookups);
	cr_assert_eq(get(&p, "bkv_encoder_hits_total", ""), (double)st.encoder_hits);
	cr_assert_eq(get(&p, "bkv_encoder_runs_total", ""), (double)st.encoder_runs);
	cr_assert_eq(get(&p, "bkv_encoder_evictions_total", ""), (double)st.encoder_evictions);
	/* every step so far ran one 3 ms forward, or none (0 s) */
	cr_assert_eq(get(&p, "bkv_step_duration_seconds_count", ""), 10);
	cr_assert_eq(get(&p, "bkv_step_duration_seconds_bucket", "le=\"+Inf\""), 10);
	cr_assert_eq(get(&p, "bkv_step_duration_seconds_bucket", "le=\"0.0025\""),
		     get(&p, "bkv_step_duration_seconds_bucket", "le=\"0.0005\""));
	cr_assert_eq(get(&p, "bkv_step_duration_seconds_bucket", "le=\"0.005\""), 10);
	cr_assert_float_eq(get(&p, "bkv_step_duration_seconds_sum", ""),
			   0.003 * (10 - get(&p, "bkv_step_duration_seconds_bucket",
					     "le=\"0.0005\"")),
			   1e-9);
	free(t);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

Test(metrics, histogram_buckets_are_cumulative_with_exact_bounds)
{
	static const uint64_t cost[] = {400, 500, 501, 9000, 20000000};
	static const char *const le[] = {"0.0005", "0.001", "0.01", "10", "+Inf"};
	static const double want[] = {2, 3, 4, 4, 5};
	mhost m = {0, 0};
	bkv_pool *pool;
	bkv_sched *s = make_sched(&m, &pool);
	parsed p;
	char *t;
	uint32_t i;
	double prev = 0;

	/* each request is one step: prompt + 1 token, a single forward */
	for (i = 0; i < 5; i++) {
		m.cost_us = cost[i];
		submit(s, 3, 1);
		cr_assert_eq(bkv_step(s, NULL), BKV_OK);
	}
	t = metrics(s);
	parse(t, &p);
	for (i = 0; i < 5; i++) {
		char lab[32];

		snprintf(lab, sizeof lab, "le=\"%s\"", le[i]);
		cr_assert_eq(get(&p, "bkv_step_duration_seconds_bucket", lab), want[i], "%s", lab);
	}
	for (i = 0; i < p.n; i++)
		if (strcmp(p.v[i].name, "bkv_step_duration_seconds_bucket") == 0) {
			cr_assert_geq(p.v[i].value, prev, "buckets are cumulative");
			prev = p.v[i].value;
		}
	cr_assert_float_eq(get(&p, "bkv_step_duration_seconds_sum", ""),
			   (400 + 500 + 501 + 9000 + 20000000) / 1e6, 1e-9);
	free(t);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

Test(metrics, counters_never_decrease_across_steps)
{
	mhost m = {0, 1500};
	bkv_pool *pool;
	bkv_sched *s = make_sched(&m, &pool);
	parsed prev, cur;
	char *t;
	uint32_t step, i;

	t = metrics(s);
	parse(t, &prev);
	free(t);
	for (step = 0; step < 40; step++) {
		if (step % 3 == 0)
			submit(s, 4 + step % 9, 1 + step % 5);
		cr_assert_eq(bkv_step(s, NULL), BKV_OK);
		t = metrics(s);
		parse(t, &cur);
		free(t);
		cr_assert_eq(cur.n, prev.n, "the same samples every time");
		for (i = 0; i < cur.n; i++) {
			size_t l = strlen(cur.v[i].name);
			int mono = (l > 6 && strcmp(cur.v[i].name + l - 6, "_total") == 0) ||
				   strstr(cur.v[i].name, "_bucket") || strstr(cur.v[i].name, "_count") ||
				   strstr(cur.v[i].name, "_sum");

			cr_assert_str_eq(cur.v[i].name, prev.v[i].name);
			if (mono)
				cr_assert_geq(cur.v[i].value, prev.v[i].value, "%s{%s} went down",
					      cur.v[i].name, cur.v[i].labels);
		}
		prev = cur;
	}
	cr_assert_gt(get(&prev, "bkv_generation_tokens_total", ""), 0);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

Test(metrics, writes_like_snprintf)
{
	mhost m = {0, 0};
	bkv_pool *pool;
	bkv_sched *s = make_sched(&m, &pool);
	char *full = metrics(s), small[64];
	size_t n = strlen(full);

	memset(small, 'x', sizeof small);
	cr_assert_eq(bkv_sched_metrics_prometheus(s, small, sizeof small), n);
	cr_assert_eq(strlen(small), sizeof small - 1, "truncated and NUL-terminated");
	cr_assert_eq(strncmp(small, full, sizeof small - 1), 0);
	small[0] = 'x';
	cr_assert_eq(bkv_sched_metrics_prometheus(s, small, 1), n);
	cr_assert_eq(small[0], '\0');
	cr_assert_eq(bkv_sched_metrics_prometheus(NULL, small, sizeof small), 0);
	cr_assert_eq(small[0], '\0');
	free(full);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}
