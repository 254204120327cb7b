# SPDX-License-Identifier: Apache-2.0
"""A goal's answer form: validation with reasons, and the stop reasons."""

import pytest

from timebill_ros.core.output import OutputSpec, StopReason, validate_output
from timebill_ros.core.request import GoalSpec, Limits, Rejection, validate


def test_defaults_are_greedy_free_text():
    output = validate_output()
    assert output == OutputSpec() and output.plain and output.top_p == 1.0


@pytest.mark.parametrize('fields, reason', [
    ({'history': [('robot', 'hi')]}, "history\\[0\\].role 'robot'"),
    ({'stop': ['']}, 'non-empty strings'),
    ({'stop': ['x'] * 9}, 'at most 8'),
    ({'temperature': -1.0}, 'temperature'),
    ({'temperature': float('nan')}, 'temperature'),
    ({'top_p': 1.5}, 'top_p'),
    ({'seed': -1}, 'seed'),
    ({'json_schema': '{}', 'grammar': 'root ::= "a"'}, 'not both'),
])
def test_bad_fields_are_rejected_with_a_reason(fields, reason):
    with pytest.raises(ValueError, match=reason):
        validate_output(**fields)
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    spec = GoalSpec('go', budget_s=1.0, **fields)
    with pytest.raises(Rejection, match=reason):
        validate(spec, Limits())


def test_a_goal_carries_its_answer_form():
    request = validate(GoalSpec('go', budget_s=1.0, system_prompt=' Be brief. ',
                                history=(('user', 'hi'), ('assistant', 'hello')),
                                stop=('\n',), temperature=0.7, top_p=0.9, seed=3,
                                json_schema='{"type": "object"}'), Limits())
    output = request.output
    assert output.system_prompt == 'Be brief.' and output.history[1] == ('assistant', 'hello')
    assert output.constrained and output.sampled and not output.plain
    assert (output.temperature, output.top_p, output.seed) == (0.7, pytest.approx(0.9), 3)


def test_stop_reasons_match_the_action_constants():
    assert [r.name for r in StopReason] == [
        'NONE', 'END_OF_ANSWER', 'MAX_TOKENS', 'STOP_SEQUENCE', 'KILLED',
        'CLOSED_AT_DEADLINE', 'CANCELED', 'FAILED']
