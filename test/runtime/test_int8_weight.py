# SPDX-License-Identifier: Apache-2.0
"""Weight-only int8 layers: rounding, the packed kernel, the copy, mixing and batching."""

from dataclasses import replace

import pytest

torch = pytest.importorskip('torch')

from timebill_ros.core.planning import Plan  # noqa: E402
from timebill_ros.runtime.engine import Engine  # noqa: E402
from timebill_ros.serving.loop import generate  # noqa: E402
from timebill_ros.runtime.int8_weight import Int8WeightLinear  # noqa: E402
from timebill_ros.runtime.model import (  # noqa: E402
    load_model, ModelLoadError, precision_variant, prompt_ids)
from timebill_ros.runtime.precision import MixedModel  # noqa: E402


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def test_weights_round_per_output_channel_and_the_kernel_computes_their_product():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=True)
    with torch.no_grad():
        linear.weight[3] *= 50.0  # one large row must not coarsen the others' scales
    layer = Int8WeightLinear(linear)
    assert layer.weight_int8.dtype == torch.int8 and layer.scale.shape == (48,)
    assert int(layer.weight_int8.abs().max()) >= 125  # the range is used
    # Symmetric rounding: each row within half a step of its float32 weights.
    error = (layer.dequantised() - linear.weight.detach()).abs().max(dim=1).values
    assert bool((error <= layer.scale.float() * 0.5 + 1e-7).all())
    assert float(error[0]) < float(error[3]) / 10
    x = torch.randn(2, 5, 64)
    with torch.inference_mode():
        got = layer(x)
        # The product of the bfloat16-rounded input and the dequantised weights.
        want = x.to(torch.bfloat16).float() @ layer.dequantised().T + linear.bias
    assert got.dtype == torch.float32 and got.shape == (2, 5, 48)
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2)
    assert linear.weight.dtype == torch.float32  # the float32 layer is untouched


def test_the_copy_equals_a_model_built_at_int8_weight_and_keeps_float32_elsewhere(tiny):
    variant = precision_variant(tiny, 'int8-weight')
    built = load_model('tiny-random', dtype='int8-weight')
    assert variant.dtype == 'int8-weight' and variant.tokenizer is tiny.tokenizer
    modules = list(variant.model.modules())
    assert not any(type(m) is torch.nn.Linear for m in modules)
    assert sum(isinstance(m, Int8WeightLinear) for m in modules) == \
        sum(type(m) is torch.nn.Linear for m in tiny.model.modules())
    assert variant.model.get_input_embeddings().weight.dtype == torch.float32
    ids = torch.tensor([[1500, 1600, 1700, 1800]])
    with torch.inference_mode():
        mine, theirs = variant.model(input_ids=ids).logits, built.model(input_ids=ids).logits
        full = tiny.model(input_ids=ids).logits
    assert torch.equal(mine, theirs)
    assert not torch.equal(mine, full) and torch.allclose(mine, full, atol=0.1)
    with pytest.raises(ModelLoadError, match='CPU only'):
        precision_variant(replace(tiny, device='cuda'), 'int8-weight')


def test_int8_weight_decodes_after_a_float32_prefill_alone_switched_and_mixed(tiny):
    from transformers import DynamicCache
    variant = precision_variant(tiny, 'int8-weight')
    engine = Engine(tiny, variants={'int8-weight': variant}, decode_threads=1)
    ids = prompt_ids(tiny.tokenizer, 'Report the battery level.')

    def by_hand(switch_at: int, steps: int) -> list:
        """Float32 prefill and steps before ``switch_at``, then int8-weight steps."""
        cache, out = DynamicCache(), []
        with torch.inference_mode():
            logits = tiny.model(input_ids=torch.tensor([ids]), past_key_values=cache,
                                use_cache=True).logits
            for i in range(steps):
                token = int(logits[0, -1].argmax())
                out.append(token)
                model = variant.model if i + 1 >= switch_at else tiny.model
                logits = model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                               use_cache=True).logits
        return out
    pinned, switched = [], []
    generate(engine, ids, 6, Plan(precision='int8-weight'),
             lambda event: pinned.append(event.token_id) or True)
    stats = generate(engine, ids, 6, Plan(), lambda event: switched.append(event.token_id)
                     or True, switch=lambda i: 'int8-weight' if i >= 2 else '')
    assert pinned == by_hand(1, 6)
    assert stats.switched_to == 'int8-weight' and switched == by_hand(3, 6)
    # Per-layer: its layers hand float32 hidden states to float32 ones.
    mixed = MixedModel(tiny, variant)
    probe = torch.tensor([[1500, 1600, 1700]])
    with torch.inference_mode():
        everything = mixed.apply(range(mixed.units))(input_ids=probe).logits
        assert torch.equal(everything, variant.model(input_ids=probe).logits)
        one = mixed.apply((0,))(input_ids=probe).logits
        assert one.dtype == torch.float32 and not torch.equal(one, everything)
    mixed.apply(())
