# SPDX-License-Identifier: Apache-2.0
"""A blocking Instruct client for tools and tests: send a goal, stream, wait for the end."""

from __future__ import annotations

from dataclasses import dataclass, field
import threading
import time
from typing import Callable
import uuid

from builtin_interfaces.msg import Time
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from unique_identifier_msgs.msg import UUID

from timebill_msgs.action import Instruct
from timebill_msgs.msg import ChatTurn, Response
from timebill_ros.ros.convert import s_to_duration
from timebill_ros.ros.qos import action_client_qos, reliable


# How long wait() lets feedback that the result overtook catch up.
FEEDBACK_GRACE_S = 1.0


class ClientTimeout(TimeoutError):
    """The node did not answer within the client's wait limit."""


@dataclass
class GoalRun:
    """Everything a client saw of one goal."""

    goal_id: str
    accepted: bool = False
    reject_reason: str = ''
    status: int = 0
    result: Instruct.Result | None = None
    feedback: list = field(default_factory=list)
    sent_at: float = 0.0
    answered_at: float = 0.0  # when the goal response (accepted or not) came back
    finished_at: float = 0.0
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def streamed_text(self) -> str:
        """Return the concatenation of all feedback text deltas."""
        return ''.join(f.text_delta for f in self.feedback)


def outcome_name(outcome: int) -> str:
    """Return the Instruct.Result constant's name for an outcome code ('?' if unknown)."""
    names = {v: k for k, v in vars(Instruct.Result).items()
             if k.isupper() and isinstance(v, int) and not k.startswith('STOP_')}
    return names.get(outcome, '?')


def stop_reason_name(stop_reason: int) -> str:
    """Return the name of an Instruct.Result STOP_* value (e.g. 'CLOSED_AT_DEADLINE')."""
    names = {v: k[len('STOP_'):] for k, v in vars(Instruct.Result).items()
             if k.startswith('STOP_') and isinstance(v, int)}
    return names.get(stop_reason, '?')


def make_goal(instruction: str, budget_s: float, context: str = '', policy: int = 0,
              mode: int = 0, max_new_tokens: int = 0,
              pessimistic_factor: float = 0.0, eviction_ratio: float = 0.0,
              expected_tokens: int = 0, precision: str = '', system_prompt: str = '',
              history=(), stop=(), temperature: float = 0.0, top_p: float = 0.0,
              seed: int = 0, json_schema: str = '', grammar: str = '',
              deadline_ns: int = 0) -> Instruct.Goal:
    """Build an Instruct goal from plain values (``history``: (role, content) pairs).

    Every default is the goal message's own: ``policy`` 0 (POLICY_NODE_DEFAULT) is the
    node's ``default_policy``, ``mode`` 0 is MODE_AUTO (before 0.2.0 this helper sent
    MODE_NONE, the full model only, unless told otherwise).

    ``deadline_ns``: an absolute deadline on the node's clock (ROS time, ns; 0 = none).
    """
    return Instruct.Goal(instruction=instruction, context=context,
                         budget=s_to_duration(budget_s), overrun_policy=policy, mode=mode,
                         max_new_tokens=max_new_tokens, pessimistic_factor=pessimistic_factor,
                         eviction_ratio=eviction_ratio, expected_tokens=expected_tokens,
                         precision=precision, system_prompt=system_prompt,
                         history=[ChatTurn(role=role, content=content)
                                  for role, content in history],
                         stop=list(stop), temperature=float(temperature), top_p=float(top_p),
                         seed=int(seed), json_schema=json_schema, grammar=grammar,
                         deadline=Time(sec=deadline_ns // 1_000_000_000,
                                       nanosec=deadline_ns % 1_000_000_000))


