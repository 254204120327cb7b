# SPDX-License-Identifier: Apache-2.0
"""Tables of the trace-driven evaluator: gaps to the node, pooled runs, markdown.

What ``evaluate_planning`` writes: per run, per machine profile and pooled over runs,
and the node's own repeatability between runs of the same items.
"""

from __future__ import annotations

import math
import statistics
import time

from benchmarks import common


def gap_points(report: dict, predicted: dict) -> dict:
    """Return {tier: {strategy: predicted - measured met rate, in points}}."""
    gaps = {}
    for tier, rows in report['table'].items():
        gaps[tier] = {s: 100.0 * (predicted[tier][s]['met'] - row['met']) / row['goals']
                      for s, row in rows.items()}
    return gaps


def within_spread(report: dict, predicted: dict, sds: float = 2.0) -> tuple:
    """Return (cells whose measured count lies within ``sds`` of the replay's sd, cells).

    A cell also counts when its expected count is within half a goal of the measured
    one, so a cell replayed with no spread (every goal surely met or surely missed)
    counts only then.
    """
    inside = cells = 0
    for tier, rows in report['table'].items():
        for strategy, row in rows.items():
            expected = predicted[tier][strategy]
            off = abs(expected['met'] - row['met'])
            cells += 1
            inside += off <= sds * expected['sd'] or off < 0.5
    return inside, cells


def pooled(runs: list, profile: str) -> dict:
    """Return the evaluator against the node with the runs' goals pooled, per tier and strategy.

    ``runs``: (bench report, its evaluation) pairs; ``profile``: the traced machine's
    profile, the one the node's counts are compared with. At 16-20 goals a cell's count moves by
    a goal or two between reruns of one command, more than 5 points; pooled over runs, a
    cell's spread shrinks with the square root of its goals. Per cell: the replay's
    expected met and its sd, the node's met, the goals and the gap in points.
    """
    cells: dict = {}
    for report, evaluation in runs:
        traced = evaluation['machines'][profile]['tiers']
        for tier, rows in report['table'].items():
            for strategy, row in rows.items():
                cell = cells.setdefault(tier, {}).setdefault(
                    strategy, {'expected': 0.0, 'var': 0.0, 'met': 0, 'goals': 0})
                cell['expected'] += traced[tier][strategy]['met']
                cell['var'] += traced[tier][strategy]['sd'] ** 2
                cell['met'] += row['met']
                cell['goals'] += row['goals']
    for rows in cells.values():
        for cell in rows.values():
            cell['sd'] = math.sqrt(cell.pop('var'))
            cell['gap_points'] = 100.0 * (cell['expected'] - cell['met']) / cell['goals']
    return cells


def paired(reports: list, against: str = 'AUTO') -> dict:
    """Return, per tier, ``against`` and the fixed choice with the most met, goal by goal.

    The node's own runs: a goal is one item at one tier in one run, run under every
    strategy. Per tier: each side's met, the goals only one side met, and exact one-sided
    binomial (sign test) p-values that the fixed choice meets more (``p_fixed_better``)
    or fewer (``p_auto_better``) than ``against`` where the two differ. A count under the
    fixed choice's with a large ``p_fixed_better`` is within the noise of a run's items.
    """
    from scipy.stats import binomtest
    goals: dict = {}
    for number, report in enumerate(reports):
        for record in report['records']:
            tier = goals.setdefault(record['tier'], {})
            tier.setdefault((number, record['item']), {})[record['strategy']] = record['met']
    out = {}
    for tier, items in goals.items():
        strategies = {s for outcomes in items.values() for s in outcomes} - {against}

        def met(strategy: str) -> int:
            return sum(o.get(strategy, False) for o in items.values())
        best = max(sorted(strategies), key=met)
        only_auto = sum(o.get(against, False) and not o.get(best, False)
                        for o in items.values())
        only_fixed = sum(o.get(best, False) and not o.get(against, False)
                         for o in items.values())
        differ = only_auto + only_fixed
        out[tier] = {
            'goals': len(items), 'fixed': best,
            'met': met(against), 'fixed_met': met(best),
            'only_auto': only_auto, 'only_fixed': only_fixed,
            'p_fixed_better': binomtest(only_fixed, differ, 0.5, alternative='greater').pvalue
            if differ else 1.0,
            'p_auto_better': binomtest(only_auto, differ, 0.5, alternative='greater').pvalue
            if differ else 1.0}
    return out


