"""Precision as a planning dimension on the robot workload, through the node, per budget tier.

``python -m timebill_ros.cli.bench_precision`` (``make bench-precision``) reuses a
bench_robot run (``--reuse``, default results/robot_fallback/bench.json: its full-model
references, MODE_NONE, alpha 0.5, the int8 node and TimeBill AUTO with whole-model int8
switching) and runs TimeBill AUTO for real under Kill on two more nodes:

- ``TimeBill without precision``: ``auto_precision`` '' (eviction only);
- ``TimeBill with per-layer precision``: ``precision_mix`` 'shipped' (the knapsack DP
  lowers the least-KL layers a goal's deadline needs; whole-model int8 and the switch
  stay available).

Per tier and strategy: deadline met, false rejections, FAILED, task quality of in-time
answers (exact match where the item has a reference, else ROUGE-L to the reference
answer), fidelity (ROUGE-L to the full-precision answer) and which precision ran.
Outputs in --out (default results/precision_robot): bench.json, README.md, met_rate.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
from pathlib import Path
import statistics
import sys
import time

from timebill_ros.cli.bench_eviction import machine
from timebill_ros.cli.bench_robot import (
    Bench, replay_kill, shipped_params, summarise, tier_budget, write_outputs)
from timebill_ros.evaluation import metrics, robot_workload
from timebill_ros.cli.common import stamped_log

ROOT = Path(__file__).resolve().parents[2]
NAMESPACES = {'noprec': '/prec_none', 'mixed': '/prec_mixed'}
NEW = {'noprec': ('TimeBill without precision', {'auto_precision': '', 'precision_mix': ''}),
       'mixed': ('TimeBill with per-layer precision', {'precision_mix': 'shipped'})}
STRATEGIES = ('full precision', 'all-int8', 'alpha 0.5', 'TimeBill without precision',
              'TimeBill, whole-model int8', 'TimeBill with per-layer precision')
TIERS = ('0.5x', '0.75x', '0.9x', '1x', '1.25x')


def fidelity(runs: list, refs: dict) -> float:
    """Return the mean ROUGE-L of in-time answers to the full-precision answers."""
    scores = [metrics.rouge_l(r['text'], refs[r['item']]) if refs[r['item']].strip()
              else float(r['text'] == refs[r['item']]) for r in runs if r['met']]
    return statistics.mean(scores) if scores else math.nan


def markdown(report: dict) -> str:
    """Render the README tables."""
    tiers = report['tiers']
    lines = [f"# Precision on the robot workload ({report['date']})", '',
             f"`{report['command']}` on {report['machine']}; {report['items']} held-out items, "
             f"{report['minutes']:.1f} min; Kill. Runs reused from `{report['reused']}` "
             f"(measured on {report.get('reused_machine', '?')}) for full precision, "
             'all-int8, alpha 0.5 and TimeBill with whole-model int8; budgets are the same '
             "tiers of that run's full-model times for every strategy. Rows from another "
             'machine compare only where its speeds match this one.', '',
             '## Deadline met / false rejections / FAILED', '',
             '| strategy | ' + ' | '.join(tiers) + ' |', '|---|' + '---|' * len(tiers)]
    for name in STRATEGIES:
        cells = [f"{s['met_rate']:.0%} / {s['false_rejections']} / {s['failed']}"
                 for s in (report['table'][t][name] for t in tiers)]
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    lines += ['', '## Quality of in-time answers: task score / fidelity to full precision', '',
              '| strategy | ' + ' | '.join(tiers) + ' |', '|---|' + '---|' * len(tiers)]
    for name in STRATEGIES:
        cells = []
        for t in tiers:
            s = report['table'][t][name]
            cells.append('-' if math.isnan(s['quality']) else
                         f"{s['quality']:.2f} / {s['fidelity']:.2f}")
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    lines += ['', '## What TimeBill with per-layer precision ran (goals that ran)', '',
              '| tier | full | mixed | mean units lowered | whole int8 | switched to int8 |',
              '|---|---|---|---|---|---|']
    for t in tiers:
        m = report['mixed_modes'][t]
        lines.append(f"| {t} | {m['full']} | {m['mixed']} | {m['mean_lowered']:.1f} | "
                     f"{m['int8']} | {m['switched']} |")
    return '\n'.join(lines)


def plot(report: dict, out: Path) -> None:
    """Write met_rate.png: deadline met per tier, a line per strategy."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    tiers = report['tiers']
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for name in STRATEGIES:
        ax.plot(range(len(tiers)), [report['table'][t][name]['met_rate'] for t in tiers],
                marker='o', label=name)
    ax.set_xticks(range(len(tiers)), tiers)
    ax.set_xlabel("budget (x each item's full-model time)")
    ax.set_ylabel('deadline met')
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / 'met_rate.png', dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    """Run the new strategies, merge the reused ones and write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=str(ROOT / 'results' / 'precision_robot'))
    parser.add_argument('--reuse', default=str(ROOT / 'results' / 'robot_fallback' /
                                               'bench.json'))
    parser.add_argument('--tiers', nargs='+', default=list(TIERS))
    parser.add_argument('--items', type=int, default=0, help='first N items only (0: all)')
    parser.add_argument('--nodes', nargs='+', default=list(NEW), choices=tuple(NEW))
    args = parser.parse_args(argv)
    from timebill_ros.action import Instruct
    from timebill_ros.ros.client import ensure_init
    import timebill_ros.cli.bench_robot as robot
    G = Instruct.Goal
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(args.reuse, encoding='utf-8') as handle:
        reused = json.load(handle)
    old, reused_machine = reused['runs'], reused.get('machine', '?')
    items = [item for item in robot_workload.load('test')
             if item.id in {r['item'] for r in old['reference']}]
    if args.items:
        items = items[:args.items]
    ids = {item.id for item in items}
    by_id = {item.id: item for item in items}
    full = {r['item']: r['e2e_s'] for r in old['reference']}
    refs = {r['item']: r['text'] for r in old['reference']}
    started = time.monotonic()

    log = stamped_log(started)
    ensure_init()
    robot.NAMESPACES.update(NAMESPACES)
    bench, new = Bench(log), {}
    partial = out / 'partial.json'
    if partial.is_file():
        new = json.loads(partial.read_text(encoding='utf-8'))
    try:
        for key in args.nodes:
            todo = [t for t in args.tiers if t not in new.get(key, {})]
            if not todo:
                continue
            bench.start(key, NEW[key][1])
            for tier in todo:
                log(f'{NEW[key][0]}, Kill, tier {tier}')
                new.setdefault(key, {})[tier] = [
                    bench.run(key, item, tier_budget(tier, full[item.id]), G.MODE_AUTO)
                    for item in items]
                partial.write_text(json.dumps(new) + '\n', encoding='utf-8')
    finally:
        bench.stop()

    def mine(runs: list) -> list:
        return [r for r in runs if r['item'] in ids]
    table, mixed_modes = {}, {}
    for tier in args.tiers:
        budgets = {item.id: tier_budget(tier, full[item.id]) for item in items}
        strategies = {
            'full precision': old['none_real'][tier] if tier in old['none_real'] else
            [replay_kill(r, budgets[r['item']]) for r in old['reference']],
            'all-int8': [replay_kill(r, budgets[r['item']]) for r in old['int8']],
            'alpha 0.5': [replay_kill(r, budgets[r['item']]) for r in old['alpha 0.5']],
            'TimeBill, whole-model int8': old['auto'][tier],
            **{NEW[key][0]: new[key][tier] for key in NEW if tier in new.get(key, {})}}
        strategies = {name: mine(runs) for name, runs in strategies.items()}
        none_met = {r['item']: r['met'] for r in strategies['full precision']}
        table[tier] = {name: {**summarise(runs, by_id, refs, none_met),
                              'fidelity': fidelity(runs, refs)}
                       for name, runs in strategies.items()}
        ran = [r for r in new.get('mixed', {}).get(tier, []) if r['outcome'] != 'REJECTED']
        mixed = [r for r in ran if r.get('precision') == 'mixed']
        mixed_modes[tier] = {
            'full': sum(not r.get('precision') and not r.get('switched') for r in ran),
            'mixed': len(mixed),
            'mean_lowered': statistics.mean(r.get('lowered', 0) for r in mixed)
            if mixed else 0.0,
            'int8': sum(r.get('precision') == 'int8-dynamic' for r in ran),
            'switched': sum(bool(r.get('switched')) for r in ran)}
    report = {'date': datetime.date.today().isoformat(), 'machine': machine(),
              'command': 'python -m timebill_ros.cli.bench_precision '
                         + ' '.join(argv if argv is not None else sys.argv[1:]),
              'items': len(items), 'minutes': (time.monotonic() - started) / 60,
              'tiers': list(args.tiers), 'reused': args.reuse,
              'reused_machine': reused_machine,
              'shipped_params': shipped_params(), 'table': table, 'mixed_modes': mixed_modes,
              'runs': new}
    for tier in table:  # per-item scores stay in the runs
        for s in table[tier].values():
            s.pop('scores', None)
    write_outputs(out, report, markdown, plot)
    return 0


if __name__ == '__main__':
    sys.exit(main())
