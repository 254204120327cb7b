# SPDX-License-Identifier: Apache-2.0
"""TimeBill planner: mode handling, alpha*, infeasible policies."""

from dataclasses import replace

import pytest

from timebill_ros.core.config import NodeConfig
from timebill_ros.core.cuts import CutEffect, CutEffects
from timebill_ros.core.length import LengthDistribution
from timebill_ros.core.planner_settings import PlannerSettings
from timebill_ros.core.planning import Fallback, MaxTokensPredictor, TimeBillPlanner
from timebill_ros.core.request import Mode, OverrunPolicy, Rejection, Request
from timebill_ros.core.timing import TimingModel

MODEL = TimingModel(0.0, 0.001, 0.0, 1e-5, 0.03)  # prefill 2 s at 2000 tokens
# The settings these tests were written for: the node's, with no time margin, no least
# saving or switch speed-up, early exit allowed in AUTO and a 2 % admission bar.
SETTINGS = replace(PlannerSettings.from_config(NodeConfig()), time_margin=0.0,
                   min_cut_saving=0.0, min_switch_speedup=1.0, auto_early_exit=True,
                   admit_probability=0.02)
RESOURCES = ('early_exit', 'precisions', 'effects', 'mix', 'engines', 'press_s_per_token',
             'time_errors', 'provisional_base')


def make_planner(timing, predictor, **kwargs):
    """Return a planner with SETTINGS, changed by the settings among ``kwargs``."""
    settings = replace(SETTINGS, **{k: v for k, v in kwargs.items() if k not in RESOURCES})
    return TimeBillPlanner(timing, predictor, settings,
                           **{k: v for k, v in kwargs.items() if k in RESOURCES})


def req(mode, max_new=100, k=1.0):
    return Request('q', 'ctx', 10.0, OverrunPolicy.KILL, mode, max_new, k)


class Fixed:
    name = 'fixed'

    def __init__(self, n):
        self.n = n

    def predict(self, request, prompt_tokens):
        return self.n


def test_none_mode_never_evicts_but_reports_feasibility():
    planner = make_planner(lambda: MODEL, MaxTokensPredictor())
    full = MODEL.wcet(2000, 0.0, 100)
    plan = planner.plan(req(Mode.NONE), 2000, full - 1.0)
    assert plan.mode == Mode.NONE and plan.eviction_ratio == 0.0 and not plan.feasible
    assert plan.est_wcet_s == pytest.approx(full)
    assert plan.est_prefill_s + plan.est_decode_s == pytest.approx(full)


def test_eviction_mode_picks_alpha_star():
    planner = make_planner(lambda: MODEL, MaxTokensPredictor(), press='knorm')
    full = MODEL.wcet(2000, 0.0, 100)
    plan = planner.plan(req(Mode.EVICTION), 2000, full - 1.0)
    assert plan.mode == Mode.EVICTION and plan.feasible and plan.press == 'knorm'
    assert 0 < plan.eviction_ratio < 0.95
    assert plan.est_wcet_s == pytest.approx(full - 1.0)
    easy = planner.plan(req(Mode.AUTO), 2000, full + 1.0)
    assert easy.eviction_ratio == 0.0 and easy.press == ''


def test_an_evicting_plan_counts_what_its_press_adds_to_the_prefill():
    full = MODEL.wcet(2000, 0.0, 100)
    free = make_planner(lambda: MODEL, MaxTokensPredictor(), press='knorm')
    pressed = make_planner(lambda: MODEL, MaxTokensPredictor(), press='knorm',
                           press_s_per_token=lambda: 0.0001)  # 0.2 s on 2,000 tokens
    without = free.plan(req(Mode.EVICTION), 2000, full - 1.0)
    plan = pressed.plan(req(Mode.EVICTION), 2000, full - 1.0)
    assert plan.est_prefill_s == pytest.approx(without.est_prefill_s + 0.2)
    # The press's time comes out of the decode: more is evicted, and the plan still fits.
    assert plan.eviction_ratio > without.eviction_ratio
    assert plan.feasible and plan.est_wcet_s <= full - 1.0 + 1e-9
    assert pressed.estimate_s(plan, 100) == pytest.approx(plan.est_wcet_s)
    # Without eviction there is no press to count.
    loose = pressed.plan(req(Mode.AUTO), 2000, full + 1.0)
    assert loose.eviction_ratio == 0.0 and loose.est_prefill_s == pytest.approx(2.0)


def test_pessimistic_factor_scales_the_worst_case():
    planner = make_planner(lambda: MODEL, Fixed(20))
    plan = planner.plan(req(Mode.EVICTION, max_new=100, k=3.0), 2000, 100.0)
    assert plan.predicted_tokens == 20 and plan.worst_case_tokens == 60
    assert planner.plan(req(Mode.EVICTION, max_new=50, k=3.0), 2000, 100.0)\
        .worst_case_tokens == 50


def test_infeasible_rejects_with_estimate_or_runs_best_effort():
    with pytest.raises(Rejection, match='estimated worst case') as refused:
        make_planner(lambda: MODEL, MaxTokensPredictor()).plan(req(Mode.EVICTION), 2000, 1.0)
    # The rejection carries the plan its estimate comes from.
    assert not refused.value.plan.feasible and refused.value.plan.est_wcet_s > 1.0
    assert f'{refused.value.plan.est_wcet_s:.3f} s' in refused.value.reason
    plan = make_planner(lambda: MODEL, MaxTokensPredictor(), alpha_max=0.9,
                        infeasible='best_effort').plan(req(Mode.EVICTION), 2000, 1.0)
    assert plan.eviction_ratio == 0.9 and not plan.feasible


