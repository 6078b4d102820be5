/*
 * value.c - eviction by value: which cached block the prefix cache gives up
 * when a take finds the free list empty, priced as well as aged.
 *
 * A cached block is worth what it would save if it were hit again: the
 * recompute it avoids, which is the cost model's price of prefilling it at
 * its depth (p0 + p1 x depth: attention over a deeper prefix costs more),
 * times the chance it is hit, read from its hit history (a count of hits
 * taken from the cache that halves every 2^val_shift clock ticks, an eighth
 * of the pool's size in hits and evictions, at least 16), against the
 * memory it holds: one frame (with KV groups every group's block is a
 * frame on the same LRU, so each group's blocks are weighed and counted,
 * none forgotten). Its expected saving per frame, over a never-hit depth-0
 * block's, is
 *
 *     v = (p0 + w x p1 x depth) / p0 x (1 + decayed hits)  >= 1
 *
 * w = 1 while its decayed hit count is above 0, else 1/16: a deep block no
 * hit has shown to be reused (a long prompt's own tail) kept its full price
 * for as long as a reused one and cost up to 0.6 points of hits against
 * LRU on the Mooncake and agent traces; with w and the eighth-of-a-pool
 * decay every all-full row there is at or above LRU.
 *
 * GreedyDual (Cao and Irani's GreedyDual-Size, priced per frame). Value
 * alone would keep a block once hit long after its traffic has gone and
 * evict a conversation's fresh turn before its next one: below LRU on
 * multi-turn traces. So a block gets, when it is released to the LRU,
 *
 *     h = val_gd + v
 *
 * and eviction takes the least h; val_gd, the clock, rises to the h of
 * each block evicted. A block not used again falls behind the clock as it
 * rises and goes; v buys it about v - 1 more turns of the cache. With
 * every v equal the order is LRU's.
 *
 * Classes, not a heap. Keeping every cached block in order of h would cost
 * O(log n) a release and a hit. Instead a block joins the tail of one of
 * BKV__VAL_CLASSES doubly linked lists by half-octave of v (class
 * floor(2 log2 v)); within a class the clock only rose between pushes, so
 * a class's head holds about its least h, and eviction takes the least h
 * of the (at most 16) class heads: O(1) a push, an unlink and an
 * eviction. The chunked LRU of kv/cache.c still holds every cached block
 * (its membership, counts and checker stay as they are); the class lists
 * are kept beside it by hooks in bkv__lru_push and bkv__lru_unlink, so
 * they hold exactly the LRU's blocks.
 *
 * Chains. A block with indexed children cannot go (a cached child would
 * lose its parent); a parent may have less h than its children (deeper
 * blocks are dearer, and hits differ along a chain), and a class's head
 * may hide a leaf behind it. When the chosen head has indexed children it
 * moves to the tail of the next class up, its h kept, and the next
 * choice sees what was behind it. Each eviction makes at most
 * GREEDY_MOVES such moves (2 x BKV__VAL_CLASSES without prices) and then
 * takes the LRU's own head, which never has indexed children (kv/cache.c),
 * so an eviction always succeeds in bounded work. (A parent priced below
 * its children keeps coming back to the front; the LRU head, the oldest
 * leaf, is what GreedyDual takes among equals, and 8 moves measured best
 * of 2, 8 and 32 on the Mooncake and agent traces.)
 *
 * Aging. A class is fixed when a block joins it; its hits decay after. Each
 * eviction re-prices one class head (round robin over the classes) and
 * moves it down to the tail of the class it has decayed to: O(1).
 *
 * KV groups whose lanes release blocks (a window's, a chunk's): a hit needs
 * every lane's blocks at its end, and a price per block keeps a chain's
 * popular prefix after the window blocks at its end are gone, which no hit
 * can then use (measured: 6.6 points of prefix hits below LRU on the agent
 * trace). There every v is 1 (times a retention priority): LRU's order
 * above the lane keeping rule's cold blocks.
 *
 * The lane keeping rule (bkv__kv_lanes_on, for a pool whose sliding-window
 * or chunked lanes release blocks: pool/lanes.c). The records are on
 * without prices, and class 0 is the cold blocks' alone: blocks the pool
 * released as worth little (bkv__block_put_cold, kv/kv.h: a lane block
 * no hit is expected to end at), evicted first, oldest first; every other
 * block is in class 1 in release order, which is LRU's order. With
 * retention bands, band 0 shares class 1 with band 1; with eviction by
 * value (another user's prices) the classes move up by one, above the
 * cold (priced alongside, a window's leftovers would take half the cache
 * in release order). A cold block never has indexed children (a
 * lane block is a leaf), so the chain rule below never moves one.
 *
 * The segmented LRU (BKV_EVICT_SEGMENTED, bkv__kv_seg_on) uses the same
 * lists without prices, for traffic that comes back in cycles (sessions
 * taking turns, agents re-reading their contexts): under plain LRU, once the
 * cycle's contexts outgrow the cache every block is evicted just before its
 * turn comes, and the hits fall to nothing. Three classes: BKV__SEG_COLD
 * (the lane keeping rule's cold blocks), BKV__SEG_PROB (probation) and
 * BKV__SEG_PROT (protected), LRU within each, probation evicted before
 * protected. A block released to the cache joins the protected list when
 * it was taken back by a hit since it was last cached and that reuse came
 * sooner than the stalest protected block's last use (LIRS's test: a reuse
 * distance below the oldest protected block's recency; marked
 * BKV__SEG_HIT in its record while it is pinned), when it is a new block
 * extending a chain so reused (BKV__SEG_EXT, from its parent when it is
 * indexed: a conversation's next turn joins its protected prefix whole),
 * when it was protected already (a hit that failed the test, or a lift),
 * or while the protected list has room (val_prot_max: a cache that has
 * never been full is all protected); else probation. A block computed
 * again after an eviction that LRU would have made too (its ghost is in
 * val_ghost, further back than LRU reaches), or extending a chain that
 * was, is BKV__SEG_BACK: its release joins the protected list
 * whole when the whole release fits in the room, else probation whole
 * (seg_back_class). Protecting part of a chain that comes back keeps
 * blocks no hit can use when a hit needs a window's blocks at its end
 * (KV groups), and a cycle's chains come back every turn: whole or not at
 * all, the protected list keeps as many whole chains as it holds. A push that leaves
 * the protected list over its room moves its head (its least recently
 * used block, a chain's deepest first) to the probation tail. So a prefix
 * used once waits in probation and goes first (admission control), and a
 * cycle longer than the cache cannot push out the part of it that the
 * protected list holds, hit on every turn, while the rest passes through
 * probation: hits fall with the cache's size instead of all at once.
 * Chains: a block promoted by a hit has its whole prefix hit too (a hit is
 * a prefix); a probation head with indexed children moves to the
 * protected tail (the rule above), a protected one to the protected tail.
 * With retention (val_ret) the bands decide and the segments are off.
 * Every step is O(1): no allocation (the ghost table is allocated when the
 * policy goes on), no scan.
 *
 * Sizing. How much of the cache to protect depends on the traffic: a
 * cycle wants as much as the running prompts leave, conversations whose
 * next turn comes soon want a long probation (plain LRU holds them best).
 * The room moves by one block on each event that shows which of the two
 * would have served the block better, judged by its distance in pushes
 * (val_pclock ticks since the block was last released, about the
 * distinct blocks cached after it, as LRU orders them) against the
 * blocks not pinned (what LRU could have kept):
 *   - a hit whose distance is beyond that: LRU would have evicted the
 *     block, protection kept it: one more block of room;
 *   - a block computed again whose ghost (the hash and push stamp an
 *     eviction left in val_ghost, a direct-mapped table of the last
 *     evictions) is within that distance: LRU would have kept it: one
 *     less;
 *   - an eviction that finds probation empty and takes a protected block:
 *     the running prompts need more than probation holds: one less.
 * A one-sided workload settles at a bound: a cycle at nb - nb / 8,
 * recency at 0, where every protected push is moved at once to the
 * probation tail and the order is LRU's (a floor of nb / 8 cost up to
 * 1.2 points of hits against LRU on the agent trace at a quarter of its
 * working set).
 *
 * kv/cache.c's bkv__cache_evict asks bkv__val_pick which block goes and
 * evicts it (this file calls nothing of cache.c: the layers test keeps
 * calls one way between files).
 *
 * The decision layer turns the policy on (decide/evict.c, from
 * bkv_sched_config.evict) with prices from the scheduler's cost model; the
 * records (28 bytes a device block) exist only while it is on (the
 * segmented LRU's ghost table, 8 bytes a slot, nb rounded up to a power of
 * two slots, too).
 *
 * Retention priorities (bkv__kv.val_ret, pool/retain.c). A request's range
 * gives an indexed block a priority (rprio) until a clock (val_exp). By
 * bands (the scheduler's LRU with retention) a block's class is its
 * priority's band instead of its value: LRU within a band, a lower band
 * first, the chain rule above unchanged. By value the priority multiplies
 * v by priority / default. An expired priority is seen lazily: each
 * eviction looks at every class head (expire_heads) and moves an expired
 * one to its class as the default; the aging re-prices class 0's head too.
 */
