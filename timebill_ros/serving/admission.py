"""Admission: validate a goal, predict its length and plan it once, for the time it will have.

A goal is planned once, against the time left after the work expected ahead of it
(queue-aware admission) and on the steps of the batch it will decode in. The
``~/plan`` service runs exactly this path without reserving a place. A later re-plan
happens only on new information (the real queue wait at dispatch, the length
predicted in its prefill), goes through ``Planner.plan`` again, and is written into
the plan's note with what changed.
"""

from __future__ import annotations

from dataclasses import replace
import time

from timebill_ros.core.context import ContextCutTable, KEEP_SHARES, reduce_context
from timebill_ros.core.deadline import closes_batch, DeadlineClock
from timebill_ros.core.execution import PrefillDecision
from timebill_ros.core.length import unpredicted
from timebill_ros.core.planning import cut_of, PENDING, Plan, TimeBillPlanner
from timebill_ros.core.request import (
    check_prompt_fits, Mode, OverrunPolicy, Rejection, validate)
from timebill_ros.core.scheduling import slot_starts
from timebill_ros.core.timing import with_cached_prefix
from timebill_ros.runtime.grammar import GrammarError
from timebill_ros.runtime.model import request_prompt_ids
from timebill_ros.serving.jobs import Job

# A dispatch this much later than admission expected is new information worth a re-plan.
REPLAN_AFTER_S = 0.005


