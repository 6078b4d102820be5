/*
 * test_overlap.c - overlapped scheduling (bkv_step_launch / bkv_step_complete):
 * placeholders, ends in the step in flight, deferred release of memory,
 * failed steps and launches, aborts from another thread, bad calls, no
 * allocation in steady state, and a model check: every request delivers
 * exactly the tokens (and ends with the reason) of a synchronous run.
 *
 * The host (ov_host) wraps the self-checking fake host (support/fakehost.h):
 * its "device" runs each launched step at once, in launch order, on a copy
 * of the batch whose placeholders it replaced with the tokens the previous
 * step sampled, so the fake host's checks (input tokens, positions, slots,
 * the KV cell model of every context position, callbacks) see every step
 * as the device computes it. A step the device failed is reported at its
 * completion (status -1), and the device computes nothing after it until
 * the host has completed every outstanding step.
 */
#include "batchkv.h"
#include "support/fakehost.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define OV_MAX_REQ 400u
#define OV_DEPTH (BKV_OVERLAP_MAX_DEPTH + 1u) /* the device's queue */

static uint32_t ov_depth = 1; /* cfg.overlap of the overlapped runs */

typedef struct ov_host {
	kh_host kh;               /* first: kh_ops' callbacks take the host */
	int32_t *tok;             /* the batch's token ids, placeholders replaced */
	uint32_t tok_cap;
	const int32_t *dev_outs[OV_DEPTH]; /* next_tokens of the launched steps
				     (the ring below) */
	uint32_t dev_rows[OV_DEPTH]; /* their rows */
	int prev_failed;          /* the device failed the step launched before
				     (or one before it) */
	int dev_failed[OV_DEPTH]; /* FIFO: launched steps the device failed */
	bkv_batch dev_batch[OV_DEPTH]; /* their batches (struct copied) */
	uint64_t dev_sum[OV_DEPTH]; /* a digest of each one's arrays at launch */
	uint32_t dev_head, dev_n;
	uint32_t max_in_flight;   /* steps in flight at a launch, at most */
	uint64_t launches;        /* launch callbacks */
	uint64_t fail_launch_at;  /* launch number refused at the door (0: none) */
	uint64_t placeholders;    /* placeholder tokens replaced */
	uint64_t bad_placeholders; /* naming no sampling row of the step before */
	uint64_t max_row_pending; /* rows of one batch carrying a placeholder */
	uint64_t slot_reuse_in_flight; /* persistent: deltas that opened or
				      closed a slot a step in flight reads */
	uint64_t slots_opened;    /* persistent: OPENED deltas seen */
	uint64_t grp_bad;         /* KV groups: a slot or a context cell of a
				      group after the first that is wrong */
	uint64_t grp_reads;       /* KV groups: context cells checked there */
	/* a STATE group (ov_state_*): each frame's state as the device wrote
	 * it - the group-0 cell of the last token it consumed (the chain over
	 * the history) and the tokens consumed (-7: a failing call's) */
	uint64_t *st_val;         /* [nb] (NULL without a STATE group) */
	int32_t *st_pos;          /* [nb] */
	uint64_t *st_hval;        /* [nh + 1] the host tier's (swaps) */
	int32_t *st_hpos;         /* [nh + 1] */
	uint64_t st_reads;        /* states read and checked */
	uint64_t st_bad;          /* a state read that is wrong */
	uint64_t st_clash;        /* a state a launch writes that the step in
				     flight reads or writes */
} ov_host;

/* Persistent layout: a launch's deltas may close a slot a step in flight
 * reads (the host closes its mirror of it in launch order), but must not
 * open it for another row before that step completed. */
static void check_slots_in_flight(ov_host *h, const bkv_batch *b)
{
	uint32_t i, k, r;

	if (b->layout != BKV_BATCH_PERSISTENT)
		return;
	for (i = 0; i < b->n_table_deltas; i++) {
		const bkv_table_delta *d = &b->table_deltas[i];

		if (!(d->flags & BKV_TABLE_OPENED))
			continue;
		h->slots_opened++;
		for (k = 0; k < h->dev_n; k++) {
			const bkv_batch *f = &h->dev_batch[(h->dev_head + k) % OV_DEPTH];

			for (r = 0; r < f->n_rows; r++)
				if (f->row_slot[r] == d->slot)
					h->slot_reuse_in_flight++;
		}
	}
}

/* A digest of everything a batch points to: the arrays of a launched step
 * must hold the same until it completes. */
static uint64_t batch_sum(const bkv_batch *b)
{
	uint64_t x = 1469598103934665603ull;
	uint32_t i, g;

#define MIX(v) (x = (x ^ (uint64_t)(uint32_t)(v)) * 1099511628211ull)
	for (i = 0; i < b->n_tokens; i++) {
		MIX(b->token_ids[i]);
		MIX(b->positions[i]);
		MIX(b->slot_mapping[i]);
		MIX(b->groups[0].slot_mapping[i]);
	}
	for (i = 0; i <= b->n_rows; i++) {
		MIX(b->qo_indptr[i]);
		if (b->layout == BKV_BATCH_FLAT)
			MIX(b->kv_indptr[i]);
	}
	for (i = 0; i < b->n_rows; i++) {
		MIX(b->row_sample[i]);
		MIX(b->row_req[i]);
		MIX(b->kv_last_page_len[i]);
		if (b->row_drafts) /* speculation: each step's own */
			MIX(b->row_drafts[i]);
		if (b->layout == BKV_BATCH_PERSISTENT)
			MIX(b->row_slot[i]);
	}
	if (b->layout == BKV_BATCH_FLAT) {
		for (i = 0; i < (uint32_t)b->kv_indptr[b->n_rows]; i++)
			MIX(b->kv_indices[i]);
	} else { /* the deltas, the host applied at launch */
		uint32_t n = 0;

		for (i = 0; i < b->n_table_deltas; i++) {
			const bkv_table_delta *d = &b->table_deltas[i];

			MIX(d->slot);
			MIX(d->start);
			MIX(d->n);
			MIX(d->len);
			MIX(d->flags);
			n += d->n;
		}
		for (i = 0; i < n; i++)
			MIX(b->delta_blocks[i]);
	}
	MIX(b->n_groups);
	for (g = 1; g < b->n_groups; g++) { /* each further group's arrays */
		const bkv_batch_group *G = &b->groups[g];

		MIX(G->kind);
		MIX(G->span);
		if (G->kind == BKV_GROUP_STATE) { /* the units each row reads
						     and writes */
			for (i = 0; i < b->n_rows; i++) {
				MIX(G->state_in[i]);
				MIX(G->state_out[i]);
			}
			for (i = 0; G->state_out_spec &&
				    i < (uint32_t)b->qo_indptr[b->n_decode_rows];
			     i++)
				MIX(G->state_out_spec[i]);
			continue;
		}
		for (i = 0; i < b->n_tokens; i++)
			MIX(G->slot_mapping[i]);
		if (b->layout != BKV_BATCH_FLAT)
			continue; /* the tables are read during the call */
		for (i = 0; i < b->n_rows; i++)
			MIX(G->kv_first_block[i]);
		for (i = 0; i <= b->n_rows; i++)
			MIX(G->kv_indptr[i]);
		for (i = 0; i < (uint32_t)G->kv_indptr[b->n_rows]; i++)
			MIX(G->kv_indices[i]);
	}
#undef MIX
	return x;
}

/* ---- KV groups: the device's cells of every group ----------------------------
 *
 * Frames are shared between groups (a block is one group's at a time), so
 * the fake host's cell model holds every group's cells: it checks group 0
 * and performs the copies for all. Then, for each group after the first:
 * every new token's slot is in the group's block of its position, every
 * context position the row's first token reads (all for FULL, the window
 * or the chunk) holds the cell group 0 holds there (the compute wrote only
 * group 0's new positions), and the computed positions' cells become group
 * 0's (a failing call's wrong cells included, so a rollback that keeps
 * them is caught). */

/* The first position a token at position p reads in group G. */
static uint32_t grp_first_pos(const bkv_batch_group *G, uint32_t p)
{
	if (G->kind == BKV_GROUP_WINDOW)
		return p + 1 > G->span ? p + 1 - G->span : 0;
	if (G->kind == BKV_GROUP_CHUNKED)
		return p / G->span * G->span;
	return 0;
}

/* Group G's block of position p of row r (-1: the batch does not list it). */
static int32_t grp_block(const bkv_batch *b, const bkv_batch_group *G, uint32_t r, uint32_t p)
{
	uint32_t i = p / b->block_tokens, first;

	if (b->layout == BKV_BATCH_PERSISTENT) {
		uint32_t slot = b->row_slot[r];

		return i < G->row_table_len[slot] ? G->row_tables[slot][i] : -1;
	}
	first = G->kv_first_block ? (uint32_t)G->kv_first_block[r] : 0;
	if (i < first || G->kv_indptr[r] + (i - first) >= (uint32_t)G->kv_indptr[r + 1])
		return -1;
	return G->kv_indices[G->kv_indptr[r] + (i - first)];
}

static void grp_reads(ov_host *h, const bkv_batch *b)
{
	const uint32_t bt = b->block_tokens;
	const uint64_t *dev = h->kh.dev;
	uint32_t g, r, t, p;

	for (g = 1; g < b->n_groups; g++) {
		const bkv_batch_group *G = &b->groups[g];

		if (G->kind == BKV_GROUP_STATE)
			continue;
		for (r = 0; r < b->n_rows; r++) {
			uint32_t start = (uint32_t)b->positions[b->qo_indptr[r]];

			for (t = (uint32_t)b->qo_indptr[r]; t < (uint32_t)b->qo_indptr[r + 1]; t++) {
				int32_t k;

				p = (uint32_t)b->positions[t];
				k = grp_block(b, G, r, p);
				if (k < 0 || G->slot_mapping[t] != k * (int32_t)bt + (int32_t)(p % bt))
					h->grp_bad++;
			}
			for (p = grp_first_pos(G, start); p < start; p++) {
				int32_t k = grp_block(b, G, r, p), k0 = grp_block(b, &b->groups[0], r, p);

				h->grp_reads++;
				if (k < 0 || k0 < 0 ||
				    dev[(size_t)k * bt + p % bt] != dev[(size_t)k0 * bt + p % bt])
					h->grp_bad++;
			}
		}
	}
}

static void grp_writes(ov_host *h, const bkv_batch *b)
{
	uint32_t g, t;

	for (g = 1; g < b->n_groups; g++)
		for (t = 0; b->groups[g].kind != BKV_GROUP_STATE && t < b->n_tokens; t++)
			h->kh.dev[b->groups[g].slot_mapping[t]] = h->kh.dev[b->slot_mapping[t]];
}

/* ---- a STATE group: the state units --------------------------------------
 *
 * A row reads its state from state_in (-1: the zero state, at position 0
 * only) and writes the state after its last token to state_out (a row with
 * drafts: after each token, state_out_spec). The model keeps, per frame,
 * the group-0 cell of the last token a state consumed (that cell is the
 * chain over the whole history) and how many tokens it consumed, so a row
 * that reads a state of another history, of another length, or one a
 * failing call wrote (-7), is caught; and a launch must write no unit the
 * step in flight reads or writes (double-buffered states). */

static const bkv_batch_group *st_group(const bkv_batch *b)
{
	return b->n_groups > 1 && b->groups[b->n_groups - 1].kind == BKV_GROUP_STATE
		       ? &b->groups[b->n_groups - 1]
		       : NULL;
}

/* The group-0 cell of position p of row r (0 when the batch lacks it). */
static uint64_t st_cell(ov_host *h, const bkv_batch *b, uint32_t r, uint32_t p)
{
	int32_t k = grp_block(b, &b->groups[0], r, p);

	return k < 0 ? 0 : h->kh.dev[(size_t)k * b->block_tokens + p % b->block_tokens];
}

/* The call's copies, in their order (swap-out, swap-in, device): a
 * swapped state's frames move with them. */
