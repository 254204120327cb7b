# SPDX-License-Identifier: Apache-2.0
"""Free-text items: checklists, passenger announcements and explanations."""

from .drafts import collect, Draft, STOPS


_VEHICLES = ('an autonomous shuttle', 'a sidewalk delivery robot', 'a warehouse AMR',
             'a robotaxi', 'an autonomous forklift', 'an agricultural field robot',
             'an airport baggage tractor', 'a hospital transport robot', 'a mining haul truck',
             'a campus shuttle bus')
_SITUATIONS = ('before the first run of the day', 'after a lidar replacement',
               'before driving in heavy rain', 'after an over-the-air software update',
               'before a night shift', 'after a minor collision', 'on a freezing winter morning',
               'after a battery swap', 'after a map update',
               'after it was parked outdoors for a week')


def checklist(rng):
    """Return 24 checklist requests, one per drawn vehicle and situation."""
    pairs = rng.sample([(v, s) for v in _VEHICLES for s in _SITUATIONS], 24)
    made = []
    for vehicle, situation in pairs:
        most = rng.choice([3, 4, 5, 5])
        text = rng.choice([
            f'List the pre-drive checks for {vehicle} {situation}, as a numbered list of at '
            f'most {most} items.',
            f'Give at most {most} numbered checks an operator of {vehicle} must do '
            f'{situation}.',
            f'What should be checked on {vehicle} {situation}? Answer as a numbered list of at '
            f'most {most} items.'])
        made.append(Draft('pre_drive', text))
    return made


_REASONS = ('road works', 'a traffic accident ahead', 'heavy snow', 'a blocked lane',
            'a street festival', 'a signal failure', 'flooding on the road')


def _a_arrival(rng):
    return Draft('arrival', f'Write a one-sentence announcement telling passengers the shuttle '
                 f'stops at {rng.choice(STOPS)} in {rng.randint(1, 9)} minutes.')


def _a_delay(rng):
    vehicle = rng.choice(['shuttle', 'bus', 'robotaxi'])
    return Draft('delay', f'Write a one-sentence announcement that the {vehicle} is delayed by '
                 f'about {rng.randint(2, 20)} minutes because of {rng.choice(_REASONS)}.')


def _a_wait(rng):
    cause = rng.choice(['a pedestrian crossing slowly', 'a delivery truck to leave the lane',
                        'the traffic light to turn green', 'a remote operator to confirm the '
                        'route', 'an emergency vehicle to pass', 'a train at the level crossing'])
    return Draft('wait', f'Write a short, calm one-sentence announcement that the shuttle is '
                 f'waiting for {cause} and will continue shortly.')


def _a_skip(rng):
    stop, following = rng.sample(STOPS, 2)
    return Draft('skip', f'Write a one-sentence announcement that the stop {stop} is skipped '
                 f'today because of {rng.choice(_REASONS)}; the next stop is {following}.')


def _a_hold_on(rng):
    move = rng.choice(['turn sharply left', 'turn sharply right', 'brake for a red light',
                       'drive over a speed bump', 'merge onto a busy road',
                       'drive through a roundabout'])
    return Draft('hold_on', f'Write a one-sentence announcement asking standing passengers to '
                 f'hold on because the shuttle will {move}.')


def _a_end(rng):
    return Draft('end_of_ride', f'Write a two-sentence announcement that the ride ends at '
                 f'{rng.choice(STOPS)}; remind passengers to take their belongings.')


def _a_ramp(rng):
    side = rng.choice(['front', 'rear', 'middle'])
    return Draft('ramp', f'Write a one-sentence announcement that the ramp at the {side} door '
                 f'will deploy at {rng.choice(STOPS)} for a wheelchair user.')


def _a_safety_stop(rng):
    who = rng.choice(['a remote operator is connected', 'the safety team has been informed',
                      'a technician is on the way'])
    return Draft('safety_stop', f'Write a calm one-sentence announcement that the shuttle '
                 f'stopped for a safety check and {who}.')


def announcement(rng):
    """Return 24 distinct announcements, the templates taken in turn."""
    return collect(rng, [_a_arrival, _a_delay, _a_wait, _a_skip, _a_hold_on, _a_end,
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


def explanation(rng):
    """Return one explanation request per topic, in a drawn form."""
    return [Draft('topic', rng.choice(_EXPLAIN_FORMS).format(topic)) for topic in _TOPICS]
