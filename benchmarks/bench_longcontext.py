# SPDX-License-Identifier: Apache-2.0
"""Long-context table through the node: completion, task score and fidelity over budgets.

``python -m benchmarks.bench_longcontext`` (``make bench-longcontext``) sends long
prompts (SQuAD, HotpotQA, CNN/DM and needle-in-a-log items, 800-2200 tokens) to the
node with its shipped configuration, through real action clients:

1. every item once per fixed strategy with a loose budget: Vanilla (MODE_NONE), KV
   eviction at fixed ratios (MODE_EVICTION + eviction_ratio) and int8 weights (a second
   node with ``dtype: int8-dynamic``);
2. budgets from 0.7x the fastest to 1.1x the slowest of those runs (the rule of
   ``bench_timebill``);
3. TimeBill AUTO (MODE_AUTO: the planner picks eviction, int8 decoding or the full
   model per goal) for real at every budget, Kill; its Skip-Next figures are replayed
   from those runs, the fixed strategies' from their loose runs.

Quality is reported twice: the task metric against the dataset's reference, and the
*fidelity* (ROUGE-L) to the full-cache answer of the same item (the Vanilla run), which
separates strategies even where the 135M model's task scores are near 0. A missed
deadline scores 0 for both. Third-party text is never written (item ids only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time

from benchmarks import harness
from benchmarks import bench_robot as robot
from benchmarks.bench_timebill import budgets_from, kill_rows, skip_rows
from benchmarks import plots, policies
from timebill_ros.evaluation import metrics, tasks
from benchmarks.common import machine, stamped_log

ALPHAS = (0.25, 0.5, 0.75, 0.95)
LOOSE_BUDGET_S = 300.0
AUTO = 'TimeBill AUTO'


def score_both(item: tasks.TaskItem, text: str, reference_text: str | None) -> tuple:
    """Return (task score, fidelity to the full-cache answer) of one answer."""
    task = metrics.score(item.metric, text, item.references)
    if reference_text is None:
        return task, 1.0  # this is the full-cache answer itself
    if not reference_text.strip():
        return task, float(not text.strip())
    return task, metrics.rouge_l(text, reference_text)


class LongContextBench(robot.RobotBench):
    """The robot benchmark's nodes and clients; records carry both scores (texts in memory)."""

    def __init__(self, model: str, log):
        """Start nothing yet."""
        super().__init__(log)
        self.model, self.full_text = model, {}

    def start_nodes(self) -> None:
        """Start the float32 node (shipped config) and the int8 node."""
        common = {'model': self.model, 'max_new_tokens_limit': 1024}
        if self.model != 'embedded':  # the shipped exit layer and heads fit the 30-layer model
            common['early_exit_layers'] = ''
        self.start('fp32', common)
        self.start('int8', {**common, 'dtype': 'int8-dynamic',
                            'length_predictor': 'max-new-tokens'})

    def run(self, node: str, item: tasks.TaskItem, strategy: str, budget_s: float,
            **goal) -> dict:
        """Send one goal, wait for its end, return a plain record with both scores."""
        from timebill_msgs.action import Instruct
        from timebill_ros.tools.client import make_goal, outcome_name
        run = self.clients[node].ask(
            make_goal(item.instruction, budget_s, item.context,
                      max_new_tokens=item.max_new_tokens, **goal), budget_s + 180.0)
        record = {'item': item.item_id, 'task': item.task, 'strategy': strategy,
                  'budget_s': budget_s, 'outcome': 'REJECTED', 'met': False, 'e2e_s': 0.0,
                  'tokens': 0, 'score': 0.0, 'fidelity': 0.0, 'alpha': 0.0, 'precision': '',
                  'reason': run.reject_reason if not run.accepted else ''}
        if not run.accepted:
            return record
        res, plan = run.result, run.result.plan
        if strategy == 'Vanilla' and budget_s == LOOSE_BUDGET_S:
            self.full_text[item.item_id] = res.text
            task, fidelity = score_both(item, res.text, None)
        else:
            task, fidelity = score_both(item, res.text, self.full_text.get(item.item_id, ''))
        record.update(outcome=outcome_name(res.outcome),
                      met=bool(res.outcome == Instruct.Result.COMPLETED and res.deadline_met),
                      claimed=bool(res.deadline_met), e2e_s=res.e2e_s, tokens=res.tokens,
                      score=task, fidelity=fidelity, alpha=float(plan.eviction_ratio),
                      precision=plan.precision, reason=res.reason)
        return record


