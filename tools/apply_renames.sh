#!/bin/sh
# apply_renames.sh [ROOT] - apply the public renames listed below (old name,
# new name) to every tracked text file of the tree at ROOT (default: the
# current directory): include, lib, tests, examples, bench, bindings (Python
# ctypes and Rust), docs, README: for a tree written against the old names.
#
# Word-boundary GNU sed over the files git tracks, so build folders, cargo
# targets and .git are never touched. Left alone: this script, and a section
# of docs/design.md headed "## Public renames", should one name the old names.
# Idempotent: no new name contains an old
# one as a whole word, so a second run finds nothing to change. docs/api.md is
# then regenerated from the header, as the api_docs test expects.
set -eu
root=${1:-.}
cd "$root"
git rev-parse --is-inside-work-tree >/dev/null

# old new, one pair a line
renames='bkv_pool_events bkv_pool_drain_events
bkv_vllm_encode bkv_vllm_encoder_drain
bkv_pool_copies bkv_pool_pending_copies
bkv_cost_calib_coefficients bkv_cost_calib_coefficients_get'

script=
pattern=
while read -r old new; do
	script="${script}s/\\b${old}\\b/${new}/g;"
	pattern="${pattern:+$pattern|}${old}"
done <<LIST
$renames
LIST

table='/^## Public renames/,/^## /'
n=0
# -I: text files only; -w -E: the old names as whole words.
git grep -l -I -z -w -E "$pattern" -- . ':(exclude)tools/apply_renames.sh' |
	tr '\0' '\n' > .apply_renames.list || true
while IFS= read -r f; do
	[ -f "$f" ] || continue
	if [ "$f" = docs/design.md ]; then
		sed "${table}!{${script}}" "$f" > .apply_renames.tmp
	else
		sed "$script" "$f" > .apply_renames.tmp
	fi
	if cmp -s "$f" .apply_renames.tmp; then
		continue
	fi
	cat .apply_renames.tmp > "$f"  # keeps the file's mode
	n=$((n + 1))
	echo "renamed in: $f"
done < .apply_renames.list
rm -f .apply_renames.list .apply_renames.tmp

# The three header declarations that grew: wrap and align them as the header's
# other declarations are (under 100 columns, continuation under the paren).
# Whitespace only; a second run leaves them as they are.
if [ -f include/batchkv.h ]; then
	sed -e 's/^\(BKV_API uint32_t bkv_pool_pending_copies(const bkv_pool \*pool, bkv_copy_kind kind,\) \(const bkv_copy \*\*out);\)$/\1\n\t\t\t\t\t \2/' \
	    -e '/^BKV_API int bkv_cost_calib_coefficients_get(/{n;s/^[\t ]*\(double \*w);\)$/\t\t\t\t\t    \1/;}' \
	    -e '/^BKV_API int bkv_vllm_encoder_drain(/{n;s/^[\t ]*\(const uint8_t \*\*msg, size_t \*len);\)$/\t\t\t\t   \1/;}' \
	    include/batchkv.h > .apply_renames.tmp
	if ! cmp -s include/batchkv.h .apply_renames.tmp; then
		cat .apply_renames.tmp > include/batchkv.h
		echo "rewrapped: include/batchkv.h"
	fi
	rm -f .apply_renames.tmp
fi

if [ -f tools/gen-api-doc.sh ] && [ -f include/batchkv.h ]; then
	sh tools/gen-api-doc.sh . > docs/api.md.new && mv docs/api.md.new docs/api.md
fi
left=$(git grep -l -I -w -E "$pattern" -- . ':(exclude)tools/apply_renames.sh' ':(exclude)docs/design.md' || true)
if [ -n "$left" ]; then
	echo "old names still present in: $left" >&2
	exit 1
fi
echo "apply_renames: $n files edited"
