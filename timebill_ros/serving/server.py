# SPDX-License-Identifier: Apache-2.0
"""The one server: every goal's lifecycle, whatever executor runs it.

ROS-free: the node (ros/interfaces.py) turns messages into ``admit``/``start``/``submit``
calls and publishes what ``on_finished`` hands back. The server validates a goal,
starts its deadline clock, holds its place, keeps the job table, applies the one
Skip-Next rule, builds each run (core.execution.JobRun: Kill and cancel at every token),
delivers each result exactly once with its telemetry, and closes. The executor
(serving/executor.py) plans the goal on its resources and runs it: the local engines
(serving/local_executor.py) or the replica pool (serving/replica_executor.py).
"""

from __future__ import annotations

from dataclasses import replace
import threading
import time
from typing import Callable

from timebill_ros.core.deadline import DeadlineClock, overran, SkipNext
from timebill_ros.core.execution import ended_before_start, JobResult, JobRun
from timebill_ros.core.request import Outcome, Rejection, validate
from timebill_ros.serving.executor import Executor
from timebill_ros.serving.jobs import Job, JobHooks
from timebill_ros.serving.learning import Learning

# (job, result, ETE estimate s, ETE error %): called once per finished job, any thread.
Finished = Callable[[Job, JobResult, float, float], None]
# A refusal says what admission itself cost once it took this long.
ADMISSION_WORDS_S = 0.1