def as_run(record: dict, key: str) -> policies.Run:
    """Turn a loose-budget record into a replayable Run scored by ``key``."""
    return policies.Run(record['e2e_s'], min(1.0, max(0.0, record[key])))


def real_rows(records: list, budgets: list, key: str) -> list:
    """Summarise real Kill runs per budget: in time and scored by ``key``, else 0."""
    rows = []
    for budget in budgets:
        outcomes = [policies.Outcome(policies.IN_TIME, r[key]) if r['met']
                    else policies.Outcome(policies.KILLED, 0.0)
                    for r in records if r['budget_s'] == budget]
        rows.append({'budget_s': budget, **policies.summary(outcomes)})
    return rows


def table(loose: dict, auto: list, budgets: list, order: list) -> dict:
    """Return {policy: {strategy: [rows per budget with completion, score, fidelity]}}."""
    out = {'Kill': {}, 'Skip-Next': {}}
    for strategy, records in loose.items():
        by_item = {r['item']: r for r in records}
        for key in ('score', 'fidelity'):
            runs = {i: as_run(by_item[i], key) for i in order}
            kill = kill_rows(runs, budgets)
            skip = skip_rows({b: [runs[i] for i in order] for b in budgets}, budgets)
            merge(out['Kill'], strategy, kill, key)
            merge(out['Skip-Next'], strategy, skip, key)
    for key in ('score', 'fidelity'):
        merge(out['Kill'], AUTO, real_rows(auto, budgets, key), key)
        by_budget = {b: {r['item']: r for r in auto if r['budget_s'] == b} for b in budgets}
        # A run killed at its deadline has no full e2e: replay it as overrunning.
        skip = skip_rows({b: [as_run(by_budget[b][i], key) if by_budget[b][i]['met']
                              else policies.Run(b * 1.000001 + 1e-6, 0.0) for i in order]
                          for b in budgets}, budgets)
        merge(out['Skip-Next'], AUTO, skip, key)
    return out


def merge(into: dict, strategy: str, rows: list, key: str) -> None:
    """Fold one metric's rows into the strategy's rows (completion is the same for both)."""
    target = into.setdefault(strategy, [{'budget_s': r['budget_s'],
                                         'completion_rate': r['completion_rate']}
                                        for r in rows])
    for mine, row in zip(target, rows):
        mine[f'avg_{key}'] = row['avg_score']


def verdict(report: dict) -> list:
    """Return per budget whether AUTO (Kill) met the target against the best fixed ratio."""
    kill = report['table']['Kill']
    lines = []
    for index, budget in enumerate(report['budgets']):
        fixed = [(s, kill[s][index]) for s in kill if s.startswith('alpha')]
        best_name, best = max(fixed, key=lambda p: (p[1]['completion_rate'],
                                                    p[1]['avg_fidelity']))
        auto = kill[AUTO][index]
        ok = (auto['completion_rate'] >= best['completion_rate']
              and auto['avg_score'] >= best['avg_score'])
        lines.append({'budget_s': budget, 'best_fixed': best_name,
                      'best_completion': best['completion_rate'],
                      'best_score': best['avg_score'], 'auto_completion':
                      auto['completion_rate'], 'auto_score': auto['avg_score'], 'met': ok})
    return lines


