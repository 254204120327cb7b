# SPDX-License-Identifier: Apache-2.0
"""Assemble what serves goals: model variants, predictor, cut effects, profiles, the pipeline.

``Assembly`` holds what lives as long as the model (variants, predictor, exit heads)
and builds an immutable ``Pipeline`` (planner, ETE, engine, limits) from a profile;
a recalibration builds a new pipeline and the server swaps it in one assignment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math
from pathlib import Path
import threading

from timebill_ros.core.config import NodeConfig
from timebill_ros.core.cut_kinds import handover_names
from timebill_ros.core.early_exit import ExitRule, LayerTimes
from timebill_ros.core.planner_settings import PlannerSettings
from timebill_ros.core.planning import (
    EarlyExitConfig, FullModelPlanner, MixConfig, TimeBillPlanner)
from timebill_ros.core.precision import INT8_DYNAMIC_MARGIN, PrecisionTable
from timebill_ros.core.profile import default_path, Int8Pick, Profile
from timebill_ros.core.request import Limits, Mode
from timebill_ros.core.timing import (
    fewest_threads, OnlineBatchDrift, OnlineTimingModel, PREFIX_BLOCK)
from timebill_ros.runtime.early_exit import LayerwiseDecoder, measure_layer_times
from timebill_ros.runtime.engine import Engine, PressCost
from timebill_ros.runtime.model import cache_root, ModelLoadError, precision_variant
from timebill_ros.runtime.precision import unit_times
from timebill_ros.runtime.prefix_cache import PrefixCache
from timebill_ros.runtime.presses import press_for_plan
from timebill_ros.runtime.profiler import batch_profile, calibrate, fastest_threads, Grid, QUICK
from timebill_ros.serving import artifacts
from timebill_ros.serving.artifacts import Log
from timebill_ros.serving.engine_options import describe_regime, llama_engines
from timebill_ros.serving.resident import ResidentEngines


@dataclass(frozen=True)
class Pipeline:
    """Everything a goal is planned and run with, fixed for the lifetime of one profile."""

    planner: object
    limits: Limits
    engine: object  # runtime.engine.Engine, or serving.resident.ResidentEngines over it
    max_batch: int  # goals decoded together (config.max_batch)
    online: OnlineTimingModel | None = None
    online_variants: dict = field(default_factory=dict)
    early_exit: EarlyExitConfig | None = None
    # Batched decode steps: the profiled model and its online drift. Set exactly when
    # batching is on (max_batch > 1 and a profile, so ``online`` is set too).
    batch: OnlineBatchDrift | None = None
    # Other resident engines' online ETEs (option -> OnlineTimingModel).
    online_engines: dict = field(default_factory=dict)


def online_model(profile: Profile, config: NodeConfig,
                 steps_per_goal: int = 8) -> OnlineTimingModel:
    """Return an online-refit ETE seeded with a profile's measurements."""
    online = OnlineTimingModel(profile.timing_model(), config.ete_window,
                               config.ete_forgetting, steps_per_goal)
    online.seed([tuple(p) for p in profile.prefill_points],
                [tuple(p) for p in profile.decode_points])
    return online


def time_copies(copies: dict) -> dict:
    """Return {precision: {threads: best step s}} over two interleaved rounds of timing."""
    probed: dict = {low: {} for low in copies}
    for _ in range(2):
        for low, variant in copies.items():
            _, times = fastest_threads(variant)
            for threads, step_s in times.items():
                probed[low][threads] = min(probed[low].get(threads, math.inf), step_s)
    return probed


