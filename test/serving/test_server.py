# SPDX-License-Identifier: Apache-2.0
"""The serving core without ROS: admission, schedulers, cancel, Skip-Next (tiny model)."""

from dataclasses import replace
import json
import re
import threading

import pytest

from conftest import Log
from timebill_ros.core.config import NodeConfig
from timebill_ros.core.planning import Plan
from timebill_ros.core.precision import pick_int8
from timebill_ros.core.profile import Int8Pick, Profile
from timebill_ros.core.request import GoalSpec, Mode, Outcome, OverrunPolicy, Rejection
from timebill_ros.runtime.model import load_model, prompt_ids
from timebill_ros.serving.assembly import Assembly
from timebill_ros.serving.jobs import JobHooks
from timebill_ros.serving.loop import DecodeLoop, generate
from timebill_ros.serving.members import Member, Prefilling
from timebill_ros.serving.local_executor import local_server
from timebill_ros.serving.warmup import Warmup


@pytest.fixture(scope='module')
def loaded():
    return load_model('tiny-random')


def make_server(loaded, scheduler='fifo', queue_length=8):
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '',
        'queue_length': queue_length, 'scheduler': scheduler})
    finished = []
    server = local_server(
        Assembly(config, loaded, Log()),
        lambda job, result, estimate, error: finished.append((job.key, result)), scheduler)
    return server, finished


def spec(budget=30.0, tokens=3, policy=OverrunPolicy.KILL):
    return GoalSpec('Report the battery level.', budget_s=budget, mode=int(Mode.NONE),
                    max_new_tokens=tokens, overrun_policy=int(policy))


def wait_executing(server, timeout=30.0):
    """Wait until the worker has taken a job (it may be blocked on the model lock)."""
    pause = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if server.status()[1]['executing']:
            return
        pause.wait(0.01)
    raise AssertionError('the worker never took a job')


def wait_all(jobs, timeout=60.0):
    for job in jobs:
        assert job.done.wait(timeout), f'{job.key} never finished'


def test_every_submitted_goal_finishes_and_is_reported_once(loaded):
    server, finished = make_server(loaded)
    try:
        jobs = [server.admit(spec(), f'g{i}') for i in range(5)]
        for job in jobs:
            server.submit(job)
        wait_all(jobs)
        assert sorted(key for key, _ in finished) == [f'g{i}' for i in range(5)]
        assert all(r.outcome == Outcome.COMPLETED and r.deadline_met for _, r in finished)
        assert all(job.result.tokens == 3 for job in jobs)
    finally:
        server.stop()


def test_a_queued_kill_goal_ends_at_its_deadline_while_the_model_is_held(loaded):
    server, finished = make_server(loaded, 'edf')
    try:
        with server.executor.assembly.model_lock:  # the worker holds a goal it cannot run yet
            server.submit(server.admit(spec(60.0), 'first'))
            wait_executing(server)
            kill = server.admit(spec(0.5), 'kill')
            skip = server.admit(spec(0.5, policy=OverrunPolicy.SKIP_NEXT), 'skip')
            server.submit(kill)
            server.submit(skip)
            assert kill.done.wait(5.0), 'a queued Kill goal outlived its deadline'
            assert kill.result.outcome == Outcome.KILLED and not kill.result.deadline_met
            assert 'while queued' in kill.result.reason
            assert kill.result.e2e_s <= 0.5 + 0.1, kill.result.e2e_s
            assert not skip.done.is_set()  # Skip-Next may run late: it stays queued
        assert skip.done.wait(60.0) and skip.result.tokens > 0
        assert [key for key, _ in finished].count('kill') == 1
    finally:
        server.stop(timeout_s=30.0)


def test_edf_runs_the_earliest_deadline_first_while_fifo_keeps_arrival_order(loaded):
    # The worker holds 'first' (25 s) before its prefill: under EDF an earlier deadline
    # overtakes it there, a later one waits; FIFO keeps arrival order.
    for name, expected in (('fifo', ['first', 'late', 'soon', 'mid']),
                           ('edf', ['soon', 'first', 'mid', 'late'])):
        server, finished = make_server(loaded, name)
        try:
            with server.executor.assembly.model_lock:  # the worker waits: all three queue up
                jobs = [server.admit(spec(budget), key)
                        for key, budget in (('late', 50.0), ('soon', 20.0), ('mid', 30.0))]
                blocker = server.admit(spec(25.0), 'first')
                server.submit(blocker)
                wait_executing(server)
                for job in jobs:
                    server.submit(job)
            wait_all([blocker, *jobs])
            assert [key for key, _ in finished] == expected
        finally:
            server.stop()


def test_a_queued_goal_is_canceled_at_once_and_a_running_one_at_a_token(loaded):
    server, finished = make_server(loaded)
    try:
        flags = {'running': False}
        started = []
        with server.executor.assembly.model_lock:
            running = server.admit(spec(tokens=1000, budget=60.0), 'running')
            server.submit(running, JobHooks(cancel_requested=lambda: flags['running']))
            queued = server.admit(spec(), 'queued')
            server.submit(queued, JobHooks(on_start=lambda: started.append('queued')))
            assert server.cancel('queued') and not server.cancel('queued')
        assert queued.done.is_set() and queued.result.outcome == Outcome.CANCELED
        assert started == ['queued']  # the caller's goal handle may now report it
        flags['running'] = True
        wait_all([running])
        assert running.result.outcome == Outcome.CANCELED and running.result.tokens < 1000
    finally:
        server.stop()


def test_skip_next_skips_the_goal_dispatched_next_under_edf(loaded):
    server, finished = make_server(loaded, 'edf')
    try:
        with server.executor.assembly.model_lock:
            # Runs first and overruns its deadline with Skip-Next.
            over = server.admit(spec(budget=0.05, tokens=200, policy=OverrunPolicy.SKIP_NEXT),
                                'overrun')
            server.submit(over)
            wait_executing(server)
            late = server.admit(spec(budget=50.0), 'arrived-first')
            soon = server.admit(spec(budget=20.0), 'earliest-deadline')
            server.submit(late)
            server.submit(soon)
        wait_all([over, late, soon])
        outcomes = {key: r.outcome for key, r in finished}
        assert outcomes['overrun'] == Outcome.COMPLETED  # late, but Skip-Next lets it finish
        assert not over.result.deadline_met
        assert outcomes['earliest-deadline'] == Outcome.SKIPPED
        assert outcomes['arrived-first'] == Outcome.COMPLETED
    finally:
        server.stop()


