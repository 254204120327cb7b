# SPDX-License-Identifier: Apache-2.0
"""Robot commands with JSON Schemas and reference values (the structured-output workload).

Six families, generated from a seed so the set is the same on every machine: an action
from an enum, a target speed, a lane change, a waypoint list, yes/no with a reason, and
fields extracted from a status or log context. ``split(items)`` keeps every fifth item
for tuning (dev) and the rest held out. ``field_accuracy`` scores an answer's fields
against the reference (numbers within 1 %, strings case-insensitive).
"""

from __future__ import annotations

from dataclasses import dataclass
import json
import math
import random

FAMILIES = ('action', 'speed', 'lane', 'waypoints', 'yes_no', 'extract')
ACTIONS = ('stop', 'slow_down', 'proceed', 'reroute')
MODES = ('AUTO', 'MANUAL', 'DOCKED', 'FAULT')
SITUATIONS = {
    'stop': ['A person stepped into the aisle right in front of the robot.',
             'The emergency stop button on the dock was pressed.',
             'A fallen box blocks the whole corridor and there is no way around.'],
    'slow_down': ['The floor ahead is wet after cleaning.',
                  'The robot is entering a zone where people walk beside it.',
                  'Visibility dropped because of dust from the loading bay.'],
    'proceed': ['The path ahead is clear and the light is green.',
                'The crossing is free and no one is nearby.',
                'The aisle is empty and the task is on schedule.'],
    'reroute': ['The main aisle is closed for maintenance; a side aisle is open.',
                'A forklift is parked across the route; another route is free.',
                'The bridge to hall B is blocked; the tunnel route is open.'],
}
YES_NO = [('Is it safe to cross when the pedestrian light is red?', 'no'),
          ('Should the robot stop when a person stands in its path?', 'yes'),
          ('Can the robot drive with its battery at 2 percent?', 'no'),
          ('Should the robot slow down on a wet floor?', 'yes'),
          ('Is it allowed to enter a zone marked as closed?', 'no'),
          ('Should the robot yield to an ambulance?', 'yes'),
          ('Can the robot carry a load above its rated limit?', 'no'),
          ('Should the robot report a detected fault?', 'yes')]


@dataclass(frozen=True)
class SchemaCommand:
    """One command: instruction, context, the schema it must answer in, reference fields."""

    id: str
    family: str
    instruction: str
    context: str
    schema: dict
    reference: dict
    max_new_tokens: int = 96

    @property
    def schema_text(self) -> str:
        """Return the schema as JSON text (the goal's json_schema)."""
        return json.dumps(self.schema)

    @property
    def free_instruction(self) -> str:
        """Return the instruction a free-text goal gets (the keys named in words)."""
        keys = ', '.join(self.schema['properties'])
        return f'{self.instruction} Answer with a JSON object with the keys {keys}.'


def _object(properties: dict, required=None) -> dict:
    return {'type': 'object', 'properties': properties, 'additionalProperties': False,
            'required': list(required if required is not None else properties)}


def _action(rng: random.Random, index: int) -> tuple:
    action = ACTIONS[index % len(ACTIONS)]
    situation = rng.choice(SITUATIONS[action])
    return (f'{situation} Choose the robot\'s next action.', '',
            _object({'action': {'enum': list(ACTIONS)}}), {'action': action})


def _speed(rng: random.Random, index: int) -> tuple:
    speed = rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 60, 80])
    place = rng.choice(['in the school zone', 'on the ramp', 'inside hall C', 'on the highway',
                        'near the loading dock', 'on the test track'])
    return (f'Set the target speed to {speed} km/h {place}.', '',
            _object({'speed_kmh': {'type': 'number', 'minimum': 0, 'maximum': 130}}),
            {'speed_kmh': speed})


def _lane(rng: random.Random, index: int) -> tuple:
    direction = rng.choice(['left', 'right', 'none'])
    text = {'left': 'Move one lane to the left to pass the slow truck.',
            'right': 'Move one lane to the right to take the exit.',
            'none': 'Stay in the current lane; traffic is flowing.'}[direction]
    return (text, '', _object({'change_lane': {'type': 'boolean'},
                               'direction': {'enum': ['left', 'right', 'none']}}),
            {'change_lane': direction != 'none', 'direction': direction})


