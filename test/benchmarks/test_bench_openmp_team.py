# SPDX-License-Identifier: Apache-2.0
"""bench_openmp_team: both parts measured (tiny model, a real node) and written."""

import json

from benchmarks import bench_openmp_team


def test_times_steps_in_process_and_through_a_node_before_and_after_auto(tmp_path):
    out = tmp_path / 'team'
    assert bench_openmp_team.main([
        '--model', 'tiny-random', '--rounds', '1', '--steps', '2', '--tokens', '4',
        '--precisions', '', '--param', 'model=tiny-random', '--param', "llama_engines=''",
        '--param', 'length_predictor=max-new-tokens', '--param',
        f"profile={tmp_path / 'tiny.yaml'}", '--out', str(out)]) == 0
    report = json.loads((out / 'bench.json').read_text())
    assert len(report['inproc']) == 3
    assert all(cell['median'] > 0 for cell in report['inproc'].values())
    node = report['node']
    assert [row['phase'] for row in node['rows']] == ['before', 'after']
    assert node['summary']['node dtype']['before'] > 0
    assert node['auto_goal']['tokens'] >= 1
    assert node['node_threads']['after_auto'] > 0
    assert 'after / before' in (out / 'README.md').read_text()
