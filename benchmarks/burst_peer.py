# SPDX-License-Identifier: Apache-2.0
"""What a user would run instead of the node on the same burst: llama.cpp first come first served.

The peer is llama-cpp-python's own generation loop on the node's GGUF (one slot), serving
goals in arrival order, greedy. Its client cancels each goal at its deadline: a goal
whose deadline passed while it waited is dropped before it starts, and one running at
its deadline stops at its next token (killed: a miss). Prompts are tokenized before the
burst (the peer's tokenizing is not counted). ``fastest_service`` times each distinct
prompt alone on the same loop: the offline yardstick's service times on the fastest
option (llama.cpp Q4_1 is the node's fastest).
"""

from __future__ import annotations

import time

from benchmarks.bench_overhead import node_model_params


def load_peer(weight_format: str = 'q4_1', context: int = 2048):
    """Return (llama-cpp-python Llama on the node's GGUF, tokenizer-side prompt_ids)."""
    import os
    from llama_cpp import Llama
    from timebill_ros.runtime.llama_engine import gguf_variant
    from timebill_ros.runtime.model import cache_root, embedded_gguf, load_model, prompt_ids
    loaded = load_model('embedded')
    with node_model_params():
        llm = Llama(str(gguf_variant(embedded_gguf(), weight_format, cache_root())),
                    n_ctx=context, n_threads=os.cpu_count(), verbose=False)
    return llm, lambda text: prompt_ids(loaded.tokenizer, text)


def generate_until(llm, ids, max_new: int, deadline: float) -> tuple:
    """Greedy-decode until end, ``max_new`` tokens or the deadline; return (tokens, ended)."""
    eos, tokens = llm.token_eos(), 0
    for token in llm.generate(list(ids), top_k=1, temp=0.0, reset=True):
        if time.monotonic() > deadline:
            return tokens, 'killed'
        if token == eos:
            return tokens, 'completed'
        tokens += 1
        if tokens >= max_new:
            return tokens, 'completed'
    return tokens, 'completed'


def fcfs_burst(llm, prompts: list, budgets: list, max_new: int) -> list:
    """Serve every prompt in arrival order from one start; return a row per goal."""
    rows, start = [], time.monotonic()
    for index, (ids, budget) in enumerate(zip(prompts, budgets)):
        deadline = start + budget
        began = time.monotonic()
        if began >= deadline:
            rows.append({'index': index, 'budget_s': budget, 'outcome': 'CANCELED',
                         'met': False, 'end_s': began - start})
            continue
        tokens, ended = generate_until(llm, ids, max_new, deadline)
        end = time.monotonic()
        met = ended == 'completed' and end <= deadline
        rows.append({'index': index, 'budget_s': budget, 'tokens': tokens,
                     'outcome': 'COMPLETED' if ended == 'completed' else 'KILLED',
                     'met': met, 'end_s': end - start, 'late_s': end - deadline})
    return rows


def fastest_service(llm, prompts: dict, max_new: int) -> dict:
    """Time each distinct prompt alone (text -> seconds), end or ``max_new`` tokens."""
    times = {}
    for text, ids in prompts.items():
        began = time.monotonic()
        generate_until(llm, ids, max_new, float('inf'))
        times[text] = time.monotonic() - began
    return times
