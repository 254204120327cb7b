# SPDX-License-Identifier: Apache-2.0
"""Robot commands with schemas through the node: free text, constrained, constrained + closure.

``python -m benchmarks.bench_structured --items 40 --out results/structured/<run>``
starts two nodes with the shipped configuration (A: the deadline closure on, B: off)
and sends held-out commands (evaluation.schema_commands) through real action clients,
MODE_AUTO and Kill:

* each item once with a loose budget as a schema goal on A: its full time;
* then at ``--tiers`` x that time and at ``--fixed`` seconds, three ways, interleaved:
  free text (the keys named in the instruction, no schema) on A, the schema without the
  closure on B, the schema with the closure on A.

Per cell: accepted, deadline met, parse rate, schema-valid rate (jsonschema), field
accuracy, closed at the deadline, TPOT median; and two checks over every goal: each
goal that ended COMPLETED or closed at the deadline is schema-valid, and no goal claims a
deadline it missed. Writes bench.json and README.md (command, commit, date, CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
import statistics
import sys
import time

import jsonschema

from benchmarks.bench_robot import RobotBench
from benchmarks.common import commit, machine, stamped_log
from benchmarks.harness import new_results_dir
from timebill_ros.core.request import Mode
from timebill_ros.evaluation.schema_commands import field_accuracy, parse, schema_commands, split

NAMESPACES = {'A': '/structured_a', 'B': '/structured_b'}
LOOSE_S = 60.0
WAYS = ('free', 'schema', 'schema + closure')
NODE_OF = {'free': 'A', 'schema': 'B', 'schema + closure': 'A'}


def ask(bench: RobotBench, way: str, item, budget_s: float) -> dict:
    """Send one goal the given way and return a plain record of its end."""
    from timebill_ros.tools.client import make_goal, outcome_name, stop_reason_name
    schema = '' if way == 'free' else item.schema_text
    instruction = item.free_instruction if way == 'free' else item.instruction
    run = bench.clients[NODE_OF[way]].ask(
        make_goal(instruction, budget_s, item.context, mode=int(Mode.AUTO),
                  max_new_tokens=item.max_new_tokens, json_schema=schema), budget_s + 120.0)
    base = {'item': item.id, 'family': item.family, 'way': way, 'budget_s': budget_s}
    if not run.accepted:
        return {**base, 'outcome': 'REFUSED', 'met': False, 'claimed': False, 'text': '',
                'reason': run.reject_reason, 'valid': False, 'parsed': False, 'fields': 0.0,
                'e2e_s': 0.0, 'tokens': 0, 'stop': 'NONE', 'tpot_s': None}
    res = run.result
    value = parse(res.text)
    try:
        jsonschema.validate(value, item.schema)
        schema_valid = value is not None
    except jsonschema.ValidationError:
        schema_valid = False
    outcome = outcome_name(res.outcome)
    return {**base, 'outcome': outcome, 'met': outcome == 'COMPLETED' and res.deadline_met,
            'claimed': bool(res.deadline_met), 'late_s': res.e2e_s - budget_s,
            'text': res.text, 'reason': res.reason, 'valid': schema_valid,
            'node_valid': bool(res.valid), 'parsed': value is not None,
            'fields': field_accuracy(item, value), 'e2e_s': res.e2e_s, 'tokens': res.tokens,
            'stop': stop_reason_name(res.stop_reason),
            'tpot_s': res.decode_s / (res.tokens - 1) if res.tokens > 1 else None}


def summarize(records: list) -> dict:
    """Return one cell's figures."""
    n = len(records)
    tpots = [r['tpot_s'] for r in records if r['tpot_s']]
    return {'goals': n, 'accepted': sum(r['outcome'] != 'REFUSED' for r in records),
            'met': sum(r['met'] for r in records), 'parsed': sum(r['parsed'] for r in records),
            'valid': sum(r['valid'] for r in records),
            'closed': sum(r['stop'] == 'CLOSED_AT_DEADLINE' for r in records),
            'fields': sum(r['fields'] for r in records) / n if n else 0.0,
            'tpot_ms': 1e3 * statistics.median(tpots) if tpots else None}


