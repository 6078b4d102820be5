#!/bin/sh
# A recurrent-state hybrid (Qwen3-Next-like: 12 full-attention layers and
# 36 recurrent ones, a checkpoint every 512 tokens; each state unit is 101
# frames) on the first LIMIT requests of the Mooncake conversation trace,
# bkv-sim as bench/groups_hits.sh runs it (chunked prefill, budget 512, H100
# roofline, 64 slots): the state units in a fixed arena against units
# sharing every frame with attention (bkv_pool_config.state_share), in the
# same device memory (issue 16 point 1). Per run: prefix hit rate, the hits
# that read a checkpoint, the checkpoints held at the end, preemptions,
# finished and failed requests, output throughput.
#
#   sh bench/state_share.sh BUILD ../shared/data/traces [LIMIT]
#
# (docs/benchmarks.md, "KV groups".)
B=${1:-build}
T=${2:-../shared/data/traces}
N=${3:-1500}
S="$B/examples/bkv-sim"
run() { # label frames state-units [--state-share]
	label=$1 frames=$2 units=$3
	shift 3
	"$S" --trace "mooncake:$T/mooncake_conversation_trace.jsonl" --limit "$N" \
		--kv-blocks "$frames" --state-units "$units" "$@" \
		--cost roofline:h100-llama3-8b --slots 64 --policy chunked --budget 512 \
		--shape custom:full:12x2048,state512:36x1097728 --quiet --json 2>/dev/null |
		/usr/bin/python3 -c '
import json, sys
r = [x for x in json.load(sys.stdin) if x["label"].startswith("chunked")][0]
print("%-34s %8s %7.4f %9d %8d %6d %5d/%-5d %9.1f" % (sys.argv[1], sys.argv[2],
      r["prefix_hit_rate"], r.get("state_hits", 0), r.get("state_ckpt_bytes", 0) // (1 << 20),
      r["preemptions"], r["finished"], r["errors"], r["throughput_tok_s"]))' "$label" "$frames"
}
printf '%-34s %8s %7s %9s %8s %6s %11s %9s\n' run frames hit% ckpt_hits ckpt_MiB preempt fin/err tok/s
for pair in "400000 192" "400000 1536" "60000 192" "20000 192"; do
	set -- $pair
	f=$(($1 + $2 * 101))
	run "fixed arena, $2 units" $f $2
	run "shared, floor 0" $f 0 --state-share
	run "shared, floor $(($2 / 2))" $f $(($2 / 2)) --state-share
	run "shared, floor $2" $f $2 --state-share
done
