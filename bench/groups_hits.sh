#!/bin/sh
# Prefix hits of hybrid models against the same models with every layer full
# attention (issue 16): bkv-sim on the first LIMIT requests of the Mooncake
# conversation trace, chunked prefill (budget 512) with the prefix cache,
# H100 roofline, 64 slots. Per run: the prompt tokens served by the prefix
# cache, the tokens computed, and (recurrent state) the checkpoints held at
# the end and the hits that read one.
#
#   sh bench/groups_hits.sh BUILD ../shared/data/traces [LIMIT]
#
# (docs/benchmarks.md, "KV groups".) A gpt-oss-20b frame holds 12 layers, an
# all-full one 24: "same memory" gives the hybrid twice the frames. vs_full
# compares hit tokens, which count a preempted request's re-admission hits
# on its own prefix too; vs_saved compares the prompt tokens the trace holds
# minus those computed (recomputation after a preemption counts against).
B=${1:-build}
T=${2:-../shared/data/traces}
N=${3:-1500}
S="$B/examples/bkv-sim"
# the prompt tokens of the first N requests
TOTAL=$(/usr/bin/python3 -c '
import json, sys
n = 0
with open(sys.argv[1]) as f:
    for i, l in enumerate(f):
        if i >= int(sys.argv[2]):
            break
        n += json.loads(l)["input_length"]
print(n)' "$T/mooncake_conversation_trace.jsonl" "$N")
run() { # shape kv-blocks
	"$S" --trace "mooncake:$T/mooncake_conversation_trace.jsonl" --limit "$N" --kv-blocks "$2" \
		--cost roofline:h100-llama3-8b --slots 64 --policy chunked --budget 512 \
		--shape "$1" --quiet --json 2>/dev/null |
		/usr/bin/python3 -c '
import json, sys
r = [x for x in json.load(sys.stdin) if x["label"].startswith("chunked")][0]
rate = r["prefix_hit_rate"]
prompt = r["prefill_tokens"] / (1 - rate) if rate < 1 else 0
print("%d %d %.4f %d %d %d" % (round(prompt * rate), r["prefill_tokens"], rate, r["errors"],
                               r.get("state_ckpt_bytes", 0) // (1 << 20), r.get("state_hits", 0)))'
}
row() { # label shape kv-blocks reference-hit-tokens reference-computed
	set -- "$1" "$2" "$3" "$4" "$5" $(run "$2" "$3")
	printf '%-30s %9s %11s %11s %7s %6s %9s %9s %8s %8s\n' "$1" "$3" "$6" "$7" "$8" "$9" \
		"$(/usr/bin/python3 -c "print('%.4f' % ($6 / $4 if $4 > 0 else 1))")" \
		"$(/usr/bin/python3 -c "print('%.4f' % (($TOTAL - $7) / ($TOTAL - $5) if 0 < $5 < $TOTAL else 1))")" \
		"${10}" "${11}"
	LAST=$6
	LASTC=$7
}
printf '%-30s %9s %11s %11s %7s %6s %9s %9s %8s %8s\n' run kv_blocks hit_tokens computed hit% \
	errors vs_full vs_saved ckpt_MiB ckpt_hits
for pair in "1500000 3000000 ample" "30000 60000 same-memory" "15000 30000 same-memory"; do
	set -- $pair
	row "all-full 24 ($3)" custom:full:24x2048 "$1" 0 0
	ref=$LAST
	refc=$LASTC
	row "gpt-oss-20b ($3)" gpt-oss-20b "$2" "$ref" "$refc"
done
row "all-full 48 (recurrent ref)" custom:full:48x2048 400000 0 0
ref=$LAST
refc=$LASTC
for iv in 16 64 256 512 528 2048; do
	row "full 12 + state every $iv" "custom:full:12x2048,state$iv:36x1097728" 400000 "$ref" "$refc"
done
# The checkpoint memory against the hits: interval 512 with more state units
# (each unit is 101 frames of this shape; the attention frames stay 400,000).
for units in 192 384 1536 4096; do
	"$S" --trace "mooncake:$T/mooncake_conversation_trace.jsonl" --limit "$N" \
		--kv-blocks $((400000 + units * 101)) --state-units $units \
		--cost roofline:h100-llama3-8b --slots 64 --policy chunked --budget 512 \
		--shape custom:full:12x2048,state512:36x1097728 --quiet --json 2>/dev/null |
		/usr/bin/python3 -c '
import json, sys
r = [x for x in json.load(sys.stdin) if x["label"].startswith("chunked")][0]
print("state every 512, %5s units: hit%% %.4f, checkpoints held %d MiB, checkpoint hits %d, errors %d" % (
    sys.argv[1], r["prefix_hit_rate"], r.get("state_ckpt_bytes", 0) // (1 << 20), r.get("state_hits", 0), r["errors"]))' $units
done
