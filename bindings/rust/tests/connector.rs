//! A KV connector (`Scheduler::with_connector`, `XferDone`) over an
//! in-memory store of KV cells: a host whose tokens depend on every KV cell
//! it reads through the block tables, so a wrong, missing or early load
//! changes them. What one engine saves, a second engine on a fresh pool
//! loads instead of computing, with the tokens of a run without the
//! connector; lookups answered later, a failed block, transfers completed
//! later and from another thread, refused completions, a panicking lookup.
//! A pool with a full and a window group, whose connector's `contains` ends
//! each load where both groups' blocks are held.
use batchkv::*;
use std::collections::{HashMap, HashSet};
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

const BT: usize = 4;

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// block hash -> the block's cells
type Store = Arc<Mutex<HashMap<u64, Vec<u64>>>>;

#[derive(Default)]
struct Engine {
    /// device KV cells, a slot each
    dev: Vec<u64>,
    /// tokens by request user (the workload's index)
    tokens: HashMap<usize, Vec<i32>>,
    finished: usize,
    store: Option<Store>,
    /// complete each transfer inside the call (else queue it)
    inline: bool,
    /// answer each request's first lookup Later
    later: bool,
    asked: HashSet<u64>,
    /// fail the load of every block of this logical index
    fail_index: Option<u32>,
    /// the save status given to xfer_done
    save_status: i32,
    panic_lookup: bool,
    queue: Vec<(u64, Vec<XferBlock>, bool)>,
    done: Option<XferDone>,
    loads: u64,
    saves: u64,
}

impl Engine {
    fn new(blocks: usize, store: Option<Store>) -> Engine {
        Engine { dev: vec![0; blocks * BT], store, inline: true, ..Default::default() }
    }

    /// Move the cells of one transfer and complete it.
    fn run(&mut self, done: &XferDone, xfer: u64, blocks: &[XferBlock], load: bool) {
        let store = self.store.as_ref().unwrap().clone();
        let mut store = store.lock().unwrap();
        let mut failed = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!((b.frames, b.group), (1, 0));
            let d = b.block as usize * BT..(b.block as usize + 1) * BT;
            if load {
                match store.get(&b.hash) {
                    Some(cells) if Some(b.index) != self.fail_index => {
                        self.dev[d].copy_from_slice(cells)
                    }
                    _ => failed.push(i as u32),
                }
            } else if self.save_status == 0 {
                store.insert(b.hash, self.dev[d].to_vec());
            }
        }
        let status = if load { 0 } else { self.save_status };
        done.done(xfer, status, &failed).unwrap();
    }

    fn start(&mut self, done: &XferDone, xfer: u64, blocks: &[XferBlock], load: bool) {
        if self.inline {
            self.run(done, xfer, blocks, load);
        } else {
            self.done = Some(done.clone());
            self.queue.push((xfer, blocks.to_vec(), load));
        }
    }

    fn flush(&mut self) {
        while let Some((x, b, load)) = self.queue.pop() {
            let done = self.done.clone().unwrap();
            self.run(&done, x, &b, load);
        }
    }
}

impl Host for Engine {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        let (tok, pos, qo) = (b.token_ids(), b.positions(), b.qo_indptr());
        let (kvp, kvi, slots) = (b.kv_indptr(), b.kv_indices(), b.slot_mapping());
        for r in 0..b.n_rows() {
            let blocks = &kvi[kvp[r] as usize..kvp[r + 1] as usize];
            let mut h = 0u64;
            for i in qo[r] as usize..qo[r + 1] as usize {
                let p = pos[i] as usize;
                assert_eq!(slots[i] as usize, blocks[p / BT] as usize * BT + p % BT);
                self.dev[slots[i] as usize] = mix(((tok[i] as u64) << 32) | p as u64);
                h = 0;
                for q in 0..=p {
                    let cell = self.dev[blocks[q / BT] as usize * BT + q % BT];
                    assert_ne!(cell, 0, "position {} read before it was written or loaded", q);
                    h = mix(h ^ cell);
                }
            }
            if b.row_sample()[r] != 0 {
                next[r] = 100 + (h % 900) as i32;
            }
        }
        Ok(())
    }
    fn on_token(&mut self, _req: u64, _b: u32, token: i32, user: usize) {
        self.tokens.entry(user).or_insert_with(Vec::new).push(token);
    }
    fn on_finish(&mut self, _req: u64, _why: FinishReason, _user: usize) {
        self.finished += 1;
    }
}

