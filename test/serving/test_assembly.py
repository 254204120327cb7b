# SPDX-License-Identifier: Apache-2.0
"""The assembly's engines share what they learn across goals (tiny model)."""

import pytest

from conftest import Log
from timebill_ros.core.config import NodeConfig
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Mode
from timebill_ros.runtime.model import load_model, prompt_ids
from timebill_ros.serving.assembly import Assembly


def test_the_press_cost_learned_by_one_engine_is_what_the_next_goal_is_killed_by():
    loaded = load_model('tiny-random')
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': True,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'prefill_chunk': 32})
    assembly = Assembly(config, loaded, Log())
    # Each goal gets a new engine; the warm-up's measurement must reach them all.
    first, second = assembly.engine(), assembly.engine()
    assert first.press_cost is second.press_cost is assembly.press_cost
    first.press_cost.learn(0.001)
    ids = prompt_ids(loaded.tokenizer, 'Where?', 'word ' * 200)
    run = second.begin_prefill(ids, Plan(mode=Mode.EVICTION, eviction_ratio=0.5,
                                         press='snapkv'))
    while run.chunks_left > 1:
        run.advance()
    assert assembly.press_cost.s_per_token >= 0.001
    assert run.next_chunk_extra_s == pytest.approx(assembly.press_cost.s_per_token * len(ids))
