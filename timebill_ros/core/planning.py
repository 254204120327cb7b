# SPDX-License-Identifier: Apache-2.0
"""Inference plans and the planner interface the node calls before running a goal."""

from __future__ import annotations

from dataclasses import dataclass, replace
import math
from typing import Callable, Protocol

from timebill_ros.core.cut_kinds import (  # noqa: F401 (EarlyExitConfig, MixConfig, MIXED
    Cut, cut_of, CutContext, EarlyExit, EarlyExitConfig, Eviction,  # are imported from here)
    CopyPrefill, EngineHandOver, FallbackSwitch, Goal, handover_name, handover_parts, MIXED,
    MixConfig, MixedPrecision, OtherEngine, Precision, SIXTEEN_BIT)
from timebill_ros.core.cuts import CutEffects
from timebill_ros.core.early_exit import p99_tpot_estimate, schedulable
from timebill_ros.core.eviction import press_skip_reason
from timebill_ros.core.length import unpredicted
from timebill_ros.core.planner_settings import (  # noqa: F401 (re-exported)
    INFEASIBLE_POLICIES, PlannerSettings)
from timebill_ros.core.request import Mode, OverrunPolicy, Rejection, Request
from timebill_ros.core.timing import TimingModel


# Marks the predictor of a plan whose length is only predicted during the goal's prefill.
PENDING = '(pending: predicted in prefill)'
# Predictor name of a length read from the node's recent answers (the predictor skipped).
RECENT = 'recent answers'
GRAMMAR_ANSWERS = 'answers to this schema'


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
    fits_tokens: int = 0  # answer tokens whose time fits under the chosen cut (0: none)
    note: str = ''
    # The engine option the decode steps run on ('' = the node's own model at its dtype;
    # a resident precision such as 'int8-dynamic'; another engine such as
    # 'llama.cpp-q4_1'): named precision after the message field clients read.
    precision: str = ''
    # A resident copy that runs the prefill too ('' = the node's own model): a 16-bit
    # copy where the CPU (AMX, avx512_bf16) or GPU prefills faster at 16 bits.
    prefill_precision: str = ''
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
             timing: TimingModel | None = None, spread=None,
             engine_prefix: dict | None = None) -> Plan:
        """Plan a request whose prompt has ``prompt_tokens`` with ``time_left_s`` to go.

        ``predicted`` reuses an earlier length prediction for the same request;
        ``pending`` says the length will only be known during prefill; ``timing``
        replaces the planner's own full-precision ETE (a goal that will decode in a
        batch: ``BatchTimingModel.member``); ``spread``: the length distribution
        ``predicted`` was drawn from when no predictor ran (recent answers);
        ``engine_prefix``: prompt tokens each other engine holds from an earlier prompt.
        """

    def estimate_s(self, plan: Plan, tokens: float, timing: TimingModel | None = None,
                   switched_to: str = '', switched_at: int = -1, held: int = 0) -> float:
        """Return the estimated seconds of ``plan`` producing ``tokens`` answer tokens.

        ``held``: prompt tokens the plan's other engine holds from an earlier prompt.
        The one time estimate of a plan: the planner's WCET, admission's expected time
        of a queued goal and learning's ETE error all call it. ``timing`` replaces the
        full-precision ETE (a batch's steps); None uses the planner's own. A goal that
        switched precision at decode step ``switched_at`` is timed with the switch.
        """


class FullModelPlanner:
    """Run every request at full quality: no estimate, no eviction (MODE_NONE)."""

    name = 'full-model'

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float,
             predicted: int | None = None, pending: bool = False,
             timing: TimingModel | None = None, spread=None,
             engine_prefix: dict | None = None) -> Plan:
        """Return a plan that only records the prompt length and the mode."""
        return Plan(mode=Mode.NONE, prompt_tokens=prompt_tokens,
                    pessimistic_factor=request.pessimistic_factor)

    def estimate_s(self, plan: Plan, tokens: float, timing: TimingModel | None = None,
                   switched_to: str = '', switched_at: int = -1, held: int = 0) -> float:
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


