# SPDX-License-Identifier: Apache-2.0
"""Soak: a long mixed workload replayed from a bag; memory, threads, files and TPOT over time.

``python -m benchmarks.soak --minutes 30`` (``make soak``) starts the node with the
shipped configuration, writes a rosbag of robot-workload instructions (Poisson arrivals
at ``--rate``, a burst of ``--burst`` goals every ``--burst-every-s``, about 5 % bad goals:
empty instructions and zero budgets) and replays it (``tools/replay.py``). Beside the
replay an action client sends a goal every ``--cancel-every-s`` and cancels it after a
random delay, and a probe goal (same prompt, MODE_NONE, a fixed answer length) every
``--probe-every-s`` measures the time per output token. Every ``--sample-s`` the node
process's RSS, threads and open files are read from /proc.

Figures: unanswered goals (replayed without a Response, action goals without a result),
RSS growth after warm-up (median of the last tenth over the median just after the
first ``--warmup`` share), the change in threads and open files, and TPOT drift (median
probe TPOT of the last quarter over the second quarter). Outputs in --out (default
results/soak): bench.json, README.md, soak.png.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
import random
import shutil
import statistics
import sys
import threading
import time

from benchmarks import common, harness

NAMESPACE = '/soak'


def proc_sample(pid: int) -> dict:
    """Return RSS (MiB), threads and open files of a process from /proc."""
    values = {}
    with open(f'/proc/{pid}/status', encoding='utf-8') as handle:
        for line in handle:
            key, _, rest = line.partition(':')
            if key in ('VmRSS', 'Threads'):
                values[key] = int(rest.split()[0])
    return {'rss_mib': values.get('VmRSS', 0) / 1024.0, 'threads': values.get('Threads', 0),
            'open_files': len(os.listdir(f'/proc/{pid}/fd'))}


def workload(minutes: float, rate_hz: float, burst: int, burst_every_s: float,
             budgets: tuple, seed: int) -> list:
    """Return the WorkloadItems of the bag: Poisson arrivals, bursts and bad goals."""
    from timebill_ros.core.workload import MODES, POLICIES, WorkloadItem
    from timebill_ros.evaluation import robot_workload
    rng = random.Random(seed)
    items = robot_workload.load('test')
    span, t, out = minutes * 60.0, 0.0, []

    def add(at: float) -> None:
        item = rng.choice(items)
        i = len(out)
        bad = rng.random() < 0.05
        out.append(WorkloadItem(
            id=f'soak-{i:05d}', instruction='' if bad and i % 2 else item.instruction,
            context='' if bad else item.context, budget_s=0.0 if bad and not i % 2
            else rng.choice(budgets), arrival_s=round(at, 3),
            policy=POLICIES['kill'] if rng.random() < 0.8 else POLICIES['skip_next'],
            mode=MODES['auto']))
    while True:
        t += rng.expovariate(rate_hz)
        if t >= span:
            break
        add(t)
    at = burst_every_s
    while at < span:
        for _ in range(burst):
            add(at)
        at += burst_every_s
    return out


class SideClient:
    """Cancel goals and probe TPOT over the action while the bag replays."""

    def __init__(self, cancel_every_s: float, probe_every_s: float, probe_tokens: int,
                 seed: int):
        """Connect an action client to the soak node."""
        from timebill_ros.tools.client import InstructClient
        self.client = InstructClient(f'{NAMESPACE}/timebill/instruct', 'soak_side_client',
                                     f'{NAMESPACE}/timebill/responses')
        self.client.wait_for_server(60)
        self.cancel_every_s, self.probe_every_s = cancel_every_s, probe_every_s
        self.probe_tokens, self.rng = probe_tokens, random.Random(seed)
        self.runs, self.probes, self.stop = [], [], threading.Event()
        self.started = time.monotonic()

    def loop(self) -> None:
        """Send a goal to cancel and a probe at their periods until stopped."""
        from timebill_ros.tools.client import make_goal
        next_cancel, next_probe = self.cancel_every_s / 2, self.probe_every_s / 4
        while not self.stop.wait(0.05):
            now = time.monotonic() - self.started
            if now >= next_cancel:
                next_cancel += self.cancel_every_s
                run = self.client.send(make_goal('Describe the route to the charging dock.',
                                                 30.0, mode=0, max_new_tokens=64))
                self.runs.append(('cancel', run))
                threading.Timer(self.rng.uniform(0.0, 1.5), self._cancel, (run,)).start()
            if now >= next_probe:
                next_probe += self.probe_every_s
                run = self.client.send(make_goal('List three checks before driving.', 60.0,
                                                 mode=1, max_new_tokens=self.probe_tokens))
                self.runs.append(('probe', run))
                self.probes.append((now, run))

    def _cancel(self, run) -> None:
        try:
            self.client.cancel(run, 10.0)
        except Exception:  # noqa: BLE001 - a goal that already ended cannot be canceled
            pass

    def finish(self, timeout_s: float, alive=lambda: True) -> dict:
        """Wait for every side goal; return their counts and the probe TPOTs.

        ``timeout_s`` bounds the whole wait, not each goal's; once ``alive()`` says the
        node is gone no goal is waited for (each one left counts as unanswered).
        """
        from timebill_ros.tools.client import ClientTimeout, outcome_name
        self.stop.set()
        unanswered, outcomes, tpot = 0, {}, []
        until = time.monotonic() + timeout_s
        for kind, run in self.runs:
            left = until - time.monotonic() if alive() else 0.0
            try:
                self.client.wait(run, max(0.0, left))
            except ClientTimeout:
                unanswered += 1
                continue
            name = outcome_name(run.result.outcome) if run.accepted else 'REJECTED'
            outcomes[f'{kind} {name}'] = outcomes.get(f'{kind} {name}', 0) + 1
        for at, run in self.probes:
            res = run.result
            if run.accepted and res is not None and res.tokens > 1:
                tpot.append((at, res.decode_s / (res.tokens - 1)))
        self.client.close()
        return {'sent': len(self.runs), 'unanswered': unanswered, 'outcomes': outcomes,
                'tpot': tpot}


def drift(series: list, start: float, end: float, span: float) -> float:
    """Return median(last quarter) / median(second quarter) - 1 of (t, value) pairs."""
    def median_in(low, high):
        values = [v for t, v in series if low <= t < high]
        return statistics.median(values) if values else float('nan')
    quarter = (end - start) / 4.0
    base = median_in(start + quarter, start + 2 * quarter)
    last = median_in(start + 3 * quarter, end + span)
    return last / base - 1.0 if base == base and base > 0 else float('nan')


def figures(samples: list, side: dict, rows: list, warmup: float) -> dict:
    """Return the soak's figures from /proc samples, side-client goals and replay rows."""
    end = samples[-1]['t']
    after = [s for s in samples if s['t'] >= warmup * end]
    settle = after[:max(1, len(after) // 10)]
    tail = samples[-max(1, len(samples) // 10):]
    base_rss = statistics.median(s['rss_mib'] for s in settle)
    outcomes = {}
    for row in rows:
        outcomes[row['outcome']] = outcomes.get(row['outcome'], 0) + 1
    return {
        'replayed': len(rows), 'replay_outcomes': outcomes,
        'unanswered': outcomes.get('MISSING', 0) + side['unanswered'],
        'side_goals': side['sent'], 'side_outcomes': side['outcomes'],
        'rss_start_mib': samples[0]['rss_mib'], 'rss_after_warmup_mib': base_rss,
        'rss_end_mib': statistics.median(s['rss_mib'] for s in tail),
        'rss_growth_pct': (statistics.median(s['rss_mib'] for s in tail) / base_rss - 1) * 100,
        'threads_start': samples[0]['threads'], 'threads_max': max(s['threads'] for s in samples),
        'threads_end': samples[-1]['threads'],
        'open_files_start': samples[0]['open_files'],
        'open_files_max': max(s['open_files'] for s in samples),
        'open_files_end': samples[-1]['open_files'],
        'probes': len(side['tpot']),
        'tpot_drift_pct': drift(side['tpot'], 0.0, end, 1.0) * 100.0,
        'tpot_median_ms': statistics.median(v for _, v in side['tpot']) * 1e3
        if side['tpot'] else float('nan')}


def markdown(report: dict) -> str:
    """Render the README."""
    f = report['figures']
    return '\n'.join([
        f"# Soak ({report['date']})", '',
        f"`{report['command']}` on {report['machine']}, model {report['model']}, "
        f"{report['minutes']:.1f} min.", '',
        '| figure | value | target |', '|---|---|---|',
        f"| goals replayed from the bag | {f['replayed']} ({f['replay_outcomes']}) | |",
        f"| side goals (cancels, TPOT probes) | {f['side_goals']} ({f['side_outcomes']}) | |",
        f"| unanswered goals | {f['unanswered']} | 0 |",
        f"| RSS start / after warm-up / end | {f['rss_start_mib']:.0f} / "
        f"{f['rss_after_warmup_mib']:.0f} / {f['rss_end_mib']:.0f} MiB | |",
        f"| RSS growth after warm-up | {f['rss_growth_pct']:+.1f} % | <= 5 % |",
        f"| threads start / max / end | {f['threads_start']} / {f['threads_max']} / "
        f"{f['threads_end']} | no growth |",
        f"| open files start / max / end | {f['open_files_start']} / {f['open_files_max']} / "
        f"{f['open_files_end']} | no growth |",
        f"| probe TPOT median | {f['tpot_median_ms']:.1f} ms ({f['probes']} probes) | |",
        f"| TPOT drift (last quarter vs second) | {f['tpot_drift_pct']:+.1f} % | <= 5 % |",
        '', 'soak.png: RSS, threads, open files and probe TPOT over time.'])


def plot(report: dict, out: Path) -> None:
    """Write soak.png."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    samples = report['samples']
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    t = [s['t'] / 60 for s in samples]
    axes[0].plot(t, [s['rss_mib'] for s in samples])
    axes[0].set_ylabel('RSS MiB')
    axes[1].plot(t, [s['threads'] for s in samples], label='threads')
    axes[1].plot(t, [s['open_files'] for s in samples], label='open files')
    axes[1].legend()
    axes[2].plot([a / 60 for a, _ in report['tpot']], [v * 1e3 for _, v in report['tpot']],
                 marker='.')
    axes[2].set_ylabel('probe TPOT ms')
    for ax in axes:
        ax.set_xlabel('minutes')
    fig.tight_layout()
    fig.savefig(out / 'soak.png', dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    """Run the soak and write its outputs."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--minutes', type=float, default=30.0)
    parser.add_argument('--model', default='', help="'' = the shipped configuration's")
    parser.add_argument('--param', action='append', default=[], metavar='NAME=VALUE',
                        help='extra node parameter (YAML value)')
    parser.add_argument('--rate', type=float, default=0.15, help='Poisson goals per second')
    parser.add_argument('--burst', type=int, default=8)
    parser.add_argument('--burst-every-s', type=float, default=120.0)
    parser.add_argument('--budgets', type=float, nargs='+', default=[2.0, 5.0, 10.0])
    parser.add_argument('--cancel-every-s', type=float, default=20.0)
    parser.add_argument('--probe-every-s', type=float, default=30.0)
    parser.add_argument('--probe-tokens', type=int, default=32)
    parser.add_argument('--sample-s', type=float, default=10.0)
    parser.add_argument('--warmup', type=float, default=0.2, help='share of the run')
    parser.add_argument('--seed', type=int, default=5)
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    from benchmarks.common import machine, shipped_params
    from benchmarks.harness import write_outputs
    from timebill_ros.tools import bags
    import rclpy
    from timebill_ros.tools.client import ensure_init
    from timebill_ros.tools.process import NodeProcess
    from timebill_ros.tools.replay import replay
    params = shipped_params()
    if args.model:
        params['model'] = args.model
    params.update(common.param_pairs(args.param))
    out = harness.claim_out(args.out, 'soak')
    started = time.monotonic()
    ours = not rclpy.ok()
    ensure_init()
    node = NodeProcess(params, ready_timeout=900, namespace=NAMESPACE)
    samples, stop = [], threading.Event()

    def sample() -> None:
        while True:
            try:
                samples.append({'t': time.monotonic() - began, **proc_sample(node.proc.pid)})
            except OSError:
                return  # the node is gone
            if stop.wait(args.sample_s):
                return
    try:
        work = workload(args.minutes, args.rate, args.burst, args.burst_every_s,
                        tuple(args.budgets), args.seed)
        shutil.rmtree(out / 'run', ignore_errors=True)
        bag = bags.write_workload(out / 'run' / 'workload_bag', work)
        side = SideClient(args.cancel_every_s, args.probe_every_s, args.probe_tokens,
                          args.seed)
        began = time.monotonic()
        side.started = began
        threads = [threading.Thread(target=sample, daemon=True),
                   threading.Thread(target=side.loop, daemon=True)]
        for thread in threads:
            thread.start()
        result = replay(bag, out / 'run', node=f'{NAMESPACE}/timebill', timeout_s=180.0,
                        discovery_timeout_s=30.0, render=False)
        side_figures = side.finish(180.0, alive=lambda: node.proc.poll() is None)
        stop.set()
        threads[0].join(timeout=args.sample_s + 5)
        samples.append({'t': time.monotonic() - began, **proc_sample(node.proc.pid)})
        alive = node.proc.poll() is None
    finally:
        stop.set()
        node.stop()
        if ours:
            rclpy.try_shutdown()
    report = {'date': datetime.date.today().isoformat(), 'machine': machine(),
              'command': 'python -m benchmarks.soak '
                         + ' '.join(argv if argv is not None else sys.argv[1:]),
              'model': params['model'], 'minutes': (time.monotonic() - started) / 60,
              'node_alive_at_end': alive,
              'figures': figures(samples, side_figures, result.rows, args.warmup),
              'samples': samples, 'tpot': side_figures['tpot']}
    write_outputs(out, report, markdown, plot)
    return 0 if report['figures']['unanswered'] == 0 and alive else 1


if __name__ == '__main__':
    sys.exit(main())
