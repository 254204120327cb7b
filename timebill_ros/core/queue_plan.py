# SPDX-License-Identifier: Apache-2.0
"""Planning against the queue: how long a goal starting now may take, for those behind it.

Pure rules, no torch and no threads. A goal planned for itself takes the most faithful
option that fits its own deadline, and the goals waiting behind it may then miss theirs
where a faster option would have served them all. So a goal that starts while others
wait is planned for the time that leaves them theirs: the goals behind it that can
still meet (the most of them, Moore-Hodgson over EDF order, each on its fastest
option) keep their latest start times, and the goal must end before the first of
them. Quality is spent only where that schedule has slack; with none waiting the plan
is as before. The loop then runs the queue in EDF order (core/scheduling.py,
core/preemption.py).
"""

from __future__ import annotations

from dataclasses import dataclass
import heapq
import math
from typing import Sequence

# The live goals behind a starting goal that its plan looks at (EDF order). A burst puts
# hundreds behind with the same deadline; a window shorter than them sees a schedule with
# room where there is none (with 32, a 30-s goal in a 500-goal burst took the full model
# for 0.77 s of the 0.16 s its fastest option needed). Moore-Hodgson on a heap keeps 512
# at about a millisecond.
LOOK_BEHIND = 512


@dataclass(frozen=True)
class Waiting:
    """A goal waiting behind: its deadline and its service time on its fastest option."""

    deadline: float
    fastest_s: float


@dataclass(frozen=True)
class QueueBudget:
    """When a starting goal must end so that the goals behind it still meet.

    ``finish_by``: absolute time (its own deadline when nothing behind binds it);
    ``protected``: the goals behind that can meet if it ends by then; ``waiting``:
    the goals looked at.
    """

    finish_by: float
    protected: int
    waiting: int

    def binds(self, deadline: float) -> bool:
        """Tell whether the queue leaves the goal less time than its own deadline."""
        return self.protected > 0 and self.finish_by < deadline


def most_on_time(start: float, jobs: Sequence[Waiting]) -> list:
    """Return the most ``jobs`` one server finishes by their deadlines from ``start``.

    Moore-Hodgson: in deadline order; whenever the running end passes a deadline, drop
    the longest job kept so far (a heap of the kept, longest first). Returned in
    deadline order.
    """
    ordered = sorted(jobs, key=lambda job: job.deadline)
    kept, end = [], start  # heap of (-seconds, position)
    for position, job in enumerate(ordered):
        heapq.heappush(kept, (-job.fastest_s, position))
        end += job.fastest_s
        if end > job.deadline:
            end += heapq.heappop(kept)[0]
    return [ordered[position] for position in sorted(position for _, position in kept)]


def queue_budget(now: float, deadline: float, fastest_s: float,
                 behind: Sequence[Waiting]) -> QueueBudget:
    """Return when a goal starting ``now`` must end for the goals ``behind`` it.

    ``fastest_s``: its own time on its fastest option; the goals behind that cannot
    meet even after that are not protected (they are lost whatever it runs on).
    """
    behind = sorted(behind, key=lambda job: job.deadline)[:LOOK_BEHIND]
    kept = most_on_time(now + fastest_s, behind)
    latest_start = math.inf
    for job in reversed(kept):
        latest_start = min(latest_start, job.deadline) - job.fastest_s
    return QueueBudget(min(deadline, latest_start), len(kept), len(behind))
