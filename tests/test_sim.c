/*
 * test_sim.c - bkv-sim's virtual host driving the real scheduler: the
 * virtual clock against hand-computed times, the scheduler's predictions
 * against the host's, determinism, the prefix cache on Mooncake-style
 * prompts, and seed 000's table (../shared/design/SEED000-MODEL.md) within
 * its tolerances, medians over all 21 seeds.
 */
#include "../examples/sim/sim.h"
#include "support/sim_check.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

static sim_config seed000_config(void)
{
	sim_config c;
	sim_config_init(&c);
	c.gen = SIM_GEN_STEPS;
	return c;
}

static void run_ok(const sim_config *c, const trace *t, sim_result *r)
{
	sim_check_run(c, t, r, "run");
}

/* One request, prompt 10, 3 tokens, split host. Step 1: prefill (samples
 * token 1) then a decode call (token 2); step 2: decode (token 3).
 * prefill = 1677 + 1.45*(101*10 + 1.3607*100)/32 = 1728.931296875 us,
 * decode d(1) = 1064 + 24.1 = 1088.1 us. */
Test(sim, virtual_clock_advances_by_the_model_time_of_each_call)
{
	trace t = {0};
	cr_assert_eq(trace_push(&t, 0.0, 10, 3, NULL, 0), TRACE_OK);
	sim_config c = seed000_config();
	c.gen = SIM_GEN_TOKENS;
	sim_result r;
	run_ok(&c, &t, &r);
	const double prefill = 1728.931296875, decode = 1088.1;
	cr_expect_eq(r.prefill_calls, 1);
	cr_expect_eq(r.decode_steps, 2);
	cr_expect_eq(r.out_tokens, 3);
	cr_expect_eq(r.decode_tokens, 2, "the first token comes from the prefill call");
	cr_expect_float_eq(r.prefill_us, prefill, 1e-6);
	cr_expect_float_eq(r.decode_us, 2 * decode, 1e-6);
	/* The clock reports whole microseconds to the scheduler; the host's
	 * own clock is exact. */
	cr_expect_float_eq(r.makespan_us, prefill + 2 * decode, 1e-6);
	cr_expect_float_eq(r.ttft_mean, prefill / 1000.0, 1e-9);
	cr_expect_float_eq(r.tpot_mean, decode / 1000.0, 1e-9);
	trace_free(&t);
}

/* Engine overhead (--call-overhead-us, --row-overhead-us, --prefill-scale):
 * the request above with C = 500 us a call, R = 30 us a row and the
 * prefill priced at half. Every call has one row: the prefill call takes
 * 0.5 x 1728.931296875 + 530 us, each decode call 1088.1 + 530 us. */
Test(sim, engine_overhead_adds_per_call_and_per_row_and_scales_prefill)
{
	trace t = {0};
	cr_assert_eq(trace_push(&t, 0.0, 10, 3, NULL, 0), TRACE_OK);
	sim_config c = seed000_config();
	c.gen = SIM_GEN_TOKENS;
	c.call_overhead_us = 500.0;
	c.row_overhead_us = 30.0;
	c.prefill_scale = 0.5;
	sim_result r;
	run_ok(&c, &t, &r);
	const double prefill = 0.5 * 1728.931296875 + 530.0, decode = 1088.1 + 530.0;
	cr_expect_eq(r.prefill_calls, 1);
	cr_expect_eq(r.decode_steps, 2);
	cr_expect_float_eq(r.prefill_us, prefill, 1e-6, "a prefill call's overhead is prefill time");
	cr_expect_float_eq(r.decode_us, 2 * decode, 1e-6);
	cr_expect_float_eq(r.makespan_us, prefill + 2 * decode, 1e-6);
	cr_expect_float_eq(r.ttft_mean, prefill / 1000.0, 1e-9);
	cr_expect_float_eq(r.tpot_mean, decode / 1000.0, 1e-9);
	/* per row: two rows decode together in one call of C + 2R */
	cr_assert_eq(trace_push(&t, 0.0, 10, 3, NULL, 0), TRACE_OK);
	c.prefix_cache = 0;
	c.prefill_scale = 0.0; /* 0 = as priced */
	run_ok(&c, &t, &r);
	cr_expect_eq(r.prefill_calls, 1);
	cr_expect_eq(r.decode_steps, 2);
	sim_result plain;
	sim_config p = c;
	p.call_overhead_us = p.row_overhead_us = 0.0;
	run_ok(&p, &t, &plain);
	cr_expect_float_eq(r.prefill_us - plain.prefill_us, 500.0 + 2 * 30.0, 1e-6);
	cr_expect_float_eq(r.decode_us - plain.decode_us, 2 * (500.0 + 2 * 30.0), 1e-6);
	trace_free(&t);
}

