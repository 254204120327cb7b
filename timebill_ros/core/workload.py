# SPDX-License-Identifier: Apache-2.0
"""Request workloads for replay: arrival-time patterns and workload items (no ROS, no torch).

A workload is a list of ``WorkloadItem`` sorted by arrival offset. The fields
mirror the ``timebill_msgs/msg/Instruction`` message; values the node judges
itself (an empty instruction, a zero budget, a budget over ``max_budget_s``, an
unavailable mode) pass through unchanged so a workload can exercise rejections.
Only values the message cannot carry, and ids that would make responses
ambiguous, are refused with ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Sequence

import numpy as np

PATTERNS = ('periodic', 'poisson', 'burst')

# Instruction goal values (Instruct.action); kept here so the core needs no ROS import.
POLICIES = {'node_default': 0, 'kill': 1, 'skip_next': 2}
MODES = {'auto': 0, 'none': 1, 'eviction': 2, 'early_exit': 3}

# builtin_interfaces/Duration.sec is an int32.
MAX_BUDGET_S = float(2**31 - 1)
UINT8_MAX = 255
UINT32_MAX = 2**32 - 1

# Short, varied prompts for `timebill_bag write` without --instruction.
DEFAULT_INSTRUCTIONS = (
    'Say hello to the robot operator in one sentence.',
    'List three uses of a LiDAR sensor.',
    'Explain what a ROS 2 topic is in two sentences.',
    'Give a one-line status report for a warehouse robot.',
    'What is the capital of France?',
    'Summarise why deadlines matter for robot planning.',
)


@dataclass(frozen=True)
class WorkloadItem:
    """One request of a workload: an Instruction plus when it arrives."""

    id: str
    instruction: str
    budget_s: float
    arrival_s: float = 0.0
    context: str = ''
    policy: int = POLICIES['kill']
    mode: int = MODES['auto']
    # 0 = node default (as in the message).
    max_new_tokens: int = 0
    pessimistic_factor: float = 0.0
    # The goal's planning fields; 0 / '' = the node decides (as in the message).
    eviction_ratio: float = 0.0
    expected_tokens: int = 0
    token_deadline_s: float = 0.0
    precision: str = ''
    # The answer's form ('' = free text, as in the message).
    system_prompt: str = ''
    json_schema: str = ''
    grammar: str = ''

    def __post_init__(self):
        """Refuse values an Instruction message cannot carry."""
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f'id must be a non-empty string (got {self.id!r})')
        for name in ('instruction', 'context', 'precision', 'system_prompt', 'json_schema',
                     'grammar'):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f'{name} must be a string (got {getattr(self, name)!r})')
        _check_real('budget_s', self.budget_s)
        if not 0.0 <= self.budget_s <= MAX_BUDGET_S:
            raise ValueError(f'budget_s must be in [0, {MAX_BUDGET_S:.0f}] s '
                             f'(got {self.budget_s})')
        _check_real('arrival_s', self.arrival_s)
        if self.arrival_s < 0.0:
            raise ValueError(f'arrival_s must be >= 0 (got {self.arrival_s})')
        _check_int('policy', self.policy, 0, UINT8_MAX)
        _check_int('mode', self.mode, 0, UINT8_MAX)
        _check_int('max_new_tokens', self.max_new_tokens, 0, UINT32_MAX)
        _check_real('pessimistic_factor', self.pessimistic_factor)
        if self.pessimistic_factor < 0.0:
            raise ValueError(f'pessimistic_factor must be >= 0 (got {self.pessimistic_factor})')
        # The node judges a ratio over alpha_max or an unknown precision; a float32 and a
        # Duration carry any finite value, so only those are refused here.
        _check_real('eviction_ratio', self.eviction_ratio)
        _check_int('expected_tokens', self.expected_tokens, 0, UINT32_MAX)
        _check_real('token_deadline_s', self.token_deadline_s)
        if not 0.0 <= self.token_deadline_s <= MAX_BUDGET_S:
            raise ValueError(f'token_deadline_s must be in [0, {MAX_BUDGET_S:.0f}] s '
                             f'(got {self.token_deadline_s})')


def _check_real(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f'{name} must be a number (got {value!r})')
    if not math.isfinite(value):
        raise ValueError(f'{name} must be finite (got {value})')


def _check_int(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f'{name} must be an integer (got {value!r})')
    if not low <= value <= high:
        raise ValueError(f'{name} must be in [{low}, {high}] (got {value})')


def _check_count(count) -> None:
    _check_int('count', count, 0, 10**7)


def _check_positive(name: str, value) -> None:
    _check_real(name, value)
    if value <= 0.0:
        raise ValueError(f'{name} must be > 0 (got {value})')


def _check_start(start_s) -> None:
    _check_real('start_s', start_s)
    if start_s < 0.0:
        raise ValueError(f'start_s must be >= 0 (got {start_s})')


def periodic_arrivals(count: int, period_s: float, start_s: float = 0.0) -> np.ndarray:
    """Return ``count`` arrival offsets (s), one every ``period_s`` from ``start_s``."""
    _check_count(count)
    _check_positive('period_s', period_s)
    _check_start(start_s)
    return start_s + period_s * np.arange(count, dtype=float)


def poisson_arrivals(count: int, rate_hz: float, seed: int | None = None,
                     start_s: float = 0.0) -> np.ndarray:
    """Return ``count`` arrival offsets (s) of a Poisson process of ``rate_hz``.

    Gaps are exponential with mean ``1 / rate_hz``; the first arrival is one gap
    after ``start_s``. The same ``seed`` gives the same arrivals.
    """
    _check_count(count)
    _check_positive('rate_hz', rate_hz)
    _check_start(start_s)
    if seed is not None:
        _check_int('seed', seed, 0, 2**63 - 1)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_hz, size=count)
    return start_s + np.cumsum(gaps)


def burst_arrivals(count: int, burst_size: int, period_s: float, spacing_s: float = 0.0,
                   start_s: float = 0.0) -> np.ndarray:
    """Return ``count`` arrival offsets (s) in bursts of ``burst_size`` every ``period_s``.

    Requests within a burst are ``spacing_s`` apart (0: all at once); the last
    burst is partial when ``count`` is not a multiple of ``burst_size``.
    """
    _check_count(count)
    _check_int('burst_size', burst_size, 1, 10**7)
    _check_positive('period_s', period_s)
    _check_real('spacing_s', spacing_s)
    _check_start(start_s)
    if spacing_s < 0.0:
        raise ValueError(f'spacing_s must be >= 0 (got {spacing_s})')
    if spacing_s * (burst_size - 1) >= period_s:
        # Overlapping bursts would no longer be bursts.
        raise ValueError(f'a burst ({burst_size} requests {spacing_s} s apart) must be '
                         f'shorter than period_s ({period_s} s)')
    index = np.arange(count)
    return start_s + period_s * (index // burst_size) + spacing_s * (index % burst_size)


def arrivals(pattern: str, count: int, *, period_s: float | None = None,
             rate_hz: float | None = None, burst_size: int | None = None,
             spacing_s: float = 0.0, seed: int | None = None,
             start_s: float = 0.0) -> np.ndarray:
    """Return arrival offsets for a named pattern (``PATTERNS``) and its parameters."""
    if pattern == 'periodic':
        return periodic_arrivals(count, _required(pattern, 'period_s', period_s), start_s)
    if pattern == 'poisson':
        return poisson_arrivals(count, _required(pattern, 'rate_hz', rate_hz), seed, start_s)
    if pattern == 'burst':
        return burst_arrivals(count, _required(pattern, 'burst_size', burst_size),
                              _required(pattern, 'period_s', period_s), spacing_s, start_s)
    raise ValueError(f'unknown arrival pattern {pattern!r} (expected one of {PATTERNS})')


def _required(pattern: str, name: str, value):
    if value is None:
        raise ValueError(f'the {pattern} pattern needs {name}')
    return value


def make_workload(arrival_s: Sequence[float], budget_s: float | Sequence[float],
                  instructions: Sequence[str] = DEFAULT_INSTRUCTIONS, *,
                  policy: int = POLICIES['kill'], mode: int = MODES['auto'],
                  max_new_tokens: int = 0, context: str = '',
                  pessimistic_factor: float = 0.0, id_prefix: str = 'req',
                  eviction_ratio: float = 0.0, expected_tokens: int = 0,
                  token_deadline_s: float = 0.0, precision: str = '',
                  system_prompt: str = '', json_schema: str = '', grammar: str = '') -> list:
    """Return one WorkloadItem per arrival; instructions and budgets are cycled.

    Ids are ``<id_prefix>-0000``, ``<id_prefix>-0001``, ... in arrival order.
    """
    times = np.asarray(arrival_s, dtype=float)
    if times.ndim != 1:
        raise ValueError('arrival_s must be a flat sequence of offsets')
    if times.size and np.any(np.diff(times) < 0):
        raise ValueError('arrival_s must be non-decreasing')
    budgets = [budget_s] if np.isscalar(budget_s) else list(budget_s)
    if not budgets:
        raise ValueError('budget_s must name at least one budget')
    if isinstance(instructions, str):
        # A bare string would be cycled character by character.
        instructions = [instructions]
    instructions = list(instructions)
    if not instructions:
        raise ValueError('instructions must name at least one instruction')
    if not isinstance(id_prefix, str) or not id_prefix:
        raise ValueError('id_prefix must be a non-empty string')
    return [WorkloadItem(id=f'{id_prefix}-{i:04d}',
                         instruction=instructions[i % len(instructions)],
                         budget_s=float(budgets[i % len(budgets)]), arrival_s=float(t),
                         context=context, policy=policy, mode=mode,
                         max_new_tokens=max_new_tokens, pessimistic_factor=pessimistic_factor,
                         eviction_ratio=eviction_ratio, expected_tokens=expected_tokens,
                         token_deadline_s=token_deadline_s, precision=precision,
                         system_prompt=system_prompt, json_schema=json_schema, grammar=grammar)
            for i, t in enumerate(times)]


def check_workload(items: Sequence[WorkloadItem]) -> list:
    """Return the items sorted by arrival (stable); raise ValueError on duplicate ids.

    Responses are matched to requests by id, so ids must be unique.
    """
    seen = set()
    for item in items:
        if not isinstance(item, WorkloadItem):
            raise ValueError(f'not a WorkloadItem: {item!r}')
        if item.id in seen:
            raise ValueError(f'duplicate request id {item.id!r}')
        seen.add(item.id)
    return sorted(items, key=lambda item: item.arrival_s)
