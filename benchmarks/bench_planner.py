# SPDX-License-Identifier: Apache-2.0
"""Benchmark: time one TimeBill planning decision (ETE + alpha*), predictor excluded.

Run with ``python -m benchmarks.bench_planner [--profile PATH]``; uses the
embedded model's CPU profile when present, else representative coefficients.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from timebill_ros.core.config import NodeConfig
from timebill_ros.core.planning import MaxTokensPredictor, PlannerSettings, TimeBillPlanner
from timebill_ros.core.profile import default_path, Profile
from timebill_ros.core.request import Mode, OverrunPolicy, Request
from timebill_ros.core.telemetry import percentile
from timebill_ros.core.timing import TimingModel


def main(argv=None) -> int:
    """Print mean, P50 and P99 planning time over many calls."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--profile', help='profile YAML (default: embedded model on cpu)')
    parser.add_argument('--calls', type=int, default=20000)
    args = parser.parse_args(argv)
    root = os.environ.get('TIMEBILL_CACHE') or os.path.expanduser('~/.cache/timebill_ros')
    path = args.profile or default_path(root, 'SmolLM2-135M-Instruct', 'cpu', 'float32')
    if os.path.isfile(path):
        model, source = Profile.load(path).timing_model(), str(path)
    else:
        model, source = TimingModel(2e-7, 2e-3, 0.0, 5.4e-6, 0.0556), 'built-in coefficients'
    planner = TimeBillPlanner(lambda: model, MaxTokensPredictor(),
                              PlannerSettings.from_config(NodeConfig(time_margin=0.05)))
    times = []
    for i in range(args.calls):
        request = Request('q', '', 5.0 + (i % 50) * 0.2, OverrunPolicy.KILL, Mode.EVICTION,
                          64 + i % 192, 1.0 + (i % 5))
        t0 = time.perf_counter()
        try:
            planner.plan(request, 500 + (i * 37) % 3500, request.budget_s)
        except ValueError:
            pass  # an infeasible plan is still a planning decision
        times.append(time.perf_counter() - t0)
    us = [t * 1e6 for t in times]
    print(f'planning time over {args.calls} calls ({source}): mean {statistics.mean(us):.1f} us, '
          f'P50 {percentile(us, 50):.1f} us, P99 {percentile(us, 99):.1f} us, '
          f'max {max(us):.1f} us\n{platform.node()} {platform.machine()} {os.cpu_count()} cpus, '
          f'{time.strftime("%Y-%m-%d")}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
