"""``python -m timebill_ros.evaluation.robot_workload [--write] [--seed N]``."""

from .generator import main

main()
