"""The node on a vLLM replica (backend 'vllm'): the same action, deadlines kept remotely.

Needs a `vllm serve` environment: TIMEBILL_VLLM_PYTHON names its python (.ci/run makes
one with scripts/vllm_venv.sh). A second endpoint that refuses connections stands for a
replica that is down.
"""

import json
import os
from pathlib import Path

import pytest

from conftest import client_fixture, NodeProcess
from timebill_ros.core.request import Outcome

VLLM_PYTHON = os.environ.get('TIMEBILL_VLLM_PYTHON', '')
pytestmark = pytest.mark.skipif(not Path(VLLM_PYTHON or '/nonexistent').is_file(),
                                reason='no vLLM environment (TIMEBILL_VLLM_PYTHON)')
PORT = 8013
DOWN = 'http://127.0.0.1:9'  # nothing listens: a failed replica


@pytest.fixture(scope='module')
def replica(tmp_path_factory):
    import httpx
    from timebill_ros.cli.bench_vllm import start_replica, wait_healthy
    from timebill_ros.runtime.export_vllm import export_for_vllm
    from timebill_ros.runtime.model import embedded_dir
    root = tmp_path_factory.mktemp('vllm')
    model = export_for_vllm(embedded_dir(), root / 'model')
    proc = start_replica(VLLM_PYTHON, model, PORT, root / 'vllm.log')
    try:
        with httpx.Client() as client:
            wait_healthy(client, f'http://127.0.0.1:{PORT}', proc, timeout_s=600.0)
        yield f'http://127.0.0.1:{PORT}'
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope='module')
def node(rclpy_context, replica):
    proc = NodeProcess({'backend': 'vllm', 'vllm_endpoints': f'{DOWN},{replica}',
                        'model': 'embedded'}, namespace='/remote')
    yield proc
    proc.stop()


client = client_fixture('/remote', 'test_vllm_client')


def test_a_goal_is_answered_by_the_replica_and_streamed(client):
    from timebill_ros.tools.client import make_goal
    run = client.ask(make_goal('What is the capital of France? Answer in one sentence.',
                               30.0, max_new_tokens=32), 120)
    result = run.result
    assert run.accepted and result.outcome == Outcome.COMPLETED and result.deadline_met
    assert 'Paris' in result.text and 'Ġ' not in result.text
    assert run.streamed_text == result.text and result.tokens == len(run.feedback)
    assert 'replica http://127.0.0.1:8013' in result.reason


def test_kill_ends_a_remote_goal_at_its_deadline(client):
    from timebill_ros.tools.client import make_goal
    run = client.ask(make_goal('Write a detailed essay about the history of robotics.',
                               4.0, max_new_tokens=400), 60)
    result = run.result
    assert result.outcome == Outcome.KILLED and not result.deadline_met
    assert result.e2e_s <= 4.0 + 0.2, result.e2e_s  # one token plus the network
    assert run.streamed_text == result.text


def test_a_schema_goal_gets_json_that_validates(client):
    from timebill_ros.tools.client import make_goal
    schema = {'type': 'object', 'properties': {'lane': {'enum': ['left', 'right']},
                                               'speed_kmh': {'type': 'integer'}},
              'required': ['lane', 'speed_kmh']}
    run = client.ask(make_goal('Change to the left lane at 40 km/h.', 30.0,
                               max_new_tokens=64, json_schema=json.dumps(schema)), 120)
    assert run.result.outcome == Outcome.COMPLETED and run.result.valid
    assert json.loads(run.result.text)['lane'] in ('left', 'right')


def test_a_goal_no_replica_can_answer_in_time_is_refused_with_the_prediction(client):
    from timebill_ros.tools.client import make_goal
    run = client.ask(make_goal('Describe the route.', 0.05, max_new_tokens=64), 30)
    assert not run.accepted and 'no replica is predicted to answer in time' in \
        run.reject_reason
