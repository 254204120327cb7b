# SPDX-License-Identifier: Apache-2.0
"""A prefix KV cache across goals: blocks of prompt tokens whose keys and values are kept.

Robots send the same system prompt, scene, map or log context with a new question each
time. Like vLLM's automatic prefix caching, a prompt is cut into blocks of
``block_tokens``; each block is stored under its own tokens and its parent's key (so a
block is found only behind the very same prefix) and holds that block's keys and values
for every layer, taken before any eviction press ran. A new prompt reuses the longest
run of stored blocks from its start and prefills only the rest. Memory is bounded by
``max_bytes``: the least recently used blocks go first, a prefix's earlier blocks after
its later ones (a hit touches the chain from its end back to its start).
"""

from __future__ import annotations

from collections import OrderedDict
import threading
from typing import Sequence


class PrefixCache:
    """Blocks of one model's prompt KV (one cache per model and precision)."""

    def __init__(self, block_tokens: int, max_bytes: int):
        """Keep blocks of ``block_tokens`` tokens, at most ``max_bytes`` of tensors in all."""
        if block_tokens < 1 or max_bytes < 0:
            raise ValueError('need block_tokens >= 1 and max_bytes >= 0')
        self.block_tokens, self.max_bytes = block_tokens, max_bytes
        self._blocks: OrderedDict = OrderedDict()  # key -> [(keys, values) per layer]
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = 0  # lookups that reused at least one block, and not

    def _keys(self, ids: Sequence[int], blocks: int) -> list:
        """Return the keys of the first ``blocks`` blocks of ``ids`` (each names its prefix)."""
        keys, parent, size = [], None, self.block_tokens
        for i in range(blocks):
            parent = (parent, tuple(ids[i * size:(i + 1) * size]))
            keys.append(parent)
        return keys

    def match(self, ids: Sequence[int], limit: int) -> int:
        """Return how many of the first ``limit`` tokens of ``ids`` are stored (whole blocks)."""
        found = 0
        with self._lock:
            for key in self._keys(ids, max(0, limit) // self.block_tokens):
                if key not in self._blocks:
                    break
                found += 1
        return found * self.block_tokens

    def take(self, ids: Sequence[int], limit: int) -> tuple:
        """Return (tokens reused, per-layer (keys, values) of them or None), up to ``limit``.

        The tensors are new (concatenated), so the goal may append to and evict from them.
        """
        import torch
        with self._lock:
            chain = []
            for key in self._keys(ids, max(0, limit) // self.block_tokens):
                if key not in self._blocks:
                    break
                chain.append(key)
            if not chain:
                self.misses += 1
                return 0, None
            self.hits += 1
            for key in reversed(chain):  # the prefix's start ends up the most recent
                self._blocks.move_to_end(key)
            blocks = [self._blocks[key] for key in chain]
        layers = [(torch.cat([block[i][0] for block in blocks], dim=-2),
                   torch.cat([block[i][1] for block in blocks], dim=-2))
                  for i in range(len(blocks[0]))]
        return len(chain) * self.block_tokens, layers

    def store(self, ids: Sequence[int], layers: Sequence[tuple], upto: int) -> int:
        """Store the whole blocks of ``ids[:upto]`` from per-layer (keys, values); return new.

        ``layers`` hold at least ``upto`` positions of this very prompt, uncompressed.
        """
        if self.max_bytes <= 0:
            return 0
        size, added = self.block_tokens, 0
        chain = self._keys(ids, upto // size)
        for index, key in enumerate(chain):
            with self._lock:
                if key in self._blocks:
                    continue
            part = slice(index * size, (index + 1) * size)
            block = [(k[..., part, :].clone(), v[..., part, :].clone()) for k, v in layers]
            with self._lock:
                self._blocks[key] = block
                self.bytes += _size(block)
                added += 1
        with self._lock:
            for key in reversed(chain):  # the prefix's start ends up the most recent
                if key in self._blocks:
                    self._blocks.move_to_end(key)
            while self.bytes > self.max_bytes and self._blocks:
                self.bytes -= _size(self._blocks.popitem(last=False)[1])
        return added

    def __len__(self) -> int:
        """Count the stored blocks."""
        return len(self._blocks)


def _size(block: list) -> int:
    """Return the bytes of a block's keys and values."""
    return sum(k.nelement() * k.element_size() + v.nelement() * v.element_size()
               for k, v in block)
