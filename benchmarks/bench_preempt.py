# SPDX-License-Identifier: Apache-2.0
"""A long goal with slack, then urgent goals behind it: preemptive EDF on and off.

The case of issue 52: one 200-token goal with a 40-s budget, then four one-word goals
with 3-s budgets 1 s later, MODE_AUTO and Kill, the shipped parameters. Node A runs with
``preemption: true`` (the shipped value), node B with ``false``; each round runs on A,
then on B, never both at once. Reported per node: urgent goals met, the long goal met,
its pauses (from its result's reason), Kill lateness, FAILED.

    python -m benchmarks.bench_preempt --rounds 3 --out results/preempt/<run>
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.bench_context import Nodes as ContextNodes
from benchmarks.common import commit, machine, shipped_params, stamped_log
from benchmarks.harness import claim_out, OUT_HELP, write_outputs
from timebill_ros.core.request import Mode

LONG = ('Write a detailed essay about the history of robotics.', 40.0, 200)
URGENT = ('Stop or go?', 'Say yes.', 'Left or right?', 'Is the door open?')
URGENT_S, URGENT_AFTER_S = 3.0, 1.0
NAMESPACES = {'A': '/preempt_on', 'B': '/preempt_off'}


class Nodes(ContextNodes):
    """Node A with preemption, node B without; bench_context's send and record."""

    def start(self, overrides: dict | None = None) -> None:
        """Start both nodes with the shipped parameters, preemption on (A) and off (B)."""
        for name, preemption in (('A', True), ('B', False)):
            self.log(f'starting node {name} (preemption {preemption}) ...')
            params = {**shipped_params(), 'preemption': preemption}
            self.start_node(name, params, NAMESPACES[name], f'preempt_bench_{name}')


def one_round(nodes: Nodes, node: str) -> dict:
    """Send the long goal, then the urgent ones 1 s later; return their records."""
    instruction, budget, tokens = LONG
    sent = time.monotonic()
    long_run = nodes.send(node, instruction, '', budget, tokens, mode=int(Mode.AUTO))
    time.sleep(URGENT_AFTER_S)
    urgent = [(nodes.send(node, question, '', URGENT_S, 8, mode=int(Mode.AUTO)),
               time.monotonic()) for question in URGENT]
    records = [nodes.record(node, run, URGENT_S, at) for run, at in urgent]
    return {'long': nodes.record(node, long_run, budget, sent), 'urgent': records}


def summarise(rounds: list) -> dict:
    """Count, over the rounds, what met and how late the killed goals ended."""
    urgent = [r for one in rounds for r in one['urgent']]
    longs = [one['long'] for one in rounds]
    every = urgent + longs
    killed = [r['late'] for r in every if r['outcome'] == 'KILLED' and r['late'] is not None]
    return {'urgent_met': sum(r['met'] for r in urgent), 'urgent': len(urgent),
            'long_met': sum(r['met'] for r in longs), 'long': len(longs),
            'long_paused': sum('paused' in r['reason'] for r in longs),
            'long_e2e_s': [round(r['e2e_s'], 2) for r in longs],
            'failed': sum(r['outcome'] == 'FAILED' for r in every),
            'claimed_late': sum(r.get('claimed', False) and not r['met']
                                and r['outcome'] == 'COMPLETED' for r in every),
            'worst_kill_late_s': max(killed, default=None)}


def markdown(report: dict) -> str:
    """Render the run's table."""
    lines = [f"# Preemptive EDF: a long goal with slack, urgent goals behind it "
             f"({report['date']}, {report['machine']})", '',
             f"Command: `{report['command']}` (commit {report['commit']}). Per round: one "
             f"{LONG[2]}-token goal ({LONG[1]:g} s), then {len(URGENT)} one-word goals "
             f"({URGENT_S:g} s) {URGENT_AFTER_S:g} s later; MODE_AUTO, Kill, shipped "
             'parameters; A and B take turns, never both at once.', '',
             '| node | urgent met | long met | long paused | long e2e s | FAILED | late '
             'claimed met | worst Kill lateness s |', '|---|---|---|---|---|---|---|---|']
    for name, label in (('A', 'A: preemption on'), ('B', 'B: preemption off')):
        s = report['summary'][name]
        worst = s['worst_kill_late_s']
        lines.append(f"| {label} | {s['urgent_met']}/{s['urgent']} | {s['long_met']}/"
                     f"{s['long']} | {s['long_paused']} | {s['long_e2e_s']} | {s['failed']} "
                     f"| {s['claimed_late']} | {'-' if worst is None else f'{worst:.3f}'} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Run the rounds on both nodes and write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--out', help=OUT_HELP)
    args = parser.parse_args(argv)
    out = claim_out(args.out, 'preempt')
    log = stamped_log()
    from timebill_ros.tools.client import ensure_init
    ensure_init()
    nodes = Nodes(log)
    rounds = {'A': [], 'B': []}
    try:
        nodes.start()
        for index in range(args.rounds):
            for name in ('A', 'B'):
                rounds[name].append(one_round(nodes, name))
                log(f"round {index + 1} {name}: {summarise(rounds[name][-1:])}")
    finally:
        nodes.stop()
    given = sys.argv[1:] if argv is None else argv
    report = {'command': ' '.join(['python -m benchmarks.bench_preempt', *given]),
              'commit': commit(), 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
              'machine': machine(), 'rounds': rounds,
              'summary': {name: summarise(runs) for name, runs in rounds.items()}}
    write_outputs(out, report, markdown, lambda report, out: None)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
