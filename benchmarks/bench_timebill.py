# SPDX-License-Identifier: Apache-2.0
"""TimeBill evaluation through the node: completion rate and score over time budgets.

``make bench`` (``python -m benchmarks.bench_timebill``; ``--quick`` for a smaller
run). Three nodes run as separate processes with the embedded SmolLM2 model,
all driven by real action clients:

- ``fp32``: float32, ``length_predictor: rlp`` (the shipped head), ``infeasible:
  best_effort`` (TimeBill runs at alpha_max when even that misses, instead of refusing);
- ``standin``: float32 with the free max-new-tokens stand-in predictor: runs the fixed
  strategies (so they do not pay for a length prediction they do not use) and the
  stand-in ablation;
- ``int8``: the same model with int8 dynamic quantisation (the paper's AWQ row).

Steps (every goal below goes through ~/instruct):

1. Measure: each workload item once per fixed strategy with a loose budget: Vanilla
   (MODE_NONE), fixed eviction ratios (MODE_EVICTION + eviction_ratio), int8.
2. Budgets: a sweep from below the fastest measured run to above the slowest.
3. TimeBill (MODE_EVICTION, planner-chosen alpha, Kill) runs for real at every budget,
   and so do the predictor ablations (stand-in node; oracle = the Vanilla answer's
   length passed as expected_tokens) and the pessimistic-factor ablation (k at one
   tight budget, planning from the oracle length).
4. Fixed strategies are *replayed* at each budget from their step-1 runs (their
   execution does not depend on the budget; see evaluation/policies.py), and the
   replay is checked against real Kill runs of Vanilla and one fixed ratio at one
   budget (agreement reported). Skip-Next figures are replayed for every strategy
   (jobs released every budget seconds), TimeBill from its real runs at that budget.

Outputs go to ``--out`` (default results/timebill): bench.json, README.md (tables),
completion.png, score.png, ete_scatter.png, k_ablation.png.
Third-party text is not written (item ids only).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import datetime
import json
import math
import os
from pathlib import Path
import platform
import random
import shlex
import statistics
import sys
import threading
import time

from benchmarks import harness
from benchmarks import plots, policies
from timebill_ros.evaluation import metrics, tasks
from benchmarks.common import machine, stamped_log

ALPHAS = (0.25, 0.5, 0.75, 0.95)
QUICK_ALPHAS = (0.5, 0.95)
LOOSE_BUDGET_S = 300.0
NAMESPACES = {'fp32': '/bench_fp32', 'int8': '/bench_int8', 'standin': '/bench_standin'}


@dataclass
class Measured:
    """One goal's result as the benchmark keeps it."""

    item: str
    strategy: str
    budget_s: float
    accepted: bool
    outcome: str
    deadline_met: bool
    e2e_s: float
    tokens: int
    score: float
    alpha: float = 0.0
    predicted: int = 0
    worst: int = 0
    est_wcet_s: float = 0.0
    est_compute_s: float = float('nan')
    compute_s: float = float('nan')
    reason: str = ''


