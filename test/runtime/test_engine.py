# SPDX-License-Identifier: Apache-2.0
"""Engine on a tiny random-weight model: greedy tokens, streamed text, stop rules."""

import pytest

torch = pytest.importorskip('torch')

from timebill_ros.core.planning import Plan  # noqa: E402
from timebill_ros.runtime.engine import Engine, StreamDecoder  # noqa: E402
from timebill_ros.serving.loop import generate  # noqa: E402
from timebill_ros.runtime.model import (  # noqa: E402
    intra_op_threads, load_model, ModelLoadError, precision_variant, prompt_ids)


@pytest.fixture(scope='module')
def tiny():
    return load_model('tiny-random')


def test_stream_decoder_reassembles_multibyte_text(tiny):
    tok = tiny.tokenizer
    text = 'Café au lait, 日本語 and 🚀 rockets.'
    ids = tok(text)['input_ids']
    decoder = StreamDecoder(tok)
    deltas = [decoder.push(i) for i in ids]
    assert ''.join(deltas) == tok.decode(ids, skip_special_tokens=True,
                                         clean_up_tokenization_spaces=False)
    assert '\ufffd' not in ''.join(deltas)


def test_stream_decoder_deltas_equal_the_whole_decode_on_the_embedded_tokenizer():
    import random
    from transformers import AutoTokenizer
    from timebill_ros.runtime.model import embedded_dir
    tok = AutoTokenizer.from_pretrained(embedded_dir())
    texts = ['{"action": "stop", "lane": 2}\n  - waypoint K17, 3.5 m/s',
             'Café au lait, 日本語 and 🚀 rockets.', '   spaces  and\ttabs\n\n end']
    rng = random.Random(0)
    samples = [tok(t)['input_ids'] for t in texts]
    # Random ids too: partial UTF-8 bytes, special tokens, odd merges.
    samples += [[rng.randrange(len(tok)) for _ in range(60)] for _ in range(20)]
    for ids in samples:
        decoder = StreamDecoder(tok)
        joined = ''.join(decoder.push(i) for i in ids)
        whole = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert joined == decoder.text
        assert whole.startswith(joined) and (joined == whole or whole.endswith('\ufffd'))


