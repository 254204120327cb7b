# SPDX-License-Identifier: Apache-2.0
"""tools layer of timebill_ros: user tools over ROS (bags, replay, action client, node process)."""
