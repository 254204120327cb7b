"""Pip install of the ROS-free part of timebill_ros (core, runtime, serving, evaluation, cli).

The ROS 2 package itself (interfaces, node, the tools over ROS) is built with colcon from
package.xml / CMakeLists.txt (build type ament_cmake); this file is only for
``pip install .`` without ROS 2. Metadata and options live in setup.cfg.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

_HERE = Path(__file__).resolve().parent
_VERSION = re.search(
    r"^__version__ = '([^']+)'",
    (_HERE / 'timebill_ros' / '__init__.py').read_text(encoding='utf-8'),
    re.MULTILINE).group(1)

setup(
    version=_VERSION,
    packages=find_packages(
        include=['timebill_ros', 'timebill_ros.*'],
        exclude=['timebill_ros.ros', 'timebill_ros.ros.*',
                 'timebill_ros.tools', 'timebill_ros.tools.*']),
)
