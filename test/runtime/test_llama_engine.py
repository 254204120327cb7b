# SPDX-License-Identifier: Apache-2.0
"""llama.cpp engine options on the real library and the embedded GGUF."""

import math
from types import SimpleNamespace

import pytest

from timebill_ros.core.execution import PrefillInterrupted
from timebill_ros.core.planning import Plan
from timebill_ros.runtime.llama_engine import (
    calibrate_llama, gguf_variant, LlamaEngine, LlamaModel, LlamaUnavailable, option_name)
from timebill_ros.runtime.model import embedded_dir, embedded_gguf, prompt_ids
from timebill_ros.runtime.profiler import Grid
from timebill_ros.serving.loop import DecodeLoop, generate
from timebill_ros.serving.members import Member
from conftest import drive, goals_arriving


@pytest.fixture(scope='module')
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(embedded_dir())


@pytest.fixture(scope='module')
def engine(tokenizer):
    model = LlamaModel(embedded_gguf(), 2048, 3, 16, 2)
    yield LlamaEngine(model, option_name('q4_1'), tokenizer, {tokenizer.eos_token_id})
    model.close()


def answer(engine, ids, tokens=24):
    out = []
    stats = generate(engine, ids, tokens, Plan(), lambda ev: out.append(ev) or True)
    return [ev.token_id for ev in out], stats


def test_the_gguf_shares_the_tokenizers_vocabulary(engine, tokenizer):
    import llama_cpp
    ids = prompt_ids(tokenizer, 'Slow down to 20 km/h near the crossing.')
    vocab = llama_cpp.llama_model_get_vocab(engine.model._model)
    assert llama_cpp.llama_vocab_n_tokens(vocab) == tokenizer.vocab_size
    text = tokenizer.decode(ids)
    buffer = (llama_cpp.llama_token * 512)()
    count = llama_cpp.llama_tokenize(vocab, text.encode(), len(text.encode()), buffer, 512,
                                     False, True)
    assert list(buffer[:count]) == ids


def test_chunked_prefill_gives_the_one_pass_logits(engine, tokenizer):
    import numpy as np
    ids = prompt_ids(tokenizer, 'Which lane should the truck take to reach gate 4?',
                     'Gate 4 is on the left after the second crossing. ' * 4)
    assert len(ids) > 3 * engine.model.chunk
    sequence, chunked, stats = engine.prefill(ids, Plan())
    engine.model.release(sequence.seq_id)
    whole = LlamaModel(embedded_gguf(), 2048, 1, 512, 2)
    try:
        sequence, single, _ = LlamaEngine(whole, 'one-pass', tokenizer,
                                          engine.eos_ids).prefill(ids, Plan())
    finally:
        whole.close()
    # Same first token; the logits agree up to llama.cpp's quantised kernels, which are
    # not batch-invariant (Q4_1: chunks of 512 vs 16 moved the top logit by ~0.2 of 33).
    assert int(chunked.argmax()) == int(single.argmax())
    assert np.abs(chunked - single).max() < 1.0
    assert stats.kv_tokens_after_prefill == len(ids) and stats.prefill_s > 0


def test_interrupt_stops_between_chunks_and_frees_the_sequence(engine, tokenizer):
    ids = list(range(1000, 1000 + 5 * engine.model.chunk))
    asked = []

    def interrupt():
        asked.append(1)
        return len(asked) >= 2
    with pytest.raises(PrefillInterrupted) as raised:
        engine.prefill(ids, Plan(), None, interrupt)
    assert raised.value.done == 2 * engine.model.chunk and raised.value.total == len(ids)
    held = [engine.model.acquire() for _ in range(3)]  # every sequence is free again
    for seq_id in held:
        engine.model.release(seq_id)
    with pytest.raises(RuntimeError, match='in use'):
        for _ in range(4):
            held.append(engine.model.acquire())
    for seq_id in set(held):
        engine.model.release(seq_id)


class Run:
    """A goal's rules that only collect its tokens (and their order across goals)."""

    plan, closes_batch = Plan(), False

    def __init__(self, key, deadline=math.inf, order=None):
        self.key, self.tokens, self.order = key, [], order if order is not None else []
        self.clock = SimpleNamespace(deadline=deadline)

    def interrupt(self, next_chunk_s=0.0):
        return False

    def stops_ahead(self, now, next_step_s):
        return False

    def on_token(self, event):
        self.order.append(self.key)
        self.tokens.append(event.token_id)
        return True

    def token_budget(self, index):
        return None

    def switch_to(self, index, sharing):
        return ''

    def finish(self, stats):
        return self.tokens

    def failed(self, exc):
        raise exc


