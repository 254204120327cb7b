# SPDX-License-Identifier: Apache-2.0
"""MODE_AUTO decodes on the resident int8 copy when only it fits (tiny model, real DDS).

The two execution-time profiles are written by the test (they are the node's input:
the ETE coefficients), so which cut fits a budget is known; the model, the int8 copy,
the planner and the action round trip are the real ones.
"""

import pytest

from timebill_msgs.action import Instruct
from timebill_ros.tools.client import InstructClient, make_goal
from conftest import NodeProcess, topic_probe

G, R = Instruct.Goal, Instruct.Result


@pytest.fixture(scope='module')
def client(rclpy_context, tmp_path_factory, synthetic_profile):
    folder = tmp_path_factory.mktemp('profiles')
    synthetic_profile('float32', 0.2).save(folder / 'tiny.yaml')  # 8 tokens: 1.6 s
    synthetic_profile('int8-dynamic', 0.02).save(folder / 'tiny.int8-dynamic.yaml')  # 0.16 s
    proc = NodeProcess({'model': 'tiny-random', 'profile': str(folder / 'tiny.yaml'),
                        'calibrate_on_start': False, 'length_predictor': 'max-new-tokens',
                        'cut_effects': '', 'max_new_tokens': 8,
                        'auto_precision': 'int8-dynamic'})
    c = InstructClient(node_name='test_precision_client')
    c.wait_for_server(30)
    yield c, proc
    c.close()
    proc.stop()


def test_auto_switches_to_int8_decoding_only_when_the_full_model_cannot_fit(client):
    c, proc = client
    assert any('resident int8-dynamic copy' in line for line in proc.lines)
    # First (served goals refit the ETE to the tiny model's real, much faster steps):
    # 0.3 s fits 1 float32 token of the 8 planned, all 8 at int8; the plan keeps full
    # precision only as long as int8 can still finish, so here int8 takes over at once.
    tight = c.ask(make_goal('Report the battery level.', 0.3, mode=G.MODE_AUTO))
    assert tight.accepted, tight.reject_reason
    plan = tight.result.plan
    assert plan.precision == '' and plan.fallback_precision == 'int8-dynamic'
    assert plan.feasible and 'switching to int8-dynamic decoding' in plan.note
    assert tight.result.outcome in (R.COMPLETED, R.KILLED) and tight.result.tokens > 0
    if tight.result.tokens > 1:
        assert 'int8-dynamic decoding from answer token 2' in tight.result.reason
    # 5 s fits 8 float32 tokens: full precision, int8 kept in reserve.
    roomy = c.ask(make_goal('Report the battery level.', 5.0, mode=G.MODE_AUTO))
    assert roomy.accepted and roomy.result.plan.precision == ''
    assert 'int8' not in roomy.result.reason
    # A caller who pins MODE_NONE gets the full model (and no plan-level rejection).
    pinned = c.ask(make_goal('Report the battery level.', 0.8, mode=G.MODE_NONE))
    assert pinned.accepted and pinned.result.plan.precision == ''
    assert pinned.result.plan.fallback_precision == ''


def test_an_instruction_on_the_topic_carries_the_goals_pin_and_length(client, wait_until):
    # A recorded stack's Instruction replays with the same planning fields as its goal.
    from builtin_interfaces.msg import Duration
    from timebill_msgs.msg import Instruction
    with topic_probe('test_precision_topic') as (publisher, responses):
        wait_until(lambda: publisher.get_subscription_count() > 0, 10, 'the node subscribing')
        publisher.publish(Instruction(id='pinned', instruction='Report the battery level.',
                                      budget=Duration(sec=5), mode=G.MODE_AUTO,
                                      expected_tokens=3, precision='int8-dynamic'))
        wait_until(lambda: responses, 30, 'a Response')
        response = responses[0]
        assert response.id == 'pinned' and response.outcome == R.COMPLETED, response.reason
        assert response.plan.precision == 'int8-dynamic'
        assert response.plan.predictor == 'caller' and response.plan.predicted_tokens == 3
