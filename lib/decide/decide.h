/*
 * decide.h - the decision layer: every "which one", "how many" and "now or
 * later" the scheduler asks, each concern in one file holding both its
 * fixed rule and its cost-model rule, chosen once at create into the
 * scheduler's policy table (struct bkv__policy, sched/sched.h):
 *
 *   decide/queue.c    the queue order (priority, FCFS, output-length hints,
 *                     the bypass bound) and the queue's heaps
 *   decide/admit.c    admission: static batches, a fixed group k, or the
 *                     cost model's group (congestion pricing, batch cap,
 *                     TPOT target)
 *   decide/budget.c   the step's token budget (whole, fixed, cost model) and
 *                     the TPOT fit of a prefill chunk
 *   decide/preempt.c  the victim, and swap or recompute (RECOMPUTE, SWAP,
 *                     AUTO: the cost model compares the two)
 *   decide/pack.c     how a split host's prefill rows become calls
 *   decide/evict.c    the prefix cache's eviction policy (LRU, or by value
 *                     with the cost model's prices: kv/value.c)
 *   decide/price.c    pricing hypothetical calls with the cost model
 *   decide/decide.c   create/destroy (the default cost model, the table),
 *                     the observations every cost-model rule reads
 *
 * A new policy is one function in its concern's file and one line of that
 * file's *_choose. Nothing outside this layer tests cfg.policy or
 * cfg.preempt. The derivations are in docs/cost-model.md, "Decisions from
 * the cost model". No allocation after create; no scan of the waiting
 * requests.
 */
#ifndef BKV_DECIDE_H
#define BKV_DECIDE_H

#include "sched/sched.h"


#define AUTO_DECAY 0.97          /* per step, for the slot-free rate */
#define AUTO_OCC_DECAY 0.999     /* per step, for the occupancy time */
#define AUTO_GAP_DECAY 0.999     /* per admission, for the arrival rate */
#define AUTO_PROMPT_DECAY 0.99   /* per admission, for the prompt moments */
#define AUTO_OUT_DECAY 0.99      /* per ended lane, for the output lengths */
#define AUTO_OUT_BUCKETS 32u     /* buckets of the output-length histogram */
#define AUTO_REFRESH_STEPS 8u    /* steps between recomputations of k* */
#define AUTO_LINK_BYTES_PER_US 25000.0 /* host link default: 25 GB/s */
#define AUTO_KNEE 1.002          /* batch cap: cost per token within 0.2% */
#define AUTO_PRICED_ROWS 64u     /* rows of one step's prefill call that
				    admission prices one by one (O(rows^2)
				    per step; the rest join unpriced) */
#define AUTO_DEFAULT_PROMPT 64.0 /* prompt tokens assumed before any is seen */
#define AUTO_CTX_EXTRA 64.0      /* generated tokens added to a row's context
				    when pricing decode rows */
#define AUTO_BUDGET_LADDER 96u /* most budgets the auto budget prices
				    (16 * 2^(i/4) reaches 2^24 at i = 80) */
#define AUTO_BUDGET_TIE 0.02     /* predicted TTFTs this close are a tie */
#define AUTO_PACK_GAIN 1e-6      /* least relative saving of a prefill
				    call split off (rounding is no gain) */
#define AUTO_PACK_CUTS 32u       /* most inner call boundaries the prefill
				    partition considers (O(cuts^2) prices) */
#define AUTO_CLOCK_US 1.0        /* the clock's resolution (now_us and the
				    monotonic clock count microseconds): the
				    least positive price of a call */
#define AUTO_RING 256u           /* steps ahead the completion calendar
				    covers (a power of two) */

/* The cost-model rules' state (bkv_sched.autos): observations, cached
 * decisions, scratch taken at create. */
