"""Small helpers the benchmark and measurement commands share."""

from __future__ import annotations

import json
import os
from pathlib import Path
import platform
import subprocess
import sys
import time
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parents[2]


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
    with open(ROOT / 'config' / 'timebill.yaml', encoding='utf-8') as handle:
        return yaml.safe_load(handle)['/**']['ros__parameters']


def param_pairs(pairs: list) -> dict:
    """Return {name: value} of NAME=VALUE pairs, each value read as the node reads YAML."""
    values = {}
    for pair in pairs:
        name, _, text = pair.partition('=')
        values[name] = yaml.safe_load(text)
    return values


def write_outputs(out: Path, report: dict, markdown, plot) -> None:
    """Write bench.json, README.md (``markdown(report)``) and the plots; print the tables."""
    with open(out / 'bench.json', 'w', encoding='utf-8') as handle:
        json.dump(report, handle, indent=1, default=str)
    text = markdown(report)
    (out / 'README.md').write_text(text + '\n', encoding='utf-8')
    plot(report, out)
    print(text)


def commit() -> str:
    """Return the repository's short commit hash ('unknown' outside a git checkout)."""
    try:
        return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


def new_results_dir(path: str) -> Path | None:
    """Return ``path`` as a Path when it does not exist yet; else say why and return None.

    Benchmarks never overwrite shipped results.
    """
    out = Path(path)
    if out.exists():
        print(f'{out} exists: results are never overwritten', file=sys.stderr)
        return None
    return out


OUT_HELP = 'new results folder (default: results/<benchmark>-<UTC time>); never overwritten'


def run_dir(name: str) -> Path:
    """Return a new folder for one run: results/<name>-<UTC date and time>."""
    stamp = time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())
    return ROOT / 'results' / f'{name}-{stamp}'


def claim_out(path: str | None, name: str, resumable: bool = False) -> Path:
    """Return the run's output folder: ``path``, or a new one named after ``name``.

    Benchmarks never overwrite: an existing folder is refused (SystemExit with why),
    except an unfinished run of a ``resumable`` benchmark (partial.json, no bench.json),
    which the benchmark continues.
    """
    out = Path(path) if path else run_dir(name)
    unfinished = (out / 'partial.json').is_file() and not (out / 'bench.json').exists()
    if out.exists() and not (resumable and unfinished):
        raise SystemExit(f'{out} exists: results are never overwritten (give a new --out)')
    out.mkdir(parents=True, exist_ok=True)
    return out


def claim_file(path: str | None, name: str) -> Path:
    """Return an output file path: ``path``, or results/<name>-<UTC time>/<name>.

    An existing file (or, for a stem, its .json) is refused: SystemExit with why.
    """
    out = Path(path) if path else run_dir(name) / name
    if out.exists() or out.with_suffix('.json').exists():
        raise SystemExit(f'{out} exists: results are never overwritten (give a new --out)')
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


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
