# SPDX-License-Identifier: Apache-2.0
"""bench_precision's fidelity and tables (the node runs are the benchmark itself)."""

import math

from benchmarks.bench_precision import (
    fidelity, fresh_rounds, markdown, plan_kinds, STRATEGIES)


def test_fidelity_scores_only_in_time_answers_against_the_full_answer():
    refs = {'a': 'stop now', 'b': 'go', 'c': ''}
    runs = [{'item': 'a', 'met': True, 'text': 'stop now'},
            {'item': 'b', 'met': False, 'text': 'go'},
            {'item': 'c', 'met': True, 'text': ''}]
    assert fidelity(runs, refs) == 1.0
    assert math.isnan(fidelity(runs[1:2], refs))
    assert fidelity([{'item': 'a', 'met': True, 'text': 'go on'}], refs) == 0.0


def test_markdown_has_a_row_per_strategy_and_the_mix_counts():
    cell = {'met_rate': 0.5, 'false_rejections': 1, 'failed': 0, 'quality': 0.4,
            'fidelity': 0.8}
    report = {'date': 'd', 'command': 'c', 'machine': 'm', 'items': 2, 'minutes': 1.0,
              'reused': 'r', 'tiers': ['1x'], 'steal': {'1x': 0.123},
              'table': {'1x': {name: dict(cell) for name in STRATEGIES}},
              'mixed_modes': {'TimeBill with per-layer int8-weight': {
                  '1x': {'full': 1, 'mixed': 1, 'mean_lowered': 7.0, 'int8': 0,
                         'switched': 0}}}}
    text = markdown(report)
    for name in STRATEGIES:
        assert f'| {name} | 50% / 1 / 0 |' in text
    assert '0.40 / 0.80' in text and '| 1x | 1 | 1 | 7.0 | 0 | 0 |' in text
    assert '## What TimeBill with per-layer int8-weight ran' in text
    assert 'while each tier ran: 1x 12%.' in text
    assert 'CPU steal' not in markdown({**report, 'steal': {'1x': None}})


def test_plan_kinds_counts_what_the_goals_that_ran_were_planned_at():
    runs = [{'outcome': 'COMPLETED', 'precision': ''},
            {'outcome': 'COMPLETED', 'precision': '', 'switched': True},
            {'outcome': 'KILLED', 'precision': 'mixed', 'lowered': 4},
            {'outcome': 'COMPLETED', 'precision': 'int8-weight'},
            {'outcome': 'REJECTED', 'precision': ''}]
    assert plan_kinds(runs) == {'full': 1, 'mixed': 1, 'mean_lowered': 4, 'int8': 1,
                                'switched': 1}


def test_fresh_rounds_set_each_budget_from_the_reference_just_before():
    # The machine slows down as the run goes on: each goal takes longer than the last.
    calls = []

    def run(name, item, budget):
        calls.append((name, item, budget))
        return {'item': item, 'e2e_s': float(len(calls))}
    runs = {'reference': {}, 'full precision': {}, 'all-int8': {}}
    tiers_done = []
    fresh_rounds(runs, ['0.5x', '1x'], ['a', 'b'], ['full precision', 'all-int8'], run, 60.0,
                 tiers_done.append)
    assert tiers_done == ['0.5x', '1x']
    assert [c[0] for c in calls[:6]] == ['reference', 'full precision', 'all-int8',
                                         'reference', 'all-int8', 'full precision']
    references = [i for i, c in enumerate(calls) if c[0] == 'reference']
    assert all(calls[i][2] == 60.0 for i in references)
    for i in references:  # the strategies after a reference get its tier of its time
        tier = 0.5 if i < 6 else 1.0
        assert [c[2] for c in calls[i + 1:i + 3]] == [tier * (i + 1)] * 2
    assert [r['e2e_s'] for r in runs['reference']['1x']] == [7.0, 10.0]
    assert len(runs['all-int8']['0.5x']) == 2 and len(runs['full precision']['1x']) == 2
