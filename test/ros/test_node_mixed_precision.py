# SPDX-License-Identifier: Apache-2.0
"""MODE_AUTO lowers single layers to int8 when the deadline needs it (tiny model, real DDS).

The profiles and the KL table are the node's inputs, written by the test so which mix
fits a budget is known: float32 steps 100 ms, int8 40 ms, each of the 3 units (2 layers
and the LM head) 30 ms of the float32 step and 10 ms of the int8 one; lowering layer 1
costs the least KL. The model, the int8 copy, the mixed shell, the DP, the planner and
the action round trip are the real ones.
"""

import json

import pytest

from timebill_msgs.action import Instruct
from timebill_ros.core.cuts import CutEffect, CutEffects
from timebill_ros.core.precision import UnitTimes
from timebill_ros.tools.client import InstructClient, make_goal
from conftest import NodeProcess

G, R = Instruct.Goal, Instruct.Result


@pytest.fixture(scope='module')
def client(rclpy_context, tmp_path_factory, synthetic_profile):
    folder = tmp_path_factory.mktemp('mixed')
    main = synthetic_profile('float32', 0.1)
    main.set_units('float32', UnitTimes((0.03,) * 3, (0.0,) * 3, 0.01))
    main.set_units('int8-dynamic', UnitTimes((0.01,) * 3, (0.0,) * 3, 0.01))
    main.save(folder / 'tiny.yaml')
    synthetic_profile('int8-dynamic', 0.04).save(folder / 'tiny.int8-dynamic.yaml')
    (folder / 'kl.json').write_text(json.dumps({
        'source': 'tiny-random', 'low': 'int8-dynamic', 'unit_kl': [0.05, 0.01, 0.3],
        'all_low_kl': 0.4}))
    CutEffects(precision={'int8-dynamic': CutEffect(1.0, 0.5)},
               source='tiny-random').save(folder / 'effects.json')
    proc = NodeProcess({'model': 'tiny-random', 'profile': str(folder / 'tiny.yaml'),
                        'calibrate_on_start': False, 'length_predictor': 'max-new-tokens',
                        'cut_effects': str(folder / 'effects.json'),
                        'precision_mix': str(folder / 'kl.json'), 'max_new_tokens': 20,
                        'auto_precision': 'int8-dynamic'})
    c = InstructClient(node_name='test_mixed_precision_client')
    c.wait_for_server(30)
    yield c, proc
    c.close()
    proc.stop()


def test_a_budget_below_the_full_model_is_met_by_lowering_the_cheapest_layer(client):
    c, proc = client
    assert any('per-layer int8-dynamic mixes' in line for line in proc.lines)
    # 20 tokens: 1.91 s at float32 > 2.0 s less the 10 % margin. Lowering one unit makes
    # a step 80 ms (1.53 s); layer 1 has the least KL. (First goal: served goals refit
    # the ETE to the tiny model's real, much faster steps.)
    goal = c.ask(make_goal('Report the battery level.', 2.0, mode=G.MODE_AUTO))
    assert goal.accepted, goal.reject_reason
    plan = goal.result.plan
    assert plan.precision == 'mixed' and plan.lowered_units == 1
    assert plan.precision_mix.startswith('int8-dynamic: layers 1 (1 of 3 units')
    assert plan.est_wcet_s <= 1.8 and plan.est_wcet_full_s > 1.8
    assert 'mixed-precision decoding (1 of 3 units lowered)' in plan.note
    assert goal.result.outcome == R.COMPLETED and goal.result.deadline_met
    assert goal.result.tokens == 20
    # With time to spare the full model runs; MODE_NONE is never lowered.
    roomy = c.ask(make_goal('Report the battery level.', 30.0, mode=G.MODE_AUTO))
    assert roomy.accepted and roomy.result.plan.precision == ''
    pinned = c.ask(make_goal('Report the battery level.', 2.0, mode=G.MODE_NONE))
    assert pinned.accepted and pinned.result.plan.lowered_units == 0