#include "kv/kv.h"

#include <math.h>
#include <string.h>

#define VAL_UNIT 256u           /* one hit in bkv__val.freq */
#define GREEDY_MOVES 8u         /* moves an eviction by price makes at most */
#define VAL_FREQ_MAX (1u << 24) /* the count saturates here */
#define DEPTH_UNKNOWN UINT32_MAX

static uint32_t ilog2(uint32_t x)
{
	uint32_t r = 0;

	while (x >>= 1)
		r++;
	return r;
}

static inline uint32_t ctz32(uint32_t x)
{
#if defined(__GNUC__) || defined(__clang__)
	return (uint32_t)__builtin_ctz(x);
#else
	uint32_t r = 0;

	while (!(x & 1u)) {
		x >>= 1;
		r++;
	}
	return r;
#endif
}

/* b's count decayed to now. */
static inline uint32_t freq_now(const bkv__kv *kv, const bkv__val *v)
{
	uint32_t halvings = (kv->val_clock - v->stamp) >> kv->val_shift;

	return halvings >= 32 ? 0 : v->freq >> halvings;
}

/* b's retention priority in force now: the default when none was given or
 * its duration has run out (read lazily: when b is pushed or re-priced). */
static inline uint32_t prio_now(const bkv__kv *kv, int32_t b)
{
	uint32_t r = kv->val[b].rprio;

	if (!r || kv->val_exp[b] <= kv->val_now)
		return BKV_RETENTION_PRIORITY_DEFAULT;
	return r - 1;
}

