#!/bin/sh
# run_cargo.sh CRATE_DIR LIBBATCHKV_A TARGET_DIR - the meson test 'rust':
# cargo test --offline, then the minimal example, against the static library
# meson built. Cargo's target folder and home stay inside the build folder.
# Exit 77 (meson: skipped) when there is no cargo.
set -eu
crate=$1 archive=$2 target=$3
if ! command -v cargo >/dev/null 2>&1; then
	echo "rust: no cargo on PATH (Debian: apt-get install cargo); skipped"
	exit 77
fi
export CARGO_TARGET_DIR="$target"
export CARGO_HOME="$target/cargo-home"
export BATCHKV_LIB_DIR="$(cd "$(dirname "$archive")" && pwd)"
export CARGO_TERM_COLOR=never
cd "$crate"
cargo --version
rustc --version 2>/dev/null || true
cargo test --offline
cargo run --offline --quiet --example minimal
