#!/bin/sh
# budget_loads.sh - issue 19 point 3: the automatic token budget against
# fixed budgets across load levels. For one workload (the bkv-sim options
# after the rates) and each rate, runs chunked prefill on a mixed host with
# auto admission, fixed budgets B and the auto budget, and prints p99 TTFT
# and p99 TPOT (medians over seeds, ms) and whether auto's p99 TTFT is within
# 10% of the best fixed budget's (the lowest p99 TTFT) with a p99 TPOT no
# worse than that budget's (equal: within 1%, the seeds' noise).
#
#   examples/sim/budget_loads.sh BKV_SIM 'B,B,..' 'RATE RATE ..' RATEFLAG OPTIONS...
#
# RATEFLAG is "poisson" (synthetic: --arrival poisson:RATE) or "rate" (a
# trace: --rate RATE). Deterministic; the numbers in docs/benchmarks.md
# ("Automatic budget across load levels") come from it.
set -eu
sim=$1 budgets=$2 rates=$3 how=$4
shift 4
for r in $rates; do
	if [ "$how" = poisson ]; then load="--arrival poisson:$r"; else load="--rate $r"; fi
	# shellcheck disable=SC2086
	{
		"$sim" "$@" $load --policy chunked --k auto --sweep budget=$budgets \
			--no-baseline --quiet --csv --allow-errors 2>/dev/null
		"$sim" "$@" $load --policy chunked --k auto --budget auto \
			--no-baseline --quiet --csv --allow-errors 2>/dev/null
	} |
	awk -F, -v rate="$r" '
		$1 == "label" { next }
		{
			lab = $1; sub(/^chunked /, "", lab)
			tt[lab] = $12; tp[lab] = $15; err[lab] = $24; order[n++] = lab
		}
		END {
			best = ""
			for (i = 0; i < n; i++) {
				l = order[i]
				if (l != "auto" && (best == "" || tt[l] < tt[best])) best = l
			}
			line = sprintf("rate %-6s", rate)
			for (i = 0; i < n; i++)
				line = line sprintf("  %s %.1f/%.3f", order[i], tt[order[i]], tp[order[i]])
			ok = tt["auto"] <= 1.1 * tt[best] && tp["auto"] <= 1.01 * tp[best] ? "yes" : "NO"
			printf "%s  | best fixed %s: auto ttft %+.1f%%, tpot %.3f vs %.3f: %s\n", line,
				best, 100 * (tt["auto"] / tt[best] - 1), tp["auto"], tp[best], ok
		}'
done
