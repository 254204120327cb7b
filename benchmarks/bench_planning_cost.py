# SPDX-License-Identifier: Apache-2.0
"""bench_planning_cost: the node's planning work per goal with many goals queued.

The shipped configuration's server (embedded model, every resident option, profiles of
this machine) in process, its model held so that nothing dispatches: goals are admitted
one after another (held-out robot commands, MODE_AUTO, budgets 30-60 s) and each
admission is timed (validation, tokenizing, the length choice, planning against the
queue). At each queue depth named, the plan a goal would get at dispatch is timed too
(the cheap lost-goal test, the queue share over every live goal waiting, the re-plan).
Median and 95th percentile over the goals at that depth; wall-clock, nothing else
running.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks import common, harness


class Quiet:
    """The serving layer's log, kept quiet (the benchmark prints its own lines)."""

    def info(self, message: str) -> None:
        """Drop progress."""

    def warning(self, message: str) -> None:
        """Print a fallback."""
        print(f'warning: {message}', file=sys.stderr)

    def error(self, message: str) -> None:
        """Print a failure."""
        print(f'error: {message}', file=sys.stderr)


def percentiles(samples: list) -> dict:
    """Return the median and the 95th percentile of ``samples`` in ms."""
    ordered = sorted(samples)
    return {'median_ms': 1e3 * statistics.median(ordered),
            'p95_ms': 1e3 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            'n': len(ordered)}


def measure(server, commands: list, depths: list, repeats: int) -> dict:
    """Admit goals up to the deepest queue; time admissions and dispatch plans per depth."""
    from timebill_ros.core.request import GoalSpec, Mode
    local = server.executor
    pipeline, admission, queue = local.pipeline, local.admission, local.dispatch.queue
    admits, starts, rows = [], {}, {}
    server.submit(server.admit(GoalSpec(commands[0], budget_s=600.0, mode=int(Mode.AUTO),
                                        max_new_tokens=32), 'holder'))
    for _ in range(1000):  # the worker takes it and waits for the held model
        if len(queue) == 0:
            break
        time.sleep(0.01)
    for index in range(max(depths) + repeats):
        spec = GoalSpec(commands[index % len(commands)], budget_s=30.0 + index % 31,
                        mode=int(Mode.AUTO), max_new_tokens=32)
        depth, began = len(queue), time.perf_counter()
        job = server.admit(spec, f'goal-{index}')
        admits.append((depth, time.perf_counter() - began))
        for want in depths:  # as if it started now, with the others waiting
            if want <= depth < want + repeats:
                began = time.perf_counter()
                admission._refuse_if_lost(pipeline, job)
                share = admission.share.of(pipeline, job)
                if share is not None:
                    admission.share.plan(pipeline, job, None, share)
                starts.setdefault(want, []).append(time.perf_counter() - began)
        server.submit(job)
    for want in depths:
        at = [seconds for depth, seconds in admits if want <= depth < want + repeats]
        rows[want] = {'admit': percentiles(at), 'dispatch_plan': percentiles(starts[want])}
    return rows


def markdown(report: dict) -> str:
    """Render the table."""
    lines = [f"# Planning cost per goal with goals queued ({report['date']}, "
             f"{report['machine']})", '', f"Command: `{report['command']}` (commit "
             f"{report['commit']}).", '', '| goals queued | admission, median ms | p95 ms | '
             'plan at dispatch, median ms | p95 ms |', '|---|---|---|---|---|']
    for depth, row in report['rows'].items():
        lines.append(f"| {depth} | {row['admit']['median_ms']:.2f} | "
                     f"{row['admit']['p95_ms']:.2f} | {row['dispatch_plan']['median_ms']:.2f} "
                     f"| {row['dispatch_plan']['p95_ms']:.2f} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Build the shipped server, queue goals behind a held model, and write the folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--depths', type=int, nargs='+', default=[0, 10, 100, 500])
    parser.add_argument('--repeats', type=int, default=20, help='goals timed at each depth')
    parser.add_argument('--out', help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'planning_cost')
    log = common.stamped_log()
    from timebill_ros.core.config import NodeConfig
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.runtime.model import load_model
    from timebill_ros.serving.assembly import Assembly
    from timebill_ros.serving.local_executor import local_server
    config = NodeConfig.from_dict(common.shipped_params())
    loaded = load_model(config.model, config.device, config.dtype)
    server = local_server(Assembly(config, loaded, Quiet()), lambda *args: None)
    commands = [item.instruction for item in robot_workload.load('test')]
    report = common.run_header('benchmarks.bench_planning_cost', argv)
    log('server ready; queueing goals behind the held model ...')
    try:
        with server.executor.assembly.model_lock:  # the worker takes one goal and waits here
            report['rows'] = measure(server, commands, args.depths, args.repeats)
            server.close('benchmark over')  # the queued goals end now, none runs
    finally:
        server.stop()
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    print(markdown(report))
    return 0


if __name__ == '__main__':
    sys.exit(main())
