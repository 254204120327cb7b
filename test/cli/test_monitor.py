# SPDX-License-Identifier: Apache-2.0
"""timebill_monitor renders the node's diagnostics and the last goals (messages built by the
node's own builders, no terminal)."""

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rich.console import Console

from timebill_msgs.msg import DeadlineTelemetry, InferencePlan
from timebill_ros.cli.monitor import MonitorState
from timebill_ros.core.telemetry import GoalRecord, Telemetry, Thresholds
from timebill_ros.core.request import Outcome
from timebill_ros.ros.diagnostics import build_array, build_status


def text_of(state) -> str:
    console = Console(record=True, width=140, color_system=None)
    console.print(state.render())
    return console.export_text()


def test_it_shows_the_status_the_miss_rate_and_the_last_goals():
    state = MonitorState(keep=3)
    assert 'no /diagnostics from a timebill node yet' in text_of(state)
    telemetry = Telemetry(window=10)
    for met in (True, True, False, True):
        telemetry.finished(GoalRecord(Outcome.COMPLETED if met else Outcome.KILLED, met, 1.0,
                                      [0.05, 0.06]))
    status = build_status('/timebill: deadlines', 'vm/cpu', telemetry.summary(),
                          {'queue_length': 2, 'scheduler': 'edf',
                           'last_precision': 'int8-dynamic: layers 3-7'},
                          Thresholds(0.05, 0.25))
    other = DiagnosticStatus(name='lidar: driver', message='fine')
    namesake = DiagnosticStatus(name='/robot2/timebill: deadlines', message='other robot')
    array = build_array(status, DiagnosticArray().header.stamp)
    # Another node's status on the same topic is ignored, a namespaced namesake's too.
    array.status[0:0] = [other, namesake]
    state.on_diagnostics(array)
    for i, (outcome, met, slack) in enumerate([(0, True, 0.4), (1, False, -0.01),
                                               (0, True, 1.2), (4, False, 0.0)]):
        state.on_telemetry(DeadlineTelemetry(
            goal_id=f'goal{i}' + 'f' * 27, outcome=outcome, deadline_met=met, budget_s=2.0,
            e2e_s=2.0 - slack, slack_s=slack, tokens=10 + i, tpot_p50_s=0.061,
            plan=InferencePlan(precision='mixed' if i == 2 else '',
                               precision_mix='int8-dynamic: layers 3' if i == 2 else '')))
    text = text_of(state)
    assert 'ERROR' in text and 'deadline miss rate 25.0% over the last 4 goals' in text
    assert 'timebill monitor vm/cpu' in text and 'edf' in text and 'other robot' not in text
    assert 'last goals (4 seen)' in text
    # Newest first, only the last 3 kept.
    assert text.index('CANCELED') < text.index('int8-dynamic: layers 3 ') < \
        text.index('KILLED')
    assert 'goal3fff' in text and 'goal0fff' not in text  # the oldest dropped out
    assert '-0.01' in text and '61.0' in text
