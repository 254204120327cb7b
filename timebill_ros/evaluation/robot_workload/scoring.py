# SPDX-License-Identifier: Apache-2.0
"""Score an answer to a robot workload item against its reference.

``score`` checks items that have a reference (``match``: exact, number, json, choice)
and returns None for free text, whose quality is measured elsewhere against the
model's own unconstrained answer.
"""

from __future__ import annotations

import json
import re
import string

from .items import RobotItem

ABS_TOL = 0.01
REL_TOL = 1e-6


def score(item: RobotItem, answer: str) -> float | None:
    """Return 1.0 or 0.0 for an answer to an item with a reference, None for free text."""
    if not item.reference:
        return None
    scorer = _SCORERS.get(item.match)
    if scorer is None:
        raise ValueError(f'item {item.id}: unknown match {item.match!r}')
    return 1.0 if scorer(item, answer or '') else 0.0


def options(instruction: str) -> list[str]:
    """Return the upper-case option words listed as 'A, B or C' in an instruction."""
    found = _OPTIONS.search(instruction)
    return re.findall(r'[A-Z]{2,}', found.group()) if found else []


def first_number(text: str) -> float | None:
    """Return the first number in a text (thousands commas allowed), or None."""
    found = _NUMBER.search(re.sub(r'(?<=\d),(?=\d{3}(?!\d))', '', text))
    return float(found.group()) if found else None


def first_object(text: str) -> dict | None:
    """Return the first ``{...}`` block of a text that parses as a JSON object, or None."""
    decoder = json.JSONDecoder()
    for brace in re.finditer(r'\{', text):
        try:
            value, _ = decoder.raw_decode(text, brace.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


_PUNCT = string.punctuation + string.whitespace + '\u2018\u2019\u201c\u201d\u00ab\u00bb'
_OPTIONS = re.compile(r'\b[A-Z]{2,}(?:, [A-Z]{2,})*,? or [A-Z]{2,}\b')
_NUMBER = re.compile(r'[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?')
_ANSWER_PREFIX = re.compile(r'^(?:(?:final |the )?answer(?: is)?\s*[:\-]?\s*)', re.IGNORECASE)


def _norm(text: str) -> str:
    return ' '.join(text.strip(_PUNCT).lower().split())


def _close(value: float, reference: float) -> bool:
    return abs(value - reference) <= max(REL_TOL * abs(reference), ABS_TOL + 1e-9)


def _match_exact(item: RobotItem, answer: str) -> bool:
    lines = [line for line in answer.splitlines() if line.strip(_PUNCT)]
    if not lines:
        return False
    first = _norm(_ANSWER_PREFIX.sub('', _norm(lines[0])))
    reference = _norm(item.reference)
    if not first:
        return False
    if first == reference or first.split()[0].strip(_PUNCT) == reference:
        return True
    return re.match(re.escape(reference) + r'(?!\w)', first) is not None


def _match_number(item: RobotItem, answer: str) -> bool:
    value = first_number(answer)
    return value is not None and _close(value, float(item.reference))


def _equal(reference, value) -> bool:
    if isinstance(reference, bool) or reference is None:
        return value is reference
    if isinstance(reference, (int, float)):
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and _close(float(value), float(reference)))
    if isinstance(reference, str):
        return isinstance(value, str) and value.strip().lower() == reference.strip().lower()
    if isinstance(reference, dict):
        return isinstance(value, dict) and all(
            key in value and _equal(ref, value[key]) for key, ref in reference.items())
    if isinstance(reference, list):
        return (isinstance(value, list) and len(value) == len(reference)
                and all(_equal(ref, got) for ref, got in zip(reference, value)))
    return value == reference


def _match_json(item: RobotItem, answer: str) -> bool:
    value = first_object(answer)
    return value is not None and _equal(json.loads(item.reference), value)


def _match_choice(item: RobotItem, answer: str) -> bool:
    first, first_at = None, None
    for option in options(item.instruction) or [item.reference]:
        found = re.search(r'(?<!\w)%s(?!\w)' % re.escape(option), answer, re.IGNORECASE)
        if found and (first_at is None or found.start() < first_at):
            first, first_at = option, found.start()
    return first is not None and first.lower() == item.reference.lower()


_SCORERS = {'exact': _match_exact, 'number': _match_number, 'json': _match_json,
            'choice': _match_choice}
