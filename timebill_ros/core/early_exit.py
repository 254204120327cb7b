# SPDX-License-Identifier: Apache-2.0
"""Anytime early exit: when to commit an intermediate layer's token, and schedulability.

Pure Python. A decode step runs the decoder layers in order; after each candidate
exit layer the runtime asks ``ExitRule.decide`` whether to commit that layer's
prediction now:

- ``threshold``: the exit's confidence (top-1 probability) reaches the threshold,
  which may decay with the share of the token's time budget already used
  (for example 0.8 at the start of the token, 0.3 when its time is gone);
- ``forced``: the time left for this token cannot pay for the remaining layers
  (per-layer times from the execution-time profile) - exit now rather than miss;
- otherwise continue; after the last layer the token is a ``full``-depth one.

Schedulability: a goal with a per-token deadline D is admitted only when the
estimated P99 time per output token under its mode is <= D; utilisation
U = P99 TPOT / D is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

CONTINUE, THRESHOLD, FORCED, FULL = 'continue', 'threshold', 'forced', 'full'


@dataclass(frozen=True)
class LayerTimes:
    """Seconds per decoder layer for one decode step, plus the exit/LM head."""

    layers: tuple
    head_s: float

    def __post_init__(self):
        """Reject empty or negative timings."""
        if not self.layers or any(not math.isfinite(t) or t < 0 for t in self.layers):
            raise ValueError('need one finite, non-negative time per layer')
        if not math.isfinite(self.head_s) or self.head_s < 0:
            raise ValueError('head time must be finite and >= 0')

    @property
    def full_s(self) -> float:
        """Return the time of a full-depth step."""
        return sum(self.layers) + self.head_s

    def after(self, layer: int) -> float:
        """Return the time still needed for a full-depth token after ``layer`` (1-based)."""
        return sum(self.layers[layer:]) + self.head_s

    def until(self, layer: int) -> float:
        """Return the time of a step that exits after ``layer`` (1-based), head included."""
        return sum(self.layers[:layer]) + self.head_s

    def scaled(self, step_s: float) -> 'LayerTimes':
        """Return these proportions rescaled so that a full step takes ``step_s``."""
        factor = step_s / self.full_s if self.full_s > 0 else 1.0
        return LayerTimes(tuple(t * factor for t in self.layers), self.head_s * factor)


@dataclass(frozen=True)
class ExitRule:
    """Where a token may exit and when it must; thresholds in (0, 1]."""

    exit_layers: tuple
    threshold_start: float = 0.8
    threshold_end: float = 0.8  # == start: fixed threshold; lower: decays with time used

    def __post_init__(self):
        """Validate the candidate layers and thresholds."""
        if not self.exit_layers or list(self.exit_layers) != sorted(set(self.exit_layers)):
            raise ValueError('exit layers must be a non-empty, strictly increasing sequence')
        if self.exit_layers[0] < 1:
            raise ValueError('exit layers are 1-based (layer 1 = after the first decoder layer)')
        for value in (self.threshold_start, self.threshold_end):
            if not 0.0 < value <= 1.0:
                raise ValueError(f'thresholds must be in (0, 1] (got {value})')
        if self.threshold_end > self.threshold_start:
            raise ValueError('the threshold may only decay (end <= start)')

    def threshold(self, used_fraction: float) -> float:
        """Return the confidence needed after using ``used_fraction`` of the token's time."""
        f = min(1.0, max(0.0, used_fraction))
        return self.threshold_start + (self.threshold_end - self.threshold_start) * f

    def decide(self, layer: int, confidence: float, used_s: float, token_budget_s: float,
               times: LayerTimes) -> str:
        """Return CONTINUE, THRESHOLD or FORCED after candidate ``layer`` (1-based)."""
        if token_budget_s is not None and math.isfinite(token_budget_s):
            left = token_budget_s - used_s
            # The next chance to stop is the next candidate (or the end): can we reach it?
            nxt = next((c for c in self.exit_layers if c > layer), None)
            to_next = (sum(times.layers[layer:nxt]) + times.head_s) if nxt else \
                times.after(layer)
            if left < to_next:
                return FORCED
            used_fraction = used_s / token_budget_s if token_budget_s > 0 else 1.0
        else:
            used_fraction = 0.0
        if confidence >= self.threshold(used_fraction):
            return THRESHOLD
        return CONTINUE


def p99_tpot_estimate(step_s: float, jitter: float = 0.10) -> float:
    """Return the P99 time per output token estimated from a mean step time.

    ``jitter`` is the P99-over-mean excess measured on the device (0.10 = 10 %).
    """
    if step_s < 0 or jitter < 0:
        raise ValueError('step time and jitter must be >= 0')
    return step_s * (1.0 + jitter)


def schedulable(p99_tpot_s: float, token_deadline_s: float) -> tuple:
    """Return (admit, utilisation U = P99 TPOT / D) for a per-token deadline D."""
    if not math.isfinite(token_deadline_s) or token_deadline_s <= 0:
        raise ValueError(f'per-token deadline must be finite and > 0 (got {token_deadline_s})')
    u = p99_tpot_s / token_deadline_s
    return u <= 1.0, u