def paired_markdown(pairs: dict) -> str:
    """Return the goal-by-goal comparison of AUTO with the most-met fixed choice."""
    lines = ['## AUTO against the most-met fixed choice, goal by goal (the node)', '',
             'Each goal ran under every strategy; p: exact one-sided sign test over the '
             'goals only one of the two met.', '',
             '| tier | goals | most-met fixed | AUTO met | its met | only AUTO | only it '
             '| p(it meets more) | p(AUTO meets more) |', '|---' * 9 + '|']
    for tier, row in pairs.items():
        lines.append(f"| {tier} | {row['goals']} | {row['fixed']} | {row['met']} | "
                     f"{row['fixed_met']} | {row['only_auto']} | {row['only_fixed']} | "
                     f"{row['p_fixed_better']:.3f} | {row['p_auto_better']:.3f} |")
    return '\n'.join(lines)


def pooled_profiles(evaluations: list) -> dict:
    """Return {machine: {tier: {strategy: {'met', 'goals', 'f1_met'}}}} summed over runs.

    What the replay expects on each machine profile of all the runs' goals together;
    ``f1_met`` is met-weighted, as each run's.
    """
    sums: dict = {}
    for evaluation in evaluations:
        for name, result in evaluation['machines'].items():
            for tier, rows in result['tiers'].items():
                for strategy, row in rows.items():
                    cell = sums.setdefault(name, {}).setdefault(tier, {}).setdefault(
                        strategy, {'met': 0.0, 'goals': 0, 'f1_sum': 0.0})
                    cell['met'] += row['met']
                    cell['goals'] += row['goals']
                    cell['f1_sum'] += row['met'] * row['f1_met']
    for tiers in sums.values():
        for rows in tiers.values():
            for cell in rows.values():
                f1_sum = cell.pop('f1_sum')
                cell['f1_met'] = f1_sum / cell['met'] if cell['met'] else 0.0
    return sums


def profiles_markdown(strategies: list, sums: dict) -> str:
    """Return the pooled replay per machine profile: met (F1) and whether AUTO >= each."""
    lines = ['## Every profile, the runs pooled', '',
             'Cells: expected met / goals (token-F1 of met answers to float32\'s).', '']
    for name, tiers in sums.items():
        lines += [f'### {name}', '', '| tier | ' + ' | '.join(strategies) +
                  ' | AUTO >= every fixed? |', '|---' * (len(strategies) + 2) + '|']
        for tier, rows in tiers.items():
            best = max(rows[s]['met'] for s in strategies if s != 'AUTO')
            lines.append(f'| {tier} | ' + ' | '.join(
                f"{rows[s]['met']:.1f}/{rows[s]['goals']} ({rows[s]['f1_met']:.2f})"
                for s in strategies) + ' | ' + ('yes' if rows['AUTO']['met'] >= best - 0.05
                                                else f"NO ({rows['AUTO']['met'] - best:+.1f})")
                + ' |')
        lines.append('')
    return '\n'.join(lines)


def gap_summary(gaps: list) -> str:
    """Return 'W points at worst, M mean; within 5 points in K of N' of cell gaps (points)."""
    return (f'{max(gaps):.1f} points at worst, {statistics.fmean(gaps):.1f} mean; within 5 '
            f'points in {sum(g <= 5.0 for g in gaps)} of {len(gaps)}')


def pooled_markdown(reports: list, cells: dict, command: str) -> str:
    """Return the pooled comparison as a table, with the runs it pools."""
    gaps = [abs(c['gap_points']) for rows in cells.values() for c in rows.values()]
    strategies = reports[0]['strategies']
    lines = [f'# The evaluator against the node, {len(reports)} runs pooled', '',
             f"Command: `{command}` ({common.machine()}, {time.strftime('%Y-%m-%d')}). "
             'Runs (commit, items): ' + ', '.join(
                 f"{r['commit']} ({r['items']})" for r in reports) + '. AUTO in each run is '
             "the planner of that run's commit; the replay is today's.", '',
             f'Gap of the replay to the node over {len(gaps)} tier x strategy cells: '
             f'{gap_summary(gaps)}.', '',
             'Cells: node met / replay expected (gap in points, replay sd in goals).', '',
             '| tier | goals | ' + ' | '.join(strategies) + ' |',
             '|---' * (len(strategies) + 2) + '|']
    for tier, rows in cells.items():
        lines.append(f"| {tier} | {rows[strategies[0]]['goals']} | " + ' | '.join(
            f"{rows[s]['met']} / {rows[s]['expected']:.1f} ({rows[s]['gap_points']:+.1f}, "
            f"{rows[s]['sd']:.1f})" for s in strategies) + ' |')
    return '\n'.join(lines)


