#!/bin/sh
# Every combination of the scheduler's serving features on one workload, in
# bkv-sim: batch layout {flat, persistent} x KV groups {none, full + window
# 128, full + recurrent STATE} x speculation {off, k = 4} x {synchronous,
# overlapped steps} x host tier {none, swap + host cache}: 48 runs, one
# markdown table (docs/benchmarks.md, "Feature combinations").
#
#   sh bench/combinations.sh BUILD
#
# The workload: 16 multi-turn sessions of 4 turns (first contexts
# 1,024..2,048 tokens, each turn re-reads its session and adds 256; 128
# output tokens), 20 requests/s, on the H100 / Llama-3-8B roofline, a mixed
# host with 1 ms of its own CPU time per step (what overlapped steps hide),
# chunked prefill (budget 2,048), 32 slots. The device holds the same
# bytes in every row: 1,024 blocks of all 32 layers without groups, 2,048
# frames of 16 layers with them (a frame is one group's block); the STATE
# shape's arena (128 units of 4 frames) comes on top. Speculation: host
# drafts, each accepted with probability 0.7. The host tier: 8,192 blocks,
# for swap and as the host cache. A combination the library refuses at
# create is printed as refused, with bkv-sim's message.
B=${1:-build}
S="$B/examples/bkv-sim"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
WL="--workload sessions --sessions 16 --turns 4 --prompt 1024..2048 --grow 256 --output 128
    --arrival uniform:20 --cost roofline:h100-llama3-8b --host mixed --policy chunked
    --budget 2048 --slots 32 --host-overhead-us 1000 --no-baseline --quiet --json"
ERR=${TMPDIR:-/tmp}/bkv-combinations.$$
trap 'rm -f "$ERR"' EXIT

echo "| layout | KV groups | spec | overlap | host tier | tok/s | p99 TTFT ms | preempt | host hits | accepted/row |"
echo "|---|---|---|---|---|---:|---:|---:|---:|---:|"
for layout in flat persistent; do
for groups in none window state; do
	case $groups in
	none) G="--kv-blocks 1024"; GN="none" ;;
	window) G="--shape custom:full:16x4096,window128:16x4096 --kv-blocks 2048"
		GN="full + window 128" ;;
	state) G="--shape custom:full:16x4096,state64:16x262144 --state-units 128 --kv-blocks 2560"
		GN="full + STATE" ;;
	esac
for spec in off 4; do
	[ $spec = off ] && SP="" || SP="--spec-k 4 --spec-accept 0.7"
for overlap in no yes; do
	[ $overlap = no ] && OV="" || OV="--overlap"
for hc in none cache; do
	[ $hc = none ] && HC="" || HC="--host-blocks 8192 --host-cache"
	# shellcheck disable=SC2086
	"$S" $WL --layout $layout $G $SP $OV $HC 2>"$ERR" |
		LABEL="| $layout | $GN | $spec | $overlap | $hc |" ERRF="$ERR" "$PY" -c '
import json, os, sys
label = os.environ["LABEL"]
text = sys.stdin.read()
try:
    r = json.loads(text)[0]
except Exception:
    err = [l for l in open(os.environ["ERRF"]).read().splitlines()
           if not l.startswith("bkv-sim: k=1, seed 0: speculation")]
    msg = err[-1] if err else "no output"
    msg = msg.split(": ", 1)[-1].replace("|", "/")
    if "refuses overlapped scheduling" in msg:
        msg = "overlap with a STATE group (bkv_sched_create: EINVAL)"
    print(f"{label} refused by the library: {msg} | | | | |")
    sys.exit(0)
acc = "-"
if r.get("spec_rows"):
    acc = "%.2f" % (r["spec_accepted"] / r["spec_rows"])
fail = " (%d errors)" % r["errors"] if r["errors"] else ""
print("%s %.0f%s | %.0f | %d | %d | %s |" % (label, r["throughput_tok_s"], fail,
      r["ttft_ms"]["p99"], r["preemptions"], r.get("host_hit_tokens", 0), acc))
'
done
done
done
done
done
