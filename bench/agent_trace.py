#!/usr/bin/env python3
"""Derive a multi-turn agent workload from Mooncake's conversation trace
(issue 22, point 4). Written to OUT in the trace's own format, so bkv-sim
reads it as mooncake:OUT; the shared trace itself is only read.

An agent session re-reads its whole context on every step and adds a little
to it: the tool's result, then a short call. So each of the first N
requests with at least MIN_BLOCKS hash blocks becomes a session of TURNS
steps; step t's prompt is the request's own hash ids (its system prompt and
context, shared with other requests exactly as in the trace) followed by t
fresh hash ids (t tool results of one 512-token block each, private to the
session), its output OUT_TOKENS tokens, and it arrives THINK_S seconds after
step t-1 (open loop, from the request's own timestamp). Prints the derived
trace's requests, prompt tokens and working set (distinct 512-token blocks,
and in 16-token blocks).

  agent_trace.py TRACE OUT [N [TURNS [THINK_S]]]     (defaults 300, 8, 3)
"""
import json
import sys

MIN_BLOCKS = 4
OUT_TOKENS = 96


def main():
    src, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    turns = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    think = float(sys.argv[5]) if len(sys.argv) > 5 else 3.0
    reqs, top = [], 0
    with open(src) as f:
        for line in f:
            r = json.loads(line)
            top = max([top] + r["hash_ids"])
            if len(r["hash_ids"]) >= MIN_BLOCKS and len(reqs) < n:
                reqs.append(r)
    fresh = top + 1
    rows = []
    for r in reqs:
        ids = list(r["hash_ids"])
        for t in range(1, turns + 1):
            ids.append(fresh)
            fresh += 1
            rows.append({"timestamp": int(r["timestamp"] + 1000 * think * (t - 1)),
                         "input_length": 512 * len(ids), "output_length": OUT_TOKENS,
                         "hash_ids": list(ids)})
    rows.sort(key=lambda x: x["timestamp"])
    distinct = set()
    with open(out, "w") as f:
        for x in rows:
            f.write(json.dumps(x) + "\n")
            distinct.update(x["hash_ids"])
    print("requests %d prompt_tokens %d working_set %d x 512 = %d blocks of 16"
          % (len(rows), sum(x["input_length"] for x in rows), len(distinct), 32 * len(distinct)))


if __name__ == "__main__":
    main()
