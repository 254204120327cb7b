# SPDX-License-Identifier: Apache-2.0
"""The managed (lifecycle) node driven through its transitions over DDS (tiny model)."""

import threading
import time

import pytest

from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState
import rclpy
from rclpy.executors import SingleThreadedExecutor

from timebill_msgs.action import Instruct
from timebill_ros.tools.client import ClientTimeout, InstructClient, make_goal
from conftest import NodeProcess

R = Instruct.Result
TINY = {'model': 'tiny-random', 'calibrate_on_start': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'cut_effects': '',
        'max_new_tokens_limit': 8192}


class Lifecycle:
    """Call /timebill/change_state and get_state from a node of our own."""

    def __init__(self):
        self.node = rclpy.create_node('lifecycle_driver')
        self.change = self.node.create_client(ChangeState, '/timebill/change_state')
        self.get = self.node.create_client(GetState, '/timebill/get_state')
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        threading.Thread(target=self.executor.spin, daemon=True).start()
        assert self.change.wait_for_service(30) and self.get.wait_for_service(30)

    def _call(self, client, request, timeout=120.0, tries=1):
        # A request sent before the server has matched this client's response reader
        # gets no answer at all (service discovery in DDS): seen twice in full CI runs on
        # the first get_state, never alone. A read-only call is asked again.
        for _ in range(tries):
            done = threading.Event()
            future = client.call_async(request)
            future.add_done_callback(lambda f: done.set())
            if done.wait(timeout / tries):
                return future.result()
            client.remove_pending_request(future)
        raise AssertionError(f'lifecycle service did not answer in {timeout:g} s')

    def transition(self, transition_id: int) -> bool:
        return self._call(self.change, ChangeState.Request(
            transition=Transition(id=transition_id))).success

    def state(self) -> int:
        return self._call(self.get, GetState.Request(), tries=8).current_state.id

    def close(self):
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()


def test_configure_activate_deactivate_cleanup(rclpy_context):
    proc = NodeProcess(TINY, managed=True)
    life = Lifecycle()
    client = None
    try:
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert not any('ready: model' in line for line in proc.lines)  # nothing loaded yet
        assert life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.state() == State.PRIMARY_STATE_INACTIVE
        client = InstructClient(node_name='lifecycle_client')
        client.wait_for_server(30)
        refused = client.ask(make_goal('Report.', 30.0, max_new_tokens=4))
        assert not refused.accepted and 'inactive' in refused.reject_reason
        assert life.transition(Transition.TRANSITION_ACTIVATE)
        served = client.ask(make_goal('Report.', 30.0, max_new_tokens=4))
        assert served.accepted and served.result.outcome == R.COMPLETED
        # Deactivate while a goal streams: it finishes; a new goal is refused.
        streaming = threading.Event()
        running = client.send(make_goal('Go on.', 60.0, max_new_tokens=600),
                              on_feedback=lambda fb: streaming.set())
        assert streaming.wait(30)
        assert life.transition(Transition.TRANSITION_DEACTIVATE)
        late = client.ask(make_goal('Report.', 30.0, max_new_tokens=4))
        assert not late.accepted and 'inactive' in late.reject_reason
        client.wait(running, 60)
        assert running.result.outcome == R.COMPLETED and running.result.tokens == 600
        # Cleanup frees the model and removes the action; configure loads it again.
        assert life.transition(Transition.TRANSITION_CLEANUP)
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED
        deadline = time.monotonic() + 10
        while client._client.server_is_ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not client._client.server_is_ready()
        assert life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.transition(Transition.TRANSITION_ACTIVATE)
        client.wait_for_server(30)
        again = client.ask(make_goal('Report.', 30.0, max_new_tokens=4))
        assert again.accepted and again.result.outcome == R.COMPLETED
    finally:
        if client is not None:
            client.close()
        life.close()
        proc.stop()
    assert proc.proc.returncode == 0


def test_a_configure_that_cannot_load_the_model_fails_and_the_node_stays_up(rclpy_context):
    proc = NodeProcess({**TINY, 'model': '/nonexistent/model-dir'}, managed=True)
    life = Lifecycle()
    try:
        assert not life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert any('configure failed' in line for line in proc.lines)
        assert proc.proc.poll() is None
        nothing = InstructClient(node_name='lifecycle_nothing')
        try:
            with pytest.raises(ClientTimeout):  # an unconfigured node offers no action
                nothing.wait_for_server(1)
        finally:
            nothing.close()
    finally:
        life.close()
        proc.stop()


def test_autostart_configures_and_activates_at_start(rclpy_context):
    proc = NodeProcess({**TINY, 'autostart': True}, managed=True)
    life = Lifecycle()
    client = InstructClient(node_name='lifecycle_autostart')
    try:
        assert life.state() == State.PRIMARY_STATE_ACTIVE
        client.wait_for_server(30)
        run = client.ask(make_goal('Say hi.', 30.0, max_new_tokens=2), 60)
        assert run.accepted and run.result.outcome == R.COMPLETED
        # Still a managed node: it can be deactivated like any other.
        assert life.transition(Transition.TRANSITION_DEACTIVATE)
        refused = client.ask(make_goal('Say hi.', 30.0, max_new_tokens=2), 30)
        assert not refused.accepted and 'inactive' in refused.reject_reason
    finally:
        client.close()
        life.close()
        proc.stop()
