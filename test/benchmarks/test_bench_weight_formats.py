# SPDX-License-Identifier: Apache-2.0
"""bench_weight_formats' builders (the timings are the benchmark itself)."""

import torch

from benchmarks.bench_weight_formats import (
    ceiling, divergences, formats, matmul_split, weight_mib)
from timebill_ros.runtime.model import load_model


def test_every_format_decodes_and_int8_weights_are_smaller():
    full = load_model('tiny-random')
    built = formats(full)
    assert {'float32', 'int8-dynamic (torch.ao)', 'int8-weight (aten int8pack)',
            'bfloat16'} <= set(built)
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        for loaded in built.values():
            assert loaded.model(input_ids=ids).logits.shape[-1] == full.model.config.vocab_size
    assert weight_mib(built['bfloat16'].model) < weight_mib(full.model)
    assert weight_mib(built['int8-dynamic (torch.ao)'].model) < weight_mib(full.model)
    assert weight_mib(built['int8-weight (aten int8pack)'].model) < weight_mib(full.model)
    kl = divergences(built, 2)
    # float32 against itself is exactly 0; the tiny model's near-uniform outputs leave the
    # others within float error of 0 too, so only their presence is checked here.
    assert set(kl) == set(built) and kl['float32'] == 0.0
    assert all(abs(value) < 1.0 for value in kl.values())


def test_matmul_split_counts_the_weight_matmuls_of_each_format():
    full = load_model('tiny-random')
    built = formats(full)
    for name in ('float32', 'int8-dynamic (torch.ao)', 'int8-weight (aten int8pack)'):
        matmul, other = matmul_split(built[name], kv=8, steps=2)
        assert matmul > 0.0 and other > 0.0, name
    assert ceiling({'matmul_ms': 30.0, 'other_ms': 10.0}) == 4.0
