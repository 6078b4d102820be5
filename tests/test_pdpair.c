/*
 * test_pdpair.c - the prefill / decode pair (examples/pdpair) on tinylm's
 * small model: token-exact against the reference with and without faults.
 * A plain program, not Criterion: it forks the prefill process and runs a
 * receiver thread, and runs as it is under valgrind or a sanitizer.
 *
 * Cases:
 *   frame          a block frame loads back; one byte short, one flipped
 *                  payload bit, or another hash is refused and copies
 *                  nothing.
 *   clean          every job ends once with its reference tokens; lookups
 *                  were answered LATER while prefills ran; every loaded
 *                  token came in a good frame (kv_load_tokens = blocks in x
 *                  block_tokens); nothing failed, the prefill process
 *                  exited 0.
 *   clean_chunked  the same with jobs submitted two per step and chunked
 *                  prefill on the decode side.
 *   die            the prefill process kills itself halfway through the
 *                  6th block it sends: exactly 5 frames arrived, the socket
 *                  closed mid-run, loads failed and were recomputed, every
 *                  job still ends once with its reference tokens.
 *   die_first      the same before the first block: nothing loaded.
 *   cut            the 4th block arrives cut to half its bytes: one bad
 *                  frame, at least one block recomputed, exact.
 *   corrupt        the 3rd block arrives with a flipped payload bit: one
 *                  bad frame (checksum), recomputed, exact.
 */
#include "pdpair.h"
#include "filestore.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int failures;

