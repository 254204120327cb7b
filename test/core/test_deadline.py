# SPDX-License-Identifier: Apache-2.0
"""Kill / Skip-Next rules and deadline_met, on an injected clock."""

from timebill_ros.core.deadline import (
    after_token, closes_batch, DeadlineClock, finished_outcome, overran, SkipNext, Step)
from timebill_ros.core.request import Outcome, OverrunPolicy


class FakeClock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def test_clock_counts_from_acceptance():
    clock = FakeClock()
    dl = DeadlineClock.start(2.0, clock)
    clock.t += 0.5
    assert dl.elapsed() == 0.5
    assert dl.remaining() == 1.5
    assert not dl.expired()
    clock.t += 1.5
    assert dl.expired()  # at the deadline counts as reached


def test_kill_stops_at_or_after_deadline_only():
    dl = DeadlineClock(0.0, 1.0)
    assert after_token(OverrunPolicy.KILL, dl, 0.99, False) == Step.CONTINUE
    assert after_token(OverrunPolicy.KILL, dl, 1.0, False) == Step.KILL
    assert after_token(OverrunPolicy.SKIP_NEXT, dl, 5.0, False) == Step.CONTINUE


def test_cancel_wins():
    dl = DeadlineClock(0.0, 1.0)
    assert after_token(OverrunPolicy.KILL, dl, 2.0, True) == Step.CANCEL


def test_outcomes_read_the_clock():
    dl = DeadlineClock(0.0, 1.0)
    assert finished_outcome(Step.CONTINUE, 0.9, dl) == (Outcome.COMPLETED, True)
    assert finished_outcome(Step.CONTINUE, 1.1, dl) == (Outcome.COMPLETED, False)
    assert finished_outcome(Step.KILL, 0.5, dl) == (Outcome.KILLED, False)
    assert finished_outcome(Step.CANCEL, 0.5, dl) == (Outcome.CANCELED, False)


def test_skip_next_arms_only_on_late_skip_next_goal_with_one_waiting():
    assert not overran(OverrunPolicy.KILL, Outcome.COMPLETED, False)
    assert not overran(OverrunPolicy.SKIP_NEXT, Outcome.COMPLETED, True)
    assert not overran(OverrunPolicy.SKIP_NEXT, Outcome.CANCELED, False)
    assert overran(OverrunPolicy.SKIP_NEXT, Outcome.COMPLETED, False)
    skip = SkipNext()
    skip.ended('a', overran=False, waiting=1)
    assert skip.take() == ''
    skip.ended('a', overran=True, waiting=0)  # nothing waits: a later goal owes nothing
    assert skip.take() == ''
    skip.ended('a', overran=True, waiting=2)
    assert 'previous goal a overran' in skip.take()
    assert skip.take() == ''  # only the next goal is skipped


def test_skip_next_arms_at_the_first_token_past_the_deadline():
    skip = SkipNext()
    skip.overran('long-goal')
    skip.overran('other')  # one skip at a time: the first overrun pays
    assert 'previous goal long-goa overran' in skip.take()  # a goal dispatched while it still runs
    skip.overran('long-goal')
    skip.ended('long-goal', overran=True, waiting=0)  # ended with nothing waiting: dropped
    assert skip.take() == ''
    skip.overran('long-goal')
    skip.ended('long-goal', overran=True, waiting=1)  # one waits: it is skipped
    assert 'previous goal long-goa overran' in skip.take()


def test_only_skip_next_closes_a_batch():
    assert closes_batch(OverrunPolicy.SKIP_NEXT)
    assert not closes_batch(OverrunPolicy.KILL)
