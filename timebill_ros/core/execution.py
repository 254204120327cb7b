# SPDX-License-Identifier: Apache-2.0
"""One goal's token-boundary rules and results, for the one decode loop (serving/loop.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from timebill_ros.core.deadline import (
    after_token, closes_batch, DeadlineClock, finished_outcome, Step)
from timebill_ros.core.output import ENGINE_STOPS, StopReason
from timebill_ros.core.planning import Fallback, Plan
from timebill_ros.core.request import Outcome, OverrunPolicy, Rejection, Request


# The decode lane of the model's own precision (serving loop and engines share the key).
FULL_LANE = ('',)


@dataclass(frozen=True)
class TokenEvent:
    """One generated token as the engine reports it."""

    index: int
    token_id: int
    text_delta: str
    time: float


@dataclass
class GenerationStats:
    """What the engine measured while generating."""

    prefill_s: float = 0.0
    step_times: list = field(default_factory=list)
    tokens: int = 0
    stop: str = ''
    kv_tokens_after_prefill: int = 0
    prefix_tokens: int = 0  # prompt tokens reused from the prefix cache (not prefilled)
    # Per decode step under early exit: 'full', 'threshold' or 'forced'.
    exit_kinds: list = field(default_factory=list)
    # Set when the plan was made during prefill (PrefillDecision).
    plan: Plan | None = None
    deferred_layers: int = 0
    # Decode step index from which a fallback precision ran (-1: none), and which.
    switched_at: int = -1
    switched_to: str = ''
    # Most sequences decoded together in one step (1: alone).
    batch_peak: int = 1
    # The grammar's completion added without the model (deadline or max tokens), and
    # whether the answer conforms to its schema or grammar (free text: True).
    closure_text: str = ''
    closure_tokens: int = 0
    valid: bool = True
    # Why a goal was stopped before its deadline when not by its next step's length
    # (a replica failed and none can stream the rest in time): in the result's reason.
    stop_why: str = ''
    # Paused between two tokens for goals with earlier deadlines (preemptive EDF).
    pauses: int = 0
    paused_s: float = 0.0

    @property
    def decode_s(self) -> float:
        """Total time of decode steps (after the first token)."""
        return float(sum(self.step_times))


class PrefillInterrupted(Exception):
    """A chunked prefill stopped between chunks because the goal's rules said so."""

    def __init__(self, done: int, total: int, seconds: float = 0.0):
        """Record how many of the prompt's tokens were prefilled, in how many seconds."""
        super().__init__(f'prefill interrupted after {done} of {total} prompt tokens')
        self.done, self.total, self.seconds = done, total, seconds


@dataclass(frozen=True)
class PrefillDecision:
    """A plan made while prefill runs, from the output of decoder layer ``layer`` (1-based).

    ``plan_from`` receives that layer's hidden states (batch 1, prompt, hidden)
    and returns the plan (or raises Rejection); the engine applies its eviction
    to every layer, the earlier ones after the fact. A chunked prefill passes the last
    chunk's states (the prompt's last token is there); ``whole_prompt`` asks for one
    pass over the whole prompt (a predictor pooling over every token).
    """

    layer: int
    plan_from: Callable[[object], Plan]
    whole_prompt: bool = False


@dataclass
class JobResult:
    """Result of one goal, mirroring the Instruct result fields."""

    outcome: Outcome
    deadline_met: bool
    reason: str
    text: str = ''
    tokens: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    e2e_s: float = 0.0
    step_times: tuple = ()
    plan: Plan = field(default_factory=Plan)
    kv_tokens: int = 0
    exit_kinds: tuple = ()
    switched_at: int = -1
    switched_to: str = ''
    batch_peak: int = 1
    prefix_tokens: int = 0  # prompt tokens the prefix cache supplied (not prefilled)
    # A prefill stopped between chunks: the tokens it prefilled in prefill_s (the ETE
    # learns from them; 0: the whole prompt, or none).
    prefill_tokens: int = 0
    stop_reason: StopReason = StopReason.NONE
    valid: bool = False  # the text conforms to the goal's schema or grammar (free text: ran)