class Assembly:
    """Build the serving parts of one loaded model from the node's configuration."""

    def __init__(self, config: NodeConfig, loaded, log: Log):
        """Quantise variants, load predictor, effects and exit heads; warm the model up.

        Raise ValueError on a configuration that cannot work with this model.
        """
        self.config, self.loaded, self.log = config, loaded, log
        self.model_lock = threading.Lock()
        # Prompt prefixes of the torch engine, kept across goals (and across re-profiling).
        self.prefix_cache = PrefixCache(PREFIX_BLOCK, config.prefix_cache_mb * 2 ** 20) \
            if config.prefix_cache_mb else None
        self.press_cost = PressCost()  # learned by the engines' pressed prefills (Kill)
        self.profile_path = Path(config.profile) if config.profile else default_path(
            cache_root(), loaded.name, loaded.device, loaded.dtype)
        # probed: precision -> {threads: step s}, timed while building the copy (int8 pick).
        self.variants, probed = self._make_variants()
        self.mixed, self.unit_kl = artifacts.mixed_precision(
            log, config.precision_mix, loaded, self.variants, self.low_precision,
            config.auto_precision)
        self.exit_rule, self.exit_heads = self._make_exit_rule()
        self.decode_threads: dict = {}  # precision -> intra-op threads of its decode steps
        if config.warm_up:
            self.engine().warm_up(press=config.press)
        self.decode_threads = decode_threads_of(self, probed)
        self.llama = llama_engines(config, loaded, log)  # option -> LlamaEngine
        self.online_engines: dict = {}  # option -> its OnlineTimingModel (set by start)
        self.predictor = artifacts.length_predictor(log, config.length_predictor, loaded,
                                                    config.length_predictor_max_tokens)
        # The text head stands in when the torch head would cost too much (admission).
        self.text_predictor = artifacts.text_length_predictor(
            log, config.text_length_predictor, loaded) \
            if config.length_predictor != 'max-new-tokens' else None
        self.effects = artifacts.cut_effects(log, config.cut_effects, loaded)

    def engine(self, exit_decoder=None) -> Engine:
        """Return a new engine over the model and its resident variants."""
        return Engine(self.loaded, press_for_plan, exit_decoder=exit_decoder,
                      variants=self.variants, decode_threads=dict(self.decode_threads),
                      mixed=self.mixed, prefill_chunk=self.config.prefill_chunk,
                      prefix_cache=self.prefix_cache, press_cost=self.press_cost)

    @property
    def low_precision(self) -> str:
        """Return the leading resident copy's precision ('' when none; ``int8``: the pick)."""
        return next(iter(self.variants), '')

    def threads(self, loaded) -> int:
        """Return the decode intra-op threads chosen for one resident model (0: as is)."""
        return self.decode_threads.get(loaded.dtype, 0)

    # -- parts that live as long as the model ------------------------------------------

    def _make_exit_rule(self) -> tuple:
        """Return (ExitRule, ExitHeads or None), or (None, None) when early exit is off."""
        layers = self.config.exit_layers()
        if not layers:
            return None, None
        if layers[-1] >= self.loaded.num_layers:
            raise ValueError(f'early_exit_layers {layers}: the model has '
                             f'{self.loaded.num_layers} layers (exits must be below the last)')
        if not hasattr(self.loaded.model, 'model') or \
                not hasattr(self.loaded.model.model, 'layers'):
            raise ValueError('early exit needs a Llama-style model (model.model.layers)')
        rule = ExitRule(layers, self.config.early_exit_threshold_start,
                        self.config.early_exit_threshold_end)
        return rule, artifacts.exit_heads(self.log, self.config.early_exit_heads, layers,
                                          self.loaded)

    def _make_variants(self) -> tuple:
        """Quantise the resident copy MODE_AUTO may decode with ({} when off or unsupported).

        Return (variants, probed): probed holds the decode step times per thread count
        measured while choosing a copy ({} when none were).
        """
        precision = self.config.auto_precision
        if not precision or precision == self.loaded.dtype:
            return {}, {}
        try:
            if precision == 'int8':
                return self._pick_int8()
            variant = precision_variant(self.loaded, precision)
        except ModelLoadError as exc:
            self.log.warning(f'auto_precision {precision!r} unavailable: {exc}')
            return {}, {}
        self.log.info(f'resident {precision} copy for MODE_AUTO decoding')
        return {precision: variant}, {}

    def int8_pick_path(self) -> Path:
        """Return where ``auto_precision: int8`` stores its timed pick: beside the profile."""
        return self.profile_path.with_name(f'{self.profile_path.stem}.int8-pick.yaml')

    def _pick_int8(self) -> tuple:
        """Build both int8 copies, both options of MODE_AUTO; their timing picks the lead.

        Which is faster depends on the CPU's kernels (core.precision.pick_int8); the
        steps are timed twice, interleaved, at each copy's best thread count. The lead
        comes first: the mid-answer switch's target and the per-layer mix's low
        precision. The times are stored beside the profile and a later start with a
        matching file reuses them (delete the file to time again). Return ({precision:
        copy}, lead first; {precision: {threads: best step s of the two rounds}}).
        """
        path = self.int8_pick_path()
        pick = artifacts.stored_int8_pick(self.log, path, self.loaded)
        if pick is not None:
            self.log.info(f'auto_precision int8: resident int8-dynamic and int8-weight copies '
                          f'for MODE_AUTO, {pick.chosen} leading, as timed at an earlier '
                          f'start ({path}: int8-dynamic {pick.dynamic_step_s * 1e3:.1f} ms, '
                          f'int8-weight {pick.weight_step_s * 1e3:.1f} ms)')
            return {low: precision_variant(self.loaded, low) for low in _lead_first(pick)}, {}
        copies = {low: precision_variant(self.loaded, low)
                  for low in ('int8-dynamic', 'int8-weight')}
        with self.model_lock:
            probed = time_copies(copies)
        best = {low: min(times.values()) for low, times in probed.items()}
        pick = Int8Pick(self.loaded.name, self.loaded.device, best['int8-dynamic'],
                        best['int8-weight'])
        self.log.info(f"auto_precision int8: decode step int8-dynamic "
                      f"{best['int8-dynamic'] * 1e3:.1f} ms, int8-weight "
                      f"{best['int8-weight'] * 1e3:.1f} ms: resident int8-dynamic and "
                      f"int8-weight copies for MODE_AUTO, {pick.chosen} leading (int8-dynamic "
                      f"only when {INT8_DYNAMIC_MARGIN:g}x faster)")
        try:
            pick.save(path)
        except OSError as exc:
            self.log.warning(f'cannot store the int8 pick at {path}: {exc}')
        return {low: copies[low] for low in _lead_first(pick)}, probed

    def _mix_from(self, profile: Profile) -> MixConfig | None:
        """Return the DP's table: unit times from the profile (measured now if absent)."""
        if self.mixed is None:
            return None
        low = self.low_precision
        times = {}
        for precision, loaded in ((self.loaded.dtype, self.loaded), (low, self.variants[low])):
            found = profile.units_of(precision, self.mixed.units)
            if found is None:
                with self.model_lock:
                    found = unit_times(loaded, threads=self.threads(loaded))
                profile.set_units(precision, found)
                try:
                    profile.save(self.profile_path)
                except OSError as exc:
                    self.log.warning(f'cannot save unit times to {self.profile_path}: {exc}')
                self.log.info(f'per-unit {precision} decode times measured now '
                              f'(step {found.total(512) * 1e3:.1f} ms at 512 KV)')
            times[precision] = found
        return MixConfig(PrecisionTable(low, times[self.loaded.dtype], times[low],
                                        self.unit_kl.unit_kl, self.unit_kl.all_low_kl), low)

    # -- profiles and pipelines --------------------------------------------------------

    def recalibrate(self, quick: bool) -> Profile:
        """Calibrate the main model again (and save it); return the profile."""
        return self._calibrate(quick, self.loaded, self.profile_path)

    def variant_profile_path(self, precision: str) -> Path:
        """Return where a resident variant's profile lives: beside ``profile`` if set."""
        if self.config.profile:
            main = Path(self.config.profile)
            return main.with_name(f'{main.stem}.{precision}{main.suffix}')
        return default_path(cache_root(), self.loaded.name, self.loaded.device, precision)

    def _calibrate(self, quick: bool, loaded, path: Path) -> Profile:
        with self.model_lock:
            profile = calibrate(loaded, QUICK if quick else Grid(), progress=False,
                                decode_threads=self.threads(loaded),
                                max_batch=self.config.max_batch
                                if loaded is self.loaded else 1,
                                prefill_chunk=self.config.prefill_chunk)
        where = artifacts.save_profile(self.log, profile, path)
        self.log.info(
            f'calibrated {loaded.dtype}: held-out MAPE prefill '
            f'{profile.heldout["prefill_mape_pct"]:.2f}%, decode step '
            f'{profile.heldout["decode_mape_pct"]:.2f}%; {where}')
        return profile

    def _early_exit_from(self, profile: Profile) -> EarlyExitConfig:
        """Pair the exit rule with per-layer times from the profile (measured if absent)."""
        stored = profile.layer_times or {}
        if len(stored.get('layers_s') or ()) == self.loaded.num_layers:
            times, source = LayerTimes(tuple(stored['layers_s']), stored['head_s']), 'profile'
        else:
            with self.model_lock:
                times = measure_layer_times(self.loaded, n_kv=512, steps=4)
            source = 'measured now (profile has none)'
        self.log.info(
            f'early exit at layers {self.exit_rule.exit_layers}: per-layer times from '
            f'{source}: layer {sum(times.layers) * 1e3 / len(times.layers):.2f} ms mean, '
            f'head {times.head_s * 1e3:.2f} ms, full step {times.full_s * 1e3:.1f} ms')
        return EarlyExitConfig(self.exit_rule, times)

    def _batch_from(self, profile: Profile) -> OnlineBatchDrift | None:
        """Return the batched-step ETE (profiled now, and saved, if the profile lacks it)."""
        size = self.config.max_batch
        if size <= 1:
            return None
        model = profile.batch_model(size)
        source = 'profile'
        if model is None:
            with self.model_lock:
                points, model = batch_profile(self.loaded, size, self.threads(self.loaded))
            profile.batch_points = [[int(b), float(k), float(t)] for b, k, t in points]
            profile.batch_coefficients = model.as_list()
            source = 'measured now (profile had none)'
            try:
                profile.save(self.profile_path)
            except OSError as exc:
                self.log.warning(f'cannot save the batch profile to {self.profile_path}: {exc}')
        steps = ', '.join(f'{b} x {model.step(b, b * 64) * 1e3:.1f}'
                          for b in range(1, size + 1))
        self.log.info(f'batched decode steps from {source} (ms at 64 KV each): {steps}')
        return OnlineBatchDrift(model)

    def pipeline(self, profile: Profile | None, online_variants: dict,
                 online: OnlineTimingModel | None = None) -> Pipeline:
        """Build the planner, ETE and engine for ``profile`` (None: no ETE, full model only).

        ``online``: the model's online ETE to keep (its drift learned so far), if built on
        ``profile`` before. A stand-in ``profile`` (``Profile.provisional``) plans the
        other engines only: no early exit, batch, mix or resident copy until the model's
        own profile arrives.
        """
        config = self.config
        stand_in = profile.provisional if profile is not None else ''
        early_exit = self._early_exit_from(profile) \
            if profile is not None and self.exit_rule is not None and not stand_in else None
        engine = self.engine(LayerwiseDecoder(
            self.loaded, early_exit.rule, early_exit.layer_times, heads=self.exit_heads)
            if early_exit is not None else None)
        if profile is None:
            self.log.warning('no execution-time profile: MODE_EVICTION unavailable')
            return Pipeline(FullModelPlanner(), config.limits(), engine, config.max_batch)
        online = online or online_model(profile, self.config)
        if stand_in:
            online_variants = {}
        precisions = {precision: (lambda variant=variant: variant.model)
                      for precision, variant in online_variants.items()}
        engines = {option: (lambda ete=ete: ete.model)
                   for option, ete in self.online_engines.items()}
        planner = TimeBillPlanner(
            lambda: online.model, self.predictor, PlannerSettings.from_config(config),
            early_exit=early_exit, precisions=precisions, effects=self.effects,
            mix=self._mix_from(profile) if self.low_precision in online_variants else None,
            engines=engines, press_s_per_token=lambda: self.press_cost.s_per_token,
            time_errors=_time_errors({'': online, **online_variants, **self.online_engines}),
            provisional_base=stand_in)
        if engines:
            engine = ResidentEngines(engine, {option: self.llama[option] for option in engines})
        self.log.info(describe_regime(online.model, {p: m() for p, m in precisions.items()},
                                      {e: m() for e, m in engines.items()},
                                      handover=config.llama_handover))
        modes = {Mode.AUTO, Mode.NONE, Mode.EVICTION}
        limits = config.limits(modes | {Mode.EARLY_EXIT} if early_exit is not None else modes,
                               frozenset(online_variants) | frozenset(engines)
                               | handover_names(engines))
        if stand_in:  # one goal at a time: batched steps are timed with the model's profile
            return Pipeline(planner, limits, engine, 1, online, {}, None, None,
                            dict(self.online_engines))
        return Pipeline(planner, limits, engine, config.max_batch, online,
                        dict(online_variants), early_exit, self._batch_from(profile),
                        dict(self.online_engines))


