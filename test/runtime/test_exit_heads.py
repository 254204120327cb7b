# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from timebill_ros.runtime.exit_heads import ExitHeads, fit_map


def test_fit_recovers_a_linear_map_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8))
    w_true = rng.normal(size=(8, 8))
    y = x @ w_true + 0.5
    w, b = fit_map(x, y, ridge=1e-8)
    assert np.allclose(w, w_true, atol=1e-3) and np.allclose(b, 0.5, atol=1e-3)
    heads = ExitHeads('m', {3: (w, b)})
    heads.save(tmp_path / 'h.npz')
    back = ExitHeads.load(tmp_path / 'h.npz')
    assert back.target == 'm' and set(back.maps) == {3}
    assert np.allclose(back.maps[3][0], w, atol=1e-2)  # stored as float16
    with pytest.raises(ValueError):
        fit_map(x, y[:, :4])


def test_strong_ridge_shrinks_toward_the_identity():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 4))
    w, _ = fit_map(x, 3 * x, ridge=1e6)
    assert np.allclose(w, np.eye(4), atol=1e-3)


def test_decoder_uses_the_head_at_its_layer():
    torch = pytest.importorskip('torch')
    from transformers import DynamicCache
    from timebill_ros.core.early_exit import ExitRule, LayerTimes
    from timebill_ros.runtime.early_exit import LayerwiseDecoder
    from timebill_ros.runtime.model import load_model, prompt_ids
    tiny = load_model('tiny-random')
    d = tiny.model.config.hidden_size
    ids = prompt_ids(tiny.tokenizer, 'Stop at the gate.')
    times = LayerTimes(tuple([1e-4] * tiny.num_layers), 1e-4)
    rule = ExitRule((1,), 1e-9, 1e-9)  # always exits at layer 1
    # A map that sends every state to one fixed vector: the exit token is that vector's
    # argmax under the LM head, whatever the input.
    fixed = torch.randn(d)
    heads = ExitHeads('tiny', {1: (np.zeros((d, d), np.float32), fixed.numpy())})
    expected = int(tiny.model.lm_head(fixed).argmax())
    for token in (ids[-1], 5):
        cache = DynamicCache()
        with torch.inference_mode():
            tiny.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        step = LayerwiseDecoder(tiny, rule, times, heads=heads).step(token, len(ids), cache)
        assert step.layer == 1 and step.token_id == expected
