#!/bin/sh
# Every symbol the shared library exports must be declared in
# include/batchkv.h with a doc comment in the header's template, and
# docs/api.md must be the one tools/gen-api-doc.sh makes from the header.
#   usage: check-api-docs.sh SOURCE_ROOT LIBBATCHKV_SO
set -eu
src=$1
so=$2
list=$(awk -v mode=list -f "$src/tools/api-doc.awk" "$src/include/batchkv.h")
fail=0
for sym in $(nm -D --defined-only "$so" | awk '$2 == "T" { print $3 }'); do
	line=$(printf '%s\n' "$list" | awk -F '\t' -v s="$sym" '$1 == s')
	if [ -z "$line" ]; then
		echo "exported but not declared with BKV_API in batchkv.h: $sym"; fail=1
	elif [ "${line#*	}" != 1 ]; then
		echo "exported but not documented (/** ... @return ... */ right above): $sym"; fail=1
	fi
done
printf '%s\n' "$list" | awk -F '\t' '$2 != 1 { print "declared but not documented: " $1; bad=1 } END { exit bad }' || fail=1
if ! sh "$src/tools/gen-api-doc.sh" "$src" | cmp -s - "$src/docs/api.md"; then
	echo "docs/api.md is stale: run sh tools/gen-api-doc.sh . > docs/api.md"; fail=1
fi
n=$(printf '%s\n' "$list" | wc -l)
[ $fail = 0 ] && echo "api docs: $n public functions, all exported symbols documented"
exit $fail
