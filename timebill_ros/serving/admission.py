# SPDX-License-Identifier: Apache-2.0
"""Admission: validate a goal, predict its length and plan it once, for the time it will have.

A goal is planned once, against the time left after the work expected ahead of it
(queue-aware admission) and on the steps of the batch it will decode in. The
``~/plan`` service runs exactly this path without reserving a place. A later re-plan
happens only on new information (the real queue wait at dispatch, the length
predicted in its prefill), goes through ``Planner.plan`` again, and is written into
the plan's note with what changed.
"""

from __future__ import annotations

from dataclasses import dataclass
import time

from timebill_ros.core.deadline import DeadlineClock
from timebill_ros.core.execution import PrefillDecision
from timebill_ros.core.planning import best_effort, PENDING, Plan
from timebill_ros.core.request import check_prompt_fits, Rejection
from timebill_ros.core.queue_fit import QueueFit, QueueView
from timebill_ros.runtime.grammar import GrammarError
from timebill_ros.runtime.model import request_prompt_ids
from timebill_ros.serving.context_reduction import ContextReduction
from timebill_ros.serving.jobs import Job
from timebill_ros.serving.length_choice import LengthChoice
from timebill_ros.serving.queue_share import QueueShare
from timebill_ros.serving.plan_notes import (
    cached, note_prefixes, noted, replanned, with_job_notes)

# A dispatch this much later than admission expected is new information worth a re-plan.
REPLAN_AFTER_S = 0.005


@dataclass(frozen=True)
class LocalLength:
    """The answer length a local goal is planned on, chosen once at admission.

    ``known``: tokens (None while its prefill is to predict them, ``pending``); ``how``:
    the plan note saying where the length came from ('' for the predictor);
    ``pipeline``: the pipeline it was chosen on (a reload swaps in a new one).
    """

    known: int | None
    pending: bool
    how: str
    pipeline: object


