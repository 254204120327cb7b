#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Time `make demo` as a new user meets it: a fresh clone, no pip cache, an empty model
# cache (TIMEBILL_CACHE), then a second `make demo` in the same clone. Each output line is
# stamped with the seconds since that `make demo` began; the logs and a summary go to OUT.
#   scripts/time_fresh_demo.sh results/setup/<name>
set -euo pipefail

out="${1:?usage: scripts/time_fresh_demo.sh OUT_DIR}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
[ -e "$out" ] && { echo "$out exists: results are never overwritten" >&2; exit 1; }
mkdir -p "$out"
out="$(cd "$out" && pwd -P)"
work="$(mktemp -d /tmp/timebill-fresh-XXXXXX)"
git clone -q "$repo" "$work/clone"
mkdir -p "$work/cache"
export TIMEBILL_CACHE="$work/cache" PIP_NO_CACHE_DIR=1

stamped() {  # stamped LOG: run `make demo` in the clone, each line stamped
  local start
  start="$(date +%s.%N)"
  (cd "$work/clone" && make demo 2>&1) | while IFS= read -r line; do
    printf '[%7.1f] %s\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$line"
  done > "$1"
}
stamped "$out/first_make_demo.log"
stamped "$out/second_make_demo.log"

first_of() {  # first_of LOG PATTERN: the stamp of the first line matching PATTERN
  grep -m1 -E -e "$2" "$1" | sed -E 's/^\[ *([0-9.]+)\].*/\1/'
}
{
  echo "# make demo on a fresh clone ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "\`scripts/time_fresh_demo.sh\` at $(git -C "$repo" rev-parse --short HEAD) on" \
       "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cpus; no pip cache, empty TIMEBILL_CACHE."
  echo
  echo "| seconds since make demo began | first make demo | second make demo |"
  echo "|---|---|---|"
  for step in "colcon:colcon: log" "node starting:starting the timebill node" \
              "node ready:\\]: ready:" "first answer:-> generous budget"; do
    name="${step%%:*}"; pattern="${step#*:}"
    echo "| $name | $(first_of "$out/first_make_demo.log" "$pattern") |" \
         "$(first_of "$out/second_make_demo.log" "$pattern") |"
  done
  echo
  echo "Before colcon: creating the venv (pip downloads and builds llama-cpp-python)."
} > "$out/README.md"
cat "$out/README.md"
rm -rf "$work"
