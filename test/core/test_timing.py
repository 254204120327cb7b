# SPDX-License-Identifier: Apache-2.0
"""ETE fits, MAPE, WCET sum and online refinement."""

import numpy as np
import pytest

from timebill_ros.core.timing import (
    ape, fewest_threads, fit_decode, fit_prefill, mape, OnlineTimingModel, TimingModel,
    with_cached_prefix, worst_case_tokens)

TRUE = TimingModel(a=2e-7, b=4e-4, c=0.02, p=1e-5, q=0.035)


def test_fit_recovers_known_coefficients_from_noisy_timings():
    rng = np.random.default_rng(0)
    n_x = np.repeat(np.linspace(64, 4096, 12), 5)
    t = np.array([TRUE.prefill(n) for n in n_x]) * rng.normal(1.0, 0.01, n_x.size)
    a, b, c = fit_prefill(n_x, t)
    assert a == pytest.approx(TRUE.a, rel=0.1)
    assert b == pytest.approx(TRUE.b, rel=0.1)
    n_kv = np.repeat(np.linspace(32, 4096, 12), 5)
    t = np.array([TRUE.step(n) for n in n_kv]) * rng.normal(1.0, 0.01, n_kv.size)
    p, q = fit_decode(n_kv, t)
    assert p == pytest.approx(TRUE.p, rel=0.05)
    assert q == pytest.approx(TRUE.q, rel=0.02)
    fitted = TimingModel(a, b, c, p, q)
    held_out = [100, 1000, 3000]
    assert mape([fitted.prefill(n) for n in held_out], [TRUE.prefill(n) for n in held_out]) < 5


def test_fit_needs_enough_distinct_points():
    with pytest.raises(ValueError):
        fit_prefill([10, 10, 20], [1, 1, 2])
    with pytest.raises(ValueError):
        fit_decode([5, 5], [1, 1])


def test_mape_known_values():
    assert mape([110, 90], [100, 100]) == pytest.approx(10.0)
    assert ape([1.5], [1.0]) == [pytest.approx(50.0)]
    with pytest.raises(ValueError):
        mape([1], [0])


def test_decode_closed_form_equals_the_sum():
    for kv0, tokens in [(0, 1), (100, 2), (1234.5, 57)]:
        direct = sum(TRUE.step(kv0 + i - 1) for i in range(1, tokens))
        assert TRUE.decode(kv0, tokens) == pytest.approx(direct)


def test_wcet_uses_evicted_cache():
    assert TRUE.wcet(2000, 0.5, 50) == pytest.approx(
        TRUE.prefill(2000) + TRUE.decode(1000, 50))
    assert TRUE.wcet(2000, 0.5, 50, t_predict=0.3) == pytest.approx(
        TRUE.wcet(2000, 0.5, 50) + 0.3)


def test_worst_case_tokens():
    assert worst_case_tokens(100, 1.5, 1000) == 150
    assert worst_case_tokens(100, 5.0, 256) == 256
    assert worst_case_tokens(0, 2.0, 256) == 2
    with pytest.raises(ValueError):
        worst_case_tokens(10, 0.5, 100)


def test_online_model_follows_a_slowdown():
    online = OnlineTimingModel(TRUE, capacity=64, forgetting=0.9)
    online.seed([(n, TRUE.prefill(n)) for n in (128, 512, 1024, 2048)],
                [(n, TRUE.step(n)) for n in (128, 512, 1024, 2048)])
    slow = TimingModel(TRUE.a * 1.5, TRUE.b * 1.5, TRUE.c * 1.5, TRUE.p * 1.5, TRUE.q * 1.5)
    for n in (300, 900, 1500, 2500, 3500, 600, 1200, 2000) * 3:
        steps = [slow.step(n + i) for i in range(32)]
        model = online.observe(n, slow.prefill(n), n, steps)
    assert model.step(1000) == pytest.approx(slow.step(1000), rel=0.05)
    assert model.prefill(1000) == pytest.approx(slow.prefill(1000), rel=0.05)
    assert len(online.decode_samples) <= 64


