//! The safe wrapper: minimal.c's workload, rollback on Err and on panic, KV
//! bookkeeping through the pool, submit/abort from other threads while one
//! thread steps, misuse answered with the right Error.
use batchkv::*;
use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Default)]
struct PlusOne {
    tokens: HashMap<u64, Vec<i32>>,
    finished: HashMap<u64, (FinishReason, usize)>,
    fail: u32,
    panic: u32,
    calls: u32,
}

impl Host for PlusOne {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        self.calls += 1;
        if self.panic > 0 {
            self.panic -= 1;
            panic!("kernel exploded");
        }
        if self.fail > 0 {
            self.fail -= 1;
            return Err(HostFailed);
        }
        let (tok, qo) = (b.token_ids(), b.qo_indptr());
        assert_eq!(qo.len(), b.n_rows() + 1);
        assert_eq!(b.row_req().len(), b.n_rows());
        for r in 0..b.n_rows() {
            if b.row_sample()[r] != 0 {
                next[r] = tok[qo[r + 1] as usize - 1] + 1;
            }
        }
        Ok(())
    }
    fn on_token(&mut self, req: u64, _b: u32, token: i32, _u: usize) {
        self.tokens.entry(req).or_insert_with(Vec::new).push(token);
    }
    fn on_finish(&mut self, req: u64, why: FinishReason, user: usize) {
        assert!(self.finished.insert(req, (why, user)).is_none(), "ended twice");
    }
}

const PROMPT: [i32; 5] = [100, 101, 102, 103, 104];

fn submit3<H: Host>(s: &Scheduler<'_, H>) -> Vec<u64> {
    (0..3u32).map(|i| {
        s.submit(&Request { stop_tokens: &[110], user: 10 + i as usize,
                            ..Request::new(&PROMPT, 2 + 2 * i) }).unwrap()
    }).collect()
}

#[test]
fn minimal_workload_as_in_minimal_c() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let mut s = Scheduler::new(&mut pool, PlusOne::default(), &SchedConfig::default(), None).unwrap();
    let ids = submit3(&s);
    assert!(s.run().unwrap() > 0);
    assert_eq!(s.check().unwrap(), 0);
    let st = s.stats().unwrap();
    assert_eq!((st.submitted, st.finished), (3, 3));
    assert!(s.metrics().unwrap().contains("# TYPE bkv_step_duration_seconds histogram"));
    let h = s.host_mut();
    assert_eq!(h.tokens[&ids[0]], vec![105, 106]);
    assert_eq!(h.tokens[&ids[1]], vec![105, 106, 107, 108]);
    assert_eq!(h.tokens[&ids[2]], vec![105, 106, 107, 108, 109, 110]);
    assert_eq!(h.finished[&ids[0]], (FinishReason::Length, 10));
    assert_eq!(h.finished[&ids[2]], (FinishReason::Stop, 12));
}

#[test]
fn kv_events_and_pool_stats_through_the_scheduler() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, block_tokens: 4, event_capacity: 64,
                                           hash_seed: 9, ..Default::default() }).unwrap();
    let mut s = Scheduler::new(&mut pool, PlusOne::default(), &SchedConfig::default(), None).unwrap();
    let prompt: Vec<i32> = (200..213).collect();
    let id = s.submit(&Request::new(&prompt, 3)).unwrap();
    s.run().unwrap();
    let ev = s.pool_events(64).unwrap();
    let mut seq = prompt.clone();
    seq.extend_from_slice(&s.host_mut().tokens[&id][..2]);
    let stored: Vec<u64> = ev.iter().filter(|e| e.kind == sys::BKV_EVENT_STORED as u32)
        .map(|e| e.hash).collect();
    assert_eq!(stored, block_hashes(9, 0, 4, &seq));
    assert_eq!(stored.len(), 3);
    let ps = s.pool_stats().unwrap();
    assert_eq!(ps.nr_free + ps.nr_used + ps.nr_cached, 64);
    assert_eq!(ps.nr_seqs, 0);
}

#[test]
fn host_err_and_panic_roll_back_and_lose_nothing() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let mut s = Scheduler::new(&mut pool, PlusOne::default(), &SchedConfig::default(), None).unwrap();
    let ids = submit3(&s);
    s.step().unwrap();
    let before = s.host_mut().tokens.clone();
    s.host_mut().fail = 1;
    assert_eq!(s.step().unwrap_err(), Error::Host);
    s.host_mut().panic = 1;
    let r = panic::catch_unwind(AssertUnwindSafe(|| s.step()));
    let msg = r.unwrap_err();
    assert_eq!(msg.downcast_ref::<&str>(), Some(&"kernel exploded"));
    assert_eq!(s.host_mut().tokens, before, "a rolled-back step delivered tokens");
    assert_eq!(s.check().unwrap(), 0);
    s.run().unwrap();
    let st = s.stats().unwrap();
    assert_eq!((st.failed_steps, st.finished), (2, 3));
    assert_eq!(s.host_mut().tokens[&ids[2]], vec![105, 106, 107, 108, 109, 110]);
}

#[test]
fn export_import_carries_every_kv_group() {
    let groups = [KvGroup::full(2, 256), KvGroup::window(2, 12, 256), KvGroup::state(1, 8, 5000)];
    let cfg = PoolConfig { device_blocks: 96, block_tokens: 4, max_seqs: 8, state_units: 6,
                           ..Default::default() };
    let mut src = Pool::with_groups(&cfg, &groups).unwrap();
    let mut dst = Pool::with_groups(&cfg, &groups).unwrap();
    let s = src.open().unwrap();
    let toks: Vec<i32> = (100..137).collect();
    src.append(s, &toks[..36]).unwrap();
    src.append(s, &toks[36..]).unwrap(); // trims the window below block 6
    let img = src.export(s).unwrap();
    assert_eq!((img.n_groups, img.state_frames, img.group_blocks.len()), (3, 3, 10));
    assert!(img.group_blocks[..6].iter().all(|&b| b == -1));
    let (seq, tr) = dst.import(&img).unwrap();
    assert_eq!(tr.len(), 10 + 4 + 3);
    assert_eq!(tr[10].src, img.group_blocks[6]);
    assert_eq!(tr[14].src, img.state_frame);
    assert_eq!(dst.check(), 0);
    let mut bad = img.clone();
    bad.group_layout ^= 2;
    assert_eq!(dst.import(&bad).unwrap_err(), Error::InvalidArgument);
    let _ = seq;
}

