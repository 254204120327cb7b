# SPDX-License-Identifier: Apache-2.0
"""Scheduling benchmark: robot instructions replayed from rosbags through the node, per strategy.

``python -m benchmarks.bench_sched`` (``make bench-sched``) starts the node with
the shipped configuration and one strategy at a time: a ``scheduler`` (fifo, edf, svf,
svf-1bit), ``edf+batch4`` (EDF with ``max_batch`` 4: goals decode together), ``edf, no
wait check`` (EDF with ``queue_aware_admission`` off: a goal is refused only when it could
not make its deadline on an idle node) and
``edf-admit-all`` (EDF with queue-aware admission off and ``admit_probability`` 0, so
only malformed goals are refused; it counts false rejections: goals another strategy
refused that this one met in the same workload).
For every arrival pattern (periodic, Poisson, bursts of 4) and load it writes a
rosbag of held-out robot-workload instructions (``timebill_bag``'s writer) and
replays it against the node (``tools/replay.py``: Instructions on ``~/instructions``,
every Response recorded; a request without one is MISSING, never dropped).

Load rho = arrival rate x mean full-model time of the items sent; each item's
full-model time T and its budget (a factor of T, cycled from ``--factors``) come
from the references of a bench_robot run (``--reference``). Goals use MODE_AUTO
and Kill. Per scheduler, pattern and load: deadline-met rate, goodput (goals met
per second of the run), P50/P99 queue wait, rejections, false rejections, lost goals,
tokens/s. ``--reuse`` takes runs of an earlier bench.json with the same items, seed and
factors instead of replaying them again. Outputs in --out (default results/sched):
bench.json, README.md, met_rate.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
import random
import shutil
import statistics
import sys
import time

import numpy as np

from benchmarks import harness
from timebill_ros.core.workload import arrivals, MODES, POLICIES, WorkloadItem
from timebill_ros.evaluation import robot_workload
from benchmarks.common import machine, shipped_params, stamped_log
from benchmarks.harness import write_outputs
from benchmarks.paths import RESULTS

NAMESPACE = '/sched'
SCHEDULERS = ('fifo', 'edf', 'svf', 'svf-1bit')
ADMIT_ALL = 'edf-admit-all'
# Strategy name -> node parameters over the shipped configuration.
# Each strategy names its max_batch: the shipped YAML's may differ.
STRATEGIES = {**{name: {'scheduler': name, 'max_batch': 1} for name in SCHEDULERS},
              'edf+batch4': {'scheduler': 'edf', 'max_batch': 4},
              'edf, no wait check': {'scheduler': 'edf', 'queue_aware_admission': False,
                                     'max_batch': 1},
              'edf+batch4, admit-all': {'scheduler': 'edf', 'max_batch': 4,
                                        'queue_aware_admission': False,
                                        'admit_probability': 0.0},
              ADMIT_ALL: {'scheduler': 'edf', 'queue_aware_admission': False,
                          'admit_probability': 0.0, 'max_batch': 1}}
PATTERNS = ('periodic', 'poisson', 'burst')
BURST_SIZE = 4


def workload(items: list, full_s: dict, factors: tuple, pattern: str, load: float,
             seed: int, goals: int = 0) -> list:
    """Return the WorkloadItems of one run, arrivals at ``load``.

    ``goals`` (default: as many as items) are drawn from ``items`` in a seeded order.
    """
    rng = random.Random(seed)
    chosen = [rng.choice(items) for _ in range(goals or len(items))]
    mean_s = statistics.fmean(full_s[item.id] for item in chosen)
    rate = load / mean_s
    times = arrivals(pattern, len(chosen), period_s=BURST_SIZE / rate if pattern == 'burst'
                     else 1.0 / rate, rate_hz=rate, burst_size=BURST_SIZE, seed=seed)
    return [WorkloadItem(id=f'{pattern}-{load:g}-{i:03d}-{item.id}',
                         instruction=item.instruction, context=item.context,
                         budget_s=round(factors[i % len(factors)] * full_s[item.id], 3),
                         arrival_s=float(t), policy=POLICIES['kill'], mode=MODES['auto'])
            for i, (item, t) in enumerate(zip(chosen, times))]


def summarise(rows: list, span_s: float) -> dict:
    """Return the figures of one replay's rows."""
    n = len(rows)
    met = sum(bool(r.get('deadline_met')) and r['outcome'] == 'COMPLETED' for r in rows)
    waits = [r['queue_s'] for r in rows if r.get('queue_s') is not None
             and r['outcome'] not in ('REJECTED', 'MISSING')]
    tokens = sum(int(r.get('tokens') or 0) for r in rows)
    return {'goals': n, 'met': met, 'met_rate': met / n if n else 0.0,
            'goodput_per_s': met / span_s if span_s > 0 else 0.0,
            'queue_p50_s': float(np.percentile(waits, 50)) if waits else 0.0,
            'queue_p99_s': float(np.percentile(waits, 99)) if waits else 0.0,
            'rejected': sum(r['outcome'] == 'REJECTED' for r in rows),
            'killed': sum(r['outcome'] == 'KILLED' for r in rows),
            'lost': sum(r['outcome'] == 'MISSING' for r in rows),
            'tokens_per_s': tokens / span_s if span_s > 0 else 0.0, 'span_s': span_s}


