# SPDX-License-Identifier: Apache-2.0
"""Mixed precision: unit-time fits, the knapsack DP against brute force, fidelity."""

import itertools
import random

import pytest

from timebill_ros.core.precision import (
    fit_unit_times, Mix, pick_int8, PrecisionTable, UnitTimes)


def table(full, low, kl, all_low=None, rest=0.0):
    return PrecisionTable('int8', UnitTimes(tuple(full), (0.0,) * len(full), rest),
                          UnitTimes(tuple(low), (0.0,) * len(low), rest), tuple(kl),
                          all_low if all_low is not None else sum(kl), resolution_s=1e-5)


def test_fit_unit_times_recovers_per_unit_lines_and_the_rest():
    kvs = [64, 1024, 2048]
    truth = [(0.002, 0.001), (0.003, 0.0), (0.0005, 0.0002)]
    units = [[a + c * kv / 1024 for a, c in truth] for kv in kvs]
    steps = [sum(row) + 0.004 + 0.0005 * kv / 1024 for row, kv in zip(units, kvs)]
    fit = fit_unit_times(kvs, units, steps)
    assert fit.a == pytest.approx([a for a, _ in truth], abs=1e-9)
    assert fit.c == pytest.approx([c for _, c in truth], abs=1e-9)
    assert fit.rest(1024) == pytest.approx(0.0045)
    assert fit.total(512) == pytest.approx(sum(a + c * 0.5 for a, c in truth) + 0.00425)
    with pytest.raises(ValueError):
        fit_unit_times([64, 64], units[:2], steps[:2])


def brute_force(t: PrecisionTable, budget, full_step, low_step):
    best = None
    for r in range(t.units + 1):
        for lowered in itertools.combinations(range(t.units), r):
            mix = Mix(lowered, t.units)
            if t.step_scale(mix, 0.0, full_step, low_step) <= budget + 1e-12:
                kl = t.predicted_kl(lowered)
                if best is None or kl < best - 1e-12:
                    best = kl
    return best


def test_the_dp_finds_the_least_kl_mix_that_fits_as_brute_force_does():
    rng = random.Random(3)
    for _ in range(150):
        n = rng.randint(1, 7)
        full = [rng.uniform(0.001, 0.004) for _ in range(n)]
        low = [f * rng.uniform(0.3, 0.9) for f in full]
        kl = [rng.uniform(0.0, 0.5) for _ in range(n)]
        t = table(full, low, kl, rest=0.001)
        full_step, low_step = t.full_times.total(0), t.low_times.total(0)
        budget = rng.uniform(low_step * 0.9, full_step * 1.05)
        mix = t.choose(0.0, full_step, low_step, budget)
        expected = brute_force(t, budget, full_step, low_step)
        if mix is None:
            # Only when nothing fits, or rounding down the savings lost a near-exact fit.
            assert expected is None or budget - low_step < n * t.resolution_s
            continue
        assert t.step_scale(mix, 0.0, full_step, low_step) <= budget + 1e-12
        assert expected is not None
        # Savings rounded down may cost a little more KL than the exact optimum, never less.
        assert mix.predicted_kl >= expected - 1e-12
        assert mix.predicted_kl <= expected + max(kl) + 1e-12


def test_the_dp_picks_the_cheap_quality_layers_and_the_extremes():
    # Unit 2 saves as much as unit 0 at a tenth of the KL; the head (3) is sensitive.
    t = table([0.002, 0.002, 0.002, 0.004], [0.001, 0.001, 0.001, 0.001],
              [0.10, 0.05, 0.01, 0.90])
    full_step, low_step = t.full_times.total(0), t.low_times.total(0)
    assert t.choose(0.0, full_step, low_step, full_step).is_full
    one = t.choose(0.0, full_step, low_step, full_step - 0.001)
    assert one.lowered == (2,) and one.predicted_kl == pytest.approx(0.01)
    two = t.choose(0.0, full_step, low_step, full_step - 0.002)
    assert two.lowered == (1, 2)
    assert t.choose(0.0, full_step, low_step, low_step).is_all_low
    assert t.choose(0.0, full_step, low_step, low_step * 0.9) is None
    assert Mix((0, 1, 2, 5, 7), 9).describe() == 'layers 0-2,5,7'
    assert Mix((3, 8), 9).describe() == 'layers 3 + lm_head'


def test_fidelity_and_length_follow_the_share_of_the_all_low_kl():
    t = table([0.002] * 3, [0.001] * 3, [0.1, 0.1, 0.2], all_low=0.5)
    assert t.fidelity(Mix((), 3), 0.53) == 1.0
    assert t.fidelity(Mix((0,), 3, 0.1), 0.53) == pytest.approx(1 - 0.47 * 0.2)
    assert t.fidelity(Mix((0, 1, 2), 3, 0.4), 0.53) == pytest.approx(1 - 0.47 * 0.8)
    assert t.length_factor(Mix((0,), 3, 0.1), 1.5) == pytest.approx(1.1)


def test_pick_int8_keeps_int8_weight_unless_int8_dynamic_is_clearly_faster():
    assert pick_int8(0.030, 0.030) == 'int8-weight'
    assert pick_int8(0.025, 0.030) == 'int8-weight'  # 1.2x: not worth its drift
    assert pick_int8(0.020, 0.030) == 'int8-dynamic'  # 1.5x
    assert pick_int8(0.030, 0.020) == 'int8-weight'
    assert pick_int8(0.020, 0.030, margin=2.0) == 'int8-weight'
    with pytest.raises(ValueError):
        pick_int8(0.0, 0.03)
