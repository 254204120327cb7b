# SPDX-License-Identifier: Apache-2.0
"""Start-up objects leave the collector's passes; a released model's cycles are still freed."""

import gc
import weakref

from timebill_ros.ros.heap import freeze_startup_heap, release_heap


class Holder:
    """A stand-in for a model: an object in a reference cycle."""


def test_frozen_objects_leave_full_passes_and_release_frees_their_cycles():
    held = Holder()
    held.me = held  # a cycle: only the collector frees it
    alive = weakref.ref(held)
    try:
        frozen = freeze_startup_heap()
        assert frozen > 1000 and frozen == gc.get_freeze_count()
        assert all(obj is not held for obj in gc.get_objects())  # no pass scans it now
        del held
        gc.collect()
        assert alive() is not None  # frozen: a full pass leaves it alone
        release_heap()
        assert gc.get_freeze_count() == 0 and alive() is None
    finally:
        gc.unfreeze()
