# SPDX-License-Identifier: Apache-2.0
"""The kinds of cut a goal may run under, one small object each.

A cut knows its time estimate (prefill and decode steps, from the full-precision ETE
and the resident precisions' ETEs), its effect on answer length and fidelity
(core.cuts), its decode step for the per-token deadline, and its description. The
planner judges and chooses among cut objects without asking which kind it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
import math
from typing import Callable

from timebill_ros.core.cuts import CutEffect, CutEffects
from timebill_ros.core.early_exit import ExitRule, LayerTimes
from timebill_ros.core.eviction import solve_alpha
from timebill_ros.core.precision import Mix, PrecisionTable
from timebill_ros.core.request import Mode
from timebill_ros.core.timing import TimingModel, with_cached_prefix, worst_case_tokens

# Plan.precision of a per-layer mix (Plan.precision_mix names the lowered units).
MIXED = 'mixed'
# Resident copies whose prefill may be faster than the full model's: 16-bit matrix
# units (AMX, avx512_bf16, GPUs). An int8 copy's prefill is slower on the CPUs seen.
SIXTEEN_BIT = ('bfloat16', 'float16')


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
class CutContext:
    """What cuts read besides the full-precision ETE: the planner's resources."""

    precisions: dict  # resident precision -> callable returning its current TimingModel
    effects: CutEffects
    early_exit: EarlyExitConfig | None = None
    mix: MixConfig | None = None
    # Another resident engine (llama.cpp on a GGUF) -> callable returning its TimingModel:
    # it runs a goal's prefill and decode itself.
    engines: dict = field(default_factory=dict)
    # Seconds an eviction press adds per prompt token (learned from pressed prefills).
    press_s_per_token: Callable[[], float] = field(default=lambda: 0.0)
    # Option ('' = the full model) -> its ETE's recent measured/estimated time ratios
    # at equal-weight quantiles (EstimateErrors.points); () while none were measured.
    time_errors: Callable[[str], tuple] = field(default=lambda option: ())

    def model_of(self, precision: str) -> TimingModel:
        """Return the current ETE of a resident precision's (or engine's) steps."""
        if precision in self.engines:
            return self.engines[precision]()
        return self.precisions[precision]()

    def errors_of(self, option: str) -> tuple:
        """Return an option's recent time-error ratios (the full model's if it has none)."""
        return self.time_errors(option) or self.time_errors('')


@dataclass(frozen=True)
class Goal:
    """One goal as the planner judges cuts for it."""

    model: TimingModel  # the full-precision ETE it is planned with
    n_x: int  # prompt tokens
    planned: int  # answer tokens planned for (>= 1)
    cap: int  # max_new_tokens
    target: float  # seconds the plan may take
    predicted: int
    dist: object  # the predictor's calibrated length distribution, or None
    pessimistic: float
    # Prompt tokens another engine holds from an earlier prompt (option -> tokens): free.
    engine_prefix: dict = field(default_factory=dict, hash=False, compare=False)
    # P(fit)'s weight on ``unpredicted`` (the lengths seen with no prediction), so a
    # confident prediction that is wrong for this goal does not make a slow option sure.
    hedge: float = 0.0
    unpredicted: object = None

    def worst(self, tokens: int) -> int:
        """Return the worst-case answer length planned for ``tokens`` predicted ones."""
        return worst_case_tokens(tokens, self.pessimistic, self.cap)


