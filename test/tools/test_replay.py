# SPDX-License-Identifier: Apache-2.0
"""Replay a small bag against the node (separate process, tiny model); check every output."""

import csv

import pytest

from conftest import NodeProcess
from timebill_ros.core.workload import MODES, POLICIES, WorkloadItem
from timebill_ros.report import COLUMNS
from timebill_ros.tools import bags
from timebill_ros.tools.replay import replay, ReplayError

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
NONE = MODES['none']
# Two answers in time, one killed at its deadline, one rejected (empty instruction).
WORKLOAD = [
    WorkloadItem('ok-1', 'Describe the weather.', 60.0, 0.0, mode=NONE, max_new_tokens=6),
    WorkloadItem('kill', 'Write a very long story.', 0.15, 0.2, mode=NONE,
                 max_new_tokens=4000, policy=POLICIES['kill']),
    WorkloadItem('empty', '   ', 60.0, 0.4, mode=NONE, max_new_tokens=6),
    WorkloadItem('ok-2', 'Say hello.', 60.0, 0.6, mode=NONE, max_new_tokens=4),
]
EXPECTED = {'ok-1': 'COMPLETED', 'kill': 'KILLED', 'empty': 'REJECTED', 'ok-2': 'COMPLETED'}


@pytest.fixture(scope='module')
def node(rclpy_context, tmp_path_factory):
    # As test_node.py; a profile path that does not exist keeps the plan deterministic.
    profile = tmp_path_factory.mktemp('profile') / 'none.yaml'
    proc = NodeProcess({'model': 'tiny-random', 'queue_length': 4,
                        'diagnostics_period_s': 0.2, 'max_budget_s': 120.0,
                        'max_new_tokens_limit': 8000, 'calibrate_on_start': False,
                        'profile': str(profile), 'length_predictor': 'max-new-tokens',
                        'miss_rate_warn': 0.05, 'miss_rate_error': 0.9})
    yield proc
    proc.stop()


@pytest.fixture(scope='module')
def replayed(node, tmp_path_factory):
    root = tmp_path_factory.mktemp('replay')
    bag = bags.write_workload(root / 'workload', WORKLOAD, storage='mcap')
    result = replay(bag, root / 'out', scale=2.0, timeout_s=30.0, discovery_timeout_s=20.0)
    return result


def test_one_response_per_instruction(replayed):
    assert replayed.complete and replayed.missing == []
    assert replayed.duplicates == 0
    assert [row['id'] for row in replayed.rows] == [item.id for item in WORKLOAD]
    assert {row['id']: row['outcome'] for row in replayed.rows} == EXPECTED


def test_csv_rows(replayed):
    with replayed.csv.open(newline='') as stream:
        reader = csv.DictReader(stream)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = {row['id']: row for row in reader}
    assert list(rows) == [item.id for item in WORKLOAD]
    for item in WORKLOAD:
        row = rows[item.id]
        assert row['outcome'] == EXPECTED[item.id]
        assert float(row['budget_s']) == item.budget_s
        assert float(row['arrival_s']) == pytest.approx(item.arrival_s, abs=1e-6)
        # Scale 2: sent at half the offset, never early.
        assert float(row['sent_s']) >= item.arrival_s / 2 - 1e-3
        assert row['eviction_ratio'] and row['predicted_tokens'] != ''
        assert row['worst_case_tokens'] != '' and row['est_wcet_s'] != ''
    assert rows['ok-1']['deadline_met'] == 'true' and int(rows['ok-1']['tokens']) == 6
    assert rows['ok-2']['deadline_met'] == 'true' and int(rows['ok-2']['tokens']) == 4
    assert 0 < float(rows['ok-1']['e2e_s']) < 60.0
    assert rows['kill']['deadline_met'] == 'false' and 'killed' in rows['kill']['reason']
    assert float(rows['kill']['e2e_s']) >= 0.15
    assert rows['empty']['deadline_met'] == 'false' and rows['empty']['reason']
    assert int(rows['empty']['tokens']) == 0


