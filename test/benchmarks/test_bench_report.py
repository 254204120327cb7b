# SPDX-License-Identifier: Apache-2.0
"""The benchmark's pure parts: budget placement, policy sweeps, report and plots."""

import pytest

from benchmarks.bench_timebill import (
    budgets_from, kill_rows, markdown, Measured, real_rows, skip_rows)
from benchmarks import plots
from benchmarks.policies import Run


def measured(e2e, strategy='Vanilla', outcome='COMPLETED', met=True, score=0.5, budget=300.0):
    return Measured('item', strategy, budget, True, outcome, met, e2e, 10, score)


def test_budgets_span_the_measured_runs():
    budgets = budgets_from([measured(4.0), measured(10.0), measured(50.0, outcome='KILLED')], 4)
    assert budgets[0] == pytest.approx(2.8) and budgets[-1] == pytest.approx(11.0)
    assert budgets == sorted(budgets) and len(budgets) == 4
    with pytest.raises(RuntimeError):
        budgets_from([measured(1.0, outcome='FAILED')], 3)


def test_sweeps_replay_and_summarise_real_runs():
    runs = {'a': Run(3.0, 1.0), 'b': Run(6.0, 0.5)}
    rows = kill_rows(runs, [4.0, 7.0])
    assert [r['completion_rate'] for r in rows] == [0.5, 1.0]
    assert [r['avg_score'] for r in rows] == [0.5, 0.75]
    skip = skip_rows({4.0: [runs['b'], runs['a'], runs['a']]}, [4.0])
    assert skip[0]['completion_rate'] == pytest.approx(1 / 3)  # late, skipped, in time
    real = real_rows([measured(3.0, 'TimeBill', budget=4.0, score=0.8),
                      measured(4.0, 'TimeBill', 'KILLED', False, 0.9, budget=4.0)], [4.0])
    assert real[0]['completion_rate'] == 0.5 and real[0]['avg_score'] == pytest.approx(0.4)


def test_report_renders_markdown_and_pngs(tmp_path):
    row = {'budget_s': 4.0, 'jobs': 2, 'completion_rate': 0.5, 'avg_score': 0.25}
    pooled = {**row, 'mean_predicted': 12.0, 'mean_alpha': 0.3}
    report = {
        'date': '2026-11-29', 'machine': 'test', 'machine_short': 'x86_64 2 cpus',
        'command': 'x', 'wall_min': 1.0, 'workload': 'w', 'budgets': [4.0],
        'budget_rule': 'r', 'sweep': {'Kill': {'Vanilla': [row], 'TimeBill': [row]}},
        'sources': {'Kill': {'Vanilla': 'replayed', 'TimeBill': 'real'}},
        'measured_summary': {'Vanilla': {'e2e_s': 5.0, 'tokens': 9.0, 'score': 0.5}},
        'validation': {'budget_s': 4.0, 'strategies': ['Vanilla'], 'runs': 2, 'agree': 2,
                       'agreement': 1.0, 'e2e_abs_error_pct': 3.0},
        'ete': {'runs': 2, 'median_abs_error_pct': 4.0, 'max_abs_error_pct': 6.0},
        'k_budget_s': 4.0, 'k_ablation': [{'k': 1.0, **pooled}, {'k': 2.0, **pooled}],
        'predictor_ablation': {'oracle': pooled}}
    text = markdown(report)
    assert '| TimeBill | real | 50% / 0.250 |' in text and 'agreement with the replay 100%' in text
    for path in (plots.sweep(report, 'completion_rate', 'completion rate', tmp_path / 'c.png'),
                 plots.scatter([(1.0, 1.1, 'a'), (2.0, 1.8, 'a')], tmp_path / 's.png', 't'),
                 plots.ablation(report['k_ablation'], 'k', 'k', tmp_path / 'k.png', 't')):
        data = path.read_bytes()
        assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 5000