#[test]
fn pool_blocks_fork_copies_swap_events_export_import() {
    let cfg = PoolConfig { device_blocks: 16, block_tokens: 4, host_blocks: 8,
                           event_capacity: 64, hash_seed: 5, ..Default::default() };
    let mut p = Pool::new(&cfg).unwrap();
    let a = p.open().unwrap();
    let toks: Vec<i32> = (100..110).collect();
    assert_eq!(p.append(a, &toks).unwrap(), 0);
    let b = p.open().unwrap();
    assert_eq!(p.append(b, &toks[..9]).unwrap(), 8);
    let ev = p.events(64);
    assert_eq!(ev.len(), 2);
    assert_eq!(block_hashes(5, 0, 4, &toks), vec![ev[0].hash, ev[1].hash]);
    let c = p.fork(a).unwrap();
    p.append(c, &[7]).unwrap();
    let (ablk, cblk) = (p.blocks(a).unwrap().to_vec(), p.blocks(c).unwrap().to_vec());
    let cp = p.copies(CopyKind::Device);
    assert_eq!((cp.len(), cp[0].src, cp[0].dst), (1, ablk[2], cblk[2]));
    p.clear_copies(CopyKind::Device);
    assert!(p.copies(CopyKind::Device).is_empty());
    assert_eq!(p.info(a).unwrap().len, 10);
    let img = p.export(a).unwrap();
    assert_eq!((img.len, img.blocks.clone()), (10, ablk.clone()));
    p.close_seq(c).unwrap();
    p.swap_out(b).unwrap();
    assert_eq!(p.copies(CopyKind::SwapOut).len(), 3);
    assert_eq!(p.append(b, &[1]).unwrap_err(), Error::State);
    p.clear_copies(CopyKind::SwapOut);
    p.swap_in(b).unwrap();
    p.clear_copies(CopyKind::SwapIn);
    assert_eq!(p.check(), 0);
    let st = p.stats();
    assert_eq!((st.hit_tokens, st.cow_copies, st.nr_seqs), (8, 1, 2));
    let mut q = Pool::new(&PoolConfig { device_blocks: 16, block_tokens: 4, hash_seed: 5,
                                        ..Default::default() }).unwrap();
    let (seq, tr) = q.import(&img).unwrap();
    assert_eq!(q.info(seq).unwrap().len, 10);
    assert_eq!(tr.iter().map(|t| t.src).collect::<Vec<_>>(), ablk);
    let mut bad = img.clone();
    bad.hashes[0] ^= 1;
    assert_eq!(q.import(&bad).unwrap_err(), Error::InvalidArgument);
    assert_eq!(Pool::new(&PoolConfig::default()).err(), Some(Error::InvalidArgument));
    assert_eq!(p.close_seq(a + 9999).unwrap_err(), Error::NotFound);
}

#[derive(Default)]
struct Counter {
    finished: HashMap<u64, FinishReason>,
}

impl Host for Counter {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        std::thread::yield_now();
        for r in 0..b.n_rows() {
            next[r] = 5;
        }
        Ok(())
    }
    fn on_finish(&mut self, req: u64, why: FinishReason, _u: usize) {
        assert!(self.finished.insert(req, why).is_none(), "ended twice");
    }
}

#[test]
fn pool_memory_and_block_inspection() {
    let cfg = PoolConfig { device_blocks: 16, block_tokens: 4, hash_seed: 3, ..Default::default() };
    let mut p = Pool::new(&cfg).unwrap();
    let m = p.memory();
    // 8 B per index slot plus the LRU's release-order chunks (the exact
    // figure is pinned by tests/test_inspect.c)
    assert_eq!((m.index_slots, m.index_used), (32, 0));
    assert!(m.index > 32 * 8);
    assert_eq!(m.blocks, 16 * m.block_bytes as u64);
    assert!(m.total > m.blocks + m.device_tokens + m.index);
    let a = p.open_keyed(7).unwrap();
    let toks: Vec<i32> = (0..10).collect();
    p.append(a, &toks).unwrap();
    let t = p.blocks(a).unwrap().to_vec();
    let b1 = p.block(t[1]).unwrap();
    assert_eq!((b1.state, b1.ref_count, b1.indexed, b1.parent, b1.key), (BlockState::Pinned, 1, true, t[0], 7));
    assert_eq!(b1.tokens, &[4, 5, 6, 7]);
    assert_eq!(b1.hash, block_hashes(3, 7, 4, &toks[..8])[1]);
    let b2 = p.block(t[2]).unwrap();
    assert_eq!((b2.fill, b2.indexed, b2.hash, b2.tokens), (2, false, 0, &[8, 9][..]));
    p.close_seq(a).unwrap();
    assert_eq!(p.block(t[0]).unwrap().state, BlockState::Cached);
    assert_eq!(p.block(t[2]).unwrap().state, BlockState::Free);
    assert_eq!(p.block(-1), Err(Error::InvalidArgument));
    assert_eq!(p.block(16), Err(Error::InvalidArgument));
}

#[test]
fn submit_and_abort_from_threads_while_stepping() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 512, block_tokens: 8,
                                           ..Default::default() }).unwrap();
    let cfg = SchedConfig { max_running: 32, ..Default::default() };
    let mut s = Scheduler::new(&mut pool, Counter::default(), &cfg, None).unwrap();
    let aborted = AtomicUsize::new(0);
    let ids: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let s = &s;
        let aborted = &aborted;
        let clients: Vec<_> = (0..4).map(|t| sc.spawn(move || {
            let mut mine = Vec::new();
            for i in 0..200u32 {
                let prompt: Vec<i32> = (0..1 + i % 20).map(|x| (x * 7 + t) as i32).collect();
                mine.push(s.submit(&Request::new(&prompt, 1 + i % 9)).unwrap());
                if i % 3 == 0 && s.abort(mine[(i as usize * 7) % mine.len()]).is_ok() {
                    aborted.fetch_add(1, Ordering::Relaxed);
                }
            }
            mine
        })).collect();
        let mut steps = 0u64;
        while clients.iter().any(|c| !c.is_finished()) || s.pending() > 0 {
            s.step().unwrap();
            steps += 1;
            assert!(steps < 1_000_000);
        }
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let all: Vec<u64> = ids.into_iter().flatten().collect();
    assert_eq!(all.len(), 800);
    let st = s.stats().unwrap();
    assert_eq!((st.submitted, st.finished), (800, 800));
    assert!(st.aborted as usize <= aborted.load(Ordering::Relaxed) && st.aborted > 0);
    let h = s.host_mut();
    assert_eq!(h.finished.len(), 800);
    assert!(all.iter().all(|id| h.finished.contains_key(id)));
}

