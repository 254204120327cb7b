# SPDX-License-Identifier: Apache-2.0
"""The one decode loop applies every goal's token-boundary rules, alone or batched.

The backend here is scripted (one word per step on a scripted clock), so deadlines
are exact; the loop, the lanes' protocol and the goals' rules (core.execution) are
the real ones. test_server runs the same loop on a real model.
"""

from contextlib import nullcontext

import pytest

from timebill_ros.core.deadline import DeadlineClock
from timebill_ros.core.execution import GenerationStats, JobRun, PrefillDecision
from timebill_ros.core.planning import Fallback, Plan
from timebill_ros.core.request import Mode, Outcome, OverrunPolicy, Rejection, Request
from timebill_ros.runtime.batch import LaneStep
from timebill_ros.serving.loop import DecodeLoop, generate
from timebill_ros.serving.members import Member

EOS = -1


class ScriptedClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Words:
    """A text stream: token i is the word 'wi '."""

    def push(self, token):
        return f'w{token} '


class ScriptedLane:
    """Step every sequence one word on, advancing the clock by the lane's step time."""

    exclusive = False

    def __init__(self, backend, step):
        self.backend, self.step_s, self.members = backend, step, {}

    @property
    def keys(self):
        return list(self.members)

    def __len__(self):
        return len(self.members)

    def cached_tokens(self):
        return max(self.members.values(), default=0)

    def join(self, key, cache, position):
        self.members[key] = position

    def take(self, key):
        return None, self.members.pop(key)

    def leave(self, key):
        del self.members[key]

    def discard(self, cache):
        self.backend.discarded.append(cache)

    def step(self, feed, budgets=None):
        self.backend.steps += 1
        self.backend.clock.t += self.step_s + self.backend.stalls.get(self.backend.steps, 0.0)
        out = {}
        for key, token in feed.items():
            nxt = token + 1
            if nxt == self.backend.fail_at:
                raise RuntimeError('boom')
            out[key] = LaneStep(logits=EOS if nxt >= self.backend.words else nxt)
        return out


class ScriptedPrefill:
    """A prefill of ``total`` chunks, one backend step each (runtime.prefill.PrefillRun)."""

    def __init__(self, backend, total, plan, decide):
        self.backend, self.total, self.tokens_done = backend, total, 0
        self.plan, self.decide = plan, decide

    @property
    def done(self):
        return self.tokens_done >= self.total

    @property
    def chunks_left(self):
        return self.total - self.tokens_done

    @property
    def next_chunk(self):
        return 0 if self.done else 1

    @property
    def next_chunk_extra_s(self):
        return self.backend.press_s if self.chunks_left == 1 else 0.0

    def advance(self):
        self.backend.clock.t += self.backend.step + self.next_chunk_extra_s
        self.tokens_done += 1

    def result(self):
        stats = GenerationStats(prefill_s=self.backend.step * self.total)
        decide = self.decide
        stats.plan = decide.plan_from('hidden states') if decide is not None else self.plan
        return 'cache', 0, stats

    def abandon(self):
        self.backend.abandoned += 1


class ScriptedBackend:
    """Prefill in one step; 'logits' are the token itself; int8 lanes step ``fast_step``."""

    capabilities = frozenset({'move', 'logits'})
    eos_ids = frozenset({EOS})

    def __init__(self, clock, step, words=10, fail_at=None, fast_step=None, chunks=1):
        self.clock, self.step, self.words, self.fail_at = clock, step, words, fail_at
        self.press_s = 0.0  # what a press adds to a prefill's last chunk
        self.fast_step = fast_step  # the step time after a switch of precision
        # Prefill chunks, one step each (an int, or prompt -> chunks).
        self.chunks = chunks if callable(chunks) else (lambda ids: chunks)
        self.abandoned, self.discarded = 0, []
        self.steps, self.stalls = 0, {}  # decode step number -> seconds the OS stalls it

    def begin_prefill(self, prompt_ids, plan, decide=None):
        return ScriptedPrefill(self, self.chunks(prompt_ids), plan, decide)

    def lane_key(self, plan):
        return (plan.precision,)

    def lane(self, key):
        return ScriptedLane(self, self.step if key == ('',) else self.fast_step)

    def threads(self, key):
        return nullcontext()

    def pick(self, logits):
        return logits

    def stream(self):
        return Words()


