"""Small helpers the benchmark and measurement commands share."""

from __future__ import annotations

import time
from typing import Callable


def stamped_log(started: float | None = None) -> Callable[[str], None]:
    """Return a ``log(message)`` that prints seconds since ``started`` (default: now)."""
    origin = time.monotonic() if started is None else started

    def log(message: str) -> None:
        print(f'[{time.monotonic() - origin:7.1f} s] {message}', flush=True)
    return log
