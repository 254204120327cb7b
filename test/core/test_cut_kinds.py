# SPDX-License-Identifier: Apache-2.0
"""Cut objects: each kind's time, effect, per-token step and words; the plan's estimate."""

from dataclasses import fields, MISSING, replace

import pytest

from timebill_ros.core.config import NodeConfig, PARAM_BY_NAME
from timebill_ros.core.cut_kinds import (
    cut_of, CutContext, EarlyExit, EarlyExitConfig, Eviction, FallbackSwitch, MixConfig,
    MixedPrecision, Precision)
from timebill_ros.core.cuts import CutEffect, CutEffects
from timebill_ros.core.early_exit import ExitRule, LayerTimes
from timebill_ros.core.planner_settings import PlannerSettings
from timebill_ros.core.planning import MaxTokensPredictor, Plan, TimeBillPlanner
from timebill_ros.core.precision import Mix, PrecisionTable, UnitTimes
from timebill_ros.core.request import Mode
from timebill_ros.core.timing import TimingModel

FULL = TimingModel(1e-7, 1e-3, 0.01, 1e-5, 0.05)
LOW = TimingModel(1e-7, 1e-3, 0.01, 1e-5, 0.02)
EFFECTS = CutEffects(eviction_ratios=(0.5,), eviction=(CutEffect(2.0, 0.6),),
                     precision={'int8-dynamic': CutEffect(1.5, 0.4)},
                     early_exit=CutEffect(1.2, 0.7))
TABLE = PrecisionTable('int8-dynamic', UnitTimes((0.0125,) * 4, (0.0,) * 4),
                       UnitTimes((0.005,) * 4, (0.0,) * 4), (0.02, 0.01, 0.05, 0.4),
                       all_low_kl=0.5)
CTX = CutContext({'int8-dynamic': lambda: LOW}, EFFECTS,
                 EarlyExitConfig(ExitRule((10, 20)), LayerTimes(tuple([1.0] * 30), 0.0)),
                 MixConfig(TABLE, 'int8-dynamic'))


def test_each_cut_times_a_goal_as_the_planner_always_did():
    n_x, tokens = 500, 40
    assert Eviction(alpha=0.5).time_s(CTX, FULL, n_x, tokens) == FULL.wcet(n_x, 0.5, tokens)
    assert Precision('int8-dynamic').time_s(CTX, FULL, n_x, tokens) == pytest.approx(
        FULL.prefill(n_x) + LOW.decode(n_x, tokens))
    # Early exit plans every token at the earliest exit's share of a step (10 of 30).
    assert EarlyExit(0.5).time_s(CTX, FULL, n_x, tokens) == pytest.approx(
        FULL.prefill(n_x) + FULL.decode(0.5 * n_x, tokens) / 3)
    # A switch: 12 tokens at full precision, the rest at int8 over the grown cache.
    assert FallbackSwitch('int8-dynamic', 12).time_s(CTX, FULL, n_x, tokens) == pytest.approx(
        FULL.prefill(n_x) + FULL.decode(n_x, 12) + LOW.decode(n_x + 11, tokens - 11))
    # A mix lies between the full model and everything lowered.
    mixed = MixedPrecision(Mix((0, 1), 4)).time_s(CTX, FULL, n_x, tokens)
    assert Precision('int8-dynamic').time_s(CTX, FULL, n_x, tokens) < mixed < \
        Eviction().time_s(CTX, FULL, n_x, tokens)


def test_each_cut_knows_its_effect_step_and_words():
    assert Eviction(alpha=0.5).effect(CTX) == CutEffect(2.0, 0.6)
    assert Eviction().effect(CTX) == CutEffect(1.0, 1.0)
    assert Precision('int8-dynamic').effect(CTX) == CutEffect(1.5, 0.4)
    assert EarlyExit().effect(CTX) == CutEffect(1.2, 0.7)
    # A mix: its share of the low precision's factor and fidelity (core.precision).
    mix = Mix((0, 1), 4, predicted_kl=0.03)
    assert MixedPrecision(mix).effect(CTX) == CutEffect(TABLE.length_factor(mix, 1.5),
                                                        TABLE.fidelity(mix, 0.4))
    assert EarlyExit().step_s(CTX, FULL, 600) == pytest.approx(FULL.step(600) / 3)
    assert Precision('int8-dynamic').step_s(CTX, FULL, 600) == LOW.step(600)
    assert FallbackSwitch('int8-dynamic', 5).step_s(CTX, FULL, 600) == FULL.step(600)
    assert Eviction(alpha=0.5).describe(CTX) == 'with eviction ratio 0.50'
    assert Eviction(Mode.NONE).describe(CTX) == 'with the full model'
    assert EarlyExit(0.95).describe(CTX) == 'with early exit at layer 10 and eviction ratio 0.95'
    assert MixedPrecision(Mix((2,), 4)).describe(CTX) == \
        'with mixed-precision decoding (1 of 4 units lowered)'
    assert FallbackSwitch('int8-dynamic', 5).describe(CTX) == \
        'with the full model, switching to int8-dynamic decoding when time runs short'
    assert EarlyExit().plan_fields(CTX) == {'exit_layers': (10, 20)}
    assert MixedPrecision(Mix((2,), 4)).plan_fields(CTX)['precision_mix'] == (2,)


