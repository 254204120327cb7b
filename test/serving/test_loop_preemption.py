# SPDX-License-Identifier: Apache-2.0
"""Preemptive EDF through the Server on the local engines (tiny random-weight model).

A long goal with slack decodes; urgent goals arrive behind it. A caller's feedback hook
that takes 20 ms a token sets the pace, so the long goal runs for seconds.
"""

import time

import pytest

from conftest import Log
from timebill_ros.core.config import NodeConfig
from timebill_ros.core.request import GoalSpec, Mode, Outcome, OverrunPolicy
from timebill_ros.runtime.model import load_model
from timebill_ros.serving.assembly import Assembly
from timebill_ros.serving.jobs import JobHooks
from timebill_ros.serving.local_executor import local_server

FEEDBACK_S = 0.02
WAIT_S = 60.0


@pytest.fixture(scope='module')
def loaded():
    return load_model('tiny-random')


def make_server(loaded, preemption: bool):
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'scheduler': 'edf',
        'preemption': preemption})
    return local_server(Assembly(config, loaded, Log()), lambda *args: None)


def paced() -> JobHooks:
    return JobHooks(on_feedback=lambda *args: time.sleep(FEEDBACK_S))


def run(server, budget: float, tokens: int, key: str, policy=OverrunPolicy.KILL):
    spec = GoalSpec('Report the battery level.', budget_s=budget, mode=int(Mode.NONE),
                    max_new_tokens=tokens, overrun_policy=int(policy))
    job = server.admit(spec, key)
    server.submit(job, paced())
    return job


def long_then_urgent(server, long_budget: float, urgent_budget: float):
    """Send a 150-token goal (3 s), then three 5-token goals 0.3 s later; return both."""
    long_goal = run(server, long_budget, 150, 'long-goal')
    time.sleep(0.3)
    urgent = [run(server, urgent_budget, 5, f'urgent-{i}') for i in range(3)]
    for job in [long_goal, *urgent]:
        assert job.done.wait(WAIT_S)
    return long_goal.result, [job.result for job in urgent]


def test_urgent_goals_pause_a_long_goal_with_slack_and_all_meet(loaded):
    server = make_server(loaded, preemption=True)
    try:
        long_result, urgent = long_then_urgent(server, 20.0, 1.5)
    finally:
        server.stop()
    for result in urgent:
        assert result.outcome == Outcome.COMPLETED and result.deadline_met, result.reason
        assert result.tokens == 5
    assert long_result.outcome == Outcome.COMPLETED and long_result.deadline_met
    assert long_result.tokens == 150 and 'time(s)' in long_result.reason
    assert 'for goals with earlier deadlines' in long_result.reason, long_result.reason


def test_without_preemption_the_same_urgent_goals_die_behind_it(loaded):
    """The premise of the test above: the long goal holds the loop for seconds."""
    server = make_server(loaded, preemption=False)
    try:
        long_result, urgent = long_then_urgent(server, 20.0, 1.5)
    finally:
        server.stop()
    assert long_result.deadline_met and 'paused' not in long_result.reason
    assert all(result.outcome == Outcome.KILLED for result in urgent), \
        [result.reason for result in urgent]


def test_a_paused_kill_goal_still_ends_at_its_own_deadline(loaded):
    """The urgent goal outlasts the paused goal's deadline: Kill ends it while paused.

    The urgent goal is Skip-Next (it runs past its own deadline, 1.1 s, to its 60th
    paced token at 1.5 s and more); the paused goal's deadline is 1.2 s.
    """
    server = make_server(loaded, preemption=True)
    try:
        long_goal = run(server, 1.2, 100, 'long-goal')
        time.sleep(0.3)
        urgent = run(server, 0.8, 60, 'urgent', OverrunPolicy.SKIP_NEXT)
        assert long_goal.done.wait(WAIT_S) and urgent.done.wait(WAIT_S)
    finally:
        server.stop()
    result = long_goal.result
    assert result.outcome == Outcome.KILLED and 'paused 1 time(s)' in result.reason
    assert 0 < result.tokens < 100
    # One round of the loop: the urgent goal's step and its 20-ms feedback.
    assert result.e2e_s - 1.2 < 0.15, result.e2e_s
