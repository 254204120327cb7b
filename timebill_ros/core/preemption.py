# SPDX-License-Identifier: Apache-2.0
"""Preemptive EDF at token boundaries: which decoding goal pauses for an earlier deadline.

Pure rules, no torch and no threads. The decode loop (serving/loop.py) asks ``to_pause``
between two tokens; admission (core/queue_fit.py) counts the same goals as overtaken,
so the two agree on who waits for whom. A paused goal keeps its KV cache (a llama.cpp
sequence, a torch lane's cache) and resumes when no waiting goal has an earlier deadline
(``resumes_before``); its own deadline still holds while it waits (Kill ends it there).
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Sequence


def loop_seats(capacity: int) -> int:
    """Return the goals one decode loop of ``capacity`` holds: its caches (KV seats).

    ``capacity`` decoding, as many more in their prefill (goals with earlier deadlines
    overtake a long prefill), and one more so that a goal with an earlier deadline can
    still pause a decoding one while another prefills (without it a long goal decoding
    beside a long prefill held the loop for seconds while short goals died queued:
    results/traces/poisson_auto_logged). A llama.cpp context holds this many sequences.
    """
    return 2 * max(1, capacity) + 1


@dataclass(frozen=True)
class Decoding:
    """A goal decoding in the loop, as the pause rule sees it.

    ``pausable``: its lane can give its cache back and take it again (not an early-exit
    lane) and its policy lets others in (not Skip-Next, which holds the loop alone).
    """

    key: str
    deadline: float
    pausable: bool


def to_pause(decoding: Sequence[Decoding], earliest_waiting: float,
             seats_free: int) -> str | None:
    """Return the key of the goal to pause so that a waiting goal may start, or None.

    The waiting goal with the earliest deadline (``earliest_waiting``; inf: none waits)
    displaces the pausable goal with the latest deadline when that deadline is later
    than its own (EDF). A paused goal keeps its cache, so one is paused only while a
    cache seat is free for the newcomer (``seats_free``: llama.cpp sequences left).
    """
    if seats_free <= 0 or earliest_waiting == math.inf:
        return None
    later = [goal for goal in decoding if goal.pausable and goal.deadline > earliest_waiting]
    if not later:
        return None
    return max(later, key=lambda goal: goal.deadline).key


def resumes_before(paused_deadlines: Sequence[float]) -> float:
    """Return the deadline a waiting goal must beat to start before the paused goals resume.

    The paused goal with the earliest deadline resumes first; a waiting goal with an
    earlier deadline still goes before it (EDF over both). inf when none is paused.
    """
    return min(paused_deadlines, default=math.inf)
