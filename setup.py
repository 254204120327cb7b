# SPDX-License-Identifier: Apache-2.0
"""Pip install of timebill_ros's Python code (``pip install .``).

The ROS 2 package (interfaces, node, launch file, the tools under lib/timebill_ros) is
built with colcon from package.xml / CMakeLists.txt (build type ament_cmake). This file
installs the Python packages and the same console scripts for a pip user: the ROS-free
layers work alone; the node and the tools over ROS also need rclpy and the package's
generated interfaces from a colcon build (docs/workspace.md). Metadata lives in setup.cfg.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

_HERE = Path(__file__).resolve().parent
# The version is written once, in package.xml (the ROS package's own).
_VERSION = re.search(r'<version>([^<]+)</version>',
                     (_HERE / 'package.xml').read_text(encoding='utf-8')).group(1)

setup(
    version=_VERSION,
    packages=find_packages(include=['timebill_ros', 'timebill_ros.*']),
)
