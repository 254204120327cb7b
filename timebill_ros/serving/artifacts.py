# SPDX-License-Identifier: Apache-2.0
"""Files the serving parts are built from, each checked against the loaded model.

Every artifact (profile, length head, exit heads, cut effects, per-layer KL table, the
int8 pick) is read the same way by ``load_checked``: load it, check it was made for
this model, or say why not in a warning and go on with a fallback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from timebill_ros.core.cuts import CutEffects, SHIPPED as SHIPPED_CUT_EFFECTS
from timebill_ros.core.planning import MaxTokensPredictor
from timebill_ros.core.precision import shipped_unit_kl, UnitKL
from timebill_ros.core.profile import Int8Pick, Profile
from timebill_ros.runtime.exit_heads import ExitHeads, SHIPPED_EXIT_HEADS
from timebill_ros.runtime.model import FLOAT32_ACTIVATIONS, machine_of
from timebill_ros.runtime.precision import MixedModel
from timebill_ros.runtime.predictor import load_predictor, SHIPPED_HEAD


class Log(Protocol):
    """Where the assembly reports (a ROS logger, ``logging``, a list in tests)."""

    def info(self, message: str) -> None:
        """Report progress."""

    def warning(self, message: str) -> None:
        """Report a fallback."""

    def error(self, message: str) -> None:
        """Report a failure the server survived."""


def load_checked(log: Log, load: Callable[[], object],
                 check: Callable[[object], str] = lambda artifact: '', fallback=None,
                 unreadable: Callable[[ValueError], str] | None = None,
                 quiet: bool = False):
    """Return what ``load`` reads when ``check`` finds it fits, else ``fallback``.

    ``check`` returns '' for an artifact made for this model, else the warning to log.
    ``load`` raises ValueError on a file it cannot read: with ``unreadable`` the warning
    it returns for the error is logged and ``fallback`` returned; without, the error
    propagates (a broken file the configuration names is a configuration error).
    ``quiet`` falls back without a warning (a cached measurement that is simply redone).
    """
    try:
        artifact = load()
    except ValueError as exc:
        if unreadable is None:
            raise
        reason = unreadable(exc)
    else:
        reason = check(artifact)
        if not reason:
            return artifact
    if not quiet:
        log.warning(reason)
    return fallback


def _made_for(loaded) -> Callable[[object], str]:
    """Return a check that a profile was measured for ``loaded`` (model, device, dtype)."""
    def check(profile: Profile) -> str:
        if profile.matches(loaded.name, loaded.device, loaded.dtype):
            return ''
        return (f'{profile.model}/{profile.device}/{profile.dtype} is not '
                f'{loaded.name}/{loaded.device}/{loaded.dtype}')
    return check


def stored_profile(log: Log, path: Path, loaded, threads: int,
                   recalibrate: bool, prefill_chunk: int | None = None) -> Profile | None:
    """Return the profile at ``path`` if it was measured for ``loaded`` (None: warned why).

    With ``recalibrate``, a profile whose decode steps were timed at another thread
    count than ``threads`` (0: any), or whose prefills ran in other passes than
    ``prefill_chunk`` tokens (None: any), is refused too.
    """
    if not path.is_file():
        return None

    def check(profile: Profile) -> str:
        if _made_for(loaded)(profile):
            return (f'{path} was measured for {profile.model}/{profile.device}/'
                    f'{profile.dtype}, not this model; ignoring it')
        if threads and profile.decode_threads() not in (None, threads) and recalibrate:
            # Steps timed at another thread count mislead the ETE by up to 2x.
            return (f'{path} timed decode steps at {profile.decode_threads()} '
                    f'thread(s), the node decodes with {threads}: recalibrating')
        measured_on, here = profile.versions.get('machine'), machine_of(loaded.device)
        if measured_on and measured_on != here and recalibrate:
            # Which precision or engine is fast differs between machines of one name.
            return f'{path} was measured on {measured_on}, this is {here}: recalibrating'
        timed = int(profile.versions.get('prefill_chunk', 0))
        if prefill_chunk is not None and timed != prefill_chunk and recalibrate:
            return (f'{path} timed prefills in passes of {timed or "all the"} tokens, the '
                    f'node prefills {prefill_chunk or "the whole prompt"} a pass: '
                    'recalibrating')
        return ''
    return load_checked(log, lambda: Profile.load(path), check, unreadable=str)


def save_profile(log: Log, profile: Profile, path: Path) -> str:
    """Save a measured profile at ``path``; return where it went, for the log line.

    An unwritable cache costs a calibration per start, no more: the profile is then
    used until the node stops (a warning says why).
    """
    try:
        profile.save(path)
        return f'saved {path}'
    except OSError as exc:
        log.warning(f'cannot save the profile to {path}: {exc}')
        return f'NOT saved ({exc}); it is used until the node stops'


def stored_threads(log: Log, path: Path, loaded) -> int | None:
    """Return the decode threads a matching stored profile was timed at (None: none)."""
    profile = load_checked(log, lambda: Profile.load(path), _made_for(loaded),
                           unreadable=str, quiet=True)
    return None if profile is None else profile.decode_threads()


def stored_int8_pick(log: Log, path: Path, loaded) -> Int8Pick | None:
    """Return the int8 pick timed at an earlier start on this model and device (or None)."""
    def check(pick: Int8Pick) -> str:
        return '' if pick.matches(loaded.name, loaded.device) else 'another model or device'
    return load_checked(log, lambda: Int8Pick.load(path), check, unreadable=str, quiet=True)


def exit_heads(log: Log, choice: str, layers: tuple, loaded):
    """Return the exit heads the parameter asks for (None: logit lens everywhere)."""
    if choice == 'lens':
        return None
    path = SHIPPED_EXIT_HEADS if choice == 'shipped' else Path(choice)
    if not path.is_file():
        raise ValueError(f'early_exit_heads {choice!r}: no file at {path}')

    def check(heads: ExitHeads) -> str:
        # Maps are fitted to one model's hidden states.
        return '' if heads.target == loaded.name else (
            f'exit heads {path} were fitted on {heads.target!r}, not {loaded.name!r}: '
            'using the logit lens')
    heads = load_checked(log, lambda: ExitHeads.load(path), check)
    if heads is None:
        return None
    covered = [layer for layer in layers if layer in heads.maps]
    log.info(f'exit heads from {path} at layers {covered}; logit lens at '
             f'{[layer for layer in layers if layer not in covered]}')
    return ExitHeads(heads.target, {k: v for k, v in heads.maps.items() if k in covered})


def length_predictor(log: Log, choice: str, loaded, max_tokens: int):
    """Build the answer-length predictor the parameter names (ValueError if unusable)."""
    if choice == 'max-new-tokens':
        return MaxTokensPredictor()
    path = SHIPPED_HEAD if choice == 'rlp' else Path(choice)
    if not path.is_file():
        raise ValueError(f'length_predictor {choice!r}: no head file at {path}')

    def check(predictor) -> str:
        # Lengths are distilled from one model; another model answers differently.
        return '' if predictor.target == loaded.name else (
            f'length predictor {path} was trained on {predictor.target!r} answers, not '
            f'{loaded.name!r}: using max-new-tokens instead')
    predictor = load_checked(
        log, lambda: load_predictor(path, loaded, max_tokens), check,
        # e.g. the head reads a layer this model does not have
        unreadable=lambda exc: (f'length predictor {path} does not fit model '
                                f'{loaded.name!r} ({exc}): using max-new-tokens'))
    if predictor is None:
        return MaxTokensPredictor()
    log.info(f'length predictor {predictor.name} from {path}')
    return predictor


def text_length_predictor(log: Log, choice: str, loaded):
    """Build the text-side length head (None: 'none', or unusable for this model: logged).

    It stands in for the torch head when that would cost too much of a goal's time.
    """
    from timebill_ros.runtime.predictor import text_predictor
    try:
        predictor = text_predictor(choice, loaded.name)
    except (ValueError, OSError) as exc:
        log.warning(f'text length predictor unused: {exc}')
        return None
    if predictor is not None:
        log.info(f'text length predictor {predictor.name} ({choice})')
    return predictor


def cut_effects(log: Log, choice: str, loaded) -> CutEffects:
    """Read the measured effects of each cut ('' or a mismatch: cuts count as harmless).

    A file the parameter names must be readable; the shipped one may be missing.
    """
    if not choice:
        return CutEffects()
    path = SHIPPED_CUT_EFFECTS if choice == 'shipped' else Path(choice)

    def check(effects: CutEffects) -> str:
        # Measured on one model's answers; another model reacts differently.
        return '' if loaded.name in effects.source else (
            f'cut effects {path} were measured on another model ({effects.source!r}): '
            'cuts assumed harmless')
    effects = load_checked(
        log, lambda: CutEffects.load(path), check,
        unreadable=(lambda exc: f'{exc}: cuts are assumed not to change answers')
        if choice == 'shipped' else None)
    if effects is None:
        return CutEffects()
    log.info(f'cut effects from {path} ({effects.source})')
    return effects


def mixed_precision(log: Log, choice: str, loaded, variants: dict, low: str,
                    auto_precision: str) -> tuple:
    """Return (MixedModel, UnitKL) for per-layer precision, or (None, None) when off."""
    if not choice:
        return None, None
    if low not in variants:
        log.warning(f'precision_mix needs a resident auto_precision copy '
                    f'({auto_precision!r} is not loaded): whole-model precision only')
        return None, None
    if low not in FLOAT32_ACTIVATIONS:
        # Layers of two dtypes would hand each other mismatched hidden states.
        log.warning(f'precision_mix needs auto_precision int8-dynamic or int8-weight '
                    f'(their activations stay float32), not {low!r}: whole-model '
                    'precision only')
        return None, None
    path = shipped_unit_kl(low) if choice == 'shipped' else Path(choice)
    table = UnitKL.load(path)  # ValueError: a broken file is a configuration error

    def check(mixed: MixedModel) -> str:
        if table.source == loaded.name and table.low == low and \
                len(table.unit_kl) == mixed.units:
            return ''
        return (f'precision KL {path} was measured for {table.source!r} at {table.low} over '
                f'{len(table.unit_kl)} units, not this model: whole-model precision only')
    mixed = load_checked(log, lambda: MixedModel(loaded, variants[low]), check,
                         unreadable=lambda exc: f'precision_mix unavailable: {exc}')
    if mixed is None:
        return None, None
    log.info(f'per-layer {low} mixes from {path} ({mixed.units} units)')
    return mixed, table