def test_no_budget_between_the_bounds_is_rejected():
    # Regression: the planner re-checks WCET(alpha*) <= target, and the root landed a
    # hair above the target for ~14 % of such budgets (rejected "even at 0.95").
    planner = make_planner(lambda: MODEL, MaxTokensPredictor(), alpha_max=0.95,
                           time_margin=0.1)
    low, high = MODEL.wcet(7373, 0.95, 100), MODEL.wcet(7373, 0.0, 100)
    for i in range(1, 200):
        budget = (low + (high - low) * i / 200) / 0.9
        plan = planner.plan(req(Mode.EVICTION), 7373, budget)
        assert plan.feasible and 0.0 < plan.eviction_ratio < 0.95


def test_bad_settings():
    with pytest.raises(ValueError):
        make_planner(lambda: MODEL, MaxTokensPredictor(), alpha_max=1.0)
    with pytest.raises(ValueError):
        make_planner(lambda: MODEL, MaxTokensPredictor(), infeasible='pray')


def test_time_margin_keeps_reserve():
    full = MODEL.wcet(2000, 0.0, 100)
    plan = make_planner(lambda: MODEL, MaxTokensPredictor(), time_margin=0.1).plan(
        req(Mode.EVICTION), 2000, full)
    assert plan.eviction_ratio > 0
    assert plan.est_wcet_s == pytest.approx(0.9 * full)


def test_plan_reports_the_budget_range_eviction_covers():
    plan = make_planner(lambda: MODEL, MaxTokensPredictor(), alpha_max=0.9).plan(
        req(Mode.EVICTION), 2000, 100.0)
    assert plan.est_wcet_full_s == pytest.approx(MODEL.wcet(2000, 0.0, 100))
    assert plan.est_wcet_alpha_max_s == pytest.approx(MODEL.wcet(2000, 0.9, 100))
    assert plan.est_wcet_alpha_max_s < plan.est_wcet_full_s


def test_fixed_ratio_and_caller_length_override_the_planner():
    planner = make_planner(lambda: MODEL, MaxTokensPredictor())
    request = req(Mode.EVICTION, max_new=200)
    fixed = planner.plan(replace(request, eviction_ratio=0.25, expected_tokens=40), 1000, 1e-3)
    assert fixed.eviction_ratio == 0.25 and not fixed.feasible  # runs as asked, flagged late
    assert fixed.predicted_tokens == 40 and fixed.predictor == 'caller'
    assert fixed.worst_case_tokens == 40
    assert fixed.est_wcet_s == pytest.approx(MODEL.wcet(1000, 0.25, 40))


def _ee(first=10, layers=30):
    from timebill_ros.core.early_exit import ExitRule, LayerTimes
    from timebill_ros.core.planning import EarlyExitConfig
    return EarlyExitConfig(ExitRule((first, 20)), LayerTimes(tuple([1.0] * layers), 0.0))


def test_early_exit_plans_on_the_earliest_exit_cost():
    planner = make_planner(lambda: MODEL, MaxTokensPredictor(), early_exit=_ee())
    plan = planner.plan(req(Mode.EARLY_EXIT), 2000, 100.0)
    assert plan.mode == Mode.EARLY_EXIT and plan.exit_layers == (10, 20)
    share = 10 / 30
    assert plan.est_wcet_s == pytest.approx(MODEL.prefill(2000) + share * MODEL.decode(2000, 100))
    with pytest.raises(Rejection, match='not configured'):
        make_planner(lambda: MODEL, MaxTokensPredictor()).plan(req(Mode.EARLY_EXIT), 10, 9.0)


def test_auto_falls_back_to_eviction_plus_early_exit_when_eviction_alone_misses():
    planner = make_planner(lambda: MODEL, MaxTokensPredictor(), early_exit=_ee())
    budget = MODEL.wcet(2000, 0.95, 100) * 0.8  # infeasible at alpha_max
    plan = planner.plan(req(Mode.AUTO), 2000, budget)
    assert plan.mode == Mode.EARLY_EXIT and plan.eviction_ratio == pytest.approx(0.95)
    assert plan.feasible
    # The node's default (auto_early_exit false): AUTO never adds early exit by itself.
    off = make_planner(lambda: MODEL, MaxTokensPredictor(), early_exit=_ee(),
                       auto_early_exit=False, infeasible='best_effort')
    plan = off.plan(req(Mode.AUTO), 2000, budget)
    assert plan.mode == Mode.EVICTION and plan.eviction_ratio == pytest.approx(0.95)
    assert off.plan(req(Mode.EARLY_EXIT), 2000, budget).mode == Mode.EARLY_EXIT


def test_per_token_deadline_schedulability():
    planner = make_planner(lambda: MODEL, MaxTokensPredictor(), early_exit=_ee(),
                           tpot_jitter=0.1)
    last_step = MODEL.step(2000 + 99)  # full depth, last token
    ok = planner.plan(replace(req(Mode.NONE), token_deadline_s=last_step * 1.2), 2000, 100.0)
    assert ok.est_p99_tpot_s == pytest.approx(last_step * 1.1)
    assert ok.utilisation == pytest.approx(1.1 / 1.2)
    with pytest.raises(Rejection, match='not schedulable.*P99'):
        planner.plan(replace(req(Mode.NONE), token_deadline_s=last_step), 2000, 100.0)
    # AUTO switches to early exit, whose earliest exit costs a third of a step.
    auto = planner.plan(replace(req(Mode.AUTO), token_deadline_s=last_step), 2000, 100.0)
    assert auto.mode == Mode.EARLY_EXIT and auto.utilisation < 1.0
    # ... and its estimate is the early-exit one, not the full-depth one it replaced.
    kept = (1.0 - auto.eviction_ratio) * 2000
    assert auto.est_wcet_s == pytest.approx(MODEL.prefill(2000) + MODEL.decode(kept, 100) / 3)


class Calibrated(Fixed):
    """A predictor with a calibrated distribution: predicted n -> true lengths n..3n."""

    name = 'calibrated'

    def __init__(self, n):
        super().__init__(n)
        pred = [p for p in (2, 10, 40) for _ in range(30)]
        actual = [p * (1 + 2 * i / 29) for p in (2, 10, 40) for i in range(30)]
        self.distribution = LengthDistribution.fit(pred, actual, min_per_band=30)