/* The band of a retention priority: 0..4 below the default (seven
 * priorities each), the default alone in 5, 6..15 above it. */
static uint32_t prio_band(uint32_t p)
{
	if (p < BKV_RETENTION_PRIORITY_DEFAULT)
		return p / 7u;
	if (p == BKV_RETENTION_PRIORITY_DEFAULT)
		return 5;
	return 6u + (p - BKV_RETENTION_PRIORITY_DEFAULT - 1u) * 10u /
			    (BKV_RETENTION_PRIORITY_MAX - BKV_RETENTION_PRIORITY_DEFAULT);
}

/* b's expected saving now over a fresh depth-0 block's (v above; with
 * retention by value, times its priority over the default). */
static double price_of(const bkv__kv *kv, int32_t b)
{
	const bkv__val *v = &kv->val[b];
	double x = 1.0; /* with the lane keeping rule: see the opening */

	if (!kv->val_lanes) {
		uint32_t f = freq_now(kv, v);
		double w = f ? 1.0 : 1.0 / 16.0; /* (see the opening) */

		x = (1.0 + w * kv->val_r1 * (double)v->depth) * (1.0 + (double)f * (1.0 / VAL_UNIT));
	}
	if (kv->val_ret == BKV__RET_VALUE)
		x *= (double)prio_now(kv, b) / BKV_RETENTION_PRIORITY_DEFAULT;
	return x;
}

/* The class of b's expected saving now (with retention by bands: of its
 * priority's band). */
static uint32_t class_of(const bkv__kv *kv, int32_t b)
{
	const bkv__val *v = &kv->val[b];
	double x;
	int e, c;
	double m;

	if (v->cold)
		return 0; /* the lane keeping rule: first to go */
	if (kv->val_ret == BKV__RET_BANDS) {
		c = (int)prio_band(prio_now(kv, b));
		return kv->val_lanes && c == 0 ? 1 : (uint32_t)c; /* 0: the cold */
	}
	if (kv->val_seg)
		return BKV__SEG_PROB; /* (placed by seg_push) */
	if (kv->val_lanes && bkv__val_unpriced(kv))
		return 1; /* the lane keeping rule's LRU, above the cold */
	x = price_of(kv, b);
	if (!(x > 0.0))
		return kv->val_lanes ? 1 : 0;
	m = frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
	c = 2 * (e - 1) + (m >= 0.70710678118654752); /* floor(2 log2 x) */
	if (c < 0)
		c = 0;
	c += kv->val_lanes != 0; /* (class 0: the lane keeping rule's cold) */
	return c >= (int)BKV__VAL_CLASSES - 1 ? BKV__VAL_CLASSES - 1 : (uint32_t)c;
}

