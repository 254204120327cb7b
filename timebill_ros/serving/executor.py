# SPDX-License-Identifier: Apache-2.0
"""The executor interface: where a goal's tokens come from, behind the one Server.

ROS-free. The Server (serving/server.py) owns every goal's lifecycle: validation, the
deadline clock, the job table, Skip-Next, the result's delivery, telemetry and shutdown.
An executor owns the resources the tokens come from and what planning on them means:

- the local engines (serving/local_executor.py): one loaded model, its engine options,
  the dispatch queue, THE decode loop (serving/loop.py);
- the replica pool (serving/replica_executor.py): `vllm serve` replicas, each goal
  streamed from the one admission chose.

Both run a goal through the same per-goal run object (core.execution.JobRun), which
applies Kill, cancel and the Skip-Next overrun at each token, and both hand every result
back through ``Lifecycle.finish``. vLLM v1's split (processor, engine core, executor) is
the model: the server is the processor and the engine core's bookkeeping, the executor
the part that runs.
"""

from __future__ import annotations

import threading
from typing import Protocol

from timebill_ros.core.deadline import DeadlineClock
from timebill_ros.core.execution import JobResult, JobRun
from timebill_ros.core.request import Limits, Request
from timebill_ros.serving.jobs import Job


class Lifecycle(Protocol):
    """What an executor calls on the server that owns its goals."""

    lock: threading.Lock  # one lock for the job table, the queue and admission's plans
    learning: object  # serving.learning.Learning: telemetry and recent answer lengths
    closing: str  # why no goal is taken any more ('' while serving)
    held: dict  # admitted goals whose place is reserved, not yet started
    running: dict  # key -> (job, dispatched at): dispatched goals not yet ended

    def dispatched(self, job: Job) -> str:
        """Mark a goal leaving the queue to run (lock held); return why it is skipped."""

    def begin(self, job: Job, skip: str) -> JobRun | None:
        """Start a dispatched goal's run, or end it now (skipped, canceled, expired)."""

    def finish(self, job: Job, result: JobResult) -> None:
        """Deliver a goal's result (exactly once per goal, any thread)."""


class Executor(Protocol):
    """Run admitted goals on some resources; the Server calls these."""

    kind: str  # 'local engines' or 'replica pool' (diagnostics)
    dtype: str  # the precision telemetry names when a plan names none
    scheduler: str  # the order goals run in

    def attach(self, lifecycle: Lifecycle) -> None:
        """Start serving for ``lifecycle`` (threads start here)."""

    def limits(self) -> Limits:
        """Return the goal limits a request is validated against."""

    def prepare(self, request: Request, clock: DeadlineClock, key: str) -> Job:
        """Return the goal's job: tokenized, its answer length chosen (outside the lock)."""

    def plan(self, job: Job) -> None:
        """Plan the job on the resources as they are now (lock held); raise Rejection."""

    def preview(self, job: Job) -> None:
        """Fill in what a dry run (``~/plan``) shows beyond admission's plan."""

    def enqueue(self, job: Job) -> None:
        """Queue or launch an admitted job (lock held)."""

    def unqueue(self, job: Job) -> bool:
        """Take a job out of the queue if it still waits (lock held); return whether."""

    def drain(self) -> list:
        """Take every waiting job out of the queue (lock held) and return them."""

    def queued(self) -> int:
        """Count the jobs waiting in the queue (lock held)."""

    def learn(self, job: Job, result: JobResult) -> tuple:
        """Learn timing from a finished job; return (ETE estimate s, its error % or None)."""

    def status(self) -> dict:
        """Return the executor's facts for diagnostics."""

    def reconfigure(self, config) -> None:
        """Put new live parameters in force for goals admitted from now on."""

    def recalibrate(self, quick: bool):
        """Calibrate again and return the profile (or raise why it cannot)."""

    def stop(self, timeout_s: float) -> None:
        """Stop the executor's threads and connections."""
