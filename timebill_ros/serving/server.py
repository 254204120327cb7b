"""The serving core: one model's admission, dispatch, decode loop and learning, composed.

ROS-free: the node (ros/node.py) turns messages into ``admit``/``start``/``submit``
calls and publishes what ``on_finished`` hands back. Each job lives in one module:
admission (validate, predict, plan once), dispatch (queue, worker, Skip-Next), the
decode loop (serving/loop.py) and learning (online ETE, telemetry).
"""

from __future__ import annotations

from dataclasses import replace
import threading
from typing import Callable

from timebill_ros.core.execution import JobResult
from timebill_ros.core.planner_settings import PlannerSettings
from timebill_ros.core.profile import Profile
from timebill_ros.runtime.grammar import GrammarLibrary
from timebill_ros.runtime.model import on_own_thread
from timebill_ros.serving.admission import Admission
from timebill_ros.serving.assembly import Assembly, Pipeline
from timebill_ros.serving.dispatch import Dispatch
from timebill_ros.serving.jobs import Job, JobHooks
from timebill_ros.serving.learning import Learning

# (job, result, ETE estimate s, ETE error %): called once per finished job, any thread.
Finished = Callable[[Job, JobResult, float, float], None]


class Server:
    """Serve goals on one loaded model: the facade the node calls."""

    def __init__(self, assembly: Assembly, on_finished: Finished, scheduler: str = ''):
        """Build the first pipeline (profiles, calibration) and start the worker thread.

        ``scheduler`` overrides the configured one (``config.scheduler``).
        """
        self.assembly, self.config, self.log = assembly, assembly.config, assembly.log
        self.loaded, self.predictor = assembly.loaded, assembly.predictor
        self.on_finished = on_finished
        self.pipeline: Pipeline = assembly.start()
        self.learning = Learning(self.config.miss_window, self.loaded.dtype)
        self.admission = Admission(self)
        self.dispatch = Dispatch(self, scheduler or self.config.scheduler,
                                 self.config.queue_length, self._finish)
        # llguidance's view of the tokenizer takes ~1.5 s: part of the warm-up, so the
        # first schema goal does not pay it inside its deadline (else built on first use).
        self._grammars, self._grammars_lock = None, threading.Lock()
        if self.config.warm_up:
            self._grammars = GrammarLibrary(self.loaded.tokenizer, self.loaded.eos_ids)

    @property
    def grammars(self) -> GrammarLibrary:
        """Return the grammar library, built once."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarLibrary(self.loaded.tokenizer, self.loaded.eos_ids)
            return self._grammars

    @property
    def scheduler(self) -> str:
        """Return the name of the queue's ordering."""
        return self.dispatch.queue.name

    @property
    def telemetry(self):
        """Return the deadline telemetry."""
        return self.learning.telemetry

    def admit(self, spec, key: str) -> Job:
        """Validate and plan a goal once and reserve its place; raise Rejection with why."""
        return self.admission.admit(spec, key, reserve=True)

    def dry_run(self, spec) -> Job:
        """Return the job ``admit`` would accept now (the ~/plan service), reserving nothing."""
        return self.admission.admit(spec, 'plan-request', reserve=False)

    def start(self, key: str, hooks: JobHooks) -> Job:
        """Queue an admitted job with its caller's hooks; it is kept until ``forget``."""
        return self.dispatch.start(key, hooks, keep=True)

    def submit(self, job: Job, hooks: JobHooks = JobHooks()) -> None:
        """Queue an admitted job at once; it is dropped when it ends (topics, tests)."""
        self.dispatch.start(job.key, hooks, keep=False)

    def rejected(self, plan) -> None:
        """Count a goal refused at admission."""
        self.learning.rejected(plan)

    def job(self, key: str) -> Job | None:
        """Return a queued, running or uncollected job."""
        return self.dispatch.job(key)

    def forget(self, key: str) -> None:
        """Drop a finished job whose result was delivered."""
        self.dispatch.forget(key)

    def cancel(self, key: str) -> bool:
        """End a job now if it is still queued; return whether it was."""
        return self.dispatch.cancel(key)

    def _finish(self, job: Job, result: JobResult) -> None:
        """Learn from, count and hand over a finished job's result (always delivered)."""
        estimate, error = 0.0, 0.0
        try:
            estimate, error = self.learning.finished(self.pipeline, job, result)
        except Exception as exc:  # noqa: BLE001 - learning must never withhold a result
            self.log.error(f'learning from goal {job.key} failed: {exc!r}')
        try:
            self.on_finished(job, result, estimate, error)
        finally:
            job.result = result
            job.done.set()
            if not job.keep:  # nobody collects it (a topic goal, a test): drop it now
                self.dispatch.forget(job.key)

    # -- profiles, live parameters, status, shutdown --------------------------------------

    def reconfigure(self, config) -> None:
        """Put a new configuration in force for goals admitted from now on.

        Only the live parameters (core.config.LIVE) may differ from the running one: the
        planner's settings, the goal limits, the queue's order and bound. A goal already
        admitted keeps the plan it was given.
        """
        self.config = self.assembly.config = config
        pipeline = self.pipeline
        limits = pipeline.limits
        planner = pipeline.planner
        if hasattr(planner, 'settings'):
            planner.settings = PlannerSettings.from_config(config)
        self.pipeline = replace(pipeline, limits=config.limits(
            limits.supported_modes, limits.precisions))  # one reference swap
        self.dispatch.reorder(config.scheduler, config.queue_length)

    def recalibrate(self, quick: bool) -> Profile:
        """Calibrate the model again and swap in the pipeline built on the new profile."""
        profile, pipeline = on_own_thread(  # leaves no OpenMP team on the caller's thread
            self.assembly.recalibrate, quick, self.pipeline.online_variants)
        self.pipeline = pipeline  # one reference swap: a running goal keeps its own
        return profile

    def status(self) -> tuple:
        """Return (telemetry summary, facts for diagnostics)."""
        pipeline, dispatch = self.pipeline, self.dispatch
        summary = self.learning.summary()
        with dispatch.lock:
            extra = {'queue_length': len(dispatch.queue), 'executing': len(dispatch.running)}
        planner = pipeline.planner
        extra.update({'scheduler': self.scheduler, 'last_precision': self.learning.last_precision,
                      'planner': type(planner).__name__,
                      'auto_precision': ','.join(pipeline.online_variants),
                      'precision_mix': f'{planner.mix.table.units} units'
                      if getattr(planner, 'mix', None) else 'off',
                      'early_exit_layers': ','.join(map(str, pipeline.early_exit.rule.exit_layers))
                      if pipeline.early_exit else ''})
        if pipeline.online is not None:
            model = pipeline.online.model
            extra.update({'ete_step_s_per_kv_token': model.p, 'ete_step_base_s': model.q,
                          # measured / fitted time per phase: > 1 means slower than calibrated
                          'ete_drift_prefill': round(pipeline.online.drift_prefill, 4),
                          'ete_drift_decode': round(pipeline.online.drift_decode, 4),
                          # the planner's P(fit) counts these (count_time_errors)
                          'ete_error_ratios_q10_q90': _ratios(pipeline.online.errors)})
            for option, ete in pipeline.online_engines.items():
                extra[f'ete_error_ratios_q10_q90_{option}'] = _ratios(ete.errors)
        prefixes = self.assembly.prefix_cache
        if prefixes is not None:
            extra.update({'prefix_cache_blocks': len(prefixes),
                          'prefix_cache_mb': round(prefixes.bytes / 2 ** 20, 1),
                          'prefix_cache_hits': prefixes.hits,
                          'prefix_cache_misses': prefixes.misses})
        if pipeline.batch is not None:
            extra.update({'max_batch': pipeline.max_batch,
                          'ete_batch_drift': round(pipeline.batch.model.drift, 4),
                          'ete_batch_step_mape_pct': round(pipeline.batch.mape(), 2)})
        return summary, extra

    def close(self, reason: str) -> int:
        """Stop taking goals: refuse new ones, end the queued ones, stop the running ones.

        Every goal gets a result saying ``reason``: queued and held goals end now
        (FAILED), a running goal stops at its next token (FAILED, partial text kept).
        Return how many goals were queued.
        """
        return self.dispatch.close(reason)

    def settled(self) -> bool:
        """Tell whether no goal runs, waits or has a result left to collect."""
        return self.dispatch.settled()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the worker thread (the running goal ends first)."""
        self.dispatch.stop(timeout_s)


def _ratios(errors) -> str:
    """Return an ETE's recent measured/estimated ratios at its quantiles, for diagnostics."""
    points = errors.points()
    return ' '.join(f'{x:.2f}' for x in points) if points else f'{len(errors)} goals measured'