def test_a_full_queue_rejects_with_the_reason_and_held_places_count(loaded):
    server, _ = make_server(loaded, queue_length=2)
    try:
        with server.executor.assembly.model_lock:
            first = server.admit(spec(), 'a')
            server.submit(first)
            wait_executing(server)
            server.admit(spec(), 'b')  # accepted by DDS (its place held), not yet started
            server.submit(server.admit(spec(), 'c'))
            with pytest.raises(Rejection, match='queue full'):
                server.submit(server.admit(spec(), 'd'))
            server.start('b', JobHooks())
        with pytest.raises(Rejection, match='budget must be > 0'):
            server.admit(spec(budget=0.0), 'bad')
    finally:
        server.stop()


def synthetic_server(loaded, path, scheduler='edf', **params):
    """Return a server on the profile at ``path`` (no calibration, no warm-up, no RLP)."""
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'profile': str(path),
        'scheduler': scheduler, **params})
    return local_server(Assembly(config, loaded, Log()), lambda *args: None, scheduler)


def profiled_server(loaded, tmp_path, make_profile, scheduler, **extra):
    """Return a server whose ETE says 10 ms prefill and 100 ms per decode step."""
    make_profile(step_s=0.1).save(tmp_path / 'tiny.yaml')
    return synthetic_server(loaded, tmp_path / 'tiny.yaml', scheduler, **extra)


def hold_worker(server, policy=OverrunPolicy.KILL):
    """Submit a 50-token goal (4.91 s by the ETE) and wait until the worker holds it."""
    server.submit(server.admit(GoalSpec('Go.', budget_s=60.0, mode=int(Mode.AUTO),
                                        max_new_tokens=50, overrun_policy=int(policy)),
                               'long'))
    wait_executing(server)


def test_without_the_wait_check_a_goal_is_judged_on_an_idle_node_and_killed_if_late(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf',
                             queue_aware_admission=False)
    auto = int(Mode.AUTO)
    try:
        with server.executor.assembly.model_lock:
            hold_worker(server)
            # 2 s fits 5 tokens on an idle node: accepted although ~4.9 s of work is ahead.
            late = server.admit(GoalSpec('Go.', budget_s=2.0, mode=auto, max_new_tokens=5),
                                'late')
            server.submit(late)
            # What cannot make it even alone is still refused.
            with pytest.raises(Rejection, match='cannot meet the deadline'):
                server.admit(GoalSpec('Go.', budget_s=1.0, mode=auto, max_new_tokens=50),
                             'hopeless')
            late.done.wait(3.0)  # the model is held: its deadline passes in the queue
        assert late.done.wait(30.0)
        # Ended with a reason when it left the queue: killed, or refused by the re-plan.
        assert late.result.outcome in (Outcome.KILLED, Outcome.REJECTED)
        assert 'in queue' in late.result.reason or 'while queued' in late.result.reason
    finally:
        server.stop(timeout_s=30.0)


