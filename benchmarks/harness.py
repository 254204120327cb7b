# SPDX-License-Identifier: Apache-2.0
"""The one harness: start nodes, send a workload, collect records, write a results folder.

``Nodes`` starts nodes (``timebill_ros.tools.process.NodeProcess``) each with its action
client (``clients[name]``: send goals to a node by its name) and stops them all; each
benchmark turns what comes back into its own plain records. ``tier_budget`` places a
goal's budget at a tier. A run's results go to a new folder (``claim_out``,
``claim_file``; never overwritten) under ``benchmarks.paths.RESULTS``, written by
``write_outputs`` (bench.json, README.md, plots).
"""

from __future__ import annotations

import json
from pathlib import Path
import sys
import time
from typing import Callable

from benchmarks.paths import RESULTS


def tier_budget(tier: str, full_s: float) -> float:
    """Return an item's budget at a tier ('0.5x' relative to its full time, or '2s')."""
    return float(tier[:-1]) * full_s if tier.endswith('x') else float(tier[:-1])


class Nodes:
    """Own the nodes and their clients (``clients[name].ask(goal, timeout_s)``)."""

    def __init__(self, log: Callable[[str], None] = print):
        """Start nothing yet."""
        self.log, self.nodes, self.clients = log, {}, {}

    def start_node(self, name: str, params: dict, namespace: str, client_name: str,
                   prepare: Callable | None = None) -> None:
        """Start node ``name`` with ``params`` in ``namespace`` and wait for its action server.

        ``prepare(client)`` runs before the wait (subscriptions the benchmark reads). A
        node that started is stopped by ``stop`` even when its client then failed.
        """
        from timebill_ros.tools.client import InstructClient
        from timebill_ros.tools.process import NodeProcess
        self.nodes[name] = NodeProcess(params, ready_timeout=900, namespace=namespace)
        client = InstructClient(f'{namespace}/timebill/instruct', client_name,
                                f'{namespace}/timebill/responses')
        if prepare is not None:
            prepare(client)
        client.wait_for_server(60)
        self.clients[name] = client

    def stop(self) -> None:
        """Close the clients and stop the nodes."""
        for client in self.clients.values():
            client.close()
        for node in self.nodes.values():
            node.stop()


def write_outputs(out: Path, report: dict, markdown, plot) -> None:
    """Write bench.json, README.md (``markdown(report)``) and the plots; print the tables."""
    with open(out / 'bench.json', 'w', encoding='utf-8') as handle:
        json.dump(report, handle, indent=1, default=str)
    text = markdown(report)
    (out / 'README.md').write_text(text + '\n', encoding='utf-8')
    plot(report, out)
    print(text)


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
    return RESULTS / f'{name}-{stamp}'


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
