# SPDX-License-Identifier: Apache-2.0
"""Benchmark: one MODE_AUTO planning decision with and without the per-layer precision DP.

``python -m benchmarks.bench_mix_planner`` plans a 40-token robot-like goal (80-token
prompt) at 40 budgets from 2 to 4 s, with the ETE and the unit shares, KL and cut effects
measured by ``measure_precision`` (results/precision/bench.json) and ``measure_cuts``.
Prints the median and largest planning time of each and which precision each plan chose.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import statistics
import sys
import time

from benchmarks.paths import RESULTS


class _Fixed:
    name = 'fixed'

    def predict(self, request, prompt_tokens: int) -> int:
        return 40


def main(argv=None) -> int:
    """Print the two planners' times and choices."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--report', default=str(RESULTS / 'precision' / 'bench.json'))
    args = parser.parse_args(argv)
    from timebill_ros.core.cuts import CutEffects, SHIPPED
    from timebill_ros.core.config import NodeConfig
    from timebill_ros.core.planning import MixConfig, PlannerSettings, TimeBillPlanner
    from timebill_ros.core.precision import PrecisionTable, UnitTimes
    from timebill_ros.core.request import Mode, OverrunPolicy, Rejection, Request
    from timebill_ros.core.timing import TimingModel
    report = json.loads(Path(args.report).read_text(encoding='utf-8'))
    t = report['times']

    def units(shares, step_ms):
        return UnitTimes(tuple(s * step_ms / 1e3 for s in shares), (0.0,) * len(shares),
                         (1.0 - sum(shares)) * step_ms / 1e3)
    table = PrecisionTable('int8-dynamic', units(t['full_share'], t['full_step_ms']),
                           units(t['low_share'], t['low_step_ms']), tuple(report['unit_kl']),
                           report['all_low_kl'])
    full = TimingModel(1e-7, 2e-4, 0.02, 3e-6, t['full_step_ms'] / 1e3)
    low = TimingModel(1e-7, 2e-4, 0.02, 3e-6, t['low_step_ms'] / 1e3)
    effects = CutEffects.load(SHIPPED)
    request = Request('x', '', 2.0, OverrunPolicy.KILL, Mode.AUTO, 128, 1.0)
    for name, mix in (('without the DP', None), ('with the DP', MixConfig(table, 'int8-dynamic'))):
        planner = TimeBillPlanner(lambda: full, _Fixed(), PlannerSettings.from_config(NodeConfig(
            min_cut_saving=0.05, time_margin=0.1)), precisions={'int8-dynamic': lambda: low},
            effects=effects, mix=mix)
        times, chosen = [], {}
        for budget in [2.0 + 0.05 * i for i in range(40)]:
            t0 = time.perf_counter()
            try:
                plan = planner.plan(request, 80, budget)
                kind = plan.precision or ('full, int8 in reserve' if plan.fallback else 'full')
            except Rejection:
                kind = 'rejected'
            times.append(time.perf_counter() - t0)
            chosen[kind] = chosen.get(kind, 0) + 1
        print(f'{name}: median {statistics.median(times) * 1e3:.3f} ms, max '
              f'{max(times) * 1e3:.3f} ms; plans {chosen}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
