# SPDX-License-Identifier: Apache-2.0
"""Number items: arithmetic on robot quantities and counting, answered with a number."""

from .drafts import cap, collect, Draft, fmt, number_only, ROBOTS, STOPS


def _n_travel_time(rng):
    speed, seconds = rng.randint(1, 12), rng.randint(4, 90)
    question = rng.choice(['How many seconds does it take?',
                           'How long does the trip take, in seconds?'])
    text = (f'{cap(rng.choice(ROBOTS))} drives {speed * seconds} m at a constant {speed} m/s. '
            f'{question} {number_only(rng)}')
    return Draft('travel_time', text, str(seconds), 'number')


def _n_battery(rng):
    drain, hours = rng.randint(2, 12), rng.randint(1, 5)
    level = rng.randint(drain * hours + 5, 100)
    text = (f'The battery of {rng.choice(ROBOTS)} is at {level} % and drains {drain} % per '
            f'hour. What is the level in percent after {hours} hours? {number_only(rng)}')
    return Draft('battery', text, str(level - drain * hours), 'number')


def _n_waypoints(rng):
    total = rng.randint(8, 90)
    done = rng.randint(1, total - 1)
    text = rng.choice([
        f'The mission has {total} waypoints and the robot has reached {done} of them. '
        'How many waypoints are left?',
        f'Patrol route: {total} waypoints in total, {done} already visited. '
        'How many remain?'])
    return Draft('waypoints', f'{text} {number_only(rng)}', str(total - done), 'number')


_OBJECTS = {'pallet': 'pallets', 'box': 'boxes', 'traffic cone': 'traffic cones',
            'person': 'people', 'cart': 'carts', 'forklift': 'forklifts', 'bicycle': 'bicycles'}


def _n_count(rng):
    kinds = rng.sample(sorted(_OBJECTS), rng.randint(3, 4))
    detections = kinds + [rng.choice(kinds) for _ in range(rng.randint(3, 8))]
    rng.shuffle(detections)
    target = rng.choice(detections)
    text = (f'Detections: {", ".join(detections)}. How many {_OBJECTS[target]} are in this '
            f'list? {number_only(rng)}')
    return Draft('count', text, str(detections.count(target)), 'number')


def _n_eta(rng):
    speed = rng.choice([12, 18, 24, 30, 36, 42, 48, 54, 60])
    minutes = rng.randint(2, 25)
    tenths = speed // 6 * minutes
    text = (f'The shuttle is {fmt(tenths / 10, 1)} km from {rng.choice(STOPS)} and drives '
            f'at {speed} km/h. In how many minutes does it arrive? {number_only(rng)}')
    return Draft('eta', text, str(minutes), 'number')


def _n_payload(rng):
    mass = rng.choice([5, 8, 10, 12, 15, 20, 25])
    capacity = rng.choice([100, 150, 200, 250, 300, 500])
    loaded = rng.randint(1, capacity // mass - 1)
    text = (f'A cargo robot with a {capacity} kg payload limit carries {loaded} boxes of '
            f'{mass} kg each. How many more such boxes can it load? {number_only(rng)}')
    return Draft('payload', text, str((capacity - loaded * mass) // mass), 'number')


def _n_lidar_scans(rng):
    rate, seconds = rng.choice([5, 10, 15, 20]), rng.randint(2, 60)
    text = (f'A lidar spins at {rate} Hz. How many full scans does it produce in {seconds} '
            f'seconds? {number_only(rng)}')
    return Draft('lidar_scans', text, str(rate * seconds), 'number')


def drafts(rng):
    """Return 28 distinct number questions, the templates taken in turn."""
    return collect(rng, [_n_travel_time, _n_battery, _n_waypoints, _n_count, _n_eta,
                         _n_payload, _n_lidar_scans], 28)