class Admission:
    """Admit goals onto the dispatch queue, each planned once (``admit``)."""

    def __init__(self, server):
        """Admit for ``server`` (its pipeline, model, predictor, dispatch and learning)."""
        self.server = server
        self.length = LengthChoice(server)
        self.context = ContextReduction(self)
        self.share = QueueShare(self)

    @property
    def config(self):
        return self.server.config

    def prepare(self, request, clock: DeadlineClock, key: str) -> Job:
        """Tokenize a validated goal and choose its answer length; raise Rejection with why.

        Outside the server's lock. A goal whose length is predicted during its prefill
        is planned for a 1-token answer (rejected only if even that misses).
        """
        pipeline, loaded = self.server.pipeline, self.server.loaded
        ids = request_prompt_ids(loaded.tokenizer, request, loaded.tokenizer_lock)
        check_prompt_fits(len(ids), loaded.context_window)
        grammar = self._compile(request.output)
        known, how, spread, pending = self.length.choose(
            pipeline, request, len(ids), grammar, clock.remaining())
        job = Job(key=key, request=request, prompt_ids=ids, clock=clock, plan=Plan(
            prompt_tokens=len(ids), predicted_tokens=known or 0,
            predictor='' if known else PENDING), spread=spread,
            grammar=grammar, length_basis=LocalLength(known, pending, how, pipeline))
        note_prefixes(job, pipeline)
        return job

    def plan(self, job: Job) -> None:
        """Plan a prepared goal against the queue and the batch (server lock held)."""
        basis = job.length_basis
        pipeline, known, pending = basis.pipeline, basis.known, basis.pending
        self.server.dispatch.check_room_locked()
        try:
            self._plan_in_queue(job, pipeline, known, pending)
            self.context.if_worth_more(job, pipeline, known, pending)
        except Rejection as exc:
            try:
                self.context.or_raise(job, pipeline, known, pending, exc)
            except Rejection:
                job.plan = self._best_effort_or_raise(job, exc)
        job.length_note = basis.how
        job.plan = with_job_notes(job.plan, job, pipeline)

    def preview(self, job: Job) -> None:
        """Show a dry run of a goal whose length its prefill predicts the plan it would make."""
        if job.length_basis.pending:
            self._preview_prefill_plan(job, job.length_basis.pipeline)

    def _compile(self, output) -> str:
        """Return the goal's compiled schema or grammar ('' for free text).

        Raise Rejection with llguidance's reason when it cannot be used.
        """
        if not output.constrained:
            return ''
        try:
            return self.server.grammars.compile(output.json_schema, output.grammar)
        except GrammarError as exc:
            raise Rejection(f'invalid {"json_schema" if output.json_schema else "grammar"}: '
                            f'{exc}') from None

    def _preview_prefill_plan(self, job: Job, pipeline) -> None:
        """Show a dry run the plan its prefill would make, its length predicted now.

        Admission (above, the action's own path) decided; this only fills in the plan a
        caller of ~/plan wants to see: the one made once the length is known.
        """
        request, n_prompt = job.request, len(job.prompt_ids)
        predicted = int(pipeline.planner.predictor.predict(request, n_prompt))
        try:
            plan = pipeline.planner.plan(request, n_prompt,
                                         job.clock.remaining() - job.expected_wait_s,
                                         predicted, timing=job.expected_timing,
                                         engine_prefix=job.engine_prefix)
        except Rejection as exc:
            job.plan = noted(job.plan, f'its prefill would refuse it ({predicted} answer '
                                       f'tokens predicted now): {exc.reason}')
            return
        job.plan = noted(plan, f'as its prefill would plan it ({predicted} answer tokens '
                               f'predicted now; admission planned a 1-token answer)')

    # -- the time ahead ---------------------------------------------------------------------

    def queue_fit(self, pipeline=None) -> QueueFit:
        """Return the queue arithmetic (core.queue_fit) on ``pipeline`` (default: in force)."""
        return QueueFit(pipeline or self.server.pipeline, self.server.learning.typical_tokens)

    def expected_tokens(self, job: Job) -> float:
        """Return a job's predicted answer length (a running mean while it is pending)."""
        return self.queue_fit().expected_tokens(job)

    def _plan_in_queue(self, job: Job, pipeline, known, pending: bool) -> None:
        """Plan a newcomer once for the time left after its expected wait (lock held).

        Raise Rejection when the plan refuses it, or when accepting it would push an
        accepted goal expected to meet its deadline past it (core.queue_fit).
        """
        if not self.config.queue_aware_admission or pipeline.online is None:
            job.plan = self._plan(job, pipeline, known, pending, 0.0, None, 1, 0)
            return
        dispatch = self.server.dispatch
        ahead, behind = dispatch.queue.ahead(job.waiting())
        view = QueueView([*dispatch.held.values(), *ahead], behind,
                         list(dispatch.running.values()), dispatch.prefills_left(),
                         dispatch.queue.name, time.monotonic(), dispatch.pausable())

        def plan(wait: float, timing, batch: int, ahead: int) -> None:
            job.plan = self._plan(job, pipeline, known, pending, wait, timing, batch, ahead)
        fit = self.queue_fit(pipeline)
        if pipeline.batch is not None:  # batched decoding (max_batch > 1, profiled)
            fit.fit_in_batch(job, view, plan)
        else:
            fit.fit_in_queue(job, view, plan)

    def _plan(self, job: Job, pipeline, known, pending: bool, wait: float, timing,
              batch: int, ahead: int) -> Plan:
        """Plan a goal for the time left after ``wait``, decoding in a batch of ``batch``."""
        job.expected_wait_s, job.expected_batch, job.expected_timing = wait, batch, timing
        try:
            return pipeline.planner.plan(job.request, len(job.prompt_ids),
                                         job.clock.remaining() - wait, known,
                                         pending=pending, timing=cached(pipeline, job, timing),
                                         spread=job.spread, engine_prefix=job.engine_prefix)
        except Rejection as exc:
            where = [f'after an expected {wait:.2f} s wait behind {ahead} goals'] \
                if wait > 0.0 else []
            if batch > 1:
                where.append(f'decoding in a batch of {batch}')
            if not where:
                raise
            raise Rejection(f'{", ".join(where)}: {exc.reason}', exc.plan) from None

    # -- re-plans on new information ------------------------------------------------------

    def plan_at_start(self, pipeline, job: Job, timing=None, batch: int = 1) -> tuple:
        """Return (plan, PrefillDecision or None) for a job about to run.

        ``timing`` is the ETE of the batch of ``batch`` it joins (None: it decodes
        alone). A goal whose length comes from its prefill is planned there; any other
        is re-planned when it waited longer than admission expected, joins another
        batch than it planned for, or when the goals waiting behind it need part of its
        time (``queue_planning``: core.queue_plan). Raise Rejection when that re-plan
        refuses it, or when it is expected to miss while others wait (``yield_if_late``).
        """
        self._refuse_if_lost(pipeline, job)
        share = self.share.of(pipeline, job)
        if self.length.in_prefill(pipeline, job.request):
            self.yield_if_late(pipeline, job, timing)
            predictor = self.server.predictor
            pooling = getattr(getattr(predictor, 'featurizer', None), 'pooling', 'last')
            return job.plan, PrefillDecision(
                predictor.prefill_layer, self._plan_in_prefill(pipeline, job, timing, share),
                whole_prompt=pooling != 'last')
        shared = self.share.plan(pipeline, job, timing, share) if share is not None else None
        if shared is not None:
            job.plan = with_job_notes(shared, job, pipeline)
        else:
            job.plan = self._replan_if_moved(pipeline, job, timing, batch)
        # Judged on the plan it runs: the admission plan of a goal that waited long may
        # not fit where its re-plan on a faster option does.
        self.yield_if_late(pipeline, job, timing)
        return job.plan, None

    def _replan_if_moved(self, pipeline, job: Job, timing, batch: int) -> Plan:
        """Return the plan for the time left when the goal waited or batches otherwise.

        Its admission plan when it starts as admission expected; raise Rejection when
        nothing fits what is left (and it may not try anyway).
        """
        waited = job.clock.elapsed() - job.expected_wait_s
        if abs(waited) <= REPLAN_AFTER_S and batch == job.expected_batch:
            return job.plan
        why = f'waited {job.clock.elapsed():.3f} s (expected {job.expected_wait_s:.3f} s)' \
            + (f', decodes in a batch of {batch} (planned {job.expected_batch})'
               if batch != job.expected_batch else '')
        try:
            plan = pipeline.planner.plan(job.request, len(job.prompt_ids),
                                         job.clock.remaining(),
                                         job.plan.predicted_tokens or None,
                                         timing=cached(pipeline, job, timing),
                                         spread=job.spread, engine_prefix=job.engine_prefix)
        except Rejection as exc:
            plan = self._best_effort_alone(job.request, timing, exc)
            if plan is None:
                raise Rejection(f'after {job.clock.elapsed():.3f} s in queue: {exc.reason}',
                                job.plan) from None
        plan = replanned(plan, f'at dispatch: {why}')
        return with_job_notes(plan, job, pipeline)

    def _refuse_if_lost(self, pipeline, job: Job) -> None:
        """Refuse at once a goal that not even its fastest option can serve in time.

        The cheap test before any re-plan (a burst leaves hundreds such at the queue's
        head, and each re-plan is the decode loop's time); the same conditions as
        ``yield_if_late``.
        """
        request = job.request
        if not self.config.yield_when_late or pipeline.online is None or (
                request.output.constrained and self.config.deadline_closure):
            return
        option, fastest_s = self.queue_fit(pipeline).fastest(job)
        left = job.clock.remaining()
        if fastest_s <= left:
            return
        waiting = self.server.dispatch.waiting()
        if waiting:
            raise Rejection(f'expected {fastest_s:.3f} s on its fastest option '
                            f'({option or "the full model"}) with {left:.3f} s left and '
                            f'{waiting} goals waiting for the model', job.plan)

    def yield_if_late(self, pipeline, job: Job, timing=None) -> None:
        """Refuse a goal about to start that is expected to miss while others wait.

        Raise Rejection with the expected time and the time left (``yield_when_late``):
        run, it would only take the model from goals that can still make theirs. Its
        prefill is not spent. A schema or grammar goal the deadline closure completes
        is served anyway.
        """
        request = job.request
        if not self.config.yield_when_late or (
                request.output.constrained and self.config.deadline_closure):
            return
        waiting = self.server.dispatch.waiting()
        if not waiting:
            return
        tokens = max(1.0, min(self.expected_tokens(job), float(request.max_new_tokens)))
        need = pipeline.planner.estimate_s(job.plan, tokens, cached(pipeline, job, timing),
                                           held=job.held_by_plan_engine)
        left = job.clock.remaining()
        if need > left:
            raise Rejection(f'expected {need:.3f} s (its prefill and an answer of {tokens:.0f} '
                            f'tokens, the recent mean) with {left:.3f} s left and {waiting} '
                            'goals waiting for the model', job.plan)

    def _plan_in_prefill(self, pipeline, job: Job, timing, share: tuple | None):
        """Return the prefill's plan maker: plan on the length its hidden states predict.

        ``share``: (seconds, why, fastest option) the goals waiting leave it (None: its
        own time); in prefill its engine is chosen, so only the seconds apply.
        """
        request, n_prompt = job.request, len(job.prompt_ids)
        left = job.clock.remaining()  # at the start of prefill, which the plan covers
        predictor = self.server.predictor

        def plan_from(hidden) -> Plan:
            predicted, raised = self.length.at_least_shortest(
                predictor.predict_from_hidden(hidden, request), '', request, job.grammar)
            note = raised or f'in prefill: {predicted} answer tokens predicted'
            plan = self.share.plan_for(pipeline, job, timing, predicted, share[0]) \
                if share is not None else None
            if plan is not None:
                note += f', {share[1]}'
            else:
                try:
                    plan = pipeline.planner.plan(request, n_prompt, left, predicted,
                                                 timing=cached(pipeline, job, timing),
                                                 engine_prefix=job.engine_prefix)
                except Rejection as exc:
                    plan = self._best_effort_alone(request, timing, exc)
                    if plan is None:
                        raise
            job.plan = with_job_notes(replanned(plan, note), job, pipeline)
            return job.plan  # admission now sees the predicted length of a running goal
        return plan_from

    def _best_effort_or_raise(self, job: Job, exc: Rejection) -> Plan:
        """Return the plan a refused goal runs on anyway on an idle node; else re-raise.

        Idle: no goal runs, waits or is being admitted (lock held); core.planning's
        ``best_effort`` says when a refused goal may try.
        """
        dispatch = self.server.dispatch
        idle = not (dispatch.running or dispatch.held or len(dispatch.queue))
        plan = best_effort(exc, job.request.policy, self.config.idle_best_effort and idle,
                           'node idle')
        if plan is None:
            raise exc
        return plan

    def _best_effort_alone(self, request, timing, exc: Rejection) -> Plan | None:
        """Return the plan a goal refused as it starts runs on anyway, or None.

        For a goal that starts alone (in a batch its steps would slow the running goals)
        with no goal waiting (core.planning's ``best_effort``).
        """
        alone = timing is None and not self.server.dispatch.waiting()
        return best_effort(exc, request.policy, self.config.idle_best_effort and alone,
                           'no goal waiting')
