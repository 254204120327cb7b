# SPDX-License-Identifier: Apache-2.0
"""Context reduction: keep the parts of a goal's context most relevant to its question.

When even the fastest option cannot prefill a goal's context by its deadline, the node
may drop the context's least relevant sentences before prefill (``context_reduction``).
Each sentence (or line of a log) is scored against the instruction with BM25 (the
``rank_bm25`` package, Okapi BM25), the best ones are kept up to a share of the
context's characters, and they stay in their original order. The score costs well
under a millisecond per hundred sentences: no model runs. How much of the answers'
correctness survives each share is measured on held-out long-context items
(``timebill_measure_context_cut``) and shipped as a table: how alike the answers stay
(what the planner weighs) and how many right answers survive (said in the plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import json
from pathlib import Path
import re

# The shares of the context's characters tried, largest first.
KEEP_SHARES = (0.5, 0.25, 0.125)
# The table measured for the embedded model (training.measure_context_cut).
SHIPPED = Path(__file__).resolve().parents[1] / 'data' / 'context_cut.json'
_SENTENCE_END = re.compile(r'(?<=[.!?])\s+|\n+')
_WORD = re.compile(r'[a-z0-9]+')


@dataclass(frozen=True)
class ReducedContext:
    """A context with its least relevant sentences dropped."""

    text: str
    keep: float  # the share of characters asked for
    kept: int  # sentences kept
    total: int  # sentences in the context


def sentences(context: str) -> list:
    """Split a context into sentences and lines (each stripped, none empty)."""
    return [part.strip() for part in _SENTENCE_END.split(context) if part.strip()]


def words(text: str) -> list:
    """Return a text's lower-case words and numbers (BM25's terms)."""
    return _WORD.findall(text.lower())


def reduce_context(context: str, question: str, keep: float) -> ReducedContext:
    """Keep the sentences BM25 ranks most relevant to ``question``, ``keep`` of the chars.

    The best sentence is always kept; ties keep the earlier sentence; the kept ones
    stay in order, joined by a space (lines of a log by a newline).
    """
    from rank_bm25 import BM25Okapi
    if not 0.0 < keep <= 1.0:
        raise ValueError(f'keep must be in (0, 1] (got {keep})')
    parts = sentences(context)
    if keep >= 1.0 or len(parts) <= 1:
        return ReducedContext(context, 1.0, len(parts), len(parts))
    terms = [words(part) or [''] for part in parts]
    scores = BM25Okapi(terms).get_scores(words(question))
    ranked = sorted(range(len(parts)), key=lambda i: (-scores[i], i))
    room, chosen = keep * sum(len(part) for part in parts), []
    for index in ranked:
        if chosen and room < len(parts[index]):
            continue
        chosen.append(index)
        room -= len(parts[index])
    joiner = '\n' if context.count('\n') >= len(parts) // 2 else ' '
    text = joiner.join(parts[i] for i in sorted(chosen))
    return ReducedContext(text, keep, len(chosen), len(parts))


@dataclass(frozen=True)
class ContextCutTable:
    """What each context share kept in measurement (1.0: the full context).

    ``quality``: right answers with the share over right answers with all of it (a task
    score). ``likeness``: mean ROUGE-L of the share's answer to the whole context's
    answer, the measure every other cut's fidelity uses (cli.measure_cuts), so the planner
    multiplies like with like.
    """

    quality: dict  # keep share -> right answers with it / right answers with all of it
    source: str = ''
    likeness: dict = field(default_factory=dict)  # keep share -> ROUGE-L to the whole's

    def of(self, keep: float) -> float | None:
        """Return the measured quality of ``keep`` (None: not measured)."""
        return self.quality.get(round(keep, 4))

    def likeness_of(self, keep: float) -> float | None:
        """Return how alike ``keep``'s answers were to the whole context's (None: unknown)."""
        return self.likeness.get(round(keep, 4))

    @classmethod
    def load(cls, path: Path = SHIPPED) -> 'ContextCutTable':
        """Read the table (an empty one when there is none or it is unreadable)."""
        try:
            data = json.loads(Path(path).read_text(encoding='utf-8'))
            return cls(_shares(data['quality']), str(data.get('source', '')),
                       _shares(data.get('likeness', {})))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls({})

    def save(self, path: Path) -> None:
        """Write the table as JSON."""
        data = {'quality': {str(k): v for k, v in sorted(self.quality.items())},
                'likeness': {str(k): v for k, v in sorted(self.likeness.items())},
                'source': self.source}
        Path(path).write_text(json.dumps(data, indent=1) + '\n', encoding='utf-8')


def _shares(values: dict) -> dict:
    return {round(float(k), 4): float(v) for k, v in values.items()}
