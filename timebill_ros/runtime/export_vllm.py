# SPDX-License-Identifier: Apache-2.0
"""A copy of the node's dequantised model that `vllm serve` reads and decodes right.

The embedded model is dequantised from a GGUF (runtime.model). Its tokenizer files come
from that conversion: ``tokenizer_config.json`` names CodeLlamaTokenizer and
``tokenizer.json`` decodes with ByteFallback, Fuse, Replace and ByteLevel in a row. The
transformers the node pins reads that right; the newer one vLLM needs does not and
returns byte-level markers ("TheĠworldĠis", issue 31). The copy keeps the weights
(a hard link or a symlink) and the chat template, and writes a GPT-2 style tokenizer:
ByteLevel decoding only, ``<|im_end|>`` as end of answer, the template inline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import shutil

KEPT = ('config.json', 'generation_config.json', 'chat_template.jinja')
END_OF_ANSWER = '<|im_end|>'


def export_for_vllm(source: Path, target: Path) -> Path:
    """Write the vLLM-ready copy of model directory ``source`` to ``target``; return it.

    Raise FileNotFoundError when ``source`` lacks a file the copy needs.
    """
    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        shutil.copyfile(source / name, target / name)
    _link(source / 'model.safetensors', target / 'model.safetensors')
    tokenizer = json.loads((source / 'tokenizer.json').read_text(encoding='utf-8'))
    tokenizer['decoder'] = {'type': 'ByteLevel', 'add_prefix_space': True,
                            'trim_offsets': True, 'use_regex': True}
    (target / 'tokenizer.json').write_text(json.dumps(tokenizer), encoding='utf-8')
    config = json.loads((source / 'tokenizer_config.json').read_text(encoding='utf-8'))
    kept = {key: config[key] for key in ('added_tokens_decoder', 'model_max_length')
            if key in config}
    template = (source / 'chat_template.jinja').read_text(encoding='utf-8')
    (target / 'tokenizer_config.json').write_text(json.dumps({
        **kept, 'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': '<|im_start|>',
        'eos_token': END_OF_ANSWER, 'pad_token': END_OF_ANSWER, 'unk_token': '<|endoftext|>',
        'add_prefix_space': False, 'clean_up_tokenization_spaces': False,
        'chat_template': template}, indent=1), encoding='utf-8')
    return target


def _link(source: Path, target: Path) -> None:
    """Point ``target`` at ``source`` without copying (hard link, else symlink)."""
    if target.exists() or target.is_symlink():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        target.symlink_to(source.resolve())
