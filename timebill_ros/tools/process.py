# SPDX-License-Identifier: Apache-2.0
"""Start a timebill node as a separate process, as users run it, and wait until it serves."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _dies_with_parent():
    """Return a preexec_fn that has the child get SIGTERM when its parent dies (Linux).

    A benchmark killed with SIGKILL (or SIGTERM, which runs no ``finally``) otherwise
    leaves its nodes serving: a second node on the same action then answers the next
    run's goals too, and both compete for the CPU. Resolved before the fork, so the
    child only makes the one libc call. None where there is no prctl.
    """
    if not sys.platform.startswith('linux'):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class NodeProcess:
    """A timebill node in its own process; ``stop`` ends it (SIGINT, then kill)."""

    def __init__(self, params: dict, ready_timeout: float = 120.0, namespace: str = '',
                 managed: bool = False, env: dict | None = None):
        """Start ``python -m timebill_ros.ros.node`` with ``params``; wait for its ready line.

        ``managed`` starts the lifecycle node, ready once it is up and unconfigured;
        ``env`` adds environment variables.
        """
        args = [sys.executable, '-m', 'timebill_ros.ros.node',
                *(['--managed'] if managed else []), '--ros-args']
        autostart = str(params.get('autostart', '')).lower() == 'true'
        self.marker = 'managed node: unconfigured' if managed and not autostart else \
            ']: ready:'
        if namespace:
            args += ['-r', f'__ns:={namespace}']
        for key, value in params.items():
            # An empty string must reach the YAML parser as '' (a bare ':=' is an error).
            args += ['-p', f"{key}:={value if value != '' else repr('')}"]
        # The node ends with the thread that started it (prctl's rule): start it from a
        # thread that outlives it, as tests and benchmarks do from their main thread.
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})},
                                     preexec_fn=_dies_with_parent())
        self.lines = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(ready_timeout):
            self.stop()
            raise RuntimeError('node not ready:\n' + ''.join(self.lines[-30:]))
        if self.proc.poll() is not None:
            raise RuntimeError('node exited at start:\n' + ''.join(self.lines[-30:]))

    def wait_for_line(self, fragment: str, timeout: float) -> str:
        """Return the first output line holding ``fragment`` (TimeoutError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((line for line in list(self.lines) if fragment in line), None)
            if found is not None:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise TimeoutError(f'no line with {fragment!r} in {timeout:g} s:\n'
                           + ''.join(self.lines[-20:]))

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if self.marker in line:
                self._ready.set()
        self._ready.set()  # the process ended: stop waiting

    def stop(self):
        """Stop the node: SIGINT, then kill after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
