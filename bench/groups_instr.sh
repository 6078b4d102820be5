#!/bin/sh
# Instruction counts (callgrind) of bkv_step per decode row, and of the
# pool's one-token append, for a pool of one full group against full + a
# 128-token window (gpt-oss-20b's groups), full + a recurrent state, and
# full + window + state (bench/bench_groups.c). Steady decode of 256 rows
# at 2,048 tokens of context, persistent layout, block 16. A release build:
#   sh bench/groups_instr.sh BUILD [CTX] [flat|persistent]
# bkv_step: inclusive Ir over 96 steps minus 32, per step and row, and its
# ratio to the one-group pool's. Appends: total Ir of 128,000 appends minus
# 64,000, per append.
B=${1:-build-rel}
CTX=${2:-2048}
LAYOUT=${3:-persistent}
t=$(mktemp -d) || exit 1
step_ir() { # groups rows steps
	valgrind --tool=callgrind --callgrind-out-file="$t/cg" "$B/bench/bench_groups" step "$1" "$2" "$3" "$CTX" "$LAYOUT" >/dev/null 2>&1
	callgrind_annotate --inclusive=yes "$t/cg" 2>/dev/null | awk '/:bkv_step / { gsub(",", "", $1); print $1; exit }'
}
pool_ir() { # groups appends
	valgrind --tool=callgrind --callgrind-out-file=/dev/null "$B/bench/bench_groups" pool "$1" "$2" 2>&1 |
		awk '/refs:/ { gsub(",", "", $NF); print $NF }'
}
plain=
for g in 1 2 4 3; do
	case $g in
	1) name="one full group" ;;
	2) name="full + window 128" ;;
	4) name="full + recurrent state" ;;
	3) name="full + window 128 + recurrent state" ;;
	esac
	a=$(step_ir $g 256 32)
	b=$(step_ir $g 256 96)
	row=$(echo "scale=1; ($b - $a) / 64 / 256" | bc)
	[ -z "$plain" ] && plain=$row
	c=$(pool_ir $g 64000)
	d=$(pool_ir $g 128000)
	echo "| $name | $row | $(echo "scale=2; $row / $plain" | bc) | $(echo "scale=1; ($d - $c) / 64000" | bc) |"
done
rm -rf "$t"
