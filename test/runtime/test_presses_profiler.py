# SPDX-License-Identifier: Apache-2.0
"""kvpress presses around prefill, and calibration on the tiny model."""

import pytest

pytest.importorskip('kvpress')

from timebill_ros.core.eviction import press_skip_reason  # noqa: E402
from timebill_ros.core.config import NodeConfig  # noqa: E402
from timebill_ros.core.planning import (  # noqa: E402
    MaxTokensPredictor, Plan, PlannerSettings, TimeBillPlanner)
from timebill_ros.core.request import Mode, OverrunPolicy, Request  # noqa: E402
from timebill_ros.core.timing import TimingModel  # noqa: E402
from timebill_ros.core.profile import Profile  # noqa: E402
from timebill_ros.runtime.engine import Engine  # noqa: E402
from timebill_ros.serving.loop import generate  # noqa: E402
from timebill_ros.runtime.model import load_model, prompt_ids  # noqa: E402
from timebill_ros.runtime.presses import make_press, press_for_plan, PRESSES  # noqa: E402
from timebill_ros.runtime.profiler import calibrate, fastest_threads, Grid  # noqa: E402
from conftest import drive, goals_arriving  # noqa: E402


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


@pytest.mark.parametrize('name', PRESSES)
def test_press_shrinks_the_cache_and_decoding_goes_on(tiny, name):
    ids = prompt_ids(tiny.tokenizer, 'Summarise.', 'word ' * 600)
    stats = generate(Engine(tiny, press_for_plan),
                     ids, 5, Plan(eviction_ratio=0.5, press=name), lambda ev: True)
    assert stats.kv_tokens_after_prefill == pytest.approx(len(ids) * 0.5, abs=2)
    assert stats.tokens == 5


@pytest.mark.parametrize('name', PRESSES)
def test_a_5_token_prompt_never_fails_under_any_press(tiny, name):
    # kvpress asserts on prompts shorter than a press's window (SnapKV: 64 queries);
    # the planner plans no eviction there and says so, and the engine never builds
    # such a press even when a plan asks for one.
    ids = tiny.tokenizer('stop or go')['input_ids'][:5]
    ids = (ids * 5)[:5]
    request = Request('stop or go', '', 3.0, OverrunPolicy.KILL, Mode.EVICTION, 4, 1.0,
                      eviction_ratio=0.5)
    plan = TimeBillPlanner(lambda: TimingModel(0.0, 1e-3, 0.0, 1e-5, 0.01), MaxTokensPredictor(),
                           PlannerSettings.from_config(NodeConfig(press=name))).plan(
                               request, len(ids), 3.0)
    if plan.eviction_ratio == 0.0:
        assert name in plan.note and 'skipped' in plan.note
    stats = generate(Engine(tiny, press_for_plan), ids, 4,
                     Plan(prompt_tokens=5, eviction_ratio=0.5, press=name), lambda ev: True)
    assert stats.tokens >= 1 and 1 <= stats.kv_tokens_after_prefill <= 5
    for alpha in (0.5, 0.95):
        reason = press_skip_reason(name, 5, alpha)
        stats = generate(Engine(tiny, press_for_plan), ids, 2,
                         Plan(prompt_tokens=5, eviction_ratio=alpha, press=name), lambda ev: True)
        assert (stats.kv_tokens_after_prefill == 5) == bool(reason)


def test_no_press_at_zero_and_bad_names():
    assert make_press('snapkv', 0.0) is None
    with pytest.raises(ValueError):
        make_press('magic', 0.5)
    with pytest.raises(ValueError):
        make_press('snapkv', 1.0)


def test_calibration_round_trip(tiny, tmp_path):
    grid = Grid(prefill_fit=(16, 64, 128, 256), prefill_heldout=(96,),
                decode_fit=(16, 128, 256), decode_heldout=(64,), repeats=1, decode_steps=2)
    profile = calibrate(tiny, grid, progress=False)
    path = tmp_path / 'p.yaml'
    profile.save(path)
    loaded = Profile.load(path)
    assert loaded.matches('tiny-random', 'cpu', 'float32')
    assert not loaded.matches('tiny-random', 'cuda', 'float32')
    assert loaded.timing_model() == profile.timing_model()
    assert loaded.heldout['prefill_lengths'] == [96]
    assert len(loaded.prefill_points) == 5 and len(loaded.decode_points) == 4
    assert loaded.versions['torch']
    assert loaded.decode_threads() >= 1  # 0 ('as is') is stored as the count in force
    # Per-layer decode times for early exit travel with the profile.
    assert len(loaded.layer_times['layers_s']) == tiny.num_layers
    assert loaded.layer_times['head_s'] > 0
    (tmp_path / 'bad.yaml').write_text('just: text\n')
    with pytest.raises(ValueError):
        Profile.load(tmp_path / 'bad.yaml')


def test_a_calibration_cut_short_by_goals_resumes_and_measures_every_point(tiny):
    from timebill_ros.runtime.profiler import calibration_steps
    grid = Grid(prefill_fit=(16, 64, 128), prefill_heldout=(96,), decode_fit=(16, 128),
                decode_heldout=(64,), repeats=1, decode_steps=2, warmup=0)
    # Goals arrive three times: each cuts a point short.
    profile, yields = drive(calibration_steps(tiny, grid, stop=goals_arriving(),
                                              layer_times=False))
    points = 4 + 3  # prefill lengths x repeats, decode lengths
    assert yields > points  # the points cut short were measured again
    assert sorted(n for n, _ in profile.prefill_points) == [16, 64, 96, 128]
    assert len(profile.decode_points) == 3 and not profile.layer_times
    assert all(t > 0 for _, t in profile.prefill_points)
    assert profile.heldout['prefill_lengths'] == [96]


def test_the_thread_probe_times_each_count_and_restores_the_thread(tiny):
    import torch
    before = torch.get_num_threads()
    best, times = fastest_threads(tiny, candidates=(1, 2), steps=3)
    assert sorted(times) == [1, 2] and best in times and all(t > 0 for t in times.values())
    assert torch.get_num_threads() == before
    best, times = fastest_threads(tiny, candidates=(1,), steps=2)
    assert best == 1 and list(times) == [1]
