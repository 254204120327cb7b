# SPDX-License-Identifier: Apache-2.0
"""bench_burst: many goals at once through the node, against an offline EDF schedule.

One client sends ``--goals`` goals as fast as it can (held-out robot commands, budgets
cycling through ``--budgets``, ``--max-new-tokens`` each) to a node process, waits for
every result, and reports how many were answered (lost = none came back), met, refused
(at admission or at dispatch), killed. The yardstick is an offline schedule on the
measured service times: the most goals a single server could finish by their deadlines
with every arrival known in advance (Moore-Hodgson over EDF order, optimal for that
count). A refused goal "could have met" when, at its refusal, its own measured service
time still fit in its time left.

The node runs the shipped parameters (``-p`` overrides them; until 2026-12-07 this
benchmark turned llama_engines off). ``--pin OPTION`` pins every goal to one engine
option (a fixed choice through the node). ``--peer`` then runs the same burst on what a
user would run instead (benchmarks/burst_peer.py: llama.cpp first come, first served,
the client cancelling at the deadline) and adds the yardstick with option choice: the
offline schedule on each goal's service time on the fastest option (Q4_1, measured
alone), which no node run of this burst can beat in count.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
import itertools
import statistics
import subprocess
import sys
import time

from benchmarks import common, harness
from timebill_ros.core.request import Outcome


def most_on_time(jobs: list) -> list:
    """Return the largest set of (deadline_s, service_s, key) a single server finishes in time.

    Moore-Hodgson: take jobs in deadline order; whenever the running total passes the
    current deadline, drop the longest job taken so far. All jobs are ready at 0.
    """
    import heapq
    taken, total = [], 0.0
    for deadline, service, key in sorted(jobs):
        heapq.heappush(taken, (-service, key))
        total += service
        if total > deadline:
            longest, _ = heapq.heappop(taken)
            total += longest  # (negative)
    return [key for _, key in taken]


def goal_rows(runs: list, sent_at: float) -> list:
    """Return one row per goal: what came back, relative to the burst's start."""
    rows = []
    for index, (budget, run) in enumerate(runs):
        result = run.result
        row = {'index': index, 'budget_s': budget, 'answered': run.finished_at > 0,
               'status': run.status,
               'accepted': run.accepted, 'reject_reason': run.reject_reason,
               'outcome': Outcome(result.outcome).name if result is not None else '',
               'deadline_met': bool(result.deadline_met) if result is not None else False,
               'reason': result.reason if result is not None else '',
               'option': result.plan.precision if result is not None else '',
               'plan_note': result.plan.note[-300:] if result is not None else '',
               'tokens': int(result.tokens) if result is not None else 0,
               'queue_s': result.queue_s if result is not None else 0.0,
               'service_s': (result.prefill_s + result.decode_s) if result is not None else 0.0,
               'e2e_s': result.e2e_s if result is not None else 0.0,
               'sent_s': run.sent_at - sent_at,
               # When the node answered the goal request (accepted or rejected): the intake.
               'answered_s': (run.answered_at - sent_at) if run.answered_at else 0.0,
               'finished_s': (run.finished_at - sent_at) if run.finished_at else 0.0}
        rows.append(row)
    return rows


def summarise(rows: list) -> dict:
    """Count outcomes and compare with the offline schedule on measured service times."""
    served = [r['service_s'] for r in rows if r['outcome'] == 'COMPLETED' and r['tokens']]
    typical = statistics.median(served) if served else float('nan')
    jobs = [(r['sent_s'] + r['budget_s'], r['service_s'] if r['outcome'] == 'COMPLETED'
             else typical, r['index']) for r in rows]
    offline = len(most_on_time(jobs))
    refused = [r for r in rows if not r['accepted'] or r['outcome'] == 'REJECTED']
    could = [r for r in refused
             if r['sent_s'] + r['budget_s'] - (r['finished_s'] or r['sent_s']) >= typical]
    met = sum(r['deadline_met'] for r in rows)
    counts = {name: sum(r['outcome'] == name for r in rows) for name in
              ('COMPLETED', 'KILLED', 'SKIPPED', 'REJECTED', 'CANCELED', 'FAILED')}
    return {'goals': len(rows), 'lost': sum(not r['answered'] for r in rows),
            'refused_at_admission': sum(not r['accepted'] for r in rows),
            'refused_at_dispatch': counts['REJECTED'], 'outcomes': counts, 'met': met,
            'median_service_s': typical, 'offline_edf_met': offline,
            'met_share_of_offline': met / offline if offline else float('nan'),
            'refused_could_have_met': len(could),
            'last_answered_s': max((r.get('answered_s', 0.0) for r in rows), default=0.0),
            'refusal_reasons': dict(statistics_counts(
                [(r['reject_reason'] or r['reason']).split(' (')[0][:60] for r in refused]))}