#[test]
fn thread_rules_are_in_the_types() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Pool>();
    send::<Scheduler<'static, Counter>>();
    sync::<Scheduler<'static, Counter>>();
}

#[test]
fn hybrid_sizing_reproduces_gpt_oss_20b() {
    let oss = [KvGroup::full(12, 2048), KvGroup::window(12, 128, 2048)];
    let all_full = [KvGroup::full(24, 2048)];
    assert_eq!(kv_seq_bytes(&oss[..1], 0, 32768), 805_306_368);
    assert_eq!(kv_seq_bytes(&oss[1..], 0, 32768), 3_145_728);
    assert_eq!(kv_seq_bytes(&all_full, 0, 32768), 1_610_612_736);
    assert_eq!(kv_group_blocks_held(&oss[1], 16, 32768), 9);
    assert_eq!(kv_group_page_bytes(&oss[0], 16), 393_216);
    assert_eq!(kv_frame_bytes(&oss, 16), 393_216);
    assert_eq!(kv_seq_bytes(&oss, 16, 32768), (2049 + 9) * 393_216);
    assert_eq!(frames_for_bytes(80 << 30, &oss, 16), 218_453);
    assert_eq!(frames_for_bytes(80 << 30, &all_full, 16), 109_226);
    let with_state = [KvGroup::full(12, 2048), KvGroup::state(36, 256, 1_000_000)];
    assert_eq!(kv_state_frames(&with_state, 16), 92);
    assert_eq!(kv_state_frames(&oss, 16), 0);
    assert_eq!(kv_frame_bytes(&[KvGroup::window(12, 0, 2048)], 16), 0);
    assert_eq!(kv_frame_bytes(&[], 16), 0);
}

#[test]
fn roofline_prices_kv_groups_and_pool_takes_them_only_by_slice() {
    let mut rl = RooflineCost::new(sys::BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16).unwrap();
    let ctx = [32768u64, 128];
    let d = StepShape { kind: CallKind::Decode, decode_rows: 1, decode_context: 32768, chunks: &[],
                        padded_rows: 1, group_decode_context: &ctx };
    rl.set_groups(&[KvGroup::full(12, 2048), KvGroup::window(12, 128, 2048)]);
    assert_eq!(rl.groups().len(), 2);
    let weights = rl.params().model_bytes;
    let want = weights + 12.0 * 2048.0 * (32769.0 + 129.0);
    assert!((rl.work(&d).1 - want).abs() < 1.0, "{} vs {}", rl.work(&d).1, want);
    rl.set_groups(&[]);
    assert!((rl.work(&d).1 - (weights + 131072.0 * 32769.0)).abs() < 1.0);
    // A raw groups pointer in the config is refused: groups come as a slice.
    let one = [KvGroup::full(4, 1024)];
    let mut cfg = PoolConfig { device_blocks: 8, ..Default::default() };
    cfg.n_groups = 1;
    cfg.groups = one.as_ptr();
    let err = Pool::new(&cfg).err().unwrap();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument));
    assert!(err.to_string().contains("bkv_pool_config.groups"), "{}", err);
    let cfg = PoolConfig { device_blocks: 8, ..Default::default() };
    assert!(Pool::with_groups(&cfg, &one).is_ok());
}

#[test]
fn cost_models_and_helpers() {
    let mut poly = PolyCost::new();
    let d = StepShape { kind: CallKind::Decode, decode_rows: 32, decode_context: 0, chunks: &[],
                        padded_rows: 32, group_decode_context: &[] };
    assert!((poly.step_us(&d) - (1064.0 + 24.1 * 32.0)).abs() < 1e-6);
    let rl = RooflineCost::new(sys::BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16).unwrap();
    assert!(rl.work(&d).0 > 0.0 && rl.step_us(&d) > 0.0);
    {
        let mut cal = CalibratedCost::new(Some(&mut poly)).unwrap();
        let c = cal.confidence(CallKind::Decode);
        assert_eq!((c.n_eff, c.scale_fit, c.scale_base, c.level), (0.0, 0.5, 0.5, 1.0));
        assert_eq!((c.trusted, c.uses_fit), (0, 0));
        for _ in 0..20 {
            cal.observe(&d, 500.0);
        }
        let c = cal.confidence(CallKind::Decode);
        assert_eq!((c.trusted, c.uses_fit), (1, 1), "{:?}", c);
        assert!(c.n_eff > 19.0 && c.n_eff < 20.0 && c.scale_fit < c.scale_base, "{:?}", c);
        assert_eq!(cal.confidence(CallKind::Prefill).n_eff, 0.0);
        assert_eq!(cal.observations(CallKind::Decode), 20);
        // the first calls are clipped against the base (3.7x off) until the
        // scale widens, so the robust fit starts a little high and converges
        assert!((cal.step_us(&d) - 500.0).abs() < 5.0);
        for _ in 0..44 {
            cal.observe(&d, 500.0);
        }
        assert!((cal.step_us(&d) - 500.0).abs() < 0.1);
        assert_eq!(cal.set_forget(0.5).unwrap_err(), Error::InvalidArgument);
        assert_eq!(cal.coefficients(CallKind::Decode).len(), 9);
        let mut pool = Pool::new(&PoolConfig { device_blocks: 32, ..Default::default() }).unwrap();
        let s = Scheduler::new_split(&mut pool, PlusOne::default(), &SchedConfig::default(),
                                     Some(&mut cal)).unwrap();
        submit3(&s);
        s.run().unwrap();
        assert_eq!(s.stats().unwrap().finished, 3);
        assert!(s.stats().unwrap().decode_calls > 0);
    }
    poly.params().d0 = 0.0;
    assert!((poly.step_us(&d) - 24.1 * 32.0).abs() < 1e-6);
    let shape = ModelShape { layers: 32, kv_heads: 8, head_dim: 128, dtype_bytes: 2 };
    assert_eq!(kv_bytes_per_token(&shape), 131072);
    assert_eq!(blocks_for_bytes(1 << 30, &shape, 16), 512);
    assert_eq!(version(), "0.1.0");
    assert_eq!(Error::Host.to_string(), "a host callback failed");
    assert_eq!(Error::from_status(-8), Some(Error::State));
}

