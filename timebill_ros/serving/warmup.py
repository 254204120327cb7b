# SPDX-License-Identifier: Apache-2.0
"""Serve within a minute of a first start: the fastest option first, the rest while idle.

On a first start no resident option has a profile of this machine, and calibrating all
of them one after another took 6 minutes on a 2-core VM. Instead the node probes each
option with one short command (a 64-token prefill and 8 decode steps), calibrates the
fastest option that serves a goal alone (a llama.cpp engine, or the model's own torch
path) and serves on it. The other options are calibrated on the worker thread between
goals, one measured point at a time (serving/dispatch.py runs ``step``; a goal that
arrives cuts the point short, and it is measured again later), fastest first and the
torch copies after the model's own path (their prefill runs there). Each option joins
the planner when its profile is complete: a new pipeline, swapped in by one reference.

Until the model's own path is profiled the planner knows its times only as a stand-in,
the served option's profile scaled by the probe's ratios, and runs no goal there
(core.planning.TimeBillPlanner's ``provisional_base``); the plan's note says so.
"""

from __future__ import annotations

import time

from timebill_ros.core.profile import Profile
from timebill_ros.runtime.llama_engine import llama_calibration_steps, llama_grid
from timebill_ros.runtime.llama_engine import probe_command as probe_llama
from timebill_ros.runtime.profiler import calibration_steps, finish, Grid, never, probe_command
from timebill_ros.runtime.profiler import QUICK
from timebill_ros.serving import artifacts
from timebill_ros.serving.assembly import online_model, Pipeline
from timebill_ros.serving.engine_options import option_profile

OWN = ''  # the model's own path (its dtype on torch), as core.planning names it
SHORT_ANSWER = 32  # answer tokens of the short command options are ranked by


