# SPDX-License-Identifier: Apache-2.0
"""train_length end to end on a small synthetic task over real prompt ids."""

import json

import numpy as np

from training import train_length
from timebill_ros.evaluation.length_data import PROBE_LAYERS, select_prompts, task_prompts
from timebill_ros.runtime.length_heads import LinearHead
from timebill_ros.runtime.model import load_model

N_MAX = 256


def _write_folder(folder, rng):
    """Write a build_length_data-shaped folder whose lengths follow the last-token state."""
    tok = load_model('tiny-random').tokenizer
    ids = [rid for rid, _ in select_prompts(tok, 48)] + \
        [rid for rid, _ in task_prompts('squad', tok, 12)]
    n, hidden = len(ids), 8
    signal = rng.uniform(-1.0, 1.0, n)
    last = rng.normal(0.0, 1.0, (n, len(PROBE_LAYERS), hidden))
    last[:, :, 0] = signal[:, None]  # every probe layer carries the length
    mean = rng.normal(0.0, 1.0, (n, len(PROBE_LAYERS), hidden))
    lengths = np.clip(np.round(140 + 150 * signal), 1, N_MAX).astype(int)
    folder.mkdir()
    (folder / 'settings.json').write_text(json.dumps(
        {'model': 'SmolLM2-135M-Instruct', 'n_max': N_MAX, 'decoding': 'greedy'}))
    with open(folder / 'labels.jsonl', 'w', encoding='utf-8') as handle:
        for rid, length in zip(ids, lengths):
            handle.write(json.dumps({'id': rid, 'prompt_tokens': 50, 'length': int(length),
                                     'hit_max': bool(length >= N_MAX)}) + '\n')
    np.savez_compressed(folder / 'features-1.npz', ids=np.array(ids),
                        last=last.astype(np.float16), mean=mean.astype(np.float16))
    return n


def test_trains_compares_and_reports_the_targets(tmp_path):
    n = _write_folder(tmp_path / 'data', np.random.default_rng(0))
    head_path = tmp_path / 'head.npz'
    assert train_length.main(['--data', str(tmp_path / 'data'), '--results',
                              str(tmp_path / 'results'), '--head-out', str(head_path),
                              '--encoder-layers', '1', '--encoder-epochs', '1']) == 0
    report = json.loads((tmp_path / 'results' / 'length_predictor.json').read_text())
    assert report['prompts'] == n and sum(report['split'].values()) == n
    names = [row['predictor'] for row in report['rows']]
    assert any('fine-tuned' in name for name in names)
    assert sum('coarse' in str(row['buckets']) for row in report['rows']) == 4
    # The lengths are linear in one feature: the fine probe learns them.
    targets = report['targets']
    assert targets['r2'] > 0.8 and targets['r2_met']
    assert len(targets['coarse']) == 4
    assert all(c['met'] == (targets['mae'] <= c['mae'] / 2) for c in targets['coarse'])
    assert set(targets['coarse_floor_mae']) == {'5-class', '10-class'}
    assert 0 <= targets['coarse_floor_mae']['10-class'] <= targets['coarse_floor_mae']['5-class']
    assert set(report['default_by_source']) <= {'sharegpt', 'squad'}
    assert report['pessimistic_factor']['k'] >= 1.0
    text = (tmp_path / 'results' / 'length_predictor.md').read_text()
    assert 'Targets (test split)' in text and 'Learning curve' in text
    # The default head is written and reads the features it was trained on.
    head = LinearHead.load(head_path)
    assert head.bucket_size == 16 and head.features.endswith('-last')
    probe = np.zeros((1, 8), dtype=np.float32)
    probe[0, 0] = 0.5
    assert abs(head.predict(probe)[0] - 215) < 40