SHORT = TimingModel(0.0, 1e-3, 0.0, 0.0, 0.05)  # 50 ms a step, 45 ms prefill at 45 tokens


def test_a_short_predicted_answer_is_admitted_where_max_new_tokens_is_not():
    request = req(Mode.AUTO, max_new=128)
    # The stand-in plans 128 tokens (6.4 s) and refuses a 2 s budget ...
    with pytest.raises(Rejection, match='predicted 128 answer tokens'):
        make_planner(lambda: SHORT, MaxTokensPredictor()).plan(request, 45, 2.0)
    # ... a calibrated prediction of a 2-token answer (true 2..6) fits easily.
    plan = make_planner(lambda: SHORT, Calibrated(2)).plan(request, 45, 2.0)
    assert plan.feasible and plan.fit_probability == 1.0 and plan.eviction_ratio == 0.0
    assert plan.worst_case_tokens == 6  # the 90 % quantile of 2..6, rounded up


def test_admission_rejects_only_when_the_answer_is_unlikely_to_fit():
    planner = make_planner(lambda: SHORT, Calibrated(40), admit_probability=0.05)
    request = req(Mode.AUTO, max_new=128)
    # Predicted 40 (true 40..120): 2.0 s fits ~39 tokens, about a 0 % chance -> rejected
    # with the prediction and the probability in the reason.
    with pytest.raises(Rejection, match=r'predicted 40 answer tokens.*P\(answer') as refused:
        planner.plan(request, 45, 2.0)
    assert refused.value.plan.fit_probability < 0.05
    # 4.0 s fits ~79 tokens: about half the answers -> accepted, planned as infeasible
    # at the 90 % quantile but run (a partial chance beats a certain refusal).
    plan = planner.plan(request, 45, 4.0)
    assert not plan.feasible and 0.4 < plan.fit_probability < 0.6
    # Fail-fast callers raise admit_probability.
    with pytest.raises(Rejection):
        make_planner(lambda: SHORT, Calibrated(40), admit_probability=0.9).plan(
            request, 45, 4.0)
    # A budget that cannot fit even the first token is rejected whatever the prediction.
    with pytest.raises(Rejection, match='0 fit'):
        make_planner(lambda: SHORT, Calibrated(2)).plan(request, 45, 0.01)


def test_auto_skips_cuts_that_save_less_than_they_cost():
    # 45-token prompt: evicting 95 % of it saves ~nothing, and SnapKV cannot run on it.
    steep = TimingModel(0.0, 1e-3, 0.0, 1e-5, 0.05)
    for press, note in (('snapkv', 'snapkv skipped'), ('knorm', 'eviction skipped')):
        plan = make_planner(lambda: steep, Fixed(100), press=press, min_cut_saving=0.05,
                            infeasible='best_effort').plan(req(Mode.AUTO, 128), 45, 3.0)
        assert plan.eviction_ratio == 0.0 and note in plan.note and not plan.feasible
    # On a long prompt the same cut saves a lot and is used.
    budget = (steep.wcet(3000, 0.0, 100) + steep.wcet(3000, 0.95, 100)) / 2
    plan = make_planner(lambda: steep, Fixed(100), min_cut_saving=0.05).plan(
        req(Mode.AUTO, 128), 3000, budget)
    assert plan.eviction_ratio > 0.0 and 'skipped' not in plan.note


INT8 = TimingModel(0.0, 1e-3, 0.0, 0.0, 0.02)  # decode steps 2.5x faster than SHORT


def test_auto_decodes_at_lower_precision_only_when_it_is_worth_more():
    effects = CutEffects(precision={'int8-dynamic': CutEffect(1.0, 0.4)})
    planner = make_planner(lambda: SHORT, Calibrated(40), min_cut_saving=0.05,
                           precisions={'int8-dynamic': lambda: INT8}, effects=effects)
    request = req(Mode.AUTO, max_new=128)
    # Predicted 40 (true 40..120). 7 s fits every answer at full precision.
    assert planner.plan(request, 45, 7.0).precision == ''
    # 5 s fits ~99 tokens: P(fit) ~0.74 at full precision, int8's 0.9 (capped) is surer:
    # full precision switching to int8 in time (as sure, more faithful) wins; a
    # tolerance of 1 lets every likely cut compete on fidelity.
    surer = planner.plan(request, 45, 5.0)
    assert surer.precision == '' and surer.fallback.precision == 'int8-dynamic'
    assert surer.fit_probability > 0.9
    faithful = make_planner(lambda: SHORT, Calibrated(40), min_cut_saving=0.05,
                            fit_tolerance=1.0, precisions={'int8-dynamic': lambda: INT8},
                            effects=effects)
    plan = faithful.plan(request, 45, 5.0)
    assert plan.precision == '' and 0.6 < plan.fit_probability < 0.9
    # 2 s fits 39 full-precision tokens (no chance) but ~97 int8 ones.
    plan = planner.plan(request, 45, 2.0)
    assert plan.precision == 'int8-dynamic' and plan.fit_probability > 0.5
    assert 'int8-dynamic decoding' in plan.note and plan.est_wcet_s == pytest.approx(
        SHORT.prefill(45) + INT8.decode(45, plan.worst_case_tokens))
    # MODE_NONE and MODE_EVICTION goals never change precision.
    assert planner.plan(req(Mode.NONE, max_new=128), 45, 2.0).precision == ''
    # An int8 answer three times longer than the full model's would not fit either.
    longer = CutEffects(precision={'int8-dynamic': CutEffect(3.0, 0.4)})
    with pytest.raises(Rejection, match='predicted 40'):
        make_planner(lambda: SHORT, Calibrated(40), precisions={
            'int8-dynamic': lambda: INT8}, effects=longer).plan(request, 45, 2.0)