def strategy_of(run: dict) -> str:
    """Return a run's strategy (runs of the first version name only their scheduler)."""
    return run.get('strategy') or run['scheduler']


def false_rejections(runs: list) -> None:
    """Count, per run, goals it refused that ``edf-admit-all`` met in the same workload.

    Sets ``summary['false_rejected']`` (None where that workload has no admit-all run).
    """
    met_by = {(r['pattern'], r['load']): {row['id'] for row in r['rows']
                                          if row['outcome'] == 'COMPLETED'
                                          and row.get('deadline_met')}
              for r in runs if strategy_of(r) == ADMIT_ALL}
    for run in runs:
        met = met_by.get((run['pattern'], run['load']))
        run['summary']['false_rejected'] = None if met is None else sum(
            row['outcome'] == 'REJECTED' and row['id'] in met for row in run['rows'])


def markdown(report: dict) -> str:
    """Render the README tables: met rate per strategy and workload, then every figure."""
    runs = report['runs']
    workloads = sorted({(r['pattern'], r['load']) for r in runs})
    strategies = [name for name in STRATEGIES if any(strategy_of(r) == name for r in runs)]
    lines = [f"# Scheduling through the node ({report['date']})", '',
             f"`{report['command']}` on {report['machine']}; "
             f"{report.get('goals', report['items'])} goals per run drawn from "
             f"{report['items']} held-out robot items, budgets {report['factors']} x each "
             "item's full-model time, "
             f"MODE_AUTO, Kill; {report['minutes']:.1f} min"
             + (f" (runs reused from {report['reused_from']})" if report.get('reused_from')
                else '') + '.', '',
             'Deadline met (lost goals in brackets):', '',
             '| strategy | ' + ' | '.join(f'{p} {lo:g}' for p, lo in workloads) + ' | mean |',
             '|---|' + '---|' * (len(workloads) + 1)]
    for name in strategies:
        cells, rates = [], []
        for pattern, load in workloads:
            run = next((r for r in runs if strategy_of(r) == name and r['pattern'] == pattern
                        and r['load'] == load), None)
            if run is None:
                cells.append('')
                continue
            rates.append(run['summary']['met_rate'])
            cells.append(f"{run['summary']['met_rate']:.0%} ({run['summary']['lost']})")
        mean = f'{sum(rates) / len(rates):.1%}' if rates else ''
        lines.append(f'| {name} | ' + ' | '.join(cells) + f' | {mean} |')
    lines += ['', 'False rejections: goals a strategy refused that `edf-admit-all` met in the '
              'same workload.', '',
              '| pattern | load | strategy | met | goodput /s | queue P50 s | queue P99 s | '
              'rejected | false rej. | killed | lost | tokens/s |',
              '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for run in sorted(runs, key=lambda r: (r['pattern'], r['load'],
                                           strategies.index(strategy_of(r)))):
        s = run['summary']
        false = s.get('false_rejected')
        lines.append(f"| {run['pattern']} | {run['load']:g} | {strategy_of(run)} | "
                     f"{s['met_rate']:.0%} ({s['met']}/{s['goals']}) | "
                     f"{s['goodput_per_s']:.3f} | {s['queue_p50_s']:.2f} | "
                     f"{s['queue_p99_s']:.2f} | {s['rejected']} | "
                     f"{'' if false is None else false} | {s['killed']} | "
                     f"{s['lost']} | {s['tokens_per_s']:.1f} |")
    return '\n'.join(lines)