/* ---- the class lists ----------------------------------------------------- */

static void list_append(bkv__kv *kv, int32_t b, uint32_t c)
{
	bkv__val *v = &kv->val[b];
	int32_t t = kv->val_tail[c];

	v->cls = (uint8_t)c;
	v->on = 1;
	v->next = -1;
	v->prev = t;
	if (t >= 0)
		kv->val[t].next = b;
	else
		kv->val_head[c] = b;
	kv->val_tail[c] = b;
	kv->val_mask |= 1u << c;
	kv->val_prot_n += c == BKV__SEG_PROT;
}

static void list_remove(bkv__kv *kv, int32_t b)
{
	bkv__val *v = &kv->val[b];
	uint32_t c = v->cls;

	if (v->prev >= 0)
		kv->val[v->prev].next = v->next;
	else
		kv->val_head[c] = v->next;
	if (v->next >= 0)
		kv->val[v->next].prev = v->prev;
	else
		kv->val_tail[c] = v->prev;
	if (kv->val_head[c] < 0)
		kv->val_mask &= ~(1u << c);
	v->prev = v->next = -1;
	v->on = 0;
	kv->val_prot_n -= c == BKV__SEG_PROT;
}

/* ---- the segmented LRU ----------------------------------------------------- */

static inline int seg_active(const bkv__kv *kv)
{
	return kv->val_seg && !kv->val_ret;
}

/* The protected head (its least recently used block; of a release, the
 * deepest) to the probation tail. */
static void seg_demote(bkv__kv *kv)
{
	int32_t h = kv->val_head[BKV__SEG_PROT];

	list_remove(kv, h);
	list_append(kv, h, BKV__SEG_PROB);
	kv->val_demoted++;
}

/* A BACK block's list: the protected list when the close releasing it
 * (bkv__kv_close_begin: val_rel_n blocks, every lane's) fits in the room
 * whole, decided at its first BACK block and kept for the rest; probation
 * outside a close (a window's or a truncate's release is no whole chain). */
static uint32_t seg_back_class(bkv__kv *kv)
{
	if (!kv->val_rel_n)
		return BKV__SEG_PROB;
	if (!kv->val_rel_dec)
		kv->val_rel_dec = (uint64_t)kv->val_prot_n + kv->val_rel_n <= kv->val_prot_max
					  ? BKV__SEG_PROT
					  : BKV__SEG_PROB;
	return kv->val_rel_dec;
}

/* A sequence's close begins: it releases n blocks (every lane's), whose
 * BACK blocks join one list together (seg_back_class). */
void bkv__kv_close_begin(bkv__kv *kv, uint32_t n)
{
	if (kv->val_seg) {
		kv->val_rel_n = n ? n : 1;
		kv->val_rel_dec = 0;
	}
}

void bkv__kv_close_end(bkv__kv *kv)
{
	kv->val_rel_n = 0;
}

/* b joins the cache: protected after a hit that passed the test, as an
 * extension of such a chain, when it was protected, or while there is
 * room; when it comes back after an eviction, protected only with its whole
 * release (seg_back_class); else probation. Then the protected list back
 * within its room. */
static void seg_push(bkv__kv *kv, int32_t b)
{
	bkv__val *v = &kv->val[b];
	uint32_t c;

	v->stamp = v->cold ? kv->val_pclock : kv->val_pclock++;
	if (v->cold) {
		c = BKV__SEG_COLD;
	} else if (v->cls == BKV__SEG_BACK) {
		c = seg_back_class(kv);
	} else if (v->cls == BKV__SEG_PROT || v->cls == BKV__SEG_HIT || v->cls == BKV__SEG_EXT ||
		   kv->val_prot_n < kv->val_prot_max) {
		kv->val_promoted += v->cls == BKV__SEG_HIT;
		c = BKV__SEG_PROT;
	} else {
		c = BKV__SEG_PROB;
	}
	list_append(kv, b, c);
	while (kv->val_prot_n > kv->val_prot_max)
		seg_demote(kv);
}

/* Are the prices in force (eviction by value: GreedyDual over the class
 * heads), rather than an order by segment or retention? */
static inline int greedy(const bkv__kv *kv)
{
	return !seg_active(kv) && !kv->val_ret && !bkv__val_unpriced(kv);
}

