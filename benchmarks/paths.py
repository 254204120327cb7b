# SPDX-License-Identifier: Apache-2.0
"""Where the repository, its results and its shipped data are: the one place to ask.

``REPO`` is the checkout that holds the ``benchmarks`` package being run (found through
the import system, so every module of the lab agrees); ``TIMEBILL_REPO`` overrides it.
``RESULTS`` is ``REPO/results`` unless ``TIMEBILL_RESULTS`` names another folder.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def repo() -> Path:
    """Return the repository root: $TIMEBILL_REPO, else the folder above ``benchmarks``."""
    override = os.environ.get('TIMEBILL_REPO')
    if override:
        return Path(override).resolve()
    spec = importlib.util.find_spec('benchmarks')
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


REPO = repo()
RESULTS = Path(os.environ.get('TIMEBILL_RESULTS') or REPO / 'results')
# The shipped tables and heads (timebill_ros/data) and the node's shipped parameters.
DATA = REPO / 'timebill_ros' / 'data'
CONFIG = REPO / 'config' / 'timebill.yaml'
