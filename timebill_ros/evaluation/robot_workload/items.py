# SPDX-License-Identifier: Apache-2.0
"""The robot workload's item, its kinds and splits, and the committed file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
import json
from pathlib import Path

DATA_FILE = Path(__file__).resolve().parent.parent / 'data' / 'robot_workload.jsonl'
KINDS = ('decision', 'number', 'unit', 'json', 'status', 'checklist', 'announcement',
         'explanation', 'route', 'ifbench')
MATCHES = ('exact', 'number', 'json', 'choice', '')
SPLITS = ('train', 'test')


@dataclass(frozen=True)
class RobotItem:
    """One request of the robot workload, with what scores its answer."""

    id: str
    kind: str
    source: str
    instruction: str
    context: str
    reference: str
    match: str
    split: str


def load(split: str | None = None, path: Path | str | None = None) -> list[RobotItem]:
    """Read the committed workload, optionally only one split."""
    if split is not None and split not in SPLITS:
        raise ValueError(f'unknown split {split!r}; expected one of {SPLITS}')
    items = []
    with open(path or DATA_FILE, encoding='utf-8') as handle:
        for line in handle:
            if line.strip():
                items.append(RobotItem(**json.loads(line)))
    return [item for item in items if split is None or item.split == split]


def dumps(items: list[RobotItem]) -> str:
    """Serialise items as JSON Lines (one object per line, fields in declaration order)."""
    return ''.join(json.dumps(asdict(item), ensure_ascii=False) + '\n' for item in items)
