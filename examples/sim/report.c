/*
 * report.c - bkv-sim's rows and their text outputs: the table, JSON, CSV and
 * the warnings after them (the charts are in svg.c).
 *
 * A row aggregates one policy over all seeds: every metric is the median
 * over seeds, and the speed-up is computed per seed (static makespan over
 * the policy's, same trace) before its median and quartiles are taken, as
 * seed 000 reports it.
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

static double med_u32(const sim_result *runs, int n, size_t off, double *scratch)
{
	for (int i = 0; i < n; i++) {
		uint32_t v;

		memcpy(&v, (const char *)&runs[i] + off, sizeof(v));
		scratch[i] = (double)v;
	}
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

/* Every per-run metric of m as the median over n runs (sc: [n] scratch). */
static void median_fields(sim_result *m, const sim_result *runs, int n, double *sc)
{
#define MED_D(f) m->f = med_field(runs, n, offsetof(sim_result, f), sc)
#define MED_U(f) m->f = (uint64_t)llround(med_u64(runs, n, offsetof(sim_result, f), sc))
#define MED_U32(f) m->f = (uint32_t)llround(med_u32(runs, n, offsetof(sim_result, f), sc))
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
	MED_U(state_ckpt_bytes);
	MED_U(state_hits);
	MED_U(preemptions);
	MED_U(host_hit_tokens);
	MED_U(host_demoted);
	MED_U32(slo_met);
	MED_U32(ref_slo_met);
	MED_D(link_us);
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
	MED_D(ttft_p90);
	MED_D(tpot_p90);
	MED_D(ref_ttft_p90);
	MED_D(ref_tpot_p90);
	MED_D(span_us);
	MED_U(spec_drafted);
	MED_U(spec_accepted);
	MED_U(spec_rows);
	MED_U(overlap_steps);
	MED_U(overlap_syncs);
	MED_U(overlap_wasted);
	MED_U(overlap_placeholders);
	MED_U(overlap_far_placeholders);
	MED_D(device_busy_us);
	MED_U32(adapters);
	MED_D(adapters_call_mean);
	MED_D(wait_p99_ms);
	MED_D(wait_p99_hot_ms);
	MED_D(wait_p99_cold_ms);
	MED_D(wait_max_ms);
	MED_U32(n_hot);
	MED_U32(n_cold);
	MED_U(mm_inputs);
	MED_U(mm_encodes);
	MED_D(mm_hit_rate);
	MED_D(mm_encode_us);
	MED_U(kv_lookups);
	MED_U(kv_loads);
	MED_U(kv_load_tokens);
	MED_U(kv_load_failed);
	MED_U(kv_saved);
	MED_U(kv_save_failed);
	MED_D(ext_wait_ms);
	MED_D(ext_wait_mean_ms);
	MED_D(ext_wait_max_ms);
	MED_D(ext_load_gb);
	MED_D(ext_save_gb);
	MED_U(ext_held);
	MED_U(ext_evicted);
#undef MED_D
#undef MED_U
#undef MED_U32
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
	m->host_model = runs[0].host_model;
	m->host_overhead_us = runs[0].host_overhead_us;
	m->adapter_cap = runs[0].adapter_cap;
	m->mm_cache = runs[0].mm_cache;
	m->mm_budget = runs[0].mm_budget;
	m->ext_on = runs[0].ext_on;
	m->finished = runs[0].finished;
	m->errors = runs[0].errors;
	for (int i = 0; i < n; i++) { /* the worst over seeds */
		if (runs[i].adapter_bad_calls > m->adapter_bad_calls)
			m->adapter_bad_calls = runs[i].adapter_bad_calls;
		if (runs[i].adapters_call_max > m->adapters_call_max)
			m->adapters_call_max = runs[i].adapters_call_max;
		if (runs[i].mm_bad > m->mm_bad)
			m->mm_bad = runs[i].mm_bad;
		if (runs[i].mm_step_cost_max > m->mm_step_cost_max)
			m->mm_step_cost_max = runs[i].mm_step_cost_max;
		if (runs[i].mm_held_max > m->mm_held_max)
			m->mm_held_max = runs[i].mm_held_max;
		if (runs[i].ext_bad > m->ext_bad)
			m->ext_bad = runs[i].ext_bad;
	}
	for (int i = 1; i < n; i++) {
		if (runs[i].finished < m->finished)
			m->finished = runs[i].finished;
		if (runs[i].errors > m->errors)
			m->errors = runs[i].errors;
	}
	median_fields(m, runs, n, sc);
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

static void report_json(FILE *out, const sim_row *rows, int n, int roofline)
{
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
		if (r->host_hit_tokens || r->host_demoted || r->link_us > 0.0)
			fprintf(out, ", \"host_hit_tokens\": %llu, \"host_demoted\": %llu, "
				     "\"link_us\": %.10g",
				(unsigned long long)r->host_hit_tokens,
				(unsigned long long)r->host_demoted, r->link_us);
		if (r->spec_drafted)
			fprintf(out, ", \"spec_rows\": %llu, \"spec_drafted\": %llu, "
				     "\"spec_accepted\": %llu",
				(unsigned long long)r->spec_rows,
				(unsigned long long)r->spec_drafted,
				(unsigned long long)r->spec_accepted);
		if (r->overlap_steps || r->overlap_syncs)
			fprintf(out, ", \"overlap_steps\": %llu, \"overlap_syncs\": %llu",
				(unsigned long long)r->overlap_steps,
				(unsigned long long)r->overlap_syncs);
		if (r->overlap_far_placeholders) /* depth 2 or more */
			fprintf(out, ", \"overlap_placeholders\": %llu, "
				     "\"overlap_far_placeholders\": %llu",
				(unsigned long long)r->overlap_placeholders,
				(unsigned long long)r->overlap_far_placeholders);
		if (r->adapter_cap)
			fprintf(out, ", \"adapters\": %u, \"max_adapters\": %u, "
				     "\"adapters_per_call_mean\": %.10g, \"adapters_per_call_max\": %u, "
				     "\"adapter_bad_calls\": %llu, \"wait_ms\": {\"p99\": %.10g, "
				     "\"p99_hot\": %.10g, \"p99_cold\": %.10g, \"max\": %.10g}, "
				     "\"hot_requests\": %u, \"cold_requests\": %u",
				r->adapters, r->adapter_cap, r->adapters_call_mean,
				r->adapters_call_max, (unsigned long long)r->adapter_bad_calls,
				r->wait_p99_ms, r->wait_p99_hot_ms, r->wait_p99_cold_ms,
				r->wait_max_ms, r->n_hot, r->n_cold);
		if (r->mm_cache)
			fprintf(out, ", \"mm\": {\"inputs\": %llu, \"encodes\": %llu, \"hit_rate\": "
				     "%.10g, \"encode_ms\": %.10g, \"encoder_cache\": %u, "
				     "\"encoder_budget\": %u, \"step_cost_max\": %llu, "
				     "\"held_max\": %llu, \"bad\": %llu}",
				(unsigned long long)r->mm_inputs, (unsigned long long)r->mm_encodes,
				r->mm_hit_rate, r->mm_encode_us / 1000.0, r->mm_cache, r->mm_budget,
				(unsigned long long)r->mm_step_cost_max,
				(unsigned long long)r->mm_held_max, (unsigned long long)r->mm_bad);
		if (r->ext_on)
			fprintf(out, ", \"ext\": {\"lookups\": %llu, \"loads\": %llu, "
				     "\"load_tokens\": %llu, \"load_failed\": %llu, \"saved\": %llu, "
				     "\"save_failed\": %llu, \"wait_ms\": %.10g, \"wait_mean_ms\": %.10g, "
				     "\"wait_max_ms\": %.10g, \"load_gb\": %.10g, \"save_gb\": %.10g, "
				     "\"held\": %llu, \"evicted\": %llu, \"bad\": %llu}",
				(unsigned long long)r->kv_lookups, (unsigned long long)r->kv_loads,
				(unsigned long long)r->kv_load_tokens,
				(unsigned long long)r->kv_load_failed, (unsigned long long)r->kv_saved,
				(unsigned long long)r->kv_save_failed, r->ext_wait_ms,
				r->ext_wait_mean_ms, r->ext_wait_max_ms, r->ext_load_gb, r->ext_save_gb,
				(unsigned long long)r->ext_held, (unsigned long long)r->ext_evicted,
				(unsigned long long)r->ext_bad);
		if (r->state_ckpt_bytes || r->state_hits)
			fprintf(out, ", \"state_ckpt_bytes\": %llu, \"state_hits\": %llu",
				(unsigned long long)r->state_ckpt_bytes,
				(unsigned long long)r->state_hits);
		if (r->ref_ttft_mean >= 0)
			fprintf(out,
				", \"ref_ttft_mean_ms\": %.10g, \"ref_tpot_mean_ms\": %.10g"
				", \"ttft_p90_ms\": %.10g, \"tpot_p90_ms\": %.10g"
				", \"ref_ttft_p90_ms\": %.10g, \"ref_tpot_p90_ms\": %.10g",
				r->ref_ttft_mean, r->ref_tpot_mean, r->ttft_p90, r->tpot_p90,
				r->ref_ttft_p90, r->ref_tpot_p90);
		if (r->ref_ttft_mean >= 0 && (r->slo_met || r->ref_slo_met))
			fprintf(out, ", \"slo_met\": %u, \"ref_slo_met\": %u", r->slo_met,
				r->ref_slo_met);
		if (rows[i].has_goodput)
			fprintf(out, ", \"goodput_rps\": %.10g, \"goodput_capped\": %d",
				rows[i].goodput_rps, rows[i].goodput_capped);
		fprintf(out, ", \"prediction_error\": %.10g, \"wall_s\": %.10g}%s\n",
			r->pred_err, r->wall_s, i + 1 < n ? "," : "");
	}
	fprintf(out, "]\n");
}

