# SPDX-License-Identifier: Apache-2.0
"""bench_cold_start: a first start of the shipped node, as on a fresh machine.

The node starts with the shipped parameters and an empty cache (``TIMEBILL_CACHE`` a
new folder: the torch copy of the embedded model, the GGUF variants and every profile
are made again). A real action client sends a goal the moment the action server is up,
and then, while the node profiles its other options between goals, one goal every
``--every`` seconds (so the idle profiling is seen cut short by goals). Reported: seconds
from the process start to the node's ready line, to the first answer, and until every
option has a profile of this machine; the node's own lines for each option; every goal's
outcome, option and plan note; a second start on the filled cache (the ready time a user
sees from then on).

    python -m benchmarks.bench_cold_start --out results/cold_start/<name>
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time

from benchmarks.common import run_header, shipped_params
from benchmarks.harness import claim_out, OUT_HELP, write_outputs
from timebill_ros.core.request import Outcome
from timebill_ros.tools.process import NodeProcess

COMMANDS = ('Answer with one word, STOP or GO: a pedestrian is crossing 4 m ahead.',
            'Summarise the robot status in one sentence: battery 64 %, lidar OK.',
            'Which bay should forklift 7 use: bay 2 is free, bay 5 is blocked?')


def node_params(cache: str) -> dict:
    """Return the shipped parameters, the profiles under ``cache``."""
    params = {k: v for k, v in shipped_params().items() if v != ''}
    params['profile'] = f'{cache}/profiles/embedded.yaml'
    return params


def ask(client, instruction: str, budget_s: float) -> dict:
    """Send one MODE_AUTO goal; return what it ended with."""
    from timebill_ros.tools.client import make_goal
    began = time.monotonic()
    run = client.ask(make_goal(instruction, budget_s), budget_s + 60)
    row = {'sent_s': began, 'accepted': run.accepted, 'reason': run.reject_reason or ''}
    if run.accepted and run.result is not None:
        res = run.result
        row.update(outcome=res.outcome, met=bool(res.deadline_met), e2e_s=res.e2e_s,
                   option=res.plan.precision or 'float32', note=res.plan.note[-160:])
    return row


def first_start(args, cache: str) -> dict:
    """Start cold, serve, profile while idle; return the timings and the node's lines."""
    from timebill_ros.tools.client import InstructClient
    began = time.monotonic()
    node = NodeProcess(node_params(cache), ready_timeout=900, env={'TIMEBILL_CACHE': cache})
    ready_s = time.monotonic() - began
    client = InstructClient(node_name='cold_start_client')
    goals = []
    try:
        client.wait_for_server(30)
        goals.append(ask(client, COMMANDS[0], args.budget))
        first_s = time.monotonic() - began
        done_at = None
        while time.monotonic() - began < args.limit:
            if any('every option has a profile' in line for line in list(node.lines)):
                done_at = time.monotonic() - began
                break
            goals.append(ask(client, COMMANDS[len(goals) % len(COMMANDS)], args.budget))
            time.sleep(args.every)
    finally:
        client.close()
        node.stop()
    for goal in goals:
        goal['sent_s'] = round(goal['sent_s'] - began, 2)
    lines = [line.strip() for line in node.lines if re.search(
        r'start-up probe|calibrating the fastest|profiled |serving now|every option|ready:',
        line)]
    return {'ready_s': ready_s, 'first_answer_s': first_s, 'all_profiled_s': done_at,
            'goals': goals, 'lines': lines}


def second_start(cache: str) -> float:
    """Return seconds to the ready line on the cache the first start filled."""
    began = time.monotonic()
    node = NodeProcess(node_params(cache), ready_timeout=600, env={'TIMEBILL_CACHE': cache})
    ready = time.monotonic() - began
    node.stop()
    return ready


def _seconds(value) -> str:
    return f'{value:.1f}' if value is not None else 'not within the limit'


def markdown(report: dict) -> str:
    """Return the README of the run."""
    first = report['first']
    out = [f"# Cold start of the shipped node ({report['date']})", '',
           f"`{report['command']}` at {report['commit']} on {report['machine']}.", '',
           '| | seconds from the process start |', '|---|---|',
           f"| ready (action server up) | {first['ready_s']:.1f} |",
           f"| first answer | {first['first_answer_s']:.1f} |",
           f"| every option profiled | {_seconds(first['all_profiled_s'])} |",
           f"| second start, ready | {report['second_ready_s']:.1f} |", '',
           '## Goals sent while the node profiled its options', '',
           '| sent at s | outcome | met | e2e s | option | end of the plan note |',
           '|---|---|---|---|---|---|']
    for goal in first['goals']:
        outcome = Outcome(goal['outcome']).name if 'outcome' in goal else ''

        out.append(f"| {goal['sent_s']} | {outcome or 'refused: ' + goal['reason']}"
                   f" | {goal.get('met', '')} | {goal.get('e2e_s', 0):.2f} | "
                   f"{goal.get('option', '')} | {goal.get('note', '')} |")
    out += ['', "## The node's lines", '', '```', *first['lines'], '```']
    return '\n'.join(out)


def main(argv=None) -> int:
    """Run one cold start, then one warm start; write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--budget', type=float, default=5.0, help='each goal, seconds')
    parser.add_argument('--every', type=float, default=10.0,
                        help='seconds between goals while the node profiles')
    parser.add_argument('--limit', type=float, default=900.0,
                        help='stop waiting for the profiles after this many seconds')
    parser.add_argument('--out', help=OUT_HELP)
    args = parser.parse_args(argv)
    out = claim_out(args.out, 'cold_start')
    import rclpy
    rclpy.init()
    try:
        with tempfile.TemporaryDirectory(prefix='timebill-cold-') as cache:
            first = first_start(args, cache)
            second = second_start(cache)
    finally:
        rclpy.shutdown()
    report = {**run_header('benchmarks.bench_cold_start', argv), 'first': first,
              'second_ready_s': second}
    write_outputs(out, report, markdown, lambda report, out: None)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
