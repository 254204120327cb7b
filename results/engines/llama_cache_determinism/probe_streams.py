"""probe.py again with a KV stream per sequence, the held prompt copied whole and cropped,
and reuse cut to whole chunks (patched here, not in the node)."""
from pathlib import Path

import timebill_ros.runtime.llama_engine as le
# probe.py's set-up (its loop over hold_prefix is left out).
exec((Path(__file__).parent / 'probe.py').read_text().split('for hold in')[0])
import llama_cpp
real_init = llama_cpp.llama_init_from_model
def init(model, params):
    params.kv_unified = False
    params.n_ctx = params.n_ctx * params.n_seq_max
    return real_init(model, params)
le._llama().llama_init_from_model = init
def reuse(self, seq_id, ids, limit):
    with self._lock:
        same = self._shared_locked(ids, limit) // self.chunk * self.chunk
        if same:
            self._api.llama_memory_seq_cp(self._memory, self._holder, seq_id, -1, -1)
            self._api.llama_memory_seq_rm(self._memory, seq_id, same, -1)
        return same
def hold(self, seq_id, ids):
    with self._lock:
        self._api.llama_memory_seq_rm(self._memory, self._holder, -1, -1)
        self._api.llama_memory_seq_cp(self._memory, seq_id, self._holder, -1, -1)
        self._api.llama_memory_seq_rm(self._memory, self._holder, len(ids), -1)
        self._held = list(ids)
LlamaModel.reuse, LlamaModel.hold = reuse, hold
model = LlamaModel(gguf_variant(embedded_gguf(), 'q4_1', cache_root()), 8192, 2, 64, 2, hold_prefix=True)
engine = LlamaEngine(model, 'llama.cpp-q4_1', tok, [tok.eos_token_id])
for it in [i for i in items if i.id in ('number-016', 'json-007', 'status-019')]:
    ids = ids_of(it)
    a, p1 = answer(engine, ids); b, p2 = answer(engine, ids)
    answer(engine, ids_of(items[0])); c, p3 = answer(engine, ids)
    print('non-unified', it.id, len(ids), 'reused', p1, p2, p3, 'lens', len(a), len(b), len(c), 'same', (a == b, a == c), flush=True)
