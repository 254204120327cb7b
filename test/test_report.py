# SPDX-License-Identifier: Apache-2.0
"""Deadline report: CSV round trip, categories, PNG rendered from a known CSV."""

import math

import matplotlib.image
import pytest

from timebill_ros import report

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
HEADER = ','.join(report.COLUMNS)
# One request per outcome category, including one that never got a response.
KNOWN_CSV = HEADER + '''
r0,0.0,0.001,2.0,0,0,COMPLETED,true,1.2,0.0,0.1,1.1,40,0.0,40,60,1.5,completed in time
r1,0.5,0.501,1.0,0,0,COMPLETED,false,1.4,0.1,0.1,1.2,48,0.5,30,45,0.9,completed late
r2,1.0,1.001,0.5,0,2,KILLED,false,0.52,0.0,0.1,0.42,12,0.9,50,75,0.48,killed at the deadline
r3,1.5,1.501,3.0,1,0,SKIPPED,false,0.3,0.3,0.0,0.0,0,0.0,0,0,0.0,"skipped (Skip-Next, r1 overran)"
r4,2.0,2.001,0.0,0,0,REJECTED,false,0.0,0.0,0.0,0.0,0,0.0,0,0,0.0,budget must be > 0
r5,2.5,2.501,1.0,0,0,MISSING,false,,,,,,,,,,no response within 5 s
'''


@pytest.fixture
def known_csv(tmp_path):
    path = tmp_path / 'known.csv'
    path.write_text(KNOWN_CSV)
    return path


def check_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] >= 400 and image.shape[1] >= 400
    assert image[..., :3].std() > 0.05
    return image


def test_render_known_csv(known_csv, tmp_path):
    png = report.render(known_csv, tmp_path / 'out.png', title='known')
    assert png == tmp_path / 'out.png'
    check_png(png)


def test_render_defaults_next_to_csv(known_csv):
    assert report.render(known_csv) == known_csv.with_suffix('.png')
    check_png(known_csv.with_suffix('.png'))


def test_read_csv_types_and_categories(known_csv):
    rows = report.read_csv(known_csv)
    assert [report.category(r) for r in rows] == [
        'met', 'late', 'KILLED', 'SKIPPED', 'REJECTED', report.MISSING]
    assert rows[2]['eviction_ratio'] == 0.9 and rows[2]['predicted_tokens'] == 50
    assert rows[5]['tokens'] is None and math.isnan(rows[5]['e2e_s'])
    assert rows[0]['deadline_met'] is True and rows[1]['deadline_met'] is False
    assert report.summary(rows).startswith('6 requests, deadline met by 1:')


def test_write_read_round_trip(tmp_path):
    rows = [{'id': 'a', 'budget_s': 1.5, 'outcome': 'COMPLETED', 'deadline_met': True,
             'e2e_s': 0.25, 'tokens': 3, 'eviction_ratio': 0.0, 'predicted_tokens': 3,
             'worst_case_tokens': 6, 'reason': 'text, with "quotes"\nand a newline'},
            {'id': 'b', 'budget_s': 1.0, 'outcome': report.MISSING, 'deadline_met': False}]
    path = report.write_csv(tmp_path / 'r.csv', rows)
    back = report.read_csv(path)
    assert back[0]['reason'] == rows[0]['reason'] and back[0]['e2e_s'] == 0.25
    assert back[1]['tokens'] is None and back[1]['outcome'] == report.MISSING
    check_png(report.render(path))


def test_empty_report_renders(tmp_path):
    path = tmp_path / 'empty.csv'
    path.write_text(HEADER + '\n')
    check_png(report.render(path))


@pytest.mark.parametrize('text, match', [
    ('a,b\n1,2\n', 'not a replay report CSV'),
    (HEADER + '\nr0,x,0,1.0,0,0,COMPLETED,true,1.0,0,0,0,1,0,0,0,0,ok\n', 'line 2'),
    (HEADER + '\nr0,0,0,1.0,0,0,COMPLETED,maybe,1.0,0,0,0,1,0,0,0,0,ok\n', 'deadline_met'),
])
def test_bad_csv_is_a_report_error(tmp_path, text, match):
    path = tmp_path / 'bad.csv'
    path.write_text(text)
    with pytest.raises(report.ReportError, match=match):
        report.render(path)


def test_missing_csv_is_a_report_error(tmp_path):
    with pytest.raises(report.ReportError, match='cannot read'):
        report.render(tmp_path / 'nope.csv')
