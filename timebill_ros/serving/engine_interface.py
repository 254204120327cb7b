# SPDX-License-Identifier: Apache-2.0
"""The interface the decode loop drives a local model through: the loop engine of an option.

``runtime.engine.Engine`` is the local torch engine and
``runtime.llama_engine.LlamaEngine`` a GGUF variant on llama.cpp (``serving.resident``
routes plans between them). An engine prefills a prompt in chunks (``begin_prefill``:
the loop advances it between other goals' steps and may stop it between chunks), hands
out lanes that decode several sequences one step at a time, returns logits before the
token is picked (so a step hook may mask them), and names the KV operations it offers in
``capabilities`` ('evict', 'prefill_decision', 'move', 'early_exit', 'precision',
'logits'), so the planner and the loop use only what the engine can do.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Protocol, Sequence

from timebill_ros.core.execution import FULL_LANE, PrefillDecision  # noqa: F401 (re-export)
from timebill_ros.core.planning import Plan


class Lane(Protocol):
    """Sequences that step together (runtime.batch.BatchDecoder, runtime.early_exit.ExitLane)."""

    exclusive: bool  # True: the other lanes wait while it holds a sequence
    keys: list

    def __len__(self) -> int:
        """Count the sequences."""

    def cached_tokens(self) -> int:
        """Return the lane's KV length (the longest sequence's, with padding)."""

    def join(self, key: str, cache, position: int) -> None:
        """Add a prefilled sequence and the position of its next token."""

    def take(self, key: str) -> tuple:
        """Remove a sequence and return (its cache, next position) to join another lane."""

    def leave(self, key: str) -> None:
        """Remove a sequence (finished, killed, canceled)."""

    def discard(self, cache) -> None:
        """Free a prefilled cache that never joined (its goal ended on the first token)."""

    def step(self, feed: dict, budgets: dict | None = None) -> dict:
        """Feed each sequence its token; return key -> runtime.batch.LaneStep."""


class LoopEngine(Protocol):
    """A model the loop runs goals on."""

    capabilities: frozenset
    eos_ids: frozenset
    clock: Callable[[], float]  # the time of tokens and steps (monotonic seconds)

    def prefill(self, prompt_ids: Sequence[int], plan: Plan,
                decide: PrefillDecision | None = None,
                interrupt: Callable[[], bool] | None = None) -> tuple:
        """Prefill a prompt under its plan; return (cache, first logits, GenerationStats).

        A prefill in chunks asks ``interrupt()`` between them and raises
        core.execution.PrefillInterrupted when it says stop.
        """

    def begin_prefill(self, prompt_ids: Sequence[int], plan: Plan,
                      decide: PrefillDecision | None = None):
        """Return a prefill the loop advances a chunk at a time (runtime.prefill.PrefillRun)."""

    def lane_key(self, plan: Plan) -> tuple:
        """Return the lane a plan decodes in."""

    def lane(self, key: tuple) -> Lane:
        """Return a new, empty lane."""

    def threads(self, key: tuple) -> ContextManager:
        """Return the thread setting a lane's steps run under."""

    def pick(self, logits) -> int:
        """Return the token a logits row gives (greedy)."""

    def stream(self):
        """Return a text stream for one answer (``push(token) -> text delta``)."""