static void st_copies(ov_host *h, const bkv_batch *b)
{
	uint32_t i;

	for (i = 0; i < b->n_swap_out; i++) {
		h->st_hval[b->swap_out[i].dst] = h->st_val[b->swap_out[i].src];
		h->st_hpos[b->swap_out[i].dst] = h->st_pos[b->swap_out[i].src];
	}
	for (i = 0; i < b->n_swap_in; i++) {
		h->st_val[b->swap_in[i].dst] = h->st_hval[b->swap_in[i].src];
		h->st_pos[b->swap_in[i].dst] = h->st_hpos[b->swap_in[i].src];
	}
	for (i = 0; i < b->n_copies; i++) {
		h->st_val[b->copies[i].dst] = h->st_val[b->copies[i].src];
		h->st_pos[b->copies[i].dst] = h->st_pos[b->copies[i].src];
	}
}

static void st_reads(ov_host *h, const bkv_batch *b)
{
	const bkv_batch_group *G = st_group(b);
	uint32_t r;

	st_copies(h, b);
	for (r = 0; G && r < b->n_rows; r++) {
		uint32_t start = (uint32_t)b->positions[b->qo_indptr[r]];
		int32_t in = G->state_in[r];

		h->st_reads++;
		if (in < 0 ? start != 0
			   : (uint32_t)in >= h->kh.nb || h->st_pos[in] != (int32_t)start ||
				     h->st_val[in] != st_cell(h, b, r, start - 1))
			h->st_bad++;
	}
}

static void st_writes(ov_host *h, const bkv_batch *b, int failing)
{
	const bkv_batch_group *G = st_group(b);
	uint32_t r, j;

	for (r = 0; G && r < b->n_rows; r++) {
		uint32_t q0 = (uint32_t)b->qo_indptr[r], n = (uint32_t)b->qo_indptr[r + 1] - q0;
		uint32_t start = (uint32_t)b->positions[q0];
		uint32_t k = b->row_drafts && r < b->n_decode_rows ? b->row_drafts[r] : 0;

		for (j = k ? 0 : n - 1; j < n; j++) {
			int32_t u = k ? G->state_out_spec[q0 + j] : G->state_out[r];

			if (u < 0 || (uint32_t)u >= h->kh.nb) {
				h->st_bad++;
				continue;
			}
			h->st_val[u] = st_cell(h, b, r, start + j);
			h->st_pos[u] = failing ? -7 : (int32_t)(start + j + 1);
		}
	}
}

/* Does the launched step d read or write unit u? */
static int st_names(const bkv_batch *d, int32_t u)
{
	const bkv_batch_group *G = st_group(d);
	uint32_t i;

	for (i = 0; G && i < d->n_rows; i++)
		if (G->state_in[i] == u || G->state_out[i] == u)
			return 1;
	for (i = 0; G && G->state_out_spec && i < (uint32_t)d->qo_indptr[d->n_decode_rows]; i++)
		if (G->state_out_spec[i] == u)
			return 1;
	return 0;
}

static void st_in_flight(ov_host *h, const bkv_batch *b)
{
	const bkv_batch_group *G = st_group(b);
	uint32_t k, r;

	for (k = 0; G && k < h->dev_n; k++) {
		const bkv_batch *d = &h->dev_batch[(h->dev_head + k) % OV_DEPTH];

		for (r = 0; r < b->n_rows; r++)
			h->st_clash += st_names(d, G->state_out[r]);
		for (r = 0; G->state_out_spec && r < (uint32_t)b->qo_indptr[b->n_decode_rows]; r++)
			h->st_clash += st_names(d, G->state_out_spec[r]);
	}
}

/* One compute on the device: group 0 by the fake host, the others here. */
static int ov_compute(ov_host *h, const bkv_batch *b, int32_t *next)
{
	int rc;

	rc = kh_compute(&h->kh, b, next, BKV_CALL_MIXED);
	if (b->n_groups > 1) { /* after the copies; the compute wrote only
				  group 0's new positions */
		grp_reads(h, b);
		grp_writes(h, b);
	}
	if (h->st_val) { /* after the copies (the context cells a state is
			    compared with: a row's own, which no row of the
			    call writes), all reads before the writes */
		st_reads(h, b);
		st_writes(h, b, rc < 0);
	}
	return rc;
}

static int ov_launch(void *host, const bkv_batch *b, int32_t *next)
{
	ov_host *h = host;
	bkv_batch c = *b;
	uint32_t t, n_pend = 0;
	int failed;

	h->launches++;
	check_slots_in_flight(h, b);
	if (h->st_val)
		st_in_flight(h, b);
	if (h->fail_launch_at && h->launches == h->fail_launch_at)
		return -1;
	if (b->n_tokens > h->tok_cap) {
		h->tok_cap = b->n_tokens * 2;
		h->tok = realloc(h->tok, h->tok_cap * sizeof(int32_t));
		cr_assert(h->tok);
	}
	for (t = 0; t < b->n_tokens; t++) {
		int32_t v = b->token_ids[t];

		if (BKV_TOKEN_IS_PENDING(v)) {
			uint32_t row = BKV_TOKEN_PENDING_ROW(v), back = BKV_TOKEN_PENDING_BACK(v);
			uint32_t k = (h->dev_head + h->dev_n + OV_DEPTH - back) % OV_DEPTH;

			n_pend++;
			h->placeholders++;
			if (back > h->dev_n || row >= h->dev_rows[k] ||
			    t >= (uint32_t)b->qo_indptr[b->n_decode_rows]) {
				h->bad_placeholders++;
				v = 0;
			} else {
				v = h->dev_outs[k][row];
			}
		}
		h->tok[t] = v;
	}
	if (n_pend > h->max_row_pending)
		h->max_row_pending = n_pend;
	c.token_ids = h->tok;
	if (h->prev_failed) /* the device stopped at the failed step */
		failed = 1;
	else
		failed = ov_compute(h, &c, next) < 0;
	cr_assert(h->dev_n < OV_DEPTH && h->dev_n <= ov_depth, "a launch with %u in flight",
		  h->dev_n);
	if (h->dev_n > h->max_in_flight)
		h->max_in_flight = h->dev_n;
	h->dev_batch[(h->dev_head + h->dev_n) % OV_DEPTH] = *b;
	h->dev_sum[(h->dev_head + h->dev_n) % OV_DEPTH] = batch_sum(b);
	h->dev_outs[(h->dev_head + h->dev_n) % OV_DEPTH] = next;
	h->dev_rows[(h->dev_head + h->dev_n) % OV_DEPTH] = b->n_rows;
	h->dev_failed[(h->dev_head + h->dev_n++) % OV_DEPTH] = failed;
	h->prev_failed = failed;
	return 0;
}

static int ov_forward(void *host, const bkv_batch *b, int32_t *next)
{
	return ov_compute(host, b, next);
}

typedef struct ov_opts {
	uint32_t bt, nb, nh;      /* pool geometry */
	int prefix;               /* prefix cache */
	int host_cache;           /* the host tier keeps evicted prefix blocks */
	uint32_t n_groups;        /* KV groups (0: none) */
	bkv_kv_group groups[3];   /* [n_groups] */
	uint32_t state_units;     /* a STATE group: bkv_pool_config's */
	int state_share;
	bkv_sched_config cfg;
	const bkv_allocator *alloc; /* the scheduler's */
} ov_opts;

static void ov_opts_init(ov_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->bt = 4;
	o->nb = 256;
	o->prefix = 1;
	bkv_sched_config_init(&o->cfg);
	o->cfg.max_running = 8;
	o->cfg.admit_group = 1;
	o->cfg.overlap = 1;
	/* BKV_TEST_LAYOUT=persistent runs the suite in the persistent batch
	 * layout: the fake host mirrors each launch's table deltas, in launch
	 * order, and checks its mirror against the library's tables and every
	 * KV cell through it (the overlap_persistent test) */
	if (getenv("BKV_TEST_LAYOUT") && strcmp(getenv("BKV_TEST_LAYOUT"), "persistent") == 0)
		o->cfg.batch_layout = BKV_BATCH_PERSISTENT;
}

typedef struct ov_env {
	ov_host h;
	bkv_pool *pool;
	bkv_sched *s;
	uint64_t q[OV_DEPTH]; /* outstanding tickets, oldest first */
	uint32_t n_q;
	uint64_t rng;
	uint32_t abort_permille;  /* the driver aborts a random request per step */
	kh_req *reqs;             /* the records the aborts pick from */
	uint32_t n_reqs;
} ov_env;

static void ov_env_init(ov_env *e, const ov_opts *o)
{
	bkv_pool_config pc;
	bkv_host_ops ops;
	int rc;

	memset(e, 0, sizeof(*e));
	e->rng = 0x9e3779b97f4a7c15ull;
	cr_assert_eq(kh_init(&e->h.kh, o->bt, o->nb, o->nh, 1), 0);
	e->h.kh.garbage = 1;
	e->h.kh.aborts_unrecorded = 1;
	bkv_pool_config_init(&pc);
	pc.block_tokens = o->bt;
	pc.device_blocks = o->nb;
	pc.host_blocks = o->nh;
	pc.max_seqs = 1024;
	pc.prefix_cache = o->prefix;
	pc.host_cache = (uint32_t)o->host_cache;
	pc.n_groups = o->n_groups;
	pc.groups = o->n_groups ? o->groups : NULL;
	pc.state_units = o->state_units;
	pc.state_share = o->state_share;
	rc = bkv_pool_create(&pc, NULL, &e->pool);
	cr_assert_eq(rc, BKV_OK, "pool: %s", bkv_strerror(rc));
	if (o->n_groups && o->groups[o->n_groups - 1].kind == BKV_GROUP_STATE) {
		e->h.st_val = calloc(o->nb, sizeof(uint64_t));
		e->h.st_pos = calloc(o->nb, sizeof(int32_t));
		e->h.st_hval = calloc(o->nh + 1, sizeof(uint64_t));
		e->h.st_hpos = calloc(o->nh + 1, sizeof(int32_t));
		cr_assert(e->h.st_val && e->h.st_pos && e->h.st_hval && e->h.st_hpos);
	}
	ops = kh_ops(0);
	ops.forward = ov_forward;
	ops.launch = ov_launch;
	rc = bkv_sched_create(&o->cfg, e->pool, &ops, &e->h, o->alloc, &e->s);
	cr_assert_eq(rc, BKV_OK, "sched: %s", bkv_strerror(rc));
}

static void ov_env_fini(ov_env *e)
{
	bkv_sched_destroy(e->s);
	bkv_pool_destroy(e->pool);
	kh_fini(&e->h.kh);
	free(e->h.tok);
	free(e->h.st_val);
	free(e->h.st_pos);
	free(e->h.st_hval);
	free(e->h.st_hpos);
}

