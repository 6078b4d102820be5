#!/bin/sh
# Instruction counts (callgrind) of bkv_step per running row and of the pool's
# block operations per block, for one build (a release build: docs/benchmarks.md).
#   sh bench/instr_counts.sh BUILD
# bkv_step: inclusive Ir of bkv_step over 128 decode steps minus 64, per step
# and per row, on a fixed clock (BKV_BENCH_CLOCK: the counts then repeat).
# Pool ops: total Ir of 2,000 iterations minus 1,000, per block (64 blocks
# per alloc iteration, 128 per prefix and miss iteration).
B=${1:-build-rel}
t=$(mktemp -d) || exit 1
step_ir() { # running waiting steps
	BKV_BENCH_CLOCK=1 valgrind --tool=callgrind --callgrind-out-file="$t/cg" "$B/bench/bench_step" "$1" "$2" 1 "$3" >/dev/null 2>&1
	callgrind_annotate --inclusive=yes "$t/cg" 2>/dev/null | awk '/:bkv_step / { gsub(",", "", $1); print $1; exit }'
}
for cfg in "32 0" "256 0" "1024 0" "1024 10000"; do
	set -- $cfg
	a=$(step_ir "$1" "$2" 64)
	b=$(step_ir "$1" "$2" 128)
	echo "bkv_step running $1 waiting $2: $(( (b - a) / 64 )) instr/step, $(echo "scale=1; ($b - $a) / 64 / $1" | bc) per row"
done
pool_ir() { # op iterations
	valgrind --tool=callgrind --callgrind-out-file=/dev/null "$B/bench/bench_pool" "$1" "$2" 2>&1 |
		awk '/refs:/ { gsub(",", "", $NF); print $NF }'
}
# state_*: the pool also has a recurrent-state group (fixed arena, or
# _shared: its units sharing the frames; bench/bench_pool.c)
for op in alloc_free alloc_free1 prefix_hit prefix_hit_lru miss_evict miss_evict_value miss_demote host_hit \
	state_alloc_free state_alloc_free_shared state_miss_evict state_miss_evict_shared; do
	per=64
	case $op in prefix* | miss* | host* | state_miss*) per=128 ;; esac
	a=$(pool_ir $op 1000)
	b=$(pool_ir $op 2000)
	echo "bench_pool $op: $(echo "scale=1; ($b - $a) / 1000 / $per" | bc) instr/block"
done
rm -rf "$t"