def test_a_goal_expected_to_miss_yields_before_its_prefill_only_while_others_wait(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf')
    auto = int(Mode.AUTO)
    try:
        with server.executor.assembly.model_lock:  # nothing runs, so the ETE keeps its profile
            hold_worker(server)
            # Fits alone (8 tokens: ~0.81 s by the ETE): accepted on an idle node.
            late = server.admit(GoalSpec('Go.', budget_s=1.5, mode=auto, max_new_tokens=8),
                                'late')
            threading.Event().wait(0.9)  # 0.6 s left: it is expected to miss
            yielding = server.executor.admission.yield_if_late
            yielding(server.executor.pipeline, late)  # nobody waits: it would run
            server.submit(server.admit(GoalSpec('Go.', budget_s=20.0, mode=auto,
                                                max_new_tokens=2), 'behind'))
            with pytest.raises(Rejection, match=r'expected 0\.7\d+ s .* with 0\.[0-6]\d* s '
                                                r'left and 1 goals waiting'):
                yielding(server.executor.pipeline, late)
            server.reconfigure(replace(server.config, yield_when_late=False))  # (live)
            yielding(server.executor.pipeline, late)
    finally:
        server.stop(timeout_s=30.0)


def test_a_goal_not_even_its_fastest_option_serves_in_time_is_refused_as_it_starts(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf')
    auto = int(Mode.AUTO)
    try:
        with server.executor.assembly.model_lock:
            hold_worker(server)
            late = server.admit(GoalSpec('Go.', budget_s=1.5, mode=auto, max_new_tokens=8),
                                'late')
            server.submit(server.admit(GoalSpec('Go.', budget_s=20.0, mode=auto,
                                                max_new_tokens=2), 'behind'))
            threading.Event().wait(0.9)  # 0.6 s left, under its only option's ~0.8 s
            with pytest.raises(Rejection, match=r'expected 0\.\d+ s on its fastest option '
                                                r'\(the full model\) with 0\.[0-6]\d* s left '
                                                r'and 1 goals waiting'):
                server.executor.admission.plan_at_start(server.executor.pipeline, late)
    finally:
        server.stop(timeout_s=30.0)


def test_a_goal_starting_under_a_stream_of_arrivals_leaves_room_for_the_next_ones(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf')
    auto, share = int(Mode.AUTO), server.executor.admission.share
    try:
        stream = [server.admit(GoalSpec('Go.', budget_s=3.0, mode=auto, max_new_tokens=2),
                               f'stream{k}') for k in range(9)]
        for job in stream:  # nine 0.21-s goals within a second: ~2 s of work a second
            server.submit(job)
        wait_all(stream)
        slow = server.admit(GoalSpec('Go.', budget_s=30.0, mode=auto, max_new_tokens=8),
                            'slow')
        pipeline = server.executor.pipeline
        # None waits, yet the goals the stream says are coming bind its plan.
        seconds, why, _ = share.of(pipeline, slow)
        assert re.search(r'of the 0 goals waiting and \d+ expected at the recent '
                         r'\d+\.\d goals/s meet on their fastest options', why), why
        assert seconds < 5.0
        # Without the window an idle node leaves the goal its own deadline.
        server.reconfigure(replace(server.config, arrival_window_s=0.0))
        assert share.of(pipeline, slow) is None
    finally:
        server.stop(timeout_s=30.0)


def test_admission_counts_the_expected_wait_and_protects_accepted_goals(loaded, tmp_path,
                                                                        synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf',
                             queue_aware_admission=True)
    auto = int(Mode.AUTO)
    try:
        with server.executor.assembly.model_lock:
            hold_worker(server)
            # 2 s cannot wait ~4.9 s: refused, with the wait in the reason.
            with pytest.raises(Rejection, match=r'after an expected 4\.\d+ s wait behind 1'):
                server.submit(server.admit(GoalSpec('Go.', budget_s=2.0, mode=auto,
                                                    max_new_tokens=5), 'hopeless'))
            # 6 s fits after the wait (ends ~5.3 s in).
            server.submit(server.admit(GoalSpec('Go.', budget_s=6.0, mode=auto,
                                                max_new_tokens=5), 'fits'))
            # An earlier deadline would overtake it under EDF and end it at ~6.2 s: refused.
            pushed = (r'push 1 accepted goal\(s\) past their deadlines: '
                      r'fits \(would end in 6\.\d+ s with [56]\.\d+ s left\)')
            with pytest.raises(Rejection, match=pushed):
                server.submit(server.admit(GoalSpec('Go.', budget_s=5.9, mode=int(Mode.NONE),
                                                    max_new_tokens=10), 'pusher'))
            # Later deadlines queue behind without harm.
            server.submit(server.admit(GoalSpec('Go.', budget_s=30.0, mode=int(Mode.NONE),
                                                max_new_tokens=10), 'patient'))
    finally:
        server.stop(timeout_s=30.0)


def test_admission_lets_an_earlier_deadline_overtake_a_goal_still_prefilling(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf',
                             queue_aware_admission=True)
    auto = int(Mode.AUTO)
    engine = server.executor.pipeline.engine
    try:
        with server.executor.assembly.model_lock:
            hold_worker(server)  # 'long': ~4.9 s of work, 60 s budget
            # As the loop holds it while its prompt is prefilled (no chunk run yet).
            loop = DecodeLoop(engine, 1)
            prefill = engine.begin_prefill(prompt_ids(loaded.tokenizer, 'Go.'), Plan())
            loop.prefilling.append(Prefilling(Member('long', None, 50, lambda r: None),
                                              prefill))
            server.executor.dispatch.loop = loop
            # 2 s fits: it starts between the long prompt's chunks, not after its answer.
            short = server.admit(GoalSpec('Go.', budget_s=2.0, mode=auto, max_new_tokens=5),
                                 'short')
            assert 'wait' not in short.plan.note, short.plan.note
            server.submit(short)
            # A later deadline than the prefilling goal's waits for it all the same.
            with pytest.raises(Rejection, match=r'after an expected [4-9]\.\d+ s wait'):
                server.admit(GoalSpec('Go.', budget_s=61.0, mode=auto, max_new_tokens=600),
                             'later')
            server.executor.dispatch.loop = None
            prefill.abandon()
        assert short.done.wait(30.0)
    finally:
        server.stop(timeout_s=30.0)


def test_the_plan_service_answers_as_admission_does_with_goals_waiting(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf',
                             queue_aware_admission=True)
    auto, none = int(Mode.AUTO), int(Mode.NONE)

    def outcome(admit):
        """Return (accepted, reason without its figures, the plan's cut) and the job."""
        try:
            job = admit()
        except Rejection as exc:
            return (False, re.sub(r'[0-9.]+', '#', exc.reason), None), None
        plan = job.plan
        return (True, '', (plan.mode, plan.eviction_ratio, plan.precision,
                           plan.worst_case_tokens)), job
    goals = {'hopeless': GoalSpec('Go.', budget_s=2.0, mode=auto, max_new_tokens=5),
             'pusher': GoalSpec('Go.', budget_s=5.9, mode=none, max_new_tokens=10),
             'patient': GoalSpec('Go.', budget_s=30.0, mode=auto, max_new_tokens=10)}
    try:
        with server.executor.assembly.model_lock:
            hold_worker(server)
            server.submit(server.admit(GoalSpec('Go.', budget_s=6.0, mode=auto,
                                                max_new_tokens=5), 'fits'))
            answers = []
            for key, goal in goals.items():
                dry, _ = outcome(lambda: server.dry_run(goal))
                real, job = outcome(lambda: server.admit(goal, key))
                assert dry == real, key
                answers.append(dry[0])
                if job is not None:
                    server.submit(job)
            # The queue decided: the wait refused one, protecting 'fits' another.
            assert answers == [False, False, True]
            assert not server.held  # a dry run holds no place
    finally:
        server.stop(timeout_s=30.0)


def test_batched_goals_join_leave_and_answer_as_they_would_alone(loaded):
    prompts = ['Stop or go?', 'Report the battery level.', 'Describe the route ahead.',
               'Is the dock free?']
    solo, _ = make_server(loaded)
    try:
        alone = []
        for i, text in enumerate(prompts):
            job = solo.admit(GoalSpec(text, budget_s=60.0, mode=int(Mode.NONE),
                                      max_new_tokens=6 + i), f's{i}')
            solo.submit(job)
            wait_all([job])
            alone.append(job.result.text)
    finally:
        solo.stop()
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'max_batch': 4})
    batched = local_server(Assembly(config, loaded, Log()), lambda *args: None)
    try:
        with batched.executor.assembly.model_lock:  # all four queue, then join the first one
            jobs = [batched.admit(GoalSpec(text, budget_s=60.0, mode=int(Mode.NONE),
                                           max_new_tokens=6 + i), f'b{i}')
                    for i, text in enumerate(prompts)]
            for job in jobs:
                batched.submit(job)
        wait_all(jobs)
        assert [job.result.text for job in jobs] == alone
        assert all(job.result.outcome == Outcome.COMPLETED for job in jobs)
        assert max(job.result.batch_peak for job in jobs) == 4
        # Each leaves when its own answer ends (6, 7, 8, 9 tokens).
        assert [job.result.tokens for job in jobs] == [6, 7, 8, 9]
        # A goal killed at its deadline leaves the batch; the others carry on.
        with batched.executor.assembly.model_lock:
            long = batched.admit(GoalSpec('Go on.', budget_s=60.0, mode=int(Mode.NONE),
                                          max_new_tokens=400), 'long')
            short = batched.admit(GoalSpec('Go on.', budget_s=0.3, mode=int(Mode.NONE),
                                           max_new_tokens=1000), 'short')
            batched.submit(long)
            batched.submit(short)
        wait_all([long, short])
        assert short.result.outcome == Outcome.KILLED
        assert long.result.outcome == Outcome.COMPLETED and long.result.tokens == 400
    finally:
        batched.stop()


def batch_server(loaded, tmp_path, make_profile,
                 batch_coefficients=((0.0, 0.1), (0.0, 0.12), (0.0, 0.14), (0.0, 0.16))):
    """Return a max_batch 4 server: 10 ms prefill, 100 ms alone, 120/140/160 ms batched."""
    path = tmp_path / 'tiny-batch.yaml'
    make_profile(step_s=0.1, batch=batch_coefficients).save(path)
    return synthetic_server(loaded, path, max_batch=4, queue_aware_admission=True)


def test_admission_plans_a_goal_on_the_steps_of_the_batch_it_joins(loaded, tmp_path,
                                                                   synthetic_profile):
    server = batch_server(loaded, tmp_path, synthetic_profile)
    auto = int(Mode.AUTO)
    try:
        with server.executor.assembly.model_lock:
            # 50 tokens alone: 4.91 s by the ETE; 5.5 s leaves it 0.6 s to spare.
            edge = server.admit(GoalSpec('Go.', budget_s=5.5, mode=auto, max_new_tokens=50),
                                'edge')
            server.submit(edge)
            wait_executing(server)
            # Joining now would make its 49 steps 120 ms and stall it for a prefill.
            with pytest.raises(Rejection, match='joining the running batch would push 1'):
                server.submit(server.admit(GoalSpec('Go.', budget_s=60.0, mode=auto,
                                                    max_new_tokens=20), 'joiner'))
    finally:
        server.stop(timeout_s=30.0)
    server = batch_server(loaded, tmp_path, synthetic_profile)
    try:
        with server.executor.assembly.model_lock:
            hold_worker(server)
            # No wait (a slot is free), but 19 steps of a batch of 2: 0.01 + 19 x 0.12 s.
            joins = server.admit(GoalSpec('Go.', budget_s=10.0, mode=auto,
                                          max_new_tokens=20), 'joins')
            server.submit(joins)
            assert joins.plan.est_wcet_s == pytest.approx(0.01 + 19 * 0.12)
            # Alone it would fit 2.3 s less the 10 % margin (1.91 s); in the batch it cannot.
            # (EDF puts it ahead of 'joins', so it would decode beside 'long' only.)
            with pytest.raises(Rejection, match='decoding in a batch of 2: cannot meet'):
                server.submit(server.admit(GoalSpec('Go.', budget_s=2.3, mode=auto,
                                                    max_new_tokens=20), 'tight'))
        wait_all([joins])
        assert joins.result.outcome == Outcome.COMPLETED and joins.result.batch_peak == 2
        # The batched steps that ran were scored against the profiled batch model.
        extra = server.status()[1]
        assert extra['max_batch'] == 4 and extra['ete_batch_step_mape_pct'] > 0.0
        assert server.executor.pipeline.batch.errors
    finally:
        server.stop(timeout_s=30.0)


def test_under_batching_a_skip_next_goal_decodes_alone_and_skips_the_next(loaded):
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'max_batch': 4})
    server = local_server(Assembly(config, loaded, Log()), lambda *args: None)
    try:
        with server.executor.assembly.model_lock:
            over = server.admit(spec(budget=0.05, tokens=200,
                                     policy=OverrunPolicy.SKIP_NEXT), 'overrun')
            server.submit(over)
            wait_executing(server)
            # Queued before it starts; under Kill both would join it at once.
            after = [server.admit(spec(budget=60.0, tokens=4), f'next{i}') for i in range(2)]
            for job in after:
                server.submit(job)
        wait_all([over, *after])
        assert over.result.outcome == Outcome.COMPLETED and not over.result.deadline_met
        assert over.result.batch_peak == 1
        assert after[0].result.outcome == Outcome.SKIPPED
        assert 'overrun' in after[0].result.reason and 'Skip-Next' in after[0].result.reason
        assert after[1].result.outcome == Outcome.COMPLETED
        # Kill goals still batch: a Kill goal sent the same way joins the running one.
        with server.executor.assembly.model_lock:
            long = server.admit(spec(budget=60.0, tokens=200), 'long')
            server.submit(long)
            wait_executing(server)
            joins = server.admit(spec(budget=60.0, tokens=4), 'joins')
            server.submit(joins)
        wait_all([long, joins])
        assert joins.result.outcome == Outcome.COMPLETED and joins.result.batch_peak == 2
    finally:
        server.stop(timeout_s=30.0)


