# SPDX-License-Identifier: Apache-2.0
"""The node's ROS interfaces over the one Server: action, services, topics, diagnostics.

A thin rclpy adapter over the ROS-free serving core (serving/server.py): it converts
goals, topics and services into Server calls, and publishes results, telemetry and
diagnostics. The plain node (ros/node.py) and the managed one (ros/lifecycle.py) both
serve through it.
"""

from __future__ import annotations

import socket
import threading
import time
import traceback
from typing import Callable

import rclpy
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from diagnostic_msgs.msg import DiagnosticArray

from timebill_msgs.action import Instruct
from timebill_msgs.msg import DeadlineTelemetry, Instruction, Response
from timebill_msgs.srv import Calibrate, PlanInstruction
from timebill_ros.core.config import NodeConfig
from timebill_ros.core.execution import JobResult
from timebill_ros.core.feedback import FeedbackPacer
from timebill_ros.core.request import Outcome, Rejection
from timebill_ros.ros import convert, parameters
from timebill_ros.ros.diagnostics import build_array, build_statuses
from timebill_ros.ros.heap import freeze_startup_heap
from timebill_ros.ros.qos import action_server_qos, reliable
from timebill_ros.runtime.model import on_own_thread
from timebill_ros.serving.assembly import Assembly
from timebill_ros.serving.jobs import Job, JobHooks
from timebill_ros.serving.local_executor import local_server
from timebill_ros.serving.server import Server


class UuidActionServer(ActionServer):
    """An ActionServer whose goal callback can learn the goal's UUID.

    rclpy hands the goal callback the goal message alone; rejection reasons are
    published on ~/responses under the goal UUID, so the client can read why.
    This overrides a private rclpy method (pinned rclpy 9.1.x) and only records
    the UUID before delegating.
    """

    def __init__(self, *args, **kwargs):
        """Create the server with an empty goal-to-UUID table."""
        self._uuids: dict = {}
        super().__init__(*args, **kwargs)

    async def _execute_goal_request(self, request_header_and_message):
        goal_request = request_header_and_message[1]
        self._uuids[id(goal_request.goal)] = bytes(goal_request.goal_id.uuid).hex()
        try:
            await super()._execute_goal_request(request_header_and_message)
        finally:
            self._uuids.pop(id(goal_request.goal), None)

    def goal_uuid(self, goal) -> str:
        """Return the hex UUID of a goal message under evaluation."""
        return self._uuids.get(id(goal), f'goal-{id(goal):x}')


# Executor threads. Each running goal's execute callback holds one until its result
# (rclpy re-runs a pending coroutine on every wake, so awaiting would spin). Locally few
# goals run at once (max_batch); on replicas every admitted goal runs at once, and a
# goal beyond the threads would wait for one to be accepted and to get its result.
LOCAL_THREADS, REMOTE_THREADS = 4, 256


def executor_threads(config: NodeConfig) -> int:
    """Return the executor's threads for the node's backend (threads are made as needed)."""
    return REMOTE_THREADS if config.backend == 'vllm' else LOCAL_THREADS


# How long a finished-but-canceled goal waits for rclpy to mark it CANCELING.
CANCEL_STATE_WAIT_S = 2.0
RESULT_POLL_S = 0.2


def read_parameters(node) -> NodeConfig:
    """Declare every parameter of the table on ``node`` and return the validated config."""
    return parameters.declare(node)


