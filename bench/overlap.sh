#!/bin/sh
# Overlapped scheduling on bkv-sim's virtual clock (issue 18): the same
# workload under the synchronous contract (bkv_step: a step takes host +
# device time) and the overlapped one (bkv_step_launch / bkv_step_complete:
# max(host, device)), for several fixed host costs per step
# (--host-overhead-us). The workload: 1,024 requests at once, prompts
# 64..256, outputs 200..400 tokens, chunked prefill b=512 on a mixed host,
# 128 slots, the default polynomial cost model: about 4.8 ms of device time
# per step. Columns:
#   host       the host's CPU time per step, us
#   dev        mean device time per step of the overlapped run, ms
#   sync, ovl  tokens/s under each contract
#   bound      tokens/s at one step per max(dev, host)
#   ovl/bound  = max(dev, host) / (makespan / steps) of the overlapped run
#   ovl/sync   the overlapped run's tokens/s over the synchronous run's
#   waste      tokens computed and discarded (requests that ended in the
#              step in flight), share of the tokens delivered
#   declined   launches answered BKV_EAGAIN (they run with none in flight)
#
#   sh bench/overlap.sh [BUILD] [HOST_US ...]
B=${1:-build}
[ $# -gt 0 ] && shift
S="$B/examples/bkv-sim"
HOSTS=${*:-0 500 1000 2000 3000 4000 5000 8000}
W="--workload synthetic --n 1024 --arrival burst --prompt 64..256 --output 200..400
   --policy chunked --slots 128 --no-baseline --quiet"
# tok/s (the table's 8th field), then the host line's steps, device ms/step,
# step ms, declined launches and waste %
row() {
	"$S" $W --host-overhead-us "$1" $2 2>&1 | awk '
		/^chunked b=512 +-/ { tps = $8 }
		/ host [0-9]+ us\/step:/ {
			for (i = 1; i <= NF; i++) {
				if ($i == "steps,") steps = $(i - 1)
				if ($i == "device") dev = $(i + 1)
				if ($i == "step" && $(i + 1) != "ms") step = $(i + 1)
				if ($i == "declined,") dec = $(i - 2)
				if ($i == "of" && $(i + 1) == "output)") { w = $(i - 1); sub(/\(/, "", w); sub(/%/, "", w) }
			}
		}
		END { print tps, steps, dev, step, dec, w }'
}
printf "%6s %7s %9s %9s %9s %9s %8s %7s %8s\n" host dev sync ovl bound ovl/bound ovl/sync \
	waste declined
for h in $HOSTS; do
	set -- $(row "$h" "")
	sync_tps=$1
	set -- $(row "$h" --overlap)
	awk -v h="$h" -v st="$sync_tps" -v ot="$1" -v dev="$3" -v step="$4" -v dec="$5" \
	    -v waste="$6" 'BEGIN {
		m = dev > h / 1000.0 ? dev : h / 1000.0
		printf "%6d %7.3f %9.1f %9.1f %9.1f %9.4f %8.3f %6.2f%% %8d\n", h, dev, st, ot,
		       ot * step / m, m / step, ot / st, waste, dec
	}'
done
