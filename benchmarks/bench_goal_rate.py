# SPDX-License-Identifier: Apache-2.0
"""Goals per second for short goals: the node against the bare engine on this machine.

Issue 52 item 0. ``--goals`` held-out robot commands, ``--max-new-tokens`` each (8),
greedy. The bare engine is llama-cpp-python's own generation loop on the node's GGUF
(``--engine``, q4_1), one command after another, its prompts tokenized beforehand. The
node (shipped parameters) gets the same commands at once from one client with loose
budgets, each goal pinned to that llama.cpp option, then again under MODE_AUTO; its rate
is the goals over the time from the first send to the last result. ``--profile`` runs
the node with benchmarks/probes/yappi_hook and profiles every thread (CPU clock) during
the pinned burst: node_profile.txt and .pstat in the folder (yappi slows Python code, so
that burst's rate is not the node's own).

    python -m benchmarks.bench_goal_rate --goals 100 --out results/goal_rate/<run>
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
import os
from pathlib import Path
import signal
import sys
import time

from benchmarks import common, harness
from benchmarks.bench_overhead import llama_loop, option_name

BUDGET_S = 600.0


def bare_rate(commands: list, engine: str, max_new: int) -> dict:
    """Run the commands one after another on the bare engine; return its rate."""
    from timebill_ros.runtime.model import load_model, prompt_ids
    loaded = load_model('embedded')
    prompts = [prompt_ids(loaded.tokenizer, text) for text in commands]
    decode = llama_loop(engine)
    decode(loaded, prompts[0], max_new)  # warm up, as the node does
    start = time.monotonic()
    tokens = sum(decode(loaded, ids, max_new)[0] for ids in prompts)
    seconds = time.monotonic() - start
    return {'goals': len(prompts), 'seconds': seconds, 'goals_per_s': len(prompts) / seconds,
            'tokens': tokens}


def node_burst(client, commands: list, max_new: int, precision: str) -> dict:
    """Send the commands at once; return the node's rate and outcomes."""
    from timebill_ros.tools.client import make_goal, outcome_name
    sent = time.monotonic()
    # MODE_AUTO (0) on both paths: the pinned goals keep their engine, the others are
    # the planner's (before 2026-12-07 15:45 make_goal's default sent MODE_NONE, so the
    # "auto" path ran the full model only).
    runs = [client.send(make_goal(text, BUDGET_S, max_new_tokens=max_new, mode=0,
                                  precision=precision)) for text in commands]
    for run in runs:
        client.wait(run, BUDGET_S + 120.0)
    seconds = max(run.finished_at for run in runs) - sent
    outcomes = {}
    for run in runs:
        name = outcome_name(run.result.outcome) if run.accepted else 'REFUSED'
        outcomes[name] = outcomes.get(name, 0) + 1
    tokens = sum(run.result.tokens for run in runs if run.accepted)
    return {'goals': len(runs), 'seconds': seconds, 'goals_per_s': len(runs) / seconds,
            'tokens': tokens, 'outcomes': outcomes,
            'e2e_s': sorted(round(run.result.e2e_s, 3) for run in runs if run.accepted)}


def profile_env(out) -> dict:
    """Return the environment that loads the yappi hook into the node (``--profile``)."""
    hook = Path(__file__).resolve().parent / 'probes' / 'yappi_hook'
    return {'TIMEBILL_YAPPI_OUT': str(out / 'node_profile'),
            'PYTHONPATH': os.pathsep.join(filter(None, [str(hook),
                                                        os.environ.get('PYTHONPATH', '')]))}


def markdown(report: dict) -> str:
    """Render the table."""
    bare = report['bare']
    lines = [f"# Goals per second, {report['max_new_tokens']}-token goals ({report['date']}, "
             f"{report['machine']})", '', f"Command: `{report['command']}` (commit "
             f"{report['commit']}). {bare['goals']} held-out robot commands (cycled).", '',
             '| path | goals/s | x bare | seconds | outcomes |', '|---|---|---|---|---|',
             f"| bare llama-cpp-python loop ({report['engine']}) | {bare['goals_per_s']:.2f} | "
             f"1.00 | {bare['seconds']:.1f} | - |"]
    for name in ('pinned', 'auto'):
        row = report[name]
        lines.append(f"| node, {name} | {row['goals_per_s']:.2f} | "
                     f"{row['goals_per_s'] / bare['goals_per_s']:.2f} | {row['seconds']:.1f} | "
                     f"{row['outcomes']} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Measure the bare engine, then the node, and write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--goals', type=int, default=100)
    parser.add_argument('--max-new-tokens', type=int, default=8)
    parser.add_argument('--engine', default='q4_1', help='llama.cpp GGUF format')
    parser.add_argument('--profile', action='store_true', help='py-spy the pinned burst')
    parser.add_argument('-p', '--param', action='append', default=[],
                        help='node parameter NAME=VALUE (repeatable)')
    parser.add_argument('--out', help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'goal_rate')
    log = common.stamped_log()
    from timebill_ros.evaluation import robot_workload
    items = robot_workload.load('test')
    commands = [items[i % len(items)].instruction for i in range(args.goals)]
    report = {'command': ' '.join(['python -m benchmarks.bench_goal_rate',
                                   *(sys.argv[1:] if argv is None else argv)]),
              'commit': common.commit(), 'machine': common.machine(),
              'date': datetime.now(timezone.utc).isoformat(timespec='seconds'),
              'max_new_tokens': args.max_new_tokens, 'engine': args.engine}
    log('bare engine ...')
    report['bare'] = bare_rate(commands, args.engine, args.max_new_tokens)
    log(f"bare: {report['bare']['goals_per_s']:.2f} goals/s")
    import rclpy
    from timebill_ros.tools.client import InstructClient, make_goal
    from timebill_ros.tools.process import NodeProcess
    node = NodeProcess(dict(item.split('=', 1) for item in args.param), ready_timeout=1800.0,
                       env=profile_env(out) if args.profile else None)
    rclpy.init()
    client = InstructClient(node_name='bench_goal_rate')
    try:
        client.wait_for_server(60)
        client.ask(make_goal('Say hi.', 60.0, max_new_tokens=2), 120)  # first-goal costs
        if args.profile:
            node.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)  # the node's main thread takes the signal between spins
        report['pinned'] = node_burst(client, commands, args.max_new_tokens,
                                      option_name(args.engine))
        if args.profile:
            node.proc.send_signal(signal.SIGUSR2)
            time.sleep(5.0)
        log(f"node pinned: {report['pinned']['goals_per_s']:.2f} goals/s")
        report['auto'] = node_burst(client, commands, args.max_new_tokens, '')
        log(f"node auto: {report['auto']['goals_per_s']:.2f} goals/s")
    finally:
        client.close()
        rclpy.try_shutdown()
        node.stop()
    (out / 'node.log').write_text(''.join(node.lines), encoding='utf-8')
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    return 0


if __name__ == '__main__':
    sys.exit(main())