class Interfaces:
    """The action server, services, topics and diagnostics of one node over one Server.

    ``gate()`` returns why goals are refused right now ('' when they are served): a
    managed node that is inactive refuses them with that reason.
    """

    def __init__(self, node, config: NodeConfig, loaded, server: Server,
                 gate: Callable[[], str] = lambda: ''):
        """Create every ROS entity the node serves on."""
        self.node, self.config, self.loaded, self.server, self.gate = \
            node, config, loaded, server, gate
        self.hardware_id = config.hardware_id or f'{socket.gethostname()}/{loaded.device}'
        self._last_utilisation = float('nan')
        self._pacers = {}  # goal key -> its FeedbackPacer, until its result
        # goal key -> the REJECTED result of a refused goal accepted to be ended at once
        # (refused_goals: accept_and_end), until its execute callback delivers it.
        self._refused = {}
        group = ReentrantCallbackGroup()
        self._action = UuidActionServer(
            node, Instruct, '~/instruct', execute_callback=self._execute,
            goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel, callback_group=group,
            **action_server_qos(config.qos_depth))
        burst = reliable(config.qos_depth)
        self._services = [
            node.create_service(PlanInstruction, '~/plan', self._on_plan, qos_profile=burst,
                                callback_group=group),
            node.create_service(Calibrate, '~/calibrate', self._on_calibrate,
                                callback_group=group)]
        self._subscription = node.create_subscription(Instruction, '~/instructions',
                                                      self._on_instruction, burst,
                                                      callback_group=group)
        self._responses = node.create_publisher(Response, '~/responses', burst)
        self._telemetry_pub = node.create_publisher(DeadlineTelemetry, '~/telemetry', burst)
        self._diagnostics = node.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._timer = node.create_timer(config.diagnostics_period_s,
                                        self._publish_diagnostics, callback_group=group)
        server.on_finished = self._publish_result

    def reconfigure(self, config: NodeConfig) -> None:
        """Put a new configuration (live parameters only changed) in force."""
        self.server.reconfigure(config)
        self.config = config
        self.hardware_id = config.hardware_id or f'{socket.gethostname()}/{self.loaded.device}'

    def action_name(self) -> str:
        """Return the resolved name of the action."""
        return self.node.resolve_topic_name('~/instruct')

    def destroy(self) -> None:
        """Remove every entity (a managed node's cleanup)."""
        node = self.node
        self._action.destroy()
        for service in self._services:
            node.destroy_service(service)
        node.destroy_subscription(self._subscription)
        for publisher in (self._responses, self._telemetry_pub, self._diagnostics):
            node.destroy_publisher(publisher)
        node.destroy_timer(self._timer)

    def get_logger(self):
        """Return the node's logger."""
        return self.node.get_logger()

    # -- goals in -----------------------------------------------------------------------

    def _reject(self, key: str, exc: Rejection) -> None:
        self.server.rejected(exc.plan)
        self.get_logger().warning(f'rejected {key}: {exc.reason}')
        rejected = JobResult(outcome=Outcome.REJECTED, deadline_met=False, reason=exc.reason)
        self._responses.publish(convert.response_msg(key, rejected, self.stamp()))

    def _internal_error(self, key: str, exc: Exception) -> Rejection:
        """Log a failure of admission itself; return the rejection the caller gets.

        A defect in planning must cost the goal, not the node: before this, one
        exception here ended the executor and every goal after it went unanswered.
        """
        self.get_logger().error(f'admission failed for {key}: '
                                + ''.join(traceback.format_exception(exc)))
        return Rejection(f'internal error while planning the goal ({type(exc).__name__}: '
                         f'{exc}); the node keeps serving')

    def _on_goal(self, goal) -> GoalResponse:
        key = self._action.goal_uuid(goal)
        try:
            closed = self.gate()
            if closed:
                raise Rejection(closed)
            # Planned once here; its place in the queue is held until it is started.
            self.server.admit(convert.spec_from(goal, now_ns=self.now_ns()), key)
        except Rejection as exc:
            return self._refuse_goal(key, exc)
        except Exception as exc:  # noqa: BLE001 - see _internal_error
            return self._refuse_goal(key, self._internal_error(key, exc))
        return GoalResponse.ACCEPT

    def _refuse_goal(self, key: str, exc: Rejection) -> GoalResponse:
        """Refuse an action goal: reject its request, or accept it to end it at once."""
        self._reject(key, exc)
        if self.config.refused_goals != 'accept_and_end':
            return GoalResponse.REJECT
        self._refused[key] = JobResult(outcome=Outcome.REJECTED, deadline_met=False,
                                       reason=exc.reason)
        return GoalResponse.ACCEPT

    def _on_accepted(self, goal_handle) -> None:
        key = bytes(goal_handle.goal_id.uuid).hex()
        if key in self._refused:  # accepted only to end with its reason
            goal_handle.execute()
            return

        def publish(event, elapsed, remaining, plan):
            goal_handle.publish_feedback(convert.feedback_msg(event, elapsed, remaining, plan))
        pacer = self._pacers[key] = FeedbackPacer(self.config.feedback_period_s, publish)
        # The action's execute callback starts only when the goal leaves the queue, so
        # waiting goals hold no executor thread.
        self.server.start(key, JobHooks(cancel_requested=lambda: goal_handle.is_cancel_requested,
                                        on_start=goal_handle.execute, on_feedback=pacer))

    def _on_instruction(self, msg: Instruction) -> None:
        key = msg.id or f'instruction-{msg.header.stamp.sec}.{msg.header.stamp.nanosec:09d}'
        try:
            closed = self.gate()
            if closed:
                raise Rejection(closed)
            self.server.submit(self.server.admit(
                convert.spec_from(msg, key, self.now_ns()), key))
        except Rejection as exc:
            self._reject(key, exc)
        except Exception as exc:  # noqa: BLE001 - see _internal_error
            self._reject(key, self._internal_error(key, exc))

    def _on_plan(self, request, response):
        try:
            closed = self.gate()
            if closed:
                raise Rejection(closed)
            job = self.server.dry_run(  # the goal's own path
                convert.spec_from(request, now_ns=self.now_ns()))
        except Rejection as exc:
            response.accepted, response.reason = False, exc.reason
            return response
        except Exception as exc:  # noqa: BLE001 - see _internal_error
            response.accepted = False
            response.reason = self._internal_error('a dry run', exc).reason
            return response
        response.accepted = True
        response.reason = (f'would be accepted (P(answer fits) = '
                           f'{job.plan.fit_probability:.0%})')
        response.plan = convert.plan_to_msg(job.plan)
        return response

    def _on_cancel(self, goal_handle) -> CancelResponse:
        self.server.cancel(bytes(goal_handle.goal_id.uuid).hex())
        return CancelResponse.ACCEPT

    def _on_calibrate(self, request, response):
        try:
            profile = self.server.recalibrate(request.quick)
        except Exception as exc:  # noqa: BLE001 - report any failure to the caller
            response.success, response.message = False, f'calibration failed: {exc!r}'
            return response
        response.success, response.message = True, 'calibrated'
        response.profile_path = str(self.server.executor.profile_path)
        response.prefill_mape_pct = profile.heldout['prefill_mape_pct']
        response.decode_mape_pct = profile.heldout['decode_mape_pct']
        return response

    # -- results out --------------------------------------------------------------------

    def _publish_result(self, job: Job, result: JobResult, estimate: float,
                        error: float) -> None:
        """Publish a finished job's telemetry and response (the server's on_finished)."""
        pacer = self._pacers.pop(job.key, None)
        if pacer is not None:  # the feedback held back goes out before the result
            pacer.flush()
        stamp = self.stamp()
        telemetry = convert.telemetry_msg(job.key, job.request.request_id or job.key,
                                          job.request.policy, job.request.budget_s, result,
                                          stamp)
        telemetry.est_compute_s, telemetry.ete_error_pct = estimate, error
        if result.plan.token_deadline_s > 0 and result.step_times:
            self._last_utilisation = telemetry.utilisation
        self._telemetry_pub.publish(telemetry)
        self._responses.publish(convert.response_msg(
            job.request.request_id or job.key, result, stamp))
        self.get_logger().info(
            f'{job.key[:8]} {result.outcome.name} deadline_met={result.deadline_met} '
            f'tokens={result.tokens} e2e={result.e2e_s:.3f}s budget={job.request.budget_s:g}s')

    def _execute(self, goal_handle):
        # rclpy answers an execute callback that raises with an empty result (outcome 0,
        # no reason): never let one out, say what went wrong instead.
        try:
            return self._deliver(goal_handle)
        except Exception as exc:  # noqa: BLE001 - a result must always carry its reason
            self.get_logger().error(f'delivering goal {bytes(goal_handle.goal_id.uuid).hex()} '
                                    f'failed: {traceback.format_exc()}')
            if goal_handle.is_active:
                goal_handle.abort()
            return Instruct.Result(outcome=int(Outcome.FAILED),
                                   reason=f'internal error delivering the result: {exc!r}')

    def _deliver(self, goal_handle):
        key = bytes(goal_handle.goal_id.uuid).hex()
        refused = self._refused.pop(key, None)
        if refused is not None:
            goal_handle.abort()
            return convert.result_to_msg(refused)
        job = self.server.job(key)
        while not job.done.wait(RESULT_POLL_S):
            if not rclpy.ok():
                goal_handle.abort()
                return Instruct.Result(outcome=int(Outcome.FAILED), reason='node shutting down')
        self.server.forget(key)
        result = job.result
        if result.outcome == Outcome.CANCELED:
            # job.done is already set, so pause on a fresh event: rclpy marks the goal
            # CANCELING only after the cancel callback returns.
            pause, give_up = threading.Event(), time.monotonic() + CANCEL_STATE_WAIT_S
            while not goal_handle.is_cancel_requested and time.monotonic() < give_up:
                pause.wait(0.01)
            if goal_handle.is_cancel_requested:
                goal_handle.canceled()
            else:
                goal_handle.abort()
        elif result.outcome == Outcome.COMPLETED and result.deadline_met:
            goal_handle.succeed()
        else:
            # A late, killed, skipped or failed answer is not a success.
            goal_handle.abort()
        return convert.result_to_msg(result)

    # -- diagnostics --------------------------------------------------------------------

    def now_ns(self) -> int:
        """Return the node clock's time (ROS time: sim time under use_sim_time), in ns."""
        return self.node.get_clock().now().nanoseconds

    def stamp(self):
        """Return the node clock's time as a message."""
        return self.node.get_clock().now().to_msg()

    def _publish_diagnostics(self) -> None:
        summary, extra = self.server.status()
        extra.update({'model': self.loaded.name, 'device': self.loaded.device,
                      'dtype': self.loaded.dtype,
                      # P99 TPOT / per-token deadline of the last goal that had one.
                      'utilisation_last': self._last_utilisation})
        extra['state'] = self.gate() or 'serving'
        statuses = build_statuses(self.node.get_fully_qualified_name(), self.hardware_id,
                                  summary, extra, self.config.thresholds())
        self._diagnostics.publish(build_array(statuses, self.stamp()))


