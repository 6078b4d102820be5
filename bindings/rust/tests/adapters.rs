//! Adapters (LoRA) per request through the safe layer:
//! `SchedConfig::max_adapters`, `Request::adapter`, the batch's
//! `row_adapter` and `adapters`, the refusals, and `adapter_cache_key`, the
//! pool key an adapter's blocks are cached under. Mirrors the Python
//! binding's tests/test_adapters.py.
use batchkv::*;
use std::collections::{HashMap, HashSet};

/// Answers (last input token + 1) and checks every call's adapters: each
/// row's entry of `row_adapter` is its request's adapter (the request's
/// `user` is its adapter), the call's distinct nonzero adapters are at most
/// the cap and are exactly `adapters`, in the order of their first row.
/// `cap` None: a scheduler without adapters, whose batches carry none.
struct AdapterHost {
    cap: Option<usize>,
    most: usize,
    seen: HashSet<u32>,
    tokens: HashMap<u64, Vec<i32>>,
    finished: HashMap<u64, FinishReason>,
}

impl AdapterHost {
    fn new(cap: Option<usize>) -> AdapterHost {
        AdapterHost { cap, most: 0, seen: HashSet::new(), tokens: HashMap::new(),
                      finished: HashMap::new() }
    }
}

impl Host for AdapterHost {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        match self.cap {
            None => {
                assert!(b.row_adapter().is_empty(), "NULL without max_adapters: an empty slice");
                assert_eq!((b.n_adapters(), b.adapters().len()), (0, 0));
            }
            Some(cap) => {
                let ra = b.row_adapter();
                assert_eq!(ra.len(), b.n_rows());
                let users: Vec<u32> = b.row_user().iter().map(|&u| u as u32).collect();
                assert_eq!(ra, &users[..]);
                let mut distinct: Vec<u32> = Vec::new();
                for &a in ra {
                    if a != 0 && !distinct.contains(&a) {
                        distinct.push(a);
                    }
                }
                assert!(distinct.len() <= cap, "{:?}", distinct);
                assert_eq!(b.n_adapters(), distinct.len());
                assert_eq!(b.adapters(), &distinct[..]);
                self.most = self.most.max(distinct.len());
                self.seen.extend(distinct);
            }
        }
        let (tok, qo) = (b.token_ids(), b.qo_indptr());
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
    fn on_finish(&mut self, req: u64, why: FinishReason, _u: usize) {
        assert!(self.finished.insert(req, why).is_none(), "ended twice");
    }
}

#[test]
fn no_call_carries_more_adapters_than_max_adapters() {
    // three adapters under a cap of two, long prompts in chunks of a small
    // budget so that prompts admitted earlier keep joining calls
    let mut pool = Pool::new(&PoolConfig { device_blocks: 128, block_tokens: 4, ..Default::default() })
        .unwrap();
    let cfg = SchedConfig { max_adapters: 2, adapter_wait_us: 2000, chunked_prefill: 1,
                            token_budget: 16, max_running: 6, ..Default::default() };
    let mut s = Scheduler::new(&mut pool, AdapterHost::new(Some(2)), &cfg, None).unwrap();
    let prompts: Vec<Vec<i32>> = (0..12).map(|i| {
        let a = 1 + i % 3;
        let mut p = vec![1000 * a + i; 20];
        p.push(i);
        p
    }).collect();
    let mut ids = HashMap::new();
    for (i, p) in prompts.iter().enumerate() {
        let a = 1 + i as u32 % 3;
        let n = 4 + i as u32 % 3;
        let id = s.submit(&Request { adapter: a, user: a as usize, ..Request::new(p, n) }).unwrap();
        ids.insert(id, (p[p.len() - 1], n));
    }
    s.run().unwrap();
    assert_eq!(s.pending(), 0);
    assert_eq!(s.check().unwrap(), 0);
    assert!(s.stats().unwrap().adapter_passes > 0, "the third adapter's requests were passed");
    let h = s.host_mut();
    assert_eq!(h.finished.len(), 12);
    for (id, &(last, n)) in &ids {
        assert_eq!(h.finished[id], FinishReason::Length);
        let want: Vec<i32> = (0..n as i32).map(|j| last + 1 + j).collect();
        assert_eq!(h.tokens[id], want);
    }
    assert_eq!(h.most, 2, "some call carried two adapters");
    assert_eq!(h.seen, [1, 2, 3].iter().copied().collect::<HashSet<u32>>());
}