static uint64_t xs(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void ov_check(ov_env *e)
{
	int rc = bkv_sched_check(e->s);

	cr_assert_eq(rc, 0, "bkv_sched_check: %d", rc);
	cr_assert_eq(e->h.kh.violations, 0, "host: %s", e->h.kh.first);
	cr_assert_eq(e->h.bad_placeholders, 0);
	cr_assert_eq(e->h.slot_reuse_in_flight, 0, "a slot was reopened while a step read it");
	cr_assert_eq(e->h.grp_bad, 0, "a group's slot or context cell is wrong");
	cr_assert_eq(e->h.st_bad, 0, "a row read a wrong state");
	cr_assert_eq(e->h.st_clash, 0, "a launch wrote a state unit the step in flight names");
}

/* Complete the oldest outstanding ticket with the device's verdict. */
static int ov_complete1(ov_env *e)
{
	int st, rc;

	cr_assert(e->n_q > 0 && e->h.dev_n > 0);
	st = e->h.dev_failed[e->h.dev_head] ? -1 : 0;
	cr_assert_eq(batch_sum(&e->h.dev_batch[e->h.dev_head]), e->h.dev_sum[e->h.dev_head],
		     "a launched step's arrays changed before it completed");
	e->h.dev_head = (e->h.dev_head + 1) % OV_DEPTH;
	e->h.dev_n--;
	rc = bkv_step_complete(e->s, e->q[0], st, NULL);
	if (st)
		cr_assert_eq(rc, BKV_EHOST);
	else
		cr_assert(rc == BKV_OK || rc == BKV_EHOST, "complete: %d", rc);
	memmove(&e->q[0], &e->q[1], (e->n_q - 1) * sizeof(e->q[0]));
	e->n_q--;
	if (e->n_q == 0) /* nothing in flight: the device starts afresh */
		e->h.prev_failed = 0;
	return rc;
}

static void ov_complete_all(ov_env *e)
{
	while (e->n_q)
		ov_complete1(e);
}

static void ov_maybe_abort(ov_env *e)
{
	kh_req *r;

	if (!e->abort_permille || !e->n_reqs || xs(&e->rng) % 1000 >= e->abort_permille)
		return;
	r = &e->reqs[xs(&e->rng) % e->n_reqs];
	if (r->submitted && !r->finished)
		(void)kh_abort(e->s, r, r->id);
}

/* One driver iteration of the overlapped loop: launch the next step, then
 * complete the one before it. Returns 0 when nothing is left. */
static int ov_iter(ov_env *e)
{
	uint64_t t = 0;
	int rc;

	if (bkv_sched_pending(e->s) == 0 && e->n_q == 0)
		return 0;
	rc = bkv_step_launch(e->s, &t, NULL);
	if (rc == BKV_EAGAIN) {
		cr_assert(e->n_q > 0);
		ov_complete_all(e);
		return 1;
	}
	if (rc == BKV_EHOST) { /* launch refused: everything rolls back */
		cr_assert_eq(t, 0);
		ov_complete_all(e);
		ov_check(e);
		return 1;
	}
	cr_assert_eq(rc, BKV_OK, "launch: %d", rc);
	if (t)
		e->q[e->n_q++] = t;
	ov_check(e);
	ov_maybe_abort(e);
	/* the drain rules: depth steps in flight, or ticket 0 with some */
	if (e->n_q == ov_depth + 1 || (t == 0 && e->n_q)) {
		if (ov_complete1(e) == BKV_EHOST)
			while (e->n_q)
				cr_assert_eq(ov_complete1(e), BKV_EHOST);
	}
	ov_check(e);
	return 1;
}

static void ov_run(ov_env *e, uint32_t max_iters)
{
	uint32_t i;

	for (i = 0; i < max_iters && ov_iter(e); i++)
		;
	cr_assert(i < max_iters, "did not finish in %u iterations", max_iters);
	cr_assert_eq(bkv_sched_pending(e->s), 0);
	cr_assert_eq(e->n_q, 0);
}

static void sync_run(ov_env *e, uint32_t max_steps)
{
	uint32_t i;
	int rc;

	for (i = 0; i < max_steps && bkv_sched_pending(e->s); i++) {
		rc = bkv_step(e->s, NULL);
		cr_assert(rc == BKV_OK || rc == BKV_EHOST);
		ov_check(e);
	}
	cr_assert_eq(bkv_sched_pending(e->s), 0);
}

/* ---- a workload ------------------------------------------------------------- */

typedef struct ov_load {
	uint32_t n;               /* requests */
	int32_t *prompts;         /* [n * 64] */
	kh_req *r;                /* [n] */
} ov_load;

/* Prompts that share prefixes (prefix hits), some with n > 1 branches,
 * stop tokens and failing tokens by hash, lengths to chunk. */
static uint32_t load_max_new = 24; /* outputs up to this many */
static uint32_t load_stop_mod = 11; /* a stop token by hash, 1 in this */

static void load_make(ov_load *L, uint32_t n, uint64_t seed, int forks, int fails)
{
	uint32_t i, j;
	uint64_t x = seed | 1;

	L->n = n;
	L->prompts = calloc((size_t)n * 64, sizeof(int32_t));
	L->r = calloc(n, sizeof(kh_req));
	cr_assert(L->prompts && L->r);
	for (i = 0; i < n; i++) {
		int32_t *p = L->prompts + (size_t)i * 64;
		uint32_t len = 1 + (uint32_t)(xs(&x) % 40), shared = (uint32_t)(xs(&x) % 3) * 8;
		uint32_t nb = forks && xs(&x) % 4 == 0 ? 2 : 1;
		kh_req *r = &L->r[i];

		for (j = 0; j < len; j++)
			p[j] = j < shared ? 100 + (int32_t)j : 200 + (int32_t)(xs(&x) % 700);
		cr_assert_eq(kh_req_init(r, 1000 + i, p, len, 1 + (uint32_t)(xs(&x) % load_max_new), nb), 0);
		r->stop_mod = load_stop_mod;
		r->stop[0] = KH_STOP;
		r->n_stop = 1;
		if (fails && i % 7 == 3)
			r->fail_mod = 19;
		r->key = i % 5 == 4 ? 77 : 0;
	}
}

static void load_submit(ov_env *e, ov_load *L)
{
	uint32_t i;

	for (i = 0; i < L->n; i++)
		cr_assert_eq(kh_submit(e->s, &L->r[i], (int32_t)(i % 3 == 0)), BKV_OK);
	e->reqs = L->r;
	e->n_reqs = L->n;
}

static void load_free(ov_load *L)
{
	uint32_t i;

	for (i = 0; i < L->n; i++)
		kh_req_fini(&L->r[i]);
	free(L->r);
	free(L->prompts);
}

static int spec_branches_race; /* load_same: see there */

/* Every request of b that was not aborted delivered a's tokens and ended
 * for a's reason; every request ended exactly once. */
static void load_same(const ov_load *a, const ov_load *b)
{
	uint32_t i, k, j;

	for (i = 0; i < a->n; i++) {
		const kh_req *x = &a->r[i], *y = &b->r[i];

		cr_assert_eq(x->finished, 1);
		cr_assert_eq(y->finished, 1, "req %u ended %u times", i, y->finished);
		if (y->reason == BKV_FINISH_ABORT || x->reason == BKV_FINISH_ERROR ||
		    y->reason == BKV_FINISH_ERROR)
			continue; /* aborted: a prefix; errors: compared below */
		if (x->n > 1 && spec_branches_race) /* the last branch's end names
						       it; speculation changes
						       which ends last */
			cr_assert(y->reason == BKV_FINISH_LENGTH || y->reason == BKV_FINISH_STOP);
		else
			cr_assert_eq(x->reason, y->reason, "req %u: reason %d, synchronous %d", i,
				     y->reason, x->reason);
		for (k = 0; k < x->n; k++) {
			cr_assert_eq(x->n_out[k], y->n_out[k], "req %u branch %u: %u tokens, sync %u", i, k,
				     y->n_out[k], x->n_out[k]);
			for (j = 0; j < x->n_out[k]; j++)
				cr_assert_eq(x->hist[k * x->max_new + j], y->hist[k * y->max_new + j]);
		}
	}
	for (i = 0; i < a->n; i++) { /* an error ends both runs, at one token */
		const kh_req *x = &a->r[i], *y = &b->r[i];

		if (y->reason == BKV_FINISH_ABORT || (x->reason != BKV_FINISH_ERROR &&
						      y->reason != BKV_FINISH_ERROR))
			continue;
		cr_assert_eq(x->reason, y->reason, "req %u: reason %d, synchronous %d", i, y->reason,
			     x->reason);
	}
}

/* ---- tests ------------------------------------------------------------------ */

Test(overlap, decode_rows_carry_placeholders_with_exact_positions_and_slots)
{
	ov_opts o;
	ov_env e;
	ov_load L;
	bkv_sched_stats st;

	ov_opts_init(&o);
	ov_env_init(&e, &o);
	load_make(&L, 6, 5, 0, 0);
	load_submit(&e, &L);
	ov_run(&e, 2000);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(e.s, &st);
	/* the fake host checked every substituted token, position and slot */
	cr_assert_gt(e.h.placeholders, 20);
	cr_assert_gt(e.h.max_row_pending, 1, "several rows of one batch");
	cr_assert_gt(st.overlap_steps, 10);
	cr_assert_eq(st.failed_steps, 0);
	ov_check(&e);
	ov_env_fini(&e);
	load_free(&L);
}

Test(overlap, a_stop_in_the_step_in_flight_discards_the_next_token_and_counts_it)
{
	ov_opts o;
	ov_env e;
	kh_req r;
	int32_t p[5] = {300, 301, 302, 303, 304};
	bkv_sched_stats st;

	ov_opts_init(&o);
	ov_env_init(&e, &o);
	cr_assert_eq(kh_req_init(&r, 9, p, 5, 20, 1), 0);
	r.stop_after = 4;
	r.stop[0] = KH_STOP;
	r.n_stop = 1;
	cr_assert_eq(kh_submit(e.s, &r, 0), BKV_OK);
	ov_run(&e, 200);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(e.s, &st);
	cr_assert_eq(r.finished, 1);
	cr_assert_eq(r.reason, BKV_FINISH_STOP);
	cr_assert_eq(r.n_out[0], 4, "the stop token is the last delivered");
	cr_assert_eq(st.overlap_wasted_tokens, 1, "one row after the stop was computed");
	cr_assert_eq(st.prefill_tokens, 5);
	cr_assert_eq(st.decode_tokens, 3, "the delivered tokens after the prefill's, not the "
		     "discarded one");
	ov_env_fini(&e);
	kh_req_fini(&r);
}

Test(overlap, a_length_end_is_known_at_plan_time_and_wastes_nothing)
{
	ov_opts o;
	ov_env e;
	kh_req r[3];
	int32_t p[3] = {400, 401, 402};
	bkv_sched_stats st;
	uint32_t i;

	ov_opts_init(&o);
	ov_env_init(&e, &o);
	for (i = 0; i < 3; i++) {
		cr_assert_eq(kh_req_init(&r[i], 20 + i, p, 3, 1 + 3 * i, 1), 0);
		cr_assert_eq(kh_submit(e.s, &r[i], 0), BKV_OK);
	}
	ov_run(&e, 200);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(e.s, &st);
	for (i = 0; i < 3; i++) {
		cr_assert_eq(r[i].reason, BKV_FINISH_LENGTH);
		cr_assert_eq(r[i].n_out[0], 1 + 3 * i);
		kh_req_fini(&r[i]);
	}
	cr_assert_eq(st.overlap_wasted_tokens, 0);
	cr_assert_gt(st.overlap_steps, 3);
	ov_env_fini(&e);
}

/* The model check, one configuration: the same workload through bkv_step and
 * through the two-phase loop delivers the same tokens and reasons. */
static uint64_t preempted, swapped, aborted, failed; /* over model checks */
/* speculation, over model checks: both runs' fake hosts draft with this
 * accuracy (BKV_SPEC_DRAFT_HOST) and accept greedily themselves or not; the
 * overlapped runs' counters */
static uint32_t spec_permille = 700;
static int spec_host_accepts;
static bkv_sched_stats spec_sum;
/* persistent layout, over model checks: deltas the fake host mirrored,
 * failed calls whose deltas it undid (a host that discards them; the others
 * it keeps, and launches after a device failure it never applies) */
static uint64_t mirrored, undone, opened;
static uint64_t grp_checked; /* KV groups: context cells checked, over model checks */
static uint32_t deepest; /* steps in flight at a launch, at most, over model checks */
/* a STATE group, over model checks: states read and checked (both runs),
 * checkpoint hits of the overlapped runs */
static uint64_t st_checked, st_hits;

static void model_check(ov_opts *o, uint32_t n, uint64_t seed, int forks, int fails,
			uint32_t fail_permille, uint32_t abort_permille, uint64_t *overlapped)
{
	ov_env a, b;
	ov_load La, Lb;
	bkv_sched_stats st;

	o->cfg.overlap = ov_depth;
	ov_env_init(&a, o);
	a.h.kh.spec_accept_permille = spec_permille;
	a.h.kh.spec_host_accepts = spec_host_accepts;
	load_make(&La, n, seed, forks, fails);
	load_submit(&a, &La);
	sync_run(&a, 20000);

	ov_env_init(&b, o);
	b.h.kh.spec_accept_permille = spec_permille;
	b.h.kh.spec_host_accepts = spec_host_accepts;
	b.h.kh.fail_permille = fail_permille;
	b.h.kh.rng = seed * 2654435761u + 1;
	b.abort_permille = abort_permille;
	b.rng ^= seed;
	load_make(&Lb, n, seed, forks, fails);
	load_submit(&b, &Lb);
	ov_run(&b, 40000);
	load_same(&La, &Lb);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(b.s, &st);
	cr_assert_eq(st.finished, n);
	if (overlapped)
		*overlapped += st.overlap_steps;
	preempted += st.preemptions;
	swapped += st.swaps;
	aborted += st.aborted;
	failed += st.failed_steps;
	spec_sum.spec_rows += st.spec_rows;
	spec_sum.spec_accepted += st.spec_accepted;
	spec_sum.overlap_steps += st.overlap_steps;
	spec_sum.overlap_spec_waits += st.overlap_spec_waits;
	spec_sum.overlap_spec_undrafted += st.overlap_spec_undrafted;
	spec_sum.overlap_spec_idle += st.overlap_spec_idle;
	if (getenv("OV_DEBUG"))
		fprintf(stderr, "seed %llu: steps %llu overlapped %llu syncs %llu wasted %llu failed %llu preempt %llu swaps %llu aborted %llu hits %llu\n",
			(unsigned long long)seed, (unsigned long long)st.steps,
			(unsigned long long)st.overlap_steps, (unsigned long long)st.overlap_syncs,
			(unsigned long long)st.overlap_wasted_tokens, (unsigned long long)st.failed_steps,
			(unsigned long long)st.preemptions, (unsigned long long)st.swaps,
			(unsigned long long)st.aborted, (unsigned long long)st.hit_tokens);
	if (getenv("OV_DEBUG") && o->cfg.spec_max_k)
		fprintf(stderr, "  spec rows %llu drafted %llu accepted %llu waits %llu undrafted %llu idle %llu\n",
			(unsigned long long)st.spec_rows, (unsigned long long)st.spec_drafted,
			(unsigned long long)st.spec_accepted, (unsigned long long)st.overlap_spec_waits,
			(unsigned long long)st.overlap_spec_undrafted,
			(unsigned long long)st.overlap_spec_idle);
	ov_check(&b);
	grp_checked += a.h.grp_reads + b.h.grp_reads;
	st_checked += a.h.st_reads + b.h.st_reads;
	{
		bkv_pool_stats ps;

		memset(&ps, 0, sizeof(ps));
		ps.size = sizeof(ps);
		bkv_pool_stats_get(b.pool, &ps);
		st_hits += ps.state_hits;
	}
	mirrored += b.h.kh.deltas_applied;
	undone += b.h.kh.undone_calls;
	if (b.h.max_in_flight > deepest)
		deepest = b.h.max_in_flight;
	opened += b.h.slots_opened;
	if (o->cfg.batch_layout == BKV_BATCH_PERSISTENT)
		cr_assert_gt(b.h.kh.deltas_applied, 0, "the host mirrored no delta");
	ov_env_fini(&a);
	ov_env_fini(&b);
	load_free(&La);
	load_free(&Lb);
}

Test(overlap, delivers_the_tokens_of_a_synchronous_run)
{
	ov_opts o;
	uint64_t ov = 0;

	ov_opts_init(&o);
	model_check(&o, 60, 1, 0, 0, 0, 0, &ov);
	cr_assert_gt(ov, 50);
}

Test(overlap, forks_chunked_prefill_and_prefix_hits_deliver_the_synchronous_tokens)
{
	ov_opts o;
	uint64_t ov = 0, seed;

	for (seed = 1; seed <= 6; seed++) {
		ov_opts_init(&o);
		o.cfg.chunked_prefill = 1;
		o.cfg.token_budget = 24 + 8 * (uint32_t)seed;
		o.bt = seed % 2 ? 4 : 1;
		model_check(&o, 50, seed, 1, 0, 0, 0, &ov);
	}
	cr_assert_gt(ov, 100);
}

Test(overlap, preemption_and_swap_in_a_small_pool_deliver_the_synchronous_tokens)
{
	ov_opts o;
	uint64_t ov = 0, seed;
	bkv_preempt_mode modes[3] = {BKV_PREEMPT_RECOMPUTE, BKV_PREEMPT_SWAP, BKV_PREEMPT_AUTO};

	load_max_new = 60; /* long decodes outgrow the pool */
	load_stop_mod = 97;
	for (seed = 1; seed <= 6; seed++) {
		ov_opts_init(&o);
		o.nb = 56 + 4 * (uint32_t)seed; /* a few requests' histories */
		o.nh = 64;
		o.cfg.preempt = modes[seed % 3];
		o.cfg.chunked_prefill = seed % 2;
		o.cfg.token_budget = 32;
		model_check(&o, 40, seed + 10, 1, 0, 0, 0, &ov);
	}
	cr_assert_gt(ov, 50);
	cr_assert_gt(preempted, 20);
	cr_assert_gt(swapped, 5);
}

Test(overlap, failed_steps_roll_back_every_outstanding_step_and_rerun)
{
	ov_opts o;
	uint64_t ov = 0, seed;

	load_max_new = 48; /* with preemptions */
	load_stop_mod = 31;
	for (seed = 1; seed <= 6; seed++) {
		ov_opts_init(&o);
		o.nb = 48 + 4 * (uint32_t)seed;
		o.nh = seed % 2 ? 32 : 0;
		o.cfg.chunked_prefill = seed % 2;
		o.cfg.token_budget = 32;
		model_check(&o, 40, seed + 20, 1, 1, 60, 0, &ov);
	}
	cr_assert_gt(ov, 50);
	cr_assert_gt(failed, 20);
	cr_assert_gt(preempted, 3);
	if (o.cfg.batch_layout == BKV_BATCH_PERSISTENT)
		cr_assert_gt(undone, 3); /* both host behaviours after a failure */
}

Test(overlap, persistent_layout_reopens_a_released_slot_only_after_the_steps_that_read_it)
{
	ov_opts o;
	uint64_t ov = 0, seed, m0 = mirrored;

	load_max_new = 12; /* short requests: slots churn */
	load_stop_mod = 5;
	for (seed = 1; seed <= 4; seed++) {
		ov_opts_init(&o);
		o.cfg.batch_layout = BKV_BATCH_PERSISTENT;
		o.cfg.max_running = 2 + (uint32_t)seed % 2;
		o.nb = 64;
		o.nh = seed % 2 ? 16 : 0;
		o.cfg.chunked_prefill = 1;
		o.cfg.token_budget = 16;
		/* tokens equal a synchronous run's, the mirror equals the
		 * library's tables at every launch, no OPENED delta names a slot
		 * a step in flight reads (ov_check) */
		model_check(&o, 60, seed + 40, 1, 0, seed % 2 ? 20 : 0, 0, &ov);
	}
	cr_assert_gt(ov, 50);
	cr_assert_gt(opened, 100, "slots reopened: %llu", (unsigned long long)opened);
	cr_assert_gt(mirrored, m0);
}

Test(overlap, random_aborts_end_every_request_exactly_once)
{
	ov_opts o;
	uint64_t ov = 0, seed;

	load_max_new = 48; /* with preemptions */
	load_stop_mod = 31;
	for (seed = 1; seed <= 6; seed++) {
		ov_opts_init(&o);
		o.nb = 48 + 4 * (uint32_t)seed;
		o.nh = 32;
		o.cfg.chunked_prefill = seed % 2;
		o.cfg.token_budget = 32;
		model_check(&o, 40, seed + 30, 1, 1, 30, 300, &ov);
	}
	cr_assert_gt(ov, 50);
	cr_assert_gt(aborted, 20);
}

/* ---- KV groups ------------------------------------------------------------- */

/* Group 1 of a two-group pool: full attention and kind with span. */
static void grp_opts(ov_opts *o, uint32_t kind, uint32_t span)
{
	o->n_groups = 2;
	o->groups[0] = (bkv_kv_group){BKV_GROUP_FULL, 1, 0, 0, 64};
	o->groups[1] = (bkv_kv_group){kind, 1, span, 0, 64};
}

/* A model check in a pool with a window or chunked group: the synchronous
 * run and the overlapped one both go through the group checks (ov_check). */
static void grp_model_check(ov_opts *o, uint32_t n, uint64_t seed, int forks, int fails,
			    uint32_t fail_permille, uint32_t abort_permille, uint64_t *overlapped)
{
	grp_opts(o, seed % 2 ? BKV_GROUP_WINDOW : BKV_GROUP_CHUNKED,
		 (uint32_t[]){1, 3, 4, 5, 8, 13}[seed % 6]);
	model_check(o, n, seed, forks, fails, fail_permille, abort_permille, overlapped);
}

Test(overlap_groups, window_and_chunked_groups_deliver_the_synchronous_tokens)
{
	ov_opts o;
	uint64_t ov = 0, seed, c0 = grp_checked;

	for (seed = 1; seed <= 8; seed++) {
		ov_opts_init(&o);
		o.cfg.chunked_prefill = seed % 3 != 0;
		o.cfg.token_budget = 24 + 8 * (uint32_t)seed;
		o.bt = seed % 4 == 1 ? 1 : 4;
		grp_model_check(&o, 50, seed, 1, 0, 0, 0, &ov);
	}
	cr_assert_gt(ov, 100);
	cr_assert_gt(grp_checked, c0 + 1000, "group context cells checked: %llu",
		     (unsigned long long)(grp_checked - c0));
}

Test(overlap_groups, failed_steps_preemption_and_swap_restore_every_group)
{
	ov_opts o;
	uint64_t ov = 0, seed, f0 = failed, p0 = preempted, s0 = swapped;
	bkv_preempt_mode modes[3] = {BKV_PREEMPT_RECOMPUTE, BKV_PREEMPT_SWAP, BKV_PREEMPT_AUTO};

	load_max_new = 48;
	load_stop_mod = 31;
	for (seed = 1; seed <= 8; seed++) {
		ov_opts_init(&o);
		o.nb = 44 + 4 * (uint32_t)seed; /* a few requests. histories */
		o.nh = seed % 2 ? 48 : 0;
		o.cfg.preempt = o.nh ? modes[seed % 3] : BKV_PREEMPT_RECOMPUTE;
		o.cfg.chunked_prefill = seed % 2;
		o.cfg.token_budget = 32;
		grp_model_check(&o, 40, seed + 60, 1, 1, 60, seed % 3 ? 0 : 200, &ov);
	}
	cr_assert_gt(ov, 50);
	cr_assert_gt(failed, f0 + 20);
	cr_assert_gt(preempted, p0 + 8);
	cr_assert_gt(swapped, s0 + 3);
}

/* Every group kind is accepted with overlap: full, window, and a STATE
 * group after them. */
Test(overlap_groups, every_group_kind_is_accepted)
{
	bkv_kv_group g[3] = {{BKV_GROUP_FULL, 1, 0, 0, 64}, {BKV_GROUP_WINDOW, 1, 8, 0, 64},
			     {BKV_GROUP_STATE, 1, 16, 0, 64}};
	bkv_pool_config pc;
	bkv_sched_config c;
	bkv_host_ops ops = kh_ops(0);
	bkv_pool *pool;
	bkv_sched *s = NULL;
	uint32_t n;

	ops.launch = ov_launch;
	bkv_sched_config_init(&c);
	c.overlap = 1;
	for (n = 2; n <= 3; n++) {
		bkv_pool_config_init(&pc);
		pc.block_tokens = 4;
		pc.device_blocks = 256;
		pc.max_seqs = 16;
		pc.n_groups = n;
		pc.groups = g;
		cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
		cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_OK);
		bkv_sched_destroy(s);
		bkv_pool_destroy(pool);
	}
}

