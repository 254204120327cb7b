# SPDX-License-Identifier: Apache-2.0
"""measure_precision on the tiny model: the table the planner reads and the report."""

import json

from training import measure_precision
from timebill_ros.core.precision import UnitKL


def test_it_writes_a_unit_kl_table_and_an_additivity_report(tmp_path):
    table, report = tmp_path / 'kl.json', tmp_path / 'report'
    assert measure_precision.main(['--model', 'tiny-random', '--robot', '4', '--long', '2',
                                   '--follow', '1', '--out', str(table),
                                   '--report', str(report)]) == 0
    kl = UnitKL.load(table)
    assert kl.low == 'int8-dynamic' and len(kl.unit_kl) == 3  # 2 layers + the LM head
    assert kl.all_low_kl > 0.0 and all(v >= 0.0 for v in kl.unit_kl)
    bench = json.loads((report / 'bench.json').read_text())
    assert bench['additivity']['mixes'] and bench['times']['switch_ms'] < 5.0
    assert bench['memory_mb']['low'] < bench['memory_mb']['full']
    assert (report / 'pareto.png').stat().st_size > 0
    assert 'Additivity on held-out prompts' in (report / 'README.md').read_text()


def test_it_measures_the_weight_only_format_with_low(tmp_path):
    table = tmp_path / 'kl.json'
    assert measure_precision.main(['--model', 'tiny-random', '--robot', '2', '--long', '0',
                                   '--follow', '1', '--low', 'int8-weight', '--out', str(table),
                                   '--report', str(tmp_path / 'report')]) == 0
    kl = UnitKL.load(table)
    assert kl.low == 'int8-weight' and len(kl.unit_kl) == 3
    # (The tiny model's near-uniform outputs give KLs of about 1e-7 either side of 0.)
    assert abs(kl.all_low_kl) < 1e-3
    assert '# Per-layer int8-weight precision' in (tmp_path / 'report' / 'README.md').read_text()
