# SPDX-License-Identifier: Apache-2.0
"""Benchmark: what the length predictor adds to a goal, relative to the target's prefill.

For prompts of several lengths, times the prefill + first token of a goal that
evicts (SnapKV, alpha 0.5) three ways: with the press known in advance (no
predictor: the baseline), with the shipped head run at admission (its own
forward over the first L layers, input bounded by --max-tokens), and with the
head read off the goal's own prefill (PrefillDecision + DeferredPress, the
node's default). Optionally also times a fine-tuned MiniLM predictor file
(--encoder), a separate model that on this 2-core CPU would only compete with
the prefill for the same cores, so it is timed on its own.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from timebill_ros.serving.loop import generate


def main(argv=None) -> int:
    """Print per prompt length the time each way and the overhead over the baseline."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--lengths', default='512,1024,2048')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--max-tokens', type=int, default=256,
                        help='admission predictor input bound (the node parameter '
                             'length_predictor_max_tokens; 0 = whole prompt)')
    parser.add_argument('--encoder', default='',
                        help='a fine-tuned MiniLM predictor .npz to time as well')
    parser.add_argument('--accuracy-data', default='',
                        help='a build_length_data folder: instead of timing, report the '
                             'head MAE with and without --max-tokens on the labelled '
                             'prompts longer than it')
    parser.add_argument('--accuracy-prompts', type=int, default=200,
                        help='with --accuracy-data: how many of those prompts (random, '
                             'seed 0; 0: all)')
    args = parser.parse_args(argv)
    if args.accuracy_data:
        return bound_accuracy(args.accuracy_data, args.max_tokens, args.accuracy_prompts)
    from timebill_ros.core.execution import PrefillDecision
    from timebill_ros.core.planning import Plan
    from timebill_ros.core.request import Mode, OverrunPolicy, Request
    from timebill_ros.runtime.engine import Engine
    from timebill_ros.runtime.length_heads import LinearHead
    from timebill_ros.runtime.model import load_model, prompt_ids
    from timebill_ros.runtime.predictor import HeadPredictor, load_predictor, SHIPPED_HEAD
    from timebill_ros.runtime.presses import press_for_plan
    loaded = load_model('embedded')
    engine = Engine(loaded, press_for_plan)
    engine.warm_up(press='snapkv')
    predictor = HeadPredictor.from_head(LinearHead.load(SHIPPED_HEAD), loaded, args.max_tokens)
    encoder = load_predictor(args.encoder, loaded) if args.encoder else None
    evict = Plan(eviction_ratio=0.5, press='snapkv')
    print(f'predictor {predictor.name} (layer {predictor.prefill_layer}), admission input '
          f'bound {args.max_tokens or "none"}; median of {args.repeats}; {platform.node()} '
          f'{platform.machine()} {os.cpu_count()} cpus, {time.strftime("%Y-%m-%d")}\n')
    print('| prompt tokens | prefill ms (alpha known) | at admission ms | overhead | '
          'in prefill ms | overhead |' + (' MiniLM-ft ms | share |' if encoder else '') +
          '\n|---|---|---|---|---|---|' + ('---|---|' if encoder else ''))
    filler = 'The committee reviewed the quarterly maintenance report in detail. '
    for n in (int(v) for v in args.lengths.split(',')):
        request = Request('Summarise the report.', filler * max(1, n // 12), 60.0,
                          OverrunPolicy.KILL, Mode.EVICTION, 256, 1.0)
        ids = prompt_ids(loaded.tokenizer, request.instruction, request.context)

        def known():
            generate(engine, ids, 1, evict, lambda ev: True)

        def admission():
            predictor.predict(request, len(ids))
            generate(engine, ids, 1, evict, lambda ev: True)

        def in_prefill():
            def plan_from(hidden):
                predictor.predict_from_hidden(hidden, request)
                return evict
            generate(engine, ids, 1, Plan(), lambda ev: True,
                     decide=PrefillDecision(predictor.prefill_layer, plan_from))

        ways = {'known': known, 'admission': admission, 'in_prefill': in_prefill}
        if encoder is not None:
            ways['encoder'] = lambda: encoder.predict(request, len(ids))
        times = {name: [] for name in ways}
        for name, run in ways.items():
            run()  # warm up
        for _ in range(args.repeats):  # interleaved, so drift hits every way alike
            for name, run in ways.items():
                t0 = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t0)
        ms = {name: statistics.median(values) * 1000 for name, values in times.items()}
        row = (f"| {len(ids)} | {ms['known']:.0f} | {ms['admission']:.0f} | "
               f"{ms['admission'] / ms['known'] - 1:+.1%} | {ms['in_prefill']:.0f} | "
               f"{ms['in_prefill'] / ms['known'] - 1:+.1%} |")
        if encoder is not None:
            row += f" {ms['encoder']:.0f} | {ms['encoder'] / ms['known']:.1%} |"
        print(row, flush=True)
    return 0


def bound_accuracy(folder: str, bound: int, sample: int = 0) -> int:
    """Print the shipped head's MAE on labelled prompts over ``bound``, whole vs bounded."""
    import numpy as np
    from training.train_length import load_data
    from timebill_ros.core.request import Mode, OverrunPolicy, Request
    from timebill_ros.evaluation.length_data import prompt_texts, source_of
    from timebill_ros.runtime.length_heads import LinearHead
    from timebill_ros.runtime.model import load_model
    from timebill_ros.runtime.predictor import HeadPredictor, SHIPPED_HEAD
    if bound <= 0:
        raise SystemExit('bench_predictor: --accuracy-data needs --max-tokens > 0')
    labels, _ = load_data(folder)
    long = [row for row in labels if row['prompt_tokens'] > bound]
    if sample and len(long) > sample:
        picked = np.random.default_rng(0).choice(len(long), sample, replace=False)
        long = [long[i] for i in sorted(picked)]
    loaded = load_model('embedded')
    texts = prompt_texts(loaded.tokenizer, [row['id'] for row in long])
    head = LinearHead.load(SHIPPED_HEAD)
    whole = HeadPredictor.from_head(head, loaded)
    bounded = HeadPredictor.from_head(head, loaded, bound)
    errors = {}  # source -> [(whole error, bounded error)]
    changed = 0
    for row in long:
        # Capped at the labels' N_max, as the lengths it is compared with.
        request = Request(texts[row['id']], '', 60.0, OverrunPolicy.KILL, Mode.NONE,
                          head.n_max, 1.0)
        a, b = whole.predict(request, 0), bounded.predict(request, 0)
        errors.setdefault(source_of(row['id']), []).append(
            (abs(a - row['length']), abs(b - row['length'])))
        changed += a != b
    every = [pair for pairs in errors.values() for pair in pairs]
    print(f'{len(every)} labelled prompts over {bound} tokens (of {len(labels)}); shipped head '
          f'{whole.name}: MAE whole prompt {np.mean([p[0] for p in every]):.1f}, bounded '
          f'{np.mean([p[1] for p in every]):.1f} tokens; prediction changed for '
          f'{changed} of {len(every)}')
    for name, pairs in sorted(errors.items()):
        print(f'  {name}: {len(pairs)} prompts, MAE whole {np.mean([p[0] for p in pairs]):.1f},'
              f' bounded {np.mean([p[1] for p in pairs]):.1f}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
