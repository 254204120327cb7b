# SPDX-License-Identifier: Apache-2.0
"""Execution-time profiles: fitted ETE coefficients plus how and where they were measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
import re

import yaml

from timebill_ros.core.precision import pick_int8, UnitTimes
from timebill_ros.core.timing import BatchTimingModel, TimingModel

FORMAT = 1


@dataclass
class Profile:
    """One calibration of one model on one device and dtype."""

    model: str
    device: str
    dtype: str
    coefficients: dict
    prefill_points: list = field(default_factory=list)
    decode_points: list = field(default_factory=list)
    heldout: dict = field(default_factory=dict)
    residuals: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    date: str = ''
    host: str = ''
    # Per-layer decode-step times (early exit): {'layers_s': [...], 'head_s': s, 'n_kv': n}.
    layer_times: dict = field(default_factory=dict)
    # Batched decode steps (max_batch > 1): [[batch size, total KV, s], ...] and the
    # per-size fit [[p_b, q_b], ...] (core.timing.BatchTimingModel).
    batch_points: list = field(default_factory=list)
    batch_coefficients: list = field(default_factory=list)
    # Per-unit decode-step times per precision (mixed precision): {precision: {'a': [...],
    # 'c': [...], 'rest_a': s, 'rest_c': s}} with units the layers then the LM head.
    unit_times: dict = field(default_factory=dict)
    format: int = FORMAT

    def timing_model(self) -> TimingModel:
        """Return the fitted ETE."""
        c = self.coefficients
        return TimingModel(c['a'], c['b'], c['c'], c['p'], c['q'])

    def batch_model(self, max_batch: int) -> BatchTimingModel | None:
        """Return the batched-step model if it was profiled up to ``max_batch`` sequences."""
        pairs = self.batch_coefficients or []
        if len(pairs) < max_batch:
            return None
        return BatchTimingModel(tuple((float(p), float(q)) for p, q in pairs))

    def units_of(self, precision: str, units: int) -> UnitTimes | None:
        """Return the profiled per-unit times at ``precision`` if they cover ``units``."""
        data = (self.unit_times or {}).get(precision)
        if not data or len(data.get('a') or ()) != units:
            return None
        return UnitTimes(tuple(data['a']), tuple(data['c']), float(data.get('rest_a', 0.0)),
                         float(data.get('rest_c', 0.0)))

    def set_units(self, precision: str, times: UnitTimes) -> None:
        """Store per-unit times for ``precision``."""
        self.unit_times = {**(self.unit_times or {}), precision: {
            'a': [float(v) for v in times.a], 'c': [float(v) for v in times.c],
            'rest_a': float(times.rest_a), 'rest_c': float(times.rest_c)}}

    def decode_threads(self) -> int | None:
        """Return the intra-op thread count the decode steps were timed at (None: unknown)."""
        v = self.versions or {}
        count = v.get('decode_threads') or v.get('threads')
        return int(count) if count else None

    def matches(self, model: str, device: str, dtype: str) -> bool:
        """Tell whether this profile was measured for this model, device and dtype."""
        return (self.model, self.device, self.dtype) == (model, device, dtype)

    def scaled(self, dtype: str, prefill: float, decode: float, why: str) -> 'Profile':
        """Return a stand-in for ``dtype``: this profile's times x ``prefill`` / ``decode``.

        For a copy not yet profiled here (``why`` says from what the ratios came); it is
        never saved and ``provisional`` names it.
        """
        c = self.coefficients
        return Profile(
            self.model, self.device, dtype,
            {'a': c['a'] * prefill, 'b': c['b'] * prefill, 'c': c['c'] * prefill,
             'p': c['p'] * decode, 'q': c['q'] * decode},
            [[n, t * prefill] for n, t in self.prefill_points],
            [[kv, t * decode] for kv, t in self.decode_points],
            versions={**(self.versions or {}), 'provisional': why}, date=self.date,
            host=self.host)

    @property
    def provisional(self) -> str:
        """Return why this profile stands in for one not measured ('' for a measured one)."""
        return str((self.versions or {}).get('provisional', ''))

    def save(self, path: Path) -> None:
        """Write the profile as YAML (creating folders)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(asdict(self), sort_keys=False), encoding='utf-8')

    @classmethod
    def load(cls, path: Path) -> 'Profile':
        """Read a profile; raise ValueError if the file is not one."""
        data = read_document(path, FORMAT, 'profile')
        missing = {'a', 'b', 'c', 'p', 'q'} - set(data.get('coefficients') or {})
        if missing:
            raise ValueError(f'{path}: coefficients missing {sorted(missing)}')
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def default_path(root: Path, model: str, device: str, dtype: str) -> Path:
    """Return where the profile of this model/device/dtype lives under ``root``."""
    slug = re.sub(r'[^A-Za-z0-9_.-]+', '_', f'{model}-{device}-{dtype}')
    return Path(root) / 'profiles' / f'{slug}.yaml'


def read_document(path: Path, form, what: str) -> dict:
    """Return the YAML mapping at ``path`` whose ``format`` is ``form``; else ValueError."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding='utf-8'))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f'cannot read {what} {path}: {exc}') from exc
    if not isinstance(data, dict) or data.get('format') != form:
        raise ValueError(f'{path} is not a timebill {what} (format {form})')
    return data


@dataclass(frozen=True)
class Int8Pick:
    """The decode steps ``auto_precision: int8`` timed, stored so a restart need not.

    The choice is recomputed from the times (``core.precision.pick_int8``), so a
    change of the rule applies to a stored pick too.
    """

    model: str
    device: str
    dynamic_step_s: float
    weight_step_s: float

    FORMAT = 'timebill-int8-pick/1'

    @property
    def chosen(self) -> str:
        """Return the int8 format these times pick."""
        return pick_int8(self.dynamic_step_s, self.weight_step_s)

    def matches(self, model: str, device: str) -> bool:
        """Tell whether this pick was timed for this model on this device."""
        return (self.model, self.device) == (model, device)

    def save(self, path: Path) -> None:
        """Write the pick as YAML (creating folders)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({'format': self.FORMAT, **asdict(self)},
                                       sort_keys=False), encoding='utf-8')

    @classmethod
    def load(cls, path: Path) -> 'Int8Pick':
        """Read a stored pick; raise ValueError if the file is absent or not one."""
        data = read_document(path, cls.FORMAT, 'int8 pick')
        try:
            pick = cls(str(data['model']), str(data['device']), float(data['dynamic_step_s']),
                       float(data['weight_step_s']))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f'{path}: bad int8 pick ({exc})') from exc
        if not (pick.dynamic_step_s > 0.0 and pick.weight_step_s > 0.0):
            raise ValueError(f'{path}: decode step times must be positive')
        return pick
