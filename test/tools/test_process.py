# SPDX-License-Identifier: Apache-2.0
"""A node started by NodeProcess does not outlive the process that started it."""

import os
import signal
import subprocess
import sys
import time

PARENT = '''
import sys, time
from timebill_ros.tools.process import NodeProcess
node = NodeProcess({'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
                    'length_predictor': 'max-new-tokens', 'auto_precision': '',
                    'llama_engines': ''}, namespace='/orphan_check')
print(node.proc.pid, flush=True)
time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    with open(f'/proc/{pid}/stat') as stat:
        return stat.read().split(') ')[1][0] != 'Z'


def test_a_parent_killed_without_cleanup_takes_its_node_with_it():
    parent = subprocess.Popen([sys.executable, '-c', PARENT], stdout=subprocess.PIPE,
                              text=True)
    try:
        node_pid = int(parent.stdout.readline())
        assert _alive(node_pid)
        parent.send_signal(signal.SIGKILL)  # no finally, no atexit: only the kernel acts
        parent.wait(10)
        deadline = time.monotonic() + 30.0
        while _alive(node_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(node_pid), 'the node outlived its parent'
    finally:
        parent.kill()
        parent.wait(10)
