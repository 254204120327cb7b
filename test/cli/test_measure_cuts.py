"""measure_cuts on the tiny model: it answers under each cut and writes a loadable table."""

import json

import pytest

pytest.importorskip('torch')
pytest.importorskip('kvpress')

from timebill_ros.cli import measure_cuts  # noqa: E402
from timebill_ros.core.cuts import CutEffects  # noqa: E402


def test_measure_cuts_writes_the_table_and_the_report(tmp_path):
    out, report = tmp_path / 'effects.json', tmp_path / 'report'
    assert measure_cuts.main(['--model', 'tiny-random', '--limit', '2',
                              '--max-new-tokens', '4', '--alphas', '0.5',
                              '--press', 'knorm', '--min-evict-prompt', '8',
                              '--out', str(out), '--report', str(report)]) == 0
    effects = CutEffects.load(out)
    assert effects.eviction_ratios == (0.5,) and 'tiny' in effects.source.lower()
    int8 = effects.of_precision('int8-dynamic')
    assert int8.length_factor > 0 and 0.0 <= int8.quality <= 1.0
    rows = json.loads(report.with_suffix('.json').read_text())['rows']
    assert len(rows) == 2 and all('int8-dynamic' in row for row in rows)
    assert '| int8-dynamic | 2 |' in report.with_suffix('.md').read_text()
    assert effects.of_precision('int8-weight').length_factor > 0  # both formats by default
    # --merge: a run of one precision and no ratio keeps what it did not measure.
    before = effects.of_precision('int8-dynamic')
    assert measure_cuts.main(['--model', 'tiny-random', '--limit', '1',
                              '--max-new-tokens', '4', '--alphas', '--precisions',
                              'int8-weight', '--merge', '--out', str(out),
                              '--report', str(tmp_path / 'again')]) == 0
    merged = CutEffects.load(out)
    assert merged.eviction_ratios == (0.5,) and merged.of_precision('int8-dynamic') == before
    assert set(merged.precision) == {'int8-dynamic', 'int8-weight'}
    assert 'int8-weight' in merged.source.split(';')[-1]