const HYBRID: [KvGroup; 2] = [
    KvGroup { kind: sys::BKV_GROUP_FULL as u32, layers: 2, span: 0, reserved: 0, bytes: 64 },
    KvGroup { kind: sys::BKV_GROUP_WINDOW as u32, layers: 2, span: 4, reserved: 0, bytes: 64 },
];

#[test]
fn group_blocks_window_releases_what_no_later_token_reads() {
    let cfg = PoolConfig { device_blocks: 32, block_tokens: 4, ..Default::default() };
    let mut plain = Pool::new(&cfg).unwrap();
    let s = plain.open().unwrap();
    plain.append(s, &[1; 9]).unwrap();
    assert_eq!(plain.group_blocks(s, 0).unwrap(), plain.blocks(s).unwrap());
    assert_eq!(plain.group_blocks(s, 1).unwrap_err(), Error::NotFound);

    assert_eq!(HYBRID[1], KvGroup::window(2, 4, 64));
    let mut p = Pool::with_groups(&cfg, &HYBRID).unwrap();
    let s = p.open().unwrap();
    p.append(s, &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    let (g0, g1) = (p.group_blocks(s, 0).unwrap().to_vec(), p.group_blocks(s, 1).unwrap().to_vec());
    assert_eq!(g0, p.blocks(s).unwrap());
    // released lazily, at the next append: both blocks still held
    assert_eq!(g1.len(), 2);
    assert!(g1.iter().all(|&b| b >= 0 && !g0.contains(&b)));
    let mut first = 0;
    for len in 9..17usize {
        p.append(s, &[100 + len as i32]).unwrap();
        let g0 = p.group_blocks(s, 0).unwrap().to_vec();
        let g1 = p.group_blocks(s, 1).unwrap();
        assert_eq!((g0.len(), g1.len()), ((len + 3) / 4, (len + 3) / 4));
        assert!(g0.iter().all(|&b| b >= 0));
        // the append from len - 1 released the blocks below the one holding
        // position len - 4, the first its token read
        first = (len - 4) / 4;
        assert!(g1[..first].iter().all(|&b| b == -1), "len {}: {:?}", len, g1);
        assert!(g1[first..].iter().all(|&b| b >= 0 && !g0.contains(&b)), "len {}: {:?}", len, g1);
        assert_eq!(p.check(), 0);
    }
    assert_eq!(first, 3);
    assert_eq!(p.group_blocks(s, 2).unwrap_err(), Error::NotFound);
    assert_eq!(p.group_blocks(s + 1000, 1).unwrap_err(), Error::NotFound);
}

/// What one call held in each group, copied (the slices die with the call).
#[derive(Default, Clone)]
struct GroupCall {
    kind: u32,
    span: u32,
    slots: Vec<i32>,
    same_slots_as_batch: bool,
    kv_indptr: Vec<i32>,
    kv_indices: Vec<i32>,
    kv_first_block: Vec<i32>,
    table: Vec<i32>,
}

#[derive(Default)]
struct GroupRecorder {
    calls: Vec<(usize, Vec<i32>, Vec<GroupCall>)>, // (n_groups, positions, groups)
}

impl Host for GroupRecorder {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        assert_eq!(b.groups().count(), b.n_groups());
        assert!(b.group(b.n_groups()).is_none());
        let gs = b.groups().map(|g| GroupCall {
            kind: g.kind(),
            span: g.span(),
            slots: g.slot_mapping().to_vec(),
            same_slots_as_batch: g.slot_mapping().as_ptr() == b.slot_mapping().as_ptr(),
            kv_indptr: g.kv_indptr().to_vec(),
            kv_indices: g.kv_indices().to_vec(),
            kv_first_block: g.kv_first_block().to_vec(),
            table: b.row_slot().first().map_or(Vec::new(), |&x| g.row_table(x as usize).to_vec()),
        }).collect();
        self.calls.push((b.n_groups(), b.positions().to_vec(), gs));
        next.iter_mut().for_each(|t| *t = 7);
        Ok(())
    }
}

fn run_groups(groups: &[KvGroup], layout: sys::bkv_batch_layout)
              -> Vec<(usize, Vec<i32>, Vec<GroupCall>)> {
    let cfg = PoolConfig { device_blocks: 32, block_tokens: 4, ..Default::default() };
    let mut pool = Pool::with_groups(&cfg, groups).unwrap();
    let mut sc = SchedConfig::default();
    sc.batch_layout = layout;
    let mut s = Scheduler::new(&mut pool, GroupRecorder::default(), &sc, None).unwrap();
    let prompt: Vec<i32> = (0..10).collect();
    s.submit(&Request::new(&prompt, 3)).unwrap(); // a 10-token prefill, decode at 10 and 11
    s.run().unwrap();
    let calls = std::mem::take(&mut s.host_mut().calls);
    assert_eq!(calls.len(), 3);
    calls
}

#[test]
fn batch_groups_flat_window_rows_read_only_their_window() {
    for ((n_groups, pos, g), (first, n)) in run_groups(&HYBRID, sys::BKV_BATCH_FLAT).iter()
        .zip([(0, 3), (1, 2), (2, 1)]) {
        assert_eq!((*n_groups, g.len()), (2, 2));
        assert_eq!((g[0].kind, g[0].span, g[1].kind, g[1].span),
                   (sys::BKV_GROUP_FULL as u32, 0, sys::BKV_GROUP_WINDOW as u32, 4));
        assert!(g[0].same_slots_as_batch && !g[1].same_slots_as_batch);
        assert_eq!((g[0].kv_first_block.clone(), g[0].kv_indices.len()), (vec![0], 3));
        // the window group: the row's blocks from the one holding position
        // (first token's position) - 3 on
        assert_eq!(g[1].kv_first_block, vec![first]);
        assert_eq!(g[1].kv_indptr, vec![0, n]);
        assert_eq!(g[1].slots.len(), pos.len());
        assert!(g[1].slots.iter().all(|s| !g[0].slots.iter().any(|t| t / 4 == s / 4)));
        for gr in g {
            for (t, &p) in pos.iter().enumerate() {
                let i = (gr.kv_indptr[0] + p / 4 - gr.kv_first_block[0]) as usize;
                assert_eq!(gr.slots[t], gr.kv_indices[i] * 4 + p % 4);
            }
        }
    }
}