def request(policy=OverrunPolicy.KILL, budget=1.0, max_new=100):
    return Request('q', '', budget, policy, Mode.NONE, max_new, 1.0)


def run_all(backend, goals, capacity=1):
    """Run (request, plan, cancel, decide) goals in one loop, all waiting at the start."""
    results, waiting = {}, list(enumerate(goals))

    def refill(loop, before):
        if not waiting or waiting[0][1][0].budget_s >= before:  # all start at 0
            return False
        key, (req, plan, cancel, decide, seen) = waiting.pop(0)
        run = JobRun(req, plan, DeadlineClock(0.0, req.budget_s, backend.clock), cancel,
                     lambda ev, el, rem, plan: seen.append((ev.text_delta, el, rem, plan)))
        ended = run.before_start()
        if ended is not None:
            results[key] = ended
            return True
        loop.start(Member(str(key), run, req.max_new_tokens,
                          lambda result: results.__setitem__(key, result)),
                   [1, 2], plan, decide)
        return True
    while waiting:  # as the worker does: a new loop when the last one emptied
        DecodeLoop(backend, capacity).run(refill)
    return [results[key] for key in range(len(goals))]


def run(backend, req, clock, plan=Plan(), cancel=lambda: False, decide=None):
    seen = []
    result, = run_all(backend, [(req, plan, cancel, decide, seen)])
    return result, [(delta, el, rem) for delta, el, rem, _ in seen]


def test_completes_in_time_and_text_is_the_deltas():
    clock = ScriptedClock()
    result, seen = run(ScriptedBackend(clock, 0.01, words=5), request(), clock)
    assert result.outcome == Outcome.COMPLETED and result.deadline_met
    assert result.text == ''.join(d for d, _, _ in seen) == 'w0 w1 w2 w3 w4 '
    assert seen[0][2] == 1.0 - 0.01


def test_a_goal_that_ends_on_its_first_token_discards_its_cache():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.01, words=5)
    result, seen = run(backend, request(max_new=1), clock)
    assert result.outcome == Outcome.COMPLETED and result.tokens == 1
    assert backend.discarded == ['cache']  # never joined a lane: the lane frees it
    result, seen = run(backend, request(max_new=3), clock)
    assert result.tokens == 3 and backend.discarded == ['cache']


def test_kill_stops_at_first_boundary_after_deadline():
    clock = ScriptedClock()
    result, seen = run(ScriptedBackend(clock, 0.15, words=50), request(budget=1.0), clock)
    assert result.outcome == Outcome.KILLED and not result.deadline_met
    # tokens at 0.15 ... 0.9, 1.05: the next step from 0.9 ends 0.05 s past the deadline,
    # within what Kill lets a step overrun, so it runs; 1.05 is the first at/after 1.0
    assert result.tokens == 7 and result.e2e_s == pytest.approx(1.05)
    assert 'past it' in result.reason


def test_kill_stops_before_a_step_that_would_end_far_past_the_deadline():
    clock = ScriptedClock()
    result, seen = run(ScriptedBackend(clock, 0.3, words=50), request(budget=1.0), clock)
    # tokens at 0.3, 0.6, 0.9; a step from 0.9 would end 0.2 s past the deadline
    assert result.outcome == Outcome.KILLED and not result.deadline_met
    assert result.tokens == 3 and result.e2e_s == pytest.approx(0.9)
    assert '0.100 s before the deadline' in result.reason
    skip = run(ScriptedBackend(clock, 0.3, words=50), request(OverrunPolicy.SKIP_NEXT,
                                                              max_new=5), clock)[0]
    assert skip.tokens == 5  # Skip-Next runs on past the deadline


