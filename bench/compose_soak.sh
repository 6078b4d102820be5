#!/bin/sh
# compose_soak.sh - the randomized composition tester (tests/compose/) for a
# while: seeds from FIRST on, for SECONDS seconds, every failing seed printed
# with its features, what went wrong and the command that replays it.
#
#   bench/compose_soak.sh [BUILD_DIR] [SECONDS] [FIRST_SEED] [extra args]
#   bench/compose_soak.sh build 600 100000
#   BKV_COMPOSE_STRICT=1 bench/compose_soak.sh build 60   # refusals fail
#
# Extra arguments go to the tester (--skip-reset, --skip-pin-misuse while a
# known defect is open; -v for every seed). Exit status 1 when a seed failed.
set -eu
build=${1:-build}
secs=${2:-300}
first=${3:-100000}
[ $# -ge 3 ] && shift 3 || shift $#
exe="$build/tests/compose/compose"
if [ ! -x "$exe" ]; then
	echo "compose_soak: $exe not built (meson compile -C $build tests/compose/compose)" >&2
	exit 2
fi
exec "$exe" --seeds "$first:18446744073709551615" --time "$secs" "$@"
