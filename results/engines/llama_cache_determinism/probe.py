"""Does the same prompt on the same llama.cpp Q4_1 engine answer the same with and without held cells?"""
from timebill_ros.runtime.llama_engine import LlamaModel, LlamaEngine, gguf_variant
from timebill_ros.runtime.model import embedded_gguf, cache_root
from timebill_ros.evaluation import robot_workload
from transformers import AutoTokenizer
from timebill_ros.runtime.model import embedded_dir
tok = AutoTokenizer.from_pretrained(str(embedded_dir()))
items = robot_workload.load('test')
ids_of = lambda it: tok(tok.apply_chat_template([{'role': 'user', 'content': it.instruction + ('\n\n' + it.context if it.context else '')}], tokenize=False, add_generation_prompt=True), add_special_tokens=False)['input_ids']

def answer(engine, ids, n=80):
    seq, logits, stats = engine.prefill(ids, None)
    lane = engine.lane(('x',)); lane.join('g', seq, len(ids))
    out = [engine.pick(logits)]
    for _ in range(n - 1):
        if out[-1] in engine.eos_ids: break
        out.append(engine.pick(lane.step({'g': out[-1]})['g'].logits))
    lane.leave('g')
    return out, stats.prefix_tokens

for hold in (True, False):
    model = LlamaModel(gguf_variant(embedded_gguf(), 'q4_1', cache_root()), 8192, 2, 64, 2, hold_prefix=hold)
    engine = LlamaEngine(model, 'llama.cpp-q4_1', tok, [tok.eos_token_id])
    diffs = 0
    for it in [i for i in items if i.id in ('unit-017', 'status-019', 'number-016', 'decision-008', 'json-007')]:
        ids = ids_of(it)
        a, p1 = answer(engine, ids)
        b, p2 = answer(engine, ids)          # the prompt now held (reuse n-1)
        other = ids_of(items[0]); answer(engine, other)
        c, p3 = answer(engine, ids)          # after another prompt's cells came and went
        same = (a == b, a == c)
        diffs += (not all(same))
        print('hold', hold, it.id, len(ids), 'reused', p1, p2, p3, 'lens', len(a), len(b), len(c), 'same', same, flush=True)
    model.close()