static void report_csv(FILE *out, const sim_row *rows, int n, int roofline)
{
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
}

/* The table's line per row of a run with adapters (--adapters). */
static void report_adapters(FILE *out, const sim_row *rows, int n)
{
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		if (!r->adapter_cap)
			continue;
		fprintf(out,
			"%-14s adapters: %u used, cap %u; per call mean %.2f max %u; queue wait "
			"p99 %.2f ms, hot quarter %.2f (%u req), cold half %.2f (%u req); max "
			"%.2f ms%s\n",
			r->label, r->adapters, r->adapter_cap, r->adapters_call_mean,
			r->adapters_call_max, r->wait_p99_ms, r->wait_p99_hot_ms, r->n_hot,
			r->wait_p99_cold_ms, r->n_cold, r->wait_max_ms,
			r->adapter_bad_calls ? " CALLS OVER THE CAP" : "");
	}
}

/* The table's line per row of a run with images (--mm-images). */
static void report_mm(FILE *out, const sim_row *rows, int n)
{
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		if (!r->mm_cache)
			continue;
		fprintf(out,
			"%-14s images: %llu in requests, %llu encoded, hit rate %.1f%%; encoder "
			"%.1f ms; cache %u tokens (most held %llu); budget %u (most per step "
			"%llu)%s\n",
			r->label, (unsigned long long)r->mm_inputs, (unsigned long long)r->mm_encodes,
			100.0 * r->mm_hit_rate, r->mm_encode_us / 1000.0, r->mm_cache,
			(unsigned long long)r->mm_held_max, r->mm_budget,
			(unsigned long long)r->mm_step_cost_max,
			r->mm_bad ? " ENCODER CONTRACT BROKEN" : "");
	}
}