class Warmup:
    """The resident options' profiles: found, measured at start, or still to measure."""

    def __init__(self, assembly):
        """Serve for ``assembly`` (its model, copies and engines are loaded)."""
        self.assembly, self.log = assembly, assembly.log
        self.profiles: dict = {}  # option -> its measured Profile (OWN: the model's own)
        self.pending: list = []  # options to profile while idle, in that order
        self.probed: dict = {}  # option -> (prefill s, step s) of the start-up probe
        self.idle_s: dict = {}  # option -> idle seconds its profiling has taken so far
        self._steps = None  # the profiling under way (a generator of points)
        self._variants: dict = {}  # resident copy -> its online ETE
        self._online = None  # (the own profile, its online ETE): kept across pipelines

    def name(self, option: str) -> str:
        """Return how logs and diagnostics name an option (the model's own: its dtype)."""
        return option or self.assembly.loaded.dtype

    def start(self) -> Pipeline:
        """Find the stored profiles, calibrate the fastest option if none serves; plan."""
        assembly, config = self.assembly, self.assembly.config
        found = self._stored(config.calibrate_on_start)
        self.profiles = {option: p for option, p in found.items() if p is not None}
        missing = [option for option, p in found.items() if p is None]
        if missing and config.calibrate_on_start:
            self.probed = self._probe()
            self.log.info('start-up probe, a 64-token prompt and 8 steps: ' + ', '.join(
                f'{self.name(o)} {p * 1e3:.0f} ms + {s * 1e3:.1f} ms a step'
                for o, (p, s) in self.probed.items()))
            if not any(self._alone(option) for option in self.profiles):
                first = min((o for o in missing if self._alone(o)), key=self._short_s)
                self.log.info(f'no option has a profile of this machine: calibrating the '
                              f'fastest, {self.name(first)}, before serving')
                began = time.monotonic()
                self._store(first, finish(self._steps_of(first, never)),
                            time.monotonic() - began)
                missing.remove(first)
            self.pending = sorted(missing, key=lambda o: (
                o in assembly.variants and OWN in missing, self._short_s(o)))
            if self.pending:
                self.log.info('serving now; profiling while idle: '
                              + ', '.join(map(self.name, self.pending)))
        return self.pipeline()

    def step(self, stop) -> Pipeline | None:
        """Measure one point of the next option to profile (worker thread, while idle).

        ``stop()`` tells that a goal waits (the point is cut short). Return the new
        pipeline when an option's profile is complete, else None.
        """
        if not self.pending:
            return None
        option = self.pending[0]
        if self._steps is None:
            self._steps = self._steps_of(option, stop)
        began = time.monotonic()
        try:
            next(self._steps)
            self.idle_s[option] = self.idle_s.get(option, 0.0) + time.monotonic() - began
            return None
        except StopIteration as done:
            profile = done.value
        except Exception as exc:  # noqa: BLE001 - the node serves on without this option
            self.log.error(f'profiling {self.name(option)} failed: {exc!r}; it stays out '
                           'of planning until ~/calibrate or a restart')
            self.pending.pop(0)
            self._steps = None
            return None
        self.pending.pop(0)
        self._steps = None
        self._store(option, profile, self.idle_s.get(option, 0.0) + time.monotonic() - began)
        if not self.pending:
            self.log.info(f'every option has a profile of this machine now '
                          f'({sum(self.idle_s.values()):.0f} s of idle time)')
        return self.pipeline()

    def profiled(self, option: str, profile: Profile) -> None:
        """Take a profile measured elsewhere (~/calibrate) as the option's."""
        if self.pending and self.pending[0] == option:
            self._steps = None  # the profiling under way is superseded
        if option in self.pending:
            self.pending.remove(option)
        self.profiles[option] = profile

    def status(self) -> dict:
        """Return which options plan goals and which are still being profiled."""
        return {'options_profiled': ', '.join(map(self.name, self.profiles)),
                'options_to_profile': ', '.join(map(self.name, self.pending)) or 'none'}

    def pipeline(self) -> Pipeline:
        """Build the pipeline of the profiled options (a stand-in for the own path if need be)."""
        assembly = self.assembly
        for option, profile in self.profiles.items():
            if option in assembly.llama and option not in assembly.online_engines:
                assembly.online_engines[option] = online_model(profile, assembly.config)
            elif option in assembly.variants and option not in self._variants:
                # One sample per goal: a copy that seldom runs must not take the speed of
                # one goal's moment as its own (the machine's speed is the shared drift).
                self._variants[option] = online_model(profile, assembly.config,
                                                      steps_per_goal=1)
        own = self.profiles.get(OWN) or self._stand_in()
        online = self._online[1] if self._online and self._online[0] is own else None
        pipeline = assembly.pipeline(own, dict(self._variants), online)
        if own is not None and pipeline.online is not None:
            self._online = (own, pipeline.online)
        return pipeline

    # -- how each option is found, probed and measured -------------------------------------

    def _alone(self, option: str) -> bool:
        """Tell whether an option serves a goal by itself (a copy prefills on the model)."""
        return option == OWN or option in self.assembly.llama

    def _short_s(self, option: str) -> float:
        prefill, step = self.probed[option]
        return prefill + SHORT_ANSWER * step

    def _path(self, option: str):
        assembly = self.assembly
        return assembly.profile_path if option == OWN else \
            assembly.variant_profile_path(option)

    def _copy(self, option: str):
        return self.assembly.loaded if option == OWN else self.assembly.variants[option]

    def _stored(self, recalibrate: bool) -> dict:
        """Return {option: its stored profile of this machine, or None}."""
        assembly, chunk = self.assembly, self.assembly.config.prefill_chunk
        found = {}
        for option in (OWN, *assembly.variants):
            copy = self._copy(option)
            found[option] = artifacts.stored_profile(
                self.log, self._path(option), copy, assembly.threads(copy), recalibrate, chunk)
        for option, engine in assembly.llama.items():
            found[option] = option_profile(self.log, engine, assembly.loaded,
                                           self._path(option), recalibrate)
        return found

    def _probe(self) -> dict:
        """Return {option: (prefill s, step s)} of one short command on each option."""
        assembly, probed = self.assembly, {}
        with assembly.model_lock:
            for option in (OWN, *assembly.variants):
                copy = self._copy(option)
                probed[option] = probe_command(copy, assembly.threads(copy))
            for option, engine in assembly.llama.items():
                probed[option] = probe_llama(engine)
        return probed

    def _steps_of(self, option: str, stop):
        """Return the generator that profiles ``option`` a point at a time."""
        assembly, config = self.assembly, self.assembly.config
        if option in assembly.llama:
            return llama_calibration_steps(assembly.llama[option],
                                           llama_grid(config.calibration_quick),
                                           assembly.loaded.name, stop)
        copy = self._copy(option)
        return calibration_steps(
            copy, QUICK if config.calibration_quick else Grid(), assembly.threads(copy),
            config.max_batch if option == OWN else 1, config.prefill_chunk, stop,
            layer_times=option == OWN and assembly.exit_rule is not None)

    def _store(self, option: str, profile: Profile, seconds: float) -> None:
        """Keep a new profile, save it beside the others and say so."""
        self.profiles[option] = profile
        where = artifacts.save_profile(self.log, profile, self._path(option))
        held = profile.heldout
        self.log.info(
            f'profiled {self.name(option)} in {seconds:.1f} s: held-out MAPE prefill '
            f'{held["prefill_mape_pct"]:.2f}%, decode step {held["decode_mape_pct"]:.2f}%; '
            f'{where}; it plans goals from now on'
            + (f' (still to profile: {", ".join(map(self.name, self.pending))})'
               if self.pending else ''))

    def _stand_in(self) -> Profile | None:
        """Return the own path's stand-in: the fastest profiled engine's, probe-scaled."""
        engines = [o for o in self.profiles if o in self.assembly.llama and o in self.probed]
        if OWN not in self.probed or not engines:
            return None
        served = min(engines, key=self._short_s)
        (own_prefill, own_step), (prefill, step) = self.probed[OWN], self.probed[served]
        prefill_x, step_x = own_prefill / prefill, own_step / step
        return self.profiles[served].scaled(
            self.assembly.loaded.dtype, prefill_x, step_x,
            f"{served}'s profile x{step_x:.1f} a step and x{prefill_x:.1f} a prefill, as "
            'the start-up probe measured them')
