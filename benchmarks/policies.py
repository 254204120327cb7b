# SPDX-License-Identifier: Apache-2.0
"""Replay measured runs under the Kill and Skip-Next overrun policies (pure Python).

A run is one real execution through the node with time to spare: its end-to-end
time and the quality of its full answer. Replaying it under a budget B says what the
same execution would have scored with that deadline, without running it again:

- Kill: the answer counts only if it finished by the deadline; otherwise the node
  stops it at the deadline and it scores 0 (as in TimeBill).
- Skip-Next: jobs are released every ``period`` seconds, each with deadline
  release + B; one job runs at a time, in release order. An overrunning job runs to
  its end (late, scoring 0: a late answer is a failure) and, if the next job has
  been released by then, that job is skipped (scores 0), as the node's
  core.deadline.SkipNext does when one goal runs at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Sequence

IN_TIME, KILLED, LATE, SKIPPED = 'in_time', 'killed', 'late', 'skipped'


@dataclass(frozen=True)
class Run:
    """One measured execution: time from start to the last token, and its answer's score."""

    e2e_s: float
    score: float

    def __post_init__(self):
        """Reject impossible measurements."""
        if not math.isfinite(self.e2e_s) or self.e2e_s < 0.0:
            raise ValueError(f'e2e_s must be finite and >= 0 (got {self.e2e_s})')
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f'score must be in [0, 1] (got {self.score})')


@dataclass(frozen=True)
class Outcome:
    """What a job got under a policy: its status and the score it counts for."""

    status: str
    score: float
    finish_s: float = 0.0


def kill(run: Run, budget_s: float) -> Outcome:
    """Return the outcome of ``run`` under Kill with ``budget_s``."""
    _check_budget(budget_s)
    if run.e2e_s <= budget_s:
        return Outcome(IN_TIME, run.score, run.e2e_s)
    return Outcome(KILLED, 0.0, budget_s)


def skip_next(runs: Sequence[Run], budget_s: float, period_s: float) -> list:
    """Return one Outcome per job of a periodic release sequence under Skip-Next."""
    _check_budget(budget_s)
    if not math.isfinite(period_s) or period_s <= 0.0:
        raise ValueError(f'period must be finite and > 0 (got {period_s})')
    outcomes, free, skip_armed = [], 0.0, False
    for index, run in enumerate(runs):
        release = index * period_s
        if skip_armed and release <= free:
            outcomes.append(Outcome(SKIPPED, 0.0, free))
            skip_armed = False
            continue
        skip_armed = False
        start = max(release, free)
        free = start + run.e2e_s
        if free <= release + budget_s:
            outcomes.append(Outcome(IN_TIME, run.score, free))
        else:
            outcomes.append(Outcome(LATE, 0.0, free))
            skip_armed = True
    return outcomes


def summary(outcomes: Sequence[Outcome]) -> dict:
    """Return completion rate (in time) and average score over ``outcomes``."""
    n = len(outcomes)
    if n == 0:
        return {'jobs': 0, 'completion_rate': float('nan'), 'avg_score': float('nan')}
    return {'jobs': n,
            'completion_rate': sum(o.status == IN_TIME for o in outcomes) / n,
            'avg_score': sum(o.score for o in outcomes) / n}


def _check_budget(budget_s: float) -> None:
    if not math.isfinite(budget_s) or budget_s <= 0.0:
        raise ValueError(f'budget must be finite and > 0 (got {budget_s})')
