# SPDX-License-Identifier: Apache-2.0
"""``python -m timebill_ros.evaluation.robot_workload [--write] [--seed N]``."""

from .generator import main

main()
