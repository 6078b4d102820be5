//! Encoder inputs (images, audio) per request through the safe layer:
//! `SchedConfig::encoder_cache`/`encoder_budget`, `Request::inputs`, the
//! batch's `encode` and `encoder_free`, `encoder_token`, and the refusals.
//! The host keeps an encoder cache (a map): it drops the `encoder_free` ids
//! first, then runs each `encode` entry, and every row must find the outputs
//! of the inputs whose spans it covers in that cache. Mirrors the Python
//! binding's tests/test_encoder.py.
use batchkv::*;
use std::collections::{HashMap, HashSet};

/// What the submitted prompts hold at the inputs' spans.
const PLACEHOLDER: i32 = 7;

/// Answers (last input token + 1) and plays the encoder: a cache of
/// cache_id -> outputs (here: their count), within `cap` tokens, and at most
/// `budget` encoder work per step (the driver resets `step_cost`).
/// `plain`: a scheduler without encoder inputs, whose batches carry none.
struct EncoderHost {
    cap: u32,
    budget: u32,
    plain: bool,
    cache: HashMap<u64, u32>,
    inputs: HashMap<u64, Vec<EncoderInput>>,
    step_cost: u32,
    most_cost: u32,
    encodes: usize,
    frees: usize,
    checked: usize,
    tokens: HashMap<u64, Vec<i32>>,
    finished: HashMap<u64, FinishReason>,
}

impl EncoderHost {
    fn new(cap: u32, budget: u32) -> EncoderHost {
        EncoderHost { cap, budget, plain: false, cache: HashMap::new(), inputs: HashMap::new(),
                      step_cost: 0, most_cost: 0, encodes: 0, frees: 0, checked: 0,
                      tokens: HashMap::new(), finished: HashMap::new() }
    }
}