@dataclass(frozen=True)
class Option:
    """A cut judged for one goal: planned length, tokens that fit, P(fit), value."""

    cut: Cut
    worst: int
    fits: int
    probability: float
    quality: float
    wcet: float
    hedged: float | None = None  # P(fit) with the length hedge (None: ``probability``)

    @property
    def surety(self) -> float:
        """Return the P(fit) options are compared on (hedged where there is a hedge)."""
        return self.probability if self.hedged is None else self.hedged

    def value(self, enough: float) -> float:
        """Return the expected quality: P(fit), counted up to ``enough``, times quality."""
        return min(self.probability, enough) * self.quality


def tokens_that_fit(ctx: CutContext, goal: Goal, cut: Cut) -> int:
    """Return the most answer tokens (0..cap) whose WCET under ``cut`` fits the target."""
    def fits(tokens: int) -> bool:
        return cut.time_s(ctx, goal.model, goal.n_x, tokens) <= goal.target
    if not fits(1):
        return 0
    low, high = 1, int(goal.cap)
    while low < high:  # WCET grows with the token count: bisect
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def closes_in_time(request: Request, settings: PlannerSettings, fits: int) -> bool:
    """Tell whether a goal is served although its whole answer may not fit.

    A schema or grammar goal with the deadline closure ends with a valid answer
    whenever its prompt and a first token fit: the grammar completes the rest before
    the deadline without the model (Kill or Skip-Next), so refusing it would lose a
    goal the node can serve.
    """
    return request.output.constrained and settings.deadline_closure and fits >= 1


def choose(options: list, settings: PlannerSettings, cheapest: bool = False) -> Option:
    """Return the most faithful option among those about as likely to fit as the surest.

    P(fit) (hedged: ``length_hedge``) counts only up to ``choice_quantile`` (at least
    ``plan_quantile``); the options within ``fit_tolerance`` of the surest one compete on
    fidelity. So a lossy cut or a faster engine is taken only when it fits more surely, and
    among cuts that all fit well enough the most faithful one runs. Fidelities within
    ``fidelity_tolerance`` of the best count as equal: among those the surest fit
    (uncapped) runs, then the most faithful (the least lossy, listed first, wins ties),
    so a measured fidelity gap of a point or two does not buy a slower engine's risk.
    With ``cheapest`` (MODE_AUTO), when that is the whole model on one engine, another
    engine equally sure and as faithful runs instead if it holds the machine
    ``min_switch_speedup`` times less (its worst-case time): the same answer within the
    tolerance then leaves the goals around it their time (float32 on torch held a burst's
    first 10-s goal for 3 s where llama.cpp-f16, fidelity 0.98, needs 0.2 s). When no
    option reaches ``admit_probability`` the one fitting the largest share of its planned
    length is returned (the caller rejects or runs it best-effort).
    """
    enough = max(settings.plan_quantile, settings.choice_quantile)
    admit = settings.admit_probability
    likely = [o for o in options if o.probability >= admit]
    if not likely:
        return max(options, key=lambda o: (o.fits / max(1, o.worst), -o.wcet))
    surest = max(min(o.surety, enough) for o in likely)
    sure = [o for o in likely if min(o.surety, enough) >= surest - settings.fit_tolerance]
    best = max(o.quality for o in sure)
    faithful = [o for o in sure if o.quality >= best - settings.fidelity_tolerance - 1e-9]
    chosen = max(faithful, key=lambda o: (round(o.surety, 6), o.quality))
    if not cheapest or not whole_model(chosen):
        return chosen
    # Other engines only (llama.cpp copies): a resident torch precision's fidelity is
    # assumed, not measured, on a model without a cut-effects table.
    faster = [o for o in faithful if isinstance(o.cut, OtherEngine) and whole_model(o)
              and round(o.surety, 6) == round(chosen.surety, 6)
              and o.wcet * settings.min_switch_speedup <= chosen.wcet]
    return min(faster, key=lambda o: (round(o.wcet, 3), -o.quality)) if faster else chosen