class InstructClient:
    """Own a node and an executor thread; send goals and wait with timeouts."""

    def __init__(self, action_name: str = '/timebill/instruct', node_name: str = 'timebill_client',
                 responses_topic: str = '/timebill/responses'):
        """Create the client node and spin it in a background thread."""
        self.node = Node(node_name)
        # Burst-sized service and topic depths, as the node's (see ros/qos.py).
        self._client = ActionClient(self.node, Instruct, action_name, **action_client_qos())
        self._lock = threading.Lock()
        self._runs: dict = {}
        self._rejections: dict = {}
        self.node.create_subscription(Response, responses_topic, self._on_response, reliable())
        self._executor = MultiThreadedExecutor(num_threads=2)
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._executor.spin, daemon=True)
        self._thread.start()

    def wait_for_server(self, timeout_s: float = 30.0) -> None:
        """Wait until the action server is discovered; raise ClientTimeout otherwise."""
        if not self._client.wait_for_server(timeout_sec=timeout_s):
            raise ClientTimeout(f'no action server {self._client._action_name} '
                                f'after {timeout_s:g} s')

    def _on_response(self, msg: Response) -> None:
        with self._lock:
            self._rejections[msg.id] = msg
            run = self._runs.get(msg.id)
        if run is not None and not run.accepted and msg.outcome == Instruct.Result.REJECTED:
            run.reject_reason = msg.reason

    def send(self, goal: Instruct.Goal,
             on_feedback: Callable[[Instruct.Feedback], None] | None = None) -> GoalRun:
        """Send a goal without waiting; use wait() on the returned run."""
        goal_uuid = uuid.uuid4()
        run = GoalRun(goal_id=goal_uuid.hex, sent_at=time.monotonic())
        with self._lock:
            self._runs[run.goal_id] = run

        def feedback(msg):
            run.feedback.append(msg.feedback)
            if on_feedback is not None:
                on_feedback(msg.feedback)

        future = self._client.send_goal_async(
            goal, feedback_callback=feedback, goal_uuid=UUID(uuid=list(goal_uuid.bytes)))
        future.add_done_callback(lambda f: self._on_goal_response(run, f))
        return run

    def _on_goal_response(self, run: GoalRun, future) -> None:
        handle = future.result()
        run.answered_at = time.monotonic()
        run.accepted = bool(handle.accepted)
        if not run.accepted:
            run.finished_at = time.monotonic()
            run._done.set()
            return
        run.handle = handle
        handle.get_result_async().add_done_callback(lambda f: self._on_result(run, f))

    def _on_result(self, run: GoalRun, future) -> None:
        response = future.result()
        run.status = response.status
        run.result = response.result
        run.finished_at = time.monotonic()
        run._done.set()

    def wait(self, run: GoalRun, timeout_s: float = 60.0) -> GoalRun:
        """Wait for the goal to end (rejected or result); raise ClientTimeout otherwise."""
        if not run._done.wait(timeout_s):
            raise ClientTimeout(f'goal {run.goal_id} not finished after {timeout_s:g} s')
        if run.result is not None:
            self._await_trailing_feedback(run)
        if not run.accepted:
            # The reason arrives on ~/responses; give it a moment to land.
            deadline = time.monotonic() + 2.0
            while not run.reject_reason and time.monotonic() < deadline:
                with self._lock:
                    msg = self._rejections.get(run.goal_id)
                if msg is not None:
                    run.reject_reason = msg.reason
                    break
                time.sleep(0.02)
        return run

    @staticmethod
    def _await_trailing_feedback(run: GoalRun, grace_s: float = FEEDBACK_GRACE_S) -> None:
        """Give the last tokens' feedback a moment to land after the result.

        Feedback is a topic and the result a service reply: DDS does not order the two,
        so the result can overtake the last feedback messages (seen with a goal moved
        between vLLM replicas). One feedback message carries one token.
        """
        deadline = time.monotonic() + grace_s
        while len(run.feedback) < run.result.tokens and time.monotonic() < deadline:
            time.sleep(0.005)

    def cancel(self, run: GoalRun, timeout_s: float = 10.0) -> None:
        """Ask the server to cancel an accepted goal and wait for the answer."""
        deadline = time.monotonic() + timeout_s
        while not hasattr(run, 'handle'):
            if time.monotonic() > deadline:
                raise ClientTimeout('goal never accepted; cannot cancel')
            time.sleep(0.01)
        done = threading.Event()
        run.handle.cancel_goal_async().add_done_callback(lambda f: done.set())
        if not done.wait(max(0.0, deadline - time.monotonic())):
            raise ClientTimeout('cancel request not answered')

    def ask(self, goal: Instruct.Goal, timeout_s: float = 60.0, on_feedback=None) -> GoalRun:
        """Send a goal and wait for its end."""
        return self.wait(self.send(goal, on_feedback), timeout_s)

    def close(self) -> None:
        """Stop spinning and destroy the node."""
        self._executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()


def ensure_init() -> None:
    """Initialise rclpy once."""
    if not rclpy.ok():
        rclpy.init()
