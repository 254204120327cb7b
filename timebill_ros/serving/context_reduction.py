# SPDX-License-Identifier: Apache-2.0
"""Context reduction: plan a MODE_AUTO goal on less of its context, when that serves it.

ROS-free. When the whole context does not fit the deadline, or fits only on an unsure
plan, admission (serving/admission.py) plans the goal again on the share of its context
BM25 ranks closest to the instruction (core.context.reduce_context), largest share
first, and keeps the first that fits (or that is worth more: P(fit) x fidelity x the
share's measured likeness). The reason goes into the plan's note.
"""

from __future__ import annotations

from dataclasses import replace

from timebill_ros.core.context import ContextCutTable, KEEP_SHARES, reduce_context
from timebill_ros.core.planning import cut_of, Plan
from timebill_ros.core.request import Mode, Rejection
from timebill_ros.runtime.model import request_prompt_ids
from timebill_ros.serving.jobs import Job
from timebill_ros.serving.plan_notes import note_prefixes


class ContextReduction:
    """Plan goals of one admission on reduced contexts (``context_reduction``)."""

    def __init__(self, admission):
        """Reduce for ``admission``; read the measured quality per kept share once."""
        self.admission = admission
        self.context_cut = ContextCutTable.load()  # fidelity per kept share of context

    @property
    def config(self):
        return self.admission.config

    def or_raise(self, job: Job, pipeline, known, pending: bool, refused: Rejection) -> None:
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

    def if_worth_more(self, job: Job, pipeline, known, pending: bool) -> None:
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
        loaded = self.admission.server.loaded
        job.request = replace(request, context=reduced.text)
        job.prompt_ids = request_prompt_ids(loaded.tokenizer, job.request,
                                            loaded.tokenizer_lock)
        note_prefixes(job, pipeline)
        job.plan = replace(job.plan, prompt_tokens=len(job.prompt_ids))
        try:
            self.admission._plan_in_queue(job, pipeline, known, pending)
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
