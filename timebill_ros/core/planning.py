"""Inference plans and the planner interface the node calls before running a goal."""

from __future__ import annotations

from dataclasses import dataclass, replace
import math
from typing import Callable, Protocol

from timebill_ros.core.cuts import CutEffect, CutEffects
from timebill_ros.core.early_exit import ExitRule, LayerTimes, p99_tpot_estimate, schedulable
from timebill_ros.core.eviction import press_skip_reason, solve_alpha
from timebill_ros.core.precision import Mix, PrecisionTable
from timebill_ros.core.request import Mode, Rejection, Request
from timebill_ros.core.timing import TimingModel, worst_case_tokens


# Marks the predictor of a plan whose length is only predicted during the goal's prefill.
PENDING = '(pending: predicted in prefill)'
# Plan.precision of a per-layer mix (Plan.precision_mix names the lowered units).
MIXED = 'mixed'


@dataclass(frozen=True)
class Fallback:
    """Switch the decode steps to a faster resident precision when the time left runs short.

    The goal starts at full precision; before each step the rule asks whether one more
    full step would leave too little time for ``precision`` to finish the answer.
    Until the answer reaches its predicted (median) length ``expected`` only that
    length is protected; once past it, the planned worst case ``tokens``. Short
    answers then end before any switch and keep full quality (at the low precision
    they often run on far longer), while a long one switches in time.
    """

    precision: str
    tokens: int
    full_step_s: float
    step_s: float
    margin: float = 0.0
    expected: int = 0

    def sharing(self, before_s: float, after_s: float) -> 'Fallback':
        """Return the rule for a goal whose batch shares rounds with other batches.

        Batches of different precisions step in turn, so one token of this goal costs a
        whole round: ``before_s`` is the round with it in the full-precision batch,
        ``after_s`` the other batches' share of a round once it has moved (the
        full-precision batch it leaves, if others stay, and the rest).
        """
        return replace(self, full_step_s=max(self.full_step_s, before_s),
                       step_s=self.step_s + max(0.0, after_s))

    def due(self, index: int, remaining_s: float) -> bool:
        """Return True when decode step ``index`` (answer token index + 2) must switch."""
        target = self.expected if index + 1 < self.expected else self.tokens
        to_come = max(0, target - index - 2)
        need = (self.full_step_s + self.step_s * to_come) / (1.0 - self.margin)
        return remaining_s < need


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
    # Admission: P(answer ends within the tokens that fit); why a cut was (not) used.
    fit_probability: float = 1.0
    note: str = ''
    # Weight precision of the decode steps ('' = the node's own dtype).
    precision: str = ''
    # A faster precision the decode switches to when the time left runs short.
    fallback: Fallback | None = None
    # precision MIXED: the units (decoder layers 0.., then the LM head) decoding at the
    # low precision, and the mix in words with its predicted KL.
    precision_mix: tuple = ()
    precision_text: str = ''

    @property
    def length_pending(self) -> bool:
        """Tell whether the answer length is still to be predicted (in prefill)."""
        return self.predictor.endswith(PENDING)


class Planner(Protocol):
    """Anything that turns a request into a plan (or raises Rejection)."""

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float,
             predicted: int | None = None, pending: bool = False,
             timing: TimingModel | None = None) -> Plan:
        """Plan a request whose prompt has ``prompt_tokens`` with ``time_left_s`` to go.

        ``predicted`` reuses an earlier length prediction for the same request;
        ``pending`` says the length will only be known during prefill; ``timing``
        replaces the planner's own full-precision ETE (a goal that will decode in a
        batch: ``BatchTimingModel.member``).
        """

    def estimate_s(self, plan: Plan, tokens: float, timing: TimingModel | None = None
                   ) -> float:
        """Return the estimated seconds of ``plan`` producing ``tokens`` answer tokens.

        The one time estimate of a plan: the planner's WCET, admission's expected time
        of a queued goal and learning's ETE error all call it. ``timing`` replaces the
        full-precision ETE (a batch's steps); None uses the planner's own.
        """


