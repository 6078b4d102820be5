/*
 * peers.c - other engines' default scheduling expressed in the scheduler's
 * knobs (bkv-sim --compare --peers): vLLM v1 and v0, SGLang, Sarathi-Serve,
 * TGI, the llama.cpp server and Orca.
 *
 * Each preset starts from the caller's machine (its cost model and pool:
 * pool_slots keeps the memory when a peer runs more rows) and changes only
 * what the peer's documented defaults change; --slots stays the machine's
 * row limit. docs/benchmarks.md, "Peer presets", gives each source and what
 * the knobs cannot express.
 */
#include "sim.h"

#include <math.h>
#include <string.h>


/* The peer presets (docs/benchmarks.md, "Peer presets"): each peer's
 * documented defaults expressed in the scheduler's knobs, on the machine of
 * c0 (its cost model, its pool: pool_slots keeps the memory when a peer runs
 * more rows). */
const char *const sim_peer_names[SIM_N_PEERS] = {"vllm-v1", "vllm-v0", "sglang", "sarathi",
						 "tgi", "llamacpp", "orca"};

/* TGI's wait for a prefill batch: 20 decode steps of a full batch at the
 * trace's mean context (prompt plus half the output), priced by c0's model. */
static uint64_t tgi_wait_us(const sim_config *c0, const trace *t)
{
	double ctx = 0.0;
	for (uint32_t i = 0; i < t->n; i++)
		ctx += t->reqs[i].prompt_len + t->reqs[i].output_len / 2.0;
	ctx = t->n ? ctx / t->n : 1.0;
	bkv_step_shape d;
	memset(&d, 0, sizeof(d));
	d.kind = BKV_CALL_DECODE;
	d.decode_rows = c0->slots;
	d.padded_rows = c0->slots;
	d.decode_context = (uint64_t)llround(ctx * c0->slots);
	return (uint64_t)llround(20.0 * sim_price_us(c0, &d));
}

/* Orca's rows: as many as c0's kv_blocks hold when each reserves the
 * trace's longest prompt and the most it may generate (the cap requests
 * are sent with, or with oracle lengths its own), between 1 and c0->slots.
 * The cap is not cut to the pool here: a reservation the pool cannot hold
 * leaves one row. */
static uint32_t orca_slots(const sim_config *c0, const trace *t)
{
	uint64_t longest = 1;
	for (uint32_t i = 0; i < t->n; i++) {
		/* the maximum length is what the request is sent with: the
		 * cap (no oracle), or its own length */
		uint64_t gen = c0->oracle || !c0->max_tokens ? t->reqs[i].output_len + 1u
							      : c0->max_tokens;
		uint64_t need = (uint64_t)t->reqs[i].prompt_len + gen;
		if (need > longest)
			longest = need;
	}
	uint64_t per = (longest + c0->block_tokens - 1) / c0->block_tokens + 1;
	uint64_t fit = c0->kv_blocks / per;
	return fit < 1 ? 1 : fit < c0->slots ? (uint32_t)fit : c0->slots;
}

void sim_peer_config(int which, const sim_config *c0, const trace *t, int big_gpu,
		     double tpot_target_ms, sim_config *c)
{
	*c = *c0;
	c->policy = BKV_POLICY_CONTINUOUS;
	c->hints = 0;
	c->k = 1;
	c->max_wait_us = UINT64_MAX;
	c->tpot_us = 0;
	c->chunked = 0;
	c->mixed_host = 0;
	c->preempt = BKV_PREEMPT_RECOMPUTE;
	c->pool_slots = c0->slots;
	switch (which) {
	case 0: /* vLLM v1: always chunked, FCFS, recompute; 8192 / 1024 on
		   an H100-class GPU, else 2048 / 256 (arg_utils.py) */
		c->chunked = 1;
		c->mixed_host = 1;
		c->budget = big_gpu ? 8192 : 2048;
		c->slots = big_gpu ? 1024 : 256;
		break;
	case 1: /* vLLM v0: split host, no mixing, 256 seqs, prefill-first
		   iterations (vllm/core/scheduler.py, _schedule_default:
		   no decodes in an iteration that schedules prefills) */
		c->slots = 256;
		c->prefill_first = 1;
		break;
	case 2: /* SGLang: prefill batches before decode, not mixed by
		   default; chunked_prefill_size 8192 is beyond our split host */
		break;
	case 3: /* Sarathi-Serve: stall-free mixed batches, budget from the
		   TBT target */
		c->chunked = 1;
		c->mixed_host = 1;
		if (tpot_target_ms > 0.0)
			c->tpot_us = (uint32_t)lround(tpot_target_ms * 1000.0);
		else if (c0->tpot_us)
			c->tpot_us = c0->tpot_us;
		c->budget = c->tpot_us ? 0 : 512;
		break;
	case 4: /* TGI: a new prefill batch waits for floor(1.2 x running)
		   queued requests or 20 decode steps (max_waiting_tokens) */
		c->k = c0->slots;
		c->max_wait_us = tgi_wait_us(c0, t);
		break;
	case 5: /* llama.cpp server: n_parallel 1 slot, n_batch 2048 chunks
		   in one mixed batch, KV per slot (no preemption needed) */
		c->chunked = 1;
		c->mixed_host = 1;
		c->budget = 2048;
		c->slots = 1;
		break;
	case 6: /* Orca: iteration-level, selective batching (mixed, whole
		   prompts), KV reserved for the maximum length */
		c->mixed_host = 1;
		if (c0->kv_blocks)
			c->slots = orca_slots(c0, t);
		break;
	}
	/* --slots is the machine's row limit: a peer's own maximum applies
	 * below it */
	if (c->slots > c0->slots)
		c->slots = c0->slots;
}

