#!/bin/sh
# Instruction counts (callgrind) of speculative decoding's planning per row:
# bkv__spec_plan (choice of k, n-gram lookup, the drafts' append) and
# bkv_step, inclusive, over 128 decode steps minus 64, per step and row, for
# a cyclic output (every lookup matches) and a random one (lookups miss),
# and bkv_step without speculation. A release build (docs/benchmarks.md).
#   sh bench/spec_instr.sh BUILD [ROWS]
B=${1:-build-rel}
R=${2:-256}
t=$(mktemp -d) || exit 1
ir() { # fn steps kind k
	valgrind --tool=callgrind --callgrind-out-file="$t/cg" "$B/bench/bench_spec" --ngram "$R" "$2" "$3" "$4" >/dev/null 2>&1
	callgrind_annotate --inclusive=yes "$t/cg" 2>/dev/null | awk -v f="$1" '$0 ~ ":"f" " { gsub(",", "", $1); print $1; exit }'
}
for kind in cyclic random; do
	for fn in bkv__spec_plan bkv_step; do
		a=$(ir $fn 64 $kind 4)
		b=$(ir $fn 128 $kind 4)
		echo "$kind k=4 $fn: $(echo "scale=1; (${b:-0} - ${a:-0}) / 64 / $R" | bc) instr/row"
	done
	a=$(ir bkv_step 64 $kind 0)
	b=$(ir bkv_step 128 $kind 0)
	echo "$kind k=0 bkv_step: $(echo "scale=1; (${b:-0} - ${a:-0}) / 64 / $R" | bc) instr/row"
done
rm -rf "$t"
