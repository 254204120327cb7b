# SPDX-License-Identifier: Apache-2.0
"""Layer-by-layer decoding with exits on the tiny random model."""

import pytest

torch = pytest.importorskip('torch')

from transformers import DynamicCache  # noqa: E402

from timebill_ros.core.early_exit import ExitRule, FORCED, FULL, LayerTimes, THRESHOLD  # noqa: E402,E501
from timebill_ros.runtime.early_exit import LayerwiseDecoder, measure_layer_times  # noqa: E402
from timebill_ros.runtime.model import load_model, prompt_ids  # noqa: E402


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def prefill(tiny, text='Plan a path around the obstacle.'):
    ids = prompt_ids(tiny.tokenizer, text)
    cache = DynamicCache()
    with torch.inference_mode():
        out = tiny.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return ids, cache, int(out.logits[0, -1].argmax())


def test_full_depth_steps_equal_the_model(tiny):
    ids, cache, token = prefill(tiny)
    ref_ids, ref_cache, _ = prefill(tiny)
    decoder = LayerwiseDecoder(tiny, None, None)
    for i in range(6):
        step = decoder.step(token, len(ids) + i, cache)
        with torch.inference_mode():
            out = tiny.model(input_ids=torch.tensor([[token]]), past_key_values=ref_cache,
                             position_ids=torch.tensor([[len(ids) + i]]), use_cache=True)
        assert step.kind == FULL and step.layer == decoder.num_layers
        assert step.token_id == int(out.logits[0, -1].argmax())
        token = step.token_id
    for layer in range(decoder.num_layers):
        assert torch.allclose(cache.layers[layer].keys, ref_cache.layers[layer].keys, atol=1e-5)


def test_exit_at_the_last_candidate_is_the_full_model(tiny):
    # A rule whose only candidate is the last layer never exits early.
    ids, cache, token = prefill(tiny)
    layers = tiny.num_layers
    full = LayerwiseDecoder(tiny, None, None).step(token, len(ids), prefill(tiny)[1])
    step = LayerwiseDecoder(tiny, ExitRule((layers,), 0.01, 0.01),
                            LayerTimes(tuple([1e-3] * layers), 1e-3)).step(token, len(ids), cache)
    assert step.kind == FULL and step.token_id == full.token_id


def test_forced_exit_when_the_token_budget_is_below_the_remaining_layers(tiny):
    ids, cache, token = prefill(tiny)
    layers = tiny.num_layers
    times = LayerTimes(tuple([1.0] * layers), 1.0)  # pretend each layer takes a second
    decoder = LayerwiseDecoder(tiny, ExitRule((1,), 1.0, 1.0), times)
    step = decoder.step(token, len(ids), cache, token_budget_s=0.5)
    assert step.kind == FORCED and step.layer == 1
    roomy = decoder.step(step.token_id, len(ids) + 1, cache, token_budget_s=1e6)
    assert roomy.kind == FULL


def test_cache_stays_aligned_across_layers_after_mixed_exits(tiny):
    ids, cache, token = prefill(tiny)
    layers = tiny.num_layers
    times = LayerTimes(tuple([1e-4] * layers), 1e-4)
    kinds = []
    plans = [(ExitRule((1,), 1e-9, 1e-9), None),        # exits at layer 1 on any confidence
             (None, None),                              # full depth
             (ExitRule((1,), 1.0, 1.0), 1e-9)]         # forced at layer 1
    for i in range(6):
        rule, budget = plans[i % 3]
        step = LayerwiseDecoder(tiny, rule, times).step(token, len(ids) + i, cache, budget)
        kinds.append(step.kind)
        token = step.token_id
        lengths = {cache.layers[j].keys.shape[-2] for j in range(layers)}
        assert lengths == {len(ids) + i + 1}
    assert {THRESHOLD, FULL, FORCED} <= set(kinds)
    # Skipped layers got keys computed from the exit state, not zeros.
    assert cache.layers[layers - 1].keys[0, :, len(ids)].abs().sum() > 0


def test_measured_layer_times_are_positive(tiny):
    times = measure_layer_times(tiny, n_kv=32, steps=2)
    assert len(times.layers) == tiny.num_layers and times.full_s > 0 and times.head_s > 0


def test_exact_kv_mode_leaves_the_full_model_cache(tiny):
    ids, cache, token = prefill(tiny)
    _, ref_cache, _ = prefill(tiny)
    layers = tiny.num_layers
    decoder = LayerwiseDecoder(tiny, ExitRule((1,), 1e-9, 1e-9),
                               LayerTimes(tuple([1e-4] * layers), 1e-4), exact_kv=True)
    step = decoder.step(token, len(ids), cache)
    assert step.kind == THRESHOLD and step.layer == 1
    LayerwiseDecoder(tiny, None, None).step(token, len(ids), ref_cache)
    for layer in range(layers):
        assert torch.allclose(cache.layers[layer].keys, ref_cache.layers[layer].keys, atol=1e-5)
        assert torch.allclose(cache.layers[layer].values, ref_cache.layers[layer].values,
                              atol=1e-5)
