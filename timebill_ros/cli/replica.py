# SPDX-License-Identifier: Apache-2.0
"""A `vllm serve` replica of the embedded model: start it, wait until healthy, stop it.

The fleet demo (``timebill_ros.cli.fleet_demo``) and the vLLM benchmarks
(``benchmarks.bench_vllm``, ``benchmarks.bench_fleet``) start replicas this way, from a
vLLM environment of their own (``--vllm-python``: vLLM needs a newer transformers than
the node).
"""

from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess
import time


def start_replica(python: str, model_dir: Path, port: int, log: Path, dtype: str = 'float32',
                  cpus: str = '', extra: tuple = (), nice: int = 0) -> subprocess.Popen:
    """Start ``vllm`` serving ``model_dir`` on ``port`` (CPU, priority scheduling).

    float32 by default: on CPUs without native bf16 (AVX2 only, as here) vLLM's bf16
    prefill is several times slower. ``cpus``: the cores its threads are bound to
    (vLLM's VLLM_CPU_OMP_THREADS_BIND; '' = vLLM's choice); ``extra``: more server flags;
    ``nice``: its CPU priority below the caller's (a replica sharing cores with the
    deadline node must not delay the node's Kill timers).
    """
    prefix = ['nice', '-n', str(nice)] if nice else []
    args = prefix + [
            python, '-m', 'vllm.entrypoints.openai.api_server', '--model', str(model_dir),
            '--served-model-name', 'smollm2', '--dtype', dtype, '--enforce-eager',
            '--max-model-len', '4096', '--max-num-seqs', '8', '--scheduling-policy',
            'priority', '--port', str(port), *extra]
    env = {**os.environ, 'VLLM_CPU_KVCACHE_SPACE': '1'}
    if cpus:
        env['VLLM_CPU_OMP_THREADS_BIND'] = cpus
    # Its own process group: vLLM runs its engine and workers in child processes, which
    # stop_replica must reach too.
    return subprocess.Popen(args, stdout=open(log, 'w'), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def stop_replica(proc: subprocess.Popen, timeout_s: float = 20.0, sig=signal.SIGTERM) -> None:
    """Stop a replica and its engine processes (SIGKILL after ``timeout_s``)."""
    for signal_to_send in (sig, signal.SIGKILL):
        try:
            os.killpg(proc.pid, signal_to_send)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout_s)
            return
        except subprocess.TimeoutExpired:  # a busy replica can take long to drain
            continue


def wait_healthy(client, url: str, proc, timeout_s: float = 600.0) -> float:
    """Wait until the replica answers /health; return the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f'vllm exited with {proc.returncode} (see its log)')
        try:
            if client.get(f'{url}/health', timeout=2.0).status_code == 200:
                return time.monotonic() - start
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(1.0)
    raise SystemExit('vllm did not become healthy')