class Server:
    """Serve goals through one executor: the facade the node calls."""

    def __init__(self, executor: Executor, config, log, on_finished: Finished):
        """Own the job table and telemetry; start the executor for this server."""
        self.executor, self.config, self.log = executor, config, log
        self.on_finished = on_finished
        self.learning = Learning(config.miss_window, executor.dtype)
        self.lock = threading.Lock()
        self.held: dict = {}  # admitted, place reserved, not yet started
        self.jobs: dict = {}  # started: queued, running, or ended and not yet collected
        self.running: dict = {}  # key -> (job, dispatched at), not yet ended
        self.closing = ''  # why no goal is taken any more (a shutdown), '' while serving
        self._skip = SkipNext()
        executor.attach(self)

    @property
    def scheduler(self) -> str:
        """Return the name of the order goals run in."""
        return self.executor.scheduler

    @property
    def telemetry(self):
        """Return the deadline telemetry."""
        return self.learning.telemetry

    # -- admission ------------------------------------------------------------------------

    def admit(self, spec, key: str, reserve: bool = True) -> Job:
        """Validate and plan a goal once and reserve its place; raise Rejection with why.

        The budget counts from arrival: validation, tokenizing and the length choice
        spend it. With ``reserve`` the goal holds a place until ``start``.
        """
        accepted_at = time.monotonic()
        if self.closing:
            raise Rejection(f'not accepting goals: {self.closing}')
        request = validate(spec, self.executor.limits())
        clock = DeadlineClock(accepted_at, request.budget_s)
        try:
            job = self.executor.prepare(request, clock, key)  # outside the lock
            with self.lock:
                if self.closing:
                    raise Rejection(f'not accepting goals: {self.closing}')
                self.executor.plan(job)
                if reserve:
                    self.held[key] = job
        except Rejection as refused:
            spent = clock.elapsed()
            if spent < ADMISSION_WORDS_S:
                raise
            # Say where the budget went: the node's own work, not the engines.
            raise Rejection(f'{refused.reason}; admission itself took {spent:.3f} s of the '
                            'budget (tokenizing and the length prediction)',
                            refused.plan) from None
        if not reserve:
            self.executor.preview(job)
        return job

    def dry_run(self, spec) -> Job:
        """Return the job ``admit`` would accept now (the ~/plan service), reserving nothing."""
        return self.admit(spec, 'plan-request', reserve=False)

    def rejected(self, plan) -> None:
        """Count a goal refused at admission."""
        self.learning.rejected(plan)

    # -- the job table --------------------------------------------------------------------

    def start(self, key: str, hooks: JobHooks) -> Job:
        """Queue an admitted job with its caller's hooks; it is kept until ``forget``."""
        return self._start(key, hooks, keep=True)

    def submit(self, job: Job, hooks: JobHooks = JobHooks()) -> None:
        """Queue an admitted job at once; it is dropped when it ends (topics, tests)."""
        self._start(job.key, hooks, keep=False)

    def _start(self, key: str, hooks: JobHooks, keep: bool) -> Job:
        """Hand a held job to the executor; one held while closing ends at once (FAILED)."""
        with self.lock:
            job = self.held.pop(key)
            job.hooks, job.keep = hooks, keep
            self.jobs[key] = job
            closing = self.closing
            if not closing:
                self.learning.accepted()
                self.executor.enqueue(job)
        if closing:
            hooks.on_start()
            self.finish(job, ended_before_start(job.clock, Outcome.FAILED,
                                                f'{closing} before it started', job.plan))
        return job

    def job(self, key: str) -> Job | None:
        """Return a queued, running or uncollected job."""
        with self.lock:
            return self.jobs.get(key)

    def forget(self, key: str) -> None:
        """Drop a finished job whose result was delivered."""
        with self.lock:
            self.jobs.pop(key, None)

    def cancel(self, key: str) -> bool:
        """End a job now if it is still queued; return whether it was.

        A running job sees its caller's cancel request at its next token.
        """
        with self.lock:
            job = self.jobs.get(key)
            queued = job is not None and self.executor.unqueue(job)
        if queued:
            job.hooks.on_start()
            self.finish(job, ended_before_start(job.clock, Outcome.CANCELED,
                                                'canceled while queued', job.plan))
        return queued

    # -- the lifecycle the executors call -------------------------------------------------

    def dispatched(self, job: Job) -> str:
        """Mark a job leaving the queue to run (lock held); return why it is skipped.

        Skip-Next skips the job dispatched next after an overrun, whatever the order.
        """
        job.stop_requested = lambda: bool(self.closing) or job.cancel_requested()
        self.running[job.key] = (job, time.monotonic())
        skip = self._skip.take()
        if skip:
            self.log.info(f'goal {job.key[:8]} dispatched: {skip}')
        return skip

    def begin(self, job: Job, skip: str) -> JobRun | None:
        """Start a dispatched job's run; end it now when skipped, canceled or expired.

        Return its run (Kill, cancel and the Skip-Next overrun at each token), or None
        when it ended here.
        """
        if skip:
            self.finish(job, ended_before_start(job.clock, Outcome.SKIPPED, skip, job.plan))
            return None
        run = JobRun(job.request, job.plan, job.clock, job.stop_requested,
                     job.hooks.on_feedback, on_overrun=lambda: self._overran(job.key))
        ended = run.before_start()
        if ended is not None:
            self.finish(job, ended)
            return None
        return run

    def _overran(self, key: str) -> None:
        with self.lock:
            self._skip.overran(key)
        self.log.info(f'goal {key[:8]} runs past its deadline (Skip-Next): the next goal '
                      'dispatched gives its turn up')

    def finish(self, job: Job, result: JobResult) -> None:
        """Learn from, count and hand over a finished job's result (always delivered)."""
        if self.closing and result.outcome == Outcome.CANCELED and not job.cancel_requested():
            # Stopped by the shutdown, not by its caller: say so.
            result = replace(result, outcome=Outcome.FAILED, deadline_met=False, reason=(
                f'{self.closing}: stopped after {result.tokens} tokens; text is partial'))
        estimate, error = 0.0, None
        try:
            estimate, error = self.executor.learn(job, result)
            self.learning.count(job, result, error)
        except Exception as exc:  # noqa: BLE001 - learning must never withhold a result
            self.log.error(f'learning from goal {job.key} failed: {exc!r}')
        with self.lock:
            self.running.pop(job.key, None)
            self._skip.ended(job.key, overran(job.request.policy, result.outcome,
                                              result.deadline_met),
                             self.executor.queued() + len(self.held))
        try:
            self.on_finished(job, result, estimate, error or 0.0)
        finally:
            job.result = result
            job.done.set()
            if not job.keep:  # nobody collects it (a topic goal, a test): drop it now
                self.forget(job.key)

    # -- live parameters, status, shutdown -------------------------------------------------

    def reconfigure(self, config) -> None:
        """Put a new configuration in force for goals admitted from now on.

        Only the live parameters (core.config.LIVE) may differ from the running one. A
        goal already admitted keeps the plan it was given.
        """
        self.config = config
        with self.lock:
            self.executor.reconfigure(config)

    def recalibrate(self, quick: bool):
        """Calibrate the executor again; return its new profile."""
        return self.executor.recalibrate(quick)

    def status(self) -> tuple:
        """Return (telemetry summary, facts for diagnostics)."""
        with self.lock:
            extra = {'queue_length': self.executor.queued(), 'executing': len(self.running),
                     'scheduler': self.scheduler, 'executor': self.executor.kind}
        extra.update(self.executor.status())
        return self.learning.summary(), extra

    def close(self, reason: str) -> int:
        """Stop taking goals: refuse new ones, end the queued ones, stop the running ones.

        Every goal gets a result saying ``reason``: queued goals end now (FAILED), a
        running goal stops at its next token (FAILED, partial text kept). Return how
        many goals were queued.
        """
        with self.lock:
            self.closing = reason or 'the node is shutting down'
            queued = self.executor.drain()
        for job in queued:
            job.hooks.on_start()
            self.finish(job, ended_before_start(job.clock, Outcome.FAILED,
                                                f'{self.closing} before it started', job.plan))
        return len(queued)

    def settled(self) -> bool:
        """Tell whether no goal runs, waits or has a result left to collect."""
        with self.lock:
            return not (self.running or self.held or self.jobs or self.executor.queued())

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the executor (running goals end first, locally)."""
        self.executor.stop(timeout_s)