def plot(report: dict, out: Path) -> None:
    """Write met_rate.png: met rate per load, one panel per pattern, a line per scheduler."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    patterns = sorted({r['pattern'] for r in report['runs']})
    fig, axes = plt.subplots(1, len(patterns), figsize=(4.5 * len(patterns), 3.6),
                             squeeze=False)
    for ax, pattern in zip(axes[0], patterns):
        for name in sorted({strategy_of(r) for r in report['runs']}):
            runs = sorted((r for r in report['runs']
                           if r['pattern'] == pattern and strategy_of(r) == name),
                          key=lambda r: r['load'])
            ax.plot([r['load'] for r in runs], [r['summary']['met_rate'] for r in runs],
                    marker='o', label=name)
        ax.set_title(pattern)
        ax.set_xlabel('load (arrival rate x mean full-model time)')
        ax.set_ylim(0, 1.05)
    axes[0][0].set_ylabel('deadline met')
    axes[0][-1].legend()
    fig.tight_layout()
    fig.savefig(out / 'met_rate.png', dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    """Run the benchmark and write its outputs."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    parser.add_argument('--reference', default=str(RESULTS / 'robot_auto_int8' /
                                                   'bench.json'),
                        help="a bench_robot bench.json: each item's full-model time")
    parser.add_argument('--strategies', nargs='+',
                        default=['fifo', 'edf', 'svf', 'edf+batch4', 'edf, no wait check',
                                 ADMIT_ALL],
                        choices=tuple(STRATEGIES))
    parser.add_argument('--reuse', help='an earlier bench.json of the same items, seed and '
                        'factors: all its runs are kept, and only runs it lacks replay')
    parser.add_argument('--patterns', nargs='+', default=list(PATTERNS), choices=PATTERNS)
    parser.add_argument('--loads', nargs='+', type=float, default=[0.8, 1.5, 2.5])
    parser.add_argument('--items', type=int, default=30,
                        help='distinct held-out items (at most those in --reference)')
    parser.add_argument('--goals', type=int, default=0,
                        help='goals per run, drawn from the items (0: as many as items)')
    parser.add_argument('--factors', nargs='+', type=float, default=[1.5, 3.0, 6.0],
                        help="budgets as multiples of each item's full-model time, cycled")
    parser.add_argument('--seed', type=int, default=11)
    args = parser.parse_args(argv)
    from timebill_ros.tools.client import ensure_init
    from timebill_ros.tools.process import NodeProcess
    from timebill_ros.tools import bags
    from timebill_ros.tools.replay import replay

    out = harness.claim_out(args.out, 'sched', resumable=True)
    with open(args.reference, encoding='utf-8') as handle:
        reference = json.load(handle)['runs']['reference']
    full_s = {r['item']: r['e2e_s'] for r in reference}
    items = [item for item in robot_workload.load('test') if item.id in full_s]
    rng = random.Random(args.seed)
    items = rng.sample(items, min(args.items, len(items)))
    started = time.monotonic()

    log = stamped_log(started)

    reused = []
    if args.reuse:
        with open(args.reuse, encoding='utf-8') as handle:
            earlier = json.load(handle)
        if (earlier['items'], earlier.get('goals', earlier['items']), earlier['factors'],
                earlier['seed']) == (len(items), args.goals or len(items), args.factors,
                                     args.seed):
            reused = earlier['runs']  # all kept in the report; only missing runs replay
        else:
            log(f'{args.reuse} ran other items, factors or seed: nothing reused')
    ensure_init()
    runs = [{**r, 'strategy': strategy_of(r)} for r in reused]
    for name in args.strategies:
        todo = [(pattern, load) for pattern in args.patterns for load in args.loads
                if not any(strategy_of(r) == name and r['pattern'] == pattern
                           and r['load'] == load for r in runs)]
        if not todo:
            continue
        log(f'starting the node for strategy {name}')
        node = NodeProcess({**shipped_params(), **STRATEGIES[name]}, ready_timeout=900,
                           namespace=NAMESPACE)
        try:
            for pattern, load in todo:
                work = workload(items, full_s, tuple(args.factors), pattern, load, args.seed,
                                args.goals)
                slug = name.replace(', ', '-').replace(' ', '-')
                folder = out / 'runs' / f'{slug}-{pattern}-{load:g}'
                shutil.rmtree(folder, ignore_errors=True)
                bag = bags.write_workload(folder / 'workload_bag', work)
                begin = time.monotonic()
                result = replay(bag, folder, node=f'{NAMESPACE}/timebill',
                                timeout_s=120.0, discovery_timeout_s=30.0, render=False)
                summary = summarise(result.rows, time.monotonic() - begin)
                log(f'{name} {pattern} load {load:g}: met {summary["met"]}/'
                    f'{summary["goals"]}, rejected {summary["rejected"]}, lost '
                    f'{summary["lost"]}')
                runs.append({'strategy': name, 'scheduler': STRATEGIES[name]['scheduler'],
                             'pattern': pattern, 'load': load, 'summary': summary,
                             'rows': result.rows})
                (out / 'partial.json').write_text(json.dumps(runs, default=str) + '\n',
                                                  encoding='utf-8')
        finally:
            node.stop()
    false_rejections(runs)
    report = {'date': datetime.date.today().isoformat(), 'machine': machine(),
              'command': 'python -m benchmarks.bench_sched '
                         + ' '.join(argv if argv is not None else sys.argv[1:]),
              'items': len(items), 'goals': args.goals or len(items),
              'factors': args.factors, 'seed': args.seed,
              'minutes': (time.monotonic() - started) / 60, 'runs': runs,
              'reused_from': args.reuse if reused else ''}
    write_outputs(out, report, markdown, plot)
    return 0


if __name__ == '__main__':
    sys.exit(main())