/* --prefill-first on the split host: B arrives 100 us into A's prefill
 * call. Without it A's step goes on with its decode call (d1) and B's
 * prefill waits for it: TTFT B = 2P + d1 - 100 us. With it B's prefill is
 * the next step and A's second token waits for it: TTFT B = 2P - 100 us,
 * and A and B decode together. Prompts of 10, no prefix cache: P =
 * 1728.931296875 us each, d1 = 1088.1 us. */
Test(sim, prefill_first_prefills_an_arrival_before_the_decode_call)
{
	trace t = {0};
	cr_assert_eq(trace_push(&t, 0.0, 10, 3, NULL, 0), TRACE_OK);
	cr_assert_eq(trace_push(&t, 100.0, 10, 2, NULL, 0), TRACE_OK);
	sim_config c = seed000_config();
	c.gen = SIM_GEN_TOKENS;
	c.prefix_cache = 0;
	c.check = 1;
	const double P = 1728.931296875, d1 = 1088.1;
	sim_result split, first;
	run_ok(&c, &t, &split);
	cr_expect_float_eq(split.ttft_mean, (P + (2 * P + d1 - 100.0)) / 2 / 1000.0, 1e-9);
	cr_expect_eq(split.decode_steps, 2);
	c.prefill_first = 1;
	run_ok(&c, &t, &first);
	cr_expect_float_eq(first.ttft_mean, (P + (2 * P - 100.0)) / 2 / 1000.0, 1e-9);
	cr_expect_eq(first.prefill_calls, 2);
	cr_expect_eq(first.decode_steps, 2, "A and B decode together, then A alone");
	cr_expect_eq(first.out_tokens, 5);
	c.mixed_host = 1; /* a mixed host ignores it */
	run_ok(&c, &t, &first);
	c.prefill_first = 0;
	run_ok(&c, &t, &split);
	cr_expect_eq(first.makespan_us, split.makespan_us);
	cr_expect_eq(first.ttft_mean, split.ttft_mean);
	trace_free(&t);
}

/* --fidelity's attainment: a request meets the targets when its TTFT and its
 * TPOT (none for a one-token request) are within them, counted for the
 * simulated run (slo_met) and for the measured latencies the trace carries
 * (ref_slo_met). Each request alone: TTFT 1.729 ms, TPOT 1.088 ms (above). */
Test(sim, attainment_counts_simulated_and_measured_requests_meeting_both_targets)
{
	trace t = {0};
	cr_assert_eq(trace_push(&t, 0.0, 10, 3, NULL, 0), TRACE_OK);
	cr_assert_eq(trace_push(&t, 1e6, 10, 3, NULL, 0), TRACE_OK);
	cr_assert_eq(trace_push(&t, 2e6, 10, 1, NULL, 0), TRACE_OK);
	t.reqs[0].ref_ttft_ms = 1.0, t.reqs[0].ref_tpot_ms = 0.5;   /* meets */
	t.reqs[1].ref_ttft_ms = 3.0, t.reqs[1].ref_tpot_ms = 0.5;   /* TTFT late */
	t.reqs[2].ref_ttft_ms = 1.0, t.reqs[2].ref_tpot_ms = 500.0; /* one token */
	sim_config c = seed000_config();
	c.gen = SIM_GEN_TOKENS;
	c.slo_ttft_ms = 2.0;
	c.slo_tpot_ms = 1.1;
	sim_result r;
	run_ok(&c, &t, &r);
	cr_expect_eq(r.slo_met, 3);
	cr_expect_eq(r.ref_slo_met, 2);
	c.slo_tpot_ms = 1.0; /* below the simulated 1.088 ms and above 0.5 */
	run_ok(&c, &t, &r);
	cr_expect_eq(r.slo_met, 1, "only the one-token request");
	cr_expect_eq(r.ref_slo_met, 2);
	c.slo_ttft_ms = 0.0; /* no targets: nothing counted */
	run_ok(&c, &t, &r);
	cr_expect_eq(r.slo_met, 0);
	cr_expect_eq(r.ref_slo_met, 0);
	trace_free(&t);
}

/* A request is sent as a client sends it: max_new_tokens is the cap (4,096
 * by default, cut to what the pool holds beside the prompt) and the host
 * samples the stop token at the trace length, so the run is the oracle's
 * (max_new_tokens = the trace length) call for call; a cap below the trace
 * length ends the request there. */
