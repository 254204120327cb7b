# SPDX-License-Identifier: Apache-2.0
"""bench_burst's yardstick: the offline schedule and the counts it reports (pure)."""

from benchmarks.bench_burst import most_on_time, summarise


def test_moore_hodgson_finds_the_most_goals_on_time():
    # Three 1 s jobs, deadlines 1, 2 and 2.5 s: only two fit.
    assert len(most_on_time([(1.0, 1.0, 'a'), (2.0, 1.0, 'b'), (2.5, 1.0, 'c')])) == 2
    # Dropping the long job keeps three short ones; EDF alone would keep two.
    kept = most_on_time([(2.0, 1.5, 'a'), (2.0, 0.5, 'b'), (3.0, 1.0, 'c'), (3.0, 2.0, 'd')])
    assert sorted(kept) == ['a', 'b', 'c']
    long_first = most_on_time([(3.0, 3.0, 'long'), (3.0, 1.0, 'x'), (3.0, 1.0, 'y')])
    assert sorted(long_first) == ['x', 'y']


def row(index, budget, outcome, met, service=0.0, accepted=True, finished=0.0, reason=''):
    return {'index': index, 'budget_s': budget, 'answered': True, 'accepted': accepted,
            'reject_reason': '' if accepted else reason, 'outcome': outcome,
            'deadline_met': met, 'reason': reason if accepted else '', 'tokens': 8 if met else 0,
            'queue_s': 0.0, 'service_s': service, 'e2e_s': 0.0, 'sent_s': 0.0,
            'finished_s': finished}


def test_summary_counts_against_the_offline_schedule():
    rows = [row(0, 2.0, 'COMPLETED', True, 1.0, finished=1.0),
            row(1, 2.0, 'COMPLETED', True, 1.0, finished=2.0),
            row(2, 2.0, 'REJECTED', False, finished=2.0, reason='no time left (x)'),
            row(3, 10.0, 'REJECTED', False, finished=3.0, reason='no time left (y)'),
            row(4, 2.0, '', False, accepted=False, finished=0.1, reason='queue full (z)')]
    summary = summarise(rows)
    assert summary['met'] == 2 and summary['lost'] == 0
    # 1 s each: two 2 s goals fit in 2 s and the 10 s one after them.
    assert summary['offline_edf_met'] == 3
    assert summary['refused_at_admission'] == 1 and summary['refused_at_dispatch'] == 2
    # Goal 3 had 7 s left at its refusal, goal 4 1.9 s: both could have run alone.
    assert summary['refused_could_have_met'] == 2
    assert summary['refusal_reasons'] == {'no time left': 2, 'queue full': 1}