class FullModelPlanner:
    """Run every request at full quality: no estimate, no eviction (MODE_NONE)."""

    name = 'full-model'

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float,
             predicted: int | None = None, pending: bool = False,
             timing: TimingModel | None = None) -> Plan:
        """Return a plan that only records the prompt length and the mode."""
        return Plan(mode=Mode.NONE, prompt_tokens=prompt_tokens,
                    pessimistic_factor=request.pessimistic_factor)

    def estimate_s(self, plan: Plan, tokens: float, timing: TimingModel | None = None
                   ) -> float:
        """Return ``timing``'s time for the plan's prompt and ``tokens`` (0 without one)."""
        if timing is None:
            return 0.0
        return timing.wcet(plan.prompt_tokens, plan.eviction_ratio, tokens)


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


@dataclass(frozen=True)
class MixConfig:
    """Per-layer mixed precision: the unit table and which resident precision is low."""

    table: PrecisionTable
    low: str

    def describe(self, mix: Mix) -> str:
        """Return a mix in words for plans and diagnostics."""
        return (f'{self.low}: {mix.describe()} ({len(mix.lowered)} of {mix.units} units, '
                f'predicted KL {mix.predicted_kl:.3f})')


@dataclass(frozen=True)
class Cut:
    """One way to run a goal: full model, eviction at ``alpha``, lower precision, early exit."""

    mode: Mode
    alpha: float = 0.0
    precision: str = ''
    fallback: str = ''
    mix: Mix | None = None  # precision MIXED: the lowered units

    def describe(self, ee: EarlyExitConfig | None) -> str:
        """Return the cut in words (for rejection reasons and notes)."""
        if self.mode == Mode.EARLY_EXIT:
            evict = f' and eviction ratio {self.alpha:g}' if self.alpha > 0 else ''
            return f'with early exit at layer {ee.rule.exit_layers[0]}{evict}'
        words = [f'eviction ratio {self.alpha:.2f}'] if self.alpha > 0 else []
        if self.precision == MIXED and self.mix is not None:
            words.append(f'mixed-precision decoding ({len(self.mix.lowered)} of '
                         f'{self.mix.units} units lowered)')
        elif self.precision:
            words.append(f'{self.precision} decoding')
        if self.fallback:
            words = [f'{words[0] if words else "the full model"}, switching to '
                     f'{self.fallback} decoding when time runs short']
        return 'with ' + ' and '.join(words) if words else 'with the full model'


@dataclass(frozen=True)
class Option:
    """A cut judged for one goal: planned length, tokens that fit, P(fit), value."""

    cut: Cut
    worst: int
    fits: int
    probability: float
    quality: float
    wcet: float

    def value(self, enough: float) -> float:
        """Return the expected quality: P(fit), counted up to ``enough``, times quality."""
        return min(self.probability, enough) * self.quality