impl Host for EncoderHost {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        assert_eq!(b.encoder_free().len(), b.n_encoder_free());
        assert_eq!(b.encode().len(), b.n_encode());
        if self.plain {
            assert!(b.encode().is_empty() && b.encoder_free().is_empty(),
                    "NULL without encoder_cache: empty slices");
        }
        for id in b.encoder_free() {
            // drop first
            if self.cache.remove(id).is_some() {
                self.frees += 1;
            }
        }
        for e in b.encode() {
            // then encode
            let u = self.inputs[&e.req][e.input as usize];
            assert_eq!((u.cache_id, u.token_len), (e.cache_id, e.len),
                       "encode names input {} of request {}", e.input, e.req);
            self.step_cost += if u.cost != 0 { u.cost } else { u.token_len };
            self.cache.insert(e.cache_id, e.len);
            self.encodes += 1;
        }
        if self.budget != 0 {
            assert!(self.step_cost <= self.budget, "encoder work {} in a step", self.step_cost);
        }
        self.most_cost = self.most_cost.max(self.step_cost);
        assert!(self.cache.values().sum::<u32>() <= self.cap, "the host's cache outgrew encoder_cache");
        let (tok, pos, qo) = (b.token_ids(), b.positions(), b.qo_indptr());
        for r in 0..b.n_rows() {
            let (first, last) = (qo[r] as usize, qo[r + 1] as usize);
            let start = pos[first] as u32;
            let end = start + (last - first) as u32;
            for (k, u) in self.inputs[&b.row_req()[r]].iter().enumerate() {
                let lo = u.token_start.max(start);
                let hi = (u.token_start + u.token_len).min(end);
                if lo >= hi {
                    continue;
                }
                assert_eq!(self.cache.get(&u.cache_id), Some(&u.token_len),
                           "row {} reads input {} (id {}) before it is encoded", r, k, u.cache_id);
                for p in lo..hi {
                    assert_eq!(tok[first + (p - start) as usize],
                               encoder_token(u.cache_id, p - u.token_start));
                }
                self.checked += 1;
            }
            if b.row_sample()[r] != 0 {
                next[r] = tok[last - 1] + 1;
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

/// A prompt of `len` text tokens (salted so that prompts share no prefix)
/// with the placeholder at the inputs' spans.
fn prompt_with(inputs: &[EncoderInput], len: u32, salt: i32) -> Vec<i32> {
    let mut p: Vec<i32> = (0..len as i32).map(|j| 1000 + 100 * salt + j).collect();
    for u in inputs {
        for j in u.token_start..u.token_start + u.token_len {
            p[j as usize] = PLACEHOLDER;
        }
    }
    p
}

/// Request i's inputs: one to three of `ids` (cache id c is c + 2 tokens
/// long, so that equal ids have equal lengths), spaced by text; costs 0
/// (token_len) or explicit. Returns them and the prompt's length (it ends
/// with text).
fn draw(i: u32, ids: &[u64]) -> (Vec<EncoderInput>, u32) {
    let (mut out, mut p) = (Vec::new(), 1 + i % 3);
    for k in 0..1 + i % 3 {
        let id = ids[((i * 7 + k * 3) as usize) % ids.len()];
        let n = id as u32 + 2;
        let cost = if (i + k) % 2 == 1 { 0 } else { 1 + (i + k) % 4 };
        out.push(EncoderInput::new(id, p, n, cost));
        p += n + 2;
    }
    (out, p + 2)
}

/// Submits `reqs`, steps until none is pending (resetting the host's step
/// cost), and checks every request got its max_new tokens.
fn drive(s: &mut Scheduler<'_, EncoderHost>, reqs: &[(Vec<EncoderInput>, u32)], max_new: u32) {
    let mut last = HashMap::new();
    for (i, (inputs, len)) in reqs.iter().enumerate() {
        let prompt = prompt_with(inputs, *len, i as i32);
        let id = s.submit(&Request { inputs, user: i, ..Request::new(&prompt, max_new) }).unwrap();
        s.host_mut().inputs.insert(id, inputs.clone());
        last.insert(id, prompt[prompt.len() - 1]);
    }
    while s.pending() > 0 {
        s.host_mut().step_cost = 0;
        s.step().unwrap();
    }
    assert_eq!(s.check().unwrap(), 0);
    let h = s.host_mut();
    assert_eq!(h.finished.len(), reqs.len());
    for (id, &l) in &last {
        assert_eq!(h.finished[id], FinishReason::Length);
        let want: Vec<i32> = (0..max_new as i32).map(|j| l + 1 + j).collect();
        assert_eq!(h.tokens[id], want);
    }
}

fn rows_read_encoded_inputs_and_repeated_ids_hit(chunked: i32) {
    // 10 requests over 3 images, each request salted (no prefix-cache
    // hits): a cache that holds them all encodes each id once
    let mut pool = Pool::new(&PoolConfig { device_blocks: 256, block_tokens: 4, ..Default::default() })
        .unwrap();
    let cfg = SchedConfig { encoder_cache: 64, chunked_prefill: chunked, token_budget: 32,
                            ..Default::default() };
    let mut s = Scheduler::new(&mut pool, EncoderHost::new(64, 0), &cfg, None).unwrap();
    let reqs: Vec<_> = (0..10).map(|i| draw(i, &[1, 2, 3])).collect();
    drive(&mut s, &reqs, 3);
    let submitted: usize = reqs.iter().map(|r| r.0.len()).sum();
    let st = s.stats().unwrap();
    assert_eq!((st.encoder_runs, st.encoder_evictions), (3, 0));
    assert!(st.encoder_lookups >= submitted as u64 && st.encoder_hits >= submitted as u64 - 3);
    let h = s.host_mut();
    assert!(h.checked >= submitted, "every input was read by some row");
    assert!(h.encodes == 3 && h.encodes < submitted, "repeated cache ids hit the encoder cache");
    assert_eq!(h.frees, 0);
    assert_eq!(h.cache.keys().copied().collect::<HashSet<u64>>(),
               [1, 2, 3].iter().copied().collect::<HashSet<u64>>());
}

#[test]
fn rows_read_encoded_inputs_and_repeated_ids_hit_whole_prompts() {
    rows_read_encoded_inputs_and_repeated_ids_hit(0);
}

#[test]
fn rows_read_encoded_inputs_and_repeated_ids_hit_chunked() {
    rows_read_encoded_inputs_and_repeated_ids_hit(1);
}

#[test]
fn small_cache_and_budget_evict_and_stay_within_bounds() {
    // 6 ids of 3..8 tokens in a 16-token cache, at most 8 encoder work per
    // step, chunks of 8 tokens: ids are evicted (encoder_free) and encoded
    // again, and no step exceeds the budget
    let mut pool = Pool::new(&PoolConfig { device_blocks: 256, block_tokens: 4, ..Default::default() })
        .unwrap();
    let cfg = SchedConfig { encoder_cache: 16, encoder_budget: 8, chunked_prefill: 1,
                            token_budget: 8, max_running: 4, ..Default::default() };
    let mut s = Scheduler::new(&mut pool, EncoderHost::new(16, 8), &cfg, None).unwrap();
    let reqs: Vec<_> = (0..12).map(|i| draw(i, &[1, 2, 3, 4, 5, 6])).collect();
    drive(&mut s, &reqs, 3);
    let submitted: usize = reqs.iter().map(|r| r.0.len()).sum();
    let st = s.stats().unwrap();
    let h = s.host_mut();
    assert_eq!((st.encoder_runs, st.encoder_evictions), (h.encodes as u64, h.frees as u64));
    assert!(h.checked >= submitted);
    assert!(h.frees > 0, "a 16-token cache evicted");
    assert!(h.encodes > 6, "evicted ids were encoded again");
    assert!(h.most_cost > 0 && h.most_cost <= 8);
    assert!(h.cache.values().sum::<u32>() <= 16);
}

#[test]
fn the_prefix_cache_keys_a_span_by_its_input() {
    // one submitted prompt (placeholders at [16, 24)) with image 1, image
    // 2, image 1 again: the second hits the 4 blocks before the span, the
    // third every full block but the last token's (7 of 4 tokens)
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, block_tokens: 4, pin_permille: 500,
                                           ..Default::default() }).unwrap();
    let cfg = SchedConfig { encoder_cache: 32, ..Default::default() };
    let mut s = Scheduler::new(&mut pool, EncoderHost::new(32, 0), &cfg, None).unwrap();
    let mut prompt: Vec<i32> = (300..316).collect();
    prompt.extend_from_slice(&[PLACEHOLDER; 8]);
    prompt.extend(324..332);
    let mut hits = Vec::new();
    for &id in &[1u64, 2, 1] {
        let inputs = [EncoderInput::new(id, 16, 8, 0)];
        let rid = s.submit(&Request { inputs: &inputs, ..Request::new(&prompt, 2) }).unwrap();
        s.host_mut().inputs.insert(rid, inputs.to_vec());
        s.run().unwrap();
        hits.push(s.stats().unwrap().hit_tokens);
    }
    assert_eq!(vec![hits[0], hits[1] - hits[0], hits[2] - hits[1]], vec![0, 16, 28]);
    assert_eq!(s.host_mut().encodes, 2, "image 1's outputs were still cached");
    assert_eq!(s.check().unwrap(), 0);
}

#[test]
fn without_encoder_cache_inputs_are_refused_and_batches_carry_none() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let mut host = EncoderHost::new(0, 0);
    host.plain = true;
    let mut s = Scheduler::new(&mut pool, host, &SchedConfig::default(), None).unwrap();
    let inputs = [EncoderInput::new(5, 1, 2, 0)];
    let e = s.submit(&Request { inputs: &inputs, ..Request::new(&[1, 2, 3, 4], 2) }).unwrap_err();
    assert_eq!(e, Error::InvalidArgument);
    let text = e.to_string();
    assert!(text.contains("bkv_request.n_inputs = 1") && text.contains("encoder_cache"), "{}", text);
    assert_eq!(s.stats().unwrap().submitted, 0, "a refused request changes nothing");
    let id = s.submit(&Request::new(&[1, 2, 3], 2)).unwrap();
    s.host_mut().inputs.insert(id, Vec::new());
    s.run().unwrap();
    assert_eq!(s.host_mut().finished[&id], FinishReason::Length);
}

