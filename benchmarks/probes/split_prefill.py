# SPDX-License-Identifier: Apache-2.0
"""Prefill on llama.cpp F16, decode on Q4_1: can a sequence's KV move between contexts.

Can a sequence's KV move between the two contexts (llama_state_seq_get_data /
set_data), what does it cost, and what do the answers become? Both GGUFs hold the same
architecture and an f16 KV cache, so a sequence's state written by one context is read
by the other.

Run: ``. ./env.sh && python -m benchmarks.probes.split_prefill [N]`` (N train-split
robot items, not the benchmark's held-out ones; greedy, 64 tokens at most).
Results: results/engines/split_prefill.
"""

import argparse
import ctypes
import statistics
import time

from timebill_ros.evaluation import robot_workload
from timebill_ros.evaluation.metrics import rouge_l
from timebill_ros.runtime.llama_engine import (
    gguf_variant, LlamaEngine, LlamaModel, LlamaSequence)
from timebill_ros.runtime.model import cache_root, embedded_dir, embedded_gguf


def ids_of(tok, it):
    text = it.instruction + ('\n\n' + it.context if it.context else '')
    chat = tok.apply_chat_template([{'role': 'user', 'content': text}], tokenize=False,
                                   add_generation_prompt=True)
    return tok(chat, add_special_tokens=False)['input_ids']


def engine(tok, fmt):
    model = LlamaModel(gguf_variant(embedded_gguf(), fmt, cache_root()), 4096, 2, 64, 2)
    return LlamaEngine(model, f'llama.cpp-{fmt}', tok, [tok.eos_token_id])


def decode(eng, seq, n_prompt, first, n=64):
    lane = eng.lane(('x',))
    lane.join('g', seq, n_prompt)
    out, t0 = [first], time.monotonic()
    while len(out) < n and out[-1] not in eng.eos_ids:
        out.append(eng.pick(lane.step({'g': out[-1]})['g'].logits))
    spent = time.monotonic() - t0
    lane.leave('g')
    return out, spent / max(1, len(out) - 1)


def move(src, dst, seq_id):
    """Copy a sequence's KV from one context into a free sequence of the other."""
    api, t0 = src.model._api, time.monotonic()
    size = api.llama_state_seq_get_size(src.model._ctx, seq_id)
    state = (ctypes.c_uint8 * size)()
    assert api.llama_state_seq_get_data(src.model._ctx, state, size, seq_id) == size
    target = dst.model.acquire()
    assert api.llama_state_seq_set_data(dst.model._ctx, state, size, target) == size
    src.model.release(seq_id)
    return LlamaSequence(target), time.monotonic() - t0


def main(argv=None) -> None:
    """Run every item on F16, on Q4_1 and split (F16 prefill, Q4_1 decode); print medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('items', nargs='?', type=int, default=24, help='train items')
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(embedded_dir()))
    items = robot_workload.load('train')[:args.items]
    f16, q41 = engine(tok, 'f16'), engine(tok, 'q4_1')
    for eng in (f16, q41):
        eng.warm_up()
    rows = []
    for it in items:
        ids = ids_of(tok, it)
        row = {'item': it.id, 'prompt': len(ids)}
        answers = {}
        for name, eng in (('f16', f16), ('q4_1', q41)):
            t0 = time.monotonic()
            seq, logits, _ = eng.prefill(ids, None)
            row[f'{name}_prefill'] = time.monotonic() - t0
            answers[name], row[f'{name}_step'] = decode(eng, seq, len(ids), eng.pick(logits))
        t0 = time.monotonic()
        seq, logits, _ = f16.prefill(ids, None)
        row['split_prefill'] = time.monotonic() - t0
        seq, row['move'] = move(f16, q41, seq.seq_id)
        answers['split'], row['split_step'] = decode(q41, seq, len(ids), f16.pick(logits))
        text = {k: tok.decode(v, skip_special_tokens=True) for k, v in answers.items()}
        row.update(split_vs_f16=rouge_l(text['split'], text['f16']),
                   q4_1_vs_f16=rouge_l(text['q4_1'], text['f16']),
                   lens=tuple(len(answers[k]) for k in ('f16', 'q4_1', 'split')))
        rows.append(row)
        print(' '.join(f'{k}={v:.4f}' if isinstance(v, float) else f'{k}={v}'
                       for k, v in row.items()), flush=True)

    print(f'\n{len(rows)} train items, medians:')
    for key in ('prompt', 'f16_prefill', 'q4_1_prefill', 'split_prefill', 'move', 'f16_step',
                'q4_1_step', 'split_step'):
        print(f'  {key}: {statistics.median(r[key] for r in rows):.4f}')
    for key in ('split_vs_f16', 'q4_1_vs_f16'):
        print(f'  {key} ROUGE-L mean: {statistics.mean(r[key] for r in rows):.3f}')


if __name__ == '__main__':
    main()
