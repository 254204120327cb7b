# SPDX-License-Identifier: Apache-2.0
"""What the generators of the robot workload share: the draft of an item and helpers.

Each generator module (one per kind of item) returns a list of ``Draft``: the template
variant (``sub``), the instruction, and the reference, match and context when it has
them. ``generator.build`` turns drafts into items.
"""

from collections import namedtuple
import math
import random

Draft = namedtuple('Draft', 'sub instruction reference match context', defaults=('', '', ''))


def fmt(value: float, decimals: int = 6) -> str:
    text = f'{value:.{decimals}f}'
    if '.' in text:
        text = text.rstrip('0').rstrip('.')
    return '0' if text in ('-0', '') else text


def fixed(value: float, decimals: int) -> str:
    return f'{value:.{decimals}f}'


def near_half(value: float, decimals: int) -> bool:
    """Tell whether rounding ``value`` to ``decimals`` is a tie (half up and half even differ)."""
    scaled = value * 10 ** decimals
    return abs(scaled - math.floor(scaled) - 0.5) < 1e-6


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def collect(rng: random.Random, makers, count: int) -> list[Draft]:
    """Draw ``count`` distinct drafts, cycling through the makers for balance."""
    drafts, seen, tries = [], set(), 0
    while len(drafts) < count:
        draft = makers[len(drafts) % len(makers)](rng)
        tries += 1
        if tries > 200 * count:
            raise RuntimeError('templates cannot produce enough distinct items')
        key = (draft.instruction, draft.context)
        if key not in seen:
            seen.add(key)
            drafts.append(draft)
    return drafts


ROBOTS = ('the delivery robot', 'the shuttle', 'the forklift AGV', 'the sidewalk robot',
          'the robotaxi', 'the tugger train', 'the inspection rover', 'the hospital cart robot',
          'the yard tractor', 'the campus bus')
STOPS = ('Central Station', 'Harbor Gate', 'University North', 'City Hall',
         'Airport Terminal 2', 'Riverside Park', 'Market Square', 'Hospital East',
         'Tech Campus', 'Old Town', 'Stadium West', 'Science Park', 'Ferry Terminal',
         'Library Square', 'Depot South')
_NUMBER_ONLY = ('Answer with the number only.', 'Reply with the number only.',
                'Number only, no units.')


def number_only(rng: random.Random) -> str:
    return rng.choice(_NUMBER_ONLY)


def rounded(decimals):
    return f'Answer with the number only, rounded to {decimals} decimal{"s" * (decimals > 1)}.'
