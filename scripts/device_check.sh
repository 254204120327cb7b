#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Device check (issue 16): build, the timing-relevant tests, calibrate (ETE MAPE of both
# phases), node overhead against a bare decode loop, the weight formats (16-bit copies on
# CUDA), and a short deadline sweep with Kill and Skip-Next through the node. Every figure
# lands in $OUT (default results/device_check).
#
#   scripts/device_check.sh                 # DEVICE=auto: cuda when torch sees one, else cpu
#   DEVICE=cpu scripts/device_check.sh      # what CI-less machines without a GPU run
#
# Budget: under 8 minutes on a GPU machine; about 6 on the 2-core VM with DEVICE=cpu.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$root"
OUT="${OUT:-$root/results/device_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/summary.md"; }

: > "$OUT/summary.md"
stamp "build"
make build > "$OUT/build.log" 2>&1
# shellcheck disable=SC1091
. ./env.sh
if [ -z "${DEVICE:-}" ] || [ "$DEVICE" = auto ]; then
  DEVICE=$(python -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
fi
stamp "device $DEVICE: $(python -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu only")')"

stamp "tests: timing paths (engine, profiler, ETE, batch)"
python -m pytest -q test/runtime/test_engine.py test/runtime/test_presses_profiler.py \
  test/core/test_timing.py test/runtime/test_batch.py 2>&1 | tee "$OUT/tests.log" | tail -1

stamp "calibrate (quick grid): held-out MAPE per phase"
python -m timebill_ros.cli.calibrate --device "$DEVICE" --quick --out "$OUT/profile.yaml" \
  > "$OUT/calibrate.md" 2>&1
grep -E '^\| (prefill|decode step)' "$OUT/calibrate.md" | tee -a "$OUT/summary.md"

stamp "node overhead vs a bare decode loop"
python -m benchmarks.bench_overhead --device "$DEVICE" --repeats 1 --no-start-times \
  --out "$OUT/overhead.json" > "$OUT/overhead.md" 2>&1
grep -E 'overhead ratio|decode TPOT' "$OUT/overhead.md" | tee -a "$OUT/summary.md"

stamp "weight formats: decode step and prefill per resident copy (float16/bfloat16 on CUDA)"
python -m benchmarks.bench_weight_formats --device "$DEVICE" --rounds 2 \
  --out "$OUT/weight_formats" > "$OUT/weight_formats.log" 2>&1
grep -E '^\| (float|bfloat|int8)' "$OUT/weight_formats.md" | tee -a "$OUT/summary.md"

stamp "deadline sweep through the node: Kill and Skip-Next at 0.5, 1 and 2 s"
python -m timebill_ros.ros.node --ros-args -r __ns:=/devcheck --params-file config/timebill.yaml \
  -p device:="$DEVICE" -p profile:="$OUT/profile.yaml" > "$OUT/node.log" 2>&1 &
node_pid=$!
trap 'kill -INT $node_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q ']: ready:' "$OUT/node.log" && break; sleep 1; done
for policy in kill skip_next; do
  rm -rf "$OUT/sweep_$policy"
  python -m timebill_ros.cli.bag write "$OUT/sweep_$policy/bag" --pattern periodic --period 1.0 --count 12 \
    --budget 0.5 1 2 --policy "$policy" --id-prefix "$policy" > /dev/null
  python -m timebill_ros.cli.bag replay "$OUT/sweep_$policy/bag" --out "$OUT/sweep_$policy" \
    --node /devcheck/timebill --timeout 60 --discovery-timeout 30 > "$OUT/sweep_$policy.log" 2>&1
  python - "$OUT/sweep_$policy/replay.csv" "$policy" <<'PY' | tee -a "$OUT/summary.md"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
met = sum(r['outcome'] == 'COMPLETED' and r['deadline_met'].lower() == 'true' for r in rows)
outcomes = {}
for r in rows:
    outcomes[r['outcome']] = outcomes.get(r['outcome'], 0) + 1
print(f'{sys.argv[2]}: {met}/{len(rows)} met, outcomes {outcomes}')
PY
done
kill -INT $node_pid; wait $node_pid || true
trap - EXIT
stamp "done"
