# SPDX-License-Identifier: Apache-2.0
"""measure_cuts on the tiny model: it answers under each cut and writes a loadable table."""

import json

import numpy as np
import pytest

pytest.importorskip('torch')
pytest.importorskip('kvpress')

from training import measure_cuts  # noqa: E402
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


def test_rows_of_an_earlier_run_rebuild_the_table_with_each_cuts_length_spread(tmp_path):
    out, report = tmp_path / 'effects.json', tmp_path / 'report'
    rows = [{'id': f'i{n}', 'kind': 'k', 'prompt_tokens': 9,
             'full': {'tokens': full, 'score': None},
             'int8-weight': {'tokens': cut, 'fidelity': 0.5, 'score': None}}
            for n, (full, cut) in enumerate([(10, 5), (10, 10), (10, 20), (40, 40)])]
    earlier = tmp_path / 'earlier.json'
    earlier.write_text(json.dumps({'rows': rows, 'source': 'measure_cuts on 4 robot train '
                                   'items, model tiny-random, press knorm, 2026-12-06'}))
    assert measure_cuts.main(['--model', 'tiny-random', '--rows', str(earlier),
                              '--out', str(out), '--report', str(report)]) == 0
    effect = CutEffects.load(out).of_precision('int8-weight')
    assert effect.length_factor == pytest.approx(75 / 70)
    # Per answer the cut halves, keeps or doubles the length: the spread says so.
    levels = (np.arange(10) + 0.5) / 10
    assert effect.length_ratios == pytest.approx(tuple(np.quantile([0.5, 1, 2, 1], levels)))
    assert effect.length_ratios[0] < 0.6 and effect.length_ratios[-1] > 1.8
    assert effect.quality == pytest.approx(0.5)
    assert '| int8-weight | 4 | 1.07 | 0.65 / 1.00 / 1.70 |' in \
        report.with_suffix('.md').read_text()
