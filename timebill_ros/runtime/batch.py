# SPDX-License-Identifier: Apache-2.0
"""Decode lanes: sequences that step together, one token each per step.

A lane is what the serving loop (serving/loop.py) steps: it is fed each member's
next token and returns what the model says after it (logits, or a committed token
when the lane decides itself, as early exit does). ``BatchDecoder`` steps a batch on
one model: sequences join at token boundaries with their own KV cache (prefilled
alone, so a kvpress press may have evicted a different share of each prompt) and
leave when they finish, are killed or canceled. Caches of different lengths are
left-padded and the padding is masked; every sequence keeps its true RoPE positions,
so its tokens are those of its solo greedy run (up to float rounding in batched
kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

from timebill_ros.runtime.model import match_cache


@dataclass(frozen=True)
class LaneStep:
    """What one step gave a member: its logits row, or a token the lane committed."""

    logits: object = None
    token: int | None = None
    kind: str = ''  # early exit: 'full', 'threshold' or 'forced'


class KeyedLane:
    """Bookkeeping of a lane that holds each sequence as [cache, next position] by key."""

    def __init__(self):
        """Start with no sequences."""
        self._members: dict = {}  # key -> [cache, next position]

    def __len__(self) -> int:
        """Count the sequences."""
        return len(self._members)

    @property
    def keys(self) -> list:
        """Return the keys of the sequences."""
        return list(self._members)

    def join(self, key: str, cache, position: int) -> None:
        """Add a sequence: its prefilled cache and the position of its next token."""
        self._members[key] = [cache, int(position)]

    def take(self, key: str) -> tuple:
        """Remove a sequence and return (its cache, next position)."""
        cache, position = self._members.pop(key)
        return cache, position

    def leave(self, key: str) -> None:
        """Remove a sequence."""
        del self._members[key]

    def discard(self, cache) -> None:
        """Drop a cache that never joined (a torch cache is freed with its last reference)."""


@dataclass
class _Member:
    key: str
    position: int


class BatchDecoder:
    """Hold a batch of sequences and step them together (callers serialise access)."""

    exclusive = False  # steps in the same round as other lanes

    def __init__(self, model, device: str = 'cpu', before_step=None):
        """Decode with ``model`` (a causal LM taking past_key_values).

        ``before_step`` runs before each step (a mixed-precision lane sets the shared
        shell's layers to its own mix).
        """
        self.model, self.device, self.before_step = model, device, before_step
        self._members: list = []
        self._cache = None
        self._mask = None  # (batch, cached tokens): 1 real, 0 left padding
        self._padded = False  # any left padding: only then is a mask passed

    def __len__(self) -> int:
        """Count sequences in the batch."""
        return len(self._members)

    @property
    def keys(self) -> list:
        """Return the keys of the sequences, in batch order."""
        return [member.key for member in self._members]

    def cached_tokens(self) -> int:
        """Return the batch's KV length (the longest sequence's, with padding)."""
        return 0 if self._mask is None else int(self._mask.shape[1])

    def join(self, key: str, cache, position: int) -> None:
        """Add a sequence: its batch-1 DynamicCache and the position of its next token."""
        import torch
        from transformers import DynamicCache
        layers = [(layer.keys, layer.values) for layer in match_cache(cache, self.model).layers]
        length = layers[0][0].shape[2]
        mask = torch.ones((1, length), dtype=torch.long, device=self.device)
        if self._cache is None:
            merged, self._mask = layers, mask
        else:
            total = max(length, self._mask.shape[1])
            old = [(layer.keys, layer.values) for layer in self._cache.layers]
            merged = [(torch.cat([_pad(ko, total), _pad(kn, total)]),
                       torch.cat([_pad(vo, total), _pad(vn, total)]))
                      for (ko, vo), (kn, vn) in zip(old, layers)]
            self._mask = torch.cat([_pad_mask(self._mask, total), _pad_mask(mask, total)])
        self._cache = DynamicCache(ddp_cache_data=merged)
        self._padded = bool((self._mask == 0).any())
        self._members.append(_Member(key, int(position)))

    def take(self, key: str) -> tuple:
        """Remove a sequence and return (its batch-1 DynamicCache, next position).

        The cache holds only the sequence's own positions (its left padding dropped), so
        it can join another batch (a goal switching precision mid-answer).
        """
        from transformers import DynamicCache
        index = self.keys.index(key)
        member = self._members[index]
        start = int(self._mask[index].long().argmax())  # first real column of a left-padded row
        cache = DynamicCache(ddp_cache_data=[
            (layer.keys[index:index + 1, :, start:].clone(),
             layer.values[index:index + 1, :, start:].clone()) for layer in self._cache.layers])
        self.leave(key)
        return cache, member.position

    def discard(self, cache) -> None:
        """Drop a cache that never joined (a torch cache is freed with its last reference)."""

    def leave(self, key: str) -> None:
        """Remove a sequence (finished, killed or canceled); drop padding nobody needs."""
        import torch
        from transformers import DynamicCache
        index = self.keys.index(key)
        del self._members[index]
        if not self._members:
            self._cache = self._mask = None
            return
        keep = torch.tensor([i for i in range(self._mask.shape[0]) if i != index],
                            device=self.device)
        mask = self._mask.index_select(0, keep)
        start = int(mask.any(dim=0).long().argmax())  # first column someone still uses
        self._mask = mask[:, start:]
        self._padded = bool((self._mask == 0).any())
        self._cache = DynamicCache(ddp_cache_data=[
            (layer.keys.index_select(0, keep)[:, :, start:],
             layer.values.index_select(0, keep)[:, :, start:]) for layer in self._cache.layers])

    def step(self, feed: dict, budgets: dict | None = None) -> dict:
        """Feed each sequence its token (``feed``: key -> id); return key -> LaneStep."""
        import torch
        if self.before_step is not None:
            self.before_step()
        members = self._members
        ids = torch.tensor([[feed[m.key]] for m in members], device=self.device)
        positions = torch.tensor([[m.position] for m in members], device=self.device)
        mask = torch.cat([self._mask, torch.ones((len(members), 1), dtype=torch.long,
                                                 device=self.device)], dim=1)
        with torch.inference_mode():
            # Unpadded (always so alone): no mask, the kernels' causal fast path.
            out = self.model(input_ids=ids, past_key_values=self._cache,
                             attention_mask=mask if self._padded else None,
                             position_ids=positions, use_cache=True)
        self._mask = mask
        logits = out.logits[:, -1]
        for member in members:
            member.position += 1
        return {member.key: LaneStep(logits[index]) for index, member in enumerate(members)}


def _pad(tensor, total: int):
    """Left-pad a (batch, heads, length, dim) tensor with zeros to ``total`` positions."""
    import torch
    missing = total - tensor.shape[2]
    if missing <= 0:
        return tensor
    shape = (tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([tensor.new_zeros(shape), tensor], dim=2)


def _pad_mask(mask, total: int):
    """Left-pad a (batch, length) mask with zeros to ``total`` columns."""
    import torch
    missing = total - mask.shape[1]
    if missing <= 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)