def checks(records: list) -> dict:
    """Return the whole-run checks per way, and the false claims of a deadline.

    Per way: schema-valid when ended complete or closed, the node's ``valid`` equal to
    jsonschema's verdict, and the worst lateness.
    """
    out = {}
    for way in WAYS[1:]:
        ran = [r for r in records if r['way'] == way and r['outcome'] != 'REFUSED']
        ended = [r for r in ran if r['outcome'] == 'COMPLETED' or
                 r['stop'] == 'CLOSED_AT_DEADLINE']
        out[f'{way}: completed or closed'] = len(ended)
        out[f'{way}: of them schema-valid'] = sum(r['valid'] for r in ended)
        out[f'{way}: node valid = jsonschema'] = sum(r['node_valid'] == r['valid'] for r in ran)
        out[f'{way}: worst lateness s'] = round(max((r['late_s'] for r in ran), default=0.0), 3)
    out['late goals claimed met'] = sum(r['claimed'] and r['e2e_s'] > r['budget_s']
                                        for r in records)
    return out


def write(out: Path, info: dict) -> None:
    """Write bench.json and README.md."""
    out.mkdir(parents=True)
    (out / 'bench.json').write_text(json.dumps(info, indent=2))
    lines = [f'# Structured answers through the node, {info["date"][:10]}', '',
             f'Command: `{info["command"]}` (commit {info["commit"]}); machine: '
             f'{info["machine"]}; {info["items"]} held-out items, MODE_AUTO, Kill; '
             f'{info["minutes"]:.0f} min.', '',
             '| budget | way | accepted | met | parsed | schema-valid | closed | field acc. '
             '| TPOT ms |', '|---|---|---|---|---|---|---|---|---|']
    for tier, cells in info['table'].items():
        for way, c in cells.items():
            tpot = f'{c["tpot_ms"]:.0f}' if c['tpot_ms'] else '-'
            lines.append(f'| {tier} | {way} | {c["accepted"]}/{c["goals"]} | {c["met"]} | '
                         f'{c["parsed"]} | {c["valid"]} | {c["closed"]} | {c["fields"]:.2f} '
                         f'| {tpot} |')
    lines += ['', 'Checks over every goal: ' + ', '.join(
        f'{k}: {v}' for k, v in info['checks'].items()) + '.']
    (out / 'README.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))


def main(argv=None) -> int:
    """Run the structured-output benchmark through two nodes."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--items', type=int, default=96, help='held-out items (of 96)')
    parser.add_argument('--tiers', default='0.5,1,2', help='x each item\'s full time')
    parser.add_argument('--fixed', default='1,2,5', help='fixed budgets in seconds')
    parser.add_argument('--out', help='a new results folder')
    parser.add_argument('--checks', metavar='FOLDER',
                        help="print the checks of a finished run's bench.json and exit")
    args = parser.parse_args(argv)
    if args.checks:
        records = json.loads((Path(args.checks) / 'bench.json').read_text())['records']
        for key, value in checks([r for r in records if r['tier'] != 'loose']).items():
            print(f'{key}: {value}')
        return 0
    if not args.out:
        parser.error('--out is required')
    out = new_results_dir(args.out)
    if out is None:
        return 2
    import rclpy
    rclpy.init()
    log, started = stamped_log(), time.monotonic()
    at_start = commit()  # what the nodes run (commits made during the run are not)
    items = split(schema_commands())[1][:args.items]
    bench, records, full = RobotBench(log), [], {}
    try:
        bench.start('A', {'deadline_closure': True}, NAMESPACES['A'])
        bench.start('B', {'deadline_closure': False}, NAMESPACES['B'])
        for item in items:
            loose = ask(bench, 'schema + closure', item, LOOSE_S)
            full[item.id] = loose['e2e_s']
            records.append({**loose, 'tier': 'loose'})
        log(f'loose runs: {summarize(records)}')
        budgets = [(f'{t}x', lambda item, t=float(t): t * full[item.id])
                   for t in args.tiers.split(',')] + \
                  [(f'{s} s', lambda item, s=float(s): s) for s in args.fixed.split(',')]
        for tier, budget_of in budgets:
            for item in items:
                for way in WAYS:
                    records.append({**ask(bench, way, item, budget_of(item)), 'tier': tier})
            log(f'tier {tier} done')
    finally:
        bench.stop()
        rclpy.try_shutdown()
    table = {tier: {way: summarize([r for r in records if r['tier'] == tier and
                                    r['way'] == way]) for way in WAYS}
             for tier, _ in budgets}
    timed = [r for r in records if r['tier'] != 'loose']
    info = {'command': ' '.join(['python -m benchmarks.bench_structured'] + sys.argv[1:]),
            'commit': at_start, 'machine': machine(), 'items': len(items),
            'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'minutes': (time.monotonic() - started) / 60, 'table': table,
            'checks': checks(timed), 'full_s': full, 'records': records}
    write(out, info)
    return 0


if __name__ == '__main__':
    sys.exit(main())