def test_goals_batched_in_one_lane_keep_their_solo_answers(engine, tokenizer):
    prompts = [prompt_ids(tokenizer, text) for text in (
        'Stop the robot.', 'Turn left at the next junction and wait.', 'Report battery level.')]
    # 5 tokens: later ones include near ties (the 6th of the second answer has its top-2
    # logits 0.11 apart, the 7th of the third 0.12) that another batch composition may
    # break the other way: llama.cpp's sums run in another order (a cache-cell layout
    # or kernel of another size). A sequence mixed up would differ from the first token.
    solo = [answer(engine, ids, 5)[0] for ids in prompts]
    results, waiting = {}, list(enumerate(prompts))

    def refill(loop, before):
        if not waiting:
            return False
        key, ids = waiting.pop(0)
        run = Run(key)
        loop.start(Member(str(key), run, 5, lambda tokens, key=key:
                          results.__setitem__(key, tokens)), ids, Plan())
        return True
    loop = DecodeLoop(engine, capacity=3)
    loop.run(refill)
    assert [results[k] for k in range(3)] == solo
    assert len(engine.model._free) == 3  # every sequence's cells were freed


def test_with_one_decode_place_a_goal_overtakes_a_long_prefill_on_the_same_option(
        tokenizer):
    from timebill_ros.serving.engine_options import llama_sequences
    model = LlamaModel(embedded_gguf(), 2048, llama_sequences(1), 16, 2)
    engine = LlamaEngine(model, option_name('q4_1'), tokenizer, {tokenizer.eos_token_id})
    long_ids = prompt_ids(tokenizer, 'Which lane should the truck take to reach gate 4?',
                          'Gate 4 is on the left after the second crossing. ' * 12)
    short_ids = prompt_ids(tokenizer, 'Stop the robot.')
    try:
        solo = [answer(engine, ids, 5)[0] for ids in (long_ids, short_ids)]
        # The long goal's deadline is later: the short one may overtake it.
        order, results = [], {}
        waiting = [(0, long_ids, 1e9), (1, short_ids, 1e6)]

        def refill(loop, before):
            if not waiting or waiting[0][2] >= before:
                return False
            key, ids, deadline = waiting.pop(0)
            loop.start(Member(str(key), Run(key, deadline, order), 5,
                              lambda tokens, key=key: results.__setitem__(key, tokens)),
                       ids, Plan())
            return True
        DecodeLoop(engine, capacity=1).run(refill)
        assert results == {0: solo[0], 1: solo[1]}
        assert order == [1] * 5 + [0] * 5  # the short goal decoded first, then the long
        assert len(model._free) == llama_sequences(1)  # every sequence freed
    finally:
        model.close()


def test_a_goal_that_ends_on_its_first_token_frees_its_sequence(engine, tokenizer):
    # One token (or a goal stopped at its first token) never joins a lane; its
    # sequence must still be released, or the fourth such goal finds none free.
    ids = prompt_ids(tokenizer, 'Stop the robot.')
    for _ in range(5):
        tokens, _ = answer(engine, ids, 1)
        assert len(tokens) == 1
    assert len(engine.model._free) == 3


def test_a_variant_is_made_once_by_llamas_quantizer(tmp_path, tokenizer):
    source = embedded_gguf()
    assert gguf_variant(source, 'q4_1', tmp_path) == source  # the shipped format itself
    made = gguf_variant(source, 'q8_0', tmp_path)
    assert made.name.endswith('.Q8_0.gguf') and made.stat().st_size > source.stat().st_size
    stamp = made.stat().st_mtime_ns
    assert gguf_variant(source, 'q8_0', tmp_path).stat().st_mtime_ns == stamp
    with pytest.raises(LlamaUnavailable, match='unknown GGUF format'):
        gguf_variant(source, 'q3_x', tmp_path)


def test_calibration_fits_prefill_and_decode(engine):
    grid = Grid(prefill_fit=(16, 64, 160), prefill_heldout=(96,), decode_fit=(16, 128, 256),
                decode_heldout=(64,), repeats=1, decode_steps=3, warmup=0)
    profile = calibrate_llama(engine, grid, 'SmolLM2')
    model = profile.timing_model()
    assert profile.dtype == engine.option and profile.versions['chunk'] == engine.model.chunk
    assert 0 < model.prefill(16) < model.prefill(160)
    assert model.step(16) > 0 and profile.heldout['decode_lengths'] == [64]