/* The table's line per row of a run with an external tier (--ext-tier). */
static void report_ext(FILE *out, const sim_row *rows, int n)
{
	for (int i = 0; i < n; i++) {
		const sim_result *r = &rows[i].med;
		if (!r->ext_on)
			continue;
		fprintf(out,
			"%-14s ext tier: %llu loads, %llu tokens loaded, %llu blocks failed; "
			"%llu blocks saved (%llu failed); KV wait %.1f s (mean %.2f ms, max %.1f "
			"ms); %.2f GB in, %.2f GB out; held %llu, evicted %llu%s\n",
			r->label, (unsigned long long)r->kv_loads,
			(unsigned long long)r->kv_load_tokens, (unsigned long long)r->kv_load_failed,
			(unsigned long long)r->kv_saved, (unsigned long long)r->kv_save_failed,
			r->ext_wait_ms / 1000.0, r->ext_wait_mean_ms, r->ext_wait_max_ms,
			r->ext_load_gb, r->ext_save_gb, (unsigned long long)r->ext_held,
			(unsigned long long)r->ext_evicted,
			r->ext_bad ? " TRANSFERS REFUSED" : "");
	}
}

/* The table; with a title, the title above it and the legend below. */
static void report_table(FILE *out, const sim_row *rows, int n, int roofline,
			 const char *title)
{
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
	for (int i = 0; i < n; i++) { /* --host-overhead-us, --overlap */
		const sim_result *r = &rows[i].med;
		double dev = r->overlap_steps || r->device_busy_us > 0.0 ? r->device_busy_us
							 : r->prefill_us + r->decode_us;
		if (!r->host_model)
			continue;
		fprintf(out,
			"%-14s host %u us/step: %llu steps, device %.3f ms/step, step %.3f ms "
			"(makespan/steps); %llu overlapped, %llu launches declined, %llu tokens "
			"computed and discarded (%.2f%% of output)\n",
			r->label, r->host_overhead_us, (unsigned long long)r->steps,
			r->steps ? dev / 1000.0 / (double)r->steps : 0.0,
			r->steps ? r->makespan_us / 1000.0 / (double)r->steps : 0.0,
			(unsigned long long)r->overlap_steps, (unsigned long long)r->overlap_syncs,
			(unsigned long long)r->overlap_wasted,
			r->out_tokens ? 100.0 * (double)r->overlap_wasted / (double)r->out_tokens : 0.0);
	}
	report_adapters(out, rows, n);
	report_mm(out, rows, n);
	report_ext(out, rows, n);
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
		if (n && rows[0].med.mm_cache)
			fputs("images: hit rate = 1 - encoder runs / images submitted (outputs still\n"
			      "  cached, or the span's KV in the prefix cache); encoder time = cost x\n"
			      "  --mm-encode-us, before the call computes; budget 0 = none.\n",
			      out);
		if (n && rows[0].med.ext_on)
			fputs("ext tier: loads = load transfers (tokens loaded instead of computed;\n"
			      "  failed = blocks the store no longer held, recomputed); saved = blocks\n"
			      "  the library handed to save and the store took; KV wait = the sum over\n"
			      "  loads of the time from the load to its completion (a request waits\n"
			      "  through it); held / evicted = the store's entries at the end / evicted\n"
			      "  by its capacity.\n",
			      out);
		if (n && rows[0].med.adapter_cap)
			fputs("adapters: per call = distinct adapters of a host call; queue wait =\n"
			      "  arrival to the start of the first host call carrying the request; hot\n"
			      "  quarter = requests of adapters of popularity ranks 1..N/4, cold half =\n"
			      "  ranks > N/2 (p99 each).\n",
			      out);
	}
}

void sim_report(FILE *out, sim_format fmt, const sim_row *rows, int n, int roofline,
		const char *title)
{
	if (fmt == SIM_JSON)
		report_json(out, rows, n, roofline);
	else if (fmt == SIM_CSV)
		report_csv(out, rows, n, roofline);
	else
		report_table(out, rows, n, roofline, title);
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