def test_auto_starts_at_full_precision_and_switches_when_int8_must_finish():
    effects = CutEffects(precision={'int8-dynamic': CutEffect(1.0, 0.4)})
    planner = make_planner(lambda: SHORT, Calibrated(40), min_cut_saving=0.05,
                           precisions={'int8-dynamic': lambda: INT8}, effects=effects)
    request = req(Mode.AUTO, max_new=128)
    # 3 s: the planned 112 tokens (90 % of 40..120) fit at int8 (2.3 s), not at full
    # precision (5.6 s). Full-precision steps come first, int8 takes over in time.
    plan = planner.plan(request, 45, 3.0)
    assert plan.precision == '' and plan.fallback.precision == 'int8-dynamic'
    assert plan.fit_probability == 1.0 and plan.est_wcet_s <= 3.0
    assert plan.worst_case_tokens == plan.fallback.tokens == 112
    assert 'switching to int8-dynamic decoding' in plan.note
    assert plan.fallback.expected == 40  # the predicted (median) length
    switch = next(i for i in range(112) if plan.fallback.due(i, 3.0 - 0.045 - 0.05 * i))
    # Until the answer reaches 40 tokens only those are protected (no switch); once past
    # them, int8 must still finish 112: it takes over at once.
    assert switch == 39
    # A plan at full precision keeps int8 in reserve; MODE_NONE never switches.
    assert planner.plan(request, 45, 7.0).fallback.precision == 'int8-dynamic'
    assert planner.plan(req(Mode.NONE, max_new=128), 45, 3.0).fallback is None


def test_a_cut_that_lengthens_answers_is_judged_on_its_longer_answers():
    steep = TimingModel(0.0, 1e-3, 0.0, 1e-5, 0.05)
    request = req(Mode.AUTO, max_new=128)
    # Between the full model's and alpha 0.95's time for 40..120 answer tokens.
    budget = steep.wcet(3000, 0.5, 120)
    harmless = make_planner(lambda: steep, Calibrated(40)).plan(request, 3000, budget)
    assert harmless.eviction_ratio > 0.0 and harmless.fit_probability == 1.0
    # Measured: evicted answers run 2x longer and keep 60 % fidelity. Judged on its
    # longer answers the evicted cut still fits more surely than the full model (P 0.71)
    # and runs; a tolerance of 1 keeps the full model, whose chance is likely enough.
    effects = CutEffects(eviction_ratios=(0.5, 0.95),
                         eviction=(CutEffect(2.0, 0.6), CutEffect(2.0, 0.3)))
    surest = make_planner(lambda: steep, Calibrated(40), effects=effects).plan(
        request, 3000, budget)
    assert surest.eviction_ratio > 0.0 and surest.fit_probability > 0.71
    assert surest.worst_case_tokens > harmless.worst_case_tokens  # planned 2x longer
    plan = make_planner(lambda: steep, Calibrated(40), effects=effects,
                        fit_tolerance=1.0).plan(request, 3000, budget)
    assert plan.eviction_ratio == 0.0 and 0.5 < plan.fit_probability < 0.9
    assert plan.est_wcet_s == pytest.approx(steep.wcet(3000, 0.0, plan.worst_case_tokens))


def test_a_prediction_at_the_cap_uses_the_calibrated_distribution():
    # Calibrated on lengths up to 120; a goal capped at 120 predicted at its cap is judged
    # on the top band (true 40..120), not as certain to run to the cap.
    planner = make_planner(lambda: SHORT, Calibrated(120))
    plan = planner.plan(req(Mode.AUTO, max_new=120), 45, 5.0)  # ~99 tokens fit
    assert 0.6 < plan.fit_probability < 0.9
    # Predicted at the cap of a goal allowing more than calibration saw (200 > 120):
    # the old rule, the answer runs to the cap, so 100 tokens have no chance.
    with pytest.raises(Rejection, match='P\\(answer <= 100 tokens\\) = 0.0%'):
        make_planner(lambda: SHORT, Calibrated(200)).plan(req(Mode.AUTO, max_new=200),
                                                          45, 5.0)


def mixed_planner(effects=None):
    """SHORT at full precision, INT8 fully lowered; 3 layers + head with unequal KL."""
    from timebill_ros.core.planning import MixConfig
    from timebill_ros.core.precision import PrecisionTable, UnitTimes
    # Profiled shares: the full step is 4 units of 12.5 ms (no rest); lowered 5 ms each.
    table = PrecisionTable('int8-dynamic', UnitTimes((0.0125,) * 4, (0.0,) * 4),
                           UnitTimes((0.005,) * 4, (0.0,) * 4), (0.02, 0.01, 0.05, 0.4),
                           all_low_kl=0.5)
    effects = effects or CutEffects(precision={'int8-dynamic': CutEffect(1.0, 0.4)})
    return make_planner(lambda: SHORT, Fixed(40), min_cut_saving=0.05,
                        precisions={'int8-dynamic': lambda: INT8}, effects=effects,
                        mix=MixConfig(table, 'int8-dynamic'))


def test_auto_lowers_only_the_layers_the_deadline_needs_cheapest_kl_first():
    planner = mixed_planner()
    request = req(Mode.AUTO, max_new=128)
    # 40 tokens: 2.0 s at full precision, 0.8 s all int8; a lowered unit saves 7.5 ms a
    # step. 1.9 s needs 2.4 ms a step: one unit, the one with the least KL (layer 1).
    plan = planner.plan(request, 45, 1.9)
    assert plan.precision == 'mixed' and plan.precision_mix == (1,)
    assert plan.est_wcet_s <= 1.9 and plan.fit_probability == 1.0
    assert 'layers 1 (1 of 4 units' in plan.precision_text
    assert 'mixed-precision decoding (1 of 4 units lowered)' in plan.note
    # Tighter: more layers, cheapest KL first, still sparing the sensitive LM head.
    plan = planner.plan(request, 45, 1.5)
    assert plan.precision_mix == (0, 1) and plan.est_wcet_s <= 1.5
    plan = planner.plan(request, 45, 1.3)
    assert plan.precision_mix == (0, 1, 2) and plan.est_wcet_s <= 1.3
    # Enough time: full precision. Below every mix: int8 (from the start, or switching).
    assert planner.plan(request, 45, 3.0).precision == ''
    tight = planner.plan(request, 45, 1.0)
    assert tight.precision_mix == () and 'int8-dynamic' in (
        tight.precision, tight.fallback.precision if tight.fallback else '')
    # A mix is never used for MODE_NONE.
    assert planner.plan(req(Mode.NONE, max_new=128), 45, 1.5).precision == ''


