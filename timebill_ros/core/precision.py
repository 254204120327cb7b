# SPDX-License-Identifier: Apache-2.0
"""Per-layer mixed precision: each unit's step time and quality cost, and the knapsack DP.

After ../shared/papers/002 (context-aware precision scheduling). The decode step is
split into units (each decoder layer, then the LM head) plus a rest that always runs
at full precision (embedding, final norm, framework overhead). A unit lowered to the
low precision (int8) saves time and costs quality:

    time:    unit u at precision x takes t_{u,x}(L) = a_{u,x} + c_{u,x} L / 1024
    quality: KL(full || mix) of the next-token distribution ~ sum of the lowered
             units' KL, each measured with that unit alone lowered

The DP picks the set of lowered units with the least summed KL whose step fits a
per-step time budget (0/1 knapsack over the time saved, in ``resolution_s`` bins;
a unit's saving is rounded down so the chosen mix never saves less than counted).

Times come from the profile at two or more KV lengths; the ETE's own step times
(refit online) scale them: a mix's step is the full ETE step times the full-precision
share of the profiled units plus the low ETE step times the lowered share, so an
all-full mix is the float32 ETE and an all-low mix the int8 one.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from pathlib import Path
from typing import Sequence

import numpy as np

HEAD = 'lm_head'
SHIPPED = Path(__file__).resolve().parents[1] / 'data' / 'precision_kl.json'


# ``auto_precision: int8`` leads with int8-dynamic only when its decode step is this many
# times faster than int8-weight's: its 8-bit activations cost fidelity (0.53 against
# 0.82 to the float32 answer on 93 robot train items, results/cut_effects_int8w.md).
INT8_DYNAMIC_MARGIN = 1.25


def pick_int8(dynamic_step_s: float, weight_step_s: float,
              margin: float = INT8_DYNAMIC_MARGIN) -> str:
    """Return the int8 format to lead with (switch target, mix) from their decode steps.

    int8-weight unless int8-dynamic's step is ``margin`` times faster.
    """
    if dynamic_step_s <= 0.0 or weight_step_s <= 0.0:
        raise ValueError('decode step times must be positive')
    return 'int8-dynamic' if dynamic_step_s * margin <= weight_step_s else 'int8-weight'


def shipped_unit_kl(low: str) -> Path:
    """Return the shipped per-unit KL table for lowering to ``low``.

    int8-dynamic's is ``precision_kl.json``; any other's ``precision_kl.<low>.json``.
    """
    return SHIPPED if low == 'int8-dynamic' else SHIPPED.with_name(f'precision_kl.{low}.json')


@dataclass(frozen=True)
class UnitTimes:
    """Per-unit step time at one precision: seconds = a + c * L / 1024 (L = KV length)."""

    a: tuple
    c: tuple
    rest_a: float = 0.0
    rest_c: float = 0.0

    def at(self, kv: float) -> np.ndarray:
        """Return each unit's time at KV length ``kv``."""
        return np.asarray(self.a) + np.asarray(self.c) * kv / 1024.0

    def rest(self, kv: float) -> float:
        """Return the time of what is not a unit at KV length ``kv``."""
        return self.rest_a + self.rest_c * kv / 1024.0

    def total(self, kv: float) -> float:
        """Return the whole step at this precision."""
        return float(self.at(kv).sum() + self.rest(kv))


def fit_unit_times(kv_lengths: Sequence[float], unit_s: Sequence[Sequence[float]],
                   step_s: Sequence[float]) -> UnitTimes:
    """Fit a + c L / 1024 per unit from times at two or more KV lengths.

    ``unit_s[i][u]`` is unit u's time at ``kv_lengths[i]``; ``step_s[i]`` the whole step
    there (the rest is what the units do not account for, never below 0).
    """
    x = np.asarray(kv_lengths, dtype=float) / 1024.0
    if len(np.unique(x)) < 2:
        raise ValueError('need unit times at 2 or more distinct KV lengths')
    y = np.asarray(unit_s, dtype=float)  # (lengths, units)
    design = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    a, c = np.maximum(coef[0], 0.0), np.maximum(coef[1], 0.0)
    rest = np.maximum(np.asarray(step_s, dtype=float) - y.sum(axis=1), 0.0)
    (ra, rc), *_ = np.linalg.lstsq(design, rest, rcond=None)
    return UnitTimes(tuple(map(float, a)), tuple(map(float, c)), max(0.0, float(ra)),
                     max(0.0, float(rc)))


@dataclass(frozen=True)
class Mix:
    """A per-unit precision choice: the indices of the units at the low precision."""

    lowered: tuple
    units: int
    predicted_kl: float = 0.0

    @property
    def is_full(self) -> bool:
        """Tell whether nothing is lowered."""
        return not self.lowered

    @property
    def is_all_low(self) -> bool:
        """Tell whether every unit is lowered."""
        return len(self.lowered) == self.units

    def describe(self, names: Sequence[str] | None = None) -> str:
        """Return the lowered units in words: 'layers 3-7,12 + lm_head' ('' when none)."""
        if not self.lowered:
            return ''
        layers = [u for u in self.lowered if u < self.units - 1]
        parts = []
        if layers:
            runs, start = [], layers[0]
            for prev, cur in zip(layers, layers[1:] + [None]):
                if cur != prev + 1:
                    runs.append(f'{start}' if start == prev else f'{start}-{prev}')
                    start = cur
            parts.append('layers ' + ','.join(runs))
        if self.units - 1 in self.lowered:
            parts.append(HEAD)
        return ' + '.join(parts)