#[test]
fn batch_groups_persistent_tables_show_released_blocks() {
    for ((n_groups, pos, g), released) in run_groups(&HYBRID, sys::BKV_BATCH_PERSISTENT).iter()
        .zip([0usize, 1, 2]) {
        assert_eq!((*n_groups, g.len()), (2, 2));
        assert!(g[1].kv_indptr.is_empty() && g[1].kv_indices.is_empty()
                && g[1].kv_first_block.is_empty());
        let (t0, t1) = (&g[0].table, &g[1].table);
        assert_eq!((t0.len(), t1.len()), (3, 3));
        assert!(t0.iter().all(|&b| b >= 0));
        // the window's table after the last step's commit released its blocks
        assert!(t1[..released].iter().all(|&b| b == -1), "{:?}", t1);
        assert!(t1[released..].iter().all(|&b| b >= 0), "{:?}", t1);
        for gr in g {
            for (t, &p) in pos.iter().enumerate() {
                assert_eq!(gr.slots[t], gr.table[(p / 4) as usize] * 4 + p % 4);
            }
        }
    }
}

#[test]
fn batch_of_a_pool_without_groups_has_group_0() {
    for (n_groups, _, g) in run_groups(&[], sys::BKV_BATCH_FLAT) {
        assert_eq!((n_groups, g.len()), (1, 1));
        assert_eq!((g[0].kind, g[0].span), (sys::BKV_GROUP_FULL as u32, 0));
        assert!(g[0].same_slots_as_batch);
        assert_eq!(g[0].kv_indices.len(), 3);
        assert!(g[0].kv_first_block.is_empty());
    }
}

/// A hybrid pool with a recurrent state: 4-token frames of 256 bytes, a
/// state unit of 256 bytes (one frame), checkpoints every 8 tokens.
const WITH_STATE: [KvGroup; 2] = [
    KvGroup { kind: sys::BKV_GROUP_FULL as u32, layers: 1, span: 0, reserved: 0, bytes: 64 },
    KvGroup { kind: sys::BKV_GROUP_STATE as u32, layers: 1, span: 8, reserved: 0, bytes: 256 },
];

fn state_pool() -> (Pool, i32) {
    let cfg = PoolConfig { device_blocks: 64, block_tokens: 4, state_units: 8, ..Default::default() };
    let frames = kv_state_frames(&WITH_STATE, 4);
    assert_eq!(frames, 1);
    // the state arena lies above the attention frames
    (Pool::with_groups(&cfg, &WITH_STATE).unwrap(), 64 - 8 * frames as i32)
}

#[test]
fn state_frames_out_of_place_and_committed_by_the_next_append() {
    assert_eq!(WITH_STATE[1], KvGroup::state(1, 8, 256));
    let (mut p, attention) = state_pool();
    let s = p.open().unwrap();
    assert_eq!(p.state_frames(s).unwrap(), (-1, -1)); // nothing computed, nothing written
    p.append(s, &[0, 1, 2, 3, 4]).unwrap();
    let (i, o) = p.state_frames(s).unwrap();
    assert_eq!(i, -1); // read from the zero state
    assert!((attention..64).contains(&o), "out {}", o);
    p.append(s, &[5]).unwrap();
    let (i2, o2) = p.state_frames(s).unwrap();
    assert_eq!(i2, o); // the next append committed it
    assert!((attention..64).contains(&o2) && o2 != o, "out {}", o2); // out of place
    assert_eq!(p.check(), 0);
    assert_eq!(p.state_frames(s + 1000).unwrap_err(), Error::NotFound);

    let cfg = PoolConfig { device_blocks: 64, block_tokens: 4, ..Default::default() };
    for mut q in [Pool::with_groups(&cfg, &WITH_STATE[..1]).unwrap(), Pool::new(&cfg).unwrap()] {
        let s = q.open().unwrap();
        q.append(s, &[0, 1, 2, 3, 4]).unwrap();
        assert_eq!(q.state_frames(s).unwrap_err(), Error::InvalidArgument);
    }
}

/// One call's STATE group, copied: (n_decode_rows, positions, kind, span,
/// state_frames, state_in, state_out).
type StateCall = (usize, Vec<i32>, u32, u32, u32, Vec<i32>, Vec<i32>);

#[derive(Default)]
struct StateRecorder {
    calls: Vec<StateCall>,
}

impl Host for StateRecorder {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        let attn = b.group(0).unwrap();
        assert!(attn.state_in().is_none() && attn.state_out().is_none());
        assert_eq!(attn.state_frames(), 0);
        let st = b.groups().last().unwrap();
        self.calls.push((b.n_decode_rows(), b.positions().to_vec(), st.kind(), st.span(),
                         st.state_frames(), st.state_in().unwrap().to_vec(),
                         st.state_out().unwrap().to_vec()));
        next.iter_mut().for_each(|t| *t = 7);
        Ok(())
    }
}

#[test]
fn batch_state_group_hands_each_row_its_state_units() {
    let (mut pool, attention) = state_pool();
    let mut s = Scheduler::new(&mut pool, StateRecorder::default(), &SchedConfig::default(), None)
        .unwrap();
    let prompt: Vec<i32> = (0..10).collect();
    s.submit(&Request::new(&prompt, 3)).unwrap(); // a 10-token prefill, decode at 10 and 11
    s.run().unwrap();
    let calls = std::mem::take(&mut s.host_mut().calls);
    // the prefill is cut at the checkpoint at 8: positions 0..7, 8..9, then 10, 11
    let pos: Vec<Vec<i32>> = calls.iter().map(|c| c.1.clone()).collect();
    assert_eq!(pos, vec![(0..8).collect::<Vec<i32>>(), vec![8, 9], vec![10], vec![11]]);
    assert_eq!((calls[0].0, calls[0].5[0]), (0, -1)); // the first prefill row: the zero state
    let mut prev_out = None;
    for (_, _, kind, span, frames, sin, sout) in &calls {
        assert_eq!((*kind, *span), (sys::BKV_GROUP_STATE as u32, 8));
        assert!(*frames >= 1 && *frames == kv_state_frames(&WITH_STATE, 4));
        assert_eq!((sin.len(), sout.len()), (1, 1));
        assert!((attention..64).contains(&sout[0]) && sout[0] != sin[0], "{:?} {:?}", sin, sout);
        if let Some(o) = prev_out { // each call reads the state the last one wrote
            assert_eq!(sin[0], o);
        }
        prev_out = Some(sout[0]);
    }
}