/* ---- a STATE group ---------------------------------------------------------
 *
 * Full attention and a recurrent STATE group (a window between them for
 * some seeds), checkpoints every 1 to 3 blocks: a step planned while one is
 * in flight reads the state unit the step in flight writes and writes a
 * second one, and a failed completion restores the state before both. The
 * fake device checks every state a row reads (its history and length, not
 * a failing call's) and that no launch writes a unit the step in flight
 * names (ov_check); tokens equal a synchronous run's. */

/* Groups and room: attention blocks for the requests plus the state arena
 * (units for three states per running sequence and cached checkpoints). */
static void st_opts(ov_opts *o, uint64_t seed, uint32_t att_blocks)
{
	uint32_t k;

	o->n_groups = 0;
	o->groups[o->n_groups++] = (bkv_kv_group){BKV_GROUP_FULL, 1, 0, 0, 64};
	if (seed % 4 == 3)
		o->groups[o->n_groups++] =
			(bkv_kv_group){BKV_GROUP_WINDOW, 1, 1 + (uint32_t)seed % 9, 0, 64};
	o->groups[o->n_groups++] =
		(bkv_kv_group){BKV_GROUP_STATE, 1, o->bt * (1 + (uint32_t)seed % 3), 0, 64 * o->bt};
	o->state_share = seed % 5 == 2;
	o->state_units = (ov_depth + 2) * o->cfg.max_running + 16;
	k = bkv_kv_state_frames(o->groups, o->n_groups, o->bt);
	o->nb = att_blocks * (o->n_groups - 1) + o->state_units * k;
}