def whole_model(option: Option) -> bool:
    """Tell whether an option runs the whole answer on one engine, uncut.

    No eviction, no early exit, no planned switch mid-answer, no per-layer mix.
    """
    cut = option.cut
    return cut.alpha == 0.0 and cut.mode != Mode.EARLY_EXIT and not cut.switch_to \
        and cut.precision != MIXED


def explain(ctx: CutContext, settings: PlannerSettings, note: str, chosen: Option,
            options: list) -> str:
    """Return ``note`` with why the chosen cut was taken when it is not the first."""
    def words(option: Option) -> str:
        return option.cut.describe(ctx)[5:]
    if chosen.probability < settings.admit_probability:
        why = (f'no cut is likely to fit; {words(chosen)} fits the largest share '
               f'({chosen.fits} of {chosen.worst} tokens)')
    elif len(options) > 1 and chosen.cut != options[0].cut:
        full = options[0]
        within = f'within {settings.fit_tolerance:g} of' if settings.fit_tolerance else 'of'
        why = (f'{words(chosen)} (P(fit) {chosen.probability:.2f}, fidelity '
               f'{chosen.quality:.2f}) over {words(full)} (P(fit) {full.probability:.2f}, '
               f'fidelity {full.quality:.2f}): the most faithful {within} the surest fit '
               f'(fidelity within {settings.fidelity_tolerance:g}: the surest)')
    else:
        return note
    return '; '.join(filter(None, [note, why]))


def predict(length: LengthPredictor, request: Request, prompt_tokens: int,
            predicted: int | None, pending: bool, spread=None) -> tuple:
    """Return (predicted length, predictor name, calibrated distribution or None).

    ``spread``: the distribution a ``predicted`` length was read from without the
    predictor (the node's recent answers); it replaces the predictor's calibration.
    """
    predictor, dist = length.name, None
    if request.expected_tokens > 0:
        predicted, predictor = request.expected_tokens, 'caller'
    elif pending:
        predicted, predictor = 1, f'{predictor} {PENDING}'
    elif spread is not None and predicted is not None:
        return predicted, spread.source or RECENT, spread
    else:
        if predicted is None:
            predicted = int(length.predict(request, prompt_tokens))
        dist = getattr(length, 'distribution', None)
    cap = request.max_new_tokens
    if dist is not None and predicted >= cap and cap > dist.max_length:
        # A prediction at the cap of a goal allowing more tokens than calibration saw:
        # the distribution cannot say how far beyond its labels the answer runs.
        dist = None
    return predicted, predictor, dist


