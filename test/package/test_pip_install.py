# SPDX-License-Identifier: Apache-2.0
"""``pip install .``: the wheel carries every layer, the node and tools, and their scripts.

Benchmarks and the builders of the shipped data are not installed.
"""

from pathlib import Path
import re
import shutil
import subprocess
import sys
import zipfile

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_ros_layer_the_tools_and_their_console_scripts(tmp_path):
    source = tmp_path / 'src'
    source.mkdir()
    # The version is package.xml's (setup.cfg: attr timebill_ros.__version__).
    for name in ('pyproject.toml', 'setup.cfg', 'packaging/timebill_ros/package.xml'):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / 'timebill_ros', source / 'timebill_ros',
                    ignore=shutil.ignore_patterns('__pycache__'))
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
                    '-q', '-w', str(tmp_path / 'dist'), str(source)], check=True, timeout=300)
    version = re.search(r'<version>([^<]+)</version>', (
        ROOT / 'packaging' / 'timebill_ros' / 'package.xml').read_text(encoding='utf-8')).group(1)
    (wheel,) = (tmp_path / 'dist').glob(f'timebill_ros-{version}-*.whl')
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names
                            if n.endswith('entry_points.txt'))
    for module in ('core/config.py', 'serving/server.py', 'runtime/grammar.py', 'ros/node.py',
                   'ros/parameters.py', 'tools/client.py', 'cli/ask.py', 'data/length_head.npz'):
        assert f'timebill_ros/{module}' in names, module
    # The interfaces are timebill_msgs' (a colcon build), never part of this wheel.
    assert not [n for n in names if n.startswith(('timebill_msgs/', 'packaging/'))
                or n.startswith(tuple(f'timebill_ros/{i}/' for i in ('msg', 'srv', 'action')))]
    # The lab (benchmarks/, training/) stays out of the wheel, and so do their commands.
    assert not [n for n in names if n.startswith(('benchmarks/', 'training/'))
                or '/bench_' in n or '/train_' in n or '/measure_' in n]
    assert 'bench' not in entry_points and 'measure' not in entry_points
    for script in ('timebill_node = timebill_ros.ros.node:main',
                   'timebill_ask = timebill_ros.cli.ask:main',
                   'timebill_monitor = timebill_ros.cli.monitor:main',
                   'timebill_bag = timebill_ros.cli.bag:main'):
        assert script in entry_points, script


def test_colcon_installs_every_console_script_for_ros2_run():
    # packaging/timebill_ros/CMakeLists.txt generates lib/timebill_ros/<tool> from setup.cfg's
    # list; the colcon install this suite runs against (make build, or a workspace's) holds
    # one per name.
    from ament_index_python.packages import get_package_prefix
    installed = Path(get_package_prefix('timebill_ros')) / 'lib' / 'timebill_ros'
    config = (ROOT / 'setup.cfg').read_text(encoding='utf-8')
    tools = [line.split('=')[0].strip() for line in config.splitlines()
             if line.startswith('    timebill_') and ':main' in line]
    assert 'timebill_monitor' in tools and 'timebill_node' in tools
    for tool in tools:
        path = installed / tool
        assert path.is_file() and path.stat().st_mode & 0o111, tool
