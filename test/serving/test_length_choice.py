# SPDX-License-Identifier: Apache-2.0
"""When admission may skip the length predictor: no length could change the plan."""

from dataclasses import replace
from types import SimpleNamespace

from timebill_ros.core.config import NodeConfig
from timebill_ros.core.cuts import CutEffect, CutEffects
from timebill_ros.core.planning import MaxTokensPredictor, TimeBillPlanner
from timebill_ros.core.planner_settings import PlannerSettings
from timebill_ros.core.request import Mode, OverrunPolicy, Request
from timebill_ros.core.timing import TimingModel
from timebill_ros.serving.length_choice import LengthChoice

TORCH = TimingModel(0.0, 1e-3, 0.0, 0.0, 0.05)  # 50 ms a step
LLAMA = TimingModel(0.0, 0.0025, 0.0, 0.0, 0.00375)  # ~4 ms a step
SETTINGS = replace(PlannerSettings.from_config(NodeConfig()), time_margin=0.0,
                   min_cut_saving=0.0)


def pipeline(engine: str, quality: float):
    """Return a pipeline whose planner has the full model and one engine option."""
    effects = CutEffects(precision={engine: CutEffect(1.0, quality)})
    planner = TimeBillPlanner(lambda: TORCH, MaxTokensPredictor(), SETTINGS,
                              engines={engine: lambda: LLAMA}, effects=effects)
    return SimpleNamespace(planner=planner)


def request(precision: str = '', max_new: int = 8) -> Request:
    return Request('Go.', '', 10.0, OverrunPolicy.KILL, Mode.AUTO, max_new, 1.0,
                   precision=precision)


def test_the_predictor_is_skipped_when_every_length_fits_an_engine_as_faithful():
    # 8 tokens fit surely on both; the f16 copy (0.98) runs: no length changes that.
    faithful = pipeline('llama.cpp-f16', 0.98)
    assert faithful.planner.plan(request(), 45, 10.0, 8).precision == 'llama.cpp-f16'
    assert LengthChoice._worst_case_fits(faithful, request(), 45, 10.0)
    # Pinned to the engine: the same.
    assert LengthChoice._worst_case_fits(faithful, request('llama.cpp-f16'), 45, 10.0)


def test_the_predictor_runs_where_a_shorter_answer_could_buy_a_more_faithful_option():
    # 200 tokens fit only on the q4_1 engine (fidelity 0.7): a predicted 20 would let
    # the full model run, so the length matters.
    lossy = pipeline('llama.cpp-q4_1', 0.7)
    plan = lossy.planner.plan(request(max_new=200), 45, 2.0, 200)
    assert plan.precision == 'llama.cpp-q4_1'
    assert not LengthChoice._worst_case_fits(lossy, request(max_new=200), 45, 2.0)
