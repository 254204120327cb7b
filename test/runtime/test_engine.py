"""Engine on a tiny random-weight model: greedy tokens, streamed text, stop rules."""

import pytest

torch = pytest.importorskip('torch')

from timebill_ros.core.planning import Plan  # noqa: E402
from timebill_ros.runtime.engine import Engine, StreamDecoder  # noqa: E402
from timebill_ros.runtime.model import load_model, ModelLoadError, prompt_ids  # noqa: E402


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


def test_engine_matches_transformers_greedy(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Tell me about robots.')
    engine = Engine(tiny)
    got = []
    stats = engine.generate(ids, 12, Plan(), lambda ev: got.append(ev.token_id) or True)
    ref = tiny.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert got == ref[0, len(ids):].tolist()
    assert stats.tokens == 12 and stats.stop == 'max_tokens'
    assert len(stats.step_times) == 11  # the first token comes from prefill
    assert stats.kv_tokens_after_prefill == len(ids)


def test_hook_false_stops_after_that_token(tiny):
    ids = prompt_ids(tiny.tokenizer, 'Count.')
    seen = []
    stats = Engine(tiny).generate(ids, 50, Plan(), lambda ev: seen.append(ev) or len(seen) < 3)
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
    stats = Engine(loaded).generate(loaded.tokenizer('hello')['input_ids'], 5, Plan(),
                                    lambda event: True)
    assert stats.tokens == 5 or stats.stop == 'eos'
