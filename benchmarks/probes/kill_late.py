# SPDX-License-Identifier: Apache-2.0
"""Probe: where a torch goal's time goes on a long cached prompt (one node, Kill).

``python -m benchmarks.probes.kill_late busy``: route-024 and
route-023, loose twice, then 0.6-s goals back to back (py-spy on route-023's, when
installed). ``... kill_late idle``: route-024, 10 s idle before every other 0.6-s goal.
Results: results/engines/kill_late_probe.
"""
import argparse
import shutil
import subprocess
import time

import rclpy
from benchmarks.common import shipped_params
from timebill_ros.core.request import OverrunPolicy
from timebill_ros.evaluation import robot_workload
from timebill_ros.tools.client import InstructClient, make_goal
from timebill_ros.tools.process import NodeProcess

KILL = int(OverrunPolicy.KILL)

BUSY = ((120.0, 'loose'), (120.0, 'loose2'), (0.6, 'tight'), (0.6, 'tight'), (3.0, 'mid'),
        (0.6, 'tight'))
IDLE = ((120.0, 'loose'), (0.6, 'idle'), (0.6, 'busy'), (0.6, 'idle'), (0.6, 'busy'),
        (0.6, 'idle'))


def run(mode: str) -> None:
    """Run the probe and print one line per goal, then the node's last log lines."""
    items = {i.id: i for i in robot_workload.load('test')}
    rclpy.init()
    node = NodeProcess({**shipped_params(), 'auto_precision': 'int8-dynamic',
                        'llama_engines': ''}, ready_timeout=900, namespace='/probe')
    client = InstructClient('/probe/timebill/instruct', 'probe_client',
                            '/probe/timebill/responses')
    client.wait_for_server(60)
    spy = None
    try:
        for item_id in ('route-024', 'route-023') if mode == 'busy' else ('route-024',):
            item = items[item_id]
            for budget, label in BUSY if mode == 'busy' else IDLE:
                if label == 'idle':
                    time.sleep(10.0)
                if label == 'tight' and spy is None and item_id == 'route-023' \
                        and shutil.which('py-spy'):
                    spy = subprocess.Popen(
                        ['py-spy', 'record', '-p', str(node.proc.pid), '-r', '250',
                         '--nonblocking', '-f', 'raw', '-o', '/tmp/kill_late_probe.raw',
                         '--threads', '-d', '20'])
                    time.sleep(1.0)
                goal = make_goal(item.instruction, budget, item.context, policy=KILL, mode=1,
                                 max_new_tokens=128, precision='int8-dynamic',
                                 expected_tokens=128)
                res = client.ask(goal, budget + 180).result
                other = res.e2e_s - res.queue_s - res.prefill_s - res.decode_s
                print(f'{item_id} {label} budget {budget} e2e {res.e2e_s:.3f} '
                      f'queue {res.queue_s:.3f} prefill {res.prefill_s:.3f} '
                      f'decode {res.decode_s:.3f} other {other:.3f} '
                      f'est_prefill {res.plan.est_prefill_s:.3f} tokens {res.tokens} | '
                      f'{res.reason[:80]}', flush=True)
    finally:
        if spy:
            spy.wait(60)
        client.close()
        node.stop()
        rclpy.try_shutdown()
        print('\n'.join(node.lines[-40:]))


def main(argv=None) -> None:
    """Run the probe in the mode the command line names (busy by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('mode', nargs='?', choices=('busy', 'idle'), default='busy')
    run(parser.parse_args(argv).mode)


if __name__ == '__main__':
    main()
