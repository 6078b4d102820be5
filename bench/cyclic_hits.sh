#!/bin/sh
# Prefix hits per eviction policy at cache sizes from 25% to 100% of the
# working set (docs/benchmarks.md, "Eviction under cyclic reuse"): bkv-sim,
# chunked prefill (budget 2048) with the prefix cache, H100 roofline, 64
# slots, 16-token blocks, no host tier. Workloads: rotating sessions (bkv-sim
# --workload sessions: 12 sessions, 10 rounds, first contexts 6,144-10,240
# tokens, 512 more a turn, round robin, one request every 2 s), the first
# LIMIT requests of the Mooncake conversation trace, the agent-like trace
# derived from it (bench/agent_trace.py, defaults), and the first LIMIT of
# Azure's conversation trace. Shapes: all-full (24 full layers) and
# gpt-oss-20b (full + window 128). The working set W is the distinct
# 16-token prompt blocks (from the 512-token prefix ids); a run at fraction
# f gets f x W frames, "ample" W x 8 (at most 4,000,000). Columns: hit% per policy and, for
# each f < 1, hit / (f x ample hit) (the rotating-sessions target: >= 0.8).
#
#   sh bench/cyclic_hits.sh BUILD ../shared/data/traces [LIMIT [WORKLOADS [POLICIES]]]
#
# WORKLOADS a list of sessions mooncake agent azure; POLICIES of lru value
# segmented (the defaults: all of them).
B=${1:-build}
T=${2:-../shared/data/traces}
N=${3:-1500}
WLS=${4:-"sessions mooncake agent azure"}
POLS=${5:-"lru value segmented"}
S="$B/examples/bkv-sim"
TMP=${TMPDIR:-/tmp}/cyclic_hits.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
/usr/bin/python3 bench/agent_trace.py "$T/mooncake_conversation_trace.jsonl" "$TMP/agent.jsonl" >/dev/null
# distinct 16-token prompt blocks of a Mooncake-format file's first N requests
ws() {
	/usr/bin/python3 -c '
import json, sys
ids = set()
with open(sys.argv[1]) as f:
    for i, l in enumerate(f):
        if i >= int(sys.argv[2]):
            break
        ids.update(json.loads(l)["hash_ids"])
print(32 * len(ids))' "$1" "$2"
}
args() { # workload -> the bkv-sim arguments
	case $1 in
	sessions) echo "--workload sessions" ;;
	mooncake) echo "--trace mooncake:$T/mooncake_conversation_trace.jsonl --limit $N" ;;
	agent) echo "--trace mooncake:$TMP/agent.jsonl --limit $N" ;;
	azure) echo "--trace azure:$T/AzureLLMInferenceTrace_conv.csv --limit $N" ;;
	esac
}
hit() { # workload shape blocks policy -> hit% (prefix_hit_rate x 100)
	"$S" $(args "$1") --cost roofline:h100-llama3-8b --slots 64 --policy chunked \
		--budget 2048 --shape "$2" --kv-blocks "$3" --evict "$4" --quiet --json 2>/dev/null |
		/usr/bin/python3 -c '
import json, sys
r = [x for x in json.load(sys.stdin) if x["label"].startswith("chunked")][0]
print("%.2f" % (100 * r["prefix_hit_rate"]) if not r["errors"] else "err")'
}
printf '%-9s %-8s %-5s %8s' workload shape f frames
for p in $POLS; do printf ' %9s' "$p"; done
for p in $POLS; do printf ' %9s' "$p/f.H"; done
echo
for w in $WLS; do
	case $w in
	sessions) W=$(( 12 * (8192 + 9 * 512) / 16 )) ;; # the draws' mean first context
	azure) W=$(/usr/bin/python3 -c '
import sys
n = 0
for i, l in enumerate(open(sys.argv[1])):
    if 0 < i <= int(sys.argv[2]):
        n += (int(l.split(",")[1]) + 15) // 16
print(n)' "$T/AzureLLMInferenceTrace_conv.csv" "$N") ;;
	mooncake) W=$(ws "$T/mooncake_conversation_trace.jsonl" "$N") ;;
	agent) W=$(ws "$TMP/agent.jsonl" "$N") ;;
	esac
	for sh in custom:full:24x2048 gpt-oss-20b; do
		name=$([ "$sh" = gpt-oss-20b ] && echo gpt-oss || echo all-full)
		A=$((W * 8 > 4000000 ? 4000000 : W * 8)) # (bkv-sim's --kv-blocks bound)
		amp=$(hit "$w" "$sh" $A lru)
		for f in ample 1.00 0.75 0.50 0.25; do
			fr=$([ $f = ample ] && echo $A || /usr/bin/python3 -c "print(int($W * $f))")
			line=""
			rel=""
			for p in $POLS; do
				h=$([ $f = ample ] && echo "$amp" || hit "$w" "$sh" "$fr" "$p")
				line="$line $(printf '%9s' "$h")"
				rel="$rel $(printf '%9s' "$(/usr/bin/python3 -c "
f = 1.0 if '$f' == 'ample' else float('$f'); a = float('$amp')
print('%.3f' % (float('$h') / (f * a)) if a > 0 and '$h' != 'err' else '-')")")"
			done
			printf '%-9s %-8s %-5s %8s%s%s\n' "$w" "$name" "$f" "$fr" "$line" "$rel"
		done
	done
done