def test_online_drift_factor_closes_a_steady_slowdown_within_two_goals():
    online = OnlineTimingModel(TRUE)
    online.seed([(n, TRUE.prefill(n)) for n in (128, 512, 1024, 2048, 3072, 4096)] * 3,
                [(n, TRUE.step(n)) for n in (16, 512, 1024, 2048, 3072, 4096)] * 3)
    slow = TimingModel(*(1.1 * v for v in (TRUE.a, TRUE.b, TRUE.c, TRUE.p, TRUE.q)))
    n = 1900
    for _ in range(2):
        model = online.observe(n, slow.prefill(n), n, [slow.step(n + i) for i in range(255)])
    assert model.prefill(n) == pytest.approx(slow.prefill(n), rel=0.03)
    assert model.decode(n, 256) == pytest.approx(slow.decode(n, 256), rel=0.03)
    # A faster machine is followed the same way, and no sample moves the factor past 3x.
    assert 1.0 < online.drift_decode <= 3.0


def test_online_model_reproduces_a_goal_at_new_lengths_without_overshoot():
    # Calibrated up to 2,048 tokens; the first goal runs at 4,000 on a 10 % slower
    # machine. The re-fit follows that goal, so the drift factor must not count the
    # gap a second time (measured against the pre-fit it made plans ~5 % too long).
    online = OnlineTimingModel(TRUE)
    online.seed([(n, TRUE.prefill(n)) for n in (32, 256, 512, 768, 1024, 1536, 2048)],
                [(n, TRUE.step(n)) for n in (16, 512, 768, 1024, 1536, 2048)])
    slow = TimingModel(*(1.1 * v for v in (TRUE.a, TRUE.b, TRUE.c, TRUE.p, TRUE.q)))
    n = 4000
    model = online.observe(n, slow.prefill(n), n, [slow.step(n + i) for i in range(511)])
    assert model.prefill(n) == pytest.approx(slow.prefill(n), rel=0.02)
    assert model.decode(n, 512) == pytest.approx(slow.decode(n, 512), rel=0.02)
    # A second goal with a short (evicted) cache pins the other end of the line.
    model = online.observe(n, slow.prefill(n), 200, [slow.step(200 + i) for i in range(511)])
    assert model.decode(200, 512) == pytest.approx(slow.decode(200, 512), rel=0.03)
    assert model.decode(n, 512) == pytest.approx(slow.decode(n, 512), rel=0.03)


def test_online_drift_gain_zero_keeps_the_plain_refit():
    online = OnlineTimingModel(TRUE, drift_gain=0.0)
    online.observe(1000, 2 * TRUE.prefill(1000), 1000, [2 * TRUE.step(1000 + i) for i in range(9)])
    assert online.drift_prefill == online.drift_decode == 1.0
    with pytest.raises(ValueError):
        OnlineTimingModel(TRUE, drift_gain=1.5)


def seeded(model: TimingModel, steps_per_goal: int = 8) -> OnlineTimingModel:
    # Six points each, as a profile from timebill_calibrate holds.
    online = OnlineTimingModel(model, steps_per_goal=steps_per_goal)
    online.seed([(n, model.prefill(n)) for n in (32, 128, 256, 512, 1024, 2048)],
                [(n, model.step(n)) for n in (16, 128, 256, 512, 1024, 2048)])
    return online


def test_a_variant_timed_in_a_slow_moment_recovers_from_the_main_models_goals():
    fast = TimingModel(TRUE.a, TRUE.b, TRUE.c, TRUE.p * 0.8, TRUE.q * 0.8)  # 1.25x faster
    # The node seeds a resident copy's ETE with one sample per goal (serving.assembly).
    main, variant = seeded(TRUE), seeded(fast, steps_per_goal=1)
    every = [main, variant]

    def observe(ete, truth, slowdown):
        before = ete.drift_decode
        ete.observe(100, 0.0, 100, [truth.step(100 + i) * slowdown for i in range(31)])
        ete.share_decode_drift(every, before)
    observe(variant, fast, 1.4)  # the variant's one goal ran while another guest was busy
    # The machine was slow for both; the variant keeps most of its own lead.
    assert variant.model.step(100) > fast.step(100) * 1.1
    assert main.model.step(100) > TRUE.step(100) * 1.1
    assert main.model.step(100) / variant.model.step(100) > 1.1
    for _ in range(4):  # the machine is back to its speed; only full-precision goals run
        observe(main, TRUE, 1.0)
    assert main.model.step(100) == pytest.approx(TRUE.step(100), rel=0.05)
    # The variant followed: it is faster than the main model again, by about its own ratio.
    ratio = main.model.step(100) / variant.model.step(100)
    assert 1.1 < ratio < 1.3


