# SPDX-License-Identifier: Apache-2.0
"""The long-context benchmark's scoring, tables and verdict (plain records, no node)."""

import pytest

from benchmarks.bench_longcontext import AUTO, markdown, score_both, table, verdict
from timebill_ros.evaluation.tasks import TaskItem


def rec(item, strategy, budget, e2e, met=True, score=1.0, fidelity=1.0, **extra):
    return {'item': item, 'task': 'needle', 'strategy': strategy, 'budget_s': budget,
            'outcome': 'COMPLETED' if met else 'KILLED', 'met': met, 'e2e_s': e2e,
            'tokens': 3, 'score': score, 'fidelity': fidelity, 'alpha': 0.0,
            'precision': '', **extra}


def test_fidelity_is_rouge_against_the_full_cache_answer():
    item = TaskItem('needle', 'n1', 'Which bay?', 'log', ['C-27'], 16)
    assert score_both(item, 'Bay C-27', None) == (1.0, 1.0)
    task, fidelity = score_both(item, 'Bay D-11', 'Bay C-27')
    assert task == 0.0 and fidelity == pytest.approx(1 / 3)  # rouge tokens: bay c 27
    assert score_both(item, '', '') == (0.0, 1.0)


def test_table_replays_fixed_strategies_and_counts_auto_real_runs():
    loose = {'Vanilla': [rec('a', 'Vanilla', 300, 4.0), rec('b', 'Vanilla', 300, 8.0)],
             'alpha 0.5': [rec('a', 'alpha 0.5', 300, 3.0, score=0.0, fidelity=0.4),
                           rec('b', 'alpha 0.5', 300, 6.0, score=1.0, fidelity=0.6)]}
    auto = [rec('a', AUTO, 5.0, 4.0), rec('b', AUTO, 5.0, 5.0, met=False),
            rec('a', AUTO, 9.0, 4.0), rec('b', AUTO, 9.0, 8.0)]
    out = table(loose, auto, [5.0, 9.0], ['a', 'b'])
    kill = out['Kill']
    assert kill['Vanilla'][0]['completion_rate'] == 0.5  # b (8 s) misses 5 s
    assert kill['alpha 0.5'][0]['avg_fidelity'] == pytest.approx(0.2)  # a in time: 0.4 / 2
    assert kill[AUTO][0]['completion_rate'] == 0.5 and kill[AUTO][1]['avg_score'] == 1.0
    report = {'table': out, 'budgets': [5.0, 9.0]}
    checks = verdict(report)
    # At 5 s alpha 0.5 completes a (score 0) and misses b; AUTO completes a (score 1).
    assert checks[0]['best_fixed'] == 'alpha 0.5' and checks[0]['met']
    report.update(date='d', machine='m', command='c', minutes=1.0, workload='w',
                  verdict=checks, auto_choices=[], per_task={}, tasks=[], failed=0,
                  late_claimed=0)
    page = markdown(report)
    assert '| TimeBill AUTO | 50% / 0.50 / 0.50 | 100% / 1.00 / 1.00 |' in page
