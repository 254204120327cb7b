# SPDX-License-Identifier: Apache-2.0
"""bench_fleet: the robot workload on vLLM replicas, through the node vs a plain client.

``python -m benchmarks.bench_fleet --vllm-python .venv-vllm/bin/python``
(``make bench-fleet``). Per pool (one replica, then two), it starts real `vllm serve`
replicas (bench_vllm.start_replica; with two on this machine each is bound to one core)
and the node with ``backend: vllm`` in front of them, then:

1. Capacity: 16 train-split commands at once through a plain client; the pool's
   capacity is goals / makespan.
2. Per load (default 0.5, 1, 1.5, 2 x capacity): the same seeded Poisson arrivals of
   held-out robot commands (any kind, context included), each with a budget drawn from
   ``--budgets``, sent (a) as Instruct goals through the node (deadline planning:
   admission by the predicted finish, the deadline as vLLM priority, Kill at the
   deadline) and (b) by a plain client: FCFS, round-robin over the replicas, the
   request stopped at its budget (a per-request timeout), no planning.
3. With two replicas, one more node run at load 1 where one replica is killed halfway.

Then, with the replicas stopped, the node with its local engine (the shipped
configuration) gets the one-replica arrival schedules. Per cell: met, refused, killed,
failed, lost (no answer: must be 0), late answers claimed on time, worst end past the
deadline. Writes bench.json and README.md to a new results folder.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
import itertools
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

from benchmarks import common, harness
from benchmarks.bench_vllm import stop_replica

BUDGETS = (3.0, 5.0, 10.0)
LOADS = (0.5, 1.0, 1.5, 2.0)
BASE_PORT = 8031
REPLICA_ARGS = '--no-enable-prefix-caching --max-num-batched-tokens 512'


def schedule(items: list, goals: int, rate: float, budgets: tuple, seed: int) -> list:
    """Return [(arrival s, item, budget s)]: Poisson arrivals at ``rate`` goals/s."""
    rng, at, out = random.Random(seed), 0.0, []
    for _ in range(goals):
        at += rng.expovariate(rate)
        out.append((at, items[rng.randrange(len(items))], rng.choice(budgets)))
    return out


def replay(arrivals: list, send) -> None:
    """Call ``send(item, budget)`` at each arrival time (on a thread per goal)."""
    start, threads = time.monotonic(), []
    for at, item, budget in arrivals:
        time.sleep(max(0.0, start + at - time.monotonic()))
        thread = threading.Thread(target=send, args=(item, budget), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(budget for *_, budget in arrivals) + 120.0)


class Records:
    """Goal records kept as they end (from many sender threads)."""

    def __init__(self):
        """Start with none."""
        self.lock, self.records = threading.Lock(), []

    def _keep(self, record: dict) -> None:
        with self.lock:
            self.records.append(record)

    def take(self) -> list:
        """Return and clear the records so far."""
        with self.lock:
            records, self.records = self.records, []
        return records


class Plain(Records):
    """The baseline: FCFS on the replicas, round-robin, each request cut at its budget."""

    def __init__(self, urls: list, max_tokens: int):
        """Hold one HTTP client for the replicas."""
        import httpx
        super().__init__()
        self.urls, self.max_tokens = itertools.cycle(urls), max_tokens
        self.client = httpx.Client(limits=httpx.Limits(max_connections=256))

    def send(self, item, budget_s: float) -> None:
        """Stream one command with vLLM's default priority (0: arrival order)."""
        from timebill_ros.runtime.model import chat_messages
        from timebill_ros.serving.remote import RemoteGoal, stream_goal
        with self.lock:
            url = next(self.urls)
        goal = RemoteGoal(messages=tuple(chat_messages(item.instruction, item.context)),
                          max_tokens=self.max_tokens)
        deadline = time.monotonic() + budget_s
        answer = stream_goal(self.client, url, goal.body('smollm2', 0), deadline)
        met = answer.ended == 'completed' and answer.finished <= deadline
        outcome = {'completed': 'COMPLETED', 'killed': 'KILLED'}.get(answer.ended, 'FAILED')
        self._keep({'item': item.id, 'kind': item.kind, 'budget_s': budget_s,
                    'outcome': outcome, 'met': met, 'claimed': met,
                    'e2e_s': answer.finished - answer.started, 'tokens': answer.tokens,
                    'reason': answer.error})


