# SPDX-License-Identifier: Apache-2.0
"""The prefix cache reuses a prompt's stored blocks; answers equal those prefilled afresh."""

import pytest

from timebill_ros.core.planning import Plan

torch = pytest.importorskip('torch')
pytest.importorskip('kvpress')

from timebill_ros.runtime.engine import Engine  # noqa: E402
from timebill_ros.runtime.model import load_model, prompt_ids  # noqa: E402
from timebill_ros.runtime.prefix_cache import PrefixCache  # noqa: E402
from timebill_ros.runtime.presses import press_for_plan  # noqa: E402
from timebill_ros.serving.loop import generate  # noqa: E402


def layers(n, value=1.0):
    """Two layers of keys and values for ``n`` positions (1 head, 2 dims)."""
    return [(torch.full((1, 1, n, 2), value), torch.full((1, 1, n, 2), value))] * 2


def test_blocks_are_found_only_behind_the_same_prefix_and_bounded_by_memory():
    cache = PrefixCache(block_tokens=4, max_bytes=10 ** 6)
    ids = list(range(12))
    assert cache.store(ids, layers(12), upto=11) == 2  # whole blocks only
    assert cache.match(ids, 12) == 8 and cache.match(ids, 7) == 4
    assert cache.match([99] + ids[1:], 12) == 0  # another first block: nothing after it
    assert cache.match(ids[:4] + [99] * 8, 12) == 4
    reused, kv = cache.take(ids + [50], 13)
    assert reused == 8 and kv[0][0].shape == (1, 1, 8, 2) and cache.hits == 1
    assert cache.store(ids, layers(12), upto=12) == 1  # the third block is new
    block = cache.bytes // 3
    small = PrefixCache(block_tokens=4, max_bytes=2 * block)
    small.store(ids, layers(12), upto=12)
    # Over budget: the least recently used block went, the prefix's start stayed.
    assert len(small) == 2 and small.match(ids, 12) == 8
    assert PrefixCache(4, 0).store(ids, layers(12), 12) == 0  # off


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def answer(engine, ids, plan=Plan(), tokens=12):
    out = []
    stats = generate(engine, ids, tokens, plan, lambda ev: out.append(ev.token_id) or True)
    return out, stats


@pytest.mark.parametrize('plan', [Plan(), Plan(eviction_ratio=0.5, press='snapkv')])
def test_a_cached_context_gives_the_answer_of_a_fresh_prefill(tiny, plan):
    context = 'Shelf 12 holds pallets of bolts. Aisle 4 is closed for cleaning. ' * 12
    first, second = (prompt_ids(tiny.tokenizer, q, context)
                     for q in ('Which aisle is closed?', 'What does shelf 12 hold?'))
    fresh = Engine(tiny, press_for_plan, prefill_chunk=64)
    cached = Engine(tiny, press_for_plan, prefill_chunk=64,
                    prefix_cache=PrefixCache(block_tokens=32, max_bytes=64 * 2 ** 20))
    assert answer(cached, first, plan)[1].prefix_tokens == 0
    tokens, stats = answer(cached, second, plan)
    assert stats.prefix_tokens >= 32 * ((len(second) - 128) // 32) > 0
    expected, fresh_stats = answer(fresh, second, plan)
    assert tokens == expected
    assert stats.kv_tokens_after_prefill == fresh_stats.kv_tokens_after_prefill
