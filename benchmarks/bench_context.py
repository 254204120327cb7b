# SPDX-License-Identifier: Apache-2.0
"""Long contexts under a hard deadline, through the node: lateness, correct answers, reuse.

``python -m benchmarks.bench_context --items 60 --out results/context/<run>`` starts
two nodes with the shipped configuration (node A without the prefix cache, node B with
it) and sends goals through real action clients:

1. **Tiers.** Held-out retrieval items (a fact planted in a generated robot log, and
   SQuAD questions over paragraphs of their article, from the data packages), 500-4,000
   prompt tokens: each once with a loose budget on node A (MODE_NONE, its full time and
   whether the model answers right), then at ``--tiers`` x that time for MODE_NONE,
   fixed eviction (alpha 0.5) and MODE_AUTO, Kill. Per cell: met, met and correct,
   lateness of every goal that ended after its deadline (max and p99).
2. **A long prompt does not stall short goals.** The longest item with a loose budget;
   1 s after it is sent, three one-word goals with 3 s budgets.
3. **Repeated context.** One log with ten planted facts and ten questions about it, on
   node B (prefix cache) and on node A (none): time per question and equal texts.

Writes bench.json and README.md to a new folder (command, commit, date, CPU).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
from pathlib import Path
import random
import statistics
import sys
import time

from benchmarks.bench_robot import RobotBench
from benchmarks.common import commit, machine, param_pairs, shipped_params, stamped_log
from timebill_ros.core.request import Mode
from timebill_ros.evaluation import metrics, tasks

NAMESPACES = {'A': '/context_a', 'B': '/context_b'}
LOOSE_S = 300.0
STRATEGIES = {'NONE': {'mode': int(Mode.NONE)},
              'alpha 0.5': {'mode': int(Mode.EVICTION), 'eviction_ratio': 0.5},
              'AUTO': {'mode': int(Mode.AUTO)}}


class Nodes(RobotBench):
    """Two nodes (A: no prefix cache, B: prefix cache), a client each; RobotBench's ``stop``."""

    def start(self, overrides: dict | None = None) -> None:
        """Start both nodes with the shipped parameters (and ``overrides`` of them)."""
        for name, cache_mb in (('A', 0), ('B', 512)):
            self.log(f'starting node {name} (prefix_cache_mb {cache_mb}) ...')
            params = {**shipped_params(), **(overrides or {}), 'prefix_cache_mb': cache_mb,
                      'max_budget_s': 600.0}
            self.start_node(name, params, NAMESPACES[name], f'context_bench_{name}')

    def send(self, node: str, instruction: str, context: str, budget_s: float,
             max_new_tokens: int, **goal):
        """Send one goal (Kill) without waiting; return the client's run."""
        from timebill_ros.tools.client import make_goal
        return self.clients[node].send(make_goal(instruction, budget_s, context,
                                                 max_new_tokens=max_new_tokens, **goal))

    def record(self, node: str, run, budget_s: float, sent: float) -> dict:
        """Wait for a goal's end and describe it; its lateness is its end minus its deadline."""
        from timebill_ros.tools.client import outcome_name
        run = self.clients[node].wait(run, budget_s + 300.0)
        if not run.accepted:
            return {'outcome': 'REFUSED', 'met': False, 'late': None, 'e2e_s': 0.0,
                    'text': '', 'reason': run.reject_reason, 'sent': sent}
        res = run.result
        return {'outcome': outcome_name(res.outcome), 'met': bool(
                    res.deadline_met and outcome_name(res.outcome) == 'COMPLETED'),
                'claimed': bool(res.deadline_met), 'late': res.e2e_s - budget_s,
                'e2e_s': res.e2e_s, 'prefill_s': res.prefill_s, 'tokens': res.tokens,
                'text': res.text, 'reason': res.reason, 'note': res.plan.note,
                'alpha': float(res.plan.eviction_ratio), 'precision': res.plan.precision,
                'prompt_tokens': res.plan.prompt_tokens, 'sent': sent}

    def ask(self, node: str, item, budget_s: float, **goal) -> dict:
        """Send one item's goal and wait for its record."""
        sent = time.monotonic()
        run = self.send(node, item.instruction, item.context, budget_s, item.max_new_tokens,
                        **goal)
        return self.record(node, run, budget_s, sent)


