# SPDX-License-Identifier: Apache-2.0
"""Batch lanes: joins at token boundaries, leaves, padding; tokens equal solo runs."""

import pytest

from timebill_ros.core.planning import Plan
from timebill_ros.runtime.batch import BatchDecoder
from timebill_ros.runtime.engine import Engine
from timebill_ros.runtime.model import load_model, prompt_ids
from timebill_ros.runtime.presses import press_for_plan
from timebill_ros.serving.loop import generate

PROMPTS = {'short': 'Stop or go?', 'mid': 'Report the battery level of the robot now.',
           'long': 'Summarise the route: ' + 'turn left at the dock, ' * 12}


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def solo(engine, ids, n, plan=Plan()):
    tokens = []
    generate(engine, ids, n, plan, lambda event: tokens.append(event.token_id) or True)
    return tokens


def greedy(batch, got):
    """Step the batch on each sequence's last token; append each next token."""
    steps = batch.step({key: got[key][-1] for key in batch.keys})
    for key, step in steps.items():
        got[key].append(int(step.logits.argmax()))


def test_each_sequence_decodes_as_it_would_alone(tiny):
    engine = Engine(tiny, press_for_plan)
    ids = {k: prompt_ids(tiny.tokenizer, v) for k, v in PROMPTS.items()}
    plans = {'short': Plan(), 'mid': Plan(),
             'long': Plan(eviction_ratio=0.5, press='knorm')}  # evicted: a shorter cache
    want = {k: solo(engine, ids[k], 16, plans[k]) for k in ids}
    batch = BatchDecoder(tiny.model)
    got = {k: [] for k in ids}

    def join(key):
        cache, logits, stats = engine.prefill(ids[key], plans[key])
        assert stats.kv_tokens_after_prefill == cache.get_seq_length()
        got[key].append(int(logits.argmax()))
        batch.join(key, cache, len(ids[key]))

    def step():
        greedy(batch, got)
    join('long')  # joins alone, then the others at token boundaries
    step()
    step()
    join('short')
    step()
    join('mid')
    assert batch.keys == ['long', 'short', 'mid'] and len(batch) == 3
    for _ in range(4):
        step()
    batch.leave('long')  # e.g. killed at its deadline: the others carry on
    assert batch.keys == ['short', 'mid']
    while len(got['mid']) < 12:
        step()
    for key in ids:
        assert got[key] == want[key][:len(got[key])], key
    assert len(got['long']) == 8 and len(got['short']) == 13
    batch.leave('short')
    batch.leave('mid')
    assert len(batch) == 0 and batch.cached_tokens() == 0


def test_a_sequence_taken_out_continues_in_another_batch_as_it_would_alone(tiny):
    engine = Engine(tiny, press_for_plan)
    ids = {k: prompt_ids(tiny.tokenizer, v) for k, v in PROMPTS.items()}
    want = solo(engine, ids['short'], 14)
    first, second = BatchDecoder(tiny.model), BatchDecoder(tiny.model)
    got = {'long': [], 'short': [], 'mid': []}
    for key in ('long', 'short'):  # 'short' is left-padded behind 'long'
        cache, logits, _ = engine.prefill(ids[key], Plan())
        got[key].append(int(logits.argmax()))
        first.join(key, cache, len(ids[key]))
    for _ in range(5):
        greedy(first, got)
    cache, position = first.take('short')
    assert first.keys == ['long'] and cache.get_seq_length() == len(ids['short']) + 5
    assert position == len(ids['short']) + 5
    cache2, logits2, _ = engine.prefill(ids['mid'], Plan())
    got['mid'].append(int(logits2.argmax()))
    second.join('mid', cache2, len(ids['mid']))
    second.join('short', cache, position)
    while len(got['short']) < 14:
        greedy(second, got)
    assert got['short'] == want


def test_a_float32_cache_joins_a_16_bit_batch_cast_to_its_precision(tiny):
    from timebill_ros.runtime.model import precision_variant
    variant = precision_variant(tiny, 'bfloat16')
    engine = Engine(tiny, variants={'bfloat16': variant})
    ids = {k: prompt_ids(tiny.tokenizer, v) for k, v in PROMPTS.items() if k != 'long'}
    want = {k: solo(engine, ids[k], 8, Plan(precision='bfloat16')) for k in ids}
    batch = BatchDecoder(variant.model)
    got = {}
    for key in ids:
        cache, logits, _ = engine.prefill(ids[key], Plan(precision='bfloat16'))
        got[key] = [int(logits.argmax())]
        batch.join(key, cache, len(ids[key]))  # a float32 prefill's cache
    while len(got['short']) < 8:
        greedy(batch, got)
    for key in ids:
        assert got[key] == want[key], key
