#!/bin/sh
# Overlapped scheduling by depth on bkv-sim's virtual clock: the workload of
# bench/overlap.sh (1,024 requests at once, prompts 64..256, outputs
# 200..400 tokens, chunked prefill b=512 on a mixed host, 128 slots, the
# default polynomial cost model) under the synchronous contract and the
# overlapped one at depths 1, 2 and 4 (--overlap N: up to N steps on the
# device while the host prepares the next), for several fixed host costs
# per step (--host-overhead-us). Columns:
#   host        the host's CPU time per step, us
#   sync        tokens/s of the synchronous run
#   dN          tokens/s at depth N
#   dN/d1       depth N's tokens/s over depth 1's
#   stepN       makespan / steps at depth N, ms
#   wasteN      tokens computed and discarded at depth N, % of the output
#   declN       launches answered BKV_EAGAIN at depth N
#
#   sh bench/overlap_depth.sh [BUILD] [HOST_US ...]
B=${1:-build}
[ $# -gt 0 ] && shift
S="$B/examples/bkv-sim"
HOSTS=${*:-0 2000 4000 8000}
W="--workload synthetic --n 1024 --arrival burst --prompt 64..256 --output 200..400
   --policy chunked --slots 128 --no-baseline --quiet"
# tok/s (the table's 8th field), then the host line's step ms, declined
# launches and waste %; "fail" when the run failed
row() {
	"$S" $W --host-overhead-us "$1" $2 2>&1 | awk '
		/^chunked b=512 +-/ { tps = $8 }
		/^bkv-sim: .*, seed [0-9]+: / { bad = 1 }
		/ host [0-9]+ us\/step:/ {
			for (i = 1; i <= NF; i++) {
				if ($i == "step" && $(i + 1) != "ms") step = $(i + 1)
				if ($i == "declined,") dec = $(i - 2)
				if ($i == "of" && $(i + 1) == "output)") { w = $(i - 1); sub(/\(/, "", w); sub(/%/, "", w) }
			}
		}
		END { if (bad || tps == "") print "fail 0 0 0"; else print tps, step, dec, w }'
}
printf "%6s %9s %9s %9s %9s %6s %6s %6s %6s %6s %6s %6s %6s %6s %6s\n" host sync d1 d2 d4 \
	d2/d1 d4/d1 step1 step2 step4 waste1 waste2 waste4 decl2 decl4
for h in $HOSTS; do
	set -- $(row "$h" "")
	s=$1
	set -- $(row "$h" "--overlap 1")
	d1=$1 st1=$2 w1=$4
	set -- $(row "$h" "--overlap 2")
	d2=$1 st2=$2 dc2=$3 w2=$4
	set -- $(row "$h" "--overlap 4")
	d4=$1 st4=$2 dc4=$3 w4=$4
	awk -v h="$h" -v s="$s" -v d1="$d1" -v d2="$d2" -v d4="$d4" -v st1="$st1" -v st2="$st2" \
	    -v st4="$st4" -v w1="$w1" -v w2="$w2" -v w4="$w4" -v dc2="$dc2" -v dc4="$dc4" 'BEGIN {
		printf "%6d %9s %9s %9s %9s %6.3f %6.3f %6s %6s %6s %5s%% %5s%% %5s%% %6s %6s\n",
		       h, s, d1, d2, d4, (d1 + 0 > 0 ? d2 / d1 : 0), (d1 + 0 > 0 ? d4 / d1 : 0), st1, st2, st4,
		       w1, w2, w4, dc2, dc4
	}'
done
