# SPDX-License-Identifier: Apache-2.0
"""Schedulers: dispatch order, capacity, cancel, and a brute-force check on random cases."""

import random

import pytest

from timebill_ros.core.scheduling import (
    make_scheduler, OneBitSvfScheduler, QueueFull, volume, Waiting)


def drain(scheduler):
    out = []
    while len(scheduler):
        out.append(scheduler.pop())
    return out


def test_each_scheduler_orders_by_its_rule():
    jobs = {'a': Waiting(3.0, 100, 50), 'b': Waiting(1.0, 1000, 10), 'c': Waiting(2.0, 10, 5)}
    expected = {'fifo': 'abc', 'edf': 'bca', 'svf': 'cab'}
    for name, order in expected.items():
        s = make_scheduler(name, 10)
        for key, info in jobs.items():
            s.push(key, info)
        assert ''.join(s) == order and ''.join(drain(s)) == order
        assert s.pop() is None


def test_volume_is_the_memory_time_area():
    assert volume(10, 4) == 10 * 4 + (16 + 4) / 2
    # A long prompt with a one-word answer is smaller than a short prompt that rambles.
    assert volume(500, 2) < volume(20, 120)


def test_one_bit_svf_only_tells_short_from_long():
    s = OneBitSvfScheduler(10, threshold=32, short=16, long=128)
    s.push('long-short-prompt', Waiting(1.0, 10, 100))
    s.push('short-a', Waiting(2.0, 50, 3))
    s.push('short-b', Waiting(3.0, 50, 30))  # same class and prompt as short-a: arrival order
    assert list(s) == ['short-a', 'short-b', 'long-short-prompt']


def test_capacity_and_cancel():
    s = make_scheduler('edf', 2)
    s.push('x', Waiting(1.0))
    s.push('y', Waiting(0.5))
    with pytest.raises(QueueFull):
        s.push('z', Waiting(0.1))
    assert s.remove('x') and not s.remove('x') and list(s) == ['y']
    with pytest.raises(ValueError, match='unknown scheduler'):
        make_scheduler('lifo', 2)
    with pytest.raises(ValueError):
        make_scheduler('fifo', 0)


def test_order_matches_a_brute_force_sort_on_random_cases():
    rng = random.Random(3)
    for _ in range(200):
        infos = [Waiting(rng.choice([1.0, 2.0, 3.0]), rng.randint(1, 50), rng.randint(1, 50))
                 for _ in range(rng.randint(1, 8))]
        for name, key in (('fifo', lambda i: i), ('edf', lambda i: (infos[i].deadline, i)),
                          ('svf', lambda i: (volume(infos[i].prompt_tokens,
                                                    infos[i].predicted_tokens), i))):
            s = make_scheduler(name, 8)
            for index, info in enumerate(infos):
                s.push(index, info)
            assert drain(s) == sorted(range(len(infos)), key=key)


def test_ahead_and_behind_a_newcomer():
    s = make_scheduler('edf', 8)
    for key, deadline in (('a', 1.0), ('b', 3.0), ('c', 2.0)):
        s.push(key, Waiting(deadline))
    assert s.ahead(Waiting(2.0)) == (['a', 'c'], ['b'])  # a tie waits behind
    fifo = make_scheduler('fifo', 8)
    fifo.push('a', Waiting(9.0))
    assert fifo.ahead(Waiting(0.0)) == (['a'], [])  # FIFO never lets a newcomer overtake


def test_slot_starts_is_the_sequential_queue_on_one_slot():
    from timebill_ros.core.scheduling import slot_starts
    assert slot_starts([2.0], 1, [1.0, 3.0, 0.5]) == [2.0, 3.0, 6.0]
    assert slot_starts([], 1, [1.0, 1.0]) == [0.0, 1.0]


def test_slot_starts_matches_a_brute_force_simulation_of_parallel_slots():
    from timebill_ros.core.scheduling import slot_starts
    rng = random.Random(5)
    for _ in range(200):
        slots = rng.randint(1, 4)
        busy = [rng.uniform(0, 5) for _ in range(rng.randint(0, slots))]
        durations = [rng.uniform(0.1, 3) for _ in range(rng.randint(0, 6))]
        # Reference: scan every slot for the one that frees first (no heap).
        free = busy + [0.0] * (slots - len(busy))
        expected = []
        for d in durations:
            i = min(range(slots), key=lambda k: free[k])
            expected.append(free[i])
            free[i] += d
        assert slot_starts(busy, slots, durations) == pytest.approx(expected)
    with pytest.raises(ValueError):
        slot_starts([1.0, 2.0], 1, [])
