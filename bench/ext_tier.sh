#!/bin/sh
# An external KV tier behind the KV connector against recomputing
# (docs/benchmarks.md, "An external KV tier"): bkv-sim, chunked prefill
# (budget 2048) with the prefix cache, H100 / Llama-3-8B roofline (128 KiB
# of KV a token, 2 MiB a block), 64 slots, a mixed host, the device cache at
# 25% of each workload's working set so that its prefix cache misses. Tiers:
# none (recompute), a local NVMe (100 us a transfer, 5 GB/s each way), a
# remote store (1 ms, 1.5 GB/s), each of 4,000,000 blocks and starting
# empty (the engine's own saves fill it), and the NVMe warm (every prompt's
# blocks already there: a store other engines filled).
#
#   sh bench/ext_tier.sh BUILD ../shared/data/traces [WORKLOADS]
#
# WORKLOADS: a list of mooncake (the first 1,500 requests), agent
# (bench/agent_trace.py 150 8 10), sessions (bkv-sim --workload sessions,
# its defaults: 12 sessions, 10 rounds, one request every 2 s) and
# sessions4 (the same at 4 requests/s); all four by default. TTFT and tok/s
# are at the workload's own rate (a bucketed trace's arrivals spread in
# their buckets, as --goodput does); goodput is the highest rate at which
# 90% of requests meet TTFT <= 2 s and TPOT <= 100 ms (--goodput
# 2000,100; bkv-sim does not rescale the sessions workload: "-"). wait_ms
# is the mean time from a load to its completion.
B=${1:-build}
T=${2:-../shared/data/traces}
WLS=${3:-"mooncake agent sessions sessions4"}
S="$B/examples/bkv-sim"
A=${TMPDIR:-/tmp}/bkv-ext-agent.$$.jsonl
trap 'rm -f "$A"' EXIT
run() { # workload-args kv-blocks extra...
	w=$1
	kv=$2
	shift 2
	case $w in --trace*) gp="--goodput 2000,100" ;; *) gp="" ;; esac
	# shellcheck disable=SC2086
	nice "$S" $w --cost roofline:h100-llama3-8b --slots 64 --host mixed --no-baseline \
		--policy chunked --budget 2048 --kv-blocks "$kv" $gp "$@" \
		--json --quiet --allow-errors 2>/dev/null |
		python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
x = r.get("ext", {})
print("%8.2f %8.2f %7.1f %11d %11d %9s %8s %8s %4d" % (
    r["ttft_ms"]["p50"] / 1e3, r["ttft_ms"]["p99"] / 1e3, r["throughput_tok_s"],
    r["prefill_tokens"], x.get("load_tokens", 0), x.get("saved", "-"),
    "%.0f" % x["wait_mean_ms"] if x else "-",
    "%.3f" % r["goodput_rps"] if "goodput_rps" in r else "-", r["errors"]))'
}
printf '%-9s %-12s %8s %8s %7s %11s %11s %9s %8s %8s %4s\n' workload tier ttft_p50 ttft_p99 \
	tok/s computed loaded saved wait_ms goodput err
for w in $WLS; do
	case $w in
	mooncake) args="--trace mooncake:$T/mooncake_conversation_trace.jsonl --limit 1500"
		kv=245072 ;; # 25% of 980,288
	agent)
		python3 "$(dirname "$0")/agent_trace.py" "$T/mooncake_conversation_trace.jsonl" "$A" \
			150 8 10 >/dev/null
		args="--trace mooncake:$A"
		kv=47352 ;; # 25% of 189,408
	sessions) args="--workload sessions"
		kv=2400 ;; # 25% of 9,600
	sessions4) args="--workload sessions --arrival uniform:4"
		kv=2400 ;;
	*) echo "unknown workload $w" >&2; exit 2 ;;
	esac
	for tier in none nvme remote nvme-warm; do
		case $tier in
		none) x="" ;;
		nvme) x="--ext-tier 100,5,4000000" ;;
		remote) x="--ext-tier 1000,1.5,4000000" ;;
		nvme-warm) x="--ext-tier 100,5,4000000,warm" ;;
		esac
		# shellcheck disable=SC2086
		printf '%-9s %-12s %s\n' "$w" "$tier" "$(run "$args" "$kv" $x)"
	done
done
