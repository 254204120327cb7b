"""The serving core: admit goals, queue them under a scheduler, run them alone or batched.

ROS-free: the node (ros/node.py) converts messages into ``admit``/``hold``/``start``
calls and publishes what ``on_finished`` hands back. One worker thread owns the
model; everything else touches only the queue, under one lock, with timed waits.
"""

from __future__ import annotations

from dataclasses import replace
import threading
import time
from typing import Callable

from timebill_ros.core.deadline import closes_batch, DeadlineClock, SkipNextTracker
from timebill_ros.core.execution import (
    ended_before_start, JobResult, JobRun, PrefillDecision, run_job, TokenEvent)
from timebill_ros.core.planning import MIXED, Plan, TimeBillPlanner
from timebill_ros.core.profile import Profile
from timebill_ros.core.request import (
    check_prompt_fits, Mode, Outcome, OverrunPolicy, Rejection, validate)
from timebill_ros.core.scheduling import make_scheduler, slot_starts
from timebill_ros.core.telemetry import GoalRecord, Telemetry
from timebill_ros.runtime.batch import BatchDecoder
from timebill_ros.runtime.engine import StreamDecoder
from timebill_ros.runtime.model import intra_op_threads, on_own_thread, prompt_ids
from timebill_ros.serving.assembly import Assembly, Pipeline
from timebill_ros.serving.jobs import Job, JobHooks

WORKER_POLL_S = 0.2

# (job, result, ETE estimate s, ETE error %): called once per finished job, any thread.
Finished = Callable[[Job, JobResult, float, float], None]


class _Refused(Rejection):
    """The re-plan at the start of a job refused it (after queueing)."""


class _Member:
    """A job decoding in a batch: its rules, its engine stats and its text stream."""

    def __init__(self, job: Job, run: JobRun, stats, decoder: StreamDecoder):
        self.job, self.run, self.stats, self.decoder = job, run, stats, decoder
        self.lane: tuple = ('',)  # the precision batch it decodes in

    def emit(self, token: int, eos_ids) -> bool:
        """Stream one token as the engine's loop does; return False when the job ends."""
        if token in eos_ids:
            self.stats.stop = 'eos'
            return False
        self.stats.tokens += 1
        event = TokenEvent(index=self.stats.tokens - 1, token_id=token,
                           text_delta=self.decoder.push(token), time=time.monotonic())
        if not self.run.on_token(event):
            self.stats.stop = 'stopped'
            return False
        if self.stats.tokens >= self.job.request.max_new_tokens:
            self.stats.stop = 'max_tokens'
            return False
        return True