impl KvConnector for Engine {
    fn lookup(&mut self, req: u64, hashes: &[u64]) -> Lookup {
        if self.panic_lookup {
            self.panic_lookup = false;
            panic!("store offline");
        }
        if self.later && self.asked.insert(req) {
            return Lookup::Later;
        }
        let store = self.store.as_ref().unwrap().lock().unwrap();
        Lookup::Blocks(hashes.iter().take_while(|h| store.contains_key(h)).count() as u32)
    }
    fn load(&mut self, done: &XferDone, xfer: u64, _req: u64, blocks: &[XferBlock])
        -> std::result::Result<(), XferFailed> {
        self.loads += 1;
        self.start(done, xfer, blocks, true);
        Ok(())
    }
    fn save(&mut self, done: &XferDone, xfer: u64, blocks: &[XferBlock])
        -> std::result::Result<(), XferFailed> {
        self.saves += 1;
        self.start(done, xfer, blocks, false);
        Ok(())
    }
    const SAVE_BLOCKS: u32 = 4;
    const MAX_SAVES: u32 = 8;
}

/// 10 prompts: 3 shared blocks and a private tail of 1..6 tokens.
fn prompts() -> Vec<Vec<i32>> {
    (0..10).map(|i| {
        let mut p: Vec<i32> = (0..3 * BT as i32).map(|t| 500 + t).collect();
        p.extend((0..1 + i % 6).map(|t| 700 + 10 * i + t));
        p
    }).collect()
}

fn cfg() -> SchedConfig {
    SchedConfig { max_running: 8, chunked_prefill: 1, token_budget: 24, ..Default::default() }
}

fn pool() -> Pool {
    Pool::new(&PoolConfig { device_blocks: 128, block_tokens: BT as u32, event_capacity: 4096,
                            ..Default::default() }).unwrap()
}

/// Serve the prompts; with a store, through the connector. Returns the
/// tokens by prompt, the stats, the external STORED events and the engine.
fn serve(e: Engine, with: bool) -> (Vec<Vec<i32>>, SchedStats, usize, Engine) {
    serve_as(e, with, false)
}

fn serve_as(mut e: Engine, with: bool, split: bool)
    -> (Vec<Vec<i32>>, SchedStats, usize, Engine) {
    let mut pool = pool();
    let ps = prompts();
    let mut s = if with && split {
        Scheduler::with_connector_split(&mut pool, e, &cfg(), None).unwrap()
    } else if with {
        Scheduler::with_connector(&mut pool, e, &cfg(), None).unwrap()
    } else {
        e.store = None;
        Scheduler::new(&mut pool, e, &cfg(), None).unwrap()
    };
    for (i, p) in ps.iter().enumerate() {
        s.submit(&Request { user: i, ..Request::new(p, 5) }).unwrap();
    }
    let mut steps = 0;
    while s.pending() > 0 || !s.host_mut().queue.is_empty() {
        s.step().unwrap();
        assert_eq!(s.check().unwrap(), 0);
        steps += 1;
        if steps % 3 == 0 {
            s.host_mut().flush();
        }
        assert!(steps < 2000, "stuck");
    }
    s.host_mut().flush();
    s.step().unwrap();
    let st = s.stats().unwrap();
    let ext = s.pool_events(4096).unwrap().iter()
        .filter(|ev| ev.medium == sys::BKV_MEDIUM_EXTERNAL as u32
                && ev.kind == sys::BKV_EVENT_STORED as u32).count();
    let e = std::mem::take(s.host_mut());
    drop(s);
    let mut toks = vec![Vec::new(); ps.len()];
    for (u, t) in &e.tokens {
        toks[*u] = t.clone();
    }
    assert_eq!(e.finished, ps.len());
    (toks, st, ext, e)
}

