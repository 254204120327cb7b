# SPDX-License-Identifier: Apache-2.0
"""bench_planning_cost times admissions and dispatch plans behind a held model (tiny model)."""

from conftest import Log
from benchmarks.bench_planning_cost import markdown, measure
from timebill_ros.core.config import NodeConfig
from timebill_ros.runtime.model import load_model
from timebill_ros.serving.assembly import Assembly
from timebill_ros.serving.local_executor import local_server


def test_times_each_depth_and_every_queued_goal_still_gets_its_result():
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'scheduler': 'edf'})
    results = []
    server = local_server(Assembly(config, load_model('tiny-random'), Log()),
                          lambda job, result, *_: results.append(result))
    try:
        with server.executor.assembly.model_lock:
            rows = measure(server, ['Stop.', 'Turn left.'], [0, 5], 3)
            queued = server.close('benchmark over')
    finally:
        server.stop(timeout_s=30.0)
    assert sorted(rows) == [0, 5]
    for row in rows.values():
        assert row['admit']['n'] == 3 and row['dispatch_plan']['n'] == 3
        assert 0 < row['admit']['median_ms'] <= row['admit']['p95_ms']
    assert queued == 8 and len(results) == 9  # 9 admitted: each ended with a result
    table = markdown({'date': 'today', 'machine': 'here', 'command': 'c', 'commit': 'x',
                      'rows': rows})
    assert '| 5 |' in table
