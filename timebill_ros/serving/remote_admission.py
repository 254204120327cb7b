"""Admission of a goal served by replicas: which replica, what it expects, or why not.

ROS-free and model-free. The answer length comes from the node's text-side length
predictor (a prediction and its calibrated distribution) when it has one, else from the
node's recent answers (their spread, answers cut short counted as longer:
Learning.recent_lengths); the time from the chosen replica's own timing model
(serving.remote.ReplicaTiming). The rules are those of
the local planner: refuse only a goal whose answer has (almost) no chance to end in the
tokens that fit (``admit_probability``), and, with ``yield_when_late``, one that is
expected to miss while other goals share its replica, so it does not take their time.
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


def plan_on_pool(pool, basis: LengthBasis, prompt_tokens: int, cap: int,
                 left_s: float, config) -> tuple:
    """Return (replica, Plan) for a goal with ``left_s`` seconds left; raise Rejection."""
    expected, planned = expected_lengths(basis, cap, config.plan_quantile)
    route = pool.earliest(prompt_tokens, expected, pool.clock() + left_s)
    replica, seconds, load, timing = route.replica, route.seconds, route.load, route.timing
    if replica is None:
        raise Rejection(f'no replica is up ({pool.down_reasons()})')
    running = load.running
    fit = timing.tokens_within(prompt_tokens, load, left_s)
    chance = fit_probability(basis, expected, fit, cap)
    words = basis.words(expected)
    best_effort = ''
    if fit >= 1 and running == 0 and config.idle_best_effort \
            and chance < config.admit_probability:
        # As on the node's own engine: an idle replica loses nothing by trying, and its
        # stream refreshes figures that, unused, would refuse every goal.
        best_effort = (f'best effort on an idle replica: P(answer ends within the {fit} '
                       f'tokens that fit) = {chance:.3f}; ')
    elif fit < 1 or chance < config.admit_probability:
        raise Rejection(f'no replica is predicted to answer in time: {seconds:.3f} s for a '
                        f'{words} on {replica.url} with {left_s:.3f} s left; '
                        f'P(answer ends within the {fit} tokens that fit) = {chance:.3f}')
    if config.yield_when_late and running > 0 and seconds > left_s:
        raise Rejection(f'yielding to the {running} goals running on {replica.url}: this one '
                        f'is expected to miss ({seconds:.3f} s for a {words}, '
                        f'{left_s:.3f} s left)')
    ttft = timing.ttft_s(prompt_tokens, load)
    worst = timing.finish_s(prompt_tokens, planned, load)
    plan = Plan(mode=Mode.NONE, prompt_tokens=prompt_tokens, predicted_tokens=expected,
                predictor=basis.predictor, worst_case_tokens=planned, est_prefill_s=ttft,
                est_decode_s=max(0.0, seconds - ttft), est_wcet_s=worst,
                est_wcet_full_s=worst, feasible=True, fit_probability=chance,
                note=f'{best_effort}replica {replica.url}: {seconds:.3f} s predicted for a '
                     f'{words} '
                     f'({running} running there; ahead by deadline {load.ahead}, with '
                     f'{load.ahead_tokens} prompt tokens to prefill'
                     + (f'; {route.stand_in}' if route.stand_in else '')
                     + f'); P(fit) {chance:.3f}')
    return replica, plan
