# SPDX-License-Identifier: Apache-2.0
"""The replica pool executor: goals streamed from `vllm serve` replicas, behind the Server.

ROS-free. Admission counts a goal's prompt tokens with the local tokenizer, chooses
its answer length once, and asks the pool (serving/replica_pool.py) for the earliest
predicted finish: a goal no replica is predicted to answer in time is refused with that
prediction. An accepted goal streams from the chosen replica on its own thread (the
replicas schedule among themselves by the deadline priority). Each streamed delta is a
token event into the goal's run (core.execution.JobRun), so Kill, cancel and the
Skip-Next overrun are the local ones; a stream that falls silent is stopped at the
run's wait limit. A replica that fails is left out for a while; the goal moves to
another one when time is left. No local model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import json
import threading
import time

import httpx
import jsonschema

from timebill_ros.core.execution import (
    ended_before_start, GenerationStats, JobResult, JobRun, TokenEvent)
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Mode, Outcome, OverrunPolicy, Rejection
from timebill_ros.runtime.model import chat_messages, request_prompt_ids
from timebill_ros.serving.jobs import Job
from timebill_ros.serving.remote import (
    deadline_priority, joined, RemoteAnswer, RemoteGoal, stream_goal)
from timebill_ros.core.replica_admission import LengthBasis, plan_on_pool
from timebill_ros.serving.replica_pool import ReplicaPool
from timebill_ros.serving.server import Server

# A Kill later than this is logged: it should be late by one token plus the network.
LATE_KILL_S = 0.2


@dataclass(frozen=True)
class RemoteModel:
    """What the node reports of the model it serves through replicas."""

    name: str
    device: str = 'remote'
    dtype: str = 'replica'
    context_window: int = 4096


class ReplicaFailed(Exception):
    """A replica failed mid-answer and the goal could not go on elsewhere."""


class ReplicaExecutor:
    """Run goals on a pool of `vllm serve` replicas (``config.vllm_endpoints``)."""

    kind, dtype, scheduler = 'replica pool', 'replica', 'replica priority (EDF)'

    def __init__(self, config, tokenizer, log, predictor=None):
        """Hold the pool, the tokenizer that counts prompt tokens and the length predictor.

        ``predictor``: a text-side length predictor with a calibrated ``distribution``
        (runtime.predictor.HeadPredictor on MiniLM features); None plans every goal on
        the recent answers.
        """
        self.config, self.tokenizer, self.log = config, tokenizer, log
        self.predictor = predictor
        urls = [u.strip() for u in config.vllm_endpoints.split(',') if u.strip()]
        self.pool = ReplicaPool(urls, seats=config.vllm_max_num_seqs)
        self.client = httpx.Client(limits=httpx.Limits(max_connections=256))
        self.lifecycle = None

    def attach(self, lifecycle) -> None:
        """Serve for ``lifecycle`` (the Server)."""
        self.lifecycle = lifecycle

    def warm_up(self, timeout_s: float = 20.0) -> None:
        """Send each replica a two-token request: its first one is slow, and a dead one shows.

        Not learned from (a first request is no sample of the steady state); a replica that
        fails is left out for a while, as in serving.
        """
        body = RemoteGoal(messages=({'role': 'user', 'content': 'Say hi.'},),
                          max_tokens=2).body(self.config.vllm_model, 0)
        for replica in self.pool.replicas:
            answer = stream_goal(self.client, replica.url, body, time.monotonic() + timeout_s)
            if answer.ended != 'completed':
                self.pool.mark_down(replica, answer.error or f'no answer in {timeout_s:g} s')
            self.log.info(f'replica {replica.url}: warm-up {answer.ended} in '
                          f'{answer.finished - answer.started:.2f} s {answer.error}'.rstrip())

    # -- admission --------------------------------------------------------------------------

    def limits(self):
        """Return the goal limits of the configuration in force."""
        return self.config.limits()

    def prepare(self, request, clock, key: str) -> Job:
        """Tokenize the goal and choose its answer length once; raise Rejection."""
        if request.mode not in (Mode.AUTO, Mode.NONE):
            raise Rejection('replicas serve MODE_AUTO and MODE_NONE only (no local cuts)')
        job = Job(key=key, request=request, clock=clock, plan=Plan(),
                  prompt_ids=request_prompt_ids(self.tokenizer, request))
        job.length_basis = self._length_basis(job)
        return job

    def plan(self, job: Job) -> None:
        """Choose the goal's replica and its plan, the lock held; raise Rejection."""
        job.replica, job.plan = self._route(job)

    def preview(self, job: Job) -> None:
        """Add nothing: admission's plan is what a replica runs."""

    def _route(self, job: Job, done_tokens: int = 0, moving: bool = False) -> tuple:
        """Return (replica, plan) for the goal's tokens left now; raise Rejection.

        ``moving``: its replica failed (plan_on_pool: it does not yield to others).
        """
        basis = job.length_basis
        if done_tokens and basis.predicted:  # moved: the rest of the predicted answer
            basis = replace(basis, predicted=max(1, basis.predicted - done_tokens))
        return plan_on_pool(self.pool, basis, len(job.prompt_ids) + done_tokens,
                            job.request.max_new_tokens - done_tokens, job.clock.remaining(),
                            self.config, moving)

    def _length_basis(self, job: Job) -> LengthBasis:
        """Return what the goal's answer length is planned on, decided once per goal.

        The order of the local path (serving/length_choice.py), with what a replica has:
        the caller's own ``expected_tokens``; a schema's own earlier answers; then the
        text predictor's calibrated prediction; then the recent answers' spread (or
        their mean).
        """
        learning = self.lifecycle.learning
        cap, typical = job.request.max_new_tokens, learning.typical_tokens
        if job.request.expected_tokens > 0:
            expected = min(job.request.expected_tokens, cap)
            return LengthBasis(None, float(expected), expected, "the caller's expected_tokens")
        form = job.answer_form and learning.grammar_lengths(job.answer_form, cap)
        if form:
            return LengthBasis(form, typical, predictor='earlier answers of its schema')
        predictor = self.predictor
        if predictor is not None:
            predicted, dist = predictor.calibrated(job.request, len(job.prompt_ids))
            # Without a distribution (past its labels' cap): planned at the prediction.
            return LengthBasis(dist, typical if dist is not None else float(predicted),
                               predicted, predictor.name)
        return LengthBasis(learning.recent_lengths(None), typical)

    # -- running ----------------------------------------------------------------------------

    def enqueue(self, job: Job) -> None:
        """Launch the goal on its own thread at once (lock held): replicas queue by deadline."""
        skip = self.lifecycle.dispatched(job)
        threading.Thread(target=self._run, args=(job, skip), daemon=True,
                         name=f'timebill-remote-{job.key[:8]}').start()

    def unqueue(self, job: Job) -> bool:
        """Nothing waits here: a running goal sees its cancel at the next token."""
        return False

    def drain(self) -> list:
        """Nothing waits here: running goals stop at their next token when closing."""
        return []

    def queued(self) -> int:
        """Count the goals waiting: none (each runs at once)."""
        return 0

    def _run(self, job: Job, skip: str) -> None:
        job.hooks.on_start()
        run = self.lifecycle.begin(job, skip)
        if run is None:  # skipped, canceled or expired: its result is delivered
            return
        try:
            result = self._serve(job, run)
        except Exception as exc:  # noqa: BLE001 - every goal gets a result with why
            self.log.error(f'remote goal {job.key} failed: {exc!r}')
            result = ended_before_start(job.clock, Outcome.FAILED,
                                        f'internal error: {exc!r}', job.plan)
        self.lifecycle.finish(job, result)

    def _serve(self, job: Job, run: JobRun) -> JobResult:
        """Stream the goal; when its replica fails, continue it on another one in time."""
        replica, answer, failures = job.replica, RemoteAnswer(), []
        while True:
            part = self._stream(job, run, replica, answer)
            answer = joined(answer, part) if answer.tokens else part
            if part.ended != 'failed':
                return self._result(job, run, replica.url, answer, failures)
            if part.refused_goal and not answer.tokens:  # the goal's fault, not the replica's
                return ended_before_start(job.clock, Outcome.REJECTED,
                                          f'replica {replica.url} refused the goal: '
                                          f'{part.error}', job.plan)
            failures.append(f'replica {replica.url} failed after {answer.tokens} tokens: '
                            f'{part.error}')
            structured = job.request.output.json_schema or job.request.output.grammar
            try:
                if answer.tokens and structured:
                    raise Rejection('a structured answer cannot be continued elsewhere')
                replica, job.plan = self._route(job, answer.tokens, moving=True)
                run.plan = job.plan
            except Rejection as exc:
                why = '; '.join(failures) + f'; not moved: {exc.reason}'
                if not answer.tokens:  # nothing ran: refused, with why
                    return ended_before_start(job.clock, Outcome.REJECTED, why, job.plan)
                answer.error = why
                if not structured and job.request.policy == OverrunPolicy.KILL:
                    # No replica can stream the rest by the deadline: Kill ends it now,
                    # its text partial (the replica's failure is not the goal's).
                    answer = replace(answer, ended='killed', finished=job.clock.now())
                return self._result(job, run, replica.url, answer, [])
            self.log.warning(f'goal {job.key[:8]}: {failures[-1]}; moved to {replica.url}')

    def _stream(self, job: Job, run: JobRun, replica, before: RemoteAnswer) -> RemoteAnswer:
        """Stream (the rest of) the goal from ``replica``, each delta a token of its run."""
        request, output = job.request, job.request.output
        goal = RemoteGoal(messages=tuple(chat_messages(
            request.instruction, request.context, output.system_prompt, output.history)),
            max_tokens=request.max_new_tokens - before.tokens, stop=output.stop,
            temperature=output.temperature, top_p=output.top_p if output.top_p < 1 else 0.0,
            seed=output.seed, json_schema=output.json_schema, grammar=output.grammar,
            prefix=before.text)
        index = [before.tokens]

        def on_delta(text: str) -> bool:
            self.pool.token(on_replica)
            event = TokenEvent(index[0], -1, text, job.clock.now())
            index[0] += 1
            return run.on_token(event)  # Kill, cancel, Skip-Next's overrun: the run's rules
        body = goal.body(self.config.vllm_model,
                         deadline_priority(time.time() + job.clock.remaining()))
        on_replica = self.pool.started(
            replica, job.clock.deadline, len(job.prompt_ids) + before.tokens,
            tokens=before.tokens, basis=job.length_basis,
            expected=max(1, job.plan.predicted_tokens + before.tokens),
            cap=request.max_new_tokens)
        answer = stream_goal(self.client, replica.url, body,
                             run.wait_limit(self.config.max_budget_s), on_delta,
                             job.stop_requested)
        self.pool.ended(replica, answer, on_replica)
        return answer

    def _result(self, job: Job, run: JobRun, url: str, answer: RemoteAnswer,
                moves: list) -> JobResult:
        """Turn a streamed answer into the goal's result through its run (outcome, reason)."""
        if answer.ended == 'failed':
            error = answer.error if answer.error.startswith('replica ') \
                else f'replica {url} failed: {answer.error}'
            result = replace(run.failed(ReplicaFailed(error)), tokens=answer.tokens,
                             text=answer.text)
        else:
            if answer.ended == 'killed':  # no token by its wait limit (or none can come)
                run.silent()
            elif answer.ended == 'canceled':
                run.canceled()
            ttft = answer.ttft_s if answer.tokens else 0.0
            result = run.finish(GenerationStats(
                prefill_s=ttft, step_times=answer.itl_s(), tokens=answer.tokens,
                stop='max_tokens' if answer.finish_reason == 'length' else 'eos',
                stop_why=answer.error))
            result = replace(result, text=answer.text, decode_s=max(
                0.0, answer.finished - answer.started - ttft))
        late = result.e2e_s - job.request.budget_s
        if result.outcome == Outcome.KILLED and late > LATE_KILL_S:
            self.log.warning(f'goal {job.key[:8]}: {result.reason} (this process was not '
                             'scheduled in time, or its GIL was held)')
        moved = ''.join(f'; moved after: {why}' for why in moves)
        return replace(result, reason=f'{result.reason} (replica {url}{moved})',
                       valid=conforms(job.request.output, answer, result.outcome))

    # -- the rest of the Executor interface -------------------------------------------------

    def learn(self, job: Job, result: JobResult) -> tuple:
        """Nothing to refit here (the pool learned from the stream): the plan's estimate."""
        return job.plan.est_wcet_s, None

    def reconfigure(self, config) -> None:
        """Put a new configuration (live parameters) in force for the next goals."""
        self.config = config
        self.pool.seats = config.vllm_max_num_seqs

    def recalibrate(self, quick: bool):
        """Refuse: a replica's timing is learned from its streams, not calibrated."""
        raise RuntimeError('replicas are timed from their own streams; nothing to calibrate')

    def status(self) -> dict:
        """Return each replica's load, speed and health."""
        extra = {'planner': 'replica pool'}
        for index, replica in enumerate(self.pool.replicas):
            extra[f'replica_{index}'] = (
                f'{replica.url} running {replica.running} '
                f'itl {replica.timing.itl_s(replica.running):.3f} s'
                + (f' down: {replica.last_error}' if replica.down_until > time.monotonic()
                   else ''))
        return extra

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the HTTP client."""
        self.client.close()


def conforms(output, answer: RemoteAnswer, outcome: Outcome) -> bool:
    """Tell whether the text conforms to the goal's schema (free text: it ran)."""
    if output.json_schema:
        try:
            jsonschema.validate(json.loads(answer.text), json.loads(output.json_schema))
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if output.grammar:  # vLLM's matcher constrained every token; only a cut one is open
        return outcome == Outcome.COMPLETED
    return answer.tokens > 0


def replica_server(config, tokenizer, log, on_finished=lambda *args: None, predictor=None):
    """Return the one Server over a pool of replicas."""
    return Server(ReplicaExecutor(config, tokenizer, log, predictor), config, log,
                  on_finished)
