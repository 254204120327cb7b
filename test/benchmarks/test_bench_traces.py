# SPDX-License-Identifier: Apache-2.0
"""bench_traces' traces, summaries and goodput (pure parts; the runs need the node)."""

from benchmarks.bench_traces import cell, goodput, make_trace, markdown, PEER, SHORT_TOKENS
from timebill_ros.evaluation.robot_workload import load


def test_a_poisson_trace_scales_with_load_and_budgets_cycle_the_factors():
    items = load('test')[:6]
    alone = [0.5] * len(items)
    light = make_trace('poisson', 0.5, 60.0, items, alone, [1.5, 3.0], 0, 1, 32)
    heavy = make_trace('poisson', 4.0, 60.0, items, alone, [1.5, 3.0], 0, 1, 32)
    assert 30 < len(light) < 90 and 380 < len(heavy) < 580  # 1 and 8 a second
    assert [goal[2] for goal in heavy[:4]] == [0.75, 1.5, 0.75, 1.5]
    assert all(0 <= goal[0] < 60 for goal in heavy) and heavy == sorted(heavy)


def test_the_robot_trace_has_periodic_short_goals_and_sporadic_long_ones():
    items = load('test')
    alone = [1.0] * len(items)
    goals = make_trace('robot', 1.0, 20.0, items, alone, [1.0], 3, 2, 48)
    periodic = [goal for goal in goals if goal[3] == SHORT_TOKENS]
    sporadic = [goal for goal in goals if goal[3] == 48]
    assert len(periodic) == 60 and {goal[2] for goal in periodic} <= {0.5, 0.75, 1.0}
    assert sporadic and all(items[goal[1]].context or items[goal[1]].kind == 'json'
                            for goal in sporadic)


def test_cells_count_misses_and_goodput_is_the_highest_load_at_90_percent():
    items = load('test')[:2]
    rows = [{'item': 0, 'met': True, 'text': items[0].reference, 'late_s': None,
             'outcome': 'COMPLETED'},
            {'item': 1, 'met': False, 'text': '', 'late_s': 0.02, 'outcome': 'KILLED'}]
    summary = cell(rows, items)
    assert summary['met'] == 1 and summary['correct'] == 1 and summary['f1'] == 1.0
    assert summary['worst_kill_late_s'] == 0.02 and summary['met_share'] == 0.5
    full = dict(summary, met_share=1.0)
    report = {'cells': {'poisson': {0.5: {PEER: full}, 1.0: {PEER: full},
                                    2.0: {PEER: summary}}},
              'date': 'd', 'machine': 'm', 'command': 'c', 'commit': 'x', 'items': 2,
              'seconds': 1.0, 'max_new_tokens': 8, 'capacity_per_s': 1.0, 'mean_alone_s': 1.0}
    assert goodput(report, 'poisson', PEER) == 1.0
    assert f'{PEER} 1x' in markdown(report)
