# SPDX-License-Identifier: Apache-2.0
"""Prefill a prompt a chunk at a time, so the loop can stop it or step other goals between.

A backend's ``begin_prefill`` returns a run: ``advance()`` prefills the next chunk,
``done`` says the prompt is in the cache, ``result()`` returns (cache, first logits,
GenerationStats) and ``abandon()`` frees what a stopped run holds. The decode loop
advances one chunk per round, between the decode steps of the goals already running
(as chunked prefill does in vLLM and SGLang), and asks the goal's rules before each
chunk; ``finish_prefill`` runs one to the end alone (tools, warm-up, calibration).
"""

from __future__ import annotations

from typing import Callable, Protocol

from timebill_ros.core.execution import PrefillInterrupted


class PrefillRun(Protocol):
    """One prompt being prefilled chunk by chunk."""

    total: int  # prompt tokens
    tokens_done: int  # prompt tokens in the cache so far

    @property
    def chunks_left(self) -> int:
        """Count the chunks still to run."""

    @property
    def next_chunk(self) -> int:
        """Count the prompt tokens the next chunk holds (0 when done)."""

    @property
    def done(self) -> bool:
        """Tell whether the whole prompt is prefilled."""

    @property
    def next_chunk_extra_s(self) -> float:
        """Return what the next chunk adds to a plain pass of its tokens (e.g. a press)."""

    def advance(self) -> None:
        """Prefill the next chunk."""

    def result(self) -> tuple:
        """Return (cache, first answer token's logits, GenerationStats) once done."""

    def abandon(self) -> None:
        """Free what the run holds (it will not be finished)."""


def chunk_bounds(total: int, chunk: int, last_at_least: int = 0) -> list:
    """Return the (begin, end) token ranges of a prompt's chunks.

    ``chunk`` <= 0 or >= ``total``: one pass. The last chunk holds at least
    ``last_at_least`` tokens (a press scores the whole cache with the last chunk's
    queries, so it needs its observation window there), taken from the chunk before.
    """
    if total <= 0:
        raise ValueError('a prompt needs at least one token')
    if chunk <= 0 or chunk >= total:
        return [(0, total)]
    ends = list(range(chunk, total, chunk)) + [total]
    while len(ends) > 1 and total - ends[-2] < last_at_least:
        ends.pop(-2)  # merge the short tail into the chunk before it
    return list(zip([0] + ends[:-1], ends))


def finish_prefill(run: PrefillRun, interrupt: Callable[[], bool] | None = None) -> tuple:
    """Run a prefill to the end, asking ``interrupt()`` between chunks; return its result.

    Raise core.execution.PrefillInterrupted when it says stop (the run is abandoned).
    """
    try:
        while not run.done:
            if run.tokens_done and interrupt is not None and interrupt():
                raise PrefillInterrupted(run.tokens_done, run.total)
            run.advance()
    except BaseException:
        run.abandon()
        raise
    return run.result()
