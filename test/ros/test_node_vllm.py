# SPDX-License-Identifier: Apache-2.0
"""The node on a vLLM replica (backend 'vllm'): the same action, deadlines kept remotely.

Needs a `vllm serve` environment: TIMEBILL_VLLM_PYTHON names its python (.ci/run makes
one with scripts/vllm_venv.sh). A second endpoint that refuses connections stands for a
replica that is down.
"""

import json
import os
from pathlib import Path
import socket
import threading

import pytest

from conftest import client_fixture, NodeProcess, run_unstalled
from timebill_ros.core.request import Outcome

VLLM_PYTHON = os.environ.get('TIMEBILL_VLLM_PYTHON', '')
pytestmark = pytest.mark.skipif(not Path(VLLM_PYTHON or '/nonexistent').is_file(),
                                reason='no vLLM environment (TIMEBILL_VLLM_PYTHON)')
PORT = 8013
DOWN = 'http://127.0.0.1:9'  # nothing listens: a failed replica


@pytest.fixture(scope='module')
def replica(tmp_path_factory):
    import httpx
    from timebill_ros.cli.replica import start_replica, stop_replica, wait_healthy
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
        stop_replica(proc)


@pytest.fixture(scope='module')
def node(rclpy_context, replica):
    # yield_when_late off: the burst test below wants goals admitted beside each other.
    proc = NodeProcess({'backend': 'vllm', 'vllm_endpoints': f'{DOWN},{replica}',
                        'model': 'embedded', 'yield_when_late': False}, namespace='/remote')
    yield proc
    proc.stop()


client = client_fixture('/remote', 'test_vllm_client')


class Relay:
    """A TCP relay to the replica: a second endpoint that can die mid-answer (``drop``)."""

    def __init__(self, target_port: int):
        self.target = ('127.0.0.1', target_port)
        self.server = socket.create_server(('127.0.0.1', 0))
        self.url = f'http://127.0.0.1:{self.server.getsockname()[1]}'
        self.sockets, self.lock = [], threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                near, _ = self.server.accept()
            except OSError:
                return
            far = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop(self):
        """Stop listening and reset every connection, as a replica that dies does."""
        self.server.close()
        with self.lock:
            for sock in self.sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the relay's readers too
                    sock.close()
                except OSError:
                    pass


@pytest.fixture(scope='module')
def relay(replica):
    return Relay(PORT)


@pytest.fixture(scope='module')
def pool_node(rclpy_context, relay):
    proc = NodeProcess({'backend': 'vllm', 'vllm_endpoints': f'{relay.url},{replica_url()}',
                        'model': 'embedded'}, namespace='/pool')
    yield proc
    proc.stop()


def replica_url():
    return f'http://127.0.0.1:{PORT}'


@pytest.fixture(scope='module')
def pool_client(pool_node):
    from timebill_ros.tools.client import InstructClient
    c = InstructClient('/pool/timebill/instruct', 'test_vllm_pool_client',
                       '/pool/timebill/responses')
    c.wait_for_server(30)
    yield c
    c.close()


def test_a_goal_is_answered_by_the_replica_and_streamed(client):
    from timebill_ros.tools.client import make_goal
    run = client.ask(make_goal('What is the capital of France? Answer in one sentence.',
                               30.0, max_new_tokens=32), 120)
    result = run.result
    assert run.accepted and result.outcome == Outcome.COMPLETED and result.deadline_met
    assert 'Paris' in result.text and 'Ġ' not in result.text
    assert run.streamed_text == result.text and run.feedback[-1].token_index == result.tokens - 1
    assert 'replica http://127.0.0.1:8013' in result.reason
    # Planned on the shipped text-side length head (no local model in front of replicas).
    assert result.plan.predictor.startswith('rlp-text') and result.plan.predicted_tokens >= 1


def test_kill_ends_a_remote_goal_at_its_deadline(client, node):
    from timebill_ros.tools.client import make_goal
    run = run_unstalled(lambda: client.ask(make_goal(
        'Write a detailed essay about the history of robotics.', 4.0, max_new_tokens=400), 60))
    result = run.result
    assert result.outcome == Outcome.KILLED and not result.deadline_met
    # One token plus the network; the node's log says why when it is later.
    assert result.e2e_s <= 4.0 + 0.2, (result.reason, ''.join(node.lines[-20:]))
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


