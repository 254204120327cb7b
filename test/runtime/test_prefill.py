# SPDX-License-Identifier: Apache-2.0
"""A chunked prefill leaves the cache, logits, press and length decision one pass leaves."""

import pytest

from timebill_ros.core.execution import PrefillDecision, PrefillInterrupted
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Mode
from timebill_ros.runtime.prefill import chunk_bounds

torch = pytest.importorskip('torch')
pytest.importorskip('kvpress')

from timebill_ros.runtime.engine import Engine, PressCost  # noqa: E402
from timebill_ros.runtime.model import load_model, prompt_ids  # noqa: E402
from timebill_ros.runtime.presses import press_for_plan  # noqa: E402


def test_chunk_bounds_cover_the_prompt_and_keep_a_long_enough_last_chunk():
    assert chunk_bounds(10, 0) == [(0, 10)] and chunk_bounds(10, 16) == [(0, 10)]
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    # A press needs its window in the last chunk: the short tail joins the chunk before.
    assert chunk_bounds(10, 4, last_at_least=3) == [(0, 4), (4, 10)]
    assert chunk_bounds(10, 4, last_at_least=20) == [(0, 10)]
    with pytest.raises(ValueError):
        chunk_bounds(0, 4)


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def caches_equal(a, b, atol=1e-5):
    same = [torch.allclose(x.keys, y.keys, atol=atol) and
            torch.allclose(x.values, y.values, atol=atol) for x, y in zip(a.layers, b.layers)]
    return a.get_seq_length() == b.get_seq_length() and all(same)


def prefill(tiny, ids, plan, chunk, decide=None):
    return Engine(tiny, press_for_plan, prefill_chunk=chunk).prefill(ids, plan, decide)


def test_chunks_leave_the_cache_and_logits_of_one_pass(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Where is the dock?', 'shelf aisle bay ' * 40)
    whole, logits, stats = prefill(tiny, ids, Plan(), 0)
    chunked, chunk_logits, chunk_stats = prefill(tiny, ids, Plan(), 32)
    assert len(ids) > 64 and caches_equal(whole, chunked)
    assert torch.allclose(logits, chunk_logits, atol=1e-4)
    assert int(logits.argmax()) == int(chunk_logits.argmax())
    assert chunk_stats.kv_tokens_after_prefill == stats.kv_tokens_after_prefill == len(ids)


@pytest.mark.parametrize('name', ['snapkv', 'knorm', 'streamingllm'])
def test_a_press_scores_the_whole_cache_after_the_last_chunk(tiny, name):
    ids = prompt_ids(tiny.tokenizer, 'Summarise.', 'alpha beta gamma delta ' * 60)
    plan = Plan(eviction_ratio=0.5, press=name)
    whole, _, _ = prefill(tiny, ids, plan, 0)
    chunked, _, _ = prefill(tiny, ids, plan, 48)
    assert whole.get_seq_length() < len(ids)
    assert caches_equal(whole, chunked)  # the same positions kept, in the same order


def test_the_length_decision_reads_the_last_chunk_and_its_press_applies(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Summarise.', 'word ' * 300)
    seen, evict = [], Plan(eviction_ratio=0.5, press='snapkv')

    def plan_from(hidden):
        seen.append(hidden[0, -1].clone())
        return evict
    auto = Plan(mode=Mode.AUTO)  # may evict once decided (MODE_NONE never does)
    whole, _, stats = prefill(tiny, ids, auto, 0, PrefillDecision(1, plan_from))
    chunked, _, chunk_stats = prefill(tiny, ids, auto, 64, PrefillDecision(1, plan_from))
    assert torch.allclose(seen[0], seen[1], atol=1e-5)  # the last token's state
    assert stats.plan == chunk_stats.plan == evict
    assert caches_equal(whole, chunked)


def test_interrupt_is_asked_between_chunks_only(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Where?', 'word ' * 100)
    engine, asked = Engine(tiny, press_for_plan, prefill_chunk=32), []

    def interrupt():
        asked.append(True)
        return len(asked) >= 2
    with pytest.raises(PrefillInterrupted) as stopped:
        engine.prefill(ids, Plan(), interrupt=interrupt)
    assert stopped.value.done == 64 and stopped.value.total == len(ids)


def test_a_goal_that_never_evicts_keeps_plain_chunks(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Where?', 'word ' * 300)
    engine = Engine(tiny, press_for_plan, prefill_chunk=64)
    decide = PrefillDecision(1, lambda hidden: Plan())
    none = engine.begin_prefill(ids, Plan(), decide)  # MODE_NONE: its last chunk is short
    auto = engine.begin_prefill(ids, Plan(mode=Mode.AUTO), decide)
    assert none.bounds[-1][1] - none.bounds[-1][0] < auto.bounds[-1][1] - auto.bounds[-1][0]
    assert auto.bounds[-1][1] - auto.bounds[-1][0] >= auto.LAST_CHUNK_MIN


def test_press_cost_rises_at_once_and_falls_by_halves():
    cost = PressCost()
    cost.learn(0.002)
    assert cost.s_per_token == pytest.approx(0.002)
    cost.learn(0.0)
    assert cost.s_per_token == pytest.approx(0.001)
    cost.learn(0.004)
    assert cost.s_per_token == pytest.approx(0.004)


def test_the_cost_a_press_adds_to_the_last_chunk_is_learned_and_announced(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Where?', 'word ' * 300)
    evict = Plan(mode=Mode.EVICTION, eviction_ratio=0.5, press='snapkv')
    engine = Engine(tiny, press_for_plan, prefill_chunk=64)
    plain = engine.begin_prefill(ids, Plan())
    while not plain.done:
        assert plain.next_chunk_extra_s == 0.0  # no press, nothing added or learned
        plain.advance()
    assert engine.press_cost.s_per_token == 0.0
    run = engine.begin_prefill(ids, evict)
    assert run.next_chunk_extra_s == 0.0  # nothing learned yet
    while not run.done:
        run.advance()
    learned = engine.press_cost.s_per_token
    assert learned > 0.0  # the compression of the last chunk, timed where it ran
    second = engine.begin_prefill(ids, evict)
    while second.chunks_left > 1:
        assert second.next_chunk_extra_s == 0.0  # only the last chunk presses
        second.advance()
    assert second.next_chunk_extra_s == pytest.approx(learned * len(ids))