class TimeBillPlanner:
    """Plan with the ETE: the cheapest quality cut whose WCET fits the time left.

    ``timing`` returns the current TimingModel (it is refit online), so plans use
    the latest estimate. With a predictor that carries a calibrated length
    distribution (``predictor.distribution``), the goal is planned for the
    ``plan_quantile`` of its likely lengths and rejected only when the chance
    that its answer ends within the tokens that fit is below ``admit_probability``.
    Each way to run a goal is a cut object (core.cut_kinds) that knows its time,
    effect and per-token step; the planner judges them alike.
    """

    def __init__(self, timing: Callable[[], TimingModel], predictor: LengthPredictor,
                 settings: PlannerSettings, *, early_exit: EarlyExitConfig | None = None,
                 precisions: dict | None = None, effects: CutEffects | None = None,
                 mix: MixConfig | None = None, engines: dict | None = None,
                 press_s_per_token: Callable[[], float] = lambda: 0.0,
                 time_errors: Callable[[str], tuple] = lambda option: (),
                 provisional_base: str = ''):
        """Configure the planner; raise ValueError on a mix without its resident copy.

        ``settings``: the node parameters the planner reads
        (``PlannerSettings.from_config``). ``early_exit`` enables early-exit cuts.
        ``precisions`` maps a precision MODE_AUTO may decode at (e.g. 'int8-dynamic')
        to a callable returning its TimingModel; the prefill stays on the full model.
        ``effects`` holds each cut's measured answer-length factor and fidelity
        (core.cuts); without it cuts count as harmless. ``mix`` lets MODE_AUTO lower
        single layers to ``mix.low`` (a key of ``precisions``), chosen per goal by the
        knapsack DP of core.precision. ``engines`` maps another resident engine's option
        (e.g. 'llama.cpp-q8_0') to a callable returning its TimingModel (whole goals).
        ``press_s_per_token``: what an eviction press adds to a prefill per prompt token.
        ``time_errors``: an option's recent measured/estimated time ratios ('' = the full
        model), P(fit) counts them. ``provisional_base``: see ``profiled_only``.
        """
        self.timing, self.predictor, self.settings, self.provisional_base = \
            timing, predictor, settings, provisional_base
        precisions = dict(precisions or {})
        if mix is not None and mix.low not in precisions:
            raise ValueError(f'mixed precision needs a resident {mix.low} copy')
        self.context = CutContext(precisions, effects or CutEffects(), early_exit, mix,
                                  dict(engines or {}), press_s_per_token, time_errors)

    @property
    def precisions(self) -> dict:
        """Return {resident precision: callable returning its TimingModel}."""
        return self.context.precisions

    @property
    def mix(self) -> MixConfig | None:
        """Return the per-layer mix table (None: whole-model precision only)."""
        return self.context.mix

    def estimate_s(self, plan: Plan, tokens: float, timing: TimingModel | None = None,
                   switched_to: str = '', switched_at: int = -1, held: int = 0) -> float:
        """Return the estimated seconds of ``plan`` producing ``tokens`` answer tokens.

        ``switched_to``/``switched_at``: the goal moved to that precision from decode
        step ``switched_at`` on (a fallback switch that happened). ``held``: prompt
        tokens the plan's other engine holds from an earlier prompt (not prefilled).
        """
        cut = cut_of(plan, self.context, held)
        if switched_to and switched_at >= 0:
            cut = FallbackSwitch(switched_to, switched_at + 1, plan.mode, plan.eviction_ratio)
        return cut.time_s(self.context, timing or self.timing(), plan.prompt_tokens, tokens)

    def _candidates(self, request: Request, goal: Goal) -> tuple:
        """Return (the cuts this goal may use, least lossy first; a note on what was left out).

        An eviction cut here is a bound (alpha_max) and a mixed cut has no mix yet:
        ``Cut.concrete`` solves them for the goal.
        """
        settings, n_x = self.settings, goal.n_x
        if request.mode == Mode.EARLY_EXIT:
            if self.context.early_exit is None:
                raise Rejection('MODE_EARLY_EXIT is not configured on this node')
            return [EarlyExit()], ''
        held = goal.engine_prefix
        if request.precision in self.context.engines:  # the goal pinned another engine
            return [OtherEngine(request.precision, request.mode,
                                held.get(request.precision, 0))], \
                f'engine {request.precision} pinned by the goal'
        pair = handover_parts(request.precision, self.context.engines)
        if pair is not None:  # ... or a hand-over between two of them
            return [EngineHandOver(pair[1], request.mode, held.get(pair[0], 0), pair[0])], \
                f'engines {request.precision} pinned by the goal'
        pinned = request.precision if request.precision in self.precisions else ''
        if request.mode == Mode.NONE:
            return [Precision(pinned, Mode.NONE) if pinned else Eviction(Mode.NONE)], ''
        if pinned:  # the goal pinned a resident copy: every decode step at it
            return [Precision(pinned)], f'precision {pinned} pinned by the goal'
        if request.eviction_ratio > 0.0:  # the caller's fixed ratio
            skip = press_skip_reason(settings.press, n_x, request.eviction_ratio)
            return ([Eviction()], skip) if skip else \
                ([Eviction(alpha=request.eviction_ratio)], '')
        worst = goal.worst(goal.planned)
        full = goal.model.wcet(n_x, 0.0, worst)

        def too_small(cut: Cut, name: str) -> str:
            """Return why ``cut`` is left out when it saves under min_cut_saving, else ''."""
            if full - cut.time_s(self.context, goal.model, n_x, worst) >= \
                    settings.min_cut_saving * full:
                return ''
            return (f'{name} skipped: it would save under {settings.min_cut_saving:.0%} of '
                    f'the estimated {full:.3f} s')
        cuts, notes = [Eviction()], []
        evict = press_skip_reason(settings.press, n_x, settings.alpha_max) or too_small(
            Eviction(alpha=settings.alpha_max), 'eviction')
        if evict:
            notes.append(evict)
        else:
            cuts.append(Eviction(alpha=settings.alpha_max))  # alpha solved per budget
        candidates = []
        if request.mode == Mode.AUTO and not request.precision:
            candidates += [(Precision(p), p) for p in self.precisions]
            candidates += [(CopyPrefill(p), f'{p} prefill') for p in self.precisions
                           if p in SIXTEEN_BIT]
            if self.mix is not None:
                cuts.append(MixedPrecision())  # the DP solves the mix
            if self.context.early_exit is not None and settings.auto_early_exit:
                candidates.append((EarlyExit(0.0 if evict else settings.alpha_max),
                                   'early exit'))
            candidates += [(OtherEngine(name, cached=held.get(name, 0)), name)
                           for name in self.context.engines]
            if settings.llama_handover:
                candidates += [(EngineHandOver(b, cached=held.get(a, 0), prefill_engine=a),
                                handover_name(a, b))
                               for a, b in EngineHandOver.pairs(self.context, n_x)]
        for cut, name in candidates:
            skip = too_small(cut, name)
            if skip:
                notes.append(skip)
            else:
                cuts.append(cut)
        return cuts, '; '.join(notes)

    def judge(self, goal: Goal, cut: Cut) -> Option:
        """Judge a cut: the length it plans for, the tokens that fit and P(answer fits).

        A cut that lengthens answers (``length_factor``) plans for that many more
        tokens, and its answer fits when the full model's would have fitted in
        ``fits / length_factor`` tokens, or, where the spread of its answers' lengths
        was measured, in ``fits / ratio`` for each measured ratio equally likely.
        """
        effect = cut.effect(self.context)
        worst = goal.worst(max(1, math.ceil(goal.planned * effect.length_factor)))
        wcet = cut.time_s(self.context, goal.model, goal.n_x, worst)
        # With a hedge every token of slack counts (the answer may run past the plan).
        fits = worst if wcet <= goal.target and goal.hedge <= 0.0 \
            else tokens_that_fit(self.context, goal, cut)
        errors = self.context.errors_of(cut.precision) \
            if self.settings.count_time_errors else ()
        if not errors:
            pairs = [answer_fit_probability(goal, effect, worst, fits)]
        else:  # the answer fits when it does at the speed the option runs at
            pairs = [answer_fit_probability(goal, effect, worst, fits_at_ratio(
                self.context, goal, cut, wcet, worst, ratio)) for ratio in errors]
        probability, hedged = (sum(column) / len(pairs) for column in zip(*pairs))
        return Option(cut, worst, fits, probability, effect.quality, wcet, hedged)

    def _hybrid(self, goal: Goal, low: Option) -> Option | None:
        """Judge full precision with a switch to ``low``'s precision when time runs short.

        The switch comes as late as still lets the low precision finish the tokens
        ``low`` plans for, so the answer fits as often as ``low``'s (up to its planned
        length) while every token before the switch is the full model's. Fidelity:
        P(answer ends before the switch) x 1 + the rest x the low precision's.
        Return None when the switch would come at once (the hybrid is ``low``), or when
        the low precision's step is not ``min_switch_speedup`` times faster.
        """
        worst, precision = low.worst, low.cut.precision
        if low.wcet > goal.target or \
                not self._switch_pays(goal.model, precision, goal.n_x, worst):
            return None
        cut = FallbackSwitch.latest(self.context, goal, low.cut, worst)
        if cut is None:
            return None
        switch = cut.switch
        if goal.dist is not None:
            before = goal.dist.prob_at_most(switch, goal.predicted)
        else:
            before = 1.0 if switch >= goal.predicted else 0.0
        quality = before + (1.0 - before) * low.quality
        return Option(cut, worst, low.fits, low.probability, quality,
                      cut.time_s(self.context, goal.model, goal.n_x, worst), low.hedged)

    def _switch_pays(self, model: TimingModel, precision: str, n_x: int, worst: int) -> bool:
        """Tell whether ``precision`` steps are ``min_switch_speedup`` times faster.

        A switch changes the rest of the answer (int8 answers often run longer); it is
        worth that only when it buys real time per token.
        """
        kv = n_x + worst / 2.0
        return self.context.model_of(precision).step(kv) * \
            self.settings.min_switch_speedup <= model.step(kv)

    def fallback_for(self, model: TimingModel, cut: Cut, n_x: int, worst: int,
                     expected: int = 0) -> Fallback:
        """Return the runtime switch rule of a cut that switches (``cut.switch_to``)."""
        kv = (1.0 - cut.alpha) * n_x + worst / 2.0
        return Fallback(cut.switch_to, worst, model.step(kv),
                        self.context.model_of(cut.switch_to).step(kv),
                        self.settings.time_margin, min(worst, expected))

    def _options(self, goal: Goal, cuts: list, solve: bool, switch: bool = True) -> list:
        """Judge every cut, each candidate as the cuts it stands for for this goal.

        ``solve``: an eviction bound becomes the ratios worth trying. ``switch`` also
        judges full precision switching to a lower one (not for a goal that pinned its
        precision).
        """
        options = []
        for candidate in cuts:
            for cut in candidate.concrete(self.context, goal, solve):
                option = self.judge(goal, cut)
                hybrid = self._hybrid(goal, option) \
                    if switch and isinstance(cut, Precision) and cut.alpha == 0.0 else None
                options += [hybrid] if hybrid is not None else []
                options.append(option)
        return options

    def _reserve(self, request: Request, goal: Goal, cut: Cut, worst: int) -> Fallback | None:
        """Return the switch rule a full-precision AUTO plan keeps in reserve (or None).

        An answer or a step running longer than planned then switches instead of missing.
        """
        if request.mode != Mode.AUTO or not cut.keeps_reserve or not self.precisions or \
                request.precision:
            return None
        name = cut.switch_to or next(iter(self.precisions))
        factor = self.context.effects.of_precision(name).length_factor
        if not self._switch_pays(goal.model, name, goal.n_x, worst):
            return None
        return self.fallback_for(goal.model, FallbackSwitch(name, mode=cut.mode, alpha=cut.alpha),
                                 goal.n_x, worst, math.ceil(max(1, goal.predicted) * factor))

    def plan(self, request: Request, prompt_tokens: int, time_left_s: float,
             predicted: int | None = None, pending: bool = False,
             timing: TimingModel | None = None, spread=None,
             engine_prefix: dict | None = None) -> Plan:
        """Return the plan, or raise Rejection when the deadline cannot be met.

        ``pending``: the length is predicted later (during prefill); plan a 1-token
        answer now, so only goals whose first token cannot make it are rejected.
        ``timing``: the full-precision ETE to plan with instead of the planner's own (the
        steps of the batch the goal will decode in; lowered precisions decode alone).
        ``engine_prefix``: prompt tokens another engine holds from an earlier prompt
        (option -> tokens; its prefill skips them).
        """
        settings = self.settings
        model = timing or self.timing()
        predicted, predictor, dist = predict(self.predictor, request, prompt_tokens, predicted,
                                             pending, spread)
        # With a calibrated distribution: plan for the quantile of the lengths such a
        # prediction turns into.
        planned = math.ceil(dist.quantile(settings.plan_quantile, predicted)) \
            if dist is not None else predicted
        goal = Goal(model, prompt_tokens, max(1, planned), request.max_new_tokens,
                    time_left_s * (1.0 - settings.time_margin), predicted, dist,
                    request.pessimistic_factor, dict(engine_prefix or {}),
                    settings.length_hedge,
                    unpredicted(dist) if dist is not None and settings.length_hedge > 0 else None)
        cuts, note = profiled_only(*self._candidates(request, goal), request,
                                   self.provisional_base)
        options = self._options(goal, cuts, solve=request.eviction_ratio == 0.0,
                                switch=not request.precision)
        chosen = choose(options, settings, cheapest=request.mode == Mode.AUTO)
        note, worst = explain(self.context, settings, note, chosen, options), chosen.worst
        # The per-token deadline first: it may switch AUTO to early exit, and the
        # estimate below must be the one of the mode that runs.
        chosen, p99, utilisation = per_token_check(self, request, goal, chosen)
        cut, wcet, fits, fit = chosen.cut, chosen.wcet, chosen.fits, chosen.probability
        prefill = cut.prefill_s(self.context, model, prompt_tokens)
        plan = Plan(
            mode=cut.mode,
            prompt_tokens=prompt_tokens, predicted_tokens=predicted,
            predictor=predictor, worst_case_tokens=worst,
            pessimistic_factor=request.pessimistic_factor, eviction_ratio=cut.alpha,
            press=settings.press if cut.alpha > 0.0 else '', est_prefill_s=prefill,
            est_decode_s=wcet - prefill, est_wcet_s=wcet,
            est_wcet_full_s=model.wcet(prompt_tokens, 0.0, worst),
            est_wcet_alpha_max_s=model.wcet(prompt_tokens, settings.alpha_max, worst),
            feasible=wcet <= goal.target,
            token_deadline_s=request.token_deadline_s, est_p99_tpot_s=p99,
            utilisation=utilisation, fit_probability=fit, fits_tokens=fits, note=note,
            precision=cut.precision, fallback=self._reserve(request, goal, cut, worst),
            **cut.plan_fields(self.context))
        if closes_in_time(request, settings, fits):
            plan = replace(plan, note=f'{plan.note}; the answer may not fit: it runs to its '
                                      'deadline and the grammar closes it there'
                           if fit < settings.admit_probability else plan.note)
        elif fit < settings.admit_probability and request.mode != Mode.NONE \
                and request.eviction_ratio == 0.0 and settings.infeasible == 'reject':
            raise Rejection(
                f'cannot meet the deadline: predicted {predicted} answer tokens ({predictor}); '
                f'{fits} fit in {goal.target:.3f} s ({time_left_s:.3f} s left less a '
                f'{settings.time_margin:.0%} margin) {cut.describe(self.context)}, and '
                f'P(answer <= {fits} tokens) = {fit:.1%} < admit_probability '
                f'{settings.admit_probability:g}; estimated worst case {wcet:.3f} s for '
                f'{worst} tokens (prompt {prompt_tokens} tokens)', plan)
        return plan