#[test]
fn step_outputs_as_slices_repeat_the_callbacks() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let mut s = Scheduler::new(&mut pool, PlusOne::default(), &SchedConfig::default(), None).unwrap();
    assert_eq!(s.outputs().unwrap_err(), Error::State); // not enabled
    s.enable_outputs(true).unwrap();
    let ids = submit3(&s);
    let mut seen: HashMap<u64, Vec<i32>> = HashMap::new();
    let mut ended: HashMap<u64, i32> = HashMap::new();
    while s.pending() > 0 {
        s.step().unwrap();
        let o = s.outputs().unwrap();
        assert_eq!(o.token_req.len(), o.token_ids.len());
        for i in 0..o.token_ids.len() {
            assert_eq!(o.token_branch[i], 0);
            seen.entry(o.token_req[i]).or_insert_with(Vec::new).push(o.token_ids[i]);
        }
        for i in 0..o.finished_req.len() {
            ended.insert(o.finished_req[i], o.finished_reason[i]);
        }
    }
    assert_eq!(seen, s.host_mut().tokens);
    assert_eq!(seen[&ids[2]], vec![105, 106, 107, 108, 109, 110]);
    assert_eq!(ended.len(), 3);
    assert_eq!(ended[&ids[2]], FinishReason::Stop as i32);
}

#[test]
fn wait_returns_when_another_thread_submits_and_wake_ends_it() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let s = Scheduler::new(&mut pool, PlusOne::default(), &SchedConfig::default(), None).unwrap();
    assert!(!s.wait(Some(std::time::Duration::from_millis(0))).unwrap());
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            s.submit(&Request::new(&PROMPT, 2)).unwrap();
        });
        assert!(s.wait(None).unwrap());
    });
    s.run().unwrap();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            s.wake().unwrap();
        });
        assert!(!s.wait(None).unwrap());
    });
}

/// PlusOne that verifies drafts: after every token it samples token + 1.
#[derive(Default)]
struct SpecPlusOne {
    inner: PlusOne,
    drafted: usize,
    host_drafts: bool,
}

impl Host for SpecPlusOne {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        self.inner.forward(b, next)?;
        if b.n_spec_rows() > 0 {
            self.drafted += b.n_spec_rows();
            let tok = b.token_ids();
            for (i, c) in b.spec_tokens().iter().enumerate() {
                c.set(tok[i] + 1);
            }
            assert!(b.n_accepted().iter().all(|c| c.get() == -1));
            assert_eq!(b.row_drafts().len(), b.n_rows());
        }
        Ok(())
    }
    fn on_token(&mut self, req: u64, b: u32, token: i32, u: usize) {
        self.inner.on_token(req, b, token, u)
    }
    fn on_finish(&mut self, req: u64, why: FinishReason, user: usize) {
        self.inner.on_finish(req, why, user)
    }
    const HAS_DRAFT: bool = true;
    fn draft(&mut self, _req: u64, _branch: u32, ctx: &[i32], out: &mut [i32], _u: usize) -> usize {
        if !self.host_drafts {
            return 0;
        }
        let n = out.len().min(3);
        for (j, o) in out.iter_mut().take(n).enumerate() {
            *o = ctx[ctx.len() - 1] + 1 + j as i32;
        }
        n
    }
}

#[test]
fn speculative_decoding_with_host_drafts_matches_plain() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let s = Scheduler::new(&mut pool, PlusOne::default(), &SchedConfig::default(), None).unwrap();
    submit3(&s);
    s.run().unwrap();
    drop(s);
    let mut pool2 = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let cfg = SchedConfig { spec_max_k: 4, spec_k_mode: 1, spec_drafts: 1, ..Default::default() };
    let mut s2 = Scheduler::new(&mut pool2, SpecPlusOne { host_drafts: true, ..Default::default() },
                                &cfg, None).unwrap();
    let ids = submit3(&s2);
    s2.run().unwrap();
    assert!(s2.stats().unwrap().spec_accepted > 0);
    let h = s2.host_mut();
    assert!(h.drafted > 0);
    assert_eq!(h.inner.tokens[&ids[2]], vec![105, 106, 107, 108, 109, 110]);
    assert_eq!(h.inner.tokens[&ids[1]], vec![105, 106, 107, 108]);
    assert_eq!(h.inner.finished[&ids[2]].0, FinishReason::Stop);
}

#[test]
fn submit_with_retention_ranges() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, block_tokens: 4, ..Default::default() })
        .unwrap();
    let cfg = SchedConfig { retention: 1, ..Default::default() };
    let s = Scheduler::new(&mut pool, PlusOne::default(), &cfg, None).unwrap();
    let prompt: Vec<i32> = (200..216).collect();
    let keep = [RetentionRange { token_start: 0, token_end: 8, priority: 90, pad: 0, duration_us: 0 }];
    let id = s.submit(&Request { retention: &keep, ..Request::new(&prompt, 2) }).unwrap();
    s.run().unwrap();
    let bad = [RetentionRange { token_start: 8, token_end: 4, priority: 1, pad: 0, duration_us: 0 }];
    let e = s.submit(&Request { retention: &bad, ..Request::new(&prompt, 2) }).unwrap_err();
    assert_eq!(e, Error::InvalidArgument);
    assert!(e.to_string().contains("retention"), "{}", e);
    drop(s);
    let _ = id;
}

/// A persistent-layout host keeping its own copy of the tables from the deltas.
#[derive(Default)]
struct Mirror {
    inner: PlusOne,
    tables: HashMap<u32, Vec<i32>>,
    deltas: usize,
}