def test_the_mix_planner_needs_the_low_precision_resident():
    from timebill_ros.core.planning import MixConfig
    with pytest.raises(ValueError, match='resident'):
        make_planner(lambda: SHORT, Fixed(4), mix=MixConfig(
            mixed_planner().mix.table, 'int8-dynamic'))


def test_a_goal_may_pin_its_precision():
    planner = mixed_planner()
    # 1.9 s would lower one layer; pinned to float32 nothing is lowered, so it cannot fit.
    pinned = replace(req(Mode.AUTO, max_new=128), precision='float32')
    with pytest.raises(Rejection, match='with the full model'):
        planner.plan(pinned, 45, 1.9)
    full = planner.plan(pinned, 45, 3.0)  # and no int8 kept in reserve
    assert full.precision == '' and full.fallback is None and full.precision_mix == ()
    # Pinned to int8: every step at int8, even with time to spare.
    low = planner.plan(replace(req(Mode.AUTO, max_new=128), precision='int8-dynamic'), 45,
                       30.0)
    assert low.precision == 'int8-dynamic' and 'pinned by the goal' in low.note
    assert low.est_wcet_s == pytest.approx(SHORT.prefill(45) + INT8.decode(45, 40))
    none = planner.plan(replace(req(Mode.NONE, max_new=128), precision='int8-dynamic'), 45,
                        30.0)
    assert none.precision == 'int8-dynamic'


def test_a_fallback_shared_with_other_batches_switches_earlier():
    alone = Fallback('int8-dynamic', tokens=40, full_step_s=0.05, step_s=0.03, expected=40)
    # Batches step in turn: beside a float32 batch that stays (50 ms a step) each int8
    # token costs 80 ms, and a full-precision round costs both batches' steps.
    shared = alone.sharing(before_s=0.09, after_s=0.05)
    assert (shared.full_step_s, shared.step_s) == (pytest.approx(0.09), pytest.approx(0.08))
    assert alone.sharing(0.0, 0.0) == alone  # alone in one batch: the solo rule
    # 30 tokens to come at index 8: 0.05 + 30 x 0.03 = 0.95 s alone, 0.09 + 30 x 0.08 shared.
    assert not alone.due(8, 1.2) and shared.due(8, 1.2)
    assert not shared.due(8, 2.6)


def test_no_switch_is_planned_to_a_precision_that_is_not_clearly_faster():
    effects = CutEffects(precision={'int8-dynamic': CutEffect(1.0, 0.4)})
    request = req(Mode.AUTO, max_new=128)

    def planner(low, speedup):
        return make_planner(lambda: SHORT, Calibrated(40), min_cut_saving=0.05,
                            precisions={'int8-dynamic': lambda: low}, effects=effects,
                            min_switch_speedup=speedup)
    # INT8 steps are 2.5x faster than SHORT's: a switch is planned up to that speed-up.
    assert planner(INT8, 2.4).plan(request, 45, 3.0).fallback.precision == 'int8-dynamic'
    plan = planner(INT8, 2.6).plan(request, 45, 3.0)
    assert plan.fallback is None
    # As on the Intel VM: int8 steps about as slow as float32's never earn a switch.
    barely = TimingModel(SHORT.a, SHORT.b, SHORT.c, SHORT.p, SHORT.q / 1.2)
    assert planner(barely, 1.5).plan(request, 45, 7.0).fallback is None
    assert planner(barely, 1.0).plan(request, 45, 7.0).fallback.precision == 'int8-dynamic'
    with pytest.raises(ValueError, match='min_switch_speedup'):
        planner(INT8, 0.5)


# Another engine: a slower prefill (2.5 ms/token) but a step 8x faster than MODEL's.
LLAMA = TimingModel(0.0, 0.0025, 0.0, 0.0, 0.00375)
ENGINE = 'llama.cpp-f16'


def engine_planner(quality=0.9, **kwargs):
    effects = CutEffects(precision={ENGINE: CutEffect(1.0, quality)})
    return make_planner(lambda: MODEL, Fixed(60), engines={ENGINE: lambda: LLAMA},
                        effects=effects, **kwargs)


def test_auto_runs_a_short_command_on_the_faster_engine_only_when_the_torch_path_misses():
    planner = engine_planner()
    full = MODEL.wcet(40, 0.0, 60)
    roomy = planner.plan(req(Mode.AUTO), 40, full * 1.5)
    assert roomy.precision == '' and roomy.eviction_ratio == 0.0  # fidelity 1 beats 0.9
    tight = planner.plan(req(Mode.AUTO), 40, full * 0.3)
    assert tight.precision == ENGINE and tight.feasible and tight.eviction_ratio == 0.0
    assert tight.est_prefill_s == pytest.approx(LLAMA.prefill(40))
    assert tight.est_wcet_s == pytest.approx(LLAMA.wcet(40, 0.0, 60))
    assert 'llama.cpp-f16' in tight.note and tight.fallback is None
    assert planner.estimate_s(tight, 10) == pytest.approx(LLAMA.wcet(40, 0.0, 10))


