# SPDX-License-Identifier: Apache-2.0
"""bench_traces: arrival traces of held-out robot commands through the node and a peer.

The same traces go to the node (real action clients over DDS, shipped configuration,
MODE_AUTO and every goal pinned to each llama.cpp option, Kill) and to what a user
would run instead: llama.cpp (llama-cpp-python, the node's Q4_1 GGUF, one slot) serving
in arrival order, its client cancelling each goal at its deadline (a goal whose deadline
passed while waiting is dropped; one running at it is stopped: a miss). vLLM is not
run: this machine has no GPU and its CPU build needs its own environment.

Traces (``--trace``):

- ``poisson``: arrivals at ``load`` x the peer's capacity (1 / mean time of an item
  alone on it, measured first), each item's budget a factor (cycled from
  ``--factors``) of its own time alone.
- ``robot``: a robot stack: ``--periodic`` callers each ask a short command every
  second (budgets 0.5-1 s), and sporadic goals (Poisson, ``load`` x 0.5 a second)
  with context or a JSON answer, budgets 3x their time alone.

Per trace and load: met (completed by the deadline; killed, refused and dropped goals
are misses), correct and token-F1 of the met answers against the item's reference (the
workload's own scorer), Kill lateness; and goodput: the highest load at which 90 % of
the goals met. Held-out items (the workload's test split), seeded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import random
import statistics
import sys
import time

from benchmarks import common, harness

PEER = 'llama.cpp first-come-first-served (client cancels at the deadline)'
SHORT_TOKENS = 8  # a robot stack's periodic question: a word or a number


def peer_times(llm, ids_of, items: list, max_new: int) -> list:
    """Return each item's seconds alone on the peer (its answer or ``max_new`` tokens)."""
    return [generate(llm, ids_of(item), max_new, float('inf'))[2] for item in items]


def generate(llm, ids, max_new: int, deadline: float) -> tuple:
    """Greedy-decode until end, ``max_new`` or the deadline: (text, ended, seconds)."""
    began, eos, tokens = time.monotonic(), llm.token_eos(), []
    ended = 'completed'
    for token in llm.generate(list(ids), top_k=1, temp=0.0, reset=True):
        if time.monotonic() > deadline:
            ended = 'killed'
            break
        if token == eos:
            break
        tokens.append(token)
        if len(tokens) >= max_new:
            break
    text = llm.detokenize(tokens).decode('utf-8', errors='replace')
    return text, ended, time.monotonic() - began


def make_trace(kind: str, load: float, seconds: float, items: list, alone: list,
               factors: list, periodic: int, seed: int, max_new: int) -> list:
    """Return the goals (at, item index, budget, max_new_tokens) of one trace, in order.

    The robot trace's periodic goals ask for a few words (``SHORT_TOKENS``).
    """
    rng, goals = random.Random(seed), []
    if kind == 'poisson':
        rate, at = load / statistics.mean(alone), 0.0
        while (at := at + rng.expovariate(rate)) < seconds:
            index = rng.randrange(len(items))
            goals.append((at, index, round(factors[len(goals) % len(factors)] * alone[index],
                                           3), max_new))
        return goals
    short = [i for i, item in enumerate(items) if not item.context and item.kind != 'json']
    sporadic = [i for i, item in enumerate(items) if item.context or item.kind == 'json']
    for caller in range(periodic):
        phase = rng.uniform(0.0, 1.0)
        for tick in range(int(seconds)):
            goals.append((phase + tick, rng.choice(short), rng.choice([0.5, 0.75, 1.0]),
                          SHORT_TOKENS))
    at = 0.0
    while (at := at + rng.expovariate(0.5 * load)) < seconds:
        index = rng.choice(sporadic)
        goals.append((at, index, round(3.0 * alone[index], 3), max_new))
    return sorted(goals)


def node_rows(client, goals: list, items: list, precision: str) -> list:
    """Send each goal at its time; return a row per goal once all ended.

    No ``precision``: MODE_AUTO (the planner chooses); one: MODE_NONE on that option
    (a fixed choice, no cut). make_goal's default mode is MODE_NONE: the first run of
    this benchmark sent its "AUTO" goals so, to the float32 model.
    """
    from timebill_msgs.action import Instruct
    from timebill_ros.core.request import Mode, Outcome
    from timebill_ros.tools.client import make_goal
    start, runs = time.monotonic(), []
    for at, index, budget, max_new in goals:
        time.sleep(max(0.0, start + at - time.monotonic()))
        item = items[index]
        runs.append(client.send(make_goal(
            item.instruction, budget, context=item.context, policy=Instruct.Goal.KILL,
            max_new_tokens=max_new, precision=precision,
            mode=int(Mode.NONE if precision else Mode.AUTO))))
    rows = []
    for (at, index, budget, _), run in zip(goals, runs):
        client.wait(run, budget + 120.0)
        result = run.result
        outcome = Outcome(result.outcome).name if result is not None else 'REJECTED'
        rows.append({'at': at, 'item': index, 'budget_s': budget, 'outcome': outcome,
                     'met': bool(result is not None and result.deadline_met and
                                 outcome == 'COMPLETED'),
                     'text': result.text if result is not None else '',
                     'late_s': result.e2e_s - budget if outcome == 'KILLED' else None,
                     'option': result.plan.precision if result is not None else '',
                     # Why it ended as it did: the node's reason and the plan's note.
                     'reason': result.reason if result is not None else run.reject_reason,
                     'note': result.plan.note if result is not None else '',
                     'tokens': result.tokens if result is not None else 0,
                     'e2e_s': result.e2e_s if result is not None else None})
    return rows