fn two_engines(inline: bool) {
    let (plain, _, _, _) = serve(Engine::new(128, None), false);
    let store: Store = Arc::default();
    let mut e1 = Engine::new(128, Some(store.clone()));
    e1.inline = inline;
    let (t1, s1, ext1, e1) = serve(e1, true);
    assert_eq!(t1, plain);
    assert!(s1.kv_saved > 0 && e1.saves > 0);
    assert_eq!((s1.kv_save_held, s1.kv_save_failed, s1.kv_loads), (0, 0, 0));
    assert_eq!(ext1 as u64, s1.kv_saved);
    let distinct = store.lock().unwrap().len() as u64;
    assert!(distinct > 0 && distinct <= s1.kv_saved);

    let mut e2 = Engine::new(128, Some(store.clone()));
    e2.inline = inline;
    let (t2, s2, _, e2) = serve(e2, true);
    assert!(s2.kv_lookups >= 10 && s2.kv_lookup_errors == 0);
    assert!(s2.kv_loads > 0 && e2.loads == s2.kv_loads);
    assert!(s2.kv_load_tokens > 0 && s2.kv_load_failed == 0);
    assert_eq!(s2.kv_waiting, 0);
    assert_eq!(t2, plain, "a loaded prefix changed the tokens");
}

#[test]
fn a_second_engine_loads_what_the_first_saved_inline() {
    two_engines(true);
}

#[test]
fn a_second_engine_loads_what_the_first_saved_later() {
    two_engines(false);
}

#[test]
fn a_split_host_loads_too() {
    let (plain, _, _, _) = serve(Engine::new(128, None), false);
    let store: Store = Arc::default();
    serve(Engine::new(128, Some(store.clone())), true);
    let (t, st, _, _) = serve_as(Engine::new(128, Some(store)), true, true);
    assert!(st.kv_load_tokens > 0 && st.prefill_calls > 0 && st.decode_calls > 0);
    assert_eq!(t, plain);
}

#[test]
fn lookups_answered_later_and_a_failed_block() {
    let (plain, _, _, _) = serve(Engine::new(128, None), false);
    let store: Store = Arc::default();
    serve(Engine::new(128, Some(store.clone())), true);
    let mut e = Engine::new(128, Some(store.clone()));
    e.later = true;
    let (t, st, _, e) = serve(e, true);
    assert!(st.kv_lookups >= 20 && !e.asked.is_empty());
    assert!(st.kv_load_tokens > 0);
    assert_eq!(t, plain);
    let mut e = Engine::new(128, Some(store));
    e.fail_index = Some(1);
    let (t, st, _, _) = serve(e, true);
    assert!(st.kv_load_failed > 0 && st.kv_loads > 0);
    assert_eq!(t, plain, "a failed block was not recomputed");
}

#[test]
fn xfer_done_refusals_change_nothing_and_the_handle_crosses_threads() {
    fn send_sync<T: Send + Sync + Clone + 'static>() {}
    send_sync::<XferDone>();
    let store: Store = Arc::default();
    let mut e = Engine::new(64, Some(store));
    e.inline = false;
    let mut pool = pool();
    let s = Scheduler::with_connector(&mut pool, e, &cfg(), None).unwrap();
    let prompt: Vec<i32> = (100..120).collect();
    s.submit(&Request::new(&prompt, 3)).unwrap();
    let mut s = s;
    while s.host_mut().queue.is_empty() {
        s.step().unwrap();
    }
    let (xfer, n) = (s.host_mut().queue[0].0, s.host_mut().queue[0].1.len() as u32);
    assert_eq!(s.xfer_done(xfer ^ (1 << 40), 0, &[]).unwrap_err(), Error::NotFound);
    assert_eq!(s.xfer_done(xfer, 0, &[n + 100]).unwrap_err(), Error::InvalidArgument);
    s.run().unwrap();
    assert!(s.stats().unwrap().kv_save_held > 0, "the saves hold their blocks");
    // complete every save from another thread, the first one failed
    let q: Vec<(u64, usize)> = s.host_mut().queue.iter().map(|(x, b, _)| (*x, b.len())).collect();
    let h = s.xfer_handle();
    let q2 = q.clone();
    std::thread::spawn(move || {
        for (i, (x, _)) in q2.iter().enumerate() {
            h.done(*x, if i == 0 { -1 } else { 0 }, &[]).unwrap();
        }
    }).join().unwrap();
    // and through the scheduler itself, shared with a scoped thread
    s.step().unwrap();
    std::thread::scope(|sc| {
        sc.spawn(|| assert_eq!(s.xfer_done(xfer, 0, &[]).unwrap_err(), Error::NotFound));
    });
    let st = s.stats().unwrap();
    assert_eq!(st.kv_save_held, 0);
    assert_eq!(st.kv_save_failed, q[0].1 as u64);
    assert_eq!(st.kv_saved, q[1..].iter().map(|e| e.1 as u64).sum::<u64>());
    let h = s.xfer_handle();
    drop(s);
    assert_eq!(h.done(xfer, 0, &[]).unwrap_err(), Error::State, "the scheduler is gone");
}

