# SPDX-License-Identifier: Apache-2.0
"""Goals still to come: the recent arrivals a starting goal's plan leaves room for.

Pure rules, no torch and no threads. The queue share (core/queue_plan.py) protects the
goals already waiting; under a steady stream (a perception node asking several times a
second, a burst still arriving) the goals that arrive while a slow, faithful answer runs
miss theirs just the same. So the last ``window_s`` of arrivals stand for the next ones:
at the rate they came, each with a deadline and a fastest-option time drawn in turn from
the recent ones. Only arrivals that found the node busy count (``contended``): a client
that waits for each answer before it asks again never competes with its own next goal,
and must not be planned as if it did. With few such arrivals the goals expected are far
apart and bind no plan (an idle node plans as before); with many they take the slack,
and a starting goal runs on a faster option.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
import itertools

from timebill_ros.core.queue_plan import Waiting

# A rate is never read off less than this span (two goals sent together are not a flood).
MIN_SPAN_S = 1.0


@dataclass(frozen=True)
class Arrival:
    """One accepted goal: when it arrived, its budget and its fastest-option time.

    ``contended``: another goal was running or waiting when it arrived.
    """

    at: float
    budget_s: float
    fastest_s: float
    contended: bool = True


class RecentArrivals:
    """The goals accepted in the last ``window_s`` seconds (0: none kept, none expected)."""

    def __init__(self, window_s: float):
        """Keep arrivals for ``window_s`` seconds."""
        self.window_s = window_s
        self._seen: deque = deque()

    def add(self, arrival: Arrival) -> None:
        """Record an accepted goal (callers serialise: the server's lock)."""
        if self.window_s > 0.0:
            self._seen.append(arrival)
            self._forget(arrival.at)

    def _forget(self, now: float) -> None:
        """Drop the arrivals older than the window."""
        while self._seen and self._seen[0].at < now - self.window_s:
            self._seen.popleft()

    def recent(self, now: float) -> list:
        """Return the contended arrivals within the window before ``now`` (oldest first)."""
        return [arrival for arrival in list(self._seen)
                if arrival.at >= now - self.window_s and arrival.contended]

    def rate(self, now: float) -> float:
        """Return goals per second over the window (or since its first arrival, >= 1 s)."""
        return self._rate(self.recent(now), now)

    def _rate(self, recent: list, now: float) -> float:
        """Return the rate of ``recent`` (this window's contended arrivals) at ``now``."""
        if not recent:
            return 0.0
        return len(recent) / min(self.window_s, max(MIN_SPAN_S, now - recent[0].at))

    def expected(self, now: float, until: float, limit: int) -> list:
        """Return the goals expected to arrive after ``now`` and before ``until``.

        At the recent rate, the k-th arriving at now + k / rate, with the deadline and
        fastest time of the k-th recent arrival (cycled); at most ``limit``.
        """
        recent = self.recent(now)
        rate = self._rate(recent, now)
        if not recent or rate <= 0.0 or limit <= 0:
            return []
        count = min(limit, int((until - now) * rate))
        templates = itertools.cycle(recent)
        return [Waiting(now + k / rate + template.budget_s, template.fastest_s)
                for k, template in zip(range(1, count + 1), templates)]