def profiled_only(cuts: list, note: str, request: Request, provisional_base: str) -> tuple:
    """Return (the cuts on options profiled on this machine, the note saying what is not).

    ``provisional_base``: why the model's own times are a stand-in, not a profile of this
    machine (the node's first minutes, serving/warmup.py); then only the other engines'
    cuts run goals, and a goal with none left is refused with the reason ('': all are).
    """
    if not provisional_base:
        return cuts, note
    served = [cut for cut in cuts if isinstance(cut, OtherEngine)]
    if not served:
        raise Rejection(
            f'{request.mode.name} runs on the model itself, which is not yet profiled on '
            f'this machine (the node profiles it while idle); MODE_AUTO goals run on the '
            f'profiled engines meanwhile')
    wait = f'the model itself not yet profiled here (a stand-in: {provisional_base})'
    return served, f'{note}; {wait}' if note else wait


def fits_at_ratio(context: CutContext, goal: Goal, cut: Cut, wcet: float, worst: int,
                  ratio: float) -> int:
    """Return the tokens that fit when the option runs ``ratio`` times its estimate."""
    if wcet * ratio <= goal.target and goal.hedge <= 0.0:
        return worst
    return tokens_that_fit(context, replace(goal, target=goal.target / ratio), cut)


def answer_fit_probability(goal: Goal, effect, worst: int, fits: int) -> tuple:
    """Return P(the answer ends within ``fits`` tokens), plain and hedged.

    Admission reads the plain one. The hedged one, which the choice among options
    compares, reads ``goal.hedge`` of it from the lengths seen with no prediction: a
    goal the predictor misjudges (a status report predicted at 32 tokens that runs to
    128) then does not make a slow option that fits only its plan look sure.
    """
    if fits >= goal.cap:
        return 1.0, 1.0  # the answer stops at max_new_tokens
    # The full model's lengths whose answer under the cut fits, one per measured ratio.
    within = effect.full_lengths_within(fits)

    def prob(dist) -> float:
        return sum(dist.prob_at_most(n, goal.predicted) for n in within) / len(within)
    if fits >= worst:
        plain = 1.0  # the planned length fits
    elif goal.dist is not None:
        plain = prob(goal.dist)
    else:
        return 0.0, 0.0
    if goal.hedge <= 0.0 or goal.unpredicted is None:
        return plain, plain
    return plain, (1.0 - goal.hedge) * plain + goal.hedge * prob(goal.unpredicted)


