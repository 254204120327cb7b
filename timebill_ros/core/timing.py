# SPDX-License-Identifier: Apache-2.0
"""Execution-time estimator (TimeBill ETE): fitted prefill and decode-step models, WCET.

Prefill time is quadratic in the prompt length N_x (attention's QK^T), a decode
step is linear in the KV-cache length N_kv:

    t_prefill(N_x) = a N_x^2 + b N_x + c        t_step(N_kv) = p N_kv + q

With eviction ratio alpha the i-th decode step (i = 1 .. N_W - 1; the first
token comes out of prefill) sees N_kv^i = (1 - alpha) N_x + i - 1, so

    WCET(alpha) = t_prefill(N_x) + t_predict
                  + p (N_W - 1)(1 - alpha) N_x + p (N_W - 1)(N_W - 2) / 2 + q (N_W - 1)
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
import math
import threading
from typing import Sequence

import numpy as np
# At import, not lazily: the first import takes ~0.2 s, and the first online refit
# runs in the decode loop between goals.
from scipy.optimize import lsq_linear


@dataclass(frozen=True)
class TimingModel:
    """Fitted coefficients (seconds) of the prefill and decode-step models."""

    a: float
    b: float
    c: float
    p: float
    q: float

    def prefill(self, n_x: float) -> float:
        """Estimate prefill time for a prompt of n_x tokens."""
        return self.a * n_x * n_x + self.b * n_x + self.c

    def step(self, n_kv: float) -> float:
        """Estimate one decode step with n_kv tokens in the cache."""
        return self.p * n_kv + self.q

    def decode(self, kv_after_prefill: float, tokens: int) -> float:
        """Estimate the decode steps that produce ``tokens`` answer tokens in closed form."""
        steps = max(0, int(tokens) - 1)
        return self.p * steps * kv_after_prefill + self.p * steps * (steps - 1) / 2 \
            + self.q * steps

    def wcet(self, n_x: int, alpha: float, worst_tokens: int, t_predict: float = 0.0) -> float:
        """Worst-case end-to-end time with eviction ratio alpha and N_W answer tokens."""
        return self.prefill(n_x) + t_predict + self.decode((1.0 - alpha) * n_x, worst_tokens)


@dataclass(frozen=True)
class CachedPrefixTiming(TimingModel):
    """The ETE of a prompt whose first ``cached`` tokens come from the prefix cache.

    Only the rest is prefilled: its share of the quadratic and linear terms, plus the
    fixed cost of a prefill.
    """

    cached: int = 0

    def prefill(self, n_x: float) -> float:
        """Estimate the prefill of the uncached part of an ``n_x``-token prompt."""
        m = min(float(self.cached), max(0.0, n_x - 1.0))
        return self.a * (n_x * n_x - m * m) + self.b * (n_x - m) + self.c


# Prompt tokens per block of the torch engine's prefix cache (runtime.prefix_cache): a
# repeated prompt is reused up to its last whole block before its last token.
PREFIX_BLOCK = 32


def reusable_prefix(prompt_tokens: int, block: int = PREFIX_BLOCK) -> int:
    """Return the tokens of a repeated ``prompt_tokens`` prompt the prefix cache supplies."""
    return max(0, prompt_tokens - 1) // block * block


LLAMA_MIN_REUSE = 32  # fewest shared prompt tokens a llama.cpp option takes from a held one


def held_prefix(prompt_tokens: int, chunk: int) -> int:
    """Return the tokens of a repeated prompt a llama.cpp option takes from its held copy.

    A prompt is held only when longer than a chunk and LLAMA_MIN_REUSE (runtime
    llama_engine.LlamaModel.hold); a repeat takes the whole chunks of all but its last
    token.
    """
    if prompt_tokens <= max(chunk, LLAMA_MIN_REUSE):
        return 0
    same = (prompt_tokens - 1) // chunk * chunk
    return same if same >= LLAMA_MIN_REUSE else 0


def with_cached_prefix(model: TimingModel, cached: int) -> TimingModel:
    """Return ``model`` for a prompt whose first ``cached`` tokens need no prefill."""
    if cached <= 0:
        return model
    return CachedPrefixTiming(model.a, model.b, model.c, model.p, model.q, int(cached))


def worst_case_tokens(predicted: int, factor: float, n_max: int) -> int:
    """Return N_W = min(N_max, ceil(k * N_hat)), at least one token."""
    if factor < 1.0 or not math.isfinite(factor):
        raise ValueError(f'pessimistic factor must be finite and >= 1 (got {factor})')
    return max(1, min(int(n_max), int(math.ceil(factor * max(1, int(predicted))))))


def fit_prefill(n_x: Sequence[float], seconds: Sequence[float],
                weights: Sequence[float] | None = None) -> tuple:
    """Least-squares fit of t = a N_x^2 + b N_x + c; return (a, b, c)."""
    x = np.asarray(n_x, dtype=float)
    if len(np.unique(x)) < 3:
        raise ValueError('need prefill timings at 3 or more distinct prompt lengths')
    # Attention and MLP cost cannot fall with length: a, b >= 0 keeps a noisy fit from
    # bending down beyond the measured grid.
    design = np.stack([x * x, x, np.ones_like(x)], axis=1)
    a, b, c = _bounded_lstsq(design, seconds, weights, lower=(0.0, 0.0, -np.inf))
    return float(a), float(b), float(c)


def fit_decode(n_kv: Sequence[float], seconds: Sequence[float],
               weights: Sequence[float] | None = None) -> tuple:
    """Least-squares fit of t = p N_kv + q; return (p, q)."""
    x = np.asarray(n_kv, dtype=float)
    if len(np.unique(x)) < 2:
        raise ValueError('need decode timings at 2 or more distinct KV lengths')
    design = np.stack([x, np.ones_like(x)], axis=1)
    p, q = _bounded_lstsq(design, seconds, weights, lower=(0.0, -np.inf))
    return float(p), float(q)


def _bounded_lstsq(design, seconds, weights, lower):
    """Solve weighted least squares with lower bounds (scipy.optimize.lsq_linear)."""
    y = np.asarray(seconds, dtype=float)
    if weights is not None:
        root = np.sqrt(np.asarray(weights, dtype=float))
        design, y = design * root[:, None], y * root
    # Scale columns so N^2 (~1e7) and 1 are comparable for the solver.
    scale = np.maximum(np.abs(design).max(axis=0), 1e-12)
    result = lsq_linear(design / scale, y, bounds=(np.asarray(lower) * scale, np.inf))
    return result.x / scale


def mape(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Mean absolute percentage error, in percent."""
    pred, act = np.asarray(predicted, dtype=float), np.asarray(actual, dtype=float)
    if pred.shape != act.shape or act.size == 0:
        raise ValueError('need equally long, non-empty sequences')
    if np.any(act <= 0):
        raise ValueError('actual times must be > 0')
    return float(np.mean(np.abs(pred - act) / act) * 100.0)


