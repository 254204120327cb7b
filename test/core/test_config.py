# SPDX-License-Identifier: Apache-2.0
"""Parameters: one table of defaults and ranges, validated together."""

from dataclasses import fields

import pytest

from timebill_ros.core.config import NodeConfig, PARAM_BY_NAME
from timebill_ros.core.request import OverrunPolicy


def test_table_and_dataclass_agree():
    assert {f.name for f in fields(NodeConfig)} == set(PARAM_BY_NAME)
    for f in fields(NodeConfig):
        assert f.default == PARAM_BY_NAME[f.name].default


def test_defaults_validate():
    config = NodeConfig.from_dict({})
    assert config.limits().default_max_new_tokens == 128


@pytest.mark.parametrize('values', [
    {'queue_length': 0}, {'device': 'tpu'}, {'max_new_tokens': 'many'},
    {'miss_rate_warn': 0.5, 'miss_rate_error': 0.1}, {'diagnostics_period_s': float('nan')},
    {'max_new_tokens': 2000, 'max_new_tokens_limit': 1000}, {'nonsense': 1},
    {'default_policy': 'maybe'}, {'warm_up': 1}, {'early_exit_layers': '20,10'},
    {'early_exit_layers': 'x'}, {'early_exit_layers': '0,5'},
    {'early_exit_threshold_start': 0.3, 'early_exit_threshold_end': 0.8},
])
def test_bad_values_raise(values):
    with pytest.raises(ValueError):
        NodeConfig.from_dict(values)


def test_policy_name_maps_to_enum():
    assert NodeConfig.from_dict({'default_policy': 'skip_next'}).limits().default_policy == \
        OverrunPolicy.SKIP_NEXT


def test_exit_layers_parse():
    assert NodeConfig.from_dict({'early_exit_layers': ' 12, 20 '}).exit_layers() == (12, 20)
    assert NodeConfig.from_dict({}).exit_layers() == ()
