"""Admission's dispatch rule: under load, a goal unlikely to fit yields to those waiting."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from timebill_ros.core.config import NodeConfig
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import GoalSpec, Limits, Rejection, validate
from timebill_ros.serving.admission import Admission


class Waiting:
    """The one thing the rule asks of dispatch: how many goals wait."""

    def __init__(self, count):
        self.count = count

    def waiting(self):
        return self.count


def admission(waiting: int, **params) -> Admission:
    server = SimpleNamespace(config=NodeConfig.from_dict(params), dispatch=Waiting(waiting))
    return Admission(server)


FREE = validate(GoalSpec(instruction='Stop at the next junction.', budget_s=2.0), Limits())
SCHEMA = replace(FREE, output=validate(GoalSpec(
    instruction='x', budget_s=2.0, json_schema='{"type": "object"}'), Limits()).output)


def test_an_unlikely_goal_yields_only_while_others_wait():
    unlikely = Plan(fit_probability=0.2)
    with pytest.raises(Rejection, match=r'P\(answer fits the 0.400 s left\) = 20%.*3 goals'):
        admission(3).yield_if_unlikely(FREE, unlikely, 0.4)
    admission(0).yield_if_unlikely(FREE, unlikely, 0.4)  # nobody waits: it runs
    admission(3).yield_if_unlikely(FREE, Plan(fit_probability=0.6), 0.4)  # likely: it runs
    admission(3, dispatch_probability=0.0).yield_if_unlikely(FREE, unlikely, 0.4)  # off


def test_a_schema_goal_the_closure_completes_is_served():
    assert SCHEMA.output.constrained
    admission(3).yield_if_unlikely(SCHEMA, Plan(fit_probability=0.1), 0.4)
    with pytest.raises(Rejection):
        admission(3, deadline_closure=False).yield_if_unlikely(
            SCHEMA, Plan(fit_probability=0.1), 0.4)
