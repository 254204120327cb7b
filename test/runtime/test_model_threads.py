# SPDX-License-Identifier: Apache-2.0
"""on_own_thread: setup work runs on a thread that exits, results and errors come back."""

import threading

import pytest

from timebill_ros.runtime.model import ModelLoadError, on_own_thread


def test_the_function_runs_on_a_fresh_thread_that_is_gone_afterwards():
    seen = []

    def work(a, b):
        seen.append(threading.current_thread())
        return a + b
    assert on_own_thread(work, 2, 3) == 5
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()
    assert seen[0].name == 'timebill-setup'


def test_an_exception_reaches_the_caller_unchanged():
    def fail():
        raise ModelLoadError('no model at /nowhere')
    with pytest.raises(ModelLoadError, match='no model at /nowhere'):
        on_own_thread(fail)
