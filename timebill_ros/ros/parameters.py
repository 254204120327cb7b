# SPDX-License-Identifier: Apache-2.0
"""The node's parameters over ROS: declared from the one table, changed live or refused.

Every entry of ``core.config.PARAMS`` is declared with a descriptor that carries its
description, range, choices and whether it is read-only. A ``set_parameters`` call on a
live parameter is validated as a whole new configuration (the same checks as at start)
and applied at once; a read-only one is refused by rclpy with its own reason.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from rcl_interfaces.msg import (
    FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult)

from timebill_ros.core.config import NodeConfig, Param, PARAM_BY_NAME, PARAMS

# A one-layer list ('-p early_exit_layers:=22') arrives as an integer.
LOOSELY_TYPED = frozenset({'early_exit_layers'})


def descriptor(param: Param) -> ParameterDescriptor:
    """Return the ROS descriptor of one table entry (range, choices, read-only)."""
    choices = ''
    if param.choices:
        choices = 'one of: ' + ', '.join(repr(c) for c in param.choices)
    described = ParameterDescriptor(
        description=param.description, additional_constraints=choices,
        read_only=not param.live, dynamic_typing=param.name in LOOSELY_TYPED)
    if param.low is not None and param.high is not None:
        if isinstance(param.default, bool):
            pass
        elif isinstance(param.default, int):
            described.integer_range = [IntegerRange(
                from_value=int(param.low), to_value=int(param.high), step=0)]
        elif isinstance(param.default, float):
            described.floating_point_range = [FloatingPointRange(
                from_value=float(param.low), to_value=float(param.high), step=0.0)]
    return described


def declare(node) -> NodeConfig:
    """Declare every parameter of the table on ``node`` and return the validated config."""
    values = {}
    for param in PARAMS:
        value = node.declare_parameter(param.name, param.default, descriptor(param)).value
        values[param.name] = str(value) if param.name in LOOSELY_TYPED else value
    return NodeConfig.from_dict(values)


class LiveParameters:
    """Apply a live change to the node's configuration, or refuse it with the reason.

    ``current()`` returns the configuration in force; ``apply(config)`` puts a new one in
    force (it must not fail: everything that can fail is checked before).
    """

    def __init__(self, node, current: Callable[[], NodeConfig],
                 apply: Callable[[NodeConfig], None]):
        """Register the on-set callback on ``node`` (after every parameter is declared)."""
        self.node, self.current, self.apply = node, current, apply
        node.add_on_set_parameters_callback(self.on_set)

    def on_set(self, parameters) -> SetParametersResult:
        """Validate the changed values as one configuration; apply it or say why not."""
        changes = {p.name: p.value for p in parameters}
        fixed = sorted(name for name in changes
                       if name in PARAM_BY_NAME and not PARAM_BY_NAME[name].live)
        if fixed:  # rclpy refuses read-only ones first; this keeps the rule in one place
            return SetParametersResult(successful=False, reason=(
                f'{", ".join(fixed)} cannot change while the node runs: restart it with '
                'the new value'))
        values = {**asdict(self.current()), **changes}
        try:
            config = NodeConfig.from_dict(values)
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        self.apply(config)
        applied = ', '.join(f'{name}={value!r}' for name, value in sorted(changes.items()))
        self.node.get_logger().info(f'parameters changed live: {applied}')
        return SetParametersResult(successful=True, reason=f'applied: {applied}')