class Server:
    """Admission, scheduling, the worker, Skip-Next and online ETE learning for one model."""

    def __init__(self, assembly: Assembly, on_finished: Finished, scheduler: str = ''):
        """Build the first pipeline (profiles, calibration) and start the worker thread.

        ``scheduler`` overrides the configured one (``config.scheduler``).
        """
        self.assembly, self.config, self.log = assembly, assembly.config, assembly.log
        self.loaded, self.predictor = assembly.loaded, assembly.predictor
        self.on_finished = on_finished
        self.pipeline: Pipeline = assembly.start()
        self.telemetry = Telemetry(window=self.config.miss_window)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queue = make_scheduler(scheduler or self.config.scheduler, self.config.queue_length)
        self._held: dict = {}
        self._jobs: dict = {}
        self._skip = SkipNextTracker()
        self._running: dict = {}  # key -> (job, started at)
        # Answer length assumed for a waiting goal whose length is predicted only in its
        # prefill: a running mean of finished answers.
        self._typical_tokens = 32.0
        self._last_precision = ''  # the last finished goal's decode precision (diagnostics)
        self._stopping = False
        self._closing = ''  # why no goal is taken any more (a shutdown), '' while serving
        self._worker = threading.Thread(target=self._work_loop, name='timebill-worker',
                                        daemon=True)
        self._worker.start()

    @property
    def scheduler(self) -> str:
        """Return the name of the queue's ordering."""
        return self._queue.name

    # -- admission --------------------------------------------------------------------

    def admit(self, spec, key: str, will_run: bool = True) -> Job:
        """Validate, tokenize and plan a goal; raise Rejection with the reason.

        A goal that will run and whose length is predicted during its prefill is
        admitted on the plan for a 1-token answer (rejected only if even that
        misses); a dry run (``will_run`` False, the ~/plan service) predicts now.
        """
        accepted_at = time.monotonic()  # the budget counts from arrival, validation included
        if self._closing:
            raise Rejection(f'not accepting goals: {self._closing}')
        pipeline = self.pipeline
        request = validate(spec, pipeline.limits)
        clock = DeadlineClock(accepted_at, request.budget_s)
        ids = prompt_ids(self.loaded.tokenizer, request.instruction, request.context,
                         lock=self.loaded.tokenizer_lock)
        check_prompt_fits(len(ids), self.loaded.context_window)
        pending = will_run and self._predict_in_prefill(pipeline, request)
        plan = pipeline.planner.plan(request, len(ids), clock.remaining(), pending=pending)
        return Job(key=key, request=request, prompt_ids=ids, clock=clock, plan=plan)

    def _predict_in_prefill(self, pipeline: Pipeline, request) -> bool:
        """Say whether this goal's length comes from its own prefill's hidden states."""
        return (self.config.length_predictor_in_prefill and request.expected_tokens <= 0
                and isinstance(pipeline.planner, TimeBillPlanner)
                and getattr(self.predictor, 'prefill_layer', 0) > 0)

    def check_room(self) -> None:
        """Raise Rejection when no goal can wait."""
        with self._lock:
            self._check_room()

    def _check_room(self) -> None:
        waiting = len(self._queue) + len(self._held)
        if waiting >= self._queue.capacity:
            raise Rejection(
                f'queue full ({waiting} goals waiting, queue_length {self._queue.capacity})')

    def hold(self, job: Job) -> None:
        """Reserve a place for an admitted job until ``start`` (Rejection when full)."""
        with self._lock:
            self._check_room()
            self._fit_in_queue(job)
            self._held[job.key] = job

    def start(self, key: str, hooks: JobHooks) -> Job:
        """Queue a held job with its caller's hooks; it is kept until ``forget``.

        A job held while the server began closing ends at once (FAILED, with why).
        """
        with self._lock:
            job = self._held.pop(key)
            job.hooks, job.keep = hooks, True
            closing = self._closing
            if not closing:
                self._enqueue(job)
            else:
                self._jobs[job.key] = job
        if closing:
            hooks.on_start()
            self._finish(job, ended_before_start(job.clock, Outcome.FAILED,
                                                 f'{closing} before it started', job.plan))
        return job

    def submit(self, job: Job, hooks: JobHooks = JobHooks()) -> None:
        """Queue an admitted job at once (Rejection when full); dropped when it ends."""
        with self._lock:
            self._check_room()
            self._fit_in_queue(job)
            job.hooks = hooks
            self._enqueue(job)

    def _expected_tokens(self, job: Job) -> float:
        """Return a job's predicted answer length (a running mean while it is pending)."""
        plan = job.plan
        known = plan.predicted_tokens and not plan.length_pending
        return plan.predicted_tokens if known else self._typical_tokens

    def _expected_s(self, job: Job, model) -> float:
        """Return the ETE's time for a job's predicted (not worst-case) answer."""
        n_x = len(job.prompt_ids)
        return model.prefill(n_x) + model.decode((1.0 - job.plan.eviction_ratio) * n_x,
                                                 self._expected_tokens(job))

    def _fit_in_queue(self, job: Job) -> None:
        """Re-plan a newcomer for the time left after its expected wait (lock held).

        Raise Rejection when the planner refuses it after that wait, or when, under an
        ordering that lets it overtake (EDF, SVF), it would push an accepted goal that
        is expected to meet its deadline past it. Expected times use predicted lengths,
        so a queue is not judged on worst cases. With ``max_batch`` > 1 the queue runs
        on that many decode slots and the newcomer is planned on the steps of the batch
        it will join (``_fit_in_batch``).
        """
        pipeline = self.pipeline
        if not self.config.queue_aware_admission or pipeline.online is None:
            return
        if self.config.max_batch > 1 and pipeline.batch is not None:
            self._fit_in_batch(job, pipeline)
            return
        model, now = pipeline.online.model, time.monotonic()
        ahead, behind = self._queue.ahead(job.waiting())
        wait = sum(self._expected_s(other, model) for other in [*self._held.values(), *ahead])
        for running, since in self._running.values():
            wait += max(0.0, self._expected_s(running, model) - (now - since))
        if wait > 0.0:
            self._replan_after(job, pipeline, wait, len(ahead) + len(self._held), None, now)
        mine, start, pushed = self._expected_s(job, model), wait, []
        for other in behind:  # dispatch order: each starts after those before it
            end = start + self._expected_s(other, model)
            if end <= other.clock.remaining(now) < end + mine:
                pushed.append(other.key[:8])
            start = end
        self._refuse_if_pushed(job, pushed)

    def _replan_after(self, job: Job, pipeline: Pipeline, wait: float, ahead: int,
                      timing, now: float, batch: int = 1) -> None:
        """Re-plan a newcomer for the time left after ``wait`` (Rejection if refused).

        ``timing`` is the ETE of the batch of ``batch`` goals it will decode in.
        """
        pending = job.plan.length_pending
        try:
            job.plan = pipeline.planner.plan(
                job.request, len(job.prompt_ids), job.clock.remaining(now) - wait,
                None if pending else job.plan.predicted_tokens, pending=pending,
                timing=timing)
        except Rejection as exc:
            where = [f'after an expected {wait:.2f} s wait behind '
                     f'{ahead + len(self._running)} goals'] if wait > 0.0 else []
            if batch > 1:
                where.append(f'decoding in a batch of {batch}')
            raise Rejection(f'{", ".join(where)}: {exc.reason}', exc.plan) from None

    def _refuse_if_pushed(self, job: Job, pushed: list, why: str = '') -> None:
        if pushed:
            how = why or f'accepting it ahead of them ({self._queue.name})'
            raise Rejection(f'{how} would push {len(pushed)} accepted goal(s) past their '
                            f'deadlines: {", ".join(pushed)}', job.plan)

    def _member_timing(self, pipeline: Pipeline, size: int, others_kv: list, own_kv: float):
        """Return the ETE of a goal decoding with ``size`` - 1 others holding ``others_kv``."""
        single = pipeline.online.model
        if size <= 1:
            return single
        longest = max([own_kv, *others_kv])  # the batch pads every cache to the longest
        return pipeline.batch.model.member(single, size, (size - 1) * longest)

    def _kv_of(self, job: Job) -> float:
        """Return a job's cache length halfway through its expected answer."""
        n_x = len(job.prompt_ids)
        return (1.0 - job.plan.eviction_ratio) * n_x + self._expected_tokens(job) / 2.0

    def _fit_in_batch(self, job: Job, pipeline: Pipeline) -> None:
        """Admit a newcomer onto ``max_batch`` decode slots (lock held).

        The running goals hold slots for their expected remaining time; goals queued
        ahead take the first free slot in turn, and the newcomer the next one. It is
        planned on the steps of a batch as full as the goals then running or waiting
        allow. Refused when that plan refuses it; when joining (its prefill stalls the
        batch, and every step gets a member heavier) would push a running goal that is
        expected to make its deadline past it; or when, overtaking, it would delay a
        queued goal past its deadline. A running Skip-Next goal holds every slot until it
        ends (``closes_batch``); one still queued is counted as one slot.
        """
        size, now = self.config.max_batch, time.monotonic()
        running = list(self._running.values())
        ahead, behind = self._queue.ahead(job.waiting())
        waiting = [*self._held.values(), *ahead]
        busy = len(running) + len(waiting)
        batch = min(size, busy + 1)  # the batch the newcomer decodes in, itself included
        kv = [self._kv_of(other) for other, _ in running] + [self._kv_of(o) for o in waiting]
        timing = self._member_timing(pipeline, batch, kv[:batch - 1], self._kv_of(job))
        # The running goals' remaining time at the batch they decode in now.
        current = self._member_timing(pipeline, len(running), kv[1:len(running)], kv[0]) \
            if running else timing
        left = [max(0.0, self._expected_s(other, current) - (now - since))
                for other, since in running][:size]
        closing = [rest for (other, _), rest in zip(running, left)
                   if closes_batch(other.request.policy)]
        if closing:  # a running Skip-Next goal: no slot frees before it ends
            left = [max(rest, closing[0]) for rest in left] + \
                [closing[0]] * (size - len(left))
        queued = [self._expected_s(other, timing) for other in waiting]
        wait = slot_starts(left, size, [*queued, 0.0])[-1]
        if wait > 0.0 or batch > 1:
            self._replan_after(job, pipeline, wait, len(waiting), timing, now, batch)
        pushed = []
        if wait <= 0.0 and running:
            # Joining now: each running goal's remaining steps get slower, and they wait
            # out the newcomer's prefill.
            stall = timing.prefill(len(job.prompt_ids))
            for (other, _), rest in zip(running, left):
                kv_other = self._kv_of(other)
                slower = timing.step(kv_other) / max(current.step(kv_other), 1e-9)
                if rest <= other.clock.remaining(now) < rest * slower + stall:
                    pushed.append(other.key[:8])
            self._refuse_if_pushed(job, pushed, 'joining the running batch')
        after = [self._expected_s(other, timing) for other in behind]
        mine = self._expected_s(job, timing)
        with_it = slot_starts(left, size, [*queued, mine, *after])[len(queued) + 1:]
        without = slot_starts(left, size, [*queued, *after])[len(queued):]
        for other, start, alone, duration in zip(behind, with_it, without, after):
            if alone + duration <= other.clock.remaining(now) < start + duration:
                pushed.append(other.key[:8])
        self._refuse_if_pushed(job, pushed)

    def _enqueue(self, job: Job) -> None:
        """Queue a job (lock held)."""
        self._queue.push(job, job.waiting())
        self._jobs[job.key] = job
        self.telemetry.accepted()
        self._work.notify()

    def rejected(self, plan: Plan | None) -> None:
        """Count a goal refused at admission."""
        with self._lock:
            self.telemetry.rejected()
            if plan is not None and not plan.feasible:
                self.telemetry.deadline_rejection(plan.fit_probability)

    def job(self, key: str) -> Job | None:
        """Return a queued or running job."""
        with self._lock:
            return self._jobs.get(key)

    def forget(self, key: str) -> None:
        """Drop a finished job whose result was delivered."""
        with self._lock:
            self._jobs.pop(key, None)

    def cancel(self, key: str) -> bool:
        """End a job now if it is still queued; return whether it was.

        A running job sees its caller's cancel request at the next token boundary.
        """
        with self._lock:
            job = self._jobs.get(key)
            queued = job is not None and self._queue.remove(job)
        if queued:
            job.hooks.on_start()
            self._finish(job, ended_before_start(job.clock, Outcome.CANCELED,
                                                 'canceled while queued', job.plan))
        return queued

    # -- execution --------------------------------------------------------------------

    def _take(self, block: bool):
        """Pop the job to run next and start it: (job, skip reason), or None.

        None when stopping, or when nothing waits and ``block`` is False.
        """
        with self._lock:
            while block and not self._stopping and len(self._queue) == 0:
                self._work.wait(WORKER_POLL_S)
            if self._stopping or len(self._queue) == 0:
                return None
            job = self._queue.pop()
            job.stop_requested = self._stop_requested(job)
            # Skip-Next skips the job dispatched next, whatever the ordering.
            skip_reason = self._skip.take()
            self._running[job.key] = (job, time.monotonic())
        job.hooks.on_start()
        return job, skip_reason

    def _stop_requested(self, job: Job):
        """Return what a running job polls at each token: its caller's cancel, or closing."""
        return lambda: bool(self._closing) or job.cancel_requested()

    def _done(self, job: Job, result: JobResult) -> None:
        if self._closing and result.outcome == Outcome.CANCELED and not job.cancel_requested():
            # Stopped by the shutdown, not by its caller: say so.
            result = replace(result, outcome=Outcome.FAILED, deadline_met=False, reason=(
                f'{self._closing}: stopped after {result.tokens} tokens; text is partial'))
        with self._lock:
            self._running.pop(job.key, None)
            self._skip.record(job.request.policy, result.outcome, result.deadline_met,
                              job.key, len(self._queue))
        self._finish(job, result)

    def _work_loop(self) -> None:
        while True:
            taken = self._take(block=True)
            if taken is None:
                return
            job, skip_reason = taken
            try:
                with self.assembly.model_lock:
                    if self.config.max_batch > 1 and not skip_reason:
                        self._run_batch(job)  # ends every job it runs, this one included
                        continue
                    result = self._run(job, skip_reason)
            except Exception as exc:  # noqa: BLE001 - the worker must survive any goal
                self.log.error(f'goal {job.key} failed: {exc!r}')
                result = ended_before_start(job.clock, Outcome.FAILED,
                                            f'internal error: {exc!r}', job.plan)
            self._done(job, result)

    def _start_plan(self, pipeline: Pipeline, job: Job, timing=None) -> tuple:
        """Return (plan, PrefillDecision or None) for a job about to run.

        ``timing`` is the ETE of the batch it joins (None: it decodes alone).
        Raise Rejection when the re-plan for the time left after queueing refuses it.
        """
        request, n_prompt = job.request, len(job.prompt_ids)
        if self._predict_in_prefill(pipeline, request):
            left = job.clock.remaining()  # at the start of prefill, which the plan covers
            predictor = self.predictor

            def plan_from(hidden) -> Plan:
                try:
                    plan = pipeline.planner.plan(request, n_prompt, left,
                                                 predictor.predict_from_hidden(hidden, request),
                                                 timing=timing)
                except Rejection as exc:
                    # Only alone: in a batch its steps would slow the running goals.
                    if timing is not None or exc.plan is None or \
                            not self._best_effort_now(request):
                        raise
                    plan = replace(exc.plan, note=f'best effort (Kill, no goal waiting): '
                                                  f'{exc.reason}')
                job.plan = plan  # admission now sees the predicted length of a running goal
                return plan
            return job.plan, PrefillDecision(predictor.prefill_layer, plan_from)
        try:
            return pipeline.planner.plan(request, n_prompt, job.clock.remaining(),
                                         job.plan.predicted_tokens or None,
                                         timing=timing), None
        except Rejection as exc:
            raise _Refused(f'after {job.clock.elapsed():.3f} s in queue: {exc.reason}',
                           job.plan) from None

    def _best_effort_now(self, request) -> bool:
        """Tell whether a goal refused in its prefill runs anyway (``idle_best_effort``)."""
        if not self.config.idle_best_effort or request.policy != OverrunPolicy.KILL:
            return False
        with self._lock:
            return len(self._queue) == 0

    def _run(self, job: Job, skip_reason: str) -> JobResult:
        if skip_reason:
            return ended_before_start(job.clock, Outcome.SKIPPED, skip_reason, job.plan)
        pipeline = self.pipeline  # one pipeline for the whole goal, even across a reload
        try:
            plan, decide = self._start_plan(pipeline, job)
        except Rejection as exc:
            return ended_before_start(job.clock, Outcome.REJECTED, exc.reason, job.plan)
        return run_job(pipeline.engine, job.prompt_ids, job.request, plan, job.clock,
                       job.stop_requested, job.hooks.on_feedback, decide)

    def _lane(self, plan: Plan) -> tuple:
        """Return which batch a plan decodes in: its precision (and per-layer mix)."""
        if plan.precision == MIXED:
            return (MIXED, tuple(plan.precision_mix))
        return (plan.precision or '',)

    def _run_batch(self, first: Job) -> None:
        """Decode ``first`` and the jobs that join at token boundaries together.

        Goals decode in one batch per precision (a per-layer mix is a precision of its
        own); each round steps every batch once, so every goal gets a token per round
        and its Kill, cancel and feedback act at its own token boundaries. A goal whose
        fallback rule says switch moves, cache and all, to the low-precision batch.
        Rules: an early-exit goal (layer by layer, its own exits) decodes alone at once
        while the batches wait; while a Skip-Next goal decodes, no goal joins
        (``closes_batch``), so the goal dispatched after it is the one it may skip.
        """
        pipeline, engine = self.pipeline, self.pipeline.engine
        lanes: dict = {}  # lane -> BatchDecoder
        last_step: dict = {}  # lane -> its last step's seconds
        members: dict = {}

        def lane_batch(lane: tuple) -> BatchDecoder:
            if lane not in lanes:
                model = self.loaded.model if lane == ('',) else \
                    engine.decode_model(Plan(precision=lane[0],
                                             precision_mix=lane[1] if len(lane) > 1 else ()))
                lanes[lane] = BatchDecoder(model, self.loaded.device)
            return lanes[lane]

        def decoding() -> int:
            return sum(len(batch) for batch in lanes.values())

        def admit(job: Job, skip_reason: str) -> None:
            if skip_reason:
                self._done(job, ended_before_start(job.clock, Outcome.SKIPPED, skip_reason,
                                                   job.plan))
                return
            run = JobRun(job.request, job.plan, job.clock, job.stop_requested,
                         job.hooks.on_feedback)
            ended = run.before_start()
            try:
                if ended is None:
                    run.plan, decide = self._start_plan(
                        pipeline, job, self._joining_timing(pipeline, decoding(), lanes, job))
                    cache, token, stats = engine.prefill(job.prompt_ids, run.plan, decide)
                    run.plan = stats.plan
            except _Refused as exc:
                ended = ended_before_start(job.clock, Outcome.REJECTED, exc.reason, job.plan)
            except Rejection as exc:  # refused by the plan made in its prefill
                ended = run.failed(exc)
            except Exception as exc:  # noqa: BLE001 - any engine failure ends the goal
                ended = run.failed(exc)
            if ended is not None:
                self._done(job, ended)
                return
            if run.plan.mode == Mode.EARLY_EXIT:
                try:
                    ended = run.finish(engine.decode(cache, token, len(job.prompt_ids),
                                                     job.request.max_new_tokens, stats,
                                                     run.on_token))
                except Exception as exc:  # noqa: BLE001
                    ended = run.failed(exc)
                self._done(job, ended)
                return
            member = _Member(job, run, stats, StreamDecoder(self.loaded.tokenizer,
                                                            self.loaded.tokenizer_lock))
            if member.emit(token, self.loaded.eos_ids):
                member.lane = self._lane(run.plan)
                stats.batch_peak = max(stats.batch_peak, decoding() + 1)
                lane_batch(member.lane).join(job.key, cache, token, len(job.prompt_ids))
                members[job.key] = member
            else:
                self._done(job, run.finish(stats))

        def shared(fallback):
            # A token costs a whole round: time the rule on the lanes' last steps.
            target = (fallback.precision,)
            after = sum(last_step.get(lane, 0.0) for lane in lanes
                        if lane not in (('',), target))
            if len(lanes[('',)]) > 1:  # the full-precision batch goes on without it
                after += last_step.get(('',), 0.0)
            if target in lanes:  # joining makes that batch's step heavier, not lighter
                after += max(0.0, last_step.get(target, 0.0) - fallback.step_s)
            return fallback.sharing(sum(last_step.get(lane, 0.0) for lane in lanes), after)

        def switch_due() -> None:
            for key, member in list(members.items()):
                fallback = member.run.plan.fallback
                if member.lane != ('',) or fallback is None or member.stats.switched_at >= 0:
                    continue
                index = member.stats.tokens - 1  # the last answer token streamed
                if shared(fallback).due(index, member.job.clock.remaining()):
                    cache, token, position = lanes[('',)].take(key)
                    member.lane = (fallback.precision,)
                    lane_batch(member.lane).join(key, cache, token, position)
                    member.stats.switched_at, member.stats.switched_to = \
                        index, fallback.precision

        def closed() -> bool:
            return any(closes_batch(m.job.request.policy) for m in members.values())

        admit(first, '')
        while members:
            while decoding() < self.config.max_batch and not closed():
                taken = self._take(block=False)
                if taken is None:
                    break
                admit(*taken)
            switch_due()
            for lane in [lane for lane, batch in lanes.items() if len(batch) == 0]:
                del lanes[lane]
                last_step.pop(lane, None)
            for lane, batch in list(lanes.items()):
                if lane[0] == MIXED:
                    engine.mixed.apply(lane[1])  # the shell is shared by every mixed lane
                t, size = time.monotonic(), len(batch)
                total_kv = size * batch.cached_tokens()
                try:
                    with intra_op_threads(engine.threads_for(lane[0])):
                        tokens = batch.step()
                except Exception as exc:  # noqa: BLE001 - the whole batch fails together
                    for key in batch.keys:
                        member = members.pop(key)
                        self._done(member.job, member.run.failed(exc))
                    del lanes[lane]
                    continue
                step_s = time.monotonic() - t
                last_step[lane] = step_s
                if pipeline.batch is not None and lane == ('',):
                    pipeline.batch.observe(size, total_kv, step_s)
                peak = decoding()
                for key, token in tokens.items():
                    member = members[key]
                    member.stats.step_times.append(step_s)
                    member.stats.batch_peak = max(member.stats.batch_peak, peak)
                    if not member.emit(token, self.loaded.eos_ids):
                        batch.leave(key)
                        del members[key]
                        self._done(member.job, member.run.finish(member.stats))

    def _joining_timing(self, pipeline: Pipeline, decoding: int, lanes: dict, job: Job):
        """Return the ETE of a job joining ``decoding`` goals (None: it would decode alone).

        Goals of every precision share a round, so all of them count as the batch.
        """
        if pipeline.batch is None or pipeline.online is None or decoding == 0:
            return None
        longest = max(batch.cached_tokens() for batch in lanes.values() if len(batch))
        return self._member_timing(pipeline, decoding + 1, [float(longest)] * decoding,
                                   self._kv_of(job))

    def _finish(self, job: Job, result: JobResult) -> None:
        """Learn from, count and hand over a finished job's result."""
        estimate, error = learn_timing(self.pipeline, job, result)
        with self._lock:
            self.telemetry.finished(GoalRecord(result.outcome, result.deadline_met,
                                               result.e2e_s, result.step_times))
            if estimate:
                self.telemetry.ete_error(error)
            if result.outcome == Outcome.REJECTED and not result.plan.feasible:
                self.telemetry.deadline_rejection(result.plan.fit_probability)
            if result.prefill_s > 0.0:
                plan = result.plan
                self._last_precision = plan.precision_text or plan.precision or \
                    self.loaded.dtype
            if result.outcome == Outcome.COMPLETED:
                # Only finished answers have a true length (a killed one was cut short).
                self._typical_tokens = 0.9 * self._typical_tokens + 0.1 * result.tokens
                if result.plan.predicted_tokens:
                    self.telemetry.length_error(result.plan.predicted_tokens, result.tokens)
        try:
            self.on_finished(job, result, estimate, error)
        finally:
            job.result = result
            job.done.set()
            if not job.keep:  # nobody collects it (a topic goal, a test): drop it now
                with self._lock:
                    self._jobs.pop(job.key, None)

    # -- profiles, status, shutdown ------------------------------------------------------

    def recalibrate(self, quick: bool) -> Profile:
        """Calibrate the model again and swap in the pipeline built on the new profile."""
        profile, pipeline = on_own_thread(  # leaves no OpenMP team on the caller's thread
            self.assembly.recalibrate, quick, self.pipeline.online_variants)
        self.pipeline = pipeline  # one reference swap: a running goal keeps its own
        return profile

    def status(self) -> tuple:
        """Return (telemetry summary, facts for diagnostics)."""
        pipeline = self.pipeline
        with self._lock:
            summary = self.telemetry.summary()
            extra = {'queue_length': len(self._queue), 'executing': len(self._running),
                     'scheduler': self._queue.name, 'last_precision': self._last_precision}
        extra.update({'planner': type(pipeline.planner).__name__,
                      'auto_precision': ','.join(pipeline.online_variants),
                      'precision_mix': f'{pipeline.planner.mix.table.units} units'
                      if getattr(pipeline.planner, 'mix', None) else 'off',
                      'early_exit_layers': ','.join(map(str, pipeline.early_exit.rule.exit_layers))
                      if pipeline.early_exit else ''})
        if pipeline.online is not None:
            model = pipeline.online.model
            extra.update({'ete_step_s_per_kv_token': model.p, 'ete_step_base_s': model.q,
                          # measured / fitted time per phase: > 1 means slower than calibrated
                          'ete_drift_prefill': round(pipeline.online.drift_prefill, 4),
                          'ete_drift_decode': round(pipeline.online.drift_decode, 4)})
        if pipeline.batch is not None:
            extra.update({'max_batch': self.config.max_batch,
                          'ete_batch_drift': round(pipeline.batch.model.drift, 4),
                          'ete_batch_step_mape_pct': round(pipeline.batch.mape(), 2)})
        return summary, extra

    def close(self, reason: str) -> int:
        """Stop taking goals: refuse new ones, end the queued ones, stop the running ones.

        Every goal gets a result saying ``reason``: queued and held goals end now
        (FAILED), a running goal stops at its next token (FAILED, partial text kept).
        Return how many goals were queued.
        """
        with self._lock:
            self._closing = reason or 'the node is shutting down'
            queued = list(self._queue)
            for job in queued:
                self._queue.remove(job)
            self._work.notify_all()
        for job in queued:
            job.hooks.on_start()
            self._finish(job, ended_before_start(job.clock, Outcome.FAILED,
                                                 f'{self._closing} before it started',
                                                 job.plan))
        return len(queued)

    def settled(self) -> bool:
        """Tell whether no goal runs, waits or has a result left to collect."""
        with self._lock:
            return not (self._running or self._held or len(self._queue) or self._jobs)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the worker thread (the running goal ends first)."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
        self._worker.join(timeout=timeout_s)