def held_out_items(count: int, tokenizer, seed: int, kinds=('needle', 'squad')) -> list:
    """Return ``count`` items of ``kinds`` in turn (as even a share as the count allows).

    Kinds: robot-log needles, SQuAD, status reports to summarize, route descriptions to
    look a street up in; 500-4,000 tokens.
    """
    shares = [count // len(kinds) + (index < count % len(kinds))
              for index in range(len(kinds))]
    chosen = [tasks.select(kind, tokenizer, share, 500, 4000, seed)
              for kind, share in zip(kinds, shares)]
    return [item for group in itertools.zip_longest(*chosen) for item in group
            if item is not None]


def correct(item, text: str) -> bool:
    """Tell whether an answer is right (the bay code; SQuAD: token F1 of 0.5 or more)."""
    return metrics.score(item.metric, text, item.references) >= 0.5


def repeated_context(seed: int = 11) -> tuple:
    """Return (log with ten planted facts, [(question, bay code)])."""
    rng = random.Random(f'repeated-{seed}')
    log = [tasks._log_line(rng, 7 * i) for i in range(120)]
    pairs = [(unit, part) for unit in tasks._UNITS for part in tasks._PARTS]
    facts = []
    for unit, part in rng.sample(pairs, 10):
        bay = f'{rng.choice("BCDHKMPRT")}-{rng.randint(10, 99)}'
        fact = f'[note] maintenance: the spare {part} for unit {unit} is kept in storage ' \
               f'bay {bay}.'
        log.insert(rng.randrange(len(log) + 1), fact)
        facts.append((tasks.NEEDLE_INSTRUCTION.format(part=part, unit=unit), bay))
    return '\n'.join(log), facts


def run_tiers(nodes: Nodes, items: list, tiers: list, log, save=lambda loose, records: None
              ) -> tuple:
    """Return (loose runs by item, tier records); ``save`` them after each item.

    Each item runs its loose goal and then its tiers, so a run stopped early holds whole
    items (``partial.json``).
    """
    loose, records = {}, []
    for number, item in enumerate(items, 1):
        loose[item.item_id] = run = nodes.ask('A', item, LOOSE_S, mode=int(Mode.NONE))
        run['correct'] = correct(item, run['text'])
        full = run['e2e_s']
        for tier in tiers:
            for name, goal in STRATEGIES.items():
                record = nodes.ask('A', item, tier * full, **goal)
                record.update(item=item.item_id, tier=tier, strategy=name,
                              correct=record['met'] and correct(item, record['text']),
                              reduced=record.get('prompt_tokens', 0) > 0 and
                              record['prompt_tokens'] < run['prompt_tokens'])
                records.append(record)
        save(loose, records)
        log(f"item {number}/{len(items)} {item.item_id}: {full:.2f} s, prefill "
            f"{run['prefill_s']:.2f} s, {'right' if run['correct'] else 'wrong'}")
    return loose, records


SHORT_QUESTIONS = ('Stop or go?', 'Say yes.', 'Left or right?')


def run_stall(nodes: Nodes, long_item, log) -> dict:
    """Send a long prompt, then short 3-s goals; return what happened to each.

    Three MODE_NONE goals 1 s in, three MODE_AUTO ones 3 s in (while it prefills).
    """
    long_run = nodes.send('A', long_item.instruction, long_item.context, LOOSE_S,
                          long_item.max_new_tokens, mode=int(Mode.NONE))
    sent = time.monotonic()
    shorts = {}
    for name, mode, at in (('short', Mode.NONE, 1.0), ('short_auto', Mode.AUTO, 3.0)):
        time.sleep(max(0.0, sent + at - time.monotonic()))
        shorts[name] = [(nodes.send('A', question, '', 3.0, 8, mode=int(mode)),
                         time.monotonic()) for question in SHORT_QUESTIONS]
    long_record = nodes.record('A', long_run, LOOSE_S, sent)
    out = {'long': long_record}
    for name, runs in shorts.items():
        out[name] = [nodes.record('A', run, 3.0, at) for run, at in runs]
        log(f"stall: long {long_record['e2e_s']:.2f} s; {name} met "
            f"{sum(r['met'] for r in out[name])}/3")
    return out


