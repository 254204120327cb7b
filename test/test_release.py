# SPDX-License-Identifier: Apache-2.0
"""Release files: one version, the licence package.xml names, SPDX lines, declared imports.

Two ROS packages share the repository: timebill_ros (packaging/timebill_ros/package.xml,
where the version is written) and timebill_msgs (timebill_msgs/package.xml, the same
version).
"""

import ast
from pathlib import Path
import re
import subprocess
import sys

import timebill_ros

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_XML = (ROOT / 'packaging' / 'timebill_ros' / 'package.xml').read_text(encoding='utf-8')
MSGS_XML = (ROOT / 'timebill_msgs' / 'package.xml').read_text(encoding='utf-8')

# Import name -> how package.xml or the pip requirements name it.
DECLARED_AS = {'yaml': 'pyyaml', 'llama_cpp': 'llama-cpp-python', 'rank_bm25': 'rank-bm25',
               'rouge_score': 'rouge-score'}


def tracked(*patterns: str) -> list:
    listed = subprocess.run(['git', 'ls-files', *patterns], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / name for name in listed]


def version_of(package_xml: str) -> str:
    return re.search(r'<version>([^<]+)</version>', package_xml).group(1)


def test_the_version_is_written_once_in_package_xml():
    version = version_of(PACKAGE_XML)
    assert timebill_ros.__version__ == version
    changelog = (ROOT / 'CHANGELOG.rst').read_text(encoding='utf-8')
    newest = re.search(r'^(\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)$', changelog, re.MULTILINE)
    assert newest.group(1) == version, 'CHANGELOG.rst: its newest entry is the version'
    # pip's metadata (setup.cfg: attr timebill_ros.__version__) reads the same file.
    read = ('from setuptools.config.setupcfg import read_configuration; '
            "print(read_configuration('setup.cfg')['metadata']['version'])")
    setup = subprocess.run([sys.executable, '-c', read], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert setup.stdout.strip().splitlines()[-1] == version, setup.stderr


def test_both_ros_packages_carry_the_same_version_and_licence():
    assert version_of(MSGS_XML) == version_of(PACKAGE_XML), \
        'timebill_msgs/package.xml and packaging/timebill_ros/package.xml disagree'
    assert '<license>Apache-2.0</license>' in MSGS_XML
    assert '<name>timebill_msgs</name>' in MSGS_XML and '<name>timebill_ros</name>' in PACKAGE_XML


def test_the_licence_file_is_the_one_package_xml_names():
    assert '<license>Apache-2.0</license>' in PACKAGE_XML
    licence = (ROOT / 'LICENSE').read_text(encoding='utf-8')
    assert 'Apache License' in licence and 'Version 2.0, January 2004' in licence
    assert 'example.com' not in PACKAGE_XML  # a maintainer that answers


def test_every_source_file_carries_its_spdx_line():
    missing = [str(path.relative_to(ROOT)) for path in tracked('*.py', '*.sh')
               if 'SPDX-License-Identifier: Apache-2.0' not in
               ''.join(path.read_text(encoding='utf-8').splitlines(True)[:2])]
    assert not missing, missing


def third_party_imports() -> set:
    names = set()
    for path in (ROOT / 'timebill_ros').rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split('.')[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split('.')[0])
    return {name for name in names
            if name not in sys.stdlib_module_names and name != 'timebill_ros'}


def test_every_imported_package_is_declared():
    requirements = ''.join((ROOT / 'requirements' / name).read_text(encoding='utf-8')
                           for name in ('python.txt', 'torch-cpu.txt')).lower()
    undeclared = []
    for name in sorted(third_party_imports()):
        pip_name = DECLARED_AS.get(name, name).lower()
        ros_keys = (f'<depend>{name}</depend>', f'<exec_depend>{name}</exec_depend>',
                    f'<exec_depend>python3-{pip_name}</exec_depend>')
        in_ros = any(key in PACKAGE_XML for key in ros_keys)
        in_pip = re.search(rf'^{re.escape(pip_name)}==', requirements, re.MULTILINE)
        if not (in_ros or in_pip):
            undeclared.append(name)
    assert not undeclared, undeclared