void bkv__val_push(bkv__kv *kv, int32_t b)
{
	if (seg_active(kv)) {
		seg_push(kv, b);
		return;
	}
	if (greedy(kv))
		kv->val[b].h = (float)(kv->val_gd + price_of(kv, b));
	list_append(kv, b, class_of(kv, b));
}

void bkv__val_unlink(bkv__kv *kv, int32_t b)
{
	if (kv->val[b].on)
		list_remove(kv, b);
	kv->val[b].cold = 0; /* cold only while cached */
}

/* ---- on / off ------------------------------------------------------------ */

/* Depths of every indexed block, each chain walked once: up to the first
 * ancestor whose depth is known (or the root), then down again. */
static void depths_fill(bkv__kv *kv)
{
	uint32_t i;

	for (i = 0; i < kv->nb; i++) {
		memset(&kv->val[i], 0, sizeof(kv->val[i]));
		kv->val[i].depth = DEPTH_UNKNOWN;
		kv->val[i].stamp = kv->val_clock;
		kv->val[i].prev = kv->val[i].next = -1;
	}
	for (i = 0; i < kv->nb; i++) {
		int32_t b = (int32_t)i, p;
		uint32_t up = 0, base;

		if (!BLOCK_IS_INDEXED(&kv->blk[i]) || kv->val[i].depth != DEPTH_UNKNOWN)
			continue;
		for (p = kv->blk[b].parent; p >= 0 && kv->val[p].depth == DEPTH_UNKNOWN;
		     p = kv->blk[p].parent)
			up++;
		base = p >= 0 ? kv->val[p].depth + 1 : 0;
		for (; b != p; b = kv->blk[b].parent)
			kv->val[b].depth = base + up--;
	}
}

int bkv__kv_value_on(bkv__kv *kv, const bkv_allocator *a, double p0, double p1)
{
	kv->val_p0 = p0 > 0.0 ? p0 : 1.0;
	kv->val_p1 = p1 > 0.0 ? p1 : 0.0;
	kv->val_r1 = kv->val_p1 / kv->val_p0;
	if (!kv->val) {
		bkv__val *v = bkv__malloc(a, (size_t)kv->nb * sizeof(*v));
		uint32_t c;
		int32_t s;

		if (!v)
			return BKV_ENOMEM;
		kv->val = v;
		kv->hit_slow = 1;
		kv->val_clock = 0;
		kv->val_gd = 0.0;
		kv->val_shift = ilog2(kv->nb > 128 ? kv->nb : 128) - 3; /* nb / 8, >= 16 */
		kv->val_mask = 0;
		kv->val_prot_n = 0;
		kv->val_rr = 0;
		for (c = 0; c < BKV__VAL_CLASSES; c++)
			kv->val_head[c] = kv->val_tail[c] = -1;
		depths_fill(kv);
		/* the cached blocks, oldest first, onto their classes */
		for (s = kv->lru_head; s >= 0; s = bkv__lru_next(kv, s))
			bkv__val_push(kv, kv->lru[s]);
	}
	kv->val_users++;
	return BKV_OK;
}

void bkv__kv_value_off(bkv__kv *kv, const bkv_allocator *a)
{
	if (!kv->val || --kv->val_users)
		return;
	bkv__free(a, kv->val, (size_t)kv->nb * sizeof(*kv->val));
	kv->val = NULL;
	kv->hit_slow = kv->ck_k != 0;
	kv->val_lanes = 0;
}

int bkv__kv_lanes_on(bkv__kv *kv, const bkv_allocator *a)
{
	int rc = kv->val ? bkv__kv_value_on(kv, a, kv->val_p0, kv->val_p1)
			 : bkv__kv_value_on(kv, a, 1.0, 0.0);

	if (rc == BKV_OK)
		kv->val_lanes++;
	return rc;
}

void bkv__kv_lanes_off(bkv__kv *kv, const bkv_allocator *a)
{
	if (!kv->val || !kv->val_lanes)
		return;
	kv->val_lanes--;
	bkv__kv_value_off(kv, a);
}