def test_engine_matches_transformers_greedy(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Tell me about robots.')
    engine = Engine(tiny)
    got = []
    stats = generate(engine, ids, 12, Plan(), lambda ev: got.append(ev.token_id) or True)
    ref = tiny.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert got == ref[0, len(ids):].tolist()
    assert stats.tokens == 12 and stats.stop == 'max_tokens'
    assert len(stats.step_times) == 11  # the first token comes from prefill
    assert stats.kv_tokens_after_prefill == len(ids)


def test_hook_false_stops_after_that_token(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Count.')
    seen = []
    stats = generate(Engine(tiny), ids, 50, Plan(), lambda ev: seen.append(ev) or len(seen) < 3)
    assert stats.tokens == 3 and stats.stop == 'stopped' and len(seen) == 3


def test_bad_sources_fail_clearly():
    with pytest.raises(ModelLoadError, match='config.json'):
        load_model('/nonexistent/model')
    with pytest.raises(ModelLoadError, match='dtype'):
        load_model('tiny-random', dtype='int3')


def test_int8_dynamic_quantisation_loads_and_generates():
    import torch
    loaded = load_model('tiny-random', dtype='int8-dynamic')
    assert loaded.dtype == 'int8-dynamic'
    modules = list(loaded.model.modules())
    assert not any(type(m) is torch.nn.Linear for m in modules)  # every one quantised
    assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in modules)
    stats = generate(Engine(loaded), loaded.tokenizer('hello')['input_ids'], 5, Plan(),
                     lambda event: True)
    assert stats.tokens == 5 or stats.stop == 'eos'


def test_a_resident_int8_copy_runs_the_decode_steps_of_plans_asking_for_it(tiny):
    variant = precision_variant(tiny, 'int8-dynamic')
    assert variant.tokenizer is tiny.tokenizer and variant.dtype == 'int8-dynamic'
    # Per-channel scales: one scale per output row of every quantised weight.
    linear = next(m for m in variant.model.modules()
                  if isinstance(m, torch.ao.nn.quantized.dynamic.Linear))
    assert linear.weight().qscheme() == torch.per_channel_affine
    # The float32 original is untouched (a copy was quantised).
    assert any(type(m) is torch.nn.Linear for m in tiny.model.modules())
    calls = {'float32': 0, 'int8': 0}

    def counter(key):
        def hook(module, args):
            calls[key] += 1
        return hook
    handles = [tiny.model.register_forward_pre_hook(counter('float32')),
               variant.model.register_forward_pre_hook(counter('int8'))]
    engine = Engine(tiny, variants={'int8-dynamic': variant}, decode_threads=1)
    ids = prompt_ids(tiny.tokenizer, 'Report the battery level.')
    try:
        stats = generate(engine, ids, 6, Plan(precision='int8-dynamic'), lambda event: True)
    finally:
        for handle in handles:
            handle.remove()
    # One float32 prefill, then every decode step on the int8 copy.
    assert stats.tokens == 6 and calls == {'float32': 1, 'int8': 5}
    # A full-precision plan whose switch rule fires at step 2: the rest run on int8,
    # continuing the same KV cache, and the tokens before the switch are float32's.
    calls.update(float32=0, int8=0)
    handles = [tiny.model.register_forward_pre_hook(counter('float32')),
               variant.model.register_forward_pre_hook(counter('int8'))]
    full, mixed = [], []
    try:
        generate(engine, ids, 6, Plan(), lambda event: full.append(event.token_id) or True)
        calls.update(float32=0, int8=0)
        stats = generate(engine, ids, 6, Plan(), lambda event: mixed.append(event.token_id)
                         or True, switch=lambda i: 'int8-dynamic' if i >= 2 else '')
    finally:
        for handle in handles:
            handle.remove()
    assert stats.switched_at == 2 and stats.switched_to == 'int8-dynamic'
    assert calls == {'float32': 3, 'int8': 3} and mixed[:3] == full[:3]
    with pytest.raises(ValueError, match='no resident fp4'):
        generate(engine, ids, 2, Plan(precision='fp4'), lambda event: True)
    with pytest.raises(ModelLoadError):
        precision_variant(variant, 'int8-dynamic')  # only float32 -> int8


def test_a_16_bit_copy_decodes_on_a_cast_cache_as_a_model_built_at_16_bit(tiny):
    from transformers import DynamicCache
    variant = precision_variant(tiny, 'bfloat16')
    built = load_model('tiny-random', dtype='bfloat16')
    # A cast copy holds exactly the weights of the model loaded at bfloat16.
    mine, theirs = variant.model.state_dict(), built.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert next(tiny.model.parameters()).dtype == torch.float32  # the original is untouched
    engine = Engine(tiny, variants={'bfloat16': variant})
    ids = prompt_ids(tiny.tokenizer, 'Report the battery level.')

    def reference(switch_at):
        # float32 prefill, and the steps from ``switch_at`` on by the bfloat16 model,
        # its cache cast once.
        tokens, cache = [], DynamicCache()
        with torch.inference_mode():
            out = tiny.model(input_ids=torch.tensor([ids]), past_key_values=cache,
                             use_cache=True)
            for index in range(6):
                token = int(out.logits[0, -1].argmax())
                tokens.append(token)
                model = tiny.model
                if index >= switch_at:
                    model = built.model
                    for layer in cache.layers:
                        layer.keys, layer.values = (layer.keys.to(torch.bfloat16),
                                                    layer.values.to(torch.bfloat16))
                out = model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                            position_ids=torch.tensor([[len(ids) + index]]), use_cache=True)
        return tokens
    got = []
    generate(engine, ids, 6, Plan(precision='bfloat16'),
             lambda event: got.append(event.token_id) or True)
    assert got == reference(0)
    got = []
    stats = generate(engine, ids, 6, Plan(), lambda event: got.append(event.token_id) or True,
                     switch=lambda i: 'bfloat16' if i >= 2 else '')
    assert stats.switched_to == 'bfloat16' and got == reference(2)


