# SPDX-License-Identifier: Apache-2.0
"""Planning against the queue: the time a starting goal leaves the goals behind it."""

import math

from timebill_ros.core.queue_plan import most_on_time, queue_budget, Waiting


def test_moore_hodgson_keeps_the_most_goals_on_time():
    jobs = [Waiting(2.0, 1.5), Waiting(2.2, 1.0), Waiting(3.0, 1.0)]
    kept = most_on_time(0.0, jobs)
    # 1.5 + 1.0 passes 2.2 at the second: the longest (1.5) goes, the other two fit.
    assert kept == [Waiting(2.2, 1.0), Waiting(3.0, 1.0)]
    assert most_on_time(10.0, jobs) == []


def test_a_goal_with_slack_is_given_what_the_goals_behind_leave_it():
    # Two 1-s goals behind with deadlines at 4 and 5: the starter must end by 3.
    budget = queue_budget(0.0, 30.0, 0.5, [Waiting(5.0, 1.0), Waiting(4.0, 1.0)])
    assert math.isclose(budget.finish_by, 3.0) and budget.protected == 2
    assert budget.binds(30.0)


def test_nothing_binds_when_the_queue_has_room_or_is_empty():
    budget = queue_budget(0.0, 2.0, 0.5, [Waiting(20.0, 1.0)])
    assert budget.finish_by == 2.0 and not budget.binds(2.0)
    empty = queue_budget(0.0, 2.0, 0.5, [])
    assert empty.protected == 0 and not empty.binds(2.0)


def test_goals_lost_whatever_it_runs_on_are_not_protected():
    # The first goal behind cannot meet even after the starter's fastest 0.5 s.
    budget = queue_budget(0.0, 30.0, 0.5, [Waiting(0.6, 1.0), Waiting(6.0, 1.0)])
    assert budget.protected == 1 and math.isclose(budget.finish_by, 5.0)


def brute_force_most(start, jobs):
    """The largest subset that meets every deadline in EDF order (exhaustive)."""
    import itertools
    for size in range(len(jobs), -1, -1):
        for subset in itertools.combinations(jobs, size):
            end, fits = start, True
            for job in sorted(subset, key=lambda job: job.deadline):
                end += job.fastest_s
                fits = fits and end <= job.deadline
            if fits:
                return size
    return 0


def test_moore_hodgson_keeps_as_many_as_the_exhaustive_optimum():
    import random
    rng = random.Random(7)
    for _ in range(200):
        jobs = [Waiting(rng.uniform(0.2, 4.0), rng.uniform(0.1, 1.5))
                for _ in range(rng.randint(0, 8))]
        kept = most_on_time(0.0, jobs)
        assert len(kept) == brute_force_most(0.0, jobs)
        assert kept == sorted(kept, key=lambda job: job.deadline)


def test_a_burst_behind_leaves_a_goal_with_slack_only_its_fastest_time():
    # 300 goals of 0.16 s due at 30 s: 187 can meet, so the goal starting now must end
    # almost at once (a window of 32 saw 25 s of room here).
    burst = [Waiting(30.0, 0.16)] * 300
    budget = queue_budget(0.0, 30.0, 0.16, burst)
    assert budget.protected == 186 and budget.waiting == 300
    assert budget.binds(30.0) and budget.finish_by < 0.16 + 0.2
