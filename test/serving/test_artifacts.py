# SPDX-License-Identifier: Apache-2.0
"""One way to read an artifact: load, check it fits the model, or warn and fall back."""

from types import SimpleNamespace

import pytest

from timebill_ros.core.cuts import CutEffect, CutEffects
from timebill_ros.core.profile import Profile
from timebill_ros.serving import artifacts

TINY = SimpleNamespace(name='tiny-random', device='cpu', dtype='float32')


def Log():  # noqa: N802 (stands in for a logger class)
    """Return a log that keeps (level, message) pairs in ``lines``."""
    lines = []
    return SimpleNamespace(lines=lines, **{
        level: (lambda message, level=level: lines.append((level, message)))
        for level in ('info', 'warning', 'error')})


def test_load_checked_returns_what_fits_and_warns_before_falling_back():
    log = Log()
    assert artifacts.load_checked(log, lambda: 'ok', lambda a: '') == 'ok'
    assert artifacts.load_checked(log, lambda: 'foreign', lambda a: f'{a}: not ours',
                                  fallback='default') == 'default'
    assert log.lines == [('warning', 'foreign: not ours')]

    def broken():
        raise ValueError('cannot read it')
    with pytest.raises(ValueError, match='cannot read it'):  # a file the config names
        artifacts.load_checked(log, broken)
    assert artifacts.load_checked(log, broken, unreadable=lambda e: f'{e}: skipped',
                                  fallback=0) == 0
    assert log.lines[-1] == ('warning', 'cannot read it: skipped')
    quiet = Log()
    assert artifacts.load_checked(quiet, broken, unreadable=str, quiet=True) is None
    assert quiet.lines == []


def test_a_cut_effects_file_from_another_model_counts_cuts_as_harmless(tmp_path):
    path = tmp_path / 'effects.json'
    CutEffects(precision={'int8-dynamic': CutEffect(2.0, 0.5)}, source='other-model').save(path)
    log = Log()
    assert artifacts.cut_effects(log, str(path), TINY) == CutEffects()
    assert log.lines == [('warning', f"cut effects {path} were measured on another model "
                                     "('other-model'): cuts assumed harmless")]
    mine = CutEffects(precision={'int8-dynamic': CutEffect(2.0, 0.5)}, source='tiny-random')
    mine.save(path)
    assert artifacts.cut_effects(log, str(path), TINY) == mine
    path.write_text('not json')
    with pytest.raises(ValueError):  # named by the configuration: a broken file is an error
        artifacts.cut_effects(log, str(path), TINY)


def test_a_foreign_or_unreadable_profile_is_ignored_with_a_warning(tmp_path, synthetic_profile):
    path = tmp_path / 'profile.yaml'
    synthetic_profile(model='other-model').save(path)
    log = Log()
    assert artifacts.stored_profile(log, path, TINY, 0, True) is None
    assert 'was measured for other-model/cpu/float32, not this model' in log.lines[-1][1]
    assert artifacts.stored_threads(log, path, TINY) is None
    profile = synthetic_profile()
    profile.versions = {'decode_threads': 7}
    profile.save(path)
    assert isinstance(artifacts.stored_profile(log, path, TINY, 0, True), Profile)
    assert artifacts.stored_threads(log, path, TINY) == 7
    # Timed at 7 threads, decoding with 2: redone when calibrating at start is allowed.
    assert artifacts.stored_profile(log, path, TINY, 2, True) is None
    assert log.lines[-1][1].endswith('the node decodes with 2: recalibrating')
    assert artifacts.stored_profile(log, path, TINY, 2, False) is not None
    # Prefills timed in one pass, the node prefills 128 tokens a pass: redone too.
    assert artifacts.stored_profile(log, path, TINY, 0, True, prefill_chunk=0) is not None
    assert artifacts.stored_profile(log, path, TINY, 0, True, prefill_chunk=128) is None
    assert 'passes of all the tokens, the node prefills 128 a pass' in log.lines[-1][1]
    profile.versions = {'prefill_chunk': 128}
    profile.save(path)
    assert artifacts.stored_profile(log, path, TINY, 0, True, prefill_chunk=128) is not None
    path.write_text('not: [a, profile')
    assert artifacts.stored_profile(log, path, TINY, 0, True) is None
    assert 'cannot read profile' in log.lines[-1][1]
    assert artifacts.stored_profile(log, tmp_path / 'none.yaml', TINY, 0, True) is None


def test_a_profile_timed_on_another_machine_is_timed_again(tmp_path, synthetic_profile):
    from timebill_ros.runtime.model import machine_of
    path, log = tmp_path / 'profile.yaml', Log()
    profile = synthetic_profile()
    profile.versions = {'machine': 'Some CPU: avx2'}  # e.g. one name, without AVX-512
    profile.save(path)
    assert artifacts.stored_profile(log, path, TINY, 0, True) is None
    assert log.lines[-1][1].startswith(f'{path} was measured on Some CPU: avx2, this is '
                                       f'{machine_of("cpu")}: recalibrating')
    assert artifacts.stored_profile(log, path, TINY, 0, False) is not None  # no recalibration
    profile.versions = {'machine': machine_of('cpu')}
    profile.save(path)
    assert artifacts.stored_profile(log, path, TINY, 0, True) is not None