def repeatability(reports: list) -> dict | None:
    """Return how far the node's own runs of the same items disagree (None: no two such).

    The fixed choices run the same way in every run, so the spread of their met rate at
    a tier between runs is the node's repeatability: an evaluator cannot be held closer
    to one run than the runs are to each other. Returns the largest and mean spread in
    points over tier x fixed-choice cells, and the cells.
    """
    by_items: dict = {}
    for report in reports:
        items = tuple(sorted({t['item'] for t in report['traces']}))
        by_items.setdefault(items, []).append(report)
    runs = max(by_items.values(), key=len)
    if len(runs) < 2:
        return None
    spreads = {}
    for tier in runs[0]['table']:
        for strategy in runs[0]['table'][tier]:
            if strategy == 'AUTO' or any(strategy not in r['table'].get(tier, {})
                                         for r in runs):
                continue
            rates = [100.0 * r['table'][tier][strategy]['met'] / r['table'][tier][strategy]
                     ['goals'] for r in runs]
            spreads[f'{tier} {strategy}'] = max(rates) - min(rates)
    values = list(spreads.values())
    return {'runs': [r['commit'] for r in runs], 'max_points': max(values),
            'mean_points': statistics.fmean(values), 'cells': spreads}


def markdown(report: dict, evaluation: dict) -> str:
    """Return the evaluation's tables: per machine, met and F1 per tier and strategy."""
    strategies = report['strategies']
    lines = [f"# Planning policies replayed on machine profiles ({report['date']})", '',
             f"`python -m benchmarks.evaluate_planning` over the traces of "
             f"`{report['command']}` (commit {report['commit']}, {report['machine']}, "
             f"{report['items']} held-out items). Cells: met/goals (token-F1 of met answers "
             'to float32\'s).', '']
    gaps = [abs(g) for rows in evaluation['gap_points'].values() for g in rows.values()]
    inside, cells = evaluation['within_2_sd']
    lines += [f"Evaluator vs the node on the traced machine: largest gap "
              f"{max(gaps):.1f} points of met rate over {len(gaps)} tier x strategy cells "
              f"(mean {statistics.fmean(gaps):.1f}). The node's count lies within two "
              f"standard deviations of the replay's own spread (each goal met with its "
              f"share of reruns; or within half a goal of it) in {inside} "
              f"of {cells} cells.", '']
    for name, result in evaluation['machines'].items():
        lines += [f'## {name}', '', f"Figures: {result['source']}.", '',
                  '| tier | ' + ' | '.join(strategies) + ' | AUTO >= every fixed? |',
                  '|---' * (len(strategies) + 2) + '|']
        for tier in report['tiers']:
            rows = result['tiers'][tier]
            best = max(rows[s]['met'] for s in strategies if s != 'AUTO')
            cells = [f"{rows[s]['met']:.1f}/{rows[s]['goals']} ({rows[s]['f1_met']:.2f})"
                     for s in strategies]
            lines.append(f'| {tier} | ' + ' | '.join(cells) +
                         f" | {'yes' if rows['AUTO']['met'] >= best - 0.05 else 'NO'} |")
        lines.append('')
    return '\n'.join(lines)


def cross_markdown(target: dict, checks: list, command: str) -> str:
    """Return each cross-check as node met / replay expected per tier and strategy."""
    strategies = target['strategies']
    lines = [f"# Replayed on a profile against the node there ({time.strftime('%Y-%m-%d')})",
             '', f'Command: `{command}` ({common.machine()}, commit {common.commit()}). '
             f"Node: `{target['command']}` (commit {target['commit']}, {target['machine']}, "
             f"{target['items']} items).", '']
    for name, check in checks:
        gaps = [abs(g) for rows in check['gap_points'].values() for g in rows.values()]
        inside, cells = check['within_2_sd']
        lines += [f"## `{name}` replayed on `{check['profile']}`", '',
                  f'Gap to the node: {gap_summary(gaps)}; within two sd of the '
                  f"replay's spread in {inside} of {cells}.", '',
                  'Cells: node met / replay expected (gap in points).', '',
                  '| tier | ' + ' | '.join(strategies) + ' |',
                  '|---' * (len(strategies) + 1) + '|']
        for tier, rows in target['table'].items():
            lines.append(f'| {tier} | ' + ' | '.join(
                f"{rows[s]['met']} / {check['tiers'][tier][s]['met']:.1f} "
                f"({check['gap_points'][tier][s]:+.1f})" for s in strategies) + ' |')
        lines.append('')
    return '\n'.join(lines)