Test(sim, requests_end_by_a_stop_token_at_their_trace_length)
{
	trace t = {0};
	trace_dist p = {DIST_UNIFORM, 16, 300}, o = {DIST_UNIFORM, 1, 100};
	cr_assert_eq(trace_synthetic(&t, 200, ARRIVAL_POISSON, 40.0, &p, &o, 3), TRACE_OK);
	sim_config c = seed000_config();
	c.gen = SIM_GEN_TOKENS;
	cr_assert_eq(c.max_tokens, 4096u);
	cr_assert_eq(c.oracle, 0);
	sim_result capped, oracle, short_cap;
	run_ok(&c, &t, &capped);
	c.oracle = 1;
	run_ok(&c, &t, &oracle);
	uint64_t want = 0, want_short = 0;
	for (uint32_t i = 0; i < t.n; i++) {
		want += t.reqs[i].output_len;
		want_short += t.reqs[i].output_len < 10 ? t.reqs[i].output_len : 10;
	}
	cr_expect_eq(capped.out_tokens, want);
	cr_expect_eq(oracle.out_tokens, want);
	cr_expect_eq(capped.prefill_calls, oracle.prefill_calls);
	cr_expect_eq(capped.decode_steps, oracle.decode_steps);
	cr_expect_eq(capped.makespan_us, oracle.makespan_us, "k = 1 uses no length");
	c.oracle = 0;
	c.max_tokens = 10;
	run_ok(&c, &t, &short_cap);
	cr_expect_eq(short_cap.out_tokens, want_short, "the cap ends requests longer than it");
	trace_free(&t);
}

/* The scheduler prices the same shapes as the host (padding of static
 * batching included): its prediction equals the host's time up to the
 * whole-microsecond clock. */
Test(sim, scheduler_prediction_matches_the_virtual_host)
{
	trace t = {0};
	cr_assert_eq(trace_seed000(&t, 3), TRACE_OK);
	sim_config c = seed000_config();
	sim_result r;
	const bkv_policy pol[2] = {BKV_POLICY_STATIC, BKV_POLICY_CONTINUOUS};
	for (int i = 0; i < 2; i++) {
		c.policy = pol[i];
		c.k = 4;
		run_ok(&c, &t, &r);
		cr_expect(r.pred_err < 0.002, "policy %d: prediction off by %g", i, r.pred_err);
	}
	c.mixed_host = 1;
	c.chunked = 1;
	run_ok(&c, &t, &r);
	cr_expect(r.pred_err < 0.002, "chunked: prediction off by %g", r.pred_err);
	trace_free(&t);
}

Test(sim, runs_are_deterministic)
{
	trace t = {0};
	trace_dist p = {DIST_UNIFORM, 16, 300}, o = {DIST_UNIFORM, 1, 100};
	cr_assert_eq(trace_synthetic(&t, 300, ARRIVAL_POISSON, 40.0, &p, &o, 9), TRACE_OK);
	sim_config c = seed000_config();
	c.gen = SIM_GEN_TOKENS;
	c.k = 2;
	c.max_wait_us = 20000;
	c.kv_blocks = 60; /* tight: preemptions happen */
	sim_result a, b;
	run_ok(&c, &t, &a);
	run_ok(&c, &t, &b);
	cr_expect_eq(a.makespan_us, b.makespan_us);
	cr_expect_eq(a.prefill_calls, b.prefill_calls);
	cr_expect_eq(a.decode_steps, b.decode_steps);
	cr_expect_eq(a.preemptions, b.preemptions);
	cr_expect_eq(a.ttft_p99, b.ttft_p99);
	cr_expect_eq(a.out_tokens, b.out_tokens);
	uint64_t want = 0;
	for (uint32_t i = 0; i < t.n; i++)
		want += t.reqs[i].output_len;
	cr_expect_eq(a.out_tokens, want, "every request ends at its output length");
	cr_expect_gt(a.preemptions, 0, "the tight pool preempts");
	trace_free(&t);
}

/* Mooncake prompts: the second request repeats the first one's leading
 * 512-token block id, so once the first finished, those tokens hit. */
