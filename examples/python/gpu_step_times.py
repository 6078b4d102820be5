#!/usr/bin/env python3
"""gpu_step_times.py - real step times of torch_host.py's Llama-shaped model on
a CUDA GPU, served through batchkv, over a grid of batch shapes; and the
roofline model's error against them.

For each shape the script drives a real Pool and Scheduler with TorchHost in
its batched mode (one projection per layer over all the batch's tokens, a
padded gather for decode rows, causal attention per prefill chunk) and times
each host call with torch.cuda.synchronize() before and after:

  decode   R requests with prompts of C tokens are prefilled, then the decode
           steps of R rows at context ~C are timed (the median of several);
  prefill  one request whose prompt of P tokens is one chunk (token_budget
           >= P), timed on fresh prompts (no prefix hits).

It writes a CSV, one line per shape:

    kind,decode_rows,decode_context,prefill_tokens,measured_us

(kind: decode or prefill; decode_context: the sum of the decode rows'
context lengths, as bkv_step_shape counts it; measured_us: the median).
bkv-sim reads it with --calib-csv FILE: the scheduler's calibrated model
learns these times before the run (each line one bkv_step_shape and its
time, as batchkv.CalibratedCost.observe(StepShape(...), measured_us) would).

Then it prices every shape with the roofline (bkv_cost_roofline through
batchkv.RooflineCost, the H100 preset's peak FLOP/s and bandwidth, this
model's parameters, KV bytes per token and attention FLOPs) and prints the
relative error per shape, its median and mean |log ratio|.

    python3 examples/python/gpu_step_times.py [--out step_times.csv] [--quick]

The default model is TinyLlama-1.1B's shape (22 layers, dim 2048, 32 query
and 4 KV heads of 64, SwiGLU 5632, vocab 32000) in bfloat16 with random
weights; the grid (15 decode shapes, 5 prefill sizes) is sized to finish well
within 8 minutes on one H100 (--quick: a 6-shape smoke run). It has not been
run on a GPU yet (none was available when it was written). Exits 2 with a
message when no CUDA device is present; --cpu-smoke runs its code path on the
CPU with the small model (the times mean nothing there).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_host  # noqa: E402
from torch_host import batchkv  # noqa: E402

DECODE_ROWS = (1, 8, 32, 64, 128)
DECODE_CONTEXT = (256, 1024, 2048)
PREFILL_TOKENS = (128, 256, 512, 1024, 2048)
BT = 16


class Timing(torch_host.TorchHost):
    """TorchHost in batched mode without its checks, recording each call."""

    def __init__(self, *a, **kw):
        super().__init__(*a, mode="batched", checks=False, **kw)
        self.call_log = []


def serve_shape(m, host, prompts, max_new, token_budget, max_running, enough=None):
    """Serve prompts until nothing is pending or enough(call_log) says so
    (the requests still open are dropped); returns the calls' records."""
    blocks = host.kv_k[0].shape[0]
    pool = batchkv.Pool(block_tokens=BT, device_blocks=blocks)
    s = batchkv.Scheduler(pool, host, max_running=max_running, token_budget=token_budget)
    for i, p in enumerate(prompts):
        s.submit(p, max_new, user=torch_host.Job(p, max_new, (), 1, i))
    host.call_log.clear()
    while s.pending and not (enough and enough(host.call_log)):
        s.step()
    s.close()
    pool.close()
    return list(host.call_log)


def decode_calls(log, rows):
    """The calls with `rows` decode rows and no prefill chunk."""
    return [c for c in log if c[0] == rows and not c[2]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="step_times.csv")
    ap.add_argument("--quick", action="store_true", help="a small grid (a smoke test)")
    ap.add_argument("--reps", type=int, default=6, help="timed decode steps / prefills per shape")
    ap.add_argument("--token-budget", dest="token_budget", type=int,
                    default=8192, help="prefill tokens per step while the decode rows fill")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check the script on the CPU: a tiny model, the quick grid; the "
                    "times mean nothing")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        return smoke(args)
    if not torch.cuda.is_available():
        print("gpu_step_times: no CUDA device (torch.cuda.is_available() is False); "
              "nothing measured. Run it on a machine with a GPU.", file=sys.stderr)
        return 2
    rows_grid, ctx_grid, pre_grid = DECODE_ROWS, DECODE_CONTEXT, PREFILL_TOKENS
    if args.quick:
        rows_grid, ctx_grid, pre_grid = (1, 16), (256,), (128, 512)
    name = torch.cuda.get_device_name(torch.device("cuda"))
    m = torch_host.Llama(vocab=32000, dim=2048, layers=22, n_heads=32, n_kv_heads=4, head_dim=64,
                         ffn=5632, max_pos=4096 + 64, device="cuda", dtype=torch.bfloat16,
                         draw_on_device=True)
    return measure(args, m, name, rows_grid, ctx_grid, pre_grid)


