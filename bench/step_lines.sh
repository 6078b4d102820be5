#!/bin/sh
# step_lines.sh BUILD [ROWS] [CONTEXT] - bkv_step against a minimal step that
# writes the same flat batch (bench_step --minimal: append each row's token,
# write its entries and its block table), per row and step: instructions
# and the simulated cache's data misses (callgrind --cache-sim=yes: D1 read
# and write misses, and last-level misses), from two step counts' difference
# (setup cancels). A release build:
#   sh bench/step_lines.sh build-rel 1024 64
B=${1:-build-rel}
R=${2:-1024}
C=${3:-64}
t=$(mktemp -d) || exit 1
ev() { # out-file: total Ir D1mr D1mw DLmr DLmw
	callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { for (i = 1; i <= 5; i++) { gsub(",", "", $i); printf "%s ", $i } print ""; exit }'
}
cg() { # file steps args-before-steps... -- args-after-steps
	f=$1 n=$2
	shift 2
	pre= post= seen=
	for a in "$@"; do
		if [ "$a" = -- ]; then seen=1; continue; fi
		if [ -n "$seen" ]; then post="$post $a"; else pre="$pre $a"; fi
	done
	# shellcheck disable=SC2086
	valgrind --tool=callgrind --cache-sim=yes --callgrind-out-file="$f" $pre "$n" $post >/dev/null 2>&1
}
row() { # label, then cg's arguments after the steps
	label=$1
	shift
	cg "$t/a" 64 "$@"
	cg "$t/b" 128 "$@"
	set -- $(ev "$t/a") $(ev "$t/b")
	awk -v l="$label" -v r="$R" -v c="$C" -v a1="$1" -v a2="$2" -v a3="$3" -v a4="$4" \
		-v a5="$5" -v b1="$6" -v b2="$7" -v b3="$8" -v b4="$9" -v b5="${10}" 'BEGIN {
		n = 64 * r
		printf "| %s | %d | %d | %.1f | %.2f | %.2f |\n", l, r, c, (b1 - a1) / n,
			(b2 - a2 + b3 - a3) / n, (b4 - a4 + b5 - a5) / n }'
}
echo "| step | rows | context | instructions / row | D1 misses / row | LL misses / row |"
echo "|---|---:|---:|---:|---:|---:|"
row bkv_step "$B/bench/bench_step" "$R" 0 1 -- "$C" flat
row minimal "$B/bench/bench_step" --minimal "$R" -- "$C"
rm -rf "$t"
