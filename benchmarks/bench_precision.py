# SPDX-License-Identifier: Apache-2.0
"""Precision as a planning dimension on the robot workload, through the node, per budget tier.

``python -m benchmarks.bench_precision`` (``make bench-precision``) reuses a
bench_robot run (``--reuse``, default results/robot_fallback/bench.json: its full-model
references, MODE_NONE, alpha 0.5, the int8 node and TimeBill AUTO with whole-model int8
switching) and runs TimeBill AUTO for real under Kill on two more nodes:

- ``TimeBill without precision``: ``auto_precision`` '' (eviction only);
- ``TimeBill with per-layer precision``: ``precision_mix`` 'shipped' (the knapsack DP
  lowers the least-KL layers a goal's deadline needs; whole-model int8 and the switch
  stay available).

``--fresh`` instead runs every strategy in this run, interleaved goal by goal so a drift
of the machine's speed lands on all of them: per tier and item, a full-model reference
(MODE_NONE, a generous budget, on the node without precision) whose time sets the
item's budget at that tier, then each strategy of ``FRESH`` (``--strategies``):
MODE_NONE on that node (full precision), on an int8-dynamic node (all-int8) and pinned
to int8-weight decoding (all-int8-weight: float32 prefill, weight-only int8 decode
steps); TimeBill AUTO without precision, with whole-model int8-dynamic or int8-weight
(and the switch; once with ``min_switch_speedup`` 1.2), and per layer at either format.
Alpha 0.5 is not run there.

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

from benchmarks import harness
from benchmarks.bench_robot import RobotBench, replay_kill, summarise
from benchmarks.harness import tier_budget
from benchmarks.paths import RESULTS
from timebill_ros.evaluation import metrics, robot_workload
from benchmarks.common import machine, shipped_params, stamped_log, StealMeter
from benchmarks.harness import write_outputs

NEW = {'noprec': ('TimeBill without precision', {'auto_precision': '', 'precision_mix': ''}),
       'mixed': ('TimeBill with per-layer precision', {'auto_precision': 'int8-dynamic',
                                                       'precision_mix': 'shipped'})}
NAMESPACES = {'noprec': '/prec_none', 'mixed': '/prec_mixed',
              'int8': '/prec_int8', 'int8w': '/prec_int8w', 'int8w_dyn': '/prec_int8w_dyn',
              'mixed_w': '/prec_mixed_w', 'int8w_sw': '/prec_int8w_sw'}
# --fresh: the nodes' parameters over the shipped ones. Each names its auto_precision, so
# a change of the shipped default changes no row. MODE_NONE never lowers precision: the
# full-precision goals run on the noprec node.
FRESH_NODES = {'int8': {'dtype': 'int8-dynamic', 'auto_precision': '', 'precision_mix': ''},
               'int8w': {'auto_precision': 'int8-weight', 'precision_mix': ''},
               'int8w_dyn': {'auto_precision': 'int8-dynamic', 'precision_mix': ''},
               'mixed_w': {'auto_precision': 'int8-weight', 'precision_mix': 'shipped'},
               'int8w_sw': {'auto_precision': 'int8-weight', 'precision_mix': '',
                            'min_switch_speedup': 1.2},
               **{key: params for key, (_, params) in NEW.items()}}
# --fresh: strategy -> (node, goal mode, pinned precision)
FRESH = {'full precision': ('noprec', 'MODE_NONE', ''),
         'all-int8': ('int8', 'MODE_NONE', ''),
         'all-int8-weight': ('int8w', 'MODE_NONE', 'int8-weight'),
         'TimeBill without precision': ('noprec', 'MODE_AUTO', ''),
         'TimeBill, whole-model int8': ('int8w_dyn', 'MODE_AUTO', ''),
         'TimeBill, whole-model int8-weight': ('int8w', 'MODE_AUTO', ''),
         'TimeBill, int8-weight, switch at 1.2x': ('int8w_sw', 'MODE_AUTO', ''),
         'TimeBill with per-layer precision': ('mixed', 'MODE_AUTO', ''),
         'TimeBill with per-layer int8-weight': ('mixed_w', 'MODE_AUTO', '')}
STRATEGIES = ('full precision', 'all-int8', 'all-int8-weight', 'alpha 0.5',
              'TimeBill without precision', 'TimeBill, whole-model int8',
              'TimeBill, whole-model int8-weight', 'TimeBill, int8-weight, switch at 1.2x',
              'TimeBill with per-layer precision',
              'TimeBill with per-layer int8-weight')
TIERS = ('0.5x', '0.75x', '0.9x', '1x', '1.25x')


def fidelity(runs: list, refs: dict) -> float:
    """Return the mean ROUGE-L of in-time answers to the full-precision answers."""
    scores = [metrics.rouge_l(r['text'], refs[r['item']]) if refs[r['item']].strip()
              else float(r['text'] == refs[r['item']]) for r in runs if r['met']]
    return statistics.mean(scores) if scores else math.nan


def steal_line(steal: dict, tiers) -> list:
    """Return the README lines on the CPU time the host gave other guests, per tier."""
    known = [t for t in tiers if steal.get(t) is not None]
    if not known:
        return []
    return ['CPU steal (time the host gave other guests) while each tier ran: '
            + ', '.join(f'{t} {steal[t]:.0%}' for t in known) + '.', '']


def markdown(report: dict) -> str:
    """Render the README tables."""
    tiers = report['tiers']
    lines = [f"# Precision on the robot workload ({report['date']})", '',
             f"`{report['command']}` on {report['machine']}; {report['items']} held-out items, "
             f"{report['minutes']:.1f} min; Kill. " + (
                 'Every strategy ran in this run, interleaved goal by goal; budgets are tiers '
                 "of each item's full-model time (MODE_NONE on the node without precision), "
                 "measured again just before the item's runs at each tier."
                 if report.get('fresh') else
                 f"Runs reused from `{report['reused']}` (measured on "
                 f"{report.get('reused_machine', '?')}) for full precision, all-int8, alpha "
                 "0.5 and TimeBill with whole-model int8; budgets are the same tiers of that "
                 "run's full-model times for every strategy. Rows from another machine "
                 'compare only where its speeds match this one.'), '',
             *steal_line(report.get('steal', {}), tiers),
             '## Deadline met / false rejections / FAILED', '',
             '| strategy | ' + ' | '.join(tiers) + ' |', '|---|' + '---|' * len(tiers)]
    names = [name for name in STRATEGIES if name in report['table'][tiers[0]]]
    for name in names:
        cells = [f"{s['met_rate']:.0%} / {s['false_rejections']} / {s['failed']}"
                 for s in (report['table'][t][name] for t in tiers)]
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    lines += ['', '## Quality of in-time answers: task score / fidelity to full precision', '',
              '| strategy | ' + ' | '.join(tiers) + ' |', '|---|' + '---|' * len(tiers)]
    for name in names:
        cells = []
        for t in tiers:
            s = report['table'][t][name]
            cells.append('-' if math.isnan(s['quality']) else
                         f"{s['quality']:.2f} / {s['fidelity']:.2f}")
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    for name, modes in report['mixed_modes'].items():
        if name not in names:
            continue
        lines += ['', f'## What {name} ran (goals that ran)', '',
                  '| tier | full | mixed | mean units lowered | whole int8 | switched to int8 |',
                  '|---|---|---|---|---|---|']
        for t in tiers:
            m = modes[t]
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
    for name in [n for n in STRATEGIES if n in report['table'][tiers[0]]]:
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


def plan_kinds(runs: list) -> dict:
    """Count what the goals that ran were planned at: full, mixed, whole int8, switched."""
    ran = [r for r in runs if r['outcome'] != 'REJECTED']
    mixed = [r for r in ran if r.get('precision') == 'mixed']
    return {'full': sum(not r.get('precision') and not r.get('switched') for r in ran),
            'mixed': len(mixed),
            'mean_lowered': statistics.mean(r.get('lowered', 0) for r in mixed)
            if mixed else 0.0,
            'int8': sum(r.get('precision') in ('int8-dynamic', 'int8-weight') for r in ran),
            'switched': sum(bool(r.get('switched')) for r in ran)}


def tables(tiers, items: list, runs_of, refs: dict, planned: dict) -> tuple:
    """Return (table, mixed_modes): per tier, each strategy's figures and the mixed plans.

    ``runs_of(tier)`` returns {strategy: runs} of the chosen items; ``planned`` is
    {TimeBill strategy: {tier: runs}}, whose plans are counted by kind.
    """
    by_id = {item.id: item for item in items}
    table = {}
    for tier in tiers:
        strategies = runs_of(tier)
        none_met = {r['item']: r['met'] for r in strategies['full precision']}
        table[tier] = {name: {**summarise(runs, by_id, refs, none_met),
                              'fidelity': fidelity(runs, refs)}
                       for name, runs in strategies.items()}
    mixed_modes = {name: {tier: plan_kinds(runs.get(tier, [])) for tier in tiers}
                   for name, runs in planned.items() if runs}
    for tier in table:  # per-item scores stay in the runs
        for figures in table[tier].values():
            figures.pop('scores', None)
    return table, mixed_modes


def fresh_rounds(runs: dict, tiers, items: list, names: list, run, reference_budget: float,
                 done=lambda tier: None) -> None:
    """Fill ``runs``: per tier and item a reference, then each strategy at its budget.

    ``run(name, item, budget)`` runs one goal ('reference' is the full model at
    ``reference_budget``). The reference runs just before the item's strategies, so a
    drift of the machine's speed over the run moves each budget with the runs it bounds.
    """
    for tier in tiers:
        for i, item in enumerate(items):
            reference = run('reference', item, reference_budget)
            runs['reference'].setdefault(tier, []).append(reference)
            budget = tier_budget(tier, reference['e2e_s'])
            # Rotate the order so no strategy always runs first after the reference.
            for name in names[i % len(names):] + names[:i % len(names)]:
                runs[name].setdefault(tier, []).append(run(name, item, budget))
        done(tier)


def main_fresh(args, argv) -> int:
    """Run references and every strategy interleaved, then write the outputs."""
    from timebill_msgs.action import Instruct
    from timebill_ros.tools.client import ensure_init
    import benchmarks.bench_robot as robot
    G = Instruct.Goal
    out = harness.claim_out(args.out, 'precision_robot', resumable=True)
    items = robot_workload.load('test')
    if args.items:
        items = items[:args.items]
    started = time.monotonic()
    log = stamped_log(started)
    ensure_init()
    robot.NAMESPACES.update(NAMESPACES)
    bench = RobotBench(log)
    runs: dict = {'reference': {}, **{name: {} for name in FRESH}}  # unrun ones stay empty
    names = ['full precision', *[n for n in args.strategies if n != 'full precision']]

    def run(name: str, item, budget: float) -> dict:
        if name == 'reference':
            return bench.run('noprec', item, budget, G.MODE_NONE)
        node, mode, precision = FRESH[name]
        return bench.run(node, item, budget, getattr(G, mode), precision=precision)

    steal, meter = {}, StealMeter()

    def done(tier: str) -> None:
        steal[tier] = meter.share()
        log(f'tier {tier} done')
        (out / 'partial.json').write_text(json.dumps(runs) + '\n', encoding='utf-8')

    try:
        for node, params in FRESH_NODES.items():
            if any(FRESH[name][0] == node for name in names):
                bench.start(node, params)
        meter.share()  # the tiers' steal, not the start-up's
        fresh_rounds(runs, args.tiers, items, names, run, args.reference_budget, done)
    finally:
        bench.stop()
    refs = {r['item']: r['text'] for r in runs['reference'][args.tiers[0]]}
    planned = {name: runs[name] for name in names if FRESH[name][1] == 'MODE_AUTO'}
    table, mixed_modes = tables(args.tiers, items,
                                lambda tier: {name: runs[name][tier] for name in names},
                                refs, planned)
    report = {'date': datetime.date.today().isoformat(), 'machine': machine(),
              'command': 'python -m benchmarks.bench_precision '
                         + ' '.join(argv if argv is not None else sys.argv[1:]),
              'items': len(items), 'minutes': (time.monotonic() - started) / 60,
              'tiers': list(args.tiers), 'fresh': True, 'reused': '',
              'shipped_params': shipped_params(), 'nodes': FRESH_NODES, 'steal': steal,
              'table': table,
              'mixed_modes': mixed_modes, 'runs': runs}
    write_outputs(out, report, markdown, plot)
    return 0


def main(argv=None) -> int:
    """Run the new strategies, merge the reused ones and write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    parser.add_argument('--reuse', default=str(RESULTS / 'robot_fallback' /
                                               'bench.json'))
    parser.add_argument('--tiers', nargs='+', default=list(TIERS))
    parser.add_argument('--items', type=int, default=0, help='first N items only (0: all)')
    parser.add_argument('--nodes', nargs='+', default=list(NEW), choices=tuple(NEW))
    parser.add_argument('--fresh', action='store_true',
                        help='run every strategy now, interleaved (no --reuse)')
    parser.add_argument('--strategies', nargs='+', default=list(FRESH), choices=tuple(FRESH),
                        help='--fresh: the strategies to run (full precision always runs)')
    parser.add_argument('--reference-budget', type=float, default=60.0,
                        help='--fresh: budget (s) of the full-model reference goals')
    args = parser.parse_args(argv)
    if args.fresh:
        return main_fresh(args, argv)
    from timebill_msgs.action import Instruct
    from timebill_ros.tools.client import ensure_init
    import benchmarks.bench_robot as robot
    G = Instruct.Goal
    out = harness.claim_out(args.out, 'precision_robot', resumable=True)
    with open(args.reuse, encoding='utf-8') as handle:
        reused = json.load(handle)
    old, reused_machine = reused['runs'], reused.get('machine', '?')
    items = [item for item in robot_workload.load('test')
             if item.id in {r['item'] for r in old['reference']}]
    if args.items:
        items = items[:args.items]
    ids = {item.id for item in items}
    full = {r['item']: r['e2e_s'] for r in old['reference']}
    refs = {r['item']: r['text'] for r in old['reference']}
    started = time.monotonic()

    log = stamped_log(started)
    ensure_init()
    robot.NAMESPACES.update(NAMESPACES)
    bench, new = RobotBench(log), {}
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

    def runs_of(tier: str) -> dict:
        budgets = {item.id: tier_budget(tier, full[item.id]) for item in items}
        strategies = {
            'full precision': old['none_real'][tier] if tier in old['none_real'] else
            [replay_kill(r, budgets[r['item']]) for r in old['reference']],
            'all-int8': [replay_kill(r, budgets[r['item']]) for r in old['int8']],
            'alpha 0.5': [replay_kill(r, budgets[r['item']]) for r in old['alpha 0.5']],
            'TimeBill, whole-model int8': old['auto'][tier],
            **{NEW[key][0]: new[key][tier] for key in NEW if tier in new.get(key, {})}}
        return {name: mine(runs) for name, runs in strategies.items()}
    table, mixed_modes = tables(args.tiers, items, runs_of, refs,
                                {NEW['mixed'][0]: new.get('mixed', {})})
    report = {'date': datetime.date.today().isoformat(), 'machine': machine(),
              'command': 'python -m benchmarks.bench_precision '
                         + ' '.join(argv if argv is not None else sys.argv[1:]),
              'items': len(items), 'minutes': (time.monotonic() - started) / 60,
              'tiers': list(args.tiers), 'reused': args.reuse,
              'reused_machine': reused_machine,
              'shipped_params': shipped_params(), 'table': table, 'mixed_modes': mixed_modes,
              'runs': new}
    write_outputs(out, report, markdown, plot)
    return 0


if __name__ == '__main__':
    sys.exit(main())
