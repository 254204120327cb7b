# SPDX-License-Identifier: Apache-2.0
"""Admission on a replica pool: the length spread, the tokens that fit, the refusal rules."""

from types import SimpleNamespace

import pytest

from timebill_ros.core.length import observed_distribution
from timebill_ros.core.request import Rejection
from timebill_ros.serving.remote import RemoteAnswer
from timebill_ros.serving.replica_pool import Load, ReplicaPool
from timebill_ros.core.replica_admission import (
    chance_after, expected_lengths, fit_probability, LengthBasis, plan_on_pool)

CONFIG = SimpleNamespace(plan_quantile=0.9, admit_probability=0.001, yield_when_late=True,
                         idle_best_effort=False)


def pool_of(ttft_s=0.5, itl_s=0.1, urls=('http://a:1',)):
    pool = ReplicaPool(list(urls), clock=lambda: 0.0)
    for replica in pool.replicas:
        replica.timing.ttft_coef[:] = (ttft_s, 0.0, 0.0, 0.0)
        replica.timing.itl_coef[:] = (itl_s, 0.0)
    return pool


def test_the_tokens_that_fit_follow_the_replica_timing():
    timing = pool_of().replicas[0].timing
    assert timing.tokens_within(10, Load(1, 1), 0.4) == 0  # not even the first token
    assert timing.tokens_within(10, Load(1, 1), 0.5) == 1
    assert timing.tokens_within(10, Load(1, 1), 1.55) == 11


def test_lengths_come_from_the_recent_spread_or_the_mean():
    spread = observed_distribution([10] * 10 + [30] * 10, [], 64)
    median, planned = expected_lengths(LengthBasis(spread, 99.0), 64, 0.9)
    assert median in (10, 30) and planned == 30
    assert expected_lengths(LengthBasis(None, 12.4), 64, 0.9) == (12, 12)
    assert expected_lengths(LengthBasis(None, 200.0), 64, 0.9) == (64, 64)  # the goal's cap
    assert fit_probability(LengthBasis(spread, 0), 20, 20, 64) == pytest.approx(0.5, abs=0.05)
    mean = LengthBasis(None, 12.0)
    assert fit_probability(mean, 12, 6, 64) == 0.25 and fit_probability(mean, 12, 64, 64) == 1


def test_a_goal_is_planned_on_the_earliest_replica_and_says_so():
    pool = pool_of(urls=('http://slow:1', 'http://fast:1'))
    pool.replicas[1].timing.itl_coef[0] = 0.02
    replica, plan = plan_on_pool(pool, LengthBasis(None, 10.0), 40, 64, 5.0, CONFIG)
    assert replica.url == 'http://fast:1' and plan.predicted_tokens == 10
    assert plan.fit_probability == 1.0 and 'replica http://fast:1' in plan.note
    assert plan.est_wcet_s == pytest.approx(0.5 + 9 * 0.02)


def test_no_chance_is_refused_with_the_prediction():
    with pytest.raises(Rejection, match='no replica is predicted to answer in time'):
        plan_on_pool(pool_of(), LengthBasis(None, 10.0), 40, 64, 0.3, CONFIG)


def running_there(pool, replica, deadline, expected=15, cap=64):
    """Start a goal on ``replica`` whose answers run ``expected`` tokens, prefilled."""
    basis = LengthBasis(observed_distribution([expected] * 20, [], cap), float(expected))
    goal = pool.started(replica, deadline, 40, basis=basis, expected=expected, cap=cap)
    goal.prefilled = True
    return goal


def test_a_goal_yields_when_it_would_cost_the_goals_there_more_than_its_chance():
    pool = pool_of()
    # Alone: admitted with its chance (6 tokens fit, uniform up to twice the mean of 20).
    plan = plan_on_pool(pool, LengthBasis(None, 20.0), 40, 64, 1.0, CONFIG)[1]
    assert plan.fit_probability == pytest.approx(6 / 40)
    replica = pool.replicas[0]
    replica.timing.ttft_coef[1] = 0.001  # a prompt token prefills in 1 ms
    replica.timing.itl_coef[1] = 0.05  # each goal beside adds 50 ms a step
    running_there(pool, replica, deadline=3.0)  # 15 tokens left to stream, 30 fit alone
    thirds = LengthBasis(observed_distribution([3, 20, 20] * 7, [], 64), 20.0)
    # A 1,500-token prompt delays its 15 tokens by 1.5 s: 10 fit then, a sure deadline
    # lost for a third of one (14 of its own tokens fit).
    with pytest.raises(Rejection, match='yielding to the 1 goals running.*cost them 1.00 '
                                        'deadlines for its own chance 0.33'):
        plan_on_pool(pool, thirds, 1500, 64, 4.0, CONFIG)
    # A goal moved off a replica that failed was admitted already: it does not yield,
    moved = plan_on_pool(pool, thirds, 1500, 64, 4.0, CONFIG, moving=True)[1]
    assert 'expected to cost the goals there 1.00' in moved.note
    # and it goes on wherever a token still fits, at any chance; not where none does.
    few = plan_on_pool(pool, thirds, 40, 64, 0.7, CONFIG, moving=True)[1]
    assert few.fit_probability < CONFIG.admit_probability  # 1-2 tokens fit, no answer
    assert few.note.startswith('best effort after its replica failed')
    with pytest.raises(Rejection, match='no replica is predicted to answer in time'):
        plan_on_pool(pool, thirds, 40, 64, 0.7, CONFIG)
    with pytest.raises(Rejection, match='no replica is predicted to answer in time'):
        plan_on_pool(pool, thirds, 40, 64, 0.05, CONFIG, moving=True)
    # A 40-token prompt costs it nothing: it joins, though its median answer misses.
    plan = plan_on_pool(pool, thirds, 40, 64, 1.5, CONFIG)[1]
    assert 0 < plan.fit_probability < 0.5 and 'expected to cost' not in plan.note