def ape(predicted: Sequence[float], actual: Sequence[float]) -> list:
    """Absolute percentage errors, in percent, one per point."""
    return [abs(p - a) / a * 100.0 for p, a in zip(predicted, actual)]


class EstimateErrors:
    """The ETE's recent errors: measured / estimated decode time of served goals.

    Each ratio is taken against the model a goal was planned with (before the goal
    refits it), so it is the error a plan meets. The planner reads a few quantiles of
    them to tell how likely an option that fits on paper fits on this machine: with
    a 10 % margin, a goal planned at 0.95 of its budget misses whenever its steps run
    6 % slow, which a 2-core VM does often (rerun times spread 0.8-1.5x here).
    """

    QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)  # equal-weight points of the distribution

    def __init__(self, capacity: int = 64, minimum: int = 8):
        """Keep the last ``capacity`` ratios; answer nothing before ``minimum`` of them."""
        self._ratios: deque = deque(maxlen=capacity)
        self._minimum = minimum
        self._points: tuple = ()
        self._lock = threading.Lock()

    def observe(self, measured_s: float, estimated_s: float) -> None:
        """Add one goal's measured and estimated decode seconds."""
        if measured_s <= 0.0 or estimated_s <= 0.0:
            return
        with self._lock:
            self._ratios.append(_clamp_drift(measured_s / estimated_s))
            if len(self._ratios) >= self._minimum:
                self._points = tuple(float(x) for x in np.quantile(
                    np.fromiter(self._ratios, float), self.QUANTILES))

    def points(self) -> tuple:
        """Return the ratios at QUANTILES (empty until ``minimum`` goals were seen)."""
        return self._points

    def __len__(self) -> int:
        """Return how many ratios are kept."""
        return len(self._ratios)