def test_one_stalled_step_does_not_make_kill_stop_ahead_of_short_steps():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.01, words=500)
    backend.stalls = {60: 0.35}  # the 60th step ends at 0.95 s instead of 0.60 s
    result, seen = run(backend, request(budget=1.0), clock)
    # The next step is expected to take 0.01 s (median of the last three), not 0.36 s:
    # the goal runs on to its first token at or after the deadline.
    assert result.outcome == Outcome.KILLED and 'past it' in result.reason
    assert seen[-2][1] < 1.0 <= seen[-1][1] < 1.0 + 0.011
    assert result.tokens > 61


def test_kill_ends_a_chunked_prefill_before_a_chunk_that_would_end_past_the_deadline():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.3, words=50, chunks=10)
    result, seen = run(backend, request(budget=1.0), clock)
    # chunks end at 0.3, 0.6, 0.9; the fourth, timed as the last (0.3 s), would end at 1.2
    assert result.outcome == Outcome.KILLED and not result.deadline_met and seen == []
    assert result.e2e_s == pytest.approx(0.9) and 'during prefill' in result.reason
    assert '3 of 10 prompt tokens' in result.reason and 'before the deadline' in result.reason
    auto = Request('q', '', 1.0, OverrunPolicy.KILL, Mode.AUTO, 100, 1.0)
    assert run(backend, auto, clock)[0].outcome == Outcome.KILLED  # in every mode


def test_kill_overruns_by_at_most_the_first_chunk_which_has_no_timing_yet():
    clock = ScriptedClock()
    result, _ = run(ScriptedBackend(clock, 0.3, words=50, chunks=10), request(budget=0.2), clock)
    assert result.outcome == Outcome.KILLED and result.e2e_s == pytest.approx(0.3)
    assert '1 of 10 prompt tokens' in result.reason and 'past it' in result.reason


def test_the_first_chunk_is_timed_from_the_plans_prefill_estimate():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.3, words=50, chunks=10)
    planned = Plan(est_prefill_s=3.0)  # 0.3 s a chunk: the first would end past 0.2 s
    result, _ = run(backend, request(budget=0.2), clock, plan=planned)
    assert result.outcome == Outcome.KILLED and result.e2e_s == pytest.approx(0.0)
    assert '0 of 10 prompt tokens' in result.reason and 'before the deadline' in result.reason
    # Fits by the estimate: it runs (and decodes) as before.
    result, _ = run(backend, request(budget=4.0, max_new=2), clock, plan=planned)
    assert result.outcome == Outcome.COMPLETED and result.deadline_met


def test_kill_counts_what_a_press_adds_to_the_last_chunk():
    def pressed(budget):
        clock = ScriptedClock()
        backend = ScriptedBackend(clock, 0.3, words=1, chunks=4)
        backend.press_s = 0.5  # the last chunk scores and compresses the whole cache
        return run(backend, request(budget=budget), clock)[0]
    # chunks end at 0.3, 0.6, 0.9; the last would end at 1.7, past 1.3 s
    result = pressed(1.3)
    assert result.outcome == Outcome.KILLED and result.e2e_s == pytest.approx(0.9)
    assert 'before the deadline' in result.reason
    result = pressed(2.5)
    assert result.outcome == Outcome.COMPLETED and result.deadline_met


def test_a_prefill_that_fits_is_not_stopped_early():
    clock = ScriptedClock()
    result, _ = run(ScriptedBackend(clock, 0.3, words=1, chunks=3), request(budget=1.25), clock)
    assert result.outcome == Outcome.COMPLETED and result.deadline_met


