"""End to end with the real embedded SmolLM2 model: a correct answer, in time."""

import pytest

from action_msgs.msg import GoalStatus

from conftest import NodeProcess
from timebill_ros.action import Instruct
from timebill_ros.ros.client import InstructClient, make_goal


@pytest.fixture(scope='module')
def client(rclpy_context):
    proc = NodeProcess({'model': 'embedded'}, ready_timeout=300)
    c = InstructClient(node_name='embedded_test_client')
    c.wait_for_server(30)
    yield c
    c.close()
    proc.stop()


def test_embedded_model_answers_correctly_before_deadline(client):
    run = client.ask(make_goal('What is the capital of France? Answer in one sentence.',
                               60.0, max_new_tokens=40), 120)
    res = run.result
    assert run.status == GoalStatus.STATUS_SUCCEEDED
    assert res.outcome == Instruct.Result.COMPLETED and res.deadline_met
    assert 'Paris' in res.text
    assert run.streamed_text == res.text
    assert res.e2e_s < 60.0