int bkv__kv_seg_on(bkv__kv *kv, const bkv_allocator *a)
{
	int rc = kv->val ? bkv__kv_value_on(kv, a, kv->val_p0, kv->val_p1)
			 : bkv__kv_value_on(kv, a, 1.0, 0.0);
	int32_t s;

	if (rc != BKV_OK)
		return rc;
	if (!kv->val_seg) {
		uint32_t n = 1;

		while (n < kv->nb)
			n <<= 1;
		kv->val_ghost = bkv__malloc(a, (size_t)n * sizeof(uint64_t));
		if (!kv->val_ghost) {
			bkv__kv_value_off(kv, a);
			return BKV_ENOMEM;
		}
		memset(kv->val_ghost, 0, (size_t)n * sizeof(uint64_t));
		kv->val_ghost_mask = n - 1;
		kv->val_prot_max = kv->nb / 2;
	}
	if (kv->val_seg++ || kv->val_ret)
		return BKV_OK;
	/* the cached blocks again, oldest first: the protected list fills */
	for (s = kv->lru_head; s >= 0; s = bkv__lru_next(kv, s)) {
		int32_t b = kv->lru[s];

		list_remove(kv, b);
		kv->val[b].cls = BKV__SEG_PROB;
		seg_push(kv, b);
	}
	return BKV_OK;
}

void bkv__kv_seg_off(bkv__kv *kv, const bkv_allocator *a)
{
	int32_t s;

	if (!kv->val || !kv->val_seg)
		return;
	if (!--kv->val_seg) {
		bkv__free(a, kv->val_ghost, ((size_t)kv->val_ghost_mask + 1) * sizeof(uint64_t));
		kv->val_ghost = NULL;
		kv->val_ghost_mask = 0;
		for (s = kv->lru_head; kv->val_users > 1 && s >= 0; s = bkv__lru_next(kv, s)) {
			int32_t b = kv->lru[s];

			list_remove(kv, b);
			bkv__val_push(kv, b); /* by the remaining users' rule */
		}
	}
	bkv__kv_value_off(kv, a);
}

/* ---- records ------------------------------------------------------------- */

/* b was indexed (its hash set) and may have been evicted recently: LRU
 * would have kept it when its ghost is within LRU's reach: less room.
 * Returns whether it had a ghost beyond that reach (it comes back where
 * LRU would have missed it too). */
static int seg_ghost_hit(bkv__kv *kv, int32_t b)
{
	uint64_t h = kv->blk[b].hash, *g = &kv->val_ghost[(uint32_t)h & kv->val_ghost_mask];

	int near;

	if (*g >> 32 != h >> 32 || !*g)
		return 0;
	near = kv->val_pclock - (uint32_t)*g < kv->nb - kv->nr_used;
	if (near && kv->val_prot_max > 0)
		kv->val_prot_max--;
	*g = 0;
	return !near;
}

/* b is the eviction's victim: its ghost, and less room when it had to
 * come from the protected list. */
static void seg_evicted(bkv__kv *kv, int32_t b)
{
	uint64_t h = kv->blk[b].hash;

	kv->val_ghost[(uint32_t)h & kv->val_ghost_mask] =
		(h >> 32 << 32 | kv->val[b].stamp) | (h >> 32 ? 0 : 1); /* never 0 */
	if (kv->val[b].cls == BKV__SEG_PROT && kv->val_prot_max > 0)
		kv->val_prot_max--;
}

void bkv__val_indexed(bkv__kv *kv, int32_t b)
{
	bkv__val *v = &kv->val[b];
	int32_t p = kv->blk[b].parent;
	uint8_t pc = p >= 0 ? kv->val[p].cls : BKV__SEG_PROB;

	v->depth = p >= 0 ? kv->val[p].depth + 1 : 0;
	/* a new block; with the segmented LRU, an extension of a chain just
	 * reused when its parent is (both are pinned: markers), else back
	 * after an eviction when it has a ghost or extends a chain that has */
	v->cls = pc == BKV__SEG_HIT || pc == BKV__SEG_EXT ? BKV__SEG_EXT : BKV__SEG_PROB;
	if (kv->val_seg && kv->val_ghost &&
	    (seg_ghost_hit(kv, b) || pc == BKV__SEG_BACK) && v->cls == BKV__SEG_PROB)
		v->cls = BKV__SEG_BACK;
	v->freq = 0;
	v->stamp = kv->val_clock;
	v->rprio = 0;
	if (kv->val_exp)
		kv->val_exp[b] = UINT64_MAX;
}

void bkv__block_hit_slow(bkv__kv *kv, int32_t b)
{
	if (kv->ck_k)
		bkv__ck_pinned(kv, b);
	if (kv->val)
		bkv__val_hit(kv, b);
}