def test_a_long_prefill_interleaves_with_the_goals_already_decoding():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.1, words=30, chunks=len)  # a chunk per prompt token
    seen, results, waiting = {0: [], 1: []}, {}, [(0, [1]), (1, [1] * 20)]

    def refill(loop, before):
        if not waiting:
            return False
        key, prompt = waiting.pop(0)
        req = request(budget=100.0)
        run = JobRun(req, Plan(), DeadlineClock(0.0, 100.0, clock), lambda: False,
                     lambda ev, el, rem, plan: seen[key].append(el))
        loop.start(Member(str(key), run, req.max_new_tokens,
                          lambda result: results.__setitem__(key, result)), prompt, Plan())
        return True
    DecodeLoop(backend, capacity=2).run(refill)
    assert results[0].outcome == results[1].outcome == Outcome.COMPLETED
    assert len(seen[0]) == len(seen[1]) == 30
    # Goal 0 streamed a token in every round of goal 1's 20-chunk prefill, not after it.
    during = [t for t in seen[0] if t < seen[1][0]]
    assert len(during) >= 19, (seen[0][:5], seen[1][:3])
    gaps = [b - a for a, b in zip(seen[0], seen[0][1:])]
    assert max(gaps) <= 0.2 + 1e-9  # one chunk and one step between its tokens


def run_prompts(backend, goals, capacity):
    """Run (prompt, budget) goals in one loop, all waiting at the start: (seen, results)."""
    clock = backend.clock
    seen, results = {key: [] for key in range(len(goals))}, {}
    waiting = [(key, prompt, budget) for key, (prompt, budget) in enumerate(goals)]

    def refill(loop, before):
        if not waiting or waiting[0][2] >= before:  # every clock starts at 0
            return False
        key, prompt, budget = waiting.pop(0)
        req = request(budget=budget)
        run = JobRun(req, Plan(), DeadlineClock(0.0, budget, clock), lambda: False,
                     lambda ev, el, rem, plan: seen[key].append(el))
        loop.start(Member(str(key), run, req.max_new_tokens,
                          lambda result: results.__setitem__(key, result)), prompt, Plan())
        return True
    while waiting:  # as the worker does: a new loop when the last one emptied
        DecodeLoop(backend, capacity).run(refill)
    return seen, results


def test_a_short_prompt_behind_a_long_prefill_starts_within_a_chunk_and_meets_its_deadline():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.1, words=5, chunks=len)  # a chunk per prompt token
    # A 40-chunk prompt (no deadline to speak of), then a 1-chunk one with 1 s, and a
    # 30-chunk one whose 0.5 s run out while it waits: Kill ends it then, not later.
    seen, results = run_prompts(backend, [([1] * 40, 100.0), ([1], 1.0), ([1] * 30, 0.5)], 3)
    assert results[1].outcome == Outcome.COMPLETED and results[1].deadline_met
    assert seen[1][0] <= 0.1 + 1e-9  # its one chunk ran first
    assert results[2].outcome == Outcome.KILLED and 'during prefill' in results[2].reason
    assert results[2].e2e_s <= 0.5 + 0.2 + 1e-9  # within a round of its deadline
    assert results[0].outcome == Outcome.COMPLETED


def test_a_long_prefill_with_a_later_deadline_waits_for_goals_decoding_to_earlier_ones():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.1, words=8, chunks=len)
    # A long prompt, then a short goal.
    seen, results = run_prompts(backend, [([1] * 40, 100.0), ([1], 1.5)], 2)
    # 1 chunk and 8 steps of 0.1 s: interleaved with the long chunks it would need 1.7 s.
    assert results[1].outcome == Outcome.COMPLETED and results[1].deadline_met
    assert results[1].e2e_s == pytest.approx(0.9)
    assert results[0].outcome == Outcome.COMPLETED


def test_with_one_decode_place_short_goals_run_between_a_long_prompts_chunks():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.1, words=5, chunks=len)  # a chunk per prompt token
    # One place (max_batch 1): a 40-chunk prompt with a loose deadline holds it while it
    # prefills; two 1-chunk goals with 1.5 s each overtake it, one after the other.
    seen, results = run_prompts(backend, [([1] * 40, 100.0), ([1], 1.5), ([1], 1.5)], 1)
    assert results[1].outcome == results[2].outcome == Outcome.COMPLETED
    assert results[1].deadline_met and results[2].deadline_met
    assert seen[2][0] > seen[1][-1]  # one decodes at a time
    assert results[0].outcome == Outcome.COMPLETED and results[0].tokens == 5
    # The long prompt waited while they ran: its chunks, their chunks and steps.
    assert results[0].e2e_s == pytest.approx(0.1 * (40 + 2 * 6 + 5))