def test_the_estimate_of_a_plan_is_its_cut_s_time():
    settings = PlannerSettings.from_config(NodeConfig())
    planner = TimeBillPlanner(lambda: FULL, MaxTokensPredictor(), settings,
                              early_exit=CTX.early_exit, precisions=CTX.precisions,
                              effects=EFFECTS, mix=CTX.mix)
    plans = [Plan(mode=Mode.EVICTION, prompt_tokens=500, eviction_ratio=0.5),
             Plan(mode=Mode.NONE, prompt_tokens=500, precision='int8-dynamic'),
             Plan(mode=Mode.EARLY_EXIT, prompt_tokens=500),
             Plan(mode=Mode.EVICTION, prompt_tokens=500, precision='mixed',
                  precision_mix=(0, 1))]
    kinds = [Eviction, Precision, EarlyExit, MixedPrecision]
    for plan, kind in zip(plans, kinds):
        cut = cut_of(plan, planner.context)
        assert isinstance(cut, kind)
        assert planner.estimate_s(plan, 40) == cut.time_s(CTX, FULL, 500, 40)
        # A batch's steps replace the full-precision ETE.
        assert planner.estimate_s(plan, 40, LOW) == cut.time_s(CTX, LOW, 500, 40)


def test_planner_settings_are_the_node_configuration_s():
    config = NodeConfig.from_dict({'time_margin': 0.2, 'admit_probability': 0.05,
                                   'press': 'knorm', 'min_switch_speedup': 2.0,
                                   'auto_early_exit': True})
    settings = PlannerSettings.from_config(config)
    assert (settings.time_margin, settings.admit_probability, settings.press,
            settings.min_switch_speedup, settings.auto_early_exit) == \
        (0.2, 0.05, 'knorm', 2.0, True)
    # No second set of defaults: a bare configuration gives the parameter table's.
    assert all(f.default is MISSING for f in fields(PlannerSettings))
    bare = PlannerSettings.from_config(NodeConfig.from_dict({}))
    for f in fields(PlannerSettings):
        assert getattr(bare, f.name) == PARAM_BY_NAME[f.name].default
    with pytest.raises(ValueError, match=r'time_margin must be in \[0, 1\)'):
        replace(settings, time_margin=1.0)
    with pytest.raises(ValueError, match='infeasible must be one of'):
        replace(settings, infeasible='pray')


def test_a_plan_prefilling_on_another_option_names_its_hand_over():
    from timebill_ros.core.cut_kinds import handover_of
    assert handover_of('llama.cpp-q4_1', 'llama.cpp-f16') == 'llama.cpp-f16>llama.cpp-q4_1'
    assert handover_of('bfloat16', 'bfloat16') == ''  # a 16-bit copy prefills for itself
    assert handover_of('llama.cpp-q4_1', '') == ''


def test_two_cuts_together_multiply_their_length_spreads():
    from timebill_ros.core.cut_kinds import _product
    evict, precise = CutEffect(1.0, 0.5, (0.5, 2.0)), CutEffect(1.5, 0.8)
    both = _product(evict, precise)
    assert both.length_factor == pytest.approx(1.5) and both.quality == pytest.approx(0.4)
    assert both.length_ratios == pytest.approx((0.75, 3.0))  # the factor where unmeasured
    assert _product(CutEffect(2.0, 1.0), precise).length_ratios == ()
    assert _product(evict, CutEffect(1.0, 1.0, (1.0, 4.0))).length_ratios == \
        pytest.approx((0.5, 8.0))  # taken as moving together
