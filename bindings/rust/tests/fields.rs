//! Every field of the header's structs, reached through the safe layer by
//! name: the counters a run moves read back with the identities they keep,
//! the config fields set in struct literals, the cost models' parameters
//! set and priced. With the other tests, the drift guard finds each field
//! named in a test or used by a wrapper a test reaches.
use batchkv::*;

struct PlusOne;

impl Host for PlusOne {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        let (tok, qo, lpl) = (b.token_ids(), b.qo_indptr(), b.kv_last_page_len());
        for r in 0..b.n_rows() {
            assert!(lpl[r] >= 1 && lpl[r] as u32 <= b.block_tokens());
            if b.row_sample()[r] != 0 {
                next[r] = tok[qo[r + 1] as usize - 1] + 1;
            }
        }
        for d in b.table_deltas() {
            assert_eq!(d.flags & !3, 0);
        }
        Ok(())
    }
}

/// A small pool with the host tier as swap and host cache, more work than
/// the device holds, shared prefixes.
fn busy() -> (Pool, SchedStats, Vec<StepInfo>) {
    let cfg = PoolConfig { device_blocks: 24, block_tokens: 4, host_blocks: 64, host_cache: 1,
                           event_capacity: 8, max_seqs: 32, watermark_blocks: 0, prefix_cache: 1,
                           state_share: 0, ..Default::default() };
    let mut pool = Pool::new(&cfg).unwrap();
    let sc = SchedConfig { max_running: 4, preempt: sys::BKV_PREEMPT_SWAP, policy: sys::BKV_POLICY_CONTINUOUS,
                           chunked_prefill: 1, token_budget: 64, host_link_bytes_per_us: 0.0,
                           tpot_target_us: 0, ttft_target_us: 0, max_bypass_us: 0,
                           evict: sys::BKV_EVICT_LRU, victim: sys::BKV_VICTIM_RECENT,
                           admit_reserve: sys::BKV_RESERVE_PROMPT, copy_overlap: 1, prefill_first: 0,
                           ..Default::default() };
    let mut infos = Vec::new();
    let st;
    {
        let s = Scheduler::new(&mut pool, PlusOne, &sc, None).unwrap();
        let prompts: Vec<Vec<i32>> = (0..12).map(|i| {
            let mut p = vec![100 + i % 3; 12];
            p.extend_from_slice(&[7, i]);
            p
        }).collect();
        for p in &prompts {
            s.submit(&Request::new(p, 6)).unwrap();
        }
        while s.pending() > 0 {
            infos.push(s.step().unwrap());
        }
        st = s.stats().unwrap();
    }
    (pool, st, infos)
}

#[test]
fn pool_stats_fields_keep_their_identities() {
    let (mut pool, _, _) = busy();
    let st = pool.stats();
    assert_eq!(st.nr_free + st.nr_used + st.nr_cached, st.device_blocks);
    assert_eq!(st.host_used, st.host_blocks - st.host_free);
    assert!(st.host_cached + st.host_demoting <= st.host_used);
    assert!(st.nr_indexed >= st.nr_cached);
    assert_eq!(st.nr_swapped, 0);
    assert!(st.miss_tokens > 0 && st.evictions > 0 && st.waste_slots < u64::MAX);
    assert!(st.swap_out_blocks >= st.swap_in_blocks || st.swap_in_blocks > 0 || st.dup_blocks == 0);
    assert!(st.events_dropped > 0, "an 8-event ring overflowed");
    assert!(st.host_demoted >= st.host_cached as u64);
    assert!(st.host_kept < u64::MAX && st.host_skipped < u64::MAX);
    assert!(st.host_hit_blocks < u64::MAX && st.host_evictions < u64::MAX);
    assert_eq!((st.state_free, st.state_checkpoints, st.state_hits, st.state_evictions), (0, 0, 0, 0));
    assert_eq!((st.group_used[0], st.group_cached[0]), (st.nr_used, st.nr_cached));
    let ev = pool.events(64);
    for e in &ev {
        assert!(e.token_count <= 4);
        assert!(e.has_parent == 0 || e.parent_hash != 0 || e.hash != 0);
    }
    let seq = pool.open().unwrap();
    let info = pool.info(seq).unwrap();
    assert_eq!((info.len, info.swapped), (0, 0));
}