def test_with_one_decode_place_the_earlier_deadline_decodes_first_of_two_prefills():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.1, words=5, chunks=len)
    # Both prompts are one chunk; the second overtakes the first (earlier deadline) and
    # takes the decode place first although the first was started first.
    seen, results = run_prompts(backend, [([1], 10.0), ([1], 0.8)], 1)
    assert results[1].outcome == Outcome.COMPLETED and results[1].deadline_met
    assert seen[0][0] > seen[1][-1]
    assert results[0].deadline_met


def test_with_one_decode_place_a_later_deadline_waits_behind_a_long_prefill():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.1, words=5, chunks=len)
    # A goal with a later deadline than the prefilling one does not overtake it.
    seen, results = run_prompts(backend, [([1] * 10, 5.0), ([1], 50.0)], 1)
    assert seen[1][0] > seen[0][-1]
    assert results[0].deadline_met and results[1].deadline_met


def test_a_prefill_stopped_between_chunks_frees_what_it_holds():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.3, words=50, chunks=10)
    result, _ = run(backend, request(budget=1.0), clock)
    assert result.outcome == Outcome.KILLED and backend.abandoned == 1


def test_skip_next_prefills_every_chunk_and_admits_lateness():
    clock = ScriptedClock()
    backend = ScriptedBackend(clock, 0.3, words=2, chunks=5)
    result, _ = run(backend, request(OverrunPolicy.SKIP_NEXT), clock)
    assert result.outcome == Outcome.COMPLETED and result.tokens == 2
    assert not result.deadline_met


def test_skip_next_runs_to_the_end_and_admits_lateness():
    clock = ScriptedClock()
    result, _ = run(ScriptedBackend(clock, 0.3, words=6), request(OverrunPolicy.SKIP_NEXT), clock)
    assert result.outcome == Outcome.COMPLETED and not result.deadline_met
    assert result.tokens == 6 and 'after the deadline' in result.reason


def test_cancel_within_one_token():
    clock = ScriptedClock()
    calls = {'n': 0}

    def cancel():
        calls['n'] += 1
        return calls['n'] > 4  # checked before the start and before its prefill chunk
    result, _ = run(ScriptedBackend(clock, 0.01, words=50), request(), clock, cancel=cancel)
    assert result.outcome == Outcome.CANCELED and result.tokens == 3


def test_expired_in_queue_is_killed_without_running():
    clock = ScriptedClock()
    clock.t = 5.0
    engine = ScriptedBackend(clock, 0.01)
    result, seen = run(engine, request(budget=1.0), clock)
    assert result.outcome == Outcome.KILLED and seen == [] and result.queue_s == 5.0


def test_engine_failure_is_failed_not_raised():
    clock = ScriptedClock()
    result, _ = run(ScriptedBackend(clock, 0.01, fail_at=2), request(), clock)
    assert result.outcome == Outcome.FAILED and 'boom' in result.reason
    assert result.text == 'w0 w1 '


def test_plan_made_during_prefill_is_the_one_reported():
    clock = ScriptedClock()
    req = request()
    decided = Plan(predicted_tokens=7, predictor='probe', eviction_ratio=0.25)
    seen = []
    result, = run_all(ScriptedBackend(clock, 0.01, words=3), [(
        req, Plan(predictor='pending'), lambda: False,
        PrefillDecision(2, lambda hidden: decided), seen)])
    assert result.outcome == Outcome.COMPLETED and result.plan == decided
    assert [plan for *_, plan in seen] == [decided] * 3  # the decided plan from token 1


def test_rejection_during_prefill_ends_the_goal_as_rejected():
    clock = ScriptedClock()
    req = request()

    infeasible = Plan(predicted_tokens=200, predictor='probe', feasible=False)

    def refuse(hidden):
        raise Rejection('cannot meet the deadline: estimated worst case 9 s', infeasible)
    result, _ = run(ScriptedBackend(clock, 0.01), req, clock,
                    decide=PrefillDecision(1, refuse))
    assert result.outcome == Outcome.REJECTED and not result.deadline_met
    assert 'prefill' in result.reason and 'estimated worst case 9 s' in result.reason
    assert result.plan == infeasible  # the plan the reason cites, not the admission one


