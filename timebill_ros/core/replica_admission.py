# SPDX-License-Identifier: Apache-2.0
"""Admission of a goal served by replicas: which replica, what it expects, or why not.

Pure rules (core): the pool is read by duck type (serving/replica_pool.py).
The answer length comes from the node's text-side length
predictor (a prediction and its calibrated distribution) when it has one, else from the
node's recent answers (their spread, answers cut short counted as longer:
Learning.recent_lengths); the time from the chosen replica's own timing model
(serving.replica_pool.ReplicaTiming). The rules are those of
the local planner: refuse only a goal whose answer has (almost) no chance to end in the
tokens that fit (``admit_probability``), and, with ``yield_when_late``, one that would
cost the goals already on its replica more expected deadlines than its own chance (its
prefill and its seat slow their steps), so it does not take their time.
"""

from __future__ import annotations

from dataclasses import dataclass

from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Mode, Rejection


@dataclass(frozen=True)
class LengthBasis:
    """What a goal's answer length is planned on.

    ``spread``: a LengthDistribution (None: only ``typical`` is known); ``predicted``:
    the prediction it is read at (0 for the spread of recent answers, which needs none).
    """

    spread: object
    typical: float
    predicted: int = 0
    predictor: str = 'recent answers'

    def words(self, expected: int) -> str:
        """Return how the plan note names the expected answer."""
        if self.predicted:
            return f'{expected}-token answer ({self.predictor} predicted {self.predicted})'
        if self.spread is not None:
            return f'{expected}-token answer (median of the {self.predictor})'
        return f'{expected}-token answer (the recent mean)'


def expected_lengths(basis: LengthBasis, cap: int, quantile: float) -> tuple:
    """Return (median, planned quantile) of the answer length, each within [1, cap]."""
    def clamp(tokens: float) -> int:
        return max(1, min(int(round(tokens)), cap))
    spread = basis.spread
    if spread is None:
        return clamp(basis.typical), clamp(basis.typical)
    return clamp(spread.quantile(0.5, basis.predicted)), \
        clamp(spread.quantile(quantile, basis.predicted))


def fit_probability(basis: LengthBasis, expected: int, fit_tokens: int, cap: int) -> float:
    """Return P(the answer ends within ``fit_tokens``).

    Before the node has a spread of recent answers, lengths are taken as uniform over
    1 .. 2 x ``expected`` (the recent mean): a guess that refuses no goal with a chance.
    """
    if fit_tokens >= cap:
        return 1.0
    if basis.spread is None:
        return min(1.0, fit_tokens / (2.0 * expected))
    return basis.spread.prob_at_most(fit_tokens, basis.predicted)


def chance_after(basis: LengthBasis, expected: int, streamed: int, fit_tokens: int,
                 cap: int) -> float:
    """Return P(the answer ends within ``fit_tokens`` | it did not end in ``streamed``)."""
    if fit_tokens >= cap:
        return 1.0
    if fit_tokens <= streamed:
        return 0.0
    ended = fit_probability(basis, expected, streamed, cap) if streamed else 0.0
    if ended >= 1.0:  # longer than every answer the spread knows: take it as a fresh one
        return fit_probability(basis, expected, fit_tokens - streamed, cap)
    chance = fit_probability(basis, expected, fit_tokens, cap)
    return max(0.0, (chance - ended) / (1.0 - ended))


def cost_to_others(route, prompt_tokens: int, now: float) -> float:
    """Return the deadlines a goal joining ``route`` is expected to cost the goals there.

    Each goal in flight on the replica loses the chance of its answer ending in the
    tokens that fit in its time left, when the newcomer's prefill chunks and its seat in
    every decode step join (vLLM batches a waiting prompt's chunks into the running goals'
    steps). Summed over the goals: expected deadlines met lost.
    """
    timing, running, lost = route.timing, route.replica.running, 0.0
    delay = timing.prefill_s(prompt_tokens)
    for goal in list(route.replica.inflight):
        if goal.basis is None:
            continue
        left = goal.deadline - now - goal.prefill_left_s(now, timing)
        alone = goal.tokens + _steps(left, timing.itl_s(running - 1))
        beside = goal.tokens + _steps(left - delay, timing.itl_s(running))
        lost += (chance_after(goal.basis, goal.expected, goal.tokens, alone, goal.cap)
                 - chance_after(goal.basis, goal.expected, goal.tokens, beside, goal.cap))
    return max(0.0, lost)


def _steps(seconds: float, step_s: float) -> int:
    return max(0, int(seconds / max(step_s, 1e-6)))


