# SPDX-License-Identifier: Apache-2.0
"""llguidance constraints on the embedded tokenizer: masks, rejections, closures."""

import json

import jsonschema
import numpy as np
import pytest

from timebill_ros.runtime.grammar import GrammarError, GrammarLibrary
from timebill_ros.runtime.model import load_model

SCHEMA = {'type': 'object', 'additionalProperties': False,
          'required': ['action', 'lane', 'speed', 'waypoints', 'safe', 'why'],
          'properties': {'action': {'enum': ['stop', 'go', 'change_lane']},
                         'lane': {'type': 'string'}, 'speed': {'type': 'number'},
                         'waypoints': {'type': 'array', 'items': {'type': 'number'}},
                         'safe': {'type': 'boolean'},
                         'why': {'type': 'string', 'minLength': 3}}}
ANSWER = '{"action": "go", "lane": "left", "speed": 30, "waypoints": [1.5, 2], ' \
         '"safe": true, "why": "clear road"}'


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


@pytest.fixture(scope='module')
def library(tiny):
    return GrammarLibrary(tiny.tokenizer, tiny.eos_ids)


def ids(tiny, text):
    return tiny.tokenizer(text, add_special_tokens=False)['input_ids']


def test_a_schema_answer_in_the_models_own_spacing_is_legal_token_by_token(tiny, library):
    constraint = library.constraint(library.compile(json.dumps(SCHEMA)))
    for token in ids(tiny, ANSWER):
        assert constraint.legal()[token]
        assert constraint.accept(token)
    assert constraint.complete and constraint.error == ''
    legal = constraint.legal()
    assert legal[sorted(tiny.eos_ids)[0]] and legal.sum() == len(tiny.eos_ids)


def test_the_mask_leaves_only_legal_tokens_and_works_on_torch_width_rows(tiny, library):
    constraint = library.constraint(library.compile(json.dumps(SCHEMA)))
    logits = np.random.default_rng(0).normal(size=tiny.model.config.vocab_size)
    masked = constraint.mask(logits)
    assert masked.shape == logits.shape
    assert tiny.tokenizer.decode([int(np.argmax(masked))]).startswith('{')
    assert np.isinf(masked).sum() > len(masked) - 10


def test_compilation_is_cached_and_invalid_inputs_carry_the_librarys_reason(library):
    text = json.dumps(SCHEMA)
    first = library.compile(text)
    compiled = len(library.compile_s)
    assert library.compile(text) is first and len(library.compile_s) == compiled
    with pytest.raises(GrammarError, match='Invalid type'):
        library.compile('{"type": "objectx"}')
    with pytest.raises(GrammarError, match='does not parse'):
        library.compile('{not json')
    with pytest.raises(GrammarError, match='undefined_rule'):
        library.compile(grammar='root ::= "yes" | undefined_rule')
    with pytest.raises(GrammarError, match='not both'):
        library.compile(text, 'root ::= "a"')


@pytest.mark.parametrize('cut', [0, 5, 12, 20, 27, 33, len(ANSWER) - 1])
def test_a_closure_from_any_cut_validates_against_the_schema(tiny, library, cut):
    constraint = library.constraint(library.compile(json.dumps(SCHEMA)))
    prefix = ids(tiny, ANSWER[:cut])
    accepted = [t for t in prefix if constraint.accept(t)]
    assert len(accepted) == len(prefix)
    closure = constraint.closure()
    assert closure is not None and len(closure) <= 64
    text = tiny.tokenizer.decode(prefix + closure)
    jsonschema.validate(json.loads(text), SCHEMA)
    assert not constraint.complete or cut == len(ANSWER)  # rolled back: the state is kept


def test_the_shortest_answer_is_a_closure_from_the_start_and_is_cached(tiny, library):
    compiled = library.compile(json.dumps(SCHEMA))
    shortest = library.constraint(compiled).closure(max_tokens=256, time_limit_s=0.5)
    text = tiny.tokenizer.decode(shortest)
    jsonschema.validate(json.loads(text), SCHEMA)  # every required field, shortest values
    assert library.shortest_answer(compiled) == len(shortest) > 6
    assert library._shortest[compiled] == len(shortest)  # computed once per grammar
    free_sentence = library.compile(grammar='root ::= "OK" | "Stop now please"')
    assert library.shortest_answer(free_sentence) == len(ids(tiny, 'OK'))


def test_a_gbnf_closure_ends_the_sentence(tiny, library):
    constraint = library.constraint(library.compile(
        grammar='root ::= ("yes" | "no") ", because " [a-z ]+ "."'))
    for token in ids(tiny, 'yes, because the road'):
        assert constraint.accept(token)
    closure = constraint.closure()
    assert tiny.tokenizer.decode(closure) == '.'


def test_the_readme_examples_compile(library):
    from pathlib import Path
    examples = Path(__file__).resolve().parents[2] / 'docs' / 'examples'
    assert library.compile((examples / 'lane_change.schema.json').read_text())
    assert library.compile(grammar=(examples / 'yes_no.gbnf').read_text())
