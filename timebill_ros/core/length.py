# SPDX-License-Identifier: Apache-2.0
"""Response-length buckets, predictor metrics and the pessimistic factor from data."""

from __future__ import annotations

from dataclasses import dataclass
import functools
import math
from typing import Sequence

import numpy as np
# At import, not lazily: the first import takes ~0.3 s, which a goal planned on the
# spread of recent answers would pay out of its budget (a 0.4 s one was killed so).
from scipy.stats import CensoredData, ecdf


def num_buckets(n_max: int, bucket_size: int) -> int:
    """Return how many classes cover lengths 0..n_max with buckets of bucket_size."""
    if n_max < 1 or bucket_size < 1:
        raise ValueError('need n_max >= 1 and bucket_size >= 1')
    return math.ceil(n_max / bucket_size) + 1


def to_bucket(length: int, bucket_size: int, n_max: int) -> int:
    """Return the class of a length: ceil(N / B), as TimeBill labels its training data."""
    if length < 0:
        raise ValueError(f'length must be >= 0 (got {length})')
    return math.ceil(min(length, n_max) / bucket_size)


def from_bucket(bucket: int, bucket_size: int, n_max: int) -> int:
    """Return the predicted length N_hat = min(N_max, bucket * B)."""
    return int(min(n_max, max(0, bucket) * bucket_size))


def cap_prediction(n_hat: float, n_max: int, max_new_tokens: int) -> int:
    """Return the length to plan for: N_hat within 1..max_new_tokens.

    Labels stop at the predictor's N_max, so a prediction at N_max means the
    target runs to the cap, not that it stops there: a goal allowing more
    tokens is planned for its own max_new_tokens.
    """
    n_hat = int(round(float(n_hat)))
    if n_hat >= n_max:
        n_hat = max_new_tokens
    return max(1, min(n_hat, int(max_new_tokens)))


DECODE_RULES = ('argmax', 'mean', 'median')


def decode_buckets(probs, bucket_size: int, n_max: int, rule: str = 'argmax') -> np.ndarray:
    """Turn rows of bucket probabilities into predicted lengths.

    'argmax' is TimeBill's N_hat = min(N_max, bucket * B) of the likeliest
    bucket; 'mean' (expected length: least squared error) and 'median' (least
    absolute error) read the whole distribution, which matters when it is
    bimodal (a short answer or a run to N_max).
    """
    if rule not in DECODE_RULES:
        raise ValueError(f'unknown decode rule {rule!r} (expected one of {DECODE_RULES})')
    p = np.atleast_2d(np.asarray(probs, dtype=float))
    if p.shape[1] != num_buckets(n_max, bucket_size):
        raise ValueError(f'{p.shape[1]} probabilities for {num_buckets(n_max, bucket_size)} '
                         'buckets')
    lengths = np.array([from_bucket(b, bucket_size, n_max) for b in range(p.shape[1])])
    if rule == 'argmax':
        return lengths[p.argmax(axis=1)].astype(float)
    p = p / p.sum(axis=1, keepdims=True)
    if rule == 'mean':
        return p @ lengths
    return lengths[(p.cumsum(axis=1) >= 0.5 - 1e-12).argmax(axis=1)].astype(float)


def metrics(predicted: Sequence[float], actual: Sequence[float]) -> dict:
    """Return MAE, RMSE and R^2 of length predictions."""
    pred, act = np.asarray(predicted, dtype=float), np.asarray(actual, dtype=float)
    if pred.shape != act.shape or act.size < 2:
        raise ValueError('need two equally long sequences of 2 or more values')
    err = pred - act
    total = float(np.sum((act - act.mean()) ** 2))
    return {'mae': float(np.mean(np.abs(err))), 'rmse': float(np.sqrt(np.mean(err ** 2))),
            'r2': 1.0 - float(np.sum(err ** 2)) / total if total > 0 else float('nan')}


def coverage(predicted: Sequence[float], actual: Sequence[float], factor: float,
             n_max: int) -> float:
    """Share of true lengths within the worst case min(N_max, ceil(k * N_hat))."""
    pred, act = np.asarray(predicted, dtype=float), np.asarray(actual, dtype=float)
    worst = np.minimum(n_max, np.ceil(factor * np.maximum(pred, 1.0)))
    return float(np.mean(act <= worst))


