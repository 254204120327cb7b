# SPDX-License-Identifier: Apache-2.0
"""Robot workload through the node: planning against the plain full model, per budget tier.

``python -m benchmarks.bench_robot`` (``make bench-robot``) starts the node
with the shipped configuration (config/timebill.yaml: calibrated length head read
in prefill, early exit, admission on P(answer fits)) and an int8-dynamic node, and
drives them with real action clients over the held-out split of the robot
workload (``evaluation.robot_workload``; ``--split train`` to look at the items
the predictor was trained on).

1. Reference: every item once with MODE_NONE and a loose budget. Its e2e time is
   the item's full-model time T, its answer the unconstrained reference.
2. Fixed strategies once each with a loose budget: eviction ratio 0.5
   (MODE_EVICTION) and int8-dynamic (MODE_NONE on the int8 node).
3. Budget tiers: 0.5x .. 2x of each item's T, plus 1, 2 and 5 s for every item.
4. TimeBill AUTO runs for real at every tier under Kill. Under Skip-Next the
   goals that Kill cut off are run again for real with SKIP_NEXT (to learn when
   they end); the others ran the same way (same plan, same tokens) and met their
   deadline. Jobs are released every budget seconds; which goal an overrun skips
   is replayed from those end times (evaluation/policies.py).
5. MODE_NONE runs for real at 0.9x and 1x under Kill (the replay of a run against
   its own time is degenerate at 1x) and is replayed at the other tiers, as are
   the fixed strategies; the real runs check the replay.

Per tier, strategy and policy: deadline-met rate, false rejections (rejected
though the full model met that budget), FAILED, late answers claimed on time,
quality of in-time answers (exact match where the item has a reference, else
ROUGE-L against the reference answer) and mean slack. Outputs in --out
(default results/robot): bench.json, README.md, met_rate.png, quality.png.
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
from benchmarks.common import machine, shipped_params, stamped_log
from benchmarks.harness import Nodes, tier_budget, write_outputs  # noqa: F401 (tier_budget: users)
from timebill_ros.evaluation import metrics, robot_workload

RELATIVE = (0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0)
ABSOLUTE = (1.0, 2.0, 5.0)
LOOSE_S = 120.0
NAMESPACES = {'fp32': '/robot_fp32', 'int8': '/robot_int8'}
STRATEGIES = ('MODE_NONE', 'alpha 0.5', 'int8-dynamic', 'TimeBill AUTO')


TIERS = tuple(f'{r:g}x' for r in RELATIVE) + tuple(f'{a:g}s' for a in ABSOLUTE)


class RobotBench(Nodes):
    """The harness's nodes; send goals and keep plain records of what came back."""

    def start(self, name: str, extra: dict, namespace: str = '') -> None:
        """Start one node with the shipped parameters plus ``extra``, in ``namespace``."""
        self.log(f'starting node {name} ...')
        self.start_node(name, {**shipped_params(), **extra}, namespace or NAMESPACES[name],
                        f'bench_client_{name}')

    def run(self, node: str, item, budget_s: float, mode: int, policy: int = 0,
            eviction_ratio: float = 0.0, precision: str = '') -> dict:
        """Send one goal (``precision``: pinned decode precision), return a plain record."""
        from timebill_msgs.action import Instruct
        from timebill_ros.tools.client import make_goal, outcome_name
        run = self.clients[node].ask(
            make_goal(item.instruction, budget_s, item.context, policy=policy, mode=mode,
                      eviction_ratio=eviction_ratio, precision=precision), budget_s + 180.0)
        if not run.accepted:
            return {'item': item.id, 'budget_s': budget_s, 'outcome': 'REJECTED',
                    'at': 'goal', 'met': False, 'e2e_s': 0.0, 'tokens': 0, 'text': '',
                    'reason': run.reject_reason}
        res, plan = run.result, run.result.plan
        return {'item': item.id, 'budget_s': budget_s, 'outcome': outcome_name(res.outcome),
                'at': 'prefill' if res.outcome == Instruct.Result.REJECTED else '',
                'met': bool(res.outcome == Instruct.Result.COMPLETED and res.deadline_met),
                'claimed': bool(res.deadline_met), 'e2e_s': res.e2e_s, 'tokens': res.tokens,
                'text': res.text, 'reason': res.reason, 'mode': int(plan.mode),
                'alpha': float(plan.eviction_ratio), 'predicted': int(plan.predicted_tokens),
                'worst': int(plan.worst_case_tokens), 'fit': float(plan.fit_probability),
                'note': plan.note, 'exit': list(plan.exit_layers),
                'precision': plan.precision, 'fallback': plan.fallback_precision,
                'switched': 'decoding from answer token' in res.reason,
                'lowered': int(getattr(plan, 'lowered_units', 0)),
                'mix': getattr(plan, 'precision_mix', '')}


