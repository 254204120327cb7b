# SPDX-License-Identifier: Apache-2.0
"""Deadline clock and the Kill / Skip-Next rules, on the monotonic clock."""

from __future__ import annotations

from dataclasses import dataclass
import enum
import time
from typing import Callable

from timebill_ros.core.request import Outcome, OverrunPolicy


Clock = Callable[[], float]


@dataclass(frozen=True)
class DeadlineClock:
    """Absolute deadline of one goal; the clock starts at goal acceptance."""

    accepted_at: float
    budget_s: float
    clock: Clock = time.monotonic

    @classmethod
    def start(cls, budget_s: float, clock: Clock = time.monotonic) -> 'DeadlineClock':
        """Start the deadline clock now."""
        return cls(accepted_at=clock(), budget_s=budget_s, clock=clock)

    @property
    def deadline(self) -> float:
        """Absolute monotonic time of the deadline."""
        return self.accepted_at + self.budget_s

    def now(self) -> float:
        """Read the clock."""
        return self.clock()

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since acceptance."""
        return (self.now() if now is None else now) - self.accepted_at

    def remaining(self, now: float | None = None) -> float:
        """Seconds left until the deadline (negative once passed)."""
        return self.deadline - (self.now() if now is None else now)

    def expired(self, now: float | None = None) -> bool:
        """Tell whether the deadline is reached (at or after it)."""
        return self.remaining(now) <= 0.0


class Step(enum.Enum):
    """What the decode loop does after a token."""

    CONTINUE = 'continue'
    KILL = 'kill'
    CANCEL = 'cancel'


def after_token(policy: OverrunPolicy, clock: DeadlineClock, now: float,
                cancel_requested: bool) -> Step:
    """Decide at a token boundary; cancel wins, Kill stops at or after the deadline."""
    if cancel_requested:
        return Step.CANCEL
    if policy == OverrunPolicy.KILL and clock.expired(now):
        return Step.KILL
    return Step.CONTINUE


def finished_outcome(step: Step, finished_at: float, clock: DeadlineClock) -> tuple:
    """Return (outcome, deadline_met) for a goal whose generation ended with ``step``.

    deadline_met is read from the clock: a goal that completes late is honest
    about it, and a killed or canceled goal never met its deadline.
    """
    if step == Step.CANCEL:
        return Outcome.CANCELED, False
    if step == Step.KILL:
        return Outcome.KILLED, False
    return Outcome.COMPLETED, finished_at <= clock.deadline


def closes_batch(policy: OverrunPolicy) -> bool:
    """Tell whether a goal under ``policy`` lets no other goal join its batch.

    Skip-Next charges an overrun to the goal dispatched next. Under batching that goal
    would join beside it and never be "next", so while a Skip-Next goal decodes no goal
    joins; those waiting are dispatched when it ends, the first skipped if it overran.
    """
    return policy == OverrunPolicy.SKIP_NEXT


class SkipNext:
    """The one Skip-Next rule, for every executor (local engines and replicas alike).

    A Skip-Next goal past its deadline runs on to its end. It arms the skip at its first
    token after the deadline (``overran``), or when it completes late (``ended``); the
    next goal dispatched, while it still runs or after it ends, gives its turn up
    (``take``). When the late goal ends with no goal waiting, the skip is dropped: a goal
    that arrives after it ended owes it nothing.
    """

    def __init__(self):
        """Start with nothing to skip."""
        self._by = ''  # the key of the goal whose overrun the next dispatch pays for

    def overran(self, key: str) -> None:
        """Note that Skip-Next goal ``key`` is still running past its deadline."""
        if not self._by:
            self._by = key

    def ended(self, key: str, overran: bool, waiting: int) -> None:
        """Note the end of goal ``key`` (``overran``: late under Skip-Next); ``waiting`` wait."""
        if overran and not self._by:
            self._by = key
        if self._by == key and waiting == 0:
            self._by = ''

    def take(self) -> str:
        """Return the skip reason for the goal being dispatched, or '' to run it."""
        by, self._by = self._by, ''
        return f'skipped: previous goal {by[:8]} overran its deadline (Skip-Next)' if by else ''


def overran(policy: OverrunPolicy, outcome: Outcome, deadline_met: bool) -> bool:
    """Tell whether a finished goal overran under Skip-Next (it completed late)."""
    return (policy == OverrunPolicy.SKIP_NEXT and outcome == Outcome.COMPLETED
            and not deadline_met)
