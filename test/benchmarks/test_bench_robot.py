# SPDX-License-Identifier: Apache-2.0
"""The robot benchmark's replay and summary rules (no node: plain records)."""

import pytest

from benchmarks.bench_robot import replay_kill, skip_next, summarise, tier_budget
from timebill_ros.evaluation.robot_workload import RobotItem


def run(item, e2e, outcome='COMPLETED', budget=10.0, text='STOP'):
    return {'item': item, 'budget_s': budget, 'outcome': outcome, 'met': False,
            'claimed': False, 'e2e_s': e2e, 'tokens': 3, 'text': text}


def test_tiers_scale_the_full_time_or_are_absolute():
    assert tier_budget('0.5x', 4.0) == 2.0 and tier_budget('2s', 4.0) == 2.0


def test_kill_replay_cuts_a_run_at_its_budget():
    assert replay_kill(run('a', 1.5), 2.0)['met']
    killed = replay_kill(run('a', 2.5), 2.0)
    assert killed['outcome'] == 'KILLED' and not killed['met'] and killed['text'] == ''


def test_skip_next_skips_the_job_released_during_an_overrun():
    # Released at 0, 1, 2, 3 with 1 s budgets; the first runs 1.5 s.
    out = skip_next([run(x, e, budget=1.0) for x, e in
                     (('a', 1.5), ('b', 0.5), ('c', 0.5), ('d', 0.5))])
    assert [o['outcome'] for o in out] == ['COMPLETED', 'SKIPPED', 'COMPLETED', 'COMPLETED']
    assert [o['met'] for o in out] == [False, False, True, True]
    # A rejected job takes no model time and is never the one skipped.
    out = skip_next([run('a', 1.5, budget=1.0), run('b', 0.0, 'REJECTED', 1.0),
                     run('c', 0.2, budget=1.0)])
    assert [o['outcome'] for o in out] == ['COMPLETED', 'REJECTED', 'COMPLETED']


def test_summary_counts_false_rejections_late_claims_and_quality():
    items = {x: RobotItem(x, 'decision', 't', 'STOP or GO?', '', 'STOP', 'exact', 'test')
             for x in 'abc'}
    runs = [dict(run('a', 0.5), met=True, claimed=True),
            run('b', 0.0, 'REJECTED'),
            dict(run('c', 12.0), claimed=True)]  # late, yet claimed on time: a defect
    s = summarise(runs, items, {x: 'STOP' for x in 'abc'}, {'a': True, 'b': True, 'c': False})
    assert s['met_rate'] == pytest.approx(1 / 3) and s['false_rejections'] == 1
    assert s['late_claimed_met'] == 1 and s['quality'] == 1.0
