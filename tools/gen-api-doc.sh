#!/bin/sh
# Generate docs/api.md from include/batchkv.h: sh tools/gen-api-doc.sh . > docs/api.md
set -eu
src=${1:-.}
cat <<'HDR'
# libbatchkv API reference

Generated from `include/batchkv.h` by `tools/gen-api-doc.sh`; do not edit by
hand (CI checks it is current). The header's opening comment explains the
object model, ownership, threads and errors; struct fields are documented in
the header next to each field.

HDR
awk -v mode=markdown -f "$src/tools/api-doc.awk" "$src/include/batchkv.h"