def test_a_calibration_cut_short_frees_its_sequences_and_resumes(engine):
    from timebill_ros.runtime.llama_engine import llama_calibration_steps, probe_command
    grid = Grid(prefill_fit=(16, 64, 160), prefill_heldout=(96,), decode_fit=(16, 128),
                decode_heldout=(64,), repeats=1, decode_steps=3, warmup=0)

    def all_sequences_free():  # between two points no sequence is held: goals get all three
        held = [engine.model.acquire() for _ in range(3)]
        for seq_id in held:
            engine.model.release(seq_id)
    # Goals arrive three times: each cuts a point short.
    profile, yields = drive(llama_calibration_steps(engine, grid, 'SmolLM2', goals_arriving()),
                            all_sequences_free)
    assert yields > 4 + 3 and profile.timing_model().step(16) > 0  # points cut were redone
    prefill, step = probe_command(engine)
    assert prefill > 0 and step > 0


def test_a_held_prompt_is_reused_by_the_next_one_that_starts_alike(tokenizer):
    context = 'Dock 3 is free. Forklift 7 charges at bay 2. Aisle 9 is blocked. ' * 6
    first, second = (prompt_ids(tokenizer, q, context)
                     for q in ('Which aisle is blocked?', 'Where does forklift 7 charge?'))
    held = LlamaModel(embedded_gguf(), 2048, 2, 16, 2, hold_mb=64)
    fresh = LlamaModel(embedded_gguf(), 2048, 2, 16, 2)
    try:
        engines = [LlamaEngine(model, option_name('q4_1'), tokenizer,
                               {tokenizer.eos_token_id}) for model in (held, fresh)]
        assert engines[0].cached_prefix(second) == 0  # nothing held yet
        assert answer(engines[0], first, 5)[1].prefix_tokens == 0
        shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
        whole_chunks = shared - shared % held.chunk  # the rest prefills as it would fresh
        # What admission plans on is what the prefill then takes from the held prompt.
        assert engines[0].cached_prefix(second) == whole_chunks >= 32
        assert engines[1].cached_prefix(second) == 0
        tokens, stats = answer(engines[0], second, 5)
        assert stats.prefix_tokens == whole_chunks
        assert tokens == answer(engines[1], second, 5)[0]
        # Every sequence is free again; the held prompt stays until dropped.
        assert sorted(held._free) == [0, 1] and held.held_prompts == [first, second]
        held.forget()
        assert held.held_prompts == [] and answer(engines[0], second, 1)[1].prefix_tokens == 0
    finally:
        held.close()
        fresh.close()


def test_several_prompts_are_held_the_least_recently_used_out_first(tokenizer):
    docks = 'Dock 3 is free. Forklift 7 charges at bay 2. Aisle 9 is blocked. ' * 6
    roads = 'Lane 2 is closed. The ramp is icy. Gate B opens at noon today. ' * 6
    dock_a, dock_b, road = (prompt_ids(tokenizer, q, c) for q, c in (
        ('Which aisle is blocked?', docks), ('Where does forklift 7 charge?', docks),
        ('Which lane is closed?', roads)))
    model = LlamaModel(embedded_gguf(), 2048, 2, 16, 2, hold_mb=64)
    try:
        engine = LlamaEngine(model, option_name('q4_1'), tokenizer, {tokenizer.eos_token_id})
        answer(engine, dock_a, 1)
        answer(engine, road, 1)
        # A robot alternating contexts finds each held: the dock question after the road
        # one takes the dock context from the first prompt.
        shared = engine.cached_prefix(dock_b)
        assert model.held_prompts == [dock_a, road] and shared >= 32
        assert answer(engine, dock_b, 1)[1].prefix_tokens == shared
        assert model.held_prompts == [road, dock_a, dock_b]  # reused: the most recent
        # Past the memory bound the least recently used goes first.
        model.hold_bytes = model.held_bytes - 1
        answer(engine, road, 1)
        assert model.held_prompts == [dock_b, road] and model.held_bytes <= model.hold_bytes
    finally:
        model.close()


def test_a_prompt_answers_the_same_whatever_the_cache_held_before(tokenizer):
    # In one shared KV buffer a held prompt's cells changed later greedy answers
    # (results/engines/llama_cache_determinism); each sequence now has its own stream.
    context = 'Robot 4 waits at door B. The lift is out of service until noon. ' * 8
    prompts = [prompt_ids(tokenizer, q, context) for q in
               ('Summarise the status in two sentences.', 'Can robot 4 use the lift now?')]
    held = LlamaModel(embedded_gguf(), 2048, 2, 16, 2, hold_mb=64)
    fresh = LlamaModel(embedded_gguf(), 2048, 2, 16, 2)
    try:
        engines = [LlamaEngine(model, option_name('q4_1'), tokenizer,
                               {tokenizer.eos_token_id}) for model in (held, fresh)]
        alone = [answer(engines[1], ids, 40)[0] for ids in prompts]
        runs = [answer(engines[0], ids, 40) for ids in prompts + prompts[::-1] + prompts]
        assert [tokens for tokens, _ in runs] == alone + alone[::-1] + alone
        assert all(stats.prefix_tokens > 0 for _, stats in runs[1:])
    finally:
        held.close()
        fresh.close()