@dataclass
class OnlineTimingModel:
    """Refit the ETE after every served goal from a bounded, forgetting window of samples.

    Each served goal adds its prefill time and a few of its decode steps to a bounded
    window, where older samples weigh ``forgetting``**age. Calibration samples age as if
    they were the window's oldest, but never below ``prior_floor`` and never leave: they
    are the only long prompts a node serving short commands has seen. When they left the
    window (after 256 short goals) the quadratic term was fitted to short prompts' noise
    alone, and a 4,000-token prefill was planned at under half or over 1.4x its time
    (test_timing simulates it); where served goals have no samples, even a small weight
    decides.

    The re-fit alone follows a uniform slowdown slowly (the calibration samples
    still outvote a goal's few), so each phase also carries a drift factor: an
    exponential average (weight ``drift_gain``) of measured time / the re-fit's
    time for each goal, taken after the re-fit has seen the goal, so it holds
    only what the fit still misses (taken before, it counted the goal twice and
    over-estimated every plan after a change). ``model`` is the fit scaled by
    the drift factors. Under a steady slowdown s the fit tends to some m
    between 1 and s and the factor to s / m, so the product is s.
    """

    model: TimingModel
    capacity: int = 256
    forgetting: float = 0.98
    steps_per_goal: int = 8
    prefill_samples: deque = field(default=None)
    decode_samples: deque = field(default=None)
    prefill_prior: list = field(default_factory=list)  # calibration samples: always fitted
    decode_prior: list = field(default_factory=list)
    prior_floor: float = 0.005
    drift_gain: float = 0.5
    drift_prefill: float = 1.0
    drift_decode: float = 1.0
    errors: EstimateErrors = field(default_factory=EstimateErrors)

    def __post_init__(self):
        """Size the sample windows."""
        if self.capacity < 8 or not 0.0 < self.forgetting <= 1.0:
            raise ValueError('need capacity >= 8 and 0 < forgetting <= 1')
        if not 0.0 <= self.drift_gain <= 1.0:
            raise ValueError('drift_gain must be in [0, 1]')
        self.prefill_samples = deque(self.prefill_samples or (), maxlen=self.capacity)
        self.decode_samples = deque(self.decode_samples or (), maxlen=self.capacity)
        self.fit = self.model

    def seed(self, prefill: Sequence[tuple], decode: Sequence[tuple]) -> None:
        """Add calibration samples (n, seconds), kept in every refit; do not refit now."""
        self.prefill_prior.extend(prefill)
        self.decode_prior.extend(decode)

    def observe(self, n_x: int, prefill_s: float, kv_after_prefill: int,
                step_times: Sequence[float]) -> TimingModel:
        """Fold one served goal's timings in and refit; return the new model."""
        if step_times:  # the plan's error, before the goal teaches the model
            self.errors.observe(float(sum(step_times)),
                                self.model.decode(kv_after_prefill, len(step_times) + 1))
        if prefill_s > 0:
            self.prefill_samples.append((n_x, prefill_s))
        if step_times:
            # Contiguous bins, each summarised by its mean: the WCET sums steps, so an
            # occasional slow step (another process, GC) belongs in the estimate.
            bins = np.array_split(np.asarray(step_times, dtype=float),
                                  min(self.steps_per_goal, len(step_times)))
            start = 0
            for chunk in bins:
                # Step i (0-based) appends answer token i + 1 with kv_after_prefill + i cached.
                middle = kv_after_prefill + start + (len(chunk) - 1) / 2.0
                self.decode_samples.append((middle, float(chunk.mean())))
                start += len(chunk)
        self.fit = self._refit()
        if prefill_s > 0:
            self.drift_prefill = self._drift(self.drift_prefill, prefill_s,
                                             self.fit.prefill(n_x))
        if step_times:
            self.drift_decode = self._drift(self.drift_decode, float(sum(step_times)),
                                            self.fit.decode(kv_after_prefill,
                                                            len(step_times) + 1))
        self._scale()
        return self.model

    def _scale(self) -> None:
        """Set ``model``: the fit scaled by the prefill and decode drift factors."""
        f, g = self.drift_prefill, self.drift_decode
        self.model = TimingModel(self.fit.a * f, self.fit.b * f, self.fit.c * f,
                                 self.fit.p * g, self.fit.q * g)

    def _drift(self, current: float, measured: float, fitted: float) -> float:
        if fitted <= 0.0 or measured <= 0.0:
            return current
        # Clamped: one pathological goal (a suspended process) must not wreck plans.
        ratio = _clamp_drift(measured / fitted)
        return (1.0 - self.drift_gain) * current + self.drift_gain * ratio

    def share_decode_drift(self, others: Sequence['OnlineTimingModel'], before: float) -> None:
        """Scale the others' decode drift by how much this model's moved since ``before``.

        The models of one machine's precisions slow down and speed up together (another
        guest's load, a clock change); a precision that seldom runs would otherwise keep
        the speed of the moment it last ran, and one timed in a slow moment would look
        not worth planning, never run and never learn otherwise. Each precision's own
        shape stays in its fit, which its own steps refit.
        """
        if before <= 0.0 or self.drift_decode == before:
            return
        factor = self.drift_decode / before
        for other in others:
            if other is not self:
                other.rescale_decode_drift(factor)

    def rescale_decode_drift(self, factor: float) -> None:
        """Multiply the decode drift by ``factor`` (clamped as the drift is) and re-scale."""
        self.drift_decode = _clamp_drift(self.drift_decode * factor)
        self._scale()

    def _refit(self) -> TimingModel:
        a, b, c = self.fit.a, self.fit.b, self.fit.c
        p, q = self.fit.p, self.fit.q
        try:
            a, b, c = fit_prefill(*self._weighted(self.prefill_prior, self.prefill_samples))
        except ValueError:
            pass  # too few distinct lengths yet: keep the previous prefill fit
        try:
            p, q = fit_decode(*self._weighted(self.decode_prior, self.decode_samples))
        except ValueError:
            pass
        return TimingModel(a, b, c, p, q)

    def _weighted(self, prior: list, window: deque) -> tuple:
        """Return (lengths, seconds, weights): by age, the prior oldest and at least its floor."""
        xs, ys = _xy(list(prior) + list(window))
        weights = _ages(len(prior) + len(window), self.forgetting)
        floor = self.prior_floor
        return xs, ys, [max(w, floor) for w in weights[:len(prior)]] + weights[len(prior):]


