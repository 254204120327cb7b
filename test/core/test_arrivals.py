# SPDX-License-Identifier: Apache-2.0
"""Goals still to come: recent arrivals stand for the next ones in a starting goal's plan."""

import math

from timebill_ros.core.arrivals import Arrival, MIN_SPAN_S, RecentArrivals
from timebill_ros.core.queue_plan import queue_budget


def stream(rate: float, seconds: float, budget_s: float, fastest_s: float,
           window_s: float = 5.0) -> RecentArrivals:
    """Return the arrivals of a steady stream that has run for ``seconds``."""
    arrivals = RecentArrivals(window_s)
    for k in range(int(rate * seconds)):
        arrivals.add(Arrival(k / rate, budget_s, fastest_s))
    return arrivals


def test_the_rate_is_read_over_the_window():
    arrivals = stream(4.0, 20.0, 1.0, 0.2)
    assert math.isclose(arrivals.rate(20.0), 4.0, rel_tol=0.06)
    # Older arrivals than the window are forgotten.
    assert len(arrivals.recent(20.0)) <= 21
    assert arrivals.rate(40.0) == 0.0


def test_a_burst_reads_as_its_rate_not_as_a_window_average():
    arrivals = stream(200.0, 0.5, 2.0, 0.2)  # 100 goals in half a second
    assert arrivals.rate(0.5) == 100 / MIN_SPAN_S
    # Two goals sent together are not a flood.
    pair = RecentArrivals(5.0)
    pair.add(Arrival(0.0, 1.0, 0.2))
    pair.add(Arrival(0.0, 1.0, 0.2))
    assert pair.rate(0.0) == 2.0


def test_expected_goals_come_at_the_rate_with_the_recent_deadlines():
    arrivals = RecentArrivals(5.0)
    arrivals.add(Arrival(0.0, 1.0, 0.2))
    arrivals.add(Arrival(0.5, 3.0, 0.4))
    expected = arrivals.expected(1.0, 3.0, 100)
    assert len(expected) == 4  # 2 goals/s over the 2 s to its deadline
    assert [round(goal.deadline, 3) for goal in expected] == [2.5, 5.0, 3.5, 6.0]
    assert [goal.fastest_s for goal in expected] == [0.2, 0.4, 0.2, 0.4]
    assert len(arrivals.expected(1.0, 3.0, 3)) == 3


def test_an_idle_or_switched_off_window_expects_no_one():
    assert RecentArrivals(5.0).expected(0.0, 30.0, 100) == []
    off = RecentArrivals(0.0)
    off.add(Arrival(0.0, 1.0, 0.2))
    assert off.expected(0.0, 30.0, 100) == []


def test_a_steady_stream_binds_a_slow_goal_and_a_light_one_does_not():
    # 10 goals/s, each needing 0.15 s on its fastest option within 1 s: the stream takes
    # most of the machine, so a 1-s goal starting now is left little more than its own.
    busy = stream(10.0, 5.0, 1.0, 0.15)
    budget = queue_budget(5.0, 6.0, 0.15, busy.expected(5.0, 6.0, 512))
    assert budget.binds(6.0) and budget.finish_by - 5.0 < 0.5
    # One goal every 2 s leaves the same goal its whole second.
    light = stream(0.5, 10.0, 1.0, 0.15)
    budget = queue_budget(10.0, 11.0, 0.15, light.expected(10.0, 11.0, 512))
    assert not budget.binds(11.0)


def test_a_client_that_waits_for_each_answer_expects_no_one():
    # One goal a second, each finding the node idle: never two at once, none expected.
    serial = RecentArrivals(5.0)
    for k in range(5):
        serial.add(Arrival(float(k), 1.0, 0.5, contended=False))
    assert serial.rate(5.0) == 0.0 and serial.expected(5.0, 35.0, 512) == []
