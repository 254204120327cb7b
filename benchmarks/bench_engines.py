# SPDX-License-Identifier: Apache-2.0
"""Fixed choices against the planner through the node, per budget tier (engines as options).

``python -m benchmarks.bench_engines --out results/engines/<name>`` starts two
nodes with real action clients: A, the shipped configuration (llama.cpp options and an
int8-weight copy resident), and B, an int8-dynamic copy (the other int8 format; one
int8 copy is resident per node). Over held-out robot items (``--split test``):

1. Loose run (``--loose`` s) of every strategy on every item: float32's answer is the
   reference and its e2e time the item's full-model time T; each run is a trace row
   (prompt and answer tokens, admission, queue, prefill and decode seconds) that the
   trace-driven evaluator (``benchmarks.evaluate_planning``) replays.
2. Every strategy for real at every tier, Kill: 0.3x, 0.5x, 0.7x, 1x of T and 1, 2, 5 s.
   Strategies, in a rotating order per goal: float32 (MODE_NONE), int8-weight and
   int8-dynamic (MODE_NONE pinned), eviction ratio 0.5 (MODE_EVICTION), llama.cpp Q4_1 +
   Kill (MODE_NONE pinned to the engine: what a llama_ros user runs) and TimeBill AUTO.
   Fixed choices carry the goal's cap as ``expected_tokens``: they do not plan, so no
   length predictor runs for them.

Per tier and strategy: met, refused, FAILED, late answers claimed on time, and the
token-F1 of the met answers to float32's answer. Writes bench.json (records, traces,
profiles of the options) and README.md to --out, with command, commit, date and CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
import statistics
import sys
import time

from benchmarks import harness
from benchmarks.common import commit, machine, shipped_params, stamped_log
from benchmarks.harness import tier_budget
from timebill_ros.core.cut_kinds import handover_of
from timebill_ros.core.request import OverrunPolicy
from timebill_ros.evaluation import metrics, robot_workload

RELATIVE = (0.3, 0.5, 0.7, 1.0)
ABSOLUTE = (1.0, 2.0, 5.0)
KILL = int(OverrunPolicy.KILL)
TIERS = tuple(f'{r:g}x' for r in RELATIVE) + tuple(f'{a:g}s' for a in ABSOLUTE)
MODE_AUTO, MODE_NONE, MODE_EVICTION = 0, 1, 2
# name -> (node, mode, pinned precision, eviction ratio)
STRATEGIES = {
    'float32': ('A', MODE_NONE, '', 0.0),
    'int8-weight': ('A', MODE_NONE, 'int8-weight', 0.0),
    'int8-dynamic': ('B', MODE_NONE, 'int8-dynamic', 0.0),
    'alpha 0.5': ('A', MODE_EVICTION, '', 0.5),
    'llama.cpp-q4_1 + Kill': ('A', MODE_NONE, 'llama.cpp-q4_1', 0.0),
    'AUTO': ('A', MODE_AUTO, '', 0.0),
}
# Run in the loose pass only: every resident option's own trace for the evaluator.
TRACE_ONLY = {
    'llama.cpp-f16': ('A', MODE_NONE, 'llama.cpp-f16', 0.0),
    'llama.cpp-f16>llama.cpp-q4_1': ('A', MODE_NONE, 'llama.cpp-f16>llama.cpp-q4_1', 0.0),
}
NODES = {'A': ('/engines_a', {'auto_precision': 'int8-weight'}),
         'B': ('/engines_b', {'auto_precision': 'int8-dynamic', 'llama_engines': ''})}


class Nodes(harness.Nodes):
    """The two nodes and their clients; ``run`` sends one goal and keeps a plain record."""

    def __init__(self, log, max_new_tokens: int):
        """Start both nodes with the shipped parameters plus their own."""
        super().__init__(log)
        self.cap = max_new_tokens
        try:
            for name, (namespace, extra) in NODES.items():
                log(f'starting node {name} ({namespace}) ...')
                self.start_node(name, {**shipped_params(), **extra}, namespace,
                                f'engines_bench_{name}')
        except BaseException:
            self.stop()  # no node outlives a failed start
            raise

    def run(self, strategy: str, item, budget_s: float) -> dict:
        """Send ``item`` under ``strategy`` with ``budget_s`` (Kill); return its record."""
        from timebill_ros.tools.client import make_goal, outcome_name
        node, mode, precision, ratio = {**STRATEGIES, **TRACE_ONLY}[strategy]
        goal = make_goal(item.instruction, budget_s, item.context, policy=KILL, mode=mode,
                         max_new_tokens=self.cap, eviction_ratio=ratio, precision=precision,
                         expected_tokens=self.cap if mode != MODE_AUTO else 0)
        run = self.clients[node].ask(goal, budget_s + 180.0)
        record = {'item': item.id, 'strategy': strategy, 'budget_s': budget_s}
        if not run.accepted:
            return {**record, 'outcome': 'REFUSED', 'met': False, 'claimed': False,
                    'text': '', 'tokens': 0, 'reason': run.reject_reason}
        res, plan = run.result, run.result.plan
        admission = res.e2e_s - res.queue_s - res.prefill_s - res.decode_s
        return {**record, 'outcome': outcome_name(res.outcome),
                'met': bool(res.outcome == 0 and res.deadline_met),
                'claimed': bool(res.deadline_met), 'late': res.e2e_s - budget_s,
                'e2e_s': res.e2e_s, 'queue_s': res.queue_s, 'prefill_s': res.prefill_s,
                'decode_s': res.decode_s, 'admission_s': max(0.0, admission),
                'tokens': res.tokens, 'text': res.text, 'reason': res.reason,
                'prompt_tokens': int(plan.prompt_tokens), 'precision': plan.precision,
                'prefill_precision': plan.prefill_precision,
                'predicted': int(plan.predicted_tokens), 'alpha': float(plan.eviction_ratio),
                'fit': float(plan.fit_probability), 'note': plan.note}


def summarise(records: list, references: dict) -> dict:
    """Return {tier: {strategy: counts and token-F1 of the met answers}}."""
    table: dict = {}
    for record in records:
        row = table.setdefault(record['tier'], {}).setdefault(record['strategy'], {
            'goals': 0, 'met': 0, 'refused': 0, 'failed': 0, 'late_claimed': 0, 'f1': []})
        row['goals'] += 1
        row['met'] += record['met']
        row['refused'] += record['outcome'] == 'REFUSED'
        row['failed'] += record['outcome'] == 'FAILED'
        row['late_claimed'] += record['claimed'] and record.get('late', 0.0) > 0.0
        if record['met']:
            row['f1'].append(metrics.token_f1(record['text'], references[record['item']]))
    for rows in table.values():
        for row in rows.values():
            scores = row.pop('f1')
            row['f1_met'] = statistics.fmean(scores) if scores else 0.0
    return table


def verdict(table: dict) -> dict:
    """Return {tier: AUTO's standing}: met >= every fixed choice, F1 vs the best one's."""
    out = {}
    for tier, rows in table.items():
        auto = rows['AUTO']
        fixed = {name: row for name, row in rows.items() if name != 'AUTO'}
        best = max(fixed, key=lambda name: (fixed[name]['met'], fixed[name]['f1_met']))
        out[tier] = {'auto_met': auto['met'], 'best_fixed': best,
                     'best_fixed_met': fixed[best]['met'],
                     'met_ok': all(auto['met'] >= row['met'] for row in fixed.values()),
                     'f1_ok': auto['f1_met'] >= fixed[best]['f1_met'] - 1e-9}
    return out


def markdown(report: dict) -> str:
    """Return the report's tables."""
    lines = [f"# Fixed choices against the planner through the node ({report['date']})", '',
             f"`{report['command']}` at commit {report['commit']} on {report['machine']}; "
             f"{report['items']} held-out robot items, Kill, {report['minutes']:.0f} min. "
             'Met: completed by the deadline; F1: token-F1 of the met answers to float32\'s '
             'loose answer.', '']
    strategies = list(STRATEGIES)
    lines += ['| tier | ' + ' | '.join(strategies) + ' | AUTO >= every fixed? | '
              'AUTO F1 >= best fixed? |', '|---' * (len(strategies) + 3) + '|']
    for tier in TIERS:
        rows, check = report['table'][tier], report['verdict'][tier]
        cells = [f"{rows[s]['met']}/{rows[s]['goals']} ({rows[s]['f1_met']:.2f})"
                 + (f" r{rows[s]['refused']}" if rows[s]['refused'] else '')
                 for s in strategies]
        lines.append(f'| {tier} | ' + ' | '.join(cells) +
                     f" | {'yes' if check['met_ok'] else 'NO'} | "
                     f"{'yes' if check['f1_ok'] else 'NO'} ({check['best_fixed']}) |")
    failed = sum(r['failed'] for rows in report['table'].values() for r in rows.values())
    late = sum(r['late_claimed'] for rows in report['table'].values() for r in rows.values())
    lines += ['', f'Cells: met/goals (F1 of met answers), rN: refused. FAILED: {failed}; '
              f'late answers claimed on time: {late}.', '',
              'AUTO\'s choices per tier: ' + '; '.join(
                  f"{tier}: " + ', '.join(f'{k or "torch"} {v}' for k, v in
                                          sorted(report['auto_choices'][tier].items()))
                  for tier in TIERS)]
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Run the benchmark and write its report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--items', type=int, default=20, help='held-out items, spread over kinds')
    parser.add_argument('--split', default='test')
    parser.add_argument('--workload-seed', type=int, default=0,
                        help='0: the committed workload; another seed: items that generator '
                             'seed makes and the committed file lacks (seen by no run or '
                             'training)')
    parser.add_argument('--offset', type=int, default=0,
                        help='first item of the stride: 1 or 2 picks items no earlier run '
                             '(offset 0) used')
    parser.add_argument('--stride', type=int, default=0,
                        help='items between two picked ones (0: the split size over --items, '
                             'spread over kinds); --offset 60 --stride 1 --items 16 picks '
                             'the 16 test items no strided run reaches (route, ifbench)')
    parser.add_argument('--loose', type=float, default=120.0)
    parser.add_argument('--max-new-tokens', type=int, default=128)
    parser.add_argument('--order', choices=('tier', 'item'), default='tier',
                        help="'tier': every item's loose runs, then one tier after another "
                        "(the earlier runs); 'item': each item's loose runs and then its "
                        'tiers, so the traces lie next to the runs they predict')
    parser.add_argument('--out', required=True, help='a new results folder')
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f'{out} exists: benchmarks write to a new folder')
    out.mkdir(parents=True, exist_ok=True)
    started, log = time.monotonic(), stamped_log()
    items = robot_workload.fresh(args.workload_seed, args.split) if args.workload_seed \
        else robot_workload.load(args.split)
    items = items[args.offset::args.stride or max(1, len(items) // args.items)][:args.items]
    import rclpy
    rclpy.init()
    records, traces, nodes = [], [], None
    try:
        at_start = commit()  # what the nodes run (commits made during the run are not)
        nodes = Nodes(log, args.max_new_tokens)

        def loose(number: int, item) -> float:
            for strategy in _rotated(number) + list(TRACE_ONLY):
                traces.append(nodes.run(strategy, item, args.loose))
            log(f'loose {item.id}: ' + ', '.join(
                f"{t['strategy']} {t.get('e2e_s', 0):.2f} s"
                for t in traces[-len(STRATEGIES) - len(TRACE_ONLY):]))
            return next(t['e2e_s'] for t in traces[::-1]
                        if t['strategy'] == 'float32' and t['item'] == item.id)

        def tier_runs(number: int, item, tier: str, full_s: float) -> None:
            for strategy in _rotated(number):
                records.append({**nodes.run(strategy, item, tier_budget(tier, full_s)),
                                'tier': tier})
        if args.order == 'item':  # a drift of the machine's speed hits every tier alike
            for number, item in enumerate(items):
                full_s = loose(number, item)
                for tier in TIERS:
                    tier_runs(number, item, tier, full_s)
        else:
            full = {item.id: loose(number, item) for number, item in enumerate(items)}
            for tier in TIERS:
                for number, item in enumerate(items):
                    tier_runs(number, item, tier, full[item.id])
                log(f'tier {tier} done')
    finally:
        if nodes is not None:
            nodes.stop()
        rclpy.try_shutdown()
        (out / 'partial.json').write_text(json.dumps({'traces': traces, 'records': records}))
    references = {t['item']: t['text'] for t in traces if t['strategy'] == 'float32'}
    table = summarise(records, references)
    report = {
        'command': 'python -m benchmarks.bench_engines ' + ' '.join(argv or sys.argv[1:]),
        'commit': at_start, 'date': datetime.date.today().isoformat(), 'machine': machine(),
        'items': len(items), 'max_new_tokens': args.max_new_tokens, 'tiers': TIERS,
        'order': args.order,
        'strategies': list(STRATEGIES),
        'minutes': (time.monotonic() - started) / 60.0, 'table': table,
        'verdict': verdict(table), 'auto_choices': _choices(records),
        'traces': traces, 'records': records, 'profiles': _profiles()}
    (out / 'bench.json').write_text(json.dumps(report, indent=1, default=str) + '\n')
    text = markdown(report)
    (out / 'README.md').write_text(text + '\n', encoding='utf-8')
    print(text)
    return 0


def _rotated(number: int) -> list:
    names = list(STRATEGIES)
    shift = number % len(names)
    return names[shift:] + names[:shift]


def _choices(records: list) -> dict:
    choices: dict = {}
    for record in records:
        if record['strategy'] == 'AUTO':
            tier = choices.setdefault(record['tier'], {})
            precision = record.get('precision', '')
            name = 'refused' if record['outcome'] == 'REFUSED' else handover_of(
                precision, record.get('prefill_precision', '')) or precision
            tier[name] = tier.get(name, 0) + 1
    return choices


def _profiles() -> dict:
    """Return the option profiles the node planned with (the evaluator's timing models)."""
    import yaml
    from timebill_ros.runtime.model import cache_root
    folder = cache_root() / 'profiles'
    return {path.stem: yaml.safe_load(path.read_text()) for path in sorted(
        folder.glob('SmolLM2-135M-Instruct-cpu-*.yaml')) if 'pick' not in path.name}


if __name__ == '__main__':
    sys.exit(main())
