# SPDX-License-Identifier: Apache-2.0
"""The robot workload package makes the items the single module made, seed for seed.

``data/robot_items.sha256.json`` was computed from ``evaluation/robot_workload.py``
before it became a package (issue 51): for each case (the committed file, the generator
at a seed, fresh and extra train items, the long-route task items built from the
workload's route helpers) the item count and, per kind, the SHA-256 of the items' fields.
A change to a template, a draw or the split shows as the case and kind that differ.
"""

from dataclasses import asdict
import hashlib
import itertools
import json
from pathlib import Path

import pytest

from timebill_ros.evaluation import robot_workload as rw
from timebill_ros.evaluation import tasks

FIXTURE = Path(__file__).resolve().parent / 'data' / 'robot_items.sha256.json'
SEEDS = (0, 7, 41, 43, 47)


def _cases():
    """Return {case: zero-argument function returning (kind, fields) pairs}."""
    cases = {'load': lambda: rw.load()}
    for seed in SEEDS:
        cases[f'build_{seed}'] = lambda seed=seed: rw.build(seed)
    for seed, split in itertools.product((7, 43), rw.SPLITS):
        cases[f'fresh_{seed}_{split}'] = lambda seed=seed, split=split: rw.fresh(seed, split)
    cases['extra_train_101'] = lambda: rw.extra_train([101])
    as_pairs = {name: (lambda make=make: [(item.kind, asdict(item)) for item in make()])
                for name, make in cases.items()}
    as_pairs['tasks_route_0'] = lambda: [
        ('route', list(row)) for row in itertools.islice(tasks._route_items(0), 24)]
    return as_pairs


def digest(pairs) -> dict:
    """Return the count and, per kind in first-seen order, the SHA-256 of its items' fields."""
    by_kind = {}
    for kind, fields in pairs:
        text = json.dumps(fields, ensure_ascii=False, sort_keys=True)
        by_kind.setdefault(kind, hashlib.sha256()).update(text.encode('utf-8') + b'\n')
    return {'count': len(pairs),
            'kinds': {kind: sha.hexdigest() for kind, sha in by_kind.items()}}


def digests() -> dict:
    """Return the digest of every case (what the fixture holds)."""
    return {name: digest(make()) for name, make in _cases().items()}


@pytest.fixture(scope='module')
def expected():
    return json.loads(FIXTURE.read_text(encoding='utf-8'))


@pytest.mark.parametrize('case', sorted(_cases()))
def test_items_are_those_of_the_single_module(case, expected):
    assert digest(_cases()[case]()) == expected[case]


def test_every_case_is_checked(expected):
    assert sorted(expected) == sorted(_cases())