class Cut:
    """A way to run a goal; each kind below says what it costs and does."""

    mode: Mode
    alpha: float = 0.0  # share of the prompt's KV pairs evicted
    precision = ''  # Plan.precision of the cut ('' = the node's own dtype)
    switch_to = ''  # a precision the decode switches to mid-answer
    keeps_reserve = False  # full-depth full-precision steps: a faster copy may stand by

    def time_s(self, ctx: CutContext, model: TimingModel, n_x: float, tokens: float) -> float:
        """Return the seconds of a ``n_x``-token prompt and ``tokens`` answer tokens."""
        raise NotImplementedError

    def effect(self, ctx: CutContext) -> CutEffect:
        """Return the measured effect on answer length and fidelity."""
        raise NotImplementedError

    def prefill_s(self, ctx: CutContext, model: TimingModel, n_x: float) -> float:
        """Return the seconds of the prefill (the full model's unless the cut runs elsewhere).

        An evicting cut's press scores and compresses the whole cache on the last chunk.
        """
        return model.prefill(n_x) + self._press_s(ctx, n_x)

    def step_s(self, ctx: CutContext, model: TimingModel, kv: float) -> float:
        """Return one answer token's decode step at KV length ``kv`` (per-token deadline)."""
        raise NotImplementedError

    def describe(self, ctx: CutContext) -> str:
        """Return the cut in words, 'with ...' (for rejection reasons and notes)."""
        raise NotImplementedError

    def plan_fields(self, ctx: CutContext) -> dict:
        """Return the Plan fields only this kind of cut sets."""
        return {}

    def concrete(self, ctx: CutContext, goal: Goal, solve: bool) -> list:
        """Return the cuts to judge for this candidate (a bound becomes solved cuts)."""
        return [self]

    def _kept(self, n_x: float) -> float:
        """Return the prompt's KV pairs left after eviction."""
        return (1.0 - self.alpha) * n_x

    def _evicting(self) -> list:
        return [f'eviction ratio {self.alpha:.2f}'] if self.alpha > 0 else []

    def _press_s(self, ctx: CutContext, n_x: float) -> float:
        """Return what the press adds to the prefill (0 without eviction)."""
        return ctx.press_s_per_token() * n_x if self.alpha > 0 else 0.0


def _with(words: list) -> str:
    return 'with ' + ' and '.join(words) if words else 'with the full model'


@dataclass(frozen=True)
class Eviction(Cut):
    """The full model, evicting ``alpha`` of the prompt's KV pairs (0: nothing evicted).

    As a candidate with ``alpha`` > 0 and ``solve`` it is a bound: ``concrete`` turns it
    into the smallest ratio that fits, the measured ratios below the bound, and the bound.
    """

    mode: Mode = Mode.EVICTION
    alpha: float = 0.0
    keeps_reserve = True

    def time_s(self, ctx, model, n_x, tokens):
        return model.wcet(n_x, self.alpha, tokens) + self._press_s(ctx, n_x)

    def effect(self, ctx):
        return _product(ctx.effects.of_eviction(self.alpha), ctx.effects.of_precision(''))

    def step_s(self, ctx, model, kv):
        return model.step(kv)

    def describe(self, ctx):
        return _with(self._evicting())

    def concrete(self, ctx, goal, solve):
        if not solve or self.mode != Mode.EVICTION or self.alpha <= 0.0:
            return [self]
        bound = self.alpha
        decision = solve_alpha(goal.model, goal.n_x, goal.worst(goal.planned),
                               goal.target - self._press_s(ctx, goal.n_x),
                               bound)
        alphas = sorted({decision.alpha, bound, *(
            r for r in ctx.effects.eviction_ratios if r < bound)})
        return [replace(self, alpha=alpha) for alpha in alphas]


def _product(evict: CutEffect, precise: CutEffect) -> CutEffect:
    """Return two cuts' effect together; their length spreads taken as moving together."""
    spreads = [e.length_ratios for e in (evict, precise) if e.length_ratios]
    ratios = ()
    if spreads:
        count = len(spreads[0])
        first, then = (e.length_ratios if len(e.length_ratios) == count
                       else (e.length_factor,) * count for e in (evict, precise))
        ratios = tuple(sorted(a * b for a, b in zip(first, then)))
    return CutEffect(evict.length_factor * precise.length_factor,
                     evict.quality * precise.quality, ratios)


@dataclass(frozen=True)
class Precision(Cut):
    """Every decode step at a resident lower precision; the prefill stays full precision."""

    precision: str
    mode: Mode = Mode.EVICTION
    alpha: float = 0.0

    def time_s(self, ctx, model, n_x, tokens):
        decode = ctx.model_of(self.precision).decode
        return self.prefill_s(ctx, model, n_x) + decode(self._kept(n_x), tokens)

    def effect(self, ctx):
        return _product(ctx.effects.of_eviction(self.alpha),
                        ctx.effects.of_precision(self.precision))

    def step_s(self, ctx, model, kv):
        return ctx.model_of(self.precision).step(kv)

    def describe(self, ctx):
        return _with(self._evicting() + [f'{self.precision} decoding'])