typedef struct bkv__auto bkv__auto;
struct bkv__auto {
	int admit;               /* admit_group was 0: k* decides */
	int budget;              /* token_budget was 0 (chunked): decided per
				    step */
	uint32_t tpot_us;        /* cfg.tpot_target_us; 0 none */
	uint32_t ttft_us;        /* cfg.ttft_target_us; 0 none */
	bkv_cost_poly poly;      /* the default model's base (when owned) */
	bkv_cost_calib *calib;   /* the default model, owned; NULL when the
				    host gave one */
	bkv_chunk_shape *chunks; /* [chunk_cap] scratch for priced shapes */
	uint32_t chunk_cap;      /* = max_running + 1 */
	uint64_t fit_step;       /* step whose decode context fit_ctx holds */
	uint64_t fit_ctx;        /* summed context of that step's decode rows */
	/* observations */
	double freed_sum;        /* decayed slots freed */
	double step_sum;         /* decayed steps (same decay): r = sum / sum */
	double used_sum;         /* slowly decayed (AUTO_OCC_DECAY) slots_used
				    at step begin ... */
	double freed_slow;       /* ... and slots freed: Little's law gives
				    the steps a request holds a slot */
	double gap_w, gap_sum;   /* decayed count and sum of the gaps (us)
				    between consecutive admitted requests'
				    enqueue times: the arrival rate */
	uint64_t last_enq;       /* enq_us of the last admitted request */
	int have_enq;            /* last_enq is valid */
	uint32_t used_after;     /* slots_used after the last admission */
	int have_used;           /* used_after is valid */
	uint32_t dec_next;       /* rows the next step decodes, as the last
				    step's plan says (its decode rows and the
				    prefill rows that sample); <= the slots
				    used then */
	double p_w, p_sum, p_sq; /* decayed count, sum, sum of squares of
				    admitted prompt lengths */
	double adm_tokens;       /* prefill tokens admitted (prompts, and a
				    recomputed lane's generated tokens), all
				    time: less stats.prefill_tokens and
				    stats.hit_tokens, the prefill still owed */
	double out_w;            /* decayed count of the lanes of requests
				    that ended (LENGTH or STOP) */
	double len_w;            /* decayed count (same decay) of those that
				    ended at max_new: when most do, max_new
				    is a request's length (the calendar uses
				    it), else the observed lengths are */
	double out_hist[AUTO_OUT_BUCKETS]; /* the same lanes by generated
				    tokens (same decay), AUTO_RING /
				    AUTO_OUT_BUCKETS tokens a bucket, the
				    last one open-ended: sums to out_w */
	double cal_u;            /* the calendar's quantile sequence, [0, 1)
				    (a golden-ratio walk: one step a lane) */
	/* cached decisions */
	uint32_t k_star;         /* admission group the cost model chose */
	uint32_t cap;            /* batch cap (running slots) */
	uint32_t cap_tpot;       /* the TPOT target's part of it (max_running
				    without a target): cap <= cap_tpot */
	uint32_t k_lat;          /* latency-regime group; 0: use k_star */
	double w99;              /* predicted p99 wait (us) of the latency
				    group; 0 none */
	/* completion calendar: lanes expected to free a slot at the start of
	 * step t (decide.c, expected_rem), at ends[t % AUTO_RING], for t in
	 * (step_no, step_no + AUTO_RING) */
	uint32_t ends[AUTO_RING];
	uint32_t ends_n;         /* sum of ends[] */
	uint64_t k_step;         /* step_no when k_star was computed; 0 never */
	/* the admission under way (one step) */
	uint64_t adm_step;       /* step_no of the group being built */
	uint32_t adm_n;          /* rows priced into chunks[] this step */
	double adm_price;        /* predicted prefill price of the group;
				    < 0 when not priced since it last grew */
	/* packing a split host's prefill rows into calls (bkv__auto_pack);
	 * every array has pack_cap entries (+ 1 where said), taken at create */
	uint32_t pack_cap;       /* = the scheduler's row_cap */
	bkv__row *pack_rows;     /* the step's prefill rows sorted by (length,
				    start): calls are contiguous runs of it */
	uint32_t *pack_order;    /* pack_rows[i] is the caller's rows[
				    pack_order[i]] */
	uint32_t *pack_end;      /* end (exclusive) in pack_rows of call g */
	uint32_t *pack_cut;      /* [+ 1] candidate call boundaries, 0 .. n */
	uint32_t *pack_from;     /* [+ 1] DP: the boundary the cheapest
				    partition ending at cut j starts its last
				    call at */
	double *pack_best;       /* [+ 1] DP: the price of that partition */
	int evict_on;            /* the table's evict policy is in force on
				    the pool (undone at destroy) */
	double out_sum;          /* decayed sum (AUTO_OUT_DECAY) of the
				    generated tokens of the lanes that ended
				    (LENGTH or STOP): / out_w is their mean */
	uint64_t res_step;       /* step_no whose reserve res_need holds */
	uint64_t res_need;       /* BKV_RESERVE_OUTPUT: blocks the running
				    requests and this step's admissions are
				    expected to need to complete */
};

