# SPDX-License-Identifier: Apache-2.0
"""Learning from finished goals: online ETE refits, the ETE's error, and deadline telemetry."""

from __future__ import annotations

from collections import deque, OrderedDict
from dataclasses import replace
import threading

from timebill_ros.core.cut_kinds import handover_of
from timebill_ros.core.execution import JobResult
from timebill_ros.core.length import observed_distribution
from timebill_ros.core.planning import GRAMMAR_ANSWERS, MIXED
from timebill_ros.core.output import StopReason
from timebill_ros.core.request import Mode, Outcome
from timebill_ros.core.telemetry import GoalRecord, Telemetry
from timebill_ros.serving.engine_interface import FULL_LANE

# Weight of a finished answer in the running mean of answer lengths.
TYPICAL_WEIGHT = 0.1
# Answers whose lengths give the spread a goal is planned on without a prediction, and
# how many must have finished by themselves before it replaces the predictor's own.
RECENT_ANSWERS = 64
RECENT_FINISHED_MIN = 8
# Answers kept per schema or grammar (for that many grammars, least recently used out),
# and how many must have ended by themselves before their spread plans the next goal.
SCHEMA_ANSWERS = 32
SCHEMA_GRAMMARS = 64
SCHEMA_FINISHED_MIN = 3


class Learning:
    """Count goals, keep the running answer length and refit the ETEs online."""

    def __init__(self, window: int, dtype: str):
        """Keep telemetry over ``window`` goals; ``dtype`` names the model's own precision."""
        self._lock = threading.Lock()
        self.telemetry = Telemetry(window=window)
        self.dtype = dtype
        # Answer length assumed for a waiting goal whose length is predicted only in its
        # prefill: a running mean of finished answers.
        self.typical_tokens = 32.0
        self.last_precision = ''  # the last finished goal's decode precision (diagnostics)
        # (tokens, ended by itself, max_new_tokens) of the recent answers that ran.
        self._recent = deque(maxlen=RECENT_ANSWERS)
        self._spread = None  # their distribution, made on first use after a change
        # compiled grammar -> (tokens, ended by itself) of the answers under it
        self._by_grammar: OrderedDict = OrderedDict()

    def accepted(self) -> None:
        """Count a goal queued."""
        with self._lock:
            self.telemetry.accepted()

    def rejected(self, plan) -> None:
        """Count a goal refused at admission."""
        with self._lock:
            self.telemetry.rejected()
            if plan is not None and not plan.feasible:
                self.telemetry.deadline_rejection(plan.fit_probability)

    def finished(self, pipeline, job, result: JobResult) -> tuple:
        """Learn from and count a finished goal; return (ETE estimate s, its error %)."""
        estimate, error = learn_timing(pipeline, job, result)
        self.count(job, result, error if estimate else None)
        return estimate, error

    def count(self, job, result: JobResult, ete_error: float | None = None) -> None:
        """Count a finished goal in the telemetry and the recent answer lengths."""
        with self._lock:
            self.telemetry.finished(GoalRecord(result.outcome, result.deadline_met,
                                               result.e2e_s, result.step_times))
            if ete_error is not None:
                self.telemetry.ete_error(ete_error)
            if result.outcome == Outcome.REJECTED and not result.plan.feasible:
                self.telemetry.deadline_rejection(result.plan.fit_probability)
            if result.prefill_s > 0.0:
                plan = result.plan
                self.last_precision = plan.precision_text or handover_of(
                    plan.precision, plan.prefill_precision) or plan.precision or self.dtype
            if result.prefill_s > 0.0 and result.outcome != Outcome.FAILED \
                    and not result.prefill_tokens:
                self._answer_ran(result.tokens, result.outcome == Outcome.COMPLETED,
                                 job.request.max_new_tokens)
                if job.answer_form:
                    # Closed or cut at max_new_tokens: the model would have gone on.
                    self._grammar_answer(job.answer_form, result.tokens,
                                         result.stop_reason == StopReason.END_OF_ANSWER)
            if result.outcome == Outcome.COMPLETED:
                # Only finished answers have a true length (a killed one was cut short).
                self.typical_tokens += TYPICAL_WEIGHT * (result.tokens - self.typical_tokens)
                if result.plan.predicted_tokens:
                    self.telemetry.length_error(result.plan.predicted_tokens, result.tokens)

    def answer_ran(self, tokens: int, ended: bool, cap: int) -> None:
        """Count an answer of ``tokens`` that ended by itself or was cut short (``ended``)."""
        with self._lock:
            self._answer_ran(tokens, ended, cap)

    def _answer_ran(self, tokens: int, ended: bool, cap: int) -> None:
        self._recent.append((tokens, ended, cap))
        self._spread = None

    def grammar_answer_ran(self, grammar: str, tokens: int, ended: bool) -> None:
        """Count an answer of ``tokens`` under a compiled grammar (``ended`` by itself)."""
        with self._lock:
            self._grammar_answer(grammar, tokens, ended)

    def _grammar_answer(self, grammar: str, tokens: int, ended: bool) -> None:
        answers = self._by_grammar.pop(grammar, None) or deque(maxlen=SCHEMA_ANSWERS)
        answers.append((tokens, ended))
        self._by_grammar[grammar] = answers  # most recently used last
        while len(self._by_grammar) > SCHEMA_GRAMMARS:
            self._by_grammar.popitem(last=False)

    def grammar_lengths(self, grammar: str, ceiling: int):
        """Return the spread of earlier answers under this schema or grammar, or None.

        None until ``SCHEMA_FINISHED_MIN`` of them ended by themselves; answers closed
        or cut at their cap count as longer (``observed_distribution``; ``ceiling``
        is where the unknown tail goes: the goal's own cap).
        """
        with self._lock:
            answers = list(self._by_grammar.get(grammar, ()))
        finished = [tokens for tokens, ended in answers if ended]
        if len(finished) < SCHEMA_FINISHED_MIN:
            return None
        cut = [tokens for tokens, ended in answers if not ended]
        return observed_distribution(finished, cut, ceiling, source=GRAMMAR_ANSWERS)

    def recent_lengths(self, prior):
        """Return the spread of recent answer lengths to plan on without a prediction.

        Answers cut short count as longer than they got (``observed_distribution``).
        Until ``RECENT_FINISHED_MIN`` answers finished by themselves: ``prior`` (the
        length predictor's calibration over all its predictions; may be None).
        """
        with self._lock:
            finished = [tokens for tokens, ended, _ in self._recent if ended]
            if len(finished) < RECENT_FINISHED_MIN:
                return prior
            if self._spread is None:
                cut = [tokens for tokens, ended, _ in self._recent if not ended]
                self._spread = observed_distribution(
                    finished, cut, max(cap for *_, cap in self._recent))
            return self._spread

    def summary(self) -> dict:
        """Return the telemetry summary."""
        with self._lock:
            return self.telemetry.summary()

    @staticmethod
    def step_observer(pipeline):
        """Return the loop's step callback that refits the batch ETE (None without one)."""
        if pipeline.batch is None:
            return None

        def observe(lane: tuple, size: int, total_kv: int, seconds: float) -> None:
            if lane == FULL_LANE:
                pipeline.batch.observe(size, total_kv, seconds)
        return observe


