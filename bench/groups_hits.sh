#!/bin/sh
# Prefix hits of a hybrid model against the same model with every layer full
# attention (issue 16): bkv-sim on the Mooncake conversation trace, chunked
# prefill (budget 512) with the prefix cache, one row per shape and pool.
# Prints, per run, the prompt tokens the prefix cache served and their ratio
# to the all-full run's.
#
#   sh bench/groups_hits.sh BUILD ../shared/data/traces [LIMIT]
#
# (docs/benchmarks.md, "KV groups".)
B=${1:-build}
T=${2:-../shared/data/traces}
N=${3:-1500}
S="$B/examples/bkv-sim"
run() { # shape kv-blocks -> "hit_tokens prefill_tokens"
	"$S" --trace "mooncake:$T/mooncake_conversation_trace.jsonl" --limit "$N" --kv-blocks "$2" \
		--cost roofline:h100-llama3-8b --slots 64 --policy chunked --budget 512 \
		--shape "$1" --quiet --json 2>/dev/null |
		/usr/bin/python3 -c '
import json, sys
r = [x for x in json.load(sys.stdin) if x["label"].startswith("chunked")][0]
prompt = r["prefill_tokens"] / (1 - r["prefix_hit_rate"]) if r["prefix_hit_rate"] < 1 else 0
print("%d %d %.4f %d" % (round(prompt * r["prefix_hit_rate"]), r["prefill_tokens"], r["prefix_hit_rate"], r["errors"]))'
}
printf '%-28s %9s %12s %12s %8s %6s %9s\n' shape kv_blocks hit_tokens computed hit_rate errors vs_full
for pair in "200000 200000" "30000 60000" "15000 30000"; do
	set -- $pair
	full=$(run custom:full:24x2048 "$1")
	hyb=$(run gpt-oss-20b "$2")
	fh=${full%% *}
	for line in "custom:full:24x2048 $1 $full" "gpt-oss-20b $2 $hyb"; do
		set -- $line
		printf '%-28s %9s %12s %12s %8s %6s %9s\n' "$1" "$2" "$3" "$4" "$5" "$6" \
			"$(/usr/bin/python3 -c "print('%.4f' % ($3 / $fh if $fh else 0))")"
	done
done
