"""probe.py on the node's LlamaModel as shipped since b5f6b20 (a KV stream per sequence,
the held prompt kept as llama.cpp's sequence state, reuse cut to whole chunks): do
answers repeat, how large is the held state, and what does keeping it cost?"""
from pathlib import Path
import time

exec((Path(__file__).parent / 'probe.py').read_text().split('for hold in')[0])
model = LlamaModel(gguf_variant(embedded_gguf(), 'q4_1', cache_root()), 8192, 2, 64, 2,
                   hold_prefix=True)
engine = LlamaEngine(model, 'llama.cpp-q4_1', tok, [tok.eos_token_id])
for it in [i for i in items if i.id in ('unit-017', 'status-019', 'number-016', 'decision-008',
                                         'json-007')]:
    ids = ids_of(it)
    a, p1 = answer(engine, ids)
    b, p2 = answer(engine, ids)
    answer(engine, ids_of(items[0]))
    c, p3 = answer(engine, ids)
    held = 0 if model._held_state is None else len(model._held_state)
    print(it.id, len(ids), 'reused', p1, p2, p3, 'lens', len(a), len(b), len(c),
          'same', (a == b, a == c), flush=True)
# Keeping the longest prompt: its state's size and the time llama.cpp takes to copy it.
ids = ids_of(next(i for i in items if i.id == 'status-019'))
sequence, _, _ = engine.prefill(ids, None)
model.forget()
t0 = time.monotonic()
model.hold(sequence.seq_id, ids)
print(f'hold {len(ids)} tokens: {len(model._held_state)} bytes '
      f'({len(model._held_state) / len(ids) / 1e3:.1f} kB a token), '
      f'{1e3 * (time.monotonic() - t0):.0f} ms')
model.release(sequence.seq_id)
