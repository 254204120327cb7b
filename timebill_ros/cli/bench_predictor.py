"""Benchmark: what the length predictor adds to a goal, relative to the target's prefill.

For prompts of several lengths, times the shipped predictor (features + head)
and a plain prefill of the same prompt, and prints the overhead ratio. On this
CPU the predictor cannot run concurrently with prefill without slowing it, so
the overhead is added, not hidden.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time


def main(argv=None) -> int:
    """Print predictor time, prefill time and their ratio per prompt length."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--lengths', default='128,512,1024,2048')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--max-tokens', type=int, default=0,
                        help='predictor input bound (the node parameter '
                             'length_predictor_max_tokens; 0 = whole prompt)')
    parser.add_argument('--accuracy-data', default='',
                        help='a build_length_data folder: instead of timing, report the '
                             'head MAE with and without --max-tokens on the labelled '
                             'prompts longer than it')
    args = parser.parse_args(argv)
    if args.accuracy_data:
        return bound_accuracy(args.accuracy_data, args.max_tokens)
    from timebill_ros.core.request import Mode, OverrunPolicy, Request
    from timebill_ros.runtime.length_heads import LinearHead
    from timebill_ros.runtime.model import load_model, prompt_ids
    from timebill_ros.runtime.predictor import HeadPredictor, SHIPPED_HEAD
    from timebill_ros.runtime.profiler import time_prefill_grid
    loaded = load_model('embedded')
    predictor = HeadPredictor.from_head(LinearHead.load(SHIPPED_HEAD), loaded, args.max_tokens)
    bound = args.max_tokens or 'none'
    print(f'predictor {predictor.name}, input bound {bound}; {platform.node()} '
          f'{platform.machine()} {os.cpu_count()} cpus, {time.strftime("%Y-%m-%d")}\n')
    print('| prompt tokens | predictor ms | prefill ms | overhead |\n|---|---|---|---|')
    filler = 'The committee reviewed the quarterly maintenance report in detail. '
    for n in (int(v) for v in args.lengths.split(',')):
        context = filler * max(1, n // 12)
        request = Request('Summarise the report.', context, 60.0, OverrunPolicy.KILL,
                          Mode.NONE, 256, 1.0)
        tokens = len(prompt_ids(loaded.tokenizer, request.instruction, request.context))
        predictor.predict(request, tokens)  # warm up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            predictor.predict(request, tokens)
            times.append(time.perf_counter() - t0)
        pred_s = statistics.median(times)
        prefill_s = time_prefill_grid(loaded, [tokens], args.repeats)[tokens]
        print(f'| {tokens} | {pred_s * 1000:.1f} | {prefill_s * 1000:.1f} | '
              f'{pred_s / prefill_s:.1%} |')
    return 0


def bound_accuracy(folder: str, bound: int) -> int:
    """Print the shipped head's MAE on labelled prompts over ``bound``, whole vs bounded."""
    from timebill_ros.cli.train_length import load_data
    from timebill_ros.core.request import Mode, OverrunPolicy, Request
    from timebill_ros.runtime.length_data import iter_first_turns
    from timebill_ros.runtime.length_heads import LinearHead
    from timebill_ros.runtime.model import load_model
    from timebill_ros.runtime.predictor import HeadPredictor, SHIPPED_HEAD
    if bound <= 0:
        raise SystemExit('bench_predictor: --accuracy-data needs --max-tokens > 0')
    labels, _ = load_data(folder)
    long = {row['id']: row for row in labels if row['prompt_tokens'] > bound}
    texts = {rid: text.strip() for rid, text in iter_first_turns() if rid in long}
    loaded = load_model('embedded')
    head = LinearHead.load(SHIPPED_HEAD)
    whole = HeadPredictor.from_head(head, loaded)
    bounded = HeadPredictor.from_head(head, loaded, bound)
    errors = {'whole': [], 'bounded': []}
    changed = 0
    for rid, text in texts.items():
        request = Request(text, '', 60.0, OverrunPolicy.KILL, Mode.NONE, 10_000, 1.0)
        a, b = whole.predict(request, 0), bounded.predict(request, 0)
        truth = long[rid]['length']
        errors['whole'].append(abs(a - truth))
        errors['bounded'].append(abs(b - truth))
        changed += a != b
    n = len(errors['whole'])
    print(f'{n} of {len(labels)} labelled prompts are over {bound} tokens; shipped head '
          f'{whole.name}: MAE whole prompt {statistics.mean(errors["whole"]):.1f}, bounded '
          f'{statistics.mean(errors["bounded"]):.1f} tokens; prediction changed for '
          f'{changed} of {n}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