/* ---- decide/decide.c -------------------------------------------------------- */

/* At create, after cfg is copied (user: the caller's config, to see which
 * fields were 0): the cost-model state, the default cost model (installed
 * into s->cfg.cost when the host gave none), and the policy table. */
int bkv__decide_create(bkv_sched *s, const bkv_sched_config *user);
/* Whether the decisions cfg asks for can be made with this pool (preempt
 * SWAP needs a host tier): BKV_OK, or BKV_EINVAL naming the field
 * (bkv_last_error). */
int bkv__decide_config_check(const bkv_sched_config *cfg, uint32_t host_blocks);
void bkv__decide_destroy(bkv_sched *s);
/* Observations, whatever the policy: once per step before planning (the
 * slots freed since the last admission), per admitted request, after a
 * step's admissions. */
void bkv__auto_step_begin(bkv_sched *s);
void bkv__auto_admitted(bkv_sched *s, const bkv__req *r);
void bkv__auto_after_admit(bkv_sched *s);

/* For tests: the admission group chosen, the batch cap, the slot-free rate
 * (slots per step). */
void bkv__auto_state(const bkv_sched *s, uint32_t *k_star, uint32_t *cap, double *rate);

/* ---- decide/price.c --------------------------------------------------------- */

/* The model's price of a call in us; 0 when it has no answer. */
double bkv__price(const bkv_sched *s, const bkv_step_shape *sh);
/* The host link's time, us, to copy n blocks one way (kv_bytes_per_token
 * and host_link_bytes_per_us, or its default); 0 with no KV size. */
double bkv__link_us(const bkv_sched *s, uint64_t n);
void bkv__prompt_stats(const bkv__auto *a, double *mean, double *sd);
double bkv__price_decode(const bkv_sched *s, uint32_t n, double mean);
double bkv__expected_max(double mean, double sd, uint32_t k);
double bkv__price_group(const bkv_sched *s, uint32_t k, double mean, double sd, uint32_t d);

/* ---- decide/queue.c --------------------------------------------------------- */

void bkv__queue_push(bkv_sched *s, bkv__req *r);
/* Could running request r be swapped out now (one live lane holding KV, and
 * the host tier has room for every group's blocks)? (decide/preempt.c) */
int bkv__swap_fits(const bkv_sched *s, const bkv__req *r);
bkv__req *bkv__queue_pop(bkv_sched *s);
void bkv__queue_remove(bkv_sched *s, bkv__req *r);
int bkv__queue_less(const bkv__req *a, const bkv__req *b);
int bkv__queue_check(const bkv_sched *s);
/* The request admission serves next: heap[0], unless the oldest new request
 * of its class has waited past the bypass bound (then that one). Queue not
 * empty. */
