# SPDX-License-Identifier: Apache-2.0
"""Dispatch: the local engines' queue under its scheduler, the worker thread, the expiry watch.

One worker thread owns the model: it takes the next goal and runs it in the decode
loop (serving/loop.py), which takes further goals in at token boundaries while it
has room (``max_batch``), or a goal that overtakes a long prefill. An expiry watch
ends queued Kill goals at their deadlines. The server (serving/server.py) owns the
job table, Skip-Next and every result; everything here touches only the queue, under
the server's lock, with timed waits.
"""

from __future__ import annotations

import math
import threading
import time

from timebill_ros.core.execution import ended_before_start, JobResult, JobRun
from timebill_ros.core.request import Outcome, OverrunPolicy, Rejection
from timebill_ros.core.scheduling import make_scheduler
from timebill_ros.runtime.choosing import TokenChooser
from timebill_ros.serving.jobs import Job
from timebill_ros.serving.loop import DecodeLoop, pausable
from timebill_ros.serving.members import Member

WORKER_POLL_S = 0.2
EXPIRY_POLL_S = 1.0  # the expiry watch wakes at least this often (and for an earlier deadline)


class Dispatch:
    """Order the local engines' admitted goals and run them on the worker thread."""

    def __init__(self, executor, lifecycle, scheduler: str, capacity: int):
        """Queue up to ``capacity`` goals under ``scheduler`` for ``executor``.

        ``lifecycle`` (the Server) owns the job table and the lock; it gets each result.
        """
        self.server, self.lifecycle = executor, lifecycle
        self.lock = lifecycle.lock
        self._work = threading.Condition(self.lock)
        self.queue = make_scheduler(scheduler, capacity)
        self.loop: DecodeLoop | None = None  # the worker's loop while it runs
        self._stopping = False
        self._queued = threading.Condition(self.lock)  # wakes the expiry watch
        self._expiry_due = -math.inf  # when the expiry watch wakes next (lock held)
        self._worker = threading.Thread(target=self._work_loop, name='timebill-worker',
                                        daemon=True)
        self._worker.start()
        self._expiry = threading.Thread(target=self._expire_loop, name='timebill-expiry',
                                        daemon=True)
        self._expiry.start()

    # -- the queue (the server's lock held) -------------------------------------------------

    @property
    def held(self) -> dict:
        """Return the goals admitted and not yet started (the server's)."""
        return self.lifecycle.held

    @property
    def running(self) -> dict:
        """Return the goals dispatched and not yet ended: key -> (job, dispatched at)."""
        return self.lifecycle.running

    def check_room_locked(self) -> None:
        """Raise Rejection when no goal can wait (lock held)."""
        waiting = len(self.queue) + len(self.held)
        if waiting >= self.queue.capacity:
            raise Rejection(
                f'queue full ({waiting} goals waiting, queue_length {self.queue.capacity})')

    def reorder(self, scheduler: str, capacity: int) -> None:
        """Order the waiting goals by ``scheduler`` from now on, up to ``capacity`` (lock held).

        A smaller bound refuses new goals until the queue drains below it; none waiting
        is dropped.
        """
        queue = make_scheduler(scheduler, max(capacity, len(self.queue)))
        for job in self.queue:
            queue.push(job, job.waiting())
        queue.capacity = capacity
        self.queue = queue

    def waiting(self) -> int:
        """Count the goals queued (takes the lock)."""
        with self.lock:
            return len(self.queue)

    def enqueue(self, job: Job) -> None:
        """Queue an admitted job and wake the worker (lock held)."""
        self.queue.push(job, job.waiting())
        self._work.notify()
        if job.clock.deadline < self._expiry_due:
            # Only a deadline before its next wake needs the watch now: a burst woke it
            # (and it scanned the whole queue under the lock) once per arrival.
            self._queued.notify()

    def unqueue(self, job: Job) -> bool:
        """Take a job out of the queue if it still waits (lock held); return whether."""
        return self.queue.remove(job)

    def drain(self) -> list:
        """Take every waiting job out of the queue (lock held) and return them.

        A running goal stops at its next token (the server's closing is in its stop rule).
        """
        queued = list(self.queue)
        for job in queued:
            self.queue.remove(job)
        self._work.notify_all()
        return queued

    @property
    def overtakes_prefills(self) -> bool:
        """Tell whether a queued goal may overtake a prefill: by deadline, so EDF only.

        FIFO and SVF keep their order.
        """
        return self.queue.name == 'edf'

    @property
    def preempts(self) -> bool:
        """Tell whether a decoding goal pauses for an earlier deadline (EDF, ``preemption``)."""
        return self.overtakes_prefills and self.server.config.preemption

    def earliest_waiting(self) -> float:
        """Return the earliest deadline of the queued goals (inf: none, or no preemption).

        The loop asks at every token boundary whether a decoding goal pauses for it:
        under EDF with ``preemption`` on only.
        """
        if not self.preempts:
            return math.inf
        with self.lock:
            head = self.queue.first()
        return head.clock.deadline if head is not None else math.inf

    def prefills_left(self) -> dict:
        """Return the goals of the running loop a newcomer may overtake: key -> tokens done.

        Those still prefilling; none unless ``overtakes_prefills``.
        """
        if not self.overtakes_prefills:
            return {}
        loop = self.loop
        entries = list(loop.prefilling) if loop is not None else []
        return {entry.member.key: entry.prefill.tokens_done for entry in entries}

    def pausable(self) -> dict:
        """Return the decoding goals a newcomer with an earlier deadline would pause.

        key -> answer tokens streamed; none unless the loop preempts (EDF, ``preemption``).
        """
        loop = self.loop
        if loop is None or not self.preempts:
            return {}
        return {key: member.stats.tokens for key, member in pausable(loop)}

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
                    self._expiry_due = min(due, now + EXPIRY_POLL_S)
                    self._queued.wait(max(0.0, self._expiry_due - now))
                    self._expiry_due = -math.inf  # awake: it scans before it waits again
                    continue
            for job in expired:
                job.hooks.on_start()
                self.lifecycle.finish(job, JobRun(job.request, job.plan, job.clock,
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
                                       self.queue.first().clock.deadline >= before):
                return None
            job = self.queue.pop()
            skip_reason = self.lifecycle.dispatched(job)
        job.hooks.on_start()
        return job, skip_reason

    def _done(self, job: Job, result: JobResult) -> None:
        self.lifecycle.finish(job, result)

    def _work_loop(self) -> None:
        while True:
            idle_work = self.server.idle_work()  # options still to profile (serving/warmup)
            taken = self._take(block=not idle_work)
            if taken is None:
                if self._stopping:
                    return
                self._idle_step()
                continue
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

    def _idle_step(self) -> None:
        """Measure one profiling point while no goal waits; a goal that arrives cuts it short."""
        def goal_waits() -> bool:  # read without the lock: a stale answer costs one point
            return self._stopping or len(self.queue) > 0 or bool(self.held)
        if goal_waits():  # admitted, about to queue: wait for it rather than spin
            with self.lock:
                self._work.wait(WORKER_POLL_S / 10)
            return
        try:
            with self.server.assembly.model_lock:
                self.server.idle_step(goal_waits)
        except Exception as exc:  # noqa: BLE001 - profiling must not stop the worker
            self.server.log.error(f'idle profiling failed: {exc!r}')

    def _run_loop(self, taken: tuple) -> None:
        """Run a decode loop from ``taken`` until no goal is left in it."""
        pipeline = self.server.pipeline  # one pipeline per loop, even across a reload
        loop = DecodeLoop(pipeline.engine, pipeline.max_batch,
                          on_step=self.server.learning.step_observer(pipeline),
                          earliest_waiting=self.earliest_waiting)
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
        run = self.lifecycle.begin(job, skip_reason)
        if run is None:  # skipped, canceled or expired: its result is delivered
            return True
        self._begin(loop, pipeline, job, run)
        return True

    def _begin(self, loop: DecodeLoop, pipeline, job: Job, run: JobRun) -> None:
        """Plan a goal at its start (new information only) and prefill it into the loop."""
        admission = self.server.admission
        # Those in the loop decode beside it, but not a prefill it overtakes (no place).
        batch = min(loop.decoding(), loop.capacity - 1) + 1
        timing = None
        if batch > 1 and pipeline.batch is not None:  # (a batch model implies an ETE)
            # Goals of every precision share a round, so all of them count as the batch.
            longest = float(loop.longest_cache())
            fit = admission.queue_fit(pipeline)
            timing = fit.member_timing(batch, [longest] * (batch - 1), fit.kv_of(job))
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
