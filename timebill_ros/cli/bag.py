# SPDX-License-Identifier: Apache-2.0
"""timebill_bag: write request workloads as rosbag2 bags, replay them against the node, report.

  write   make a bag of Instructions (periodic, Poisson or burst arrivals)
  show    list the Instructions of a bag
  replay  play a bag against a running node; record responses (bag + CSV + PNG)
  report  re-render the deadline report PNG from a replay CSV

Exit status: 0 done, 1 replay finished but some requests got no response,
2 error (one line on stderr).
"""

from __future__ import annotations

import argparse
from pathlib import Path
import sys

from timebill_ros.core.workload import (
    arrivals, DEFAULT_INSTRUCTIONS, make_workload, MODES, PATTERNS, POLICIES)

PROG = 'timebill_bag'


class UsageError(Exception):
    """A command-line value that argparse cannot check by itself."""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message):
        """Print one line and exit 2."""
        self.exit(2, f'{self.prog}: error: {message}\n')


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')

    write = sub.add_parser('write', help='write a workload bag of Instructions',
                           description='Write a workload as a rosbag2 bag of Instructions.')
    write.add_argument('out', type=Path, help='bag to create (a directory; must not exist)')
    write.add_argument('--pattern', choices=PATTERNS, default='periodic',
                       help='arrival pattern (default: periodic)')
    write.add_argument('--count', type=int, default=10, help='requests (default: 10)')
    write.add_argument('--period', type=float,
                       help='seconds between requests (periodic) or bursts (burst)')
    write.add_argument('--rate', type=float, help='mean requests per second (poisson)')
    write.add_argument('--burst-size', type=int, default=4,
                       help='requests per burst (burst; default: 4)')
    write.add_argument('--spacing', type=float, default=0.0,
                       help='seconds between requests inside a burst (default: 0)')
    write.add_argument('--seed', type=int, help='random seed (poisson)')
    write.add_argument('--start', type=float, default=0.0,
                       help='offset of the first arrival, seconds (default: 0)')
    write.add_argument('--budget', type=float, nargs='+', required=True, metavar='SECONDS',
                       help='time budget per request; several values are cycled')
    write.add_argument('--instruction', action='append', metavar='TEXT',
                       help='instruction text (repeat for several, cycled); default: a '
                            f'built-in set of {len(DEFAULT_INSTRUCTIONS)}')
    write.add_argument('--context-file', type=Path,
                       help='file whose text is sent as every request\'s context')
    write.add_argument('--policy', choices=sorted(POLICIES), default='kill',
                       help='overrun policy (default: kill)')
    write.add_argument('--mode', choices=sorted(MODES), default='auto',
                       help='inference mode (default: auto)')
    write.add_argument('--max-new-tokens', type=int, default=0, help='0 = node default')
    write.add_argument('--pessimistic-factor', type=float, default=0.0,
                       help='0 = node default')
    write.add_argument('--eviction-ratio', type=float, default=0.0,
                       help='fixed KV eviction ratio (MODE_EVICTION); 0 = the planner picks')
    write.add_argument('--expected-tokens', type=int, default=0,
                       help="the caller's answer-length estimate; 0 = the node predicts")
    write.add_argument('--token-deadline', type=float, default=0.0, metavar='SECONDS',
                       help='per-token deadline for streaming consumers; 0 = none')
    write.add_argument('--precision', default='',
                       help="pin the decode precision (e.g. float32, int8-weight); '' = the "
                            "planner's choice")
    write.add_argument('--system-prompt', default='', help='system prompt of every request')
    write.add_argument('--json-schema-file', type=Path,
                       help='JSON Schema the answers must validate against')
    write.add_argument('--grammar-file', type=Path, help='GBNF grammar of the answers')
    write.add_argument('--id-prefix', default='req', help='request ids: PREFIX-0000, ...')
    write.add_argument('--storage', choices=('sqlite3', 'mcap'), default='sqlite3',
                       help='bag storage (default: sqlite3)')
    write.add_argument('--topic', default='/timebill/instructions',
                       help='topic (default: /timebill/instructions)')

    show = sub.add_parser('show', help='list the Instructions of a bag',
                          description='List the Instructions of a bag.')
    show.add_argument('bag', type=Path)
    show.add_argument('--topic', default='/timebill/instructions')

    play = sub.add_parser('replay', help='replay a bag against a running node',
                          description='Replay a bag of Instructions against a running '
                                      'timebill node; record its Responses and telemetry '
                                      '(bag), one CSV row per request and the deadline '
                                      'report PNG.')
    play.add_argument('bag', type=Path)
    play.add_argument('--out', type=Path,
                      help='output directory (default: <bag>_replay next to the bag)')
    play.add_argument('--scale', type=float, default=1.0,
                      help='replay speed: arrival offsets are divided by it, budgets are '
                           'not (default: 1)')
    play.add_argument('--timeout', type=float, default=60.0,
                      help='seconds to wait for all responses after the last instruction '
                           '(default: 60)')
    play.add_argument('--discovery-timeout', type=float, default=10.0,
                      help='seconds to wait for the node (default: 10)')
    play.add_argument('--node', default='/timebill', help='node name (default: /timebill)')
    play.add_argument('--topic', default='/timebill/instructions',
                      help='topic of the Instructions in the bag')
    play.add_argument('--storage', choices=('sqlite3', 'mcap'), default='sqlite3',
                      help='output bag storage (default: sqlite3)')
    play.add_argument('--no-report', action='store_true', help='skip the PNG')

    rep = sub.add_parser('report', help='render the deadline report PNG from a replay CSV',
                         description='Render the deadline report PNG from a replay CSV.')
    rep.add_argument('csv', type=Path)
    rep.add_argument('--out', type=Path, help='PNG path (default: the CSV path, .png)')
    rep.add_argument('--title', help='title (default: the CSV name)')
    return parser


