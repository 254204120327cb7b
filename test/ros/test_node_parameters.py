# SPDX-License-Identifier: Apache-2.0
"""Live parameters through the SetParameters service, and two namespaced nodes side by side.

Two tiny-model node processes (/robot1 and /robot2): a live change applies to the next
goal or is refused with a reason; each node's diagnostics carry its full name, so the
monitor and rqt tell them apart.
"""

import re
import threading
import time

import pytest

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters
from rclpy.parameter import Parameter

from conftest import client_fixture, NodeProcess
from timebill_msgs.action import Instruct
from timebill_ros.cli.monitor import MonitorState
from timebill_ros.core.request import Outcome
from timebill_ros.tools.client import make_goal

PARAMS = {'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
          'length_predictor': 'max-new-tokens', 'diagnostics_period_s': 0.2,
          'auto_precision': '', 'llama_engines': ''}


@pytest.fixture(scope='module')
def nodes(rclpy_context):
    started = {}
    try:
        for namespace in ('/robot1', '/robot2'):
            started[namespace] = NodeProcess(PARAMS, namespace=namespace)
        yield started
    finally:
        for proc in started.values():
            proc.stop()


@pytest.fixture(scope='module')
def node(nodes):
    return nodes['/robot1']


client = client_fixture('/robot1', 'test_parameters_client')


