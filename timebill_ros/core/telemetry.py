# SPDX-License-Identifier: Apache-2.0
"""Deadline telemetry: counters, miss rate over a window, TPOT percentiles, level."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
import enum
import math
from typing import Iterable, Sequence

from timebill_ros.core.request import Outcome


class Level(enum.IntEnum):
    """Diagnostic level; values equal diagnostic_msgs/DiagnosticStatus levels."""

    OK = 0
    WARN = 1
    ERROR = 2
    STALE = 3


def percentile(values: Sequence[float], q: float) -> float:
    """Return the q-th percentile of values (q in 0..100, linear interpolation), NaN if empty."""
    if not values:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f'percentile must be in [0, 100] (got {q})')
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def tpot_stats(step_times: Sequence[float]) -> dict:
    """Summarise decode step times (time per output token) of one goal."""
    if not step_times:
        return {'mean': 0.0, 'p50': 0.0, 'p99': 0.0, 'max': 0.0}
    return {'mean': sum(step_times) / len(step_times), 'p50': percentile(step_times, 50),
            'p99': percentile(step_times, 99), 'max': max(step_times)}


@dataclass(frozen=True)
class GoalRecord:
    """What telemetry keeps of one finished goal."""

    outcome: Outcome
    deadline_met: bool
    e2e_s: float
    step_times: tuple = ()


@dataclass(frozen=True)
class Thresholds:
    """Miss-rate thresholds for WARN and ERROR levels."""

    warn_miss_rate: float = 0.05
    error_miss_rate: float = 0.25

    def __post_init__(self):
        """Check 0 <= warn <= error <= 1."""
        if not 0.0 <= self.warn_miss_rate <= self.error_miss_rate <= 1.0:
            raise ValueError('need 0 <= warn_miss_rate <= error_miss_rate <= 1')


def level_for(miss_rate: float, thresholds: Thresholds) -> Level:
    """Map a deadline-miss rate to a diagnostic level (no goals yet is OK)."""
    if math.isnan(miss_rate):
        return Level.OK
    if miss_rate >= thresholds.error_miss_rate:
        return Level.ERROR
    if miss_rate >= thresholds.warn_miss_rate:
        return Level.WARN
    return Level.OK


@dataclass
class Telemetry:
    """Rolling deadline statistics across goals (callers serialise access)."""

    window: int = 50
    tpot_window: int = 2000
    counts: Counter = field(default_factory=Counter)
    _recent: deque = field(default=None, repr=False)
    _tpots: deque = field(default=None, repr=False)
    _ete_errors: deque = field(default=None, repr=False)
    _length_errors: deque = field(default=None, repr=False)
    last_e2e_s: float = math.nan
    expected_false_rejections: float = 0.0

    def __post_init__(self):
        """Size the rolling windows."""
        if self.window < 1 or self.tpot_window < 1:
            raise ValueError('telemetry windows must be >= 1')
        self._recent = deque(maxlen=self.window)
        self._tpots = deque(maxlen=self.tpot_window)
        self._ete_errors = deque(maxlen=self.window)
        self._length_errors = deque(maxlen=self.window)

    def accepted(self) -> None:
        """Count an accepted goal."""
        self.counts['accepted'] += 1

    def rejected(self) -> None:
        """Count a rejected goal."""
        self.counts['rejected'] += 1

    def deadline_rejection(self, fit_probability: float) -> None:
        """Count a goal rejected on its predicted length, with P(answer would have fit).

        Whether the full model would really have made it is unknown here; the sum of
        those probabilities is the expected number of false rejections.
        """
        self.counts['rejected_on_prediction'] += 1
        self.expected_false_rejections += min(1.0, max(0.0, float(fit_probability)))

    def finished(self, record: GoalRecord) -> None:
        """Fold one finished goal into the counters and windows."""
        self.counts[record.outcome.name.lower()] += 1
        if record.outcome != Outcome.CANCELED:
            # A canceled goal was withdrawn by its caller: not a deadline result.
            self._recent.append(bool(record.deadline_met))
            self.counts['met' if record.deadline_met else 'missed'] += 1
        self._tpots.extend(record.step_times)
        self.last_e2e_s = record.e2e_s

    def ete_error(self, percent: float) -> None:
        """Record a signed execution-time estimation error, in percent of the actual time."""
        if math.isfinite(percent):
            self._ete_errors.append(percent)

    def length_error(self, predicted: int, actual: int) -> None:
        """Record predicted minus actual answer length (tokens) of a fully answered goal."""
        self._length_errors.append(int(predicted) - int(actual))

    @property
    def miss_rate(self) -> float:
        """Share of recent deadline results that missed; NaN before any."""
        if not self._recent:
            return math.nan
        return sum(1 for met in self._recent if not met) / len(self._recent)

    def tpot_percentile(self, q: float) -> float:
        """Percentile of recent time-per-output-token values (seconds)."""
        return percentile(list(self._tpots), q)

    def summary(self) -> dict:
        """Return the figures diagnostics and benchmarks report."""
        out = {name: self.counts.get(name, 0) for name in COUNTERS}
        out.update({
            'miss_rate': self.miss_rate,
            'window_goals': len(self._recent),
            'tpot_p50_s': self.tpot_percentile(50),
            'tpot_p99_s': self.tpot_percentile(99),
            'last_e2e_s': self.last_e2e_s,
            'false_rejections_expected': round(self.expected_false_rejections, 3),
            'ete_abs_error_p50_pct': percentile([abs(e) for e in self._ete_errors], 50),
            'ete_error_last_pct': self._ete_errors[-1] if self._ete_errors else math.nan,
            'length_abs_error_mean': (sum(abs(e) for e in self._length_errors)
                                      / len(self._length_errors)
                                      if self._length_errors else math.nan),
        })
        return out


COUNTERS: Iterable[str] = (
    'accepted', 'rejected', 'rejected_on_prediction', 'completed', 'killed', 'skipped',
    'canceled', 'failed',
    'met', 'missed')