def markdown(report: dict) -> str:
    """Render the report as a markdown page."""
    lines = [f"# Long-context table through the node ({report['date']}, {report['machine']})",
             '', f"`{report['command']}`; {report['minutes']:.1f} min.", '',
             f"Workload: {report['workload']}.", '',
             f"Budgets (s): {', '.join(f'{b:g}' for b in report['budgets'])} (0.7 x the "
             'fastest to 1.1 x the slowest loose-budget run).', '',
             'Cells: completion rate / task score / fidelity (ROUGE-L to the full-cache '
             'answer); a missed deadline scores 0. AUTO runs for real (Kill; Skip-Next '
             'replayed from those runs), fixed strategies are replayed from loose runs.', '']
    for policy, by_strategy in report['table'].items():
        lines += [f'## {policy}', '',
                  '| strategy | ' + ' | '.join(f'{b:g} s' for b in report['budgets']) + ' |',
                  '|---|' + '---|' * len(report['budgets'])]
        for strategy, rows in by_strategy.items():
            lines.append(f'| {strategy} | ' + ' | '.join(
                f"{r['completion_rate']:.0%} / {r['avg_score']:.2f} / {r['avg_fidelity']:.2f}"
                for r in rows) + ' |')
        lines.append('')
    lines += ['## AUTO vs the best fixed ratio (Kill)', '',
              '| budget | best fixed | its completion / score | AUTO completion / score | '
              'target met |', '|---|---|---|---|---|']
    for v in report['verdict']:
        lines.append(f"| {v['budget_s']:g} s | {v['best_fixed']} | {v['best_completion']:.0%}"
                     f" / {v['best_score']:.2f} | {v['auto_completion']:.0%} / "
                     f"{v['auto_score']:.2f} | {'yes' if v['met'] else 'no'} |")
    lines += ['', '## AUTO choices per budget (real runs)', '',
              '| budget | full | evicted (mean alpha) | int8 | rejected |',
              '|---|---|---|---|---|']
    for row in report['auto_choices']:
        lines.append(f"| {row['budget_s']:g} s | {row['full']} | {row['evicted']} "
                     f"({row['mean_alpha']:.2f}) | {row['int8']} | {row['rejected']} |")
    lines += ['', '## Per task, loose budget (task score / fidelity)', '',
              '| strategy | ' + ' | '.join(report['tasks']) + ' |',
              '|---|' + '---|' * len(report['tasks'])]
    for strategy, cells in report['per_task'].items():
        lines.append(f'| {strategy} | ' + ' | '.join(
            f"{cells[t]['score']:.2f} / {cells[t]['fidelity']:.2f}" for t in report['tasks'])
            + ' |')
    lines += ['', f"FAILED goals: {report['failed']}; late answers claimed on time: "
              f"{report['late_claimed']}.", '']
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Run the benchmark and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--per-task', type=int, default=15)
    parser.add_argument('--tasks', default=','.join(tasks.TASKS))
    parser.add_argument('--budgets', type=int, default=5)
    parser.add_argument('--alphas', type=float, nargs='+', default=list(ALPHAS))
    parser.add_argument('--min-tokens', type=int, default=800)
    parser.add_argument('--max-tokens', type=int, default=2200)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--model', default='embedded', help="'tiny-random' for a smoke run")
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    started = time.monotonic()

    log = stamped_log(started)

    os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(120, 200)))
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    import rclpy
    from transformers import AutoTokenizer
    from timebill_msgs.action import Instruct
    from timebill_ros.runtime.model import resolve_source
    G = Instruct.Goal
    tokenizer = AutoTokenizer.from_pretrained(resolve_source(args.model)[0])
    task_names = [t for t in args.tasks.split(',') if t]
    items = []
    for task in task_names:
        items += tasks.select(task, tokenizer, args.per_task, args.min_tokens,
                              args.max_tokens, args.seed)
    order = [i.item_id for i in items]
    log(f'{len(items)} items: ' + ', '.join(f'{i.task}:{i.prompt_tokens}' for i in items))
    strategies = ['Vanilla'] + [f'alpha {a:g}' for a in args.alphas] + ['int8-dynamic']
    loose = {s: [] for s in strategies}
    auto = []
    rclpy.init()
    bench = LongContextBench(args.model, log)
    try:
        bench.start_nodes()
        for item in items:  # interleaved per item, so drift hits every strategy alike
            loose['Vanilla'].append(bench.run('fp32', item, 'Vanilla', LOOSE_BUDGET_S,
                                              mode=G.MODE_NONE))
            for alpha in args.alphas:
                loose[f'alpha {alpha:g}'].append(bench.run(
                    'fp32', item, f'alpha {alpha:g}', LOOSE_BUDGET_S, mode=G.MODE_EVICTION,
                    eviction_ratio=alpha))
            loose['int8-dynamic'].append(bench.run('int8', item, 'int8-dynamic',
                                                   LOOSE_BUDGET_S, mode=G.MODE_NONE))
            log(f'{item.item_id}: ' + ', '.join(
                f"{s} {rs[-1]['e2e_s']:.1f}s/{rs[-1]['score']:.2f}/{rs[-1]['fidelity']:.2f}"
                for s, rs in loose.items()))
        budgets = _budgets(loose, args.budgets)
        log(f'budgets {budgets}')
        for budget in budgets:
            for item in items:
                auto.append(bench.run('fp32', item, AUTO, budget, mode=G.MODE_AUTO))
            log(f"budget {budget:g} s: AUTO met "
                f"{sum(r['met'] for r in auto[-len(items):])}/{len(items)}")
    finally:
        bench.stop()
        rclpy.try_shutdown()

    every = [r for rs in loose.values() for r in rs] + auto
    report = {
        'date': datetime.date.today().isoformat(), 'machine': machine(),
        'command': 'python -m benchmarks.bench_longcontext '
                   + ' '.join(argv if argv is not None else sys.argv[1:]),
        'minutes': (time.monotonic() - started) / 60.0, 'tasks': task_names,
        'workload': '; '.join(
            f"{t}: {sum(i.task == t for i in items)} items, prompts "
            f"{min(i.prompt_tokens for i in items if i.task == t)}-"
            f"{max(i.prompt_tokens for i in items if i.task == t)} tokens, max new tokens "
            f"{tasks.MAX_NEW_TOKENS[t]}, metric {tasks.METRIC[t]}" for t in task_names),
        'budgets': budgets, 'table': table(loose, auto, budgets, order),
        'per_task': {s: {t: {k: statistics.mean(r[k] for r in rs if r['task'] == t)
                             for k in ('score', 'fidelity')} for t in task_names}
                     for s, rs in loose.items()},
        'auto_choices': [{
            'budget_s': b,
            'full': sum(r['budget_s'] == b and r['outcome'] != 'REJECTED' and not r['alpha']
                        and not r['precision'] for r in auto),
            'evicted': sum(r['budget_s'] == b and r['alpha'] > 0 for r in auto),
            'mean_alpha': statistics.mean([r['alpha'] for r in auto if r['budget_s'] == b
                                           and r['alpha'] > 0] or [0.0]),
            'int8': sum(r['budget_s'] == b and bool(r['precision']) for r in auto),
            'rejected': sum(r['budget_s'] == b and r['outcome'] == 'REJECTED' for r in auto)}
            for b in budgets],
        'failed': sum(r['outcome'] == 'FAILED' for r in every),
        'late_claimed': sum(bool(r.get('claimed')) and not r['met'] for r in every),
        'runs': every,
    }
    report['verdict'] = verdict(report)
    out = harness.claim_out(args.out, 'longcontext')
    (out / 'bench.json').write_text(json.dumps(report, indent=1, default=float) + '\n')
    (out / 'README.md').write_text(markdown(report))
    shown = {'sweep': report['table'], 'date': report['date'],
             'machine_short': f'{platform.machine()} {os.cpu_count()} cpus'}
    plots.sweep(shown, 'completion_rate', 'completion rate', out / 'completion.png')
    plots.sweep(shown, 'avg_fidelity', 'fidelity to the full-cache answer (0 if missed)',
                out / 'fidelity.png')
    log(f'wrote {out}/README.md')
    print((out / 'README.md').read_text())
    return 0


def _budgets(loose: dict, count: int) -> list:
    """Return the budget sweep from the loose runs that completed."""
    from types import SimpleNamespace
    return budgets_from([SimpleNamespace(e2e_s=r['e2e_s'], accepted=True,
                                         outcome=r['outcome'])
                         for rs in loose.values() for r in rs], count)


if __name__ == '__main__':
    sys.exit(main())
