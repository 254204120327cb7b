# SPDX-License-Identifier: Apache-2.0
"""The main job: start the node with the embedded model and send goals with deadlines.

Shows streamed tokens and outcomes for a generous budget, a budget too tight to
finish (Kill), an overrun under Skip-Next that skips the next queued goal, and a
bad goal that is rejected with a reason while the node keeps serving.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_node(params_file: str, extra: list, timeout_s: float = 900.0) -> subprocess.Popen:
    """Start the node process and wait until it logs that it is ready."""
    args = [sys.executable, '-m', 'timebill_ros.ros.node', '--ros-args',
            '--params-file', params_file, *extra]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            # Echo start-up; later node logs would cut into the streamed answers.
            if not ready.is_set() or 'ERROR' in line or 'WARN' in line:
                sys.stdout.write(f'  [node] {line}')
            if ']: ready:' in line:
                ready.set()
        ready.set()
    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout_s) or proc.poll() is not None:
        proc.kill()
        raise SystemExit(f'demo: node did not start (exit code {proc.poll()})')
    return proc


def show(title: str, run) -> None:
    """Print one goal's outcome."""
    from timebill_ros.core.request import Outcome
    if not run.accepted:
        print(f'\n  -> {title}: REJECTED ({run.reject_reason})\n')
        return
    res = run.result
    print(f'\n  -> {title}: {Outcome(res.outcome).name}, deadline_met={res.deadline_met}, '
          f'{res.tokens} tokens, e2e {res.e2e_s:.2f} s\n     reason: {res.reason}\n')


def main(argv=None) -> int:
    """Run the demo; exit non-zero if any goal ends differently from what it shows."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--params-file', default=os.path.join(ROOT, 'config', 'timebill.yaml'))
    parser.add_argument('--model', default='', help="override the 'model' parameter")
    args = parser.parse_args(argv)
    extra = ['-p', f'model:={args.model}'] if args.model else []
    print('starting the timebill node (first start dequantises the embedded model)...')
    node = start_node(args.params_file, extra)
    import rclpy
    from timebill_msgs.action import Instruct
    from timebill_ros.tools.client import InstructClient, make_goal
    R, G = Instruct.Result, Instruct.Goal
    rclpy.init()
    client = InstructClient(node_name='timebill_demo')
    failures = []
    try:
        client.wait_for_server(30)

        def stream(f):
            print(f.text_delta, end='', flush=True)

        print('\n1) generous budget (20 s), Kill policy:\n')
        run = client.ask(make_goal('What is the capital of France? Answer in one sentence.',
                                   20.0, policy=G.KILL, max_new_tokens=48), 120, stream)
        show('generous budget', run)
        if run.result.outcome != R.COMPLETED:
            failures.append('generous budget did not complete')

        print('2) tight budget (1.0 s) for a long answer, Kill policy:\n')
        run = client.ask(make_goal('Write a detailed essay about the history of robotics.',
                                   1.0, policy=G.KILL, max_new_tokens=400), 120, stream)
        show('tight budget', run)
        if run.result.outcome != R.KILLED:
            failures.append('tight budget was not killed')

        print('3) Skip-Next: an overrunning goal (1.0 s) with another goal queued behind it:\n')
        late = client.send(make_goal('List ten facts about the Moon.', 1.0,
                                     policy=G.SKIP_NEXT, max_new_tokens=80), stream)
        time.sleep(0.2)
        nxt = client.send(make_goal('Say hello.', 30.0, max_new_tokens=16))
        client.wait(late, 120)
        client.wait(nxt, 120)
        show('overrunning goal', late)
        show('next goal', nxt)
        if nxt.result.outcome != R.SKIPPED:
            failures.append('next goal was not skipped')

        print('4) a bad goal (empty instruction) while the node is serving:')
        busy = client.send(make_goal('Tell me a short story about a robot.', 20.0,
                                     max_new_tokens=40))
        bad = client.ask(make_goal('   ', 5.0), 30)
        show('bad goal', bad)
        client.wait(busy, 120)
        show('goal served meanwhile', busy)
        if bad.accepted or busy.result.outcome != R.COMPLETED:
            failures.append('bad goal handling')
    finally:
        client.close()
        rclpy.try_shutdown()
        node.send_signal(signal.SIGINT)
        try:
            node.wait(10)
        except subprocess.TimeoutExpired:
            node.kill()
    if failures:
        print('demo: unexpected outcomes: ' + '; '.join(failures))
        return 1
    print('demo: all four scenarios behaved as shown.')
    return 0


if __name__ == '__main__':
    sys.exit(main())
