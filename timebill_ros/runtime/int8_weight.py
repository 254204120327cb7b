# SPDX-License-Identifier: Apache-2.0
"""Weight-only int8 linear layers: int8 weights, float32 activations.

The weights are rounded once, symmetrically per output channel (the largest |w| of a row
maps to 127). The product runs in torch's packed int8 kernel
(``aten._weight_int8pack_mm``: bfloat16 input, int8 weights, per-row scales), the kernel
gpt-fast uses for weight-only int8 on a CPU. torchao's ``Int8WeightOnlyConfig`` (0.18)
is the library route, but on a CPU in eager mode it dequantises the weights on every
call and ran 2.3x slower than float32 (results/weight_formats), so this module calls the
kernel directly. Only the matmul's input is rounded to bfloat16: what enters and leaves
the layer is float32, so these layers mix with float32 ones and share their KV cache.
"""

from __future__ import annotations

import torch


class Int8WeightLinear(torch.nn.Module):
    """An nn.Linear computed from int8 weights with one scale per output channel."""

    def __init__(self, linear: torch.nn.Linear):
        """Quantise ``linear``'s weights (it is left untouched)."""
        super().__init__()
        weight = linear.weight.detach().float()
        # The kernel takes bfloat16 scales. Rounding to bfloat16 moves a value by up to
        # 2 ** -8 of it, so a 2 ** -7 bump keeps each scale above its float32 value; the
        # weights are quantised against the rounded scale, so each lies within half an
        # int8 step of its float32 value and none needs clamping.
        amax = weight.abs().amax(dim=1).clamp(min=1e-12)
        scale = (amax / 127.0 * (1.0 + 2.0 ** -7)).to(torch.bfloat16)
        q = torch.round(weight / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer('weight_int8', q.contiguous())
        self.register_buffer('scale', scale)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer('bias', bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x @ W.T + b`` in ``x``'s dtype."""
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scale)
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def dequantised(self) -> torch.Tensor:
        """Return the float32 weights the int8 ones stand for (for tests and reports)."""
        return self.weight_int8.float() * self.scale.float()[:, None]

    def extra_repr(self) -> str:
        """Describe the layer as nn.Linear does."""
        return (f'in_features={self.in_features}, out_features={self.out_features}, '
                f'bias={self.bias is not None}, weights=int8')
