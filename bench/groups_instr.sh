#!/bin/sh
# Instruction counts (callgrind) of bkv_step per decode row and of the pool's
# one-token append, for a pool of one full group against two (full + a
# 128-token window) and three (+ a recurrent state), gpt-oss-20b-like groups,
# 64-token prompts, block 16 (bench/bench_groups.c). A release build:
#   sh bench/groups_instr.sh BUILD
# bkv_step: inclusive Ir over 128 steps minus 64, per step and row. Appends:
# total Ir of 128,000 appends minus 64,000, per append.
B=${1:-build-rel}
t=$(mktemp -d) || exit 1
step_ir() { # groups rows steps
	valgrind --tool=callgrind --callgrind-out-file="$t/cg" "$B/bench/bench_groups" step "$1" "$2" "$3" >/dev/null 2>&1
	callgrind_annotate --inclusive=yes "$t/cg" 2>/dev/null | awk '/:bkv_step / { gsub(",", "", $1); print $1; exit }'
}
pool_ir() { # groups appends
	valgrind --tool=callgrind --callgrind-out-file=/dev/null "$B/bench/bench_groups" pool "$1" "$2" 2>&1 |
		awk '/refs:/ { gsub(",", "", $NF); print $NF }'
}
for g in 1 2 3; do
	for rows in 256; do
		a=$(step_ir $g $rows 64)
		b=$(step_ir $g $rows 128)
		echo "bkv_step groups $g rows $rows: $(( (b - a) / 64 )) instr/step, $(echo "scale=1; ($b - $a) / 64 / $rows" | bc) per row"
	done
	a=$(pool_ir $g 64000)
	b=$(pool_ir $g 128000)
	echo "append groups $g: $(echo "scale=1; ($b - $a) / 64000" | bc) instr/append"
done
rm -rf "$t"
