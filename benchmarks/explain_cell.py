# SPDX-License-Identifier: Apache-2.0
"""Explain one tier cell of the evaluator goal by goal: what AUTO chose and what met.

``python -m benchmarks.explain_cell results/engines/<run> ... --profile
jetson-orin-nano --tier 0.3x --out <new folder>`` replays the runs as
``evaluate_planning`` does (the node's planner, shipped settings) and groups the
cell's goals by the option AUTO ran: how many, the P(fit) the planner gave them on
average, and the goals AUTO and each fixed choice met among them (expected, over reruns).
A cell where AUTO is under a fixed choice then shows which of its choices lost and to
what, and the hindsight bounds say what any choice among the options could have met.
Writes cell.json and CELL.md into a new folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys
import time

from benchmarks import common, harness
from benchmarks.evaluate_planning import evaluate


def cell_goals(reports: list, profile: str, tier: str) -> tuple:
    """Return (strategies, goals): each goal of the cell over ``reports``, every strategy's met.

    A goal is {'item', 'option', 'fit', 'met': {strategy: expected met share}}.
    """
    goals, strategies = [], None
    for report in reports:
        machines = evaluate(report, {'per_goal': True})['machines']
        if profile not in machines:
            raise SystemExit(f'no profile {profile!r} (have {", ".join(machines)})')
        rows = machines[profile]['tiers'].get(tier)
        if rows is None:
            raise SystemExit(f'no tier {tier!r} (have {", ".join(report["tiers"])})')
        strategies = list(rows)
        for index, auto in enumerate(rows['AUTO']['per_goal']):
            goals.append({'item': auto['item'], 'option': auto['option'], 'fit': auto['fit'],
                          'met': {s: rows[s]['per_goal'][index]['met'] for s in strategies}})
    return strategies, goals


def by_option(strategies: list, goals: list) -> dict:
    """Return {AUTO's option: goals, mean P(fit), each strategy's expected met}."""
    groups: dict = {}
    for goal in goals:
        group = groups.setdefault(goal['option'], {'goals': 0, 'fit_sum': 0.0,
                                                   'met': dict.fromkeys(strategies, 0.0)})
        group['goals'] += 1
        group['fit_sum'] += goal['fit']
        for strategy in strategies:
            group['met'][strategy] += goal['met'][strategy]
    return {option: {'goals': g['goals'], 'mean_fit': g['fit_sum'] / g['goals'],
                     'met': g['met']}
            for option, g in sorted(groups.items(), key=lambda kv: -kv[1]['goals'])}


def hindsight(goals: list, without: str | None = None) -> float:
    """Return the goals met had each goal run its best strategy (leaving ``without`` out).

    An upper bound for any choice among those strategies made before running: what a
    planner that knew every option's answer would meet.
    """
    return sum(max(met for strategy, met in goal['met'].items() if strategy != without)
               for goal in goals)


def markdown(strategies: list, groups: dict, header: str) -> str:
    """Return the cell's table: a row per option AUTO ran, and the whole cell."""
    lines = [header, '',
             '| AUTO ran | goals | mean P(fit) | ' + ' | '.join(strategies) + ' |',
             '|---|---|---|' + '---|' * len(strategies)]
    total = dict.fromkeys(strategies, 0.0)
    for option, group in groups.items():
        lines.append(f"| {option} | {group['goals']} | {group['mean_fit']:.2f} | "
                     + ' | '.join(f"{group['met'][s]:.1f}" for s in strategies) + ' |')
        for strategy in strategies:
            total[strategy] += group['met'][strategy]
    goals = sum(group['goals'] for group in groups.values())
    lines.append(f'| all | {goals} | | ' + ' | '.join(f'{total[s]:.1f}' for s in strategies)
                 + ' |')
    lines += ['', 'Met: expected goals met among those AUTO ran on that option, for AUTO '
              'and for each fixed choice on the same goals.']
    return '\n'.join(lines)


def bounds_markdown(strategies: list, goals: list) -> str:
    """Return the hindsight bounds: every strategy, and all but the most-met fixed one."""
    fixed = {s: sum(goal['met'][s] for goal in goals) for s in strategies if s != 'AUTO'}
    top = max(fixed, key=fixed.get)
    return (f'Each goal on its best strategy in hindsight: {hindsight(goals):.1f} met; '
            f'without {top} (the most-met fixed choice, {fixed[top]:.1f}): '
            f'{hindsight(goals, top):.1f}.')


def main(argv=None) -> int:
    """Replay the runs and write the cell's goals grouped by AUTO's option."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('runs', nargs='+', help='bench_engines results folders (bench.json)')
    parser.add_argument('--profile', default='traced',
                        help='machine profile (traced, amd-epyc-2c, intel-xeon-2c, '
                             'jetson-orin-nano; default traced)')
    parser.add_argument('--tier', required=True, help="the tier, e.g. '0.3x' or '2s'")
    parser.add_argument('--out', help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    reports = [json.loads((Path(run) / 'bench.json').read_text()) for run in args.runs]
    strategies, goals = cell_goals(reports, args.profile, args.tier)
    out = harness.claim_out(args.out, 'explain_cell')
    groups = by_option(strategies, goals)
    command = 'python -m benchmarks.explain_cell ' + ' '.join(argv or sys.argv[1:])
    header = (f'# {args.profile}, {args.tier}: AUTO\'s choices goal by goal\n\n'
              f'Command: `{command}` (commit {common.commit()}, '
              f'{time.strftime("%Y-%m-%d")}, {common.machine()}); {len(reports)} runs.')
    (out / 'cell.json').write_text(json.dumps({'profile': args.profile, 'tier': args.tier,
                                               'groups': groups, 'goals': goals},
                                              indent=1) + '\n')
    text = markdown(strategies, groups, header) + '\n\n' + bounds_markdown(strategies, goals)
    (out / 'CELL.md').write_text(text + '\n', encoding='utf-8')
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
