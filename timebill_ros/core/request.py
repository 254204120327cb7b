# SPDX-License-Identifier: Apache-2.0
"""Requests, outcomes and goal validation, free of ROS and torch."""

from __future__ import annotations

from dataclasses import dataclass
import enum
import math

from timebill_ros.core.output import OutputSpec, validate_output


class Outcome(enum.IntEnum):
    """How a goal ended; values equal the Instruct result constants."""

    COMPLETED = 0
    KILLED = 1
    SKIPPED = 2
    REJECTED = 3
    CANCELED = 4
    FAILED = 5


class OverrunPolicy(enum.IntEnum):
    """What happens when a goal overruns its deadline."""

    KILL = 1
    SKIP_NEXT = 2


# Goal value asking for the node's default_policy parameter: 0, the field left unset
# (before 0.2.0 it was 2, and KILL was 0).
POLICY_NODE_DEFAULT = 0


class Mode(enum.IntEnum):
    """How the node may trade quality for time."""

    AUTO = 0
    NONE = 1
    EVICTION = 2
    EARLY_EXIT = 3


class Rejection(ValueError):
    """A goal cannot be accepted; ``reason`` is shown to the caller.

    ``plan`` is the infeasible plan when one was made (the estimate the reason cites).
    """

    def __init__(self, reason: str, plan=None):
        """Keep the reason as the exception message."""
        super().__init__(reason)
        self.reason = reason
        self.plan = plan


@dataclass(frozen=True)
class GoalSpec:
    """Raw goal fields as they arrive from an action goal or a topic message."""

    instruction: str
    context: str = ''
    budget_s: float = 0.0
    overrun_policy: int = POLICY_NODE_DEFAULT  # 0, as in an unset goal field
    mode: int = int(Mode.AUTO)
    max_new_tokens: int = 0
    pessimistic_factor: float = 0.0
    request_id: str = ''
    eviction_ratio: float = 0.0
    expected_tokens: int = 0
    token_deadline_s: float = 0.0
    precision: str = ''
    # The answer's form (core.output.validate_output's fields).
    system_prompt: str = ''
    history: tuple = ()  # ((role, content), ...)
    stop: tuple = ()
    temperature: float = 0.0
    top_p: float = 0.0  # 0 = 1
    seed: int = 0
    json_schema: str = ''
    grammar: str = ''


@dataclass(frozen=True)
class Limits:
    """Node-side limits and defaults used to validate goals."""

    max_budget_s: float = 600.0
    default_max_new_tokens: int = 128
    max_new_tokens_limit: int = 1024
    default_pessimistic_factor: float = 1.0
    default_policy: OverrunPolicy = OverrunPolicy.KILL
    supported_modes: frozenset = frozenset({Mode.AUTO, Mode.NONE})
    max_instruction_chars: int = 200_000
    alpha_max: float = 0.95
    # Precisions a goal may pin: the node's dtype and its resident copies.
    precisions: frozenset = frozenset({'float32'})


@dataclass(frozen=True)
class Request:
    """A validated goal with node defaults filled in."""

    instruction: str
    context: str
    budget_s: float
    policy: OverrunPolicy
    mode: Mode
    max_new_tokens: int
    pessimistic_factor: float
    request_id: str = ''
    # Fixed eviction ratio (0 = planner's choice) and caller's length estimate (0 = none).
    eviction_ratio: float = 0.0
    expected_tokens: int = 0
    # Per-token deadline D (s) for schedulability; 0 = none.
    token_deadline_s: float = 0.0
    # Pinned decode precision ('' = the planner's choice).
    precision: str = ''
    # Chat turns, stop strings, sampling, schema or grammar.
    output: OutputSpec = OutputSpec()


def _enum_value(enum_type, value, what: str):
    try:
        return enum_type(int(value))
    except (ValueError, TypeError):
        names = ', '.join(f'{m.name}={m.value}' for m in enum_type)
        raise Rejection(f'unknown {what} {value!r} (expected one of {names})') from None


