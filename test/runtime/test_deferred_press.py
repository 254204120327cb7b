# SPDX-License-Identifier: Apache-2.0
"""A press chosen during prefill leaves the cache a press from the start would leave."""

import pytest

torch = pytest.importorskip('torch')
pytest.importorskip('kvpress')

from timebill_ros.core.execution import PrefillDecision  # noqa: E402
from timebill_ros.core.planning import Plan  # noqa: E402
from timebill_ros.core.request import Rejection  # noqa: E402
from timebill_ros.runtime.engine import Engine  # noqa: E402
from timebill_ros.serving.loop import generate  # noqa: E402
from timebill_ros.runtime.model import load_model, prompt_ids  # noqa: E402
from timebill_ros.runtime.presses import press_for_plan, PRESSES  # noqa: E402


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def prefill_cache(tiny, ids, plan, decide=None):
    from transformers import DynamicCache
    from timebill_ros.core.execution import GenerationStats
    engine, cache = Engine(tiny, press_for_plan), DynamicCache()
    stats = generate(engine, ids, 1, plan, lambda ev: True, decide=decide)
    # Prefill once more into a cache of our own to compare it layer by layer.
    with torch.inference_mode():
        out, used, _ = engine._prefill(torch.tensor([ids]), cache, plan, decide,
                                       GenerationStats(), len(ids), chunked=False)
    return cache, used, stats


@pytest.mark.parametrize('name', PRESSES)
@pytest.mark.parametrize('layer', [1, 2])
def test_deferred_press_equals_press_from_the_start(tiny, name, layer):
    ids = prompt_ids(tiny.tokenizer, 'Summarise.', 'alpha beta gamma delta ' * 60)
    plan = Plan(eviction_ratio=0.5, press=name)
    direct, _, _ = prefill_cache(tiny, ids, plan)
    seen = []

    def plan_from(hidden):
        seen.append(tuple(hidden.shape))
        return plan
    deferred, used, stats = prefill_cache(tiny, ids, Plan(),
                                          PrefillDecision(layer, plan_from))
    assert used == plan and stats.plan == plan
    assert seen[0] == (1, len(ids), tiny.model.config.hidden_size)
    assert stats.deferred_layers == layer  # the layers that ran before the decision
    assert direct.get_seq_length() < len(ids)
    for a, b in zip(direct.layers, deferred.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_deciding_no_eviction_keeps_the_whole_cache_and_rejection_propagates(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Summarise.', 'word ' * 200)
    _, used, stats = prefill_cache(tiny, ids, Plan(eviction_ratio=0.5),
                                   PrefillDecision(1, lambda hidden: Plan()))
    assert stats.kv_tokens_after_prefill == len(ids) and used == Plan()

    def refuse(hidden):
        raise Rejection('too late')
    with pytest.raises(Rejection, match='too late'):
        generate(Engine(tiny, press_for_plan), ids, 3, Plan(), lambda ev: True,
                 decide=PrefillDecision(2, refuse))
    with pytest.raises(ValueError, match='decision layer'):
        generate(Engine(tiny, press_for_plan), ids, 3, Plan(), lambda ev: True,
                 decide=PrefillDecision(99, lambda h: Plan()))
    # The model is left without hooks: a plain run still keeps every token.
    stats = generate(Engine(tiny, press_for_plan), ids, 2, Plan(), lambda ev: True)
    assert stats.kv_tokens_after_prefill == len(ids)
