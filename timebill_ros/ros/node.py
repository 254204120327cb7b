# SPDX-License-Identifier: Apache-2.0
"""The timebill node: an Instruct action server answering before each goal's deadline.

The plain node declares the parameters and serves through the interfaces of
ros/interfaces.py; ``main`` runs it, or the managed node of ros/lifecycle.py.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Callable

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from timebill_ros.core.config import NodeConfig
from timebill_ros.ros import parameters
from timebill_ros.ros.heap import release_heap
from timebill_ros.ros.interfaces import build, executor_threads, read_parameters
from timebill_ros.ros.lifecycle import RELEASE_WAIT_S, TimebillLifecycleNode
from timebill_ros.runtime.model import load_model, ModelLoadError
from timebill_ros.serving.server import Server


class TimebillNode(Node):
    """Serve ~/instruct, ~/plan and ~/instructions with one model (the default node)."""

    def __init__(self, loader: Callable = load_model, **kwargs):
        """Declare parameters, load the model (ModelLoadError on failure) and start serving."""
        super().__init__('timebill', **kwargs)
        self.config = read_parameters(self)
        self.interfaces = build(self, self.config, loader)
        self._closing = ''
        self._live = parameters.LiveParameters(self, lambda: self.config, self._apply)

    def _apply(self, config: NodeConfig) -> None:
        self.config = config
        self.interfaces.reconfigure(config)

    @property
    def server(self) -> Server:
        """Return the serving core."""
        return self.interfaces.server

    def close(self, reason: str) -> None:
        """Refuse new goals and end every accepted one with ``reason`` (a shutdown)."""
        self._closing = reason
        self.interfaces.gate = lambda: reason
        queued = self.server.close(reason)
        self.get_logger().warning(f'{reason}: {queued} queued goal(s) ended, the running one '
                                  'stops at its next token')

    def settled(self) -> bool:
        """Tell whether every goal has its result."""
        return self.server.settled()

    def stop(self) -> None:
        """Stop the worker thread."""
        self.server.stop()


def main(args=None) -> int:
    """Run the node until SIGINT/SIGTERM; exit non-zero if it cannot start.

    ``--managed`` (before ``--ros-args``) runs the lifecycle node. On SIGINT or SIGTERM
    every accepted goal gets a result saying so before the process exits.
    """
    argv = list(sys.argv if args is None else args)
    managed = '--managed' in argv
    argv = [a for a in argv if a != '--managed']
    rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    signalled = threading.Event()
    names = []

    def on_signal(number, frame):
        names.append(signal.Signals(number).name)
        signalled.set()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, on_signal)
    try:
        if managed:
            node = TimebillLifecycleNode()
        else:
            node = TimebillNode()
    except (ModelLoadError, ValueError, OSError) as exc:
        print(f'timebill: cannot start: {exc}', file=sys.stderr)
        rclpy.try_shutdown()
        return 1
    if managed and not node.autostart():
        node.get_logger().info('managed node: unconfigured (configure, then activate; or set '
                               'autostart)' if not node.config.autostart else
                               'managed node: autostart failed (see above); configure again')
    executor = MultiThreadedExecutor(num_threads=executor_threads(node.config))
    executor.add_node(node)
    try:
        while not signalled.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=0.2)
        if signalled.is_set():
            node.close(f'the node is shutting down ({names[0]})')
            give_up = time.monotonic() + RELEASE_WAIT_S
            while not node.settled() and time.monotonic() < give_up and rclpy.ok():
                executor.spin_once(timeout_sec=0.05)
            flush = time.monotonic() + 0.3  # let the last result responses go out
            while time.monotonic() < flush and rclpy.ok():
                executor.spin_once(timeout_sec=0.05)
    except ExternalShutdownException:
        pass
    finally:
        # Frozen objects are never finalised at exit: unfrozen, the DDS participant is
        # deleted and says so (frozen, its action lingered in other nodes' graphs).
        release_heap()
        node.stop()
        executor.shutdown(timeout_sec=2.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
