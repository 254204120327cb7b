# SPDX-License-Identifier: Apache-2.0
"""The node's /diagnostics: a few named statuses, each value in one of them."""

from diagnostic_msgs.msg import DiagnosticArray

from timebill_ros.cli.monitor import MonitorState
from timebill_ros.core.request import Outcome
from timebill_ros.core.telemetry import GoalRecord, Telemetry, Thresholds
from timebill_ros.ros.diagnostics import build_array, build_statuses


def statuses(state='serving'):
    telemetry = Telemetry(window=10)
    for met in (True, False):
        telemetry.finished(GoalRecord(Outcome.COMPLETED if met else Outcome.KILLED, met, 1.0,
                                      [0.05]))
    extra = {'queue_length': 3, 'executing': 1, 'scheduler': 'edf', 'state': state,
             'model': 'tiny-random', 'ete_drift_decode': 1.02,
             'ete_error_ratios_q10_q90_llama.cpp-q4_1': '0.9 1.0 1.0 1.1 1.2'}
    return build_statuses('/robot1/timebill', 'vm/cpu', telemetry.summary(), extra,
                          Thresholds(0.05, 0.25))


def test_each_value_lands_in_its_named_status():
    by_name = {status.name: status for status in statuses()}
    assert list(by_name) == ['/robot1/timebill: deadlines', '/robot1/timebill: queue',
                             '/robot1/timebill: timing model',
                             '/robot1/timebill: engine llama.cpp-q4_1']
    values = {name: {kv.key for kv in status.values} for name, status in by_name.items()}
    assert {'miss_rate', 'accepted', 'window_goals'} <= values['/robot1/timebill: deadlines']
    assert values['/robot1/timebill: queue'] == {'queue_length', 'executing', 'scheduler',
                                                 'state'}
    assert {'model', 'ete_drift_decode'} <= values['/robot1/timebill: timing model']
    assert values['/robot1/timebill: engine llama.cpp-q4_1'] == {'ete_error_ratios_q10_q90'}
    # Half the goals missed: the deadlines status says ERROR; the rest are OK.
    assert by_name['/robot1/timebill: deadlines'].level == bytes([2])
    assert by_name['/robot1/timebill: queue'].level == bytes([0])
    assert '3 waiting, 1 running' in by_name['/robot1/timebill: queue'].message


def test_a_node_that_refuses_goals_warns_in_its_queue_status():
    queue = next(s for s in statuses('inactive') if s.name.endswith(': queue'))
    assert queue.level == bytes([1]) and queue.message.startswith('inactive')


def test_the_monitor_reads_every_status_of_its_node():
    state = MonitorState(node='/robot1/timebill')
    array = build_array(statuses(), DiagnosticArray().header.stamp)
    state.on_diagnostics(array)
    assert state.level == 2 and 'miss rate 50.0%' in state.message
    assert state.values['scheduler'] == 'edf' and state.values['model'] == 'tiny-random'
    assert state.values['ete_error_ratios_q10_q90 (engine llama.cpp-q4_1)'].startswith('0.9')
    # Another node's statuses are not read.
    other = MonitorState(node='/robot2/timebill')
    other.on_diagnostics(array)
    assert other.values == {} and other.level == 3


def test_the_shipped_analyzer_and_perspective_cover_every_section():
    import ast
    import json
    from pathlib import Path
    import yaml
    config = Path(__file__).resolve().parents[2] / 'config'
    analyzers = yaml.safe_load((config / 'diagnostic_aggregator.yaml').read_text())
    timebill = analyzers['analyzers']['ros__parameters']['timebill']
    assert timebill['type'] == 'diagnostic_aggregator/GenericAnalyzer'
    # Every status a node publishes matches the analyzer, in any namespace.
    for status in statuses():
        assert any(fragment in status.name for fragment in timebill['contains'])
    perspective = json.loads((config / 'timebill.perspective').read_text())
    running = ast.literal_eval(
        perspective['groups']['pluginmanager']['keys']['running-plugins']['repr'])
    assert 'rqt_robot_monitor/RobotMonitorPlugin' in running
