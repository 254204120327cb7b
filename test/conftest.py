"""Shared fixtures: isolated DDS domain, node processes, rclpy clients."""

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Keep test traffic away from any other ROS 2 graph on this machine.
os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(1, 100)))
os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')


class NodeProcess:
    """A timebill node started as a separate process, as users run it."""

    def __init__(self, params: dict, ready_timeout: float = 120.0, namespace: str = ''):
        args = [sys.executable, '-m', 'timebill_ros.ros.node', '--ros-args']
        if namespace:
            args += ['-r', f'__ns:={namespace}']
        for key, value in params.items():
            args += ['-p', f'{key}:={value}']
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(ready_timeout):
            self.stop()
            raise RuntimeError('node not ready:\n' + ''.join(self.lines[-30:]))

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if ']: ready:' in line:
                self._ready.set()
        self._ready.set()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope='session')
def rclpy_context():
    import rclpy
    rclpy.init()
    yield
    rclpy.try_shutdown()


@pytest.fixture
def wait_until():
    def wait(predicate, timeout=10.0, what='condition'):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return
            time.sleep(0.01)
        raise AssertionError(f'timed out waiting for {what}')
    return wait