def test_a_fallback_precision_takes_over_when_the_time_left_runs_short():
    # 20 words at 0.1 s do not fit 1.3 s; at 0.02 s they do. The plan's rule switches
    # as late as still lets the fast steps finish the 20 planned tokens.
    fallback = Fallback('int8-dynamic', tokens=20, full_step_s=0.1, step_s=0.02)
    plan = Plan(mode=Mode.AUTO, fallback=fallback)
    clock = ScriptedClock()
    result, _ = run(ScriptedBackend(clock, 0.1, words=20, fast_step=0.02),
                    request(budget=1.3), clock, plan)
    assert result.outcome == Outcome.COMPLETED and result.deadline_met
    assert result.switched_to == 'int8-dynamic' and 3 <= result.switched_at <= 10
    assert 'int8-dynamic decoding from answer token' in result.reason
    assert result.step_times[:result.switched_at] == pytest.approx(
        (0.1,) * result.switched_at)
    # Without the fallback the same goal is killed at its deadline.
    clock = ScriptedClock()
    result, _ = run(ScriptedBackend(clock, 0.1, words=20, fast_step=0.02),
                    request(budget=1.3), clock, Plan(mode=Mode.AUTO))
    assert result.outcome == Outcome.KILLED and result.switched_at == -1
    # A short answer ends before the switch is due: every token at full precision.
    clock = ScriptedClock()
    result, _ = run(ScriptedBackend(clock, 0.1, words=5, fast_step=0.02),
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


def goal(policy=OverrunPolicy.KILL, budget=10.0, seen=None):
    return (request(policy, budget), Plan(), lambda: False, None, [] if seen is None else seen)


def test_goals_in_one_batch_each_stop_at_their_own_token_boundary():
    clock = ScriptedClock()
    short, long_ = goal(budget=0.25), goal(budget=10.0)
    killed, done = run_all(ScriptedBackend(clock, 0.1, words=8), [short, long_], capacity=2)
    # The short one prefills and steps (tokens at 0.1 and 0.2) while the long one waits
    # for its one-chunk prefill (0.2-0.3); the next shared step ends at 0.4, past 0.25.
    assert killed.outcome == Outcome.KILLED and killed.tokens == 3
    assert killed.e2e_s == pytest.approx(0.4)
    assert done.outcome == Outcome.COMPLETED and done.text == ''.join(f'w{i} ' for i in range(8))
    assert killed.batch_peak == 2 and done.batch_peak == 2
    # One step serves both (no step counted twice): 7 more words and the end of answer.
    assert sum(done.step_times) == pytest.approx(0.1 * 8)


def test_a_skip_next_goal_decodes_alone_until_it_ends():
    clock = ScriptedClock()
    first_seen, second_seen = [], []
    over = goal(OverrunPolicy.SKIP_NEXT, budget=0.2, seen=first_seen)
    first, second = run_all(ScriptedBackend(clock, 0.1, words=5),
                            [over, goal(seen=second_seen)], capacity=3)
    assert first.outcome == Outcome.COMPLETED and not first.deadline_met
    assert first.batch_peak == 1 and second.batch_peak == 1  # nobody joined it
    assert second_seen[0][1] > first.e2e_s  # the next one started after it ended


def test_generate_runs_one_prompt_alone_and_raises_engine_failures():
    clock = ScriptedClock()
    tokens = []
    stats = generate(ScriptedBackend(clock, 0.1, words=4), [1, 2], 10, Plan(),
                     lambda event: tokens.append(event.token_id) or True)
    assert tokens == [0, 1, 2, 3] and stats.stop == 'eos' and len(stats.step_times) == 4
    with pytest.raises(RuntimeError, match='boom'):
        generate(ScriptedBackend(clock, 0.1, fail_at=2), [1, 2], 10, Plan(), lambda e: True)
