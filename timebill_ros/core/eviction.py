# SPDX-License-Identifier: Apache-2.0
"""Smallest KV-cache eviction ratio that meets the deadline (TimeBill alpha*).

Setting WCET(alpha) <= T_left with M = N_W - 1 decode steps and solving the
linear inequality for alpha gives

    alpha >= 1 - (T_left - t_prefill - t_predict) / (p M N_x) + (M - 1) / (2 N_x)
               + q / (p N_x)

(the middle term carries no p: it comes from p * M (M - 1) / 2 divided by
p M N_x). alpha* is that bound clipped at 0; the request is infeasible when
alpha* > alpha_max. With no decode step (M = 0) or a non-increasing step model
(p <= 0) eviction cannot buy time, so alpha* = 0 or infeasible.
"""

from __future__ import annotations

from dataclasses import dataclass

from timebill_ros.core.timing import TimingModel


@dataclass(frozen=True)
class EvictionDecision:
    """Result of the solver."""

    alpha: float
    feasible: bool
    wcet_s: float


def alpha_bound(model: TimingModel, n_x: int, worst_tokens: int, time_left: float,
                t_predict: float = 0.0) -> float:
    """Return the unclipped closed-form lower bound on alpha (may be < 0 or > 1)."""
    steps = worst_tokens - 1
    if steps <= 0 or model.p <= 0.0:
        return 0.0 if model.wcet(n_x, 0.0, worst_tokens, t_predict) <= time_left else float('inf')
    slack = time_left - model.prefill(n_x) - t_predict
    return (1.0 - slack / (model.p * steps * n_x) + (steps - 1) / (2.0 * n_x)
            + model.q / (model.p * n_x))


def solve_alpha(model: TimingModel, n_x: int, worst_tokens: int, time_left: float,
                alpha_max: float = 0.95, t_predict: float = 0.0) -> EvictionDecision:
    """Return the smallest alpha in [0, alpha_max] whose WCET fits ``time_left``.

    When none fits, return alpha_max with feasible=False (callers decide whether
    to reject or run best-effort).
    """
    if not 0.0 <= alpha_max < 1.0:
        raise ValueError(f'alpha_max must be in [0, 1) (got {alpha_max})')
    if n_x < 1 or worst_tokens < 1:
        raise ValueError('need n_x >= 1 and worst_tokens >= 1')
    bound = alpha_bound(model, n_x, worst_tokens, time_left, t_predict)
    alpha = min(alpha_max, max(0.0, bound))
    wcet = model.wcet(n_x, alpha, worst_tokens, t_predict)
    # The root fits only up to rounding (WCET(alpha*) can land a hair above the time
    # left, and the planner would reject): step past it until it really fits.
    step = 1e-12
    while wcet > time_left and alpha < alpha_max:
        alpha = min(alpha_max, alpha + step)
        wcet = model.wcet(n_x, alpha, worst_tokens, t_predict)
        step *= 2.0
    if wcet > time_left:
        return EvictionDecision(alpha_max, False, wcet)
    return EvictionDecision(alpha, True, wcet)


def search_alpha(model: TimingModel, n_x: int, worst_tokens: int, time_left: float,
                 alpha_max: float = 0.95, t_predict: float = 0.0,
                 iterations: int = 100) -> EvictionDecision:
    """Find alpha* by bisection on the WCET sum (reference for the closed form)."""
    def wcet(alpha):
        # Direct sum over decode steps, independent of the closed form.
        kv0 = (1.0 - alpha) * n_x
        return (model.prefill(n_x) + t_predict
                + sum(model.step(kv0 + i - 1) for i in range(1, worst_tokens)))
    if wcet(0.0) <= time_left:
        return EvictionDecision(0.0, True, wcet(0.0))
    if wcet(alpha_max) > time_left:
        return EvictionDecision(alpha_max, False, wcet(alpha_max))
    low, high = 0.0, alpha_max
    for _ in range(iterations):
        mid = (low + high) / 2
        if wcet(mid) <= time_left:
            high = mid
        else:
            low = mid
    return EvictionDecision(high, True, wcet(high))


# Shortest prompt each kvpress press (0.5.5 defaults) can compress: SnapKV scores
# keys with the attention of its last 64 queries and asserts more prompt tokens than
# that; StreamingLLM and ExpectedAttention keep 4 sink tokens and assert more.
PRESS_MIN_PROMPT = {'snapkv': 65, 'streamingllm': 5, 'knorm': 2, 'expected_attention': 5}


def press_skip_reason(press: str, prompt_tokens: int, alpha: float) -> str:
    """Return why ``press`` cannot evict ``alpha`` of this prompt ('' when it can)."""
    if alpha <= 0.0:
        return ''
    least = PRESS_MIN_PROMPT.get(press, 1)
    if prompt_tokens < least:
        return (f'{press} skipped: prompt {prompt_tokens} tokens, the press needs at least '
                f'{least}')
    if int(prompt_tokens * (1.0 - alpha)) < 1:
        return f'{press} skipped: ratio {alpha:g} of {prompt_tokens} tokens would keep none'
    return ''
