//! The cost of one bkv_step through the Rust bindings: bench/bench_step.c's
//! steady decode (64-token distinct prompts, block_tokens 16, nothing
//! finishes, admit_group 1, best of 8 batches) with a no-op host writing
//! next_tokens[r] = 7 + r for the sampled rows. "+on_token" also has an
//! on_token method (called once per row); "+outputs" has no on_token
//! (HAS_ON_TOKEN false), reads each step's outputs as slices
//! (Scheduler::outputs) and sums every token instead.
//!
//!     cargo run --release --example bench_step [STEPS]
use batchkv::*;
use std::time::Instant;

struct Noop<const TOKENS: bool> {
    seen: u64,
}

/// The outputs host: no on_token at all (the tokens come from outputs()).
struct NoopOutputs;

impl Host for NoopOutputs {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        for (r, &s) in b.row_sample().iter().enumerate() {
            if s != 0 {
                next[r] = 7 + r as i32;
            }
        }
        Ok(())
    }
    const HAS_ON_TOKEN: bool = false;
}

impl<const TOKENS: bool> Host for Noop<TOKENS> {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> std::result::Result<(), HostFailed> {
        for (r, &s) in b.row_sample().iter().enumerate() {
            if s != 0 {
                next[r] = 7 + r as i32;
            }
        }
        Ok(())
    }
    fn on_token(&mut self, _req: u64, _branch: u32, token: i32, _user: usize) {
        if TOKENS {
            self.seen += token as u64;
        }
    }
}

fn run<H: Host>(host: H, running: u32, steps: u32, outputs: bool) -> f64 {
    let (prompt_len, bt, warm) = (64u32, 16u32, 16u32);
    let max_new = warm + steps + 8;
    let per_req = (prompt_len + max_new + bt - 1) / bt;
    let mut pool = Pool::new(&PoolConfig { block_tokens: bt, device_blocks: running * per_req + 64,
                                           max_seqs: running + 16, ..Default::default() }).unwrap();
    let cfg = SchedConfig { max_running: running, admit_group: 1, max_wait_us: u64::MAX,
                            max_queue: running + 16, ..Default::default() };
    let mut s = Scheduler::new(&mut pool, host, &cfg, None).unwrap();
    if outputs {
        s.enable_outputs(true).unwrap();
    }
    let mut sum = 0u64;
    let mut prompt: Vec<i32> = (100..100 + prompt_len as i32).collect();
    for i in 0..running {
        prompt[0] = i as i32;
        s.submit(&Request::new(&prompt, max_new)).unwrap();
    }
    for _ in 0..warm {
        s.step().unwrap();
    }
    let mut best = f64::MAX;
    for _ in 0..8 {
        let t0 = Instant::now();
        for _ in 0..steps / 8 {
            s.step().unwrap();
            if outputs {
                sum += s.outputs().unwrap().token_ids.iter().map(|&t| t as u64).sum::<u64>();
            }
        }
        best = best.min(t0.elapsed().as_secs_f64() * 1e6 / (steps / 8) as f64);
    }
    assert_eq!(s.stats().unwrap().running, running);
    assert_eq!(s.check().unwrap(), 0);
    assert!(!outputs || sum > 0);
    best
}

fn main() {
    let steps: u32 = std::env::args().nth(1).map_or(256, |a| a.parse().unwrap());
    println!("rust, {} timed steps, us per step (best of 8 batches)", steps);
    for &running in &[32u32, 1024] {
        println!("rust forward           running {:5}: {:9.2} us/step", running,
                 run(Noop::<false> { seen: 0 }, running, steps, false));
    }
    for &running in &[32u32, 1024] {
        println!("rust forward+on_token  running {:5}: {:9.2} us/step", running,
                 run(Noop::<true> { seen: 0 }, running, steps, false));
    }
    for &running in &[32u32, 1024] {
        println!("rust forward+outputs   running {:5}: {:9.2} us/step", running,
                 run(NoopOutputs, running, steps, true));
    }
}