def quality(item, text: str, reference: str) -> float:
    """Score an answer: exact match where the item has a reference, else ROUGE-L."""
    exact = robot_workload.score(item, text)
    if exact is not None:
        return exact
    return metrics.rouge_l(text, reference) if reference.strip() else float(text == reference)


def replay_kill(run: dict, budget_s: float) -> dict:
    """Return a loose-budget run as Kill at ``budget_s`` would have ended it."""
    met = run['outcome'] == 'COMPLETED' and run['e2e_s'] <= budget_s
    return {**run, 'budget_s': budget_s, 'met': met, 'claimed': met,
            'outcome': 'COMPLETED' if met else 'KILLED', 'text': run['text'] if met else '',
            'e2e_s': run['e2e_s'] if met else budget_s}


def skip_next(runs: list) -> list:
    """Replay Skip-Next over runs in release order, each released ``budget_s`` after the last.

    A run that overruns completes late; a job released before it ended is
    SKIPPED. Rejected jobs take no model time.
    """
    out, release, free, armed = [], 0.0, 0.0, False
    for run in runs:
        if armed and release <= free and run['outcome'] != 'REJECTED':
            out.append({**run, 'outcome': 'SKIPPED', 'met': False, 'claimed': False,
                        'text': ''})
            armed = False
        elif run['outcome'] in ('REJECTED', 'FAILED'):
            out.append(dict(run))
        else:
            armed = False
            start = max(release, free)
            free = start + run['e2e_s']
            met = run['outcome'] == 'COMPLETED' and free <= release + run['budget_s']
            out.append({**run, 'met': met, 'claimed': met})
            armed = not met
        release += run['budget_s']
    return out


def summarise(runs: list, items: dict, refs: dict, none_met: dict) -> dict:
    """Return a tier's figures for one strategy and policy."""
    n = len(runs)
    met = [r for r in runs if r['met']]
    rejected = [r for r in runs if r['outcome'] == 'REJECTED']
    false_rej = [r for r in rejected if none_met.get(r['item'])]
    scores = {r['item']: quality(items[r['item']], r['text'], refs[r['item']]) for r in met}
    return {'goals': n, 'met_rate': len(met) / n if n else math.nan,
            'rejected': len(rejected), 'false_rejections': len(false_rej),
            'false_rejection_rate': len(false_rej) / n if n else math.nan,
            'failed': sum(r['outcome'] == 'FAILED' for r in runs),
            'late_claimed_met': sum(bool(r.get('claimed')) and r['e2e_s'] > r['budget_s'] + 1e-3
                                    and r['outcome'] != 'REJECTED' for r in runs),
            'quality': statistics.mean(scores.values()) if scores else math.nan,
            'scores': scores,
            'mean_slack_s': statistics.mean(r['budget_s'] - r['e2e_s'] for r in met)
            if met else math.nan,
            'outcomes': {o: sum(r['outcome'] == o for r in runs)
                         for o in sorted({r['outcome'] for r in runs})}}


def same_item_quality(a: dict, b: dict) -> tuple:
    """Return mean quality of two strategies over the items both met."""
    both = sorted(set(a['scores']) & set(b['scores']))
    if not both:
        return math.nan, math.nan, 0
    return (statistics.mean(a['scores'][i] for i in both),
            statistics.mean(b['scores'][i] for i in both), len(both))


