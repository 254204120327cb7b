# SPDX-License-Identifier: Apache-2.0
"""The parameter schema and README table come from PARAMS and validate the shipped YAML."""

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from timebill_ros.cli import schema
from timebill_ros.core.config import json_schema, NodeConfig, PARAMS

ROOT = Path(__file__).resolve().parents[2]


def shipped():
    return yaml.safe_load((ROOT / 'config' / 'timebill.yaml').read_text())


def test_the_shipped_yaml_validates_against_the_schema_and_the_node_table():
    jsonschema.validate(shipped(), json_schema())
    NodeConfig.from_dict(shipped()['/**']['ros__parameters'])
    # Every parameter is in the shipped file, so users see them all.
    assert set(shipped()['/**']['ros__parameters']) == {p.name for p in PARAMS}


def test_the_shipped_yaml_holds_the_defaults_the_code_declares():
    # One source of defaults: what the launch file loads is what the node declares.
    values = shipped()['/**']['ros__parameters']
    differ = {p.name: (values[p.name], p.default) for p in PARAMS
              if values[p.name] != p.default or type(values[p.name]) is not type(p.default)}
    assert differ == {}


def test_node_config_defaults_come_from_the_table():
    config = NodeConfig()
    assert {p.name: getattr(config, p.name) for p in PARAMS} == \
        {p.name: p.default for p in PARAMS}


@pytest.mark.parametrize('name, value, error', [
    ('scheduler', 'lifo', 'is not one of'),
    ('max_batch', 0, 'less than the minimum'),
    ('warm_up', 'yes', "is not of type 'boolean'"),
    ('no_such_parameter', 1, 'Additional properties'),
])
def test_the_schema_refuses_what_the_node_refuses(name, value, error):
    data = copy.deepcopy(shipped())
    data['/**']['ros__parameters'][name] = value
    with pytest.raises(jsonschema.ValidationError, match=error):
        jsonschema.validate(data, json_schema())
    with pytest.raises(ValueError):
        NodeConfig.from_dict(data['/**']['ros__parameters'])


def test_the_schema_file_and_the_readme_table_are_current():
    assert schema.main(['--check']) == 0, 'run python -m timebill_ros.cli.schema'
    readme = (ROOT / 'docs' / 'parameters.md').read_text()
    for param in PARAMS:
        assert f'| `{param.name}` |' in readme