def test_admission_waits_out_a_running_skip_next_goal_before_any_join(loaded, tmp_path,
                                                                      synthetic_profile):
    newcomer = GoalSpec('Go.', budget_s=3.0, mode=int(Mode.AUTO), max_new_tokens=20)
    for policy in (OverrunPolicy.SKIP_NEXT, OverrunPolicy.KILL):
        server = batch_server(loaded, tmp_path, synthetic_profile)
        try:
            with server.executor.assembly.model_lock:
                hold_worker(server, policy)  # 4.91 s by the ETE
                if policy == OverrunPolicy.SKIP_NEXT:  # no goal may join before it ends
                    with pytest.raises(Rejection, match=r'after an expected 4\.\d+ s wait'):
                        server.submit(server.admit(newcomer, 'tight'))
                    continue
                # Behind a Kill goal it joins a free slot at once: 0.01 + 19 x 0.12 s.
                fits = server.admit(newcomer, 'fits')
                server.submit(fits)
                assert fits.plan.est_wcet_s == pytest.approx(0.01 + 19 * 0.12)
        finally:
            server.stop(timeout_s=30.0)


def test_a_profile_without_batched_steps_gets_them_measured_and_saved(loaded, tmp_path,
                                                                      synthetic_profile):
    from timebill_ros.core.profile import Profile
    server = batch_server(loaded, tmp_path, synthetic_profile, batch_coefficients=())
    try:
        model = server.executor.pipeline.batch.model
        assert model.max_measured == 4
        saved = Profile.load(tmp_path / 'tiny-batch.yaml')
        assert len(saved.batch_coefficients) == 4
        assert sorted({b for b, _, _ in saved.batch_points}) == [1, 2, 3, 4]
        assert all(model.step(b, 100) > 0.0 for b in range(1, 5))
    finally:
        server.stop()


