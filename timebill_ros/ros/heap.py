# SPDX-License-Identifier: Apache-2.0
"""Keep the collector's full passes short: what start-up loaded is frozen out of them.

A full garbage collection scans every tracked object with the GIL held, so every thread
of the node (the decode loop, the executor that answers goals) waits for it. After
start the heap holds ~400,000-500,000 tracked objects from torch, transformers and the
model (494,631 in `make demo`'s node): a full pass over 400,000 took 0.19 s on the 2-core
AMD EPYC VM (2026-12-05), longer than the 150-ms bound on a Kill's lateness.
``gc.freeze`` moves them to a generation the collector never scans; objects that goals
create are collected as before. Frozen objects are not finalised at exit either, so the
node unfreezes them before it stops (without that its DDS participant was not deleted,
and its action lingered in the graph other nodes see).
"""

import gc


def freeze_startup_heap() -> int:
    """Collect once, then exempt every object alive now from collection; return how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def release_heap() -> None:
    """Return frozen objects to the collector and collect (a released model is freed)."""
    gc.unfreeze()
    gc.collect()
