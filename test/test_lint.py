# SPDX-License-Identifier: Apache-2.0
"""flake8 (99 columns) and pep257 docstrings, run as tests like ament_flake8/ament_pep257."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The package, the lab beside it (benchmarks/, training/: not installed, linted the same),
# the tests and the scripts; the Makefile's LINT_PATHS and DOC_PATHS name the same.
PATHS = ['timebill_ros', 'benchmarks', 'training', 'test', 'launch', 'scripts/timebill_node',
         'scripts/ete_in_node.py']
DOC_PATHS = ['timebill_ros', 'benchmarks', 'training', 'test', 'scripts/ete_in_node.py']


def run(*args):
    return subprocess.run([sys.executable, '-m', *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_flake8():
    proc = run('flake8', '--max-line-length', '99', *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pep257():
    # The ament_pep257 defaults: missing docstrings are not errors, style of present ones is.
    proc = run('pydocstyle', '--convention=pep257',
               '--add-ignore=D100,D101,D102,D103,D104,D105,D106,D107', *DOC_PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
