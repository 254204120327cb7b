# SPDX-License-Identifier: Apache-2.0
"""The soak's short variant: about 2 minutes of mixed traffic against the tiny-model node."""

import json

from benchmarks import soak


def test_two_minutes_of_mixed_traffic_leave_no_goal_unanswered_and_nothing_leaking(tmp_path):
    rc = soak.main(['--minutes', '1.5', '--model', 'tiny-random',
                    '--param', 'calibrate_on_start=false',
                    '--param', 'length_predictor=max-new-tokens',
                    '--param', "auto_precision=''", '--param', "cut_effects=''",
                    '--param', "early_exit_layers=''",
                    '--param', 'max_new_tokens=32', '--rate', '1.0', '--burst', '12',
                    '--burst-every-s', '30', '--budgets', '0.5', '2', '--cancel-every-s', '4',
                    '--probe-every-s', '6', '--sample-s', '2', '--out', str(tmp_path / 'soak')])
    tmp_path = tmp_path / 'soak'
    report = json.loads((tmp_path / 'bench.json').read_text())
    f = report['figures']
    assert rc == 0 and report['node_alive_at_end']
    assert f['unanswered'] == 0 and f['replayed'] > 80 and f['side_goals'] > 20
    assert f['replay_outcomes'].get('REJECTED', 0) > 0  # the bad goals got reasons
    assert any(k.startswith('cancel ') for k in f['side_outcomes'])
    # Hundreds of goals: a thread or a file kept per goal would show here.
    assert f['threads_end'] <= f['threads_start'] + 8
    assert f['open_files_end'] <= f['open_files_start'] + 16
    assert f['probes'] >= 10 and f['tpot_median_ms'] > 0.0
    assert (tmp_path / 'soak.png').stat().st_size > 0
