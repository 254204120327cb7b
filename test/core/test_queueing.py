"""FIFO order, capacity and removal."""

import pytest

from timebill_ros.core.queueing import FifoQueue, QueueFull


def test_fifo_capacity_and_remove():
    q = FifoQueue(2)
    q.push('a')
    q.push('b')
    with pytest.raises(QueueFull):
        q.push('c')
    assert q.remove('a') and not q.remove('zz')
    q.push('c')
    assert list(q) == ['b', 'c']
    assert q.pop() == 'b' and q.pop() == 'c' and q.pop() is None
    with pytest.raises(ValueError):
        FifoQueue(0)