@dataclass(frozen=True)
class CopyPrefill(Precision):
    """The whole goal on a resident 16-bit copy: its prefill as well as its decode steps.

    Planned where the copy's own profiled prefill is faster (the too-small rule leaves
    it out elsewhere), for prompts whose prefill is what does not fit. Its effect is the
    measured row ``<precision>-prefill`` of ``cut_effects``, else the copy's decode row.
    """

    def prefill_s(self, ctx, model, n_x):
        return ctx.model_of(self.precision).prefill(n_x) + self._press_s(ctx, n_x)

    def effect(self, ctx):
        own = ctx.effects.precision.get(f'{self.precision}-prefill')
        return _product(ctx.effects.of_eviction(self.alpha),
                        own or ctx.effects.of_precision(self.precision))

    def describe(self, ctx):
        return _with(self._evicting() + [f'{self.precision} prefill and decoding'])

    def plan_fields(self, ctx):
        return {'prefill_precision': self.precision}


@dataclass(frozen=True)
class OtherEngine(Cut):
    """The whole goal, prefill and decode, on another resident engine (``ctx.engines``).

    Its own ETE times both phases and its measured fidelity row (``CutEffects.precision``
    under the engine's name) is its effect. It offers no KV eviction, early exit or
    mid-answer switch: a cache does not move to the torch engine (between llama.cpp
    options it moves once, after the prefill: EngineHandOver). ``cached``
    prompt tokens the engine holds from an earlier prompt need no prefill.
    """

    precision: str
    mode: Mode = Mode.EVICTION
    cached: int = 0

    def _model(self, ctx) -> TimingModel:
        return with_cached_prefix(ctx.model_of(self.precision), self.cached)

    def time_s(self, ctx, model, n_x, tokens):
        return self._model(ctx).wcet(n_x, 0.0, tokens)

    def prefill_s(self, ctx, model, n_x):
        return self._model(ctx).prefill(n_x)

    def effect(self, ctx):
        return ctx.effects.of_precision(self.precision)

    def step_s(self, ctx, model, kv):
        return ctx.model_of(self.precision).step(kv)

    def describe(self, ctx):
        return _with([f'{self.precision} (prefill and decode)'])


# Seconds a prompt token's KV takes to move between two llama.cpp options (exported as
# sequence state, read by the other context). Measured 9 us at 66 tokens
# (results/engines/split_prefill); the export alone took 16 us a token at 4,224
# (results/engines/llama_cache_determinism/probe_state.py): planned with room above both.
HANDOVER_S_PER_TOKEN = 4e-5


def handover_name(prefill: str, decode: str) -> str:
    """Return the option (and its cut_effects row) that prefills on one, decodes on another."""
    return f'{prefill}>{decode}'


def handover_of(precision: str, prefill_precision: str) -> str:
    """Return the hand-over a plan runs ('' if none): it prefills on another option.

    A 16-bit copy's prefill (CopyPrefill) names its own precision for both.
    """
    return handover_name(prefill_precision, precision) \
        if prefill_precision not in ('', precision) else ''


def handover_names(engines) -> frozenset:
    """Return the hand-over option of every ordered pair of ``engines`` (a goal may pin one)."""
    return frozenset(handover_name(a, b) for a in engines for b in engines if a != b)


def handover_parts(name: str, engines) -> tuple | None:
    """Return (prefill, decode) of a hand-over option of ``engines``, else None."""
    prefill, _, decode = name.partition('>')
    return (prefill, decode) if prefill in engines and decode in engines and \
        prefill != decode else None


def handover_pairs(models: dict, n_x: int) -> list:
    """Return (prefill, decode) names of ``models`` (TimingModels) worth a hand-over.

    Those where the first prefills ``n_x`` tokens faster and the second steps faster:
    the pair then beats each alone in both phases.
    """
    return [(a, b) for a in models for b in models if a != b
            and models[a].prefill(n_x) < models[b].prefill(n_x)
            and models[b].step(n_x) < models[a].step(n_x)]