def lanes_server(loaded, tmp_path, make_profile, low='int8-dynamic'):
    """A max_batch 4 server with an int8 copy; profiles say everything fits easily."""
    for name, dtype in (('tiny.yaml', 'float32'), (f'tiny.{low}.yaml', low)):
        make_profile(dtype, step_s=0.001, prefill_s=0.001,
                     batch=[(0.0, 0.001)] * 4).save(tmp_path / name)
    # These goals are meant to run into their deadlines: none yields to those waiting.
    return synthetic_server(loaded, tmp_path / 'tiny.yaml', auto_precision=low,
                            cut_effects='', max_batch=4, max_new_tokens_limit=8192,
                            yield_when_late=False)


@pytest.mark.parametrize('low', ['int8-dynamic', 'int8-weight'])
def test_goals_of_two_precisions_share_rounds_and_each_is_killed_on_time(loaded, tmp_path,
                                                                         synthetic_profile,
                                                                         low):
    server = lanes_server(loaded, tmp_path, synthetic_profile, low)
    none = int(Mode.NONE)
    try:
        alone = {}
        for precision in ('', low):
            job = server.admit(GoalSpec('Report the battery level.', budget_s=60.0, mode=none,
                                        max_new_tokens=12, precision=precision), f'a{precision}')
            server.submit(job)
            wait_all([job])
            alone[precision] = job.result.text
        with server.executor.assembly.model_lock:
            # A long int8 goal and a float32 goal that must be killed at 0.3 s: before,
            # the int8 goal decoded alone to its end while the batch waited. The long goal's
            # budget is far beyond its length on any machine: its end is not what is timed.
            long = server.admit(GoalSpec('Go on.', budget_s=600.0, mode=none,
                                         max_new_tokens=1500, precision=low),
                                'long')
            short = server.admit(GoalSpec('Go on.', budget_s=0.3, mode=none,
                                          max_new_tokens=6000), 'short')
            both = [server.admit(GoalSpec('Report the battery level.', budget_s=60.0,
                                          mode=none, max_new_tokens=12, precision=p), f'b{p}')
                    for p in ('', low)]
            for job in (long, short, *both):
                server.submit(job)
        wait_all([long, short, *both], timeout=600)
        assert short.result.outcome == Outcome.KILLED
        assert short.result.e2e_s < 0.3 + 0.25, short.result.e2e_s
        assert long.result.outcome == Outcome.COMPLETED and long.result.tokens == 1500
        # The long goal was still decoding when the short one was killed, or nothing was shown.
        assert long.result.e2e_s > short.result.e2e_s + 0.25, long.result.e2e_s
        # Each precision's answer is the one it gives alone. Not int8-dynamic's: it
        # quantizes a step's activations with one scale over the whole batch, so its
        # answer depends on which goals share the step (a prefill may now come between).
        assert both[0].result.text == alone['']
        if low != 'int8-dynamic':
            assert both[1].result.text == alone[low]
        assert both[1].result.outcome == Outcome.COMPLETED and both[1].result.tokens > 0
        assert both[1].result.plan.precision == low
        assert max(job.result.batch_peak for job in both) >= 3
    finally:
        server.stop(timeout_s=30.0)


def test_close_ends_queued_goals_and_stops_the_running_one_with_the_reason(loaded):
    server, finished = make_server(loaded)
    try:
        with server.executor.assembly.model_lock:
            running = server.admit(GoalSpec('Go on.', budget_s=60.0, mode=int(Mode.NONE),
                                            max_new_tokens=1000), 'running')
            queued = server.admit(spec(), 'queued')
            server.submit(running)
            wait_executing(server)
            server.submit(queued)
            assert server.close('the node is shutting down (SIGTERM)') == 1
        wait_all([running, queued])
        assert queued.result.outcome == Outcome.FAILED
        assert 'shutting down (SIGTERM) before it started' in queued.result.reason
        assert running.result.outcome == Outcome.FAILED
        assert 'stopped after' in running.result.reason
        with pytest.raises(Rejection, match='not accepting goals'):
            server.admit(spec(), 'late')
        assert server.settled()  # submitted jobs are not kept once they ended
    finally:
        server.stop()