Test(sim, mooncake_hash_ids_hit_the_prefix_cache)
{
	const char *text =
		"{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 4, \"hash_ids\": [7, 8]}\n"
		"{\"timestamp\": 5000, \"input_length\": 700, \"output_length\": 4, \"hash_ids\": [7, 9]}\n"
		"{\"timestamp\": 9000, \"input_length\": 300, \"output_length\": 4, \"hash_ids\": [5]}\n";
	trace t = {0};
	char err[256];
	cr_assert_eq(trace_parse(TRACE_MOONCAKE, text, strlen(text), NULL, &t, err, sizeof(err)),
		     TRACE_OK, "%s", err);
	sim_config c = seed000_config();
	c.gen = SIM_GEN_TOKENS;
	sim_result r;
	run_ok(&c, &t, &r);
	cr_expect_eq(r.hit_tokens, 512);
	cr_expect_eq(r.prompt_tokens, 2000);
	cr_expect_eq(r.prefill_tokens, 2000 - 512);
	c.prefix_cache = 0;
	run_ok(&c, &t, &r);
	cr_expect_eq(r.hit_tokens, 0);
	trace_free(&t);
}

/* Seed 004 and 001: a roofline run reports utilisations in (0, 1], and a
 * decode-heavy workload is bandwidth-bound (MBU above MFU). */
Test(sim, roofline_runs_report_mfu_and_mbu)
{
	trace t = {0};
	trace_dist p = {DIST_UNIFORM, 64, 256}, o = {DIST_UNIFORM, 100, 300};
	cr_assert_eq(trace_synthetic(&t, 64, ARRIVAL_BURST, 0.0, &p, &o, 1), TRACE_OK);
	sim_config c = seed000_config();
	c.gen = SIM_GEN_TOKENS;
	c.cost_kind = SIM_COST_ROOFLINE;
	cr_assert_eq(bkv_cost_roofline_init(&c.roofline, BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16),
		     BKV_OK);
	sim_result r;
	run_ok(&c, &t, &r);
	cr_expect(r.mfu > 0.0 && r.mfu <= 1.0, "mfu %g", r.mfu);
	cr_expect(r.mbu > 0.0 && r.mbu <= 1.0, "mbu %g", r.mbu);
	cr_expect(r.mbu > r.mfu, "mfu %g mbu %g", r.mfu, r.mbu);
	trace_free(&t);
}

/* ---- seed 000 ------------------------------------------------------------ */

#define N_SEEDS 21
#define N_K 6
static const uint32_t ks[N_K] = {1, 2, 4, 8, 16, 32};
/* SEED000-MODEL.md: published prefills, decode steps, speed-up. */
static const double pub_prefills[N_K] = {144, 88, 48, 27, 15, 8};
static const double pub_decodes[N_K] = {336, 338, 348, 364, 410, 512};
static const double pub_speedup[N_K] = {1.218, 1.333, 1.350, 1.357, 1.316, 1.199};
/* ... and the reference simulator's (its "fitted" column). */
static const double fit_prefills[N_K] = {143, 86, 47, 26, 14, 8};
static const double fit_decodes[N_K] = {337, 341, 350, 369, 416, 512};
static const double fit_speedup[N_K] = {1.187, 1.292, 1.361, 1.378, 1.309, 1.177};

static sim_row rows[N_K + 1];

/* Run the whole table once: static and each k on seeds 0..20. */
static void seed000_table(void)
{
	static int done;
	if (done)
		return;
	trace traces[N_SEEDS];
	sim_result base[N_SEEDS], runs[N_SEEDS];
	for (int s = 0; s < N_SEEDS; s++)
		cr_assert_eq(trace_seed000(&traces[s], (uint64_t)s), TRACE_OK);
	sim_config c = seed000_config();
	c.policy = BKV_POLICY_STATIC;
	for (int s = 0; s < N_SEEDS; s++) {
		run_ok(&c, &traces[s], &base[s]);
		/* static batching: 8 groups of 32, 8 x 64 decode steps */
		cr_expect_eq(base[s].prefill_calls, 8, "seed %d", s);
		cr_expect_eq(base[s].decode_steps, 512, "seed %d", s);
	}
	sim_rows_from_runs(&rows[0], base, base, N_SEEDS);
	c.policy = BKV_POLICY_CONTINUOUS;
	for (int i = 0; i < N_K; i++) {
		c.k = ks[i];
		for (int s = 0; s < N_SEEDS; s++)
			run_ok(&c, &traces[s], &runs[s]);
		sim_rows_from_runs(&rows[i + 1], runs, base, N_SEEDS);
	}
	for (int s = 0; s < N_SEEDS; s++)
		trace_free(&traces[s]);
	done = 1;
}

