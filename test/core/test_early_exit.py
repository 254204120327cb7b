# SPDX-License-Identifier: Apache-2.0
import math

import pytest

from timebill_ros.core.early_exit import (
    CONTINUE, ExitRule, FORCED, LayerTimes, p99_tpot_estimate, schedulable,
    THRESHOLD)
from timebill_ros.core.telemetry import percentile

TIMES = LayerTimes(tuple([0.002] * 30), 0.01)  # full step 70 ms


def test_layer_times_sums():
    assert TIMES.full_s == pytest.approx(0.07)
    assert TIMES.after(20) == pytest.approx(10 * 0.002 + 0.01)
    assert TIMES.until(10) == pytest.approx(10 * 0.002 + 0.01)
    assert TIMES.scaled(0.14).full_s == pytest.approx(0.14)
    with pytest.raises(ValueError):
        LayerTimes((), 0.0)
    with pytest.raises(ValueError):
        LayerTimes((0.1, -1.0), 0.0)


def test_fixed_threshold_exits_on_confidence_only():
    rule = ExitRule((10, 20), 0.8, 0.8)
    assert rule.decide(10, 0.85, 0.0, None, TIMES) == THRESHOLD
    assert rule.decide(10, 0.5, 0.0, None, TIMES) == CONTINUE
    assert rule.decide(10, 0.5, 0.001, 1.0, TIMES) == CONTINUE  # plenty of time


def test_threshold_decays_with_time_used():
    rule = ExitRule((10, 20), 0.8, 0.3)
    assert rule.threshold(0.0) == pytest.approx(0.8) and rule.threshold(1.0) == pytest.approx(0.3)
    assert rule.threshold(0.5) == pytest.approx(0.55)
    # 0.6 passes only once half the token's budget is gone.
    assert rule.decide(10, 0.6, 0.01, 1.0, TIMES) == CONTINUE
    assert rule.decide(10, 0.6, 0.6, 1.0, TIMES) == THRESHOLD  # threshold now 0.5


def test_forced_exit_when_the_rest_cannot_fit():
    rule = ExitRule((10, 20), 0.99, 0.99)
    # After layer 10: reaching candidate 20 costs 10 layers + head = 30 ms.
    assert rule.decide(10, 0.1, 0.02, 0.049, TIMES) == FORCED   # 29 ms left < 30 ms
    assert rule.decide(10, 0.1, 0.02, 0.051, TIMES) == CONTINUE  # 31 ms left
    # At the last candidate the rest is the full remainder (10 layers + head).
    assert rule.decide(20, 0.1, 0.04, 0.069, TIMES) == FORCED
    assert rule.decide(20, 0.1, 0.04, 0.071, TIMES) == CONTINUE


def test_rule_validation():
    for bad in (dict(exit_layers=()), dict(exit_layers=(20, 10)), dict(exit_layers=(0, 5)),
                dict(exit_layers=(5,), threshold_start=0.0),
                dict(exit_layers=(5,), threshold_start=0.3, threshold_end=0.8)):
        with pytest.raises(ValueError):
            ExitRule(**bad)


def test_schedulability_and_percentiles():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 99) == pytest.approx(99)
    assert math.isnan(percentile([], 99))
    assert p99_tpot_estimate(0.05, 0.2) == pytest.approx(0.06)
    assert schedulable(0.05, 0.1) == (True, pytest.approx(0.5))
    ok, u = schedulable(0.12, 0.1)
    assert not ok and u == pytest.approx(1.2)
    with pytest.raises(ValueError):
        schedulable(0.1, float('nan'))