def build(node, config: NodeConfig, loader: Callable, gate=lambda: '') -> Interfaces:
    """Create the node's interfaces over its backend, then freeze what start-up left."""
    interfaces = build_remote(node, config, gate) if config.backend == 'vllm' \
        else build_local(node, config, loader, gate)
    node.get_logger().info(f'{freeze_startup_heap()} start-up objects out of garbage '
                           'collection (ros/heap.py)')
    return interfaces


def build_local(node, config: NodeConfig, loader: Callable, gate=lambda: '') -> Interfaces:
    """Load the model, assemble the server over the local engines, create the interfaces."""
    log = node.get_logger()
    log.info(f'loading model {config.model!r} on {config.device} ({config.dtype})')

    def setup():
        loaded = loader(config.model, config.device, config.dtype)
        return loaded, local_server(Assembly(config, loaded, log), lambda *args: None)
    # Torch setup off this thread: see on_own_thread (decode steps ran ~10 % slower).
    loaded, server = on_own_thread(setup)
    interfaces = Interfaces(node, config, loaded, server, gate)
    log.info(f'ready: model {loaded.name}, context {loaded.context_window} tokens, '
             f'scheduler {server.scheduler}, action {interfaces.action_name()}')
    return interfaces


def build_remote(node, config: NodeConfig, gate=lambda: '') -> Interfaces:
    """Create the node's interfaces over vLLM replicas (no local model)."""
    from timebill_ros.runtime.model import load_tokenizer
    from timebill_ros.runtime.predictor import text_predictor
    from timebill_ros.serving.replica_executor import RemoteModel, replica_server
    log = node.get_logger()
    tokenizer, name = load_tokenizer(config.model)  # counts prompt tokens, nothing more
    predictor = text_predictor(config.text_length_predictor)
    log.info(f'answer lengths planned on: {predictor.name if predictor else "recent answers"}')
    server = replica_server(config, tokenizer, log, predictor=predictor)
    if config.warm_up:
        server.executor.warm_up()
    loaded = RemoteModel(name=f'{name} on {config.vllm_endpoints}')
    interfaces = Interfaces(node, config, loaded, server, gate)
    log.info(f'ready: vLLM replicas {config.vllm_endpoints} (model {config.vllm_model}), '
             f'action {interfaces.action_name()}')
    return interfaces