#define CHECK(c)                                                                   \
	do {                                                                       \
		if (!(c)) {                                                        \
			fprintf(stderr, "%s:%d: %s: check failed: %s\n", __FILE__,   \
				__LINE__, name, #c);                                   \
			failures++;                                                \
		}                                                                  \
	} while (0)

static tlm_model *model;
static tlm_workload wl;

static void case_frame(void)
{
	const char *name = "frame";
	const uint32_t bt = 16;
	tlm_host *h = tlm_host_create(model, bt, 4, 0);
	const size_t payload = pd_block_payload(model, bt), n = 48 + payload;
	uint8_t *f = malloc(n);
	float *row;

	CHECK(h && f);
	if (!h || !f)
		goto out;
	row = tlm_host_kv_row(h, 0, 1, 0, 0);
	for (size_t i = 0; i < payload / sizeof(float) / model->cfg.layers; i++)
		row[i] = (float)i * 0.5f;
	pd_frame_encode(h, model, bt, 1, 0x1234, f);
	CHECK(pd_frame_load(h, model, bt, 2, 0x1234, f, n) == 0);
	CHECK(tlm_host_kv_row(h, 0, 2, 0, 0)[7] == 3.5f);
	*tlm_host_kv_row(h, 0, 3, 0, 0) = -1.0f;
	CHECK(pd_frame_load(h, model, bt, 3, 0x1234, f, n - 1) == -1);
	CHECK(pd_frame_load(h, model, bt, 3, 0x1235, f, n) == -1);
	f[48 + payload / 2] ^= 0x01;
	CHECK(pd_frame_load(h, model, bt, 3, 0x1234, f, n) == -1);
	CHECK(*tlm_host_kv_row(h, 0, 3, 0, 0) == -1.0f); /* nothing copied */
out:
	free(f);
	tlm_host_destroy(h);
}

/* Run the pair on the workload and check what every case shares: status,
 * the scheduler's check, every job ended once with its reference tokens. */
static void run(const char *name, const pd_config *cfg, pd_result *r)
{
	char msg[256] = "";

	pd_run(&wl, model, cfg, r);
	CHECK(r->status == 0);
	CHECK(r->check == 0);
	const uint32_t bad = r->status ? wl.n_jobs : tlm_workload_verify(&wl, msg, sizeof(msg));
	if (bad)
		fprintf(stderr, "%s: %u jobs differ; first: %s\n", name, bad, msg);
	CHECK(bad == 0);
	CHECK(r->sched.finished == wl.n_jobs);
	printf("%-14s loaded %5llu computed %5llu hits %5llu; frames in %3llu bad %llu; "
	       "recomputed blocks %3llu; LATER %6llu; closed %d; %.0f ms\n",
	       name, (unsigned long long)r->sched.kv_load_tokens,
	       (unsigned long long)r->sched.prefill_tokens,
	       (unsigned long long)r->sched.hit_tokens, (unsigned long long)r->blocks_in,
	       (unsigned long long)r->blocks_bad, (unsigned long long)r->sched.kv_load_failed,
	       (unsigned long long)r->later, r->peer_closed, r->wall_us / 1e3);
}

static void clean_checks(const char *name, const pd_config *cfg, const pd_result *r)
{
	CHECK(r->later > 0);
	CHECK(r->sched.kv_load_tokens > 0);
	CHECK(r->sched.kv_load_tokens == r->blocks_in * cfg->rc.block_tokens);
	CHECK(r->sched.kv_load_failed == 0);
	CHECK(r->blocks_bad == 0 && r->blocks_missing == 0 && r->xfers_cut == 0);
	CHECK(r->peer_closed == 0);
	CHECK(WIFEXITED(r->prefill_exit) && WEXITSTATUS(r->prefill_exit) == 0);
}

static void case_clean(void)
{
	const char *name = "clean";
	pd_config cfg;
	pd_result r;

	pd_config_default(&cfg);
	run(name, &cfg, &r);
	clean_checks(name, &cfg, &r);
}

static void case_clean_chunked(void)
{
	const char *name = "clean_chunked";
	pd_config cfg;
	pd_result r;

	pd_config_default(&cfg);
	cfg.rc.submit_per_step = 2;
	cfg.rc.sched.chunked_prefill = 1;
	cfg.rc.sched.token_budget = 64;
	run(name, &cfg, &r);
	clean_checks(name, &cfg, &r);
}

static void case_die(const char *name, int64_t at)
{
	pd_config cfg;
	pd_result r;

	pd_config_default(&cfg);
	cfg.faults.die_at = at;
	run(name, &cfg, &r);
	CHECK(r.peer_closed == 1);
	CHECK(WIFSIGNALED(r.prefill_exit) && WTERMSIG(r.prefill_exit) == SIGKILL);
	CHECK(r.blocks_in == (uint64_t)at); /* the frames before the cut one */
	CHECK(r.blocks_bad == 0);
	CHECK(r.xfers_cut >= 1);
	CHECK(r.sched.kv_load_failed >= 1);
}

static void case_bad_frame(const char *name, int cut)
{
	pd_config cfg;
	pd_result r;

	pd_config_default(&cfg);
	if (cut)
		cfg.faults.cut_at = 3;
	else
		cfg.faults.corrupt_at = 2;
	run(name, &cfg, &r);
	CHECK(r.blocks_bad == 1);
	CHECK(r.sched.kv_load_failed >= 1);
	CHECK(r.sched.kv_load_tokens > 0);
	CHECK(r.peer_closed == 0 && r.xfers_cut == 0);
	CHECK(WIFEXITED(r.prefill_exit) && WEXITSTATUS(r.prefill_exit) == 0);
}

int main(void)
{
	tlm_config mc;
	tlm_workload_config wc;

	tlm_config_small(&mc);
	tlm_workload_config_default(&wc);
	wc.n_jobs = 48;
	wc.system_len = 64;
	wc.pct_abort = 0;
	model = tlm_model_create(&mc);
	if (!model || tlm_workload_create(&wl, &wc, mc.vocab) || tlm_workload_reference(&wl, model)) {
		fprintf(stderr, "setup failed\n");
		return 1;
	}
	case_frame();
	case_clean();
	case_clean_chunked();
	case_die("die", 5);
	case_die("die_first", 0);
	case_bad_frame("cut", 1);
	case_bad_frame("corrupt", 0);
	tlm_workload_destroy(&wl);
	tlm_model_destroy(model);
	if (failures)
		fprintf(stderr, "%d checks failed\n", failures);
	return failures != 0;
}
