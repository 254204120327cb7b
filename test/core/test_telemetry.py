# SPDX-License-Identifier: Apache-2.0
"""Telemetry statistics and diagnostic levels."""

import math

import pytest

from timebill_ros.core.request import Outcome
from timebill_ros.core.telemetry import (
    GoalRecord, Level, level_for, percentile, Telemetry, Thresholds, tpot_stats)


def test_percentile_matches_numpy_linear():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 25) == 2.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert math.isnan(percentile([], 50))


def test_tpot_stats():
    stats = tpot_stats([0.01, 0.02, 0.03])
    assert stats['mean'] == pytest.approx(0.02)
    assert stats['max'] == 0.03
    assert tpot_stats([])['p99'] == 0.0


def test_miss_rate_window_and_counts():
    tel = Telemetry(window=4)
    assert math.isnan(tel.miss_rate)
    for met in (False, False, True, True, True, True):
        tel.finished(GoalRecord(Outcome.COMPLETED, met, 1.0, (0.01,)))
    assert tel.miss_rate == 0.0  # the two misses fell out of the window
    tel.finished(GoalRecord(Outcome.KILLED, False, 2.0, (0.02, 0.03)))
    tel.finished(GoalRecord(Outcome.CANCELED, False, 0.5))
    summary = tel.summary()
    assert summary['completed'] == 6 and summary['killed'] == 1 and summary['canceled'] == 1
    assert summary['miss_rate'] == 0.25  # cancellations are not deadline results
    assert summary['last_e2e_s'] == 0.5
    assert summary['tpot_p50_s'] == pytest.approx(0.01)


def test_levels():
    th = Thresholds(0.1, 0.5)
    assert level_for(math.nan, th) == Level.OK
    assert level_for(0.05, th) == Level.OK
    assert level_for(0.1, th) == Level.WARN
    assert level_for(0.6, th) == Level.ERROR
    with pytest.raises(ValueError):
        Thresholds(0.6, 0.5)


def test_length_and_ete_errors_in_summary():
    tel = Telemetry(window=3)
    assert math.isnan(tel.summary()['length_abs_error_mean'])
    for predicted, actual in ((100, 80), (50, 70), (10, 10), (30, 31)):
        tel.length_error(predicted, actual)
    assert tel.summary()['length_abs_error_mean'] == pytest.approx((20 + 0 + 1) / 3)
    tel.ete_error(-4.0)
    tel.ete_error(float('nan'))  # ignored
    tel.ete_error(2.0)
    assert tel.summary()['ete_abs_error_p50_pct'] == pytest.approx(3.0)
    assert tel.summary()['ete_error_last_pct'] == 2.0


def test_rejections_on_a_prediction_sum_their_fit_probabilities():
    telemetry = Telemetry()
    telemetry.deadline_rejection(0.02)
    telemetry.deadline_rejection(0.03)
    summary = telemetry.summary()
    assert summary['rejected_on_prediction'] == 2
    assert summary['false_rejections_expected'] == pytest.approx(0.05)