def peer_rows(llm, ids_of, goals: list, items: list) -> list:
    """Serve the trace in arrival order on one slot, cancelling at each deadline."""
    start, rows = time.monotonic(), []
    for at, index, budget, max_new in goals:
        arrive = start + at
        time.sleep(max(0.0, arrive - time.monotonic()))
        deadline = arrive + budget
        if time.monotonic() >= deadline:
            rows.append({'at': at, 'item': index, 'budget_s': budget, 'outcome': 'CANCELED',
                         'met': False, 'text': '', 'late_s': None, 'option': 'peer'})
            continue
        text, ended, _ = generate(llm, ids_of(items[index]), max_new, deadline)
        end = time.monotonic()
        rows.append({'at': at, 'item': index, 'budget_s': budget,
                     'outcome': 'COMPLETED' if ended == 'completed' else 'KILLED',
                     'met': ended == 'completed' and end <= deadline, 'text': text,
                     'late_s': end - deadline if ended == 'killed' else None,
                     'option': 'peer'})
    return rows


def cell(rows: list, items: list) -> dict:
    """Summarise one path's rows: met, quality of the met answers, Kill lateness."""
    from timebill_ros.evaluation.metrics import token_f1
    from timebill_ros.evaluation.robot_workload import score
    met = [row for row in rows if row['met']]
    late = [row['late_s'] for row in rows if row['late_s'] is not None]
    return {'goals': len(rows), 'met': len(met), 'met_share': len(met) / max(1, len(rows)),
            'correct': sum(score(items[r['item']], r['text']) == 1.0 for r in met),
            'f1': statistics.mean(token_f1(r['text'], items[r['item']].reference)
                                  for r in met) if met else 0.0,
            'worst_kill_late_s': max(late, default=None),
            'outcomes': {name: sum(r['outcome'] == name for r in rows) for name in
                         sorted({r['outcome'] for r in rows})}}


def reuse_node_paths(report: dict, earlier: dict, items: list, renames: dict) -> None:
    """Take the node paths not run now from ``earlier`` (same traces), renamed if asked."""
    report['reused_from'] = earlier['command']
    for key, rows in earlier['rows'].items():
        trace, load, name = key.split(' ', 2)
        name = renames.get(name, name)
        cells = report['cells'].get(trace, {}).get(float(load))
        if cells is None:  # a load (or trace) not run this time
            continue
        if name != 'peer' and name not in cells:
            report['rows'][f'{trace} {load} {name}'] = rows
            cells[name] = cell(rows, items)


def goodput(report: dict, trace: str, path: str) -> float:
    """Return the highest load of ``trace`` at which ``path`` met 90 % (0: none)."""
    loads = [load for load, paths in report['cells'][trace].items()
             if paths[path]['met_share'] >= 0.9]
    return max(loads, default=0.0)


def markdown(report: dict) -> str:
    """Render a table per trace, and the goodputs."""
    lines = [f"# Arrival traces through the node and a peer ({report['date']}, "
             f"{report['machine']})", '', f"Command: `{report['command']}` (commit "
             f"{report['commit']}). {report['items']} held-out robot commands, "
             f"{report['seconds']:g} s a trace, answers up to {report['max_new_tokens']} "
             f"tokens; peer capacity {report['capacity_per_s']:.2f} goals/s (mean "
             f"{report['mean_alone_s']:.3f} s an item alone).", '']
    for trace, loads in report['cells'].items():
        paths = list(next(iter(loads.values())))
        lines += [f'## {trace}', '', '| load | goals | ' + ' | '.join(paths) + ' |',
                  '|---|---|' + '---|' * len(paths)]
        for load, cells in loads.items():
            lines.append(f"| {load:g}x | {next(iter(cells.values()))['goals']} | " + ' | '.join(
                f"{c['met']} met, {c['correct']} correct, F1 {c['f1']:.2f}"
                + (f", worst Kill {c['worst_kill_late_s']:+.3f} s"
                   if c['worst_kill_late_s'] is not None else '') for c in cells.values())
                + ' |')
        lines += ['', 'Goodput (highest load with 90 % met): ' + ', '.join(
            f"{path} {goodput(report, trace, path):g}x" for path in paths), '']
    return '\n'.join(lines)