def test_shared_drift_keeps_each_precisions_own_speed_and_stays_clamped():
    main, variant = seeded(TRUE), seeded(TRUE)
    variant.share_decode_drift([main, variant], variant.drift_decode)  # unchanged: no-op
    assert main.drift_decode == 1.0
    variant.drift_decode = 2.0
    variant.share_decode_drift([main, variant], 1.0)
    assert main.drift_decode == 2.0 and variant.drift_decode == 2.0  # itself not rescaled
    assert main.model.step(500) == pytest.approx(2.0 * main.fit.step(500))
    assert main.model.prefill(500) == pytest.approx(main.fit.prefill(500))  # decode only
    main.rescale_decode_drift(10.0)
    assert main.drift_decode == 3.0


def test_fit_batch_recovers_each_batch_size_and_extrapolates_past_the_last():
    from timebill_ros.core.timing import fit_batch
    truth = {1: (2e-6, 0.060), 2: (1.5e-6, 0.095), 3: (1.2e-6, 0.125), 4: (1.0e-6, 0.105)}
    points = [(b, kv, p * kv + q) for b, (p, q) in truth.items() for kv in (64, 640, 2560)]
    model = fit_batch(points)
    assert model.max_measured == 4
    for b, (p, q) in truth.items():
        assert model.step(b, 1000) == pytest.approx(p * 1000 + q, rel=1e-6)
    # Beyond 4 the last two sizes continue linearly; never below size 4.
    assert model.step(5, 1000) >= model.step(4, 1000)
    with pytest.raises(ValueError, match='without gaps'):
        fit_batch([(1, 10, 0.1), (1, 20, 0.2), (3, 10, 0.3), (3, 20, 0.4)])


def test_a_batch_member_pays_the_whole_batch_step_and_keeps_its_own_prefill():
    from timebill_ros.core.timing import BatchTimingModel
    single = TimingModel(a=1e-7, b=1e-4, c=0.01, p=2e-6, q=0.06)
    batch = BatchTimingModel(((2e-6, 0.06), (2e-6, 0.09), (2e-6, 0.11)))
    assert batch.member(single, 1, 500) is single
    member = batch.member(single, 3, other_kv=1000)
    assert member.prefill(300) == single.prefill(300)
    # Own 200 KV + 1000 of the others at the size-3 pair.
    assert member.step(200) == pytest.approx(2e-6 * 1200 + 0.11)
    assert member.decode(200, 11) > single.decode(200, 11)
    assert batch.with_drift(1.5).member(single, 3, 1000).step(200) == \
        pytest.approx(1.5 * member.step(200))


def test_online_batch_drift_follows_slower_batched_steps_and_scores_them():
    from timebill_ros.core.timing import BatchTimingModel, OnlineBatchDrift
    online = OnlineBatchDrift(BatchTimingModel(((0.0, 0.06), (0.0, 0.09))))
    assert online.mape() == 0.0
    online.observe(1, 100, 0.5)  # a lone step says nothing about batching
    assert online.model.drift == 1.0 and online.mape() == 0.0
    for _ in range(40):
        online.observe(2, 200, 0.09 * 1.3)
    assert online.model.drift == pytest.approx(1.3, rel=0.01)
    assert online.model.step(2, 200) == pytest.approx(0.117, rel=0.01)
    assert 0.0 < online.mape() < 30.0


def test_fewest_threads_takes_the_fastest_unless_fewer_are_nearly_as_fast():
    # Intel VM: float32 61.7 ms on 1 thread, 43.6 ms on 2; AMD VM int8: 18.8 vs 29.6 ms.
    assert fewest_threads({1: 0.0617, 2: 0.0436}) == 2
    assert fewest_threads({1: 0.0188, 2: 0.0296}) == 1
    assert fewest_threads({1: 0.0620, 2: 0.0600}) == 1  # within 5 %: keep a core free
    assert fewest_threads({1: 0.0620, 2: 0.0600}, margin=0.0) == 2
    assert fewest_threads({4: 0.02, 1: 0.05, 2: 0.021}) == 2
    # A stored profile's count stays while within 15 % (no recalibration on noise).
    assert fewest_threads({1: 0.0300, 2: 0.0330}, keep=2) == 2
    assert fewest_threads({1: 0.0300, 2: 0.0458}, keep=2) == 1
    assert fewest_threads({1: 0.0300, 2: 0.0330}, keep=4) == 1  # not probed: ignored
    with pytest.raises(ValueError):
        fewest_threads({})


