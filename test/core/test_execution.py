"""run_job applies the deadline rules per token around any engine."""

from timebill_ros.core.deadline import DeadlineClock
from timebill_ros.core.execution import GenerationStats, PrefillDecision, run_job, TokenEvent
from timebill_ros.core.planning import Fallback, Plan
from timebill_ros.core.request import Mode, Outcome, OverrunPolicy, Rejection, Request


class ScriptedClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class StepEngine:
    """Emit one word per step, advancing a scripted clock by ``step`` seconds."""

    def __init__(self, clock, step, words=10, fail_at=None, fast_step=None):
        self.clock, self.step, self.words, self.fail_at = clock, step, words, fail_at
        self.fast_step = fast_step  # the step time after a switch of precision

    def generate(self, prompt_ids, max_new_tokens, plan, on_token, token_budget=None,
                 decide=None, switch=None):
        stats = GenerationStats(prefill_s=self.step)
        if decide is not None:  # as the real engine: the plan is made inside prefill
            stats.plan = decide.plan_from('hidden states')
        self.clock.t += self.step
        step = self.step
        for i in range(min(self.words, max_new_tokens)):
            if i == self.fail_at:
                raise RuntimeError('boom')
            stats.tokens += 1
            if not on_token(TokenEvent(i, i, f'w{i} ', self.clock.t)):
                stats.stop = 'stopped'
                return stats
            if switch is not None and stats.switched_at < 0 and switch(i):
                stats.switched_at, stats.switched_to, step = i, switch(i), self.fast_step
            self.clock.t += step
            stats.step_times.append(step)
        stats.stop = 'eos'
        return stats


def request(policy=OverrunPolicy.KILL, budget=1.0, max_new=100):
    return Request('q', '', budget, policy, Mode.NONE, max_new, 1.0)


def run(engine, req, clock, plan=Plan(), cancel=lambda: False):
    seen = []
    result = run_job(engine, [1, 2], req, plan, DeadlineClock(0.0, req.budget_s, clock),
                     cancel, lambda ev, el, rem, plan: seen.append((ev.text_delta, el, rem)))
    return result, seen


def test_completes_in_time_and_text_is_the_deltas():
    clock = ScriptedClock()
    result, seen = run(StepEngine(clock, 0.01, words=5), request(), clock)
    assert result.outcome == Outcome.COMPLETED and result.deadline_met
    assert result.text == ''.join(d for d, _, _ in seen) == 'w0 w1 w2 w3 w4 '
    assert seen[0][2] == 1.0 - 0.01


def test_kill_stops_at_first_boundary_after_deadline():
    clock = ScriptedClock()
    result, seen = run(StepEngine(clock, 0.3, words=50), request(budget=1.0), clock)
    assert result.outcome == Outcome.KILLED and not result.deadline_met
    # tokens at t=0.3, 0.6, 0.9, 1.2: the one at 1.2 is the first at/after 1.0
    assert result.tokens == 4 and result.e2e_s == 1.2


def test_skip_next_runs_to_the_end_and_admits_lateness():
    clock = ScriptedClock()
    result, _ = run(StepEngine(clock, 0.3, words=6), request(OverrunPolicy.SKIP_NEXT), clock)
    assert result.outcome == Outcome.COMPLETED and not result.deadline_met
    assert result.tokens == 6 and 'after the deadline' in result.reason


def test_cancel_within_one_token():
    clock = ScriptedClock()
    calls = {'n': 0}

    def cancel():
        calls['n'] += 1
        return calls['n'] > 3  # first check is before the start
    result, _ = run(StepEngine(clock, 0.01, words=50), request(), clock, cancel=cancel)
    assert result.outcome == Outcome.CANCELED and result.tokens == 3


def test_expired_in_queue_is_killed_without_running():
    clock = ScriptedClock()
    clock.t = 5.0
    engine = StepEngine(clock, 0.01)
    result, seen = run(engine, request(budget=1.0), clock)
    assert result.outcome == Outcome.KILLED and seen == [] and result.queue_s == 5.0