def markdown(report: dict) -> str:
    """Render the README tables."""
    lines = [f"# Robot workload through the node ({report['date']})", '',
             f"`{report['command']}` on {report['machine']}; {report['items']} held-out items "
             f"({report['split']} split), {report['minutes']:.1f} min. Budgets: tiers of each "
             "item's full-model time T (measured in step 1) and absolute budgets.", '']
    if report.get('reused'):
        lines += [f"Reused from `{report['reused']}`: the references, alpha 0.5, MODE_NONE's "
                  'real runs' + ('' if report.get('rerun_int8') else ' and int8-dynamic')
                  + '; AUTO ran again' + (' and int8-dynamic ran again'
                                          if report.get('rerun_int8') else '') + '.', '']
    for policy in ('kill', 'skip_next'):
        lines += [f'## {policy}: deadline met / false rejections / FAILED / quality '
                  '(in-time answers)', '',
                  '| strategy | ' + ' | '.join(report['tiers']) + ' |',
                  '|---|' + '---|' * len(report['tiers'])]
        for strategy in STRATEGIES:
            cells = []
            for tier in report['tiers']:
                s = report['table'][policy][tier][strategy]
                cells.append(f"{s['met_rate']:.0%} / {s['false_rejections']} / {s['failed']} / "
                             f"{s['quality']:.2f}" if not math.isnan(s['quality']) else
                             f"{s['met_rate']:.0%} / {s['false_rejections']} / {s['failed']} / -")
            lines.append(f'| {strategy} | ' + ' | '.join(cells) + ' |')
        lines.append('')
    lines += ['## AUTO vs MODE_NONE, Kill (quality on the items both met in time)', '',
              '| tier | AUTO met | NONE met | AUTO quality | NONE quality | items | '
              'AUTO mean slack s | AUTO modes (full / evict / int8 / early exit); '
              'switched to int8 mid-answer |',
              '|---|---|---|---|---|---|---|---|']
    for tier in report['tiers']:
        a, b = report['table']['kill'][tier]['TimeBill AUTO'], \
            report['table']['kill'][tier]['MODE_NONE']
        qa, qb, k = same_item_quality(a, b)
        modes = report['auto_modes'][tier]
        lines.append(f"| {tier} | {a['met_rate']:.1%} | {b['met_rate']:.1%} | {qa:.3f} | "
                     f"{qb:.3f} | {k} | {a['mean_slack_s']:.2f} | {modes['full']} / "
                     f"{modes['evict']} / {modes.get('int8', 0)} / {modes['early_exit']}; "
                     f"{modes.get('switched', '-')} |")
    v = report['replay_check']
    lines += ['', f"Replay check (MODE_NONE, Kill, real vs replayed at 0.9x and 1x): agreement "
              f"{v['agree']}/{v['runs']} ({v['agree'] / max(1, v['runs']):.0%}).", '']
    return '\n'.join(lines)