def bucket_floor_mae(lengths: Sequence[int], bucket_size: int, n_max: int) -> float:
    """Return the MAE of a perfect classifier: each length decoded from its own bucket."""
    act = np.asarray(lengths, dtype=float)
    if act.size == 0:
        raise ValueError('need at least one length')
    pred = [from_bucket(to_bucket(int(n), bucket_size, n_max), bucket_size, n_max)
            for n in act]
    return float(np.mean(np.abs(np.asarray(pred, dtype=float) - act)))


def pessimistic_factor(predicted: Sequence[float], actual: Sequence[float], quantile: float,
                       n_max: int) -> float:
    """Return the smallest k >= 1 whose worst case covers ``quantile`` of true lengths.

    Lengths at N_max are covered by the cap whatever k is, so only the ratios
    true / predicted of the others decide.
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f'quantile must be in (0, 1] (got {quantile})')
    pred = np.maximum(np.asarray(predicted, dtype=float), 1.0)
    act = np.asarray(actual, dtype=float)
    candidates = np.unique(np.concatenate([[1.0], np.maximum(1.0, act / pred)]))
    for k in candidates:  # ascending; coverage is non-decreasing in k
        if coverage(pred, act, float(k), n_max) >= quantile - 1e-12:
            return float(k)
    return float(candidates[-1])


LEVELS = tuple(i / 20 for i in range(21))  # 0, 0.05, ..., 1


@dataclass(frozen=True)
class LengthDistribution:
    """Calibrated true answer lengths given a prediction, measured on held-out data.

    Predictions are grouped into bands (``edges``: each band's largest
    prediction, ascending); per band the true lengths' quantiles at ``levels``
    give a piecewise-linear distribution. It answers what admission needs:
    how likely is the answer to end within n tokens, and how many tokens to
    plan for at a given confidence.
    """

    edges: tuple
    levels: tuple
    quantiles: tuple  # per band, the true lengths at ``levels`` (non-decreasing)
    samples: tuple = ()  # calibration pairs per band (for reports)
    source: str = ''  # where lengths came from when not a predictor's calibration

    def __post_init__(self):
        """Check the table's shape."""
        if not self.edges or len(self.edges) != len(self.quantiles):
            raise ValueError('need one quantile row per band')
        if any(len(row) != len(self.levels) for row in self.quantiles):
            raise ValueError('every band needs a length at every level')
        if self.levels[0] != 0.0 or self.levels[-1] != 1.0:
            raise ValueError('levels must run from 0 to 1')

    @classmethod
    def fit(cls, predicted: Sequence[float], actual: Sequence[float],
            min_per_band: int = 20, levels: tuple = LEVELS) -> 'LengthDistribution':
        """Group predictions into bands of >= ``min_per_band`` pairs; quantile true lengths."""
        pred, act = np.asarray(predicted, dtype=float), np.asarray(actual, dtype=float)
        if pred.shape != act.shape or pred.size < 2:
            raise ValueError('need two equally long sequences of 2 or more values')
        order = np.argsort(pred, kind='stable')
        pred, act = pred[order], act[order]
        groups, start = [], 0
        while start < pred.size:
            end = min(pred.size, start + min_per_band)
            while end < pred.size and pred[end] == pred[end - 1]:
                end += 1  # equal predictions share a band
            if pred.size - end < min_per_band:
                end = pred.size  # too few left for a band of their own
            groups.append((start, end))
            start = end
        edges = tuple(float(pred[end - 1]) for _, end in groups[:-1]) + (math.inf,)
        rows = tuple(tuple(float(v) for v in np.quantile(act[s:e], levels))
                     for s, e in groups)
        return cls(edges, tuple(levels), rows, tuple(e - s for s, e in groups))

    @property
    def max_length(self) -> float:
        """Return the longest true length seen in calibration (the labels' cap)."""
        return max(row[-1] for row in self.quantiles)

    def _row(self, predicted: float) -> tuple:
        for edge, row in zip(self.edges, self.quantiles):
            if predicted <= edge:
                return row
        return self.quantiles[-1]

    def quantile(self, q: float, predicted: float) -> float:
        """Return the true length at level ``q`` for an answer predicted at ``predicted``."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f'quantile must be in [0, 1] (got {q})')
        return float(np.interp(q, self.levels, self._row(predicted)))

    def prob_at_most(self, tokens: float, predicted: float) -> float:
        """Return P(true length <= ``tokens``) for an answer predicted at ``predicted``."""
        row = np.asarray(self._row(predicted))
        if tokens < row[0]:
            return 0.0
        if tokens >= row[-1]:
            return 1.0
        # Highest level whose length is still within ``tokens`` (ties: the top of a flat run).
        hi = int(np.searchsorted(row, tokens, side='right'))
        lo = hi - 1
        width = row[hi] - row[lo]
        frac = 0.0 if width <= 0 else (tokens - row[lo]) / width
        return float(self.levels[lo] + frac * (self.levels[hi] - self.levels[lo]))

    def marginal(self, levels: tuple = LEVELS) -> 'LengthDistribution':
        """Return the lengths over every band: the spread to expect with no prediction."""
        weights = np.asarray(self.samples or (1,) * len(self.edges), dtype=float)
        weights = weights / weights.sum()
        grid = np.unique(np.concatenate([np.asarray(row) for row in self.quantiles]))
        cdf = np.array([sum(w * self.prob_at_most(n, edge) for w, edge in
                            zip(weights, self._band_points())) for n in grid])
        row = [float(grid[min(len(grid) - 1, int(np.searchsorted(cdf, q - 1e-9)))])
               for q in levels]
        row[0] = float(grid[0])
        return LengthDistribution((math.inf,), tuple(levels), (tuple(row),),
                                  (int(sum(self.samples)),))

    def _band_points(self) -> list:
        """Return one prediction inside each band (its upper edge; the last band's lower)."""
        points = list(self.edges[:-1])
        return points + [points[-1] + 1.0 if points else 0.0]

    def to_arrays(self) -> dict:
        """Return the table as arrays (for a head's .npz)."""
        return {'dist_edges': np.asarray(self.edges, dtype=float),
                'dist_levels': np.asarray(self.levels, dtype=float),
                'dist_quantiles': np.asarray(self.quantiles, dtype=float),
                'dist_samples': np.asarray(self.samples, dtype=int)}

    @classmethod
    def from_arrays(cls, data) -> 'LengthDistribution | None':
        """Read the table written by to_arrays (None when the file has none)."""
        if 'dist_edges' not in data:
            return None
        return cls(tuple(float(x) for x in data['dist_edges']),
                   tuple(float(x) for x in data['dist_levels']),
                   tuple(tuple(float(x) for x in row) for row in data['dist_quantiles']),
                   tuple(int(x) for x in data['dist_samples']))


@functools.lru_cache(maxsize=16)
def unpredicted(dist: LengthDistribution) -> LengthDistribution:
    """Return ``dist``'s lengths over every band, made once per distribution."""
    return dist if len(dist.edges) == 1 else dist.marginal()


def observed_distribution(finished: Sequence[float], cut_short: Sequence[float],
                          ceiling: float, levels: tuple = LEVELS,
                          source: str = '') -> LengthDistribution | None:
    """Return the distribution of answer lengths seen, or None before any answer finished.

    ``finished``: lengths of answers that ended by themselves; ``cut_short``: tokens of
    answers stopped early (killed, cancelled), which say only that the answer runs
    longer. The Kaplan-Meier estimate (scipy's ``ecdf`` on right-censored data) uses
    both without counting a cut answer as short. The share it cannot place (answers
    cut beyond the last finished length) goes to ``ceiling``, so unknown tails plan long.
    """
    if len(finished) == 0:
        return None
    cdf = ecdf(CensoredData(uncensored=np.asarray(finished, dtype=float),
                            right=np.asarray(cut_short, dtype=float))).cdf
    lengths, probs = np.asarray(cdf.quantiles), np.asarray(cdf.probabilities)
    top = max(float(ceiling), float(lengths.max()))
    row = [float(min(finished))]
    for q in levels[1:]:
        at = int(np.searchsorted(probs, q - 1e-9))  # the first length whose CDF reaches q
        row.append(float(lengths[at]) if at < len(lengths) else top)
    return LengthDistribution((math.inf,), tuple(levels), (tuple(row),),
                              (len(finished) + len(cut_short),), source)
