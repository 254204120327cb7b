"""Dispatch: the queue under its scheduler, the worker thread, Skip-Next, cancel and shutdown.

One worker thread owns the model: it takes the next goal and runs it in the decode
loop (serving/loop.py), which takes further goals in at token boundaries while it
has room (``max_batch``), or a goal that overtakes a long prefill. An expiry watch
ends queued Kill goals at their deadlines. Everything else touches only the queue,
under one lock, with timed waits.
"""

from __future__ import annotations

from dataclasses import replace
import math
import threading
import time
from typing import Callable

from timebill_ros.core.deadline import SkipNextTracker
from timebill_ros.core.execution import ended_before_start, JobResult, JobRun
from timebill_ros.core.request import Outcome, OverrunPolicy, Rejection
from timebill_ros.core.scheduling import make_scheduler
from timebill_ros.runtime.choosing import TokenChooser
from timebill_ros.serving.jobs import Job, JobHooks
from timebill_ros.serving.loop import DecodeLoop, Member

WORKER_POLL_S = 0.2
EXPIRY_POLL_S = 1.0  # the expiry watch also wakes when a goal is queued


class Dispatch:
    """Hold admitted goals, order them, and run them on the worker thread."""

    def __init__(self, server, scheduler: str, capacity: int,
                 finish: Callable[[Job, JobResult], None]):
        """Queue up to ``capacity`` goals under ``scheduler``; ``finish`` gets each result."""
        self.server, self.finish = server, finish
        self.lock = threading.Lock()
        self._work = threading.Condition(self.lock)
        self.queue = make_scheduler(scheduler, capacity)
        self.held: dict = {}  # admitted, place reserved, not yet queued
        self.jobs: dict = {}  # queued, running or finished and not yet collected
        self.running: dict = {}  # key -> (job, started at)
        self._skip = SkipNextTracker()
        self.loop: DecodeLoop | None = None  # the worker's loop while it runs
        self._stopping = False
        self.closing = ''  # why no goal is taken any more (a shutdown), '' while serving
        self._queued = threading.Condition(self.lock)  # wakes the expiry watch
        self._worker = threading.Thread(target=self._work_loop, name='timebill-worker',
                                        daemon=True)
        self._worker.start()
        self._expiry = threading.Thread(target=self._expire_loop, name='timebill-expiry',
                                        daemon=True)
        self._expiry.start()

    # -- the queue ------------------------------------------------------------------------

    def check_room_locked(self) -> None:
        """Raise Rejection when no goal can wait (lock held)."""
        waiting = len(self.queue) + len(self.held)
        if waiting >= self.queue.capacity:
            raise Rejection(
                f'queue full ({waiting} goals waiting, queue_length {self.queue.capacity})')

    def reorder(self, scheduler: str, capacity: int) -> None:
        """Order the waiting goals by ``scheduler`` from now on, up to ``capacity`` of them.

        A smaller bound refuses new goals until the queue drains below it; none waiting
        is dropped.
        """
        with self.lock:
            queue = make_scheduler(scheduler, max(capacity, len(self.queue)))
            for job in self.queue:
                queue.push(job, job.waiting())
            queue.capacity = capacity
            self.queue = queue

    def waiting(self) -> int:
        """Count the goals queued."""
        with self.lock:
            return len(self.queue)

    def start(self, key: str, hooks: JobHooks, keep: bool) -> Job:
        """Queue a held job with its caller's hooks (``keep``: until ``forget``).

        A job held while the server began closing ends at once (FAILED, with why).
        """
        with self.lock:
            job = self.held.pop(key)
            job.hooks, job.keep = hooks, keep
            closing = self.closing
            self.jobs[job.key] = job
            if not closing:
                self.queue.push(job, job.waiting())
                self.server.learning.accepted()
                self._work.notify()
                self._queued.notify()
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

        A running job sees its caller's cancel request at the next token boundary.
        """
        with self.lock:
            job = self.jobs.get(key)
            queued = job is not None and self.queue.remove(job)
        if queued:
            job.hooks.on_start()
            self.finish(job, ended_before_start(job.clock, Outcome.CANCELED,
                                                'canceled while queued', job.plan))
        return queued

    def close(self, reason: str) -> int:
        """Refuse new goals, end the queued ones (FAILED, ``reason``); return how many.

        A running goal stops at its next token (its stop rule polls ``closing``).
        """
        with self.lock:
            self.closing = reason or 'the node is shutting down'
            queued = list(self.queue)
            for job in queued:
                self.queue.remove(job)
            self._work.notify_all()
        for job in queued:
            job.hooks.on_start()
            self.finish(job, ended_before_start(job.clock, Outcome.FAILED,
                                                f'{self.closing} before it started', job.plan))
        return len(queued)

    @property
    def overtakes_prefills(self) -> bool:
        """Tell whether a queued goal may overtake a prefill: by deadline, so EDF only.

        FIFO and SVF keep their order.
        """
        return self.queue.name == 'edf'

    def prefills_left(self) -> dict:
        """Return the goals of the running loop a newcomer may overtake: key -> tokens done.

        Those still prefilling; none unless ``overtakes_prefills``.
        """
        if not self.overtakes_prefills:
            return {}
        loop = self.loop
        entries = list(loop.prefilling) if loop is not None else []
        return {entry.member.key: entry.prefill.tokens_done for entry in entries}

    def settled(self) -> bool:
        """Tell whether no goal runs, waits or has a result left to collect."""
        with self.lock:
            return not (self.running or self.held or len(self.queue) or self.jobs)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the worker thread (the running goals end first)."""
        with self.lock:
            self._stopping = True
            self._work.notify_all()
            self._queued.notify_all()
        self._worker.join(timeout=timeout_s)
        self._expiry.join(timeout=timeout_s)

    # -- the expiry watch -----------------------------------------------------------------

    def _expire_loop(self) -> None:
        """End queued Kill goals at their deadlines, not when the worker reaches them.

        A goal may wait behind a running one that holds the model past the waiting
        goal's deadline (a long prefill, a Skip-Next overrun, a reload): Kill ends it at
        its deadline all the same, with the time it waited.
        """
        while True:
            with self.lock:
                if self._stopping:
                    return
                now = time.monotonic()
                killable = [job for job in self.queue
                            if job.request.policy == OverrunPolicy.KILL]
                expired = [job for job in killable if job.clock.expired(now)]
                for job in expired:
                    self.queue.remove(job)
                if not expired:
                    due = min((job.clock.deadline for job in killable), default=math.inf)
                    self._queued.wait(min(max(0.0, due - now), EXPIRY_POLL_S))
                    continue
            for job in expired:
                job.hooks.on_start()
                self.finish(job, JobRun(job.request, job.plan, job.clock,
                                        job.cancel_requested, job.hooks.on_feedback
                                        ).before_start())

    # -- the worker -----------------------------------------------------------------------

    def _take(self, block: bool, before: float = math.inf):
        """Pop the job to run next and start it: (job, skip reason), or None.

        None when stopping, when nothing waits and ``block`` is False, or when the next
        job's deadline is not earlier than ``before`` (it may not overtake; under FIFO
        and SVF no job overtakes).
        """
        with self.lock:
            while block and not self._stopping and len(self.queue) == 0:
                self._work.wait(WORKER_POLL_S)
            if self._stopping or len(self.queue) == 0:
                return None
            if before != math.inf and (not self.overtakes_prefills or
                                       next(iter(self.queue)).clock.deadline >= before):
                return None
            job = self.queue.pop()
            job.stop_requested = self._stop_requested(job)
            # Skip-Next skips the job dispatched next, whatever the ordering.
            skip_reason = self._skip.take()
            self.running[job.key] = (job, time.monotonic())
        job.hooks.on_start()
        return job, skip_reason

    def _stop_requested(self, job: Job):
        """Return what a running job polls at each token: its caller's cancel, or closing."""
        return lambda: bool(self.closing) or job.cancel_requested()

    def _done(self, job: Job, result: JobResult) -> None:
        if self.closing and result.outcome == Outcome.CANCELED and not job.cancel_requested():
            # Stopped by the shutdown, not by its caller: say so.
            result = replace(result, outcome=Outcome.FAILED, deadline_met=False, reason=(
                f'{self.closing}: stopped after {result.tokens} tokens; text is partial'))
        with self.lock:
            self.running.pop(job.key, None)
            self._skip.record(job.request.policy, result.outcome, result.deadline_met,
                              job.key, len(self.queue))
        self.finish(job, result)

    def _work_loop(self) -> None:
        while True:
            taken = self._take(block=True)
            if taken is None:
                return
            try:
                self._run_loop(taken)
            except Exception as exc:  # noqa: BLE001 - the worker must survive any goal
                self.server.log.error(f'decode loop failed: {exc!r}')
            with self.lock:
                lost = [job for job, _ in self.running.values() if not job.done.is_set()]
            for job in lost:  # taken, but the loop broke before it ended
                self._done(job, ended_before_start(
                    job.clock, Outcome.FAILED, 'internal error: the decode loop broke',
                    job.plan))

    def _run_loop(self, taken: tuple) -> None:
        """Run a decode loop from ``taken`` until no goal is left in it."""
        pipeline = self.server.pipeline  # one pipeline per loop, even across a reload
        loop = DecodeLoop(pipeline.engine, pipeline.max_batch,
                          on_step=self.server.learning.step_observer(pipeline))
        first = [taken]
        try:
            with self.server.assembly.model_lock:
                self.loop = loop
                loop.run(lambda loop, before: self._refill(loop, pipeline, first, before))
        except Exception as exc:  # noqa: BLE001 - end the loop's goals, keep the worker
            self.server.log.error(f'decode loop failed: {exc!r}')
            loop.fail_all(exc)
        finally:
            self.loop = None

    def _refill(self, loop: DecodeLoop, pipeline, first: list, before: float) -> bool:
        """Start the next goal in the loop (the worker's first, then the queue's).

        A queued goal starts only when its deadline is earlier than ``before``.
        """
        taken = first.pop() if first else self._take(block=False, before=before)
        if taken is None:
            return False
        job, skip_reason = taken
        if skip_reason:
            self._done(job, ended_before_start(job.clock, Outcome.SKIPPED, skip_reason,
                                               job.plan))
            return True
        self._begin(loop, pipeline, job)
        return True

    def _begin(self, loop: DecodeLoop, pipeline, job: Job) -> None:
        """Plan a goal at its start (new information only) and prefill it into the loop."""
        run = JobRun(job.request, job.plan, job.clock, job.stop_requested,
                     job.hooks.on_feedback)
        ended = run.before_start()
        if ended is not None:
            self._done(job, ended)
            return
        admission = self.server.admission
        # Those in the loop decode beside it, but not a prefill it overtakes (no place).
        batch = min(loop.decoding(), loop.capacity - 1) + 1
        timing = None
        if batch > 1 and pipeline.batch is not None:  # (a batch model implies an ETE)
            # Goals of every precision share a round, so all of them count as the batch.
            longest = float(loop.longest_cache())
            timing = admission.member_timing(pipeline, batch, [longest] * (batch - 1),
                                             admission.kv_of(job))
        try:
            run.plan, decide = admission.plan_at_start(pipeline, job, timing, batch)
        except Rejection as exc:
            self._done(job, ended_before_start(job.clock, Outcome.REJECTED, exc.reason,
                                               job.plan))
            return
        loop.start(Member(job.key, run, job.request.max_new_tokens,
                          lambda result: self._done(job, result), chooser=self._chooser(job)),
                   job.prompt_ids, run.plan, decide)

    def _chooser(self, job: Job):
        """Return the goal's token chooser (None: greedy free text, the backend's argmax)."""
        output = job.request.output
        if output.plain:
            return None
        constraint = self.server.grammars.constraint(job.grammar) if job.grammar else None
        return TokenChooser(output, constraint, self.server.config.deadline_closure)