def test_output_bag(replayed):
    node = bags.DEFAULT_NODE
    assert bags.bag_topics(replayed.bag) == {
        f'{node}/instructions': bags.INSTRUCTION, f'{node}/responses': bags.RESPONSE,
        f'{node}/telemetry': bags.TELEMETRY}
    sent = bags.read_workload(replayed.bag)
    assert [m.item.id for m in sent.messages] == [item.id for item in WORKLOAD]
    assert [m.item.instruction for m in sent.messages] == [i.instruction for i in WORKLOAD]
    responses = bags.read_messages(replayed.bag, f'{node}/responses', bags.RESPONSE)
    assert sorted(msg.id for _, msg, _ in responses) == sorted(EXPECTED)
    for _, msg, _ in responses:
        assert msg.outcome == ['COMPLETED', 'KILLED', 'SKIPPED', 'REJECTED'].index(
            EXPECTED[msg.id])
    telemetry = bags.read_messages(replayed.bag, f'{node}/telemetry', bags.TELEMETRY)
    # Admission rejections have no telemetry; every other request has one.
    assert sorted(msg.request_id for _, msg, _ in telemetry) == ['kill', 'ok-1', 'ok-2']
    assert replayed.missing_telemetry == []
    # Each answer is logged after its instruction was sent.
    sent_at = {m.item.id: m.log_time_ns for m in sent.messages}
    assert all(t > sent_at[msg.id] for t, msg, _ in responses)


def test_report_png(replayed):
    import matplotlib.image
    assert replayed.png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(replayed.png)
    assert image.shape[0] >= 400 and image.shape[1] >= 400
    # Not a blank canvas.
    assert image[..., :3].std() > 0.05


def test_missing_node_is_a_clear_error(rclpy_context, tmp_path):
    bag = bags.write_workload(tmp_path / 'w', WORKLOAD[:1])
    with pytest.raises(ReplayError, match='no timebill node found'):
        replay(bag, tmp_path / 'out', node='/nobody_here', discovery_timeout_s=0.5)


def test_missing_duplicate_and_foreign_responses_are_reported(tmp_path):
    """Rows come from what arrived: no response is a MISSING row, never a dropped one."""
    from types import SimpleNamespace as NS

    from timebill_ros.tools.replay import _rows

    workload = bags.read_workload(bags.write_workload(tmp_path / 'w', WORKLOAD[:3]))

    def response(rid, outcome=0):
        plan = NS(eviction_ratio=0.25, predicted_tokens=5, worst_case_tokens=10,
                  est_wcet_s=0.5)
        return NS(id=rid, outcome=outcome, deadline_met=True, e2e_s=0.1, queue_s=0.0,
                  prefill_s=0.01, decode_s=0.09, tokens=5, plan=plan, reason='ok')

    received = [response('ok-1'), response('ok-1'), response('someone-else'), response('kill')]
    session = NS(responses=[(0, r) for r in received],
                 first_by_id=lambda: ({r.id: r for r in received[::-1]},
                                      {'ok-1': NS(request_id='ok-1')}))
    sent = [(0.0, 0), (0.1, 1), (0.2, 2)]
    rows, result = _rows(workload, sent, session, 7.0)
    assert [row['outcome'] for row in rows] == ['COMPLETED', 'COMPLETED', 'MISSING']
    assert rows[2]['reason'] == 'no response within 7 s after the last instruction'
    assert rows[2]['deadline_met'] is False and 'e2e_s' not in rows[2]
    assert rows[0]['eviction_ratio'] == 0.25 and rows[0]['worst_case_tokens'] == 10
    assert result.missing == ['empty'] and not result.complete
    assert result.duplicates == 1 and result.foreign == 1
    assert result.missing_telemetry == ['kill']


def test_cli_replay_and_report(node, tmp_path, capsys):
    from timebill_ros.cli.bag import main
    assert main(['write', str(tmp_path / 'w'), '--pattern', 'burst', '--count', '2',
                 '--burst-size', '2', '--period', '1', '--budget', '30', '--mode', 'none',
                 '--max-new-tokens', '3', '--instruction', 'Hi.']) == 0
    assert main(['replay', str(tmp_path / 'w'), '--scale', '4', '--timeout', '30',
                 '--discovery-timeout', '20']) == 0
    out = capsys.readouterr().out
    result = tmp_path / 'w_replay'
    assert 'deadline met by 2' in out
    assert (result / 'replay_bag' / 'metadata.yaml').is_file()
    assert (result / 'deadline_report.png').read_bytes()[:8] == PNG_SIGNATURE
    assert main(['report', str(result / 'replay.csv')]) == 0
    assert (result / 'replay.png').read_bytes()[:8] == PNG_SIGNATURE
    # The output directory keeps its bag: a second replay into it is refused.
    assert main(['replay', str(tmp_path / 'w'), '--discovery-timeout', '20']) == 2
    assert 'exists already' in capsys.readouterr().err
