# SPDX-License-Identifier: Apache-2.0
"""bench_threads on the tiny model: every cell measured and written."""

import json

import pytest

pytest.importorskip('torch')

from benchmarks import bench_threads  # noqa: E402


def test_bench_threads_measures_both_precisions_on_both_threads(tmp_path):
    out = tmp_path / 'threads'
    assert bench_threads.main(['--model', 'tiny-random', '--steps', '6', '--lengths', '16',
                               '--out', str(out)]) == 0
    rows = json.loads(out.with_suffix('.json').read_text())['rows']
    assert [r['precision'] for r in rows] == ['float32', 'int8-dynamic']
    for row in rows:
        values = [v for k, v in row.items() if k != 'precision']
        assert len(values) == 6 and all(v > 0 for v in values)
    assert '| worker, 1 thread(s) (ms) |' in out.with_suffix('.md').read_text()