void bkv__val_hit(bkv__kv *kv, int32_t b)
{
	bkv__val *v = &kv->val[b];
	uint32_t f = freq_now(kv, v) + VAL_UNIT;

	if (kv->val_seg) {
		uint32_t d = kv->val_pclock - v->stamp;
		int32_t h = kv->val_head[BKV__SEG_PROT];

		/* kept beyond LRU's reach: more room */
		if (d >= kv->nb - kv->nr_used && kv->val_prot_max < kv->nb - kv->nb / 8)
			kv->val_prot_max++;
		/* reused sooner than the stalest protected block was: protected
		 * (seg_push), and so are the blocks its chain grows by
		 * (BKV__SEG_EXT); else a protected block stays so */
		if (h < 0 || kv->val_pclock - kv->val[h].stamp > d)
			v->cls = BKV__SEG_HIT;
		else if (v->cls != BKV__SEG_PROT)
			v->cls = BKV__SEG_PROB;
	}
	v->freq = f < VAL_FREQ_MAX ? f : VAL_FREQ_MAX;
	v->stamp = kv->val_clock++;
}

/* ---- retention priorities ------------------------------------------------ */

int bkv__kv_retain_on(bkv__kv *kv, const bkv_allocator *a, uint32_t mode)
{
	uint32_t i;

	if (!kv->val)
		return BKV_EINVAL;
	if (!kv->val_exp) {
		kv->val_exp = bkv__malloc(a, (size_t)kv->nb * sizeof(uint64_t));
		if (!kv->val_exp)
			return BKV_ENOMEM;
	}
	for (i = 0; i < kv->nb; i++) {
		kv->val[i].rprio = 0;
		kv->val_exp[i] = UINT64_MAX;
	}
	kv->val_ret = mode;
	return BKV_OK;
}

size_t bkv__kv_value_bytes(const bkv__kv *kv)
{
	return (kv->val ? (size_t)kv->nb * sizeof(*kv->val) : 0) +
	       (kv->val_exp ? (size_t)kv->nb * sizeof(uint64_t) : 0) +
	       (kv->val_ghost ? ((size_t)kv->val_ghost_mask + 1) * sizeof(uint64_t) : 0);
}

void bkv__kv_retain_off(bkv__kv *kv, const bkv_allocator *a)
{
	uint32_t i;

	if (!kv->val_exp)
		return;
	for (i = 0; kv->val && i < kv->nb; i++)
		kv->val[i].rprio = 0;
	bkv__free(a, kv->val_exp, (size_t)kv->nb * sizeof(uint64_t));
	kv->val_exp = NULL;
	kv->val_ret = BKV__RET_OFF;
}

void bkv__kv_retain(bkv__kv *kv, int32_t b, uint32_t prio, uint64_t exp)
{
	bkv__val *v;
	uint32_t cur;

	if (!kv->val_ret || !BLOCK_IS_INDEXED(&kv->blk[b]))
		return;
	v = &kv->val[b];
	cur = v->rprio && kv->val_exp[b] > kv->val_now ? v->rprio - 1u : UINT32_MAX;
	if (cur == UINT32_MAX || prio > cur) {
		v->rprio = (uint8_t)(prio + 1u);
		kv->val_exp[b] = exp;
	} else if (prio == cur && exp > kv->val_exp[b]) {
		kv->val_exp[b] = exp;
	}
}

/* ---- eviction ------------------------------------------------------------ */

/* Aging: one class head re-priced; to the tail of a lower class when its
 * hits have decayed below its class. */
static void age_one(bkv__kv *kv)
{
	uint32_t c = kv->val_rr, n;
	int32_t h;

	kv->val_rr = (c + 1) % BKV__VAL_CLASSES;
	if ((c == 0 && !kv->val_ret) || seg_active(kv) || (h = kv->val_head[c]) < 0)
		return;
	n = class_of(kv, h);
	if (n < c || (kv->val_ret && n > c)) { /* up: a low priority expired */
		list_remove(kv, h);
		list_append(kv, h, n);
		kv->val_moves++;
	}
}

/* Retention: a class head whose priority's duration has run out goes to
 * the tail of the class it now has (each class's head, one look each: a
 * range's blocks reach their head in turn, so expiries take effect at the
 * pace of evictions). */
static void expire_heads(bkv__kv *kv)
{
	uint32_t m = kv->val_mask;

	while (m) {
		uint32_t c = ctz32(m), n;
		int32_t h = kv->val_head[c];

		m &= m - 1;
		if (!kv->val[h].rprio || kv->val_exp[h] > kv->val_now)
			continue;
		n = class_of(kv, h);
		kv->val[h].rprio = 0; /* the default from now on */
		kv->val_exp[h] = UINT64_MAX;
		if (n != c) {
			list_remove(kv, h);
			list_append(kv, h, n);
			kv->val_moves++;
		}
	}
}

