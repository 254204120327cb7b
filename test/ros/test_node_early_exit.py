# SPDX-License-Identifier: Apache-2.0
"""MODE_EARLY_EXIT and per-token deadline schedulability through the node (tiny model)."""

import threading

import pytest

from action_msgs.msg import GoalStatus

from conftest import NodeProcess
from timebill_msgs.action import Instruct
from timebill_ros.tools.client import InstructClient, make_goal
from timebill_ros.ros.convert import s_to_duration

R, G = Instruct.Result, Instruct.Goal


@pytest.fixture(scope='module')
def node(rclpy_context, tmp_path_factory):
    profile = tmp_path_factory.mktemp('profile') / 'tiny.yaml'
    proc = NodeProcess({'model': 'tiny-random', 'calibrate_on_start': True,
                        'calibration_quick': True, 'profile': str(profile),
                        'early_exit_layers': '1', 'max_budget_s': 120.0},
                       ready_timeout=300, namespace='/ee')
    yield proc
    proc.stop()


@pytest.fixture(scope='module')
def client(node):
    c = InstructClient('/ee/timebill/instruct', 'ee_client', '/ee/timebill/responses')
    c.wait_for_server(30)
    yield c
    c.close()


def goal(mode, budget=60.0, token_deadline=0.0, max_new=12):
    g = make_goal('Describe the route to the loading dock.', budget, mode=mode,
                  max_new_tokens=max_new)
    g.token_deadline = s_to_duration(token_deadline)
    return g


def test_early_exit_goal_runs_with_exits_reported(client):
    from timebill_msgs.msg import DeadlineTelemetry
    seen = []
    got = threading.Event()

    def on_telemetry(msg):
        seen.append(msg)
        got.set()
    client.node.create_subscription(DeadlineTelemetry, '/ee/timebill/telemetry', on_telemetry,
                                    10)
    run = client.ask(goal(G.MODE_EARLY_EXIT), 120)
    assert run.accepted, run.reject_reason
    res = run.result
    assert res.outcome == R.COMPLETED and run.status == GoalStatus.STATUS_SUCCEEDED
    assert res.plan.mode == G.MODE_EARLY_EXIT and list(res.plan.exit_layers) == [1]
    assert got.wait(5.0)
    t = seen[-1]
    steps = t.exits_full + t.exits_threshold + t.exits_forced
    assert steps == max(0, res.tokens - 1)  # one decision per decode step


def test_an_early_exit_goal_with_a_schema_answers_valid_json(client):
    # The exit layer's logits go through the goal's mask: any layer's token is legal.
    import json
    schema = {'type': 'object', 'additionalProperties': False, 'required': ['dock', 'free'],
              'properties': {'dock': {'type': 'integer'}, 'free': {'type': 'boolean'}}}
    g = goal(G.MODE_EARLY_EXIT, max_new=40)
    g.json_schema = json.dumps(schema)
    res = client.ask(g, 120).result
    assert res.plan.mode == G.MODE_EARLY_EXIT and res.valid, res.reason
    value = json.loads(res.text)
    assert set(value) == {'dock', 'free'} and isinstance(value['free'], bool)


def test_per_token_deadline_below_the_p99_estimate_is_rejected(client):
    run = client.ask(goal(G.MODE_NONE, token_deadline=1e-6), 30)
    assert not run.accepted
    assert 'not schedulable' in run.reject_reason and 'P99' in run.reject_reason


def test_loose_per_token_deadline_is_admitted_with_utilisation(client):
    run = client.ask(goal(G.MODE_NONE, token_deadline=5.0), 60)
    assert run.accepted, run.reject_reason
    plan = run.result.plan
    assert plan.token_deadline_s == pytest.approx(5.0)
    assert 0.0 < plan.utilisation < 1.0 and plan.est_p99_tpot_s > 0.0


def test_token_deadline_over_the_budget_is_rejected(client):
    run = client.ask(goal(G.MODE_NONE, budget=1.0, token_deadline=2.0), 30)
    assert not run.accepted and 'token_deadline must be in' in run.reject_reason