def test_engine_failure_is_failed_not_raised():
    clock = ScriptedClock()
    result, _ = run(StepEngine(clock, 0.01, fail_at=2), request(), clock)
    assert result.outcome == Outcome.FAILED and 'boom' in result.reason
    assert result.text == 'w0 w1 '


def test_plan_made_during_prefill_is_the_one_reported():
    clock = ScriptedClock()
    req = request()
    decided = Plan(predicted_tokens=7, predictor='probe', eviction_ratio=0.25)
    plans = []
    result = run_job(StepEngine(clock, 0.01, words=3), [1, 2], req, Plan(predictor='pending'),
                     DeadlineClock(0.0, req.budget_s, clock), lambda: False,
                     lambda ev, el, rem, plan: plans.append(plan),
                     PrefillDecision(2, lambda hidden: decided))
    assert result.outcome == Outcome.COMPLETED and result.plan == decided
    assert plans == [decided] * 3  # feedback carries the decided plan from the first token


def test_rejection_during_prefill_ends_the_goal_as_rejected():
    clock = ScriptedClock()
    req = request()

    infeasible = Plan(predicted_tokens=200, predictor='probe', feasible=False)

    def refuse(hidden):
        raise Rejection('cannot meet the deadline: estimated worst case 9 s', infeasible)
    result = run_job(StepEngine(clock, 0.01), [1, 2], req, Plan(),
                     DeadlineClock(0.0, req.budget_s, clock), lambda: False,
                     lambda *args: None, PrefillDecision(1, refuse))
    assert result.outcome == Outcome.REJECTED and not result.deadline_met
    assert 'prefill' in result.reason and 'estimated worst case 9 s' in result.reason
    assert result.plan == infeasible  # the plan the reason cites, not the admission one


def test_a_fallback_precision_takes_over_when_the_time_left_runs_short():
    # 20 words at 0.1 s do not fit 1.3 s; at 0.02 s they do. The plan's rule switches
    # as late as still lets the fast steps finish the 20 planned tokens.
    fallback = Fallback('int8-dynamic', tokens=20, full_step_s=0.1, step_s=0.02)
    plan = Plan(mode=Mode.AUTO, fallback=fallback)
    clock = ScriptedClock()
    result, _ = run(StepEngine(clock, 0.1, words=20, fast_step=0.02),
                    request(budget=1.3), clock, plan)
    assert result.outcome == Outcome.COMPLETED and result.deadline_met
    assert result.switched_to == 'int8-dynamic' and 3 <= result.switched_at <= 10
    assert 'int8-dynamic decoding from answer token' in result.reason
    assert result.step_times[:result.switched_at] == (0.1,) * result.switched_at
    # Without the fallback the same goal is killed at its deadline.
    clock = ScriptedClock()
    result, _ = run(StepEngine(clock, 0.1, words=20, fast_step=0.02),
                    request(budget=1.3), clock, Plan(mode=Mode.AUTO))
    assert result.outcome == Outcome.KILLED and result.switched_at == -1
    # A short answer ends before the switch is due: every token at full precision.
    clock = ScriptedClock()
    result, _ = run(StepEngine(clock, 0.1, words=5, fast_step=0.02),
                    request(budget=1.3), clock, plan)
    assert result.deadline_met and result.switched_at == -1


def test_fallback_rule_counts_the_tokens_still_to_come():
    rule = Fallback('int8', tokens=10, full_step_s=0.1, step_s=0.01, margin=0.5)
    # Step 0 then 8 fast steps: (0.1 + 0.08) / 0.5 = 0.36 s needed.
    assert rule.due(0, 0.35) and not rule.due(0, 0.37)
    # Past the planned tokens only one more full step must fit.
    assert not rule.due(50, 0.21) and rule.due(50, 0.19)
    # With a predicted length of 4, only its 2 tokens still to come count at step 0 ...
    bet = Fallback('int8', tokens=10, full_step_s=0.1, step_s=0.01, margin=0.5, expected=4)
    assert not bet.due(0, 0.25) and bet.due(0, 0.23)  # (0.1 + 0.02) / 0.5 = 0.24 s
    # ... and once the answer runs past it, the planned 10 again.
    assert bet.due(3, 0.29) and not bet.due(2, 0.29)  # (0.1 + 5 x 0.01) / 0.5 = 0.3 s
