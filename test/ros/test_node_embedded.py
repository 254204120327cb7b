# SPDX-License-Identifier: Apache-2.0
"""End to end with the real embedded SmolLM2 model: answers, ETE calibration, eviction."""

import time

import pytest
import yaml

from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Duration

from conftest import NodeProcess, run_unstalled
from timebill_msgs.action import Instruct
from timebill_msgs.srv import PlanInstruction
from timebill_ros.tools.client import InstructClient, make_goal

R, G = Instruct.Result, Instruct.Goal
SENTENCES = [
    'The harbour town woke early, and the fishing boats left before the sun rose.',
    'Market stalls sold bread, cheese, rope, lanterns and bright woollen scarves.',
    'An old lighthouse keeper wrote the weather in a notebook every evening.',
    'Children ran along the sea wall while gulls argued over scraps of fish.',
    'In winter the storms closed the harbour for days and the town grew quiet.',
]
CONTEXT = ' '.join(SENTENCES[i % 5] + f' (note {i})' for i in range(335))
INSTRUCTION = 'Repeat the notes above, one per line, starting from the first.'
MAX_NEW = 512
# Room for ETE error on the eviction side: twice the node default. The evicted goal's
# slack is the margin wherever the budget lies, and on a shared 2-core VM the speed
# swings by more than 10 % within one of these ~80 s goals (a clean-clone CI run at
# 4ffe1b3 killed it 0.028 s past an 80 s budget after 495 of 512 tokens).
MARGIN = 0.20
ALPHA_MAX = 0.95  # the node default


@pytest.fixture(scope='module')
def node(rclpy_context, tmp_path_factory):
    path = tmp_path_factory.mktemp('profile') / 'embedded.yaml'
    # The max-new-tokens stand-in: these tests are about the ETE and eviction, and plan
    # for the goal's whole cap (the shipped head is tested in test_node_robot.py).
    proc = NodeProcess({'model': 'embedded', 'profile': str(path), 'calibrate_on_start': True,
                        'calibration_quick': True, 'time_margin': MARGIN,
                        'length_predictor': 'max-new-tokens', 'llama_engines': ''},
                       ready_timeout=600)
    proc.profile_path = path
    yield proc
    proc.stop()


@pytest.fixture(scope='module')
def client(node):
    c = InstructClient(node_name='embedded_test_client')
    c.wait_for_server(30)
    yield c
    c.close()


def test_embedded_model_answers_correctly_before_deadline(client):
    run = client.ask(make_goal('What is the capital of France? Answer in one sentence.',
                               60.0, max_new_tokens=40), 120)
    res = run.result
    assert run.status == GoalStatus.STATUS_SUCCEEDED
    assert res.outcome == R.COMPLETED and res.deadline_met
    assert 'Paris' in res.text
    assert run.streamed_text == res.text


def test_profile_written_with_heldout_errors(node):
    data = yaml.safe_load(node.profile_path.read_text())
    assert data['model'] == 'SmolLM2-135M-Instruct' and data['device'] == 'cpu'
    assert data['coefficients']['p'] > 0  # decode steps slow down with the cache
    assert data['heldout']['prefill_mape_pct'] >= 0


def _plan(request, service='/timebill/plan'):
    import rclpy
    helper = rclpy.create_node('plan_helper')
    try:
        plan_client = helper.create_client(PlanInstruction, service)
        assert plan_client.wait_for_service(timeout_sec=10)
        future = plan_client.call_async(request)
        rclpy.spin_until_future_complete(helper, future, timeout_sec=30)
        return future.result()
    finally:
        helper.destroy_node()