def _write(args) -> int:
    from timebill_ros.tools.bags import write_workload

    needs = {'periodic': ('period',), 'poisson': ('rate',), 'burst': ('period',)}
    for name in needs[args.pattern]:
        if getattr(args, name) is None:
            raise UsageError(f'--pattern {args.pattern} needs --{name}')
    context = ''
    if args.context_file:
        context = args.context_file.read_text(encoding='utf-8')
    times = arrivals(args.pattern, args.count, period_s=args.period, rate_hz=args.rate,
                     burst_size=args.burst_size, spacing_s=args.spacing, seed=args.seed,
                     start_s=args.start)
    items = make_workload(times, args.budget, args.instruction or DEFAULT_INSTRUCTIONS,
                          policy=POLICIES[args.policy], mode=MODES[args.mode],
                          max_new_tokens=args.max_new_tokens, context=context,
                          pessimistic_factor=args.pessimistic_factor, id_prefix=args.id_prefix,
                          eviction_ratio=args.eviction_ratio,
                          expected_tokens=args.expected_tokens,
                          token_deadline_s=args.token_deadline, precision=args.precision,
                          system_prompt=args.system_prompt,
                          json_schema=_text(args.json_schema_file),
                          grammar=_text(args.grammar_file))
    path = write_workload(args.out, items, topic=args.topic, storage=args.storage)
    span = items[-1].arrival_s if items else 0.0
    print(f'wrote {path}: {len(items)} instructions on {args.topic} over {span:.3f} s '
          f'({args.pattern}, {args.storage})')
    return 0


def _text(path) -> str:
    """Return a file's text ('' for no file)."""
    return path.read_text(encoding='utf-8') if path else ''


def _show(args) -> int:
    from timebill_ros.tools.bags import read_workload

    workload = read_workload(args.bag, args.topic)
    print(f'{workload.path}: {len(workload.messages)} instructions on {workload.topic}')
    for item in workload.items:
        text = item.instruction if len(item.instruction) <= 50 else item.instruction[:47] + '...'
        # The planning fields only where a goal sets them (most leave them to the node).
        planning = ''.join(f'{name} {value:g}  ' if not isinstance(value, str) else
                           f'{name} {value}  ' for name, value in (
                               ('eviction_ratio', item.eviction_ratio),
                               ('expected_tokens', item.expected_tokens),
                               ('token_deadline', item.token_deadline_s),
                               ('precision', item.precision),
                               ('json_schema', 'yes' if item.json_schema else ''),
                               ('grammar', 'yes' if item.grammar else '')) if value)
        print(f'{item.arrival_s:10.3f} s  {item.id}  budget {item.budget_s:g} s  '
              f'policy {item.policy}  mode {item.mode}  max_new_tokens {item.max_new_tokens}  '
              f'{planning}{text!r}')
    return 0


def _replay(args) -> int:
    from timebill_ros.tools.replay import replay

    bag = args.bag.resolve()
    out = args.out or bag.with_name(bag.stem + '_replay')
    result = replay(args.bag, out, topic=args.topic, node=args.node, scale=args.scale,
                    timeout_s=args.timeout, discovery_timeout_s=args.discovery_timeout,
                    storage=args.storage, render=not args.no_report, log=print)
    if result.missing_telemetry:
        print(f'{PROG} replay: no telemetry for {len(result.missing_telemetry)} answered '
              f'request(s): {", ".join(result.missing_telemetry)}', file=sys.stderr)
    if result.missing:
        print(f'{PROG} replay: {len(result.missing)} of {len(result.rows)} requests got no '
              f'response within {args.timeout:g} s: {", ".join(result.missing)}',
              file=sys.stderr)
        return 1
    return 0


def _report(args) -> int:
    from timebill_ros.report import render

    print(f'wrote {render(args.csv, args.out, args.title)}')
    return 0


COMMANDS = {'write': _write, 'show': _show, 'replay': _replay, 'report': _report}


def main(argv=None) -> int:
    """Run one subcommand; return its exit status (2 on any error, one line on stderr)."""
    args = _parser().parse_args(argv)
    # Imported lazily so --help and `write` work without a ROS environment.
    from timebill_ros.report import ReportError
    errors = [UsageError, ValueError, OSError, ReportError]
    try:
        from timebill_ros.tools.bags import BagError
        errors.append(BagError)
        from timebill_ros.tools.replay import ReplayError
        errors.append(ReplayError)
    except ImportError as exc:
        if args.command != 'report':
            return _fail(args.command, f'cannot import the bag tools ({exc}); '
                                       f'source env.sh first')
    try:
        return COMMANDS[args.command](args)
    except tuple(errors) as exc:
        return _fail(args.command, _message(exc))
    except ImportError as exc:
        return _fail(args.command, f'{exc}; source env.sh first')
    except KeyboardInterrupt:
        print(f'{PROG} {args.command}: interrupted', file=sys.stderr)
        return 130


def _message(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f'{exc.filename}: ' if exc.filename else ''
        return f'{where}{exc.strerror}'
    return str(exc) or type(exc).__name__


def _fail(command: str, message: str) -> int:
    line = ' '.join(message.splitlines())
    print(f'{PROG} {command}: error: {line}', file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main())