# How far past the deadline a decode step may be expected to end and still run (Kill).
KILL_AHEAD_S = 0.1

# (token, elapsed, remaining, plan in force)
Feedback = Callable[[TokenEvent, float, float, Plan], None]


def ended_before_start(clock: DeadlineClock, outcome: Outcome, reason: str,
                       plan: Plan = Plan()) -> JobResult:
    """Build the result of a goal that ends without running (skipped, canceled, killed)."""
    now = clock.now()
    return JobResult(outcome=outcome, deadline_met=False, reason=reason,
                     queue_s=clock.elapsed(now), e2e_s=clock.elapsed(now), plan=plan)


class JobRun:
    """One goal's token-boundary rules, for any decode loop (alone or in a batch).

    ``before_start`` ends a goal that was canceled or expired while queued;
    ``on_token`` streams a token and says whether to go on; ``finish`` builds the
    result from the engine's stats.
    """

    def __init__(self, request: Request, plan: Plan, clock: DeadlineClock,
                 cancel_requested: Callable[[], bool], on_feedback: Feedback,
                 on_overrun: Callable[[], None] | None = None):
        """Start the goal's run now (its queue time ends here).

        ``on_overrun`` is called once, at the goal's first token past its deadline
        under Skip-Next (the server's Skip-Next rule arms there).
        """
        self.request, self.plan, self.clock = request, plan, clock
        self.cancel_requested, self.on_feedback = cancel_requested, on_feedback
        self.on_overrun = on_overrun
        self.queue_s = clock.elapsed(clock.now())
        self.parts: list = []
        self.last = Step.CONTINUE

    def before_start(self) -> JobResult | None:
        """Return the result of a goal that must not start (canceled, expired), else None."""
        if self.cancel_requested():
            return ended_before_start(self.clock, Outcome.CANCELED,
                                      'canceled before it started', self.plan)
        if self.request.policy == OverrunPolicy.KILL and self.clock.expired():
            return ended_before_start(
                self.clock, Outcome.KILLED,
                f'killed: deadline passed while queued ({self.queue_s:.3f} s in queue)',
                self.plan)
        return None

    def closes_now(self, now: float, next_step_s: float) -> bool:
        """Tell whether a structured answer must be closed now, before the next step.

        When the next step (``next_step_s`` expected) would end past the deadline, under
        Kill and Skip-Next alike: the closure completes the structure in time, so Kill
        does not cut it and a Skip-Next goal does not overrun (nothing is skipped).
        """
        return self.clock.remaining(now) <= next_step_s

    def stops_ahead(self, now: float, next_step_s: float) -> bool:
        """Tell whether Kill stops the goal now, before a step expected to end too late.

        Under Kill, when the next step (``next_step_s`` expected) would end more than
        ``KILL_AHEAD_S`` past the deadline: its token would come too late to count, and
        a long step (a 16-bit copy's on a long cache: ~0.19 s here) would overrun by
        more than the lateness Kill allows. Steps shorter than that keep their photo
        finish.
        """
        if self.request.policy != OverrunPolicy.KILL or \
                next_step_s - self.clock.remaining(now) <= KILL_AHEAD_S:
            return False
        self.last = Step.KILL
        return True

    @property
    def killed(self) -> bool:
        """Tell whether Kill stopped the goal at its last token (not cancel, not the end)."""
        return self.last == Step.KILL

    def interrupt(self, next_chunk_s: float = 0.0) -> bool:
        """Tell whether a chunked prefill must stop before its next chunk.

        Canceled, or Kill once the next chunk (``next_chunk_s`` expected) would end past
        the deadline: a prompt that cannot be in the cache by then has no answer to give,
        and a chunk deep in a long prompt may take far longer than the one-token overrun
        Kill allows.
        """
        return self.cancel_requested() or (
            self.request.policy == OverrunPolicy.KILL
            and self.clock.remaining() <= next_chunk_s)

    def on_token(self, event: TokenEvent) -> bool:
        """Stream a token; return False when the rules stop the goal here."""
        self.parts.append(event.text_delta)
        if self.on_overrun is not None and self.request.policy == OverrunPolicy.SKIP_NEXT \
                and self.clock.expired(event.time):
            overrun, self.on_overrun = self.on_overrun, None
            overrun()  # before the feedback: a goal dispatched meanwhile is the next one
        self.on_feedback(event, self.clock.elapsed(event.time),
                         self.clock.remaining(event.time), self.plan)
        self.last = after_token(self.request.policy, self.clock, event.time,
                                self.cancel_requested())
        return self.last == Step.CONTINUE

    def wait_limit(self, longest_s: float) -> float:
        """Return the latest clock time the goal may wait for its next token.

        Under Kill its deadline; under Skip-Next its deadline plus ``longest_s`` (it may
        overrun, but not wait forever on a stream that fell silent).
        """
        overrun_s = longest_s if self.request.policy == OverrunPolicy.SKIP_NEXT else 0.0
        return self.clock.deadline + overrun_s

    def silent(self) -> None:
        """Stop a goal whose next token did not come by ``wait_limit``: Kill, or its cancel."""
        self.last = Step.CANCEL if self.cancel_requested() else Step.KILL

    def canceled(self) -> None:
        """Stop a goal whose stream ended on its cancel (or the node's shutdown)."""
        self.last = Step.CANCEL

    @property
    def closes_batch(self) -> bool:
        """Tell whether no goal may join while this one decodes (Skip-Next)."""
        return closes_batch(self.request.policy)

    def token_budget(self, index: int) -> float:
        """Return the seconds decode step ``index`` may take (early exit's exit rule).

        Step ``index`` produces answer token index + 2; the time left is shared by the
        tokens still to come (worst case), and a per-token deadline caps that share.
        """
        worst = self.plan.worst_case_tokens or self.request.max_new_tokens
        to_come = max(1, worst - index - 1)
        share = max(0.0, self.clock.remaining()) / to_come
        deadline = self.request.token_deadline_s
        return min(share, deadline) if deadline > 0 else share

    def switch_to(self, index: int, sharing: Callable[[Fallback], Fallback] | None) -> str:
        """Name the precision decode step ``index`` and the rest run at ('' = stay).

        ``sharing`` turns the plan's rule into the one for a goal whose tokens cost a
        round shared with other goals (None: it decodes alone).
        """
        fallback = self.plan.fallback
        if fallback is None:
            return ''
        rule = sharing(fallback) if sharing is not None else fallback
        return fallback.precision if rule.due(index, self.clock.remaining()) else ''

    def failed(self, exc: Exception) -> JobResult:
        """Return the result of a goal whose generation raised ``exc``."""
        now = self.clock.now()
        if isinstance(exc, Rejection):  # the plan made during prefill cannot meet the deadline
            return JobResult(outcome=Outcome.REJECTED, deadline_met=False,
                             reason=f'after {self.clock.elapsed(now) - self.queue_s:.3f} s of '
                                    f'prefill: {exc.reason}', stop_reason=StopReason.NONE,
                             queue_s=self.queue_s, e2e_s=self.clock.elapsed(now),
                             plan=exc.plan if exc.plan is not None else self.plan)
        if isinstance(exc, PrefillInterrupted):
            canceled = self.cancel_requested()
            late = self.clock.remaining(now)
            return JobResult(
                outcome=Outcome.CANCELED if canceled else Outcome.KILLED, deadline_met=False,
                reason=(f'canceled by the caller during prefill ({exc})' if canceled else
                        f'killed during prefill at the deadline ({exc}; {-late:.3f} s past it)'
                        if late <= 0 else
                        f'killed during prefill {late:.3f} s before the deadline: its next '
                        f'chunk would end past it ({exc})'),
                queue_s=self.queue_s, e2e_s=self.clock.elapsed(now), plan=self.plan,
                stop_reason=StopReason.CANCELED if canceled else StopReason.KILLED,
                prefill_s=exc.seconds, prefill_tokens=exc.done if exc.seconds > 0 else 0)
        return JobResult(outcome=Outcome.FAILED, deadline_met=False, stop_reason=StopReason.FAILED,
                         reason=f'generation failed: {type(exc).__name__}: {exc}',
                         text=''.join(self.parts), queue_s=self.queue_s,
                         e2e_s=self.clock.elapsed(now), plan=self.plan)

    def finish(self, stats: GenerationStats) -> JobResult:
        """Return the result of a goal whose generation ended."""
        finished = self.clock.now()
        outcome, met = finished_outcome(self.last, finished, self.clock)
        return JobResult(
            outcome=outcome, deadline_met=met,
            reason=_reason(outcome, met, stats, self.clock.remaining(finished)),
            text=''.join(self.parts), tokens=stats.tokens, queue_s=self.queue_s,
            prefill_s=stats.prefill_s, decode_s=stats.decode_s,
            e2e_s=self.clock.elapsed(finished), step_times=tuple(stats.step_times),
            plan=self.plan, kv_tokens=stats.kv_tokens_after_prefill,
            exit_kinds=tuple(stats.exit_kinds), switched_at=stats.switched_at,
            switched_to=stats.switched_to, batch_peak=stats.batch_peak,
            prefix_tokens=stats.prefix_tokens, stop_reason=_stop_reason(outcome, stats),
            valid=stats.valid)


