# SPDX-License-Identifier: Apache-2.0
"""A length head read off the goal's own prefill, through the node (tiny model, real DDS)."""

import numpy as np
import pytest

from action_msgs.msg import GoalStatus

from conftest import NodeProcess
from timebill_msgs.action import Instruct
from timebill_msgs.srv import PlanInstruction
from timebill_ros.tools.client import InstructClient, make_goal
from timebill_ros.ros.convert import s_to_duration
from timebill_ros.runtime.length_heads import LinearHead

R, G = Instruct.Result, Instruct.Goal
PROMPT = 'Describe the route to the loading dock.'


@pytest.fixture(scope='module')
def node(rclpy_context, tmp_path_factory):
    folder = tmp_path_factory.mktemp('length')
    # A head on the tiny model's layer-1 state whose top bucket always wins: 256 tokens.
    hidden = 64
    bias = np.zeros(17, np.float32)
    bias[16] = 5.0
    LinearHead(np.zeros((17, hidden), np.float32), bias, np.zeros(hidden, np.float32),
               np.ones(hidden, np.float32), 16, 256, 'L1-last', 'tiny-random'
               ).save(folder / 'head.npz')
    proc = NodeProcess({'model': 'tiny-random', 'calibrate_on_start': True,
                        'calibration_quick': True, 'profile': str(folder / 'tiny.yaml'),
                        'length_predictor': str(folder / 'head.npz'), 'max_budget_s': 120.0},
                       ready_timeout=300, namespace='/len')
    yield proc
    proc.stop()


@pytest.fixture(scope='module')
def client(node):
    c = InstructClient('/len/timebill/instruct', 'len_client', '/len/timebill/responses')
    c.wait_for_server(30)
    yield c
    c.close()


def estimate(expected_tokens=0):
    """Return the plan the service makes for PROMPT with a loose budget."""
    import rclpy
    helper = rclpy.create_node('len_plan_helper')
    try:
        plan = helper.create_client(PlanInstruction, '/len/timebill/plan')
        assert plan.wait_for_service(timeout_sec=10)
        future = plan.call_async(PlanInstruction.Request(
            instruction=PROMPT, budget=s_to_duration(60.0), mode=G.MODE_EVICTION,
            max_new_tokens=256, expected_tokens=expected_tokens))
        rclpy.spin_until_future_complete(helper, future, timeout_sec=30)
        reply = future.result()
        assert reply.accepted, reply.reason
        return reply.plan
    finally:
        helper.destroy_node()


def test_goal_runs_with_the_length_predicted_in_prefill(client):
    assert estimate().predicted_tokens == 256  # the service predicts up front
    run = client.ask(make_goal(PROMPT, 60.0, mode=G.MODE_EVICTION, max_new_tokens=200), 60)
    assert run.status == GoalStatus.STATUS_SUCCEEDED and run.result.outcome == R.COMPLETED
    plan = run.result.plan
    assert plan.predictor == 'rlp-L1-last-b16' and plan.predicted_tokens == 200  # goal cap


def test_goal_infeasible_once_predicted_runs_best_effort_when_none_waits(client):
    one, full = estimate(expected_tokens=1), estimate()
    # Admitted: a 1-token answer fits. Once 256 tokens are predicted it cannot; with Kill
    # and no goal waiting it runs anyway (idle_best_effort) and is killed at its deadline.
    budget = (one.est_wcet_s + full.est_wcet_alpha_max_s) / 2 / 0.9
    assert one.est_wcet_s * 3 < full.est_wcet_alpha_max_s, 'estimates too close to test'
    run = client.ask(make_goal(PROMPT, budget, mode=G.MODE_EVICTION, max_new_tokens=256), 60)
    assert run.accepted, run.reject_reason
    res = run.result
    assert res.outcome in (R.KILLED, R.COMPLETED) and res.tokens >= 1
    assert res.deadline_met == (res.outcome == R.COMPLETED and res.e2e_s <= budget)
    # The result carries the infeasible plan made in prefill, marked best effort.
    assert res.plan.predictor == 'rlp-L1-last-b16' and res.plan.predicted_tokens == 256
    assert not res.plan.feasible and res.plan.worst_case_tokens == 256
    assert res.plan.note.startswith('best effort (Kill, no goal waiting): cannot meet')
    assert 'predicted 256 answer tokens' in res.plan.note
