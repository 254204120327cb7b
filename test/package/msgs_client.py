# SPDX-License-Identifier: Apache-2.0
"""Send one Instruct goal knowing timebill_msgs only, and print its result as one JSON line.

test_msgs_package.py runs this as its own process, the way another team's client runs:
rclpy and timebill_msgs, nothing of timebill_ros (importing it here raises ImportError).

    python msgs_client.py ACTION INSTRUCTION BUDGET_S MAX_NEW_TOKENS
"""

import json
import math
import sys

# Any `import timebill_ros` from here on (this script, rclpy, the generated code) fails.
sys.modules['timebill_ros'] = None

import rclpy  # noqa: E402
from rclpy.action import ActionClient  # noqa: E402

from timebill_msgs.action import Instruct  # noqa: E402

TIMEOUT_S = 120.0


def ask(node, action: str, instruction: str, budget_s: float, max_new_tokens: int) -> dict:
    """Send the goal, wait for its result and return it as plain values."""
    client = ActionClient(node, Instruct, action)
    if not client.wait_for_server(timeout_sec=TIMEOUT_S):
        return {'error': f'no action server on {action}'}
    goal = Instruct.Goal(instruction=instruction, max_new_tokens=max_new_tokens)
    goal.budget.sec = math.floor(budget_s)
    goal.budget.nanosec = round((budget_s - goal.budget.sec) * 1e9)
    sent = client.send_goal_async(goal)
    rclpy.spin_until_future_complete(node, sent, timeout_sec=TIMEOUT_S)
    handle = sent.result()
    if handle is None or not handle.accepted:
        return {'error': 'the goal was not accepted'}
    done = handle.get_result_async()
    rclpy.spin_until_future_complete(node, done, timeout_sec=TIMEOUT_S)
    if done.result() is None:
        return {'error': 'no result in time'}
    status, result = done.result().status, done.result().result
    return {'status': status, 'outcome': result.outcome, 'tokens': result.tokens,
            'deadline_met': result.deadline_met, 'text': result.text,
            'reason': result.reason}


def main(argv) -> int:
    """Ask the node in ``argv`` one question; print the result line; 0 when one came."""
    action, instruction, budget_s, max_new_tokens = argv[0], argv[1], float(argv[2]), \
        int(argv[3])
    rclpy.init()
    node = rclpy.create_node('timebill_msgs_only_client')
    try:
        answer = ask(node, action, instruction, budget_s, max_new_tokens)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    answer['modules'] = sorted(name for name, module in sys.modules.items()
                               if name.startswith('timebill') and module is not None)
    answer['interfaces_from'] = sys.modules['timebill_msgs'].__file__
    print(json.dumps(answer))
    return 1 if 'error' in answer else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
