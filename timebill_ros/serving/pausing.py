# SPDX-License-Identifier: Apache-2.0
"""Goals paused between two tokens for earlier deadlines (preemptive EDF in the loop).

ROS-free. The decode loop (serving/loop.py) hands a goal here with its lane's cache and
next position (``lane.take``: a llama.cpp sequence keeps its KV cells, a torch lane
gives the goal's own cache back); the goal resumes in the same lane (``lane.join``) and
goes on from its next token. While paused its rules still hold: a Kill goal ends at its
deadline, a canceled goal at once, within one round of the loop. Who pauses and when
is the pure rule in core/preemption.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from timebill_ros.core.preemption import resumes_before
from timebill_ros.serving.members import Member


@dataclass(eq=False)
class Paused:
    """A paused goal: the member, its cache and next position, and when it paused."""

    member: Member
    cache: object
    position: int
    since: float


class PausedGoals:
    """The goals paused in one loop, by key."""

    def __init__(self):
        """Start with none paused."""
        self.goals: dict = {}  # key -> Paused

    def __len__(self) -> int:
        """Count the paused goals."""
        return len(self.goals)

    def pause(self, member: Member, lane, now: float) -> None:
        """Take ``member`` out of ``lane``, its cache kept."""
        cache, position = lane.take(member.key)
        self.goals[member.key] = Paused(member, cache, position, now)
        member.stats.pauses += 1

    def next_due(self, deadline_of) -> float:
        """Return the deadline a waiting goal must beat to go before the paused ones."""
        return resumes_before([deadline_of(p.member.run) for p in self.goals.values()])

    def resume_first(self, deadline_of, lane_of, now: float) -> Member:
        """Put the paused goal with the earliest deadline back in its lane; return it."""
        paused = min(self.goals.values(), key=lambda p: deadline_of(p.member.run))
        del self.goals[paused.member.key]
        member = paused.member
        member.stats.paused_s += now - paused.since
        lane_of(member.lane).join(member.key, paused.cache, paused.position)
        return member

    def end_due(self, lane_of, now: float) -> None:
        """End the paused goals their rules stop now (Kill at the deadline, cancel)."""
        for paused in list(self.goals.values()):
            member = paused.member
            if not member.run.interrupt(0.0):
                continue
            del self.goals[member.key]
            member.stats.paused_s += now - paused.since
            lane_of(member.lane).discard(paused.cache)  # a llama.cpp sequence's cells
            member.run.silent()
            member.end(member.finished())

    def fail_all(self, exc: Exception, lane_of) -> None:
        """End every paused goal as failed (the loop broke)."""
        goals, self.goals = list(self.goals.values()), {}
        for paused in goals:
            try:
                lane_of(paused.member.lane).discard(paused.cache)
            finally:
                paused.member.end(paused.member.run.failed(exc))
