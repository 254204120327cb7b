"""bench_weight_formats' builders (the timings are the benchmark itself)."""

import torch

from timebill_ros.cli.bench_weight_formats import formats, weight_mib
from timebill_ros.runtime.model import load_model


def test_every_format_decodes_and_int8_weights_are_smaller():
    full = load_model('tiny-random')
    built = formats(full)
    assert {'float32', 'int8-dynamic (torch.ao)', 'bfloat16'} <= set(built)
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        for loaded in built.values():
            assert loaded.model(input_ids=ids).logits.shape[-1] == full.model.config.vocab_size
    assert weight_mib(built['bfloat16'].model) < weight_mib(full.model)
    assert weight_mib(built['int8-dynamic (torch.ao)'].model) < weight_mib(full.model)
