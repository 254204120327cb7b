"""Admission of a goal served by replicas: which replica, what it expects, or why not.

ROS-free and model-free. The answer length comes from the node's recent answers (their
spread, answers cut short counted as longer: Learning.recent_lengths), the time from the
chosen replica's own timing model (serving.remote.ReplicaTiming). The rules are those of
the local planner: refuse only a goal whose answer has (almost) no chance to end in the
tokens that fit (``admit_probability``), and, with ``yield_when_late``, one that is
expected to miss while other goals share its replica, so it does not take their time.
"""

from __future__ import annotations

from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Mode, Rejection


def expected_lengths(spread, typical: float, cap: int, quantile: float) -> tuple:
    """Return (median, planned quantile) of the answer length, each within [1, cap]."""
    def clamp(tokens: float) -> int:
        return max(1, min(int(round(tokens)), cap))
    if spread is None:
        return clamp(typical), clamp(typical)
    return clamp(spread.quantile(0.5, 0.0)), clamp(spread.quantile(quantile, 0.0))


def fit_probability(spread, expected: int, fit_tokens: int, cap: int) -> float:
    """Return P(the answer ends within ``fit_tokens``).

    Before the node has a spread of recent answers, lengths are taken as uniform over
    1 .. 2 x ``expected`` (the recent mean): a guess that refuses no goal with a chance.
    """
    if fit_tokens >= cap:
        return 1.0
    if spread is None:
        return min(1.0, fit_tokens / (2.0 * expected))
    return spread.prob_at_most(fit_tokens, 0.0)


def plan_on_pool(pool, spread, typical: float, prompt_tokens: int, cap: int,
                 left_s: float, config) -> tuple:
    """Return (replica, Plan) for a goal with ``left_s`` seconds left; raise Rejection."""
    expected, planned = expected_lengths(spread, typical, cap, config.plan_quantile)
    replica, seconds, load = pool.earliest(prompt_tokens, expected, pool.clock() + left_s)
    if replica is None:
        raise Rejection(f'no replica is up ({pool.down_reasons()})')
    running, timing = load.running, replica.timing
    fit = timing.tokens_within(prompt_tokens, load, left_s)
    chance = fit_probability(spread, expected, fit, cap)
    basis = (f'{expected}-token answer (median of the recent ones)' if spread is not None
             else f'{expected}-token answer (the recent mean)')
    if fit < 1 or chance < config.admit_probability:
        raise Rejection(f'no replica is predicted to answer in time: {seconds:.3f} s for a '
                        f'{basis} on {replica.url} with {left_s:.3f} s left; '
                        f'P(answer ends within the {fit} tokens that fit) = {chance:.3f}')
    if config.yield_when_late and running > 0 and seconds > left_s:
        raise Rejection(f'yielding to the {running} goals running on {replica.url}: this one '
                        f'is expected to miss ({seconds:.3f} s for a {basis}, '
                        f'{left_s:.3f} s left)')
    ttft = timing.ttft_s(prompt_tokens, load.ahead_tokens)
    worst = timing.finish_s(prompt_tokens, planned, load)
    plan = Plan(mode=Mode.NONE, prompt_tokens=prompt_tokens, predicted_tokens=expected,
                predictor='recent answers', worst_case_tokens=planned, est_prefill_s=ttft,
                est_decode_s=max(0.0, seconds - ttft), est_wcet_s=worst,
                est_wcet_full_s=worst, feasible=True, fit_probability=chance,
                note=f'replica {replica.url}: {seconds:.3f} s predicted for a {basis} '
                     f'({running} running there; ahead by deadline {load.ahead}, with '
                     f'{load.ahead_tokens} prompt tokens to prefill); '
                     f'P(fit) {chance:.3f}')
    return replica, plan