Test(overlap_state, full_and_state_groups_deliver_the_synchronous_tokens)
{
	ov_opts o;
	uint64_t ov = 0, seed, c0 = st_checked, h0 = st_hits;

	load_max_new = 24;
	load_stop_mod = 11;
	for (seed = 1; seed <= 10; seed++) {
		ov_opts_init(&o);
		o.cfg.chunked_prefill = seed % 3 != 0;
		o.cfg.token_budget = 24 + 8 * (uint32_t)seed;
		o.bt = seed % 4 == 1 ? 1 : 4;
		st_opts(&o, seed, 256);
		model_check(&o, 50, seed, 1, 0, 0, 0, &ov);
	}
	cr_assert_gt(ov, 100);
	cr_assert_gt(st_checked, c0 + 2000, "states checked: %llu",
		     (unsigned long long)(st_checked - c0));
	cr_assert_gt(st_hits, h0 + 20, "prefix hits at checkpoints: %llu",
		     (unsigned long long)(st_hits - h0));
}

Test(overlap_state, failed_steps_preemption_and_swap_restore_the_states)
{
	ov_opts o;
	uint64_t ov = 0, seed, f0 = failed, p0 = preempted, s0 = swapped, a0 = aborted;
	bkv_preempt_mode modes[3] = {BKV_PREEMPT_RECOMPUTE, BKV_PREEMPT_SWAP, BKV_PREEMPT_AUTO};

	load_max_new = 48;
	load_stop_mod = 31;
	for (seed = 1; seed <= 10; seed++) {
		ov_opts_init(&o);
		o.nh = seed % 2 ? 48 : 0;
		o.cfg.preempt = o.nh ? modes[seed % 3] : BKV_PREEMPT_RECOMPUTE;
		o.cfg.chunked_prefill = seed % 2;
		o.cfg.token_budget = 32;
		st_opts(&o, seed, 44 + 4 * (uint32_t)seed); /* a few requests' histories */
		model_check(&o, 40, seed + 60, 1, 1, 60, seed % 3 ? 0 : 200, &ov);
	}
	cr_assert_gt(ov, 50);
	cr_assert_gt(failed, f0 + 20);
	cr_assert_gt(preempted, p0 + 8);
	cr_assert_gt(swapped, s0 + 3);
	cr_assert_gt(aborted, a0 + 5);
}

Test(overlap_state, speculation_writes_per_token_states_and_matches_the_synchronous_run)
{
	ov_opts o;
	uint64_t ov = 0, seed, f0 = failed;

	memset(&spec_sum, 0, sizeof(spec_sum));
	spec_branches_race = 1;
	load_max_new = 40;
	load_stop_mod = 29;
	for (seed = 1; seed <= 8; seed++) {
		ov_opts_init(&o);
		o.cfg.spec_max_k = 2 + (uint32_t)seed % 4;
		o.cfg.spec_k_mode = seed % 2 ? BKV_SPEC_K_FIXED : BKV_SPEC_K_AUTO;
		o.cfg.spec_drafts = seed % 4 == 3 ? BKV_SPEC_DRAFT_NGRAM : BKV_SPEC_DRAFT_HOST;
		o.cfg.chunked_prefill = seed % 2;
		o.cfg.token_budget = 32;
		/* per-token states: k more units per speculated row */
		o.cfg.max_running = 4;
		st_opts(&o, seed, seed % 2 ? 256 : 60);
		o.state_units += 4 * 6;
		o.nb += 4 * 6 * bkv_kv_state_frames(o.groups, o.n_groups, o.bt);
		spec_host_accepts = (seed >> 1) % 2;
		spec_permille = 500 + 100 * (uint32_t)(seed % 5);
		model_check(&o, 40, seed + 400, 1, seed % 2 == 0, seed % 2 ? 0 : 40, 0, &ov);
	}
	spec_host_accepts = 0;
	spec_permille = 700;
	spec_branches_race = 0;
	cr_assert_gt(ov, 50);
	cr_assert_gt(spec_sum.spec_rows, 100, "rows with drafts: %llu",
		     (unsigned long long)spec_sum.spec_rows);
	cr_assert_gt(spec_sum.spec_accepted, 50);
	cr_assert_gt(spec_sum.overlap_spec_waits, 20, "lanes waited for their drafts");
	cr_assert_gt(failed, f0 + 5);
}

/* One request in decode over full + STATE, and two steps outstanding: the
 * launch planned on the step in flight reads the unit that step writes and
 * writes a third. Returns the three units and the first step's position. */
typedef struct st_pair {
	uint64_t t1, t2;
	int32_t in0, out0, out1;
	int32_t pos0;
} st_pair;

static void st_env(ov_env *e, kh_req *r, const int32_t *p, uint32_t n)
{
	ov_opts o;

	ov_opts_init(&o);
	o.cfg.max_running = 2;
	st_opts(&o, 1, 64);
	ov_env_init(e, &o);
	cr_assert_eq(kh_req_init(r, 4242, p, n, 20, 1), 0);
	cr_assert_eq(kh_submit(e->s, r, 0), BKV_OK);
	while (r->n_out[0] < 3) { /* into decode, nothing outstanding */
		cr_assert(ov_iter(e));
		if (r->n_out[0] >= 3)
			ov_complete_all(e);
	}
	cr_assert_eq(e->n_q, 0);
}

static void st_launch2(ov_env *e, st_pair *sp)
{
	const bkv_batch_group *G;

	cr_assert_eq(bkv_step_launch(e->s, &sp->t1, NULL), BKV_OK);
	e->q[e->n_q++] = sp->t1;
	G = st_group(&e->h.dev_batch[e->h.dev_head]);
	cr_assert(G && e->h.dev_batch[e->h.dev_head].n_rows == 1);
	sp->in0 = G->state_in[0];
	sp->out0 = G->state_out[0];
	sp->pos0 = e->h.dev_batch[e->h.dev_head].positions[0];
	cr_assert_eq(bkv_step_launch(e->s, &sp->t2, NULL), BKV_OK);
	e->q[e->n_q++] = sp->t2;
	G = st_group(&e->h.dev_batch[(e->h.dev_head + 1) % OV_DEPTH]);
	cr_assert(G && e->h.dev_batch[(e->h.dev_head + 1) % OV_DEPTH].n_rows == 1);
	cr_assert_eq(G->state_in[0], sp->out0, "the later step reads what the one in flight writes");
	sp->out1 = G->state_out[0];
	cr_assert(sp->out1 >= 0 && sp->out1 != sp->out0 && sp->out1 != sp->in0,
		  "a second unit: %d after %d from %d", sp->out1, sp->out0, sp->in0);
	cr_assert_eq(bkv_sched_check(e->s), 0);
}

/* The next launch's row: its position and the unit it reads. */
static void st_next_row(ov_env *e, int32_t *pos, int32_t *in)
{
	uint64_t t = 0;
	const bkv_batch_group *G;

	cr_assert_eq(bkv_step_launch(e->s, &t, NULL), BKV_OK);
	cr_assert(t);
	e->q[e->n_q++] = t;
	G = st_group(&e->h.dev_batch[e->h.dev_head]);
	*pos = e->h.dev_batch[e->h.dev_head].positions[0];
	*in = G->state_in[0];
	ov_complete_all(e);
}

/* A failed completion of the step in flight fails the one planned on it
 * too: both steps' state advance is undone, and the request goes on from
 * the state before the first (the device computed both correctly and
 * reported the first failed late, so only the units tell). */
Test(overlap_state, a_failed_completion_undoes_two_steps_of_state)
{
	int32_t p[10] = {300, 301, 302, 303, 304, 305, 306, 307, 308, 309}, pos, in;
	ov_env e;
	kh_req r;
	st_pair sp;
	bkv_sched_stats st;

	st_env(&e, &r, p, 10);
	st_launch2(&e, &sp);
	e.h.dev_failed[e.h.dev_head] = 1; /* reported failed at completion */
	cr_assert_eq(ov_complete1(&e), BKV_EHOST);
	cr_assert_eq(ov_complete1(&e), BKV_EHOST, "the later step fails with it");
	ov_check(&e);
	cr_assert_eq(bkv_pool_check(e.pool), 0);
	st_next_row(&e, &pos, &in);
	cr_assert_eq(pos, sp.pos0, "the rerun starts where the first failed step did");
	cr_assert_eq(in, sp.in0, "from the state before both steps");
	ov_check(&e);
	ov_run(&e, 200);
	cr_assert_eq(r.finished, 1);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(e.s, &st);
	cr_assert_eq(st.failed_steps, 2);
	cr_assert_eq(bkv_pool_check(e.pool), 0);
	ov_env_fini(&e);
	kh_req_fini(&r);
}

/* The step in flight commits and the one planned on it fails: the state
 * the first one wrote is kept (committed), the second one's is undone. */
Test(overlap_state, a_failed_later_step_keeps_the_state_the_committed_one_wrote)
{
	int32_t p[10] = {400, 401, 402, 403, 404, 405, 406, 407, 408, 409}, pos, in;
	ov_env e;
	kh_req r;
	st_pair sp;

	st_env(&e, &r, p, 10);
	st_launch2(&e, &sp);
	cr_assert_eq(ov_complete1(&e), BKV_OK);
	cr_assert_eq(bkv_sched_check(e.s), 0);
	e.h.dev_failed[e.h.dev_head] = 1;
	cr_assert_eq(ov_complete1(&e), BKV_EHOST);
	ov_check(&e);
	cr_assert_eq(bkv_pool_check(e.pool), 0);
	st_next_row(&e, &pos, &in);
	cr_assert_eq(pos, sp.pos0 + 1, "the rerun starts after the committed step");
	cr_assert_eq(in, sp.out0, "from the state the committed step wrote");
	ov_check(&e);
	ov_run(&e, 200);
	cr_assert_eq(r.finished, 1);
	cr_assert_eq(bkv_pool_check(e.pool), 0);
	ov_env_fini(&e);
	kh_req_fini(&r);
}

Test(overlap, a_failed_launch_rolls_back_with_the_step_in_flight)
{
	ov_opts o;
	ov_env e;
	ov_load L;
	uint64_t t1 = 0, t2 = 7;
	bkv_sched_stats st;
	uint32_t i;

	ov_opts_init(&o);
	ov_env_init(&e, &o);
	load_make(&L, 4, 3, 0, 0);
	load_submit(&e, &L);
	for (i = 0; i < 3; i++) /* into decode */
		cr_assert(ov_iter(&e));
	cr_assert_eq(e.n_q, 1);
	e.h.fail_launch_at = e.h.launches + 1;
	cr_assert_eq(bkv_step_launch(e.s, &t2, NULL), BKV_EHOST);
	cr_assert_eq(t2, 0);
	cr_assert_eq(bkv_step_launch(e.s, &t1, NULL), BKV_ESTATE, "a failed step is outstanding");
	ov_check(&e);
	cr_assert_eq(ov_complete1(&e), BKV_EHOST, "the step in flight rolls back with it");
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(e.s, &st);
	cr_assert_eq(st.failed_steps, 2);
	ov_check(&e);
	ov_run(&e, 2000);
	for (i = 0; i < L.n; i++)
		cr_assert_eq(L.r[i].finished, 1);
	ov_env_fini(&e);
	load_free(&L);
}