def run_repeated(nodes: Nodes, log) -> dict:
    """Ask ten questions about one context on B (cache) and A (none); times and texts."""
    context, facts = repeated_context()
    out = {}
    for node in ('B', 'A'):
        rows = []
        for question, bay in facts:
            sent = time.monotonic()
            record = nodes.record(node, nodes.send(node, question, context, LOOSE_S, 16,
                                                   mode=int(Mode.NONE)), LOOSE_S, sent)
            record['right'] = bay in record['text']
            rows.append(record)
        out[node] = rows
        log(f"repeated on {node}: first {rows[0]['e2e_s']:.2f} s, median of the rest "
            f"{statistics.median(r['e2e_s'] for r in rows[1:]):.2f} s")
    return out


def p99(values: list) -> float:
    """Return the 99th percentile (nearest rank) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def summary(loose: dict, records: list, tiers: list) -> dict:
    """Return {tier: {strategy: met, met and correct, refused, late max/p99}}."""
    right = sum(run['correct'] for run in loose.values())
    table = {}
    for tier in tiers:
        table[str(tier)] = {}
        for name in STRATEGIES:
            rows = [r for r in records if r['tier'] == tier and r['strategy'] == name]
            late = [r['late'] for r in rows if r['late'] is not None and r['late'] > 0]
            table[str(tier)][name] = {
                'goals': len(rows), 'met': sum(r['met'] for r in rows),
                'met_correct': sum(r['correct'] for r in rows), 'right_full': right,
                'refused': sum(r['outcome'] == 'REFUSED' for r in rows),
                'reduced': sum(bool(r.get('reduced')) for r in rows),
                'late_max': max(late, default=0.0), 'late_p99': p99(late) if late else 0.0,
                'late_claimed': sum(r['claimed'] and r['late'] > 0 for r in rows
                                    if r['late'] is not None)}
    return table


def markdown(report: dict) -> str:
    """Return the run's tables."""
    lines = [f"# Long contexts through the node ({report['date']})", '',
             f"`{report['command']}` at commit {report['commit']} on {report['machine']}; "
             f"Kill, {report['minutes']:.0f} min."]
    if report.get('stopped_early'):
        lines[-1] += (f" The run was {report['stopped_early']} (its report written by "
                      f"`--report-partial`; minutes from the first goal sent to the last).")
    if report['table']:
        lines[-1] += (f" {report['items']} held-out items; the full model answers "
                      f"{report['right_full']} of them right with a loose budget.")
        lines += ['', '| tier | strategy | met | met and correct | refused | context reduced '
                  '| late max (s) | late p99 (s) |', '|---|---|---|---|---|---|---|---|']
    for tier, rows in report['table'].items():
        for name, row in rows.items():
            lines.append(f"| {tier}x | {name} | {row['met']}/{row['goals']} | "
                         f"{row['met_correct']} | {row['refused']} | {row.get('reduced', 0)} | "
                         f"{row['late_max']:.3f} | {row['late_p99']:.3f} |")
    stall, rep = report['stall'], report['repeated']
    if stall:
        lines += ['', f"**Short goals during a long prefill**: the long prompt took "
                  f"{stall['long']['e2e_s']:.2f} s ({stall['long']['outcome']}); the three "
                  "3-s MODE_NONE goals sent 1 s in: " + ', '.join(
                      f"{r['outcome']} in {r['e2e_s']:.2f} s" for r in stall['short'])
                  + '; the three 3-s MODE_AUTO goals sent 3 s in: ' + ', '.join(
                      f"{r['outcome']} in {r['e2e_s']:.2f} s"
                      for r in stall.get('short_auto', ())) + '.', '']
    if not rep:
        return '\n'.join(lines)
    lines += ['**Repeated context** (one log, ten questions):', '',
              '| node | first (s) | median of 2-10 (s) | ratio | right | texts equal to A |',
              '|---|---|---|---|---|---|']
    for node in ('B', 'A'):
        rows = rep[node]
        rest = statistics.median(r['e2e_s'] for r in rows[1:])
        same = sum(a['text'] == b['text'] for a, b in zip(rows, rep['A']))
        lines.append(f"| {node} ({'prefix cache' if node == 'B' else 'none'}) | "
                     f"{rows[0]['e2e_s']:.2f} | {rest:.2f} | {rest / rows[0]['e2e_s']:.2f} | "
                     f"{sum(r['right'] for r in rows)}/10 | {same}/10 |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Run the benchmark and write it to a new folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--items', type=int, default=60)
    parser.add_argument('--tiers', default='0.6,0.8,1.0')
    parser.add_argument('--seed', type=int, default=7, help='item selection (held out)')
    parser.add_argument('--kinds', default='needle,squad',
                        help='item kinds in turn: needle, squad, status, route (comma-separated)')
    parser.add_argument('--parts', default='tiers,stall,repeated',
                        help='which parts to run (comma-separated)')
    parser.add_argument('--param', action='append', default=[], metavar='NAME=VALUE',
                        help="a node parameter other than config/timebill.yaml's, on both "
                        'nodes (repeatable; e.g. auto_precision=bfloat16)')
    parser.add_argument('--out', required=True, help='a new results folder')
    parser.add_argument('--report-partial', action='store_true',
                        help='write the report of a run stopped early from OUT/partial.json '
                             '(its whole items), and run nothing')
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report_partial:
        return report_partial(out, parser)
    if out.exists():
        parser.error(f'{out} exists: benchmarks write to a new folder')
    from transformers import AutoTokenizer
    from timebill_ros.runtime.model import embedded_dir
    tiers = [float(t) for t in args.tiers.split(',')]
    parts = set(args.parts.split(','))
    items = held_out_items(args.items, AutoTokenizer.from_pretrained(embedded_dir()), args.seed,
                           tuple(args.kinds.split(',')))
    log, started = stamped_log(), time.monotonic()
    at_start = commit()  # what the nodes run (commits made during the run are not)
    import rclpy
    rclpy.init()
    nodes = Nodes(log)
    out.mkdir(parents=True)
    partial = out / 'partial.json'

    command = 'python -m benchmarks.bench_context ' + ' '.join(
        sys.argv[1:] if argv is None else argv)

    def save(loose: dict, records: list) -> None:
        partial.write_text(json.dumps({'command': command, 'commit': at_start,
                                       'date': datetime.date.today().isoformat(),
                                       'machine': machine(), 'items': len(items),
                                       'tiers': tiers, 'loose': loose,
                                       'records': records}, default=str) + '\n')
    try:
        nodes.start(param_pairs(args.param))
        loose, records = run_tiers(nodes, items, tiers, log, save) \
            if 'tiers' in parts else ({}, [])
        longest = max(items, key=lambda item: item.prompt_tokens)
        stall = run_stall(nodes, longest, log) if 'stall' in parts else None
        repeated = run_repeated(nodes, log) if 'repeated' in parts else None
    finally:
        nodes.stop()
        rclpy.try_shutdown()
    table = summary(loose, records, tiers) if records else {}
    report = {'command': command, 'commit': at_start, 'date': datetime.date.today().isoformat(),
              'machine': machine(), 'items': len(items), 'tiers': tiers,
              'minutes': (time.monotonic() - started) / 60.0,
              'right_full': sum(run['correct'] for run in loose.values()),
              'table': table, 'stall': stall, 'repeated': repeated, 'loose': loose,
              'records': records}
    return write_report(out, report)


def report_partial(out: Path, parser) -> int:
    """Write bench.json and README.md of a run stopped early, from its partial.json."""
    partial = out / 'partial.json'
    if not partial.exists() or (out / 'bench.json').exists():
        parser.error(f'{out} has no partial.json, or has a report already')
    saved = json.loads(partial.read_text())
    loose, records = saved['loose'], saved['records']
    tiers = saved.get('tiers') or sorted({r['tier'] for r in records})
    sent = [r['sent'] for r in records] + [r['sent'] for r in loose.values()]
    asked = saved.get('items', '?')
    report = {'command': saved.get('command', 'python -m benchmarks.bench_context'),
              'commit': saved['commit'], 'date': saved.get('date', datetime.date.fromtimestamp(
                  partial.stat().st_mtime).isoformat()),
              'machine': saved.get('machine', machine()), 'items': len(loose),
              'stopped_early': f'stopped after {len(loose)} of {asked} items',
              'tiers': tiers, 'minutes': (max(sent) - min(sent)) / 60.0 if sent else 0.0,
              'right_full': sum(run['correct'] for run in loose.values()),
              'table': summary(loose, records, tiers), 'stall': None, 'repeated': None,
              'loose': loose, 'records': records}
    return write_report(out, report)


def write_report(out: Path, report: dict) -> int:
    """Write bench.json and README.md, drop partial.json (bench.json holds it all), print."""
    (out / 'bench.json').write_text(json.dumps(report, indent=1, default=str) + '\n')
    text = markdown(report)
    (out / 'README.md').write_text(text + '\n')
    (out / 'partial.json').unlink(missing_ok=True)
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
