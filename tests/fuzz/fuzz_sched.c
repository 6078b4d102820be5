/*
 * fuzz_sched.c - the scheduler driven by arbitrary bytes.
 *
 * The input is read as a program. Its head chooses a pool (block size, device
 * and host tiers, sequence slots, watermark, prefix cache), a scheduler config
 * with its extremes (policy, batch layout, max_running, admission group, max wait, chunked
 * prefill and a token budget down to 1, queue length, preemption mode, swap
 * bandwidth including NaN, infinity and negative, a cost model that may
 * answer NaN, negative or huge times), KV groups (a window, a chunk, a
 * recurrent state), speculative decoding (with KV groups too), a mixed or
 * split host, and which
 * allocation to refuse. Then, until the bytes run out: submit (odd prompts:
 * one token, longer than the pool, shared prefixes, negative and extreme token
 * ids, n samples, stop tokens, priorities, cache keys, and invalid requests),
 * abort (known, finished or bogus ids), step (the host fails calls and writes
 * wrong KV first, or samples odd tokens - negative, huge, BKV_TOKEN_FAIL,
 * stop tokens - as the bytes say), and a step that calls bkv_step from inside
 * a callback.
 *
 * The host is tests/support/fakehost.h with abort_on_violation: every batch is checked
 * against a model of the KV memory and every callback against the request
 * contract. After every operation the harness checks bkv_sched_check() == 0,
 * that each call returned a documented code (BKV_ENOMEM only when the
 * allocator refused, BKV_EHOST only when the host failed), and that
 * bkv_sched_pending() counts the requests accepted and not ended. At the end
 * it steps without failures until nothing is pending: every accepted request
 * must have ended exactly once, and after destroy no byte may be left.
 */
#include "fuzz.h"
#include "internal.h"
#include "fakehost.h"

#include <math.h>

#define MAX_REQS 64u   /* requests one input may submit */
#define MAX_OPS 256u
#define DRAIN_STEPS 20000u

typedef struct ctx {
	fz *f;
	int hooks;        /* fuzz-driven failures and odd tokens on */
	int cost_mode;    /* 0 sane, 1 NaN, 2 negative, 3 huge, 4 from bytes */
} ctx;

static int fail_hook(void *c, const bkv_batch *b)
{
	ctx *x = c;

	(void)b;
	return x->hooks && (fz_u8(x->f) & 0x1F) == 0x1F;
}

static int32_t token_hook(void *c, const kh_req *r, uint32_t branch, int32_t t)
{
	ctx *x = c;
	uint8_t v;

	(void)r;
	(void)branch;
	if (!x->hooks)
		return t;
	v = fz_u8(x->f);
	switch (v & 0x0F) {
	case 0x0A:
		return -2 - (int32_t)(v >> 4); /* negative, not the failure token */
	case 0x0B:
		return INT32_MAX - (int32_t)(v >> 4);
	case 0x0C:
		return INT32_MIN + (int32_t)(v >> 4);
	case 0x0D:
		return (v >> 4) == 0xF ? BKV_TOKEN_FAIL : t;
	case 0x0E:
		return KH_STOP;
	default:
		return t;
	}
}

static double cost_step(void *c, const bkv_step_shape *sh)
{
	ctx *x = c;

	switch (x->cost_mode) {
	case 1:
		return NAN;
	case 2:
		return -1e9;
	case 3:
		return 1e300;
	case 4:
		return x->hooks ? (double)fz_u16(x->f) : 1.0;
	default:
		return 10.0 + sh->decode_rows + (double)sh->n_chunks * 50.0;
	}
}

static void cost_observe(void *c, const bkv_step_shape *sh, double us)
{
	(void)c;
	(void)sh;
	FZ_CHECK(us >= 0.0 && !isnan(us), "observe got %g us", us);
}