def test_decode_threads_are_probed_per_precision_and_a_profile_timed_otherwise_is_redone(
        loaded, tmp_path, synthetic_profile):
    path = tmp_path / 'tiny.yaml'
    stale = synthetic_profile(step_s=0.1)
    stale.versions = {'decode_threads': 7}
    stale.save(path)
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'warm_up': False, 'length_predictor': 'max-new-tokens',
        'auto_precision': 'int8-dynamic', 'cut_effects': '', 'profile': str(path),
        'calibrate_on_start': True, 'calibration_quick': True, 'decode_threads': -1})
    log = Log()
    assembly = Assembly(config, loaded, log)
    assert set(assembly.decode_threads) == {'float32', 'int8-dynamic'}
    assert all(n >= 1 for n in assembly.decode_threads.values())
    assert sum(' decode steps: 1 thread(s)' in m for _, m in log.lines) == 2
    warmup = Warmup(assembly)
    warmup.start()  # the model itself serves alone: calibrated first, the copy while idle
    assert warmup.pending == ['int8-dynamic']
    assert any('timed decode steps at 7 thread(s)' in m for _, m in log.lines)
    redone = Profile.load(path)
    assert redone.decode_threads() == assembly.decode_threads['float32']
    assert redone.coefficients['q'] != 0.1  # measured, not the synthetic 100 ms
    # A fixed count is used as given, with no probe.
    fixed = Assembly(replace(config, decode_threads=1, calibrate_on_start=False), loaded, Log())
    assert fixed.decode_threads == {'float32': 1, 'int8-dynamic': 1}
    assert fixed.engine().threads_for('int8-dynamic') == 1


def test_a_goal_refused_in_its_prefill_runs_anyway_only_when_none_waits(
        loaded, tmp_path, synthetic_profile):
    import numpy as np
    from timebill_ros.runtime.length_heads import LinearHead
    # A head on the tiny model's layer-1 state that always predicts 256 tokens: 25.6 s
    # at the profile's 100 ms a step, while admission (a 1-token answer) fits 2 s.
    bias = np.zeros(17, np.float32)
    bias[16] = 5.0
    LinearHead(np.zeros((17, 64), np.float32), bias, np.zeros(64, np.float32),
               np.ones(64, np.float32), 16, 256, 'L1-last', 'tiny-random'
               ).save(tmp_path / 'head.npz')
    synthetic_profile(step_s=0.1).save(tmp_path / 'tiny.yaml')

    def goal(server, key):
        return server.admit(GoalSpec('Describe the route to the loading dock.', budget_s=2.0,
                                     mode=int(Mode.EVICTION), max_new_tokens=256), key)

    def make(**params):
        return synthetic_server(loaded, tmp_path / 'tiny.yaml', yield_when_late=False,
                                max_budget_s=120.0,
                                length_predictor=str(tmp_path / 'head.npz'), **params)
    server = make()
    try:
        with server.executor.assembly.model_lock:
            first = goal(server, 'first')
            server.submit(first)
            wait_executing(server)
            second = goal(server, 'second')
            server.submit(second)
        wait_all([first, second])
        # The first one's prefill had a goal waiting behind it: refused.
        assert first.result.outcome == Outcome.REJECTED
        assert 'predicted 256 answer tokens' in first.result.reason
        # The second ran alone: best effort, killed at its deadline if late.
        assert second.result.outcome in (Outcome.KILLED, Outcome.COMPLETED)
        assert second.result.tokens >= 1
        assert second.result.plan.note.startswith('best effort (Kill, no goal waiting)')
        assert not second.result.plan.feasible and second.result.plan.predicted_tokens == 256
    finally:
        server.stop()
    strict = make(idle_best_effort=False)
    try:
        alone = goal(strict, 'alone')
        strict.submit(alone)
        wait_all([alone])
        assert alone.result.outcome == Outcome.REJECTED and alone.result.tokens == 0
    finally:
        strict.stop()


def bare_assembly(loaded, **params):
    """An Assembly of the tiny model, no calibration or warm-up; returns it and its log."""
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
        'length_predictor': 'max-new-tokens', **params})
    log = Log()
    return Assembly(config, loaded, log), log


def test_auto_precision_int8_keeps_both_copies_led_by_the_one_its_timing_picks(
        loaded, tmp_path):
    profile = str(tmp_path / 'tiny.yaml')
    assembly, log = bare_assembly(loaded, auto_precision='int8', profile=profile)
    assert set(assembly.variants) == {'int8-dynamic', 'int8-weight'}
    low = assembly.low_precision
    assert list(assembly.variants)[0] == low
    assert all(copy.dtype == name for name, copy in assembly.variants.items())
    line = next(line for _, line in log.lines if 'auto_precision int8: decode step' in line)
    assert f'{low} leading' in line
    # The logged step times are the ones the rule chose by.
    times = re.findall(r'(int8-\w+) ([0-9.]+) ms', line)
    assert pick_int8(*(float(ms) for _, ms in times)) == low
    for precision in assembly.variants:  # each copy decodes a goal pinned to it
        tokens = []
        generate(assembly.engine(), prompt_ids(loaded.tokenizer, 'Stop or go?'), 3,
                 Plan(precision=precision), lambda event: tokens.append(event.token_id) or True)
        assert len(tokens) == 3
    # The pick's probe of both copies chose their decode threads: neither is probed again.
    threads = [line for _, line in log.lines if 'decode steps:' in line]
    assert len(threads) == 3 and 'timed by the int8 pick' not in threads[0]
    assert all(line.endswith('(timed by the int8 pick, best of two rounds)')
               for line in threads[1:])
    # A restart reads the stored times: the same lead, both copies, nothing timed again.
    stored = Int8Pick.load(tmp_path / 'tiny.int8-pick.yaml')
    assert stored.chosen == low and stored.matches(loaded.name, loaded.device)
    # The thread line shows the times the pick chose by: its fastest is the stored step.
    lead_line = next(line for line in threads if line.startswith(f'{low} decode steps'))
    fastest = min(float(ms) for ms in re.findall(r'thread\(s\) ([0-9.]+) ms', lead_line))
    stored_s = stored.dynamic_step_s if low == 'int8-dynamic' else stored.weight_step_s
    assert fastest == pytest.approx(stored_s * 1e3, abs=0.051)  # the log rounds to 0.1 ms
    again, log = bare_assembly(loaded, auto_precision='int8', profile=profile)
    assert list(again.variants)[0] == low and len(again.variants) == 2
    assert not any('auto_precision int8: decode step' in line for _, line in log.lines)
    assert any('as timed at an earlier start' in line for _, line in log.lines)
    # Times for another device are not reused.
    Int8Pick(loaded.name, 'cuda', 0.01, 0.05).save(tmp_path / 'tiny.int8-pick.yaml')
    _, log = bare_assembly(loaded, auto_precision='int8', profile=profile)
    assert any('auto_precision int8: decode step' in line for _, line in log.lines)


