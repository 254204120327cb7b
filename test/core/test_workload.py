# SPDX-License-Identifier: Apache-2.0
"""Workload arrival patterns and items: shapes, determinism, argument validation."""

import math

import numpy as np
import pytest

from timebill_ros.core.workload import (
    arrivals, burst_arrivals, check_workload, DEFAULT_INSTRUCTIONS, make_workload, MODES,
    periodic_arrivals, poisson_arrivals, POLICIES, WorkloadItem)


def test_periodic():
    assert periodic_arrivals(4, 0.5).tolist() == [0.0, 0.5, 1.0, 1.5]
    assert periodic_arrivals(3, 2.0, start_s=1.0).tolist() == [1.0, 3.0, 5.0]
    assert periodic_arrivals(0, 1.0).tolist() == []


def test_poisson_is_seeded_increasing_and_has_the_rate():
    a = poisson_arrivals(2000, 4.0, seed=7)
    assert np.array_equal(a, poisson_arrivals(2000, 4.0, seed=7))
    assert not np.array_equal(a, poisson_arrivals(2000, 4.0, seed=8))
    assert a[0] > 0 and np.all(np.diff(a) > 0)
    # Mean gap 1 / rate within a few standard errors (0.25 / sqrt(2000) ~ 0.006).
    assert np.mean(np.diff(a)) == pytest.approx(0.25, abs=0.03)
    assert poisson_arrivals(3, 1.0, seed=1, start_s=10.0)[0] > 10.0


def test_burst():
    assert burst_arrivals(5, 2, 1.0).tolist() == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert burst_arrivals(4, 2, 1.0, spacing_s=0.1).tolist() == pytest.approx(
        [0.0, 0.1, 1.0, 1.1])
    assert burst_arrivals(3, 3, 5.0, start_s=2.0).tolist() == [2.0, 2.0, 2.0]


def test_dispatch_by_name():
    assert arrivals('periodic', 2, period_s=1.0).tolist() == [0.0, 1.0]
    assert np.array_equal(arrivals('poisson', 3, rate_hz=2.0, seed=3),
                          poisson_arrivals(3, 2.0, seed=3))
    assert arrivals('burst', 3, burst_size=2, period_s=1.0).tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize('call, match', [
    (lambda: periodic_arrivals(3, 0.0), 'period_s must be > 0'),
    (lambda: periodic_arrivals(3, -1.0), 'period_s must be > 0'),
    (lambda: periodic_arrivals(3, math.inf), 'period_s must be finite'),
    (lambda: periodic_arrivals(-1, 1.0), 'count must be in'),
    (lambda: periodic_arrivals(2.5, 1.0), 'count must be an integer'),
    (lambda: periodic_arrivals(True, 1.0), 'count must be an integer'),
    (lambda: periodic_arrivals(2, 1.0, start_s=-1.0), 'start_s must be >= 0'),
    (lambda: poisson_arrivals(3, 0.0), 'rate_hz must be > 0'),
    (lambda: poisson_arrivals(3, math.nan), 'rate_hz must be finite'),
    (lambda: poisson_arrivals(3, 1.0, seed=-1), 'seed must be in'),
    (lambda: poisson_arrivals(3, '2'), 'rate_hz must be a number'),
    (lambda: burst_arrivals(3, 0, 1.0), 'burst_size must be in'),
    (lambda: burst_arrivals(3, 2, 0.0), 'period_s must be > 0'),
    (lambda: burst_arrivals(3, 2, 1.0, spacing_s=-0.1), 'spacing_s must be >= 0'),
    (lambda: burst_arrivals(4, 3, 1.0, spacing_s=0.5), 'shorter than period_s'),
    (lambda: arrivals('uniform', 3, period_s=1.0), 'unknown arrival pattern'),
    (lambda: arrivals('periodic', 3), 'needs period_s'),
    (lambda: arrivals('poisson', 3), 'needs rate_hz'),
    (lambda: arrivals('burst', 3, period_s=1.0), 'needs burst_size'),
])
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_make_workload_cycles_instructions_and_budgets():
    items = make_workload([0.0, 0.5, 1.0], [1.0, 2.0], ['a', 'b'], mode=MODES['none'],
                          policy=POLICIES['skip_next'], max_new_tokens=8, id_prefix='w')
    assert [i.id for i in items] == ['w-0000', 'w-0001', 'w-0002']
    assert [i.instruction for i in items] == ['a', 'b', 'a']
    assert [i.budget_s for i in items] == [1.0, 2.0, 1.0]
    assert [i.arrival_s for i in items] == [0.0, 0.5, 1.0]
    assert all(i.mode == 1 and i.policy == POLICIES['skip_next'] == 2 and i.max_new_tokens == 8
               for i in items)
    # A single string and a single budget are not cycled character by character.
    one = make_workload([0.0, 1.0], 3.0, 'hello')
    assert [i.instruction for i in one] == ['hello', 'hello'] and one[1].budget_s == 3.0
    assert make_workload([0.0], 1.0)[0].instruction == DEFAULT_INSTRUCTIONS[0]


