# SPDX-License-Identifier: Apache-2.0
"""The decode loop's members: a goal taking tokens, and a goal still prefilling.

ROS-free. A ``Member`` streams each token through its goal's run (core.execution.JobRun:
the deadline policy, cancel, feedback), closes a structured answer in time and ends at
the end of answer or ``max_new_tokens``; ``Prefilling`` times a chunked prefill's chunks.
The loop itself is serving/loop.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from timebill_ros.core.execution import GenerationStats, TokenEvent
from timebill_ros.core.planning import Plan
from timebill_ros.serving.engine_interface import FULL_LANE

# What a deadline closure is allowed beside the next step: the search takes 0.4-9 ms on
# the embedded tokenizer (runtime.grammar; its own limit is 0.1 s).
CLOSURE_S = 0.02


class TokenRules(Protocol):
    """What the loop asks of a goal: its plan and rules (core.execution.JobRun)."""

    plan: Plan
    closes_batch: bool

    def interrupt(self, next_chunk_s: float = 0.0) -> bool:
        """Tell whether a chunked prefill must stop before a chunk of ``next_chunk_s``."""

    def on_token(self, event: TokenEvent) -> bool:
        """Stream a token; return False when the goal stops here."""

    def stops_ahead(self, now: float, next_step_s: float) -> bool:
        """Tell whether the goal stops now, before a step of ``next_step_s`` (Kill)."""

    def token_budget(self, index: int) -> float | None:
        """Return the seconds decode step ``index`` may take (early exit)."""

    def switch_to(self, index: int, sharing) -> str:
        """Name a precision to move to before decode step ``index`` ('' = stay)."""

    def silent(self) -> None:
        """Note that the goal stops while it waits (paused): Kill, or its cancel."""

    def finish(self, stats: GenerationStats):
        """Return the result of a goal whose generation ended."""

    def failed(self, exc: Exception):
        """Return the result of a goal whose generation raised ``exc``."""


@dataclass(eq=False)
class Member:
    """A goal in the loop: its rules, the engine's stats, its text and its lane."""

    key: str
    run: TokenRules
    max_new_tokens: int
    end: Callable[[object], None]  # receives the goal's result
    stats: GenerationStats | None = None
    text: object = None  # the engine's text stream
    lane: tuple = FULL_LANE
    token: int = -1  # the token to feed at the next step
    # The goal's sampler, grammar and stop strings (runtime.choosing.TokenChooser);
    # None: greedy free text (the engine's argmax).
    chooser: object = None
    last_delta: str = ''  # the text of the last token streamed

    def emit(self, token: int, eos_ids, now: float, next_step_s: float = 0.0) -> bool:
        """Stream one token produced at ``now``; return False when the goal ends with it.

        ``next_step_s`` is what the next step is expected to take (0: unknown): a
        structured answer whose next step would end past its deadline is closed now.
        """
        stats, chooser = self.stats, self.chooser
        if token in eos_ids:
            stats.stop = 'eos'
            return False
        go_on = self._stream(token, now)
        if chooser is not None and not chooser.accept(token, self.last_delta):
            stats.stop = 'stop_string'
            return False
        if not go_on:
            stats.stop = 'stopped'
            if chooser is not None and chooser.closable and self.run.killed:
                self._close('closed', now)
            return False
        if stats.tokens >= self.max_new_tokens:
            stats.stop = 'max_tokens'
            if chooser is not None and chooser.closable:
                self._close('max_tokens', now)
            return False
        if chooser is not None and chooser.closable and \
                self.run.closes_now(now, next_step_s + CLOSURE_S):
            self._close('closed', now)
            return False
        if self.run.stops_ahead(now, next_step_s):
            stats.stop = 'stopped'
            return False
        return True

    def _stream(self, token: int, now: float) -> bool:
        """Count and stream one token; return what the goal's rules say (go on or not)."""
        stats = self.stats
        stats.tokens += 1
        self.token = token
        self.last_delta = self.text.push(token)
        return self.run.on_token(TokenEvent(index=stats.tokens - 1, token_id=token,
                                            text_delta=self.last_delta, time=now))

    def _close(self, stop: str, now: float) -> None:
        """Complete the structure with the grammar's closure (no model step), if one exists."""
        tokens = self.chooser.closure()
        if tokens is None:
            return  # nothing found in time: the answer stays cut (valid False)
        stats, parts = self.stats, []
        for token in tokens:
            self._stream(token, now)
            self.chooser.accept(token, self.last_delta)
            parts.append(self.last_delta)
        stats.stop, stats.closure_tokens = stop, len(tokens)
        stats.closure_text = ''.join(parts)

    def finished(self):
        """Return the goal's result now that its generation ended."""
        if self.chooser is not None:
            self.stats.valid = self.chooser.valid()
        return self.run.finish(self.stats)


@dataclass(eq=False)
class Prefilling:
    """A goal whose prompt is being prefilled, and how long its last chunk took."""

    member: Member
    prefill: object  # runtime.prefill.PrefillRun
    last_tokens: int = 0
    last_s: float = 0.0
    spent_s: float = 0.0  # in its chunks so far

    def next_chunk_s(self) -> float:
        """Return the expected seconds of the next chunk.

        Scaled from the last chunk by token count, never below it: a chunk's fixed cost
        (the weights' pass) dominates small chunks, and attention grows with position;
        plus what the run says a press adds to it (its last chunk scores the whole cache).
        Before one has run: the plan's prefill estimate shared over the tokens left (its
        first chunk costs less than that share, so Kill stops only a goal whose whole
        prefill cannot end by the deadline).
        """
        prefill = self.prefill
        extra = prefill.next_chunk_extra_s  # a press on the last chunk
        if not self.last_tokens:
            left = prefill.total - prefill.tokens_done
            planned = getattr(getattr(self.member.run, 'plan', None), 'est_prefill_s', 0.0)
            return (planned * prefill.next_chunk / left if left > 0 else 0.0) + extra
        return self.last_s * max(1.0, prefill.next_chunk / self.last_tokens) + extra

    def advance(self, clock) -> None:
        """Prefill the next chunk, timing it."""
        before, t = self.prefill.tokens_done, clock()
        self.prefill.advance()
        self.last_s, self.last_tokens = clock() - t, self.prefill.tokens_done - before
        self.spent_s += self.last_s
