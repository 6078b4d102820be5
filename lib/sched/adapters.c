/*
 * adapters.c - adapters (LoRA) per request and the cap on the adapters of a
 * call (bkv_sched_config.max_adapters).
 *
 * A host loads a bounded number of adapters at once (its LoRA slots). A cap
 * counted over the rows planned in one step misses what the step stages
 * besides them - a prompt admitted earlier whose next chunk joins this
 * step, a swap-in, the rows of an overlapped step - and the host then meets
 * one adapter more than it has slots for. So the cap here is kept over the
 * running requests instead: a request holds its adapter from admission
 * until it leaves the running set (it ends, is preempted, swapped out or
 * released), and admission takes a request only if its adapter is held
 * already or an entry is free. Every call's rows belong to running
 * requests, so no call can carry more than max_adapters adapters, whatever
 * the features that put rows in it.
 *
 * The held adapters are a table of max_adapters entries {id, users}; a
 * running request keeps the index of its entry (bkv__req.ad_slot), so
 * holding is a scan of the table at admission and dropping is O(1).
 *
 * Fairness. Admission goes in queue order. A request whose adapter finds no
 * room is set aside (passed) and admission goes on behind it, so requests
 * of held adapters still fill the batch; at most PASS_MAX are set aside in
 * one admission (the lookahead is bounded, never a scan of the queue) and
 * they return to the queue where they were when it ends. A request passed
 * for longer than adapter_wait_us is not passed again: admission stops at
 * it, the held adapters' requests run out (nothing new is admitted behind
 * it), and the first adapter that empties is its. Its wait is thus at most
 * adapter_wait_us plus the time the running requests of one held adapter
 * take to end (bounded by their max_new_tokens), whatever the arrivals.
 *
 * Each call gets its rows' adapters (bkv_batch.row_adapter) and the distinct
 * ones (bkv_batch.adapters), found with one mark per table entry.
 */
#include "sched/sched.h"
#include "decide/decide.h"

#include <string.h>

#define PASS_MAX 64u          /* requests set aside in one admission */
#define AUTO_WAIT_US 1000000u /* adapter_wait_us auto before any request
				 ended (no run-time estimate yet) */

typedef struct bkv__adapter {
	uint32_t id;    /* the adapter; 0 = a free entry */
	uint32_t users; /* running requests holding it (> 0 when id != 0) */
	uint64_t mark;  /* the last call that listed it (bkv__adapters_batch) */
} bkv__adapter;

struct bkv__adapters {
	bkv__adapter *tab;   /* [max_adapters] the held adapters */
	uint32_t n_held;     /* entries with id != 0 */
	bkv__req **passed;   /* [PASS_MAX] set aside in this admission */
	uint32_t n_passed;   /* entries in passed */
	uint64_t mark;       /* calls listed so far */
};

int bkv__adapters_alloc(bkv_sched *s)
{
	struct bkv__adapters *ad;

	if (!s->cfg.max_adapters)
		return BKV_OK;
	ad = bkv__calloc(&s->alloc, 1, sizeof(*ad));
	if (!ad)
		return BKV_ENOMEM;
	s->ad = ad;
	ad->tab = bkv__calloc(&s->alloc, s->cfg.max_adapters, sizeof(bkv__adapter));
	ad->passed = bkv__calloc(&s->alloc, PASS_MAX, sizeof(bkv__req *));
	return ad->tab && ad->passed ? BKV_OK : BKV_ENOMEM;
}

void bkv__adapters_free(bkv_sched *s)
{
	struct bkv__adapters *ad = s->ad;

	if (!ad)
		return;
	bkv__free(&s->alloc, ad->tab, (size_t)s->cfg.max_adapters * sizeof(bkv__adapter));
	bkv__free(&s->alloc, ad->passed, PASS_MAX * sizeof(bkv__req *));
	bkv__free(&s->alloc, ad, sizeof(*ad));
	s->ad = NULL;
}

/* The entry holding id, or max_adapters when none does. */
static uint32_t adapter_find(const bkv_sched *s, uint32_t id)
{
	const bkv__adapter *t = s->ad->tab;
	uint32_t i, m = s->cfg.max_adapters;

	for (i = 0; i < m; i++)
		if (t[i].id == id)
			return i;
	return m;
}

int bkv__adapter_fits(const bkv_sched *s, const bkv__req *r)
{
	return !r->adapter || s->ad->n_held < s->cfg.max_adapters ||
	       adapter_find(s, r->adapter) < s->cfg.max_adapters;
}

void bkv__adapter_hold(bkv_sched *s, bkv__req *r)
{
	struct bkv__adapters *ad = s->ad;
	uint32_t i;

	if (!r->adapter)
		return;
	i = adapter_find(s, r->adapter);
	if (i == s->cfg.max_adapters) {
		i = adapter_find(s, 0); /* a free entry: bkv__adapter_fits said so */
		BKV_ASSERT(i < s->cfg.max_adapters);
		ad->tab[i].id = r->adapter;
		ad->tab[i].users = 0;
		ad->n_held++;
	}
	ad->tab[i].users++;
	r->ad_slot = i;
}

