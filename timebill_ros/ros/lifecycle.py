# SPDX-License-Identifier: Apache-2.0
"""The managed (lifecycle) timebill node: configure loads, activate serves, cleanup frees.

``python -m timebill_ros.ros.node --managed`` runs it; it serves through the same
interfaces as the plain node (ros/interfaces.py).
"""

from __future__ import annotations

import time
from typing import Callable

from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn

from timebill_ros.ros import parameters
from timebill_ros.ros.heap import release_heap
from timebill_ros.ros.interfaces import build, Interfaces, read_parameters
from timebill_ros.runtime.model import load_model, ModelLoadError
from timebill_ros.serving.server import Server

# A shutdown waits this long for the goals it ended to deliver their results.
RELEASE_WAIT_S = 10.0


class TimebillLifecycleNode(LifecycleNode):
    """The same node, managed: configure loads, activate serves, cleanup frees the model.

    Rule on deactivate: new goals are refused with the reason 'inactive'; goals already
    accepted (running or queued) are served to their end, since an accepted goal is
    never dropped. Cleanup and shutdown end queued goals and stop the running one at
    its next token, each with a result that says why, then free the model.
    """

    def __init__(self, loader: Callable = load_model, **kwargs):
        """Declare and validate the parameters; load nothing until configure."""
        super().__init__('timebill', **kwargs)
        self.config = read_parameters(self)
        self.loader = loader
        self.interfaces: Interfaces | None = None
        self._active = False
        self._live = parameters.LiveParameters(self, lambda: self.config, self._apply)

    def autostart(self) -> bool:
        """Configure and activate now when the ``autostart`` parameter says so.

        Return whether the node is active (False: it waits for the transitions).
        """
        if not self.config.autostart:
            return False
        configured = self.trigger_configure() == TransitionCallbackReturn.SUCCESS
        return configured and self.trigger_activate() == TransitionCallbackReturn.SUCCESS

    def _apply(self, config) -> None:
        self.config = config  # an unconfigured node builds with it at configure
        if self.interfaces is not None:
            self.interfaces.reconfigure(config)

    @property
    def server(self) -> Server | None:
        """Return the serving core (None while unconfigured)."""
        return self.interfaces.server if self.interfaces else None

    def _gate(self) -> str:
        return '' if self._active else 'the node is inactive (lifecycle): activate it to serve'

    def on_configure(self, state) -> TransitionCallbackReturn:
        """Load the model, profile and predictor; create the interfaces (inactive)."""
        try:
            self.interfaces = build(self, self.config, self.loader, self._gate)
        except (ModelLoadError, ValueError, OSError) as exc:
            self.get_logger().error(f'configure failed: {exc}')
            return TransitionCallbackReturn.FAILURE
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state) -> TransitionCallbackReturn:
        """Start accepting goals."""
        self._active = True
        self.get_logger().info('active: serving goals')
        return super().on_activate(state)

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        """Refuse new goals; accepted ones are served to their end."""
        self._active = False
        self.get_logger().info('inactive: new goals are refused, accepted ones finish')
        return super().on_deactivate(state)

    def _release(self, reason: str) -> None:
        if self.interfaces is None:
            return
        self.close(reason)
        give_up = time.monotonic() + RELEASE_WAIT_S
        while not self.server.settled() and time.monotonic() < give_up:
            time.sleep(0.05)
        self.server.stop()
        self.interfaces.destroy()
        self.interfaces = None  # the model, its copies and the caches go with it
        release_heap()  # they were frozen out of collection at start (ros.heap)

    def on_cleanup(self, state) -> TransitionCallbackReturn:
        """End accepted goals with a reason and free the model."""
        self._release('the node was cleaned up (lifecycle)')
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state) -> TransitionCallbackReturn:
        """End accepted goals with a reason and free the model."""
        self._release('the node is shutting down (lifecycle)')
        return TransitionCallbackReturn.SUCCESS

    def close(self, reason: str) -> None:
        """Refuse new goals and end every accepted one with ``reason``."""
        if self.interfaces is not None:
            self._active = False
            self.interfaces.gate = lambda: reason
            self.server.close(reason)

    def settled(self) -> bool:
        """Tell whether every goal has its result."""
        return self.server is None or self.server.settled()

    def stop(self) -> None:
        """Stop the worker thread (if configured)."""
        if self.server is not None:
            self.server.stop()