class ThroughNode(Records):
    """Goals through the node's action (one client), recorded as they end."""

    def __init__(self, namespace: str, name: str, max_tokens: int):
        """Connect an action client to the node in ``namespace``."""
        from timebill_ros.tools.client import InstructClient
        super().__init__()
        self.client = InstructClient(f'{namespace}/timebill/instruct', name,
                                     f'{namespace}/timebill/responses')
        self.client.wait_for_server(120)
        self.max_tokens = max_tokens

    def send(self, item, budget_s: float) -> None:
        """Send one goal and wait until it ends; no answer in budget + 60 s counts as lost."""
        from timebill_ros.tools.client import ClientTimeout, make_goal, outcome_name
        record = {'item': item.id, 'kind': item.kind, 'budget_s': budget_s}
        try:
            run = self.client.ask(make_goal(item.instruction, budget_s, item.context,
                                            max_new_tokens=self.max_tokens), budget_s + 60.0)
        except ClientTimeout as exc:
            record.update(outcome='LOST', met=False, claimed=False, e2e_s=budget_s,
                          tokens=0, reason=str(exc))
        else:
            if not run.accepted:
                record.update(outcome='REJECTED', met=False, claimed=False, e2e_s=0.0,
                              tokens=0, reason=run.reject_reason)
            else:
                res = run.result
                record.update(outcome=outcome_name(res.outcome), claimed=bool(res.deadline_met),
                              met=bool(res.deadline_met and outcome_name(res.outcome)
                                       == 'COMPLETED'),
                              e2e_s=res.e2e_s, client_s=run.finished_at - run.sent_at,
                              tokens=res.tokens, reason=res.reason)
        self._keep(record)

    def close(self) -> None:
        """Close the action client."""
        self.client.close()


def cell(records: list) -> dict:
    """Return one cell's figures."""
    def count(outcome):
        return sum(r['outcome'] == outcome for r in records)
    late = [r['e2e_s'] - r['budget_s'] for r in records if r['outcome'] in ('KILLED',)]
    return {'goals': len(records), 'met': sum(r['met'] for r in records),
            'refused': count('REJECTED'), 'killed': count('KILLED'),
            'skipped': count('SKIPPED'), 'failed': count('FAILED'), 'lost': count('LOST'),
            'late_claimed': sum(r['claimed'] and r['e2e_s'] > r['budget_s'] + 1e-3
                                for r in records),
            'worst_kill_late_s': max(late) if late else 0.0,
            'median_kill_late_s': statistics.median(late) if late else 0.0,
            'records': records}


class Pool:
    """Real `vllm serve` replicas on this machine (one core each when there are two)."""

    def __init__(self, args, model_dir, count: int, out, log):
        """Start ``count`` replicas and wait until each answers /health."""
        import httpx
        from benchmarks.bench_vllm import start_replica, wait_healthy
        binds = [''] if count == 1 else [str(i % 2) for i in range(count)]
        self.urls = [f'http://127.0.0.1:{BASE_PORT + i}' for i in range(count)]
        self.procs = [start_replica(args.vllm_python, model_dir, BASE_PORT + i,
                                    out / f'vllm_{count}_{i}.log', args.dtype, binds[i],
                                    tuple(args.replica_args.split()), args.replica_nice)
                      for i in range(count)]
        with httpx.Client() as client:
            for url, proc in zip(self.urls, self.procs):
                log(f'{url} healthy after {wait_healthy(client, url, proc):.0f} s')

    def settle(self, timeout_s: float = 60.0) -> float:
        """Wait until no replica runs or queues a request (vLLM's /metrics); return seconds.

        Cut streams are aborted by vLLM when it notices the closed connection, so a cell
        ends only when the previous one's requests are gone from every replica.
        """
        import httpx
        start = time.monotonic()
        with httpx.Client() as client:
            while time.monotonic() - start < timeout_s:
                busy = 0.0
                for url, proc in zip(self.urls, self.procs):
                    if proc.poll() is not None:
                        continue
                    try:
                        text = client.get(f'{url}/metrics', timeout=5.0).text
                    except httpx.HTTPError:
                        continue
                    busy += sum(float(line.rsplit(' ', 1)[1]) for line in text.splitlines()
                                if line.startswith(('vllm:num_requests_running{',
                                                    'vllm:num_requests_waiting{')))
                if busy == 0.0:
                    break
                time.sleep(0.5)
        return time.monotonic() - start

    def kill(self, index: int) -> None:
        """Kill one replica's process (SIGKILL: it ends mid-answer)."""
        stop_replica(self.procs[index], sig=signal.SIGKILL)

    def stop(self) -> None:
        """Stop every replica."""
        for proc in self.procs:
            stop_replica(proc)