def _waypoints(rng: random.Random, index: int) -> tuple:
    points = [(rng.randint(0, 20), rng.randint(0, 20)) for _ in range(rng.randint(2, 4))]
    listed = ', '.join(f'({x}, {y})' for x, y in points)
    point = _object({'x': {'type': 'number'}, 'y': {'type': 'number'}})
    return (f'Drive through the waypoints {listed} in this order.', '',
            _object({'waypoints': {'type': 'array', 'items': point, 'minItems': 1,
                                   'maxItems': 8}}),
            {'waypoints': [{'x': x, 'y': y} for x, y in points]})


def _yes_no(rng: random.Random, index: int) -> tuple:
    question, answer = YES_NO[index % len(YES_NO)]
    return (f'{question} Answer yes or no and give a short reason.', '',
            _object({'answer': {'enum': ['yes', 'no']},
                     'reason': {'type': 'string', 'maxLength': 160}}),
            {'answer': answer})


def _extract(rng: random.Random, index: int) -> tuple:
    battery, mode = rng.randint(3, 99), rng.choice(MODES)
    code = f'E-{rng.randint(10, 99)}'
    lines = [f'[{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}] '
             f'{rng.choice(["odometry ok", "lidar ok", "wifi rssi -61 dBm", "map loaded"])}'
             for _ in range(rng.randint(3, 8))]
    lines.insert(rng.randrange(len(lines) + 1), f'[status] battery {battery}%, mode {mode}')
    lines.insert(rng.randrange(len(lines) + 1), f'[error] code {code} reported by the drive')
    return ('Read the robot log above and report the battery level, the mode and the error '
            'code.', '\n'.join(lines),
            _object({'battery_pct': {'type': 'integer', 'minimum': 0, 'maximum': 100},
                     'mode': {'enum': list(MODES)}, 'error_code': {'type': 'string'}}),
            {'battery_pct': battery, 'mode': mode, 'error_code': code})


MAKERS = {'action': _action, 'speed': _speed, 'lane': _lane, 'waypoints': _waypoints,
          'yes_no': _yes_no, 'extract': _extract}


def schema_commands(count: int = 120, seed: int = 0) -> list:
    """Return ``count`` commands, the families in turn, deterministic for ``seed``."""
    items = []
    for index in range(count):
        family = FAMILIES[index % len(FAMILIES)]
        rng = random.Random(f'schema-{seed}-{index}')
        instruction, context, schema, reference = MAKERS[family](rng, index // len(FAMILIES))
        items.append(SchemaCommand(f'{family}-{index:03d}', family, instruction, context,
                                   schema, reference))
    return items


def split(items: list) -> tuple:
    """Return (dev, held_out): every fifth item is for tuning, the rest is held out."""
    return ([item for i, item in enumerate(items) if i % 5 == 0],
            [item for i, item in enumerate(items) if i % 5 != 0])


def parse(text: str):
    """Return the JSON value of an answer (its first object for free text), or None."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    start = text.find('{')
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[start:])[0]
    except ValueError:
        return None


def field_accuracy(item: SchemaCommand, value) -> float:
    """Return the share of the reference's fields the answer got right (0 if not an object)."""
    if not isinstance(value, dict):
        return 0.0
    right = sum(_same(value.get(key), expected) for key, expected in item.reference.items())
    return right / len(item.reference)


def _same(got, expected) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return got is expected
    if isinstance(expected, (int, float)):
        return isinstance(got, (int, float)) and math.isclose(got, expected, rel_tol=0.01)
    if isinstance(expected, str):
        return isinstance(got, str) and got.strip().lower() == expected.lower()
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(
            _same(g, e) if not isinstance(e, dict) else
            isinstance(g, dict) and all(_same(g.get(k), v) for k, v in e.items())
            for g, e in zip(got, expected))
    return got == expected