Test(overlap, an_abort_while_in_flight_ends_once_and_keeps_its_blocks_until_the_step_completes)
{
	ov_opts o;
	ov_env e;
	kh_req r;
	int32_t p[9] = {500, 501, 502, 503, 504, 505, 506, 507, 508};
	uint64_t t = 0;
	bkv_pool_stats ps;
	uint32_t i;

	ov_opts_init(&o);
	ov_env_init(&e, &o);
	cr_assert_eq(kh_req_init(&r, 31, p, 9, 30, 1), 0);
	cr_assert_eq(kh_submit(e.s, &r, 0), BKV_OK);
	for (i = 0; i < 4; i++)
		cr_assert(ov_iter(&e));
	cr_assert_eq(e.n_q, 1);
	cr_assert_eq(kh_abort(e.s, &r, r.id), BKV_OK);
	/* the next launch ends it (ABORT) while its row of the step in flight
	 * still writes its blocks: the sequence stays open until that step
	 * completes */
	cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_OK);
	cr_assert_eq(t, 0, "nothing else to compute");
	cr_assert_eq(r.finished, 1);
	cr_assert_eq(r.reason, BKV_FINISH_ABORT);
	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(e.pool, &ps);
	cr_assert_eq(ps.nr_seqs, 1, "its sequence waits for the step in flight");
	ov_check(&e);
	ov_complete1(&e);
	bkv_pool_stats_get(e.pool, &ps);
	cr_assert_eq(ps.nr_seqs, 0, "released once the step completed");
	cr_assert_eq(r.finished, 1);
	ov_check(&e);
	ov_env_fini(&e);
	kh_req_fini(&r);
}

/* ---- speculative decoding ------------------------------------------------ */

/* Overlap with speculation against the synchronous speculating run: drafts
 * from the host (each right with spec_permille / 1000) or the n-gram lookup,
 * fixed or automatic k, greedy or host-reported acceptance. A lane whose row
 * in the step in flight carries drafts waits for its completion (no row in
 * the launch planned on it), and a row planned on a placeholder carries no
 * drafts; both are counted. The fake host checks every token, position,
 * slot and KV cell a row reads (the drafts' cells included), and the
 * launched arrays (row_drafts included) until each step completes. */
static void spec_model_check(uint32_t n_seeds, uint64_t seed0, uint32_t nb, uint32_t nh,
			     uint32_t fail_permille, uint32_t abort_permille)
{
	ov_opts o;
	uint64_t ov = 0, seed;

	memset(&spec_sum, 0, sizeof(spec_sum));
	spec_branches_race = 1;
	for (seed = seed0; seed < seed0 + n_seeds; seed++) {
		ov_opts_init(&o);
		o.nb = nb;
		o.nh = nh;
		o.bt = seed % 3 || nb < 256 ? 4 : 1;
		o.cfg.spec_max_k = 2 + (uint32_t)seed % 4;
		o.cfg.spec_k_mode = seed % 2 ? BKV_SPEC_K_FIXED : BKV_SPEC_K_AUTO;
		o.cfg.spec_drafts = seed % 4 == 3 ? BKV_SPEC_DRAFT_NGRAM : BKV_SPEC_DRAFT_HOST;
		o.cfg.chunked_prefill = seed % 2;
		o.cfg.token_budget = 32;
		o.cfg.preempt = nh && seed % 3 == 1 ? BKV_PREEMPT_SWAP : BKV_PREEMPT_RECOMPUTE;
		spec_host_accepts = (seed >> 1) % 2;
		spec_permille = 500 + 100 * (uint32_t)(seed % 5);
		model_check(&o, 40, seed, 1, fail_permille > 0, fail_permille, abort_permille, &ov);
	}
	spec_host_accepts = 0;
	spec_permille = 700;
	spec_branches_race = 0;
	cr_assert_gt(ov, 50);
	cr_assert_gt(spec_sum.spec_rows, 100, "rows with drafts: %llu",
		     (unsigned long long)spec_sum.spec_rows);
	cr_assert_gt(spec_sum.spec_accepted, 50);
	cr_assert_gt(spec_sum.overlap_spec_waits, 50, "lanes waited for their drafts");
	cr_assert_gt(spec_sum.overlap_spec_undrafted, 50, "rows on placeholders, undrafted");
}

Test(overlap, speculation_delivers_the_tokens_of_a_synchronous_speculating_run)
{
	load_max_new = 40;
	load_stop_mod = 29;
	spec_model_check(8, 100, 256, 0, 0, 0);
}

Test(overlap, speculation_with_preemption_swap_failed_steps_and_aborts_matches_the_synchronous_run)
{
	uint64_t f0 = failed, p0 = preempted, a0 = aborted;

	load_max_new = 48;
	load_stop_mod = 31;
	spec_model_check(8, 200, 60, 32, 50, 0);
	cr_assert_gt(failed, f0 + 20);
	cr_assert_gt(preempted, p0 + 3);
	spec_model_check(6, 300, 64, 32, 30, 300);
	cr_assert_gt(aborted, a0 + 20);
}

/* One request whose every draft is right, k 3. The launch planned on its
 * prompt's step holds the lane back (its placeholder would leave the next
 * row undrafted; 3 drafts at the prior acceptance are worth more than a
 * row). Then a launch with nothing in flight gives its row drafts, and the
 * launch planned on that step has nothing to compute (the lane waits for
 * the drafts' verdict): each wait and each empty launch is counted; the
 * host completes the step (k + 1 tokens) and launches again. */
Test(overlap, a_lane_with_drafts_in_flight_waits_and_the_empty_launch_is_counted)
{
	ov_opts o;
	ov_env e;
	kh_req r;
	int32_t p[6] = {500, 501, 502, 503, 504, 505};
	uint64_t t = 0, t2 = 0;
	bkv_sched_stats st;
	uint32_t i, out;

	ov_opts_init(&o);
	o.cfg.spec_max_k = 3;
	o.cfg.spec_k_mode = BKV_SPEC_K_FIXED;
	o.cfg.spec_drafts = BKV_SPEC_DRAFT_HOST;
	ov_env_init(&e, &o);
	e.h.kh.spec_accept_permille = 1000;
	cr_assert_eq(kh_req_init(&r, 41, p, 6, 30, 1), 0);
	r.stop_mod = 0;
	cr_assert_eq(kh_submit(e.s, &r, 0), BKV_OK);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_OK); /* the prompt */
	cr_assert_neq(t, 0);
	e.q[e.n_q++] = t;
	cr_assert_eq(bkv_step_launch(e.s, &t2, NULL), BKV_OK);
	cr_assert_eq(t2, 0, "held back from its placeholder, to draft");
	bkv_sched_stats_get(e.s, &st);
	cr_assert_eq(st.overlap_spec_waits, 1);
	cr_assert_eq(st.overlap_spec_idle, 1);
	ov_complete_all(&e);
	ov_check(&e);
	for (i = 0; i < 7; i++) { /* 1 + 7 x 4 tokens: the last row has no drafts */
		out = r.n_out[0];
		cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_OK); /* nothing in flight */
		cr_assert_neq(t, 0);
		e.q[e.n_q++] = t;
		ov_check(&e);
		cr_assert_eq(bkv_step_launch(e.s, &t2, NULL), BKV_OK);
		ov_check(&e);
		bkv_sched_stats_get(e.s, &st);
		cr_assert_eq(t2, 0, "its lane waits for the drafts in flight");
		cr_assert_eq(st.overlap_spec_idle, i + 2);
		cr_assert_eq(st.overlap_spec_waits, i + 2);
		ov_complete1(&e);
		ov_check(&e);
		cr_assert_eq(r.n_out[0], out + 4, "k + 1 tokens: %u after %u", r.n_out[0], out);
	}
	ov_run(&e, 20);
	cr_assert_eq(r.finished, 1);
	cr_assert_eq(r.reason, BKV_FINISH_LENGTH);
	cr_assert_eq(r.n_out[0], 30);
	bkv_sched_stats_get(e.s, &st);
	cr_assert_gt(st.spec_accepted, 20);
	cr_assert_eq(st.spec_accepted, st.spec_drafted);
	cr_assert_eq(st.overlap_spec_undrafted, 0, "no row was planned on a placeholder");
	{ /* and the metrics say so */
		static char m[32768];
		char want[96];

		cr_assert_lt(bkv_sched_metrics_prometheus(e.s, m, sizeof(m)), sizeof(m));
		snprintf(want, sizeof(want), "bkv_overlap_spec_fallbacks_total{kind=\"idle\"} %llu\n",
			 (unsigned long long)st.overlap_spec_idle);
		cr_assert(strstr(m, want), "metrics lack %s", want);
	}
	ov_check(&e);
	ov_env_fini(&e);
	kh_req_fini(&r);
}

Test(overlap, bad_calls_are_refused_and_change_nothing)
{
	ov_opts o;
	ov_env e;
	ov_load L;
	uint64_t t = 0, t2 = 0, t3 = 0;
	bkv_pool_config pc;
	bkv_pool *pool;
	bkv_sched *s = (bkv_sched *)0x1;
	bkv_host_ops ops;
	bkv_sched_config c;

	ov_opts_init(&o);
	ov_env_init(&e, &o);
	load_make(&L, 3, 4, 0, 0);
	load_submit(&e, &L);
	cr_assert_eq(bkv_step_launch(NULL, &t, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_step_launch(e.s, NULL, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_step_complete(NULL, 1, 0, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_step_complete(e.s, 1, 0, NULL), BKV_EINVAL, "nothing outstanding");
	cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_OK);
	cr_assert_neq(t, 0);
	cr_assert_eq(bkv_step(e.s, NULL), BKV_ESTATE, "bkv_step while a step is outstanding");
	cr_assert_eq(bkv_step_complete(e.s, t + 1, 0, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_step_launch(e.s, &t2, NULL), BKV_OK);
	cr_assert_eq(bkv_step_launch(e.s, &t3, NULL), BKV_ESTATE, "depth 1: two outstanding");
	cr_assert_eq(bkv_step_complete(e.s, t2, 0, NULL), BKV_EINVAL, "out of order");
	ov_check(&e);
	e.q[0] = t;
	e.q[1] = t2;
	e.n_q = 2;
	ov_complete_all(&e);
	ov_run(&e, 2000);
	ov_env_fini(&e);
	load_free(&L);

	/* overlap off: the two-phase calls are refused; overlap needs launch
	 * and the flat layout */
	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	ops = kh_ops(0);
	bkv_sched_config_init(&c);
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_OK);
	cr_assert_eq(bkv_step_launch(s, &t, NULL), BKV_ESTATE);
	cr_assert_eq(bkv_step_complete(s, 1, 0, NULL), BKV_ESTATE);
	bkv_sched_destroy(s);
	s = (bkv_sched *)0x1;
	c.overlap = 1;
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_EINVAL, "no launch");
	ops.launch = ov_launch;
	c.spec_max_k = 2; /* speculation: accepted */
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_OK);
	bkv_sched_destroy(s);
	c.spec_max_k = 0; /* the persistent layout: accepted */
	c.batch_layout = BKV_BATCH_PERSISTENT;
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_OK);
	bkv_sched_destroy(s);
	cr_assert_eq(bkv_pool_check(pool), 0);
	bkv_pool_destroy(pool);
}

/* A split host (prefill and decode, no forward) with overlap is refused: a
 * launch is one mixed call, so its prefill and decode would never be
 * called and bkv_step (which would need forward) never works. */
Test(overlap, a_split_host_is_refused)
{
	bkv_pool_config pc;
	bkv_pool *pool;
	bkv_sched *s = (bkv_sched *)0x1;
	bkv_host_ops ops;
	bkv_sched_config c;

	bkv_pool_config_init(&pc);
	pc.block_tokens = 4;
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	bkv_sched_config_init(&c);
	c.overlap = 1;
	ops = kh_ops(1);
	ops.launch = ov_launch;
	cr_assert(!ops.forward && ops.prefill && ops.decode);
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_EINVAL);
	cr_assert_eq(s, (bkv_sched *)0x1, "untouched");
	ops.decode = NULL; /* half a split host: refused as well */
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_EINVAL);
	ops.prefill = NULL; /* launch alone: accepted */
	cr_assert_eq(bkv_sched_create(&c, pool, &ops, NULL, NULL, &s), BKV_OK);
	bkv_sched_destroy(s);
	bkv_pool_destroy(pool);
}

/* A positive status is not defined: BKV_EINVAL and nothing changes (the
 * step stays outstanding, and a correct completion follows). */