def _clamp_drift(factor: float) -> float:
    return min(3.0, max(1.0 / 3.0, factor))


def _xy(samples):
    xs, ys = zip(*samples) if samples else ((), ())
    return list(xs), list(ys)


def _ages(n: int, forgetting: float) -> list:
    return [forgetting ** (n - 1 - i) for i in range(n)]


def as_dict(model: TimingModel) -> dict:
    """Return the coefficients as a plain dict (for YAML)."""
    return asdict(model)


@dataclass(frozen=True)
class BatchTimingModel:
    """Decode step of a batch of b sequences: t(b, K) = p_b K + q_b, K = cached KV in all.

    The batched step pads every cache to the longest, so K is b x the longest cache.
    The cost of a step is not linear in b on a CPU (a GEMM of 4 rows may run faster than
    one of 3), so each batch size has its own pair, profiled by ``timebill_calibrate``;
    beyond the largest measured size the last two sizes are extrapolated linearly.
    ``drift`` scales every step (the online ratio of measured to fitted batched steps).
    """

    coefficients: tuple  # ((p_1, q_1), (p_2, q_2), ...): index b - 1
    drift: float = 1.0

    def __post_init__(self):
        """Check that at least batch size 1 is known."""
        if not self.coefficients:
            raise ValueError('a batch timing model needs at least batch size 1')

    @property
    def max_measured(self) -> int:
        """Return the largest batch size that was profiled."""
        return len(self.coefficients)

    def _pq(self, batch: int) -> tuple:
        known = self.coefficients
        if batch <= len(known):
            return known[max(1, batch) - 1]
        if len(known) == 1:
            p, q = known[0]
            return p, q * batch
        (p1, q1), (p2, q2) = known[-2], known[-1]
        extra = batch - len(known)
        return max(p2, p2 + (p2 - p1) * extra), max(q2, q2 + (q2 - q1) * extra)

    def step(self, batch: int, total_kv: float) -> float:
        """Estimate one batched step with ``total_kv`` cached tokens over the batch."""
        p, q = self._pq(batch)
        return (p * total_kv + q) * self.drift

    def member(self, single: TimingModel, batch: int, other_kv: float) -> TimingModel:
        """Return the ETE of a goal decoding in a batch of ``batch`` (itself included).

        ``other_kv`` is what the other members keep cached (padded). The goal's prefill
        is its own (it runs alone); each of its decode steps costs a whole batch step.
        """
        if batch <= 1:
            return single
        p, q = self._pq(batch)
        return TimingModel(single.a, single.b, single.c, p * self.drift,
                           (q + p * other_kv) * self.drift)

    def with_drift(self, drift: float) -> 'BatchTimingModel':
        """Return this model with another drift factor."""
        return BatchTimingModel(self.coefficients, drift)

    def as_list(self) -> list:
        """Return [[p_b, q_b], ...] for a profile file."""
        return [[float(p), float(q)] for p, q in self.coefficients]


