# SPDX-License-Identifier: Apache-2.0
"""One goal lifecycle on both executors: Skip-Next, Kill and close, the same assertions.

The local engines run the tiny random-weight model; the replica pool streams from a real
HTTP server speaking vLLM's SSE (test/serving/sse_replica.py; the real `vllm serve` runs in
test/ros/test_node_vllm.py). A caller's feedback hook that takes 20 ms a token makes
both executors' goals run long enough to overrun, at a pace the test sets.
"""

import threading
import time

import pytest

from conftest import Log
from sse_replica import sse_replica
from timebill_ros.core.config import NodeConfig
from timebill_ros.core.request import GoalSpec, Mode, Outcome, OverrunPolicy
from timebill_ros.runtime.model import load_model
from timebill_ros.serving.assembly import Assembly
from timebill_ros.serving.jobs import JobHooks
from timebill_ros.serving.local_executor import local_server
from timebill_ros.serving.replica_executor import replica_server

FEEDBACK_S = 0.02  # what each token's feedback costs the caller here
WAIT_S = 60.0


@pytest.fixture(scope='module')
def loaded():
    return load_model('tiny-random')


@pytest.fixture(params=['local engines', 'replica pool'])
def server(request, loaded):
    """Yield a Server over each executor (a replica streaming a token every 50 ms)."""
    if request.param == 'local engines':
        config = NodeConfig.from_dict({
            'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
            'length_predictor': 'max-new-tokens', 'auto_precision': '', 'scheduler': 'edf'})
        serving = local_server(Assembly(config, loaded, Log()), lambda *args: None)
        yield serving
        serving.stop()
        return
    with sse_replica(gap_s=0.05) as url:
        config = NodeConfig.from_dict({'backend': 'vllm', 'vllm_endpoints': url,
                                       'warm_up': False})
        serving = replica_server(config, loaded.tokenizer, Log())
        yield serving
        serving.stop()


def spec(budget: float, tokens: int, policy=OverrunPolicy.KILL) -> GoalSpec:
    return GoalSpec('Report the battery level.', budget_s=budget, mode=int(Mode.NONE),
                    max_new_tokens=tokens, overrun_policy=int(policy))


def paced(past_deadline: threading.Event = None, go_on: threading.Event = None) -> JobHooks:
    """Return hooks whose feedback takes FEEDBACK_S a token.

    At the first token past the deadline it sets ``past_deadline`` and waits for
    ``go_on`` (the test acts while the goal still runs).
    """
    def on_feedback(event, elapsed, remaining, plan):
        time.sleep(FEEDBACK_S)
        if remaining < 0 and past_deadline is not None and not past_deadline.is_set():
            past_deadline.set()
            go_on.wait(WAIT_S)
    return JobHooks(on_feedback=on_feedback)


def run(server, goal_spec: GoalSpec, key: str, hooks: JobHooks = JobHooks()):
    job = server.admit(goal_spec, key)
    server.submit(job, hooks)
    return job


def test_a_skip_next_overrun_skips_the_goal_dispatched_next_and_only_that_one(server):
    past, go_on = threading.Event(), threading.Event()
    late = run(server, spec(0.5, 40, OverrunPolicy.SKIP_NEXT), 'late-goal',
               paced(past, go_on))
    assert past.wait(WAIT_S), 'the Skip-Next goal never passed its deadline'
    # Locally it queues behind the late goal; on replicas it starts beside it at once.
    next_goal = run(server, spec(30.0, 3), 'next-goal')
    go_on.set()
    assert late.done.wait(WAIT_S) and next_goal.done.wait(WAIT_S)
    after = run(server, spec(30.0, 3), 'after-goal')
    assert after.done.wait(WAIT_S)
    assert late.result.outcome == Outcome.COMPLETED and not late.result.deadline_met
    assert late.result.tokens == 40  # Skip-Next lets it run to its end
    assert next_goal.result.outcome == Outcome.SKIPPED
    assert next_goal.result.reason == \
        'skipped: previous goal late-goa overran its deadline (Skip-Next)'
    assert after.result.outcome == Outcome.COMPLETED and after.result.deadline_met
    assert server.settled()


def test_a_late_skip_next_goal_with_none_waiting_skips_nothing_later(server):
    late = run(server, spec(0.5, 40, OverrunPolicy.SKIP_NEXT), 'late-goal', paced())
    assert late.done.wait(WAIT_S)
    after = run(server, spec(30.0, 3), 'after-goal')
    assert after.done.wait(WAIT_S)
    assert late.result.outcome == Outcome.COMPLETED and not late.result.deadline_met
    assert after.result.outcome == Outcome.COMPLETED and after.result.deadline_met


def test_kill_ends_a_goal_within_one_token_of_its_deadline(server):
    budget = 0.5
    killed = run(server, spec(budget, 1000), 'killed', paced())
    assert killed.done.wait(WAIT_S)
    result = killed.result
    assert result.outcome == Outcome.KILLED and not result.deadline_met
    assert result.reason.startswith('killed at the deadline after ')
    assert 0 < result.tokens < 1000 and result.text
    # One token (a 50-ms replica gap, or a step and its 20-ms feedback) and the round trip.
    assert result.e2e_s - budget < 0.15, result.e2e_s


def test_close_stops_a_running_goal_at_its_next_token_with_the_reason(server):
    past, go_on = threading.Event(), threading.Event()
    running = run(server, spec(0.3, 200, OverrunPolicy.SKIP_NEXT), 'running',
                  paced(past, go_on))
    assert past.wait(WAIT_S)
    server.close('the node is shutting down (test)')
    go_on.set()
    assert running.done.wait(WAIT_S)
    result = running.result
    assert result.outcome == Outcome.FAILED and result.tokens < 200
    assert result.reason.startswith('the node is shutting down (test): stopped after ')
    with pytest.raises(Exception, match='not accepting goals: the node is shutting down'):
        server.admit(spec(30.0, 3), 'refused')
    assert server.settled()


def test_a_callers_expected_length_is_what_the_goal_is_planned_on(server):
    goal_spec = GoalSpec('Report the battery level.', budget_s=30.0, mode=int(Mode.AUTO),
                         max_new_tokens=40, expected_tokens=7)
    job = server.admit(goal_spec, 'expected-7')
    server.submit(job)
    assert job.done.wait(WAIT_S)
    # The length each executor chose once (local: LocalLength.known; replica: LengthBasis).
    basis = job.length_basis
    chosen = basis.known if hasattr(basis, 'known') else basis.predicted
    assert chosen == 7, basis