@dataclass(frozen=True)
class PrecisionTable:
    """What the DP needs: unit times at both precisions and each unit's KL when lowered.

    Units are the decoder layers 0..n-1 then the LM head; ``all_low_kl`` is the KL
    measured with every unit lowered (the additive sum over-counts or under-counts
    it; the planner's fidelity for a mix scales with summed KL / this).
    """

    low: str
    full_times: UnitTimes
    low_times: UnitTimes
    kl: tuple
    all_low_kl: float
    resolution_s: float = 1e-4

    def __post_init__(self):
        """Check that every table has one entry per unit."""
        n = len(self.kl)
        if not n or len(self.full_times.a) != n or len(self.low_times.a) != n:
            raise ValueError('unit times and KL must cover the same units')

    @property
    def units(self) -> int:
        """Return how many units there are: the decoder layers and the LM head."""
        return len(self.kl)

    def shares(self, kv: float) -> tuple:
        """Return (full shares, low shares, full rest share) of each unit's time at ``kv``."""
        full_total, low_total = self.full_times.total(kv), self.low_times.total(kv)
        return (self.full_times.at(kv) / full_total, self.low_times.at(kv) / low_total,
                self.full_times.rest(kv) / full_total)

    def step_scale(self, mix: Mix, kv: float, full_step: float, low_step: float) -> float:
        """Return the mix's step time at ``kv`` given the ETEs' full and low steps there."""
        full, low, rest = self.shares(kv)
        keep = np.ones(self.units, dtype=bool)
        keep[list(mix.lowered)] = False
        return float(full_step * (full[keep].sum() + rest) + low_step * low[~keep].sum())

    def predicted_kl(self, lowered: Sequence[int]) -> float:
        """Return the additive KL estimate of lowering ``lowered``."""
        return float(sum(self.kl[u] for u in lowered))

    def choose(self, kv: float, full_step: float, low_step: float,
               budget_s: float) -> Mix | None:
        """Return the least-KL mix whose step at ``kv`` fits ``budget_s`` (None: none fits).

        0/1 knapsack: lower units until the time saved reaches full_step - budget_s,
        at the least summed KL; savings count in ``resolution_s`` bins, rounded down.
        """
        need = full_step - budget_s
        if need <= 0.0:
            return Mix((), self.units)
        full, low, _ = self.shares(kv)
        saving = full * full_step - low * low_step
        if saving[saving > 0].sum() < need - 1e-12:
            return None
        weights = np.floor(np.maximum(saving, 0.0) / self.resolution_s).astype(int)
        target = int(math.ceil(need / self.resolution_s))
        if weights.sum() < target:  # rounding lost the last bins: lowering all is the bound
            return Mix(tuple(range(self.units)), self.units, self.all_low_kl)
        # best[j]: least KL saving at least j bins (j capped at target); keep[u][j] says
        # whether unit u is lowered on that optimum, for the back-trace.
        best = np.full(target + 1, np.inf)
        best[0] = 0.0
        keep = np.zeros((self.units, target + 1), dtype=bool)
        index = np.arange(target + 1)
        for u in range(self.units):
            w = weights[u]
            if w <= 0:
                continue
            source = np.maximum(index - w, 0)
            candidate = best[source] + self.kl[u]
            better = candidate < best
            keep[u] = better
            best = np.where(better, candidate, best)
        if not math.isfinite(best[target]):
            return None
        lowered, j = [], target
        for u in range(self.units - 1, -1, -1):
            if keep[u][j]:
                lowered.append(u)
                j = max(j - weights[u], 0)
        lowered.sort()
        return Mix(tuple(lowered), self.units, self.predicted_kl(lowered))

    def fidelity(self, mix: Mix, low_quality: float) -> float:
        """Return the planner's quality for a mix: 1 at full, ``low_quality`` at all-low.

        In between it falls with the mix's predicted KL as a share of the all-low KL.
        """
        if mix.is_full:
            return 1.0
        share = min(1.0, mix.predicted_kl / self.all_low_kl) if self.all_low_kl > 0 else 1.0
        return 1.0 - (1.0 - low_quality) * share

    def length_factor(self, mix: Mix, low_factor: float) -> float:
        """Return the answer-length factor of a mix, interpolated like ``fidelity``."""
        if mix.is_full:
            return 1.0
        share = min(1.0, mix.predicted_kl / self.all_low_kl) if self.all_low_kl > 0 else 1.0
        return 1.0 + (low_factor - 1.0) * share


@dataclass(frozen=True)
class UnitKL:
    """Measured KL per lowered unit for one model (training.measure_precision)."""

    source: str
    low: str
    unit_kl: tuple
    all_low_kl: float

    @classmethod
    def load(cls, path) -> 'UnitKL':
        """Read a KL table; raise ValueError if the file is not one."""
        import json
        try:
            with open(path, encoding='utf-8') as handle:
                data = json.load(handle)
            return cls(str(data['source']), str(data['low']),
                       tuple(float(v) for v in data['unit_kl']), float(data['all_low_kl']))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f'cannot read the precision KL table {path}: {exc}') from exc
