# SPDX-License-Identifier: Apache-2.0
"""Structured answers in the serving core (tiny model): schema, closure, batch, sampling."""

import json

import jsonschema
import pytest

from conftest import Log
from timebill_ros.core.config import NodeConfig
from timebill_ros.core.output import StopReason
from timebill_ros.core.request import GoalSpec, Mode, Outcome, Rejection
from timebill_ros.runtime.model import load_model
from timebill_ros.serving.assembly import Assembly
from timebill_ros.serving.local_executor import local_server

SCHEMA = {'type': 'object', 'additionalProperties': False, 'required': ['action', 'why'],
          'properties': {'action': {'enum': ['stop', 'go', 'change_lane']},
                         'speed': {'type': 'number'}, 'why': {'type': 'string'}}}


@pytest.fixture(scope='module')
def loaded():
    return load_model('tiny-random')


@pytest.fixture(scope='module')
def server(loaded):
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'max_batch': 4})
    serving = local_server(Assembly(config, loaded, Log()), lambda *args: None)
    yield serving
    serving.stop()


def goal(text='Plan the next move.', budget=60.0, tokens=40, **fields):
    return GoalSpec(text, budget_s=budget, mode=int(Mode.NONE), max_new_tokens=tokens,
                    **fields)


def run(server, specs, key='g', together=False):
    """Submit goals (all queued at once when ``together``) and return their results."""
    jobs = []
    if together:
        with server.executor.assembly.model_lock:
            jobs = [server.admit(spec, f'{key}{i}') for i, spec in enumerate(specs)]
            for job in jobs:
                server.submit(job)
    else:
        for i, spec in enumerate(specs):
            job = server.admit(spec, f'{key}{i}')
            server.submit(job)
            assert job.done.wait(120.0)
            jobs.append(job)
    for job in jobs:
        assert job.done.wait(120.0), f'{job.key} never finished'
    return [job.result for job in jobs]


def test_a_schema_goal_answers_json_that_validates(server):
    result, = run(server, [goal(json_schema=json.dumps(SCHEMA))])
    assert result.outcome == Outcome.COMPLETED and result.valid
    jsonschema.validate(json.loads(result.text), SCHEMA)
    assert result.stop_reason in (StopReason.END_OF_ANSWER, StopReason.MAX_TOKENS)


def test_max_new_tokens_cutting_a_structure_closes_it(server):
    result, = run(server, [goal(tokens=6, json_schema=json.dumps(SCHEMA))])
    jsonschema.validate(json.loads(result.text), SCHEMA)
    assert result.valid and result.stop_reason == StopReason.MAX_TOKENS
    assert 'closed it with' in result.reason and result.tokens > 6


def test_the_deadline_closes_a_structure_within_one_token(server):
    # The random model writes a long "why"; the budget ends it well before 1,000 tokens.
    result, = run(server, [goal(budget=0.4, tokens=1000, json_schema=json.dumps(SCHEMA))])
    assert result.stop_reason == StopReason.CLOSED_AT_DEADLINE and result.valid
    jsonschema.validate(json.loads(result.text), SCHEMA)
    assert result.outcome in (Outcome.COMPLETED, Outcome.KILLED)
    assert result.deadline_met == (result.outcome == Outcome.COMPLETED and result.e2e_s <= 0.4)
    step = max(result.step_times)
    assert result.e2e_s <= 0.4 + step + 0.1  # one token (and the closure's few ms)


def test_free_text_cut_at_the_deadline_is_killed_and_partial(server):
    result, = run(server, [goal(budget=0.4, tokens=1000)])
    assert result.outcome == Outcome.KILLED and result.stop_reason == StopReason.KILLED


def test_an_invalid_schema_or_grammar_is_rejected_with_the_librarys_reason(server):
    with pytest.raises(Rejection, match='invalid json_schema.*Invalid type'):
        server.admit(goal(json_schema='{"type": "objectx"}'), 'bad1')
    with pytest.raises(Rejection, match='invalid grammar.*nowhere'):
        server.admit(goal(grammar='root ::= "a" nowhere'), 'bad2')
    result, = run(server, [goal(tokens=3)], key='after')  # still serving
    assert result.outcome == Outcome.COMPLETED


def test_a_batch_mixing_constrained_and_free_goals_answers_each_as_alone(server):
    specs = [goal('Stop or go?', json_schema=json.dumps(SCHEMA)),
             goal('Report the battery level.', tokens=9),
             goal('Yes or no?', grammar='root ::= ("yes" | "no") ", because " [a-z ]+ "."'),
             goal('Describe the route.', tokens=7, temperature=0.8, seed=5)]
    alone = run(server, specs, key='solo')
    together = run(server, specs, key='batch', together=True)
    assert [r.text for r in together] == [r.text for r in alone]
    assert max(r.batch_peak for r in together) >= 2
    assert together[0].valid and together[2].valid
    assert together[2].text.startswith(('yes, because ', 'no, because '))


def test_sampling_repeats_with_a_seed(server):
    first, second, other = run(server, [
        goal(tokens=12, temperature=1.0, seed=11), goal(tokens=12, temperature=1.0, seed=11),
        goal(tokens=12, temperature=1.0, seed=12)])
    assert first.text == second.text != other.text


def test_a_stop_string_ends_the_answer(server):
    free, = run(server, [goal(tokens=30)], key='free')
    stop = free.text[8:10]
    result, = run(server, [goal(tokens=30, stop=(stop,))], key='stopped')
    assert result.stop_reason == StopReason.STOP_SEQUENCE and stop in result.text
    assert free.text.startswith(result.text) and len(result.text) < len(free.text)


def test_system_prompt_and_history_reach_the_chat_template(server, loaded):
    job = server.admit(goal(system_prompt='You drive a forklift.',
                            history=(('user', 'Where is bay 4?'),
                                     ('assistant', 'Next to the dock.'))), 'chat')
    text = loaded.tokenizer.decode(job.prompt_ids)
    assert text.index('You drive a forklift.') < text.index('Where is bay 4?') < \
        text.index('Next to the dock.') < text.index('Plan the next move.')
    assert text.count('<|im_start|>assistant') == 2  # the history's turn and the answer's
    server.submit(job)
    assert job.done.wait(60.0)


def test_a_skip_next_schema_goal_is_closed_at_its_deadline_instead_of_overrunning(server):
    from timebill_ros.core.request import OverrunPolicy
    result, = run(server, [goal(budget=0.4, tokens=1000, json_schema=json.dumps(SCHEMA),
                                overrun_policy=int(OverrunPolicy.SKIP_NEXT))], key='skip')
    assert result.stop_reason == StopReason.CLOSED_AT_DEADLINE and result.valid
    jsonschema.validate(json.loads(result.text), SCHEMA)
    assert result.e2e_s <= 0.4 + max(result.step_times) + 0.1