def test_a_prompt_answers_the_same_beside_another_goals_cells(tokenizer):
    # With one KV buffer for all sequences this answer changed while another prompt's
    # cells sat beside it (number-016 of the robot test split, 80 tokens).
    from timebill_ros.evaluation import robot_workload
    items = {item.id: item for item in robot_workload.load('test')}
    asked, beside = (prompt_ids(tokenizer, items[key].instruction, items[key].context)
                     for key in ('number-016', 'unit-017'))
    model = LlamaModel(embedded_gguf(), 1024, 2, 64, 2)
    try:
        engine = LlamaEngine(model, option_name('q4_1'), tokenizer, {tokenizer.eos_token_id})
        alone = answer(engine, asked, 80)[0]
        neighbour, _, _ = engine.prefill(beside, Plan())
        assert answer(engine, asked, 80)[0] == alone
        model.release(neighbour.seq_id)
    finally:
        model.close()


def f16_beside(engine, tokenizer, sequences):
    from timebill_ros.runtime.model import cache_root
    model = LlamaModel(gguf_variant(embedded_gguf(), 'f16', cache_root()), 2048, sequences,
                       16, 2)
    return LlamaEngine(model, option_name('f16'), tokenizer, engine.eos_ids)


def test_a_prompt_prefilled_on_f16_decodes_on_q4_1_after_its_kv_moves(engine, tokenizer):
    from timebill_ros.serving.resident import ResidentEngines
    ids = prompt_ids(tokenizer, 'Which lane should the truck take to reach gate 4?',
                     'Gate 4 is on the left after the second crossing. ' * 3)
    plan = Plan(precision=engine.option, prefill_precision=option_name('f16'))

    def run(backend, plan):
        out = []
        stats = generate(backend, ids, 12, plan, lambda ev: out.append(ev) or True)
        return [ev.token_id for ev in out], stats
    # llama.cpp reads a sequence's state only into a context of as many sequences: with
    # fewer, the goal decodes where it was prefilled, and its plan says so.
    other = f16_beside(engine, tokenizer, engine.model._api.llama_n_seq_max(
        engine.model._ctx) - 1)
    try:
        both = ResidentEngines(main=engine, others={other.option: other,
                                                    engine.option: engine})
        stayed, stats = run(both, plan)
        assert stats.plan.precision == other.option and 'decoding there' in stats.plan.note
        assert stayed == run(other, Plan())[0]
    finally:
        other.model.close()
    f16 = f16_beside(engine, tokenizer, engine.model._api.llama_n_seq_max(engine.model._ctx))
    try:
        both = ResidentEngines(main=engine, others={f16.option: f16, engine.option: engine})
        free, f16_free = sorted(engine.model._free), sorted(f16.model._free)
        handed, stats = run(both, plan)
        # Decoded on Q4_1 (its sequence taken and given back), prefilled on F16 (released
        # after the move); the move is part of the prefill's time.
        assert stats.plan.precision == engine.option and stats.prefill_s > 0
        assert sorted(engine.model._free) == free and sorted(f16.model._free) == f16_free
        # The first token comes from F16's prefill; the answer repeats.
        assert handed[0] == run(f16, Plan())[0][0] and len(handed) >= 2
        assert run(both, plan)[0] == handed
        # A Q4_1 sequence holding F16's prompt cells steps as the moved one did.
        sequence, logits, _ = f16.prefill(ids, Plan())
        state = f16.model.export(sequence.seq_id)
        f16.model.release(sequence.seq_id)
        lane = engine.lane((engine.option,))
        lane.join('g', type(sequence)(engine.model.adopt(state)), len(ids))
        tokens = [int(logits.argmax())]
        while len(tokens) < len(handed):
            tokens.append(int(lane.step({'g': tokens[-1]})['g'].logits.argmax()))
        lane.leave('g')
        assert tokens == handed
    finally:
        f16.model.close()


def test_amx_weight_layouts_are_left_out_where_the_library_has_amx():
    """llama.cpp's AMX kernels die with SIGILL here: a build with AMX loads without them."""
    from timebill_ros.runtime.llama_engine import _llama, model_params
    api = _llama()
    amx = b'AMX_INT8 = 1' in api.llama_print_system_info()
    assert model_params(api).use_extra_bufts is not amx
    assert api.llama_model_default_params().use_extra_bufts  # only the node's copy changes
