# SPDX-License-Identifier: Apache-2.0
"""The shipped configuration with the embedded model serves short robot instructions."""

import re

import pytest
import yaml

from action_msgs.msg import GoalStatus

from conftest import client_fixture, NodeProcess, ROOT
from timebill_msgs.action import Instruct
from timebill_ros.tools.client import make_goal

R, G = Instruct.Result, Instruct.Goal


@pytest.fixture(scope='module')
def node(rclpy_context, tmp_path_factory):
    with open(f'{ROOT}/config/timebill.yaml', encoding='utf-8') as handle:
        params = yaml.safe_load(handle)['/**']['ros__parameters']
    params = {k: v for k, v in params.items() if v != ''}
    params['profile'] = str(tmp_path_factory.mktemp('profile') / 'embedded.yaml')
    proc = NodeProcess(params, ready_timeout=600, namespace='/robot')
    yield proc
    proc.stop()


client = client_fixture('/robot', 'robot_test_client')


def test_a_cold_start_serves_on_the_fastest_engine_and_profiles_the_rest_while_idle(
        node, client):
    # The fixture's profile folder is empty, as on a first start: the node calibrated the
    # fastest option that serves alone (a llama.cpp engine on this model) and serves on
    # it; the model itself and the other options are profiled between goals.
    node.wait_for_line('serving now; profiling while idle:', 5)
    run = client.ask(make_goal('Answer with one word, STOP or GO: the lane ahead is clear.',
                               10.0, mode=G.MODE_AUTO), 60)
    assert run.accepted, run.reject_reason
    res = run.result
    assert res.plan.precision.startswith('llama.cpp-'), (res.plan.precision, res.plan.note)
    assert 'not yet profiled here' in res.plan.note
    assert res.outcome == R.COMPLETED and res.deadline_met, res.reason
    none = client.ask(make_goal('Say GO.', 30.0, mode=G.MODE_NONE), 60)
    if not none.accepted:  # the model itself had no profile yet: refused with the reason
        assert 'not yet profiled on this machine' in none.reject_reason
    # The model itself comes after the other engine; the int8 copies (they prefill on
    # the model) after it, while the tests below run (their goals cut the points short).
    node.wait_for_line('profiled float32 in ', 600)
    assert any('profiled llama.cpp-' in line for line in node.lines)
    run = client.ask(make_goal('Say GO.', 30.0, mode=G.MODE_NONE), 60)
    assert run.accepted and run.result.outcome == R.COMPLETED, run.reject_reason


def test_one_word_decision_with_3_s_is_accepted_and_completes(client):
    # The regression: with the max-new-tokens stand-in this goal was planned for
    # 128 answer tokens (~8 s) and refused; the shipped head predicts a short answer.
    run = client.ask(make_goal('Answer with one word, STOP or GO: a pedestrian is crossing '
                               '4 m ahead of the vehicle, ego speed 8 m/s.', 3.0,
                               mode=G.MODE_AUTO), 60)
    assert run.accepted, run.reject_reason
    res = run.result
    assert res.outcome == R.COMPLETED and res.deadline_met, res.reason
    assert run.status == GoalStatus.STATUS_SUCCEEDED
    assert res.e2e_s <= 3.0 and res.tokens < 20
    # The shipped head predicts a short answer; or, where the whole cap fits on the most
    # faithful option, no prediction could change the plan and none is made.
    assert (res.plan.predictor.startswith('rlp') and res.plan.predicted_tokens < 64) or \
        'no prediction could change the plan' in res.plan.note, res.plan.note
    assert res.plan.fit_probability > 0.5 and res.plan.eviction_ratio == 0.0  # too short
    assert res.text.strip() and run.streamed_text == res.text


def test_hopeless_budget_is_rejected_with_the_prediction(client):
    run = client.ask(make_goal('List ten pre-drive checks for an electric shuttle.', 0.005,
                               mode=G.MODE_AUTO), 60)
    assert not run.accepted
    assert 'cannot meet the deadline' in run.reject_reason
    assert 'predicted' in run.reject_reason


