# SPDX-License-Identifier: Apache-2.0
"""What a quality cut does to the answer: its length and its fidelity to the full model.

Eviction, lower precision and early exit change the tokens a small model emits, not
only their cost: on the 135M model an evicted or int8 answer can run several times
longer than the full model's. The planner weighs each cut by the chance that its
(longer) answer fits and by how close its answers stay to the full model's, both
measured on the workload's train split (``timebill_measure_cuts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import json
from pathlib import Path

import numpy as np

FORMAT = 1
# Quantiles of the per-answer length ratio a measured cut keeps (CutEffect.length_ratios).
RATIO_QUANTILES = 10
# The table measured for the embedded model (training.measure_cuts).
SHIPPED = Path(__file__).resolve().parents[1] / 'data' / 'cut_effects.json'


@dataclass(frozen=True)
class CutEffect:
    """Answer length under a cut relative to the full model's, and answer fidelity.

    ``length_ratios``: where measured, the spread of one answer's length under the cut
    over the full model's answer to the same prompt (evenly spaced quantiles). A mean
    factor says two options' answers are alike in length; the spread says how often
    each runs much shorter or longer than the full model's, which is what decides a
    goal only a short answer can meet (a Q4_1 answer of 10 tokens where float32's has
    44, a hand-over answer of 128 where float32's has 7).
    """

    length_factor: float = 1.0
    quality: float = 1.0
    length_ratios: tuple = ()

    def __post_init__(self):
        """Check the values are usable (a factor > 0, a quality in [0, 1], ratios > 0)."""
        if not self.length_factor > 0.0:
            raise ValueError(f'length_factor must be > 0 (got {self.length_factor})')
        if not 0.0 <= self.quality <= 1.0:
            raise ValueError(f'quality must be in [0, 1] (got {self.quality})')
        if any(not r > 0.0 for r in self.length_ratios) or \
                list(self.length_ratios) != sorted(self.length_ratios):
            raise ValueError('length_ratios must be increasing and > 0')

    def full_lengths_within(self, tokens: float) -> tuple:
        """Return the full-model lengths whose answer under the cut ends within ``tokens``.

        One per measured ratio (equally likely), or ``tokens / length_factor`` alone.
        """
        if not self.length_ratios:
            return (tokens / self.length_factor,)
        return tuple(tokens / ratio for ratio in self.length_ratios)


FULL = CutEffect()


@dataclass(frozen=True)
class CutEffects:
    """Measured effects per cut: eviction by ratio, precision by dtype, early exit.

    Eviction effects are interpolated linearly between the measured ratios
    (ratio 0 is the full model); a cut that was never measured counts as harmless
    (factor 1, quality 1), which is the planner's behaviour without this table.
    """

    eviction_ratios: tuple = ()
    eviction: tuple = ()
    precision: dict = field(default_factory=dict)
    early_exit: CutEffect = FULL
    source: str = ''

    def __post_init__(self):
        """Check the eviction table is sorted and matches its ratios."""
        if len(self.eviction_ratios) != len(self.eviction):
            raise ValueError('one eviction effect per ratio')
        if list(self.eviction_ratios) != sorted(self.eviction_ratios):
            raise ValueError('eviction ratios must be increasing')

    def of_eviction(self, alpha: float) -> CutEffect:
        """Return the effect of evicting ``alpha`` of the prompt's KV pairs."""
        if alpha <= 0.0 or not self.eviction_ratios:
            return FULL
        xs = [0.0, *self.eviction_ratios]
        spreads = [e.length_ratios for e in self.eviction]
        ratios = ()
        if spreads[0] and all(len(r) == len(spreads[0]) for r in spreads):
            # Quantile by quantile from the full model's (every ratio 1) to the measured.
            ratios = tuple(float(np.interp(alpha, xs, [1.0, *(r[i] for r in spreads)]))
                           for i in range(len(spreads[0])))
        return CutEffect(
            float(np.interp(alpha, xs, [1.0, *(e.length_factor for e in self.eviction)])),
            float(np.interp(alpha, xs, [1.0, *(e.quality for e in self.eviction)])),
            tuple(sorted(ratios)))

    def of_precision(self, dtype: str) -> CutEffect:
        """Return the effect of decoding at ``dtype`` ('' is the full model)."""
        return self.precision.get(dtype, FULL) if dtype else FULL

    def to_dict(self) -> dict:
        """Return a JSON-ready dict."""
        def one(effect):
            row = {'length_factor': effect.length_factor, 'quality': effect.quality}
            if effect.length_ratios:
                row['length_ratios'] = list(effect.length_ratios)
            return row
        return {'format': FORMAT, 'source': self.source,
                'eviction': [dict(ratio=r, **one(e))
                             for r, e in zip(self.eviction_ratios, self.eviction)],
                'precision': {k: one(v) for k, v in self.precision.items()},
                'early_exit': one(self.early_exit)}

    @classmethod
    def from_dict(cls, data: dict) -> 'CutEffects':
        """Build from ``to_dict``'s output; ValueError on anything else."""
        if not isinstance(data, dict) or data.get('format') != FORMAT:
            raise ValueError(f'not a cut-effects table of format {FORMAT}')
        try:
            rows = sorted(data.get('eviction', []), key=lambda row: row['ratio'])
            return cls(
                eviction_ratios=tuple(float(r['ratio']) for r in rows),
                eviction=tuple(CutEffect(float(r['length_factor']), float(r['quality']),
                                         tuple(float(x) for x in r.get('length_ratios', ())))
                               for r in rows),
                precision={k: CutEffect(float(v['length_factor']), float(v['quality']),
                                        tuple(float(r) for r in v.get('length_ratios', ())))
                           for k, v in data.get('precision', {}).items()},
                early_exit=CutEffect(**data.get('early_exit', {})),
                source=str(data.get('source', '')))
        except (KeyError, TypeError) as exc:
            raise ValueError(f'malformed cut-effects table: {exc!r}') from exc

    def save(self, path: Path) -> None:
        """Write the table as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + '\n', encoding='utf-8')

    @classmethod
    def load(cls, path: Path) -> 'CutEffects':
        """Read a table written by ``save``; ValueError if unreadable."""
        try:
            data = json.loads(Path(path).read_text(encoding='utf-8'))
        except (OSError, ValueError) as exc:
            raise ValueError(f'cannot read cut effects {path}: {exc}') from exc
        return cls.from_dict(data)


def _paired(full_lengths, cut_lengths) -> tuple:
    """Return the full and cut lengths as arrays (>= 1 token each); ValueError if unpaired."""
    full = np.maximum(np.asarray(full_lengths, dtype=float), 1.0)
    cut = np.maximum(np.asarray(cut_lengths, dtype=float), 1.0)
    if full.shape != cut.shape or full.size == 0:
        raise ValueError('need equally many full and cut lengths (at least one)')
    return full, cut


def length_ratios(full_lengths, cut_lengths, levels=None) -> tuple:
    """Return quantiles of cut / full length per item at ``levels``.

    Default: RATIO_QUANTILES evenly spaced levels (what a table keeps).
    """
    full, cut = _paired(full_lengths, cut_lengths)
    if levels is None:
        levels = (np.arange(RATIO_QUANTILES) + 0.5) / RATIO_QUANTILES
    return tuple(float(q) for q in np.quantile(cut / full, levels))


def length_factor(full_lengths, cut_lengths) -> float:
    """Return sum(cut lengths) / sum(full lengths) over the same items (>= 1 token each)."""
    full, cut = _paired(full_lengths, cut_lengths)
    return float(cut.sum() / full.sum())
