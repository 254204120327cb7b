# SPDX-License-Identifier: Apache-2.0
"""Length buckets, predictor metrics and the data-derived pessimistic factor."""

import math

import numpy as np
import pytest

from timebill_ros.core.length import (
    bucket_floor_mae, cap_prediction, coverage, decode_buckets, from_bucket, LengthDistribution,
    metrics, num_buckets, observed_distribution, pessimistic_factor, to_bucket)


def test_bucket_round_trip_is_an_upper_bound_within_one_bucket():
    for length in range(0, 300):
        n_hat = from_bucket(to_bucket(length, 16, 256), 16, 256)
        assert min(length, 256) <= n_hat < min(length, 256) + 16 or n_hat == 256
    assert to_bucket(0, 16, 256) == 0 and to_bucket(1, 16, 256) == 1
    assert to_bucket(16, 16, 256) == 1 and to_bucket(17, 16, 256) == 2
    assert to_bucket(10_000, 16, 256) == 16 == num_buckets(256, 16) - 1
    with pytest.raises(ValueError):
        to_bucket(-1, 16, 256)


def test_metrics_known_values():
    m = metrics([10, 20, 30], [10, 20, 40])
    assert m['mae'] == pytest.approx(10 / 3)
    assert m['rmse'] == pytest.approx((100 / 3) ** 0.5)
    assert m['r2'] == pytest.approx(1 - 100 / 466.6667, rel=1e-4)
    assert metrics([1, 2, 3], [1, 2, 3])['r2'] == 1.0


def test_pessimistic_factor_reaches_the_quantile_and_no_less_suffices():
    predicted = [100] * 10
    actual = [50, 80, 100, 110, 120, 130, 150, 180, 200, 400]
    k = pessimistic_factor(predicted, actual, 0.9, n_max=1000)
    assert k == pytest.approx(2.0)
    assert coverage(predicted, actual, k, 1000) >= 0.9
    assert coverage(predicted, actual, k - 0.01, 1000) < 0.9
    # The cap covers long answers: with N_max 150 every true length <= 150 is covered.
    assert pessimistic_factor(predicted, [min(a, 150) for a in actual], 1.0, 150) == 1.5
    assert pessimistic_factor(predicted, [10] * 10, 0.95, 1000) == 1.0


def test_decode_rules_on_a_bimodal_distribution():
    # 40 % "about 32 tokens", 60 % "runs to N_max": argmax and median pick the cap,
    # the mean lies between the modes.
    probs = np.zeros(17)
    probs[2], probs[16] = 0.4, 0.6
    assert decode_buckets(probs, 16, 256, 'argmax')[0] == 256
    assert decode_buckets(probs, 16, 256, 'median')[0] == 256
    assert decode_buckets(probs, 16, 256, 'mean')[0] == pytest.approx(0.4 * 32 + 0.6 * 256)
    probs[2], probs[16] = 0.6, 0.4
    assert decode_buckets(probs, 16, 256, 'median')[0] == 32


def test_decode_rejects_unknown_rule_and_wrong_width():
    with pytest.raises(ValueError, match='decode rule'):
        decode_buckets(np.ones(17), 16, 256, 'mode')
    with pytest.raises(ValueError, match='buckets'):
        decode_buckets(np.ones(5), 16, 256, 'mean')


def test_a_prediction_at_n_max_plans_for_the_goal_cap():
    assert cap_prediction(100.4, 256, 512) == 100
    assert cap_prediction(256, 256, 512) == 512  # ran to the labels' cap: may go on
    assert cap_prediction(256, 256, 128) == 128
    assert cap_prediction(300, 256, 1024) == 1024
    assert cap_prediction(0.2, 256, 64) == 1


def test_bucket_floor_is_the_error_of_a_perfect_classifier():
    # ceil(5 / 10) = bucket 1 decodes to 10; 10 and N_max decode to themselves.
    assert bucket_floor_mae([5, 10, 100], 10, 100) == pytest.approx(5 / 3)
    assert bucket_floor_mae([0, 16, 32], 16, 256) == 0.0
    with pytest.raises(ValueError):
        bucket_floor_mae([], 16, 256)


def test_length_distribution_bands_quantiles_and_probabilities():
    from timebill_ros.core.length import LengthDistribution
    # Short predictions come true (4..6); long ones spread over 100..200.
    pred = [5] * 40 + [150] * 40
    actual = [4 + 2 * i / 39 for i in range(40)] + [100 + 100 * i / 39 for i in range(40)]
    dist = LengthDistribution.fit(pred, actual, min_per_band=20)
    assert dist.samples == (40, 40) and dist.edges[0] == 5.0
    assert dist.quantile(0.5, 3) == pytest.approx(5.0)
    assert dist.quantile(0.9, 200) == pytest.approx(190.0)
    assert dist.prob_at_most(3, 5) == 0.0 and dist.prob_at_most(6, 5) == 1.0
    assert dist.prob_at_most(150, 150) == pytest.approx(0.5, abs=0.02)
    probs = [dist.prob_at_most(n, 150) for n in range(90, 210, 5)]
    assert probs == sorted(probs)  # a CDF
    again = LengthDistribution.from_arrays(dist.to_arrays())
    assert again == dist
    assert LengthDistribution.from_arrays({}) is None
    with pytest.raises(ValueError):
        LengthDistribution.fit([1], [1])


def test_observed_lengths_count_cut_answers_as_longer_not_shorter():
    finished, cut = [5, 10, 10, 40], [20, 3]
    dist = observed_distribution(finished, cut, ceiling=128)
    # Kaplan-Meier: the answer cut at 3 tokens leaves the risk set; 5 is 1 of 5 left.
    assert dist.prob_at_most(5, 0) == pytest.approx(0.2)
    assert dist.prob_at_most(10, 0) == pytest.approx(0.6)
    assert dist.quantile(1.0, 0) == 40.0
    # Counted as finished, the cut answers would have made short answers likelier.
    naive = observed_distribution(finished + cut, [], ceiling=128)
    assert naive.prob_at_most(5, 0) > dist.prob_at_most(5, 0)
    # Cut beyond the last finished length: that share is planned at the ceiling.
    tail = observed_distribution([5, 10, 10], [20, 30], ceiling=128)
    assert tail.quantile(0.9, 0) == 128.0 and tail.prob_at_most(10, 0) == pytest.approx(0.6)
    assert observed_distribution([], [4, 8], ceiling=128) is None


def test_the_marginal_mixes_the_bands_by_their_samples():
    dist = LengthDistribution((10.0, math.inf), (0.0, 0.5, 1.0),
                              ((2.0, 4.0, 6.0), (50.0, 60.0, 70.0)), (30, 10))
    marginal = dist.marginal()
    assert marginal.edges == (math.inf,) and marginal.samples == (40,)
    # Three quarters of the calibration pairs are short answers.
    assert marginal.prob_at_most(6.0, 0) == pytest.approx(0.75)
    assert marginal.quantile(0.5, 0) <= 6.0 < 50.0 <= marginal.quantile(0.9, 0)
    assert marginal.quantile(0.0, 0) == 2.0 and marginal.quantile(1.0, 0) == 70.0


def test_the_scipy_parts_a_goal_may_need_are_imported_with_the_core_not_on_first_use():
    # A first import costs 0.2-0.3 s: paid inside a goal, it killed a 0.4 s one.
    import subprocess
    import sys
    code = ('import sys, timebill_ros.core.length, timebill_ros.core.timing; '
            "print('scipy.stats' in sys.modules, 'scipy.optimize' in sys.modules)")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ['True', 'True']
