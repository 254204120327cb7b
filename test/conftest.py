"""Shared fixtures: isolated DDS domain, node processes, rclpy clients."""

import os
import random
import time

import pytest

from timebill_ros.ros.process import NodeProcess  # noqa: F401 (used by the tests)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Keep test traffic away from any other ROS 2 graph on this machine.
os.environ.setdefault('ROS_DOMAIN_ID', str(random.randint(1, 100)))
os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')


@pytest.fixture(scope='session')
def rclpy_context():
    import rclpy
    if not rclpy.ok():  # a CLI under test (soak, benchmarks) may have initialised it
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
