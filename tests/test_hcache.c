/*
 * test_hcache.c - the host cache (lib/pool/hcache.c): evicted device
 * blocks demoted to the host tier through swap-out copies, findable only
 * once the host performed them, reloaded by prefix hits through swap-in
 * copies; swapped sequences taking the host cache's blocks; failed calls
 * forgetting demotions; KV events naming each block's medium; KV groups
 * (every group's blocks demoted and reloaded, a hit whole in every group,
 * a STATE group's hit ending at a device checkpoint); and the
 * configurations that are refused.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool_util.h"

#define BT 4u

/* Append n tokens from first to a new sequence; returns it (open). */
static uint32_t seq_with(bkv_pool *p, int32_t first, uint32_t n, uint32_t *hit)
{
	int32_t t[256];
	uint32_t s, h = 0;

	cr_assert(n <= 256);
	fill_tokens(t, n, first);
	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	cr_assert_eq(bkv_seq_append(p, s, t, n, &h), BKV_OK);
	if (hit)
		*hit = h;
	cr_assert_eq(bkv_pool_check(p), 0);
	return s;
}

static uint32_t pending(const bkv_pool *p, bkv_copy_kind k, const bkv_copy **v)
{
	return bkv_pool_pending_copies(p, k, v);
}

/* Chain A (2 blocks) cached, then a 4-block sequence in a 4-block pool
 * evicts it: two swap-out copies, one per block, into host blocks. */
static void demote_chain_a(bkv_pool *p)
{
	const bkv_copy *v;
	uint32_t s;

	s = seq_with(p, 100, 2 * BT, NULL);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	s = seq_with(p, 500, 4 * BT, NULL);
	cr_assert_eq(pending(p, BKV_COPY_SWAP_OUT, &v), 2);
	cr_assert_eq(pool_stats(p).host_demoting, 2);
	cr_assert_eq(pool_stats(p).host_cached, 0);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
}