#[test]
fn inputs_that_could_never_pass_are_refused() {
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() }).unwrap();
    let cfg = SchedConfig { encoder_cache: 8, encoder_budget: 6, chunked_prefill: 1,
                            ..Default::default() };
    let s = Scheduler::new(&mut pool, EncoderHost::new(8, 6), &cfg, None).unwrap();
    let prompt: Vec<i32> = (1..21).collect();
    let refused = |inputs: &[EncoderInput], kind: Error, text: &str| {
        let e = s.submit(&Request { inputs, ..Request::new(&prompt, 2) }).unwrap_err();
        assert_eq!(e, kind, "{:?}", inputs);
        assert!(e.to_string().contains(text), "{}", e);
    };
    // longer than the cache
    refused(&[EncoderInput::new(5, 2, 9, 1)], Error::TooBig, "bkv_request.inputs[0].token_len = 9");
    // costlier than the budget; cost 0 = token_len 7 > 6
    refused(&[EncoderInput::new(5, 2, 4, 7)], Error::TooBig, "encoder_budget");
    refused(&[EncoderInput::new(5, 2, 7, 0)], Error::TooBig, "encoder_budget");
    // spans out of order, past the prompt, cache_id 0
    refused(&[EncoderInput::new(5, 8, 2, 0), EncoderInput::new(6, 2, 2, 0)], Error::InvalidArgument,
            "bkv_request.inputs[1]");
    refused(&[EncoderInput::new(5, 19, 2, 0)], Error::InvalidArgument, "bkv_request.inputs[0]");
    refused(&[EncoderInput::new(0, 2, 2, 0)], Error::InvalidArgument, "bkv_request.inputs[0]");
    // too many
    let many: Vec<EncoderInput> = (0..sys::BKV_MAX_ENCODER_INPUTS + 1)
        .map(|k| EncoderInput::new(1, 2 * k, 1, 0)).collect();
    let long: Vec<i32> = (1..200).collect();
    let e = s.submit(&Request { inputs: &many, ..Request::new(&long, 2) }).unwrap_err();
    assert_eq!(e, Error::InvalidArgument);
    assert!(e.to_string().contains("n_inputs = 65"), "{}", e);
    assert_eq!(s.stats().unwrap().submitted, 0);
}

#[test]
fn encoder_token_lies_below_every_other_id() {
    let mut t = Vec::new();
    for &c in &[1u64, 2, u64::MAX] {
        for i in 0..16 {
            t.push(encoder_token(c, i));
        }
    }
    assert!(t.iter().all(|&x| x <= -(1 << 23)));
    let deepest = token_pending_at(OVERLAP_MAX_DEPTH, sys::BKV_TOKEN_PENDING_ROWS as u32 - 1);
    assert!(t.iter().all(|&x| x < deepest && !token_is_pending(x)),
            "below BKV_TOKEN_FAIL and every overlap placeholder, at every depth");
    assert_eq!(encoder_token(7, 3), encoder_token(7, 3), "a function of (cache_id, i)");
    assert_eq!(t.iter().collect::<HashSet<_>>().len(), t.len());
}