class Admission:
    """Admit goals onto the dispatch queue, each planned once (``admit``)."""

    def __init__(self, server):
        """Admit for ``server`` (its pipeline, model, predictor, dispatch and learning)."""
        self.server = server
        self.predict_s = 0.0  # running mean of the length predictor's cost at admission
        self.text_s = 0.0  # the same of the text head (assembly.text_predictor)
        self.context_cut = ContextCutTable.load()  # fidelity per kept share of context

    @property
    def config(self):
        return self.server.config

    def admit(self, spec, key: str, reserve: bool = True) -> Job:
        """Validate, tokenize, predict and plan a goal; raise Rejection with the reason.

        With ``reserve`` the goal holds a place until it is queued (``Dispatch.start``).
        A goal whose length is predicted during its prefill is planned for a 1-token
        answer (rejected only if even that misses).
        """
        accepted_at = time.monotonic()  # the budget counts from arrival, validation included
        server, dispatch = self.server, self.server.dispatch
        if dispatch.closing:
            raise Rejection(f'not accepting goals: {dispatch.closing}')
        pipeline, loaded = server.pipeline, server.loaded
        request = validate(spec, pipeline.limits)
        clock = DeadlineClock(accepted_at, request.budget_s)
        ids = request_prompt_ids(loaded.tokenizer, request, loaded.tokenizer_lock)
        check_prompt_fits(len(ids), loaded.context_window)
        grammar = self._compile(request.output)
        # Earlier answers under the same schema say more than the free-text predictor.
        by_grammar = self._grammar_length(pipeline, request, grammar)
        pending = by_grammar is None and self.predicts_in_prefill(pipeline, request)
        known, how, spread = by_grammar or self._known_length(
            pipeline, request, len(ids), pending, clock.remaining())  # outside the lock
        known, how = self._at_least_shortest(known, how, request, grammar)
        job = Job(key=key, request=request, prompt_ids=ids, clock=clock, plan=Plan(
            prompt_tokens=len(ids), predicted_tokens=known or 0,
            predictor='' if known else PENDING), spread=spread,
            grammar=grammar)
        note_prefixes(job, pipeline)
        with dispatch.lock:
            dispatch.check_room_locked()
            try:
                self._plan_in_queue(job, pipeline, known, pending)
                self._reduce_if_worth_more(job, pipeline, known, pending)
            except Rejection as exc:
                try:
                    self._reduce_context_or_raise(job, pipeline, known, pending, exc)
                except Rejection:
                    job.plan = self._best_effort_or_raise(job, exc)
            job.length_note = how
            job.plan = with_job_notes(job.plan, job, pipeline)
            if reserve:
                dispatch.held[key] = job
        if pending and not reserve:
            self._preview_prefill_plan(job, pipeline)
        return job

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

    def predicts_in_prefill(self, pipeline, request) -> bool:
        """Say whether this goal's length comes from its own prefill's hidden states."""
        return (self.config.length_predictor_in_prefill and request.expected_tokens <= 0
                and isinstance(pipeline.planner, TimeBillPlanner)
                and on_torch_for_sure(pipeline.planner, request)
                and getattr(self.server.predictor, 'prefill_layer', 0) > 0)

    def _known_length(self, pipeline, request, n_prompt: int, pending: bool,
                      left_s: float) -> tuple:
        """Return (the length known at admission or None, how it was had, its spread).

        The predictor is skipped when its measured cost would take more than
        ``predictor_share`` of the ``left_s`` seconds left: the goal is then planned on
        the spread of recent answer lengths (``Learning.recent_lengths``; before enough
        have finished, the predictor's calibration over all its predictions).
        """
        if request.expected_tokens > 0:
            return request.expected_tokens, '', None
        if pending or not isinstance(pipeline.planner, TimeBillPlanner):
            return None, '', None
        if self.predict_s > self.config.predictor_share * left_s:
            return self._by_text(request, n_prompt, left_s) or self._skipped(pipeline, left_s)
        start = time.monotonic()
        predicted = int(pipeline.planner.predictor.predict(request, n_prompt))
        took = time.monotonic() - start
        self.predict_s = took if not self.predict_s else 0.8 * self.predict_s + 0.2 * took
        return predicted, '', None

    def _grammar_length(self, pipeline, request, grammar: str) -> tuple | None:
        """Return (length, note, spread) from earlier answers under this grammar, or None.

        None for free text, a caller's own length, or fewer than
        ``learning.SCHEMA_FINISHED_MIN`` earlier answers that ended by themselves.
        """
        if not grammar or request.expected_tokens > 0 \
                or not isinstance(pipeline.planner, TimeBillPlanner):
            return None
        spread = self.server.learning.grammar_lengths(grammar, request.max_new_tokens)
        if spread is None:
            return None
        median = max(1, round(spread.quantile(0.5, 0.0)))
        kind = 'schema' if request.output.json_schema else 'grammar'
        return median, (f'length from the spread of {spread.samples[0]} earlier answers to '
                        f'this {kind} (median {median} tokens), not the predictor'), spread

    def _at_least_shortest(self, known, how: str, request, grammar: str) -> tuple:
        """Return (length, note) raised to the grammar's shortest whole answer.

        A schema with required fields cannot be answered in fewer tokens: a free-text
        prediction below that would plan a goal too tight.
        """
        if not grammar or not known or request.expected_tokens > 0:
            return known, how
        shortest = min(self.server.grammars.shortest_answer(grammar), request.max_new_tokens)
        if known >= shortest:
            return known, how
        kind = 'schema' if request.output.json_schema else 'grammar'
        raised = (f'{known} answer tokens predicted, planned for {shortest}: the shortest '
                  f'answer the {kind} allows')
        return shortest, '; '.join(filter(None, [how, raised]))

    def _by_text(self, request, n_prompt: int, left_s: float) -> tuple | None:
        """Return (length, note, distribution) from the text head, or None when unfit.

        None when there is no text head, or when its own measured cost would also take
        over ``predictor_share`` of the time left.
        """
        text = self.server.assembly.text_predictor
        if text is None or self.text_s > self.config.predictor_share * left_s:
            return None
        start = time.monotonic()
        predicted, dist = text.calibrated(request, n_prompt)
        took = time.monotonic() - start
        self.text_s = took if not self.text_s else 0.8 * self.text_s + 0.2 * took
        why = (f'length predictor skipped (~{self.predict_s:.3f} s, over '
               f'{self.config.predictor_share:.0%} of the {left_s:.3f} s left): '
               f'{text.name} predicted {predicted} tokens in {took * 1e3:.0f} ms')
        return predicted, why, dist

    def _skipped(self, pipeline, left_s: float) -> tuple:
        """Return (length, note, spread) of a goal planned without its length predictor."""
        calibration = getattr(pipeline.planner.predictor, 'distribution', None)
        spread = self.server.learning.recent_lengths(
            unpredicted(calibration) if calibration is not None else None)
        why = (f'length predictor skipped (~{self.predict_s:.3f} s, over '
               f'{self.config.predictor_share:.0%} of the {left_s:.3f} s left)')
        if spread is None:
            typical = max(1, round(self.server.learning.typical_tokens))
            return typical, f'{why}: planned on the running mean, {typical} answer tokens', None
        median = max(1, round(spread.quantile(0.5, 0.0)))
        return median, (f'{why}: planned on the spread of {spread.samples[0]} recent answers '
                        f'(median {median} tokens)'), spread

    # -- the time ahead ---------------------------------------------------------------

    def expected_tokens(self, job: Job) -> float:
        """Return a job's predicted answer length (a running mean while it is pending)."""
        plan = job.plan
        known = plan.predicted_tokens and not plan.length_pending
        return plan.predicted_tokens if known else self.server.learning.typical_tokens

    def expected_s(self, job: Job, timing) -> float:
        """Return the estimated time of a job's predicted (not worst-case) answer."""
        return self.server.pipeline.planner.estimate_s(
            job.plan, self.expected_tokens(job), timing,
            held=job.held_by_plan_engine)

    def still_to_run_s(self, job: Job, timing, since: float, now: float) -> float:
        """Return the expected time a running job still holds the model.

        A Kill goal never runs past its deadline (a best-effort one planned longer is
        killed there); a Skip-Next goal may.
        """
        return _until_killed(job, self.expected_s(job, timing) - (now - since), now)

    def kv_of(self, job: Job) -> float:
        """Return a job's cache length halfway through its expected answer."""
        n_x = len(job.prompt_ids)
        return (1.0 - job.plan.eviction_ratio) * n_x + self.expected_tokens(job) / 2.0

    def member_timing(self, pipeline, size: int, others_kv: list, own_kv: float):
        """Return the ETE of a goal decoding with ``size`` - 1 others holding ``others_kv``."""
        single = pipeline.online.model
        if size <= 1:
            return single
        longest = max([own_kv, *others_kv])  # the batch pads every cache to the longest
        return pipeline.batch.model.member(single, size, (size - 1) * longest)

    def _plan_in_queue(self, job: Job, pipeline, known, pending: bool) -> None:
        """Plan a newcomer once for the time left after its expected wait (lock held).

        Expected times use predicted lengths, so a queue is not judged on worst
        cases. Raise Rejection when the plan refuses it, or when accepting it would
        push an accepted goal expected to meet its deadline past it.
        """
        if not self.config.queue_aware_admission or pipeline.online is None:
            job.plan = self._plan(job, pipeline, known, pending, 0.0, None, 1, 0)
        elif pipeline.batch is not None:  # batched decoding (max_batch > 1, profiled)
            self._fit_in_batch(job, pipeline, known, pending)
        else:
            self._fit_in_queue(job, pipeline, known, pending)

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

    def _fit_in_queue(self, job: Job, pipeline, known, pending: bool) -> None:
        """Queue-aware admission onto one decode slot (lock held).

        A running goal still in its prefill whose deadline is later than the newcomer's
        and than those of the goals queued ahead is overtaken (the loop starts an
        earlier deadline between its chunks): the newcomer does not wait for it, and is
        refused when the delay would push it past its deadline.
        """
        dispatch, model, now = self.server.dispatch, pipeline.online.model, time.monotonic()
        ahead, behind = dispatch.queue.ahead(job.waiting())
        waiting = [*dispatch.held.values(), *ahead]
        wait = sum(self.expected_s(other, model) for other in waiting)
        latest = max(other.clock.deadline for other in [job, *waiting])
        prefills, overtaken = dispatch.prefills_left(), []
        for running, since in dispatch.running.values():
            if running.key in prefills and running.clock.deadline > latest:
                overtaken.append((running, self.prefill_paused_rest_s(
                    running, model, prefills[running.key], now)))
            else:
                wait += self.still_to_run_s(running, model, since, now)
        job.plan = self._plan(job, pipeline, known, pending, wait, None, 1,
                              len(waiting) + len(dispatch.running) - len(overtaken))
        mine, start = self.expected_s(job, model), wait
        pushed = [other.key[:8] for other, rest in overtaken
                  if rest + wait <= other.clock.remaining(now) < rest + wait + mine]
        for other in behind:  # dispatch order: each starts after those before it
            end = start + self.expected_s(other, model)
            if end <= other.clock.remaining(now) < end + mine:
                pushed.append(other.key[:8])
            start = end
        self._refuse_if_pushed(job, pushed)

    def prefill_paused_rest_s(self, job: Job, timing, tokens_done: int, now: float) -> float:
        """Return what a goal still prefilling has left: its expected time less its chunks.

        Not from the time since it started: it may have been paused for others.
        """
        done_s = timing.prefill(tokens_done) - timing.prefill(0)
        return _until_killed(job, self.expected_s(job, timing) - done_s, now)

    def _fit_in_batch(self, job: Job, pipeline, known, pending: bool) -> None:
        """Admit a newcomer onto ``max_batch`` decode slots (lock held).

        The running goals hold slots for their expected remaining time; goals queued
        ahead take the first free slot in turn, and the newcomer the next one. It is
        planned on the steps of a batch as full as the goals then running or waiting
        allow (its own cache counted at its known length, no eviction). Refused when
        that plan refuses it; when joining (its prefill stalls the batch, and every
        step gets a member heavier) would push a running goal that is expected to make
        its deadline past it; or when, overtaking, it would delay a queued goal past
        its deadline. A running Skip-Next goal holds every slot until it ends
        (``closes_batch``); one still queued is counted as one slot.
        """
        dispatch, size, now = self.server.dispatch, pipeline.max_batch, time.monotonic()
        running = list(dispatch.running.values())
        ahead, behind = dispatch.queue.ahead(job.waiting())
        waiting = [*dispatch.held.values(), *ahead]
        batch = min(size, len(running) + len(waiting) + 1)  # the newcomer's batch, itself in
        kv = [self.kv_of(other) for other, _ in running] + [self.kv_of(o) for o in waiting]
        timing = self.member_timing(pipeline, batch, kv[:batch - 1], self.kv_of(job))
        # The running goals' remaining time at the batch they decode in now.
        current = self.member_timing(pipeline, len(running), kv[1:len(running)], kv[0]) \
            if running else timing
        left = [self.still_to_run_s(other, current, since, now)
                for other, since in running][:size]
        closing = [rest for (other, _), rest in zip(running, left)
                   if closes_batch(other.request.policy)]
        if closing:  # a running Skip-Next goal: no slot frees before it ends
            left = [max(rest, closing[0]) for rest in left] + \
                [closing[0]] * (size - len(left))
        queued = [self.expected_s(other, timing) for other in waiting]
        wait = slot_starts(left, size, [*queued, 0.0])[-1]
        alone = wait <= 0.0 and batch <= 1
        job.plan = self._plan(job, pipeline, known, pending, wait, None if alone else timing,
                              batch, len(waiting) + len(running))
        if wait <= 0.0 and running:
            self._refuse_if_joining_pushes(job, running, left, timing, current, now)
        after = [self.expected_s(other, timing) for other in behind]
        mine = self.expected_s(job, timing)
        with_it = slot_starts(left, size, [*queued, mine, *after])[len(queued) + 1:]
        without = slot_starts(left, size, [*queued, *after])[len(queued):]
        pushed = [other.key[:8] for other, start, alone_start, duration
                  in zip(behind, with_it, without, after)
                  if alone_start + duration <= other.clock.remaining(now) < start + duration]
        self._refuse_if_pushed(job, pushed)

    def _refuse_if_joining_pushes(self, job: Job, running: list, left: list, timing, current,
                                  now: float) -> None:
        """Refuse a newcomer whose joining now would push a running goal past its deadline.

        Each running goal's remaining steps get slower, and they wait out its prefill.
        """
        stall, pushed = timing.prefill(len(job.prompt_ids)), []
        for (other, _), rest in zip(running, left):
            kv_other = self.kv_of(other)
            slower = timing.step(kv_other) / max(current.step(kv_other), 1e-9)
            if rest <= other.clock.remaining(now) < rest * slower + stall:
                pushed.append(other.key[:8])
        self._refuse_if_pushed(job, pushed, 'joining the running batch')

    def _refuse_if_pushed(self, job: Job, pushed: list, why: str = '') -> None:
        if pushed:
            how = why or f'accepting it ahead of them ({self.server.dispatch.queue.name})'
            raise Rejection(f'{how} would push {len(pushed)} accepted goal(s) past their '
                            f'deadlines: {", ".join(pushed)}', job.plan)

    # -- re-plans on new information ------------------------------------------------------

    def plan_at_start(self, pipeline, job: Job, timing=None, batch: int = 1) -> tuple:
        """Return (plan, PrefillDecision or None) for a job about to run.

        ``timing`` is the ETE of the batch of ``batch`` it joins (None: it decodes
        alone). A goal whose length comes from its prefill is planned there; any other
        is re-planned only when it waited longer than admission expected or joins
        another batch than it planned for. Raise Rejection when that re-plan refuses it,
        or when it is expected to miss while others wait (``yield_if_late``).
        """
        self.yield_if_late(pipeline, job, timing)
        if self.predicts_in_prefill(pipeline, job.request):
            predictor = self.server.predictor
            pooling = getattr(getattr(predictor, 'featurizer', None), 'pooling', 'last')
            return job.plan, PrefillDecision(predictor.prefill_layer,
                                             self._plan_in_prefill(pipeline, job, timing),
                                             whole_prompt=pooling != 'last')
        waited = job.clock.elapsed() - job.expected_wait_s
        if abs(waited) <= REPLAN_AFTER_S and batch == job.expected_batch:
            return job.plan, None
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
        return with_job_notes(plan, job, pipeline), None

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

    def _plan_in_prefill(self, pipeline, job: Job, timing):
        """Return the prefill's plan maker: plan on the length its hidden states predict."""
        request, n_prompt = job.request, len(job.prompt_ids)
        left = job.clock.remaining()  # at the start of prefill, which the plan covers
        predictor = self.server.predictor

        def plan_from(hidden) -> Plan:
            predicted, raised = self._at_least_shortest(
                predictor.predict_from_hidden(hidden, request), '', request, job.grammar)
            try:
                plan = pipeline.planner.plan(request, n_prompt, left, predicted,
                                             timing=cached(pipeline, job, timing),
                                             engine_prefix=job.engine_prefix)
            except Rejection as exc:
                plan = self._best_effort_alone(request, timing, exc)
                if plan is None:
                    raise
            job.plan = with_job_notes(replanned(plan, raised or f'in prefill: {predicted} '
                                                'answer tokens predicted'), job, pipeline)
            return job.plan  # admission now sees the predicted length of a running goal
        return plan_from

    def _reduce_context_or_raise(self, job: Job, pipeline, known, pending: bool,
                                 refused: Rejection) -> None:
        """Plan a refused MODE_AUTO goal again on less of its context (lock held).

        ``context_reduction``: the largest share of KEEP_SHARES whose reduced prompt
        (core.context.reduce_context) fits becomes the goal's prompt, with the reason in
        its plan's note; when none fits the goal is as it was and ``refused`` is raised.
        """
        if not self._may_reduce(job.request):
            raise refused
        before = (job.request, job.prompt_ids, job.prefix_tokens, job.engine_prefix)
        for keep in KEEP_SHARES:
            reduced = self._plan_on_share(job, pipeline, known, pending, before[0], keep)
            if reduced is not None:
                job.context_note = self._reduced_words(job, reduced, keep, len(before[1])) + \
                    f': the whole context did not fit: {refused.reason}'
                return
        job.request, job.prompt_ids, job.prefix_tokens, job.engine_prefix = before
        raise refused

    def _reduce_if_worth_more(self, job: Job, pipeline, known, pending: bool) -> None:
        """Plan an admitted MODE_AUTO goal on less context where that is worth more (lock).

        A goal admitted on an unsure plan (a fast cut's low fidelity, a small P(fit)) is
        planned on each reduced context too; the first whose P(fit) x fidelity x the
        share's measured quality beats the whole context's P(fit) x fidelity is taken.
        Without it, a cut that fits a little (a 16-bit prefill at P(fit) 0.2) kept goals
        off the reduction that fits them surely.
        """
        whole = job.plan
        if not self._may_reduce(job.request) or whole.fit_probability >= 1.0:
            return
        worth = whole.fit_probability * self._fidelity(whole, pipeline)
        before = (job.request, job.prompt_ids, job.prefix_tokens, job.engine_prefix)
        for keep in KEEP_SHARES:
            reduced = self._plan_on_share(job, pipeline, known, pending, before[0], keep)
            if reduced is None:
                continue
            reduced_worth = job.plan.fit_probability * self._fidelity(job.plan, pipeline) \
                * self._likeness(keep)
            if reduced_worth > worth:
                job.context_note = self._reduced_words(job, reduced, keep, len(before[1])) + (
                    f': worth {reduced_worth:.2f} against the whole context\'s {worth:.2f} '
                    f'(P(fit) {whole.fit_probability:.2f} x fidelity '
                    f'{self._fidelity(whole, pipeline):.2f})')
                return
        job.request, job.prompt_ids, job.prefix_tokens, job.engine_prefix = before
        job.plan = whole

    def _likeness(self, keep: float) -> float:
        """Return how alike a ``keep`` share's answers are to the whole context's.

        As measured (ROUGE-L, like every cut's fidelity); a table of right answers only
        stands in, and with no table a reduced context counts half.
        """
        for measured in (self.context_cut.likeness_of(keep), self.context_cut.of(keep)):
            if measured is not None:
                return measured
        return 0.5

    @staticmethod
    def _fidelity(plan: Plan, pipeline) -> float:
        """Return the measured fidelity of the cut ``plan`` runs under (1: no table)."""
        context = getattr(pipeline.planner, 'context', None)
        if context is None:
            return 1.0
        return cut_of(plan, context).effect(context).quality

    def _may_reduce(self, request) -> bool:
        return self.config.context_reduction and request.mode == Mode.AUTO \
            and bool(request.context.strip())

    def _plan_on_share(self, job: Job, pipeline, known, pending: bool, request,
                       keep: float):
        """Plan ``job`` on ``keep`` of ``request``'s context; return the reduction or None.

        On None the job holds the reduced prompt still: the caller restores it.
        """
        reduced = reduce_context(request.context, request.instruction, keep)
        if reduced.kept >= reduced.total:
            return None
        loaded = self.server.loaded
        job.request = replace(request, context=reduced.text)
        job.prompt_ids = request_prompt_ids(loaded.tokenizer, job.request,
                                            loaded.tokenizer_lock)
        note_prefixes(job, pipeline)
        job.plan = replace(job.plan, prompt_tokens=len(job.prompt_ids))
        try:
            self._plan_in_queue(job, pipeline, known, pending)
        except Rejection:
            return None
        return reduced

    def _reduced_words(self, job: Job, reduced, keep: float, whole_tokens: int) -> str:
        """Return the note's account of a reduced context (the caller adds why)."""
        quality, likeness = self.context_cut.of(keep), self.context_cut.likeness_of(keep)
        return (f'context reduced to the {reduced.kept} of {reduced.total} sentences BM25 '
                f'ranks closest to the instruction ({keep:g} of its characters, '
                f'{len(job.prompt_ids)} of {whole_tokens} prompt tokens'
                + (f'; in measurement answers {likeness:.2f} alike (ROUGE-L) to the whole '
                   "context's" if likeness is not None else '')
                + (f'; {quality:.0%} of right answers kept in measurement' if quality
                   is not None else '') + ')')

    def _best_effort_or_raise(self, job: Job, exc: Rejection) -> Plan:
        """Return the plan a refused goal runs on anyway on an idle node; else re-raise.

        ``idle_best_effort``: a Kill goal whose best chance (the option fitting the
        largest share of its planned answer) fits at least one answer token runs on it
        when no goal runs, waits or is being admitted (lock held): the idle node loses
        nothing by trying, it is killed at its deadline if late, and a refusal would
        fail a goal the fastest engine may still answer. Refused only when no option
        fits a token, or when other goals need the node.
        """
        dispatch = self.server.dispatch
        idle = not (dispatch.running or dispatch.held or len(dispatch.queue))
        if not idle or not self._may_try(job.request, exc):
            raise exc
        return replace(exc.plan, note=f'best effort (Kill, node idle): {exc.reason}')

    def _may_try(self, request, exc: Rejection) -> bool:
        """Tell whether a refused goal may run as best effort (``idle_best_effort``).

        A Kill goal whose refusal carries a plan fitting at least one answer token;
        the callers add when the node counts as idle.
        """
        return self.config.idle_best_effort and request.policy == OverrunPolicy.KILL \
            and exc.plan is not None and exc.plan.fits_tokens >= 1

    def _best_effort_alone(self, request, timing, exc: Rejection) -> Plan | None:
        """Return the plan a goal refused as it starts runs on anyway, or None.

        ``idle_best_effort``, for a Kill goal that starts alone (in a batch its steps
        would slow the running goals) with no goal waiting, on its best chance when that
        fits at least one answer token.
        """
        if timing is not None or self.server.dispatch.waiting() \
                or not self._may_try(request, exc):
            return None
        return replace(exc.plan, note=f'best effort (Kill, no goal waiting): {exc.reason}')


