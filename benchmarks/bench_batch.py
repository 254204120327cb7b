# SPDX-License-Identifier: Apache-2.0
"""Batched decoding: the bound on this machine, then tokens/s through the node.

``python -m benchmarks.bench_batch`` (``make bench-batch``):

1. Bound: the embedded model's decode step with 1..N sequences in a
   ``BatchDecoder`` (prompts of the robot workload, no node): tokens/s = N / step.
2. Through the node (real action clients over DDS): N goals sent at once with
   MODE_NONE and a fixed answer length, on a node with ``max_batch`` N and on one
   with ``max_batch`` 1; tokens/s = answer tokens / time until the last result.
   A lone goal's time per output token on both nodes gives the batching overhead.
   Both nodes run side by side and take turns, so VM speed drift lands on both.

Outputs in --out (default results/batch): bench.json, README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

from benchmarks import harness

NAMESPACES = {1: '/batch1', 4: '/batch4'}


def bound(sizes: list, steps: int, threads: int) -> dict:
    """Return {batch size: median step seconds} of the bare batched decoder."""
    from timebill_ros.core.planning import Plan
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.runtime.batch import BatchDecoder
    from timebill_ros.runtime.engine import Engine
    from timebill_ros.runtime.model import intra_op_threads, load_model, prompt_ids
    from timebill_ros.runtime.profiler import fastest_threads
    loaded = load_model('embedded')
    engine = Engine(loaded)
    if threads < 0:
        threads = fastest_threads(loaded)[0]
    items = robot_workload.load('test')
    out = {}
    for size in sizes:
        batch, feed = BatchDecoder(loaded.model, loaded.device), {}
        for i in range(size):
            ids = prompt_ids(loaded.tokenizer, items[i].instruction)
            cache, logits, _ = engine.prefill(ids, Plan())
            batch.join(f's{i}', cache, len(ids))
            feed[f's{i}'] = engine.pick(logits)
        times = []
        with intra_op_threads(threads):
            for _ in range(steps):
                t = time.perf_counter()
                steps_out = batch.step(feed)
                times.append(time.perf_counter() - t)
                feed = {key: engine.pick(step.logits) for key, step in steps_out.items()}
        out[size] = statistics.median(times[2:])
    return out


def through_node(size: int, tokens: int, threads: int, repeats: int = 3) -> dict:
    """Return tokens/s of ``size`` goals at once and a lone goal's TPOT, per max_batch.

    Both nodes run side by side (one idles while the other serves) and take turns goal
    by goal, so a drift of this shared VM's speed lands on both alike.
    """
    from benchmarks.common import shipped_params
    from timebill_ros.tools.client import InstructClient, make_goal
    from timebill_ros.tools.process import NodeProcess
    sides, out = {}, {}
    try:
        for max_batch in (1, size):
            ns = NAMESPACES.get(max_batch, f'/batch{max_batch}')
            node = NodeProcess({**shipped_params(), 'max_batch': max_batch,
                                'decode_threads': threads}, ready_timeout=900, namespace=ns)
            sides[max_batch] = (node, InstructClient(f'{ns}/timebill/instruct',
                                                     f'batch_bench_{max_batch}',
                                                     f'{ns}/timebill/responses'))
            sides[max_batch][1].wait_for_server(60)
        goal = make_goal('Describe the route to the loading dock.', 120.0, mode=1,
                         max_new_tokens=tokens)
        lone = {max_batch: [] for max_batch in sides}
        for max_batch, (_, client) in sides.items():
            client.ask(goal, 200)  # warm
        for _ in range(repeats):
            for max_batch, (_, client) in sides.items():
                result = client.ask(goal, 200).result
                lone[max_batch].append(result.decode_s / max(1, result.tokens - 1))
        walls = {max_batch: [] for max_batch in sides}
        for _ in range(repeats):
            for max_batch, (_, client) in sides.items():
                start = time.monotonic()
                runs = [client.send(make_goal(f'Describe route {i} to the loading dock.',
                                              120.0, mode=1, max_new_tokens=tokens))
                        for i in range(size)]
                results = [client.wait(run, 300).result for run in runs]
                walls[max_batch].append((time.monotonic() - start,
                                         sum(r.tokens for r in results)))
        for max_batch in sides:
            wall = statistics.median(w for w, _ in walls[max_batch])
            answer = statistics.median(n for _, n in walls[max_batch])
            out[max_batch] = {'tokens_per_s': answer / wall, 'wall_s': wall,
                              'answer_tokens': answer, 'runs': walls[max_batch],
                              'lone_tpot_s': statistics.median(lone[max_batch]),
                              'lone_tpot_runs_s': lone[max_batch]}
    finally:
        for node, client in sides.values():
            client.close()
            node.stop()
    return out


def main(argv=None) -> int:
    """Run both parts and write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    parser.add_argument('--size', type=int, default=4)
    parser.add_argument('--tokens', type=int, default=64)
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--threads', type=int, default=-1,
                        help="decode threads, as the node's decode_threads (-1: probed)")
    parser.add_argument('--repeats', type=int, default=3,
                        help='lone goals and bursts per node (medians are reported)')
    args = parser.parse_args(argv)
    from benchmarks.common import machine
    from timebill_ros.tools.client import ensure_init
    out = harness.claim_out(args.out, 'batch')
    started = time.monotonic()
    steps = bound(list(range(1, args.size + 1)), args.steps, args.threads)
    ensure_init()
    node = through_node(args.size, args.tokens, args.threads, args.repeats)
    report = {'date': datetime.date.today().isoformat(), 'machine': machine(),
              'command': 'python -m benchmarks.bench_batch '
                         + ' '.join(argv if argv is not None else sys.argv[1:]),
              'minutes': (time.monotonic() - started) / 60, 'bound_step_s': steps,
              'node': node, 'size': args.size, 'tokens': args.tokens}
    (out / 'bench.json').write_text(json.dumps(report, indent=1) + '\n', encoding='utf-8')
    one, many = node[1], node[args.size]
    lines = [f"# Batched decoding ({report['date']})", '',
             f"`{report['command']}` on {report['machine']}, {report['minutes']:.1f} min.", '',
             '| sequences | bare step ms | bare tokens/s | x one |', '|---|---|---|---|']
    for size, step in steps.items():
        lines.append(f'| {size} | {step * 1e3:.1f} | {size / step:.1f} | '
                     f'{(size / step) / (1 / steps[1]):.2f} |')
    lines += ['', f'Through the node, {args.size} goals of {args.tokens} tokens sent at once:',
              '', '| node | tokens/s | wall s | lone goal TPOT ms |', '|---|---|---|---|',
              f"| max_batch 1 | {one['tokens_per_s']:.1f} | {one['wall_s']:.2f} | "
              f"{one['lone_tpot_s'] * 1e3:.1f} |",
              f"| max_batch {args.size} | {many['tokens_per_s']:.1f} | {many['wall_s']:.2f} | "
              f"{many['lone_tpot_s'] * 1e3:.1f} |", '',
              f"Speed-up {many['tokens_per_s'] / one['tokens_per_s']:.2f}x; lone-goal overhead "
              f"{many['lone_tpot_s'] / one['lone_tpot_s']:.3f}x (medians of {args.repeats} "
              'turns per node, the nodes taking turns).']
    (out / 'README.md').write_text('\n'.join(lines) + '\n', encoding='utf-8')
    print('\n'.join(lines))
    return 0


if __name__ == '__main__':
    sys.exit(main())
