# SPDX-License-Identifier: Apache-2.0
"""What a plan's note says of its goal, and the ETE a goal is planned with.

ROS-free helpers of admission and its re-plans: every plan of a goal says where its
answer length came from, what happened to its context, and what of its prompt need not
be prefilled (the torch prefix cache, another engine option's held prompt).
"""

from __future__ import annotations

from dataclasses import replace

from timebill_ros.core.planning import Plan, TimeBillPlanner
from timebill_ros.core.request import Mode
from timebill_ros.core.timing import with_cached_prefix
from timebill_ros.serving.jobs import Job


def cached(pipeline, job: Job, timing):
    """Return the ETE to plan a goal with: its prefix-cached tokens need no prefill."""
    if not job.prefix_tokens or not isinstance(pipeline.planner, TimeBillPlanner):
        return timing
    return with_cached_prefix(timing or pipeline.planner.timing(), job.prefix_tokens)


def note_prefixes(job: Job, pipeline) -> None:
    """Set what of the job's prompt need not be prefilled.

    ``prefix_tokens``: in the torch prefix cache; ``engine_prefix``: in each other
    engine option's held prompt.
    """
    engine, ids = pipeline.engine, job.prompt_ids
    job.prefix_tokens = getattr(engine, 'cached_prefix', lambda ids: 0)(ids)
    job.engine_prefix = getattr(engine, 'cached_prefixes', lambda ids: {})(ids)


def on_torch_for_sure(planner, request) -> bool:
    """Tell whether a goal runs on the torch engine whatever its length (its prefill may plan).

    With another engine resident, an AUTO goal free to use it is planned before its
    prefill, which runs on the engine chosen; a goal pinned to that engine too.
    """
    engines = planner.context.engines
    if request.precision in engines:
        return False
    return not engines or request.mode != Mode.AUTO or bool(request.precision)


def prefix_note(job: Job) -> str:
    """Return what the plan says of the goal's prompt tokens in the prefix cache."""
    return f'{job.prefix_tokens} of {len(job.prompt_ids)} prompt tokens in the prefix cache'


def with_job_notes(plan: Plan, job: Job, pipeline) -> Plan:
    """Return ``plan`` with what admission did to the goal's prompt in its note.

    Every plan of the goal (admission's and each re-plan) says it: where its answer
    length came from when not the predictor (admission's note), the context reduced,
    and the prompt tokens it need not prefill (the held prompt of the engine option it
    runs on, or the torch prefix cache).
    """
    if job.length_note and job.length_note not in plan.note:
        plan = noted(plan, job.length_note)
    if job.context_note:
        plan = noted(plan, job.context_note)
    engines = getattr(getattr(pipeline.planner, 'context', None), 'engines', {})
    if plan.precision in engines:
        held = job.engine_prefix.get(plan.precision, 0)
        return noted(plan, f'{held} of {len(job.prompt_ids)} prompt tokens held by '
                           f'{plan.precision} from an earlier prompt') if held else plan
    return noted(plan, prefix_note(job)) if job.prefix_tokens else plan


def noted(plan: Plan, text: str) -> Plan:
    """Return ``plan`` with ``text`` added to its note."""
    return replace(plan, note='; '.join(filter(None, [plan.note, text])))


def replanned(plan: Plan, why: str) -> Plan:
    """Return ``plan`` with the re-plan and its reason recorded in its note."""
    return noted(plan, f're-planned {why}')