def learn_timing(pipeline: Pipeline, job: Job, result: JobResult) -> tuple:
    """Compare the ETE with what ran, then refit it online; return (estimate, error %)."""
    online = pipeline.online
    if online is None or result.prefill_s <= 0.0:
        return 0.0, 0.0
    model = online.model
    n_x = len(job.prompt_ids)
    if result.plan.mode == Mode.EARLY_EXIT:
        # Exited steps are shorter than the decode model's full-depth steps: keep
        # them out of its fit (and out of the ETE error); the prefill still counts.
        online.observe(n_x, result.prefill_s, result.kv_tokens, ())
        return 0.0, 0.0
    if result.batch_peak > 1 or result.plan.precision == MIXED:
        # Batched or mixed-precision steps are not the steps either ETE models (the batch
        # model has its own drift; a mix scales both ETEs): prefill only.
        online.observe(n_x, result.prefill_s, result.kv_tokens, ())
        return 0.0, 0.0
    switched = pipeline.online_variants.get(result.switched_to)
    variant = pipeline.online_variants.get(result.plan.precision)
    every = [online, *pipeline.online_variants.values()]

    def observe(ete, prefill_s: float, kv: int, steps) -> None:
        before = ete.drift_decode
        ete.observe(n_x, prefill_s, kv, steps)
        ete.share_decode_drift(every, before)  # the machine's speed moves every precision
    if switched is not None and result.switched_at >= 0:
        # Full-precision steps up to the switch, the fallback precision's after it.
        at, steps = result.switched_at, result.step_times
        estimate = model.prefill(n_x) + model.decode(result.kv_tokens, at + 1) + \
            switched.model.decode(result.kv_tokens + at, result.tokens - at)
        observe(online, result.prefill_s, result.kv_tokens, steps[:at])
        observe(switched, 0.0, result.kv_tokens + at, steps[at:])
    elif variant is not None:
        # Prefill ran at full precision, the decode steps on the variant.
        estimate = model.prefill(n_x) + variant.model.decode(result.kv_tokens, result.tokens)
        online.observe(n_x, result.prefill_s, result.kv_tokens, ())
        observe(variant, 0.0, result.kv_tokens, result.step_times)
    else:
        estimate = model.prefill(n_x) + model.decode(result.kv_tokens, result.tokens)
        observe(online, result.prefill_s, result.kv_tokens, result.step_times)
    actual = result.prefill_s + result.decode_s
    return estimate, (estimate - actual) / actual * 100.0
