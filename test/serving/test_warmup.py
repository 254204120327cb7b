# SPDX-License-Identifier: Apache-2.0
"""A first start: the fastest option serving alone is profiled first, the rest while idle."""

import threading
import time

import pytest

from timebill_ros.core.config import NodeConfig
from timebill_ros.core.profile import Profile
from timebill_ros.core.request import GoalSpec, Mode, Outcome, OverrunPolicy, Rejection
from timebill_ros.runtime.model import load_model
from timebill_ros.serving.assembly import Assembly
from timebill_ros.serving.local_executor import local_server

from conftest import Log


@pytest.fixture(scope='module')
def loaded():
    return load_model('tiny-random')


def cold_server(loaded, folder):
    """Return (server, log, results) of a tiny node whose profile folder is empty."""
    config = NodeConfig.from_dict({
        'model': 'tiny-random', 'warm_up': False, 'length_predictor': 'max-new-tokens',
        'auto_precision': 'int8-dynamic', 'cut_effects': '', 'calibrate_on_start': True,
        'calibration_quick': True, 'profile': str(folder / 'tiny.yaml')})
    log, results = Log(), []
    server = local_server(Assembly(config, loaded, log),
                          lambda job, result, estimate, error: results.append(result))
    return server, log, results


def spec(precision='', mode=Mode.AUTO):
    return GoalSpec('Report the battery level.', budget_s=30.0, mode=int(mode),
                    max_new_tokens=3, overrun_policy=int(OverrunPolicy.KILL),
                    precision=precision)


def test_the_copy_joins_the_planner_once_profiled_between_goals(loaded, tmp_path):
    server, log, results = cold_server(loaded, tmp_path)
    try:
        warmup = server.executor.warmup
        facts = server.status()[1]
        # The model itself serves alone, so it was calibrated before serving; the int8
        # copy (it prefills on the model) is profiled while idle.
        assert facts['options_profiled'] == 'float32'
        assert any('start-up probe' in line for _, line in log.lines)
        planned, stop = [], threading.Event()

        def goals():  # goals keep arriving while the copy is profiled
            i = 0
            while not stop.is_set():
                profiled = set(warmup.profiles)
                try:
                    job = server.admit(spec(), f'g{i}')
                except Rejection:
                    continue
                planned.append((job.plan.precision, profiled))
                server.submit(job)
                assert job.done.wait(30)
                i += 1
                time.sleep(0.3)  # idle gaps: points run there, and a goal cuts some short
        sender = threading.Thread(target=goals)
        sender.start()
        deadline = time.monotonic() + 120
        while warmup.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        sender.join(60)
        assert not warmup.pending, 'the copy was never profiled'
        assert server.status()[1]['options_to_profile'] == 'none'
        assert Profile.load(tmp_path / 'tiny.int8-dynamic.yaml').dtype == 'int8-dynamic'
        assert any('profiled int8-dynamic in ' in line for _, line in log.lines)
        # Every goal was planned on an option profiled when it was admitted ('' = float32).
        assert planned and all(precision in profiled or precision == ''
                               for precision, profiled in planned)
        assert all(r.outcome == Outcome.COMPLETED for r in results)
        # The copy now plans goals: one pinned to it runs there.
        job = server.admit(spec('int8-dynamic', Mode.NONE), 'pinned')
        server.submit(job)
        assert job.done.wait(30) and job.result.outcome == Outcome.COMPLETED
        assert job.result.plan.precision == 'int8-dynamic'
    finally:
        server.stop()


def test_a_copy_still_to_profile_is_refused_to_a_goal_that_pins_it(loaded, tmp_path):
    server, log, _ = cold_server(loaded, tmp_path)
    try:
        with server.executor.assembly.model_lock:  # the worker cannot profile meanwhile
            assert server.executor.warmup.pending == ['int8-dynamic']
            with pytest.raises(Rejection, match='int8-dynamic'):
                server.admit(spec('int8-dynamic', Mode.NONE), 'early')
    finally:
        server.stop()
