#!/bin/sh
# Packaging test: install libbatchkv into a scratch prefix and build a tiny
# consumer three ways - through pkg-config with meson, through pkg-config
# with CMake (pkg_check_modules), and with libbatchkv as a meson subproject -
# then run each consumer.
#   usage: run.sh SOURCE_ROOT SCRATCH_DIR
set -eu
src=$(cd "$1" && pwd)
work=$2
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"

echo "== install into $prefix"
meson setup "$work/lib" "$src" --prefix="$prefix" --libdir=lib -Dtests=false \
	-Dexamples=false -Dbench=false --buildtype=release >/dev/null
meson compile -C "$work/lib" >/dev/null
meson install -C "$work/lib" >/dev/null
test -f "$prefix/include/batchkv.h"
test -f "$prefix/lib/libbatchkv.a"
test -e "$prefix/lib/libbatchkv.so"
test -f "$prefix/lib/pkgconfig/batchkv.pc"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
export LD_LIBRARY_PATH="$prefix/lib"

echo "== meson consumer through pkg-config"
meson setup "$work/via-pc" "$src/tests/packaging/consumer" >/dev/null
meson compile -C "$work/via-pc" >/dev/null
"$work/via-pc/consumer"

echo "== plain cc through pkg-config --cflags --libs"
cc -std=c11 -o "$work/plain" "$src/tests/packaging/consumer/consumer.c" \
	$(pkg-config --cflags --libs batchkv)
"$work/plain"

echo "== CMake consumer through pkg_check_modules"
if command -v cmake >/dev/null 2>&1; then
	cmake -S "$src/tests/packaging/consumer" -B "$work/cmake" >/dev/null
	cmake --build "$work/cmake" >/dev/null
	"$work/cmake/consumer"
else
	echo "cmake not installed: CMake consumer not tested" >&2
	exit 1
fi

echo "== meson consumer with libbatchkv as a subproject"
unset PKG_CONFIG_PATH LD_LIBRARY_PATH
mkdir -p "$work/sub/subprojects"
cp "$src/tests/packaging/consumer/consumer.c" "$src/tests/packaging/consumer/meson.build" "$work/sub/"
ln -s "$src" "$work/sub/subprojects/batchkv"
meson setup "$work/sub/build" "$work/sub" --force-fallback-for=batchkv \
	-Dbatchkv:tests=false -Dbatchkv:examples=false -Dbatchkv:bench=false >/dev/null
meson compile -C "$work/sub/build" >/dev/null
"$work/sub/build/consumer"
echo "packaging: all consumers built and ran"