class TimeBillPlanner:
    """Plan with the ETE: the cheapest quality cut whose WCET fits the time left.

    ``timing`` returns the current TimingModel (it is refit online), so plans use
    the latest estimate. With a predictor that carries a calibrated length
    distribution (``predictor.distribution``), the goal is planned for the
    ``plan_quantile`` of its likely lengths and rejected only when the chance
    that its answer ends within the tokens that fit is below ``admit_probability``.
    """

    def __init__(self, timing: Callable[[], TimingModel], predictor: LengthPredictor,
                 alpha_max: float = 0.95, press: str = 'snapkv',
                 infeasible: str = 'reject', time_margin: float = 0.0,
                 early_exit: EarlyExitConfig | None = None, tpot_jitter: float = 0.15,
                 plan_quantile: float = 0.9, admit_probability: float = 0.02,
                 min_cut_saving: float = 0.0, auto_early_exit: bool = True,
                 precisions: dict | None = None, effects: CutEffects | None = None,
                 mix: MixConfig | None = None, min_switch_speedup: float = 1.0):
        """Configure the planner; raise ValueError on bad settings.

        ``time_margin`` keeps that fraction of the time left in reserve for
        estimation error and per-token overheads the ETE does not model.
        ``min_cut_saving``: a quality cut (eviction, early exit) is only used when
        it saves at least this share of the full model's estimated time.
        ``auto_early_exit``: MODE_AUTO may add early exit (MODE_EARLY_EXIT goals
        use it whatever this says). ``precisions`` maps a precision MODE_AUTO may decode
        at (e.g. 'int8-dynamic') to a callable returning its TimingModel; the prefill
        stays on the full model. ``effects`` holds each cut's measured answer-length
        factor and fidelity (core.cuts); without it cuts count as harmless. ``mix``
        lets MODE_AUTO lower single layers to ``mix.low`` (a key of ``precisions``),
        chosen per goal by the knapsack DP of core.precision. ``min_switch_speedup``:
        a switch to a lower precision mid-answer is planned only when its decode step
        is at least this many times faster than the full model's.
        """
        if min_switch_speedup < 1.0:
            raise ValueError(f'min_switch_speedup must be >= 1 (got {min_switch_speedup})')
        self.min_switch_speedup = min_switch_speedup
        if not 0.0 <= time_margin < 1.0:
            raise ValueError(f'time_margin must be in [0, 1) (got {time_margin})')
        self.time_margin = time_margin
        if not 0.0 <= alpha_max < 1.0:
            raise ValueError(f'alpha_max must be in [0, 1) (got {alpha_max})')
        if infeasible not in INFEASIBLE_POLICIES:
            raise ValueError(f'infeasible must be one of {INFEASIBLE_POLICIES}')
        for name, value in (('plan_quantile', plan_quantile),
                            ('admit_probability', admit_probability),
                            ('min_cut_saving', min_cut_saving)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f'{name} must be in [0, 1] (got {value})')
        self.timing, self.predictor = timing, predictor
        self.alpha_max, self.press, self.infeasible = alpha_max, press, infeasible
        self.early_exit, self.tpot_jitter = early_exit, tpot_jitter
        self.plan_quantile, self.admit_probability = plan_quantile, admit_probability
        self.min_cut_saving, self.auto_early_exit = min_cut_saving, auto_early_exit
        self.precisions = dict(precisions or {})
        self.effects = effects or CutEffects()
        if mix is not None and mix.low not in self.precisions:
            raise ValueError(f'mixed precision needs a resident {mix.low} copy')
        self.mix = mix

    def _mix_model(self, model: TimingModel, mix: Mix, kv: float) -> TimingModel:
        """Return the ETE of decode steps at ``mix`` (scaled at KV length ``kv``)."""
        full_step = model.step(kv)
        low_step = self.precisions[self.mix.low]().step(kv)
        scale = self.mix.table.step_scale(mix, kv, full_step, low_step) / max(full_step, 1e-12)
        return TimingModel(model.a, model.b, model.c, model.p * scale, model.q * scale)

    def _mix_for(self, model: TimingModel, n_x: int, worst: int, target: float) -> Mix | None:
        """Return the least-KL mix whose answer of ``worst`` tokens fits ``target``.

        The per-step budget is the decode time left over the steps, at the mean KV
        length; None when even every unit lowered cannot make it, or no step is left.
        """
        steps = worst - 1
        if steps <= 0:
            return None
        kv = n_x + worst / 2.0
        budget = (target - model.prefill(n_x)) / steps
        low = self.precisions[self.mix.low]()
        return self.mix.table.choose(kv, model.step(kv), low.step(kv), budget)

    def estimate_s(self, plan: Plan, tokens: float, timing: TimingModel | None = None
                   ) -> float:
        """Return the estimated seconds of ``plan`` producing ``tokens`` answer tokens."""
        mix = Mix(tuple(plan.precision_mix), self.mix.table.units) \
            if plan.precision == MIXED and self.mix is not None else None
        cut = Cut(plan.mode, plan.eviction_ratio, plan.precision, mix=mix)
        return self._wcet(timing or self.timing(), cut, plan.prompt_tokens, tokens)

    def _wcet(self, model: TimingModel, cut: Cut, n_x: int, tokens: int) -> float:
        if cut.precision == MIXED:  # full-precision prefill, then the mix's decode steps
            return model.prefill(n_x) + self._mix_model(model, cut.mix, n_x + tokens / 2.0) \
                .decode((1.0 - cut.alpha) * n_x, tokens)
        if cut.precision:  # full-precision prefill, then the variant's decode steps
            return model.prefill(n_x) + self.precisions[cut.precision]().decode(
                (1.0 - cut.alpha) * n_x, tokens)
        if cut.mode == Mode.EARLY_EXIT:
            # Exits guarantee the earliest candidate's cost per token; plan on that.
            return model.prefill(n_x) + self.early_exit.min_step_share() * model.decode(
                (1.0 - cut.alpha) * n_x, tokens)
        return model.wcet(n_x, cut.alpha, tokens)

    def _tokens_that_fit(self, model: TimingModel, cut: Cut, n_x: int, cap: int,
                         target: float) -> int:
        """Return the most answer tokens (0..cap) whose WCET under ``cut`` fits ``target``."""
        if self._wcet(model, cut, n_x, 1) > target:
            return 0
        low, high = 1, int(cap)
        while low < high:  # WCET grows with the token count: bisect
            mid = (low + high + 1) // 2
            if self._wcet(model, cut, n_x, mid) <= target:
                low = mid
            else:
                high = mid - 1
        return low

    def _effect(self, cut: Cut) -> CutEffect:
        """Return the measured effect of a cut on answer length and quality."""
        if cut.mode == Mode.EARLY_EXIT:
            return self.effects.early_exit
        if cut.precision == MIXED:
            low = self.effects.of_precision(self.mix.low)
            return CutEffect(self.mix.table.length_factor(cut.mix, low.length_factor),
                             self.mix.table.fidelity(cut.mix, low.quality))
        evict, precise = self.effects.of_eviction(cut.alpha), \
            self.effects.of_precision(cut.precision)
        return CutEffect(evict.length_factor * precise.length_factor,
                         evict.quality * precise.quality)

    def _cuts(self, model: TimingModel, request: Request, n_x: int, worst: int) -> tuple:
        """Return (the cuts this goal may use, least lossy first; a note on what was left out).

        An eviction cut here is a bound (alpha_max): ``_options`` solves the ratio.
        """
        if request.mode == Mode.EARLY_EXIT:
            if self.early_exit is None:
                raise Rejection('MODE_EARLY_EXIT is not configured on this node')
            return [Cut(Mode.EARLY_EXIT)], ''
        pinned = request.precision if request.precision in self.precisions else ''
        if request.mode == Mode.NONE:
            return [Cut(Mode.NONE, precision=pinned)], ''
        if pinned:  # the goal pinned a resident copy: every decode step at it
            return [Cut(Mode.EVICTION, precision=pinned)], f'precision {pinned} pinned by the goal'
        if request.eviction_ratio > 0.0:  # the caller's fixed ratio
            skip = press_skip_reason(self.press, n_x, request.eviction_ratio)
            return ([Cut(Mode.EVICTION)], skip) if skip else \
                ([Cut(Mode.EVICTION, request.eviction_ratio)], '')
        full = model.wcet(n_x, 0.0, worst)

        def too_small(cut: Cut, name: str) -> str:
            """Return why ``cut`` is left out when it saves under min_cut_saving, else ''."""
            if full - self._wcet(model, cut, n_x, worst) >= self.min_cut_saving * full:
                return ''
            return (f'{name} skipped: it would save under {self.min_cut_saving:.0%} of the '
                    f'estimated {full:.3f} s')
        cuts, notes = [Cut(Mode.EVICTION)], []
        evict = press_skip_reason(self.press, n_x, self.alpha_max) or too_small(
            Cut(Mode.EVICTION, self.alpha_max), 'eviction')
        if evict:
            notes.append(evict)
        else:
            cuts.append(Cut(Mode.EVICTION, self.alpha_max))  # alpha solved per budget
        candidates = []
        if request.mode == Mode.AUTO and not request.precision:
            candidates += [(Cut(Mode.EVICTION, precision=p), p) for p in self.precisions]
            if self.mix is not None:
                cuts.append(Cut(Mode.EVICTION, precision=MIXED))  # the DP solves the mix
            if self.early_exit is not None and self.auto_early_exit:
                candidates.append((Cut(Mode.EARLY_EXIT, 0.0 if evict else self.alpha_max),
                                   'early exit'))
        for cut, name in candidates:
            skip = too_small(cut, name)
            if skip:
                notes.append(skip)
            else:
                cuts.append(cut)
        return cuts, '; '.join(notes)

    def _judge(self, model: TimingModel, cut: Cut, n_x: int, planned: int, cap: int,
               target: float, predicted: int, dist, pessimistic: float) -> Option:
        """Judge a cut: the length it plans for, the tokens that fit and P(answer fits).

        A cut that lengthens answers (``length_factor``) plans for that many more
        tokens, and its answer fits when the full model's would have fitted in
        ``fits / length_factor`` tokens.
        """
        effect = self._effect(cut)
        worst = worst_case_tokens(max(1, math.ceil(planned * effect.length_factor)),
                                  pessimistic, cap)
        wcet = self._wcet(model, cut, n_x, worst)
        if wcet <= target:
            fits, probability = worst, 1.0
        else:
            fits = self._tokens_that_fit(model, cut, n_x, cap, target)
            if fits >= cap:
                probability = 1.0  # an answer stops at max_new_tokens
            elif dist is not None:
                probability = dist.prob_at_most(fits / effect.length_factor, predicted)
            else:
                probability = 1.0 if fits >= worst else 0.0
        return Option(cut, worst, fits, probability, effect.quality, wcet)

    def _hybrid(self, model: TimingModel, low: Option, n_x: int, target: float,
                predicted: int, dist) -> Option | None:
        """Judge full precision with a switch to ``low``'s precision when time runs short.

        The switch comes as late as still lets the low precision finish the tokens
        ``low`` plans for, so the answer fits as often as ``low``'s (up to its planned
        length) while every token before the switch is the full model's. Fidelity:
        P(answer ends before the switch) x 1 + the rest x the low precision's.
        Return None when the switch would come at once (the hybrid is ``low``), or when
        the low precision's step is not ``min_switch_speedup`` times faster.
        """
        worst, precision = low.worst, low.cut.precision
        fast = self.precisions[precision]()
        if low.wcet > target:
            return None
        if not self._switch_pays(model, precision, n_x, worst):
            return None

        def wcet(switch: int) -> float:  # ``switch`` answer tokens at full precision
            return model.prefill(n_x) + model.decode(n_x, switch) + fast.decode(
                n_x + switch - 1, worst - switch + 1)
        lo, hi = 1, worst
        if wcet(1) > target:
            return None
        while lo < hi:  # the full-precision share only shrinks the time left: bisect
            mid = (lo + hi + 1) // 2
            if wcet(mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        switch = lo
        if dist is not None:
            before = dist.prob_at_most(switch, predicted)
        else:
            before = 1.0 if switch >= predicted else 0.0
        quality = before + (1.0 - before) * low.quality
        return Option(Cut(low.cut.mode, low.cut.alpha, '', precision), worst, low.fits,
                      low.probability, quality, wcet(switch))

    def _switch_pays(self, model: TimingModel, precision: str, n_x: int, worst: int) -> bool:
        """Tell whether ``precision`` steps are ``min_switch_speedup`` times faster.

        A switch changes the rest of the answer (int8 answers often run longer); it is
        worth that only when it buys real time per token.
        """
        kv = n_x + worst / 2.0
        return self.precisions[precision]().step(kv) * self.min_switch_speedup <= \
            model.step(kv)

    def fallback_for(self, model: TimingModel, cut: Cut, n_x: int, worst: int,
                     expected: int = 0) -> Fallback:
        """Return the runtime switch rule of a cut with a fallback precision."""
        kv = (1.0 - cut.alpha) * n_x + worst / 2.0
        return Fallback(cut.fallback, worst, model.step(kv),
                        self.precisions[cut.fallback]().step(kv), self.time_margin,
                        min(worst, expected))

    def _options(self, model: TimingModel, cuts: list, n_x: int, planned: int, cap: int,
                 target: float, predicted: int, dist, pessimistic: float,
                 solve: bool, switch: bool = True) -> list:
        """Judge every cut; an eviction bound becomes the ratios worth trying.

        With ``solve`` those are the smallest ratio that fits the planned length, the
        measured ratios below the bound, and the bound itself. ``switch`` also judges
        full precision switching to a lower one (not for a goal that pinned its precision).
        """
        options = []
        for cut in cuts:
            if cut.precision == MIXED:
                options += self._mixed_option(model, n_x, planned, cap, target, predicted,
                                              dist, pessimistic)
                continue
            alphas = [cut.alpha]
            if solve and cut.mode == Mode.EVICTION and cut.alpha > 0.0:
                bound = cut.alpha
                decision = solve_alpha(model, n_x, worst_case_tokens(planned, pessimistic, cap),
                                       target, bound)
                alphas = sorted({decision.alpha, bound, *(
                    r for r in self.effects.eviction_ratios if r < bound)})
            for alpha in alphas:
                option = self._judge(model, Cut(cut.mode, alpha, cut.precision), n_x,
                                     planned, cap, target, predicted, dist, pessimistic)
                hybrid = self._hybrid(model, option, n_x, target, predicted, dist) \
                    if cut.precision and alpha == 0.0 and switch else None
                options += [hybrid] if hybrid is not None else []
                options.append(option)
        return options

    def _mixed_option(self, model: TimingModel, n_x: int, planned: int, cap: int,
                      target: float, predicted: int, dist, pessimistic: float) -> list:
        """Judge the least-KL per-layer mix that fits the planned length ([] when none).

        Nothing lowered or everything lowered are the full and the low-precision cuts,
        judged on their own. A mix lengthens answers by its share of the low precision's
        factor, so the mix is solved again for the length it causes.
        """
        low = self.effects.of_precision(self.mix.low)
        worst = worst_case_tokens(planned, pessimistic, cap)
        mix = self._mix_for(model, n_x, worst, target)
        if mix is not None and not mix.is_full:
            factor = self.mix.table.length_factor(mix, low.length_factor)
            longer = worst_case_tokens(max(1, math.ceil(planned * factor)), pessimistic, cap)
            if longer != worst:
                mix = self._mix_for(model, n_x, longer, target) or mix
        if mix is None or mix.is_full or mix.is_all_low:
            return []
        return [self._judge(model, Cut(Mode.EVICTION, 0.0, MIXED, mix=mix), n_x, planned,
                            cap, target, predicted, dist, pessimistic)]

    def _choose(self, options: list) -> Option:
        """Return the option with the most expected quality among those likely enough to fit.

        P(fit) counts only up to ``plan_quantile``, so among cuts that fit well enough
        the least lossy one (listed first) wins; a lossy cut is taken over the full
        model only when P(fit) x fidelity says its answer is worth more. When no option
        reaches ``admit_probability`` the one fitting the largest share of its planned
        length is returned (the caller rejects or runs it best-effort).
        """
        likely = [o for o in options if o.probability >= self.admit_probability]
        if not likely:
            return max(options, key=lambda o: (o.fits / max(1, o.worst), -o.wcet))
        best = max(o.value(self.plan_quantile) for o in likely)
        return next(o for o in likely if o.value(self.plan_quantile) >= best - 1e-9)

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float,
             predicted: int | None = None, pending: bool = False,
             timing: TimingModel | None = None) -> Plan:
        """Return the plan, or raise Rejection when the deadline cannot be met.

        ``pending``: the length is predicted later (during prefill); plan a 1-token
        answer now, so only goals whose first token cannot make it are rejected.
        ``timing``: the full-precision ETE to plan with instead of the planner's own (the
        steps of the batch the goal will decode in; lowered precisions decode alone).
        """
        model = timing or self.timing()
        target = time_left_s * (1.0 - self.time_margin)
        predictor = self.predictor.name
        dist = None
        if request.expected_tokens > 0:
            predicted, predictor = request.expected_tokens, 'caller'
        elif pending:
            predicted, predictor = 1, f'{predictor} {PENDING}'
        else:
            if predicted is None:
                predicted = int(self.predictor.predict(request, prompt_tokens))
            dist = getattr(self.predictor, 'distribution', None)
        cap = request.max_new_tokens
        if dist is not None and predicted >= cap and cap > dist.max_length:
            # A prediction at the cap of a goal allowing more tokens than calibration saw:
            # the distribution cannot say how far beyond its labels the answer runs.
            dist = None
        if dist is not None:
            # Plan for the calibrated quantile of the lengths such a prediction turns into.
            planned = math.ceil(dist.quantile(self.plan_quantile, predicted))
        else:
            planned = predicted
        ee = self.early_exit
        base = worst_case_tokens(max(1, planned), request.pessimistic_factor, cap)
        cuts, note = self._cuts(model, request, prompt_tokens, base)
        options = self._options(model, cuts, prompt_tokens, max(1, planned), cap, target,
                                predicted, dist, request.pessimistic_factor,
                                solve=request.eviction_ratio == 0.0,
                                switch=not request.precision)
        chosen = self._choose(options)
        if chosen.probability < self.admit_probability:
            note = '; '.join(filter(None, [note, (
                f'no cut is likely to fit; {chosen.cut.describe(ee)[5:]} fits the largest '
                f'share ({chosen.fits} of {chosen.worst} tokens)')]))
        elif len(options) > 1 and chosen.cut != options[0].cut:
            full = options[0]
            note = '; '.join(filter(None, [note, (
                f'{chosen.cut.describe(ee)[5:]}: P(fit) {chosen.probability:.2f} x fidelity '
                f'{chosen.quality:.2f} beats {full.cut.describe(ee)[5:]}: P(fit) '
                f'{full.probability:.2f} x {full.quality:.2f}')]))
        cut, worst = chosen.cut, chosen.worst
        # The per-token deadline first: it may switch AUTO to early exit, and the
        # estimate below must be the one of the mode that runs.
        p99, utilisation = 0.0, 0.0
        if request.token_deadline_s > 0.0:
            last_kv = (1.0 - cut.alpha) * prompt_tokens + worst - 1

            def p99_for(at: Cut) -> float:
                if at.precision == MIXED:
                    step_model = self._mix_model(model, at.mix, last_kv)
                else:
                    step_model = self.precisions[at.precision]() if at.precision else model
                share = ee.min_step_share() if ee and at.mode == Mode.EARLY_EXIT else 1.0
                return p99_tpot_estimate(step_model.step(last_kv) * share, self.tpot_jitter)
            p99 = p99_for(cut)
            ok, utilisation = schedulable(p99, request.token_deadline_s)
            if not ok and request.mode == Mode.AUTO and ee is not None and self.auto_early_exit \
                    and cut.mode != Mode.EARLY_EXIT:
                cut = Cut(Mode.EARLY_EXIT, cut.alpha)  # full depth is too slow per token
                p99 = p99_for(cut)
                ok, utilisation = schedulable(p99, request.token_deadline_s)
                chosen = self._judge(model, cut, prompt_tokens, max(1, planned), cap, target,
                                     predicted, dist, request.pessimistic_factor)
            if not ok:
                raise Rejection(
                    f'not schedulable: estimated P99 time per token {p99 * 1e3:.1f} ms > '
                    f'per-token deadline {request.token_deadline_s * 1e3:.1f} ms '
                    f'(U = {utilisation:.2f}, mode {cut.mode.name}, KV up to {last_kv:.0f} '
                    'tokens)')
        wcet, fits, fit = chosen.wcet, chosen.fits, chosen.probability
        fallback = None
        if request.mode == Mode.AUTO and cut.mode != Mode.EARLY_EXIT and not cut.precision \
                and self.precisions and not request.precision:
            # A full-precision plan keeps a faster precision in reserve: an answer or a
            # step running longer than planned switches instead of missing.
            name = cut.fallback or next(iter(self.precisions))
            factor = self.effects.of_precision(name).length_factor
            if self._switch_pays(model, name, prompt_tokens, worst):
                fallback = self.fallback_for(model, Cut(cut.mode, cut.alpha, '', name),
                                             prompt_tokens, worst,
                                             math.ceil(max(1, predicted) * factor))
        feasible = wcet <= target
        prefill = model.prefill(prompt_tokens)
        plan = Plan(
            mode=cut.mode,
            prompt_tokens=prompt_tokens, predicted_tokens=predicted,
            predictor=predictor, worst_case_tokens=worst,
            pessimistic_factor=request.pessimistic_factor, eviction_ratio=cut.alpha,
            press=self.press if cut.alpha > 0.0 else '', est_prefill_s=prefill,
            est_decode_s=wcet - prefill, est_wcet_s=wcet,
            est_wcet_full_s=model.wcet(prompt_tokens, 0.0, worst),
            est_wcet_alpha_max_s=model.wcet(prompt_tokens, self.alpha_max, worst),
            feasible=feasible,
            exit_layers=tuple(ee.rule.exit_layers) if cut.mode == Mode.EARLY_EXIT else (),
            token_deadline_s=request.token_deadline_s, est_p99_tpot_s=p99,
            utilisation=utilisation, fit_probability=fit, note=note,
            precision=cut.precision, fallback=fallback,
            precision_mix=cut.mix.lowered if cut.mix is not None else (),
            precision_text=self.mix.describe(cut.mix) if cut.mix is not None else '')
        if fit < self.admit_probability and request.mode != Mode.NONE \
                and request.eviction_ratio == 0.0 and self.infeasible == 'reject':
            raise Rejection(
                f'cannot meet the deadline: predicted {predicted} answer tokens ({predictor}); '
                f'{fits} fit in {target:.3f} s ({time_left_s:.3f} s left less a '
                f'{self.time_margin:.0%} margin) {cut.describe(ee)}, and '
                f'P(answer <= {fits} tokens) = {fit:.1%} < admit_probability '
                f'{self.admit_probability:g}; estimated worst case {wcet:.3f} s for {worst} '
                f'tokens (prompt {prompt_tokens} tokens)', plan)
        return plan
