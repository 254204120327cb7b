# SPDX-License-Identifier: Apache-2.0
"""JSON items (kind ``json``): structured commands from a natural-language order."""

import json

from .drafts import collect, Draft, fmt


def _json_draft(sub, keys, order, reference):
    text = f'Return only JSON with keys {keys}. Order: {order}'
    return Draft(sub, text, json.dumps(reference), 'json')


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
        f'go to x {fmt(x, 1)}, y {fmt(y, 1)}, facing {yaw} degrees.',
        f'navigate to ({fmt(x, 1)}, {fmt(y, 1)}) with heading {yaw} degrees.',
        f'drive to the point x={fmt(x, 1)} m, y={fmt(y, 1)} m and end with yaw {yaw} deg.'])
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


def drafts(rng):
    """Return 28 distinct JSON commands, the templates taken in turn."""
    return collect(rng, [_j_drive, _j_goal, _j_device, _j_lights, _j_pick,
                         _j_speed_limit, _j_follow], 28)
