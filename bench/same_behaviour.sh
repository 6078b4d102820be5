#!/bin/sh
# Behaviour fingerprint of a build: bkv-sim's JSON for seed 000's comparison,
# the chunked budget sweep, a static/auto sweep and three trace runs (Azure
# and Mooncake with a roofline preset; chunked prefill with the prefix cache
# on Mooncake), with every wall-clock field removed; and tinylm-demo's
# deterministic columns (the runs whose decisions do not read the clock).
# A restructuring that changes no behaviour leaves every file identical:
#
#   sh bench/same_behaviour.sh OLD_BUILD ../shared/data/traces /tmp/old
#   sh bench/same_behaviour.sh NEW_BUILD ../shared/data/traces /tmp/new
#   diff -r /tmp/old /tmp/new && echo identical
#
# (docs/benchmarks.md, "Behaviour kept through the layering".)
B=${1:-build}
T=${2:-../shared/data/traces}
O=${3:-same-behaviour}
S="$B/examples/bkv-sim"
mkdir -p "$O" || exit 1
# wall_s and anything else timed on the machine's clock
strip() { sed -e 's/"wall_s": [0-9.e+-]*/"wall_s": 0/g' -e 's/"wall_[a-z_]*": [0-9.e+-]*/"wall": 0/g'; }
run() {
	name=$1
	shift
	"$S" --quiet --json --allow-errors "$@" 2>/dev/null | strip >"$O/$name.json"
	echo "$name: $(wc -c <"$O/$name.json") bytes"
}
run seed000-compare --workload seed000 --compare
run seed000-chunked-sweep --workload seed000 --policy chunked --host mixed \
	--sweep budget=64,128,256,512,1024,2048
run seed000-auto --workload seed000 --policy auto --seeds 0..4
run synthetic-preempt --workload synthetic --n 400 --prompt 64..512 --output 16..256 \
	--kv-blocks 600 --host-blocks 400 --seeds 3 --policy chunked --budget 256
run azure-roofline --trace "azure:$T/AzureLLMInferenceTrace_conv.csv" --limit 6000 \
	--cost roofline:h100-llama3-8b --slots 128 --compare 1,2,4,8
run mooncake-roofline --trace "mooncake:$T/mooncake_conversation_trace.jsonl" --limit 1500 \
	--kv-blocks 200000 --cost roofline:h100-llama3-8b --slots 64 --compare 1,2,4
run mooncake-chunked --trace "mooncake:$T/mooncake_conversation_trace.jsonl" --limit 1500 \
	--kv-blocks 30000 --cost roofline:h100-llama3-8b --slots 64 --policy chunked --budget 512
# tinylm: name, ok, steps and the counters of the runs that do not time
# themselves (static, continuous, chunked, split, the tight pools).
if [ -x "$B/examples/tinylm/tinylm-demo" ]; then
	"$B/examples/tinylm/tinylm-demo" --small --jobs 60 2>&1 |
		awk '/^(static|continuous|chunked|split|tight)/ { name = substr($0, 1, 26);
			$0 = substr($0, 27); print name, "ok " $1, "steps " $2, "hit " $7,
			"preempt " $8, "swaps " $9, "cow " $10 }' >"$O/tinylm.txt"
	echo "tinylm: $(wc -l <"$O/tinylm.txt") runs"
fi
