# SPDX-License-Identifier: Apache-2.0
"""Status items: ROS log excerpts to summarise or to name the node that logs an ERROR.

Logs of 10 to 150 lines; a summary item asks for one sentence of free text, an error
item for the one node that logs ERROR (its reference).
"""

from collections import namedtuple

from .drafts import Draft


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


def drafts(rng):
    """Return 20 summaries (healthy, degraded, fault in turn) and 10 error-node look-ups."""
    # The longest logs (150 lines, about 5,000 SmolLM2 tokens) stay well inside the
    # model's 8,192-token window: the node rejects prompts that do not fit.
    summary_sizes = [rng.randint(10, 60) for _ in range(16)] + [80, 100, 120, 150]
    error_sizes = [rng.randint(10, 60) for _ in range(8)] + [100, 150]
    rng.shuffle(summary_sizes)
    rng.shuffle(error_sizes)
    made = []
    for index, size in enumerate(summary_sizes):
        scenario = ('healthy', 'degraded', 'fault')[index % 3]
        warn = rng.sample(sorted(_NODES), {'healthy': 0, 'degraded': rng.randint(1, 2),
                                           'fault': rng.randint(0, 2)}[scenario])
        error = (rng.choice(sorted(set(_NODES) - set(warn))) if scenario == 'fault' else None)
        made.append(Draft(f'summary_{scenario}', rng.choice(_SUMMARY_ASKS),
                          context=_log(rng, size, error, warn)))
    for size in error_sizes:
        error = rng.choice(sorted(_NODES))
        warn = rng.sample(sorted(set(_NODES) - {error}), rng.randint(1, 3))
        made.append(Draft('error_node', rng.choice(_ERROR_ASKS), error, 'exact',
                          _log(rng, size, error, warn)))
    return made
