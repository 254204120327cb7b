# SPDX-License-Identifier: Apache-2.0
"""bench_sched's workload builder and figures (the node runs are the benchmark itself)."""

import pytest

from benchmarks.bench_sched import summarise, workload
from timebill_ros.evaluation import robot_workload


def test_workload_has_the_load_and_budgets_it_says():
    items = robot_workload.load('test')[:10]
    full = {item.id: 2.0 for item in items}
    work = workload(items, full, (1.5, 3.0), 'periodic', 0.5, seed=1)
    assert len(work) == 10 and work[0].arrival_s == 0.0
    # load 0.5 with 2 s goals: one goal every 4 s.
    assert work[1].arrival_s == pytest.approx(4.0)
    assert [w.budget_s for w in work[:2]] == [3.0, 6.0]
    burst = workload(items, full, (1.5,), 'burst', 1.0, seed=1)
    assert [w.arrival_s for w in burst[:5]] == [0.0, 0.0, 0.0, 0.0, pytest.approx(8.0)]
    assert len({w.id for w in burst}) == 10
    # More goals than items: drawn again from the same items, each goal its own id.
    more = workload(items, full, (1.5,), 'poisson', 1.0, seed=1, goals=25)
    assert len(more) == 25 and len({w.id for w in more}) == 25
    assert {w.instruction for w in more} <= {item.instruction for item in items}


def test_summary_counts_lost_and_rejected_goals():
    rows = [{'outcome': 'COMPLETED', 'deadline_met': True, 'queue_s': 0.5, 'tokens': 10},
            {'outcome': 'KILLED', 'deadline_met': False, 'queue_s': 1.5, 'tokens': 4},
            {'outcome': 'REJECTED', 'deadline_met': False, 'queue_s': 0.0, 'tokens': 0},
            {'outcome': 'MISSING', 'deadline_met': False}]
    s = summarise(rows, 10.0)
    assert (s['met'], s['rejected'], s['killed'], s['lost']) == (1, 1, 1, 1)
    assert s['goodput_per_s'] == pytest.approx(0.1) and s['tokens_per_s'] == pytest.approx(1.4)
    assert s['queue_p50_s'] == pytest.approx(1.0)


def test_false_rejections_are_goals_refused_that_admit_all_met_in_the_same_workload():
    from benchmarks.bench_sched import ADMIT_ALL, false_rejections, markdown

    def run(strategy, load, rows):
        return {'strategy': strategy, 'scheduler': 'edf', 'pattern': 'burst', 'load': load,
                'rows': rows, 'summary': summarise(rows, 10.0)}
    rows_edf = [{'id': 'a', 'outcome': 'REJECTED', 'queue_s': 0.0},
                {'id': 'b', 'outcome': 'REJECTED', 'queue_s': 0.0},
                {'id': 'c', 'outcome': 'COMPLETED', 'deadline_met': True, 'queue_s': 0.1}]
    rows_all = [{'id': 'a', 'outcome': 'COMPLETED', 'deadline_met': True, 'queue_s': 0.1},
                {'id': 'b', 'outcome': 'KILLED', 'deadline_met': False, 'queue_s': 0.1},
                {'id': 'c', 'outcome': 'COMPLETED', 'deadline_met': True, 'queue_s': 0.1}]
    runs = [run('edf', 1.5, rows_edf), run(ADMIT_ALL, 1.5, rows_all),
            {**run('fifo', 0.8, rows_edf), 'strategy': None}]  # an old run: scheduler only
    false_rejections(runs)
    assert runs[0]['summary']['false_rejected'] == 1  # 'a' was met without admission
    assert runs[1]['summary']['false_rejected'] == 0
    assert runs[2]['summary']['false_rejected'] is None  # no admit-all run at load 0.8
    report = {'date': 'd', 'command': 'c', 'machine': 'm', 'items': 3, 'factors': [1.5],
              'minutes': 1.0, 'runs': runs}
    text = markdown(report)
    assert '| edf | ' in text and f'| {ADMIT_ALL} | ' in text
    assert '| burst | 1.5 | edf | 33% (1/3) |' in text