#[test]
fn a_panicking_lookup_is_resumed_and_counted_as_an_error() {
    let store: Store = Arc::default();
    let mut e = Engine::new(64, Some(store));
    e.panic_lookup = true;
    let mut pool = pool();
    let s = Scheduler::with_connector(&mut pool, e, &cfg(), None).unwrap();
    let prompt: Vec<i32> = (100..120).collect();
    s.submit(&Request::new(&prompt, 3)).unwrap();
    let r = panic::catch_unwind(AssertUnwindSafe(|| s.step()));
    assert_eq!(r.unwrap_err().downcast_ref::<&str>(), Some(&"store offline"));
    s.run().unwrap();
    let st = s.stats().unwrap();
    assert_eq!((st.kv_lookup_errors, st.finished), (1, 1));
}

#[test]
fn connector_config_defaults_and_refusals() {
    let c = SchedConfig::default();
    assert_eq!(c.pad1, 0);
    assert!(c.connector.is_null());
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, block_tokens: BT as u32,
                                           prefix_cache: 0, ..Default::default() }).unwrap();
    let e = Engine::new(64, Some(Arc::default()));
    let err = Scheduler::with_connector(&mut pool, e, &cfg(), None).err().unwrap();
    assert_eq!(err, Error::InvalidArgument);
}

// -- a hybrid pool (a full group and a window group) and `contains` ---------

fn hybrid() -> [KvGroup; 2] {
    [KvGroup::full(2, 64), KvGroup::window(2, 6, 64)]
}

/// block hash -> (group, logical index, cells)
type GroupHeld = HashMap<u64, (u32, u32, Vec<u64>)>;

/// A host with a KV cell per slot of each group, whose next token depends
/// on every cell it reads through the groups' block tables (the full group:
/// the whole sequence; the window group: its last span positions), so a
/// wrong or missing block of either group changes the tokens or trips the
/// read of an empty cell. Its connector (`C`: with `contains`) moves the
/// cells to and from `held`, completing each transfer inside the call.
#[derive(Default)]
struct GroupEngine<const C: bool> {
    dev: [Vec<u64>; 2],
    tokens: HashMap<usize, Vec<i32>>,
    finished: usize,
    held: GroupHeld,
    contains_calls: u64,
    panic_contains: bool,
    saves: u64,
    loaded_groups: HashSet<u32>,
}

impl<const C: bool> GroupEngine<C> {
    fn new(blocks: usize, held: GroupHeld) -> Self {
        GroupEngine { dev: [vec![0; blocks * BT], vec![0; blocks * BT]], held, ..Default::default() }
    }