@dataclass(frozen=True)
class EngineHandOver(OtherEngine):
    """The prompt prefilled on one resident engine, the answer decoded on another.

    For llama.cpp variants of one model (runtime.llama_engine.HandOver): on the AMD
    EPYC VM F16 prefills 1.7x faster than Q4_1 and Q4_1 steps 1.1x faster than F16,
    so the pair is faster than either alone. ``cached`` counts the prefill engine's held
    prompt; the effect is the measured row ``handover_name`` (else the decode
    engine's).
    """

    prefill_engine: str = ''

    def time_s(self, ctx, model, n_x, tokens):
        return self.prefill_s(ctx, model, n_x) + ctx.model_of(self.precision).decode(
            n_x, tokens)

    def prefill_s(self, ctx, model, n_x):
        own = with_cached_prefix(ctx.model_of(self.prefill_engine), self.cached)
        return own.prefill(n_x) + HANDOVER_S_PER_TOKEN * n_x

    def effect(self, ctx):
        return ctx.effects.precision.get(handover_name(self.prefill_engine, self.precision)) \
            or ctx.effects.of_precision(self.precision)

    def describe(self, ctx):
        return _with([f'{self.prefill_engine} prefill, {self.precision} decoding'])

    def plan_fields(self, ctx):
        return {'prefill_precision': self.prefill_engine}

    @staticmethod
    def pairs(ctx, n_x: int) -> list:
        """Return (prefill, decode) engines where the pair beats each alone in both phases."""
        return handover_pairs({name: ctx.model_of(name) for name in ctx.engines}, n_x)


@dataclass(frozen=True)
class EarlyExit(Cut):
    """Decode with early exits (and ``alpha`` eviction); planned on the earliest exit's cost."""

    alpha: float = 0.0
    mode = Mode.EARLY_EXIT

    def time_s(self, ctx, model, n_x, tokens):
        # Exits guarantee the earliest candidate's cost per token; plan on that.
        return self.prefill_s(ctx, model, n_x) + ctx.early_exit.min_step_share() * \
            model.decode(self._kept(n_x), tokens)

    def effect(self, ctx):
        return ctx.effects.early_exit

    def step_s(self, ctx, model, kv):
        return model.step(kv) * ctx.early_exit.min_step_share()

    def describe(self, ctx):
        evict = f' and eviction ratio {self.alpha:g}' if self.alpha > 0 else ''
        return f'with early exit at layer {ctx.early_exit.rule.exit_layers[0]}{evict}'

    def plan_fields(self, ctx):
        return {'exit_layers': tuple(ctx.early_exit.rule.exit_layers)}


@dataclass(frozen=True)
class MixedPrecision(Cut):
    """Some units (decoder layers, LM head) decode at ``ctx.mix.low``, the rest at full.

    As a candidate (``mix`` None) the knapsack DP of core.precision solves the mix per
    goal in ``concrete``.
    """

    mix: Mix | None = None
    mode = Mode.EVICTION
    precision = MIXED

    def time_s(self, ctx, model, n_x, tokens):
        # Full-precision prefill, then the mix's decode steps.
        return self.prefill_s(ctx, model, n_x) + mix_model(
            ctx, model, self.mix, n_x + tokens / 2.0).decode(self._kept(n_x), tokens)

    def effect(self, ctx):
        low = ctx.effects.of_precision(ctx.mix.low)
        return CutEffect(ctx.mix.table.length_factor(self.mix, low.length_factor),
                         ctx.mix.table.fidelity(self.mix, low.quality))

    def step_s(self, ctx, model, kv):
        return mix_model(ctx, model, self.mix, kv).step(kv)

    def describe(self, ctx):
        if self.mix is None:
            return _with([f'{self.precision} decoding'])
        return _with([f'mixed-precision decoding ({len(self.mix.lowered)} of '
                      f'{self.mix.units} units lowered)'])

    def plan_fields(self, ctx):
        return {'precision_mix': self.mix.lowered, 'precision_text': ctx.mix.describe(self.mix)}

    def concrete(self, ctx, goal, solve):
        """Return the least-KL mix that fits the planned length ([] when none).

        Nothing lowered or everything lowered are the full and the low-precision cuts,
        judged on their own. A mix lengthens answers by its share of the low precision's
        factor, so the mix is solved again for the length it causes.
        """
        low = ctx.effects.of_precision(ctx.mix.low)
        worst = goal.worst(goal.planned)
        mix = mix_for(ctx, goal.model, goal.n_x, worst, goal.target)
        if mix is not None and not mix.is_full:
            factor = ctx.mix.table.length_factor(mix, low.length_factor)
            longer = goal.worst(max(1, math.ceil(goal.planned * factor)))
            if longer != worst:
                mix = mix_for(ctx, goal.model, goal.n_x, longer, goal.target) or mix
        if mix is None or mix.is_full or mix.is_all_low:
            return []
        return [MixedPrecision(mix)]