class TimeBillBench(harness.Nodes):
    """Own the nodes and clients, run goals and keep what they returned."""

    def __init__(self, items: list, out: Path):
        """Prepare for ``items``; nodes start in start()."""
        super().__init__()
        self.items, self.out = items, out
        self.telemetry = {}
        self._lock = threading.Lock()

    def start(self, log, only=None) -> None:
        """Start the three nodes (one at a time: a missing profile is calibrated once)."""
        from timebill_msgs.msg import DeadlineTelemetry
        common = {'model': 'embedded', 'infeasible': 'best_effort', 'calibrate_on_start': True,
                  'calibration_quick': True, 'max_new_tokens_limit': 1024}
        settings = {'fp32': {'length_predictor': 'rlp'},
                    'int8': {'dtype': 'int8-dynamic', 'length_predictor': 'max-new-tokens'},
                    'standin': {'length_predictor': 'max-new-tokens'}}
        for name, extra in settings.items():
            if only and name not in only:
                continue
            log(f'starting node {name} ...')
            self.start_node(name, {**common, **extra}, NAMESPACES[name], f'bench_client_{name}',
                            prepare=lambda client, name=name: client.node.create_subscription(
                                DeadlineTelemetry, f'{NAMESPACES[name]}/timebill/telemetry',
                                self._on_telemetry, 100))

    def _on_telemetry(self, msg) -> None:
        with self._lock:
            self.telemetry[msg.goal_id] = msg

    def run(self, node: str, item: tasks.TaskItem, strategy: str, budget_s: float,
            **goal) -> Measured:
        """Send one goal, wait for its end and score it."""
        from timebill_msgs.action import Instruct
        from timebill_ros.tools.client import make_goal, outcome_name
        run = self.clients[node].ask(
            make_goal(item.instruction, budget_s, item.context,
                      max_new_tokens=item.max_new_tokens, **goal), budget_s + 180.0)
        if not run.accepted:
            return Measured(item.item_id, strategy, budget_s, False, 'REJECTED', False,
                            0.0, 0, 0.0, reason=run.reject_reason)
        res, plan = run.result, run.result.plan
        met = res.outcome == Instruct.Result.COMPLETED and res.deadline_met
        quality = metrics.score(item.metric, res.text, item.references)
        telemetry = self._telemetry_for(run.goal_id)
        return Measured(
            item.item_id, strategy, budget_s, True, outcome_name(res.outcome), met,
            res.e2e_s, res.tokens, quality, plan.eviction_ratio, plan.predicted_tokens,
            plan.worst_case_tokens, plan.est_wcet_s,
            telemetry.est_compute_s if telemetry else float('nan'),
            (telemetry.prefill_s + telemetry.decode_s) if telemetry else float('nan'),
            res.reason)

    def _telemetry_for(self, goal_id: str, wait_s: float = 2.0):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self._lock:
                if goal_id in self.telemetry:
                    return self.telemetry[goal_id]
            time.sleep(0.02)
        return None


def budgets_from(measured: list, count: int) -> list:
    """Return ``count`` budgets from 0.7x the fastest to 1.1x the slowest measured run."""
    times = [m.e2e_s for m in measured if m.accepted and m.outcome == 'COMPLETED']
    if not times:
        raise RuntimeError('no measured run completed; cannot place the budgets')
    low, high = 0.7 * min(times), 1.1 * max(times)
    step = (high - low) / max(1, count - 1)
    return [round(low + i * step, 2) for i in range(count)]


def kill_rows(runs_by_item: dict, budgets: list) -> list:
    """Replay runs (item -> Run) under Kill at each budget; one summary row per budget."""
    rows = []
    for budget in budgets:
        outcomes = [policies.kill(run, budget) for run in runs_by_item.values()]
        rows.append({'budget_s': budget, **policies.summary(outcomes)})
    return rows


def skip_rows(runs_at: dict, budgets: list) -> list:
    """Replay Skip-Next with period = budget; runs_at(budget) gives the item-ordered runs."""
    rows = []
    for budget in budgets:
        outcomes = policies.skip_next(runs_at[budget], budget, budget)
        rows.append({'budget_s': budget, **policies.summary(outcomes)})
    return rows


def kill_outcome(m: Measured) -> policies.Outcome:
    """Return a real Kill run's outcome: its score if in time, else 0."""
    if m.deadline_met:
        return policies.Outcome(policies.IN_TIME, m.score)
    return policies.Outcome(policies.KILLED, 0.0)


def real_rows(measured: list, budgets: list) -> list:
    """Summarise real runs (Kill) per budget: in time and the answer's score, else 0."""
    rows = []
    for budget in budgets:
        outcomes = [kill_outcome(m) for m in measured if m.budget_s == budget]
        rows.append({'budget_s': budget, **policies.summary(outcomes)})
    return rows


def as_run(m: Measured) -> policies.Run:
    """Turn a completed measurement into a replayable Run."""
    return policies.Run(m.e2e_s, min(1.0, max(0.0, m.score)))


