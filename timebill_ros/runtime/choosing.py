# SPDX-License-Identifier: Apache-2.0
"""How one goal picks its tokens: greedy or sampled, under its grammar, until a stop string.

The decode loop asks a goal's ``TokenChooser`` for its next token from the logits its
lane produced (a torch row or a numpy row: any engine, any precision, any exit layer),
so goals batched together each keep their own mask, sampler and stop strings. Greedy
free text needs no chooser (the backend's argmax).
"""

from __future__ import annotations

import json

import numpy as np

from timebill_ros.core.output import OutputSpec


class TokenChooser:
    """One goal's sampler, constraint and stop strings."""

    def __init__(self, output: OutputSpec, constraint=None, closes: bool = True):
        """Choose for ``output`` under ``constraint`` (runtime.grammar.Constraint or None).

        ``closes`` False: a cut answer stays cut (no closure; the node's deadline_closure).
        """
        self.output, self.constraint, self.closes = output, constraint, closes
        self.rng = np.random.default_rng(output.seed or None)
        self._tail = ''  # the answer's last characters, for stop strings
        self._tail_keep = max((len(s) for s in output.stop), default=0) + 16
        self.text = ''  # the whole answer (the validity check reads it)
        self.closed_with: list = []  # the closure's tokens, when the deadline closed it

    def choose(self, logits) -> int:
        """Return the next token from a logits row."""
        row = _as_numpy(logits)
        if self.constraint is not None:
            row = self.constraint.mask(row)
        if not self.output.sampled:
            return int(np.argmax(row))
        scaled = (row - row.max()) / self.output.temperature
        probs = np.exp(scaled)
        probs /= probs.sum()
        if self.output.top_p < 1.0:
            order = np.argsort(-probs, kind='stable')
            kept = np.cumsum(probs[order]) - probs[order] < self.output.top_p
            mask = np.zeros_like(probs, dtype=bool)
            mask[order[kept]] = True
            probs = np.where(mask, probs, 0.0)
            probs /= probs.sum()
        return int(self.rng.choice(len(probs), p=probs))

    def accept(self, token: int, text_delta: str) -> bool:
        """Take a streamed token and its text; return False when a stop string ends here."""
        if self.constraint is not None:
            self.constraint.accept(token)
        self.text += text_delta
        if not self.output.stop:
            return True
        self._tail = (self._tail + text_delta)[-self._tail_keep:]
        return not any(stop in self._tail for stop in self.output.stop)

    @property
    def closable(self) -> bool:
        """Tell whether a deadline closure applies (a structure not yet complete)."""
        return self.closes and self.constraint is not None and not self.constraint.complete

    def closure(self) -> list | None:
        """Return the tokens that complete the structure now (None: none found)."""
        if self.constraint is None:
            return None
        return self.constraint.closure()

    def valid(self) -> bool:
        """Tell whether the answer conforms: its grammar is complete, its JSON validates.

        Free text is valid as it stands. A schema answer is also checked with jsonschema,
        independently of the grammar that produced it.
        """
        if self.constraint is None:
            return True
        if not self.constraint.complete:
            return False
        if not self.output.json_schema:
            return True
        import jsonschema
        try:
            jsonschema.validate(json.loads(self.text), json.loads(self.output.json_schema))
        except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
            return False
        return True


def _as_numpy(logits) -> np.ndarray:
    """Return a float32 numpy row from a torch tensor or a numpy array."""
    if hasattr(logits, 'detach'):
        return logits.detach().float().cpu().numpy().reshape(-1)
    return np.asarray(logits, dtype=np.float32).reshape(-1)
