"""Inference plans and the planner interface the node calls before running a goal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from timebill_ros.core.early_exit import ExitRule, LayerTimes, p99_tpot_estimate, schedulable
from timebill_ros.core.eviction import solve_alpha
from timebill_ros.core.request import Mode, Rejection, Request
from timebill_ros.core.timing import TimingModel, worst_case_tokens


@dataclass(frozen=True)
class Plan:
    """How one request will be run; mirrors msg/InferencePlan (zeros = not planned)."""

    mode: Mode = Mode.NONE
    prompt_tokens: int = 0
    predicted_tokens: int = 0
    predictor: str = ''
    worst_case_tokens: int = 0
    pessimistic_factor: float = 0.0
    eviction_ratio: float = 0.0
    press: str = ''
    est_prefill_s: float = 0.0
    est_decode_s: float = 0.0
    est_wcet_s: float = 0.0
    est_wcet_full_s: float = 0.0
    est_wcet_alpha_max_s: float = 0.0
    feasible: bool = True
    # Early exit (MODE_EARLY_EXIT): candidate layers; schedulability with a per-token
    # deadline D: estimated P99 time per output token and utilisation P99 / D.
    exit_layers: tuple = ()
    token_deadline_s: float = 0.0
    est_p99_tpot_s: float = 0.0
    utilisation: float = 0.0


class Planner(Protocol):
    """Anything that turns a request into a plan (or raises Rejection)."""

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float,
             predicted: int | None = None) -> Plan:
        """Plan a request whose prompt has ``prompt_tokens`` with ``time_left_s`` to go.

        ``predicted`` reuses an earlier length prediction for the same request.
        """


class FullModelPlanner:
    """Run every request at full quality: no estimate, no eviction (MODE_NONE)."""

    name = 'full-model'

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float,
             predicted: int | None = None) -> Plan:
        """Return a plan that only records the prompt length and the mode."""
        return Plan(mode=Mode.NONE, prompt_tokens=prompt_tokens,
                    pessimistic_factor=request.pessimistic_factor)


class LengthPredictor(Protocol):
    """Predict the target model's answer length for a request (tokens)."""

    name: str

    def predict(self, request: Request, prompt_tokens: int) -> int:
        """Return the predicted number of answer tokens."""


class MaxTokensPredictor:
    """Stand-in predictor: assume the answer uses the goal's whole max_new_tokens.

    Safe (never under-predicts within N_max) but pessimistic: the planner then
    evicts as if every answer ran to its cap. The response length predictor
    issue replaces it through the same interface.
    """

    name = 'max-new-tokens'

    def predict(self, request: Request, prompt_tokens: int) -> int:
        """Return the goal's max_new_tokens."""
        return request.max_new_tokens


INFEASIBLE_POLICIES = ('reject', 'best_effort')


@dataclass(frozen=True)
class EarlyExitConfig:
    """What the planner needs to plan early exits: the rule and per-layer time shares."""

    rule: ExitRule
    layer_times: LayerTimes

    def min_step_share(self) -> float:
        """Return the share of a full-depth step a token costs at the earliest exit."""
        return self.layer_times.until(self.rule.exit_layers[0]) / self.layer_times.full_s