#[test]
fn pool_memory_fields_sum_to_the_total() {
    let (pool, _, _) = busy();
    let m = pool.memory();
    let parts = [m.blocks, m.device_tokens, m.index, m.txn_queue, m.txn_owners, m.check_scratch,
                 m.host, m.seq_slots, m.block_tables, m.copy_lists, m.event_ring];
    assert_eq!(m.seq_slots, 32 * m.seq_slot_bytes as u64);
    assert!(m.event_ring > 0 && m.host > 0);
    assert!(parts.iter().sum::<u64>() <= m.total);
}

#[test]
fn scheduler_and_step_counters() {
    let (_, st, infos) = busy();
    assert_eq!((st.waiting, st.swapped), (0, 0));
    assert!(st.prefill_tokens > 0 && st.decode_tokens > 0 && st.prefill_calls > 0);
    assert!(st.preemptions >= st.swaps && st.busy_us >= 0.0 && st.unadmittable == 0);
    assert_eq!((st.spec_rows, st.spec_drafted, st.spec_skipped_rows), (0, 0, 0));
    assert_eq!((st.overlap_syncs, st.overlap_wasted_tokens, st.overlap_spec_waits,
                st.overlap_spec_undrafted, st.overlap_spec_idle), (0, 0, 0, 0, 0));
    let p: u32 = infos.iter().map(|i| i.prefill_tokens).sum();
    let d: u32 = infos.iter().map(|i| i.decode_tokens).sum();
    assert!(p > 0 && d > 0);
    assert!(infos.iter().all(|i| i.prefill_calls <= 1 && i.predicted_us >= 0.0));
    assert!(infos.iter().map(|i| i.admitted).sum::<u32>() >= 12);
    assert!(infos.iter().map(|i| i.preempted).sum::<u32>() as u64 == st.preemptions);
    assert_eq!(infos.last().unwrap().waiting, 0);
}

#[test]
fn cost_model_parameters_are_set_and_priced() {
    let mut poly = PolyCost::new();
    {
        let p = poly.params();
        p.kappa = 0.5;
        p.rows_ref = 32.0;
        p.packed = 1;
        p.d1 = 2.0;
        p.d2 = 0.01;
    }
    let shape = StepShape { kind: CallKind::Decode, decode_rows: 8, decode_context: 8 * 512,
                            chunks: &[], padded_rows: 8, group_decode_context: &[] };
    assert!(poly.step_us(&shape) > 0.0);
    let mut roof = RooflineCost::new(sys::BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16).unwrap();
    let base = roof.step_us(&shape);
    {
        let r = roof.params();
        assert!(r.peak_flops > 0.0 && r.mem_bw > 0.0 && r.active_params > 0.0);
        assert!(r.attn_flops_per_pair > 0.0 && r.flops_eff > 0.0 && r.mem_eff > 0.0);
        r.overhead_us += 100.0;
    }
    assert!((roof.step_us(&shape) - base - 100.0).abs() < 1e-6);
    let mut raw = sys::bkv_step_shape { decode_drafts: 0, ..unsafe { std::mem::zeroed() } };
    raw.decode_rows = 1;
    assert_eq!(raw.decode_drafts, 0);
}

#[test]
fn vllm_config_names_the_host_medium() {
    let cfg = VllmConfig::default();
    assert_eq!(cfg.host_medium.as_deref(), Some("CPU"));
    let pool = Pool::new(&PoolConfig { device_blocks: 16, block_tokens: 4, event_capacity: 16,
                                       ..Default::default() }).unwrap();
    let c = VllmConfig { host_medium: Some("cpu_tier".into()), ..Default::default() };
    assert!(VllmEncoder::new(&pool, &c).is_ok());
}
