# SPDX-License-Identifier: Apache-2.0
"""A goal's token chooser: sampling with a seed, top-p, stop strings, validity."""

import json

import numpy as np
import pytest
import torch

from timebill_ros.core.output import OutputSpec
from timebill_ros.runtime.choosing import TokenChooser
from timebill_ros.runtime.grammar import GrammarLibrary
from timebill_ros.runtime.model import load_model


def rows(n=20, width=50, seed=0):
    return [torch.tensor(r, dtype=torch.float32)
            for r in np.random.default_rng(seed).normal(size=(n, width))]


def picks(output, logits):
    chooser = TokenChooser(output)
    return [chooser.choose(row) for row in logits]


def test_greedy_is_the_argmax_of_torch_and_numpy_rows():
    logits = rows()
    assert picks(OutputSpec(), logits) == [int(r.argmax()) for r in logits]
    assert picks(OutputSpec(), [r.numpy() for r in logits]) == [int(r.argmax()) for r in logits]


def test_sampling_with_a_seed_repeats_and_other_seeds_differ():
    logits = rows(n=40)
    first = picks(OutputSpec(temperature=1.0, seed=7), logits)
    assert first == picks(OutputSpec(temperature=1.0, seed=7), logits)
    assert first != picks(OutputSpec(temperature=1.0, seed=8), logits)
    assert first != [int(r.argmax()) for r in logits]  # it samples


def test_a_tiny_top_p_keeps_only_the_most_likely_token():
    logits = rows(n=30)
    assert picks(OutputSpec(temperature=1.5, top_p=1e-6, seed=3), logits) == \
        [int(r.argmax()) for r in logits]


def test_a_stop_string_across_token_boundaries_ends_the_answer():
    chooser = TokenChooser(OutputSpec(stop=('END',)))
    assert chooser.accept(1, 'the answer E')
    assert not chooser.accept(2, 'ND here')


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def test_validity_is_checked_with_jsonschema_beside_the_grammar(tiny):
    schema = json.dumps({'type': 'object', 'properties': {'n': {'type': 'integer'}},
                         'required': ['n'], 'additionalProperties': False})
    library = GrammarLibrary(tiny.tokenizer, tiny.eos_ids)
    chooser = TokenChooser(OutputSpec(json_schema=schema),
                           library.constraint(library.compile(schema)))
    assert chooser.closable and not chooser.valid()
    for token in tiny.tokenizer('{"n": 4', add_special_tokens=False)['input_ids']:
        chooser.accept(token, tiny.tokenizer.decode([token]))
    closure = chooser.closure()
    for token in closure:
        chooser.accept(token, tiny.tokenizer.decode([token]))
    assert chooser.text == '{"n": 4}' and chooser.valid() and not chooser.closable
