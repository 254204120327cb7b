# SPDX-License-Identifier: Apache-2.0
"""The launch file, read as source (launch and launch_ros are not installable here)."""

import ast
from pathlib import Path

import yaml

LAUNCH = Path(__file__).resolve().parents[2] / 'launch' / 'timebill.launch.py'


def calls(tree, name):
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, 'id', None) == name]


def test_every_argument_has_a_description_and_the_node_reads_them():
    tree = ast.parse(LAUNCH.read_text(encoding='utf-8'))
    arguments = calls(tree, 'DeclareLaunchArgument')
    names = {a.args[0].value for a in arguments}
    assert names == {'namespace', 'params_file', 'managed', 'autostart', 'use_sim_time',
                     'log_level'}
    for argument in arguments:
        keywords = {k.arg: k.value for k in argument.keywords}
        assert isinstance(keywords['description'], (ast.Constant, ast.BinOp, ast.JoinedStr))
        text = ast.unparse(keywords['description'])
        assert len(text) > 20, argument.args[0].value
    used = {c.args[0].value for c in calls(tree, 'LaunchConfiguration')}
    assert used == names


def test_plain_and_managed_node_share_one_set_of_arguments():
    tree = ast.parse(LAUNCH.read_text(encoding='utf-8'))
    (node,), (managed,) = calls(tree, 'Node'), calls(tree, 'LifecycleNode')
    for call in (node, managed):
        assert [k.arg for k in call.keywords if k.arg is None] == [None]  # **common
        assert {k.arg for k in call.keywords if k.arg} >= {'condition'}
    assert [ast.unparse(k.value) for k in managed.keywords if k.arg == 'arguments'] == \
        ["['--managed']"]


def test_the_launched_executable_and_the_default_parameters_exist():
    root = LAUNCH.parents[1]
    cmake = (root / 'packaging' / 'timebill_ros' / 'CMakeLists.txt').read_text(encoding='utf-8')
    assert ('install(PROGRAMS "${_timebill_root}/scripts/timebill_node" '
            'DESTINATION lib/${PROJECT_NAME})') in cmake
    assert 'install(DIRECTORY "${_timebill_root}/launch"' in cmake
    assert (root / 'scripts' / 'timebill_node').is_file()
    params = yaml.safe_load((root / 'config' / 'timebill.yaml').read_text(encoding='utf-8'))
    assert params['/**']['ros__parameters']
