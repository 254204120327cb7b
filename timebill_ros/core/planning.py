"""Inference plans and the planner interface the node calls before running a goal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from timebill_ros.core.request import Mode, Request


@dataclass(frozen=True)
class Plan:
    """How one request will be run; mirrors msg/InferencePlan (zeros = not planned)."""

    mode: Mode = Mode.NONE
    prompt_tokens: int = 0
    predicted_tokens: int = 0
    predictor: str = ''
    worst_case_tokens: int = 0
    pessimistic_factor: float = 0.0
    eviction_ratio: float = 0.0
    press: str = ''
    est_prefill_s: float = 0.0
    est_decode_s: float = 0.0
    est_wcet_s: float = 0.0
    feasible: bool = True


class Planner(Protocol):
    """Anything that turns a request into a plan (or raises Rejection)."""

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float) -> Plan:
        """Plan a request whose prompt has ``prompt_tokens`` with ``time_left_s`` to go."""


class FullModelPlanner:
    """Run every request at full quality: no estimate, no eviction (MODE_NONE)."""

    name = 'full-model'

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float) -> Plan:
        """Return a plan that only records the prompt length and the mode."""
        return Plan(mode=Mode.NONE, prompt_tokens=prompt_tokens,
                    pessimistic_factor=request.pessimistic_factor)
