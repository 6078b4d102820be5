/*
 * overlap.h - what overlapped scheduling (sched/overlap.c) needs of the pool
 * beyond the one-step transaction: a transaction split between two steps,
 * and the token store's placeholders. Owner: pool/overlap.c.
 */
#ifndef BKV_POOL_OVERLAP_H
#define BKV_POOL_OVERLAP_H

#include "pool/pool.h"

/* Entries in the open transaction's queue (blocks filled, waiting to be
 * indexed at commit); compact: after squeezing out stale entries (blocks
 * released since they were queued), in order. */
uint32_t bkv__pool_txn_queued(const bkv_pool *pool);
uint32_t bkv__pool_txn_compact(bkv_pool *pool);
/* Commit the queue's first mark entries (the oldest step's blocks) and keep
 * the rest queued, in order, in a transaction that stays open (the later
 * steps'). Returns the entries the commit carried over (in front of the
 * rest: the next step's to commit). */
uint32_t bkv__pool_txn_commit_upto(bkv_pool *pool, uint32_t mark);
/* Copies pending, of every kind (not the held ones). */
uint32_t bkv__pool_copies_pending(const bkv_pool *pool);
/* May a step be planned on top of those in flight as far as copies go:
 * nothing pending but swap-outs (host-cache demotions), and a held list
 * free. */
int bkv__pool_copies_holdable(const bkv_pool *pool);
/* Hold the swap-out list apart (the newest step in flight's); the next
 * copies of that kind start a new list. BKV_OK, or BKV_ENOMEM the first
 * time a held list needs room (nothing changed). */
int bkv__pool_copies_hold(bkv_pool *pool);
/* The oldest step in flight completed (performed 1: its held demotions are
 * cached) or every one failed (0: all held ones are forgotten). */
void bkv__pool_copies_release_held(bkv_pool *pool, int performed);
/* Sequence id's token at position pos (a placeholder appended for a token
 * not sampled yet) becomes token: the token store only, in a block only the
 * sequence holds and not indexed (its KV is not committed). */
void bkv__pool_seq_set_token(bkv_pool *pool, uint32_t id, uint32_t pos, int32_t token);
/* The older of two outstanding steps committed sequence id's first len
 * tokens (len: its committed length, below what the later step appended):
 * every window or chunked lane releases the blocks a sequence of len
 * tokens no longer reads, and a STATE group's state at len is committed
 * (its checkpoints indexed, the state the older step started from
 * dropped; pool/state.c). Nothing without such groups. */
void bkv__pool_seq_commit_to(bkv_pool *pool, uint32_t id, uint32_t len);
/* A step is planned while one is in flight: the state sequence id's
 * in-flight step writes (a pending scratch) becomes its live state, which
 * the new step reads, and its next append takes a second unit to write
 * (the state the in-flight step started from is kept for a rollback of
 * both). Nothing without a STATE group or a pending scratch. */
void bkv__pool_seq_state_shift(bkv_pool *pool, uint32_t id);
/* A step is planned while one is in flight (on 1) or not (0): with a STATE
 * group a sequence an outstanding step changed the state of takes no
 * prefix hit meanwhile (bkv__state_hit_ok). */
void bkv__pool_state_fence(bkv_pool *pool, int on);

#endif /* BKV_POOL_OVERLAP_H */
