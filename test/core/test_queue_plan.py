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