def fit_batch(points: Sequence[Sequence[float]]) -> BatchTimingModel:
    """Fit one (p_b, q_b) per batch size from (b, total KV, seconds) points.

    Batch sizes must run 1..B without gaps, each with 2 or more distinct KV totals.
    """
    by_size: dict = {}
    for b, kv, seconds in points:
        by_size.setdefault(int(b), []).append((float(kv), float(seconds)))
    sizes = sorted(by_size)
    if not sizes or sizes != list(range(1, sizes[-1] + 1)):
        raise ValueError(f'need batch sizes 1..B without gaps (got {sizes})')
    pairs = []
    for b in sizes:
        xs, ys = zip(*by_size[b])
        pairs.append(fit_decode(xs, ys, weights=[1.0 / y ** 2 for y in ys]))
    return BatchTimingModel(tuple(pairs))


@dataclass
class OnlineBatchDrift:
    """Follow how batched steps run against the profiled batch model (one drift factor).

    Each observed step of 2 or more sequences is first scored (its error against the
    current model, kept for ``mape``), then folded into the drift factor.
    """

    model: BatchTimingModel
    gain: float = 0.2
    window: int = 256
    errors: deque = field(default=None)

    def __post_init__(self):
        """Size the error window."""
        self.errors = deque(self.errors or (), maxlen=self.window)
        self._lock = threading.Lock()  # the worker appends while diagnostics read

    def observe(self, batch: int, total_kv: float, seconds: float) -> BatchTimingModel:
        """Fold one measured batched step in; return the drifted model."""
        model = self.model
        fitted = model.with_drift(1.0).step(batch, total_kv)
        if fitted > 0.0 and seconds > 0.0 and batch > 1:
            with self._lock:
                self.errors.append(abs(model.step(batch, total_kv) - seconds) / seconds * 100.0)
            ratio = min(3.0, max(1.0 / 3.0, seconds / fitted))
            self.model = model.with_drift((1.0 - self.gain) * model.drift + self.gain * ratio)
        return self.model

    def mape(self) -> float:
        """Return the mean absolute % error of the batched steps seen (0 when none)."""
        with self._lock:
            errors = list(self.errors)
        return float(np.mean(errors)) if errors else 0.0


def fewest_threads(times: dict, margin: float = 0.05, keep: int | None = None,
                   keep_margin: float = 0.15) -> int:
    """Return the fewest threads whose time is within ``margin`` of the fastest.

    ``times`` maps an intra-op thread count to a measured step time. Near-ties go to
    fewer threads: they leave cores to the rest of the stack. ``keep`` (the count a
    stored profile was timed at) wins while within ``keep_margin`` of the fastest, so
    that a noisy probe does not force a recalibration at every start.
    """
    if not times:
        raise ValueError('no thread counts were timed')
    fastest = min(times.values())
    if keep in times and times[keep] <= fastest * (1.0 + keep_margin):
        return keep
    return min(n for n, t in times.items() if t <= fastest * (1.0 + margin))