@pytest.fixture(scope='module')
def graph(nodes):
    """Yield ({service: client of /robot1/timebill}, the DiagnosticArrays seen).

    The clients are made before the helper spins: destroying one while its executor
    waits on it stops the executor.
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    helper = rclpy.create_node('test_parameters_helper')
    seen = []
    helper.create_subscription(DiagnosticArray, '/diagnostics', seen.append, 50)
    clients = {name: helper.create_client(kind, f'/robot1/timebill/{name}') for name, kind in (
        ('set_parameters', SetParameters), ('get_parameters', GetParameters),
        ('describe_parameters', DescribeParameters))}
    executor = SingleThreadedExecutor()
    executor.add_node(helper)
    threading.Thread(target=executor.spin, daemon=True).start()
    yield clients, seen
    executor.shutdown(timeout_sec=2)
    helper.destroy_node()


def call(clients, name, request):
    service = clients[name]
    assert service.wait_for_service(timeout_sec=10), name
    return service.call(request, timeout_sec=10)


def set_parameter(helper, name, value):
    request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
    return call(helper, 'set_parameters', request).results[0]


def get_parameter(helper, name):
    reply = call(helper, 'get_parameters', GetParameters.Request(names=[name]))
    return Parameter.from_parameter_msg(
        type('P', (), {'name': name, 'value': reply.values[0]})()).value


def test_descriptors_carry_ranges_choices_and_read_only(graph):
    helper, _ = graph
    reply = call(helper, 'describe_parameters', DescribeParameters.Request(
        names=['queue_length', 'time_margin', 'scheduler', 'model']))
    queue, margin, scheduler, model = reply.descriptors
    assert (queue.integer_range[0].from_value, queue.integer_range[0].to_value) == (1, 100000)
    assert margin.floating_point_range[0].to_value == 0.5 and not margin.read_only
    assert "'edf'" in scheduler.additional_constraints and not scheduler.read_only
    assert model.read_only and 'Model source' in model.description


def test_a_live_change_applies_to_the_next_goal(graph, client, node, wait_until):
    helper, _ = graph
    goal = make_goal('Say hi.', budget_s=30.0, max_new_tokens=2)
    assert client.ask(goal, 60).result.outcome == Outcome.COMPLETED
    result = set_parameter(helper, 'max_budget_s', 10.0)
    assert result.successful
    wait_until(lambda: any('parameters changed live: max_budget_s=10.0' in line
                           for line in node.lines), 5, 'the change in the log')
    assert get_parameter(helper, 'max_budget_s') == 10.0
    refused = client.ask(goal, 60)
    assert not refused.accepted and '10' in refused.reject_reason
    assert set_parameter(helper, 'max_budget_s', 600.0).successful
    assert client.ask(goal, 60).result.outcome == Outcome.COMPLETED


def test_feedback_pacing_is_live_and_the_text_still_reassembles(graph, client):
    helper, _ = graph
    goal = make_goal('Write a long story about a robot.', budget_s=30.0, max_new_tokens=40)
    try:
        assert set_parameter(helper, 'feedback_period_s', 0.0).successful
        every = client.ask(goal, 60)
        assert [f.token_index for f in every.feedback] == list(range(every.result.tokens))
        # A period near the answer's length: its first token, then the rest in few messages.
        assert set_parameter(helper, 'feedback_period_s', 1.0).successful
        paced = client.ask(goal, 60)
        assert paced.result.tokens == 40, paced.result.reason
        indices = [f.token_index for f in paced.feedback]
        assert indices[0] == 0 and indices[-1] == 39 and indices == sorted(set(indices))
        assert len(indices) < 40
        assert paced.streamed_text == paced.result.text and paced.result.text
        assert paced.feedback[-1].elapsed_s > paced.feedback[0].elapsed_s
    finally:
        assert set_parameter(helper, 'feedback_period_s', 0.02).successful


def test_a_change_that_cannot_apply_is_refused_with_the_reason(graph, client):
    helper, _ = graph
    read_only = set_parameter(helper, 'model', 'embedded')
    assert not read_only.successful and 'model' in read_only.reason
    unknown_choice = set_parameter(helper, 'scheduler', 'lifo')
    assert not unknown_choice.successful and 'not one of' in unknown_choice.reason
    out_of_range = set_parameter(helper, 'queue_length', 0)
    assert not out_of_range.successful and out_of_range.reason
    # Checked as a whole configuration: warn above error is refused, as at start.
    crossed = set_parameter(helper, 'miss_rate_warn', 0.9)
    assert not crossed.successful and 'miss_rate_warn must be <= miss_rate_error' in \
        crossed.reason
    assert get_parameter(helper, 'scheduler') == 'edf'
    assert set_parameter(helper, 'scheduler', 'svf').successful
    goal = make_goal('Say hi.', budget_s=30.0, max_new_tokens=2)
    assert client.ask(goal, 60).result.outcome == Outcome.COMPLETED


def test_each_namespaced_node_reports_under_its_full_name(graph, wait_until, nodes):
    _, seen = graph

    def names():
        return {status.name for array in list(seen) for status in array.status}
    wanted = {'/robot1/timebill: deadlines', '/robot2/timebill: deadlines'}
    wait_until(lambda: wanted <= names(), 15, 'both nodes on /diagnostics')
    monitor = MonitorState(node='/robot2/timebill')
    for array in list(seen):
        monitor.on_diagnostics(array)
    assert monitor.values['scheduler'] == 'edf'  # robot1's was set to svf above

    def robot1_scheduler():
        robot1 = MonitorState(node='/robot1/timebill')
        for array in list(seen)[-4:]:
            robot1.on_diagnostics(array)
        return robot1.values.get('scheduler')
    wait_until(lambda: robot1_scheduler() == 'svf', 5, f'svf on robot1 ({robot1_scheduler()})')


def given(run) -> float:
    """Return the time the node gave a goal, as its first feedback tells."""
    first = run.feedback[0]
    return first.elapsed_s + first.remaining_s


def test_an_absolute_deadline_on_the_node_clock_is_the_budget(client):
    now_ns = time.time_ns()  # the node's ROS clock is the system clock (no use_sim_time)
    ahead = make_goal('Say hi.', budget_s=0.0, max_new_tokens=2, deadline_ns=now_ns + 30 * 10**9)
    run = client.ask(ahead, 60)
    assert run.accepted and run.result.outcome == Outcome.COMPLETED and run.result.deadline_met
    assert 25.0 < given(run) <= 30.0
    # With a budget too, the earlier end counts.
    both = make_goal('Say hi.', budget_s=50.0, max_new_tokens=2, deadline_ns=now_ns + 20 * 10**9)
    assert 15.0 < given(client.ask(both, 60)) <= 20.0
    past = make_goal('Say hi.', budget_s=5.0, max_new_tokens=2, deadline_ns=now_ns - 10**9)
    refused = client.ask(past, 30)
    assert not refused.accepted and 'deadline already passed' in refused.reject_reason
    none = make_goal('Say hi.', budget_s=0.0, max_new_tokens=2)
    refused = client.ask(none, 30)
    assert not refused.accepted and 'budget' in refused.reject_reason


def test_a_goal_with_default_fields_follows_default_policy(graph, client):
    helper, _ = graph
    overrun = make_goal('Overrun please.', 0.05, max_new_tokens=400)  # overrun_policy 0
    assert overrun.overrun_policy == Instruct.Goal.POLICY_NODE_DEFAULT == 0
    try:
        assert set_parameter(helper, 'default_policy', 'skip_next').successful
        late = client.ask(overrun, 60)
        # Skip-Next: it runs on past its deadline to its whole answer.
        assert late.result.outcome == Outcome.COMPLETED and not late.result.deadline_met
        assert late.result.tokens == 400
        assert set_parameter(helper, 'default_policy', 'kill').successful
        killed = client.ask(overrun, 60)
        # Kill: ended at its deadline (or refused as it cannot meet it), never run on.
        assert not killed.accepted or (killed.result.outcome in (
            Outcome.KILLED, Outcome.REJECTED) and killed.result.tokens < 400)
    finally:
        assert set_parameter(helper, 'default_policy', 'kill').successful


def plain_result(goal: Instruct.Goal, action_name: str):
    """Send ``goal`` with a plain rclpy ActionClient; return (accepted, status, result)."""
    import rclpy
    from rclpy.action import ActionClient
    helper = rclpy.create_node('test_plain_action_client')
    try:
        action = ActionClient(helper, Instruct, action_name)
        assert action.wait_for_server(timeout_sec=10)
        sent = action.send_goal_async(goal)
        rclpy.spin_until_future_complete(helper, sent, timeout_sec=30)
        handle = sent.result()
        if not handle.accepted:
            return False, None, None
        done = handle.get_result_async()
        rclpy.spin_until_future_complete(helper, done, timeout_sec=30)
        return True, done.result().status, done.result().result
    finally:
        helper.destroy_node()


@pytest.fixture(scope='module')
def timed_node(rclpy_context, tmp_path_factory, synthetic_profile):
    """Yield a node whose planner knows its times (10 ms prefill, 100 ms a step).

    Started with ``refused_goals: accept_and_end`` and without ``idle_best_effort`` (an
    idle node would try a hopeless Kill goal). Without a profile the nodes above cannot
    tell a goal that misses from one that fits.
    """
    path = tmp_path_factory.mktemp('profile') / 'tiny.yaml'
    synthetic_profile(step_s=0.1).save(path)
    proc = NodeProcess({**PARAMS, 'profile': str(path), 'refused_goals': 'accept_and_end',
                        'idle_best_effort': False}, namespace='/robot3')
    yield proc
    proc.stop()


def test_accept_and_end_gives_a_plain_action_client_the_reason(timed_node):
    action = '/robot3/timebill/instruct'
    # 1000 tokens (max-new-tokens predicts the cap) cannot fit 50 ms: not at the profile's
    # 100 ms a step, nor at the tiny model's ~1 ms once the ETE refits to it.
    hopeless = make_goal('Write a long story about a robot.', 0.05, max_new_tokens=1000,
                         policy=Instruct.Goal.KILL)
    accepted, status, result = plain_result(hopeless, action)
    assert accepted and status == GoalStatus.STATUS_ABORTED
    assert result.outcome == Outcome.REJECTED and not result.deadline_met
    assert 'deadline' in result.reason, result.reason
    # An invalid goal too: its reason reaches the client.
    accepted, status, result = plain_result(make_goal('', 5.0), action)
    assert accepted and result.outcome == Outcome.REJECTED
    assert 'instruction' in result.reason, result.reason
    # A goal that fits is served as ever.
    accepted, status, result = plain_result(make_goal('Say hi.', 5.0, max_new_tokens=2),
                                            action)
    assert accepted and result.outcome == Outcome.COMPLETED and result.deadline_met


def test_reject_answers_the_goal_request_with_no(graph):
    # The shipped refused_goals: reject. The reason goes to ~/responses and the log only.
    accepted, _, _ = plain_result(make_goal('', 5.0), '/robot1/timebill/instruct')
    assert not accepted


def test_the_readme_namespace_example_runs_as_shown(node):
    import shlex
    import subprocess
    import sys
    from conftest import ROOT
    lines = open(f'{ROOT}/README.md', encoding='utf-8').read().splitlines()
    launch = next(line for line in lines if 'ros2 launch timebill_ros' in line)
    namespace = re.search(r'namespace:=(\S+)', launch).group(1)
    ask = shlex.split(next(line for line in lines[lines.index(launch):]
                           if 'timebill_ask' in line))
    args = ask[ask.index('timebill_ask') + 1:]
    # The tool asks the node the launch line starts, by its namespaced name.
    assert args[args.index('--node') + 1] == f'/{namespace}/timebill'
    assert namespace == 'robot1'  # the namespace this module's node runs in
    done = subprocess.run([sys.executable, '-m', 'timebill_ros.cli.ask', *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'COMPLETED deadline_met=True' in done.stdout
