"""bindings_step.py - the cost of one bkv_step through the Python bindings.

The same steady decode as bench/bench_step.c's decode table (64-token
distinct prompts, block_tokens 16, outputs long enough that nothing finishes,
admit_group 1, no waiting requests, best of 8 batches of STEPS/8 steps), with
a no-op host written the way a Python engine would: forward() reads
row_sample as a numpy view and writes next_tokens[r] = 7 + r for the sampled
rows with one vectorised assignment. Variants:

  bare               forward() only writes next_tokens[:] = 7: the cost of
                     the binding itself (callback, Batch, next_tokens view,
                     step() and its StepInfo)
  forward            the host above, no on_token (as bench_step.c)
  forward+on_token   plus an on_token method (one Python call per row)
  forward+views      forward also touches every batch array (creating all
                     13 views), as a real host reading the whole batch would
  forward+outputs    no on_token: after each step the host reads the
                     step's outputs as arrays (Scheduler(outputs=True),
                     outputs()) and copies every token and its request id
                     into its own arrays (one crossing per step)

Usage: BATCHKV_LIBRARY=build/lib/libbatchkv.so /usr/bin/python3 \
           bench/bindings_step.py [STEPS]      (PYTHONPATH=bindings/python)
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings",
                                "python"))
import numpy as np  # noqa: E402

import batchkv  # noqa: E402


class Noop:
    def forward(self, b, next_tokens):
        s = b.row_sample != 0
        next_tokens[s] = 7 + np.flatnonzero(s)


class Bare:
    def forward(self, b, next_tokens):
        next_tokens[:] = 7


class NoopTokens(Noop):
    def on_token(self, req, branch, token, user):
        pass


class NoopOutputs(Noop):
    outputs = True

    def __init__(self):
        self.tok = np.zeros(1 << 16, np.int32)
        self.req = np.zeros(1 << 16, np.uint64)

    def consume(self, o):
        n = len(o.token_ids)
        self.tok[:n] = o.token_ids
        self.req[:n] = o.token_req


class NoopViews(Noop):
    def forward(self, b, next_tokens):
        (b.token_ids, b.positions, b.qo_indptr, b.kv_indptr, b.kv_indices, b.kv_last_page_len,
         b.slot_mapping, b.row_req, b.row_branch, b.copies, b.swap_out, b.swap_in)
        return Noop.forward(self, b, next_tokens)


def run(running, steps, host):
    prompt_len, bt, warm = 64, 16, 16
    max_new = warm + steps + 8
    per_req = (prompt_len + max_new + bt - 1) // bt
    pool = batchkv.Pool(block_tokens=bt, device_blocks=running * per_req + 64,
                        max_seqs=running + 16)
    outs = getattr(host, "outputs", False)
    s = batchkv.Scheduler(pool, host, max_running=running, admit_group=1,
                          max_wait_us=2 ** 64 - 1, max_queue=running + 16, outputs=outs)
    prompt = np.arange(100, 100 + prompt_len, dtype=np.int32)
    for i in range(running):
        prompt[0] = i
        s.submit(prompt, max_new)
    for _ in range(warm):
        s.step()
    best = 1e30
    for _ in range(8):
        t0 = time.perf_counter()
        if outs:
            for _ in range(steps // 8):
                s.step()
                host.consume(s.outputs())
        else:
            for _ in range(steps // 8):
                s.step()
        best = min(best, (time.perf_counter() - t0) * 1e6 / (steps // 8))
    st = s.stats()
    assert st.running == running and s.pending == running and s.check() == 0
    s.close()
    pool.close()
    return best


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    print("python %s, numpy %s, %d timed steps, us per step (best of 8 batches)"
          % (sys.version.split()[0], np.__version__, steps))
    for name, host in (("bare", Bare), ("forward", Noop), ("forward+on_token", NoopTokens),
                       ("forward+outputs", NoopOutputs), ("forward+views", NoopViews)):
        for running in (32, 1024):
            print("python %-17s running %5d: %9.2f us/step" % (name, running,
                                                               run(running, steps, host())))


if __name__ == "__main__":
    main()
