# SPDX-License-Identifier: Apache-2.0
"""Which waiting goal gets the model next: FIFO, EDF, Smallest Volume First (SVF, 1-bit SVF).

A scheduler is a bounded ordered container (not thread-safe by itself): ``push`` a
job with what is known of it (``Waiting``), ``pop`` the next one. SVF follows
../shared/papers/003: a request with prompt s and output o occupies KV memory over
time with volume v = s*o + (o^2 + o)/2; the smallest goes first. Its 1-bit variant
only tells short from long answers and uses one proxy length per class.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass
import heapq
import itertools
from typing import Generic, Iterator, Protocol, Sequence, TypeVar

T = TypeVar('T')


class QueueFull(Exception):
    """The waiting queue has no room."""


@dataclass(frozen=True)
class Waiting:
    """What a scheduler knows of a waiting goal (times on the node's monotonic clock)."""

    deadline: float
    prompt_tokens: int = 0
    predicted_tokens: int = 0


def volume(prompt_tokens: float, output_tokens: float) -> float:
    """Return the memory-time volume s*o + (o^2 + o)/2 of a request (token x steps)."""
    s, o = float(prompt_tokens), float(output_tokens)
    return s * o + (o * o + o) / 2.0


class Scheduler(Protocol[T]):
    """A bounded container of waiting jobs that hands out the next one to run."""

    name: str
    capacity: int

    def push(self, item: T, info: Waiting) -> None:
        """Add a job; raise QueueFull when there is no room."""

    def pop(self) -> T | None:
        """Remove and return the job to run next (None when empty)."""

    def remove(self, item: T) -> bool:
        """Remove a job (cancel); return whether it was waiting."""

    def first(self) -> T | None:
        """Return the job to run next without removing it (None when empty)."""

    def ahead(self, info: Waiting) -> tuple:
        """Return (jobs a new job with ``info`` would wait behind, jobs it would overtake)."""

    def __len__(self) -> int:
        """Count waiting jobs."""

    def __iter__(self) -> Iterator[T]:
        """Iterate in dispatch order."""


class _Ordered(Generic[T]):
    """Keep jobs sorted by ``key(info)``, ties in arrival order."""

    name = ''

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f'queue capacity must be >= 1 (got {capacity})')
        self.capacity = capacity
        self._entries: list = []  # (key, arrival, item), sorted
        self._arrivals = itertools.count()

    def key(self, info: Waiting) -> tuple:
        """Return the sort key of a job (smaller runs first)."""
        raise NotImplementedError

    def push(self, item: T, info: Waiting) -> None:
        """Add a job in order; raise QueueFull when there is no room."""
        if len(self._entries) >= self.capacity:
            raise QueueFull(f'queue full ({self.capacity} goals waiting)')
        insort(self._entries, (self.key(info), next(self._arrivals), item),
               key=lambda entry: entry[:2])

    def ahead(self, info: Waiting) -> tuple:
        """Return (jobs a new job with ``info`` would wait behind, jobs it would overtake)."""
        key = self.key(info)
        before = [entry[2] for entry in self._entries if entry[0] <= key]
        return before, [entry[2] for entry in self._entries if entry[0] > key]

    def pop(self) -> T | None:
        """Remove and return the first job in order, or None when empty."""
        return self._entries.pop(0)[2] if self._entries else None

    def first(self) -> T | None:
        """Return the job to run next without removing it (None when empty)."""
        return self._entries[0][2] if self._entries else None

    def remove(self, item: T) -> bool:
        """Remove a specific job; return whether it was waiting."""
        for index, entry in enumerate(self._entries):
            if entry[2] is item:
                del self._entries[index]
                return True
        return False

    def __len__(self) -> int:
        """Count waiting jobs."""
        return len(self._entries)

    def __iter__(self) -> Iterator[T]:
        """Iterate in dispatch order."""
        return iter([entry[2] for entry in self._entries])


class FifoScheduler(_Ordered[T]):
    """First come, first served."""

    name = 'fifo'

    def key(self, info: Waiting) -> tuple:
        """Return no key: arrival order decides."""
        return ()


class EdfScheduler(_Ordered[T]):
    """Earliest deadline first."""

    name = 'edf'

    def key(self, info: Waiting) -> tuple:
        """Return the absolute deadline."""
        return (info.deadline,)


class SvfScheduler(_Ordered[T]):
    """Smallest (predicted) memory-time volume first."""

    name = 'svf'

    def key(self, info: Waiting) -> tuple:
        """Return the volume with the predicted answer length."""
        return (volume(info.prompt_tokens, max(1, info.predicted_tokens)),)


class OneBitSvfScheduler(_Ordered[T]):
    """SVF from one bit: answers predicted up to ``threshold`` tokens count as ``short``."""

    name = 'svf-1bit'

    def __init__(self, capacity: int, threshold: int = 32, short: int = 16, long: int = 128):
        """Create the queue; ``short``/``long`` are the proxy lengths of the two classes."""
        super().__init__(capacity)
        if not 0 < short <= long:
            raise ValueError(f'need 0 < short <= long (got {short}, {long})')
        self.threshold, self.short, self.long = threshold, short, long

    def key(self, info: Waiting) -> tuple:
        """Return the volume with the class's proxy length."""
        proxy = self.short if info.predicted_tokens <= self.threshold else self.long
        return (volume(info.prompt_tokens, proxy),)


SCHEDULERS = {cls.name: cls for cls in (FifoScheduler, EdfScheduler, SvfScheduler,
                                        OneBitSvfScheduler)}


def make_scheduler(name: str, capacity: int) -> Scheduler:
    """Return the scheduler called ``name`` (ValueError if unknown)."""
    if name not in SCHEDULERS:
        raise ValueError(f'unknown scheduler {name!r} (one of {", ".join(SCHEDULERS)})')
    return SCHEDULERS[name](capacity)


def slot_starts(busy_s: Sequence[float], slots: int, durations: Sequence[float]) -> list:
    """Return when each job, in dispatch order, starts on ``slots`` parallel decoders.

    ``busy_s`` holds how long each running job still needs (at most ``slots`` of them);
    a free slot is taken at once. With one slot this is the plain sequential queue.
    """
    if slots < 1:
        raise ValueError('need at least one slot')
    free = sorted(float(b) for b in busy_s)
    if len(free) > slots:
        raise ValueError(f'{len(free)} running jobs on {slots} slots')
    free = [0.0] * (slots - len(free)) + free
    heapq.heapify(free)
    starts = []
    for duration in durations:
        start = heapq.heappop(free)
        starts.append(start)
        heapq.heappush(free, start + float(duration))
    return starts
