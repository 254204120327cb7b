"""Run one planned request through an engine, applying the deadline rules per token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from timebill_ros.core.deadline import after_token, DeadlineClock, finished_outcome, Step
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Outcome, OverrunPolicy, Rejection, Request


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
    # Per decode step under early exit: 'full', 'threshold' or 'forced'.
    exit_kinds: list = field(default_factory=list)
    # Set when the plan was made during prefill (PrefillDecision).
    plan: Plan | None = None
    deferred_layers: int = 0
    # Decode step index from which a fallback precision ran (-1: none), and which.
    switched_at: int = -1
    switched_to: str = ''

    @property
    def decode_s(self) -> float:
        """Total time of decode steps (after the first token)."""
        return float(sum(self.step_times))


@dataclass(frozen=True)
class PrefillDecision:
    """A plan made while prefill runs, from the output of decoder layer ``layer`` (1-based).

    ``plan_from`` receives that layer's hidden states (batch 1, prompt, hidden)
    and returns the plan (or raises Rejection); the engine applies its eviction
    to every layer, the earlier ones after the fact.
    """

    layer: int
    plan_from: Callable[[object], Plan]


class Engine(Protocol):
    """A model runner: prefill then decode, calling ``on_token`` after every token."""

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, plan: Plan,
                 on_token: Callable[[TokenEvent], bool],
                 token_budget: Callable[[int], float | None] | None = None,
                 decide: PrefillDecision | None = None,
                 switch: Callable[[int], str] | None = None) -> GenerationStats:
        """Generate until EOS, ``max_new_tokens`` or ``on_token`` returns False.

        ``switch(i)`` names a precision decode step i and the rest run at ('' = stay).
        """


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


# (token, elapsed, remaining, plan in force)
Feedback = Callable[[TokenEvent, float, float, Plan], None]


def ended_before_start(clock: DeadlineClock, outcome: Outcome, reason: str,
                       plan: Plan = Plan()) -> JobResult:
    """Build the result of a goal that ends without running (skipped, canceled, killed)."""
    now = clock.now()
    return JobResult(outcome=outcome, deadline_met=False, reason=reason,
                     queue_s=clock.elapsed(now), e2e_s=clock.elapsed(now), plan=plan)


def run_job(engine: Engine, prompt_ids: Sequence[int], request: Request, plan: Plan,
            clock: DeadlineClock, cancel_requested: Callable[[], bool],
            on_feedback: Feedback, decide: PrefillDecision | None = None) -> JobResult:
    """Run a request now; stop at the first token boundary the rules say to stop at.

    With ``decide`` the plan is remade during prefill (``plan`` is then the
    admission plan); a Rejection from it ends the goal as REJECTED.
    """
    started = clock.now()
    queue_s = clock.elapsed(started)
    if cancel_requested():
        return ended_before_start(clock, Outcome.CANCELED, 'canceled before it started', plan)
    if request.policy == OverrunPolicy.KILL and clock.expired(started):
        return ended_before_start(
            clock, Outcome.KILLED,
            f'killed: deadline passed while queued ({queue_s:.3f} s in queue)', plan)

    parts: list = []
    last_step = [Step.CONTINUE]
    current = [plan]
    tracked = None
    if decide is not None:
        def plan_from(hidden) -> Plan:
            current[0] = decide.plan_from(hidden)
            return current[0]
        tracked = PrefillDecision(decide.layer, plan_from)

    def on_token(event: TokenEvent) -> bool:
        parts.append(event.text_delta)
        on_feedback(event, clock.elapsed(event.time), clock.remaining(event.time), current[0])
        last_step[0] = after_token(request.policy, clock, event.time, cancel_requested())
        return last_step[0] == Step.CONTINUE

    def token_budget(index: int) -> float:
        # Early exit: decode step ``index`` produces answer token index + 2; the time
        # left is shared by the tokens still to come (worst case), and a per-token
        # deadline caps that share.
        worst = current[0].worst_case_tokens or request.max_new_tokens
        to_come = max(1, worst - index - 1)
        share = max(0.0, clock.remaining()) / to_come
        return min(share, request.token_deadline_s) if request.token_deadline_s > 0 else share

    def switch(index: int) -> str:
        fallback = current[0].fallback
        if fallback is not None and fallback.due(index, clock.remaining()):
            return fallback.precision
        return ''

    try:
        stats = engine.generate(prompt_ids, request.max_new_tokens, plan, on_token,
                                token_budget, tracked, switch)
    except Rejection as exc:  # the plan made during prefill cannot meet the deadline
        now = clock.now()
        return JobResult(outcome=Outcome.REJECTED, deadline_met=False,
                         reason=f'after {clock.elapsed(now) - queue_s:.3f} s of prefill: '
                                f'{exc.reason}',
                         queue_s=queue_s, e2e_s=clock.elapsed(now),
                         plan=exc.plan if exc.plan is not None else current[0])
    except Exception as exc:  # noqa: BLE001 - any engine failure must end the goal cleanly
        now = clock.now()
        return JobResult(outcome=Outcome.FAILED, deadline_met=False,
                         reason=f'generation failed: {type(exc).__name__}: {exc}',
                         text=''.join(parts), queue_s=queue_s, e2e_s=clock.elapsed(now),
                         plan=current[0])
    finished = clock.now()
    outcome, met = finished_outcome(last_step[0], finished, clock)
    e2e = clock.elapsed(finished)
    return JobResult(
        outcome=outcome, deadline_met=met,
        reason=_reason(outcome, met, stats, clock.remaining(finished)),
        text=''.join(parts), tokens=stats.tokens, queue_s=queue_s,
        prefill_s=stats.prefill_s, decode_s=stats.decode_s, e2e_s=e2e,
        step_times=tuple(stats.step_times), plan=current[0],
        kv_tokens=stats.kv_tokens_after_prefill, exit_kinds=tuple(stats.exit_kinds),
        switched_at=stats.switched_at, switched_to=stats.switched_to)


def _reason(outcome: Outcome, met: bool, stats: GenerationStats, slack: float) -> str:
    if outcome == Outcome.CANCELED:
        return f'canceled by the caller after {stats.tokens} tokens'
    switched = f'; {stats.switched_to} decoding from answer token {stats.switched_at + 2}' \
        if stats.switched_at >= 0 else ''
    if outcome == Outcome.KILLED:
        return (f'killed at the deadline after {stats.tokens} tokens'
                f' ({-slack:.3f} s past it); text is partial{switched}')
    ending = {'eos': 'end of answer', 'max_tokens': 'max_new_tokens reached'}.get(
        stats.stop, stats.stop or 'end')
    if met:
        return f'completed in time ({ending}, {slack:.3f} s to spare){switched}'
    return f'completed {-slack:.3f} s after the deadline ({ending}){switched}'
