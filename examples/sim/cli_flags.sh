#!/bin/sh
# cli_flags.sh BKV_SIM - the meson test 'sim_flags': bad flags stop bkv-sim
# with exit status 2 and a message naming the flag and the rule.
set -u
sim=$1
fail=0
expect() { # expect "MESSAGE" ARGS...: exit 2, MESSAGE on stderr
	want=$1
	shift
	err=$("$sim" "$@" 2>&1 >/dev/null)
	rc=$?
	case "$err" in
	*"$want"*) [ $rc -eq 2 ] || { echo "bkv-sim $*: exit $rc, want 2"; fail=1; } ;;
	*) echo "bkv-sim $*: '$err' does not say '$want'"; fail=1 ;;
	esac
}
expect "--k 99: at most --slots (32)" --k 99
expect "--k 12: at most --slots (8)" --slots 8 --k 12
expect "--sweep k=64: at most --slots (32)" --sweep k=1,64
expect "--block-tokens 3: must be a power of two" --block-tokens 3
expect "--limit 0: at least 1" --limit 0
expect "--slots 0: at least 1" --slots 0
expect "--no-baseline does not apply to --compare" --compare --no-baseline
expect "--no-baseline does not apply to --compare" --no-baseline --compare 1,2
exit $fail