Test(overlap, a_positive_status_is_refused_and_the_step_stays_outstanding)
{
	ov_opts o;
	ov_env e;
	ov_load L;
	uint64_t t = 0;
	bkv_sched_stats st = {.size = sizeof st};

	ov_opts_init(&o);
	ov_env_init(&e, &o);
	load_make(&L, 3, 4, 0, 0);
	load_submit(&e, &L);
	cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_OK);
	cr_assert_neq(t, 0);
	cr_assert_eq(bkv_step_complete(e.s, t, 1, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_step_complete(e.s, t, 7, NULL), BKV_EINVAL);
	cr_assert_eq(bkv_step(e.s, NULL), BKV_ESTATE, "still outstanding");
	bkv_sched_stats_get(e.s, &st);
	cr_assert_eq(st.failed_steps, 0);
	cr_assert_eq(st.steps, 0, "nothing committed");
	e.q[0] = t;
	e.n_q = 1;
	ov_complete_all(&e); /* the correct completion */
	bkv_sched_stats_get(e.s, &st);
	cr_assert_eq(st.steps, 1);
	cr_assert_eq(st.failed_steps, 0);
	ov_run(&e, 2000);
	ov_check(&e);
	ov_env_fini(&e);
	load_free(&L);
}

/* ---- no allocation in steady state -------------------------------------------- */

typedef struct count_alloc {
	uint64_t calls;
} count_alloc;

static void *ca_realloc(void *ud, void *p, size_t old, size_t size)
{
	(void)old;
	((count_alloc *)ud)->calls++;
	return realloc(p, size);
}

static void ca_free(void *ud, void *p, size_t size)
{
	(void)ud;
	(void)size;
	free(p);
}

Test(overlap, steady_state_launch_and_complete_allocate_nothing)
{
	ov_opts o;
	ov_env e;
	kh_req r[8];
	int32_t p[8][6];
	count_alloc ca = {0};
	bkv_allocator a;
	uint64_t before;
	uint32_t i, j;

	memset(&a, 0, sizeof(a));
	a.realloc = ca_realloc;
	a.free = ca_free;
	a.ud = &ca;
	ov_opts_init(&o);
	o.nb = 1024;
	o.alloc = &a;
	ov_env_init(&e, &o);
	for (i = 0; i < 8; i++) {
		for (j = 0; j < 6; j++)
			p[i][j] = 600 + (int32_t)(i * 6 + j);
		cr_assert_eq(kh_req_init(&r[i], 40 + i, p[i], 6, 400, 1), 0);
		cr_assert_eq(kh_submit(e.s, &r[i], 0), BKV_OK);
	}
	for (i = 0; i < 20; i++)
		cr_assert(ov_iter(&e));
	before = ca.calls;
	for (i = 0; i < 300; i++)
		cr_assert(ov_iter(&e));
	cr_assert_eq(ca.calls, before, "%llu allocations in 300 steady steps",
		     (unsigned long long)(ca.calls - before));
	ov_run(&e, 2000);
	ov_env_fini(&e);
	for (i = 0; i < 8; i++)
		kh_req_fini(&r[i]);
}

/* ---- aborts from another thread ----------------------------------------------- */

typedef struct abort_ctx {
	ov_env *e;
	kh_req *r;
	uint32_t n;
	int stop;
} abort_ctx;

static void *aborter(void *arg)
{
	abort_ctx *c = arg;
	uint64_t x = 12345;

	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		kh_req *r = &c->r[xs(&x) % c->n];
		uint64_t id = __atomic_load_n(&r->id, __ATOMIC_ACQUIRE);

		if (id && xs(&x) % 4 == 0)
			(void)kh_abort(c->e->s, r, id);
		sched_yield();
	}
	return NULL;
}

Test(overlap, aborts_from_another_thread_end_every_request_once)
{
	ov_opts o;
	ov_env e;
	ov_load L;
	abort_ctx c;
	pthread_t th;
	uint32_t i;

	ov_opts_init(&o);
	o.nb = 96;
	o.nh = 32;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 32;
	ov_env_init(&e, &o);
	load_make(&L, 120, 77, 1, 0);
	c.e = &e;
	c.r = L.r;
	c.n = L.n;
	c.stop = 0;
	cr_assert_eq(pthread_create(&th, NULL, aborter, &c), 0);
	load_submit(&e, &L);
	ov_run(&e, 40000);
	__atomic_store_n(&c.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	for (i = 0; i < L.n; i++)
		cr_assert_eq(L.r[i].finished, 1);
	ov_check(&e);
	ov_env_fini(&e);
	load_free(&L);
}

/* A placeholder's block gets the real token before it is hashed: a later
 * prompt that repeats a finished request's generated tokens hits them. */
/* With group (a second group's kind, BKV_GROUP_FULL for none), its span. */
static void real_ids(uint32_t group, uint32_t span)
{
	ov_opts o;
	ov_env e;
	kh_req a, b;
	int32_t pa[8] = {700, 701, 702, 703, 704, 705, 706, 707}, pb[20];
	bkv_sched_stats st;
	uint32_t i;

	ov_opts_init(&o);
	if (group != BKV_GROUP_FULL) /* each group's blocks carry the real ids */
		grp_opts(&o, group, span);
	ov_env_init(&e, &o);
	cr_assert_eq(kh_req_init(&a, 51, pa, 8, 12, 1), 0);
	cr_assert_eq(kh_submit(e.s, &a, 0), BKV_OK);
	ov_run(&e, 200);
	cr_assert_eq(a.n_out[0], 12);
	memset(&st, 0, sizeof(st));
	st.size = sizeof(st);
	bkv_sched_stats_get(e.s, &st);
	cr_assert_gt(st.overlap_steps, 5, "its generated tokens were placeholders first");
	cr_assert_eq(st.hit_tokens, 0);
	for (i = 0; i < 18; i++)
		pb[i] = kh_token_at(&a, 0, i);
	pb[18] = 900;
	pb[19] = 901;
	cr_assert_eq(kh_req_init(&b, 52, pb, 20, 2, 1), 0);
	cr_assert_eq(kh_submit(e.s, &b, 0), BKV_OK);
	ov_run(&e, 200);
	bkv_sched_stats_get(e.s, &st);
	/* a's KV covers positions 0..18: four full blocks of 4 */
	cr_assert_eq(st.hit_tokens, 16, "hits %llu", (unsigned long long)st.hit_tokens);
	ov_check(&e);
	ov_env_fini(&e);
	kh_req_fini(&a);
	kh_req_fini(&b);
}

/* The host cache demotes what the device cache evicts: in a warm, churning
 * pool nearly every step leaves demotion copies pending. The step in
 * flight's are held apart while the next is planned (their own demotions
 * go to a new list), so the launches keep overlapping; the tokens are a
 * synchronous run's and the host cache still fills and serves hits. */
/* A host-cache run: 80 requests over nb device blocks and 256 host blocks
 * at depth `depth`, to the end; its stats, with demotions (checked). */
static void host_cache_run(ov_env *e, ov_load *L, uint32_t nb, uint32_t depth,
			   bkv_sched_stats *st, bkv_pool_stats *ps)
{
	ov_opts o;

	ov_opts_init(&o);
	o.nb = nb;
	o.nh = 256;
	o.host_cache = 1;
	o.cfg.overlap = depth;
	ov_env_init(e, &o);
	load_make(L, 80, 61, 0, 0);
	load_submit(e, L);
	ov_run(e, 40000);
	memset(st, 0, sizeof(*st));
	st->size = sizeof(*st);
	bkv_sched_stats_get(e->s, st);
	memset(ps, 0, sizeof(*ps));
	ps->size = sizeof(*ps);
	bkv_pool_stats_get(e->pool, ps);
	cr_assert_gt(ps->host_demoted, 20, "demotions: %llu", (unsigned long long)ps->host_demoted);
}

Test(overlap, host_cache_demotions_keep_the_launches_overlapped)
{
	ov_opts o;
	uint64_t ov = 0, seed, s0 = 0, st0 = 0;
	ov_env e;
	ov_load L;
	bkv_sched_stats st;
	bkv_pool_stats ps;

	load_max_new = 16;
	load_stop_mod = 97;
	for (seed = 1; seed <= 4; seed++) {
		ov_opts_init(&o);
		o.nb = 64; /* the prefixes outgrow it: evictions, demotions */
		o.nh = 256;
		o.host_cache = 1;
		o.cfg.chunked_prefill = seed % 2;
		o.cfg.token_budget = 48;
		model_check(&o, 80, seed + 60, 1, 0, seed > 2 ? 30 : 0, 0, &ov);
	}
	/* one run looked at closely: its launches and the host cache */
	host_cache_run(&e, &L, 64, 1, &st, &ps);
	s0 = st.overlap_syncs;
	st0 = st.overlap_steps;
	if (getenv("OV_DEBUG"))
		fprintf(stderr, "syncs %llu overlapped %llu demoted %llu host hits %llu\n", (unsigned long long)s0, (unsigned long long)st0, (unsigned long long)ps.host_demoted, (unsigned long long)ps.host_hit_blocks);
	cr_assert_lt(10 * s0, st0, "%llu synchronous launches against %llu overlapped",
		     (unsigned long long)s0, (unsigned long long)st0);
	ov_check(&e);
	ov_env_fini(&e);
	load_free(&L);
}

Test(overlap, generated_tokens_enter_the_prefix_cache_under_their_real_ids)
{
	real_ids(BKV_GROUP_FULL, 0);
}

Test(overlap_groups, generated_tokens_enter_every_groups_prefix_cache_under_their_real_ids)
{
	real_ids(BKV_GROUP_WINDOW, 4);
	real_ids(BKV_GROUP_CHUNKED, 8);
}

/* A host may tear down with steps launched and never completed (a device
 * lost mid-step). The steps count as failed: the pool leaves its step
 * transaction, nothing they computed is indexed, and the pool serves a
 * new scheduler. */
Test(overlap, destroying_with_launched_steps_leaves_the_pool_usable)
{
	ov_opts o;
	ov_env e;
	ov_load L, L2;
	bkv_host_ops ops;
	bkv_pool_stats ps;
	int32_t toks[6] = {1, 2, 3, 4, 5, 6};
	uint32_t seq, hit = 0, i;
	uint64_t t;
	int rc;

	ov_opts_init(&o);
	ov_env_init(&e, &o);
	load_make(&L, 6, 5, 1, 0);
	load_submit(&e, &L);
	for (i = 0; i < 3; i++) /* into decode, one step in flight */
		cr_assert(ov_iter(&e));
	cr_assert_eq(e.n_q, 1);
	cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_OK);
	cr_assert_neq(t, 0, "a second step planned on the one in flight");
	bkv_sched_destroy(e.s);
	e.s = NULL;
	cr_assert_eq(bkv_pool_check(e.pool), 0);
	memset(&ps, 0, sizeof(ps));
	ps.size = sizeof(ps);
	bkv_pool_stats_get(e.pool, &ps);
	cr_assert_eq(ps.nr_seqs, 0, "every sequence of the scheduler dropped");
	cr_assert_eq(ps.nr_used, 0, "no block held");
	cr_assert_eq(bkv_seq_open(e.pool, &seq), BKV_OK);
	cr_assert_eq(bkv_seq_append(e.pool, seq, toks, 6, &hit), BKV_OK,
		     "the pool is out of the step transaction");
	cr_assert_eq(bkv_seq_drop(e.pool, seq), BKV_OK);
	/* a new scheduler on the same pool runs a load to the end */
	ops = kh_ops(0);
	ops.forward = ov_forward;
	ops.launch = ov_launch;
	e.h.dev_n = 0;
	e.n_q = 0;
	e.h.prev_failed = 0;
	rc = bkv_sched_create(&o.cfg, e.pool, &ops, &e.h, NULL, &e.s);
	cr_assert_eq(rc, BKV_OK, "sched: %s", bkv_strerror(rc));
	load_make(&L2, 6, 6, 1, 0);
	for (i = 0; i < L2.n; i++)
		L2.r[i].tag += 100;
	load_submit(&e, &L2);
	ov_run(&e, 2000);
	for (i = 0; i < L2.n; i++)
		cr_assert_eq(L2.r[i].finished, 1);
	ov_check(&e);
	ov_env_fini(&e);
	load_free(&L);
	load_free(&L2);
}

