#!/bin/sh
# The host cache on real traces (issue 22, point 4): bkv-sim, chunked
# prefill (budget 2048) with the prefix cache, H100 / Llama-3-8B roofline,
# 64 slots, a mixed host; the device cache at 25%, 50% and 100% of the
# trace's working set; LRU and eviction by value, each without and with a
# 1,000,000-block host cache (25 GB/s link), the copies added to each
# call's compute (serial) or run beside it (--copy-overlap).
#
#   sh bench/host_cache.sh BUILD ../shared/data/traces [mooncake|agent|azure]
#
# hit_tok is the prompt tokens the prefix cache served (host_hit: of them,
# reloaded from the host cache); "recomputed" is the prefill tokens computed
# beyond those of the same run
# with an unbounded device cache (which computes only what no earlier
# request computed: the compulsory tokens). (docs/benchmarks.md, "The host
# cache".)
B=${1:-build}
T=${2:-../shared/data/traces}
W=${3:-mooncake}
S="$B/examples/bkv-sim"
case $W in
mooncake) TR="mooncake:$T/mooncake_conversation_trace.jsonl --limit 1500"; WS=980288 ;;
agent)
	A=${TMPDIR:-/tmp}/bkv-agent-trace.jsonl
	python3 "$(dirname "$0")/agent_trace.py" "$T/mooncake_conversation_trace.jsonl" "$A" 150 8 10 >&2
	TR="mooncake:$A"; WS=189408 ;;
azure) TR="azure:$T/AzureLLMInferenceTrace_conv.csv --limit 6000"; WS=434367 ;;
*) echo "unknown workload $W" >&2; exit 2 ;;
esac
run() { # kv-blocks extra...
	kv=$1
	shift
	# shellcheck disable=SC2086
	"$S" --trace $TR --cost roofline:h100-llama3-8b --slots 64 --host mixed --no-baseline \
		--policy chunked --budget 2048 --kv-blocks "$kv" "$@" --json --quiet 2>/dev/null |
		python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
rate = r["prefix_hit_rate"]
hit = round(r["prefill_tokens"] * rate / (1 - rate)) if rate < 1 else 0
print(r["prefill_tokens"], "%.2f" % (100 * rate), hit, r.get("host_hit_tokens", 0),
      "%.1f" % (r.get("link_us", 0) / 1e6), "%.1f" % (r["ttft_ms"]["p99"] / 1e3),
      "%.1f" % r["throughput_tok_s"], r["preemptions"], r["errors"])'
}
set -- $(run 4000000)
C=$1
echo "workload $W: working set $WS blocks; compulsory prefill tokens $C"
printf '%-9s %-6s %-14s %11s %11s %6s %10s %10s %7s %8s %8s %4s\n' blocks evict host prefill recomputed hit% \
	hit_tok host_hit link_s p99ttft_s tok/s err
for pct in 25 50 100; do
	kv=$((WS * pct / 100))
	for ev in lru value; do
		for tier in none serial overlap; do
			case $tier in
			none) x="" ;;
			serial) x="--host-blocks 1000000 --host-cache" ;;
			overlap) x="--host-blocks 1000000 --host-cache --copy-overlap" ;;
			esac
			# shellcheck disable=SC2086
			set -- $(run "$kv" --evict "$ev" $x)
			printf '%-9s %-6s %-14s %11s %11s %6s %10s %10s %7s %8s %8s %4s\n' "$kv ($pct%)" "$ev" \
				"$tier" "$1" "$(($1 - C))" "$2" "$3" "$4" "$5" "$6" "$7" "$9"
		done
	done
done
