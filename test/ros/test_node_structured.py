# SPDX-License-Identifier: Apache-2.0
"""Structured answers over DDS: schema and grammar goals, the deadline closure, the topic form."""

import json

import jsonschema
import pytest

from builtin_interfaces.msg import Duration

from conftest import client_fixture, NodeProcess, topic_probe
from timebill_msgs.action import Instruct
from timebill_msgs.msg import ChatTurn, Instruction
from timebill_ros.tools.client import make_goal

R = Instruct.Result
G = Instruct.Goal
SCHEMA = json.dumps({
    'type': 'object', 'additionalProperties': False, 'required': ['action', 'lane'],
    'properties': {'action': {'enum': ['keep', 'change']},
                   'lane': {'enum': ['left', 'right', 'current']},
                   'note': {'type': 'string'}}})
# A required free string: the random-weight model writes it on past any short deadline.
REPORT = json.dumps({
    'type': 'object', 'additionalProperties': False, 'required': ['action', 'why'],
    'properties': {'action': {'enum': ['keep', 'change']}, 'why': {'type': 'string'}}})
YES_NO = 'root ::= ("yes" | "no") ", because " [a-z ]+ "."'


@pytest.fixture(scope='module')
def node(rclpy_context):
    proc = NodeProcess({'model': 'tiny-random', 'calibrate_on_start': False,
                        'length_predictor': 'max-new-tokens', 'max_batch': 2},
                       namespace='/structured')
    yield proc
    proc.stop()


client = client_fixture('/structured', 'structured_client')


def test_a_schema_goal_returns_valid_json(client):
    run = client.ask(make_goal('Pass the truck ahead.', 60.0, max_new_tokens=60,
                               json_schema=SCHEMA), 120)
    res = run.result
    assert res.outcome == R.COMPLETED and res.valid, res.reason
    jsonschema.validate(json.loads(res.text), json.loads(SCHEMA))
    assert res.stop_reason in (R.STOP_END_OF_ANSWER, R.STOP_MAX_TOKENS)


def test_a_grammar_goal_follows_it_and_streams_feedback_that_reassembles(client):
    deltas = []
    run = client.ask(make_goal('Is the dock free?', 60.0, max_new_tokens=40, grammar=YES_NO),
                     120, on_feedback=lambda f: deltas.append(f.text_delta))
    res = run.result
    assert res.valid and res.text.startswith(('yes, because ', 'no, because '))
    assert res.text.endswith('.') and ''.join(deltas) == res.text


def test_the_deadline_closes_a_schema_answer(client):
    run = client.ask(make_goal('Report in detail.', 0.5, policy=G.KILL, mode=G.MODE_NONE,
                               max_new_tokens=1000, json_schema=REPORT), 120)
    res = run.result
    assert res.stop_reason == R.STOP_CLOSED_AT_DEADLINE and res.valid, res.reason
    jsonschema.validate(json.loads(res.text), json.loads(REPORT))
    assert 'closed it with' in res.reason
    assert res.deadline_met == (res.outcome == R.COMPLETED and res.e2e_s <= 0.5)


def test_an_invalid_schema_is_rejected_with_the_reason_and_the_node_serves_on(client):
    bad = client.ask(make_goal('Go.', 10.0, json_schema='{"type": "objectx"}'), 60)
    assert not bad.accepted and 'Invalid type' in bad.reject_reason
    bad = client.ask(make_goal('Go.', 10.0, temperature=9.0), 60)
    assert not bad.accepted and 'temperature' in bad.reject_reason
    ok = client.ask(make_goal('Go.', 10.0, max_new_tokens=3), 60)
    assert ok.result.outcome == R.COMPLETED


def test_seeded_sampling_repeats_over_the_action(client):
    texts = [client.ask(make_goal('Name a colour.', 60.0, max_new_tokens=10, temperature=1.0,
                                  seed=seed), 120).result.text for seed in (4, 4, 5)]
    assert texts[0] == texts[1] != texts[2]


def test_the_topic_form_carries_the_answer_form(client, node, wait_until):
    with topic_probe('structured_recorder', '/structured') as (pub, seen):
        wait_until(lambda: pub.get_subscription_count() > 0, 10, 'subscriber')
        pub.publish(Instruction(id='s-1', instruction='Which lane?', budget=Duration(sec=60),
                                mode=G.MODE_NONE, max_new_tokens=40, json_schema=SCHEMA,
                                system_prompt='You drive.',
                                history=[ChatTurn(role='user', content='Hi')]))
        wait_until(lambda: any(r.id == 's-1' for r in seen), 60, 'response')
        response = next(r for r in seen if r.id == 's-1')
        assert response.valid and response.outcome == R.COMPLETED, response.reason
        jsonschema.validate(json.loads(response.text), json.loads(SCHEMA))
