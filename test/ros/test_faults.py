# SPDX-License-Identifier: Apache-2.0
"""Faults the node must survive or report (tiny model, real processes and DDS).

Each test fails on the behaviour before issue 16: a corrupt model dir crashed with a
traceback, an unwritable cache stopped the node at its first calibration, SIGTERM
left streaming clients without a result.
"""

import signal
import subprocess
import sys
import threading

import pytest

from timebill_msgs.action import Instruct
from timebill_ros.core.profile import Profile
from timebill_ros.tools.client import InstructClient, make_goal
from timebill_ros.runtime.model import tiny_random_dir
from conftest import NodeProcess, ROOT

G, R = Instruct.Goal, Instruct.Result
TINY = {'model': 'tiny-random', 'calibrate_on_start': False,
        'length_predictor': 'max-new-tokens', 'auto_precision': '', 'cut_effects': ''}


def start_fails(params: dict, env=None) -> subprocess.CompletedProcess:
    args = [sys.executable, '-m', 'timebill_ros.ros.node', '--ros-args']
    for key, value in params.items():
        args += ['-p', f'{key}:={value}']
    import os
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_a_corrupt_model_directory_exits_nonzero_with_a_message(tmp_path):
    (tmp_path / 'config.json').write_text('{ this is not json')
    proc = start_fails({'model': str(tmp_path)})
    assert proc.returncode == 1
    assert 'timebill: cannot start' in proc.stderr
    assert 'Traceback' not in proc.stderr


@pytest.mark.parametrize('content, warning', [
    ('not: [a, profile', 'cannot read profile'),
    (None, 'was measured for other-model'),
])
def test_a_corrupt_or_foreign_profile_is_ignored_and_the_node_serves(rclpy_context, tmp_path,
                                                                     content, warning):
    path = tmp_path / 'profile.yaml'
    if content is None:
        Profile(model='other-model', device='cpu', dtype='float32',
                coefficients={k: 0.1 for k in 'abcpq'}).save(path)
    else:
        path.write_text(content)
    proc = NodeProcess({**TINY, 'profile': str(path)})
    client = InstructClient(node_name=f'fault_profile_{abs(hash(warning)) % 1000}')
    try:
        client.wait_for_server(30)
        assert any(warning in line for line in proc.lines), ''.join(proc.lines[-20:])
        run = client.ask(make_goal('Report the battery level.', 30.0, max_new_tokens=4))
        assert run.accepted and run.result.outcome == R.COMPLETED
        # Without a profile, eviction is refused with the reason, and the node goes on.
        evict = client.ask(make_goal('Report.', 30.0, mode=G.MODE_EVICTION,
                                     max_new_tokens=4))
        assert not evict.accepted and 'not available' in evict.reject_reason
    finally:
        client.close()
        proc.stop()


def test_an_unwritable_cache_costs_the_saved_profile_not_the_node(rclpy_context, tmp_path):
    blocker = tmp_path / 'a-file'
    blocker.write_text('not a directory')
    proc = NodeProcess({**TINY, 'model': str(tiny_random_dir()), 'calibrate_on_start': True},
                       env={'TIMEBILL_CACHE': str(blocker / 'cache')})
    client = InstructClient(node_name='fault_cache_client')
    try:
        client.wait_for_server(60)
        assert any('cannot save the profile' in line for line in proc.lines)
        run = client.ask(make_goal('Report.', 30.0, mode=G.MODE_AUTO, max_new_tokens=4))
        assert run.accepted and run.result.outcome == R.COMPLETED
        assert run.result.plan.est_wcet_s > 0.0  # planned with the in-memory profile
    finally:
        client.close()
        proc.stop()


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_goal_streams_gives_every_goal_a_result_first(rclpy_context,
                                                                       signum):
    proc = NodeProcess({**TINY, 'max_new_tokens_limit': 8192})
    client = InstructClient(node_name=f'fault_signal_{int(signum)}')
    try:
        client.wait_for_server(30)
        streaming = threading.Event()
        long = client.send(make_goal('Go on and on.', 120.0, max_new_tokens=8000),
                           on_feedback=lambda fb: streaming.set())
        queued = client.send(make_goal('Then this.', 120.0, max_new_tokens=8))
        assert streaming.wait(30), 'the long goal never streamed'
        proc.proc.send_signal(signum)
        name = signal.Signals(signum).name
        for run in (long, queued):
            client.wait(run, 20)
            assert run.accepted and run.result is not None
            assert run.result.outcome == R.FAILED
            assert f'shutting down ({name})' in run.result.reason
        assert 'stopped after' in long.result.reason and long.result.tokens > 0
        assert long.result.text == long.streamed_text  # the partial text is kept
        assert 'before it started' in queued.result.reason
        assert proc.proc.wait(20) == 0
    finally:
        client.close()
        proc.stop()


def test_a_client_that_restarts_its_participant_is_served_again(rclpy_context):
    proc = NodeProcess(TINY)
    script = ('import sys, rclpy\n'
              'from timebill_ros.tools.client import InstructClient, make_goal\n'
              'rclpy.init()\n'
              'c = InstructClient(node_name="restarting_client")\n'
              'c.wait_for_server(30)\n'
              'r = c.ask(make_goal("Report.", 30.0, max_new_tokens=3), 60)\n'
              'print("outcome", r.result.outcome if r.accepted else "rejected", flush=True)\n'
              'if sys.argv[1] == "kill":\n'
              '    c.send(make_goal("Go on.", 60.0, max_new_tokens=400))\n'
              '    import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n'
              'c.close(); rclpy.try_shutdown()\n')
    try:
        outs = []
        for how in ('kill', 'clean', 'clean'):  # same node name, new participant each time
            done = subprocess.run([sys.executable, '-c', script, how], cwd=ROOT,
                                  capture_output=True, text=True, timeout=120)
            outs.append(done.stdout)
        assert all('outcome 0' in out for out in outs), outs
        assert proc.proc.poll() is None
    finally:
        proc.stop()
