# SPDX-License-Identifier: Apache-2.0
"""The one decode loop: every goal, alone or batched, at any precision, runs here.

A goal alone is a batch of one. Each round takes waiting goals in at a token
boundary (``refill``), prefills one chunk of the oldest goal still prefilling (its
rules are asked first: Kill and cancel stop it between chunks), lets the step hooks
act (the precision switch; grammar masks and deadline checks belong here too), then
steps every lane once: one lane per precision, per-layer mix or early exit (runtime
lanes, from the engine). So a long prompt never stalls the goals already decoding:
their steps interleave with its chunks. Every token goes through ``Member.emit`` (end
of answer, the goal's own stop rule: its deadline policy, cancel and feedback,
``max_new_tokens``).
"""

from __future__ import annotations

from collections import deque
from contextlib import ExitStack
import math
import statistics
import sys
from typing import Callable, Protocol, Sequence

from timebill_ros.core.execution import (
    GenerationStats, PrefillDecision, PrefillInterrupted, TokenEvent)
from timebill_ros.core.planning import Fallback, Plan
from timebill_ros.core.preemption import Decoding, loop_seats, to_pause
from timebill_ros.serving.engine_interface import LoopEngine, FULL_LANE
from timebill_ros.serving.members import Member, Prefilling
from timebill_ros.serving.pausing import PausedGoals


# How many of a lane's last steps its expected next step is the median of.
RECENT_STEPS = 3


class StepHook(Protocol):
    """Acts at every token boundary: before a round, and on each member's logits."""

    def before_round(self, loop: 'DecodeLoop') -> None:
        """Act before the lanes step (e.g. move a goal to another precision)."""

    def logits(self, member: Member, logits):
        """Return the logits to pick from (e.g. masked by a grammar)."""


class PrecisionSwitch:
    """Move a full-precision goal to its fallback precision when its rule says so.

    A token costs a whole round when other goals share it: the rule is then timed on
    the lanes' last steps (``Fallback.sharing``); alone, on its own profiled steps.
    """

    def before_round(self, loop: 'DecodeLoop') -> None:
        """Move every goal whose switch is due."""
        for member in list(loop.members.values()):
            if member.lane != FULL_LANE or member.stats.switched_at >= 0:
                continue
            index = member.stats.tokens - 1  # the last answer token streamed
            alone = loop.decoding() == 1
            to = member.run.switch_to(
                index, None if alone else lambda rule: shared_rule(loop, rule))
            if to:
                loop.move(member, (to,))
                member.stats.switched_at, member.stats.switched_to = index, to

    def logits(self, member: Member, logits):
        """Leave the logits as they are."""
        return logits


def shared_rule(loop: 'DecodeLoop', fallback: Fallback) -> Fallback:
    """Return a switch rule timed on the loop's lanes this round (``Fallback.sharing``)."""
    last, target = loop.last_step, (fallback.precision,)
    after = sum(last.get(key, 0.0) for key in loop.lanes if key not in (FULL_LANE, target))
    if len(loop.lanes.get(FULL_LANE, ())) > 1:  # the full-precision batch goes on
        after += last.get(FULL_LANE, 0.0)
    if target in loop.lanes:  # joining makes that batch's step heavier, not lighter
        after += max(0.0, last.get(target, 0.0) - fallback.step_s)
    return fallback.sharing(sum(last.get(key, 0.0) for key in loop.lanes), after)


def pausable(loop: 'DecodeLoop') -> list:
    """Return (key, member) of the loop's decoding goals that may pause between two tokens.

    None while the loop is closed (a Skip-Next goal or an exclusive lane runs); else those
    on a lane that gives its cache back (not early exit). Admission's thread reads it too.
    """
    members = list(loop.members.items())
    if not members or loop.closed():
        return []
    lanes = dict(loop.lanes)
    return [(key, member) for key, member in members
            if not getattr(lanes.get(member.lane), 'exclusive', False)]


