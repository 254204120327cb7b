# SPDX-License-Identifier: Apache-2.0
"""Small helpers the benchmarks and the builders of shipped data share.

Starting nodes, sending goals and writing a results folder: ``benchmarks.harness``.
"""

from __future__ import annotations

from datetime import datetime, timezone
import os
import platform
import subprocess
import sys
import time
from typing import Callable

import yaml

from benchmarks.paths import CONFIG, REPO


def machine() -> str:
    """Describe this machine: host, architecture, CPU model and count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as handle:
            for line in handle:
                if line.startswith('model name'):
                    cpu = line.split(':', 1)[1].strip()
                    break
    except OSError:
        pass
    return f'{platform.node()} {platform.machine()} ({cpu}), {os.cpu_count()} cpus'


def shipped_params() -> dict:
    """Return config/timebill.yaml's node parameters."""
    with open(CONFIG, encoding='utf-8') as handle:
        return yaml.safe_load(handle)['/**']['ros__parameters']


def param_pairs(pairs: list) -> dict:
    """Return {name: value} of NAME=VALUE pairs, each value read as the node reads YAML."""
    values = {}
    for pair in pairs:
        name, _, text = pair.partition('=')
        values[name] = yaml.safe_load(text)
    return values


def commit() -> str:
    """Return the repository's short commit hash ('unknown' outside a git checkout)."""
    try:
        return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


def stamped_log(started: float | None = None) -> Callable[[str], None]:
    """Return a ``log(message)`` that prints seconds since ``started`` (default: now)."""
    origin = time.monotonic() if started is None else started

    def log(message: str) -> None:
        print(f'[{time.monotonic() - origin:7.1f} s] {message}', flush=True)
    return log


def cpu_times(path: str = '/proc/stat') -> tuple | None:
    """Return (steal, total) jiffies of all CPUs from ``path``, or None where it is absent."""
    try:
        with open(path, encoding='utf-8') as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != 'cpu' or len(fields) < 9:
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
    # already counted in user and nice.
    values = [int(v) for v in fields[1:9]]
    return values[7], sum(values)


class StealMeter:
    """Measure the share of CPU time the hypervisor gave to other guests (steal).

    A virtual machine's speed swings with its neighbours' load; a benchmark that
    reports the steal share of each phase shows which figures the host disturbed.
    """

    def __init__(self, read: Callable[[], tuple | None] = cpu_times):
        """Start measuring from now."""
        self._read = read
        self._last = read()

    def share(self) -> float | None:
        """Return the steal share since the last call (or the start); None if unknown."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return (now[0] - last[0]) / (now[1] - last[1])


def run_header(module: str, argv=None) -> dict:
    """Return a run's command line, commit, machine and UTC date (the results' header)."""
    return {'command': ' '.join([f'python -m {module}', *(sys.argv[1:] if argv is None
                                                          else argv)]),
            'commit': commit(), 'machine': machine(),
            'date': datetime.now(timezone.utc).isoformat(timespec='seconds')}
