# SPDX-License-Identifier: Apache-2.0
"""Print the node's ETE error for full-cache and evicted runs of the e2e eviction prompt.

Usage, from the repo root after ``. ./env.sh``::

    REPS=2 python scripts/ete_in_node.py [profile.yaml]

Starts the node with the embedded model and the given (or cached) profile, then per
repetition runs MODE_NONE with a loose budget and MODE_EVICTION with a budget between
the node's WCET at alpha_max and at alpha = 0 (as test_node_embedded does), printing
estimated vs measured prefill, decode and e2e from ~/telemetry.
"""

import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, '..', 'test'), os.path.join(HERE, '..', 'test', 'ros')]
os.environ['ROS_DOMAIN_ID'] = str(random.randint(101, 200))
os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')

import rclpy  # noqa: E402  (after the DDS domain is chosen)
from builtin_interfaces.msg import Duration  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from conftest import NodeProcess  # noqa: E402
from test_node_embedded import CONTEXT, G, INSTRUCTION, MAX_NEW, _plan  # noqa: E402
from timebill_msgs.msg import DeadlineTelemetry  # noqa: E402
from timebill_msgs.srv import PlanInstruction  # noqa: E402
from timebill_ros.tools.client import InstructClient, make_goal  # noqa: E402

DEFAULT_PROFILE = '~/.cache/timebill_ros/profiles/SmolLM2-135M-Instruct-cpu-float32.yaml'


def show(tag, telemetry):
    """Print the last telemetry message: estimates against measurements."""
    time.sleep(1.0)  # telemetry follows the result
    t = telemetry[-1]
    p = t.plan
    print(f'{tag}: alpha={p.eviction_ratio:.3f} Nx={t.prompt_tokens} tokens={t.tokens} '
          f'prefill {t.prefill_s:.3f} (est {p.est_prefill_s:.3f}) decode {t.decode_s:.3f} '
          f'e2e {t.e2e_s:.3f} (plan WCET {p.est_wcet_s:.3f} for {p.worst_case_tokens} tokens) '
          f'ETE for what ran {t.est_compute_s:.3f} -> error {t.ete_error_pct:+.1f} % '
          f'TPOT {t.tpot_mean_s * 1e3:.1f} ms outcome {t.outcome}', flush=True)


def main():
    """Run the repetitions and print one line per goal."""
    rclpy.init()
    profile = os.path.expanduser(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_PROFILE)
    node = NodeProcess({'model': 'embedded', 'profile': profile,
                        'calibrate_on_start': False}, ready_timeout=600)
    telemetry = []
    sub = rclpy.create_node('ete_in_node_telemetry')
    sub.create_subscription(DeadlineTelemetry, '/timebill/telemetry', telemetry.append, 10)
    executor = SingleThreadedExecutor()
    executor.add_node(sub)
    threading.Thread(target=executor.spin, daemon=True).start()
    client = InstructClient(node_name='ete_in_node_client')
    client.wait_for_server(30)
    try:
        for _ in range(int(os.environ.get('REPS', '2'))):
            base = client.ask(make_goal(INSTRUCTION, 300.0, CONTEXT, mode=G.MODE_NONE,
                                        max_new_tokens=MAX_NEW), 600)
            show('full ', telemetry)
            plan = _plan(PlanInstruction.Request(
                instruction=INSTRUCTION, context=CONTEXT, budget=Duration(sec=300),
                mode=G.MODE_EVICTION, max_new_tokens=MAX_NEW)).plan
            margin = 0.10
            lowest = plan.est_wcet_alpha_max_s / (1 - margin)
            budget = (lowest + min(plan.est_wcet_full_s, base.result.e2e_s)) / 2
            client.ask(make_goal(INSTRUCTION, budget, CONTEXT, mode=G.MODE_EVICTION,
                                 max_new_tokens=MAX_NEW), 600)
            show(f'evict (budget {budget:.2f} s)', telemetry)
    finally:
        client.close()
        executor.shutdown(timeout_sec=2)
        node.stop()
        rclpy.try_shutdown()


if __name__ == '__main__':
    main()
