/*
 * metrics.c - the scheduler's and its pool's counters in the Prometheus text
 * exposition format (version 0.0.4), and the step-duration histogram behind
 * bkv_step_duration_seconds.
 *
 * The scheduler keeps the histogram itself (sched/step.c: each step's
 * duration on its clock, one counter per bucket, no allocation); this file
 * only reads it, with the other counters the scheduler and pool expose.
 * Buckets are kept per bucket (not cumulative) and summed when written, as
 * Prometheus wants `le` buckets cumulative.
 *
 * bkv_sched_metrics_prometheus writes like snprintf: into at most cap bytes,
 * NUL-terminated, returning the length the whole text needs. Names follow the
 * Prometheus conventions (base units - seconds, tokens, blocks - in the name;
 * counters end in _total; ratios 0..1 end in _ratio), with vLLM's set of
 * serving metrics as the model for what to expose. Each metric gets its HELP
 * and TYPE lines first.
 */
#include "sched/sched.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The bucket bounds as written (sched/step.c holds them in microseconds). */
static const char *const bound_txt[BKV__STEP_BUCKETS - 1] = {
	"0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
	"0.25", "0.5", "1", "2.5", "5", "10",
};

/* snprintf into a growing text that may outgrow the caller's buffer. */
typedef struct out {
	char *buf;  /* the caller's buffer, or NULL */
	size_t cap; /* its size in bytes */
	size_t len; /* bytes the text needs so far (not counting the NUL) */
} out;

#if defined(__GNUC__)
#define PRINTF_LIKE __attribute__((format(printf, 2, 3)))
#else
#define PRINTF_LIKE
#endif

