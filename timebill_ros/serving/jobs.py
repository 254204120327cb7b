# SPDX-License-Identifier: Apache-2.0
"""One admitted goal and the hooks its caller (an action goal, a topic) gives the server."""

from __future__ import annotations

from dataclasses import dataclass, field
import threading
from typing import Callable

from timebill_ros.core.deadline import DeadlineClock
from timebill_ros.core.execution import Feedback, JobResult
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Request
from timebill_ros.core.scheduling import Waiting


def _never() -> bool:
    return False


def _nothing(*args) -> None:
    return None


@dataclass(frozen=True)
class JobHooks:
    """How the server talks back to whoever sent the goal."""

    cancel_requested: Callable[[], bool] = _never
    # Called when the job leaves the queue (to run, or to end without running).
    on_start: Callable[[], None] = _nothing
    on_feedback: Feedback = _nothing


@dataclass(eq=False)
class Job:
    """One admitted goal waiting for or holding the model."""

    key: str
    request: Request
    prompt_ids: list
    clock: DeadlineClock
    plan: Plan
    hooks: JobHooks = field(default_factory=JobHooks)
    done: threading.Event = field(default_factory=threading.Event)
    result: JobResult | None = None
    # Kept after it ends until the caller collects the result (Server.forget): the
    # action path; topic and direct submissions are dropped when they end.
    keep: bool = False
    # What the decode loop polls at each token (the server adds its shutdown to the
    # caller's cancel); set when the job is dispatched.
    stop_requested: Callable[[], bool] | None = None
    # What admission planned with: the wait it expected and the batch it would decode
    # in; a re-plan at dispatch happens only when the real ones differ.
    expected_wait_s: float = 0.0
    expected_batch: int = 1
    expected_timing: object = None  # the ETE of that batch (None: decoding alone)
    # The length distribution planned on when the predictor was skipped (recent answers).
    spread: object = None
    # Prompt tokens the torch engine's prefix cache held at admission (planned as free).
    prefix_tokens: int = 0
    # Prompt tokens each other engine option held from an earlier prompt at admission.
    engine_prefix: dict = field(default_factory=dict)
    # What admission did to the goal's context (context reduction): in every plan's note.
    context_note: str = ''
    # Where admission took the answer length from, when not the predictor (every plan).
    length_note: str = ''
    # llguidance's compiled schema or grammar ('' = free text).
    grammar: str = ''
    # The answer length admission chose, once per goal (admission.LocalLength locally,
    # replica_admission.LengthBasis on replicas, kept for a re-plan when a goal moves).
    length_basis: object = None
    # (option, expected seconds) of its fastest option (core.queue_fit; None: not yet).
    fastest_option: tuple | None = None
    # Replicas: the replica admission chose to run it on.
    replica: object = None

    @property
    def held_by_plan_engine(self) -> int:
        """Return the prompt tokens the engine option its plan prefills on holds (0: none)."""
        return self.engine_prefix.get(self.plan.prefill_precision or self.plan.precision, 0)

    @property
    def answer_form(self) -> str:
        """Return what earlier answers of this form are kept under ('' = free text).

        The compiled grammar locally; a replica compiles its own, so there the goal's
        schema or grammar text.
        """
        output = self.request.output
        return self.grammar or output.json_schema or output.grammar

    def waiting(self) -> Waiting:
        """Return what a scheduler orders this job by.

        A length predicted only during prefill is unknown while the goal waits: the
        scheduler then sees the goal's cap.
        """
        pending = self.plan.length_pending or not self.plan.predicted_tokens
        return Waiting(self.clock.deadline, len(self.prompt_ids),
                       self.request.max_new_tokens if pending else self.plan.predicted_tokens)

    def cancel_requested(self) -> bool:
        """Tell whether the caller asked to cancel."""
        return self.hooks.cancel_requested()
