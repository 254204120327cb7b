# SPDX-License-Identifier: Apache-2.0
"""Per-layer mixed precision at run time: a model shell whose layers point at either copy.

The float32 model and its int8 copy stay resident; a ``MixedModel`` is a shallow shell
of the float32 model whose decoder layers and LM head are references, each to the
float32 or the int8 module. ``apply(lowered)`` swaps references (no re-quantisation),
so a goal's mix costs microseconds, and the shell with nothing lowered computes exactly
what the float32 model does (all lowered: exactly what the int8 copy does).
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Sequence

from timebill_ros.core.precision import fit_unit_times, UnitTimes
from timebill_ros.runtime.model import intra_op_threads, LoadedModel


def _shallow(module):
    """Return a copy of ``module`` sharing its parameters but with its own child table."""
    clone = copy.copy(module)
    clone._modules = type(module._modules)(module._modules)
    return clone


class MixedModel:
    """A shell over a float32 Llama-style model and its low-precision copy."""

    def __init__(self, full: LoadedModel, low: LoadedModel):
        """Build the shell; ValueError unless both models have the same layers and head."""
        import torch
        inner_full, inner_low = _inner(full.model), _inner(low.model)
        if len(inner_full.layers) != len(inner_low.layers):
            raise ValueError('the two precisions have different layer counts')
        self.full, self.low, self.low_dtype = full, low, low.dtype
        self._full_units = [*inner_full.layers, full.model.lm_head]
        self._low_units = [*inner_low.layers, low.model.lm_head]
        self.model = _shallow(full.model)
        inner = _shallow(inner_full)
        inner._modules['layers'] = torch.nn.ModuleList(list(inner_full.layers))
        self.model._modules['model'] = inner
        self._layers = inner.layers
        self.lowered: tuple = ()

    @property
    def units(self) -> int:
        """Return the number of units: decoder layers, then the LM head."""
        return len(self._full_units)

    def apply(self, lowered: Sequence[int]):
        """Point each unit at its precision (``lowered`` at the low one); return the model."""
        lowered = tuple(sorted(set(int(u) for u in lowered)))
        if lowered and not 0 <= lowered[0] <= lowered[-1] < self.units:
            raise ValueError(f'units {lowered} outside 0..{self.units - 1}')
        if lowered != self.lowered:
            low = set(lowered)
            head = self.units - 1
            for u in range(head):
                self._layers[u] = self._low_units[u] if u in low else self._full_units[u]
            self.model._modules['lm_head'] = \
                self._low_units[head] if head in low else self._full_units[head]
            self.lowered = lowered
        return self.model


def _inner(model):
    if not hasattr(model, 'model') or not hasattr(model.model, 'layers') or \
            not hasattr(model, 'lm_head'):
        raise ValueError('per-layer precision needs a Llama-style model '
                         '(model.model.layers, lm_head)')
    return model.model


def unit_times(loaded: LoadedModel, kv_lengths: Sequence[int] = (64, 1024), steps: int = 6,
               threads: int = 0) -> UnitTimes:
    """Profile each layer's and the head's decode-step time at ``kv_lengths``; fit them."""
    from timebill_ros.runtime.early_exit import measure_layer_times
    from timebill_ros.runtime.profiler import time_decode_steps
    per_unit, whole = [], []
    with intra_op_threads(threads):
        for n in kv_lengths:
            times = measure_layer_times(loaded, n_kv=n, steps=steps)
            per_unit.append([*times.layers, times.head_s])
            step, _ = time_decode_steps(loaded, (n,), steps, 1)[n]
            whole.append(step)
    return fit_unit_times(kv_lengths, per_unit, whole)


def next_token_kl(model, reference_logp, ids_list: Sequence) -> float:
    """Return the mean KL(reference || model) of the next-token distribution over prompts.

    ``reference_logp[i]`` is the float32 log-distribution after ``ids_list[i]``'s last
    token and its first ``follow`` greedy tokens (a (positions, vocab) tensor).
    """
    import torch
    total, count = 0.0, 0
    with torch.inference_mode():
        for ids, ref in zip(ids_list, reference_logp):
            logp = torch.log_softmax(model(input_ids=ids).logits[0, -ref.shape[0]:].float(), -1)
            total += float((ref.exp() * (ref - logp)).sum(-1).sum())
            count += ref.shape[0]
    return total / max(1, count)


def reference_logp(model, prompts: Sequence, follow: int = 4) -> tuple:
    """Extend each prompt by ``follow`` greedy tokens; return (ids, float32 log-probs).

    The KL is read at the prompt's last position and the next ``follow`` ones, so it
    covers the first answer tokens, not only the one the prompt ends on.
    """
    import torch
    ids_list, refs = [], []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.device)
            for _ in range(follow):
                nxt = model(input_ids=ids).logits[0, -1].argmax().view(1, 1)
                ids = torch.cat([ids, nxt], dim=1)
            logits = model(input_ids=ids).logits[0, -(follow + 1):].float()
            ids_list.append(ids)
            refs.append(torch.log_softmax(logits, -1))
    return ids_list, refs


def measure_unit_kl(mixed: MixedModel, prompts: Sequence, follow: int = 4,
                    progress=None) -> dict:
    """Measure KL(float32 || mix) with each unit alone lowered, and with all lowered."""
    ids_list, refs = reference_logp(mixed.apply(()), prompts, follow)
    per_unit = []
    for u in range(mixed.units):
        per_unit.append(next_token_kl(mixed.apply((u,)), refs, ids_list))
        if progress:
            progress(u)
    every = next_token_kl(mixed.apply(range(mixed.units)), refs, ids_list)
    mixed.apply(())
    return {'unit_kl': per_unit, 'all_low_kl': every}


def time_apply(mixed: MixedModel, mixes: Sequence[Sequence[int]]) -> float:
    """Return the median seconds of switching between ``mixes`` (reference swaps)."""
    samples = []
    for mix in mixes:
        t0 = time.perf_counter()
        mixed.apply(mix)
        samples.append(time.perf_counter() - t0)
    mixed.apply(())
    return statistics.median(samples)
