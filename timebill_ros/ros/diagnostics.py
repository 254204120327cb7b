# SPDX-License-Identifier: Apache-2.0
"""Build the node's /diagnostics statuses from telemetry (no diagnostic_updater wheel here).

One node publishes a few named statuses, each ``<node>: <section>`` (docs/diagnostics.md
lists every key): ``deadlines`` (the miss rate sets its level), ``queue`` (what waits and
runs, WARN while goals are refused), ``timing model`` (the model, the planner and its time
estimates) and ``engine <option>`` per engine option with its own timing errors. The
shipped analyzer file (config/diagnostic_aggregator.yaml) groups them under the node for
rqt_robot_monitor.
"""

from __future__ import annotations

import math

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from timebill_ros.core.telemetry import level_for, Level, Thresholds

DEADLINES, QUEUE, TIMING = 'deadlines', 'queue', 'timing model'
QUEUE_KEYS = frozenset({'queue_length', 'executing', 'scheduler', 'executor', 'state',
                        'max_batch'})
# An engine option's own figures: '<key>_<option>' -> status 'engine <option>', '<key>'.
ENGINE_KEYS = ('ete_error_ratios_q10_q90_',)


def _fmt(value) -> str:
    if isinstance(value, float):
        return 'n/a' if math.isnan(value) else f'{value:.6g}'
    return str(value)


def status_message(summary: dict, level) -> str:
    """Return the one-line message rqt_runtime_monitor shows beside the level."""
    if summary['window_goals'] == 0:
        return 'no goals finished yet'
    return (f"{level.name}: deadline miss rate {summary['miss_rate'] * 100:.1f}% over the last "
            f"{summary['window_goals']} goals")


def section_of(key: str, summary: dict) -> tuple:
    """Return (section, key within it) of one diagnostic value."""
    for prefix in ENGINE_KEYS:
        if key.startswith(prefix):
            return f'engine {key[len(prefix):]}', prefix[:-1]
    if key in QUEUE_KEYS or key.startswith(('replica', 'vllm')):
        return QUEUE, key
    if key in summary and not key.startswith('ete_'):
        return DEADLINES, key
    return TIMING, key


def build_statuses(node_name: str, hardware_id: str, summary: dict, extra: dict,
                   thresholds: Thresholds) -> list:
    """Build the node's DiagnosticStatuses, deadlines first; values as strings."""
    sections = {DEADLINES: {}, QUEUE: {}, TIMING: {}}
    for key, value in {**summary, **extra}.items():
        section, name = section_of(key, summary)
        sections.setdefault(section, {})[name] = _fmt(value)
    level = level_for(summary['miss_rate'], thresholds)
    state = str(extra.get('state', 'serving'))
    levels = {DEADLINES: (level, status_message(summary, level)),
              QUEUE: (Level.OK if state == 'serving' else Level.WARN,
                      f"{state}: {extra.get('queue_length', 0)} waiting, "
                      f"{extra.get('executing', 0)} running")}
    if 'options_profiled' in extra:  # the node's first minutes: which options plan goals
        levels[TIMING] = (Level.OK, f"options profiled: {extra['options_profiled']}; still "
                                    f"to profile: {extra.get('options_to_profile', 'none')}")
    statuses = []
    for section, values in sections.items():
        level_of, message = levels.get(section, (Level.OK, f'{len(values)} values'))
        statuses.append(DiagnosticStatus(
            level=bytes([int(level_of)]), name=f'{node_name}: {section}', message=message,
            hardware_id=hardware_id,
            values=[KeyValue(key=key, value=value) for key, value in values.items()]))
    return statuses


def build_status(name: str, hardware_id: str, summary: dict, extra: dict,
                 thresholds: Thresholds) -> DiagnosticStatus:
    """Build one status with every value: ``name``, level from the recent miss rate."""
    level = level_for(summary['miss_rate'], thresholds)
    values = [KeyValue(key=key, value=_fmt(val)) for key, val in {**summary, **extra}.items()]
    return DiagnosticStatus(level=bytes([int(level)]), name=name,
                            message=status_message(summary, level), hardware_id=hardware_id,
                            values=values)


def build_array(statuses, stamp) -> DiagnosticArray:
    """Wrap one status (or a list of them) in a stamped DiagnosticArray."""
    array = DiagnosticArray(status=list(statuses) if isinstance(statuses, list) else [statuses])
    array.header.stamp = stamp
    return array
