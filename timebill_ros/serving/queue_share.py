# SPDX-License-Identifier: Apache-2.0
"""Planning against the queue, as a goal starts: the share of its time the queue leaves it.

ROS-free. The rule is core/queue_plan.py (the goals waiting that can meet keep their
latest start times on their fastest options); this asks it with the dispatch queue's
head and the goals the recent arrivals say are still to come (core/arrivals.py,
``arrival_window_s``), and plans the starting goal for that share, or on its fastest
option when not even the share fits (``queue_planning``).
"""

from __future__ import annotations

from dataclasses import replace
import itertools

from timebill_ros.core.arrivals import Arrival, RecentArrivals

from timebill_ros.core.planning import Plan
from timebill_ros.core.queue_plan import LOOK_BEHIND, queue_budget, Waiting
from timebill_ros.core.request import Rejection
from timebill_ros.serving.jobs import Job
from timebill_ros.serving.plan_notes import cached, replanned


class QueueShare:
    """The time a starting local goal is planned for while other goals wait."""

    def __init__(self, admission):
        """Plan for ``admission`` (its server's dispatch queue, config and queue fit)."""
        self.admission = admission
        self.arrivals = RecentArrivals(admission.config.arrival_window_s)

    def arrived(self, job: Job) -> None:
        """Record an accepted goal (server lock held): its time on its fastest option."""
        self._follow_window()
        pipeline = self.admission.server.pipeline
        if not self.admission.config.queue_planning or pipeline.online is None:
            return
        fastest_s = self.admission.queue_fit(pipeline).fastest_s(job)
        dispatch = self.admission.server.dispatch
        # The server's lock is the dispatch queue's (held here): read, do not take it.
        contended = bool(dispatch.running) or len(dispatch.queue) > 0
        self.arrivals.add(Arrival(job.clock.now(), job.request.budget_s, fastest_s, contended))

    def plan_for(self, pipeline, job: Job, timing, predicted, seconds: float,
                 request=None) -> Plan | None:
        """Return the goal's plan for ``seconds`` (the queue's share), None if none fits.

        A plan the planner marks infeasible (its best effort when ``infeasible`` is not
        'reject') does not fit either.
        """
        try:
            plan = pipeline.planner.plan(request or job.request, len(job.prompt_ids), seconds,
                                         predicted, timing=cached(pipeline, job, timing),
                                         spread=job.spread, engine_prefix=job.engine_prefix)
        except Rejection:
            return None
        return plan if plan.feasible else None

    def plan(self, pipeline, job: Job, timing, share: tuple) -> Plan | None:
        """Plan a starting goal for the queue's share of its time, or on its fastest option.

        When not even the share fits a plan (the queue is over full), the goal runs on
        its fastest option for its own time: the least it can take from the goals behind.
        None when that does not fit either (planned as if nothing waited).
        """
        seconds, why, option = share
        predicted = job.plan.predicted_tokens or None
        plan = self.plan_for(pipeline, job, timing, predicted, seconds)
        if plan is not None:
            return replanned(plan, f'at dispatch: {why}')
        if option == job.request.precision:
            return None
        plan = self.plan_for(pipeline, job, timing, predicted, job.clock.remaining(),
                             replace(job.request, precision=option))
        return None if plan is None else replanned(
            plan, f'at dispatch: on its fastest option, {option or "the full model"}; '
            f'{why}, and no plan fits that')

    def _follow_window(self) -> None:
        """Take ``arrival_window_s`` as set now (a live parameter)."""
        self.arrivals.window_s = self.admission.config.arrival_window_s

    def of(self, pipeline, job: Job) -> tuple | None:
        """Return (seconds, why, its fastest option) while others wait or come, or None.

        None when its own time left binds: none waits nor is expected, ``queue_planning``
        is off, or the goals waiting and expected that can meet do so whatever it runs
        on (core.queue_plan).
        """
        if not self.admission.config.queue_planning or pipeline.online is None:
            return None
        dispatch, now = self.admission.server.dispatch, job.clock.now()
        with dispatch.lock:
            # Goals whose deadline has passed are no one's to protect (a burst leaves
            # hundreds at the queue's head): the window holds the live ones.
            waiting = list(itertools.islice((other for other in dispatch.queue
                                             if other.clock.deadline > now), LOOK_BEHIND))
        self._follow_window()
        expected = self.arrivals.expected(now, job.clock.deadline, LOOK_BEHIND - len(waiting))
        if not waiting and not expected:
            return None
        fit = self.admission.queue_fit(pipeline)
        option, fastest_s = fit.fastest(job)
        budget = queue_budget(now, job.clock.deadline, fastest_s, [
            *(Waiting(other.clock.deadline, fit.fastest_s(other)) for other in waiting),
            *expected])
        if not budget.binds(job.clock.deadline):
            return None
        seconds = budget.finish_by - now
        coming = (f' and {len(expected)} expected at the recent '
                  f'{self.arrivals.rate(now):.1f} goals/s') if expected else ''
        return seconds, (f'for {seconds:.3f} s of its {job.clock.remaining():.3f} s: '
                         f'{budget.protected} of the {len(waiting)} goals waiting{coming} '
                         'meet on their fastest options only if it ends by then'), option
