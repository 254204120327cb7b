# SPDX-License-Identifier: Apache-2.0
"""Feedback pacing: one goal's streamed tokens sent as at most one message a period.

Each feedback message costs the node about 0.5 ms on a 2-core machine (the DDS write and
the client process it wakes), which is 6-7 % of a 8-ms llama.cpp step
(results/engines/overhead_feedback_paced). A message a period carries every token since
the one before, so the text still reassembles and slow engines still stream token by
token.
"""

from __future__ import annotations

from dataclasses import replace
import math
import threading

from timebill_ros.core.execution import Feedback, TokenEvent
from timebill_ros.core.planning import Plan


class FeedbackPacer:
    """Send a goal's token feedback at most once every ``period_s`` (0: every token).

    A message carries the text of every token since the last message, and the newest
    token's index, elapsed and remaining time and plan. The first token goes out at once
    (time to first token); a later one when ``period_s`` has passed since the last
    message. ``flush`` sends what is held; call it when the goal ends, before its result,
    so the feedback still reassembles the whole answer.
    """

    def __init__(self, period_s: float, send: Feedback):
        """Pace the feedback that ``send`` publishes."""
        self.period_s, self.send = period_s, send
        self._lock = threading.Lock()  # a result may flush from another thread
        self._held: list = []
        self._newest: tuple | None = None  # (event, elapsed, remaining, plan)
        self._sent_at = -math.inf

    def __call__(self, event: TokenEvent, elapsed: float, remaining: float,
                 plan: Plan) -> None:
        """Take one token's feedback; send it with the held ones once the period is up."""
        with self._lock:
            self._held.append(event.text_delta)
            self._newest = (event, elapsed, remaining, plan)
            if event.time - self._sent_at >= self.period_s:
                self._send_held()

    def flush(self) -> None:
        """Send the tokens held back, if any."""
        with self._lock:
            if self._newest is not None:
                self._send_held()

    def _send_held(self) -> None:
        event, elapsed, remaining, plan = self._newest
        text = ''.join(self._held)
        self._held, self._newest, self._sent_at = [], None, event.time
        self.send(replace(event, text_delta=text), elapsed, remaining, plan)