/* A stale rollback record: launch N, with nothing in flight, preempts a
 * request by recompute after its lane was touched (its rollback length
 * recorded); launch N+1, planned on top of N, readmits it; N fails, so
 * both roll back.
 *
 * Here X (priority 0) decodes at a block boundary in a full pool: the fused
 * decode pass hands it to append_room, which touches the lane (pre_len 8,
 * in N's touched list, so in N's ticket) and, finding no room, preempts X
 * itself (the lowest priority; Y still runs, so X is not alone and waits:
 * its sequence is closed, its blocks freed). N launches Y's decode row. The
 * host aborts Y before launching N+1, so N+1 starts with nothing running
 * and admits X without the watermark check (its freed blocks hold the
 * first chunk): X reuses its lane structs, on a new, empty sequence
 * (pre_len 0 in N+1's ticket). The device fails N. rollback_all restores
 * newest first: N+1's record truncates X to 0, then N's record - written
 * for the sequence that was closed in N - sets kv_len back to 8 while the
 * new sequence holds 0 tokens (bkv_seq_truncate to a greater length fails,
 * and the error was ignored): bkv_sched_check 11, and the next launch
 * asserts in the batch fill (with asserts off: slots and tables read past
 * the sequence's blocks). The abort is what makes the readmission
 * possible: with Y still running, X's whole history fails
 * bkv_pool_can_admit in a pool the preemption found full. */
Test(overlap, a_request_preempted_in_a_failed_step_and_readmitted_by_the_next_rolls_back_to_its_new_sequence)
{
	ov_opts o;
	ov_env e;
	kh_req x, y;
	int32_t px[8] = {300, 301, 302, 303, 304, 305, 306, 307}, py[3] = {700, 701, 702};
	bkv_step_info si;
	uint64_t t = 0;
	uint32_t i;
	int rc;

	ov_opts_init(&o);
	o.bt = 4;
	o.nb = 4; /* 16 tokens: Y's whole history fits, X's and Y's together not */
	o.prefix = 0;
	o.cfg.chunked_prefill = 1;
	o.cfg.token_budget = 4;
	o.cfg.preempt = BKV_PREEMPT_RECOMPUTE; /* no host tier anyway */
	ov_env_init(&e, &o);
	cr_assert_eq(kh_req_init(&y, 1, py, 3, 13, 1), 0);
	cr_assert_eq(kh_req_init(&x, 2, px, 8, 4, 1), 0);
	cr_assert_eq(kh_submit(e.s, &y, 1), BKV_OK);
	cr_assert_eq(kh_submit(e.s, &x, 0), BKV_OK);
	/* synchronous-looking steps (each completed before the next launch)
	 * until a launch preempts */
	for (i = 0; i < 20; i++) {
		t = 0;
		cr_assert_eq(bkv_step_launch(e.s, &t, &si), BKV_OK);
		cr_assert_neq(t, 0);
		e.q[e.n_q++] = t;
		if (si.preempted)
			break;
		cr_assert_eq(ov_complete1(&e), BKV_OK);
		ov_check(&e);
	}
	cr_assert_eq(si.preempted, 1, "launch N preempts");
	cr_assert_eq(si.running, 1, "Y runs on");
	cr_assert_eq(si.waiting, 1, "X waits to recompute");
	cr_assert_eq(x.finished, 0);
	ov_check(&e);
	/* the device fails N (reported at its completion) */
	e.h.dev_failed[(e.h.dev_head + e.h.dev_n - 1) % OV_DEPTH] = 1;
	e.h.prev_failed = 1;
	cr_assert_eq(kh_abort(e.s, &y, y.id), BKV_OK);
	t = 0;
	rc = bkv_step_launch(e.s, &t, &si);
	cr_assert_eq(rc, BKV_OK);
	cr_assert_neq(t, 0, "N+1 is planned on top of N");
	e.q[e.n_q++] = t;
	cr_assert_eq(si.admitted, 1, "N+1 readmits X");
	cr_assert_eq(y.finished, 1);
	cr_assert_eq(y.reason, BKV_FINISH_ABORT);
	ov_check(&e);
	cr_assert_eq(ov_complete1(&e), BKV_EHOST);
	cr_assert_eq(ov_complete1(&e), BKV_EHOST, "both steps roll back");
	ov_check(&e); /* the defect: 11, X's kv_len 8 on an empty sequence */
	ov_run(&e, 200);
	cr_assert_eq(x.finished, 1);
	cr_assert_eq(x.reason, BKV_FINISH_LENGTH);
	cr_assert_eq(x.n_out[0], 4);
	ov_check(&e);
	ov_env_fini(&e);
	kh_req_fini(&x);
	kh_req_fini(&y);
}

/* ---- depth: several steps in flight ---------------------------------------- */

/* The model checks above at depths 2 to 8: the same workloads deliver the
 * synchronous run's tokens, every KV cell, group cell and state the device
 * reads checked, with the device queue as deep as the depth allows. */
static const uint32_t depths[] = {2, 3, 4, 8};

/* Back to depth 1 and the default workload. */
static void depth_reset(void)
{
	ov_depth = 1;
	load_max_new = 24;
	load_stop_mod = 11;
}

Test(overlap_depth, every_depth_delivers_the_synchronous_tokens_with_forks_chunks_and_hits)
{
	ov_opts o;
	uint64_t ov = 0, seed;
	uint32_t d;

	for (d = 0; d < 4; d++) {
		ov_depth = depths[d];
		deepest = 0;
		for (seed = 1; seed <= 4; seed++) {
			ov_opts_init(&o);
			o.cfg.chunked_prefill = seed % 2;
			o.cfg.token_budget = 24 + 8 * (uint32_t)seed;
			o.bt = seed % 2 ? 4 : 1;
			model_check(&o, 50, seed + 100 * d, 1, 0, 0, seed % 2 ? 0 : 100, &ov);
		}
		cr_assert_eq(deepest, ov_depth, "depth %u: at most %u steps in flight", ov_depth,
			     deepest);
	}
	ov_depth = 1;
	cr_assert_gt(ov, 400);
}

Test(overlap_depth, preemption_swap_and_failed_steps_at_every_depth_roll_back_and_rerun)
{
	ov_opts o;
	uint64_t ov = 0, seed, f0 = failed, p0 = preempted, s0 = swapped;
	bkv_preempt_mode modes[3] = {BKV_PREEMPT_RECOMPUTE, BKV_PREEMPT_SWAP, BKV_PREEMPT_AUTO};
	uint32_t d;

	load_max_new = 48;
	load_stop_mod = 31;
	for (d = 0; d < 4; d++) {
		ov_depth = depths[d];
		for (seed = 1; seed <= 4; seed++) {
			ov_opts_init(&o);
			o.nb = 52 + 4 * (uint32_t)seed;
			o.nh = seed % 2 ? 48 : 0;
			o.host_cache = seed == 3;
			o.cfg.preempt = o.nh ? modes[seed % 3] : BKV_PREEMPT_RECOMPUTE;
			o.cfg.chunked_prefill = seed % 2;
			o.cfg.token_budget = 32;
			model_check(&o, 40, seed + 30 + 100 * d, 1, 1, 60, 0, &ov);
		}
	}
	depth_reset();
	cr_assert_gt(ov, 200);
	cr_assert_gt(failed, f0 + 40);
	cr_assert_gt(preempted, p0 + 10);
	cr_assert_gt(swapped, s0 + 3);
}

Test(overlap_depth, window_chunked_and_state_groups_at_every_depth_deliver_the_synchronous_tokens)
{
	ov_opts o;
	uint64_t ov = 0, seed, c0 = grp_checked, t0 = st_checked, f0 = failed;
	uint32_t d;

	load_max_new = 32;
	load_stop_mod = 23;
	for (d = 0; d < 4; d++) {
		ov_depth = depths[d];
		for (seed = 1; seed <= 4; seed++) {
			ov_opts_init(&o);
			o.cfg.chunked_prefill = seed % 3 != 0;
			o.cfg.token_budget = 24 + 8 * (uint32_t)seed;
			o.nh = 48;
			grp_model_check(&o, 40, seed + 200 + 10 * d, 1, 1, seed % 2 ? 50 : 0, 0, &ov);
			ov_opts_init(&o);
			o.cfg.chunked_prefill = seed % 2;
			o.cfg.token_budget = 32;
			o.nh = seed % 2 ? 48 : 0;
			st_opts(&o, seed + d, 64 + 8 * (uint32_t)seed);
			model_check(&o, 40, seed + 300 + 10 * d, 1, 1, seed % 2 ? 0 : 50, 0, &ov);
		}
	}
	depth_reset();
	cr_assert_gt(ov, 400);
	cr_assert_gt(grp_checked, c0 + 1000);
	cr_assert_gt(st_checked, t0 + 1000);
	cr_assert_gt(failed, f0 + 20);
}

Test(overlap_depth, speculation_at_every_depth_matches_the_synchronous_run)
{
	uint32_t d;
	uint64_t f0 = failed;

	load_max_new = 40;
	load_stop_mod = 29;
	for (d = 0; d < 4; d++) {
		ov_depth = depths[d];
		spec_model_check(3, 400 + 10 * d, 64, 32, 40, d % 2 ? 200 : 0);
	}
	depth_reset();
	cr_assert_gt(failed, f0 + 10);
}

/* The drain rule: with depth steps in flight a launch is refused, and
 * nothing changes; the oldest completed, it goes on. A deeper config is
 * refused at create, naming the limit. */
Test(overlap_depth, a_launch_past_the_depth_is_refused_and_changes_nothing)
{
	ov_opts o;
	ov_env e;
	ov_load L;
	uint64_t t;
	uint32_t k;
	bkv_sched_stats a, b;
	bkv_pool *pool;
	bkv_pool_config pc;
	bkv_host_ops ops = kh_ops(0);
	bkv_sched *s = NULL;

	ov_depth = 3;
	ov_opts_init(&o);
	o.cfg.overlap = 3;
	ov_env_init(&e, &o);
	load_make(&L, 8, 7, 0, 0);
	load_submit(&e, &L);
	for (k = 0; k < 4; k++) { /* prompts, then decode on placeholders */
		cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_OK);
		cr_assert_neq(t, 0);
		e.q[e.n_q++] = t;
	}
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	bkv_sched_stats_get(e.s, &a);
	cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_ESTATE);
	b = a;
	bkv_sched_stats_get(e.s, &b);
	cr_assert_eq(memcmp(&a, &b, sizeof(a)), 0);
	cr_assert_eq(e.h.max_in_flight, 3);
	cr_assert_gt(e.h.placeholders, 0);
	ov_complete1(&e);
	cr_assert_eq(bkv_step_launch(e.s, &t, NULL), BKV_OK);
	e.q[e.n_q++] = t;
	ov_complete1(&e); /* depth in flight again: the loop launches next */
	ov_run(&e, 4000);
	ov_check(&e);
	ov_env_fini(&e);
	load_free(&L);
	ov_depth = 1;

	bkv_pool_config_init(&pc);
	pc.device_blocks = 64;
	cr_assert_eq(bkv_pool_create(&pc, NULL, &pool), BKV_OK);
	ops.launch = ov_launch;
	o.cfg.overlap = BKV_OVERLAP_MAX_DEPTH + 1;
	cr_assert_eq(bkv_sched_create(&o.cfg, pool, &ops, NULL, NULL, &s), BKV_EINVAL);
	cr_assert_null(s);
	cr_assert_not_null(strstr(bkv_last_error(), "overlap = 9"), "%s", bkv_last_error());
	bkv_pool_destroy(pool);
}

/* Host-cache demotions at depth 4: each step in flight's demotions are held
 * apart, so the launches stay deep and overlapped. */
Test(overlap_depth, host_cache_demotions_keep_four_steps_in_flight)
{
	ov_env e;
	ov_load L;
	bkv_sched_stats st;
	bkv_pool_stats ps;

	load_max_new = 16;
	load_stop_mod = 97;
	ov_depth = 4;
	host_cache_run(&e, &L, 96, 4, &st, &ps);
	cr_assert_eq(e.h.max_in_flight, 4);
	cr_assert_lt(10 * st.overlap_syncs, st.overlap_steps, "%llu synchronous launches against %llu",
		     (unsigned long long)st.overlap_syncs, (unsigned long long)st.overlap_steps);
	ov_check(&e);
	ov_env_fini(&e);
	load_free(&L);
	depth_reset();
}
