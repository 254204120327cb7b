# SPDX-License-Identifier: Apache-2.0
"""Every module of the lab imports, and every command in it answers --help.

The lab (benchmarks/, their probes, training/) is not installed and runs for hours, so no
test runs it; this keeps each module importable against today's timebill_ros and each
command's line parseable, from the repository root as ``python -m`` runs them.
"""

import importlib
import inspect
import subprocess
import sys

import pytest

from benchmarks.paths import REPO

LAB = ('benchmarks', 'training')


def lab_files() -> dict:
    """Return {module name: path} of every module of the lab."""
    files = {}
    for lab in LAB:
        for path in sorted((REPO / lab).rglob('*.py')):
            parts = path.relative_to(REPO).with_suffix('').parts
            files['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    return files


def lab_modules() -> list:
    return list(lab_files())


def commands() -> list:
    """Return the modules that run as commands (a ``__main__`` block)."""
    return [name for name, path in lab_files().items()
            if "__name__ == '__main__'" in path.read_text(encoding='utf-8')]


def test_the_lab_is_found():
    names = lab_modules()
    assert 'benchmarks.harness' in names and 'training.measure_cuts' in names
    assert 'benchmarks.bench_robot' in commands() and 'benchmarks.probes.heap_gc' in commands()


@pytest.mark.parametrize('name', lab_modules())
def test_every_module_imports(name):
    importlib.import_module(name)


@pytest.mark.parametrize('name', commands())
def test_every_command_answers_help(name, capsys):
    main = getattr(importlib.import_module(name), 'main', None)
    assert main is not None, f'{name}: a command without main()'
    if 'argv' not in inspect.signature(main).parameters:
        pytest.skip(f'{name}: main() takes no command line (argv)')
    with pytest.raises(SystemExit) as stop:
        main(['--help'])
    assert stop.value.code == 0
    assert 'usage:' in capsys.readouterr().out


def test_python_m_finds_the_lab_from_the_repository_root():
    proc = subprocess.run([sys.executable, '-m', 'benchmarks.bench_robot', '--help'],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and 'usage:' in proc.stdout, proc.stderr