def smoke(args):
    torch.set_num_threads(1)
    m = torch_host.Llama(max_pos=1024)
    args.token_budget = 96  # the decode shapes fill over several steps
    return measure(args, m, "the CPU (smoke test)", (1, 4), (64,), (32, 64))


def measure(args, m, name, rows_grid, ctx_grid, pre_grid):
    t_start = time.perf_counter()
    rng = np.random.default_rng(1)
    reps = args.reps
    results = []  # (kind, decode_rows, decode_context, prefill_tokens, measured_us)

    def prompt(n):
        return [int(t) for t in rng.integers(0, m.vocab, n)]

    # warm-up: kernels, allocator
    host = Timing(m, BT, 4096)
    serve_shape(m, host, [prompt(256) for _ in range(4)], 4, 4096, 4)
    for C in ctx_grid:
        for R in rows_grid:
            # rows admitted first decode while the others prefill: enough
            # tokens that all R are still running when the last prefill ends
            budget = max(args.token_budget, C)
            max_new = -(-R * C // budget) + 2 * reps + 8
            blocks = R * ((C + max_new) // BT + 2) + 16
            host = Timing(m, BT, blocks)
            log = serve_shape(m, host, [prompt(C) for _ in range(R)], max_new, budget, R,
                              enough=lambda log: len(decode_calls(log, R)) > reps)
            dec = decode_calls(log, R)
            if not dec:
                print("  decode  rows %4d context %5d: never all running; skipped" % (R, C))
                continue
            times = [c[4] for c in dec[1:]] or [c[4] for c in dec]
            ctx = int(statistics.median([c[1] for c in dec]))
            us = statistics.median(times) * 1e6
            results.append(("decode", R, ctx, 0, us))
            print("  decode  rows %4d context %5d: %9.1f us  (%d steps)" % (R, C, us, len(times)),
                  flush=True)
            del host
            torch.cuda.empty_cache()
    for P in pre_grid:
        host = Timing(m, BT, (P // BT + 4) * 2)
        times = []
        for _ in range(reps):
            log = serve_shape(m, host, [prompt(P)], 1, max(P, 512), 1)
            pre = [c for c in log if c[2] and sum(n for n, _ in c[2]) == P]
            times += [c[4] for c in pre]
        us = statistics.median(times[1:] or times) * 1e6
        results.append(("prefill", 0, 0, P, us))
        print("  prefill tokens %5d: %9.1f us" % (P, us), flush=True)
        del host
        torch.cuda.empty_cache()

    with open(args.out, "w") as f:
        f.write("kind,decode_rows,decode_context,prefill_tokens,measured_us\n")
        for r in results:
            f.write("%s,%d,%d,%d,%.1f\n" % r)

    # the roofline's error against the measurements
    rl = batchkv.RooflineCost(batchkv.RooflinePreset.H100_SXM_LLAMA3_8B_BF16)
    if "H200" in name:
        rl.mem_bw = 4.8e12
    rl.model_bytes = float(m.params * 2)
    rl.active_params = float(m.params)
    rl.kv_bytes_per_token = float(2 * m.layers * m.n_kv_heads * m.head_dim * 2)
    rl.attn_flops_per_pair = float(4 * m.layers * m.n_heads * m.head_dim)
    rl.overhead_us = 0.0
    print("\nroofline (H100 SXM preset figures%s, this model: %.2f B parameters) against %s:" %
          (", 4.8 TB/s" if "H200" in name else "", m.params / 1e9, name))
    logs = []
    for kind, R, ctx, P, us in results:
        shape = batchkv.StepShape(kind=batchkv.CallKind.MIXED, decode_rows=R, decode_context=ctx,
                                  chunks=((P, 0),) if P else ())
        pred = rl.step_us(shape)
        logs.append(np.log(pred / us))
        print("  %-7s rows %4d context %7d prefill %5d: measured %9.1f us, roofline %9.1f us "
              "(%+.0f%%)" % (kind, R, ctx, P, us, pred, 100 * (pred / us - 1)))
    rel = [abs(np.exp(x) - 1) for x in logs]
    print("median |error| %.0f%%, mean |log ratio| %.2f over %d shapes; %s written; %.0f s" %
          (100 * statistics.median(rel), float(np.mean(np.abs(logs))), len(logs), args.out,
           time.perf_counter() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
