# SPDX-License-Identifier: Apache-2.0
"""Goal validation: every bad-goal class gets a reason; defaults are filled."""

import math

import pytest

from timebill_ros.core.request import (
    check_prompt_fits, GoalSpec, Limits, Mode, OverrunPolicy, POLICY_NODE_DEFAULT, Rejection,
    validate)
from timebill_ros.core.workload import POLICIES

LIMITS = Limits(max_budget_s=60.0, default_max_new_tokens=32, max_new_tokens_limit=256,
                default_pessimistic_factor=2.0, default_policy=OverrunPolicy.SKIP_NEXT)


def spec(**kw):
    base = dict(instruction='Say hi', budget_s=1.0)
    base.update(kw)
    return GoalSpec(**base)


def test_valid_goal_gets_defaults():
    req = validate(spec(), LIMITS)
    assert req.max_new_tokens == 32
    assert req.pessimistic_factor == 2.0
    assert req.policy == OverrunPolicy.SKIP_NEXT  # the node's default_policy
    assert req.mode == Mode.AUTO


def test_a_zero_policy_is_the_node_default_and_the_values_match_the_action():
    assert POLICY_NODE_DEFAULT == 0
    assert validate(spec(overrun_policy=POLICY_NODE_DEFAULT), LIMITS).policy == \
        OverrunPolicy.SKIP_NEXT
    assert validate(spec(overrun_policy=int(OverrunPolicy.KILL)), LIMITS).policy == \
        OverrunPolicy.KILL
    assert POLICIES == {'node_default': POLICY_NODE_DEFAULT, 'kill': OverrunPolicy.KILL,
                        'skip_next': OverrunPolicy.SKIP_NEXT}


@pytest.mark.parametrize('kw, fragment', [
    (dict(instruction=''), 'empty instruction'),
    (dict(instruction=' \n\t '), 'empty instruction'),
    (dict(budget_s=math.nan), 'not finite'),
    (dict(budget_s=math.inf), 'not finite'),
    (dict(budget_s=0.0), 'must be > 0'),
    (dict(budget_s=-3.0), 'must be > 0'),
    (dict(budget_s=1e9), 'over the node maximum'),
    (dict(overrun_policy=7), 'unknown overrun_policy'),
    (dict(mode=9), 'unknown mode'),
    (dict(mode=int(Mode.EVICTION)), 'not available'),
    (dict(max_new_tokens=100000), 'max_new_tokens'),
    (dict(pessimistic_factor=math.nan), 'pessimistic_factor'),
    (dict(pessimistic_factor=0.5), 'pessimistic_factor'),
])
def test_bad_goals_are_rejected_with_reason(kw, fragment):
    with pytest.raises(Rejection) as err:
        validate(spec(**kw), LIMITS)
    assert fragment in err.value.reason


def test_prompt_over_context_window():
    check_prompt_fits(10, 11)
    with pytest.raises(Rejection, match='context window'):
        check_prompt_fits(11, 11)


def test_fixed_eviction_ratio_needs_eviction_mode_and_a_range():
    from timebill_ros.core.request import Mode
    limits = Limits(supported_modes=frozenset(Mode), alpha_max=0.9)
    ok = validate(GoalSpec('hi', budget_s=1.0, mode=int(Mode.EVICTION), eviction_ratio=0.5,
                           expected_tokens=12), limits)
    assert ok.eviction_ratio == 0.5 and ok.expected_tokens == 12
    for bad, why in ((dict(eviction_ratio=0.95), 'eviction_ratio must be in'),
                     (dict(eviction_ratio=float('nan')), 'eviction_ratio must be in'),
                     (dict(eviction_ratio=0.5, mode=int(Mode.NONE)), 'needs MODE_EVICTION'),
                     (dict(expected_tokens=-1), 'expected_tokens must be')):
        fields = dict(budget_s=1.0, mode=int(Mode.EVICTION))
        fields.update(bad)
        with pytest.raises(Rejection, match=why):
            validate(GoalSpec('hi', **fields), limits)


def test_a_pinned_precision_must_be_resident_and_needs_auto_or_none():
    from timebill_ros.core.request import GoalSpec, Limits, Mode, Rejection, validate
    limits = Limits(precisions=frozenset({'float32', 'int8-dynamic'}),
                    supported_modes=frozenset({Mode.AUTO, Mode.NONE, Mode.EVICTION}))
    ok = validate(GoalSpec('Go.', budget_s=1.0, precision='int8-dynamic'), limits)
    assert ok.precision == 'int8-dynamic'
    assert validate(GoalSpec('Go.', budget_s=1.0), limits).precision == ''
    with pytest.raises(Rejection, match=r"precision 'int4' is not available.*float32, "
                                        r"int8-dynamic"):
        validate(GoalSpec('Go.', budget_s=1.0, precision='int4'), limits)
    with pytest.raises(Rejection, match='needs MODE_AUTO or MODE_NONE'):
        validate(GoalSpec('Go.', budget_s=1.0, mode=int(Mode.EVICTION),
                          precision='float32'), limits)
