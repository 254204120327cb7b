# SPDX-License-Identifier: Apache-2.0
"""Per-layer mixed precision on the tiny model: reference swaps, exact outputs, profiles."""

import copy
import warnings

import pytest
import torch

from timebill_ros.runtime.model import load_model, precision_variant
from timebill_ros.runtime.precision import (
    measure_unit_kl, MixedModel, time_apply, unit_times)


@pytest.fixture(scope='module')
def models():
    full = load_model('tiny-random')
    return full, precision_variant(full, 'int8-dynamic')


def logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def built_directly(full, lowered):
    """Quantise only the Linears of the lowered units, the way the int8 copy was made."""
    names = set()
    layers = len(full.model.model.layers)
    for name, module in full.model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        for u in lowered:
            prefix = 'lm_head' if u == layers else f'model.layers.{u}.'
            if name.startswith(prefix):
                names.add(name)
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(full.model), {n: qconfig for n in names}, dtype=torch.qint8).eval()


def test_a_mix_computes_exactly_what_a_model_built_at_that_mix_computes(models):
    full, low = models
    mixed = MixedModel(full, low)
    assert mixed.units == len(full.model.model.layers) + 1
    ids = torch.tensor([[1500, 1600, 1700, 1800, 1900]])
    assert torch.equal(logits(mixed.apply(()), ids), logits(full.model, ids))
    everything = range(mixed.units)
    assert torch.equal(logits(mixed.apply(everything), ids), logits(low.model, ids))
    for lowered in [(0,), (1, 2), (0, 2)]:
        assert torch.equal(logits(mixed.apply(lowered), ids),
                           logits(built_directly(full, lowered), ids)), lowered
    # Switching leaves both resident models untouched.
    mixed.apply(())
    assert torch.equal(logits(full.model, ids), logits(mixed.model, ids))
    assert full.model.model.layers[0] is mixed.model.model.layers[0]
    assert mixed.apply((0,)).model.layers[0] is low.model.model.layers[0]
    with pytest.raises(ValueError):
        mixed.apply((mixed.units,))
    assert time_apply(mixed, [(0,), (1, 2), ()] * 5) < 0.005


def test_unit_times_and_kl_are_measured_for_every_unit(models):
    full, low = models
    times = unit_times(full, kv_lengths=(16, 128), steps=2)
    assert len(times.a) == len(full.model.model.layers) + 1
    assert times.total(64) > 0.0
    kl = measure_unit_kl(MixedModel(full, low), [[1500, 1600, 1700], [1800, 1900]], follow=2)
    assert len(kl['unit_kl']) == len(times.a)
    assert all(k >= 0.0 for k in kl['unit_kl']) and kl['all_low_kl'] > 0.0
