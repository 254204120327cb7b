# SPDX-License-Identifier: Apache-2.0
"""A kvpress wrapper press whose inner press is chosen while prefill is running.

kvpress compresses each layer's KV cache in a forward hook right after that
layer's attention. When the eviction ratio is only known part-way through the
prefill (the length predictor reads a hidden state the prefill has just
computed), the layers before that point have already run. Their hook
arguments are kept and the chosen press is applied to them as soon as it is
known; layers after it are compressed as usual. During a prefill no layer
reads another layer's cache, so the cache ends up as if the press had been on
from the start (tested against a plain press). Like kvpress's own wrappers
(AdaKVPress, ChunkPress) it delegates to an inner press.

A chunked prefill compresses in the pass of its last chunk only (``LastChunkPress``):
the cache then holds the whole prompt, and the last chunk's queries are the prompt's
last ones, which is what SnapKV scores with. kvpress's own hook compresses only a pass
that starts at position 0, so it would skip that pass and compress the first chunk alone.

Importing this module imports kvpress (slow, about a second); import it lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
import time

from kvpress.presses.base_press import BasePress, is_prefilling
from kvpress.utils import extract_keys_and_values


@dataclass
class DeferredPress(BasePress):
    """Hold layers back until ``decide`` names the press (None: evict nothing)."""

    press: BasePress | None = None
    every_pass: bool = False  # hold layers in any pass (the last chunk of a chunked prefill)

    def __post_init__(self):
        """Start undecided, with no layer held back."""
        self._decided = False
        self._held: list = []
        self._model = None
        self.deferred_layers = 0  # how many layers were compressed after the fact

    @property
    def decided(self) -> bool:
        """Say whether the press has been chosen."""
        return self._decided

    def post_init_from_model(self, model) -> None:
        """Remember the model: the inner press is initialised from it once chosen."""
        self._model = model

    def decide(self, press: BasePress | None) -> None:
        """Choose the press and apply it to the layers that ran before the choice."""
        if self._decided:
            raise RuntimeError('the press was already chosen for this prefill')
        self.press, self._decided = press, True
        held, self._held = self._held, []
        if press is None:
            return
        if self._model is not None:
            press.post_init_from_model(self._model)
        for module, inputs, kwargs, output in held:
            press.forward_hook(module, inputs, kwargs, output)
        self.deferred_layers = len(held)

    def forward_hook(self, module, input, kwargs: dict, output):
        """Compress now when decided; otherwise keep what the press will need."""
        if self._decided:
            return output if self.press is None else \
                self.press.forward_hook(module, input, kwargs, output)
        if self.every_pass or \
                is_prefilling(kwargs['cache_position'], kwargs['hidden_states'].shape[1]):
            self._held.append((module, input, kwargs, output))
        return output


@dataclass
class LastChunkPress(BasePress):
    """Compress the whole cache with ``press`` in the pass of a chunked prefill's last chunk.

    Use it around that pass only. The cache layers are written as kvpress's own hook
    writes them (a DynamicCache: keys and values replaced).
    """

    press: BasePress | None = None
    spent_s: float = 0.0  # in this hook over the layers (what Kill must expect next time)

    def post_init_from_model(self, model) -> None:
        """Initialise the inner press."""
        self.press.post_init_from_model(model)

    def forward_hook(self, module, input, kwargs: dict, output):
        """Score and compress every cached position of this layer with the inner press."""
        began = time.perf_counter()
        cache = kwargs['past_key_values']
        keys, values = extract_keys_and_values(cache, module.layer_idx)
        keys, values = self.press.compress(module, kwargs['hidden_states'], keys, values,
                                           output[1], kwargs)
        layer = cache.layers[module.layer_idx]
        layer.keys, layer.values = keys, values
        self.spent_s += time.perf_counter() - began
        return output
