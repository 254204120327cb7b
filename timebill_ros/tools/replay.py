# SPDX-License-Identifier: Apache-2.0
"""Replay a bag of Instructions against a running timebill node and record what comes back.

Like ``ros2 bag play``, the Instructions are published (as the CDR bytes stored
in the bag) on the node's ``~/instructions`` at their recorded offsets,
optionally sped up or slowed down. Unlike it, the replayer also waits for the
node's answers: every ``~/responses`` and ``~/telemetry`` message is recorded,
each request gets one CSV row (a request that got no response within the
timeout is a ``MISSING`` row, never dropped), and the deadline report PNG is
rendered from the CSV.

Threads: an executor thread spins the subscriptions; the publishing loop and
the waiting run in the caller's thread on the monotonic clock. Callbacks only
append under a lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math
import os
from pathlib import Path
import threading
import time
from typing import Callable

from timebill_ros import report
from timebill_ros.core.request import Outcome
from timebill_ros.core.workload import check_workload
from timebill_ros.tools import bags

OUTPUT_BAG = 'replay_bag'
OUTPUT_CSV = 'replay.csv'
OUTPUT_PNG = 'deadline_report.png'
# Telemetry is published just before its Response, on another topic; allow it a
# moment to arrive after the last Response before calling it missing.
TELEMETRY_GRACE_S = 1.0
POLL_S = 0.05
SHUTDOWN_TIMEOUT_S = 5.0


class ReplayError(Exception):
    """The replay cannot run (no node, unusable workload, bad arguments)."""


@dataclass
class ReplayResult:
    """What a replay produced and what it missed."""

    bag: Path
    csv: Path
    png: Path | None
    rows: list
    # Request ids without a Response within the timeout.
    missing: list = field(default_factory=list)
    # Request ids whose Response came but whose DeadlineTelemetry did not (admission
    # rejections have none and are not listed).
    missing_telemetry: list = field(default_factory=list)
    # Extra Responses for an id already answered, and Responses for other ids.
    duplicates: int = 0
    foreign: int = 0

    @property
    def complete(self) -> bool:
        """Return whether every request got its Response."""
        return not self.missing


def _check_number(name: str, value, minimum: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= minimum:
        raise ValueError(f'{name} must be a finite number > {minimum:g} (got {value!r})')


def replay(bag, out_dir, *, topic: str = bags.DEFAULT_TOPIC, node: str = bags.DEFAULT_NODE,
           scale: float = 1.0, timeout_s: float = 60.0, discovery_timeout_s: float = 10.0,
           storage: str = 'sqlite3', render: bool = True, context=None,
           log: Callable[[str], None] | None = None) -> ReplayResult:
    """Play the Instructions of ``bag`` on ``topic`` against the node ``node``; record results.

    ``scale`` divides the arrival offsets (2 = twice as fast, as ``ros2 bag play
    --rate``); budgets are not scaled. ``timeout_s`` bounds the wait for all
    responses after the last Instruction is sent; ``discovery_timeout_s`` bounds
    the wait for the node. Writes ``out_dir/replay_bag`` (Instructions as sent,
    Responses, telemetry), ``out_dir/replay.csv`` and, when ``render``,
    ``out_dir/deadline_report.png``. Uses the default rclpy context when it is
    initialised (or ``context``), else a private one.
    """
    _check_number('scale', scale)
    _check_number('timeout_s', timeout_s)
    _check_number('discovery_timeout_s', discovery_timeout_s)
    bags.storage_plugin(storage)
    if not isinstance(node, str) or not node.strip('/'):
        raise ValueError(f'node must name the timebill node, e.g. /timebill (got {node!r})')
    log = log or (lambda line: None)
    workload = bags.read_workload(bag, topic)
    if not workload.messages:
        raise ReplayError(f'bag {workload.path} has no Instructions on {topic}')
    try:
        check_workload(workload.items)
    except ValueError as exc:
        # Responses are matched to Instructions by id.
        raise ReplayError(f'bag {workload.path} cannot be replayed: {exc}') from exc
    out_dir = Path(out_dir)
    paths = (out_dir / OUTPUT_BAG, out_dir / OUTPUT_CSV, out_dir / OUTPUT_PNG)
    if paths[0].exists():
        raise bags.BagExistsError(f'{paths[0]} exists already; choose another output '
                                  f'directory')
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReplayError(f'cannot create {out_dir}: {exc.strerror or exc}') from exc

    node = '/' + node.strip('/')
    session = _Session(node, context)
    try:
        session.wait_for_node(discovery_timeout_s)
        log(f'replaying {len(workload.messages)} instructions from {workload.path} '
            f'to {node} (scale {scale:g})')
        sent = session.play(workload.messages, scale)
        ids = [m.item.id for m in workload.messages]
        session.wait_for_responses(ids, timeout_s)
    finally:
        session.close()

    rows, result = _rows(workload, sent, session, timeout_s)
    records = [(session.instructions_topic, wall_ns, m.raw)
               for m, (_, wall_ns) in zip(workload.messages, sent)]
    records += session.records()
    records.sort(key=lambda record: record[1])
    bags.write_bag(paths[0], {session.instructions_topic: bags.INSTRUCTION,
                              session.responses_topic: bags.RESPONSE,
                              session.telemetry_topic: bags.TELEMETRY},
                   records, storage, {bags.START_KEY: session.start_wall_ns})
    report.write_csv(paths[1], rows)
    png = None
    if render:
        png = report.render(paths[1], paths[2],
                            title=f'replay of {workload.path.name} (scale {scale:g})')
    result.bag, result.csv, result.png = paths[0], paths[1], png
    log(f'{report.summary(report.read_csv(paths[1]))}; wrote {paths[0]}, {paths[1]}'
        + (f', {png}' if png else ''))
    return result


def _rows(workload: bags.WorkloadBag, sent: list, session: '_Session',
          timeout_s: float) -> tuple:
    responses, telemetry = session.first_by_id()
    ids = {m.item.id for m in workload.messages}
    rows, missing, missing_telemetry = [], [], []
    for message, (sent_s, _) in zip(workload.messages, sent):
        item = message.item
        row = {'id': item.id, 'arrival_s': item.arrival_s, 'sent_s': sent_s,
               'budget_s': item.budget_s, 'policy': item.policy, 'mode': item.mode}
        response = responses.get(item.id)
        if response is None:
            missing.append(item.id)
            row.update(outcome=report.MISSING, deadline_met=False,
                       reason=f'no response within {timeout_s:g} s after the last instruction')
        else:
            plan = response.plan
            row.update(outcome=_outcome_name(response.outcome),
                       deadline_met=bool(response.deadline_met), e2e_s=response.e2e_s,
                       queue_s=response.queue_s, prefill_s=response.prefill_s,
                       decode_s=response.decode_s, tokens=response.tokens,
                       eviction_ratio=float(plan.eviction_ratio),
                       predicted_tokens=plan.predicted_tokens,
                       worst_case_tokens=plan.worst_case_tokens, est_wcet_s=plan.est_wcet_s,
                       reason=response.reason)
            if item.id not in telemetry and response.outcome != Outcome.REJECTED:
                missing_telemetry.append(item.id)
        rows.append(row)
    answered = [r for _, r in session.responses]
    duplicates = sum(1 for r in answered if r.id in ids) - len(ids & responses.keys())
    foreign = sum(1 for r in answered if r.id not in ids)
    result = ReplayResult(bag=Path(), csv=Path(), png=None, rows=rows, missing=missing,
                          missing_telemetry=missing_telemetry, duplicates=duplicates,
                          foreign=foreign)
    return rows, result


def _outcome_name(value: int) -> str:
    try:
        return Outcome(value).name
    except ValueError:
        return f'OUTCOME_{value}'


class _Session:
    """The replayer's rclpy node: one publisher, two recording subscriptions, one executor."""

    def __init__(self, node: str, context=None):
        import rclpy

        self._rclpy = rclpy
        self._own_context = None
        if context is None:
            default = rclpy.get_default_context()
            if default.ok():
                context = default
            else:
                context = self._own_context = rclpy.Context()
                rclpy.init(context=context)
        self.context = context
        try:
            self._setup(node)
        except BaseException:
            if self._own_context is not None:
                rclpy.try_shutdown(context=self._own_context)
            raise

    def _setup(self, node: str) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        from timebill_msgs.msg import DeadlineTelemetry, Instruction, Response
        from timebill_ros.ros.qos import BURST_DEPTH, reliable

        context = self.context
        self.instructions_topic = f'{node}/instructions'
        self.responses_topic = f'{node}/responses'
        self.telemetry_topic = f'{node}/telemetry'
        # Reliable like the node, as deep as its burst depth: no answer is dropped here.
        qos = reliable(BURST_DEPTH)
        self.node = rclpy.create_node(f'timebill_replay_{os.getpid()}', context=context)
        self.publisher = self.node.create_publisher(Instruction, self.instructions_topic, qos)
        self._response_sub = self.node.create_subscription(
            Response, self.responses_topic, self._on_response, qos)
        self._telemetry_sub = self.node.create_subscription(
            DeadlineTelemetry, self.telemetry_topic, self._on_telemetry, qos)
        self._changed = threading.Condition()
        # (receive wall-clock ns, message), in arrival order.
        self.responses: list = []
        self.telemetry: list = []
        self.start_wall_ns = time.time_ns()
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, name='timebill-replay-spin',
                                        daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - shutdown races end the spin; the main thread reports
            pass

    def _on_response(self, msg) -> None:
        with self._changed:
            self.responses.append((time.time_ns(), msg))
            self._changed.notify_all()

    def _on_telemetry(self, msg) -> None:
        with self._changed:
            self.telemetry.append((time.time_ns(), msg))
            self._changed.notify_all()

    def wait_for_node(self, timeout_s: float) -> None:
        """Wait until the node subscribes our Instructions and publishes its answers."""
        end = time.monotonic() + timeout_s
        while True:
            ready = (self.publisher.get_subscription_count() > 0
                     and self._publishers(self._response_sub) > 0
                     and self._publishers(self._telemetry_sub) > 0)
            if ready:
                return
            if time.monotonic() >= end:
                raise ReplayError(
                    f'no timebill node found within {timeout_s:g} s (nothing subscribes '
                    f'{self.instructions_topic} and publishes {self.responses_topic} and '
                    f'{self.telemetry_topic}); start one with: python -m '
                    f'timebill_ros.ros.node (same ROS_DOMAIN_ID)')
            time.sleep(POLL_S)

    def _publishers(self, subscription) -> int:
        # Matched publishers where rclpy has the call (Iron and later), else the graph count.
        if hasattr(subscription, 'get_publisher_count'):
            return subscription.get_publisher_count()
        return self.node.count_publishers(subscription.topic_name)

    def play(self, messages: list, scale: float) -> list:
        """Publish each message at its arrival offset / scale; return [(sent_s, wall_ns)]."""
        self.start_wall_ns = time.time_ns()
        start = time.monotonic()
        sent = []
        for message in messages:
            target = start + message.item.arrival_s / scale
            while (left := target - time.monotonic()) > 0:
                time.sleep(min(left, POLL_S))
            # The stored CDR bytes, as ros2 bag play publishes them.
            self.publisher.publish(message.raw)
            sent.append((time.monotonic() - start, time.time_ns()))
        return sent

    def wait_for_responses(self, ids: list, timeout_s: float) -> None:
        """Wait (bounded) for a Response per id, then briefly for their telemetry."""
        wanted = set(ids)
        end = time.monotonic() + timeout_s
        with self._changed:
            while not wanted <= {m.id for _, m in self.responses}:
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(min(left, POLL_S * 10))
            grace_end = min(end, time.monotonic() + TELEMETRY_GRACE_S)
            while not self._telemetry_complete(wanted):
                left = grace_end - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(min(left, POLL_S * 10))

    def _telemetry_complete(self, wanted: set) -> bool:
        # Admission rejections get no telemetry; every other answer does.
        expected = {m.id for _, m in self.responses
                    if m.id in wanted and m.outcome != Outcome.REJECTED}
        return expected <= {m.request_id for _, m in self.telemetry}

    def first_by_id(self) -> tuple:
        """Return the first Response and DeadlineTelemetry per id."""
        with self._changed:
            responses, telemetry = {}, {}
            for _, msg in self.responses:
                responses.setdefault(msg.id, msg)
            for _, msg in self.telemetry:
                telemetry.setdefault(msg.request_id, msg)
        return responses, telemetry

    def records(self) -> list:
        """Return what was received as bag records ``(topic, log_time_ns, cdr_bytes)``."""
        from rclpy.serialization import serialize_message
        with self._changed:
            received = [(self.responses_topic, t, m) for t, m in self.responses]
            received += [(self.telemetry_topic, t, m) for t, m in self.telemetry]
        return [(topic, t, bytes(serialize_message(m))) for topic, t, m in received]

    def close(self) -> None:
        """Stop the executor thread and destroy the node (bounded waits)."""
        try:
            self.executor.shutdown(timeout_sec=SHUTDOWN_TIMEOUT_S)
        finally:
            self._thread.join(SHUTDOWN_TIMEOUT_S)
            self.node.destroy_node()
            if self._own_context is not None:
                self._rclpy.try_shutdown(context=self._own_context)
