"""timebill_ask: send one instruction with a deadline, stream the answer, print the outcome."""

from __future__ import annotations

import argparse
import sys

from timebill_ros.core.request import Mode, Outcome, OverrunPolicy

POLICIES = {'kill': int(OverrunPolicy.KILL), 'skip_next': int(OverrunPolicy.SKIP_NEXT),
            'node_default': 2}
MODES = {m.name.lower(): int(m) for m in Mode}


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('instruction', help='what to ask')
    parser.add_argument('--budget', type=float, required=True,
                        help='seconds allowed from goal acceptance')
    parser.add_argument('--policy', choices=sorted(POLICIES), default='kill',
                        help='overrun policy (default: kill)')
    parser.add_argument('--mode', choices=sorted(MODES), default='auto',
                        help='inference mode (default: auto)')
    parser.add_argument('--context-file', help='file whose text is sent as the context')
    parser.add_argument('--max-new-tokens', type=int, default=0, help='0 = node default')
    parser.add_argument('--pessimistic-factor', type=float, default=0.0,
                        help='0 = node default')
    parser.add_argument('--node', default='/timebill', help='node name (default: /timebill)')
    parser.add_argument('--timeout', type=float, default=600.0,
                        help='seconds to wait for the server and the result')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Exit 0 when the answer met its deadline, 1 otherwise, 2 when rejected or unreachable."""
    args = parse_args(argv)
    import rclpy
    from timebill_ros.tools.client import ClientTimeout, InstructClient, make_goal

    context = ''
    if args.context_file:
        with open(args.context_file, encoding='utf-8') as handle:
            context = handle.read()
    rclpy.init()
    client = InstructClient(f'{args.node}/instruct', node_name='timebill_ask',
                            responses_topic=f'{args.node}/responses')
    try:
        client.wait_for_server(min(args.timeout, 30.0))
        goal = make_goal(args.instruction, args.budget, context, POLICIES[args.policy],
                         MODES[args.mode], args.max_new_tokens, args.pessimistic_factor)
        run = client.ask(goal, args.timeout,
                         on_feedback=lambda f: print(f.text_delta, end='', flush=True))
    except ClientTimeout as exc:
        print(f'\ntimebill_ask: {exc}', file=sys.stderr)
        return 2
    finally:
        client.close()
        rclpy.try_shutdown()
    print()
    if not run.accepted:
        print(f'REJECTED: {run.reject_reason or "no reason received"}')
        return 2
    res = run.result
    outcome = Outcome(res.outcome).name
    print(f'{outcome} deadline_met={res.deadline_met} tokens={res.tokens} '
          f'e2e={res.e2e_s:.3f}s (queue {res.queue_s:.3f}s, prefill {res.prefill_s:.3f}s, '
          f'decode {res.decode_s:.3f}s) budget={args.budget:g}s')
    print(f'reason: {res.reason}')
    return 0 if res.deadline_met else 1


if __name__ == '__main__':
    sys.exit(main())
