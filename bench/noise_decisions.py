#!/usr/bin/env python3
"""noise_decisions.py - the automatic policies' decisions on a noisy clock.

For the goodput table's four workloads (docs/benchmarks.md, "Goodput"), each
at about 0.95x chunked auto's goodput there, runs every automatic policy
(split-host `auto`, `chunked auto`) and the fixed defaults (`k=1`, the
scheduler's default; `chunked b=512`) with an exact clock, then with
`--noise SIGMA,P,X` for SEEDS noise seeds: the scheduler then gets a
calibrated model over the host's model and learns from the noisy times
(`--noise-exact`: the exact model on the same noisy clock, to separate the
clock's own cost from the decisions'). Prints, per workload and policy,
throughput and p99 TTFT with the exact clock and the noisy runs' range over
seeds, as ratios, and how many seeds stay within 5%.

    /usr/bin/python3 bench/noise_decisions.py build/examples/bkv-sim \\
        ../shared/data/traces [SIGMA,P,X] [SEEDS]
"""
import json
import subprocess
import sys

POLICIES = [
    ("auto", ["--policy", "auto"]),
    ("chunked auto", ["--policy", "chunked", "--k", "auto", "--budget", "auto"]),
    ("k=1", ["--policy", "continuous", "--k", "1"]),
    ("chunked b=512", ["--policy", "chunked", "--k", "auto", "--budget", "512"]),
]


def workloads(traces):
    return [
        ("seed 000 shape, 340 req/s",
         ["--workload", "synthetic", "--n", "1000", "--arrival", "poisson:340",
          "--prompt", "8..64", "--output", "seed000", "--gen", "steps"]),
        ("Azure conv, 30 req/s",
         ["--trace", "azure:%s/AzureLLMInferenceTrace_conv.csv" % traces, "--limit", "2000",
          "--cost", "roofline:h100-llama3-8b", "--slots", "128", "--rate", "30"]),
        ("Mooncake, 2.5 req/s",
         ["--trace", "mooncake:%s/mooncake_conversation_trace.jsonl" % traces, "--limit", "500",
          "--kv-blocks", "200000", "--cost", "roofline:h100-llama3-8b", "--slots", "64",
          "--rate", "2.5"]),
        ("long prompts, 36 req/s",
         ["--workload", "synthetic", "--n", "1000", "--arrival", "poisson:36",
          "--prompt", "1000..2000", "--output", "16..128", "--cost", "roofline:h100-llama3-8b",
          "--slots", "64"]),
    ]


def run(sim, args):
    out = subprocess.run([sim] + args + ["--no-baseline", "--json", "--quiet"],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)[0]
    return r["throughput_tok_s"], r["ttft_ms"]["p99"]


def main():
    sim, traces = sys.argv[1], sys.argv[2]
    noise = sys.argv[3] if len(sys.argv) > 3 else "0.3,0.01,10"
    seeds = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    print("| workload | policy | exact: tok/s | exact: p99 TTFT ms | noisy/exact tok/s "
          "(min..max) | noisy/exact p99 TTFT (min..max) | seeds within 5% (tok/s, TTFT) | "
          "exact model, noisy clock: tok/s, p99 TTFT (median ratio) | noisy tok/s "
          "vs k=1, vs b=512 (min) |")
    print("|---|---|---:|---:|---|---|---|---|---|")
    for wname, wargs in workloads(traces):
        res = {}
        for pname, pargs in POLICIES:
            base = run(sim, wargs + pargs)
            noisy = [run(sim, wargs + pargs + ["--noise", noise, "--noise-seed", str(s)])
                     for s in range(1, seeds + 1)]
            exact = [run(sim, wargs + pargs + ["--noise", noise, "--noise-seed", str(s),
                                               "--noise-exact"])
                     for s in range(1, seeds + 1)]
            res[pname] = (base, noisy, exact)
        for pname, _ in POLICIES:
            base, noisy, exact = res[pname]
            tr = [n[0] / base[0] for n in noisy]
            lr = [n[1] / base[1] for n in noisy]
            ok_t = sum(abs(x - 1) <= 0.05 for x in tr)
            ok_l = sum(abs(x - 1) <= 0.05 for x in lr)
            et = sorted(e[0] / base[0] for e in exact)[seeds // 2]
            el = sorted(e[1] / base[1] for e in exact)[seeds // 2]
            vk1 = min(n[0] / k[0] for n, k in zip(noisy, res["k=1"][1]))
            vb = min(n[0] / k[0] for n, k in zip(noisy, res["chunked b=512"][1]))
            print("| %s | %s | %.0f | %.1f | %.3f..%.3f | %.2f..%.2f | %d, %d of %d | "
                  "%.3f, %.2f | %.3f, %.3f |" % (wname, pname, base[0], base[1], min(tr),
                                                 max(tr), min(lr), max(lr), ok_t, ok_l,
                                                 seeds, et, el, vk1, vb))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
