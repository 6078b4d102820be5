//! VllmEncoder: two pools get the same calls; one is drained with
//! `Pool::events`, the other through the encoder, and each batch (decoded by
//! the small msgpack reader below) must carry the pool's own events.
use batchkv::*;
use std::panic::{self, AssertUnwindSafe};

const BT: u32 = 4;

#[derive(Debug, Clone, PartialEq)]
enum V {
    Nil,
    Bool(bool),
    Int(i128),
    F64(f64),
    Str(String),
    Bin(Vec<u8>),
    Arr(Vec<V>),
    Map(Vec<(V, V)>),
}

/// A minimal msgpack reader (the forms msgspec writes).
fn read(b: &[u8], i: &mut usize) -> V {
    fn be(b: &[u8], i: &mut usize, n: usize) -> u64 {
        let mut v = 0u64;
        for k in 0..n {
            v = v << 8 | b[*i + k] as u64;
        }
        *i += n;
        v
    }
    let t = b[*i];
    *i += 1;
    match t {
        0x00..=0x7f => V::Int(t as i128),
        0xe0..=0xff => V::Int(t as i8 as i128),
        0xc0 => V::Nil,
        0xc2 => V::Bool(false),
        0xc3 => V::Bool(true),
        0xcc => V::Int(be(b, i, 1) as i128),
        0xcd => V::Int(be(b, i, 2) as i128),
        0xce => V::Int(be(b, i, 4) as i128),
        0xcf => V::Int(be(b, i, 8) as i128),
        0xd0 => V::Int(be(b, i, 1) as u8 as i8 as i128),
        0xd1 => V::Int(be(b, i, 2) as u16 as i16 as i128),
        0xd2 => V::Int(be(b, i, 4) as u32 as i32 as i128),
        0xd3 => V::Int(be(b, i, 8) as i64 as i128),
        0xcb => V::F64(f64::from_bits(be(b, i, 8))),
        0xa0..=0xbf | 0xd9 | 0xda | 0xdb | 0xc4 | 0xc5 | 0xc6 => {
            let n = match t {
                0xa0..=0xbf => (t & 0x1f) as usize,
                0xd9 | 0xc4 => be(b, i, 1) as usize,
                0xda | 0xc5 => be(b, i, 2) as usize,
                _ => be(b, i, 4) as usize,
            };
            let raw = b[*i..*i + n].to_vec();
            *i += n;
            if matches!(t, 0xc4..=0xc6) {
                V::Bin(raw)
            } else {
                V::Str(String::from_utf8(raw).unwrap())
            }
        }
        0x90..=0x9f | 0xdc | 0xdd => {
            let n = match t {
                0xdc => be(b, i, 2) as usize,
                0xdd => be(b, i, 4) as usize,
                _ => (t & 0x0f) as usize,
            };
            V::Arr((0..n).map(|_| read(b, i)).collect())
        }
        0x80..=0x8f | 0xde | 0xdf => {
            let n = match t {
                0xde => be(b, i, 2) as usize,
                0xdf => be(b, i, 4) as usize,
                _ => (t & 0x0f) as usize,
            };
            V::Map((0..n).map(|_| (read(b, i), read(b, i))).collect())
        }
        _ => panic!("msgpack byte {:#x} not expected", t),
    }
}

fn decode(b: &[u8]) -> V {
    let mut i = 0;
    let v = read(b, &mut i);
    assert_eq!(i, b.len(), "trailing bytes");
    v
}

fn ints(v: &V) -> Vec<u64> {
    match v {
        V::Arr(a) => a.iter().map(|x| match x {
            V::Int(n) => *n as u64,
            _ => panic!("not an int: {:?}", x),
        }).collect(),
        _ => panic!("not an array: {:?}", v),
    }
}

fn pool() -> Pool {
    Pool::new(&PoolConfig { device_blocks: 16, block_tokens: BT, event_capacity: 256,
                            ..Default::default() }).unwrap()
}

fn run(p: &mut Pool, key: u64, base: i32, n: i32) {
    let s = if key != 0 { p.open_keyed(key).unwrap() } else { p.open().unwrap() };
    let toks: Vec<i32> = (base..base + n).collect();
    p.append(s, &toks).unwrap();
    p.close_seq(s).unwrap();
}

fn phase(p: &mut Pool, i: usize) {
    match i {
        0 => run(p, 0, 100, 32), // 8 blocks, cached
        1 => run(p, 0, 500, 40), // 10 blocks: evicts 2
        2 => run(p, 7, 100, 8),  // keyed: evicts 2 more
        _ => p.reset_cache().unwrap(),
    }
}