#[test]
fn without_max_adapters_an_adapter_is_refused_and_batches_carry_none() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    {
        let mut s = Scheduler::new(&mut pool, AdapterHost::new(None), &SchedConfig::default(), None)
            .unwrap();
        let e = s.submit(&Request { adapter: 3, ..Request::new(&[1, 2, 3], 2) }).unwrap_err();
        assert_eq!(e, Error::InvalidArgument);
        let text = e.to_string();
        assert!(text.contains("bkv_request.adapter = 3") && text.contains("max_adapters"), "{}", text);
        assert_eq!(s.stats().unwrap().submitted, 0, "a refused request changes nothing");
        let id = s.submit(&Request::new(&[1, 2, 3], 2)).unwrap();
        s.run().unwrap();
        assert_eq!(s.host_mut().finished[&id], FinishReason::Length);
    }
    let mut refused = |cfg: SchedConfig, field: &str| {
        let host = AdapterHost::new(Some(2));
        match Scheduler::new(&mut pool, host, &cfg, None) {
            Ok(_) => panic!("{} accepted", field),
            Err(e) => {
                assert_eq!(e, Error::InvalidArgument);
                assert!(e.to_string().contains(field), "{}", e);
            }
        }
    };
    refused(SchedConfig { max_adapters: sys::BKV_MAX_ADAPTERS + 1, ..Default::default() },
            "bkv_sched_config.max_adapters = 1025");
    refused(SchedConfig { max_adapters: 2, pad0: 1, ..Default::default() },
            "bkv_sched_config.pad0 = 1");
    refused(SchedConfig { max_adapters: 2, adapter_wait_us: (1 << 42) + 1, ..Default::default() },
            "bkv_sched_config.adapter_wait_us");
}

#[test]
fn adapter_cache_key_keeps_adapters_apart() {
    assert_eq!(adapter_cache_key(5, 0), 5);
    assert_ne!(adapter_cache_key(0, 1), 0);
    assert_ne!(adapter_cache_key(0, 1), adapter_cache_key(0, 2));
    assert_ne!(adapter_cache_key(5, 1), adapter_cache_key(0, 1));
    assert_ne!(adapter_cache_key(0, 1), 1, "not the plain key 1 of a tenant");
    assert_eq!(adapter_cache_key(u64::MAX, 1024), adapter_cache_key(u64::MAX, 1024));
    // the same prompt under adapter 1, adapter 2, adapter 1 again and the
    // base model: only the second adapter-1 request hits (7 full blocks of 4)
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, block_tokens: 4, pin_permille: 500,
                                           ..Default::default() }).unwrap();
    let prompt: Vec<i32> = (300..332).collect();
    {
        let cfg = SchedConfig { max_adapters: 2, ..Default::default() };
        let s = Scheduler::new(&mut pool, AdapterHost::new(Some(2)), &cfg, None).unwrap();
        let mut hits = Vec::new();
        for &a in &[1u32, 2, 1, 0] {
            s.submit(&Request { adapter: a, user: a as usize, ..Request::new(&prompt, 2) }).unwrap();
            s.run().unwrap();
            hits.push(s.stats().unwrap().hit_tokens);
        }
        assert_eq!(hits, vec![0, 0, 28, 28]);
    }
    // the adapter's blocks are in the cache under its key, not under
    // another adapter's
    let (pin, got) = pool.pin_prefix(adapter_cache_key(0, 1), &prompt).unwrap();
    assert_eq!(got, 32, "the prompt's 8 full blocks");
    pool.unpin(pin).unwrap();
    let (pin, got) = pool.pin_prefix(adapter_cache_key(0, 2), &prompt).unwrap();
    assert_eq!(got, 32);
    pool.unpin(pin).unwrap();
    assert_eq!(pool.pin_prefix(adapter_cache_key(0, 3), &prompt).unwrap_err(), Error::NotFound);
}