def _modelled_steps(result: JobResult) -> bool:
    """Tell whether a goal's decode steps are the steps a single-goal ETE models.

    Exited steps are shorter than full-depth ones; batched steps have the batch
    model's own drift; a per-layer mix scales both ETEs.
    """
    return (result.plan.mode != Mode.EARLY_EXIT and result.batch_peak <= 1
            and result.plan.precision != MIXED)


def learn_timing(pipeline, job, result: JobResult) -> tuple:
    """Compare the ETE with what ran, then refit it online; return (estimate, error %).

    A goal whose prompt came partly from the prefix cache teaches its decode steps only
    (its prefill covered part of the prompt), and its ETE error is not counted.
    """
    estimate, error = _learn_timing(pipeline, job, result)
    return (0.0, 0.0) if result.prefix_tokens else (estimate, error)


def _learn_timing(pipeline, job, result: JobResult) -> tuple:
    online = pipeline.online
    if online is None or result.prefill_s <= 0.0:
        return 0.0, 0.0
    n_x = len(job.prompt_ids)
    if result.prefix_tokens:
        result = replace(result, prefill_s=0.0)
    own = pipeline.online_engines.get(result.plan.precision)
    # A handed-over goal prefilled on another engine (core.cut_kinds.EngineHandOver).
    prefilled = pipeline.online_engines.get(result.plan.prefill_precision) or own
    if result.prefill_tokens:  # stopped in prefill: its first tokens took prefill_s
        (prefilled or online).observe(result.prefill_tokens, result.prefill_s, 0, ())
        return 0.0, 0.0
    if own is not None:  # another engine: its own ETE learns its prefill and (solo) steps
        alone = result.batch_peak <= 1
        estimate = pipeline.planner.estimate_s(result.plan, result.tokens) if alone else 0.0
        steps = result.step_times if alone else ()
        if prefilled is not own:
            prefilled.observe(n_x, result.prefill_s, result.kv_tokens, ())
            own.observe(n_x, 0.0, result.kv_tokens, steps)
        else:
            own.observe(n_x, result.prefill_s, result.kv_tokens, steps)
        if not alone:
            return 0.0, 0.0
        return estimate, error_pct(estimate, result.prefill_s + result.decode_s)
    if not _modelled_steps(result):
        online.observe(n_x, result.prefill_s, result.kv_tokens, ())  # the prefill still counts
        return 0.0, 0.0
    switched = pipeline.online_variants.get(result.switched_to)
    variant = pipeline.online_variants.get(result.plan.precision)
    every = [online, *pipeline.online_variants.values()]

    def observe(ete, prefill_s: float, kv: int, steps) -> None:
        before = ete.drift_decode
        ete.observe(n_x, prefill_s, kv, steps)
        ete.share_decode_drift(every, before)  # the machine's speed moves every precision
    estimate = pipeline.planner.estimate_s(result.plan, result.tokens, online.model,
                                           result.switched_to if switched else '',
                                           result.switched_at)
    if switched is not None and result.switched_at >= 0:
        # Full-precision steps up to the switch, the fallback precision's after it.
        at, steps = result.switched_at, result.step_times
        observe(online, result.prefill_s, result.kv_tokens, steps[:at])
        observe(switched, 0.0, result.kv_tokens + at, steps[at:])
    elif variant is not None:
        # Prefill ran at full precision, the decode steps on the variant.
        online.observe(n_x, result.prefill_s, result.kv_tokens, ())
        observe(variant, 0.0, result.kv_tokens, result.step_times)
    else:
        observe(online, result.prefill_s, result.kv_tokens, result.step_times)
    return estimate, error_pct(estimate, result.prefill_s + result.decode_s)


def error_pct(estimate: float, actual: float) -> float:
    """Return the ETE's error in % of what ran (0 when nothing was timed).

    A goal whose prompt came from the prefix cache and that was killed after its first
    token timed neither a prefill nor a step: before this, its learning raised
    ZeroDivisionError (logged, the goal's timing lost).
    """
    return (estimate - actual) / actual * 100.0 if actual > 0.0 else 0.0
