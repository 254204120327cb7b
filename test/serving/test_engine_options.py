# SPDX-License-Identifier: Apache-2.0
"""Engine options: the start-up regime line, stored profiles, goals planning in prefill."""

from types import SimpleNamespace

from timebill_ros.core.cut_kinds import CutContext
from timebill_ros.core.cuts import CutEffects
from timebill_ros.core.request import Mode, OverrunPolicy, Request
from timebill_ros.core.timing import TimingModel
from timebill_ros.serving.plan_notes import on_torch_for_sure
from timebill_ros.serving.engine_options import describe_regime

TORCH = TimingModel(0.0, 0.003, 0.2, 0.0, 0.085)
INT8 = TimingModel(0.0, 0.003, 0.2, 0.0, 0.06)
LLAMA = TimingModel(0.0, 0.0016, 0.01, 0.0, 0.008)


def test_the_regime_line_times_every_option_and_names_the_fastest():
    line = describe_regime(TORCH, {'int8-weight': INT8}, {'llama.cpp-q4_1': LLAMA})
    assert 'torch 3.03 s (step 85.0 ms)' in line  # 0.2 + 0.192 prefill + 31 x 85 ms
    assert 'int8-weight 2.25 s' in line  # the torch prefill, then int8 steps
    assert 'llama.cpp-q4_1 0.36 s (step 8.0 ms)' in line
    assert 'fastest here: llama.cpp-q4_1; another engine prefills faster' in line
    # F16 prefills faster, Q4_1 steps faster: the pair of them is timed as well.
    f16 = TimingModel(0.0, 0.0008, 0.01, 0.0, 0.009)
    line = describe_regime(TORCH, {}, {'llama.cpp-f16': f16, 'llama.cpp-q4_1': LLAMA})
    assert 'llama.cpp-f16>llama.cpp-q4_1 0.31 s (step 8.0 ms)' in line  # 0.061 + 31 x 8 ms
    assert 'fastest here: llama.cpp-f16>llama.cpp-q4_1' in line
    assert '>' not in describe_regime(TORCH, {}, {'llama.cpp-f16': f16,
                                                  'llama.cpp-q4_1': LLAMA}, handover=False)
    slow_prefill = TimingModel(2e-6, 0.0016, 0.01, 0.0, 0.008)  # quadratic: loses long prompts
    line = describe_regime(TORCH, {}, {'llama.cpp-f16': slow_prefill})
    assert line.endswith('the torch prefill is the fastest from about 832 prompt tokens')


class Planner:
    def __init__(self, engines):
        self.context = CutContext({}, CutEffects(), engines=engines)


def goal(mode=Mode.AUTO, precision=''):
    return Request('q', '', 1.0, OverrunPolicy.KILL, mode, 16, 1.0, precision=precision)


def test_only_goals_bound_to_torch_plan_in_their_prefill_when_an_engine_is_resident():
    with_engine, without = Planner({'llama.cpp-q4_1': None}), Planner({})
    assert on_torch_for_sure(without, goal())
    assert not on_torch_for_sure(with_engine, goal())  # AUTO may pick the engine
    assert on_torch_for_sure(with_engine, goal(Mode.NONE))
    assert on_torch_for_sure(with_engine, goal(Mode.AUTO, 'int8-weight'))
    assert not on_torch_for_sure(with_engine, goal(Mode.NONE, 'llama.cpp-q4_1'))


def test_an_option_profile_timed_with_another_chunk_or_kv_layout_is_retaken():
    from timebill_ros.runtime.llama_engine import KV_LAYOUT
    from timebill_ros.serving.engine_options import _timed_as_run
    engine = SimpleNamespace(model=SimpleNamespace(chunk=64))
    assert _timed_as_run(SimpleNamespace(versions={'chunk': 64, 'kv': KV_LAYOUT}), engine)
    assert not _timed_as_run(SimpleNamespace(versions={'chunk': 64}), engine)  # unified
    assert not _timed_as_run(SimpleNamespace(versions={'chunk': 32, 'kv': KV_LAYOUT}), engine)
