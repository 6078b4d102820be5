#!/usr/bin/env python3
"""fidelity_calib.py - an engine calibration for bkv-sim --fidelity
(docs/benchmarks.md, "Fidelity"), measured on runs held out from the ones it
is judged on.

DistServe's cost fit prices vLLM's forward pass alone. A real vLLM v0 engine
also spends time per iteration and per sequence outside the forward
(scheduling, sampling, detokenising, streaming each token through the API
server), and its prefills ran faster than the fit says. bkv-sim expresses
that with three numbers (host.c, "Engine overhead"):

    --call-overhead-us C   per host call
    --row-overhead-us R    per row of a call
    --prefill-scale S      on the fit's price of prefill work

This script fits (C, R, S) by running bkv-sim on training runs and
minimising the squared log errors of the mean and p90 of TTFT and TPOT
(Nelder-Mead, from C = 2 ms, R = 0.1 ms, S = 1; deterministic), then
judges each run with parameters fitted without it:

  profile  fitted on vllm-100-1 alone (the lowest rate: the closest the
           data has to a profiling run) and applied to every run; the
           100-1 row is in-sample.
  loro     leave one run out over the five runs below the knee: each of
           them judged with parameters fitted on the other four; the runs
           above the knee with parameters fitted on all five.
  session  as loro, but training only on runs of the same measurement
           session (runs whose absolute issue times lie within 30 minutes of
           one another: 100-2 and 200-2 were measured 77 minutes after the
           other six). A grouping chosen after looking at the data.

No run is ever judged with parameters fitted on itself (except the profile
row named above); nothing of the measured answer is written into bkv-sim.

    python3 examples/sim/fidelity_calib.py BKV_SIM CSV [profile|loro|session|all]

BKV_SIM is the bkv-sim binary, CSV DistServe's measurements
(../shared/data/traces/distserve_vllm_opt13b_sharegpt_groundtruth.csv).
Every run is the fidelity command of docs/benchmarks.md (whose vllm-v0
preset runs vLLM v0's prefill-first iterations) plus the calibration's
options. Standard library only.
"""
import csv
import math
import subprocess
import sys

BASE = ["--fidelity", "--cost", "distserve", "--slots", "256", "--kv-blocks", "3800",
        "--quiet"]
BELOW = ["vllm-100-1", "vllm-100-2", "vllm-150-1.5", "vllm-200-2", "vllm-250-2.5"]
KEYS = ("ttft", "ttft90", "tpot", "tpot90")
SESSION_GAP_S = 1800.0


def knobs(theta):
    """bkv-sim's options for theta = (C ms, R ms, S), as passed"""
    c, r, s = theta
    return ["--call-overhead-us", "%.3f" % (c * 1000.0), "--row-overhead-us",
            "%.3f" % (r * 1000.0), "--prefill-scale", "%.6f" % s]