impl Host for Mirror {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        assert_eq!(b.layout(), batchkv::sys::BKV_BATCH_PERSISTENT);
        let blocks = b.delta_blocks();
        let mut at = 0usize;
        for d in b.table_deltas() {
            let t = self.tables.entry(d.slot).or_insert_with(Vec::new);
            let need = (d.start + d.n) as usize;
            if t.len() < need {
                t.resize(need, 0);
            }
            t[d.start as usize..need].copy_from_slice(&blocks[at..at + d.n as usize]);
            t.truncate(d.len as usize);
            at += d.n as usize;
            self.deltas += 1;
        }
        assert_eq!(at, blocks.len());
        let g0 = b.group(0).unwrap();
        for &slot in b.row_slot() {
            assert_eq!(self.tables[&slot].as_slice(), g0.row_table(slot as usize));
        }
        self.inner.forward(b, next)
    }
}

#[test]
fn persistent_layout_deltas_rebuild_the_librarys_tables() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, block_tokens: 4, ..Default::default() })
        .unwrap();
    let cfg = SchedConfig { batch_layout: batchkv::sys::BKV_BATCH_PERSISTENT, ..Default::default() };
    let mut s = Scheduler::new(&mut pool, Mirror::default(), &cfg, None).unwrap();
    for i in 0..4 {
        let p: Vec<i32> = (100 + i..110 + i).collect();
        s.submit(&Request::new(&p, 9)).unwrap();
    }
    s.run().unwrap();
    assert!(s.host_mut().deltas > 0);
}

#[test]
fn pool_room_pins_and_dropped_sequences() {
    let mut p = Pool::new(&PoolConfig { device_blocks: 16, block_tokens: 4, pin_permille: 500,
                                        ..Default::default() }).unwrap();
    assert_eq!(p.available(), 16);
    assert!(p.can_admit(16 * 4));
    assert!(!p.can_admit(16 * 4 + 1));
    let a = p.open().unwrap();
    let toks: Vec<i32> = (100..112).collect();
    assert_eq!(p.blocks_needed(a, 12).unwrap(), 3);
    p.append(a, &toks).unwrap();
    assert_eq!(p.blocks_needed(a, 1).unwrap(), 1);
    p.close_seq(a).unwrap(); // its 3 full blocks stay cached
    let (pin, got) = p.pin_prefix(0, &toks).unwrap();
    assert_eq!(got, 12);
    let b = p.open().unwrap();
    p.append(b, &[1, 2, 3]).unwrap();
    p.drop_seq(b).unwrap(); // dropped: its blocks are not cached
    assert_eq!(p.unpin(pin), Ok(()));
    assert_eq!(p.unpin(pin).unwrap_err(), Error::NotFound);
    assert_eq!(p.check(), 0);
    assert_eq!(p.available(), 16);
}

#[test]
fn release_and_resume_the_device_kv() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let mut s = Scheduler::new(&mut pool, PlusOne::default(), &SchedConfig::default(), None).unwrap();
    let ids = submit3(&s);
    s.step().unwrap();
    let e = s.release_kv(batchkv::sys::BKV_RELEASE_REFUSE).unwrap_err();
    assert_eq!(e, Error::State);
    assert!(e.to_string().contains("running"), "{}", e);
    s.release_kv(batchkv::sys::BKV_RELEASE_RECOMPUTE).unwrap();
    let calls = s.host_mut().calls;
    s.step().unwrap(); // released: drains only
    assert_eq!(s.host_mut().calls, calls);
    s.resume_kv().unwrap();
    s.run().unwrap();
    assert_eq!(s.host_mut().tokens[&ids[2]], vec![105, 106, 107, 108, 109, 110]);
}

/// An overlapped host: `launch` queues what the device will compute (the
/// last input token of each sampling row, a placeholder resolved when the
/// device runs it); the test's loop runs the device and completes the step.
#[derive(Default)]
struct OverlapPlusOne {
    inner: PlusOne,
    queue: Vec<Vec<(usize, u64, u32, i32)>>,
    rows: Vec<usize>,
    last: HashMap<(u64, u32), i32>,
}

impl OverlapPlusOne {
    fn run_device(&mut self) -> Vec<i32> {
        let rows = self.queue.remove(0);
        let n = self.rows.remove(0);
        let mut next = vec![0i32; n];
        for (r, req, br, t) in rows {
            let t = if t <= -2 { self.last[&(req, br)] } else { t };
            next[r] = t + 1;
            self.last.insert((req, br), t + 1);
        }
        next
    }
}

impl Host for OverlapPlusOne {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        self.inner.forward(b, next)
    }
    const HAS_LAUNCH: bool = true;
    fn launch(&mut self, b: &Batch<'_>) -> std::result::Result<(), HostFailed> {
        let (tok, qo) = (b.token_ids(), b.qo_indptr());
        let mut rows = Vec::new();
        for r in 0..b.n_rows() {
            if b.row_sample()[r] != 0 {
                rows.push((r, b.row_req()[r], b.row_branch()[r], tok[qo[r + 1] as usize - 1]));
            }
        }
        self.queue.push(rows);
        self.rows.push(b.n_rows());
        Ok(())
    }
    fn on_token(&mut self, req: u64, b: u32, token: i32, u: usize) {
        self.inner.on_token(req, b, token, u)
    }
    fn on_finish(&mut self, req: u64, why: FinishReason, user: usize) {
        self.inner.on_finish(req, why, user)
    }
}

#[test]
fn overlapped_launch_and_complete_match_plain() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let cfg = SchedConfig { overlap: 1, ..Default::default() };
    let mut s = Scheduler::new(&mut pool, OverlapPlusOne::default(), &cfg, None).unwrap();
    let ids = submit3(&s);
    let mut out: Vec<Ticket> = Vec::new();
    while s.pending() > 0 || !out.is_empty() {
        let l = if s.pending() > 0 { s.launch().unwrap() } else { Launch::Nothing };
        match l {
            Launch::Step(t) => {
                out.push(t);
                if out.len() == 2 {
                    let next = s.host_mut().run_device();
                    s.complete(out.remove(0), Some(&next)).unwrap();
                }
            }
            Launch::Nothing | Launch::Busy => {
                while !out.is_empty() {
                    let next = s.host_mut().run_device();
                    s.complete(out.remove(0), Some(&next)).unwrap();
                }
            }
        }
    }
    assert!(s.stats().unwrap().overlap_steps > 0);
    let h = s.host_mut();
    assert_eq!(h.inner.tokens[&ids[2]], vec![105, 106, 107, 108, 109, 110]);
    assert_eq!(h.inner.tokens[&ids[1]], vec![105, 106, 107, 108]);
}

