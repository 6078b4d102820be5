#!/bin/sh
# bindings_step.sh [BUILD] [ROUNDS] - the cost of one bkv_step in C, through
# the Python bindings and through the Rust bindings, at 32 and 1,024 running
# rows (docs/benchmarks.md, "Bindings: the cost of one step").
#
# All three drive the same library build (BUILD, default build/: C links its
# static library, Python loads its shared one, Rust links its static one
# from a release cargo build) through bench_step.c's steady decode. ROUNDS
# (default 3) runs of each, interleaved, so that load on a shared machine
# falls on all three alike; every line is printed, and docs/benchmarks.md
# takes the median of the rounds.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build} rounds=${2:-3}
target="$PWD/$build/bindings/rust-target"
ninja -C "$build" >/dev/null
(cd bindings/rust && CARGO_TARGET_DIR="$target" CARGO_HOME="$target/cargo-home" \
	BATCHKV_LIB_DIR="$PWD/../../$build/lib" cargo build --offline --release --quiet --example bench_step)
i=1
while [ "$i" -le "$rounds" ]; do
	echo "== round $i"
	for r in 32 1024; do
		printf 'c    bench_step             running %5d: %s\n' "$r" "$("$build/bench/bench_step" "$r" 0 1 256)"
	done
	BATCHKV_LIBRARY="$build/lib/libbatchkv.so" /usr/bin/python3 bench/bindings_step.py 256
	"$target/release/examples/bench_step" 256
	i=$((i + 1))
done
