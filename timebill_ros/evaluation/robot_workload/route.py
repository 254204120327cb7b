# SPDX-License-Identifier: Apache-2.0
"""Route items: route descriptions (3 to 150 segments) with counting and look-up questions.

The long-route task (``evaluation.tasks``) draws its routes and questions here too.
"""

from collections import namedtuple

from .drafts import Draft, fixed, near_half, number_only, rounded, STOPS

_STREET_STEMS = ('Maple', 'Oak', 'Elm', 'Cedar', 'Birch', 'Willow', 'Harbor', 'Mill',
                 'Station', 'Church', 'Lake', 'River', 'Hill', 'Park', 'Market', 'King',
                 'Queen', 'Bridge', 'Garden', 'Forest', 'Meadow', 'Spring', 'Castle', 'Chapel',
                 'Orchard', 'Quarry', 'Foundry', 'Canal', 'Beacon', 'Linden', 'Poplar', 'Ash',
                 'Hazel', 'Juniper', 'Rowan', 'Sterling')
_STREET_TYPES = ('Street', 'Avenue', 'Road', 'Lane', 'Boulevard', 'Drive', 'Way')
_LIMITS = (20, 30, 40, 50, 60, 70, 80)
_ORDINALS = ('first', 'second', 'third', 'fourth', 'fifth')
_ROUTE_QUESTIONS = ('left_turns', 'right_turns', 'street_after_turn', 'total_km',
                    'drive_time', 'segments_over', 'final_street', 'longest_segment')
_Segment = namedtuple('_Segment', 'action street tens limit')


def draw_route(rng, count):
    """Return ``count`` segments: action, street, length in tens of metres, limit in km/h."""
    streets = [f'{stem} {kind}' for stem in _STREET_STEMS for kind in _STREET_TYPES]
    rng.shuffle(streets)
    segments = [_Segment('start', streets.pop(), rng.randint(5, 240), rng.choice(_LIMITS))]
    for _ in range(count - 1):
        draw = rng.random()
        action = ('left' if draw < 0.3 else 'right' if draw < 0.6 else
                  'straight' if draw < 0.75 else 'continue')
        previous = segments[-1]
        street = previous.street if action == 'continue' else streets.pop()
        limit = rng.choice(_LIMITS)
        segments.append(_Segment(action, street, rng.randint(5, 240), limit))
    return segments


def route_text(rng, segments):
    start, goal = rng.sample(STOPS, 2)
    lines = [f'Route R{rng.randint(100, 999)}: {start} to {goal}']
    for number, seg in enumerate(segments, 1):
        verb = {'start': f'Start on {seg.street} heading '
                         f'{rng.choice(["north", "south", "east", "west"])}',
                'left': f'Turn left onto {seg.street}', 'right': f'Turn right onto {seg.street}',
                'straight': f'Go straight across the intersection onto {seg.street}',
                'continue': f'Continue on {seg.street}'}[seg.action]
        lines.append(f'{number}. {verb}, {seg.tens / 100:.2f} km, limit {seg.limit} km/h')
    lines.append(f'{len(segments) + 1}. Arrive at {goal}')
    return '\n'.join(lines)


def route_question(rng, question, segments):
    """Return (instruction, reference, match) or None when the route cannot answer it."""
    if question in ('left_turns', 'right_turns'):
        side = question.split('_')[0]
        count = sum(seg.action == side for seg in segments)
        return (f'How many {side} turns are on this route? {number_only(rng)}', str(count),
                'number')
    if question == 'street_after_turn':
        side = rng.choice(['left', 'right'])
        turns = [seg.street for seg in segments if seg.action == side]
        if not turns:
            return None
        nth = rng.randint(1, min(len(turns), len(_ORDINALS)))
        return (f'What is the name of the street after the {_ORDINALS[nth - 1]} {side} turn? '
                'Answer with the street name only.', turns[nth - 1], 'exact')
    if question == 'total_km':
        decimals = rng.choice([1, 2])
        total = sum(seg.tens for seg in segments) / 100
        if near_half(total, decimals):
            return None
        return (f'What is the total route length in km? {rounded(decimals)}',
                fixed(total, decimals), 'number')
    if question == 'drive_time':
        minutes = sum(seg.tens / 100 / seg.limit * 60 for seg in segments)
        if near_half(minutes, 1):
            return None
        return ('How many minutes does the route take when every segment is driven exactly '
                f'at its speed limit? {rounded(1)}', fixed(minutes, 1), 'number')
    if question == 'segments_over':
        bound = rng.choice(_LIMITS[1:-1])
        count = sum(seg.limit > bound for seg in segments)
        return (f'How many segments have a speed limit above {bound} km/h? '
                f'{number_only(rng)}', str(count), 'number')
    if question == 'final_street':
        return ('On which street does the route end? Answer with the street name only.',
                segments[-1].street, 'exact')
    longest = max(seg.tens for seg in segments)
    streets = {seg.street for seg in segments if seg.tens == longest}
    if len(streets) != 1 or len(segments) < 2:
        return None
    return ('Which street has the longest single segment of this route? Answer with the '
            'street name only.', streets.pop(), 'exact')


def drafts(rng):
    """Return 28 routes (24 of 3 to 30 segments, 60 to 150), a question each in turn."""
    sizes = [rng.randint(3, 30) for _ in range(24)] + [60, 90, 120, 150]
    rng.shuffle(sizes)
    made = []
    for index, size in enumerate(sizes):
        question = _ROUTE_QUESTIONS[index % len(_ROUTE_QUESTIONS)]
        while True:
            segments = draw_route(rng, size)
            asked = route_question(rng, question, segments)
            if asked is not None:
                break
        made.append(Draft(question, asked[0], asked[1], asked[2],
                          route_text(rng, segments)))
    return made
