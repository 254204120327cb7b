# SPDX-License-Identifier: Apache-2.0
"""timebill_msgs, the interfaces package: interfaces only, and all a client needs.

A ROS team uses the Instruct action without the node's Python package and its inference
dependencies (as llama_ros's clients use llama_msgs): timebill_msgs builds with
ament_cmake and declares no Python or inference dependency, the repository root is no
package (colcon finds both packages below it), and a client that imports rclpy and
timebill_msgs only sends a goal to a real node and gets its result.
"""

import json
from pathlib import Path
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from conftest import NodeProcess

ROOT = Path(__file__).resolve().parents[2]
MSGS = ROOT / 'timebill_msgs'
CLIENT = Path(__file__).resolve().parent / 'msgs_client.py'
# Everything timebill_msgs may depend on: the build tools, the generators and the
# interface packages its messages use.
ALLOWED = {'ament_cmake', 'rosidl_default_generators', 'rosidl_default_runtime',
           'builtin_interfaces', 'std_msgs'}
# Named so a failure says why: what a client of the interfaces must never pull in.
FORBIDDEN = {'rclpy', 'torch', 'transformers', 'kvpress', 'llguidance', 'llama-cpp-python',
             'timebill_ros'}
DEPENDENCY_TAGS = ('depend', 'build_depend', 'build_export_depend', 'buildtool_depend',
                   'buildtool_export_depend', 'exec_depend', 'test_depend', 'doc_depend')
PARAMS = {'model': 'tiny-random', 'calibrate_on_start': False, 'warm_up': False,
          'length_predictor': 'max-new-tokens', 'auto_precision': '', 'llama_engines': ''}


def manifest():
    return ElementTree.parse(MSGS / 'package.xml').getroot()


def test_the_package_declares_interfaces_and_no_python_or_inference_dependency():
    root = manifest()
    assert root.get('format') == '3' and root.findtext('name') == 'timebill_msgs'
    assert root.findtext('export/build_type') == 'ament_cmake'
    assert [g.text for g in root.findall('member_of_group')] == ['rosidl_interface_packages']
    depends = {e.text.strip() for tag in DEPENDENCY_TAGS for e in root.findall(tag)}
    assert not [d for d in depends if d.startswith('python3-')], depends
    assert not depends & FORBIDDEN, depends & FORBIDDEN
    assert depends <= ALLOWED, sorted(depends - ALLOWED)
    assert {'rosidl_default_generators', 'rosidl_default_runtime'} <= depends


def test_cmake_generates_every_interface_file_and_the_root_holds_none():
    cmake = (MSGS / 'CMakeLists.txt').read_text(encoding='utf-8')
    listed = set(re.findall(r'"((?:msg|srv|action)/\w+\.(?:msg|srv|action))"', cmake))
    files = {str(p.relative_to(MSGS)) for kind in ('msg', 'srv', 'action')
             for p in (MSGS / kind).glob(f'*.{kind}')}
    assert files and listed == files
    assert 'DEPENDENCIES builtin_interfaces std_msgs' in cmake
    assert 'find_package(Python' not in cmake and 'ament_python' not in cmake
    for moved in ('msg', 'srv', 'action'):
        assert not (ROOT / moved).exists(), f'{moved}/ belongs to timebill_msgs/'


def test_the_repository_root_is_no_package_and_colcon_finds_both_below_it():
    # colcon stops at the first directory it takes for a package: package.xml (ROS),
    # CMakeLists.txt (CMake) or setup.py (Python) at the root would hide both packages.
    for name in ('package.xml', 'CMakeLists.txt', 'setup.py'):
        assert not (ROOT / name).exists(), name
    node = ElementTree.parse(ROOT / 'packaging' / 'timebill_ros' / 'package.xml').getroot()
    assert 'timebill_msgs' in {e.text for e in node.findall('depend')}
    colcon = shutil.which('colcon')
    if colcon is None:
        pytest.skip('colcon is not installed')
    listed = subprocess.run([colcon, 'list', '--topological-order', '--base-paths', str(ROOT)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split('\t') for line in listed.stdout.splitlines()]
    assert [(name, Path(path).resolve(), kind) for name, path, kind in rows] == [
        ('timebill_msgs', MSGS, '(ros.ament_cmake)'),
        ('timebill_ros', ROOT / 'packaging' / 'timebill_ros', '(ros.ament_cmake)')]


@pytest.fixture(scope='module')
def node():
    proc = NodeProcess(PARAMS, namespace='/msgs_only')
    yield proc
    proc.stop()


def test_a_client_of_timebill_msgs_alone_gets_its_result(node, tmp_path):
    from action_msgs.msg import GoalStatus
    # Its own process, outside the checkout: nothing of timebill_ros on its path or loaded.
    proc = subprocess.run([sys.executable, str(CLIENT), '/msgs_only/timebill/instruct',
                           'Say hi.', '30', '2'], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer['status'] == GoalStatus.STATUS_SUCCEEDED, answer
    assert answer['outcome'] == 0 and answer['deadline_met'], answer  # COMPLETED
    assert 1 <= answer['tokens'] <= 2, answer
    assert not [m for m in answer['modules'] if m.split('.')[0] == 'timebill_ros'], answer
    assert 'timebill_msgs' in answer['modules'] and 'site-packages' in answer['interfaces_from']