def _stop_reason(outcome: Outcome, stats: GenerationStats) -> StopReason:
    if outcome == Outcome.CANCELED:
        return StopReason.CANCELED
    if stats.stop == 'closed':
        return StopReason.CLOSED_AT_DEADLINE
    if outcome == Outcome.KILLED:
        return StopReason.KILLED
    return ENGINE_STOPS.get(stats.stop, StopReason.END_OF_ANSWER)


def _reason(outcome: Outcome, met: bool, stats: GenerationStats, slack: float) -> str:
    if outcome == Outcome.CANCELED:
        return f'canceled by the caller after {stats.tokens} tokens'
    switched = f'; {stats.switched_to} decoding from answer token {stats.switched_at + 2}' \
        if stats.switched_at >= 0 else ''
    if stats.pauses:
        switched += (f'; paused {stats.pauses} time(s), {stats.paused_s:.3f} s in all, for '
                     'goals with earlier deadlines')
    closed = (f'; the grammar closed it with {stats.closure_tokens} tokens '
              f'{stats.closure_text!r} (shortest legal values, not the model\'s)'
              if stats.closure_tokens else '')
    if outcome == Outcome.KILLED:
        partial = 'text is complete by the closure' if stats.closure_tokens else \
            'text is partial'
        why = stats.stop_why or 'its next step would end past it'
        when = (f'at the deadline after {stats.tokens} tokens ({-slack:.3f} s past it)'
                if slack <= 0 else f'{slack:.3f} s before the deadline after {stats.tokens} '
                f'tokens: {why}')
        return f'killed {when}; {partial}{closed}{switched}'
    ending = {'eos': 'end of answer', 'max_tokens': 'max_new_tokens reached',
              'stop_string': 'stop sequence', 'closed': 'closed at the deadline'}.get(
        stats.stop, stats.stop or 'end') + closed
    if met:
        return f'completed in time ({ending}, {slack:.3f} s to spare){switched}'
    return f'completed {-slack:.3f} s after the deadline ({ending}){switched}'