class DecodeLoop:
    """Run goals on one engine until none is left: the only token loop."""

    def __init__(self, engine: LoopEngine, capacity: int = 1,
                 hooks: Sequence[StepHook] = (PrecisionSwitch(),),
                 on_step: Callable[[tuple, int, int, float], None] | None = None,
                 earliest_waiting: Callable[[], float] | None = None):
        """Decode at most ``capacity`` goals at once on ``engine``.

        ``on_step(lane, size, total_kv, seconds)`` sees every lane step (online ETE).
        ``earliest_waiting()`` gives the earliest deadline of the goals waiting to start
        (inf: none): a decoding goal with a later one pauses for it at a token boundary
        (core/preemption.py). None: no goal pauses (FIFO, SVF, tools).
        """
        self.engine, self.capacity, self.hooks = engine, capacity, tuple(hooks)
        self.on_step, self.earliest_waiting = on_step, earliest_waiting
        self.paused = PausedGoals()
        self.members: dict = {}  # key -> Member
        self.prefilling: list = []  # Prefilling goals, oldest first
        self.lanes: dict = {}  # lane key -> lane
        self.last_step: dict = {}  # lane key -> its expected step (s): median of recent
        self._recent_steps: dict = {}  # lane key -> its last RECENT_STEPS steps (s)
        self._threads, self._threads_key = ExitStack(), None

    def decoding(self) -> int:
        """Count the goals in the loop: decoding, and prefilling (each will hold a place)."""
        return len(self.members) + len(self.prefilling)

    def closed(self) -> bool:
        """Tell whether no goal may join now: a Skip-Next goal or an exclusive lane runs."""
        runs = [m.run for m in self.members.values()] + [p.member.run for p in self.prefilling]
        return any(run.closes_batch for run in runs) or any(
            lane.exclusive and len(lane) for lane in self.lanes.values())

    def longest_cache(self) -> int:
        """Return the longest KV cache of the lanes (what a joining goal is padded to)."""
        return max((lane.cached_tokens() for lane in self.lanes.values() if len(lane)),
                   default=0)

    def room_before(self) -> float | None:
        """Return the deadline a goal must beat to start now: inf (any), or None (no room).

        Below ``capacity`` any goal may start. When prefilling goals hold the places a
        goal with an earlier deadline than all of them may still start while a decode
        place is free: it prefills first and decodes while they wait (a long prompt
        does not stall a short goal). The loop holds at most ``loop_seats(capacity)``
        goals (engine_options.llama_sequences).
        """
        if self.closed():
            return None
        if self.decoding() < self.capacity:
            return math.inf
        if len(self.members) < self.capacity and self.seats_free() > 0:
            earliest = min(_deadline(entry.member.run) for entry in self.prefilling)
            # Prefills without deadlines yield to a goal with one, not to another without.
            return min(earliest, sys.float_info.max)
        return None

    def seats_free(self) -> int:
        """Count the caches a new goal may still take (``loop_seats``, paused ones in)."""
        return loop_seats(self.capacity) - self.decoding() - len(self.paused)

    def run(self, refill: Callable[['DecodeLoop', float], bool]) -> None:
        """Decode until no goal is left; ``refill(loop, before)`` starts one waiting goal.

        ``refill`` starts a goal whose deadline is earlier than ``before`` (inf: any)
        and returns False when none waits; it is asked once before the first round,
        then at every token boundary while there is room (``room_before``). A paused
        goal resumes when no waiting goal has an earlier deadline.
        """
        try:
            refill(self, math.inf)
            while self.members or self.prefilling or self.paused:
                self.paused.end_due(self._lane, self.engine.clock())
                self._pause_for_earlier()
                self._fill(refill)
                if self.prefilling:
                    self._prefill_chunk()
                if self.members:
                    for hook in self.hooks:
                        hook.before_round(self)
                    self._round()
        finally:
            for entry in self.prefilling:
                entry.prefill.abandon()
            self._threads.close()

    def _fill(self, refill) -> None:
        """Start waiting goals and resume paused ones while there is room, by deadline."""
        while (before := self.room_before()) is not None:
            due = self.paused.next_due(_deadline)
            if self.seats_free() > 0 and refill(self, min(before, due)):
                continue
            if not self.paused or self.decoding() >= self.capacity:
                return
            member = self.paused.resume_first(_deadline, self._lane, self.engine.clock())
            self.members[member.key] = member

    def _pause_for_earlier(self) -> None:
        """Pause the decoding goal a waiting goal with an earlier deadline displaces."""
        if self.earliest_waiting is None or self.room_before() is not None:
            return
        key = to_pause([Decoding(k, _deadline(m.run), True) for k, m in pausable(self)],
                       self.earliest_waiting(), self.seats_free())
        if key is not None:
            member = self.members.pop(key)
            self.paused.pause(member, self.lanes[member.lane], self.engine.clock())

    def start(self, member: Member, prompt_ids: Sequence[int], plan: Plan,
              decide: PrefillDecision | None = None) -> None:
        """Begin a goal's prefill; it joins a lane when its last chunk ran.

        With ``decide`` the plan is made during prefill; ``member.run.plan`` becomes
        the plan in force. A failure (or a refusal in prefill) ends the goal.
        """
        try:
            prefill = self.engine.begin_prefill(prompt_ids, plan, decide)
        except Exception as exc:  # noqa: BLE001 - any engine failure ends the goal
            member.end(member.run.failed(exc))
            return
        self.prefilling.append(Prefilling(member, prefill))

    def _prefill_chunk(self) -> None:
        """Prefill one chunk of the prefilling goal with the least left, after their rules.

        Every prefilling goal's rules are asked each round (Kill, cancel), not only the
        one that runs: a short prompt behind a long one must not wait out the long one's
        prefill. The rules see the next chunk's expected seconds, so Kill can stop a
        prompt whose next chunk would end past the deadline (a chunk deep in a long
        prompt takes far longer than a token). The least prefill left goes first, so a
        short prompt starts decoding within a chunk and the long one goes on between steps.
        """
        self._threads.close()  # a prefill runs with the thread's own setting
        self._threads_key = None
        for entry in list(self.prefilling):
            try:
                stopped = entry.member.run.interrupt(entry.next_chunk_s())
            except Exception as exc:  # noqa: BLE001 - any failure ends the goal
                stopped = exc
            if stopped:
                prefill = entry.prefill
                self._end_prefill(entry, stopped if isinstance(stopped, Exception) else
                                  PrefillInterrupted(prefill.tokens_done, prefill.total,
                                                     entry.spent_s))
        due = min((_deadline(m.run) for m in self.members.values()), default=math.inf)
        ready = [entry for entry in self.prefilling if self._may_prefill(entry, due)]
        if not ready:
            return
        entry = min(ready, key=lambda e: e.prefill.total - e.prefill.tokens_done)
        member, prefill = entry.member, entry.prefill
        try:
            entry.advance(self.engine.clock)
            if not prefill.done:
                return
            cache, logits, stats = prefill.result()
        except Exception as exc:  # noqa: BLE001 - any engine failure ends the goal
            self._end_prefill(entry, exc)
            return
        self.prefilling.remove(entry)
        self._take_in(member, cache, logits, stats, prefill.total)

    def _may_prefill(self, entry: 'Prefilling', due: float) -> bool:
        """Tell whether a prefilling goal may run its next chunk this round.

        A long prefill waits while goals decode toward earlier deadlines (EDF, ``due``).
        A last chunk makes its goal decode: it waits for a decode place that no
        prefilling goal with an earlier deadline will take first. With no goal decoding
        the earliest deadline may always go on, so the loop cannot stall.
        """
        deadline = _deadline(entry.member.run)
        if entry.prefill.chunks_left > 1:
            return deadline <= due
        earlier = sum(_deadline(other.member.run) < deadline for other in self.prefilling)
        return len(self.members) + earlier < self.capacity

    def _end_prefill(self, entry: 'Prefilling', exc: Exception) -> None:
        """End a prefilling goal with ``exc`` (stopped, or its engine failed)."""
        self.prefilling.remove(entry)
        entry.prefill.abandon()
        entry.member.end(entry.member.run.failed(exc))

    def _take_in(self, member: Member, cache, logits, stats: GenerationStats,
                 prompt_tokens: int) -> None:
        """Stream a prefilled goal's first token and put it in its lane."""
        engine = self.engine
        try:
            member.run.plan = stats.plan
            member.stats, member.text = stats, engine.stream()
            member.lane = engine.lane_key(stats.plan)
            lane = self._lane(member.lane)
        except Exception as exc:  # noqa: BLE001 - any engine failure ends the goal
            member.end(member.run.failed(exc))
            return
        stats.batch_peak = max(stats.batch_peak, len(self.members) + 1)
        if not member.emit(self._pick(member, logits), engine.eos_ids, engine.clock()):
            lane.discard(cache)  # ended on its first token: a llama.cpp sequence is no garbage
            member.end(member.finished())
            return
        lane.join(member.key, cache, prompt_tokens)
        self.members[member.key] = member

    def move(self, member: Member, lane_key: tuple) -> None:
        """Move a goal, cache and all, to another lane (a precision switch)."""
        cache, position = self.lanes[member.lane].take(member.key)
        member.lane = lane_key
        self._lane(lane_key).join(member.key, cache, position)

    def fail_all(self, exc: Exception) -> None:
        """End every goal in the loop as failed (the loop itself broke)."""
        for member in list(self.members.values()):
            del self.members[member.key]
            member.end(member.run.failed(exc))
        prefilling, self.prefilling = self.prefilling, []
        for entry in prefilling:
            entry.prefill.abandon()
            entry.member.end(entry.member.run.failed(exc))
        self.paused.fail_all(exc, self._lane)
        self.lanes.clear()

    def _lane(self, key: tuple):
        if key not in self.lanes:
            self.lanes[key] = self.engine.lane(key)
        return self.lanes[key]

    def _pick(self, member: Member, logits) -> int:
        for hook in self.hooks:
            logits = hook.logits(member, logits)
        if member.chooser is not None:
            return member.chooser.choose(logits)
        return self.engine.pick(logits)

    def _use_threads(self, key: tuple) -> None:
        """Run the next steps under the lane's thread setting (changed only when it differs)."""
        if key != self._threads_key:
            self._threads.close()
            self._threads = ExitStack()
            self._threads.enter_context(self.engine.threads(key))
            self._threads_key = key

    def _round(self) -> None:
        """Step every lane once (an exclusive lane alone while it holds a goal)."""
        for key in [key for key, lane in self.lanes.items() if len(lane) == 0]:
            del self.lanes[key]
            self.last_step.pop(key, None)
            self._recent_steps.pop(key, None)
        exclusive = [key for key, lane in self.lanes.items() if lane.exclusive]
        for key in exclusive or list(self.lanes):
            self._step(key, self.lanes[key])

    def _step(self, key: tuple, lane) -> None:
        """Step one lane and stream each of its goals' next token."""
        size, total_kv = len(lane), len(lane) * lane.cached_tokens()
        feed = {k: self.members[k].token for k in lane.keys}
        budgets = {k: self.members[k].run.token_budget(self.members[k].stats.tokens - 1)
                   for k in lane.keys} if lane.exclusive else None
        clock = self.engine.clock
        t = clock()
        try:
            self._use_threads(key)
            steps = lane.step(feed, budgets)
        except Exception as exc:  # noqa: BLE001 - the whole lane fails together
            for k in lane.keys:
                member = self.members.pop(k)
                member.end(member.run.failed(exc))
            del self.lanes[key]
            return
        now = clock()
        step_s = now - t
        # One step stalled by the OS (a preempted thread: 0.1 s and more on a loaded
        # 2-core machine) must not make Kill stop ahead of a 2-ms step: the median
        # of the last few steps forgets a single stall, yet follows a batch that grew.
        recent = self._recent_steps.setdefault(key, deque(maxlen=RECENT_STEPS))
        recent.append(step_s)
        self.last_step[key] = statistics.median(recent)
        if self.on_step is not None:
            self.on_step(key, size, total_kv, step_s)
        peak = len(self.members)
        round_s = sum(self.last_step.values())  # until a goal's next token: a whole round
        for k, step in steps.items():
            member = self.members[k]
            stats = member.stats
            stats.step_times.append(step_s)
            stats.batch_peak = max(stats.batch_peak, peak)
            if step.kind:
                stats.exit_kinds.append(step.kind)
            # A lane that picks its own token (early exit) also gives that layer's logits:
            # a goal with a chooser (grammar, sampling) picks from those.
            own = step.token is not None and (member.chooser is None or step.logits is None)
            token = step.token if own else self._pick(member, step.logits)
            if not member.emit(token, self.engine.eos_ids, clock(), round_s):
                lane.leave(k)
                del self.members[k]
                member.end(member.finished())


