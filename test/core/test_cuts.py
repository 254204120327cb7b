# SPDX-License-Identifier: Apache-2.0
"""Cut effects: interpolation over eviction ratios, lookup, round trip, validation."""

import pytest

from timebill_ros.core.cuts import (
    CutEffect, CutEffects, FULL, length_factor, length_ratios, SHIPPED)


def test_eviction_effect_is_interpolated_from_the_full_model():
    effects = CutEffects(eviction_ratios=(0.5, 0.9),
                         eviction=(CutEffect(3.0, 0.5), CutEffect(5.0, 0.1)))
    assert effects.of_eviction(0.0) == FULL
    half = effects.of_eviction(0.25)
    assert half.length_factor == pytest.approx(2.0) and half.quality == pytest.approx(0.75)
    assert effects.of_eviction(0.7).length_factor == pytest.approx(4.0)
    assert effects.of_eviction(0.95) == CutEffect(5.0, 0.1)  # held beyond the last ratio
    assert CutEffects().of_eviction(0.5) == FULL  # nothing measured: harmless


def test_precision_lookup_and_round_trip(tmp_path):
    effects = CutEffects(eviction_ratios=(0.3,), eviction=(CutEffect(1.5, 0.8),),
                         precision={'int8-dynamic': CutEffect(1.2, 0.4)}, source='test')
    assert effects.of_precision('int8-dynamic') == CutEffect(1.2, 0.4)
    assert effects.of_precision('') == FULL and effects.of_precision('fp4') == FULL
    effects.save(tmp_path / 'e.json')
    assert CutEffects.load(tmp_path / 'e.json') == effects


def test_bad_tables_are_refused(tmp_path):
    with pytest.raises(ValueError):
        CutEffect(0.0, 0.5)
    with pytest.raises(ValueError):
        CutEffect(1.0, 1.5)
    with pytest.raises(ValueError):
        CutEffects(eviction_ratios=(0.5, 0.3), eviction=(FULL, FULL))
    (tmp_path / 'bad.json').write_text('{"format": 1, "eviction": [{"ratio": 0.5}]}')
    with pytest.raises(ValueError, match='malformed'):
        CutEffects.load(tmp_path / 'bad.json')
    with pytest.raises(ValueError):
        CutEffects.load(tmp_path / 'missing.json')


def test_length_factor():
    assert length_factor([10, 20], [20, 40]) == pytest.approx(2.0)
    assert length_factor([0, 2], [1, 2]) == pytest.approx(1.0)  # an empty answer counts 1
    with pytest.raises(ValueError):
        length_factor([1], [1, 2])


def test_the_shipped_table_loads():
    effects = CutEffects.load(SHIPPED)
    assert 'int8-dynamic' in effects.precision and effects.eviction_ratios


def test_a_measured_length_spread_gives_the_full_lengths_that_fit():
    effect = CutEffect(1.0, 0.8, (0.5, 1.0, 2.0))
    assert effect.full_lengths_within(40) == (80.0, 40.0, 20.0)
    assert CutEffect(2.0, 0.8).full_lengths_within(40) == (20.0,)  # the factor alone
    effects = CutEffects(precision={'llama.cpp-q4_1': effect}, source='test')
    assert CutEffects.from_dict(effects.to_dict()) == effects
    with pytest.raises(ValueError):
        CutEffect(1.0, 0.8, (2.0, 1.0))  # not increasing
    with pytest.raises(ValueError):
        CutEffect(1.0, 0.8, (0.0, 1.0))
    assert length_ratios([10, 10, 10, 40], [5, 10, 20, 40], (0.1, 0.5, 0.9)) == pytest.approx(
        (0.65, 1.0, 1.7))


def test_an_eviction_spread_is_interpolated_quantile_by_quantile():
    effects = CutEffects(eviction_ratios=(0.5,), eviction=(CutEffect(1.0, 0.5, (0.5, 2.0)),))
    assert effects.of_eviction(0.25).length_ratios == pytest.approx((0.75, 1.5))
    assert effects.of_eviction(0.5).length_ratios == (0.5, 2.0)
    assert CutEffects.from_dict(effects.to_dict()) == effects
