# SPDX-License-Identifier: Apache-2.0
"""Convert between ROS messages and the core dataclasses."""

from __future__ import annotations

import math

from builtin_interfaces.msg import Duration

from timebill_msgs.action import Instruct
from timebill_msgs.msg import DeadlineTelemetry, InferencePlan, Response
from timebill_ros.core.early_exit import FORCED, FULL, THRESHOLD
from timebill_ros.core.execution import JobResult, TokenEvent
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import GoalSpec, Rejection
from timebill_ros.core.telemetry import tpot_stats


def duration_to_s(duration: Duration) -> float:
    """Return a Duration in seconds (sec may be negative)."""
    return float(duration.sec) + float(duration.nanosec) * 1e-9


def s_to_duration(seconds: float) -> Duration:
    """Return seconds as a Duration (finite values only)."""
    if not math.isfinite(seconds):
        raise ValueError(f'cannot represent {seconds} s as a Duration')
    sec = math.floor(seconds)
    nanosec = int(round((seconds - sec) * 1e9))
    if nanosec >= 1_000_000_000:
        sec, nanosec = sec + 1, nanosec - 1_000_000_000
    return Duration(sec=int(sec), nanosec=nanosec)


def spec_from(msg, request_id: str = '', now_ns: int | None = None) -> GoalSpec:
    """Build a GoalSpec from an Instruct goal, an Instruction or a PlanInstruction request.

    ``now_ns``: the node clock's time at arrival, against which an absolute ``deadline``
    becomes the budget (None: the budget alone). Raise Rejection on a deadline past.
    """
    return GoalSpec(
        instruction=msg.instruction, context=msg.context, budget_s=budget_s(msg, now_ns),
        overrun_policy=msg.overrun_policy, mode=msg.mode, max_new_tokens=msg.max_new_tokens,
        pessimistic_factor=msg.pessimistic_factor,
        request_id=request_id or getattr(msg, 'id', ''),
        eviction_ratio=msg.eviction_ratio, expected_tokens=msg.expected_tokens,
        token_deadline_s=duration_to_s(msg.token_deadline), precision=msg.precision,
        **output_fields(msg))


def budget_s(msg, now_ns: int | None) -> float:
    """Return the time a goal may take from now: its budget, or what its deadline leaves.

    With both set the earlier end wins; a deadline already past is a Rejection saying
    by how much (on the node's clock, ROS time).
    """
    budget = duration_to_s(msg.budget)
    deadline = getattr(msg, 'deadline', None)  # a message type from before the field
    if now_ns is None or deadline is None or (deadline.sec == 0 and deadline.nanosec == 0):
        return budget
    left = (int(deadline.sec) * 1_000_000_000 + int(deadline.nanosec) - now_ns) / 1e9
    if left <= 0.0:
        raise Rejection(f'deadline already passed {-left:.3f} s before the goal arrived '
                        "(node clock; check the sender's clock and use_sim_time)")
    return min(budget, left) if budget > 0.0 else left


def output_fields(msg) -> dict:
    """Return a goal's answer-form fields (core.output) as GoalSpec keywords."""
    return dict(system_prompt=msg.system_prompt,
                history=tuple((turn.role, turn.content) for turn in msg.history),
                stop=tuple(msg.stop), temperature=float(msg.temperature),
                top_p=float(msg.top_p), seed=int(msg.seed), json_schema=msg.json_schema,
                grammar=msg.grammar)


def plan_to_msg(plan: Plan) -> InferencePlan:
    """Fill an InferencePlan message."""
    return InferencePlan(
        mode=int(plan.mode), prompt_tokens=plan.prompt_tokens,
        predicted_tokens=plan.predicted_tokens, predictor=plan.predictor,
        worst_case_tokens=plan.worst_case_tokens,
        pessimistic_factor=float(plan.pessimistic_factor),
        eviction_ratio=float(plan.eviction_ratio), press=plan.press,
        est_prefill_s=plan.est_prefill_s, est_decode_s=plan.est_decode_s,
        est_wcet_s=plan.est_wcet_s, est_wcet_full_s=plan.est_wcet_full_s,
        est_wcet_alpha_max_s=plan.est_wcet_alpha_max_s, feasible=plan.feasible,
        exit_layers=[int(x) for x in plan.exit_layers],
        token_deadline_s=float(plan.token_deadline_s),
        est_p99_tpot_s=float(plan.est_p99_tpot_s), utilisation=float(plan.utilisation),
        fit_probability=float(plan.fit_probability), note=plan.note,
        precision=plan.precision, prefill_precision=plan.prefill_precision,
        fallback_precision=plan.fallback.precision if plan.fallback else '',
        precision_mix=plan.precision_text, lowered_units=len(plan.precision_mix))


def result_to_msg(result: JobResult) -> Instruct.Result:
    """Fill an Instruct result."""
    return Instruct.Result(
        text=result.text, outcome=int(result.outcome), deadline_met=result.deadline_met,
        reason=result.reason, tokens=result.tokens, queue_s=result.queue_s,
        prefill_s=result.prefill_s, decode_s=result.decode_s, e2e_s=result.e2e_s,
        plan=plan_to_msg(result.plan), stop_reason=int(result.stop_reason),
        valid=bool(result.valid))


def response_msg(request_id: str, result: JobResult, stamp) -> Response:
    """Fill the topic form of a result."""
    msg = Response(
        id=request_id, text=result.text, outcome=int(result.outcome),
        deadline_met=result.deadline_met, reason=result.reason, tokens=result.tokens,
        queue_s=result.queue_s, prefill_s=result.prefill_s, decode_s=result.decode_s,
        e2e_s=result.e2e_s, plan=plan_to_msg(result.plan),
        stop_reason=int(result.stop_reason), valid=bool(result.valid))
    msg.header.stamp = stamp
    return msg


def feedback_msg(event: TokenEvent, elapsed: float, remaining: float,
                 plan: Plan) -> Instruct.Feedback:
    """Fill the feedback for one streamed token."""
    return Instruct.Feedback(text_delta=event.text_delta, token_index=event.index,
                             elapsed_s=elapsed, remaining_s=remaining, plan=plan_to_msg(plan))


def telemetry_msg(goal_id: str, request_id: str, policy: int, budget_s: float,
                  result: JobResult, stamp) -> DeadlineTelemetry:
    """Fill the per-goal deadline telemetry message."""
    tpot = tpot_stats(result.step_times)
    msg = DeadlineTelemetry(
        goal_id=goal_id, request_id=request_id, overrun_policy=int(policy), budget_s=budget_s,
        queue_s=result.queue_s, prefill_s=result.prefill_s, decode_s=result.decode_s,
        e2e_s=result.e2e_s, slack_s=budget_s - result.e2e_s, outcome=int(result.outcome),
        deadline_met=result.deadline_met, reason=result.reason,
        prompt_tokens=result.plan.prompt_tokens, tokens=result.tokens,
        tpot_mean_s=tpot['mean'], tpot_p50_s=tpot['p50'], tpot_p99_s=tpot['p99'],
        tpot_max_s=tpot['max'], plan=plan_to_msg(result.plan),
        exits_full=result.exit_kinds.count(FULL),
        exits_threshold=result.exit_kinds.count(THRESHOLD),
        exits_forced=result.exit_kinds.count(FORCED),
        utilisation=tpot['p99'] / result.plan.token_deadline_s
        if result.plan.token_deadline_s > 0 else 0.0)
    msg.header.stamp = stamp
    return msg
