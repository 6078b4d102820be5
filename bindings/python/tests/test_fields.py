"""Every field of the header's structs, reached through the Python binding
by name: the counters a run moves read back with the identities they keep,
the config fields set by keyword. With test_sched.py and the rest, the drift
guard (check_bindings.py) finds each field named in a test or used by a
wrapper a test reaches."""
import numpy as np

import batchkv
from batchkv import Pool, Preempt, Scheduler


class PlusOne:
    def forward(self, b, next_tokens):
        last = b.token_ids[b.qo_indptr[1:] - 1]
        next_tokens[:] = np.where(b.row_sample != 0, last + 1, 0)


def busy_pool():
    """A small pool with the host tier as swap and host cache, a workload
    with shared prefixes and more than the device holds."""
    pool = Pool(device_blocks=24, block_tokens=4, host_blocks=64, host_cache=1,
                event_capacity=8, max_seqs=32)
    s = Scheduler(pool, PlusOne(), preempt=Preempt.SWAP, copy_overlap=1, prefill_first=0,
                  max_running=4)
    for i in range(12):
        s.submit([100 + i % 3] * 12 + [7, i], 6)
    s.run()
    return pool, s


def test_pool_stats_fields_keep_their_identities():
    pool, s = busy_pool()
    st = pool.stats()
    assert st.nr_free + st.nr_used + st.nr_cached == st.device_blocks
    assert st.host_used == st.host_blocks - st.host_free
    assert st.host_cached + st.host_demoting <= st.host_used
    assert st.nr_indexed >= st.nr_cached
    assert st.nr_swapped == 0 and st.waste_slots >= 0
    assert st.miss_tokens > 0 and st.evictions > 0
    assert st.swap_out_blocks >= 0 and st.dup_blocks >= 0
    assert st.events_dropped > 0, "an 8-event ring overflowed"
    assert st.host_demoted >= st.host_cached
    assert st.host_kept >= 0 and st.host_skipped >= 0
    assert st.host_hit_blocks >= 0 and st.host_evictions >= 0
    # no STATE group: its counters stay 0; group 0 holds every block
    assert (st.state_free, st.state_checkpoints, st.state_hits, st.state_evictions) == (0, 0, 0, 0)
    assert st.group_used[0] == st.nr_used and st.group_cached[0] == st.nr_cached
    assert s.check() == 0


def test_pool_memory_fields_sum_to_the_total():
    pool, s = busy_pool()
    m = pool.memory()
    parts = (m.blocks, m.device_tokens, m.index, m.txn_queue, m.txn_owners, m.check_scratch,
             m.host, m.seq_slots, m.block_tables, m.copy_lists, m.event_ring)
    assert all(p >= 0 for p in parts)
    assert m.seq_slots == 32 * m.seq_slot_bytes
    assert m.event_ring > 0 and m.host > 0
    assert sum(parts) <= m.total


def test_scheduler_and_step_counters():
    pool = Pool(device_blocks=64, block_tokens=4)
    s = Scheduler(pool, PlusOne(), max_running=2, outputs=True)
    for i in range(5):
        s.submit([100 + i] * 6, 3)
    info = s.step()
    assert info.waiting == 3 and info.preempted == 0 and info.predicted_us >= 0
    s.run()
    st = s.stats()
    assert st.waiting == 0 and st.busy_us >= 0 and st.unadmittable == 0
    assert st.spec_drafted == 0 and st.spec_skipped_rows == 0
    assert (st.overlap_syncs, st.overlap_wasted_tokens, st.overlap_spec_waits,
            st.overlap_spec_undrafted, st.overlap_spec_idle) == (0, 0, 0, 0, 0)


def test_config_fields_by_keyword():
    roof = batchkv.RooflineCost(peak_flops=1e15)
    assert roof.peak_flops == 1e15
    pool = Pool(device_blocks=64, block_tokens=4, n_groups=0, state_share=0)
    s = Scheduler(pool, PlusOne(), copy_overlap=1, prefill_first=1)
    s.submit([1, 2, 3, 4, 5], 2)
    s.run()