def cached(pipeline, job: Job, timing):
    """Return the ETE to plan a goal with: its prefix-cached tokens need no prefill."""
    if not job.prefix_tokens or not isinstance(pipeline.planner, TimeBillPlanner):
        return timing
    return with_cached_prefix(timing or pipeline.planner.timing(), job.prefix_tokens)


def _until_killed(job: Job, rest_s: float, now: float) -> float:
    """Return ``rest_s`` (>= 0), no later than the deadline of a Kill goal.

    A Kill goal never runs past its deadline (a best-effort one planned longer is killed
    there); a Skip-Next goal may.
    """
    if job.request.policy == OverrunPolicy.KILL:
        rest_s = min(rest_s, job.clock.remaining(now))
    return max(0.0, rest_s)


def note_prefixes(job: Job, pipeline) -> None:
    """Set what of the job's prompt need not be prefilled.

    ``prefix_tokens``: in the torch prefix cache; ``engine_prefix``: in each other
    engine option's held prompt.
    """
    engine, ids = pipeline.engine, job.prompt_ids
    job.prefix_tokens = getattr(engine, 'cached_prefix', lambda ids: 0)(ids)
    job.engine_prefix = getattr(engine, 'cached_prefixes', lambda ids: {})(ids)


def on_torch_for_sure(planner, request) -> bool:
    """Tell whether a goal runs on the torch engine whatever its length (its prefill may plan).

    With another engine resident, an AUTO goal free to use it is planned before its
    prefill, which runs on the engine chosen; a goal pinned to that engine too.
    """
    engines = planner.context.engines
    if request.precision in engines:
        return False
    return not engines or request.mode != Mode.AUTO or bool(request.precision)