@pytest.mark.parametrize('kwargs, match', [
    (dict(arrival_s=[1.0, 0.5]), 'non-decreasing'),
    (dict(budget_s=[]), 'at least one budget'),
    (dict(instructions=[]), 'at least one instruction'),
    (dict(id_prefix=''), 'id_prefix'),
    (dict(budget_s=math.nan), 'budget_s must be finite'),
    (dict(policy=300), 'policy must be in'),
])
def test_make_workload_validates(kwargs, match):
    args = dict(arrival_s=[0.0, 1.0], budget_s=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_workload(**args)


@pytest.mark.parametrize('kwargs, match', [
    (dict(id=''), 'id must be a non-empty string'),
    (dict(id=3), 'id must be a non-empty string'),
    (dict(instruction=None), 'instruction must be a string'),
    (dict(budget_s=-1.0), 'budget_s must be in'),
    (dict(budget_s=2.0**31), 'budget_s must be in'),
    (dict(budget_s=math.inf), 'budget_s must be finite'),
    (dict(arrival_s=-0.1), 'arrival_s must be >= 0'),
    (dict(mode=-1), 'mode must be in'),
    (dict(max_new_tokens=2**32), 'max_new_tokens must be in'),
    (dict(max_new_tokens=1.5), 'max_new_tokens must be an integer'),
    (dict(pessimistic_factor=-1.0), 'pessimistic_factor must be >= 0'),
    (dict(eviction_ratio=math.nan), 'eviction_ratio must be finite'),
    (dict(expected_tokens=-1), 'expected_tokens must be in'),
    (dict(token_deadline_s=-0.5), 'token_deadline_s must be in'),
    (dict(precision=8), 'precision must be a string'),
])
def test_item_refuses_what_a_message_cannot_carry(kwargs, match):
    args = dict(id='a', instruction='hi', budget_s=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        WorkloadItem(**args)


def test_item_passes_through_what_the_node_judges():
    # The node rejects these with a reason; a workload may want to see that.
    item = WorkloadItem('a', '', 0.0, mode=MODES['early_exit'], eviction_ratio=2.0,
                        precision='fp7')
    assert item.instruction == '' and item.budget_s == 0.0
    assert item.eviction_ratio == 2.0 and item.precision == 'fp7'


def test_check_workload_sorts_and_refuses_duplicate_ids():
    a, b = WorkloadItem('a', 'x', 1.0, 2.0), WorkloadItem('b', 'y', 1.0, 1.0)
    assert check_workload([a, b]) == [b, a]
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        check_workload([a, WorkloadItem('a', 'z', 1.0, 3.0)])
    with pytest.raises(ValueError, match='not a WorkloadItem'):
        check_workload([a, 'b'])