def run_peer(commands: list, budgets: list, max_new: int) -> dict:
    """Run the peer on the same burst and the yardstick on fastest-option times."""
    from benchmarks import burst_peer
    llm, ids_of = burst_peer.load_peer()
    distinct = {text: ids_of(text) for text in dict.fromkeys(commands)}
    fastest = burst_peer.fastest_service(llm, distinct, max_new)
    sent = [commands[i % len(commands)] for i in range(len(budgets))]
    rows = burst_peer.fcfs_burst(llm, [distinct[text] for text in sent], budgets, max_new)
    jobs = [(budget, fastest[text], i) for i, (text, budget) in enumerate(zip(sent, budgets))]
    killed = [r['late_s'] for r in rows if r['outcome'] == 'KILLED']
    return {'met': sum(r['met'] for r in rows), 'goals': len(rows),
            'outcomes': {name: sum(r['outcome'] == name for r in rows)
                         for name in ('COMPLETED', 'KILLED', 'CANCELED')},
            'worst_kill_late_s': max(killed, default=None),
            'offline_fastest_met': len(most_on_time(jobs)),
            'median_fastest_s': statistics.median(fastest.values()), 'rows': rows}


def statistics_counts(texts: list) -> list:
    """Return (text, count) pairs, most common first."""
    return sorted(((t, texts.count(t)) for t in set(texts)), key=lambda pair: -pair[1])


