# SPDX-License-Identifier: Apache-2.0
"""The blocking client tool: a result that overtakes its last feedback still streams all."""

import threading
import time

import pytest

from timebill_msgs.action import Instruct
from timebill_ros.tools.client import GoalRun, InstructClient


def _feedback(index: int, text: str) -> Instruct.Feedback:
    return Instruct.Feedback(text_delta=text, token_index=index)


@pytest.fixture
def client(rclpy_context):
    client = InstructClient(action_name='/timebill_test/no_server', node_name='client_test')
    yield client
    client.close()


def test_wait_lets_feedback_the_result_overtook_land_before_returning(client):
    # DDS orders the result (a service reply) and the feedback (a topic) independently.
    run = GoalRun(goal_id='g', accepted=True)
    run.feedback.append(_feedback(0, 'Stop'))
    run.result = Instruct.Result(text='Stop now', tokens=2)
    run._done.set()
    late = threading.Timer(0.2, lambda: run.feedback.append(_feedback(1, ' now')))
    late.start()
    started = time.monotonic()
    client.wait(run, timeout_s=1.0)
    late.join()
    assert run.streamed_text == run.result.text
    assert time.monotonic() - started < 1.0


def test_wait_gives_up_on_feedback_that_never_comes_after_its_grace(client):
    run = GoalRun(goal_id='g', accepted=True)
    run.result = Instruct.Result(text='x', tokens=1)
    run._done.set()
    started = time.monotonic()
    client.wait(run, timeout_s=1.0)
    waited = time.monotonic() - started
    assert 0.9 <= waited < 3.0 and run.streamed_text == ''