bkv__req *bkv__queue_head(const bkv_sched *s, uint64_t now);
/* The auto bypass bound for a (us): 2 * S * (1 + Q / max_running), S the
 * mean run time of ended requests; -1 before any ended (no estimate). */
double bkv__bypass_bound(const bkv_sched *s, const bkv__req *a);
/* A request ran from admission to a LENGTH/STOP end: feed run_mean_us and
 * the output-length estimate (bkv__auto_ended). */
void bkv__queue_ran(bkv_sched *s, const bkv__req *r);
/* The same end (called by bkv__queue_ran): r's lanes' generated tokens feed
 * the output-length moments of s->autos. */
void bkv__auto_ended(bkv_sched *s, const bkv__req *r);

/* ---- decide/admit.c --------------------------------------------------------- */

void bkv__admit_choose(bkv__policy *p, const bkv_sched_config *user);
/* May this step start admitting from the queue head? (Each admission is
 * further limited by free slots, the watermark and the token budget.) */
int bkv__admit_allowed(const bkv_sched *s, uint64_t now);

/* ---- decide/budget.c -------------------------------------------------------- */

void bkv__budget_choose(bkv__policy *p, const bkv_sched_config *user);
/* Shorten a prefill chunk of c tokens from position start so the step keeps
 * a TPOT target (mixed host with a target and a model; else c). */
uint32_t bkv__auto_chunk_fit(bkv_sched *s, uint32_t start, uint32_t c);

/* Tokens of a prefill chunk: everything remaining, capped by what is left of
 * the step's budget (the token budget when chunking, else the batch arrays'
 * capacity). */
static inline uint32_t bkv__chunk_len(const bkv_sched *s, uint32_t remaining)
{
	return BKV_MIN(remaining, s->plan.budget_left);
}

/* ---- decide/preempt.c ------------------------------------------------------- */

void bkv__preempt_choose(bkv__policy *p, const bkv_sched_config *user);
/* Preempt AUTO: 1 swap, 0 recompute, -1 no opinion (KV size unknown, no
 * model, or not AUTO). */
int bkv__auto_want_swap(const bkv_sched *s, uint32_t kv_len);

/* ---- decide/evict.c --------------------------------------------------------- */

void bkv__evict_choose(bkv__policy *p, const bkv_sched_config *user);
/* Give a pool with a host cache the prices that weigh an evicted block's
 * copy to the host (on), or take them back (off, at the scheduler's end:
 * the pool demotes every block again). */
void bkv__evict_host_cache(bkv_sched *s, int on);

/* ---- decide/pack.c ---------------------------------------------------------- */

void bkv__pack_choose(bkv__policy *p, const bkv_sched_config *user);
/* The cost model's packing (the table's pack with admission auto): the
 * number of calls; with >= 2, *sorted, *order and *ends describe them. */
uint32_t bkv__auto_pack(bkv_sched *s, const bkv__row *rows, uint32_t n, bkv__row **sorted,
			const uint32_t **order, const uint32_t **ends);

/* ---- decide/spec.c: speculative decoding's k ------------------------------- */

/* The drafts each of the n decode rows rows[] should carry: k[i] in
 * 0..cap[i] (cap[i] 0: not a candidate). n_dec rows decode in the call, over
 * ctx tokens of context. Fixed mode: cap[i]; auto: the cost model's choice
 * for the most tokens per unit time (or the TPOT target), over all rows at
 * once. k may be cap. */
void bkv__spec_choose(const bkv_sched *s, const bkv__row *rows, const uint32_t *cap, uint32_t n,
		      uint32_t n_dec, uint64_t ctx, uint32_t *k);
/* A row of r verified k drafts and accepted m of them. */
void bkv__spec_observe(bkv_sched *s, bkv__req *r, uint32_t k, uint32_t m);
/* r's acceptance estimate (the prior before any observation). */
double bkv__spec_accept(const bkv_sched *s, const bkv__req *r);

#endif /* BKV_DECIDE_H */
