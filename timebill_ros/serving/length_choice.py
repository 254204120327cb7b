# SPDX-License-Identifier: Apache-2.0
"""Which answer length a local goal is planned on, chosen once at admission.

ROS-free. In order: the caller's own expected length; the spread of earlier answers to
the same schema or grammar; the length predictor in the goal's own prefill (the
target-layer head, when the goal surely runs on torch); the predictor at admission,
unless its measured cost would eat more than ``predictor_share`` of the time left (then
the text head, or the spread of recent answers). The predictor is not run at all when
its answer cannot change the plan and it costs more than ``WORTH_SKIPPING_S``: the
goal's whole ``max_new_tokens`` already fits on its most faithful option (the full
model, an engine as faithful within ``fidelity_tolerance``, or the option it pins), so
the spread of recent answers stands in for its length (a short goal's per-goal cost:
the target-layer head ran ~120 ms of CPU a goal beside the engine in bench_goal_rate).
A grammar's shortest whole answer is a floor. Where the length came from goes into
every plan's note.
"""

from __future__ import annotations

import time

from timebill_ros.core.length import unpredicted
from timebill_ros.core.planning import TimeBillPlanner
from timebill_ros.core.request import Mode, Rejection
from timebill_ros.serving.plan_notes import on_torch_for_sure

# A predictor whose measured cost is below this runs anyway: its length still informs
# the queue's expected times, and checking whether it could matter costs ~1 ms.
WORTH_SKIPPING_S = 0.005


class LengthChoice:
    """Choose local goals' answer lengths, keeping the predictors' measured costs."""

    def __init__(self, server):
        """Choose for ``server`` (the local executor: its predictor, learning, grammars)."""
        self.server = server
        self.predict_s = 0.0  # running mean of the length predictor's cost at admission
        self.text_s = 0.0  # the same of the text head (assembly.text_predictor)

    @property
    def config(self):
        return self.server.config

    def choose(self, pipeline, request, n_prompt: int, grammar: str, left_s: float) -> tuple:
        """Return (tokens or None, how, spread, pending: its prefill predicts it)."""
        # Earlier answers under the same schema say more than the free-text predictor.
        by_grammar = self._grammar_length(pipeline, request, grammar)
        pending = by_grammar is None and self.in_prefill(pipeline, request)
        known, how, spread = by_grammar or self._known_length(
            pipeline, request, n_prompt, pending, left_s)
        known, how = self.at_least_shortest(known, how, request, grammar)
        return known, how, spread, pending

    def in_prefill(self, pipeline, request) -> bool:
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
        if self.predict_s > WORTH_SKIPPING_S and \
                self._worst_case_fits(pipeline, request, n_prompt, left_s):
            return self._skipped(pipeline, request, (
                f'length predictor not run: all {request.max_new_tokens} answer tokens fit '
                'on its most faithful option, so no prediction could change the plan'))
        if self.predict_s > self.config.predictor_share * left_s:
            why = (f'length predictor skipped (~{self.predict_s:.3f} s, over '
                   f'{self.config.predictor_share:.0%} of the {left_s:.3f} s left)')
            return self._by_text(request, n_prompt, left_s) or \
                self._skipped(pipeline, request, why)
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

    def at_least_shortest(self, known, how: str, request, grammar: str) -> tuple:
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

    @staticmethod
    def _worst_case_fits(pipeline, request, n_prompt: int, left_s: float) -> bool:
        """Tell whether the whole ``max_new_tokens`` fits the whole model, uncut.

        On the option the goal pins, or on the engine the planner takes for it when its
        fidelity counts as the full model's (``fidelity_tolerance``: among those equally
        sure, the one holding the machine least runs, and a shorter answer changes
        neither); no eviction, early exit or mix of precisions. Then
        the length cannot change which option the plan takes (one planner call, ~1 ms,
        against the predictor's run).
        """
        try:
            plan = pipeline.planner.plan(request, n_prompt, left_s, request.max_new_tokens)
        except Rejection:
            return False
        uncut = plan.eviction_ratio == 0.0 and plan.mode != Mode.EARLY_EXIT \
            and not plan.precision_mix
        return uncut and (plan.precision == request.precision or (
            not request.precision and _as_faithful(pipeline.planner, plan.precision)))

    def _skipped(self, pipeline, request, why: str) -> tuple:
        """Return (length, note, spread) of a goal planned without its length predictor.

        The length is the recent answers' median (or mean), at most the goal's own
        ``max_new_tokens``: other goals' answers say nothing of a cap this one sets.
        """
        calibration = getattr(pipeline.planner.predictor, 'distribution', None)
        spread = self.server.learning.recent_lengths(
            unpredicted(calibration) if calibration is not None else None)
        if spread is None:
            typical = max(1, min(round(self.server.learning.typical_tokens),
                                 request.max_new_tokens))
            return typical, f'{why}: planned on the running mean, {typical} answer tokens', None
        median = max(1, min(round(spread.quantile(0.5, 0.0)), request.max_new_tokens))
        return median, (f'{why}: planned on the spread of {spread.samples[0]} recent answers '
                        f'(median {median} tokens)'), spread


def _as_faithful(planner, option: str) -> bool:
    """Tell whether ``option``'s measured fidelity counts as the full model's."""
    context = getattr(planner, 'context', None)
    if context is None:
        return False
    quality = context.effects.of_precision(option).quality
    return quality >= 1.0 - planner.settings.fidelity_tolerance - 1e-9
