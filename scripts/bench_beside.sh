#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run one benchmark command at another commit and at this checkout, back to back on this
# machine, so a change is measured beside the code before it.
#
#   scripts/bench_beside.sh REV OUT -- python -m benchmarks.bench_robot --items 12
#
# REV's tree is checked out in a temporary git worktree that borrows this checkout's .venv
# and install/ (the generated interfaces); the command runs there with --out OUT/before,
# then here with --out OUT/after. OUT/README.md records the commits, the date, the CPU
# (lscpu) and the command. Both runs use the same machine, one after the other.
set -euo pipefail

if [ "$#" -lt 4 ] || [ "$3" != "--" ]; then
  echo "usage: $0 REV OUT -- COMMAND..." >&2
  exit 2
fi
rev="$1"; out="$(realpath -m "$2")"; shift 3
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
before="$(git -C "$root" rev-parse "$rev")"
after="$(git -C "$root" rev-parse HEAD)"
tree="$(mktemp -d /tmp/timebill-beside.XXXXXX)"
trap 'git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git -C "$root" worktree add --detach "$tree" "$before" >/dev/null
ln -s "$root/.venv" "$tree/.venv"
ln -s "$root/install" "$tree/install"
mkdir -p "$out"
{
  echo "# Measured beside the commit before"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
  echo "- before: $before (OUT/before), after: $after (OUT/after, with uncommitted changes:"
  echo "  $(git -C "$root" status --porcelain | wc -l) files)"
  echo "- command: \`$* --out <OUT>/{before,after}\`, run by \`scripts/bench_beside.sh\`"
} > "$out/README.md"
for side in before after; do
  where="$tree"; [ "$side" = after ] && where="$root"
  echo "== $side: $where"
  start=$(date +%s)
  (cd "$where" && . ./env.sh && "$@" --out "$out/$side")
  echo "- $side took $(( $(date +%s) - start )) s" >> "$out/README.md"
done