def test_an_option_that_fits_only_at_its_estimated_speed_yields_to_one_that_fits_slower():
    # The full model fits on paper with 5 % to spare; the engine has room to spare.
    budget = MODEL.wcet(40, 0.0, 60) * 1.05
    assert engine_planner().plan(req(Mode.AUTO), 40, budget).precision == ''
    # This machine ran the last goals 0.9-1.3x their estimates: the full model's answer
    # misses whenever its steps run over 5 % slow (two of five points), the engine's
    # fits at every one.
    errors = {'': (0.9, 0.95, 1.0, 1.1, 1.3)}
    alone = make_planner(lambda: MODEL, Fixed(60), time_errors=errors.get)
    assert alone.plan(req(Mode.AUTO), 40, budget).fit_probability == pytest.approx(0.6)
    planner = engine_planner(time_errors=lambda option: errors.get(option, ()))
    plan = planner.plan(req(Mode.AUTO), 40, budget)
    assert plan.precision == ENGINE and plan.fit_probability == pytest.approx(1.0)
    # The engine's own errors count for it: measured 7x slow, it fits no surer.
    errors[ENGINE] = (7.0,) * 5
    assert planner.plan(req(Mode.AUTO), 40, budget).precision == ''


def test_a_long_prompt_stays_on_the_engine_whose_prefill_fits():
    planner = engine_planner(quality=1.0)
    # 2000 prompt tokens: the engine's prefill alone (5 s) is over the torch goal's time.
    budget = MODEL.wcet(2000, 0.0, 60) * 1.05
    plan = planner.plan(req(Mode.AUTO), 2000, budget)
    assert plan.precision == '' and plan.feasible


def test_a_prompt_the_engine_holds_is_planned_without_its_prefill():
    planner = engine_planner(quality=1.0)
    budget = MODEL.wcet(2000, 0.0, 60) * 0.5
    assert LLAMA.wcet(2000, 0.0, 60) > budget  # the engine's whole prefill cannot fit
    held = planner.plan(req(Mode.AUTO), 2000, budget, engine_prefix={ENGINE: 1950})
    assert held.precision == ENGINE and held.feasible
    assert held.est_prefill_s == pytest.approx(LLAMA.prefill(50))  # 50 tokens left
    # Admission's estimate of the queued goal counts the held prompt the same way.
    assert planner.estimate_s(held, 10, held=1950) == pytest.approx(
        LLAMA.prefill(50) + LLAMA.decode(2000, 10))
    assert planner.estimate_s(held, 10) == pytest.approx(LLAMA.wcet(2000, 0.0, 10))
    pinned = planner.plan(replace(req(Mode.NONE), precision=ENGINE), 2000, 60.0,
                          engine_prefix={ENGINE: 1950})
    assert pinned.est_prefill_s == pytest.approx(LLAMA.prefill(50))
    with pytest.raises(Rejection):  # another option's held prompt is not this one's
        planner.plan(req(Mode.AUTO), 2000, budget, engine_prefix={'other': 1950})


def test_a_goal_may_pin_the_engine_in_none_and_auto_mode():
    planner = engine_planner()
    for mode in (Mode.NONE, Mode.AUTO):
        plan = planner.plan(replace(req(mode), precision=ENGINE), 40, 0.5)
        assert plan.precision == ENGINE and plan.mode == mode
        assert plan.est_wcet_s == pytest.approx(LLAMA.wcet(40, 0.0, 60))


def test_with_a_stand_in_for_the_model_only_the_profiled_engines_plan_goals():
    # The node's first minutes: the engine is profiled, the model itself not yet (its
    # times a probe-scaled stand-in). Where the model would run the goal (roomy) or cut
    # it (eviction), the engine runs it; a goal that needs the model itself is refused.
    planner = engine_planner(provisional_base="llama.cpp-f16's profile x8.0 a step")
    full = MODEL.wcet(40, 0.0, 60)
    roomy = planner.plan(req(Mode.AUTO), 40, full * 1.5)
    assert roomy.precision == ENGINE and roomy.feasible
    assert 'not yet profiled here' in roomy.note and 'x8.0 a step' in roomy.note
    assert engine_planner().plan(req(Mode.AUTO), 40, full * 1.5).precision == ''
    for mode in (Mode.NONE, Mode.EVICTION):
        with pytest.raises(Rejection, match='not yet profiled on this machine'):
            planner.plan(req(mode), 40, full * 1.5)
    pinned = planner.plan(replace(req(Mode.NONE), precision=ENGINE), 40, full * 1.5)
    assert pinned.precision == ENGINE
    with pytest.raises(Rejection, match='cannot meet the deadline'):  # as without
        planner.plan(req(Mode.AUTO), 40, LLAMA.wcet(40, 0.0, 60) * 0.2)


def test_a_schema_goal_that_may_not_fit_runs_to_its_deadline_to_be_closed_there():
    from timebill_ros.core.output import OutputSpec
    planner = make_planner(lambda: MODEL, MaxTokensPredictor())
    schema = replace(req(Mode.AUTO), output=OutputSpec(json_schema='{"type": "object"}'))
    # Prefill 2 s and 100 tokens at 0.03 s do not fit 2.5 s, a few tokens do.
    with pytest.raises(Rejection, match='cannot meet the deadline'):
        planner.plan(req(Mode.AUTO), 2000, 2.5)
    plan = planner.plan(schema, 2000, 2.5)
    assert 'the grammar closes it there' in plan.note
    # Under Skip-Next too (closed in time, it does not overrun); not when the prompt
    # itself cannot be in the cache in time, and not without the closure.
    assert planner.plan(replace(schema, policy=OverrunPolicy.SKIP_NEXT), 2000, 2.5)
    with pytest.raises(Rejection):
        planner.plan(schema, 2000, 1.5)
    with pytest.raises(Rejection):
        make_planner(lambda: MODEL, MaxTokensPredictor(), deadline_closure=False).plan(
            schema, 2000, 2.5)


