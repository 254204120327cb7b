"""Admission on a replica pool: the length spread, the tokens that fit, the refusal rules."""

from types import SimpleNamespace

import pytest

from timebill_ros.core.length import observed_distribution
from timebill_ros.core.request import Rejection
from timebill_ros.serving.remote import Load, RemoteAnswer, ReplicaPool
from timebill_ros.serving.remote_admission import (
    expected_lengths, fit_probability, plan_on_pool)

CONFIG = SimpleNamespace(plan_quantile=0.9, admit_probability=0.001, yield_when_late=True)


def pool_of(ttft_s=0.5, itl_s=0.1, urls=('http://a:1',)):
    pool = ReplicaPool(list(urls), clock=lambda: 0.0)
    for replica in pool.replicas:
        replica.timing.ttft_coef[:] = (ttft_s, 0.0, 0.0)
        replica.timing.itl_coef[:] = (itl_s, 0.0)
    return pool


def test_the_tokens_that_fit_follow_the_replica_timing():
    timing = pool_of().replicas[0].timing
    assert timing.tokens_within(10, Load(1, 1), 0.4) == 0  # not even the first token
    assert timing.tokens_within(10, Load(1, 1), 0.5) == 1
    assert timing.tokens_within(10, Load(1, 1), 1.55) == 11


def test_lengths_come_from_the_recent_spread_or_the_mean():
    spread = observed_distribution([10] * 10 + [30] * 10, [], 64)
    median, planned = expected_lengths(spread, 99.0, 64, 0.9)
    assert median in (10, 30) and planned == 30
    assert expected_lengths(None, 12.4, 64, 0.9) == (12, 12)
    assert expected_lengths(None, 200.0, 64, 0.9) == (64, 64)  # within the goal's cap
    assert fit_probability(spread, 20, 20, 64) == pytest.approx(0.5, abs=0.05)
    assert fit_probability(None, 12, 6, 64) == 0.25 and fit_probability(None, 12, 64, 64) == 1


def test_a_goal_is_planned_on_the_earliest_replica_and_says_so():
    pool = pool_of(urls=('http://slow:1', 'http://fast:1'))
    pool.replicas[1].timing.itl_coef[0] = 0.02
    replica, plan = plan_on_pool(pool, None, 10.0, 40, 64, 5.0, CONFIG)
    assert replica.url == 'http://fast:1' and plan.predicted_tokens == 10
    assert plan.fit_probability == 1.0 and 'replica http://fast:1' in plan.note
    assert plan.est_wcet_s == pytest.approx(0.5 + 9 * 0.02)


def test_no_chance_is_refused_with_the_prediction():
    with pytest.raises(Rejection, match='no replica is predicted to answer in time'):
        plan_on_pool(pool_of(), None, 10.0, 40, 64, 0.3, CONFIG)


def test_a_goal_expected_to_miss_yields_only_when_others_share_the_replica():
    pool = pool_of()
    # Alone: admitted (its answer may be short); Kill bounds it.
    replica, plan = plan_on_pool(pool, None, 20.0, 40, 64, 1.0, CONFIG)
    assert plan.fit_probability == pytest.approx(6 / 40)  # 6 tokens fit; the mean is 20
    pool.started(replica, deadline=0.5)
    with pytest.raises(Rejection, match='yielding to the 1 goals running'):
        plan_on_pool(pool, observed_distribution([3, 20, 20], [], 64), 20.0, 40, 64, 1.0,
                     CONFIG)


def test_every_replica_down_is_refused_with_their_errors():
    pool = pool_of()
    goal = pool.started(pool.replicas[0], 1.0, 40)
    pool.ended(pool.replicas[0], RemoteAnswer(ended='failed', error='refused'), goal)
    with pytest.raises(Rejection, match='no replica is up .*refused'):
        plan_on_pool(pool, None, 10.0, 40, 64, 5.0, CONFIG)