def per_token_check(planner, request: Request, goal: Goal, chosen: Option) -> tuple:
    """Check the per-token deadline; return (option, P99 s per token, utilisation).

    AUTO may switch to early exit when full depth is too slow per token; raise
    Rejection when the goal cannot be scheduled.
    """
    deadline = request.token_deadline_s
    if deadline <= 0.0:
        return chosen, 0.0, 0.0
    settings, cut, context = planner.settings, chosen.cut, planner.context
    last_kv = (1.0 - cut.alpha) * goal.n_x + chosen.worst - 1

    def p99_for(at: Cut) -> float:
        return p99_tpot_estimate(at.step_s(context, goal.model, last_kv),
                                 settings.tpot_jitter)
    p99 = p99_for(cut)
    ok, utilisation = schedulable(p99, deadline)
    if not ok and request.mode == Mode.AUTO and context.early_exit is not None and \
            settings.auto_early_exit and cut.mode != Mode.EARLY_EXIT:
        cut = EarlyExit(cut.alpha)  # full depth is too slow per token
        p99 = p99_for(cut)
        ok, utilisation = schedulable(p99, deadline)
        chosen = planner.judge(goal, cut)
    if not ok:
        raise Rejection(
            f'not schedulable: estimated P99 time per token {p99 * 1e3:.1f} ms > '
            f'per-token deadline {deadline * 1e3:.1f} ms (U = {utilisation:.2f}, mode '
            f'{cut.mode.name}, KV up to {last_kv:.0f} tokens)')
    return chosen, p99, utilisation


def best_effort(refused: Rejection, policy: OverrunPolicy, may_try: bool,
                where: str) -> Plan | None:
    """Return the plan a refused goal runs on anyway, or None.

    ``idle_best_effort``: a Kill goal whose best chance (the option fitting the largest
    share of its planned answer) fits at least one answer token runs on it when the
    engine would otherwise idle (``may_try``; ``where`` says why, for the note): an idle
    engine loses nothing by trying, the goal is killed at its deadline if late, and a
    refusal would fail a goal the fastest engine may still answer.
    """
    plan = refused.plan
    if not may_try or policy != OverrunPolicy.KILL or plan is None or plan.fits_tokens < 1:
        return None
    return replace(plan, note=f'best effort (Kill, {where}): {refused.reason}')