/// An overlapped host at any depth: `launch` copies what the device reads
/// (token ids, rows, which rows sample); the device runs the steps in launch
/// order, resolves each placeholder from the tokens of the steps it ran
/// before (`resolve_placeholders`: by back distance and row) and answers
/// last input token + 1, as `PlusOne` does.
#[derive(Default)]
struct PipelinedPlusOne {
    inner: PlusOne,
    queue: Vec<(Vec<i32>, Vec<i32>, Vec<u8>)>,
    recent: Vec<Vec<i32>>, // sampled tokens of the steps run, newest first
    backs: HashMap<u32, u64>,
}

impl PipelinedPlusOne {
    fn run_device(&mut self) -> Vec<i32> {
        let (mut ids, qo, sample) = self.queue.remove(0);
        let recent: Vec<&[i32]> = self.recent.iter().map(|v| v.as_slice()).collect();
        resolve_placeholders(&mut ids, &recent).unwrap();
        let next: Vec<i32> = (0..sample.len())
            .map(|r| if sample[r] != 0 { ids[qo[r + 1] as usize - 1] + 1 } else { 0 })
            .collect();
        self.recent.insert(0, next.clone());
        self.recent.truncate(OVERLAP_MAX_DEPTH as usize);
        next
    }
}

impl Host for PipelinedPlusOne {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        self.inner.forward(b, next)
    }
    const HAS_LAUNCH: bool = true;
    fn launch(&mut self, b: &Batch<'_>) -> std::result::Result<(), HostFailed> {
        for &t in b.token_ids().iter().filter(|&&t| token_is_pending(t)) {
            *self.backs.entry(token_pending_back(t)).or_insert(0) += 1;
        }
        self.queue.push((b.token_ids().to_vec(), b.qo_indptr().to_vec(), b.row_sample().to_vec()));
        Ok(())
    }
    fn on_token(&mut self, req: u64, b: u32, token: i32, u: usize) {
        self.inner.on_token(req, b, token, u)
    }
    fn on_finish(&mut self, req: u64, why: FinishReason, user: usize) {
        self.inner.on_finish(req, why, user)
    }
}

/// Twelve requests (one forked) at overlap depth `depth`, by the drain rules:
/// launch until `depth` steps are in flight, complete the oldest once
/// `depth + 1` are outstanding or a launch had nothing to compute, every
/// outstanding step after `Busy`. Each request's tokens (sorted: a forked
/// request's branches interleave), the placeholders by back distance and
/// the most steps outstanding.
fn serve_pipelined(depth: u32) -> (Vec<Vec<i32>>, HashMap<u32, u64>, usize) {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 256, ..Default::default() }).unwrap();
    let cfg = SchedConfig { overlap: depth, ..Default::default() };
    let mut s = Scheduler::new(&mut pool, PipelinedPlusOne::default(), &cfg, None).unwrap();
    let prompts: Vec<Vec<i32>> = (0..12).map(|i| (0..5 + i).map(|j| 100 + 7 * i + j).collect()).collect();
    let ids: Vec<u64> = prompts.iter().enumerate().map(|(i, p)| {
        s.submit(&Request { n: if i == 5 { 2 } else { 1 }, ..Request::new(p, 4 + 3 * i as u32) })
            .unwrap()
    }).collect();
    let (mut out, mut most): (Vec<Ticket>, usize) = (Vec::new(), 0);
    while s.pending() > 0 || !out.is_empty() {
        let l = if s.pending() > 0 { s.launch().unwrap() } else { Launch::Nothing };
        let drain_all = matches!(l, Launch::Busy);
        let nothing = matches!(l, Launch::Nothing);
        if let Launch::Step(t) = l {
            out.push(t);
            most = most.max(out.len());
        }
        while !out.is_empty() && (drain_all || nothing || out.len() == depth as usize + 1) {
            let next = s.host_mut().run_device();
            s.complete(out.remove(0), Some(&next)).unwrap();
            if !drain_all {
                break;
            }
        }
    }
    assert!(s.stats().unwrap().overlap_steps > 0);
    let h = s.host_mut();
    let toks = ids.iter().map(|id| {
        let mut v = h.inner.tokens[id].clone();
        v.sort_unstable();
        v
    }).collect();
    (toks, h.backs.clone(), most)
}

#[test]
fn placeholder_helpers_match_the_header_encoding() {
    assert_eq!(token_pending_at(1, 0), -2);
    assert_eq!(token_pending_at(1, 5), -7);
    assert_eq!(token_pending_at(2, 0), -2 - (1 << 18));
    for back in [1, 2, OVERLAP_MAX_DEPTH] {
        for row in [0, 1, (1 << 18) - 1] {
            let t = token_pending_at(back, row);
            assert!(token_is_pending(t));
            assert_eq!((token_pending_back(t), token_pending_row(t)), (back, row));
        }
    }
    assert!(!token_is_pending(-1));
    assert!(!token_is_pending(token_pending_at(OVERLAP_MAX_DEPTH + 1, 0)));
    let mut ids = [5, token_pending_at(1, 1), token_pending_at(2, 0), 9];
    assert_eq!(resolve_placeholders(&mut ids, &[&[10, 11], &[20]]), Ok(2));
    assert_eq!(ids, [5, 11, 20, 9]);
    let mut far = [token_pending_at(2, 0)];
    assert_eq!(resolve_placeholders(&mut far, &[&[10, 11]]), Err(Error::InvalidArgument));
    assert_eq!(far, [token_pending_at(2, 0)], "unchanged on error");
}

#[test]
fn pipelined_depths_2_and_4_keep_that_many_steps_in_flight_and_match_depth_1() {
    let (plain, _, most1) = serve_pipelined(1);
    assert_eq!(most1, 2);
    assert_eq!(plain[0], vec![105, 106, 107, 108]);
    for depth in [2u32, 4] {
        let (toks, backs, most) = serve_pipelined(depth);
        assert_eq!(most, depth as usize + 1, "depth {}", depth);
        assert_eq!(toks, plain, "depth {}", depth);
        assert!(backs.values().sum::<u64>() > 0);
        assert!(backs.keys().all(|&k| k >= 1 && k <= depth), "{:?}", backs);
    }
}