#[test]
fn native_hashes_replay_the_pools_own_events() {
    let (mut a, mut b) = (pool(), pool());
    let cfg = VllmConfig { wire: VllmWire::Array, hash: VllmHash::Native, data_parallel_rank: 2,
                           ..Default::default() };
    let mut enc = VllmEncoder::with_key_name(&b, &cfg, |k| Some(format!("adapter-{}", k)))
        .unwrap();
    assert!(enc.encode(&mut b, 0.0).unwrap().is_empty());
    let mut totals = [0usize; 3];
    for i in 0..4 {
        phase(&mut a, i);
        phase(&mut b, i);
        let mine = a.events(1024);
        let ts = 10.0 + i as f64;
        let batch = decode(enc.encode(&mut b, ts).unwrap());
        let parts = match batch {
            V::Arr(p) => p,
            v => panic!("batch {:?}", v),
        };
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], V::F64(ts));
        assert_eq!(parts[2], V::Int(2));
        let events = match &parts[1] {
            V::Arr(e) => e.clone(),
            v => panic!("events {:?}", v),
        };
        assert_eq!(events.len() as u32, enc.last_event_count());
        let (mut stored, mut removed, mut cleared) = (Vec::new(), Vec::new(), 0);
        for e in &events {
            let f = match e {
                V::Arr(f) => f,
                v => panic!("event {:?}", v),
            };
            match &f[0] {
                V::Str(s) if s == "BlockStored" => {
                    assert_eq!(f.len(), 8);
                    let hs = ints(&f[1]);
                    assert_eq!(ints(&f[3]).len(), BT as usize * hs.len());
                    assert_eq!(f[4], V::Int(BT as i128));
                    assert_eq!(f[6], V::Str("GPU".into()));
                    let key = mine.iter().find(|m| m.hash == hs[0]).unwrap().key;
                    if key == 0 {
                        assert_eq!((&f[5], &f[7]), (&V::Nil, &V::Nil));
                    } else {
                        assert_eq!(f[5], V::Int(key as i128));
                        assert_eq!(f[7], V::Str(format!("adapter-{}", key)));
                    }
                    stored.extend(hs);
                }
                V::Str(s) if s == "BlockRemoved" => removed.extend(ints(&f[1])),
                V::Str(s) if s == "AllBlocksCleared" => cleared += 1,
                v => panic!("tag {:?}", v),
            }
        }
        let want = |k: i32| -> Vec<u64> {
            mine.iter().filter(|e| e.kind == k as u32).map(|e| e.hash).collect()
        };
        assert_eq!(stored, want(sys::BKV_EVENT_STORED));
        assert_eq!(removed, want(sys::BKV_EVENT_REMOVED));
        assert_eq!(cleared, want(sys::BKV_EVENT_CLEARED).len());
        totals[0] += stored.len();
        totals[1] += removed.len();
        totals[2] += cleared;
    }
    assert_eq!(totals, [20, 4, 1]);
    assert_eq!(enc.resyncs(), 0);
}

#[test]
fn sha256_cbor_hashes_are_vllms() {
    let mut p = pool();
    let cfg = VllmConfig { wire: VllmWire::Array, hash_seed: "42".into(), ..Default::default() };
    let mut enc = VllmEncoder::new(&p, &cfg).unwrap();
    run(&mut p, 0, 100, 32);
    let toks: Vec<i32> = (100..132).collect();
    let want: Vec<u64> = vllm_block_hashes(&cfg, None, BT, &toks).unwrap().iter()
        .map(vllm_hash_int).collect();
    assert_eq!(want.len(), 8);
    let got = match decode(enc.encode(&mut p, 1.0).unwrap()) {
        V::Arr(parts) => match &parts[1] {
            V::Arr(evs) => evs.iter().flat_map(|e| match e {
                V::Arr(f) => ints(&f[1]),
                v => panic!("{:?}", v),
            }).collect::<Vec<u64>>(),
            v => panic!("{:?}", v),
        },
        v => panic!("{:?}", v),
    };
    assert_eq!(got, want);
}

#[test]
fn an_unnamed_key_is_the_first_blocks_cache_salt() {
    let mut p = pool();
    let cfg = VllmConfig { wire: VllmWire::Array, hash_seed: "42".into(), ..Default::default() };
    let mut enc = VllmEncoder::new(&p, &cfg).unwrap();
    run(&mut p, 0, 100, 16);
    run(&mut p, 5, 100, 16); // the same tokens under key 5, which has no name
    let toks: Vec<i32> = (100..116).collect();
    let ints_of = |d: Vec<[u8; VLLM_DIGEST_BYTES]>| d.iter().map(vllm_hash_int).collect::<Vec<u64>>();
    let mut want = ints_of(vllm_block_hashes(&cfg, None, BT, &toks).unwrap());
    want.extend(ints_of(vllm_block_hashes_salted(&cfg, None, Some("5"), BT, &toks).unwrap()));
    let got = match decode(enc.encode(&mut p, 1.0).unwrap()) {
        V::Arr(parts) => match &parts[1] {
            V::Arr(evs) => evs.iter().flat_map(|e| match e {
                V::Arr(f) => ints(&f[1]),
                v => panic!("{:?}", v),
            }).collect::<Vec<u64>>(),
            v => panic!("{:?}", v),
        },
        v => panic!("{:?}", v),
    };
    assert_eq!(got, want);
    assert_eq!(want.len(), 8);
    assert!(want[..4].iter().all(|h| !want[4..].contains(h)));
}