def test_a_cached_prefix_leaves_only_the_rest_of_the_prompt_to_prefill():
    from timebill_ros.core.timing import CachedPrefixTiming, with_cached_prefix
    model = TimingModel(1e-6, 1e-3, 0.05, 1e-5, 0.02)
    assert with_cached_prefix(model, 0) is model
    cached = with_cached_prefix(model, 1000)
    assert isinstance(cached, CachedPrefixTiming) and cached.step(100) == model.step(100)
    # The rest's share of both terms, and the fixed cost of a prefill.
    assert cached.prefill(1200) == pytest.approx(1e-6 * (1200 ** 2 - 1000 ** 2) + 0.2 + 0.05)
    assert cached.prefill(500) == pytest.approx(model.c + 1e-6 * (500 ** 2 - 499 ** 2) + 1e-3)
    assert cached.wcet(1200, 0.0, 10) < model.wcet(1200, 0.0, 10)


def test_long_prompts_stay_planned_on_calibration_after_many_short_goals():
    # A node serving short commands (40-200 tokens, noisy, some machines slower on them)
    # for 400 goals: its window then holds short prompts only. The calibration's long
    # prompts still decide the quadratic term: a 4,000-token prefill and an 80-token chunk
    # behind 7,293 prefix-cached tokens stay within 20 % of the truth (once they aged out
    # of the window these went to 0.45x-1.43x and 0.2x-2.7x).
    import random
    truth = TimingModel(8.28e-7, 0.00244, 0.098, 2.0e-5, 0.0677)
    for bias, seed in ((1.0, 2), (1.3, 1), (1.3, 2), (0.8, 3)):
        online = OnlineTimingModel(truth)
        online.seed([(n, truth.prefill(n)) for n in (32, 256, 512, 1024, 2048, 3072, 4096)],
                    [(n, truth.step(n)) for n in (16, 512, 1024, 2048)])
        rng = random.Random(seed)
        for _ in range(400):
            n = rng.randint(40, 200)
            online.observe(n, bias * truth.prefill(n) * rng.uniform(0.8, 1.2), n,
                           [bias * truth.step(n)] * 8)
        model = online.model
        assert model.prefill(4000) == pytest.approx(truth.prefill(4000), rel=0.2), (bias, seed)
        chunk = with_cached_prefix(model, 7293).prefill(7373)
        assert chunk == pytest.approx(with_cached_prefix(truth, 7293).prefill(7373), rel=0.2)


def test_estimate_errors_are_the_plans_errors_at_equal_weight_quantiles():
    from timebill_ros.core.timing import EstimateErrors
    errors = EstimateErrors(capacity=10, minimum=4)
    for ratio in (1.0, 1.2, 0.9):
        errors.observe(ratio, 1.0)
    assert errors.points() == ()  # too few to say
    errors.observe(0.0, 1.0)  # nothing measured: not counted
    errors.observe(1.1, 1.0)
    assert len(errors) == 4 and errors.points()[2] == pytest.approx(1.05)
    errors.observe(100.0, 1.0)  # a suspended process counts as 3x, like the drift
    assert max(errors.points()) <= 3.0
    for _ in range(10):  # the window forgets the old machine
        errors.observe(2.0, 1.0)
    assert errors.points() == pytest.approx((2.0,) * 5)


def test_online_model_records_each_goals_error_against_the_model_it_was_planned_with():
    online = OnlineTimingModel(TimingModel(0.0, 0.001, 0.0, 0.0, 0.01))
    for _ in range(8):  # every goal's steps run 1.5x the model of the moment
        online.observe(10, 0.01, 10, [online.model.step(10) * 1.5] * 10)
    # Taken after the refit, the drift would have hidden part of each error.
    assert online.errors.points() == pytest.approx((1.5,) * 5, rel=1e-3)


def test_a_repeated_prompt_reuses_its_whole_blocks_before_its_last_token():
    from timebill_ros.core.timing import PREFIX_BLOCK, reusable_prefix
    assert PREFIX_BLOCK == 32
    assert [reusable_prefix(n) for n in (0, 1, 32, 33, 64, 65, 622)] == \
        [0, 0, 0, 32, 32, 64, 608]  # 608 of 622, as the node's plan notes say


def test_a_llama_option_reuses_the_whole_chunks_of_a_held_prompt():
    from timebill_ros.core.timing import held_prefix
    assert held_prefix(1000, 64) == 960  # all whole chunks but the last token's
    assert held_prefix(64, 64) == 0 and held_prefix(60, 64) == 0  # short: not held
    assert held_prefix(129, 64) == 128
