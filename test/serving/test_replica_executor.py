# SPDX-License-Identifier: Apache-2.0
"""The replica executor: its length basis (decided once per goal), results, refusals."""

import pytest

from timebill_ros.core.config import NodeConfig
from timebill_ros.core.deadline import DeadlineClock
from timebill_ros.core.planning import Plan
from timebill_ros.core.request import Mode, OverrunPolicy, Request
from timebill_ros.runtime.predictor import SHIPPED_HEAD, text_predictor
from timebill_ros.serving.jobs import Job
from timebill_ros.serving.replica_executor import replica_server


@pytest.fixture(scope='module')
def predictor():
    return text_predictor('text')


def _executor(predictor=None, tokenizer=None):
    """Return the replica executor of a server over an unreachable replica."""
    return replica_server(NodeConfig(vllm_endpoints='http://127.0.0.1:9'), tokenizer, None,
                          predictor=predictor).executor


def _job(instruction: str, cap: int = 128, context: str = '') -> Job:
    request = Request(instruction, context, 10.0, OverrunPolicy.KILL, Mode.AUTO, cap, 1.0)
    return Job('k', request, [0] * 40, DeadlineClock.start(10.0), Plan())


def test_the_choice_names_a_text_head_or_the_recent_answers(predictor):
    assert text_predictor('none') is None
    assert predictor.name.startswith('rlp-text') and predictor.distribution is not None
    with pytest.raises(ValueError, match='a text head has minilm features'):
        text_predictor(str(SHIPPED_HEAD))  # reads the local model's layer 24


def test_a_goal_is_planned_on_its_own_prediction_once(predictor):
    server = _executor(predictor)
    short = _job('Answer with one word, STOP or GO: the crosswalk light is red.')
    long = _job('Write a JSON list of ten waypoints, each with x, y and heading, for a '
                'patrol around the warehouse.')
    short_basis, long_basis = server._length_basis(short), server._length_basis(long)
    assert short_basis.predictor == long_basis.predictor == predictor.name
    assert 1 <= short_basis.predicted < long_basis.predicted <= 128
    # Without a predictor: the recent answers (none yet: their mean).
    recent = _executor()
    assert recent._length_basis(short).predictor == 'recent answers'


def test_a_prediction_past_the_labels_cap_has_no_distribution(predictor):
    from timebill_ros.evaluation import robot_workload
    json_item = next(i for i in robot_workload.load('train') if i.kind == 'json')
    within, dist = predictor.calibrated(_job(json_item.instruction, cap=100).request, 40)
    assert 1 <= within <= 100 and dist.source == predictor.name
    # JSON commands run to the labels' cap (128): with a cap of 1000, to 1000.
    past, dist = predictor.calibrated(_job(json_item.instruction, cap=1000).request, 40)
    assert past == 1000 and dist is None


class AtTheCap:
    """A predictor saying 'runs to the cap' (its labels' cap: 128), as HeadPredictor does."""

    name, distribution = 'at-the-cap', object()

    def calibrated(self, request, prompt_tokens):
        cap = request.max_new_tokens
        return cap, (self.distribution if cap <= 128 else None)


def test_a_prediction_past_the_labels_cap_plans_for_the_goals_cap():
    server = _executor(AtTheCap())
    basis = server._length_basis(_job('Write an essay.', cap=1000))
    assert basis.spread is None and basis.typical == basis.predicted == 1000
    within = server._length_basis(_job('Write an essay.', cap=100))
    assert within.spread is AtTheCap.distribution and within.predicted == 100


def test_a_goal_no_replica_can_finish_after_its_replica_failed_is_killed_not_failed():
    from timebill_ros.core.execution import JobRun
    from timebill_ros.core.request import Outcome
    from timebill_ros.serving.remote import RemoteAnswer
    job = _job('Go?')
    now = job.clock.now()
    why = ('replica http://a:1 failed after 12 tokens: RemoteProtocolError; not moved: no '
           'replica is predicted to answer in time')
    answer = RemoteAnswer(text='Stop at the', tokens=12, ended='killed', error=why,
                          started=now - 1.0, finished=now)
    run = JobRun(job.request, job.plan, job.clock, lambda: False, lambda *args: None)
    result = _executor()._result(job, run, 'http://a:1', answer, [])
    assert result.outcome == Outcome.KILLED and not result.deadline_met
    assert result.reason.startswith('killed ') and 's before the deadline after 12 tokens: '\
        'replica http://a:1 failed' in result.reason and result.text == 'Stop at the'


class Slowed:
    """The shipped text head on a machine too busy to run it in 0.3 s."""

    def __init__(self, predictor):
        self.predictor, self.name = predictor, predictor.name
        self.distribution = predictor.distribution

    def calibrated(self, request, prompt_tokens):
        import time
        time.sleep(0.3)
        return self.predictor.calibrated(request, prompt_tokens)


def test_a_refusal_says_when_admission_itself_took_the_budget(predictor):
    # CI at stop 45: 11 of 12 goals refused with '-0.117 s left' and no word of why.
    from timebill_ros.core.request import GoalSpec, Rejection
    from timebill_ros.runtime.model import load_tokenizer
    tokenizer, _ = load_tokenizer('embedded')
    server = replica_server(NodeConfig(vllm_endpoints='http://127.0.0.1:9'), tokenizer, None,
                            predictor=Slowed(predictor))
    with pytest.raises(Rejection, match=r'admission itself took 0\.[3-9]\d* s of the budget'):
        server.admit(GoalSpec('Stop or go?', budget_s=0.2, max_new_tokens=8), 'late')
    # Planned on the recent answers (no encoder to run): admission takes a millisecond.
    quick = replica_server(NodeConfig(vllm_endpoints='http://127.0.0.1:9'), tokenizer, None)
    with pytest.raises(Rejection) as refused:
        quick.admit(GoalSpec('Stop or go?', budget_s=0.001, max_new_tokens=8), 'hopeless')
    assert 'admission itself' not in str(refused.value)
