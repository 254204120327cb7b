# SPDX-License-Identifier: Apache-2.0
"""explain_cell groups a tier cell's goals by the option AUTO ran, with every choice's met."""

import json

import pytest

from benchmarks import explain_cell
from test_evaluate_planning import report


def test_a_cell_lists_each_goal_with_autos_option_its_fit_and_every_strategys_met():
    strategies, goals = explain_cell.cell_goals([report(), report()], 'traced', '0.3x')
    assert strategies == ['float32', 'int8-weight', 'llama.cpp-q4_1 + Kill', 'AUTO']
    assert len(goals) == 4  # two items in each run
    for goal in goals:
        assert goal['option'] == 'llama.cpp-q4_1'  # only it fits 0.3x of float32's time
        assert 0.0 < goal['fit'] <= 1.0
        assert goal['met']['float32'] == pytest.approx(0.0)
        assert goal['met']['AUTO'] == pytest.approx(goal['met']['llama.cpp-q4_1 + Kill'])
    groups = explain_cell.by_option(strategies, goals)
    assert list(groups) == ['llama.cpp-q4_1'] and groups['llama.cpp-q4_1']['goals'] == 4
    assert groups['llama.cpp-q4_1']['met']['AUTO'] == pytest.approx(
        sum(goal['met']['AUTO'] for goal in goals))


def test_a_loose_tier_groups_the_goals_under_float32(tmp_path):
    folder = tmp_path / 'run'
    folder.mkdir()
    (folder / 'bench.json').write_text(json.dumps(report()))
    out = tmp_path / 'out'
    assert explain_cell.main([str(folder), '--tier', '20s', '--out', str(out)]) == 0
    cell = json.loads((out / 'cell.json').read_text())
    assert list(cell['groups']) == ['float32'] and cell['groups']['float32']['goals'] == 2
    assert cell['groups']['float32']['met']['float32'] == pytest.approx(2.0)
    assert '| float32 | 2 |' in (out / 'CELL.md').read_text()
    with pytest.raises(SystemExit, match='no tier'):
        explain_cell.main([str(folder), '--tier', '9x', '--out', str(tmp_path / 'other')])


def test_hindsight_counts_each_goal_on_its_best_strategy():
    goals = [{'met': {'a': 1.0, 'b': 0.0, 'AUTO': 0.0}},
             {'met': {'a': 0.0, 'b': 0.5, 'AUTO': 1.0}},
             {'met': {'a': 1.0, 'b': 1.0, 'AUTO': 0.0}}]
    assert explain_cell.hindsight(goals) == pytest.approx(3.0)
    assert explain_cell.hindsight(goals, 'a') == pytest.approx(2.0)
    text = explain_cell.bounds_markdown(['a', 'b', 'AUTO'], goals)
    assert 'in hindsight: 3.0 met; without a (the most-met fixed choice, 2.0): 2.0.' in text
