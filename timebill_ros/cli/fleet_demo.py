# SPDX-License-Identifier: Apache-2.0
"""The fleet demo: a real `vllm serve` replica, the node in front of it, goals with deadlines.

``make fleet-demo`` (creates .venv-vllm first when missing). Starts one replica of the
embedded model (its own venv: ``--vllm-python``), the node with ``backend: vllm``
pointing at it and at an endpoint where nothing listens (a replica that is down), and
sends through the Instruct action: a command with a generous budget, a long answer
with a tight budget (Kill at the deadline), a schema command, a budget no replica can
meet (refused with the prediction), and a burst of robot commands. Prints what each
goal got; exits 1 when a goal ends differently from what it shows or is lost.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from timebill_ros.cli.demo import show, start_node, ROOT

PORT = 8041
DOWN = 'http://127.0.0.1:9'


def parse(argv) -> argparse.Namespace:
    """Return the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--vllm-python', default=os.path.join(ROOT, '.venv-vllm', 'bin',
                                                              'python'),
                        help="python of vLLM's venv (scripts/vllm_venv.sh makes it)")
    parser.add_argument('--burst', type=int, default=8, help='robot commands sent at once')
    return parser.parse_args(argv)


def goals(client, burst: int) -> list:
    """Send the demo's goals; return what went differently from what it shows."""
    from timebill_msgs.action import Instruct
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.tools.client import make_goal, outcome_name
    R, failures = Instruct.Result, []

    def stream(feedback):
        print(feedback.text_delta, end='', flush=True)

    print('\n1) generous budget (20 s):\n')
    run = client.ask(make_goal('What is the capital of France? Answer in one sentence.',
                               20.0, max_new_tokens=48), 120, stream)
    show('generous budget', run)
    if not run.accepted or run.result.outcome != R.COMPLETED:
        failures.append('generous budget did not complete')
    print('2) a long answer with a 3 s budget (Kill at the deadline):\n')
    run = client.ask(make_goal('Write a detailed essay about the history of robotics.', 3.0,
                               max_new_tokens=400), 120, stream)
    show('tight budget', run)
    if not run.accepted or run.result.outcome != R.KILLED:
        failures.append('tight budget was not killed')
    print('3) a schema command (JSON that validates):\n')
    schema = {'type': 'object', 'properties': {'lane': {'enum': ['left', 'right']},
                                               'speed_kmh': {'type': 'integer'}},
              'required': ['lane', 'speed_kmh']}
    run = client.ask(make_goal('Change to the left lane at 40 km/h.', 20.0, max_new_tokens=64,
                               json_schema=json.dumps(schema)), 120, stream)
    show('schema command', run)
    if not run.accepted or not run.result.valid:
        failures.append('schema command did not validate')
    print('4) a budget no replica can meet (50 ms):')
    run = client.ask(make_goal('Describe the route.', 0.05, max_new_tokens=64), 30)
    show('impossible budget', run)
    if run.accepted:
        failures.append('impossible budget was accepted')
    print(f'5) {burst} held-out robot commands at once, 5 s budgets:')
    items = robot_workload.load('test')[:burst]
    runs = [client.send(make_goal(item.instruction, 5.0, item.context, max_new_tokens=48))
            for item in items]
    for item, run in zip(items, runs):
        client.wait(run, 120)
        end = (f'REJECTED: {run.reject_reason}' if not run.accepted else
               f'{outcome_name(run.result.outcome)} met={run.result.deadline_met} '
               f'{run.result.e2e_s:.2f} s {run.result.text[:60]!r}')
        print(f'   {item.id:>14}: {end}')
        late = run.accepted and run.result.deadline_met and run.result.e2e_s > 5.0 + 1e-3
        if late or (run.accepted and run.result.outcome == R.FAILED):
            failures.append(f'{item.id}: {end}')
    return failures


def main(argv=None) -> int:
    """Start the replica and the node, send the goals, stop both."""
    args = parse(argv)
    if not Path(args.vllm_python).is_file():
        raise SystemExit(f'fleet-demo: no vLLM python at {args.vllm_python} '
                         '(run scripts/vllm_venv.sh)')
    import httpx
    import rclpy
    from timebill_ros.cli.replica import start_replica, stop_replica, wait_healthy
    from timebill_ros.runtime.export_vllm import export_for_vllm
    from timebill_ros.runtime.model import cache_root, embedded_dir
    from timebill_ros.tools.client import InstructClient
    model = export_for_vllm(embedded_dir(), cache_root() / 'models' / 'smollm2-vllm')
    log = Path(tempfile.gettempdir()) / 'timebill_fleet_demo_vllm.log'
    print(f'starting a vllm serve replica on port {PORT} (log: {log}) ...')
    replica = start_replica(args.vllm_python, model, PORT, log)
    node = client = None
    try:
        with httpx.Client() as http:
            seconds = wait_healthy(http, f'http://127.0.0.1:{PORT}', replica)
        print(f'  healthy after {seconds:.0f} s')
        node = start_node(os.path.join(ROOT, 'config', 'timebill.yaml'), [
            '-p', 'backend:=vllm', '-p', f'vllm_endpoints:={DOWN},http://127.0.0.1:{PORT}'])
        rclpy.init()
        client = InstructClient(node_name='timebill_fleet_demo')
        client.wait_for_server(30)
        failures = goals(client, args.burst)
    finally:
        if client is not None:
            client.close()
        rclpy.try_shutdown()
        if node is not None:
            node.send_signal(signal.SIGINT)
            node.wait(15)
        stop_replica(replica)
    if failures:
        print('fleet-demo: unexpected outcomes: ' + '; '.join(failures))
        return 1
    print('fleet-demo: every goal ended as shown; none lost.')
    return 0


if __name__ == '__main__':
    sys.exit(main())