def markdown(report: dict) -> str:
    """Render the report as a markdown page."""
    lines = [f"# TimeBill evaluation ({report['date']}, {report['machine']})", '',
             f"Command: `{report['command']}`; wall time {report['wall_min']:.1f} min.", '',
             f"Workload: {report['workload']}", '',
             f"Budgets (s): {', '.join(f'{b:g}' for b in report['budgets'])} "
             f"({report['budget_rule']}).", '',
             'Real = every goal sent through the node at that budget. Replayed = the '
             "strategy's loose-budget run replayed under the policy "
             '(benchmarks/policies.py).', '']
    for policy, by_strategy in report['sweep'].items():
        lines += [f'## {policy}', '',
                  '| strategy | source | ' + ' | '.join(f'{b:g} s' for b in report['budgets'])
                  + ' |', '|---|---|' + '---|' * len(report['budgets'])]
        for strategy, rows in by_strategy.items():
            source = report['sources'][policy][strategy]
            cells = [f"{r['completion_rate']:.0%} / {r['avg_score']:.3f}" for r in rows]
            lines.append(f'| {strategy} | {source} | ' + ' | '.join(cells) + ' |')
        lines += ['', 'Cells: completion rate / average score (0 for a missed deadline).', '']
    lines += ['## Fixed strategies measured with a loose budget', '',
              '| strategy | e2e s, mean | tokens, mean | score, mean |', '|---|---|---|---|']
    for strategy, row in report['measured_summary'].items():
        lines.append(f"| {strategy} | {row['e2e_s']:.2f} | {row['tokens']:.1f} | "
                     f"{row['score']:.3f} |")
    v = report['validation']
    lines += ['', '## Replay validation', '',
              f"Real Kill runs at {v['budget_s']:g} s of {', '.join(v['strategies'])}: outcome "
              f"agreement with the replay {v['agreement']:.0%} ({v['agree']}/{v['runs']}); "
              f"e2e of real completed runs vs their loose-budget runs: mean |error| "
              f"{v['e2e_abs_error_pct']:.1f} %.", '']
    e = report['ete']
    lines += ['## Execution-time estimate (TimeBill runs)', '',
              f"ETE for what ran vs measured prefill + decode: median |error| "
              f"{e['median_abs_error_pct']:.1f} %, max {e['max_abs_error_pct']:.1f} % over "
              f"{e['runs']} runs (ete_scatter.png).", '']
    lines += [f"## Pessimistic factor k at {report['k_budget_s']:g} s (TimeBill with the oracle "
              'length, Kill, real)', '',
              '| k | completion | avg score | mean alpha |', '|---|---|---|---|']
    for row in report['k_ablation']:
        lines.append(f"| {row['k']:g} | {row['completion_rate']:.0%} | {row['avg_score']:.3f} |"
                     f" {row['mean_alpha']:.2f} |")
    lines += ['', '## Length predictor (TimeBill, Kill, real, all budgets pooled)', '',
              '| predictor | completion | avg score | mean predicted tokens | mean alpha |',
              '|---|---|---|---|---|']
    for name, row in report['predictor_ablation'].items():
        lines.append(f"| {name} | {row['completion_rate']:.0%} | {row['avg_score']:.3f} | "
                     f"{row['mean_predicted']:.1f} | {row['mean_alpha']:.2f} |")
    lines += ['', 'Plots: completion.png, score.png, ete_scatter.png, k_ablation.png.', '']
    return '\n'.join(lines)