/* By value: the class head with the least h (within a class, heads were
 * pushed first, so they hold about its least). */
static int32_t greedy_head(const bkv__kv *kv, uint32_t *cls)
{
	uint32_t m = kv->val_mask;
	int32_t best = -1;

	while (m) {
		uint32_t c = ctz32(m);
		int32_t h = kv->val_head[c];

		m &= m - 1;
		if (best < 0 || kv->val[h].h < kv->val[best].h) {
			best = h;
			*cls = c;
		}
	}
	return best;
}

int32_t bkv__val_pick(bkv__kv *kv)
{
	int32_t b = -1;
	uint32_t moves;

	if (kv->lru_head < 0)
		return -1;
	if (kv->val_ret)
		expire_heads(kv);
	age_one(kv);
	for (moves = 0; moves < (greedy(kv) ? GREEDY_MOVES : 2 * BKV__VAL_CLASSES); moves++) {
		uint32_t c = ctz32(kv->val_mask);
		int32_t h = kv->val_head[c];

		if (greedy(kv) && !(c == 0 && kv->val_lanes))
			h = greedy_head(kv, &c);
		if (!kv->blk[h].kids) {
			b = h;
			break;
		}
		if (c + 1 == BKV__VAL_CLASSES)
			break; /* (not reached while the order holds) */
		list_remove(kv, h);
		kv->val[h].cold = 0; /* (a cold block has no children) */
		list_append(kv, h, seg_active(kv) && c >= BKV__SEG_PROB ? BKV__SEG_PROT : c + 1);
		kv->val_moves++;
	}
	if (b < 0)
		b = kv->lru[kv->lru_head]; /* never has indexed children */
	if (greedy(kv) && kv->val[b].h > kv->val_gd)
		kv->val_gd = kv->val[b].h;
	kv->val_clock++;
	if (seg_active(kv))
		seg_evicted(kv, b);
	return b;
}

/* ---- checker ------------------------------------------------------------- */

int bkv__val_check(const bkv__kv *kv)
{
	uint32_t i, c, n = 0, mask = 0;

	if (!kv->val)
		return kv->val_exp || kv->val_ret ? CHECK_VALUE : CHECK_OK;
	if ((kv->val_ret != BKV__RET_OFF) != (kv->val_exp != NULL) || kv->val_ret > BKV__RET_VALUE)
		return CHECK_VALUE;
	for (i = 0; i < kv->nb; i++) {
		const bkv__block *k = &kv->blk[i];
		const bkv__val *v = &kv->val[i];

		if (v->on != BLOCK_IS_CACHED(k) || (v->on && v->cls >= BKV__VAL_CLASSES))
			return CHECK_VALUE;
		/* the lane keeping rule: a cold block is cached, in class 0 */
		if (v->cold && (v->cold != 1 || !kv->val_lanes || !v->on || v->cls != 0))
			return CHECK_VALUE;
		/* retention: priorities only with it on and in scale (a block
		 * keeps its own until it is indexed again); no expiry without
		 * one */
		if (v->rprio && (!kv->val_exp || v->rprio > BKV_RETENTION_PRIORITY_MAX + 1u))
			return CHECK_VALUE;
		if (kv->val_exp && !v->rprio && kv->val_exp[i] != UINT64_MAX)
			return CHECK_VALUE;
		if (BLOCK_IS_INDEXED(k) &&
		    v->depth != (k->parent >= 0 ? kv->val[k->parent].depth + 1 : 0))
			return CHECK_VALUE;
	}
	for (c = 0; c < BKV__VAL_CLASSES; c++) {
		int32_t b = kv->val_head[c], prev = -1;
		uint32_t len = 0;

		if (b >= 0)
			mask |= 1u << c;
		for (; b >= 0; prev = b, b = kv->val[b].next) {
			if ((uint32_t)b >= kv->nb || ++len > kv->nr_cached || !kv->val[b].on ||
			    kv->val[b].cls != c || kv->val[b].prev != prev)
				return CHECK_VALUE;
		}
		if (kv->val_tail[c] != prev)
			return CHECK_VALUE;
		n += len;
		if (c == BKV__SEG_PROT && len != kv->val_prot_n)
			return CHECK_VALUE;
	}
	return n == kv->nr_cached && mask == kv->val_mask ? CHECK_OK : CHECK_VALUE;
}
