# SPDX-License-Identifier: Apache-2.0
"""Decode steps beside a second OpenMP team: in one process and through the node.

``python -m benchmarks.bench_openmp_team`` reruns the probe behind cce074a.
Every thread that runs a multi-threaded torch op keeps an OpenMP team while it lives;
with more OpenMP threads than cores, libgomp barely spins before it sleeps at barriers,
and every team slows down.

* ``inproc``: float32 decode steps on a worker thread (as the node's loop runs them),
  in rounds: alone; beside a live thread that ran one forward itself (what the length
  predictor did on the executor's thread before cce074a); beside a live thread whose
  forward ran through ``runtime.model.on_own_thread`` (what it does now).
* ``node``: one node, the same goal pinned to each precision before and after one
  MODE_AUTO goal (whose admission runs the length predictor); decode ms per step and
  the node's OS threads. Before the fix the steps after took 1.2-1.4x longer.

Results go to a new folder: bench.json and README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

from benchmarks import common, harness


def _live_thread(forward) -> threading.Event:
    """Start a thread that calls ``forward`` once and stays alive until the event is set."""
    done, stop = threading.Event(), threading.Event()

    def live():
        forward()
        done.set()
        stop.wait(600)
    threading.Thread(target=live, daemon=True, name='bench-live').start()
    done.wait(600)
    return stop


def inproc(model_name: str, rounds: int, steps: int) -> dict:
    """Time decode steps alone, beside a live team, and beside the fixed predictor thread."""
    import torch
    from timebill_ros.runtime.model import load_model, on_own_thread
    from timebill_ros.runtime.profiler import time_decode_steps
    loaded = load_model(model_name)
    model = loaded.model

    def decode_ms():  # the start-up profiler's timing: median step after an 80-token prompt
        return 1e3 * time_decode_steps(loaded, [80], steps, 1)[80][0]

    def forward():
        with torch.inference_mode():
            model(torch.randint(0, model.config.vocab_size, (1, 80)))
    beside = {'alone': None, 'beside a live team': forward,
              'beside a live thread, forward on its own thread':
              lambda: on_own_thread(forward, name='bench-predict')}
    times = {name: [] for name in beside}
    for _ in range(rounds):
        for name, other in beside.items():
            stop = _live_thread(other) if other else None
            box = []
            worker = threading.Thread(target=lambda: box.append(decode_ms()))
            worker.start()
            worker.join(600)
            if stop:
                stop.set()
            times[name].append(round(box[0], 2))
            time.sleep(0.3)  # the live thread exits before the next cell
        print({name: value[-1] for name, value in times.items()}, flush=True)
    return {name: {'ms_per_step': value, 'median': round(statistics.median(value), 2)}
            for name, value in times.items()}


def _threads(pid: int) -> int:
    return len(os.listdir(f'/proc/{pid}/task'))


def node(params: dict, item_id: str, precisions: list, rounds: int, tokens: int) -> dict:
    """Time pinned goals before and after one MODE_AUTO goal on one node."""
    import rclpy
    from timebill_ros.core.request import Mode
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.tools.client import InstructClient, make_goal, outcome_name
    from timebill_ros.tools.process import NodeProcess
    item = {i.id: i for i in robot_workload.load()}[item_id]
    rclpy.init()
    proc = NodeProcess(params, ready_timeout=900, namespace='/omp_probe')
    client = InstructClient('/omp_probe/timebill/instruct', 'omp_probe_client',
                            '/omp_probe/timebill/responses')
    rows = []
    try:
        client.wait_for_server(60)

        def ask(mode, precision='', budget=60.0):
            goal = make_goal(item.instruction, budget, item.context, mode=int(mode),
                             max_new_tokens=tokens, precision=precision,
                             expected_tokens=tokens if mode == Mode.NONE else 0)
            return client.ask(goal, 300.0).result

        def probe(phase):
            for precision in precisions:
                result = ask(Mode.NONE, precision)
                rows.append({'phase': phase, 'precision': precision or 'node dtype',
                             'tokens': result.tokens, 'ms_per_step': round(
                                 1e3 * result.decode_s / max(1, result.tokens - 1), 2)})
                print(rows[-1], flush=True)
        for _ in range(rounds):
            probe('before')
        threads_before = _threads(proc.proc.pid)
        auto = ask(Mode.AUTO, budget=30.0)
        threads_after = _threads(proc.proc.pid)
        for _ in range(rounds):
            probe('after')
    finally:
        client.close()
        proc.stop()
        rclpy.try_shutdown()
    summary = {}
    for precision in {row['precision'] for row in rows}:
        phase = {p: statistics.median(r['ms_per_step'] for r in rows
                                      if r['precision'] == precision and r['phase'] == p)
                 for p in ('before', 'after')}
        summary[precision] = {**{p: round(v, 2) for p, v in phase.items()},
                              'after_over_before': round(phase['after'] / phase['before'], 3)}
    return {'item': item_id, 'rows': rows, 'summary': summary,
            'auto_goal': {'outcome': outcome_name(auto.outcome), 'tokens': auto.tokens},
            'node_threads': {'before_auto': threads_before, 'after_auto': threads_after}}


def markdown(report: dict) -> str:
    """Return the README tables."""
    lines = [f"# Decode steps beside a second OpenMP team ({report['date']})", '',
             f"`{report['command']}` at {report['commit']} on {report['machine']}.", '']
    if 'inproc' in report:
        lines += ['In one process, decode steps of the model on a worker thread after an '
                  f"80-token prompt ({report['rounds']} rounds, each the median of its "
                  'steps):', '',
                  '| beside the decode thread | ms per step, median | each round |',
                  '|---|---|---|']
        lines += [f"| {name} | {cell['median']} | {', '.join(map(str, cell['ms_per_step']))} |"
                  for name, cell in report['inproc'].items()]
        lines.append('')
    if 'node' in report:
        node_part = report['node']
        threads = node_part['node_threads']
        lines += [f"Through one node, goal `{node_part['item']}` pinned to each precision, "
                  f"{report['rounds']} times before and after one MODE_AUTO goal "
                  f"(outcome {node_part['auto_goal']['outcome']}); node threads "
                  f"{threads['before_auto']} -> {threads['after_auto']}:", '',
                  '| precision | ms per step before | after | after / before |',
                  '|---|---|---|---|']
        lines += [f"| {name} | {cell['before']} | {cell['after']} | {cell['after_over_before']} |"
                  for name, cell in sorted(node_part['summary'].items())]
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Run the parts asked for and write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--parts', default='inproc,node', help='inproc, node or both')
    parser.add_argument('--model', default='embedded', help='model of the in-process part')
    parser.add_argument('--rounds', type=int, default=4, help='rounds of each part')
    parser.add_argument('--steps', type=int, default=40, help='in-process steps a cell')
    parser.add_argument('--item', default='decision-002', help='workload item of the goals')
    parser.add_argument('--precisions', default='int8-weight,llama.cpp-q4_1',
                        help="pinned precisions of the node part ('' = the node's dtype)")
    parser.add_argument('--tokens', type=int, default=128, help='answer cap of the goals')
    parser.add_argument('--param', action='append', default=[], metavar='NAME=VALUE',
                        help='node parameter over config/timebill.yaml (repeatable)')
    parser.add_argument('--out', help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    parts = set(args.parts.split(','))
    out = harness.claim_out(args.out, 'openmp_team')
    given = sys.argv[1:] if argv is None else argv
    report = {'command': ' '.join(['python -m benchmarks.bench_openmp_team', *given]),
              'commit': common.commit(),
              'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
              'machine': common.machine(), 'rounds': args.rounds}
    if 'inproc' in parts:
        report['inproc'] = inproc(args.model, args.rounds, args.steps)
    if 'node' in parts:
        params = {**common.shipped_params(), **common.param_pairs(args.param)}
        report['node'] = node(params, args.item, args.precisions.split(','), args.rounds,
                              args.tokens)
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