def test_a_fidelity_a_point_or_two_lower_runs_when_its_answer_fits_more_surely():
    # Predicted 2 (true 2..6): the torch path fits 40 tokens in 2 s, the engine the cap.
    effects = CutEffects(precision={ENGINE: CutEffect(1.0, 0.98)})

    def planner(**kwargs):
        return make_planner(lambda: SHORT, Calibrated(2), engines={ENGINE: lambda: LLAMA},
                            effects=effects, **kwargs)
    request = req(Mode.AUTO, max_new=128)
    # Hedged on the lengths seen with no prediction (a third of them over 40 tokens),
    # the torch path is less sure than the engine, whose fidelity counts as equal.
    plan = planner().plan(request, 45, 2.0)
    assert plan.precision == ENGINE and plan.fit_probability == 1.0
    assert 'within 0.03: the surest' in plan.note
    # Trusting the prediction, both fit surely: fidelities within 0.03 count as equal,
    # so the one holding the machine least runs (the goals around it keep their time) ...
    assert planner(length_hedge=0.0).plan(request, 45, 2.0).precision == ENGINE
    # ... and the more faithful runs when fidelities never count as equal,
    assert planner(length_hedge=0.0, fidelity_tolerance=0.0).plan(
        request, 45, 2.0).precision == ''
    # as it does, with P(fit) counted only to plan_quantile (0.93 and 1.0 both sure),
    # when fidelities never count as equal,
    assert planner(fidelity_tolerance=0.0, choice_quantile=0.9).plan(
        request, 45, 2.0).precision == ''
    # or when the engine's fidelity is further below.
    effects = CutEffects(precision={ENGINE: CutEffect(1.0, 0.9)})
    assert planner(choice_quantile=0.9).plan(request, 45, 2.0).precision == ''
    # Counted to choice_quantile (0.97), 0.93 is not as sure as 1.0: met first.
    assert planner().plan(request, 45, 2.0).precision == ENGINE
    # The hedge changes the choice, not admission: the torch plan reports its own P(fit).
    torch = planner(fidelity_tolerance=0.0, choice_quantile=0.9).plan(request, 45, 2.0)
    assert torch.fit_probability == 1.0 and torch.fits_tokens == 40


def test_a_long_prompt_prefills_on_a_16_bit_copy_only_where_its_prefill_is_faster():
    # 2,000 prompt tokens: 2 s to prefill at full precision; the answer itself is short.
    fast = TimingModel(0.0, 0.4e-3, 0.0, 1e-5, 0.03)  # a copy prefilling 2.5x faster
    slow = TimingModel(0.0, 3e-3, 0.0, 1e-5, 0.03)  # as bfloat16 on a CPU without AMX
    effects = CutEffects(precision={'bfloat16': CutEffect(1.0, 0.95)})
    request = req(Mode.AUTO, max_new=16)

    def plan_with(copy, budget=1.5):
        return make_planner(lambda: MODEL, Fixed(10), min_cut_saving=0.05, press='',
                            precisions={'bfloat16': lambda: copy}, effects=effects).plan(
            request, 2000, budget)
    plan = plan_with(fast)
    assert plan.prefill_precision == 'bfloat16' and plan.precision == 'bfloat16'
    assert plan.est_prefill_s == pytest.approx(0.8) and plan.feasible
    assert 'bfloat16 prefill and decoding' in plan.note
    # Slower: never planned (the full model's prefill, 2.3 s in all, fits 3 s).
    plan = plan_with(slow, 3.0)
    assert plan.prefill_precision == '' and 'bfloat16 prefill skipped' in plan.note
    with pytest.raises(Rejection, match='cannot meet the deadline'):
        plan_with(slow)
    # A measured row of its own is its effect when there is one.
    from timebill_ros.core.cut_kinds import CopyPrefill, CutContext
    context = CutContext({}, CutEffects(precision={'bfloat16': CutEffect(1.0, 0.95),
                                                   'bfloat16-prefill': CutEffect(1.1, 0.8)}))
    assert CopyPrefill('bfloat16').effect(context) == CutEffect(1.1, 0.8)


# Two llama.cpp options: F16 prefills fast and steps slowly, Q4 the other way round.
F16 = TimingModel(0.0, 0.0015, 0.0, 0.0, 0.012)
Q4 = TimingModel(0.0, 0.0035, 0.0, 0.0, 0.007)


def handover_planner(**kwargs):
    from timebill_ros.core.cut_kinds import handover_name
    effects = CutEffects(precision={'llama.cpp-f16': CutEffect(1.0, 0.98),
                                    'llama.cpp-q4_1': CutEffect(1.0, 0.73),
                                    handover_name('llama.cpp-f16', 'llama.cpp-q4_1'):
                                    CutEffect(1.0, 0.8)})
    return make_planner(lambda: MODEL, Fixed(60), effects=effects, engines={
        'llama.cpp-f16': lambda: F16, 'llama.cpp-q4_1': lambda: Q4}, **kwargs)


def test_a_prompt_prefilled_on_one_engine_decodes_on_another_when_only_that_fits():
    from timebill_ros.core.cut_kinds import HANDOVER_S_PER_TOKEN
    # 200 prompt tokens, 60 answer tokens: F16 alone 0.3 + 0.72 s, Q4 alone 0.7 + 0.42 s,
    # F16's prefill then Q4's steps 0.3 + 0.42 s.
    handover = F16.prefill(200) + HANDOVER_S_PER_TOKEN * 200 + Q4.decode(200, 60)
    budget = handover * 1.1
    assert budget < min(F16.wcet(200, 0.0, 60), Q4.wcet(200, 0.0, 60))
    plan = handover_planner().plan(req(Mode.AUTO), 200, budget)
    assert plan.precision == 'llama.cpp-q4_1' and plan.prefill_precision == 'llama.cpp-f16'
    assert plan.feasible and plan.est_wcet_s == pytest.approx(handover)
    assert 'llama.cpp-f16 prefill, llama.cpp-q4_1 decoding' in plan.note
    # With room for F16 alone, its fidelity wins; without the pair, the goal cannot fit.
    roomy = handover_planner().plan(req(Mode.AUTO), 200, F16.wcet(200, 0.0, 60) * 1.3)
    assert roomy.precision == 'llama.cpp-f16' and not roomy.prefill_precision
    with pytest.raises(Rejection):
        handover_planner(llama_handover=False).plan(req(Mode.AUTO), 200, budget)
    # A goal may pin the pair (in MODE_NONE too), and the F16 prompt it holds is free.
    pinned = handover_planner(llama_handover=False).plan(
        replace(req(Mode.NONE), precision='llama.cpp-f16>llama.cpp-q4_1'), 200, 5.0,
        engine_prefix={'llama.cpp-f16': 192})
    assert (pinned.precision, pinned.prefill_precision) == ('llama.cpp-q4_1', 'llama.cpp-f16')
    assert pinned.est_prefill_s == pytest.approx(F16.prefill(8) + HANDOVER_S_PER_TOKEN * 200)