/* Print the scheduler's view of a request (for a stall report). */
static void dump_req(const bkv_sched *s, uint64_t id)
{
	uint32_t i, j;

	for (i = 0; i < s->in.map_cap; i++) {
		const bkv__req *r = s->in.map[i].req;

		if (s->in.map[i].id != id)
			continue;
		fprintf(stderr, "  state %u forked %u n_live %u preempted at step %llu (now %llu)\n",
			r->state, r->forked, r->n_live, (unsigned long long)r->preempt_step,
			(unsigned long long)s->plan.step_no);
		for (j = 0; j < r->n; j++)
			fprintf(stderr, "  lane %u: kv_len %u n_gen %u decoding %u done %u seq %s\n", j,
				r->lane[j].kv_len, r->lane[j].n_gen, r->lane[j].decoding,
				r->lane[j].done, r->lane[j].seq == BKV__SEQ_NONE ? "none" : "open");
	}
}

static void check_sched(bkv_sched *s, const kh_host *h, const kh_req *reqs, uint32_t n)
{
	uint64_t live = 0;
	uint32_t i;
	int rc = bkv_sched_check(s);

	FZ_CHECK(rc == 0, "bkv_sched_check = %d", rc);
	FZ_CHECK(h->violations == 0, "host: %s", h->first);
	for (i = 0; i < n; i++) {
		FZ_CHECK(reqs[i].finished <= 1, "req %u ended %u times", i, reqs[i].finished);
		live += reqs[i].submitted && !reqs[i].finished;
	}
	FZ_CHECK(bkv_sched_pending(s) == live, "pending %llu, live %llu",
		 (unsigned long long)bkv_sched_pending(s), (unsigned long long)live);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int32_t prompts[MAX_REQS][512];
	static kh_req reqs[MAX_REQS];
	fz f = {data, size, 0};
	fz_mem mem;
	bkv_allocator a;
	bkv_pool_config pc;
	bkv_sched_config sc;
	bkv_host_ops ops;
	bkv_pool *pool = NULL;
	bkv_sched *s = NULL;
	kh_host h;
	ctx x = {&f, 0, 0};
	uint32_t n_req = 0, i, op_count = 0;
	uint8_t b, hc;
	int rc, split, expect_einval = 0;

	memset(&mem, 0, sizeof(mem));
	a = fz_allocator(&mem);

	/* the pool (valid: the pool has its own harness) */
	bkv_pool_config_init(&pc);
	b = fz_u8(&f);
	/* 1..32, and 1 (each token a whole block: a one-token prompt is a
	 * whole-prompt hit) half the time it is not 1 already (issue 13) */
	pc.block_tokens = (b & 0x80) && (b % 6) < 3 ? 1 : 1u << (b % 6);
	pc.device_blocks = 1 + fz_u8(&f) % 48;
	pc.host_blocks = fz_u8(&f) % 24;
	/* any slot count: a request with more samples than the pool has
	 * sequence slots is refused at submit (BKV_E2BIG; regression test
	 * faults/submit_refuses_more_samples_than_pool_sequences) */
	b = fz_u8(&f);
	/* tiny slot counts with forked requests (issue 13's livelock) often */
	pc.max_seqs = (b & 0x80) ? 1 + b % 4 : 1 + b % 43;
	hc = fz_u8(&f);
	pc.watermark_blocks = hc % 3;
	if (pc.watermark_blocks > pc.device_blocks)
		pc.watermark_blocks = 0;
	pc.prefix_cache = (b & 0x40) == 0;
	/* KV groups (issue 16) a quarter of the time: a window, a chunk, or a
	 * window and a recurrent state (one frame per unit, a few units) */
	b = fz_u8(&f);
	if ((b & 3) == 3) {
		static bkv_kv_group g[3];
		uint32_t kind = (b >> 2) % 3;

		g[0] = (bkv_kv_group){BKV_GROUP_FULL, 1, 0, 0, 64};
		g[1] = (bkv_kv_group){kind == 1 ? BKV_GROUP_CHUNKED : BKV_GROUP_WINDOW, 1,
				      1 + (uint32_t)(b >> 4) % 40, 0, 64};
		g[2] = (bkv_kv_group){BKV_GROUP_STATE, 1, pc.block_tokens * (1 + (b >> 6)), 0,
				      64 * pc.block_tokens};
		pc.n_groups = kind == 2 ? 3 : 2;
		pc.groups = g;
		pc.state_units = 2 + (b >> 5) % 6;
		/* half the time its units share the frames (a floor of
		 * state_units, one frame a unit here) */
		pc.state_share = kind == 2 && (b >> 4) & 1;
		if (pc.n_groups == 3 && pc.state_units >= pc.device_blocks)
			pc.n_groups = 2; /* the arena must leave attention frames */
	}
	/* a host cache (issue 22) where the pool can have one, half the time,
	 * its copies priced beside the kernels or before them */
	pc.host_cache = ((hc >> 4) & 1) && pc.host_blocks && pc.prefix_cache && !pc.n_groups;

	/* the scheduler, extremes included */
	bkv_sched_config_init(&sc);
	b = fz_u8(&f);
	sc.policy = (bkv_policy)(b & 1);
	split = (b >> 1) & 1;
	sc.chunked_prefill = (b >> 2) & 1;
	sc.preempt = (bkv_preempt_mode)((b >> 3) % 3);
	x.cost_mode = (b >> 5) % 5;
	sc.max_running = 1 + fz_u8(&f) % 16;
	sc.admit_group = fz_u8(&f) % (sc.max_running + 2); /* max_running + 1 is invalid */
	b = fz_u8(&f);
	sc.max_wait_us = b == 0 ? 0 : b == 1 ? 1 : b == 2 ? UINT64_MAX : (uint64_t)b * 1000;
	b = fz_u8(&f);
	sc.token_budget = b < 8 ? b : b < 250 ? b % 96 : (1u << 24) + (b == 255); /* 0 = auto */
	b = fz_u8(&f);
	sc.max_queue = 1 + b % 48;
	/* the batch layout from the same byte's top bit: half the inputs run
	 * persistent, the host mirroring every delta (tests/support) */
	sc.batch_layout = (bkv_batch_layout)((b >> 7) & 1);
	b = fz_u8(&f);
	sc.host_link_bytes_per_us = b == 1 ? NAN : b == 2 ? INFINITY : b == 3 ? -1.0 : (double)b;
	b = fz_u8(&f);
	sc.kv_bytes_per_token = b % 4 == 0 ? 0 : 1u << (fz_u8(&f) % 20);
	/* the eviction policy from the same byte's top bit: half the inputs
	 * evict by value; of the rest, half (bit 4) by the segmented LRU */
	sc.evict = (b >> 7) & 1	  ? BKV_EVICT_VALUE
		   : (b >> 4) & 1 ? BKV_EVICT_SEGMENTED
				  : BKV_EVICT_LRU;
	/* and the victim policy from its next bit */
	sc.victim = (bkv_victim_policy)((b >> 6) & 1);
	/* and the memory reserve from the one after */
	sc.admit_reserve = (bkv_admit_reserve)((b >> 5) & 1);
	sc.copy_overlap = (hc >> 5) & 1;
	sc.prefill_first = (hc >> 6) & 1;
	sc.tpot_target_us = fz_u8(&f) % 3 == 0 ? 0 : fz_u16(&f);
	if (fz_u8(&f) & 1) {
		sc.cost.step_us = cost_step;
		sc.cost.observe = cost_observe;
		sc.cost.ctx = &x;
	}
	b = fz_u8(&f);
	mem.fail_at = b < 128 ? b % 48 : 0;
	expect_einval = sc.admit_group > sc.max_running || sc.token_budget > (1u << 24) ||
			b == 200 || !(sc.host_link_bytes_per_us >= 0.0) ||
			isinf(sc.host_link_bytes_per_us) ||
			(sc.preempt == BKV_PREEMPT_SWAP && pc.host_blocks == 0);
	if (b == 200)
		sc.evict = (bkv_evict_policy)3; /* out of range: EINVAL */
	else if (b & 1)
		sc.retention = 1; /* retention bands or factors (no ranges given) */

	rc = bkv_pool_create(&pc, &a, &pool);
	if (rc != BKV_OK) {
		FZ_CHECK(rc == BKV_ENOMEM && mem.failures, "pool create: %d", rc);
		FZ_CHECK(mem.live_bytes == 0, "pool create leaked");
		return 0;
	}
	if (kh_init(&h, pc.block_tokens, pc.device_blocks, pc.host_blocks, 1) != 0) {
		bkv_pool_destroy(pool);
		return 0;
	}
	h.abort_on_violation = 1;
	h.unadmittable_ok = pc.n_groups > 1;
	{
		/* speculative decoding for half the inputs, from a hash of the
		 * whole input (no byte read: the corpus keeps its meaning) */
		uint64_t hs = 1469598103934665603ull;

		for (size_t j = 0; j < f.n; j++)
			hs = (hs ^ f.p[j]) * 1099511628211ull;
		if (hs & 1) {
			sc.spec_max_k = 1 + (uint32_t)(hs >> 1) % 8;
			sc.spec_k_mode = (bkv_spec_k_mode)((hs >> 5) & 1);
			sc.spec_drafts = (bkv_spec_drafts)((hs >> 6) & 1);
			h.spec_accept_permille = (uint32_t)(hs >> 8) % 1001;
			h.spec_host_accepts = (int)((hs >> 20) & 1);
			/* with KV groups too (drawn apart, above): windows,
			 * chunks and a STATE group speculate */
		}
	}
	h.fail_hook = fail_hook;
	h.token_hook = token_hook;
	h.hook_ctx = &x;
	ops = kh_ops(split);
	rc = bkv_sched_create(&sc, pool, &ops, &h, &a, &s);
	if (rc != BKV_OK) {
		FZ_CHECK(rc == (expect_einval ? BKV_EINVAL : BKV_ENOMEM),
			 "sched create: %d (EINVAL expected: %d)", rc, expect_einval);
		FZ_CHECK(rc != BKV_ENOMEM || mem.failures, "ENOMEM without a refusal");
		FZ_CHECK(s == NULL, "failed create wrote the handle");
		FZ_CHECK(bkv_pool_check(pool) == 0, "pool after failed create");
		goto out;
	}
	FZ_CHECK(!expect_einval, "invalid config accepted");
	h.sched = s;

	while (fz_more(&f) && op_count++ < MAX_OPS) {
		uint8_t op = fz_u8(&f) % 12;

		x.hooks = 0;
		if (op < 4) { /* submit */
			kh_req *q;
			bkv_request rq;
			bkv_retention_range rr[2];
			uint32_t len, j, max_new, n;
			uint64_t refusals = mem.failures, hist;
			uint8_t shape = fz_u8(&f), bad = 0;
			int want_e2big;

			if (n_req == MAX_REQS)
				continue;
			q = &reqs[n_req];
			len = 1 + fz_u8(&f) % (shape & 0x80 ? 511 : 40);
			for (j = 0; j < len; j++) {
				switch (shape & 3) {
				case 0:
					prompts[n_req][j] = (int32_t)j; /* shared prefix */
					break;
				case 1:
					prompts[n_req][j] = (int32_t)(fz_u8(&f) % 3);
					break;
				case 2: {
					static const int32_t odd[] = {INT32_MIN, -1, 0, INT32_MAX, -7};

					prompts[n_req][j] = odd[fz_u8(&f) % 5];
					break;
				}
				default:
					prompts[n_req][j] = (int32_t)(fz_u32(&f) & 0x3fffffff);
				}
			}
			max_new = fz_u8(&f) % 24;    /* 0 is invalid */
			n = 1 + (shape >> 2) % 4;
			if ((shape & 0x70) == 0x70)
				n = (shape & 0x08) ? 0 : sc.max_running + 1;
			kh_req_init(q, n_req + 1, prompts[n_req], len, max_new ? max_new : 1,
				    n ? n : 1);
			q->max_new = max_new;
			q->n = n;
			q->key = fz_u8(&f) % 3;
			b = fz_u8(&f);
			q->stop_mod = b & 0x0F;
			q->fail_mod = (b & 0x30) == 0x30 ? 7 : 0;
			if (b & 0x40) {
				q->stop[0] = KH_STOP;
				q->stop[1] = prompts[n_req][0];
				q->n_stop = 1 + (b >> 7);
			}
			kh_request(q, &rq);
			rq.priority = (int32_t)(fz_u8(&f) % 5) - 2;
			b = fz_u8(&f);
			if (b == 0xF1) {
				rq.prompt = NULL;
				bad = 1;
			} else if (b == 0xF2) {
				rq.n_stop = 2;
				rq.stop_tokens = NULL;
				bad = 1;
			} else if (b == 0xF3) {
				rq.size = 4;
				bad = 1;
			} else if (sc.retention && (b & 3) && len >= 2) {
				/* retention ranges: halves of the prompt, one
				 * with a duration; past the scale from 0xE8 */
				rr[0] = (bkv_retention_range){0, len / 2, b % 101u, 0, (b & 4) ? 300u : 0u};
				rr[1] = (bkv_retention_range){len / 2, len, (b * 7u) % 101u, 0, 0};
				if (b >= 0xE8) {
					rr[0].priority = BKV_RETENTION_PRIORITY_MAX + 1;
					bad = 1;
				}
				rq.retention = rr;
				rq.n_retention = (b & 3) == 3 ? 2 : 1;
			}
			bad |= max_new == 0 || n == 0;
			hist = (uint64_t)len + max_new;
			/* all n histories must fit at once (each lane may be
			 * recomputed on its own) */
			/* every group's blocks (pool/pool.h; one group: the
			 * history's) */
			want_e2big = (hist + pc.block_tokens - 1) / pc.block_tokens * n >
					     bkv__pool_attn_blocks(pool) ||
				     n > sc.max_running || n > pc.max_seqs ||
				     (pc.n_groups == 3 && 4ull * n > bkv__pool_state_units(pool));
			rc = bkv_submit(s, &rq, &q->id);
			if (bad) {
				FZ_CHECK(rc == BKV_EINVAL, "invalid request: %d", rc);
			} else if (want_e2big) {
				FZ_CHECK(rc == BKV_E2BIG, "oversized request: %d", rc);
			} else {
				FZ_CHECK(rc == BKV_OK || rc == BKV_EAGAIN || rc == BKV_ENOMEM,
					 "submit: %d", rc);
				FZ_CHECK(rc != BKV_ENOMEM || mem.failures > refusals,
					 "submit: ENOMEM without a refusal");
			}
			if (rc == BKV_OK) {
				FZ_CHECK(q->id != 0, "id 0");
				q->submitted = 1;
				n_req++;
			} else {
				kh_req_fini(q);
			}
		} else if (op == 4) { /* abort */
			b = fz_u8(&f);
			if (n_req && b < 0xF0) {
				kh_req *q = &reqs[b % n_req];
				int asked = q->abort_asked;

				rc = kh_abort(s, q, q->id);
				if (q->finished || asked)
					FZ_CHECK(rc == BKV_ENOENT, "abort of an ended request: %d", rc);
				else
					FZ_CHECK(rc == BKV_OK, "abort: %d", rc);
			} else {
				rc = bkv_abort(s, b == 0xFF ? 0 : 1000000u + b);
				FZ_CHECK(rc == (b == 0xFF ? BKV_EINVAL : BKV_ENOENT), "bogus abort: %d", rc);
			}
		} else if (op == 11) { /* a callback calls bkv_step */
			h.try_nested = 1;
			h.nested_rc = 1;
			rc = bkv_step(s, NULL);
			h.try_nested = 0;
			FZ_CHECK(rc == BKV_OK, "step: %d", rc);
			FZ_CHECK(h.nested_rc == 1 || h.nested_rc == BKV_ESTATE,
				 "nested bkv_step returned %d", h.nested_rc);
		} else { /* step, with fuzz-driven failures and odd tokens */
			uint64_t failed = h.failed_calls;
			bkv_step_info si;

			x.hooks = 1;
			rc = bkv_step(s, &si);
			x.hooks = 0;
			FZ_CHECK(rc == BKV_OK || rc == BKV_EHOST, "step: %d", rc);
			FZ_CHECK((rc == BKV_EHOST) == (h.failed_calls > failed),
				 "step %d with %llu failed calls", rc,
				 (unsigned long long)(h.failed_calls - failed));
		}
		check_sched(s, &h, reqs, n_req);
	}

	/* drain: no more failures; everything accepted must end */
	for (i = 0; i < DRAIN_STEPS && bkv_sched_pending(s); i++) {
		rc = bkv_step(s, NULL);
		FZ_CHECK(rc == BKV_OK, "drain step: %d", rc);
		if (i % 64 == 0)
			check_sched(s, &h, reqs, n_req);
	}
	check_sched(s, &h, reqs, n_req);
	if (bkv_sched_pending(s))
		fprintf(stderr, "stuck: KV groups %u (kind %u span %u; state units %u)\n",
			pc.n_groups, pc.n_groups > 1 ? pc.groups[1].kind : 0,
			pc.n_groups > 1 ? pc.groups[1].span : 0, pc.n_groups > 2 ? pc.state_units : 0);
	for (i = 0; i < n_req && bkv_sched_pending(s); i++)
		if (!reqs[i].finished)
			fprintf(stderr, "stuck: req %u (id %llu) n %u prompt %u max_new %u; pool "
				"max_seqs %u, %u blocks of %u; max_running %u\n",
				i, (unsigned long long)reqs[i].id, reqs[i].n, reqs[i].prompt_len,
				reqs[i].max_new, pc.max_seqs, pc.device_blocks, pc.block_tokens,
				sc.max_running);
	for (i = 0; i < n_req && bkv_sched_pending(s); i++)
		if (!reqs[i].finished)
			dump_req(s, reqs[i].id);
	if (bkv_sched_pending(s)) {
		bkv_sched_stats st;

		memset(&st, 0, sizeof(st));
		st.size = sizeof(st);
		bkv_sched_stats_get(s, &st);
		fprintf(stderr, "  chunked %d budget %u preempt mode %d; %llu preemptions\n",
			sc.chunked_prefill, sc.token_budget, sc.preempt,
			(unsigned long long)st.preemptions);
	}
	FZ_CHECK(bkv_sched_pending(s) == 0, "%llu requests still pending after %u steps",
		 (unsigned long long)bkv_sched_pending(s), DRAIN_STEPS);
	for (i = 0; i < n_req; i++)
		FZ_CHECK(reqs[i].finished == 1, "req %u ended %u times", i, reqs[i].finished);
	if (getenv("BKV_FUZZ_VERBOSE")) {
		bkv_sched_stats st;

		memset(&st, 0, sizeof(st));
		st.size = sizeof(st);
		bkv_sched_stats_get(s, &st);
		fprintf(stderr,
			"fuzz_sched: %u requests, %llu steps (%llu failed), %llu tokens out, %llu "
			"preemptions (%llu swaps), %llu calls, %llu aborted\n",
			n_req, (unsigned long long)st.steps, (unsigned long long)st.failed_steps,
			(unsigned long long)h.tokens_out, (unsigned long long)st.preemptions,
			(unsigned long long)st.swaps, (unsigned long long)h.calls,
			(unsigned long long)st.aborted);
	}
	bkv_sched_destroy(s);
	FZ_CHECK(bkv_pool_check(pool) == 0, "pool after destroy");
out:
	bkv_pool_destroy(pool);
	kh_fini(&h);
	for (i = 0; i < n_req; i++)
		kh_req_fini(&reqs[i]);
	FZ_CHECK(mem.live_bytes == 0 && mem.live_blocks == 0, "leaked %lld bytes in %lld blocks",
		 (long long)mem.live_bytes, (long long)mem.live_blocks);
	return 0;
}

#include "fuzz_main.h"