Test(sim, seed000_table_within_published_tolerances)
{
	seed000_table();
	cr_expect(fabs(rows[0].prefill_share - 0.131) < 0.01, "static share %g",
		  rows[0].prefill_share);
	for (int i = 0; i < N_K; i++) {
		const sim_row *r = &rows[i + 1];
		double sp = r->speedup, pf = (double)r->med.prefill_calls,
		       dc = (double)r->med.decode_steps;
		cr_expect(fabs(sp - pub_speedup[i]) / pub_speedup[i] <= 0.05,
			  "k=%u: speed-up %.3f vs published %.3f", ks[i], sp, pub_speedup[i]);
		cr_expect(fabs(pf - pub_prefills[i]) / pub_prefills[i] <= 0.10,
			  "k=%u: %g prefills vs published %g", ks[i], pf, pub_prefills[i]);
		cr_expect(fabs(dc - pub_decodes[i]) / pub_decodes[i] <= 0.10,
			  "k=%u: %g decode steps vs published %g", ks[i], dc, pub_decodes[i]);
	}
}

Test(sim, seed000_speedup_is_an_inverted_u_peaking_at_k_4_to_8)
{
	seed000_table();
	int peak = 0;
	for (int i = 1; i < N_K; i++)
		if (rows[i + 1].speedup > rows[peak + 1].speedup)
			peak = i;
	cr_expect(ks[peak] == 4 || ks[peak] == 8, "peak at k=%u", ks[peak]);
	for (int i = 1; i <= peak; i++)
		cr_expect(rows[i + 1].speedup > rows[i].speedup, "rising to the peak at k=%u",
			  ks[i]);
	for (int i = peak + 1; i < N_K; i++)
		cr_expect(rows[i + 1].speedup < rows[i].speedup, "falling after the peak at k=%u",
			  ks[i]);
	cr_expect(rows[1].wins >= 19, "k=1 beats static on %d of 21 seeds", rows[1].wins);
}

/* Our seed-000 traces are the reference simulator's (CPython's MT19937 with
 * the same draws), so the table equals its fitted column. */
Test(sim, seed000_table_equals_the_reference_simulator)
{
	seed000_table();
	for (int i = 0; i < N_K; i++) {
		const sim_row *r = &rows[i + 1];
		cr_expect_eq((double)r->med.prefill_calls, fit_prefills[i], "k=%u", ks[i]);
		cr_expect_eq((double)r->med.decode_steps, fit_decodes[i], "k=%u", ks[i]);
		cr_expect(fabs(r->speedup - fit_speedup[i]) < 0.0015, "k=%u: %.4f vs %.3f", ks[i],
			  r->speedup, fit_speedup[i]);
	}
}

/* Chunked prefill on a mixed-batch host (budget 512): about 1.63x the
 * split-host static baseline (SEED000-MODEL.md). */
Test(sim, seed000_chunked_prefill_reaches_1_6x_static)
{
	sim_config c = seed000_config();
	c.mixed_host = 1;
	c.chunked = 1;
	c.budget = 512;
	double sp[N_SEEDS];
	for (int s = 0; s < N_SEEDS; s++) {
		trace t;
		sim_result st, ch;
		cr_assert_eq(trace_seed000(&t, (uint64_t)s), TRACE_OK);
		sim_config sc = seed000_config();
		sc.policy = BKV_POLICY_STATIC;
		run_ok(&sc, &t, &st);
		run_ok(&c, &t, &ch);
		sp[s] = st.makespan_us / ch.makespan_us;
		trace_free(&t);
	}
	double med = sim_median(sp, N_SEEDS);
	cr_expect(med > 1.60 && med < 1.66, "chunked speed-up %.3f", med);
}

/* A scheduler given no model but a calibrated one learning from scratch
 * (observe) predicts the host's step times within 2% on average once a few
 * hundred steps have passed (the host runs on seed 000's polynomial). */
Test(sim, calibrated_model_learns_the_host_through_the_scheduler)
{
	trace t = {0};
	cr_assert_eq(trace_seed000(&t, 0), TRACE_OK);
	sim_config c = seed000_config();
	c.calibrate = 1;
	sim_result r;
	run_ok(&c, &t, &r);
	cr_expect_gt(r.steps, SIM_CALIB_WARMUP + 100);
	cr_expect(r.pred_err < 0.02, "mean prediction error %g", r.pred_err);
	/* Calibration changes no decision of a fixed-k policy. */
	sim_result plain;
	c.calibrate = 0;
	run_ok(&c, &t, &plain);
	cr_expect_eq(r.makespan_us, plain.makespan_us);
	trace_free(&t);
}