def test_int8_weight_mixes_read_their_own_shipped_table(loaded):
    assembly, log = bare_assembly(loaded, auto_precision='int8-weight',
                                  precision_mix='shipped')
    assert set(assembly.variants) == {'int8-weight'}
    # The shipped int8-weight table was measured on the embedded model, not this one:
    # refused by name, so the per-layer path read that file and not int8-dynamic's.
    assert assembly.mixed is None
    assert any('precision_kl.int8-weight.json' in line and 'int8-weight over' in line
               for _, line in log.lines)


def test_a_16_bit_auto_precision_copy_is_resident_and_takes_no_per_layer_mix(loaded):
    assembly, log = bare_assembly(loaded, auto_precision='bfloat16',
                                  precision_mix='shipped')
    assert set(assembly.variants) == {'bfloat16'} and assembly.mixed is None
    assert any('precision_mix needs auto_precision int8-dynamic' in line
               for _, line in log.lines)
    tokens = []
    stats = generate(assembly.engine(), prompt_ids(loaded.tokenizer, 'Stop or go?'), 4,
                     Plan(precision='bfloat16'),
                     lambda event: tokens.append(event.token_id) or True)
    assert stats.tokens == len(tokens) > 0


def test_the_length_predictor_is_skipped_when_its_cost_would_eat_the_budget(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf', predictor_share=0.25)
    auto = int(Mode.AUTO)
    assert getattr(server.executor.predictor, 'distribution', None) is None
    try:
        server.executor.admission.length.predict_s = 1.0  # as measured on a slow machine
        server.learning.typical_tokens = 7.0
        tight = server.dry_run(GoalSpec('Go.', budget_s=2.0, mode=auto, max_new_tokens=50))
        assert 'length predictor skipped' in tight.plan.note, tight.plan.note
        # No answer has run yet and this predictor has no calibration: the running mean.
        assert tight.plan.predicted_tokens == 7 and 'running mean' in tight.plan.note
        for _ in range(9):  # short answers finished, and long ones killed at 20 tokens
            server.learning.answer_ran(7, True, 50)
            server.learning.answer_ran(20, False, 50)
        tight = server.dry_run(GoalSpec('Go.', budget_s=2.0, mode=auto, max_new_tokens=50))
        assert tight.plan.predicted_tokens == 7 and tight.plan.predictor == 'recent answers'
        assert 'spread of 18 recent answers' in tight.plan.note, tight.plan.note
        # Half the answers ran past 20 tokens, how far unknown: planned up to the cap.
        assert tight.plan.worst_case_tokens == 50
        # All 50 tokens fit on the full model in 10 s: no prediction could change the plan.
        roomy = server.dry_run(GoalSpec('Go.', budget_s=10.0, mode=auto, max_new_tokens=50))
        assert 'no prediction could change the plan' in roomy.plan.note, roomy.plan.note
        assert server.executor.admission.length.predict_s == 1.0  # not run
        # 50 tokens (~4.9 s) do not fit 5 s less the margin; 1 s is under 25 % of it: run.
        middle = server.dry_run(GoalSpec('Go.', budget_s=5.0, mode=auto, max_new_tokens=50))
        assert 'length predictor' not in middle.plan.note, middle.plan.note
        assert middle.plan.predicted_tokens == 50
        # The run just measured joins the mean.
        assert server.executor.admission.length.predict_s < 1.0
    finally:
        server.stop(timeout_s=30.0)


def test_a_skipped_length_predictor_gives_way_to_the_text_head_when_that_fits(
        loaded, tmp_path, synthetic_profile):
    from timebill_ros.runtime.predictor import text_predictor
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf', predictor_share=0.25)
    goal = GoalSpec('Answer with one word, STOP or GO: the crosswalk light is red.',
                    budget_s=2.0, mode=int(Mode.AUTO), max_new_tokens=50)
    try:
        # The shipped head was distilled from the embedded model, not this tiny one: set
        # it directly (the rule under test is admission's, not the head's accuracy).
        assert server.executor.assembly.text_predictor is None
        server.executor.assembly.text_predictor = text = text_predictor('text')
        server.executor.admission.length.predict_s = 1.0  # the torch head: over 25 % of 2 s
        job = server.dry_run(goal)
        plan = job.plan
        assert plan.predictor == text.name, plan.note
        assert f'{text.name} predicted {plan.predicted_tokens} tokens' in plan.note
        job.expected_wait_s = -1.0  # it waited longer than admission expected: re-planned
        replanned, _ = server.executor.admission.plan_at_start(server.executor.pipeline, job)
        assert 're-planned at dispatch' in replanned.note  # and still says its length basis
        assert f'{text.name} predicted {plan.predicted_tokens} tokens' in replanned.note
        length = server.executor.admission.length
        assert 0 < length.text_s < 0.5  # measured, as the torch head's cost is
        length.text_s = 1.0  # too costly as well: the recent answers decide
        plan = server.dry_run(goal).plan
        assert plan.predictor != text.name and 'length predictor skipped' in plan.note
    finally:
        server.stop(timeout_s=30.0)


def test_a_repeated_context_is_prefilled_once_and_planned_as_cached(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf', prefill_chunk=64)
    context = 'Dock 3 is free. Forklift 7 charges at bay 2. Aisle 9 is blocked. ' * 20
    try:
        results = []
        questions = ('Which aisle is blocked?', 'Where does forklift 7 charge?')
        for key, question in enumerate(questions):
            job = server.admit(GoalSpec(question, context=context, budget_s=60.0,
                                        max_new_tokens=4), f'q{key}')
            server.submit(job)
            wait_all([job])
            results.append(job)
        first, second = results
        assert first.prefix_tokens == 0 and first.result.prefix_tokens == 0
        assert second.prefix_tokens >= 32 and second.result.prefix_tokens >= second.prefix_tokens
        assert 'prompt tokens in the prefix cache' in second.result.plan.note
        assert second.result.outcome == Outcome.COMPLETED
        extra = server.status()[1]
        assert extra['prefix_cache_hits'] == 1 and extra['prefix_cache_misses'] == 1
        assert extra['prefix_cache_blocks'] > 0
    finally:
        server.stop(timeout_s=30.0)


def test_a_goal_killed_in_prefill_teaches_the_ete_its_prefilled_tokens(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf', prefill_chunk=8,
                             prefix_cache_mb=0)
    context = 'Dock 3 is free. Forklift 7 charges at bay 2. Aisle 9 is blocked. ' * 100
    try:
        job = server.admit(GoalSpec('Which aisle?', context=context, budget_s=0.25,
                                    mode=int(Mode.NONE), max_new_tokens=4), 'k')
        server.submit(job)
        wait_all([job])
        result = job.result
        assert result.outcome == Outcome.KILLED and 'during prefill' in result.reason
        assert 0 < result.prefill_tokens < len(job.prompt_ids) and result.prefill_s > 0
        samples = server.executor.pipeline.online.prefill_samples
        assert (result.prefill_tokens, result.prefill_s) in list(samples)
    finally:
        server.stop(timeout_s=30.0)


def test_a_schema_goal_is_planned_on_its_schemas_shortest_and_earlier_answers(
        loaded, tmp_path, synthetic_profile):
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf', predictor_share=0.25)
    schema = json.dumps({'type': 'object', 'required': ['action', 'why'],
                         'properties': {'action': {'enum': ['stop', 'go']},
                                        'why': {'type': 'string'}}})

    def plan(budget_s, json_schema=schema):
        return server.dry_run(GoalSpec('Go.', budget_s=budget_s, mode=int(Mode.AUTO),
                                       max_new_tokens=50, json_schema=json_schema)).plan
    try:
        compiled = server.executor.grammars.compile(schema)
        shortest = server.executor.grammars.shortest_answer(compiled)
        server.executor.admission.length.predict_s = 1.0  # the predictor is skipped at 2 s ...
        server.learning.typical_tokens = 2.0  # ... for a running mean no schema answer fits
        tight = plan(2.0)
        assert tight.predicted_tokens == shortest > 2, tight.note
        assert 'shortest answer the schema allows' in tight.note
        # Three answers to this schema ended by themselves, one was closed at 9 tokens.
        for tokens, ended in ((12, True), (14, True), (9, False), (16, True)):
            server.learning.grammar_answer_ran(compiled, tokens, ended)
        for budget_s in (2.0, 10.0):  # no predictor runs, however much time is left
            planned = plan(budget_s)
            assert planned.predictor == 'answers to this schema', planned.note
            assert planned.predicted_tokens == 14 and planned.worst_case_tokens < 50
            assert 'spread of 4 earlier answers to this schema' in planned.note
        other = plan(10.0, schema.replace('"go"', '"wait"'))  # another schema: no answers yet
        # All 50 tokens fit in 10 s: the (1-s) predictor is not run, the shortest stands.
        assert other.predictor != 'answers to this schema'
        assert 'no prediction could change the plan' in other.note, other.note
        assert other.predicted_tokens == shortest
    finally:
        server.stop(timeout_s=30.0)


def test_a_goal_refused_at_admission_runs_as_best_effort_only_on_an_idle_node(
        loaded, tmp_path, synthetic_profile):
    # 100 ms a step: the stand-in plans the whole 50-token cap (~5 s); 2 s fits ~17.
    # The refusals are checked before any goal runs: the online ETE then learns the
    # stand-in's real (far shorter) step and would plan the cap in time.
    def spec(budget_s=2.0, policy=OverrunPolicy.KILL):
        return GoalSpec('Go.', budget_s=budget_s, mode=int(Mode.AUTO), max_new_tokens=50,
                        overrun_policy=int(policy))
    server = profiled_server(loaded, tmp_path, synthetic_profile, 'edf')
    try:
        alone = server.admit(spec(), 'alone')
        note = alone.plan.note
        assert note.startswith('best effort (Kill, node idle): cannot meet the deadline'), note
        assert not alone.plan.feasible and 1 <= alone.plan.fits_tokens < 50
        # Skip-Next would run past the deadline; no token fits 5 ms: refused.
        with pytest.raises(Rejection, match='cannot meet the deadline'):
            server.admit(spec(policy=OverrunPolicy.SKIP_NEXT), 'skip')
        with pytest.raises(Rejection, match='cannot meet the deadline: predicted 50 answer '
                                            'tokens .*; 0 fit'):
            server.admit(spec(budget_s=0.005), 'hopeless')
        server.submit(alone)
        wait_all([alone])
        assert alone.result.outcome in (Outcome.COMPLETED, Outcome.KILLED)
        assert alone.result.tokens >= 1
    finally:
        server.stop(timeout_s=30.0)
    busy = profiled_server(loaded, tmp_path, synthetic_profile, 'edf')
    try:
        with busy.executor.assembly.model_lock:
            hold_worker(busy)  # a goal runs: the node is not idle, others need it
            with pytest.raises(Rejection, match='cannot meet the deadline'):
                busy.admit(spec(), 'busy')
    finally:
        busy.stop(timeout_s=30.0)
    strict = profiled_server(loaded, tmp_path, synthetic_profile, 'edf',
                             idle_best_effort=False)
    try:
        with pytest.raises(Rejection, match='cannot meet the deadline'):
            strict.admit(spec(), 'strict')
    finally:
        strict.stop(timeout_s=30.0)
