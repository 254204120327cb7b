# SPDX-License-Identifier: Apache-2.0
"""Learning: answer lengths kept per schema or grammar, apart from free text's."""

import json

from timebill_ros.core.deadline import DeadlineClock
from timebill_ros.core.execution import JobResult
from timebill_ros.core.output import StopReason
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import GoalSpec, Limits, Outcome, validate
from timebill_ros.serving.jobs import Job
from timebill_ros.serving.learning import Learning, SCHEMA_GRAMMARS

SCHEMA = json.dumps({'type': 'object', 'required': ['go'],
                     'properties': {'go': {'type': 'boolean'}}})


def job(schema='', grammar=''):
    request = validate(GoalSpec('Go?', budget_s=5.0, max_new_tokens=40, json_schema=schema),
                       Limits())
    return Job(key='k', request=request, prompt_ids=[1, 2], clock=DeadlineClock.start(5.0),
               plan=Plan(), grammar=grammar)


def ran(tokens, outcome=Outcome.COMPLETED, stop=StopReason.END_OF_ANSWER):
    return JobResult(outcome=outcome, deadline_met=True, reason='', tokens=tokens,
                     prefill_s=0.01, stop_reason=stop)


def test_answers_under_a_schema_give_its_own_spread_once_three_ended_by_themselves():
    learning = Learning(window=16, dtype='float32')
    remote = job(schema=SCHEMA)  # a replica's goal: keyed by its schema text
    assert remote.answer_form == SCHEMA and job(grammar='compiled').answer_form == 'compiled'
    learning.count(remote, ran(9, Outcome.KILLED, StopReason.CLOSED_AT_DEADLINE))
    learning.count(remote, ran(10))
    learning.count(remote, ran(40, stop=StopReason.MAX_TOKENS))  # capped: longer
    learning.count(job(), ran(3))  # free text stays out of it
    learning.count(remote, ran(12))
    assert learning.grammar_lengths(SCHEMA, 40) is None  # two ended by themselves
    learning.count(remote, ran(14))
    spread = learning.grammar_lengths(SCHEMA, 40)
    assert spread.source == 'answers to this schema' and spread.samples == (5,)
    assert spread.quantile(0.5, 0.0) == 12 and spread.quantile(1.0, 0.0) == 40


def test_only_the_most_recently_used_grammars_are_kept():
    learning = Learning(window=16, dtype='float32')
    for index in range(SCHEMA_GRAMMARS + 1):
        learning.grammar_answer_ran(f'g{index}', 5, True)
    learning.grammar_answer_ran('g1', 5, True)  # used again: kept
    learning.grammar_answer_ran('new', 5, True)
    assert 'g0' not in learning._by_grammar and 'g2' not in learning._by_grammar
    assert 'g1' in learning._by_grammar and len(learning._by_grammar) == SCHEMA_GRAMMARS


def test_a_handed_over_goal_teaches_its_prefill_to_one_engine_and_its_steps_to_the_other():
    from types import SimpleNamespace
    from timebill_ros.core.timing import OnlineTimingModel, TimingModel
    from timebill_ros.serving.learning import learn_timing
    f16, q4 = (OnlineTimingModel(TimingModel(0.0, 0.002, 0.0, 0.0, 0.01)) for _ in range(2))
    pipeline = SimpleNamespace(
        online=OnlineTimingModel(TimingModel(0.0, 0.003, 0.0, 0.0, 0.08)),
        online_engines={'llama.cpp-f16': f16, 'llama.cpp-q4_1': q4}, online_variants={},
        planner=SimpleNamespace(estimate_s=lambda plan, tokens, *args, **kw: 0.5))
    plan = Plan(precision='llama.cpp-q4_1', prefill_precision='llama.cpp-f16')
    result = JobResult(outcome=Outcome.COMPLETED, deadline_met=True, reason='', tokens=5,
                       prefill_s=0.2, decode_s=0.03, step_times=(0.0075,) * 4, plan=plan,
                       kv_tokens=2)
    learn_timing(pipeline, job(), result)
    learning = Learning(window=16, dtype='float32')
    learning.count(job(), result)
    assert learning.last_precision == 'llama.cpp-f16>llama.cpp-q4_1'  # diagnostics name both
    assert list(f16.prefill_samples) == [(2, 0.2)] and not f16.decode_samples
    assert not q4.prefill_samples and len(q4.decode_samples) == 4
    assert not pipeline.online.prefill_samples  # the torch ETE learns nothing of it


def test_the_ete_error_of_a_goal_that_timed_nothing_is_zero_not_a_crash():
    from timebill_ros.serving.learning import error_pct
    assert abs(error_pct(1.2, 1.0) - 20.0) < 1e-9
    assert error_pct(0.5, 0.0) == 0.0  # prefix-cached prompt, killed after one token