    fn run(&mut self, done: &XferDone, xfer: u64, blocks: &[XferBlock], load: bool) {
        let mut failed = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(b.frames, 1);
            let g = b.group as usize;
            let d = b.block as usize * BT..(b.block as usize + 1) * BT;
            if load {
                match self.held.get(&b.hash) {
                    Some((hg, hi, cells)) => {
                        assert_eq!((*hg, *hi), (b.group, b.index), "a hash names one group's block");
                        self.dev[g][d].copy_from_slice(cells);
                        self.loaded_groups.insert(b.group);
                    }
                    None => failed.push(i as u32),
                }
            } else {
                let cells = self.dev[g][d].to_vec();
                self.held.insert(b.hash, (b.group, b.index, cells));
            }
        }
        done.done(xfer, 0, &failed).unwrap();
    }
}

impl<const C: bool> Host for GroupEngine<C> {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        let (tok, pos, qo) = (b.token_ids(), b.positions(), b.qo_indptr());
        let groups: Vec<BatchGroup<'_>> = b.groups().collect();
        assert_eq!(groups.len(), 2);
        for r in 0..b.n_rows() {
            let mut h = 0u64;
            for i in qo[r] as usize..qo[r + 1] as usize {
                let p = pos[i] as usize;
                for (gi, g) in groups.iter().enumerate() {
                    self.dev[gi][g.slot_mapping()[i] as usize] =
                        mix(((gi as u64) << 56) | ((tok[i] as u64) << 32) | p as u64);
                }
                h = 0;
                for (gi, g) in groups.iter().enumerate() {
                    let span = g.span() as usize;
                    let lo = if span == 0 { 0 } else { (p + 1).saturating_sub(span) };
                    let base = g.kv_indptr()[r] as usize;
                    let first = g.kv_first_block()[r] as usize;
                    for q in lo..=p {
                        let blk = g.kv_indices()[base + q / BT - first] as usize;
                        let cell = self.dev[gi][blk * BT + q % BT];
                        assert_ne!(cell, 0, "group {} position {} read before it was written", gi, q);
                        h = mix(h ^ cell);
                    }
                }
            }
            if b.row_sample()[r] != 0 {
                next[r] = 100 + (h % 900) as i32;
            }
        }
        Ok(())
    }
    fn on_token(&mut self, _req: u64, _b: u32, token: i32, user: usize) {
        self.tokens.entry(user).or_insert_with(Vec::new).push(token);
    }
    fn on_finish(&mut self, _req: u64, _why: FinishReason, _user: usize) {
        self.finished += 1;
    }
}

impl<const C: bool> KvConnector for GroupEngine<C> {
    fn lookup(&mut self, _req: u64, hashes: &[u64]) -> Lookup {
        Lookup::Blocks(hashes.iter().take_while(|h| self.held.contains_key(h)).count() as u32)
    }
    fn load(&mut self, done: &XferDone, xfer: u64, _req: u64, blocks: &[XferBlock])
        -> std::result::Result<(), XferFailed> {
        self.run(done, xfer, blocks, true);
        Ok(())
    }
    fn save(&mut self, done: &XferDone, xfer: u64, blocks: &[XferBlock])
        -> std::result::Result<(), XferFailed> {
        self.saves += 1;
        self.run(done, xfer, blocks, false);
        Ok(())
    }
    const HAS_CONTAINS: bool = C;
    fn contains(&mut self, hash: u64) -> bool {
        self.contains_calls += 1;
        if self.panic_contains {
            self.panic_contains = false;
            panic!("contains failed");
        }
        self.held.contains_key(&hash)
    }
}

/// 8 prompts: 6 shared blocks and a private tail of 1..5 tokens.
fn hybrid_prompts() -> Vec<Vec<i32>> {
    (0..8).map(|i| {
        let mut p: Vec<i32> = (0..6 * BT as i32).map(|t| 500 + t).collect();
        p.extend((0..1 + i % 5).map(|t| 700 + 10 * i + t));
        p
    }).collect()
}

