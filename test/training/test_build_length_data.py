# SPDX-License-Identifier: Apache-2.0
"""Length-label building on a few real prompts with the tiny random-weight model."""

import json

import numpy as np
import pytest

from training import build_length_data
from timebill_ros.evaluation.length_data import PROBE_LAYERS, prompt_texts, source_of
from timebill_ros.runtime.model import load_model


def _labels(folder):
    return [json.loads(line) for line in (folder / 'labels.jsonl').read_text().splitlines()]


def test_builds_labels_and_features_resumably_from_two_sources(tmp_path):
    out = tmp_path / 'data'
    common = ['--model', 'tiny-random', '--out', str(out), '--n-max', '6', '--batch-size', '2']
    assert build_length_data.main(common + ['--prompts', '3']) == 0
    first = _labels(out)
    assert len(first) == 3 and len({row['id'] for row in first}) == 3
    for row in first:
        assert row['source'] == 'sharegpt' and 4 <= row['prompt_tokens'] <= 512
        assert 0 <= row['length'] <= 6 and row['hit_max'] == (row['length'] >= 6)
    # Resumed with a larger count: only the missing prompts are labelled.
    assert build_length_data.main(common + ['--prompts', '4']) == 0
    assert [row['id'] for row in _labels(out)[:3]] == [row['id'] for row in first]
    assert len(_labels(out)) == 4
    # Task-style prompts join the same folder, tagged with their source.
    assert build_length_data.main(common + ['--prompts', '2', '--source', 'squad']) == 0
    rows = _labels(out)
    assert [source_of(row['id']) for row in rows] == ['sharegpt'] * 4 + ['squad'] * 2
    settings = json.loads((out / 'settings.json').read_text())
    assert settings['n_max'] == 6 and set(settings['sources']) == {'sharegpt', 'squad'}
    # One feature row per label, (probe layers x hidden) for last token and mean.
    ids, shapes = [], set()
    for chunk in sorted(out.glob('features-*.npz')):
        data = np.load(chunk)
        ids += [str(i) for i in data['ids']]
        shapes |= {data['last'].shape[1:], data['mean'].shape[1:]}
    assert sorted(ids) == sorted(row['id'] for row in rows)
    tiny = load_model('tiny-random')
    assert shapes == {(len(PROBE_LAYERS), tiny.model.config.hidden_size)}
    # The texts are rebuilt from the packages by id (nothing third-party is stored).
    texts = prompt_texts(tiny.tokenizer, ids)
    assert set(texts) == set(ids) and all(texts.values())


def test_refuses_a_folder_built_with_other_settings(tmp_path):
    out = tmp_path / 'data'
    args = ['--model', 'tiny-random', '--out', str(out), '--batch-size', '2', '--prompts', '1']
    assert build_length_data.main(args + ['--n-max', '4']) == 0
    with pytest.raises(SystemExit, match='other settings'):
        build_length_data.main(args + ['--n-max', '5'])


def test_robot_labels_take_extra_train_items_of_other_seeds(tmp_path):
    out = tmp_path / 'data'
    assert build_length_data.main(['--model', 'tiny-random', '--out', str(out), '--n-max', '3',
                                   '--batch-size', '4', '--prompts', '10000', '--source',
                                   'robot', '--robot-seeds', '101']) == 0
    ids = {row['id'] for row in _labels(out)}
    extra = {rid for rid in ids if rid.startswith('robot-s101-')}
    assert len(ids) - len(extra) == 262 and len(extra) >= 100
    assert 'robot_extra_train' in json.loads((out / 'settings.json').read_text())['sources']
    texts = prompt_texts(load_model('tiny-random').tokenizer, ids)
    assert set(texts) == ids
