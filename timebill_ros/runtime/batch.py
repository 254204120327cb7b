"""Decode several prefilled sequences together: one greedy token each per step.

Sequences join at token boundaries with their own KV cache (prefilled alone, so a
kvpress press may have evicted a different share of each prompt) and leave when
they finish, are killed or canceled. Caches of different lengths are left-padded
and the padding is masked; every sequence keeps its true RoPE positions, so its
tokens are those of its solo greedy run (up to float rounding in batched kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

from timebill_ros.runtime.model import match_cache


@dataclass
class _Member:
    key: str
    next_id: int
    position: int


class BatchDecoder:
    """Hold a batch of sequences and step them together (callers serialise access)."""

    def __init__(self, model, device: str = 'cpu'):
        """Decode with ``model`` (a causal LM taking past_key_values)."""
        self.model, self.device = model, device
        self._members: list = []
        self._cache = None
        self._mask = None  # (batch, cached tokens): 1 real, 0 left padding

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

    def join(self, key: str, cache, next_id: int, position: int) -> None:
        """Add a sequence: its batch-1 DynamicCache, the token to feed next and its position."""
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
        self._members.append(_Member(key, int(next_id), int(position)))

    def take(self, key: str) -> tuple:
        """Remove a sequence and return (its batch-1 DynamicCache, next token, position).

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
        return cache, member.next_id, member.position

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
        self._cache = DynamicCache(ddp_cache_data=[
            (layer.keys.index_select(0, keep)[:, :, start:],
             layer.values.index_select(0, keep)[:, :, start:]) for layer in self._cache.layers])

    def step(self) -> dict:
        """Feed every sequence its next token; return {key: the token after it}."""
        import torch
        ids = torch.tensor([[m.next_id] for m in self._members], device=self.device)
        positions = torch.tensor([[m.position] for m in self._members], device=self.device)
        mask = torch.cat([self._mask, torch.ones((len(self._members), 1), dtype=torch.long,
                                                 device=self.device)], dim=1)
        with torch.inference_mode():
            out = self.model(input_ids=ids, past_key_values=self._cache, attention_mask=mask,
                             position_ids=positions, use_cache=True)
        self._mask = mask
        chosen = out.logits[:, -1].argmax(dim=-1).tolist()
        for member, token in zip(self._members, chosen):
            member.next_id, member.position = int(token), member.position + 1
        return {member.key: member.next_id for member in self._members}


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
