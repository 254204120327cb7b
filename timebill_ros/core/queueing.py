"""Order of goals waiting for the model (FIFO; later schedulers plug in here)."""

from __future__ import annotations

from collections import deque
from typing import Generic, Iterator, TypeVar

T = TypeVar('T')


class QueueFull(Exception):
    """The waiting queue has no room."""


class FifoQueue(Generic[T]):
    """Bounded first-in first-out queue of waiting jobs (not thread-safe by itself)."""

    def __init__(self, capacity: int):
        """Create an empty queue holding at most ``capacity`` jobs."""
        if capacity < 1:
            raise ValueError(f'queue capacity must be >= 1 (got {capacity})')
        self.capacity = capacity
        self._items: deque = deque()

    def push(self, item: T) -> None:
        """Append a job; raise QueueFull when there is no room."""
        if len(self._items) >= self.capacity:
            raise QueueFull(f'queue full ({self.capacity} goals waiting)')
        self._items.append(item)

    def pop(self) -> T | None:
        """Remove and return the next job, or None when empty."""
        return self._items.popleft() if self._items else None

    def remove(self, item: T) -> bool:
        """Remove a specific job (for cancel); return whether it was queued."""
        try:
            self._items.remove(item)
        except ValueError:
            return False
        return True

    def __len__(self) -> int:
        """Count waiting jobs."""
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        """Iterate in dispatch order."""
        return iter(list(self._items))