/* The overlap tests' workload: 512 requests at once, chunked, mixed host,
 * 128 slots, 2 ms of host time a step, every step checked. */
static void overlap_workload(trace *t, sim_config *c)
{
	const trace_dist prompt = {DIST_UNIFORM, 64, 256}, output = {DIST_UNIFORM, 200, 400};

	cr_assert_eq(trace_synthetic(t, 512, ARRIVAL_BURST, 0.0, &prompt, &output, 7), TRACE_OK);
	sim_config_init(c);
	c->gen = SIM_GEN_TOKENS;
	c->chunked = 1;
	c->mixed_host = 1;
	c->slots = 128;
	c->host_overhead_us = 2000;
	c->check = 1;
}

/* Overlapped scheduling (--host-overhead-us, --overlap): with a 2 ms host
 * cost per step and about 5 ms of device time per step, the synchronous
 * contract takes device + host per step and the overlapped one max(device,
 * host): within 3% of that bound, and at least 1.35x the synchronous
 * tokens/s. bench/overlap.sh prints the full table. */
Test(sim, overlapped_steps_take_the_longer_of_host_and_device)
{
	trace t = {0};
	sim_config c;
	overlap_workload(&t, &c);
	sim_result sync, ovl;
	run_ok(&c, &t, &sync);
	c.overlap = 1;
	run_ok(&c, &t, &ovl);
	cr_assert_eq(ovl.out_tokens, sync.out_tokens);
	cr_assert_gt(ovl.overlap_steps, ovl.steps * 9 / 10);
	const double dev = ovl.device_busy_us / (double)ovl.steps;
	const double bound = dev > 2000.0 ? dev : 2000.0;
	const double step = ovl.makespan_us / (double)ovl.steps;
	cr_assert(dev > 4000.0 && dev < 6000.0, "device %.0f us per step", dev);
	cr_assert_lt(step, bound * 1.03, "step %.0f us, bound %.0f us", step, bound);
	cr_assert_geq(ovl.tput_tok_s, 1.35 * sync.tput_tok_s, "%.1f vs %.1f tok/s", ovl.tput_tok_s,
		      sync.tput_tok_s);
	/* each request's last step was followed by one planned row: discarded */
	cr_assert_gt(ovl.overlap_wasted, 0);
	cr_assert_leq(ovl.overlap_wasted, t.n);
	trace_free(&t);
}

/* Overlapped scheduling at depth 2 and 4 (--overlap N) on the workload
 * above: every request runs to the end with the synchronous run's tokens,
 * every placeholder the host resolves names its sequence's previous token
 * in the step it names (sim_run fails the launch otherwise), at most N
 * tokens a request are computed and discarded, and deeper pipelines do
 * not lose throughput: depth 2 within 1% of depth 1, depth 4 within 2%
 * (bench/overlap_depth.sh prints the table, docs/benchmarks.md). */
Test(sim, overlap_depths_2_and_4_finish_every_request_at_depth_1_throughput)
{
	trace t = {0};
	sim_config c;
	overlap_workload(&t, &c);
	sim_result sync, d[5];
	run_ok(&c, &t, &sync);
	for (uint32_t n = 1; n <= 4; n *= 2) {
		c.overlap = n;
		run_ok(&c, &t, &d[n]);
		cr_assert_eq(d[n].out_tokens, sync.out_tokens, "depth %u", n);
		cr_assert_gt(d[n].overlap_steps, d[n].steps * 9 / 10, "depth %u", n);
		cr_assert_gt(d[n].overlap_placeholders, 0, "depth %u", n);
		cr_assert_gt(d[n].overlap_wasted, 0, "depth %u", n);
		cr_assert_leq(d[n].overlap_wasted, (uint64_t)n * t.n, "depth %u", n);
	}
	cr_assert_eq(d[1].overlap_far_placeholders, 0);
	cr_assert_geq(d[2].tput_tok_s, 0.99 * d[1].tput_tok_s, "%.1f vs %.1f tok/s",
		      d[2].tput_tok_s, d[1].tput_tok_s);
	cr_assert_geq(d[4].tput_tok_s, 0.98 * d[1].tput_tok_s, "%.1f vs %.1f tok/s",
		      d[4].tput_tok_s, d[1].tput_tok_s);
	cr_assert_gt(d[4].overlap_wasted, d[1].overlap_wasted, "deeper: more rows after a stop");
	trace_free(&t);
}
