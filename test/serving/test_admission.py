# SPDX-License-Identifier: Apache-2.0
"""Admission's context reduction: a refused AUTO goal is planned again on less context."""

import time

import pytest

from conftest import Log
from timebill_ros.core.config import NodeConfig
from timebill_ros.core.profile import Profile
from timebill_ros.core.request import GoalSpec, Mode, Outcome, OverrunPolicy, Rejection
from timebill_ros.runtime.model import load_model
from timebill_ros.serving.assembly import Assembly
from timebill_ros.serving.local_executor import local_server

NEEDLE = 'The bay code for dock 7 is 4412.'
FILLER = ['Forklift {i} returned to the charging row after its shift.',
          'Aisle {i} was swept and the floor sensors reported no spill.',
          'The gate camera logged truck {i} leaving the yard on time.']
CONTEXT = ' '.join([FILLER[i % 3].format(i=i) for i in range(60)][:30] + [NEEDLE]
                   + [FILLER[i % 3].format(i=i) for i in range(60)][30:])
QUESTION = 'What is the bay code for dock 7?'
PREFILL_PER_TOKEN_S, STEP_S = 0.002, 0.01


@pytest.fixture(scope='module')
def loaded():
    return load_model('tiny-random')


def server(loaded, tmp_path, **params):
    """Return a server whose ETE says 2 ms a prompt token and 10 ms a decode step."""
    def prefill(n):
        return 0.01 + PREFILL_PER_TOKEN_S * n
    Profile(model='tiny-random', device='cpu', dtype='float32',
            coefficients={'a': 0.0, 'b': PREFILL_PER_TOKEN_S, 'c': 0.01, 'p': 0.0,
                          'q': STEP_S},
            prefill_points=[[n, prefill(n)] for n in (16, 256, 2048)],
            decode_points=[[n, STEP_S] for n in (16, 256, 2048)]).save(tmp_path / 'p.yaml')
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '',
        'profile': str(tmp_path / 'p.yaml'), **params})
    return local_server(Assembly(config, loaded, Log()), lambda *args: None, 'edf')


def spec(budget_s, mode=Mode.AUTO):
    return GoalSpec(QUESTION, CONTEXT, budget_s=budget_s, mode=int(mode), max_new_tokens=5,
                    overrun_policy=int(OverrunPolicy.KILL))


def whole_prompt_tokens(node):
    return len(node.dry_run(spec(600.0)).prompt_ids)


def test_a_goal_whose_context_cannot_be_prefilled_in_time_keeps_its_relevant_part(
        loaded, tmp_path):
    node = server(loaded, tmp_path)
    try:
        tokens = whole_prompt_tokens(node)
        # A third of the prompt's prefill plus the answer fits (a 10 % margin): the whole
        # and half of the context do not, a quarter or an eighth does (the template and
        # the question come on top of the kept share).
        budget = (0.3 * tokens * PREFILL_PER_TOKEN_S + 5 * STEP_S) / 0.9
        job = node.admit(spec(budget), 'reduced')
        assert NEEDLE in job.request.context and len(job.request.context) < len(CONTEXT) / 3
        assert len(job.prompt_ids) < tokens / 3 and job.plan.prompt_tokens == len(job.prompt_ids)
        note = job.plan.note
        assert 'context reduced to the' in note and 'the whole context did not fit' in note
        assert '0.25 of its characters' in note or '0.125 of its characters' in note
        # Nothing fits even an eighth of the context: refused, the context untouched.
        # (Checked before a goal runs: the online ETE then learns the stand-in's speed.)
        with pytest.raises(Rejection, match='cannot meet the deadline'):
            node.admit(spec(0.02), 'hopeless')
        time.sleep(0.05)  # a re-plan at dispatch (it waited): the note stays
        node.submit(job)
        assert job.done.wait(60.0)
        assert job.result.outcome in (Outcome.COMPLETED, Outcome.KILLED)
        final = job.result.plan.note
        assert 're-planned at dispatch' in final and 'context reduced to the' in final, final
    finally:
        node.stop(timeout_s=30.0)


def test_without_context_reduction_a_goal_whose_context_does_not_fit_is_refused(
        loaded, tmp_path):
    node = server(loaded, tmp_path, context_reduction=False, idle_best_effort=False)
    try:
        tokens = whole_prompt_tokens(node)
        budget = (0.3 * tokens * PREFILL_PER_TOKEN_S + 5 * STEP_S) / 0.9
        with pytest.raises(Rejection, match='cannot meet the deadline'):
            node.admit(spec(budget), 'refused')
    finally:
        node.stop(timeout_s=30.0)


def test_an_admitted_goal_on_an_unsure_plan_takes_a_reduced_context_worth_more(
        loaded, tmp_path):
    from dataclasses import replace
    node = server(loaded, tmp_path)
    try:
        context, pipeline = node.executor.admission.context, node.executor.pipeline
        sure = node.dry_run(spec(600.0))
        assert sure.plan.fit_probability == 1.0 and sure.request.context == CONTEXT
        with node.lock:  # a sure plan is left as it is
            context.if_worth_more(sure, pipeline, 5, False)
        assert sure.request.context == CONTEXT and not sure.context_note
        # As a 16-bit prefill at P(fit) 0.3 would be: the half context fits surely
        # (P(fit) 1 x fidelity 1 x its measured quality) and is worth more.
        unsure = node.dry_run(spec(600.0))
        unsure.plan = replace(unsure.plan, fit_probability=0.3)
        with node.lock:
            context.if_worth_more(unsure, pipeline, 5, False)
        assert NEEDLE in unsure.request.context
        assert len(unsure.request.context) < len(CONTEXT) and unsure.plan.fit_probability == 1
        assert "against the whole context's 0.30" in unsure.context_note
        assert unsure.plan.prompt_tokens == len(unsure.prompt_ids) < len(sure.prompt_ids)
        assert 'alike (ROUGE-L)' in unsure.context_note
        # At P(fit) 0.9 no share is worth more: a reduced context's answers were under
        # 0.9 alike to the whole context's in measurement (the shipped likeness).
        likely = node.dry_run(spec(600.0))
        likely.plan = replace(likely.plan, fit_probability=0.9)
        assert max(context.context_cut.likeness.values()) < 0.9
        with node.lock:
            context.if_worth_more(likely, pipeline, 5, False)
        assert likely.request.context == CONTEXT and not likely.context_note
        assert likely.plan.fit_probability == 0.9
    finally:
        node.stop(timeout_s=30.0)