def test_a_tight_command_runs_on_a_llama_cpp_option_and_the_plan_names_it(client):
    # The shipped config keeps llama.cpp variants resident. At half the time the torch
    # float32 answer takes here, float32 cannot fit and int8-weight is no faster than
    # 0.55x of it (AMD EPYC 0.7x, Intel Xeon 0.55-0.7x); a llama.cpp option fits (0.2-0.4x),
    # and among those that fit it is the most faithful (int8-dynamic is the least).
    # The budget is relative: a fixed 2 s fits float32 on the Xeon (24 ms a step).
    instruction = ('Summarise the robot status in one sentence: battery 64 %, lidar OK, '
                   'camera 2 offline, speed 1.2 m/s.')
    full = client.ask(make_goal(instruction, 60.0, mode=G.MODE_NONE, max_new_tokens=48), 120)
    assert full.accepted and full.result.outcome == R.COMPLETED, full.result.reason
    budget = 0.5 * full.result.e2e_s
    run = client.ask(make_goal(instruction, budget, mode=G.MODE_AUTO, max_new_tokens=48), 60)
    assert run.accepted, run.reject_reason
    res = run.result
    assert res.plan.precision.startswith('llama.cpp-'), (res.plan.precision, res.plan.note)
    # Usually COMPLETED; on a loaded 2-core VM the same tokens have taken 4x as long (CI
    # at 87be820). What holds either way is the bound: over by at most one token.
    if res.outcome == R.COMPLETED:
        assert res.deadline_met and res.e2e_s <= budget, res.reason
    else:
        assert res.outcome == R.KILLED and not res.deadline_met, res.reason
        assert res.e2e_s <= budget + 0.2 and res.tokens > 0, res.reason
    assert res.text.strip() and run.streamed_text == res.text


def test_kill_stops_a_pinned_llama_cpp_prefill_within_one_chunk(client):
    context = ' '.join(f'Shelf {i} holds {i * 7 % 50} boxes of part P{i}.' for i in range(300))
    # The caller's expected length: no predictor runs, the budget is the prefill's.
    run = client.ask(make_goal('How many boxes does shelf 17 hold?', 0.5, context=context,
                               mode=G.MODE_NONE, precision='llama.cpp-q4_1',
                               max_new_tokens=8, expected_tokens=8), 60)
    assert run.accepted, run.reject_reason
    res = run.result
    assert res.outcome == R.KILLED and not res.deadline_met and res.tokens == 0
    assert 'during prefill' in res.reason, res.reason
    # One chunk of 64 tokens is ~0.1 s here; the prompt alone would take seconds.
    assert res.e2e_s < 0.5 + 0.5, res.reason


def test_a_llama_cpp_option_plans_on_the_prompt_it_holds(client):
    # Two questions on one context, both on the same llama.cpp option: the second prompt
    # starts as the first did, so its prefill, and its plan, skip the held part.
    context = ' '.join(f'Bay {i} holds pallet K{i * 13 % 97}.' for i in range(60))

    def ask(question):
        run = client.ask(make_goal(question, 60.0, context=context, mode=G.MODE_NONE,
                                   precision='llama.cpp-q4_1', max_new_tokens=8,
                                   expected_tokens=8), 120)
        assert run.accepted, run.reject_reason
        assert run.result.outcome == R.COMPLETED, run.result.reason
        return run.result.plan

    first, second = ask('Which pallet is in bay 5?'), ask('Which pallet is in bay 41?')
    held = re.search(r'(\d+) of (\d+) prompt tokens held by llama.cpp-q4_1 from an earlier '
                     'prompt', second.note)
    assert held, second.note
    assert int(held[1]) > 0.8 * int(held[2]) == 0.8 * second.prompt_tokens, second.note
    assert second.est_prefill_s < 0.5 * first.est_prefill_s, (first, second)
