# SPDX-License-Identifier: Apache-2.0
"""Stored measurements: the int8 pick."""

import pytest

from timebill_ros.core.profile import Int8Pick


def test_int8_pick_round_trips_and_recomputes_its_choice(tmp_path):
    path = tmp_path / 'sub' / 'p.int8-pick.yaml'
    pick = Int8Pick('m', 'cpu', 0.020, 0.030)
    pick.save(path)
    loaded = Int8Pick.load(path)
    assert loaded == pick and loaded.chosen == 'int8-dynamic'
    assert loaded.matches('m', 'cpu') and not loaded.matches('m', 'cuda')
    assert Int8Pick('m', 'cpu', 0.030, 0.030).chosen == 'int8-weight'


@pytest.mark.parametrize('text', ['', 'format: other\n', 'format: timebill-int8-pick/1\n',
                                  'format: timebill-int8-pick/1\nmodel: m\ndevice: cpu\n'
                                  'dynamic_step_s: 0\nweight_step_s: 0.03\n', '[1, 2'])
def test_int8_pick_refuses_what_is_not_one(tmp_path, text):
    path = tmp_path / 'p.yaml'
    path.write_text(text)
    with pytest.raises(ValueError):
        Int8Pick.load(path)
    with pytest.raises(ValueError):
        Int8Pick.load(tmp_path / 'absent.yaml')


def test_read_errors_name_what_was_read(tmp_path):
    from timebill_ros.core.profile import Profile
    path = tmp_path / 'p.yaml'
    path.write_text('not: [a, profile')
    with pytest.raises(ValueError, match='cannot read profile'):
        Profile.load(path)
    with pytest.raises(ValueError, match='cannot read int8 pick'):
        Int8Pick.load(path)
    path.write_text('format: 0\n')
    with pytest.raises(ValueError, match='is not a timebill profile'):
        Profile.load(path)