PRINTF_LIKE static void put(out *o, const char *fmt, ...)
{
	char *dst = NULL;
	size_t room = 0;
	va_list ap;
	int n;

	if (o->buf && o->len < o->cap) {
		dst = o->buf + o->len;
		room = o->cap - o->len;
	}
	va_start(ap, fmt);
	n = vsnprintf(dst, room, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->len += (size_t)n;
}

static void head(out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(out *o, const char *name, const char *help, uint64_t v)
{
	head(o, name, "counter", help);
	put(o, "%s %" PRIu64 "\n", name, v);
}

static void gauge(out *o, const char *name, const char *help, uint64_t v)
{
	head(o, name, "gauge", help);
	put(o, "%s %" PRIu64 "\n", name, v);
}

static void gauge_f(out *o, const char *name, const char *help, double v)
{
	head(o, name, "gauge", help);
	put(o, "%s %.9g\n", name, v);
}

/* Requests by state, and their lifetime counts. */
static void put_requests(out *o, const bkv_sched_stats *st)
{
	gauge(o, "bkv_requests_waiting", "Requests queued, not started.", st->waiting);
	gauge(o, "bkv_requests_running", "Requests holding batch slots.", st->running);
	gauge(o, "bkv_requests_swapped", "Requests preempted to the host KV tier.",
	      st->swapped);
	counter(o, "bkv_requests_submitted_total", "Requests accepted by bkv_submit.",
		st->submitted);
	counter(o, "bkv_requests_finished_total", "Requests ended, any reason.", st->finished);
	counter(o, "bkv_requests_aborted_total", "Requests ended by bkv_abort.", st->aborted);
}

/* Tokens computed, and the prefix cache's share of the prompt tokens. */
static void put_tokens(out *o, const bkv_sched_stats *st)
{
	uint64_t prompt_queries = st->prefill_tokens + st->hit_tokens;

	counter(o, "bkv_prompt_tokens_total",
		"Prompt tokens computed by prefill (prefix-cache hits excluded).",
		st->prefill_tokens);
	counter(o, "bkv_generation_tokens_total", "Tokens computed by decode rows (a request's first token comes from its prefill).",
		st->decode_tokens);
	counter(o, "bkv_prefix_cache_hit_tokens_total",
		"Prompt tokens served from the prefix cache.", st->hit_tokens);
	counter(o, "bkv_prefix_cache_query_tokens_total",
		"Prompt tokens looked up in the prefix cache (computed plus hits).",
		prompt_queries);
	gauge_f(o, "bkv_prefix_cache_hit_ratio",
		"Prefix-cache hit tokens over query tokens since start.",
		prompt_queries ? (double)st->hit_tokens / (double)prompt_queries : 0.0);
}

/* Preemptions by mode, steps, and the host calls they made. */
static void put_steps(out *o, const bkv_sched_stats *st)
{
	head(o, "bkv_preemptions_total", "counter", "Requests preempted, by mode.");
	put(o, "bkv_preemptions_total{mode=\"recompute\"} %" PRIu64 "\n",
	    st->preemptions - st->swaps);
	put(o, "bkv_preemptions_total{mode=\"swap\"} %" PRIu64 "\n", st->swaps);
	counter(o, "bkv_steps_total", "Successful bkv_step iterations.", st->steps);
	counter(o, "bkv_failed_steps_total", "Steps rolled back on a host failure.",
		st->failed_steps);
	counter(o, "bkv_prefill_calls_total", "Host calls carrying prefill.",
		st->prefill_calls);
	counter(o, "bkv_decode_calls_total", "Host decode calls (split hosts).",
		st->decode_calls);
	head(o, "bkv_host_busy_seconds_total", "counter", "Measured time in host calls.");
	put(o, "bkv_host_busy_seconds_total %.9g\n", st->busy_us / 1e6);
	head(o, "bkv_overlap_spec_fallbacks_total", "counter",
	     "Overlapped scheduling with speculation: rows not planned (wait), rows planned "
	     "without drafts on a placeholder (undrafted), launches left empty (idle).");
	put(o, "bkv_overlap_spec_fallbacks_total{kind=\"wait\"} %" PRIu64 "\n",
	    st->overlap_spec_waits);
	put(o, "bkv_overlap_spec_fallbacks_total{kind=\"undrafted\"} %" PRIu64 "\n",
	    st->overlap_spec_undrafted);
	put(o, "bkv_overlap_spec_fallbacks_total{kind=\"idle\"} %" PRIu64 "\n",
	    st->overlap_spec_idle);
}

/* Overlapped steps and speculation, with every fallback a step took. */
static void put_features(out *o, const bkv_sched_stats *st)
{
	counter(o, "bkv_overlap_steps_total",
		"Steps planned while another was in flight (bkv_step_launch).",
		st->overlap_steps);
	counter(o, "bkv_overlap_wasted_tokens_total",
		"Tokens computed for requests that had ended in the step before.",
		st->overlap_wasted_tokens);
	counter(o, "bkv_adapter_passes_total",
		"Times admission set a request aside: its adapter had no room.",
		st->adapter_passes);
	counter(o, "bkv_encoder_lookups_total",
		"Encoder inputs met by a chunk that its request did not hold.",
		st->encoder_lookups);
	counter(o, "bkv_encoder_hits_total",
		"Encoder inputs found cached or being encoded.", st->encoder_hits);
	counter(o, "bkv_encoder_runs_total", "Encoder inputs sent to the host to encode.",
		st->encoder_runs);
	counter(o, "bkv_encoder_evictions_total", "Encoder inputs evicted from its cache.",
		st->encoder_evictions);
	counter(o, "bkv_spec_draft_tokens_total", "Draft tokens verified.", st->spec_drafted);
	counter(o, "bkv_spec_accepted_tokens_total", "Draft tokens accepted.",
		st->spec_accepted);
	head(o, "bkv_fallbacks_total", "counter",
	     "Automatic fallbacks: launches that waited for the step in flight, "
	     "decode rows whose drafts were dropped under pressure.");
	put(o, "bkv_fallbacks_total{kind=\"overlap_sync\"} %" PRIu64 "\n", st->overlap_syncs);
	put(o, "bkv_fallbacks_total{kind=\"spec_skipped_row\"} %" PRIu64 "\n",
	    st->spec_skipped_rows);
}

/* A KV connector's lookups, loads and saves. */
static void put_connector(out *o, const bkv_sched_stats *st)
{
	gauge(o, "bkv_kv_connector_waiting_requests",
	      "Requests waiting for external KV (a lookup answered later, a load in flight).",
	      st->kv_waiting);
	gauge(o, "bkv_kv_connector_held_blocks",
	      "Device blocks held for KV connector saves in flight.", st->kv_save_held);
	counter(o, "bkv_kv_connector_lookups_total", "KV connector lookups (errors included).",
		st->kv_lookups);
	counter(o, "bkv_kv_connector_lookup_errors_total", "KV connector lookups that failed.",
		st->kv_lookup_errors);
	counter(o, "bkv_kv_connector_loads_total", "KV connector loads started.", st->kv_loads);
	counter(o, "bkv_kv_connector_loaded_tokens_total",
		"Prompt tokens loaded from the KV connector instead of computed.",
		st->kv_load_tokens);
	counter(o, "bkv_kv_connector_load_failed_blocks_total",
		"Blocks whose load failed (recomputed).", st->kv_load_failed);
	counter(o, "bkv_kv_connector_saved_blocks_total", "Blocks saved to the KV connector.",
		st->kv_saved);
	counter(o, "bkv_kv_connector_save_failed_blocks_total",
		"Blocks whose save to the KV connector failed.", st->kv_save_failed);
}

/* The pool's blocks by state, evictions and KV events. */
static void put_pool(out *o, const bkv_pool_stats *ps)
{
	gauge_f(o, "bkv_kv_cache_usage_ratio",
		"Device KV blocks in use (not free, not reclaimable cache) over all.",
		ps->device_blocks ? (double)ps->nr_used / (double)ps->device_blocks : 0.0);
	head(o, "bkv_kv_blocks", "gauge", "Device KV blocks by state.");
	put(o, "bkv_kv_blocks{state=\"free\"} %" PRIu32 "\n", ps->nr_free);
	put(o, "bkv_kv_blocks{state=\"used\"} %" PRIu32 "\n", ps->nr_used);
	put(o, "bkv_kv_blocks{state=\"cached\"} %" PRIu32 "\n", ps->nr_cached);
	head(o, "bkv_kv_group_blocks", "gauge",
	     "Device KV blocks (frames) by KV group and state; groups share the free ones.");
	for (uint32_t g = 0; g < ps->n_groups && g < BKV_MAX_GROUPS; g++) {
		put(o, "bkv_kv_group_blocks{group=\"%" PRIu32 "\",state=\"used\"} %" PRIu32 "\n", g,
		    ps->group_used[g]);
		put(o, "bkv_kv_group_blocks{group=\"%" PRIu32 "\",state=\"cached\"} %" PRIu32 "\n",
		    g, ps->group_cached[g]);
	}
	head(o, "bkv_kv_host_blocks", "gauge", "Host-tier (swap) KV blocks by state.");
	put(o, "bkv_kv_host_blocks{state=\"free\"} %" PRIu32 "\n", ps->host_free);
	put(o, "bkv_kv_host_blocks{state=\"used\"} %" PRIu32 "\n", ps->host_used);
	counter(o, "bkv_prefix_cache_evictions_total", "Cached KV blocks reclaimed.",
		ps->evictions);
	counter(o, "bkv_kv_events_total", "KV events emitted for routers.", ps->events);
	counter(o, "bkv_kv_events_dropped_total", "KV events dropped on a full ring.",
		ps->events_dropped);
}

/* The scheduler's step-duration histogram, its buckets summed into
 * Prometheus's cumulative le buckets. */
static void put_step_histogram(out *o, const bkv_sched *s)
{
	uint64_t cum = 0;
	uint32_t i;

	head(o, "bkv_step_duration_seconds", "histogram",
	     "Wall time of one bkv_step on the scheduler's clock.");
	for (i = 0; i < BKV__STEP_BUCKETS; i++) {
		cum += s->obs.step_hist[i];
		if (i < BKV__STEP_BUCKETS - 1)
			put(o, "bkv_step_duration_seconds_bucket{le=\"%s\"} %" PRIu64 "\n",
			    bound_txt[i], cum);
		else
			put(o, "bkv_step_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n",
			    cum);
	}
	put(o, "bkv_step_duration_seconds_sum %.9g\n", s->obs.step_sum_s);
	put(o, "bkv_step_duration_seconds_count %" PRIu64 "\n", cum);
}

size_t bkv_sched_metrics_prometheus(const bkv_sched *s, char *buf, size_t cap)
{
	bkv_sched_stats st;
	bkv_pool_stats ps;
	out o = {buf, buf ? cap : 0, 0};

	if (o.cap)
		buf[0] = '\0';
	if (!s)
		return 0;
	st.size = sizeof st;
	bkv_sched_stats_get(s, &st);
	ps.size = sizeof ps;
	bkv_pool_stats_get(s->pool, &ps);
	put_requests(&o, &st);
	put_tokens(&o, &st);
	put_steps(&o, &st);
	put_features(&o, &st);
	put_connector(&o, &st);
	put_pool(&o, &ps);
	put_step_histogram(&o, s);
	return o.len;
}