@dataclass(frozen=True)
class _Option:
    """A replica a goal could run on: its route, the tokens that fit, both chances."""

    route: object
    fit: int
    chance: float
    cost: float

    @property
    def gain(self) -> float:
        """Return the expected deadlines met the goal adds there (its own less its cost)."""
        return self.chance - self.cost


def _options(pool, basis: LengthBasis, prompt_tokens: int, expected: int, cap: int,
             left_s: float) -> list:
    """Return each replica up as an _Option, earliest predicted finish first."""
    now, options = pool.clock(), []
    for route in pool.routes(prompt_tokens, expected, now + left_s):
        fit = route.timing.tokens_within(prompt_tokens, route.load, left_s - route.wait_s)
        cost = cost_to_others(route, prompt_tokens, now) if route.replica.running else 0.0
        options.append(_Option(route, fit, fit_probability(basis, expected, fit, cap), cost))
    return options


def plan_on_pool(pool, basis: LengthBasis, prompt_tokens: int, cap: int,
                 left_s: float, config, moving: bool = False) -> tuple:
    """Return (replica, Plan) for a goal with ``left_s`` seconds left; raise Rejection.

    The goal goes where it adds the most expected deadlines met: its own chance there
    less what it costs the goals already there (ties: the earliest predicted finish).
    ``moving``: the goal was admitted and its replica failed; it does not yield (it
    would end FAILED for a planning choice) and goes on wherever a token of it still
    fits, at any chance; only where none fits is it refused.
    """
    expected, planned = expected_lengths(basis, cap, config.plan_quantile)
    options = _options(pool, basis, prompt_tokens, expected, cap, left_s)
    if not options:
        raise Rejection(f'no replica is up ({pool.down_reasons()})')
    words = basis.words(expected)

    def idle_try(option) -> bool:
        # As on the node's own engine: an idle replica loses nothing by trying, and its
        # stream refreshes figures that, unused, would refuse every goal.
        return option.fit >= 1 and option.route.load.running == 0 and config.idle_best_effort

    admissible = [o for o in options if o.fit >= 1
                  and (o.chance >= config.admit_probability or idle_try(o) or moving)]
    if not admissible:
        first = options[0]
        raise Rejection(f'no replica is predicted to answer in time: '
                        f'{first.route.seconds:.3f} s for a {words} on '
                        f'{first.route.replica.url} with {left_s:.3f} s left; P(answer ends '
                        f'within the {first.fit} tokens that fit) = {first.chance:.3f}')
    best = max(admissible, key=lambda o: (round(o.gain, 3), -o.route.seconds))
    route, fit, chance = best.route, best.fit, best.chance
    replica, seconds, load, timing = route.replica, route.seconds, route.load, route.timing
    if config.yield_when_late and not moving and load.running > 0 and best.gain < 0.0:
        raise Rejection(f'yielding to the {load.running} goals running on {replica.url}: '
                        f'joining them is expected to cost them {best.cost:.2f} deadlines '
                        f'for its own chance {chance:.2f} ({seconds:.3f} s for a {words}, '
                        f'{left_s:.3f} s left)')
    best_effort = '' if chance >= config.admit_probability else (
        f'best effort {"after its replica failed" if moving else "on an idle replica"}: '
        f'P(answer ends within the {fit} tokens that fit) = {chance:.3f}; ')
    ttft = route.wait_s + timing.ttft_s(prompt_tokens, load)
    worst = route.wait_s + timing.finish_s(prompt_tokens, planned, load)
    plan = Plan(mode=Mode.NONE, prompt_tokens=prompt_tokens, predicted_tokens=expected,
                predictor=basis.predictor, worst_case_tokens=planned, est_prefill_s=ttft,
                est_decode_s=max(0.0, seconds - ttft), est_wcet_s=worst,
                est_wcet_full_s=worst, feasible=True, fit_probability=chance,
                note=f'{best_effort}replica {replica.url}: {seconds:.3f} s predicted for a '
                     f'{words} '
                     f'({running_words(load, route)}); P(fit) {chance:.3f}'
                     + (f', expected to cost the goals there {best.cost:.2f}'
                        if best.cost else ''))
    return replica, plan


def running_words(load, route) -> str:
    """Return what the plan note says of the goals beside it on the replica."""
    return (f'{load.running} running there; ahead by deadline {load.ahead}, with '
            f'{load.ahead_tokens} prompt tokens to prefill'
            + (f'; {route.stand_in}' if route.stand_in else ''))
