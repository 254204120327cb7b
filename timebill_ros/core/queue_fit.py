# SPDX-License-Identifier: Apache-2.0
"""Queue and batch fit: when a newcomer would start, and whom accepting it would push late.

Pure rules, no torch and no threads: admission (serving/admission.py) takes a snapshot of
the queue (``QueueView``) under the server's lock and asks ``QueueFit`` to plan the
newcomer for the time left after its expected wait, on one decode slot or on
``max_batch`` slots, and to name the accepted goals it would push past their deadlines.
Expected times use predicted answer lengths (a running mean while a goal's length is
still to be predicted in its prefill), so a queue is not judged on worst cases.
Goals are read by duck type: ``plan``, ``clock``, ``request``, ``prompt_ids``, ``key``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from timebill_ros.core.deadline import closes_batch
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import OverrunPolicy, Rejection
from timebill_ros.core.scheduling import slot_starts


@dataclass(frozen=True)
class QueueView:
    """The queue a newcomer meets, as admission saw it under the lock.

    ``ahead``: goals it would wait behind (the held ones first); ``behind``: goals it
    would overtake; ``running``: (goal, started at); ``prefills``: key -> prompt tokens
    done of the running goals still prefilling that a newcomer may overtake;
    ``pausable``: key -> answer tokens streamed of the decoding goals a newcomer with an
    earlier deadline pauses (core/preemption.py).
    """

    ahead: list
    behind: list
    running: list
    prefills: dict
    order: str
    now: float
    pausable: dict = field(default_factory=dict)


def until_killed(goal, rest_s: float, now: float) -> float:
    """Return ``rest_s`` (>= 0), no later than the deadline of a Kill goal.

    A Kill goal never runs past its deadline (a best-effort one planned longer is killed
    there); a Skip-Next goal may.
    """
    if goal.request.policy == OverrunPolicy.KILL:
        rest_s = min(rest_s, goal.clock.remaining(now))
    return max(0.0, rest_s)


class QueueFit:
    """Expected times of queued goals, and the fit of a newcomer among them.

    ``pipeline``: the planner and ETEs in force (``planner``, ``online``, ``batch``,
    ``max_batch``); ``typical_tokens``: the running mean answer length.
    """

    def __init__(self, pipeline, typical_tokens: float):
        """Read times on ``pipeline``'s planner and ETEs."""
        self.pipeline, self.typical_tokens = pipeline, typical_tokens

    def expected_tokens(self, goal) -> float:
        """Return a goal's predicted answer length (the running mean while it is pending).

        Never past the goal's own ``max_new_tokens``.
        """
        plan = goal.plan
        known = plan.predicted_tokens and not plan.length_pending
        expected = plan.predicted_tokens if known else self.typical_tokens
        return min(expected, goal.request.max_new_tokens)

    def expected_s(self, goal, timing) -> float:
        """Return the estimated time of a goal's predicted (not worst-case) answer."""
        return self.pipeline.planner.estimate_s(goal.plan, self.expected_tokens(goal), timing,
                                                held=goal.held_by_plan_engine)

    def still_to_run_s(self, goal, timing, since: float, now: float) -> float:
        """Return the expected time a running goal still holds the model."""
        return until_killed(goal, self.expected_s(goal, timing) - (now - since), now)

    def prefill_paused_rest_s(self, goal, timing, tokens_done: int, now: float) -> float:
        """Return what a goal still prefilling has left: its expected time less its chunks.

        Not from the time since it started: it may have been paused for others.
        """
        done_s = timing.prefill(tokens_done) - timing.prefill(0)
        return until_killed(goal, self.expected_s(goal, timing) - done_s, now)

    def decode_paused_rest_s(self, goal, timing, tokens_done: int, now: float) -> float:
        """Return what a decoding goal has left: its expected time less its tokens' share."""
        expected = max(1.0, self.expected_tokens(goal))
        share = max(0.0, 1.0 - tokens_done / expected)
        return until_killed(goal, self.expected_s(goal, timing) * share, now)

    def fastest_s(self, goal) -> float:
        """Return a goal's expected time on its fastest resident option (``fastest``)."""
        return self.fastest(goal)[1]

    def fastest(self, goal) -> tuple:
        """Return (option, expected seconds) of a goal's fastest resident option.

        Every option the planner may run a whole goal on: the full model (''), each
        resident precision, each other engine (core.cut_kinds); one without a profile
        is skipped. Kept on the goal (``fastest_option``): computed once per goal.
        """
        cached = getattr(goal, 'fastest_option', None)
        if cached is not None:
            return cached
        planner, tokens = self.pipeline.planner, self.expected_tokens(goal)
        context = getattr(planner, 'context', None)
        names = ['', *context.precisions, *context.engines] if context is not None else ['']
        pinned = goal.request.precision
        times = []
        for name in [pinned] if pinned else names:
            plan = Plan(mode=goal.plan.mode, prompt_tokens=len(goal.prompt_ids), precision=name)
            try:
                times.append((planner.estimate_s(plan, tokens), name))
            except (KeyError, ValueError, RuntimeError):  # no profile of this option yet
                continue
        seconds, name = min(times, default=(self.expected_s(goal, self.pipeline.online.model),
                                            pinned))
        goal.fastest_option = (name, seconds)
        return goal.fastest_option

    def kv_of(self, goal) -> float:
        """Return a goal's cache length halfway through its expected answer."""
        n_x = len(goal.prompt_ids)
        return (1.0 - goal.plan.eviction_ratio) * n_x + self.expected_tokens(goal) / 2.0

    def member_timing(self, size: int, others_kv: list, own_kv: float):
        """Return the ETE of a goal decoding with ``size`` - 1 others holding ``others_kv``."""
        single = self.pipeline.online.model
        if size <= 1:
            return single
        longest = max([own_kv, *others_kv])  # the batch pads every cache to the longest
        return self.pipeline.batch.model.member(single, size, (size - 1) * longest)

    def fit_in_queue(self, goal, view: QueueView, plan: Callable) -> None:
        """Plan a newcomer onto one decode slot; raise Rejection if it pushes others late.

        ``plan(wait, timing, batch, ahead)`` plans it for the time left after ``wait``.
        A running goal still in its prefill, or decoding and pausable, whose deadline is
        later than the newcomer's and than those of the goals queued ahead is overtaken
        (the loop starts an earlier deadline between its chunks or tokens): the newcomer
        does not wait for it, and is refused when the delay would push it past its
        deadline.
        """
        model, now = self.pipeline.online.model, view.now
        wait = sum(self.expected_s(other, model) for other in view.ahead)
        latest = max(other.clock.deadline for other in [goal, *view.ahead])
        overtaken = []
        for running, since in view.running:
            if running.key in view.prefills and running.clock.deadline > latest:
                overtaken.append((running, self.prefill_paused_rest_s(
                    running, model, view.prefills[running.key], now)))
            elif running.key in view.pausable and running.clock.deadline > latest:
                overtaken.append((running, self.decode_paused_rest_s(
                    running, model, view.pausable[running.key], now)))
            else:
                wait += self.still_to_run_s(running, model, since, now)
        plan(wait, None, 1, len(view.ahead) + len(view.running) - len(overtaken))
        mine, start = self.expected_s(goal, model), wait
        pushed = [pushed_past(other, rest + wait + mine, now) for other, rest in overtaken
                  if rest + wait <= other.clock.remaining(now) < rest + wait + mine]
        for other in view.behind:  # dispatch order: each starts after those before it
            end = start + self.expected_s(other, model)
            if end <= other.clock.remaining(now) < end + mine:
                pushed.append(pushed_past(other, end + mine, now))
            start = end
        refuse_if_pushed(goal, pushed, f'accepting it ahead of them ({view.order})')

    def fit_in_batch(self, goal, view: QueueView, plan: Callable) -> None:
        """Plan a newcomer onto ``max_batch`` decode slots; raise Rejection with why.

        The running goals hold slots for their expected remaining time; goals queued
        ahead take the first free slot in turn, and the newcomer the next one. It is
        planned on the steps of a batch as full as the goals then running or waiting
        allow. Refused when that plan refuses it; when joining would push a running goal
        that is expected to make its deadline past it; or when, overtaking, it would
        delay a queued goal past its deadline. A running Skip-Next goal holds every slot
        until it ends (``closes_batch``).
        """
        size, now, running, waiting = self.pipeline.max_batch, view.now, view.running, \
            view.ahead
        batch = min(size, len(running) + len(waiting) + 1)  # the newcomer's batch, itself in
        kv = [self.kv_of(other) for other, _ in running] + [self.kv_of(o) for o in waiting]
        timing = self.member_timing(batch, kv[:batch - 1], self.kv_of(goal))
        # The running goals' remaining time at the batch they decode in now.
        current = self.member_timing(len(running), kv[1:len(running)], kv[0]) \
            if running else timing
        left = [self.still_to_run_s(other, current, since, now)
                for other, since in running][:size]
        closing = [rest for (other, _), rest in zip(running, left)
                   if closes_batch(other.request.policy)]
        if closing:  # a running Skip-Next goal: no slot frees before it ends
            left = [max(rest, closing[0]) for rest in left] + \
                [closing[0]] * (size - len(left))
        queued = [self.expected_s(other, timing) for other in waiting]
        wait = slot_starts(left, size, [*queued, 0.0])[-1]
        alone = wait <= 0.0 and batch <= 1
        plan(wait, None if alone else timing, batch, len(waiting) + len(running))
        if wait <= 0.0 and running:
            self._refuse_if_joining_pushes(goal, running, left, timing, current, now)
        after = [self.expected_s(other, timing) for other in view.behind]
        mine = self.expected_s(goal, timing)
        with_it = slot_starts(left, size, [*queued, mine, *after])[len(queued) + 1:]
        without = slot_starts(left, size, [*queued, *after])[len(queued):]
        pushed = [pushed_past(other, start + duration, now) for other, start, alone_start,
                  duration in zip(view.behind, with_it, without, after)
                  if alone_start + duration <= other.clock.remaining(now) < start + duration]
        refuse_if_pushed(goal, pushed, f'accepting it ahead of them ({view.order})')

    def _refuse_if_joining_pushes(self, goal, running: list, left: list, timing, current,
                                  now: float) -> None:
        """Refuse a newcomer whose joining now would push a running goal past its deadline.

        Each running goal's remaining steps get slower, and they wait out its prefill.
        """
        stall, pushed = timing.prefill(len(goal.prompt_ids)), []
        for (other, _), rest in zip(running, left):
            kv_other = self.kv_of(other)
            slower = timing.step(kv_other) / max(current.step(kv_other), 1e-9)
            if rest <= other.clock.remaining(now) < rest * slower + stall:
                pushed.append(pushed_past(other, rest * slower + stall, now))
        refuse_if_pushed(goal, pushed, 'joining the running batch')


def pushed_past(other, end_s: float, now: float) -> str:
    """Name an accepted goal a newcomer would push late: its key, expected end, time left."""
    return (f'{other.key[:8]} (would end in {end_s:.2f} s with {other.clock.remaining(now):.2f} '
            's left)')


def refuse_if_pushed(goal, pushed: list, how: str) -> None:
    """Raise Rejection naming the accepted goals ``pushed`` past their deadlines, if any."""
    if pushed:
        raise Rejection(f'{how} would push {len(pushed)} accepted goal(s) past their '
                        f'deadlines: {", ".join(pushed)}', goal.plan)