#[test]
fn map_layout_and_defaults() {
    let d = VllmConfig::default();
    assert_eq!((d.wire, d.hash, d.int_hashes, d.hash_seed.as_str(), d.medium.as_deref()),
               (VllmWire::Map, VllmHash::Sha256Cbor, true, "0", Some("GPU")));
    assert_eq!((d.data_parallel_rank, d.group_idx, d.spec_kind.clone(), d.sliding_window,
                d.extra_keys), (-1, -1, None, 0, false));
    let mut p = pool();
    let mut enc = VllmEncoder::new(&p, &d).unwrap();
    run(&mut p, 0, 1, 8);
    match decode(enc.encode(&mut p, 3.5).unwrap()) {
        V::Map(kv) => {
            assert_eq!(kv[0], (V::Str("ts".into()), V::F64(3.5)));
            assert_eq!(kv[1].0, V::Str("events".into()));
            assert_eq!(kv.len(), 2); // data_parallel_rank omitted
        }
        v => panic!("{:?}", v),
    }
    assert_eq!(enc.last_event_count(), 1); // one chain: one BlockStored
}

#[test]
fn errors() {
    let no_events = Pool::new(&PoolConfig { device_blocks: 8, ..Default::default() }).unwrap();
    assert_eq!(VllmEncoder::new(&no_events, &VllmConfig::default()).err(),
               Some(Error::InvalidArgument));
    let (mut p, mut other) = (pool(), pool());
    let long = VllmConfig { hash_seed: "x".repeat(256), ..Default::default() };
    assert_eq!(VllmEncoder::new(&p, &long).err(), Some(Error::InvalidArgument));
    let nul = VllmConfig { medium: Some("G\0PU".into()), ..Default::default() };
    assert_eq!(VllmEncoder::new(&p, &nul).err(), Some(Error::InvalidArgument));
    let mut enc = VllmEncoder::new(&p, &VllmConfig::default()).unwrap();
    assert_eq!(enc.encode(&mut other, 0.0).err(), Some(Error::InvalidArgument));
    assert!(enc.encode(&mut p, 0.0).unwrap().is_empty());
    let native = VllmConfig { hash: VllmHash::Native, ..Default::default() };
    assert_eq!(vllm_block_hashes(&native, None, 4, &[1, 2, 3, 4]).err(),
               Some(Error::InvalidArgument));
    assert!(vllm_block_hashes(&VllmConfig::default(), Some("a"), 4, &[1, 2, 3]).unwrap()
        .is_empty());
    let mut d = [0u8; VLLM_DIGEST_BYTES];
    d[31] = 1;
    d[24] = 0x80;
    assert_eq!(vllm_hash_int(&d), 0x8000_0000_0000_0001);
}

#[test]
fn key_name_failures() {
    let mut p = pool();
    let mut enc = VllmEncoder::with_key_name(&p, &VllmConfig::default(), |_| Some("a\0b".into()))
        .unwrap();
    run(&mut p, 5, 1, 8);
    assert_eq!(enc.encode(&mut p, 0.0).err(), Some(Error::InvalidArgument));
    drop(enc);
    let mut q = pool();
    let mut enc = VllmEncoder::with_key_name(&q, &VllmConfig::default(), |k| {
        if k == 9 {
            panic!("no name for 9")
        }
        None
    }).unwrap();
    run(&mut q, 9, 1, 8);
    let r = panic::catch_unwind(AssertUnwindSafe(|| enc.encode(&mut q, 0.0).map(|b| b.len())));
    assert!(r.is_err(), "the panic is resumed after the C call");
    run(&mut q, 0, 50, 8); // unkeyed: the closure is not called
    assert!(!enc.encode(&mut q, 0.0).unwrap().is_empty());
}

struct Echo;
impl Host for Echo {
    fn forward(&mut self, _: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        for t in next.iter_mut() {
            *t = 1;
        }
        Ok(())
    }
}

#[test]
fn scheduler_vllm_encode_between_steps() {
    let mut p = Pool::new(&PoolConfig { device_blocks: 32, event_capacity: 64,
                                        ..Default::default() }).unwrap();
    let mut enc = VllmEncoder::new(&p, &VllmConfig::default()).unwrap();
    let mut stranger = VllmEncoder::new(&pool(), &VllmConfig::default()).unwrap();
    let s = Scheduler::new(&mut p, Echo, &SchedConfig::default(), None).unwrap();
    let prompt: Vec<i32> = (10..30).collect();
    s.submit(&Request::new(&prompt, 2)).unwrap();
    s.run().unwrap();
    assert!(!s.vllm_encode(&mut enc, 1.0).unwrap().is_empty());
    assert_eq!(s.vllm_encode(&mut stranger, 1.0).err(), Some(Error::InvalidArgument));
}
