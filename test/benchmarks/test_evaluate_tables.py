# SPDX-License-Identifier: Apache-2.0
"""The evaluator's tables: gaps to the node, repeatability, runs pooled per profile."""

import pytest

from benchmarks import evaluate_planning as ev
from benchmarks import evaluate_tables as tables


def report():
    """Return a two-item run's report as repeatability reads it: items, commit, table."""
    strategies = ['float32', 'int8-weight', 'AUTO']
    return {'traces': [{'item': item, 'strategy': s} for item in ('a', 'b') for s in strategies],
            'commit': 'abc', 'table': {tier: {s: {'met': 0, 'goals': 2} for s in strategies}
                                       for tier in ('0.3x', '1x', '20s')}}


def test_a_cell_is_reproduced_within_two_of_the_replays_standard_deviations():
    unsure = ev._row([(0.5, 1.0)] * 8 + [(1.0, 1.0)] * 2)  # 6 expected, sd sqrt(2)
    sure = ev._row([(0.0, 0.0)] * 20)  # 0 expected, no spread
    assert unsure['met'] == pytest.approx(6.0) and unsure['sd'] == pytest.approx(2 ** 0.5)
    predicted = {'0.3x': {'AUTO': unsure, 'float32': sure}}

    def measured(auto, float32):
        return {'table': {'0.3x': {'AUTO': {'met': auto, 'goals': 10},
                                   'float32': {'met': float32, 'goals': 20}}}}
    assert tables.within_spread(measured(4, 0), predicted) == (2, 2)  # 2 off < 2 x 1.41
    assert tables.within_spread(measured(3, 0), predicted) == (1, 2)  # 3 off: outside
    assert tables.within_spread(measured(6, 1), predicted) == (1, 2)  # sure, and one off


def test_repeatability_is_the_spread_of_the_fixed_choices_between_runs_of_the_same_items():
    first, second = report(), report()
    assert tables.repeatability([first]) is None  # one run: nothing to compare
    first['table']['1x']['float32']['met'] = 2
    second['commit'] = 'def'
    spread = tables.repeatability([first, second])
    assert spread['max_points'] == 100.0 and spread['runs'] == ['abc', 'def']
    assert spread['cells']['1x float32'] == 100.0 and spread['cells']['0.3x float32'] == 0.0
    assert '1x AUTO' not in spread['cells']  # AUTO is what changes between runs
    # Runs over other items do not count as repeats.
    other = report()
    other['traces'] = [{**t, 'item': 'other'} for t in other['traces']]
    assert tables.repeatability([first, other]) is None


def test_runs_pooled_add_their_goals_and_compare_the_rates():
    def run(auto_met, expected, sd):
        measured = {'table': {'1x': {'AUTO': {'met': auto_met, 'goals': 20}}}}
        replayed = {'machines': {'traced': {'tiers': {'1x': {'AUTO': {
            'met': expected, 'sd': sd}}}}}}
        return measured, replayed
    # One run 3 goals under the replay (15 points), the other 2 over: pooled 2.5 points.
    cells = tables.pooled([run(12, 15.0, 1.5), run(17, 15.0, 2.0)], 'traced')
    cell = cells['1x']['AUTO']
    assert (cell['met'], cell['goals'], cell['expected']) == (29, 40, 30.0)
    assert cell['gap_points'] == pytest.approx(2.5)
    assert cell['sd'] == pytest.approx(2.5)  # sqrt(1.5^2 + 2^2)


def test_every_profile_is_pooled_over_the_runs_with_auto_against_the_best_fixed():
    def run(auto, fixed, f1):
        return {'machines': {'m': {'tiers': {'1x': {
            'AUTO': {'met': auto, 'goals': 10, 'f1_met': f1},
            'float32': {'met': fixed, 'goals': 10, 'f1_met': 1.0}}}}}}
    sums = tables.pooled_profiles([run(8.0, 5.0, 0.5), run(2.0, 6.0, 1.0)])
    auto = sums['m']['1x']['AUTO']
    assert (auto['met'], auto['goals']) == (10.0, 20)
    assert auto['f1_met'] == pytest.approx((8 * 0.5 + 2 * 1.0) / 10)  # met-weighted
    assert '| 1x | 10.0/20 (0.60) | 11.0/20 (1.00) | NO (-1.0) |' in tables.profiles_markdown(
        ['AUTO', 'float32'], sums)


def test_a_gap_summary_gives_the_worst_the_mean_and_the_cells_within_5_points():
    assert tables.gap_summary([1.0, -0.0, 9.0, 5.0]) == \
        '9.0 points at worst, 3.8 mean; within 5 points in 3 of 4'


def test_auto_is_compared_goal_by_goal_with_the_fixed_choice_that_met_most():
    def run(outcomes):
        """One run: per item, (AUTO met, float32 met, int8-weight met) at tier 1x."""
        return {'records': [{'tier': '1x', 'item': item, 'strategy': strategy, 'met': met}
                            for item, row in outcomes.items()
                            for strategy, met in zip(('AUTO', 'float32', 'int8-weight'), row)]}
    # int8-weight meets 9 of 12, AUTO 8: AUTO alone meets 1 goal, int8-weight alone 2.
    first = run({'a': (1, 0, 1), 'b': (1, 0, 1), 'c': (0, 0, 1), 'd': (1, 1, 0),
                 'e': (1, 0, 1), 'f': (0, 0, 0)})
    second = run({'a': (1, 0, 1), 'b': (1, 1, 1), 'c': (0, 0, 1), 'd': (1, 0, 1),
                  'e': (1, 0, 1), 'f': (0, 0, 0)})
    row = tables.paired([first, second])['1x']
    assert row['goals'] == 12  # the same item in two runs is two goals
    assert (row['fixed'], row['met'], row['fixed_met']) == ('int8-weight', 8, 9)
    assert (row['only_auto'], row['only_fixed']) == (1, 2)
    assert row['p_fixed_better'] == pytest.approx(0.5)  # 2 or more of 3 at even odds
    assert row['p_auto_better'] == pytest.approx(0.875)  # 1 or more of 3
    text = tables.paired_markdown(tables.paired([first, second]))
    assert '| 1x | 12 | int8-weight | 8 | 9 | 1 | 2 | 0.500 | 0.875 |' in text