def test_a_goal_beyond_a_replicas_seats_waits_for_the_first_to_end():
    pool = pool_of(urls=('http://full:1', 'http://free:1'))
    pool.seats = 1
    full, free = pool.replicas
    free.timing.itl_coef[0] = 0.2  # twice as slow a step, but a seat free
    running_there(pool, full, deadline=2.0)  # ends in 15 x 0.1 s
    route = pool.routes(40, 10, 5.0)[-1]
    assert route.replica is full and route.wait_s == pytest.approx(1.5)
    assert route.seconds == pytest.approx(1.5 + 0.5 + 9 * 0.1)
    assert 'waiting for one of its 1 seats' in route.stand_in
    replica, plan = plan_on_pool(pool, LengthBasis(None, 10.0), 40, 64, 5.0, CONFIG)
    assert replica is free and plan.est_wcet_s == pytest.approx(0.5 + 9 * 0.2)
    # A goal in flight ends by its Kill at the latest.
    running_there(pool, free, deadline=0.7)
    waits = {route.replica.url: route.wait_s for route in pool.routes(40, 10, 5.0)}
    assert waits == {'http://full:1': pytest.approx(1.5), 'http://free:1': pytest.approx(0.7)}


def test_the_chance_left_counts_only_answers_longer_than_the_tokens_streamed():
    spread = LengthBasis(observed_distribution([10] * 10 + [30] * 10, [], 64), 20.0)
    assert chance_after(spread, 20, 0, 20, 64) == pytest.approx(0.5, abs=0.05)
    assert chance_after(spread, 20, 15, 20, 64) == pytest.approx(0.0, abs=0.05)
    assert chance_after(spread, 20, 15, 40, 64) == pytest.approx(1.0, abs=0.05)
    assert chance_after(spread, 20, 15, 64, 64) == 1.0 and chance_after(spread, 20, 15, 9, 64) == 0


def test_every_replica_down_is_refused_with_their_errors():
    pool = pool_of()
    goal = pool.started(pool.replicas[0], 1.0, 40)
    pool.ended(pool.replicas[0], RemoteAnswer(ended='failed', error='refused'), goal)
    with pytest.raises(Rejection, match='no replica is up .*refused'):
        plan_on_pool(pool, LengthBasis(None, 10.0), 40, 64, 5.0, CONFIG)


def test_a_text_predictor_plans_each_goal_on_its_own_calibrated_prediction():
    from timebill_ros.core.length import LengthDistribution
    # Held-out pairs: predictions of 10 came true at 8-12, predictions of 60 at 50-70.
    dist = LengthDistribution.fit([10] * 20 + [60] * 20,
                                  list(range(8, 13)) * 4 + list(range(50, 71, 5)) * 4,
                                  min_per_band=20)
    pool = pool_of()
    short = LengthBasis(dist, 40.0, predicted=10, predictor='rlp-minilm')
    replica, plan = plan_on_pool(pool, short, 40, 128, 5.0, CONFIG)
    assert plan.predictor == 'rlp-minilm' and 8 <= plan.predicted_tokens <= 12
    assert 'rlp-minilm predicted 10' in plan.note and plan.fit_probability == 1.0
    # 2.0 s fits 16 tokens: a predicted long answer has no chance, a short one a sure one.
    assert plan_on_pool(pool, short, 40, 128, 2.0, CONFIG)[1].fit_probability == 1.0
    with pytest.raises(Rejection, match='rlp-minilm predicted 60'):
        plan_on_pool(pool, LengthBasis(dist, 40.0, 60, 'rlp-minilm'), 40, 128, 2.0, CONFIG)


def test_a_stale_idle_replica_is_planned_on_its_fresher_peers_figures():
    now = [30.0]
    pool = pool_of(urls=('http://busy:1', 'http://stale:1'))
    pool.clock = lambda: now[0]
    busy, stale = pool.replicas
    stale.timing.itl_coef[0] = 0.5  # measured slow long ago: 3.0 s for 6 tokens
    busy.timing.itl_coef[1] = 0.1  # each goal beside adds 0.1 s a token
    stale.timing.last_sample, busy.timing.last_sample = 0.0, 29.0
    for _ in range(2):
        pool.started(busy, 31.0, 40)
    # busy, two running: 0.5 + 5 x 0.3 = 2.0 s; stale timed as busy idle: 1.0 s.
    replica, plan = plan_on_pool(pool, LengthBasis(None, 6.0), 40, 64, 1.5, CONFIG)
    assert replica is stale and plan.est_wcet_s == pytest.approx(1.0)
    assert 'no stream for 30.0 s: timed as http://busy:1' in plan.note


def test_an_idle_replica_runs_a_goal_without_a_chance_as_best_effort():
    pool = pool_of()
    config = SimpleNamespace(**{**vars(CONFIG), 'idle_best_effort': True})
    spread = observed_distribution([60] * 20, [], 64)
    # 6 tokens fit, the answers run 60: refused while a goal runs there, tried when idle.
    replica, plan = plan_on_pool(pool, LengthBasis(spread, 60.0), 40, 64, 1.0, config)
    assert plan.note.startswith('best effort on an idle replica') and plan.fit_probability == 0
    pool.started(replica, deadline=0.5)
    with pytest.raises(Rejection):
        plan_on_pool(pool, LengthBasis(spread, 60.0), 40, 64, 1.0, config)
    with pytest.raises(Rejection, match='no replica is predicted'):  # not even one token
        plan_on_pool(pool_of(), LengthBasis(spread, 60.0), 40, 64, 0.3, config)
