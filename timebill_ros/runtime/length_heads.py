# SPDX-License-Identifier: Apache-2.0
"""Light length-predictor heads trained on fixed features (torch, full-batch L-BFGS)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from timebill_ros.core.length import decode_buckets, LengthDistribution, to_bucket


@dataclass
class LinearHead:
    """A linear classifier over length buckets, or a linear regressor (bucket_size 0)."""

    weight: np.ndarray
    bias: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    bucket_size: int
    n_max: int
    # What the head reads: 'L<layer>-last' / 'L<layer>-mean' (target prefill states) or
    # 'minilm' (sentence encoder); see runtime/predictor.py.
    features: str = ''
    # The model whose answer lengths the head was distilled from.
    target: str = ''
    # How bucket scores become a length (core.length.DECODE_RULES; TimeBill: argmax).
    decode: str = 'argmax'
    # True lengths given a prediction, from held-out data (admission uses it).
    distribution: LengthDistribution | None = None

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Return predicted lengths for rows of features."""
        x = (np.asarray(features, dtype=np.float32) - self.mean) / self.scale
        out = x @ self.weight.T + self.bias
        if self.bucket_size == 0:
            return np.clip(out[:, 0], 0, self.n_max)
        probs = np.exp(out - out.max(axis=1, keepdims=True))
        return decode_buckets(probs, self.bucket_size, self.n_max, self.decode)

    def save(self, path) -> None:
        """Write the head as a small .npz."""
        extra = self.distribution.to_arrays() if self.distribution is not None else {}
        np.savez(path, weight=self.weight, bias=self.bias, mean=self.mean, scale=self.scale,
                 bucket_size=self.bucket_size, n_max=self.n_max, features=self.features,
                 target=self.target, decode=self.decode, **extra)

    @classmethod
    def load(cls, path) -> 'LinearHead':
        """Read a head written by save()."""
        data = np.load(path)
        return cls(data['weight'], data['bias'], data['mean'], data['scale'],
                   int(data['bucket_size']), int(data['n_max']),
                   str(data['features']) if 'features' in data else '',
                   str(data['target']) if 'target' in data else '',
                   str(data['decode']) if 'decode' in data else 'argmax',
                   LengthDistribution.from_arrays(data))


def train_head(features: np.ndarray, lengths: np.ndarray, bucket_size: int, n_max: int,
               l2: float = 1e-2, iterations: int = 200, seed: int = 0) -> LinearHead:
    """Fit a bucket classifier (cross-entropy) or, with bucket_size 0, a regressor (MSE)."""
    import torch
    torch.manual_seed(seed)
    x = np.asarray(features, dtype=np.float32)
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    xt = torch.from_numpy((x - mean) / scale)
    if bucket_size == 0:
        target = torch.tensor(np.asarray(lengths, dtype=np.float32) / n_max)[:, None]
        outputs = 1
    else:
        target = torch.tensor([to_bucket(int(n), bucket_size, n_max) for n in lengths])
        outputs = to_bucket(n_max, bucket_size, n_max) + 1
    linear = torch.nn.Linear(xt.shape[1], outputs)
    optimiser = torch.optim.LBFGS(linear.parameters(), max_iter=iterations,
                                  line_search_fn='strong_wolfe')

    def closure():
        optimiser.zero_grad()
        out = linear(xt)
        loss = (torch.nn.functional.mse_loss(out, target) if bucket_size == 0
                else torch.nn.functional.cross_entropy(out, target))
        loss = loss + l2 * linear.weight.pow(2).sum() / len(xt)
        loss.backward()
        return loss
    optimiser.step(closure)
    weight = linear.weight.detach().numpy()
    bias = linear.bias.detach().numpy()
    if bucket_size == 0:
        weight, bias = weight * n_max, bias * n_max
    return LinearHead(weight, bias, mean, scale, bucket_size, n_max)
