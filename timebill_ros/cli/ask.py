# SPDX-License-Identifier: Apache-2.0
"""timebill_ask: send one instruction with a deadline, stream the answer, print the outcome."""

from __future__ import annotations

import argparse
import sys

from timebill_ros.core.output import StopReason
from timebill_ros.core.request import Mode, Outcome, OverrunPolicy, POLICY_NODE_DEFAULT

POLICIES = {'kill': int(OverrunPolicy.KILL), 'skip_next': int(OverrunPolicy.SKIP_NEXT),
            'node_default': POLICY_NODE_DEFAULT}
MODES = {m.name.lower(): int(m) for m in Mode}
STOP_REASONS = {int(r): r.name.lower() for r in StopReason}


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('instruction', help='what to ask')
    parser.add_argument('--budget', type=float, required=True,
                        help='seconds allowed from goal acceptance')
    parser.add_argument('--policy', choices=sorted(POLICIES), default='node_default',
                        help="overrun policy (default: node_default, the node's "
                        'default_policy parameter)')
    parser.add_argument('--mode', choices=sorted(MODES), default='auto',
                        help='inference mode (default: auto)')
    parser.add_argument('--context-file', help='file whose text is sent as the context')
    parser.add_argument('--max-new-tokens', type=int, default=0, help='0 = node default')
    parser.add_argument('--pessimistic-factor', type=float, default=0.0,
                        help='0 = node default')
    parser.add_argument('--system', default='', help='system prompt')
    parser.add_argument('--turn', action='append', default=[], metavar='ROLE:TEXT',
                        help='an earlier turn before the instruction (repeatable), '
                             'e.g. user:hello or assistant:hi')
    parser.add_argument('--stop', action='append', default=[],
                        help='a string that ends the answer (repeatable)')
    parser.add_argument('--temperature', type=float, default=0.0, help='0 = greedy')
    parser.add_argument('--top-p', type=float, default=0.0, help='0 = 1')
    parser.add_argument('--seed', type=int, default=0, help='> 0: repeatable sampling')
    parser.add_argument('--json-schema-file', help='JSON Schema the answer must validate against')
    parser.add_argument('--grammar-file', help='GBNF grammar the answer must follow')
    parser.add_argument('--node', default='/timebill', help='node name (default: /timebill)')
    parser.add_argument('--timeout', type=float, default=600.0,
                        help='seconds to wait for the server and the result')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Exit 0 when the answer met its deadline, 1 otherwise, 2 when rejected or unreachable."""
    args = parse_args(argv)
    import rclpy
    from timebill_ros.tools.client import ClientTimeout, InstructClient, make_goal

    context, schema, grammar = (_read(path) for path in (
        args.context_file, args.json_schema_file, args.grammar_file))
    history = [tuple(turn.split(':', 1)) for turn in args.turn]
    if any(len(turn) != 2 for turn in history):
        print('timebill_ask: --turn takes ROLE:TEXT', file=sys.stderr)
        return 2
    rclpy.init()
    client = InstructClient(f'{args.node}/instruct', node_name='timebill_ask',
                            responses_topic=f'{args.node}/responses')
    try:
        client.wait_for_server(min(args.timeout, 30.0))
        goal = make_goal(args.instruction, args.budget, context, POLICIES[args.policy],
                         MODES[args.mode], args.max_new_tokens, args.pessimistic_factor,
                         system_prompt=args.system, history=history, stop=args.stop,
                         temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                         json_schema=schema, grammar=grammar)
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
    print(f'stop_reason: {STOP_REASONS.get(res.stop_reason, res.stop_reason)} '
          f'valid={res.valid}')
    return 0 if res.deadline_met else 1


def _read(path) -> str:
    """Return a file's text ('' when no path is given)."""
    if not path:
        return ''
    with open(path, encoding='utf-8') as handle:
        return handle.read()


if __name__ == '__main__':
    sys.exit(main())