def k_only(args, out: Path, ks: tuple) -> int:
    """Rerun the k ablation of an earlier report (same items) and rewrite its outputs."""
    report = json.loads((out / 'bench.json').read_text())
    os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(120, 200)))
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    import rclpy
    from transformers import AutoTokenizer
    from timebill_msgs.action import Instruct
    from timebill_ros.runtime.model import resolve_source
    tokenizer = AutoTokenizer.from_pretrained(resolve_source('embedded')[0])
    wanted = [(i['task'], i['id']) for i in report['items']]
    per_task = {t: sum(1 for task, _ in wanted if task == t) for t, _ in wanted}
    items = [i for t, n in per_task.items()
             for i in tasks.select(t, tokenizer, n, args.min_tokens, args.max_tokens, args.seed)]
    if [(i.task, i.item_id) for i in items] != wanted:
        raise SystemExit('bench --k-only: the selected items differ from the report\'s '
                         '(use the same --min-tokens/--max-tokens/--seed)')
    vanilla = {r['item']: r['tokens'] for r in report['runs']
               if r['strategy'] == 'Vanilla' and r['budget_s'] == LOOSE_BUDGET_S}
    budget = args.k_budget or report['budgets'][len(report['budgets']) // 2]
    rclpy.init()
    bench = TimeBillBench(items, out)
    try:
        bench.start(print, only=('fp32',))
        runs = {k: [bench.run('fp32', item, f'TimeBill (oracle length) k={k:g}', budget,
                              mode=Instruct.Goal.MODE_EVICTION, pessimistic_factor=k,
                              expected_tokens=max(1, vanilla[item.item_id]))
                    for item in items] for k in ks}
    finally:
        bench.stop()
        rclpy.try_shutdown()
    report['k_budget_s'] = budget
    report['k_ablation'] = [{'k': k, **pooled(r)} for k, r in runs.items()]
    report['runs'] = [r for r in report['runs'] if ' k=' not in r['strategy']] + \
        [vars(m) for r in runs.values() for m in r]
    report['k_command'] = 'python -m benchmarks.bench_timebill ' + ' '.join(
        shlex.quote(a) for a in sys.argv[1:])
    (out / 'bench.json').write_text(json.dumps(report, indent=1, default=float) + '\n')
    (out / 'README.md').write_text(markdown(report))
    plots.ablation(report['k_ablation'], 'k', 'pessimistic factor k', out / 'k_ablation.png',
                   f'TimeBill (oracle length), Kill, budget {budget:g} s')
    print(markdown(report))
    return 0


def pooled(runs: list) -> dict:
    """Summarise real Kill runs: completion, score, mean predicted length and alpha."""
    outcomes = [kill_outcome(m) for m in runs]
    accepted = [m for m in runs if m.accepted]
    return {**policies.summary(outcomes),
            'mean_predicted': statistics.mean(m.predicted for m in accepted) if accepted
            else float('nan'),
            'mean_alpha': statistics.mean(m.alpha for m in accepted) if accepted
            else float('nan')}


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--quick', action='store_true',
                        help='1 item per task, 2 fixed ratios, 4 budgets, k in 1,2,4,8')
    parser.add_argument('--per-task', type=int, default=None,
                        help='items per task (default 2, quick 1)')
    parser.add_argument('--tasks', default=','.join(tasks.TASKS),
                        help=f'comma-separated tasks from {tasks.TASKS}')
    parser.add_argument('--budgets', type=int, default=None,
                        help='number of budgets in the sweep (default 6, quick 4)')
    parser.add_argument('--min-tokens', type=int, default=800, help='shortest prompt (tokens)')
    parser.add_argument('--max-tokens', type=int, default=2200, help='longest prompt (tokens)')
    parser.add_argument('--seed', type=int, default=0, help='item selection seed')
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    parser.add_argument('--k-budget', type=float, default=0.0,
                        help='budget of the k ablation (default: the middle of the sweep)')
    parser.add_argument('--k-only', action='store_true',
                        help="rerun only the k ablation against --out's bench.json (same "
                             'items and Vanilla lengths) and update its report')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Run the benchmark and write the report."""
    args = parse_args(argv)
    quick = args.quick
    per_task = args.per_task or (1 if quick else 2)
    n_budgets = args.budgets or (4 if quick else 6)
    alphas = QUICK_ALPHAS if quick else ALPHAS
    ks = (1.0, 2.0, 4.0, 8.0) if quick else tuple(float(k) for k in range(1, 9))
    task_names = [t for t in args.tasks.split(',') if t]
    out = harness.claim_out(args.out, 'timebill')
    started = time.monotonic()
    if args.k_only:
        return k_only(args, out, ks)

    log = stamped_log(started)

    # Own DDS domain: the bench's nodes must not meet another graph on this machine.
    os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(120, 200)))
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    import rclpy
    from transformers import AutoTokenizer
    from timebill_msgs.action import Instruct
    from timebill_ros.runtime.model import resolve_source
    G = Instruct.Goal

    path, _ = resolve_source('embedded')
    tokenizer = AutoTokenizer.from_pretrained(path)
    items = []
    for task in task_names:
        items += tasks.select(task, tokenizer, per_task, args.min_tokens, args.max_tokens,
                              args.seed)
    log(f'{len(items)} items: ' + ', '.join(f'{i.task}:{i.prompt_tokens}' for i in items))

    rclpy.init()
    bench = TimeBillBench(items, out)
    try:
        bench.start(log)
        # 1. Fixed strategies, loose budget (interleaved per item so drift hits all alike).
        measured = []
        for item in items:
            measured.append(bench.run('standin', item, 'Vanilla', LOOSE_BUDGET_S,
                                      mode=G.MODE_NONE))
            for alpha in alphas:
                measured.append(bench.run('standin', item, f'alpha={alpha:g}', LOOSE_BUDGET_S,
                                          mode=G.MODE_EVICTION, eviction_ratio=alpha))
            measured.append(bench.run('int8', item, 'int8 (Vanilla)', LOOSE_BUDGET_S,
                                      mode=G.MODE_NONE))
            log(f'measured {item.task} {item.item_id}: ' + ', '.join(
                f'{m.strategy} {m.e2e_s:.1f}s/{m.score:.2f}' for m in measured[-len(alphas) - 2:]))
        budgets = budgets_from(measured, n_budgets)
        log(f'budgets {budgets}')
        vanilla_tokens = {m.item: m.tokens for m in measured if m.strategy == 'Vanilla'}

        # 3. TimeBill and its ablations, real runs.
        timebill, standin, oracle = [], [], []
        for budget in budgets:
            for item in items:
                timebill.append(bench.run('fp32', item, 'TimeBill', budget,
                                          mode=G.MODE_EVICTION))
                standin.append(bench.run('standin', item, 'TimeBill (stand-in)', budget,
                                         mode=G.MODE_EVICTION))
                oracle.append(bench.run('fp32', item, 'TimeBill (oracle length)', budget,
                                        mode=G.MODE_EVICTION,
                                        expected_tokens=max(1, vanilla_tokens[item.item_id])))
            log(f'budget {budget:g} s: TimeBill in time {sum(m.deadline_met for m in timebill[-len(items):])}/{len(items)}')  # noqa: E501
        k_budget = args.k_budget or budgets[len(budgets) // 2]
        # k scales N_hat; the shipped head predicts at or above max_new_tokens here, which
        # makes k inert, so the ablation plans from the oracle length (as a good RLP would).
        k_runs = {k: [bench.run('fp32', item, f'TimeBill (oracle length) k={k:g}', k_budget,
                                mode=G.MODE_EVICTION, pessimistic_factor=k,
                                expected_tokens=max(1, vanilla_tokens[item.item_id]))
                      for item in items] for k in ks}
        log('k ablation done')
        # 4. Replay validation: real Kill runs of two fixed strategies at a middle budget.
        v_budget = budgets[len(budgets) // 2]
        v_alpha = alphas[len(alphas) // 2]
        validation = []
        for item in items:
            validation.append(bench.run('standin', item, 'Vanilla', v_budget,
                                        mode=G.MODE_NONE))
            validation.append(bench.run('standin', item, f'alpha={v_alpha:g}', v_budget,
                                        mode=G.MODE_EVICTION, eviction_ratio=v_alpha))
        log('validation done')
    finally:
        bench.stop()
        rclpy.try_shutdown()

    # Replays and summaries.
    strategies = ['Vanilla'] + [f'alpha={a:g}' for a in alphas] + ['int8 (Vanilla)']
    fixed_runs = {s: {m.item: as_run(m) for m in measured if m.strategy == s}
                  for s in strategies}
    order = [i.item_id for i in items]
    sweep = {'Kill': {}, 'Skip-Next': {}}
    sources = {'Kill': {}, 'Skip-Next': {}}
    for s in strategies:
        sweep['Kill'][s] = kill_rows(fixed_runs[s], budgets)
        sources['Kill'][s] = 'replayed'
        sweep['Skip-Next'][s] = skip_rows({b: [fixed_runs[s][i] for i in order]
                                           for b in budgets}, budgets)
        sources['Skip-Next'][s] = 'replayed'
    sweep['Kill']['TimeBill'] = real_rows(timebill, budgets)
    sources['Kill']['TimeBill'] = 'real'
    by_budget = {b: {m.item: m for m in timebill if m.budget_s == b} for b in budgets}
    # A TimeBill run killed at its deadline has no full e2e: replay it as overrunning.
    sweep['Skip-Next']['TimeBill'] = skip_rows(
        {b: [as_run(by_budget[b][i]) if by_budget[b][i].deadline_met
             else policies.Run(b * 1.000001 + 1e-6, 0.0) for i in order] for b in budgets},
        budgets)
    sources['Skip-Next']['TimeBill'] = 'replayed from real runs at that budget'

    agree, errors = 0, []
    for m in validation:
        replay = policies.kill(fixed_runs[m.strategy][m.item], m.budget_s)
        agree += (replay.status == policies.IN_TIME) == m.deadline_met
        if m.deadline_met:
            ref = fixed_runs[m.strategy][m.item].e2e_s
            errors.append(abs(m.e2e_s - ref) / ref * 100.0)
    ete_points = [(m.est_compute_s, m.compute_s) for m in timebill + oracle + standin
                  if m.accepted and not math.isnan(m.est_compute_s) and m.compute_s > 0]
    ete_errors = [abs(e - a) / a * 100.0 for e, a in ete_points]

    report = {
        'date': datetime.date.today().isoformat(), 'machine': machine(),
        'machine_short': f'{platform.machine()} {os.cpu_count()} cpus',
        'command': 'python -m benchmarks.bench_timebill ' + ' '.join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        'wall_min': (time.monotonic() - started) / 60.0,
        'workload': '; '.join(
            f"{t}: {sum(i.task == t for i in items)} items, prompts "
            f"{min(i.prompt_tokens for i in items if i.task == t)}-"
            f"{max(i.prompt_tokens for i in items if i.task == t)} tokens, max new tokens "
            f"{tasks.MAX_NEW_TOKENS[t]}, metric {tasks.METRIC[t]}" for t in task_names),
        'items': [{'task': i.task, 'id': i.item_id, 'prompt_tokens': i.prompt_tokens}
                  for i in items],
        'budgets': budgets,
        'budget_rule': '0.7 x the fastest to 1.1 x the slowest loose-budget run, evenly spaced',
        'sweep': sweep, 'sources': sources,
        'measured_summary': {s: {
            'e2e_s': statistics.mean(r.e2e_s for r in fixed_runs[s].values()),
            'tokens': statistics.mean(m.tokens for m in measured if m.strategy == s),
            'score': statistics.mean(r.score for r in fixed_runs[s].values())}
            for s in strategies},
        'validation': {'budget_s': v_budget, 'strategies': ['Vanilla', f'alpha={v_alpha:g}'],
                       'runs': len(validation), 'agree': agree,
                       'agreement': agree / max(1, len(validation)),
                       'e2e_abs_error_pct': statistics.mean(errors) if errors else float('nan')},
        'ete': {'runs': len(ete_errors),
                'median_abs_error_pct': statistics.median(ete_errors) if ete_errors
                else float('nan'),
                'max_abs_error_pct': max(ete_errors) if ete_errors else float('nan')},
        'k_budget_s': k_budget,
        'k_ablation': [{'k': k, **pooled(runs)} for k, runs in k_runs.items()],
        'predictor_ablation': {'RLP (shipped head)': pooled(timebill),
                               'stand-in (max_new_tokens)': pooled(standin),
                               'oracle (Vanilla answer length)': pooled(oracle)},
        'runs': [vars(m) for m in measured + timebill + standin + oracle + validation]
        + [vars(m) for runs in k_runs.values() for m in runs],
    }
    (out / 'bench.json').write_text(json.dumps(report, indent=1, default=float) + '\n')
    (out / 'README.md').write_text(markdown(report))
    plots.sweep(report, 'completion_rate', 'completion rate', out / 'completion.png')
    plots.sweep(report, 'avg_score', 'average score', out / 'score.png')
    plots.scatter([(e, a, 'TimeBill runs') for e, a in ete_points], out / 'ete_scatter.png',
                  'ETE for what ran vs measured prefill + decode')
    plots.ablation(report['k_ablation'], 'k', 'pessimistic factor k', out / 'k_ablation.png',
                   f'TimeBill, Kill, budget {k_budget:g} s')
    log(f'wrote {out}/README.md, bench.json and PNGs')
    print((out / 'README.md').read_text())
    return 0


if __name__ == '__main__':
    sys.exit(main())