def test_eviction_meets_a_budget_that_full_cache_misses(node, client):
    # 1. A full-cache run with time to spare: measures what MODE_NONE really takes
    #    here, and lets the node's online re-fit see this prompt length.
    base = client.ask(make_goal(INSTRUCTION, 300.0, CONTEXT, mode=G.MODE_NONE,
                                max_new_tokens=MAX_NEW), 600)
    assert base.result.outcome == R.COMPLETED and base.result.deadline_met
    assert base.result.tokens == MAX_NEW  # a long answer, so the budget binds
    measured_full = base.result.e2e_s
    # 2. The same at alpha_max, also with time to spare: the re-fit then holds decode
    #    steps measured in this serving node at both ends of the cache lengths the
    #    planner chooses between (calibration ran idle, and only up to 2,048 tokens).
    warm = client.ask(make_goal(INSTRUCTION, 300.0, CONTEXT, mode=G.MODE_EVICTION,
                                max_new_tokens=MAX_NEW, eviction_ratio=ALPHA_MAX), 600)
    assert warm.result.outcome == R.COMPLETED and warm.result.tokens > 100

    # 3. The node's own estimates bound the budgets eviction can rescue.
    reply = _plan(PlanInstruction.Request(
        instruction=INSTRUCTION, context=CONTEXT, budget=Duration(sec=300),
        mode=G.MODE_EVICTION, max_new_tokens=MAX_NEW))
    plan = reply.plan
    assert reply.accepted and plan.prompt_tokens >= 1500
    lowest = plan.est_wcet_alpha_max_s / (1 - MARGIN)
    highest = min(plan.est_wcet_full_s, measured_full)
    figures = (f'full run {measured_full:.2f} s, alpha_max run {warm.result.e2e_s:.2f} s, '
               f'estimates {plan.est_wcet_full_s:.2f} / {plan.est_wcet_alpha_max_s:.2f} s')
    assert lowest < highest, figures
    # Near the low end: the evicted run's slack is the margin wherever the budget
    # lies (the planner spends the rest), the full run's grows with the distance.
    budget = lowest + (highest - lowest) / 3

    evict = client.ask(make_goal(INSTRUCTION, budget, CONTEXT, mode=G.MODE_EVICTION,
                                 max_new_tokens=MAX_NEW), 600)
    assert evict.accepted, evict.reject_reason
    res = evict.result
    assert res.plan.eviction_ratio > 0 and res.plan.press == 'snapkv'
    assert res.outcome == R.COMPLETED and res.deadline_met, (res.reason, budget, figures)

    full = client.ask(make_goal(INSTRUCTION, budget, CONTEXT, mode=G.MODE_NONE,
                                max_new_tokens=MAX_NEW), 600)
    assert full.accepted and full.result.plan.eviction_ratio == 0.0
    assert full.result.outcome == R.KILLED and not full.result.deadline_met, (budget, figures)

    # A budget the whole answer cannot fit: with the context prefix-cached by now, the
    # evicted plan may fit a few tokens; the idle node then runs it as best effort
    # (idle_best_effort), kills it at its deadline and never claims a deadline it missed.
    # Timed from the client: a try in which this machine stalled every process is repeated
    # (CI at 73075ee saw the result 4.07 s after sending, the node's e2e 0.66 s).
    hopeless = run_unstalled(lambda: client.ask(make_goal(
        INSTRUCTION, 0.5, CONTEXT, mode=G.MODE_EVICTION, max_new_tokens=MAX_NEW), 60))
    if hopeless.accepted:
        res = hopeless.result
        # Best effort at admission or at dispatch (re-planned there, on the cached prefix).
        assert 'best effort (Kill' in res.plan.note or res.plan.feasible, res.plan.note
        assert res.outcome in (R.COMPLETED, R.KILLED) and res.tokens < MAX_NEW
        assert res.deadline_met == (res.outcome == R.COMPLETED)
        figures = (res.reason, res.e2e_s, res.queue_s, res.prefill_s, res.tokens, res.plan.note,
                   f'accepted after {hopeless.answered_at - hopeless.sent_at:.3f} s, result '
                   f'{hopeless.finished_at - hopeless.answered_at:.3f} s later; sent at '
                   f'{time.time() - (time.monotonic() - hopeless.sent_at):.3f} (wall, as the '
                   'node log stamps)',
                   ''.join(node.lines[-20:]))
        assert hopeless.finished_at - hopeless.sent_at < 0.5 + 1.0, figures  # deadline, a token
    else:
        assert 'cannot meet the deadline' in hopeless.reject_reason