def test_a_16_bit_copy_prefills_a_plan_that_asks_and_leaves_the_prefix_cache_alone(tiny):
    from transformers import DynamicCache
    from timebill_ros.runtime.prefix_cache import PrefixCache
    variant = precision_variant(tiny, 'bfloat16')
    built = load_model('tiny-random', dtype='bfloat16')
    prefixes = PrefixCache(block_tokens=4, max_bytes=1 << 24)
    engine = Engine(tiny, variants={'bfloat16': variant}, prefill_chunk=8,
                    prefix_cache=prefixes)
    ids = prompt_ids(tiny.tokenizer, 'Report the battery level of every robot in bay three '
                                     'and the charger each one is on, one line each.')
    assert len(ids) > 16  # three chunks or more

    def reference():  # prefill and every step by the model built at bfloat16, in one pass
        tokens, cache = [], DynamicCache()
        with torch.inference_mode():
            out = built.model(input_ids=torch.tensor([ids]), past_key_values=cache,
                              use_cache=True)
            for index in range(5):
                tokens.append(int(out.logits[0, -1].argmax()))
                out = built.model(input_ids=torch.tensor([[tokens[-1]]]),
                                  past_key_values=cache,
                                  position_ids=torch.tensor([[len(ids) + index]]),
                                  use_cache=True)
        return tokens
    plan = Plan(precision='bfloat16', prefill_precision='bfloat16')
    cache, _, stats = engine.prefill(ids, plan)
    assert cache.layers[0].keys.dtype == torch.bfloat16 and stats.prefix_tokens == 0
    assert len(prefixes) == 0  # bfloat16 keys are not the float32 model's prefix
    got = []
    generate(engine, ids, 5, plan, lambda event: got.append(event.token_id) or True)
    assert got == reference()
    engine.prefill(ids, Plan())  # the float32 prefill stores its blocks as before
    assert len(prefixes) > 0
    with pytest.raises(ValueError, match='no resident float16 variant'):
        engine.prefill(ids, Plan(prefill_precision='float16'))


def test_16_bit_variants_say_where_they_run(tiny):
    with pytest.raises(ModelLoadError, match='float16 decoding runs on CUDA'):
        precision_variant(tiny, 'float16')
    with pytest.raises(ModelLoadError, match='from a float32 model'):
        precision_variant(precision_variant(tiny, 'bfloat16'), 'bfloat16')


def test_each_precision_decodes_with_its_own_thread_count(tiny):
    variant = precision_variant(tiny, 'int8-dynamic')
    engine = Engine(tiny, variants={'int8-dynamic': variant},
                    decode_threads={'float32': 1, 'int8-dynamic': 2})
    assert engine.threads_for('') == 1 and engine.threads_for('mixed') == 1
    ids = prompt_ids(tiny.tokenizer, 'Report the battery level.')
    before = torch.get_num_threads()

    calls = []  # (model, intra-op threads) per forward pass: prefill, then decode steps

    def record(name):
        return lambda module, args: calls.append((name, torch.get_num_threads()))
    hooks = [tiny.model.register_forward_pre_hook(record('float32')),
             variant.model.register_forward_pre_hook(record('int8'))]
    try:
        runs = []
        for plan, n, switch in ((Plan(), 4, None), (Plan(precision='int8-dynamic'), 4, None),
                                (Plan(), 5, lambda i: 'int8-dynamic' if i >= 1 else '')):
            calls.clear()
            generate(engine, ids, n, plan, lambda event: True, switch=switch)
            runs.append(list(calls))
    finally:
        for hook in hooks:
            hook.remove()
    prefill = ('float32', before)  # the prefill keeps the thread's own setting
    assert runs[0] == [prefill] + [('float32', 1)] * 3
    assert runs[1] == [prefill] + [('int8', 2)] * 3
    # Step 0 (after answer token 0) at full precision, the rest on the int8 copy.
    assert runs[2] == [prefill, ('float32', 1)] + [('int8', 2)] * 3
    assert torch.get_num_threads() == before


def test_intra_op_threads_is_scoped():
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with intra_op_threads(0):
        assert torch.get_num_threads() == before


def test_prefill_and_layer_timing_wait_for_the_device(monkeypatch):
    """CUDA runs kernels asynchronously: the timed paths must synchronise (no-op on CPU)."""
    import torch
    from timebill_ros.core.planning import Plan
    from timebill_ros.runtime import early_exit, engine as engine_module, model as model_module
    from timebill_ros.runtime.engine import Engine
    from timebill_ros.runtime.model import load_model
    waited = []
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: waited.append(device))
    model_module.synchronize('cpu')
    assert waited == []
    model_module.synchronize('cuda:0')
    assert waited == ['cuda:0']
    calls = []
    monkeypatch.setattr(engine_module, 'synchronize', calls.append)
    monkeypatch.setattr(early_exit, 'synchronize', calls.append)
    loaded = load_model('tiny-random')
    Engine(loaded).prefill([1500, 1600, 1700], Plan())
    assert calls == ['cpu']
    calls.clear()
    early_exit.measure_layer_times(loaded, n_kv=16, steps=1)
    # Before the first layer and after each layer of both steps (warm-up and measured).
    assert len(calls) == 2 * (1 + len(loaded.model.model.layers))
