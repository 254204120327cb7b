# SPDX-License-Identifier: Apache-2.0
"""bench_encoder_gil: every cell measured and written to a new folder."""

import json

from benchmarks import bench_encoder_gil


def test_times_eager_and_traced_beside_each_busy_count(tmp_path):
    out = tmp_path / 'gil'
    assert bench_encoder_gil.main(['--texts', '2', '--busy', '0,1', '--repeats', '1',
                                   '--out', str(out)]) == 0
    report = json.loads((out / 'bench.json').read_text())
    assert [row['busy_threads'] for row in report['rows']] == [0, 1]
    for row in report['rows']:
        assert row['eager']['median_ms'] > 0 and row['traced']['median_ms'] > 0
    assert '| 1 |' in (out / 'README.md').read_text()