def mix_model(ctx: CutContext, model: TimingModel, mix: Mix, kv: float) -> TimingModel:
    """Return the ETE of decode steps at ``mix`` (scaled at KV length ``kv``)."""
    full_step = model.step(kv)
    low_step = ctx.model_of(ctx.mix.low).step(kv)
    scale = ctx.mix.table.step_scale(mix, kv, full_step, low_step) / max(full_step, 1e-12)
    return TimingModel(model.a, model.b, model.c, model.p * scale, model.q * scale)


def mix_for(ctx: CutContext, model: TimingModel, n_x: int, worst: int,
            target: float) -> Mix | None:
    """Return the least-KL mix whose answer of ``worst`` tokens fits ``target``.

    The per-step budget is the decode time left over the steps, at the mean KV
    length; None when even every unit lowered cannot make it, or no step is left.
    """
    steps = worst - 1
    if steps <= 0:
        return None
    kv = n_x + worst / 2.0
    budget = (target - model.prefill(n_x)) / steps
    low = ctx.model_of(ctx.mix.low)
    return ctx.mix.table.choose(kv, model.step(kv), low.step(kv), budget)


@dataclass(frozen=True)
class FallbackSwitch(Cut):
    """The full model for ``switch`` answer tokens, then ``switch_to`` for the rest.

    Planned as late as still lets the low precision finish; at runtime the switch is
    the plan's Fallback rule. Its effect is the low precision's (the planner credits
    the answers that end before the switch with full fidelity).
    """

    switch_to: str
    switch: int = 1
    mode: Mode = Mode.EVICTION
    alpha: float = 0.0
    keeps_reserve = True

    def time_s(self, ctx, model, n_x, tokens):
        kept = self._kept(n_x)
        return self.prefill_s(ctx, model, n_x) + model.decode(kept, self.switch) + ctx.model_of(
            self.switch_to).decode(kept + self.switch - 1, tokens - self.switch + 1)

    def effect(self, ctx):
        return _product(ctx.effects.of_eviction(self.alpha),
                        ctx.effects.of_precision(self.switch_to))

    @classmethod
    def latest(cls, ctx: CutContext, goal: Goal, low: Cut, worst: int):
        """Return the latest switch from full precision to ``low``'s that still fits.

        ``low`` decodes ``worst`` tokens within the goal's target; None when even a
        switch after the first token does not fit.
        """
        def at(switch: int) -> FallbackSwitch:  # ``switch`` answer tokens at full precision
            return cls(low.precision, switch, low.mode, low.alpha)

        def fits(switch: int) -> bool:
            return at(switch).time_s(ctx, goal.model, goal.n_x, worst) <= goal.target
        if not fits(1):
            return None
        lo, hi = 1, worst
        while lo < hi:  # the full-precision share only shrinks the time left: bisect
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return at(lo)

    def step_s(self, ctx, model, kv):
        return model.step(kv)  # it starts at full precision

    def describe(self, ctx):
        first = self._evicting()
        return _with([f'{first[0] if first else "the full model"}, switching to '
                      f'{self.switch_to} decoding when time runs short'])


def cut_of(plan, ctx: CutContext, held: int = 0) -> Cut:
    """Return the cut a plan runs under (a planned switch counts as its full-model start).

    ``plan`` is a core.planning.Plan; a mixed plan's units are its precision_mix. ``held``:
    prompt tokens another engine the plan runs on holds from an earlier prompt.
    """
    if plan.precision == MIXED:
        return MixedPrecision(Mix(tuple(plan.precision_mix), ctx.mix.table.units)
                              if ctx.mix is not None else None)
    if plan.precision in ctx.engines:
        if plan.prefill_precision in ctx.engines:
            return EngineHandOver(plan.precision, plan.mode, held, plan.prefill_precision)
        return OtherEngine(plan.precision, plan.mode, held)
    if plan.prefill_precision:
        return CopyPrefill(plan.prefill_precision, plan.mode, plan.eviction_ratio)
    if plan.precision:
        return Precision(plan.precision, plan.mode, plan.eviction_ratio)
    if plan.mode == Mode.EARLY_EXIT:
        return EarlyExit(plan.eviction_ratio)
    return Eviction(plan.mode, plan.eviction_ratio)
