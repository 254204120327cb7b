"""bench_precision's fidelity and tables (the node runs are the benchmark itself)."""

import math

from timebill_ros.cli.bench_precision import fidelity, markdown, plan_kinds, STRATEGIES


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
              'reused': 'r', 'tiers': ['1x'],
              'table': {'1x': {name: dict(cell) for name in STRATEGIES}},
              'mixed_modes': {'TimeBill with per-layer int8-weight': {
                  '1x': {'full': 1, 'mixed': 1, 'mean_lowered': 7.0, 'int8': 0,
                         'switched': 0}}}}
    text = markdown(report)
    for name in STRATEGIES:
        assert f'| {name} | 50% / 1 / 0 |' in text
    assert '0.40 / 0.80' in text and '| 1x | 1 | 1 | 7.0 | 0 | 0 |' in text
    assert '## What TimeBill with per-layer int8-weight ran' in text


def test_plan_kinds_counts_what_the_goals_that_ran_were_planned_at():
    runs = [{'outcome': 'COMPLETED', 'precision': ''},
            {'outcome': 'COMPLETED', 'precision': '', 'switched': True},
            {'outcome': 'KILLED', 'precision': 'mixed', 'lowered': 4},
            {'outcome': 'COMPLETED', 'precision': 'int8-weight'},
            {'outcome': 'REJECTED', 'precision': ''}]
    assert plan_kinds(runs) == {'full': 1, 'mixed': 1, 'mean_lowered': 4, 'int8': 1,
                                'switched': 1}