class TimeBillPlanner:
    """Plan with the ETE: smallest eviction ratio whose WCET fits the time left.

    ``timing`` returns the current TimingModel (it is refit online), so plans use
    the latest estimate.
    """

    def __init__(self, timing: Callable[[], TimingModel], predictor: LengthPredictor,
                 alpha_max: float = 0.95, press: str = 'snapkv',
                 infeasible: str = 'reject', time_margin: float = 0.0,
                 early_exit: EarlyExitConfig | None = None, tpot_jitter: float = 0.15):
        """Configure the planner; raise ValueError on bad settings.

        ``time_margin`` keeps that fraction of the time left in reserve for
        estimation error and per-token overheads the ETE does not model.
        """
        if not 0.0 <= time_margin < 1.0:
            raise ValueError(f'time_margin must be in [0, 1) (got {time_margin})')
        self.time_margin = time_margin
        if not 0.0 <= alpha_max < 1.0:
            raise ValueError(f'alpha_max must be in [0, 1) (got {alpha_max})')
        if infeasible not in INFEASIBLE_POLICIES:
            raise ValueError(f'infeasible must be one of {INFEASIBLE_POLICIES}')
        self.timing, self.predictor = timing, predictor
        self.alpha_max, self.press, self.infeasible = alpha_max, press, infeasible
        self.early_exit, self.tpot_jitter = early_exit, tpot_jitter

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float,
             predicted: int | None = None) -> Plan:
        """Return the plan, or raise Rejection when the deadline cannot be met."""
        model = self.timing()
        target = time_left_s * (1.0 - self.time_margin)
        predictor = self.predictor.name
        if request.expected_tokens > 0:
            predicted, predictor = request.expected_tokens, 'caller'
        elif predicted is None:
            predicted = int(self.predictor.predict(request, prompt_tokens))
        worst = worst_case_tokens(predicted, request.pessimistic_factor, request.max_new_tokens)
        ee = self.early_exit
        share = ee.min_step_share() if ee else 1.0
        mode = Mode.NONE if request.mode == Mode.NONE else Mode.EVICTION
        if request.mode == Mode.EARLY_EXIT:
            if ee is None:
                raise Rejection('MODE_EARLY_EXIT is not configured on this node')
            mode, alpha = Mode.EARLY_EXIT, 0.0
        elif request.mode == Mode.NONE or request.eviction_ratio > 0.0:
            # No choice to make: full cache, or the caller's fixed ratio. Runs even when
            # the estimate misses (the caller asked for exactly this); plan.feasible says.
            alpha = request.eviction_ratio
        else:
            decision = solve_alpha(model, prompt_tokens, worst, target, self.alpha_max)
            alpha = decision.alpha
            if not decision.feasible and request.mode == Mode.AUTO and ee is not None:
                mode, alpha = Mode.EARLY_EXIT, self.alpha_max  # both: evict and exit early
        # The per-token deadline first: it may switch AUTO to early exit, and the
        # estimate below must be the one of the mode that runs.
        p99, utilisation = 0.0, 0.0
        if request.token_deadline_s > 0.0:
            last_kv = (1.0 - alpha) * prompt_tokens + worst - 1

            def p99_for(at: Mode) -> float:
                step = model.step(last_kv) * (share if at == Mode.EARLY_EXIT else 1.0)
                return p99_tpot_estimate(step, self.tpot_jitter)
            p99 = p99_for(mode)
            ok, utilisation = schedulable(p99, request.token_deadline_s)
            if not ok and request.mode == Mode.AUTO and ee is not None \
                    and mode != Mode.EARLY_EXIT:
                mode = Mode.EARLY_EXIT  # full depth is too slow per token; exits are not
                p99 = p99_for(mode)
                ok, utilisation = schedulable(p99, request.token_deadline_s)
            if not ok:
                raise Rejection(
                    f'not schedulable: estimated P99 time per token {p99 * 1e3:.1f} ms > '
                    f'per-token deadline {request.token_deadline_s * 1e3:.1f} ms '
                    f'(U = {utilisation:.2f}, mode {mode.name}, KV up to {last_kv:.0f} tokens)')
        if mode == Mode.EARLY_EXIT:
            # Exits guarantee the earliest candidate's cost per token; plan on that.
            wcet = model.prefill(prompt_tokens) + share * model.decode(
                (1.0 - alpha) * prompt_tokens, worst)
        else:
            wcet = model.wcet(prompt_tokens, alpha, worst)
        feasible = wcet <= target
        prefill = model.prefill(prompt_tokens)
        plan = Plan(
            mode=mode,
            prompt_tokens=prompt_tokens, predicted_tokens=predicted,
            predictor=predictor, worst_case_tokens=worst,
            pessimistic_factor=request.pessimistic_factor, eviction_ratio=alpha,
            press=self.press if alpha > 0.0 else '', est_prefill_s=prefill,
            est_decode_s=wcet - prefill, est_wcet_s=wcet,
            est_wcet_full_s=model.wcet(prompt_tokens, 0.0, worst),
            est_wcet_alpha_max_s=model.wcet(prompt_tokens, self.alpha_max, worst),
            feasible=feasible,
            exit_layers=tuple(ee.rule.exit_layers) if mode == Mode.EARLY_EXIT else (),
            token_deadline_s=request.token_deadline_s, est_p99_tpot_s=p99,
            utilisation=utilisation)
        if not feasible and request.mode != Mode.NONE and request.eviction_ratio == 0.0 \
                and self.infeasible == 'reject':
            how = 'with early exit at layer %d' % ee.rule.exit_layers[0] \
                if mode == Mode.EARLY_EXIT else f'even at eviction ratio {self.alpha_max:g}'
            raise Rejection(
                f'cannot meet the deadline: estimated worst case {wcet:.3f} s {how} > '
                f'{target:.3f} s ({time_left_s:.3f} s left less a {self.time_margin:.0%} '
                f'margin; prompt {prompt_tokens} tokens, up to {worst} answer tokens)', plan)
        return plan
