#!/bin/sh
# cli_flags.sh BKV_SIM - the meson test 'sim_flags': bad flags stop bkv-sim
# with exit status 2 and a message naming the flag and the rule; progress
# goes to stderr as whole lines when stderr is not a terminal (none with
# --quiet), and stdout is the same either way.
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
expect "--overlap 9: at most 8" --overlap 9
expect "--overlap 0: at least 1" --overlap 0
expect "--no-baseline does not apply to --compare" --compare --no-baseline
expect "--no-baseline does not apply to --compare" --no-baseline --compare 1,2
# --adapters: the cap and the wait need it; a cap is at most BKV_MAX_ADAPTERS
expect "--max-adapters needs --adapters N" --max-adapters 4
expect "--adapter-wait-us needs --adapters N" --adapter-wait-us 1000
expect "--sweep max_adapters needs --adapters N" --sweep max_adapters=1,2
expect "--max-adapters 2000: at most 1024" --adapters 8 --max-adapters 2000
expect "--sweep max_adapters=2000: at most 1024" --adapters 8 --sweep max_adapters=1,2000
out=$("$sim" --workload seed000 --seeds 1 --adapters 8 --max-adapters 2 --quiet 2>&1)
case "$out" in
*"adapters: 8 used, cap 2; per call mean "*" max 2;"*) ;;
*) echo "--adapters 8 --max-adapters 2: no adapters line: '$out'"; fail=1 ;;
esac
# --mm-images: the encoder's cache and budget need it; one image must fit
# both
expect "--encoder-cache needs --mm-images N" --encoder-cache 1000
expect "--encoder-budget needs --mm-images N" --encoder-budget 1000
expect "--encoder-cache 10: at least --mm-tokens (64)" --mm-images 4 --mm-tokens 64 --encoder-cache 10
expect "--encoder-budget 10: at least --mm-tokens (576)" --mm-images 4 --encoder-budget 10
out=$("$sim" --workload seed000 --seeds 1 --mm-images 8 --mm-tokens 16 --quiet 2>&1)
case "$out" in
*"images: "*" in requests, "*" encoded, hit rate "*) ;;
*) echo "--mm-images 8 --mm-tokens 16: no images line: '$out'"; fail=1 ;;
esac
# --ext-tier: LAT_US,GBPS,CAP_BLOCKS[,warm] in bounds, with the prefix cache
expect "bad value for --ext-tier: '100,5'" --ext-tier 100,5
expect "bad value for --ext-tier: '100,5,10,cold'" --ext-tier 100,5,10,cold
expect "--ext-tier 100,0,10: latency 0..1e9 us, bandwidth above 0" --ext-tier 100,0,10
expect "capacity 1..16777216 blocks" --ext-tier 100,5,0
expect "--ext-tier needs the prefix cache" --ext-tier 100,5,1000 --no-prefix-cache
out=$("$sim" --workload seed000 --seeds 1 --ext-tier 100,5,100000,warm --quiet 2>&1)
case "$out" in
*"ext tier: "*" loads, "*" tokens loaded, 0 blocks failed; "*) ;;
*) echo "--ext-tier 100,5,100000,warm: no ext tier line: '$out'"; fail=1 ;;
esac
# --calib-csv: measured step times the calibrated model learns first; a bad
# file stops the run with its line named
t=$(mktemp -d)
printf 'kind,decode_rows,decode_context,prefill_tokens,measured_us\ndecode,8,4096,0,6100\nprefill,0,0,512,21000\n' > "$t/ok.csv"
printf 'decode,x\n' > "$t/bad.csv"
"$sim" --workload seed000 --seeds 1 --calib-csv "$t/ok.csv" >/dev/null 2>&1 ||
	{ echo "--calib-csv with a good file failed"; fail=1; }
err=$("$sim" --workload seed000 --seeds 1 --calib-csv "$t/bad.csv" 2>&1 >/dev/null) &&
	{ echo "--calib-csv with a bad file ran"; fail=1; }
case "$err" in
*"bad.csv:1: not kind,decode_rows"*) ;;
*) echo "--calib-csv bad file: '$err'"; fail=1 ;;
esac
rm -rf "$t"
# progress on a piped stderr: whole lines, stdout unchanged by --quiet
out=$("$sim" --workload seed000 --seeds 2 2>/dev/null)
err=$("$sim" --workload seed000 --seeds 2 2>&1 >/dev/null)
case "$err" in
"bkv-sim: [1/4] static"*) ;;
*) echo "piped stderr: '$err' has no progress line"; fail=1 ;;
esac
case "$out" in
*"bkv-sim: ["*) echo "progress on stdout"; fail=1 ;;
esac
quiet_out=$("$sim" --workload seed000 --seeds 2 --quiet 2>/dev/null)
quiet_err=$("$sim" --workload seed000 --seeds 2 --quiet 2>&1 >/dev/null)
[ -z "$quiet_err" ] || { echo "--quiet: stderr '$quiet_err'"; fail=1; }
[ "$out" = "$quiet_out" ] || { echo "stdout differs with --quiet"; fail=1; }
exit $fail