def simulate(binary, path, theta):
    """bkv-sim --fidelity with theta: {run: {key: (meas, sim)}}"""
    out = subprocess.run([binary, "--trace", "distserve:" + path] + BASE + knobs(theta),
                         check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        f = line.split()
        if not f or not f[0].startswith("vllm-"):
            continue
        v = [float(x.rstrip("%")) for x in f[2:]]
        # (measured, simulated, bkv-sim's error in %)
        res[f[0]] = {"ttft": tuple(v[0:3]), "ttft90": tuple(v[3:6]),
                     "tpot": tuple(v[6:9]), "tpot90": tuple(v[9:12])}
    return res


def clamp(x):
    """the search's point as parameters (C, R >= 0, S > 0), rounded to what
    bkv-sim is given"""
    return (round(abs(x[0]), 6), round(abs(x[1]), 6), round(max(abs(x[2]), 1e-3), 6))


def cached(binary, path, theta, cache):
    """simulate(), each theta run once"""
    if theta not in cache:
        cache[theta] = simulate(binary, path, theta)
    return cache[theta]


def loss(binary, path, train, x, cache):
    res = cached(binary, path, clamp(x), cache)
    return sum(math.log(res[n][k][1] / res[n][k][0]) ** 2 for n in train for k in KEYS)


def nelder_mead(f, x0, step, iters=150):
    n = len(x0)
    pts = [list(x0)] + [[x0[j] + (step[j] if j == i else 0.0) for j in range(n)]
                        for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda k: vals[k])
        pts, vals = [pts[k] for k in order], [vals[k] for k in order]
        cen = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        xr = [2 * cen[j] - pts[-1][j] for j in range(n)]
        fr = f(xr)
        if fr < vals[0]:
            xe = [3 * cen[j] - 2 * pts[-1][j] for j in range(n)]
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = [(cen[j] + pts[-1][j]) / 2 for j in range(n)]
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                for k in range(1, n + 1):
                    pts[k] = [(pts[0][j] + pts[k][j]) / 2 for j in range(n)]
                    vals[k] = f(pts[k])
    best = min(range(n + 1), key=lambda k: vals[k])
    return clamp(pts[best])


def fit(binary, path, train, cache):
    return nelder_mead(lambda x: loss(binary, path, train, x, cache), [2.0, 0.1, 1.0],
                       [2.0, 0.1, 0.1])


def sessions(path):
    """run -> session number: runs ordered by their first issue time, a new
    session after a gap of more than SESSION_GAP_S since the last completion"""
    span = {}
    for row in csv.DictReader(open(path)):
        a, c = float(row["issue_time_abs_s"]), float(row["complete_time_abs_s"])
        lo, hi = span.get(row["run"], (a, c))
        span[row["run"]] = (min(lo, a), max(hi, c))
    out, n, end = {}, 0, None
    for name, (lo, hi) in sorted(span.items(), key=lambda kv: kv[1][0]):
        if end is not None and lo - end > SESSION_GAP_S:
            n += 1
        out[name] = n
        end = hi if end is None else max(end, hi)
    return out


def report(title, rows):
    """per run: the parameters it was judged with, what they were fitted
    on, and the errors (simulated / measured - 1) of the mean and p90 of
    TTFT and TPOT; then each parameter set as bkv-sim options"""
    print(title)
    print("%-13s %5s %5s %5s  %-26s %7s %7s %7s %7s" %
          ("run", "C ms", "R ms", "S", "fitted on", "ttft", "p90", "tpot", "p90"))
    worst, sets = 0.0, []
    for name, theta, train, m in rows:
        e = [m[k][2] for k in KEYS]
        if name in BELOW:
            worst = max(worst, abs(e[0]), abs(e[2]))
        if theta not in sets:
            sets.append(theta)
        print("%-13s %5.2f %5.3f %5.3f  %-26s %+6.1f%% %+6.1f%% %+6.1f%% %+6.1f%%" %
              ((name,) + theta + (",".join(t.replace("vllm-", "") for t in train),) + tuple(e)))
    print("worst mean error below the knee (TTFT or TPOT): %.1f%%" % worst)
    for theta in sets:
        print("  " + " ".join(knobs(theta)))
    print()
    sys.stdout.flush()


def main(binary, path, which):
    cache = {}
    every = list(cached(binary, path, (0.0, 0.0, 1.0), cache))
    if which in ("profile", "all"):
        theta = fit(binary, path, ["vllm-100-1"], cache)
        res = cached(binary, path, theta, cache)
        report("profile: fitted on vllm-100-1 alone (its own row in-sample)",
               [(n, theta, ["vllm-100-1"], res[n]) for n in every])
    groups = {}
    if which in ("loro", "all"):
        groups["loro: each run below the knee fitted on the other four"] = \
            {n: 0 for n in every}
    if which in ("session", "all"):
        groups["session: fitted on the other runs below the knee of its session"] = \
            sessions(path)
    for title, sess in groups.items():
        rows = []
        for name in every:
            train = [t for t in BELOW if t != name and sess[t] == sess[name]]
            if not train:
                continue
            theta = fit(binary, path, train, cache)
            rows.append((name, theta, train, cached(binary, path, theta, cache)[name]))
        report(title, rows)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "all")