def test_many_goals_at_once_each_get_their_result_at_their_deadline(client):
    """More goals run at once than a local node's executor threads: none waits for one."""
    from timebill_ros.tools.client import make_goal

    def twelve_goals():
        runs = [client.send(make_goal(f'Write a detailed essay about robot number {i}.', 8.0,
                                      max_new_tokens=400)) for i in range(12)]
        for run in runs:
            client.wait(run, 60)
        return runs
    runs = run_unstalled(twelve_goals)
    accepted = [run for run in runs if run.accepted]
    assert all(run.reject_reason for run in runs if not run.accepted)
    assert len(accepted) >= 6, [run.reject_reason for run in runs]
    for run in accepted:
        assert run.result.outcome in (Outcome.COMPLETED, Outcome.KILLED), run.result.reason
        # The budget counts from arrival at the node: one token plus the network past it.
        assert run.result.e2e_s <= 8.0 + 0.3, run.result.e2e_s
        # Seen from the client, DDS and twelve goals' acceptance add up to ~2 s on a loaded
        # 2-core VM (9.9 s in CI at 87be820); a goal waiting for a thread would add 8 s.
        assert run.finished_at - run.sent_at <= 8.0 + 4.0, run.finished_at - run.sent_at


def test_a_goal_no_replica_can_answer_in_time_is_refused_with_the_prediction(client):
    from timebill_ros.tools.client import make_goal
    run = client.ask(make_goal('Describe the route.', 0.05, max_new_tokens=64), 30)
    assert not run.accepted and 'no replica is predicted to answer in time' in \
        run.reject_reason


def test_a_goal_the_replica_refuses_is_rejected_and_leaves_the_replica_serving(client):
    # A prompt past the replica's --max-model-len 4096: vLLM answers HTTP 400. That is the
    # goal's fault: it must not mark the replica down (bench_fleet: 23 goals refused after
    # one such prompt took the pool out for 10 s).
    from timebill_ros.tools.client import make_goal
    context = 'Dock 3 is free. Forklift 7 charges at bay 2. ' * 500
    run = client.ask(make_goal('Which dock is free?', 120.0, context, max_new_tokens=8), 180)
    assert run.accepted and run.result.outcome == Outcome.REJECTED, run.result.reason
    assert 'refused the goal' in run.result.reason and '4096' in run.result.reason
    after = client.ask(make_goal('Say OK.', 30.0, max_new_tokens=4), 120)
    assert after.result.outcome == Outcome.COMPLETED, after.result.reason


def test_a_skip_next_goal_runs_late_and_the_next_goal_gives_its_turn_up(client, node):
    from timebill_msgs.action import Instruct
    from timebill_ros.tools.client import make_goal
    # The greedy essay runs past 700 tokens: with 1024 allowed it streams far past its 3-s
    # deadline on any replica speed, and is canceled once the next goal has its result
    # (with 400 it ended before the next goal was admitted in two CI runs, so the skip was
    # rightly dropped; with 120 it ended between 3 and 4 s).
    past_deadline = threading.Event()
    late = client.send(make_goal('Write a detailed essay about the history of robotics.',
                                 3.0, max_new_tokens=1024,
                                 policy=Instruct.Goal.SKIP_NEXT),
                       on_feedback=lambda f: past_deadline.set() if f.remaining_s < 0 else None)
    assert past_deadline.wait(60)  # past its deadline, still answering
    skipped = client.ask(make_goal('Say yes.', 20.0, max_new_tokens=4), 60)
    client.cancel(late)
    late = client.wait(late, 180)
    log = ''.join(node.lines[-30:])
    print(log)  # the node logs when the skip is armed, taken and dropped
    assert late.accepted, late.reject_reason
    assert late.result.outcome in (Outcome.CANCELED, Outcome.COMPLETED), late.result.reason
    assert not late.result.deadline_met and late.result.e2e_s > 3.0 and late.result.tokens > 0
    # The premise: the late goal still ran when the next one had its result.
    assert late.sent_at + late.result.e2e_s > skipped.answered_at, late.result.tokens
    assert skipped.result.outcome == Outcome.SKIPPED, (skipped.result.reason, log)
    assert 'overran its deadline (Skip-Next)' in skipped.result.reason


def test_a_replica_that_dies_mid_answer_hands_the_goal_to_another(pool_client, relay):
    """The relay endpoint is first in the list (ties go to it) and dies after 5 tokens."""
    from timebill_ros.tools.client import make_goal
    seen = threading.Event()
    run = pool_client.send(make_goal('List ten safety rules for a warehouse robot.', 60.0,
                                     max_new_tokens=80),
                           on_feedback=lambda f: seen.set() if f.token_index >= 4 else None)
    assert seen.wait(60)
    relay.drop()
    run = pool_client.wait(run, 120)
    result = run.result
    assert result.outcome == Outcome.COMPLETED and result.deadline_met, result.reason
    assert f'moved after: replica {relay.url} failed after' in result.reason
    assert f'(replica {replica_url()}' in result.reason
    assert run.streamed_text == result.text and run.feedback[-1].token_index == result.tokens - 1
    # The relay stays down: the next goal goes to the replica at once.
    after = pool_client.ask(make_goal('Say yes.', 20.0, max_new_tokens=4), 60)
    assert after.result.outcome == Outcome.COMPLETED
