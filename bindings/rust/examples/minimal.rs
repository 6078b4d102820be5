//! examples/minimal.c in Rust: a fake host whose "model" answers each row
//! with (last input token + 1); one pool, one scheduler with a mixed-batch
//! forward, three requests (2, 4 and 6 new tokens, stop token 110), step until
//! every request has ended.
//!
//!     cargo run --example minimal
use batchkv::{Batch, FinishReason, Host, HostFailed, Pool, PoolConfig, Request, SchedConfig,
              Scheduler};

struct PlusOne {
    finished: u32,
}

impl Host for PlusOne {
    fn forward(&mut self, b: &Batch<'_>, next: &mut [i32]) -> Result<(), HostFailed> {
        // a real host performs b.swap_out(), b.swap_in(), b.copies() first
        let (tok, qo, sample) = (b.token_ids(), b.qo_indptr(), b.row_sample());
        for r in 0..b.n_rows() {
            if sample[r] != 0 {
                next[r] = tok[qo[r + 1] as usize - 1] + 1;
            }
        }
        Ok(())
    }
    fn on_token(&mut self, req: u64, _branch: u32, token: i32, _user: usize) {
        println!("request {}: token {}", req, token);
    }
    fn on_finish(&mut self, req: u64, why: FinishReason, _user: usize) {
        self.finished += 1;
        let why = match why {
            FinishReason::Stop => "stop token",
            FinishReason::Length => "length",
            _ => "other",
        };
        println!("request {}: finished ({})", req, why);
    }
}

fn main() {
    let prompt = [100, 101, 102, 103, 104];
    let stop = [110];
    let mut pool = Pool::new(&PoolConfig { device_blocks: 64, ..Default::default() })
        .expect("bkv_pool_create");
    let mut sched = Scheduler::new(&mut pool, PlusOne { finished: 0 }, &SchedConfig::default(),
                                   None).expect("bkv_sched_create");
    for i in 0..3 {
        let req = Request { stop_tokens: &stop, ..Request::new(&prompt, 2 + 2 * i) };
        sched.submit(&req).expect("bkv_submit");
    }
    while sched.pending() > 0 {
        if let Err(e) = sched.step() {
            eprintln!("bkv_step: {}", e);
            std::process::exit(1);
        }
    }
    let finished = sched.host_mut().finished;
    std::process::exit(if finished == 3 { 0 } else { 1 });
}
