# SPDX-License-Identifier: Apache-2.0
"""train_length_robot end to end on synthetic features over the real workload ids."""

import json

import numpy as np

from training import train_length_robot
from timebill_ros.evaluation import robot_workload
from timebill_ros.runtime.length_heads import LinearHead


def test_trains_calibrates_writes_and_reports(tmp_path):
    rng = np.random.default_rng(0)
    items = robot_workload.load()
    extra = robot_workload.extra_train([101])
    ids = np.array([f'robot-{item.id}' for item in items + extra])
    # Lengths follow the first feature: a learnable signal plus noise.
    signal = rng.uniform(0, 1, len(ids))
    lengths = np.clip(np.round(10 + 200 * signal + rng.normal(0, 8, len(ids))), 1, 256)
    last = rng.normal(0, 1, (len(ids), 5, 8)).astype(np.float16)
    last[:, :, 0] = signal[:, None]
    np.savez(tmp_path / 'features-1.npz', ids=ids, last=last, mean=last)
    with open(tmp_path / 'labels.jsonl', 'w', encoding='utf-8') as handle:
        for rid, n in zip(ids, lengths):
            handle.write(json.dumps({'id': str(rid), 'source': 'robot', 'prompt_tokens': 50,
                                     'length': int(n), 'hit_max': bool(n >= 256)}) + '\n')
    (tmp_path / 'settings.json').write_text(json.dumps({'model': 'tiny', 'n_max': 256}))
    head_path = tmp_path / 'head.npz'
    assert train_length_robot.main(['--data', str(tmp_path), '--head-out', str(head_path),
                                    '--results', str(tmp_path / 'results'),
                                    '--l2', '1', '--decodes', 'median']) == 0
    head = LinearHead.load(head_path)
    assert head.target == 'tiny' and head.distribution is not None
    report = json.loads((tmp_path / 'results' / 'length_predictor_robot.json').read_text())
    assert report['split']['test'] == sum(item.split == 'test' for item in items)
    # The extra items of another generator seed are found by their ids and train only.
    assert report['split']['extra_train'] == len(extra)
    assert report['split']['train'] == sum(item.split == 'train' for item in items) + len(extra)
    trained = report['test']['trained on robot train split']['mae']
    assert trained < report['test']['max-new-tokens stand-in']['mae']
    assert 0.5 < report['test_coverage'] <= 1.0