def test_fixed_eviction_ratio_and_caller_length_through_the_action(client):
    run = client.ask(make_goal(INSTRUCTION, 120.0, CONTEXT, mode=G.MODE_EVICTION,
                               max_new_tokens=4, eviction_ratio=0.5, expected_tokens=3), 300)
    res = run.result
    assert run.accepted and res.outcome == R.COMPLETED and res.deadline_met
    assert res.plan.eviction_ratio == pytest.approx(0.5) and res.plan.press == 'snapkv'
    assert res.plan.predictor == 'caller' and res.plan.predicted_tokens == 3
    bad = client.ask(make_goal(INSTRUCTION, 120.0, CONTEXT, mode=G.MODE_NONE,
                               eviction_ratio=0.5), 60)
    assert not bad.accepted and 'needs MODE_EVICTION' in bad.reject_reason


def test_diagnostics_show_the_online_estimation_error(client):
    import threading
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from diagnostic_msgs.msg import DiagnosticArray
    seen = []
    sub_node = rclpy.create_node('ete_diag_listener')
    sub_node.create_subscription(DiagnosticArray, '/diagnostics', seen.append, 10)
    executor = SingleThreadedExecutor()
    executor.add_node(sub_node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if seen:
                break
            threading.Event().wait(0.1)
        assert seen, 'no /diagnostics message'
        timing = next(status for status in seen[-1].status
                      if status.name.endswith(': timing model'))
        values = {kv.key: kv.value for kv in timing.values}
    finally:
        executor.shutdown(timeout_sec=2)
        sub_node.destroy_node()
    assert values['planner'] == 'TimeBillPlanner'
    # Goals earlier in this module ran, so the ETE was compared with them and re-fit.
    error = float(values['ete_abs_error_p50_pct'])
    assert 0.0 <= error < 50.0
    assert float(values['ete_step_s_per_kv_token']) > 0.0
    assert 0.3 < float(values['ete_drift_decode']) < 3.0
    # Fewer than 8 solo goals: no quantiles yet, the count says why.
    ratios = values['ete_error_ratios_q10_q90']
    assert ratios.endswith('goals measured') or len(ratios.split()) == 5, ratios


def test_length_predictor_expects_a_longer_answer_for_an_essay(node):
    # A second node (own namespace) with the shipped length head, same profile.
    rlp = NodeProcess({'model': 'embedded', 'profile': str(node.profile_path),
                       'length_predictor': 'rlp', 'warm_up': False, 'llama_engines': ''},
                      ready_timeout=300,
                      namespace='/rlp')
    try:
        def predicted(instruction):
            reply = _plan(PlanInstruction.Request(
                instruction=instruction, budget=Duration(sec=300), mode=G.MODE_EVICTION,
                max_new_tokens=256), '/rlp/timebill/plan')
            assert reply.accepted, reply.reason
            assert reply.plan.predictor.startswith('rlp-')
            return reply.plan.predicted_tokens
        essay = predicted('Write a detailed, multi-section essay on the history of the Roman '
                          'Empire, covering its founding, expansion, government and decline.')
        word_prompt = 'Reply with a single word: is water wet? yes or no.'
        word = predicted(word_prompt)
        assert essay > word
        # A goal that runs reads the same head off its own prefill (no extra forward):
        # admitted on a pending plan, it ends with the prediction the service made.
        client = InstructClient('/rlp/timebill/instruct', 'rlp_client', '/rlp/timebill/responses')
        try:
            client.wait_for_server(30)
            run = client.ask(make_goal(word_prompt, 120.0, mode=G.MODE_EVICTION,
                                       max_new_tokens=256), 180)
        finally:
            client.close()
        assert run.status == GoalStatus.STATUS_SUCCEEDED and run.result.deadline_met
        plan = run.result.plan
        assert plan.predictor.startswith('rlp-') and 'pending' not in plan.predictor
        assert abs(plan.predicted_tokens - word) <= 1  # same features; 'mean' decode rounds
    finally:
        rlp.stop()
