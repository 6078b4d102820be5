#!/bin/sh
# Instruction counts (callgrind) of a step where a few rows draft against
# one where none does: bkv_step inclusive over 128 decode steps minus 64,
# per step and row, R rows of C-token contexts (flat layout, block_tokens
# 16), host drafts of k = 4 for D rows spread over the batch
# (bench_spec --ngram --drafting); D = 0 with k = 0 is the step without
# speculation, D = 0 with k = 4 offers every row k and none drafts.
# A release build (docs/benchmarks.md).
#   sh bench/spec_fill.sh BUILD [ROWS] [CTX] [D...]
B=${1:-build-rel}
R=${2:-256}
C=${3:-8192}
shift 3 2>/dev/null
DS=${*:-1 4 16}
t=$(mktemp -d) || exit 1
ir() { # steps k drafting
	valgrind --tool=callgrind --callgrind-out-file="$t/cg" "$B/bench/bench_spec" --ngram "$R" "$1" random "$2" \
		--ctx "$C" --drafting "$3" >/dev/null 2>&1
	callgrind_annotate --inclusive=yes "$t/cg" 2>/dev/null | awk '$0 ~ ":bkv_step " { gsub(",", "", $1); print $1; exit }'
}
row() { # k drafting
	a=$(ir 64 "$1" "$2")
	b=$(ir 128 "$1" "$2")
	echo "rows $R ctx $C k=$1 drafting $2: $(( (${b:-0} - ${a:-0}) / 64 )) instr/step, $(echo "scale=1; (${b:-0} - ${a:-0}) / 64 / $R" | bc) per row"
}
row 0 0
row 4 0
for d in $DS; do
	row 4 "$d"
done
rm -rf "$t"
