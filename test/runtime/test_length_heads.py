# SPDX-License-Identifier: Apache-2.0
"""Length heads learn a synthetic task and survive a save/load round trip."""

import numpy as np
import pytest

pytest.importorskip('torch')

from timebill_ros.core.length import metrics  # noqa: E402
from timebill_ros.runtime.length_heads import LinearHead, train_head  # noqa: E402


def synthetic(n=600, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    lengths = np.clip(120 + 60 * x[:, 0] - 30 * x[:, 1] + rng.normal(0, 5, n), 0, 256)
    return x, lengths.astype(int)


@pytest.mark.parametrize('bucket_size', [0, 16])
def test_head_converges_and_generalises(bucket_size, tmp_path):
    x, y = synthetic()
    head = train_head(x[:500], y[:500], bucket_size, 256)
    m = metrics(head.predict(x[500:]), y[500:])
    baseline = metrics(np.full(100, y[:500].mean()), y[500:])
    assert m['r2'] > 0.8 and m['mae'] < baseline['mae'] / 3
    head.save(tmp_path / 'h.npz')
    again = LinearHead.load(tmp_path / 'h.npz')
    assert np.array_equal(again.predict(x[500:]), head.predict(x[500:]))
    if bucket_size:
        assert set(np.unique(head.predict(x)) % 16) <= {0}  # whole buckets
