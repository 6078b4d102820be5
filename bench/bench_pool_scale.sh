#!/bin/sh
# The pool at scale, several invocations: runs `bench_pool scale` RUNS times
# for each binary given, in turn (a, b, a, b, ...), so that every binary sees
# the same load, and prints per binary and pool size the median and range
# over the invocations of the full hit and of the miss with eviction, ns per
# block (each invocation's figure is itself the best of 7 runs of 2,000
# prompts: bench/bench_pool.c), then each median against the 1e4 one
# (docs/benchmarks.md, "The pool at scale"):
#   sh bench/bench_pool_scale.sh 7 build-rel/bench/bench_pool [other/bench_pool ...]
RUNS=${1:-5}
shift
[ $# -gt 0 ] || set -- build-rel/bench/bench_pool
t=$(mktemp -d) || exit 1
r=0
while [ "$r" -lt "$RUNS" ]; do
	i=0
	for b in "$@"; do
		nice "$b" scale | awk -v bin="$i" -F'|' '$2 ~ /^ *[0-9]+ *$/ {
			gsub(/ /, "", $2); print bin, $2, $3 + 0, $4 + 0 }' >>"$t/all"
		i=$((i + 1))
	done
	r=$((r + 1))
done
i=0
for b in "$@"; do
	echo "$b ($RUNS invocations, load average now $(cut -d' ' -f1-3 /proc/loadavg))"
	echo "| device blocks | full hit ns/block: median (range) | x 1e4 | miss with eviction: median (range) | x 1e4 |"
	echo "|---:|---:|---:|---:|---:|"
	for n in $(awk -v bin="$i" '$1 == bin { print $2 }' "$t/all" | sort -un); do
		h=$(awk -v bin="$i" -v n="$n" '$1 == bin && $2 == n { print $3 }' "$t/all" | sort -g |
			awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
				printf "%.1f %.1f %.1f", m, v[1], v[NR] }')
		m=$(awk -v bin="$i" -v n="$n" '$1 == bin && $2 == n { print $4 }' "$t/all" | sort -g |
			awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
				printf "%.1f %.1f %.1f", m, v[1], v[NR] }')
		echo "$n $h $m"
	done | awk 'NR == 1 { h0 = $2; m0 = $5 }
		{ printf "| %s | %s (%s-%s) | %.2f | %s (%s-%s) | %.2f |\n", $1, $2, $3, $4, $2 / h0, $5, $6, $7, $5 / m0 }'
	i=$((i + 1))
done
rm -rf "$t"
