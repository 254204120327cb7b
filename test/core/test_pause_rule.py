# SPDX-License-Identifier: Apache-2.0
"""The pause rule of preemptive EDF: who gives its place to an earlier deadline."""

import math

from timebill_ros.core.preemption import Decoding, resumes_before, to_pause


def test_the_latest_deadline_later_than_the_waiting_one_pauses():
    decoding = [Decoding('a', 10.0, True), Decoding('b', 30.0, True), Decoding('c', 5.0, True)]
    assert to_pause(decoding, 8.0, seats_free=1) == 'b'


def test_nothing_pauses_for_a_later_or_equal_deadline_or_with_none_waiting():
    decoding = [Decoding('a', 10.0, True)]
    assert to_pause(decoding, 10.0, seats_free=1) is None
    assert to_pause(decoding, 12.0, seats_free=1) is None
    assert to_pause(decoding, math.inf, seats_free=1) is None


def test_a_goal_that_cannot_pause_is_passed_over():
    decoding = [Decoding('skip-next', 50.0, False), Decoding('kill', 20.0, True)]
    assert to_pause(decoding, 8.0, seats_free=1) == 'kill'
    assert to_pause([Decoding('skip-next', 50.0, False)], 8.0, seats_free=1) is None


def test_nothing_pauses_without_a_free_cache_seat():
    assert to_pause([Decoding('a', 10.0, True)], 1.0, seats_free=0) is None


def test_the_earliest_paused_deadline_is_what_a_waiting_goal_must_beat():
    assert resumes_before([12.0, 7.0]) == 7.0
    assert resumes_before([]) == math.inf


def test_a_loop_keeps_a_seat_to_pause_a_goal_while_another_prefills():
    from timebill_ros.core.preemption import loop_seats
    # One goal decoding and one prefilling (two seats of one place): the third seat lets
    # a goal with an earlier deadline pause the decoding one.
    assert loop_seats(1) == 3 and loop_seats(4) == 9
    decoding = [Decoding('long', 30.0, True)]
    assert to_pause(decoding, 1.0, seats_free=loop_seats(1) - 2) == 'long'