def _deadline(run) -> float:
    """Return a goal's absolute deadline (monotonic s; none: infinity)."""
    clock = getattr(run, 'clock', None)
    return clock.deadline if clock is not None else math.inf


class _CallbackRun:
    """The rules of a goal run outside the server: stop when ``on_token`` says so."""

    closes_batch = False

    def __init__(self, plan: Plan, on_token, token_budget=None, switch=None):
        self.plan, self.on_token = plan, on_token
        self._budget, self._switch = token_budget, switch

    def token_budget(self, index: int) -> float | None:
        return self._budget(index) if self._budget is not None else None

    def interrupt(self, next_chunk_s: float = 0.0) -> bool:
        return False

    def stops_ahead(self, now: float, next_step_s: float) -> bool:
        return False

    def switch_to(self, index: int, sharing) -> str:
        return self._switch(index) if self._switch is not None else ''

    def finish(self, stats: GenerationStats) -> GenerationStats:
        return stats

    def failed(self, exc: Exception):
        raise exc


def generate(engine: LoopEngine, prompt_ids: Sequence[int], max_new_tokens: int, plan: Plan,
             on_token: Callable[[TokenEvent], bool],
             token_budget: Callable[[int], float | None] | None = None,
             decide: PrefillDecision | None = None,
             switch: Callable[[int], str] | None = None) -> GenerationStats:
    """Run one prompt through the loop alone; return the engine's stats.

    For tools and benchmarks: ``on_token`` stops it by returning False;
    ``token_budget(i)`` gives early exit's seconds for decode step i; ``switch(i)``
    names a resident precision decode step i and the rest run at ('' = stay). An
    engine failure is raised.
    """
    ended: list = []
    member = Member('generate', _CallbackRun(plan, on_token, token_budget, switch),
                    max_new_tokens, ended.append)

    started = []

    def refill(loop: DecodeLoop, before: float) -> bool:  # the one goal, once
        if started:
            return False
        started.append(member)
        loop.start(member, prompt_ids, plan, decide)
        return True
    DecodeLoop(engine).run(refill)
    return ended[0]
