/*
 * pdpair.h - disaggregated prefill and decode: tinylm served by two
 * processes, each with its own pool, scheduler and paged KV tensor, joined
 * by a KV connector (bkv_connector) over a Unix socket.
 *
 *   decode process (parent)                    prefill process (child)
 *   -----------------------                    -----------------------
 *   submit job j ---------- PREFILL(j, tokens) -->  submit, max_new 1
 *   lookup: LATER until DONE(j)                     step ... on_finish
 *           <------------------- DONE(j, count) --  count = leading prompt
 *   lookup: count                                   blocks its store holds
 *   load  --------------- GET(xfer, hashes) ----->  save kept every computed
 *   receiver thread <---- BLOCKS(xfer, frames) --   block (hash -> frame)
 *     checks each frame, copies its KV in,
 *     bkv_kv_xfer_done(xfer, failed blocks)
 *
 * A block travels as a block file of the file store's format
 * (examples/connectors/filestore.h, "ON DISK": a 48-byte header with the
 * hash, the payload size and checksum, and its own checksum), so a short
 * or corrupt block is caught and only that block is recomputed. When the
 * socket closes (the prefill process died), lookups answer 0, loads in
 * flight complete as failed and new loads do not start: the decode side
 * computes everything itself from then on.
 *
 * wire.c holds the framing shared by both sides, prefill.c the prefill
 * process, decode.c the decode process and pd_run, which forks the pair.
 */
#ifndef PDPAIR_H
#define PDPAIR_H

#include "tinylm.h"

#include <stddef.h>
#include <stdint.h>

/* ---- wire.c ------------------------------------------------------------ */

/* Message types; each message is a pd_msg, then its body. */
enum pd_msg_type {
	PD_PREFILL = 1, /* decode -> prefill: tag = job, n = prompt tokens,
			   body int32_t[n] */
	PD_GET = 2,     /* decode -> prefill: tag = xfer, n = blocks, body
			   uint64_t[n] hashes */
	PD_DONE = 3,    /* prefill -> decode: tag = job, n = leading prompt
			   blocks the prefill store holds; no body */
	PD_BLOCKS = 4   /* prefill -> decode: tag = xfer, n = blocks, body n x
			   (uint32_t bytes, then a block frame of that many
			   bytes; 0: not held) */
};

typedef struct pd_msg {
	uint32_t type; /* a pd_msg_type */
	uint32_t n;    /* count, per type */
	uint64_t tag;  /* job index or transfer id, per type */
} pd_msg;

/* Most bytes of one frame either side accepts (a bound on what a reader
 * allocates for a length it does not trust). */
#define PD_MAX_FRAME (1u << 24)

/* Write or read exactly n bytes (EINTR retried; writes never raise
 * SIGPIPE). Return 0, or -1 (error, or end of stream before n bytes). */
int pd_write_full(int fd, const void *p, size_t n);
int pd_read_full(int fd, void *p, size_t n);

/* Bytes of one block's KV in tinylm's paged tensor: every layer's K and V
 * rows of the block (layers x 2 x block_tokens x kv_width floats). */
size_t pd_block_payload(const tlm_model *m, uint32_t block_tokens);

/* Encode device block `block` of host h as a frame (header + payload) at
 * out (48 + pd_block_payload bytes) under hash. */
void pd_frame_encode(tlm_host *h, const tlm_model *m, uint32_t block_tokens, int32_t block,
		     uint64_t hash, uint8_t *out);

/* Check a frame of n untrusted bytes: a valid block file (header checksum,
 * exact size, payload checksum) of hash, group 0, one frame, the payload
 * size of this model; then copy its payload into device block `block` of
 * h. Returns 0, or -1 (nothing copied). */
int pd_frame_load(tlm_host *h, const tlm_model *m, uint32_t block_tokens, int32_t block,
		  uint64_t hash, const uint8_t *buf, size_t n);

/* ---- prefill.c, decode.c ----------------------------------------------- */

/* Faults the prefill process injects into the blocks it sends, counted
 * over every block of every BLOCKS reply from 0; < 0: off. */
typedef struct pd_faults {
	int64_t die_at;     /* the prefill process sends half of this block's
			       frame and kills itself (SIGKILL) */
	int64_t cut_at;     /* this block's frame is sent cut to half its
			       bytes (its length says so: the stream stays
			       framed, the block is short) */
	int64_t corrupt_at; /* one payload byte of this block is flipped */
} pd_faults;

/* One run of the pair. */
typedef struct pd_config {
	tlm_run_config rc;       /* the decode side: sched (connector is set
				    by pd_run), block_tokens, device_blocks,
				    submit_per_step */
	uint32_t prefill_blocks; /* the prefill side's device blocks */
	uint32_t prefill_running; /* the prefill side's max_running */
	pd_faults faults;        /* injected by the prefill process */
} pd_config;

/* pd_config with the test's defaults for rc's block size and pools, and
 * no faults. */
void pd_config_default(pd_config *cfg);

/* What one run measured (the decode side, unless named otherwise). */
typedef struct pd_result {
	int status;               /* 0, or the first failing bkv_* status,
				     TLM_STUCK, or -1 (fork, socket, thread) */
	double wall_us;           /* first submit to the last request's end */
	double mean_ttft_us;      /* submit -> first token */
	double mean_latency_us;   /* submit -> finish */
	uint64_t gen_tokens;      /* tokens delivered by on_token */
	uint64_t prompt_tokens;   /* prompt tokens submitted */
	bkv_sched_stats sched;    /* the decode scheduler's counters: loaded
				     (kv_load_tokens) vs computed
				     (prefill_tokens) prompt tokens */
	int check;                /* bkv_sched_check at the end (0 = ok) */
	uint64_t later;           /* lookups answered BKV_CONNECTOR_LATER */
	uint64_t blocks_in;       /* block frames received and loaded */
	uint64_t blocks_bad;      /* frames that failed their checks (short,
				     corrupt, wrong hash) */
	uint64_t blocks_missing;  /* blocks the prefill side did not hold */
	uint64_t xfers_cut;       /* loads failed whole or in part because
				     the socket closed */
	int peer_closed;          /* the socket closed before the end */
	int prefill_exit;         /* the prefill process's wait status */
	char err[256];            /* what failed, when status != 0 */
} pd_result;

/* Serve w's jobs on the pair (forks the prefill process, runs the decode
 * side in this one, reaps the child). Jobs must not be aborted (no
 * abort_after). Returns res->status. */
int pd_run(tlm_workload *w, const tlm_model *m, const pd_config *cfg, pd_result *res);

/* The prefill process's body: serve fd until it closes. Returns 0, or
 * nonzero on a setup failure. */
int pd_prefill_main(int fd, const tlm_model *m, const pd_config *cfg);

#endif /* PDPAIR_H */