def plot(report: dict, out: Path) -> None:
    """Write met_rate.png and quality.png (Kill and Skip-Next side by side)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    for key, ylabel, name in (('met_rate', 'deadline met', 'met_rate.png'),
                              ('quality', 'quality of in-time answers', 'quality.png')):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
        for ax, policy in zip(axes, ('kill', 'skip_next')):
            tiers = report['tiers']
            for strategy in STRATEGIES:
                ax.plot(range(len(tiers)),
                        [report['table'][policy][t][strategy][key] for t in tiers],
                        marker='o', label=strategy)
            ax.set_xticks(range(len(tiers)), tiers)
            ax.set_title(policy)
            ax.set_xlabel('budget tier (x item full-model time, or seconds)')
            ax.grid(alpha=0.3)
        axes[0].set_ylabel(ylabel)
        axes[0].legend()
        fig.suptitle(f"Robot workload, {report['items']} held-out items ({report['date']})")
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)


def main(argv=None) -> int:
    """Run the benchmark and write its outputs."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    parser.add_argument('--split', default='test', choices=('test', 'train'))
    parser.add_argument('--items', type=int, default=0, help='first N items only (0: all)')
    parser.add_argument('--reuse', default='',
                        help='bench.json of an earlier run: keep its reference, fixed-strategy '
                             'and MODE_NONE runs and run only TimeBill AUTO again (after a '
                             'planner change), at --tiers')
    parser.add_argument('--tiers', nargs='+', default=list(TIERS), choices=TIERS,
                        help='with --reuse: the tiers AUTO runs at')
    parser.add_argument('--rerun-int8', action='store_true',
                        help='with --reuse: run the int8-dynamic node again (after a change '
                             'to the quantisation or the decode loop)')
    args = parser.parse_args(argv)
    from timebill_msgs.action import Instruct
    from timebill_ros.tools.client import ensure_init
    G = Instruct.Goal
    KILL, SKIP = G.KILL, G.SKIP_NEXT
    out = harness.claim_out(args.out, 'robot', resumable=True)
    items = robot_workload.load(args.split)
    if args.items:
        items = items[:args.items]
    by_id = {item.id: item for item in items}
    started = time.monotonic()

    log = stamped_log(started)

    ensure_init()
    bench = RobotBench(log)
    runs: dict = {}
    tiers = TIERS
    if args.reuse:
        with open(args.reuse, encoding='utf-8') as handle:
            runs = json.load(handle)['runs']
        tiers = tuple(t for t in TIERS if t in args.tiers)
        done = {r['item'] for r in runs['reference']}
        items = [item for item in items if item.id in done]
        by_id = {item.id: item for item in items}
    try:
        bench.start('fp32', {})
        if not args.reuse:
            log('1. reference: MODE_NONE, loose budget')
            runs['reference'] = [bench.run('fp32', item, LOOSE_S, G.MODE_NONE)
                                 for item in items]
        full = {r['item']: r['e2e_s'] for r in runs['reference']}
        refs = {r['item']: r['text'] for r in runs['reference']}
        if not args.reuse:
            log('2. fixed: eviction ratio 0.5, loose budget')
            runs['alpha 0.5'] = [bench.run('fp32', item, LOOSE_S, G.MODE_EVICTION,
                                           eviction_ratio=0.5) for item in items]
        runs['auto'], runs['auto_skip'] = {}, {}
        runs.setdefault('none_real', {})
        for tier in tiers:
            log(f'3. TimeBill AUTO, Kill, tier {tier}')
            runs['auto'][tier] = [bench.run('fp32', item, tier_budget(tier, full[item.id]),
                                            G.MODE_AUTO) for item in items]
            again = [r for r in runs['auto'][tier] if r['outcome'] == 'KILLED']
            log(f'   Skip-Next: {len(again)} goals cut off by Kill run again with SKIP_NEXT')
            redo = {r['item']: bench.run('fp32', by_id[r['item']], r['budget_s'], G.MODE_AUTO,
                                         policy=SKIP) for r in again}
            runs['auto_skip'][tier] = [redo.get(r['item'], r) for r in runs['auto'][tier]]
            # Keep what ran so far: a crash late in a long run loses nothing measured.
            (out / 'partial.json').write_text(json.dumps(runs) + '\n', encoding='utf-8')
        for tier in () if args.reuse else ('0.9x', '1x'):
            log(f'4. MODE_NONE for real, Kill, tier {tier}')
            runs['none_real'][tier] = [bench.run('fp32', item, tier_budget(tier, full[item.id]),
                                                 G.MODE_NONE, policy=KILL) for item in items]
        if not args.reuse or args.rerun_int8:
            bench.start('int8', {'dtype': 'int8-dynamic'})
            log('5. int8-dynamic MODE_NONE, loose budget')
            runs['int8'] = [bench.run('int8', item, LOOSE_S, G.MODE_NONE) for item in items]
    finally:
        bench.stop()

    table = {'kill': {}, 'skip_next': {}}
    auto_modes, agree, checked = {}, 0, 0
    for tier in tiers:
        budgets = {item.id: tier_budget(tier, full[item.id]) for item in items}
        loose = {'MODE_NONE': runs['reference'], 'alpha 0.5': runs['alpha 0.5'],
                 'int8-dynamic': runs['int8']}
        kill = {name: [replay_kill(r, budgets[r['item']]) for r in rs]
                for name, rs in loose.items()}
        if tier in runs['none_real']:
            for real, replayed in zip(runs['none_real'][tier], kill['MODE_NONE']):
                checked += 1
                agree += real['met'] == replayed['met']
            kill['MODE_NONE'] = runs['none_real'][tier]  # real beats replay at these tiers
        kill['TimeBill AUTO'] = runs['auto'][tier]
        none_met = {r['item']: r['met'] for r in kill['MODE_NONE']}
        table['kill'][tier] = {name: summarise(rs, by_id, refs, none_met)
                               for name, rs in kill.items()}
        skip = {name: skip_next([{**r, 'budget_s': budgets[r['item']]} for r in rs])
                for name, rs in loose.items()}
        skip['TimeBill AUTO'] = skip_next(runs['auto_skip'][tier])
        none_skip = {r['item']: r['met'] for r in skip['MODE_NONE']}
        table['skip_next'][tier] = {name: summarise(rs, by_id, refs, none_skip)
                                    for name, rs in skip.items()}
        ran = [r for r in runs['auto'][tier] if r['outcome'] != 'REJECTED']
        auto_modes[tier] = {
            'full': sum(r.get('mode') in (1, 2) and not r.get('alpha')
                        and not r.get('precision') for r in ran),
            'int8': sum(bool(r.get('precision')) for r in ran),
            'evict': sum(r.get('mode') == 2 and r.get('alpha', 0) > 0 for r in ran),
            'early_exit': sum(r.get('mode') == 3 for r in ran),
            'switched': sum(bool(r.get('switched')) for r in ran)}
    report = {'date': datetime.date.today().isoformat(), 'machine': machine(),
              'command': 'python -m benchmarks.bench_robot '
                         + ' '.join(argv if argv is not None else sys.argv[1:]),
              'split': args.split, 'items': len(items),
              'minutes': (time.monotonic() - started) / 60, 'tiers': list(tiers),
              'reused': args.reuse, 'rerun_int8': args.rerun_int8,
              'shipped_params': shipped_params(), 'table': table, 'auto_modes': auto_modes,
              'replay_check': {'runs': checked, 'agree': agree},
              'full_time_s': {'median': statistics.median(full.values()),
                              'min': min(full.values()), 'max': max(full.values())},
              'runs': runs}
    write_outputs(out, report, markdown, plot)
    return 0


if __name__ == '__main__':
    sys.exit(main())
