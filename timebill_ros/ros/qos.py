# SPDX-License-Identifier: Apache-2.0
"""QoS for the action's services and the node's topics, sized for bursts of goals.

rclpy's defaults keep the last 10 requests per service (KEEP_LAST, depth 10): a
burst of goals, result requests or cancels beyond that is dropped by DDS before
the node sees it, and those clients wait forever. Both ends need the depth: a
client's request writer keeps only its own last ``depth`` requests too.
"""

from __future__ import annotations

from rclpy.qos import (DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy,
                       qos_profile_action_status_default)

# Goals one node may see at once from all its clients (a bag replayed at burst rate).
BURST_DEPTH = 1000


def reliable(depth: int = BURST_DEPTH) -> QoSProfile:
    """Return a reliable, volatile, KEEP_LAST ``depth`` profile."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


def action_server_qos(depth: int = BURST_DEPTH) -> dict:
    """Return the ActionServer keyword arguments for a burst of ``depth`` goals."""
    services = reliable(depth)
    return {'goal_service_qos_profile': services, 'result_service_qos_profile': services,
            'cancel_service_qos_profile': services, 'feedback_pub_qos_profile': services,
            'status_pub_qos_profile': qos_profile_action_status_default}


def action_client_qos(depth: int = BURST_DEPTH) -> dict:
    """Return the ActionClient keyword arguments matching ``action_server_qos``."""
    services = reliable(depth)
    return {'goal_service_qos_profile': services, 'result_service_qos_profile': services,
            'cancel_service_qos_profile': services, 'feedback_sub_qos_profile': services,
            'status_sub_qos_profile': qos_profile_action_status_default}