def test_only_a_pair_faster_in_both_phases_is_offered():
    from timebill_ros.core.cut_kinds import EngineHandOver
    context = handover_planner().context
    assert EngineHandOver.pairs(context, 200) == [('llama.cpp-f16', 'llama.cpp-q4_1')]
    slower = replace(context, engines={'llama.cpp-f16': lambda: F16,
                                       'llama.cpp-q4_1': lambda: F16})
    assert EngineHandOver.pairs(slower, 200) == []


def test_by_default_a_surer_option_beats_a_more_faithful_one_met_first():
    """Met first: 0.83 against 0.85 is not bought by fidelity unless fit_tolerance says so."""
    from timebill_ros.core.cut_kinds import OtherEngine
    from timebill_ros.core.planning import choose, Option
    settings = PlannerSettings.from_config(NodeConfig())
    assert settings.fit_tolerance == 0.0
    faithful = Option(OtherEngine('llama.cpp-f16'), 32, 115, 0.83, 0.98, 0.5)
    surer = Option(OtherEngine('llama.cpp-q4_1'), 32, 150, 0.85, 0.68, 0.4)
    assert choose([faithful, surer], settings) is surer
    assert choose([faithful, surer], replace(settings, fit_tolerance=0.02)) is faithful
    # Equally sure (both fit at choice_quantile 0.97 or more): the most faithful runs.
    both = [replace(faithful, probability=0.975), replace(surer, probability=1.0)]
    assert choose(both, settings).quality == 0.98


def test_an_option_that_fits_the_cap_beats_one_that_fits_only_the_plan():
    """Decision-002 (seeds 7 and 11): predicted 32, ran to its 128 cap; F16 fit 115 tokens.

    Both fit the planned length, so both counted as sure at plan_quantile 0.9 and F16 ran
    and was killed; counted up to choice_quantile, the option that fits the cap wins.
    """
    from timebill_ros.core.cut_kinds import OtherEngine
    from timebill_ros.core.planning import choose, Option
    settings = PlannerSettings.from_config(NodeConfig())
    f16 = Option(OtherEngine('llama.cpp-f16'), 40, 115, 0.94, 0.98, 1.8)
    q4_1 = Option(OtherEngine('llama.cpp-q4_1'), 40, 128, 1.0, 0.68, 1.6)
    assert choose([f16, q4_1], settings) is q4_1
    assert choose([f16, q4_1], replace(settings, choice_quantile=0.9)) is f16
    # plan_quantile above choice_quantile: the choice counts as far as the plan.
    assert choose([f16, q4_1], replace(settings, choice_quantile=0.5)) is f16
    with pytest.raises(ValueError, match='choice_quantile'):
        replace(settings, choice_quantile=1.5)


def test_where_only_a_short_answer_fits_the_option_whose_answers_run_short_more_often_wins():
    # Two engines alike in speed, mean length factor and fidelity: Q4_1's answers
    # scatter around the full model's (a third as long to three times as long), F16's
    # keep its length. Predicted 40 tokens, true 40-120 (Calibrated): where 30 tokens
    # fit only a scattered answer can meet the deadline; where 130 fit both are sure.
    q4 = 'llama.cpp-q4_1'
    scattered = (0.33, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0)
    effects = CutEffects(precision={ENGINE: CutEffect(1.0, 0.9),
                                    q4: CutEffect(1.0, 0.9, scattered)})
    planner = make_planner(lambda: MODEL, Calibrated(40), effects=effects,
                           engines={ENGINE: lambda: LLAMA, q4: lambda: LLAMA})
    tight = planner.plan(req(Mode.AUTO, max_new=400), 40, LLAMA.wcet(40, 0.0, 30))
    assert tight.precision == q4 and tight.fit_probability == pytest.approx(0.145, abs=0.01)
    roomy = planner.plan(req(Mode.AUTO, max_new=400), 40, LLAMA.wcet(40, 0.0, 130))
    assert roomy.fit_probability == 1.0
    # Unmeasured ratios plan as before, on the mean factor alone: no 30-token answer.
    alone = make_planner(lambda: MODEL, Calibrated(40), effects=CutEffects(
        precision={ENGINE: CutEffect(1.0, 0.9)}), engines={ENGINE: lambda: LLAMA})
    with pytest.raises(Rejection, match='P\\(answer <= 30 tokens\\) = 0.0%'):
        alone.plan(req(Mode.AUTO, max_new=400), 40, LLAMA.wcet(40, 0.0, 30))


def test_a_refused_kill_goal_tries_only_where_the_engine_would_idle_and_a_token_fits():
    from timebill_ros.core.planning import best_effort, Plan
    refused = Rejection('P(fit) 0.01', Plan(fits_tokens=3, fit_probability=0.01))
    plan = best_effort(refused, OverrunPolicy.KILL, True, 'node idle')
    assert plan.fits_tokens == 3 and plan.note == 'best effort (Kill, node idle): P(fit) 0.01'
    assert best_effort(refused, OverrunPolicy.KILL, False, 'node idle') is None  # others wait
    assert best_effort(refused, OverrunPolicy.SKIP_NEXT, True, 'node idle') is None
    no_token = Rejection('nothing fits', Plan(fits_tokens=0))
    assert best_effort(no_token, OverrunPolicy.KILL, True, 'node idle') is None
    assert best_effort(Rejection('bad goal'), OverrunPolicy.KILL, True, 'node idle') is None
