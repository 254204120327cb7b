# SPDX-License-Identifier: Apache-2.0
"""Train and calibrate the length head on the robot workload; compare it on the held-out split.

``python -m training.train_length_robot`` reads labels and prefill
features written by ``build_length_data --source robot`` (the target model's
own greedy answer lengths for every workload item), and:

1. picks the probe (layer, pooling) and weight decay by 5-fold cross-validation
   on the workload's *train* split (the test split is never used to choose);
2. calibrates the error distribution (``core.length.LengthDistribution``: true
   lengths per band of predictions) on the out-of-fold predictions, so admission
   can say how likely an answer is to fit;
3. fits the head on the whole train split, attaches the distribution, writes it
   (``--head-out``, default the shipped head), and
4. reports on the test split, per kind: MAE of the new head, of the previously
   shipped head and of the max-new-tokens stand-in, coverage of the planning
   quantile, and how often admission would have refused an answer that fits
   (results/length_predictor_robot.{md,json}).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import sys
import time

import numpy as np

from benchmarks import common, harness
from benchmarks.paths import DATA


def load(folder: str) -> tuple:
    """Return (label rows of robot prompts, {id: (last, mean) per probe layer})."""
    from training.train_length import load_data
    labels, feats = load_data(folder)
    return [r for r in labels if str(r['id']).startswith('robot-')], feats


def folds(n: int, k: int = 5, seed: int = 0) -> list:
    """Return k disjoint index arrays covering 0..n-1."""
    order = np.random.default_rng(seed).permutation(n)
    return [order[i::k] for i in range(k)]


def out_of_fold(x, y, parts, bucket_size, n_max, l2, decode) -> np.ndarray:
    """Predict every row with a head trained on the other folds."""
    from timebill_ros.runtime.length_heads import train_head
    pred = np.zeros(len(y))
    for part in parts:
        rest = np.setdiff1d(np.arange(len(y)), part)
        head = train_head(x[rest], y[rest], bucket_size, n_max, l2=l2)
        head.decode = decode
        pred[part] = head.predict(x[part])
    return pred


def probe_features(rows: list, feats: dict, layers) -> dict:
    """Return {'L<layer>-<last|mean>': rows x hidden} of the labelled prefill states."""
    features = {}
    for li, layer in enumerate(layers):
        for idx, kind in enumerate(('last', 'mean')):
            features[f'L{layer}-{kind}'] = np.stack(
                [feats[r['id']][idx][li] for r in rows]).astype(np.float32)
    return features


def text_features(rows: list) -> dict:
    """Return {'minilm': rows x 384}: the MiniLM embedding of each item's user turn."""
    from timebill_ros.evaluation.length_data import robot_prompts
    from timebill_ros.runtime.predictor import MiniLMFeatures
    texts = dict(robot_prompts(10 ** 6, wanted={r['id'] for r in rows}))
    embed = MiniLMFeatures().embed
    return {'minilm': np.stack([embed(texts[r['id']]) for r in rows]).astype(np.float32)}