def decode_threads_of(assembly, probed: dict) -> dict:
    """Return {precision: decode threads} of ``assembly``: the parameter, or probed at -1.

    ``probed`` holds step times per thread count already measured for a precision
    (by the int8 pick); those precisions are not timed again.
    """
    setting = assembly.config.decode_threads
    models = {assembly.loaded.dtype: assembly.loaded, **assembly.variants}
    if setting >= 0:
        return {precision: setting for precision in models}
    chosen = {}
    for precision, loaded in models.items():
        path = assembly.profile_path if loaded is assembly.loaded else \
            assembly.variant_profile_path(precision)
        keep = artifacts.stored_threads(assembly.log, path, loaded)
        times = probed.get(precision)
        if times:
            best = fewest_threads(times, keep=keep)
        else:
            with assembly.model_lock:
                best, times = fastest_threads(loaded, keep=keep)
        chosen[precision] = best
        assembly.log.info(f'{precision} decode steps: ' + ', '.join(
            f'{n} thread(s) {t * 1e3:.1f} ms' for n, t in times.items()) +
            f': decoding with {best}' +
            (' (timed by the int8 pick, best of two rounds)' if precision in probed
             else ''))
    return chosen


def _time_errors(etes: dict):
    """Return option -> its ETE's recent error ratios ('' = the full model's)."""
    def points(option: str) -> tuple:
        ete = etes.get(option)
        return ete.errors.points() if ete is not None else ()
    return points


def _lead_first(pick: Int8Pick) -> tuple:
    """Return the two int8 formats, the one ``pick`` chose first."""
    other = 'int8-weight' if pick.chosen == 'int8-dynamic' else 'int8-dynamic'
    return pick.chosen, other
