"""The timebill node: an Instruct action server answering before each goal's deadline."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
import socket
import sys
import threading
import time
from typing import Callable

import rclpy
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rcl_interfaces.msg import ParameterDescriptor
from diagnostic_msgs.msg import DiagnosticArray

from timebill_ros.action import Instruct
from timebill_ros.core.config import NodeConfig, PARAMS
from timebill_ros.core.cuts import CutEffects, SHIPPED as SHIPPED_CUT_EFFECTS
from timebill_ros.core.deadline import DeadlineClock, SkipNextTracker
from timebill_ros.core.execution import (
    ended_before_start, JobResult, PrefillDecision, run_job)
from timebill_ros.core.planning import (
    FullModelPlanner, MaxTokensPredictor, Plan, TimeBillPlanner)
from timebill_ros.core.profile import default_path, Profile
from timebill_ros.core.queueing import FifoQueue
from timebill_ros.core.request import (
    check_prompt_fits, Mode, Outcome, Rejection, Request, validate)
from timebill_ros.core.telemetry import GoalRecord, Telemetry
from timebill_ros.core.timing import OnlineTimingModel
from timebill_ros.msg import DeadlineTelemetry, Instruction, Response
from timebill_ros.ros import convert
from timebill_ros.ros.diagnostics import build_array, build_status
from timebill_ros.core.early_exit import ExitRule, LayerTimes
from timebill_ros.core.planning import EarlyExitConfig
from timebill_ros.runtime.early_exit import LayerwiseDecoder, measure_layer_times
from timebill_ros.runtime.engine import Engine
from timebill_ros.runtime.exit_heads import ExitHeads, SHIPPED_EXIT_HEADS
from timebill_ros.runtime.model import (
    cache_root, load_model, ModelLoadError, precision_variant, prompt_ids)
from timebill_ros.runtime.predictor import load_predictor, SHIPPED_HEAD
from timebill_ros.runtime.presses import press_for_plan
from timebill_ros.runtime.profiler import calibrate, Grid, QUICK
from timebill_ros.srv import Calibrate, PlanInstruction


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


# How long a finished-but-canceled goal waits for rclpy to mark it CANCELING.
CANCEL_STATE_WAIT_S = 2.0
WORKER_POLL_S = 0.2


@dataclass(eq=False)
class Job:
    """One admitted goal (action goal or topic instruction) waiting for or holding the model."""

    key: str
    request: Request
    prompt_ids: list
    clock: DeadlineClock
    plan: Plan
    goal_handle: object = None
    done: threading.Event = field(default_factory=threading.Event)
    result: JobResult | None = None

    def cancel_requested(self) -> bool:
        """Tell whether the action client asked to cancel."""
        return self.goal_handle is not None and self.goal_handle.is_cancel_requested


class TimebillNode(Node):
    """Serve ~/instruct, ~/plan and ~/instructions with one model, one goal at a time."""

    def __init__(self, loader: Callable = load_model, **kwargs):
        """Declare parameters, load the model (ModelLoadError on failure) and start serving."""
        super().__init__('timebill', **kwargs)
        self.config = self._read_parameters()
        self.get_logger().info(
            f'loading model {self.config.model!r} on {self.config.device} ({self.config.dtype})')
        self.loaded = loader(self.config.model, self.config.device, self.config.dtype)
        self.variants = self._make_variants()
        self.engine = Engine(self.loaded, press_for_plan, variants=self.variants,
                             decode_threads=self.config.decode_threads)
        # The rule and heads now; per-layer times come with the ETE profile (_use_profile).
        self._exit_rule, self._exit_heads = self._make_exit_rule()
        self.early_exit: EarlyExitConfig | None = None
        self._last_utilisation = float('nan')
        if self.config.warm_up:
            self.engine.warm_up(press=self.config.press)
        self._model_lock = threading.Lock()
        self.predictor = self._make_predictor(self.config.length_predictor)
        self.effects = self._load_cut_effects(self.config.cut_effects)
        self.online: OnlineTimingModel | None = None
        self.online_variants: dict = {}
        self.profile_path = Path(self.config.profile) if self.config.profile else default_path(
            cache_root(), self.loaded.name, self.loaded.device, self.loaded.dtype)
        self._load_or_calibrate()
        self.telemetry = Telemetry(window=self.config.miss_window)
        self.hardware_id = (self.config.hardware_id
                            or f'{socket.gethostname()}/{self.loaded.device}')

        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queue: FifoQueue = FifoQueue(self.config.queue_length)
        self._pending: dict = {}
        self._jobs: dict = {}
        self._skip = SkipNextTracker()
        self._running: Job | None = None
        self._stopping = False

        group = ReentrantCallbackGroup()
        self._action = UuidActionServer(
            self, Instruct, '~/instruct', execute_callback=self._execute,
            goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel, callback_group=group)
        self.create_service(PlanInstruction, '~/plan', self._on_plan, callback_group=group)
        self.create_service(Calibrate, '~/calibrate', self._on_calibrate, callback_group=group)
        self.create_subscription(Instruction, '~/instructions', self._on_instruction, 10,
                                 callback_group=group)
        self._responses = self.create_publisher(Response, '~/responses', 10)
        self._telemetry_pub = self.create_publisher(DeadlineTelemetry, '~/telemetry', 10)
        self._diagnostics = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self.create_timer(self.config.diagnostics_period_s, self._publish_diagnostics,
                          callback_group=group)
        self._worker = threading.Thread(target=self._work_loop, name='timebill-worker',
                                        daemon=True)
        self._worker.start()
        self.get_logger().info(
            f'ready: model {self.loaded.name}, context {self.loaded.context_window} tokens, '
            f'action {self._action_name()}')

    # -- parameters -------------------------------------------------------------------

    def _read_parameters(self) -> NodeConfig:
        values = {}
        for param in PARAMS:
            # A one-layer list ('-p early_exit_layers:=22') arrives as an integer.
            loose = param.name == 'early_exit_layers'
            descriptor = ParameterDescriptor(description=param.description,
                                             dynamic_typing=loose)
            value = self.declare_parameter(param.name, param.default, descriptor).value
            values[param.name] = str(value) if loose else value
        return NodeConfig.from_dict(values)

    # -- execution-time estimator --------------------------------------------------------

    def _make_exit_rule(self) -> tuple:
        """Return (ExitRule, ExitHeads or None), or (None, None) when early exit is off."""
        layers = self.config.exit_layers()
        if not layers:
            return None, None
        if layers[-1] >= self.loaded.num_layers:
            raise ValueError(f'early_exit_layers {layers}: the model has '
                             f'{self.loaded.num_layers} layers (exits must be below the last)')
        if not hasattr(self.loaded.model, 'model') or \
                not hasattr(self.loaded.model.model, 'layers'):
            raise ValueError('early exit needs a Llama-style model (model.model.layers)')
        rule = ExitRule(layers, self.config.early_exit_threshold_start,
                        self.config.early_exit_threshold_end)
        return rule, self._load_exit_heads(layers)

    def _early_exit_from(self, profile: Profile) -> EarlyExitConfig:
        """Pair the exit rule with per-layer times from the profile (measured if absent)."""
        stored = profile.layer_times or {}
        if len(stored.get('layers_s') or ()) == self.loaded.num_layers:
            times, source = LayerTimes(tuple(stored['layers_s']), stored['head_s']), 'profile'
        else:
            with self._model_lock:
                times = measure_layer_times(self.loaded, n_kv=512, steps=4)
            source = 'measured now (profile has none)'
        self.get_logger().info(
            f'early exit at layers {self._exit_rule.exit_layers}: per-layer times from '
            f'{source}: layer {sum(times.layers) * 1e3 / len(times.layers):.2f} ms mean, '
            f'head {times.head_s * 1e3:.2f} ms, full step {times.full_s * 1e3:.1f} ms')
        return EarlyExitConfig(self._exit_rule, times)

    def _load_exit_heads(self, layers: tuple):
        """Return the exit heads the parameter asks for (None: logit lens everywhere)."""
        choice = self.config.early_exit_heads
        if choice == 'lens':
            return None
        path = SHIPPED_EXIT_HEADS if choice == 'shipped' else Path(choice)
        if not path.is_file():
            raise ValueError(f'early_exit_heads {choice!r}: no file at {path}')
        heads = ExitHeads.load(path)
        if heads.target != self.loaded.name:
            # Maps are fitted to one model's hidden states.
            self.get_logger().warning(f'exit heads {path} were fitted on {heads.target!r}, '
                                      f'not {self.loaded.name!r}: using the logit lens')
            return None
        covered = [layer for layer in layers if layer in heads.maps]
        self.get_logger().info(f'exit heads from {path} at layers {covered}; logit lens at '
                               f'{[layer for layer in layers if layer not in covered]}')
        return ExitHeads(heads.target, {k: v for k, v in heads.maps.items() if k in covered})

    def _make_predictor(self, choice: str):
        """Build the answer-length predictor the parameter names (ValueError if unusable)."""
        if choice == 'max-new-tokens':
            return MaxTokensPredictor()
        path = SHIPPED_HEAD if choice == 'rlp' else Path(choice)
        if not path.is_file():
            raise ValueError(f'length_predictor {choice!r}: no head file at {path}')
        try:
            predictor = load_predictor(path, self.loaded,
                                       self.config.length_predictor_max_tokens)
        except ValueError as exc:  # e.g. the head reads a layer this model does not have
            self.get_logger().warning(f'length predictor {path} does not fit model '
                                      f'{self.loaded.name!r} ({exc}): using max-new-tokens')
            return MaxTokensPredictor()
        if predictor.target != self.loaded.name:
            # Lengths are distilled from one model; another model answers differently.
            self.get_logger().warning(
                f'length predictor {path} was trained on {predictor.target!r} answers, not '
                f'{self.loaded.name!r}: using max-new-tokens instead')
            return MaxTokensPredictor()
        self.get_logger().info(f'length predictor {predictor.name} from {path}')
        return predictor

    def _make_variants(self) -> dict:
        """Quantise the resident copy MODE_AUTO may decode with ({} when off or unsupported)."""
        precision = self.config.auto_precision
        if not precision or precision == self.loaded.dtype:
            return {}
        try:
            variant = precision_variant(self.loaded, precision)
        except ModelLoadError as exc:
            self.get_logger().warning(f'auto_precision {precision!r} unavailable: {exc}')
            return {}
        self.get_logger().info(f'resident {precision} copy for MODE_AUTO decoding')
        return {precision: variant}

    def _load_cut_effects(self, choice: str) -> CutEffects:
        """Read the measured effects of each cut ('' or a mismatch: cuts count as harmless)."""
        if not choice:
            return CutEffects()
        path = SHIPPED_CUT_EFFECTS if choice == 'shipped' else Path(choice)
        try:
            effects = CutEffects.load(path)
        except ValueError as exc:
            if choice != 'shipped':
                raise
            self.get_logger().warning(f'{exc}: cuts are assumed not to change answers')
            return CutEffects()
        if self.loaded.name not in effects.source:
            # Measured on one model's answers; another model reacts differently.
            self.get_logger().warning(f'cut effects {path} were measured on another model '
                                      f'({effects.source!r}): cuts assumed harmless')
            return CutEffects()
        self.get_logger().info(f'cut effects from {path} ({effects.source})')
        return effects

    def _load_or_calibrate(self) -> None:
        """Use the matching profiles, calibrate when allowed, else plan without an ETE."""
        profile = self._profile_for(self.loaded, self.profile_path)
        self.online_variants = {}
        for precision, variant in self.variants.items():
            found = self._profile_for(variant, self._variant_profile_path(precision))
            if found is not None:
                self.online_variants[precision] = self._online(found)
        self._use_profile(profile)

    def _variant_profile_path(self, precision: str) -> Path:
        """Return where a resident variant's profile lives: beside ``profile`` if set."""
        if self.config.profile:
            main = Path(self.config.profile)
            return main.with_name(f'{main.stem}.{precision}{main.suffix}')
        return default_path(cache_root(), self.loaded.name, self.loaded.device, precision)

    def _profile_for(self, loaded, path: Path) -> Profile | None:
        """Return the profile at ``path`` if it matches ``loaded``, else calibrate if allowed."""
        profile = None
        if path.is_file():
            try:
                profile = Profile.load(path)
            except ValueError as exc:
                self.get_logger().warning(str(exc))
            if profile and not profile.matches(loaded.name, loaded.device, loaded.dtype):
                self.get_logger().warning(
                    f'{path} was measured for {profile.model}/{profile.device}/'
                    f'{profile.dtype}, not this model; ignoring it')
                profile = None
        if profile is None and self.config.calibrate_on_start:
            self.get_logger().info(f'no {loaded.dtype} execution-time profile: calibrating '
                                   '(one-off)')
            profile = self._calibrate(self.config.calibration_quick, loaded, path)
        return profile

    def _calibrate(self, quick: bool, loaded=None, path: Path | None = None) -> Profile:
        loaded, path = loaded or self.loaded, path or self.profile_path
        with self._model_lock:
            profile = calibrate(loaded, QUICK if quick else Grid(), progress=False,
                                decode_threads=self.config.decode_threads)
        profile.save(path)
        self.get_logger().info(
            f'calibrated {loaded.dtype}: held-out MAPE prefill '
            f'{profile.heldout["prefill_mape_pct"]:.2f}%, decode step '
            f'{profile.heldout["decode_mape_pct"]:.2f}%; saved {path}')
        return profile

    def _online(self, profile: Profile) -> OnlineTimingModel:
        """Return an online-refit ETE seeded with a profile's measurements."""
        online = OnlineTimingModel(profile.timing_model(), self.config.ete_window,
                                   self.config.ete_forgetting)
        online.seed([tuple(p) for p in profile.prefill_points],
                    [tuple(p) for p in profile.decode_points])
        return online

    def _use_profile(self, profile: Profile | None) -> None:
        self.early_exit = self._early_exit_from(profile) \
            if profile is not None and self._exit_rule is not None else None
        self.engine.exit_decoder = LayerwiseDecoder(
            self.loaded, self.early_exit.rule, self.early_exit.layer_times,
            heads=self._exit_heads) if self.early_exit is not None else None
        if profile is None:
            self.online = None
            self.planner = FullModelPlanner()
            self.limits = self.config.limits()
            self.get_logger().warning('no execution-time profile: MODE_EVICTION unavailable')
            return
        self.online = self._online(profile)
        precisions = {precision: (lambda online=online: online.model)
                      for precision, online in self.online_variants.items()}
        self.planner = TimeBillPlanner(lambda: self.online.model, self.predictor,
                                       self.config.alpha_max, self.config.press,
                                       self.config.infeasible, self.config.time_margin,
                                       self.early_exit, self.config.tpot_jitter,
                                       self.config.plan_quantile,
                                       self.config.admit_probability,
                                       self.config.min_cut_saving,
                                       self.config.auto_early_exit, precisions,
                                       self.effects)
        modes = {Mode.AUTO, Mode.NONE, Mode.EVICTION}
        self.limits = self.config.limits(
            modes | {Mode.EARLY_EXIT} if self.early_exit is not None else modes)

    def _on_calibrate(self, request, response):
        try:
            profile = self._calibrate(request.quick)
        except Exception as exc:  # noqa: BLE001 - report any failure to the caller
            response.success, response.message = False, f'calibration failed: {exc!r}'
            return response
        self._use_profile(profile)
        response.success, response.message = True, 'calibrated'
        response.profile_path = str(self.profile_path)
        response.prefill_mape_pct = profile.heldout['prefill_mape_pct']
        response.decode_mape_pct = profile.heldout['decode_mape_pct']
        return response

    def _learn_timing(self, job: Job, result: JobResult) -> tuple:
        """Compare the ETE with what ran, then refit it online; return (estimate, error %)."""
        if self.online is None or result.prefill_s <= 0.0:
            return 0.0, 0.0
        model = self.online.model
        n_x = len(job.prompt_ids)
        if result.plan.mode == Mode.EARLY_EXIT:
            # Exited steps are shorter than the decode model's full-depth steps: keep
            # them out of its fit (and out of the ETE error); the prefill still counts.
            self.online.observe(n_x, result.prefill_s, result.kv_tokens, ())
            return 0.0, 0.0
        switched = self.online_variants.get(result.switched_to)
        if switched is not None and result.switched_at >= 0:
            # Full-precision steps up to the switch, the fallback precision's after it.
            at, steps = result.switched_at, result.step_times
            estimate = model.prefill(n_x) + model.decode(result.kv_tokens, at + 1) + \
                switched.model.decode(result.kv_tokens + at, result.tokens - at)
            self.online.observe(n_x, result.prefill_s, result.kv_tokens, steps[:at])
            switched.observe(n_x, 0.0, result.kv_tokens + at, steps[at:])
            actual = result.prefill_s + result.decode_s
            return estimate, (estimate - actual) / actual * 100.0
        variant = self.online_variants.get(result.plan.precision)
        if variant is not None:
            # Prefill ran at full precision, the decode steps on the variant.
            estimate = model.prefill(n_x) + variant.model.decode(result.kv_tokens,
                                                                 result.tokens)
            self.online.observe(n_x, result.prefill_s, result.kv_tokens, ())
            variant.observe(n_x, 0.0, result.kv_tokens, result.step_times)
        else:
            estimate = model.prefill(n_x) + model.decode(result.kv_tokens, result.tokens)
            self.online.observe(n_x, result.prefill_s, result.kv_tokens, result.step_times)
        actual = result.prefill_s + result.decode_s
        return estimate, (estimate - actual) / actual * 100.0

    def _action_name(self) -> str:
        return self.resolve_topic_name('~/instruct')

    # -- admission --------------------------------------------------------------------

    def _admit(self, spec, key: str, will_run: bool = True) -> Job:
        """Validate, tokenize and plan a goal; raise Rejection with the reason.

        A goal that will run and whose length is predicted during its prefill is
        admitted on the plan for a 1-token answer (rejected only if even that
        misses); the ~/plan service (``will_run`` False) predicts now.
        """
        accepted_at = time.monotonic()  # the budget counts from arrival, validation included
        request = validate(spec, self.limits)
        clock = DeadlineClock(accepted_at, request.budget_s)
        ids = prompt_ids(self.loaded.tokenizer, request.instruction, request.context,
                         lock=self.loaded.tokenizer_lock)
        check_prompt_fits(len(ids), self.loaded.context_window)
        if will_run and self._predict_in_prefill(request):
            plan = self.planner.plan(request, len(ids), clock.remaining(), pending=True)
        else:
            plan = self.planner.plan(request, len(ids), clock.remaining())
        return Job(key=key, request=request, prompt_ids=ids, clock=clock, plan=plan)

    def _predict_in_prefill(self, request) -> bool:
        """Say whether this goal's length comes from its own prefill's hidden states."""
        return (self.config.length_predictor_in_prefill and request.expected_tokens <= 0
                and isinstance(self.planner, TimeBillPlanner)
                and getattr(self.predictor, 'prefill_layer', 0) > 0)

    def _check_room(self) -> None:
        """Raise Rejection when no goal can wait (lock held)."""
        waiting = len(self._queue) + len(self._pending)
        if waiting >= self._queue.capacity:
            raise Rejection(
                f'queue full ({waiting} goals waiting, queue_length {self._queue.capacity})')

    def _reject(self, key: str, reason: str, plan: Plan | None = None) -> None:
        with self._lock:
            self.telemetry.rejected()
            if plan is not None and not plan.feasible:
                self.telemetry.deadline_rejection(plan.fit_probability)
        self.get_logger().warning(f'rejected {key}: {reason}')
        rejected = JobResult(outcome=Outcome.REJECTED, deadline_met=False, reason=reason)
        self._responses.publish(convert.response_msg(key, rejected, self._stamp()))

    def _on_goal(self, goal) -> GoalResponse:
        key = self._action.goal_uuid(goal)
        try:
            job = self._admit(convert.spec_from(goal), key)
            with self._lock:
                self._check_room()
                self._pending[key] = job
        except Rejection as exc:
            self._reject(key, exc.reason, exc.plan)
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_accepted(self, goal_handle) -> None:
        key = bytes(goal_handle.goal_id.uuid).hex()
        with self._lock:
            job = self._pending.pop(key)
            job.goal_handle = goal_handle
            self._jobs[key] = job
            self._enqueue(job)

    def _on_instruction(self, msg: Instruction) -> None:
        key = msg.id or f'instruction-{msg.header.stamp.sec}.{msg.header.stamp.nanosec:09d}'
        try:
            job = self._admit(convert.spec_from(msg, key), key)
            with self._lock:
                self._check_room()
                self._enqueue(job)
        except Rejection as exc:
            self._reject(key, exc.reason, exc.plan)

    def _enqueue(self, job: Job) -> None:
        """Queue an admitted job (lock held)."""
        self._queue.push(job)
        self.telemetry.accepted()
        self._work.notify()

    def _on_plan(self, request, response):
        try:
            job = self._admit(convert.spec_from(request), 'plan-request', will_run=False)
            with self._lock:
                self._check_room()
        except Rejection as exc:
            response.accepted, response.reason = False, exc.reason
            return response
        response.accepted = True
        response.reason = (f'would be accepted (P(answer fits) = '
                           f'{job.plan.fit_probability:.0%})')
        response.plan = convert.plan_to_msg(job.plan)
        return response

    def _on_cancel(self, goal_handle) -> CancelResponse:
        key = bytes(goal_handle.goal_id.uuid).hex()
        with self._lock:
            job = self._jobs.get(key)
            queued = job is not None and self._queue.remove(job)
        if queued:
            # Not started: end it now rather than when the model frees up.
            self._finish(job, ended_before_start(job.clock, Outcome.CANCELED,
                                                 'canceled while queued', job.plan))
            goal_handle.execute()
        return CancelResponse.ACCEPT

    # -- execution --------------------------------------------------------------------

    def _work_loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and len(self._queue) == 0:
                    self._work.wait(WORKER_POLL_S)
                if self._stopping:
                    return
                job = self._queue.pop()
                skip_reason = self._skip.take()
                self._running = job
            try:
                with self._model_lock:
                    result = self._run(job, skip_reason)
            except Exception as exc:  # noqa: BLE001 - the worker must survive any goal
                self.get_logger().error(f'goal {job.key} failed: {exc!r}')
                result = ended_before_start(job.clock, Outcome.FAILED,
                                            f'internal error: {exc!r}', job.plan)
            with self._lock:
                self._running = None
                self._skip.record(job.request.policy, result.outcome, result.deadline_met,
                                  job.key, len(self._queue))
            self._finish(job, result)

    def _run(self, job: Job, skip_reason: str) -> JobResult:
        if job.goal_handle is not None:
            job.goal_handle.execute()
        if skip_reason:
            return ended_before_start(job.clock, Outcome.SKIPPED, skip_reason, job.plan)
        request, n_prompt = job.request, len(job.prompt_ids)
        if self._predict_in_prefill(request):
            left = job.clock.remaining()  # at the start of prefill, which the plan covers
            predictor = self.predictor

            def plan_from(hidden) -> Plan:
                return self.planner.plan(request, n_prompt, left,
                                         predictor.predict_from_hidden(hidden, request))
            return run_job(self.engine, job.prompt_ids, request, job.plan, job.clock,
                           job.cancel_requested, self._feedback_sender(job),
                           PrefillDecision(predictor.prefill_layer, plan_from))
        try:
            # Re-plan with the time actually left after queueing.
            plan = self.planner.plan(request, n_prompt, job.clock.remaining(),
                                     job.plan.predicted_tokens or None)
        except Rejection as exc:
            return ended_before_start(job.clock, Outcome.REJECTED,
                                      f'after {job.clock.elapsed():.3f} s in queue: {exc.reason}',
                                      job.plan)
        return run_job(self.engine, job.prompt_ids, request, plan, job.clock,
                       job.cancel_requested, self._feedback_sender(job))

    def _feedback_sender(self, job: Job):
        if job.goal_handle is None:
            return lambda event, elapsed, remaining, plan: None

        def send(event, elapsed, remaining, plan):
            job.goal_handle.publish_feedback(
                convert.feedback_msg(event, elapsed, remaining, plan))
        return send

    def _finish(self, job: Job, result: JobResult) -> None:
        """Record, publish and hand a finished job's result to its action goal."""
        estimate, error = self._learn_timing(job, result)
        with self._lock:
            self.telemetry.finished(GoalRecord(result.outcome, result.deadline_met,
                                               result.e2e_s, result.step_times))
            if estimate:
                self.telemetry.ete_error(error)
            if result.outcome == Outcome.REJECTED and not result.plan.feasible:
                self.telemetry.deadline_rejection(result.plan.fit_probability)
            if result.outcome == Outcome.COMPLETED and result.plan.predicted_tokens:
                # Only finished answers have a true length (a killed one was cut short).
                self.telemetry.length_error(result.plan.predicted_tokens, result.tokens)
        stamp = self._stamp()
        telemetry = convert.telemetry_msg(job.key, job.request.request_id or job.key,
                                          job.request.policy, job.request.budget_s, result,
                                          stamp)
        telemetry.est_compute_s, telemetry.ete_error_pct = estimate, error
        if result.plan.token_deadline_s > 0 and result.step_times:
            with self._lock:
                self._last_utilisation = telemetry.utilisation
        self._telemetry_pub.publish(telemetry)
        self._responses.publish(convert.response_msg(
            job.request.request_id or job.key, result, stamp))
        self.get_logger().info(
            f'{job.key[:8]} {result.outcome.name} deadline_met={result.deadline_met} '
            f'tokens={result.tokens} e2e={result.e2e_s:.3f}s budget={job.request.budget_s:g}s')
        job.result = result
        job.done.set()

    def _execute(self, goal_handle):
        key = bytes(goal_handle.goal_id.uuid).hex()
        job = self._jobs[key]
        while not job.done.wait(WORKER_POLL_S):
            if not rclpy.ok():
                goal_handle.abort()
                return Instruct.Result(outcome=int(Outcome.FAILED), reason='node shutting down')
        with self._lock:
            self._jobs.pop(key, None)
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

    def _stamp(self):
        return self.get_clock().now().to_msg()

    def _publish_diagnostics(self) -> None:
        with self._lock:
            summary = self.telemetry.summary()
            queued = len(self._queue)
            running = self._running is not None
        extra = {'queue_length': queued, 'executing': running, 'model': self.loaded.name,
                 'device': self.loaded.device, 'dtype': self.loaded.dtype,
                 'planner': type(self.planner).__name__,
                 'auto_precision': ','.join(self.online_variants),
                 # P99 TPOT / per-token deadline of the last goal that had one.
                 'utilisation_last': self._last_utilisation,
                 'early_exit_layers': ','.join(map(str, self.early_exit.rule.exit_layers))
                 if self.early_exit else ''}
        if self.online is not None:
            model = self.online.model
            extra.update({'ete_step_s_per_kv_token': model.p, 'ete_step_base_s': model.q,
                          # measured / fitted time per phase: > 1 means slower than calibrated
                          'ete_drift_prefill': round(self.online.drift_prefill, 4),
                          'ete_drift_decode': round(self.online.drift_decode, 4)})
        status = build_status(f'{self.get_name()}: deadlines', self.hardware_id, summary,
                              extra, self.config.thresholds())
        self._diagnostics.publish(build_array(status, self._stamp()))

    def stop(self) -> None:
        """Stop the worker thread."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
        self._worker.join(timeout=5.0)


def main(args=None) -> int:
    """Run the node until interrupted; exit non-zero if the model cannot be loaded."""
    rclpy.init(args=args)
    try:
        node = TimebillNode()
    except (ModelLoadError, ValueError) as exc:
        print(f'timebill: cannot start: {exc}', file=sys.stderr)
        rclpy.try_shutdown()
        return 1
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.stop()
        executor.shutdown(timeout_sec=2.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