def capacity(plain: Plain, items: list) -> float:
    """Return goals/s when ``items`` are sent at once with a loose budget."""
    start = time.monotonic()
    replay([(0.0, item, 120.0) for item in items], plain.send)
    records = plain.take()
    return sum(r['outcome'] == 'COMPLETED' for r in records) / (time.monotonic() - start)


def run_pool(args, model_dir, count: int, held, train, out, log, schedules: dict,
             keep=lambda cell: None) -> tuple:
    """Run one pool's cells (node and plain client at each load); return (cells, capacity)."""
    from timebill_ros.tools.process import NodeProcess
    pool, cells = Pool(args, model_dir, count, out, log), []
    node = through = None
    rate = 0.0
    try:
        params = {**common.shipped_params(), 'backend': 'vllm',
                  'vllm_endpoints': ','.join(pool.urls)}
        node = NodeProcess(params, ready_timeout=300, namespace=f'/fleet{count}')
        through = ThroughNode(f'/fleet{count}', f'bench_fleet_{count}', args.max_tokens)
        plain = Plain(pool.urls, args.max_tokens)
        rate = capacity(plain, train[:16])
        pool.settle()
        log(f'{count} replica(s): capacity {rate:.3f} goals/s')
        replay(schedule(train, 8, 0.5 * rate, args.budgets, args.seed), through.send)
        through.take()  # the node's first look at the replicas' timing: not counted
        pool.settle()
        for index, load in enumerate(args.loads):
            arrivals = schedule(held, args.goals, load * rate, args.budgets,
                                args.seed + int(100 * load))
            schedules.setdefault(count, {})[load] = arrivals
            systems = (('node', through), ('plain', plain))
            for name, system in systems[::-1] if index % 2 else systems:  # who goes first
                replay(arrivals, system.send)
                cells.append({'replicas': count, 'load': load, 'system': name,
                              'rate': load * rate, **cell(system.take())})
                keep(cells[-1])
                log(f"{count} x {load}: {name} met {cells[-1]['met']}/{args.goals}, "
                    f"refused {cells[-1]['refused']}, lost {cells[-1]['lost']}; replicas idle "
                    f"after {pool.settle():.1f} s more")
        if count > 1:
            arrivals = schedule(held, args.goals, rate, args.budgets, args.seed + 7)
            threading.Timer(arrivals[len(arrivals) // 2][0], pool.kill, (0,)).start()
            replay(arrivals, through.send)
            cells.append({'replicas': count, 'load': 1.0, 'system': 'node, replica 0 killed',
                          'rate': rate, **cell(through.take())})
            keep(cells[-1])
            log(f"replica killed: met {cells[-1]['met']}, lost {cells[-1]['lost']}")
    finally:
        if through is not None:
            through.close()
        if node is not None:
            node.stop()
        pool.stop()
    return cells, rate


def run_local(args, schedules: dict, log) -> list:
    """Replay the one-replica schedules on the node's own engine (shipped configuration)."""
    from timebill_ros.tools.process import NodeProcess
    node = NodeProcess(common.shipped_params(), ready_timeout=900, namespace='/fleet_local')
    through, cells = ThroughNode('/fleet_local', 'bench_fleet_local', args.max_tokens), []
    try:
        for load, arrivals in sorted(schedules.get(1, {}).items()):
            replay(arrivals, through.send)
            cells.append({'replicas': 0, 'load': load, 'system': 'local engine',
                          'rate': 0.0, **cell(through.take())})
            log(f"local x {load}: met {cells[-1]['met']}/{len(arrivals)}")
    finally:
        through.close()
        node.stop()
    return cells


def markdown(report: dict) -> str:
    """Return the results folder's README."""
    lines = ['# The robot workload on vLLM replicas: through the node vs a plain client', '',
             f"Command: `{report['command']}`  ", f"Commit: {report['commit']}  ",
             f"Date: {report['date']}  ", f"Machine: {report['machine']}  ",
             f"vLLM {report['vllm']}, {report['dtype']}, `{report['replica_args']}`, "
             f"replicas at nice {report.get('replica_nice', 0)}; "
             f"{report['goals']} held-out robot "
             f"commands per cell, budgets {report['budgets']} s, max_tokens "
             f"{report['max_tokens']}; capacity (goals/s): {report['capacity']}.", '',
             '| replicas | load | system | met | refused | killed | failed | lost | '
             'late claimed on time | worst Kill past deadline (s) | met vs plain |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    plain = {(c['replicas'], c['load']): c['met'] for c in report['cells']
             if c['system'] == 'plain'}
    for c in report['cells']:
        base = plain.get((1 if c['replicas'] == 0 else c['replicas'], c['load']))
        ratio = (f"{c['met'] / base:.2f}x" if base else
                 '- (plain met 0)' if base == 0 else '-')
        lines.append(f"| {c['replicas'] or 'local'} | {c['load']:g} | {c['system']} | "
                     f"{c['met']}/{c['goals']} | {c['refused']} | {c['killed']} | "
                     f"{c['failed']} | {c['lost']} | {c['late_claimed']} | "
                     f"{c['worst_kill_late_s']:.3f} | {ratio} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Run the pools (and the local engine), write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--vllm-python', required=True, help="python of vLLM's venv")
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    parser.add_argument('--goals', type=int, default=24, help='goals per cell')
    parser.add_argument('--loads', type=float, nargs='+', default=LOADS)
    parser.add_argument('--replicas', type=int, nargs='+', default=(1, 2))
    parser.add_argument('--budgets', type=float, nargs='+', default=BUDGETS)
    parser.add_argument('--max-tokens', type=int, default=64)
    parser.add_argument('--dtype', default='float32')
    parser.add_argument('--seed', type=int, default=31)
    parser.add_argument('--replica-args', default=REPLICA_ARGS,
                        help='more vllm serve flags (default: no prefix cache, so the second '
                        'system of a cell does not find the first one\'s prompts cached; '
                        'prefill in 512-token chunks, so decode steps interleave)')
    parser.add_argument('--replica-nice', type=int, default=10,
                        help="replicas' CPU priority below the node's (they share its cores "
                        'here; 0: equal, as runs before 2026-12-04)')
    parser.add_argument('--no-local', action='store_true', help='skip the local engine')
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'fleet')
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.runtime.export_vllm import export_for_vllm
    from timebill_ros.runtime.model import cache_root, embedded_dir
    from timebill_ros.tools.client import ensure_init
    log = common.stamped_log()
    ensure_init()
    model_dir = export_for_vllm(embedded_dir(), cache_root() / 'models' / 'smollm2-vllm')
    held, train = robot_workload.load('test'), robot_workload.load('train')
    report = {'command': ' '.join(['python -m benchmarks.bench_fleet', *sys.argv[1:]]),
              'commit': common.commit(), 'machine': common.machine(),
              'date': datetime.now(timezone.utc).isoformat(timespec='seconds'),
              'goals': args.goals, 'budgets': list(args.budgets), 'dtype': args.dtype,
              'max_tokens': args.max_tokens, 'capacity': {}, 'cells': [],
              'replica_args': args.replica_args, 'replica_nice': args.replica_nice,
              'vllm': subprocess.run([args.vllm_python, '-c',
                                      'import vllm; print(vllm.__version__)'],
                                     capture_output=True, text=True).stdout.strip()}
    schedules: dict = {}

    def keep(cell):  # written after every cell, so a crash keeps what ran
        report['cells'].append(cell)
        harness.write_outputs(out, report, markdown, lambda report, out: None)
    for count in args.replicas:
        _, rate = run_pool(args, model_dir, count, held, train, out, log, schedules, keep)
        report['capacity'][count] = round(rate, 3)
        harness.write_outputs(out, report, markdown, lambda report, out: None)
    if not args.no_local:
        report['cells'] += run_local(args, schedules, log)
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    return 0


if __name__ == '__main__':
    sys.exit(main())
