# SPDX-License-Identifier: Apache-2.0
"""Time a full garbage-collection pass after loading what the node loads, then after gc.freeze.

Run: `. ./env.sh && python -m benchmarks.probes.heap_gc` (prints the tracked objects,
two full passes, and one pass after freezing them). Results: results/heap.
"""

import argparse
import gc
import time

import rclpy  # noqa: F401 - the node's imports, as the node has them
import transformers  # noqa: F401

from timebill_ros.runtime import engine  # noqa: F401
from timebill_ros.runtime.model import load_model


def timed() -> float:
    """Return the seconds one full collection takes."""
    start = time.perf_counter()
    gc.collect()
    return time.perf_counter() - start


def main(argv=None) -> None:
    """Load the model, then time full collections before and after gc.freeze."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    model = load_model()  # held while the passes run, as the node holds it
    print('tracked objects', len(gc.get_objects()))
    print('full collect %.3f s' % timed(), '%.3f s' % timed())
    gc.freeze()
    print('after freeze: full collect %.4f s' % timed(), 'frozen', gc.get_freeze_count())
    del model


if __name__ == '__main__':
    main()