void bkv__adapter_drop(bkv_sched *s, bkv__req *r)
{
	bkv__adapter *e;

	if (!r->adapter)
		return;
	e = &s->ad->tab[r->ad_slot];
	BKV_ASSERT(e->id == r->adapter && e->users > 0);
	if (--e->users == 0) {
		e->id = 0;
		s->ad->n_held--;
	}
}

/* How long a request may be passed (bkv_sched_config.adapter_wait_us). */
static double wait_bound(const bkv_sched *s, const bkv__req *r)
{
	double b;

	if (s->cfg.adapter_wait_us)
		return (double)s->cfg.adapter_wait_us;
	b = bkv__bypass_bound(s, r);
	return b >= 0.0 ? b : (double)AUTO_WAIT_US;
}

int bkv__adapter_pass(bkv_sched *s, bkv__req *r, uint64_t now)
{
	struct bkv__adapters *ad = s->ad;

	if (ad->n_passed == PASS_MAX)
		return 0;
	if (now > r->enq_us && (double)(now - r->enq_us) > wait_bound(s, r))
		return 0; /* passed long enough: admission waits for it */
	bkv__queue_remove(s, r);
	ad->passed[ad->n_passed++] = r;
	s->stats.adapter_passes++;
	return 1;
}

void bkv__adapters_unpass(bkv_sched *s)
{
	struct bkv__adapters *ad = s->ad;
	uint32_t i;

	if (!ad)
		return;
	for (i = 0; i < ad->n_passed; i++)
		bkv__queue_push(s, ad->passed[i]); /* its (priority, order) key
						      puts it back in place */
	ad->n_passed = 0;
}

void bkv__adapters_batch(const bkv_sched *s, bkv_batch *b, const bkv__row *rows, uint32_t n_rows)
{
	struct bkv__adapters *ad = s->ad;
	uint32_t *const ra = s->call.arr.row_adapter, *const list = s->call.arr.adapters;
	const uint64_t mark = ++ad->mark;
	uint32_t r, n = 0;

	for (r = 0; r < n_rows; r++) {
		const bkv__req *q = rows[r].lane->req;

		ra[r] = q->adapter;
		if (q->adapter && ad->tab[q->ad_slot].mark != mark) {
			ad->tab[q->ad_slot].mark = mark;
			list[n++] = q->adapter;
		}
	}
	BKV_ASSERT(n <= s->cfg.max_adapters);
	b->row_adapter = ra;
	b->n_adapters = n;
	b->adapters = n ? list : NULL;
}

/* bkv_sched_check 38: the table counts exactly the running requests'
 * adapters, each in the entry it names, and nothing is set aside. */
int bkv__adapters_check(const bkv_sched *s)
{
	const struct bkv__adapters *ad = s->ad;
	uint32_t i, j, held = 0, users;

	if (!ad) {
		for (i = 0; i < s->rs.nr_run; i++)
			if (s->rs.run[i]->adapter)
				return 1;
		return 0;
	}
	if (ad->n_passed)
		return 1;
	for (i = 0; i < s->cfg.max_adapters; i++) {
		const bkv__adapter *e = &ad->tab[i];

		if (!e->id) {
			if (e->users)
				return 1;
			continue;
		}
		held++;
		for (users = 0, j = 0; j < s->rs.nr_run; j++) {
			const bkv__req *r = s->rs.run[j];

			if (REQ_IS_RUNNING(r) && r->adapter == e->id && r->ad_slot == i)
				users++;
		}
		if (users != e->users || adapter_find(s, e->id) != i)
			return 1;
	}
	for (j = 0; j < s->rs.nr_run; j++) {
		const bkv__req *r = s->rs.run[j];

		if (REQ_IS_RUNNING(r) && r->adapter &&
		    (r->ad_slot >= s->cfg.max_adapters || ad->tab[r->ad_slot].id != r->adapter))
			return 1;
	}
	return held != ad->n_held;
}

/* The adapter's key: murmur3's 64-bit finalizer over the pair, in a domain
 * of its own (not splitmix64's: KV groups salt their lanes' keys with that,
 * pool/lanes.c), so that keys of different (cache_key, adapter) pairs, and
 * lanes' salted keys, differ but for a 2^-64 chance. */
uint64_t bkv_adapter_cache_key(uint64_t cache_key, uint32_t adapter)
{
	uint64_t z;

	if (!adapter)
		return cache_key;
	z = bkv__fmix64((cache_key ^ 0x6a09e667f3bcc909ull) + 0xd1b54a32d192ed03ull * (uint64_t)adapter);
	return z ? z : 1u;
}
