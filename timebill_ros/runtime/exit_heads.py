# SPDX-License-Identifier: Apache-2.0
"""Trained exit heads: a linear map from layer l's hidden state to the final (normed) state.

The logit lens (final norm + LM head on an intermediate state) agrees poorly with the
full model on SmolLM2-135M below its last layers. An exit head here is a ridge
regression (numpy) from the layer-l state to the model's final normed hidden state,
fitted on the model's own greedy generations; the exit's logits are then the LM head
applied to the mapped state. Distilling the final *state* rather than the final
distribution keeps the fit closed-form and cheap on a CPU (a KL fit through the
49k-token head costs minutes per layer here); the agreement it buys is measured in
``bench_early_exit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHIPPED_EXIT_HEADS = Path(__file__).resolve().parent.parent / 'data' / 'exit_heads.npz'


@dataclass
class ExitHeads:
    """Per-layer affine maps (1-based layer -> (weight d x d, bias d)) for one model."""

    target: str
    maps: dict

    def apply(self, layer: int, hidden):
        """Map a torch hidden state of ``layer`` into the final normed state space."""
        import torch
        weight, bias = self.maps[layer]
        if not isinstance(weight, torch.Tensor):
            weight = torch.from_numpy(weight)
            bias = torch.from_numpy(bias)
            self.maps[layer] = (weight, bias)
        return hidden @ weight.to(hidden.dtype) + bias.to(hidden.dtype)

    def save(self, path: Path) -> None:
        """Write the maps as an .npz (float16)."""
        arrays = {'target': np.array(self.target)}
        for layer, (w, b) in self.maps.items():
            # float16 halves the shipped file; the maps are applied in float32.
            arrays[f'w{layer}'] = np.asarray(w, dtype=np.float16)
            arrays[f'b{layer}'] = np.asarray(b, dtype=np.float16)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **arrays)

    @classmethod
    def load(cls, path: Path) -> 'ExitHeads':
        """Read maps written by ``save``; raise ValueError if the file is not one."""
        with np.load(path) as data:
            if 'target' not in data:
                raise ValueError(f'{path} is not an exit-heads file')
            layers = sorted(int(k[1:]) for k in data.files if k.startswith('w'))
            maps = {layer: (data[f'w{layer}'].astype(np.float32),
                            data[f'b{layer}'].astype(np.float32)) for layer in layers}
            return cls(str(data['target']), maps)


def fit_map(x: np.ndarray, y: np.ndarray, ridge: float = 1e-2) -> tuple:
    """Return (weight, bias) minimising |x w + b - y|^2 + lam * |w - I|^2.

    lam = ridge * trace(x'x) / d (scale-free). Shrinking toward the identity (not
    zero) keeps the map near the plain logit lens where data are scarce.
    """
    if x.ndim != 2 or y.shape != x.shape:
        raise ValueError('x and y must be (samples, hidden) arrays of the same shape')
    n, d = x.shape
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    gram = xc.T @ xc
    lam = ridge * np.trace(gram) / d
    gram = gram + lam * np.eye(d)
    rhs = xc.T @ yc + lam * np.eye(d)
    weight = np.linalg.solve(gram, rhs)
    bias = my - mx @ weight
    return weight.astype(np.float32), bias.astype(np.float32)