def validate(spec: GoalSpec, limits: Limits) -> Request:
    """Check a goal's fields and fill node defaults; raise Rejection with a reason."""
    if not isinstance(spec.instruction, str) or not spec.instruction.strip():
        raise Rejection('empty instruction')
    if len(spec.instruction) + len(spec.context) > limits.max_instruction_chars:
        raise Rejection(
            f'instruction + context is {len(spec.instruction) + len(spec.context)} characters,'
            f' over the limit of {limits.max_instruction_chars}')
    budget = float(spec.budget_s)
    if not math.isfinite(budget):
        raise Rejection(f'budget is not finite ({budget})')
    if budget <= 0.0:
        raise Rejection(f'budget must be > 0 s (got {budget:g} s)')
    if budget > limits.max_budget_s:
        raise Rejection(
            f'budget {budget:g} s is over the node maximum of {limits.max_budget_s:g} s')
    if int(spec.overrun_policy) == POLICY_NODE_DEFAULT:
        policy = limits.default_policy
    else:
        policy = _enum_value(OverrunPolicy, spec.overrun_policy, 'overrun_policy')
    mode = _enum_value(Mode, spec.mode, 'mode')
    if mode not in limits.supported_modes:
        supported = ', '.join(sorted(m.name for m in limits.supported_modes))
        raise Rejection(f'mode {mode.name} is not available on this node (supported: {supported})')
    max_new = int(spec.max_new_tokens) or limits.default_max_new_tokens
    if max_new < 0 or max_new > limits.max_new_tokens_limit:
        raise Rejection(
            f'max_new_tokens {max_new} is outside 1..{limits.max_new_tokens_limit}')
    factor = float(spec.pessimistic_factor)
    if not math.isfinite(factor) or factor < 0.0:
        raise Rejection(f'pessimistic_factor must be finite and >= 0 (got {factor})')
    if factor == 0.0:
        factor = limits.default_pessimistic_factor
    elif factor < 1.0:
        raise Rejection(f'pessimistic_factor must be >= 1 or 0 for the default (got {factor:g})')
    ratio = float(spec.eviction_ratio)
    if not math.isfinite(ratio) or ratio < 0.0 or ratio > limits.alpha_max:
        raise Rejection(f'eviction_ratio must be in [0, {limits.alpha_max:g}] (got {ratio:g})')
    if ratio > 0.0 and mode != Mode.EVICTION:
        raise Rejection(f'a fixed eviction_ratio needs MODE_EVICTION (got mode {mode.name})')
    expected = int(spec.expected_tokens)
    if expected < 0:
        raise Rejection(f'expected_tokens must be >= 0 (got {expected})')
    token_deadline = float(spec.token_deadline_s)
    if not math.isfinite(token_deadline) or token_deadline < 0.0 or token_deadline > budget:
        raise Rejection(f'token_deadline must be in [0, budget {budget:g} s] '
                        f'(got {token_deadline:g} s)')
    precision = str(spec.precision or '').strip()
    if precision and precision not in limits.precisions:
        raise Rejection(f'precision {precision!r} is not available on this node (available: '
                        f'{", ".join(sorted(limits.precisions))}, or empty for the planner)')
    if precision and mode not in (Mode.AUTO, Mode.NONE):
        raise Rejection(f'a pinned precision needs MODE_AUTO or MODE_NONE (got {mode.name})')
    try:
        output = validate_output(spec.system_prompt, spec.history, spec.stop, spec.temperature,
                                 spec.top_p, spec.seed, spec.json_schema, spec.grammar)
    except ValueError as exc:
        raise Rejection(str(exc)) from None
    return Request(
        instruction=spec.instruction, context=spec.context or '', budget_s=budget,
        policy=policy, mode=mode, max_new_tokens=max_new, pessimistic_factor=factor,
        request_id=spec.request_id, eviction_ratio=ratio, expected_tokens=expected,
        token_deadline_s=token_deadline, precision=precision, output=output)


def check_prompt_fits(prompt_tokens: int, context_window: int) -> None:
    """Reject a prompt that leaves no room for even one answer token."""
    if prompt_tokens >= context_window:
        raise Rejection(
            f'prompt is {prompt_tokens} tokens, the model context window is {context_window}')
