# SPDX-License-Identifier: Apache-2.0
"""Decision items: one-word answers (STOP or GO, YES or NO, LEFT, RIGHT or STOP, ...)."""

from .drafts import collect, Draft, fmt, ROBOTS, STOPS


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
    return Draft('pedestrian', text, 'STOP' if in_path else 'GO', 'exact')


def _d_yellow_light(rng):
    decel = rng.choice([2, 2.5, 3, 4])
    while True:
        speed = rng.randint(5, 20)
        distance = rng.randint(8, 90)
        stopping = speed * speed / (2 * decel)
        if abs(stopping - distance) >= 4:
            break
    text = (f'Traffic light {distance} m ahead turned yellow; ego speed {speed} m/s, '
            f'comfortable deceleration {fmt(decel)} m/s^2. Stop only if the vehicle can '
            'stop before the line. Answer STOP or GO.')
    return Draft('yellow_light', text, 'STOP' if stopping <= distance else 'GO', 'exact')


def _d_battery(rng):
    level = rng.randint(12, 100)
    need = rng.randint(5, 70)
    reserve = rng.choice([5, 10, 15, 20])
    robot = rng.choice(ROBOTS)
    text = (f'Answer YES or NO: {robot} has {level} % battery, the next mission needs '
            f'{need} % and the reserve is {reserve} %. Can it start the mission?')
    return Draft('battery', text, 'YES' if level >= need + reserve else 'NO', 'exact')


def _d_doors(rng):
    speed = rng.choice(['0.0', '0.0', '0.0', '0.2', '0.8', '2.5'])
    brake = rng.choice(['engaged', 'engaged', 'released'])
    text = (f'Answer YES or NO: may the passenger doors open now? Speed {speed} m/s, '
            f'parking brake {brake}, shuttle at {rng.choice(STOPS)}.')
    ok = float(speed) == 0 and brake == 'engaged'
    return Draft('doors', text, 'YES' if ok else 'NO', 'exact')


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
    return Draft('obstacle', text, reference, 'choice')


def _d_emergency(rng):
    vehicle = rng.choice(['an ambulance', 'a fire truck', 'a police car'])
    siren = rng.random() < 0.6
    state = rng.choice(['with siren and blue lights on', 'with flashing lights and siren']
                       if siren else ['with lights and siren off', 'without siren or lights'])
    side = rng.choice(['from behind', 'in the oncoming lane toward us', 'from the right'])
    text = (f'Answer YIELD or CONTINUE: {vehicle} {state} is approaching {side}, '
            f'{rng.randint(20, 200)} m away.')
    return Draft('emergency', text, 'YIELD' if siren else 'CONTINUE', 'exact')


def _d_speeding(rng):
    limit = rng.choice([20, 30, 40, 50, 60, 80])
    while True:
        speed = rng.randint(30, 250) / 10
        if abs(speed * 3.6 - limit) >= 3:
            break
    text = (f'Answer YES or NO: the speed limit is {limit} km/h and the ego vehicle drives '
            f'at {fmt(speed, 1)} m/s. Is it speeding?')
    return Draft('speeding', text, 'YES' if speed * 3.6 > limit else 'NO', 'exact')


def _d_dock(rng):
    battery = rng.randint(5, 95)
    threshold = rng.choice([15, 20, 25, 30])
    occupied = rng.random() < 0.4
    text = (f'Choose one word, DOCK, WAIT or WORK: warehouse robot battery {battery} %, docking '
            f'threshold {threshold} %, charger {"occupied" if occupied else "free"}. '
            'Dock only when below the threshold and the charger is free.')
    reference = 'WORK' if battery >= threshold else 'WAIT' if occupied else 'DOCK'
    return Draft('dock', text, reference, 'choice')


def drafts(rng):
    """Return 28 distinct decisions, the templates taken in turn."""
    return collect(rng, [_d_pedestrian, _d_yellow_light, _d_battery, _d_doors,
                         _d_obstacle, _d_emergency, _d_speeding, _d_dock], 28)