def main(argv=None) -> int:
    """Choose, calibrate, train, write and report."""
    from timebill_ros.core.length import LengthDistribution, metrics
    from timebill_ros.evaluation.length_data import EXTRA_ID, PROBE_LAYERS, robot_items
    from timebill_ros.runtime.length_heads import LinearHead, train_head
    from timebill_ros.runtime.model import cache_root
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--data', default=str(cache_root() / 'length_data_robot'))
    parser.add_argument('--head-out', default=None, help='head .npz (default: see --ship)')
    parser.add_argument('--ship', action='store_true',
                        help='write the shipped length_head.npz (default: a new results folder)')
    parser.add_argument('--baseline-head', default='',
                        help='head to compare with (default: the one at --head-out before '
                        'this run: the shipped head with --ship)')
    parser.add_argument('--results', default=None, help=harness.OUT_HELP)
    parser.add_argument('--plan-quantile', type=float, default=0.9)
    parser.add_argument('--l2', type=float, nargs='+', default=[1e-2, 1.0, 100.0],
                        help='weight decays tried by cross-validation')
    parser.add_argument('--decodes', nargs='+', default=['median', 'mean'],
                        help='bucket decode rules tried by cross-validation')
    parser.add_argument('--features', choices=('target', 'text'), default='target',
                        help="'target': probes of the target model's prefill states (the "
                        "shipped head); 'text': the MiniLM embedding of the user turn (the "
                        'head the node plans with in front of vLLM replicas; write it with '
                        '--head-out timebill_ros/data/length_head_text.npz)')
    parser.add_argument('--no-extra-train', action='store_true',
                        help='leave out the extra train items of other generator seeds '
                        '(build_length_data --robot-seeds), to see what they add')
    parser.add_argument('--max-new-tokens', type=int, default=128,
                        help="the stand-in's prediction (the node's default answer cap)")
    args = parser.parse_args(argv)
    shipped_head = DATA / 'length_head.npz'
    args.results = args.results or str(harness.run_dir('length_predictor_robot'))
    args.head_out = args.head_out or str(
        shipped_head if args.ship else Path(args.results) / 'length_head.npz')
    with open(os.path.join(args.data, 'settings.json'), encoding='utf-8') as handle:
        settings = json.load(handle)
    n_max = int(settings['n_max'])
    labels, feats = load(args.data)
    if args.no_extra_train:
        labels = [r for r in labels if not EXTRA_ID.match(r['id'])]
    # The committed workload and any extra train items the labels hold.
    items = robot_items([r['id'] for r in labels])
    rows = [r for r in labels if r['id'] in items]
    train = np.array([i for i, r in enumerate(rows) if items[r['id']].split == 'train'])
    test = np.array([i for i, r in enumerate(rows) if items[r['id']].split == 'test'])
    n_extra = sum(bool(EXTRA_ID.match(r['id'])) for r in rows)
    y = np.array([r['length'] for r in rows], dtype=float)
    features = text_features(rows) if args.features == 'text' else \
        probe_features(rows, feats, PROBE_LAYERS)
    parts = folds(len(train))
    t0 = time.perf_counter()
    scores = []
    for name, x in features.items():
        for l2 in args.l2:
            for decode in args.decodes:
                pred = out_of_fold(x[train], y[train], parts, 16, n_max, l2, decode)
                scores.append((metrics(pred, y[train])['mae'], name, l2, decode))
                print(f'  {name} l2={l2:g} {decode}: cv MAE {scores[-1][0]:.1f}', flush=True)
    cv_mae, key, l2, decode = min(scores)
    x = features[key]
    oof = out_of_fold(x[train], y[train], parts, 16, n_max, l2, decode)
    dist = LengthDistribution.fit(oof, y[train], min_per_band=20)
    head = train_head(x[train], y[train], 16, n_max, l2=l2)
    head.features, head.target, head.decode, head.distribution = \
        key, settings['model'], decode, dist

    baseline_path = args.baseline_head or args.head_out
    baseline = LinearHead.load(baseline_path) if os.path.isfile(baseline_path) else None
    new_pred = head.predict(x[test])
    preds = {'trained on robot train split': new_pred,
             'max-new-tokens stand-in': np.full(len(test), float(args.max_new_tokens)),
             # What a node without a predictor plans with (the mean answer it has seen).
             'mean of the train answers': np.full(len(test), float(np.mean(
                 np.minimum(y[train], args.max_new_tokens))))}
    if baseline is not None and baseline.features in features:
        preds['previously shipped head'] = baseline.predict(features[baseline.features][test])
    cap = np.minimum(y[test], args.max_new_tokens)  # what the node's goals really produce
    table = {name: metrics(np.minimum(p, args.max_new_tokens), cap)
             for name, p in preds.items()}
    planned = np.array([dist.quantile(args.plan_quantile, p) for p in new_pred])
    kinds = sorted({items[rows[i]['id']].kind for i in test})
    per_kind = {}
    for kind in kinds:
        mine = np.array([items[rows[i]['id']].kind == kind for i in test])
        per_kind[kind] = {'test_items': int(mine.sum()),
                          'length_mean': float(cap[mine].mean()),
                          **{name: float(np.mean(np.abs(np.minimum(p[mine], args.max_new_tokens)
                                                        - cap[mine])))
                             for name, p in preds.items()}}
    coverage = float(np.mean(cap <= np.ceil(planned)))
    # How calibrated P(length <= n) is on unseen items: the share of true lengths under
    # each predicted quantile should match the level.
    calibration = {str(q): float(np.mean(y[test] <= np.array(
        [dist.quantile(q, p) for p in new_pred]) + 1e-9)) for q in (0.1, 0.5, 0.9)}
    os.makedirs(os.path.dirname(args.head_out), exist_ok=True)
    head.save(args.head_out)
    given = sys.argv[1:] if argv is None else argv
    report = {'machine': common.machine(), 'commit': common.commit(),
              'command': ' '.join(['python -m training.train_length_robot', *given]),
              'date': time.strftime('%Y-%m-%d'), 'settings': settings,
              'split': {'train': len(train), 'test': len(test), 'extra_train': n_extra},
              'chosen': {'features': key, 'l2': l2, 'decode': decode, 'cv_mae': cv_mae},
              'cv': [{'features': s[1], 'l2': s[2], 'decode': s[3], 'cv_mae': s[0]}
                     for s in scores],
              'test': table, 'per_kind': per_kind,
              'distribution': {'edges': list(dist.edges), 'samples': list(dist.samples),
                               'quantiles': [list(r) for r in dist.quantiles]},
              'plan_quantile': args.plan_quantile, 'test_coverage': coverage,
              'test_calibration': calibration,
              'minutes': (time.perf_counter() - t0) / 60}
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, 'length_predictor_robot.json'), 'w',
              encoding='utf-8') as handle:
        json.dump(report, handle, indent=2, default=str)
    names = list(preds)
    lines = [f"# Length predictor on the robot workload ({report['date']}, "
             f"{report['machine']})", '',
             f"`{report['command']}` at {report['commit']}; labels: "
             f"{settings['model']} greedy, N_max {n_max}; {len(train)} train ({n_extra} of them "
             f'extra items of other generator seeds) / {len(test)} test items (the '
             f'committed split); lengths compared at the node cap '
             f'{args.max_new_tokens}.', '',
             f'Chosen by 5-fold CV on train: {key}, l2 {l2:g}, {decode} decoding (CV MAE '
             f'{cv_mae:.1f}).', '', '| predictor (test split) | MAE | RMSE | R^2 |',
             '|---|---|---|---|']
    lines += [f"| {name} | {m['mae']:.1f} | {m['rmse']:.1f} | {m['r2']:.3f} |"
              for name, m in table.items()]
    lines += ['', 'MAE per kind (test split):', '',
              '| kind | items | mean length | ' + ' | '.join(names) + ' |',
              '|---|---|---|' + '---|' * len(names)]
    lines += [f"| {kind} | {v['test_items']} | {v['length_mean']:.1f} | "
              + ' | '.join(f'{v[n]:.1f}' for n in names) + ' |' for kind, v in per_kind.items()]
    lines += ['', f'Calibrated distribution: {len(dist.edges)} bands of predictions '
              f'({", ".join(map(str, dist.samples))} out-of-fold pairs). On the test split '
              f'the {args.plan_quantile:.0%} quantile covers {coverage:.1%} of true lengths; '
              'share of true lengths at or under the predicted quantile: '
              + ', '.join(f'q{float(q):.0%} -> {v:.0%}' for q, v in calibration.items()) + '.']
    with open(os.path.join(args.results, 'length_predictor_robot.md'), 'w',
              encoding='utf-8') as handle:
        handle.write('\n'.join(lines) + '\n')
    print('\n'.join(lines))
    return 0


if __name__ == '__main__':
    sys.exit(main())