/// Serve the hybrid prompts (through the connector when `with`): the tokens
/// by prompt, the stats, the engine and how many steps resumed a panic.
fn serve_hybrid<const C: bool>(e: GroupEngine<C>, with: bool)
    -> (Vec<Vec<i32>>, SchedStats, GroupEngine<C>, usize) {
    let cfg = PoolConfig { device_blocks: 256, block_tokens: BT as u32, ..Default::default() };
    let mut pool = Pool::with_groups(&cfg, &hybrid()).unwrap();
    let sc = cfg_hybrid();
    let mut s = if with {
        Scheduler::with_connector(&mut pool, e, &sc, None).unwrap()
    } else {
        Scheduler::new(&mut pool, e, &sc, None).unwrap()
    };
    let ps = hybrid_prompts();
    for (i, p) in ps.iter().enumerate() {
        s.submit(&Request { user: i, ..Request::new(p, 5) }).unwrap();
    }
    let (mut steps, mut panics) = (0, 0);
    while s.pending() > 0 {
        match panic::catch_unwind(AssertUnwindSafe(|| s.step())) {
            Ok(r) => { r.unwrap(); }
            Err(p) => {
                assert_eq!(p.downcast_ref::<&str>(), Some(&"contains failed"));
                panics += 1;
            }
        }
        assert_eq!(s.check().unwrap(), 0);
        steps += 1;
        assert!(steps < 2000, "stuck");
    }
    s.step().unwrap();
    let st = s.stats().unwrap();
    let e = std::mem::take(s.host_mut());
    drop(s);
    assert_eq!(e.finished, ps.len());
    let toks = (0..ps.len()).map(|u| e.tokens[&u].clone()).collect();
    (toks, st, e, panics)
}

fn cfg_hybrid() -> SchedConfig {
    SchedConfig { max_running: 8, chunked_prefill: 1, token_budget: 24, ..Default::default() }
}

#[test]
fn a_hybrid_pool_loads_every_groups_blocks_with_contains() {
    let (plain, _, _, _) = serve_hybrid(GroupEngine::<true>::new(256, GroupHeld::new()), false);
    let (t1, s1, e1, _) = serve_hybrid(GroupEngine::<true>::new(256, GroupHeld::new()), true);
    assert_eq!(t1, plain);
    assert!(s1.kv_saved > 0 && e1.saves > 0 && s1.kv_save_failed == 0);
    let groups: HashSet<u32> = e1.held.values().map(|v| v.0).collect();
    assert_eq!(groups, [0, 1].into_iter().collect(), "both groups' blocks were saved");
    // The store loses the window group's block of the last shared block: the
    // prefix lookup reports (group 0's 6 blocks) lacks a window block. Each
    // engine below gets its own copy (what it recomputes it saves).
    let kept: GroupHeld = e1.held.iter().filter(|(_, v)| (v.0, v.1) != (1, 5))
        .map(|(h, v)| (*h, v.clone())).collect();
    assert!(kept.len() < e1.held.len());

    let (t2, s2, e2, _) = serve_hybrid(GroupEngine::<true>::new(256, kept.clone()), true);
    assert!(e2.contains_calls > 0, "the library asked contains");
    assert!(s2.kv_loads > 0 && s2.kv_load_tokens > 0, "the second engine loads ({} failed, {} lookups)",
            s2.kv_load_failed, s2.kv_lookups);
    assert_eq!(s2.kv_load_failed, 0, "the load ended where every group's blocks are held");
    assert_eq!(s2.kv_load_tokens, s2.kv_loads * 5 * BT as u64, "each load ends before the lost block");
    assert_eq!(e2.loaded_groups, [0, 1].into_iter().collect());
    assert_eq!(t2, plain, "a loaded prefix changed the tokens");

    // without contains (HAS_CONTAINS false) the load ends where lookup said:
    // the lost window block fails (and is recomputed)
    let (t3, s3, e3, _) = serve_hybrid(GroupEngine::<false>::new(256, kept.clone()), true);
    assert!(e3.contains_calls == 0 && s3.kv_load_failed > 0);
    assert_eq!(t3, plain);

    // a panic in contains: that block counts as not held, and step resumes
    // the panic after the step
    let mut e4 = GroupEngine::<true>::new(256, kept);
    e4.panic_contains = true;
    let (t4, s4, e4, panics) = serve_hybrid(e4, true);
    assert!(panics == 1 && e4.contains_calls > 1);
    assert_eq!(s4.kv_load_failed, 0);
    assert_eq!(t4, plain);
}