def prefix_note(job: Job) -> str:
    """Return what the plan says of the goal's prompt tokens in the prefix cache."""
    return f'{job.prefix_tokens} of {len(job.prompt_ids)} prompt tokens in the prefix cache'


def with_job_notes(plan: Plan, job: Job, pipeline) -> Plan:
    """Return ``plan`` with what admission did to the goal's prompt in its note.

    Every plan of the goal (admission's and each re-plan) says it: where its answer
    length came from when not the predictor (admission's note), the context reduced,
    and the prompt tokens it need not prefill (the held prompt of the engine option it
    runs on, or the torch prefix cache).
    """
    if job.length_note and job.length_note not in plan.note:
        plan = noted(plan, job.length_note)
    if job.context_note:
        plan = noted(plan, job.context_note)
    engines = getattr(getattr(pipeline.planner, 'context', None), 'engines', {})
    if plan.precision in engines:
        held = job.engine_prefix.get(plan.precision, 0)
        return noted(plan, f'{held} of {len(job.prompt_ids)} prompt tokens held by '
                           f'{plan.precision} from an earlier prompt') if held else plan
    return noted(plan, prefix_note(job)) if job.prefix_tokens else plan


def noted(plan: Plan, text: str) -> Plan:
    """Return ``plan`` with ``text`` added to its note."""
    return replace(plan, note='; '.join(filter(None, [plan.note, text])))


def replanned(plan: Plan, why: str) -> Plan:
    """Return ``plan`` with the re-plan and its reason recorded in its note."""
    return noted(plan, f're-planned {why}')
