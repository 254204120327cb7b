# SPDX-License-Identifier: Apache-2.0
import pytest

from benchmarks.policies import (
    IN_TIME, KILLED, LATE, Run, SKIPPED, kill, skip_next, summary)


def test_kill_scores_only_answers_within_the_budget():
    assert kill(Run(4.0, 0.8), 5.0).status == IN_TIME and kill(Run(4.0, 0.8), 5.0).score == 0.8
    late = kill(Run(6.0, 0.8), 5.0)
    assert late.status == KILLED and late.score == 0.0 and late.finish_s == 5.0
    assert kill(Run(5.0, 0.5), 5.0).status == IN_TIME  # finishing at the deadline is in time


def test_skip_next_skips_the_job_released_during_an_overrun():
    runs = [Run(3.0, 1.0), Run(7.0, 0.9), Run(2.0, 0.7), Run(2.0, 0.6)]
    out = skip_next(runs, budget_s=5.0, period_s=5.0)
    assert [o.status for o in out] == [IN_TIME, LATE, SKIPPED, IN_TIME]
    assert [o.score for o in out] == [1.0, 0.0, 0.0, 0.6]
    # Job 3 is released at 15 s, after job 1's late finish at 12 s: it starts on time.
    assert out[3].finish_s == pytest.approx(17.0)
    assert summary(out) == {'jobs': 4, 'completion_rate': 0.5, 'avg_score': pytest.approx(0.4)}


def test_skip_next_does_not_skip_when_nothing_waits():
    out = skip_next([Run(6.0, 1.0), Run(1.0, 1.0)], budget_s=5.0, period_s=10.0)
    assert [o.status for o in out] == [LATE, IN_TIME]


def test_queueing_behind_a_slow_job_can_make_the_next_one_late():
    out = skip_next([Run(4.9, 1.0), Run(4.9, 1.0)], budget_s=5.0, period_s=1.0)
    assert [o.status for o in out] == [IN_TIME, LATE]


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        Run(float('nan'), 0.5)
    with pytest.raises(ValueError):
        Run(1.0, 1.5)
    with pytest.raises(ValueError):
        kill(Run(1.0, 0.5), 0.0)
    with pytest.raises(ValueError):
        skip_next([Run(1.0, 0.5)], 1.0, float('inf'))
    assert summary([])['jobs'] == 0