Test(hcache, evicted_blocks_are_copied_to_the_host_and_reloaded_by_a_later_hit)
{
	bkv_pool *p = make_hc_pool(BT, 4, 8, 0);
	const bkv_copy *v;
	uint32_t s, hit;

	demote_chain_a(p);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT); /* the host made them */
	cr_assert_eq(pool_stats(p).host_cached, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	/* chain A again, and one more token: both blocks come from the host */
	s = seq_with(p, 100, 2 * BT + 1, &hit);
	cr_assert_eq(hit, 2 * BT);
	cr_assert_eq(pending(p, BKV_COPY_SWAP_IN, &v), 2);
	cr_assert_eq(pool_stats(p).host_hit_blocks, 2);
	/* the swap-in copies land in the table's blocks */
	{
		uint32_t nbk;
		const int32_t *tab = bkv_seq_blocks(p, s, &nbk);

		cr_assert_eq(nbk, 3);
		cr_assert_eq(v[0].dst, tab[0]);
		cr_assert_eq(v[1].dst, tab[1]);
	}
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	/* inclusive: the host keeps its copies */
	cr_assert_eq(pool_stats(p).host_cached, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(hcache, a_demoted_block_is_not_found_before_its_copy_is_made)
{
	bkv_pool *p = make_hc_pool(BT, 4, 8, 0);
	uint32_t s, hit;

	demote_chain_a(p);
	/* the swap-out copies are still pending: the host has no KV yet */
	s = seq_with(p, 100, 2 * BT, &hit);
	cr_assert_eq(hit, 0);
	cr_assert_eq(pool_stats(p).host_hit_blocks, 0);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_destroy(p);
}

/* Two sequences of one step reload the same host blocks (inside the step's
 * transaction the first one's are not indexed yet): the second's copies
 * are duplicates. The commit puts the first's blocks in their place even
 * with the loads pending (a duplicate left private until then could be
 * shared by a fork first, and never be merged): the second sequence's
 * chain runs through indexed blocks. */
Test(hcache, a_duplicate_reload_is_merged_at_the_commit_with_its_copy_pending)
{
	bkv_pool *p = make_hc_pool(BT, 8, 8, 0);
	const int32_t *t1, *t2;
	uint32_t s, s1, s2, n1, n2, hit;

	s = seq_with(p, 100, 2 * BT, NULL);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	s = seq_with(p, 500, 8 * BT, NULL); /* evicts chain 100: demoted */
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
	cr_assert_eq(pool_stats(p).host_cached, 2);

	bkv__pool_txn_begin(p);
	s1 = seq_with(p, 100, 2 * BT, &hit);
	cr_assert_eq(hit, 2 * BT);
	s2 = seq_with(p, 100, 2 * BT, &hit);
	cr_assert_eq(hit, 2 * BT, "the second reloads from the host too");
	cr_assert_eq(pending(p, BKV_COPY_SWAP_IN, NULL), 4);
	bkv__pool_txn_commit(p); /* the copies are still pending */
	cr_assert_eq(bkv_pool_check(p), 0);
	t1 = bkv_seq_blocks(p, s1, &n1);
	t2 = bkv_seq_blocks(p, s2, &n2);
	cr_assert(n1 == 2 && n2 == 2);
	cr_assert(t1[0] == t2[0] && t1[1] == t2[1], "the duplicates merged into the indexed blocks");
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_close(p, s1), BKV_OK);
	cr_assert_eq(bkv_seq_close(p, s2), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(hcache, a_block_reloaded_and_evicted_again_costs_no_second_copy)
{
	bkv_pool *p = make_hc_pool(BT, 4, 8, 0);
	uint32_t s, hit;

	demote_chain_a(p);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	s = seq_with(p, 100, 2 * BT, &hit); /* evicts two blocks of the other chain */
	cr_assert_eq(hit, 2 * BT);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(pool_stats(p).host_demoted, 4);
	/* evict everything, chain A too: the host holds chain A already */
	s = seq_with(p, 900, 4 * BT, NULL);
	cr_assert_eq(pool_stats(p).host_kept, 2);
	cr_assert_eq(pool_stats(p).host_demoted, 6, "only the other chain's two are copied");
	cr_assert_eq(pending(p, BKV_COPY_SWAP_OUT, NULL), 2);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(hcache, a_swap_out_takes_the_host_caches_blocks)
{
	bkv_pool *p = make_hc_pool(BT, 4, 2, 0);
	uint32_t s;

	demote_chain_a(p); /* both host blocks demoting */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	s = seq_with(p, 700, 2 * BT, NULL); /* two more demotions replace chain A */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(pool_stats(p).host_cached, 2);
	cr_assert_eq(pool_stats(p).host_free, 0);
	cr_assert_eq(pool_stats(p).host_evictions, 2);
	cr_assert_eq(bkv_seq_swap_out(p, s), BKV_OK);
	cr_assert_eq(pool_stats(p).host_cached, 0);
	cr_assert_eq(pool_stats(p).host_evictions, 4);
	cr_assert_eq(bkv_pool_check(p), 0);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_destroy(p);
}

Test(hcache, pending_demotions_are_never_dropped_for_a_swap_out)
{
	bkv_pool *p = make_hc_pool(BT, 4, 2, 0);
	uint32_t s;
	bkv_pool_stats before;

	demote_chain_a(p); /* copies pending: the host blocks are not droppable */
	s = seq_with(p, 700, BT, NULL);
	before = pool_stats(p);
	cr_assert_eq(bkv_seq_swap_out(p, s), BKV_ENOSPC);
	expect_same_stats(&before, p);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_destroy(p);
}

Test(hcache, a_failed_call_forgets_its_demotions)
{
	bkv_pool *p = make_hc_pool(BT, 4, 8, 0);
	uint32_t s, hit;

	demote_chain_a(p);
	bkv__hc_forget_demotions(p); /* what a failed host call does first */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(pool_stats(p).host_cached, 0);
	cr_assert_eq(pool_stats(p).host_demoting, 0);
	cr_assert_eq(pool_stats(p).host_free, 8);
	cr_assert_eq(bkv_pool_check(p), 0);
	s = seq_with(p, 100, 2 * BT, &hit);
	cr_assert_eq(hit, 0);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_destroy(p);
}

Test(hcache, the_host_caches_lru_drops_its_oldest_block_for_a_new_demotion)
{
	bkv_pool *p = make_hc_pool(BT, 4, 4, 0);
	uint32_t s, hit;

	demote_chain_a(p);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	/* chain B cached, then evicted with the rest: the host keeps the
	 * newest demotions, chain B's */
	s = seq_with(p, 300, 2 * BT, NULL);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	s = seq_with(p, 800, 4 * BT, NULL);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_geq(pool_stats(p).host_evictions, 2);
	cr_assert_eq(bkv_pool_check(p), 0);
	s = seq_with(p, 300, 2 * BT, &hit);
	cr_assert_eq(hit, 2 * BT, "chain B, demoted last, is on the host");
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	s = seq_with(p, 100, 2 * BT, &hit);
	cr_assert_eq(hit, 0, "chain A, the oldest, was dropped");
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_destroy(p);
}

/* Replaying the host-medium events gives the host cache's hashes; the
 * device-medium ones the device index's. */
Test(hcache, events_name_the_medium_of_each_block)
{
	bkv_pool *p = make_hc_pool(BT, 4, 8, 64);
	bkv_kv_event ev[64];
	uint32_t n, i, host_stored = 0, host_removed = 0, s;

	demote_chain_a(p);
	bkv__hc_forget_demotions(p);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	demote_chain_a(p); /* chain A's device copy is gone: demoted again */
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	n = bkv_pool_drain_events(p, ev, 64);
	for (i = 0; i < n; i++) {
		cr_assert(ev[i].medium == BKV_MEDIUM_DEVICE || ev[i].medium == BKV_MEDIUM_HOST);
		cr_assert_eq(ev[i].reserved, 0);
		if (ev[i].medium != BKV_MEDIUM_HOST)
			continue;
		cr_assert_lt((uint32_t)ev[i].block, 8u);
		if (ev[i].kind == BKV_EVENT_STORED) {
			host_stored++;
			cr_assert_eq(ev[i].token_count, BT);
		} else {
			host_removed++;
		}
	}
	/* chain A demoted twice (4 stores), the first time forgotten (2) */
	cr_assert_eq(host_stored, 4);
	cr_assert_eq(host_removed, 2);
	cr_assert_eq(host_stored - host_removed, pool_stats(p).host_cached);
	s = seq_with(p, 100, 2 * BT, NULL);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_destroy(p);
}

Test(hcache, pools_that_cannot_have_a_host_cache_are_refused)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;
	bkv_kv_group g[2] = {{.kind = BKV_GROUP_FULL, .layers = 1, .bytes = 64},
			     {.kind = BKV_GROUP_WINDOW, .layers = 1, .span = 8, .bytes = 64}};

	bkv_pool_config_init(&c);
	c.block_tokens = BT;
	c.device_blocks = 8;
	c.host_cache = 1;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL, "no host tier");
	c.host_blocks = 8;
	c.prefix_cache = 0;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_EINVAL, "no prefix cache");
	c.prefix_cache = 1;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	bkv_pool_destroy(p);
	c.n_groups = 2; /* KV groups have a host cache too */
	c.groups = g;
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	cr_assert(p->hc_on);
	bkv_pool_destroy(p);
}

/* ---- KV groups ---------------------------------------------------------------- */

/* full attention + a window of 8 tokens (two blocks), and full + a
 * recurrent state checkpointed every 8 tokens */
static const bkv_kv_group g_window[2] = {{BKV_GROUP_FULL, 1, 0, 0, 64},
					 {BKV_GROUP_WINDOW, 1, 8, 0, 64}};
static const bkv_kv_group g_state[2] = {{BKV_GROUP_FULL, 1, 0, 0, 64},
					{BKV_GROUP_STATE, 1, 8, 0, 64}};

static bkv_pool *group_hc_pool(const bkv_kv_group *g, uint32_t nb)
{
	bkv_pool_config c;
	bkv_pool *p = NULL;

	bkv_pool_config_init(&c);
	c.block_tokens = BT;
	c.device_blocks = nb;
	c.host_blocks = 32;
	c.host_cache = 1;
	c.max_seqs = 8;
	c.n_groups = 2;
	c.groups = g;
	if (g[1].kind == BKV_GROUP_STATE) { /* room for evict_all's checkpoints too */
		c.state_units = 48;
		c.device_blocks += c.state_units * bkv_kv_state_frames(g, 2, BT);
	}
	cr_assert_eq(bkv_pool_create(&c, NULL, &p), BKV_OK);
	return p;
}

/* Append tokens first.. in the given chunks to a new sequence, then close
 * it (a STATE group's state commits at the next append: a chunk ending at
 * a multiple of 8 tokens leaves a checkpoint there once another follows). */
static void cache_chunks(bkv_pool *p, int32_t first, const uint32_t *chunk, uint32_t n)
{
	int32_t t[64];
	uint32_t s, i, len = 0;

	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	for (i = 0; i < n; i++) {
		fill_tokens(t, chunk[i], first + (int32_t)len);
		cr_assert_eq(bkv_seq_append(p, s, t, chunk[i], NULL), BKV_OK);
		len += chunk[i];
	}
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
}

/* Evict every cached block (another sequence, a token at a time, fills the
 * device) and let the host perform the demotions. */
static void evict_all(bkv_pool *p)
{
	uint32_t s, i;

	cr_assert_eq(bkv_seq_open(p, &s), BKV_OK);
	for (i = 0; p->kv.nr_cached && i < 256; i++) {
		int32_t t = 9000 + (int32_t)i;

		cr_assert_eq(bkv_seq_append(p, s, &t, 1, NULL), BKV_OK);
		bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	}
	cr_assert_eq(p->kv.nr_cached, 0);
	cr_assert_eq(bkv_seq_drop(p, s), BKV_OK);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(bkv_pool_check(p), 0);
}

/* A new sequence of n tokens from first: the hit, the swap-in copies. */
static uint32_t hit_of(bkv_pool *p, int32_t first, uint32_t n, uint32_t *copies)
{
	uint32_t s, hit;

	s = seq_with(p, first, n, &hit);
	*copies = pending(p, BKV_COPY_SWAP_IN, NULL);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	return hit;
}

/* Every group's evicted blocks go to the host; a hit reloads group 0's
 * blocks and the window's last two, which a sequence ending there reads. */
Test(hcache, a_hybrid_hit_reloads_every_groups_blocks)
{
	bkv_pool *p = group_hc_pool(g_window, 12);
	const uint32_t chunk[1] = {16};
	const bkv_copy *v;
	uint32_t s, hit, nb, i;
	const int32_t *win;

	cache_chunks(p, 100, chunk, 1);
	evict_all(p);
	cr_assert_geq(pool_stats(p).host_cached, 4 + 2, "group 0's and the window's blocks");
	s = seq_with(p, 100, 17, &hit);
	cr_assert_eq(hit, 16);
	cr_assert_eq(pool_stats(p).host_hit_blocks, 4 + 2);
	cr_assert_eq(pending(p, BKV_COPY_SWAP_IN, &v), 4 + 2);
	win = bkv_seq_group_blocks(p, s, 1, &nb);
	cr_assert_eq(nb, 5);
	/* the window's blocks 2 and 3 are reloaded, after group 0's */
	for (i = 0; i < 2; i++)
		cr_assert_eq(v[4 + i].dst, win[2 + i]);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

/* The window's block 3 is not on the host: a hit through block 3 would
 * read it, so the hit ends at block 3, whose window (blocks 1 and 2) the
 * host holds. */
Test(hcache, a_hybrid_hit_ends_where_a_group_lacks_a_block)
{
	bkv_pool *p = group_hc_pool(g_window, 12);
	const uint32_t chunk[1] = {16};
	uint32_t h, copies, lost = 0;

	cache_chunks(p, 100, chunk, 1);
	evict_all(p);
	for (h = 0; h < p->nh; h++) /* the window's block 3: key 0 xor the salt */
		if (p->host_state[h] == BKV__HOST_CACHED && p->hc_key[h] == p->lanes[0].salt &&
		    p->host_tok[h * BT] == 100 + 12) {
			p->hc_key[h] ^= 1; /* not findable under that key */
			lost++;
		}
	cr_assert_eq(lost, 1);
	cr_assert_eq(hit_of(p, 100, 17, &copies), 12);
	cr_assert_eq(copies, 3 + 2);
	bkv_pool_destroy(p);
}

/* A recurrent state is not kept on the host: a hit ends at a checkpoint
 * the device still holds (checkpoints outlive their blocks' eviction). */
Test(hcache, a_hit_with_a_state_group_ends_at_a_device_checkpoint)
{
	bkv_pool *p = group_hc_pool(g_state, 24);
	const uint32_t chunk[3] = {8, 8, 1};
	uint32_t copies;

	cache_chunks(p, 100, chunk, 3); /* checkpoints at 8 and 16 */
	evict_all(p);
	cr_assert_geq(pool_stats(p).state_checkpoints, 2, "A's, and evict_all's own");
	cr_assert_eq(hit_of(p, 100, 17, &copies), 16);
	cr_assert_eq(copies, 4);
	cr_assert_eq(pool_stats(p).state_hits, 1);
	evict_all(p);
	/* 12 tokens on the host, a checkpoint at 8: the hit stops there */
	cr_assert_eq(hit_of(p, 100, 13, &copies), 8);
	cr_assert_eq(copies, 2);
	cr_assert_eq(pool_stats(p).state_hits, 2);
	bkv_pool_destroy(p);
}

Test(hcache, a_state_groups_hit_needs_a_checkpoint)
{
	bkv_pool *p = group_hc_pool(g_state, 24);
	const uint32_t chunk[2] = {16, 1};
	uint32_t copies;

	cache_chunks(p, 100, chunk, 2); /* a checkpoint at 16 only */
	evict_all(p);
	cr_assert_eq(hit_of(p, 100, 13, &copies), 0, "no checkpoint at 8 or 12");
	cr_assert_eq(copies, 0);
	cr_assert_eq(pool_stats(p).host_hit_blocks, 0);
	bkv_pool_destroy(p);
}

Test(hcache, a_reset_drops_the_host_cache_too)
{
	bkv_pool *p = make_hc_pool(BT, 4, 8, 0);
	uint32_t s, hit;

	demote_chain_a(p);
	bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
	cr_assert_eq(bkv_pool_reset_cache(p), BKV_OK);
	cr_assert_eq(pool_stats(p).host_cached, 0);
	cr_assert_eq(pool_stats(p).host_free, 8);
	s = seq_with(p, 100, 2 * BT, &hit);
	cr_assert_eq(hit, 0);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_destroy(p);
}

/* Random operations on a pool with a host cache, the host performing (or,
 * as a failed call, forgetting) the copies at random moments; every
 * invariant after each operation. */
Test(hcache, random_appends_closes_swaps_and_clears_keep_every_invariant)
{
	bkv_pool *p = make_hc_pool(BT, 24, 12, 256);
	uint32_t seqs[16], n_open = 0, i, step;
	bkv_kv_event ev[256];

	srand(7);
	for (step = 0; step < 4000; step++) {
		int op = rand() % 10;

		if ((op < 4 && n_open < 16) || n_open == 0) {
			int32_t t[64];
			uint32_t s, hit, n = 1 + (uint32_t)rand() % 40;

			/* a few shared prefixes, so hits and evictions meet */
			fill_tokens(t, n, 1000 * (rand() % 6));
			if (bkv_seq_open(p, &s) != BKV_OK)
				continue;
			if (bkv_seq_append(p, s, t, n, &hit) == BKV_OK)
				seqs[n_open++] = s;
			else
				cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
		} else if (op < 7) {
			i = (uint32_t)rand() % n_open;
			cr_assert_eq(bkv_seq_close(p, seqs[i]), BKV_OK);
			seqs[i] = seqs[--n_open];
		} else if (op == 7) {
			i = (uint32_t)rand() % n_open;
			(void)bkv_seq_swap_out(p, seqs[i]);
			(void)bkv_seq_swap_in(p, seqs[i]);
		} else if (op == 8) {
			if (rand() % 4 == 0)
				bkv__hc_forget_demotions(p);
			bkv_pool_clear_copies(p, BKV_COPY_SWAP_OUT);
			bkv_pool_clear_copies(p, BKV_COPY_SWAP_IN);
			bkv_pool_clear_copies(p, BKV_COPY_DEVICE);
		} else {
			(void)bkv_pool_drain_events(p, ev, 256);
		}
		int chk = bkv_pool_check(p);

		cr_assert_eq(chk, 0, "step %u op %d: invariant %d", step, op, chk);
	}
	cr_assert_gt(pool_stats(p).host_hit_blocks, 0);
	cr_assert_gt(pool_stats(p).host_demoted, 0);
	bkv_pool_destroy(p);
}

/* The scheduler's prices (decide/evict.c) weigh each copy: a block whose
 * reload saves less than its copy costs stays on the free list, outside
 * the probe runs that keep the estimate learning. */
Test(hcache, prices_refuse_a_copy_that_costs_more_than_a_reload_saves)
{
	bkv_pool *p = make_hc_pool(BT, 4, 8, 0);
	uint32_t s;

	/* recompute 100 us, reload 80 us, copy 80 us: half a chance of a
	 * reload saves 10 us, less than the copy */
	bkv__pool_host_cache_prices(p, 1, 100.0, 0.0, 80.0, 80.0);
	p->kv.evictions = BKV__HC_PROBE; /* past the first probe run */
	s = seq_with(p, 100, 2 * BT, NULL);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	s = seq_with(p, 500, 4 * BT, NULL);
	cr_assert_eq(pending(p, BKV_COPY_SWAP_OUT, NULL), 0);
	cr_assert_eq(pool_stats(p).host_skipped, 2);
	cr_assert_eq(pool_stats(p).host_demoted, 0);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	/* inside a probe run the same blocks are demoted */
	p->kv.evictions = 0;
	s = seq_with(p, 900, 4 * BT, NULL);
	cr_assert_eq(pool_stats(p).host_demoted, 4);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	cr_assert_eq(bkv_pool_check(p), 0);
	bkv_pool_destroy(p);
}

Test(hcache, overlapped_copies_demote_whenever_a_reload_beats_recomputing)
{
	bkv_pool *p = make_hc_pool(BT, 4, 8, 0);
	uint32_t s;

	bkv__pool_host_cache_prices(p, 1, 100.0, 0.0, 80.0, 0.0); /* copies overlap */
	p->kv.evictions = BKV__HC_PROBE;
	s = seq_with(p, 100, 2 * BT, NULL);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	s = seq_with(p, 500, 4 * BT, NULL);
	cr_assert_eq(pool_stats(p).host_demoted, 2);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	/* a reload dearer than recomputing: nothing is demoted */
	bkv__pool_host_cache_prices(p, 1, 50.0, 0.0, 80.0, 0.0);
	s = seq_with(p, 900, 4 * BT, NULL);
	cr_assert_eq(pool_stats(p).host_demoted, 2);
	cr_assert_eq(pool_stats(p).host_skipped, 4);
	cr_assert_eq(bkv_seq_close(p, s), BKV_OK);
	bkv_pool_destroy(p);
}

static int fwd_nop(void *host, const bkv_batch *b, int32_t *next)
{
	(void)host;
	(void)b;
	(void)next;
	return 0;
}

Test(hcache, a_scheduler_config_with_copy_overlap_out_of_range_is_refused)
{
	bkv_pool *p = make_hc_pool(BT, 16, 8, 0);
	bkv_host_ops ops;
	bkv_sched_config c;
	bkv_sched *s = NULL;

	memset(&ops, 0, sizeof ops);
	ops.forward = fwd_nop;
	bkv_sched_config_init(&c);
	cr_assert_eq(c.copy_overlap, 0);
	c.copy_overlap = 2;
	cr_assert_eq(bkv_sched_create(&c, p, &ops, NULL, NULL, &s), BKV_EINVAL);
	cr_assert_null(s);
	c.copy_overlap = 1;
	cr_assert_eq(bkv_sched_create(&c, p, &ops, NULL, NULL, &s), BKV_OK);
	bkv_sched_destroy(s);
	bkv_pool_destroy(p);
}
