# SPDX-License-Identifier: Apache-2.0
"""A client process for the burst tests: send goals at once, report what came back as JSON.

Usage: python burst_client.py N BUDGET_S MAX_NEW_TOKENS [--hold]
With --hold it prints 'accepted' after its first goal is accepted and waits to be killed
(a client that vanishes mid-goal).
"""

import json
import sys
import threading

import rclpy

from timebill_ros.tools.client import ClientTimeout, InstructClient, make_goal


def main() -> int:
    count, budget, max_new = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    rclpy.init()
    client = InstructClient(node_name=f'burst_client_{threading.get_native_id()}')
    client.wait_for_server(60)
    goals = [make_goal(f'Report status {i}.', budget, max_new_tokens=max_new)
             for i in range(count)]
    runs = [client.send(goal) for goal in goals]
    if '--hold' in sys.argv:
        while not getattr(runs[0], 'handle', None):
            threading.Event().wait(0.01)
        print('accepted', flush=True)
        threading.Event().wait(600)
    summary = {'sent': count, 'accepted': 0, 'rejected': 0, 'reasons': 0, 'results': 0,
               'lost': 0}
    for run in runs:
        try:
            client.wait(run, budget + 120)
        except ClientTimeout:
            summary['lost'] += 1
            continue
        if run.accepted:
            summary['accepted'] += 1
            summary['results'] += run.result is not None
        else:
            summary['rejected'] += 1
            summary['reasons'] += bool(run.reject_reason)
    print(json.dumps(summary), flush=True)
    client.close()
    rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