def run_node(report: dict, traces: dict, items: list, args, log) -> None:
    """Start the node once and send every trace as AUTO and pinned to each option."""
    import rclpy
    from timebill_ros.tools.client import InstructClient, make_goal
    from timebill_ros.tools.process import NodeProcess
    node = NodeProcess(common.shipped_params(), ready_timeout=1800.0)
    rclpy.init()
    client = InstructClient(node_name='bench_traces')
    try:
        client.wait_for_server(60)
        client.ask(make_goal('Say hi.', 60.0, max_new_tokens=2), 120)  # first-goal costs
        paths = [*([('node AUTO', '')] if args.auto else []),
                 *[(f'node pinned {pin}', pin) for pin in args.pins]]
        for (trace, load), goals in traces.items():
            for name, precision in paths:
                log(f'{trace} {load:g}x: {name}, {len(goals)} goals')
                rows = node_rows(client, goals, items, precision)
                report['cells'][trace][load][name] = cell(rows, items)
                report['rows'][f'{trace} {load:g} {name}'] = rows
    finally:
        client.close()
        rclpy.try_shutdown()
        node.stop()
    report['node_log_tail'] = ''.join(node.lines[-50:])
    report['node_log'] = ''.join(node.lines)  # written beside bench.json as node.log


def main(argv=None) -> int:
    """Measure the peer, make the traces, run the node and the peer, write the folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--traces', nargs='+', default=['poisson', 'robot'],
                        choices=['poisson', 'robot'])
    parser.add_argument('--loads', nargs='+', type=float, default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument('--seconds', type=float, default=30.0)
    parser.add_argument('--factors', nargs='+', type=float, default=[1.5, 3.0, 6.0])
    parser.add_argument('--periodic', type=int, default=3, help='robot trace: callers')
    parser.add_argument('--max-new-tokens', type=int, default=48)
    parser.add_argument('--pins', nargs='*', default=['llama.cpp-q4_1', 'llama.cpp-f16'])
    parser.add_argument('--seed', type=int, default=5)
    parser.add_argument('--items', type=int, default=0, help='held-out items drawn (0: all)')
    parser.add_argument('--no-auto', dest='auto', action='store_false',
                        help='no MODE_AUTO run (with --reuse: keep the earlier one)')
    parser.add_argument('--reuse', help="an earlier bench.json of the same items and seed: "
                        "its items' times alone (so the same traces), its peer and the node "
                        'paths not run now')
    parser.add_argument('--rename', action='append', default=[],
                        help="OLD=NEW: a reused node path's name (repeatable)")
    parser.add_argument('--out', help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'traces')
    log = common.stamped_log()
    from benchmarks.burst_peer import load_peer
    from timebill_ros.evaluation import robot_workload
    items = robot_workload.load('test')
    from timebill_ros.runtime.model import load_model, prompt_ids
    llm, _ = load_peer(context=8192)  # the node's context window
    tokenizer = load_model('embedded').tokenizer

    def ids_of(item):  # the node's own chat prompt
        return prompt_ids(tokenizer, item.instruction, item.context)
    if args.items:
        items = random.Random(args.seed).sample(items, min(args.items, len(items)))
    earlier = json.loads(Path(args.reuse).read_text()) if args.reuse else None
    if earlier is None:
        log(f'timing each of {len(items)} items alone on the peer ...')
        alone = peer_times(llm, ids_of, items, args.max_new_tokens)
    else:
        alone = earlier['alone_s']
    report = {**common.run_header('benchmarks.bench_traces', argv),
              'items': len(items), 'seconds': args.seconds,
              'max_new_tokens': args.max_new_tokens, 'mean_alone_s': statistics.mean(alone),
              'capacity_per_s': 1.0 / statistics.mean(alone), 'alone_s': alone,
              'cells': {trace: {load: {} for load in args.loads} for trace in args.traces},
              'rows': {}}
    traces = {(trace, load): make_trace(trace, load, args.seconds, items, alone,
                                        args.factors, args.periodic, args.seed,
                                        args.max_new_tokens)
              for trace in args.traces for load in args.loads}
    for (trace, load), goals in traces.items():
        if earlier is None:
            log(f'{trace} {load:g}x: peer, {len(goals)} goals')
            rows = peer_rows(llm, ids_of, goals, items)
        else:
            rows = earlier['rows'][f'{trace} {load:g} peer']
        report['rows'][f'{trace} {load:g} peer'] = rows
        report['cells'][trace][load] = {'_peer': cell(rows, items)}
    del llm
    run_node(report, traces, items, args, log)
    if earlier is not None:
        reuse_node_paths(report, earlier, items, dict(pair.split('=', 1)
                                                      for pair in args.rename))
    for trace in args.traces:  # the peer's column last
        for load in args.loads:
            report['cells'][trace][load][PEER] = report['cells'][trace][load].pop('_peer')
    (out / 'node.log').write_text(report.pop('node_log', ''), encoding='utf-8')
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    print(markdown(report))
    return 0


if __name__ == '__main__':
    sys.exit(main())
