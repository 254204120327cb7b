"""The serving core over vLLM replicas: the same facade as serving.server.Server.

ROS-free. Admission validates a goal, counts its prompt tokens with the local tokenizer
and asks the replica pool (serving.remote) for the earliest predicted finish: a goal no
replica is predicted to answer in time is refused with that prediction. An accepted goal
streams from the chosen replica on its own thread (the replicas schedule among
themselves by the deadline priority), its tokens go out as feedback, and Kill closes the
stream at the deadline. A replica that fails is left out for a while; the goal moves to
another one when time is left. No local model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import json
import threading
import time

import httpx
import jsonschema

from timebill_ros.core.deadline import DeadlineClock
from timebill_ros.core.execution import ended_before_start, JobResult, TokenEvent
from timebill_ros.core.output import StopReason
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Mode, Outcome, OverrunPolicy, Rejection, validate
from timebill_ros.runtime.model import chat_messages, request_prompt_ids
from timebill_ros.serving.jobs import Job, JobHooks
from timebill_ros.serving.learning import Learning
from timebill_ros.serving.remote import (
    deadline_priority, joined, RemoteAnswer, RemoteGoal, ReplicaPool, stream_goal)
from timebill_ros.serving.remote_admission import LengthBasis, plan_on_pool


# A Kill later than this is logged: it should be late by one token plus the network.
LATE_KILL_S = 0.2
ADMISSION_WORDS_S = 0.1  # a refusal says what admission cost once it took this long


@dataclass(frozen=True)
class RemoteModel:
    """What the node reports of the model it serves through replicas."""

    name: str
    device: str = 'remote'
    dtype: str = 'replica'
    context_window: int = 4096


class RemoteServer:
    """Serve goals on a pool of `vllm serve` replicas (``config.vllm_endpoints``)."""

    scheduler = 'replica priority (EDF)'

    def __init__(self, config, tokenizer, log, on_finished=lambda *args: None,
                 predictor=None):
        """Hold the pool, the tokenizer that counts prompt tokens and the telemetry.

        ``predictor``: a text-side length predictor with a calibrated ``distribution``
        (runtime.predictor.HeadPredictor on MiniLM features); None plans every goal on
        the recent answers.
        """
        self.config, self.tokenizer, self.log, self.on_finished = \
            config, tokenizer, log, on_finished
        self.predictor = predictor
        urls = [u.strip() for u in config.vllm_endpoints.split(',') if u.strip()]
        self.pool = ReplicaPool(urls, seats=config.vllm_max_num_seqs)
        self.client = httpx.Client(limits=httpx.Limits(max_connections=256))
        self.learning = Learning(config.miss_window, 'replica')
        self.lock = threading.Lock()
        self.held: dict = {}
        self.routes: dict = {}  # key -> the replica admission chose
        self.overran: set = set()  # Skip-Next goals past their deadline, not yet charged
        self.jobs: dict = {}
        self.running: set = set()
        self.closing = ''

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

    # -- admission --------------------------------------------------------------------

    def _plan(self, job: Job, done_tokens: int = 0, moving: bool = False) -> tuple:
        """Return (replica, plan) for the goal's tokens left now; raise Rejection.

        ``moving``: its replica failed (plan_on_pool: it does not yield to others).
        """
        if job.length_basis is None:
            job.length_basis = self._length_basis(job)
        basis = job.length_basis
        if done_tokens and basis.predicted:  # moved: the rest of the predicted answer
            basis = replace(basis, predicted=max(1, basis.predicted - done_tokens))
        return plan_on_pool(self.pool, basis, len(job.prompt_ids) + done_tokens,
                            job.request.max_new_tokens - done_tokens, job.clock.remaining(),
                            self.config, moving)

    def _length_basis(self, job: Job) -> LengthBasis:
        """Return what the goal's answer length is planned on, decided once per goal.

        A schema's own earlier answers say most; then the text predictor's calibrated
        prediction; then the recent answers' spread (or their mean).
        """
        cap, typical = job.request.max_new_tokens, self.learning.typical_tokens
        form = job.answer_form and self.learning.grammar_lengths(job.answer_form, cap)
        if form:
            return LengthBasis(form, typical, predictor='earlier answers of its schema')
        predictor = self.predictor
        if predictor is not None:
            predicted, dist = predictor.calibrated(job.request, len(job.prompt_ids))
            # Without a distribution (past its labels' cap): planned at the prediction.
            return LengthBasis(dist, typical if dist is not None else float(predicted),
                               predicted, predictor.name)
        return LengthBasis(self.learning.recent_lengths(None), typical)

    def admit(self, spec, key: str, reserve: bool = True) -> Job:
        """Validate and plan a goal; raise Rejection with the reason."""
        request = validate(spec, self.config.limits())
        clock = DeadlineClock.start(request.budget_s)
        if request.mode not in (Mode.AUTO, Mode.NONE):
            raise Rejection('replicas serve MODE_AUTO and MODE_NONE only (no local cuts)')
        job = Job(key=key, request=request,
                  prompt_ids=request_prompt_ids(self.tokenizer, request), clock=clock,
                  plan=Plan())
        try:
            replica, job.plan = self._plan(job)
        except Rejection as refused:
            spent = clock.elapsed()
            if spent < ADMISSION_WORDS_S:
                raise
            # Say where the budget went: the node's own work, not the replicas.
            raise Rejection(f'{refused}; admission itself took {spent:.3f} s of the budget '
                            '(tokenizing and the length prediction)', refused.plan) from None
        if reserve:
            with self.lock:
                if self.closing:
                    raise Rejection(self.closing)
                self.held[key] = job
                self.routes[key] = replica
        return job

    def dry_run(self, spec) -> Job:
        """Return the job ``admit`` would accept now (the ~/plan service)."""
        return self.admit(spec, 'plan-request', reserve=False)

    def rejected(self, plan) -> None:
        """Count a goal refused at admission."""
        self.learning.rejected(plan)

    # -- running ----------------------------------------------------------------------

    def start(self, key: str, hooks: JobHooks) -> Job:
        """Run an admitted goal on its own thread; it is kept until ``forget``."""
        return self._launch(key, hooks, keep=True)

    def submit(self, job: Job, hooks: JobHooks = JobHooks()) -> None:
        """Run an admitted goal at once; it is dropped when it ends (topics)."""
        self._launch(job.key, hooks, keep=False)

    def _launch(self, key: str, hooks: JobHooks, keep: bool) -> Job:
        with self.lock:
            job = self.held.pop(key)
            job.hooks, job.keep = hooks, keep
            self.jobs[key] = job
            self.running.add(key)
            replica = self.routes.pop(key)
            skip = self._charge_overrun()
        self.learning.accepted()
        threading.Thread(target=self._run, args=(job, replica, skip), daemon=True,
                         name=f'timebill-remote-{key[:8]}').start()
        return job

    def _charge_overrun(self) -> str:
        """Return why the goal starting now is skipped ('' to run it); under self.lock.

        Skip-Next on a replica: a goal past its deadline runs on, and the next goal that
        starts while it does gives its turn up, as the next job does in TimeBill.
        """
        for key in list(self.overran):
            self.overran.discard(key)
            if key in self.running:
                return f'skipped: previous goal {key[:8]} overran its deadline (Skip-Next)'
        return ''

    def _run(self, job: Job, replica, skip: str) -> None:
        job.hooks.on_start()
        try:
            result = (ended_before_start(job.clock, Outcome.SKIPPED, skip, job.plan) if skip
                      else self._serve(job, replica))
        except Exception as exc:  # noqa: BLE001 - every goal gets a result with why
            self.log.error(f'remote goal {job.key} failed: {exc!r}')
            result = ended_before_start(job.clock, Outcome.FAILED,
                                        f'internal error: {exc!r}', job.plan)
        self._finish(job, result)

    def _serve(self, job: Job, replica) -> JobResult:
        """Stream the goal; when its replica fails, continue it on another one in time."""
        started, answer, failures = job.clock.now(), RemoteAnswer(), []
        while True:
            part = self._stream(job, replica, answer)
            answer = joined(answer, part) if answer.tokens else part
            if part.ended != 'failed':
                return self._result(job, replica.url, answer, started, failures)
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
                replica, job.plan = self._plan(job, answer.tokens, moving=True)
            except Rejection as exc:
                why = '; '.join(failures) + f'; not moved: {exc.reason}'
                if not answer.tokens:  # nothing ran: refused, with why
                    return ended_before_start(job.clock, Outcome.REJECTED, why, job.plan)
                answer.error = why
                if not structured and job.request.policy == OverrunPolicy.KILL:
                    # No replica can stream the rest by the deadline: Kill ends it now,
                    # its text partial (the replica's failure is not the goal's).
                    answer = replace(answer, ended='killed', finished=job.clock.now())
                return self._result(job, replica.url, answer, started, [])
            self.log.warning(f'goal {job.key[:8]}: {failures[-1]}; moved to {replica.url}')

    def _stream(self, job: Job, replica, before: RemoteAnswer) -> RemoteAnswer:
        """Stream (the rest of) the goal from ``replica``, its tokens sent as feedback."""
        request, output = job.request, job.request.output
        goal = RemoteGoal(messages=tuple(chat_messages(
            request.instruction, request.context, output.system_prompt, output.history)),
            max_tokens=request.max_new_tokens - before.tokens, stop=output.stop,
            temperature=output.temperature, top_p=output.top_p if output.top_p < 1 else 0.0,
            seed=output.seed, json_schema=output.json_schema, grammar=output.grammar,
            prefix=before.text)
        index = [before.tokens]

        def on_delta(text: str) -> None:
            self.pool.token(on_replica)
            now = job.clock.now()
            job.hooks.on_feedback(TokenEvent(index[0], -1, text, now),
                                  job.clock.elapsed(now), job.clock.remaining(now), job.plan)
            index[0] += 1
        body = goal.body(self.config.vllm_model,
                         deadline_priority(time.time() + job.clock.remaining()))
        # Skip-Next lets a goal run past its deadline (to its own end, or the largest budget).
        skip_next = request.policy == OverrunPolicy.SKIP_NEXT
        until = job.clock.deadline + (self.config.max_budget_s if skip_next else 0.0)
        watch = threading.Timer(max(0.0, job.clock.remaining()), self._overran, (job.key,)) \
            if skip_next else None
        if watch is not None:
            watch.start()
        on_replica = self.pool.started(
            replica, job.clock.deadline, len(job.prompt_ids) + before.tokens,
            tokens=before.tokens, basis=job.length_basis,
            expected=max(1, job.plan.predicted_tokens + before.tokens),
            cap=request.max_new_tokens)
        try:
            answer = stream_goal(self.client, replica.url, body, until, on_delta,
                                 lambda: bool(self.closing) or job.hooks.cancel_requested())
        finally:
            if watch is not None:
                watch.cancel()
        self.pool.ended(replica, answer, on_replica)
        return answer

    def _overran(self, key: str) -> None:
        with self.lock:
            if key in self.running:
                self.overran.add(key)

    def _result(self, job: Job, url: str, answer: RemoteAnswer, started: float,
                moves: list) -> JobResult:
        """Turn a streamed answer into the goal's result (outcome, reason, timings)."""
        clock, output = job.clock, job.request.output
        end = min(answer.finished, clock.deadline) if answer.ended == 'killed' \
            else answer.finished
        met = answer.ended == 'completed' and end <= clock.deadline
        spare = clock.deadline - end
        if answer.ended == 'completed':
            outcome = Outcome.COMPLETED
            stop = StopReason.MAX_TOKENS if answer.finish_reason == 'length' \
                else StopReason.END_OF_ANSWER
            why = 'max_new_tokens reached' if stop == StopReason.MAX_TOKENS else 'end of answer'
            reason = (f'completed in time ({why}, {spare:.3f} s to spare)' if met else
                      f'completed {-spare:.3f} s after the deadline ({why})')
        elif answer.ended == 'killed' and answer.error:  # before the deadline: why
            outcome, stop = Outcome.KILLED, StopReason.KILLED
            reason = (f'killed {clock.deadline - answer.finished:.3f} s before the deadline '
                      f'after {answer.tokens} tokens: {answer.error}; text is partial')
        elif answer.ended == 'killed':
            outcome, stop = Outcome.KILLED, StopReason.KILLED
            reason = (f'killed at the deadline after {answer.tokens} tokens '
                      f'({answer.finished - clock.deadline:.3f} s past it); text is partial')
            if answer.finished - clock.deadline > LATE_KILL_S:
                self.log.warning(f'goal {job.key[:8]}: {reason} (this process was not '
                                 'scheduled in time, or its GIL was held)')
        elif answer.ended == 'canceled':
            outcome, stop = Outcome.CANCELED, StopReason.CANCELED
            reason = self.closing or f'canceled after {answer.tokens} tokens'
        else:
            outcome, stop = Outcome.FAILED, StopReason.FAILED
            reason = answer.error if answer.error.startswith('replica ') \
                else f'replica {url} failed: {answer.error}'
        ttft = answer.ttft_s if answer.tokens else 0.0
        moved = ''.join(f'; moved after: {why}' for why in moves)
        return JobResult(
            outcome=outcome, deadline_met=met, reason=f'{reason} (replica {url}{moved})',
            text=answer.text, tokens=answer.tokens, queue_s=clock.elapsed(started),
            prefill_s=ttft, decode_s=max(0.0, answer.finished - answer.started - ttft),
            e2e_s=clock.elapsed(answer.finished), step_times=tuple(answer.itl_s()),
            plan=job.plan, stop_reason=stop, valid=conforms(output, answer, outcome))

    def _finish(self, job: Job, result: JobResult) -> None:
        self.learning.count(job, result)
        try:
            self.on_finished(job, result, job.plan.est_wcet_s, 0.0)
        finally:
            job.result = result
            job.done.set()
            with self.lock:
                self.running.discard(job.key)
                self.overran.discard(job.key)
                if not job.keep:
                    self.jobs.pop(job.key, None)

    # -- the rest of the facade ----------------------------------------------------------

    def job(self, key: str) -> Job | None:
        """Return a running or uncollected job."""
        with self.lock:
            return self.jobs.get(key)

    def forget(self, key: str) -> None:
        """Drop a finished job whose result was delivered."""
        with self.lock:
            self.jobs.pop(key, None)

    def cancel(self, key: str) -> bool:
        """Nothing waits here: a running goal sees its cancel at the next token."""
        return False

    def reconfigure(self, config) -> None:
        """Put a new configuration (live parameters) in force for the next goals."""
        self.config = config
        self.pool.seats = config.vllm_max_num_seqs

    def recalibrate(self, quick: bool):
        """Refuse: a replica's timing is learned from its streams, not calibrated."""
        raise RuntimeError('replicas are timed from their own streams; nothing to calibrate')

    def status(self) -> tuple:
        """Return (telemetry summary, facts for diagnostics)."""
        with self.lock:
            extra = {'queue_length': 0, 'executing': len(self.running),
                     'scheduler': self.scheduler, 'planner': 'replica pool'}
        for index, replica in enumerate(self.pool.replicas):
            extra[f'replica_{index}'] = (
                f'{replica.url} running {replica.running} '
                f'itl {replica.timing.itl_s(replica.running):.3f} s'
                + (f' down: {replica.last_error}' if replica.down_until > time.monotonic()
                   else ''))
        return self.learning.summary(), extra

    def close(self, reason: str) -> int:
        """Refuse new goals; the running ones stop at their next token."""
        with self.lock:
            self.closing = reason or 'the node is shutting down'
        return 0

    def settled(self) -> bool:
        """Tell whether no goal runs or has a result left to collect."""
        with self.lock:
            return not (self.running or self.held or self.jobs)

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
