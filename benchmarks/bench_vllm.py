# SPDX-License-Identifier: Apache-2.0
"""bench_vllm: one `vllm serve` replica driven with deadlines by the node's replica client.

Starts a replica from a vLLM environment (``--vllm-python``: its own venv, since vLLM
needs a newer transformers than the node), serving the vLLM copy of the embedded model
(runtime.export_vllm) with priority scheduling. Then, on held-out robot commands:

1. each alone with a generous deadline: its time, tokens, TTFT and inter-token latency;
2. each again with a deadline at ``--tight`` x its own time: Kill by closing the stream,
   and how late it ended;
3. ``--burst`` goals at once: the inter-token latency with several running, and the
   error of the timing model (fitted on steps 1 and 2) on them.

Writes bench.json and README.md to a new results folder.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
import statistics
import subprocess
import sys
import threading
import time

from benchmarks import common, harness
from timebill_ros.cli.replica import start_replica, stop_replica, wait_healthy  # noqa: F401


def run_goal(client, url, instruction: str, budget_s: float, max_tokens: int):
    """Stream one goal with a deadline ``budget_s`` from now; return its RemoteAnswer."""
    from timebill_ros.serving.remote import deadline_priority, RemoteGoal, stream_goal
    goal = RemoteGoal(messages=({'role': 'user', 'content': instruction},),
                      max_tokens=max_tokens)
    deadline = time.monotonic() + budget_s
    answer = stream_goal(client, url, goal.body('smollm2', deadline_priority(
        time.time() + budget_s)), deadline)
    answer.late_s = answer.finished - deadline
    return answer


def run_burst(client, url, commands: list, size: int, max_tokens: int) -> list:
    """Send ``size`` goals at once (generous deadlines); return their answers in order."""
    answers = [None] * size

    def one(index):
        answers[index] = run_goal(client, url, commands[index % len(commands)], 30.0,
                                  max_tokens)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120.0)
    return [a for a in answers if a is not None]


def summary(values: list) -> dict:
    """Return median, p90 and max of a list (empty: {})."""
    if not values:
        return {}
    ordered = sorted(values)
    return {'median': statistics.median(ordered), 'p90': ordered[int(0.9 * (len(ordered) - 1))],
            'max': ordered[-1], 'n': len(ordered)}


def markdown(report: dict) -> str:
    """Return the results folder's README."""
    alone, tight, burst = report['alone'], report['tight'], report['burst']
    lines = ['# One vLLM replica driven with deadlines (serving/remote.py)', '',
             f"Command: `{report['command']}`  ", f"Commit: {report['commit']}  ",
             f"Date: {report['date']}  ", f"Machine: {report['machine']}  ",
             f"vLLM: {report['vllm']}, {report.get('dtype', 'bfloat16')}, --enforce-eager, "
             "priority scheduling; "
             f"healthy after {report['start_s']:.0f} s", '',
             f"Held-out robot commands: {len(alone)}; max_tokens {report['max_tokens']}.", '',
             '| measure | median | p90 | max |', '|---|---|---|---|']
    for name, stats in report['figures'].items():
        if stats:
            lines.append(f"| {name} | {stats['median']:.3f} | {stats['p90']:.3f} | "
                         f"{stats['max']:.3f} |")
    lines += ['', f"Kill at {report['tight_factor']}x of each goal's own time: "
              f"{sum(a['ended'] == 'killed' for a in tight)} killed, "
              f"{sum(a['ended'] == 'completed' for a in tight)} completed in time, "
              f"{sum(a['ended'] == 'failed' for a in tight)} failed.",
              f"Burst of {len(burst)} at once: {sum(a['ended'] == 'completed' for a in burst)} "
              f"completed; the timing model, fitted on the single goals and a first burst, "
              f"predicted their finish with a median absolute error of "
              f"{report['burst_error_pct']:.0f} %.", '',
              'Timing model after the run (seconds): TTFT = '
              f"{report['ttft_coef'][0]:.3f} + {report['ttft_coef'][1]:.5f} x prompt tokens + "
              f"{report['ttft_coef'][2]:.5f} x prompt tokens ahead"
              + (f" + {report['ttft_coef'][3]:.3f} x running" if len(report['ttft_coef']) > 3
                 else '') + f"; ITL = {report['itl_coef'][0]:.4f} + "
              f"{report['itl_coef'][1]:.4f} x running."]
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Start the replica, run the three parts, write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--vllm-python', required=True, help="python of vLLM's venv")
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    parser.add_argument('--items', type=int, default=16)
    parser.add_argument('--max-tokens', type=int, default=48)
    parser.add_argument('--tight', type=float, default=0.6)
    parser.add_argument('--burst', type=int, default=8)
    parser.add_argument('--port', type=int, default=8011)
    parser.add_argument('--dtype', default='bfloat16', help="replica dtype (results/vllm/"
                        "one_replica_16 ran bfloat16; float32 is faster on AVX2-only CPUs)")
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'vllm')
    import httpx
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.runtime.export_vllm import export_for_vllm
    from timebill_ros.runtime.model import cache_root, embedded_dir
    from timebill_ros.serving.replica_pool import Load, ReplicaTiming
    model_dir = export_for_vllm(embedded_dir(), cache_root() / 'models' / 'smollm2-vllm')
    url = f'http://127.0.0.1:{args.port}'
    proc = start_replica(args.vllm_python, model_dir, args.port, out / 'vllm.log',
                         args.dtype)
    client = httpx.Client()
    report = {'command': ' '.join(['python -m benchmarks.bench_vllm', *sys.argv[1:]]),
              'commit': common.commit(), 'machine': common.machine(),
              'date': datetime.now(timezone.utc).isoformat(timespec='seconds'),
              'max_tokens': args.max_tokens, 'tight_factor': args.tight, 'dtype': args.dtype,
              'vllm': subprocess.run([args.vllm_python, '-c',
                                      'import vllm; print(vllm.__version__)'],
                                     capture_output=True, text=True).stdout.strip()}
    try:
        report['start_s'] = wait_healthy(client, url, proc)
        commands = [item.instruction for item in robot_workload.load('test')][:args.items]
        run_goal(client, url, 'Say hi.', 30.0, 4)  # first-request costs
        timing = ReplicaTiming()
        alone = []
        for text in commands:
            answer = run_goal(client, url, text, 30.0, args.max_tokens)
            timing.observe(answer.prompt_tokens, Load(), answer)
            alone.append(answer)
        tight = [run_goal(client, url, text, args.tight * (a.finished - a.started),
                          args.max_tokens) for text, a in zip(commands, alone)]
        first = run_burst(client, url, commands, args.burst, args.max_tokens)
        beside = Load(args.burst - 1, args.burst - 1)  # sent at once, equal deadlines
        for answer in first:  # the model learns how several running requests share it
            timing.observe(answer.prompt_tokens, beside, answer)
        predicted = [timing.finish_s(a.prompt_tokens, a.tokens, beside)
                     for a in alone[:args.burst]]
        burst = run_burst(client, url, commands, args.burst, args.max_tokens)
    finally:
        stop_replica(proc)
    errors = [abs((b.finished - b.started) - p) / (b.finished - b.started) * 100.0
              for b, p in zip(burst, predicted) if b is not None and b.tokens]

    def row(a):
        return {'ended': a.ended, 'tokens': a.tokens, 'prompt_tokens': a.prompt_tokens,
                'seconds': a.finished - a.started, 'ttft_s': a.ttft_s, 'late_s': a.late_s,
                'itl_median_s': statistics.median(a.itl_s()) if a.itl_s() else 0.0,
                'finish_reason': a.finish_reason, 'error': a.error, 'text': a.text}
    report.update({
        'alone': [row(a) for a in alone], 'tight': [row(a) for a in tight],
        'burst': [row(a) for a in burst if a is not None],
        'burst_error_pct': statistics.median(errors) if errors else float('nan'),
        'ttft_coef': [float(x) for x in timing.ttft_coef],
        'itl_coef': [float(x) for x in timing.itl_coef]})
    report['figures'] = {
        'alone: seconds': summary([a.finished - a.started for a in alone]),
        'alone: TTFT s': summary([a.ttft_s for a in alone if a.tokens]),
        'alone: inter-token s': summary([g for a in alone for g in a.itl_s()]),
        f'burst of {args.burst}: inter-token s': summary(
            [g for a in burst if a is not None for g in a.itl_s()]),
        'killed: s past the deadline': summary(
            [a.late_s for a in tight if a.ended == 'killed'])}
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    return 0


if __name__ == '__main__':
    sys.exit(main())
