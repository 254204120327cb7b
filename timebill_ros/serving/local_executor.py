# SPDX-License-Identifier: Apache-2.0
"""The local engines executor: one loaded model, its engine options, dispatch and the loop.

ROS-free. Behind the one Server (serving/server.py): admission (serving/admission.py)
tokenizes a goal, chooses its answer length and plans it against the queue and the
batch; dispatch (serving/dispatch.py) orders the queue and runs THE decode loop
(serving/loop.py) on the worker thread; learning refits the ETEs from what ran.
"""

from __future__ import annotations

from dataclasses import replace
import threading

from timebill_ros.core.planner_settings import PlannerSettings
from timebill_ros.core.profile import Profile
from timebill_ros.runtime.grammar import GrammarLibrary
from timebill_ros.runtime.model import on_own_thread
from timebill_ros.serving.admission import Admission
from timebill_ros.serving.assembly import Assembly, Pipeline
from timebill_ros.serving.dispatch import Dispatch
from timebill_ros.serving.learning import learn_timing
from timebill_ros.serving.server import Server
from timebill_ros.serving.warmup import OWN, Warmup


class LocalExecutor:
    """Run goals on the loaded model's engine options (the Executor of local serving)."""

    kind = 'local engines'

    def __init__(self, assembly: Assembly, scheduler: str = ''):
        """Build the first pipeline (profiles, calibration); the worker starts at ``attach``.

        ``scheduler`` overrides the configured one (``config.scheduler``).
        """
        self.assembly, self.config, self.log = assembly, assembly.config, assembly.log
        self.loaded, self.predictor = assembly.loaded, assembly.predictor
        self.dtype = self.loaded.dtype
        self._scheduler = scheduler or self.config.scheduler
        # The options' profiles: the fastest measured before serving, the rest while idle.
        self.warmup = Warmup(assembly)
        self.pipeline: Pipeline = self.warmup.start()
        self.admission = Admission(self)
        self.lifecycle = None
        self.dispatch: Dispatch | None = None
        # llguidance's view of the tokenizer takes ~1.5 s: part of the warm-up, so the
        # first schema goal does not pay it inside its deadline (else built on first use).
        self._grammars, self._grammars_lock = None, threading.Lock()
        if self.config.warm_up:
            self._grammars = GrammarLibrary(self.loaded.tokenizer, self.loaded.eos_ids)

    def attach(self, lifecycle) -> None:
        """Serve for ``lifecycle`` (the Server): start the worker and the expiry watch."""
        self.lifecycle = lifecycle
        self.dispatch = Dispatch(self, lifecycle, self._scheduler, self.config.queue_length)

    @property
    def learning(self):
        """Return what the server learns from: recent answer lengths, telemetry."""
        return self.lifecycle.learning

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
    def profile_path(self):
        """Return where this machine's profile is kept."""
        return self.assembly.profile_path

    # -- the Executor interface -------------------------------------------------------------

    def limits(self):
        """Return the goal limits of the pipeline in force."""
        return self.pipeline.limits

    def prepare(self, request, clock, key: str):
        """Tokenize the goal and choose its answer length (serving/admission.py)."""
        return self.admission.prepare(request, clock, key)

    def plan(self, job) -> None:
        """Plan the goal against the queue and the batch (lock held); raise Rejection."""
        self.admission.plan(job)

    def preview(self, job) -> None:
        """Show a dry run the plan its prefill would make."""
        self.admission.preview(job)

    def enqueue(self, job) -> None:
        """Queue the goal for the worker (lock held); it counts as a recent arrival."""
        self.admission.share.arrived(job)
        self.dispatch.enqueue(job)

    def unqueue(self, job) -> bool:
        """Take the goal out of the queue if it still waits (lock held)."""
        return self.dispatch.unqueue(job)

    def drain(self) -> list:
        """Take every waiting goal out of the queue (lock held)."""
        return self.dispatch.drain()

    def queued(self) -> int:
        """Count the goals in the queue; the lock is held."""
        return len(self.dispatch.queue)

    def learn(self, job, result) -> tuple:
        """Refit the ETEs from what ran; return (estimate s, error % or None)."""
        estimate, error = learn_timing(self.pipeline, job, result)
        return estimate, (error if estimate else None)

    def reconfigure(self, config) -> None:
        """Put new live parameters in force: planner settings, limits, queue order (lock held).

        A goal already admitted keeps the plan it was given.
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
        profile = on_own_thread(  # leaves no OpenMP team on the caller's thread
            self.assembly.recalibrate, quick)
        self.warmup.profiled(OWN, profile)
        self.pipeline = self.warmup.pipeline()  # one reference swap: running goals keep theirs
        return profile

    def idle_work(self) -> bool:
        """Tell whether options are still to be profiled (the worker does it while idle)."""
        return bool(self.warmup.pending)

    def idle_step(self, goal_waits) -> None:
        """Measure one profiling point (worker thread, model lock held); swap in new plans."""
        pipeline = self.warmup.step(goal_waits)
        if pipeline is not None:
            self.pipeline = pipeline  # one reference swap: running goals keep theirs

    def status(self) -> dict:
        """Return the planner's, the ETEs', the prefix cache's and the batch's facts."""
        pipeline, planner = self.pipeline, self.pipeline.planner
        extra = {**self.warmup.status(), 'last_precision': self.learning.last_precision,
                 'planner': type(planner).__name__,
                 'auto_precision': ','.join(pipeline.online_variants),
                 'precision_mix': f'{planner.mix.table.units} units'
                 if getattr(planner, 'mix', None) else 'off',
                 'early_exit_layers': ','.join(map(str, pipeline.early_exit.rule.exit_layers))
                 if pipeline.early_exit else ''}
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
        return extra

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the worker thread (the running goals end first)."""
        self.dispatch.stop(timeout_s)


def _ratios(errors) -> str:
    """Return an ETE's recent measured/estimated ratios at its quantiles, for diagnostics."""
    points = errors.points()
    return ' '.join(f'{x:.2f}' for x in points) if points else f'{len(errors)} goals measured'


def local_server(assembly: Assembly, on_finished, scheduler: str = ''):
    """Return the one Server over the local engines of ``assembly``."""
    return Server(LocalExecutor(assembly, scheduler), assembly.config, assembly.log,
                  on_finished)
