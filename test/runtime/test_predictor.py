# SPDX-License-Identifier: Apache-2.0
"""Length-predictor features match the model's own hidden states; heads plug in."""

import numpy as np
import pytest

torch = pytest.importorskip('torch')

from timebill_ros.core.request import Mode, OverrunPolicy, Request  # noqa: E402
from timebill_ros.runtime.length_heads import LinearHead  # noqa: E402
from timebill_ros.runtime.model import load_model, prompt_ids  # noqa: E402
from timebill_ros.runtime.predictor import (  # noqa: E402
    featurizer_for, HeadPredictor, TargetLayerFeatures)


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def request(text, max_new=128):
    return Request(text, '', 5.0, OverrunPolicy.KILL, Mode.NONE, max_new, 1.0)


@pytest.mark.parametrize('layers, pooling', [(1, 'last'), (1, 'mean'), (2, 'last')])
def test_partial_forward_equals_hf_hidden_states(tiny, layers, pooling):
    req = request('How do robots plan a path?')
    ids = prompt_ids(tiny.tokenizer, req.instruction)
    with torch.inference_mode():
        states = tiny.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    ref = states[layers][0, -1] if pooling == 'last' else states[layers][0].mean(0)
    got = TargetLayerFeatures(tiny, layers, pooling)(req)
    assert np.allclose(got, ref.numpy(), atol=1e-5)


def test_head_predictor_caps_at_max_new_tokens(tiny):
    hidden = tiny.model.config.hidden_size
    # A head whose bucket 16 always wins: predicts 16 * 16 = 256 tokens.
    weight = np.zeros((17, hidden), dtype=np.float32)
    bias = np.zeros(17, dtype=np.float32)
    bias[16] = 1.0
    head = LinearHead(weight, bias, np.zeros(hidden, np.float32), np.ones(hidden, np.float32),
                      16, 256, 'L1-last', 'tiny-random')
    predictor = HeadPredictor.from_head(head, tiny)
    # At the labels' N_max the target runs to the cap: plan for the goal's own cap.
    assert predictor.predict(request('hi', max_new=300), 10) == 300
    assert predictor.predict(request('hi', max_new=100), 10) == 100
    bias[16], bias[8] = 0.0, 1.0  # bucket 8: 128 tokens, below N_max
    assert predictor.predict(request('hi', max_new=300), 10) == 128
    assert predictor.predict(request('hi', max_new=100), 10) == 100
    with pytest.raises(ValueError):
        featurizer_for('L99-last', tiny)
    with pytest.raises(ValueError):
        featurizer_for('bogus', tiny)


def test_long_prompts_are_shortened_to_head_and_tail(tiny):
    req = Request('Summarise the text.', ' '.join(f'word{i}' for i in range(400)),
                  5.0, OverrunPolicy.KILL, Mode.NONE, 64, 1.0)
    ids = prompt_ids(tiny.tokenizer, req.instruction, req.context)
    assert len(ids) > 200
    kept = ids[:32] + ids[-(100 - 32):]
    with torch.inference_mode():
        states = tiny.model(torch.tensor([kept]), output_hidden_states=True).hidden_states
    got = TargetLayerFeatures(tiny, 2, 'last', max_tokens=100)(req)
    assert np.allclose(got, states[2][0, -1].numpy(), atol=1e-5)
    short = request('How do robots plan a path?')  # under the bound: untouched
    assert np.allclose(TargetLayerFeatures(tiny, 2, 'last', max_tokens=100)(short),
                       TargetLayerFeatures(tiny, 2, 'last')(short))
    with pytest.raises(ValueError):
        TargetLayerFeatures(tiny, 2, 'last', max_tokens=64)


def test_texts_asked_for_at_once_are_embedded_together_as_each_alone():
    """A burst of goals shares MiniLM forwards, and each gets its own text's embedding."""
    import threading
    import time
    from timebill_ros.runtime.predictor import MiniLMFeatures
    features = MiniLMFeatures()
    texts = [f'Stop at dock {i}.' if i % 2 else f'Describe the route to bay {i} in detail.'
             for i in range(8)]
    alone = [features.embed_batch([text])[0] for text in texts]
    forwards, embed_batch = [], features.embed_batch

    def counted(batch):
        forwards.append(len(batch))
        return embed_batch(batch)
    features.embed_batch = counted
    got = [None] * len(texts)
    start = threading.Barrier(len(texts))

    def ask(i):
        start.wait(10)
        got[i] = features.embed(texts[i])
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(texts))]
    with features._lock:  # one forward running: the others queue behind it
        for thread in threads:
            thread.start()
        for _ in range(1000):  # at most 10 s for all eight to queue
            if len(features._waiting) == len(texts):
                break
            time.sleep(0.01)
    for thread in threads:
        thread.join(30)
    assert sum(forwards) == len(texts) and len(forwards) < len(texts), forwards
    for vector, reference in zip(got, alone):
        assert np.allclose(vector, reference, atol=1e-4)


def test_a_failed_batch_raises_in_every_caller_it_took():
    """A forward that fails is each waiting caller's error, never a None embedding."""
    from timebill_ros.runtime.predictor import MiniLMFeatures
    features = MiniLMFeatures()

    def broken(batch):
        raise RuntimeError('out of memory')
    features.embed_batch = broken
    with pytest.raises(RuntimeError, match='out of memory'):
        features.embed('Stop at dock 3.')
    assert features._waiting == []


def test_the_traced_encoder_embeds_as_the_eager_one_at_any_batch_and_length():
    """Traced once on a padded pair, MiniLM gives eager's hidden states on other shapes."""
    import torch
    from timebill_ros.runtime.length_encoder import load_minilm
    from timebill_ros.runtime.predictor import MiniLMFeatures
    features = MiniLMFeatures()
    assert isinstance(features.model, torch.jit.ScriptModule)
    tokenizer, eager = load_minilm()
    batches = [['Go.'], ['Write a detailed essay about robot number 3.'] * 9,
               ['Dock 3 is free. ' * 80, 'Stop.'], ['left', 'Turn left at the second aisle.']]
    for texts in batches:
        enc = tokenizer(texts, truncation=True, max_length=256, padding=True,
                        return_tensors='pt')
        with torch.inference_mode():
            want = eager(**enc).last_hidden_state
        mask = enc['attention_mask'].unsqueeze(-1).float()
        pooled = ((want * mask).sum(1) / mask.sum(1)).numpy()
        assert np.allclose(features.embed_batch(texts), pooled, atol=1e-5), texts


def test_a_prediction_leaves_no_openmp_team_on_the_callers_thread(tiny, threads_left_behind):
    # The node's executor threads live on: a team one of them kept would sit beside the
    # decode loop's, and with more OpenMP threads than cores every team sleeps in waits.
    hidden = tiny.model.config.hidden_size
    head = LinearHead(np.zeros((17, hidden), np.float32), np.zeros(17, np.float32),
                      np.zeros(hidden, np.float32), np.ones(hidden, np.float32),
                      16, 256, 'L2-mean', 'tiny-random')
    predictor = HeadPredictor.from_head(head, tiny)
    req = Request('Summarise the text.', ' '.join(f'word{i}' for i in range(600)),
                  5.0, OverrunPolicy.KILL, Mode.NONE, 64, 1.0)
    assert threads_left_behind(lambda: predictor.predict(req, 0),
                               warm_up=lambda: tiny.tokenizer('warm up')) == 0
