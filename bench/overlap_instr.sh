#!/bin/sh
# Instructions per row per step of the two-phase step at each overlap depth,
# against bkv_step (depth 0), for one build (a release build):
#   sh bench/overlap_instr.sh BUILD [ROWS]
# The whole program (callgrind), 128 decode steps minus 64, on a fixed clock
# (BKV_BENCH_CLOCK: the counts repeat), bench_step's no-op host.
B=${1:-build-rel}
R=${2:-256}
ir() { # depth steps
	BKV_BENCH_CLOCK=1 BKV_BENCH_OVERLAP=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
		"$B/bench/bench_step" "$R" 0 1 "$2" 2>&1 | awk '/refs:/ { gsub(",", "", $NF); print $NF }'
}
for d in 0 1 2 4 8; do
	a=$(ir $d 64)
	b=$(ir $d 128)
	echo "depth $d, $R rows: $(echo "scale=1; ($b - $a) / 64 / $R" | bc) instr/row/step"
done
