"""Build the node's /diagnostics status from telemetry (no diagnostic_updater wheel here)."""

from __future__ import annotations

import math

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from timebill_ros.core.telemetry import level_for, Thresholds


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


def build_status(name: str, hardware_id: str, summary: dict, extra: dict,
                 thresholds: Thresholds) -> DiagnosticStatus:
    """Build the node's DiagnosticStatus: level from the recent miss rate, values as strings."""
    level = level_for(summary['miss_rate'], thresholds)
    values = [KeyValue(key=key, value=_fmt(val)) for key, val in {**summary, **extra}.items()]
    return DiagnosticStatus(level=bytes([int(level)]), name=name,
                            message=status_message(summary, level), hardware_id=hardware_id,
                            values=values)


def build_array(status: DiagnosticStatus, stamp) -> DiagnosticArray:
    """Wrap one status in a stamped DiagnosticArray."""
    array = DiagnosticArray(status=[status])
    array.header.stamp = stamp
    return array
