#!/bin/sh
# Prefix-hit share and TTFT under chunked prefill (issue 23): the Mooncake
# conversation trace, first 3,000 requests, 200,000 blocks, H100 roofline, 64
# slots; continuous and chunked prefill at several budgets.
#   sh bench/prefix_chunked.sh [BKV_SIM] [TRACES_DIR]
# docs/benchmarks.md ("Prefix hits under chunked prefill") has the numbers,
# from this script run with the binary of the commit before and after.
S=${1:-build/examples/bkv-sim}
T=${2:-../shared/data/traces}
for p in continuous "chunked 512" "chunked 2048" "chunked 8192"; do
	set -- $p
	if [ "$1" = chunked ]; then b="--policy chunked --budget $2"; else b="--policy continuous"; fi
	# shellcheck disable=SC2086
	"$S" --trace "mooncake:$T/mooncake_conversation_trace.jsonl" --limit 3000 \
		--kv-blocks 200000 --cost roofline:h100-llama3-8b --slots 64 $b 2>&1 |
		awk -v name="$p" '$1 != "static" && $1 != "policy" && $(NF-3) ~ /%$/ {
			print name ": ttft_avg " $(NF-11) " ms, ttft_p99 " $(NF-9) " ms, hit " $(NF-3) ", tok/s " $(NF-12) }'
done