def markdown(report: dict) -> str:
    """Return the results folder's README."""
    s = report['summary']
    lines = [f"# Burst: {s['goals']} goals at once through the node", '',
             f"Command: `{report['command']}`  ", f"Commit: {report['commit']}  ",
             f"Date: {report['date']}  ", f"Machine: {report['machine']}  ",
             f"Node parameters: `{report['params']}`", '',
             '| | goals |', '|---|---|',
             f"| sent | {s['goals']} |", f"| lost (no answer) | {s['lost']} |",
             f"| deadline met | {s['met']} |",
             f"| offline EDF schedule on measured service times | {s['offline_edf_met']} |",
             f"| met / offline | {s['met_share_of_offline']:.0%} |",
             f"| refused at admission | {s['refused_at_admission']} |",
             f"| refused at dispatch (time left cannot fit the answer) | "
             f"{s['refused_at_dispatch']} |",
             f"| refused but its own service time still fitted | "
             f"{s['refused_could_have_met']} |", '',
             f"The node answered the last goal request {s.get('last_answered_s', 0.0):.2f} s "
             'after the first was sent (the intake).', '',
             f"Outcomes: {s['outcomes']}. Median service time (prefill + decode of a completed "
             f"goal): {s['median_service_s']:.3f} s.", '', 'Refusal reasons:', '']
    lines += [f'- {count} x {text}' for text, count in s['refusal_reasons'].items()]
    peer = report.get('peer')
    if peer:
        lines += ['', f"Pinned to: `{report.get('pin') or 'none (the planner chooses)'}`.", '',
                  '| the same burst | met |', '|---|---|',
                  f"| this node | {s['met']} |",
                  f"| llama.cpp first come, first served, client cancels at the deadline "
                  f"| {peer['met']} ({peer['outcomes']}) |",
                  f"| offline schedule, every goal on the fastest option (Q4_1, median "
                  f"{peer['median_fastest_s']:.3f} s) | {peer['offline_fastest_met']} |",
                  '', f"node / peer: {s['met'] / max(1, peer['met']):.2f}; node / offline "
                  f"with option choice: {s['met'] / max(1, peer['offline_fastest_met']):.0%}"]
    by_budget = {}
    for row in report['rows']:
        entry = by_budget.setdefault(row['budget_s'], [0, 0])
        entry[0] += 1
        entry[1] += row['deadline_met']
    lines += ['', '| budget s | goals | met |', '|---|---|---|']
    lines += [f'| {b:g} | {n} | {m} |' for b, (n, m) in sorted(by_budget.items())]
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Start a node, send the burst, write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', required=True, help='new results folder')
    parser.add_argument('--goals', type=int, default=500)
    parser.add_argument('--budgets', type=float, nargs='+', default=[2.0, 5.0, 10.0, 30.0])
    parser.add_argument('--max-new-tokens', type=int, default=8)
    parser.add_argument('--model', default='embedded')
    parser.add_argument('-p', '--param', action='append', default=[],
                        help='extra node parameter NAME=VALUE (repeatable)')
    parser.add_argument('--mode', default='auto', choices=('auto', 'none'),
                        help="the goals' mode: MODE_AUTO (default; before 2026-12-07 the "
                        'goals went as MODE_NONE, the full model only) or MODE_NONE')
    parser.add_argument('--pin', default='', help="pin every goal to an engine option "
                        "(e.g. 'llama.cpp-q4_1'); default: the planner's choice")
    parser.add_argument('--peer', action='store_true',
                        help='also run the llama.cpp first-come-first-served peer')
    args = parser.parse_args(argv)
    out = harness.new_results_dir(args.out)
    if out is None:
        return 1
    import rclpy
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.core.request import Mode
    from timebill_ros.tools.client import ClientTimeout, InstructClient, make_goal
    mode = int(Mode.AUTO if args.mode == 'auto' else Mode.NONE)
    from timebill_ros.tools.process import NodeProcess
    params = {'model': args.model}
    params.update(dict(item.split('=', 1) for item in args.param))
    started = time.monotonic()
    log = common.stamped_log(started)
    report = {'command': ' '.join(['python -m benchmarks.bench_burst', *sys.argv[1:]])
              if argv is None else ' '.join(argv), 'commit': common.commit(),
              'date': datetime.now(timezone.utc).isoformat(timespec='seconds'),
              'machine': common.machine(), 'params': params,
              'lscpu': subprocess.run(['lscpu'], capture_output=True, text=True).stdout}
    commands = [item.instruction for item in robot_workload.load('test')]
    log(f'starting the node ({params})')
    node = NodeProcess(params, ready_timeout=1800.0)
    rclpy.init()
    client = InstructClient(node_name='bench_burst')
    try:
        client.wait_for_server(60)
        client.ask(make_goal('Say hi.', 60.0, max_new_tokens=2), 120)  # first-goal costs
        budgets = list(itertools.islice(itertools.cycle(args.budgets), args.goals))
        log(f'sending {args.goals} goals at once')
        sent_at = time.monotonic()
        runs = [(budget, client.send(make_goal(commands[i % len(commands)], budget,
                                               max_new_tokens=args.max_new_tokens,
                                               precision=args.pin, mode=mode)))
                for i, budget in enumerate(budgets)]
        for _, run in runs:
            try:
                client.wait(run, max(args.budgets) + 120.0)
            except ClientTimeout:
                pass
        log('all answered' if all(run.finished_at > 0 for _, run in runs) else 'some lost')
        rows = goal_rows(runs, sent_at)
    finally:
        client.close()
        rclpy.try_shutdown()
        node.stop()
    report['rows'] = rows
    report['summary'] = summarise(rows)
    report['pin'] = args.pin
    if args.peer:
        log('the peer: llama.cpp first come, first served')
        report['peer'] = run_peer(commands, budgets, args.max_new_tokens)
    out.mkdir(parents=True)
    (out / 'node.log').write_text(''.join(node.lines), encoding='utf-8')
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    return 0


if __name__ == '__main__':
    sys.exit(main())
